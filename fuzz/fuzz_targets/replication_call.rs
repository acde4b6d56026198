//! libFuzzer's entry point; the checks are `synapse_replication_fuzz::replication_call`,
//! which the stable replay of `corpus/replication_call/` runs too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| synapse_replication_fuzz::replication_call::check(data));
