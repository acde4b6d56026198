//! Layer 3, beside the positions: Synapse's replication HTTP API
//! (`synapse/replication/http/`), sans-IO:
//! the calls Synapse's processes make on each other besides the streams
//! (`fed_send_edu`, `presence_set_state`, `send_events`, ... some thirty
//! endpoints), both sides.
//!
//! Synapse's processes call `/_synapse/replication/<NAME>/<path
//! args...>[/<txn_id>]` on the address `instance_map` gives the callee,
//! with `Authorization: Bearer <worker_replication_secret>`. A call is tied
//! to the streams: its body carries the caller's positions (under the
//! key `_INT_STREAM_POS`, `_STREAM_POSITION_KEY` in Synapse's code, the
//! same from 1.98.0 to 1.163.2), which the callee waits to have seen before it
//! acts, and the answer carries the callee's, which the caller waits for
//! before it returns; that is how a read follows a write across processes.
//! An endpoint that caches (most do) keeps each answer for 30 minutes under
//! the call's txn id, so that a retried call is answered, not handled twice.
//!
//! What is here needs no socket and no clock:
//!
//! - [`ReplicationEndpoint`]: what one of Synapse's `ReplicationEndpoint`
//!   subclasses declares (its `NAME`, `METHOD`, `PATH_ARGS`, `CACHE`,
//!   `WAIT_FOR_STREAMS`), and the path a call takes;
//! - [`ReplicationApi`]: a process's endpoints, and the checks of a request
//!   in Synapse's order: the path (404), the method (405), the secret
//!   (401), from the headers alone; then the body (400) and its
//!   `_INT_STREAM_POS`, into a [`ReplicationRequest`];
//! - [`ResponseCache`]: the answers kept per txn id, concurrent duplicates
//!   included;
//! - [`StreamPositions`] and the bodies both ways ([`answer_body`],
//!   [`call_body`], [`read_answer`]), Synapse's error bodies
//!   ([`ReplicationError`], [`RemoteError`]);
//! - [`CatchUpEndpoint`]: the stream catch-up endpoint
//!   (`get_repl_stream_updates`), answered from the application's pages
//!   ([`page_body`]);
//! - [`AccountDataRequest`] and [`AccountDataAnswer`]: the six calls
//!   Synapse's processes make on the account-data writer
//!   (`add_user_account_data`, `add_tag`, ...), typed.
//!
//! Waiting for positions is the follower's
//! (`PositionWaits` on the sans-IO side, `wait_for_position` on the
//! clients); `HttpServer` (feature `http-server`) puts the pieces together.
//!
//! ```
//! use synapse_replication::http::{ReplicationApi, ReplicationEndpoint};
//! use synapse_replication::wire::{InstanceName, StreamName, Token};
//!
//! let api = ReplicationApi::new(InstanceName::from("typing1"), Some("s3cret".into()))
//!     .with_endpoint(ReplicationEndpoint::fed_send_edu());
//!
//! // The headers first: path, method, secret.
//! let route = api.route(
//!     "POST",
//!     "/_synapse/replication/fed_send_edu/m.typing/AbCdEfGhIj",
//!     [&b"Bearer s3cret"[..]],
//! )?;
//! // Then the body.
//! let request = api.read(route, None, br#"{"origin":"remote.org","content":{"typing":true},
//!     "_INT_STREAM_POS":{"streams":{"events":7},"instance_name":"master"}}"#)?;
//! assert_eq!(request.arg("edu_type"), Some("m.typing"));
//! assert_eq!(request.txn_id.as_deref(), Some("AbCdEfGhIj"));
//! assert_eq!(request.content["origin"], "remote.org");
//! let caller = request.caller.as_ref().unwrap();
//! assert_eq!(caller.instance.as_str(), "master");
//! assert_eq!(caller.streams, [(StreamName::Events, Token(7))]);
//!
//! let refused = api
//!     .route("POST", "/_synapse/replication/fed_send_edu/m.typing/x", [&b"Bearer nope"[..]])
//!     .unwrap_err();
//! assert_eq!(refused.status(), 401);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod account_data;
mod api;
mod body;
mod cache;
mod endpoint;
mod error;
mod serve;

pub use account_data::{AccountDataAnswer, AccountDataRequest};
pub use api::{ReplicationApi, ReplicationRequest, Route};
pub use body::{
    MAX_POSITIONS, ReplicationAnswer, StreamPositions, answer_body, call_body, call_query,
    read_answer,
};
pub use cache::{CacheLookup, CachedAnswer, ResponseCache, fingerprint};
pub use endpoint::{Method, ReplicationEndpoint};
pub use error::{RemoteError, ReplicationError};
pub use serve::{
    CONTENT_TYPE, CatchUpEndpoint, EndpointError, Routed, internal_error_body, page_body,
};

/// The key of the positions in a call's body and in its answer.
pub const STREAM_POSITIONS_KEY: &str = "_INT_STREAM_POS";

/// How long a callee waits for a caller's positions before it handles the
/// call anyway (Synapse's `_WAIT_FOR_REPLICATION_TIMEOUT_SECONDS`: on
/// timeout it logs a warning and goes on).
pub const WAIT_FOR_POSITIONS: std::time::Duration = std::time::Duration::from_secs(5);
