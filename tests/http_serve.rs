//! `HttpServer` over plain HTTP, against real sockets: Synapse's request
//! is answered whatever its `Host`, the crate's own client reads the
//! answers, and what a peer may hold is bounded: requests too large, too
//! many at once, a slow source.

#![cfg(all(
    feature = "http-server",
    feature = "http-catch-up",
    feature = "runtime-smol"
))]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future;
use futures::{AsyncReadExt, AsyncWriteExt};
use synapse_replication::positions::{
    CatchUpEndpoint, CatchUpId, CatchUpPage, CatchUpRequest, History, HistoryMode,
};
use synapse_replication::transport::{
    BoxError, CatchUpSource, HttpCatchUp, HttpCatchUpError, HttpResponse, HttpServer,
    HttpServerConfig, SmolRuntime,
};
use synapse_replication::wire::{InstanceName, RawRow, StreamName, Token};
use synapse_replication::writers::InstanceLocation;

const SECRET: &str = "s3cret";

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
