//! The account-data writer's six endpoints (issue 36, item 5), both ways,
//! on real loopback sockets:
//!
//! - Synapse 1.163.2's own classes (`replication/http/account_data.py`,
//!   driven by `tests/synapse/account_data.py` in the Synapse venv) and the
//!   crate send the same method, path, `Authorization` and body, byte for
//!   byte, and answer the same bytes; Synapse's `_handle_request` and the
//!   crate's handler get the same arguments;
//! - a Rust `ReplicationClient` calls a Rust `HttpServer` for each of the
//!   six (the server's default limits), positions both ways;
//! - none of the six caches (`CACHE = False`), so a call retried after a
//!   504 is handled again, as Synapse's are;
//! - a wrong secret, a malformed body, a malformed, remote or badly
//!   roomed user are answered with Synapse's errors, and the handler is
//!   not called.
//!
//! Needs the Synapse venv (`SYNAPSE_PYTHON`, see tests/common/synapse.rs).

#![cfg(all(
    unix,
    feature = "http-server",
    feature = "http-catch-up",
    feature = "runtime-smol"
))]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::{AsyncReadExt, AsyncWriteExt};
use serde_json::{Map, Value, json};
use synapse_replication::config::SynapseConfig;
use synapse_replication::http::{
    AccountDataAnswer, AccountDataRequest, CatchUpEndpoint, ReplicationError,
};
use synapse_replication::positions::History;
use synapse_replication::transport::{
    CallFailure, CallRetries, HttpServer, HttpServerConfig, ReplicationClient, SmolRuntime,
};
use synapse_replication::wire::{InstanceName, StreamName, Token};

const SECRET: &str = "s3cret";
const SERVER: &str = "example.com";

fn object(value: Value) -> Map<String, Value> {
    value.as_object().cloned().expect("an object")
}

/// One call of each endpoint, with what needs encoding: `@`, `:`, `!`,
/// `/`, a space, non-ASCII; keys out of order, a float.
fn requests() -> Vec<AccountDataRequest> {
    let user = "@alice:example.com".to_owned();
    let room = "!room:example.com".to_owned();
    vec![
        AccountDataRequest::AddUserAccountData {
            user_id: user.clone(),
            account_data_type: "org.example/ü x".into(),
            content: object(json!({"b": 1, "a": "é\n", "z": {"y": [1.5e16, null], "x": true}})),
        },
        AccountDataRequest::RemoveUserAccountData {
            user_id: user.clone(),
            account_data_type: "m.ignored_user_list".into(),
        },
        AccountDataRequest::AddRoomAccountData {
            user_id: user.clone(),
            room_id: room.clone(),
            account_data_type: "m.fully_read".into(),
            content: object(json!({"event_id": "$ev:example.com"})),
        },
        AccountDataRequest::RemoveRoomAccountData {
            user_id: user.clone(),
            room_id: room.clone(),
            account_data_type: "m.fully_read".into(),
        },
        AccountDataRequest::AddTag {
            user_id: user.clone(),
            room_id: room.clone(),
            tag: "u.work ☃".into(),
            content: object(json!({"order": 0.25})),
        },
        AccountDataRequest::RemoveTag {
            user_id: user,
            room_id: room,
            tag: "u.work ☃".into(),
        },
    ]
}

/// The keyword arguments Synapse's handler gives the endpoint's client.
fn kwargs(request: &AccountDataRequest) -> Value {
    let endpoint = request.endpoint();
    let names: Vec<&str> = endpoint.path_args().collect();
    let mut kwargs: Map<String, Value> = names
        .iter()
        .zip(request.args())
        .map(|(name, value)| ((*name).to_owned(), Value::from(value)))
        .collect();
    match request {
        // The handler passes `content={}` to this one too (ignored).
        AccountDataRequest::RemoveRoomAccountData { .. } => {
            kwargs.insert("content".into(), json!({}));
        }
        other => {
            if let Some(content) = other.added() {
                kwargs.insert("content".into(), Value::Object(content.clone()));
            }
        }
    }
    Value::Object(kwargs)
}

/// What Synapse's `_handle_request` hands the account-data handler: the
/// handler's method, then its arguments.
fn handled(request: &AccountDataRequest) -> Value {
    let method = match request {
        AccountDataRequest::AddUserAccountData { .. } => "add_account_data_for_user",
        AccountDataRequest::RemoveUserAccountData { .. } => "remove_account_data_for_user",
        AccountDataRequest::AddRoomAccountData { .. } => "add_account_data_to_room",
        AccountDataRequest::RemoveRoomAccountData { .. } => "remove_account_data_for_room",
        AccountDataRequest::AddTag { .. } => "add_tag_to_room",
        AccountDataRequest::RemoveTag { .. } => "remove_tag_from_room",
    };
    let mut out = vec![Value::from(method)];
    out.extend(request.args().into_iter().map(Value::from));
    if let Some(content) = request.added() {
        out.push(Value::Object(content.clone()));
    }
    Value::Array(out)
}

/// Runs tests/synapse/account_data.py: Synapse's own classes, each call
/// made and answered.
fn synapse_calls(
    caller_streams: &[(&str, i64)],
    callee_streams: &[(&str, i64)],
    max_stream_id: i64,
) -> Vec<Value> {
    let spec = json!({
        "caller": "master",
        "caller_streams": caller_streams,
        "callee": "rust_ad",
        "callee_streams": callee_streams,
        "secret": SECRET,
        "max_stream_id": max_stream_id,
        "calls": requests().iter().map(|request| json!({
            "endpoint": request.endpoint().name(),
            "kwargs": kwargs(request),
        })).collect::<Vec<_>>(),
    });
    common::synapse::run_script("account_data.py", &[], &spec.to_string())
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

/// The deployment as `own` sees it, with `rust_ad` (at `port`) writing
/// account data.
fn deployment(port: u16) -> SynapseConfig {
    SynapseConfig::from_value(json!({
        "server_name": SERVER,
        "redis": {"enabled": true},
        "worker_replication_secret": SECRET,
        "stream_writers": {"account_data": ["rust_ad"]},
        "instance_map": {
            "main": {"host": "127.0.0.1", "port": 1},
            "rust_ad": {"host": "127.0.0.1", "port": port},
        },
    }))
    .expect("config")
}

/// What the Rust writer's handler saw, and how it answers.
#[derive(Default)]
struct Writer {
    calls: Mutex<Vec<AccountDataRequest>>,
    handled: AtomicUsize,
    /// The `account_data` position, advanced by each change.
    position: AtomicUsize,
    /// The first this many calls take 2 s (beyond a short request timeout).
    slow: AtomicUsize,
}

/// `rust_ad`'s server: the six endpoints, answers carrying `caches` and
/// `account_data` as Synapse's account-data writer's do.
fn writer(writer: Arc<Writer>, config: HttpServerConfig) -> SocketAddr {
    let endpoint = CatchUpEndpoint::new(InstanceName::from("rust_ad"), Some(SECRET.into()))
        .with_streams([StreamName::AccountData]);
    let history = Arc::new(Mutex::new(History::new(10)));
    let positions = Arc::clone(&writer);
    let server = smol::block_on(HttpServer::bind(
        SmolRuntime,
        "127.0.0.1:0",
        endpoint,
        history,
    ))
    .expect("a listener")
    .with_config(config)
    .with_account_data(SERVER, move |request| {
        let writer = Arc::clone(&writer);
        async move {
            let n = writer.handled.fetch_add(1, Ordering::SeqCst);
            if n < writer.slow.load(Ordering::SeqCst) {
                smol::Timer::after(Duration::from_secs(2)).await;
            }
            writer.calls.lock().unwrap().push(request);
            let position = writer.position.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(AccountDataAnswer {
                max_stream_id: Token(position as i64),
            })
        }
        .boxed()
    })
    .with_positions(move || {
        vec![
            (StreamName::Caches, Token(3)),
            (
                StreamName::AccountData,
                Token(positions.position.load(Ordering::SeqCst) as i64),
            ),
        ]
    });
    let addr = server.local_addr().expect("its address");
    smol::spawn(server.run()).detach();
    addr
}

/// Sends one request; the status and the body.
fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: &str,
) -> (u16, String) {
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: rust_ad:80\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(secret) = auth {
        request.push_str(&format!("Authorization: Bearer {secret}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    smol::block_on(async move {
        let mut socket = smol::net::TcpStream::connect(addr).await.expect("connects");
        socket.write_all(request.as_bytes()).await.expect("writes");
        let mut answer = Vec::new();
        let _ = socket.read_to_end(&mut answer).await;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let status = answer
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or(0);
        let body = answer
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_owned())
            .unwrap_or_default();
        (status, body)
    })
}

/// A stand-in callee that records one request (request line,
/// `Authorization`, body) and answers `answer`.
fn record_one(
    answer: String,
) -> (
    SocketAddr,
    std::thread::JoinHandle<(String, String, String)>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a listener");
    let addr = listener.local_addr().expect("its address");
    let recorder = std::thread::spawn(move || {
        let (socket, _) = listener.accept().expect("a call");
        let mut reader = BufReader::new(socket);
        let mut line = String::new();
        reader.read_line(&mut line).expect("request line");
        let (mut length, mut authorization) = (0, String::new());
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).expect("a header");
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(": ").expect("name: value");
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse().expect("a length"),
                "authorization" => authorization = value.to_owned(),
                _ => {}
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).expect("the body");
        let mut socket = reader.into_inner();
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{answer}",
            answer.len()
        );
        socket.write_all(response.as_bytes()).expect("answers");
        (
            line.trim_end().to_owned(),
            authorization,
            String::from_utf8(body).expect("utf-8"),
        )
    });
    (addr, recorder)
}

#[test]
fn the_crate_sends_and_answers_what_synapse_s_own_classes_do() {
    let caller_streams = [("events", 12), ("caches", 5)];
    let synapse = synapse_calls(&caller_streams, &[("caches", 3), ("account_data", 7)], 7);
    assert_eq!(synapse.len(), 6);

    // The callee's side: Synapse's exact request to the Rust writer
    // (whose position is 7 after the change, as Synapse's callee's).
    let state = Arc::new(Writer::default());
    state.position.store(6, Ordering::SeqCst);
    let addr = writer(Arc::clone(&state), HttpServerConfig::default());

    for (request, synapse) in requests().iter().zip(&synapse) {
        let name = request.endpoint().name().to_owned();
        // What Synapse's class declares.
        assert_eq!(synapse["method"], "POST", "{name}");
        assert_eq!(synapse["cache"], false, "{name}");
        assert_eq!(synapse["wait_for_streams"], true, "{name}");
        assert_eq!(
            synapse["args"],
            Value::from(request.args()),
            "{name}: the path args in Synapse's order"
        );
        assert_eq!(synapse["authorization"], format!("Bearer {SECRET}"));

        // The caller's side: the crate's client, as main (`master`, which
        // writes events and caches), calls a stand-in for `rust_ad` that
        // answers Synapse's answer.
        let answer = synapse["answer"].as_str().expect("an answer").to_owned();
        let (callee, recorded) = record_one(answer);
        let client =
            ReplicationClient::from_synapse(SmolRuntime, &deployment(callee.port()), "master")
                .with_positions(move || {
                    caller_streams
                        .iter()
                        .map(|(stream, token)| (StreamName::from(*stream), Token(*token)))
                        .collect()
                });
        let answered = smol::block_on(client.account_data(request)).expect("answered");
        assert_eq!(answered.max_stream_id, Token(7), "{name}");
        let (line, authorization, body) = recorded.join().expect("the recorder");
        assert_eq!(
            line,
            format!(
                "POST {} HTTP/1.1",
                synapse["path"].as_str().expect("a path")
            ),
            "{name}: the path, byte for byte"
        );
        assert_eq!(authorization, format!("Bearer {SECRET}"));
        assert_eq!(body, synapse["body"], "{name}: the body, byte for byte");

        // The callee's side: Synapse's bytes to the Rust writer, which
        // answers Synapse's bytes, its handler given what Synapse's was.
        state.position.store(6, Ordering::SeqCst);
        let (status, answer) = send(
            addr,
            "POST",
            synapse["path"].as_str().expect("a path"),
            Some(SECRET),
            synapse["body"].as_str().expect("a body"),
        );
        assert_eq!(
            (status, Value::from(status)),
            (200, synapse["code"].clone()),
            "{answer}"
        );
        assert_eq!(
            answer, synapse["answer"],
            "{name}: the answer, byte for byte"
        );
        let got = state.calls.lock().unwrap().pop().expect("handled");
        assert_eq!(&got, request, "{name}");
        assert_eq!(handled(&got), synapse["handled"], "{name}");
    }
    assert_eq!(state.handled.load(Ordering::SeqCst), 6);
}

#[test]
fn a_rust_client_calls_a_rust_writer_for_each_of_the_six() {
    let state = Arc::new(Writer::default());
    let addr = writer(Arc::clone(&state), HttpServerConfig::default());
    let waited = Arc::new(Mutex::new(Vec::new()));
    let client = ReplicationClient::from_synapse(SmolRuntime, &deployment(addr.port()), "master")
        .with_positions(|| vec![(StreamName::Caches, Token(11))])
        .with_position_waits({
            let waited = Arc::clone(&waited);
            move |stream, writer, token, _deadline| {
                waited.lock().unwrap().push((stream, writer, token));
                async { true }.boxed()
            }
        });
    for (n, request) in requests().iter().enumerate() {
        let answer = smol::block_on(client.account_data(request)).expect("answered");
        let position = Token(n as i64 + 1);
        assert_eq!(answer.max_stream_id, position);
        assert_eq!(state.calls.lock().unwrap().last(), Some(request));
        // The caller waited for the writer's positions, account_data
        // among them, before it returned.
        let waits = std::mem::take(&mut *waited.lock().unwrap());
        assert_eq!(
            waits,
            [
                (StreamName::Caches, InstanceName::from("rust_ad"), Token(3)),
                (
                    StreamName::AccountData,
                    InstanceName::from("rust_ad"),
                    position
                ),
            ]
        );
    }
    assert_eq!(state.handled.load(Ordering::SeqCst), 6);
}

#[test]
fn a_call_retried_after_a_timeout_is_handled_again_as_synapse_s_are() {
    // None of the six caches (CACHE = False in Synapse): there is no txn
    // id to answer a retry from, so the retry runs the handler again.
    let state = Arc::new(Writer::default());
    state.slow.store(1, Ordering::SeqCst);
    let mut config = HttpServerConfig::default();
    config.request_timeout = Duration::from_millis(500);
    let addr = writer(Arc::clone(&state), config);
    let mut retries = CallRetries::default();
    retries.timeout_delay = Duration::from_millis(10);
    let client = ReplicationClient::from_synapse(SmolRuntime, &deployment(addr.port()), "master")
        .with_retries(retries);
    let request = &requests()[4];
    let answer = smol::block_on(client.account_data(request)).expect("answered on the retry");
    assert_eq!(state.handled.load(Ordering::SeqCst), 2, "handled twice");
    // The first run was dropped at its timeout: one change was made.
    assert_eq!(*state.calls.lock().unwrap(), std::slice::from_ref(request));
    assert_eq!(answer.max_stream_id, Token(1));
}

#[test]
fn bad_calls_get_synapse_s_errors_and_never_reach_the_handler() {
    let state = Arc::new(Writer::default());
    let addr = writer(Arc::clone(&state), HttpServerConfig::default());
    let base = "/_synapse/replication";
    let tag = format!("{base}/add_tag/%40alice%3Aexample.com/%21r%3Aexample.com/u.work");
    let ok = r#"{"content":{"order":0.5}}"#;
    let cases: Vec<(String, Option<&str>, &str, u16, &str)> = vec![
        // The secret, before the body.
        (tag.clone(), None, ok, 401, "M_MISSING_TOKEN"),
        (tag.clone(), Some("wrong"), ok, 401, "M_UNKNOWN_TOKEN"),
        // The body.
        (tag.clone(), Some(SECRET), "nope", 400, "M_NOT_JSON"),
        (tag.clone(), Some(SECRET), "[1]", 400, "M_BAD_JSON"),
        (tag.clone(), Some(SECRET), "{}", 400, "M_BAD_JSON"),
        (
            tag.clone(),
            Some(SECRET),
            r#"{"content":[]}"#,
            400,
            "M_BAD_JSON",
        ),
        // Users and rooms.
        (
            format!("{base}/add_user_account_data/alice/m.direct"),
            Some(SECRET),
            r#"{"content":{}}"#,
            400,
            "M_INVALID_PARAM",
        ),
        (
            format!("{base}/add_user_account_data/%40alice/m.direct"),
            Some(SECRET),
            r#"{"content":{}}"#,
            400,
            "M_INVALID_PARAM",
        ),
        (
            format!("{base}/remove_user_account_data/%40alice%3Aremote.org/m.direct"),
            Some(SECRET),
            "{}",
            403,
            "M_FORBIDDEN",
        ),
        (
            format!("{base}/remove_tag/%40alice%3Aexample.com/room/u.work"),
            Some(SECRET),
            "{}",
            400,
            "M_INVALID_PARAM",
        ),
        // No txn id on these paths.
        (
            format!("{tag}/txn1"),
            Some(SECRET),
            ok,
            404,
            "M_UNRECOGNIZED",
        ),
    ];
    for (path, auth, body, status, errcode) in &cases {
        let (got, answer) = send(addr, "POST", path, *auth, body);
        assert_eq!(got, *status, "{path} {body}: {answer}");
        let answer: Value = serde_json::from_str(&answer).expect("Synapse's error body");
        assert_eq!(answer["errcode"], *errcode, "{path} {body}");
        assert!(answer["error"].is_string(), "{answer}");
    }
    let (got, _) = send(addr, "GET", &tag, Some(SECRET), "");
    assert_eq!(got, 405);
    // Synapse's words for a user id that is not one.
    let (_, answer) = send(
        addr,
        "POST",
        &format!("{base}/add_user_account_data/alice/m.direct"),
        Some(SECRET),
        r#"{"content":{}}"#,
    );
    assert_eq!(
        answer,
        r#"{"error":"Expected UserID string to start with '@'","errcode":"M_INVALID_PARAM"}"#
    );
    // Through the client: the callee's error, relayed.
    let client = ReplicationClient::from_synapse(SmolRuntime, &deployment(addr.port()), "master");
    let error = smol::block_on(client.account_data(&AccountDataRequest::RemoveTag {
        user_id: "@mallory:remote.org".into(),
        room_id: "!r:example.com".into(),
        tag: "u.work".into(),
    }))
    .expect_err("a remote user");
    assert!(
        matches!(&error.failure, CallFailure::Remote(remote)
            if remote.status == 403 && remote.errcode == "M_FORBIDDEN"),
        "{error}"
    );
    assert_eq!(
        state.handled.load(Ordering::SeqCst),
        0,
        "the handler was called"
    );
    // And a good call still goes through.
    let (got, answer) = send(addr, "POST", &tag, Some(SECRET), ok);
    assert_eq!(got, 200, "{answer}");
    assert_eq!(state.handled.load(Ordering::SeqCst), 1);
}

#[test]
fn a_handler_s_refusal_is_answered_as_synapse_answers_a_synapse_error() {
    let endpoint = CatchUpEndpoint::new(InstanceName::from("rust_ad"), Some(SECRET.into()));
    let history = Arc::new(Mutex::new(History::new(10)));
    let server = smol::block_on(HttpServer::bind(
        SmolRuntime,
        "127.0.0.1:0",
        endpoint,
        history,
    ))
    .expect("a listener")
    .with_account_data(SERVER, |_| {
        async {
            Err(ReplicationError::refused(
                404,
                "M_NOT_FOUND",
                "no such user",
            ))
        }
        .boxed()
    });
    let addr = server.local_addr().expect("its address");
    smol::spawn(server.run()).detach();
    let client = ReplicationClient::from_synapse(SmolRuntime, &deployment(addr.port()), "master");
    let error = smol::block_on(client.account_data(&requests()[0])).expect_err("refused");
    assert!(
        matches!(&error.failure, CallFailure::Remote(remote)
            if remote.status == 404 && remote.errcode == "M_NOT_FOUND" && remote.message == "no such user"),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .starts_with("replication call add_user_account_data on rust_ad: 404"),
        "{error}"
    );
}
