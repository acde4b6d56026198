//! `HttpServer` over HTTPS (feature `tls`), with certificates made by
//! openssl, fetched from by the crate's own `HttpCatchUp::with_tls` as
//! Synapse would from an `instance_map` entry with `tls: true`: the rows
//! come back to a client trusting the CA; a plain-HTTP client, a client
//! trusting another CA, and (when client certificates are required) a
//! client without one get nothing. Bad files fail at `with_tls`.

#![cfg(all(
    feature = "http-server",
    feature = "http-catch-up",
    feature = "tls",
    feature = "runtime-smol",
    unix
))]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use synapse_replication::positions::BoxError;

use common::redis_server::{TempDir, TestCerts};
use synapse_replication::config::{InstanceLocation, TlsConfig};
use synapse_replication::http::CatchUpEndpoint;
use synapse_replication::positions::{
    CatchUpId, CatchUpPage, CatchUpRequest, History, HistoryMode,
};
use synapse_replication::transport::{
    CatchUpSource, HttpCatchUp, HttpCatchUpError, HttpServer, HttpServerConfig, HttpServerTls,
    HttpServerTlsError, SmolRuntime,
};
use synapse_replication::wire::{InstanceName, RawRow, StreamName, Token};

const SECRET: &str = "s3cret";
const INSTANCE: &str = "rust1";

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
                &InstanceName::from(INSTANCE),
                [(Token(token), RawRow::new(row).expect("a row"))],
            )
            .expect("recorded");
    }
    Arc::new(Mutex::new(history))
}

fn endpoint() -> CatchUpEndpoint {
    CatchUpEndpoint::new(InstanceName::from(INSTANCE), Some(SECRET.into()))
        .with_streams([StreamName::Typing])
}

fn request(from: i64, to: i64) -> CatchUpRequest {
    CatchUpRequest {
        id: CatchUpId::new(1),
        stream: StreamName::Typing,
        writer: InstanceName::from(INSTANCE),
        from: Token(from),
        to: Token(to),
    }
}

async fn bind(source: Arc<dyn CatchUpSource>) -> HttpServer<SmolRuntime> {
    HttpServer::bind(SmolRuntime, "127.0.0.1:0", endpoint(), source)
        .await
        .expect("a listener")
}

/// Starts `server` on smol's executor; its address.
fn start(server: HttpServer<SmolRuntime>) -> SocketAddr {
    let addr = server.local_addr().expect("its address");
    smol::spawn(server.run()).detach();
    addr
}

/// The crate's client for the writer at `addr`, over HTTPS with `tls`
/// (trusting its CAs, presenting its certificate), or plain HTTP without.
fn client(addr: SocketAddr, tls: Option<TlsConfig>) -> HttpCatchUp<SmolRuntime> {
    client_with_secret(addr, tls, SECRET)
}

fn client_with_secret(
    addr: SocketAddr,
    tls: Option<TlsConfig>,
    secret: &str,
) -> HttpCatchUp<SmolRuntime> {
    let port = addr.port();
    let https = tls.is_some();
    let client = HttpCatchUp::with_locator(
        SmolRuntime,
        move |_: &InstanceName| {
            Some(InstanceLocation::Tcp {
                host: "127.0.0.1".into(),
                port,
                tls: https,
            })
        },
        Some(secret.into()),
    )
    .with_timeout(Duration::from_secs(10));
    match tls {
        Some(tls) => client.with_tls(tls),
        None => client,
    }
}

fn trusting(ca: &Path) -> TlsConfig {
    let mut tls = TlsConfig::default();
    tls.ca_file = Some(ca.to_owned());
    tls
}

#[test]
fn https_rows_reach_a_client_trusting_the_ca_only() {
    let dir = TempDir::new("https-serve");
    let certs = TestCerts::generate(dir.path());
    smol::block_on(async {
        let history = history();
        let server = bind(history.clone())
            .await
            .with_tls(&HttpServerTls::new(&certs.server_cert, &certs.server_key))
            .expect("the certificate and key load");
        assert!(format!("{server:?}").contains("https: true"), "{server:?}");
        let counters = server.counters();
        let addr = start(server);

        let page = client(addr, Some(trusting(&certs.ca)))
            .fetch(request(0, 3))
            .await
            .expect("a page over HTTPS");
        let expected = history.lock().unwrap().answer(&request(0, 3), 100).unwrap();
        assert_eq!(page, expected);
        let rows: Vec<(Token, &str)> = page
            .updates
            .iter()
            .map(|(token, row)| (*token, row.as_str()))
            .collect();
        assert_eq!(
            rows,
            vec![
                (Token(1), r#"["!a:x",["@u:x"]]"#),
                (Token(2), r#"["!b:x",["@v:x"]]"#),
                (Token(3), r#"["!a:x",[]]"#),
            ]
        );
        assert_eq!((counters.pages(), counters.handshakes_failed()), (1, 0));

        // Plain HTTP to the HTTPS port: no page, and no HTTP answer.
        let error = client(addr, None)
            .fetch(request(0, 3))
            .await
            .expect_err("plain HTTP to an HTTPS port");
        let error = error.downcast::<HttpCatchUpError>().expect("a typed error");
        assert!(
            !matches!(*error, HttpCatchUpError::Status { .. }),
            "{error}"
        );
        let answer = smol::unblock(move || {
            let mut socket = TcpStream::connect(addr).expect("connects");
            socket
                .set_read_timeout(Some(Duration::from_secs(5)))
                .expect("a timeout");
            socket
                .write_all(b"GET /_synapse/replication/get_repl_stream_updates/typing/x?from_token=0&upto_token=3 HTTP/1.1\r\nHost: rust1:80\r\nAuthorization: Bearer s3cret\r\n\r\n")
                .expect("writes");
            let mut answer = Vec::new();
            let _ = socket.read_to_end(&mut answer);
            answer
        })
        .await;
        assert!(!answer.starts_with(b"HTTP/"), "{answer:?}");
        assert!(!answer.windows(6).any(|w| w == b"!a:x\""), "{answer:?}");

        // A client trusting another CA: the handshake fails, fail closed.
        let error = client(addr, Some(trusting(&certs.other_ca)))
            .fetch(request(0, 3))
            .await
            .expect_err("a certificate from an untrusted CA");
        let error = error.downcast::<HttpCatchUpError>().expect("a typed error");
        assert!(
            matches!(*error, HttpCatchUpError::Connect { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("certificate"), "{error}");

        // Over HTTPS the secret is still checked.
        let wrong = client_with_secret(addr, Some(trusting(&certs.ca)), "wrong");
        let error = wrong
            .fetch(request(0, 3))
            .await
            .expect_err("a wrong secret");
        let error = error.downcast::<HttpCatchUpError>().expect("a typed error");
        assert!(
            matches!(*error, HttpCatchUpError::Status { status: 401, .. }),
            "{error}"
        );

        assert_eq!(counters.pages(), 1);
        assert_eq!(counters.refused_secret(), 1);
        // The plain-HTTP fetch, the raw request and the untrusting client.
        assert_eq!(counters.handshakes_failed(), 3);
    });
}

#[test]
fn client_certificates_are_required_when_a_client_ca_is_given() {
    let dir = TempDir::new("https-mtls");
    let certs = TestCerts::generate(dir.path());
    smol::block_on(async {
        let mut tls = HttpServerTls::new(&certs.server_cert, &certs.server_key);
        tls.client_ca_file = Some(certs.ca.clone());
        let server = bind(history()).await.with_tls(&tls).expect("loads");
        let counters = server.counters();
        let addr = start(server);

        let error = client(addr, Some(trusting(&certs.ca)))
            .fetch(request(0, 3))
            .await
            .expect_err("no client certificate");
        let error = error.downcast::<HttpCatchUpError>().expect("a typed error");
        assert!(
            !matches!(*error, HttpCatchUpError::Status { .. }),
            "{error}"
        );
        assert_eq!(counters.pages(), 0);

        let mut with_certificate = trusting(&certs.ca);
        with_certificate.certificate_file = Some(certs.client_cert.clone());
        with_certificate.private_key_file = Some(certs.client_key.clone());
        let page = client(addr, Some(with_certificate))
            .fetch(request(1, 3))
            .await
            .expect("a page for a client with a certificate");
        assert_eq!(page.updates.len(), 2);
        assert_eq!(page.upto, Token(3));
        assert_eq!(counters.pages(), 1);
        assert!(counters.handshakes_failed() >= 1);
    });
}

/// A source whose first fetch answers when told to, and never any other.
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
            None => futures::future::pending::<()>().await,
        }
        Ok(CatchUpPage {
            updates: Vec::new(),
            upto: request.to,
            limited: false,
        })
    }
}

#[test]
fn busy_https_answers_503_over_tls() {
    let dir = TempDir::new("https-busy");
    let certs = TestCerts::generate(dir.path());
    smol::block_on(async {
        let (open, gate) = futures::channel::oneshot::channel();
        let source = Arc::new(Gate {
            gate: Mutex::new(Some(gate)),
            calls: AtomicUsize::new(0),
        });
        let mut config = HttpServerConfig::default();
        config.max_concurrent = 1;
        let server = bind(source.clone())
            .await
            .with_config(config)
            .with_tls(&HttpServerTls::new(&certs.server_cert, &certs.server_key))
            .expect("loads");
        let counters = server.counters();
        let addr = start(server);
        let first = smol::spawn({
            let client = client(addr, Some(trusting(&certs.ca)));
            async move { client.fetch(request(1, 3)).await }
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while source.calls.load(Ordering::SeqCst) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the first fetch never reached the source"
            );
            smol::Timer::after(Duration::from_millis(10)).await;
        }
        let error = client(addr, Some(trusting(&certs.ca)))
            .fetch(request(1, 3))
            .await
            .expect_err("busy");
        let error = error.downcast::<HttpCatchUpError>().expect("a typed error");
        assert!(
            matches!(*error, HttpCatchUpError::Status { status: 503, .. }),
            "{error}"
        );
        assert_eq!(counters.busy(), 1);
        open.send(()).unwrap();
        let page = first.await.expect("the first answered once let go");
        assert_eq!(page.upto, Token(3));
    });
}

#[test]
fn bad_files_fail_at_with_tls() {
    let dir = TempDir::new("https-bad");
    let certs = TestCerts::generate(dir.path());
    smol::block_on(async {
        let missing = dir.path().join("missing.crt");
        let error = bind(history())
            .await
            .with_tls(&HttpServerTls::new(&missing, &certs.server_key))
            .expect_err("a missing certificate file");
        assert!(
            matches!(error, HttpServerTlsError::File { what: "certificate_file", ref path, .. } if *path == missing),
            "{error}"
        );
        assert!(error.to_string().contains("missing.crt"), "{error}");

        // A key file holding only a certificate.
        let error = bind(history())
            .await
            .with_tls(&HttpServerTls::new(&certs.server_cert, &certs.server_cert))
            .expect_err("no key");
        assert!(
            matches!(error, HttpServerTlsError::File { what: "private_key_file", ref reason, .. }
                if reason == "no private key in the file"),
            "{error}"
        );

        // A certificate file holding only a key.
        let error = bind(history())
            .await
            .with_tls(&HttpServerTls::new(&certs.server_key, &certs.server_key))
            .expect_err("no certificate");
        assert!(
            matches!(
                error,
                HttpServerTlsError::File {
                    what: "certificate_file",
                    ..
                }
            ),
            "{error}"
        );

        // Another certificate's key.
        let error = bind(history())
            .await
            .with_tls(&HttpServerTls::new(&certs.server_cert, &certs.client_key))
            .expect_err("a key that does not match");
        assert!(matches!(error, HttpServerTlsError::Tls(_)), "{error}");

        // A client CA file without a certificate.
        let mut tls = HttpServerTls::new(&certs.server_cert, &certs.server_key);
        tls.client_ca_file = Some(certs.server_key.clone());
        let error = bind(history())
            .await
            .with_tls(&tls)
            .expect_err("no client CA");
        assert!(
            matches!(
                error,
                HttpServerTlsError::File {
                    what: "client_ca_file",
                    ..
                }
            ),
            "{error}"
        );
    });
}

/// A plain TCP connection to `addr` from the address `from` (any port):
/// on Linux every 127.0.0.0/8 address is the loopback's, so two of them
/// are two peers.
fn connect_from(from: std::net::Ipv4Addr, addr: SocketAddr) -> TcpStream {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("a runtime");
    let stream = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket
            .bind(SocketAddr::new(from.into(), 0))
            .expect("binds a loopback address");
        socket.connect(addr).await.expect("connects")
    });
    let stream = stream.into_std().expect("a std stream");
    stream.set_nonblocking(false).expect("blocking");
    stream
}

/// Whether the server closes `stream` within `within` (reading and
/// dropping whatever it sends first).
fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    let mut chunk = [0; 4096];
    loop {
        let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) else {
            return false;
        };
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .expect("a read timeout");
        match stream.read(&mut chunk) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn unfinished_handshakes_are_bounded_like_unfinished_headers() {
    let dir = TempDir::new("https-idle");
    let certs = TestCerts::generate(dir.path());
    let tls = HttpServerTls::new(&certs.server_cert, &certs.server_key);
    let limits = |header_timeout: Duration, max_concurrent: usize, max_pending: usize| {
        let mut config = HttpServerConfig::default();
        config.request_timeout = Duration::from_secs(30);
        config.header_timeout = header_timeout;
        config.max_concurrent = max_concurrent;
        config.max_pending = max_pending;
        config
    };

    // A handshake that never finishes (half a TLS record header) is cut
    // at the header timeout, long before the request timeout.
    let server = smol::block_on(bind(history()))
        .with_config(limits(Duration::from_secs(1), 64, 128))
        .with_tls(&tls)
        .expect("loads");
    let counters = server.counters();
    let addr = start(server);
    let mut idle = TcpStream::connect(addr).expect("connects");
    idle.write_all(&[0x16, 0x03, 0x01]).expect("writes");
    assert!(
        closed_within(&mut idle, Duration::from_secs(10)),
        "an unfinished handshake outlived the header timeout"
    );
    assert_eq!(counters.handshakes_failed(), 1);

    // Two pending slots, and handshakes may take longer than the test:
    // 127.0.0.2's third unfinished handshake closes its first, and
    // 127.0.0.1 is still served over HTTPS (closing the second).
    let server = smol::block_on(bind(history()))
        .with_config(limits(Duration::from_secs(20), 3, 2))
        .with_tls(&tls)
        .expect("loads");
    let counters = server.counters();
    let addr = start(server);
    let attacker = std::net::Ipv4Addr::new(127, 0, 0, 2);
    let mut idle: Vec<TcpStream> = (0..3).map(|_| connect_from(attacker, addr)).collect();
    assert!(
        closed_within(&mut idle[0], Duration::from_secs(10)),
        "the oldest unfinished handshake is open"
    );
    let page = smol::block_on(client(addr, Some(trusting(&certs.ca))).fetch(request(0, 3)))
        .expect("another peer is served");
    assert_eq!(page.updates.len(), 3);
    assert_eq!((counters.pages(), counters.busy()), (1, 2));
    assert!(
        closed_within(&mut idle[1], Duration::from_secs(10)),
        "the next oldest was not closed for the catch-up"
    );
    drop(idle);
}
