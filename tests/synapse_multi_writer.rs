//! A real multi-writer Synapse 1.163.2 deployment (issue #14, part 4),
//! followed by this crate through Redis while faults are injected.
//!
//! The deployment (`tests/common/synapse.rs`, `tests/synapse/deployment.py`):
//! main, two event persisters (`stream_writers.events: [persister1,
//! persister2]`) and `worker1` (`stream_writers.typing`), on a PostgreSQL
//! database of its own, replicating over a redis-server of its own. One
//! deployment serves the whole file (Synapse's start-up is the slow part).
//!
//! The crate's [`RedisClient`] follows it with the registry read from the
//! deployment's own homeserver.yaml and catches up over Synapse's HTTP
//! endpoint ([`HttpCatchUp`]), while the test sends a few hundred messages
//! and topic changes (state events: their persister also writes `caches`
//! rows) to rooms of both persisters through main, typing notifications
//! through `worker1`, and injects faults:
//! - Redis restarted (killed, a new redis-server on the same port);
//! - the follower paused past its keep-alive (its driver thread blocked);
//! - the follower's Redis connections killed (`CLIENT KILL`), three times,
//!   during bursts of topic changes sent straight to the persisters, so
//!   that writers keep writing `caches` while answering catch-ups;
//! - writer blips, twice per persister: its Redis connections killed while
//!   it keeps persisting events (sent to its own client listener). Synapse
//!   then publishes `REPLICATE`, possibly an `RDATA` at its latest token,
//!   and `POSITION prev=new`: nothing on the wire shows the gap.
//!
//! Then it checks, against the database and the writers themselves:
//! - every `events` row of each persister (`events.event_id`,
//!   `stream_ordering`, `instance_name`) arrived exactly once, from that
//!   writer, at that token;
//! - the follower's position of every (stream, writer) is what the writer
//!   answers to a final `REPLICATE` (or what it published since);
//! - no catch-up is left outstanding: `caches` of every process is caught
//!   up too.
//!
//! Then forged lines (issue #34), published on the deployment's Redis as
//! any process there could: two rows in persister2's name just ahead of
//! the stream (Synapse's processes adopt their token, and persister1 then
//! publishes none of its rows below it), then a `POSITION` claiming
//! persister1's events up to `i64::MAX` (Synapse's persisters adopt it and
//! publish no row below it). After each, a `REPLICATE`, as any process that
//! connects sends one: every `events` row of both persisters still arrives
//! exactly once, the rows Synapse withheld through the checks that follow
//! the `REPLICATE` (after their writer's later rows: out of order), and
//! after the forged `POSITION` in order.
//!
//! Failures are collected and reported together, after the figures (rows
//! live, rows caught up, faults) are printed.
//!
//! Needs the venv `scripts/test.sh` creates (or `$SYNAPSE_PYTHON`, with
//! psycopg2), `redis-server` on PATH and PostgreSQL on 127.0.0.1:5432
//! (user postgres, trust auth); without them the test fails, it does not
//! skip.

#![cfg(all(feature = "runtime-smol", feature = "http-catch-up"))]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use common::synapse::SynapseDeployment;
use serde_json::{Value, json};
use synapse_replication::config::{RedisConfig, StreamWriters};
use synapse_replication::positions::{
    CatchUpId, CatchUpRequest, Follower, FollowerEvent, FollowerLimits, RowOrigin, Writer,
};
use synapse_replication::session::{RedisEvent, RedisSession};
use synapse_replication::streams::{EventsRowData, Row};
use synapse_replication::transport::{CatchUpSource, HttpCatchUp, RedisClient, SmolRuntime};
use synapse_replication::wire::{Command, InstanceName, RawRow, RdataToken, StreamName, Token};

/// How long any one expected thing may take to happen.
const PATIENCE: Duration = Duration::from_secs(30);

/// The follower's keep-alive in this test: a `PING` every second, a
/// connection silent for 2 s is dead. The pause lasts longer.
const PING_INTERVAL: Duration = Duration::from_secs(1);
const PING_TIMEOUT: Duration = Duration::from_secs(2);
const PAUSE: Duration = Duration::from_secs(5);

const FOLLOWER: &str = "rustfollower";

// ---------------------------------------------------------------------
// The follower: a RedisClient on a driver thread, and what it reported.
// ---------------------------------------------------------------------

/// One `ev` row of the `events` stream, as delivered.
#[derive(Clone, Debug)]
struct EvRow {
    event_id: String,
    writer: String,
    token: i64,
    source: RowOrigin,
}

#[derive(Debug, Default)]
struct Record {
    ready: u64,
    /// Every `ev` row delivered.
    ev_rows: Vec<EvRow>,
    /// Rows delivered per stream, live and caught up.
    live_rows: BTreeMap<String, usize>,
    /// The first tokens delivered live with more than one row (a batch:
    /// `RDATA ... batch` rows, then the numbered one), as delivered.
    live_batches: Vec<(StreamName, InstanceName, i64, Vec<String>)>,
    caught_up_rows: BTreeMap<String, usize>,
    /// Every command received, in order.
    received: Vec<Command>,
    /// `received.len()` at each `Ready`: where a new subscription began.
    ready_marks: Vec<usize>,
    /// Catch-ups asked, per stream.
    catch_ups: BTreeMap<String, usize>,
    /// Catch-ups that failed, per stream, and the first few errors.
    catch_up_failures: BTreeMap<String, usize>,
    catch_up_errors: Vec<String>,
    /// Connections lost (faults make them).
    disconnects: usize,
    connect_failures: usize,
    /// Other follower events (positions reached, ...), by kind.
    other_events: BTreeMap<String, usize>,
    /// Resets, rejected commands, malformed messages, refused publishes,
    /// rows that do not decode: none expected.
    problems: Vec<String>,
}

impl Record {
    fn ready(&mut self) {
        self.ready += 1;
        self.ready_marks.push(self.received.len());
    }

    /// One batch of rows: counted per stream and source; `ev` rows kept.
    fn rows(
        &mut self,
        stream: &StreamName,
        writer: &InstanceName,
        token: i64,
        rows: Vec<RawRow>,
        source: RowOrigin,
    ) {
        let count = match source {
            RowOrigin::Live => &mut self.live_rows,
            RowOrigin::CatchUp => &mut self.caught_up_rows,
        };
        *count.entry(stream.as_str().to_owned()).or_default() += rows.len();
        if source == RowOrigin::Live && rows.len() > 1 && self.live_batches.len() < 40 {
            let texts = rows.iter().map(|row| row.as_str().to_owned()).collect();
            self.live_batches
                .push((stream.clone(), writer.clone(), token, texts));
        }
        if *stream != StreamName::Events {
            return;
        }
        for raw in &rows {
            match Row::decode(stream, raw) {
                Ok(Row::Events(row)) => {
                    if let EventsRowData::Event(event) = row.data {
                        self.ev_rows.push(EvRow {
                            event_id: event.event_id,
                            writer: writer.as_str().to_owned(),
                            token,
                            source,
                        });
                    }
                }
                Ok(other) => self
                    .problems
                    .push(format!("events row decoded as {other:?}: {raw}")),
                Err(error) => self
                    .problems
                    .push(format!("events row {raw} does not decode: {error}")),
            }
        }
    }

    fn catch_up(&mut self, request: &CatchUpRequest) {
        *self
            .catch_ups
            .entry(request.stream.as_str().to_owned())
            .or_default() += 1;
    }

    fn catch_up_failed(&mut self, request: &CatchUpRequest, error: &dyn std::fmt::Display) {
        *self
            .catch_up_failures
            .entry(request.stream.as_str().to_owned())
            .or_default() += 1;
        if self.catch_up_errors.len() < 5 {
            self.catch_up_errors.push(format!("{request}: {error}"));
        }
    }

    /// Positions reached, and whatever else the follower reports (its
    /// events grow): counted by kind, the first word of their text.
    fn other(&mut self, event: &dyn std::fmt::Display) {
        let text = event.to_string();
        let kind = text.split(' ').next().unwrap_or_default().to_owned();
        *self.other_events.entry(kind).or_default() += 1;
    }
}

fn note(event: RedisEvent, record: &mut Record) {
    match event {
        RedisEvent::Ready => record.ready(),
        RedisEvent::Follower(FollowerEvent::Rows {
            stream,
            writer,
            token,
            rows,
            source,
            ..
        }) => record.rows(&stream, &writer, token.get(), rows.into_vec(), source),
        RedisEvent::Follower(FollowerEvent::CatchUp(request)) => {
            record.catch_up(&request);
        }
        problem @ (RedisEvent::Follower(FollowerEvent::Reset { .. })
        | RedisEvent::Follower(FollowerEvent::Rejected { .. })) => {
            record.problems.push(format!("{problem:?}"));
        }
        other @ (RedisEvent::Follower(FollowerEvent::Position { .. })
        | RedisEvent::Follower(FollowerEvent::Started { .. })) => {
            record.other(&other);
        }
        RedisEvent::Follower(other) => record.other(&other),
        RedisEvent::Received { command, .. } => {
            record.received.push(*command);
        }
        // Other processes' USER_SYNC, LOCK_RELEASED, ...: not this test's
        // business.
        RedisEvent::Command(_) => {}
        RedisEvent::Connected { .. } => {}
        RedisEvent::Disconnected { .. } => record.disconnects += 1,
        RedisEvent::ConnectFailed { .. } => record.connect_failures += 1,
        RedisEvent::CatchUpFailed { request, error, .. } => {
            record.catch_up_failed(&request, &error);
        }
        // Reported after a run of failures; the final checks list what is
        // still outstanding.
        RedisEvent::CatchUpStuck(stuck) => record.other(&format!("stuck {stuck:?}")),
        other => record.problems.push(format!("{other:?}")),
    }
}

type Job = Box<dyn FnOnce(&mut RedisClient<SmolRuntime>) + Send>;

enum Step {
    Event(Option<RedisEvent>),
    Job(Option<Job>),
}

async fn drive(
    mut client: RedisClient<SmolRuntime>,
    jobs: smol::channel::Receiver<Job>,
    record: Arc<Mutex<Record>>,
) {
    loop {
        // Jobs first, so that a busy connection cannot starve them.
        // `next_event` keeps its state in the client: dropping its future
        // loses nothing.
        let step = smol::future::or(async { Step::Job(jobs.recv().await.ok()) }, async {
            Step::Event(client.next_event().await)
        })
        .await;
        match step {
            Step::Event(Some(event)) => {
                note(event, &mut record.lock().unwrap_or_else(|e| e.into_inner()));
            }
            Step::Job(Some(job)) => job(&mut client),
            Step::Event(None) | Step::Job(None) => break,
        }
    }
}

/// The crate's follower, on its own thread.
struct Node {
    record: Arc<Mutex<Record>>,
    jobs: smol::channel::Sender<Job>,
    thread: Option<JoinHandle<()>>,
}

impl Node {
    fn spawn(client: RedisClient<SmolRuntime>) -> Node {
        let record = Arc::new(Mutex::new(Record::default()));
        let (jobs, receiver) = smol::channel::unbounded();
        let shared = record.clone();
        let thread = thread::Builder::new()
            .name("node-follower".to_owned())
            .spawn(move || smol::block_on(drive(client, receiver, shared)))
            .expect("spawning the follower's thread");
        Node {
            record,
            jobs,
            thread: Some(thread),
        }
    }

    fn record(&self) -> MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `job` on the client (between two events); its result.
    fn with<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut RedisClient<SmolRuntime>) -> T + Send + 'static,
    ) -> T {
        let (tx, rx) = mpsc::channel();
        self.jobs
            .send_blocking(Box::new(move |client| {
                let _ = tx.send(job(client));
            }))
            .expect("the follower's thread is gone");
        rx.recv_timeout(PATIENCE)
            .expect("the follower did not run the job")
    }

    /// Blocks the follower's thread for `pause` (returns at once): nothing
    /// reads its sockets or runs its timers meanwhile.
    fn pause(&self, pause: Duration) {
        self.jobs
            .send_blocking(Box::new(move |_| thread::sleep(pause)))
            .expect("the follower's thread is gone");
    }

    /// Polls the record until `check` holds; panics after `patience`.
    fn wait_until(&self, what: &str, patience: Duration, mut check: impl FnMut(&Record) -> bool) {
        let deadline = Instant::now() + patience;
        loop {
            {
                let record = self.record();
                if check(&record) {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "timed out after {patience:?} waiting for {what}; ready={} \
                     disconnects={} catch-ups={:?} failures={:?} problems={:?}",
                    record.ready,
                    record.disconnects,
                    record.catch_ups,
                    record.catch_up_errors,
                    record.problems
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.jobs.close();
            let _ = thread.join();
        }
    }
}

/// `POSITION`s with `prev == new` in `commands`: what each writer answers
/// to `REPLICATE` (and announces on connecting), the last per pair.
fn announcements(commands: &[Command]) -> BTreeMap<(String, String), i64> {
    let mut announced = BTreeMap::new();
    for command in commands {
        if let Command::Position(position) = command {
            if position.prev_token == position.new_token {
                announced.insert(
                    (
                        position.stream.as_str().to_owned(),
                        position.instance.as_str().to_owned(),
                    ),
                    position.new_token.get(),
                );
            }
        }
    }
    announced
}

/// The last token each (stream, writer) published in `commands`
/// (`POSITION` new token, or a numbered `RDATA`).
fn last_published(commands: &[Command]) -> BTreeMap<(String, String), i64> {
    let mut last = BTreeMap::new();
    for command in commands {
        match command {
            Command::Position(position) => {
                last.insert(
                    (
                        position.stream.as_str().to_owned(),
                        position.instance.as_str().to_owned(),
                    ),
                    position.new_token.get(),
                );
            }
            Command::Rdata(rdata) => {
                if let RdataToken::At(token) = rdata.token {
                    last.insert(
                        (
                            rdata.stream.as_str().to_owned(),
                            rdata.instance.as_str().to_owned(),
                        ),
                        token.get(),
                    );
                }
            }
            _ => {}
        }
    }
    last
}

/// The follower's own position of every pair in `pairs`.
fn follower_positions(
    follower: &Follower,
    pairs: &BTreeSet<(String, String)>,
) -> BTreeMap<(String, String), Option<i64>> {
    pairs
        .iter()
        .map(|(stream, writer)| {
            let token = follower
                .position(
                    &StreamName::from(stream.as_str()),
                    &InstanceName::from(writer.as_str()),
                )
                .map(|token| token.get());
            ((stream.clone(), writer.clone()), token)
        })
        .collect()
}

/// Where the wire hid rows of a persister: on one subscription, an `RDATA
/// events` of writer W at token T right after W's last command at L, while
/// W wrote rows in (L, T) that were never published. Nothing on the wire
/// says they exist (the writer-blip hazard).
fn silent_gaps(
    received: &[Command],
    ready_marks: &[usize],
    written: &BTreeMap<String, BTreeSet<i64>>,
) -> Vec<String> {
    let published: BTreeSet<(String, i64)> = received
        .iter()
        .filter_map(|command| match command {
            Command::Rdata(rdata) if rdata.stream == StreamName::Events => match rdata.token {
                RdataToken::At(token) => Some((rdata.instance.as_str().to_owned(), token.get())),
                _ => None,
            },
            _ => None,
        })
        .collect();
    let mut gaps = Vec::new();
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for (index, command) in received.iter().enumerate() {
        if ready_marks.contains(&index) {
            last.clear();
        }
        match command {
            Command::Rdata(rdata) if rdata.stream == StreamName::Events => {
                let RdataToken::At(token) = rdata.token else {
                    continue;
                };
                let writer = rdata.instance.as_str().to_owned();
                let token = token.get();
                if let (Some(&from), Some(tokens)) = (last.get(&writer), written.get(&writer)) {
                    let hidden: Vec<i64> = tokens
                        .range(from + 1..token)
                        .copied()
                        .filter(|hidden| !published.contains(&(writer.clone(), *hidden)))
                        .collect();
                    if !hidden.is_empty() {
                        // What the writer sent next on this stream.
                        let next: Vec<String> = received[index + 1..]
                            .iter()
                            .filter(|next| match next {
                                Command::Rdata(r) => {
                                    r.stream == StreamName::Events && r.instance == rdata.instance
                                }
                                Command::Position(p) => {
                                    p.stream == StreamName::Events && p.instance == rdata.instance
                                }
                                _ => false,
                            })
                            .take(3)
                            .map(|next| match next {
                                Command::Rdata(r) => format!("RDATA {:?}", r.token),
                                Command::Position(p) => {
                                    format!("POSITION {} {}", p.prev_token, p.new_token)
                                }
                                _ => String::new(),
                            })
                            .collect();
                        gaps.push(format!(
                            "{writer}: RDATA {token} right after {from}, hiding {hidden:?}; \
                             then {next:?}"
                        ));
                    }
                }
                last.insert(writer, token);
            }
            Command::Position(position) if position.stream == StreamName::Events => {
                last.insert(
                    position.instance.as_str().to_owned(),
                    position.new_token.get(),
                );
            }
            _ => {}
        }
    }
    gaps
}

// ---------------------------------------------------------------------
// Load: messages through main, typing through worker1, on a thread.
// ---------------------------------------------------------------------

#[derive(Debug, Default)]
struct Load {
    /// Event ids of the messages sent (2xx answers).
    sent: Vec<String>,
    typing: usize,
    /// Requests that did not answer 2xx (status, answer).
    failed: Vec<String>,
}

fn event_id(answer: &Value) -> Option<String> {
    answer["event_id"].as_str().map(str::to_owned)
}

/// The figures and the failures, gathered as the test goes.
#[derive(Default)]
struct Report {
    faults: Vec<String>,
    failures: Vec<String>,
}

impl Report {
    fn check(&mut self, ok: bool, failure: impl FnOnce() -> String) {
        if !ok {
            self.failures.push(failure());
        }
    }
}

#[test]
fn multi_writer_deployment_through_faults() {
    let started = Instant::now();
    let deployment = SynapseDeployment::start(2);
    eprintln!(
        "deployment up in {:.2?}: {:?}",
        deployment.startup, deployment.info["phases"]
    );
    let persisters = deployment.persisters();
    assert_eq!(persisters, ["persister1", "persister2"]);

    // The crate reads the deployment's own configuration.
    let registry = Arc::new(
        StreamWriters::from_value(deployment.config.clone())
            .expect("the deployment's homeserver.yaml")
            .with_redis(true),
    );
    let redis = RedisConfig::tcp("127.0.0.1", deployment.redis_port);
    let mut options = redis.session_config(&deployment.server_name);
    options.report_received = true;
    options.client_name = Some(FOLLOWER.to_owned());
    options.ping_interval = PING_INTERVAL;
    options.ping_timeout = PING_TIMEOUT;
    let me = InstanceName::from(FOLLOWER);
    // Writers are asked to prove their rows often, so that Synapse's
    // answers are what proves them, many times over.
    let mut limits = FollowerLimits::default();
    limits.max_unproven_rows = 8;
    let session = RedisSession::new(
        options,
        Follower::with_limits(me.clone(), registry.clone(), limits),
        Writer::new(me, registry.clone()),
    );
    let catch_up: Arc<dyn CatchUpSource> = Arc::new(
        HttpCatchUp::new(
            SmolRuntime,
            registry.clone(),
            Some(deployment.secret.clone()),
        )
        .with_timeout(Duration::from_secs(10)),
    );
    let source = Arc::clone(&catch_up);
    let node = Node::spawn(RedisClient::new(SmolRuntime, redis, session).with_catch_up(catch_up));

    // Every process announces: `caches` from each, `events` from both
    // persisters, `typing` from worker1.
    let instances: Vec<String> = deployment.instances.keys().cloned().collect();
    node.wait_until("every process's POSITIONs", PATIENCE, |record| {
        let announced = announcements(&record.received);
        record.ready > 0
            && instances
                .iter()
                .all(|name| announced.contains_key(&("caches".to_owned(), wire_name(name))))
            && persisters
                .iter()
                .all(|name| announced.contains_key(&("events".to_owned(), name.clone())))
            && announced.contains_key(&("typing".to_owned(), "worker1".to_owned()))
    });

    // Where the follower starts on each persister's events: rows at or
    // below were written before it followed (none are expected: no room
    // exists yet).
    let start: BTreeMap<String, i64> = {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let names = persisters.clone();
            let start = node.with(move |client| {
                let follower = client.session().follower();
                names
                    .iter()
                    .filter_map(|name| {
                        follower
                            .position(&StreamName::Events, &InstanceName::from(name.as_str()))
                            .map(|token| (name.clone(), token.get()))
                    })
                    .collect::<BTreeMap<_, _>>()
            });
            if start.len() == persisters.len() {
                break start;
            }
            assert!(
                Instant::now() < deadline,
                "the follower has no events position for {persisters:?}: {start:?}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    };

    // Users and rooms: enough rooms that each persister writes some (rooms
    // hash to persisters; the database says which).
    let alice = deployment.register("alice", "alice-password");
    let alice_id = deployment.user_id("alice");
    let mut rooms: BTreeMap<String, String> = BTreeMap::new(); // room -> persister
    while persisters
        .iter()
        .any(|persister| rooms.values().filter(|p| *p == persister).count() < 2)
    {
        assert!(
            rooms.len() < 24,
            "rooms never spread over both persisters: {rooms:?}"
        );
        let room = deployment.create_room(&alice);
        let rows = deployment.sql(&format!(
            "SELECT instance_name FROM events WHERE room_id = '{room}' AND type = 'm.room.create'"
        ));
        let writer = rows
            .first()
            .and_then(|row| row.first())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no create event of {room}: {rows:?}"))
            .to_owned();
        rooms.insert(room, writer);
    }
    let room_list: Vec<String> = rooms.keys().cloned().collect();
    let rooms_of = |persister: &str| -> Vec<String> {
        rooms
            .iter()
            .filter(|(_, writer)| *writer == persister)
            .map(|(room, _)| room.clone())
            .collect()
    };
    eprintln!("rooms: {rooms:?}");

    let mut report = Report::default();
    let load = Mutex::new(Load::default());
    let stop = AtomicBool::new(false);
    let sent = || load.lock().unwrap_or_else(|e| e.into_inner()).sent.len();
    let wait_sent = |count: usize| {
        let deadline = Instant::now() + Duration::from_secs(90);
        while sent() < count {
            assert!(
                Instant::now() < deadline,
                "the load sent only {} of {count} messages: {:?}",
                sent(),
                load.lock().unwrap_or_else(|e| e.into_inner()).failed
            );
            thread::sleep(Duration::from_millis(50));
        }
    };
    let mut blips = 0;

    thread::scope(|scope| {
        // The load, through main (which forwards events to the room's
        // persister): batches of 4 messages and 4 topic changes (state
        // events: their persister also writes `caches` rows), and one
        // typing change through worker1.
        scope.spawn(|| {
            let mut round = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let mut requests: Vec<Value> = (0..8)
                    .map(|i| {
                        let room = &room_list[(round * 8 + i) % room_list.len()];
                        let text = format!("load {round}.{i}");
                        if i % 2 == 1 {
                            deployment.state_request(
                                "main",
                                &alice,
                                room,
                                ("m.room.topic", ""),
                                &json!({ "topic": text }),
                            )
                        } else {
                            deployment.message_request("main", &alice, room, &text)
                        }
                    })
                    .collect();
                let typing_room = &room_list[round % room_list.len()];
                requests.push(deployment.typing_request(
                    &alice,
                    typing_room,
                    &alice_id,
                    (round / room_list.len()).is_multiple_of(2),
                ));
                let answers = deployment.requests(&requests, 4);
                let mut load = load.lock().unwrap_or_else(|e| e.into_inner());
                for (index, (status, answer)) in answers.into_iter().enumerate() {
                    if !(200..300).contains(&status) {
                        load.failed.push(format!("{status} {answer}"));
                    } else if index < 8 {
                        match event_id(&answer) {
                            Some(id) => load.sent.push(id),
                            None => load.failed.push(format!("no event_id: {answer}")),
                        }
                    } else {
                        load.typing += 1;
                    }
                }
                round += 1;
            }
        });

        let fault_result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_sent(48);

            // Redis restarted on the same port.
            let ready = node.record().ready;
            let restart = deployment.restart_redis();
            report.faults.push(format!("Redis restarted: {restart}"));
            node.wait_until(
                "the follower back after the Redis restart",
                PATIENCE,
                |record| record.ready > ready,
            );
            wait_sent(sent() + 48);

            // The follower paused past its keep-alive: its thread blocked,
            // nothing reads its sockets; Redis buffers what it publishes.
            let disconnects = node.record().disconnects;
            let before = sent();
            let paused_at = Instant::now();
            node.pause(PAUSE);
            while paused_at.elapsed() < PAUSE {
                thread::sleep(Duration::from_millis(50));
            }
            let during = sent() - before;
            wait_sent(sent() + 32);
            report.faults.push(format!(
                "follower paused {PAUSE:?} (ping every {PING_INTERVAL:?}, dead after \
                 {PING_TIMEOUT:?} of silence): {during} events sent meanwhile, {} of its \
                 connections dropped by then",
                node.record().disconnects - disconnects
            ));

            // The follower's Redis connections killed, three times, in the
            // middle of a burst of topic changes sent straight to the
            // persisters (6 threads; the clients give up after 0.4 s,
            // Synapse persists on). Each time the follower subscribes again,
            // asks REPLICATE and catches up, `caches` too, from writers
            // that keep writing while they answer.
            for round in 0..3 {
                let burst: Vec<Value> = (0..60)
                    .map(|i| {
                        let persister = &persisters[i % persisters.len()];
                        let targets = rooms_of(persister);
                        let mut request = deployment.state_request(
                            persister,
                            &alice,
                            &targets[i % targets.len()],
                            ("m.room.topic", ""),
                            &json!({ "topic": format!("burst {round} {i}") }),
                        );
                        request["timeout"] = json!(0.4);
                        request
                    })
                    .collect();
                let deployment = &deployment;
                let burst = scope.spawn(move || deployment.requests(&burst, 6));
                // Let the burst start (a Python process, ~0.1 s).
                thread::sleep(Duration::from_millis(500));
                let ready = node.record().ready;
                let killed = deployment.kill_redis_clients_named(FOLLOWER);
                assert_eq!(
                    killed.len(),
                    2,
                    "the follower's two connections: {killed:?}"
                );
                node.wait_until("the follower back after CLIENT KILL", PATIENCE, |record| {
                    record.ready > ready
                });
                let answers = burst.join().expect("the burst's thread");
                report.faults.push(format!(
                    "follower's connections killed during a burst of {} topic changes to the \
                     persisters ({} answered within 0.4 s): {killed:?}",
                    answers.len(),
                    answers.iter().filter(|(status, _)| *status == 200).count()
                ));
                wait_sent(sent() + 16);
            }

            // Writer blips, twice per persister. A persister loses its
            // Redis connections while it keeps persisting events: messages
            // and (two in three) topic changes to its own rooms, sent to its own
            // client listener on 4 threads until 1 s after it is back. Its
            // answers wait for Redis (the external cache), so the clients
            // give up after 0.4 s: Synapse persists on.
            for round in 0..2 {
                for persister in &persisters {
                    let targets = rooms_of(persister);
                    let requests: Vec<Value> = (0..400)
                        .map(|i| {
                            let room = &targets[i % targets.len()];
                            let text = format!("blip {round} {persister} {i}");
                            let mut request = if i % 3 != 0 {
                                deployment.state_request(
                                    persister,
                                    &alice,
                                    room,
                                    ("m.room.topic", ""),
                                    &json!({ "topic": text }),
                                )
                            } else {
                                deployment.message_request(persister, &alice, room, &text)
                            };
                            request["timeout"] = json!(0.4);
                            request
                        })
                        .collect();
                    let blip = deployment.blip(persister, &requests, 4, Duration::from_secs(1));
                    let results = blip["results"].as_array().cloned().unwrap_or_default();
                    let count = |wanted: &dyn Fn(&Value) -> bool| {
                        results.iter().filter(|result| wanted(result)).count()
                    };
                    report.faults.push(format!(
                        "writer blip of {persister}: killed {}, back after {:.2} s; {} requests \
                         to it ({} made before it was back), {} answered, {} given up after \
                         0.4 s",
                        blip["killed"],
                        blip["reconnected_after"].as_f64().unwrap_or(f64::NAN),
                        results.len(),
                        count(&|result| result["before_reconnect"] == json!(true)),
                        count(&|result| {
                            result["status"]
                                .as_u64()
                                .is_some_and(|status| (200..300).contains(&status))
                        }),
                        count(&|result| result["status"] == json!(0)),
                    ));
                    blips += 1;
                    wait_sent(sent() + 12);
                }
            }
        }));
        stop.store(true, Ordering::Relaxed);
        if let Err(panic) = fault_result {
            std::panic::resume_unwind(panic);
        }
    });

    // After the faults, live rows flow again: one more message to each
    // persister's rooms, through main.
    let last_requests: Vec<Value> = persisters
        .iter()
        .map(|persister| {
            deployment.message_request("main", &alice, &rooms_of(persister)[0], "after the faults")
        })
        .collect();
    let last_sent: Vec<String> = deployment
        .requests(&last_requests, 1)
        .into_iter()
        .map(|(status, answer)| {
            assert_eq!(status, 200, "sending after the faults: {answer}");
            event_id(&answer).expect("an event id")
        })
        .collect();
    node.wait_until("the last messages", PATIENCE, |record| {
        last_sent
            .iter()
            .all(|id| record.ev_rows.iter().any(|row| row.event_id == *id))
    });

    // --- The database: every events row of each writer, exactly once,
    // from that writer, at its token.
    let db_rows = deployment.sql(
        "SELECT event_id, stream_ordering, instance_name FROM events \
         WHERE stream_ordering > 0 ORDER BY stream_ordering",
    );
    let in_db: Vec<(String, i64, String)> = db_rows
        .iter()
        .map(|row| {
            (
                row[0].as_str().expect("event_id").to_owned(),
                row[1].as_i64().expect("stream_ordering"),
                row[2].as_str().unwrap_or("(null)").to_owned(),
            )
        })
        .collect();
    let record = node.record();
    let mut delivered: BTreeMap<&str, Vec<&EvRow>> = BTreeMap::new();
    for row in &record.ev_rows {
        delivered
            .entry(row.event_id.as_str())
            .or_default()
            .push(row);
    }
    // The events the blips' requests made (their clients mostly gave up
    // before Synapse answered): their text says so.
    let blip_ids: BTreeSet<String> = deployment
        .sql("SELECT event_id FROM event_json WHERE json LIKE '%\"blip %'")
        .iter()
        .map(|row| row[0].as_str().expect("event_id").to_owned())
        .collect();
    let mut missing = Vec::new();
    let mut wrong = Vec::new();
    let mut before_follower = 0;
    let mut per_writer: BTreeMap<&str, usize> = BTreeMap::new();
    for (event_id, token, writer) in &in_db {
        report.check(persisters.contains(writer), || {
            format!("{event_id} at {token} was written by {writer}, not a persister")
        });
        *per_writer.entry(writer.as_str()).or_default() += 1;
        if *token <= start.get(writer).copied().unwrap_or(0) {
            before_follower += 1;
            continue;
        }
        match delivered.get(event_id.as_str()).map(Vec::as_slice) {
            None | Some([]) => missing.push(format!(
                "{event_id} ({writer} {token}{})",
                if blip_ids.contains(event_id) {
                    ", made by a blip's request"
                } else {
                    ""
                }
            )),
            Some([row]) => {
                if row.writer != *writer || row.token != *token {
                    wrong.push(format!(
                        "{event_id}: database {writer} {token}, delivered {} {}",
                        row.writer, row.token
                    ));
                }
            }
            Some(rows) => wrong.push(format!(
                "{event_id} delivered {} times: {rows:?}",
                rows.len()
            )),
        }
    }
    let known: BTreeSet<&str> = in_db.iter().map(|(id, _, _)| id.as_str()).collect();
    let unknown: Vec<&str> = delivered
        .keys()
        .copied()
        .filter(|id| !known.contains(id))
        .collect();
    report.check(before_follower == 0, || {
        format!(
            "{before_follower} events rows were written before the follower followed \
             ({start:?}): the check does not cover them"
        )
    });
    report.check(missing.is_empty(), || {
        format!(
            "{} of {} events rows never arrived: {}",
            missing.len(),
            in_db.len(),
            missing.join(", ")
        )
    });
    report.check(wrong.is_empty(), || {
        format!("events rows with the wrong writer, token or count: {wrong:?}")
    });
    report.check(unknown.is_empty(), || {
        format!("ev rows that are not in the database: {unknown:?}")
    });
    for persister in &persisters {
        report.check(
            per_writer.get(persister.as_str()).copied().unwrap_or(0) > 0,
            || format!("{persister} wrote no events"),
        );
    }
    let mut written: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    for (_, token, writer) in &in_db {
        written.entry(writer.clone()).or_default().insert(*token);
    }
    let gaps = silent_gaps(&record.received, &record.ready_marks, &written);
    let pairs: BTreeSet<(String, String)> = announcements(&record.received).into_keys().collect();
    drop(record);

    // --- Final positions: what each writer answers to REPLICATE.
    let asked_at = node.record().received.len();
    node.with(|client| client.session_mut().request_replicate(Instant::now()));
    let answered = {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let record = node.record();
            let answers = announcements(&record.received[asked_at..]);
            if pairs.iter().all(|pair| answers.contains_key(pair)) || Instant::now() > deadline {
                break answers;
            }
            drop(record);
            thread::sleep(Duration::from_millis(50));
        }
    };
    let unanswered: Vec<&(String, String)> = pairs
        .iter()
        .filter(|pair| !answered.contains_key(*pair))
        .collect();
    report.check(unanswered.is_empty(), || {
        format!("no answer to REPLICATE for {unanswered:?}")
    });
    // WriterList may write after answering (presence timers, caches): the
    // follower must reach the last token each published since its answer.
    // Poll until it does, or the deadline.
    let deadline = Instant::now() + PATIENCE;
    let (mismatches, outstanding) = loop {
        let follower = node.with({
            let pairs = pairs.clone();
            move |client| {
                let follower = client.session().follower();
                (
                    follower_positions(follower, &pairs),
                    follower
                        .outstanding_catch_ups()
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>(),
                )
            }
        });
        let record = node.record();
        let published = last_published(&record.received[asked_at..]);
        let mismatches: Vec<String> = answered
            .iter()
            .filter_map(|(pair, answer)| {
                let expected = published.get(pair).copied().unwrap_or(*answer);
                let at = follower.0.get(pair).copied().flatten();
                (at != Some(expected)).then(|| {
                    format!(
                        "{} {}: follower at {at:?}, writer answered {answer} \
                         (last published {expected})",
                        pair.0, pair.1
                    )
                })
            })
            .collect();
        drop(record);
        if (mismatches.is_empty() && follower.1.is_empty()) || Instant::now() > deadline {
            break (mismatches, follower.1);
        }
        thread::sleep(Duration::from_millis(100));
    };
    report.check(mismatches.is_empty(), || {
        format!("follower positions differ from the writers' answers to REPLICATE: {mismatches:#?}")
    });
    report.check(outstanding.is_empty(), || {
        format!("catch-ups still outstanding {PATIENCE:?} after the last fault: {outstanding:?}")
    });

    // --- Forged rows (issue #34). Two rows published in persister2's
    // name just ahead of the stream's last: Synapse's processes take them
    // as persister2's, and persister1 adopts their token as the highest
    // allocated (`_max_seen_allocated_stream_id`) and publishes none of
    // its own rows below it: those reach a follower only through a
    // catch-up. Then a REPLICATE, as any process that connects sends one.
    // Not one row may be lost or repeated.
    let top = deployment.sql("SELECT COALESCE(MAX(stream_ordering), 0) FROM events")[0][0]
        .as_i64()
        .expect("a stream ordering");
    for token in [top + 3, top + 5] {
        let forged = format!(
            r#"RDATA events persister2 {token} ["ev",["$forged{token}","!forged:example.com","m.room.message",null,null,null,null,false,false]]"#
        );
        publish(deployment.redis_port, &deployment.server_name, &forged);
    }
    let forged_row_requests: Vec<Value> = (0..24)
        .map(|i| {
            let room = &room_list[i % room_list.len()];
            deployment.message_request("main", &alice, room, &format!("after forged rows {i}"))
        })
        .collect();
    let after_forged_rows: Vec<String> = deployment
        .requests(&forged_row_requests, 4)
        .into_iter()
        .map(|(status, answer)| {
            assert_eq!(status, 200, "sending after the forged rows: {answer}");
            event_id(&answer).expect("an event id")
        })
        .collect();
    node.with(|client| client.session_mut().request_replicate(Instant::now()));
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline
        && !after_forged_rows
            .iter()
            .all(|id| node.record().ev_rows.iter().any(|row| row.event_id == *id))
    {
        thread::sleep(Duration::from_millis(50));
    }
    {
        let record = node.record();
        let missing: Vec<&String> = after_forged_rows
            .iter()
            .filter(|id| !record.ev_rows.iter().any(|row| row.event_id == **id))
            .collect();
        report.check(missing.is_empty(), || {
            format!(
                "after forged rows in persister2's name: {} of {} events not delivered \
                 {PATIENCE:?} after a REPLICATE: {missing:?}",
                missing.len(),
                after_forged_rows.len()
            )
        });
        let late = record
            .ev_rows
            .iter()
            .filter(|row| after_forged_rows.contains(&row.event_id))
            .filter(|row| row.source == RowOrigin::CatchUp)
            .count();
        eprintln!(
            "after forged rows: {} events sent through main, {late} of them fetched",
            after_forged_rows.len()
        );
    }

    // --- A forged POSITION (issue #34). One line published on the
    // deployment's Redis in persister1's name claims its events up to
    // i64::MAX. Synapse's catch-up endpoint confirms whatever range it is
    // asked, and Synapse's own persisters adopt the claim: main and the
    // other persister advance persister1 to it, and each persister then
    // takes it as its own position and publishes no events row below it.
    // The rows written after it reach the wire only through the writers'
    // next announcements (a REPLICATE: any process that connects sends
    // one) and their catch-up endpoints. Not one may be lost.
    // Rows delivered from here on (those the forged rows above made
    // Synapse withhold came late, after their writers' later rows).
    let forged_position_at = node.record().ev_rows.len();
    let forged = format!("POSITION events persister1 0 {}", i64::MAX);
    publish(deployment.redis_port, &deployment.server_name, &forged);
    let forged_requests: Vec<Value> = (0..24)
        .map(|i| {
            let room = &room_list[i % room_list.len()];
            deployment.message_request("main", &alice, room, &format!("after the forgery {i}"))
        })
        .collect();
    let after_forgery: Vec<String> = deployment
        .requests(&forged_requests, 4)
        .into_iter()
        .map(|(status, answer)| {
            assert_eq!(status, 200, "sending after the forgery: {answer}");
            event_id(&answer).expect("an event id")
        })
        .collect();
    node.with(|client| client.session_mut().request_replicate(Instant::now()));
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline
        && !after_forgery
            .iter()
            .all(|id| node.record().ev_rows.iter().any(|row| row.event_id == *id))
    {
        thread::sleep(Duration::from_millis(50));
    }
    let in_db: Vec<(String, i64, String)> = deployment
        .sql(
            "SELECT event_id, stream_ordering, instance_name FROM events \
             WHERE stream_ordering > 0 ORDER BY stream_ordering",
        )
        .iter()
        .map(|row| {
            (
                row[0].as_str().expect("event_id").to_owned(),
                row[1].as_i64().expect("stream_ordering"),
                row[2].as_str().unwrap_or("(null)").to_owned(),
            )
        })
        .collect();
    {
        let record = node.record();
        let mut lost = Vec::new();
        let mut twice = Vec::new();
        for (event_id, token, writer) in &in_db {
            let count = record
                .ev_rows
                .iter()
                .filter(|row| {
                    row.event_id == *event_id && row.writer == *writer && row.token == *token
                })
                .count();
            match count {
                0 => lost.push(format!("{writer} {token}")),
                1 => {}
                n => twice.push(format!("{writer} {token} x{n}")),
            }
        }
        report.check(lost.is_empty() && twice.is_empty(), || {
            format!(
                "after a forged `{forged}`: {} of {} events rows lost ({}), delivered more than \
                 once: {twice:?}",
                lost.len(),
                in_db.len(),
                lost.join(", ")
            )
        });
        // Each writer's rows in token order, as written.
        let mut last: BTreeMap<&str, i64> = BTreeMap::new();
        let mut disorder = Vec::new();
        for row in &record.ev_rows[forged_position_at..] {
            let previous = last.insert(row.writer.as_str(), row.token);
            if previous.is_some_and(|previous| previous >= row.token) {
                disorder.push(format!("{} {} after {previous:?}", row.writer, row.token));
            }
        }
        report.check(disorder.is_empty(), || {
            format!("events rows out of their writer's order: {disorder:?}")
        });
        eprintln!(
            "after the forged POSITION: {} events sent through main, {} of {} events rows \
             delivered",
            after_forgery.len(),
            in_db.len() - lost.len(),
            in_db.len()
        );
    }

    // A row forged ahead that closes a writer's open batch delivers the
    // batch's rows with it; when the writer's answer brings them again,
    // the follower recognises them as the first rows at their token. That
    // rests on Synapse's writers answering a token's rows byte for byte,
    // in the order they published them: asked again here for each batch
    // the follower took live.
    let batches = node.record().live_batches.clone();
    let mut differ = Vec::new();
    for (stream, writer, token, live) in &batches {
        let request = CatchUpRequest {
            id: CatchUpId::new(1),
            stream: stream.clone(),
            writer: writer.clone(),
            from: Token::new(token - 1),
            to: Token::new(*token),
        };
        match smol::block_on(source.fetch(request)) {
            Ok(page) => {
                let answered: Vec<String> = page
                    .updates
                    .iter()
                    .filter(|(at, _)| at.get() == *token)
                    .map(|(_, row)| row.as_str().to_owned())
                    .collect();
                if answered != *live {
                    differ.push(format!(
                        "{stream} {writer} {token}: {live:?} != {answered:?}"
                    ));
                }
            }
            Err(error) => differ.push(format!("{stream} {writer} {token}: {error}")),
        }
    }
    report.check(!batches.is_empty() && differ.is_empty(), || {
        format!(
            "{} batches taken live; asked again, {} differ: {differ:?}",
            batches.len(),
            differ.len()
        )
    });
    eprintln!(
        "batches taken live: {}, answered again as published: {}",
        batches.len(),
        batches.len() - differ.len()
    );

    // Synapse's writers answer a proof with the very row they published.
    // (A proof asked of a paused persister waits, and with proofs asked
    // every 8 rows, a few of its rows may be forgotten unproven meanwhile.)
    let counters = node.with(|client| client.session().follower().counters().clone());
    report.check(
        counters.proofs_confirmed * 2 > counters.proofs_requested,
        || {
            format!(
                "proofs: {} asked, {} confirmed, {} rows forgotten unproven",
                counters.proofs_requested, counters.proofs_confirmed, counters.unproven_forgotten
            )
        },
    );
    eprintln!(
        "proofs: {} asked, {} confirmed, {} rows forgotten unproven",
        counters.proofs_requested, counters.proofs_confirmed, counters.unproven_forgotten
    );

    let record = node.record();
    report.check(record.problems.is_empty(), || {
        format!("the follower reported problems: {:?}", record.problems)
    });

    // --- Figures.
    let load = load.lock().unwrap_or_else(|e| e.into_inner());
    let live_ev = record
        .ev_rows
        .iter()
        .filter(|row| row.source == RowOrigin::Live)
        .count();
    let total = |rows: &BTreeMap<String, usize>| rows.values().sum::<usize>();
    eprintln!("=== figures ===");
    eprintln!(
        "sent through main: {} events (messages and topic changes), {} after the faults; {} \
         typing changes through worker1; {} requests failed; {} events made by the blips' \
         requests to the persisters",
        load.sent.len(),
        last_sent.len(),
        load.typing,
        load.failed.len(),
        blip_ids.len()
    );
    eprintln!(
        "events rows in the database: {} ({per_writer:?}); {before_follower} at or below \
         where the follower started ({start:?})",
        in_db.len()
    );
    eprintln!(
        "ev rows delivered: {} ({live_ev} live, {} caught up over HTTP)",
        record.ev_rows.len(),
        record.ev_rows.len() - live_ev
    );
    eprintln!(
        "rows received live: {} {:?}",
        total(&record.live_rows),
        record.live_rows
    );
    eprintln!(
        "rows caught up over HTTP: {} {:?}",
        total(&record.caught_up_rows),
        record.caught_up_rows
    );
    eprintln!(
        "catch-ups asked: {:?}; failed attempts: {:?}",
        record.catch_ups, record.catch_up_failures
    );
    eprintln!("other follower events: {:?}", record.other_events);
    for error in &record.catch_up_errors {
        eprintln!("  catch-up error: {error}");
    }
    eprintln!(
        "faults injected: {} (follower disconnections seen: {}, failed connects: {}, \
         Ready: {})",
        report
            .faults
            .iter()
            .filter(|fault| !fault.starts_with("  "))
            .count(),
        record.disconnects,
        record.connect_failures,
        record.ready
    );
    for fault in &report.faults {
        eprintln!("  {fault}");
    }
    eprintln!(
        "writer blips: {blips}; silent gaps on the follower's wire (a writer's RDATA right \
         after rows it never published): {}",
        gaps.len()
    );
    for gap in &gaps {
        eprintln!("  {gap}");
    }
    for failed in load.failed.iter().take(5) {
        eprintln!("  failed request: {failed}");
    }
    for name in deployment.instances.keys() {
        let errors = deployment.log_errors(name);
        if !errors.is_empty() {
            eprintln!(
                "{name} logged {} ERROR/CRITICAL lines, first: {}",
                errors.len(),
                errors[0]
            );
        }
    }
    eprintln!(
        "wall time {:.2?} (deployment start-up {:.2?})",
        started.elapsed(),
        deployment.startup
    );
    drop(record);
    drop(load);
    drop(node);

    assert!(
        report.failures.is_empty(),
        "{} check(s) failed:\n- {}",
        report.failures.len(),
        report.failures.join("\n- ")
    );
}

/// Publishes `message` on `channel` of the Redis on `port`, as any process
/// that may publish there can: Redis authenticates no publisher.
fn publish(port: u16, channel: &str, message: &str) {
    use std::io::{Read, Write};
    let mut redis = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to Redis");
    let mut command = String::from("*3\r\n$7\r\nPUBLISH\r\n");
    for part in [channel, message] {
        command.push_str(&format!("${}\r\n{part}\r\n", part.len()));
    }
    redis.write_all(command.as_bytes()).expect("PUBLISH");
    let mut answer = [0u8; 64];
    let read = redis.read(&mut answer).expect("PUBLISH's answer");
    assert!(
        answer[..read].starts_with(b":"),
        "PUBLISH answered {:?}",
        String::from_utf8_lossy(&answer[..read])
    );
}

/// An instance's name on the wire: `main` is `master`.
fn wire_name(name: &str) -> String {
    if name == "main" {
        "master".to_owned()
    } else {
        name.to_owned()
    }
}
