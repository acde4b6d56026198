//! The demo's stage, apart from its story (`main.rs`): a redis-server of
//! its own, the admin connection that cuts a worker off (`CLIENT KILL`),
//! and the observer that follows the tasks' reports and prints them.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::process::{Child, Command as Process, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use smol::Timer;
use smol::channel::{Receiver, Sender};
use smol::io::{AsyncReadExt, AsyncWriteExt};
use synapse_replication::config::RedisConfig;
use synapse_replication::positions::{CatchUpRequest, RowOrigin};
use synapse_replication::resp::{self, Frame};
use synapse_replication::wire::{StreamName, Token};

use super::{BACK_AFTER, CUT_AFTER, Log, Result, STREAMS, ToMaster};

/// Chooses the transport: `redis`, `tcp`, or unset (Redis if installed).
const TRANSPORT_VAR: &str = "SYNAPSE_REPLICATION_DEMO_TRANSPORT";
/// The longest any step may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(15);

/// How the processes talk, and how one of them is cut off.
pub enum Transport {
    /// Through a redis-server of the demo's own (killed when dropped),
    /// with an admin connection to it.
    Redis(Box<RedisStage>),
    /// Direct TCP on loopback: master's server closes the connection.
    Tcp,
}

/// A redis-server of the demo's own, an admin connection to it, and how
/// the processes reach it.
pub struct RedisStage {
    _server: RedisServer,
    admin: Admin,
    config: RedisConfig,
}

impl Transport {
    /// Redis if asked for, or if not asked for and installed; says which.
    pub async fn choose() -> Result<Transport> {
        let choice = std::env::var(TRANSPORT_VAR).unwrap_or_default();
        let redis = match choice.as_str() {
            "tcp" => {
                println!("transport: direct TCP on loopback ({TRANSPORT_VAR}=tcp)");
                None
            }
            "redis" => Some(
                RedisServer::start()
                    .await?
                    .ok_or("redis-server is not on PATH")?,
            ),
            "" => match RedisServer::start().await {
                Ok(Some(redis)) => Some(redis),
                Ok(None) => {
                    println!("transport: direct TCP on loopback (redis-server is not on PATH)");
                    None
                }
                Err(error) => {
                    println!(
                        "transport: direct TCP on loopback (redis-server did not start: {error})"
                    );
                    None
                }
            },
            other => return Err(format!("{TRANSPORT_VAR}={other:?}: use redis or tcp").into()),
        };
        let Some((server, mut admin)) = redis else {
            return Ok(Transport::Tcp);
        };
        println!(
            "transport: Redis pub/sub, through a redis-server {} of the demo's own on \
             127.0.0.1:{} (killed at the end)",
            admin.version().await?,
            server.port
        );
        let config = RedisConfig::tcp("127.0.0.1", server.port);
        Ok(Transport::Redis(Box::new(RedisStage {
            _server: server,
            admin,
            config,
        })))
    }

    /// Where Redis is, over Redis.
    pub fn redis_config(&self) -> Option<&RedisConfig> {
        match self {
            Transport::Redis(redis) => Some(&redis.config),
            Transport::Tcp => None,
        }
    }

    /// Closes `name`'s connections from the other end (Redis: `CLIENT
    /// KILL`; TCP: master's server); says how.
    pub async fn cut(&mut self, name: &str, to_master: &Sender<ToMaster>) -> Result<String> {
        match self {
            Transport::Redis(redis) => {
                let ids = redis.admin.kill_connections_of(name).await?;
                Ok(format!(
                    "CLIENT KILL ID {} closed its two Redis connections",
                    ids.join(" / ID ")
                ))
            }
            Transport::Tcp => {
                let (done, is_done) = smol::channel::bounded(1);
                to_master
                    .send(ToMaster::Close {
                        name: name.into(),
                        done,
                    })
                    .await?;
                is_done.recv().await??;
                Ok("master's server closed its connection".to_owned())
            }
        }
    }
}

/// The last token of each stream in the log.
pub fn log_tips(log: &Mutex<Log>) -> Result<BTreeMap<StreamName, Token>> {
    let log = log.lock().map_err(|_| "the log's lock is poisoned")?;
    Ok(log
        .iter()
        .map(|(stream, rows)| (stream.clone(), rows.last().map_or(Token(0), |r| r.0)))
        .collect())
}

/// "10 caches rows and 6 typing rows" for rounds `first..=last`.
fn describe_rounds(log: &Mutex<Log>, first: i64, last: i64) -> Result<String> {
    let log = log.lock().map_err(|_| "the log's lock is poisoned")?;
    Ok(count_rows(&log, |token| (first..=last).contains(&token.0)))
}

/// "30 caches rows and 20 typing rows": the rows of `log` whose token is
/// kept.
pub fn count_rows(log: &Log, keep: impl Fn(Token) -> bool) -> String {
    let counts: Vec<String> = STREAMS
        .iter()
        .map(|stream| {
            let rows = log.get(stream).map_or(&[][..], Vec::as_slice);
            let count = rows.iter().filter(|(token, _)| keep(*token)).count();
            format!("{count} {stream} rows")
        })
        .collect();
    counts.join(" and ")
}

/// What the tasks tell `run`, which prints the story.
pub enum Report {
    /// A process is ready; for a TCP server, its address.
    Ready {
        name: &'static str,
        what: String,
        addr: Option<String>,
    },
    /// A worker reached `token` on `stream` (rows applied, or a position).
    At {
        name: &'static str,
        stream: StreamName,
        token: Token,
        rows: usize,
        source: RowOrigin,
    },
    /// A worker fetches rows it missed.
    CatchUp {
        name: &'static str,
        request: CatchUpRequest,
    },
    /// Something to print as is.
    Note(String),
}

/// Follows the tasks' reports: who is ready, who reached which token.
pub struct Observer {
    reports: Receiver<Report>,
    /// Ready processes, with the TCP server's address.
    pub readies: HashMap<&'static str, Option<String>>,
    at: HashMap<(&'static str, StreamName), Token>,
    /// Catch-ups since the rounds being printed began.
    fetched_in_rounds: usize,
    /// Catch-ups under way: the request and the rows fetched so far.
    catching_up: HashMap<(&'static str, StreamName), (CatchUpRequest, usize)>,
}

impl Observer {
    pub fn new(reports: Receiver<Report>) -> Observer {
        Observer {
            reports,
            readies: HashMap::new(),
            fetched_in_rounds: 0,
            at: HashMap::new(),
            catching_up: HashMap::new(),
        }
    }

    fn at(&self, name: &'static str, stream: &StreamName) -> Option<Token> {
        self.at.get(&(name, stream.clone())).copied()
    }

    /// The TCP server's address, once master reported it.
    pub fn tcp_addr(&self) -> Option<String> {
        self.readies.get("master").cloned().flatten()
    }

    /// What master wrote in the rounds that end with `round`, and who got
    /// it.
    pub fn print_rounds(&self, round: i64, log: &Mutex<Log>, transport: &Transport) -> Result<()> {
        let first = match round {
            CUT_AFTER => 1,
            BACK_AFTER => CUT_AFTER + 1,
            _ => BACK_AFTER + 1,
        };
        let wrote = describe_rounds(log, first, round)?;
        let who = if round == BACK_AFTER {
            let worker2 = |stream: &StreamName| self.at("worker2", stream).unwrap_or(Token(0));
            let nobody = match transport {
                Transport::Redis(_) => "Redis keeps nothing for an absent subscriber",
                Transport::Tcp => "the server has no connection to send them on",
            };
            format!(
                "only worker1 got them: {nobody} (worker2 is still at caches {}, typing {})",
                worker2(&StreamName::Caches),
                worker2(&StreamName::Typing)
            )
        } else if self.fetched_in_rounds == 0 {
            "both workers applied each live".to_owned()
        } else {
            // A REPLICATE heard just before (a worker's own, or the
            // other's, answered after these rows) makes a writer's next row
            // a catch-up: a loaded machine shows it.
            format!(
                "both workers have them, {} fetched rather than applied live (a REPLICATE came just before)",
                self.fetched_in_rounds
            )
        };
        println!("rounds {first}-{round}: master wrote {wrote}; {who}");
        Ok(())
    }

    /// Rounds start: catch-ups from now on are counted for
    /// [`print_rounds`](Self::print_rounds).
    pub fn begin_rounds(&mut self) {
        self.fetched_in_rounds = 0;
    }

    pub fn reached(&self, name: &'static str, tips: &BTreeMap<StreamName, Token>) -> bool {
        tips.iter()
            .all(|(stream, tip)| self.at(name, stream).is_some_and(|at| at >= *tip))
    }

    /// Handles reports, printing the story, until `done`.
    pub async fn wait_until(&mut self, what: &str, done: impl Fn(&Observer) -> bool) -> Result<()> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        while !done(self) {
            let report = smol::future::or(async { self.reports.recv().await.ok() }, async {
                Timer::at(deadline).await;
                None
            })
            .await;
            let Some(report) = report else {
                return Err(format!("gave up waiting for {what} after {STEP_TIMEOUT:?}").into());
            };
            self.handle(report);
        }
        Ok(())
    }

    fn handle(&mut self, report: Report) {
        match report {
            Report::Ready { name, what, addr } => {
                let again = self.readies.insert(name, addr).is_some();
                let again = if again { " again" } else { "" };
                println!("{name}: ready{again}: {what}");
            }
            Report::At {
                name,
                stream,
                token,
                rows,
                source,
            } => {
                let key = (name, stream.clone());
                let at = self.at.entry(key.clone()).or_insert(token);
                *at = (*at).max(token);
                if let Some((request, fetched)) = self.catching_up.get_mut(&key) {
                    if source == RowOrigin::CatchUp {
                        *fetched += rows;
                    }
                    if token >= request.to {
                        println!("{name}: caught up {fetched} {stream} rows, now at {token}");
                        self.catching_up.remove(&key);
                    }
                }
            }
            Report::CatchUp { name, request } => {
                self.fetched_in_rounds += 1;
                println!(
                    "{name}: {} is at {} {}, past its {}: fetching ({}, {}] from {}'s log",
                    request.writer,
                    request.stream,
                    request.to,
                    request.from,
                    request.from,
                    request.to,
                    request.writer
                );
                self.catching_up
                    .insert((name, request.stream.clone()), (request, 0));
            }
            Report::Note(line) => println!("{line}"),
        }
    }
}

/// A redis-server of the demo's own, killed when dropped.
pub struct RedisServer {
    child: Child,
    port: u16,
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RedisServer {
    /// Starts `redis-server` on a free loopback port, without persistence,
    /// and connects to it; `None` if it is not on `PATH`.
    async fn start() -> Result<Option<(RedisServer, Admin)>> {
        let mut failure = String::from("no free port");
        for _attempt in 0..3 {
            // A port the OS says is free; redis-server may still lose it to
            // another process, and then exits: try another.
            let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
                .local_addr()?
                .port();
            if port == 6379 {
                continue;
            }
            let child = Process::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(std::env::temp_dir())
                .args(["--dbfilename", &format!("demo-{}.rdb", std::process::id())])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn();
            let child = match child {
                Ok(child) => child,
                Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(error) => return Err(format!("starting redis-server: {error}").into()),
            };
            let mut server = RedisServer { child, port };
            let deadline = Instant::now() + Duration::from_secs(5);
            failure = "it did not answer within 5 s".into();
            while Instant::now() < deadline {
                if let Some(status) = server.child.try_wait()? {
                    failure = format!("it exited ({status})");
                    break;
                }
                if let Ok(mut admin) = Admin::connect(port).await {
                    if admin.call(&["PING"]).await.is_ok() {
                        return Ok(Some((server, admin)));
                    }
                }
                Timer::after(Duration::from_millis(20)).await;
            }
        }
        Err(failure.into())
    }
}

/// A plain connection to Redis for admin commands, through the crate's
/// RESP encoder and decoder.
pub struct Admin {
    stream: smol::net::TcpStream,
    decoder: resp::RespDecoder,
    input: BytesMut,
}

impl Admin {
    async fn connect(port: u16) -> io::Result<Admin> {
        Ok(Admin {
            stream: smol::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await?,
            decoder: resp::RespDecoder::new(),
            input: BytesMut::new(),
        })
    }

    /// Sends a command, returns the reply (an error reply is an error).
    async fn call(&mut self, args: &[&str]) -> Result<Frame> {
        timeout(
            &format!("redis-server to answer {}", args.join(" ")),
            async {
                let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
                let mut out = BytesMut::new();
                resp::encode_command(&mut out, &args);
                self.stream.write_all(&out).await?;
                let mut chunk = [0; 4096];
                loop {
                    if let Some(frame) = self.decoder.decode(&mut self.input)? {
                        return match frame.as_error() {
                            Some(error) => Err(String::from_utf8_lossy(error).into()),
                            None => Ok(frame),
                        };
                    }
                    let n = self.stream.read(&mut chunk).await?;
                    if n == 0 {
                        return Err("redis-server closed the admin connection".into());
                    }
                    self.input
                        .extend_from_slice(chunk.get(..n).unwrap_or_default());
                }
            },
        )
        .await
    }

    async fn text(&mut self, args: &[&str]) -> Result<String> {
        let frame = self.call(args).await?;
        let bytes = frame.as_bytes().ok_or("a text reply")?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    /// `redis_version` from `INFO server`.
    async fn version(&mut self) -> Result<String> {
        let info = self.text(&["INFO", "server"]).await?;
        Ok(info
            .lines()
            .find_map(|line| line.strip_prefix("redis_version:"))
            .unwrap_or("(unknown version)")
            .to_owned())
    }

    /// Kills the connections a session named `name` opened (`<name>-sub`
    /// and `<name>-pub`, see `RedisSessionConfig::client_name`); returns their ids.
    async fn kill_connections_of(&mut self, name: &str) -> Result<Vec<String>> {
        let names = [format!("name={name}-sub"), format!("name={name}-pub")];
        let list = self.text(&["CLIENT", "LIST"]).await?;
        let ids: Vec<String> = list
            .lines()
            .filter(|line| {
                line.split(' ')
                    .any(|field| names.iter().any(|n| n == field))
            })
            .filter_map(|line| line.split(' ').find_map(|f| f.strip_prefix("id=")))
            .map(str::to_owned)
            .collect();
        if ids.len() != 2 {
            return Err(format!("{name} has {} connections, not 2: {list}", ids.len()).into());
        }
        for id in &ids {
            let killed = self.call(&["CLIENT", "KILL", "ID", id]).await?;
            if killed.as_integer() != Some(1) {
                return Err(format!("CLIENT KILL ID {id} answered {killed:?}").into());
            }
        }
        Ok(ids)
    }
}

/// `future`, or an error after [`STEP_TIMEOUT`].
async fn timeout<T>(what: &str, future: impl Future<Output = Result<T>>) -> Result<T> {
    smol::future::or(future, async {
        Timer::after(STEP_TIMEOUT).await;
        Err(format!("gave up waiting for {what} after {STEP_TIMEOUT:?}").into())
    })
    .await
}
