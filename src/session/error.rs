//! What both sessions refuse to send, and why a connection ended.

use std::fmt;
use std::io;

use crate::wire::{CommandKind, EncodeError, Side};

use super::sentinel::MasterAddr;
use super::{RedisError, TcpClientId, TcpError};

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
    UnknownClient(TcpClientId),
    /// The encoded line is longer than [`TcpSessionConfig::max_line_len`](crate::session::TcpSessionConfig::max_line_len); the
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

fn side_name(side: Side) -> &'static str {
    match side {
        Side::Server => "server",
        Side::Client => "client",
    }
}

/// Why a connection ended, as a driver reports it.
#[derive(Debug)]
#[non_exhaustive]
pub enum Disconnect {
    /// The peer closed it.
    Closed,
    /// Reading or writing failed.
    Io(io::Error),
    /// The Redis session gave it up after this error.
    Redis(RedisError),
    /// The direct TCP session gave it up after this error (its `ERROR`
    /// line was sent first).
    Tcp(TcpError),
    /// The sentinels named another master: this link connects again
    /// through discovery.
    MasterSwitched {
        /// The master now.
        to: MasterAddr,
    },
    /// The node refused a publish with `READONLY`: it is a replica now
    /// (with a sentinel configuration, the master is found again).
    Replica {
        /// The node, where the sentinels named it.
        node: Option<MasterAddr>,
    },
    /// The application closed it.
    Shutdown,
}

impl fmt::Display for Disconnect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Disconnect::Closed => f.write_str("closed by the peer"),
            Disconnect::Io(error) => write!(f, "i/o error: {error}"),
            Disconnect::Redis(error) => write!(f, "closed: {error}"),
            Disconnect::Tcp(error) => write!(f, "closed: {error}"),
            Disconnect::MasterSwitched { to } => write!(f, "closed: master switched to {to}"),
            Disconnect::Replica { node: Some(node) } => {
                write!(f, "closed: {node} is a replica now (READONLY)")
            }
            Disconnect::Replica { node: None } => {
                f.write_str("closed: the node is a replica now (READONLY)")
            }
            Disconnect::Shutdown => f.write_str("shut down"),
        }
    }
}

impl std::error::Error for Disconnect {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Disconnect::Io(error) => Some(error),
            Disconnect::Redis(error) => Some(error),
            Disconnect::Tcp(error) => Some(error),
            _ => None,
        }
    }
}
