//! What a Redis session reports to operators: [`RedisStats`], and with the
//! `metrics` feature, the same under the names of Synapse's Prometheus
//! metrics.

use crate::wire::StreamName;

use super::counters::RedisCounters;

/// A snapshot of a [`RedisSession`](super::RedisSession): how far behind the
/// process is, and counters of what it has done. From
/// [`RedisSession::stats`](super::RedisSession::stats).
///
/// How far behind: `buffered_input` (bytes read from Redis and not yet
/// decoded: part of one frame), the follower's `queued_by_stream` (commands
/// waiting behind a catch-up), `catch_ups` in flight, and `unsent_bytes`
/// (publishes Redis has not taken yet). What Redis itself still holds for
/// this subscriber is `omem` in Redis' `CLIENT LIST`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Whether the session is ready (subscribed and publishing).
    pub ready: bool,
    /// Bytes received on the subscriber and not yet decoded.
    pub buffered_input: usize,
    /// Bytes of publishes not yet taken by the socket.
    pub unsent_bytes: usize,
    /// Commands queued until the session is ready.
    pub queued_commands: usize,
    /// Per stream, the commands held behind a catch-up.
    pub queued_by_stream: Vec<(StreamName, usize)>,
    /// Row bytes the follower holds in queues and open batches.
    pub follower_buffered_bytes: usize,
    /// Catch-ups asked for and not yet answered.
    pub catch_ups: usize,
    /// Counters by command kind, drops, errors, connections.
    pub counters: RedisCounters,
    /// Commands a transport's `CommandSender`
    /// refused because the client's queue was full. Only the client knows:
    /// filled in by `RedisClient::stats`, 0 from
    /// [`RedisSession::stats`](super::RedisSession::stats).
    pub refused_commands: u64,
}

#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
impl RedisStats {
    /// Records this snapshot through the [`metrics`] facade, under the
    /// names of Synapse's Prometheus metrics where Synapse has one, with
    /// the label `name` (Synapse's connection name: use the instance
    /// name). Counters are set to their absolute values, so call it as
    /// often as you like (before each scrape, or every few seconds).
    ///
    /// - `synapse_replication_tcp_protocol_inbound_commands{command, name}`
    ///   and `..._outbound_commands{command, name}` (counters; a Prometheus
    ///   exporter adds `_total`)
    /// - `synapse_replication_tcp_command_queue{stream_name}` (gauge)
    /// - `synapse_replication_tcp_protocol_pending_commands{name}` (gauge:
    ///   commands queued until ready)
    /// - `synapse_replication_tcp_protocol_transport_send_buffer{name}`
    ///   (gauge: unsent bytes)
    /// - `synapse_replication_tcp_protocol_close_reason{reason_type}`
    ///   (counter)
    /// - this crate's own: `synapse_replication_redis_read_buffer_bytes`,
    ///   `..._follower_buffered_bytes`, `..._catch_ups` (gauges),
    ///   `..._dropped_commands{command}`, `..._malformed_commands`,
    ///   `..._publish_errors`, `..._refused_commands`, `..._impostor_echoes`,
    ///   `..._connections{link}` (counters),
    ///   each with `name`.
    pub fn record_metrics(&self, name: &str) {
        use crate::wire::CommandKind;

        let name = name.to_owned();
        let counters = &self.counters;
        for kind in CommandKind::ALL {
            let command = kind.as_str();
            for (metric, counts) in [
                (
                    "synapse_replication_tcp_protocol_inbound_commands",
                    &counters.received,
                ),
                (
                    "synapse_replication_tcp_protocol_outbound_commands",
                    &counters.published,
                ),
                (
                    "synapse_replication_redis_dropped_commands",
                    &counters.dropped,
                ),
            ] {
                let value = counts.get(*kind);
                if value > 0 {
                    metrics::counter!(metric, "command" => command, "name" => name.clone())
                        .absolute(value);
                }
            }
        }
        for (stream, count) in &self.queued_by_stream {
            metrics::gauge!(
                "synapse_replication_tcp_command_queue",
                "stream_name" => stream.as_str().to_owned(),
                "name" => name.clone()
            )
            .set(*count as f64);
        }
        for (reason, count) in &counters.closes {
            metrics::counter!(
                "synapse_replication_tcp_protocol_close_reason",
                "reason_type" => *reason,
                "name" => name.clone()
            )
            .absolute(*count);
        }
        let gauges = [
            (
                "synapse_replication_tcp_protocol_pending_commands",
                self.queued_commands,
            ),
            (
                "synapse_replication_tcp_protocol_transport_send_buffer",
                self.unsent_bytes,
            ),
            (
                "synapse_replication_redis_read_buffer_bytes",
                self.buffered_input,
            ),
            (
                "synapse_replication_redis_follower_buffered_bytes",
                self.follower_buffered_bytes,
            ),
            ("synapse_replication_redis_catch_ups", self.catch_ups),
        ];
        for (metric, value) in gauges {
            metrics::gauge!(metric, "name" => name.clone()).set(value as f64);
        }
        let plain = [
            (
                "synapse_replication_redis_malformed_commands",
                counters.malformed,
            ),
            (
                "synapse_replication_redis_publish_errors",
                counters.publish_errors,
            ),
            (
                "synapse_replication_redis_refused_commands",
                self.refused_commands,
            ),
            (
                "synapse_replication_redis_impostor_echoes",
                counters.impostor_echoes,
            ),
        ];
        for (metric, value) in plain {
            metrics::counter!(metric, "name" => name.clone()).absolute(value);
        }
        for (link, count) in ["subscriber", "publisher"]
            .into_iter()
            .zip(counters.connections)
        {
            metrics::counter!(
                "synapse_replication_redis_connections",
                "link" => link,
                "name" => name.clone()
            )
            .absolute(count);
        }
    }
}
