//! Secrets never appear in `Debug` output: the Redis password (in configs,
//! and in a session's output until `AUTH` is sent) and a `USER_IP` access
//! token (in a published line, in a received line, in events), in every
//! public type that can hold them, sans-IO and over real sockets (a
//! redis-server with `requirepass`, and direct TCP on loopback).
//!
//! Each check first makes sure the secret really is where it is looked
//! for (in the bytes the session will send, or has received), so that a
//! type that simply never held it cannot pass for one that hides it.

#![cfg(all(feature = "runtime-smol", unix))]

mod common;

use std::fmt::Debug;
use std::future::{Future, poll_fn};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::redis_server::RedisServer;
use common::redis_session::{PREFIX, redis_session, registry};
use synapse_replication::positions::{Follower, Writer};
use synapse_replication::resp::Credentials;
use synapse_replication::session::{
    ClientSession, RedisAuth, RedisEvent, RedisLink, RedisSession, RedisSessionConfig, ServerEvent,
    ServerSession,
};
use synapse_replication::transport::{
    RedisClient, RedisClientEvent, RedisConfig, SmolRuntime, SynapseRedisConfig, TcpClient,
    TcpClientEvent, TcpServer, TcpServerEvent,
};
use synapse_replication::wire::{Command, InstanceName, StreamName, Token, UserIp};
use synapse_replication::writers::StreamWriters;

const PASSWORD: &str = "hunter2-password";
const TOKEN: &str = "syt_secret_token";
const PATIENCE: Duration = Duration::from_secs(20);

/// `{:?}` and `{:#?}` of `value` show neither secret.
#[track_caller]
fn assert_hidden(what: &str, value: &dyn Debug) {
    for text in [format!("{value:?}"), format!("{value:#?}")] {
        for secret in [PASSWORD, TOKEN] {
            if let Some(at) = text.find(secret) {
                let from = at.saturating_sub(120);
                let to = (at + secret.len() + 40).min(text.len());
                panic!(
                    "{what}'s Debug shows {secret:?} ({} bytes of output): ...{}...",
                    text.len(),
                    text.get(from..to).unwrap_or(&text)
                );
            }
        }
    }
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

fn user_ip_line() -> String {
    format!(
        r#"USER_IP @alice:example.com ["{TOKEN}","10.0.0.1","Element/1.0","DEVICE",1700000000000]"#
    )
}

fn user_ip() -> Command {
    Command::decode(Bytes::from(user_ip_line()))
        .expect("USER_IP decodes")
        .expect("a command")
}

fn auth(username: Option<&str>) -> RedisAuth {
    RedisAuth {
        username: username.map(str::to_owned),
        password: PASSWORD.to_owned(),
    }
}

fn bulk(text: &str) -> String {
    format!("${}\r\n{text}\r\n", text.len())
}

fn subscribed(channel: &str, count: usize) -> String {
    format!("*3\r\n{}{}:{count}\r\n", bulk("subscribe"), bulk(channel))
}

fn message(channel: &str, payload: &str) -> String {
    format!(
        "*3\r\n{}{}{}",
        bulk("message"),
        bulk(channel),
        bulk(payload)
    )
}

// ---------------------------------------------------------------------
// The wire command, configs and credentials.
// ---------------------------------------------------------------------

#[test]
fn user_ip_hides_its_token_in_debug_but_not_on_the_wire() {
    let command = user_ip();
    assert_hidden("Command::UserIp", &command);
    let Command::UserIp(ip) = &command else {
        panic!("a USER_IP");
    };
    assert_eq!(&*ip.access_token, TOKEN);
    assert_hidden("UserIp", ip);
    // The encoding stays exact: the token is the command's data.
    let mut encoded = bytes::BytesMut::new();
    command.encode(&mut encoded).expect("encodes");
    assert_eq!(&encoded[..], user_ip_line().as_bytes());
    let copy: UserIp = (**ip).clone();
    assert_hidden("a cloned UserIp", &copy);

    // A USER_IP that does not decode: the error does not quote the token.
    let bad = user_ip_line().replace("1700000000000]", "\"x\"]");
    let error = Command::decode(Bytes::from(bad)).expect_err("an invalid USER_IP");
    assert_hidden("DecodeError", &error);
    assert!(!error.to_string().contains(TOKEN), "{error}");
}

#[test]
fn configs_and_credentials_hide_the_password() {
    let url = format!("redis://synapse:{PASSWORD}@127.0.0.1:6380/2");
    let config = RedisConfig::from_url(&url).expect("a valid url");
    assert_eq!(
        config.auth().map(|auth| auth.password.as_str()),
        Some(PASSWORD)
    );
    assert_hidden("RedisConfig from a url", &config);
    let unix = RedisConfig::from_url(&format!("unix:///run/redis.sock?password={PASSWORD}"))
        .expect("a valid unix url");
    assert_hidden("RedisConfig from a unix url", &unix);
    let built = RedisConfig::tcp("127.0.0.1", 6379).with_auth(auth(None));
    assert_hidden("RedisConfig built", &built);
    assert_hidden("RedisAuth", &auth(Some("synapse")));
    assert_hidden("Option<RedisAuth>", &config.auth());

    let mut section = SynapseRedisConfig::default();
    section.enabled = true;
    section.password = Some(PASSWORD.to_owned());
    assert_hidden("SynapseRedisConfig", &section);
    let from_section = RedisConfig::from_synapse(&section).expect("a valid section");
    assert_hidden("RedisConfig from Synapse's section", &from_section);

    let options = config.session_config(PREFIX);
    assert_eq!(options.auth, Some(auth(Some("synapse"))));
    assert_hidden("RedisSessionConfig", &options);

    // Errors quote the bad part of a URL, never the password beside it.
    for bad in [
        format!("redis://:{PASSWORD}@host:port/0"),
        format!("redis://:{PASSWORD}@[::1/0"),
        format!("redis://:{PASSWORD}@host/db"),
        format!("redis://:{PASSWORD}@host?timeout=1"),
        format!("unix:///run/redis.sock?password={PASSWORD}&x=1"),
        format!("redis://:{PASSWORD}%zz@host"),
    ] {
        let error = RedisConfig::from_url(&bad).expect_err("an invalid url");
        assert_hidden("RedisConfigError", &error);
        assert!(!error.to_string().contains(PASSWORD), "{error}");
    }

    let credentials = Credentials {
        username: Some(b"synapse"),
        password: PASSWORD.as_bytes(),
    };
    assert_hidden("resp::Credentials", &credentials);
}

#[cfg(feature = "http-catch-up")]
#[test]
fn http_catch_up_hides_the_replication_secret() {
    let catch_up = synapse_replication::transport::HttpCatchUp::new(
        SmolRuntime,
        Arc::new(StreamWriters::default()),
        Some(PASSWORD.to_owned()),
    );
    assert_hidden("HttpCatchUp", &catch_up);
}

// ---------------------------------------------------------------------
// The sans-IO Redis session.
// ---------------------------------------------------------------------

/// `AUTH` (and `HELLO 3 AUTH`) waits in the session's output until sent.
#[test]
fn redis_session_hides_a_pending_auth() {
    for (single, username) in [
        (false, None),
        (false, Some("synapse")),
        (true, Some("synapse")),
    ] {
        let mut options = RedisSessionConfig::new(PREFIX);
        options.auth = Some(auth(username));
        options.single_connection = single;
        let mut session = redis_session(options);
        let now = Instant::now();
        session.connect(RedisLink::Subscriber, now);
        if !single {
            session.connect(RedisLink::Publisher, now);
        }
        assert_hidden("RedisSession with AUTH unsent", &session);
        let sent = session
            .poll_transmit(RedisLink::Subscriber)
            .expect("the handshake");
        assert!(contains(&sent, PASSWORD), "the AUTH holds the password");
        assert_hidden("RedisSession with AUTH sent", &session);
    }
}

/// A ready session (two links, `USER_IP` subscribed, password set).
fn ready_session(now: Instant) -> RedisSession {
    let mut options = RedisSessionConfig::new(PREFIX);
    options.auth = Some(auth(None));
    options.extra_channels = vec!["USER_IP".to_owned()];
    options.client_name = None;
    options.report_received = true;
    let mut session = redis_session(options);
    for link in RedisLink::BOTH {
        session.connect(link, now);
        while session.poll_transmit(link).is_some() {}
    }
    let user_ip_channel = format!("{PREFIX}/USER_IP");
    let replies = format!(
        "+OK\r\n{}{}",
        subscribed(PREFIX, 1),
        subscribed(&user_ip_channel, 2)
    );
    session.handle_input(RedisLink::Subscriber, replies.as_bytes(), now);
    session.handle_input(RedisLink::Publisher, b"+OK\r\n", now);
    assert!(session.is_ready(), "the session is ready");
    while session.poll_transmit(RedisLink::Publisher).is_some() {}
    while session.poll_event().is_some() {}
    session
}

#[test]
fn redis_session_hides_a_published_user_ip() {
    let now = Instant::now();
    let mut session = ready_session(now);
    session.send(user_ip()).expect("USER_IP is published");
    assert!(session.unsent_bytes(RedisLink::Publisher) > 0);
    assert_hidden("RedisSession with USER_IP unsent", &session);
    let sent = session
        .poll_transmit(RedisLink::Publisher)
        .expect("the PUBLISH");
    assert!(contains(&sent, TOKEN), "the PUBLISH holds the token");
    // The line it was encoded in is kept for the next publish.
    assert_hidden("RedisSession after publishing USER_IP", &session);
}

#[test]
fn redis_session_hides_a_received_user_ip() {
    let now = Instant::now();
    let mut session = ready_session(now);
    let frame = message(&format!("{PREFIX}/USER_IP"), &user_ip_line());
    // Half a message: buffered until the rest arrives.
    let (first, rest) = frame.as_bytes().split_at(frame.len() - 20);
    session.handle_input(RedisLink::Subscriber, first, now);
    assert!(
        session.buffered_input() > 0,
        "part of the message is buffered"
    );
    assert_hidden("RedisSession with half a USER_IP received", &session);
    session.handle_input(RedisLink::Subscriber, rest, now);
    assert_hidden("RedisSession with a USER_IP event queued", &session);
    let mut seen = 0;
    while let Some(event) = session.poll_event() {
        let command = match &event {
            RedisEvent::Command(command) => command,
            RedisEvent::Received { command, .. } => &**command,
            other => panic!("unexpected event {other:?}"),
        };
        assert!(matches!(command, Command::UserIp(ip) if &*ip.access_token == TOKEN));
        seen += 1;
        assert_hidden("RedisEvent", &event);
    }
    assert_eq!(seen, 2, "Received and Command");
    assert_hidden("RedisSession after the USER_IP", &session);
}

// ---------------------------------------------------------------------
// The sans-IO TCP sessions.
// ---------------------------------------------------------------------

fn client_session() -> ClientSession {
    let follower = Follower::new(
        InstanceName::from("worker1"),
        Arc::new(StreamWriters::default()),
    );
    ClientSession::new(PREFIX, follower).expect("a client session")
}

fn server_session(now: Instant) -> ServerSession {
    let mut writer = Writer::new(InstanceName::master(), Arc::new(StreamWriters::default()));
    writer
        .advance(&StreamName::Caches, Token(0))
        .expect("caches advances");
    ServerSession::new(PREFIX, writer, now).expect("a server session")
}

#[test]
fn tcp_client_session_hides_a_queued_user_ip() {
    let now = Instant::now();
    let mut client = client_session();
    client.connect(now);
    client.send(user_ip()).expect("USER_IP is queued");
    assert_hidden("ClientSession with USER_IP unsent", &client);
    let mut sent = Vec::new();
    while let Some(bytes) = client.poll_transmit() {
        sent.extend_from_slice(&bytes);
    }
    assert!(contains(&sent, TOKEN), "the line holds the token");
    assert_hidden("ClientSession after sending USER_IP", &client);
}

#[test]
fn tcp_server_session_hides_a_received_user_ip() {
    let now = Instant::now();
    let mut server = server_session(now);
    let client = server.accept(now);
    let line = format!("{}\n", user_ip_line());
    let (first, rest) = line.as_bytes().split_at(line.len() - 10);
    server.handle_input(client, first, now);
    assert_hidden("ServerSession with half a USER_IP", &server);
    server.handle_input(client, rest, now);
    assert_hidden("ServerSession with a USER_IP event queued", &server);
    let mut seen = false;
    while let Some(event) = server.poll_event() {
        if let ServerEvent::Command {
            command: Command::UserIp(ip),
            ..
        } = &event
        {
            assert_eq!(&*ip.access_token, TOKEN);
            seen = true;
        }
        assert_hidden("ServerEvent", &event);
    }
    assert!(seen, "the USER_IP came through");
}

// ---------------------------------------------------------------------
// The async clients over real sockets.
// ---------------------------------------------------------------------

/// Polls `poll` (which returns true when done) until done, or fails after
/// [`PATIENCE`].
fn run_until(what: &str, mut poll: impl FnMut(&mut std::task::Context<'_>) -> Poll<bool>) {
    smol::block_on(async {
        let mut timer = smol::Timer::after(PATIENCE);
        poll_fn(|cx| {
            if let Poll::Ready(true) = poll(cx) {
                return Poll::Ready(());
            }
            if Pin::new(&mut timer).poll(cx).is_ready() {
                panic!("timed out waiting for {what}");
            }
            Poll::Pending
        })
        .await;
    });
}

fn redis_client(server: &RedisServer, name: &str, user_ip: bool) -> RedisClient<SmolRuntime> {
    let config = RedisConfig::tcp("127.0.0.1", server.port()).with_auth(auth(None));
    let mut options = config.session_config(PREFIX);
    options.client_name = Some(name.to_owned());
    if user_ip {
        options.extra_channels = vec!["USER_IP".to_owned()];
    }
    let me = InstanceName::from(name);
    let session = RedisSession::new(
        options,
        Follower::new(me.clone(), registry()),
        Writer::new(me, registry()),
    );
    RedisClient::new(SmolRuntime, config, session)
}

#[test]
fn redis_client_hides_the_password_and_tokens_over_a_real_redis() {
    let server = RedisServer::options().requirepass(PASSWORD).start();
    let mut main = redis_client(&server, "main", true);
    let mut worker = redis_client(&server, "worker1", false);
    assert_hidden("RedisClient before connecting", &main);

    // Poll once: the connections open and the AUTHs are queued.
    let mut events: Vec<RedisClientEvent> = Vec::new();
    run_until("both clients ready", |cx| {
        for client in [&mut main, &mut worker] {
            while let Poll::Ready(Some(event)) = client.poll_next_event(cx) {
                assert_hidden("RedisClientEvent", &event);
                events.push(event);
            }
            assert_hidden("RedisClient while connecting", client);
        }
        Poll::Ready(main.is_ready() && worker.is_ready())
    });
    assert_hidden("RedisClient when ready", &main);

    worker.send(user_ip()).expect("USER_IP is published");
    assert!(worker.session().unsent_bytes(RedisLink::Publisher) > 0);
    assert_hidden("RedisClient with USER_IP unsent", &worker);

    let mut received = false;
    run_until("the USER_IP at main", |cx| {
        for client in [&mut main, &mut worker] {
            while let Poll::Ready(Some(event)) = client.poll_next_event(cx) {
                if let RedisClientEvent::Command(Command::UserIp(ip)) = &event {
                    received |= &*ip.access_token == TOKEN;
                }
                assert_hidden("RedisClientEvent", &event);
            }
        }
        Poll::Ready(received)
    });
    assert_hidden("RedisClient after publishing USER_IP", &worker);
    assert_hidden("RedisClient after receiving USER_IP", &main);
    assert_hidden("RedisSession given back", &worker.into_session());
}

#[test]
fn tcp_client_and_server_hide_tokens_over_loopback() {
    let (mut server, addr) = smol::block_on(async {
        let server = TcpServer::bind(SmolRuntime, "127.0.0.1:0", server_session(Instant::now()))
            .await
            .expect("the server listens");
        let addr = server.local_addr().expect("an address");
        (server, addr)
    });
    let mut client = TcpClient::new(SmolRuntime, addr.to_string(), client_session());
    assert_hidden("TcpClient before connecting", &client);
    assert_hidden("TcpServer before a client", &server);

    run_until("the client ready", |cx| {
        while let Poll::Ready(event) = server.poll_next_event(cx) {
            assert_hidden("TcpServerEvent", &event);
        }
        while let Poll::Ready(Some(event)) = client.poll_next_event(cx) {
            assert_hidden("TcpClientEvent", &event);
        }
        Poll::Ready(client.is_ready())
    });
    client.send(user_ip()).expect("USER_IP is queued");
    assert_hidden("TcpClient with USER_IP unsent", &client);
    client
        .sender()
        .send(user_ip())
        .expect("a sender queues USER_IP");
    assert_hidden("TcpClient with USER_IP in its command queue", &client);

    // A raw connection sends half a USER_IP line: the server buffers it.
    let mut raw = TcpStream::connect(addr).expect("a raw connection");
    let line = user_ip_line();
    raw.write_all(format!("NAME raw\n{}", &line[..line.len() - 5]).as_bytes())
        .expect("writes");

    let mut received = 0;
    let mut raw_named = false;
    run_until(
        "the client's USER_IPs and the raw NAME at the server",
        |cx| {
            while let Poll::Ready(event) = server.poll_next_event(cx) {
                match &event {
                    TcpServerEvent::Session(ServerEvent::Command {
                        command: Command::UserIp(ip),
                        ..
                    }) => {
                        assert_eq!(&*ip.access_token, TOKEN);
                        received += 1;
                    }
                    TcpServerEvent::Session(ServerEvent::Named { name, .. }) => {
                        raw_named |= &**name == "raw";
                    }
                    _ => {}
                }
                assert_hidden("TcpServerEvent", &event);
            }
            while let Poll::Ready(Some(event)) = client.poll_next_event(cx) {
                assert!(
                    !matches!(event, TcpClientEvent::SendFailed { .. }),
                    "{event:?}"
                );
                assert_hidden("TcpClientEvent", &event);
            }
            Poll::Ready(received == 2 && raw_named)
        },
    );
    assert_hidden("TcpServer with half a USER_IP buffered", &server);
    assert_hidden("TcpClient after sending USER_IP", &client);
    raw.write_all(format!("{}\n", &line[line.len() - 5..]).as_bytes())
        .expect("writes");
    run_until("the raw USER_IP at the server", |cx| {
        let mut done = false;
        while let Poll::Ready(event) = server.poll_next_event(cx) {
            done |= matches!(
                &event,
                TcpServerEvent::Session(ServerEvent::Command {
                    command: Command::UserIp(_),
                    ..
                })
            );
            assert_hidden("TcpServerEvent", &event);
        }
        Poll::Ready(done)
    });
    assert_hidden("TcpServer after the raw USER_IP", &server);
    // The server greeted the raw connection.
    raw.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut greeting = [0; 6];
    raw.read_exact(&mut greeting).expect("the server greets");
    assert_eq!(&greeting, b"SERVER");
}
