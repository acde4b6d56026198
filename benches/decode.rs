//! Lines decoded per second: the crate's decoder against a naive baseline.
//!
//! `cargo bench --bench decode`
//!
//! The mix is what a busy deployment sends: mostly RDATA for events, caches,
//! receipts and typing (100-400 bytes), some batches, POSITIONs and PINGs.
//! Lines are slices of one shared buffer, as a transport hands them over.

use bytes::Bytes;
use divan::counter::{BytesCount, ItemsCount};
use divan::{Bencher, black_box};
use synapse_replication::wire::Command;

fn main() {
    divan::main();
}

const MIX: &[&str] = &[
    r#"RDATA events event_persister1 4183921 ["ev",["$9lUlKX4q1T0CMy0tPQbWuzMJH3AeiRLw0mBzb8Z0pkA","!OGEhHVWSdvArJzumhm:matrix.org","m.room.message",null,null,null,null,false,false]]"#,
    r#"RDATA events event_persister1 4183922 ["ev",["$dGhpcyBpcyBhIHN0YXRlIGV2ZW50IGlk","!OGEhHVWSdvArJzumhm:matrix.org","m.room.member","@alice:example.com",null,null,"join",false,false]]"#,
    r#"RDATA events event_persister2 batch ["state",["!OGEhHVWSdvArJzumhm:matrix.org","m.room.member","@alice:example.com","$dGhpcyBpcyBhIHN0YXRlIGV2ZW50IGlk"]]"#,
    r#"RDATA events event_persister2 4183923 ["ev",["$cmVhY3Rpb24gZXZlbnQgaWQgaGVyZQ","!OGEhHVWSdvArJzumhm:matrix.org","m.reaction",null,null,{"rel_type":"m.annotation","event_id":"$9lUlKX4q1T0CMy0tPQbWuzMJH3AeiRLw0mBzb8Z0pkA"},null,false,false]]"#,
    r#"RDATA caches master 91283 ["get_partial_state_servers_at_join",["!OGEhHVWSdvArJzumhm:matrix.org"],1732900000000]"#,
    r#"RDATA caches synchrotron1 91284 ["get_e2e_unused_fallback_key_types",["@alice:example.com","ABCDEFGHIJ"],1732900000123]"#,
    r#"RDATA caches master 91285 ["cs_cache_fake",["!OGEhHVWSdvArJzumhm:matrix.org","[\"m.room.member\", \"@alice:example.com\"]"],1732900000456]"#,
    r#"RDATA caches master 91286 ["get_user_by_id",null,1732900000789]"#,
    r#"RDATA receipts master 55123 ["!OGEhHVWSdvArJzumhm:matrix.org","m.read","@bob:example.com",["$9lUlKX4q1T0CMy0tPQbWuzMJH3AeiRLw0mBzb8Z0pkA"],null,{"ts":1732900000000}]"#,
    r#"RDATA typing master 771 ["!OGEhHVWSdvArJzumhm:matrix.org",["@alice:example.com","@bob:example.com","@carol:example.com"]]"#,
    r#"RDATA presence master 660123 ["@bob:example.com","online",1732900000000,1732899990000,1732899980000,1732900000000,"In a meeting until 3pm \u2014 ping me later",true]"#,
    r#"RDATA to_device master 88231 ["@alice:example.com"]"#,
    r#"RDATA device_lists master 99812 [99812,"@alice:example.com",false]"#,
    r#"RDATA account_data master 5521 ["@alice:example.com",null,"m.push_rules"]"#,
    "POSITION caches master 91280 91286",
    "POSITION events event_persister1 4183919 4183921",
    "PING 1732900000000",
    r#"RDATA federation master 3321 [{"type":"m.typing","content":{"room_id":"!OGEhHVWSdvArJzumhm:matrix.org","user_id":"@alice:example.com","typing":true}}]"#,
];

/// The mix as slices of one reference-counted buffer, repeated.
fn lines() -> Vec<Bytes> {
    let joined: String = MIX.iter().map(|line| format!("{line}\n")).collect();
    let buffer = Bytes::from(joined.repeat(64).into_bytes());
    let mut out = Vec::new();
    let mut start = 0;
    while let Some(end) = buffer[start..].iter().position(|b| *b == b'\n') {
        out.push(buffer.slice(start..start + end));
        start += end + 1;
    }
    out
}

fn total_bytes(lines: &[Bytes]) -> usize {
    lines.iter().map(Bytes::len).sum()
}

/// The crate's decoder, JSON validation included.
#[divan::bench]
fn crate_decoder(bencher: Bencher) {
    let lines = lines();
    bencher
        .counter(ItemsCount::new(lines.len()))
        .counter(BytesCount::new(total_bytes(&lines)))
        .bench_local(|| {
            for line in &lines {
                let _ = black_box(Command::decode(black_box(line.clone())));
            }
        });
}

/// The naive baseline: split on spaces, parse the row into a `Value`.
#[divan::bench]
fn naive_baseline(bencher: Bencher) {
    let lines = lines();
    bencher
        .counter(ItemsCount::new(lines.len()))
        .counter(BytesCount::new(total_bytes(&lines)))
        .bench_local(|| {
            for line in &lines {
                black_box(naive(black_box(line)));
            }
        });
}

fn naive(line: &[u8]) -> Option<(Vec<String>, Option<serde_json::Value>)> {
    let text = std::str::from_utf8(line).ok()?;
    let (name, rest) = text.split_once(' ').unwrap_or((text, ""));
    if name == "RDATA" {
        let parts: Vec<&str> = rest.splitn(4, ' ').collect();
        let row = serde_json::from_slice(parts.get(3)?.as_bytes()).ok()?;
        let fields = parts[..3].iter().map(|part| part.to_string()).collect();
        Some((fields, Some(row)))
    } else {
        Some((rest.split(' ').map(str::to_string).collect(), None))
    }
}

/// The floor: finding the newlines in the same bytes.
#[divan::bench]
fn newline_scan(bencher: Bencher) {
    let joined: Vec<u8> = lines()
        .iter()
        .flat_map(|l| [&l[..], b"\n"].concat())
        .collect();
    let count = joined.iter().filter(|b| **b == b'\n').count();
    bencher
        .counter(ItemsCount::new(count))
        .counter(BytesCount::new(joined.len()))
        .bench_local(|| black_box(&joined).iter().filter(|b| **b == b'\n').count());
}
