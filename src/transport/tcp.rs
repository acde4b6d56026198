//! Async drivers for direct TCP replication: [`TcpServer`] accepts clients
//! and serves a [`ServerSession`]; [`TcpClient`] connects a
//! [`ClientSession`], reconnecting forever.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use futures::channel::mpsc;
use futures::stream::StreamExt;

use crate::positions::{
    CatchUpError, CatchUpId, CatchUpPage, CatchUpRequest, FollowerEvent, RowSource, Rows,
};
use crate::session::{
    ClientEvent, ClientId, ClientSession, ConnectionState, SendError, ServerEvent, ServerSession,
};
use crate::wire::{Command, CommandKind, InstanceName, StreamName, Token};
use bytestring::ByteString;

use super::catch_ups::{CatchUps, StuckCatchUp};
use super::runtime::{BoxConnection, BoxFuture, Listener, Runtime};
use super::socket::{Link, Timer};
use super::{Backoff, BoxError, CatchUpSource};

/// Passes of a driver's poll before it yields to the executor.
const BUDGET: usize = 32;

/// Why a connection ended.
#[derive(Debug)]
#[non_exhaustive]
pub enum Disconnect {
    /// The peer closed it.
    Closed,
    /// Reading or writing failed.
    Io(io::Error),
    /// This end closed it after a fatal error (reported before as the
    /// session's `Closing` event); the message is that error's.
    Fatal(String),
    /// The application closed it.
    Shutdown,
}

impl fmt::Display for Disconnect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Disconnect::Closed => f.write_str("closed by the peer"),
            Disconnect::Io(error) => write!(f, "i/o error: {error}"),
            Disconnect::Fatal(message) => write!(f, "closed: {message}"),
            Disconnect::Shutdown => f.write_str("shut down"),
        }
    }
}

/// Options of a [`TcpServer`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpServerConfig {
    /// Bytes read from a socket at once (64 KiB).
    pub read_buffer: usize,
    /// After accepting fails (too many open files...), wait this long
    /// before accepting again (100 ms).
    pub accept_pause: Duration,
    /// Connections served at once (1024), those closing included. A
    /// connection accepted beyond it is closed at once, before a byte is
    /// sent, reported as [`TcpServerEvent::Refused`] and counted in
    /// [`TcpServer::refused_connections`]; once a connection ends, the
    /// next is served again. 0 refuses every connection.
    pub max_connections: usize,
}

impl TcpServerConfig {
    /// The default of [`TcpServerConfig::max_connections`].
    pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
}

impl Default for TcpServerConfig {
    fn default() -> Self {
        TcpServerConfig {
            read_buffer: 64 << 10,
            accept_pause: Duration::from_millis(100),
            max_connections: TcpServerConfig::DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// What a [`TcpServer`] tells the application.
#[derive(Debug)]
#[non_exhaustive]
pub enum TcpServerEvent {
    /// A client connected; `SERVER` and `PING` are on their way.
    Accepted {
        /// Its id in the session.
        client: ClientId,
        /// Its address.
        peer: SocketAddr,
    },
    /// A client's connection ended; the session forgot it.
    Disconnected {
        /// The client.
        client: ClientId,
        /// Why.
        reason: Disconnect,
    },
    /// Accepting a connection failed; the server goes on after
    /// [`TcpServerConfig::accept_pause`].
    AcceptFailed(io::Error),
    /// A connection was closed as soon as it was accepted: the server
    /// already serves [`TcpServerConfig::max_connections`]. Counted in
    /// [`TcpServer::refused_connections`].
    Refused {
        /// Its address.
        peer: SocketAddr,
    },
    /// What the session reports.
    Session(ServerEvent),
}

struct ServerLink {
    link: Link,
    error: Option<String>,
}

/// A direct TCP replication server: accepts clients and serves them a
/// [`ServerSession`] (the streams its [`Writer`](crate::positions::Writer)
/// writes).
///
/// Nothing happens unless [`next_event`](TcpServer::next_event) is awaited:
/// it accepts, reads, writes and runs the timers, and returns as soon as
/// there is something to report. Write rows between two calls through
/// [`session_mut`](TcpServer::session_mut) (`write`, `advance`, `send`);
/// they are sent during the next call.
///
/// It serves at most [`TcpServerConfig::max_connections`] clients at
/// once (1024 by default); a connection beyond that is closed as soon as
/// it is accepted ([`TcpServerEvent::Refused`]).
///
/// ```no_run
/// # #[cfg(feature = "runtime-smol")]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Instant;
/// use synapse_replication::positions::Writer;
/// use synapse_replication::session::ServerSession;
/// use synapse_replication::transport::{SmolRuntime, TcpServer};
/// use synapse_replication::wire::{InstanceName, StreamName, Token};
/// use synapse_replication::writers::StreamWriters;
///
/// let mut writer = Writer::new(InstanceName::master(), Arc::new(StreamWriters::default()));
/// writer.advance(&StreamName::Caches, Token(0))?;
/// let session = ServerSession::new("example.com", writer, Instant::now())?;
/// smol::block_on(async {
///     let mut server = TcpServer::bind(SmolRuntime, "127.0.0.1:9092", session).await?;
///     loop {
///         let event = server.next_event().await;
///         println!("{event:?}");
///     }
/// })
/// # }
/// # #[cfg(not(feature = "runtime-smol"))]
/// # fn main() {}
/// ```
pub struct TcpServer<R: Runtime> {
    runtime: R,
    listener: Box<dyn Listener>,
    session: ServerSession,
    links: BTreeMap<ClientId, ServerLink>,
    events: VecDeque<TcpServerEvent>,
    timer: Timer,
    read_buffer: Vec<u8>,
    options: TcpServerConfig,
    accept_pause: Option<BoxFuture<'static, ()>>,
    refused: u64,
}

impl<R: Runtime> fmt::Debug for TcpServer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpServer")
            .field("local_addr", &self.listener.local_addr().ok())
            .field("clients", &self.links.len())
            .field("refused", &self.refused)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

impl<R: Runtime> TcpServer<R> {
    /// Listens on `addr` (`host:port`, port 0 picks one) with the default
    /// options.
    pub async fn bind(runtime: R, addr: &str, session: ServerSession) -> io::Result<TcpServer<R>> {
        TcpServer::bind_with(runtime, addr, session, TcpServerConfig::default()).await
    }

    /// Listens on `addr` with the given options.
    pub async fn bind_with(
        runtime: R,
        addr: &str,
        mut session: ServerSession,
        options: TcpServerConfig,
    ) -> io::Result<TcpServer<R>> {
        let listener = runtime.listen(addr).await?;
        session.set_wall_clock(runtime.now(), SystemTime::now());
        Ok(TcpServer {
            runtime,
            listener,
            session,
            links: BTreeMap::new(),
            events: VecDeque::new(),
            timer: Timer::new(),
            read_buffer: Vec::new(),
            options,
            accept_pause: None,
            refused: 0,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The session.
    pub fn session(&self) -> &ServerSession {
        &self.session
    }

    /// Connections closed at once because
    /// [`TcpServerConfig::max_connections`] were already served.
    pub fn refused_connections(&self) -> u64 {
        self.refused
    }

    /// The session, to write rows and send commands. Do not `accept` or
    /// disconnect clients through it: the server does.
    pub fn session_mut(&mut self) -> &mut ServerSession {
        &mut self.session
    }

    /// Drives every connection until there is something to report. Never
    /// ends: a failing client only ends its own connection.
    pub async fn next_event(&mut self) -> TcpServerEvent {
        poll_fn(|cx| self.poll_next_event(cx)).await
    }

    /// Polls for the next event; see [`next_event`](TcpServer::next_event).
    pub fn poll_next_event(&mut self, cx: &mut Context<'_>) -> Poll<TcpServerEvent> {
        for _ in 0..BUDGET {
            if let Some(event) = self.events.pop_front() {
                return Poll::Ready(event);
            }
            let now = self.runtime.now();
            let mut progress = self.poll_accept(cx, now);
            progress |= self.poll_links(cx, now);
            if let Some(deadline) = self.session.poll_timeout() {
                if self.timer.poll(&self.runtime, deadline, now, cx) {
                    self.session.handle_timeout(now.max(deadline));
                    progress = true;
                }
            }
            self.drain_session();
            if !progress && self.events.is_empty() {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn drain_session(&mut self) {
        while let Some(event) = self.session.poll_event() {
            if let ServerEvent::Closing { client, error } = &event {
                if let Some(link) = self.links.get_mut(client) {
                    link.error = Some(error.to_string());
                }
            }
            self.events.push_back(TcpServerEvent::Session(event));
        }
    }

    fn poll_accept(&mut self, cx: &mut Context<'_>, now: Instant) -> bool {
        if let Some(pause) = self.accept_pause.as_mut() {
            if pause.as_mut().poll(cx).is_pending() {
                return false;
            }
            self.accept_pause = None;
        }
        let mut progress = false;
        for _ in 0..BUDGET {
            match self.listener.poll_accept(cx) {
                Poll::Ready(Ok((io, peer))) if self.links.len() >= self.options.max_connections => {
                    // Dropping the socket closes it: nothing was sent.
                    drop(io);
                    self.refused += 1;
                    self.events.push_back(TcpServerEvent::Refused { peer });
                    progress = true;
                }
                Poll::Ready(Ok((io, peer))) => {
                    let client = self.session.accept(now);
                    self.links.insert(
                        client,
                        ServerLink {
                            link: Link::new(io),
                            error: None,
                        },
                    );
                    self.events
                        .push_back(TcpServerEvent::Accepted { client, peer });
                    progress = true;
                }
                Poll::Ready(Err(error)) => {
                    self.events.push_back(TcpServerEvent::AcceptFailed(error));
                    let until = now + self.options.accept_pause;
                    self.accept_pause = Some(self.runtime.sleep_until(until));
                    return true;
                }
                Poll::Pending => return progress,
            }
        }
        cx.waker().wake_by_ref();
        progress
    }

    fn poll_links(&mut self, cx: &mut Context<'_>, now: Instant) -> bool {
        let mut progress = false;
        let mut gone = Vec::new();
        for (&client, server_link) in self.links.iter_mut() {
            let session = &mut self.session;
            let link = &mut server_link.link;
            let state = session.client_state(client);
            if matches!(state, None | Some(ConnectionState::Aborted)) {
                gone.push((
                    client,
                    Disconnect::Fatal(server_link.error.take().unwrap_or_default()),
                ));
                continue;
            }
            let written = match link.poll_write(cx, || session.poll_transmit(client)) {
                Ok(written) => written,
                Err(error) => {
                    gone.push((client, Disconnect::Io(error)));
                    continue;
                }
            };
            progress |= written.progress;
            if state == Some(ConnectionState::Closing) {
                if written.drained {
                    match link.poll_close(cx) {
                        Poll::Ready(_) => {
                            let message = server_link.error.take().unwrap_or_default();
                            gone.push((client, Disconnect::Fatal(message)));
                        }
                        Poll::Pending => {}
                    }
                }
                continue;
            }
            let size = self.options.read_buffer.max(1);
            if self.read_buffer.len() < size {
                self.read_buffer.resize(size, 0);
            }
            match link.poll_read_into(cx, &mut self.read_buffer) {
                Poll::Ready(Ok(0)) => gone.push((client, Disconnect::Closed)),
                Poll::Ready(Ok(n)) => {
                    session.handle_input(
                        client,
                        self.read_buffer.get(..n).unwrap_or_default(),
                        now,
                    );
                    progress = true;
                }
                Poll::Ready(Err(error)) => gone.push((client, Disconnect::Io(error))),
                Poll::Pending => {}
            }
        }
        for (client, reason) in gone {
            self.links.remove(&client);
            self.session.disconnected(client);
            self.events
                .push_back(TcpServerEvent::Disconnected { client, reason });
            progress = true;
        }
        progress
    }
}

/// Options of a [`TcpClient`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpClientConfig {
    /// The first reconnection delay (100 ms); it doubles after each failed
    /// attempt, with jitter (see [`Backoff`]).
    pub initial_backoff: Duration,
    /// The longest reconnection delay (5 s).
    pub max_backoff: Duration,
    /// A connection that was ready for this long resets the delay (5 s),
    /// so that a server that accepts and then drops clients at once is not
    /// hammered.
    pub stable_after: Duration,
    /// Give up a connection attempt after this long (30 s, as Synapse).
    pub connect_timeout: Duration,
    /// The first delay before asking a failed catch-up again (500 ms,
    /// doubling to `max_backoff`).
    pub catch_up_backoff: Duration,
    /// Bytes read from the socket at once (64 KiB).
    pub read_buffer: usize,
    /// Commands the client's [`CommandSender`]s may queue between two
    /// turns of [`next_event`](TcpClient::next_event) (4096, see
    /// [`CommandSender::DEFAULT_CAPACITY`]). Beyond it
    /// [`CommandSender::send`] refuses with [`CommandSendError::Full`],
    /// counted in [`TcpClient::refused_commands`]. 0 refuses every command.
    pub command_queue: usize,
}

impl Default for TcpClientConfig {
    fn default() -> Self {
        TcpClientConfig {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            stable_after: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(30),
            catch_up_backoff: Duration::from_millis(500),
            read_buffer: 64 << 10,
            command_queue: CommandSender::DEFAULT_CAPACITY,
        }
    }
}

/// What a [`TcpClient`] tells the application.
///
/// The common events are one level deep, as for
/// [`RedisClientEvent`](super::RedisClientEvent): [`Ready`](Self::Ready),
/// [`Rows`](Self::Rows), [`Position`](Self::Position), the server's
/// [`Command`](Self::Command)s, and the connection's and catch-ups' ups
/// and downs; what else the session reports comes as
/// [`Session`](Self::Session).
#[derive(Debug)]
#[non_exhaustive]
pub enum TcpClientEvent {
    /// The server greeted with the expected `SERVER` name: the handshake
    /// is complete.
    Ready {
        /// The server name.
        server_name: ByteString,
    },
    /// Rows of one token of `stream`, written by `writer`, to apply
    /// together (see [`FollowerEvent::Rows`]).
    Rows {
        /// The stream.
        stream: StreamName,
        /// The writer that wrote them.
        writer: InstanceName,
        /// Their token: the writer's position once they are applied.
        token: Token,
        /// The rows, in the order written.
        rows: Rows,
        /// Whether they came live or from a catch-up.
        source: RowSource,
    },
    /// A writer's position moved without rows (see
    /// [`FollowerEvent::Position`]).
    Position {
        /// The stream.
        stream: StreamName,
        /// The writer.
        writer: InstanceName,
        /// The new position.
        token: Token,
    },
    /// The follower began following a writer it had no position for;
    /// rows before `token` were not fetched (see
    /// [`FollowerEvent::Started`]).
    Started {
        /// The stream.
        stream: StreamName,
        /// The writer.
        writer: InstanceName,
        /// Where following starts.
        token: Token,
    },
    /// A writer's stream went backwards: it restarted (see
    /// [`FollowerEvent::Reset`]).
    Reset {
        /// The stream.
        stream: StreamName,
        /// The writer.
        writer: InstanceName,
        /// The position before the reset.
        previous: Token,
        /// The writer's announced position.
        new: Token,
    },
    /// A command for the application: `REMOTE_SERVER_UP` or
    /// `LOCK_RELEASED`.
    Command(Command),
    /// The TCP connection is up; `NAME`, `PING` and `REPLICATE` are on
    /// their way. Send what the server must hear on every connection now
    /// (Synapse's workers send a `USER_SYNC` per syncing user).
    Connected,
    /// Connecting failed; the next attempt is in `retry_in`.
    ConnectFailed {
        /// Why.
        error: io::Error,
        /// The delay before the next attempt.
        retry_in: Duration,
    },
    /// The connection ended; the next attempt is in `retry_in`. The
    /// follower dropped what belonged to the connection (open batches,
    /// commands held behind catch-ups); on the next connection the
    /// server's `POSITION`s show what was missed, and catch-ups fetch it.
    Disconnected {
        /// Why.
        reason: Disconnect,
        /// The delay before reconnecting.
        retry_in: Duration,
    },
    /// What else the session reports: the server's `ERROR`s, the
    /// follower's other events (catch-ups it asked for, rejected writers),
    /// commands received with `report_received`, and why it closes.
    Session(ClientEvent),
    /// The [`CatchUpSource`] failed; the catch-up is asked again (with a
    /// new id) after `retry_in`. Only this writer's rows of the stream wait
    /// for it. Each writer's retries back off on their own.
    CatchUpFailed {
        /// The request that failed.
        request: CatchUpRequest,
        /// Why.
        error: BoxError,
        /// The delay before asking again.
        retry_in: Duration,
        /// Failures in a row of this writer's catch-up, this one included
        /// (since when: `stuck_catch_ups`, once it is stuck).
        failures: u32,
    },
    /// A catch-up failed [`STUCK_AFTER_FAILURES`](super::STUCK_AFTER_FAILURES) times in a row (reported
    /// once per run of failures; it is still retried). Until it succeeds it
    /// is listed by `stuck_catch_ups`.
    CatchUpStuck(StuckCatchUp),
    /// A command given to a [`CommandSender`] could not be sent (not
    /// connected, or refused); it was dropped.
    SendFailed {
        /// The command.
        command: CommandKind,
        /// Why.
        error: SendError,
    },
}

impl From<ClientEvent> for TcpClientEvent {
    /// Brings the common session events up one level.
    fn from(event: ClientEvent) -> TcpClientEvent {
        match event {
            ClientEvent::Ready { server_name } => TcpClientEvent::Ready { server_name },
            ClientEvent::Command(command) => TcpClientEvent::Command(command),
            ClientEvent::Follower(event) => from_follower!(event, TcpClientEvent, |other| {
                TcpClientEvent::Session(ClientEvent::Follower(other))
            }),
            other => TcpClientEvent::Session(other),
        }
    }
}

impl TcpClientEvent {
    /// The follower's event this is, if it is one (rows, positions,
    /// resets, and the follower's other events inside
    /// [`Session`](Self::Session)); the event itself otherwise. For code
    /// that handles [`FollowerEvent`]s whatever the transport.
    pub fn into_follower_event(self) -> Result<FollowerEvent, TcpClientEvent> {
        into_follower!(self, TcpClientEvent, ClientEvent)
    }
}

impl fmt::Display for TcpClientEvent {
    /// One line (rows are counted, not printed; no secret is shown).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(done) = fmt_follower!(f, self, TcpClientEvent) {
            return done;
        }
        match self {
            TcpClientEvent::Ready { server_name } => write!(f, "ready {server_name}"),
            TcpClientEvent::Command(command) => write!(f, "command {command:?}"),
            TcpClientEvent::Connected => f.write_str("connected"),
            TcpClientEvent::ConnectFailed { error, retry_in } => write!(
                f,
                "connecting failed: {error}; retry in {} ms",
                retry_in.as_millis()
            ),
            TcpClientEvent::Disconnected { reason, retry_in } => write!(
                f,
                "disconnected: {reason}; retry in {} ms",
                retry_in.as_millis()
            ),
            TcpClientEvent::Session(event) => write!(f, "{event}"),
            TcpClientEvent::CatchUpFailed {
                request,
                error,
                retry_in,
                failures,
                ..
            } => write!(
                f,
                "{request} failed ({failures} in a row): {error}; retry in {} ms",
                retry_in.as_millis()
            ),
            TcpClientEvent::CatchUpStuck(stuck) => write!(f, "{stuck}"),
            TcpClientEvent::SendFailed { command, error } => {
                write!(f, "sending {command} failed: {error}")
            }
            // The follower's, formatted above.
            _ => Ok(()),
        }
    }
}

/// Why a [`CommandSender`] did not queue a command. Each gives the command
/// back ([`CommandSendError::into_command`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandSendError {
    /// The queue holds its capacity of commands: the client's task has not
    /// taken them yet (it is busy, or `next_event` is not being awaited).
    /// Retry later, or drop the command; counted in the client's
    /// `refused_commands`.
    #[error("command queue full ({capacity} commands): the client is not taking them")]
    Full {
        /// The command.
        command: Box<Command>,
        /// The queue's capacity.
        capacity: usize,
    },
    /// The client was closed or dropped: no command will be sent any more.
    #[error("the client is closed")]
    Closed(Box<Command>),
}

impl CommandSendError {
    /// The command that was not queued.
    pub fn into_command(self) -> Command {
        match self {
            CommandSendError::Full { command, .. } | CommandSendError::Closed(command) => *command,
        }
    }
}

/// The bound of a client's command queue, and what it refused.
#[derive(Debug)]
struct QueueCount {
    capacity: usize,
    len: AtomicUsize,
    refused: AtomicU64,
}

/// Sends commands to a [`TcpClient`] or a [`RedisClient`](super::RedisClient)
/// from other tasks; they are sent during the client's next `next_event`.
///
/// The queue is bounded (the clients' `command_queue` option,
/// [`CommandSender::DEFAULT_CAPACITY`] by default): when it is full,
/// [`send`](CommandSender::send) returns [`CommandSendError::Full`] with
/// the command at once, and the client counts it (`refused_commands`).
#[derive(Clone, Debug)]
pub struct CommandSender {
    sender: mpsc::UnboundedSender<Command>,
    count: Arc<QueueCount>,
}

impl CommandSender {
    /// The default capacity of a client's command queue: 4096 commands.
    pub const DEFAULT_CAPACITY: usize = 4096;

    /// Queues `command`, or gives it back: [`CommandSendError::Full`] when
    /// the queue holds its capacity, [`CommandSendError::Closed`] once the
    /// client is closed or dropped. Never waits.
    pub fn send(&self, command: Command) -> Result<(), CommandSendError> {
        let count = &self.count;
        let mut len = count.len.load(Ordering::Acquire);
        loop {
            if len >= count.capacity {
                count.refused.fetch_add(1, Ordering::Relaxed);
                return Err(CommandSendError::Full {
                    command: Box::new(command),
                    capacity: count.capacity,
                });
            }
            match count
                .len
                .compare_exchange_weak(len, len + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(now) => len = now,
            }
        }
        self.sender.unbounded_send(command).map_err(|error| {
            count.len.fetch_sub(1, Ordering::AcqRel);
            CommandSendError::Closed(Box::new(error.into_inner()))
        })
    }

    /// The most commands the queue holds.
    pub fn capacity(&self) -> usize {
        self.count.capacity
    }
}

/// The client's end of the command queue.
pub(super) struct CommandQueue {
    receiver: mpsc::UnboundedReceiver<Command>,
    count: Arc<QueueCount>,
}

impl CommandQueue {
    /// A queue of `capacity` commands, and a sender to clone.
    pub(super) fn new(capacity: usize) -> (CommandQueue, CommandSender) {
        let (sender, receiver) = mpsc::unbounded();
        let count = Arc::new(QueueCount {
            capacity,
            len: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
        });
        let queue = CommandQueue {
            receiver,
            count: Arc::clone(&count),
        };
        (queue, CommandSender { sender, count })
    }

    /// The next command queued, if any.
    pub(super) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Command>> {
        let next = self.receiver.poll_next_unpin(cx);
        if let Poll::Ready(Some(_)) = &next {
            self.count.len.fetch_sub(1, Ordering::AcqRel);
        }
        next
    }

    /// Refuses every command from now on ([`CommandSendError::Closed`]).
    pub(super) fn close(&mut self) {
        self.receiver.close();
    }

    /// Commands refused because the queue was full.
    pub(super) fn refused(&self) -> u64 {
        self.count.refused.load(Ordering::Relaxed)
    }
}

struct Live {
    link: Link,
    ready_at: Option<Instant>,
    error: Option<String>,
}

enum ClientState {
    Start,
    Connecting {
        connect: BoxFuture<'static, io::Result<BoxConnection>>,
        timeout: BoxFuture<'static, ()>,
    },
    Connected(Box<Live>),
    Waiting(BoxFuture<'static, ()>),
    Shutdown,
}

/// A direct TCP replication client: connects a [`ClientSession`] to a
/// server and reconnects forever, with backoff.
///
/// Nothing happens unless [`next_event`](TcpClient::next_event) is awaited:
/// it connects, reads, writes, runs the timers and the catch-ups, and
/// returns as soon as there is something to report. Apply the follower's
/// events in order as they come; a client whose application stops calling
/// `next_event` stops answering pings and is disconnected by the server.
///
/// Reconnecting: after a lost connection the next attempt waits a delay
/// that doubles from [`TcpClientConfig::initial_backoff`] up to
/// [`TcpClientConfig::max_backoff`] (5 s), with jitter; a connection that
/// stayed ready for [`TcpClientConfig::stable_after`] resets it. The first
/// attempt is immediate.
pub struct TcpClient<R: Runtime> {
    runtime: R,
    addr: String,
    options: TcpClientConfig,
    session: ClientSession,
    state: ClientState,
    events: VecDeque<TcpClientEvent>,
    catch_ups: CatchUps,
    backoff: Backoff,
    timer: Timer,
    read_buffer: Vec<u8>,
    commands: CommandQueue,
    sender: CommandSender,
}

impl<R: Runtime> fmt::Debug for TcpClient<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            ClientState::Start => "start",
            ClientState::Connecting { .. } => "connecting",
            ClientState::Connected(_) => "connected",
            ClientState::Waiting(_) => "waiting",
            ClientState::Shutdown => "shut down",
        };
        f.debug_struct("TcpClient")
            .field("addr", &self.addr)
            .field("state", &state)
            .field("session", &self.session)
            .field("fetches", &self.catch_ups.len())
            .field("refused_commands", &self.commands.refused())
            .finish_non_exhaustive()
    }
}

impl<R: Runtime> TcpClient<R> {
    /// A client of the server at `addr` (`host:port`) with the default
    /// options. It connects on the first
    /// [`next_event`](TcpClient::next_event).
    pub fn new(runtime: R, addr: impl Into<String>, session: ClientSession) -> TcpClient<R> {
        TcpClient::with_options(runtime, addr, session, TcpClientConfig::default())
    }

    /// A client with the given options.
    pub fn with_options(
        runtime: R,
        addr: impl Into<String>,
        session: ClientSession,
        options: TcpClientConfig,
    ) -> TcpClient<R> {
        let (commands, sender) = CommandQueue::new(options.command_queue);
        TcpClient {
            runtime,
            addr: addr.into(),
            backoff: Backoff::new(options.initial_backoff, options.max_backoff),
            catch_ups: CatchUps::new(options.catch_up_backoff, options.max_backoff),
            options,
            session,
            state: ClientState::Start,
            events: VecDeque::new(),
            timer: Timer::new(),
            read_buffer: Vec::new(),
            commands,
            sender,
        }
    }

    /// Fetches missed rows from `source`: every catch-up the follower asks
    /// for is fetched and applied by the client, failures retried with
    /// backoff. The follower's `CatchUp` events are still reported.
    #[must_use]
    pub fn with_catch_up(mut self, source: Arc<dyn CatchUpSource>) -> TcpClient<R> {
        self.catch_ups.set_source(source);
        self
    }

    /// The catch-ups that failed [`STUCK_AFTER_FAILURES`](super::STUCK_AFTER_FAILURES) times or more in
    /// a row and have not succeeded since, oldest first: what is stuck, and
    /// since when.
    pub fn stuck_catch_ups(&self) -> Vec<StuckCatchUp> {
        self.catch_ups.stuck()
    }

    /// The session (the follower, the connection's state).
    pub fn session(&self) -> &ClientSession {
        &self.session
    }

    /// The session, to seed positions through its follower. Do not
    /// connect or disconnect it: the client does.
    pub fn session_mut(&mut self) -> &mut ClientSession {
        &mut self.session
    }

    /// A handle to send commands from other tasks, through a queue of
    /// [`TcpClientConfig::command_queue`] commands.
    pub fn sender(&self) -> CommandSender {
        self.sender.clone()
    }

    /// Commands a [`CommandSender`] refused because the queue was full.
    pub fn refused_commands(&self) -> u64 {
        self.commands.refused()
    }

    /// Queues a command for the server (see [`ClientSession::send`]); it is
    /// written during the next [`next_event`](TcpClient::next_event).
    pub fn send(&mut self, command: Command) -> Result<(), SendError> {
        self.session.send(command)
    }

    /// Answers a catch-up the application fetched itself (without a
    /// [`CatchUpSource`]).
    pub fn handle_catch_up(
        &mut self,
        id: CatchUpId,
        page: CatchUpPage,
    ) -> Result<(), CatchUpError> {
        self.session.handle_catch_up(id, page)
    }

    /// A catch-up the application fetched itself failed: it is asked again.
    pub fn catch_up_failed(&mut self, id: CatchUpId) -> Result<(), CatchUpError> {
        self.session.catch_up_failed(id)
    }

    /// Whether the connection is up and the server greeted as expected.
    pub fn is_ready(&self) -> bool {
        self.session.is_ready()
    }

    /// Drives the connection until there is something to report; `None`
    /// once [`close`](TcpClient::close) was called.
    ///
    /// Cancel safe: dropping the future (in a `select!` with a timer, say)
    /// loses no event and no row.
    pub async fn next_event(&mut self) -> Option<TcpClientEvent> {
        poll_fn(|cx| self.poll_next_event(cx)).await
    }

    /// Writes what is queued (within
    /// [`TcpSessionConfig::close_timeout`](crate::session::TcpSessionConfig::close_timeout)),
    /// closes the connection and stops: [`next_event`](TcpClient::next_event)
    /// returns `None` from now on.
    pub async fn close(&mut self) {
        if let ClientState::Connected(live) = &mut self.state {
            let deadline = self.runtime.now() + self.session.config().close_timeout;
            let mut sleep = self.runtime.sleep_until(deadline);
            let session = &mut self.session;
            poll_fn(|cx| {
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(());
                }
                match live.link.poll_write(cx, || session.poll_transmit()) {
                    Ok(written) if written.drained => live.link.poll_close(cx).map(|_| ()),
                    Ok(_) => Poll::Pending,
                    Err(_) => Poll::Ready(()),
                }
            })
            .await;
        }
        if !matches!(self.state, ClientState::Shutdown) {
            self.session.disconnected();
        }
        self.state = ClientState::Shutdown;
        self.commands.close();
        self.catch_ups.clear();
        self.events.clear();
    }

    /// Polls for the next event; see [`next_event`](TcpClient::next_event).
    pub fn poll_next_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<TcpClientEvent>> {
        for _ in 0..BUDGET {
            if let Some(event) = self.events.pop_front() {
                return Poll::Ready(Some(event));
            }
            if matches!(self.state, ClientState::Shutdown) {
                return Poll::Ready(None);
            }
            let mut progress = self.poll_commands(cx);
            progress |= self.poll_fetches(cx);
            progress |= self.poll_state(cx);
            self.drain_session();
            if !progress && self.events.is_empty() {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn poll_commands(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        while let Poll::Ready(Some(command)) = self.commands.poll_next(cx) {
            progress = true;
            let kind = command.kind();
            if let Err(error) = self.session.send(command) {
                self.events.push_back(TcpClientEvent::SendFailed {
                    command: kind,
                    error,
                });
            }
        }
        progress
    }

    fn poll_fetches(&mut self, cx: &mut Context<'_>) -> bool {
        let events = &mut self.events;
        self.catch_ups
            .poll(cx, &self.runtime, &mut self.session, |failure| {
                events.push_back(TcpClientEvent::CatchUpFailed {
                    request: failure.request,
                    error: failure.error,
                    retry_in: failure.retry_in,
                    failures: failure.failures,
                });
                if let Some(stuck) = failure.stuck {
                    events.push_back(TcpClientEvent::CatchUpStuck(stuck));
                }
            })
    }

    fn drain_session(&mut self) {
        while let Some(event) = self.session.poll_event() {
            match &event {
                ClientEvent::Follower(FollowerEvent::CatchUp(request)) => {
                    self.catch_ups.start(request);
                }
                ClientEvent::Closing(error) => {
                    if let ClientState::Connected(live) = &mut self.state {
                        live.error = Some(error.to_string());
                    }
                }
                _ => {}
            }
            self.events.push_back(TcpClientEvent::from(event));
        }
    }

    fn poll_state(&mut self, cx: &mut Context<'_>) -> bool {
        let now = self.runtime.now();
        match &mut self.state {
            ClientState::Shutdown => false,
            ClientState::Start => {
                self.start_connecting(now);
                true
            }
            ClientState::Waiting(sleep) => {
                if sleep.as_mut().poll(cx).is_pending() {
                    return false;
                }
                self.start_connecting(now);
                true
            }
            ClientState::Connecting { connect, timeout } => {
                let result = match connect.as_mut().poll(cx) {
                    Poll::Ready(result) => result,
                    Poll::Pending => match timeout.as_mut().poll(cx) {
                        Poll::Ready(()) => Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "connection attempt timed out",
                        )),
                        Poll::Pending => return false,
                    },
                };
                match result {
                    Ok(io) => {
                        self.session.set_wall_clock(now, SystemTime::now());
                        self.session.connect(now);
                        self.state = ClientState::Connected(Box::new(Live {
                            link: Link::new(io),
                            ready_at: None,
                            error: None,
                        }));
                        self.events.push_back(TcpClientEvent::Connected);
                    }
                    Err(error) => {
                        let retry_in = self.wait(now);
                        self.events
                            .push_back(TcpClientEvent::ConnectFailed { error, retry_in });
                    }
                }
                true
            }
            ClientState::Connected(_) => self.poll_connected(cx, now),
        }
    }

    fn start_connecting(&mut self, now: Instant) {
        let deadline = now + self.options.connect_timeout;
        self.state = ClientState::Connecting {
            connect: self.runtime.connect(&self.addr),
            timeout: self.runtime.sleep_until(deadline),
        };
    }

    /// Schedules the next attempt; returns its delay.
    fn wait(&mut self, now: Instant) -> Duration {
        let retry_in = self.backoff.next_delay();
        self.state = ClientState::Waiting(self.runtime.sleep_until(now + retry_in));
        retry_in
    }

    fn poll_connected(&mut self, cx: &mut Context<'_>, now: Instant) -> bool {
        let ClientState::Connected(live) = &mut self.state else {
            return false;
        };
        let session = &mut self.session;
        if live.ready_at.is_none() && session.is_ready() {
            live.ready_at = Some(now);
        }
        let state = session.state();
        if matches!(state, None | Some(ConnectionState::Aborted)) {
            let message = live.error.take().unwrap_or_default();
            self.lost(Disconnect::Fatal(message), now);
            return true;
        }
        let written = match live.link.poll_write(cx, || session.poll_transmit()) {
            Ok(written) => written,
            Err(error) => {
                self.lost(Disconnect::Io(error), now);
                return true;
            }
        };
        let mut progress = written.progress;
        if state == Some(ConnectionState::Closing) {
            if written.drained && live.link.poll_close(cx).is_ready() {
                let message = live.error.take().unwrap_or_default();
                self.lost(Disconnect::Fatal(message), now);
                return true;
            }
        } else {
            let size = self.options.read_buffer.max(1);
            if self.read_buffer.len() < size {
                self.read_buffer.resize(size, 0);
            }
            match live.link.poll_read_into(cx, &mut self.read_buffer) {
                Poll::Ready(Ok(n)) if n > 0 => {
                    session.handle_input(self.read_buffer.get(..n).unwrap_or_default(), now);
                    progress = true;
                }
                Poll::Ready(Ok(_)) => {
                    self.lost(Disconnect::Closed, now);
                    return true;
                }
                Poll::Ready(Err(error)) => {
                    self.lost(Disconnect::Io(error), now);
                    return true;
                }
                Poll::Pending => {}
            }
        }
        if let Some(deadline) = self.session.poll_timeout() {
            if self.timer.poll(&self.runtime, deadline, now, cx) {
                self.session.handle_timeout(now.max(deadline));
                progress = true;
            }
        }
        progress
    }

    fn lost(&mut self, reason: Disconnect, now: Instant) {
        let stable = match &self.state {
            ClientState::Connected(live) => live.ready_at.is_some_and(|ready| {
                now.saturating_duration_since(ready) >= self.options.stable_after
            }),
            _ => false,
        };
        if stable {
            self.backoff.reset();
        }
        self.session.disconnected();
        self.drain_session();
        let retry_in = self.wait(now);
        self.events
            .push_back(TcpClientEvent::Disconnected { reason, retry_in });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drivers can be moved to a spawned task.
    #[test]
    fn drivers_are_send() {
        fn send<T: Send>() {}
        send::<TcpClient<Arc<dyn Runtime>>>();
        send::<TcpServer<Arc<dyn Runtime>>>();
        send::<TcpClientEvent>();
        send::<TcpServerEvent>();
        send::<CommandSender>();
    }
}
