//! [`CatchUpSource`]: where a follower's missed rows come from.

use async_trait::async_trait;

use crate::positions::{BoxError, CatchUpPage, CatchUpRequest};
use crate::transport::runtime::BoxFuture;

/// Where a follower's missed rows come from: answers a
/// [`CatchUpRequest`] with one page of rows.
///
/// Synapse answers over HTTP (`get_repl_stream_updates`, see
/// [`CatchUpRequest::path`] and `HttpCatchUp`);
/// a Rust deployment answers from the writer's log. A page may be
/// `limited` (the follower then asks for the next). Errors are retried by
/// the driver, with a backoff per (stream, writer).
///
/// Implement it with `async fn` through the
/// [`async_trait`](https://docs.rs/async-trait) attribute, which this
/// crate re-exports:
///
/// ```
/// use synapse_replication::positions::{BoxError, CatchUpPage, CatchUpRequest};
/// use synapse_replication::transport::{CatchUpSource, async_trait};
///
/// /// Nothing is ever missing.
/// struct Empty;
///
/// #[async_trait]
/// impl CatchUpSource for Empty {
///     async fn fetch(&self, request: CatchUpRequest) -> Result<CatchUpPage, BoxError> {
///         Ok(CatchUpPage { updates: Vec::new(), upto: request.to, limited: false })
///     }
/// }
/// ```
///
/// Closures `Fn(CatchUpRequest) -> BoxFuture<'static, Result<CatchUpPage,
/// BoxError>>` implement it too.
#[async_trait]
pub trait CatchUpSource: Send + Sync + 'static {
    /// Fetches the rows of `request.writer` on `request.stream` with tokens
    /// in `(request.from, request.to]`.
    async fn fetch(&self, request: CatchUpRequest) -> Result<CatchUpPage, BoxError>;
}

#[async_trait]
impl<F> CatchUpSource for F
where
    F: Fn(CatchUpRequest) -> BoxFuture<'static, Result<CatchUpPage, BoxError>>
        + Send
        + Sync
        + 'static,
{
    async fn fetch(&self, request: CatchUpRequest) -> Result<CatchUpPage, BoxError> {
        self(request).await
    }
}

/// A writer's in-memory [`History`](crate::positions::History) answers
/// catch-ups in pages of Synapse's size
/// ([`TARGET_ROW_COUNT`](crate::positions::TARGET_ROW_COUNT)): give the
/// same `Arc<Mutex<History>>` to a Rust follower's client and to
/// `HttpServer` (feature `http-server`) for Synapse's processes.
#[async_trait]
impl CatchUpSource for std::sync::Mutex<crate::positions::History> {
    async fn fetch(&self, request: CatchUpRequest) -> Result<CatchUpPage, BoxError> {
        let history = self.lock().unwrap_or_else(|poison| poison.into_inner());
        Ok(history.answer(&request, crate::positions::TARGET_ROW_COUNT)?)
    }
}
