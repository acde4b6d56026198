//! Errors of typed rows.

use crate::wire::{JsonError, StreamName};

/// Offending rows are quoted as the wire layer quotes its input.
pub(crate) use crate::wire::snippet;

/// A row that does not decode as its stream's typed row, or a typed row that
/// cannot be encoded.
///
/// A decode error concerns that one row: the line it came in, the connection
/// and the stream's position are unaffected. Fields are named as Synapse
/// names them (see each row type's `FIELDS`). For the fields inside an
/// `events` row's `data` array, `index` is the position within `data` and
/// `field` reads `data.<name>`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RowError {
    /// The bytes are not one JSON value (only from `from_slice`: a
    /// [`RawRow`](crate::wire::RawRow) always holds valid JSON).
    #[error("{stream} row: invalid JSON: {source}: {input:?}")]
    Json {
        /// The stream whose row was being decoded.
        stream: StreamName,
        /// What serde_json reported.
        source: serde_json::Error,
        /// The row as received, truncated.
        input: String,
    },
    /// The row is valid JSON but not an array.
    #[error("{stream} row: not an array: {source}: {input:?}")]
    NotAnArray {
        /// The stream whose row was being decoded.
        stream: StreamName,
        /// What serde_json reported.
        source: serde_json::Error,
        /// The row as received, truncated.
        input: String,
    },
    /// The row has fewer fields than its type needs: `index` is the first
    /// one missing (so also the number of fields present).
    #[error("{stream} row: missing field {field} (index {index}): {input:?}")]
    MissingField {
        /// The stream whose row was being decoded.
        stream: StreamName,
        /// Position of the first missing field.
        index: usize,
        /// Synapse's name of the first missing field.
        field: &'static str,
        /// The row as received, truncated.
        input: String,
    },
    /// A field is present but does not have the type Synapse gives it (or
    /// holds text that cannot be decoded exactly, such as a lone UTF-16
    /// surrogate in a string or an integer beyond 64 bits).
    #[error("{stream} row: invalid field {field} (index {index}): {source}: {input:?}")]
    InvalidField {
        /// The stream whose row was being decoded.
        stream: StreamName,
        /// Position of the field.
        index: usize,
        /// Synapse's name of the field; `extra` for a field after the known
        /// ones.
        field: &'static str,
        /// What was wrong, as serde_json reported it.
        source: serde_json::Error,
        /// The row as received, truncated.
        input: String,
    },
    /// A typed row could not be written as JSON.
    #[error("{stream} row: cannot encode: {source}")]
    Encode {
        /// The stream of the row.
        stream: StreamName,
        /// What was wrong.
        source: JsonError,
    },
}

impl RowError {
    /// The stream whose row this error is about.
    pub fn stream(&self) -> &StreamName {
        match self {
            RowError::Json { stream, .. }
            | RowError::NotAnArray { stream, .. }
            | RowError::MissingField { stream, .. }
            | RowError::InvalidField { stream, .. }
            | RowError::Encode { stream, .. } => stream,
        }
    }

    /// The position and Synapse's name of the field at fault, if one is.
    pub fn field(&self) -> Option<(usize, &'static str)> {
        match self {
            RowError::MissingField { index, field, .. }
            | RowError::InvalidField { index, field, .. } => Some((*index, field)),
            _ => None,
        }
    }
}
