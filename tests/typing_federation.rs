//! The Rust typing writer (`examples/typing_writer`) in a federated
//! deployment: two Synapse 1.163.2 homeservers federating over loopback,
//! the first with the Rust writer as its `stream_writers.typing`.
//!
//! Synapse forwards each inbound `m.typing` EDU to the typing writer
//! (`POST /_synapse/replication/fed_send_edu/m.typing/<txn_id>`), and
//! fails the whole federation transaction when that call fails; outbound
//! typing is sent by Synapse's federation sender from the typing stream.
//!
//! Needs the Synapse venv (`SYNAPSE_PYTHON`, see tests/common/synapse.rs),
//! redis-server and openssl.

#![cfg(all(
    unix,
    feature = "http-server",
    feature = "http-catch-up",
    feature = "runtime-smol"
))]

mod common;
#[path = "../examples/typing_writer/writer.rs"]
mod writer;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::federation::{FederatingRig, free_port};
use common::synapse::{SynapseRig, segment};
use serde_json::{Value, json};
use synapse_replication::config::SynapseConfig;
use synapse_replication::wire::Token;

const INSTANCE: &str = "rust1";

/// Only typing, in `/sync` answers: other updates (presence...) neither
/// show nor end a long poll.
const TYPING_ONLY: &str = r#"{"presence":{"types":[]},"account_data":{"types":[]},"room":{"timeline":{"limit":0},"state":{"types":[]},"account_data":{"types":[]},"ephemeral":{"types":["m.typing"]}}}"#;

/// The rig's config for a Rust typing writer listening on `port`.
fn typing_writer_config(port: u16) -> Value {
    json!({
        "stream_writers": {"typing": [INSTANCE]},
        "instance_map": {INSTANCE: {"host": "127.0.0.1", "port": port}},
    })
}

/// Starts the Rust writer for `rig` on `port`, checking memberships with
/// `admin_token`.
fn start_writer(rig: &SynapseRig, port: u16, admin_token: Option<String>) -> writer::Running {
    let synapse = SynapseConfig::from_value(json!({
        "server_name": rig.server_name,
        "redis": {"enabled": true, "host": "127.0.0.1", "port": rig.redis_port},
        "worker_replication_secret": rig.secret,
        "stream_writers": {"typing": [INSTANCE]},
        "instance_map": {
            "main": {"host": "127.0.0.1", "port": rig.replication_port},
            INSTANCE: {"host": "127.0.0.1", "port": port},
        },
    }))
    .expect("config");
    smol::block_on(writer::start(
        writer::Options {
            synapse,
            instance: INSTANCE.into(),
            homeserver: rig.client_url.clone(),
            admin_token,
            state: None,
        },
        &format!("127.0.0.1:{port}"),
        "127.0.0.1:0",
    ))
    .expect("the writer starts")
}

/// The typing user ids of `room` in a `/sync` answer, sorted.
fn typing_in(sync: &Value, room: &str) -> Vec<String> {
    let events = &sync["rooms"]["join"][room]["ephemeral"]["events"];
    let mut users: Vec<String> = events
        .as_array()
        .into_iter()
        .flatten()
        .filter(|event| event["type"] == "m.typing")
        .flat_map(|event| {
            event["content"]["user_ids"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|user| user.as_str().map(str::to_owned))
        .collect();
    users.sort();
    users
}

/// Who an initial `/sync` of `token`'s user shows typing in `room`. Each
/// call asks with another `timeout` (ignored by an initial sync), never 0
/// (the test's own first sync): Synapse caches `/sync` answers per
/// request.
fn typing_seen(rig: &SynapseRig, token: &str, room: &str) -> Vec<String> {
    static SYNCS: AtomicU64 = AtomicU64::new(1);
    let fresh = SYNCS.fetch_add(1, Ordering::Relaxed);
    let sync = rig.get(
        token,
        &format!(
            "/_matrix/client/v3/sync?timeout={fresh}&filter={}",
            segment(TYPING_ONLY)
        ),
    );
    typing_in(&sync, room)
}

/// Waits until `token`'s user sees exactly `expected` typing in `room`.
fn await_typing(rig: &SynapseRig, token: &str, room: &str, expected: &[&str], within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let seen = typing_seen(rig, token, room);
        if seen == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{}'s /sync shows {seen:?} typing in {room}, expected {expected:?}\n{}",
            rig.server_name,
            rig.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Long-polls `/sync` from `since` until it shows `user` typing in `room`
/// or `within` passed; when it did.
fn long_poll_typing(
    rig: &SynapseRig,
    token: &str,
    room: &str,
    user: &str,
    mut since: String,
    within: Duration,
) -> Option<Instant> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let sync = rig.get(
            token,
            &format!(
                "/_matrix/client/v3/sync?timeout=20000&since={}&filter={}",
                segment(&since),
                segment(TYPING_ONLY)
            ),
        );
        if typing_in(&sync, room).iter().any(|typing| typing == user) {
            return Some(Instant::now());
        }
        since = sync["next_batch"].as_str()?.to_owned();
    }
    None
}

/// One HTTP/1.1 request to the writer (which closes each connection):
/// the status and JSON answer (`null` when not JSON).
fn http(port: u16, method: &str, path: &str, secret: Option<&str>, body: &[u8]) -> (u16, Value) {
    send(port, method, path, secret, body.len(), body)
}

/// [`http`], saying the body is `declared` bytes long.
fn send(
    port: u16,
    method: &str,
    path: &str,
    secret: Option<&str>,
    declared: usize,
    body: &[u8],
) -> (u16, Value) {
    let mut socket = TcpStream::connect(("127.0.0.1", port)).expect("the writer listens");
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {INSTANCE}:80\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n"
    );
    if let Some(secret) = secret {
        head.push_str(&format!("Authorization: Bearer {secret}\r\n"));
    }
    head.push_str("\r\n");
    socket
        .write_all(head.as_bytes())
        .expect("writing the request");
    // A refused request may be answered before its body is read.
    let _ = socket.write_all(body);
    let mut answer = Vec::new();
    let _ = socket.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|status| status.parse().ok())
        .expect("a status");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Forwards one EDU to the writer as Synapse's federation receiver does.
fn fed_send_edu(
    port: u16,
    secret: &str,
    edu_type: &str,
    txn: &str,
    origin: &str,
    content: &Value,
) -> (u16, Value) {
    let body = json!({
        "origin": origin,
        "content": content,
        "_INT_STREAM_POS": {"streams": {"events": 1}, "instance_name": "master"},
    });
    http(
        port,
        "POST",
        &format!("/_synapse/replication/fed_send_edu/{edu_type}/{txn}"),
        Some(secret),
        body.to_string().as_bytes(),
    )
}

#[test]
fn typing_crosses_federation_through_the_rust_typing_writer() {
    let writer_port = free_port();
    // The two homeservers start side by side.
    let (a, b) = std::thread::scope(|scope| {
        let a =
            scope.spawn(|| FederatingRig::start("127.0.0.1", &typing_writer_config(writer_port)));
        let b = scope.spawn(|| FederatingRig::start("localhost", &json!({})));
        (a.join().expect("A starts"), b.join().expect("B starts"))
    });
    let (a, b) = (&a.rig, &b.rig);
    eprintln!(
        "homeservers {} and {} up in {:?} and {:?}",
        a.server_name, b.server_name, a.startup, b.startup
    );
    let admin = a.register_user("typingadmin", "admin-password", true);
    let admin_token = admin["access_token"].as_str().map(str::to_owned);
    let running = start_writer(a, writer_port, admin_token);
    let writer = running.writer.clone();

    let alice_token = a.register("alice", "alice-password");
    let alice = a.user_id("alice");
    let bob_token = b.register("bob", "bob-password");
    let bob = b.user_id("bob");
    let room = a.create_room(&alice_token);
    b.post(
        &bob_token,
        &format!(
            "/_matrix/client/v3/join/{}?server_name={}",
            segment(&room),
            segment(&a.server_name)
        ),
        &json!({}),
    );
    let members = a.get(
        &alice_token,
        &format!("/_matrix/client/v3/rooms/{}/joined_members", segment(&room)),
    );
    assert!(
        members["joined"].get(&bob).is_some(),
        "{bob} joined over federation: {members}"
    );

    // 1. bob (on B) types: B sends the EDU to A, A forwards it to the Rust
    // writer, alice (on A) sees it. Timed from bob's typing to alice's
    // long-polling /sync.
    let initial = a.get(
        &alice_token,
        &format!("/_matrix/client/v3/sync?filter={}", segment(TYPING_ONLY)),
    );
    let since = initial["next_batch"]
        .as_str()
        .expect("next_batch")
        .to_owned();
    let seen = std::thread::scope(|scope| {
        let poll = scope.spawn(|| {
            long_poll_typing(a, &alice_token, &room, &bob, since, Duration::from_secs(60))
        });
        // Let the long poll reach Synapse first.
        std::thread::sleep(Duration::from_millis(1000));
        let typed = Instant::now();
        b.set_typing(&bob_token, &room, &bob, true);
        let put = typed.elapsed();
        let seen = poll.join().expect("the long poll");
        (typed, put, seen)
    });
    let (typed, put, seen) = seen;
    let Some(seen_at) = seen else {
        panic!(
            "alice never saw bob typing across federation\n--- A's log ---\n{}\n\
             writer answered: {:?}",
            a.log_tail(40),
            writer.answered.lock().unwrap()
        );
    };
    eprintln!(
        "remote typing latency: {:?} from bob's PUT on B to alice's /sync on A ({:?} after the \
         PUT, which took {put:?}, returned)",
        seen_at.duration_since(typed),
        seen_at.duration_since(typed + put)
    );
    assert!(writer.typing_in(&room).contains(&bob));

    // bob stops: alice sees nobody typing.
    let (status, _) = b.request(
        "PUT",
        &format!(
            "/_matrix/client/v3/rooms/{}/typing/{}",
            segment(&room),
            segment(&bob)
        ),
        Some(&bob_token),
        Some(&json!({"typing": false})),
    );
    assert_eq!(status, 200);
    await_typing(a, &alice_token, &room, &[], Duration::from_secs(30));

    // 2. alice (on A) types through the Rust writer: A's federation sender
    // sends it from the typing stream, and bob (on B) sees it.
    let (status, answer) = a.request_url(
        "PUT",
        &format!(
            "http://{}/_matrix/client/v3/rooms/{}/typing/{}",
            running.client_addr,
            segment(&room),
            segment(&alice)
        ),
        Some(&alice_token),
        Some(&json!({"typing": true, "timeout": 30000})),
    );
    assert_eq!((status, &answer), (200, &json!({})));
    await_typing(b, &bob_token, &room, &[&alice], Duration::from_secs(30));

    // What Synapse called on the writer: every route answered, none 404.
    let answered: Vec<(String, String, u16)> =
        writer.answered.lock().unwrap().iter().cloned().collect();
    eprintln!("routes A called on the writer, besides catch-up: {answered:#?}");
    eprintln!(
        "catch-ups served: {:?}",
        writer.served.lock().unwrap().clone()
    );
    assert!(
        answered
            .iter()
            .any(|(method, path, status)| method == "POST"
                && path.starts_with("/_synapse/replication/fed_send_edu/m.typing/")
                && *status == 200),
        "{answered:?}"
    );
    assert!(
        answered.iter().all(|(_, _, status)| *status == 200),
        "{answered:?}"
    );
    assert_eq!(running.counters.refused_secret(), 0);
    let log = a.log_text();
    assert!(
        !log.contains("Error handling EDU"),
        "A failed an inbound transaction:\n{}",
        a.log_tail(40)
    );
    assert!(writer.token() > Token(0));
    a.assert_no_errors_logged();
    b.assert_no_errors_logged();
}

#[test]
fn fed_send_edu_applies_a_retry_once_and_refuses_bad_input() {
    let port = free_port();
    let rig = SynapseRig::start_with(&typing_writer_config(port));
    let admin = rig.register_user("typingadmin", "admin-password", true);
    let running = start_writer(
        &rig,
        port,
        admin["access_token"].as_str().map(str::to_owned),
    );
    let writer = running.writer.clone();
    let alice_token = rig.register("alice", "alice-password");
    let alice = rig.user_id("alice");
    let room = rig.create_room(&alice_token);
    let origin = rig.server_name.clone();
    let secret = rig.secret.clone();
    let edu = |txn: &str, origin: &str, content: &Value| {
        fed_send_edu(
            port,
            &secret,
            writer::federation::TYPING_EDU,
            txn,
            origin,
            content,
        )
    };
    let typing = |typing: bool| json!({"room_id": room, "user_id": alice, "typing": typing});

    // Applied, answered with the writer's typing position.
    let (status, answer) = edu("txn1", &origin, &typing(true));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(writer.typing_in(&room), [alice.as_str()]);
    assert_eq!(
        answer,
        json!({"_INT_STREAM_POS": {"typing": writer.token().get()}})
    );
    let (status, _) = edu("txn2", &origin, &typing(false));
    assert_eq!(status, 200);
    assert!(writer.typing_in(&room).is_empty());
    let stopped = writer.token();

    // txn1 retried: answered, not applied again (alice stays stopped).
    let (status, answer) = edu("txn1", &origin, &typing(true));
    assert_eq!(status, 200, "{answer}");
    assert!(writer.typing_in(&room).is_empty(), "txn1 applied twice");
    assert_eq!(writer.token(), stopped);
    assert_eq!(writer.edus.get(), (2, 0, 0), "the retry reached the writer");

    // Synapse's checks: answered, not applied.
    let (status, _) = edu("txn3", "evil.test", &typing(true));
    assert_eq!(status, 200, "a user not of the origin");
    let eve = json!({"room_id": room, "user_id": "@eve:remote.test", "typing": true});
    let (status, _) = edu("txn4", "remote.test", &eve);
    assert_eq!(status, 200, "a server not in the room");
    let unknown = json!({"room_id": "!nowhere:rig.test", "user_id": alice, "typing": true});
    let (status, _) = edu("txn5", &origin, &unknown);
    assert_eq!(status, 200, "a room the server is not in");
    assert_eq!(writer.token(), stopped);
    assert_eq!(writer.edus.get(), (2, 3, 0));

    // Remote typing lasts Synapse's FEDERATION_TIMEOUT.
    let (status, _) = edu("txn6", &origin, &typing(true));
    assert_eq!(status, 200);
    let timeout = writer::federation::FEDERATION_TIMEOUT;
    writer.handle_timeouts(Instant::now() + timeout - Duration::from_secs(5));
    assert_eq!(writer.typing_in(&room), [alice.as_str()]);
    writer.handle_timeouts(Instant::now() + timeout + Duration::from_secs(1));
    assert!(writer.typing_in(&room).is_empty());
    let before = writer.token();

    // Bad input: Synapse's JSON errors, nothing applied, nothing kept.
    let path = |edu_type: &str| format!("/_synapse/replication/fed_send_edu/{edu_type}/txn7");
    let body = |content: &Value| json!({"origin": origin, "content": content}).to_string();
    let refusals: Vec<(&str, u16, &str, (u16, Value))> = vec![
        (
            "not JSON",
            400,
            "M_NOT_JSON",
            http(
                port,
                "POST",
                &path("m.typing"),
                Some(&secret),
                b"{\"origin\"",
            ),
        ),
        (
            "not an object",
            400,
            "M_BAD_JSON",
            http(port, "POST", &path("m.typing"), Some(&secret), b"[]"),
        ),
        (
            "no origin",
            400,
            "M_MISSING_PARAM",
            http(
                port,
                "POST",
                &path("m.typing"),
                Some(&secret),
                json!({"content": typing(true)}).to_string().as_bytes(),
            ),
        ),
        (
            "no typing",
            400,
            "M_MISSING_PARAM",
            http(
                port,
                "POST",
                &path("m.typing"),
                Some(&secret),
                body(&json!({"room_id": room, "user_id": alice})).as_bytes(),
            ),
        ),
        (
            "not a user id",
            400,
            "M_INVALID_PARAM",
            http(
                port,
                "POST",
                &path("m.typing"),
                Some(&secret),
                body(&json!({"room_id": room, "user_id": "alice", "typing": true})).as_bytes(),
            ),
        ),
        (
            "another EDU type",
            400,
            "M_UNRECOGNIZED",
            http(
                port,
                "POST",
                &path("m.receipt"),
                Some(&secret),
                body(&typing(true)).as_bytes(),
            ),
        ),
        (
            "GET",
            405,
            "M_UNRECOGNIZED",
            http(port, "GET", &path("m.typing"), Some(&secret), b""),
        ),
        (
            "too large",
            413,
            "M_TOO_LARGE",
            send(port, "POST", &path("m.typing"), Some(&secret), 1 << 20, b""),
        ),
        (
            "a wrong secret",
            401,
            "M_UNKNOWN_TOKEN",
            http(
                port,
                "POST",
                &path("m.typing"),
                Some("wrong"),
                body(&typing(true)).as_bytes(),
            ),
        ),
        (
            "no secret",
            401,
            "M_MISSING_TOKEN",
            http(
                port,
                "POST",
                &path("m.typing"),
                None,
                body(&typing(true)).as_bytes(),
            ),
        ),
    ];
    for (what, status, errcode, (got, answer)) in refusals {
        assert_eq!(
            (got, answer["errcode"].as_str()),
            (status, Some(errcode)),
            "{what}: {answer}"
        );
        assert!(answer["error"].is_string(), "{what}: {answer}");
        eprintln!("{what}: {got} {answer}");
    }
    assert_eq!(writer.token(), before, "a refusal applied something");
    assert!(writer.typing_in(&room).is_empty());
    // The server refuses what is not a JSON object, another method, a
    // body too large, a wrong or missing secret; the writer, an EDU that
    // is not Synapse's.
    assert_eq!(writer.edus.get().2, 4, "refused by the writer");

    // The txn id of the refused requests is not remembered.
    let (status, _) = edu("txn7", &origin, &typing(true));
    assert_eq!(status, 200);
    assert_eq!(writer.typing_in(&room), [alice.as_str()]);
    rig.assert_no_errors_logged();
}
