//! Waiting for a writer's position (`wait_for_position`) against a real
//! redis-server, and over direct TCP: a Rust writer writes rows, a Rust
//! follower's waits resolve only once its application has taken the row's
//! event and come back, resolve at once when there is nothing to wait
//! for, time out saying where the writer got to, are bounded, free their
//! slot when dropped, and fail once the client is gone.
//!
//! Every client runs in the test's one task (waits may be awaited from
//! other tasks, and one test does). Deadlines only stop a test that would
//! otherwise hang; nothing here measures time.

#![cfg(all(unix, feature = "runtime-smol", feature = "runtime-tokio"))]

mod common;

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use synapse_replication::config::{RedisConfig, StreamWriters};
use synapse_replication::positions::{Follower, FollowerEvent, History, Writer};
use synapse_replication::session::{
    RedisEvent, RedisSession, TcpClientEvent, TcpClientSession, TcpServerSession,
};
use synapse_replication::transport::{
    BoxFuture, RedisClient, RedisClientConfig, Runtime, SmolRuntime, TcpClient, TcpClientConfig,
    TcpServer, TokioRuntime, WaitError, WaitForPosition,
};
use synapse_replication::wire::{InstanceName, RawRow, StreamName, Token};

const PREFIX: &str = "test.example";
/// Stops a test that would hang; never reached when things work.
const PATIENCE: Duration = Duration::from_secs(30);
/// A wait's timeout when it is meant to resolve: never reached.
const LONG: Duration = Duration::from_secs(60);

type Rt = Arc<dyn Runtime>;

/// Runs `scenario` on smol, then on tokio.
fn on_both_runtimes(scenario: impl Fn(Rt) -> BoxFuture<'static, ()>) {
    smol::block_on(scenario(Arc::new(SmolRuntime)));
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let runtime: Rt = Arc::new(TokioRuntime::new(tokio.handle().clone()));
    tokio.block_on(scenario(runtime));
}

fn events() -> StreamName {
    StreamName::Events
}

fn master() -> InstanceName {
    InstanceName::master()
}

fn row(n: i64) -> RawRow {
    RawRow::new(format!(
        r#"["ev",["$event{n}","!room:test.example","m.room.message",null,null,null]]"#
    ))
    .expect("a valid row")
}

/// One process on Redis: its client, and the tokens of the `events` rows
/// its application took, in order.
struct Node {
    client: RedisClient<Rt>,
    rows: Vec<Token>,
}

impl Node {
    fn new(runtime: &Rt, server: &RedisServer, name: &str, options: RedisClientConfig) -> Node {
        let registry = Arc::new(StreamWriters::default().with_redis(true));
        let config = RedisConfig::tcp("127.0.0.1", server.port());
        let me = InstanceName::from(name);
        let mut session_options = config.session_config(PREFIX);
        session_options.client_name = Some(name.to_owned());
        let session = RedisSession::new(
            session_options,
            Follower::new(me.clone(), registry.clone()),
            Writer::new(me, registry),
        );
        let client = RedisClient::with_config(runtime.clone(), config, session, options);
        Node {
            client,
            rows: Vec::new(),
        }
    }

    /// Takes one event if there is one; whether it did.
    fn poll_once(&mut self, cx: &mut Context<'_>) -> Option<RedisEvent> {
        match self.client.poll_next_event(cx) {
            Poll::Ready(Some(event)) => {
                if let RedisEvent::Follower(FollowerEvent::Rows {
                    stream: StreamName::Events,
                    token,
                    ..
                }) = &event
                {
                    self.rows.push(*token);
                }
                Some(event)
            }
            Poll::Ready(None) | Poll::Pending => None,
        }
    }

    /// Takes every event there is now; whether there was any.
    fn poll_all(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        while self.poll_once(cx).is_some() {
            progress = true;
        }
        progress
    }

    /// Writes one `events` row at each token of `tokens`.
    fn write(&mut self, tokens: std::ops::RangeInclusive<i64>) {
        for n in tokens {
            self.client
                .write(&events(), Token(n), [(Token(n), row(n))])
                .expect("master writes events");
        }
    }
}

/// A writer (`master`, writing `events` from 0) and a follower
/// (`worker1`) on `server`, both ready, the follower following the
/// writer's `events`.
async fn pair(runtime: &Rt, server: &RedisServer, options: RedisClientConfig) -> (Node, Node) {
    // The worker catches up from the writer's history, as a Rust
    // follower of a Rust writer does (a REPLICATE makes it check the
    // writer's next row with a catch-up).
    let history = Arc::new(Mutex::new(History::new(10_000)));
    let mut writer = Node::new(runtime, server, "master", RedisClientConfig::default());
    writer.client = writer.client.with_history(history.clone());
    writer
        .client
        .advance(&events(), Token(0))
        .expect("master writes events");
    let mut worker = Node::new(runtime, server, "worker1", options);
    worker.client = worker.client.with_catch_up(history);
    worker
        .client
        .set_position(&events(), &master(), Token(0))
        .expect("a position to start from");
    run_until(runtime, &mut writer, &mut worker, "both ready", |_, w| {
        w.client.is_ready()
            && w.client
                .follower()
                .is_writer_connected(&events(), &master())
    })
    .await;
    (writer, worker)
}

/// Polls both until `done` holds; panics after [`PATIENCE`].
async fn run_until(
    runtime: &Rt,
    writer: &mut Node,
    worker: &mut Node,
    what: &str,
    mut done: impl FnMut(&Node, &Node) -> bool,
) {
    let mut give_up = runtime.sleep_until(runtime.now() + PATIENCE);
    poll_fn(|cx| {
        loop {
            let progress = writer.poll_all(cx) | worker.poll_all(cx);
            if done(writer, worker) {
                return Poll::Ready(());
            }
            if !progress {
                break;
            }
        }
        if give_up.as_mut().poll(cx).is_ready() {
            panic!(
                "timed out waiting for {what}: worker took {:?}",
                worker.rows
            );
        }
        Poll::Pending
    })
    .await
}

/// Polls both and the wait until the wait resolves; what it resolved to,
/// and the rows the worker's application had taken by then.
async fn drive(
    runtime: &Rt,
    writer: &mut Node,
    worker: &mut Node,
    wait: &mut WaitForPosition,
) -> (Result<(), WaitError>, Vec<Token>) {
    let mut give_up = runtime.sleep_until(runtime.now() + PATIENCE);
    poll_fn(|cx| {
        loop {
            // The worker first, one event at a time, the wait checked
            // after each: it resolves at the worker's first call after the
            // event that satisfies it.
            let mut progress = writer.poll_all(cx);
            loop {
                if let Poll::Ready(result) = Pin::new(&mut *wait).poll(cx) {
                    return Poll::Ready((result, worker.rows.clone()));
                }
                if worker.poll_once(cx).is_none() {
                    break;
                }
                progress = true;
            }
            if !progress {
                break;
            }
        }
        if give_up.as_mut().poll(cx).is_ready() {
            panic!(
                "timed out driving a wait ({wait:?}): worker took {:?}",
                worker.rows
            );
        }
        Poll::Pending
    })
    .await
}

/// Polls a future once, with a waker that does nothing.
fn poll_now<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    let waker = futures::task::noop_waker();
    Pin::new(future).poll(&mut Context::from_waker(&waker))
}

fn fast_options() -> RedisClientConfig {
    let mut options = RedisClientConfig::default();
    options.initial_backoff = Duration::from_millis(20);
    options
}

/// A wait made before the rows resolves once the application has taken
/// the event of the row at its token and come back for the next one; not
/// when the row is handed over, and not for the rows before it.
#[test]
fn resolves_once_the_row_is_applied() {
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let server = RedisServer::start();
            let (mut writer, mut worker) = pair(&runtime, &server, fast_options()).await;
            let mut wait = worker
                .client
                .wait_for_position(&events(), &master(), Token(3), LONG);
            assert!(poll_now(&mut wait).is_pending());

            writer.write(1..=3);
            // The worker's application takes events one by one; the wait
            // is checked after each.
            let mut give_up = runtime.sleep_until(runtime.now() + PATIENCE);
            poll_fn(|cx| {
                loop {
                    let progress = writer.poll_all(cx);
                    assert!(
                        poll_now(&mut wait).is_pending(),
                        "resolved before the row of 3 was taken (took {:?})",
                        worker.rows
                    );
                    match worker.poll_once(cx) {
                        Some(RedisEvent::Follower(FollowerEvent::Rows {
                            token: Token(3), ..
                        })) => {
                            return Poll::Ready(());
                        }
                        Some(_) => continue,
                        None if progress => continue,
                        None => break,
                    }
                }
                if give_up.as_mut().poll(cx).is_ready() {
                    panic!("the row of 3 never came: took {:?}", worker.rows);
                }
                Poll::Pending
            })
            .await;
            assert_eq!(worker.rows, [Token(1), Token(2), Token(3)]);
            // Handed over, not yet applied: the application has not come
            // back.
            assert!(poll_now(&mut wait).is_pending());
            assert_eq!(worker.client.waiter().waiting(), 1);

            // It comes back (whatever that call returns): applied.
            let waker = futures::task::noop_waker();
            let _ = worker
                .client
                .poll_next_event(&mut Context::from_waker(&waker));
            assert_eq!(poll_now(&mut wait), Poll::Ready(Ok(())));
            assert_eq!(worker.client.waiter().waiting(), 0);
        })
    });
}

/// Waits from another task (as an HTTP handler's would be) resolve as the
/// client's task applies the rows; one for a token the writer never
/// writes times out there, saying where the writer got to.
#[test]
fn waits_from_other_tasks() {
    smol::block_on(async {
        let runtime: Rt = Arc::new(SmolRuntime);
        let server = RedisServer::start();
        let (mut writer, mut worker) = pair(&runtime, &server, fast_options()).await;
        let waiter = worker.client.waiter();
        let handles: Vec<_> = (1..=5)
            .map(|n| {
                let wait = waiter.wait_for_position(&events(), &master(), Token(n * 2), LONG);
                smol::spawn(wait)
            })
            .collect();
        let never = smol::spawn(waiter.clone().wait_for_position(
            &events(),
            &master(),
            Token(1000),
            Duration::from_millis(500),
        ));
        writer.write(1..=10);
        run_until(&runtime, &mut writer, &mut worker, "every row", |_, w| {
            w.rows.len() == 10
        })
        .await;
        // The client's task must keep running for the waits to resolve.
        let mut all = Box::pin(async move {
            for handle in handles {
                assert_eq!(handle.await, Ok(()));
            }
            never.await
        });
        let mut give_up = runtime.sleep_until(runtime.now() + PATIENCE);
        let never = poll_fn(|cx| {
            writer.poll_all(cx);
            worker.poll_all(cx);
            if let Poll::Ready(result) = all.as_mut().poll(cx) {
                return Poll::Ready(result);
            }
            assert!(give_up.as_mut().poll(cx).is_pending(), "waits never ended");
            Poll::Pending
        })
        .await;
        let error = never.expect_err("token 1000 is never written");
        assert_eq!(
            error,
            WaitError::Timeout {
                stream: events(),
                writer: master(),
                token: Token(1000),
                reached: Some(Token(10)),
            }
        );
        assert_eq!(
            error.to_string(),
            "timed out waiting for master to reach 1000 on events (reached 10)"
        );
        assert_eq!(waiter.waiting(), 0);
    });
}

/// Nothing to wait for: a token already applied resolves at the client's
/// next turn with no new row (at once when the client already follows
/// that writer for another wait), and a wait for the client's own name
/// resolves at once without the client.
#[test]
fn reached_already() {
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let server = RedisServer::start();
            let (mut writer, mut worker) = pair(&runtime, &server, fast_options()).await;
            writer.write(1..=3);
            run_until(&runtime, &mut writer, &mut worker, "rows", |_, w| {
                w.rows.len() == 3
            })
            .await;

            let mut own = worker.client.wait_for_position(
                &events(),
                &InstanceName::from("worker1"),
                Token(1_000_000),
                LONG,
            );
            assert_eq!(poll_now(&mut own), Poll::Ready(Ok(())));

            let mut wait = worker
                .client
                .wait_for_position(&events(), &master(), Token(2), LONG);
            let (result, rows) = drive(&runtime, &mut writer, &mut worker, &mut wait).await;
            assert_eq!(result, Ok(()));
            assert_eq!(rows.len(), 3, "no new row was needed");

            // While a wait on the writer is held, the client knows where
            // it is: a wait for what is applied needs no turn at all.
            let mut held = worker
                .client
                .wait_for_position(&events(), &master(), Token(100), LONG);
            assert!(poll_now(&mut held).is_pending());
            let waker = futures::task::noop_waker();
            let _ = worker
                .client
                .poll_next_event(&mut Context::from_waker(&waker));
            let mut at_once = worker
                .client
                .wait_for_position(&events(), &master(), Token(3), LONG);
            assert_eq!(poll_now(&mut at_once), Poll::Ready(Ok(())));
            assert!(poll_now(&mut held).is_pending());
        })
    });
}

/// The bound: beyond `max_waiters` a wait fails at once; dropping a
/// pending wait frees its slot; a resolved one frees it too.
#[test]
fn bounded_and_freed_on_drop() {
    smol::block_on(async {
        let runtime: Rt = Arc::new(SmolRuntime);
        let server = RedisServer::start();
        let mut options = fast_options();
        options.max_waiters = 2;
        let (mut writer, mut worker) = pair(&runtime, &server, options).await;
        let waiter = worker.client.waiter();
        assert_eq!(waiter.limit(), 2);
        let mut first = waiter.wait_for_position(&events(), &master(), Token(1), LONG);
        let mut second = waiter.wait_for_position(&events(), &master(), Token(50), LONG);
        let mut third = waiter.wait_for_position(&events(), &master(), Token(60), LONG);
        assert!(poll_now(&mut first).is_pending());
        assert!(poll_now(&mut second).is_pending());
        assert_eq!(
            poll_now(&mut third),
            Poll::Ready(Err(WaitError::TooManyWaiters { limit: 2 }))
        );
        assert_eq!(waiter.waiting(), 2);

        drop(second);
        assert_eq!(waiter.waiting(), 1);
        let mut again = waiter.wait_for_position(&events(), &master(), Token(60), LONG);
        assert!(poll_now(&mut again).is_pending());
        assert_eq!(waiter.waiting(), 2);

        // A resolved wait leaves its slot.
        writer.write(1..=1);
        let (result, rows) = drive(&runtime, &mut writer, &mut worker, &mut first).await;
        assert_eq!((result, rows), (Ok(()), vec![Token(1)]));
        assert_eq!(waiter.waiting(), 1);
        let mut fourth = waiter.wait_for_position(&events(), &master(), Token(70), LONG);
        assert!(poll_now(&mut fourth).is_pending());
        assert_eq!(waiter.waiting(), 2);
        drop((again, fourth));
        assert_eq!(waiter.waiting(), 0);
    });
}

/// The client gone: pending waits fail with `Closed`, and so do new ones.
#[test]
fn closed_when_the_client_goes() {
    smol::block_on(async {
        let runtime: Rt = Arc::new(SmolRuntime);
        let server = RedisServer::start();
        let (writer, worker) = pair(&runtime, &server, fast_options()).await;
        let waiter = worker.client.waiter();
        let mut pending = waiter.wait_for_position(&events(), &master(), Token(5), LONG);
        assert!(poll_now(&mut pending).is_pending());
        let waker_task =
            smol::spawn(waiter.wait_for_position(&events(), &master(), Token(6), LONG));

        drop(worker);
        assert_eq!(poll_now(&mut pending), Poll::Ready(Err(WaitError::Closed)));
        // A waiting task is woken to hear it.
        assert_eq!(waker_task.await, Err(WaitError::Closed));
        let mut late = waiter.wait_for_position(&events(), &master(), Token(1), LONG);
        assert_eq!(poll_now(&mut late), Poll::Ready(Err(WaitError::Closed)));
        assert_eq!(waiter.waiting(), 0);
        drop(writer);
    });
}

/// The same over direct TCP: a Rust server writes `caches`, a client's
/// wait resolves once its application has applied the row.
#[test]
fn over_tcp() {
    smol::block_on(async {
        let runtime: Rt = Arc::new(SmolRuntime);
        let registry = Arc::new(StreamWriters::default());
        let mut writer = Writer::new(master(), registry.clone());
        writer
            .advance(&StreamName::Caches, Token(0))
            .expect("master writes caches");
        let session =
            TcpServerSession::new("example.com", writer, Instant::now()).expect("a server");
        let mut server = TcpServer::bind(runtime.clone(), "127.0.0.1:0", session)
            .await
            .expect("a listener");
        let addr = server.local_addr().expect("bound").to_string();
        let mut follower = Follower::new(InstanceName::from("worker1"), registry);
        follower
            .set_position(&StreamName::Caches, &master(), Token(0))
            .expect("a position");
        let session = TcpClientSession::new("example.com", follower).expect("a client session");
        let mut client = TcpClient::new(runtime.clone(), addr, session);
        let mut taken: Vec<Token> = Vec::new();

        let mut wait = client.wait_for_position(&StreamName::Caches, &master(), Token(2), LONG);
        let mut written = false;
        let mut give_up = runtime.sleep_until(runtime.now() + PATIENCE);
        let result = poll_fn(|cx| {
            loop {
                let mut progress = false;
                while server.poll_next_event(cx).is_ready() {
                    progress = true;
                }
                if !written
                    && client
                        .follower()
                        .is_writer_connected(&StreamName::Caches, &master())
                {
                    for n in 1..=2 {
                        let row =
                            RawRow::new(format!(r#"["get_user_by_id",["@u{n}:example.com"],{n}]"#))
                                .expect("a row");
                        server
                            .session_mut()
                            .write(&StreamName::Caches, Token(n), [(Token(n), row)])
                            .expect("master writes caches");
                    }
                    written = true;
                    progress = true;
                }
                loop {
                    if let Poll::Ready(result) = Pin::new(&mut wait).poll(cx) {
                        return Poll::Ready(result);
                    }
                    match client.poll_next_event(cx) {
                        Poll::Ready(Some(TcpClientEvent::Follower(FollowerEvent::Rows {
                            token,
                            ..
                        }))) => taken.push(token),
                        Poll::Ready(Some(_)) => {}
                        _ => break,
                    }
                    progress = true;
                }
                if !progress {
                    break;
                }
            }
            assert!(
                give_up.as_mut().poll(cx).is_pending(),
                "the wait never resolved: took {taken:?}"
            );
            Poll::Pending
        })
        .await;
        assert_eq!(result, Ok(()));
        assert_eq!(taken, [Token(1), Token(2)]);
        drop(client);
    });
}

/// Any timeout works, up to `Duration::MAX` ("as long as it takes"): such
/// a wait resolves once the row is applied, or fails when its client
/// goes; over Redis and direct TCP, and closing with such a timeout ends
/// once the queue is written.
#[test]
fn a_timeout_up_to_duration_max_waits_as_long_as_it_takes() {
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let server = RedisServer::start();
            let (mut writer, mut worker) = pair(&runtime, &server, fast_options()).await;
            let mut wait =
                worker
                    .client
                    .wait_for_position(&events(), &master(), Token(2), Duration::MAX);
            assert!(poll_now(&mut wait).is_pending());
            writer.write(1..=2);
            let (result, rows) = drive(&runtime, &mut writer, &mut worker, &mut wait).await;
            assert_eq!(result, Ok(()));
            assert_eq!(rows, [Token(1), Token(2)]);
            worker.client.close(Duration::MAX).await;
            writer.client.close(Duration::MAX).await;

            // A TCP client that never connects: the wait is held until
            // the client goes.
            let follower = Follower::new(
                InstanceName::from("worker1"),
                Arc::new(StreamWriters::default()),
            );
            let session = TcpClientSession::new("example.com", follower).expect("a client session");
            let client = TcpClient::new(runtime.clone(), "127.0.0.1:1", session);
            let mut wait =
                client.wait_for_position(&StreamName::Caches, &master(), Token(1), Duration::MAX);
            assert!(poll_now(&mut wait).is_pending());
            drop(client);
            assert_eq!(poll_now(&mut wait), Poll::Ready(Err(WaitError::Closed)));
        })
    });
}

/// Reconnection delays and connect timeouts up to `Duration::MAX`: a
/// client that cannot connect says so and waits to try again, over Redis
/// and direct TCP.
#[test]
fn backoff_and_connect_timeout_up_to_duration_max() {
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|listener| listener.local_addr())
                .expect("a free port")
                .port();
            let mut options = RedisClientConfig::default();
            options.initial_backoff = Duration::MAX;
            options.max_backoff = Duration::MAX;
            options.catch_up_backoff = Duration::MAX;
            let registry = Arc::new(StreamWriters::default().with_redis(true));
            let config = RedisConfig::tcp("127.0.0.1", port).with_connect_timeout(Duration::MAX);
            let me = InstanceName::from("worker1");
            let session = RedisSession::new(
                config.session_config(PREFIX),
                Follower::new(me.clone(), registry.clone()),
                Writer::new(me, registry),
            );
            let mut redis = RedisClient::with_config(runtime.clone(), config, session, options);
            let mut options = TcpClientConfig::default();
            options.initial_backoff = Duration::MAX;
            options.max_backoff = Duration::MAX;
            options.connect_timeout = Duration::MAX;
            let follower = Follower::new(
                InstanceName::from("worker1"),
                Arc::new(StreamWriters::default()),
            );
            let session = TcpClientSession::new("example.com", follower).expect("a client session");
            let mut tcp = TcpClient::with_config(
                runtime.clone(),
                format!("127.0.0.1:{port}"),
                session,
                options,
            );

            let (mut redis_failed, mut tcp_failed) = (0, false);
            let mut give_up = runtime.sleep_until(runtime.now() + PATIENCE);
            poll_fn(|cx| {
                while let Poll::Ready(Some(event)) = redis.poll_next_event(cx) {
                    if let RedisEvent::ConnectFailed { retry_in, .. } = event {
                        assert!(retry_in >= Duration::MAX / 2, "{retry_in:?}");
                        redis_failed += 1;
                    }
                }
                while let Poll::Ready(Some(event)) = tcp.poll_next_event(cx) {
                    if let TcpClientEvent::ConnectFailed { retry_in, .. } = event {
                        assert!(retry_in >= Duration::MAX / 2, "{retry_in:?}");
                        tcp_failed = true;
                    }
                }
                // Both Redis connections (publish and subscribe) failed.
                if redis_failed >= 2 && tcp_failed {
                    return Poll::Ready(());
                }
                assert!(
                    give_up.as_mut().poll(cx).is_pending(),
                    "no connection failed: redis {redis_failed}, tcp {tcp_failed}"
                );
                Poll::Pending
            })
            .await;
        })
    });
}

/// Against a real Synapse 1.163.2 (its rig: a monolith on SQLite with its
/// own redis-server): a Rust follower waits for positions Synapse's main
/// process reaches on `events` when a client sends a message. A wait made
/// before the message resolves once the follower's application has taken
/// a row at or beyond it; one for the message's own token (learned from
/// the row, which names the event) resolves with that row applied; one
/// far beyond times out at the position reached.
#[cfg(feature = "http-catch-up")]
#[test]
fn synapse_writer() {
    use common::synapse::SynapseRig;
    use serde_json::json;
    use synapse_replication::transport::HttpCatchUp;

    #[derive(Default)]
    struct Seen {
        /// Master's `events` position, as the application took it.
        position: Option<Token>,
        /// Master's `events` rows taken: token and row text.
        rows: Vec<(Token, String)>,
    }

    let rig = SynapseRig::start();
    let user = rig.register("alice", "alice-password");
    let room = rig.create_room(&user);

    let writers = StreamWriters::from_value(json!({
        "instance_map": {"main": {"host": "127.0.0.1", "port": rig.replication_port}}
    }))
    .expect("the rig's instance_map");
    let registry = Arc::new(writers.with_redis(true));
    let config = RedisConfig::tcp("127.0.0.1", rig.redis_port);
    let me = InstanceName::from("rust_worker");
    let session = RedisSession::new(
        config.session_config(&rig.server_name),
        Follower::new(me.clone(), registry.clone()),
        Writer::new(me, registry.clone()),
    );
    let mut client = RedisClient::new(SmolRuntime, config, session).with_catch_up(Arc::new(
        HttpCatchUp::new(SmolRuntime, registry, Some(rig.secret.clone()))
            .with_timeout(Duration::from_secs(10)),
    ));
    let waiter = client.waiter();
    let sender = client.sender();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let shared = seen.clone();
    let driver = std::thread::spawn(move || {
        smol::block_on(async move {
            while let Some(event) = client.next_event().await {
                let RedisEvent::Follower(event) = event else {
                    continue;
                };
                let mut seen = shared.lock().expect("seen");
                match event {
                    FollowerEvent::Rows {
                        stream: StreamName::Events,
                        writer,
                        token,
                        rows,
                        ..
                    } if writer.is_master() => {
                        seen.position = Some(token);
                        seen.rows
                            .extend(rows.iter().map(|row| (token, row.as_str().to_owned())));
                    }
                    FollowerEvent::Position {
                        stream: StreamName::Events,
                        writer,
                        token,
                    }
                    | FollowerEvent::Started {
                        stream: StreamName::Events,
                        writer,
                        token,
                    } if writer.is_master() => seen.position = Some(token),
                    _ => {}
                }
            }
        })
    });
    let poll_seen = |what: &str, check: &dyn Fn(&Seen) -> Option<Token>| -> Token {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(token) = check(&seen.lock().expect("seen")) {
                return token;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let start = poll_seen("master's events position", &|seen| seen.position);

    // Before the message: the next token of master's.
    let next = Token(start.0 + 1);
    let mut before = waiter.wait_for_position(&events(), &master(), next, LONG);
    assert!(poll_now(&mut before).is_pending());
    let event_id = rig.send_message(&user, &room, "waiting for a position");
    assert_eq!(smol::block_on(before), Ok(()));
    let reached = seen.lock().expect("seen").position;
    assert!(
        reached >= Some(next),
        "resolved at {reached:?}, before a row at {next} was applied"
    );

    // The message's own token, from its row.
    let message = poll_seen("the message's row", &|seen| {
        seen.rows
            .iter()
            .find(|(_, row)| row.contains(&event_id))
            .map(|(token, _)| *token)
    });
    assert!(message >= next);
    assert_eq!(
        smol::block_on(waiter.wait_for_position(&events(), &master(), message, LONG)),
        Ok(())
    );
    assert!(
        seen.lock()
            .expect("seen")
            .rows
            .iter()
            .any(|(token, row)| *token == message && row.contains(&event_id))
    );

    // Far beyond what Synapse wrote: a timeout, at the position reached.
    let beyond = Token(message.0 + 1000);
    match smol::block_on(waiter.wait_for_position(
        &events(),
        &master(),
        beyond,
        Duration::from_millis(300),
    )) {
        Err(WaitError::Timeout {
            token,
            reached: Some(reached),
            ..
        }) => {
            assert_eq!(token, beyond);
            assert!(reached >= message && reached < beyond, "reached {reached}");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    sender.shutdown();
    driver.join().expect("the driver thread");
    assert_eq!(
        smol::block_on(waiter.wait_for_position(&events(), &master(), beyond, LONG)),
        Err(WaitError::Closed)
    );
}
