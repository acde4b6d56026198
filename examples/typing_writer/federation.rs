//! Inbound federation typing, as Synapse's typing writer takes it: the
//! process that received a federation transaction forwards each `m.typing`
//! EDU to the typing writer (`ReplicationFederationSendEduRestServlet`,
//! `POST /_synapse/replication/fed_send_edu/m.typing/<txn_id>`, body
//! `{"origin": ..., "content": {"room_id", "user_id", "typing"}}`), and
//! fails the whole transaction (the remote server then retries it) unless
//! it is answered 200. What to do with the EDU is `TypingWriterHandler.
//! _recv_edu`'s rule; this file holds the pure parts: the route, the body,
//! and the per-txn-id memory of what was applied.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde_json::Value;
use synapse_replication::transport::HttpResponse;

/// How long a remote user types after an EDU that says so
/// (`FEDERATION_TIMEOUT` in handlers/typing.py): remote servers repeat
/// the EDU while their user types.
pub const FEDERATION_TIMEOUT: Duration = Duration::from_secs(60);

/// The only EDU type a typing writer is sent.
pub const TYPING_EDU: &str = "m.typing";

/// How long a txn id is remembered (Synapse's `ResponseCache` for
/// replication endpoints keeps answers 30 minutes).
pub const TXN_MEMORY: Duration = Duration::from_secs(30 * 60);

/// The most txn ids remembered at once: beyond it the oldest are
/// forgotten early, so that a flood of EDUs cannot grow the map without
/// bound (a forgotten txn id retried is applied again, which for typing
/// only restarts its timeout).
pub const TXN_MEMORY_MAX: usize = 100_000;

const ROUTE: &str = "/_synapse/replication/fed_send_edu/";

/// `(edu_type, txn_id)` of a `fed_send_edu` path, percent-decoded; `None`
/// for any other path.
pub fn route(path: &str) -> Option<(String, String)> {
    let rest = path.strip_prefix(ROUTE)?;
    let (edu_type, txn_id) = rest.split_once('/')?;
    if edu_type.is_empty() || txn_id.is_empty() || txn_id.contains('/') {
        return None;
    }
    Some((super::unquote(edu_type)?, super::unquote(txn_id)?))
}

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
    /// The method is not `POST`.
    #[error("fed_send_edu takes POST, not {0}")]
    Method(String),
    /// An EDU type other than `m.typing`: Synapse's processes send those
    /// to their own handlers, never to a typing writer.
    #[error("unsupported EDU type {0:?}: this typing writer handles only m.typing")]
    UnknownType(String),
    /// The body is not JSON.
    #[error("content not JSON")]
    NotJson,
    /// The body, or its `content`, is not a JSON object.
    #[error("{0} must be a JSON object")]
    NotObject(&'static str),
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
    /// The answer, as Synapse's JSON errors are spelled.
    pub fn response(&self) -> HttpResponse {
        let (status, errcode) = match self {
            EduError::Method(_) => (405, "M_UNRECOGNIZED"),
            EduError::UnknownType(_) => (400, "M_UNRECOGNIZED"),
            EduError::NotJson => (400, "M_NOT_JSON"),
            EduError::NotObject(_) => (400, "M_BAD_JSON"),
            EduError::Missing(_) => (400, "M_MISSING_PARAM"),
            EduError::Invalid { .. } => (400, "M_INVALID_PARAM"),
        };
        HttpResponse::error(status, errcode, &self.to_string())
    }
}

/// The EDU of a `fed_send_edu` request: its type must be `m.typing` and
/// its body Synapse's (`_stream_positions`, which says what the caller
/// wrote, is not needed: the membership check asks the homeserver
/// itself).
pub fn parse(method: &str, edu_type: &str, body: &[u8]) -> Result<TypingEdu, EduError> {
    if method != "POST" {
        return Err(EduError::Method(method.chars().take(16).collect()));
    }
    if edu_type != TYPING_EDU {
        return Err(EduError::UnknownType(edu_type.chars().take(64).collect()));
    }
    let body: Value = serde_json::from_slice(body).map_err(|_| EduError::NotJson)?;
    let body = body.as_object().ok_or(EduError::NotObject("the body"))?;
    let origin = string(body.get("origin"), "origin")?;
    let content = body
        .get("content")
        .ok_or(EduError::Missing("content"))?
        .as_object()
        .ok_or(EduError::NotObject("content"))?;
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

/// The txn ids already answered, so that a retry (Synapse retries a
/// request with the same txn id after a timeout) is answered without being
/// applied again: Synapse's `ResponseCache`, bounded in time
/// ([`TXN_MEMORY`]) and in size ([`TXN_MEMORY_MAX`]). Only answered
/// EDUs are remembered; a refused request is not, as Synapse does not
/// keep failures.
#[derive(Debug, Default)]
pub struct TxnMemory {
    /// When each txn id was answered.
    answered: HashMap<String, Instant>,
    /// The same, oldest first, to forget in order.
    order: VecDeque<(Instant, String)>,
}

impl TxnMemory {
    /// Whether `txn_id` was answered within [`TXN_MEMORY`] of `now`.
    pub fn contains(&mut self, txn_id: &str, now: Instant) -> bool {
        self.forget(now);
        self.answered.contains_key(txn_id)
    }

    /// Remembers that `txn_id` was answered at `now`.
    pub fn insert(&mut self, txn_id: &str, now: Instant) {
        self.forget(now);
        if self.answered.insert(txn_id.to_owned(), now).is_none() {
            self.order.push_back((now, txn_id.to_owned()));
        }
        while self.order.len() > TXN_MEMORY_MAX {
            if let Some((_, oldest)) = self.order.pop_front() {
                self.answered.remove(&oldest);
            }
        }
    }

    /// How many txn ids are remembered.
    pub fn len(&self) -> usize {
        self.answered.len()
    }

    fn forget(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front() {
            if now.saturating_duration_since(*at) < TXN_MEMORY {
                break;
            }
            if let Some((_, txn_id)) = self.order.pop_front() {
                self.answered.remove(&txn_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            route("/_synapse/replication/fed_send_edu/m.typing/AbC"),
            Some(("m.typing".into(), "AbC".into()))
        );
        assert_eq!(route("/_synapse/replication/fed_send_edu/m.typing"), None);
        assert_eq!(
            route("/_synapse/replication/fed_send_edu/m.typing/a/b"),
            None
        );
        assert_eq!(route("/_synapse/replication/fed_send_edu//a"), None);
    }

    #[test]
    fn txn_ids_are_forgotten_after_thirty_minutes() {
        let start = Instant::now();
        let mut memory = TxnMemory::default();
        memory.insert("a", start);
        assert!(memory.contains("a", start + TXN_MEMORY - Duration::from_secs(1)));
        assert!(!memory.contains("a", start + TXN_MEMORY));
        assert_eq!(memory.len(), 0);
    }
}
