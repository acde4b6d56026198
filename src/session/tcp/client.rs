//! The client end: a worker following a server's streams.

use std::collections::VecDeque;
use std::time::{Instant, SystemTime};

use bytes::{BufMut, Bytes, BytesMut};
use bytestring::ByteString;

use crate::positions::{CatchUpError, CatchUpId, CatchUpPage, Follower, FollowerEvent};
use crate::wire::{Command, Decoder, EncodeError, Side};

use super::super::SendError;
use super::super::lines::LineTooLong;
use super::conn::{Conn, Due, PingClock, Queued, clock_at, encode_line, wall_clock};
use super::{ConnectionState, TcpClientEvent, TcpError, TcpSessionConfig};

/// The client end of a direct TCP replication connection: a worker
/// following the streams of a server (Synapse's
/// `ClientReplicationStreamProtocol`), sans-IO.
///
/// One session lives as long as the client: it owns the [`Follower`],
/// whose positions and outstanding catch-ups outlive connections. Each
/// connection starts with [`TcpClientSession::connect`] and ends with
/// [`TcpClientSession::disconnected`].
///
/// # Call order
///
/// - When a connection is up, call [`connect`](TcpClientSession::connect): it
///   queues `NAME`, `PING` and `REPLICATE`.
/// - Give every byte received to
///   [`handle_input`](TcpClientSession::handle_input), call
///   [`handle_timeout`](TcpClientSession::handle_timeout) when the time given
///   by [`poll_timeout`](TcpClientSession::poll_timeout) has passed, and act
///   with [`send`](TcpClientSession::send),
///   [`handle_catch_up`](TcpClientSession::handle_catch_up) and
///   [`catch_up_failed`](TcpClientSession::catch_up_failed).
/// - **After every input**: drain
///   [`poll_transmit`](TcpClientSession::poll_transmit) until `None` (write
///   each chunk in order; only take a chunk when the socket can take it,
///   so that a peer that does not read is detected), then
///   [`poll_event`](TcpClientSession::poll_event) until `None`, then read
///   [`poll_timeout`](TcpClientSession::poll_timeout) and arm a timer for it.
/// - Time must not go backwards: every `now` is at least the previous one
///   (an earlier one is treated as the previous one). `poll_timeout` is
///   never before the last `now` given, and handling a timeout at the time
///   it gave always moves it forward, so an event loop cannot spin. Calls
///   that take no `now` ([`send`](TcpClientSession::send), ...) happen at the
///   last `now` given: call `handle_timeout(now)` first if time moved (a
///   stale time only makes a `PING` come early).
/// - When [`state`](TcpClientSession::state) is [`ConnectionState::Closing`],
///   stop reading, write what `poll_transmit` still gives, close the
///   socket; drop it at once on [`ConnectionState::Aborted`]. Then (or when
///   the socket fails) call [`disconnected`](TcpClientSession::disconnected).
///
/// # Rules (Synapse's `protocol.py`)
///
/// - On connecting: `NAME <name>` (the follower's own name unless
///   [`set_client_name`](TcpClientSession::set_client_name) changed it),
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
pub struct TcpClientSession {
    config: TcpSessionConfig,
    decoder: Decoder,
    server_name: ByteString,
    name_line: Option<Bytes>,
    follower: Follower,
    conn: Option<Conn>,
    greeted: bool,
    events: VecDeque<TcpClientEvent>,
    now: Option<Instant>,
    clock: Option<PingClock>,
}

impl TcpClientSession {
    /// A client that expects the server `server_name` (Synapse's
    /// `server_name`, e.g. `example.com`) and follows with `follower`, with
    /// the default [`TcpSessionConfig`].
    ///
    /// Fails if the follower's own name cannot be sent as `NAME` (it
    /// contains a newline).
    pub fn new(
        server_name: impl Into<ByteString>,
        follower: Follower,
    ) -> Result<TcpClientSession, EncodeError> {
        TcpClientSession::with_config(server_name, follower, TcpSessionConfig::default())
    }

    /// A client with the given limits and timers.
    pub fn with_config(
        server_name: impl Into<ByteString>,
        follower: Follower,
        config: TcpSessionConfig,
    ) -> Result<TcpClientSession, EncodeError> {
        let name = ByteString::from(follower.own_name().as_str());
        let mut session = TcpClientSession {
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
        self.follower.connected_direct();
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
                .push_back(TcpClientEvent::Received(command.clone()));
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
                        .push_back(TcpClientEvent::Ready { server_name: name });
                }
            }
            _ if !self.greeted => return Err(TcpError::NoGreeting(kind)),
            Command::Ping(_) => {}
            Command::Error(message) => self.events.push_back(TcpClientEvent::PeerError(message)),
            command @ (Command::Rdata(_) | Command::Position(_)) => {
                self.follower.handle_command(command);
                self.drain_follower();
            }
            command => self.events.push_back(TcpClientEvent::Command(command)),
        }
        Ok(())
    }

    fn drain_follower(&mut self) {
        while let Some(event) = self.follower.poll_event() {
            self.events.push_back(TcpClientEvent::Follower(event));
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
        self.events.push_back(TcpClientEvent::Closing(error));
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
    pub fn poll_event(&mut self) -> Option<TcpClientEvent> {
        if let Some(event) = self.events.pop_front() {
            return Some(event);
        }
        // Events of calls made through `follower_mut`.
        self.follower.poll_event().map(TcpClientEvent::Follower)
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

    /// When [`handle_timeout`](TcpClientSession::handle_timeout) must be called
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

    /// The follower's events not handed over yet, in order.
    pub(crate) fn queued_follower_events(&self) -> impl Iterator<Item = &FollowerEvent> {
        self.events
            .iter()
            .filter_map(|event| match event {
                TcpClientEvent::Follower(event) => Some(event),
                _ => None,
            })
            .chain(self.follower.queued())
    }

    /// The follower, to seed positions ([`Follower::set_position`]) or
    /// forget writers. Its events come out of
    /// [`poll_event`](TcpClientSession::poll_event).
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
