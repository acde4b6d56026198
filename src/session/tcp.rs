//! Synapse's direct TCP replication: a sans-IO [`ClientSession`] (a worker
//! following a server) and [`ServerSession`] (a process serving its streams
//! to many clients).

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant, SystemTime};

use bytes::{BufMut, Bytes, BytesMut};
use bytestring::ByteString;

use crate::positions::{
    CatchUpError, CatchUpId, CatchUpPage, Follower, FollowerEvent, WriteError, Writer,
};
use crate::wire::{
    Command, CommandKind, DecodeError, Decoder, EncodeError, Position, RawRow, Rdata, RdataToken,
    Side, StreamName, Token,
};

use super::lines::{LineTooLong, Lines};

/// Limits and timers of a direct TCP connection.
///
/// The defaults are Synapse's (`protocol.py`) where it has one.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpSessionConfig {
    /// The longest line received or sent, without its `\n` (Synapse:
    /// 16384, Twisted's `LineOnlyReceiver.MAX_LENGTH`). A longer line
    /// received closes the connection with `ERROR Line length exceeded`; no
    /// more than this is ever buffered for a line whose `\n` has not arrived.
    pub max_line_len: usize,
    /// Commands queued for a peer that does not read (Synapse: 10000).
    /// One more closes the connection with `ERROR Failed to keep up`.
    pub max_queued_commands: usize,
    /// Bytes queued for a peer that does not read (default 32 MiB; Synapse
    /// has no such bound). Beyond, the same as `max_queued_commands`.
    pub max_queued_bytes: usize,
    /// Something is sent at least this often: a `PING` when idle (5 s).
    pub ping_interval: Duration,
    /// The connection is closed (`ERROR ping timeout`) when nothing was
    /// received for this long (25 s).
    pub ping_timeout: Duration,
    /// After a fatal error, how long the queued `ERROR` line may take to be
    /// written before the connection is dropped without it (5 s; Synapse
    /// waits 25 s).
    pub close_timeout: Duration,
    /// The largest chunk [`poll_transmit`](ClientSession::poll_transmit)
    /// returns: queued lines are joined up to this size (64 KiB). A single
    /// line longer than this is returned alone.
    pub max_transmit_len: usize,
    /// Report every valid command received as a `Received` event, before it
    /// is acted on (default off: for tracing and tools such as `tail`).
    pub report_received: bool,
}

impl Default for TcpSessionConfig {
    fn default() -> Self {
        TcpSessionConfig {
            max_line_len: Decoder::SYNAPSE_TCP_MAX_LINE,
            max_queued_commands: 10_000,
            max_queued_bytes: 32 << 20,
            ping_interval: Duration::from_secs(5),
            ping_timeout: Duration::from_secs(25),
            close_timeout: Duration::from_secs(5),
            max_transmit_len: 64 << 10,
            report_received: false,
        }
    }
}

impl TcpSessionConfig {
    /// Timers below this are raised to it, so that a zero interval cannot
    /// make the event loop spin.
    const MIN_TIMER: Duration = Duration::from_millis(1);

    fn effective_ping_interval(&self) -> Duration {
        self.ping_interval.max(Self::MIN_TIMER)
    }
}

/// Why this end closed a connection: the peer broke the protocol, or went
/// silent, or could not keep up. Each has the `ERROR` line Synapse sends
/// for it ([`TcpError::wire_message`]), which is flushed before closing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TcpError {
    /// The peer sent (or started) a line longer than
    /// [`TcpSessionConfig::max_line_len`].
    #[error("line exceeds the limit of {max} bytes")]
    LineTooLong {
        /// The limit.
        max: usize,
    },
    /// The peer sent a line that is not a valid command (Synapse also
    /// closes on commands it does not know).
    #[error("invalid line: {0}")]
    Decode(#[source] DecodeError),
    /// The peer sent a command its side may not send on direct TCP (a
    /// client sending `RDATA`, a server sending `REPLICATE`, either sending
    /// `NEW_ACTIVE_TASK`).
    #[error("{command} may not be sent by the {}", side_name(*.sender))]
    WrongDirection {
        /// The command.
        command: CommandKind,
        /// The side that sent it.
        sender: Side,
    },
    /// The server's first command was not `SERVER`.
    #[error("expected SERVER first, got {0}")]
    NoGreeting(CommandKind),
    /// The server announced another server name.
    #[error("wrong remote: expected server name {expected:?}, got {got:?}")]
    WrongRemote {
        /// The name this client expects.
        expected: ByteString,
        /// The name the server sent.
        got: ByteString,
    },
    /// Nothing was received for [`TcpSessionConfig::ping_timeout`].
    #[error("nothing received for {0:?}")]
    PingTimeout(Duration),
    /// The peer does not read: the queue reached
    /// [`TcpSessionConfig::max_queued_commands`] or [`TcpSessionConfig::max_queued_bytes`].
    #[error("peer failed to keep up: {commands} commands ({bytes} bytes) queued")]
    FailedToKeepUp {
        /// Commands queued.
        commands: usize,
        /// Bytes queued.
        bytes: usize,
    },
    /// The application closed the connection ([`ServerSession::close`]).
    #[error("closed by the application: {0}")]
    ByApplication(String),
}

fn side_name(side: Side) -> &'static str {
    match side {
        Side::Server => "server",
        Side::Client => "client",
    }
}

impl TcpError {
    /// The text of the `ERROR` line sent for this error, as Synapse words
    /// it: `Line length exceeded`, `failed to parse line: ...`, `invalid
    /// command: ...`, `Wrong remote`, `ping timeout`, `Failed to keep up`.
    pub fn wire_message(&self) -> String {
        let message = match self {
            TcpError::LineTooLong { .. } => "Line length exceeded".to_owned(),
            TcpError::Decode(error) => format!("failed to parse line: {error}"),
            TcpError::WrongDirection { command, .. } => format!("invalid command: {command}"),
            TcpError::NoGreeting(_) | TcpError::WrongRemote { .. } => "Wrong remote".to_owned(),
            TcpError::PingTimeout(_) => "ping timeout".to_owned(),
            TcpError::FailedToKeepUp { .. } => "Failed to keep up".to_owned(),
            TcpError::ByApplication(message) => message.clone(),
        };
        // One line, whatever the error quotes.
        message.replace(['\n', '\r'], " ")
    }
}

/// A command the application cannot send. Nothing was queued.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// This side may not send the command on direct TCP (see
    /// [`CommandKind::may_be_sent_by`]).
    #[error("{command} may not be sent by the {} on direct TCP", side_name(*.sender))]
    WrongDirection {
        /// The command.
        command: CommandKind,
        /// This side.
        sender: Side,
    },
    /// No connection is up (the client between connections).
    #[error("not connected")]
    NotConnected,
    /// The command has no meaning over Redis (`SERVER`, `NAME`), or belongs
    /// to the writer (`RDATA`, `POSITION`, `REPLICATE`: use
    /// [`RedisSession::write`](super::RedisSession::write) and its
    /// siblings).
    #[error("{0} is not sent this way over Redis")]
    NotOverRedis(CommandKind),
    /// The connection is closing after a fatal error (possibly the one this
    /// command caused, by overflowing the queue).
    #[error("the connection is closing")]
    Closing,
    /// No client with this id (never accepted, or disconnected).
    #[error("no client {0}")]
    UnknownClient(ClientId),
    /// The encoded line is longer than [`TcpSessionConfig::max_line_len`]; the
    /// peer would close the connection (Synapse refuses to send it too).
    #[error("line of {len} bytes exceeds the limit of {max} bytes")]
    LineTooLong {
        /// The line's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The command cannot be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
}

/// Where a connection stands, for the driver that moves its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConnectionState {
    /// Up: read, write, keep the timers.
    Open,
    /// A fatal error: stop reading; write what
    /// [`poll_transmit`](ClientSession::poll_transmit) still gives (the
    /// `ERROR` line), then close the socket.
    Closing,
    /// The `ERROR` line could not be written within
    /// [`TcpSessionConfig::close_timeout`]: drop the socket now.
    Aborted,
}

/// Identifies one client connection of a [`ServerSession`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(u64);

impl ClientId {
    /// The id as a number (unique for the life of one server session).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// What a [`ClientSession`] tells the application.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClientEvent {
    /// The server greeted with the expected `SERVER` name: the handshake is
    /// complete (this client sent `NAME`, `PING` and `REPLICATE` on
    /// connecting).
    Ready {
        /// The server name.
        server_name: ByteString,
    },
    /// What the [`Follower`] decided: rows to apply, positions reached,
    /// catch-ups to perform (answer with
    /// [`ClientSession::handle_catch_up`]), resets, rejected commands.
    Follower(FollowerEvent),
    /// A command for the application: `REMOTE_SERVER_UP` or
    /// `LOCK_RELEASED`.
    Command(Command),
    /// The server reported an error (`ERROR`); it usually closes next.
    PeerError(ByteString),
    /// A valid command was received (only with
    /// [`TcpSessionConfig::report_received`]); it is then acted on as usual.
    Received(Command),
    /// This client is closing the connection: the `ERROR` line is queued.
    Closing(TcpError),
}

impl fmt::Display for ClientEvent {
    /// One line (rows are counted, not printed; no secret is shown).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientEvent::Ready { server_name } => write!(f, "ready {server_name}"),
            ClientEvent::Follower(event) => write!(f, "{event}"),
            ClientEvent::Command(command) => write!(f, "command {command:?}"),
            ClientEvent::PeerError(message) => write!(f, "error from the server: {message}"),
            ClientEvent::Received(command) => write!(f, "received {command:?}"),
            ClientEvent::Closing(error) => write!(f, "closing: {error}"),
        }
    }
}

/// What a [`ServerSession`] tells the application.
#[derive(Debug)]
#[non_exhaustive]
pub enum ServerEvent {
    /// A client named itself (`NAME`).
    Named {
        /// The client.
        client: ClientId,
        /// Its name (usually its instance name).
        name: ByteString,
    },
    /// A client sent `REPLICATE`; it was answered with a `POSITION` for
    /// every stream the server writes.
    Replicated {
        /// The client.
        client: ClientId,
    },
    /// A command for the application: `USER_SYNC`, `CLEAR_USER_SYNC`,
    /// `FEDERATION_ACK`, `USER_IP`, `REMOTE_SERVER_UP`, `LOCK_RELEASED`.
    /// The last two are also relayed to every other client, so that every
    /// process hears them as it would over Redis.
    Command {
        /// The client that sent it.
        client: ClientId,
        /// The command.
        command: Command,
    },
    /// A client reported an error (`ERROR`); it usually closes next.
    PeerError {
        /// The client.
        client: ClientId,
        /// Its message.
        message: ByteString,
    },
    /// A valid command was received (only with
    /// [`TcpSessionConfig::report_received`]); it is then acted on as usual.
    Received {
        /// The client.
        client: ClientId,
        /// The command.
        command: Command,
    },
    /// The server is closing this client's connection: its `ERROR` line is
    /// queued.
    Closing {
        /// The client.
        client: ClientId,
        /// Why.
        error: TcpError,
    },
}

/// Maps the session's `Instant`s to wall-clock milliseconds for `PING`.
#[derive(Clone, Copy, Debug)]
struct PingClock {
    at: Instant,
    unix: Duration,
}

impl PingClock {
    fn line(&self, now: Instant) -> Bytes {
        let ms = (self.unix + now.saturating_duration_since(self.at)).as_millis();
        let mut line = BytesMut::with_capacity(24);
        line.put_slice(b"PING ");
        line.put_slice(ms.to_string().as_bytes());
        line.put_u8(b'\n');
        line.freeze()
    }
}

fn clock_at(clock: &mut Option<PingClock>, now: Instant) -> PingClock {
    *clock.get_or_insert(PingClock {
        at: now,
        unix: Duration::ZERO,
    })
}

fn wall_clock(now: Instant, wall: SystemTime) -> PingClock {
    PingClock {
        at: now,
        unix: wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default(),
    }
}

/// Encodes a command as one line with its `\n`, within the length limit.
fn encode_line(command: &Command, max: usize) -> Result<Bytes, SendError> {
    let mut line = BytesMut::new();
    command.encode(&mut line)?;
    if line.len() > max {
        return Err(SendError::LineTooLong {
            len: line.len(),
            max,
        });
    }
    line.put_u8(b'\n');
    Ok(line.freeze())
}

/// An `ERROR` line, whatever the message.
fn error_line(message: &str) -> Bytes {
    let mut line = BytesMut::with_capacity(message.len() + 7);
    line.put_slice(b"ERROR ");
    line.put_slice(message.replace(['\n', '\r'], " ").as_bytes());
    line.put_u8(b'\n');
    line.freeze()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Open,
    Closing { abort_at: Instant },
    Aborted,
}

/// The outcome of queueing a line.
enum Queued {
    Ok,
    /// The queue went over a limit: the connection must fail.
    Overflow {
        commands: usize,
        bytes: usize,
    },
    /// The connection is not open: nothing was queued.
    NotOpen,
}

/// What a timer asks for.
enum Due {
    Nothing,
    Ping,
    Silent(Duration),
}

/// One connection's line buffer, output queue and timers: what both roles
/// share. Its [`Debug`] output shows the sizes of its buffers, never their
/// lines (a `USER_IP` line carries an access token).
struct Conn {
    lines: Lines,
    out: VecDeque<Bytes>,
    out_bytes: usize,
    last_sent: Instant,
    last_received: Instant,
    state: State,
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conn")
            .field("lines", &self.lines)
            .field("queued_lines", &self.out.len())
            .field("queued_bytes", &self.out_bytes)
            .field("last_sent", &self.last_sent)
            .field("last_received", &self.last_received)
            .field("state", &self.state)
            .finish()
    }
}

impl Conn {
    fn new(config: &TcpSessionConfig, now: Instant) -> Conn {
        Conn {
            lines: Lines::new(config.max_line_len),
            out: VecDeque::new(),
            out_bytes: 0,
            last_sent: now,
            last_received: now,
            state: State::Open,
        }
    }

    fn is_open(&self) -> bool {
        self.state == State::Open
    }

    fn public_state(&self) -> ConnectionState {
        match self.state {
            State::Open => ConnectionState::Open,
            State::Closing { .. } => ConnectionState::Closing,
            State::Aborted => ConnectionState::Aborted,
        }
    }

    fn queue(&mut self, line: Bytes, config: &TcpSessionConfig, now: Instant) -> Queued {
        if !self.is_open() {
            return Queued::NotOpen;
        }
        self.out_bytes += line.len();
        self.out.push_back(line);
        self.last_sent = now;
        if self.out.len() > config.max_queued_commands || self.out_bytes > config.max_queued_bytes {
            return Queued::Overflow {
                commands: self.out.len(),
                bytes: self.out_bytes,
            };
        }
        Queued::Ok
    }

    /// Fatal: drop what is queued and input still buffered, queue the
    /// `ERROR` line alone.
    fn fail(&mut self, message: &str, config: &TcpSessionConfig, now: Instant) {
        if !self.is_open() {
            return;
        }
        self.lines.clear();
        self.out.clear();
        let line = error_line(message);
        self.out_bytes = line.len();
        self.out.push_back(line);
        self.last_sent = now;
        let close = config.close_timeout.max(TcpSessionConfig::MIN_TIMER);
        let abort_at = now.checked_add(close).unwrap_or(now);
        self.state = State::Closing { abort_at };
    }

    fn deadline(&self, config: &TcpSessionConfig) -> Option<Instant> {
        match self.state {
            State::Open => {
                let ping = self.last_sent.checked_add(config.effective_ping_interval());
                let silence = self.last_received.checked_add(config.ping_timeout);
                match (ping, silence) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            }
            State::Closing { abort_at } => Some(abort_at),
            State::Aborted => None,
        }
    }

    /// Advances the timers to `now`; the caller sends the `PING` or fails.
    fn on_timeout(&mut self, config: &TcpSessionConfig, now: Instant) -> Due {
        match self.state {
            State::Open => {
                let silent = now.saturating_duration_since(self.last_received);
                if silent >= config.ping_timeout {
                    return Due::Silent(silent);
                }
                if now.saturating_duration_since(self.last_sent) >= config.effective_ping_interval()
                {
                    return Due::Ping;
                }
                Due::Nothing
            }
            State::Closing { abort_at } => {
                if now >= abort_at {
                    self.state = State::Aborted;
                    self.out.clear();
                    self.out_bytes = 0;
                }
                Due::Nothing
            }
            State::Aborted => Due::Nothing,
        }
    }

    fn poll_transmit(&mut self, max: usize) -> Option<Bytes> {
        if self.state == State::Aborted {
            return None;
        }
        let first = self.out.pop_front()?;
        self.out_bytes -= first.len();
        let Some(next) = self.out.front() else {
            return Some(first);
        };
        if first.len() + next.len() > max {
            return Some(first);
        }
        let mut chunk = BytesMut::with_capacity(max.min(first.len() + self.out_bytes));
        chunk.put_slice(&first);
        while let Some(next) = self.out.front() {
            if chunk.len() + next.len() > max {
                break;
            }
            chunk.put_slice(next);
            self.out_bytes -= next.len();
            self.out.pop_front();
        }
        Some(chunk.freeze())
    }
}

/// The client end of a direct TCP replication connection: a worker
/// following the streams of a server (Synapse's
/// `ClientReplicationStreamProtocol`), sans-IO.
///
/// One session lives as long as the client: it owns the [`Follower`],
/// whose positions and outstanding catch-ups outlive connections. Each
/// connection starts with [`ClientSession::connect`] and ends with
/// [`ClientSession::disconnected`].
///
/// # Call order
///
/// - When a connection is up, call [`connect`](ClientSession::connect): it
///   queues `NAME`, `PING` and `REPLICATE`.
/// - Give every byte received to
///   [`handle_input`](ClientSession::handle_input), call
///   [`handle_timeout`](ClientSession::handle_timeout) when the time given
///   by [`poll_timeout`](ClientSession::poll_timeout) has passed, and act
///   with [`send`](ClientSession::send),
///   [`handle_catch_up`](ClientSession::handle_catch_up) and
///   [`catch_up_failed`](ClientSession::catch_up_failed).
/// - **After every input**: drain
///   [`poll_transmit`](ClientSession::poll_transmit) until `None` (write
///   each chunk in order; only take a chunk when the socket can take it,
///   so that a peer that does not read is detected), then
///   [`poll_event`](ClientSession::poll_event) until `None`, then read
///   [`poll_timeout`](ClientSession::poll_timeout) and arm a timer for it.
/// - Time must not go backwards: every `now` is at least the previous one
///   (an earlier one is treated as the previous one). `poll_timeout` is
///   never before the last `now` given, and handling a timeout at the time
///   it gave always moves it forward, so an event loop cannot spin. Calls
///   that take no `now` ([`send`](ClientSession::send), ...) happen at the
///   last `now` given: call `handle_timeout(now)` first if time moved (a
///   stale time only makes a `PING` come early).
/// - When [`state`](ClientSession::state) is [`ConnectionState::Closing`],
///   stop reading, write what `poll_transmit` still gives, close the
///   socket; drop it at once on [`ConnectionState::Aborted`]. Then (or when
///   the socket fails) call [`disconnected`](ClientSession::disconnected).
///
/// # Rules (Synapse's `protocol.py`)
///
/// - On connecting: `NAME <name>` (the follower's own name unless
///   [`set_client_name`](ClientSession::set_client_name) changed it),
///   `PING <ms>`, `REPLICATE`.
/// - The server's first command must be `SERVER <name>` with the expected
///   name; otherwise `ERROR Wrong remote` and close. (Synapse accepts other
///   commands before `SERVER`; every Synapse server sends it first.)
/// - `RDATA` and `POSITION` go to the follower; `REMOTE_SERVER_UP` and
///   `LOCK_RELEASED` to the application; `ERROR` is reported; blank lines
///   are ignored.
/// - A line that does not decode, a command a server may not send, a line
///   over [`TcpSessionConfig::max_line_len`]: `ERROR` and close.
/// - A `PING` goes out whenever nothing was sent for
///   [`TcpSessionConfig::ping_interval`]; the connection is closed when nothing
///   was received for [`TcpSessionConfig::ping_timeout`] (Synapse starts that
///   clock at the first `PING` received; here it starts on connecting:
///   every Synapse peer pings at once).
/// - A fatal error stays fatal: input is ignored from then on and only the
///   `ERROR` line is transmitted.
///
/// Its [`Debug`] output never shows a secret: of the lines queued or
/// partly received (a `USER_IP` carries an access token) it shows only
/// how many bytes there are, and [`UserIp`](crate::wire::UserIp) hides its
/// token.
#[derive(Debug)]
pub struct ClientSession {
    config: TcpSessionConfig,
    decoder: Decoder,
    server_name: ByteString,
    name_line: Option<Bytes>,
    follower: Follower,
    conn: Option<Conn>,
    greeted: bool,
    events: VecDeque<ClientEvent>,
    now: Option<Instant>,
    clock: Option<PingClock>,
}

impl ClientSession {
    /// A client that expects the server `server_name` (Synapse's
    /// `server_name`, e.g. `example.com`) and follows with `follower`, with
    /// the default [`TcpSessionConfig`].
    ///
    /// Fails if the follower's own name cannot be sent as `NAME` (it
    /// contains a newline).
    pub fn new(
        server_name: impl Into<ByteString>,
        follower: Follower,
    ) -> Result<ClientSession, EncodeError> {
        ClientSession::with_config(server_name, follower, TcpSessionConfig::default())
    }

    /// A client with the given limits and timers.
    pub fn with_config(
        server_name: impl Into<ByteString>,
        follower: Follower,
        config: TcpSessionConfig,
    ) -> Result<ClientSession, EncodeError> {
        let name = ByteString::from(follower.own_name().as_str());
        let mut session = ClientSession {
            decoder: Decoder::new().max_line_len(config.max_line_len),
            config,
            server_name: server_name.into(),
            name_line: None,
            follower,
            conn: None,
            greeted: false,
            events: VecDeque::new(),
            now: None,
            clock: None,
        };
        session.set_client_name(Some(name))?;
        Ok(session)
    }

    /// Sets the name sent as `NAME` on connecting (`None`: send no `NAME`),
    /// from the next connection on.
    pub fn set_client_name(&mut self, name: Option<ByteString>) -> Result<(), EncodeError> {
        self.name_line = match name {
            None => None,
            Some(name) => {
                let mut line = BytesMut::new();
                Command::Name(name).encode(&mut line)?;
                line.put_u8(b'\n');
                Some(line.freeze())
            }
        };
        Ok(())
    }

    /// Makes `PING` carry wall-clock milliseconds, as Synapse's do: `wall`
    /// is the wall-clock time at `now`. Without it, `PING` carries the
    /// milliseconds since the first connection (peers ignore the value).
    pub fn set_wall_clock(&mut self, now: Instant, wall: SystemTime) {
        self.clock = Some(wall_clock(now, wall));
    }

    fn tick(&mut self, now: Instant) -> Instant {
        let now = match self.now {
            Some(last) if last > now => last,
            _ => now,
        };
        self.now = Some(now);
        now
    }

    /// A connection is up: queues `NAME`, `PING` and `REPLICATE`, and tells
    /// the follower. A connection still up is first considered lost.
    pub fn connect(&mut self, now: Instant) {
        if self.conn.is_some() {
            self.disconnected();
        }
        let now = self.tick(now);
        let ping = clock_at(&mut self.clock, now).line(now);
        self.conn = Some(Conn::new(&self.config, now));
        self.greeted = false;
        // A queue too small for the greeting closes the connection at once.
        let greeting = self
            .name_line
            .clone()
            .into_iter()
            .chain([ping, Bytes::from_static(b"REPLICATE \n")]);
        for line in greeting {
            if self.queue(line).is_err() {
                break;
            }
        }
        self.follower.connected();
        self.drain_follower();
    }

    /// The connection is gone (closed by either side, or failed). The
    /// follower forgets what belonged to it; outstanding catch-ups remain.
    pub fn disconnected(&mut self) {
        self.conn = None;
        self.greeted = false;
        self.follower.disconnected();
        self.drain_follower();
    }

    /// Handles bytes received, in any chunks: lines may be split anywhere.
    /// Ignored when not connected or closing. Timers due at `now` are
    /// handled too.
    pub fn handle_input(&mut self, data: &[u8], now: Instant) {
        let now = self.tick(now);
        if let Some(conn) = self.conn.as_mut() {
            if conn.is_open() {
                conn.lines.push(data);
            }
        }
        while let Some(conn) = self.conn.as_mut() {
            if !conn.is_open() {
                conn.lines.clear();
                break;
            }
            let line = match conn.lines.next_line() {
                Ok(Some(line)) => line,
                Ok(None) => break,
                Err(LineTooLong) => {
                    let max = self.config.max_line_len;
                    self.fail(TcpError::LineTooLong { max });
                    break;
                }
            };
            if let Err(error) = self.handle_line(line, now) {
                self.fail(error);
                break;
            }
        }
        self.handle_timeout(now);
    }

    fn handle_line(&mut self, line: Bytes, now: Instant) -> Result<(), TcpError> {
        let command = match self.decoder.decode(line) {
            Ok(Some(command)) => command,
            Ok(None) => return Ok(()),
            Err(error) => return Err(TcpError::Decode(error)),
        };
        let kind = command.kind();
        if !kind.may_be_sent_by(Side::Server) {
            return Err(TcpError::WrongDirection {
                command: kind,
                sender: Side::Server,
            });
        }
        if let Some(conn) = self.conn.as_mut() {
            conn.last_received = now;
        }
        if self.config.report_received {
            self.events
                .push_back(ClientEvent::Received(command.clone()));
        }
        match command {
            Command::Server(name) => {
                if name != self.server_name {
                    return Err(TcpError::WrongRemote {
                        expected: self.server_name.clone(),
                        got: name,
                    });
                }
                if !self.greeted {
                    self.greeted = true;
                    self.events
                        .push_back(ClientEvent::Ready { server_name: name });
                }
            }
            _ if !self.greeted => return Err(TcpError::NoGreeting(kind)),
            Command::Ping(_) => {}
            Command::Error(message) => self.events.push_back(ClientEvent::PeerError(message)),
            command @ (Command::Rdata(_) | Command::Position(_)) => {
                self.follower.handle_command(command);
                self.drain_follower();
            }
            command => self.events.push_back(ClientEvent::Command(command)),
        }
        Ok(())
    }

    fn drain_follower(&mut self) {
        while let Some(event) = self.follower.poll_event() {
            self.events.push_back(ClientEvent::Follower(event));
        }
    }

    fn fail(&mut self, error: TcpError) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        if !conn.is_open() {
            return;
        }
        let now = self.now.unwrap_or(conn.last_sent);
        conn.fail(&error.wire_message(), &self.config, now);
        self.events.push_back(ClientEvent::Closing(error));
    }

    fn queue(&mut self, line: Bytes) -> Result<(), SendError> {
        let Some(conn) = self.conn.as_mut() else {
            return Err(SendError::NotConnected);
        };
        let now = self.now.unwrap_or(conn.last_sent);
        match conn.queue(line, &self.config, now) {
            Queued::Ok => Ok(()),
            Queued::NotOpen => Err(SendError::Closing),
            Queued::Overflow { commands, bytes } => {
                self.fail(TcpError::FailedToKeepUp { commands, bytes });
                Err(SendError::Closing)
            }
        }
    }

    /// Handles the timers due at `now`: a `PING` when idle, closing a silent
    /// connection, dropping one whose `ERROR` could not be written.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.tick(now);
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        match conn.on_timeout(&self.config, now) {
            Due::Nothing => {}
            Due::Ping => {
                let ping = clock_at(&mut self.clock, now).line(now);
                let _ = self.queue(ping);
            }
            Due::Silent(silent) => self.fail(TcpError::PingTimeout(silent)),
        }
    }

    /// Queues a command for the server: `USER_SYNC`, `CLEAR_USER_SYNC`,
    /// `FEDERATION_ACK`, `USER_IP`, `REMOTE_SERVER_UP`, `LOCK_RELEASED`
    /// (or `ERROR`, `PING`, `NAME`, `REPLICATE`).
    ///
    /// Queueing more than [`TcpSessionConfig::max_queued_commands`] closes the
    /// connection (`ERROR Failed to keep up`) and fails with
    /// [`SendError::Closing`].
    pub fn send(&mut self, command: Command) -> Result<(), SendError> {
        let kind = command.kind();
        if !kind.may_be_sent_by(Side::Client) {
            return Err(SendError::WrongDirection {
                command: kind,
                sender: Side::Client,
            });
        }
        let line = encode_line(&command, self.config.max_line_len)?;
        self.queue(line)
    }

    /// Applies a page of the answer to catch-up `id` (see
    /// [`Follower::handle_catch_up`]); drain events after.
    pub fn handle_catch_up(
        &mut self,
        id: CatchUpId,
        page: CatchUpPage,
    ) -> Result<(), CatchUpError> {
        let result = self.follower.handle_catch_up(id, page);
        self.drain_follower();
        result
    }

    /// Catch-up `id` could not be fetched: it is asked again with a new id
    /// (see [`Follower::catch_up_failed`]); drain events after.
    pub fn catch_up_failed(&mut self, id: CatchUpId) -> Result<(), CatchUpError> {
        let result = self.follower.catch_up_failed(id);
        self.drain_follower();
        result
    }

    /// The next event, or `None`. Drain after every input.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<ClientEvent> {
        if let Some(event) = self.events.pop_front() {
            return Some(event);
        }
        // Events of calls made through `follower_mut`.
        self.follower.poll_event().map(ClientEvent::Follower)
    }

    /// The next bytes to write, or `None`: whole lines, joined up to
    /// [`TcpSessionConfig::max_transmit_len`]. Take a chunk only when the socket
    /// can take it.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        self.conn
            .as_mut()?
            .poll_transmit(self.config.max_transmit_len)
    }

    /// When [`handle_timeout`](ClientSession::handle_timeout) must be called
    /// next; `None` while disconnected. Never before the last `now` given.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let deadline = self.conn.as_ref()?.deadline(&self.config)?;
        Some(match self.now {
            Some(now) => deadline.max(now),
            None => deadline,
        })
    }

    /// Where the connection stands; `None` while disconnected.
    pub fn state(&self) -> Option<ConnectionState> {
        self.conn.as_ref().map(Conn::public_state)
    }

    /// Whether a connection is up and the server's `SERVER` matched.
    pub fn is_ready(&self) -> bool {
        self.greeted && self.conn.as_ref().is_some_and(Conn::is_open)
    }

    /// Lines queued and not yet taken by `poll_transmit`.
    pub fn queued_commands(&self) -> usize {
        self.conn.as_ref().map_or(0, |conn| conn.out.len())
    }

    /// Bytes held for a received line whose `\n` has not arrived (never
    /// more than [`TcpSessionConfig::max_line_len`]).
    pub fn buffered_input(&self) -> usize {
        self.conn.as_ref().map_or(0, |conn| conn.lines.buffered())
    }

    /// The server name this client expects.
    pub fn server_name(&self) -> &str {
        &self.server_name
    }

    /// The follower.
    pub fn follower(&self) -> &Follower {
        &self.follower
    }

    /// The follower, to seed positions ([`Follower::set_position`]) or
    /// forget writers. Its events come out of
    /// [`poll_event`](ClientSession::poll_event).
    pub fn follower_mut(&mut self) -> &mut Follower {
        &mut self.follower
    }

    /// The configuration.
    pub fn config(&self) -> &TcpSessionConfig {
        &self.config
    }

    /// Ends the session, giving back the follower (disconnected).
    pub fn into_follower(mut self) -> Follower {
        self.follower.disconnected();
        self.follower
    }
}

#[derive(Debug)]
struct Client {
    conn: Conn,
    name: Option<ByteString>,
}

/// The server end of direct TCP replication: a process that writes streams
/// and serves them to many clients (Synapse's
/// `ServerReplicationStreamProtocol` and `ReplicationStreamer`), sans-IO.
///
/// It owns the [`Writer`] and every client connection: rows written are
/// encoded once and queued for every client; each client's `REPLICATE` is
/// answered, to that client alone, with `POSITION t t` for every stream the
/// server writes (Synapse broadcasts its answer to every client; answering
/// only the asker is equivalent for the others and spares them).
///
/// # Call order
///
/// - When a client connects, [`accept`](ServerSession::accept) it (this
///   queues `SERVER` and `PING`) and keep the [`ClientId`]; when its socket
///   closes or fails, call [`disconnected`](ServerSession::disconnected).
/// - Give every byte a client sent to
///   [`handle_input`](ServerSession::handle_input), call
///   [`handle_timeout`](ServerSession::handle_timeout) when the time given
///   by [`poll_timeout`](ServerSession::poll_timeout) has passed, and write
///   with [`write`](ServerSession::write),
///   [`advance`](ServerSession::advance), [`send`](ServerSession::send) and
///   [`send_to`](ServerSession::send_to).
/// - **After every input**: for each client, drain
///   [`poll_transmit`](ServerSession::poll_transmit) until `None` (when its
///   socket can take the bytes), then drain
///   [`poll_event`](ServerSession::poll_event), then read
///   [`poll_timeout`](ServerSession::poll_timeout).
/// - Time must not go backwards; `poll_timeout` is never before the last
///   `now` given and handling it always moves it forward. Calls that take
///   no `now` ([`write`](ServerSession::write), ...) happen at the last
///   `now` given: call `handle_timeout(now)` first if time moved (a stale
///   time only makes a `PING` come early).
/// - A client whose [`client_state`](ServerSession::client_state) is
///   [`ConnectionState::Closing`] gets its last bytes (the `ERROR` line)
///   written and its socket closed; on [`ConnectionState::Aborted`] the
///   socket is dropped at once.
///
/// Rows written between two turns of the event loop are queued for every
/// client at once: a burst of more than [`TcpSessionConfig::max_queued_commands`]
/// rows closes every connection (`ERROR Failed to keep up`). Write in
/// smaller steps, as Synapse's streamer does.
///
/// An `RDATA` whose line would exceed [`TcpSessionConfig::max_line_len`] cannot be
/// sent (Synapse raises and the row is lost); it is replaced by `POSITION t
/// t`, so that followers see the gap and fetch the row out of band (a
/// `batch` of which a row is too long goes the same way as a whole).
///
/// Its [`Debug`] output never shows a secret: of the lines queued or
/// partly received (a `USER_IP` carries an access token) it shows only
/// how many bytes there are, and [`UserIp`](crate::wire::UserIp) hides its
/// token.
#[derive(Debug)]
pub struct ServerSession {
    config: TcpSessionConfig,
    decoder: Decoder,
    server_line: Bytes,
    writer: Writer,
    clients: BTreeMap<ClientId, Client>,
    next_id: u64,
    events: VecDeque<ServerEvent>,
    now: Instant,
    clock: Option<PingClock>,
    /// Streams whose open batch had a row too long to send: its numbered
    /// row becomes a `POSITION`.
    cut_batches: Vec<StreamName>,
}

impl ServerSession {
    /// A server named `server_name` (Synapse's `server_name`, sent as
    /// `SERVER`) that serves the streams `writer` writes, with the default
    /// [`TcpSessionConfig`]. The writer is marked connected: positions and rows
    /// go to whichever clients are connected.
    ///
    /// Fails if the server name cannot be sent (it contains a newline).
    pub fn new(
        server_name: impl Into<ByteString>,
        writer: Writer,
        now: Instant,
    ) -> Result<ServerSession, EncodeError> {
        ServerSession::with_config(server_name, writer, TcpSessionConfig::default(), now)
    }

    /// A server with the given limits and timers.
    pub fn with_config(
        server_name: impl Into<ByteString>,
        mut writer: Writer,
        config: TcpSessionConfig,
        now: Instant,
    ) -> Result<ServerSession, EncodeError> {
        let mut server_line = BytesMut::new();
        Command::Server(server_name.into()).encode(&mut server_line)?;
        server_line.put_u8(b'\n');
        writer.connected(now);
        let mut session = ServerSession {
            decoder: Decoder::new().max_line_len(config.max_line_len),
            config,
            server_line: server_line.freeze(),
            writer,
            clients: BTreeMap::new(),
            next_id: 0,
            events: VecDeque::new(),
            now,
            clock: None,
            cut_batches: Vec::new(),
        };
        // The announcement of a server no one is connected to yet.
        session.fan_out();
        Ok(session)
    }

    /// Makes `PING` carry wall-clock milliseconds, as Synapse's do: `wall`
    /// is the wall-clock time at `now`. Without it, `PING` carries the
    /// milliseconds since the session was created.
    pub fn set_wall_clock(&mut self, now: Instant, wall: SystemTime) {
        self.clock = Some(wall_clock(now, wall));
    }

    fn tick(&mut self, now: Instant) -> Instant {
        if now > self.now {
            self.now = now;
        }
        self.now
    }

    fn ping_line(&mut self) -> Bytes {
        let now = self.now;
        clock_at(&mut self.clock, now).line(now)
    }

    /// A client connected: queues `SERVER` and `PING` for it.
    pub fn accept(&mut self, now: Instant) -> ClientId {
        let now = self.tick(now);
        self.next_id += 1;
        let id = ClientId(self.next_id);
        let mut conn = Conn::new(&self.config, now);
        conn.queue(self.server_line.clone(), &self.config, now);
        conn.queue(self.ping_line(), &self.config, now);
        self.clients.insert(id, Client { conn, name: None });
        id
    }

    /// The client's connection is gone. Returns `false` if the id is
    /// unknown.
    pub fn disconnected(&mut self, client: ClientId) -> bool {
        self.clients.remove(&client).is_some()
    }

    /// Handles bytes a client sent, in any chunks. Input for an unknown or
    /// closing client is ignored. Timers due at `now` are handled too.
    pub fn handle_input(&mut self, client: ClientId, data: &[u8], now: Instant) {
        let now = self.tick(now);
        if let Some(c) = self.clients.get_mut(&client) {
            if c.conn.is_open() {
                c.conn.lines.push(data);
            }
        }
        while let Some(c) = self.clients.get_mut(&client) {
            if !c.conn.is_open() {
                c.conn.lines.clear();
                break;
            }
            let line = match c.conn.lines.next_line() {
                Ok(Some(line)) => line,
                Ok(None) => break,
                Err(LineTooLong) => {
                    let max = self.config.max_line_len;
                    self.fail(client, TcpError::LineTooLong { max });
                    break;
                }
            };
            if let Err(error) = self.handle_line(client, line, now) {
                self.fail(client, error);
                break;
            }
        }
        self.handle_timeout(now);
    }

    fn handle_line(&mut self, client: ClientId, line: Bytes, now: Instant) -> Result<(), TcpError> {
        let command = match self.decoder.decode(line) {
            Ok(Some(command)) => command,
            Ok(None) => return Ok(()),
            Err(error) => return Err(TcpError::Decode(error)),
        };
        let kind = command.kind();
        if !kind.may_be_sent_by(Side::Client) {
            return Err(TcpError::WrongDirection {
                command: kind,
                sender: Side::Client,
            });
        }
        let Some(c) = self.clients.get_mut(&client) else {
            return Ok(());
        };
        c.conn.last_received = now;
        if self.config.report_received {
            self.events.push_back(ServerEvent::Received {
                client,
                command: command.clone(),
            });
        }
        match command {
            Command::Name(name) => {
                c.name = Some(name.clone());
                self.events.push_back(ServerEvent::Named { client, name });
            }
            Command::Ping(_) => {}
            Command::Replicate => {
                self.events.push_back(ServerEvent::Replicated { client });
                self.answer_replicate(client);
            }
            Command::Error(message) => {
                self.events
                    .push_back(ServerEvent::PeerError { client, message });
            }
            command @ (Command::RemoteServerUp(_) | Command::LockReleased(_)) => {
                if let Ok(line) = encode_line(&command, self.config.max_line_len) {
                    self.broadcast(line, Some(client));
                }
                self.events
                    .push_back(ServerEvent::Command { client, command });
            }
            command => self
                .events
                .push_back(ServerEvent::Command { client, command }),
        }
        Ok(())
    }

    fn answer_replicate(&mut self, client: ClientId) {
        let own = self.writer.own_name().clone();
        let lines: Vec<Bytes> = self
            .writer
            .positions()
            .filter_map(|(stream, token)| {
                let command = Command::Position(Position {
                    stream: stream.clone(),
                    instance: own.clone(),
                    prev_token: token,
                    new_token: token,
                });
                encode_line(&command, self.config.max_line_len).ok()
            })
            .collect();
        for line in lines {
            if self.queue_to(client, line).is_err() {
                break;
            }
        }
    }

    fn fail(&mut self, client: ClientId, error: TcpError) {
        let Some(c) = self.clients.get_mut(&client) else {
            return;
        };
        if !c.conn.is_open() {
            return;
        }
        c.conn.fail(&error.wire_message(), &self.config, self.now);
        self.events
            .push_back(ServerEvent::Closing { client, error });
    }

    fn queue_to(&mut self, client: ClientId, line: Bytes) -> Result<(), SendError> {
        let Some(c) = self.clients.get_mut(&client) else {
            return Err(SendError::UnknownClient(client));
        };
        match c.conn.queue(line, &self.config, self.now) {
            Queued::Ok => Ok(()),
            Queued::NotOpen => Err(SendError::Closing),
            Queued::Overflow { commands, bytes } => {
                self.fail(client, TcpError::FailedToKeepUp { commands, bytes });
                Err(SendError::Closing)
            }
        }
    }

    /// Queues one encoded line for every open client (but `except`).
    fn broadcast(&mut self, line: Bytes, except: Option<ClientId>) {
        let mut overflowed = Vec::new();
        for (id, c) in self.clients.iter_mut() {
            if Some(*id) == except {
                continue;
            }
            if let Queued::Overflow { commands, bytes } =
                c.conn.queue(line.clone(), &self.config, self.now)
            {
                overflowed.push((*id, commands, bytes));
            }
        }
        for (id, commands, bytes) in overflowed {
            self.fail(id, TcpError::FailedToKeepUp { commands, bytes });
        }
    }

    /// Sends what the writer queued to every client.
    fn fan_out(&mut self) {
        while let Some(command) = self.writer.poll_command() {
            if !command.kind().may_be_sent_by(Side::Server) {
                continue;
            }
            let encoded = encode_line(&command, self.config.max_line_len);
            let line = match (command, encoded) {
                (Command::Rdata(rdata), encoded) => match self.fit(rdata, encoded) {
                    Some(line) => line,
                    None => continue,
                },
                (_, Ok(line)) => line,
                (command, Err(error)) => {
                    tracing::warn!(%error, command = %command.kind(), "cannot send a command of the writer");
                    continue;
                }
            };
            self.broadcast(line, None);
        }
    }

    /// The line for an `RDATA`: itself, or `POSITION t t` when it (or a
    /// `batch` row before it) is too long for a line, or nothing for a
    /// `batch` row of such a batch.
    fn fit(&mut self, rdata: Rdata, encoded: Result<Bytes, SendError>) -> Option<Bytes> {
        let too_long = match &encoded {
            Ok(_) => false,
            Err(SendError::LineTooLong { .. }) => true,
            Err(error) => {
                tracing::warn!(%error, stream = %rdata.stream, "cannot send a row of the writer");
                return None;
            }
        };
        let cut = self.cut_batches.iter().position(|s| *s == rdata.stream);
        match rdata.token {
            RdataToken::Batch => {
                if too_long && cut.is_none() {
                    self.cut_batches.push(rdata.stream.clone());
                }
                if too_long || cut.is_some() {
                    // Fetched with the rest of its batch, see below.
                    return None;
                }
                encoded.ok()
            }
            RdataToken::At(token) => {
                if let Some(index) = cut {
                    self.cut_batches.swap_remove(index);
                }
                if !too_long && cut.is_none() {
                    return encoded.ok();
                }
                tracing::warn!(stream = %rdata.stream, %token, "row too long for direct TCP: sent as a POSITION, followers fetch it");
                let position = Command::Position(Position {
                    stream: rdata.stream,
                    instance: rdata.instance,
                    prev_token: token,
                    new_token: token,
                });
                encode_line(&position, self.config.max_line_len).ok()
            }
        }
    }

    /// Handles the timers due at `now`, for every client.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.tick(now);
        let mut pings = Vec::new();
        let mut silent = Vec::new();
        for (id, c) in self.clients.iter_mut() {
            match c.conn.on_timeout(&self.config, now) {
                Due::Nothing => {}
                Due::Ping => pings.push(*id),
                Due::Silent(duration) => silent.push((*id, duration)),
            }
        }
        for id in pings {
            let ping = self.ping_line();
            let _ = self.queue_to(id, ping);
        }
        for (id, duration) in silent {
            self.fail(id, TcpError::PingTimeout(duration));
        }
        self.writer.handle_timeout(now);
        self.fan_out();
    }

    /// Writes rows of `stream` and its current token (see
    /// [`Writer::write`]): `RDATA` (and `POSITION`) for every client.
    pub fn write(
        &mut self,
        stream: &StreamName,
        current: Token,
        updates: impl IntoIterator<Item = (Token, RawRow)>,
    ) -> Result<(), WriteError> {
        let result = self.writer.write(stream, current, updates);
        self.fan_out();
        result
    }

    /// The token of `stream` moved without rows (see [`Writer::advance`]).
    pub fn advance(&mut self, stream: &StreamName, current: Token) -> Result<(), WriteError> {
        let result = self.writer.advance(stream, current);
        self.fan_out();
        result
    }

    /// Sends a command to every client: `REMOTE_SERVER_UP`,
    /// `LOCK_RELEASED` (or `ERROR`, `PING`; rows go through
    /// [`write`](ServerSession::write)). Clients that overflow are closed.
    pub fn send(&mut self, command: Command) -> Result<(), SendError> {
        let line = self.server_line_for(&command)?;
        self.broadcast(line, None);
        Ok(())
    }

    /// Sends a command to one client.
    pub fn send_to(&mut self, client: ClientId, command: Command) -> Result<(), SendError> {
        let line = self.server_line_for(&command)?;
        self.queue_to(client, line)
    }

    fn server_line_for(&self, command: &Command) -> Result<Bytes, SendError> {
        let kind = command.kind();
        if !kind.may_be_sent_by(Side::Server) {
            return Err(SendError::WrongDirection {
                command: kind,
                sender: Side::Server,
            });
        }
        encode_line(command, self.config.max_line_len)
    }

    /// Closes a client's connection: `ERROR <message>` is its last line.
    pub fn close(&mut self, client: ClientId, message: &str) {
        self.fail(client, TcpError::ByApplication(message.to_owned()));
    }

    /// The next event, or `None`. Drain after every input.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<ServerEvent> {
        self.events.pop_front()
    }

    /// The next bytes to write to `client`, or `None`: whole lines, joined
    /// up to [`TcpSessionConfig::max_transmit_len`]. Take a chunk only when the
    /// client's socket can take it.
    #[must_use]
    pub fn poll_transmit(&mut self, client: ClientId) -> Option<Bytes> {
        self.clients
            .get_mut(&client)?
            .conn
            .poll_transmit(self.config.max_transmit_len)
    }

    /// When [`handle_timeout`](ServerSession::handle_timeout) must be called
    /// next (the earliest over every client); never before the last `now`
    /// given.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let clients = self
            .clients
            .values()
            .filter_map(|c| c.conn.deadline(&self.config));
        clients
            .chain(self.writer.poll_timeout())
            .min()
            .map(|deadline| deadline.max(self.now))
    }

    /// Where a client's connection stands; `None` if the id is unknown.
    pub fn client_state(&self, client: ClientId) -> Option<ConnectionState> {
        self.clients.get(&client).map(|c| c.conn.public_state())
    }

    /// The name a client gave with `NAME`, if any.
    pub fn client_name(&self, client: ClientId) -> Option<&str> {
        self.clients.get(&client)?.name.as_deref()
    }

    /// Every client, in the order accepted.
    pub fn clients(&self) -> impl Iterator<Item = ClientId> + '_ {
        self.clients.keys().copied()
    }

    /// Lines queued for `client` and not yet taken by `poll_transmit`.
    pub fn queued_commands(&self, client: ClientId) -> usize {
        self.clients.get(&client).map_or(0, |c| c.conn.out.len())
    }

    /// The writer (positions, counters).
    pub fn writer(&self) -> &Writer {
        &self.writer
    }

    /// The configuration.
    pub fn config(&self) -> &TcpSessionConfig {
        &self.config
    }
}
