//! A process's replication endpoints, and the checks of a call in
//! Synapse's order.

use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::wire::InstanceName;
use crate::writers::WriterRegistry;

use super::STREAM_POSITIONS_KEY;
use super::body::StreamPositions;
use super::endpoint::{Method, PREFIX, ReplicationEndpoint};
use super::error::{ReplicationError, cut};
use super::serve::EndpointError;
use super::serve::{check_secret, unquote};

/// The endpoints one process serves, its secret and what it knows of the
/// deployment's writers: reads calls as Synapse's `ReplicationEndpoint`
/// does (`_check_auth_and_handle`), in two steps so that a call is refused
/// before its body is read when its headers do not do:
///
/// 1. [`route`](ReplicationApi::route), from the method, the path and the
///    `Authorization` headers: 404 for a path no endpoint has, 405 for
///    another method, 401 without the secret (Synapse: 500; see
///    [`CatchUpEndpoint`](crate::http::CatchUpEndpoint)), compared in
///    constant time.
/// 2. [`read`](ReplicationApi::read), from the body: a JSON object (400
///    otherwise; a `GET`'s body is not read, as Synapse's), and its
///    `_INT_STREAM_POS` when the endpoint waits for streams. Beyond
///    Synapse, positions are checked: at most
///    [`MAX_POSITIONS`](super::MAX_POSITIONS) streams, each a stream
///    this crate knows or the registry lets the caller write (400
///    `M_UNKNOWN` otherwise: Synapse answers 500), and, given a registry
///    ([`with_writers`](ReplicationApi::with_writers)), one the caller may
///    write (400 `M_FORBIDDEN`: Synapse would wait five seconds for it).
///
/// Then the transport waits for the positions
/// ([`WAIT_FOR_POSITIONS`](super::WAIT_FOR_POSITIONS) at most, and goes on
/// as Synapse does), looks the txn id up in a
/// [`ResponseCache`](super::ResponseCache), has the call handled, and
/// answers with [`answer_body`](super::answer_body).
pub struct ReplicationApi {
    instance: InstanceName,
    secret: Option<Box<[u8]>>,
    endpoints: Vec<ReplicationEndpoint>,
    writers: Option<Arc<dyn WriterRegistry>>,
}

impl fmt::Debug for ReplicationApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicationApi")
            .field("instance", &self.instance)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field(
                "endpoints",
                &self
                    .endpoints
                    .iter()
                    .map(ReplicationEndpoint::name)
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// A call whose headers passed [`ReplicationApi::route`]: which endpoint,
/// its path arguments and txn id. Give it to [`ReplicationApi::read`] with
/// the body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    endpoint: usize,
    args: Vec<(String, String)>,
    txn_id: Option<String>,
}

impl Route {
    /// Its path arguments, percent-decoded, with their names.
    pub fn args(&self) -> impl Iterator<Item = (&str, &str)> {
        self.args
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
    }

    /// The call's txn id, when the endpoint caches.
    pub fn txn_id(&self) -> Option<&str> {
        self.txn_id.as_deref()
    }
}

/// A call, read: what the application's handler of its endpoint gets.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ReplicationRequest {
    /// The endpoint's `NAME`.
    pub endpoint: String,
    /// Its path arguments, percent-decoded, with their names, in order.
    pub args: Vec<(String, String)>,
    /// The txn id, when the endpoint caches.
    pub txn_id: Option<String>,
    /// The query (after the `?`), as received: a `GET`'s arguments.
    pub query: Option<String>,
    /// The body's JSON object, without `_INT_STREAM_POS` (empty for a
    /// `GET`).
    pub content: Map<String, Value>,
    /// The caller's positions, to wait for before handling the call.
    pub caller: Option<StreamPositions>,
}

impl ReplicationRequest {
    /// The path argument `name`.
    pub fn arg(&self, name: &str) -> Option<&str> {
        self.args
            .iter()
            .find(|(arg, _)| arg == name)
            .map(|(_, value)| value.as_str())
    }
}

impl ReplicationApi {
    /// The endpoints of the process `instance`, checking Synapse's
    /// `worker_replication_secret` when `secret` is set. It serves none
    /// until [`with_endpoint`](ReplicationApi::with_endpoint) adds them.
    pub fn new(instance: InstanceName, secret: Option<String>) -> ReplicationApi {
        ReplicationApi {
            instance,
            secret: secret.map(|secret| secret.into_bytes().into_boxed_slice()),
            endpoints: Vec::new(),
            writers: None,
        }
    }

    /// The same, with the secret as bytes (the catch-up endpoint's).
    pub(crate) fn with_secret(instance: InstanceName, secret: Option<Box<[u8]>>) -> ReplicationApi {
        ReplicationApi {
            instance,
            secret,
            endpoints: Vec::new(),
            writers: None,
        }
    }

    /// Serves `endpoint` too.
    #[must_use]
    pub fn with_endpoint(mut self, endpoint: ReplicationEndpoint) -> ReplicationApi {
        self.endpoints.push(endpoint);
        self
    }

    /// Refuses positions of a stream the caller may not write, as
    /// `registry` (the deployment's `stream_writers`) says.
    #[must_use]
    pub fn with_writers(mut self, registry: Arc<dyn WriterRegistry>) -> ReplicationApi {
        self.writers = Some(registry);
        self
    }

    /// The process whose endpoints these are.
    pub fn instance(&self) -> &InstanceName {
        &self.instance
    }

    /// The endpoints served.
    pub fn endpoints(&self) -> &[ReplicationEndpoint] {
        &self.endpoints
    }

    /// The endpoint of a route.
    pub fn endpoint(&self, route: &Route) -> &ReplicationEndpoint {
        &self.endpoints[route.endpoint]
    }

    /// Whether `path` (as received, without the query) is under
    /// `/_synapse/replication/` and names one of these endpoints.
    pub fn serves(&self, path: &str) -> bool {
        path.strip_prefix(PREFIX)
            .and_then(|rest| rest.split('/').next())
            .is_some_and(|name| self.endpoints.iter().any(|e| e.name() == name))
    }

    /// Checks a call's headers: its `method`, its `path` as received
    /// (percent-encoded, without the query) and the values of every
    /// `Authorization` header it carried.
    pub fn route<'a>(
        &self,
        method: &str,
        path: &str,
        authorization: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<Route, ReplicationError> {
        let rest = path
            .strip_prefix(PREFIX)
            .ok_or(ReplicationError::NotFound)?;
        let (name, segments) = rest.split_once('/').ok_or(ReplicationError::NotFound)?;
        let segments: Vec<&str> = if segments.is_empty() {
            Vec::new()
        } else {
            segments.split('/').collect()
        };
        if segments.iter().any(|segment| segment.is_empty()) {
            return Err(ReplicationError::NotFound);
        }
        let mut matching = self
            .endpoints
            .iter()
            .enumerate()
            .filter(|(_, e)| e.name() == name && e.segments() == segments.len())
            .peekable();
        if matching.peek().is_none() {
            return Err(ReplicationError::NotFound);
        }
        let (index, endpoint) = matching
            .find(|(_, e)| e.method().accepts(method))
            .ok_or(ReplicationError::MethodNotAllowed)?;
        if let Some(secret) = &self.secret {
            check_secret(secret, authorization).map_err(|error| match error {
                EndpointError::MissingAuthorization => ReplicationError::MissingAuthorization,
                EndpointError::TooManyAuthorizations => ReplicationError::TooManyAuthorizations,
                _ => ReplicationError::InvalidAuthorization,
            })?;
        }
        let decode = |segment: &str| {
            String::from_utf8_lossy(&unquote(segment.as_bytes(), false)).into_owned()
        };
        let args = endpoint
            .arg_names()
            .iter()
            .zip(&segments)
            .map(|(name, segment)| (name.clone(), decode(segment)))
            .collect();
        let txn_id = endpoint
            .caches()
            .then(|| segments.last().map(|segment| decode(segment)))
            .flatten();
        Ok(Route {
            endpoint: index,
            args,
            txn_id,
        })
    }

    /// Reads a routed call's body (and `query`, kept for the handler).
    pub fn read(
        &self,
        route: Route,
        query: Option<&str>,
        body: &[u8],
    ) -> Result<ReplicationRequest, ReplicationError> {
        let endpoint = &self.endpoints[route.endpoint];
        let mut content = if endpoint.method() == Method::Get {
            Map::new()
        } else {
            match serde_json::from_slice(body) {
                Ok(Value::Object(content)) => content,
                Ok(_) => return Err(ReplicationError::NotObject),
                Err(_) => return Err(ReplicationError::NotJson),
            }
        };
        let caller = match content.remove(STREAM_POSITIONS_KEY) {
            Some(positions) if endpoint.waits_for_streams() => {
                let positions = StreamPositions::from_json(&positions)?;
                self.check_writers(&positions)?;
                Some(positions)
            }
            _ => None,
        };
        Ok(ReplicationRequest {
            endpoint: endpoint.name().to_owned(),
            args: route.args,
            txn_id: route.txn_id,
            query: query.map(str::to_owned),
            content,
            caller,
        })
    }

    fn check_writers(&self, positions: &StreamPositions) -> Result<(), ReplicationError> {
        for (stream, _) in &positions.streams {
            let allowed = self
                .writers
                .as_ref()
                .map(|writers| writers.may_write(stream, &positions.instance));
            if !stream.is_known() && allowed != Some(true) {
                return Err(ReplicationError::UnknownStream(cut(stream.as_str())));
            }
            if allowed == Some(false) {
                return Err(ReplicationError::NotAWriter {
                    stream: cut(stream.as_str()),
                    instance: cut(positions.instance.as_str()),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StreamWriters;
    use crate::wire::{StreamName, Token};

    fn api() -> ReplicationApi {
        ReplicationApi::new(InstanceName::from("typing1"), Some("hunter2-secret".into()))
            .with_endpoint(ReplicationEndpoint::fed_send_edu())
            .with_endpoint(ReplicationEndpoint::presence_set_state())
    }

    const AUTH: [&[u8]; 1] = [b"Bearer hunter2-secret"];

    #[test]
    fn routes_in_synapse_order() {
        let api = api();
        let edu = "/_synapse/replication/fed_send_edu/m.typing/t1";
        assert_eq!(
            api.route("POST", "/_synapse/replication/nope/x/y", AUTH),
            Err(ReplicationError::NotFound)
        );
        assert_eq!(
            api.route("POST", "/_synapse/replication/fed_send_edu/m.typing", AUTH),
            Err(ReplicationError::NotFound)
        );
        assert_eq!(
            api.route(
                "POST",
                "/_synapse/replication/fed_send_edu/m.typing/t/x",
                AUTH
            ),
            Err(ReplicationError::NotFound)
        );
        assert_eq!(
            api.route("POST", "/_synapse/replication/fed_send_edu//t", AUTH),
            Err(ReplicationError::NotFound)
        );
        // The path before the method, the method before the secret.
        assert_eq!(
            api.route("GET", edu, []),
            Err(ReplicationError::MethodNotAllowed)
        );
        assert_eq!(
            api.route("POST", edu, []),
            Err(ReplicationError::MissingAuthorization)
        );
        assert_eq!(
            api.route("POST", edu, [AUTH[0], AUTH[0]]),
            Err(ReplicationError::TooManyAuthorizations)
        );
        assert_eq!(
            api.route("POST", edu, [&b"Bearer t"[..]]),
            Err(ReplicationError::InvalidAuthorization)
        );
        let route = api.route("POST", edu, AUTH).expect("routed");
        assert_eq!(route.txn_id(), Some("t1"));
        assert_eq!(route.args().collect::<Vec<_>>(), [("edu_type", "m.typing")]);
        // No cache: no txn id segment.
        let route = api
            .route(
                "POST",
                "/_synapse/replication/presence_set_state/%40a%3Ax",
                AUTH,
            )
            .expect("routed");
        assert_eq!(route.txn_id(), None);
        assert_eq!(route.args().collect::<Vec<_>>(), [("user_id", "@a:x")]);
    }

    #[test]
    fn bodies_are_objects_with_positions_checked() {
        let writers = StreamWriters::from_value(serde_json::json!({
            "stream_writers": {"events": ["persister1"]},
            "instance_map": {"persister1": {"host": "127.0.0.1", "port": 1}},
        }))
        .expect("writers")
        .with_redis(true);
        let api = api().with_writers(Arc::new(writers));
        let edu = "/_synapse/replication/fed_send_edu/m.typing/t1";
        let read = |body: &str| {
            let route = api.route("POST", edu, AUTH).expect("routed");
            api.read(route, None, body.as_bytes())
        };
        assert_eq!(read("nope").unwrap_err(), ReplicationError::NotJson);
        assert_eq!(read("[]").unwrap_err(), ReplicationError::NotObject);
        assert_eq!(
            read(r#"{"_INT_STREAM_POS":{"streams":{"frobs":1},"instance_name":"persister1"}}"#)
                .unwrap_err(),
            ReplicationError::UnknownStream("frobs".into())
        );
        assert_eq!(
            read(r#"{"_INT_STREAM_POS":{"streams":{"events":1},"instance_name":"master"}}"#)
                .unwrap_err(),
            ReplicationError::NotAWriter {
                stream: "events".into(),
                instance: "master".into()
            }
        );
        let request = read(
            r#"{"origin":"o","_INT_STREAM_POS":{"streams":{"events":9,"caches":2},"instance_name":"persister1"}}"#,
        )
        .expect("read");
        assert_eq!(request.content.len(), 1);
        let caller = request.caller.expect("positions");
        assert_eq!(
            caller.streams,
            [
                (StreamName::Events, Token(9)),
                (StreamName::Caches, Token(2))
            ]
        );
        let request = read(r#"{"origin":"o"}"#).expect("read");
        assert_eq!(request.caller, None);
    }

    #[test]
    fn debug_hides_the_secret() {
        let shown = format!("{:?}", api());
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }
}
