//! The Redis transport against a real redis-server, on smol and on tokio:
//! a writer and followers as `RedisClient`s, through restarts, kills,
//! pauses, killed connections, a slow consumer cut off by Redis, catch-up
//! sources that fail, and credentials right and wrong.
//!
//! Each test starts its own redis-server on a free loopback port (never
//! 6379) through `common::redis_server`. Every client runs in the test's
//! one task: `Hub::run_until` polls them all until a condition holds (or a
//! generous deadline passes, which fails the test). Nothing here measures
//! time; deadlines only stop a test that would otherwise hang.

#![cfg(all(feature = "runtime-smol", feature = "runtime-tokio"))]

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use synapse_replication::config::{RedisConfig, StreamWriters};

use bytes::Bytes;
use common::nodes::{Process, run_for, run_until};
use common::redis_server::RedisServer;
use synapse_replication::positions::{
    BoxError, CatchUpId, CatchUpPage, CatchUpRequest, Follower, FollowerEvent, History,
    STUCK_AFTER_FAILURES, StuckCatchUp, WriteError, Writer,
};
use synapse_replication::session::{Disconnect, RedisError, RedisEvent, RedisLink, RedisSession};
use synapse_replication::transport::{
    BoxFuture, CatchUpSource, RedisClient, RedisClientConfig, Runtime, SmolRuntime, TokioRuntime,
    async_trait,
};
use synapse_replication::wire::{Command, InstanceName, RawRow, StreamName, Token};

const PREFIX: &str = "test.example";
/// Stops a test that would hang; never reached when things work.
const PATIENCE: Duration = Duration::from_secs(30);

type Rt = Arc<dyn Runtime>;
type Log = Arc<Mutex<Vec<(Token, RawRow)>>>;

/// Runs `scenario` on smol, then on tokio.
fn on_both_runtimes(scenario: impl Fn(Rt) -> BoxFuture<'static, ()>) {
    smol::block_on(scenario(Arc::new(SmolRuntime)));
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let runtime: Rt = Arc::new(TokioRuntime::new(tokio.handle().clone()));
    tokio.block_on(scenario(runtime));
}

fn fast_options() -> RedisClientConfig {
    let mut options = RedisClientConfig::default();
    options.initial_backoff = Duration::from_millis(20);
    options.catch_up_backoff = Duration::from_millis(20);
    options
}

/// Rows per catch-up page (a batch may make a page longer).
const PAGE: usize = 50;

/// Serves catch-ups from the writer's log, in pages of about [`PAGE`] rows,
/// so that `limited` pages are exercised.
struct LogSource(Log);

#[async_trait]
impl CatchUpSource for LogSource {
    async fn fetch(&self, request: CatchUpRequest) -> Result<CatchUpPage, BoxError> {
        let log = self.0.lock().expect("log");
        let mut updates: Vec<(Token, RawRow)> = Vec::new();
        let mut upto = request.to;
        let mut limited = false;
        let start = log.partition_point(|(token, _)| *token <= request.from);
        for (token, row) in log.iter().skip(start) {
            if *token > request.to {
                break;
            }
            // Never split a batch across pages.
            if updates.len() >= PAGE && updates.last().is_some_and(|(last, _)| last != token) {
                upto = updates.last().map_or(request.to, |(last, _)| *last);
                limited = true;
                break;
            }
            updates.push((*token, row.clone()));
        }
        Ok(CatchUpPage {
            updates,
            upto,
            limited,
        })
    }
}

/// One process: a client and what it has seen.
struct Node {
    name: &'static str,
    client: RedisClient<Rt>,
    /// Rows delivered by the follower, per stream.
    rows: BTreeMap<StreamName, Vec<(Token, RawRow)>>,
    ready: usize,
    disconnects: Vec<(RedisLink, String)>,
    closing: Vec<RedisError>,
    publish_failures: Vec<(String, String)>,
    retry_delays: Vec<Duration>,
    commands: Vec<Command>,
    /// Per failed catch-up: the writer, failures in a row, the delay
    /// before the retry.
    catch_up_failures: Vec<(InstanceName, u32, Duration)>,
    stuck: Vec<StuckCatchUp>,
    write_failures: Vec<WriteError>,
}

impl Node {
    fn new(
        name: &'static str,
        runtime: Rt,
        config: RedisConfig,
        log: Option<Log>,
        tune: impl FnOnce(&mut synapse_replication::session::RedisSessionConfig),
    ) -> Node {
        Node::with_client_options(name, runtime, config, log, tune, fast_options())
    }

    fn with_client_options(
        name: &'static str,
        runtime: Rt,
        config: RedisConfig,
        log: Option<Log>,
        tune: impl FnOnce(&mut synapse_replication::session::RedisSessionConfig),
        client_options: RedisClientConfig,
    ) -> Node {
        let registry = Arc::new(StreamWriters::default().with_redis(true));
        let me = InstanceName::from(name);
        let mut options = config.session_config(PREFIX);
        options.client_name = Some(name.to_owned());
        tune(&mut options);
        let session = RedisSession::new(
            options,
            Follower::new(me.clone(), registry.clone()),
            Writer::new(me, registry),
        );
        let mut client = RedisClient::with_config(runtime, config, session, client_options);
        if let Some(log) = log {
            // A follower knows where it stands (Synapse's workers read it
            // from the database): from the writer's first row on. Without
            // it, a follower that subscribes late takes the first POSITION
            // it hears as its start.
            client
                .session_mut()
                .follower_mut()
                .set_position(&StreamName::Events, &InstanceName::master(), Token(0))
                .expect("a position to start from");
            client = client.with_catch_up(Arc::new(LogSource(log)));
        }
        Node {
            name,
            client,
            rows: BTreeMap::new(),
            ready: 0,
            disconnects: Vec::new(),
            closing: Vec::new(),
            publish_failures: Vec::new(),
            retry_delays: Vec::new(),
            commands: Vec::new(),
            catch_up_failures: Vec::new(),
            stuck: Vec::new(),
            write_failures: Vec::new(),
        }
    }

    fn held(&self, stream: &StreamName) -> Vec<(Token, RawRow)> {
        self.rows.get(stream).cloned().unwrap_or_default()
    }
}

impl Process for Node {
    fn client(&mut self) -> &mut RedisClient<Rt> {
        &mut self.client
    }

    fn record(&mut self, event: RedisEvent) {
        if std::env::var_os("REDIS_TEST_TRACE").is_some() {
            eprintln!("{}: {event:?}", self.name);
        }
        match event {
            RedisEvent::Ready => self.ready += 1,
            RedisEvent::Follower(FollowerEvent::Rows {
                stream,
                token,
                rows,
                ..
            }) => {
                let held = self.rows.entry(stream).or_default();
                held.extend(rows.into_iter().map(|row| (token, row)));
            }
            RedisEvent::WriteFailed { error } => self.write_failures.push(error),
            RedisEvent::PublishFailed { command, error } => self
                .publish_failures
                .push((command.to_string(), error.code.clone())),
            RedisEvent::Command(command) => self.commands.push(command),
            RedisEvent::Disconnected {
                link,
                reason,
                retry_in,
            } => {
                if let Disconnect::Redis(error) = &reason {
                    self.closing.push(error.clone());
                }
                self.retry_delays.push(retry_in);
                self.disconnects.push((link, reason.to_string()));
            }
            RedisEvent::ConnectFailed { retry_in, .. } => self.retry_delays.push(retry_in),
            RedisEvent::CatchUpFailed {
                request,
                failures,
                retry_in,
                ..
            } => {
                self.catch_up_failures
                    .push((request.writer, failures, retry_in));
            }
            RedisEvent::CatchUpStuck(stuck) => self.stuck.push(stuck),
            _ => {}
        }
    }

    fn summary(&self) -> String {
        let session = self.client.session();
        format!(
            "{}: ready {} disconnects {:?} closing {:?} rows {:?}\n{:?}\n{:?}\n{:?}",
            self.name,
            self.ready,
            self.disconnects,
            self.closing,
            self.rows
                .iter()
                .map(|(s, r)| (s, r.len()))
                .collect::<Vec<_>>(),
            session.counters(),
            session.writer().counters(),
            session.follower().counters(),
        )
    }
}

/// A row with `pad` more bytes in its state key.
fn padded_row(n: i64, part: usize, pad: usize) -> RawRow {
    let pad = "x".repeat(pad);
    let json = format!(
        r#"["ev",["$event{n}_{part}","!room:test.example","m.room.message","{pad}",null,null]]"#
    );
    RawRow::new(Bytes::from(json)).expect("a valid row")
}

/// The writer writes tokens `from..=to` of `events`, every third token a
/// batch of three rows, and records them in `log`.
fn write_rows(writer: &mut Node, log: &Log, from: i64, to: i64) {
    write_padded_rows(writer, log, from, to, 0);
}

fn write_padded_rows(writer: &mut Node, log: &Log, from: i64, to: i64, pad: usize) {
    for n in from..=to {
        let token = Token(n);
        let parts = if n % 3 == 0 { 3 } else { 1 };
        let rows: Vec<(Token, RawRow)> = (0..parts)
            .map(|part| (token, padded_row(n, part, pad)))
            .collect();
        log.lock().expect("log").extend(rows.iter().cloned());
        writer
            .client
            .session_mut()
            .write(&StreamName::Events, token, rows)
            .expect("master writes events");
    }
}

fn caught_up(node: &Node, log: &Log) -> bool {
    node.held(&StreamName::Events) == *log.lock().expect("log")
}

fn assert_holds_log(node: &Node, log: &Log) {
    let log = log.lock().expect("log");
    let held = node.held(&StreamName::Events);
    assert_eq!(
        held.len(),
        log.len(),
        "{} holds {} rows, the writer wrote {}",
        node.name,
        held.len(),
        log.len()
    );
    assert!(
        held == *log,
        "{} holds other rows than the writer's",
        node.name
    );
}

/// A writer (`master`) and a follower (`worker1`) on `server`, both ready,
/// the writer's `events` stream started at token 0.
async fn pair(runtime: &Rt, server: &RedisServer, log: &Log) -> (Node, Node) {
    pair_with(runtime, server, log, fast_options()).await
}

async fn pair_with(
    runtime: &Rt,
    server: &RedisServer,
    log: &Log,
    options: RedisClientConfig,
) -> (Node, Node) {
    let config = RedisConfig::tcp("127.0.0.1", server.port());
    let mut master = Node::with_client_options(
        "master",
        runtime.clone(),
        config.clone(),
        None,
        |_| {},
        options.clone(),
    );
    master
        .client
        .session_mut()
        .advance(&StreamName::Events, Token(0))
        .expect("master writes events");
    let mut worker = Node::with_client_options(
        "worker1",
        runtime.clone(),
        config,
        Some(log.clone()),
        |_| {},
        options,
    );
    run_until(
        runtime,
        &mut [&mut master, &mut worker],
        "both ready",
        PATIENCE,
        |nodes| nodes.iter().all(|node| node.ready > 0),
    )
    .await;
    // The worker knows the writer's position once it has its POSITION.
    run_until(
        runtime,
        &mut [&mut master, &mut worker],
        "the writer followed live",
        PATIENCE,
        |nodes| {
            nodes[1]
                .client
                .session()
                .follower()
                .is_writer_connected(&StreamName::Events, &InstanceName::master())
        },
    )
    .await;
    (master, worker)
}

#[test]
fn follower_receives_everything_in_order_with_batches_intact() {
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let server = RedisServer::start();
            let log: Log = Log::default();
            let (mut master, mut worker) = pair(&runtime, &server, &log).await;
            write_rows(&mut master, &log, 1, 300);
            run_until(
                &runtime,
                &mut [&mut master, &mut worker],
                "all rows",
                PATIENCE,
                |nodes| caught_up(nodes[1], &log),
            )
            .await;
            assert_holds_log(&worker, &log);
            // Live, not through catch-ups: nothing was missed. (A REPLICATE
            // still in flight when the writing starts makes the follower
            // check the writer's first row by a catch-up; nothing else may.)
            assert!(worker.disconnects.is_empty());
            let counters = worker.client.session().follower().counters();
            assert_eq!(
                counters.catch_ups_requested, counters.unproven_checked,
                "{counters:?}"
            );
            assert!(counters.catch_ups_requested <= 1, "{counters:?}");
            assert!(counters.rdata_applied >= 299, "{counters:?}");
        })
    });
}

/// Rows written from another task through the client's sender are
/// published and kept in the writer's history, in one act: the follower
/// holds exactly them, and the history answers a catch-up with them. A
/// write the writer refuses is reported, and neither sent nor kept.
#[test]
fn rows_written_through_the_sender_are_published_and_kept_for_catch_up() {
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let server = RedisServer::start();
            let log: Log = Log::default();
            let (mut master, mut worker) = pair(&runtime, &server, &log).await;
            let history = Arc::new(Mutex::new(History::new(1000)));
            master.client = master.client.with_history(history.clone());
            let rows: Vec<(Token, RawRow)> =
                (1..=50).map(|n| (Token(n), padded_row(n, 0, 0))).collect();
            log.lock().expect("log").extend(rows.iter().cloned());
            let sender = master.client.sender();
            std::thread::spawn(move || {
                for (token, row) in rows {
                    sender
                        .write(&StreamName::Events, token, [(token, row)])
                        .expect("queued");
                }
                // Not above the last token written: refused when taken.
                sender
                    .write(
                        &StreamName::Events,
                        Token(3),
                        [(Token(3), padded_row(3, 9, 0))],
                    )
                    .expect("queued");
            })
            .join()
            .expect("the writing thread");
            run_until(
                &runtime,
                &mut [&mut master, &mut worker],
                "the rows, and the refusal",
                PATIENCE,
                |nodes| caught_up(nodes[1], &log) && !nodes[0].write_failures.is_empty(),
            )
            .await;
            assert_holds_log(&worker, &log);
            assert!(
                matches!(
                    master.write_failures[..],
                    [WriteError::TokenNotAbove {
                        token: Token(3),
                        last: Token(50),
                        ..
                    }]
                ),
                "{:?}",
                master.write_failures
            );
            let request = CatchUpRequest {
                id: CatchUpId::new(1),
                stream: StreamName::Events,
                writer: InstanceName::master(),
                from: Token(0),
                to: Token(60),
            };
            let page = history
                .lock()
                .expect("history")
                .answer(&request, 1000)
                .expect("an answer");
            assert_eq!(page.updates, *log.lock().expect("log"));
            assert_eq!(page.upto, Token(50), "no more than was written");
        })
    });
}

/// MONITOR on its own connection: the commands Redis executes, in order.
struct Monitor {
    lines: Arc<Mutex<Vec<String>>>,
}

impl Monitor {
    /// Connects (retrying every millisecond, so that it can be started
    /// before the server, and be its first client) and sends MONITOR.
    fn start(port: u16) -> Monitor {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + PATIENCE;
            let mut stream = loop {
                match TcpStream::connect(("127.0.0.1", port)) {
                    Ok(stream) => break stream,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(1))
                    }
                    Err(error) => panic!("MONITOR cannot connect: {error}"),
                }
            };
            stream.write_all(b"MONITOR\r\n").expect("MONITOR");
            let reader = BufReader::new(stream);
            for line in reader.lines() {
                let Ok(line) = line else { break };
                sink.lock().expect("lines").push(line);
            }
        });
        Monitor { lines }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lines").clone()
    }
}

/// The client address of a MONITOR line (`+ts [db addr] "CMD" ...`).
fn monitor_addr(line: &str) -> Option<&str> {
    let start = line.find('[')?;
    let end = line[start..].find(']')? + start;
    line[start + 1..end].split(' ').nth(1)
}

/// After a restart, what `name` publishes must be: REPLICATE, then its
/// POSITIONs, and the REPLICATE only after its SUBSCRIBE ran. Checked on
/// the last connection of each of its links that MONITOR saw; `false` if
/// MONITOR attached too late to see them (a client can reconnect before
/// it), and no verdict is possible.
fn reconnect_order(lines: &[String], name: &str) -> bool {
    let addr_named = |suffix: &str| {
        let setname = format!("\"CLIENT\" \"SETNAME\" \"{name}-{suffix}\"");
        lines
            .iter()
            .rev()
            .find(|line| line.contains(&setname))
            .and_then(|line| monitor_addr(line))
            .map(str::to_owned)
    };
    let (Some(sub), Some(publisher)) = (addr_named("sub"), addr_named("pub")) else {
        return false;
    };
    let subscribe = lines
        .iter()
        .position(|line| monitor_addr(line) == Some(&sub) && line.contains("\"SUBSCRIBE\""))
        .unwrap_or_else(|| panic!("{name}: no SUBSCRIBE in {lines:#?}"));
    let published: Vec<(usize, &String)> = lines
        .iter()
        .enumerate()
        .filter(|(_, line)| monitor_addr(line) == Some(&publisher) && line.contains("\"PUBLISH\""))
        .collect();
    let (first, line) = published
        .first()
        .unwrap_or_else(|| panic!("{name} published nothing: {lines:#?}"));
    assert!(
        line.contains("\"REPLICATE \""),
        "{name} published first: {line}"
    );
    assert!(subscribe < *first, "REPLICATE before SUBSCRIBE: {lines:#?}");
    if name == "master" {
        let second = published.get(1).map(|(_, line)| line.as_str());
        assert!(
            second.is_some_and(|line| line.contains("\"POSITION ")),
            "{name}'s positions follow its REPLICATE: {second:?}"
        );
    }
    true
}

/// Whether MONITOR has seen all it needs for a verdict: master's
/// POSITIONs, and something published on the last publishing connection
/// of every process it saw connect one.
fn monitor_settled(lines: &[String]) -> bool {
    let positions = lines
        .iter()
        .any(|line| line.contains("\"POSITION events master"));
    positions
        && ["worker1", "master"].into_iter().all(|name| {
            let setname = format!("\"CLIENT\" \"SETNAME\" \"{name}-pub\"");
            let Some(last) = lines.iter().rposition(|line| line.contains(&setname)) else {
                return true;
            };
            let addr = monitor_addr(&lines[last]);
            lines[last..]
                .iter()
                .any(|line| monitor_addr(line) == addr && line.contains("\"PUBLISH\""))
        })
}

/// Keeps the processes running (a process may not have published yet
/// when the test's condition held) until MONITOR has seen what it needs,
/// or a few seconds passed; then checks the order for every process it
/// saw connect. At least one must have been seen.
async fn assert_reconnect_order(runtime: &Rt, nodes: &mut [&mut Node], monitor: &Monitor) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !monitor_settled(&monitor.lines()) && Instant::now() < deadline {
        run_for(runtime, nodes, Duration::from_millis(20)).await;
    }
    let lines = monitor.lines();
    let seen: Vec<bool> = ["worker1", "master"]
        .into_iter()
        .map(|name| reconnect_order(&lines, name))
        .collect();
    assert!(
        seen.contains(&true),
        "MONITOR saw neither process reconnect: {lines:#?}"
    );
}

async fn restart_scenario(runtime: Rt, kill: bool) {
    let mut server = RedisServer::start();
    let log: Log = Log::default();
    // Retries at least 150 ms apart, so that MONITOR (which retries every
    // millisecond) usually attaches to the restarted server first.
    let mut options = fast_options();
    options.initial_backoff = Duration::from_millis(300);
    let (mut master, mut worker) = pair_with(&runtime, &server, &log, options).await;
    write_rows(&mut master, &log, 1, 50);
    run_until(
        &runtime,
        &mut [&mut master, &mut worker],
        "first rows",
        PATIENCE,
        |nodes| caught_up(nodes[1], &log),
    )
    .await;

    if kill {
        server.kill9();
    } else {
        server.stop();
    }
    // The master goes on writing while Redis is away: those rows are not
    // published (there is nothing to publish to).
    write_rows(&mut master, &log, 51, 80);
    run_for(
        &runtime,
        &mut [&mut master, &mut worker],
        Duration::from_millis(300),
    )
    .await;
    let ready_before = (master.ready, worker.ready);
    let monitor = Monitor::start(server.port());
    server.restart();
    run_until(
        &runtime,
        &mut [&mut master, &mut worker],
        "ready again",
        PATIENCE,
        |nodes| nodes[0].ready > ready_before.0 && nodes[1].ready > ready_before.1,
    )
    .await;
    write_rows(&mut master, &log, 81, 120);
    run_until(
        &runtime,
        &mut [&mut master, &mut worker],
        "caught up",
        PATIENCE,
        |nodes| caught_up(nodes[1], &log),
    )
    .await;
    assert_holds_log(&worker, &log);
    assert!(
        worker
            .disconnects
            .iter()
            .any(|(link, _)| *link == RedisLink::Subscriber),
        "{:?}",
        worker.disconnects
    );
    assert!(
        worker
            .client
            .session()
            .follower()
            .counters()
            .catch_ups_requested
            > 0,
        "the rows written while Redis was away came through a catch-up"
    );
    // Never more than the 5 s cap between attempts.
    for delay in master.retry_delays.iter().chain(&worker.retry_delays) {
        assert!(*delay <= Duration::from_secs(5), "{delay:?}");
    }
    assert_reconnect_order(&runtime, &mut [&mut master, &mut worker], &monitor).await;
}

#[test]
fn redis_restarted_cleanly_mid_stream() {
    on_both_runtimes(|runtime| Box::pin(restart_scenario(runtime, false)));
}

#[test]
fn redis_killed_mid_stream() {
    on_both_runtimes(|runtime| Box::pin(restart_scenario(runtime, true)));
}

#[test]
fn paused_redis_is_noticed_and_reconnected() {
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let server = RedisServer::start();
            let log: Log = Log::default();
            let config = RedisConfig::tcp("127.0.0.1", server.port());
            let tune = |options: &mut synapse_replication::session::RedisSessionConfig| {
                options.ping_interval = Duration::from_millis(200);
                options.ping_timeout = Duration::from_millis(600);
            };
            let mut master = Node::new("master", runtime.clone(), config.clone(), None, tune);
            master
                .client
                .session_mut()
                .advance(&StreamName::Events, Token(0))
                .expect("writes events");
            let mut worker = Node::new("worker1", runtime.clone(), config, Some(log.clone()), tune);
            run_until(
                &runtime,
                &mut [&mut master, &mut worker],
                "ready",
                PATIENCE,
                |nodes| nodes.iter().all(|node| node.ready > 0),
            )
            .await;

            server.stop_signal();
            run_until(
                &runtime,
                &mut [&mut master, &mut worker],
                "timeouts",
                PATIENCE,
                |nodes| {
                    nodes.iter().all(|node| {
                        node.closing
                            .iter()
                            .any(|error| matches!(error, RedisError::Timeout(_)))
                    })
                },
            )
            .await;
            write_rows(&mut master, &log, 1, 20);
            server.cont_signal();
            let before = (master.ready, worker.ready);
            run_until(
                &runtime,
                &mut [&mut master, &mut worker],
                "ready again",
                PATIENCE,
                |nodes| nodes[0].ready > before.0 && nodes[1].ready > before.1,
            )
            .await;
            write_rows(&mut master, &log, 21, 40);
            run_until(
                &runtime,
                &mut [&mut master, &mut worker],
                "caught up",
                PATIENCE,
                |nodes| caught_up(nodes[1], &log),
            )
            .await;
            assert_holds_log(&worker, &log);
        })
    });
}

#[test]
fn killed_connections_are_each_noticed_and_restored() {
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let server = RedisServer::start();
            let log: Log = Log::default();
            let (mut master, mut worker) = pair(&runtime, &server, &log).await;

            // The subscribers first.
            let killed = server.command(&["CLIENT", "KILL", "TYPE", "pubsub"]);
            assert_eq!(killed.as_integer(), Some(2), "{killed:?}");
            run_until(
                &runtime,
                &mut [&mut master, &mut worker],
                "ready again",
                PATIENCE,
                |nodes| nodes.iter().all(|node| node.ready > 1),
            )
            .await;
            for node in [&master, &worker] {
                assert_eq!(
                    node.disconnects
                        .iter()
                        .map(|(link, _)| *link)
                        .collect::<Vec<_>>(),
                    vec![RedisLink::Subscriber],
                    "{}",
                    node.name
                );
            }
            write_rows(&mut master, &log, 1, 30);
            run_until(
                &runtime,
                &mut [&mut master, &mut worker],
                "rows",
                PATIENCE,
                |nodes| caught_up(nodes[1], &log),
            )
            .await;

            // Then the publishers (every normal client but this one).
            let killed = server.command(&["CLIENT", "KILL", "TYPE", "normal"]);
            assert!(killed.as_integer() >= Some(2), "{killed:?}");
            run_until(
                &runtime,
                &mut [&mut master, &mut worker],
                "ready again",
                PATIENCE,
                |nodes| nodes.iter().all(|node| node.ready > 2),
            )
            .await;
            for node in [&master, &worker] {
                assert_eq!(
                    node.disconnects.last().map(|(link, _)| *link),
                    Some(RedisLink::Publisher),
                    "{}",
                    node.name
                );
            }
            write_rows(&mut master, &log, 31, 60);
            run_until(
                &runtime,
                &mut [&mut master, &mut worker],
                "rows",
                PATIENCE,
                |nodes| caught_up(nodes[1], &log),
            )
            .await;
            assert_holds_log(&worker, &log);
        })
    });
}

#[test]
fn slow_consumer_cut_by_redis_recovers_by_catch_up() {
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let server = RedisServer::options()
                .args(&["--client-output-buffer-limit", "pubsub 64kb 32kb 1"])
                .start();
            let log: Log = Log::default();
            let (mut master, mut worker) = pair(&runtime, &server, &log).await;

            // The worker stops reading; the master publishes about 30 MB,
            // far more than the socket buffers and the 64 kB limit hold.
            for chunk in 0..30 {
                write_padded_rows(&mut master, &log, chunk * 150 + 1, chunk * 150 + 150, 4096);
                run_for(&runtime, &mut [&mut master], Duration::from_millis(10)).await;
            }
            let clients = server.command(&["CLIENT", "LIST", "TYPE", "pubsub"]);
            let listed = String::from_utf8_lossy(clients.as_bytes().map_or(&[][..], |b| &b[..]))
                .into_owned();
            assert!(listed.contains("name=master-sub"), "{listed}");
            assert!(
                !listed.contains("name=worker1-sub"),
                "Redis should have cut the worker's subscriber: {listed}"
            );
            // It reads on: the cut is a disconnect, then a catch-up.
            run_until(
                &runtime,
                &mut [&mut master, &mut worker],
                "caught up",
                PATIENCE,
                |nodes| caught_up(nodes[1], &log),
            )
            .await;
            assert_holds_log(&worker, &log);
            assert!(
                worker
                    .disconnects
                    .iter()
                    .any(|(link, reason)| *link == RedisLink::Subscriber && !reason.is_empty()),
                "{:?}",
                worker.disconnects
            );
            let session = worker.client.session();
            assert!(session.buffered_input() < 1 << 20);
            assert!(session.follower().buffered_bytes() < 1 << 20);
        })
    });
}

/// Fails the first `failures` fetches matching `writer` (all of them with
/// `u32::MAX`), then serves `log`.
struct FlakySource {
    log: Log,
    writer: InstanceName,
    failures: u32,
    calls: Mutex<u32>,
}

#[async_trait]
impl CatchUpSource for FlakySource {
    async fn fetch(&self, request: CatchUpRequest) -> Result<CatchUpPage, BoxError> {
        if request.writer == self.writer {
            let calls = {
                let mut calls = self.calls.lock().expect("calls");
                *calls += 1;
                *calls
            };
            if calls <= self.failures {
                return Err(format!("writer unreachable (call {calls})").into());
            }
        }
        LogSource(self.log.clone()).fetch(request).await
    }
}

#[test]
fn a_catch_up_that_fails_twice_is_retried_and_loses_nothing() {
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let server = RedisServer::start();
            let config = RedisConfig::tcp("127.0.0.1", server.port());
            let log: Log = Log::default();
            let mut master = Node::new("master", runtime.clone(), config.clone(), None, |_| {});
            master
                .client
                .session_mut()
                .advance(&StreamName::Events, Token(0))
                .expect("master writes events");
            run_until(
                &runtime,
                &mut [&mut master],
                "master ready",
                PATIENCE,
                |n| n[0].ready > 0,
            )
            .await;
            // Written before the worker is there: it must catch up (0, 120].
            write_rows(&mut master, &log, 1, 120);
            let mut options = fast_options();
            options.max_backoff = Duration::from_millis(60);
            let mut worker = Node::with_client_options(
                "worker1",
                runtime.clone(),
                config,
                Some(log.clone()),
                |_| {},
                options,
            );
            worker.client = worker.client.with_catch_up(Arc::new(FlakySource {
                log: log.clone(),
                writer: InstanceName::master(),
                failures: 2,
                calls: Mutex::new(0),
            }));
            run_until(
                &runtime,
                &mut [&mut master, &mut worker],
                "caught up",
                PATIENCE,
                |nodes| caught_up(nodes[1], &log),
            )
            .await;
            assert_holds_log(&worker, &log);
            let failures: Vec<u32> = worker.catch_up_failures.iter().map(|f| f.1).collect();
            assert_eq!(failures, vec![1, 2]);
            assert!(
                worker
                    .catch_up_failures
                    .iter()
                    .all(|(_, _, retry_in)| *retry_in <= Duration::from_millis(60)),
                "{:?}",
                worker.catch_up_failures
            );
            // Two failures are not stuck; after the success nothing is.
            assert!(worker.stuck.is_empty(), "{:?}", worker.stuck);
            assert!(worker.client.stuck_catch_ups().is_empty());
        })
    });
}

#[test]
fn a_stuck_catch_up_is_reported_and_holds_back_no_other_writer() {
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let server = RedisServer::start();
            let config = RedisConfig::tcp("127.0.0.1", server.port());
            // With Redis every process writes `caches`: master and worker2.
            let mut master = Node::new("master", runtime.clone(), config.clone(), None, |_| {});
            let mut writer2 = Node::new("worker2", runtime.clone(), config.clone(), None, |_| {});
            for node in [&mut master, &mut writer2] {
                node.client
                    .session_mut()
                    .advance(&StreamName::Caches, Token(0))
                    .expect("every process writes caches");
            }
            run_until(
                &runtime,
                &mut [&mut master, &mut writer2],
                "writers ready",
                PATIENCE,
                |n| n.iter().all(|node| node.ready > 0),
            )
            .await;
            let master_log: Log = Log::default();
            for n in 1..=5 {
                let rows = vec![(Token(n), padded_row(n, 0, 0))];
                master_log.lock().expect("log").extend(rows.iter().cloned());
                master
                    .client
                    .session_mut()
                    .write(&StreamName::Caches, Token(n), rows)
                    .expect("master writes caches");
            }
            // worker1 knows master's caches only up to 0: it must fetch
            // (0, 5] from master, which never answers.
            let mut options = fast_options();
            options.max_backoff = Duration::from_millis(40);
            let mut worker = Node::with_client_options(
                "worker1",
                runtime.clone(),
                config,
                None,
                |_| {},
                options,
            );
            worker
                .client
                .session_mut()
                .follower_mut()
                .set_position(&StreamName::Caches, &InstanceName::master(), Token(0))
                .expect("a position to start from");
            worker.client = worker.client.with_catch_up(Arc::new(FlakySource {
                log: master_log.clone(),
                writer: InstanceName::master(),
                failures: u32::MAX,
                calls: Mutex::new(0),
            }));
            run_until(
                &runtime,
                &mut [&mut master, &mut writer2, &mut worker],
                "worker2 followed live",
                PATIENCE,
                |nodes| {
                    nodes[2]
                        .client
                        .session()
                        .follower()
                        .is_writer_connected(&StreamName::Caches, &InstanceName::from("worker2"))
                },
            )
            .await;
            // worker2's rows flow while master's catch-up keeps failing.
            let writer2_log: Log = Log::default();
            let start = writer2
                .client
                .session()
                .writer()
                .position(&StreamName::Caches)
                .expect("worker2 writes caches")
                .0;
            for n in start + 1..=start + 20 {
                let rows = vec![(Token(n), padded_row(n, 0, 0))];
                writer2_log
                    .lock()
                    .expect("log")
                    .extend(rows.iter().cloned());
                writer2
                    .client
                    .session_mut()
                    .write(&StreamName::Caches, Token(n), rows)
                    .expect("worker2 writes caches");
            }
            run_until(
                &runtime,
                &mut [&mut master, &mut writer2, &mut worker],
                "worker2's rows, and master's catch-up stuck",
                PATIENCE,
                |nodes| {
                    nodes[2].held(&StreamName::Caches) == *writer2_log.lock().expect("log")
                        && !nodes[2].stuck.is_empty()
                },
            )
            .await;
            assert_eq!(worker.stuck.len(), 1, "{:?}", worker.stuck);
            let stuck = &worker.stuck[0];
            assert_eq!(stuck.stream, StreamName::Caches);
            assert_eq!(stuck.writer, InstanceName::master());
            assert_eq!((stuck.from, stuck.to), (Token(0), Token(5)));
            assert_eq!(stuck.failures, STUCK_AFTER_FAILURES);
            assert!(stuck.error.contains("writer unreachable"), "{stuck}");
            let listed = worker.client.stuck_catch_ups();
            assert_eq!(listed.len(), 1);
            assert!(listed[0].failures >= STUCK_AFTER_FAILURES);
            assert_eq!(listed[0].since, stuck.since);
            assert_eq!(
                worker
                    .client
                    .session()
                    .follower()
                    .position(&StreamName::Caches, &InstanceName::master()),
                Some(Token(0))
            );
        })
    });
}

#[test]
fn passwords_and_acl_users() {
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let server = RedisServer::options()
                .requirepass("s3cret")
                .user("replicator", "pw1")
                .user_with_rules("reader", "pw2", &["~*", "&*", "+@all", "-publish"])
                .start();
            let url = |creds: &str| format!("redis://{creds}@127.0.0.1:{}", server.port());

            // The default user's password, and an ACL user.
            for creds in [":s3cret", "replicator:pw1"] {
                let config = RedisConfig::from_url(&url(creds)).expect("a URL");
                let mut node = Node::new("worker1", runtime.clone(), config, None, |_| {});
                run_until(&runtime, &mut [&mut node], "ready", PATIENCE, |nodes| {
                    nodes[0].ready > 0
                })
                .await;
                assert!(node.closing.is_empty(), "{creds}: {:?}", node.closing);
            }

            // Wrong credentials: a clear error, and retries.
            let config = RedisConfig::from_url(&url("replicator:wrong")).expect("a URL");
            let mut node = Node::new("worker1", runtime.clone(), config, None, |_| {});
            run_until(
                &runtime,
                &mut [&mut node],
                "two refusals",
                PATIENCE,
                |nodes| {
                    nodes[0]
                        .closing
                        .iter()
                        .filter(|error| matches!(error, RedisError::Auth(_)))
                        .count()
                        >= 3
                },
            )
            .await;
            assert_eq!(node.ready, 0);
            let message = node.closing[0].to_string();
            assert!(message.contains("WRONGPASS"), "{message}");
            assert!(
                !message.contains("wrong"),
                "no password in messages: {message}"
            );

            // A user that may not publish: typed NOPERM.
            let config = RedisConfig::from_url(&url("reader:pw2")).expect("a URL");
            let mut node = Node::new("worker1", runtime.clone(), config, None, |_| {});
            run_until(&runtime, &mut [&mut node], "NOPERM", PATIENCE, |nodes| {
                !nodes[0].publish_failures.is_empty()
            })
            .await;
            assert_eq!(
                node.publish_failures[0],
                ("REPLICATE".to_owned(), "NOPERM".to_owned())
            );
        })
    });
}

#[test]
fn commands_are_published_on_their_channels() {
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let server = RedisServer::start();
            let config = RedisConfig::tcp("127.0.0.1", server.port());
            let mut master = Node::new("master", runtime.clone(), config.clone(), None, |o| {
                o.extra_channels = vec!["USER_IP".to_owned()];
            });
            let mut worker = Node::new("worker1", runtime.clone(), config, None, |_| {});
            run_until(
                &runtime,
                &mut [&mut master, &mut worker],
                "ready",
                PATIENCE,
                |nodes| nodes.iter().all(|node| node.ready > 0),
            )
            .await;
            let user_ip = Command::decode(Bytes::from_static(
                br#"USER_IP @a:test.example ["tok","1.2.3.4","agent","DEV",1]"#,
            ))
            .expect("valid")
            .expect("a command");
            let sync = Command::decode(Bytes::from_static(
                b"USER_SYNC worker1 @a:test.example DEV start 1700000000000",
            ))
            .expect("valid")
            .expect("a command");
            worker.client.send(user_ip.clone()).expect("sent");
            worker.client.send(sync.clone()).expect("sent");
            run_until(
                &runtime,
                &mut [&mut master, &mut worker],
                "commands",
                PATIENCE,
                |nodes| nodes[0].commands.len() >= 2,
            )
            .await;
            assert!(master.commands.contains(&user_ip));
            assert!(master.commands.contains(&sync));
            // The worker did not subscribe to USER_IP: only the sync echo.
            run_for(
                &runtime,
                &mut [&mut master, &mut worker],
                Duration::from_millis(100),
            )
            .await;
            assert_eq!(worker.commands, vec![sync]);
        })
    });
}

#[test]
fn disconnect_reasons_are_reported() {
    // A closed server: connection refused, with backoff under the cap.
    smol::block_on(async {
        let runtime: Rt = Arc::new(SmolRuntime);
        let port = {
            let server = RedisServer::start();
            server.port()
        };
        let config = RedisConfig::tcp("127.0.0.1", port);
        let mut node = Node::new("worker1", runtime.clone(), config, None, |_| {});
        run_until(&runtime, &mut [&mut node], "failures", PATIENCE, |nodes| {
            nodes[0].retry_delays.len() >= 6
        })
        .await;
        assert!(
            node.retry_delays
                .iter()
                .all(|d| *d <= Duration::from_secs(5))
        );
    });
}

/// A writer and a follower meet over each way of reaching Redis: one RESP3
/// connection per process, TLS, and a unix socket.
async fn rows_flow(
    runtime: &Rt,
    master_config: RedisConfig,
    worker_config: RedisConfig,
    single: bool,
) {
    let log: Log = Log::default();
    let tune = move |options: &mut synapse_replication::session::RedisSessionConfig| {
        options.single_connection = single;
    };
    let mut master = Node::new("master", runtime.clone(), master_config, None, tune);
    master
        .client
        .session_mut()
        .advance(&StreamName::Events, Token(0))
        .expect("master writes events");
    let mut worker = Node::new(
        "worker1",
        runtime.clone(),
        worker_config,
        Some(log.clone()),
        tune,
    );
    run_until(
        runtime,
        &mut [&mut master, &mut worker],
        "both ready",
        PATIENCE,
        |nodes| nodes.iter().all(|node| node.ready > 0),
    )
    .await;
    write_rows(&mut master, &log, 1, 60);
    run_until(
        runtime,
        &mut [&mut master, &mut worker],
        "all rows",
        PATIENCE,
        |nodes| caught_up(nodes[1], &log),
    )
    .await;
    assert_holds_log(&worker, &log);
    for node in [&master, &worker] {
        assert!(node.closing.is_empty(), "{}: {:?}", node.name, node.closing);
        let connections = node.client.session().counters().connections;
        if single {
            assert_eq!(connections, [1, 0], "{}: one RESP3 connection", node.name);
        }
    }
}

#[test]
fn one_resp3_connection_per_process() {
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let server = RedisServer::start();
            let config = RedisConfig::tcp("127.0.0.1", server.port());
            rows_flow(&runtime, config.clone(), config, true).await;
        })
    });
}

#[test]
fn over_tls_and_over_a_unix_socket() {
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let server = RedisServer::options().tls().start();
            let mut tls = synapse_replication::config::TlsConfig::default();
            tls.ca_file = Some(server.certs().ca.clone());
            let url = format!("rediss://127.0.0.1:{}", server.tls_port());
            let over_tls = RedisConfig::from_url(&url).expect("a URL").with_tls(tls);
            // The writer over the unix socket, the follower over TLS.
            let over_unix = RedisConfig::unix(server.unix_socket());
            rows_flow(&runtime, over_unix, over_tls, false).await;
        })
    });
}
