//! Serving Synapse's replication HTTP API (feature `http-server`):
//! [`HttpServer`], the writer's side of `HttpCatchUp`, so that Synapse's
//! own processes can fetch what a Rust writer wrote, and the callee's side
//! of `ReplicationClient`, for the endpoints the application handles
//! ([`HttpServer::with_endpoint`]).
//!
//! The request is read and answered by the sans-IO
//! [`CatchUpEndpoint`]; rows come from a [`CatchUpSource`] (an in-memory
//! [`History`](crate::positions::History), or the application's store).
//! HTTP/1.1 is hyper's server, run over a [`Runtime`] listener with no
//! executor: connections are polled by [`HttpServer::run`] itself, so it
//! works on smol and tokio alike. With the `tls` feature it serves HTTPS
//! ([`HttpServer::with_tls`]), rustls underneath.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::future::{self, AbortHandle, Either};
use futures::stream::{FuturesUnordered, StreamExt};
use hyper::body::{Body, Incoming};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;

use crate::http::{
    AccountDataAnswer, AccountDataRequest, CONTENT_TYPE, CatchUpEndpoint, EndpointError,
    ReplicationEndpoint, ReplicationError, ReplicationRequest, Routed, internal_error_body,
    page_body,
};

use super::hyper_io::HyperIo;
use crate::config::{Endpoint, InstanceLocation, SynapseConfig};
use crate::transport::client::source::CatchUpSource;
use crate::transport::client::waits::PositionWaiter;
use crate::transport::runtime::{BoxConnection, BoxFuture, Listener, Runtime, deadline_after};
use crate::wire::{InstanceName, StreamName, Token};
use crate::writers::WriterRegistry;

mod calls;
mod limits;

use calls::{CallHandler, Calls, PositionsFn, WaitFn};
use limits::{Admission, LOG_BURST, LOG_WINDOW, RefusalLog, Slots, Verdict, short_path};

/// The size of the buffer bytes are read into before hyper copies them.
const READ_CHUNK: usize = 16 * 1024;

/// hyper's smallest read buffer.
const MIN_BUFFER: usize = 8192;

/// Where every Synapse replication route starts: requests under it carry
/// the secret, whichever route they are for.
const REPLICATION_PREFIX: &str = "/_synapse/replication/";

/// The catch-up route, for checking the secret of a request to another
/// replication route (the endpoint checks path, method, then secret).
const SECRET_PROBE: &str = "/_synapse/replication/get_repl_stream_updates/-/-";

/// Limits of an [`HttpServer`].
///
/// A connection is *pending* from its accept until its request's headers
/// are in, complete, with the secret (when the endpoint has one) and for
/// a replication route; it is then *admitted*. Pending connections are
/// cheap to open and prove nothing, so they make room for each other:
/// beyond [`max_pending`](Self::max_pending) the oldest is closed for
/// the newcomer, whatever address either comes from. Synapse sends its
/// few headers at once, so its requests are admitted long before they
/// are the oldest; sockets left open, or trickling headers, by anyone
/// (on the writer's own host, where all of Synapse's processes connect
/// from, or from many addresses) are what is closed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HttpServerConfig {
    /// The largest request, headers and body together, in bytes (64 KiB;
    /// at least 8 KiB, hyper's smallest buffer). Longer headers end the
    /// connection (hyper answers 431); a longer body is answered 413.
    pub max_request_bytes: usize,
    /// Requests admitted at once (64; at least 1): catch-ups and calls
    /// whose headers came with the secret, being answered. One beyond it
    /// is answered 503 from its headers. Admitted connections are never
    /// closed to make room. Each connection carries one request
    /// (`Connection: close`).
    pub max_concurrent: usize,
    /// Connections pending at once (128; at least 1): a TLS handshake,
    /// headers on their way, a request refused from its headers, or a
    /// request for a route of the application's own
    /// ([`HttpServer::with_handler`], outside `/_synapse/replication/`,
    /// which the server cannot authenticate). A connection accepted
    /// beyond it is served, and the oldest pending one closed
    /// unanswered to make room.
    pub max_pending: usize,
    /// How long a connection may take, from its accept, to finish its TLS
    /// handshake (HTTPS) and send its request's headers (5 s; at most
    /// [`request_timeout`](Self::request_timeout)). A connection that has
    /// not by then is closed unanswered, however slowly it was sending.
    pub header_timeout: Duration,
    /// How long a request's body may take, from the end of its headers
    /// (10 s; bounded by [`request_timeout`](Self::request_timeout)): a
    /// body not in by then is answered 408, however slowly it was coming,
    /// so that prompt headers do not buy a slot for a trickled body.
    pub body_timeout: Duration,
    /// How long one request may take, from accepting its connection to
    /// the last byte of the answer (30 s). A source that has not answered
    /// by then is answered 504; a client still sending or reading then is
    /// cut off.
    pub request_timeout: Duration,
    /// After accepting fails (too many open files...), wait this long
    /// before accepting again (100 ms).
    pub accept_pause: Duration,
}

impl Default for HttpServerConfig {
    fn default() -> Self {
        HttpServerConfig {
            max_request_bytes: 64 << 10,
            max_concurrent: 64,
            max_pending: 128,
            header_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            accept_pause: Duration::from_millis(100),
        }
    }
}

/// HTTPS for an [`HttpServer`] (needs the crate's `tls` feature; rustls
/// with the ring provider and its safe default protocol versions
/// underneath): the server's certificate and key, and optionally the CAs
/// whose client certificates are required.
///
/// For Synapse's processes to fetch from it, its `instance_map` entry
/// says `tls: true`; Synapse then verifies the certificate against the
/// system's CAs (OpenSSL's default trust store, `SSL_CERT_FILE`), for the
/// entry's `host`. Synapse presents no client certificate: leave
/// `client_ca_file` unset for it (it is for other clients, such as this
/// crate's `HttpCatchUp` (feature `http-catch-up`) with a
/// [`TlsConfig`](crate::config::TlsConfig) certificate).
///
/// ```
/// use synapse_replication::transport::HttpServerTls;
///
/// let mut tls = HttpServerTls::new("/etc/synapse/typing1.crt", "/etc/synapse/typing1.key");
/// tls.client_ca_file = Some("/etc/synapse/clients-ca.crt".into());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct HttpServerTls {
    /// A PEM file with the server's certificate, then its chain.
    pub certificate_file: PathBuf,
    /// A PEM file with the certificate's private key (PKCS#8, PKCS#1 or
    /// SEC1).
    pub private_key_file: PathBuf,
    /// A PEM file of CA certificates: when set, every client must present
    /// a certificate signed by one of them, or the handshake fails.
    pub client_ca_file: Option<PathBuf>,
}

impl HttpServerTls {
    /// The certificate chain and key in these PEM files, with no client
    /// certificates asked for.
    pub fn new(
        certificate_file: impl Into<PathBuf>,
        private_key_file: impl Into<PathBuf>,
    ) -> HttpServerTls {
        HttpServerTls {
            certificate_file: certificate_file.into(),
            private_key_file: private_key_file.into(),
            client_ca_file: None,
        }
    }
}

/// Why [`HttpServer::with_tls`] cannot serve HTTPS.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpServerTlsError {
    /// The crate was built without its `tls` feature.
    #[error("HTTPS needs synapse-replication's `tls` feature")]
    Unavailable,
    /// A certificate or key file cannot be loaded.
    #[error("cannot load the HTTP server's tls {what} {path:?}: {reason}")]
    File {
        /// The setting that names the file: `certificate_file`,
        /// `private_key_file` or `client_ca_file`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it cannot be loaded (never the file's contents).
        reason: String,
    },
    /// rustls refused the configuration (a key that does not match the
    /// certificate, an unusable CA...).
    #[error("the HTTP server's tls configuration is refused: {0}")]
    Tls(String),
}

/// A request for a route other than the catch-up endpoint, handed to the
/// application's handler (see [`HttpServer::with_handler`]).
///
/// Its `Debug` hides credentials, so that a handler may log it: the
/// values of the `Authorization` (the replication secret, a client's
/// access token), `Proxy-Authorization` and `Cookie` headers, and of any
/// query parameter whose name holds `token` or a `%` escape (a Matrix
/// client may send `access_token` there). The fields keep them.
#[derive(Clone)]
#[non_exhaustive]
pub struct HttpRequest {
    /// `GET`, `PUT`...
    pub method: String,
    /// The path as received, still percent-encoded.
    pub path: String,
    /// The query, after the `?`.
    pub query: Option<String>,
    /// The headers, names in lower case, in the order received.
    pub headers: Vec<(String, Bytes)>,
    /// The body, whole (at most [`HttpServerConfig::max_request_bytes`]).
    pub body: Bytes,
    /// Who sent it.
    pub peer: SocketAddr,
}

impl HttpRequest {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_ref())
    }
}

impl fmt::Debug for HttpRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const CREDENTIALS: [&str; 3] = ["authorization", "proxy-authorization", "cookie"];
        let headers: Vec<(&str, &dyn fmt::Debug)> = self
            .headers
            .iter()
            .map(|(name, value)| {
                let secret = CREDENTIALS.iter().any(|c| name.eq_ignore_ascii_case(c));
                let value: &dyn fmt::Debug = if secret { &"<redacted>" } else { value };
                (name.as_str(), value)
            })
            .collect();
        // Synapse decodes parameter names, so `access%5Ftoken` is a token too.
        let query = self.query.as_deref().map(|query| {
            query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _))
                        if name.contains('%') || name.to_ascii_lowercase().contains("token") =>
                    {
                        format!("{name}=<redacted>")
                    }
                    _ => pair.to_owned(),
                })
                .collect::<Vec<_>>()
                .join("&")
        });
        f.debug_struct("HttpRequest")
            .field("method", &self.method)
            .field("path", &self.path)
            .field("query", &query)
            .field("headers", &headers)
            .field("body", &self.body)
            .field("peer", &self.peer)
            .finish()
    }
}

/// The answer of the application's handler: a status and a JSON body.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HttpResponse {
    /// The HTTP status.
    pub status: u16,
    /// The body, sent as `application/json`.
    pub body: String,
}

impl HttpResponse {
    /// An answer with this status and JSON body.
    pub fn new(status: u16, body: impl Into<String>) -> HttpResponse {
        HttpResponse {
            status,
            body: body.into(),
        }
    }

    /// A Matrix error answer: `{"errcode":"...","error":"..."}`.
    pub fn error(status: u16, errcode: &str, message: &str) -> HttpResponse {
        let body = serde_json::json!({"errcode": errcode, "error": message}).to_string();
        HttpResponse::new(status, body)
    }
}

/// The application's handler of other routes.
type Handler = dyn Fn(HttpRequest) -> BoxFuture<'static, HttpResponse> + Send + Sync;

/// What an [`HttpServer`] did so far; a handle that stays readable while
/// the server runs (clone it before [`HttpServer::run`]).
#[derive(Clone, Debug, Default)]
pub struct HttpServerCounters {
    inner: Arc<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    pages: AtomicU64,
    refused_secret: AtomicU64,
    bad_requests: AtomicU64,
    failed: AtomicU64,
    busy: AtomicU64,
    handled: AtomicU64,
    handshakes_failed: AtomicU64,
}

impl HttpServerCounters {
    /// Catch-up pages answered (200).
    pub fn pages(&self) -> u64 {
        self.inner.pages.load(Ordering::Relaxed)
    }

    /// Requests refused for a missing or wrong secret (401).
    pub fn refused_secret(&self) -> u64 {
        self.inner.refused_secret.load(Ordering::Relaxed)
    }

    /// Other refused requests (400, 404, 405, 413, and 408 for a body
    /// not in within [`HttpServerConfig::body_timeout`]), and connections
    /// closed for headers not complete within
    /// [`HttpServerConfig::header_timeout`].
    pub fn bad_requests(&self) -> u64 {
        self.inner.bad_requests.load(Ordering::Relaxed)
    }

    /// Catch-ups the source failed or did not answer in time (500, 504).
    pub fn failed(&self) -> u64 {
        self.inner.failed.load(Ordering::Relaxed)
    }

    /// Requests refused beyond [`HttpServerConfig::max_concurrent`]
    /// (503), and connections closed to make room beyond
    /// [`HttpServerConfig::max_pending`].
    pub fn busy(&self) -> u64 {
        self.inner.busy.load(Ordering::Relaxed)
    }

    /// Requests given to the application's handler.
    pub fn handled(&self) -> u64 {
        self.inner.handled.load(Ordering::Relaxed)
    }

    /// TLS handshakes that failed or did not finish within
    /// [`HttpServerConfig::header_timeout`] (HTTPS only:
    /// a plain-HTTP request, an untrusted or missing client
    /// certificate...).
    pub fn handshakes_failed(&self) -> u64 {
        self.inner.handshakes_failed.load(Ordering::Relaxed)
    }
}

/// Serves Synapse's catch-up endpoint for one instance, from a
/// [`CatchUpSource`]: what Synapse's processes call on a writer they
/// follow (its `instance_map` address); and the replication HTTP API's
/// endpoints the application handles ([`HttpServer::with_endpoint`]).
///
/// HTTP/1.1, plain unless [`HttpServer::with_tls`] makes it HTTPS (feature
/// `tls`): Synapse fetches over HTTPS from an `instance_map` entry that
/// says `tls: true`, and over plain HTTP otherwise. Plain HTTP belongs on
/// a private network.
///
/// Bounded ([`HttpServerConfig`], set with [`HttpServer::with_config`]),
/// so that no one can stall the catch-ups of Synapse's processes, not
/// even from their own address:
///
/// - requests of at most [`HttpServerConfig::max_request_bytes`], one per
///   connection;
/// - a connection is always accepted: when
///   [`HttpServerConfig::max_pending`] connections are open without a
///   request whose headers came with the secret, the oldest of them is
///   closed to make room; at most [`HttpServerConfig::max_concurrent`]
///   requests with the secret are answered at once (503 beyond), and
///   none of them is closed for room;
/// - the TLS handshake and the headers within
///   [`HttpServerConfig::header_timeout`] of the accept (closed
///   otherwise), the body within [`HttpServerConfig::body_timeout`] of
///   the headers (408 otherwise), the whole request within
///   [`HttpServerConfig::request_timeout`];
/// - a request under `/_synapse/replication/` without the secret
///   (`Authorization: Bearer <worker_replication_secret>`, when the
///   endpoint has one) is refused (401) as soon as its headers are in,
///   before its body is read or any handler runs, and its connection
///   closed;
/// - refusals are logged (at `info`) at most five a minute, with the
///   path cut short and never a header; the rest are counted (in
///   [`HttpServerCounters`], and in a summary line of the log).
///
/// The `Host` header is not read (Synapse sends
/// `Host: <instance_name>:80`). Other paths answer 404, or go to the
/// application's handler ([`HttpServer::with_handler`]), whose requests
/// outside `/_synapse/replication/` stay pending, closed for room like
/// any unproven connection: serve a public route (a client API) from a
/// server on a listener of its own.
///
/// ```no_run
/// # #[cfg(feature = "runtime-smol")]
/// # fn main() -> std::io::Result<()> {
/// use std::sync::{Arc, Mutex};
/// use synapse_replication::positions::{History, HistoryMode};
/// use synapse_replication::http::CatchUpEndpoint;
/// use synapse_replication::transport::{HttpServer, SmolRuntime};
/// use synapse_replication::wire::{InstanceName, StreamName};
///
/// let history = Arc::new(Mutex::new(
///     History::new(1000).with_mode(StreamName::Typing, HistoryMode::Keyed { key_len: 1 }),
/// ));
/// let endpoint = CatchUpEndpoint::new(InstanceName::from("typing1"), Some("secret".into()))
///     .with_streams([StreamName::Typing]);
/// smol::block_on(async {
///     let server = HttpServer::bind(SmolRuntime, "127.0.0.1:9093", endpoint, history.clone()).await?;
///     // Record rows in `history` as they are written; Synapse fetches them.
///     server.run().await;
///     Ok(())
/// })
/// # }
/// # #[cfg(not(feature = "runtime-smol"))]
/// # fn main() {}
/// ```
pub struct HttpServer<R: Runtime> {
    runtime: Arc<R>,
    listener: Box<dyn Listener>,
    shared: Arc<Shared>,
}

struct Shared {
    endpoint: CatchUpEndpoint,
    source: Arc<dyn CatchUpSource>,
    handler: Option<Arc<Handler>>,
    /// The replication HTTP API's endpoints served, if any.
    calls: Option<Calls>,
    /// The deployment's writers, to check the positions calls carry.
    writers: Option<Arc<dyn WriterRegistry>>,
    config: HttpServerConfig,
    counters: HttpServerCounters,
    /// How much of the refusals reaches the log.
    log: Mutex<RefusalLog>,
    /// HTTPS: each connection's handshake.
    #[cfg(feature = "tls")]
    tls: Option<futures_rustls::TlsAcceptor>,
}

impl<R: Runtime> fmt::Debug for HttpServer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpServer")
            .field("endpoint", &self.shared.endpoint)
            .field("config", &self.shared.config)
            .field("https", &self.shared.https())
            .field("counters", &self.shared.counters)
            .finish_non_exhaustive()
    }
}

impl<R: Runtime> HttpServer<R> {
    /// Listens on `addr` (`host:port`; port 0 picks one).
    pub async fn bind(
        runtime: R,
        addr: &str,
        endpoint: CatchUpEndpoint,
        source: Arc<dyn CatchUpSource>,
    ) -> io::Result<HttpServer<R>> {
        let listener = runtime.listen(addr).await?;
        Ok(HttpServer::from_listener(
            runtime, listener, endpoint, source,
        ))
    }

    /// Serves the catch-up of the process `name` of the deployment
    /// `synapse` describes, where its processes look for it: listening on
    /// `name`'s `instance_map` address, checking the configuration's
    /// replication secret, for the streams `stream_writers` gives `name`
    /// (see [`CatchUpEndpoint::with_streams`]). To listen on another
    /// address (all interfaces in a container, say), build the
    /// [`CatchUpEndpoint`] and [`bind`](HttpServer::bind). An entry with
    /// `tls: true` needs [`with_tls`](HttpServer::with_tls) too.
    ///
    /// Fails with [`io::ErrorKind::NotFound`] when `instance_map` has no
    /// TCP address for `name`.
    pub async fn from_synapse(
        runtime: R,
        synapse: &SynapseConfig,
        name: impl Into<InstanceName>,
        source: Arc<dyn CatchUpSource>,
    ) -> io::Result<HttpServer<R>> {
        let name = name.into();
        let writers = synapse.writers();
        let addr = match writers.location(&name).map(InstanceLocation::endpoint) {
            Some(Endpoint::Tcp { host, port }) if host.contains(':') => format!("[{host}]:{port}"),
            Some(Endpoint::Tcp { host, port }) => format!("{host}:{port}"),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("instance_map has no TCP address for {name}"),
                ));
            }
        };
        let streams = StreamName::KNOWN
            .iter()
            .filter(|stream| writers.is_configured(stream, &name))
            .cloned();
        let endpoint = CatchUpEndpoint::new(
            name.clone(),
            synapse.replication_secret().map(str::to_owned),
        )
        .with_streams(streams);
        let writers: Arc<dyn WriterRegistry> = writers.clone();
        let server = HttpServer::bind(runtime, &addr, endpoint, source).await?;
        Ok(server.with_writers(writers))
    }

    /// Serves on a listener already bound.
    pub fn from_listener(
        runtime: R,
        listener: Box<dyn Listener>,
        endpoint: CatchUpEndpoint,
        source: Arc<dyn CatchUpSource>,
    ) -> HttpServer<R> {
        HttpServer {
            runtime: Arc::new(runtime),
            listener,
            shared: Arc::new(Shared {
                endpoint,
                source,
                handler: None,
                calls: None,
                writers: None,
                config: HttpServerConfig::default(),
                counters: HttpServerCounters::default(),
                log: Mutex::new(RefusalLog::default()),
                #[cfg(feature = "tls")]
                tls: None,
            }),
        }
    }

    /// With these limits.
    #[must_use]
    pub fn with_config(mut self, config: HttpServerConfig) -> HttpServer<R> {
        self.shared_mut(|shared| shared.config = config);
        self
    }

    /// Requests for any other path go to `handler` (an application's own
    /// routes on the same listener), with their body read whole; without
    /// one they answer 404 as Synapse does. Under
    /// `/_synapse/replication/` only requests with the endpoint's secret
    /// reach it (others are answered 401 from their headers); other paths
    /// (a health check...) reach it as they come. The server cannot tell
    /// who sends those: their connections stay pending (see
    /// [`HttpServerConfig`]), and can be closed to make room for newer
    /// ones while they are handled. Serve a public route from another
    /// [`HttpServer`], on a listener of its own, so that its clients
    /// never contend with Synapse's processes.
    #[must_use]
    pub fn with_handler<F>(mut self, handler: F) -> HttpServer<R>
    where
        F: Fn(HttpRequest) -> BoxFuture<'static, HttpResponse> + Send + Sync + 'static,
    {
        self.shared_mut(|shared| shared.handler = Some(Arc::new(handler)));
        self
    }

    /// Serves `endpoint` of Synapse's replication HTTP API (see
    /// [`ReplicationEndpoint`]) with `handler`, as Synapse's
    /// `ReplicationEndpoint` does:
    ///
    /// - the path, method and secret are checked from the headers (404,
    ///   405, 401), then the body: a JSON object of at most
    ///   [`HttpServerConfig::max_request_bytes`] (400, 413), whose
    ///   `_INT_STREAM_POS` are checked (see
    ///   [`ReplicationApi`](crate::http::ReplicationApi)) and taken
    ///   out of the content the handler gets;
    /// - the server waits until this process's follower has seen the
    ///   caller's positions ([`with_waiter`](Self::with_waiter)),
    ///   five seconds at most, then handles the call anyway, as Synapse
    ///   does;
    /// - for an endpoint that caches, the handler runs once per txn id,
    ///   to its end: apart from the call's connection, so that neither a
    ///   caller that goes away nor the request timeout cancels it (as
    ///   Synapse's `ResponseCache` lets the first run finish). Its answer
    ///   is kept 30 minutes under the txn id: a retry is answered, not
    ///   handled again, and a retry that comes while the run goes on
    ///   waits for it (within its own request timeout: 504 if the run is
    ///   not done by then, as Synapse answers). A refusal is not kept (as
    ///   Synapse forgets a failure: the next call with that txn id is
    ///   handled again); a txn id reused for another request is refused
    ///   (400). At most 10,000 calls are kept, answered or running (503
    ///   beyond, when all are running), and 16 wait for one run;
    /// - the handler's content is answered 200, a
    ///   [`ReplicationError`] with its status and Synapse's error body,
    ///   and no answer within [`HttpServerConfig::request_timeout`] 504
    ///   (the handler of an endpoint that does not cache, or of a call
    ///   without a txn id, is then dropped);
    /// - a 200 answer of an endpoint that waits for streams carries the
    ///   positions of the streams this process writes
    ///   ([`with_positions`](Self::with_positions)).
    ///
    /// Calls are counted in [`HttpServerCounters::handled`], refusals as
    /// the other requests' are.
    ///
    /// ```no_run
    /// # #[cfg(feature = "runtime-smol")]
    /// # async fn serve(server: synapse_replication::transport::HttpServer<synapse_replication::transport::SmolRuntime>) {
    /// use futures::FutureExt;
    /// use synapse_replication::http::{ReplicationEndpoint, ReplicationError};
    ///
    /// let server = server.with_endpoint(ReplicationEndpoint::fed_send_edu(), |call| {
    ///     async move {
    ///         if call.arg("edu_type") != Some("m.typing") {
    ///             return Err(ReplicationError::refused(400, "M_UNRECOGNIZED", "not handled here"));
    ///         }
    ///         // ... apply call.content["content"] ...
    ///         Ok(serde_json::Map::new())
    ///     }
    ///     .boxed()
    /// });
    /// server.run().await;
    /// # }
    /// ```
    #[must_use]
    pub fn with_endpoint<F>(mut self, endpoint: ReplicationEndpoint, handler: F) -> HttpServer<R>
    where
        F: Fn(
                ReplicationRequest,
            ) -> BoxFuture<
                'static,
                Result<serde_json::Map<String, serde_json::Value>, ReplicationError>,
            > + Send
            + Sync
            + 'static,
    {
        let handler: Arc<CallHandler> = Arc::new(handler);
        self.shared_mut(move |shared| {
            let fresh = shared.endpoint.replication_api();
            let writers = shared.writers.clone();
            let calls = shared.calls();
            let mut api = std::mem::replace(&mut calls.api, fresh).with_endpoint(endpoint);
            if let Some(writers) = writers {
                api = api.with_writers(writers);
            }
            calls.api = api;
            calls.handlers.push(handler);
        });
        self
    }

    /// Serves the six endpoints of Synapse's account-data writer
    /// (`add_user_account_data`, `remove_user_account_data`,
    /// `add_room_account_data`, `remove_room_account_data`, `add_tag`,
    /// `remove_tag`: see [`AccountDataRequest`]) with `handler`, for the
    /// users of `server_name`, as [`with_endpoint`](Self::with_endpoint)
    /// serves any endpoint (secret, body, the caller's positions waited
    /// for; none of the six caches, so a retried call is handled again, as
    /// Synapse's are).
    ///
    /// The handler gets each call typed, once
    /// [`AccountDataRequest::from_call`] has checked it (a malformed user
    /// or room id, a user of another server, an addition without a
    /// content object: Synapse's error answers, the handler not called),
    /// and answers the `account_data` position after the change, or a
    /// [`ReplicationError`]. Give the answers this process's positions
    /// ([`with_positions`](Self::with_positions), `account_data` among
    /// them): the caller waits for them.
    ///
    /// ```no_run
    /// # #[cfg(feature = "runtime-smol")]
    /// # async fn serve(server: synapse_replication::transport::HttpServer<synapse_replication::transport::SmolRuntime>) {
    /// use futures::FutureExt;
    /// use synapse_replication::http::{AccountDataAnswer, AccountDataRequest};
    /// use synapse_replication::wire::{StreamName, Token};
    ///
    /// let server = server
    ///     .with_account_data("example.com", |request| {
    ///         async move {
    ///             // ... write request.added() for request.user_id() ...
    ///             Ok(AccountDataAnswer { max_stream_id: Token(8) })
    ///         }
    ///         .boxed()
    ///     })
    ///     .with_positions(|| vec![(StreamName::AccountData, Token(8))]);
    /// server.run().await;
    /// # }
    /// ```
    #[must_use]
    pub fn with_account_data<F>(self, server_name: &str, handler: F) -> HttpServer<R>
    where
        F: Fn(
                AccountDataRequest,
            ) -> BoxFuture<'static, Result<AccountDataAnswer, ReplicationError>>
            + Send
            + Sync
            + 'static,
    {
        let handler = Arc::new(handler);
        let server_name: Arc<str> = Arc::from(server_name);
        AccountDataRequest::endpoints()
            .into_iter()
            .fold(self, |server, endpoint| {
                let (handler, server_name) = (Arc::clone(&handler), Arc::clone(&server_name));
                server.with_endpoint(endpoint, move |call| {
                    match AccountDataRequest::from_call(&call, &server_name) {
                        Ok(request) => {
                            let answer = handler(request);
                            Box::pin(async move { answer.await.map(|a| a.to_content()) })
                        }
                        Err(refusal) => Box::pin(future::ready(Err(refusal))),
                    }
                })
            })
    }

    /// Refuses calls whose `_INT_STREAM_POS` name a stream their caller
    /// may not write, as `writers` (the deployment's `stream_writers`)
    /// says (400 `M_FORBIDDEN`), rather than wait for them.
    /// [`from_synapse`](Self::from_synapse) sets the configuration's.
    #[must_use]
    pub fn with_writers(mut self, writers: Arc<dyn WriterRegistry>) -> HttpServer<R> {
        self.shared_mut(move |shared| {
            let fresh = shared.endpoint.replication_api();
            let calls = shared.calls();
            calls.api = std::mem::replace(&mut calls.api, fresh).with_writers(Arc::clone(&writers));
            shared.writers = Some(writers);
        });
        self
    }

    /// The answers of the replication endpoints carry `positions()`: this
    /// process's token on each stream it writes (Synapse's
    /// `minimal_local_current_token`), for the caller to wait for. Without
    /// it they carry none (`"_INT_STREAM_POS": {}`).
    #[must_use]
    pub fn with_positions<F>(mut self, positions: F) -> HttpServer<R>
    where
        F: Fn() -> Vec<(StreamName, Token)> + Send + Sync + 'static,
    {
        let positions: Arc<PositionsFn> = Arc::new(positions);
        self.shared_mut(move |shared| shared.calls().positions = Some(positions));
        self
    }

    /// Before handling a call, waits until this process's follower (the
    /// client `waiter` came from: [`RedisClient::waiter`](crate::transport::RedisClient::waiter))
    /// has applied the caller's positions, five seconds at most, then
    /// handles it anyway, as Synapse does.
    #[must_use]
    pub fn with_waiter(self, waiter: PositionWaiter) -> HttpServer<R> {
        self.with_position_waits(move |stream, writer, token, deadline| {
            waiter.reached_by(stream, writer, token, deadline)
        })
    }

    /// [`with_waiter`](Self::with_waiter) for a follower of the
    /// application's own: waits with `wait(stream, writer, token,
    /// deadline)` for each position the caller sent: a future that says
    /// `true` once this process's follower has seen `writer` reach `token`
    /// on `stream`, `false` when it gives up at `deadline`. Without it
    /// calls are handled at once.
    #[must_use]
    pub fn with_position_waits<F>(mut self, wait: F) -> HttpServer<R>
    where
        F: Fn(StreamName, InstanceName, Token, Instant) -> BoxFuture<'static, bool>
            + Send
            + Sync
            + 'static,
    {
        let wait: Arc<WaitFn> = Arc::new(wait);
        self.shared_mut(move |shared| shared.calls().waits = Some(wait));
        self
    }

    /// Serves HTTPS: the certificate and key are loaded, and rustls
    /// configured, now; each connection's handshake must then finish,
    /// and its headers arrive, within [`HttpServerConfig::header_timeout`]
    /// of its accept; a connection in its handshake is pending (see
    /// [`HttpServerConfig`]) like any connection without its headers. Fails with
    /// [`HttpServerTlsError::Unavailable`] in a build without the `tls`
    /// feature, and with the file or the reason for a certificate or key
    /// that does not do.
    pub fn with_tls(mut self, tls: &HttpServerTls) -> Result<HttpServer<R>, HttpServerTlsError> {
        #[cfg(feature = "tls")]
        {
            let config = Arc::new(tls::server_config(tls)?);
            let acceptor = futures_rustls::TlsAcceptor::from(config);
            self.shared_mut(|shared| shared.tls = Some(acceptor));
            Ok(self)
        }
        #[cfg(not(feature = "tls"))]
        {
            let _ = (&mut self, tls);
            Err(HttpServerTlsError::Unavailable)
        }
    }

    /// The address listened on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// What the server did so far (a handle: it can be read while
    /// [`run`](HttpServer::run) runs).
    pub fn counters(&self) -> HttpServerCounters {
        self.shared.counters.clone()
    }

    fn shared_mut(&mut self, change: impl FnOnce(&mut Shared)) {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            change(shared);
        }
    }

    /// Accepts and serves connections, until dropped. Accept errors are
    /// logged and accepting resumes after
    /// [`HttpServerConfig::accept_pause`].
    pub async fn run(self) {
        let HttpServer {
            runtime,
            mut listener,
            shared,
        } = self;
        let slots = Arc::new(Mutex::new(Slots::new(
            shared.config.max_pending,
            shared.config.max_concurrent,
        )));
        // Each ends with its connection's id.
        let mut connections: FuturesUnordered<BoxFuture<'static, u64>> = FuturesUnordered::new();
        // To close a pending connection to make room.
        let mut closers: HashMap<u64, AbortHandle> = HashMap::new();
        let mut pause: Option<BoxFuture<'static, ()>> = None;
        // The handlers of calls with a txn id, run to their end whatever
        // their connections do.
        let mut queued_runs = shared.calls.as_ref().and_then(Calls::take_runs);
        let mut runs: FuturesUnordered<BoxFuture<'static, ()>> = FuturesUnordered::new();
        poll_fn(|cx| {
            loop {
                while let Some(Poll::Ready(Some(run))) =
                    queued_runs.as_mut().map(|queue| queue.poll_next_unpin(cx))
                {
                    runs.push(run);
                }
                while let Poll::Ready(Some(())) = runs.poll_next_unpin(cx) {}
                // Polled after each accept: a request whose headers are
                // in already is admitted before the next accept can take
                // its slot.
                while let Poll::Ready(Some(id)) = connections.poll_next_unpin(cx) {
                    closers.remove(&id);
                    lock(&slots).close(id);
                }
                if let Some(sleep) = &mut pause {
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    pause = None;
                }
                let (socket, peer) = match listener.poll_accept(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(connection)) => connection,
                    Poll::Ready(Err(error)) => {
                        tracing::warn!(%error, "replication HTTP server: accept failed");
                        let deadline = deadline_after(runtime.now(), shared.config.accept_pause);
                        pause = Some(runtime.sleep_until(deadline));
                        continue;
                    }
                };
                let (id, evicted) = lock(&slots).open();
                if let Some(closer) = evicted.and_then(|evicted| closers.remove(&evicted)) {
                    closer.abort();
                    shared.counters.inner.busy.fetch_add(1, Ordering::Relaxed);
                    shared.log_refusal(&*runtime, peer, Refusal::Evicted);
                }
                let ticket = Ticket {
                    slots: Arc::clone(&slots),
                    id,
                };
                let work = serve(
                    Arc::clone(&runtime),
                    Arc::clone(&shared),
                    socket,
                    peer,
                    ticket,
                );
                let (work, closer) = future::abortable(work);
                closers.insert(id, closer);
                connections.push(Box::pin(async move {
                    let _ = work.await;
                    id
                }));
            }
        })
        .await
    }
}

/// A connection's place in the server's [`Slots`].
struct Ticket {
    slots: Arc<Mutex<Slots>>,
    id: u64,
}

impl Ticket {
    /// Its request came with the secret: no longer closed for room, if
    /// there is a slot for it.
    fn admit(&self) -> Admission {
        lock(&self.slots).admit(self.id)
    }
}

fn lock(slots: &Mutex<Slots>) -> std::sync::MutexGuard<'_, Slots> {
    slots.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One connection: one request, its handshake and headers within the
/// header timeout, all of it within the request timeout.
async fn serve<R: Runtime>(
    runtime: Arc<R>,
    shared: Arc<Shared>,
    socket: BoxConnection,
    peer: SocketAddr,
    ticket: Ticket,
) {
    let accepted = runtime.now();
    let config = &shared.config;
    let deadline = deadline_after(accepted, config.request_timeout);
    let headers_by = deadline_after(accepted, config.header_timeout.min(config.request_timeout));
    let Some(socket) = shared.secure(&*runtime, socket, peer, headers_by).await else {
        return;
    };
    let max_buf = config.max_request_bytes.max(MIN_BUFFER);
    // hyper calls the service once the headers are in.
    let headers_in = Arc::new(AtomicBool::new(false));
    let ticket = Arc::new(ticket);
    let service = {
        let runtime = Arc::clone(&runtime);
        let shared = Arc::clone(&shared);
        let headers_in = Arc::clone(&headers_in);
        service_fn(move |request| {
            headers_in.store(true, Ordering::Relaxed);
            let shared = Arc::clone(&shared);
            let runtime = Arc::clone(&runtime);
            let ticket = Arc::clone(&ticket);
            async move {
                let answer = shared
                    .answer(&runtime, request, peer, deadline, &ticket)
                    .await;
                Ok::<_, Infallible>(response(answer))
            }
        })
    };
    let connection = http1::Builder::new()
        .keep_alive(false)
        .max_buf_size(max_buf)
        .max_headers(100)
        .serve_connection(HyperIo::new(socket, READ_CHUNK), service);
    let mut connection = pin!(connection);
    let early = runtime.sleep_until(headers_by);
    let done = match future::select(connection.as_mut(), early).await {
        Either::Left((done, _)) => Some(done),
        Either::Right(((), _)) if !headers_in.load(Ordering::Relaxed) => {
            let counts = &shared.counters.inner;
            counts.bad_requests.fetch_add(1, Ordering::Relaxed);
            shared.log_refusal(&*runtime, peer, Refusal::HeaderTimeout);
            return;
        }
        Either::Right(((), _)) => None,
    };
    let done = match done {
        Some(done) => Some(done),
        // A little longer than the answer's own deadline, to send a 504.
        None => {
            let cut = runtime.sleep_until(deadline + Duration::from_secs(1));
            match future::select(connection, cut).await {
                Either::Left((done, _)) => Some(done),
                Either::Right(((), _)) => None,
            }
        }
    };
    match done {
        Some(Err(error)) => tracing::debug!(%peer, %error, "replication HTTP connection failed"),
        Some(Ok(())) => {}
        None => tracing::debug!(%peer, "replication HTTP connection timed out"),
    }
}

/// Why a request or connection was refused, as logged.
enum Refusal<'a> {
    /// The request was read, and refused (`error` says why).
    Request {
        path: &'a str,
        error: &'a dyn fmt::Display,
    },
    /// The oldest pending connection was closed for this peer's: more
    /// than [`HttpServerConfig::max_pending`] were open.
    Evicted,
    /// [`HttpServerConfig::max_concurrent`] requests were in flight.
    Busy,
    /// The body was not in within [`HttpServerConfig::body_timeout`].
    BodyTimeout,
    /// The handshake and headers took longer than
    /// [`HttpServerConfig::header_timeout`].
    HeaderTimeout,
}

/// The answer as hyper sends it: JSON, never cached.
fn response((status, body): (u16, String)) -> hyper::Response<String> {
    let mut response = hyper::Response::new(body);
    *response.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-store, must-revalidate"),
    );
    response
}

impl Shared {
    /// Whether connections are served over TLS.
    fn https(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// The connection as served: over TLS once its handshake finished by
    /// `deadline` (HTTPS), as accepted otherwise; `None` when the
    /// handshake failed.
    async fn secure<R: Runtime>(
        &self,
        runtime: &R,
        socket: BoxConnection,
        peer: SocketAddr,
        deadline: Instant,
    ) -> Option<BoxConnection> {
        #[cfg(feature = "tls")]
        if let Some(acceptor) = &self.tls {
            let handshake = pin!(acceptor.accept(socket));
            let failed = match future::select(handshake, runtime.sleep_until(deadline)).await {
                Either::Left((Ok(stream), _)) => return Some(Box::new(stream)),
                Either::Left((Err(error), _)) => error.to_string(),
                Either::Right(((), _)) => "timed out".to_owned(),
            };
            let counts = &self.counters.inner;
            counts.handshakes_failed.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, error = %failed, "replication HTTPS handshake failed");
            return None;
        }
        let _ = (runtime, peer, deadline);
        Some(socket)
    }

    /// The status and body for one request; its connection admitted
    /// (`ticket`) once its headers prove it one of the deployment's.
    async fn answer<R: Runtime + Clone>(
        &self,
        runtime: &R,
        request: hyper::Request<Incoming>,
        peer: SocketAddr,
        deadline: Instant,
        ticket: &Ticket,
    ) -> (u16, String) {
        let counts = &self.counters.inner;
        let routed = {
            let uri = request.uri();
            let authorization = request
                .headers()
                .get_all(header::AUTHORIZATION)
                .iter()
                .map(HeaderValue::as_bytes);
            self.endpoint.route(
                request.method().as_str(),
                uri.path(),
                uri.query(),
                authorization,
            )
        };
        let request_out = match routed {
            Ok(Routed::Answer(page)) => {
                counts.pages.fetch_add(1, Ordering::Relaxed);
                return (200, page_body(&page));
            }
            Ok(Routed::Fetch(request)) => request,
            Err(EndpointError::NotFound)
                if self
                    .calls
                    .as_ref()
                    .is_some_and(|calls| calls.api.serves(request.uri().path())) =>
            {
                return self.call(runtime, request, peer, deadline, ticket).await;
            }
            Err(EndpointError::NotFound) if self.handler.is_some() => {
                // Another replication route: its secret before its body.
                // Other routes prove nothing: they stay pending.
                if request.uri().path().starts_with(REPLICATION_PREFIX) {
                    if let Err(error) = self.authorize(request.headers()) {
                        return self.refused(runtime, &request, peer, &error);
                    }
                    if ticket.admit() == Admission::Busy {
                        return self.busy(runtime, peer);
                    }
                }
                return self.handle(runtime, request, peer, deadline).await;
            }
            Err(error) => return self.refused(runtime, &request, peer, &error),
        };
        if ticket.admit() == Admission::Busy {
            return self.busy(runtime, peer);
        }
        tracing::debug!(%peer, request = %request_out, "catch-up request");
        let fetch = self.source.fetch(request_out.clone());
        let sleep = runtime.sleep_until(deadline);
        match future::select(fetch, sleep).await {
            Either::Left((Ok(page), _)) => {
                counts.pages.fetch_add(1, Ordering::Relaxed);
                (200, page_body(&page))
            }
            Either::Left((Err(error), _)) => {
                counts.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, request = %request_out, %error, "catch-up source failed");
                (500, internal_error_body())
            }
            Either::Right(((), _)) => {
                counts.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, request = %request_out, "catch-up source timed out");
                (504, HttpResponse::error(504, "M_UNKNOWN", "Timed out").body)
            }
        }
    }

    /// The endpoint's secret check, for a request to another replication
    /// route: the catch-up route's, with this request's `Authorization`
    /// headers (any error but theirs means the secret passed).
    fn authorize(&self, headers: &HeaderMap) -> Result<(), EndpointError> {
        let authorization = headers
            .get_all(header::AUTHORIZATION)
            .iter()
            .map(HeaderValue::as_bytes);
        match self
            .endpoint
            .route("GET", SECRET_PROBE, None, authorization)
        {
            Err(
                error @ (EndpointError::MissingAuthorization
                | EndpointError::TooManyAuthorizations
                | EndpointError::InvalidAuthorization),
            ) => Err(error),
            _ => Ok(()),
        }
    }

    /// The answer to a request refused for `error`, counted and logged.
    fn refused<R: Runtime, B>(
        &self,
        runtime: &R,
        request: &hyper::Request<B>,
        peer: SocketAddr,
        error: &EndpointError,
    ) -> (u16, String) {
        let secret = matches!(
            error,
            EndpointError::MissingAuthorization
                | EndpointError::TooManyAuthorizations
                | EndpointError::InvalidAuthorization
        );
        self.count_refusal(runtime, request.uri().path(), peer, error, secret);
        (error.status(), error.body())
    }

    /// The answer to a call refused for `error`, counted and logged.
    fn refused_call<R: Runtime>(
        &self,
        runtime: &R,
        path: &str,
        peer: SocketAddr,
        error: &ReplicationError,
    ) -> (u16, String) {
        let secret = matches!(
            error,
            ReplicationError::MissingAuthorization
                | ReplicationError::TooManyAuthorizations
                | ReplicationError::InvalidAuthorization
        );
        self.count_refusal(runtime, path, peer, error, secret);
        (error.status(), error.body())
    }

    /// Counts a refused request (for its secret, or as a bad request) and
    /// logs it.
    fn count_refusal<R: Runtime>(
        &self,
        runtime: &R,
        path: &str,
        peer: SocketAddr,
        error: &dyn fmt::Display,
        secret: bool,
    ) {
        let counts = &self.counters.inner;
        let counter = if secret {
            &counts.refused_secret
        } else {
            &counts.bad_requests
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.log_refusal(runtime, peer, Refusal::Request { path, error });
    }

    /// The replication endpoints, made when the first is added.
    fn calls(&mut self) -> &mut Calls {
        let api = self.endpoint.replication_api();
        self.calls.get_or_insert_with(|| Calls::new(api))
    }

    /// A call of the replication HTTP API: its headers checked before its
    /// body is read, then its body, then [`Calls::answer`].
    async fn call<R: Runtime + Clone>(
        &self,
        runtime: &R,
        request: hyper::Request<Incoming>,
        peer: SocketAddr,
        deadline: Instant,
        ticket: &Ticket,
    ) -> (u16, String) {
        let Some(calls) = &self.calls else {
            return (404, EndpointError::NotFound.body());
        };
        let path = request.uri().path().to_owned();
        let routed = {
            let authorization = request
                .headers()
                .get_all(header::AUTHORIZATION)
                .iter()
                .map(HeaderValue::as_bytes);
            calls
                .api
                .route(request.method().as_str(), &path, authorization)
        };
        let route = match routed {
            Ok(route) => route,
            Err(error) => return self.refused_call(runtime, &path, peer, &error),
        };
        if ticket.admit() == Admission::Busy {
            return self.busy(runtime, peer);
        }
        let query = request.uri().query().map(str::to_owned);
        let (parts, mut body) = request.into_parts();
        let body = match self
            .read_body(runtime, &parts.headers, &mut body, peer, deadline)
            .await
        {
            Ok(body) => body,
            Err(answer) => return answer,
        };
        let call = match calls.api.read(route, query.as_deref(), &body) {
            Ok(call) => call,
            Err(error) => return self.refused_call(runtime, &path, peer, &error),
        };
        self.counters.inner.handled.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%peer, endpoint = call.endpoint, "replication call");
        calls.answer(runtime, call, &body, deadline).await
    }

    /// The answer to a request with the secret beyond
    /// [`HttpServerConfig::max_concurrent`], counted and logged.
    fn busy<R: Runtime>(&self, runtime: &R, peer: SocketAddr) -> (u16, String) {
        self.counters.inner.busy.fetch_add(1, Ordering::Relaxed);
        self.log_refusal(runtime, peer, Refusal::Busy);
        let answer = HttpResponse::error(503, "M_UNKNOWN", "Too many requests in flight");
        (answer.status, answer.body)
    }

    /// A request's body, whole, if it is at most
    /// [`HttpServerConfig::max_request_bytes`] and in within
    /// [`HttpServerConfig::body_timeout`] (and by `deadline`); the answer
    /// to give otherwise (413, 408, or 400 when it cannot be read).
    async fn read_body<R: Runtime>(
        &self,
        runtime: &R,
        headers: &HeaderMap,
        body: &mut Incoming,
        peer: SocketAddr,
        deadline: Instant,
    ) -> Result<Bytes, (u16, String)> {
        let counts = &self.counters.inner;
        let cap = self.config.max_request_bytes;
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok());
        let too_large = || {
            counts.bad_requests.fetch_add(1, Ordering::Relaxed);
            let answer = HttpResponse::error(413, "M_TOO_LARGE", "Request body too large");
            (answer.status, answer.body)
        };
        if declared.is_some_and(|len| len > cap as u64) {
            return Err(too_large());
        }
        // However slowly it comes, as the headers are bounded.
        let by = deadline_after(runtime.now(), self.config.body_timeout).min(deadline);
        let read = match future::select(pin!(collect(body, cap)), runtime.sleep_until(by)).await {
            Either::Left((read, _)) => read,
            Either::Right(((), _)) => {
                counts.bad_requests.fetch_add(1, Ordering::Relaxed);
                self.log_refusal(runtime, peer, Refusal::BodyTimeout);
                let answer = HttpResponse::error(408, "M_UNKNOWN", "Request body not in time");
                return Err((answer.status, answer.body));
            }
        };
        match read {
            Ok(Some(bytes)) => Ok(bytes),
            Ok(None) => Err(too_large()),
            Err(error) => {
                counts.bad_requests.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%peer, %error, "reading a request body failed");
                let answer = HttpResponse::error(400, "M_BAD_JSON", "Unreadable body");
                Err((answer.status, answer.body))
            }
        }
    }

    /// Logs a refusal, unless this minute's few are logged already; never
    /// a header, and the path cut short.
    fn log_refusal<R: Runtime>(&self, runtime: &R, peer: SocketAddr, refusal: Refusal<'_>) {
        let verdict = self
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(runtime.now());
        let unlogged = match verdict {
            Verdict::Log { unlogged } => unlogged,
            Verdict::FirstUnlogged => {
                tracing::info!(
                    "more replication HTTP refusals this minute: counted, not logged (at most {LOG_BURST} are logged every {}s)",
                    LOG_WINDOW.as_secs()
                );
                return;
            }
            Verdict::Unlogged => return,
        };
        if unlogged > 0 {
            tracing::info!(
                unlogged,
                "replication HTTP refusals were counted but not logged"
            );
        }
        match refusal {
            Refusal::Request { path, error } => {
                let path = short_path(path);
                tracing::info!(%peer, path = path.as_str(), %error, "refused replication request");
            }
            Refusal::Evicted => tracing::info!(
                %peer,
                max_pending = self.config.max_pending,
                "replication HTTP server full of connections without a request with the secret: \
                 closed the oldest to make room for this peer's"
            ),
            Refusal::Busy => tracing::info!(
                %peer,
                max_concurrent = self.config.max_concurrent,
                "replication HTTP server busy: refusing"
            ),
            Refusal::HeaderTimeout => tracing::info!(
                %peer,
                "replication HTTP connection closed: its headers were not in within the header timeout"
            ),
            Refusal::BodyTimeout => tracing::info!(
                %peer,
                "replication HTTP request refused: its body was not in within the body timeout"
            ),
        }
    }

    /// Another route: the application's handler, with the body read whole.
    async fn handle<R: Runtime>(
        &self,
        runtime: &R,
        request: hyper::Request<Incoming>,
        peer: SocketAddr,
        deadline: Instant,
    ) -> (u16, String) {
        let Some(handler) = &self.handler else {
            return (404, EndpointError::NotFound.body());
        };
        let counts = &self.counters.inner;
        let (parts, mut body) = request.into_parts();
        let body = match self
            .read_body(runtime, &parts.headers, &mut body, peer, deadline)
            .await
        {
            Ok(body) => body,
            Err(answer) => return answer,
        };
        let request = HttpRequest {
            method: parts.method.as_str().to_owned(),
            path: parts.uri.path().to_owned(),
            query: parts.uri.query().map(str::to_owned),
            headers: parts
                .headers
                .iter()
                .map(|(name, value)| {
                    (
                        name.as_str().to_owned(),
                        Bytes::copy_from_slice(value.as_bytes()),
                    )
                })
                .collect(),
            body,
            peer,
        };
        counts.handled.fetch_add(1, Ordering::Relaxed);
        let work = handler(request);
        match future::select(work, runtime.sleep_until(deadline)).await {
            Either::Left((answer, _)) => (answer.status, answer.body),
            Either::Right(((), _)) => {
                let answer = HttpResponse::error(504, "M_UNKNOWN", "Timed out");
                (answer.status, answer.body)
            }
        }
    }
}

/// Building the rustls server configuration (feature `tls`).
#[cfg(feature = "tls")]
mod tls {
    use std::sync::Arc;

    use futures_rustls::rustls::server::WebPkiClientVerifier;
    use futures_rustls::rustls::{self, RootCertStore, ServerConfig};

    use super::{HttpServerTls, HttpServerTlsError};
    use crate::transport::net::pem::{PemFileError, certificates, private_key};

    impl From<PemFileError> for HttpServerTlsError {
        fn from(error: PemFileError) -> HttpServerTlsError {
            let PemFileError { what, path, reason } = error;
            HttpServerTlsError::File { what, path, reason }
        }
    }

    fn refused(error: impl ToString) -> HttpServerTlsError {
        HttpServerTlsError::Tls(error.to_string())
    }

    /// rustls with the ring provider, its safe default protocol versions,
    /// the certificate chain and key, and client certificates required
    /// when a CA for them is given.
    pub(super) fn server_config(tls: &HttpServerTls) -> Result<ServerConfig, HttpServerTlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certificates(&tls.certificate_file, "certificate_file")?;
        let key = private_key(&tls.private_key_file, "private_key_file")?;
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(refused)?;
        let builder = match &tls.client_ca_file {
            None => builder.with_no_client_auth(),
            Some(ca_file) => {
                let mut roots = RootCertStore::empty();
                for certificate in certificates(ca_file, "client_ca_file")? {
                    roots
                        .add(certificate)
                        .map_err(|error| HttpServerTlsError::File {
                            what: "client_ca_file",
                            path: ca_file.clone(),
                            reason: error.to_string(),
                        })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(refused)?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        builder.with_single_cert(chain, key).map_err(refused)
    }
}

/// Reads `body` whole, if it is at most `cap` bytes (`None` if larger).
async fn collect(body: &mut Incoming, cap: usize) -> Result<Option<Bytes>, hyper::Error> {
    let mut bytes = BytesMut::new();
    while let Some(frame) = poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
        let Ok(data) = frame?.into_data() else {
            continue; // trailers
        };
        if data.len() > cap - bytes.len() {
            return Ok(None);
        }
        bytes.extend_from_slice(&data);
    }
    Ok(Some(bytes.freeze()))
}
