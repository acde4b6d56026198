//! Errors of the RESP codec.

/// How much of an offending input an error message quotes.
const SNIPPET_LEN: usize = 32;

/// A piece of offending input, truncated for error messages.
pub(crate) fn snippet(bytes: &[u8]) -> String {
    let cut = bytes.len().min(SNIPPET_LEN);
    let mut text = String::from_utf8_lossy(bytes.get(..cut).unwrap_or(bytes)).into_owned();
    if bytes.len() > SNIPPET_LEN {
        text.push('…');
    }
    text
}

/// Bytes from a Redis server that are not valid RESP, or that exceed the
/// decoder's [`Limits`](super::Limits).
///
/// RESP has no way to find the next frame after a bad one, so the
/// connection cannot go on: close it (and reconnect). The decoder forgets
/// its progress and leaves the buffer as it was. Quoted input is
/// truncated to 32 bytes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RespError {
    /// A frame starts with a byte that is no RESP2 or RESP3 type.
    #[error("invalid frame type byte {byte:#04x}: {input:?}")]
    InvalidType {
        /// The byte.
        byte: u8,
        /// The input from that byte, truncated.
        input: String,
    },
    /// A length or element count that is not a decimal number of at most 19
    /// digits, or is negative other than the `-1` of RESP2's null bulk
    /// string and null array. RESP3 streamed types (`$?`, `*?`) are not
    /// supported (Redis never sends them) and are reported here too.
    #[error("invalid length: {input:?}")]
    InvalidLength {
        /// The header, truncated.
        input: String,
    },
    /// A line or bulk payload not followed by `\r\n`, or a line with a bare
    /// `\r` or `\n` in it.
    #[error("expected CRLF: {input:?}")]
    MissingCrlf {
        /// The input where CRLF was expected, truncated.
        input: String,
    },
    /// A well-framed value whose content is not valid for its type: an
    /// integer that is not a signed 64-bit decimal, a double, big number or
    /// boolean that does not parse, a null with content, a verbatim string
    /// without its `xxx:` format prefix.
    #[error("invalid {what}: {input:?}")]
    InvalidValue {
        /// The type, e.g. `"integer"`.
        what: &'static str,
        /// The frame, truncated.
        input: String,
    },
    /// A bulk string, bulk error or verbatim string declares more bytes
    /// than [`Limits::max_bulk_len`](super::Limits::max_bulk_len).
    #[error("bulk length {len} exceeds the limit of {max} bytes")]
    BulkTooLong {
        /// The declared length.
        len: u64,
        /// The configured limit.
        max: usize,
    },
    /// An aggregate declares more elements (pairs, for maps and attributes)
    /// than [`Limits::max_elements`](super::Limits::max_elements).
    #[error("aggregate of {len} elements exceeds the limit of {max}")]
    TooManyElements {
        /// The declared count.
        len: u64,
        /// The configured limit.
        max: usize,
    },
    /// Aggregates nested deeper than
    /// [`Limits::max_depth`](super::Limits::max_depth).
    #[error("aggregates nested deeper than {max} levels")]
    TooDeep {
        /// The configured limit.
        max: usize,
    },
    /// A simple string, error, number, double or big number line longer than
    /// [`Limits::max_line_len`](super::Limits::max_line_len), without its
    /// CRLF.
    #[error("line longer than {max} bytes: {input:?}")]
    LineTooLong {
        /// The configured limit.
        max: usize,
        /// The start of the line, truncated.
        input: String,
    },
    /// One frame would be larger than
    /// [`Limits::max_frame_len`](super::Limits::max_frame_len) bytes.
    #[error("frame of at least {len} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge {
        /// How long the frame is known to be, at least.
        len: u64,
        /// The configured limit.
        max: usize,
    },
    /// The decoder's saved progress does not match the buffer it was given:
    /// bytes it had already seen were changed or removed between calls
    /// (only appending is allowed). A caller bug, never caused by a peer.
    #[error("decoder state does not match the buffer: bytes already passed in were changed")]
    Desync,
}

impl RespError {
    /// Whether the input broke one of the configured
    /// [`Limits`](super::Limits) rather than the RESP grammar.
    pub fn is_limit(&self) -> bool {
        matches!(
            self,
            RespError::BulkTooLong { .. }
                | RespError::TooManyElements { .. }
                | RespError::TooDeep { .. }
                | RespError::LineTooLong { .. }
                | RespError::FrameTooLarge { .. }
        )
    }
}

/// A [`Frame`](super::Frame) built by hand that cannot be written as RESP
/// that reads back as the same frame.
///
/// Frames returned by the decoder always encode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RespEncodeError {
    /// A simple string or simple error containing `\r` or `\n`, which would
    /// end the line early. Use a bulk string or bulk error instead.
    #[error("{what} contains CR or LF: {input:?}")]
    Newline {
        /// `"simple string"` or `"simple error"`.
        what: &'static str,
        /// The content, truncated.
        input: String,
    },
    /// A double or big number whose text the decoder would refuse.
    #[error("invalid {what}: {input:?}")]
    InvalidValue {
        /// `"double"` or `"big number"`.
        what: &'static str,
        /// The content, truncated.
        input: String,
    },
}
