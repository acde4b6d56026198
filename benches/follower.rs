//! The follower: RDATA commands applied per second, and memory per tracked
//! (stream, writer) pair.
//!
//! `cargo bench --bench follower`
//!
//! The mix is a busy deployment's: events from four event persisters (some
//! batches of state rows), caches from six processes (some batches),
//! receipts, typing, presence with long status messages, to-device and
//! device lists, and a POSITION now and then. Commands are decoded from
//! lines beforehand (decoding has its own bench); what is timed is
//! `handle_command` and draining `poll_event`.
//!
//! Before the benchmarks run, `main` prints the live heap bytes per tracked
//! pair and the allocations per applied RDATA, measured with a counting
//! allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

use bytes::Bytes;
use divan::counter::ItemsCount;
use divan::{Bencher, black_box};
use synapse_replication::config::StreamWriters;
use synapse_replication::positions::{Follower, FollowerEvent};
use synapse_replication::wire::{Command, InstanceName, StreamName, Token};
use synapse_replication::writers::WriterRegistry;

/// Counts live bytes and allocations, to measure memory and allocations.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn main() {
    report();
    divan::main();
}

fn registry() -> Arc<dyn WriterRegistry> {
    Arc::new(
        StreamWriters::from_value(serde_json::json!({
            "redis": {"enabled": true},
            "instance_map": {
                "main": {"host": "m", "port": 9000},
                "event_persister1": {"host": "e1", "port": 9001},
                "event_persister2": {"host": "e2", "port": 9002},
                "event_persister3": {"host": "e3", "port": 9003},
                "event_persister4": {"host": "e4", "port": 9004},
            },
            "stream_writers": {
                "events": ["event_persister1", "event_persister2", "event_persister3", "event_persister4"],
                "receipts": ["event_persister1", "event_persister2"],
            },
        }))
        .unwrap(),
    )
}

const PERSISTERS: [&str; 4] = [
    "event_persister1",
    "event_persister2",
    "event_persister3",
    "event_persister4",
];
const CACHE_WRITERS: [&str; 6] = [
    "master",
    "synchrotron1",
    "synchrotron2",
    "synchrotron3",
    "federation_reader1",
    "event_persister1",
];

const EV: &str = r#"["ev",["$9lUlKX4q1T0CMy0tPQbWuzMJH3AeiRLw0mBzb8Z0pkA","!OGEhHVWSdvArJzumhm:matrix.org","m.room.message",null,null,null,null,false,false]]"#;
const STATE: &str = r#"["state",["!OGEhHVWSdvArJzumhm:matrix.org","m.room.member","@alice:example.com","$dGhpcyBpcyBhIHN0YXRlIGV2ZW50IGlk"]]"#;
const CACHE: &str =
    r#"["get_e2e_unused_fallback_key_types",["@alice:example.com","ABCDEFGHIJ"],1732900000123]"#;
const RECEIPT: &str = r#"["!OGEhHVWSdvArJzumhm:matrix.org","m.read","@bob:example.com",["$9lUlKX4q1T0CMy0tPQbWuzMJH3AeiRLw0mBzb8Z0pkA"],null,{"ts":1732900000000}]"#;
const TYPING: &str =
    r#"["!OGEhHVWSdvArJzumhm:matrix.org",["@alice:example.com","@bob:example.com"]]"#;
const PRESENCE: &str = r#"["@bob:example.com","online",1732900000000,1732899990000,1732899980000,1732900000000,"In a meeting until 3pm \u2014 ping me later, or write to me on the other account where I actually read messages",true]"#;
const TO_DEVICE: &str = r#"["@alice:example.com"]"#;
const DEVICE_LISTS: &str = r#"[99812,"@alice:example.com",false]"#;

/// A deterministic pseudo-random sequence (no dependency, same mix on every run).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Tokens per stream (shared between writers, as Synapse's sequences).
struct Tokens {
    next: Vec<(&'static str, i64)>,
}

impl Tokens {
    fn take(&mut self, stream: &'static str) -> i64 {
        let entry = self.next.iter_mut().find(|(s, _)| *s == stream).unwrap();
        entry.1 += 1;
        entry.1
    }
}

/// The starting token of every stream.
const START: i64 = 1_000_000;

/// `n` lines of the mix (batches are never cut), as slices of one buffer.
fn mix_lines(n: usize) -> Vec<String> {
    let mut rng = Lcg(42);
    let mut tokens = Tokens {
        next: [
            "events",
            "caches",
            "receipts",
            "typing",
            "presence",
            "to_device",
            "device_lists",
        ]
        .iter()
        .map(|s| (*s, START))
        .collect(),
    };
    let mut lines = Vec::with_capacity(n + 4);
    while lines.len() < n {
        let roll = rng.below(100);
        let (stream, writer, row, batch) = match roll {
            0..50 => {
                let writer = PERSISTERS[rng.below(4) as usize];
                let batch = if rng.below(10) == 0 {
                    2 + rng.below(2)
                } else {
                    0
                };
                ("events", writer, EV, batch)
            }
            50..75 => {
                let writer = CACHE_WRITERS[rng.below(6) as usize];
                let batch = if rng.below(5) == 0 {
                    1 + rng.below(3)
                } else {
                    0
                };
                ("caches", writer, CACHE, batch)
            }
            75..83 => ("receipts", PERSISTERS[rng.below(2) as usize], RECEIPT, 0),
            83..88 => ("typing", "master", TYPING, 0),
            88..93 => ("presence", "master", PRESENCE, 0),
            93..97 => ("to_device", "master", TO_DEVICE, 0),
            _ => ("device_lists", "master", DEVICE_LISTS, 0),
        };
        let token = tokens.take(stream);
        for _ in 0..batch {
            let row = if stream == "events" { STATE } else { row };
            lines.push(format!("RDATA {stream} {writer} batch {row}"));
        }
        lines.push(format!("RDATA {stream} {writer} {token} {row}"));
        if rng.below(64) == 0 {
            let next = tokens.take(stream);
            lines.push(format!("POSITION {stream} {writer} {token} {next}"));
        }
    }
    lines
}

/// Decodes lines that share one buffer, as a transport hands them over.
fn decode(lines: &[String]) -> Vec<Command> {
    let joined: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let buffer = Bytes::from(joined.into_bytes());
    let mut out = Vec::with_capacity(lines.len());
    let mut start = 0;
    while let Some(end) = buffer[start..].iter().position(|b| *b == b'\n') {
        out.push(
            Command::decode(buffer.slice(start..start + end))
                .unwrap()
                .unwrap(),
        );
        start += end + 1;
    }
    out
}

/// A follower connected to every writer of the mix, at the mix's start.
fn follower() -> Follower {
    let mut f = Follower::new(InstanceName::from("synchrotron9"), registry());
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    pairs.extend(PERSISTERS.iter().map(|w| ("events", *w)));
    pairs.extend(CACHE_WRITERS.iter().map(|w| ("caches", *w)));
    pairs.extend(PERSISTERS[..2].iter().map(|w| ("receipts", *w)));
    for stream in ["typing", "presence", "to_device", "device_lists"] {
        pairs.push((stream, "master"));
    }
    f.connected();
    for (stream, writer) in pairs {
        let line = format!("POSITION {stream} {writer} {START} {START}");
        f.handle_command(Command::decode(Bytes::from(line)).unwrap().unwrap());
        while f.poll_event().is_some() {}
    }
    f
}

fn apply(f: &mut Follower, commands: Vec<Command>) -> usize {
    let mut rows = 0;
    for command in commands {
        f.handle_command(command);
        while let Some(event) = f.poll_event() {
            if let FollowerEvent::Rows { rows: r, .. } = &event {
                rows += r.len();
            }
            black_box(event);
        }
    }
    rows
}

/// The realistic mix, 10 000 commands per iteration.
#[divan::bench]
fn rdata_mix(bencher: Bencher) {
    let commands = decode(&mix_lines(10_000));
    bencher
        .counter(ItemsCount::new(commands.len()))
        .with_inputs(|| (follower(), commands.clone()))
        .bench_local_values(|(mut f, commands)| {
            black_box(apply(&mut f, commands));
            f
        });
}

/// The best case: one writer, single-row numbered RDATA.
#[divan::bench]
fn rdata_single_writer(bencher: Bencher) {
    let lines: Vec<String> = (1..=10_000)
        .map(|t| format!("RDATA to_device master {} {TO_DEVICE}", START + t))
        .collect();
    let commands = decode(&lines);
    bencher
        .counter(ItemsCount::new(commands.len()))
        .with_inputs(|| (follower(), commands.clone()))
        .bench_local_values(|(mut f, commands)| {
            black_box(apply(&mut f, commands));
            f
        });
}

/// Commands held behind an outstanding catch-up of their stream.
#[divan::bench]
fn rdata_held_behind_a_catch_up(bencher: Bencher) {
    let lines: Vec<String> = (1..=5_000)
        .map(|t| format!("RDATA events event_persister1 {} {EV}", START + 10 + t))
        .collect();
    let commands = decode(&lines);
    bencher
        .counter(ItemsCount::new(commands.len()))
        .with_inputs(|| {
            let mut f = follower();
            let gap = format!(
                "POSITION events event_persister1 {} {}",
                START + 5,
                START + 10
            );
            f.handle_command(Command::decode(Bytes::from(gap)).unwrap().unwrap());
            while f.poll_event().is_some() {}
            (f, commands.clone())
        })
        .bench_local_values(|(mut f, commands)| {
            black_box(apply(&mut f, commands));
            f
        });
}

/// Live heap bytes per tracked pair, and allocations per applied RDATA.
fn report() {
    // A deployment's few writers per stream (found by comparing names).
    let live = || LIVE.load(Ordering::Relaxed);
    let before = live();
    let mut f = Follower::new(InstanceName::from("me"), registry());
    f.connected();
    let empty = live();
    let f_full = {
        drop(f);
        let start = live();
        let f = follower();
        let bytes = live() - start;
        (f, bytes)
    };
    let (f, with_pairs) = f_full;
    let base = empty - before;
    let pairs = f.tracked_pairs();
    println!(
        "memory per tracked (stream, writer) pair, {pairs} pairs over 8 streams: {:.1} bytes \
         (an empty follower: {base} bytes)",
        (with_pairs - base) as f64 / pairs as f64
    );
    drop(f);

    // Many writers of one stream (`caches` over Redis; hash-indexed).
    const NAMES: usize = 10_000;
    let mut f = Follower::new(InstanceName::from("me"), registry());
    f.connected();
    let before = live();
    for i in 0..NAMES {
        let line = format!("POSITION caches synchrotron{i} 0 {i}");
        f.handle_command(Command::decode(Bytes::from(line)).unwrap().unwrap());
        while f.poll_event().is_some() {}
    }
    let after = live();
    assert_eq!(f.tracked_pairs(), 4096, "capped by the default limit");
    // Past the cap the idlest writers are forgotten: the last ones stay.
    let last = NAMES - 1;
    assert_eq!(
        f.position(
            &StreamName::Caches,
            &InstanceName::from(format!("synchrotron{last}"))
        ),
        Some(Token(last as i64))
    );
    println!(
        "memory per tracked pair, {} writers of caches (names like \"synchrotron1234\", \
         {NAMES} offered, the idlest forgotten to make room): {:.1} bytes",
        f.tracked_pairs(),
        (after - before) as f64 / f.tracked_pairs() as f64
    );
    drop(f);

    let commands = decode(&mix_lines(10_000));
    let n = commands.len();
    let mut f = follower();
    let allocations = ALLOCATIONS.load(Ordering::Relaxed);
    let rows = apply(&mut f, commands);
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - allocations;
    println!(
        "allocations per command of the mix: {:.3} ({allocations} for {n} commands, {rows} rows)",
        allocations as f64 / n as f64
    );
    println!("counters after the mix: {:?}", f.counters());
}
