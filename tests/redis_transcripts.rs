//! Transcripts of the Redis session: the RESP bytes Redis would send go in,
//! and what the session transmits on each link (decoded back into
//! commands) and reports is compared with what Synapse's Redis transport
//! does. A virtual clock (an `Instant` plus offsets) drives the timers: no
//! sockets, no sleeps.

mod common;

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use synapse_replication::config::RedisAuth;
use synapse_replication::positions::{CatchUpPage, FollowerEvent, RowOrigin};
use synapse_replication::resp::{self, Frame, Limits, RespError};
use synapse_replication::session::RedisLink::{Publisher, Subscriber};
use synapse_replication::session::{
    RedisError, RedisEvent, RedisLink, RedisSession, RedisSessionConfig, SendError,
};
use synapse_replication::wire::{Command, CommandKind, InstanceName, RawRow, StreamName, Token};

use common::redis_session::{PREFIX, redis_session};

const USER_IP_CHANNEL: &str = "example.com/USER_IP";
const TYPING_ROW: &str = r#"["!room:example.com",["@alice:example.com"]]"#;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

// ---------------------------------------------------------------------
// What Redis sends, written with the crate's RESP encoder.
// ---------------------------------------------------------------------

const OK: &[u8] = b"+OK\r\n";
const PONG: &[u8] = b"+PONG\r\n";

fn bulk(text: &str) -> Frame {
    Frame::bulk(Bytes::copy_from_slice(text.as_bytes()))
}

fn encoded(frame: &Frame) -> Vec<u8> {
    frame
        .to_bytes()
        .expect("a frame built here encodes")
        .to_vec()
}

fn error(text: &str) -> Vec<u8> {
    encoded(&Frame::Error(Bytes::copy_from_slice(text.as_bytes())))
}

fn integer(n: i64) -> Vec<u8> {
    encoded(&Frame::Integer(n))
}

/// `subscribe <channel> <count>`, RESP2 (an array) or RESP3 (a push).
fn subscribed(channel: &str, count: i64, resp3: bool) -> Vec<u8> {
    let items = vec![bulk("subscribe"), bulk(channel), Frame::Integer(count)];
    encoded(&if resp3 {
        Frame::Push(items)
    } else {
        Frame::Array(items)
    })
}

/// A pub/sub message, RESP2 (an array) or RESP3 (a push).
fn message_frame(channel: &str, payload: &str, resp3: bool) -> Vec<u8> {
    let items = vec![bulk("message"), bulk(channel), bulk(payload)];
    encoded(&if resp3 {
        Frame::Push(items)
    } else {
        Frame::Array(items)
    })
}

/// A RESP2 message on the prefix.
fn message(payload: &str) -> Vec<u8> {
    message_frame(PREFIX, payload, false)
}

/// The answer to `PING` on a RESP2 connection in subscribe mode.
fn sub_pong() -> Vec<u8> {
    encoded(&Frame::Array(vec![bulk("pong"), bulk("")]))
}

/// Redis 7's answer to `HELLO 3`.
fn hello_map() -> Vec<u8> {
    encoded(&Frame::Map(vec![
        (bulk("server"), bulk("redis")),
        (bulk("version"), bulk("7.2.4")),
        (bulk("proto"), Frame::Integer(3)),
        (bulk("id"), Frame::Integer(12)),
        (bulk("mode"), bulk("standalone")),
        (bulk("role"), bulk("master")),
        (bulk("modules"), Frame::Array(Vec::new())),
    ]))
}

fn concat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

// ---------------------------------------------------------------------
// What the session sends, decoded back.
// ---------------------------------------------------------------------

/// A command as its arguments.
type Args = Vec<String>;

fn args(parts: &[&str]) -> Args {
    parts.iter().map(|part| (*part).to_owned()).collect()
}

/// `PUBLISH <prefix> <line>`.
fn publish(line: &str) -> Args {
    args(&["PUBLISH", PREFIX, line])
}

/// Decodes one transmitted chunk: whole commands, each an array of bulk
/// strings, as every Redis client sends them.
fn decode_commands(bytes: &[u8]) -> Vec<Args> {
    let mut buf = BytesMut::from(bytes);
    let mut decoder = resp::RespDecoder::new();
    let mut commands = Vec::new();
    while let Some(frame) = decoder
        .decode(&mut buf)
        .expect("the session sends valid RESP")
    {
        let Frame::Array(items) = frame else {
            panic!("a command is an array: {frame:?}");
        };
        assert!(!items.is_empty(), "an empty command");
        commands.push(
            items
                .into_iter()
                .map(|item| match item {
                    Frame::BulkString(bytes) => String::from_utf8(bytes.to_vec()).unwrap(),
                    other => panic!("a command argument is a bulk string: {other:?}"),
                })
                .collect(),
        );
    }
    assert!(buf.is_empty(), "a transmit holds whole commands");
    commands
}

fn command(line: &str) -> Command {
    Command::decode(Bytes::copy_from_slice(line.as_bytes()))
        .unwrap()
        .unwrap()
}

fn line(command: &Command) -> String {
    String::from_utf8(command.to_bytes().unwrap().to_vec()).unwrap()
}

fn text(bytes: &Bytes) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// One line per event.
fn summary(event: &RedisEvent) -> String {
    match event {
        RedisEvent::Ready => "ready".to_owned(),
        RedisEvent::Follower(event) => event.to_string(),
        RedisEvent::Command(command) => format!("command {}", line(command)),
        RedisEvent::Received { channel, command } => {
            format!("received on {}: {}", text(channel), line(command))
        }
        RedisEvent::Malformed { channel, error } => {
            format!("malformed on {}: {error}", text(channel))
        }
        RedisEvent::PublishFailed { command, error } => {
            format!("publish failed {command}: {}", error.code)
        }
        RedisEvent::Closing { link, error } => format!("closing {link}: {error}"),
        other => format!("{other:?}"),
    }
}

// ---------------------------------------------------------------------
// The rig: one session, a virtual clock, and everything it did.
// ---------------------------------------------------------------------

fn index(link: RedisLink) -> usize {
    match link {
        Subscriber => 0,
        Publisher => 1,
    }
}

/// The options most tests use: an ACL user, a database, a client name, and
/// the `USER_IP` channel, as Synapse's main process has them.
fn options() -> RedisSessionConfig {
    let mut options = RedisSessionConfig::new(PREFIX);
    options.extra_channels = vec!["USER_IP".to_owned()];
    options.auth = Some(RedisAuth {
        username: Some("synapse".to_owned()),
        password: "secret".to_owned(),
    });
    options.database = Some(2);
    options.client_name = Some("worker 1".to_owned());
    options
}

fn plain_options() -> RedisSessionConfig {
    let mut options = RedisSessionConfig::new(PREFIX);
    options.client_name = None;
    options
}

struct Rig {
    start: Instant,
    now: Instant,
    session: RedisSession,
    /// Commands transmitted on each link, not yet looked at.
    sent: [Vec<Args>; 2],
    /// Events not yet looked at, with the time they came.
    events: Vec<(Duration, RedisEvent)>,
    /// A blocked link's socket takes nothing: its output stays queued.
    blocked: [bool; 2],
    /// Whether the link's connection speaks RESP3 (it said `HELLO 3`).
    resp3: [bool; 2],
}

impl Rig {
    fn new(options: RedisSessionConfig) -> Rig {
        Rig::with_session(redis_session(options))
    }

    fn with_session(session: RedisSession) -> Rig {
        let start = Instant::now();
        Rig {
            start,
            now: start,
            session,
            sent: [Vec::new(), Vec::new()],
            events: Vec::new(),
            blocked: [false; 2],
            resp3: [false; 2],
        }
    }

    /// A rig whose session is ready with both links (or one, in
    /// single-connection mode), its first publishes answered, and nothing
    /// left to look at.
    fn ready(options: RedisSessionConfig) -> Rig {
        let mut rig = Rig::new(options);
        rig.connect_all();
        rig.answer_all();
        assert_eq!(rig.summaries(), ["ready"]);
        let publisher = rig.publisher();
        assert_eq!(
            rig.take_sent(publisher),
            [
                publish("REPLICATE "),
                publish("POSITION caches worker1 7 7")
            ]
        );
        rig.input(publisher, &concat(&[&integer(1), &integer(1)]));
        assert!(rig.take_events().is_empty());
        rig
    }

    fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    fn publisher(&self) -> RedisLink {
        if self.session.wants(Publisher) {
            Publisher
        } else {
            Subscriber
        }
    }

    /// What the driver does after every input: transmits, then events,
    /// then the deadline, which must never be in the past.
    fn drain(&mut self) {
        for link in RedisLink::BOTH {
            if self.blocked[index(link)] {
                continue;
            }
            while let Some(bytes) = self.session.poll_transmit(link) {
                assert!(!bytes.is_empty(), "an empty transmit");
                self.sent[index(link)].extend(decode_commands(&bytes));
            }
        }
        while let Some(event) = self.session.poll_event() {
            self.events.push((self.elapsed(), event));
        }
        if let Some(deadline) = self.session.poll_timeout() {
            assert!(deadline >= self.now, "a deadline in the past");
        }
    }

    fn connect(&mut self, link: RedisLink) {
        self.resp3[index(link)] = false;
        self.session.connect(link, self.now);
        self.drain();
    }

    /// Connects every link the session wants.
    fn connect_all(&mut self) {
        for link in RedisLink::BOTH {
            if self.session.wants(link) {
                self.connect(link);
            }
        }
    }

    fn disconnect(&mut self, link: RedisLink) {
        self.session.disconnected(link, self.now);
        self.drain();
    }

    fn input(&mut self, link: RedisLink, bytes: &[u8]) {
        self.session.handle_input(link, bytes, self.now);
        self.drain();
    }

    /// Answers `commands` as a willing Redis would.
    fn answer(&mut self, link: RedisLink, commands: &[Args]) {
        let mut bytes = Vec::new();
        for command in commands {
            match command[0].as_str() {
                "AUTH" | "SELECT" | "CLIENT" => bytes.extend_from_slice(OK),
                "HELLO" => {
                    self.resp3[index(link)] = true;
                    bytes.extend(hello_map());
                }
                "SUBSCRIBE" => {
                    for (count, channel) in command[1..].iter().enumerate() {
                        bytes.extend(subscribed(
                            channel,
                            count as i64 + 1,
                            self.resp3[index(link)],
                        ));
                    }
                }
                "PING" if link == Subscriber && !self.resp3[index(link)] => {
                    bytes.extend(sub_pong());
                }
                "PING" => bytes.extend_from_slice(PONG),
                "PUBLISH" => bytes.extend(integer(1)),
                other => panic!("no answer for {other}"),
            }
        }
        self.input(link, &bytes);
    }

    /// Answers everything sent so far on every link (what the answers make
    /// the session send is left to look at).
    fn answer_all(&mut self) {
        let sent = [self.take_sent(Subscriber), self.take_sent(Publisher)];
        for (link, sent) in RedisLink::BOTH.into_iter().zip(sent) {
            if !sent.is_empty() {
                self.answer(link, &sent);
            }
        }
    }

    /// Runs the timers for `duration`, jumping from deadline to deadline,
    /// and checks that each deadline handled moves forward.
    fn run_for(&mut self, duration: Duration) {
        let end = self.now + duration;
        let mut steps = 0;
        while let Some(deadline) = self.session.poll_timeout() {
            if deadline > end {
                break;
            }
            assert!(deadline >= self.now, "a deadline in the past");
            self.now = deadline;
            self.session.handle_timeout(deadline);
            self.drain();
            if let Some(next) = self.session.poll_timeout() {
                assert!(
                    next > deadline,
                    "the deadline did not move forward at {:?}",
                    self.elapsed()
                );
            }
            steps += 1;
            assert!(steps < 100_000, "the timers spin");
        }
        self.now = end;
    }

    fn take_sent(&mut self, link: RedisLink) -> Vec<Args> {
        std::mem::take(&mut self.sent[index(link)])
    }

    fn take_events(&mut self) -> Vec<RedisEvent> {
        std::mem::take(&mut self.events)
            .into_iter()
            .map(|(_, event)| event)
            .collect()
    }

    fn summaries(&mut self) -> Vec<String> {
        self.take_events().iter().map(summary).collect()
    }

    /// Events with the time they came, as `"<secs>s <summary>"`.
    fn timed_summaries(&mut self) -> Vec<String> {
        std::mem::take(&mut self.events)
            .iter()
            .map(|(at, event)| format!("{}s {}", at.as_secs_f64(), summary(event)))
            .collect()
    }

    fn closing(&mut self) -> Vec<(RedisLink, RedisError)> {
        self.take_events()
            .into_iter()
            .filter_map(|event| match event {
                RedisEvent::Closing { link, error } => Some((link, error)),
                _ => None,
            })
            .collect()
    }
}

fn assert_not_connected(result: Result<(), SendError>) {
    assert!(matches!(result, Err(SendError::NotConnected)), "{result:?}");
}

fn user_sync() -> Command {
    command("USER_SYNC worker1 @alice:example.com DEVICE start 1700000000000")
}

fn user_ip() -> Command {
    command(
        r#"USER_IP @alice:example.com ["syt_token","10.0.0.1","Element/1.0","DEVICE",1700000000000]"#,
    )
}

// ---------------------------------------------------------------------
// Handshake
// ---------------------------------------------------------------------

#[test]
fn handshake_with_acl_user_database_and_name() {
    let mut rig = Rig::new(options());
    assert!(rig.session.wants(Subscriber) && rig.session.wants(Publisher));
    rig.connect(Subscriber);
    assert_eq!(
        rig.take_sent(Subscriber),
        [
            args(&["AUTH", "synapse", "secret"]),
            args(&["SELECT", "2"]),
            args(&["CLIENT", "SETNAME", "worker_1-sub"]),
            args(&["SUBSCRIBE", PREFIX, USER_IP_CHANNEL]),
        ]
    );
    rig.connect(Publisher);
    assert_eq!(
        rig.take_sent(Publisher),
        [
            args(&["AUTH", "synapse", "secret"]),
            args(&["SELECT", "2"]),
            args(&["CLIENT", "SETNAME", "worker_1-pub"]),
        ]
    );

    // Every reply but the last: nothing is published, nobody is ready.
    let steps: [(RedisLink, Vec<u8>); 7] = [
        (Subscriber, OK.to_vec()),
        (Subscriber, OK.to_vec()),
        (Subscriber, OK.to_vec()),
        (Subscriber, subscribed(PREFIX, 1, false)),
        (Subscriber, subscribed(USER_IP_CHANNEL, 2, false)),
        (Publisher, OK.to_vec()),
        (Publisher, OK.to_vec()),
    ];
    for (link, bytes) in steps {
        rig.input(link, &bytes);
        assert!(rig.take_sent(Subscriber).is_empty());
        assert!(rig.take_sent(Publisher).is_empty(), "published too early");
        assert!(rig.take_events().is_empty());
        assert!(!rig.session.is_ready());
    }
    assert!(
        rig.session.follower().is_connected(),
        "the follower is connected once every channel is confirmed"
    );

    // The publisher's last handshake reply: REPLICATE, then the positions.
    rig.input(Publisher, OK);
    assert!(rig.session.is_ready());
    assert_eq!(rig.summaries(), ["ready"]);
    assert_eq!(
        rig.take_sent(Publisher),
        [
            publish("REPLICATE "),
            publish("POSITION caches worker1 7 7")
        ]
    );
    assert!(
        rig.take_sent(Subscriber).is_empty(),
        "the subscriber only subscribes"
    );
    let counters = rig.session.counters();
    assert_eq!(counters.connections, [1, 1]);
    assert_eq!(counters.ready, 1);
    assert_eq!(counters.published.get(CommandKind::Replicate), 1);
    assert_eq!(counters.published.get(CommandKind::Position), 1);
    assert_eq!(counters.failures, [0, 0]);
}

#[test]
fn handshake_with_password_only_and_the_subscription_last() {
    let mut options = options();
    options.auth = Some(RedisAuth {
        username: None,
        password: "secret".to_owned(),
    });
    let mut rig = Rig::new(options);
    rig.connect(Publisher);
    rig.connect(Subscriber);
    assert_eq!(
        rig.take_sent(Publisher),
        [
            args(&["AUTH", "secret"]),
            args(&["SELECT", "2"]),
            args(&["CLIENT", "SETNAME", "worker_1-pub"]),
        ]
    );
    assert_eq!(
        rig.take_sent(Subscriber),
        [
            args(&["AUTH", "secret"]),
            args(&["SELECT", "2"]),
            args(&["CLIENT", "SETNAME", "worker_1-sub"]),
            args(&["SUBSCRIBE", PREFIX, USER_IP_CHANNEL]),
        ]
    );
    // The publisher is done first, then the subscriber's handshake.
    rig.input(Publisher, b"+OK\r\n+OK\r\n+OK\r\n");
    rig.input(Subscriber, b"+OK\r\n+OK\r\n+OK\r\n");
    // One channel of two is not enough (Redis' bytes, literally).
    rig.input(
        Subscriber,
        b"*3\r\n$9\r\nsubscribe\r\n$11\r\nexample.com\r\n:1\r\n",
    );
    assert!(rig.take_sent(Publisher).is_empty(), "published too early");
    assert!(!rig.session.is_ready());
    assert!(!rig.session.follower().is_connected());
    rig.input(
        Subscriber,
        b"*3\r\n$9\r\nsubscribe\r\n$19\r\nexample.com/USER_IP\r\n:2\r\n",
    );
    assert_eq!(rig.summaries(), ["ready"]);
    assert_eq!(
        rig.take_sent(Publisher),
        [
            publish("REPLICATE "),
            publish("POSITION caches worker1 7 7")
        ]
    );
}

#[test]
fn handshake_without_auth_database_or_name() {
    let mut rig = Rig::new(plain_options());
    rig.connect(Subscriber);
    assert_eq!(rig.take_sent(Subscriber), [args(&["SUBSCRIBE", PREFIX])]);
    rig.input(Subscriber, &subscribed(PREFIX, 1, false));
    assert!(rig.take_events().is_empty(), "no publisher yet");
    // A publisher with nothing to say is usable at once.
    rig.connect(Publisher);
    assert_eq!(rig.summaries(), ["ready"]);
    assert_eq!(
        rig.take_sent(Publisher),
        [
            publish("REPLICATE "),
            publish("POSITION caches worker1 7 7")
        ]
    );
}

#[test]
fn wrong_password_closes_with_auth() {
    let mut rig = Rig::new(options());
    rig.connect_all();
    rig.take_sent(Subscriber);
    rig.take_sent(Publisher);
    rig.input(
        Subscriber,
        b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
    );
    let closing = rig.closing();
    assert_eq!(closing.len(), 1);
    let (link, RedisError::Auth(error)) = &closing[0] else {
        panic!("{closing:?}");
    };
    assert_eq!(*link, Subscriber);
    assert_eq!(error.code, "WRONGPASS");
    assert_eq!(
        error.message,
        "WRONGPASS invalid username-password pair or user is disabled."
    );
    assert!(!rig.session.is_connected(Subscriber));
    // Nothing more is read or written on it.
    rig.input(Subscriber, b"+OK\r\n+OK\r\n");
    rig.run_for(secs(120));
    assert!(rig.take_sent(Subscriber).is_empty());
    assert!(rig.take_events().iter().all(|event| !matches!(
        event,
        RedisEvent::Closing {
            link: Subscriber,
            ..
        }
    )));
    assert_eq!(rig.session.counters().failures[0], 1);
    assert_eq!(rig.session.counters().closes.get("auth"), Some(&1));
    assert!(!rig.session.is_ready());

    // The same on the publisher (a password only: Redis' `requirepass`).
    let mut options = options();
    options.auth = Some(RedisAuth {
        username: None,
        password: "wrong".to_owned(),
    });
    let mut rig = Rig::new(options);
    rig.connect(Publisher);
    assert_eq!(rig.take_sent(Publisher)[0], args(&["AUTH", "wrong"]));
    rig.input(Publisher, b"-ERR invalid password\r\n");
    let closing = rig.closing();
    assert!(
        matches!(&closing[..], [(Publisher, RedisError::Auth(error))] if error.code == "ERR"),
        "{closing:?}"
    );
}

#[test]
fn noperm_on_subscribe_closes_with_subscribe() {
    let mut rig = Rig::new(options());
    rig.connect(Subscriber);
    rig.take_sent(Subscriber);
    rig.input(Subscriber, b"+OK\r\n+OK\r\n+OK\r\n");
    rig.input(
        Subscriber,
        b"-NOPERM User synapse has no permissions to access the 'example.com' channel\r\n",
    );
    let closing = rig.closing();
    assert!(
        matches!(&closing[..], [(Subscriber, RedisError::Subscribe(error))] if error.code == "NOPERM"),
        "{closing:?}"
    );
    assert!(!rig.session.follower().is_connected());
}

#[test]
fn select_error_closes_with_select() {
    let mut rig = Rig::new(options());
    rig.connect(Publisher);
    rig.input(
        Publisher,
        b"+OK\r\n-ERR DB index is out of range\r\n+OK\r\n",
    );
    let closing = rig.closing();
    assert!(
        matches!(
            &closing[..],
            [(Publisher, RedisError::Select { database: 2, error })] if error.code == "ERR"
        ),
        "{closing:?}"
    );
    assert!(!rig.session.is_connected(Publisher));
}

#[test]
fn a_refused_client_name_is_not_an_error() {
    let mut rig = Rig::new(options());
    rig.connect_all();
    rig.take_sent(Subscriber);
    rig.take_sent(Publisher);
    // An old Redis without CLIENT SETNAME, or an ACL that forbids it.
    let refused = error("ERR unknown subcommand 'SETNAME'");
    rig.input(Publisher, &concat(&[OK, OK, &refused]));
    rig.input(
        Subscriber,
        &concat(&[
            OK,
            OK,
            &refused,
            &subscribed(PREFIX, 1, false),
            &subscribed(USER_IP_CHANNEL, 2, false),
        ]),
    );
    assert_eq!(rig.summaries(), ["ready"]);
}

#[test]
fn unexpected_replies_close_the_link() {
    // An integer where AUTH's OK belongs.
    let mut rig = Rig::new(options());
    rig.connect(Subscriber);
    rig.input(Subscriber, b":1\r\n");
    assert!(matches!(
        &rig.closing()[..],
        [(Subscriber, RedisError::Unexpected(_))]
    ));

    // A message on the publisher, and a reply to nothing.
    let mut rig = Rig::ready(plain_options());
    rig.input(Publisher, &message("PING 1"));
    assert!(matches!(
        &rig.closing()[..],
        [(Publisher, RedisError::Unexpected(_))]
    ));
    rig.input(Subscriber, OK);
    let closing = rig.closing();
    assert!(
        matches!(&closing[..], [(Subscriber, RedisError::Unexpected(text))] if text == "a reply to nothing"),
        "{closing:?}"
    );
}

#[test]
fn noauth_on_ping_is_an_auth_error() {
    // Redis restarted with a password the session does not have.
    let mut rig = Rig::ready(plain_options());
    rig.run_for(secs(30));
    assert_eq!(rig.take_sent(Publisher), [args(&["PING"])]);
    rig.input(Publisher, b"-NOAUTH Authentication required.\r\n");
    assert!(matches!(
        &rig.closing()[..],
        [(Publisher, RedisError::Auth(error))] if error.code == "NOAUTH"
    ));
}

// ---------------------------------------------------------------------
// RESP3: one connection
// ---------------------------------------------------------------------

fn resp3_options() -> RedisSessionConfig {
    let mut options = options();
    options.single_connection = true;
    options
}

#[test]
fn hello_refused_falls_back_to_two_connections() {
    let mut rig = Rig::new(resp3_options());
    assert!(!rig.session.wants(Publisher), "one connection asked for");
    rig.connect_all();
    assert_eq!(
        rig.take_sent(Subscriber),
        [
            args(&[
                "HELLO",
                "3",
                "AUTH",
                "synapse",
                "secret",
                "SETNAME",
                "worker_1-sub"
            ]),
            args(&["SELECT", "2"]),
            args(&["SUBSCRIBE", PREFIX, USER_IP_CHANNEL]),
        ]
    );
    assert!(rig.take_sent(Publisher).is_empty());
    // Redis 5.
    rig.input(
        Subscriber,
        b"-ERR unknown command `HELLO`, with args beginning with: `3`, \r\n",
    );
    let closing = rig.closing();
    assert!(
        matches!(&closing[..], [(Subscriber, RedisError::Resp3Unsupported(error))] if error.code == "ERR"),
        "{closing:?}"
    );
    assert!(rig.session.wants(Publisher), "two connections from now on");
    assert!(rig.take_sent(Subscriber).is_empty());

    // The driver reconnects, now with two RESP2 connections.
    rig.disconnect(Subscriber);
    rig.connect_all();
    assert_eq!(
        rig.take_sent(Subscriber),
        [
            args(&["AUTH", "synapse", "secret"]),
            args(&["SELECT", "2"]),
            args(&["CLIENT", "SETNAME", "worker_1-sub"]),
            args(&["SUBSCRIBE", PREFIX, USER_IP_CHANNEL]),
        ]
    );
    assert_eq!(
        rig.take_sent(Publisher),
        [
            args(&["AUTH", "synapse", "secret"]),
            args(&["SELECT", "2"]),
            args(&["CLIENT", "SETNAME", "worker_1-pub"]),
        ]
    );
    rig.input(Publisher, b"+OK\r\n+OK\r\n+OK\r\n");
    rig.input(
        Subscriber,
        &concat(&[
            OK,
            OK,
            OK,
            &subscribed(PREFIX, 1, false),
            &subscribed(USER_IP_CHANNEL, 2, false),
        ]),
    );
    assert_eq!(rig.summaries(), ["ready"]);
    assert_eq!(
        rig.take_sent(Publisher),
        [
            publish("REPLICATE "),
            publish("POSITION caches worker1 7 7")
        ]
    );
}

#[test]
fn noproto_on_hello_falls_back_too() {
    let mut rig = Rig::new(resp3_options());
    rig.connect_all();
    rig.input(
        Subscriber,
        b"-NOPROTO sorry, this protocol version is not supported.\r\n",
    );
    assert!(matches!(
        &rig.closing()[..],
        [(Subscriber, RedisError::Resp3Unsupported(error))] if error.code == "NOPROTO"
    ));
    assert!(rig.session.wants(Publisher));
}

/// Redis 6+ refusing the credentials of `HELLO 3 AUTH ...` is an
/// authentication error, not a server without RESP3: the session keeps its
/// one RESP3 connection (`wants(Publisher)` stays false).
#[test]
fn wrongpass_on_hello_is_an_auth_error() {
    let mut rig = Rig::new(resp3_options());
    rig.connect_all();
    rig.input(
        Subscriber,
        b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
    );
    let closing = rig.closing();
    assert!(
        matches!(&closing[..], [(Subscriber, RedisError::Auth(error))] if error.code == "WRONGPASS"),
        "{closing:?}"
    );
    assert!(
        !rig.session.wants(Publisher),
        "a wrong password is no reason to give up RESP3"
    );
}

#[test]
fn resp3_single_connection() {
    let mut rig = Rig::new(resp3_options());
    rig.connect_all();
    let handshake = rig.take_sent(Subscriber);
    assert_eq!(handshake.len(), 3, "HELLO, SELECT, SUBSCRIBE");
    rig.input(
        Subscriber,
        &concat(&[&hello_map(), OK, &subscribed(PREFIX, 1, true)]),
    );
    assert!(rig.take_sent(Subscriber).is_empty(), "published too early");
    rig.input(Subscriber, &subscribed(USER_IP_CHANNEL, 2, true));
    assert_eq!(rig.summaries(), ["ready"]);
    assert!(!rig.session.wants(Publisher));
    // Everything goes on the one connection.
    assert_eq!(
        rig.take_sent(Subscriber),
        [
            publish("REPLICATE "),
            publish("POSITION caches worker1 7 7")
        ]
    );
    assert!(rig.take_sent(Publisher).is_empty());

    // Replies to PUBLISH and pushed messages interleave.
    rig.input(
        Subscriber,
        &concat(&[
            &integer(3),
            &message_frame(PREFIX, "POSITION typing master 5 5", true),
            &integer(3),
            &message_frame(PREFIX, &format!("RDATA typing master 6 {TYPING_ROW}"), true),
            &message_frame(PREFIX, "POSITION caches worker1 7 7", true),
        ]),
    );
    assert_eq!(
        rig.summaries(),
        [
            "started typing master 5",
            "rows typing master 6 (1 rows, Live)"
        ]
    );

    // A publish refused by an ACL, its answer between two pushes.
    rig.session.send(user_sync()).unwrap();
    rig.session.send(user_ip()).unwrap();
    rig.drain();
    assert_eq!(
        rig.take_sent(Subscriber),
        [
            publish(&line(&user_sync())),
            args(&["PUBLISH", USER_IP_CHANNEL, &line(&user_ip())]),
        ]
    );
    rig.input(
        Subscriber,
        &concat(&[
            &message_frame(PREFIX, "REMOTE_SERVER_UP other.org", true),
            &integer(2),
            &message_frame(PREFIX, &line(&user_sync()), true),
            &error(
                "NOPERM this user has no permissions to access the 'example.com/USER_IP' channel",
            ),
        ]),
    );
    assert_eq!(
        rig.summaries(),
        [
            "command REMOTE_SERVER_UP other.org",
            &format!("command {}", line(&user_sync())),
            "publish failed USER_IP: NOPERM",
        ]
    );

    // Keep-alive: PING answered by a simple PONG in RESP3.
    rig.run_for(secs(30));
    assert_eq!(rig.take_sent(Subscriber), [args(&["PING"])]);
    rig.input(Subscriber, PONG);
    rig.run_for(secs(29));
    assert!(rig.take_events().is_empty());
    assert!(rig.session.is_ready());
    assert_eq!(rig.session.counters().connections, [1, 0]);
}

// ---------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------

#[test]
fn messages_reach_the_follower_the_writer_and_the_application() {
    let mut rig = Rig::ready(options());
    rig.input(Subscriber, &message("POSITION typing master 5 5"));
    assert_eq!(rig.summaries(), ["started typing master 5"]);
    rig.input(
        Subscriber,
        &concat(&[
            &message(&format!("RDATA typing master batch {TYPING_ROW}")),
            &message(&format!("RDATA typing master 6 {TYPING_ROW}")),
            // This process's own echo.
            &message("POSITION caches worker1 7 7"),
        ]),
    );
    let events = rig.take_events();
    let [
        RedisEvent::Follower(FollowerEvent::Rows {
            stream,
            writer,
            token,
            rows,
            source,
        }),
    ] = &events[..]
    else {
        panic!("{events:?}");
    };
    assert_eq!(
        (stream, writer.as_str(), *token, rows.len(), *source),
        (&StreamName::Typing, "master", Token(6), 2, RowOrigin::Live)
    );
    assert_eq!(rows[0].as_str(), TYPING_ROW);
    assert_eq!(rig.session.follower().counters().own_echoes, 1);
    assert_eq!(
        rig.session
            .follower()
            .position(&StreamName::Typing, &InstanceName::master()),
        Some(Token(6))
    );

    // REPLICATE from another process: the writer announces its positions.
    rig.input(Subscriber, &message("REPLICATE "));
    assert!(rig.take_events().is_empty());
    assert_eq!(
        rig.take_sent(Publisher),
        [publish("POSITION caches worker1 7 7")]
    );

    // The others are for the application.
    let lines = [
        "USER_SYNC worker2 @bob:example.com None end 1700000000001",
        "CLEAR_USER_SYNC worker2",
        "FEDERATION_ACK federation_sender1 42",
        "REMOTE_SERVER_UP other.org",
        r#"LOCK_RELEASED ["worker2","lock","key"]"#,
        "NEW_ACTIVE_TASK task1",
        "CANCEL_TASK task2",
        "PING 1700000000000",
        "ERROR something broke",
    ];
    let bytes: Vec<u8> = lines.iter().flat_map(|line| message(line)).collect();
    rig.input(Subscriber, &bytes);
    let expected: Vec<String> = lines.iter().map(|line| format!("command {line}")).collect();
    assert_eq!(rig.summaries(), expected);
    rig.input(
        Subscriber,
        &message_frame(USER_IP_CHANNEL, &line(&user_ip()), false),
    );
    let events = rig.take_events();
    assert!(
        matches!(&events[..], [RedisEvent::Command(command)] if *command == user_ip()),
        "{events:?}"
    );

    // A malformed payload is reported and the next one still counts.
    rig.input(
        Subscriber,
        &concat(&[
            &message("RDATA typing"),
            &message("NOT_A_COMMAND x"),
            &message(""),
            &message("REMOTE_SERVER_UP third.org"),
        ]),
    );
    let events = rig.take_events();
    assert_eq!(events.len(), 3, "{events:?}");
    assert!(
        events[..2]
            .iter()
            .all(|event| matches!(event, RedisEvent::Malformed { channel, .. } if channel.as_ref() == PREFIX.as_bytes()))
    );
    assert_eq!(summary(&events[2]), "command REMOTE_SERVER_UP third.org");

    // A message on a channel this session did not subscribe to.
    rig.input(
        Subscriber,
        &message_frame("other.example", "POSITION typing master 9 9", false),
    );
    assert!(rig.take_events().is_empty());
    assert!(rig.take_sent(Publisher).is_empty());

    assert!(rig.session.is_ready(), "nothing above hurt the session");
    assert_eq!(rig.session.counters().failures, [0, 0]);
    let counters = rig.session.counters();
    assert_eq!(counters.malformed, 2);
    assert_eq!(counters.foreign_messages, 1);
    assert_eq!(counters.received.get(CommandKind::Rdata), 2);
    assert_eq!(counters.received.get(CommandKind::Position), 2);
    assert_eq!(counters.received.get(CommandKind::Replicate), 1);
    assert_eq!(counters.received.get(CommandKind::UserIp), 1);
    assert_eq!(counters.received.get(CommandKind::RemoteServerUp), 2);
    assert_eq!(counters.received.total(), 16);
}

#[test]
fn a_malformed_rdata_is_a_gap_fetched_not_a_row_stepped_over() {
    let mut options = options();
    options.max_line_len = 200;
    let mut rig = Rig::ready(options);
    rig.input(Subscriber, &message("POSITION typing master 5 5"));
    assert_eq!(rig.summaries(), ["started typing master 5"]);
    // Row 6 is not valid JSON; row 7 is over the line limit; row 8 is fine.
    let long = format!(
        r#"RDATA typing master 7 ["!room:x",["{}"]]"#,
        "a".repeat(300)
    );
    rig.input(
        Subscriber,
        &concat(&[
            &message(r#"RDATA typing master 6 ["!room:x",["@a:x"]"#),
            &message(&long),
            &message(&format!("RDATA typing master 8 {TYPING_ROW}")),
        ]),
    );
    let summaries = rig.summaries();
    assert_eq!(summaries.len(), 3, "{summaries:?}");
    assert!(
        summaries[0].starts_with(&format!(
            "malformed on {PREFIX}: RDATA: invalid JSON in row"
        )),
        "{summaries:?}"
    );
    assert_eq!(
        summaries[1..],
        [
            "catch-up #1 typing master (5, 6]".to_owned(),
            format!("malformed on {PREFIX}: line of 338 bytes exceeds the limit of 200 bytes"),
        ]
    );
    // The line over the limit and row 8 wait behind the catch-up, which
    // reaches 6; then 7 is fetched.
    assert_eq!(rig.session.follower().counters().rdata_lost, 1);
    let page = CatchUpPage {
        updates: vec![(
            Token(6),
            RawRow::new(&br#"["!room:x",["@a:x"]]"#[..]).unwrap(),
        )],
        upto: Token(6),
        limited: false,
    };
    let id = rig.session.follower().outstanding_catch_ups()[0].id;
    rig.session.handle_catch_up(id, page).unwrap();
    rig.drain();
    assert_eq!(
        rig.summaries(),
        [
            "rows typing master 6 (1 rows, CatchUp)",
            "position typing master 6",
            "catch-up #2 typing master (6, 7]",
        ]
    );
    assert_eq!(rig.session.follower().counters().rdata_lost, 2);
}

#[test]
fn report_received_reports_each_command_before_acting() {
    let mut options = plain_options();
    options.report_received = true;
    let mut rig = Rig::ready(options);
    rig.input(Subscriber, &message("POSITION typing master 5 5"));
    assert_eq!(
        rig.summaries(),
        [
            "received on example.com: POSITION typing master 5 5",
            "started typing master 5",
        ]
    );
}

/// Echoes of this process's `RDATA` and `POSITION`, read or not, are
/// told from other lines by the sender's field alone; of them, only one
/// may be this process's own (the `POSITION` it published on becoming
/// ready): the others are an impostor's. With `report_received` they are
/// decoded and reported too.
#[test]
fn echoes_are_known_by_their_sender_whatever_follows() {
    let echoes = [
        format!("RDATA typing worker1 6 {TYPING_ROW}"),
        "RDATA typing worker1 6 [not json".to_owned(),
        "RDATA new_stream worker1 x".to_owned(),
        "RDATA  worker1 ".to_owned(),
        "POSITION typing worker1 5 5".to_owned(),
        "POSITION typing worker1 x".to_owned(),
        "POSITION new_stream worker1 1 2".to_owned(),
    ];
    let others = [
        format!("RDATA typing worker12 6 {TYPING_ROW}"),
        "RDATA typing worker 1 6 [1]".to_owned(),
        "RDATA worker1 typing 6 [1]".to_owned(),
        "POSITION typing worker1x 5 5".to_owned(),
        "POSITION worker1 master 5 5".to_owned(),
    ];
    for report in [false, true] {
        let mut options = options();
        options.report_received = report;
        let mut rig = Rig::ready(options);
        for line in echoes.iter().chain(&others) {
            rig.input(Subscriber, &message(line));
        }
        let summaries = rig.summaries();
        let counters = rig.session.counters();
        assert_eq!(counters.impostor_echoes, 6, "{report} {summaries:?}");
        let echoes_seen = rig.session.follower().counters().own_echoes;
        let malformed = counters.malformed;
        let received = |kind| counters.received.get(kind);
        let read = (
            echoes_seen,
            malformed,
            received(CommandKind::Rdata),
            received(CommandKind::Position),
        );
        // Own echoes seen by the follower, malformed messages, and `RDATA`
        // and `POSITION` received. Not reported, echoes are not decoded:
        // whatever follows the sender, they are echoes and not malformed.
        // Reported, they are decoded: the well-formed ones reach the
        // follower (which ignores them), the others are malformed.
        let expected = if report { (6, 5, 3, 4) } else { (7, 1, 6, 5) };
        assert_eq!(read, expected, "{report} {summaries:?}");
    }
}

/// The bytes of a busy subscriber: messages of every kind, a pong, a
/// foreign message, a malformed one, RDATA with spaces in the row.
fn busy_subscriber_bytes() -> Vec<u8> {
    concat(&[
        &message("POSITION typing master 5 5"),
        &message(&format!("RDATA typing master batch {TYPING_ROW}")),
        &sub_pong(),
        &message(r#"RDATA typing master 6 ["!other room:example.com",[]]"#),
        &message("REPLICATE "),
        &message_frame("elsewhere", "REPLICATE ", false),
        &message("RDATA typing"),
        &message("USER_SYNC worker2 @bob:example.com None start 1"),
        &message_frame(USER_IP_CHANNEL, &line(&user_ip()), false),
        &message("POSITION typing master 7 9"),
    ])
}

/// Feeds `chunks` to a ready session (with a PING owed on the subscriber)
/// and returns what it did.
fn feed(chunks: &[&[u8]]) -> (Vec<String>, Vec<Args>, String) {
    let mut rig = Rig::ready(options());
    rig.run_for(secs(30));
    assert_eq!(rig.take_sent(Subscriber), [args(&["PING"])]);
    rig.input(Publisher, PONG);
    rig.take_sent(Publisher);
    for chunk in chunks {
        rig.input(Subscriber, chunk);
    }
    let summaries = rig.summaries();
    let sent = rig.take_sent(Publisher);
    let counters = format!("{:?}", rig.session.counters());
    assert!(rig.session.is_ready());
    assert_eq!(rig.session.buffered_input(), 0);
    (summaries, sent, counters)
}

#[test]
fn messages_split_at_every_offset_decode_the_same() {
    let bytes = busy_subscriber_bytes();
    let whole = feed(&[&bytes]);
    assert_eq!(
        whole.0,
        [
            "started typing master 5",
            "rows typing master 6 (2 rows, Live)",
            "malformed on example.com: RDATA: missing instance name",
            "command USER_SYNC worker2 @bob:example.com None start 1",
            &format!("command {}", line(&user_ip())),
            "catch-up #1 typing master (6, 9]",
        ][..],
        "{:#?}",
        whole.0
    );
    assert_eq!(whole.1, [publish("POSITION caches worker1 7 7")]);
    for cut in 0..=bytes.len() {
        let (first, second) = bytes.split_at(cut);
        assert_eq!(feed(&[first, second]), whole, "split at {cut}");
    }
    let bytes_one_at_a_time: Vec<&[u8]> = bytes.chunks(1).collect();
    assert_eq!(feed(&bytes_one_at_a_time), whole, "one byte at a time");
}

/// Messages around one larger than a read, so that a frame cut short is
/// carried over many reads, past what the session scans again from its
/// start on each (16 KiB).
#[test]
fn a_message_longer_than_its_reads_decodes_the_same() {
    let users: Vec<String> = (0..2000)
        .map(|i| format!("\"@user{i}:example.com\""))
        .collect();
    let big_row = format!(r#"["!room:example.com",[{}]]"#, users.join(","));
    assert!(big_row.len() > 40 << 10);
    let bytes = concat(&[
        &message("POSITION typing master 5 5"),
        &message(&format!("RDATA typing master 6 {TYPING_ROW}")),
        &message(&format!("RDATA typing master 7 {big_row}")),
        &message(&format!("RDATA typing master 8 {TYPING_ROW}")),
        &sub_pong(),
        &message(&format!("RDATA typing master 9 {big_row}")),
    ]);
    let whole = feed(&[&bytes]);
    assert_eq!(
        whole.0,
        [
            "started typing master 5",
            "rows typing master 6 (1 rows, Live)",
            "rows typing master 7 (1 rows, Live)",
            "rows typing master 8 (1 rows, Live)",
            "rows typing master 9 (1 rows, Live)",
        ][..],
        "{:#?}",
        whole.0
    );
    for size in [1000, 4096, 17 << 10, 40 << 10] {
        let chunks: Vec<&[u8]> = bytes.chunks(size).collect();
        assert_eq!(feed(&chunks), whole, "reads of {size} bytes");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_chunking_decodes_the_same(sizes in prop::collection::vec(1usize..64, 0..80)) {
        let bytes = busy_subscriber_bytes();
        let whole = feed(&[&bytes]);
        let mut chunks = Vec::new();
        let mut rest = &bytes[..];
        for size in sizes {
            let (chunk, tail) = rest.split_at(size.min(rest.len()));
            chunks.push(chunk);
            rest = tail;
        }
        chunks.push(rest);
        prop_assert_eq!(feed(&chunks), whole);
    }
}

// ---------------------------------------------------------------------
// Publishing
// ---------------------------------------------------------------------

#[test]
fn a_refused_publish_is_reported_and_the_session_continues() {
    let mut rig = Rig::new(options());
    rig.connect_all();
    rig.answer_all();
    assert_eq!(rig.summaries(), ["ready"]);
    assert_eq!(rig.take_sent(Publisher).len(), 2, "REPLICATE, POSITION");
    // A read-only ACL user: every PUBLISH is refused.
    rig.input(
        Publisher,
        &concat(&[
            &integer(2),
            &error("NOPERM User synapse has no permissions to access the 'example.com' channel"),
        ]),
    );
    let events = rig.take_events();
    let [RedisEvent::PublishFailed { command, error }] = &events[..] else {
        panic!("{events:?}");
    };
    assert_eq!(*command, CommandKind::Position);
    assert_eq!(error.code, "NOPERM");
    assert_eq!(
        error.message,
        "NOPERM User synapse has no permissions to access the 'example.com' channel"
    );
    assert_eq!(rig.session.counters().publish_errors, 1);
    assert!(rig.session.is_ready());
    assert!(rig.session.is_connected(Publisher));

    // The session goes on.
    rig.session.send(user_sync()).unwrap();
    rig.drain();
    assert_eq!(rig.take_sent(Publisher), [publish(&line(&user_sync()))]);
    rig.input(Publisher, &integer(1));
    assert!(rig.take_events().is_empty());
    rig.input(Subscriber, &message("REMOTE_SERVER_UP other.org"));
    assert_eq!(rig.summaries(), ["command REMOTE_SERVER_UP other.org"]);
}

#[test]
fn user_ip_goes_to_its_own_channel() {
    let mut rig = Rig::ready(options());
    let commands = [
        user_ip(),
        user_sync(),
        command("CLEAR_USER_SYNC worker1"),
        command("FEDERATION_ACK worker1 12"),
        command("REMOTE_SERVER_UP other.org"),
        command(r#"LOCK_RELEASED ["worker1","lock","key"]"#),
        command("NEW_ACTIVE_TASK t1"),
        command("CANCEL_TASK t2"),
        command("ERROR oops"),
        command("PING 1"),
    ];
    for command in &commands {
        rig.session.send(command.clone()).unwrap();
    }
    rig.drain();
    let expected: Vec<Args> = commands
        .iter()
        .map(|command| {
            let channel = if command.kind() == CommandKind::UserIp {
                USER_IP_CHANNEL
            } else {
                PREFIX
            };
            args(&["PUBLISH", channel, &line(command)])
        })
        .collect();
    assert_eq!(rig.take_sent(Publisher), expected);
    assert_eq!(rig.session.counters().published.get(CommandKind::UserIp), 1);

    // Without the USER_IP channel, USER_IP is still published there, and
    // a USER_IP message arriving is foreign.
    let mut rig = Rig::ready(plain_options());
    rig.session.send(user_ip()).unwrap();
    rig.drain();
    assert_eq!(
        rig.take_sent(Publisher),
        [args(&["PUBLISH", USER_IP_CHANNEL, &line(&user_ip())])]
    );
    rig.input(
        Subscriber,
        &message_frame(USER_IP_CHANNEL, &line(&user_ip()), false),
    );
    assert!(rig.take_events().is_empty());
    assert_eq!(rig.session.counters().foreign_messages, 1);
}

#[test]
fn send_while_not_ready_is_dropped_and_counted() {
    let mut rig = Rig::new(options());
    assert_not_connected(rig.session.send(user_sync()));
    rig.connect_all();
    let handshakes = [rig.take_sent(Subscriber), rig.take_sent(Publisher)];
    // Connected, but the handshake is not done.
    assert_not_connected(rig.session.send(user_sync()));
    assert_not_connected(rig.session.send(user_ip()));
    // Stream commands belong to the writer; SERVER and NAME mean nothing
    // over Redis. Refused, not counted as dropped.
    for refused in [
        format!("RDATA caches worker1 8 {TYPING_ROW}"),
        "POSITION caches worker1 7 8".to_owned(),
        "REPLICATE ".to_owned(),
        "SERVER example.com".to_owned(),
        "NAME worker1".to_owned(),
    ] {
        let refused = command(&refused);
        let kind = refused.kind();
        let result = rig.session.send(refused);
        assert!(
            matches!(result, Err(SendError::NotOverRedis(k)) if k == kind),
            "{result:?}"
        );
    }
    rig.drain();
    assert!(rig.take_sent(Publisher).is_empty());
    assert!(rig.take_sent(Subscriber).is_empty());
    let dropped = rig.session.counters().dropped;
    assert_eq!(dropped.get(CommandKind::UserSync), 2);
    assert_eq!(dropped.get(CommandKind::UserIp), 1);
    assert_eq!(dropped.total(), 3);
    assert_eq!(rig.session.queued_commands(), 0);

    // Once ready, they are lost: nothing but the writer's announcement.
    rig.answer(Subscriber, &handshakes[0]);
    rig.answer(Publisher, &handshakes[1]);
    assert_eq!(rig.summaries(), ["ready"]);
    assert_eq!(
        rig.take_sent(Publisher),
        [
            publish("REPLICATE "),
            publish("POSITION caches worker1 7 7")
        ]
    );
    // Refused when ready too.
    let result = rig.session.send(command("REPLICATE "));
    assert!(
        matches!(result, Err(SendError::NotOverRedis(CommandKind::Replicate))),
        "{result:?}"
    );
}

#[test]
fn send_while_not_ready_queues_up_to_the_limit() {
    let mut options = options();
    options.max_queued_while_disconnected = 2;
    let mut rig = Rig::new(options);
    rig.session.send(user_ip()).unwrap();
    rig.session.send(user_sync()).unwrap();
    assert_not_connected(rig.session.send(command("FEDERATION_ACK worker1 3")));
    assert_eq!(rig.session.queued_commands(), 2);
    assert_eq!(
        rig.session
            .counters()
            .dropped
            .get(CommandKind::FederationAck),
        1
    );
    assert_eq!(rig.session.counters().dropped.total(), 1);

    rig.connect_all();
    rig.answer_all();
    assert_eq!(rig.summaries(), ["ready"]);
    assert_eq!(
        rig.take_sent(Publisher),
        [
            publish("REPLICATE "),
            publish("POSITION caches worker1 7 7"),
            args(&["PUBLISH", USER_IP_CHANNEL, &line(&user_ip())]),
            publish(&line(&user_sync())),
        ]
    );
    assert_eq!(rig.session.queued_commands(), 0);
    let published = rig.session.counters().published;
    assert_eq!(published.get(CommandKind::UserIp), 1);
    assert_eq!(published.get(CommandKind::UserSync), 1);
}

// ---------------------------------------------------------------------
// Keep-alive
// ---------------------------------------------------------------------

#[test]
fn pings_go_out_on_each_link_every_interval() {
    let mut rig = Rig::ready(options());
    rig.run_for(secs(29));
    assert!(rig.take_sent(Subscriber).is_empty());
    assert!(rig.take_sent(Publisher).is_empty());
    for round in 1..=20 {
        rig.run_for(secs(1));
        assert_eq!(
            rig.take_sent(Subscriber),
            [args(&["PING"])],
            "round {round}"
        );
        assert_eq!(rig.take_sent(Publisher), [args(&["PING"])], "round {round}");
        // Redis answers a few seconds later.
        rig.run_for(secs(3));
        rig.input(Subscriber, &sub_pong());
        rig.input(Publisher, PONG);
        rig.run_for(secs(26));
    }
    assert!(rig.take_events().is_empty(), "ten minutes without trouble");
    assert!(rig.session.is_ready());
    assert_eq!(rig.elapsed(), secs(629));
}

#[test]
fn a_silent_link_times_out() {
    let mut rig = Rig::ready(options());
    // The publisher answers its pings; the subscriber says nothing.
    rig.run_for(secs(30));
    assert_eq!(rig.take_sent(Subscriber), [args(&["PING"])]);
    assert_eq!(rig.take_sent(Publisher), [args(&["PING"])]);
    rig.input(Publisher, PONG);
    rig.run_for(secs(40));
    assert_eq!(
        rig.timed_summaries(),
        ["60s closing subscriber: no reply for 30s"]
    );
    assert!(!rig.session.is_connected(Subscriber));
    assert!(rig.session.is_connected(Publisher));
    assert_eq!(rig.take_sent(Publisher), [args(&["PING"])], "at 60 s");
    assert!(rig.take_sent(Subscriber).is_empty());
    assert_eq!(rig.session.counters().failures, [1, 0]);
}

#[test]
fn a_silent_handshake_times_out() {
    let mut rig = Rig::new(options());
    rig.connect_all();
    rig.run_for(secs(29));
    assert!(rig.take_events().is_empty());
    rig.run_for(secs(10));
    let mut events = rig.timed_summaries();
    events.sort();
    assert_eq!(
        events,
        [
            "30s closing publisher: no reply for 30s",
            "30s closing subscriber: no reply for 30s",
        ]
    );
    // Given up before their first PING.
    for link in RedisLink::BOTH {
        let sent = rig.take_sent(link);
        assert!(sent.iter().all(|command| command[0] != "PING"), "{sent:?}");
    }
    assert_eq!(rig.session.poll_timeout(), None, "nothing left to time");
    assert_eq!(rig.session.counters().closes.get("timeout"), Some(&2));
}

#[test]
fn replies_keep_a_link_alive() {
    let mut rig = Rig::ready(plain_options());
    // Two publishes owed from 0 s; one answer at 25 s is progress.
    rig.session.send(user_sync()).unwrap();
    rig.session.send(user_sync()).unwrap();
    rig.drain();
    rig.take_sent(Publisher);
    rig.run_for(secs(25));
    rig.input(Publisher, &integer(1));
    rig.run_for(secs(29));
    assert!(rig.closing().is_empty(), "progress at 25 s");
    // The PING at 30 s and the other publish stay unanswered.
    rig.run_for(secs(10));
    let events = rig.timed_summaries();
    assert!(
        events.contains(&"55s closing publisher: no reply for 30s".to_owned()),
        "{events:?}"
    );
}

#[test]
fn zero_timers_do_not_spin() {
    let mut options = plain_options();
    options.ping_interval = Duration::ZERO;
    options.ping_timeout = Duration::ZERO;
    let mut rig = Rig::ready(options);
    // `run_for` checks that every deadline handled moves forward.
    rig.run_for(Duration::from_millis(50));
    let closing = rig.closing();
    assert_eq!(closing.len(), 2, "{closing:?}");
    assert!(
        closing
            .iter()
            .all(|(_, error)| matches!(error, RedisError::Timeout(_)))
    );
}

// ---------------------------------------------------------------------
// Reconnections
// ---------------------------------------------------------------------

#[test]
fn losing_the_subscriber_forgets_the_connection_and_replicates_again() {
    let mut rig = Rig::ready(options());
    rig.input(
        Subscriber,
        &concat(&[
            &message("POSITION typing master 5 5"),
            &message(&format!("RDATA typing master 6 {TYPING_ROW}")),
        ]),
    );
    assert_eq!(rig.take_events().len(), 2);
    assert!(
        rig.session
            .follower()
            .is_writer_connected(&StreamName::Typing, &InstanceName::master())
    );

    rig.run_for(secs(10));
    rig.disconnect(Subscriber);
    assert!(!rig.session.follower().is_connected());
    assert!(!rig.session.is_ready());
    assert_not_connected(rig.session.send(user_sync()));
    // Rows written meanwhile are announced on the next connection.
    rig.session
        .write(
            &StreamName::Caches,
            Token(8),
            [(Token(8), RawRow::new(&b"[]"[..]).unwrap())],
        )
        .unwrap();
    rig.drain();
    assert!(rig.take_sent(Publisher).is_empty());

    rig.run_for(secs(5));
    rig.connect(Subscriber);
    let sent = rig.take_sent(Subscriber);
    rig.answer(Subscriber, &sent);
    assert_eq!(rig.summaries(), ["ready"]);
    assert_eq!(
        rig.take_sent(Publisher),
        [
            publish("REPLICATE "),
            publish("POSITION caches worker1 8 8")
        ]
    );
    rig.input(Publisher, &concat(&[&integer(1), &integer(1)]));

    // RDATA before this connection's POSITION is dropped...
    rig.input(
        Subscriber,
        &message(&format!("RDATA typing master 7 {TYPING_ROW}")),
    );
    assert!(rig.take_events().is_empty());
    // ...and the POSITION that follows fetches what was missed.
    rig.input(Subscriber, &message("POSITION typing master 8 9"));
    let events = rig.take_events();
    let [RedisEvent::Follower(FollowerEvent::CatchUp(request))] = &events[..] else {
        panic!("{events:?}");
    };
    assert_eq!(
        (
            &request.stream,
            request.writer.as_str(),
            request.from,
            request.to
        ),
        (&StreamName::Typing, "master", Token(6), Token(9))
    );
    let row = RawRow::new(TYPING_ROW).unwrap();
    rig.session
        .handle_catch_up(
            request.id,
            CatchUpPage {
                updates: vec![(Token(7), row.clone()), (Token(9), row)],
                upto: Token(9),
                limited: false,
            },
        )
        .unwrap();
    rig.drain();
    assert_eq!(
        rig.summaries(),
        [
            "rows typing master 7 (1 rows, CatchUp)",
            "rows typing master 9 (1 rows, CatchUp)",
            "position typing master 9",
        ]
    );
    assert_eq!(rig.session.counters().connections, [2, 1]);
    assert_eq!(rig.session.counters().ready, 2);
}

#[test]
fn losing_only_the_publisher_announces_again_without_replicate() {
    let mut rig = Rig::ready(options());
    rig.run_for(secs(10));
    rig.disconnect(Publisher);
    assert!(!rig.session.is_ready());
    assert!(
        rig.session.follower().is_connected(),
        "the subscription is still up"
    );
    // Messages still arrive.
    rig.input(Subscriber, &message("POSITION typing master 5 5"));
    assert_eq!(rig.summaries(), ["started typing master 5"]);
    // A REPLICATE meanwhile cannot be answered.
    rig.input(Subscriber, &message("REPLICATE "));
    rig.session.advance(&StreamName::Caches, Token(9)).unwrap();
    rig.drain();
    assert!(rig.take_sent(Publisher).is_empty());
    assert!(rig.take_sent(Subscriber).is_empty());

    rig.run_for(secs(5));
    rig.connect(Publisher);
    let sent = rig.take_sent(Publisher);
    assert_eq!(sent.len(), 3, "AUTH, SELECT, CLIENT SETNAME");
    rig.answer(Publisher, &sent);
    assert_eq!(rig.summaries(), ["ready"]);
    assert_eq!(
        rig.take_sent(Publisher),
        [publish("POSITION caches worker1 9 9")],
        "positions again, no REPLICATE: the subscription did not change"
    );
    assert_eq!(rig.session.counters().connections, [1, 2]);
}

// ---------------------------------------------------------------------
// Limits and broken input
// ---------------------------------------------------------------------

#[test]
fn a_publisher_that_cannot_keep_up_is_closed() {
    let mut options = options();
    options.max_unsent_bytes = 512;
    let mut rig = Rig::ready(options);
    rig.blocked[index(Publisher)] = true;
    let mut sent = 0;
    while rig.closing().is_empty() {
        rig.session.send(user_sync()).unwrap();
        rig.drain();
        sent += 1;
        assert!(sent < 100);
    }
    let publish_len = resp::publish_len(PREFIX.as_bytes(), &user_sync().to_bytes().unwrap());
    assert_eq!(
        sent,
        512 / publish_len + 1,
        "closed on the first byte past 512"
    );
    assert!(!rig.session.is_connected(Publisher));
    assert_eq!(rig.session.counters().failures, [0, 1]);
    rig.blocked[index(Publisher)] = false;
    assert_eq!(rig.session.poll_transmit(Publisher), None);

    // The driver reconnects: positions are announced again.
    rig.disconnect(Publisher);
    rig.connect(Publisher);
    let handshake = rig.take_sent(Publisher);
    rig.answer(Publisher, &handshake);
    assert_eq!(rig.summaries(), ["ready"]);
    assert_eq!(
        rig.take_sent(Publisher),
        [publish("POSITION caches worker1 7 7")]
    );
}

#[test]
fn failed_to_keep_up_reports_the_unsent_bytes() {
    let mut options = plain_options();
    options.max_unsent_bytes = 200;
    let mut rig = Rig::ready(options);
    rig.blocked[index(Publisher)] = true;
    rig.session.send(user_sync()).unwrap();
    rig.session.send(user_sync()).unwrap();
    rig.drain();
    let closing = rig.closing();
    let publish_len = resp::publish_len(PREFIX.as_bytes(), &user_sync().to_bytes().unwrap());
    assert!(
        matches!(
            &closing[..],
            [(Publisher, RedisError::FailedToKeepUp(unsent))] if *unsent == 2 * publish_len
        ),
        "{closing:?}"
    );
}

/// A link given up with `Closing` takes nothing more before the driver
/// calls `disconnected`: commands sent in that window (say by an
/// application reacting to an earlier event of the same drain) are refused
/// with `NotConnected` and counted as dropped, and the dead link buffers
/// nothing.
#[test]
fn nothing_is_published_on_a_link_given_up() {
    let mut options = plain_options();
    options.max_unsent_bytes = 200;
    let mut rig = Rig::ready(options);
    rig.blocked[index(Publisher)] = true;
    rig.session.send(user_sync()).unwrap();
    rig.session.send(user_sync()).unwrap();
    rig.drain();
    assert!(matches!(
        &rig.closing()[..],
        [(Publisher, RedisError::FailedToKeepUp(_))]
    ));
    // Not yet `disconnected`: the driver is still draining events.
    let published = rig.session.counters().published.total();
    let results: Vec<String> = (0..10)
        .map(|_| format!("{:?}", rig.session.send(user_sync())))
        .collect();
    let unsent = rig.session.unsent_bytes(Publisher);
    let counted = rig.session.counters().published.total() - published;
    assert!(
        unsent == 0 && counted == 0 && results.iter().all(|result| result == "Err(NotConnected)"),
        "send gave {results:?}; {counted} counted as published; \
         {unsent} bytes buffered on a link given up"
    );
}

#[test]
fn a_bad_type_byte_closes_the_link() {
    let mut rig = Rig::ready(options());
    rig.input(
        Subscriber,
        &concat(&[&message("REMOTE_SERVER_UP a.org"), b"?oops\r\n"]),
    );
    let events = rig.take_events();
    assert_eq!(summary(&events[0]), "command REMOTE_SERVER_UP a.org");
    assert!(
        matches!(
            &events[1..],
            [RedisEvent::Closing {
                link: Subscriber,
                error: RedisError::Protocol(RespError::InvalidType { byte: b'?', .. })
            }]
        ),
        "{events:?}"
    );
    assert_eq!(rig.session.buffered_input(), 0);

    rig.input(Publisher, b"%\x00garbage");
    let closing = rig.closing();
    assert!(
        matches!(&closing[..], [(Publisher, RedisError::Protocol(_))]),
        "{closing:?}"
    );
    assert_eq!(rig.session.unsent_bytes(Publisher), 0);
}

#[test]
fn huge_declared_lengths_are_refused_before_anything_is_buffered() {
    // A bulk string of 10 GB, declared inside a message.
    let mut rig = Rig::ready(options());
    rig.input(
        Subscriber,
        b"*3\r\n$7\r\nmessage\r\n$11\r\nexample.com\r\n$10000000000\r\n",
    );
    let closing = rig.closing();
    assert!(
        matches!(
            &closing[..],
            [(
                Subscriber,
                RedisError::Protocol(RespError::BulkTooLong {
                    len: 10_000_000_000,
                    ..
                })
            )]
        ),
        "{closing:?}"
    );
    assert_eq!(rig.session.buffered_input(), 0);

    // An array of a billion elements.
    let mut rig = Rig::ready(options());
    rig.input(Subscriber, b"*1000000000\r\n");
    let closing = rig.closing();
    assert!(
        matches!(
            &closing[..],
            [(
                Subscriber,
                RedisError::Protocol(RespError::TooManyElements { .. })
            )]
        ),
        "{closing:?}"
    );

    // Within small limits, an unfinished bulk waits; one beyond them does not.
    let mut options = options();
    options.resp_limits = Limits::new()
        .with_max_bulk_len(1024)
        .with_max_frame_len(2048)
        .with_max_line_len(256);
    let mut rig = Rig::ready(options.clone());
    let mut partial = b"*3\r\n$7\r\nmessage\r\n$11\r\nexample.com\r\n$1000\r\n".to_vec();
    partial.extend(std::iter::repeat_n(b'x', 500));
    rig.input(Subscriber, &partial);
    assert!(rig.take_events().is_empty());
    assert_eq!(rig.session.buffered_input(), partial.len());
    let mut rig = Rig::ready(options.clone());
    rig.input(
        Subscriber,
        b"*3\r\n$7\r\nmessage\r\n$11\r\nexample.com\r\n$1025\r\n",
    );
    assert!(matches!(
        &rig.closing()[..],
        [(
            Subscriber,
            RedisError::Protocol(RespError::BulkTooLong {
                len: 1025,
                max: 1024
            })
        )]
    ));

    // A line that never ends is refused once past the line limit, fed
    // in small reads: never more than the limit and one read is buffered.
    let mut rig = Rig::ready(options);
    rig.input(Subscriber, b"+");
    let mut fed = 1;
    loop {
        rig.input(Subscriber, &[b'a'; 64]);
        fed += 64;
        if !rig.session.is_connected(Subscriber) {
            break;
        }
        assert!(rig.session.buffered_input() <= 256 + 64);
        assert!(fed < 10_000, "never refused");
    }
    assert!(matches!(
        &rig.closing()[..],
        [(
            Subscriber,
            RedisError::Protocol(RespError::LineTooLong { max: 256, .. })
        )]
    ));
    assert_eq!(rig.session.buffered_input(), 0);
}

#[test]
fn a_quick_resubscription_replicates_at_once() {
    // The REPLICATE of a new subscription does not wait for the writer's
    // rate limit (the driver's backoff spaces reconnections out).
    let mut rig = Rig::ready(plain_options());
    rig.run_for(Duration::from_millis(300));
    rig.disconnect(Subscriber);
    rig.connect(Subscriber);
    let sent = rig.take_sent(Subscriber);
    rig.answer(Subscriber, &sent);
    assert_eq!(rig.summaries(), ["ready"]);
    assert_eq!(
        rig.take_sent(Publisher),
        [
            publish("REPLICATE "),
            publish("POSITION caches worker1 7 7")
        ]
    );
    rig.input(Publisher, &concat(&[&integer(1), &integer(1)]));
    // The publisher alone comes back: positions, no REPLICATE.
    rig.run_for(Duration::from_millis(300));
    rig.disconnect(Publisher);
    rig.connect(Publisher);
    assert_eq!(rig.summaries(), ["ready"]);
    assert_eq!(
        rig.take_sent(Publisher),
        [publish("POSITION caches worker1 7 7")]
    );
    assert_eq!(
        rig.session.counters().published.get(CommandKind::Replicate),
        2
    );
}

#[test]
fn noauth_is_an_auth_error_whatever_it_answers() {
    // A Redis 6 with a password, and a session configured without one:
    // HELLO is refused for want of a password, not for want of RESP3.
    let mut options = resp3_options();
    options.auth = None;
    let mut rig = Rig::new(options);
    rig.connect_all();
    rig.input(
        Subscriber,
        b"-NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time\r\n",
    );
    let closing = rig.closing();
    assert!(
        matches!(&closing[..], [(Subscriber, RedisError::Auth(error))] if error.code == "NOAUTH"),
        "{closing:?}"
    );
    assert!(!rig.session.wants(Publisher), "RESP3 is kept");

    // SUBSCRIBE and CLIENT SETNAME refused for want of a password.
    let mut options = plain_options();
    options.client_name = Some("w".to_owned());
    for replies in [
        &b"-NOAUTH Authentication required.\r\n"[..],
        b"+OK\r\n-NOAUTH Authentication required.\r\n",
    ] {
        let mut rig = Rig::new(options.clone());
        rig.connect(Subscriber);
        assert_eq!(
            rig.take_sent(Subscriber),
            [
                args(&["CLIENT", "SETNAME", "w-sub"]),
                args(&["SUBSCRIBE", PREFIX])
            ]
        );
        rig.input(Subscriber, replies);
        let closing = rig.closing();
        assert!(
            matches!(&closing[..], [(Subscriber, RedisError::Auth(error))] if error.code == "NOAUTH"),
            "{closing:?}"
        );
        assert_eq!(rig.session.counters().closes.get("auth"), Some(&1));
    }
}
