//! A pair harness for the direct TCP sessions (after quinn-proto's `Pair`):
//! a [`TcpServerSession`] and a [`TcpClientSession`] on an in-memory wire, with a
//! virtual clock that jumps to the earliest deadline. No sockets, no sleeps.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use synapse_replication::config::StreamWriters;
use synapse_replication::positions::{CatchUpPage, CatchUpRequest, Follower, Writer};
use synapse_replication::session::{
    ConnectionState, TcpClientEvent, TcpClientId, TcpClientSession, TcpServerEvent,
    TcpServerSession, TcpSessionConfig,
};
use synapse_replication::wire::{InstanceName, RawRow, StreamName, Token};

/// The server name both sides use by default.
pub const SERVER_NAME: &str = "example.com";

/// A line on the wire and when it was delivered.
#[derive(Clone, Debug)]
pub struct WireLine {
    /// Time since the pair started.
    pub at: Duration,
    /// The line, without its `\n`.
    pub line: String,
}

/// Two sessions, a wire, a clock.
pub struct Pair {
    pub start: Instant,
    pub now: Instant,
    pub server: TcpServerSession,
    pub client: TcpClientSession,
    /// The server's id for the current connection.
    pub id: Option<TcpClientId>,
    pub server_events: Vec<TcpServerEvent>,
    pub client_events: Vec<TcpClientEvent>,
    /// Lines delivered to the client / to the server.
    pub to_client: Vec<WireLine>,
    pub to_server: Vec<WireLine>,
    /// When false, the side does not read: its peer's output stays queued.
    pub client_reads: bool,
    pub server_reads: bool,
    /// When true, the side is hung: it sends nothing and runs no timers.
    pub client_frozen: bool,
    pub server_frozen: bool,
    /// Connections made and lost.
    pub connections: usize,
    pub disconnections: usize,
}

/// A registry where `master` writes everything.
pub fn registry() -> Arc<StreamWriters> {
    Arc::new(StreamWriters::default())
}

/// A server session for `master` writing `streams`, each from token 0.
pub fn server(streams: &[StreamName], config: TcpSessionConfig, now: Instant) -> TcpServerSession {
    let mut writer = Writer::new(InstanceName::master(), registry());
    for stream in streams {
        writer.advance(stream, Token(0)).unwrap();
    }
    TcpServerSession::with_config(SERVER_NAME, writer, config, now).unwrap()
}

/// A client session `worker1` expecting `server_name`.
pub fn client(server_name: &str, config: TcpSessionConfig) -> TcpClientSession {
    let follower = Follower::new(InstanceName::from("worker1"), registry());
    TcpClientSession::with_config(server_name, follower, config).unwrap()
}

impl Pair {
    /// The default pair: `master` writes `typing` and `caches`; the client
    /// expects the right server name. Not yet connected.
    pub fn new() -> Pair {
        Pair::with(TcpSessionConfig::default(), SERVER_NAME)
    }

    /// A pair with this configuration on both sides.
    pub fn with(config: TcpSessionConfig, client_expects: &str) -> Pair {
        let now = Instant::now();
        let server = server(
            &[StreamName::Typing, StreamName::Caches],
            config.clone(),
            now,
        );
        Pair::from_sessions(server, client(client_expects, config), now)
    }

    /// A pair of the given sessions.
    pub fn from_sessions(server: TcpServerSession, client: TcpClientSession, now: Instant) -> Pair {
        Pair {
            start: now,
            now,
            server,
            client,
            id: None,
            server_events: Vec::new(),
            client_events: Vec::new(),
            to_client: Vec::new(),
            to_server: Vec::new(),
            client_reads: true,
            server_reads: true,
            client_frozen: false,
            server_frozen: false,
            connections: 0,
            disconnections: 0,
        }
    }

    /// Time since the start.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// Opens a connection and runs until quiet.
    pub fn connect(&mut self) {
        self.id = Some(self.server.accept(self.now));
        self.client.connect(self.now);
        self.connections += 1;
        self.drive();
    }

    /// Both ends see the connection gone (whatever was in flight is lost).
    pub fn disconnect(&mut self) {
        if let Some(id) = self.id.take() {
            self.server.disconnected(id);
            self.client.disconnected();
            self.disconnections += 1;
        }
        self.collect();
    }

    /// Whether a connection is up.
    pub fn is_connected(&self) -> bool {
        self.id.is_some()
    }

    fn collect(&mut self) {
        while let Some(event) = self.server.poll_event() {
            self.server_events.push(event);
        }
        while let Some(event) = self.client.poll_event() {
            self.client_events.push(event);
        }
    }

    /// Moves bytes both ways until nothing moves, then closes the
    /// connection if a side finished closing it.
    pub fn drive(&mut self) {
        loop {
            let mut moved = false;
            if let Some(id) = self.id {
                if self.server_reads && !self.client_frozen {
                    while let Some(bytes) = self.client.poll_transmit() {
                        log(&mut self.to_server, self.now - self.start, &bytes);
                        self.server.handle_input(id, &bytes, self.now);
                        moved = true;
                    }
                }
                if self.client_reads && !self.server_frozen {
                    while let Some(bytes) = self.server.poll_transmit(id) {
                        log(&mut self.to_client, self.now - self.start, &bytes);
                        self.client.handle_input(&bytes, self.now);
                        moved = true;
                    }
                }
            }
            self.collect();
            if !moved {
                break;
            }
        }
        self.close_if_done();
    }

    /// A side that is closing closes its socket once its output is written
    /// (or at once when aborted): the peer sees the end of the stream.
    fn close_if_done(&mut self) {
        let Some(id) = self.id else {
            return;
        };
        let client_done = match self.client.state() {
            Some(ConnectionState::Closing) => self.client.queued_commands() == 0,
            Some(ConnectionState::Aborted) | None => true,
            Some(_) => false,
        };
        let server_done = match self.server.client_state(id) {
            Some(ConnectionState::Closing) => self.server.queued_commands(id) == 0,
            Some(ConnectionState::Aborted) | None => true,
            Some(_) => false,
        };
        if client_done || server_done {
            self.disconnect();
        }
    }

    /// The earliest deadline of the sides that are not frozen.
    pub fn next_deadline(&self) -> Option<Instant> {
        let server = (!self.server_frozen)
            .then(|| self.server.poll_timeout())
            .flatten();
        let client = (!self.client_frozen)
            .then(|| self.client.poll_timeout())
            .flatten();
        match (server, client) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Jumps to the earliest deadline (not beyond `limit`), handles it and
    /// drives. Returns false if there was none before `limit`.
    pub fn step_until(&mut self, limit: Instant) -> bool {
        let Some(deadline) = self.next_deadline() else {
            return false;
        };
        if deadline > limit {
            return false;
        }
        assert!(deadline >= self.now, "deadline in the past");
        self.now = deadline;
        if !self.server_frozen {
            self.server.handle_timeout(self.now);
        }
        if !self.client_frozen {
            self.client.handle_timeout(self.now);
        }
        self.drive();
        true
    }

    /// Runs the clock forward by `duration`, handling every deadline on
    /// the way.
    pub fn run_for(&mut self, duration: Duration) {
        let limit = self.now + duration;
        let mut steps = 0;
        while self.step_until(limit) {
            steps += 1;
            assert!(steps < 100_000, "the clock does not move forward");
        }
        // A driver tells the sessions the time whenever it wakes up.
        self.now = limit;
        if !self.server_frozen {
            self.server.handle_timeout(self.now);
        }
        if !self.client_frozen {
            self.client.handle_timeout(self.now);
        }
        self.drive();
    }

    /// Injects raw bytes into the client, as if the server had sent them.
    pub fn inject_to_client(&mut self, bytes: &[u8]) {
        self.client.handle_input(bytes, self.now);
        self.drive();
    }

    /// Injects raw bytes into the server, as if the client had sent them.
    pub fn inject_to_server(&mut self, bytes: &[u8]) {
        let id = self.id.expect("connected");
        self.server.handle_input(id, bytes, self.now);
        self.drive();
    }

    /// The lines delivered to the client, without their times.
    pub fn client_lines(&self) -> Vec<String> {
        self.to_client.iter().map(|l| l.line.clone()).collect()
    }

    /// The lines delivered to the server, without their times.
    pub fn server_lines(&self) -> Vec<String> {
        self.to_server.iter().map(|l| l.line.clone()).collect()
    }
}

impl Default for Pair {
    fn default() -> Self {
        Pair::new()
    }
}

fn log(out: &mut Vec<WireLine>, at: Duration, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    assert!(text.ends_with('\n'), "a transmit ends with a whole line");
    for line in text.split_terminator('\n') {
        out.push(WireLine {
            at,
            line: line.to_owned(),
        });
    }
}

/// A writer's log, to answer catch-ups from.
#[derive(Clone, Debug, Default)]
pub struct Log {
    pub rows: BTreeMap<(String, String), Vec<(Token, RawRow)>>,
}

impl Log {
    /// Records rows of `writer` on `stream`.
    pub fn record(&mut self, stream: &StreamName, writer: &str, rows: &[(Token, RawRow)]) {
        self.rows
            .entry((stream.to_string(), writer.to_owned()))
            .or_default()
            .extend(rows.iter().cloned());
    }

    /// The answer to `request`, at most `page` rows (never splitting a
    /// token's rows).
    pub fn answer(&self, request: &CatchUpRequest, page: usize) -> CatchUpPage {
        let rows = self
            .rows
            .get(&(request.stream.to_string(), request.writer.to_string()))
            .cloned()
            .unwrap_or_default();
        let mut updates: Vec<(Token, RawRow)> = rows
            .into_iter()
            .filter(|(token, _)| *token > request.from && *token <= request.to)
            .collect();
        let mut limited = false;
        if updates.len() > page {
            let last = updates[page - 1].0;
            updates.retain(|(token, _)| *token <= last);
            limited = true;
        }
        let upto = if limited {
            updates.last().map_or(request.to, |(token, _)| *token)
        } else {
            request.to
        };
        CatchUpPage {
            updates,
            upto,
            limited,
        }
    }
}

/// A row for tests: `["row", n]`.
pub fn row(n: i64) -> RawRow {
    RawRow::new(format!(r#"["row",{n}]"#)).unwrap()
}

/// One line per client event, for transcripts.
pub fn client_summary(events: &[TcpClientEvent]) -> Vec<String> {
    events
        .iter()
        .map(|event| match event {
            TcpClientEvent::Ready { server_name } => format!("ready {server_name}"),
            TcpClientEvent::Follower(event) => event.to_string(),
            TcpClientEvent::Command(command) => format!("command {}", wire(command)),
            TcpClientEvent::PeerError(message) => format!("peer error {message}"),
            TcpClientEvent::Received(command) => format!("received {}", wire(command)),
            TcpClientEvent::Closing(error) => format!("closing: {error}"),
            other => format!("{other:?}"),
        })
        .collect()
}

/// One line per server event, for transcripts.
pub fn server_summary(events: &[TcpServerEvent]) -> Vec<String> {
    events
        .iter()
        .map(|event| match event {
            TcpServerEvent::Named { client, name } => format!("named {client} {name}"),
            TcpServerEvent::Replicated { client } => format!("replicated {client}"),
            TcpServerEvent::Command { client, command } => {
                format!("command {client} {}", wire(command))
            }
            TcpServerEvent::PeerError { client, message } => {
                format!("peer error {client} {message}")
            }
            TcpServerEvent::Received { client, command } => {
                format!("received {client} {}", wire(command))
            }
            TcpServerEvent::Closing { client, error } => format!("closing {client}: {error}"),
            other => format!("{other:?}"),
        })
        .collect()
}

/// A command's wire line.
pub fn wire(command: &synapse_replication::wire::Command) -> String {
    String::from_utf8_lossy(&command.to_bytes().unwrap()).into_owned()
}
