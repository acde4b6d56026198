//! The traffic of `benches/e2e.sh` and of the Redis benchmarks: a busy
//! deployment's mix of replication commands, deterministic from a seed.
//! `flood` publishes it; `redis_session.rs` and `redis_client.rs` feed it
//! to the session and the client without redis-server.
//!
//! Each of them includes this file (`#[path = ...] mod mix;`) and uses part
//! of it.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use synapse_replication::config::StreamWriters;
use synapse_replication::positions::{Follower, Writer};
use synapse_replication::resp::Frame;
use synapse_replication::session::{RedisLink, RedisSession, RedisSessionConfig};
use synapse_replication::wire::{
    Command, FederationAck, InstanceName, LockReleased, RawRow, StreamName, Token, UserIp, UserSync,
};

/// The token every stream starts at.
pub const START: i64 = 1_000_000;

/// The streams of the mix, written by `master`.
pub fn streams() -> Vec<StreamName> {
    [
        "events",
        "caches",
        "receipts",
        "typing",
        "presence",
        "to_device",
        "device_lists",
        "account_data",
        "push_rules",
    ]
    .into_iter()
    .map(StreamName::from)
    .collect()
}

/// One thing the deployment does.
#[derive(Clone, Debug)]
pub enum Item {
    /// Rows of one token (several: a batch), and the stream's current
    /// token (above the rows' when other rows were not ours to send:
    /// a `POSITION` follows).
    Write {
        /// The stream.
        stream: StreamName,
        /// The rows' token.
        token: Token,
        /// The stream's token after the write.
        current: Token,
        /// The rows.
        rows: Vec<RawRow>,
    },
    /// A command for the application.
    Send(Command),
}

impl Item {
    /// The messages this item publishes.
    pub fn messages(&self) -> usize {
        match self {
            Item::Write {
                token,
                current,
                rows,
                ..
            } => rows.len() + usize::from(current > token),
            Item::Send(_) => 1,
        }
    }
}

/// A deterministic pseudo-random sequence.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }

    /// `len` characters of URL-safe base64, as Synapse's event ids.
    fn b64(&mut self, len: usize) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        (0..len)
            .map(|_| ALPHABET[self.below(64) as usize] as char)
            .collect()
    }
}

const USERS: &[&str] = &[
    "@alice:example.com",
    "@bob:example.com",
    "@carol.smith:example.com",
    "@dave:matrix.org",
    "@erin_1984:example.com",
    "@frank:remote.example.net",
    "@grace:example.com",
    "@heidi-bot:example.com",
];
const ROOMS: &[&str] = &[
    "!OGEhHVWSdvArJzumhm:matrix.org",
    "!cURbafjkfsMDVwdRDQ:example.com",
    "!kKLfCWPzZRkMhBJsvp:example.com",
    "!YTvKGNlinIzlPMQhIx:remote.example.net",
    "!hsZBSpnMrcmzwSDVPA:example.com",
];
const MSGTYPES: &[&str] = &[
    "m.room.message",
    "m.room.message",
    "m.reaction",
    "m.room.encrypted",
];
const CACHES: &[&str] = &[
    "get_user_by_id",
    "_get_state_group_for_events",
    "get_e2e_unused_fallback_key_types",
    "get_room_summary",
    "get_users_in_room",
];
const STATUS: &[&str] = &[
    "at lunch \\ud83c\\udf54",
    "In a meeting until 3pm",
    "On holiday \\u2014 back on Monday",
];
const AGENTS: &[&str] = &[
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Element/1.11.50 Chrome/120.0 Electron/28.0 Safari/537.36",
    "Element/1.11.50 (iPhone; iOS 17.1; Scale/3.00)",
    "curl/8.4.0",
];

fn row(text: String) -> RawRow {
    RawRow::new(Bytes::from(text)).expect("the mix's rows are JSON")
}

fn event_id(rng: &mut Lcg) -> String {
    format!("${}", rng.b64(43))
}

/// `count` messages of the mix (exactly), as items.
pub fn items(count: usize, seed: u64) -> Vec<Item> {
    let mut rng = Lcg(seed);
    let mut tokens: Vec<(StreamName, i64)> = streams().into_iter().map(|s| (s, START)).collect();
    let mut items = Vec::new();
    let mut left = count;
    let ts = 1_732_900_000_000_i64;
    while left > 0 {
        let roll = rng.below(1000);
        let now_ms = ts + (count - left) as i64;
        let item = match roll {
            // Application commands: one message each.
            0..40 => Item::Send(Command::UserSync(UserSync {
                instance_id: InstanceName::from(rng.pick(&["synchrotron1", "synchrotron2"])),
                user_id: rng.pick(USERS).into(),
                device_id: Some(rng.b64(10).to_uppercase().into()),
                is_syncing: rng.below(2) == 0,
                last_sync_ms: now_ms,
            })),
            40..75 => Item::Send(Command::UserIp(Box::new(UserIp {
                user_id: rng.pick(USERS).into(),
                access_token: format!("syt_{}_{}", rng.b64(8), rng.b64(20)).into(),
                ip: format!("203.0.113.{}", rng.below(250)).into(),
                user_agent: rng.pick(AGENTS).into(),
                device_id: Some(rng.b64(10).to_uppercase().into()),
                last_seen: now_ms,
            }))),
            75..85 => Item::Send(Command::FederationAck(FederationAck {
                instance: InstanceName::from("federation_sender1"),
                token: Token(START + (count - left) as i64),
            })),
            85..90 => Item::Send(Command::RemoteServerUp(
                rng.pick(&[
                    "matrix.org",
                    "remote.example.net:8448",
                    "xn--e1afmkfd.xn--p1ai",
                ])
                .into(),
            )),
            90..95 => Item::Send(Command::LockReleased(LockReleased {
                instance: InstanceName::from("event_persister1"),
                lock_name: "new_event_during_purge_lock".into(),
                lock_key: rng.pick(ROOMS).into(),
            })),
            // Stream writes.
            _ => {
                let (stream, rows) = stream_rows(&mut rng, roll, now_ms);
                // A batch must fit what is left (plus its POSITION).
                let rows = if rows.len() + 1 > left {
                    rows.into_iter().take(1).collect()
                } else {
                    rows
                };
                let entry = tokens
                    .iter_mut()
                    .find(|(s, _)| *s == stream)
                    .expect("a stream of the mix");
                let token = entry.1 + 1;
                // Now and then other rows took tokens: POSITION follows.
                let current = if left > rows.len() && rng.below(20) == 0 {
                    token + 1 + rng.below(3) as i64
                } else {
                    token
                };
                entry.1 = current;
                Item::Write {
                    stream,
                    token: Token(token),
                    current: Token(current),
                    rows,
                }
            }
        };
        left -= item.messages();
        items.push(item);
    }
    items
}

fn stream_rows(rng: &mut Lcg, roll: u64, now_ms: i64) -> (StreamName, Vec<RawRow>) {
    let room = rng.pick(ROOMS);
    let user = rng.pick(USERS);
    match roll {
        95..515 => {
            let mut rows = Vec::new();
            // One event in ten is a state event: its state row first.
            if rng.below(10) == 0 {
                let id = event_id(rng);
                rows.push(row(format!(
                    r#"["state",["{room}","m.room.member","{user}","{id}"]]"#
                )));
                rows.push(row(format!(
                    r#"["ev",["{id}","{room}","m.room.member","{user}",null,null,"join",false,false]]"#
                )));
            } else {
                let id = event_id(rng);
                let kind = rng.pick(MSGTYPES);
                let text = match rng.below(8) {
                    0 => format!(
                        r#"["ev",["{id}","{room}","m.room.redaction",null,"{}",null,null,false,false]]"#,
                        event_id(rng)
                    ),
                    1 => format!(
                        r#"["ev",["{id}","{room}","{kind}",null,null,"{}",null,false,false]]"#,
                        event_id(rng)
                    ),
                    _ => format!(
                        r#"["ev",["{id}","{room}","{kind}",null,null,null,null,false,false]]"#
                    ),
                };
                rows.push(row(text));
            }
            (StreamName::Events, rows)
        }
        515..700 => {
            let cache = rng.pick(CACHES);
            let text = match rng.below(4) {
                0 => format!(r#"["cs_cache_fake",["{room}","{user}"],{now_ms}]"#),
                1 => format!(r#"["{cache}",["{room}"],{now_ms}]"#),
                _ => format!(r#"["{cache}",["{user}"],{now_ms}]"#),
            };
            // Cache invalidations often come several at once.
            let n = if rng.below(6) == 0 { 2 } else { 1 };
            (StreamName::Caches, vec![row(text); n])
        }
        700..800 => {
            let id = event_id(rng);
            let text = if rng.below(4) == 0 {
                format!(
                    r#"["{room}","m.read.private","{user}","{id}","main",{{"ts":{now_ms},"thread_id":"main"}}]"#
                )
            } else {
                format!(r#"["{room}","m.read","{user}",["{id}"],null,{{"ts":{now_ms}}}]"#)
            };
            (StreamName::Receipts, vec![row(text)])
        }
        800..850 => {
            let other = rng.pick(USERS);
            (
                StreamName::Typing,
                vec![row(format!(r#"["{room}",["{user}","{other}"]]"#))],
            )
        }
        850..920 => {
            let status = if rng.below(3) == 0 {
                format!("\"{}\"", rng.pick(STATUS))
            } else {
                "null".to_owned()
            };
            let state = rng.pick(&["online", "unavailable", "offline"]);
            (
                StreamName::Presence,
                vec![row(format!(
                    r#"["{user}","{state}",{now_ms},{},{},{status},true]"#,
                    now_ms - 1000,
                    now_ms - 5,
                ))],
            )
        }
        920..950 => (StreamName::ToDevice, vec![row(format!(r#"["{user}"]"#))]),
        950..975 => (
            StreamName::DeviceLists,
            vec![row(format!(r#"["{user}",false,true]"#))],
        ),
        975..990 => (
            StreamName::AccountData,
            vec![row(format!(r#"["{user}","{room}","m.tag"]"#))],
        ),
        _ => (StreamName::PushRules, vec![row(format!(r#"["{user}"]"#))]),
    }
}

/// The registry of the mix: `master` writes every stream; everyone
/// writes `caches` (Redis).
pub fn registry() -> Arc<StreamWriters> {
    Arc::new(StreamWriters::default().with_redis(true))
}

/// What a crate writer named `master` publishes for `items`, as
/// (is `USER_IP`, line): `REPLICATE`, the announcement of every stream,
/// then the items. Built with an offline `Writer`.
pub fn lines(items: &[Item]) -> Vec<(bool, Bytes)> {
    let mut writer = Writer::new(InstanceName::master(), registry());
    for stream in streams() {
        writer
            .advance(&stream, Token(START))
            .expect("master writes the mix's streams");
    }
    // Every line in one buffer (then sliced): no allocation per line.
    let mut all = BytesMut::new();
    let mut spans = Vec::new();
    let mut add = |command: &Command| {
        let start = all.len();
        command.encode(&mut all).expect("the mix's commands encode");
        spans.push((matches!(command, Command::UserIp(_)), start, all.len()));
    };
    add(&Command::Replicate);
    writer.connected(Instant::now());
    for item in std::iter::once(None).chain(items.iter().map(Some)) {
        match item {
            Some(Item::Write {
                stream,
                token,
                current,
                rows,
            }) => writer
                .write(stream, *current, rows.iter().map(|r| (*token, r.clone())))
                .expect("the mix's writes are consistent"),
            Some(Item::Send(command)) => add(command),
            // The announcement, first.
            None => {}
        }
        while let Some(command) = writer.poll_command() {
            add(&command);
        }
    }
    let all = all.freeze();
    spans
        .into_iter()
        .map(|(user_ip, start, end)| (user_ip, all.slice(start..end)))
        .collect()
}

/// `lines` as Redis delivers them to a RESP2 subscriber of `channel`
/// and `channel/USER_IP`: one pub/sub `message` each.
pub fn messages(lines: &[(bool, Bytes)], channel: &str) -> Vec<u8> {
    let user_ip = format!("{channel}/USER_IP");
    let mut buf = BytesMut::new();
    for (is_user_ip, line) in lines {
        let channel = if *is_user_ip { &user_ip } else { channel };
        Frame::Array(vec![
            Frame::bulk("message"),
            Frame::bulk(channel.to_owned()),
            Frame::bulk(line.clone()),
        ])
        .encode(&mut buf)
        .expect("messages encode");
    }
    buf.to_vec()
}

pub fn encode(command: &Command) -> Bytes {
    let mut out = BytesMut::new();
    command.encode(&mut out).expect("the mix's commands encode");
    out.freeze()
}

/// A session as `drain` has it once ready: subscribed to `channel` and its
/// `USER_IP` channel, both links up, nothing left to poll.
pub fn ready_session(channel: &str, now: Instant) -> RedisSession {
    let mut options = RedisSessionConfig::new(channel);
    options.extra_channels = vec!["USER_IP".to_owned()];
    options.client_name = None;
    let me = InstanceName::from("drain");
    let mut session = RedisSession::new(
        options,
        Follower::new(me.clone(), registry()),
        Writer::new(me, registry()),
    );
    session.connect(RedisLink::Subscriber, now);
    session.connect(RedisLink::Publisher, now);
    let mut confirmations = BytesMut::new();
    for (index, name) in [channel.to_owned(), format!("{channel}/USER_IP")]
        .into_iter()
        .enumerate()
    {
        Frame::Array(vec![
            Frame::bulk("subscribe"),
            Frame::bulk(name),
            Frame::Integer(index as i64 + 1),
        ])
        .encode(&mut confirmations)
        .expect("confirmations encode");
    }
    session.handle_input(RedisLink::Subscriber, &confirmations, now);
    assert!(session.is_ready());
    for link in RedisLink::BOTH {
        while session.poll_transmit(link).is_some() {}
    }
    while session.poll_event().is_some() {}
    session
}
