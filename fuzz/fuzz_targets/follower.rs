//! libFuzzer's entry point; the checks are `synapse_replication_fuzz::follower`,
//! which the stable replay of `corpus/follower/` runs too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| synapse_replication_fuzz::follower::check(data));
