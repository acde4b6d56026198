//! Typed rows: Synapse's vectors, malformed rows, and round trips.

mod common;

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::{Value, json};
use synapse_replication::streams::{
    AccountDataRow, AllStateRow, BackfillRow, CachesRow, CurrentStateRow, DeviceListsRow, EventRow,
    EventsRow, EventsRowData, FederationRow, PresenceFederationRow, PresenceRow, ProfileUpdatesRow,
    PushRulesRow, PushersRow, QuarantinedMediaRow, RawJson, ReceiptsRow, Row, RowError,
    StickyEventsRow, StreamName, StreamRow, ThreadSubscriptionsRow, ToDeviceRow, TypingRow,
    UnPartialStatedEventRow, UnPartialStatedRoomRow, recode,
};
use synapse_replication::wire::{Command, InstanceName, RawRow, Rdata, RdataToken, Token};

// ---------------------------------------------------------------------------
// Helpers over every row type.

/// Calls `$body` with `$row` bound to the typed row inside a `Row`.
macro_rules! with_row {
    ($value:expr, $row:ident => $body:expr, other => $other:expr) => {
        match $value {
            Row::Events($row) => $body,
            Row::Backfill($row) => $body,
            Row::Presence($row) => $body,
            Row::PresenceFederation($row) => $body,
            Row::Typing($row) => $body,
            Row::Receipts($row) => $body,
            Row::PushRules($row) => $body,
            Row::Pushers($row) => $body,
            Row::Caches($row) => $body,
            Row::DeviceLists($row) => $body,
            Row::ToDevice($row) => $body,
            Row::Federation($row) => $body,
            Row::AccountData($row) => $body,
            Row::ProfileUpdates($row) => $body,
            Row::StickyEvents($row) => $body,
            Row::ThreadSubscriptions($row) => $body,
            Row::UnPartialStatedRoom($row) => $body,
            Row::UnPartialStatedEvent($row) => $body,
            Row::QuarantinedMedia($row) => $body,
            _ => $other,
        }
    };
}

/// The names of the fields of a known stream's row, as this crate has them.
fn fields_of(stream: &StreamName) -> &'static [&'static str] {
    match stream {
        StreamName::Events => EventsRow::FIELDS,
        StreamName::Backfill => BackfillRow::FIELDS,
        StreamName::Presence => PresenceRow::FIELDS,
        StreamName::PresenceFederation => PresenceFederationRow::FIELDS,
        StreamName::Typing => TypingRow::FIELDS,
        StreamName::Receipts => ReceiptsRow::FIELDS,
        StreamName::PushRules => PushRulesRow::FIELDS,
        StreamName::Pushers => PushersRow::FIELDS,
        StreamName::Caches => CachesRow::FIELDS,
        StreamName::DeviceLists => DeviceListsRow::FIELDS,
        StreamName::ToDevice => ToDeviceRow::FIELDS,
        StreamName::Federation => FederationRow::FIELDS,
        StreamName::AccountData => AccountDataRow::FIELDS,
        StreamName::ProfileUpdates => ProfileUpdatesRow::FIELDS,
        StreamName::StickyEvents => StickyEventsRow::FIELDS,
        StreamName::ThreadSubscriptions => ThreadSubscriptionsRow::FIELDS,
        StreamName::UnPartialStatedRoom => UnPartialStatedRoomRow::FIELDS,
        StreamName::UnPartialStatedEvent => UnPartialStatedEventRow::FIELDS,
        StreamName::QuarantinedMedia => QuarantinedMediaRow::FIELDS,
        other => panic!("no row type for {other}"),
    }
}

fn data_fields_of(type_id: &str) -> &'static [&'static str] {
    match type_id {
        "ev" => EventRow::FIELDS,
        "state" => CurrentStateRow::FIELDS,
        "state-all" => AllStateRow::FIELDS,
        other => panic!("no events row type {other}"),
    }
}

/// The fields after the known ones, wherever the row keeps them.
fn extras_of(row: &Row) -> Vec<RawJson> {
    match row {
        Row::Events(row) => {
            let inner = match &row.data {
                EventsRowData::Event(data) => data.extra.clone(),
                EventsRowData::CurrentState(data) => data.extra.clone(),
                EventsRowData::AllState(data) => data.extra.clone(),
                _ => Vec::new(),
            };
            [inner, row.extra.clone()].concat()
        }
        other => with_row!(other, row => row.extra.clone(), other => Vec::new()),
    }
}

/// The typed row as the JSON array its `Serialize` impl writes.
fn as_value(row: &Row) -> Value {
    with_row!(row, row => serde_json::to_value(row).unwrap(), other => panic!("not a typed row: {row:?}"))
}

fn raw(text: &str) -> RawRow {
    RawRow::new(Bytes::copy_from_slice(text.as_bytes())).unwrap()
}

// ---------------------------------------------------------------------------
// Synapse's vectors.

struct Vector {
    json: Value,
}

impl Vector {
    fn str(&self, key: &str) -> &str {
        self.json[key]
            .as_str()
            .unwrap_or_else(|| panic!("{}: no {key}", self.name()))
    }

    fn name(&self) -> &str {
        self.json["name"].as_str().unwrap_or("?")
    }

    fn flag(&self, key: &str) -> bool {
        self.json.get(key) == Some(&Value::Bool(true))
    }

    fn names(&self, key: &str) -> Vec<String> {
        serde_json::from_value(self.json[key].clone()).unwrap()
    }
}

/// The vectors of `file`; fails loudly if it is missing or empty.
fn load(file: &str) -> Vec<Vector> {
    common::vectors(file)
        .into_iter()
        .map(|json| Vector { json })
        .collect()
}

/// Checks the decoded fields against the vector's `fields`, in
/// `field_order`, and the extras against `extra_values`.
fn check_fields(vector: &Vector, stream: &StreamName, row: &Row) {
    let name = vector.name();
    let fields = &vector.json["fields"];
    let order = vector.names("field_order");
    let value = as_value(row);
    let array = value.as_array().unwrap();
    if *stream == StreamName::Events {
        assert_eq!(order, EventsRow::FIELDS, "{name}");
        assert_eq!(array[0], fields["type_id"], "{name}: type_id");
        let type_id = vector.json["fields"]["type_id"].as_str().unwrap();
        let data_order = vector.names("data_field_order");
        assert_eq!(
            data_order,
            data_fields_of(type_id),
            "{name}: data field order"
        );
        let data = array[1].as_array().unwrap();
        for (index, field) in data_order.iter().enumerate() {
            assert_eq!(
                data[index], fields["data"][field],
                "{name}: data field {index} ({field})"
            );
        }
    } else {
        assert_eq!(order, fields_of(stream), "{name}: field order");
        for (index, field) in order.iter().enumerate() {
            assert_eq!(
                array[index], fields[field],
                "{name}: field {index} ({field})"
            );
        }
    }
    let extras: Vec<Value> = extras_of(row).iter().map(|x| x.parse().unwrap()).collect();
    let expected = if vector.flag("extra_fields") {
        vector.json["extra_values"].as_array().unwrap().clone()
    } else {
        Vec::new()
    };
    assert_eq!(extras, expected, "{name}: extra fields");
}

#[test]
fn synapse_vectors_decode_and_reencode_byte_for_byte() {
    let vectors = load("rows.jsonl");
    let mut streams = std::collections::BTreeSet::new();
    let (mut decoded, mut too_few, mut sqlite, mut extra) = (0, 0, 0, 0);
    for vector in &vectors {
        let name = vector.name();
        let stream = StreamName::from(vector.str("stream"));
        assert!(stream.is_known(), "{name}: unknown stream");
        streams.insert(stream.to_string());
        let row_json = vector.str("row_json");
        let raw = raw(row_json);
        let result = Row::decode(&stream, &raw);

        if vector.flag("too_few") {
            too_few += 1;
            let missing = vector.names("missing_fields");
            let error = result.expect_err(name);
            let RowError::MissingField { index, field, .. } = &error else {
                panic!("{name}: expected a missing field, got {error}");
            };
            let order = if stream == StreamName::Events {
                vector.names("data_field_order")
            } else {
                vector.names("field_order")
            };
            assert_eq!(order[*index], missing[0], "{name}: {error}");
            let prefix = if stream == StreamName::Events {
                "data."
            } else {
                ""
            };
            assert_eq!(*field, format!("{prefix}{}", missing[0]), "{name}");
            assert_eq!(error.stream(), &stream);
            assert!(error.to_string().starts_with(&format!("{stream} row: ")));
            continue;
        }

        let row = result.unwrap_or_else(|error| panic!("{name}: {error}"));
        decoded += 1;
        assert_eq!(row.stream(), stream, "{name}");
        check_fields(vector, &stream, &row);
        sqlite += usize::from(vector.flag("sqlite"));
        extra += usize::from(vector.flag("extra_fields"));

        let expected = if vector.flag("sqlite") {
            vector.str("canonical_json")
        } else {
            row_json
        };
        let encoded = row.encode().unwrap();
        assert_eq!(encoded.as_str(), expected, "{name}: re-encoded bytes");

        // The same through an RDATA line, as `recode` sees it.
        let line = format!("RDATA {stream} master 7 {row_json}");
        let Some(Command::Rdata(rdata)) = Command::decode(Bytes::from(line)).unwrap() else {
            panic!("{name}: not an RDATA");
        };
        assert_eq!(Row::from_rdata(&rdata).unwrap(), row, "{name}");
        assert_eq!(recode(&rdata).unwrap().as_str(), expected, "{name}: recode");

        // Decoding the canonical form gives the same row.
        assert_eq!(
            Row::decode(&stream, &encoded).unwrap(),
            row,
            "{name}: canonical form"
        );
    }
    let all: std::collections::BTreeSet<String> =
        StreamName::KNOWN.iter().map(|s| s.to_string()).collect();
    assert_eq!(streams, all, "every stream has vectors");
    assert!(decoded >= 19 && too_few >= 19 && sqlite > 0 && extra >= 19);
    eprintln!(
        "{} vectors: {decoded} decoded ({sqlite} SQLite, {extra} with extra fields), {too_few} too few",
        vectors.len()
    );
}

/// Rows Synapse accepts but never writes: where a typed row decodes, it
/// re-encodes to what Synapse re-encodes the row to.
#[test]
fn noncanonical_rows_reencode_as_synapse_does() {
    let vectors = load("noncanonical.jsonl");
    let mut checked = 0;
    for vector in vectors.iter().filter(|v| v.str("cmd") == "RDATA") {
        let name = vector.name();
        if vector.json.get("ours").is_some() || vector.json["canonical"].is_null() {
            continue;
        }
        let Ok(Some(Command::Rdata(rdata))) =
            Command::decode(Bytes::from(vector.str("line").to_owned().into_bytes()))
        else {
            continue;
        };
        let Some(Command::Rdata(canonical)) =
            Command::decode(Bytes::from(vector.str("canonical").to_owned().into_bytes())).unwrap()
        else {
            panic!("{name}: canonical is not an RDATA");
        };
        match recode(&rdata) {
            Ok(row) => {
                assert_eq!(row, canonical.row, "{name}");
                checked += 1;
            }
            // Rows of the wrong shape for their stream (`[1]` as a caches
            // row) fail typed decoding; Synapse's own parse_row would too.
            Err(error) => assert!(
                matches!(
                    error,
                    RowError::NotAnArray { .. }
                        | RowError::InvalidField { .. }
                        | RowError::MissingField { .. }
                ),
                "{name}: {error}"
            ),
        }
    }
    assert!(checked >= 15, "only {checked} non-canonical rows checked");
    eprintln!("{checked} non-canonical rows re-encoded as Synapse does");
}

// ---------------------------------------------------------------------------
// Hand-written checks of named fields (independent of Serialize).

#[test]
fn named_fields_of_an_ev_row() {
    let row = EventsRow::decode(&raw(
        r#"["ev",["$j:example.com","!room:example.com","m.room.member","@alice:example.com",null,"$rel",  "join",0,1]]"#,
    ))
    .unwrap();
    let EventsRowData::Event(event) = &row.data else {
        panic!("{row:?}")
    };
    assert_eq!(
        *event,
        EventRow {
            event_id: "$j:example.com".into(),
            room_id: "!room:example.com".into(),
            event_type: "m.room.member".into(),
            state_key: Some("@alice:example.com".into()),
            redacts: None,
            relates_to: Some("$rel".into()),
            membership: Some("join".into()),
            rejected: false,
            outlier: true,
            extra: vec![],
        }
    );
    assert_eq!(
        row.encode().unwrap().as_str(),
        r#"["ev",["$j:example.com","!room:example.com","m.room.member","@alice:example.com",null,"$rel","join",false,true]]"#
    );
}

#[test]
fn named_fields_of_other_rows() {
    let presence =
        PresenceRow::decode(&raw(r#"["@c:example.com","busy",1,2,3,"\u00e9t\u00e9",1]"#)).unwrap();
    assert_eq!(
        (
            presence.user_id.as_str(),
            presence.state.as_str(),
            presence.last_active_ts,
            presence.last_federation_update_ts,
            presence.last_user_sync_ts,
            presence.status_msg.as_deref(),
            presence.currently_active
        ),
        ("@c:example.com", "busy", 1, 2, 3, Some("été"), true)
    );
    let caches = CachesRow::decode(&raw(r#"["cs_cache_fake",null,4611686018427387904]"#)).unwrap();
    assert_eq!(caches.keys, None, "null keys invalidate the whole cache");
    assert_eq!(caches.invalidation_ts, 1 << 62);
    let caches = CachesRow::decode(&raw(r#"["f",["a",1,null,["x",[]],"[\"j\"]"],0]"#)).unwrap();
    assert_eq!(
        caches.keys,
        Some(vec![
            json!("a"),
            json!(1),
            Value::Null,
            json!(["x", []]),
            json!("[\"j\"]")
        ])
    );
    let receipt = ReceiptsRow::decode(&raw(
        r#"["!r","m.read","@a","$e","main",{"ts":1,"thread_id":"main"}]"#,
    ))
    .unwrap();
    assert_eq!(receipt.thread_id.as_deref(), Some("main"));
    assert_eq!(receipt.data.as_str(), r#"{"ts":1,"thread_id":"main"}"#);
    let account = AccountDataRow::decode(&raw(r#"["@a",null,"m.direct"]"#)).unwrap();
    assert_eq!(
        (account.room_id, account.data_type.as_str()),
        (None, "m.direct")
    );
    let profile = ProfileUpdatesRow::decode(&raw(r#"["@a","update",["b","a"]]"#)).unwrap();
    assert_eq!(profile.affected_fields, Some(vec!["b".into(), "a".into()]));
    let federation = FederationRow::decode(&raw(r#"["pd",{"dests":[]}]"#)).unwrap();
    assert_eq!(federation.row_type, "pd");
    let device = DeviceListsRow::decode(&raw(r#"["@a",1,false]"#)).unwrap();
    assert!(device.is_signature);
    assert_eq!(device.hosts_calculated, Some(false));
    let device = DeviceListsRow::decode(&raw(r#"["remote.org",false]"#)).unwrap();
    assert_eq!(
        device.hosts_calculated, None,
        "a row from Synapse 1.109 or older"
    );
    let media = QuarantinedMediaRow::decode(&raw(r#"["example.com","m1",0]"#)).unwrap();
    assert_eq!(
        (
            media.origin.as_deref(),
            media.media_id.as_str(),
            media.quarantined
        ),
        (Some("example.com"), "m1", false)
    );
    let media = QuarantinedMediaRow::decode(&raw(r#"[null,"m1",true]"#)).unwrap();
    assert_eq!(media.origin, None, "local media");
    let row = EventsRow::from_slice(br#"["state",["!r","m.room.name","",null]]"#).unwrap();
    let EventsRowData::CurrentState(state) = row.data else {
        panic!("{row:?}")
    };
    assert_eq!((state.state_key.as_str(), state.event_id), ("", None));
}

// ---------------------------------------------------------------------------
// Malformed rows.

fn decode_error(stream: StreamName, text: &str) -> RowError {
    Row::decode(&stream, &raw(text)).expect_err(text)
}

#[test]
fn malformed_rows_name_the_stream_and_the_field() {
    let cases: &[(StreamName, &str, usize, &str)] = &[
        (
            StreamName::Caches,
            r#"["f",["k"],"x"]"#,
            2,
            "invalidation_ts",
        ),
        (StreamName::Caches, r#"[1,null,0]"#, 0, "cache_func"),
        (StreamName::Caches, r#"["f","k",0]"#, 1, "keys"),
        (StreamName::Caches, r#"["f",[1e400],0]"#, 1, "keys"),
        (
            StreamName::Caches,
            r#"["f",[100000000000000000000],0]"#,
            1,
            "keys",
        ),
        (StreamName::Caches, r#"["f",[],1.5]"#, 2, "invalidation_ts"),
        (
            StreamName::Caches,
            r#"["f",[],9223372036854775808]"#,
            2,
            "invalidation_ts",
        ),
        (
            StreamName::Pushers,
            r#"["@a","m.http","k",2]"#,
            3,
            "deleted",
        ),
        (
            StreamName::Pushers,
            r#"["@a","m.http","k","true"]"#,
            3,
            "deleted",
        ),
        (
            StreamName::Pushers,
            r#"["@a","m.http","k",null]"#,
            3,
            "deleted",
        ),
        (
            StreamName::Pushers,
            r#"["@a","m.http","k",-1]"#,
            3,
            "deleted",
        ),
        (StreamName::Typing, r#"["!r",["@a",5]]"#, 1, "user_ids"),
        (
            StreamName::Receipts,
            r#"["!r","m.read","@a","$e",null,{"a":1e400}]"#,
            5,
            "data",
        ),
        (StreamName::Presence, r#"["@\ud800",1,2]"#, 0, "user_id"),
        (StreamName::Events, r#"[1,[]]"#, 0, "type_id"),
        (StreamName::Events, r#"["ev",{}]"#, 1, "data"),
        (StreamName::Events, r#"["ev","$e"]"#, 1, "data"),
        (
            StreamName::Events,
            r#"["ev",["$e","!r","m",5,null,null,null,false,false]]"#,
            3,
            "data.state_key",
        ),
        (
            StreamName::Events,
            r#"["state",["!r","m","\udc00",null]]"#,
            2,
            "data.state_key",
        ),
        (
            StreamName::Events,
            r#"["state-all",[null]]"#,
            0,
            "data.room_id",
        ),
    ];
    for (stream, text, index, field) in cases {
        let error = decode_error(stream.clone(), text);
        assert!(
            matches!(error, RowError::InvalidField { .. }),
            "{text}: {error}"
        );
        assert_eq!(error.field(), Some((*index, *field)), "{text}: {error}");
        assert_eq!(error.stream(), stream);
        let message = error.to_string();
        assert!(
            message.starts_with(&format!(
                "{stream} row: invalid field {field} (index {index}): "
            )),
            "{message}"
        );
    }
}

#[test]
fn rows_of_the_wrong_shape_are_errors() {
    for text in ["5", "null", r#"{"a":1}"#, r#""s""#, "true"] {
        let error = decode_error(StreamName::Caches, text);
        assert!(
            matches!(error, RowError::NotAnArray { .. }),
            "{text}: {error}"
        );
        assert_eq!(error.field(), None);
    }
    let error = decode_error(StreamName::Events, r#"["ev"]"#);
    assert!(matches!(
        error,
        RowError::MissingField {
            index: 1,
            field: "data",
            ..
        }
    ));
    let error = decode_error(StreamName::Events, "[]");
    assert!(matches!(
        error,
        RowError::MissingField {
            index: 0,
            field: "type_id",
            ..
        }
    ));
    // Bytes that are not JSON at all, decoded without a RawRow.
    for text in [&b"[\"f\",[],0"[..], b"", b"[1] x", b"\xff"] {
        let error = CachesRow::from_slice(text).expect_err("not JSON");
        assert!(
            matches!(
                error,
                RowError::Json { .. }
                    | RowError::InvalidField { .. }
                    | RowError::MissingField { .. }
            ),
            "{error}"
        );
    }
    assert!(matches!(
        CachesRow::from_slice(b"[\"f\",[],0] x").unwrap_err(),
        RowError::Json { .. }
    ));
    // Long rows are quoted truncated.
    let long = format!(r#"["{}",[],"x"]"#, "a".repeat(1000));
    let message = decode_error(StreamName::Caches, &long).to_string();
    assert!(message.len() < 300 && message.ends_with("…\""), "{message}");
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let deep = format!("[\"f\",{}{},0]", "[".repeat(100_000), "]".repeat(100_000));
    let error = decode_error(StreamName::Caches, &deep);
    assert_eq!(error.field(), Some((1, "keys")));
    // Re-spelling parses the text, which is bounded.
    let deep = format!("[\"e\",[ {}{}]]", "[".repeat(100_000), "]".repeat(100_000));
    let error = decode_error(StreamName::Federation, &deep);
    assert_eq!(error.field(), Some((1, "data")));
    // Kept as text when already canonical, so any depth passes.
    let deep = format!(
        "[\"e\",{{\"a\":{}{}}}]",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let row = Row::decode(&StreamName::Federation, &raw(&deep)).unwrap();
    assert_eq!(row.encode().unwrap().as_str(), deep);
}

// ---------------------------------------------------------------------------
// Forward compatibility and pass-through.

#[test]
fn unknown_streams_pass_through_untouched() {
    let stream = StreamName::from("future_stream");
    let text = r#"[1, "\u00E9", {"b":2,"a":1}]"#;
    let row = Row::decode(&stream, &raw(text)).unwrap();
    assert_eq!(row.stream(), stream);
    assert!(matches!(&row, Row::Other { .. }));
    assert_eq!(
        row.encode().unwrap().as_str(),
        text,
        "byte for byte, not re-spelt"
    );
    let rdata = row.to_rdata(InstanceName::master(), Token(3)).unwrap();
    assert_eq!(
        Command::Rdata(rdata).to_bytes().unwrap(),
        format!("RDATA future_stream master 3 {text}").as_bytes()
    );
}

#[test]
fn unknown_event_types_pass_through() {
    let text = r#"["future",{"x":[1,"\u00e9"]},"more"]"#;
    let row = EventsRow::decode(&raw(text)).unwrap();
    assert_eq!(row.type_id(), "future");
    let EventsRowData::Unknown { type_id, data } = &row.data else {
        panic!("{row:?}")
    };
    assert_eq!(
        (type_id.as_str(), data.as_str()),
        ("future", r#"{"x":[1,"\u00e9"]}"#)
    );
    assert_eq!(row.extra, vec![RawJson::from_text(r#""more""#).unwrap()]);
    assert_eq!(row.encode().unwrap().as_str(), text);
    // Unknown data is re-spelt as Synapse writes it.
    let row = EventsRow::decode(&raw(r#"["future", [ "é" , 1.50 ] ]"#)).unwrap();
    assert_eq!(
        row.encode().unwrap().as_str(),
        r#"["future",["\u00e9",1.5]]"#
    );
}

#[test]
fn extra_fields_are_kept_in_order_and_written_back() {
    let text = r#"["@a","m.http","k",1,{"new":[true]},null,"x"]"#;
    let row = PushersRow::decode(&raw(text)).unwrap();
    assert!(row.deleted);
    let extra: Vec<&str> = row.extra.iter().map(RawJson::as_str).collect();
    assert_eq!(extra, [r#"{"new":[true]}"#, "null", r#""x""#]);
    assert_eq!(
        row.encode().unwrap().as_str(),
        r#"["@a","m.http","k",true,{"new":[true]},null,"x"]"#
    );
    // Outer and inner extras of an events row.
    let text = r#"["state-all",["!r",1],2]"#;
    let row = EventsRow::decode(&raw(text)).unwrap();
    assert_eq!(row.extra.len(), 1);
    let EventsRowData::AllState(data) = &row.data else {
        panic!()
    };
    assert_eq!(data.extra.len(), 1);
    assert_eq!(row.encode().unwrap().as_str(), text);
}

#[test]
fn federation_data_is_kept_as_text_and_respelt_only_if_needed() {
    let text =
        r#"["e",{"edu_type":"m.x","content":{"n":[1,2.5,-0.0,1e+16],"s":"\ud800 \udbff\udfff"}}]"#;
    let row = FederationRow::decode(&raw(text)).unwrap();
    assert_eq!(row.encode().unwrap().as_str(), text, "lone surrogates kept");
    let row =
        FederationRow::decode(&raw(r#"["e", {"b": [1E5, -0], "a": "\/\u00E9", "b": 1}]"#)).unwrap();
    assert_eq!(row.data.as_str(), r#"{"b":1,"a":"/\u00e9"}"#);
}

#[test]
fn lone_surrogates_are_errors_or_replacement_characters() {
    let cases = [
        (
            StreamName::Presence,
            r#"["@a","online",1,2,3,"a\ud800b",true]"#,
            r#"["@a","online",1,2,3,"a\ufffdb",true]"#,
        ),
        (
            StreamName::Caches,
            r#"["f",["\udfff","\ud83d\ude00"],0]"#,
            r#"["f",["\ufffd","\ud83d\ude00"],0]"#,
        ),
        (
            StreamName::Events,
            r#"["state",["!r","m.room.name","\uD800",null]]"#,
            r#"["state",["!r","m.room.name","\ufffd",null]]"#,
        ),
        // In text kept raw, the strict decode already succeeds.
        (
            StreamName::Receipts,
            r#"["!r","m.read","@a","$e",null,{"x":"\ud800"}]"#,
            r#"["!r","m.read","@a","$e",null,{"x":"\ud800"}]"#,
        ),
    ];
    for (stream, text, lossy) in cases {
        let row = raw(text);
        if text != lossy {
            let error = Row::decode(&stream, &row).unwrap_err();
            assert!(matches!(error, RowError::InvalidField { .. }), "{error}");
        }
        let decoded = Row::decode_lossy(&stream, &row).unwrap();
        assert_eq!(decoded.encode().unwrap().as_str(), lossy);
    }
    // Another fault is reported as by `decode`.
    let text = r#"["f",["\ud800"],"x"]"#;
    let strict = Row::decode(&StreamName::Caches, &raw(text)).unwrap_err();
    let lossy = Row::decode_lossy(&StreamName::Caches, &raw(text)).unwrap_err();
    assert_eq!(strict.to_string(), lossy.to_string());
    assert_eq!(lossy.field(), Some((1, "keys")));
}

#[test]
fn large_numbers() {
    // Kept as text: Python's spelling of any number passes untouched.
    let text = r#"["e",{"big":100000000000000000000,"float":1e+20,"n":-4.352490475844096e+39}]"#;
    let row = FederationRow::decode(&raw(text)).unwrap();
    assert_eq!(row.encode().unwrap().as_str(), text);
    // Parsed into values, an integer beyond 64 bits would be re-encoded as a
    // float: refused. serde_json reads `1e+20` and `100000000000000000000`
    // alike, so a float whose value is such an integer is refused too.
    for keys in ["[100000000000000000000]", "[1e+20]", "[[-1e+19]]"] {
        let error = decode_error(StreamName::Caches, &format!(r#"["f",{keys},0]"#));
        assert_eq!(error.field(), Some((1, "keys")), "{keys}: {error}");
    }
    let row = CachesRow::decode(&raw(
        r#"["f",[18446744073709551615,-9223372036854775808,2.5e-300],0]"#,
    ))
    .unwrap();
    assert_eq!(
        row.encode().unwrap().as_str(),
        r#"["f",[18446744073709551615,-9223372036854775808,2.5e-300],0]"#
    );
}

// ---------------------------------------------------------------------------
// Serde and building rows to publish.

#[test]
fn rows_deserialize_inside_a_catch_up_answer() {
    #[derive(serde::Deserialize)]
    struct Answer {
        updates: Vec<(i64, CachesRow)>,
        upto_token: i64,
        limited: bool,
    }
    let answer: Answer = serde_json::from_str(
        r#"{"updates":[[5,["f",null,1]],[6,["g",["k"],2,"new"]]],"upto_token":6,"limited":false}"#,
    )
    .unwrap();
    assert_eq!(answer.updates.len(), 2);
    assert_eq!(answer.updates[1].1.extra.len(), 1);
    assert_eq!((answer.upto_token, answer.limited), (6, false));
    let events: Vec<(i64, EventsRow)> =
        serde_json::from_str(r#"[[1,["state-all",["!r"]]]]"#).unwrap();
    assert_eq!(events[0].1.type_id(), "state-all");
    assert!(serde_json::from_str::<Vec<(i64, CachesRow)>>(r#"[[1,["f"]]]"#).is_err());
}

#[test]
fn typed_rows_build_rdata_synapse_accepts() {
    let row = Row::from(CachesRow {
        cache_func: "get_user_by_id".into(),
        keys: Some(vec![json!("@café:example.com")]),
        invalidation_ts: 1_700_000_000_000,
        ..CachesRow::default()
    });
    let rdata = row
        .to_rdata(InstanceName::new("worker1"), RdataToken::Batch)
        .unwrap();
    assert_eq!(
        Command::Rdata(rdata).to_bytes().unwrap(),
        &br#"RDATA caches worker1 batch ["get_user_by_id",["@caf\u00e9:example.com"],1700000000000]"#[..]
    );
    let rdata = Rdata {
        stream: StreamName::Events,
        instance: InstanceName::master(),
        token: RdataToken::At(Token(9)),
        row: EventsRow::from(AllStateRow {
            room_id: "!r".into(),
            ..AllStateRow::default()
        })
        .encode()
        .unwrap(),
    };
    assert_eq!(rdata.row.as_str(), r#"["state-all",["!r"]]"#);
}

// ---------------------------------------------------------------------------
// Round trips.

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        // Floats whose value is an integer beyond 64 bits are refused in
        // cache keys (see `large_numbers`).
        any::<f64>()
            .prop_filter("finite, not a huge integer", |f| f.is_finite()
                && !(f.fract() == 0.0 && f.abs() >= 9.2e18))
            .prop_map(Value::from),
        any::<String>().prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((any::<String>(), inner), 0..4)
                .prop_map(|entries| Value::Object(entries.into_iter().collect())),
        ]
    })
}

fn raw_json() -> impl Strategy<Value = RawJson> {
    json_value().prop_map(|value| RawJson::from_value(&value).unwrap())
}

fn extra() -> impl Strategy<Value = Vec<RawJson>> {
    prop::collection::vec(raw_json(), 0..3)
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[@!$#][a-z0-9._=-]{1,12}:[a-z.]{3,12}",
        Just(String::new()),
    ]
}

fn opt_text() -> impl Strategy<Value = Option<String>> {
    prop::option::of(text())
}

fn texts() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(text(), 0..4)
}

/// A strategy for a row struct: `row!(Type { field: strategy, ... })`.
macro_rules! row {
    ($ty:ident { $($field:ident : $strategy:expr),* $(,)? }) => {
        ($($strategy,)* extra()).prop_map(|($($field,)* extra)| $ty { $($field,)* extra })
    };
}

fn event_row() -> impl Strategy<Value = EventRow> {
    (
        (text(), text(), text(), opt_text(), opt_text()),
        (
            opt_text(),
            opt_text(),
            any::<bool>(),
            any::<bool>(),
            extra(),
        ),
    )
        .prop_map(
            |(
                (event_id, room_id, event_type, state_key, redacts),
                (relates_to, membership, rejected, outlier, extra),
            )| EventRow {
                event_id,
                room_id,
                event_type,
                state_key,
                redacts,
                relates_to,
                membership,
                rejected,
                outlier,
                extra,
            },
        )
}

fn events_row() -> impl Strategy<Value = EventsRow> {
    let data = prop_oneof![
        event_row().prop_map(EventsRowData::Event),
        row!(CurrentStateRow {
            room_id: text(),
            event_type: text(),
            state_key: text(),
            event_id: opt_text()
        })
        .prop_map(EventsRowData::CurrentState),
        row!(AllStateRow { room_id: text() }).prop_map(EventsRowData::AllState),
        (
            text().prop_filter("unknown", |t| !["ev", "state", "state-all"]
                .contains(&t.as_str())),
            raw_json()
        )
            .prop_map(|(type_id, data)| EventsRowData::Unknown { type_id, data }),
    ];
    (data, extra()).prop_map(|(data, extra)| EventsRow { data, extra })
}

fn cache_keys() -> impl Strategy<Value = Option<Vec<Value>>> {
    prop::option::of(prop::collection::vec(json_value(), 0..4))
}

/// Every typed row, of every stream.
fn any_row() -> impl Strategy<Value = Row> {
    prop_oneof![
        events_row().prop_map(Row::from),
        row!(BackfillRow {
            event_id: text(),
            room_id: text(),
            event_type: text(),
            state_key: opt_text(),
            redacts: opt_text(),
            relates_to: opt_text()
        })
        .prop_map(Row::from),
        row!(PresenceRow {
            user_id: text(),
            state: text(),
            last_active_ts: any::<i64>(),
            last_federation_update_ts: any::<i64>(),
            last_user_sync_ts: any::<i64>(),
            status_msg: opt_text(),
            currently_active: any::<bool>()
        })
        .prop_map(Row::from),
        row!(PresenceFederationRow {
            destination: text(),
            user_id: text()
        })
        .prop_map(Row::from),
        row!(TypingRow {
            room_id: text(),
            user_ids: texts()
        })
        .prop_map(Row::from),
        row!(ReceiptsRow {
            room_id: text(),
            receipt_type: text(),
            user_id: text(),
            event_id: text(),
            thread_id: opt_text(),
            data: raw_json()
        })
        .prop_map(Row::from),
        row!(PushRulesRow { user_id: text() }).prop_map(Row::from),
        row!(PushersRow {
            user_id: text(),
            app_id: text(),
            pushkey: text(),
            deleted: any::<bool>()
        })
        .prop_map(Row::from),
        row!(CachesRow {
            cache_func: text(),
            keys: cache_keys(),
            invalidation_ts: any::<i64>()
        })
        .prop_map(Row::from),
        row!(DeviceListsRow {
            user_id: text(),
            is_signature: any::<bool>(),
            hosts_calculated: prop::option::of(any::<bool>())
        })
        // Rows without hosts_calculated (Synapse 1.109 and older) end there.
        .prop_map(|mut row| {
            if row.hosts_calculated.is_none() {
                row.extra.clear();
            }
            Row::from(row)
        }),
        row!(ToDeviceRow { entity: text() }).prop_map(Row::from),
        row!(FederationRow {
            row_type: text(),
            data: raw_json()
        })
        .prop_map(Row::from),
        row!(AccountDataRow {
            user_id: text(),
            room_id: opt_text(),
            data_type: text()
        })
        .prop_map(Row::from),
        row!(ProfileUpdatesRow {
            user_id: text(),
            action: text(),
            affected_fields: prop::option::of(texts())
        })
        .prop_map(Row::from),
        row!(StickyEventsRow {
            room_id: text(),
            event_id: text()
        })
        .prop_map(Row::from),
        row!(ThreadSubscriptionsRow {
            user_id: text(),
            room_id: text(),
            event_id: text()
        })
        .prop_map(Row::from),
        row!(UnPartialStatedRoomRow { room_id: text() }).prop_map(Row::from),
        row!(UnPartialStatedEventRow {
            event_id: text(),
            rejection_status_changed: any::<bool>()
        })
        .prop_map(Row::from),
        row!(QuarantinedMediaRow {
            origin: opt_text(),
            media_id: text(),
            quarantined: any::<bool>()
        })
        .prop_map(Row::from),
    ]
}

/// encode -> decode gives the row back, and its bytes are a fixed point.
fn check_round_trip(row: &Row) -> Result<(), TestCaseError> {
    let encoded = row.encode().unwrap();
    prop_assert!(encoded.as_bytes().is_ascii(), "Synapse writes ASCII only");
    let decoded = Row::decode(&row.stream(), &encoded).unwrap();
    prop_assert_eq!(&decoded, row);
    prop_assert_eq!(decoded.encode().unwrap(), encoded.clone());
    // The typed path and the generic JSON path agree on the value.
    let value: Value = serde_json::from_slice(encoded.as_bytes()).unwrap();
    prop_assert_eq!(&value, &as_value(row));
    // Synapse re-encoding the same value would write the same bytes.
    prop_assert_eq!(encoded.canonical().unwrap(), encoded);
    Ok(())
}

/// The rows of every stream in turn, with generic shapes: decoding never
/// panics, and a row that decodes round trips.
fn check_any_json(value: &Value) -> Result<(), TestCaseError> {
    let text = serde_json::to_vec(value).unwrap();
    let raw = RawRow::new(Bytes::from(text)).unwrap();
    for stream in StreamName::KNOWN {
        if let Ok(row) = Row::decode(stream, &raw) {
            let encoded = row.encode().unwrap();
            let again = Row::decode(stream, &encoded).unwrap();
            prop_assert_eq!(&again, &row);
            prop_assert_eq!(again.encode().unwrap(), encoded);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2048,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_row_type_round_trips(row in any_row()) {
        check_round_trip(&row)?;
    }

    #[test]
    fn sqlite_booleans_read_as_postgres_ones(
        (user_id, is_signature, hosts_calculated) in (text(), any::<bool>(), any::<bool>())
    ) {
        let sqlite = serde_json::to_string(
            &(&user_id, u8::from(is_signature), u8::from(hosts_calculated)),
        ).unwrap();
        let row = DeviceListsRow::decode(&raw(&sqlite)).unwrap();
        prop_assert_eq!(
            row.clone(),
            DeviceListsRow {
                user_id,
                is_signature,
                hosts_calculated: Some(hosts_calculated),
                extra: vec![],
            }
        );
        let postgres = row.encode().unwrap();
        prop_assert_eq!(DeviceListsRow::decode(&postgres).unwrap(), row);
    }

    #[test]
    fn arbitrary_rows_never_panic_and_round_trip(
        fields in prop::collection::vec(json_value(), 0..10),
        inner in prop::collection::vec(json_value(), 0..11),
        type_id in prop_oneof![Just("ev"), Just("state"), Just("state-all"), Just("x")],
    ) {
        check_any_json(&Value::Array(fields.clone()))?;
        check_any_json(&json!([type_id, inner]))?;
    }
}
