//! The account-data writer's endpoints (`replication/http/account_data.py`):
//! the six calls Synapse's processes make on the instance that
//! `stream_writers.account_data` names, typed both ways.

use serde_json::{Map, Value};

use crate::wire::Token;

use super::api::ReplicationRequest;
use super::endpoint::{Method, ReplicationEndpoint};
use super::error::{RemoteError, ReplicationError, cut};

/// One change of a user's account data that a process asks the
/// account-data writer to make, as Synapse 1.163.2's account-data handler
/// sends it (`AccountDataHandler` in `handlers/account_data.py`, through
/// the classes of `replication/http/account_data.py`). Each variant is one
/// endpoint: `POST /_synapse/replication/<name>/<path args...>`, the
/// arguments percent-encoded, with **no txn id** (every one of the six
/// says `CACHE = False`: a retried call is handled again), and a body of
/// `{"content": {...}}` for the three that add, `{}` for the three that
/// remove (their `_serialize_payload` sends nothing else, whatever their
/// docstrings say), plus the caller's `_INT_STREAM_POS`. Each is answered
/// with an [`AccountDataAnswer`] and the callee's positions.
///
/// The field names are Synapse's `PATH_ARGS`, in the order of the path.
///
/// ```
/// use synapse_replication::http::AccountDataRequest;
///
/// let request = AccountDataRequest::AddTag {
///     user_id: "@alice:example.com".into(),
///     room_id: "!room:example.com".into(),
///     tag: "u.work".into(),
///     content: serde_json::json!({"order": 0.5}).as_object().cloned().unwrap_or_default(),
/// };
/// let endpoint = request.endpoint();
/// assert_eq!(endpoint.name(), "add_tag");
/// assert!(!endpoint.caches());
/// assert_eq!(
///     endpoint.path(&request.args(), None),
///     "/_synapse/replication/add_tag/%40alice%3Aexample.com/%21room%3Aexample.com/u.work",
/// );
/// assert_eq!(serde_json::Value::Object(request.content()).to_string(), r#"{"content":{"order":0.5}}"#);
///
/// // The writer's side: the call read back, checked.
/// let call = synapse_replication::http::ReplicationApi::new("rust_ad".into(), None)
///     .with_endpoint(endpoint);
/// let route = call.route("POST", &call.endpoints()[0].path(&request.args(), None), [])?;
/// let read = call.read(route, None, br#"{"content":{"order":0.5}}"#)?;
/// assert_eq!(AccountDataRequest::from_call(&read, "example.com")?, request);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum AccountDataRequest {
    /// `add_user_account_data/<user_id>/<account_data_type>`: sets a
    /// global account-data item (`PUT /user/{u}/account_data/{type}`).
    AddUserAccountData {
        /// The user.
        user_id: String,
        /// The item's type (`m.direct`, `m.ignored_user_list`...).
        account_data_type: String,
        /// Its content.
        content: Map<String, Value>,
    },
    /// `remove_user_account_data/<user_id>/<account_data_type>`: sets a
    /// global item's content to `{}` (MSC3391's `DELETE`).
    RemoveUserAccountData {
        /// The user.
        user_id: String,
        /// The item's type.
        account_data_type: String,
    },
    /// `add_room_account_data/<user_id>/<room_id>/<account_data_type>`:
    /// sets a per-room item (`PUT /user/{u}/rooms/{r}/account_data/{type}`).
    AddRoomAccountData {
        /// The user.
        user_id: String,
        /// The room.
        room_id: String,
        /// The item's type.
        account_data_type: String,
        /// Its content.
        content: Map<String, Value>,
    },
    /// `remove_room_account_data/<user_id>/<room_id>/<account_data_type>`:
    /// sets a per-room item's content to `{}` (MSC3391's `DELETE`).
    RemoveRoomAccountData {
        /// The user.
        user_id: String,
        /// The room.
        room_id: String,
        /// The item's type.
        account_data_type: String,
    },
    /// `add_tag/<user_id>/<room_id>/<tag>`: tags a room
    /// (`PUT /user/{u}/rooms/{r}/tags/{tag}`).
    AddTag {
        /// The user.
        user_id: String,
        /// The room.
        room_id: String,
        /// The tag (`m.favourite`, `u.work`...).
        tag: String,
        /// The tag's content (`{"order": 0.5}`).
        content: Map<String, Value>,
    },
    /// `remove_tag/<user_id>/<room_id>/<tag>`: untags a room.
    RemoveTag {
        /// The user.
        user_id: String,
        /// The room.
        room_id: String,
        /// The tag.
        tag: String,
    },
}

/// The six endpoints: `NAME`, and `PATH_ARGS` in Synapse's order.
const ENDPOINTS: [(&str, &[&str]); 6] = [
    ("add_user_account_data", &["user_id", "account_data_type"]),
    (
        "remove_user_account_data",
        &["user_id", "account_data_type"],
    ),
    (
        "add_room_account_data",
        &["user_id", "room_id", "account_data_type"],
    ),
    (
        "remove_room_account_data",
        &["user_id", "room_id", "account_data_type"],
    ),
    ("add_tag", &["user_id", "room_id", "tag"]),
    ("remove_tag", &["user_id", "room_id", "tag"]),
];

fn endpoint_at(index: usize) -> ReplicationEndpoint {
    let (name, args) = ENDPOINTS[index];
    // POST (the default METHOD), CACHE = False, WAIT_FOR_STREAMS = True
    // (the default) for all six.
    ReplicationEndpoint::new(Method::Post, name, args).without_cache()
}

impl AccountDataRequest {
    /// The six endpoints, as Synapse's classes declare them: `POST`, no
    /// answer cache (so no txn id), positions both ways. A process that
    /// is `stream_writers.account_data` serves them all (Synapse registers
    /// the two `remove_*_account_data` only with MSC3391 enabled, which is
    /// also when its processes call them).
    pub fn endpoints() -> [ReplicationEndpoint; 6] {
        std::array::from_fn(endpoint_at)
    }

    fn index(&self) -> usize {
        match self {
            AccountDataRequest::AddUserAccountData { .. } => 0,
            AccountDataRequest::RemoveUserAccountData { .. } => 1,
            AccountDataRequest::AddRoomAccountData { .. } => 2,
            AccountDataRequest::RemoveRoomAccountData { .. } => 3,
            AccountDataRequest::AddTag { .. } => 4,
            AccountDataRequest::RemoveTag { .. } => 5,
        }
    }

    /// The endpoint this change is sent to.
    pub fn endpoint(&self) -> ReplicationEndpoint {
        endpoint_at(self.index())
    }

    /// Its path arguments, in the endpoint's order (unencoded: give them
    /// to [`ReplicationEndpoint::path`]).
    pub fn args(&self) -> Vec<&str> {
        match self {
            AccountDataRequest::AddUserAccountData {
                user_id,
                account_data_type,
                ..
            }
            | AccountDataRequest::RemoveUserAccountData {
                user_id,
                account_data_type,
            } => vec![user_id, account_data_type],
            AccountDataRequest::AddRoomAccountData {
                user_id,
                room_id,
                account_data_type,
                ..
            }
            | AccountDataRequest::RemoveRoomAccountData {
                user_id,
                room_id,
                account_data_type,
            } => vec![user_id, room_id, account_data_type],
            AccountDataRequest::AddTag {
                user_id,
                room_id,
                tag,
                ..
            }
            | AccountDataRequest::RemoveTag {
                user_id,
                room_id,
                tag,
            } => vec![user_id, room_id, tag],
        }
    }

    /// The body it sends, without `_INT_STREAM_POS`: `{"content": {...}}`
    /// to add, `{}` to remove.
    pub fn content(&self) -> Map<String, Value> {
        let mut body = Map::new();
        if let Some(content) = self.added() {
            body.insert("content".to_owned(), Value::Object(content.clone()));
        }
        body
    }

    /// The content it sets: `None` for a removal.
    pub fn added(&self) -> Option<&Map<String, Value>> {
        match self {
            AccountDataRequest::AddUserAccountData { content, .. }
            | AccountDataRequest::AddRoomAccountData { content, .. }
            | AccountDataRequest::AddTag { content, .. } => Some(content),
            _ => None,
        }
    }

    /// The user whose account data it changes.
    pub fn user_id(&self) -> &str {
        self.args()[0]
    }

    /// The room, for a per-room item or a tag.
    pub fn room_id(&self) -> Option<&str> {
        match self {
            AccountDataRequest::AddUserAccountData { .. }
            | AccountDataRequest::RemoveUserAccountData { .. } => None,
            _ => Some(self.args()[1]),
        }
    }

    /// Reads a call to one of the six endpoints on the account-data writer
    /// of `server_name`, and checks what Synapse's writer takes on trust
    /// (its client API on main checked it): the user id is one
    /// (`@localpart:domain`, else 400 `M_INVALID_PARAM` in Synapse's
    /// words), of this server (else 403 `M_FORBIDDEN`, as main refuses a
    /// change of another user's account data), the room id one (`!...`,
    /// else 400 `M_INVALID_PARAM`), and an addition's `content` a JSON
    /// object (else 400 `M_BAD_JSON`; Synapse's writer answers a missing
    /// one with a 500). A removal's body is not read, as Synapse's is not.
    /// Whether the user is registered only the application knows.
    pub fn from_call(
        call: &ReplicationRequest,
        server_name: &str,
    ) -> Result<AccountDataRequest, ReplicationError> {
        let index = ENDPOINTS
            .iter()
            .position(|(name, _)| *name == call.endpoint)
            .ok_or(ReplicationError::NotFound)?;
        let arg = |name: &str| {
            call.arg(name)
                .map(str::to_owned)
                .ok_or(ReplicationError::NotFound)
        };
        let user_id = arg("user_id")?;
        check_user(&user_id, server_name, index)?;
        let room_id = if ENDPOINTS[index].1.contains(&"room_id") {
            let room_id = arg("room_id")?;
            check_room(&room_id)?;
            room_id
        } else {
            String::new()
        };
        let content = || match call.content.get("content") {
            Some(Value::Object(content)) => Ok(content.clone()),
            _ => Err(ReplicationError::refused(
                400,
                "M_BAD_JSON",
                "content must be a JSON object.",
            )),
        };
        Ok(match index {
            0 => AccountDataRequest::AddUserAccountData {
                user_id,
                account_data_type: arg("account_data_type")?,
                content: content()?,
            },
            1 => AccountDataRequest::RemoveUserAccountData {
                user_id,
                account_data_type: arg("account_data_type")?,
            },
            2 => AccountDataRequest::AddRoomAccountData {
                user_id,
                room_id,
                account_data_type: arg("account_data_type")?,
                content: content()?,
            },
            3 => AccountDataRequest::RemoveRoomAccountData {
                user_id,
                room_id,
                account_data_type: arg("account_data_type")?,
            },
            4 => AccountDataRequest::AddTag {
                user_id,
                room_id,
                tag: arg("tag")?,
                content: content()?,
            },
            _ => AccountDataRequest::RemoveTag {
                user_id,
                room_id,
                tag: arg("tag")?,
            },
        })
    }
}

/// `UserID.from_string`'s checks, then whether the user is local, with
/// the refusal main's client API gives for another user.
fn check_user(user_id: &str, server_name: &str, endpoint: usize) -> Result<(), ReplicationError> {
    let invalid = |message: &str| ReplicationError::refused(400, "M_INVALID_PARAM", message);
    let Some(rest) = user_id.strip_prefix('@') else {
        return Err(invalid("Expected UserID string to start with '@'"));
    };
    let Some((_, domain)) = rest.split_once(':') else {
        return Err(invalid("Expected UserID of the form '@localname:domain'"));
    };
    if domain != server_name {
        // handlers on main: rest/client/account_data.py and tags.py.
        let message = match endpoint {
            0 | 2 => "Cannot add account data for other users.",
            1 | 3 => "Cannot delete account data for other users.",
            _ => "Cannot add tags for other users.",
        };
        return Err(ReplicationError::refused(403, "M_FORBIDDEN", message));
    }
    Ok(())
}

/// `RoomID.from_string`'s check (a room id of room version 12 has no
/// domain).
fn check_room(room_id: &str) -> Result<(), ReplicationError> {
    if room_id.len() < 2 || !room_id.starts_with('!') {
        return Err(ReplicationError::refused(
            400,
            "M_INVALID_PARAM",
            format!("{} is not a valid room ID", cut(room_id)),
        ));
    }
    Ok(())
}

/// What the account-data writer answers each of the six calls:
/// `{"max_stream_id": N}`, the `account_data` stream's position once the
/// change is persisted (`get_current_token()` after the write, in
/// Synapse's stores; main then waits until it has seen it before it
/// answers the client). The callee's positions travel beside it in
/// `_INT_STREAM_POS`, handled by the transports.
///
/// Synapse's `remove_*` handlers are annotated `int | None` ("None if
/// there was nothing to delete"), but its stores always return the current
/// token: so does every answer here.
///
/// ```
/// use synapse_replication::http::AccountDataAnswer;
/// use synapse_replication::wire::Token;
///
/// let answer = AccountDataAnswer { max_stream_id: Token(7) };
/// let content = answer.to_content();
/// assert_eq!(serde_json::Value::Object(content.clone()).to_string(), r#"{"max_stream_id":7}"#);
/// assert_eq!(AccountDataAnswer::from_content(200, &content), Ok(answer));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccountDataAnswer {
    /// The `account_data` stream's position after the change.
    pub max_stream_id: Token,
}

impl AccountDataAnswer {
    /// The answer's content, `{"max_stream_id": N}`.
    pub fn to_content(&self) -> Map<String, Value> {
        let mut content = Map::new();
        content.insert(
            "max_stream_id".to_owned(),
            Value::from(self.max_stream_id.0),
        );
        content
    }

    /// Reads an answer's content (without `_INT_STREAM_POS`), answered
    /// with `status`; an answer without an integer `max_stream_id` is a
    /// [`RemoteError`] `M_BAD_JSON`.
    pub fn from_content(
        status: u16,
        content: &Map<String, Value>,
    ) -> Result<AccountDataAnswer, RemoteError> {
        match content.get("max_stream_id").and_then(Value::as_i64) {
            Some(token) => Ok(AccountDataAnswer {
                max_stream_id: Token(token),
            }),
            None => Err(RemoteError {
                status,
                errcode: "M_BAD_JSON".to_owned(),
                message: "the answer has no integer max_stream_id".to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::ReplicationApi;
    use crate::wire::InstanceName;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    fn all() -> Vec<AccountDataRequest> {
        let (user, room) = ("@alice:example.com".to_owned(), "!r:example.com".to_owned());
        vec![
            AccountDataRequest::AddUserAccountData {
                user_id: user.clone(),
                account_data_type: "m.direct".into(),
                content: object(serde_json::json!({"@bob:x": ["!d:x"]})),
            },
            AccountDataRequest::RemoveUserAccountData {
                user_id: user.clone(),
                account_data_type: "m.direct".into(),
            },
            AccountDataRequest::AddRoomAccountData {
                user_id: user.clone(),
                room_id: room.clone(),
                account_data_type: "org.x".into(),
                content: object(serde_json::json!({"a": 1})),
            },
            AccountDataRequest::RemoveRoomAccountData {
                user_id: user.clone(),
                room_id: room.clone(),
                account_data_type: "org.x".into(),
            },
            AccountDataRequest::AddTag {
                user_id: user.clone(),
                room_id: room.clone(),
                tag: "u.work/ü".into(),
                content: object(serde_json::json!({"order": 0.25})),
            },
            AccountDataRequest::RemoveTag {
                user_id: user,
                room_id: room,
                tag: "u.work/ü".into(),
            },
        ]
    }

    fn api() -> ReplicationApi {
        AccountDataRequest::endpoints().into_iter().fold(
            ReplicationApi::new(InstanceName::from("rust_ad"), None),
            |api, e| api.with_endpoint(e),
        )
    }

    fn read(
        api: &ReplicationApi,
        path: &str,
        body: &str,
    ) -> Result<AccountDataRequest, ReplicationError> {
        let route = api.route("POST", path, [])?;
        let call = api.read(route, None, body.as_bytes())?;
        AccountDataRequest::from_call(&call, "example.com")
    }

    #[test]
    fn each_request_reads_back_as_it_was_sent() {
        let api = api();
        for request in all() {
            let endpoint = request.endpoint();
            assert_eq!(endpoint.method(), Method::Post);
            assert!(!endpoint.caches() && endpoint.waits_for_streams());
            assert_eq!(endpoint.path_args().count(), request.args().len());
            let path = endpoint.path(&request.args(), None);
            let body = Value::Object(request.content()).to_string();
            assert_eq!(read(&api, &path, &body), Ok(request.clone()), "{path}");
            assert_eq!(request.user_id(), "@alice:example.com");
            assert_eq!(request.room_id().is_some(), request.args().len() == 3);
        }
        // A path with a txn id segment is not one of these.
        assert_eq!(
            read(
                &api,
                "/_synapse/replication/add_tag/%40a%3Aexample.com/%21r%3Ax/t/txn",
                "{}"
            ),
            Err(ReplicationError::NotFound)
        );
    }

    #[test]
    fn bad_users_rooms_and_contents_are_refused() {
        let api = api();
        let refusal = |path: &str, body: &str| {
            let error = read(&api, path, body).expect_err(path);
            (error.status(), error.errcode().to_owned())
        };
        let base = "/_synapse/replication/";
        assert_eq!(
            refusal(
                &format!("{base}add_user_account_data/alice/m.direct"),
                r#"{"content":{}}"#
            ),
            (400, "M_INVALID_PARAM".into())
        );
        assert_eq!(
            refusal(
                &format!("{base}add_user_account_data/%40alice/m.direct"),
                r#"{"content":{}}"#
            ),
            (400, "M_INVALID_PARAM".into())
        );
        assert_eq!(
            refusal(
                &format!("{base}remove_tag/%40alice%3Aelsewhere.org/%21r%3Ax/t"),
                "{}"
            ),
            (403, "M_FORBIDDEN".into())
        );
        assert_eq!(
            refusal(
                &format!("{base}add_tag/%40alice%3Aexample.com/room/t"),
                r#"{"content":{}}"#
            ),
            (400, "M_INVALID_PARAM".into())
        );
        for body in ["{}", r#"{"content":[1]}"#, r#"{"content":"x"}"#] {
            assert_eq!(
                refusal(
                    &format!("{base}add_tag/%40alice%3Aexample.com/%21r/t"),
                    body
                ),
                (400, "M_BAD_JSON".into()),
                "{body}"
            );
        }
        // A removal's body is not read (Synapse's is not).
        assert!(
            read(
                &api,
                &format!("{base}remove_tag/%40alice%3Aexample.com/%21r/t"),
                r#"{"content":7}"#
            )
            .is_ok()
        );
    }

    #[test]
    fn answers_need_an_integer_max_stream_id() {
        assert!(AccountDataAnswer::from_content(200, &object(serde_json::json!({}))).is_err());
        assert!(
            AccountDataAnswer::from_content(
                200,
                &object(serde_json::json!({"max_stream_id": null}))
            )
            .is_err()
        );
        assert_eq!(
            AccountDataAnswer::from_content(200, &object(serde_json::json!({"max_stream_id": 3}))),
            Ok(AccountDataAnswer {
                max_stream_id: Token(3)
            })
        );
    }
}
