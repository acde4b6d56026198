//! Properties of the wire codec: encode -> decode gives the command back,
//! and decode -> encode is the identity on Synapse's canonical lines.

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::Value;
use synapse_replication::ByteString;
use synapse_replication::wire::{
    Command, FederationAck, InstanceName, LockReleased, Position, RawRow, Rdata, RdataToken,
    StreamName, Token, UserIp, UserSync,
};

/// A space-separated field: non-empty, no space, no newline.
fn name() -> impl Strategy<Value = String> {
    "[^ \n]{1,24}"
}

/// Free text ending a line: anything but a newline.
fn text() -> impl Strategy<Value = ByteString> {
    "[^\n]{0,40}".prop_map(ByteString::from)
}

fn token() -> impl Strategy<Value = Token> {
    prop_oneof![0..1000i64, any::<i64>()].prop_map(Token)
}

fn stream() -> impl Strategy<Value = StreamName> {
    prop_oneof![
        prop::sample::select(StreamName::KNOWN.to_vec()),
        name().prop_map(|name| StreamName::from(name.as_str())),
    ]
}

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(("[a-z]{0,6}", inner), 0..6)
                .prop_map(|entries| Value::Object(entries.into_iter().collect())),
        ]
    })
}

fn command() -> impl Strategy<Value = Command> {
    let instance = || name().prop_map(InstanceName::from);
    prop_oneof![
        text().prop_map(Command::Server),
        text().prop_map(Command::Error),
        text().prop_map(Command::Ping),
        text().prop_map(Command::Name),
        Just(Command::Replicate),
        text().prop_map(Command::RemoteServerUp),
        text().prop_map(Command::NewActiveTask),
        text().prop_map(Command::CancelTask),
        text().prop_map(|text| Command::ClearUserSync(InstanceName::from(text))),
        (stream(), instance(), prop::option::of(token()), json()).prop_map(
            |(stream, instance, token, row)| {
                Command::Rdata(Rdata {
                    stream,
                    instance,
                    token: token.map_or(RdataToken::Batch, RdataToken::At),
                    row: RawRow::from_value(&row).expect("finite JSON encodes"),
                })
            }
        ),
        (stream(), instance(), token(), token()).prop_map(|(stream, instance, prev, new)| {
            Command::Position(Position {
                stream,
                instance,
                prev_token: prev,
                new_token: new,
            })
        }),
        (
            instance(),
            name(),
            prop::option::of(name().prop_filter("None reads back as no device", |d| d != "None")),
            any::<bool>(),
            any::<i64>()
        )
            .prop_map(|(instance_id, user, device, is_syncing, last_sync_ms)| {
                Command::UserSync(UserSync {
                    instance_id,
                    user_id: user.into(),
                    device_id: device.map(ByteString::from),
                    is_syncing,
                    last_sync_ms,
                })
            }),
        (instance(), token()).prop_map(|(instance, token)| Command::FederationAck(FederationAck {
            instance,
            token
        })),
        (
            name(),
            ".{0,20}",
            ".{0,20}",
            ".{0,40}",
            prop::option::of(".{0,10}"),
            any::<i64>()
        )
            .prop_map(|(user, token, ip, agent, device, last_seen)| {
                Command::UserIp(Box::new(UserIp {
                    user_id: user.into(),
                    access_token: token.into(),
                    ip: ip.into(),
                    user_agent: agent.into(),
                    device_id: device.map(ByteString::from),
                    last_seen,
                }))
            }),
        (".{0,20}", ".{0,20}", ".{0,20}").prop_map(|(instance, lock_name, lock_key)| {
            Command::LockReleased(LockReleased {
                instance: InstanceName::from(instance),
                lock_name: lock_name.into(),
                lock_key: lock_key.into(),
            })
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn encode_then_decode_gives_the_command_back(command in command()) {
        let line = command.to_bytes().expect("generated commands encode");
        prop_assert!(!line.contains(&b'\n'));
        let decoded = Command::decode(line.clone()).expect("decodes").expect("not blank");
        prop_assert_eq!(&decoded, &command);
        // And the encoding is the identity on the canonical line.
        prop_assert_eq!(decoded.to_bytes().expect("re-encodes"), line);
    }

    #[test]
    fn rows_written_here_are_already_canonical(value in json()) {
        let row = RawRow::from_value(&value).expect("finite JSON encodes");
        // Big floats that stand for integers are refused by `canonical`;
        // everything else must come back unchanged.
        if let Ok(canonical) = row.canonical() {
            prop_assert_eq!(canonical.as_bytes(), row.as_bytes());
        }
        prop_assert!(row.as_bytes().is_ascii(), "non-ASCII is escaped");
    }

    #[test]
    fn any_bytes_decode_or_fail_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = Command::decode(Bytes::from(bytes));
    }

    #[test]
    fn mangled_canonical_lines_never_panic(
        command in command(),
        cut in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let line = command.to_bytes().expect("encodes").to_vec();
        let at = cut.index(line.len() + 1);
        let mut truncated = line.clone();
        truncated.truncate(at);
        let _ = Command::decode(Bytes::from(truncated));
        let mut flipped = line;
        if at < flipped.len() {
            flipped[at] = byte;
        }
        if let Ok(Some(decoded)) = Command::decode(Bytes::from(flipped)) {
            // Decoding is at least as strict as encoding.
            prop_assert!(decoded.to_bytes().is_ok(), "{:?} does not encode", decoded);
        }
    }
}
