//! Decodes arbitrary bytes as a line: never panics, and the JSON recogniser
//! used for rows agrees with serde_json on every input.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use synapse_replication::wire::{Command, json};

fuzz_target!(|data: &[u8]| {
    let _ = Command::decode(Bytes::copy_from_slice(data));

    let ours = json::validate(data).is_ok();
    let oracle = std::str::from_utf8(data).is_ok()
        && !data.contains(&b'\n')
        && serde_json::from_slice::<serde::de::IgnoredAny>(data).is_ok();
    // The one deliberate difference: integers Python refuses to read.
    let long_integer = data
        .split(|b| !b.is_ascii_digit())
        .any(|run| run.len() > 4300);
    if !long_integer {
        assert_eq!(
            ours, oracle,
            "recogniser and serde_json disagree on {data:?}"
        );
    }
});
