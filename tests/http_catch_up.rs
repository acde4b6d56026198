//! `HttpCatchUp` against a tiny HTTP/1.1 server written here (std sockets,
//! one thread, canned answers): the request Synapse expects (path, query,
//! bearer secret, a fresh txn_id), limited pages, and every way an answer
//! can be wrong (a status, bad or truncated JSON, silence, a body too
//! large, a page outside the range asked for). On smol, and on tokio for
//! some. Every wait is bounded.

#![cfg(all(feature = "http-catch-up", feature = "runtime-smol"))]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::json;
use synapse_replication::config::StreamWriters;
use synapse_replication::positions::{CatchUpPage, CatchUpRequest, Follower, FollowerEvent};
use synapse_replication::transport::{
    CatchUpSource, HttpCatchUp, HttpCatchUpError, Runtime, SmolRuntime,
};
use synapse_replication::wire::{Command, InstanceName, StreamName, Token};

/// How long the server waits for a client before giving up.
const PATIENCE: Duration = Duration::from_secs(10);

/// What the server does with one connection.
enum Reply {
    /// Answers this status and body, with a `Content-Length`.
    Answer(u16, Vec<u8>),
    /// Writes these bytes, then closes.
    Raw(Vec<u8>),
    /// Reads the request and says nothing until the client goes away.
    Silent,
}

fn ok(body: serde_json::Value) -> Reply {
    Reply::Answer(200, body.to_string().into_bytes())
}

/// A request as the server saw it.
#[derive(Debug)]
struct Seen {
    line: String,
    headers: Vec<(String, String)>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        let mut values = self
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name));
        let value = values.next().map(|(_, v)| v.as_str());
        assert!(values.next().is_none(), "two {name} headers");
        value
    }

    /// The txn_id of a `get_repl_stream_updates` request line, checking
    /// the rest of it.
    fn txn_id(&self, stream: &str, from: i64, to: i64) -> String {
        let prefix = format!("GET /_synapse/replication/get_repl_stream_updates/{stream}/");
        let suffix = format!("?from_token={from}&upto_token={to} HTTP/1.1");
        let txn = self
            .line
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(&suffix))
            .unwrap_or_else(|| panic!("unexpected request line {:?}", self.line));
        assert!(!txn.is_empty() && !txn.contains('/'), "{txn}");
        txn.to_owned()
    }
}

/// A server answering one connection per reply, in order.
struct Server {
    addr: SocketAddr,
    seen: mpsc::Receiver<Seen>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start(replies: Vec<Reply>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, seen) = mpsc::channel();
        let thread = thread::spawn(move || {
            for reply in replies {
                let Ok((stream, _)) = listener.accept() else {
                    return;
                };
                if answer(stream, reply, &tx).is_err() {
                    // The client went away early (a refused body): fine.
                }
            }
        });
        Server {
            addr,
            seen,
            thread: Some(thread),
        }
    }

    /// `instance_map` with `main` and `w1` both here.
    fn writers(&self) -> Arc<StreamWriters> {
        let here = json!({"host": "127.0.0.1", "port": self.addr.port()});
        Arc::new(
            StreamWriters::from_value(json!({
                "instance_map": {"main": here, "w1": here},
                "stream_writers": {"events": ["w1"]},
            }))
            .unwrap(),
        )
    }

    fn next(&self) -> Seen {
        self.seen.recv_timeout(PATIENCE).expect("a request")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            if !thread::panicking() {
                thread.join().unwrap();
            }
        }
    }
}

fn answer(mut stream: TcpStream, reply: Reply, tx: &mpsc::Sender<Seen>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(PATIENCE))?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
        assert!(head.len() < 64 * 1024, "request head too long");
    }
    let head = String::from_utf8(head).unwrap();
    let mut lines = head.trim_end().split("\r\n");
    let line = lines.next().unwrap_or_default().to_owned();
    let headers = lines
        .map(|l| {
            let (name, value) = l.split_once(':').expect("a header");
            (name.trim().to_owned(), value.trim().to_owned())
        })
        .collect();
    let _ = tx.send(Seen { line, headers });
    match reply {
        Reply::Answer(status, body) => {
            write!(
                stream,
                "HTTP/1.1 {status} Whatever\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )?;
            stream.write_all(&body)?;
        }
        Reply::Raw(bytes) => stream.write_all(&bytes)?,
        Reply::Silent => {
            // Until the client hangs up (or PATIENCE runs out).
            while stream.read(&mut byte)? != 0 {}
        }
    }
    Ok(())
}

/// A follower at `from` on `writer`'s `stream`, told the writer is at `to`.
fn follower(stream: &StreamName, writer: &str, from: i64, to: i64) -> Follower {
    let registry = StreamWriters::from_value(json!({
        "instance_map": {"w1": {"host": "127.0.0.1", "port": 1}},
        "stream_writers": {"events": ["w1"]},
    }))
    .unwrap();
    let mut follower = Follower::new(InstanceName::from("worker"), Arc::new(registry));
    let writer = InstanceName::from(writer);
    follower.set_position(stream, &writer, Token(from)).unwrap();
    follower.connected();
    let line = format!("POSITION {stream} {writer} {to} {to}");
    let command = Command::decode(Bytes::from(line)).unwrap().unwrap();
    follower.handle_command(command);
    follower
}

/// The request a follower makes, as the drivers hand it to the source.
fn request(stream: StreamName, writer: &str, from: i64, to: i64) -> CatchUpRequest {
    next_request(&mut follower(&stream, writer, from, to)).expect("a catch-up")
}

fn next_request(follower: &mut Follower) -> Option<CatchUpRequest> {
    let mut request = None;
    while let Some(event) = follower.poll_event() {
        if let FollowerEvent::CatchUp(asked) = event {
            request = Some(asked);
        }
    }
    request
}

fn fetch<R: Runtime>(
    source: &HttpCatchUp<R>,
    request: CatchUpRequest,
) -> Result<CatchUpPage, HttpCatchUpError> {
    smol::block_on(source.fetch(request)).map_err(|error| {
        *error
            .downcast::<HttpCatchUpError>()
            .expect("an HttpCatchUpError")
    })
}

fn rows(page: &CatchUpPage) -> Vec<(i64, &str)> {
    page.updates
        .iter()
        .map(|(token, row)| (token.0, row.as_str()))
        .collect()
}

#[test]
fn sends_synapse_s_request_with_the_secret() {
    let server = Server::start(vec![ok(json!({
        "updates": [[6, ["@a:hs", "!r:hs"]], [6, ["@b:hs", "!r:hs"]], [9, ["@c:hs", "!s:hs"]]],
        "upto_token": 9,
        "limited": false,
    }))]);
    let source = HttpCatchUp::new(SmolRuntime, server.writers(), Some("s3cret".into()));
    let page = fetch(&source, request(StreamName::Typing, "master", 5, 9)).unwrap();
    assert_eq!(
        rows(&page),
        vec![
            (6, r#"["@a:hs","!r:hs"]"#),
            (6, r#"["@b:hs","!r:hs"]"#),
            (9, r#"["@c:hs","!s:hs"]"#)
        ]
    );
    assert_eq!((page.upto, page.limited), (Token(9), false));

    let seen = server.next();
    seen.txn_id("typing", 5, 9);
    assert_eq!(seen.header("authorization"), Some("Bearer s3cret"));
    assert_eq!(
        seen.header("host"),
        Some(format!("127.0.0.1:{}", server.addr.port()).as_str())
    );
}

#[test]
fn no_secret_no_authorization_header() {
    let server = Server::start(vec![ok(
        json!({"updates": [], "upto_token": 3, "limited": false}),
    )]);
    let source = HttpCatchUp::new(SmolRuntime, server.writers(), None);
    let page = fetch(&source, request(StreamName::Events, "w1", 2, 3)).unwrap();
    assert!(page.updates.is_empty());
    let seen = server.next();
    seen.txn_id("events", 2, 3);
    assert_eq!(seen.header("authorization"), None);
}

#[test]
fn limited_pages_and_a_fresh_txn_id_each_time() {
    let server = Server::start(vec![
        ok(json!({"updates": [[6, ["a"]], [7, ["b"]]], "upto_token": 7, "limited": true})),
        ok(json!({"updates": [[10, ["c"]]], "upto_token": 10, "limited": false})),
        ok(json!({"updates": [], "upto_token": 10, "limited": false})),
    ]);
    let source = HttpCatchUp::new(SmolRuntime, server.writers(), Some("k".into()));

    let mut follower = follower(&StreamName::Caches, "master", 5, 10);
    let asked = next_request(&mut follower).unwrap();
    let first = fetch(&source, asked.clone()).unwrap();
    assert_eq!(rows(&first), vec![(6, r#"["a"]"#), (7, r#"["b"]"#)]);
    assert_eq!((first.upto, first.limited), (Token(7), true));
    follower.handle_catch_up(asked.id, first).unwrap();
    // The follower asks again from the page's upto.
    let asked = next_request(&mut follower).unwrap();
    assert_eq!((asked.from, asked.to), (Token(7), Token(10)));
    let second = fetch(&source, asked.clone()).unwrap();
    assert_eq!(rows(&second), vec![(10, r#"["c"]"#)]);
    assert_eq!((second.upto, second.limited), (Token(10), false));
    // The same request again (a retry) is a new transaction.
    fetch(&source, asked.clone()).unwrap();
    follower.handle_catch_up(asked.id, second).unwrap();
    assert!(next_request(&mut follower).is_none());
    assert_eq!(
        follower.position(&StreamName::Caches, &InstanceName::master()),
        Some(Token(10))
    );

    let txns = [
        server.next().txn_id("caches", 5, 10),
        server.next().txn_id("caches", 7, 10),
        server.next().txn_id("caches", 7, 10),
    ];
    assert!(txns[0] != txns[1] && txns[1] != txns[2] && txns[0] != txns[2]);
}

#[test]
fn error_statuses_are_errors() {
    let server = Server::start(vec![
        Reply::Answer(
            404,
            br#"{"errcode":"M_UNRECOGNIZED","error":"Unrecognized request"}"#.to_vec(),
        ),
        Reply::Answer(
            500,
            br#"{"errcode":"M_UNKNOWN","error":"Internal server error"}"#.to_vec(),
        ),
        // A status with a body cut short is still that status.
        Reply::Raw(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 50\r\n\r\nupstream".to_vec()),
    ]);
    let source = HttpCatchUp::new(SmolRuntime, server.writers(), Some("wrong".into()));

    let error = fetch(&source, request(StreamName::Typing, "master", 1, 2)).unwrap_err();
    assert!(
        matches!(&error, HttpCatchUpError::Status { status: 404, body, .. } if body.contains("M_UNRECOGNIZED")),
        "{error}"
    );
    let error = fetch(&source, request(StreamName::Events, "w1", 1, 2)).unwrap_err();
    assert!(
        matches!(error, HttpCatchUpError::Status { status: 500, .. }),
        "{error}"
    );
    let message = error.to_string();
    assert!(
        message.starts_with("catch-up of events from w1: HTTP status 500: ")
            && message.contains("Internal server error"),
        "{message}"
    );
    assert!(!format!("{message} {error:?}").contains("wrong"));
    let error = fetch(&source, request(StreamName::Typing, "master", 1, 2)).unwrap_err();
    assert!(
        matches!(error, HttpCatchUpError::Status { status: 502, .. }),
        "{error}"
    );
}

#[test]
fn bad_and_truncated_json_are_errors() {
    let server = Server::start(vec![
        Reply::Answer(200, b"<html>not json</html>".to_vec()),
        Reply::Answer(200, br#"{"updates": [[1, ["a"]]], "upto_tok"#.to_vec()),
        Reply::Answer(200, br#"{"updates": [[1, ["a"]]], "upto_token": 1}"#.to_vec()),
        // Declares 100 bytes, sends 40 and hangs up.
        Reply::Raw(
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"updates\": [], \"upto_token\": 1, \"limi".to_vec(),
        ),
    ]);
    let source = HttpCatchUp::new(SmolRuntime, server.writers(), None);
    for _ in 0..3 {
        let error = fetch(&source, request(StreamName::Typing, "master", 0, 1)).unwrap_err();
        assert!(matches!(error, HttpCatchUpError::Page { .. }), "{error}");
        assert!(error.to_string().contains("answer: "), "{error}");
    }
    let error = fetch(&source, request(StreamName::Typing, "master", 0, 1)).unwrap_err();
    assert!(matches!(error, HttpCatchUpError::Request { .. }), "{error}");
}

#[test]
fn pages_beyond_the_request_are_passed_on_whole() {
    // Synapse's `caches` answers reach beyond the range asked for; the
    // source passes them on as answered, and the follower skips what it
    // did not ask for.
    let server = Server::start(vec![ok(json!({
        "updates": [[94, ["k1", null, 1]], [104, ["k4", null, 1]], [106, ["k6", null, 1]]],
        "upto_token": 104,
        "limited": false,
    }))]);
    let source = HttpCatchUp::new(SmolRuntime, server.writers(), None);
    let page = fetch(&source, request(StreamName::Caches, "master", 93, 104)).unwrap();
    let tokens: Vec<i64> = page.updates.iter().map(|(t, _)| t.0).collect();
    assert_eq!(tokens, vec![94, 104, 106]);
    assert_eq!(page.upto, Token(104));
    assert!(!page.limited);
}

#[test]
fn a_silent_server_times_out() {
    let server = Server::start(vec![Reply::Silent]);
    let source = HttpCatchUp::new(SmolRuntime, server.writers(), None)
        .with_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let error = fetch(&source, request(StreamName::Typing, "master", 0, 1)).unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(error, HttpCatchUpError::Timeout { timeout, .. } if timeout == Duration::from_millis(300)),
        "{error}"
    );
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "{took:?}"
    );
    server.next();
}

#[test]
fn oversized_answers_are_refused() {
    let cap = 64 * 1024;
    let big = format!(
        r#"{{"updates": [[1, ["{}"]]], "upto_token": 1, "limited": false}}"#,
        "x".repeat(cap)
    );
    let mut chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for chunk in big.as_bytes().chunks(1000) {
        chunked.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        chunked.extend_from_slice(chunk);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let server = Server::start(vec![
        // Declared too large: refused before reading.
        Reply::Raw(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n{}".to_vec()),
        // No length declared: refused once past the cap.
        Reply::Raw(chunked),
        // Just under the cap: fine.
        ok(json!({"updates": [[1, ["x".repeat(cap - 100)]]], "upto_token": 1, "limited": false})),
    ]);
    let source = HttpCatchUp::new(SmolRuntime, server.writers(), None).with_max_body(cap);
    for _ in 0..2 {
        let error = fetch(&source, request(StreamName::Typing, "master", 0, 1)).unwrap_err();
        assert!(
            matches!(error, HttpCatchUpError::BodyTooLarge { limit, .. } if limit == cap),
            "{error}"
        );
    }
    let page = fetch(&source, request(StreamName::Typing, "master", 0, 1)).unwrap();
    assert_eq!(page.updates.len(), 1);
}

#[test]
fn a_writer_that_is_not_listening_is_a_connect_error() {
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let writers = StreamWriters::from_value(json!({
        "instance_map": {"main": {"host": "127.0.0.1", "port": port}},
    }))
    .unwrap();
    let source = HttpCatchUp::new(SmolRuntime, Arc::new(writers), None);
    let error = fetch(&source, request(StreamName::Typing, "master", 0, 1)).unwrap_err();
    assert!(
        matches!(&error, HttpCatchUpError::Connect { address, .. } if *address == format!("127.0.0.1:{port}")),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .starts_with("catch-up of typing from master: cannot connect")
    );
}

#[cfg(unix)]
#[test]
fn unix_socket_instance_map_entries() {
    use std::os::unix::net::UnixListener;

    let dir = std::env::temp_dir().join(format!("http-catch-up-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("main.sock");
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let server = thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap() == 1 {
            head.push(byte[0]);
        }
        let body = br#"{"updates": [[2, []]], "upto_token": 2, "limited": false}"#;
        write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        stream.write_all(body).unwrap();
        String::from_utf8(head).unwrap()
    });
    let writers = StreamWriters::from_value(json!({
        "instance_map": {"main": {"path": path.to_str().unwrap()}},
    }))
    .unwrap();
    let source = HttpCatchUp::new(SmolRuntime, Arc::new(writers), Some("s".into()));
    let page = fetch(&source, request(StreamName::Typing, "master", 1, 2)).unwrap();
    assert_eq!(rows(&page), vec![(2, "[]")]);
    let head = server.join().unwrap();
    assert!(
        head.starts_with("GET /_synapse/replication/get_repl_stream_updates/typing/"),
        "{head}"
    );
    assert!(head.contains("authorization: Bearer s\r\n"), "{head}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "runtime-tokio")]
mod on_tokio {
    use super::*;
    use synapse_replication::transport::TokioRuntime;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn fetches_a_page() {
        let server = Server::start(vec![ok(
            json!({"updates": [[4, ["a"]]], "upto_token": 4, "limited": true}),
        )]);
        let tokio = runtime();
        let source = HttpCatchUp::new(
            TokioRuntime::new(tokio.handle().clone()),
            server.writers(),
            Some("s3cret".into()),
        );
        let page = tokio
            .block_on(source.fetch(request(StreamName::Typing, "master", 3, 9)))
            .unwrap();
        assert_eq!(rows(&page), vec![(4, r#"["a"]"#)]);
        assert_eq!((page.upto, page.limited), (Token(4), true));
        let seen = server.next();
        seen.txn_id("typing", 3, 9);
        assert_eq!(seen.header("authorization"), Some("Bearer s3cret"));
    }

    #[test]
    fn a_silent_server_times_out() {
        let server = Server::start(vec![Reply::Silent]);
        let tokio = runtime();
        let source = HttpCatchUp::new(
            TokioRuntime::new(tokio.handle().clone()),
            server.writers(),
            None,
        )
        .with_timeout(Duration::from_millis(200));
        let error = tokio
            .block_on(source.fetch(request(StreamName::Typing, "master", 0, 1)))
            .unwrap_err();
        let error = error.downcast::<HttpCatchUpError>().unwrap();
        assert!(
            matches!(*error, HttpCatchUpError::Timeout { .. }),
            "{error}"
        );
        server.next();
    }
}
