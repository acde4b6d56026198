//! Catch-up over Synapse's HTTP replication endpoint (feature
//! `http-catch-up`): [`HttpCatchUp`], a [`CatchUpSource`] that fetches
//! each page with `GET /_synapse/replication/get_repl_stream_updates/...`
//! from the writer's `instance_map` address, as a Synapse worker does.
//!
//! HTTP/1.1 is hyper's client (`hyper::client::conn::http1`), run over a
//! [`Runtime`] connection: no executor, no tokio runtime, so it works on
//! smol and tokio alike. The connection task is polled alongside the
//! request, and each page uses a fresh connection.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::future::{Future, poll_fn};
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use futures::future::{self, Either};
use hyper::body::{Body, Incoming};
use hyper::client::conn::http1;
use hyper::header::{self, HeaderValue};

use crate::positions::{CatchUpPage, CatchUpPageError, CatchUpRequest};
use crate::wire::{InstanceName, StreamName, snippet};

use super::hyper_io::HyperIo;
use crate::config::{InstanceLocation, StreamWriters, SynapseConfig, TlsCache, TlsConfig};
use crate::positions::BoxError;
use crate::transport::client::source::CatchUpSource;
use crate::transport::net::dial;
use crate::transport::runtime::{BoxConnection, BoxFuture, Runtime};

/// How long one page may take, connecting included, by default.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest answer accepted by default, in bytes.
const DEFAULT_MAX_BODY: usize = 64 * 1024 * 1024;

/// How much of an error answer (non-2xx) is read, to quote it.
const ERROR_BODY_CAP: usize = 4096;

/// Memory reserved up front for an answer, whatever its declared length.
const INITIAL_BODY_CAPACITY: usize = 1024 * 1024;

/// The size of the buffer bytes are read into before hyper copies them.
const READ_CHUNK: usize = 32 * 1024;

type Locate = dyn Fn(&InstanceName) -> Option<InstanceLocation> + Send + Sync;

/// A [`CatchUpSource`] that asks the writer itself, over Synapse's HTTP
/// replication endpoint, as Synapse's workers do.
///
/// Each [`fetch`](CatchUpSource::fetch) sends
/// `GET /_synapse/replication/get_repl_stream_updates/<stream>/<txn_id>?from_token=A&upto_token=B`
/// (see [`CatchUpRequest::path`]) to the writer's `instance_map` address,
/// with `Authorization: Bearer <worker_replication_secret>` when a secret
/// is configured, and a fresh `txn_id` every time (Synapse caches answers
/// per `txn_id`). The page is what the server answered: nothing is made up
/// and nothing is dropped. Synapse's answers do not always keep to the
/// range asked for (`caches` rows reach beyond `upto_token`); the
/// [`Follower`](crate::positions::Follower) skips rows outside its request
/// and never takes an `upto_token` for a position.
///
/// Every error (no address, refused connection, timeout, a non-2xx status,
/// an answer that is not Synapse's JSON or is larger than the cap) is an
/// [`HttpCatchUpError`]; the driver retries with backoff. The secret never
/// appears in errors, logs or `Debug` output.
///
/// HTTP over TCP (`{host, port}`) or a unix socket (`{path}`, through
/// [`Runtime::connect_unix`]), and HTTPS for entries with `tls: true`
/// (feature `tls`; see [`HttpCatchUp::with_tls`]).
///
/// ```no_run
/// # #[cfg(feature = "runtime-smol")]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use synapse_replication::config::StreamWriters;
/// use synapse_replication::positions::Follower;
/// use synapse_replication::session::TcpClientSession;
/// use synapse_replication::transport::{HttpCatchUp, SmolRuntime, TcpClient};
/// use synapse_replication::wire::InstanceName;
///
/// let writers = Arc::new(StreamWriters::from_json(r#"{
///     "instance_map": {"main": {"host": "127.0.0.1", "port": 9093}}
/// }"#)?);
/// let catch_up = HttpCatchUp::new(SmolRuntime, writers.clone(), Some("secret".into()))
///     .with_timeout(Duration::from_secs(10));
/// let follower = Follower::new(InstanceName::from("worker1"), writers);
/// let session = TcpClientSession::new("example.com", follower)?;
/// let client = TcpClient::new(SmolRuntime, "127.0.0.1:9092", session)
///     .with_catch_up(Arc::new(catch_up));
/// # drop(client);
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "runtime-smol"))]
/// # fn main() {}
/// ```
pub struct HttpCatchUp<R: Runtime> {
    shared: Arc<Shared<R>>,
    https: Arc<Https>,
    timeout: Duration,
    max_body: usize,
}

/// How writers are reached: the dialer, with the TLS settings for
/// `https` writers and their client, whose certificates are loaded once
/// for every writer.
#[derive(Default)]
pub(super) struct Https {
    pub(super) tls: TlsConfig,
    pub(super) cache: TlsCache,
}

impl Https {
    /// A connection to a writer's `instance_map` entry, through the same
    /// dialer as Redis': TLS (the `tls` feature, rustls, always verified)
    /// when the entry says `tls: true`. The request's own time limit
    /// bounds it.
    pub(super) fn connect(
        &self,
        runtime: &dyn Runtime,
        location: &InstanceLocation,
    ) -> BoxFuture<'static, io::Result<BoxConnection>> {
        let tls = matches!(location, InstanceLocation::Tcp { tls: true, .. })
            .then_some((&self.tls, &self.cache));
        dial::connect(runtime, &location.endpoint(), tls, None)
    }
}

struct Shared<R> {
    runtime: R,
    locate: Box<Locate>,
    /// `Bearer <secret>`, marked sensitive; `Some(Err)` when the secret
    /// cannot be a header value.
    authorization: Option<Result<HeaderValue, InvalidSecret>>,
}

#[derive(Clone, Copy, Debug)]
struct InvalidSecret;

impl<R: Runtime> HttpCatchUp<R> {
    /// Fetches from the addresses of `writers`' `instance_map` (where
    /// `main` is `master`), with Synapse's `worker_replication_secret`
    /// (`None` when the deployment has none).
    pub fn new(runtime: R, writers: Arc<StreamWriters>, secret: Option<String>) -> HttpCatchUp<R> {
        HttpCatchUp::with_locator(
            runtime,
            move |instance: &InstanceName| writers.location(instance).cloned(),
            secret,
        )
    }

    /// Fetches from the writers of the deployment `synapse` describes, at
    /// their `instance_map` addresses, with its replication secret.
    pub fn from_synapse(runtime: R, synapse: &SynapseConfig) -> HttpCatchUp<R> {
        HttpCatchUp::new(
            runtime,
            synapse.writers().clone(),
            synapse.replication_secret().map(str::to_owned),
        )
    }

    /// Fetches from the addresses `locate` gives (an `instance_map` of your
    /// own, service discovery). When it knows no `master`, `main` is asked
    /// for instead.
    pub fn with_locator<F>(runtime: R, locate: F, secret: Option<String>) -> HttpCatchUp<R>
    where
        F: Fn(&InstanceName) -> Option<InstanceLocation> + Send + Sync + 'static,
    {
        let authorization = secret.map(|secret| {
            let mut value =
                HeaderValue::from_str(&format!("Bearer {secret}")).map_err(|_| InvalidSecret)?;
            value.set_sensitive(true);
            Ok(value)
        });
        HttpCatchUp {
            shared: Arc::new(Shared {
                runtime,
                locate: Box::new(locate),
                authorization,
            }),
            https: Arc::default(),
            timeout: DEFAULT_TIMEOUT,
            max_body: DEFAULT_MAX_BODY,
        }
    }

    /// How writers whose `instance_map` entry says `tls: true` are reached:
    /// the CA to trust (`ca_file`, `ca_path`; the system's roots when
    /// neither is set), a client certificate, a server name. HTTPS needs
    /// the `tls` feature; without it such a fetch fails with a
    /// [`HttpCatchUpError::Connect`] that says so. Certificates are always
    /// verified.
    pub fn with_tls(mut self, tls: TlsConfig) -> HttpCatchUp<R> {
        self.https = Arc::new(Https {
            tls,
            cache: TlsCache::default(),
        });
        self
    }

    /// How long one page may take, from connecting to the last byte of the
    /// answer (30 s unless set).
    pub fn with_timeout(mut self, timeout: Duration) -> HttpCatchUp<R> {
        self.timeout = timeout;
        self
    }

    /// The largest answer accepted, in bytes (64 MiB unless set); a larger
    /// one is refused with
    /// [`HttpCatchUpError::BodyTooLarge`] before it is all read.
    pub fn with_max_body(mut self, bytes: usize) -> HttpCatchUp<R> {
        self.max_body = bytes;
        self
    }
}

impl<R: Runtime> Clone for HttpCatchUp<R> {
    fn clone(&self) -> Self {
        HttpCatchUp {
            shared: Arc::clone(&self.shared),
            https: Arc::clone(&self.https),
            timeout: self.timeout,
            max_body: self.max_body,
        }
    }
}

impl<R: Runtime> fmt::Debug for HttpCatchUp<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secret = match self.shared.authorization {
            None => "none",
            Some(_) => "<redacted>",
        };
        f.debug_struct("HttpCatchUp")
            .field("secret", &secret)
            .field("timeout", &self.timeout)
            .field("max_body", &self.max_body)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl<R: Runtime> CatchUpSource for HttpCatchUp<R> {
    async fn fetch(&self, request: CatchUpRequest) -> Result<CatchUpPage, BoxError> {
        let shared = &self.shared;
        let https = &self.https;
        let (timeout, max_body) = (self.timeout, self.max_body);
        let deadline = shared.runtime.now().checked_add(timeout);
        let sleep = match deadline {
            Some(deadline) => shared.runtime.sleep_until(deadline),
            None => Box::pin(future::pending()),
        };
        let exchange = pin!(shared.exchange(&request, https, max_body));
        let result = match future::select(exchange, sleep).await {
            Either::Left((result, _)) => result,
            Either::Right(((), _)) => Err(HttpCatchUpError::Timeout {
                stream: request.stream.clone(),
                writer: request.writer.clone(),
                timeout,
            }),
        };
        match &result {
            Ok(page) => tracing::debug!(
                stream = %request.stream,
                writer = %request.writer,
                from = %request.from,
                to = %request.to,
                rows = page.updates.len(),
                upto = %page.upto,
                limited = page.limited,
                "fetched catch-up page over HTTP"
            ),
            Err(error) => tracing::debug!(%error, "catch-up over HTTP failed"),
        }
        result.map_err(BoxError::from)
    }
}

/// What came back, before it is checked.
enum Answer {
    Page(Bytes),
    TooLarge,
    Status(u16, Bytes),
}

impl<R: Runtime> Shared<R> {
    async fn exchange(
        &self,
        request: &CatchUpRequest,
        https: &Https,
        max_body: usize,
    ) -> Result<CatchUpPage, HttpCatchUpError> {
        let fail = Failure::new(request);
        let location = (self.locate)(&request.writer)
            .or_else(|| {
                request
                    .writer
                    .is_master()
                    .then(|| (self.locate)(&InstanceName::from("main")))
                    .flatten()
            })
            .ok_or_else(|| fail.unknown_writer())?;
        let (address, host) = match &location {
            InstanceLocation::Tcp { host, port, .. } => {
                let authority = authority(host, *port);
                (authority.clone(), authority)
            }
            // HTTP/1.1 wants a Host; Synapse does not read it.
            InstanceLocation::Unix { path } => (path.clone(), String::from("localhost")),
        };
        let connect = https.connect(&self.runtime, &location);
        let authorization = match &self.authorization {
            None => None,
            Some(Ok(value)) => Some(value.clone()),
            Some(Err(InvalidSecret)) => return Err(fail.invalid_secret()),
        };

        let mut http_request = hyper::Request::get(request.path(&txn_id()))
            .header(header::HOST, host)
            .header(header::CONNECTION, "close")
            .body(String::new())
            .map_err(|error| fail.request(error))?;
        if let Some(value) = authorization {
            http_request
                .headers_mut()
                .insert(header::AUTHORIZATION, value);
        }

        let connection = connect
            .await
            .map_err(|source| fail.connect(&address, source))?;
        let (mut sender, connection) = http1::handshake(HyperIo::new(connection, READ_CHUNK))
            .await
            .map_err(|error| fail.request(error))?;
        let mut connection = pin!(connection);
        let answer = drive(connection.as_mut(), async {
            let response = sender.send_request(http_request).await?;
            let status = response.status();
            let declared = response
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.parse::<u64>().ok());
            let mut body = response.into_body();
            if !status.is_success() {
                // The status is the error; a broken body only loses the quote.
                let bytes = collect(&mut body, ERROR_BODY_CAP, declared)
                    .await
                    .map_or_else(|_| Bytes::new(), |(bytes, _)| bytes);
                return Ok(Answer::Status(status.as_u16(), bytes));
            }
            if declared.is_some_and(|len| len > max_body as u64) {
                return Ok(Answer::TooLarge);
            }
            match collect(&mut body, max_body, declared).await? {
                (bytes, true) => Ok(Answer::Page(bytes)),
                (_, false) => Ok(Answer::TooLarge),
            }
        })
        .await
        .map_err(|error| fail.request(error))?;

        match answer {
            Answer::Status(status, body) => Err(fail.status(status, &body)),
            Answer::TooLarge => Err(fail.too_large(max_body)),
            Answer::Page(body) => {
                CatchUpPage::from_json(body.clone()).map_err(|source| fail.page(source, &body))
            }
        }
    }
}

/// Polls `work` and the connection it needs together (hyper's client
/// connection is a future that does the I/O; without an executor to spawn
/// it on, whoever waits for the answer drives it).
pub(super) async fn drive<C, W, T>(mut connection: Pin<&mut C>, work: W) -> Result<T, hyper::Error>
where
    C: Future<Output = Result<(), hyper::Error>>,
    W: Future<Output = Result<T, hyper::Error>>,
{
    let mut work = pin!(work);
    let mut closed = false;
    poll_fn(|cx| {
        if let Poll::Ready(result) = work.as_mut().poll(cx) {
            return Poll::Ready(result);
        }
        if !closed {
            match connection.as_mut().poll(cx) {
                Poll::Ready(Ok(())) => {
                    // Closed cleanly: whatever it delivered is there now.
                    closed = true;
                    return work.as_mut().poll(cx);
                }
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Pending => {}
            }
        }
        Poll::Pending
    })
    .await
}

/// Reads `body` up to `cap` bytes: the bytes, and whether that was all.
pub(super) async fn collect(
    body: &mut Incoming,
    cap: usize,
    declared: Option<u64>,
) -> Result<(Bytes, bool), hyper::Error> {
    let reserve = declared
        .and_then(|len| usize::try_from(len).ok())
        .unwrap_or(0)
        .min(cap)
        .min(INITIAL_BODY_CAPACITY);
    let mut bytes = BytesMut::with_capacity(reserve);
    while let Some(frame) = poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
        let Ok(data) = frame?.into_data() else {
            continue; // trailers
        };
        let room = cap - bytes.len();
        if data.len() > room {
            bytes.extend_from_slice(&data[..room]);
            return Ok((bytes.freeze(), false));
        }
        bytes.extend_from_slice(&data);
    }
    Ok((bytes.freeze(), true))
}

/// `host:port`, with brackets around an IPv6 address.
pub(super) fn authority(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A transaction id no other request of this process or of another one
/// has used: a per-process random prefix, the time, and a counter.
pub(super) fn txn_id() -> String {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let millis = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis());
    let prefix = *PREFIX.get_or_init(|| {
        // std's hasher keys are random per process.
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        hasher.write_u128(millis);
        hasher.finish()
    });
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix:016x}-{millis:x}-{count:x}")
}

/// A catch-up over HTTP that failed. Every message names the stream and
/// the writer; none contains the secret.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpCatchUpError {
    /// The writer has no `instance_map` entry.
    #[error("catch-up of {stream} from {writer}: {writer} has no instance_map entry")]
    UnknownWriter {
        /// The stream.
        stream: StreamName,
        /// The writer.
        writer: InstanceName,
    },
    /// The secret cannot be sent in a header (it must be visible ASCII, as
    /// Synapse requires).
    #[error(
        "catch-up of {stream} from {writer}: worker_replication_secret is not a valid header value"
    )]
    InvalidSecret {
        /// The stream.
        stream: StreamName,
        /// The writer.
        writer: InstanceName,
    },
    /// Connecting to the writer failed.
    #[error("catch-up of {stream} from {writer}: cannot connect to {address}: {source}")]
    Connect {
        /// The stream.
        stream: StreamName,
        /// The writer.
        writer: InstanceName,
        /// `host:port`, or the unix socket's path.
        address: String,
        /// Why.
        source: io::Error,
    },
    /// The HTTP exchange failed (connection lost, not HTTP, a truncated
    /// answer).
    #[error("catch-up of {stream} from {writer}: HTTP request failed: {source}")]
    Request {
        /// The stream.
        stream: StreamName,
        /// The writer.
        writer: InstanceName,
        /// Why.
        source: BoxError,
    },
    /// No complete answer in time.
    #[error("catch-up of {stream} from {writer}: no answer within {timeout:?}")]
    Timeout {
        /// The stream.
        stream: StreamName,
        /// The writer.
        writer: InstanceName,
        /// The configured timeout.
        timeout: Duration,
    },
    /// The writer answered with a status other than 2xx (Synapse answers
    /// 500 to a missing or wrong secret, 400 to a stream it does not have).
    #[error("catch-up of {stream} from {writer}: HTTP status {status}: {body}")]
    Status {
        /// The stream.
        stream: StreamName,
        /// The writer.
        writer: InstanceName,
        /// The status code.
        status: u16,
        /// The start of the answer's body.
        body: String,
    },
    /// The answer is larger than the cap.
    #[error("catch-up of {stream} from {writer}: answer exceeds {limit} bytes")]
    BodyTooLarge {
        /// The stream.
        stream: StreamName,
        /// The writer.
        writer: InstanceName,
        /// The configured cap.
        limit: usize,
    },
    /// The answer is not Synapse's JSON.
    #[error("catch-up of {stream} from {writer}: {source}; answer: {body}")]
    Page {
        /// The stream.
        stream: StreamName,
        /// The writer.
        writer: InstanceName,
        /// What is wrong with it (boxed, to keep this error small).
        source: Box<CatchUpPageError>,
        /// The start of the answer.
        body: String,
    },
}

/// Builds the errors of one request.
struct Failure<'a> {
    request: &'a CatchUpRequest,
}

impl<'a> Failure<'a> {
    fn new(request: &'a CatchUpRequest) -> Failure<'a> {
        Failure { request }
    }

    fn names(&self) -> (StreamName, InstanceName) {
        (self.request.stream.clone(), self.request.writer.clone())
    }

    fn unknown_writer(&self) -> HttpCatchUpError {
        let (stream, writer) = self.names();
        HttpCatchUpError::UnknownWriter { stream, writer }
    }

    fn invalid_secret(&self) -> HttpCatchUpError {
        let (stream, writer) = self.names();
        HttpCatchUpError::InvalidSecret { stream, writer }
    }

    fn connect(&self, address: &str, source: io::Error) -> HttpCatchUpError {
        let (stream, writer) = self.names();
        HttpCatchUpError::Connect {
            stream,
            writer,
            address: address.to_owned(),
            source,
        }
    }

    fn request(&self, source: impl Into<BoxError>) -> HttpCatchUpError {
        let (stream, writer) = self.names();
        HttpCatchUpError::Request {
            stream,
            writer,
            source: source.into(),
        }
    }

    fn status(&self, status: u16, body: &[u8]) -> HttpCatchUpError {
        let (stream, writer) = self.names();
        HttpCatchUpError::Status {
            stream,
            writer,
            status,
            body: snippet(body),
        }
    }

    fn too_large(&self, limit: usize) -> HttpCatchUpError {
        let (stream, writer) = self.names();
        HttpCatchUpError::BodyTooLarge {
            stream,
            writer,
            limit,
        }
    }

    fn page(&self, source: CatchUpPageError, body: &[u8]) -> HttpCatchUpError {
        let (stream, writer) = self.names();
        HttpCatchUpError::Page {
            stream,
            writer,
            source: Box::new(source),
            body: snippet(body),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::time::Instant;

    use super::*;
    use crate::positions::CatchUpId;
    use crate::transport::Listener;
    use crate::wire::Token;

    /// A runtime whose connections all fail (no test here needs one).
    struct Offline;

    impl Runtime for Offline {
        fn connect(&self, addr: &str) -> BoxFuture<'static, io::Result<BoxConnection>> {
            let addr = addr.to_owned();
            Box::pin(async move {
                Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("offline: {addr}"),
                ))
            })
        }

        fn listen(&self, _: &str) -> BoxFuture<'static, io::Result<Box<dyn Listener>>> {
            Box::pin(async { Err(io::Error::from(io::ErrorKind::Unsupported)) })
        }

        fn sleep_until(&self, _: Instant) -> BoxFuture<'static, ()> {
            Box::pin(future::pending())
        }
    }

    fn request(writer: &str, from: i64, to: i64) -> CatchUpRequest {
        CatchUpRequest {
            id: CatchUpId(1),
            stream: StreamName::Typing,
            writer: InstanceName::from(writer),
            from: Token(from),
            to: Token(to),
        }
    }

    fn fetch(source: &HttpCatchUp<Offline>, request: CatchUpRequest) -> HttpCatchUpError {
        let error = smol::block_on(source.fetch(request)).unwrap_err();
        *error.downcast::<HttpCatchUpError>().unwrap()
    }

    #[test]
    fn txn_ids_are_fresh_and_need_no_quoting() {
        let ids: Vec<String> = (0..1000).map(|_| txn_id()).collect();
        assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len());
        for id in &ids {
            assert!(
                id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'),
                "{id}"
            );
            assert!(request("w", 1, 2).path(id).contains(&format!("/{id}?")));
        }
    }

    #[test]
    fn authority_brackets_ipv6() {
        assert_eq!(authority("127.0.0.1", 80), "127.0.0.1:80");
        assert_eq!(authority("synapse", 9093), "synapse:9093");
        assert_eq!(authority("::1", 9093), "[::1]:9093");
        assert_eq!(authority("[::1]", 9093), "[::1]:9093");
    }

    #[test]
    fn unknown_writers_are_errors_and_https_is_tls() {
        let writers = StreamWriters::from_json(
            r#"{"instance_map": {
                "tls": {"host": "h", "port": 1, "tls": true},
                "sock": {"path": "/run/s.sock"},
                "main": {"host": "h", "port": 2}
            }}"#,
        )
        .unwrap();
        let source = HttpCatchUp::new(Offline, Arc::new(writers), None);
        assert!(matches!(
            fetch(&source, request("nobody", 1, 2)),
            HttpCatchUpError::UnknownWriter { ref writer, .. } if writer.as_str() == "nobody"
        ));
        // An https entry goes through the TLS connector: here the offline
        // runtime refuses the TCP connection under it.
        let error = fetch(&source, request("tls", 1, 2));
        assert!(
            matches!(&error, HttpCatchUpError::Connect { address, .. } if address == "h:1"),
            "{error}"
        );
        let error = fetch(&source, request("sock", 1, 2));
        assert!(
            matches!(&error, HttpCatchUpError::Connect { address, source, .. }
                if address == "/run/s.sock" && source.kind() == io::ErrorKind::Unsupported),
            "{error}"
        );
        // `main` in instance_map is `master`.
        let error = fetch(&source, request("master", 1, 2));
        assert!(
            matches!(&error, HttpCatchUpError::Connect { address, .. } if address == "h:2"),
            "{error}"
        );
    }

    #[test]
    fn a_locator_without_master_is_asked_for_main() {
        let source = HttpCatchUp::with_locator(
            Offline,
            |name: &InstanceName| {
                (name.as_str() == "main").then(|| InstanceLocation::Tcp {
                    host: "::1".into(),
                    port: 7,
                    tls: false,
                })
            },
            None,
        );
        let error = fetch(&source, request("master", 1, 2));
        assert!(
            matches!(&error, HttpCatchUpError::Connect { address, .. } if address == "[::1]:7"),
            "{error}"
        );
    }

    #[test]
    fn the_secret_is_never_shown() {
        let writers =
            StreamWriters::from_json(r#"{"instance_map": {"main": {"host": "h", "port": 2}}}"#)
                .unwrap();
        let source = HttpCatchUp::new(Offline, Arc::new(writers), Some("hunter2".into()))
            .with_timeout(Duration::from_secs(5))
            .with_max_body(10);
        let debug = format!("{source:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(
            debug.contains("<redacted>") && debug.contains("5s"),
            "{debug}"
        );
        let error = fetch(&source, request("master", 1, 2));
        assert!(!format!("{error} {error:?}").contains("hunter2"));

        let bad = HttpCatchUp::with_locator(
            Offline,
            |_: &InstanceName| {
                Some(InstanceLocation::Tcp {
                    host: "h".into(),
                    port: 1,
                    tls: false,
                })
            },
            Some("new\nline".into()),
        );
        let error = fetch(&bad, request("w", 1, 2));
        assert!(
            matches!(error, HttpCatchUpError::InvalidSecret { .. }),
            "{error}"
        );
        assert!(!format!("{error} {error:?} {bad:?}").contains("new\nline"));
    }
}
