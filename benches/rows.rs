//! Typed rows: decoding an events `ev` row and a caches row into their typed
//! form, beside parsing the same bytes into a `serde_json::Value`, and
//! encoding them back (rows/s).
//!
//! ```text
//! cargo bench --bench rows
//! ```

use divan::counter::{BytesCount, ItemsCount};
use divan::{Bencher, black_box};
use synapse_replication::streams::{CachesRow, EventsRow, Row, StreamName, StreamRow};
use synapse_replication::wire::RawRow;

fn main() {
    divan::main();
}

/// An `ev` row as Synapse writes it for a membership event.
const EV: &str = r#"["ev",["$Ab9_-xQz1t0VRmXNz3hkG5yFJb2HVRtqxUUe4ASYyXQ","!OGEhHVWSdvArJzumhm:matrix.org","m.room.member","@alice:example.com",null,null,"join",false,false]]"#;

/// A caches row as Synapse writes it.
const CACHES: &str = r#"["get_user_by_id",["@alice:example.com"],1700000000000]"#;

/// A `state` row, for comparison.
const STATE: &str = r#"["state",["!OGEhHVWSdvArJzumhm:matrix.org","m.room.name","","$Ab9_-xQz1t0VRmXNz3hkG5yFJb2HVRtqxUUe4ASYyXQ"]]"#;

fn raw(text: &'static str) -> RawRow {
    match RawRow::new(text.as_bytes()) {
        Ok(row) => row,
        Err(error) => panic!("{error}"),
    }
}

fn counters<'a, 'b>(bencher: Bencher<'a, 'b>, text: &str) -> Bencher<'a, 'b> {
    bencher
        .counter(ItemsCount::new(1usize))
        .counter(BytesCount::new(text.len()))
}

#[divan::bench]
fn ev_typed(bencher: Bencher) {
    let row = raw(EV);
    counters(bencher, EV).bench(|| EventsRow::decode(black_box(&row)).map(black_box));
}

#[divan::bench]
fn ev_value(bencher: Bencher) {
    let row = raw(EV);
    counters(bencher, EV).bench(|| {
        serde_json::from_slice::<serde_json::Value>(black_box(row.as_bytes())).map(black_box)
    });
}

#[divan::bench]
fn ev_typed_via_row_enum(bencher: Bencher) {
    let row = raw(EV);
    counters(bencher, EV)
        .bench(|| Row::decode(black_box(&StreamName::Events), black_box(&row)).map(black_box));
}

#[divan::bench]
fn caches_typed(bencher: Bencher) {
    let row = raw(CACHES);
    counters(bencher, CACHES).bench(|| CachesRow::decode(black_box(&row)).map(black_box));
}

#[divan::bench]
fn caches_value(bencher: Bencher) {
    let row = raw(CACHES);
    counters(bencher, CACHES).bench(|| {
        serde_json::from_slice::<serde_json::Value>(black_box(row.as_bytes())).map(black_box)
    });
}

#[divan::bench]
fn state_typed(bencher: Bencher) {
    let row = raw(STATE);
    counters(bencher, STATE).bench(|| EventsRow::decode(black_box(&row)).map(black_box));
}

#[divan::bench]
fn state_value(bencher: Bencher) {
    let row = raw(STATE);
    counters(bencher, STATE).bench(|| {
        serde_json::from_slice::<serde_json::Value>(black_box(row.as_bytes())).map(black_box)
    });
}

#[divan::bench]
fn ev_encode(bencher: Bencher) {
    let Ok(row) = EventsRow::decode(&raw(EV)) else {
        panic!("the ev row decodes")
    };
    counters(bencher, EV).bench(|| black_box(&row).encode().map(black_box));
}

#[divan::bench]
fn caches_encode(bencher: Bencher) {
    let Ok(row) = CachesRow::decode(&raw(CACHES)) else {
        panic!("the caches row decodes")
    };
    counters(bencher, CACHES).bench(|| black_box(&row).encode().map(black_box));
}
