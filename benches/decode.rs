//! Decoding benchmarks (filled in below).
fn main() {}
