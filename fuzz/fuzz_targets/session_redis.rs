//! libFuzzer's entry point; the checks are `synapse_replication_fuzz::session_redis`,
//! which the stable replay of `corpus/session_redis/` runs too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| synapse_replication_fuzz::session_redis::check(data));
