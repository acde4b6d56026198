//! Synapse's direct TCP replication: a sans-IO [`TcpClientSession`] (a worker
//! following a server) and [`TcpServerSession`] (a process serving its streams
//! to many clients).
//!
//! `mod.rs` holds what both ends share (configuration, errors, events);
//! `conn` one connection's lines, queue and timers; `client` and `server`
//! the two ends.

mod client;
mod conn;
mod events;
mod server;

pub use client::TcpClientSession;
pub use events::{TcpClientEvent, TcpServerEvent};
pub use server::TcpServerSession;

use std::fmt;
use std::time::Duration;

use bytestring::ByteString;

use crate::wire::{CommandKind, DecodeError, Decoder, Side};

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
    /// waits 25 s). Beyond the clock's range (up to `Duration::MAX`): as
    /// long as it takes.
    pub close_timeout: Duration,
    /// The largest chunk [`poll_transmit`](TcpClientSession::poll_transmit)
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
    /// The application closed the connection ([`TcpServerSession::close`]).
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

/// Where a connection stands, for the driver that moves its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConnectionState {
    /// Up: read, write, keep the timers.
    Open,
    /// A fatal error: stop reading; write what
    /// [`poll_transmit`](TcpClientSession::poll_transmit) still gives (the
    /// `ERROR` line), then close the socket.
    Closing,
    /// The `ERROR` line could not be written within
    /// [`TcpSessionConfig::close_timeout`]: drop the socket now.
    Aborted,
}

/// Identifies one client connection of a [`TcpServerSession`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TcpClientId(u64);

impl TcpClientId {
    /// The id as a number (unique for the life of one server session).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for TcpClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}
