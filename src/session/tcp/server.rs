//! The server end: a process serving the streams it writes to many
//! clients.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Instant, SystemTime};

use bytes::{BufMut, Bytes, BytesMut};
use bytestring::ByteString;

use crate::positions::{WriteError, Writer};
use crate::wire::{
    Command, Decoder, EncodeError, Position, RawRow, Rdata, RdataToken, Side, StreamName, Token,
};

use super::super::SendError;
use super::super::lines::LineTooLong;
use super::conn::{Conn, Due, PingClock, Queued, clock_at, encode_line, wall_clock};
use super::{ConnectionState, TcpClientId, TcpError, TcpServerEvent, TcpSessionConfig};

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
/// - When a client connects, [`accept`](TcpServerSession::accept) it (this
///   queues `SERVER` and `PING`) and keep the [`TcpClientId`]; when its socket
///   closes or fails, call [`disconnected`](TcpServerSession::disconnected).
/// - Give every byte a client sent to
///   [`handle_input`](TcpServerSession::handle_input), call
///   [`handle_timeout`](TcpServerSession::handle_timeout) when the time given
///   by [`poll_timeout`](TcpServerSession::poll_timeout) has passed, and write
///   with [`write`](TcpServerSession::write),
///   [`advance`](TcpServerSession::advance), [`send`](TcpServerSession::send) and
///   [`send_to`](TcpServerSession::send_to).
/// - **After every input**: for each client, drain
///   [`poll_transmit`](TcpServerSession::poll_transmit) until `None` (when its
///   socket can take the bytes), then drain
///   [`poll_event`](TcpServerSession::poll_event), then read
///   [`poll_timeout`](TcpServerSession::poll_timeout).
/// - Time must not go backwards; `poll_timeout` is never before the last
///   `now` given and handling it always moves it forward. Calls that take
///   no `now` ([`write`](TcpServerSession::write), ...) happen at the last
///   `now` given: call `handle_timeout(now)` first if time moved (a stale
///   time only makes a `PING` come early).
/// - A client whose [`client_state`](TcpServerSession::client_state) is
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
pub struct TcpServerSession {
    config: TcpSessionConfig,
    decoder: Decoder,
    server_line: Bytes,
    writer: Writer,
    clients: BTreeMap<TcpClientId, Client>,
    next_id: u64,
    events: VecDeque<TcpServerEvent>,
    now: Instant,
    clock: Option<PingClock>,
    /// Streams whose open batch had a row too long to send: its numbered
    /// row becomes a `POSITION`.
    cut_batches: Vec<StreamName>,
}

impl TcpServerSession {
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
    ) -> Result<TcpServerSession, EncodeError> {
        TcpServerSession::with_config(server_name, writer, TcpSessionConfig::default(), now)
    }

    /// A server with the given limits and timers.
    pub fn with_config(
        server_name: impl Into<ByteString>,
        mut writer: Writer,
        config: TcpSessionConfig,
        now: Instant,
    ) -> Result<TcpServerSession, EncodeError> {
        let mut server_line = BytesMut::new();
        Command::Server(server_name.into()).encode(&mut server_line)?;
        server_line.put_u8(b'\n');
        writer.connected(now);
        let mut session = TcpServerSession {
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
    pub fn accept(&mut self, now: Instant) -> TcpClientId {
        let now = self.tick(now);
        self.next_id += 1;
        let id = TcpClientId(self.next_id);
        let mut conn = Conn::new(&self.config, now);
        conn.queue(self.server_line.clone(), &self.config, now);
        conn.queue(self.ping_line(), &self.config, now);
        self.clients.insert(id, Client { conn, name: None });
        id
    }

    /// The client's connection is gone. Returns `false` if the id is
    /// unknown.
    pub fn disconnected(&mut self, client: TcpClientId) -> bool {
        self.clients.remove(&client).is_some()
    }

    /// Handles bytes a client sent, in any chunks. Input for an unknown or
    /// closing client is ignored. Timers due at `now` are handled too.
    pub fn handle_input(&mut self, client: TcpClientId, data: &[u8], now: Instant) {
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

    fn handle_line(
        &mut self,
        client: TcpClientId,
        line: Bytes,
        now: Instant,
    ) -> Result<(), TcpError> {
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
            self.events.push_back(TcpServerEvent::Received {
                client,
                command: command.clone(),
            });
        }
        match command {
            Command::Name(name) => {
                c.name = Some(name.clone());
                self.events
                    .push_back(TcpServerEvent::Named { client, name });
            }
            Command::Ping(_) => {}
            Command::Replicate => {
                self.events.push_back(TcpServerEvent::Replicated { client });
                self.answer_replicate(client);
            }
            Command::Error(message) => {
                self.events
                    .push_back(TcpServerEvent::PeerError { client, message });
            }
            command @ (Command::RemoteServerUp(_) | Command::LockReleased(_)) => {
                if let Ok(line) = encode_line(&command, self.config.max_line_len) {
                    self.broadcast(line, Some(client));
                }
                self.events
                    .push_back(TcpServerEvent::Command { client, command });
            }
            command => self
                .events
                .push_back(TcpServerEvent::Command { client, command }),
        }
        Ok(())
    }

    fn answer_replicate(&mut self, client: TcpClientId) {
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

    fn fail(&mut self, client: TcpClientId, error: TcpError) {
        let Some(c) = self.clients.get_mut(&client) else {
            return;
        };
        if !c.conn.is_open() {
            return;
        }
        c.conn.fail(&error.wire_message(), &self.config, self.now);
        self.events
            .push_back(TcpServerEvent::Closing { client, error });
    }

    fn queue_to(&mut self, client: TcpClientId, line: Bytes) -> Result<(), SendError> {
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
    fn broadcast(&mut self, line: Bytes, except: Option<TcpClientId>) {
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
    /// [`write`](TcpServerSession::write)). Clients that overflow are closed.
    pub fn send(&mut self, command: Command) -> Result<(), SendError> {
        let line = self.server_line_for(&command)?;
        self.broadcast(line, None);
        Ok(())
    }

    /// Sends a command to one client.
    pub fn send_to(&mut self, client: TcpClientId, command: Command) -> Result<(), SendError> {
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
    pub fn close(&mut self, client: TcpClientId, message: &str) {
        self.fail(client, TcpError::ByApplication(message.to_owned()));
    }

    /// The next event, or `None`. Drain after every input.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<TcpServerEvent> {
        self.events.pop_front()
    }

    /// The next bytes to write to `client`, or `None`: whole lines, joined
    /// up to [`TcpSessionConfig::max_transmit_len`]. Take a chunk only when the
    /// client's socket can take it.
    #[must_use]
    pub fn poll_transmit(&mut self, client: TcpClientId) -> Option<Bytes> {
        self.clients
            .get_mut(&client)?
            .conn
            .poll_transmit(self.config.max_transmit_len)
    }

    /// When [`handle_timeout`](TcpServerSession::handle_timeout) must be called
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
    pub fn client_state(&self, client: TcpClientId) -> Option<ConnectionState> {
        self.clients.get(&client).map(|c| c.conn.public_state())
    }

    /// The name a client gave with `NAME`, if any.
    pub fn client_name(&self, client: TcpClientId) -> Option<&str> {
        self.clients.get(&client)?.name.as_deref()
    }

    /// Every client, in the order accepted.
    pub fn clients(&self) -> impl Iterator<Item = TcpClientId> + '_ {
        self.clients.keys().copied()
    }

    /// Lines queued for `client` and not yet taken by `poll_transmit`.
    pub fn queued_commands(&self, client: TcpClientId) -> usize {
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
