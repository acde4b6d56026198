//! The Rust account-data writer (`examples/account_data_writer`) as
//! Synapse 1.163.2's `stream_writers.account_data`, in a deployment on
//! PostgreSQL (main, an event persister, a typing worker; Redis), with
//! clients talking to main only: main hands every account-data change to
//! the Rust process over HTTP, follows its rows over Redis and catches up
//! from it.
//!
//! One deployment serves the phases, in order (each checks what the ones
//! before left):
//! 1. global and room account data and tags, set and removed through
//!    main, in `/sync` and the GET endpoints;
//! 2. an ignore list set through main reaches `/sync` at once although
//!    main had cached the old one, and, with the writer's `caches` rows
//!    turned off, does not (main keeps its cached list);
//! 3. the writer SIGKILLed and restarted: its next id is above every
//!    earlier one and shows at once, `stream_positions` holds its
//!    position, no id is used twice; main restarted: everything shows;
//! 4. main cut off Redis during a change catches up from the writer over
//!    HTTP;
//! 5. the writer, main and the event persister write `caches` at once:
//!    ids from the one sequence, none twice, and each process applies the
//!    others' (main, the persister and the typing worker drop their
//!    cached ignore lists; the writer has every row of theirs);
//! 6. bad input on the writer's endpoints (wrong secret, malformed body,
//!    malformed, remote or unknown user): its errors, nothing written.
//!
//! `synapse_s_own_writer_given_bad_input_and_typing_from_the_database`
//! gives the same bad input to Synapse's own account-data writer (a
//! generic worker owning the stream, in a deployment of its own, about
//! 7 s), and `BAD_INPUT` sets both answers side by side. In that
//! deployment the Rust typing writer (`examples/typing_writer`) reads the
//! servers in a room from the database to apply federation typing.
//!
//! The writer runs as a process of its own: this test binary again, whose
//! `writer_process` test runs the example's `run` when
//! `ACCOUNT_DATA_WRITER_ARGS` is set (so that it can be killed, and
//! without needing the example built). Needs what the other Synapse
//! tests need: the venv (`SYNAPSE_PYTHON`), redis-server, PostgreSQL on
//! 127.0.0.1:5432.

#![cfg(all(
    unix,
    feature = "postgres",
    feature = "http-server",
    feature = "http-catch-up",
    feature = "runtime-smol"
))]

#[allow(dead_code)]
#[path = "../examples/account_data_writer/main.rs"]
mod account_data_writer;
mod common;
#[path = "../examples/typing_writer/writer.rs"]
mod typing_writer;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::synapse::{SynapseDeployment, segment};
use serde_json::{Value, json};

const WRITER: &str = "rust_account_data";
/// The writer's command line, `\x1f`-separated: set in the writer's
/// process only.
const WRITER_ARGS: &str = "ACCOUNT_DATA_WRITER_ARGS";
/// Set: the writer publishes no `caches` rows.
const CACHES_OFF: &str = "ACCOUNT_DATA_WRITER_CACHES_OFF";
const PATIENCE: Duration = Duration::from_secs(30);

/// Not a test: the writer's process (see the module docs).
#[test]
fn writer_process() {
    let Ok(args) = std::env::var(WRITER_ARGS) else {
        return;
    };
    if std::env::var_os(CACHES_OFF).is_some() {
        account_data_writer::writer::CACHES_OFF.store(true, Ordering::SeqCst);
    }
    let code = match account_data_writer::run(args.split('\x1f').map(str::to_owned)) {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("account_data_writer: {error}");
            1
        }
    };
    std::process::exit(code);
}

/// The writer's process and its log.
struct WriterProcess {
    child: Child,
    log: PathBuf,
}

impl WriterProcess {
    fn start(deployment: &SynapseDeployment, port: u16, caches_off: bool) -> WriterProcess {
        let log = deployment.dir.join(format!("{WRITER}.log"));
        let before = ready_lines(&log);
        let config = deployment.dir.join("homeserver.yaml");
        let args = [
            "--config".to_owned(),
            config.display().to_string(),
            "--instance".to_owned(),
            WRITER.to_owned(),
            "--listen".to_owned(),
            format!("127.0.0.1:{port}"),
        ]
        .join("\x1f");
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("writer log");
        let mut command = Command::new(std::env::current_exe().expect("test binary"));
        command
            .args([
                "writer_process",
                "--exact",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(WRITER_ARGS, args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        if caches_off {
            command.env(CACHES_OFF, "1");
        }
        let child = command.spawn().expect("starting the writer");
        let mut writer = WriterProcess { child, log };
        let deadline = Instant::now() + PATIENCE;
        while ready_lines(&writer.log) == before {
            if let Ok(Some(status)) = writer.child.try_wait() {
                panic!("the writer exited ({status}): {}", writer.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "the writer did not connect: {}",
                writer.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        writer
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM: it must stop by itself, with success.
    fn terminate(mut self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(
                    status.success(),
                    "stopped with {status}: {}",
                    self.log_text()
                );
                break;
            }
            assert!(Instant::now() < deadline, "no stop after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(self.log_text().contains("stopped at account_data"));
    }

    fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("wait");
    }
}

impl Drop for WriterProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ready_lines(log: &PathBuf) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches("redis ready")
        .count()
}

/// A user of the deployment, talking to main.
struct Client<'a> {
    deployment: &'a SynapseDeployment,
    token: String,
    user_id: String,
}

static FRESH: AtomicU64 = AtomicU64::new(1);

impl<'a> Client<'a> {
    fn register(deployment: &'a SynapseDeployment, localpart: &str) -> Client<'a> {
        Client {
            deployment,
            token: deployment.register(localpart, "password-1234"),
            user_id: deployment.user_id(localpart),
        }
    }

    /// `(status, answer)` of a request to main's client API.
    fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        self.deployment
            .requests(&[self.request_to("main", method, path, body)], 1)
            .remove(0)
    }

    /// A request to `instance`'s client API, for
    /// [`SynapseDeployment::requests`].
    fn request_to(&self, instance: &str, method: &str, path: &str, body: Option<&Value>) -> Value {
        let url = format!("{}{path}", self.deployment.instance(instance).client_url);
        SynapseDeployment::request_json(method, &url, Some(&self.token), body)
    }

    fn ok(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let (status, answer) = self.request(method, path, body);
        assert_eq!(status, 200, "{method} {path}: {answer}");
        answer
    }

    fn user_path(&self) -> String {
        format!("/_matrix/client/v3/user/{}", segment(&self.user_id))
    }

    fn put_global(&self, kind: &str, content: &Value) {
        self.ok(
            "PUT",
            &format!("{}/account_data/{}", self.user_path(), segment(kind)),
            Some(content),
        );
    }

    /// The global item as main's GET answers it (`None`: 404).
    fn get_global(&self, kind: &str) -> Option<Value> {
        let path = format!("{}/account_data/{}", self.user_path(), segment(kind));
        match self.request("GET", &path, None) {
            (200, answer) => Some(answer),
            (404, _) => None,
            (status, answer) => panic!("GET {path}: {status} {answer}"),
        }
    }

    fn room_path(&self, room: &str) -> String {
        format!("{}/rooms/{}", self.user_path(), segment(room))
    }

    /// `(next_batch, answer)` of a `/sync` (initial without `since`); each
    /// with another timeout, so that Synapse's response cache never
    /// answers it.
    fn sync(&self, since: Option<&str>) -> (String, Value) {
        self.sync_on("main", since)
    }

    /// [`sync`](Self::sync) served by `instance` (every process of the
    /// deployment serves `/sync`, and caches what it reads for it).
    fn sync_on(&self, instance: &str, since: Option<&str>) -> (String, Value) {
        let fresh = FRESH.fetch_add(1, Ordering::Relaxed);
        let mut path = format!("/_matrix/client/v3/sync?timeout={fresh}");
        if let Some(since) = since {
            path.push_str(&format!("&since={}", segment(since)));
        }
        let request = self.request_to(instance, "GET", &path, None);
        let (status, answer) = self.deployment.requests(&[request], 1).remove(0);
        assert_eq!(status, 200, "/sync on {instance}: {answer}");
        let next = answer["next_batch"]
            .as_str()
            .expect("next_batch")
            .to_owned();
        (next, answer)
    }
}

/// The content of `kind` in a `/sync` answer's account data (`room`:
/// that room's), if it is there.
fn synced(sync: &Value, room: Option<&str>, kind: &str) -> Option<Value> {
    let events = match room {
        None => &sync["account_data"]["events"],
        Some(room) => &sync["rooms"]["join"][room]["account_data"]["events"],
    };
    events
        .as_array()?
        .iter()
        .find(|event| event["type"] == kind)
        .map(|event| event["content"].clone())
}

/// The event ids of a `/sync` answer's timeline of `room`.
fn timeline(sync: &Value, room: &str) -> Vec<String> {
    sync["rooms"]["join"][room]["timeline"]["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|event| event["event_id"].as_str().map(str::to_owned))
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port")
}

/// Every id of the stream in its three tables, and the writer's row of
/// `stream_positions`.
fn ids_and_position(deployment: &SynapseDeployment) -> (Vec<i64>, Option<i64>) {
    let ids = deployment
        .sql(
            "SELECT stream_id FROM account_data UNION ALL SELECT stream_id FROM room_account_data \
             UNION ALL SELECT stream_id FROM room_tags_revisions ORDER BY 1",
        )
        .iter()
        .map(|row| row[0].as_i64().expect("an id"))
        .collect();
    let position = deployment
        .sql(&format!(
            "SELECT stream_id FROM stream_positions WHERE stream_name = 'account_data' \
             AND instance_name = '{WRITER}'"
        ))
        .first()
        .map(|row| row[0].as_i64().expect("a position"));
    (ids, position)
}

fn assert_distinct(ids: &[i64], what: &str) {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), ids.len(), "{what}: an id used twice: {ids:?}");
}

#[test]
fn synapse_hands_account_data_to_the_rust_writer() {
    let started = Instant::now();
    let port = free_port();
    let deployment = SynapseDeployment::start_with(
        1,
        &json!({
            "instance_map": {WRITER: {"host": "127.0.0.1", "port": port}},
            "stream_writers": {"account_data": [WRITER]},
            // The client API's removal of global account data.
            "experimental_features": {"msc3391_enabled": true},
        }),
    );
    eprintln!("deployment up in {:?}", deployment.startup);
    let mut writer = WriterProcess::start(&deployment, port, false);

    let alice = Client::register(&deployment, "alice");
    let bob = Client::register(&deployment, "bob");
    let room = deployment.create_room(&alice.token);
    bob.ok(
        "POST",
        &format!("/_matrix/client/v3/join/{}", segment(&room)),
        Some(&json!({})),
    );

    // 1. Set and removed through main: in the GET endpoints and /sync.
    let phase = Instant::now();
    let (since, _) = alice.sync(None);
    alice.put_global("org.example.global", &json!({"n": 1}));
    let room_item = format!("{}/account_data/org.example.room", alice.room_path(&room));
    alice.ok("PUT", &room_item, Some(&json!({"n": 2})));
    let tag = format!("{}/tags/u.work", alice.room_path(&room));
    alice.ok("PUT", &tag, Some(&json!({"order": 0.5})));
    assert_eq!(
        alice.get_global("org.example.global"),
        Some(json!({"n": 1}))
    );
    assert_eq!(alice.ok("GET", &room_item, None), json!({"n": 2}));
    let tags = format!("{}/tags", alice.room_path(&room));
    assert_eq!(
        alice.ok("GET", &tags, None),
        json!({"tags": {"u.work": {"order": 0.5}}})
    );
    for sync in [alice.sync(None).1, alice.sync(Some(&since)).1] {
        assert_eq!(
            synced(&sync, None, "org.example.global"),
            Some(json!({"n": 1})),
            "{sync}"
        );
        assert_eq!(
            synced(&sync, Some(&room), "org.example.room"),
            Some(json!({"n": 2}))
        );
        assert_eq!(
            synced(&sync, Some(&room), "m.tag"),
            Some(json!({"tags": {"u.work": {"order": 0.5}}}))
        );
    }
    let (ids, position) = ids_and_position(&deployment);
    assert_eq!(position, ids.iter().max().copied(), "stream_positions");

    let (since, _) = alice.sync(None);
    let unstable = format!(
        "/_matrix/client/unstable/org.matrix.msc3391/user/{}",
        segment(&alice.user_id)
    );
    alice.ok(
        "DELETE",
        &format!("{unstable}/account_data/org.example.global"),
        None,
    );
    alice.ok(
        "DELETE",
        &format!(
            "{unstable}/rooms/{}/account_data/org.example.room",
            segment(&room)
        ),
        None,
    );
    alice.ok("DELETE", &tag, None);
    assert_eq!(alice.get_global("org.example.global"), None);
    assert_eq!(alice.request("GET", &room_item, None).0, 404);
    assert_eq!(alice.ok("GET", &tags, None), json!({"tags": {}}));
    let (_, sync) = alice.sync(Some(&since));
    assert_eq!(synced(&sync, None, "org.example.global"), Some(json!({})));
    assert_eq!(
        synced(&sync, Some(&room), "org.example.room"),
        Some(json!({}))
    );
    assert_eq!(
        synced(&sync, Some(&room), "m.tag"),
        Some(json!({"tags": {}}))
    );
    eprintln!("phase 1 (set and removed) took {:?}", phase.elapsed());

    // 2. Ignoring through main: main had cached the old ignore list (every
    //    /sync reads it); only the writer's `caches` row makes it drop it.
    let phase = Instant::now();
    let ignores_bob = |ignorer: &Client, caches_on: bool| {
        let (since, sync) = ignorer.sync(None);
        let before = send(&deployment, &bob.token, &room, "before");
        let (_, seen) = ignorer.sync(Some(&since));
        assert!(timeline(&seen, &room).contains(&before), "{sync}");
        ignorer.put_global(
            "m.ignored_user_list",
            &json!({"ignored_users": {bob.user_id.clone(): {}}}),
        );
        let (since, _) = ignorer.sync(None);
        let after = send(&deployment, &bob.token, &room, "after");
        let (_, seen) = ignorer.sync(Some(&since));
        let reached = timeline(&seen, &room).contains(&after);
        assert_eq!(
            reached, !caches_on,
            "bob's message after the ignore reached {}: {reached} (caches rows on: {caches_on})",
            ignorer.user_id
        );
    };
    // Without the invalidation: main keeps the cached list.
    writer.terminate();
    writer = WriterProcess::start(&deployment, port, true);
    let carol = Client::register(&deployment, "carol");
    carol.ok(
        "POST",
        &format!("/_matrix/client/v3/join/{}", segment(&room)),
        Some(&json!({})),
    );
    ignores_bob(&carol, false);
    writer.terminate();
    writer = WriterProcess::start(&deployment, port, false);
    ignores_bob(&alice, true);
    eprintln!("phase 2 (ignore) took {:?}", phase.elapsed());

    // 3. The writer SIGKILLed and restarted, then main restarted.
    let phase = Instant::now();
    alice.put_global("org.example.kill", &json!({"run": 1}));
    let (ids_before, position_before) = ids_and_position(&deployment);
    let highest = ids_before.iter().max().copied().expect("ids");
    assert_eq!(position_before, Some(highest));
    writer.kill();
    writer = WriterProcess::start(&deployment, port, false);
    let (since, _) = alice.sync(None);
    alice.put_global("org.example.kill", &json!({"run": 2}));
    assert_eq!(
        alice.get_global("org.example.kill"),
        Some(json!({"run": 2}))
    );
    let (_, sync) = alice.sync(Some(&since));
    assert_eq!(
        synced(&sync, None, "org.example.kill"),
        Some(json!({"run": 2}))
    );
    let (ids, position) = ids_and_position(&deployment);
    let new_id = deployment
        .sql("SELECT stream_id FROM account_data WHERE account_data_type = 'org.example.kill'")[0]
        [0]
    .as_i64()
    .expect("an id");
    assert!(new_id > highest, "{new_id} not above {highest}");
    assert_eq!(position, Some(new_id), "stream_positions");
    assert_distinct(&ids, "account_data");
    let caches: Vec<i64> = deployment
        .sql("SELECT stream_id FROM cache_invalidation_stream_by_instance")
        .iter()
        .map(|row| row[0].as_i64().expect("an id"))
        .collect();
    assert_distinct(&caches, "caches");

    let restarted = deployment.restart("main");
    eprintln!("main restarted in {restarted}");
    assert_eq!(
        alice.get_global("org.example.kill"),
        Some(json!({"run": 2}))
    );
    let (_, sync) = alice.sync(None);
    assert_eq!(
        synced(&sync, None, "org.example.kill"),
        Some(json!({"run": 2}))
    );
    assert_eq!(
        synced(&sync, None, "m.ignored_user_list"),
        Some(json!({"ignored_users": {bob.user_id.clone(): {}}}))
    );
    alice.put_global("org.example.kill", &json!({"run": 3}));
    assert_eq!(
        alice.get_global("org.example.kill"),
        Some(json!({"run": 3}))
    );
    eprintln!("phase 3 (kill, restarts) took {:?}", phase.elapsed());

    // 4. Main cut off Redis while a change is made: it misses the row,
    //    and catches up once back, at the POSITION the writer answers its
    //    REPLICATE with. (Synapse 1.163.2 reads account_data and caches
    //    catch-up from the database on every process, not over HTTP; the
    //    writer's HTTP answer, what a follower that asks it gets, must be
    //    the page Synapse's own update function gives.)
    let phase = Instant::now();
    alice.put_global("org.example.cut", &json!({"n": 1}));
    // Cached by main now.
    assert_eq!(alice.get_global("org.example.cut"), Some(json!({"n": 1})));
    let (since, _) = alice.sync(None);
    let (ids, _) = ids_and_position(&deployment);
    let from = ids.iter().max().copied().expect("ids");
    let fetches = |log: &str| {
        log.matches("Fetching replication rows for 'account_data' / rust_account_data")
            .count()
    };
    let main_log = deployment.instance("main").log.clone();
    let fetches_before = fetches(&std::fs::read_to_string(&main_log).unwrap_or_default());
    let url = format!(
        "{}{}/account_data/org.example.cut",
        deployment.instance("main").client_url,
        alice.user_path()
    );
    let change =
        SynapseDeployment::request_json("PUT", &url, Some(&alice.token), Some(&json!({"n": 2})));
    let blip = deployment.blip("main", &[change], 1, Duration::from_secs(1));
    eprintln!("blip: {blip}");
    assert_eq!(blip["results"][0]["status"], json!(200), "{blip}");
    assert_eq!(alice.get_global("org.example.cut"), Some(json!({"n": 2})));
    let (_, sync) = alice.sync(Some(&since));
    assert_eq!(
        synced(&sync, None, "org.example.cut"),
        Some(json!({"n": 2}))
    );
    let fetched = fetches(&std::fs::read_to_string(&main_log).unwrap_or_default());
    assert!(
        fetched > fetches_before,
        "main did not catch up account_data from rust_account_data: it did not miss the row?"
    );
    let (_, position) = ids_and_position(&deployment);
    let to = position.expect("a position");
    let served = writer_catch_up(&deployment, port, from, to);
    let synapse = common::synapse::run_script(
        "account_data_store.py",
        &["run", &deployment.database, WRITER, "0"],
        &json!([{"op": "page", "from": from, "to": to}]).to_string(),
    );
    let synapse: Value = serde_json::from_str(&synapse).expect("account_data_store.py's answer");
    assert_eq!(Value::String(served.clone()), synapse[0], "({from}, {to}]");
    assert!(served.contains("org.example.cut"), "{served}");
    eprintln!("phase 4 (main cut off Redis) took {:?}", phase.elapsed());

    // 5. Everyone writes `caches` at once: the Rust writer (ignore lists
    //    set through main), main (logouts) and the event persister (state
    //    changes main hands it), in one burst of concurrent requests.
    let phase = Instant::now();
    let processes = ["main", "persister1", "worker1"];
    let ignorers: Vec<Client> = ["dave", "erin", "frank"]
        .iter()
        .map(|name| Client::register(&deployment, name))
        .collect();
    for ignorer in &ignorers {
        ignorer.ok(
            "POST",
            &format!("/_matrix/client/v3/join/{}", segment(&room)),
            Some(&json!({})),
        );
        // Each process caches the ignorer's (empty) ignore list.
        for process in processes {
            ignorer.sync_on(process, None);
        }
    }
    let mut burst = Vec::new();
    for (n, ignorer) in ignorers.iter().enumerate() {
        burst.push(ignorer.request_to(
            "main",
            "PUT",
            &format!("{}/account_data/m.ignored_user_list", ignorer.user_path()),
            Some(&json!({"ignored_users": {bob.user_id.clone(): {}}})),
        ));
        // Alice can (she made the room); main hands it to the persister.
        let state = deployment.state_request(
            "main",
            &alice.token,
            &room,
            ("org.example.state", &format!("n{n}")),
            &json!({"n": n}),
        );
        burst.push(state);
        let login = deployment.call(
            "POST",
            &format!(
                "{}/_matrix/client/v3/login",
                deployment.instance("main").client_url
            ),
            &ignorer.token,
            Some(
                &json!({"type": "m.login.password", "password": "password-1234",
                         "identifier": {"type": "m.id.user", "user": ignorer.user_id}}),
            ),
        );
        let second = login["access_token"].as_str().expect("access_token");
        burst.push(SynapseDeployment::request_json(
            "POST",
            &format!(
                "{}/_matrix/client/v3/logout",
                deployment.instance("main").client_url
            ),
            Some(second),
            Some(&json!({})),
        ));
    }
    let before = max_caches_id(&deployment);
    let threads = burst.len();
    for (status, answer) in deployment.requests(&burst, threads) {
        assert_eq!(status, 200, "{answer}");
    }

    // The table: ids of every process from the one sequence, none twice.
    let written: Vec<(i64, String, String)> = deployment
        .sql(&format!(
            "SELECT stream_id, instance_name, cache_func FROM cache_invalidation_stream_by_instance \
             WHERE stream_id > {before} ORDER BY stream_id"
        ))
        .iter()
        .map(|row| {
            let text = |at: usize| row[at].as_str().expect("text").to_owned();
            (row[0].as_i64().expect("an id"), text(1), text(2))
        })
        .collect();
    eprintln!("caches written in the burst: {written:?}");
    let all: Vec<i64> = deployment
        .sql("SELECT stream_id FROM cache_invalidation_stream_by_instance")
        .iter()
        .map(|row| row[0].as_i64().expect("an id"))
        .collect();
    assert_distinct(&all, "caches");
    let last_value = deployment.sql("SELECT last_value FROM cache_invalidation_stream_seq")[0][0]
        .as_i64()
        .expect("last_value");
    assert!(
        all.iter().all(|&id| id <= last_value),
        "{all:?} past {last_value}"
    );
    let of = |instance: &str| -> Vec<i64> {
        written
            .iter()
            .filter(|(_, by, _)| by == instance)
            .map(|&(id, _, _)| id)
            .collect()
    };
    let rust_funcs: Vec<&str> = written
        .iter()
        .filter(|(_, by, _)| by == WRITER)
        .map(|(_, _, func)| func.as_str())
        .collect();
    assert_eq!(
        rust_funcs
            .iter()
            .filter(|&&func| func == "ignored_users")
            .count(),
        ignorers.len(),
        "{written:?}"
    );
    // Main is `master` on the wire and in the table.
    for instance in ["master", "persister1"] {
        assert!(
            !of(instance).is_empty(),
            "no caches row of {instance}: {written:?}"
        );
    }

    // Each Synapse process dropped each ignorer's cached list: bob's
    // message no longer reaches their /sync there (a control message
    // after it shows the process got that far).
    for process in processes {
        let since: Vec<String> = ignorers
            .iter()
            .map(|ignorer| ignorer.sync_on(process, None).0)
            .collect();
        let ignored = send(&deployment, &bob.token, &room, "after the burst");
        let control = send(&deployment, &alice.token, &room, "control");
        for (ignorer, since) in ignorers.iter().zip(&since) {
            let seen = timeline_until(ignorer, process, since, &room, &control);
            assert!(
                !seen.contains(&ignored),
                "{process} kept {}'s cached ignore list: {seen:?}",
                ignorer.user_id
            );
        }
    }
    // And the Rust writer had every row of the others, live or caught up.
    let deadline = Instant::now() + PATIENCE;
    for instance in written
        .iter()
        .map(|(_, by, _)| by)
        .filter(|by| *by != WRITER)
    {
        for id in of(instance) {
            let line = format!("caches from {instance} at {id}:");
            while !writer.log_text().contains(&line) {
                assert!(
                    Instant::now() < deadline,
                    "the writer never had {instance}'s caches row {id}: {}",
                    writer.log_text()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    eprintln!(
        "phase 5 (caches written at once) took {:?}",
        phase.elapsed()
    );

    // 6. Bad input on the writer's endpoints: Synapse's errors (or the
    //    crate's stricter ones, see BAD_INPUT), nothing written.
    let phase = Instant::now();
    let answers = bad_input(&deployment, WRITER, port, &alice.user_id);
    for (case, answer) in BAD_INPUT.iter().zip(&answers) {
        assert_eq!(
            (answer.0.0, answer.0.1.as_str()),
            case.rust,
            "{}: {answer:?}",
            case.what
        );
        assert_eq!(answer.1, case.rust_writes, "{}: written", case.what);
    }
    eprintln!("phase 6 (bad input) took {:?}", phase.elapsed());

    for name in ["main", "persister1"] {
        let errors = deployment.log_errors(name);
        assert!(errors.is_empty(), "{name} logged errors: {errors:#?}");
    }
    writer.terminate();
    eprintln!("whole test took {:?}", started.elapsed());
}

/// A call with something wrong, and what each writer answers it with
/// (`(status, errcode)`; `""`: no error), as run here (phase 6 and
/// `synapse_s_own_writer_given_bad_input`).
///
/// Where they differ, the crate is stricter on purpose
/// (`AccountDataRequest::from_call`, `CatchUpEndpoint`): a wrong or
/// missing secret is a 401 saying so, where Synapse's `_check_auth` raises
/// and answers 500; a body without an object `content` is a 400, where
/// Synapse answers 500 or stores the non-object; and a user id that is
/// not one, a remote user or a room id that is not one are refused, where
/// Synapse's writer takes them on trust (main checked the requester) and
/// writes rows no client can ever read. A local user never registered is
/// written by both.
struct BadInput {
    what: &'static str,
    /// The endpoint and its arguments, `{user}` for a registered user
    /// (and `{user_id}` in the body).
    path: &'static str,
    /// `None`: no `Authorization`; `Some("")`: the right secret.
    auth: Option<&'static str>,
    body: &'static str,
    rust: (u16, &'static str),
    /// Whether the Rust writer writes it.
    rust_writes: bool,
    synapse: (u16, &'static str),
    /// Whether Synapse's writer writes it (it takes ids on trust: main
    /// checked them before calling).
    synapse_writes: bool,
}

const BAD_INPUT: &[BadInput] = &[
    BadInput {
        what: "no secret",
        path: "add_user_account_data/{user}/org.example.bad",
        auth: None,
        body: r#"{"content":{"n":1}}"#,
        rust: (401, "M_MISSING_TOKEN"),
        rust_writes: false,
        synapse: (500, "M_UNKNOWN"),
        synapse_writes: false,
    },
    BadInput {
        what: "a wrong secret",
        path: "add_user_account_data/{user}/org.example.bad",
        auth: Some("wrong"),
        body: r#"{"content":{"n":1}}"#,
        rust: (401, "M_UNKNOWN_TOKEN"),
        rust_writes: false,
        synapse: (500, "M_UNKNOWN"),
        synapse_writes: false,
    },
    BadInput {
        what: "a body that is not JSON",
        path: "add_user_account_data/{user}/org.example.bad",
        auth: Some(""),
        body: "nope",
        rust: (400, "M_NOT_JSON"),
        rust_writes: false,
        synapse: (400, "M_NOT_JSON"),
        synapse_writes: false,
    },
    BadInput {
        what: "a body that is not an object",
        path: "add_user_account_data/{user}/org.example.bad",
        auth: Some(""),
        body: "[1]",
        rust: (400, "M_BAD_JSON"),
        rust_writes: false,
        synapse: (400, "M_BAD_JSON"),
        synapse_writes: false,
    },
    BadInput {
        what: "no content",
        path: "add_user_account_data/{user}/org.example.bad",
        auth: Some(""),
        body: "{}",
        rust: (400, "M_BAD_JSON"),
        rust_writes: false,
        synapse: (500, "M_UNKNOWN"),
        synapse_writes: false,
    },
    BadInput {
        what: "content that is not an object",
        path: "add_user_account_data/{user}/org.example.bad",
        auth: Some(""),
        body: r#"{"content":[1]}"#,
        rust: (400, "M_BAD_JSON"),
        rust_writes: false,
        synapse: (200, ""),
        synapse_writes: true,
    },
    BadInput {
        what: "a user id that is not one",
        path: "add_user_account_data/alice/org.example.bad",
        auth: Some(""),
        body: r#"{"content":{"n":1}}"#,
        rust: (400, "M_INVALID_PARAM"),
        rust_writes: false,
        synapse: (200, ""),
        synapse_writes: true,
    },
    BadInput {
        what: "a remote user",
        path: "add_user_account_data/%40mallory%3Aremote.org/org.example.bad",
        auth: Some(""),
        body: r#"{"content":{"n":1}}"#,
        rust: (403, "M_FORBIDDEN"),
        rust_writes: false,
        synapse: (200, ""),
        synapse_writes: true,
    },
    BadInput {
        what: "a remote user's ignore list",
        path: "add_user_account_data/%40mallory%3Aremote.org/m.ignored_user_list",
        auth: Some(""),
        body: r#"{"content":{"ignored_users":{"@spam:remote.org":{}}}}"#,
        rust: (403, "M_FORBIDDEN"),
        rust_writes: false,
        synapse: (200, ""),
        synapse_writes: true,
    },
    BadInput {
        what: "a room id that is not one",
        path: "add_tag/{user}/room/u.work",
        auth: Some(""),
        body: r#"{"content":{}}"#,
        rust: (400, "M_INVALID_PARAM"),
        rust_writes: false,
        synapse: (200, ""),
        synapse_writes: true,
    },
    BadInput {
        what: "ignoring oneself",
        path: "add_user_account_data/{user}/m.ignored_user_list",
        auth: Some(""),
        body: r#"{"content":{"ignored_users":{"{user_id}":{}}}}"#,
        rust: (400, "M_INVALID_PARAM"),
        rust_writes: false,
        synapse: (400, "M_INVALID_PARAM"),
        synapse_writes: false,
    },
    BadInput {
        what: "a local user never registered",
        path: "add_user_account_data/%40nobody%3Adep.test/org.example.bad",
        auth: Some(""),
        body: r#"{"content":{"n":1}}"#,
        // Neither writer looks the user up: main checked the requester.
        rust: (200, ""),
        rust_writes: true,
        synapse: (200, ""),
        synapse_writes: true,
    },
];

/// Sends each of [`BAD_INPUT`] to `instance`'s replication listener on
/// `port`, as Synapse's processes call it (its secret, `Host:
/// <instance>:80`); per case, `((status, errcode), whether the
/// account-data tables changed)`.
fn bad_input(
    deployment: &SynapseDeployment,
    instance: &str,
    port: u16,
    user: &str,
) -> Vec<((u16, String), bool)> {
    BAD_INPUT
        .iter()
        .map(|case| {
            let before = account_data_tables(deployment);
            let path = format!(
                "/_synapse/replication/{}",
                case.path.replace("{user}", &segment(user))
            );
            let auth = case.auth.map(|auth| {
                if auth.is_empty() {
                    deployment.secret.as_str()
                } else {
                    auth
                }
            });
            let body = case.body.replace("{user_id}", user);
            let (status, answer) = raw_post(port, instance, &path, auth, &body);
            let errcode = answer["errcode"].as_str().unwrap_or("").to_owned();
            ((status, errcode), account_data_tables(deployment) != before)
        })
        .collect()
}

/// `POST path` with `body` to 127.0.0.1:`port`: its status and JSON body
/// (`null` if it is not JSON).
fn raw_post(port: u16, instance: &str, path: &str, auth: Option<&str>, body: &str) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {instance}:80\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(secret) = auth {
        request.push_str(&format!("Authorization: Bearer {secret}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).expect("request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("answer");
    let status = answer
        .get(9..12)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not HTTP: {answer}"));
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// A chunked HTTP/1.1 body (Synapse's answers), joined.
fn dechunk(mut body: &str) -> String {
    let mut joined = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        joined.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    joined
}

/// What an account-data writer writes, as one text: its three tables,
/// tags, `ignored_users`, the ignore caches' invalidations and
/// `stream_positions` for the stream.
fn account_data_tables(deployment: &SynapseDeployment) -> String {
    let table = |sql: &str| format!("(SELECT json_agg(t::text ORDER BY t::text) FROM ({sql}) t)");
    let query = [
        "SELECT * FROM account_data",
        "SELECT * FROM room_account_data",
        "SELECT * FROM room_tags",
        "SELECT * FROM room_tags_revisions",
        "SELECT * FROM ignored_users",
        "SELECT stream_id, instance_name, cache_func, keys FROM cache_invalidation_stream_by_instance \
         WHERE cache_func IN ('ignored_users', 'ignored_by')",
        "SELECT * FROM stream_positions WHERE stream_name = 'account_data'",
    ]
    .map(table)
    .join(", ");
    serde_json::to_string(&deployment.sql(&format!("SELECT {query}"))).expect("JSON")
}

/// The highest id in `cache_invalidation_stream_by_instance` (0: none).
fn max_caches_id(deployment: &SynapseDeployment) -> i64 {
    deployment.sql("SELECT COALESCE(MAX(stream_id), 0) FROM cache_invalidation_stream_by_instance")
        [0][0]
        .as_i64()
        .expect("an id")
}

/// The event ids of `room` that `/sync`s on `process` from `since` give,
/// until `until` is among them.
fn timeline_until(
    client: &Client,
    process: &str,
    since: &str,
    room: &str,
    until: &str,
) -> Vec<String> {
    let deadline = Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    let mut since = since.to_owned();
    while !seen.iter().any(|id| id == until) {
        assert!(
            Instant::now() < deadline,
            "{until} never reached /sync on {process}"
        );
        let (next, sync) = client.sync_on(process, Some(&since));
        seen.extend(timeline(&sync, room));
        since = next;
    }
    seen
}

/// Sends a message to `room` through main; its event id.
fn send(deployment: &SynapseDeployment, token: &str, room: &str, body: &str) -> String {
    let request = deployment.message_request("main", token, room, body);
    let (status, answer) = deployment.requests(&[request], 1).remove(0);
    assert_eq!(status, 200, "{answer}");
    answer["event_id"].as_str().expect("event_id").to_owned()
}

/// The writer's answer to `get_repl_stream_updates/account_data` for
/// `(from, to]`, asked as Synapse's processes ask (its secret, `Host:
/// <instance>:80`).
fn writer_catch_up(deployment: &SynapseDeployment, port: u16, from: i64, to: i64) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let request = format!(
        "GET /_synapse/replication/get_repl_stream_updates/account_data/t{from}?from_token={from}&upto_token={to} \
         HTTP/1.1\r\nHost: {WRITER}:80\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        deployment.secret
    );
    stream.write_all(request.as_bytes()).expect("request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .expect("a body")
}

/// The Rust typing writer of the second test, and its listener.
const TYPING: &str = "rust_typing";

/// Synapse's own account-data writer (a generic worker owning the
/// stream) given [`BAD_INPUT`]: what it answers and whether it writes, to
/// set beside the Rust writer's (phase 6 of the test above). In the same
/// deployment (PostgreSQL), the Rust typing writer reads the servers in a
/// room from Synapse's database (its `database` section, no admin token)
/// to apply federation typing as Synapse's `_recv_edu` does.
#[test]
fn synapse_s_own_writer_given_bad_input_and_typing_from_the_database() {
    let started = Instant::now();
    let typing_port = free_port();
    let deployment = SynapseDeployment::start_with(
        1,
        &json!({
            "stream_writers": {"account_data": ["worker1"], "typing": [TYPING]},
            "instance_map": {TYPING: {"host": "127.0.0.1", "port": typing_port}},
        }),
    );
    let alice = Client::register(&deployment, "alice");
    let port = deployment.instance("worker1").replication_port;
    let answers = bad_input(&deployment, "worker1", port, &alice.user_id);
    for (case, answer) in BAD_INPUT.iter().zip(&answers) {
        assert_eq!(
            (answer.0.0, answer.0.1.as_str()),
            case.synapse,
            "{}: {answer:?}",
            case.what
        );
        assert_eq!(answer.1, case.synapse_writes, "{}", case.what);
    }
    eprintln!("bad input to Synapse's writer took {:?}", started.elapsed());

    // The typing writer, on the deployment's own configuration (its
    // `database` section; no admin token).
    let phase = Instant::now();
    let synapse = synapse_replication::config::SynapseConfig::from_value(deployment.config.clone())
        .expect("the deployment's config");
    assert!(synapse.database().is_some());
    let running = smol::block_on(typing_writer::start(
        typing_writer::Options {
            synapse,
            instance: TYPING.into(),
            homeserver: deployment.instance("main").client_url.clone(),
            admin_token: None,
            state: None,
        },
        &format!("127.0.0.1:{typing_port}"),
        "127.0.0.1:0",
    ))
    .expect("the typing writer starts");
    let writer = running.writer.clone();
    let room = deployment.create_room(&alice.token);
    let edu = |txn: &str, origin: &str, user: &str, room: &str| {
        let body = json!({"origin": origin,
                          "content": {"room_id": room, "user_id": user, "typing": true}});
        raw_post(
            typing_port,
            TYPING,
            &format!("/_synapse/replication/fed_send_edu/m.typing/{txn}"),
            Some(&deployment.secret),
            &body.to_string(),
        )
    };
    // This server is in the room: applied.
    let (status, answer) = edu("t1", &deployment.server_name, &alice.user_id, &room);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(writer.typing_in(&room), [alice.user_id.as_str()]);
    // A server not in the room, and a room this server is not in:
    // answered, not applied.
    let (status, _) = edu("t2", "remote.test", "@eve:remote.test", &room);
    assert_eq!(status, 200);
    let (status, _) = edu(
        "t3",
        &deployment.server_name,
        &alice.user_id,
        "!nowhere:dep.test",
    );
    assert_eq!(status, 200);
    assert_eq!(writer.typing_in(&room), [alice.user_id.as_str()]);
    // (applied, ignored, unchecked): every EDU checked against the
    // database, none left unchecked.
    assert_eq!(writer.edus.get(), (1, 2, 0));
    eprintln!("typing from the database took {:?}", phase.elapsed());
    eprintln!("whole test took {:?}", started.elapsed());
}
