//! How a Redis session talks to Redis: [`RedisSessionConfig`],
//! [`RedisLink`]. (The credentials, [`RedisAuth`], are configuration.)

use std::fmt;
use std::time::Duration;

use crate::config::RedisAuth;
use crate::resp::{self};
use crate::wire::Decoder;

/// The two connections of a [`RedisSession`](crate::session::RedisSession): a RESP2 connection in
/// subscribe mode can do nothing but (un)subscribe and `PING`, so
/// publishing takes a second one, as in Synapse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedisLink {
    /// The connection that subscribes and receives. With
    /// [`RedisSessionConfig::single_connection`] it publishes too.
    Subscriber,
    /// The connection that publishes.
    Publisher,
}

impl RedisLink {
    /// Both links.
    pub const BOTH: [RedisLink; 2] = [RedisLink::Subscriber, RedisLink::Publisher];

    pub(super) fn index(self) -> usize {
        match self {
            RedisLink::Subscriber => 0,
            RedisLink::Publisher => 1,
        }
    }

    pub(super) fn suffix(self) -> &'static str {
        match self {
            RedisLink::Subscriber => "sub",
            RedisLink::Publisher => "pub",
        }
    }
}

impl fmt::Display for RedisLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RedisLink::Subscriber => "subscriber",
            RedisLink::Publisher => "publisher",
        })
    }
}

/// How a [`RedisSession`](crate::session::RedisSession) talks to Redis: channels, credentials, timers and
/// limits. The defaults are Synapse's where it has one.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisSessionConfig {
    /// The channel prefix: the deployment's `server_name` (e.g.
    /// `example.com`). Commands are published on it, `USER_IP` on
    /// `<prefix>/USER_IP`.
    pub prefix: String,
    /// Channels to subscribe to besides the prefix, as names under it:
    /// `USER_IP` subscribes to `<prefix>/USER_IP` (the main process and
    /// whichever process records client IPs do).
    pub extra_channels: Vec<String>,
    /// `AUTH` on connecting (Synapse's `password`, plus a username for
    /// Redis ACLs).
    pub auth: Option<RedisAuth>,
    /// `SELECT` on connecting (Synapse's `dbid`). Pub/sub ignores it: two
    /// deployments with one prefix on one Redis hear each other whatever
    /// the database.
    pub database: Option<u32>,
    /// `CLIENT SETNAME <name>-sub` / `<name>-pub` on connecting, so that an
    /// operator can tell the connections apart in `CLIENT LIST` (spaces
    /// become `_`). `None`: no name. A server that refuses it is not an
    /// error.
    pub client_name: Option<String>,
    /// One RESP3 connection (`HELLO 3`, Redis 6 and later) that both
    /// subscribes and publishes, instead of two RESP2 connections. A server
    /// that refuses `HELLO 3` makes the session fall back to two
    /// connections. Default off, as Synapse.
    pub single_connection: bool,
    /// A `PING` goes out on each connection this often (30 s, as Synapse).
    pub ping_interval: Duration,
    /// A connection that owes replies (to a `PING`, the handshake or a
    /// `PUBLISH`) and has received nothing for this long is dead: a silent,
    /// paused or unreachable server (30 s).
    pub ping_timeout: Duration,
    /// Commands given to [`RedisSession::send`](crate::session::RedisSession::send) while the session is not
    /// ready are queued up to this many, and published once it is (0, the
    /// default: they are dropped and counted, as Synapse does). Stream
    /// commands never queue: positions cover them.
    pub max_queued_while_disconnected: usize,
    /// Bytes of `PUBLISH`es waiting for the socket. Beyond, Redis is not
    /// reading: the publisher connection is closed and reopened (its
    /// streams are then announced again, and followers catch up). 32 MiB.
    pub max_unsent_bytes: usize,
    /// Caps on what Redis may send (see [`resp::Limits`]); by default a
    /// bulk string of 16 MiB and a frame of 32 MiB, the most buffered for
    /// one connection. A message over them closes the connection (it is
    /// not a replication line: those are refused beyond
    /// [`RedisSessionConfig::max_line_len`] and reported as malformed).
    pub resp_limits: resp::Limits,
    /// The longest replication line accepted in a message (see
    /// [`Decoder::max_line_len`]); longer ones are reported as malformed
    /// (1 MiB).
    pub max_line_len: usize,
    /// Report every command received as a
    /// [`RedisEvent::Received`](crate::session::RedisEvent::Received) before acting on it (for tools such as
    /// `tail`; default off).
    pub report_received: bool,
}

impl RedisSessionConfig {
    /// Options for the deployment named `prefix` (its `server_name`), with
    /// the defaults.
    pub fn new(prefix: impl Into<String>) -> RedisSessionConfig {
        RedisSessionConfig {
            prefix: prefix.into(),
            extra_channels: Vec::new(),
            auth: None,
            database: None,
            client_name: Some("synapse-replication".to_owned()),
            single_connection: false,
            ping_interval: Duration::from_secs(30),
            ping_timeout: Duration::from_secs(30),
            max_queued_while_disconnected: 0,
            max_unsent_bytes: 32 << 20,
            resp_limits: resp::Limits::new()
                .with_max_bulk_len(16 << 20)
                .with_max_frame_len(32 << 20),
            max_line_len: Decoder::DEFAULT_MAX_LINE,
            report_received: false,
        }
    }

    /// Every channel subscribed to: the prefix, then `prefix/<name>` for
    /// each extra channel.
    pub fn channels(&self) -> Vec<String> {
        let mut channels = vec![self.prefix.clone()];
        channels.extend(
            self.extra_channels
                .iter()
                .map(|name| format!("{}/{name}", self.prefix)),
        );
        channels
    }

    /// Timers below this are raised to it, so that a zero interval cannot
    /// make the event loop spin.
    pub(super) const MIN_TIMER: Duration = Duration::from_millis(1);
}
