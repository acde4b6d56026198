//! What the direct TCP sessions, and the drivers that run them, tell the
//! application: [`TcpClientEvent`] and [`TcpServerEvent`].

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use bytestring::ByteString;

use crate::positions::{BoxError, CatchUpRequest, FollowerEvent, StuckCatchUp};
use crate::wire::{Command, CommandKind};

use super::super::error::{Disconnect, SendError};
use super::{TcpClientId, TcpError};

/// What a [`TcpClientSession`](super::TcpClientSession) and a
/// [`TcpClient`](crate::transport::TcpClient) tell the application: one
/// event type, whoever builds it. The session builds the first variants;
/// the client adds the connection's ups and downs and its catch-ups'
/// failures, from [`Connected`](Self::Connected) on.
///
/// Everything a follower handles is one level deep, in
/// [`Follower`](Self::Follower).
#[derive(Debug)]
#[non_exhaustive]
pub enum TcpClientEvent {
    /// The server greeted with the expected `SERVER` name: the handshake is
    /// complete (this client sent `NAME`, `PING` and `REPLICATE` on
    /// connecting).
    Ready {
        /// The server name.
        server_name: ByteString,
    },
    /// What the [`Follower`](crate::positions::Follower) decided: rows to apply, positions reached,
    /// catch-ups to perform (answer with
    /// [`TcpClientSession::handle_catch_up`](super::TcpClientSession::handle_catch_up)), resets, rejected commands.
    Follower(FollowerEvent),
    /// A command for the application: `REMOTE_SERVER_UP` or
    /// `LOCK_RELEASED`.
    Command(Command),
    /// The server reported an error (`ERROR`); it usually closes next.
    PeerError(ByteString),
    /// A valid command was received (only with
    /// [`TcpSessionConfig::report_received`](super::TcpSessionConfig::report_received)); it is then acted on as usual.
    Received(Command),
    /// This client is closing the connection: the `ERROR` line is queued.
    /// (A [`TcpClient`](crate::transport::TcpClient) reports it as
    /// [`Disconnected`](Self::Disconnected) with this error, once the line
    /// is flushed.)
    Closing(TcpError),
    /// The TCP connection is up; `NAME`, `PING` and `REPLICATE` are on
    /// their way. Send what the server must hear on every connection now
    /// (Synapse's workers send a `USER_SYNC` per syncing user). (From a
    /// client.)
    Connected,
    /// Connecting failed; the next attempt is in `retry_in`. (From a
    /// client.)
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
    /// (From a client.)
    Disconnected {
        /// Why.
        reason: Disconnect,
        /// The delay before reconnecting.
        retry_in: Duration,
    },
    /// The client's [`CatchUpSource`](crate::transport::CatchUpSource)
    /// failed; the catch-up is asked again (with a new id) after
    /// `retry_in`. Only this writer's rows of the stream wait for it.
    CatchUpFailed {
        /// The request that failed.
        request: CatchUpRequest,
        /// The source's error.
        error: BoxError,
        /// The delay before asking again.
        retry_in: Duration,
        /// Failures in a row of this writer's catch-up, this one included.
        failures: u32,
    },
    /// A catch-up failed
    /// [`STUCK_AFTER_FAILURES`](crate::positions::STUCK_AFTER_FAILURES)
    /// times in a row (reported once per run of failures; it is still
    /// retried). Until it succeeds the client's `stuck_catch_ups` lists it.
    CatchUpStuck(StuckCatchUp),
    /// A command given to a
    /// [`CommandSender`](crate::transport::CommandSender) could not be
    /// sent (not connected, or refused); it was dropped.
    SendFailed {
        /// The command.
        command: CommandKind,
        /// Why.
        error: SendError,
    },
}

impl fmt::Display for TcpClientEvent {
    /// One line (rows are counted, not printed; no secret is shown).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TcpClientEvent::Ready { server_name } => write!(f, "ready {server_name}"),
            TcpClientEvent::Follower(event) => write!(f, "{event}"),
            TcpClientEvent::Command(command) => write!(f, "command {command:?}"),
            TcpClientEvent::PeerError(message) => write!(f, "error from the server: {message}"),
            TcpClientEvent::Received(command) => write!(f, "received {command:?}"),
            TcpClientEvent::Closing(error) => write!(f, "closing: {error}"),
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
            TcpClientEvent::CatchUpFailed {
                request,
                error,
                retry_in,
                failures,
            } => write!(
                f,
                "{request} failed ({failures} in a row): {error}; retry in {} ms",
                retry_in.as_millis()
            ),
            TcpClientEvent::CatchUpStuck(stuck) => write!(f, "{stuck}"),
            TcpClientEvent::SendFailed { command, error } => {
                write!(f, "sending {command} failed: {error}")
            }
        }
    }
}

/// What a [`TcpServerSession`](super::TcpServerSession) and a
/// [`TcpServer`](crate::transport::TcpServer) tell the application: one
/// event type, whoever builds it. The server adds its connections' ups
/// and downs, from [`Accepted`](Self::Accepted) on.
#[derive(Debug)]
#[non_exhaustive]
pub enum TcpServerEvent {
    /// A client named itself (`NAME`).
    Named {
        /// The client.
        client: TcpClientId,
        /// Its name (usually its instance name).
        name: ByteString,
    },
    /// A client sent `REPLICATE`; it was answered with a `POSITION` for
    /// every stream the server writes.
    Replicated {
        /// The client.
        client: TcpClientId,
    },
    /// A command for the application: `USER_SYNC`, `CLEAR_USER_SYNC`,
    /// `FEDERATION_ACK`, `USER_IP`, `REMOTE_SERVER_UP`, `LOCK_RELEASED`.
    /// The last two are also relayed to every other client, so that every
    /// process hears them as it would over Redis.
    Command {
        /// The client that sent it.
        client: TcpClientId,
        /// The command.
        command: Command,
    },
    /// A client reported an error (`ERROR`); it usually closes next.
    PeerError {
        /// The client.
        client: TcpClientId,
        /// Its message.
        message: ByteString,
    },
    /// A valid command was received (only with
    /// [`TcpSessionConfig::report_received`](super::TcpSessionConfig::report_received)); it is then acted on as usual.
    Received {
        /// The client.
        client: TcpClientId,
        /// The command.
        command: Command,
    },
    /// The server is closing this client's connection: its `ERROR` line is
    /// queued. (A [`TcpServer`](crate::transport::TcpServer) reports it as
    /// [`Disconnected`](Self::Disconnected) with this error, once the line
    /// is flushed.)
    Closing {
        /// The client.
        client: TcpClientId,
        /// Why.
        error: TcpError,
    },
    /// A client connected; `SERVER` and `PING` are on their way. (From a
    /// server.)
    Accepted {
        /// Its id in the session.
        client: TcpClientId,
        /// Its address.
        peer: SocketAddr,
    },
    /// A client's connection ended; the session forgot it. (From a
    /// server.)
    Disconnected {
        /// The client.
        client: TcpClientId,
        /// Why.
        reason: Disconnect,
    },
    /// Accepting a connection failed; the server goes on after
    /// [`TcpServerConfig::accept_pause`](crate::transport::TcpServerConfig::accept_pause).
    AcceptFailed(io::Error),
    /// A connection was closed as soon as it was accepted: the server
    /// already serves
    /// [`TcpServerConfig::max_connections`](crate::transport::TcpServerConfig::max_connections).
    /// Counted in
    /// [`TcpServer::refused_connections`](crate::transport::TcpServer::refused_connections).
    Refused {
        /// Its address.
        peer: SocketAddr,
    },
}

impl fmt::Display for TcpServerEvent {
    /// One line (no secret is shown).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TcpServerEvent::Named { client, name } => write!(f, "{client} named {name}"),
            TcpServerEvent::Replicated { client } => write!(f, "{client} replicated"),
            TcpServerEvent::Command { client, command } => {
                write!(f, "command from {client}: {command:?}")
            }
            TcpServerEvent::PeerError { client, message } => {
                write!(f, "error from {client}: {message}")
            }
            TcpServerEvent::Received { client, command } => {
                write!(f, "received from {client}: {command:?}")
            }
            TcpServerEvent::Closing { client, error } => write!(f, "closing {client}: {error}"),
            TcpServerEvent::Accepted { client, peer } => write!(f, "accepted {client} from {peer}"),
            TcpServerEvent::Disconnected { client, reason } => {
                write!(f, "disconnected {client}: {reason}")
            }
            TcpServerEvent::AcceptFailed(error) => write!(f, "accepting failed: {error}"),
            TcpServerEvent::Refused { peer } => write!(f, "refused {peer}: too many connections"),
        }
    }
}
