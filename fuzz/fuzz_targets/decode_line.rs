//! libFuzzer's entry point; the checks are `synapse_replication_fuzz::decode_line`,
//! which the stable replay of `corpus/decode_line/` runs too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| synapse_replication_fuzz::decode_line::check(data));
