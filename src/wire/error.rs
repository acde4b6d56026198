//! Errors of the wire codec.

use super::command::CommandKind;
use super::json::JsonError;

/// How much of an offending input an error message quotes.
const SNIPPET_LEN: usize = 64;

/// A piece of offending input, truncated for error messages.
pub(crate) fn snippet(bytes: &[u8]) -> String {
    let cut = bytes.len().min(SNIPPET_LEN);
    let mut text = String::from_utf8_lossy(&bytes[..cut]).into_owned();
    if bytes.len() > SNIPPET_LEN {
        text.push('…');
    }
    text
}

/// A line that is not a valid replication command.
///
/// Over Redis, Synapse logs such a line and skips it; over direct TCP it
/// answers `ERROR` and closes the connection. Either way the line is never
/// applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The line is longer than the decoder's limit.
    #[error("line of {len} bytes exceeds the limit of {max} bytes")]
    LineTooLong {
        /// The line's length.
        len: usize,
        /// The configured limit.
        max: usize,
    },
    /// The line contains a `\n`: lines must be split before decoding.
    #[error("line contains a newline")]
    Newline,
    /// The command name is not one this crate knows (a newer Synapse's
    /// command, or garbage). Callers that follow a deployment skip it.
    #[error("unknown command {name:?}")]
    UnknownCommand {
        /// The name, truncated.
        name: String,
    },
    /// A field the command needs is absent.
    #[error("{command}: missing {field}")]
    MissingField {
        /// The command.
        command: CommandKind,
        /// Which field.
        field: &'static str,
    },
    /// A field is present but not acceptable.
    #[error("{command}: invalid {field} ({expected}): {input:?}")]
    InvalidField {
        /// The command.
        command: CommandKind,
        /// Which field.
        field: &'static str,
        /// What the field must be.
        expected: &'static str,
        /// The field as received, truncated.
        input: String,
    },
    /// A token that is not a decimal integer within 64 bits.
    #[error(
        "{command}: invalid {field} (expected an integer within 64 bits or `batch`): {input:?}"
    )]
    InvalidToken {
        /// The command.
        command: CommandKind,
        /// Which field.
        field: &'static str,
        /// The token as received, truncated.
        input: String,
    },
    /// A JSON field that does not parse or has the wrong shape.
    #[error("{command}: invalid JSON in {field}: {source}: {input:?}")]
    InvalidJson {
        /// The command.
        command: CommandKind,
        /// Which field.
        field: &'static str,
        /// What was wrong.
        source: JsonError,
        /// The JSON as received, truncated.
        input: String,
    },
}

impl DecodeError {
    /// The command the line claimed to be, when its name was recognised.
    pub fn command(&self) -> Option<CommandKind> {
        match self {
            DecodeError::MissingField { command, .. }
            | DecodeError::InvalidField { command, .. }
            | DecodeError::InvalidToken { command, .. }
            | DecodeError::InvalidJson { command, .. } => Some(*command),
            _ => None,
        }
    }
}

/// A command that cannot be written as a line Synapse would read back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// A field contains a newline, which would split the line.
    #[error("{command}: {field} contains a newline")]
    Newline {
        /// The command.
        command: CommandKind,
        /// Which field.
        field: &'static str,
    },
    /// A space-separated field is empty or contains a space, so the line
    /// would not split back into the same fields.
    #[error("{command}: {field} must be non-empty and contain no space: {input:?}")]
    InvalidField {
        /// The command.
        command: CommandKind,
        /// Which field.
        field: &'static str,
        /// The field, truncated.
        input: String,
    },
    /// A `USER_SYNC` device id spelled `None`, which reads back as no device.
    #[error("USER_SYNC: device id \"None\" would read back as no device")]
    AmbiguousDeviceId,
    /// A JSON field could not be encoded.
    #[error("{command}: cannot encode {field}: {source}")]
    Json {
        /// The command.
        command: CommandKind,
        /// Which field.
        field: &'static str,
        /// What was wrong.
        source: JsonError,
    },
}
