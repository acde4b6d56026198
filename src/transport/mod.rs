//! Layer 6, transports: thin async drivers that move bytes between a
//! session and a socket. The only layer that does I/O.
//!
//! Drivers use `futures::io::{AsyncRead, AsyncWrite}` and a small
//! [`Runtime`] trait (connect, listen, sleep), implemented for smol
//! (`SmolRuntime`, feature `runtime-smol`) and tokio (`TokioRuntime`,
//! feature `runtime-tokio`). They read into one large buffer and hand the
//! session many lines per read, and write the session's lines in batches.
//!
//! Direct TCP ([`TcpServer`], [`TcpClient`]):
//!
//! ```no_run
//! # #[cfg(feature = "runtime-smol")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use synapse_replication::config::StreamWriters;
//! use synapse_replication::positions::{Follower, FollowerEvent};
//! use synapse_replication::session::{TcpClientEvent, TcpClientSession};
//! use synapse_replication::transport::{SmolRuntime, TcpClient};
//! use synapse_replication::wire::InstanceName;
//!
//! let follower = Follower::new(InstanceName::from("worker1"), Arc::new(StreamWriters::default()));
//! let session = TcpClientSession::new("example.com", follower)?;
//! let mut client = TcpClient::new(SmolRuntime, "127.0.0.1:9092", session);
//! smol::block_on(async {
//!     while let Some(event) = client.next_event().await {
//!         match event {
//!             TcpClientEvent::Follower(FollowerEvent::Rows { stream, writer, token, rows, .. }) => {
//!                 println!("{stream} {writer} {token}: {} rows", rows.len())
//!             }
//!             other => println!("{other}"),
//!         }
//!     }
//! });
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "runtime-smol"))]
//! # fn main() {}
//! ```
//!
//! # Catching up
//!
//! Rows a follower missed (it was away, or the server restarted) are
//! fetched out of band, never through the replication connection: that is
//! Synapse's design (its workers fetch over HTTP from the writer, which
//! reads its database), and the direct TCP protocol has no command for it,
//! so any in-band answer would break compatibility with Synapse peers. A
//! [`TcpClient`] given a [`CatchUpSource`] fetches every page the follower
//! asks for and retries failures with backoff; without one, the
//! application answers the follower's
//! [`CatchUp`](crate::positions::FollowerEvent::CatchUp) events itself with
//! [`TcpClient::handle_catch_up`]. Between Rust processes the source is
//! whatever holds the writer's log: the shared database, as in Synapse, or
//! an endpoint the server's application exposes.
//!
//! Against Synapse, `HttpCatchUp` (feature `http-catch-up`) is that
//! source: it asks the writer's `instance_map` address over HTTP, as
//! Synapse's workers do.
//!
//! # Reaching Redis
//!
//! [`RedisConfig`](crate::config::RedisConfig) (in
//! [`config`](crate::config)) says where Redis is and how to reach it,
//! read from a URL (`redis://`, `rediss://`, `unix://`) or from Synapse's
//! `redis:` config section; [`Dial::connect`] opens the byte stream over
//! TCP, a Unix socket, or TLS (feature `tls`, rustls), which never falls
//! back to plaintext. The same dialer opens HTTP catch-up's connections,
//! to an `instance_map` [`Endpoint`](crate::config::Endpoint).

mod catch_ups;
mod command_queue;
#[cfg(any(feature = "http-catch-up", feature = "http-server"))]
mod http;
mod net;
mod redis;
mod runtime;
mod sentinel;
mod tcp_client;
mod tcp_server;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

pub use async_trait::async_trait;

use crate::positions::{BoxError, CatchUpPage, CatchUpRequest};

#[cfg(feature = "http-catch-up")]
#[cfg_attr(docsrs, doc(cfg(feature = "http-catch-up")))]
pub use http::catch_up::{HttpCatchUp, HttpCatchUpError};
#[cfg(feature = "http-server")]
#[cfg_attr(docsrs, doc(cfg(feature = "http-server")))]
pub use http::server::{
    HttpRequest, HttpResponse, HttpServer, HttpServerConfig, HttpServerCounters, HttpServerTls,
    HttpServerTlsError,
};
pub use net::dial::Dial;
pub use redis::{RedisClient, RedisClientConfig};
#[cfg(feature = "runtime-smol")]
#[cfg_attr(docsrs, doc(cfg(feature = "runtime-smol")))]
pub use runtime::smol::SmolRuntime;
pub use runtime::{BoxConnection, BoxFuture, Connection, Listener, Runtime};

pub use command_queue::{CommandSendError, CommandSender, Queued};
#[cfg(feature = "runtime-tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "runtime-tokio")))]
pub use runtime::tokio::TokioRuntime;
pub use tcp_client::{TcpClient, TcpClientConfig};
pub use tcp_server::{TcpServer, TcpServerConfig};

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

/// Exponential backoff with jitter, for reconnecting and retrying.
///
/// Delays double from `initial` up to `max`; each is drawn uniformly from
/// its upper half (`[d/2, d]`), so that many clients cut off at once do not
/// come back at once. The randomness is a xorshift generator seeded from
/// the clock and a process-wide counter (no `rand` dependency; it need not
/// be unpredictable, only different per client).
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    attempt: u32,
    state: u64,
}

impl Backoff {
    /// Backoff from `initial` doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos() as u64);
        let count = COUNTER.fetch_add(1, Ordering::Relaxed);
        let seed = nanos ^ count.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Backoff {
            initial,
            max: max.max(initial),
            attempt: 0,
            state: seed | 1,
        }
    }

    /// The next delay; each call doubles the next one, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let base = self
            .initial
            .saturating_mul(1u32.checked_shl(self.attempt).unwrap_or(u32::MAX))
            .min(self.max);
        self.attempt = self.attempt.saturating_add(1).min(31);
        let half = base / 2;
        let span = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let jitter = if span == 0 {
            0
        } else {
            self.next_random() % (span + 1)
        };
        half + Duration::from_nanos(jitter)
    }

    /// Back to the initial delay (after a connection that lasted).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_jitter_and_caps() {
        let ms = Duration::from_millis;
        let mut backoff = Backoff::new(ms(100), ms(5000));
        let mut previous_cap = ms(0);
        for attempt in 0..12 {
            let cap = (ms(100) * 2u32.pow(attempt)).min(ms(5000));
            let delay = backoff.next_delay();
            assert!(delay >= cap / 2 && delay <= cap, "{attempt}: {delay:?}");
            assert!(cap >= previous_cap);
            previous_cap = cap;
        }
        backoff.reset();
        assert!(backoff.next_delay() <= ms(100));
    }

    #[test]
    fn two_backoffs_differ() {
        let ms = Duration::from_millis;
        let mut a = Backoff::new(ms(1000), ms(5000));
        let mut b = Backoff::new(ms(1000), ms(5000));
        let a: Vec<_> = (0..4).map(|_| a.next_delay()).collect();
        let b: Vec<_> = (0..4).map(|_| b.next_delay()).collect();
        assert_ne!(a, b);
    }
}
