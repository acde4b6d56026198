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
use synapse_replication::session::TcpClientEvent;
use synapse_replication::session::sentinel::{
    DiscoveryStep, SentinelDiscovery, SentinelEvent, SentinelTarget, SentinelWatch,
};

use bytes::Bytes;
use common::redis_server::RedisServer;
use common::redis_session::{PREFIX, redis_session, registry};
use synapse_replication::config::{
    RedisAuth, RedisConfig, StreamWriters, SynapseConfig, SynapseRedisConfig,
};
use synapse_replication::http::CatchUpEndpoint;
use synapse_replication::positions::{Follower, Writer};
use synapse_replication::resp::Credentials;
use synapse_replication::session::{
    RedisEvent, RedisLink, RedisSession, RedisSessionConfig, TcpClientSession, TcpServerEvent,
    TcpServerSession,
};
use synapse_replication::transport::{RedisClient, SmolRuntime, TcpClient, TcpServer};
use synapse_replication::wire::{Command, InstanceName, StreamName, Token, UserIp};

const PASSWORD: &str = "hunter2-password";
const TOKEN: &str = "syt_secret_token";
const PATIENCE: Duration = Duration::from_secs(20);

/// The data nodes' wrong password, in the failing-auth test.
const WRONG_PASSWORD: &str = "wrong-pass-0451";
/// The sentinels' password.
const SENTINEL_PASSWORD: &str = "sentinel-pass-9931";
/// Synapse's `worker_replication_secret`.
const REPLICATION_SECRET: &str = "repl-secret-7781";
const SECRETS: [&str; 5] = [
    PASSWORD,
    TOKEN,
    WRONG_PASSWORD,
    SENTINEL_PASSWORD,
    REPLICATION_SECRET,
];

/// Every way a formatter could spell `secret`'s bytes: as text, as a
/// byte-escaped string (`\x68\x75...`), as a list of numbers (`[104,
/// 117, ...]`, as a derived `Debug` of `Vec<u8>` or `[u8]` shows it), and
/// in hex. The number list is matched with whitespace removed, so that
/// `{:#?}`'s one number a line is caught too.
fn spellings(secret: &str) -> Vec<String> {
    let bytes = secret.as_bytes();
    let numbers: Vec<String> = bytes.iter().map(u8::to_string).collect();
    let escaped: String = bytes.iter().map(|b| format!("\\x{b:02x}")).collect();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    vec![
        secret.to_owned(),
        escaped.clone(),
        escaped.to_uppercase().replace("\\X", "\\x"),
        numbers.join(","),
        hex.clone(),
        hex.to_uppercase(),
    ]
}

/// Where `text` shows a secret, in any of its [`spellings`].
fn find_secret(text: &str) -> Option<(&'static str, String)> {
    let squeezed: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    for secret in SECRETS {
        for spelling in spellings(secret) {
            if text.contains(&spelling) || squeezed.contains(&spelling) {
                return Some((secret, spelling));
            }
        }
    }
    None
}

/// `text` shows no secret in any spelling.
#[track_caller]
fn assert_text_hidden(what: &str, text: &str) {
    if let Some((secret, spelling)) = find_secret(text) {
        let at = text.find(&spelling).unwrap_or(0);
        let from = at.saturating_sub(120);
        let to = (at + spelling.len() + 40).min(text.len());
        panic!(
            "{what} shows {secret:?} as {spelling:?} ({} bytes of output): ...{}...",
            text.len(),
            text.get(from..to).unwrap_or(text)
        );
    }
}

/// `{:?}` and `{:#?}` of `value` show no secret.
#[track_caller]
fn assert_hidden(what: &str, value: &dyn Debug) {
    for text in [format!("{value:?}"), format!("{value:#?}")] {
        assert_text_hidden(&format!("{what}'s Debug"), &text);
    }
}

#[test]
fn the_check_sees_every_spelling_of_a_secret() {
    // A check that cannot fail proves nothing: each of these shows it.
    let bytes = PASSWORD.as_bytes().to_vec();
    let escaped: String = PASSWORD
        .bytes()
        .map(|b| std::ascii::escape_default(b).to_string())
        .collect();
    let all_escaped: String = PASSWORD.bytes().map(|b| format!("\\x{b:02x}")).collect();
    let hex: String = PASSWORD.bytes().map(|b| format!("{b:02X}")).collect();
    for (how, text) in [
        ("a string", format!("{PASSWORD:?}")),
        ("Bytes", format!("{:?}", Bytes::from(bytes.clone()))),
        (
            "BytesMut",
            format!("{:?}", bytes::BytesMut::from(&bytes[..])),
        ),
        ("Vec<u8>", format!("{bytes:?}")),
        ("Vec<u8>, pretty", format!("{bytes:#?}")),
        ("escape_default", escaped),
        ("all escaped", all_escaped),
        ("hex", hex),
    ] {
        assert!(find_secret(&text).is_some(), "{how}: {text}");
    }
    assert!(find_secret("RedisAuth { password: \"<redacted>\" }").is_none());
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
        assert_hidden("ConfigError", &error);
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

fn client_session() -> TcpClientSession {
    let follower = Follower::new(
        InstanceName::from("worker1"),
        Arc::new(StreamWriters::default()),
    );
    TcpClientSession::new(PREFIX, follower).expect("a client session")
}

fn server_session(now: Instant) -> TcpServerSession {
    let mut writer = Writer::new(InstanceName::master(), Arc::new(StreamWriters::default()));
    writer
        .advance(&StreamName::Caches, Token(0))
        .expect("caches advances");
    TcpServerSession::new(PREFIX, writer, now).expect("a server session")
}

#[test]
fn tcp_client_session_hides_a_queued_user_ip() {
    let now = Instant::now();
    let mut client = client_session();
    client.connect(now);
    client.send(user_ip()).expect("USER_IP is queued");
    assert_hidden("TcpClientSession with USER_IP unsent", &client);
    let mut sent = Vec::new();
    while let Some(bytes) = client.poll_transmit() {
        sent.extend_from_slice(&bytes);
    }
    assert!(contains(&sent, TOKEN), "the line holds the token");
    assert_hidden("TcpClientSession after sending USER_IP", &client);
}

#[test]
fn tcp_server_session_hides_a_received_user_ip() {
    let now = Instant::now();
    let mut server = server_session(now);
    let client = server.accept(now);
    let line = format!("{}\n", user_ip_line());
    let (first, rest) = line.as_bytes().split_at(line.len() - 10);
    server.handle_input(client, first, now);
    assert_hidden("TcpServerSession with half a USER_IP", &server);
    server.handle_input(client, rest, now);
    assert_hidden("TcpServerSession with a USER_IP event queued", &server);
    let mut seen = false;
    while let Some(event) = server.poll_event() {
        if let TcpServerEvent::Command {
            command: Command::UserIp(ip),
            ..
        } = &event
        {
            assert_eq!(&*ip.access_token, TOKEN);
            seen = true;
        }
        assert_hidden("TcpServerEvent", &event);
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
    let mut events: Vec<RedisEvent> = Vec::new();
    run_until("both clients ready", |cx| {
        for client in [&mut main, &mut worker] {
            while let Poll::Ready(Some(event)) = client.poll_next_event(cx) {
                assert_hidden("RedisEvent", &event);
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
                if let RedisEvent::Command(Command::UserIp(ip)) = &event {
                    received |= &*ip.access_token == TOKEN;
                }
                assert_hidden("RedisEvent", &event);
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
                    TcpServerEvent::Command {
                        command: Command::UserIp(ip),
                        ..
                    } => {
                        assert_eq!(&*ip.access_token, TOKEN);
                        received += 1;
                    }
                    TcpServerEvent::Named { name, .. } => {
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
                TcpServerEvent::Command {
                    command: Command::UserIp(_),
                    ..
                }
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

// ---------------------------------------------------------------------
// Sentinels, Synapse's configuration, the replication HTTP API.
// ---------------------------------------------------------------------

fn sentinel_auth() -> RedisAuth {
    RedisAuth {
        username: Some("sentinel-user".to_owned()),
        password: SENTINEL_PASSWORD.to_owned(),
    }
}

/// The sentinels' `AUTH` waits in a discovery round's output, and the
/// data nodes' in its output once a node asks for it; a watch's `AUTH`
/// from the start.
#[test]
fn sentinel_discovery_and_watch_hide_a_pending_auth() {
    let mut round =
        SentinelDiscovery::new("mymaster", 1, 0, Some(sentinel_auth()), Some(auth(None)));
    assert_hidden("SentinelDiscovery", &round);
    assert_eq!(
        round.poll_step(),
        Some(DiscoveryStep::Connect(SentinelTarget::Sentinel(0)))
    );
    round.connected();
    assert_hidden("SentinelDiscovery with the sentinels' AUTH unsent", &round);
    let sent = round.poll_transmit().expect("AUTH and the question");
    assert!(contains(&sent, SENTINEL_PASSWORD), "the AUTH holds it");
    round.handle_input(b"+OK\r\n*2\r\n$8\r\n10.0.0.7\r\n$4\r\n6379\r\n");
    assert!(matches!(
        round.poll_step(),
        Some(DiscoveryStep::Connect(SentinelTarget::Master(_)))
    ));
    round.connected();
    let _ = round.poll_transmit();
    round.handle_input(b"-NOAUTH Authentication required.\r\n");
    assert_hidden("SentinelDiscovery with the master's AUTH unsent", &round);
    let sent = round.poll_transmit().expect("AUTH and ROLE");
    assert!(contains(&sent, PASSWORD), "the AUTH holds it");
    // A refusal names no password.
    round.handle_input(b"-WRONGPASS invalid username-password pair or user is disabled.\r\n");
    let Some(DiscoveryStep::Failed(error)) = round.poll_step() else {
        panic!("the round fails");
    };
    assert_hidden("DiscoveryError", &error);
    assert_text_hidden("DiscoveryError's Display", &error.to_string());

    let now = Instant::now();
    let mut watch = SentinelWatch::new("mymaster", Some(&sentinel_auth()));
    assert_hidden("SentinelWatch with AUTH unsent", &watch);
    watch.connected(now);
    assert_hidden("SentinelWatch with AUTH and SUBSCRIBE unsent", &watch);
    let sent = watch.poll_transmit().expect("AUTH and SUBSCRIBE");
    assert!(contains(&sent, SENTINEL_PASSWORD), "the AUTH holds it");
}

fn sentinel_url() -> String {
    format!(
        "redis+sentinel://synapse:{PASSWORD}@10.0.0.1,10.0.0.2/mymaster?sentinel_username=s&sentinel_password={SENTINEL_PASSWORD}"
    )
}

#[test]
fn sentinel_and_synapse_configs_hide_every_secret() {
    let config = RedisConfig::from_url(&sentinel_url()).expect("a valid url");
    let sentinel = config.sentinel_config().expect("sentinels");
    assert_eq!(
        sentinel.auth().map(|auth| auth.password.as_str()),
        Some(SENTINEL_PASSWORD)
    );
    assert_hidden("RedisConfig with sentinels", &config);
    assert_hidden("SentinelConfig", sentinel);
    let built = RedisConfig::sentinel("mymaster", [("10.0.0.1", 26379)])
        .with_auth(auth(None))
        .with_sentinel_auth(sentinel_auth());
    assert_hidden("RedisConfig::sentinel", &built);
    assert_hidden(
        "RedisSessionConfig of a sentinel config",
        &built.session_config(PREFIX),
    );
    let error = RedisConfig::from_url(&format!("{}&unknown=1", sentinel_url()))
        .expect_err("an unknown parameter");
    assert_hidden("ConfigError", &error);
    assert_text_hidden("ConfigError's Display", &error.to_string());

    let mut section = SynapseRedisConfig::default();
    section.enabled = true;
    section.password = Some(PASSWORD.to_owned());
    section.sentinels = vec!["10.0.0.1".to_owned()];
    section.sentinel_service_name = Some("mymaster".to_owned());
    section.sentinel_password = Some(SENTINEL_PASSWORD.to_owned());
    assert_hidden("SynapseRedisConfig with sentinels", &section);
    let from_section = RedisConfig::from_synapse(&section).expect("a valid section");
    assert_eq!(
        from_section.auth().map(|auth| auth.password.as_str()),
        Some(PASSWORD)
    );
    assert_hidden("RedisConfig from Synapse's sentinels", &from_section);

    let synapse = SynapseConfig::from_json(&format!(
        r#"{{"server_name": "example.com", "worker_replication_secret": "{REPLICATION_SECRET}",
            "redis": {{"enabled": true, "password": "{PASSWORD}",
                      "sentinels": ["10.0.0.1"], "sentinel_service_name": "mymaster",
                      "sentinel_password": "{SENTINEL_PASSWORD}"}}}}"#
    ))
    .expect("a valid config");
    assert_eq!(synapse.replication_secret(), Some(REPLICATION_SECRET));
    assert_hidden("SynapseConfig", &synapse);
    let error = SynapseConfig::from_json(&format!(
        r#"{{"server_name": "example.com", "worker_replication_secret": "{REPLICATION_SECRET}",
            "worker_replication_secret_path": "/nonexistent"}}"#
    ))
    .expect_err("both secrets");
    assert_hidden("ConfigError", &error);
    assert_text_hidden("ConfigError's Display", &error.to_string());
}

#[test]
fn the_catch_up_endpoint_hides_the_replication_secret() {
    let endpoint = CatchUpEndpoint::new(
        InstanceName::from("typing1"),
        Some(REPLICATION_SECRET.to_owned()),
    );
    assert_hidden("CatchUpEndpoint", &endpoint);
}

#[cfg(all(feature = "http-server", feature = "http-catch-up"))]
#[test]
fn http_server_and_client_hide_the_replication_secret() {
    use synapse_replication::transport::{HttpCatchUp, HttpServer};
    let synapse = SynapseConfig::from_json(&format!(
        r#"{{"server_name": "example.com", "worker_replication_secret": "{REPLICATION_SECRET}"}}"#
    ))
    .expect("a valid config");
    let client = HttpCatchUp::from_synapse(SmolRuntime, &synapse);
    assert_hidden("HttpCatchUp from SynapseConfig", &client);
    let endpoint = CatchUpEndpoint::new(
        InstanceName::from("typing1"),
        synapse.replication_secret().map(str::to_owned),
    );
    let server = smol::block_on(HttpServer::bind(
        SmolRuntime,
        "127.0.0.1:0",
        endpoint,
        Arc::new(client),
    ))
    .expect("a listener");
    assert_hidden("HttpServer", &server);
}

/// A handler that logs its request (`{request:?}`) shows none of the
/// credentials it came with: the replication secret (`Authorization`),
/// `Proxy-Authorization`, a `Cookie`, nor a client's `access_token` query.
#[cfg(all(feature = "http-server", feature = "http-catch-up"))]
#[test]
fn a_request_handed_to_a_handler_hides_its_credentials() {
    use synapse_replication::transport::{HttpCatchUp, HttpRequest, HttpResponse, HttpServer};
    let seen: Arc<std::sync::Mutex<Option<HttpRequest>>> = Arc::default();
    let endpoint = CatchUpEndpoint::new(
        InstanceName::from("typing1"),
        Some(REPLICATION_SECRET.to_owned()),
    );
    let source = HttpCatchUp::new(SmolRuntime, Arc::new(StreamWriters::default()), None);
    let handed = seen.clone();
    let server = smol::block_on(HttpServer::bind(
        SmolRuntime,
        "127.0.0.1:0",
        endpoint,
        Arc::new(source),
    ))
    .expect("a listener")
    .with_handler(move |request| {
        *handed.lock().expect("seen") = Some(request);
        Box::pin(async { HttpResponse::new(200, "{}") })
    });
    let addr = server.local_addr().expect("bound");
    let task = smol::spawn(server.run());

    let mut socket = TcpStream::connect(addr).expect("a connection");
    socket.set_read_timeout(Some(PATIENCE)).expect("a timeout");
    let request = format!(
        "PUT /_matrix/client/v3/rooms/%21r%3Aexample.com/typing/%40a%3Aexample.com\
         ?access_token={TOKEN}&timeout=1 HTTP/1.1\r\n\
         Host: example.com\r\n\
         Authorization: Bearer {REPLICATION_SECRET}\r\n\
         Proxy-Authorization: Basic {PASSWORD}\r\n\
         Cookie: session={SENTINEL_PASSWORD}\r\n\
         Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    socket.write_all(request.as_bytes()).expect("sent");
    let mut answer = String::new();
    socket.read_to_string(&mut answer).expect("an answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    smol::block_on(task.cancel());

    let request = seen.lock().expect("seen").take().expect("handled");
    // The handler has them all, as it must.
    let header = |name: &str| String::from_utf8_lossy(request.header(name).unwrap_or_default());
    assert_eq!(
        header("authorization"),
        format!("Bearer {REPLICATION_SECRET}")
    );
    assert_eq!(header("proxy-authorization"), format!("Basic {PASSWORD}"));
    assert_eq!(header("cookie"), format!("session={SENTINEL_PASSWORD}"));
    assert!(request.query.as_deref().unwrap_or_default().contains(TOKEN));
    assert_hidden("HttpRequest", &request);
    // What is not a credential still shows.
    let shown = format!("{request:?}");
    for visible in [
        "PUT",
        "/typing/",
        "example.com",
        "timeout=1",
        "authorization",
    ] {
        assert!(shown.contains(visible), "{visible} not in {shown}");
    }
}

// ---------------------------------------------------------------------
// What is logged through `tracing`.
// ---------------------------------------------------------------------

/// Every event and span logged on this thread, at every level, with its
/// fields formatted as a subscriber that prints them would.
#[derive(Clone, Default)]
struct Recorder(Arc<std::sync::Mutex<Vec<String>>>);

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push_str(&format!(" {}={value}", field.name()));
    }

    fn record_bytes(&mut self, field: &tracing::field::Field, value: &[u8]) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl Recorder {
    fn push(&self, line: String) {
        self.0.lock().expect("recorder").push(line);
    }

    fn lines(&self) -> Vec<String> {
        self.0.lock().expect("recorder").clone()
    }
}

impl tracing::Subscriber for Recorder {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut fields = Fields(format!("span {}", span.metadata().name()));
        span.record(&mut fields);
        let mut lines = self.0.lock().expect("recorder");
        lines.push(fields.0);
        tracing::span::Id::from_u64(lines.len() as u64)
    }

    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        let mut fields = Fields("span record".to_owned());
        values.record(&mut fields);
        self.push(fields.0);
    }

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields(format!(
            "{} {}",
            event.metadata().level(),
            event.metadata().target()
        ));
        event.record(&mut fields);
        self.push(fields.0);
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// A sentinel that names the Redis on `master` (after `AUTH`, which it
/// takes with any password), confirms `SUBSCRIBE` and answers `PING`;
/// what it was sent.
fn fake_sentinel(master: u16) -> (u16, Arc<std::sync::Mutex<Vec<u8>>>) {
    use synapse_replication::resp::{Frame, RespDecoder};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("addr").port();
    let heard: Arc<std::sync::Mutex<Vec<u8>>> = Arc::default();
    let shared = heard.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let heard = shared.clone();
            std::thread::spawn(move || {
                let mut decoder = RespDecoder::new();
                let mut input = bytes::BytesMut::new();
                let mut buf = [0; 4096];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 {
                        return;
                    }
                    heard.lock().expect("heard").extend_from_slice(&buf[..n]);
                    input.extend_from_slice(&buf[..n]);
                    while let Ok(Some(frame)) = decoder.decode(&mut input) {
                        let name = frame
                            .elements()
                            .and_then(<[Frame]>::first)
                            .and_then(Frame::as_bytes)
                            .map(|name| name.to_ascii_uppercase())
                            .unwrap_or_default();
                        let answer = match &name[..] {
                            b"SENTINEL" => {
                                format!("*2\r\n{}{}", bulk("127.0.0.1"), bulk(&master.to_string()))
                            }
                            b"SUBSCRIBE" => subscribed("+switch-master", 1),
                            b"PING" => format!("*2\r\n{}{}", bulk("pong"), bulk("")),
                            _ => "+OK\r\n".to_owned(),
                        };
                        if stream.write_all(answer.as_bytes()).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (port, heard)
}

fn sentinel_client(sentinel: u16, password: &str) -> RedisClient<SmolRuntime> {
    let config = RedisConfig::sentinel("mymaster", [("127.0.0.1", sentinel)])
        .with_auth(RedisAuth {
            username: None,
            password: password.to_owned(),
        })
        .with_sentinel_auth(sentinel_auth())
        .with_connect_timeout(Duration::from_secs(2));
    let mut options = config.session_config(PREFIX);
    options.client_name = Some("sentinel-client".to_owned());
    let me = InstanceName::from("worker1");
    let session = RedisSession::new(
        options,
        Follower::new(me.clone(), registry()),
        Writer::new(me, registry()),
    );
    RedisClient::new(SmolRuntime, config, session)
}

/// Every line logged, and every event's `Debug` and `Display`, are free
/// of secrets; there were some (so the check saw something).
#[track_caller]
fn assert_logs_hidden(what: &str, recorder: &Recorder, events: &[RedisEvent]) {
    let lines = recorder.lines();
    assert!(!lines.is_empty(), "{what}: nothing was logged");
    for line in &lines {
        assert_text_hidden(&format!("{what}: a log line"), line);
    }
    for event in events {
        assert_hidden(&format!("{what}: RedisEvent"), event);
        assert_text_hidden(&format!("{what}: RedisEvent's Display"), &event.to_string());
    }
}

#[test]
fn nothing_logged_shows_a_password_through_a_sentinel_or_direct() {
    let recorder = Recorder::default();
    let _guard = tracing::subscriber::set_default(recorder.clone());
    let server = RedisServer::options().requirepass(PASSWORD).start();
    let (sentinel, heard) = fake_sentinel(server.port());

    // Through the sentinel (AUTH to it, NOAUTH then AUTH to the master),
    // and directly, both with the right password.
    let mut through = sentinel_client(sentinel, PASSWORD);
    let mut direct = redis_client(&server, "direct", false);
    let mut events: Vec<RedisEvent> = Vec::new();
    let mut watching = false;
    run_until("both ready, the sentinel watched", |cx| {
        for client in [&mut through, &mut direct] {
            while let Poll::Ready(Some(event)) = client.poll_next_event(cx) {
                watching |= matches!(event, RedisEvent::Sentinel(SentinelEvent::Watching { .. }));
                events.push(event);
            }
        }
        Poll::Ready(through.is_ready() && direct.is_ready() && watching)
    });
    assert!(
        contains(&heard.lock().expect("heard"), SENTINEL_PASSWORD),
        "the sentinel was sent its password"
    );
    assert_hidden("RedisClient through a sentinel", &through);
    assert_logs_hidden("a sentinel session", &recorder, &events);
}

#[test]
fn nothing_logged_shows_a_password_when_auth_fails() {
    let recorder = Recorder::default();
    let _guard = tracing::subscriber::set_default(recorder.clone());
    let server = RedisServer::options().requirepass(PASSWORD).start();
    let (sentinel, _) = fake_sentinel(server.port());
    let mut through = sentinel_client(sentinel, WRONG_PASSWORD);
    let config = RedisConfig::tcp("127.0.0.1", server.port()).with_auth(RedisAuth {
        username: None,
        password: WRONG_PASSWORD.to_owned(),
    });
    let me = InstanceName::from("direct");
    let session = RedisSession::new(
        config.session_config(PREFIX),
        Follower::new(me.clone(), registry()),
        Writer::new(me, registry()),
    );
    let mut direct = RedisClient::new(SmolRuntime, config, session);
    let mut events: Vec<RedisEvent> = Vec::new();
    let (mut refused_through, mut refused_direct) = (0, 0);
    run_until("both refused twice", |cx| {
        for (index, client) in [&mut through, &mut direct].into_iter().enumerate() {
            while let Poll::Ready(Some(event)) = client.poll_next_event(cx) {
                let refused = event.to_string().contains("WRONGPASS")
                    || format!("{event:?}").contains("WRONGPASS");
                if refused {
                    if index == 0 {
                        refused_through += 1;
                    } else {
                        refused_direct += 1;
                    }
                }
                events.push(event);
            }
        }
        Poll::Ready(refused_through >= 2 && refused_direct >= 2)
    });
    assert!(
        recorder
            .lines()
            .iter()
            .any(|line| line.contains("WRONGPASS")),
        "the refusal was logged"
    );
    assert_logs_hidden("a failing auth", &recorder, &events);
}
