//! Interop with the reference: Synapse 1.163.2's own direct TCP protocol
//! classes (`synapse/replication/tcp/protocol.py`), run by
//! `tests/synapse/tcp_peer.py` on a real Twisted reactor, against this
//! crate's server and client on loopback.
//!
//! Needs a Python with Synapse 1.163.2: `$SYNAPSE_PYTHON` if set, else
//! `/tmp/synapse-ref/bin/python`. Create it with
//!
//! ```text
//! python3 -m venv /tmp/synapse-ref && /tmp/synapse-ref/bin/pip install "matrix-synapse==1.163.2"
//! ```

#![cfg(feature = "runtime-smol")]

mod common;

use std::future::poll_fn;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::task::Poll;
use std::time::{Duration, Instant};
use synapse_replication::positions::FollowerEvent;

use common::pair::{SERVER_NAME, registry, wire};
use futures::StreamExt;
use futures::channel::mpsc;
use synapse_replication::positions::{Follower, Writer};
use synapse_replication::session::{
    Disconnect, TcpClientEvent, TcpClientSession, TcpError, TcpServerEvent, TcpServerSession,
    TcpSessionConfig,
};
use synapse_replication::transport::{Runtime, SmolRuntime, TcpClient, TcpServer};
use synapse_replication::wire::{Command, InstanceName, RawRow, StreamName, Token, UserSync};

const PATIENCE: Duration = Duration::from_secs(25);

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("SYNAPSE_PYTHON") {
        return python.into();
    }
    let default = Path::new("/tmp/synapse-ref/bin/python");
    if default.exists() {
        return default.to_owned();
    }
    panic!(
        "tcp_synapse needs a Python with Synapse 1.163.2: set SYNAPSE_PYTHON, or create \
         /tmp/synapse-ref with\n    python3 -m venv /tmp/synapse-ref && \
         /tmp/synapse-ref/bin/pip install \"matrix-synapse==1.163.2\""
    );
}

/// The Python peer, its output as a stream of lines; killed on drop.
struct Peer {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
}

impl Peer {
    fn spawn(args: &[&str]) -> Peer {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/synapse/tcp_peer.py");
        let mut child = Process::new(python())
            .arg(script)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot run {}: {error}", python().display()));
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::unbounded();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.unbounded_send(line).is_err() {
                    break;
                }
            }
        });
        Peer {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The lines starting with `RECV `, without it.
    fn received(&self) -> Vec<&str> {
        self.seen
            .iter()
            .filter_map(|line| line.strip_prefix("RECV "))
            .collect()
    }

    fn check_version(&self) {
        assert_eq!(
            self.seen.first().map(String::as_str),
            Some("SYNAPSE 1.163.2"),
            "the peer must run Synapse 1.163.2"
        );
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

enum Step<E> {
    Ours(E),
    Peer(Option<String>),
}

fn deadline_passed(started: Instant, peer: &Peer) {
    assert!(
        started.elapsed() < PATIENCE,
        "timed out; the peer said {:#?}",
        peer.seen
    );
}

/// Synapse's `ClientReplicationStreamProtocol` connects to our server twice:
/// expecting the wrong server name, then the right one.
#[test]
fn synapse_client_against_our_server() {
    smol::block_on(async {
        let mut writer = Writer::new(InstanceName::master(), registry());
        writer.advance(&StreamName::Caches, Token(2)).unwrap();
        let mut config = TcpSessionConfig::default();
        config.report_received = true;
        let session =
            TcpServerSession::with_config(SERVER_NAME, writer, config, Instant::now()).unwrap();
        let mut server = TcpServer::bind(SmolRuntime, "127.0.0.1:0", session)
            .await
            .unwrap();
        let port = server.local_addr().unwrap().port().to_string();
        let mut peer = Peer::spawn(&["client", &port, "wrong.example", SERVER_NAME]);

        let started = Instant::now();
        let mut sleep = SmolRuntime.sleep_until(started + PATIENCE);
        let mut received: Vec<(u64, String)> = Vec::new();
        let mut peer_errors = Vec::new();
        let mut disconnected = 0;
        let mut peer_done = false;
        let rows = [
            RawRow::new(&br#"["get_user_by_id",["@alice:example.com"],1700000000000]"#[..])
                .unwrap(),
            RawRow::new(&br#"["caf\u00e9",null,1700000000001]"#[..]).unwrap(),
        ];
        loop {
            let step = poll_fn(|cx| {
                if let Poll::Ready(event) = server.poll_next_event(cx) {
                    return Poll::Ready(Some(Step::Ours(event)));
                }
                if !peer_done {
                    if let Poll::Ready(line) = peer.lines.poll_next_unpin(cx) {
                        return Poll::Ready(Some(Step::Peer(line)));
                    }
                }
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await;
            deadline_passed(started, &peer);
            match step {
                None => deadline_passed(Instant::now() - PATIENCE, &peer),
                Some(Step::Peer(None)) => peer_done = true,
                Some(Step::Peer(Some(line))) => peer.seen.push(line),
                Some(Step::Ours(event)) => match event {
                    TcpServerEvent::Received { client, command } => {
                        let line = wire(&command);
                        let replicated = matches!(command, Command::Replicate);
                        let synced = matches!(command, Command::UserSync(_));
                        received.push((client.get(), line));
                        if replicated && client.get() == 2 {
                            // Rows for the right connection once it asked.
                            let session = server.session_mut();
                            session
                                .write(
                                    &StreamName::Caches,
                                    Token(3),
                                    rows.iter().map(|row| (Token(3), row.clone())),
                                )
                                .unwrap();
                            session.advance(&StreamName::Caches, Token(4)).unwrap();
                        }
                        if synced {
                            server.session_mut().close(client, "test over");
                        }
                    }
                    TcpServerEvent::PeerError { client, message } => {
                        peer_errors.push((client.get(), message.to_string()));
                    }
                    TcpServerEvent::Disconnected { .. } => disconnected += 1,
                    _ => {}
                },
            }
            if peer_done && disconnected == 2 {
                break;
            }
        }
        peer.check_version();
        assert_eq!(
            peer.seen.last().map(String::as_str),
            Some("DONE"),
            "{:#?}",
            peer.seen
        );
        assert_eq!(disconnected, 2);

        // What Synapse's client sent us: its handshake, then the commands
        // it sends on seeing row 3.
        let lines = |client| -> Vec<String> {
            received
                .iter()
                .filter(|(c, _)| *c == client)
                .map(|(_, line)| line.clone())
                .collect()
        };
        for client in [1, 2] {
            let lines = lines(client);
            assert_eq!(lines[0], "NAME python");
            assert!(lines[1].starts_with("PING 1"), "{lines:?}");
            assert_eq!(lines[2], "REPLICATE ");
        }
        assert_eq!(peer_errors, [(1, "Wrong remote".to_owned())]);
        assert_eq!(
            lines(2)[3..],
            [
                "FEDERATION_ACK python 3",
                "USER_SYNC python @alice:example.com DEVICE start 1700000000000",
            ]
        );

        // What Synapse's client received from us, as it parsed it.
        let received = peer.received();
        let second = received
            .iter()
            .rposition(|line| line.starts_with("SERVER "))
            .unwrap();
        // The first connection: Synapse checks SERVER, answers `ERROR Wrong
        // remote` and ignores the rest of what it read.
        assert_eq!(received[0], "SERVER example.com");
        assert_eq!(second, 1, "{received:?}");
        assert!(received[second + 1].starts_with("PING "));
        assert_eq!(
            received[second + 2..],
            [
                "POSITION caches master 2 2",
                r#"RDATA caches master batch ["get_user_by_id",["@alice:example.com"],1700000000000]"#,
                r#"RDATA caches master 3 ["caf\u00e9",null,1700000000001]"#,
                "POSITION caches master 3 4",
                "ERROR test over",
            ]
        );
    });
}

/// Our client against Synapse's `ServerReplicationStreamProtocol`.
#[test]
fn our_client_against_synapse_server() {
    smol::block_on(async {
        let mut peer = Peer::spawn(&["server", SERVER_NAME]);
        let started = Instant::now();
        let port = loop {
            let line = peer.lines.next().await.expect("the peer ended early");
            deadline_passed(started, &peer);
            peer.seen.push(line.clone());
            if let Some(port) = line.strip_prefix("LISTENING ") {
                break port.to_owned();
            }
        };
        let follower = Follower::new(InstanceName::from("worker1"), registry());
        let session = TcpClientSession::new(SERVER_NAME, follower).unwrap();
        let mut client = TcpClient::new(SmolRuntime, format!("127.0.0.1:{port}"), session);

        let mut sleep = SmolRuntime.sleep_until(started + PATIENCE);
        let mut events = Vec::new();
        let mut closing = None;
        let mut closed = false;
        loop {
            let step = poll_fn(|cx| {
                if !closed {
                    if let Poll::Ready(event) = client.poll_next_event(cx) {
                        return Poll::Ready(Some(Step::Ours(event)));
                    }
                }
                if let Poll::Ready(line) = peer.lines.poll_next_unpin(cx) {
                    return Poll::Ready(Some(Step::Peer(line)));
                }
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await;
            deadline_passed(started, &peer);
            match step {
                None => deadline_passed(Instant::now() - PATIENCE, &peer),
                Some(Step::Peer(None)) => break,
                Some(Step::Peer(Some(line))) => {
                    let done = line == "DONE";
                    peer.seen.push(line);
                    if done {
                        break;
                    }
                }
                Some(Step::Ours(Some(event))) => {
                    let reached_9 = matches!(
                        &event,
                        TcpClientEvent::Follower(FollowerEvent::Position {
                            token: Token(9),
                            ..
                        })
                    );
                    match event {
                        TcpClientEvent::Ready { server_name } => {
                            events.push(format!("ready {server_name}"))
                        }
                        TcpClientEvent::Follower(FollowerEvent::Rows { token, rows, .. }) => {
                            let rows: Vec<&str> = rows.iter().map(RawRow::as_str).collect();
                            events.push(format!("rows {token} {}", rows.join(" ")));
                        }
                        event @ TcpClientEvent::Follower(_) => events.push(event.to_string()),
                        TcpClientEvent::Disconnected {
                            reason: Disconnect::Tcp(error),
                            ..
                        } => {
                            closing = Some(error);
                            client.close().await
                        }
                        TcpClientEvent::Disconnected { .. } => client.close().await,
                        other @ (TcpClientEvent::Command(_)
                        | TcpClientEvent::PeerError(_)
                        | TcpClientEvent::Received(_)) => events.push(format!("{other:?}")),
                        _ => {}
                    }
                    if reached_9 {
                        client
                            .send(Command::UserSync(UserSync {
                                instance_id: InstanceName::from("worker1"),
                                user_id: "@bob:example.com".into(),
                                device_id: None,
                                is_syncing: true,
                                last_sync_ms: 1700000000001,
                            }))
                            .unwrap();
                    }
                }
                Some(Step::Ours(None)) => closed = true,
            }
        }
        peer.check_version();
        assert_eq!(
            events,
            [
                "ready example.com",
                "started caches master 5",
                r#"rows 6 ["a",["k"],6]"#,
                r#"rows 7 ["b",null,7] ["c\u00e9",[],7]"#,
                "position caches master 9",
            ]
        );
        assert!(
            matches!(closing, Some(TcpError::LineTooLong { max: 16384 })),
            "{closing:?}"
        );
        let received = peer.received();
        assert_eq!(received[0], "NAME worker1");
        assert!(received[1].starts_with("PING 1"), "{received:?}");
        assert_eq!(
            received[2..],
            [
                "REPLICATE ",
                "USER_SYNC worker1 @bob:example.com None start 1700000000001",
                "ERROR Line length exceeded",
            ]
        );
    });
}

/// On a quiet connection our client pings every 5 s, and Synapse's server
/// takes those pings (its own loop pings when it has sent nothing for 5 s,
/// checked every 5 s, so its second comes after up to 10 s: not waited for).
#[test]
fn our_pings_reach_synapse() {
    smol::block_on(async {
        let mut peer = Peer::spawn(&["server", SERVER_NAME]);
        let started = Instant::now();
        let port = loop {
            let line = peer.lines.next().await.expect("the peer ended early");
            deadline_passed(started, &peer);
            peer.seen.push(line.clone());
            if let Some(port) = line.strip_prefix("LISTENING ") {
                break port.to_owned();
            }
        };
        let follower = Follower::new(InstanceName::from("worker1"), registry());
        let mut config = TcpSessionConfig::default();
        config.report_received = true;
        let session = TcpClientSession::with_config(SERVER_NAME, follower, config).unwrap();
        let mut client = TcpClient::new(SmolRuntime, format!("127.0.0.1:{port}"), session);
        let mut sleep = SmolRuntime.sleep_until(started + PATIENCE);
        let mut pings_received = 0;
        let mut closed = false;
        loop {
            let step = poll_fn(|cx| {
                if !closed {
                    if let Poll::Ready(event) = client.poll_next_event(cx) {
                        return Poll::Ready(Some(Step::Ours(event)));
                    }
                }
                if let Poll::Ready(line) = peer.lines.poll_next_unpin(cx) {
                    return Poll::Ready(Some(Step::Peer(line)));
                }
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await;
            deadline_passed(started, &peer);
            match step {
                None => deadline_passed(Instant::now() - PATIENCE, &peer),
                Some(Step::Peer(None)) => break,
                Some(Step::Peer(Some(line))) => peer.seen.push(line),
                Some(Step::Ours(Some(TcpClientEvent::Received(Command::Ping(_))))) => {
                    pings_received += 1
                }
                Some(Step::Ours(Some(TcpClientEvent::Disconnected {
                    reason: Disconnect::Tcp(error),
                    ..
                }))) => {
                    panic!("closed: {error}")
                }
                Some(Step::Ours(None)) => closed = true,
                Some(Step::Ours(_)) => {}
            }
            let pings_sent = peer
                .received()
                .iter()
                .filter(|l| l.starts_with("PING "))
                .count();
            if !closed && pings_received >= 1 && pings_sent >= 2 {
                client.close().await;
                closed = true;
            }
        }
        peer.check_version();
        let elapsed = started.elapsed();
        assert!(
            elapsed >= Duration::from_secs(5),
            "a second PING comes after 5 s"
        );
        assert!(pings_received >= 1);
        let last = peer
            .seen
            .iter()
            .rev()
            .find(|l| l.starts_with("RECV "))
            .unwrap();
        assert!(
            last.starts_with("RECV PING 1"),
            "{last}: wall-clock milliseconds"
        );
    });
}
