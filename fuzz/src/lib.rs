//! The fuzz targets' checks, one module per target, each a
//! `check(data: &[u8])` that panics where a property fails.
//!
//! `fuzz_targets/<target>.rs` hands libFuzzer's inputs to
//! `<target>::check` (nightly and cargo-fuzz); the tests below replay every
//! file of `corpus/<target>/` through the same function on stable, so that
//! no machine runs zero fuzz inputs (`cargo test` in `fuzz/`).

pub mod decode_line;
pub mod decode_row;
pub mod follower;
pub mod replication_call;
pub mod resp_decode;
pub mod roundtrip_line;
pub mod session_redis;
pub mod session_tcp;

/// A target: its name (the name of its corpus directory), and its checks.
pub type Target = (&'static str, fn(&[u8]));

/// The checks of every target, by name.
pub const TARGETS: [Target; 8] = [
    ("decode_line", decode_line::check),
    ("decode_row", decode_row::check),
    ("follower", follower::check),
    ("replication_call", replication_call::check),
    ("resp_decode", resp_decode::check),
    ("roundtrip_line", roundtrip_line::check),
    ("session_redis", session_redis::check),
    ("session_tcp", session_tcp::check),
];

#[cfg(test)]
mod replay {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::path::{Path, PathBuf};

    /// Runs every file of `corpus/<target>/` through `check`; fails if the
    /// directory holds no input, or if any input fails a check (naming them
    /// all, after running them all).
    fn replay(target: &str) {
        let check = super::TARGETS
            .iter()
            .find(|(name, _)| *name == target)
            .map(|(_, check)| *check)
            .expect("a known target");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .join(target);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.expect("a readable directory").path())
            .filter(|path| path.is_file())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no inputs in {}", dir.display());
        let mut failed = Vec::new();
        for path in &files {
            let data = std::fs::read(path).expect("a readable input");
            if catch_unwind(AssertUnwindSafe(|| check(&data))).is_err() {
                failed.push(path.display().to_string());
            }
        }
        assert!(
            failed.is_empty(),
            "{target}: {} of {} inputs failed a check: {failed:#?}",
            failed.len(),
            files.len()
        );
        eprintln!("{target}: {} inputs replayed", files.len());
    }

    #[test]
    fn decode_line() {
        replay("decode_line");
    }

    #[test]
    fn decode_row() {
        replay("decode_row");
    }

    #[test]
    fn follower() {
        replay("follower");
    }

    #[test]
    fn replication_call() {
        replay("replication_call");
    }

    #[test]
    fn resp_decode() {
        replay("resp_decode");
    }

    #[test]
    fn roundtrip_line() {
        replay("roundtrip_line");
    }

    #[test]
    fn session_redis() {
        replay("session_redis");
    }

    #[test]
    fn session_tcp() {
        replay("session_tcp");
    }

    /// Every target has a test above and a corpus directory.
    #[test]
    fn every_target_has_a_corpus() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        for (name, _) in super::TARGETS {
            assert!(root.join("corpus").join(name).is_dir(), "corpus/{name}");
            assert!(
                root.join("fuzz_targets")
                    .join(format!("{name}.rs"))
                    .is_file(),
                "fuzz_targets/{name}.rs"
            );
        }
        for entry in std::fs::read_dir(root.join("fuzz_targets")).expect("fuzz_targets/") {
            let path = entry.expect("a readable directory").path();
            let name = path.file_stem().and_then(|n| n.to_str()).unwrap_or("");
            assert!(
                super::TARGETS.iter().any(|(known, _)| *known == name),
                "{} is not replayed",
                path.display()
            );
        }
    }
}
