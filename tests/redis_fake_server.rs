//! The Redis client against a server that misbehaves: a TCP listener in
//! the test that answers the client's handshake with malformed RESP, huge
//! declared lengths, deep nesting, or a valid script cut at every byte
//! offset. Each must end in a clear error or a closed connection and a
//! reconnect: no panic, no large allocation, no event from a frame that
//! never completed.

#![cfg(feature = "runtime-smol")]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};
use synapse_replication::session::Disconnect;

use synapse_replication::config::{RedisConfig, StreamWriters};
use synapse_replication::positions::{Follower, Writer};
use synapse_replication::resp::RespError;
use synapse_replication::session::{RedisError, RedisEvent, RedisLink, RedisSession};
use synapse_replication::transport::{RedisClient, RedisClientConfig, SmolRuntime};
use synapse_replication::wire::InstanceName;

const PREFIX: &str = "fake.example";

/// What the fake server answers a subscriber connection (given the number
/// of the connection, from 0); publishers get `+OK` and silence.
type Script = Arc<dyn Fn(usize) -> Vec<u8> + Send + Sync>;

/// A fake Redis: answers each subscriber connection with its script, then
/// closes it; counts subscriber connections.
struct FakeServer {
    port: u16,
    subscribers: Arc<AtomicUsize>,
}

impl FakeServer {
    fn start(script: Script) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let subscribers = Arc::new(AtomicUsize::new(0));
        let count = subscribers.clone();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                let script = script.clone();
                let count = count.clone();
                thread::spawn(move || serve(stream, &script, &count));
            }
        });
        FakeServer { port, subscribers }
    }

    fn subscribers(&self) -> usize {
        self.subscribers.load(Ordering::SeqCst)
    }
}

fn serve(mut stream: TcpStream, script: &Script, count: &AtomicUsize) {
    // The client sends its whole handshake at once: read until it is there.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(2);
    while !seen.ends_with(b"\r\n") || !contains(&seen, b"SETNAME") {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(_) if Instant::now() < deadline => {}
            Err(_) => return,
        }
    }
    // A subscriber's SUBSCRIBE follows its SETNAME: catch it if it came
    // in a read of its own.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(20)));
    if let Ok(n) = stream.read(&mut buf) {
        seen.extend_from_slice(&buf[..n]);
    }
    if contains(&seen, b"SUBSCRIBE") {
        let n = count.fetch_add(1, Ordering::SeqCst);
        let _ = stream.write_all(&script(n));
        // Closing (dropping) the socket ends the connection.
    } else {
        let _ = stream.write_all(b"+OK\r\n");
        let _ = stream.set_read_timeout(None);
        while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

/// What a client saw.
#[derive(Default)]
struct Seen {
    protocol_errors: Vec<RespError>,
    other_closing: Vec<RedisError>,
    closed: usize,
    /// The follower's events, as the client shows them.
    follower_events: Vec<String>,
    ready: usize,
}

/// Runs a client against `server` until `done` holds (or 20 s pass).
fn run(server: &FakeServer, mut done: impl FnMut(&Seen, &FakeServer) -> bool) -> Seen {
    let registry = Arc::new(StreamWriters::default().with_redis(true));
    let me = InstanceName::from("worker1");
    let config = RedisConfig::tcp("127.0.0.1", server.port);
    let session = RedisSession::new(
        config.session_config(PREFIX),
        Follower::new(me.clone(), registry.clone()),
        Writer::new(me, registry),
    );
    let mut options = RedisClientConfig::default();
    options.initial_backoff = Duration::from_millis(1);
    options.max_backoff = Duration::from_millis(5);
    let mut client = RedisClient::with_config(SmolRuntime, config, session, options);
    let seen = Mutex::new(Seen::default());
    let deadline = Instant::now() + Duration::from_secs(20);
    smol::block_on(async {
        loop {
            let timeout = async {
                smol::Timer::after(Duration::from_millis(50)).await;
                None
            };
            let event = smol::future::or(client.next_event(), timeout).await;
            let mut seen = seen.lock().expect("seen");
            match event {
                Some(RedisEvent::Disconnected {
                    reason: Disconnect::Redis(error),
                    link,
                    ..
                }) => {
                    assert_eq!(link, RedisLink::Subscriber, "{error}");
                    match error {
                        RedisError::Protocol(error) => seen.protocol_errors.push(error),
                        other => seen.other_closing.push(other),
                    }
                }
                Some(RedisEvent::Disconnected {
                    link: RedisLink::Subscriber,
                    reason: Disconnect::Closed,
                    ..
                }) => seen.closed += 1,
                Some(event @ RedisEvent::Follower(_)) => {
                    seen.follower_events.push(event.to_string())
                }
                Some(RedisEvent::Ready) => seen.ready += 1,
                _ => {}
            }
            if done(&seen, server) {
                break;
            }
            assert!(Instant::now() < deadline, "the client never got there");
        }
    });
    seen.into_inner().expect("seen")
}

const OK: &[u8] = b"+OK\r\n";

fn confirmation() -> Vec<u8> {
    format!(
        "*3\r\n$9\r\nsubscribe\r\n${}\r\n{PREFIX}\r\n:1\r\n",
        PREFIX.len()
    )
    .into_bytes()
}

fn message(payload: &str) -> Vec<u8> {
    format!(
        "*3\r\n$7\r\nmessage\r\n${}\r\n{PREFIX}\r\n${}\r\n{payload}\r\n",
        PREFIX.len(),
        payload.len()
    )
    .into_bytes()
}

/// Each bad answer gives a protocol error at once, then a reconnect (and
/// the same again), never a panic.
#[test]
fn malformed_answers_are_errors_and_reconnects() {
    type Case = (&'static str, Vec<u8>, fn(&RespError) -> bool);
    let cases: Vec<Case> = vec![
        ("bad type byte", b"?garbage\r\n".to_vec(), |error| {
            matches!(error, RespError::InvalidType { .. })
        }),
        (
            "huge bulk length",
            b"$9999999999999\r\n".to_vec(),
            RespError::is_limit,
        ),
        (
            "huge element count",
            b"*4000000000\r\n".to_vec(),
            RespError::is_limit,
        ),
        (
            "deep nesting",
            b"*1\r\n".repeat(10_000),
            RespError::is_limit,
        ),
        ("bad integer", b":12x\r\n".to_vec(), |error| {
            matches!(error, RespError::InvalidValue { .. })
        }),
        ("bad CRLF", b"$3\r\nabcd\r\n".to_vec(), |error| {
            matches!(error, RespError::MissingCrlf { .. })
        }),
    ];
    for (name, answer, expected) in cases {
        let server = FakeServer::start(Arc::new(move |_| {
            let mut script = OK.to_vec();
            script.extend_from_slice(&answer);
            script
        }));
        let seen = run(&server, |seen, server| {
            seen.protocol_errors.len() >= 3 && server.subscribers() >= 3
        });
        for error in &seen.protocol_errors {
            assert!(expected(error), "{name}: {error}");
            assert!(error.to_string().len() < 200, "{name}: a short message");
        }
        assert!(
            seen.other_closing.is_empty(),
            "{name}: {:?}",
            seen.other_closing
        );
        assert_eq!(seen.ready, 0, "{name}");
        assert!(seen.follower_events.is_empty(), "{name}");
    }
}

/// An error reply to SUBSCRIBE is a typed error, not a protocol error.
#[test]
fn a_refused_subscribe_is_a_typed_error() {
    let server = FakeServer::start(Arc::new(|_| {
        let mut script = OK.to_vec();
        script.extend_from_slice(
            b"-NOPERM this user has no permissions to access one of the channels\r\n",
        );
        script
    }));
    let seen = run(&server, |seen, _| seen.other_closing.len() >= 2);
    for error in &seen.other_closing {
        assert!(
            matches!(error, RedisError::Subscribe(e) if e.code == "NOPERM"),
            "{error}"
        );
    }
}

/// A valid answer (name accepted, subscription confirmed, a POSITION
/// message) cut after every byte offset, one connection per offset: each
/// cut is a closed connection and a reconnect; the POSITION is delivered
/// only by connections that received all of it.
#[test]
fn answers_cut_at_every_byte_offset() {
    let mut full = OK.to_vec();
    full.extend(confirmation());
    full.extend(message("POSITION events master 1 1"));
    let len = full.len();
    let script = full.clone();
    let server = FakeServer::start(Arc::new(move |n| {
        // Offsets 0..len, then the whole script once more.
        script[..n.min(len)].to_vec()
    }));
    let seen = run(&server, |seen, _| !seen.follower_events.is_empty());
    assert!(
        seen.protocol_errors.is_empty(),
        "{:?}",
        seen.protocol_errors
    );
    assert!(seen.other_closing.is_empty(), "{:?}", seen.other_closing);
    assert!(
        seen.closed >= len,
        "{} closes for {len} offsets",
        seen.closed
    );
    assert_eq!(seen.follower_events, ["started events master 1"]);
    // Ready once the confirmation is complete, on every later connection.
    let confirmed_at = OK.len() + confirmation().len();
    assert_eq!(seen.ready, len - confirmed_at + 1, "ready count");
}
