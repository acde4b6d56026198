//! The RESP codec against a real redis-server: commands from the encoder,
//! replies through the decoder, in RESP2 and (after HELLO 3) RESP3.
//!
//! Each test starts its own redis-server on a free loopback port (never
//! 6379), with no persistence, and kills it at the end. Replies are read
//! in small reads, so frames arrive split at arbitrary points, and every
//! frame must re-encode to exactly the bytes Redis sent.
//!
//! Needs `redis-server` on PATH (`apt-get install redis-server`); without
//! it these tests fail, they do not skip.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use synapse_replication::resp::{
    Credentials, Frame, Hello, Incoming, Message, Protocol, RespDecoder, SubscriptionKind,
    encode_auth, encode_client_setname, encode_command, encode_hello, encode_ping, encode_publish,
    encode_quit, encode_select, encode_subscribe, encode_unsubscribe,
};

/// A redis-server of our own, killed when dropped.
struct Server {
    child: Child,
    port: u16,
}

/// Whether the redis-server on `port` is the process `pid` (its
/// `INFO server` says `process_id:<pid>`); `None` if it wants a password
/// first.
fn serves(port: u16, pid: u32) -> Option<bool> {
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return Some(false);
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
        .is_err()
    {
        return Some(false);
    }
    let wanted = format!("process_id:{pid}\r\n");
    let mut reply = Vec::new();
    let mut chunk = [0; 4096];
    // The reply is one bulk string of a few hundred bytes; its
    // `process_id` line comes early.
    while reply.len() < 64 << 10 {
        match stream.read(&mut chunk) {
            Ok(n) if n > 0 => reply.extend_from_slice(&chunk[..n]),
            _ => return Some(false),
        }
        if reply.starts_with(b"-NOAUTH") {
            return None;
        }
        if reply
            .windows(wanted.len())
            .any(|line| line == wanted.as_bytes())
        {
            return Some(true);
        }
        if reply.windows(11).any(|line| line == b"process_id:") && reply.ends_with(b"\r\n\r\n") {
            return Some(false);
        }
    }
    Some(false)
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        for _attempt in 0..5 {
            // A port the OS says is free; the server may still lose a race
            // for it, in which case it exits and we try another.
            let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .and_then(|listener| listener.local_addr())
                .expect("a free loopback port")
                .port();
            assert_ne!(port, 6379);
            let dir = std::env::temp_dir();
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .args(["--dir", dir.to_str().expect("a UTF-8 temp dir")])
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn();
            let child = match child {
                Ok(child) => child,
                Err(error) if error.kind() == ErrorKind::NotFound => panic!(
                    "redis-server is not on PATH: install it (e.g. `apt-get install \
                     redis-server`) to run tests/resp_redis.rs"
                ),
                Err(error) => panic!("starting redis-server: {error}"),
            };
            let mut server = Server { child, port };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = server.child.try_wait() {
                    break; // lost the port; try another
                }
                // Answered by this server, not by another test's that won
                // the same port a moment before (this one then exits).
                // (A server that wants a password answers `NOAUTH`: then it
                // is taken as this one if this one still runs.)
                match serves(port, server.child.id()) {
                    Some(true) => return server,
                    Some(false) => {}
                    None => {
                        sleep(Duration::from_millis(100));
                        if let Ok(None) = server.child.try_wait() {
                            return server;
                        }
                    }
                }
                sleep(Duration::from_millis(20));
            }
        }
        panic!("redis-server did not start");
    }

    /// A connection that reads at most `read_size` bytes at a time.
    fn connect(&self, read_size: usize) -> Conn {
        let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        Conn {
            stream,
            read_size,
            buf: BytesMut::new(),
            decoder: RespDecoder::new(),
            received: Vec::new(),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Conn {
    stream: TcpStream,
    read_size: usize,
    buf: BytesMut,
    decoder: RespDecoder,
    /// Everything read, to compare re-encoded frames with.
    received: Vec<u8>,
}

impl Conn {
    fn send(&mut self, write: impl FnOnce(&mut BytesMut)) {
        let mut out = BytesMut::new();
        write(&mut out);
        self.stream.write_all(&out).expect("write");
    }

    fn command(&mut self, args: &[&str]) {
        let args: Vec<&[u8]> = args.iter().map(|arg| arg.as_bytes()).collect();
        self.send(|out| encode_command(out, &args));
    }

    fn read_more(&mut self) {
        let mut chunk = vec![0; self.read_size];
        let n = self.stream.read(&mut chunk).expect("read");
        assert!(n > 0, "redis closed the connection");
        self.buf.extend_from_slice(&chunk[..n]);
        self.received.extend_from_slice(&chunk[..n]);
    }

    /// Offset in `received` of the first byte not decoded yet.
    fn decoded_up_to(&self) -> usize {
        self.received.len() - self.buf.len()
    }

    /// The next frame; checks it re-encodes to the bytes Redis sent.
    fn frame(&mut self) -> Frame {
        loop {
            let start = self.decoded_up_to();
            if let Some(frame) = self.decoder.decode(&mut self.buf).expect("valid RESP") {
                let raw = &self.received[start..self.decoded_up_to()];
                assert_eq!(
                    frame.to_bytes().expect("encodes"),
                    raw,
                    "re-encoding {frame:?}"
                );
                return frame;
            }
            self.read_more();
        }
    }

    fn incoming(&mut self) -> Incoming {
        loop {
            if let Some(incoming) = self
                .decoder
                .decode_pubsub(&mut self.buf)
                .expect("valid RESP")
            {
                return incoming;
            }
            self.read_more();
        }
    }

    fn expect_ok(&mut self) {
        assert_eq!(self.frame(), Frame::SimpleString("OK".into()));
    }

    fn expect_error(&mut self, prefix: &str) {
        match self.frame() {
            Frame::Error(text) | Frame::BulkError(text) => assert!(
                text.starts_with(prefix.as_bytes()),
                "{:?} should start with {prefix}",
                String::from_utf8_lossy(&text)
            ),
            other => panic!("expected an error {prefix}, got {other:?}"),
        }
    }
}

fn subscribed(kind: SubscriptionKind, channel: &str, count: i64) -> Incoming {
    Incoming::Subscription {
        kind,
        channel: Some(Bytes::copy_from_slice(channel.as_bytes())),
        count,
    }
}

/// What a busy deployment publishes, and payloads that would trip a
/// careless decoder: CRLF and RESP inside, empty, large.
fn payloads() -> Vec<(&'static str, Vec<u8>)> {
    let mut payloads = Vec::new();
    for index in 0..300 {
        let line = format!(
            r#"RDATA events event_persister1 {} ["ev",["$9lUlKX4q1T0CMy0tPQbWuzMJH3AeiRLw0mBzb8Z0pkA","!OGEhHVWSdvArJzumhm:matrix.org","m.room.message",null,null,null,null,false,false]]"#,
            4_183_921 + index
        );
        payloads.push(("example.com", line.into_bytes()));
    }
    payloads.push(("example.com", Vec::new()));
    payloads.push((
        "example.com",
        b"*3\r\n$7\r\nmessage\r\n\r\n$-1\r\n".to_vec(),
    ));
    payloads.push((
        "example.com/USER_IP",
        br#"USER_IP @alice:example.com ["syt_token","10.0.0.1","Element",null,1700000000000]"#
            .to_vec(),
    ));
    payloads.push(("example.com", (0..=255u8).cycle().take(300_000).collect()));
    payloads
}

#[test]
fn resp2_subscribe_publish_ping() {
    let server = Server::start(&[]);
    let mut subscriber = server.connect(7);
    let mut publisher = server.connect(1460);

    subscriber.send(|out| encode_subscribe(out, &[b"example.com", b"example.com/USER_IP"]));
    assert_eq!(
        subscriber.incoming(),
        subscribed(SubscriptionKind::Subscribe, "example.com", 1)
    );
    assert_eq!(
        subscriber.incoming(),
        subscribed(SubscriptionKind::Subscribe, "example.com/USER_IP", 2)
    );
    // In RESP2 subscribe mode, PING answers ["pong", message].
    subscriber.send(|out| encode_ping(out, None));
    assert_eq!(subscriber.incoming(), Incoming::Pong(Bytes::new()));
    subscriber.send(|out| encode_ping(out, Some(b"keep-alive 1")));
    assert_eq!(subscriber.incoming(), Incoming::Pong("keep-alive 1".into()));

    // Pipelined: every PUBLISH in one write, then the replies.
    let payloads = payloads();
    publisher.send(|out| {
        for (channel, payload) in &payloads {
            encode_publish(out, channel.as_bytes(), payload);
        }
    });
    for _ in &payloads {
        assert_eq!(
            publisher.frame(),
            Frame::Integer(1),
            "one subscriber got it"
        );
    }
    for (channel, payload) in &payloads {
        assert_eq!(
            subscriber.incoming(),
            Incoming::Message(Message {
                pattern: None,
                channel: Bytes::copy_from_slice(channel.as_bytes()),
                payload: Bytes::copy_from_slice(payload),
            })
        );
    }

    // Patterns.
    let mut pattern = server.connect(3);
    pattern.command(&["PSUBSCRIBE", "example.*"]);
    assert_eq!(
        pattern.incoming(),
        subscribed(SubscriptionKind::PSubscribe, "example.*", 1)
    );
    publisher.send(|out| encode_publish(out, b"example.com", b"PING 1700000000000"));
    assert_eq!(publisher.frame(), Frame::Integer(2));
    let expected = Message {
        pattern: Some("example.*".into()),
        channel: "example.com".into(),
        payload: "PING 1700000000000".into(),
    };
    assert_eq!(pattern.incoming(), Incoming::Message(expected.clone()));
    // The plain subscriber got it too, without the pattern.
    let plain = Message {
        pattern: None,
        ..expected
    };
    assert_eq!(subscriber.incoming(), Incoming::Message(plain));

    // Outside subscribe mode: PING answers +PONG, or the message as a bulk
    // string; errors are simple errors.
    publisher.send(|out| encode_ping(out, None));
    assert_eq!(
        Incoming::from_frame(publisher.frame()),
        Incoming::Pong(Bytes::new())
    );
    publisher.send(|out| encode_ping(out, Some(b"hello")));
    assert_eq!(publisher.frame(), Frame::bulk("hello"));
    publisher.command(&["NOSUCHCOMMAND", "x"]);
    publisher.expect_error("ERR unknown command");
    publisher.send(|out| encode_select(out, 1));
    publisher.expect_ok();
    publisher.send(|out| encode_client_setname(out, b"synapse-replication-test"));
    publisher.expect_ok();
    publisher.command(&["CLIENT", "GETNAME"]);
    assert_eq!(publisher.frame(), Frame::bulk("synapse-replication-test"));
    // RESP2 nulls.
    publisher.command(&["GET", "no-such-key"]);
    assert_eq!(publisher.frame(), Frame::NullBulkString);
    publisher.command(&["BLPOP", "no-such-list", "0.01"]);
    assert_eq!(publisher.frame(), Frame::NullArray);

    // Unsubscribing from everything confirms each channel.
    subscriber.send(|out| encode_unsubscribe(out, &[]));
    let mut counts = Vec::new();
    for _ in 0..2 {
        match subscriber.incoming() {
            Incoming::Subscription {
                kind: SubscriptionKind::Unsubscribe,
                channel: Some(_),
                count,
            } => counts.push(count),
            other => panic!("expected an unsubscribe confirmation, got {other:?}"),
        }
    }
    assert_eq!(counts, [1, 0]);

    publisher.send(encode_quit);
    publisher.expect_ok();
}

#[test]
// `DEBUG PROTOCOL double` answers the literal 3.141, not an approximation of pi.
#[allow(clippy::approx_constant)]
fn resp3_hello_auth_pushes_and_every_type() {
    let server = Server::start(&["--requirepass", "s3cret", "--enable-debug-command", "yes"]);
    let mut conn = server.connect(5);

    conn.send(|out| encode_ping(out, None));
    conn.expect_error("NOAUTH");
    let wrong = Credentials {
        username: None,
        password: b"wrong",
    };
    conn.send(|out| encode_auth(out, &wrong));
    conn.expect_error("WRONGPASS");

    let hello = Hello {
        protocol: Protocol::Resp3,
        auth: Some(Credentials {
            username: None,
            password: b"s3cret",
        }),
        client_name: Some(b"synapse-replication-test"),
    };
    conn.send(|out| encode_hello(out, &hello));
    let Frame::Map(server_info) = conn.frame() else {
        panic!("HELLO 3 answers a map");
    };
    let proto = server_info
        .iter()
        .find(|(key, _)| key.as_bytes().is_some_and(|key| key.as_ref() == b"proto"))
        .map(|(_, value)| value.clone());
    assert_eq!(proto, Some(Frame::Integer(3)));
    conn.command(&["CLIENT", "GETNAME"]);
    assert_eq!(conn.frame(), Frame::bulk("synapse-replication-test"));

    // Every RESP3 type Redis can send.
    let mut kinds = Vec::new();
    for kind in [
        "string", "integer", "double", "bignum", "null", "array", "set", "map", "attrib",
        "verbatim", "true", "false",
    ] {
        conn.command(&["DEBUG", "PROTOCOL", kind]);
        kinds.push((kind, conn.frame()));
    }
    for (kind, frame) in &kinds {
        let ok = match *kind {
            "string" => matches!(frame, Frame::BulkString(_)),
            "integer" => matches!(frame, Frame::Integer(_)),
            "double" => frame
                .as_f64()
                .is_some_and(|value| (value - 3.141).abs() < 1e-9),
            "bignum" => matches!(frame, Frame::BigNumber(_)),
            "null" => *frame == Frame::Null,
            "array" => matches!(frame, Frame::Array(items) if items.len() == 3),
            "set" => matches!(frame, Frame::Set(items) if items.len() == 3),
            "map" => matches!(frame, Frame::Map(pairs) if pairs.len() == 3),
            "attrib" => matches!(
                frame,
                Frame::Attribute { attributes, data }
                    if attributes.len() == 1 && matches!(**data, Frame::BulkString(_))
            ),
            "verbatim" => matches!(
                frame,
                Frame::VerbatimString { format, text }
                    if format == b"txt" && text.as_ref() == b"This is a verbatim\nstring"
            ),
            "true" => *frame == Frame::Boolean(true),
            "false" => *frame == Frame::Boolean(false),
            _ => false,
        };
        assert!(ok, "DEBUG PROTOCOL {kind}: {frame:?}");
    }
    // A push, then the real reply.
    conn.command(&["DEBUG", "PROTOCOL", "push"]);
    assert!(matches!(conn.frame(), Frame::Push(items) if items.len() == 2));
    assert!(matches!(conn.frame(), Frame::BulkString(_)));

    // RESP3: one connection subscribes and publishes; messages are pushes.
    conn.send(|out| encode_subscribe(out, &[b"example.com"]));
    assert_eq!(
        conn.incoming(),
        subscribed(SubscriptionKind::Subscribe, "example.com", 1)
    );
    conn.send(|out| encode_publish(out, b"example.com", b"REPLICATE "));
    let mut got = vec![conn.incoming(), conn.incoming()];
    got.sort_by_key(|incoming| matches!(incoming, Incoming::Frame(_)));
    assert_eq!(
        got,
        [
            Incoming::Message(Message {
                pattern: None,
                channel: "example.com".into(),
                payload: "REPLICATE ".into(),
            }),
            Incoming::Frame(Frame::Integer(1)),
        ]
    );
    conn.send(|out| encode_ping(out, None));
    assert_eq!(conn.incoming(), Incoming::Pong(Bytes::new()));

    // An ACL user that may not publish.
    conn.command(&[
        "ACL",
        "SETUSER",
        "reader",
        "on",
        ">readerpw",
        "~*",
        "&*",
        "+@all",
        "-publish",
    ]);
    conn.expect_ok();
    let mut reader = server.connect(11);
    let reader_credentials = Credentials {
        username: Some(b"reader"),
        password: b"readerpw",
    };
    reader.send(|out| encode_auth(out, &reader_credentials));
    reader.expect_ok();
    reader.send(|out| encode_publish(out, b"example.com", b"PING 1"));
    reader.expect_error("NOPERM");
    let mut hello_reader = server.connect(4096);
    hello_reader.send(|out| {
        encode_hello(
            out,
            &Hello {
                protocol: Protocol::Resp3,
                auth: Some(reader_credentials),
                client_name: None,
            },
        )
    });
    assert!(matches!(hello_reader.frame(), Frame::Map(_)));

    conn.send(encode_quit);
    conn.expect_ok();
}
