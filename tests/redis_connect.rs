//! `RedisConfig::connect` against real redis-servers: TCP, a Unix socket,
//! TLS with the right CA, a wrong CA, a wrong name, a client certificate,
//! and no plaintext fallback, on smol and (for some) tokio.
//!
//! Each test starts its own redis-server (tests/common/redis_server.rs),
//! which needs `redis-server` and `openssl` on PATH; without them the
//! tests fail, they do not skip.

#![cfg(all(feature = "runtime-smol", feature = "tls", unix))]

mod common;

use std::future::Future;
use std::io;
use std::time::Duration;

use bytes::BytesMut;
use futures::io::{AsyncReadExt, AsyncWriteExt};
use synapse_replication::config::{Endpoint, RedisConfig, SynapseRedisConfig, TlsConfig};
use synapse_replication::resp::{Credentials, Frame, RespDecoder, encode_auth, encode_command};
use synapse_replication::transport::{BoxConnection, Dial, Runtime, SmolRuntime};

use common::redis_server::{RedisServer, TempDir};

const TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `future` on smol, failing the test if it takes over 10 s.
fn block_on<T>(future: impl Future<Output = T>) -> T {
    smol::block_on(smol::future::or(future, async {
        smol::Timer::after(TIMEOUT).await;
        panic!("timed out after {TIMEOUT:?}")
    }))
}

/// Sends one command and reads one reply.
async fn roundtrip(connection: &mut BoxConnection, args: &[&str]) -> io::Result<Frame> {
    let args: Vec<&[u8]> = args.iter().map(|arg| arg.as_bytes()).collect();
    let mut out = BytesMut::new();
    encode_command(&mut out, &args);
    send_and_read(connection, &out).await
}

async fn send_and_read(connection: &mut BoxConnection, bytes: &[u8]) -> io::Result<Frame> {
    connection.write_all(bytes).await?;
    connection.flush().await?;
    let mut decoder = RespDecoder::new();
    let mut buf = BytesMut::new();
    loop {
        if let Some(frame) = decoder
            .decode(&mut buf)
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?
        {
            return Ok(frame);
        }
        let mut chunk = [0; 4096];
        let n = connection.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn pong() -> Frame {
    Frame::SimpleString("PONG".into())
}

/// Connects with `config`, authenticates with its credentials if any, and
/// checks that `PING` answers `PONG`.
async fn connect_and_ping(config: &RedisConfig, runtime: &dyn Runtime) -> io::Result<()> {
    let mut connection = config.connect(runtime).await?;
    if let Some(auth) = config.auth() {
        let mut out = BytesMut::new();
        encode_auth(
            &mut out,
            &Credentials {
                username: auth.username.as_deref().map(str::as_bytes),
                password: auth.password.as_bytes(),
            },
        );
        let reply = send_and_read(&mut connection, &out).await?;
        assert_eq!(reply, Frame::SimpleString("OK".into()), "AUTH");
    }
    assert_eq!(roundtrip(&mut connection, &["PING"]).await?, pong());
    Ok(())
}

fn synapse_section(json: serde_json::Value) -> SynapseRedisConfig {
    serde_json::from_value(json).expect("a valid redis section")
}

#[test]
fn tcp_from_a_url_and_again_to_reconnect() {
    let server = RedisServer::start();
    let config = RedisConfig::from_url(&format!("redis://127.0.0.1:{}/0", server.port()))
        .expect("a valid url");
    block_on(async {
        for _ in 0..3 {
            connect_and_ping(&config, &SmolRuntime).await.expect("ping");
        }
    });
}

#[test]
fn tcp_with_a_password_and_an_acl_user() {
    let server = RedisServer::options()
        .requirepass("default pw")
        .user("worker", "w@rker:pw")
        .start();
    let url = format!("redis://:default%20pw@127.0.0.1:{}", server.port());
    let config = RedisConfig::from_url(&url).expect("a valid url");
    block_on(connect_and_ping(&config, &SmolRuntime)).expect("requirepass");

    let url = format!("redis://worker:w%40rker%3Apw@localhost:{}", server.port());
    let config = RedisConfig::from_url(&url).expect("a valid url");
    block_on(connect_and_ping(&config, &SmolRuntime)).expect("acl user");

    let section = synapse_section(serde_json::json!({
        "enabled": true,
        "host": "127.0.0.1",
        "port": server.port(),
        "username": "worker",
        "password": "w@rker:pw",
    }));
    let config = RedisConfig::from_synapse(&section).expect("a valid section");
    block_on(connect_and_ping(&config, &SmolRuntime)).expect("acl user from synapse");

    // Without credentials, Redis refuses commands.
    let config = RedisConfig::tcp("127.0.0.1", server.port());
    block_on(async {
        let mut connection = config.connect(&SmolRuntime).await.expect("connect");
        let reply = roundtrip(&mut connection, &["PING"]).await.expect("reply");
        assert!(
            matches!(&reply, Frame::Error(text) if text.starts_with(b"NOAUTH")),
            "{reply:?}"
        );
    });
}

#[test]
fn unix_socket_on_smol() {
    let server = RedisServer::options().unix_socket().start();
    let url = format!("unix://{}?db=1", server.unix_socket().display());
    let config = RedisConfig::from_url(&url).expect("a valid url");
    assert_eq!(config.endpoint(), &Endpoint::Unix(server.unix_socket()));
    block_on(connect_and_ping(&config, &SmolRuntime)).expect("ping over the socket");

    let section = synapse_section(serde_json::json!({
        "enabled": true,
        "path": server.unix_socket(),
    }));
    let config = RedisConfig::from_synapse(&section).expect("a valid section");
    block_on(connect_and_ping(&config, &SmolRuntime)).expect("ping over the socket");
}

#[test]
fn unix_socket_that_is_missing_fails() {
    let dir = TempDir::new("nosock");
    let config = RedisConfig::unix(dir.path().join("redis.sock"));
    let error = block_on(config.connect(&SmolRuntime))
        .map(drop)
        .expect_err("no socket");
    assert_eq!(error.kind(), io::ErrorKind::NotFound, "{error}");
}

fn tls_section(server: &RedisServer, host: &str) -> serde_json::Value {
    serde_json::json!({
        "enabled": true,
        "host": host,
        "port": server.tls_port(),
        "use_tls": true,
        "ca_file": server.certs().ca,
    })
}

#[test]
fn tls_with_the_right_ca() {
    let server = RedisServer::options().tls().requirepass("pw").start();
    // By IP address and by name: the certificate carries both.
    for host in ["127.0.0.1", "localhost"] {
        let mut section = tls_section(&server, host);
        section["password"] = "pw".into();
        let config = RedisConfig::from_synapse(&synapse_section(section)).expect("valid");
        config.prepare().expect("certificates load");
        block_on(async {
            // Twice: the second connection reuses the loaded configuration.
            for _ in 0..2 {
                connect_and_ping(&config, &SmolRuntime)
                    .await
                    .expect("ping over tls");
            }
        });
    }

    // ca_path: a directory of CA files.
    let ca_dir = TempDir::new("capath");
    std::fs::copy(&server.certs().ca, ca_dir.path().join("ca.pem")).expect("copy");
    std::fs::write(ca_dir.path().join("README"), "not a certificate\n").expect("write");
    let mut tls = TlsConfig::default();
    tls.ca_path = Some(ca_dir.path().to_owned());
    let config = RedisConfig::tcp("127.0.0.1", server.tls_port())
        .with_auth(synapse_replication::config::RedisAuth {
            username: None,
            password: "pw".to_owned(),
        })
        .with_tls(tls);
    block_on(connect_and_ping(&config, &SmolRuntime)).expect("ping with ca_path");
}

#[test]
fn tls_with_a_wrong_ca_fails_on_the_certificate() {
    let server = RedisServer::options().tls().start();
    let mut section = tls_section(&server, "127.0.0.1");
    section["ca_file"] = serde_json::to_value(&server.certs().other_ca).expect("json");
    let config = RedisConfig::from_synapse(&synapse_section(section)).expect("valid");
    let error = block_on(config.connect(&SmolRuntime))
        .map(drop)
        .expect_err("an unknown issuer");
    assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
    let message = error.to_string();
    assert!(message.contains("certificate"), "{message}");
    assert!(message.contains("UnknownIssuer"), "{message}");
}

#[test]
fn tls_with_a_wrong_server_name_fails() {
    let server = RedisServer::options().tls().start();
    let mut tls = TlsConfig::default();
    tls.ca_file = Some(server.certs().ca.clone());
    tls.server_name = Some("redis.example.org".to_owned());
    let config = RedisConfig::tcp("127.0.0.1", server.tls_port()).with_tls(tls);
    let error = block_on(config.connect(&SmolRuntime))
        .map(drop)
        .expect_err("a name the certificate does not carry");
    let message = error.to_string();
    assert!(message.contains("certificate"), "{message}");
    assert!(message.contains("not valid for name"), "{message}");
}

#[test]
fn tls_never_falls_back_to_plaintext() {
    let server = RedisServer::start();
    assert_eq!(
        server.command(&["CONFIG", "RESETSTAT"]),
        Frame::SimpleString("OK".into())
    );
    let certs_dir = TempDir::new("certs");
    let certs = common::redis_server::TestCerts::generate(certs_dir.path());
    // rediss:// (system roots) and use_tls with a CA, against a port that
    // speaks plaintext: both fail, neither sends a command in the clear.
    let url = RedisConfig::from_url(&format!("rediss://127.0.0.1:{}", server.port()))
        .expect("a valid url");
    let mut section = serde_json::json!({
        "enabled": true,
        "host": "127.0.0.1",
        "port": server.port(),
        "use_tls": true,
        "ca_file": certs.ca,
    });
    section["password"] = "pw".into();
    let synapse = RedisConfig::from_synapse(&synapse_section(section)).expect("valid");
    // Redis reads the ClientHello as an unfinished inline command and
    // waits for the rest: the handshake never ends, the timeout ends it.
    for config in [url, synapse] {
        let config = config.with_connect_timeout(Duration::from_millis(500));
        let error = block_on(config.connect(&SmolRuntime))
            .map(drop)
            .expect_err("a plaintext server is no TLS server");
        // (Or, for rediss:// on a machine without system roots, no
        // connection at all.)
        let no_roots = error.kind() == io::ErrorKind::InvalidInput
            && error.to_string().contains("no system root certificates");
        assert!(
            error.kind() == io::ErrorKind::TimedOut || no_roots,
            "{error}"
        );
    }
    // The server saw no PING: the only commands it ran are ours.
    let Frame::BulkString(info) = server.command(&["INFO", "commandstats"]) else {
        panic!("INFO answers a bulk string")
    };
    let info = String::from_utf8_lossy(&info);
    assert!(!info.contains("cmdstat_ping"), "{info}");
}

#[test]
fn tls_with_a_client_certificate() {
    let server = RedisServer::options().tls_client_auth().start();
    let mut section = tls_section(&server, "localhost");
    section["certificate_file"] = serde_json::to_value(&server.certs().client_cert).expect("json");
    section["private_key_file"] = serde_json::to_value(&server.certs().client_key).expect("json");
    let config = RedisConfig::from_synapse(&synapse_section(section)).expect("valid");
    block_on(connect_and_ping(&config, &SmolRuntime)).expect("ping with a client certificate");

    // Without one, the server refuses (in TLS 1.3, after the client's side
    // of the handshake: the first read fails).
    let config = RedisConfig::from_synapse(&synapse_section(tls_section(&server, "localhost")))
        .expect("valid");
    let result = block_on(connect_and_ping(&config, &SmolRuntime));
    assert!(result.is_err(), "the server must want a certificate");
}

#[test]
fn bad_tls_files_fail_at_connect() {
    let mut tls = TlsConfig::default();
    tls.ca_file = Some("/nonexistent/ca.pem".into());
    let config = RedisConfig::tcp("127.0.0.1", 1).with_tls(tls);
    let error = block_on(config.connect(&SmolRuntime))
        .map(drop)
        .expect_err("no such file");
    assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{error}");
    assert!(error.to_string().contains("ca_file"), "{error}");
}

#[cfg(feature = "runtime-tokio")]
mod on_tokio {
    use super::*;
    use synapse_replication::transport::TokioRuntime;

    fn tokio() -> (tokio::runtime::Runtime, TokioRuntime) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let handle = TokioRuntime::new(runtime.handle().clone());
        (runtime, handle)
    }

    #[test]
    fn tcp_unix_and_tls() {
        let (runtime, tokio) = tokio();
        let plain = RedisServer::options().unix_socket().start();
        let tls = RedisServer::options().tls().start();
        let configs = [
            RedisConfig::tcp("127.0.0.1", plain.port()),
            RedisConfig::unix(plain.unix_socket()),
            RedisConfig::from_synapse(&synapse_section(tls_section(&tls, "127.0.0.1")))
                .expect("valid"),
        ];
        // Polled from a foreign executor: the runtime enters tokio itself.
        for config in &configs {
            block_on(connect_and_ping(config, &tokio)).expect("ping on tokio");
        }
        runtime.block_on(async {
            for config in &configs {
                connect_and_ping(config, &tokio)
                    .await
                    .expect("ping on tokio");
            }
        });

        let mut section = tls_section(&tls, "127.0.0.1");
        section["ca_file"] = serde_json::to_value(&tls.certs().other_ca).expect("json");
        let config = RedisConfig::from_synapse(&synapse_section(section)).expect("valid");
        let error = runtime
            .block_on(config.connect(&tokio))
            .map(drop)
            .expect_err("an unknown issuer");
        assert!(error.to_string().contains("UnknownIssuer"), "{error}");
    }
}

/// The harness's controls, which later tests rely on, do what they say.
#[test]
fn harness_restart_kill_and_freeze() {
    let mut server = RedisServer::options()
        .unix_socket()
        .requirepass("pw")
        .user("worker", "wpw")
        .start();
    let port = server.port();
    let config = RedisConfig::from_url(&format!("redis://worker:wpw@127.0.0.1:{port}"))
        .expect("a valid url");

    // restart: the same port, the users again; old connections see EOF.
    let mut old = block_on(config.connect(&SmolRuntime)).expect("connect");
    server.restart();
    assert_eq!(server.port(), port);
    let eof = block_on(roundtrip(&mut old, &["PING"]));
    assert!(eof.is_err(), "{eof:?}");
    block_on(connect_and_ping(&config, &SmolRuntime)).expect("ping after restart");

    // kill9: gone at once; restart brings it back.
    server.kill9();
    assert!(!server.is_running());
    let refused = block_on(config.connect(&SmolRuntime)).map(drop);
    assert_eq!(
        refused.expect_err("nothing listens").kind(),
        io::ErrorKind::ConnectionRefused
    );
    server.restart();
    block_on(connect_and_ping(&config, &SmolRuntime)).expect("ping after kill -9");

    // SIGSTOP: connections open, nothing answers; SIGCONT: answers.
    let mut connection = block_on(config.connect(&SmolRuntime)).expect("connect");
    server.stop_signal();
    let frozen = smol::block_on(smol::future::or(
        async { Some(roundtrip(&mut connection, &["PING"]).await) },
        async {
            smol::Timer::after(Duration::from_millis(300)).await;
            None
        },
    ));
    assert!(frozen.is_none(), "a stopped server answered: {frozen:?}");
    server.cont_signal();
    block_on(connect_and_ping(&config, &SmolRuntime)).expect("ping after SIGCONT");

    // Admin commands, e.g. cutting subscribers off.
    assert_eq!(
        server.command(&["CLIENT", "KILL", "TYPE", "pubsub"]),
        Frame::Integer(0)
    );
    assert!(matches!(
        server.command(&["NO-SUCH-COMMAND"]),
        Frame::Error(_)
    ));
    assert!(server.unix_socket().exists());
}
