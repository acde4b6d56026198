//! Typed rows of every Synapse release from 1.98.0 to 1.163.2: the vectors
//! of `tests/vectors/rows-<version>.jsonl` (written by each release's own
//! code, see `generate_releases.py`) decode and re-encode byte for byte.

mod common;

use std::collections::BTreeSet;

use bytes::Bytes;
use serde_json::Value;
use synapse_replication::streams::{
    AccountDataRow, CachesRow, DeviceListsRow, PresenceRow, QuarantinedMediaRow, RawJson, Row,
    RowError, StreamName, StreamRow, recode,
};
use synapse_replication::wire::{Command, InstanceName, RawRow, Token};

/// The releases vectors were generated for, oldest first.
const RELEASES: &[&str] = &[
    "1.98.0", "1.105.1", "1.109.0", "1.110.0", "1.120.2", "1.140.0", "1.163.2",
];

fn release_tuple(release: &str) -> (u32, u32, u32) {
    let mut parts = release.split('.').map(|part| part.parse::<u32>().unwrap());
    let mut next = || parts.next().unwrap();
    (next(), next(), next())
}

/// The streams each release defines (its `STREAMS_MAP`), by the first
/// release of the matrix that has them.
fn streams_of(release: &str) -> BTreeSet<&'static str> {
    let mut streams: BTreeSet<&str> = [
        "events",
        "backfill",
        "presence",
        "presence_federation",
        "typing",
        "receipts",
        "push_rules",
        "pushers",
        "caches",
        "device_lists",
        "to_device",
        "federation",
        "account_data",
        "un_partial_stated_room",
        "un_partial_stated_event",
    ]
    .into();
    if release_tuple(release) >= (1, 140, 0) {
        streams.insert("thread_subscriptions");
    }
    if release_tuple(release) >= (1, 163, 2) {
        streams.extend(["profile_updates", "sticky_events", "quarantined_media"]);
    }
    streams
}

fn text<'a>(vector: &'a Value, key: &str) -> &'a str {
    common::text(vector, key)
}

fn raw(text: &str) -> RawRow {
    RawRow::new(Bytes::copy_from_slice(text.as_bytes())).unwrap()
}

/// The vector's value of the field at `index` in its release's order.
fn field(vector: &Value, index: usize) -> &Value {
    let name = vector["field_order"][index].as_str().unwrap();
    &vector["fields"][name]
}

fn opt_str(value: &Value) -> Option<&str> {
    match value {
        Value::Null => None,
        other => Some(other.as_str().unwrap()),
    }
}

/// Checks the named fields of the rows whose shape or content differs
/// between releases, or from the row classes' annotations.
fn check_named_fields(release: &str, name: &str, vector: &Value, row: &Row) {
    let field_order: Vec<&str> = vector["field_order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|name| name.as_str().unwrap())
        .collect();
    match row {
        Row::DeviceLists(row) => {
            let old = release_tuple(release) < (1, 110, 0);
            let expected_order: &[&str] = if old {
                &["entity", "is_signature"]
            } else {
                DeviceListsRow::FIELDS
            };
            assert_eq!(field_order, expected_order, "{name}");
            assert_eq!(row.user_id, field(vector, 0).as_str().unwrap(), "{name}");
            assert_eq!(Some(row.is_signature), field(vector, 1).as_bool(), "{name}");
            if old {
                assert_eq!(row.hosts_calculated, None, "{name}: no such field");
            } else {
                assert_eq!(row.hosts_calculated, field(vector, 2).as_bool(), "{name}");
            }
        }
        Row::QuarantinedMedia(row) => {
            assert_eq!(field_order, QuarantinedMediaRow::FIELDS, "{name}");
            assert_eq!(
                row.origin.as_deref(),
                opt_str(&vector["fields"]["origin"]),
                "{name}"
            );
            assert_eq!(row.media_id, text(&vector["fields"], "media_id"), "{name}");
            assert_eq!(
                Some(row.quarantined),
                vector["fields"]["quarantined"].as_bool(),
                "{name}"
            );
        }
        Row::Presence(row) => {
            assert_eq!(field_order, PresenceRow::FIELDS, "{name}");
            assert_eq!(
                row.status_msg.as_deref(),
                opt_str(&vector["fields"]["status_msg"]),
                "{name}"
            );
        }
        Row::AccountData(row) => {
            assert_eq!(field_order, AccountDataRow::FIELDS, "{name}");
            assert_eq!(
                row.room_id.as_deref(),
                opt_str(&vector["fields"]["room_id"]),
                "{name}"
            );
        }
        Row::Caches(row) => {
            assert_eq!(field_order, CachesRow::FIELDS, "{name}");
            let keys: Option<Vec<Value>> =
                serde_json::from_value(vector["fields"]["keys"].clone()).unwrap();
            assert_eq!(row.keys, keys, "{name}");
        }
        _ => {}
    }
}

#[test]
fn every_release_vector_decodes_and_reencodes_byte_for_byte() {
    let mut releases_seen = Vec::new();
    for &release in RELEASES {
        let vectors = common::vectors(&format!("rows-{release}.jsonl"));
        let mut streams = BTreeSet::new();
        let mut from_storage = 0;
        for vector in &vectors {
            let name = text(vector, "name");
            assert_eq!(text(vector, "release"), release, "{name}");
            let stream = StreamName::from(text(vector, "stream"));
            assert!(stream.is_known(), "{release} {name}: unknown stream");
            streams.insert(stream.to_string());
            let row_json = text(vector, "row_json");
            let expected = match vector.get("canonical_json") {
                Some(canonical) => canonical.as_str().unwrap(),
                None => row_json,
            };
            from_storage += usize::from(text(vector, "source") == "update function");

            // As it arrives: an RDATA line, decoded into its typed row.
            let line = format!("RDATA {stream} master 7 {row_json}");
            let Some(Command::Rdata(rdata)) = Command::decode(Bytes::from(line)).unwrap() else {
                panic!("{release} {name}: not an RDATA");
            };
            let row =
                Row::from_rdata(&rdata).unwrap_or_else(|error| panic!("{release} {name}: {error}"));
            assert!(
                !matches!(row, Row::Other { .. }),
                "{release} {name}: not typed"
            );
            assert_eq!(row.stream(), stream, "{release} {name}");
            check_named_fields(release, name, vector, &row);

            // Written back, it is the bytes that release wrote (the
            // PostgreSQL form of a SQLite row).
            let encoded = row.encode().unwrap();
            assert_eq!(
                encoded.as_str(),
                expected,
                "{release} {name}: re-encoded bytes"
            );
            assert_eq!(
                recode(&rdata).unwrap().as_str(),
                expected,
                "{release} {name}"
            );
            assert_eq!(
                Row::decode(&stream, &encoded).unwrap(),
                row,
                "{release} {name}: the re-encoded row decodes to the same row"
            );
            // The values are the release's, field by field, in its order.
            let array: Vec<Value> = serde_json::from_str(expected).unwrap();
            if stream != StreamName::Events {
                let order = vector["field_order"].as_array().unwrap();
                assert_eq!(array.len(), order.len(), "{release} {name}");
                for (index, value) in array.iter().enumerate() {
                    assert_eq!(value, field(vector, index), "{release} {name}: {index}");
                }
            }
        }
        let expected: BTreeSet<String> =
            streams_of(release).into_iter().map(str::to_owned).collect();
        assert_eq!(streams, expected, "{release}: every stream has vectors");
        assert!(from_storage >= 5, "{release}: {from_storage} storage rows");
        releases_seen.push(release);
    }
    assert_eq!(releases_seen, RELEASES);
}

/// The two shapes of `device_lists` rows, and what neither release wrote.
#[test]
fn device_lists_rows_of_both_shapes() {
    // Up to 1.109: [entity, is_signature], entity a user or a server.
    for old in [r#"["@a:example.com",false]"#, r#"["remote.org",true]"#] {
        let row = DeviceListsRow::decode(&raw(old)).unwrap();
        assert_eq!(row.hosts_calculated, None, "{old}");
        assert!(row.extra.is_empty());
        assert_eq!(row.encode().unwrap().as_str(), old);
    }
    // From 1.110: [user_id, is_signature, hosts_calculated], 0/1 on SQLite.
    let row = DeviceListsRow::decode(&raw(r#"["@a:example.com",0,1]"#)).unwrap();
    assert_eq!(
        (row.is_signature, row.hosts_calculated),
        (false, Some(true))
    );
    assert_eq!(
        row.encode().unwrap().as_str(),
        r#"["@a:example.com",false,true]"#
    );
    // A newer Synapse's extra fields come after hosts_calculated.
    let row = DeviceListsRow::decode(&raw(r#"["@a",false,true,{"x":1}]"#)).unwrap();
    assert_eq!(row.extra, vec![RawJson::from_text(r#"{"x":1}"#).unwrap()]);
    assert_eq!(
        row.encode().unwrap().as_str(),
        r#"["@a",false,true,{"x":1}]"#
    );

    // No release writes null there, nor fewer than two fields.
    let error = DeviceListsRow::decode(&raw(r#"["@a",false,null]"#)).unwrap_err();
    assert_eq!(error.field(), Some((2, "hosts_calculated")), "{error}");
    let error = DeviceListsRow::decode(&raw(r#"["@a"]"#)).unwrap_err();
    assert!(
        matches!(
            error,
            RowError::MissingField {
                index: 1,
                field: "is_signature",
                ..
            }
        ),
        "{error}"
    );

    // A typed row with extra fields but no hosts_calculated cannot be
    // written: it would read back as a different row.
    let row = DeviceListsRow {
        user_id: "@a".into(),
        is_signature: false,
        hosts_calculated: None,
        extra: vec![RawJson::null()],
    };
    let error = row.encode().unwrap_err();
    assert!(matches!(error, RowError::Encode { .. }), "{error}");
    assert_eq!(error.stream(), &StreamName::DeviceLists);
    assert!(
        Row::from(row)
            .to_rdata(InstanceName::master(), Token(1))
            .is_err()
    );
}

/// Local media has no origin: Synapse writes `null` although the row class
/// annotates `str`.
#[test]
fn quarantined_media_of_local_media() {
    let line = br#"RDATA quarantined_media master 2 [null,"abcDEF123",true]"#;
    let Some(Command::Rdata(rdata)) = Command::decode(Bytes::from_static(line)).unwrap() else {
        panic!("not an RDATA");
    };
    let Row::QuarantinedMedia(row) = Row::from_rdata(&rdata).unwrap() else {
        panic!("not a quarantined_media row");
    };
    assert_eq!(row.origin, None);
    assert_eq!(row.media_id, "abcDEF123");
    assert!(row.quarantined);
    assert_eq!(recode(&rdata).unwrap(), rdata.row);
}
