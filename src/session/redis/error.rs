//! What goes wrong on a Redis connection: [`RedisError`], and Redis's own
//! error replies ([`RedisErrorReply`]).

use std::fmt;
use std::time::Duration;

use crate::resp::{Frame, RespError};

/// An error reply from Redis, e.g. `NOPERM this user has no permissions to
/// access the 'x' channel`: the code (first word) and the message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisErrorReply {
    /// The error code: `ERR`, `WRONGPASS`, `NOPERM`, `NOAUTH`, ...
    pub code: String,
    /// The whole error line.
    pub message: String,
}

impl RedisErrorReply {
    pub(super) fn from_frame(frame: &Frame) -> Option<RedisErrorReply> {
        let text = match frame {
            Frame::Error(text) | Frame::BulkError(text) => text,
            _ => return None,
        };
        let message = String::from_utf8_lossy(text).into_owned();
        let code = message
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned();
        Some(RedisErrorReply { code, message })
    }
}

impl fmt::Display for RedisErrorReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Why a [`RedisSession`](crate::session::RedisSession) gave up a connection. The driver closes it and
/// connects again (with backoff); credentials that Redis refuses are
/// refused again until they change, so they are reported each time.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RedisError {
    /// Redis refused the credentials (`WRONGPASS`, `NOAUTH`, an `AUTH`
    /// without a password configured).
    #[error("authentication failed: {0}")]
    Auth(RedisErrorReply),
    /// Redis refused `SELECT` (no such database).
    #[error("SELECT {database} failed: {error}")]
    Select {
        /// The database asked for.
        database: u32,
        /// Redis' answer.
        error: RedisErrorReply,
    },
    /// Redis refused `SUBSCRIBE` (an ACL without access to the channel).
    #[error("SUBSCRIBE failed: {0}")]
    Subscribe(RedisErrorReply),
    /// Redis refused `HELLO 3` (a server before Redis 6): the session falls
    /// back to two RESP2 connections.
    #[error("RESP3 refused, falling back to two connections: {0}")]
    Resp3Unsupported(RedisErrorReply),
    /// Redis sent bytes that are not RESP, or that break a cap.
    #[error("invalid reply: {0}")]
    Protocol(#[from] RespError),
    /// Redis sent a reply that does not fit what was asked.
    #[error("unexpected reply: {0}")]
    Unexpected(String),
    /// Replies were owed and nothing arrived for this long.
    #[error("no reply for {0:?}")]
    Timeout(Duration),
    /// More than [`RedisSessionConfig::max_unsent_bytes`](crate::session::RedisSessionConfig::max_unsent_bytes) waited for the socket.
    #[error("Redis does not read: {0} bytes unsent")]
    FailedToKeepUp(usize),
}

impl RedisError {
    /// A short label for the kind of error, for metrics: `auth`, `select`,
    /// `subscribe`, `resp3_unsupported`, `protocol`, `unexpected`,
    /// `timeout`, `failed_to_keep_up`.
    pub fn reason(&self) -> &'static str {
        match self {
            RedisError::Auth(_) => "auth",
            RedisError::Select { .. } => "select",
            RedisError::Subscribe(_) => "subscribe",
            RedisError::Resp3Unsupported(_) => "resp3_unsupported",
            RedisError::Protocol(_) => "protocol",
            RedisError::Unexpected(_) => "unexpected",
            RedisError::Timeout(_) => "timeout",
            RedisError::FailedToKeepUp(_) => "failed_to_keep_up",
        }
    }
}
