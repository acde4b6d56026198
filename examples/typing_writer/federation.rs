//! Inbound federation typing, as Synapse's typing writer takes it: the
//! process that received a federation transaction forwards each `m.typing`
//! EDU to the typing writer (`ReplicationFederationSendEduRestServlet`,
//! `POST /_synapse/replication/fed_send_edu/m.typing/<txn_id>`, body
//! `{"origin": ..., "content": {"room_id", "user_id", "typing"}}`), and
//! fails the whole transaction (the remote server then retries it) unless
//! it is answered 200. The crate's `HttpServer` serves the endpoint
//! (`ReplicationEndpoint::fed_send_edu`: the secret, the body, the txn
//! id's retries); what to do with the EDU is `TypingWriterHandler.
//! _recv_edu`'s rule, and this file holds its pure part: the EDU itself.

use std::time::Duration;

use serde_json::{Map, Value};
use synapse_replication::http::ReplicationError;

/// How long a remote user types after an EDU that says so
/// (`FEDERATION_TIMEOUT` in handlers/typing.py): remote servers repeat
/// the EDU while their user types.
pub const FEDERATION_TIMEOUT: Duration = Duration::from_secs(60);

/// The only EDU type a typing writer is sent.
pub const TYPING_EDU: &str = "m.typing";

/// One forwarded typing EDU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypingEdu {
    /// The server that sent it (authenticated by Synapse's federation
    /// receiver).
    pub origin: String,
    /// The room.
    pub room_id: String,
    /// Who types: a user of `origin`, or the EDU is ignored.
    pub user_id: String,
    /// Starts (true) or stops (false).
    pub typing: bool,
}

impl TypingEdu {
    /// The server part of `user_id` (after the first `:`).
    pub fn user_server(&self) -> &str {
        self.user_id
            .split_once(':')
            .map(|(_, server)| server)
            .unwrap_or_default()
    }
}

/// Why a forwarded EDU is refused: nothing of it is applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EduError {
    /// An EDU type other than `m.typing`: Synapse's processes send those
    /// to their own handlers, never to a typing writer.
    #[error("unsupported EDU type {0:?}: this typing writer handles only m.typing")]
    UnknownType(String),
    /// `content` is not a JSON object.
    #[error("content must be a JSON object")]
    NotObject,
    /// A field is missing.
    #[error("missing params: {0}")]
    Missing(&'static str),
    /// A field has the wrong type or shape.
    #[error("invalid param {field}: {why}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        why: &'static str,
    },
}

impl EduError {
    /// The refusal, as Synapse's JSON errors are spelled.
    pub fn refusal(&self) -> ReplicationError {
        let errcode = match self {
            EduError::UnknownType(_) => "M_UNRECOGNIZED",
            EduError::NotObject => "M_BAD_JSON",
            EduError::Missing(_) => "M_MISSING_PARAM",
            EduError::Invalid { .. } => "M_INVALID_PARAM",
        };
        ReplicationError::refused(400, errcode, self.to_string())
    }
}

/// The EDU of a `fed_send_edu` call: its type must be `m.typing` and its
/// content (the body, without `_INT_STREAM_POS`, which the server took
/// out and waited for) Synapse's.
pub fn parse(edu_type: &str, body: &Map<String, Value>) -> Result<TypingEdu, EduError> {
    if edu_type != TYPING_EDU {
        return Err(EduError::UnknownType(edu_type.chars().take(64).collect()));
    }
    let origin = string(body.get("origin"), "origin")?;
    let content = body
        .get("content")
        .ok_or(EduError::Missing("content"))?
        .as_object()
        .ok_or(EduError::NotObject)?;
    let room_id = string(content.get("room_id"), "content.room_id")?;
    let user_id = string(content.get("user_id"), "content.user_id")?;
    // `UserID.from_string`: `@localpart:server`.
    if !user_id.starts_with('@') || !user_id.contains(':') {
        return Err(EduError::Invalid {
            field: "content.user_id",
            why: "not a user id (@localpart:server)",
        });
    }
    let typing = content
        .get("typing")
        .ok_or(EduError::Missing("content.typing"))?;
    Ok(TypingEdu {
        origin,
        room_id,
        user_id,
        typing: truthy(typing),
    })
}

fn string(value: Option<&Value>, field: &'static str) -> Result<String, EduError> {
    value
        .ok_or(EduError::Missing(field))?
        .as_str()
        .map(str::to_owned)
        .ok_or(EduError::Invalid {
            field,
            why: "not a string",
        })
}

/// Python's truth of a JSON value: Synapse applies `content["typing"]`
/// as it comes, so a remote server's `1` starts typing there, and must
/// here too (refusing it would fail the remote's whole transaction).
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(value) => *value,
        Value::Number(number) => number.as_f64().is_some_and(|number| number != 0.0),
        Value::String(text) => !text.is_empty(),
        Value::Array(items) => !items.is_empty(),
        Value::Object(fields) => !fields.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).expect("an object")
    }

    #[test]
    fn parses_synapse_s_body() {
        let edu = parse(
            TYPING_EDU,
            &body(r#"{"origin":"o.org","content":{"room_id":"!r:x","user_id":"@u:o.org","typing":1}}"#),
        )
        .expect("an EDU");
        assert_eq!(edu.user_server(), "o.org");
        assert!(edu.typing);
        assert_eq!(
            parse("m.receipt", &body("{}")),
            Err(EduError::UnknownType("m.receipt".into()))
        );
        assert_eq!(
            parse(TYPING_EDU, &body(r#"{"origin":"o","content":[]}"#)),
            Err(EduError::NotObject)
        );
    }
}
