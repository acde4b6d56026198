//! Feeds the Redis session what a subscriber's socket carries during a
//! burst (the mix of `benches/tools/mix.rs`, in 64 KiB reads) and drains
//! its events: the receive path from bytes to the application, with no
//! socket, runtime or clock. `benches/instructions.sh` counts the
//! instructions of [`receive`] alone under callgrind.
//!
//! `MESSAGES` (20,000) sets how many messages of the mix.

use std::hint::black_box;
use std::time::Instant;

use synapse_replication::session::{RedisEvent, RedisLink, RedisSession};

#[path = "../../tools/mix.rs"]
mod mix;

const CHANNEL: &str = "e2e.example.com";
/// Bytes per read, as `RedisClient` reads.
const READ: usize = 64 << 10;

fn main() {
    let messages: usize = std::env::var("MESSAGES")
        .ok()
        .and_then(|messages| messages.parse().ok())
        .unwrap_or(20_000);
    let lines = mix::lines(&mix::items(messages, 42));
    let wire = mix::messages(&lines, CHANNEL);
    let now = Instant::now();
    let mut session = mix::ready_session(CHANNEL, now);
    let events = receive(&mut session, &wire, now);
    let counters = session.counters();
    assert_eq!(
        counters.received.total() + counters.malformed,
        lines.len() as u64,
        "every message decoded"
    );
    println!("messages {} events {events}", lines.len());
}

/// The measured part: `handle_input` per read, every event drained.
#[inline(never)]
fn receive(session: &mut RedisSession, wire: &[u8], now: Instant) -> u64 {
    let mut events = 0;
    for read in wire.chunks(READ) {
        session.handle_input(RedisLink::Subscriber, read, now);
        while let Some(event) = session.poll_event() {
            if let RedisEvent::Closing { error, .. } = &event {
                panic!("the session gave up: {error}");
            }
            events += 1;
            black_box(event);
        }
    }
    events
}
