//! What both sessions refuse to send.

use crate::wire::{CommandKind, EncodeError, Side};

use super::ClientId;

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
