//! Interop with a real Synapse 1.163.2 (issue #7, part 3), driven from Rust:
//! our [`RedisClient`] follows the rig's Synapse over its Redis, catches up
//! over Synapse's HTTP replication endpoint, and acts as a worker
//! (`USER_SYNC`, `CLEAR_USER_SYNC`, a `caches` invalidation) that Synapse
//! obeys.
//!
//! Each test starts its own rig (`tests/common/synapse.rs`: a monolith
//! Synapse on SQLite and its own redis-server, ~3 s). The Rust processes
//! run on driver threads ([`Node`]): the test thread calls Synapse's APIs
//! (blocking) while the nodes record what their clients report.
//!
//! What the rig's Synapse (SQLite) does, as these tests found it:
//! - On `REPLICATE` master announces 18 streams (every stream but
//!   `federation`), `caches` at `0 0`.
//! - It never writes `caches` rows: with SQLite the cache invalidation
//!   stream does not exist (`cache_invalidation_stream_by_instance` is
//!   PostgreSQL only, `_send_invalidation_to_replication` does nothing).
//!   The `caches` rows our follower decodes here come from another Rust
//!   process on the same Redis.
//! - It applies `caches` rows from any instance (it does not check
//!   writers), once a `POSITION caches <instance>` was processed on the
//!   connection; an `RDATA` before it is dropped silently.
//! - `USER_SYNC ... start` alone does not change presence: it only records
//!   that the device is syncing on that process, which exempts it from the
//!   sync timeout. A worker sets the state itself over HTTP
//!   (`presence_set_state`). After `CLEAR_USER_SYNC` the user goes offline
//!   once the sync timeout passes (Synapse checks timeouts every 5 s,
//!   starting 30 s after it started).
//!
//! Needs the venv `scripts/test.sh` creates (or `$SYNAPSE_PYTHON`) and
//! `redis-server` on PATH; without them these tests fail, they do not skip.

#![cfg(all(feature = "runtime-smol", feature = "http-catch-up"))]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::process::{Command as Process, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::synapse::{SynapseRig, segment, synapse_python};
use serde_json::{Value, json};
use synapse_replication::config::{RedisConfig, StreamWriters};
use synapse_replication::positions::{Follower, FollowerEvent, RowOrigin, Writer};
use synapse_replication::session::{RedisEvent, RedisSession};
use synapse_replication::streams::{CachesRow, EventsRowData, Row, StreamRow};
use synapse_replication::transport::{
    CatchUpSource, HttpCatchUp, RedisClient, Runtime, SmolRuntime,
};
use synapse_replication::wire::{
    Command, CommandKind, InstanceName, RawRow, RdataToken, StreamName, Token, UserSync,
};

const NON_ASCII: &str = "héllo ✓ 🐈";

/// What master announces on `REPLICATE` in the rig (monolith, presence
/// on, Redis): every stream but `federation`, which master writes only
/// when a federation sender worker sends federation for it.
const MASTER_STREAMS: [&str; 18] = [
    "events",
    "backfill",
    "presence",
    "presence_federation",
    "typing",
    "receipts",
    "push_rules",
    "pushers",
    "caches",
    "device_lists",
    "to_device",
    "account_data",
    "profile_updates",
    "sticky_events",
    "thread_subscriptions",
    "un_partial_stated_room",
    "un_partial_stated_event",
    "quarantined_media",
];

/// How long any one expected thing may take to happen.
const PATIENCE: Duration = Duration::from_secs(20);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as i64)
        .unwrap_or(0)
}

// ---------------------------------------------------------------------
// Nodes: a RedisClient on a driver thread, and what it reported.
// ---------------------------------------------------------------------

/// One `Rows` event of the follower.
#[derive(Clone, Debug)]
struct Batch {
    stream: String,
    writer: String,
    token: i64,
    rows: Vec<RawRow>,
    source: RowOrigin,
}

/// Everything a node's client reported, in order.
#[derive(Debug, Default)]
struct Record {
    /// `RedisEvent::Ready`s.
    ready: u64,
    /// Master's position per stream, as the follower's events reported it
    /// (`Position`, or the token of `Rows`): consistent with `batches`.
    master: BTreeMap<String, i64>,
    /// (stream, writer) pairs that had a `FollowerEvent::Position` or
    /// `FollowerEvent::Started`.
    position_events: BTreeSet<(String, String)>,
    /// The follower's `Rows` events.
    batches: Vec<Batch>,
    /// Rows decoded into their typed form, per stream.
    decoded: BTreeMap<String, usize>,
    /// Rows that failed to decode (or to re-encode to the same typed row).
    decode_errors: Vec<String>,
    /// Every command received (`report_received`).
    received: Vec<Command>,
    /// Commands for the application (`USER_SYNC`, `LOCK_RELEASED`, ...).
    commands: Vec<Command>,
    /// Catch-ups the follower asked for.
    catch_ups: Vec<String>,
    /// Catch-ups that failed.
    catch_up_failures: Vec<String>,
    /// Anything unexpected: disconnections, malformed messages, refused
    /// publishes, rejected commands, resets, send failures.
    problems: Vec<String>,
}

impl Record {
    fn rows_of(&self, stream: &str) -> impl Iterator<Item = &Batch> {
        self.batches
            .iter()
            .filter(move |batch| batch.stream == stream)
    }

    fn row_count(&self, stream: &str) -> usize {
        self.rows_of(stream).map(|batch| batch.rows.len()).sum()
    }

    /// Whether some row of `stream` contains `text`.
    fn has_row_with(&self, stream: &str, text: &str) -> bool {
        self.rows_of(stream)
            .any(|batch| batch.rows.iter().any(|row| row.as_str().contains(text)))
    }

    /// The last token master published for each stream (`POSITION` new
    /// token or numbered `RDATA`), from the commands received.
    fn master_published(&self) -> BTreeMap<String, i64> {
        let mut last = BTreeMap::new();
        for command in &self.received {
            match command {
                Command::Position(position) if position.instance.is_master() => {
                    last.insert(
                        position.stream.as_str().to_owned(),
                        position.new_token.get(),
                    );
                }
                Command::Rdata(rdata) if rdata.instance.is_master() => {
                    if let RdataToken::At(token) = rdata.token {
                        last.insert(rdata.stream.as_str().to_owned(), token.get());
                    }
                }
                _ => {}
            }
        }
        last
    }

    fn summary(&self) -> String {
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for command in &self.received {
            let key = match command {
                Command::Rdata(rdata) => format!("RDATA {}", rdata.stream.as_str()),
                Command::Position(position) => format!("POSITION {}", position.stream.as_str()),
                other => format!("{:?}", other.kind()),
            };
            *kinds.entry(key).or_default() += 1;
        }
        format!(
            "ready={} master positions={:?}\ndecoded={:?} decode_errors={:?}\ncatch-ups={:?} \
             failures={:?}\nproblems={:?}\nreceived={kinds:?}\ncommands={:?}",
            self.ready,
            self.master,
            self.decoded,
            self.decode_errors,
            self.catch_ups,
            self.catch_up_failures,
            self.problems,
            self.commands,
        )
    }
}

/// Decodes every row of a batch into its typed form, and checks that the
/// typed row encodes to something that decodes back to the same row.
fn decode_batch(record: &mut Record, batch: &Batch) {
    let stream = StreamName::from(batch.stream.as_str());
    for raw in &batch.rows {
        let result = Row::decode(&stream, raw).and_then(|row| {
            let again = Row::decode(&stream, &row.encode()?)?;
            Ok((row, again))
        });
        match result {
            Ok((row, again)) if row == again && !matches!(row, Row::Other { .. }) => {
                *record.decoded.entry(batch.stream.clone()).or_default() += 1;
            }
            Ok((row, again)) => record.decode_errors.push(format!(
                "{} {}: {raw}: typed {row:?}, re-decoded {again:?}",
                batch.stream, batch.token
            )),
            Err(error) => record
                .decode_errors
                .push(format!("{} {}: {raw}: {error}", batch.stream, batch.token)),
        }
    }
}

fn note(event: RedisEvent, record: &mut Record) {
    match event {
        RedisEvent::Connected { .. } => {}
        RedisEvent::Ready => record.ready += 1,
        RedisEvent::Follower(FollowerEvent::Rows {
            stream,
            writer,
            token,
            rows,
            source,
        }) => {
            if writer.is_master() {
                record
                    .master
                    .insert(stream.as_str().to_owned(), token.get());
            }
            let batch = Batch {
                stream: stream.as_str().to_owned(),
                writer: writer.as_str().to_owned(),
                token: token.get(),
                rows: rows.into_vec(),
                source,
            };
            decode_batch(record, &batch);
            record.batches.push(batch);
        }
        RedisEvent::Follower(FollowerEvent::Position {
            stream,
            writer,
            token,
        })
        | RedisEvent::Follower(FollowerEvent::Started {
            stream,
            writer,
            token,
        }) => {
            if writer.is_master() {
                record
                    .master
                    .insert(stream.as_str().to_owned(), token.get());
            }
            record
                .position_events
                .insert((stream.as_str().to_owned(), writer.as_str().to_owned()));
        }
        RedisEvent::Follower(FollowerEvent::CatchUp(request)) => {
            record.catch_ups.push(request.to_string())
        }
        RedisEvent::Received { command, .. } => {
            record.received.push(*command);
        }
        RedisEvent::Command(command) => record.commands.push(command),
        RedisEvent::CatchUpFailed { request, error, .. } => {
            record.catch_up_failures.push(format!("{request}: {error}"));
        }
        other => record.problems.push(other.to_string()),
    }
}

/// `follower().position(stream, master)` for every stream that has one.
fn master_positions(follower: &Follower) -> BTreeMap<String, i64> {
    let master = InstanceName::master();
    StreamName::KNOWN
        .iter()
        .filter_map(|stream| {
            follower
                .position(stream, &master)
                .map(|token| (stream.as_str().to_owned(), token.get()))
        })
        .collect()
}

type Job<R> = Box<dyn FnOnce(&mut RedisClient<R>) + Send>;

enum Control<R: Runtime> {
    Run(Job<R>),
    Close,
}

enum Step<R: Runtime> {
    Event(Option<RedisEvent>),
    Control(Option<Control<R>>),
}

/// Runs the client until told to close (or until the node is dropped);
/// gives the session back.
async fn drive<R: Runtime>(
    mut client: RedisClient<R>,
    control: smol::channel::Receiver<Control<R>>,
    record: Arc<Mutex<Record>>,
) -> RedisSession {
    loop {
        // Control first, so that a busy connection cannot starve it.
        // `next_event` keeps its state in the client: dropping its future
        // loses nothing.
        let step = smol::future::or(async { Step::Control(control.recv().await.ok()) }, async {
            Step::Event(client.next_event().await)
        })
        .await;
        match step {
            Step::Event(Some(event)) => {
                let mut record = record.lock().unwrap_or_else(|e| e.into_inner());
                note(event, &mut record);
            }
            Step::Event(None) => break,
            Step::Control(Some(Control::Run(job))) => job(&mut client),
            Step::Control(Some(Control::Close) | None) => {
                client.close(Duration::from_secs(2)).await;
                break;
            }
        }
    }
    client.into_session()
}

/// A Rust process of the deployment: a [`RedisClient`] on its own thread.
struct Node<R: Runtime> {
    name: String,
    record: Arc<Mutex<Record>>,
    control: smol::channel::Sender<Control<R>>,
    thread: Option<JoinHandle<RedisSession>>,
}

type BlockOn = Box<dyn FnOnce(Pin<Box<dyn Future<Output = RedisSession>>>) -> RedisSession + Send>;

impl<R: Runtime> Node<R> {
    /// Runs `client` on a new thread, with `block_on` as the executor,
    /// adding to `record`.
    fn spawn(name: &str, client: RedisClient<R>, block_on: BlockOn, record: Record) -> Node<R> {
        let record = Arc::new(Mutex::new(record));
        let (control, receiver) = smol::channel::unbounded();
        let shared = record.clone();
        let thread = thread::Builder::new()
            .name(format!("node-{name}"))
            .spawn(move || block_on(Box::pin(drive(client, receiver, shared))))
            .expect("spawning a node thread");
        Node {
            name: name.to_owned(),
            record,
            control,
            thread: Some(thread),
        }
    }

    fn record(&self) -> MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `job` on the client (between two events) and returns its result.
    fn with<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut RedisClient<R>) -> T + Send + 'static,
    ) -> T {
        let (tx, rx) = mpsc::channel();
        self.control
            .send_blocking(Control::Run(Box::new(move |client| {
                let _ = tx.send(job(client));
            })))
            .unwrap_or_else(|_| panic!("node {} is gone", self.name));
        rx.recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("node {} did not run the job", self.name))
    }

    /// Polls the record until `check` gives something (panics after
    /// `patience`, showing the record).
    fn wait_for<T>(
        &self,
        what: &str,
        patience: Duration,
        mut check: impl FnMut(&Record) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + patience;
        loop {
            {
                let record = self.record();
                if let Some(value) = check(&record) {
                    return value;
                }
                if Instant::now() >= deadline {
                    panic!(
                        "node {}: timed out after {patience:?} waiting for {what}\n{}",
                        self.name,
                        record.summary()
                    );
                }
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_until(&self, what: &str, mut check: impl FnMut(&Record) -> bool) {
        self.wait_for(what, PATIENCE, |record| check(record).then_some(()));
    }

    /// Waits until the follower has a position for every stream master
    /// announces.
    fn wait_for_master_positions(&self) {
        self.wait_until("a position for every stream of master", |record| {
            MASTER_STREAMS
                .iter()
                .all(|stream| record.master.contains_key(*stream))
        });
    }

    /// Waits until the follower's own positions for master, the positions
    /// its events reported, and the last tokens master published agree
    /// (nothing in flight); gives them.
    fn wait_settled(&self) -> BTreeMap<String, i64> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let follower = self.with(|client| master_positions(client.session().follower()));
            {
                let record = self.record();
                if follower == record.master && record.master == record.master_published() {
                    return follower;
                }
                assert!(
                    Instant::now() < deadline,
                    "node {}: positions never settled: follower {follower:?}\n{}",
                    self.name,
                    record.summary()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Closes the client (writing what is queued) and gives the session back.
    fn close(mut self) -> RedisSession {
        let _ = self.control.send_blocking(Control::Close);
        let thread = self.thread.take().expect("not closed yet");
        thread
            .join()
            .unwrap_or_else(|_| panic!("node {} panicked", self.name))
    }
}

impl<R: Runtime> Drop for Node<R> {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.control.close();
            let _ = thread.join();
        }
    }
}

/// The deployment as a Rust process sees it: the rig's `instance_map`
/// (for catch-ups), Redis on (every process writes `caches`).
fn registry(rig: &SynapseRig) -> Arc<StreamWriters> {
    let writers = StreamWriters::from_value(json!({
        "instance_map": {"main": {"host": "127.0.0.1", "port": rig.replication_port}}
    }))
    .expect("the rig's instance_map");
    Arc::new(writers.with_redis(true))
}

fn redis_config(rig: &SynapseRig) -> RedisConfig {
    RedisConfig::tcp("127.0.0.1", rig.redis_port)
}

/// A session named `name` that reports every command it receives.
fn session(rig: &SynapseRig, name: &str, registry: &Arc<StreamWriters>) -> RedisSession {
    let me = InstanceName::from(name);
    let follower = Follower::new(me.clone(), registry.clone());
    let writer = Writer::new(me, registry.clone());
    session_from(rig, follower, writer)
}

fn session_from(rig: &SynapseRig, follower: Follower, writer: Writer) -> RedisSession {
    let mut options = redis_config(rig).session_config(&rig.server_name);
    options.report_received = true;
    RedisSession::new(options, follower, writer)
}

fn http_catch_up(rig: &SynapseRig, registry: &Arc<StreamWriters>) -> Arc<dyn CatchUpSource> {
    Arc::new(
        HttpCatchUp::new(SmolRuntime, registry.clone(), Some(rig.secret.clone()))
            .with_timeout(Duration::from_secs(10)),
    )
}

/// Asserts that a follower that lost nothing made no catch-up but the
/// checks of each writer's next move after a `REPLICATE` (another
/// process's, or its own on connecting): at most one per (stream, writer)
/// per `REPLICATE` heard.
fn assert_only_checks(who: &str, record: &Record) {
    let replicates = record
        .received
        .iter()
        .filter(|command| matches!(command, Command::Replicate))
        .count();
    let mut checks: BTreeMap<String, usize> = BTreeMap::new();
    for catch_up in &record.catch_ups {
        // "catch-up #N <stream> <writer> (from, to]"
        let pair: Vec<&str> = catch_up.split(' ').skip(2).take(2).collect();
        *checks.entry(pair.join(" ")).or_default() += 1;
    }
    assert!(
        checks.values().all(|&count| count <= replicates + 1),
        "{who}: catch-ups beyond the checks after {replicates} REPLICATEs: {checks:?}"
    );
}

/// A node on smol, with a catch-up source if given.
fn smol_node(
    rig: &SynapseRig,
    name: &str,
    session: RedisSession,
    catch_up: Option<Arc<dyn CatchUpSource>>,
) -> Node<SmolRuntime> {
    let mut client = RedisClient::new(SmolRuntime, redis_config(rig), session);
    if let Some(source) = catch_up {
        client = client.with_catch_up(source);
    }
    smol_node_with(name, client, Record::default())
}

fn smol_node_with(
    name: &str,
    client: RedisClient<SmolRuntime>,
    record: Record,
) -> Node<SmolRuntime> {
    Node::spawn(name, client, Box::new(smol::block_on), record)
}

// ---------------------------------------------------------------------
// Synapse helpers.
// ---------------------------------------------------------------------

/// Polls `probe` until it answers `wanted` (or panics after `patience`);
/// how long it took.
fn poll_until(
    what: &str,
    patience: Duration,
    interval: Duration,
    mut probe: impl FnMut() -> Value,
    wanted: impl Fn(&Value) -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        let value = probe();
        if wanted(&value) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < patience,
            "timed out after {patience:?} waiting for {what}; last answer: {value}"
        );
        thread::sleep(interval);
    }
}

/// A user's presence state (`online`, `offline`, ...) as they see it.
fn presence_of(rig: &SynapseRig, token: &str, user: &str) -> Value {
    rig.get_presence(token, user)["presence"].clone()
}

/// What a Synapse worker does when a user starts syncing on it
/// (`WorkerPresenceHandler.user_syncing`): set the state on the presence
/// writer over HTTP (`ReplicationPresenceSetState`).
fn presence_set_state(rig: &SynapseRig, user: &str, device: &str, state: &str) {
    let url = format!(
        "{}/_synapse/replication/presence_set_state/{}",
        rig.replication_url,
        segment(user)
    );
    let body = json!({
        "device_id": device,
        "state": {"presence": state},
        "force_notify": false,
        "is_sync": true,
    });
    let (status, answer) = rig.request_url("POST", &url, Some(&rig.secret), Some(&body));
    assert_eq!(status, 200, "presence_set_state answered {answer}");
}

/// Runs one SQL statement on the rig's SQLite database (Synapse keeps
/// running); the number of rows changed.
fn sqlite_execute(rig: &SynapseRig, sql: &str) -> u64 {
    let script = "import sqlite3, sys\n\
                  db = sqlite3.connect(sys.argv[1], timeout=30)\n\
                  db.execute(sys.argv[2])\n\
                  db.commit()\n\
                  print(db.total_changes)\n";
    let output = Process::new(synapse_python())
        .args(["-c", script])
        .arg(rig.dir.join("homeserver.db"))
        .arg(sql)
        .stdin(Stdio::null())
        .output()
        .expect("running python for sqlite3");
    assert!(
        output.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("a number of changes")
}

// ---------------------------------------------------------------------
// 1. Connecting: REPLICATE on Ready, a position for every master stream.
// ---------------------------------------------------------------------

fn check_positions_on_connect<R: Runtime>(rig: &SynapseRig, node: &Node<R>) {
    node.wait_until("master's POSITION for every stream, applied", |record| {
        MASTER_STREAMS.iter().all(|stream| {
            record.master.contains_key(*stream)
                && record
                    .position_events
                    .contains(&((*stream).to_owned(), "master".to_owned()))
        })
    });
    let published_replicates = node.with(|client| {
        client
            .session()
            .counters()
            .published
            .get(CommandKind::Replicate)
    });
    let follower = node.wait_settled();
    let record = node.record();
    eprintln!("{}", record.summary());
    eprintln!("follower positions (stream, master): {follower:?}");
    assert_eq!(record.ready, 1, "one Ready");
    assert!(published_replicates >= 1, "REPLICATE published on Ready");
    // Our REPLICATE came back (Redis echoes), before master's answers.
    let replicate_at = record
        .received
        .iter()
        .position(|command| *command == Command::Replicate)
        .expect("our own REPLICATE echoed");
    let first_position = record
        .received
        .iter()
        .position(|command| matches!(command, Command::Position(p) if p.instance.is_master()))
        .expect("master's POSITIONs");
    assert!(
        replicate_at < first_position,
        "REPLICATE before the answers"
    );
    // Exactly master's streams: `federation` is not written by master here.
    let known: BTreeSet<&str> = follower.keys().map(String::as_str).collect();
    assert_eq!(known, MASTER_STREAMS.into_iter().collect::<BTreeSet<_>>());
    // The position of each (stream, master) is the token master announced.
    let published = record.master_published();
    for stream in MASTER_STREAMS {
        assert_eq!(
            follower.get(stream),
            published.get(stream),
            "{stream}: follower position vs master's last token"
        );
    }
    assert!(record.problems.is_empty(), "{:?}", record.problems);
    assert!(
        record.decode_errors.is_empty(),
        "{:?}",
        record.decode_errors
    );
    drop(record);
    rig.assert_no_errors_logged();
}

#[test]
fn follower_gets_a_position_for_every_master_stream() {
    let started = Instant::now();
    let rig = SynapseRig::start();
    let registry = registry(&rig);
    let node = smol_node(
        &rig,
        "rustfollower",
        session(&rig, "rustfollower", &registry),
        None,
    );
    check_positions_on_connect(&rig, &node);
    drop(node);
    eprintln!(
        "smol: rig startup {:.2?}, whole test {:.2?}",
        rig.startup,
        started.elapsed()
    );
}

#[cfg(feature = "runtime-tokio")]
#[test]
fn follower_gets_a_position_for_every_master_stream_on_tokio() {
    use synapse_replication::transport::TokioRuntime;

    let started = Instant::now();
    let rig = SynapseRig::start();
    let registry = registry(&rig);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let client = RedisClient::new(
        TokioRuntime::new(runtime.handle().clone()),
        redis_config(&rig),
        session(&rig, "rustfollower", &registry),
    );
    let node = Node::spawn(
        "rustfollower-tokio",
        client,
        Box::new(move |future| runtime.block_on(future)),
        Record::default(),
    );
    check_positions_on_connect(&rig, &node);
    drop(node);
    eprintln!(
        "tokio: rig startup {:.2?}, whole test {:.2?}",
        rig.startup,
        started.elapsed()
    );
}

// ---------------------------------------------------------------------
// 2. Live rows: every row decodes; positions end equal to Synapse's.
// ---------------------------------------------------------------------

#[test]
fn every_row_decodes_and_positions_match_synapse() {
    let started = Instant::now();
    let rig = SynapseRig::start();
    let registry = registry(&rig);
    // With catch-ups: each writer's next move after a `REPLICATE` (the
    // cacher's, below) is checked by one.
    let node = smol_node(
        &rig,
        "rustfollower",
        session(&rig, "rustfollower", &registry),
        Some(http_catch_up(&rig, &registry)),
    );
    node.wait_for_master_positions();

    // The rig's Synapse (SQLite) writes no `caches` rows: another Rust
    // process on the deployment writes one, so that the follower decodes
    // caches rows from the wire too.
    let mut cacher_session = session(&rig, "rustcacher", &registry);
    cacher_session
        .advance(&StreamName::Caches, Token(0))
        .expect("every process writes caches");
    let cacher = smol_node(&rig, "rustcacher", cacher_session, None);
    cacher.wait_until("ready", |record| record.ready > 0);
    node.wait_until("rustcacher's caches POSITION", |record| {
        record
            .position_events
            .contains(&("caches".to_owned(), "rustcacher".to_owned()))
    });

    let alice = rig.register("alice", "alice-password");
    let bob = rig.register("bob", "bob-password");
    let (alice_id, bob_id) = (rig.user_id("alice"), rig.user_id("bob"));
    let room = rig.create_room(&alice);
    rig.join_room(&bob, &room);
    let mut sent = Vec::new();
    for body in [NON_ASCII, "second", "third"] {
        sent.push(rig.send_message(&alice, &room, body));
    }
    rig.set_typing(&alice, &room, &alice_id, true);
    rig.send_receipt(&bob, &room, &sent[2]);
    rig.set_typing(&alice, &room, &alice_id, false);
    rig.set_presence(&alice, &alice_id, "online", Some(NON_ASCII));
    rig.put_account_data(
        &alice,
        &alice_id,
        "org.example.interop",
        &json!({"text": NON_ASCII}),
    );
    rig.put_account_data(&bob, &bob_id, "org.example.interop", &json!({"n": 1}));

    let invalidation = CachesRow {
        cache_func: "get_user_by_id".to_owned(),
        keys: Some(vec![json!(alice_id)]),
        invalidation_ts: now_ms(),
        extra: Vec::new(),
    }
    .encode()
    .expect("encodes");
    cacher
        .with(move |client| {
            client
                .session_mut()
                .write(&StreamName::Caches, Token(1), [(Token(1), invalidation)])
        })
        .expect("rustcacher writes caches");

    let last_event = sent.last().cloned().expect("sent");
    node.wait_until(
        "rows of events, typing, receipts, presence, account_data, caches",
        |record| {
            record.has_row_with("events", &last_event)
                && record.row_count("typing") >= 2
                && record.has_row_with("receipts", &last_event)
                && record.has_row_with("presence", r"h\u00e9llo \u2713 \ud83d\udc08")
                && record.has_row_with("account_data", &bob_id)
                && record.row_count("caches") > 0
        },
    );

    // rustcacher leaves first: it would answer our REPLICATE with
    // `POSITION caches rustcacher 1 1`, and a SQLite Synapse, whose caches
    // position for every writer is 0, then fetches rows `(0, 1]` from
    // `cache_invalidation_stream_by_instance`, a PostgreSQL-only table, and
    // logs an ERROR (seen with this rig; SQLite deployments have no
    // workers, so Synapse never meets this).
    let cacher_session = cacher.close();
    assert_eq!(
        cacher_session.counters().published.get(CommandKind::Rdata),
        1
    );

    // Positions at the end: ask again (REPLICATE) and compare with what
    // Synapse announces.
    let asked_at = node.record().received.len();
    node.with(|client| client.session_mut().request_replicate(Instant::now()));
    let announced = node.wait_for(
        "master's answers to our second REPLICATE",
        PATIENCE,
        |record| {
            let announced: BTreeMap<String, i64> = record.received[asked_at..]
                .iter()
                .filter_map(|command| match command {
                    Command::Position(p)
                        if p.instance.is_master() && p.prev_token == p.new_token =>
                    {
                        Some((p.stream.as_str().to_owned(), p.new_token.get()))
                    }
                    _ => None,
                })
                .collect();
            (announced.len() == MASTER_STREAMS.len()).then_some(announced)
        },
    );
    // Synapse may still write (presence timers): the follower must be at
    // the last token Synapse published for each stream, which is the
    // announced one unless rows came after it.
    let follower = node.wait_settled();

    let record = node.record();
    eprintln!("{}", record.summary());
    eprintln!("Synapse announced on our second REPLICATE: {announced:?}");
    assert!(
        record.decode_errors.is_empty(),
        "{:#?}",
        record.decode_errors
    );
    assert!(record.problems.is_empty(), "{:?}", record.problems);
    assert!(record.catch_up_failures.is_empty());
    // Every row delivered was decoded.
    for stream in MASTER_STREAMS {
        assert_eq!(
            record.decoded.get(stream).copied().unwrap_or(0),
            record.row_count(stream),
            "{stream}"
        );
    }
    for stream in [
        "events",
        "typing",
        "receipts",
        "presence",
        "account_data",
        "caches",
    ] {
        assert!(record.row_count(stream) > 0, "no {stream} rows");
    }
    let published = record.master_published();
    assert_eq!(follower.len(), MASTER_STREAMS.len());
    for stream in MASTER_STREAMS {
        let follower = follower.get(stream).copied();
        assert_eq!(follower, published.get(stream).copied(), "{stream}");
        let announced = announced.get(stream).copied().expect("announced");
        assert!(
            follower.is_some_and(|token| token >= announced),
            "{stream}: follower {follower:?} below Synapse's {announced}"
        );
    }
    // Rows live, but for the first of each stream after the cacher's
    // `REPLICATE`, which is checked.
    assert_only_checks("the follower", &record);
    for stream in MASTER_STREAMS {
        let rows: Vec<&Batch> = record
            .rows_of(stream)
            .filter(|batch| batch.writer == "master")
            .collect();
        if let Some(last) = rows.last() {
            assert!(
                record.master[stream] >= last.token,
                "{stream}: position below its last row"
            );
        }
    }

    // The typed rows say what happened.
    let typed = |stream: &str| -> Vec<Row> {
        record
            .rows_of(stream)
            .flat_map(|batch| batch.rows.iter())
            .map(|raw| Row::decode(&StreamName::from(stream), raw).expect("decoded above"))
            .collect()
    };
    let messages: Vec<String> = typed("events")
        .into_iter()
        .filter_map(|row| match row {
            Row::Events(row) => match row.data {
                EventsRowData::Event(event)
                    if event.event_type == "m.room.message" && event.room_id == room =>
                {
                    Some(event.event_id)
                }
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert_eq!(messages, sent, "one ev row per message, in order");
    assert!(
        typed("presence").iter().any(|row| matches!(row,
            Row::Presence(p) if p.user_id == alice_id
                && p.state == "online"
                && p.status_msg.as_deref() == Some(NON_ASCII))),
        "alice's presence row, with the non-ASCII status"
    );
    assert!(typed("typing").iter().any(|row| matches!(row,
        Row::Typing(t) if t.room_id == room && t.user_ids == vec![alice_id.clone()])));
    assert!(typed("receipts").iter().any(|row| matches!(row,
        Row::Receipts(r) if r.room_id == room && r.user_id == bob_id
            && r.event_id == sent[2] && r.receipt_type == "m.read")));
    assert!(typed("account_data").iter().any(|row| matches!(row,
        Row::AccountData(a) if a.user_id == alice_id && a.room_id.is_none()
            && a.data_type == "org.example.interop")));
    assert!(typed("caches").iter().any(|row| matches!(row,
        Row::Caches(c) if c.cache_func == "get_user_by_id"
            && c.keys == Some(vec![json!(alice_id)]))));
    assert!(
        record
            .rows_of("caches")
            .all(|batch| batch.writer == "rustcacher"),
        "caches rows come from rustcacher only (SQLite Synapse writes none)"
    );
    drop(record);
    drop(node);
    rig.assert_no_errors_logged();
    eprintln!("whole test {:.2?}", started.elapsed());
}

// ---------------------------------------------------------------------
// 3. Away and back: catch-up over HTTP gives the rows missed.
// ---------------------------------------------------------------------

/// The events rows of master, `(token, rows)`, in order.
fn event_batches<'a>(batches: impl Iterator<Item = &'a Batch>) -> Vec<(i64, Vec<String>)> {
    batches
        .filter(|batch| batch.stream == "events" && batch.writer == "master")
        .map(|batch| {
            (
                batch.token,
                batch
                    .rows
                    .iter()
                    .map(|row| row.as_str().to_owned())
                    .collect(),
            )
        })
        .collect()
}

/// What a follower builds from a keyed stream's rows: the latest row per
/// key, with its token. Keys: presence per user, typing per room (user
/// lists sorted: Synapse writes a set), receipts per (room, type, user,
/// thread), account data per (user, room, type).
fn keyed_state<'a>(
    stream: &str,
    batches: impl Iterator<Item = &'a Batch>,
) -> BTreeMap<String, String> {
    let mut state = BTreeMap::new();
    let name = StreamName::from(stream);
    for batch in batches.filter(|batch| batch.stream == stream && batch.writer == "master") {
        for raw in &batch.rows {
            let (key, value) = match Row::decode(&name, raw).expect("decodes") {
                Row::Presence(row) => (row.user_id.clone(), raw.as_str().to_owned()),
                Row::Typing(mut row) => {
                    row.user_ids.sort();
                    (row.room_id, format!("{:?}", row.user_ids))
                }
                Row::Receipts(row) => (
                    format!(
                        "{} {} {} {:?}",
                        row.room_id, row.receipt_type, row.user_id, row.thread_id
                    ),
                    format!("{} {}", row.event_id, row.data.as_str()),
                ),
                Row::AccountData(_) => (raw.as_str().to_owned(), String::new()),
                other => panic!("not a keyed stream: {other:?}"),
            };
            state.insert(key, format!("{} {value}", batch.token));
        }
    }
    state
}

#[test]
fn catch_up_over_http_after_a_disconnection() {
    let started = Instant::now();
    let rig = SynapseRig::start();
    let registry = registry(&rig);
    // `stayer` is connected throughout; `leaver` goes away and comes back.
    let stayer = smol_node(
        &rig,
        "rust-stayer",
        session(&rig, "rust-stayer", &registry),
        Some(http_catch_up(&rig, &registry)),
    );
    let leaver = smol_node(
        &rig,
        "rust-leaver",
        session(&rig, "rust-leaver", &registry),
        Some(http_catch_up(&rig, &registry)),
    );
    stayer.wait_for_master_positions();
    leaver.wait_for_master_positions();

    // Both connected.
    let alice = rig.register("alice", "alice-password");
    let bob = rig.register("bob", "bob-password");
    let (alice_id, bob_id) = (rig.user_id("alice"), rig.user_id("bob"));
    let room = rig.create_room(&alice);
    rig.join_room(&bob, &room);
    let before = rig.send_message(&alice, &room, "before");
    for node in [&stayer, &leaver] {
        node.wait_until("the first message", |record| {
            record.has_row_with("events", &before)
        });
    }

    // The leaver goes away, keeping its follower (and writer).
    let leaver_record = leaver.record.clone();
    leaver.wait_settled();
    let (follower, writer) = leaver.close().into_parts();
    let positions_left = master_positions(&follower);
    let left_at = positions_left["events"];
    eprintln!("leaver left at {positions_left:?}");
    assert_eq!(
        positions_left,
        leaver_record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .master,
        "the follower given back stands where its events said"
    );

    // Synapse keeps writing: messages, a new room (state rows), typing,
    // receipts, presence, account data.
    let mut missed = Vec::new();
    for n in 0..5 {
        missed.push(rig.send_message(&alice, &room, &format!("{NON_ASCII} {n}")));
    }
    let second_room = rig.create_room(&bob);
    rig.join_room(&alice, &second_room);
    missed.push(rig.send_message(&bob, &second_room, NON_ASCII));
    rig.set_typing(&bob, &room, &bob_id, true);
    rig.set_typing(&alice, &second_room, &alice_id, true);
    rig.set_typing(&bob, &room, &bob_id, false);
    rig.send_receipt(&bob, &room, &missed[1]);
    rig.send_receipt(&bob, &room, &missed[4]);
    rig.send_receipt(&alice, &second_room, &missed[5]);
    rig.set_presence(&alice, &alice_id, "online", Some("away 1"));
    rig.set_presence(&alice, &alice_id, "unavailable", Some(NON_ASCII));
    rig.set_presence(&bob, &bob_id, "online", None);
    rig.put_account_data(&alice, &alice_id, "org.example.away", &json!({"n": 1}));
    rig.put_account_data(&alice, &alice_id, "org.example.away", &json!({"n": 2}));
    let last_missed = missed.last().cloned().expect("sent");
    stayer.wait_until("the missed rows, live", |record| {
        record.has_row_with("events", &last_missed)
            && record.has_row_with("presence", r"h\u00e9llo")
            && record.has_row_with("account_data", "org.example.away")
            && record.has_row_with("receipts", &missed[5])
    });

    // Back, with the same follower: catches up over HTTP.
    // Its application still knows where the follower stands.
    let seeded = Record {
        master: positions_left.clone(),
        ..Record::default()
    };
    let client = RedisClient::new(
        SmolRuntime,
        redis_config(&rig),
        session_from(&rig, follower, writer),
    )
    .with_catch_up(http_catch_up(&rig, &registry));
    let back = smol_node_with("rust-leaver", client, seeded);
    back.wait_until("ready and caught up on events", |record| {
        record.ready > 0
            && record.has_row_with("events", &last_missed)
            && record
                .rows_of("events")
                .any(|batch| batch.source == RowOrigin::CatchUp)
    });

    // Connected again: live rows flow to both.
    let after = rig.send_message(&alice, &room, "after");
    rig.set_presence(&bob, &bob_id, "online", Some("after"));
    for node in [&stayer, &back] {
        node.wait_until("the message after", |record| {
            record.has_row_with("events", &after)
        });
    }

    // Compare once both followers stand at the same positions (presence
    // timers may still write: retry until a moment both agree).
    let deadline = Instant::now() + PATIENCE;
    let (stayed, first, second) = loop {
        let stayed = stayer.record();
        let first = leaver_record.lock().unwrap_or_else(|e| e.into_inner());
        let second = back.record();
        let leaver_master = second.master.clone();
        if stayed.master == leaver_master && stayed.master.len() == MASTER_STREAMS.len() {
            break (stayed, first, second);
        }
        assert!(
            Instant::now() < deadline,
            "positions never agreed:\nstayer {:?}\nleaver {:?}",
            stayed.master,
            leaver_master
        );
        drop((stayed, first, second));
        thread::sleep(Duration::from_millis(50));
    };
    eprintln!("stayer: {}", stayed.summary());
    eprintln!("leaver before: {}", first.summary());
    eprintln!("leaver back: {}", second.summary());
    for record in [&*stayed, &*first, &*second] {
        assert!(
            record.decode_errors.is_empty(),
            "{:?}",
            record.decode_errors
        );
        assert!(record.problems.is_empty(), "{:?}", record.problems);
        assert!(
            record.catch_up_failures.is_empty(),
            "{:?}",
            record.catch_up_failures
        );
    }
    // The stayer lost nothing: its only catch-ups are the checks after the
    // leaver's `REPLICATE`s.
    assert_only_checks("the stayer", &stayed);

    // `events` replays rows one for one: the leaver holds exactly the rows
    // the stayer saw live, same tokens, same batches, same bytes.
    let seen_live = event_batches(stayed.batches.iter());
    let seen_by_leaver = event_batches(first.batches.iter().chain(second.batches.iter()));
    assert_eq!(seen_by_leaver, seen_live, "events rows, stayer vs leaver");
    let caught_up: Vec<i64> = second
        .rows_of("events")
        .filter(|batch| batch.source == RowOrigin::CatchUp)
        .map(|batch| batch.token)
        .collect();
    assert!(
        caught_up.first().is_some_and(|first| *first > left_at),
        "catch-up starts after {left_at}: {caught_up:?}"
    );
    for event in &missed {
        assert!(
            second
                .rows_of("events")
                .filter(|batch| batch.source == RowOrigin::CatchUp)
                .any(|batch| batch.rows.iter().any(|row| row.as_str().contains(event))),
            "{event} caught up"
        );
    }
    assert!(
        second
            .rows_of("events")
            .filter(|batch| batch.source == RowOrigin::CatchUp)
            .any(|batch| batch
                .rows
                .iter()
                .any(|row| row.as_str().starts_with(r#"["state""#))),
        "state rows of the new room caught up"
    );
    eprintln!(
        "events: {} batches seen live by the stayer; the leaver caught up {} batches \
         over HTTP ({caught_up:?})",
        seen_live.len(),
        caught_up.len()
    );

    // Keyed streams: the endpoint gives only the latest row per key (see
    // PROTOCOL.md), so rows are not replayed one for one (e.g. the leaver
    // never sees alice's "away 1" presence, nor bob's receipt on
    // missed[1]). What must agree is what a follower builds from them:
    // the latest row per key, and its token.
    for stream in ["presence", "typing", "receipts", "account_data"] {
        let live = keyed_state(stream, stayed.batches.iter());
        let leaver_state = keyed_state(stream, first.batches.iter().chain(second.batches.iter()));
        assert_eq!(leaver_state, live, "{stream}: latest row per key");
        assert!(
            second
                .rows_of(stream)
                .any(|batch| batch.source == RowOrigin::CatchUp),
            "{stream}: caught up"
        );
        let live_rows = stayed.row_count(stream);
        let leaver_rows = first.row_count(stream) + second.row_count(stream);
        eprintln!("{stream}: {live_rows} rows live, {leaver_rows} for the leaver");
    }
    assert!(
        !first.has_row_with("presence", "away 1") && !second.has_row_with("presence", "away 1"),
        "superseded presence is not replayed"
    );
    assert!(stayed.has_row_with("presence", "away 1"));
    assert!(
        !second.has_row_with("receipts", &missed[1]),
        "superseded receipt is not replayed"
    );
    assert!(stayed.has_row_with("receipts", &missed[1]));
    drop((stayed, first, second));
    // And the followers themselves stand at the same positions (read one
    // after the other: retry if Synapse wrote in between).
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (stayer_at, back_at) = (stayer.wait_settled(), back.wait_settled());
        if stayer_at == back_at {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "stayer {stayer_at:?}\nleaver {back_at:?}"
        );
    }
    drop(back);
    drop(stayer);
    rig.assert_no_errors_logged();
    eprintln!("whole test {:.2?}", started.elapsed());
}

// ---------------------------------------------------------------------
// 4. USER_SYNC and CLEAR_USER_SYNC.
// ---------------------------------------------------------------------

#[test]
fn user_sync_keeps_a_user_online_until_clear_user_sync() {
    let started = Instant::now();
    // A short sync timeout, so that a user who does not sync goes offline
    // quickly. Synapse checks timeouts every 5 s, from 30 s after it
    // started: that bounds how short this test can be.
    let rig = SynapseRig::start_with(&json!({"presence": {"sync_online_timeout": "5s"}}));
    let registry = registry(&rig);
    let alice = rig.register_user("alice", "alice-password", false);
    let bob = rig.register_user("bob", "bob-password", false);
    let (alice_id, bob_id) = (rig.user_id("alice"), rig.user_id("bob"));
    let text = |value: &Value, key: &str| value[key].as_str().expect(key).to_owned();
    let (alice_token, alice_device) = (text(&alice, "access_token"), text(&alice, "device_id"));
    let (bob_token, bob_device) = (text(&bob, "access_token"), text(&bob, "device_id"));

    let worker = smol_node(
        &rig,
        "rustworker",
        session(&rig, "rustworker", &registry),
        None,
    );
    worker.wait_until("ready", |record| record.ready > 0);
    let user_sync = Command::UserSync(UserSync {
        instance_id: InstanceName::from("rustworker"),
        user_id: alice_id.as_str().into(),
        device_id: Some(alice_device.as_str().into()),
        is_syncing: true,
        last_sync_ms: now_ms(),
    });
    let line = String::from_utf8(user_sync.to_bytes().expect("encodes").to_vec()).expect("utf-8");
    eprintln!("publishing: {line}");
    worker
        .with(move |client| client.send(user_sync))
        .expect("USER_SYNC published");
    worker.wait_until("our USER_SYNC echoed by Redis", |record| {
        record
            .commands
            .iter()
            .any(|command| matches!(command, Command::UserSync(sync) if sync.is_syncing))
    });

    // USER_SYNC alone changes no presence: Synapse only records the device
    // as syncing on rustworker.
    thread::sleep(Duration::from_secs(1));
    assert_eq!(presence_of(&rig, &alice_token, &alice_id), json!("offline"));

    // As a worker does when a client syncs, set the state over HTTP: alice
    // (syncing on rustworker) and bob (syncing nowhere) come online.
    presence_set_state(&rig, &alice_id, &alice_device, "online");
    presence_set_state(&rig, &bob_id, &bob_device, "online");
    assert_eq!(presence_of(&rig, &alice_token, &alice_id), json!("online"));
    assert_eq!(presence_of(&rig, &bob_token, &bob_id), json!("online"));
    let online_at = Instant::now();

    // Bob times out; alice, syncing on rustworker, does not.
    let waited = poll_until(
        "bob to time out to offline",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || presence_of(&rig, &bob_token, &bob_id),
        |presence| *presence == json!("offline"),
    );
    eprintln!(
        "bob offline {:.2?} after being set online ({:.2?} after the rig started)",
        waited,
        started.elapsed()
    );
    assert_eq!(
        presence_of(&rig, &alice_token, &alice_id),
        json!("online"),
        "USER_SYNC keeps alice online"
    );
    // One more timeout round: still online.
    thread::sleep(Duration::from_secs(6));
    assert_eq!(presence_of(&rig, &alice_token, &alice_id), json!("online"));
    eprintln!(
        "alice still online {:.2?} after her state was set",
        online_at.elapsed()
    );

    // Shutting down: CLEAR_USER_SYNC, then close (which writes it out).
    worker
        .with(|client| client.send(Command::ClearUserSync(InstanceName::from("rustworker"))))
        .expect("CLEAR_USER_SYNC published");
    let session = worker.close();
    assert_eq!(
        session.counters().published.get(CommandKind::ClearUserSync),
        1
    );
    let waited = poll_until(
        "alice to go offline after CLEAR_USER_SYNC",
        Duration::from_secs(30),
        Duration::from_millis(500),
        || presence_of(&rig, &alice_token, &alice_id),
        |presence| *presence == json!("offline"),
    );
    eprintln!(
        "alice offline {:.2?} after CLEAR_USER_SYNC (sync timeout 5 s, checks every 5 s)",
        waited
    );
    assert!(
        waited >= Duration::from_secs(4),
        "not before the 5 s sync timeout: {waited:?}"
    );
    rig.assert_no_errors_logged();
    eprintln!("whole test {:.2?}", started.elapsed());
}

// ---------------------------------------------------------------------
// 5. A caches invalidation from Rust, applied by Synapse.
// ---------------------------------------------------------------------

#[test]
fn synapse_applies_a_caches_invalidation_from_rust() {
    let started = Instant::now();
    let rig = SynapseRig::start();
    let registry = registry(&rig);
    let root = rig.register_user("root", "root-password", true)["access_token"]
        .as_str()
        .expect("a token")
        .to_owned();
    rig.register("alice", "alice-password");
    let alice_id = rig.user_id("alice");
    let admin_path = format!("/_synapse/admin/v2/users/{}", segment(&alice_id));
    let is_admin = || rig.get(&root, &admin_path)["admin"].clone();

    // The admin API reads `get_user_by_id`, a cached function: change the
    // row behind Synapse's back, and it answers from its cache.
    assert_eq!(is_admin(), json!(false));
    let changed = sqlite_execute(
        &rig,
        &format!("UPDATE users SET admin = 1 WHERE name = '{alice_id}'"),
    );
    assert_eq!(changed, 1);
    assert_eq!(is_admin(), json!(false), "answered from the cache");

    // rustworker announces its caches position (POSITION caches
    // rustworker 0 0 on Ready: Synapse drops caches RDATA of a writer
    // before a POSITION of the stream), then writes the invalidation.
    let mut session = session(&rig, "rustworker", &registry);
    session
        .advance(&StreamName::Caches, Token(0))
        .expect("every process writes caches with Redis");
    let worker = smol_node(&rig, "rustworker", session, None);
    worker.wait_until("our caches POSITION echoed", |record| {
        record.ready > 0
            && record.received.iter().any(|command| {
                matches!(command, Command::Position(p)
                    if p.stream == StreamName::Caches && p.instance.as_str() == "rustworker")
            })
    });
    let row = CachesRow {
        cache_func: "get_user_by_id".to_owned(),
        keys: Some(vec![json!(alice_id)]),
        invalidation_ts: now_ms(),
        extra: Vec::new(),
    }
    .encode()
    .expect("encodes");
    eprintln!("publishing: RDATA caches rustworker 1 {row}");
    worker
        .with(move |client| {
            client
                .session_mut()
                .write(&StreamName::Caches, Token(1), [(Token(1), row)])
        })
        .expect("written");
    worker.wait_until("our RDATA echoed", |record| {
        record.received.iter().any(|command| {
            matches!(command, Command::Rdata(r)
                if r.stream == StreamName::Caches && r.instance.as_str() == "rustworker")
        })
    });

    // Synapse invalidated the entry: it reads the row again.
    let waited = poll_until(
        "Synapse to drop alice from the get_user_by_id cache",
        Duration::from_secs(10),
        Duration::from_millis(100),
        is_admin,
        |admin| *admin == json!(true),
    );
    eprintln!("the invalidation took effect within {waited:.2?}");
    let counters = worker.with(|client| client.session().counters().clone());
    assert_eq!(counters.published.get(CommandKind::Rdata), 1);
    assert_eq!(counters.publish_errors, 0);
    assert!(worker.record().problems.is_empty());
    drop(worker);

    rig.assert_no_errors_logged();
    let log = rig.log_text();
    for suspicious in [
        "Failed to handle",
        "Unhandled",
        "Failed to parse RDATA",
        "Traceback",
    ] {
        assert!(!log.contains(suspicious), "{suspicious} in Synapse's log");
    }
    let mentions: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("rustworker"))
        .collect();
    eprintln!("Synapse's log lines naming rustworker: {mentions:?}");
    eprintln!("whole test {:.2?}", started.elapsed());
}
