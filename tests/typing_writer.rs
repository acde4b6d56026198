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

/// Starts the Rust writer on `port`, its client API on `client_port` (0:
/// any, in `Running::client_addr`), with the state file `state`.
fn start_writer(
    synapse: SynapseConfig,
    homeserver: &str,
    port: u16,
    client_port: u16,
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
        &format!("127.0.0.1:{client_port}"),
    ))
    .expect("the writer starts")
}

/// Starts the Rust writer for `rig` on `port`, its client API on
/// `client_port`.
fn start_rig_writer(
    rig: &SynapseRig,
    port: u16,
    client_port: u16,
    state: Option<&Path>,
) -> writer::Running {
    let synapse = writer_config(
        &rig.server_name,
        rig.redis_port,
        &rig.secret,
        rig.replication_port,
        port,
    );
    start_writer(synapse, &rig.client_url, port, client_port, state)
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
    let running = start_rig_writer(&rig, port, 0, None);
    let writer = running.writer.clone();
    let writer_url = format!("http://127.0.0.1:{port}");
    let client_url = format!("http://{}", running.client_addr);
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
            "{client_url}/_matrix/client/v3/rooms/{}/typing/{}",
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
        served
            .range(before..)
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

/// The typing users of `room` in a `/sync` answer, sorted; `None` when the
/// answer has no typing event for the room.
fn typing_event(sync: &Value, room: &str) -> Option<Vec<String>> {
    let events = sync["rooms"]["join"][room]["ephemeral"]["events"].as_array()?;
    let event = events.iter().find(|event| event["type"] == "m.typing")?;
    let mut users: Vec<String> = event["content"]["user_ids"]
        .as_array()?
        .iter()
        .filter_map(|user| user.as_str().map(str::to_owned))
        .collect();
    users.sort();
    Some(users)
}

/// An incremental `/sync` since `since`: what a client that kept syncing
/// sees. Each call waits another few ms (`timeout`) when nothing is new,
/// so that it is a fresh answer, not one of Synapse's cached ones.
fn sync_since(rig: &SynapseRig, token: &str, since: &str) -> Value {
    static SYNCS: AtomicU64 = AtomicU64::new(0);
    let fresh = SYNCS.fetch_add(1, Ordering::Relaxed);
    rig.get(
        token,
        &format!(
            "/_matrix/client/v3/sync?since={}&timeout={fresh}",
            segment(since)
        ),
    )
}

/// The state file's token and rooms, once `check` holds (within 5 s).
fn saved_state(
    state: &Path,
    check: impl Fn(&writer::restart::Saved) -> bool,
) -> writer::restart::Saved {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let saved = writer::restart::StateFile::new(state)
            .load()
            .expect("the state file is readable")
            .expect("the state file exists");
        if check(&saved) {
            return saved;
        }
        assert!(Instant::now() < deadline, "the state file stays {saved:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Issue #23, item 5: after the writer restarts, Synapse shows its next
/// change at once, and nothing the old run said stays shown as current,
/// to a client that keeps syncing across the restart too.
///
/// With tokens starting again from 0, Synapse 1.163.2's main resets its
/// typing state on the new run's first `POSITION` ("went backwards;
/// resetting"), so its initial `/sync` follows; but an incremental
/// `/sync` whose `since` carries the old run's token gets nothing of the
/// new run until its tokens pass the old ones: neither its changes nor
/// the end of the old run's typing.
#[test]
fn a_restarted_writer_is_followed_at_once_and_clears_what_it_left_shown() {
    let port = free_port();
    let rig = SynapseRig::start_with(&rig_config(port));
    let state = rig.dir.join("typing-state.json");
    // The same client port after the restart, as behind a reverse proxy.
    let client_port = free_port();
    let running = start_rig_writer(&rig, port, client_port, Some(&state));
    let client_url = format!("http://127.0.0.1:{client_port}");

    let alice_token = rig.register("alice", "alice-password");
    let bob_token = rig.register("bob", "bob-password");
    let carol_token = rig.register("carol", "carol-password");
    let alice = rig.user_id("alice");
    let bob = rig.user_id("bob");
    // Alice is left typing in `left` by the old run; `next` has the new
    // run's first change. Carol watches both.
    let left = rig.create_room(&alice_token);
    let next = rig.create_room(&alice_token);
    for room in [&left, &next] {
        rig.join_room(&bob_token, room);
        rig.join_room(&carol_token, room);
    }
    let set_typing = |room: &str, token: &str, user: &str, body: Value| {
        let url = format!(
            "{client_url}/_matrix/client/v3/rooms/{}/typing/{}",
            segment(room),
            segment(user)
        );
        rig.request_url("PUT", &url, Some(token), Some(&body)).0
    };

    let status = set_typing(
        &left,
        &alice_token,
        &alice,
        json!({"typing": true, "timeout": 120000}),
    );
    assert_eq!(status, 200);
    await_typing(
        &rig,
        &carol_token,
        &left,
        &[&alice],
        Duration::from_secs(20),
    );
    // Carol's client has seen alice typing, and syncs on from here.
    let sync = rig.sync(&carol_token, None);
    assert_eq!(typing_event(&sync, &left), Some(vec![alice.clone()]));
    let since = sync["next_batch"]
        .as_str()
        .expect("a next_batch")
        .to_owned();
    let old = running.writer.token();
    let saved = saved_state(&state, |saved| saved.token == old.get());
    assert_eq!(saved.rooms, [left.clone()].into());

    // The writer stops; Synapse keeps showing alice typing (its processes
    // never time typing out themselves).
    smol::block_on(running.stop());
    assert_eq!(
        typing_seen(&rig, &carol_token, &left),
        std::slice::from_ref(&alice)
    );

    let running = start_rig_writer(&rig, port, client_port, Some(&state));
    let writer = running.writer.clone();
    assert!(
        writer.token() > old,
        "the new run starts at {} after {old}",
        writer.token()
    );

    // The new run's first change reaches carol's client at once.
    let put = Instant::now();
    let status = set_typing(
        &next,
        &bob_token,
        &bob,
        json!({"typing": true, "timeout": 60000}),
    );
    assert_eq!(status, 200);
    let answered = put.elapsed();
    let deadline = put + Duration::from_secs(30);
    let mut syncs = 0;
    let sync = loop {
        let sync = sync_since(&rig, &carol_token, &since);
        syncs += 1;
        if typing_event(&sync, &next) == Some(vec![bob.clone()]) {
            break sync;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted writer's first change is not in carol's /sync after 30 s: {sync}\n{}",
            rig.log_tail(30)
        );
    };
    let shown = put.elapsed();
    eprintln!(
        "the restart's first change was in an incremental /sync {} ms after its PUT began \
         (the PUT answered in {} ms; {syncs} /sync calls)",
        shown.as_millis(),
        answered.as_millis()
    );
    // And alice's typing is over, for carol's client as in a fresh /sync,
    // with no PUT for that room.
    assert_eq!(typing_event(&sync, &left), Some(vec![]), "{sync}");
    await_typing(&rig, &carol_token, &left, &[], Duration::from_secs(30));

    // Synapse fetched (old, ...] and got the clearing row.
    let served = writer.served.lock().unwrap().clone();
    assert!(
        served
            .iter()
            .any(|request| request.from == old && request.to > old),
        "no fetch from {old}: {served:?}"
    );
    assert!(
        !rig.log_text().contains("stream went backwards"),
        "Synapse saw the typing stream go backwards"
    );
    // The state file: the new run's token, and only bob's room (the
    // cleared one was announced).
    let saved = saved_state(&state, |saved| saved.token == writer.token().get());
    assert_eq!(saved.rooms, [next.clone()].into());
    rig.assert_no_errors_logged();
    rig.stop();
}

/// The start token with the state file, and without it (lost): above the
/// old run's either way; with it, the rooms left typing are cleared by
/// rows a catch-up answers. No Synapse, no Redis: a writer keeps what it
/// writes in its history while it is not connected.
#[test]
fn a_restart_starts_above_the_old_run_with_or_without_its_state_file() {
    let dir = std::env::temp_dir().join(format!(
        "typing-writer-state-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("a clock after 1970")
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let state = dir.join("state.json");
    let (redis_port, main_port, port) = (free_port(), free_port(), free_port());
    let start = |state: &Path| {
        let synapse = writer_config("example.com", redis_port, "secret", main_port, port);
        start_writer(synapse, "http://127.0.0.1:1", port, 0, Some(state))
    };
    let fetch = |from: Token, to: Token| {
        let source = HttpCatchUp::with_locator(
            SmolRuntime,
            move |_: &InstanceName| {
                Some(InstanceLocation::Tcp {
                    host: "127.0.0.1".into(),
                    port,
                    tls: false,
                })
            },
            Some("secret".into()),
        );
        let page = smol::block_on(source.fetch(CatchUpRequest {
            id: CatchUpId::new(1),
            stream: StreamName::Typing,
            writer: InstanceName::from(INSTANCE),
            from,
            to,
        }))
        .expect("the catch-up");
        let rows: Vec<(i64, String)> = page
            .updates
            .iter()
            .map(|(token, row)| (token.get(), row.as_str().to_owned()))
            .collect();
        (rows, page.upto)
    };
    let now = || Instant::now();

    // 1. A run: alice types in !a, bob types in !b and stops.
    let first = start(&state);
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_millis();
    let begun = first.writer.token();
    assert!(
        begun.get() as u128 + 1000 >= clock,
        "a first run starts at the clock: {begun}, {clock}"
    );
    first
        .writer
        .started("!a:x", "@alice:x", Duration::from_secs(60), now());
    first
        .writer
        .started("!b:x", "@bob:x", Duration::from_secs(60), now());
    first.writer.stopped("!b:x", "@bob:x");
    let old = first.writer.token();
    assert_eq!(old.get(), begun.get() + 3);
    let saved = saved_state(&state, |_| true);
    assert_eq!(saved.token, old.get());
    assert_eq!(saved.rooms, ["!a:x".to_owned()].into());
    smol::block_on(first.stop());

    // 2. Restarted with its state file: above the old run, and alice's room
    // cleared at the next token, answered to a follower at the old token
    // and to one from 0.
    let second = start(&state);
    let cur = second.writer.token();
    assert!(cur > old, "{cur} after {old}");
    let cleared = (cur.get(), r#"["!a:x",[]]"#.to_owned());
    assert_eq!(fetch(old, cur), (vec![cleared.clone()], cur));
    assert_eq!(fetch(Token(0), cur), (vec![cleared.clone()], cur));
    // Nothing asked beyond what was written.
    assert_eq!(fetch(cur, cur), (vec![], cur));
    // Never announced (no Redis): a third run would clear !a:x again.
    let saved = saved_state(&state, |_| true);
    assert_eq!(saved.token, cur.get());
    assert_eq!(saved.rooms, ["!a:x".to_owned()].into());
    smol::block_on(second.stop());

    // 3. The state file lost: the clock still starts above the old run (it
    // made far fewer than one change per millisecond).
    std::fs::remove_file(&state).expect("removing the state file");
    std::thread::sleep(Duration::from_millis(5));
    let third = start(&state);
    let lost = third.writer.token();
    assert!(lost > cur, "{lost} after {cur}, with the state file lost");
    assert_eq!(fetch(cur, lost), (vec![], lost), "nothing left to clear");
    let saved = saved_state(&state, |_| true);
    assert_eq!((saved.token, saved.rooms.len()), (lost.get(), 0));
    smol::block_on(third.stop());

    // 4. An unreadable state file is taken as lost, not fatal.
    std::fs::write(&state, "not json").expect("writing");
    std::thread::sleep(Duration::from_millis(5));
    let fourth = start(&state);
    assert!(fourth.writer.token() > lost);
    smol::block_on(fourth.stop());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sends `request` to `addr` as is; the answer's status line.
fn status_line(addr: std::net::SocketAddr, request: &str) -> String {
    let mut socket = TcpStream::connect(addr).expect("connects");
    socket.write_all(request.as_bytes()).expect("writes");
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    let mut answer = Vec::new();
    let _ = socket.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    answer.lines().next().unwrap_or_default().to_owned()
}

#[test]
fn the_typing_route_has_a_listener_of_its_own() {
    // Needs neither Synapse nor Redis: only the two listeners.
    let (redis_port, main_port, port) = (free_port(), free_port(), free_port());
    let synapse = writer_config("example.com", redis_port, "secret", main_port, port);
    let running = start_writer(synapse, "http://127.0.0.1:1", port, 0, None);
    let replication = running.addr;
    let client = running.client_addr;
    assert_ne!(replication.port(), client.port());
    let typing = "PUT /_matrix/client/v3/rooms/!r:x/typing/@u:x HTTP/1.1\r\nHost: x\r\n\
                  Content-Length: 2\r\n\r\n{}";
    let catch_up = "GET /_synapse/replication/get_repl_stream_updates/typing/t1?from_token=0&upto_token=1 \
                    HTTP/1.1\r\nHost: rust1:80\r\nAuthorization: Bearer secret\r\n\r\n";
    // The public route is served on the client listener only (401: no
    // access token), so its clients never hold the replication
    // listener's connections.
    assert_eq!(status_line(client, typing), "HTTP/1.1 401 Unauthorized");
    assert_eq!(status_line(replication, typing), "HTTP/1.1 404 Not Found");
    // Catch-up is served on the replication listener only.
    assert_eq!(status_line(replication, catch_up), "HTTP/1.1 200 OK");
    assert_eq!(status_line(client, catch_up), "HTTP/1.1 400 Bad Request");
    smol::block_on(running.stop());
}
