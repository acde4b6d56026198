//! Helpers shared by the integration tests.

#![allow(dead_code)]

#[cfg(unix)]
pub mod faults;
pub mod federation;
#[cfg(unix)]
pub mod nodes;
pub mod pair;
pub mod proxy;
#[cfg(unix)]
pub mod redis_server;
pub mod redis_session;
pub mod synapse;
pub mod transcripts;

use std::path::PathBuf;

use serde_json::Value;

/// Reads a JSON-lines vectors file from `tests/vectors/`, failing loudly if
/// it is missing or empty: a test with no vectors must not pass.
pub fn vectors(file: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/vectors")
        .join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
    let vectors: Vec<Value> = text
        .lines()
        .enumerate()
        .map(|(index, line)| {
            serde_json::from_str(line)
                .unwrap_or_else(|error| panic!("{file}:{}: {error}", index + 1))
        })
        .collect();
    assert!(!vectors.is_empty(), "{file} holds no vectors");
    vectors
}

/// A vector's string field.
pub fn text<'a>(vector: &'a Value, key: &str) -> &'a str {
    vector[key]
        .as_str()
        .unwrap_or_else(|| panic!("vector without string {key:?}: {vector}"))
}
