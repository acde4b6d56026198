//! The Redis receive path without the network: `RedisSession::handle_input`
//! over what a subscriber's socket carries during a burst, in 64 KiB reads.
//!
//! `cargo bench --bench redis_session`
//!
//! The input is 500,000 pub/sub `message`s of the mix `benches/tools/flood.rs`
//! publishes (`RDATA` of nine streams, some batches, `POSITION`s,
//! `USER_SYNC`, `USER_IP` on its own channel...; mean line 137 bytes), as
//! Redis writes them to a RESP2 subscriber: about 90 MB. `session` is the
//! whole path a `RedisClient` runs per read (RESP decoding, command
//! decoding, the follower's bookkeeping, events drained and dropped). The
//! other benchmarks stop earlier, to show where the time goes:
//!
//! - `resp`: `resp::RespDecoder::decode_pubsub` alone, reads appended to a
//!   `BytesMut` as the session does;
//! - `resp_wire`: plus `wire::Decoder::decode` of each payload;
//! - `resp_wire_follower`: plus `Follower::handle_command` for `RDATA` and
//!   `POSITION` and draining its events: the session without the session;
//! - `session`: `RedisSession::handle_input` and `poll_event`.
//!
//! Divan's throughput column is messages/s (wall clock). Before the
//! benchmarks, `main` prints CPU ns/message (this thread's CPU time, best of
//! 3: meaningful on a busy machine, where wall time is not) and allocations
//! per message for each (`REDIS_SESSION_REPORT=0` skips that).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use divan::counter::{BytesCount, ItemsCount};
use divan::{Bencher, black_box};
use synapse_replication::positions::Follower;
use synapse_replication::resp::{self, Incoming};
use synapse_replication::session::{RedisEvent, RedisLink, RedisSession};
use synapse_replication::wire::{self, Command, InstanceName};

/// The traffic `benches/e2e.sh` publishes (`tools/flood.rs`).
#[path = "tools/mix.rs"]
mod mix;

/// Counts allocations while `COUNTING` is set.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Messages of the mix (its 10-line preamble comes on top).
const MESSAGES: usize = 500_000;
/// Bytes per read.
const READ: usize = 64 << 10;
const CHANNEL: &str = "e2e.example.com";

/// The subscriber's bytes, and how many messages they hold.
struct Input {
    wire: Vec<u8>,
    messages: usize,
}

fn input() -> &'static Input {
    static INPUT: std::sync::OnceLock<Input> = std::sync::OnceLock::new();
    INPUT.get_or_init(|| {
        let lines = mix::lines(&mix::items(MESSAGES, 42));
        Input {
            wire: mix::messages(&lines, CHANNEL),
            messages: lines.len(),
        }
    })
}

/// The whole path: `handle_input` per read, events drained.
fn run_session(session: &mut RedisSession, wire: &[u8], now: Instant) -> u64 {
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
    let counters = session.counters();
    assert_eq!(
        counters.received.total() + counters.malformed,
        input().messages as u64,
        "every message decoded"
    );
    events
}

/// RESP only (and, with `wire`, command decoding; with `follower`, the
/// follower too), reads appended to one buffer as the session does.
fn run_stages(wire: &[u8], decode: bool, follower: Option<&mut Follower>) -> usize {
    let mut decoder = resp::RespDecoder::new();
    let commands = wire::Decoder::new();
    let mut buf = BytesMut::new();
    let mut count = 0;
    let mut follower = follower;
    for read in wire.chunks(READ) {
        buf.extend_from_slice(read);
        while let Some(incoming) = decoder.decode_pubsub(&mut buf).expect("valid RESP") {
            let Incoming::Message(message) = incoming else {
                continue;
            };
            count += 1;
            if !decode {
                black_box(&message.payload);
                continue;
            }
            let command = commands.decode(message.payload);
            let Some(follower) = follower.as_deref_mut() else {
                black_box(&command);
                continue;
            };
            if let Ok(Some(command @ (Command::Rdata(_) | Command::Position(_)))) = command {
                follower.handle_command(command);
                while let Some(event) = follower.poll_event() {
                    black_box(event);
                }
            }
        }
    }
    count
}

fn follower() -> Follower {
    let mut follower = Follower::new(InstanceName::from("drain"), mix::registry());
    follower.connected();
    follower
}

fn main() {
    // REDIS_SESSION_REPORT=0 skips the report (e.g. under a profiler).
    if std::env::var_os("REDIS_SESSION_REPORT").is_none_or(|value| value != "0") {
        report();
    }
    divan::main();
}

/// CPU time of this thread so far (`/proc/thread-self/schedstat`, in ns;
/// wall time on systems without it). CPU time, not wall time: on a shared
/// machine it does not count the time other processes take.
fn cpu_time() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .map(Duration::from_nanos)
        .unwrap_or_else(|| {
            static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
            START.get_or_init(Instant::now).elapsed()
        })
}

/// CPU ns/message (best of 3) and allocations per message of each stage.
fn report() {
    let input = input();
    let n = input.messages as f64;
    println!(
        "input: {} messages, {} bytes of RESP ({:.1} per message), in {} KiB reads",
        input.messages,
        input.wire.len(),
        input.wire.len() as f64 / n,
        READ >> 10
    );
    let stages: [(&str, &dyn Fn()); 4] = [
        ("resp", &|| {
            black_box(run_stages(&input.wire, false, None));
        }),
        ("resp_wire", &|| {
            black_box(run_stages(&input.wire, true, None));
        }),
        ("resp_wire_follower", &|| {
            black_box(run_stages(&input.wire, true, Some(&mut follower())));
        }),
        ("session", &|| {
            let now = Instant::now();
            let mut session = mix::ready_session(CHANNEL, now);
            black_box(run_session(&mut session, &input.wire, now));
        }),
    ];
    for (name, stage) in stages {
        let mut best = Duration::MAX;
        for _ in 0..3 {
            let start = cpu_time();
            stage();
            best = best.min(cpu_time().saturating_sub(start));
        }
        ALLOCATIONS.store(0, Ordering::Relaxed);
        COUNTING.store(true, Ordering::Relaxed);
        stage();
        COUNTING.store(false, Ordering::Relaxed);
        let allocations = ALLOCATIONS.load(Ordering::Relaxed) as f64;
        println!(
            "{name:<20} {:>7.1} CPU ns/message  {:>6.2} M messages/CPU-s  {:.3} allocations/message",
            best.as_nanos() as f64 / n,
            n / best.as_secs_f64() / 1e6,
            allocations / n
        );
    }
}

/// `resp::RespDecoder::decode_pubsub` alone.
#[divan::bench(sample_count = 5, sample_size = 1)]
fn resp(bencher: Bencher) {
    let input = input();
    bencher
        .counter(ItemsCount::new(input.messages))
        .counter(BytesCount::new(input.wire.len()))
        .bench_local(|| assert_eq!(run_stages(&input.wire, false, None), input.messages));
}

/// Plus `wire::Decoder::decode`.
#[divan::bench(sample_count = 5, sample_size = 1)]
fn resp_wire(bencher: Bencher) {
    let input = input();
    bencher
        .counter(ItemsCount::new(input.messages))
        .counter(BytesCount::new(input.wire.len()))
        .bench_local(|| assert_eq!(run_stages(&input.wire, true, None), input.messages));
}

/// Plus the follower.
#[divan::bench(sample_count = 5, sample_size = 1)]
fn resp_wire_follower(bencher: Bencher) {
    let input = input();
    bencher
        .counter(ItemsCount::new(input.messages))
        .counter(BytesCount::new(input.wire.len()))
        .with_inputs(follower)
        .bench_local_values(|mut follower| {
            assert_eq!(
                run_stages(&input.wire, true, Some(&mut follower)),
                input.messages
            );
            follower
        });
}

/// `RedisSession::handle_input` in 64 KiB reads, events drained.
#[divan::bench(sample_count = 5, sample_size = 1)]
fn session(bencher: Bencher) {
    let input = input();
    let now = Instant::now();
    bencher
        .counter(ItemsCount::new(input.messages))
        .counter(BytesCount::new(input.wire.len()))
        .with_inputs(|| mix::ready_session(CHANNEL, now))
        .bench_local_values(|mut session| {
            black_box(run_session(&mut session, &input.wire, now));
            session
        });
}
