//! Fetching missed rows out of band: the request a follower makes, the page
//! a writer answers.

use std::error::Error;
use std::fmt;
use std::time::Instant;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::wire::{InstanceName, JsonError, RawRow, StreamName, Token};

/// Identifies one outstanding catch-up request of a [`Follower`](super::Follower).
///
/// Each request (each page) has a fresh id; an id is answered once, with
/// [`Follower::handle_catch_up`](super::Follower::handle_catch_up) or
/// [`Follower::catch_up_failed`](super::Follower::catch_up_failed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CatchUpId(pub(crate) u64);

impl CatchUpId {
    /// An id, for building a [`CatchUpRequest`] by hand (to test a
    /// [`CatchUpSource`](crate::transport::CatchUpSource), say). A
    /// follower answers only the ids it made.
    pub const fn new(id: u64) -> CatchUpId {
        CatchUpId(id)
    }

    /// The id as a number (unique for the life of one follower).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for CatchUpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// "Fetch the rows `writer` wrote to `stream` with tokens in `(from, to]`."
///
/// Synapse serves this over HTTP on the writer's replication listener (its
/// address is the writer's `instance_map` entry, see
/// [`StreamWriters::location`](crate::config::StreamWriters::location)):
/// `GET` [`path`](CatchUpRequest::path) with
/// `Authorization: Bearer <worker_replication_secret>`, answering
/// `{"updates": [[token, row], ...], "upto_token": N, "limited": bool}`,
/// which [`CatchUpPage::from_json`] reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatchUpRequest {
    /// Answer with this id.
    pub id: CatchUpId,
    /// The stream.
    pub stream: StreamName,
    /// The writer whose rows are missing: send the request to it.
    pub writer: InstanceName,
    /// Rows above this token (exclusive)...
    pub from: Token,
    /// ...up to this one (inclusive).
    pub to: Token,
}

impl CatchUpRequest {
    /// The path and query of Synapse's endpoint for this request:
    /// `/_synapse/replication/get_repl_stream_updates/<stream>/<txn_id>?from_token=A&upto_token=B`.
    ///
    /// `txn_id` must be fresh for every call: Synapse caches answers per
    /// transaction id for 30 minutes. Both path segments are
    /// percent-encoded as Synapse's client does (`urllib.parse.quote(_, safe="")`).
    pub fn path(&self, txn_id: &str) -> String {
        let mut path = String::from("/_synapse/replication/get_repl_stream_updates/");
        quote_into(&mut path, self.stream.as_str());
        path.push('/');
        quote_into(&mut path, txn_id);
        path.push_str(&format!("?from_token={}&upto_token={}", self.from, self.to));
        path
    }
}

impl fmt::Display for CatchUpRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "catch-up {} {} {} ({}, {}]",
            self.id, self.stream, self.writer, self.from, self.to
        )
    }
}

/// Python's `urllib.parse.quote(s, safe="")`: everything but ASCII letters,
/// digits and `_.-~` is percent-encoded (UTF-8 bytes, upper-case hex).
fn quote_into(out: &mut String, s: &str) {
    for byte in s.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'.' | b'-' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
}

/// One page of a catch-up answer.
///
/// `updates` are the rows with tokens in `(from, upto]`, sorted by token;
/// rows sharing a token are one batch. When `limited`, more rows follow: the
/// follower asks again from `upto`.
///
/// Synapse does not always keep to the range: its `caches` answers hold
/// rows above `upto_token` ("cache invalidations are idempotent"), and a
/// limited `caches` page may reach beyond the `upto_token` asked for. The
/// follower skips rows outside what it asked for (see
/// [`Follower::handle_catch_up`](super::Follower::handle_catch_up)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CatchUpPage {
    /// `(token, row)` pairs, sorted by token.
    pub updates: Vec<(Token, RawRow)>,
    /// The token this page reaches.
    pub upto: Token,
    /// Whether more rows remain above `upto`.
    pub limited: bool,
}

/// A catch-up answer that is not Synapse's JSON.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CatchUpPageError {
    /// The body is not `{"updates": [[token, row], ...], "upto_token": N, "limited": bool}`.
    #[error("invalid catch-up answer: {0}")]
    Shape(#[from] serde_json::Error),
    /// One row is not a valid row.
    #[error("invalid row {index} in catch-up answer: {source}")]
    Row {
        /// Its index in `updates`.
        index: usize,
        /// What is wrong with it.
        source: JsonError,
    },
}

#[derive(Deserialize)]
struct RawPage<'a> {
    #[serde(borrow)]
    updates: Vec<(i64, &'a RawValue)>,
    upto_token: i64,
    limited: bool,
}

impl CatchUpPage {
    /// Reads the JSON body Synapse's `get_repl_stream_updates` answers.
    ///
    /// Rows are not copied: each [`RawRow`] is a view of `body`. A row
    /// spread over several lines (a pretty-printed answer) is re-encoded
    /// compactly, as Synapse would write it.
    pub fn from_json(body: impl Into<Bytes>) -> Result<CatchUpPage, CatchUpPageError> {
        let body: Bytes = body.into();
        let raw: RawPage<'_> = serde_json::from_slice(&body)?;
        let mut updates = Vec::with_capacity(raw.updates.len());
        for (index, (token, row)) in raw.updates.into_iter().enumerate() {
            let text = row.get().as_bytes();
            let row = match RawRow::new(body.slice_ref(text)) {
                Ok(row) => row,
                Err(JsonError::Newline) => serde_json::from_slice::<serde_json::Value>(text)
                    .map_err(JsonError::from)
                    .and_then(|value| RawRow::from_value(&value))
                    .map_err(|source| CatchUpPageError::Row { index, source })?,
                Err(source) => return Err(CatchUpPageError::Row { index, source }),
            };
            updates.push((Token(token), row));
        }
        Ok(CatchUpPage {
            updates,
            upto: Token(raw.upto_token),
            limited: raw.limited,
        })
    }
}

/// A catch-up answer the follower cannot apply. Nothing of it was applied;
/// the request stays outstanding under the same id (answer it again, or call
/// [`Follower::catch_up_failed`](super::Follower::catch_up_failed) for a fresh
/// request).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CatchUpError {
    /// No request with this id is outstanding (answered already, replaced by
    /// a retry, or never made).
    #[error("no outstanding catch-up {0}")]
    UnknownId(CatchUpId),
    /// Rows are not sorted by token.
    #[error("catch-up {id}: row token {token} after {previous}")]
    RowsOutOfOrder {
        /// The request.
        id: CatchUpId,
        /// The out-of-order token.
        token: Token,
        /// The token before it.
        previous: Token,
    },
    /// A `limited` page whose `upto` does not move past the request's start
    /// (asking again would loop).
    #[error("catch-up {id}: limited page with upto {upto} does not advance past {from}")]
    NoProgress {
        /// The request.
        id: CatchUpId,
        /// The page's `upto`.
        upto: Token,
        /// The request's `from`.
        from: Token,
    },
}

/// Any error, boxed: what a catch-up source fails with.
pub type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// Failures in a row after which a catch-up is reported stuck.
pub const STUCK_AFTER_FAILURES: u32 = 3;

/// A catch-up that failed [`STUCK_AFTER_FAILURES`] times or more in a row:
/// its writer's rows on its stream wait for it (other writers and streams
/// go on). It is retried until it succeeds, with a backoff capped at the
/// client's `max_backoff`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StuckCatchUp {
    /// The stream.
    pub stream: StreamName,
    /// The writer whose rows are missing.
    pub writer: InstanceName,
    /// The range last asked for, `(from, to]`.
    pub from: Token,
    /// See `from`.
    pub to: Token,
    /// When its first failure in this run of failures happened.
    pub since: Instant,
    /// Failures in a row.
    pub failures: u32,
    /// The last error, as text.
    pub error: String,
}

impl fmt::Display for StuckCatchUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "catch-up of {} from {} ({}, {}] stuck after {} failures: {}",
            self.stream, self.writer, self.from, self.to, self.failures, self.error
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_is_synapse_s() {
        let request = CatchUpRequest {
            id: CatchUpId(1),
            stream: StreamName::Typing,
            writer: InstanceName::master(),
            from: Token(5),
            to: Token(-7),
        };
        assert_eq!(
            request.path("abcDEF0123"),
            "/_synapse/replication/get_repl_stream_updates/typing/abcDEF0123?from_token=5&upto_token=-7"
        );
        let odd = CatchUpRequest {
            stream: StreamName::new("a b/é"),
            ..request
        };
        assert!(odd.path("x").contains("/a%20b%2F%C3%A9/x?"));
    }

    #[test]
    fn page_from_json_is_zero_copy() {
        let body = Bytes::from_static(
            br#"{"updates": [[3, ["a",null]], [3, {"k":"\u00e9"}], [4, []]], "upto_token": 9, "limited": true, "extra": 1}"#,
        );
        let page = CatchUpPage::from_json(body.clone()).unwrap();
        assert_eq!(page.upto, Token(9));
        assert!(page.limited);
        let rows: Vec<_> = page
            .updates
            .iter()
            .map(|(t, r)| (t.0, r.as_str()))
            .collect();
        assert_eq!(
            rows,
            vec![(3, r#"["a",null]"#), (3, r#"{"k":"\u00e9"}"#), (4, "[]")]
        );
        let start = body.as_ptr() as usize;
        let row = page.updates[0].1.as_bytes().as_ptr() as usize;
        assert!(row >= start && row < start + body.len());
    }

    #[test]
    fn pretty_rows_are_made_compact() {
        let page = CatchUpPage::from_json(
            &b"{\"updates\": [[1, [\n  \"a\",\n  1\n]]], \"upto_token\": 1, \"limited\": false}"[..],
        )
        .unwrap();
        assert_eq!(page.updates[0].1.as_str(), r#"["a",1]"#);
    }

    #[test]
    fn lone_surrogates_pass_through() {
        let page = CatchUpPage::from_json(
            &br#"{"updates": [[1, ["\ud800"]]], "upto_token": 1, "limited": false}"#[..],
        )
        .unwrap();
        assert_eq!(page.updates[0].1.as_str(), r#"["\ud800"]"#);
    }

    #[test]
    fn bad_shapes_are_errors() {
        for body in [
            &br#"{"updates": [], "upto_token": 1}"#[..],
            br#"{"updates": [[1]], "upto_token": 1, "limited": false}"#,
            br#"{"updates": [["1", []]], "upto_token": 1, "limited": false}"#,
            br#"{"updates": [], "upto_token": 1.5, "limited": false}"#,
            br#"[]"#,
        ] {
            assert!(
                matches!(
                    CatchUpPage::from_json(body),
                    Err(CatchUpPageError::Shape(_))
                ),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
