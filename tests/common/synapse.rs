//! A real Synapse 1.163.2 for interop tests: [`SynapseRig`] runs
//! `tests/synapse/rig.py`, which starts a redis-server of its own and a
//! monolith Synapse (SQLite) replicating over it, all on free loopback
//! ports, and stops both when the rig is dropped.
//!
//! [`SynapseDeployment`] runs `tests/synapse/deployment.py`: a multi-writer
//! deployment (main, event persisters, a typing writer) on a PostgreSQL
//! database of its own (127.0.0.1:5432, user postgres, trust auth; dropped
//! when the deployment stops), with fault injection (Redis restarted,
//! Redis clients killed, writer blips) and SQL queries.
//!
//! The Python comes from `$SYNAPSE_PYTHON` (what `scripts/test.sh` exports),
//! else the venv `scripts/test.sh` creates in
//! `~/.cache/synapse-replication/synapse-1.163.2`. Without it the tests fail
//! with a message saying how to create it; they never skip.
//!
//! Client-server API calls go through the same Python (`rig.py request`,
//! urllib), so the tests need no HTTP client crate. Each call is one short
//! Python process (~50 ms).
//!
//! Set `SYNAPSE_RIG_KEEP=1` to keep the rig's directory (config, database,
//! logs) after the test; it is always kept when the test panics.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

/// The pinned Synapse version the venv must hold.
pub const SYNAPSE_VERSION: &str = "1.163.2";

/// Runs `tests/synapse/<script>` with the venv's python, `args` on its
/// command line and `stdin` on its standard input; its standard output.
/// Panics (failing the test) if it fails.
pub fn run_script(script: &str, args: &[&str], stdin: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/synapse")
        .join(script);
    let mut child = Command::new(synapse_python())
        .arg(path)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run the Synapse venv's python");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write to python");
    let output = child.wait_with_output().expect("python");
    assert!(output.status.success(), "{script} {args:?} failed");
    String::from_utf8(output.stdout).expect("utf-8")
}

/// The Python of the Synapse venv: `$SYNAPSE_PYTHON`, else the venv
/// `scripts/test.sh` creates. Panics (never skips) when neither exists.
pub fn synapse_python() -> PathBuf {
    if let Some(python) = std::env::var_os("SYNAPSE_PYTHON") {
        let python = PathBuf::from(python);
        assert!(
            python.exists(),
            "SYNAPSE_PYTHON={} does not exist: run `bash scripts/test.sh` to create the \
             Synapse {SYNAPSE_VERSION} venv",
            python.display()
        );
        return python;
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/nonexistent"));
    let python = cache
        .join("synapse-replication")
        .join(format!("synapse-{SYNAPSE_VERSION}"))
        .join("bin/python");
    assert!(
        python.exists(),
        "no Python with Synapse {SYNAPSE_VERSION}: run `bash scripts/test.sh` once (it creates \
         the venv {}), or set SYNAPSE_PYTHON to a Python with \
         `matrix-synapse[redis,postgres]=={SYNAPSE_VERSION}` installed",
        python.display()
    );
    python
}

fn rig_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/synapse/rig.py")
}

/// Percent-encodes one URL path segment (room ids hold `!` and `:`, event
/// ids `$`, user ids `@`).
pub fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

static RIGS: AtomicU64 = AtomicU64::new(0);

/// Runs `script start` in a new directory under the temp dir and returns
/// the JSON line it printed last, and how long it took. On failure the
/// script is asked to stop what it started (in case it was killed
/// half-way) and the test panics with its output; the directory is kept.
fn start_script(python: &Path, script: &Path, prefix: &str, args: &[&str]) -> (Value, Duration) {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "{prefix}-{}-{}-{nanos}",
        std::process::id(),
        RIGS.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|error| panic!("creating {}: {error}", dir.display()));
    let name = script.file_name().unwrap_or_default().to_string_lossy();
    let started = Instant::now();
    let output = Command::new(python)
        .arg(script)
        .args(["start", "--dir"])
        .arg(&dir)
        .args(["--owner-pid", &std::process::id().to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|error| panic!("running {}: {error}", python.display()));
    let startup = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        let _ = Command::new(python)
            .arg(script)
            .args(["stop", "--dir"])
            .arg(&dir)
            .output();
        panic!(
            "{name} start failed ({}); directory kept: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
            output.status,
            dir.display()
        );
    }
    let info = stdout
        .lines()
        .last()
        .and_then(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| panic!("{name} start printed no JSON line:\n{stdout}\n{stderr}"));
    (info, startup)
}

static TXNS: AtomicU64 = AtomicU64::new(0);

/// A running Synapse + Redis; stopped (and its directory removed) on drop.
#[derive(Debug)]
pub struct SynapseRig {
    /// The server name, also the Redis channel prefix (`rig.test`).
    pub server_name: String,
    /// `http://127.0.0.1:<port>`: the client-server API listener.
    pub client_url: String,
    /// `http://127.0.0.1:<port>`: the HTTP replication listener (catch-up).
    pub replication_url: String,
    /// The HTTP replication listener's port (`instance_map.main`).
    pub replication_port: u16,
    /// The rig's own redis-server.
    pub redis_port: u16,
    /// `worker_replication_secret`: the Bearer token of the replication
    /// listener.
    pub secret: String,
    /// `registration_shared_secret`.
    pub registration_shared_secret: String,
    /// The rig's directory: homeserver.yaml, homeserver.db, logs.
    pub dir: PathBuf,
    /// Synapse's log (INFO).
    pub log: PathBuf,
    /// How long `rig.py start` took, Synapse ready and subscribed to Redis.
    pub startup: Duration,
    /// The JSON line `rig.py start` printed.
    pub info: Value,
    python: PathBuf,
}

impl SynapseRig {
    /// Starts a rig with the default configuration.
    pub fn start() -> SynapseRig {
        SynapseRig::start_with(&json!({}))
    }

    /// Starts a rig with `extra` merged into homeserver.yaml (objects key by
    /// key, anything else replaced), e.g. `stream_writers` and
    /// `instance_map` entries for a Rust worker.
    pub fn start_with(extra: &Value) -> SynapseRig {
        SynapseRig::start_as("rig.test", extra, &[])
    }

    /// Starts a rig named `server_name` (e.g. `127.0.0.1:8448`, for
    /// federation), with `extra` merged into homeserver.yaml as
    /// [`SynapseRig::start_with`] does and `listeners` added to the rig's
    /// client and replication listeners.
    pub fn start_as(server_name: &str, extra: &Value, listeners: &[Value]) -> SynapseRig {
        assert!(extra.is_object(), "extra config must be a JSON object");
        let python = synapse_python();
        let extra = extra.to_string();
        let listeners = Value::Array(listeners.to_vec()).to_string();
        let (info, startup) = start_script(
            &python,
            &rig_script(),
            "synapse-rig",
            &[
                "--server-name",
                server_name,
                "--config-json",
                &extra,
                "--listeners-json",
                &listeners,
            ],
        );
        let text = |key: &str| -> String {
            info[key]
                .as_str()
                .unwrap_or_else(|| panic!("rig JSON without string {key:?}: {info}"))
                .to_owned()
        };
        let port = |key: &str| -> u16 {
            info[key]
                .as_u64()
                .and_then(|port| u16::try_from(port).ok())
                .unwrap_or_else(|| panic!("rig JSON without port {key:?}: {info}"))
        };
        SynapseRig {
            server_name: text("server_name"),
            client_url: text("client_url"),
            replication_url: text("replication_url"),
            replication_port: port("replication_port"),
            redis_port: port("redis_port"),
            secret: text("secret"),
            registration_shared_secret: text("registration_shared_secret"),
            dir: PathBuf::from(text("dir")),
            log: PathBuf::from(text("log")),
            startup,
            info,
            python,
        }
    }

    /// Registers `user` (localpart) with the shared-secret admin API;
    /// Synapse's answer: `user_id`, `access_token`, `device_id`,
    /// `home_server`.
    pub fn register_user(&self, user: &str, password: &str, admin: bool) -> Value {
        let mut command = self.rig_command("register");
        command.args([user, password]);
        if admin {
            command.arg("--admin");
        }
        let output = command
            .output()
            .unwrap_or_else(|error| panic!("running rig.py register: {error}"));
        assert!(
            output.status.success(),
            "registering {user}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
            panic!(
                "rig.py register printed {:?}: {error}",
                String::from_utf8_lossy(&output.stdout)
            )
        })
    }

    /// Registers `user` (localpart, not an admin); its access token.
    pub fn register(&self, user: &str, password: &str) -> String {
        let answer = self.register_user(user, password, false);
        answer["access_token"]
            .as_str()
            .unwrap_or_else(|| panic!("no access_token in {answer}"))
            .to_owned()
    }

    /// The full user id of a localpart on this server.
    pub fn user_id(&self, localpart: &str) -> String {
        format!("@{localpart}:{}", self.server_name)
    }

    /// One HTTP request to `url` (any URL: the client listener, the
    /// replication listener, ...); the status and the JSON answer (a JSON
    /// string if the answer was not JSON, `null` if empty).
    pub fn request_url(
        &self,
        method: &str,
        url: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let mut command = Command::new(&self.python);
        command
            .arg(rig_script())
            .args(["request", "--method", method, "--url", url]);
        if let Some(token) = token {
            command.args(["--token", token]);
        }
        if body.is_some() {
            command.args(["--body", "-"]);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("running rig.py request: {error}"));
        {
            let mut stdin = child.stdin.take().expect("piped stdin");
            if let Some(body) = body {
                stdin
                    .write_all(body.to_string().as_bytes())
                    .expect("writing the request body");
            }
        }
        let output = child
            .wait_with_output()
            .unwrap_or_else(|error| panic!("waiting for rig.py request: {error}"));
        assert!(
            output.status.success(),
            "{method} {url}: rig.py request failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let answer: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
            panic!(
                "{method} {url}: rig.py request printed {:?}: {error}",
                String::from_utf8_lossy(&output.stdout)
            )
        });
        let status = answer["status"]
            .as_u64()
            .and_then(|status| u16::try_from(status).ok())
            .unwrap_or_else(|| panic!("{method} {url}: no status in {answer}"));
        (status, answer["body"].clone())
    }

    /// One request to the client listener: `path` starts with `/`.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        self.request_url(method, &format!("{}{path}", self.client_url), token, body)
    }

    /// A client-server API call that must succeed (2xx): its JSON answer.
    pub fn call(&self, method: &str, path: &str, token: &str, body: Option<&Value>) -> Value {
        let (status, answer) = self.request(method, path, Some(token), body);
        assert!(
            (200..300).contains(&status),
            "{method} {path} answered {status}: {answer}"
        );
        answer
    }

    /// `GET path` with a token; must succeed.
    pub fn get(&self, token: &str, path: &str) -> Value {
        self.call("GET", path, token, None)
    }

    /// `PUT path` with a token and a JSON body; must succeed.
    pub fn put(&self, token: &str, path: &str, body: &Value) -> Value {
        self.call("PUT", path, token, Some(body))
    }

    /// `POST path` with a token and a JSON body; must succeed.
    pub fn post(&self, token: &str, path: &str, body: &Value) -> Value {
        self.call("POST", path, token, Some(body))
    }

    /// `GET` on the HTTP replication listener with the replication secret,
    /// e.g. `/_synapse/replication/get_repl_stream_updates/events/<txn>?...`.
    pub fn replication_get(&self, path: &str) -> (u16, Value) {
        self.request_url(
            "GET",
            &format!("{}{path}", self.replication_url),
            Some(&self.secret),
            None,
        )
    }

    /// A fresh transaction id for PUT /send and friends.
    pub fn txn_id(&self) -> String {
        format!(
            "rig{}-{}",
            std::process::id(),
            TXNS.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Creates a public room; its room id.
    pub fn create_room(&self, token: &str) -> String {
        self.create_room_with(token, &json!({"preset": "public_chat"}))
    }

    /// Creates a room with a createRoom body; its room id.
    pub fn create_room_with(&self, token: &str, body: &Value) -> String {
        let answer = self.post(token, "/_matrix/client/v3/createRoom", body);
        answer["room_id"]
            .as_str()
            .unwrap_or_else(|| panic!("createRoom answered {answer}"))
            .to_owned()
    }

    /// Joins a room (by id or alias).
    pub fn join_room(&self, token: &str, room: &str) {
        self.post(
            token,
            &format!("/_matrix/client/v3/join/{}", segment(room)),
            &json!({}),
        );
    }

    /// Sends any event; its event id.
    pub fn send_event(&self, token: &str, room: &str, event_type: &str, content: &Value) -> String {
        let path = format!(
            "/_matrix/client/v3/rooms/{}/send/{}/{}",
            segment(room),
            segment(event_type),
            segment(&self.txn_id())
        );
        let answer = self.put(token, &path, content);
        answer["event_id"]
            .as_str()
            .unwrap_or_else(|| panic!("send answered {answer}"))
            .to_owned()
    }

    /// Sends an `m.text` message; its event id.
    pub fn send_message(&self, token: &str, room: &str, body: &str) -> String {
        self.send_event(
            token,
            room,
            "m.room.message",
            &json!({"msgtype": "m.text", "body": body}),
        )
    }

    /// Starts (30 s timeout) or stops typing.
    pub fn set_typing(&self, token: &str, room: &str, user: &str, typing: bool) {
        let body = if typing {
            json!({"typing": true, "timeout": 30000})
        } else {
            json!({"typing": false})
        };
        self.put(
            token,
            &format!(
                "/_matrix/client/v3/rooms/{}/typing/{}",
                segment(room),
                segment(user)
            ),
            &body,
        );
    }

    /// Sends an `m.read` receipt for an event.
    pub fn send_receipt(&self, token: &str, room: &str, event: &str) {
        self.post(
            token,
            &format!(
                "/_matrix/client/v3/rooms/{}/receipt/m.read/{}",
                segment(room),
                segment(event)
            ),
            &json!({}),
        );
    }

    /// Sets presence (`online`, `unavailable`, `offline`).
    pub fn set_presence(&self, token: &str, user: &str, state: &str, status_msg: Option<&str>) {
        let mut body = json!({"presence": state});
        if let Some(status_msg) = status_msg {
            body["status_msg"] = json!(status_msg);
        }
        self.put(
            token,
            &format!("/_matrix/client/v3/presence/{}/status", segment(user)),
            &body,
        );
    }

    /// A user's presence as the client API reports it.
    pub fn get_presence(&self, token: &str, user: &str) -> Value {
        self.get(
            token,
            &format!("/_matrix/client/v3/presence/{}/status", segment(user)),
        )
    }

    /// Sets global account data of type `kind`.
    pub fn put_account_data(&self, token: &str, user: &str, kind: &str, content: &Value) {
        self.put(
            token,
            &format!(
                "/_matrix/client/v3/user/{}/account_data/{}",
                segment(user),
                segment(kind)
            ),
            content,
        );
    }

    /// Global account data of type `kind`.
    pub fn get_account_data(&self, token: &str, user: &str, kind: &str) -> Value {
        self.get(
            token,
            &format!(
                "/_matrix/client/v3/user/{}/account_data/{}",
                segment(user),
                segment(kind)
            ),
        )
    }

    /// The latest events of a room, newest first (`/messages?dir=b`).
    pub fn messages(&self, token: &str, room: &str, limit: u32) -> Value {
        self.get(
            token,
            &format!(
                "/_matrix/client/v3/rooms/{}/messages?dir=b&limit={limit}",
                segment(room)
            ),
        )
    }

    /// `/sync` (no wait); `since` from a previous `next_batch`.
    pub fn sync(&self, token: &str, since: Option<&str>) -> Value {
        let path = match since {
            Some(since) => format!("/_matrix/client/v3/sync?timeout=0&since={}", segment(since)),
            None => "/_matrix/client/v3/sync?timeout=0".to_owned(),
        };
        self.get(token, &path)
    }

    /// Synapse's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log)
            .unwrap_or_else(|error| panic!("reading {}: {error}", self.log.display()))
    }

    /// The log lines at level ERROR or CRITICAL (with any traceback lines
    /// that follow them).
    pub fn log_errors(&self) -> Vec<String> {
        let mut errors = Vec::new();
        let mut in_error = false;
        for line in self.log_text().lines() {
            let is_record = line.len() > 23 && line.as_bytes()[4] == b'-' && line.contains(" - ");
            if is_record {
                in_error = line.contains(" - ERROR - ") || line.contains(" - CRITICAL - ");
            }
            if in_error {
                errors.push(line.to_owned());
            }
        }
        errors
    }

    /// Panics, quoting them, if the log holds ERROR or CRITICAL lines.
    pub fn assert_no_errors_logged(&self) {
        let errors = self.log_errors();
        assert!(
            errors.is_empty(),
            "Synapse logged errors ({}):\n{}",
            self.log.display(),
            errors.join("\n")
        );
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn rig_command(&self, subcommand: &str) -> Command {
        let mut command = Command::new(&self.python);
        command
            .arg(rig_script())
            .arg(subcommand)
            .arg("--dir")
            .arg(&self.dir)
            .stdin(Stdio::null());
        command
    }

    /// Stops Synapse and Redis (also done on drop).
    pub fn stop(&self) {
        match self.rig_command("stop").output() {
            Ok(output) if output.status.success() => {}
            Ok(output) => eprintln!(
                "rig.py stop failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ),
            Err(error) => eprintln!("running rig.py stop: {error}"),
        }
    }
}

impl Drop for SynapseRig {
    fn drop(&mut self) {
        self.stop();
        let keep = std::env::var_os("SYNAPSE_RIG_KEEP").is_some();
        if std::thread::panicking() {
            eprintln!(
                "Synapse rig directory kept: {}\n--- last lines of {} ---\n{}",
                self.dir.display(),
                self.log.display(),
                self.log_tail(40)
            );
        } else if keep {
            eprintln!("Synapse rig directory kept: {}", self.dir.display());
        } else {
            remove_dir(&self.dir);
        }
    }
}

fn remove_dir(dir: &Path) {
    if let Err(error) = std::fs::remove_dir_all(dir) {
        eprintln!("removing {}: {error}", dir.display());
    }
}

// ---------------------------------------------------------------------
// A multi-writer deployment: main, event persisters and a typing writer
// on PostgreSQL (`tests/synapse/deployment.py`).
// ---------------------------------------------------------------------

fn deployment_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/synapse/deployment.py")
}

/// Runs `command` (stdin from `input`), which must succeed and print one
/// line of JSON: that JSON.
fn json_output(what: &str, mut command: Command, input: Option<&[u8]>) -> Value {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("{what}: {error}"));
    {
        let mut stdin = child.stdin.take().expect("piped stdin");
        if let Some(input) = input {
            stdin
                .write_all(input)
                .unwrap_or_else(|error| panic!("{what}: writing stdin: {error}"));
        }
    }
    let output = child
        .wait_with_output()
        .unwrap_or_else(|error| panic!("{what}: {error}"));
    assert!(
        output.status.success(),
        "{what} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .last()
        .and_then(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| panic!("{what} printed no JSON line: {stdout}"))
}

/// One process of a [`SynapseDeployment`].
#[derive(Clone, Debug)]
pub struct DeploymentInstance {
    /// Its instance name (`main`, `persister1`, ...).
    pub name: String,
    /// `http://127.0.0.1:<port>`: its client-server API listener.
    pub client_url: String,
    /// Its HTTP replication listener (its `instance_map` entry).
    pub replication_port: u16,
    /// Its log (INFO).
    pub log: PathBuf,
    /// Its pid.
    pub pid: u32,
}

/// A running multi-writer Synapse deployment: main, `persister1..N`
/// (`stream_writers.events`), `worker1` (`stream_writers.typing`), on a
/// PostgreSQL database of its own, replicating over a redis-server of its
/// own. Stopped (and its database dropped) on drop; a watchdog does the same
/// if the test process dies.
#[derive(Debug)]
pub struct SynapseDeployment {
    /// The server name, also the Redis channel prefix (`dep.test`).
    pub server_name: String,
    /// The deployment's redis-server (restarted on the same port by
    /// [`SynapseDeployment::restart_redis`]).
    pub redis_port: u16,
    /// `worker_replication_secret`.
    pub secret: String,
    /// The PostgreSQL database.
    pub database: String,
    /// homeserver.yaml, as JSON (what `StreamWriters::from_value` reads).
    pub config: Value,
    /// Every process, by instance name.
    pub instances: BTreeMap<String, DeploymentInstance>,
    /// The deployment's directory: configs, logs.
    pub dir: PathBuf,
    /// How long `deployment.py start` took, everything ready and
    /// subscribed to Redis.
    pub startup: Duration,
    /// The JSON line `deployment.py start` printed.
    pub info: Value,
    python: PathBuf,
}

impl SynapseDeployment {
    /// Starts main, `persisters` event persisters and a typing writer.
    pub fn start(persisters: usize) -> SynapseDeployment {
        SynapseDeployment::start_with(persisters, &json!({}))
    }

    /// [`start`](Self::start), with `extra` merged into homeserver.yaml
    /// (another process in `instance_map` and `stream_writers`, say: one
    /// the test starts itself, once the deployment's database is ready).
    pub fn start_with(persisters: usize, extra: &Value) -> SynapseDeployment {
        let python = synapse_python();
        let persisters = persisters.to_string();
        let extra = extra.to_string();
        let (info, startup) = start_script(
            &python,
            &deployment_script(),
            "synapse-dep",
            &["--persisters", &persisters, "--config-json", &extra],
        );
        let text = |value: &Value, key: &str| -> String {
            value[key]
                .as_str()
                .unwrap_or_else(|| panic!("deployment JSON without string {key:?}: {value}"))
                .to_owned()
        };
        let number = |value: &Value, key: &str| -> u64 {
            value[key]
                .as_u64()
                .unwrap_or_else(|| panic!("deployment JSON without number {key:?}: {value}"))
        };
        let port = |value: &Value, key: &str| -> u16 {
            u16::try_from(number(value, key)).unwrap_or_else(|_| panic!("{key}: not a port"))
        };
        let instances = info["instances"]
            .as_object()
            .unwrap_or_else(|| panic!("deployment JSON without instances: {info}"))
            .iter()
            .map(|(name, instance)| {
                (
                    name.clone(),
                    DeploymentInstance {
                        name: name.clone(),
                        client_url: text(instance, "client_url"),
                        replication_port: port(instance, "replication_port"),
                        log: PathBuf::from(text(instance, "log")),
                        pid: u32::try_from(number(instance, "pid")).expect("a pid"),
                    },
                )
            })
            .collect();
        SynapseDeployment {
            server_name: text(&info, "server_name"),
            redis_port: port(&info, "redis_port"),
            secret: text(&info, "secret"),
            database: text(&info, "database"),
            config: info["config"].clone(),
            instances,
            dir: PathBuf::from(text(&info, "dir")),
            startup,
            info,
            python,
        }
    }

    fn script(&self, subcommand: &str) -> Command {
        let mut command = Command::new(&self.python);
        command
            .arg(deployment_script())
            .arg(subcommand)
            .arg("--dir")
            .arg(&self.dir);
        command
    }

    /// One process by name; panics if there is none.
    pub fn instance(&self, name: &str) -> &DeploymentInstance {
        self.instances
            .get(name)
            .unwrap_or_else(|| panic!("no instance {name} in the deployment"))
    }

    /// The event persisters' names (`persister1`, ...).
    pub fn persisters(&self) -> Vec<String> {
        self.instances
            .keys()
            .filter(|name| name.starts_with("persister"))
            .cloned()
            .collect()
    }

    /// The full user id of a localpart on this server.
    pub fn user_id(&self, localpart: &str) -> String {
        format!("@{localpart}:{}", self.server_name)
    }

    /// Registers `user` (localpart) on main; its access token.
    pub fn register(&self, user: &str, password: &str) -> String {
        let mut command = self.script("register");
        command.args([user, password]);
        let answer = json_output(&format!("registering {user}"), command, None);
        answer["access_token"]
            .as_str()
            .unwrap_or_else(|| panic!("no access_token in {answer}"))
            .to_owned()
    }

    /// A request for [`SynapseDeployment::requests`].
    pub fn request_json(
        method: &str,
        url: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> Value {
        let mut request = json!({"method": method, "url": url});
        if let Some(token) = token {
            request["token"] = json!(token);
        }
        if let Some(body) = body {
            request["body"] = body.clone();
        }
        request
    }

    /// Runs HTTP requests (made by [`SynapseDeployment::request_json`], or
    /// the `*_request` methods; `"timeout"` may be set, in seconds) on
    /// `threads` threads of one Python process; `(status, JSON answer)` of
    /// each, in order (status 0: no answer, the body says why).
    pub fn requests(&self, requests: &[Value], threads: usize) -> Vec<(u16, Value)> {
        let mut command = self.script("requests");
        command.args(["--threads", &threads.to_string()]);
        let input = Value::Array(requests.to_vec()).to_string();
        let answer = json_output("deployment.py requests", command, Some(input.as_bytes()));
        answer
            .as_array()
            .unwrap_or_else(|| panic!("requests answered {answer}"))
            .iter()
            .map(|result| {
                let status = result["status"]
                    .as_u64()
                    .and_then(|status| u16::try_from(status).ok())
                    .unwrap_or_else(|| panic!("no status in {result}"));
                (status, result["body"].clone())
            })
            .collect()
    }

    /// One request that must succeed (2xx): its JSON answer.
    pub fn call(&self, method: &str, url: &str, token: &str, body: Option<&Value>) -> Value {
        let request = SynapseDeployment::request_json(method, url, Some(token), body);
        let (status, answer) = self.requests(&[request], 1).remove(0);
        assert!(
            (200..300).contains(&status),
            "{method} {url} answered {status}: {answer}"
        );
        answer
    }

    /// Creates a public room through main; its room id.
    pub fn create_room(&self, token: &str) -> String {
        let url = format!(
            "{}/_matrix/client/v3/createRoom",
            self.instance("main").client_url
        );
        let answer = self.call("POST", &url, token, Some(&json!({"preset": "public_chat"})));
        answer["room_id"]
            .as_str()
            .unwrap_or_else(|| panic!("createRoom answered {answer}"))
            .to_owned()
    }

    /// The request that sends an `m.text` message to `room` through the
    /// client listener of `instance`.
    pub fn message_request(&self, instance: &str, token: &str, room: &str, body: &str) -> Value {
        let url = format!(
            "{}/_matrix/client/v3/rooms/{}/send/m.room.message/{}",
            self.instance(instance).client_url,
            segment(room),
            segment(&format!(
                "dep{}-{}",
                std::process::id(),
                TXNS.fetch_add(1, Ordering::Relaxed)
            ))
        );
        SynapseDeployment::request_json(
            "PUT",
            &url,
            Some(token),
            Some(&json!({"msgtype": "m.text", "body": body})),
        )
    }

    /// The request that sets a state event of `room` through the client
    /// listener of `instance`.
    pub fn state_request(
        &self,
        instance: &str,
        token: &str,
        room: &str,
        (event_type, state_key): (&str, &str),
        content: &Value,
    ) -> Value {
        let url = format!(
            "{}/_matrix/client/v3/rooms/{}/state/{}/{}",
            self.instance(instance).client_url,
            segment(room),
            segment(event_type),
            segment(state_key)
        );
        SynapseDeployment::request_json("PUT", &url, Some(token), Some(content))
    }

    /// The request that starts (30 s) or stops `user` typing in `room`,
    /// through the typing writer (`worker1`), the only process that serves
    /// it.
    pub fn typing_request(&self, token: &str, room: &str, user: &str, typing: bool) -> Value {
        let url = format!(
            "{}/_matrix/client/v3/rooms/{}/typing/{}",
            self.instance("worker1").client_url,
            segment(room),
            segment(user)
        );
        let body = if typing {
            json!({"typing": true, "timeout": 30000})
        } else {
            json!({"typing": false})
        };
        SynapseDeployment::request_json("PUT", &url, Some(token), Some(&body))
    }

    /// Restarts one Synapse process (SIGTERM, then started again on the
    /// same configuration); returns once it answers `/health` and is
    /// subscribed to Redis. Its answer: `pid` (the new one: the
    /// instance's [`DeploymentInstance::pid`] stays the first), `seconds`.
    pub fn restart(&self, instance: &str) -> Value {
        let mut command = self.script("restart");
        command.args(["--instance", instance]);
        json_output(&format!("deployment.py restart {instance}"), command, None)
    }

    /// Kills redis-server and starts a new one on the same port; returns
    /// once every Synapse process has subscribed again. Its answer:
    /// `down_seconds`, `resubscribed_seconds`.
    pub fn restart_redis(&self) -> Value {
        json_output(
            "deployment.py redis-restart",
            self.script("redis-restart"),
            None,
        )
    }

    /// Redis' `CLIENT LIST`, each client with `instance`: the Synapse
    /// process that owns it (or null).
    pub fn redis_clients(&self) -> Vec<Value> {
        let answer = json_output(
            "deployment.py redis-clients",
            self.script("redis-clients"),
            None,
        );
        answer.as_array().cloned().unwrap_or_default()
    }

    /// `CLIENT KILL`s every Redis client whose name starts with `prefix`;
    /// the addresses killed.
    pub fn kill_redis_clients_named(&self, prefix: &str) -> Vec<String> {
        let mut command = self.script("redis-kill");
        command.args(["--name-prefix", prefix]);
        let answer = json_output("deployment.py redis-kill", command, None);
        strings(&answer["killed"])
    }

    /// A writer blip: `CLIENT KILL`s every Redis connection of `instance`,
    /// and runs `requests` on `threads` threads meanwhile, until `after`
    /// once `instance` is back (or the requests run out). A request may
    /// carry a `timeout` (seconds, status 0 when it passes). Its answer:
    /// `killed`, `reconnected_after` (seconds), `results` (`status`,
    /// `body`, `before_reconnect`) of the requests made.
    pub fn blip(
        &self,
        instance: &str,
        requests: &[Value],
        threads: usize,
        after: Duration,
    ) -> Value {
        let mut command = self.script("blip");
        command.args([
            "--instance",
            instance,
            "--threads",
            &threads.to_string(),
            "--after",
            &after.as_secs_f64().to_string(),
        ]);
        let input = Value::Array(requests.to_vec()).to_string();
        json_output("deployment.py blip", command, Some(input.as_bytes()))
    }

    /// Runs one SQL query on the deployment's database; its rows.
    pub fn sql(&self, query: &str) -> Vec<Vec<Value>> {
        let mut command = self.script("sql");
        command.arg(query);
        let answer = json_output(&format!("SQL {query}"), command, None);
        answer
            .as_array()
            .unwrap_or_else(|| panic!("{query}: {answer}"))
            .iter()
            .map(|row| row.as_array().cloned().unwrap_or_default())
            .collect()
    }

    /// The ERROR and CRITICAL lines (with their tracebacks) of one
    /// process's log.
    pub fn log_errors(&self, instance: &str) -> Vec<String> {
        let text = std::fs::read_to_string(&self.instance(instance).log).unwrap_or_default();
        let mut errors = Vec::new();
        let mut in_error = false;
        for line in text.lines() {
            let is_record = line.len() > 23 && line.as_bytes()[4] == b'-' && line.contains(" - ");
            if is_record {
                in_error = line.contains(" - ERROR - ") || line.contains(" - CRITICAL - ");
            }
            if in_error {
                errors.push(line.to_owned());
            }
        }
        errors
    }

    /// The last `lines` lines of one process's log.
    pub fn log_tail(&self, instance: &str, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.instance(instance).log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Stops every process and drops the database (also done on drop).
    pub fn stop(&self) {
        match self.script("stop").stdin(Stdio::null()).output() {
            Ok(output) if output.status.success() => {}
            Ok(output) => eprintln!(
                "deployment.py stop failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ),
            Err(error) => eprintln!("running deployment.py stop: {error}"),
        }
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

impl Drop for SynapseDeployment {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("Synapse deployment directory kept: {}", self.dir.display());
            for name in self.instances.keys() {
                eprintln!(
                    "--- last lines of {name}'s log ---\n{}",
                    self.log_tail(name, 15)
                );
            }
        } else if std::env::var_os("SYNAPSE_RIG_KEEP").is_some() {
            eprintln!("Synapse deployment directory kept: {}", self.dir.display());
        } else {
            remove_dir(&self.dir);
        }
    }
}
