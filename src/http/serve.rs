//! The writer's half of catch-up: Synapse's `get_repl_stream_updates`
//! endpoint, sans-IO. A request's method, path, query and `Authorization`
//! headers in; a [`CatchUpRequest`] to answer, or the error answer Synapse
//! would give, out; a page in, the JSON body Synapse's client reads out.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::wire::{InstanceName, StreamName, Token};

use crate::positions::{CatchUpId, CatchUpPage, CatchUpRequest};

/// The path every request starts with.
const PREFIX: &str = "/_synapse/replication/get_repl_stream_updates/";

/// The `Content-Type` of every answer, errors included.
pub const CONTENT_TYPE: &str = "application/json";

/// Synapse's catch-up endpoint as a writer serves it:
/// `GET /_synapse/replication/get_repl_stream_updates/<stream>/<txn_id>?from_token=A&upto_token=B`
/// (`ReplicationGetStreamUpdates` in Synapse 1.163.2's
/// `replication/http/streams.py`), for one instance.
///
/// [`CatchUpEndpoint::route`] reads a request as Synapse's HTTP layer
/// does, and checks it in Synapse's order: the path (else 404), the method
/// (`GET`, or `HEAD` as Synapse treats it; else 405), the secret, the
/// stream (else 400 `Unknown stream`), then `from_token` and `upto_token`
/// (each a non-negative integer as Python's `int()` reads one; else 400).
/// Path segments are percent-decoded as Synapse's router decodes them,
/// query parameters as `parse_qs` does (`+` is a space; the first of
/// repeated parameters counts). The `<txn_id>` segment is required but not
/// remembered: Synapse caches answers per transaction id for 30 minutes,
/// this endpoint answers every request afresh (catch-up reads are
/// idempotent, and Synapse's client uses a fresh id per request).
///
/// The one deliberate difference: a missing, repeated or wrong
/// `Authorization: Bearer <secret>` is refused with **401**
/// `M_MISSING_TOKEN` / `M_UNKNOWN_TOKEN` and Synapse's own message, where
/// Synapse answers 500 (`_check_auth` raises a `RuntimeError`). Synapse's
/// client treats both as a failed request; a 401 says what went wrong. The
/// secret is compared in constant time.
///
/// ```
/// use synapse_replication::positions::CatchUpPage;
/// use synapse_replication::http::{CatchUpEndpoint, Routed};
/// use synapse_replication::wire::{InstanceName, RawRow, Token};
///
/// let endpoint = CatchUpEndpoint::new(InstanceName::from("typing1"), Some("s3cret".into()));
/// let routed = endpoint.route(
///     "GET",
///     "/_synapse/replication/get_repl_stream_updates/typing/AbCdEfGhIj",
///     Some("from_token=3&upto_token=5"),
///     [&b"Bearer s3cret"[..]],
/// )?;
/// let Routed::Fetch(request) = routed else { unreachable!() };
/// assert_eq!((request.from, request.to), (Token(3), Token(5)));
/// assert_eq!(request.writer.as_str(), "typing1");
///
/// let page = CatchUpPage {
///     updates: vec![(Token(4), RawRow::new(&br#"["!r:x",["@a:x"]]"#[..])?)],
///     upto: Token(5),
///     limited: false,
/// };
/// assert_eq!(
///     synapse_replication::http::page_body(&page),
///     r#"{"updates":[[4,["!r:x",["@a:x"]]]],"upto_token":5,"limited":false}"#,
/// );
///
/// let error = endpoint
///     .route("GET", "/_synapse/replication/get_repl_stream_updates/typing/x", None, [&b"Bearer nope"[..]])
///     .unwrap_err();
/// assert_eq!(error.status(), 401);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CatchUpEndpoint {
    instance: InstanceName,
    secret: Option<Box<[u8]>>,
    streams: Option<Vec<StreamName>>,
    next_id: AtomicU64,
}

impl fmt::Debug for CatchUpEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CatchUpEndpoint")
            .field("instance", &self.instance)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("streams", &self.streams)
            .finish_non_exhaustive()
    }
}

/// What to do with a request that passed every check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Routed {
    /// Fetch this page from the writer's history and answer it with
    /// [`page_body`] (status 200), or answer [`internal_error_body`] (500)
    /// if that fails.
    Fetch(CatchUpRequest),
    /// Nothing to fetch (`from_token == upto_token`): answer this empty
    /// page at once, as Synapse's `Stream.get_updates_since` does.
    Answer(CatchUpPage),
}

impl CatchUpEndpoint {
    /// The endpoint of the writer `instance` (requests become
    /// [`CatchUpRequest`]s for its rows), checking Synapse's
    /// `worker_replication_secret` when `secret` is set. It answers for
    /// every stream Synapse knows, as Synapse does, until
    /// [`with_streams`](CatchUpEndpoint::with_streams) says otherwise.
    pub fn new(instance: InstanceName, secret: Option<String>) -> CatchUpEndpoint {
        CatchUpEndpoint {
            instance,
            secret: secret.map(|secret| secret.into_bytes().into_boxed_slice()),
            streams: None,
            next_id: AtomicU64::new(1),
        }
    }

    /// Answers only for these streams (the ones this process writes); a
    /// request for another is a 400 `Unknown stream`, as Synapse answers a
    /// name it does not know. Names Synapse does not know may be listed
    /// (an application's own streams).
    #[must_use]
    pub fn with_streams(
        mut self,
        streams: impl IntoIterator<Item = StreamName>,
    ) -> CatchUpEndpoint {
        self.streams = Some(streams.into_iter().collect());
        self
    }

    /// The instance whose rows are served.
    pub fn instance(&self) -> &InstanceName {
        &self.instance
    }

    /// The replication HTTP API of the same instance, with the same
    /// secret, serving no endpoint yet.
    pub fn replication_api(&self) -> super::ReplicationApi {
        super::ReplicationApi::with_secret(self.instance.clone(), self.secret.clone())
    }

    /// Reads one request: its `method`, its `path` as received (still
    /// percent-encoded, without the query), its `query` (after the `?`,
    /// if any), and the values of every `Authorization` header it carried.
    /// The `Host` header plays no part (Synapse's workers send
    /// `Host: <instance_name>:80`).
    pub fn route<'a>(
        &self,
        method: &str,
        path: &str,
        query: Option<&str>,
        authorization: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<Routed, EndpointError> {
        let segments = path.strip_prefix(PREFIX).ok_or(EndpointError::NotFound)?;
        let (stream, txn_id) = segments.split_once('/').ok_or(EndpointError::NotFound)?;
        if stream.is_empty() || txn_id.is_empty() || txn_id.contains('/') {
            return Err(EndpointError::NotFound);
        }
        if !matches!(method, "GET" | "HEAD") {
            return Err(EndpointError::MethodNotAllowed);
        }
        if let Some(secret) = &self.secret {
            check_secret(secret, authorization)?;
        }
        let name = String::from_utf8_lossy(&unquote(stream.as_bytes(), false)).into_owned();
        let stream = StreamName::from(name.as_str());
        let known = match &self.streams {
            Some(streams) => streams.contains(&stream),
            None => stream.is_known(),
        };
        if !known {
            return Err(EndpointError::UnknownStream { name });
        }
        let query = query.unwrap_or("");
        let from = parse_integer(query, "from_token")?;
        let to = parse_integer(query, "upto_token")?;
        if from == to {
            return Ok(Routed::Answer(CatchUpPage {
                updates: Vec::new(),
                upto: to,
                limited: false,
            }));
        }
        Ok(Routed::Fetch(CatchUpRequest {
            id: CatchUpId(self.next_id.fetch_add(1, Ordering::Relaxed)),
            stream,
            writer: self.instance.clone(),
            from,
            to,
        }))
    }
}

/// The body of a 200 answer: `{"updates":[[token,row],...],"upto_token":N,"limited":bool}`,
/// compact, as Synapse's `json_encoder` writes it; rows are written as
/// they are (a [`RawRow`](crate::wire::RawRow) is already JSON on one
/// line).
pub fn page_body(page: &CatchUpPage) -> String {
    let rows: usize = page
        .updates
        .iter()
        .map(|(_, row)| row.as_bytes().len() + 24)
        .sum();
    let mut body = String::with_capacity(64 + rows);
    body.push_str(r#"{"updates":["#);
    for (index, (token, row)) in page.updates.iter().enumerate() {
        if index > 0 {
            body.push(',');
        }
        body.push('[');
        body.push_str(&token.0.to_string());
        body.push(',');
        body.push_str(row.as_str());
        body.push(']');
    }
    body.push_str(r#"],"upto_token":"#);
    body.push_str(&page.upto.0.to_string());
    body.push_str(r#","limited":"#);
    body.push_str(if page.limited { "true" } else { "false" });
    body.push('}');
    body
}

/// The body of a 500 answer, Synapse's for any failure that is not a
/// `SynapseError` (the history could not answer).
pub fn internal_error_body() -> String {
    error_body("Internal server error", "M_UNKNOWN")
}

/// `{"error":"...","errcode":"..."}`, in Synapse's key order.
pub(super) fn error_body(message: &str, errcode: &str) -> String {
    let json = |text: &str| serde_json::to_string(text).unwrap_or_else(|_| String::from("\"\""));
    format!(
        r#"{{"error":{},"errcode":{}}}"#,
        json(message),
        json(errcode)
    )
}

/// A request the endpoint refuses, with the answer Synapse gives (but see
/// [`CatchUpEndpoint`] for the secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// Not the endpoint's path (or a segment is missing): 404
    /// `M_UNRECOGNIZED`.
    #[error("unrecognized request")]
    NotFound,
    /// The endpoint's path with a method other than `GET` or `HEAD`: 405
    /// `M_UNRECOGNIZED`.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// No `Authorization` header (401 `M_MISSING_TOKEN`; Synapse: 500).
    #[error("missing Authorization header")]
    MissingAuthorization,
    /// More than one `Authorization` header (401 `M_UNKNOWN_TOKEN`;
    /// Synapse: 500).
    #[error("too many Authorization headers")]
    TooManyAuthorizations,
    /// Not `Bearer <the secret>` (401 `M_UNKNOWN_TOKEN`; Synapse: 500).
    #[error("invalid Authorization header")]
    InvalidAuthorization,
    /// A stream this endpoint does not serve: 400 `M_UNKNOWN`
    /// `Unknown stream`.
    #[error("unknown stream {name:?}")]
    UnknownStream {
        /// The name asked for, percent-decoded.
        name: String,
    },
    /// `from_token` or `upto_token` is missing: 400 `M_MISSING_PARAM`.
    #[error("missing required integer query parameter {0}")]
    MissingParam(&'static str),
    /// `from_token` or `upto_token` is not an integer (or does not fit 64
    /// bits): 400 `M_INVALID_PARAM`.
    #[error("query parameter {0} must be an integer")]
    InvalidParam(&'static str),
    /// `from_token` or `upto_token` is negative: 400 `M_INVALID_PARAM`.
    #[error("query parameter {0} must be a positive integer")]
    NegativeParam(&'static str),
}

impl EndpointError {
    /// The HTTP status to answer.
    pub fn status(&self) -> u16 {
        match self {
            EndpointError::NotFound => 404,
            EndpointError::MethodNotAllowed => 405,
            EndpointError::MissingAuthorization
            | EndpointError::TooManyAuthorizations
            | EndpointError::InvalidAuthorization => 401,
            EndpointError::UnknownStream { .. }
            | EndpointError::MissingParam(_)
            | EndpointError::InvalidParam(_)
            | EndpointError::NegativeParam(_) => 400,
        }
    }

    /// The Matrix error code of the answer.
    pub fn errcode(&self) -> &'static str {
        match self {
            EndpointError::NotFound | EndpointError::MethodNotAllowed => "M_UNRECOGNIZED",
            EndpointError::MissingAuthorization => "M_MISSING_TOKEN",
            EndpointError::TooManyAuthorizations | EndpointError::InvalidAuthorization => {
                "M_UNKNOWN_TOKEN"
            }
            EndpointError::UnknownStream { .. } => "M_UNKNOWN",
            EndpointError::MissingParam(_) => "M_MISSING_PARAM",
            EndpointError::InvalidParam(_) | EndpointError::NegativeParam(_) => "M_INVALID_PARAM",
        }
    }

    /// The JSON body of the answer, Synapse's words:
    /// `{"error":"Unknown stream","errcode":"M_UNKNOWN"}`.
    pub fn body(&self) -> String {
        let message = match self {
            EndpointError::NotFound | EndpointError::MethodNotAllowed => {
                String::from("Unrecognized request")
            }
            EndpointError::MissingAuthorization => String::from("Missing Authorization header."),
            EndpointError::TooManyAuthorizations => String::from("Too many Authorization headers."),
            EndpointError::InvalidAuthorization => String::from("Invalid Authorization header."),
            EndpointError::UnknownStream { .. } => String::from("Unknown stream"),
            EndpointError::MissingParam(name) => {
                format!("Missing required integer query parameter {name}")
            }
            EndpointError::InvalidParam(name) => {
                format!("Query parameter {name} must be an integer")
            }
            EndpointError::NegativeParam(name) => {
                format!("Query parameter {name} must be a positive integer.")
            }
        };
        error_body(&message, self.errcode())
    }
}

/// Synapse's `_check_auth`: exactly one header, `Bearer` and the secret
/// separated by one space, compared in constant time.
pub(super) fn check_secret<'a>(
    secret: &[u8],
    headers: impl IntoIterator<Item = &'a [u8]>,
) -> Result<(), EndpointError> {
    let mut headers = headers.into_iter();
    let header = headers.next().ok_or(EndpointError::MissingAuthorization)?;
    if headers.next().is_some() {
        return Err(EndpointError::TooManyAuthorizations);
    }
    let given = header
        .strip_prefix(b"Bearer ")
        .filter(|given| !given.contains(&b' '))
        .ok_or(EndpointError::InvalidAuthorization)?;
    if constant_time_eq(given, secret) {
        Ok(())
    } else {
        Err(EndpointError::InvalidAuthorization)
    }
}

/// Whether `a == b`, in a time that depends on their lengths only.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for index in 0..a.len().max(b.len()) {
        let x = a.get(index).copied().unwrap_or(0);
        let y = b.get(index).copied().unwrap_or(0);
        diff |= std::hint::black_box(x ^ y);
    }
    diff == 0
}

/// `urllib.parse.unquote`, on bytes: `%XX` is a byte, anything else (a
/// `%` without two hex digits included) stays; `plus` turns `+` into a
/// space as `parse_qs` does.
pub(super) fn unquote(text: &[u8], plus: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut index = 0;
    while let Some(&byte) = text.get(index) {
        let hex = |offset: usize| {
            text.get(index + offset)
                .and_then(|b| char::from(*b).to_digit(16))
        };
        match (byte, hex(1), hex(2)) {
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                index += 3;
            }
            (b'+', _, _) if plus => {
                out.push(b' ');
                index += 1;
            }
            _ => {
                out.push(byte);
                index += 1;
            }
        }
    }
    out
}

/// Synapse's `parse_integer(request, name, required=True)`: the first
/// value of `name` in `query`, read as Python's `int()` reads bytes, and
/// not negative.
fn parse_integer(query: &str, name: &'static str) -> Result<Token, EndpointError> {
    let value = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .find(|(key, _)| unquote(key.as_bytes(), true) == name.as_bytes())
        .map(|(_, value)| unquote(value.as_bytes(), true))
        .ok_or(EndpointError::MissingParam(name))?;
    let value = python_int(&value).ok_or(EndpointError::InvalidParam(name))?;
    if value < 0 {
        return Err(EndpointError::NegativeParam(name));
    }
    Ok(Token(value))
}

/// Python's `int(bytes)`: surrounding ASCII whitespace, a sign, decimal
/// digits with single underscores between them. `None` when Python would
/// refuse it, or when it does not fit 64 bits.
fn python_int(text: &[u8]) -> Option<i64> {
    let text = text.trim_ascii();
    let (negative, digits) = match text.split_first()? {
        (b'-', rest) => (true, rest),
        (b'+', rest) => (false, rest),
        _ => (false, text),
    };
    if digits.first() == Some(&b'_') || digits.last() == Some(&b'_') || digits.is_empty() {
        return None;
    }
    let mut value: i64 = 0;
    let mut previous_underscore = false;
    for &byte in digits {
        if byte == b'_' {
            if previous_underscore {
                return None;
            }
            previous_underscore = true;
            continue;
        }
        previous_underscore = false;
        let digit = i64::from(char::from(byte).to_digit(10)?);
        value = value.checked_mul(10)?;
        value = if negative {
            value.checked_sub(digit)?
        } else {
            value.checked_add(digit)?
        };
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::wire::RawRow;

    const PATH: &str = "/_synapse/replication/get_repl_stream_updates/typing/AbCdEfGhIj";

    fn endpoint() -> CatchUpEndpoint {
        CatchUpEndpoint::new(InstanceName::from("typing1"), Some("secret".into()))
    }

    fn route(endpoint: &CatchUpEndpoint, path: &str, query: &str) -> Result<Routed, EndpointError> {
        endpoint.route("GET", path, Some(query), [&b"Bearer secret"[..]])
    }

    fn fetch(routed: Result<Routed, EndpointError>) -> CatchUpRequest {
        match routed {
            Ok(Routed::Fetch(request)) => request,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_request_as_synapse_s_client_sends_it() {
        let endpoint = endpoint();
        let request = fetch(route(&endpoint, PATH, "from_token=0&upto_token=12"));
        assert_eq!(request.stream, StreamName::Typing);
        assert_eq!(request.writer, InstanceName::from("typing1"));
        assert_eq!((request.from, request.to), (Token(0), Token(12)));
        // Our own client's requests round-trip.
        let ours = CatchUpRequest {
            id: CatchUpId(9),
            ..request.clone()
        };
        let path = ours.path("some-txn");
        let (path, query) = path.split_once('?').unwrap();
        let again = fetch(route(&endpoint, path, query));
        assert_eq!(
            (again.stream, again.from, again.to),
            (ours.stream, ours.from, ours.to)
        );
        assert_ne!(again.id, request.id);
        // `from` above `upto` (a writer that restarted) is passed on.
        let reset = fetch(route(&endpoint, PATH, "from_token=30&upto_token=2"));
        assert_eq!((reset.from, reset.to), (Token(30), Token(2)));
    }

    #[test]
    fn from_equal_to_upto_answers_at_once() {
        assert_eq!(
            route(&endpoint(), PATH, "from_token=7&upto_token=7"),
            Ok(Routed::Answer(CatchUpPage {
                updates: Vec::new(),
                upto: Token(7),
                limited: false
            }))
        );
    }

    #[test]
    fn paths_and_methods_are_synapse_s() {
        let endpoint = endpoint();
        for path in [
            "/_synapse/replication/get_repl_stream_updates/typing",
            "/_synapse/replication/get_repl_stream_updates/typing/",
            "/_synapse/replication/get_repl_stream_updates//x",
            "/_synapse/replication/get_repl_stream_updates/typing/x/y",
            "/_synapse/replication/get_repl_stream_updates/typing/x/",
            "/_synapse/replication/send_event/x/y",
            "/",
            "",
        ] {
            let error = route(&endpoint, path, "from_token=1&upto_token=2").unwrap_err();
            assert_eq!(
                (error.status(), error.errcode()),
                (404, "M_UNRECOGNIZED"),
                "{path}"
            );
        }
        let error = endpoint.route("POST", PATH, None, []).unwrap_err();
        assert_eq!(error.status(), 405);
        assert_eq!(
            error.body(),
            r#"{"error":"Unrecognized request","errcode":"M_UNRECOGNIZED"}"#
        );
        assert!(
            endpoint
                .route(
                    "HEAD",
                    PATH,
                    Some("from_token=1&upto_token=2"),
                    [&b"Bearer secret"[..]]
                )
                .is_ok()
        );
    }

    #[test]
    fn the_secret_is_checked_as_synapse_checks_it() {
        let endpoint = endpoint();
        let query = Some("from_token=1&upto_token=2");
        let with = |headers: &[&[u8]]| endpoint.route("GET", PATH, query, headers.iter().copied());
        assert_eq!(with(&[]), Err(EndpointError::MissingAuthorization));
        assert_eq!(
            with(&[b"Bearer secret", b"Bearer secret"]),
            Err(EndpointError::TooManyAuthorizations)
        );
        for bad in [
            &b"Bearer secreT"[..],
            b"Bearer secre",
            b"Bearer secrets",
            b"bearer secret",
            b"Bearer  secret",
            b"Bearer secret ",
            b"Basic secret",
            b"Bearer",
            b"",
            b"Bearer \xff",
        ] {
            assert_eq!(
                with(&[bad]),
                Err(EndpointError::InvalidAuthorization),
                "{bad:?}"
            );
        }
        assert!(with(&[b"Bearer secret"]).is_ok());
        let error = with(&[b"Bearer nope"]).unwrap_err();
        assert_eq!(error.status(), 401);
        assert_eq!(
            error.body(),
            r#"{"error":"Invalid Authorization header.","errcode":"M_UNKNOWN_TOKEN"}"#
        );
        // No secret configured: none checked, as in Synapse.
        let open = CatchUpEndpoint::new(InstanceName::from("w"), None);
        assert!(open.route("GET", PATH, query, []).is_ok());
        assert!(!format!("{endpoint:?}").contains("secret\""));
    }

    #[test]
    fn streams_are_known_or_refused() {
        let endpoint = endpoint();
        let error = route(
            &endpoint,
            "/_synapse/replication/get_repl_stream_updates/nope/x",
            "from_token=1&upto_token=2",
        )
        .unwrap_err();
        assert_eq!(error.status(), 400);
        assert_eq!(
            error.body(),
            r#"{"error":"Unknown stream","errcode":"M_UNKNOWN"}"#
        );
        // Percent-decoded as Synapse decodes path segments.
        let request = fetch(route(
            &endpoint,
            "/_synapse/replication/get_repl_stream_updates/%74yping/x",
            "from_token=1&upto_token=2",
        ));
        assert_eq!(request.stream, StreamName::Typing);
        // Unknown stream comes before bad parameters.
        let error = route(
            &endpoint,
            "/_synapse/replication/get_repl_stream_updates/%ff/x",
            "",
        )
        .unwrap_err();
        assert_eq!(
            error,
            EndpointError::UnknownStream {
                name: "\u{fffd}".into()
            }
        );
        // Restricted to the streams it writes.
        let only = CatchUpEndpoint::new(InstanceName::from("w"), None)
            .with_streams([StreamName::Typing, StreamName::new("my_stream")]);
        assert!(route(&only, PATH, "from_token=1&upto_token=2").is_ok());
        assert!(
            route(
                &only,
                "/_synapse/replication/get_repl_stream_updates/my_stream/x",
                "from_token=1&upto_token=2"
            )
            .is_ok()
        );
        assert!(matches!(
            route(
                &only,
                "/_synapse/replication/get_repl_stream_updates/events/x",
                "from_token=1&upto_token=2"
            ),
            Err(EndpointError::UnknownStream { .. })
        ));
    }

    #[test]
    fn parameters_are_read_as_parse_integer_reads_them() {
        let endpoint = endpoint();
        let tokens = |query: &str| {
            route(&endpoint, PATH, query).map(|routed| match routed {
                Routed::Fetch(request) => (request.from.0, request.to.0),
                Routed::Answer(page) => (page.upto.0, page.upto.0),
            })
        };
        assert_eq!(tokens("upto_token=9&from_token=1"), Ok((1, 9)));
        assert_eq!(tokens("from_token=%31&upto_token=+9+"), Ok((1, 9)));
        assert_eq!(tokens("from_token=1_0&upto_token=%2B20"), Ok((10, 20)));
        assert_eq!(
            tokens("from_token=1&from_token=5&upto_token=9&x"),
            Ok((1, 9))
        );
        assert_eq!(tokens("&&from_token=007&upto_token=9&"), Ok((7, 9)));
        assert_eq!(tokens("from_token=-0&upto_token=9"), Ok((0, 9)));
        assert_eq!(
            tokens("upto_token=9"),
            Err(EndpointError::MissingParam("from_token"))
        );
        assert_eq!(
            tokens("from_token=1"),
            Err(EndpointError::MissingParam("upto_token"))
        );
        assert_eq!(tokens(""), Err(EndpointError::MissingParam("from_token")));
        for bad in [
            "",
            "x",
            "1.5",
            "1__0",
            "_1",
            "1_",
            "+",
            "- 1",
            "0x10",
            "99999999999999999999",
            "%ff",
        ] {
            assert_eq!(
                tokens(&format!("from_token={bad}&upto_token=9")),
                Err(EndpointError::InvalidParam("from_token")),
                "{bad}"
            );
        }
        assert_eq!(
            tokens("from_token&upto_token=9"),
            Err(EndpointError::InvalidParam("from_token"))
        );
        let error = tokens("from_token=-1&upto_token=9").unwrap_err();
        assert_eq!(error, EndpointError::NegativeParam("from_token"));
        assert_eq!(
            error.body(),
            r#"{"error":"Query parameter from_token must be a positive integer.","errcode":"M_INVALID_PARAM"}"#
        );
        assert_eq!(
            EndpointError::MissingParam("upto_token").body(),
            r#"{"error":"Missing required integer query parameter upto_token","errcode":"M_MISSING_PARAM"}"#
        );
    }

    #[test]
    fn page_bodies_read_back_and_errors_are_json() {
        let page = CatchUpPage {
            updates: vec![
                (
                    Token(3),
                    RawRow::new(&br#"["!a:x",["@\u00e9:x"]]"#[..]).unwrap(),
                ),
                (Token(3), RawRow::new(&b"[]"[..]).unwrap()),
                (Token(-4), RawRow::new(&b"{\"k\":null}"[..]).unwrap()),
            ],
            upto: Token(9),
            limited: true,
        };
        let body = page_body(&page);
        assert_eq!(
            body,
            r#"{"updates":[[3,["!a:x",["@\u00e9:x"]]],[3,[]],[-4,{"k":null}]],"upto_token":9,"limited":true}"#
        );
        assert_eq!(CatchUpPage::from_json(body.into_bytes()).unwrap(), page);
        assert_eq!(
            page_body(&CatchUpPage::default()),
            r#"{"updates":[],"upto_token":0,"limited":false}"#
        );
        assert_eq!(
            internal_error_body(),
            r#"{"error":"Internal server error","errcode":"M_UNKNOWN"}"#
        );
    }

    #[test]
    fn python_int_matches_python() {
        for (text, expected) in [
            ("0", Some(0)),
            (" \t12\n", Some(12)),
            ("-5", Some(-5)),
            ("+5", Some(5)),
            ("1_000", Some(1000)),
            ("9223372036854775807", Some(i64::MAX)),
            ("-9223372036854775808", Some(i64::MIN)),
            ("9223372036854775808", None),
            ("", None),
            (" ", None),
            ("--1", None),
            ("1 2", None),
            ("١", None),
        ] {
            assert_eq!(python_int(text.as_bytes()), expected, "{text:?}");
        }
    }

    proptest! {
        #[test]
        fn any_request_is_routed_or_refused_without_panicking(
            method in "[A-Z]{0,6}",
            path in "(/_synapse/replication/get_repl_stream_updates/)?[a-z%0-9/_]{0,20}",
            query in proptest::option::of("[a-z_=&%+0-9-]{0,40}"),
            auth in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..16), 0..3),
        ) {
            let endpoint = endpoint();
            if let Err(error) = endpoint.route(&method, &path, query.as_deref(), auth.iter().map(Vec::as_slice)) {
                let body: serde_json::Value = serde_json::from_str(&error.body()).unwrap();
                prop_assert_eq!(body["errcode"].as_str(), Some(error.errcode()));
                prop_assert!(matches!(error.status(), 400 | 401 | 404 | 405));
            }
        }

        #[test]
        fn tokens_round_trip_through_our_client_s_path(from in 0i64.., to in 0i64..) {
            let endpoint = CatchUpEndpoint::new(InstanceName::from("w"), None);
            let request = CatchUpRequest {
                id: CatchUpId(1),
                stream: StreamName::Typing,
                writer: InstanceName::from("w"),
                from: Token(from),
                to: Token(to),
            };
            let path = request.path("t");
            let (path, query) = path.split_once('?').unwrap();
            match endpoint.route("GET", path, Some(query), []).unwrap() {
                Routed::Fetch(got) => prop_assert_eq!((got.from, got.to), (request.from, request.to)),
                Routed::Answer(page) => prop_assert!(from == to && page.upto == request.to),
            }
        }
    }
}
