//! The errors of the replication HTTP API, both ways, as Synapse spells
//! them on the wire: `{"error": "...", "errcode": "M_..."}`.

use serde_json::Value;

use super::serve::error_body;

/// The longest name or id quoted in an error.
const QUOTED: usize = 64;

pub(super) fn cut(text: &str) -> String {
    text.chars().take(QUOTED).collect()
}

/// Why a process refuses a call on its replication endpoints, with the
/// answer to give: [`status`](Self::status) and [`body`](Self::body).
///
/// Synapse's own answers, but for a missing or wrong secret (401 here,
/// 500 in Synapse: see
/// [`CatchUpEndpoint`](crate::http::CatchUpEndpoint)) and for what
/// Synapse does not check (a malformed or unknown `_INT_STREAM_POS`,
/// which Synapse answers with a 500 or waits five seconds for; a txn id
/// reused with another request, which Synapse answers with the first
/// request's answer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicationError {
    /// No endpoint has this path (or a segment is missing or empty): 404
    /// `M_UNRECOGNIZED`.
    #[error("unrecognized request")]
    NotFound,
    /// An endpoint's path with another method: 405 `M_UNRECOGNIZED`.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// No `Authorization` header: 401 `M_MISSING_TOKEN`.
    #[error("missing Authorization header")]
    MissingAuthorization,
    /// More than one `Authorization` header: 401 `M_UNKNOWN_TOKEN`.
    #[error("too many Authorization headers")]
    TooManyAuthorizations,
    /// Not `Bearer <the secret>`: 401 `M_UNKNOWN_TOKEN`.
    #[error("invalid Authorization header")]
    InvalidAuthorization,
    /// The body is not JSON (or not UTF-8): 400 `M_NOT_JSON`.
    #[error("content not JSON")]
    NotJson,
    /// The body is JSON but not an object: 400 `M_BAD_JSON`.
    #[error("content must be a JSON object")]
    NotObject,
    /// `_INT_STREAM_POS` is not `{"streams": {<stream>: <token>},
    /// "instance_name": <caller>}`: 400 `M_INVALID_PARAM`.
    #[error("invalid _INT_STREAM_POS: {0}")]
    InvalidPositions(&'static str),
    /// `_INT_STREAM_POS` names a stream this process does not know: 400
    /// `M_UNKNOWN`.
    #[error("unknown stream {0:?} in _INT_STREAM_POS")]
    UnknownStream(String),
    /// `_INT_STREAM_POS` says the caller wrote a stream the
    /// configuration does not let it write: 400 `M_FORBIDDEN`.
    #[error("{instance:?} does not write {stream:?}")]
    NotAWriter {
        /// The stream, cut short.
        stream: String,
        /// The caller, cut short.
        instance: String,
    },
    /// The txn id was used before with another request (other path
    /// arguments or another body): 400 `M_INVALID_PARAM`. A retry sends the
    /// same request again.
    #[error("txn id {0:?} was used for another request")]
    TxnConflict(String),
    /// Too many calls with one txn id wait for its first, or too many
    /// answers are kept: 503 `M_LIMIT_EXCEEDED`. Retry later.
    #[error("too many requests in flight")]
    Busy,
    /// What the application's handler refused the call with, as a
    /// `SynapseError` is answered.
    #[error("{status} {errcode}: {message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The Matrix error code (`M_FORBIDDEN`...).
        errcode: String,
        /// What went wrong, for the caller.
        message: String,
    },
}

impl ReplicationError {
    /// A refusal of the application's own: answered with this status and
    /// Synapse's error body.
    pub fn refused(
        status: u16,
        errcode: impl Into<String>,
        message: impl Into<String>,
    ) -> ReplicationError {
        ReplicationError::Refused {
            status,
            errcode: errcode.into(),
            message: message.into(),
        }
    }

    /// The HTTP status to answer.
    pub fn status(&self) -> u16 {
        match self {
            ReplicationError::NotFound => 404,
            ReplicationError::MethodNotAllowed => 405,
            ReplicationError::MissingAuthorization
            | ReplicationError::TooManyAuthorizations
            | ReplicationError::InvalidAuthorization => 401,
            ReplicationError::NotJson
            | ReplicationError::NotObject
            | ReplicationError::InvalidPositions(_)
            | ReplicationError::UnknownStream(_)
            | ReplicationError::NotAWriter { .. }
            | ReplicationError::TxnConflict(_) => 400,
            ReplicationError::Busy => 503,
            ReplicationError::Refused { status, .. } => *status,
        }
    }

    /// The Matrix error code of the answer.
    pub fn errcode(&self) -> &str {
        match self {
            ReplicationError::NotFound | ReplicationError::MethodNotAllowed => "M_UNRECOGNIZED",
            ReplicationError::MissingAuthorization => "M_MISSING_TOKEN",
            ReplicationError::TooManyAuthorizations | ReplicationError::InvalidAuthorization => {
                "M_UNKNOWN_TOKEN"
            }
            ReplicationError::NotJson => "M_NOT_JSON",
            ReplicationError::NotObject => "M_BAD_JSON",
            ReplicationError::InvalidPositions(_) | ReplicationError::TxnConflict(_) => {
                "M_INVALID_PARAM"
            }
            ReplicationError::UnknownStream(_) => "M_UNKNOWN",
            ReplicationError::NotAWriter { .. } => "M_FORBIDDEN",
            ReplicationError::Busy => "M_LIMIT_EXCEEDED",
            ReplicationError::Refused { errcode, .. } => errcode,
        }
    }

    /// The JSON body of the answer, with Synapse's words where Synapse has
    /// some (`Unrecognized request`, `Content not JSON.`...).
    pub fn body(&self) -> String {
        let message = match self {
            ReplicationError::NotFound | ReplicationError::MethodNotAllowed => {
                "Unrecognized request".to_owned()
            }
            ReplicationError::MissingAuthorization => "Missing Authorization header.".to_owned(),
            ReplicationError::TooManyAuthorizations => "Too many Authorization headers.".to_owned(),
            ReplicationError::InvalidAuthorization => "Invalid Authorization header.".to_owned(),
            ReplicationError::NotJson => "Content not JSON.".to_owned(),
            ReplicationError::NotObject => "Content must be a JSON object.".to_owned(),
            ReplicationError::Refused { message, .. } => message.clone(),
            other => other.to_string(),
        };
        error_body(&message, self.errcode())
    }
}

/// A call the callee answered with an error: its status and Synapse's
/// error body, as the caller relays it (Synapse's
/// `HttpResponseException.unsafe_to_verbatim_synapse_error`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {errcode}: {message}")]
#[non_exhaustive]
pub struct RemoteError {
    /// The HTTP status.
    pub status: u16,
    /// The body's `errcode`, or `M_UNKNOWN` when it has none.
    pub errcode: String,
    /// The body's `error`, or the body itself (cut short) when it is not
    /// Synapse's error body.
    pub message: String,
}

impl RemoteError {
    /// Reads an error answer: `{"errcode", "error"}` when the body is
    /// Synapse's error body.
    pub fn from_answer(status: u16, body: &[u8]) -> RemoteError {
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        let field = |name: &str| {
            parsed
                .as_ref()
                .and_then(|value| value.get(name))
                .and_then(Value::as_str)
                .map(cut)
        };
        RemoteError {
            status,
            errcode: field("errcode").unwrap_or_else(|| "M_UNKNOWN".to_owned()),
            message: field("error").unwrap_or_else(|| cut(&String::from_utf8_lossy(body))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_in_synapse_words() {
        assert_eq!(
            ReplicationError::NotJson.body(),
            r#"{"error":"Content not JSON.","errcode":"M_NOT_JSON"}"#
        );
        assert_eq!(ReplicationError::NotFound.status(), 404);
        let refused = ReplicationError::refused(403, "M_FORBIDDEN", "not in room");
        assert_eq!(refused.status(), 403);
        assert_eq!(
            refused.body(),
            r#"{"error":"not in room","errcode":"M_FORBIDDEN"}"#
        );
    }

    #[test]
    fn remote_errors_read_both_shapes() {
        let error =
            RemoteError::from_answer(400, br#"{"errcode":"M_UNKNOWN","error":"Unknown stream"}"#);
        assert_eq!(
            (error.errcode.as_str(), error.message.as_str()),
            ("M_UNKNOWN", "Unknown stream")
        );
        let error = RemoteError::from_answer(502, b"Bad Gateway");
        assert_eq!(
            (error.errcode.as_str(), error.message.as_str()),
            ("M_UNKNOWN", "Bad Gateway")
        );
    }
}
