//! libFuzzer's entry point; the checks are `synapse_replication_fuzz::resp_decode`,
//! which the stable replay of `corpus/resp_decode/` runs too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| synapse_replication_fuzz::resp_decode::check(data));
