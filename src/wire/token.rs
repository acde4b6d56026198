//! Stream tokens as they appear on the wire.

use std::fmt;

/// A position in a replication stream, as written by one writer instance.
///
/// Synapse's stream ids are PostgreSQL `bigint`s, so a token is a signed
/// 64-bit integer. Python accepts larger integers; this crate refuses them
/// with [`DecodeError::InvalidToken`](crate::wire::DecodeError::InvalidToken)
/// rather than silently wrapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Token(pub i64);

impl Token {
    /// Wraps a raw stream id.
    pub const fn new(value: i64) -> Self {
        Token(value)
    }

    /// The raw stream id.
    pub const fn get(self) -> i64 {
        self.0
    }
}

impl From<i64> for Token {
    fn from(value: i64) -> Self {
        Token(value)
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// The token field of an `RDATA` command: a real token, or the word `batch`.
///
/// A writer that has several rows for one token sends all but the last with
/// `batch` and the last with the token; a follower holds `batch` rows until
/// the numbered row arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RdataToken {
    /// `batch`: more rows with the same token follow.
    Batch,
    /// The last (or only) row of this token.
    At(Token),
}

impl RdataToken {
    /// The token, or `None` for `batch`.
    pub const fn token(self) -> Option<Token> {
        match self {
            RdataToken::Batch => None,
            RdataToken::At(token) => Some(token),
        }
    }

    /// Whether this is a `batch` row.
    pub const fn is_batch(self) -> bool {
        matches!(self, RdataToken::Batch)
    }
}

impl From<Token> for RdataToken {
    fn from(token: Token) -> Self {
        RdataToken::At(token)
    }
}

impl fmt::Display for RdataToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RdataToken::Batch => f.write_str("batch"),
            RdataToken::At(token) => fmt::Display::fmt(token, f),
        }
    }
}
