//! High-availability Redis through Sentinel, against real processes: a
//! master, a replica and three sentinels (`redis-server --sentinel`) on
//! free loopback ports; a writer and a follower as `RedisClient`s given
//! the sentinels. A failover by `SENTINEL FAILOVER`, and separately a
//! `kill -9` of the master, mid-stream: the follower ends with exactly the
//! writer's log (what it missed comes from the writer's history through
//! catch-up), the switch is seen, and nothing is published to a replica.
//! Then the ways discovery fails: every sentinel down at start, a name no
//! sentinel knows, and a sentinel that names a replica.
//!
//! Deadlines only stop a test that would hang; nothing waits for a fixed
//! time to pass.

#![cfg(all(unix, feature = "runtime-smol"))]

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use synapse_replication::positions::{BoxError, FollowerEvent};
use synapse_replication::session::RedisEvent;
use synapse_replication::session::sentinel::{
    DiscoveryError, MasterAddr, NodeRole, SentinelError, SentinelEvent,
};

use bytes::{Bytes, BytesMut};
use common::nodes::{Process, run_until};
use common::redis_server::{RedisServer, TempDir};
use synapse_replication::config::{AllowedMasters, RedisAuth, RedisConfig, StreamWriters};
use synapse_replication::positions::{CatchUpPage, CatchUpRequest, Follower, RowOrigin, Writer};
use synapse_replication::resp::{Frame, RespDecoder, encode_command};
use synapse_replication::session::RedisSession;
use synapse_replication::transport::{
    CatchUpSource, RedisClient, RedisClientConfig, Runtime, SmolRuntime, async_trait,
};
use synapse_replication::wire::{InstanceName, RawRow, StreamName, Token};

const PREFIX: &str = "test.example";
const SERVICE: &str = "mymaster";
/// Stops a test that would hang; never reached when things work.
const PATIENCE: Duration = Duration::from_secs(40);

type Rt = Arc<dyn Runtime>;
type Log = Arc<Mutex<Vec<(Token, RawRow)>>>;

/// A loopback port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// One command on a fresh connection to `port`; its reply.
fn command(port: u16, args: &[&str]) -> std::io::Result<Frame> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut out = BytesMut::new();
    let args: Vec<&[u8]> = args.iter().map(|arg| arg.as_bytes()).collect();
    encode_command(&mut out, &args);
    stream.write_all(&out)?;
    let mut decoder = RespDecoder::new();
    let mut buf = BytesMut::new();
    loop {
        if let Some(frame) = decoder
            .decode(&mut buf)
            .map_err(|error| std::io::Error::other(error.to_string()))?
        {
            return Ok(frame);
        }
        let mut chunk = [0; 4096];
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn text(frame: &Frame) -> String {
    frame
        .as_bytes()
        .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
        .unwrap_or_default()
}

/// The names of our clients (`master-pub`, `worker1-sub`, ...)
/// connected to the node on `port`. (Its PUBLISH count would not do: a
/// replica runs every PUBLISH its master replicates to it, and sentinels
/// publish their hellos on every node.)
fn our_clients(port: u16) -> Vec<String> {
    let list = text(&command(port, &["CLIENT", "LIST"]).expect("CLIENT LIST"));
    list.lines()
        .filter_map(|line| {
            line.split(' ')
                .find_map(|field| field.strip_prefix("name="))
                .filter(|name| name.starts_with("master-") || name.starts_with("worker1-"))
                .map(str::to_owned)
        })
        .collect()
}

fn role(port: u16) -> Option<String> {
    let reply = command(port, &["ROLE"]).ok()?;
    reply.elements()?.first().map(text)
}

/// Polls `check` until it holds; panics after `PATIENCE`.
fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `redis-server --sentinel`, killed when dropped.
struct Sentinel {
    child: Option<Child>,
    port: u16,
    _dir: TempDir,
}

impl Sentinel {
    /// A sentinel on `port` monitoring the master at `master_port`, quick
    /// to decide (1 s down-after, 3 s failover timeout).
    fn start(port: u16, master_port: u16) -> Sentinel {
        let dir = TempDir::new("sentinel");
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel.log\n\
                 sentinel monitor {SERVICE} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {SERVICE} 1000\n\
                 sentinel failover-timeout {SERVICE} 3000\n\
                 sentinel parallel-syncs {SERVICE} 1\n",
                dir = dir.path().display()
            ),
        )
        .expect("sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server --sentinel");
        let sentinel = Sentinel {
            child: Some(child),
            port,
            _dir: dir,
        };
        wait_for("a sentinel to answer", || {
            command(port, &["PING"]).is_ok_and(|pong| text(&pong) == "PONG")
        });
        sentinel
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A master, its replica, and three sentinels that know both and each
/// other.
struct Cluster {
    master: RedisServer,
    replica: RedisServer,
    sentinels: Vec<Sentinel>,
}

impl Cluster {
    fn start() -> Cluster {
        let ports = [free_port(), free_port(), free_port()];
        Cluster::start_on(ports)
    }

    fn start_on(ports: [u16; 3]) -> Cluster {
        let master = RedisServer::start();
        let replica = RedisServer::options()
            .args(&["--replicaof", "127.0.0.1", &master.port().to_string()])
            .start();
        wait_for("the replica to sync", || {
            let info = text(&replica.command(&["INFO", "replication"]));
            info.contains("master_link_status:up")
        });
        let sentinels = ports
            .iter()
            .map(|port| Sentinel::start(*port, master.port()))
            .collect();
        let cluster = Cluster {
            master,
            replica,
            sentinels,
        };
        cluster.wait_until_settled();
        cluster
    }

    /// Every sentinel knows the replica and the two other sentinels (so
    /// that a failover can be agreed).
    fn wait_until_settled(&self) {
        for sentinel in &self.sentinels {
            wait_for("the sentinels to know each other and the replica", || {
                let count = |args: &[&str]| {
                    command(sentinel.port, args)
                        .ok()
                        .and_then(|reply| reply.elements().map(<[Frame]>::len))
                        .unwrap_or(0)
                };
                count(&["SENTINEL", "replicas", SERVICE]) == 1
                    && count(&["SENTINEL", "sentinels", SERVICE]) == 2
            });
        }
    }

    fn config(&self, service: &str) -> RedisConfig {
        RedisConfig::sentinel(
            service,
            self.sentinels
                .iter()
                .map(|sentinel| ("127.0.0.1", sentinel.port)),
        )
        .with_connect_timeout(Duration::from_secs(2))
    }

    /// The master the sentinels name now.
    fn named_master(&self) -> Option<u16> {
        let reply = command(
            self.sentinels[0].port,
            &["SENTINEL", "get-master-addr-by-name", SERVICE],
        )
        .ok()?;
        text(reply.elements()?.get(1)?).parse().ok()
    }
}

fn fast_options() -> RedisClientConfig {
    let mut options = RedisClientConfig::default();
    options.initial_backoff = Duration::from_millis(20);
    options.max_backoff = Duration::from_millis(500);
    options.catch_up_backoff = Duration::from_millis(20);
    options
}

/// Serves catch-ups from the writer's log, in pages of 50.
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
            if updates.len() >= 50 && updates.last().is_some_and(|(last, _)| last != token) {
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
    rows: Vec<(Token, RawRow)>,
    live_rows: usize,
    caught_up_rows: usize,
    ready: Vec<Instant>,
    found: Vec<(MasterAddr, Vec<(String, SentinelError)>)>,
    switches: Vec<(MasterAddr, MasterAddr)>,
    watching: usize,
    connect_failures: Vec<String>,
    discovery_failures: Vec<DiscoveryError>,
}

impl Node {
    fn new(name: &'static str, runtime: Rt, config: RedisConfig, log: Option<Log>) -> Node {
        let registry = Arc::new(StreamWriters::default().with_redis(true));
        let me = InstanceName::from(name);
        let mut options = config.session_config(PREFIX);
        options.client_name = Some(name.to_owned());
        let session = RedisSession::new(
            options,
            Follower::new(me.clone(), registry.clone()),
            Writer::new(me, registry),
        );
        let mut client = RedisClient::with_config(runtime, config, session, fast_options());
        if let Some(log) = log {
            client
                .set_position(&StreamName::Events, &InstanceName::master(), Token(0))
                .expect("a start");
            client = client.with_catch_up(Arc::new(LogSource(log)));
        } else {
            client
                .advance(&StreamName::Events, Token(0))
                .expect("master writes events");
        }
        Node {
            name,
            client,
            rows: Vec::new(),
            live_rows: 0,
            caught_up_rows: 0,
            ready: Vec::new(),
            found: Vec::new(),
            switches: Vec::new(),
            watching: 0,
            connect_failures: Vec::new(),
            discovery_failures: Vec::new(),
        }
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
        match event {
            RedisEvent::Ready => self.ready.push(Instant::now()),
            RedisEvent::Follower(FollowerEvent::Rows {
                token,
                rows,
                source,
                ..
            }) => {
                match source {
                    RowOrigin::Live => self.live_rows += rows.len(),
                    RowOrigin::CatchUp => self.caught_up_rows += rows.len(),
                }
                self.rows.extend(rows.into_iter().map(|row| (token, row)));
            }
            RedisEvent::Sentinel(SentinelEvent::MasterFound {
                master, rejected, ..
            }) => self.found.push((
                master,
                rejected
                    .into_iter()
                    .map(|(sentinel, error)| (sentinel.to_string(), error))
                    .collect(),
            )),
            RedisEvent::Sentinel(SentinelEvent::Switched { from, to }) => {
                self.switches.push((from, to))
            }
            RedisEvent::Sentinel(SentinelEvent::Watching { .. }) => self.watching += 1,
            RedisEvent::ConnectFailed { error, .. } => {
                if let Some(discovery) = error
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<DiscoveryError>())
                {
                    self.discovery_failures.push(discovery.clone());
                }
                self.connect_failures.push(error.to_string());
            }
            _ => {}
        }
    }

    fn summary(&self) -> String {
        format!(
            "{}: ready {} rows {} found {:?} switches {:?} failures {:?}",
            self.name,
            self.ready.len(),
            self.rows.len(),
            self.found,
            self.switches,
            self.connect_failures
                .iter()
                .rev()
                .take(3)
                .collect::<Vec<_>>()
        )
    }
}

fn row(n: i64, part: usize) -> RawRow {
    let json = format!(
        r#"["ev",["$event{n}_{part}","!room:test.example","m.room.message",null,null,null]]"#
    );
    RawRow::new(Bytes::from(json)).expect("a row")
}

/// Tokens `from..=to`, every third a batch of three rows.
fn write_rows(writer: &mut Node, log: &Log, from: i64, to: i64) {
    for n in from..=to {
        let token = Token(n);
        let parts = if n % 3 == 0 { 3 } else { 1 };
        let rows: Vec<(Token, RawRow)> = (0..parts).map(|part| (token, row(n, part))).collect();
        log.lock().expect("log").extend(rows.iter().cloned());
        writer
            .client
            .write(&StreamName::Events, token, rows)
            .expect("master writes events");
    }
}

fn caught_up(node: &Node, log: &Log) -> bool {
    node.rows == *log.lock().expect("log")
}

enum Failover {
    Command,
    Kill9,
}

fn failover_scenario(failover: Failover) {
    let mut cluster = Cluster::start();
    let old_master = cluster.master.port();
    let replica = cluster.replica.port();
    let runtime: Rt = Arc::new(SmolRuntime);
    let log: Log = Arc::default();
    smol::block_on(async {
        let mut writer = Node::new("master", runtime.clone(), cluster.config(SERVICE), None);
        let mut follower = Node::new(
            "worker1",
            runtime.clone(),
            cluster.config(SERVICE),
            Some(log.clone()),
        );
        run_until(
            &runtime,
            &mut [&mut writer, &mut follower],
            "both ready and watching",
            PATIENCE,
            |nodes| {
                nodes
                    .iter()
                    .all(|node| !node.ready.is_empty() && node.watching > 0)
            },
        )
        .await;
        run_until(
            &runtime,
            &mut [&mut writer, &mut follower],
            "the writer followed live",
            PATIENCE,
            |nodes| {
                nodes[1]
                    .client
                    .follower()
                    .is_writer_connected(&StreamName::Events, &InstanceName::master())
            },
        )
        .await;
        for node in [&writer, &follower] {
            assert!(
                node.found
                    .iter()
                    .all(|(master, _)| master.port == old_master),
                "{}: {:?}",
                node.name,
                node.found
            );
        }
        write_rows(&mut writer, &log, 1, 60);
        run_until(
            &runtime,
            &mut [&mut writer, &mut follower],
            "the first rows",
            PATIENCE,
            |nodes| caught_up(nodes[1], &log),
        )
        .await;
        assert_eq!(
            our_clients(replica),
            Vec::<String>::new(),
            "no link on the replica"
        );
        assert_eq!(
            our_clients(old_master).len(),
            4,
            "both links of both on the master"
        );

        let ready_before = follower.ready.len();
        let live_before = follower.live_rows;
        let started = Instant::now();
        match failover {
            Failover::Command => {
                let reply = command(
                    cluster.sentinels[1].port,
                    &["SENTINEL", "FAILOVER", SERVICE],
                )
                .expect("SENTINEL FAILOVER");
                assert_eq!(text(&reply), "OK", "{reply:?}");
            }
            Failover::Kill9 => cluster.master.kill9(),
        }
        // Rows written while the master changes: some reach the old
        // master, some no master at all.
        write_rows(&mut writer, &log, 61, 120);
        run_until(
            &runtime,
            &mut [&mut writer, &mut follower],
            "the switch, and both ready on the new master",
            PATIENCE,
            |nodes| {
                nodes.iter().all(|node| {
                    node.switches.iter().any(|(_, to)| to.port == replica)
                        && node
                            .found
                            .last()
                            .is_some_and(|(master, _)| master.port == replica)
                        && node.client.is_ready()
                })
            },
        )
        .await;
        let ready_again = follower.ready[ready_before..]
            .last()
            .copied()
            .expect("ready again");
        eprintln!(
            "failover ({}): follower ready again {} ms after it began",
            match failover {
                Failover::Command => "SENTINEL FAILOVER",
                Failover::Kill9 => "kill -9",
            },
            ready_again.duration_since(started).as_millis()
        );
        assert_eq!(cluster.named_master(), Some(replica));
        // The old master, if alive, is a replica now: no link stays on it.
        if let Failover::Command = failover {
            wait_for("the old master to be a replica", || {
                role(old_master).as_deref() == Some("slave")
            });
        }
        write_rows(&mut writer, &log, 121, 180);
        run_until(
            &runtime,
            &mut [&mut writer, &mut follower],
            "every row",
            PATIENCE,
            |nodes| caught_up(nodes[1], &log),
        )
        .await;
        assert!(
            caught_up(&follower, &log),
            "the follower holds the writer's log"
        );
        let total = log.lock().expect("log").len();
        eprintln!(
            "rows: {total} written; follower got {} live before, {} live after, {} by catch-up",
            live_before,
            follower.live_rows - live_before,
            follower.caught_up_rows
        );
        if let Failover::Command = failover {
            assert_eq!(role(old_master).as_deref(), Some("slave"));
            assert_eq!(
                our_clients(old_master),
                Vec::<String>::new(),
                "no link stays on the demoted master"
            );
        }
        assert_eq!(
            our_clients(replica).len(),
            4,
            "both links of both on the new master"
        );
        for node in [&writer, &follower] {
            for (master, _) in &node.found {
                assert!(
                    master.port == old_master || master.port == replica,
                    "{master}"
                );
            }
        }
    });
}

#[test]
fn sentinel_failover_mid_stream_loses_nothing() {
    failover_scenario(Failover::Command);
}

#[test]
fn master_killed_mid_stream_loses_nothing() {
    failover_scenario(Failover::Kill9);
}

#[test]
fn every_sentinel_down_at_start_is_reported_and_retried() {
    let ports = [free_port(), free_port(), free_port()];
    let runtime: Rt = Arc::new(SmolRuntime);
    let config = RedisConfig::sentinel(SERVICE, ports.iter().map(|port| ("127.0.0.1", *port)));
    smol::block_on(async {
        let mut node = Node::new("master", runtime.clone(), config, None);
        run_until(
            &runtime,
            &mut [&mut node],
            "two failed rounds",
            PATIENCE,
            |nodes| nodes[0].discovery_failures.len() >= 2,
        )
        .await;
        let error = &node.discovery_failures[0];
        assert_eq!(error.failures.len(), 3, "{error}");
        assert!(
            error
                .failures
                .iter()
                .all(|(_, error)| matches!(error, SentinelError::Unreachable(_))),
            "{error}"
        );
        assert!(
            node.connect_failures[0].contains("no sentinel named a usable master for \"mymaster\""),
            "{}",
            node.connect_failures[0]
        );
        assert!(node.ready.is_empty());
        // The sentinels come up: the client finds the master.
        let cluster = Cluster::start_on(ports);
        run_until(&runtime, &mut [&mut node], "ready", PATIENCE, |nodes| {
            !nodes[0].ready.is_empty()
        })
        .await;
        assert_eq!(
            node.found.last().map(|(master, _)| master.port),
            Some(cluster.master.port())
        );
    });
}

#[test]
fn a_master_name_no_sentinel_knows_is_reported_and_retried() {
    let cluster = Cluster::start();
    let runtime: Rt = Arc::new(SmolRuntime);
    smol::block_on(async {
        let mut node = Node::new(
            "master",
            runtime.clone(),
            cluster.config("othermaster"),
            None,
        );
        run_until(
            &runtime,
            &mut [&mut node],
            "two failed rounds",
            PATIENCE,
            |nodes| nodes[0].discovery_failures.len() >= 2,
        )
        .await;
        for error in &node.discovery_failures {
            assert_eq!(error.failures.len(), 3, "{error}");
            assert!(
                error.failures.iter().all(|(_, error)| matches!(
                    error,
                    SentinelError::UnknownMaster(name) if name == "othermaster"
                )),
                "{error}"
            );
        }
        assert!(node.ready.is_empty());
    });
    assert_eq!(our_clients(cluster.master.port()), Vec::<String>::new());
    assert_eq!(our_clients(cluster.replica.port()), Vec::<String>::new());
}

/// A sentinel that names `port` as the master, to whoever asks anything.
fn lying_sentinel(port: u16) -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a port");
    let own = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let port = port.to_string();
                let answer = format!("*2\r\n$9\r\n127.0.0.1\r\n${}\r\n{port}\r\n", port.len());
                let mut buf = [0; 1024];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 || stream.write_all(answer.as_bytes()).is_err() {
                        break;
                    }
                }
            });
        }
    });
    own
}

#[test]
fn a_sentinel_that_names_a_replica_is_caught_by_the_role_check() {
    let cluster = Cluster::start();
    let liar = lying_sentinel(cluster.replica.port());
    let runtime: Rt = Arc::new(SmolRuntime);
    let config = RedisConfig::sentinel(
        SERVICE,
        [
            ("127.0.0.1", liar),
            ("127.0.0.1", cluster.sentinels[0].port),
        ],
    );
    smol::block_on(async {
        let mut node = Node::new("master", runtime.clone(), config, None);
        run_until(&runtime, &mut [&mut node], "ready", PATIENCE, |nodes| {
            !nodes[0].ready.is_empty()
        })
        .await;
        let (master, rejected) = node.found.first().expect("found").clone();
        assert_eq!(master.port, cluster.master.port());
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        assert_eq!(rejected[0].0, format!("127.0.0.1:{liar}"));
        assert!(
            matches!(
                &rejected[0].1,
                SentinelError::NotMaster { addr, role: NodeRole::Replica }
                    if addr.port == cluster.replica.port()
            ),
            "{rejected:?}"
        );
        assert!(
            node.found
                .iter()
                .all(|(master, _)| master.port == cluster.master.port()),
            "{:?}",
            node.found
        );
        assert_eq!(our_clients(cluster.replica.port()), Vec::<String>::new());
        assert_eq!(our_clients(cluster.master.port()).len(), 2);
    });
}

/// What a [`FakeNode`] was sent: connections accepted and every byte.
#[derive(Default)]
struct Heard {
    connections: usize,
    bytes: Vec<u8>,
}

/// A node a lying sentinel can name: it records what it receives and
/// answers each command as `role` would (`ROLE` with that role, anything
/// else `+OK`).
fn fake_node(role: &'static str) -> (u16, Arc<Mutex<Heard>>) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a port");
    let port = listener.local_addr().expect("addr").port();
    let heard: Arc<Mutex<Heard>> = Arc::default();
    let shared = heard.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            shared.lock().expect("heard").connections += 1;
            let shared = shared.clone();
            std::thread::spawn(move || {
                let mut decoder = RespDecoder::new();
                let mut input = BytesMut::new();
                let mut buf = [0; 4096];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    shared
                        .lock()
                        .expect("heard")
                        .bytes
                        .extend_from_slice(&buf[..n]);
                    input.extend_from_slice(&buf[..n]);
                    while let Ok(Some(frame)) = decoder.decode(&mut input) {
                        let name = frame
                            .elements()
                            .and_then(<[Frame]>::first)
                            .map(text)
                            .unwrap_or_default();
                        let answer = if name.eq_ignore_ascii_case("ROLE") {
                            format!("*3\r\n${}\r\n{role}\r\n:0\r\n*0\r\n", role.len())
                        } else {
                            "+OK\r\n".to_owned()
                        };
                        if stream.write_all(answer.as_bytes()).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (port, heard)
}

const MASTER_PASSWORD: &str = "master-password-42";

fn heard_password(heard: &Mutex<Heard>) -> bool {
    let heard = heard.lock().expect("heard");
    heard
        .bytes
        .windows(MASTER_PASSWORD.len())
        .any(|window| window == MASTER_PASSWORD.as_bytes())
}

#[test]
fn a_node_a_sentinel_names_gets_no_password_until_it_says_master() {
    let (node_port, heard) = fake_node("slave");
    let liar = lying_sentinel(node_port);
    let runtime: Rt = Arc::new(SmolRuntime);
    let config = RedisConfig::sentinel(SERVICE, [("127.0.0.1", liar)])
        .with_auth(RedisAuth {
            username: None,
            password: MASTER_PASSWORD.to_owned(),
        })
        .with_connect_timeout(Duration::from_secs(2));
    smol::block_on(async {
        let mut node = Node::new("master", runtime.clone(), config, None);
        run_until(
            &runtime,
            &mut [&mut node],
            "two failed rounds",
            PATIENCE,
            |nodes| nodes[0].discovery_failures.len() >= 2,
        )
        .await;
        let error = &node.discovery_failures[0];
        assert!(
            matches!(
                &error.failures[..],
                [(
                    0,
                    SentinelError::NotMaster {
                        role: NodeRole::Replica,
                        ..
                    }
                )]
            ),
            "{error}"
        );
    });
    let connections = heard.lock().expect("heard").connections;
    assert!(
        connections >= 2,
        "the node was asked its role: {connections}"
    );
    assert!(
        !heard_password(&heard),
        "the node the sentinel named got the password: {:?}",
        String::from_utf8_lossy(&heard.lock().expect("heard").bytes)
    );
}

#[test]
fn a_sentinel_that_names_a_node_outside_the_allowed_masters_is_refused_and_it_is_never_dialled() {
    // The node would say `master` and take the password.
    let (node_port, heard) = fake_node("master");
    let liar = lying_sentinel(node_port);
    let runtime: Rt = Arc::new(SmolRuntime);
    let config = RedisConfig::sentinel(SERVICE, [("127.0.0.1", liar)])
        .with_auth(RedisAuth {
            username: None,
            password: MASTER_PASSWORD.to_owned(),
        })
        .with_sentinel_allowed_masters(AllowedMasters::parse(["10.0.0.0/8"]).expect("parses"))
        .with_connect_timeout(Duration::from_secs(2));
    smol::block_on(async {
        let mut node = Node::new("master", runtime.clone(), config, None);
        run_until(
            &runtime,
            &mut [&mut node],
            "two failed rounds",
            PATIENCE,
            |nodes| nodes[0].discovery_failures.len() >= 2,
        )
        .await;
        let error = &node.discovery_failures[0];
        assert!(
            matches!(
                &error.failures[..],
                [(0, SentinelError::NotAllowed { addr })] if addr.port == node_port
            ),
            "{error}"
        );
        let message = &node.connect_failures[0];
        assert!(
            message.contains(&format!(
                "named 127.0.0.1:{node_port} as the master, which is not an allowed master"
            )),
            "{message}"
        );
        assert!(node.ready.is_empty());
    });
    let heard = heard.lock().expect("heard");
    assert_eq!(heard.connections, 0, "the node was dialled");
    assert!(heard.bytes.is_empty());
}

/// A sentinel that names the Redis on `master` and, to the first client
/// that subscribes, publishes `+switch-master` `count` times, `every`
/// apart, alternating between a node that does not exist and `master`
/// (the last one names `master`). Counts the questions it was asked.
fn flapping_sentinel(master: u16, count: usize, every: Duration) -> (u16, Arc<Mutex<usize>>) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a port");
    let own = listener.local_addr().expect("addr").port();
    let asked: Arc<Mutex<usize>> = Arc::default();
    let shared = asked.clone();
    let stormed = Arc::new(Mutex::new(false));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let (asked, stormed) = (shared.clone(), stormed.clone());
            std::thread::spawn(move || {
                let bulk = |text: &str| format!("${}\r\n{text}\r\n", text.len());
                let mut decoder = RespDecoder::new();
                let mut input = BytesMut::new();
                let mut buf = [0; 4096];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 {
                        return;
                    }
                    input.extend_from_slice(&buf[..n]);
                    while let Ok(Some(frame)) = decoder.decode(&mut input) {
                        let name = frame
                            .elements()
                            .and_then(<[Frame]>::first)
                            .map(text)
                            .unwrap_or_default()
                            .to_ascii_uppercase();
                        let answer = match name.as_str() {
                            "SENTINEL" => {
                                *asked.lock().expect("asked") += 1;
                                format!("*2\r\n{}{}", bulk("127.0.0.1"), bulk(&master.to_string()))
                            }
                            "SUBSCRIBE" => {
                                format!(
                                    "*3\r\n{}{}:1\r\n",
                                    bulk("subscribe"),
                                    bulk("+switch-master")
                                )
                            }
                            "PING" => format!("*2\r\n{}{}", bulk("pong"), bulk("")),
                            _ => "+OK\r\n".to_owned(),
                        };
                        if stream.write_all(answer.as_bytes()).is_err() {
                            return;
                        }
                        let first = name == "SUBSCRIBE"
                            && !std::mem::replace(&mut *stormed.lock().expect("storm"), true);
                        if !first {
                            continue;
                        }
                        let (real, bogus) = (format!("127.0.0.1 {master}"), "127.0.0.1 1");
                        for n in 0..count {
                            std::thread::sleep(every);
                            let (from, to) = if (count - n) % 2 == 1 {
                                (bogus, real.as_str())
                            } else {
                                (real.as_str(), bogus)
                            };
                            let payload = format!("{SERVICE} {from} {to}");
                            let message = format!(
                                "*3\r\n{}{}{}",
                                bulk("message"),
                                bulk("+switch-master"),
                                bulk(&payload)
                            );
                            if stream.write_all(message.as_bytes()).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    (own, asked)
}

#[test]
fn a_storm_of_switch_master_messages_is_not_a_storm_of_reconnections() {
    let redis = RedisServer::start();
    const SWITCHES: usize = 60;
    let every = Duration::from_millis(25);
    let (sentinel, asked) = flapping_sentinel(redis.port(), SWITCHES, every);
    let runtime: Rt = Arc::new(SmolRuntime);
    let config = RedisConfig::sentinel(SERVICE, [("127.0.0.1", sentinel)])
        .with_connect_timeout(Duration::from_secs(2));
    smol::block_on(async {
        let mut node = Node::new("master", runtime.clone(), config, None);
        run_until(
            &runtime,
            &mut [&mut node],
            "ready and watching",
            PATIENCE,
            |nodes| !nodes[0].ready.is_empty() && nodes[0].watching > 0,
        )
        .await;
        let found_before = node.found.len();
        let asked_before = *asked.lock().expect("asked");
        // The storm, then the holdoff, then time to settle.
        let storm = every * SWITCHES as u32;
        common::nodes::run_for(
            &runtime,
            &mut [&mut node],
            storm + 2 * SentinelEvent::SWITCH_HOLDOFF + Duration::from_millis(500),
        )
        .await;
        run_until(
            &runtime,
            &mut [&mut node],
            "ready again",
            PATIENCE,
            |nodes| nodes[0].client.is_ready(),
        )
        .await;
        let found = node.found.len() - found_before;
        let asked = *asked.lock().expect("asked") - asked_before;
        eprintln!(
            "{SWITCHES} switches over {} ms: {} reported, {found} links found the master again, \
             {asked} questions to the sentinel",
            storm.as_millis(),
            node.switches.len()
        );
        // One action per holdoff at most: at the first switch, then at
        // most once per second of the storm and once after it, each
        // reconnecting both links.
        let actions = 1 + storm.as_secs() as usize + 2;
        assert!(
            node.switches.len() <= actions,
            "{} switches reported",
            node.switches.len()
        );
        assert!(found <= 2 * actions, "{found} reconnections");
        assert!(asked <= 2 * actions, "{asked} questions");
        assert_eq!(
            node.switches.last().map(|(_, to)| to.port),
            Some(redis.port()),
            "the last switch is the one that holds"
        );
    });
}
