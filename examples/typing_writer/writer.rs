//! The typing writer's logic: who is typing where, with Synapse's
//! timeouts (`TypingWriterHandler`), the client API route that changes it,
//! the `typing` rows it publishes, and the catch-up it serves. Used by
//! `main.rs` and by `tests/typing_writer.rs`.

// Some accessors are read only by the tests.
#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use futures::{AsyncReadExt, AsyncWriteExt, FutureExt, StreamExt};
use serde_json::{Value, json};
use synapse_replication::positions::{
    CatchUpEndpoint, CatchUpPage, CatchUpRequest, History, HistoryMode,
};
use synapse_replication::transport::{
    BoxError, CatchUpSource, HttpCatchUp, HttpRequest, HttpResponse, HttpServer,
    HttpServerCounters, RedisClient, RedisClientEvent, SmolRuntime, SynapseConfig, async_trait,
};
use synapse_replication::wire::{InstanceName, RawRow, StreamName, Token};

/// Synapse's default typing timeout (`RoomTypingRestServlet`), ms.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
/// The longest timeout Synapse accepts, ms.
pub const MAX_TIMEOUT_MS: u64 = 120_000;
/// How often timeouts are checked (`FollowerTypingHandler`'s looping call).
pub const TIMEOUT_CHECK: Duration = Duration::from_secs(5);
/// How long a token's user, and a membership, are trusted.
const AUTH_CACHE: Duration = Duration::from_secs(5);
/// Rows of history kept (older ranges are answered per room).
const HISTORY_ROWS: usize = 10_000;
/// Answers kept in [`TypingWriter::answered`].
const ANSWERED_KEPT: usize = 1000;

/// Who the writer is and where it listens.
#[derive(Clone, Debug)]
pub struct Options {
    /// The deployment's config (server name, Redis, `stream_writers`,
    /// `instance_map`, `worker_replication_secret`).
    pub synapse: SynapseConfig,
    /// This process's instance name (`stream_writers.typing`).
    pub instance: String,
    /// The homeserver's client API, to check access tokens and
    /// memberships (`http://127.0.0.1:8008`).
    pub homeserver: String,
}

/// The state of typing: `TypingWriterHandler`'s, in Rust.
#[derive(Debug, Default)]
struct Typing {
    /// The stream's token: one per change.
    serial: i64,
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
    history: Arc<Mutex<History>>,
    rows: mpsc::UnboundedSender<(Token, RawRow)>,
    auth: Mutex<HashMap<String, (Instant, Option<String>)>>,
    members: Mutex<HashMap<(String, String), (Instant, bool)>>,
    /// Every catch-up request served, for tests and logs.
    pub served: Arc<Mutex<Vec<CatchUpRequest>>>,
    /// The latest requests of other routes, as `(method, path, status)`:
    /// what Synapse calls on a typing writer, for tests and logs.
    pub answered: Mutex<VecDeque<(String, String, u16)>>,
}

/// The history, recording what it is asked.
struct Served {
    history: Arc<Mutex<History>>,
    served: Arc<Mutex<Vec<CatchUpRequest>>>,
}

#[async_trait]
impl CatchUpSource for Served {
    async fn fetch(&self, request: CatchUpRequest) -> Result<CatchUpPage, BoxError> {
        eprintln!("typing writer: serving {request}");
        lock(&self.served).push(request.clone());
        self.history.fetch(request).await
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// A running writer: its address and counters. The tasks run on smol's
/// global executor until the process ends.
pub struct Running {
    /// The writer.
    pub writer: Arc<TypingWriter>,
    /// Where its HTTP listener (replication and client API) is.
    pub addr: SocketAddr,
    /// What the HTTP server did.
    pub counters: HttpServerCounters,
}

/// Starts the writer: the HTTP listener on `listen`, the Redis client, and
/// the timeout task, each on smol's executor.
pub async fn start(options: Options, listen: &str) -> io::Result<Running> {
    let instance = InstanceName::from(options.instance.as_str());
    let history = Arc::new(Mutex::new(
        History::new(HISTORY_ROWS).with_mode(StreamName::Typing, HistoryMode::Keyed { key_len: 1 }),
    ));
    let served = Arc::new(Mutex::new(Vec::new()));
    let (rows_in, rows_out) = mpsc::unbounded();
    let writer = Arc::new(TypingWriter {
        instance: instance.clone(),
        homeserver: options.homeserver.trim_end_matches('/').to_owned(),
        typing: Mutex::new(Typing::default()),
        history: history.clone(),
        rows: rows_in,
        auth: Mutex::new(HashMap::new()),
        members: Mutex::new(HashMap::new()),
        served: served.clone(),
        answered: Mutex::new(VecDeque::new()),
    });

    let endpoint = CatchUpEndpoint::new(
        instance.clone(),
        options.synapse.replication_secret().map(str::to_owned),
    )
    .with_streams([StreamName::Typing]);
    let source = Arc::new(Served { history, served });
    let handler_writer = writer.clone();
    let server = HttpServer::bind(SmolRuntime, listen, endpoint, source)
        .await?
        .with_handler(move |request| {
            let writer = handler_writer.clone();
            async move { writer.answer(request).await }.boxed()
        });
    let addr = server.local_addr()?;
    let counters = server.counters();
    smol::spawn(server.run()).detach();

    let mut client = RedisClient::follow(SmolRuntime, &options.synapse, instance.clone())
        .map_err(io::Error::other)?
        .with_catch_up(Arc::new(HttpCatchUp::from_synapse(
            SmolRuntime,
            &options.synapse,
        )));
    // Typing starts at 0 with each start, as Synapse's writer does; the
    // Writer announces it on every (re)connection and REPLICATE.
    client
        .advance(&StreamName::Typing, Token(0))
        .map_err(io::Error::other)?;
    smol::spawn(redis_task(client, rows_out, writer.clone())).detach();
    smol::spawn(timeout_task(writer.clone())).detach();
    Ok(Running {
        writer,
        addr,
        counters,
    })
}

/// Publishes rows as they are made, and follows the deployment (to clear
/// typing of users who leave a room).
async fn redis_task(
    mut client: RedisClient<SmolRuntime>,
    mut rows: mpsc::UnboundedReceiver<(Token, RawRow)>,
    writer: Arc<TypingWriter>,
) {
    loop {
        futures::select! {
            row = rows.next() => {
                let Some((token, row)) = row else { return };
                if let Err(error) = client.write(&StreamName::Typing, token, [(token, row)]) {
                    eprintln!("typing writer: cannot write typing {token}: {error}");
                }
            }
            event = client.next_event().fuse() => match event {
                None => return,
                Some(RedisClientEvent::Rows { stream: StreamName::Events, rows, .. }) => {
                    for row in &rows {
                        if let Some((room, user)) = left_room(row) {
                            writer.stopped(&room, &user);
                        }
                    }
                }
                Some(event @ (RedisClientEvent::Ready | RedisClientEvent::Disconnected { .. })) => {
                    eprintln!("typing writer: redis {event}");
                }
                Some(_) => {}
            },
        }
    }
}

/// Who left which room, if `row` of the `events` stream says so: an
/// `m.room.member` event whose membership is not `join`.
fn left_room(row: &RawRow) -> Option<(String, String)> {
    let row: Value = row.parse().ok()?;
    if row.get(0)?.as_str()? != "ev" {
        return None;
    }
    let data = row.get(1)?;
    // [event_id, room_id, type, state_key, redacts, relates_to, membership, ...]
    if data.get(2)?.as_str()? != "m.room.member" || data.get(6)?.as_str()? == "join" {
        return None;
    }
    Some((
        data.get(1)?.as_str()?.to_owned(),
        data.get(3)?.as_str()?.to_owned(),
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
    /// row, recorded and published in token order (under the lock).
    fn push(&self, typing: &mut Typing, room: &str) {
        typing.serial += 1;
        let token = Token(typing.serial);
        let users: Vec<&String> = typing.rooms.get(room).into_iter().flatten().collect();
        let Ok(row) = RawRow::from_value(&json!([room, users])) else {
            return;
        };
        if let Err(error) =
            lock(&self.history).record(&StreamName::Typing, &self.instance, [(token, row.clone())])
        {
            eprintln!("typing writer: history: {error}");
        }
        let _ = self.rows.unbounded_send((token, row));
    }

    /// Any request but a catch-up, answered and logged (an access log: a
    /// route Synapse calls that this writer does not serve shows here).
    pub async fn answer(&self, request: HttpRequest) -> HttpResponse {
        let (method, path) = (request.method.clone(), request.path.clone());
        let response = self.client_api(request).await;
        eprintln!("typing writer: {method} {path} -> {}", response.status);
        let mut answered = lock(&self.answered);
        if answered.len() >= ANSWERED_KEPT {
            answered.pop_front();
        }
        answered.push_back((method, path, response.status));
        response
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

    /// The user of an access token (`None`: unknown token), cached briefly.
    async fn whoami(&self, token: &str) -> io::Result<Option<String>> {
        if let Some((at, user)) = lock(&self.auth).get(token)
            && at.elapsed() < AUTH_CACHE
        {
            return Ok(user.clone());
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
        lock(&self.auth).insert(token.to_owned(), (Instant::now(), user.clone()));
        Ok(user)
    }

    /// Whether `user` is joined to `room` (`joined_members`), cached briefly.
    async fn is_member(&self, token: &str, room: &str, user: &str) -> io::Result<bool> {
        let key = (room.to_owned(), user.to_owned());
        if let Some((at, member)) = lock(&self.members).get(&key)
            && at.elapsed() < AUTH_CACHE
        {
            return Ok(*member);
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
        lock(&self.members).insert(key, (Instant::now(), member));
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
        socket.take(1 << 20).read_to_end(&mut answer).await?;
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
