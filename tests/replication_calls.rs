//! The replication HTTP API's calls on `HttpServer`, against real
//! sockets: what Synapse's `ReplicationEndpoint` does (the secret before
//! the body, a retry answered and not handled again, concurrent duplicates
//! handled once, the caller's positions waited for, the callee's in the
//! answer), and the refusals where Synapse does worse (a txn id reused for
//! another request, positions of an unknown stream or writer, bodies that
//! are not JSON objects or too large), none of which reaches the handler.

#![cfg(all(feature = "http-server", feature = "runtime-smol"))]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::{AsyncReadExt, AsyncWriteExt};
use serde_json::{Map, Value, json};
use synapse_replication::config::SynapseConfig;
use synapse_replication::http::{
    CatchUpEndpoint, ReplicationEndpoint, ReplicationError, ReplicationRequest,
};
use synapse_replication::positions::History;
use synapse_replication::transport::{HttpServer, HttpServerConfig, SmolRuntime};
use synapse_replication::wire::{InstanceName, StreamName, Token};

const SECRET: &str = "s3cret";

/// What the handler saw.
#[derive(Default)]
struct Seen {
    calls: Mutex<Vec<ReplicationRequest>>,
    /// Calls the handler started.
    handled: AtomicUsize,
    /// Calls the handler ran to their end.
    ended: AtomicUsize,
    /// While set, the handler does not answer.
    held: AtomicBool,
}

/// A server for `rust1` serving `fed_send_edu`, whose handler records
/// each call and takes `delay` to answer; answers carry `typing` at 42.
fn server(seen: Arc<Seen>, delay: Duration, config: HttpServerConfig) -> SocketAddr {
    let synapse = SynapseConfig::from_value(json!({
        "server_name": "example.com",
        "redis": {"enabled": true},
        "stream_writers": {"events": ["persister1"], "typing": ["rust1"]},
        "instance_map": {
            "main": {"host": "127.0.0.1", "port": 1},
            "persister1": {"host": "127.0.0.1", "port": 2},
            "rust1": {"host": "127.0.0.1", "port": 3},
        },
    }))
    .expect("config");
    let endpoint = CatchUpEndpoint::new(InstanceName::from("rust1"), Some(SECRET.into()));
    let history = Arc::new(Mutex::new(History::new(10)));
    let server = smol::block_on(HttpServer::bind(
        SmolRuntime,
        "127.0.0.1:0",
        endpoint,
        history,
    ))
    .expect("a listener")
    .with_config(config)
    .with_writers(synapse.writers().clone())
    .with_endpoint(ReplicationEndpoint::fed_send_edu(), move |call| {
        let seen = Arc::clone(&seen);
        async move {
            seen.handled.fetch_add(1, Ordering::SeqCst);
            smol::Timer::after(delay).await;
            while seen.held.load(Ordering::SeqCst) {
                smol::Timer::after(Duration::from_millis(10)).await;
            }
            seen.ended.fetch_add(1, Ordering::SeqCst);
            let n = seen.handled.load(Ordering::SeqCst);
            seen.calls.lock().unwrap().push(call.clone());
            if call.content.get("refuse").is_some() {
                return Err(ReplicationError::refused(
                    403,
                    "M_FORBIDDEN",
                    "refused here",
                ));
            }
            let mut answer = Map::new();
            answer.insert("handled".into(), Value::from(n));
            Ok(answer)
        }
        .boxed()
    })
    .with_positions(|| vec![(StreamName::Typing, Token(42))]);
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
) -> impl std::future::Future<Output = (u16, String)> + Send + use<> {
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: rust1:80\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(secret) = auth {
        request.push_str(&format!("Authorization: Bearer {secret}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    async move {
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
    }
}

fn edu(txn: &str) -> String {
    format!("/_synapse/replication/fed_send_edu/m.typing/{txn}")
}

const BODY: &str = r#"{"origin":"remote.org","content":{"room_id":"!r:x","user_id":"@u:remote.org","typing":true}}"#;

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body:?}"))
}

#[test]
fn a_call_is_handled_once_and_its_retries_answered() {
    let seen = Arc::new(Seen::default());
    let addr = server(
        Arc::clone(&seen),
        Duration::ZERO,
        HttpServerConfig::default(),
    );
    smol::block_on(async {
        let (status, body) = send(addr, "POST", &edu("t1"), Some(SECRET), BODY).await;
        assert_eq!(status, 200, "{body}");
        // The callee's positions, for the caller to wait for.
        assert_eq!(
            json(&body),
            json(r#"{"handled":1,"_INT_STREAM_POS":{"typing":42}}"#)
        );
        // A retry (Synapse's, after a 504 or a lost answer) is answered
        // what the first was, and not handled again.
        let (status, again) = send(addr, "POST", &edu("t1"), Some(SECRET), BODY).await;
        assert_eq!((status, json(&again)), (200, json(&body)));
        assert_eq!(seen.handled.load(Ordering::SeqCst), 1);
        // The handler got the content, the path argument, the txn id.
        let calls = seen.calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].arg("edu_type"), Some("m.typing"));
        assert_eq!(calls[0].txn_id.as_deref(), Some("t1"));
        assert_eq!(Value::Object(calls[0].content.clone()), json(BODY));
        // Another txn id is another call.
        let (status, _) = send(addr, "POST", &edu("t2"), Some(SECRET), BODY).await;
        assert_eq!(status, 200);
        assert_eq!(seen.handled.load(Ordering::SeqCst), 2);
    });
}

#[test]
fn concurrent_duplicates_are_handled_once() {
    let seen = Arc::new(Seen::default());
    let addr = server(
        Arc::clone(&seen),
        Duration::from_millis(300),
        HttpServerConfig::default(),
    );
    smol::block_on(async {
        let calls = (0..4).map(|_| send(addr, "POST", &edu("dup"), Some(SECRET), BODY));
        let answers = futures::future::join_all(calls).await;
        for (status, body) in &answers {
            assert_eq!(*status, 200, "{body}");
            assert_eq!(json(body)["handled"], 1, "{body}");
        }
        assert_eq!(seen.handled.load(Ordering::SeqCst), 1);
    });
}

#[test]
fn a_refusal_is_not_kept_and_a_reused_txn_id_is_refused() {
    let seen = Arc::new(Seen::default());
    let addr = server(
        Arc::clone(&seen),
        Duration::ZERO,
        HttpServerConfig::default(),
    );
    smol::block_on(async {
        let refused = r#"{"origin":"remote.org","content":{},"refuse":true}"#;
        let (status, body) = send(addr, "POST", &edu("r"), Some(SECRET), refused).await;
        assert_eq!(
            (status, json(&body)),
            (
                403,
                json(r#"{"error":"refused here","errcode":"M_FORBIDDEN"}"#)
            )
        );
        // Not kept: the retry is handled again (as Synapse forgets a
        // failure).
        let (status, _) = send(addr, "POST", &edu("r"), Some(SECRET), refused).await;
        assert_eq!(status, 403);
        assert_eq!(seen.handled.load(Ordering::SeqCst), 2);
        // A txn id answered, then reused for another body: refused, not
        // answered with the first's answer as Synapse would.
        let (status, _) = send(addr, "POST", &edu("k"), Some(SECRET), BODY).await;
        assert_eq!(status, 200);
        let other = r#"{"origin":"elsewhere.org","content":{}}"#;
        let (status, body) = send(addr, "POST", &edu("k"), Some(SECRET), other).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(json(&body)["errcode"], "M_INVALID_PARAM");
        assert_eq!(seen.handled.load(Ordering::SeqCst), 3);
    });
}

/// Waits (at most 10 s) for `condition`.
async fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "never: {what}");
        smol::Timer::after(Duration::from_millis(10)).await;
    }
}

#[test]
fn a_caller_that_goes_away_cancels_no_handler() {
    let seen = Arc::new(Seen::default());
    seen.held.store(true, Ordering::SeqCst);
    let addr = server(
        Arc::clone(&seen),
        Duration::ZERO,
        HttpServerConfig::default(),
    );
    smol::block_on(async {
        // The first caller goes away while its call is being handled.
        let first = smol::spawn(send(addr, "POST", &edu("gone"), Some(SECRET), BODY));
        eventually("the call is handled", || {
            seen.handled.load(Ordering::SeqCst) == 1
        })
        .await;
        drop(first);
        // Long enough for the server to see the connection closed.
        smol::Timer::after(Duration::from_millis(500)).await;
        // Its retry comes while the first run is still going: it waits
        // for that run, which is neither cancelled nor started again.
        let retry = smol::spawn(send(addr, "POST", &edu("gone"), Some(SECRET), BODY));
        smol::Timer::after(Duration::from_millis(300)).await;
        seen.held.store(false, Ordering::SeqCst);
        let (status, body) = retry.await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(json(&body)["handled"], 1, "{body}");
        let (status, again) = send(addr, "POST", &edu("gone"), Some(SECRET), BODY).await;
        assert_eq!((status, json(&again)), (200, json(&body)));
        assert_eq!(seen.handled.load(Ordering::SeqCst), 1, "started once");
        assert_eq!(seen.ended.load(Ordering::SeqCst), 1, "ran to its end");
    });
}

#[test]
fn a_call_not_answered_in_time_runs_on_and_its_retries_get_its_answer() {
    let seen = Arc::new(Seen::default());
    seen.held.store(true, Ordering::SeqCst);
    let mut config = HttpServerConfig::default();
    config.request_timeout = Duration::from_secs(1);
    let addr = server(Arc::clone(&seen), Duration::ZERO, config);
    smol::block_on(async {
        // Not answered within the request timeout: a 504, which Synapse
        // retries with the same txn id.
        let (status, body) = send(addr, "POST", &edu("slow"), Some(SECRET), BODY).await;
        assert_eq!(status, 504, "{body}");
        // A retry while the run goes on waits for it, and is answered 504
        // too when it is still not done: the run is not started again.
        let (status, body) = send(addr, "POST", &edu("slow"), Some(SECRET), BODY).await;
        assert_eq!(status, 504, "{body}");
        assert_eq!(seen.handled.load(Ordering::SeqCst), 1, "started again");
        // Once it ends, its answer is every retry's.
        seen.held.store(false, Ordering::SeqCst);
        eventually("the run ends", || seen.ended.load(Ordering::SeqCst) == 1).await;
        let (status, body) = send(addr, "POST", &edu("slow"), Some(SECRET), BODY).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(json(&body)["handled"], 1, "{body}");
        assert_eq!(seen.handled.load(Ordering::SeqCst), 1);
        assert_eq!(seen.ended.load(Ordering::SeqCst), 1);
    });
}

#[test]
fn a_body_trickled_after_prompt_headers_is_cut_at_the_body_timeout() {
    use std::io::{Read, Write};
    let seen = Arc::new(Seen::default());
    let mut config = HttpServerConfig::default();
    config.body_timeout = Duration::from_secs(1);
    let addr = server(Arc::clone(&seen), Duration::ZERO, config);
    // Headers with the secret at once (the call is admitted), then the
    // body a byte every 100 ms: all of it well within the request
    // timeout, never within the body timeout.
    let mut socket = std::net::TcpStream::connect(addr).expect("connects");
    let headers = format!(
        "POST {} HTTP/1.1\r\nHost: rust1:80\r\nAuthorization: Bearer {SECRET}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        edu("trickled"),
        BODY.len()
    );
    socket.write_all(headers.as_bytes()).expect("writes");
    let mut writer = socket.try_clone().expect("a second handle");
    let trickle = std::thread::spawn(move || {
        for byte in BODY.bytes() {
            if writer.write_all(&[byte]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    socket
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("a read timeout");
    let mut answer = Vec::new();
    let _ = socket.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer:?}");
    assert_eq!(seen.handled.load(Ordering::SeqCst), 0, "handled");
    drop(socket);
    trickle.join().expect("the writer");
}

/// A request (method, path, secret, body) and the status and errcode it
/// is answered.
type Case<'a> = (&'a str, String, Option<&'a str>, String, u16, &'a str);

#[test]
fn bad_calls_are_refused_before_the_handler() {
    let seen = Arc::new(Seen::default());
    let mut config = HttpServerConfig::default();
    config.max_request_bytes = 16 << 10;
    let addr = server(Arc::clone(&seen), Duration::ZERO, config);
    let positions = |streams: &str, instance: &str| {
        format!(
            r#"{{"origin":"o","content":{{}},"_INT_STREAM_POS":{{"streams":{streams},"instance_name":"{instance}"}}}}"#
        )
    };
    let big = format!(r#"{{"origin":"{}"}}"#, "x".repeat(20 << 10));
    let cases: Vec<Case> = vec![
        ("POST", edu("a"), None, BODY.into(), 401, "M_MISSING_TOKEN"),
        (
            "POST",
            edu("a"),
            Some("wrong"),
            BODY.into(),
            401,
            "M_UNKNOWN_TOKEN",
        ),
        (
            "GET",
            edu("a"),
            Some(SECRET),
            String::new(),
            405,
            "M_UNRECOGNIZED",
        ),
        (
            "POST",
            "/_synapse/replication/fed_send_edu/m.typing".into(),
            Some(SECRET),
            BODY.into(),
            404,
            "M_UNRECOGNIZED",
        ),
        (
            "POST",
            "/_synapse/replication/send_events/x/y".into(),
            Some(SECRET),
            BODY.into(),
            404,
            "M_UNRECOGNIZED",
        ),
        (
            "POST",
            edu("a"),
            Some(SECRET),
            "{not json".into(),
            400,
            "M_NOT_JSON",
        ),
        (
            "POST",
            edu("a"),
            Some(SECRET),
            "[1,2]".into(),
            400,
            "M_BAD_JSON",
        ),
        ("POST", edu("a"), Some(SECRET), big, 413, "M_TOO_LARGE"),
        (
            "POST",
            edu("a"),
            Some(SECRET),
            positions(r#"{"frobs":1}"#, "persister1"),
            400,
            "M_UNKNOWN",
        ),
        (
            "POST",
            edu("a"),
            Some(SECRET),
            positions(r#"{"events":1}"#, "main"),
            400,
            "M_FORBIDDEN",
        ),
        (
            "POST",
            edu("a"),
            Some(SECRET),
            positions(r#"{"events":"1"}"#, "persister1"),
            400,
            "M_INVALID_PARAM",
        ),
        (
            "POST",
            edu("a"),
            Some(SECRET),
            r#"{"_INT_STREAM_POS":[]}"#.into(),
            400,
            "M_INVALID_PARAM",
        ),
    ];
    smol::block_on(async {
        for (method, path, auth, body, status, errcode) in cases {
            let (got, answer) = send(addr, method, &path, auth, &body).await;
            assert_eq!(got, status, "{method} {path} {:.80}: {answer}", body);
            assert_eq!(
                json(&answer)["errcode"],
                errcode,
                "{method} {path} {:.80}",
                body
            );
        }
        assert_eq!(
            seen.handled.load(Ordering::SeqCst),
            0,
            "a bad call reached the handler"
        );
        // A caller that may write what it says it wrote is handled.
        let body = positions(r#"{"events":5,"caches":9}"#, "persister1");
        let (status, _) = send(addr, "POST", &edu("ok"), Some(SECRET), &body).await;
        assert_eq!(status, 200);
        assert_eq!(seen.handled.load(Ordering::SeqCst), 1);
    });
}

#[test]
fn the_caller_s_positions_are_waited_for_before_the_call_is_handled() {
    let seen = Arc::new(Seen::default());
    // The follower's view, moved by the test.
    let reached = Arc::new(Mutex::new(Token(0)));
    let asked = Arc::new(Mutex::new(Vec::new()));
    let synapse = SynapseConfig::from_value(json!({
        "server_name": "example.com",
        "redis": {"enabled": true},
        "stream_writers": {"events": ["persister1"]},
        "instance_map": {"persister1": {"host": "127.0.0.1", "port": 2}},
    }))
    .expect("config");
    let endpoint = CatchUpEndpoint::new(InstanceName::from("rust1"), Some(SECRET.into()));
    let history = Arc::new(Mutex::new(History::new(10)));
    let server = smol::block_on(HttpServer::bind(
        SmolRuntime,
        "127.0.0.1:0",
        endpoint,
        history,
    ))
    .expect("a listener")
    .with_writers(synapse.writers().clone())
    .with_endpoint(ReplicationEndpoint::fed_send_edu(), {
        let seen = Arc::clone(&seen);
        move |call| {
            seen.handled.fetch_add(1, Ordering::SeqCst);
            seen.calls.lock().unwrap().push(call);
            async { Ok(Map::new()) }.boxed()
        }
    })
    .with_position_waits({
        let reached = Arc::clone(&reached);
        let asked = Arc::clone(&asked);
        move |stream, writer, token, deadline| {
            asked.lock().unwrap().push((stream, writer, token));
            let reached = Arc::clone(&reached);
            async move {
                while Instant::now() < deadline {
                    if *reached.lock().unwrap() >= token {
                        return true;
                    }
                    smol::Timer::after(Duration::from_millis(10)).await;
                }
                false
            }
            .boxed()
        }
    });
    let addr = server.local_addr().expect("its address");
    smol::spawn(server.run()).detach();
    smol::block_on(async {
        let body = r#"{"origin":"o","content":{},"_INT_STREAM_POS":{"streams":{"events":7},"instance_name":"persister1"}}"#;
        let call = smol::spawn(send(addr, "POST", &edu("w"), Some(SECRET), body));
        smol::Timer::after(Duration::from_millis(300)).await;
        assert_eq!(
            seen.handled.load(Ordering::SeqCst),
            0,
            "handled before the position was seen"
        );
        assert_eq!(
            *asked.lock().unwrap(),
            [(
                StreamName::Events,
                InstanceName::from("persister1"),
                Token(7)
            )]
        );
        *reached.lock().unwrap() = Token(7);
        let (status, answer) = call.await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(seen.handled.load(Ordering::SeqCst), 1);
        // Without `with_positions`, the answer says no positions.
        assert_eq!(json(&answer), json(r#"{"_INT_STREAM_POS":{}}"#));
        // A position never reached: handled anyway after Synapse's five
        // seconds.
        let body = r#"{"origin":"o","content":{},"_INT_STREAM_POS":{"streams":{"events":99},"instance_name":"persister1"}}"#;
        let (status, _) = send(addr, "POST", &edu("never"), Some(SECRET), body).await;
        assert_eq!(status, 200);
        assert_eq!(seen.handled.load(Ordering::SeqCst), 2);
    });
}

/// The crate's own caller against the crate's own server: what Synapse's
/// `make_client` does.
#[cfg(feature = "http-catch-up")]
mod caller {
    use super::*;
    use synapse_replication::transport::{CallFailure, CallRetries, ReplicationClient};

    /// A deployment where `rust1` (the server) and `caller1` both have
    /// addresses; `port` is the server's.
    fn synapse(port: u16) -> SynapseConfig {
        SynapseConfig::from_value(json!({
            "server_name": "example.com",
            "redis": {"enabled": true},
            "worker_replication_secret": SECRET,
            "stream_writers": {"typing": ["rust1"], "events": ["caller1"]},
            "instance_map": {
                "main": {"host": "127.0.0.1", "port": 1},
                "rust1": {"host": "127.0.0.1", "port": port},
                "caller1": {"host": "127.0.0.1", "port": 1},
            },
        }))
        .expect("config")
    }

    /// A server for `rust1` whose `fed_send_edu` handler answers with
    /// `answers` in turn (then 200), recording each call's txn id and
    /// content.
    fn serve(
        answers: Vec<Result<(), ReplicationError>>,
    ) -> (SocketAddr, Arc<Mutex<Vec<ReplicationRequest>>>) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let answers = Arc::new(Mutex::new(answers.into_iter()));
        let endpoint = CatchUpEndpoint::new(InstanceName::from("rust1"), Some(SECRET.into()));
        let history = Arc::new(Mutex::new(History::new(10)));
        let seen = Arc::clone(&calls);
        let server = smol::block_on(HttpServer::bind(
            SmolRuntime,
            "127.0.0.1:0",
            endpoint,
            history,
        ))
        .expect("a listener")
        .with_endpoint(ReplicationEndpoint::fed_send_edu(), move |call| {
            seen.lock().unwrap().push(call);
            let answer = answers.lock().unwrap().next().unwrap_or(Ok(()));
            async move { answer.map(|()| Map::new()) }.boxed()
        })
        .with_positions(|| vec![(StreamName::Typing, Token(42))]);
        let addr = server.local_addr().expect("its address");
        smol::spawn(server.run()).detach();
        (addr, calls)
    }

    fn quick() -> CallRetries {
        let mut retries = CallRetries::default();
        retries.first_delay = Duration::from_millis(10);
        retries.timeout_delay = Duration::from_millis(10);
        retries.connect_attempts = 2;
        retries
    }

    fn content() -> Map<String, Value> {
        json(r#"{"origin":"remote.org","content":{"room_id":"!r:x","user_id":"@u:remote.org","typing":true}}"#)
            .as_object()
            .cloned()
            .expect("an object")
    }

    #[test]
    fn a_call_carries_this_process_s_positions_and_waits_for_the_callee_s() {
        let (addr, calls) = serve(Vec::new());
        let waited = Arc::new(Mutex::new(Vec::new()));
        let client = ReplicationClient::from_synapse(SmolRuntime, &synapse(addr.port()), "caller1")
            .with_positions(|| vec![(StreamName::Events, Token(7))])
            .with_position_waits({
                let waited = Arc::clone(&waited);
                move |stream, writer, token, _deadline| {
                    waited.lock().unwrap().push((stream, writer, token));
                    async { true }.boxed()
                }
            });
        let answer = smol::block_on(client.call(
            &InstanceName::from("rust1"),
            &ReplicationEndpoint::fed_send_edu(),
            &["m.typing"],
            content(),
        ))
        .expect("answered");
        assert_eq!(answer.positions, [(StreamName::Typing, Token(42))]);
        assert!(answer.seen);
        assert!(answer.content.is_empty());
        // Waited for the callee's position, on the callee.
        assert_eq!(
            *waited.lock().unwrap(),
            [(StreamName::Typing, InstanceName::from("rust1"), Token(42))]
        );
        // The callee got the content and the caller's positions.
        let calls = calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].content, content());
        let caller = calls[0].caller.clone().expect("positions");
        assert_eq!(caller.instance.as_str(), "caller1");
        assert_eq!(caller.streams, [(StreamName::Events, Token(7))]);
        assert_eq!(
            calls[0].txn_id.as_ref().map(String::len).map(|n| n > 0),
            Some(true)
        );
    }

    /// Any timeout works, up to `Duration::MAX` (as long as it takes).
    #[test]
    fn a_timeout_up_to_duration_max_is_taken() {
        let (addr, calls) = serve(Vec::new());
        let client = ReplicationClient::from_synapse(SmolRuntime, &synapse(addr.port()), "caller1")
            .with_timeout(Duration::MAX);
        smol::block_on(client.call(
            &InstanceName::from("rust1"),
            &ReplicationEndpoint::fed_send_edu(),
            &["m.typing"],
            content(),
        ))
        .expect("answered");
        assert_eq!(calls.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_504_is_retried_with_the_same_txn_id() {
        let timed_out = ReplicationError::refused(504, "M_UNKNOWN", "Timed out");
        let (addr, calls) = serve(vec![Err(timed_out.clone()), Err(timed_out)]);
        let client = ReplicationClient::from_synapse(SmolRuntime, &synapse(addr.port()), "caller1")
            .with_retries(quick());
        let answer = smol::block_on(client.call(
            &InstanceName::from("rust1"),
            &ReplicationEndpoint::fed_send_edu(),
            &["m.typing"],
            content(),
        ))
        .expect("answered after two retries");
        // No waits configured: answered, positions not seen.
        assert!(!answer.seen);
        let calls = calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 3);
        assert!(
            calls.iter().all(|call| call.txn_id == calls[0].txn_id),
            "a retry took a new txn id"
        );
        // Two calls are two txn ids.
        let (addr, calls) = serve(Vec::new());
        let client = ReplicationClient::from_synapse(SmolRuntime, &synapse(addr.port()), "caller1");
        for _ in 0..2 {
            smol::block_on(client.call(
                &InstanceName::from("rust1"),
                &ReplicationEndpoint::fed_send_edu(),
                &["m.typing"],
                content(),
            ))
            .expect("answered");
        }
        let calls = calls.lock().unwrap().clone();
        assert_ne!(calls[0].txn_id, calls[1].txn_id);
    }

    #[test]
    fn errors_say_which_instance_and_endpoint() {
        let (addr, _) = serve(vec![Err(ReplicationError::refused(
            403,
            "M_FORBIDDEN",
            "not you",
        ))]);
        let client = ReplicationClient::from_synapse(SmolRuntime, &synapse(addr.port()), "caller1")
            .with_retries(quick());
        let call = |instance: &str| {
            smol::block_on(client.call(
                &InstanceName::from(instance),
                &ReplicationEndpoint::fed_send_edu(),
                &["m.typing"],
                content(),
            ))
            .expect_err("refused")
        };
        let error = call("rust1");
        assert!(
            matches!(&error.failure, CallFailure::Remote(remote) if remote.status == 403 && remote.errcode == "M_FORBIDDEN"),
            "{error}"
        );
        assert_eq!(
            error.to_string(),
            "replication call fed_send_edu on rust1: 403 M_FORBIDDEN: not you"
        );
        assert!(matches!(call("caller1").failure, CallFailure::ToItself));
        assert!(matches!(
            call("nobody").failure,
            CallFailure::NotInInstanceMap
        ));
        // `main`'s port 1 refuses: retried, then the connection's error.
        let error = call("master");
        assert!(
            matches!(error.failure, CallFailure::Connect { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("127.0.0.1:1"), "{error}");
        // A wrong secret: the callee's 401, and the secret in no error.
        let wrong = SynapseConfig::from_value(json!({
            "server_name": "example.com",
            "worker_replication_secret": "not-the-secret",
            "instance_map": {"rust1": {"host": "127.0.0.1", "port": addr.port()}},
        }))
        .expect("config");
        let client = ReplicationClient::from_synapse(SmolRuntime, &wrong, "caller1");
        let error = smol::block_on(client.call(
            &InstanceName::from("rust1"),
            &ReplicationEndpoint::fed_send_edu(),
            &["m.typing"],
            content(),
        ))
        .expect_err("refused");
        assert!(
            matches!(&error.failure, CallFailure::Remote(remote) if remote.status == 401),
            "{error}"
        );
        assert!(!format!("{error} {error:?} {client:?}").contains("not-the-secret"));
    }
}
