//! Every queue is bounded: a full `CommandSender` refuses with a typed
//! error (and the command back) and the client counts it; a `TcpServer`
//! at its connection limit closes the next connection at once, counts it,
//! and serves again once a connection ends. Real loopback sockets, smol.

#![cfg(feature = "runtime-smol")]

use std::future::{Future, poll_fn};
use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use synapse_replication::session::TcpServerEvent;

use bytes::Bytes;
use synapse_replication::config::{RedisConfig, StreamWriters};
use synapse_replication::positions::{Follower, Writer};
use synapse_replication::session::{
    RedisSession, RedisSessionConfig, TcpClientSession, TcpServerSession,
};
use synapse_replication::transport::{
    CommandSendError, CommandSender, Queued, RedisClient, RedisClientConfig, SmolRuntime,
    TcpClient, TcpClientConfig, TcpServer, TcpServerConfig,
};
use synapse_replication::wire::{Command, InstanceName, StreamName, Token};

const PATIENCE: Duration = Duration::from_secs(15);

fn command(n: usize) -> Command {
    Command::decode(Bytes::from(format!("REMOTE_SERVER_UP server{n}.example")))
        .expect("decodes")
        .expect("a command")
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binds");
    listener.local_addr().expect("an address").port()
}

#[test]
fn defaults() {
    assert_eq!(TcpServerConfig::default().max_connections, 1024);
    assert_eq!(TcpClientConfig::default().command_queue, 4096);
    assert_eq!(RedisClientConfig::default().command_queue, 4096);
    assert_eq!(CommandSender::DEFAULT_CAPACITY, 4096);
}

/// Fills `sender` to `capacity`, then checks the next send is refused
/// with the command back.
fn fill_and_overflow(sender: &CommandSender, capacity: usize) {
    assert_eq!(sender.capacity(), capacity);
    for n in 0..capacity {
        sender.send(command(n)).expect("room in the queue");
    }
    match sender.send(command(99)) {
        Err(error @ CommandSendError::Full { .. }) => {
            assert!(
                error.to_string().contains("queue full"),
                "an actionable message: {error}"
            );
            let CommandSendError::Full { capacity: cap, .. } = &error else {
                unreachable!();
            };
            assert_eq!(*cap, capacity);
            assert_eq!(error.into_queued(), Queued::Command(command(99)));
        }
        other => panic!("expected Full, got {other:?}"),
    }
}

#[test]
fn a_full_tcp_command_sender_refuses_and_counts() {
    let mut options = TcpClientConfig::default();
    options.command_queue = 3;
    options.connect_timeout = Duration::from_millis(200);
    let follower = Follower::new(
        InstanceName::from("worker1"),
        Arc::new(StreamWriters::default()),
    );
    let session = TcpClientSession::new("example.com", follower).expect("a session");
    let addr = format!("127.0.0.1:{}", closed_port());
    let mut client = TcpClient::with_config(SmolRuntime, addr, session, options);
    let sender = client.sender();
    fill_and_overflow(&sender, 3);
    assert_eq!(client.refused_commands(), 1);
    // Every sender shares the one queue.
    assert!(matches!(
        client.sender().send(command(7)),
        Err(CommandSendError::Full { .. })
    ));
    assert_eq!(client.refused_commands(), 2);
    assert!(format!("{client:?}").contains("refused_commands: 2"));

    // One turn of the client takes the queue (the commands fail: not
    // connected); there is room again.
    smol::block_on(client.next_event()).expect("an event");
    sender.send(command(8)).expect("room after a turn");
    assert_eq!(client.refused_commands(), 2);

    smol::block_on(client.close());
    assert!(matches!(
        sender.send(command(9)),
        Err(CommandSendError::Closed(_))
    ));
    drop(client);
    assert!(matches!(
        sender.send(command(10)),
        Err(CommandSendError::Closed(_))
    ));
}

#[test]
fn a_full_redis_command_sender_refuses_and_counts() {
    let mut options = RedisClientConfig::default();
    options.command_queue = 2;
    let registry = Arc::new(StreamWriters::default().with_redis(true));
    let me = InstanceName::from("worker1");
    let session = RedisSession::new(
        RedisSessionConfig::new("example.com"),
        Follower::new(me.clone(), registry.clone()),
        Writer::new(me, registry),
    );
    let config = RedisConfig::tcp("127.0.0.1", closed_port())
        .with_connect_timeout(Duration::from_millis(200));
    let mut client = RedisClient::with_config(SmolRuntime, config, session, options);
    let sender = client.sender();
    fill_and_overflow(&sender, 2);
    assert_eq!(client.stats().refused_commands, 1);
    assert_eq!(
        client.session().stats().refused_commands,
        0,
        "the session cannot know"
    );

    smol::block_on(client.next_event()).expect("an event");
    sender.send(command(3)).expect("room after a turn");
    assert_eq!(client.stats().refused_commands, 1);

    smol::block_on(client.close(Duration::from_millis(100)));
    assert!(matches!(
        sender.send(command(4)),
        Err(CommandSendError::Closed(_))
    ));
}

#[test]
fn a_sender_shuts_a_tcp_client_down_from_another_task() {
    let follower = Follower::new(
        InstanceName::from("worker1"),
        Arc::new(StreamWriters::default()),
    );
    let session = TcpClientSession::new("example.com", follower).expect("a session");
    let addr = format!("127.0.0.1:{}", closed_port());
    let mut client = TcpClient::new(SmolRuntime, addr, session);
    let sender = client.sender();
    smol::block_on(async {
        // The client waits (retrying a closed port) until another task
        // shuts it down.
        let stop = async {
            smol::Timer::after(Duration::from_millis(50)).await;
            sender.shutdown();
        };
        let drain = async {
            while client.next_event().await.is_some() {}
            Some(())
        };
        let give_up = async {
            smol::Timer::after(PATIENCE).await;
            panic!("the client never shut down");
        };
        let both = async { futures::future::join(drain, stop).await.0 };
        let ended = smol::future::or(both, give_up).await;
        assert_eq!(ended, Some(()), "next_event returned None");
    });
    assert!(smol::block_on(client.next_event()).is_none());
    assert!(matches!(
        sender.send(command(1)),
        Err(CommandSendError::Closed(_))
    ));
}

#[test]
fn a_sender_shuts_a_redis_client_down_from_another_task() {
    let registry = Arc::new(StreamWriters::default().with_redis(true));
    let me = InstanceName::from("worker1");
    let session = RedisSession::new(
        RedisSessionConfig::new("example.com"),
        Follower::new(me.clone(), registry.clone()),
        Writer::new(me, registry),
    );
    let config = RedisConfig::tcp("127.0.0.1", closed_port());
    let mut client = RedisClient::new(SmolRuntime, config, session);
    let sender = client.sender();
    smol::block_on(async {
        let stop = async {
            smol::Timer::after(Duration::from_millis(50)).await;
            sender.shutdown();
        };
        let drain = async {
            while client.next_event().await.is_some() {}
            Some(())
        };
        let give_up = async {
            smol::Timer::after(PATIENCE).await;
            panic!("the client never shut down");
        };
        let both = async { futures::future::join(drain, stop).await.0 };
        assert_eq!(smol::future::or(both, give_up).await, Some(()));
    });
    assert!(smol::block_on(client.next_event()).is_none());
    assert!(matches!(
        sender.send(command(1)),
        Err(CommandSendError::Closed(_))
    ));
}

/// Polls the server until `want` accepts an event, or fails after
/// [`PATIENCE`].
fn next_matching(
    server: &mut TcpServer<SmolRuntime>,
    what: &str,
    mut want: impl FnMut(&TcpServerEvent) -> bool,
) -> TcpServerEvent {
    smol::block_on(async {
        let mut timer = smol::Timer::after(PATIENCE);
        poll_fn(|cx| {
            while let Poll::Ready(event) = server.poll_next_event(cx) {
                if want(&event) {
                    return Poll::Ready(event);
                }
            }
            if Pin::new(&mut timer).poll(cx).is_ready() {
                panic!("timed out waiting for {what}");
            }
            Poll::Pending
        })
        .await
    })
}

fn accepted(server: &mut TcpServer<SmolRuntime>, from: SocketAddr) {
    next_matching(server, "an accepted connection", |event| {
        assert!(
            !matches!(event, TcpServerEvent::Refused { .. }),
            "refused: {event:?}"
        );
        matches!(event, TcpServerEvent::Accepted { peer, .. } if *peer == from)
    });
}

#[test]
fn a_tcp_server_at_its_limit_closes_the_next_connection() {
    let mut writer = Writer::new(InstanceName::master(), Arc::new(StreamWriters::default()));
    writer
        .advance(&StreamName::Caches, Token(0))
        .expect("advances");
    let session = TcpServerSession::new("example.com", writer, Instant::now()).expect("a session");
    let mut options = TcpServerConfig::default();
    options.max_connections = 2;
    let mut server = smol::block_on(TcpServer::bind_with(
        SmolRuntime,
        "127.0.0.1:0",
        session,
        options,
    ))
    .expect("listens");
    let addr = server.local_addr().expect("an address");

    let first = TcpStream::connect(addr).expect("connects");
    accepted(&mut server, first.local_addr().expect("an address"));
    let second = TcpStream::connect(addr).expect("connects");
    accepted(&mut server, second.local_addr().expect("an address"));
    assert_eq!(server.refused_connections(), 0);

    let mut third = TcpStream::connect(addr).expect("the OS completes the handshake");
    let third_addr = third.local_addr().expect("an address");
    let event = next_matching(&mut server, "the refusal", |event| {
        assert!(
            !matches!(event, TcpServerEvent::Accepted { .. }),
            "accepted over the limit: {event:?}"
        );
        matches!(event, TcpServerEvent::Refused { .. })
    });
    assert!(matches!(event, TcpServerEvent::Refused { peer } if peer == third_addr));
    assert_eq!(server.refused_connections(), 1);
    assert_eq!(server.session().clients().count(), 2);
    // Closed at once, before a byte was sent.
    third
        .set_read_timeout(Some(PATIENCE))
        .expect("a read timeout");
    match third.read(&mut [0; 64]) {
        Ok(0) => {}
        Err(error) if error.kind() == ErrorKind::ConnectionReset => {}
        other => panic!("the refused connection is not closed: {other:?}"),
    }

    // One connection ends: the next is served.
    drop(first);
    next_matching(&mut server, "the first connection's end", |event| {
        matches!(event, TcpServerEvent::Disconnected { .. })
    });
    let mut fourth = TcpStream::connect(addr).expect("connects");
    accepted(&mut server, fourth.local_addr().expect("an address"));
    assert_eq!(server.refused_connections(), 1);
    assert!(format!("{server:?}").contains("refused: 1"));
    // It is served: the server greets it.
    fourth
        .set_read_timeout(Some(PATIENCE))
        .expect("a read timeout");
    let mut greeting = [0; 6];
    smol::block_on(async {
        let reader = smol::unblock(move || fourth.read_exact(&mut greeting).map(|()| greeting));
        let mut reader = std::pin::pin!(reader);
        poll_fn(|cx| {
            while server.poll_next_event(cx).is_ready() {}
            reader.as_mut().poll(cx)
        })
        .await
    })
    .map(|greeting| assert_eq!(&greeting, b"SERVER"))
    .expect("the server greets the fourth connection");
    drop(second);
}
