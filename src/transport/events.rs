//! What the clients tell the application: [`RedisClientEvent`] and
//! [`TcpClientEvent`], the follower's common events brought up one level.

use std::fmt;
use std::io;
use std::time::Duration;

use bytestring::ByteString;

use crate::positions::{CatchUpRequest, FollowerEvent, RowSource, Rows};
use crate::session::{ClientEvent, RedisEvent, RedisLink, SendError};
use crate::wire::{Command, CommandKind, InstanceName, StreamName, Token};

use super::BoxError;
use super::catch_ups::StuckCatchUp;
use super::net::socket::Disconnect;
use super::sentinel::SentinelEvent;

/// Brings a [`FollowerEvent`](crate::positions::FollowerEvent)'s common
/// variants up into a client event enum with the same variants (`Rows`,
/// `Position`, `Started`, `Reset`), and the rest into `$other`.
macro_rules! from_follower {
    ($event:expr, $client:ident, $other:expr) => {
        match $event {
            FollowerEvent::Rows {
                stream,
                writer,
                token,
                rows,
                source,
            } => $client::Rows {
                stream,
                writer,
                token,
                rows,
                source,
            },
            FollowerEvent::Position {
                stream,
                writer,
                token,
            } => $client::Position {
                stream,
                writer,
                token,
            },
            FollowerEvent::Started {
                stream,
                writer,
                token,
            } => $client::Started {
                stream,
                writer,
                token,
            },
            FollowerEvent::Reset {
                stream,
                writer,
                previous,
                new,
            } => $client::Reset {
                stream,
                writer,
                previous,
                new,
            },
            other => $other(other),
        }
    };
}

/// The inverse of `from_follower!`: the client event's
/// [`FollowerEvent`](crate::positions::FollowerEvent), if it is one.
macro_rules! into_follower {
    ($event:expr, $client:ident, $session:ident) => {
        match $event {
            $client::Rows {
                stream,
                writer,
                token,
                rows,
                source,
            } => Ok(FollowerEvent::Rows {
                stream,
                writer,
                token,
                rows,
                source,
            }),
            $client::Position {
                stream,
                writer,
                token,
            } => Ok(FollowerEvent::Position {
                stream,
                writer,
                token,
            }),
            $client::Started {
                stream,
                writer,
                token,
            } => Ok(FollowerEvent::Started {
                stream,
                writer,
                token,
            }),
            $client::Reset {
                stream,
                writer,
                previous,
                new,
            } => Ok(FollowerEvent::Reset {
                stream,
                writer,
                previous,
                new,
            }),
            $client::Session($session::Follower(event)) => Ok(event),
            other => Err(other),
        }
    };
}

/// Formats those variants as [`FollowerEvent`](crate::positions::FollowerEvent)'s
/// `Display` does; `None` for the others.
macro_rules! fmt_follower {
    ($f:expr, $event:expr, $client:ident) => {
        match $event {
            $client::Rows {
                stream,
                writer,
                token,
                rows,
                source,
            } => Some(write!(
                $f,
                "rows {stream} {writer} {token} ({} rows, {source:?})",
                rows.len()
            )),
            $client::Position {
                stream,
                writer,
                token,
            } => Some(write!($f, "position {stream} {writer} {token}")),
            $client::Started {
                stream,
                writer,
                token,
            } => Some(write!($f, "started {stream} {writer} {token}")),
            $client::Reset {
                stream,
                writer,
                previous,
                new,
            } => Some(write!($f, "reset {stream} {writer} {previous} -> {new}")),
            _ => None,
        }
    };
}

/// What a [`RedisClient`](crate::transport::RedisClient) tells the application.
///
/// The common events are one level deep: [`Ready`](Self::Ready), then
/// [`Rows`](Self::Rows) and [`Position`](Self::Position) of the streams
/// followed, other processes' [`Command`](Self::Command)s, and the
/// connection's and catch-ups' ups and downs. What else the session
/// reports (malformed messages, refused publishes, rejected writers, the
/// catch-ups it asks for, ...) comes as [`Session`](Self::Session).
///
/// ```
/// # use synapse_replication::transport::RedisClientEvent;
/// fn handle(event: RedisClientEvent) {
///     match event {
///         RedisClientEvent::Rows { stream, writer, token, rows, .. } => {
///             println!("{stream} from {writer} at {token}: {} rows", rows.len())
///         }
///         RedisClientEvent::Command(command) => println!("{}", command.kind()),
///         other => println!("{other}"),
///     }
/// }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum RedisClientEvent {
    /// Every channel is subscribed and the publisher is up: `REPLICATE`
    /// (after a new subscription) and this process's positions are on
    /// their way. Send what others must hear on every connection now
    /// (Synapse's workers send a `USER_SYNC` per syncing user).
    Ready,
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
    /// A command for the application from another process: `USER_SYNC`,
    /// `CLEAR_USER_SYNC`, `FEDERATION_ACK`, `USER_IP`, `REMOTE_SERVER_UP`,
    /// `LOCK_RELEASED`, `NEW_ACTIVE_TASK`, `CANCEL_TASK` (and `ERROR`,
    /// `PING`, which Synapse only logs). This process's own come back too:
    /// Redis echoes them.
    Command(Command),
    /// A connection is up; its handshake is on its way.
    /// [`Ready`](Self::Ready) follows once both are subscribed and
    /// authenticated.
    Connected {
        /// Which.
        link: RedisLink,
    },
    /// Connecting failed; the next attempt is in `retry_in`.
    ConnectFailed {
        /// Which connection.
        link: RedisLink,
        /// Why.
        error: io::Error,
        /// The delay before the next attempt.
        retry_in: Duration,
    },
    /// A connection ended; the next attempt is in `retry_in`. Losing the
    /// subscriber makes the follower drop what belonged to it; on the next
    /// subscription the writers' `POSITION`s show what was missed, and
    /// catch-ups fetch it.
    Disconnected {
        /// Which connection.
        link: RedisLink,
        /// Why.
        reason: Disconnect,
        /// The delay before reconnecting.
        retry_in: Duration,
    },
    /// What else the session reports: malformed messages, refused
    /// publishes, the follower's other events (catch-ups it asked for,
    /// rejected writers), commands received with `report_received`, and a
    /// connection it gives up.
    Session(RedisEvent),
    /// The [`CatchUpSource`](crate::transport::CatchUpSource) failed; the catch-up is asked again (with a
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
    /// What the sentinels said (with a sentinel [`RedisConfig`](crate::config::RedisConfig) only):
    /// the master each link found, failovers, the watch's ups and downs.
    Sentinel(SentinelEvent),
    /// A command given to a [`CommandSender`](crate::transport::CommandSender) could not be sent (not
    /// ready, or refused); it was dropped.
    SendFailed {
        /// The command.
        command: CommandKind,
        /// Why.
        error: SendError,
    },
}

impl From<RedisEvent> for RedisClientEvent {
    /// Brings the common session events up one level.
    fn from(event: RedisEvent) -> RedisClientEvent {
        match event {
            RedisEvent::Ready => RedisClientEvent::Ready,
            RedisEvent::Command(command) => RedisClientEvent::Command(command),
            RedisEvent::Follower(event) => from_follower!(event, RedisClientEvent, |other| {
                RedisClientEvent::Session(RedisEvent::Follower(other))
            }),
            other => RedisClientEvent::Session(other),
        }
    }
}

impl RedisClientEvent {
    /// The follower's event this is, if it is one (rows, positions,
    /// resets, and the follower's other events inside
    /// [`Session`](Self::Session)); the event itself otherwise. For code
    /// that handles [`FollowerEvent`]s whatever the transport.
    pub fn into_follower_event(self) -> Result<FollowerEvent, RedisClientEvent> {
        into_follower!(self, RedisClientEvent, RedisEvent)
    }
}

impl fmt::Display for RedisClientEvent {
    /// One line (rows are counted, not printed; no secret is shown).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(done) = fmt_follower!(f, self, RedisClientEvent) {
            return done;
        }
        match self {
            RedisClientEvent::Ready => f.write_str("ready"),
            RedisClientEvent::Command(command) => write!(f, "command {command:?}"),
            RedisClientEvent::Connected { link } => write!(f, "connected {link}"),
            RedisClientEvent::ConnectFailed {
                link,
                error,
                retry_in,
            } => write!(
                f,
                "connecting {link} failed: {error}; retry in {} ms",
                retry_in.as_millis()
            ),
            RedisClientEvent::Disconnected {
                link,
                reason,
                retry_in,
            } => write!(
                f,
                "disconnected {link}: {reason}; retry in {} ms",
                retry_in.as_millis()
            ),
            RedisClientEvent::Session(event) => write!(f, "{event}"),
            RedisClientEvent::CatchUpFailed {
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
            RedisClientEvent::CatchUpStuck(stuck) => write!(f, "{stuck}"),
            RedisClientEvent::Sentinel(event) => write!(f, "{event}"),
            RedisClientEvent::SendFailed { command, error } => {
                write!(f, "sending {command} failed: {error}")
            }
            // The follower's, formatted above.
            _ => Ok(()),
        }
    }
}

/// What a [`TcpClient`](crate::transport::TcpClient) tells the application.
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
    /// The [`CatchUpSource`](crate::transport::CatchUpSource) failed; the catch-up is asked again (with a
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
    /// A command given to a [`CommandSender`](crate::transport::CommandSender) could not be sent (not
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
