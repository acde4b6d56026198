//! `HttpServer` over plain HTTP, against real sockets: Synapse's request
//! is answered whatever its `Host`, the crate's own client reads the
//! answers, and what a peer may hold is bounded: requests too large, too
//! many at once, a slow source; headers that never finish, a wrong secret
//! with a body still to come, sockets held open or trickling headers from
//! the writer's own address (or several, or IPv6) that must not keep a
//! catch-up out, and a flood of refused requests in the log.

#![cfg(all(
    feature = "http-server",
    feature = "http-catch-up",
    feature = "runtime-smol",
    feature = "runtime-tokio"
))]

use std::fmt;
use std::future::Future;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use synapse_replication::positions::BoxError;

use futures::future::{self, Either};
use futures::{AsyncReadExt, AsyncWriteExt};
use synapse_replication::config::{InstanceLocation, SynapseConfig};
use synapse_replication::http::CatchUpEndpoint;
use synapse_replication::positions::{
    CatchUpId, CatchUpPage, CatchUpRequest, History, HistoryMode,
};
use synapse_replication::transport::{
    CatchUpSource, HttpCatchUp, HttpCatchUpError, HttpResponse, HttpServer, HttpServerConfig,
    SmolRuntime,
};
use synapse_replication::wire::{InstanceName, RawRow, StreamName, Token};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

const SECRET: &str = "s3cret";

/// Far beyond every bound the tests assert ("closed within 10 s"), so
/// that a connection closed in time was closed by the bound under test.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a test waits for the server to close a connection it should
/// close well before [`REQUEST_TIMEOUT`].
const CLOSED_WITHIN: Duration = Duration::from_secs(10);

fn history() -> Arc<Mutex<History>> {
    let mut history =
        History::new(100).with_mode(StreamName::Typing, HistoryMode::Keyed { key_len: 1 });
    for (token, row) in [
        (1, r#"["!a:x",["@u:x"]]"#),
        (2, r#"["!b:x",["@v:x"]]"#),
        (3, r#"["!a:x",[]]"#),
    ] {
        history
            .record(
                &StreamName::Typing,
                &InstanceName::from("rust1"),
                [(Token(token), RawRow::new(row).expect("a row"))],
            )
            .expect("recorded");
    }
    Arc::new(Mutex::new(history))
}

fn endpoint() -> CatchUpEndpoint {
    CatchUpEndpoint::new(InstanceName::from("rust1"), Some(SECRET.into()))
        .with_streams([StreamName::Typing])
}

/// Starts `server` on smol's executor; its address.
fn start(server: HttpServer<SmolRuntime>) -> SocketAddr {
    let addr = server.local_addr().expect("its address");
    smol::spawn(server.run()).detach();
    addr
}

async fn bind(source: Arc<dyn CatchUpSource>) -> HttpServer<SmolRuntime> {
    HttpServer::bind(SmolRuntime, "127.0.0.1:0", endpoint(), source)
        .await
        .expect("a listener")
}

/// Sends `request` as is; the whole answer (the server closes).
async fn raw(addr: SocketAddr, request: &[u8]) -> String {
    let mut socket = smol::net::TcpStream::connect(addr).await.expect("connects");
    socket.write_all(request).await.expect("writes");
    let mut answer = Vec::new();
    let _ = socket.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer).into_owned()
}

fn request(from: i64, to: i64) -> CatchUpRequest {
    CatchUpRequest {
        id: CatchUpId::new(1),
        stream: StreamName::Typing,
        writer: InstanceName::from("rust1"),
        from: Token(from),
        to: Token(to),
    }
}

fn client(addr: SocketAddr, secret: &str) -> HttpCatchUp<SmolRuntime> {
    let port = addr.port();
    HttpCatchUp::with_locator(
        SmolRuntime,
        move |_: &InstanceName| {
            Some(InstanceLocation::Tcp {
                host: "127.0.0.1".into(),
                port,
                tls: false,
            })
        },
        Some(secret.into()),
    )
    .with_timeout(Duration::from_secs(10))
}

/// Synapse's catch-up request, with `authorization` as the
/// `Authorization` header's value (none if `None`).
fn catch_up_get(txn_id: &str, authorization: Option<&str>) -> String {
    let authorization = authorization
        .map(|value| format!("Authorization: {value}\r\n"))
        .unwrap_or_default();
    format!(
        "GET /_synapse/replication/get_repl_stream_updates/typing/{txn_id}?from_token=1&upto_token=3 HTTP/1.1\r\n\
         Host: rust1:80\r\n{authorization}User-Agent: Synapse/1.163.2\r\n\r\n"
    )
}

/// A plain TCP connection to `addr` from the address `from` (any port):
/// on Linux every 127.0.0.0/8 address is the loopback's, so two of them
/// are two peers.
fn connect_from(from: Ipv4Addr, addr: SocketAddr) -> TcpStream {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("a runtime");
    let stream = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket
            .bind(SocketAddr::new(IpAddr::V4(from), 0))
            .expect("binds a loopback address");
        socket.connect(addr).await.expect("connects")
    });
    let stream = stream.into_std().expect("a std stream");
    stream.set_nonblocking(false).expect("blocking");
    stream
}

/// Reads `stream` until the server closes it, for at most `within`:
/// what it sent, or `None` if it was still open then.
fn read_until_closed(stream: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now() + within;
    let mut answer = Vec::new();
    let mut chunk = [0; 4096];
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .expect("a read timeout");
        match stream.read(&mut chunk) {
            Ok(0) => return Some(answer),
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(error) if error.kind() == ErrorKind::ConnectionReset => return Some(answer),
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return None;
            }
            Err(error) => panic!("reading: {error}"),
        }
    }
}

/// Waits (at most 10 s) for `condition`.
fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The limits of the new tests: a request timeout far beyond what they
/// wait, so that only the bound under test can close a connection.
fn limits(header_timeout: Duration, max_concurrent: usize, max_pending: usize) -> HttpServerConfig {
    let mut config = HttpServerConfig::default();
    config.request_timeout = REQUEST_TIMEOUT;
    config.header_timeout = header_timeout;
    config.max_concurrent = max_concurrent;
    config.max_pending = max_pending;
    config
}

#[test]
fn the_crate_s_own_client_reads_what_the_server_answers() {
    smol::block_on(async {
        let history = history();
        let server = bind(history.clone()).await;
        let counters = server.counters();
        let addr = start(server);
        let page = client(addr, SECRET)
            .fetch(request(0, 3))
            .await
            .expect("a page");
        let expected = history.lock().unwrap().answer(&request(0, 3), 100).unwrap();
        assert_eq!(page, expected);
        assert_eq!(page.updates.len(), 3);
        // The same source, directly: what a Rust follower gets.
        assert_eq!(history.fetch(request(0, 3)).await.expect("a page"), page);

        let error = client(addr, "wrong")
            .fetch(request(0, 3))
            .await
            .expect_err("a wrong secret");
        let error = error.downcast::<HttpCatchUpError>().expect("a typed error");
        assert!(
            matches!(*error, HttpCatchUpError::Status { status: 401, ref body, .. }
                if body.contains("Invalid Authorization header.")),
            "{error}"
        );
        assert_eq!((counters.pages(), counters.refused_secret()), (1, 1));
    });
}

/// A server built from Synapse's configuration listens at the writer's
/// `instance_map` address, checks the replication secret and serves only
/// the streams `stream_writers` gives it.
#[test]
fn a_server_from_synapse_s_configuration_serves_where_the_deployment_looks() {
    smol::block_on(async {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let synapse = SynapseConfig::from_value(serde_json::json!({
            "server_name": "x",
            "redis": {"enabled": true},
            "worker_replication_secret": SECRET,
            "stream_writers": {"typing": ["rust1"]},
            "instance_map": {
                "main": {"host": "127.0.0.1", "port": 1},
                "rust1": {"host": "127.0.0.1", "port": port},
            },
        }))
        .expect("a configuration");
        let missing = HttpServer::from_synapse(SmolRuntime, &synapse, "nobody", history()).await;
        assert_eq!(
            missing.expect_err("no instance_map entry").kind(),
            std::io::ErrorKind::NotFound
        );
        let server = HttpServer::from_synapse(SmolRuntime, &synapse, "rust1", history())
            .await
            .expect("a listener");
        let addr = start(server);
        assert_eq!(addr.port(), port);
        let bearer = format!("Bearer {SECRET}");
        let answer = raw(addr, catch_up_get("t1", Some(&bearer)).as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let answer = raw(addr, catch_up_get("t2", Some("Bearer wrong")).as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
        let events = catch_up_get("t3", Some(&bearer)).replace("/typing/", "/events/");
        let answer = raw(addr, events.as_bytes()).await;
        assert!(
            answer.starts_with("HTTP/1.1 400") && answer.contains("Unknown stream"),
            "{answer}"
        );
    });
}

#[test]
fn synapse_s_request_is_answered_whatever_its_host() {
    smol::block_on(async {
        let addr = start(bind(history()).await);
        let answer = raw(
            addr,
            catch_up_get("AbCdEfGhIj", Some(&format!("Bearer {SECRET}"))).as_bytes(),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(
            answer
                .to_ascii_lowercase()
                .contains("content-type: application/json")
        );
        assert!(
            answer.ends_with(
                r#"{"updates":[[2,["!b:x",["@v:x"]]],[3,["!a:x",[]]]],"upto_token":3,"limited":false}"#
            ),
            "{answer}"
        );
        let answer = raw(
            addr,
            b"GET /_synapse/replication/get_repl_stream_updates/events/x?from_token=1&upto_token=3 HTTP/1.1\r\n\
              Host: x\r\nAuthorization: Bearer s3cret\r\n\r\n",
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
        assert!(answer.ends_with(r#"{"error":"Unknown stream","errcode":"M_UNKNOWN"}"#));
        let answer = raw(addr, b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 404 "), "{answer}");
        let answer = raw(addr, b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(answer.contains("M_UNRECOGNIZED"), "{answer}");
        // Not HTTP: hyper's 400, then the connection is closed. The bytes
        // reach the server in one read, so it closes with nothing unread
        // (no reset that could swallow the answer).
        let answer = raw(addr, b"not http at all\r\n\r\n").await;
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{answer}"
        );
    });
}

#[test]
fn oversized_requests_are_refused() {
    smol::block_on(async {
        let mut config = HttpServerConfig::default();
        config.max_request_bytes = 8192;
        let server = bind(history()).await.with_config(config);
        let server = server.with_handler(|request| {
            Box::pin(async move { HttpResponse::new(200, format!("{}", request.body.len())) })
        });
        let addr = start(server);
        // Headers beyond the limit: 431. They stay below one read of the
        // server's (16 KiB), so it closes with nothing unread, and the
        // answer cannot be lost to a reset.
        let long = "a".repeat(9000);
        let answer = raw(
            addr,
            format!("GET /x HTTP/1.1\r\nHost: x\r\nX-Long: {long}\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(
            answer.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{answer}"
        );
        let body = "b".repeat(9000);
        let answer = raw(
            addr,
            format!(
                "PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
        let answer = raw(
            addr,
            b"PUT /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        )
        .await;
        assert!(
            answer.starts_with("HTTP/1.1 200 ") && answer.ends_with("\r\n3"),
            "{answer}"
        );
    });
}

/// A source that answers its first fetch when told to, and never any
/// other.
struct Gate {
    gate: Mutex<Option<futures::channel::oneshot::Receiver<()>>>,
    calls: AtomicUsize,
}

#[synapse_replication::transport::async_trait]
impl CatchUpSource for Gate {
    async fn fetch(&self, request: CatchUpRequest) -> Result<CatchUpPage, BoxError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let gate = self.gate.lock().unwrap().take();
        match gate {
            Some(gate) => {
                let _ = gate.await;
            }
            None => future::pending::<()>().await,
        }
        Ok(CatchUpPage {
            updates: Vec::new(),
            upto: request.to,
            limited: false,
        })
    }
}

#[test]
fn beyond_the_limit_is_503_and_a_slow_source_504() {
    smol::block_on(async {
        let (open, gate) = futures::channel::oneshot::channel();
        let source = Arc::new(Gate {
            gate: Mutex::new(Some(gate)),
            calls: AtomicUsize::new(0),
        });
        let mut config = HttpServerConfig::default();
        config.max_concurrent = 1;
        config.request_timeout = Duration::from_millis(1500);
        let server = bind(source.clone()).await.with_config(config);
        let counters = server.counters();
        let addr = start(server);
        let get = catch_up_get("t", Some(&format!("Bearer {SECRET}")));
        let first = smol::spawn({
            let get = get.clone();
            async move { raw(addr, get.as_bytes()).await }
        });
        while source.calls.load(Ordering::SeqCst) == 0 {
            smol::Timer::after(Duration::from_millis(10)).await;
        }
        // The first is in flight: a second is refused.
        let answer = raw(addr, get.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
        assert!(answer.contains("M_UNKNOWN"), "{answer}");
        assert_eq!(counters.busy(), 1);
        open.send(()).unwrap();
        let answer = first.await;
        assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
        // The gate is gone: the next fetch never answers.
        let started = Instant::now();
        let answer = raw(addr, get.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 504 "), "{answer}");
        assert!(started.elapsed() >= Duration::from_millis(1400));
        assert_eq!((counters.failed(), counters.pages()), (1, 1));
    });
}

#[test]
fn headers_not_complete_by_the_header_timeout_are_closed() {
    let server =
        smol::block_on(bind(history())).with_config(limits(Duration::from_secs(1), 64, 128));
    let counters = server.counters();
    let addr = start(server);

    // Everything but the blank line that ends the headers.
    let get = catch_up_get("t", Some(&format!("Bearer {SECRET}")));
    let partial = get.strip_suffix("\r\n").expect("the blank line").to_owned();
    let mut idle = TcpStream::connect(addr).expect("connects");
    idle.write_all(partial.as_bytes()).expect("writes");
    let answer = read_until_closed(&mut idle, CLOSED_WITHIN)
        .expect("closed by the header timeout, long before the request timeout");
    assert_eq!(String::from_utf8_lossy(&answer), "", "closed unanswered");

    // A byte now and then does not keep the connection open: the
    // deadline counts from the accept, not from the last byte.
    let mut slow = TcpStream::connect(addr).expect("connects");
    let mut writer = slow.try_clone().expect("a second handle");
    let trickle = std::thread::spawn({
        let partial = partial.clone();
        move || {
            for byte in partial.bytes() {
                if writer.write_all(&[byte]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    });
    let answer = read_until_closed(&mut slow, CLOSED_WITHIN)
        .expect("closed by the header timeout, however slowly the bytes come");
    assert_eq!(String::from_utf8_lossy(&answer), "", "closed unanswered");
    drop(slow);
    trickle.join().expect("the writer");

    // Headers in time are answered as ever.
    let mut prompt = TcpStream::connect(addr).expect("connects");
    prompt.write_all(get.as_bytes()).expect("writes");
    let answer = read_until_closed(&mut prompt, CLOSED_WITHIN).expect("answered and closed");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert_eq!(counters.pages(), 1);
}

#[test]
fn a_wrong_secret_is_refused_as_soon_as_the_headers_are_in() {
    let handled = Arc::new(AtomicUsize::new(0));
    let server = smol::block_on(bind(history()))
        .with_config(limits(Duration::from_secs(20), 64, 128))
        .with_handler({
            let handled = Arc::clone(&handled);
            move |request| {
                handled.fetch_add(1, Ordering::SeqCst);
                Box::pin(async move { HttpResponse::new(200, format!("{}", request.body.len())) })
            }
        });
    let counters = server.counters();
    let addr = start(server);

    // Replication requests whose body is announced and never sent: a
    // missing or wrong secret is answered from the headers alone, and the
    // connection closed, with the body still owed.
    let cases = [
        (
            "PUT /_synapse/replication/presence_set_state/u/t HTTP/1.1\r\nHost: x\r\n\
             Authorization: Bearer wrong\r\nContent-Length: 5000\r\n\r\n",
            "M_UNKNOWN_TOKEN",
        ),
        (
            "POST /_synapse/replication/fed_send_edu/m.typing/t HTTP/1.1\r\nHost: x\r\n\
             Content-Length: 5000\r\n\r\n",
            "M_MISSING_TOKEN",
        ),
        (
            "GET /_synapse/replication/get_repl_stream_updates/typing/t?from_token=1&upto_token=3 HTTP/1.1\r\n\
             Host: x\r\nAuthorization: Bearer wrong\r\nContent-Length: 5000\r\n\r\n",
            "M_UNKNOWN_TOKEN",
        ),
    ];
    for (request, errcode) in cases {
        let mut socket = TcpStream::connect(addr).expect("connects");
        socket.write_all(request.as_bytes()).expect("writes");
        let answer = read_until_closed(&mut socket, CLOSED_WITHIN)
            .unwrap_or_else(|| panic!("still open, waiting for a body: {request}"));
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 401 "), "{request}: {answer}");
        assert!(answer.contains(errcode), "{request}: {answer}");
    }
    assert_eq!(handled.load(Ordering::SeqCst), 0, "no handler ran");
    assert_eq!((counters.refused_secret(), counters.handled()), (3, 0));

    // With the secret, the handler gets the request, body and all; paths
    // outside Synapse's replication prefix are the handler's to check.
    let body = "x".repeat(5000);
    for path in ["/_synapse/replication/presence_set_state/u/t", "/health"] {
        let authorization = if path == "/health" {
            String::new()
        } else {
            format!("Authorization: Bearer {SECRET}\r\n")
        };
        let mut socket = TcpStream::connect(addr).expect("connects");
        socket
            .write_all(
                format!(
                    "PUT {path} HTTP/1.1\r\nHost: x\r\n{authorization}Content-Length: 5000\r\n\r\n{body}"
                )
                .as_bytes(),
            )
            .expect("writes");
        let answer = read_until_closed(&mut socket, CLOSED_WITHIN).expect("answered");
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 200 ") && answer.ends_with("\r\n5000"),
            "{path}: {answer}"
        );
    }
    assert_eq!(handled.load(Ordering::SeqCst), 2);
}

#[test]
fn the_oldest_connection_without_its_headers_makes_room_for_a_new_one() {
    // Two pending slots; headers may take longer than the test, so only
    // making room can close anything.
    let server = smol::block_on(bind(history())).with_config(limits(Duration::from_secs(20), 4, 2));
    let counters = server.counters();
    let addr = start(server);
    let partial =
        "GET /_synapse/replication/get_repl_stream_updates/typing/t HTTP/1.1\r\nHost: x\r\n";

    // 127.0.0.2 opens four sockets and sends half a request on each: the
    // third and fourth are taken, and the first two closed for them.
    let attacker = Ipv4Addr::new(127, 0, 0, 2);
    let mut idle: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut socket = connect_from(attacker, addr);
            let _ = socket.write_all(partial.as_bytes());
            socket
        })
        .collect();
    for (index, socket) in idle.iter_mut().enumerate().take(2) {
        let answer = read_until_closed(socket, CLOSED_WITHIN)
            .unwrap_or_else(|| panic!("socket {index}, the oldest, is still open"));
        assert!(answer.is_empty(), "closed unanswered: {answer:?}");
    }
    eventually("two connections closed for room", || counters.busy() == 2);

    // A catch-up from the same address is served: the oldest pending
    // socket makes room for it, and the newest stays.
    let mut socket = connect_from(attacker, addr);
    socket
        .write_all(catch_up_get("t", Some(&format!("Bearer {SECRET}"))).as_bytes())
        .expect("writes");
    let answer = read_until_closed(&mut socket, CLOSED_WITHIN).expect("answered");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert_eq!((counters.pages(), counters.busy()), (1, 3));
    let answer = read_until_closed(&mut idle[2], CLOSED_WITHIN).expect("closed for room");
    assert!(answer.is_empty(), "closed unanswered: {answer:?}");
    idle[3]
        .set_nonblocking(true)
        .expect("a non-blocking socket");
    let mut byte = [0; 1];
    let open = idle[3].read(&mut byte);
    assert!(
        matches!(open, Err(ref error) if error.kind() == ErrorKind::WouldBlock),
        "the newest is still open: {open:?}"
    );
}

/// A neighbour on the writer's host: `count` sockets kept open to `addr`
/// from `sources` (in turn), half of them idle, half trickling headers
/// that never end a byte at a time, each opened again as soon as the
/// server closes it, until dropped.
struct Flood {
    stop: Arc<AtomicBool>,
    /// Sockets opened so far, reopened ones included.
    opened: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flood {
    fn start(addr: SocketAddr, sources: Vec<IpAddr>, count: usize) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicUsize::new(0));
        let thread = std::thread::spawn({
            let (stop, opened) = (Arc::clone(&stop), Arc::clone(&opened));
            move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_io()
                    .build()
                    .expect("a runtime");
                let open = |index: usize| {
                    let source = sources[index % sources.len()];
                    let stream = runtime.block_on(async {
                        let socket = match source {
                            IpAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
                            IpAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
                        }
                        .ok()?;
                        socket.bind(SocketAddr::new(source, 0)).ok()?;
                        socket.connect(addr).await.ok()
                    })?;
                    let stream = stream.into_std().ok()?;
                    stream.set_nonblocking(true).ok()?;
                    opened.fetch_add(1, Ordering::SeqCst);
                    Some(stream)
                };
                let header = b"GET /_synapse/replication/get_repl_stream_updates/typing/t?from_token=1&upto_token=3 HTTP/1.1\r\nHost: x\r\nX-Never-Ends: ";
                let mut sockets: Vec<(Option<TcpStream>, usize)> =
                    (0..count).map(|index| (open(index), 0)).collect();
                while !stop.load(Ordering::SeqCst) {
                    for (index, (socket, sent)) in sockets.iter_mut().enumerate() {
                        let alive = socket.as_mut().is_some_and(|socket| {
                            let mut byte = [0; 1];
                            let open = matches!(
                                socket.read(&mut byte),
                                Err(ref error) if error.kind() == ErrorKind::WouldBlock
                            );
                            if !open || index % 2 == 0 {
                                return open;
                            }
                            let next = header.get(*sent).copied().unwrap_or(b'a');
                            *sent += 1;
                            socket.write(&[next]).is_ok()
                        });
                        if !alive {
                            *socket = open(index);
                            *sent = 0;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        });
        Flood {
            stop,
            opened,
            thread: Some(thread),
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The issue's bound: a catch-up is answered within 3 s, whatever the
/// neighbours hold.
const ANSWERED_WITHIN: Duration = Duration::from_secs(3);

/// With `flood` holding 200 sockets to the server at `addr` (default
/// limits), a few catch-ups from `from`, each answered 200 within
/// [`ANSWERED_WITHIN`].
fn catch_ups_get_through(addr: SocketAddr, from: IpAddr, flood: &Flood) {
    eventually("the flood's sockets are open", || {
        flood.opened.load(Ordering::SeqCst) >= 200
    });
    // Time for the server to accept them all.
    std::thread::sleep(Duration::from_millis(500));
    let get = catch_up_get("t", Some(&format!("Bearer {SECRET}")));
    for attempt in 0..5 {
        let mut socket = match from {
            IpAddr::V4(from) => connect_from(from, addr),
            IpAddr::V6(_) => TcpStream::connect(addr).expect("connects"),
        };
        socket.write_all(get.as_bytes()).expect("writes");
        let answer = read_until_closed(&mut socket, ANSWERED_WITHIN)
            .unwrap_or_else(|| panic!("catch-up {attempt} not answered within 3 s"));
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 200 OK\r\n"),
            "catch-up {attempt}: {answer:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_neighbour_on_the_writer_s_own_address_cannot_keep_a_catch_up_out() {
    // Every Synapse process on the writer's host connects from 127.0.0.1,
    // and so does the neighbour.
    let addr = start(smol::block_on(bind(history())));
    let localhost = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let flood = Flood::start(addr, vec![localhost], 200);
    catch_ups_get_through(addr, localhost, &flood);
}

#[test]
fn a_neighbour_on_four_addresses_cannot_keep_a_catch_up_out() {
    let addr = start(smol::block_on(bind(history())));
    let sources = (2..=5)
        .map(|last| IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)))
        .collect();
    let flood = Flood::start(addr, sources, 200);
    catch_ups_get_through(addr, IpAddr::V4(Ipv4Addr::LOCALHOST), &flood);
}

#[test]
fn a_neighbour_over_ipv6_cannot_keep_a_catch_up_out() {
    // Only ::1 is sure to be there: the neighbour and the catch-up share
    // it, as they would share one /64.
    let Ok(server) = smol::block_on(HttpServer::bind(
        SmolRuntime,
        "[::1]:0",
        endpoint(),
        history(),
    )) else {
        eprintln!("no IPv6 loopback here: skipped");
        return;
    };
    let addr = start(server);
    let flood = Flood::start(addr, vec![IpAddr::V6(Ipv6Addr::LOCALHOST)], 200);
    catch_ups_get_through(addr, IpAddr::V6(Ipv6Addr::LOCALHOST), &flood);
}

/// The events logged at INFO or above on the thread that installed it,
/// as `message key=value ...` lines.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<String>>>);

impl Logs {
    fn lines(&self) -> Vec<String> {
        self.0.lock().expect("logs").clone()
    }
}

struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        use std::fmt::Write as _;
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

impl Subscriber for Logs {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        // Other threads may have no subscriber: ask every time.
        Interest::sometimes()
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= Level::INFO
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut line = Line(String::new());
        event.record(&mut line);
        self.0.lock().expect("logs").push(line.0);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Runs `server` and `test` on this thread (so that what the server logs
/// reaches this thread's subscriber) until `test` ends.
fn run_here<T>(server: HttpServer<SmolRuntime>, test: impl Future<Output = T>) -> T {
    smol::block_on(async {
        match future::select(pin!(server.run()), pin!(test)).await {
            Either::Left(((), _)) => unreachable!("the server runs until dropped"),
            Either::Right((out, _)) => out,
        }
    })
}

#[test]
fn refused_requests_are_logged_a_few_at_a_time_with_short_paths() {
    let logs = Logs::default();
    let _guard = tracing::subscriber::set_default(logs.clone());
    let server =
        smol::block_on(bind(history())).with_config(limits(Duration::from_secs(20), 64, 128));
    let counters = server.counters();
    let addr = server.local_addr().expect("its address");
    let long_txn = "t".repeat(4000);
    run_here(server, async {
        for _ in 0..40 {
            let answer = raw(
                addr,
                catch_up_get(&long_txn, Some("Bearer hunter2-not-the-secret")).as_bytes(),
            )
            .await;
            assert!(answer.starts_with("HTTP/1.1 401 "), "{answer}");
        }
    });
    assert_eq!(counters.refused_secret(), 40, "every refusal is counted");
    let lines = logs.lines();
    assert!(
        (2..=6).contains(&lines.len()),
        "a few refusals, and a word that more are not logged: {lines:#?}"
    );
    for line in &lines {
        assert!(
            !line.contains("hunter2"),
            "the secret given is logged: {line}"
        );
        assert!(!line.contains(SECRET), "the secret is logged: {line}");
        assert!(line.len() < 300, "a long line: {line}");
    }
    assert!(
        lines
            .iter()
            .any(|line| line
                .contains("path=\"/_synapse/replication/get_repl_stream_updates/typing/ttt")),
        "{lines:#?}"
    );
}
