//! libFuzzer's entry point; the checks are `synapse_replication_fuzz::roundtrip_line`,
//! which the stable replay of `corpus/roundtrip_line/` runs too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| synapse_replication_fuzz::roundtrip_line::check(data));
