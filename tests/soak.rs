//! A soak: a writer floods several streams through a real redis-server
//! while Redis is killed (`kill -9`, restarted on the same port), paused
//! past the keep-alive (SIGSTOP, SIGCONT), and its clients killed
//! (`CLIENT KILL TYPE pubsub`, `CLIENT KILL ID` of a publisher) at random
//! moments. At the end nothing is lost, nothing duplicated, no impostor is
//! seen where there is none, and the process's memory is flat.
//!
//! Two runs of one body:
//!
//! - `soak_short_flood_through_redis_faults`, 25 s, faults every 1 to 3 s
//!   (every kind at least once): CI runs it on every change.
//! - `soak_flood_through_redis_faults`, ignored: the long one, run on
//!   purpose (before a release, beside the benchmarks), for as long as you
//!   like, faults every 2 to 6 s:
//!
//! ```text
//! SOAK_SECONDS=600 cargo test --release --all-features --test soak -- --ignored --nocapture
//! ```
//!
//! (`SOAK_SECONDS` defaults to 60; `FAULT_SEED` replays a run's choices of
//! faults and moments, printed at the start, in either run.)
//!
//! - `master` writes `events` (a batch of 2 to 5 rows at one token, or
//!   single rows), `to_device`, `receipts` and `push_rules`, every 10 ms;
//!   `worker1` follows them all, and writes `caches`, which `master`
//!   follows. Every row a follower receives is checked on arrival against
//!   the writer's log (`common::nodes`): the next one, once, in order. Rows
//!   missed while Redis was away come through catch-ups from the writer's
//!   log; delivered rows are trimmed from it, so the test holds only what
//!   is in flight.
//! - Memory: `VmRSS` of this process sampled every second; after a
//!   warm-up (a tenth of the run, at least 10 s), the last third's maximum
//!   must stay within max(10 %, 4 MiB) of the first third's. The memory
//!   is the whole process's: the two runs never overlap (see [`SOAKS`]).
//! - Time only paces the run and stops a hung one; nothing passes or fails
//!   on how fast things happen.

#![cfg(all(unix, feature = "runtime-smol"))]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use common::faults::{Rng, vm_rss_kib};
use common::nodes::{Logs, Node, Rt, row, run_for, run_until};
use common::redis_server::RedisServer;
use synapse_replication::config::RedisConfig;
use synapse_replication::resp::Frame;
use synapse_replication::session::RedisError;
use synapse_replication::transport::{RedisClientConfig, SmolRuntime};
use synapse_replication::wire::{InstanceName, StreamName, Token};

/// How long recovering after the last fault may take before the test is
/// declared hung.
const PATIENCE: Duration = Duration::from_secs(120);

/// The streams master writes.
const MASTER_STREAMS: [StreamName; 4] = [
    StreamName::Events,
    StreamName::ToDevice,
    StreamName::Receipts,
    StreamName::PushRules,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// `kill -9`, down for up to 1.5 s, restarted on the same port.
    Kill9,
    /// SIGSTOP for 4.5 to 6 s (past the 1 s ping and 3 s timeout), SIGCONT.
    Pause,
    /// `CLIENT KILL TYPE pubsub`: both subscribers.
    KillSubscribers,
    /// `CLIENT KILL ID` of master's or worker1's publisher.
    KillPublisher,
}

const FAULTS: [Fault; 4] = [
    Fault::Kill9,
    Fault::Pause,
    Fault::KillSubscribers,
    Fault::KillPublisher,
];

/// Something to undo later: Redis is down or paused until then.
enum Pending {
    Restart(Instant),
    Resume(Instant),
}

struct WriterList {
    tokens: BTreeMap<StreamName, u64>,
    rows: u64,
}

impl WriterList {
    /// One tick of the flood: on each of master's streams a batch, a few
    /// single rows or nothing; on worker1's `caches` a row half the time.
    fn tick(&mut self, rng: &mut Rng, master: &mut Node, worker: &mut Node) {
        for stream in &MASTER_STREAMS {
            let tokens = rng.below(4);
            for _ in 0..tokens {
                let parts = if *stream == StreamName::Events && rng.one_in(5) {
                    2 + rng.below(4) as usize
                } else {
                    1
                };
                self.write(master, stream, parts, rng);
            }
        }
        if rng.one_in(2) {
            self.write(worker, &StreamName::Caches, 1, rng);
        }
    }

    fn write(&mut self, node: &mut Node, stream: &StreamName, parts: usize, rng: &mut Rng) {
        let token = self.tokens.entry(stream.clone()).or_default();
        *token += 1;
        let pad = 40 + rng.below(200) as usize;
        let rows = (0..parts)
            .map(|part| row(stream, *token, part, pad))
            .collect();
        node.write(stream, Token(*token as i64), rows);
        self.rows += parts as u64;
    }
}

/// The id of the client named `name` in `CLIENT LIST`.
fn client_id(server: &RedisServer, name: &str) -> Option<String> {
    let list = server.command(&["CLIENT", "LIST"]);
    let text = String::from_utf8_lossy(list.as_bytes().map_or(&[][..], |b| &b[..])).into_owned();
    text.lines()
        .find(|line| line.split(' ').any(|field| field == format!("name={name}")))
        .and_then(|line| {
            line.split(' ')
                .find_map(|field| field.strip_prefix("id="))
                .map(str::to_owned)
        })
}

/// Held by each soak for its whole run. Memory is read for the whole
/// process, so two soaks at once in this binary would read each other's
/// allocations and their faults would hit each other's timing. The long
/// soak is ignored, so a plain `cargo test` runs only the short one; this
/// lock keeps them apart under `--include-ignored` too (and a soak that
/// failed leaves the lock usable for the next).
static SOAKS: Mutex<()> = Mutex::new(());

/// How long a soak floods, and how far apart its faults are.
#[derive(Clone, Copy, Debug)]
struct Plan {
    duration: Duration,
    /// The shortest time between two faults, in ms.
    gap_ms: u64,
    /// How much longer, at most, chosen at random, in ms.
    spread_ms: u64,
}

impl Plan {
    fn next_gap(&self, rng: &mut Rng) -> Duration {
        Duration::from_millis(self.gap_ms + rng.below(self.spread_ms))
    }
}

#[test]
fn soak_short_flood_through_redis_faults() {
    let _alone = SOAKS.lock().unwrap_or_else(PoisonError::into_inner);
    let plan = Plan {
        duration: Duration::from_secs(25),
        gap_ms: 1000,
        spread_ms: 2000,
    };
    smol::block_on(soak(Arc::new(SmolRuntime), plan));
}

#[test]
#[ignore = "a soak (SOAK_SECONDS, default 60): run it on purpose, see the file's docs"]
fn soak_flood_through_redis_faults() {
    let _alone = SOAKS.lock().unwrap_or_else(PoisonError::into_inner);
    let seconds = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(60);
    let plan = Plan {
        duration: Duration::from_secs(seconds),
        gap_ms: 2000,
        spread_ms: 4000,
    };
    smol::block_on(soak(Arc::new(SmolRuntime), plan));
}

async fn soak(runtime: Rt, plan: Plan) {
    let duration = plan.duration;
    let mut rng = Rng::from_env("soak");
    let mut server = RedisServer::start();
    let config = RedisConfig::tcp("127.0.0.1", server.port());
    let logs = Logs::default();
    let mut options = RedisClientConfig::default();
    options.initial_backoff = Duration::from_millis(50);
    options.max_backoff = Duration::from_secs(1);
    options.catch_up_backoff = Duration::from_millis(50);
    let tune = |session: &mut synapse_replication::session::RedisSessionConfig| {
        session.ping_interval = Duration::from_secs(1);
        session.ping_timeout = Duration::from_secs(3);
    };
    let mut master = Node::new(
        "master",
        runtime.clone(),
        config.clone(),
        &logs,
        options.clone(),
        tune,
    );
    let mut worker = Node::new("worker1", runtime.clone(), config, &logs, options, tune);
    let worker1 = InstanceName::from("worker1");
    for stream in &MASTER_STREAMS {
        master
            .client
            .advance(stream, Token(0))
            .expect("master writes it");
        worker.follow_from_start(stream, &InstanceName::master());
    }
    worker
        .client
        .advance(&StreamName::Caches, Token(0))
        .expect("worker1 writes caches");
    master.follow_from_start(&StreamName::Caches, &worker1);
    run_until(
        &runtime,
        &mut [&mut master, &mut worker],
        "both ready",
        PATIENCE,
        |nodes| nodes.iter().all(|node| node.ready > 0),
    )
    .await;

    let start = Instant::now();
    let end = start + duration;
    let mut writers = WriterList {
        tokens: BTreeMap::new(),
        rows: 0,
    };
    let mut faults: BTreeMap<Fault, u64> = BTreeMap::new();
    let mut round: Vec<Fault> = Vec::new();
    let mut next_fault = start + plan.next_gap(&mut rng);
    let mut pending: Option<Pending> = None;
    let mut rss: Vec<(Duration, u64)> = vec![(Duration::ZERO, vm_rss_kib())];
    let mut next_sample = start + Duration::from_secs(1);
    let mut max_held = 0;

    while Instant::now() < end {
        run_for(
            &runtime,
            &mut [&mut master, &mut worker],
            Duration::from_millis(10),
        )
        .await;
        writers.tick(&mut rng, &mut master, &mut worker);
        let now = Instant::now();
        if now >= next_sample {
            rss.push((now - start, vm_rss_kib()));
            max_held = max_held.max(logs.held());
            next_sample += Duration::from_secs(1);
        }
        match pending {
            Some(Pending::Restart(at)) if now >= at => {
                server.restart();
                pending = None;
            }
            Some(Pending::Resume(at)) if now >= at => {
                server.cont_signal();
                pending = None;
            }
            Some(_) => continue,
            None => {}
        }
        if now < next_fault {
            continue;
        }
        next_fault = now + plan.next_gap(&mut rng);
        if round.is_empty() {
            // Every kind once per round, in a random order.
            round = FAULTS.to_vec();
            for i in (1..round.len()).rev() {
                round.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        let fault = round.pop().expect("a fault");
        let done = match fault {
            Fault::Kill9 => {
                server.kill9();
                let down = Duration::from_millis(rng.below(1500));
                pending = Some(Pending::Restart(now + down));
                true
            }
            Fault::Pause => {
                server.stop_signal();
                let paused = Duration::from_millis(4500 + rng.below(1500));
                pending = Some(Pending::Resume(now + paused));
                next_fault += paused;
                true
            }
            Fault::KillSubscribers => server
                .command(&["CLIENT", "KILL", "TYPE", "pubsub"])
                .as_integer()
                .is_some_and(|killed| killed > 0),
            Fault::KillPublisher => {
                let name = if rng.one_in(2) {
                    "master-pub"
                } else {
                    "worker1-pub"
                };
                match client_id(&server, name) {
                    Some(id) => server.command(&["CLIENT", "KILL", "ID", &id]) == Frame::Integer(1),
                    None => false,
                }
            }
        };
        if done {
            *faults.entry(fault).or_default() += 1;
        } else {
            // The clients were reconnecting: try this kind again later.
            round.push(fault);
        }
    }

    // Undo what is pending, stop writing, and wait for everything to
    // arrive.
    match pending.take() {
        Some(Pending::Restart(_)) => server.restart(),
        Some(Pending::Resume(_)) => server.cont_signal(),
        None => {}
    }
    let flood_ended = Instant::now();
    run_until(
        &runtime,
        &mut [&mut master, &mut worker],
        "every row delivered",
        PATIENCE,
        |nodes| {
            MASTER_STREAMS
                .iter()
                .all(|stream| nodes[1].caught_up(stream, &InstanceName::master()))
                && nodes[0].caught_up(&StreamName::Caches, &worker1)
        },
    )
    .await;
    let recovered_in = flood_ended.elapsed();
    rss.push((start.elapsed(), vm_rss_kib()));

    // Figures.
    let published: u64 = [&master, &worker]
        .iter()
        .map(|node| node.client.session().counters().published.total())
        .sum();
    let received: u64 = [&master, &worker]
        .iter()
        .map(|node| node.client.session().counters().received.total())
        .sum();
    let timeouts = |node: &Node| {
        node.closing
            .iter()
            .filter(|error| matches!(error, RedisError::Timeout(_)))
            .count()
    };
    eprintln!(
        "soak: {:?} of flood, recovered {recovered_in:?} after it",
        duration
    );
    eprintln!(
        "soak: rows written {} ({:?} tokens), commands published {published}, received {received}",
        writers.rows, writers.tokens
    );
    eprintln!("soak: faults {faults:?}");
    for node in [&master, &worker] {
        let follower = node.client.follower().counters();
        eprintln!(
            "soak: {}: rows received {}, ready {} times, disconnects {}, timeouts {}, \
             connect failures {}, catch-ups {} ({} pages, {} failed), impostor echoes {}",
            node.name,
            node.rows,
            node.ready,
            node.disconnects.len(),
            timeouts(node),
            node.connect_failed.len(),
            follower.catch_ups_requested,
            follower.catch_up_pages,
            node.catch_up_failures,
            node.client.session().counters().impostor_echoes,
        );
    }
    eprintln!("soak: most rows held in the writers' logs at once: {max_held}");

    // Nothing lost, nothing duplicated (each row was checked on arrival,
    // and every written row arrived), no surprise.
    for (stream, writer, written) in logs.all_written() {
        let follower = if writer == worker1 { &master } else { &worker };
        assert_eq!(
            follower.received(&stream, &writer),
            written,
            "{stream}/{writer}"
        );
    }
    for node in [&master, &worker] {
        assert!(
            node.surprises.is_empty(),
            "{}: {:?}",
            node.name,
            node.surprises
        );
        assert_eq!(
            node.client.session().counters().impostor_echoes,
            0,
            "{}: an impostor where there is none",
            node.name
        );
        assert_eq!(node.malformed, 0, "{}", node.name);
    }
    // The faults happened, and were noticed (a run too short for a
    // round of every kind is not asked to show them all).
    if duration >= Duration::from_secs(20) {
        for fault in FAULTS {
            assert!(
                faults.get(&fault).copied().unwrap_or(0) > 0,
                "{fault:?}: {faults:?}"
            );
        }
    }
    let pauses = faults.get(&Fault::Pause).copied().unwrap_or(0) as usize;
    assert!(timeouts(&worker) >= pauses, "{pauses} pauses");

    // Memory flat after the warm-up.
    let warm_up = (duration / 10).max(Duration::from_secs(10));
    let after: Vec<u64> = rss
        .iter()
        .filter(|(at, _)| *at >= warm_up)
        .map(|(_, kib)| *kib)
        .collect();
    let third = after.len() / 3;
    assert!(third > 0, "too short a run to judge memory: {rss:?}");
    let first = after[..third].iter().copied().max().unwrap_or(0);
    let last = after[after.len() - third..]
        .iter()
        .copied()
        .max()
        .unwrap_or(0);
    eprintln!(
        "soak: VmRSS {} KiB at start, {} KiB at the end; after the warm-up ({warm_up:?}), \
         first third max {first} KiB, last third max {last} KiB",
        rss[0].1,
        rss.last().map_or(0, |(_, kib)| *kib),
    );
    let margin = (first / 10).max(4 << 10);
    assert!(
        last <= first + margin,
        "memory grew: {first} KiB -> {last} KiB (samples: {rss:?})"
    );
}
