//! The Synapse test rig (`tests/synapse/rig.py`, `tests/common/synapse.rs`)
//! against a real Synapse 1.163.2: the client API works end to end, and
//! Synapse's replication traffic on the rig's Redis is what this crate
//! decodes and re-encodes byte for byte.
//!
//! Needs the venv `scripts/test.sh` creates (or `$SYNAPSE_PYTHON`) and
//! `redis-server` on PATH; without them these tests fail, they do not skip.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::synapse::SynapseRig;
use serde_json::{Value, json};
use synapse_replication::resp::{
    Frame, Incoming, RespDecoder, SubscriptionKind, encode_publish, encode_subscribe,
};
use synapse_replication::wire::{Command, RdataToken, StreamName};

const NON_ASCII: &str = "héllo ✓ 🐈";

#[test]
fn client_api_smoke() {
    let rig = SynapseRig::start();
    eprintln!("rig: {}", rig.info);
    eprintln!("startup: {:.2?}", rig.startup);

    let alice = rig.register("alice", "alice-password");
    let bob = rig.register("bob", "bob-password");
    let (alice_id, bob_id) = (rig.user_id("alice"), rig.user_id("bob"));
    assert_eq!(
        rig.get(&alice, "/_matrix/client/v3/account/whoami")["user_id"],
        json!(alice_id)
    );

    let room = rig.create_room(&alice);
    rig.join_room(&bob, &room);
    let event = rig.send_message(&alice, &room, NON_ASCII);

    // Bob reads it back, exactly.
    let messages = rig.messages(&bob, &room, 10);
    let found = messages["chunk"]
        .as_array()
        .expect("a chunk")
        .iter()
        .find(|candidate| candidate["event_id"] == json!(event))
        .unwrap_or_else(|| panic!("{event} not in /messages: {messages}"));
    assert_eq!(found["content"]["body"], json!(NON_ASCII));
    assert_eq!(found["sender"], json!(alice_id));
    // And over /sync.
    let sync = rig.sync(&bob, None);
    let timeline = &sync["rooms"]["join"][&room]["timeline"]["events"];
    assert!(
        timeline.as_array().is_some_and(|events| events
            .iter()
            .any(|e| e["content"]["body"] == json!(NON_ASCII))),
        "message not in bob's /sync timeline: {timeline}"
    );

    rig.set_typing(&bob, &room, &bob_id, true);
    rig.send_receipt(&bob, &room, &event);
    rig.set_typing(&bob, &room, &bob_id, false);

    rig.set_presence(&alice, &alice_id, "online", Some(NON_ASCII));
    let presence = rig.get_presence(&bob, &alice_id);
    assert_eq!(presence["presence"], json!("online"), "{presence}");
    assert_eq!(presence["status_msg"], json!(NON_ASCII), "{presence}");

    let data = json!({"text": NON_ASCII, "n": 1});
    rig.put_account_data(&alice, &alice_id, "org.example.rig", &data);
    assert_eq!(
        rig.get_account_data(&alice, &alice_id, "org.example.rig"),
        data
    );

    // The catch-up endpoint answers with the replication secret, and has
    // the message's row.
    let (status, updates) = rig.replication_get(&format!(
        "/_synapse/replication/get_repl_stream_updates/events/{}?from_token=0&upto_token=1000000",
        rig.txn_id()
    ));
    assert_eq!(status, 200, "{updates}");
    assert!(updates.to_string().contains(&event), "{updates}");

    rig.assert_no_errors_logged();
}

/// A raw RESP2 connection to the rig's Redis.
struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    decoder: RespDecoder,
}

impl Conn {
    fn connect(port: u16) -> Conn {
        let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect to redis");
        stream
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        Conn {
            stream,
            buf: BytesMut::new(),
            decoder: RespDecoder::new(),
        }
    }

    fn send(&mut self, write: impl FnOnce(&mut BytesMut)) {
        let mut out = BytesMut::new();
        write(&mut out);
        self.stream.write_all(&out).expect("write to redis");
    }

    /// The next frame, or None after `patience` without one.
    fn incoming(&mut self, patience: Duration) -> Option<Incoming> {
        let deadline = Instant::now() + patience;
        loop {
            if let Some(incoming) = self
                .decoder
                .decode_pubsub(&mut self.buf)
                .expect("valid RESP")
            {
                return Some(incoming);
            }
            if Instant::now() >= deadline {
                return None;
            }
            let mut chunk = [0; 16384];
            match self.stream.read(&mut chunk) {
                Ok(0) => panic!("redis closed the connection"),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(error)
                    if matches!(
                        error.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(error) => panic!("reading from redis: {error}"),
            }
        }
    }
}

/// Reads Synapse's lines off the subscriber until `done` says so (or the
/// deadline passes: then panics with what arrived). Every line must decode,
/// and re-encode to exactly its bytes.
fn read_until(
    subscriber: &mut Conn,
    channel: &str,
    seen: &mut Vec<Command>,
    what: &str,
    mut done: impl FnMut(&[Command]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done(seen) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; got {} commands:\n{}",
            seen.len(),
            seen.iter()
                .map(|command| format!("{command:?}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        let Some(incoming) = subscriber.incoming(Duration::from_millis(500)) else {
            continue;
        };
        let Incoming::Message(message) = incoming else {
            panic!("the subscriber got {incoming:?}");
        };
        assert_eq!(message.channel.as_ref(), channel.as_bytes());
        let line = message.payload.clone();
        let command = Command::decode(line.clone())
            .unwrap_or_else(|error| panic!("Synapse published {line:?}: {error}"))
            .unwrap_or_else(|| panic!("Synapse published a blank line {line:?}"));
        assert_eq!(
            command.to_bytes().expect("re-encodes"),
            line,
            "re-encoding {command:?}"
        );
        seen.push(command);
    }
}

/// Master's POSITIONs (prev == new) per stream.
fn announced(seen: &[Command]) -> BTreeMap<String, i64> {
    seen.iter()
        .filter_map(|command| match command {
            Command::Position(position)
                if position.instance.is_master() && position.prev_token == position.new_token =>
            {
                Some((
                    position.stream.as_str().to_owned(),
                    position.new_token.get(),
                ))
            }
            _ => None,
        })
        .collect()
}

/// What master announces on REPLICATE in this configuration (monolith,
/// presence on, Redis): every stream but `federation`, which master writes
/// only when a federation sender worker sends federation for it.
const MASTER_STREAMS: [&str; 18] = [
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
    "account_data",
    "profile_updates",
    "sticky_events",
    "thread_subscriptions",
    "un_partial_stated_room",
    "un_partial_stated_event",
    "quarantined_media",
];

#[test]
fn redis_replication_traffic() {
    let rig = SynapseRig::start();
    eprintln!("startup: {:.2?}", rig.startup);
    let channel = rig.server_name.clone();

    let mut subscriber = Conn::connect(rig.redis_port);
    subscriber.send(|out| encode_subscribe(out, &[channel.as_bytes()]));
    match subscriber.incoming(Duration::from_secs(10)) {
        Some(Incoming::Subscription {
            kind: SubscriptionKind::Subscribe,
            channel: Some(confirmed),
            count: 1,
        }) if confirmed.as_ref() == channel.as_bytes() => {}
        other => panic!("expected the SUBSCRIBE confirmation, got {other:?}"),
    }

    // REPLICATE as Synapse writes it, with the trailing space.
    let mut publisher = Conn::connect(rig.redis_port);
    publisher.send(|out| encode_publish(out, channel.as_bytes(), b"REPLICATE "));
    match publisher.incoming(Duration::from_secs(10)) {
        // Synapse's subscriber and ours.
        Some(Incoming::Frame(Frame::Integer(receivers))) => assert_eq!(receivers, 2),
        other => panic!("expected PUBLISH's receiver count, got {other:?}"),
    }

    let mut seen = Vec::new();
    read_until(
        &mut subscriber,
        &channel,
        &mut seen,
        "master's POSITIONs",
        |seen| {
            let streams = announced(seen);
            MASTER_STREAMS
                .iter()
                .all(|stream| streams.contains_key(*stream))
        },
    );
    assert!(
        seen.contains(&Command::Replicate),
        "our own REPLICATE comes back to us"
    );
    let streams = announced(&seen);
    eprintln!("master announced {} streams on REPLICATE:", streams.len());
    for (stream, token) in &streams {
        eprintln!("  POSITION {stream} master {token} {token}");
    }
    let expected: BTreeSet<&str> = MASTER_STREAMS.into_iter().collect();
    let got: BTreeSet<&str> = streams.keys().map(String::as_str).collect();
    assert_eq!(got, expected);
    for stream in &got {
        assert!(
            StreamName::new(stream).is_known(),
            "{stream} is not a stream this crate knows"
        );
    }

    // A message makes master publish its events row.
    let alice = rig.register("alice", "alice-password");
    let room = rig.create_room(&alice);
    let event = rig.send_message(&alice, &room, NON_ASCII);
    read_until(
        &mut subscriber,
        &channel,
        &mut seen,
        "RDATA events for the message",
        |seen| {
            seen.iter().any(|command| {
                matches!(command, Command::Rdata(rdata)
                    if rdata.stream == StreamName::Events
                        && rdata.instance.is_master()
                        && rdata.row.as_str().contains(&event))
            })
        },
    );
    let rdata = seen
        .iter()
        .find_map(|command| match command {
            Command::Rdata(rdata) if rdata.row.as_str().contains(&event) => Some(rdata),
            _ => None,
        })
        .expect("found above");
    eprintln!(
        "RDATA {} {} {:?} {}",
        rdata.stream.as_str(),
        rdata.instance.as_str(),
        rdata.token,
        rdata.row.as_str()
    );
    assert!(matches!(rdata.token, RdataToken::At(_)), "{rdata:?}");
    let row: Value = rdata.row.parse().expect("the row is JSON");
    assert_eq!(row[0], json!("ev"));
    assert_eq!(row[1][0], json!(event));
    assert_eq!(row[1][1], json!(room));
    assert_eq!(row[1][2], json!("m.room.message"));

    // Typing, receipts, presence (a non-ASCII status: Synapse writes it as
    // \u escapes, which must re-encode byte for byte) and account data:
    // each makes master publish a row of its stream.
    let alice_id = rig.user_id("alice");
    rig.set_typing(&alice, &room, &alice_id, true);
    rig.send_receipt(&alice, &room, &event);
    rig.set_presence(&alice, &alice_id, "online", Some(NON_ASCII));
    rig.put_account_data(
        &alice,
        &alice_id,
        "org.example.rig",
        &json!({"text": NON_ASCII}),
    );
    let wanted = ["typing", "receipts", "presence", "account_data"];
    read_until(
        &mut subscriber,
        &channel,
        &mut seen,
        "RDATA typing, receipts, presence and account_data",
        |seen| {
            wanted.iter().all(|stream| {
                seen.iter().any(|command| {
                    matches!(command, Command::Rdata(rdata)
                        if rdata.stream.as_str() == *stream
                            && rdata.instance.is_master()
                            // Registration already wrote an `offline` row.
                            && (*stream != "presence" || rdata.row.as_str().contains("online")))
                })
            })
        },
    );
    for stream in wanted {
        for command in &seen {
            let Command::Rdata(rdata) = command else {
                continue;
            };
            if rdata.stream.as_str() != stream {
                continue;
            }
            eprintln!(
                "RDATA {} {} {:?} {}",
                rdata.stream.as_str(),
                rdata.instance.as_str(),
                rdata.token,
                rdata.row.as_str()
            );
        }
    }
    let presence = seen
        .iter()
        .find_map(|command| match command {
            Command::Rdata(rdata)
                if rdata.stream == StreamName::Presence
                    && rdata.row.as_str().contains("online") =>
            {
                Some(rdata)
            }
            _ => None,
        })
        .expect("found above");
    assert!(
        presence
            .row
            .as_str()
            .contains(r"h\u00e9llo \u2713 \ud83d\udc08"),
        "Synapse escapes non-ASCII: {}",
        presence.row.as_str()
    );
    let row: Value = presence.row.parse().expect("the row is JSON");
    assert!(row.to_string().contains(NON_ASCII), "{row}");

    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for command in &seen {
        let key = match command {
            Command::Rdata(rdata) => format!("RDATA {}", rdata.stream.as_str()),
            Command::Position(position) => format!("POSITION {}", position.stream.as_str()),
            other => format!("{:?}", other.kind()),
        };
        *kinds.entry(key).or_default() += 1;
    }
    eprintln!("everything Synapse published: {kinds:?}");
    for command in &seen {
        if !matches!(command, Command::Rdata(_) | Command::Position(_)) {
            eprintln!(
                "  also: {}",
                String::from_utf8_lossy(&command.to_bytes().expect("encodes"))
            );
        }
    }

    rig.assert_no_errors_logged();
}
