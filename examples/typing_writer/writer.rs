//! The typing writer's logic: who is typing where, with Synapse's
//! timeouts (`TypingWriterHandler`), the client API route that changes it,
//! the typing EDUs Synapse forwards from federation, the `typing` rows it
//! publishes, and the catch-up it serves. Used by `main.rs`, by
//! `tests/typing_writer.rs` and by `tests/typing_federation.rs`.

// Some accessors are read only by the tests.
#![allow(dead_code)]

// Beside this file, however this file was reached (`main.rs`, a test's
// `#[path]`).
#[path = "federation.rs"]
pub mod federation;
#[path = "hosts.rs"]
pub mod hosts;
#[path = "restart.rs"]
pub mod restart;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use synapse_replication::positions::{BoxError, FollowerEvent};
use synapse_replication::session::RedisEvent;

use futures::{AsyncReadExt, AsyncWriteExt, FutureExt};
use serde_json::{Map, Value, json};
use synapse_replication::config::SynapseConfig;
use synapse_replication::http::{
    CatchUpEndpoint, ReplicationEndpoint, ReplicationError, ReplicationRequest,
};
use synapse_replication::positions::{CatchUpPage, CatchUpRequest, History, HistoryMode};
use synapse_replication::transport::{
    CatchUpSource, CommandSender, HttpRequest, HttpResponse, HttpServer, HttpServerCounters,
    RedisClient, SmolRuntime, async_trait,
};
use synapse_replication::wire::{InstanceName, RawRow, StreamName, Token};

/// Synapse's default typing timeout (`RoomTypingRestServlet`), ms.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
/// The longest timeout Synapse accepts, ms.
pub const MAX_TIMEOUT_MS: u64 = 120_000;
/// How often timeouts are checked (`FollowerTypingHandler`'s looping call).
pub const TIMEOUT_CHECK: Duration = Duration::from_secs(5);
/// How long a token's user, and a membership, are trusted (the servers
/// in a room are forgotten sooner when a membership event arrives).
const AUTH_CACHE: Duration = Duration::from_secs(5);
/// Tokens, and (room, user) memberships, remembered at once, at most.
const CACHED: usize = 1024;
/// Rooms whose servers are remembered at once, at most.
const HOSTS_CACHED: usize = 10_000;
/// The largest answer read from the homeserver (a big room's member
/// list); a longer one is an error, never a truncated list.
const HOMESERVER_ANSWER_MAX: u64 = 16 << 20;
/// Rows of history kept (older ranges are answered per room).
const HISTORY_ROWS: usize = 10_000;
/// Answers kept in [`TypingWriter::answered`].
const ANSWERED_KEPT: usize = 1000;
/// Requests kept in [`TypingWriter::served`].
const SERVED_KEPT: usize = 1000;

/// Who the writer is and where it listens.
#[derive(Clone)]
pub struct Options {
    /// The deployment's config (server name, Redis, `stream_writers`,
    /// `instance_map`, `worker_replication_secret`).
    pub synapse: SynapseConfig,
    /// This process's instance name (`stream_writers.typing`).
    pub instance: String,
    /// The homeserver's client API, to check access tokens and
    /// memberships (`http://127.0.0.1:8008`).
    pub homeserver: String,
    /// A server admin's access token on `homeserver`, for the admin API
    /// that says which servers are in a room (inbound federation typing).
    /// Not needed, and not used, when `synapse` has a `database` section:
    /// the servers are then read from Synapse's database.
    pub admin_token: Option<String>,
    /// Where the writer keeps its last token and the rooms with someone
    /// typing (`--state FILE`), so that a restart starts above the old
    /// run's tokens and clears what it left shown (see `restart.rs`).
    pub state: Option<PathBuf>,
}

// By hand: the admin token never shows (the config redacts its secrets).
impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("synapse", &self.synapse)
            .field("instance", &self.instance)
            .field("homeserver", &self.homeserver)
            .field(
                "admin_token",
                &self.admin_token.as_ref().map(|_| "<redacted>"),
            )
            .field("state", &self.state)
            .finish()
    }
}

/// The state of typing: `TypingWriterHandler`'s, in Rust.
#[derive(Debug, Default)]
struct Typing {
    /// The stream's token: one per change, from the run's start token
    /// (never below the previous run's: `restart.rs`).
    serial: i64,
    /// Where `serial` and the rooms with someone typing are saved on each
    /// change.
    state: Option<restart::StateFile>,
    /// The rooms cleared at start, kept in the state file until the first
    /// announcement (a crash before it clears them again next time).
    unannounced: BTreeSet<String>,
    /// Who is typing in each room.
    rooms: HashMap<String, BTreeSet<String>>,
    /// When each (room, user) stops.
    until: HashMap<(String, String), Instant>,
}

/// The writer: shared by the HTTP handler, the timeout task and the
/// Redis task.
pub struct TypingWriter {
    instance: InstanceName,
    homeserver: String,
    typing: Mutex<Typing>,
    /// Writes through the Redis client's task: each row is published and
    /// kept in the history the catch-up server answers from.
    rows: CommandSender,
    /// The user of each access token the homeserver accepted lately,
    /// keyed by the token's [`TokenKey`]: a client's token is up to 64
    /// KiB, and need not stay in memory.
    auth: Mutex<Expiring<TokenKey, String>>,
    /// Keys the tokens, unpredictably for a client.
    token_hasher: [RandomState; 2],
    members: Mutex<Expiring<(String, String), bool>>,
    /// This homeserver's name, to check that it is in a room.
    server_name: String,
    /// Where the servers in a room are read: Synapse's database, or the
    /// admin API's room members with a server admin's token.
    hosts_source: hosts::HostsSource,
    /// The servers with a joined user, per room.
    hosts: Mutex<Expiring<String, Hosts>>,
    /// What became of the forwarded EDUs.
    pub edus: EduCounters,
    /// The latest catch-up requests served, for tests and logs.
    pub served: Arc<Mutex<VecDeque<CatchUpRequest>>>,
    /// The latest requests of other routes, as `(method, path, status)`:
    /// what Synapse calls on a typing writer, for tests and logs.
    pub answered: Mutex<VecDeque<(String, String, u16)>>,
}

/// The servers with a joined user in a room.
type Hosts = Arc<BTreeSet<String>>;

/// An access token's 128-bit keyed hash: with random keys per process,
/// no client can make its token share another's entry, and no two
/// tokens do by chance.
type TokenKey = (u64, u64);

/// Answers trusted for a while, at most `capacity` of them: what a client
/// can make the writer remember (a room id per request, say) stays
/// bounded. When full, the expired ones go; if that frees less than
/// half, all go, so that a flood costs lookups again, not a scan per
/// request.
#[derive(Debug)]
struct Expiring<K, V> {
    entries: HashMap<K, (Instant, V)>,
    capacity: usize,
    ttl: Duration,
}

impl<K: std::hash::Hash + Eq, V: Clone> Expiring<K, V> {
    fn new(capacity: usize, ttl: Duration) -> Self {
        Expiring {
            entries: HashMap::new(),
            capacity,
            ttl,
        }
    }

    fn get(&self, key: &K) -> Option<V> {
        let (at, value) = self.entries.get(key)?;
        (at.elapsed() < self.ttl).then(|| value.clone())
    }

    fn insert(&mut self, key: K, value: V) {
        if self.entries.len() >= self.capacity {
            let ttl = self.ttl;
            self.entries.retain(|_, (at, _)| at.elapsed() < ttl);
            if self.entries.len() >= self.capacity / 2 {
                self.entries.clear();
            }
        }
        self.entries.insert(key, (Instant::now(), value));
    }

    fn remove(&mut self, key: &K) {
        self.entries.remove(key);
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// What became of the typing EDUs Synapse forwarded.
#[derive(Debug, Default)]
pub struct EduCounters {
    /// Applied: the user's typing started or stopped.
    pub applied: AtomicU64,
    /// Answered, not applied: by Synapse's rules (a user not of the
    /// origin, a server not in the room) or because the membership could
    /// not be checked.
    pub ignored: AtomicU64,
    /// Refused as malformed (4xx).
    pub refused: AtomicU64,
}

impl EduCounters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// `(applied, ignored, refused)` so far (a retried txn id is answered
    /// by the server and reaches none).
    pub fn get(&self) -> (u64, u64, u64) {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        (get(&self.applied), get(&self.ignored), get(&self.refused))
    }
}

/// Whether a forwarded EDU may be applied (`_recv_edu`'s checks).
enum Verdict {
    /// Every check passed.
    Apply,
    /// Synapse would drop it too: answered and remembered, not applied.
    Ignore(String),
    /// The checks could not be made: answered but not remembered (a
    /// retry is checked again), not applied.
    Unchecked(String),
}

/// The history, recording what it is asked.
struct Served {
    history: Arc<Mutex<History>>,
    served: Arc<Mutex<VecDeque<CatchUpRequest>>>,
}

#[async_trait]
impl CatchUpSource for Served {
    async fn fetch(&self, request: CatchUpRequest) -> Result<CatchUpPage, BoxError> {
        eprintln!("typing writer: serving {request}");
        {
            let mut served = lock(&self.served);
            if served.len() >= SERVED_KEPT {
                served.pop_front();
            }
            served.push_back(request.clone());
        }
        self.history.fetch(request).await
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// A running writer: its address and counters. The tasks run on smol's
/// global executor until the process ends, or until [`Running::stop`].
pub struct Running {
    /// The writer.
    pub writer: Arc<TypingWriter>,
    /// Where its replication listener (catch-up, `fed_send_edu`) is.
    pub addr: SocketAddr,
    /// Where its client API listener (the typing route) is.
    pub client_addr: SocketAddr,
    /// What the replication HTTP server did.
    pub counters: HttpServerCounters,
    /// The HTTP servers, the Redis client and the timeouts.
    tasks: Vec<smol::Task<()>>,
}

impl Running {
    /// Stops the writer as a process exit would: the listener closes, the
    /// Redis connections drop, nothing more is written (the state file
    /// stays as the last change left it).
    pub async fn stop(mut self) {
        for task in std::mem::take(&mut self.tasks) {
            task.cancel().await;
        }
    }
}

impl Drop for Running {
    /// Dropped without [`Running::stop`]: the tasks go on.
    fn drop(&mut self) {
        for task in self.tasks.drain(..) {
            task.detach();
        }
    }
}

/// Starts the writer: the replication listener on `listen`, the client
/// API's on `client_listen`, the Redis client, and the timeout task, each
/// on smol's executor.
///
/// Two listeners, so that the public typing route (anyone the reverse
/// proxy lets through) never contends with Synapse's processes for the
/// replication server's slots: each server bounds its own connections.
///
/// Its tokens start above the previous run's (`restart.rs`): at
/// `max(saved + 1, ms since the epoch)`, `saved` from the state file. The
/// rooms the previous run left with someone typing get a row `[room, []]`
/// each, at the next tokens, before anything is served: kept in the
/// history, they are what a follower at an older token fetches after the
/// first connection's `POSITION typing <instance> <cur> <cur>`.
pub async fn start(options: Options, listen: &str, client_listen: &str) -> io::Result<Running> {
    let instance = InstanceName::from(options.instance.as_str());
    let history = Arc::new(Mutex::new(
        History::new(HISTORY_ROWS).with_mode(StreamName::Typing, HistoryMode::Keyed { key_len: 1 }),
    ));
    let served = Arc::new(Mutex::new(VecDeque::new()));
    let mut client = RedisClient::follow(SmolRuntime, &options.synapse, instance.clone())
        .map_err(io::Error::other)?
        .with_history(history.clone());
    let typing = restarted(&mut client, options.state.clone())?;
    let writer = Arc::new(TypingWriter {
        instance: instance.clone(),
        homeserver: options.homeserver.trim_end_matches('/').to_owned(),
        typing: Mutex::new(typing),
        rows: client.sender(),
        auth: Mutex::new(Expiring::new(CACHED, AUTH_CACHE)),
        token_hasher: [RandomState::new(), RandomState::new()],
        members: Mutex::new(Expiring::new(CACHED, AUTH_CACHE)),
        server_name: options.synapse.server_name().to_owned(),
        hosts_source: hosts::HostsSource::open(&options.synapse, options.admin_token.clone())
            .await?,
        hosts: Mutex::new(Expiring::new(HOSTS_CACHED, AUTH_CACHE)),
        edus: EduCounters::default(),
        served: served.clone(),
        answered: Mutex::new(VecDeque::new()),
    });

    if writer.hosts_source.is_none() {
        eprintln!(
            "typing writer: no database section and no admin token: typing EDUs from federation \
             are answered but not applied, for the servers in a room cannot be checked"
        );
    }

    let secret = options.synapse.replication_secret().map(str::to_owned);
    let endpoint =
        CatchUpEndpoint::new(instance.clone(), secret.clone()).with_streams([StreamName::Typing]);
    let source = Arc::new(Served { history, served });
    let handler_writer = writer.clone();
    let unserved_writer = writer.clone();
    let edu_writer = writer.clone();
    let position_writer = writer.clone();
    // fed_send_edu: the server checks the secret and the body, waits until
    // this process has seen what the caller wrote (its membership events,
    // say), answers a retried txn id without calling the handler again,
    // and each answer carries the typing position, which the caller waits
    // for.
    let server = HttpServer::bind(SmolRuntime, listen, endpoint, source.clone())
        .await?
        .with_writers(options.synapse.writers().clone())
        .with_endpoint(ReplicationEndpoint::fed_send_edu(), move |call| {
            let writer = edu_writer.clone();
            async move { writer.fed_send_edu(call).await }.boxed()
        })
        .with_positions(move || vec![(StreamName::Typing, position_writer.token())])
        .with_waiter(client.waiter())
        .with_handler(move |request| {
            let response = unserved_writer.unserved(request);
            async move { response }.boxed()
        });
    // The client API: no stream is served there (a catch-up is refused
    // 400, after the secret), only the typing route.
    let client_endpoint = CatchUpEndpoint::new(instance.clone(), secret).with_streams([]);
    let client_server = HttpServer::bind(SmolRuntime, client_listen, client_endpoint, source)
        .await?
        .with_handler(move |request| {
            let writer = handler_writer.clone();
            async move { writer.answer(request).await }.boxed()
        });
    let addr = server.local_addr()?;
    let client_addr = client_server.local_addr()?;
    let counters = server.counters();
    let tasks = vec![
        smol::spawn(server.run()),
        smol::spawn(client_server.run()),
        smol::spawn(redis_task(client, writer.clone())),
        smol::spawn(timeout_task(writer.clone())),
    ];
    Ok(Running {
        writer,
        addr,
        client_addr,
        counters,
        tasks,
    })
}

/// The typing state a run starts with: its start token, written to
/// `client` (the history begins there), and a row clearing each room the
/// previous run left with someone typing, at the tokens after it
/// (recorded, and sent by the first connection's announcement). The state
/// file is written with the new token before anything is served; one that
/// cannot be written stops the start (the next restart would not know
/// this run's tokens).
fn restarted(client: &mut RedisClient<SmolRuntime>, state: Option<PathBuf>) -> io::Result<Typing> {
    let state = state.map(restart::StateFile::new);
    let saved = match state.as_ref().map(restart::StateFile::load) {
        Some(Ok(saved)) => saved,
        Some(Err(error)) => {
            // Taken as lost: the clock still keeps tokens moving forward.
            eprintln!("typing writer: state file unreadable, starting from the clock: {error}");
            None
        }
        None => None,
    };
    let start = restart::start_token(
        saved.as_ref().map(|saved| saved.token),
        restart::clock_floor(SystemTime::now()),
    );
    client
        .advance(&StreamName::Typing, Token(start))
        .map_err(io::Error::other)?;
    let mut typing = Typing {
        serial: start,
        state,
        unannounced: saved.map(|saved| saved.rooms).unwrap_or_default(),
        ..Typing::default()
    };
    for room in &typing.unannounced {
        typing.serial += 1;
        let token = Token(typing.serial);
        let row = RawRow::from_value(&json!([room, []])).map_err(io::Error::other)?;
        client
            .write(&StreamName::Typing, token, [(token, row)])
            .map_err(io::Error::other)?;
    }
    eprintln!(
        "typing writer: starting at typing token {start}, clearing {} room(s) left typing",
        typing.unannounced.len()
    );
    typing.save()?;
    Ok(typing)
}

impl Typing {
    /// Saves the token and the rooms a restart must clear: those with
    /// someone typing, and those cleared at start and not yet announced.
    fn save(&self) -> io::Result<()> {
        let Some(file) = &self.state else {
            return Ok(());
        };
        let typing = self
            .rooms
            .iter()
            .filter(|(_, users)| !users.is_empty())
            .map(|(room, _)| room.as_str());
        let unannounced = self.unannounced.iter().map(String::as_str);
        file.save(self.serial, typing.chain(unannounced))
            .map_err(|error| io::Error::other(format!("{}: {error}", file.path().display())))
    }
}

/// Publishes what the other tasks write, and follows the deployment (to
/// clear typing of users who leave a room).
async fn redis_task(mut client: RedisClient<SmolRuntime>, writer: Arc<TypingWriter>) {
    while let Some(event) = client.next_event().await {
        match event {
            RedisEvent::Follower(FollowerEvent::Rows {
                stream: StreamName::Events,
                rows,
                ..
            }) => {
                for row in &rows {
                    let Some((room, user, membership)) = membership(row) else {
                        continue;
                    };
                    writer.forget_hosts(&room);
                    if membership != "join" {
                        writer.stopped(&room, &user);
                    }
                }
            }
            event @ RedisEvent::Ready => {
                eprintln!("typing writer: redis {event}");
                writer.announced();
            }
            event @ (RedisEvent::Disconnected { .. } | RedisEvent::WriteFailed { .. }) => {
                eprintln!("typing writer: redis {event}");
            }
            _ => {}
        }
    }
}

/// `(room, user, membership)` of an `m.room.member` event, if `row` of
/// the `events` stream is one.
fn membership(row: &RawRow) -> Option<(String, String, String)> {
    let row: Value = row.parse().ok()?;
    if row.get(0)?.as_str()? != "ev" {
        return None;
    }
    let data = row.get(1)?;
    // [event_id, room_id, type, state_key, redacts, relates_to, membership, ...]
    if data.get(2)?.as_str()? != "m.room.member" {
        return None;
    }
    Some((
        data.get(1)?.as_str()?.to_owned(),
        data.get(3)?.as_str()?.to_owned(),
        data.get(6)?.as_str()?.to_owned(),
    ))
}

/// Times out typing users, checking every 5 s as Synapse does.
async fn timeout_task(writer: Arc<TypingWriter>) {
    loop {
        smol::Timer::after(TIMEOUT_CHECK).await;
        writer.handle_timeouts(Instant::now());
    }
}

impl TypingWriter {
    /// The stream's current token.
    pub fn token(&self) -> Token {
        Token(lock(&self.typing).serial)
    }

    /// Who is typing in `room`, sorted.
    pub fn typing_in(&self, room: &str) -> Vec<String> {
        lock(&self.typing)
            .rooms
            .get(room)
            .map(|users| users.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// `started_typing`: a new typer is a change; one already typing only
    /// moves its timeout.
    pub fn started(&self, room: &str, user: &str, timeout: Duration, now: Instant) {
        let mut typing = lock(&self.typing);
        typing
            .until
            .insert((room.to_owned(), user.to_owned()), now + timeout);
        let users = typing.rooms.entry(room.to_owned()).or_default();
        if users.insert(user.to_owned()) {
            self.push(&mut typing, room);
        }
    }

    /// `stopped_typing` (and `user_left_room`): a change only if typing.
    pub fn stopped(&self, room: &str, user: &str) {
        let mut typing = lock(&self.typing);
        typing.until.remove(&(room.to_owned(), user.to_owned()));
        let removed = typing
            .rooms
            .get_mut(room)
            .is_some_and(|users| users.remove(user));
        if removed {
            self.push(&mut typing, room);
        }
    }

    /// Ends typing whose timeout passed.
    pub fn handle_timeouts(&self, now: Instant) {
        let expired: Vec<(String, String)> = lock(&self.typing)
            .until
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(member, _)| member.clone())
            .collect();
        for (room, user) in expired {
            eprintln!("typing writer: timing out typing for {user} in {room}");
            self.stopped(&room, &user);
        }
    }

    /// `_push_update_local`: the next token, the room's whole state as its
    /// row, written (published and kept for catch-up) in token order
    /// (under the lock).
    fn push(&self, typing: &mut Typing, room: &str) {
        typing.serial += 1;
        let token = Token(typing.serial);
        let users: Vec<&String> = typing.rooms.get(room).into_iter().flatten().collect();
        let Ok(row) = RawRow::from_value(&json!([room, users])) else {
            return;
        };
        if let Err(error) = self.rows.write(&StreamName::Typing, token, [(token, row)]) {
            // The Redis task is not keeping up: the token is not used, and
            // the room's next change carries its whole state.
            typing.serial -= 1;
            eprintln!("typing writer: typing {token} not written: {error}");
            return;
        }
        if let Err(error) = typing.save() {
            eprintln!("typing writer: state not saved: {error}");
        }
    }

    /// The first connection announced the start (`POSITION typing
    /// <instance> <cur> <cur>`, from which followers fetch the clearing
    /// rows): those rooms need not be cleared again by the next run.
    fn announced(&self) {
        let mut typing = lock(&self.typing);
        if typing.unannounced.is_empty() {
            return;
        }
        typing.unannounced.clear();
        if let Err(error) = typing.save() {
            eprintln!("typing writer: state not saved: {error}");
        }
    }

    /// A request to the client API's listener, answered and logged (an
    /// access log).
    pub async fn answer(&self, request: HttpRequest) -> HttpResponse {
        let (method, path) = (request.method.clone(), request.path.clone());
        let response = self.client_api(request).await;
        self.log_answer(method, path, response.status);
        response
    }

    /// A route of the replication listener that this writer does not
    /// serve (Synapse calling something of a typing writer), noted.
    pub fn unserved(&self, request: HttpRequest) -> HttpResponse {
        self.log_answer(request.method, request.path, 404);
        HttpResponse::error(404, "M_UNRECOGNIZED", "Unrecognized request")
    }

    fn log_answer(&self, method: String, path: String, status: u16) {
        eprintln!("typing writer: {method} {path} -> {status}");
        let mut answered = lock(&self.answered);
        if answered.len() >= ANSWERED_KEPT {
            answered.pop_front();
        }
        answered.push_back((method, path, status));
    }

    /// `POST /_synapse/replication/fed_send_edu/m.typing/<txn_id>`, once
    /// per txn id (the server checked the secret and the body, and answers
    /// retries itself): a typing EDU from a remote server, applied as
    /// `TypingWriterHandler._recv_edu` does, and answered 200 whatever the
    /// checks said (as Synapse answers): only a malformed EDU is refused.
    pub async fn fed_send_edu(
        &self,
        call: ReplicationRequest,
    ) -> Result<Map<String, Value>, ReplicationError> {
        let edu_type = call.arg("edu_type").unwrap_or_default().to_owned();
        let path = ReplicationEndpoint::fed_send_edu().path(&[&edu_type], call.txn_id.as_deref());
        let answer = self.receive_edu(&edu_type, &call.content).await;
        let status = answer
            .as_ref()
            .map_or_else(ReplicationError::status, |_| 200);
        self.log_answer("POST".into(), path, status);
        answer
    }

    async fn receive_edu(
        &self,
        edu_type: &str,
        content: &Map<String, Value>,
    ) -> Result<Map<String, Value>, ReplicationError> {
        let edu = match federation::parse(edu_type, content) {
            Ok(edu) => edu,
            Err(error) => {
                EduCounters::bump(&self.edus.refused);
                eprintln!("typing writer: refused a forwarded EDU: {error}");
                return Err(error.refusal());
            }
        };
        match self.check_edu(&edu).await {
            Verdict::Apply => {
                EduCounters::bump(&self.edus.applied);
                if edu.typing {
                    self.started(
                        &edu.room_id,
                        &edu.user_id,
                        federation::FEDERATION_TIMEOUT,
                        Instant::now(),
                    );
                } else {
                    self.stopped(&edu.room_id, &edu.user_id);
                }
            }
            Verdict::Ignore(why) => {
                EduCounters::bump(&self.edus.ignored);
                eprintln!(
                    "typing writer: ignoring typing of {} in {} from {}: {why}",
                    edu.user_id, edu.room_id, edu.origin
                );
            }
            Verdict::Unchecked(why) => {
                EduCounters::bump(&self.edus.ignored);
                eprintln!(
                    "typing writer: not applying typing of {} in {} from {}: {why}",
                    edu.user_id, edu.room_id, edu.origin
                );
            }
        }
        Ok(Map::new())
    }

    /// `_recv_edu`'s checks: the user is of the origin, and this server
    /// and the origin are both in the room. The servers in a room come
    /// from Synapse's database (`get_current_hosts_in_room`'s query) when
    /// the configuration has a `database` section, else from the admin
    /// API (`GET /_synapse/admin/v1/rooms/{roomId}/members`, the joined
    /// users, as `get_current_hosts_in_room` derives them): the client API
    /// shows a room's members only to a member, and no member's token is
    /// at hand for a remote user's EDU.
    async fn check_edu(&self, edu: &federation::TypingEdu) -> Verdict {
        if edu.user_server() != edu.origin {
            return Verdict::Ignore(format!("the user is not of the origin {}", edu.origin));
        }
        if self.hosts_source.is_none() {
            return Verdict::Unchecked(
                "no database section or admin token to check the room's servers".into(),
            );
        }
        let hosts = match self.hosts_in_room(&edu.room_id).await {
            Ok(hosts) => hosts,
            Err(error) => return Verdict::Unchecked(format!("room members: {error}")),
        };
        if !hosts.contains(&self.server_name) {
            Verdict::Ignore("this server is not in the room".into())
        } else if !hosts.contains(&edu.origin) {
            Verdict::Ignore("the origin is not in the room".into())
        } else {
            Verdict::Apply
        }
    }

    /// The servers with a joined user in `room` (none for a room the
    /// homeserver does not know), cached briefly.
    async fn hosts_in_room(&self, room: &str) -> io::Result<Hosts> {
        if let Some(hosts) = lock(&self.hosts).get(&room.to_owned()) {
            return Ok(hosts);
        }
        let admin_token = match &self.hosts_source {
            #[cfg(feature = "postgres")]
            hosts::HostsSource::Database(client) => {
                let hosts = Arc::new(hosts::HostsSource::from_database(client, room).await?);
                lock(&self.hosts).insert(room.to_owned(), hosts.clone());
                return Ok(hosts);
            }
            hosts::HostsSource::AdminApi(token) => token,
            hosts::HostsSource::None => return Ok(Arc::new(BTreeSet::new())),
        };
        let path = format!("/_synapse/admin/v1/rooms/{}/members", quote(room));
        let (status, body) = get(&self.homeserver, &path, admin_token).await?;
        let hosts: BTreeSet<String> = match status {
            200 => body
                .get("members")
                .and_then(Value::as_array)
                .ok_or_else(|| io::Error::other("room members answered without members"))?
                .iter()
                .filter_map(Value::as_str)
                .filter_map(|user| user.split_once(':').map(|(_, server)| server.to_owned()))
                .collect(),
            // An unknown room, or not a room id: no server is in it.
            400 | 404 => BTreeSet::new(),
            _ => {
                return Err(io::Error::other(format!(
                    "room members answered {status}: {body}"
                )));
            }
        };
        let hosts = Arc::new(hosts);
        lock(&self.hosts).insert(room.to_owned(), hosts.clone());
        Ok(hosts)
    }

    /// Forgets the servers of `room` (a membership changed).
    fn forget_hosts(&self, room: &str) {
        lock(&self.hosts).remove(&room.to_owned());
    }

    /// `PUT /_matrix/client/{v3,r0,unstable}/rooms/{roomId}/typing/{userId}`.
    pub async fn client_api(&self, request: HttpRequest) -> HttpResponse {
        let Some((room, user)) = typing_route(&request.path) else {
            return HttpResponse::error(404, "M_UNRECOGNIZED", "Unrecognized request");
        };
        if request.method != "PUT" {
            return HttpResponse::error(405, "M_UNRECOGNIZED", "Unrecognized request");
        }
        let Some(token) = request
            .header("authorization")
            .and_then(|value| value.strip_prefix(b"Bearer "))
            .and_then(|token| std::str::from_utf8(token).ok())
        else {
            return HttpResponse::error(401, "M_MISSING_TOKEN", "Missing access token");
        };
        let requester = match self.whoami(token).await {
            Ok(Some(user)) => user,
            Ok(None) => {
                return HttpResponse::error(401, "M_UNKNOWN_TOKEN", "Unknown access token");
            }
            Err(error) => {
                eprintln!("typing writer: whoami: {error}");
                return HttpResponse::error(502, "M_UNKNOWN", "Homeserver unreachable");
            }
        };
        let Ok(content) = serde_json::from_slice::<Value>(&request.body) else {
            return HttpResponse::error(400, "M_NOT_JSON", "Content not JSON.");
        };
        let Some(typing) = content.get("typing").and_then(Value::as_bool) else {
            return HttpResponse::error(400, "M_BAD_JSON", "Missing or invalid 'typing'");
        };
        if requester != user {
            return HttpResponse::error(400, "M_UNKNOWN", "Cannot set another user's typing state");
        }
        match self.is_member(token, &room, &user).await {
            Ok(true) => {}
            Ok(false) => {
                return HttpResponse::error(
                    403,
                    "M_FORBIDDEN",
                    &format!("User {user} not in room {room}"),
                );
            }
            Err(error) => {
                eprintln!("typing writer: joined_members: {error}");
                return HttpResponse::error(502, "M_UNKNOWN", "Homeserver unreachable");
            }
        }
        if typing {
            let timeout = content
                .get("timeout")
                .and_then(Value::as_u64)
                .unwrap_or(DEFAULT_TIMEOUT_MS)
                .min(MAX_TIMEOUT_MS);
            self.started(&room, &user, Duration::from_millis(timeout), Instant::now());
        } else {
            self.stopped(&room, &user);
        }
        HttpResponse::new(200, "{}")
    }

    /// The user of an access token (`None`: unknown token). A known
    /// token is cached briefly; an unknown one is not, so that made-up
    /// tokens cost a lookup each and take no memory.
    async fn whoami(&self, token: &str) -> io::Result<Option<String>> {
        let [first, second] = &self.token_hasher;
        let key = (first.hash_one(token), second.hash_one(token));
        if let Some(user) = lock(&self.auth).get(&key) {
            return Ok(Some(user));
        }
        let (status, body) =
            get(&self.homeserver, "/_matrix/client/v3/account/whoami", token).await?;
        let user = match status {
            200 => body
                .get("user_id")
                .and_then(Value::as_str)
                .map(str::to_owned),
            401 | 403 => None,
            _ => {
                return Err(io::Error::other(format!(
                    "whoami answered {status}: {body}"
                )));
            }
        };
        if let Some(user) = &user {
            lock(&self.auth).insert(key, user.clone());
        }
        Ok(user)
    }

    /// Whether `user` is joined to `room` (`joined_members`), cached briefly.
    async fn is_member(&self, token: &str, room: &str, user: &str) -> io::Result<bool> {
        let key = (room.to_owned(), user.to_owned());
        if let Some(member) = lock(&self.members).get(&key) {
            return Ok(member);
        }
        let path = format!("/_matrix/client/v3/rooms/{}/joined_members", quote(room));
        let (status, body) = get(&self.homeserver, &path, token).await?;
        let member = match status {
            200 => body
                .get("joined")
                .and_then(|joined| joined.get(user))
                .is_some(),
            403 | 404 => false,
            _ => {
                return Err(io::Error::other(format!(
                    "joined_members answered {status}: {body}"
                )));
            }
        };
        lock(&self.members).insert(key, member);
        Ok(member)
    }
}

/// `(room_id, user_id)` of a typing path, percent-decoded.
fn typing_route(path: &str) -> Option<(String, String)> {
    let rest = ["v3", "r0", "unstable"]
        .iter()
        .find_map(|version| path.strip_prefix(&format!("/_matrix/client/{version}/rooms/")))?;
    let (room, rest) = rest.split_once('/')?;
    let user = rest.strip_prefix("typing/")?;
    if room.is_empty() || user.is_empty() || user.contains('/') {
        return None;
    }
    Some((unquote(room)?, unquote(user)?))
}

fn unquote(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' && index + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[index + 1..index + 3]).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn quote(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `GET base + path` with a bearer token, over HTTP/1.0 (one request per
/// connection, the body read to the end): status and JSON body.
async fn get(base: &str, path: &str, token: &str) -> io::Result<(u16, Value)> {
    let authority = base
        .strip_prefix("http://")
        .ok_or_else(|| io::Error::other(format!("only http:// homeservers: {base}")))?;
    let fetch = async {
        let mut socket = smol::net::TcpStream::connect(authority).await?;
        let request = format!(
            "GET {path} HTTP/1.0\r\nHost: {authority}\r\nAuthorization: Bearer {token}\r\n\r\n"
        );
        socket.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        socket
            .take(HOMESERVER_ANSWER_MAX + 1)
            .read_to_end(&mut answer)
            .await?;
        if answer.len() as u64 > HOMESERVER_ANSWER_MAX {
            return Err(io::Error::other("the homeserver's answer is too long"));
        }
        Ok::<_, io::Error>(answer)
    };
    let timeout = async {
        smol::Timer::after(Duration::from_secs(10)).await;
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "homeserver timed out",
        ))
    };
    let answer = futures::future::select(Box::pin(fetch), Box::pin(timeout))
        .await
        .factor_first()
        .0?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::other("no HTTP answer"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|status| status.parse().ok())
        .ok_or_else(|| io::Error::other("no HTTP status"))?;
    Ok((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The only access token the fake homeserver knows, and its user.
    const GOOD: &str = "syt_good_token";
    const ALICE: &str = "@alice:example.com";

    /// A homeserver on loopback that knows [`GOOD`] (whoami) and shows
    /// every room without members (`joined_members`): its address.
    async fn homeserver() -> String {
        let listener = smol::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a listener");
        let addr = listener.local_addr().expect("bound");
        smol::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                smol::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if socket.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let head = String::from_utf8_lossy(&head);
                    let known = head.contains(&format!("Authorization: Bearer {GOOD}\r\n"));
                    let (status, body) =
                        if head.starts_with("GET /_matrix/client/v3/account/whoami ") {
                            if known {
                                ("200 OK", json!({"user_id": ALICE}))
                            } else {
                                ("401 Unauthorized", json!({"errcode": "M_UNKNOWN_TOKEN"}))
                            }
                        } else {
                            ("200 OK", json!({"joined": {}}))
                        };
                    let answer = format!("HTTP/1.0 {status}\r\n\r\n{body}");
                    let _ = socket.write_all(answer.as_bytes()).await;
                })
                .detach();
            }
        })
        .detach();
        format!("http://{addr}")
    }

    /// A writer asking `homeserver`, its Redis nowhere (nothing here
    /// publishes).
    async fn writer(homeserver: String) -> Running {
        let synapse = SynapseConfig::from_json(
            r#"{"server_name": "example.com",
                "redis": {"enabled": true, "host": "127.0.0.1", "port": 1},
                "stream_writers": {"typing": ["typing1"]},
                "instance_map": {"typing1": {"host": "127.0.0.1", "port": 1}}}"#,
        )
        .expect("a config");
        let options = Options {
            synapse,
            instance: "typing1".into(),
            homeserver,
            admin_token: None,
            state: None,
        };
        start(options, "127.0.0.1:0", "127.0.0.1:0")
            .await
            .expect("a writer")
    }

    #[test]
    fn unknown_tokens_take_no_cache_entry() {
        smol::block_on(async {
            let running = writer(homeserver().await).await;
            for n in 0..50 {
                // As long as the server lets a header be.
                let token = format!("{n:0>4096}");
                let user = running.writer.whoami(&token).await.expect("an answer");
                assert_eq!(user, None);
            }
            assert_eq!(lock(&running.writer.auth).len(), 0);
            let user = running.writer.whoami(GOOD).await.expect("an answer");
            assert_eq!(user.as_deref(), Some(ALICE));
            assert_eq!(lock(&running.writer.auth).len(), 1);
            running.stop().await;
        });
    }

    #[test]
    fn memberships_are_bounded() {
        smol::block_on(async {
            let running = writer(homeserver().await).await;
            for n in 0..=CACHED {
                let room = format!("!room{n}:example.com");
                let member = running.writer.is_member(GOOD, &room, ALICE).await;
                assert!(!member.expect("an answer"));
            }
            let cached = lock(&running.writer.members).len();
            assert!(cached <= CACHED, "{cached} memberships kept");
            running.stop().await;
        });
    }

    #[test]
    fn catch_ups_served_are_bounded() {
        smol::block_on(async {
            let served = Arc::new(Mutex::new(Default::default()));
            let source = Served {
                history: Arc::new(Mutex::new(History::new(10))),
                served: served.clone(),
            };
            for n in 0..=SERVED_KEPT {
                let request = CatchUpRequest {
                    id: synapse_replication::positions::CatchUpId::new(n as u64),
                    stream: StreamName::Typing,
                    writer: InstanceName::from("typing1"),
                    from: Token(0),
                    to: Token(1),
                };
                let _ = source.fetch(request).await;
            }
            let kept = lock(&served).len();
            assert!(kept <= SERVED_KEPT, "{kept} catch-ups kept");
        });
    }
}
