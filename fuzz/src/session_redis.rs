//! Drives a Redis session with random operations: links connected and
//! lost, Redis' replies (from a small model of Redis that answers what
//! the session sent and echoes what it publishes, or arbitrary frames and
//! bytes) fed in random pieces, time steps, sends, writes, catch-up
//! answers, under small limits. After every step it checks what the
//! session promises:
//!
//! - nothing panics;
//! - `poll_timeout` is never before the last `now`, and handling a timeout
//!   at the deadline moves it strictly forward (no busy loop);
//! - every transmit is whole RESP commands (arrays of bulk strings) that a
//!   pub/sub client sends, the handshake first and in order, `PUBLISH`
//!   only on the publishing link, on `<prefix>` or `<prefix>/USER_IP` (and
//!   `USER_IP` only there), of a payload that decodes as a command;
//! - nothing is published before Redis has answered the whole handshake
//!   of every link and confirmed every channel;
//! - nothing is transmitted on a link from its `Closing` until it is
//!   connected again, and it is closed at most once;
//! - memory stays bounded: input buffered for an unfinished frame within
//!   the RESP limits, output within `max_unsent_bytes` (plus the handshake
//!   and `PING`s queued since the driver last took the output);
//! - counters agree with the events (connections, failures, ready) and
//!   `send` is accepted, queued or refused as documented.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use synapse_replication::config::{RedisAuth, StreamWriters};
use synapse_replication::positions::{
    CatchUpPage, CatchUpRequest, Follower, FollowerEvent, Writer,
};
use synapse_replication::resp::{self, Frame, Incoming, Limits};
use synapse_replication::session::{
    RedisEvent, RedisLink, RedisSession, RedisSessionConfig, SendError,
};
use synapse_replication::wire::{
    self, Command, CommandKind, InstanceName, RawRow, StreamName, Token,
};

const PREFIX: &str = "example.com";
const USER_IP_CHANNEL: &str = "example.com/USER_IP";
const MAX_UNSENT: usize = 700;
const MAX_LINE: usize = 200;
const LIMITS: Limits = Limits::new()
    .with_max_bulk_len(256)
    .with_max_elements(8)
    .with_max_depth(4)
    .with_max_line_len(64)
    .with_max_frame_len(600);
/// The most a handshake queues (HELLO with credentials and a name, SELECT,
/// SUBSCRIBE of two channels).
const HANDSHAKE_BYTES: usize = 256;
/// What one `PING` queues.
const PING_BYTES: usize = 14;

/// Replication lines Redis may carry.
const LINES: [&str; 24] = [
    "POSITION caches master 0 3",
    "POSITION typing master 5 5",
    "POSITION typing master 7 9",
    "POSITION caches worker2 4 6",
    "RDATA caches master batch [\"a\"]",
    "RDATA caches master 4 [\"b\",null]",
    "RDATA typing master 6 [\"!r\",[]]",
    "RDATA typing master 10 [\"!r\",[\"@a:x\"]]",
    "RDATA caches worker1 9 []",
    "POSITION caches worker1 1 9",
    "REPLICATE ",
    "REPLICATE",
    "USER_SYNC w @a:x d start 1",
    "CLEAR_USER_SYNC w",
    "FEDERATION_ACK w 3",
    "USER_IP @a:x [\"t\",\"1.2.3.4\",\"ua\",\"d\",5]",
    "REMOTE_SERVER_UP x.org",
    "LOCK_RELEASED [\"w\",\"l\",\"k\"]",
    "NEW_ACTIVE_TASK t",
    "ERROR oops",
    "PING 12",
    "RDATA typing",
    "",
    "POSITION events persister 1 2",
];

const ERRORS: [&str; 5] = [
    "ERR nope",
    "WRONGPASS invalid username-password pair",
    "NOPERM no permissions",
    "NOAUTH Authentication required.",
    "NOPROTO sorry",
];

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*first)
    }

    fn bytes(&mut self) -> Option<&[u8]> {
        let len = usize::from(self.byte()?).min(self.0.len());
        let (taken, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(taken)
    }
}

fn bulk(text: &str) -> Frame {
    Frame::bulk(Bytes::copy_from_slice(text.as_bytes()))
}

fn encoded(frame: &Frame) -> Vec<u8> {
    frame.to_bytes().unwrap().to_vec()
}

/// An array (RESP2) or a push (RESP3).
fn pubsub(items: Vec<Frame>, resp3: bool) -> Vec<u8> {
    encoded(&if resp3 {
        Frame::Push(items)
    } else {
        Frame::Array(items)
    })
}

fn message(channel: &str, payload: &str, resp3: bool) -> Vec<u8> {
    pubsub(vec![bulk("message"), bulk(channel), bulk(payload)], resp3)
}

fn hello_map() -> Vec<u8> {
    encoded(&Frame::Map(vec![
        (bulk("server"), bulk("redis")),
        (bulk("version"), bulk("7.2.4")),
        (bulk("proto"), Frame::Integer(3)),
    ]))
}

fn index(link: RedisLink) -> usize {
    match link {
        RedisLink::Subscriber => 0,
        RedisLink::Publisher => 1,
    }
}

/// A command as its arguments.
type Args = Vec<Vec<u8>>;

/// The harness's view of one link, and Redis' side of it.
#[derive(Default)]
struct LinkModel {
    connected: bool,
    /// `Closing` was reported; `disconnected` not called yet.
    closing: bool,
    /// The socket takes nothing: output stays queued.
    blocked: bool,
    /// Everything queued was taken at the end of the last step, so what is
    /// transmitted now was produced by this step.
    fresh: bool,
    /// This connection said `HELLO 3`.
    resp3: bool,
    /// Reply frames the session needs before this link is usable.
    needed: usize,
    /// Handshake commands (and channels) transmitted on this connection.
    handshake_sent: usize,
    /// The rank of the last command transmitted (handshake order).
    rank: u8,
    /// Commands transmitted and not answered by the model yet.
    owed: VecDeque<Args>,
    /// Channels the model confirmed on this connection.
    subscribed: Vec<String>,
    /// Decodes what is fed, as the session does, to count replies.
    mirror: resp::RespDecoder,
    mirror_buf: BytesMut,
    mirror_broken: bool,
    replies_fed: usize,
    /// Bytes queued other than publishes since the output was last taken.
    extra: usize,
    connects: u64,
    closings: u64,
}

impl LinkModel {
    fn reset(&mut self) {
        let connects = self.connects;
        let closings = self.closings;
        let blocked = self.blocked;
        *self = LinkModel {
            connects,
            closings,
            blocked,
            mirror: resp::RespDecoder::with_limits(LIMITS),
            // A new connection's output is all produced from now on.
            fresh: true,
            ..LinkModel::default()
        };
    }

    /// Counts the replies in `bytes` as the session will see them.
    fn mirror(&mut self, bytes: &[u8]) {
        if self.mirror_broken {
            return;
        }
        self.mirror_buf.extend_from_slice(bytes);
        loop {
            match self.mirror.decode_pubsub(&mut self.mirror_buf) {
                Ok(Some(Incoming::Message(_) | Incoming::Frame(Frame::Push(_)))) => {}
                Ok(Some(_)) => self.replies_fed += 1,
                Ok(None) => break,
                Err(_) => {
                    self.mirror_broken = true;
                    break;
                }
            }
        }
    }
}

struct Harness {
    now: Instant,
    session: RedisSession,
    links: [LinkModel; 2],
    /// Messages Redis has to deliver to the subscriber.
    deliveries: Vec<u8>,
    catch_ups: Vec<CatchUpRequest>,
    readies: u64,
    /// Call `disconnected` as soon as `Closing` is seen (else later).
    prompt: bool,
    auth: u8,
    database: bool,
    name: bool,
    channels: usize,
    token: i64,
}

impl Harness {
    fn link(&mut self, link: RedisLink) -> &mut LinkModel {
        &mut self.links[index(link)]
    }

    fn two_links(&self) -> bool {
        self.session.wants(RedisLink::Publisher)
    }

    /// Replies a link needs before it is usable, as `connect` will queue
    /// them now.
    fn needed(&self, link: RedisLink) -> usize {
        let resp3 = link == RedisLink::Subscriber && !self.two_links();
        let mut needed = 0;
        if resp3 || self.auth != 0 {
            needed += 1;
        }
        if self.database {
            needed += 1;
        }
        if !resp3 && self.name {
            needed += 1;
        }
        if link == RedisLink::Subscriber {
            needed += self.channels;
        }
        needed
    }

    fn connect(&mut self, link: RedisLink) {
        let needed = self.needed(link);
        if link == RedisLink::Subscriber {
            self.deliveries.clear();
        }
        let model = self.link(link);
        model.reset();
        model.connected = true;
        model.needed = needed;
        model.extra = HANDSHAKE_BYTES;
        model.connects += 1;
        self.session.connect(link, self.now);
        self.drain();
    }

    fn disconnect(&mut self, link: RedisLink) {
        if link == RedisLink::Subscriber {
            self.deliveries.clear();
        }
        self.link(link).reset();
        self.session.disconnected(link, self.now);
    }

    fn feed(&mut self, link: RedisLink, bytes: &[u8]) {
        if self.links[index(link)].connected {
            self.link(link).mirror(bytes);
        }
        self.session.handle_input(link, bytes, self.now);
        // Input runs the timers: a PING may be queued on each link.
        for model in &mut self.links {
            model.extra += PING_BYTES;
        }
        self.drain();
    }

    /// Feeds `bytes` in pieces cut at the positions `input` picks.
    fn feed_split(&mut self, link: RedisLink, bytes: &[u8], input: &mut Input<'_>) {
        let mut rest = bytes;
        let pieces = input.byte().unwrap_or(0) % 4;
        for _ in 0..pieces {
            let cut = usize::from(input.byte().unwrap_or(0)) % (rest.len() + 1);
            let (piece, tail) = rest.split_at(cut);
            self.feed(link, piece);
            rest = tail;
        }
        self.feed(link, rest);
    }

    /// Redis' answer to `command`, correct unless `twist` says otherwise.
    fn reply(&mut self, link: RedisLink, command: &Args, twist: u8) -> Vec<u8> {
        if twist.is_multiple_of(16) {
            let text = ERRORS[usize::from(twist / 16) % ERRORS.len()];
            return encoded(&Frame::Error(Bytes::copy_from_slice(text.as_bytes())));
        }
        let resp3 = self.links[index(link)].resp3;
        match command[0].as_slice() {
            b"AUTH" | b"SELECT" | b"CLIENT" => b"+OK\r\n".to_vec(),
            b"HELLO" => {
                self.link(link).resp3 = true;
                hello_map()
            }
            b"SUBSCRIBE" => {
                let mut out = Vec::new();
                for (count, channel) in command[1..].iter().enumerate() {
                    let channel = String::from_utf8_lossy(channel).into_owned();
                    out.extend(pubsub(
                        vec![
                            bulk("subscribe"),
                            bulk(&channel),
                            Frame::Integer(count as i64 + 1),
                        ],
                        resp3,
                    ));
                    self.link(link).subscribed.push(channel);
                }
                out
            }
            b"PING" if link == RedisLink::Subscriber && !resp3 => {
                pubsub(vec![bulk("pong"), bulk("")], false)
            }
            b"PING" => b"+PONG\r\n".to_vec(),
            b"PUBLISH" => {
                // Redis delivers it to the subscriber, this one included.
                let channel = String::from_utf8_lossy(&command[1]).into_owned();
                let subscriber = &self.links[0];
                let delivered = subscriber.subscribed.contains(&channel);
                if delivered {
                    let payload = String::from_utf8_lossy(&command[2]).into_owned();
                    let frame = message(&channel, &payload, subscriber.resp3);
                    self.deliveries.extend(frame);
                }
                encoded(&Frame::Integer(i64::from(delivered)))
            }
            _ => b"-ERR unknown command\r\n".to_vec(),
        }
    }

    /// Checks one transmitted chunk and hands its commands to the model.
    fn transmitted(&mut self, link: RedisLink, bytes: &Bytes) {
        assert!(!bytes.is_empty(), "an empty transmit");
        let two_links = self.two_links();
        let mut buf = BytesMut::from(&bytes[..]);
        let mut decoder = resp::RespDecoder::new();
        while let Some(frame) = decoder.decode(&mut buf).expect("the session sends RESP") {
            let Frame::Array(items) = frame else {
                panic!("a command is an array: {frame:?}");
            };
            let command: Args = items
                .into_iter()
                .map(|item| match item {
                    Frame::BulkString(bytes) => bytes.to_vec(),
                    other => panic!("a command argument is a bulk string: {other:?}"),
                })
                .collect();
            let name = command.first().expect("a command has a name").clone();
            let rank = match name.as_slice() {
                b"HELLO" | b"AUTH" => 0,
                b"SELECT" => 1,
                b"CLIENT" => 2,
                b"SUBSCRIBE" => 3,
                b"PING" | b"PUBLISH" => 4,
                other => panic!("unexpected command {:?}", String::from_utf8_lossy(other)),
            };
            let model = &mut self.links[index(link)];
            assert!(
                rank >= model.rank && (rank == 4 || rank > model.rank || model.handshake_sent == 0),
                "handshake out of order on {link}: {:?}",
                String::from_utf8_lossy(&name)
            );
            model.rank = rank;
            match name.as_slice() {
                b"SUBSCRIBE" => {
                    assert_eq!(link, RedisLink::Subscriber, "SUBSCRIBE on the publisher");
                    let channels: Vec<&[u8]> = command[1..].iter().map(Vec::as_slice).collect();
                    assert_eq!(channels.first(), Some(&PREFIX.as_bytes()));
                    model.handshake_sent += channels.len();
                }
                b"HELLO" => {
                    assert_eq!(link, RedisLink::Subscriber, "HELLO on the publisher");
                    assert_eq!(command.get(1).map(Vec::as_slice), Some(&b"3"[..]));
                    model.handshake_sent += 1;
                }
                b"AUTH" | b"SELECT" | b"CLIENT" => model.handshake_sent += 1,
                _ => {
                    assert_eq!(
                        model.handshake_sent, model.needed,
                        "the handshake on {link} is not what the options ask for"
                    );
                }
            }
            if name == b"PUBLISH" {
                assert_eq!(command.len(), 3, "PUBLISH channel payload");
                let channel = command[1].as_slice();
                assert!(
                    channel == PREFIX.as_bytes() || channel == USER_IP_CHANNEL.as_bytes(),
                    "published on {:?}",
                    String::from_utf8_lossy(channel)
                );
                let line = Bytes::copy_from_slice(&command[2]);
                let published = wire::Decoder::new()
                    .max_line_len(MAX_LINE)
                    .decode(line)
                    .expect("a published line decodes")
                    .expect("a published line is not blank");
                let kind = published.kind();
                assert_eq!(
                    kind == CommandKind::UserIp,
                    channel == USER_IP_CHANNEL.as_bytes(),
                    "{kind} published on the wrong channel"
                );
                assert!(!matches!(kind, CommandKind::Server | CommandKind::Name));
                let publisher = if two_links {
                    RedisLink::Publisher
                } else {
                    RedisLink::Subscriber
                };
                assert_eq!(link, publisher, "published on the wrong link");
                if model.fresh {
                    // Published during this step: every handshake reply
                    // and confirmation must have arrived.
                    let subscriber = &self.links[0];
                    assert!(
                        subscriber.replies_fed >= subscriber.needed,
                        "published before the subscription was confirmed"
                    );
                    if two_links {
                        let publisher = &self.links[1];
                        assert!(
                            publisher.replies_fed >= publisher.needed,
                            "published before the publisher's handshake was answered"
                        );
                    }
                }
            }
            let model = &mut self.links[index(link)];
            if model.owed.len() < 256 {
                model.owed.push_back(command);
            }
        }
        assert!(buf.is_empty(), "a transmit holds whole commands");
    }

    /// What a driver does after every input: transmits, events (closing
    /// links as told), the deadline; then the invariants.
    fn drain(&mut self) {
        loop {
            let mut sent = [false; 2];
            for link in RedisLink::BOTH {
                if self.links[index(link)].blocked {
                    self.link(link).fresh = false;
                    continue;
                }
                while let Some(bytes) = self.session.poll_transmit(link) {
                    let model = &self.links[index(link)];
                    assert!(model.connected, "transmit on {link}, not connected");
                    assert!(!model.closing, "transmit on {link} after Closing");
                    sent[index(link)] = true;
                    self.transmitted(link, &bytes);
                }
                let model = self.link(link);
                model.fresh = true;
                model.extra = 0;
            }
            let mut again = false;
            while let Some(event) = self.session.poll_event() {
                match event {
                    RedisEvent::Closing { link, .. } => {
                        let model = self.link(link);
                        assert!(model.connected, "Closing {link}, not connected");
                        assert!(!model.closing, "Closing {link} twice");
                        assert!(!sent[index(link)], "transmitted on {link} while closing");
                        model.closing = true;
                        model.closings += 1;
                        if self.prompt {
                            self.disconnect(link);
                            again = true;
                        }
                    }
                    RedisEvent::Ready => self.readies += 1,
                    RedisEvent::Follower(FollowerEvent::CatchUp(request))
                        if self.catch_ups.len() < 64 =>
                    {
                        self.catch_ups.push(request);
                    }
                    _ => {}
                }
            }
            if !again {
                break;
            }
        }
        self.check();
    }

    fn check(&self) {
        if let Some(deadline) = self.session.poll_timeout() {
            assert!(deadline >= self.now, "a deadline in the past");
        }
        let counters = self.session.counters();
        for link in RedisLink::BOTH {
            let model = &self.links[index(link)];
            assert_eq!(counters.connections[index(link)], model.connects);
            assert_eq!(counters.failures[index(link)], model.closings);
            assert_eq!(
                self.session.is_connected(link),
                model.connected && !model.closing
            );
            // A link given up buffers nothing; a live one stays within the
            // bound (plus its handshake and PINGs).
            let unsent = self.session.unsent_bytes(link);
            if model.closing {
                assert_eq!(unsent, 0, "{unsent} bytes unsent on {link}, given up");
            } else {
                assert!(
                    unsent <= MAX_UNSENT + model.extra,
                    "{unsent} bytes unsent on {link}"
                );
            }
        }
        assert_eq!(counters.ready, self.readies);
        assert_eq!(
            counters.closes.values().sum::<u64>(),
            counters.failures.iter().sum::<u64>(),
            "every connection given up has a reason"
        );
        let buffered = self.session.buffered_input();
        assert!(
            buffered <= LIMITS.max_frame_len + LIMITS.max_line_len + 32,
            "{buffered} bytes buffered"
        );
        if !self.links[0].connected || self.links[0].closing {
            assert_eq!(buffered, 0, "input kept for a link that is gone");
        }
    }

    /// A chunk of frames Redis might send, or arbitrary bytes.
    fn chunk(&mut self, input: &mut Input<'_>) -> Option<Vec<u8>> {
        let mut chunk = Vec::new();
        let count = input.byte()? % 4 + 1;
        for _ in 0..count {
            let kind = input.byte()?;
            let resp3 = kind & 0x80 != 0;
            let pick = usize::from(input.byte()?);
            let line = LINES[pick % LINES.len()];
            match kind % 16 {
                0 => chunk.extend_from_slice(b"+OK\r\n"),
                1 => chunk.extend(encoded(&Frame::Error(Bytes::from_static(
                    ERRORS[pick % ERRORS.len()].as_bytes(),
                )))),
                2 | 3 => {
                    let channel = if kind % 16 == 2 {
                        PREFIX
                    } else {
                        USER_IP_CHANNEL
                    };
                    chunk.extend(pubsub(
                        vec![bulk("subscribe"), bulk(channel), Frame::Integer(1)],
                        resp3,
                    ));
                }
                4..=6 => chunk.extend(message(PREFIX, line, resp3)),
                7 => chunk.extend(message(USER_IP_CHANNEL, line, resp3)),
                8 => chunk.extend(message("elsewhere", line, resp3)),
                9 => chunk.extend(pubsub(vec![bulk("pong"), bulk("")], false)),
                10 => chunk.extend_from_slice(b"+PONG\r\n"),
                11 => chunk.extend(encoded(&Frame::Integer(pick as i64))),
                12 => chunk.extend(hello_map()),
                13 => chunk.extend(pubsub(vec![bulk("invalidate"), bulk("key")], true)),
                14 => {
                    let huge = [
                        &b"$1000000000\r\n"[..],
                        b"*999999\r\n",
                        b"?\r\n",
                        b"*3\r\n$7\r\nmessage\r\n$11\r\nexample.com\r\n$300\r\n",
                    ];
                    chunk.extend_from_slice(huge[pick % huge.len()]);
                }
                _ => chunk.extend_from_slice(input.bytes()?),
            }
        }
        Some(chunk)
    }

    fn send(&mut self, input: &mut Input<'_>) -> Option<()> {
        let pick = usize::from(input.byte()?);
        let line = if pick & 0x80 != 0 {
            input.bytes()?.to_vec()
        } else {
            LINES[pick % LINES.len()].as_bytes().to_vec()
        };
        let Ok(Some(command)) = Command::decode(Bytes::from(line)) else {
            return Some(());
        };
        let kind = command.kind();
        let ready = self.session.is_ready();
        let queued = self.session.queued_commands();
        let dropped = self.session.counters().dropped.get(kind);
        let result = self.session.send(command);
        match &result {
            Err(SendError::NotOverRedis(refused)) => {
                assert_eq!(*refused, kind);
                assert!(matches!(
                    kind,
                    CommandKind::Rdata
                        | CommandKind::Position
                        | CommandKind::Replicate
                        | CommandKind::Server
                        | CommandKind::Name
                ));
            }
            Err(SendError::LineTooLong { .. }) => {}
            Ok(()) if ready => assert_eq!(self.session.queued_commands(), queued),
            Ok(()) => assert_eq!(self.session.queued_commands(), queued + 1),
            Err(SendError::NotConnected) => {
                assert!(!ready, "refused while ready");
                assert_eq!(self.session.counters().dropped.get(kind), dropped + 1);
            }
            Err(other) => panic!("send: {other}"),
        }
        self.drain();
        Some(())
    }

    fn answer_catch_ups(&mut self, how: u8) {
        for request in std::mem::take(&mut self.catch_ups) {
            if how.is_multiple_of(3) {
                let _ = self.session.catch_up_failed(request.id);
                continue;
            }
            let updates = if how % 3 == 1 {
                vec![(request.to, RawRow::new(&b"[1]"[..]).unwrap())]
            } else {
                // Out of range: refused whole.
                vec![(
                    Token(request.to.0.saturating_add(1)),
                    RawRow::new(&b"[]"[..]).unwrap(),
                )]
            };
            let page = CatchUpPage {
                updates,
                upto: request.to,
                limited: how & 0x80 != 0,
            };
            let _ = self.session.handle_catch_up(request.id, page);
        }
        self.drain();
    }

    fn step(&mut self, input: &mut Input<'_>) -> Option<()> {
        let op = input.byte()?;
        let link = if op & 0x80 != 0 {
            RedisLink::Publisher
        } else {
            RedisLink::Subscriber
        };
        match op % 16 {
            0 => self.connect(link),
            1 => {
                self.disconnect(link);
                self.drain();
            }
            2..=4 => {
                // The model answers what the session sent.
                let count = input.byte()? % 8 + 1;
                let mut bytes = Vec::new();
                for _ in 0..count {
                    let Some(command) = self.link(link).owed.pop_front() else {
                        break;
                    };
                    let twist = input.byte()?;
                    bytes.extend(self.reply(link, &command, twist));
                }
                self.feed_split(link, &bytes, input);
            }
            5 => {
                // Redis delivers what was published.
                let deliveries = std::mem::take(&mut self.deliveries);
                if self.links[0].connected {
                    self.feed_split(RedisLink::Subscriber, &deliveries, input);
                }
            }
            6 | 7 => {
                let chunk = self.chunk(input)?;
                self.feed_split(link, &chunk, input);
            }
            8 => {
                let ms = input.byte()?;
                self.now += Duration::from_millis(u64::from(ms) * 250);
                self.session.handle_timeout(self.now);
                for model in &mut self.links {
                    model.extra += PING_BYTES;
                }
                self.drain();
            }
            9 => {
                if let Some(deadline) = self.session.poll_timeout() {
                    self.now = deadline;
                    self.session.handle_timeout(deadline);
                    for model in &mut self.links {
                        model.extra += PING_BYTES;
                    }
                    self.drain();
                    if let Some(next) = self.session.poll_timeout() {
                        assert!(next > deadline, "the deadline did not move forward");
                    }
                }
            }
            10 => self.send(input)?,
            11 => {
                let b = input.byte()?;
                let rows: Vec<(Token, RawRow)> = (0..b % 4)
                    .map(|i| {
                        let row = RawRow::new(format!("[{i}]")).unwrap();
                        (Token(self.token + 1 + i64::from(i / 2)), row)
                    })
                    .collect();
                self.token += 2;
                let stream = if b & 0x40 != 0 {
                    // Not this process's: refused.
                    StreamName::Typing
                } else {
                    StreamName::Caches
                };
                if b & 0x80 != 0 {
                    let _ = self.session.advance(&stream, Token(self.token));
                } else {
                    let _ = self.session.write(&stream, Token(self.token), rows);
                }
                self.drain();
            }
            12 => {
                let how = input.byte()?;
                self.answer_catch_ups(how);
            }
            13 => {
                // The socket stops or resumes taking output.
                let model = self.link(link);
                model.blocked = !model.blocked;
                self.drain();
            }
            14 => {
                // A driver that closes a link it was told to close late.
                for link in RedisLink::BOTH {
                    if self.links[index(link)].closing {
                        self.disconnect(link);
                    }
                }
                self.drain();
            }
            _ => {
                self.session.request_replicate(self.now);
                for model in &mut self.links {
                    model.extra += PING_BYTES;
                }
                self.drain();
            }
        }
        Some(())
    }
}

/// Runs one input through the checks; panics where one fails.
pub fn check(data: &[u8]) {
    let mut input = Input(data);
    let Some(flags) = input.byte() else { return };
    let Some(more) = input.byte() else { return };

    let mut options = RedisSessionConfig::new(PREFIX);
    let auth = flags % 3;
    options.auth = match auth {
        0 => None,
        1 => Some(RedisAuth {
            username: None,
            password: "secret".to_owned(),
        }),
        _ => Some(RedisAuth {
            username: Some("synapse".to_owned()),
            password: "secret".to_owned(),
        }),
    };
    let database = flags & 0x04 != 0;
    options.database = database.then_some(3);
    let name = flags & 0x08 != 0;
    options.client_name = name.then(|| "worker 1".to_owned());
    options.single_connection = flags & 0x10 != 0;
    let user_ip = flags & 0x20 != 0;
    if user_ip {
        options.extra_channels = vec!["USER_IP".to_owned()];
    }
    options.report_received = flags & 0x40 != 0;
    options.max_queued_while_disconnected = usize::from(more % 4);
    options.ping_interval = Duration::from_secs(5);
    options.ping_timeout = Duration::from_millis(u64::from(more / 4) * 250);
    options.max_unsent_bytes = MAX_UNSENT;
    options.resp_limits = LIMITS;
    options.max_line_len = MAX_LINE;

    let registry = Arc::new(StreamWriters::default().with_redis(true));
    let follower = Follower::new(InstanceName::from("worker1"), registry.clone());
    let mut writer = Writer::new(InstanceName::from("worker1"), registry);
    writer.advance(&StreamName::Caches, Token(0)).unwrap();
    let mut harness = Harness {
        now: Instant::now(),
        session: RedisSession::new(options, follower, writer),
        links: [LinkModel::default(), LinkModel::default()],
        deliveries: Vec::new(),
        catch_ups: Vec::new(),
        readies: 0,
        prompt: flags & 0x80 != 0,
        auth,
        database,
        name,
        channels: 1 + usize::from(user_ip),
        token: 0,
    };
    for model in &mut harness.links {
        model.reset();
    }
    while harness.step(&mut input).is_some() {}
}
