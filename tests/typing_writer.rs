//! The Rust typing writer (`examples/typing_writer`) as Synapse 1.163.2's
//! `stream_writers.typing`: Synapse follows it over Redis, and catches up
//! from it over HTTP when it missed rows (a cut from Redis, a restart).
//!
//! Needs the Synapse venv (`SYNAPSE_PYTHON`, see tests/common/synapse.rs)
//! and redis-server, as the other Synapse tests do.

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
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::synapse::{SynapseRig, segment};
use serde_json::{Value, json};
use synapse_replication::config::{InstanceLocation, SynapseConfig};
use synapse_replication::positions::{CatchUpId, CatchUpRequest};
use synapse_replication::transport::{CatchUpSource, HttpCatchUp, HttpCatchUpError, SmolRuntime};
use synapse_replication::wire::{InstanceName, StreamName, Token};

const INSTANCE: &str = "rust1";

/// A port nobody listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port")
}

/// Who `bob`'s initial `/sync` shows typing in `room` (empty when none).
/// Synapse caches `/sync` answers per request for two minutes: each call
/// asks with another `timeout` (ignored by an initial sync), so that each
/// is a fresh answer.
fn typing_seen(rig: &SynapseRig, token: &str, room: &str) -> Vec<String> {
    static SYNCS: AtomicU64 = AtomicU64::new(0);
    let fresh = SYNCS.fetch_add(1, Ordering::Relaxed);
    let sync = rig.get(token, &format!("/_matrix/client/v3/sync?timeout={fresh}"));
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

/// Waits until `bob` sees exactly `expected` typing in `room`.
fn await_typing(rig: &SynapseRig, token: &str, room: &str, expected: &[&str], within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let seen = typing_seen(rig, token, room);
        if seen == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "bob's /sync shows {seen:?} typing in {room}, expected {expected:?}\n{}",
            rig.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One RESP command to the rig's Redis; the raw reply.
fn redis(port: u16, args: &[&str]) -> String {
    let mut socket = TcpStream::connect(("127.0.0.1", port)).expect("redis");
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let mut command = format!("*{}\r\n", args.len());
    for arg in args {
        command.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    socket.write_all(command.as_bytes()).expect("redis write");
    let mut reply = Vec::new();
    let mut buffer = [0; 65536];
    loop {
        match socket.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => {
                reply.extend_from_slice(&buffer[..read]);
                let text = String::from_utf8_lossy(&reply);
                // A bulk string is complete with its trailing CRLF.
                let complete = match text.strip_prefix('$') {
                    Some(rest) => rest.split_once("\r\n").is_some_and(|(len, body)| {
                        len.parse::<usize>().is_ok_and(|len| body.len() >= len + 2)
                    }),
                    None => text.ends_with("\r\n"),
                };
                if complete {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&reply).into_owned()
}

/// Kills every Redis connection but the writer's (named `rust1`): Synapse
/// is cut off. The number killed.
fn cut_synapse_from_redis(port: u16) -> usize {
    let list = redis(port, &["CLIENT", "LIST"]);
    let mut killed = 0;
    for line in list.lines() {
        let field = |key: &str| {
            line.split(' ')
                .find_map(|field| field.strip_prefix(&format!("{key}=")))
                .map(str::to_owned)
        };
        let (Some(id), Some(name), Some(cmd)) = (field("id"), field("name"), field("cmd")) else {
            continue;
        };
        if name.starts_with(INSTANCE) || cmd == "client|list" {
            continue;
        }
        if redis(port, &["CLIENT", "KILL", "ID", &id]).starts_with(":1") {
            killed += 1;
        }
    }
    killed
}

/// Restarts Synapse on the rig's config (SIGTERM, then start again), and
/// waits until it is healthy. The rig's `rig.json` learns the new pid, so
/// that the rig still stops it. The new process (wait for it once the rig
/// stopped it).
// The rig stops the new process (its pid is in rig.json); the test waits
// for it at the end, and a panic before leaves it to the rig's watchdog.
#[allow(clippy::zombie_processes)]
fn restart_synapse(rig: &SynapseRig) -> std::process::Child {
    let state_path = rig.dir.join("rig.json");
    let mut state: Value =
        serde_json::from_str(&std::fs::read_to_string(&state_path).expect("rig.json"))
            .expect("rig.json is JSON");
    let pid = state["pids"]["synapse"].as_u64().expect("synapse pid");
    let status = Command::new("kill")
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z")
    {
        assert!(Instant::now() < deadline, "Synapse did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(rig.dir.join("synapse.out"))
        .expect("synapse.out");
    let child = Command::new(common::synapse::synapse_python())
        .args(["-m", "synapse.app.homeserver", "-c"])
        .arg(rig.dir.join("homeserver.yaml"))
        .current_dir(&rig.dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("synapse.out"))
        .stderr(out)
        .spawn()
        .expect("starting Synapse again");
    state["pids"]["synapse"] = json!(child.id());
    std::fs::write(&state_path, state.to_string()).expect("rig.json");
    let deadline = Instant::now() + Duration::from_secs(60);
    let client = rig.client_url.trim_start_matches("http://").to_owned();
    loop {
        if TcpStream::connect(&client).is_err() {
            assert!(
                Instant::now() < deadline,
                "Synapse not listening after restart"
            );
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        let (status, _) = rig.request_url("GET", &format!("{}/health", rig.client_url), None, None);
        if status == 200 {
            return child;
        }
        assert!(
            Instant::now() < deadline,
            "Synapse not healthy after restart"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The writer's config for a deployment on `redis_port` (with main's
/// replication listener on `main_port`), itself listening on `port`.
fn writer_config(
    server_name: &str,
    redis_port: u16,
    secret: &str,
    main_port: u16,
    port: u16,
) -> SynapseConfig {
    SynapseConfig::from_value(json!({
        "server_name": server_name,
        "redis": {"enabled": true, "host": "127.0.0.1", "port": redis_port},
        "worker_replication_secret": secret,
        "stream_writers": {"typing": [INSTANCE]},
        "instance_map": {
            "main": {"host": "127.0.0.1", "port": main_port},
            INSTANCE: {"host": "127.0.0.1", "port": port},
        },
    }))
    .expect("config")
}

/// Starts the Rust writer on `port`, with the state file `state`.
fn start_writer(
    synapse: SynapseConfig,
    homeserver: &str,
    port: u16,
    state: Option<&Path>,
) -> writer::Running {
    smol::block_on(writer::start(
        writer::Options {
            synapse,
            instance: INSTANCE.into(),
            homeserver: homeserver.to_owned(),
            admin_token: None,
            state: state.map(Path::to_path_buf),
        },
        &format!("127.0.0.1:{port}"),
    ))
    .expect("the writer starts")
}

/// Starts the Rust writer for `rig` on `port`.
fn start_rig_writer(rig: &SynapseRig, port: u16, state: Option<&Path>) -> writer::Running {
    let synapse = writer_config(
        &rig.server_name,
        rig.redis_port,
        &rig.secret,
        rig.replication_port,
        port,
    );
    start_writer(synapse, &rig.client_url, port, state)
}

/// The rig's config for the Rust writer on `port`.
fn rig_config(port: u16) -> Value {
    json!({
        "stream_writers": {"typing": [INSTANCE]},
        "instance_map": {INSTANCE: {"host": "127.0.0.1", "port": port}},
    })
}

#[test]
fn synapse_follows_and_catches_up_from_the_rust_typing_writer() {
    let port = free_port();
    let rig = SynapseRig::start_with(&rig_config(port));
    let running = start_rig_writer(&rig, port, None);
    let writer = running.writer.clone();
    let writer_url = format!("http://127.0.0.1:{port}");
    // Tokens start at the clock, never at 0: main, at 0, fetches (0, start]
    // on the first announcement, and gets nothing.
    let start = writer.token();

    let alice_token = rig.register("alice", "alice-password");
    let bob_token = rig.register("bob", "bob-password");
    let alice = rig.user_id("alice");
    let bob = rig.user_id("bob");
    let room = rig.create_room(&alice_token);
    rig.join_room(&bob_token, &room);
    let typing_path = |user: &str| {
        format!(
            "{writer_url}/_matrix/client/v3/rooms/{}/typing/{}",
            segment(&room),
            segment(user)
        )
    };
    let set_typing = |token: &str, user: &str, body: Value| {
        rig.request_url("PUT", &typing_path(user), Some(token), Some(&body))
    };

    // 1. Through the Rust writer's client API: bob sees alice type, then stop.
    let (status, answer) = set_typing(
        &alice_token,
        &alice,
        json!({"typing": true, "timeout": 30000}),
    );
    assert_eq!((status, &answer), (200, &json!({})));
    await_typing(&rig, &bob_token, &room, &[&alice], Duration::from_secs(20));
    let (status, _) = set_typing(&alice_token, &alice, json!({"typing": false}));
    assert_eq!(status, 200);
    await_typing(&rig, &bob_token, &room, &[], Duration::from_secs(20));

    // The writer checks who asks, and for whom.
    let (status, answer) = set_typing("not-a-token", &alice, json!({"typing": true}));
    assert_eq!(
        (status, answer["errcode"].as_str()),
        (401, Some("M_UNKNOWN_TOKEN"))
    );
    let (status, _) = set_typing(&bob_token, &alice, json!({"typing": true}));
    assert_eq!(status, 400, "bob cannot type as alice");
    let carol_token = rig.register("carol", "carol-password");
    let carol = rig.user_id("carol");
    let (status, answer) = set_typing(&carol_token, &carol, json!({"typing": true}));
    assert_eq!(
        (status, answer["errcode"].as_str()),
        (403, Some("M_FORBIDDEN"))
    );

    // Timeouts: Synapse's, checked every 5 s.
    let started = Instant::now();
    let (status, _) = set_typing(
        &alice_token,
        &alice,
        json!({"typing": true, "timeout": 1000}),
    );
    assert_eq!(status, 200);
    await_typing(&rig, &bob_token, &room, &[&alice], Duration::from_secs(20));
    await_typing(&rig, &bob_token, &room, &[], Duration::from_secs(20));
    assert!(started.elapsed() >= Duration::from_secs(1));
    let served = writer.served.lock().unwrap().clone();
    assert!(
        served
            .iter()
            .all(|request| (request.from, request.to) == (Token(0), start)),
        "nothing missed yet but (0, {start}]: {served:?}"
    );
    assert_eq!(running.counters.refused_secret(), 0);

    // 2. Synapse cut from Redis while alice starts typing: it misses the
    // row, hears the writer's POSITION when it is back, and fetches.
    let mut caught_up = false;
    for attempt in 0..3 {
        let killed = cut_synapse_from_redis(rig.redis_port);
        assert!(killed >= 1, "no Synapse connection to kill");
        let (status, _) = set_typing(
            &alice_token,
            &alice,
            json!({"typing": true, "timeout": 60000}),
        );
        assert_eq!(status, 200);
        let token = writer.token();
        await_typing(&rig, &bob_token, &room, &[&alice], Duration::from_secs(30));
        let served = writer.served.lock().unwrap().clone();
        if served
            .iter()
            .any(|request| request.to >= token && request.from < token)
        {
            caught_up = true;
            break;
        }
        eprintln!("attempt {attempt}: Synapse was back before the row; again");
        let (status, _) = set_typing(&alice_token, &alice, json!({"typing": false}));
        assert_eq!(status, 200);
        await_typing(&rig, &bob_token, &room, &[], Duration::from_secs(20));
    }
    assert!(
        caught_up,
        "Synapse never fetched the missed row from the writer"
    );
    assert!(running.counters.pages() >= 1);
    assert_eq!(
        running.counters.refused_secret(),
        0,
        "Synapse sent the secret"
    );
    let served = writer.served.lock().unwrap().clone();
    assert!(
        served
            .iter()
            .all(|request| request.stream == StreamName::Typing
                && request.writer.as_str() == INSTANCE)
    );

    // 3. Synapse restarted while the writer is above 0 (alice still
    // typing): at start-up it fetches (0, cur] from the writer.
    let before = writer.served.lock().unwrap().len();
    let token = writer.token();
    assert!(token > Token(0));
    let mut restarted = restart_synapse(&rig);
    await_typing(&rig, &bob_token, &room, &[&alice], Duration::from_secs(30));
    let served = writer.served.lock().unwrap().clone();
    assert!(
        served[before..]
            .iter()
            .any(|request| request.from == Token(0) && request.to == token),
        "no (0, {token}] fetch after the restart: {served:?}"
    );
    let (status, _) = set_typing(&alice_token, &alice, json!({"typing": false}));
    assert_eq!(status, 200);
    await_typing(&rig, &bob_token, &room, &[], Duration::from_secs(20));

    // 4. A wrong or missing secret is refused, and Synapse logged no error
    // about any of our answers.
    let path = format!(
        "/_synapse/replication/get_repl_stream_updates/typing/txn1?from_token=0&upto_token={}",
        writer.token()
    );
    let (status, answer) =
        rig.request_url("GET", &format!("{writer_url}{path}"), Some("wrong"), None);
    assert_eq!(
        (status, answer["errcode"].as_str()),
        (401, Some("M_UNKNOWN_TOKEN"))
    );
    let (status, answer) = rig.request_url("GET", &format!("{writer_url}{path}"), None, None);
    assert_eq!(
        (status, answer["errcode"].as_str()),
        (401, Some("M_MISSING_TOKEN"))
    );
    let (status, answer) = rig.request_url(
        "GET",
        &format!("{writer_url}{path}"),
        Some(&rig.secret),
        None,
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["upto_token"], json!(writer.token().get()));
    assert_eq!(running.counters.refused_secret(), 2);
    // The crate's own client, with the wrong secret: a clear failure.
    let wrong = HttpCatchUp::with_locator(
        SmolRuntime,
        move |_: &InstanceName| {
            Some(InstanceLocation::Tcp {
                host: "127.0.0.1".into(),
                port,
                tls: false,
            })
        },
        Some("wrong".into()),
    );
    let error = smol::block_on(wrong.fetch(CatchUpRequest {
        id: CatchUpId::new(1),
        stream: StreamName::Typing,
        writer: InstanceName::from(INSTANCE),
        from: Token(0),
        to: writer.token(),
    }))
    .expect_err("refused");
    assert!(matches!(
        *error.downcast::<HttpCatchUpError>().expect("an HTTP error"),
        HttpCatchUpError::Status { status: 401, .. }
    ));
    rig.assert_no_errors_logged();
    assert_eq!(running.counters.failed(), 0);
    let _ = bob;
    rig.stop();
    let _ = restarted.wait();
}
