//! The Redis session's stats, and (feature `metrics`) the same through the
//! `metrics` facade under Synapse's metric names, read back from a small
//! recorder of our own.

#![cfg(feature = "metrics")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::BytesMut;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use synapse_replication::config::StreamWriters;
use synapse_replication::positions::{Follower, Writer};
use synapse_replication::resp::encode_command;
use synapse_replication::session::{RedisLink, RedisSession, RedisSessionConfig};
use synapse_replication::wire::{CommandKind, InstanceName, StreamName};

/// Keeps every counter and gauge by its name and sorted labels.
#[derive(Default)]
struct Store(Mutex<HashMap<String, Arc<AtomicU64>>>);

impl Store {
    fn slot(&self, key: &Key) -> Arc<AtomicU64> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|label| format!("{}={}", label.key(), label.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        self.0
            .lock()
            .expect("store")
            .entry(name)
            .or_default()
            .clone()
    }

    fn counter(&self, name: &str) -> Option<u64> {
        let store = self.0.lock().expect("store");
        store.get(name).map(|value| value.load(Ordering::Relaxed))
    }

    fn gauge(&self, name: &str) -> Option<f64> {
        self.counter(name).map(f64::from_bits)
    }
}

struct TestRecorder(Arc<Store>);

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.0.slot(key))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.0.slot(key))
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn frame(args: &[&[u8]]) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode_command(&mut out, args);
    out.to_vec()
}

fn message(payload: &str) -> Vec<u8> {
    frame(&[b"message", b"example.com", payload.as_bytes()])
}

#[test]
fn stats_and_metrics_follow_what_the_session_did() {
    let registry = Arc::new(StreamWriters::default().with_redis(true));
    let me = InstanceName::from("worker1");
    let mut options = RedisSessionConfig::new("example.com");
    options.client_name = None;
    let mut session = RedisSession::new(
        options,
        Follower::new(me.clone(), registry.clone()),
        Writer::new(me, registry),
    );
    let session = &mut session;
    let now = Instant::now();
    for link in RedisLink::BOTH {
        session.connect(link, now);
        while session.poll_transmit(link).is_some() {}
    }
    let confirm = b"*3\r\n$9\r\nsubscribe\r\n$11\r\nexample.com\r\n:1\r\n";
    session.handle_input(RedisLink::Subscriber, confirm, now);
    assert!(session.is_ready());

    // A position, rows, a gap that holds later commands, junk, and a
    // command for the application.
    let mut input = Vec::new();
    input.extend(message("POSITION events master 1 1"));
    input.extend(message(
        r#"RDATA events master 2 ["ev",["$a","!r","m.room.message",null,null,null]]"#,
    ));
    input.extend(message("POSITION typing master 5 5"));
    input.extend(message("POSITION typing master 8 9"));
    input.extend(message(r#"RDATA typing master 10 ["!r",[]]"#));
    input.extend(message("NOT_A_COMMAND"));
    input.extend(message("REMOTE_SERVER_UP other.example"));
    // Half a frame stays buffered.
    let partial = message("POSITION events master 2 2");
    input.extend(&partial[..10]);
    session.handle_input(RedisLink::Subscriber, &input, now);
    while session.poll_event().is_some() {}

    let stats = session.stats();
    assert!(stats.ready);
    assert_eq!(stats.buffered_input, 10);
    assert_eq!(stats.queued_by_stream, vec![(StreamName::Typing, 1)]);
    assert_eq!(stats.catch_ups, 1);
    assert_eq!(stats.counters.received.get(CommandKind::Position), 3);
    assert_eq!(stats.counters.received.get(CommandKind::Rdata), 2);
    assert_eq!(stats.counters.received.get(CommandKind::RemoteServerUp), 1);
    assert_eq!(stats.counters.malformed, 1);
    // REPLICATE went out on becoming ready.
    assert_eq!(stats.counters.published.get(CommandKind::Replicate), 1);

    let store = Arc::new(Store::default());
    metrics::with_local_recorder(&TestRecorder(store.clone()), || {
        stats.record_metrics("worker1");
    });
    assert_eq!(
        store.counter(
            "synapse_replication_tcp_protocol_inbound_commands{command=POSITION,name=worker1}"
        ),
        Some(3)
    );
    assert_eq!(
        store.counter(
            "synapse_replication_tcp_protocol_outbound_commands{command=REPLICATE,name=worker1}"
        ),
        Some(1)
    );
    assert_eq!(
        store.gauge("synapse_replication_tcp_command_queue{name=worker1,stream_name=typing}"),
        Some(1.0)
    );
    assert_eq!(
        store.gauge("synapse_replication_redis_read_buffer_bytes{name=worker1}"),
        Some(10.0)
    );
    assert_eq!(
        store.counter("synapse_replication_redis_malformed_commands{name=worker1}"),
        Some(1)
    );
}
