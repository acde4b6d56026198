//! The crate's main demo: a writer and two followers, one of which is cut
//! off for a while and catches up. Needs nothing else running, and no
//! flags:
//!
//! ```text
//! cargo run --example demo
//! ```
//!
//! One process plays three: the main process (`master`) writes rows to the
//! `caches` and `typing` streams and keeps them in a log; `worker1` and
//! `worker2` follow it, each driven by its own task. They talk:
//!
//! - through Redis pub/sub, as every current Synapse deployment does, when
//!   `redis-server` is on `PATH`: the demo starts its own on a free
//!   loopback port (never 6379, no persistence) and kills it at the end,
//!   error or not (unless the demo itself is killed);
//! - otherwise through the direct TCP transport on loopback: master is a
//!   `TcpServer`, the workers are `TcpClient`s.
//!
//! `SYNAPSE_REPLICATION_DEMO_TRANSPORT=tcp` (or `=redis`) chooses instead.
//!
//! The story, in 30 rounds of writes (a `caches` row each round, a batch of
//! two `typing` rows every third):
//!
//! 1. Rounds 1-10: both workers apply every row live.
//! 2. worker2 is cut off: its task stops driving it (a stuck or partitioned
//!    process) and its connections are closed from the other end (Redis:
//!    `CLIENT KILL ID`, sent with this crate's RESP codec; TCP: the server
//!    closes it). Rounds 11-20 are published meanwhile: worker1 gets them,
//!    and nothing keeps them for worker2.
//! 3. worker2 is driven again: it finds its connections gone, reconnects,
//!    asks every writer for its positions (`REPLICATE`), sees from master's
//!    `POSITION`s that it missed rows, and its client fetches exactly those
//!    from master's log (a `CatchUpSource`: here a closure over the log;
//!    against Synapse, HTTP).
//! 4. Rounds 21-30: both workers apply every row live again.
//!
//! It prints that story in about 20 lines (which transport, each step, what
//! worker2 fetched, what each worker holds) and ends by comparing both
//! workers' rows with master's log. Success is the last line `both
//! followers hold exactly the writer's rows, in order, each once` and exit
//! status 0; anything else (a missing, repeated or reordered row, or a step
//! that takes more than 15 s) prints `demo: <what went wrong>` and exits
//! with status 1. It takes about a second. Over Redis (ports, ids and
//! delays vary; over TCP the cut and reconnection lines differ):
//!
//! ```text
//! transport: Redis pub/sub, through a redis-server 7.0.15 of the demo's own on 127.0.0.1:35887 (killed at the end)
//! master: ready: subscribed to "example.com", announced POSITION caches 0 and typing 0
//! worker1: ready: subscribed to "example.com", asked every writer for its positions (REPLICATE)
//! worker2: ready: subscribed to "example.com", asked every writer for its positions (REPLICATE)
//! worker1 and worker2 have master's positions: caches 0, typing 0
//! rounds 1-10: master wrote 10 caches rows and 6 typing rows; both workers applied each live
//! cut: worker2 is no longer driven, and CLIENT KILL ID 8 / ID 9 closed its two Redis connections
//! rounds 11-20: master wrote 10 caches rows and 6 typing rows; only worker1 got them: Redis keeps nothing for an absent subscriber (worker2 is still at caches 10, typing 9)
//! worker2 is driven again:
//! worker2: lost its subscriber connection (closed by the peer); reconnecting in 65 ms
//! worker2: lost its publisher connection (closed by the peer); reconnecting in 66 ms
//! worker2: ready again: subscribed to "example.com", asked every writer for its positions (REPLICATE)
//! worker2: master is at typing 18, past its 9: fetching (9, 18] from master's log
//! worker2: master is at caches 20, past its 10: fetching (10, 20] from master's log
//! worker2: caught up 6 typing rows, now at 18
//! worker2: caught up 10 caches rows, now at 20
//! rounds 21-30: master wrote 10 caches rows and 8 typing rows; both workers applied each live
//! worker1: holds 30 caches rows and 20 typing rows; 50 applied live, 0 caught up
//! worker2: holds 30 caches rows and 20 typing rows; 34 applied live, 16 caught up
//!
//! This file is the story; `scaffold.rs` holds the stage: the redis-server,
//! the cut itself, and the observer that prints what the tasks report.

mod scaffold;

use std::collections::{BTreeMap, HashMap};
use std::error::Error;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use synapse_replication::positions::BoxError;

use bytes::Bytes;
use smol::LocalExecutor;
use smol::channel::{Receiver, Sender};
use synapse_replication::config::{RedisConfig, StreamWriters};
use synapse_replication::positions::{
    CatchUpPage, CatchUpRequest, Follower, FollowerEvent, RowOrigin, Writer,
};
use synapse_replication::session::{
    RedisEvent, RedisSession, TcpClientEvent, TcpClientId, TcpClientSession, TcpServerEvent,
    TcpServerSession,
};
use synapse_replication::transport::{
    BoxFuture, CatchUpSource, RedisClient, SmolRuntime, TcpClient, TcpServer,
};
use synapse_replication::wire::{InstanceName, RawRow, StreamName, Token};

use scaffold::{Observer, Report, Transport, count_rows, log_tips};

type Result<T, E = Box<dyn Error>> = std::result::Result<T, E>;

/// Rows by stream, as `(token, row)` in the order written (or applied).
type Log = BTreeMap<StreamName, Vec<(Token, RawRow)>>;

/// The deployment's name: the Redis channel, the TCP server's name.
const SERVER_NAME: &str = "example.com";
const ROUNDS: i64 = 30;
const CUT_AFTER: i64 = 10;
const BACK_AFTER: i64 = 20;
const WORKERS: [&str; 2] = ["worker1", "worker2"];
const STREAMS: [StreamName; 2] = [StreamName::Caches, StreamName::Typing];

fn main() -> ExitCode {
    let executor = LocalExecutor::new();
    match smol::block_on(executor.run(run(&executor))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("demo: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(executor: &LocalExecutor<'_>) -> Result<()> {
    let log = Arc::new(Mutex::new(
        STREAMS
            .iter()
            .map(|s| (s.clone(), Vec::new()))
            .collect::<Log>(),
    ));
    let (reports_in, reports) = smol::channel::unbounded();
    let mut observer = Observer::new(reports);

    // Redis (a redis-server of the demo's own, killed when `transport` is
    // dropped, however `run` ends) or direct TCP.
    let mut transport = Transport::choose().await?;
    let master = match transport.redis_config() {
        Some(config) => Master::redis(config, &STREAMS)?,
        None => Master::tcp(&STREAMS).await?,
    };

    // master first, then the workers, which ask for its positions.
    let (to_master, master_control) = smol::channel::unbounded();
    let master_task = executor.spawn(master.run(master_control, reports_in.clone()));
    observer
        .wait_until("master to be ready", |o| o.readies.contains_key("master"))
        .await?;
    let mut followers = Vec::new();
    for name in WORKERS {
        let client = match (transport.redis_config(), observer.tcp_addr()) {
            (Some(config), _) => Client::redis(name, config, log.clone()),
            (None, Some(addr)) => Client::tcp(name, &addr, log.clone())?,
            (None, None) => return Err("master's TCP server has no address".into()),
        };
        let (to_follower, control) = smol::channel::unbounded();
        let task = executor.spawn(follow(name, client, control, reports_in.clone()));
        followers.push((name, to_follower, task));
    }
    let tips = log_tips(&log)?;
    observer
        .wait_until("the workers to be ready with master's positions", |o| {
            // Ready first: a POSITION heard before the worker's own
            // REPLICATE went out counts for nothing once it is ready, and
            // rows written meanwhile would be fetched, not applied live.
            WORKERS
                .iter()
                .all(|w| o.readies.contains_key(w) && o.reached(w, &tips))
        })
        .await?;
    println!("worker1 and worker2 have master's positions: caches 0, typing 0");

    let mut live: Vec<&str> = WORKERS.to_vec();
    for round in 1..=ROUNDS {
        if round == CUT_AFTER + 1 {
            // worker2's task stops driving its client, and its connections
            // are closed from the other end.
            let (_, to_worker2, _) = &followers[1];
            let (paused, is_paused) = smol::channel::bounded(1);
            to_worker2.send(ToFollower::Pause(paused)).await?;
            is_paused.recv().await?;
            live.retain(|w| *w != "worker2");
            let how = transport.cut("worker2", &to_master).await?;
            println!("cut: worker2 is no longer driven, and {how}");
        }
        if round == BACK_AFTER + 1 {
            println!("worker2 is driven again:");
            followers[1].1.send(ToFollower::Resume).await?;
            let tips = log_tips(&log)?;
            observer
                .wait_until("worker2 to catch up", |o| o.reached("worker2", &tips))
                .await?;
            live.push("worker2");
        }

        if round == 1 || round == CUT_AFTER + 1 || round == BACK_AFTER + 1 {
            observer.begin_rounds();
        }
        write_round(round, &log, &to_master).await?;
        let tips = log_tips(&log)?;
        observer
            .wait_until(&format!("round {round} to reach {live:?}"), |o| {
                live.iter().all(|w| o.reached(w, &tips))
            })
            .await?;
        if round == CUT_AFTER || round == BACK_AFTER || round == ROUNDS {
            observer.print_rounds(round, &log, &transport)?;
        }
    }

    // Stop everything and compare what each worker holds with the log.
    let _ = to_master.send(ToMaster::Stop).await;
    master_task.await;
    let log = log
        .lock()
        .map_err(|_| "the log's lock is poisoned")?
        .clone();
    let mut wrong = Vec::new();
    for (name, to_follower, task) in followers {
        let _ = to_follower.send(ToFollower::Stop).await;
        let held = task.await;
        println!(
            "{name}: holds {}; {} applied live, {} caught up",
            count_rows(&held.log, |_| true),
            held.live,
            held.caught_up
        );
        if held.log != log {
            wrong.push(name);
        }
    }
    if !wrong.is_empty() {
        return Err(format!("{wrong:?} do not hold exactly the writer's rows").into());
    }
    println!("both followers hold exactly the writer's rows, in order, each once");
    Ok(())
}

/// Round `round`: a `caches` row, and every third round a batch of two
/// `typing` rows, all with token `round`: logged, then written.
async fn write_round(round: i64, log: &Mutex<Log>, to_master: &Sender<ToMaster>) -> Result<()> {
    let token = Token(round);
    let mut writes = vec![(
        StreamName::Caches,
        vec![row(&format!(
            r#"["get_user_by_id",["@user{round}:example.com"],{round}]"#
        ))?],
    )];
    if round % 3 == 0 {
        writes.push((
            StreamName::Typing,
            vec![
                row(&format!(
                    r#"["!room{round}:example.com",["@a:example.com"]]"#
                ))?,
                row(&format!(r#"["!other{round}:example.com",[]]"#))?,
            ],
        ));
    }
    for (stream, rows) in writes {
        // The log first: a catch-up may ask for the rows as soon as they
        // are published.
        log.lock()
            .map_err(|_| "the log's lock is poisoned")?
            .entry(stream.clone())
            .or_default()
            .extend(rows.iter().map(|r| (token, r.clone())));
        to_master
            .send(ToMaster::Write {
                stream,
                token,
                rows,
            })
            .await?;
    }
    Ok(())
}

fn row(json: &str) -> Result<RawRow> {
    Ok(RawRow::new(Bytes::copy_from_slice(json.as_bytes()))?)
}

/// master's log as a [`CatchUpSource`]: the rows of `(from, to]`, in one
/// page.
fn log_source(log: Arc<Mutex<Log>>) -> Arc<dyn CatchUpSource> {
    Arc::new(
        move |request: CatchUpRequest| -> BoxFuture<'static, Result<CatchUpPage, BoxError>> {
            let page = log
                .lock()
                .map_err(|_| BoxError::from("the log's lock is poisoned"))
                .map(|log| CatchUpPage {
                    updates: log
                        .get(&request.stream)
                        .into_iter()
                        .flatten()
                        .filter(|(token, _)| *token > request.from && *token <= request.to)
                        .filter(|_| request.writer == InstanceName::master())
                        .cloned()
                        .collect(),
                    upto: request.to,
                    limited: false,
                });
            Box::pin(std::future::ready(page))
        },
    )
}

/// Messages to master's task.
enum ToMaster {
    Write {
        stream: StreamName,
        token: Token,
        rows: Vec<RawRow>,
    },
    /// (TCP) Close the named client's connection; answered once it is
    /// closed.
    Close {
        name: String,
        done: Sender<Result<(), String>>,
    },
    Stop,
}

/// The writer: a Redis client, or a TCP server.
enum Master {
    Redis(Box<RedisClient<SmolRuntime>>),
    Tcp {
        server: Box<TcpServer<SmolRuntime>>,
        names: HashMap<String, TcpClientId>,
        closing: Option<(TcpClientId, Sender<Result<(), String>>)>,
    },
}

fn master_writer(registry: Arc<StreamWriters>, streams: &[StreamName]) -> Result<Writer> {
    let mut writer = Writer::new(InstanceName::master(), registry);
    for stream in streams {
        writer.advance(stream, Token(0))?;
    }
    Ok(writer)
}

impl Master {
    fn redis(config: &RedisConfig, streams: &[StreamName]) -> Result<Master> {
        // Over Redis every process writes `caches` too.
        let registry = Arc::new(StreamWriters::default().with_redis(true));
        let mut options = config.session_config(SERVER_NAME);
        options.client_name = Some("master".into());
        let session = RedisSession::new(
            options,
            Follower::new(InstanceName::master(), registry.clone()),
            master_writer(registry, streams)?,
        );
        let client = RedisClient::new(SmolRuntime, config.clone(), session);
        Ok(Master::Redis(Box::new(client)))
    }

    async fn tcp(streams: &[StreamName]) -> Result<Master> {
        let registry = Arc::new(StreamWriters::default());
        let writer = master_writer(registry, streams)?;
        let session = TcpServerSession::new(SERVER_NAME, writer, Instant::now())?;
        let server = TcpServer::bind(SmolRuntime, "127.0.0.1:0", session).await?;
        Ok(Master::Tcp {
            server: Box::new(server),
            names: HashMap::new(),
            closing: None,
        })
    }

    /// Drives master, writes what `run` asks for.
    async fn run(mut self, control: Receiver<ToMaster>, reports: Sender<Report>) {
        if let Master::Tcp { server, .. } = &self {
            let addr = server.local_addr().map(|a| a.to_string()).ok();
            let what = format!(
                "a TcpServer on {} serving caches and typing",
                addr.as_deref().unwrap_or("?")
            );
            let _ = reports.try_send(Report::Ready {
                name: "master",
                what,
                addr,
            });
        }
        loop {
            let next = smol::future::or(async { Err(control.recv().await) }, async {
                Ok(self.next().await)
            })
            .await;
            match next {
                Ok(None) => {}
                Ok(Some(report)) => {
                    let _ = reports.try_send(report);
                }
                Err(Ok(ToMaster::Write {
                    stream,
                    token,
                    rows,
                })) => {
                    let updates = rows.into_iter().map(|r| (token, r));
                    let written = match &mut self {
                        Master::Redis(client) => {
                            client.session_mut().write(&stream, token, updates)
                        }
                        Master::Tcp { server, .. } => {
                            server.session_mut().write(&stream, token, updates)
                        }
                    };
                    if let Err(error) = written {
                        let _ = reports.try_send(Report::Note(format!("master: {error}")));
                    }
                }
                Err(Ok(ToMaster::Close { name, done })) => match &mut self {
                    Master::Tcp {
                        server,
                        names,
                        closing,
                    } => match names.get(&name) {
                        Some(&client) => {
                            server.session_mut().close(client, "cut off by the demo");
                            *closing = Some((client, done));
                        }
                        None => {
                            let _ = done.try_send(Err(format!("no client named {name}")));
                        }
                    },
                    Master::Redis(_) => {
                        let _ = done.try_send(Err("not a TCP server".into()));
                    }
                },
                Err(Ok(ToMaster::Stop) | Err(_)) => break,
            }
        }
        if let Master::Redis(client) = &mut self {
            client.close(Duration::from_secs(1)).await;
        }
    }

    /// The next thing worth reporting, if any.
    async fn next(&mut self) -> Option<Report> {
        match self {
            Master::Redis(client) => match client.next_event().await? {
                RedisEvent::Ready => Some(Report::Ready {
                    name: "master",
                    what: format!(
                        "subscribed to \"{SERVER_NAME}\", announced POSITION caches 0 and typing 0"
                    ),
                    addr: None,
                }),
                RedisEvent::Connected { .. }
                | RedisEvent::Follower(FollowerEvent::Rows { .. })
                | RedisEvent::Follower(FollowerEvent::Position { .. })
                | RedisEvent::Follower(FollowerEvent::Started { .. })
                | RedisEvent::Command(_)
                | RedisEvent::Follower(_) => None,
                other => Some(Report::Note(format!("master: {other:?}"))),
            },
            Master::Tcp {
                server,
                names,
                closing,
            } => match server.next_event().await {
                TcpServerEvent::Named { client, name } => {
                    names.insert(name.to_string(), client);
                    None
                }
                TcpServerEvent::Disconnected { client, .. } => {
                    names.retain(|_, id| *id != client);
                    if let Some((_, done)) = closing.take_if(|(id, _)| *id == client) {
                        let _ = done.try_send(Ok(()));
                    }
                    None
                }
                TcpServerEvent::Accepted { .. } | TcpServerEvent::Replicated { .. } => None,
                other => Some(Report::Note(format!("master: {other:?}"))),
            },
        }
    }
}

/// Messages to a worker's task.
enum ToFollower {
    /// Stop driving the client (answered once stopped) until `Resume`.
    Pause(Sender<()>),
    Resume,
    Stop,
}

/// A worker's replication client.
enum Client {
    Redis(Box<RedisClient<SmolRuntime>>),
    Tcp(Box<TcpClient<SmolRuntime>>),
}

/// What a worker's client reported, in the demo's terms.
enum Seen {
    Ready(String),
    Follower(FollowerEvent),
    Note(String),
    Nothing,
    Closed,
}

impl Client {
    fn redis(name: &'static str, config: &RedisConfig, log: Arc<Mutex<Log>>) -> Client {
        let registry = Arc::new(StreamWriters::default().with_redis(true));
        let me = InstanceName::from(name);
        let mut options = config.session_config(SERVER_NAME);
        // Its connections are `<name>-sub` and `<name>-pub` in CLIENT LIST.
        options.client_name = Some(name.into());
        let session = RedisSession::new(
            options,
            Follower::new(me.clone(), registry.clone()),
            Writer::new(me, registry),
        );
        let client =
            RedisClient::new(SmolRuntime, config.clone(), session).with_catch_up(log_source(log));
        Client::Redis(Box::new(client))
    }

    fn tcp(name: &'static str, addr: &str, log: Arc<Mutex<Log>>) -> Result<Client> {
        let registry = Arc::new(StreamWriters::default());
        let follower = Follower::new(InstanceName::from(name), registry);
        let session = TcpClientSession::new(SERVER_NAME, follower)?;
        let client = TcpClient::new(SmolRuntime, addr, session).with_catch_up(log_source(log));
        Ok(Client::Tcp(Box::new(client)))
    }

    async fn next(&mut self) -> Seen {
        match self {
            Client::Redis(client) => match client.next_event().await {
                None => Seen::Closed,
                Some(RedisEvent::Follower(event)) => Seen::Follower(event),
                Some(RedisEvent::Ready) => Seen::Ready(format!(
                    "subscribed to \"{SERVER_NAME}\", asked every writer for its positions \
                     (REPLICATE)"
                )),
                Some(RedisEvent::Disconnected {
                    link,
                    reason,
                    retry_in,
                }) => Seen::Note(format!(
                    "lost its {link} connection ({reason}); reconnecting in {} ms",
                    retry_in.as_millis()
                )),
                Some(RedisEvent::Connected { .. } | RedisEvent::Command(_)) => Seen::Nothing,
                Some(other) => Seen::Note(format!("{other:?}")),
            },
            Client::Tcp(client) => match client.next_event().await {
                None => Seen::Closed,
                Some(TcpClientEvent::Follower(event)) => Seen::Follower(event),
                Some(TcpClientEvent::Ready { .. }) => Seen::Ready(
                    "connected to master's server, asked for its positions (REPLICATE)".into(),
                ),
                Some(TcpClientEvent::PeerError(message)) => {
                    Seen::Note(format!("the server said ERROR {message}"))
                }
                Some(TcpClientEvent::Disconnected { reason, retry_in }) => Seen::Note(format!(
                    "lost its connection ({reason}); reconnecting in {} ms",
                    retry_in.as_millis()
                )),
                Some(TcpClientEvent::Connected) => Seen::Nothing,
                Some(other) => Seen::Note(format!("{other:?}")),
            },
        }
    }

    async fn close(&mut self) {
        match self {
            Client::Redis(client) => client.close(Duration::from_secs(1)).await,
            Client::Tcp(client) => client.close().await,
        }
    }
}

/// What a worker applied.
struct Held {
    log: Log,
    live: usize,
    caught_up: usize,
}

/// Drives a worker's client, applies its rows, reports progress.
async fn follow(
    name: &'static str,
    mut client: Client,
    control: Receiver<ToFollower>,
    reports: Sender<Report>,
) -> Held {
    let mut held = Held {
        log: STREAMS.into_iter().map(|s| (s, Vec::new())).collect(),
        live: 0,
        caught_up: 0,
    };
    let report = |report| {
        let _ = reports.try_send(report);
    };
    loop {
        let next = smol::future::or(async { Err(control.recv().await) }, async {
            Ok(client.next().await)
        })
        .await;
        let seen = match next {
            Ok(seen) => seen,
            Err(Ok(ToFollower::Pause(paused))) => {
                let _ = paused.send(()).await;
                match control.recv().await {
                    Ok(ToFollower::Resume) => continue,
                    _ => break,
                }
            }
            Err(Ok(ToFollower::Resume)) => continue,
            Err(Ok(ToFollower::Stop) | Err(_)) => break,
        };
        match seen {
            Seen::Ready(what) => report(Report::Ready {
                name,
                what,
                addr: None,
            }),
            Seen::Follower(FollowerEvent::Rows {
                stream,
                writer,
                token,
                rows,
                source,
            }) if writer == InstanceName::master() => {
                let count = rows.len();
                match source {
                    RowOrigin::Live => held.live += count,
                    RowOrigin::CatchUp => held.caught_up += count,
                }
                let applied = held.log.entry(stream.clone()).or_default();
                applied.extend(rows.into_iter().map(|r| (token, r)));
                report(Report::At {
                    name,
                    stream,
                    token,
                    rows: count,
                    source,
                });
            }
            Seen::Follower(
                FollowerEvent::Position {
                    stream,
                    writer,
                    token,
                }
                | FollowerEvent::Started {
                    stream,
                    writer,
                    token,
                },
            ) if writer == InstanceName::master() => report(Report::At {
                name,
                stream,
                token,
                rows: 0,
                source: RowOrigin::Live,
            }),
            Seen::Follower(FollowerEvent::CatchUp(request)) => {
                report(Report::CatchUp { name, request });
            }
            Seen::Follower(other) => report(Report::Note(format!("{name}: {other}"))),
            Seen::Note(line) => report(Report::Note(format!("{name}: {line}"))),
            Seen::Nothing => {}
            Seen::Closed => break,
        }
    }
    client.close().await;
    held
}
