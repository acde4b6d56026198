//! `cargo run --example demo`, as a reader of the README runs it: over
//! Redis (with `redis-server` on `PATH`), over direct TCP
//! (`SYNAPSE_REPLICATION_DEMO_TRANSPORT=tcp`), and on a machine without
//! `redis-server` (`PATH` without it: the demo falls back to TCP). Each run
//! must exit with status 0 after its last line says that both followers
//! hold exactly the writer's rows.
//!
//! The example is built by the cargo running the tests, with the features
//! and profile the tests were built with, into the same target directory
//! (so nothing is rebuilt), then run directly.
//!
//! Needs `redis-server` on PATH (`apt-get install redis-server`); without
//! it the Redis test fails, it does not skip.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

const TRANSPORT_VAR: &str = "SYNAPSE_REPLICATION_DEMO_TRANSPORT";
const LAST_LINE: &str = "both followers hold exactly the writer's rows, in order, each once";
/// The demo takes about a second; this is for a loaded machine.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// The demo's executable, built once for all the tests.
fn demo() -> &'static Path {
    static DEMO: OnceLock<PathBuf> = OnceLock::new();
    DEMO.get_or_init(build_demo)
}

fn build_demo() -> PathBuf {
    // The features this test was built with (the demo's own dev-dependency
    // adds `runtime-smol`), so that the library is not built again.
    let features: Vec<&str> = [
        ("runtime-smol", cfg!(feature = "runtime-smol")),
        ("runtime-tokio", cfg!(feature = "runtime-tokio")),
        ("http-catch-up", cfg!(feature = "http-catch-up")),
        ("tls", cfg!(feature = "tls")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect();
    let mut cargo = Command::new(env!("CARGO"));
    // Without the variables cargo set for this test (`CARGO_PKG_NAME`...):
    // build scripts that watch them (ring's) would run again, and the
    // next `cargo test` would rebuild their crates once more.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let set_for_tests = name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_MANIFEST_")
            || matches!(
                &*name,
                "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "CARGO_RUSTC_CURRENT_DIR"
                    | "OUT_DIR"
            );
        if set_for_tests {
            cargo.env_remove(&*name);
        }
    }
    cargo
        .args(["build", "--example", "demo", "--message-format=json"])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .stderr(Stdio::inherit());
    if !features.is_empty() {
        cargo.arg("--features").arg(features.join(","));
    }
    if !cfg!(debug_assertions) {
        cargo.arg("--release");
    }
    if let Some(target_dir) = target_dir() {
        cargo.arg("--target-dir").arg(target_dir);
    }
    let output = cargo.output().expect("running cargo");
    assert!(
        output.status.success(),
        "cargo build --example demo failed ({})",
        output.status
    );
    // The executable, as cargo reports it.
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| {
            message["reason"] == "compiler-artifact" && message["target"]["name"] == "demo"
        })
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .expect("cargo reports the demo's executable")
}

/// The target directory this test runs from (`<target>/<profile>/deps/`),
/// if it looks like one.
fn target_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?.parent()?.parent()?;
    dir.join("CACHEDIR.TAG").exists().then(|| dir.to_owned())
}

/// Runs the demo with `configure`'s environment; returns its output.
fn run_demo(configure: impl FnOnce(&mut Command)) -> String {
    let mut command = Command::new(demo());
    command
        .env_remove(TRANSPORT_VAR)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    configure(&mut command);
    let mut child = command.spawn().expect("starting the demo");
    let read = |mut pipe: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("stdout")));
    let stderr = read(Box::new(child.stderr.take().expect("stderr")));
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the demo") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    let stdout = stdout.join().expect("stdout reader");
    let stderr = stderr.join().expect("stderr reader");
    let report = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    match status {
        None => panic!("the demo did not end within {RUN_TIMEOUT:?}\n{report}"),
        Some(status) => assert!(status.success(), "the demo failed ({status})\n{report}"),
    }
    assert_eq!(stdout.lines().last(), Some(LAST_LINE), "{report}");
    // About twenty lines; a loaded machine adds up to two a stream and a
    // worker, where a REPLICATE heard just before makes the next row a
    // catch-up (fetched, and said so).
    let lines = stdout.lines().count();
    assert!((15..=33).contains(&lines), "{lines} lines\n{report}");
    stdout
}

#[test]
fn demo_over_redis() {
    match Command::new("redis-server").arg("--version").output() {
        Ok(output) if output.status.success() => {}
        Ok(output) => panic!("redis-server --version failed: {output:?}"),
        Err(error) => panic!(
            "redis-server is not usable ({error}): install it (e.g. `apt-get install \
             redis-server`) to run tests/demo.rs"
        ),
    }
    let stdout = run_demo(|_| {});
    let first = stdout.lines().next().unwrap_or_default();
    assert!(first.starts_with("transport: Redis pub/sub"), "{stdout}");
    assert!(stdout.contains("CLIENT KILL ID"), "{stdout}");
    assert!(
        stdout.contains("fetching (10, 20] from master's log"),
        "{stdout}"
    );
    assert!(
        stdout.contains("caught up 10 caches rows, now at 20"),
        "{stdout}"
    );

    // Its redis-server is gone.
    let port = first
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|port| port.parse::<u16>().ok())
        .expect("the transport line names the port");
    assert_ne!(port, 6379);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the demo's redis-server still listens on {port}"
    );
}

#[test]
fn demo_over_tcp() {
    let stdout = run_demo(|command| {
        command.env(TRANSPORT_VAR, "tcp");
    });
    assert!(
        stdout.starts_with(
            "transport: direct TCP on loopback (SYNAPSE_REPLICATION_DEMO_TRANSPORT=tcp)"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("master's server closed its connection"),
        "{stdout}"
    );
    assert!(
        stdout.contains("fetching (10, 20] from master's log"),
        "{stdout}"
    );
}

/// A fresh machine: no redis-server anywhere on PATH.
#[test]
fn demo_without_redis_server() {
    let empty = std::env::temp_dir().join(format!("demo-empty-path-{}", std::process::id()));
    std::fs::create_dir_all(&empty).expect("an empty directory");
    let stdout = run_demo(|command| {
        command.env("PATH", &empty);
    });
    let _ = std::fs::remove_dir(&empty);
    assert!(
        stdout.starts_with("transport: direct TCP on loopback (redis-server is not on PATH)"),
        "{stdout}"
    );
}
