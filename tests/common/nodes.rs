//! Processes of a deployment as `RedisClient`s against a real redis-server.
//! [`run_until`] and [`run_for`] poll every client from one task (until a
//! condition holds, or for a while) for any [`Process`]: the Redis client,
//! Sentinel and fault tests each keep their own. [`Node`] is the fault
//! tests' (`tests/faults.rs`, `tests/partitions.rs`, `tests/soak.rs`),
//! with writers' logs that are checked as rows arrive and trimmed once
//! delivered, so that a long run holds no more than what is in flight.
//! One follower per (stream, writer): the first to receive a row trims it.
//!
//! Each writer's rows go to its [`Logs`] as it writes them; a follower's
//! catch-ups are served from them ([`LogSource`]); every row a follower
//! receives must be the next one of the writer's log for its stream (or
//! the test fails on the spot: a row lost, duplicated or out of order), and
//! [`Node::caught_up`] says whether it has received all of them.

use std::collections::{BTreeMap, VecDeque};
use std::future::poll_fn;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;
use synapse_replication::positions::{BoxError, FollowerEvent};

use synapse_replication::config::{RedisConfig, StreamWriters};
use synapse_replication::positions::{
    CatchUpPage, CatchUpRequest, Follower, FollowerLimits, Writer,
};
use synapse_replication::session::{Disconnect, RedisError, RedisEvent, RedisLink, RedisSession};
use synapse_replication::transport::{
    CatchUpSource, RedisClient, RedisClientConfig, Runtime, async_trait,
};
use synapse_replication::wire::{InstanceName, RawRow, StreamName, Token};
use synapse_replication::writers::WriterRegistry;

/// The channel prefix (the deployment's server name).
pub const PREFIX: &str = "test.example";

/// A runtime behind a pointer, so that one test body runs on smol and tokio.
pub type Rt = Arc<dyn Runtime>;

/// Rows per catch-up page (a batch may make a page longer).
const PAGE: usize = 50;

/// One writer's rows of one stream, in order; those every follower has
/// received are trimmed.
#[derive(Debug, Default)]
struct StreamLog {
    rows: VecDeque<(Token, RawRow)>,
    /// Rows trimmed from the front.
    trimmed: u64,
    /// Rows ever written.
    written: u64,
    /// The last token written.
    last: Token,
}

/// Every writer's log, per (stream, writer).
#[derive(Clone, Debug, Default)]
pub struct Logs(Arc<Mutex<BTreeMap<(StreamName, InstanceName), StreamLog>>>);

impl Logs {
    /// Records rows `writer` wrote at `token` of `stream`.
    pub fn append(
        &self,
        stream: &StreamName,
        writer: &InstanceName,
        token: Token,
        rows: &[RawRow],
    ) {
        let mut logs = self.0.lock().expect("logs");
        let log = logs.entry((stream.clone(), writer.clone())).or_default();
        assert!(token > log.last || log.written == 0, "tokens only grow");
        log.rows.extend(rows.iter().map(|row| (token, row.clone())));
        log.written += rows.len() as u64;
        log.last = token;
    }

    /// Rows ever written to `stream` by `writer`.
    pub fn written(&self, stream: &StreamName, writer: &InstanceName) -> u64 {
        let logs = self.0.lock().expect("logs");
        logs.get(&(stream.clone(), writer.clone()))
            .map_or(0, |log| log.written)
    }

    /// Every (stream, writer) written to, with the rows written.
    pub fn all_written(&self) -> Vec<(StreamName, InstanceName, u64)> {
        let logs = self.0.lock().expect("logs");
        logs.iter()
            .map(|((stream, writer), log)| (stream.clone(), writer.clone(), log.written))
            .collect()
    }

    /// Rows held (not yet trimmed), over every log.
    pub fn held(&self) -> usize {
        let logs = self.0.lock().expect("logs");
        logs.values().map(|log| log.rows.len()).sum()
    }

    /// Checks that `rows` at `token` are the next `rows.len()` rows of the
    /// log, from index `next` on. Panics otherwise, saying how.
    fn check(
        &self,
        who: &str,
        stream: &StreamName,
        writer: &InstanceName,
        next: u64,
        token: Token,
        rows: &[RawRow],
    ) {
        let logs = self.0.lock().expect("logs");
        let Some(log) = logs.get(&(stream.clone(), writer.clone())) else {
            panic!("{who}: rows of {stream} from {writer}, which wrote none");
        };
        for (offset, row) in rows.iter().enumerate() {
            let index = next + offset as u64;
            let Some(at) = index.checked_sub(log.trimmed) else {
                panic!("{who}: row {index} of {stream}/{writer} again (duplicated)");
            };
            let Some((want_token, want_row)) = log.rows.get(at as usize) else {
                panic!(
                    "{who}: {stream}/{writer} row {index} at {token}, but only {} were written",
                    log.written
                );
            };
            assert!(
                *want_token == token && want_row == row,
                "{who}: {stream}/{writer} row {index}: got {token} {row:?}, \
                 the writer wrote {want_token} {want_row:?} (lost, duplicated or reordered)"
            );
        }
    }

    /// Drops the rows of `stream`/`writer` below index `delivered` and
    /// below `token` (never part of a token: a batch is served whole),
    /// beyond the last [`KEPT`] delivered: a follower asks again for the
    /// ranges its live rows jumped over, rows delivered among them.
    fn trim(&self, stream: &StreamName, writer: &InstanceName, delivered: u64, token: Token) {
        let mut logs = self.0.lock().expect("logs");
        if let Some(log) = logs.get_mut(&(stream.clone(), writer.clone())) {
            while log.trimmed + KEPT < delivered
                && log.rows.front().is_some_and(|(first, _)| *first < token)
            {
                log.rows.pop_front();
                log.trimmed += 1;
            }
        }
    }
}

/// Delivered rows a log keeps, to answer catch-ups that cover them again.
const KEPT: u64 = 4096;

/// Serves catch-ups from [`Logs`], in pages of about [`PAGE`] rows (so
/// that `limited` pages are exercised), a batch never split.
pub struct LogSource(pub Logs);

#[async_trait]
impl CatchUpSource for LogSource {
    async fn fetch(&self, request: CatchUpRequest) -> Result<CatchUpPage, BoxError> {
        let logs = (self.0).0.lock().expect("logs");
        let mut updates: Vec<(Token, RawRow)> = Vec::new();
        let mut upto = request.to;
        let mut limited = false;
        if let Some(log) = logs.get(&(request.stream.clone(), request.writer.clone())) {
            if log
                .rows
                .front()
                .is_some_and(|(first, _)| *first <= request.from)
                || log.trimmed == 0
            {
                let start = log
                    .rows
                    .partition_point(|(token, _)| *token <= request.from);
                for (token, row) in log.rows.iter().skip(start) {
                    if *token > request.to {
                        break;
                    }
                    if updates.len() >= PAGE
                        && updates.last().is_some_and(|(last, _)| last != token)
                    {
                        upto = updates.last().map_or(request.to, |(last, _)| *last);
                        limited = true;
                        break;
                    }
                    updates.push((*token, row.clone()));
                }
            } else {
                // Trimmed rows are delivered rows, and more than a
                // follower keeps holes for.
                let first = log.rows.front().map(|(token, _)| *token);
                return Err(format!("{request}: rows before {first:?} were trimmed").into());
            }
        }
        Ok(CatchUpPage {
            updates,
            upto,
            limited,
        })
    }
}

/// Per (stream, writer): rows a follower received so far.
#[derive(Clone, Copy, Debug, Default)]
struct Cursor {
    next: u64,
    token: Token,
}

/// One process: a client and what it has seen.
pub struct Node {
    /// Its instance name.
    pub name: &'static str,
    /// Its client.
    pub client: RedisClient<Rt>,
    logs: Logs,
    cursors: BTreeMap<(StreamName, InstanceName), Cursor>,
    /// Rows received, live and caught up.
    pub rows: u64,
    /// `Ready` events.
    pub ready: usize,
    /// `Connected` events.
    pub connected: usize,
    /// `ConnectFailed` events: the link and the delay before the retry.
    pub connect_failed: Vec<(RedisLink, Duration)>,
    /// `Disconnected` events: the link, why, and the delay.
    pub disconnects: Vec<(RedisLink, String, Duration)>,
    /// Connections the session gave up.
    pub closing: Vec<RedisError>,
    /// `Malformed` events.
    pub malformed: u64,
    /// `CatchUpFailed` events.
    pub catch_up_failures: u64,
    /// `Started` and `Reset` events (none expected: every position is
    /// seeded, no writer restarts).
    pub surprises: Vec<String>,
    /// Every event, as `Display`ed, when `keep_events` is set.
    pub events: Vec<String>,
    /// Rows delivered that a test forged (their JSON starts `["forged"`):
    /// Redis authenticates no publisher, so forged rows may reach the
    /// application; they are counted here, apart from the writers' rows.
    pub forged_rows: u64,
    /// Whether to keep every event in `events`.
    pub keep_events: bool,
}

impl Node {
    /// A process `name` on Redis at `config`, following every stream with
    /// catch-ups from `logs`, with the client options `client`; `tune`
    /// adjusts the session's options.
    pub fn new(
        name: &'static str,
        runtime: Rt,
        config: RedisConfig,
        logs: &Logs,
        client: RedisClientConfig,
        tune: impl FnOnce(&mut synapse_replication::session::RedisSessionConfig),
    ) -> Node {
        let registry = Arc::new(StreamWriters::default().with_redis(true));
        Node::with_registry(name, runtime, config, logs, client, registry, tune)
    }

    /// [`Node::new`] with the deployment's `stream_writers` given
    /// (`registry`) rather than Synapse's defaults.
    pub fn with_registry(
        name: &'static str,
        runtime: Rt,
        config: RedisConfig,
        logs: &Logs,
        client: RedisClientConfig,
        registry: Arc<dyn WriterRegistry>,
        tune: impl FnOnce(&mut synapse_replication::session::RedisSessionConfig),
    ) -> Node {
        let limits = FollowerLimits::default();
        Node::with_limits(name, runtime, config, logs, client, registry, limits, tune)
    }

    /// [`Node::with_registry`] with the follower's limits given.
    #[allow(clippy::too_many_arguments)]
    pub fn with_limits(
        name: &'static str,
        runtime: Rt,
        config: RedisConfig,
        logs: &Logs,
        client: RedisClientConfig,
        registry: Arc<dyn WriterRegistry>,
        limits: FollowerLimits,
        tune: impl FnOnce(&mut synapse_replication::session::RedisSessionConfig),
    ) -> Node {
        let me = InstanceName::from(name);
        let mut options = config.session_config(PREFIX);
        options.client_name = Some(name.to_owned());
        tune(&mut options);
        let session = RedisSession::new(
            options,
            Follower::with_limits(me.clone(), registry.clone(), limits),
            Writer::new(me, registry),
        );
        let client = RedisClient::with_config(runtime, config, session, client)
            .with_catch_up(Arc::new(LogSource(logs.clone())));
        Node {
            name,
            client,
            logs: logs.clone(),
            cursors: BTreeMap::new(),
            rows: 0,
            ready: 0,
            connected: 0,
            connect_failed: Vec::new(),
            disconnects: Vec::new(),
            closing: Vec::new(),
            malformed: 0,
            catch_up_failures: 0,
            surprises: Vec::new(),
            events: Vec::new(),
            forged_rows: 0,
            keep_events: false,
        }
    }

    /// Follows `writer` on `stream` from its first row (a follower that
    /// knows where it stands, as Synapse's workers read it from their
    /// database).
    pub fn follow_from_start(&mut self, stream: &StreamName, writer: &InstanceName) {
        self.client
            .set_position(stream, writer, Token(0))
            .expect("a position to start from");
        self.cursors
            .insert((stream.clone(), writer.clone()), Cursor::default());
    }

    /// Writes `rows` at `token` of `stream` (recorded in the logs first).
    pub fn write(&mut self, stream: &StreamName, token: Token, rows: Vec<RawRow>) {
        self.logs
            .append(stream, &InstanceName::from(self.name), token, &rows);
        self.client
            .write(stream, token, rows.into_iter().map(|row| (token, row)))
            .unwrap_or_else(|error| panic!("{} writes {stream}: {error}", self.name));
    }

    /// Rows of `stream` from `writer` received so far.
    pub fn received(&self, stream: &StreamName, writer: &InstanceName) -> u64 {
        self.cursors
            .get(&(stream.clone(), writer.clone()))
            .map_or(0, |cursor| cursor.next)
    }

    /// Whether this node received every row `writer` wrote to `stream`.
    pub fn caught_up(&self, stream: &StreamName, writer: &InstanceName) -> bool {
        self.received(stream, writer) == self.logs.written(stream, writer)
    }
}

impl Process for Node {
    fn client(&mut self) -> &mut RedisClient<Rt> {
        &mut self.client
    }

    fn record(&mut self, event: RedisEvent) {
        if std::env::var_os("REDIS_TEST_TRACE").is_some() {
            eprintln!("{}: {event}", self.name);
        }
        if self.keep_events {
            self.events.push(event.to_string());
        }
        match event {
            RedisEvent::Ready => self.ready += 1,
            RedisEvent::Follower(FollowerEvent::Rows {
                stream,
                writer,
                token,
                rows,
                ..
            }) => {
                let rows: Vec<RawRow> = rows.into_iter().collect();
                if rows
                    .iter()
                    .all(|row| row.as_str().starts_with(r#"["forged""#))
                {
                    self.forged_rows += rows.len() as u64;
                    return;
                }
                let key = (stream, writer);
                let cursor = self.cursors.entry(key.clone()).or_default();
                self.logs
                    .check(self.name, &key.0, &key.1, cursor.next, token, &rows);
                cursor.next += rows.len() as u64;
                cursor.token = token;
                self.rows += rows.len() as u64;
                let (next, token) = (cursor.next, cursor.token);
                self.logs.trim(&key.0, &key.1, next, token);
            }
            RedisEvent::Connected { .. } => self.connected += 1,
            RedisEvent::ConnectFailed { link, retry_in, .. } => {
                self.connect_failed.push((link, retry_in))
            }
            RedisEvent::Disconnected {
                link,
                reason,
                retry_in,
            } => {
                if let Disconnect::Redis(error) = &reason {
                    self.closing.push(error.clone());
                }
                self.disconnects.push((link, reason.to_string(), retry_in));
            }
            RedisEvent::Malformed { .. } => self.malformed += 1,
            RedisEvent::CatchUpFailed { .. } => self.catch_up_failures += 1,
            event @ (RedisEvent::Follower(FollowerEvent::Started { .. })
            | RedisEvent::Follower(FollowerEvent::Reset { .. })) => {
                self.surprises.push(event.to_string())
            }
            _ => {}
        }
    }

    fn summary(&self) -> String {
        let session = self.client.session();
        format!(
            "{}: ready {} rows {} cursors {:?} disconnects {:?} closing {:?} \
             surprises {:?}\n  {:?}\n  {:?}\n  {:?}",
            self.name,
            self.ready,
            self.rows,
            self.cursors,
            self.disconnects.iter().rev().take(5).collect::<Vec<_>>(),
            self.closing.iter().rev().take(5).collect::<Vec<_>>(),
            self.surprises,
            session.counters(),
            session.writer().counters(),
            session.follower().counters(),
        )
    }
}

/// A process of a test: its client, what it keeps of the client's events,
/// and a summary to print when a test times out. [`run_until`],
/// [`run_for`] and [`poll_nodes`] drive any set of them.
pub trait Process {
    /// Its client.
    fn client(&mut self) -> &mut RedisClient<Rt>;
    /// Handles one event of the client.
    fn record(&mut self, event: RedisEvent);
    /// What it has seen, for a timeout's panic message.
    fn summary(&self) -> String;
}

/// Polls every node once, recording what they report; whether anything
/// came.
pub fn poll_nodes<P: Process>(nodes: &mut [&mut P], cx: &mut std::task::Context<'_>) -> bool {
    let mut progress = false;
    for node in nodes.iter_mut() {
        while let Poll::Ready(Some(event)) = node.client().poll_next_event(cx) {
            node.record(event);
            progress = true;
        }
    }
    progress
}

/// Polls every node of `nodes` until `done` holds; panics after `patience`
/// (a deadline that only stops a test that would hang).
pub async fn run_until<P: Process>(
    runtime: &Rt,
    nodes: &mut [&mut P],
    what: &str,
    patience: Duration,
    mut done: impl FnMut(&[&mut P]) -> bool,
) {
    let mut give_up = runtime.sleep_until(runtime.now() + patience);
    poll_fn(|cx| {
        loop {
            let progress = poll_nodes(nodes, cx);
            if done(nodes) {
                return Poll::Ready(());
            }
            if !progress {
                break;
            }
        }
        if give_up.as_mut().poll(cx).is_ready() {
            let state: Vec<String> = nodes.iter().map(|node| node.summary()).collect();
            panic!("timed out waiting for {what}:\n{}", state.join("\n"));
        }
        Poll::Pending
    })
    .await;
}

/// Polls the nodes for `duration` (traffic flows, no condition).
pub async fn run_for<P: Process>(runtime: &Rt, nodes: &mut [&mut P], duration: Duration) {
    let mut sleep = runtime.sleep_until(runtime.now() + duration);
    poll_fn(|cx| {
        poll_nodes(nodes, cx);
        sleep.as_mut().poll(cx)
    })
    .await;
}

/// A row of `stream`, about `pad` bytes longer than a bare one.
pub fn row(stream: &StreamName, n: u64, part: usize, pad: usize) -> RawRow {
    let pad = "x".repeat(pad);
    let json = match stream {
        StreamName::Events => format!(
            r#"["ev",["$event{n}_{part}","!room:test.example","m.room.message","{pad}",null,null]]"#
        ),
        _ => format!(r#"["{stream}",{n},{part},"{pad}"]"#),
    };
    RawRow::new(bytes::Bytes::from(json)).expect("a valid row")
}

// --- A writer of `events` and its follower ---------------------------------

/// Stops a wait that would hang; never reached when things work.
const PAIR_PATIENCE: Duration = Duration::from_secs(60);

/// `master` writing `events` (announced at 0), or (any other `name`) a
/// process following master's `events` from the start; with `options` and
/// the session options `tune` makes.
pub fn events_node(
    name: &'static str,
    runtime: &Rt,
    config: &RedisConfig,
    logs: &Logs,
    options: RedisClientConfig,
    tune: impl FnOnce(&mut synapse_replication::session::RedisSessionConfig),
) -> Node {
    let mut node = Node::new(name, runtime.clone(), config.clone(), logs, options, tune);
    if name == "master" {
        node.client
            .advance(&StreamName::Events, Token(0))
            .expect("master writes events");
    } else {
        node.follow_from_start(&StreamName::Events, &InstanceName::master());
    }
    node
}

/// Tokens `from..=to` of `events` on `writer`: every third a batch of
/// three rows.
pub fn write_events(writer: &mut Node, from: u64, to: u64) {
    for n in from..=to {
        let parts = if n.is_multiple_of(3) { 3 } else { 1 };
        let rows = (0..parts)
            .map(|part| row(&StreamName::Events, n, part, 0))
            .collect();
        writer.write(&StreamName::Events, Token(n as i64), rows);
    }
}

/// Until both are ready and `worker` follows `writer`'s `events` live.
pub async fn both_ready_and_following(runtime: &Rt, writer: &mut Node, worker: &mut Node) {
    run_until(
        runtime,
        &mut [&mut *writer, &mut *worker],
        "both ready, the writer followed",
        PAIR_PATIENCE,
        |nodes| {
            nodes.iter().all(|node| node.ready > 0)
                && nodes[1]
                    .client
                    .follower()
                    .is_writer_connected(&StreamName::Events, &InstanceName::master())
        },
    )
    .await;
}

/// Until `worker` holds every row of `writer`'s `events` log.
pub async fn caught_up(runtime: &Rt, writer: &mut Node, worker: &mut Node, what: &str) {
    run_until(
        runtime,
        &mut [&mut *writer, &mut *worker],
        what,
        PAIR_PATIENCE,
        |nodes| nodes[1].caught_up(&StreamName::Events, &InstanceName::master()),
    )
    .await;
}
