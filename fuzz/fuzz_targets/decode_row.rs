//! libFuzzer's entry point; the checks are `synapse_replication_fuzz::decode_row`,
//! which the stable replay of `corpus/decode_row/` runs too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| synapse_replication_fuzz::decode_row::check(data));
