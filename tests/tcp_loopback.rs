//! Direct TCP over real loopback sockets, on smol and on tokio: one server,
//! several clients; a client killed and restarted from its persisted
//! position, and a client cut off by the server, both catch up without
//! loss. Everything runs in one task; every wait is bounded.

#![cfg(all(feature = "runtime-smol", feature = "runtime-tokio"))]

mod common;

use std::collections::BTreeMap;
use std::future::poll_fn;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};
use synapse_replication::positions::BoxError;

use common::pair::{Log, SERVER_NAME, registry, row};
use synapse_replication::positions::{
    CatchUpPage, CatchUpRequest, Follower, FollowerEvent, Writer,
};
use synapse_replication::session::{
    TcpClientEvent, TcpClientId, TcpClientSession, TcpServerEvent, TcpServerSession,
};
use synapse_replication::transport::{
    BoxFuture, CatchUpSource, Runtime, SmolRuntime, TcpClient, TcpServer, TokioRuntime,
};
use synapse_replication::wire::{InstanceName, RawRow, StreamName, Token};

/// How long any one wait may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(15);

type SharedLog = Arc<Mutex<Log>>;

fn source(log: SharedLog) -> Arc<dyn CatchUpSource> {
    Arc::new(
        move |request: CatchUpRequest| -> BoxFuture<'static, Result<CatchUpPage, BoxError>> {
            // Pages of 7 rows, so that some catch-ups take several.
            let page = log.lock().unwrap().answer(&request, 7);
            Box::pin(async move { Ok(page) })
        },
    )
}

struct Worker<R: Runtime> {
    client: TcpClient<R>,
    rows: Vec<(Token, RawRow)>,
    position: Option<Token>,
    ready: bool,
    connects: usize,
    disconnects: usize,
    catch_ups: usize,
}

struct World<R: Runtime + Clone> {
    runtime: R,
    server: TcpServer<R>,
    workers: Vec<Option<Worker<R>>>,
    log: SharedLog,
    token: i64,
    names: BTreeMap<String, TcpClientId>,
    server_disconnects: usize,
}

enum Happened {
    Server(TcpServerEvent),
    Worker(usize, Option<TcpClientEvent>),
    Timeout,
}

impl<R: Runtime + Clone> World<R> {
    async fn new(runtime: R) -> World<R> {
        let mut writer = Writer::new(InstanceName::master(), registry());
        writer.advance(&StreamName::Caches, Token(0)).unwrap();
        let session = TcpServerSession::new(SERVER_NAME, writer, Instant::now()).unwrap();
        let server = TcpServer::bind(runtime.clone(), "127.0.0.1:0", session)
            .await
            .unwrap();
        World {
            runtime,
            server,
            workers: Vec::new(),
            log: SharedLog::default(),
            token: 0,
            names: BTreeMap::new(),
            server_disconnects: 0,
        }
    }

    /// Starts worker `index` from `position` (what it persisted), or from
    /// the server's first announcement.
    fn start(&mut self, index: usize, position: Option<Token>) {
        let name = format!("worker{}", index + 1);
        let mut follower = Follower::new(InstanceName::from(name.as_str()), registry());
        if let Some(token) = position {
            follower
                .set_position(&StreamName::Caches, &InstanceName::master(), token)
                .unwrap();
        }
        let session = TcpClientSession::new(SERVER_NAME, follower).unwrap();
        let addr = self.server.local_addr().unwrap().to_string();
        let client = TcpClient::new(self.runtime.clone(), addr, session)
            .with_catch_up(source(self.log.clone()));
        let worker = Worker {
            client,
            rows: Vec::new(),
            position,
            ready: false,
            connects: 0,
            disconnects: 0,
            catch_ups: 0,
        };
        if self.workers.len() <= index {
            self.workers.resize_with(index + 1, || None);
        }
        self.workers[index] = Some(worker);
    }

    fn worker(&self, index: usize) -> &Worker<R> {
        self.workers[index].as_ref().unwrap()
    }

    /// Writes `count` tokens of rows (every third token has two rows).
    fn write(&mut self, count: i64) {
        for _ in 0..count {
            self.token += 1;
            let token = Token(self.token);
            let mut rows = vec![(token, row(self.token))];
            if self.token % 3 == 0 {
                rows.push((token, row(-self.token)));
            }
            self.log
                .lock()
                .unwrap()
                .record(&StreamName::Caches, "master", &rows);
            self.server
                .session_mut()
                .write(&StreamName::Caches, token, rows)
                .unwrap();
        }
    }

    /// Every row written, in order.
    fn expected(&self) -> Vec<(Token, RawRow)> {
        let log = self.log.lock().unwrap();
        log.rows
            .get(&("caches".to_owned(), "master".to_owned()))
            .cloned()
            .unwrap_or_default()
    }

    async fn turn(&mut self, sleep: &mut BoxFuture<'static, ()>) -> Happened {
        let server = &mut self.server;
        let workers = &mut self.workers;
        poll_fn(|cx| {
            if let Poll::Ready(event) = server.poll_next_event(cx) {
                return Poll::Ready(Happened::Server(event));
            }
            for (index, worker) in workers.iter_mut().enumerate() {
                if let Some(worker) = worker {
                    if let Poll::Ready(event) = worker.client.poll_next_event(cx) {
                        return Poll::Ready(Happened::Worker(index, event));
                    }
                }
            }
            if sleep.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Happened::Timeout);
            }
            Poll::Pending
        })
        .await
    }

    fn record(&mut self, happened: Happened) {
        match happened {
            Happened::Server(TcpServerEvent::Named { client, name }) => {
                self.names.insert(name.to_string(), client);
            }
            Happened::Server(TcpServerEvent::Disconnected { .. }) => self.server_disconnects += 1,
            Happened::Server(_) | Happened::Timeout => {}
            Happened::Worker(index, event) => {
                let Some(worker) = self.workers[index].as_mut() else {
                    return;
                };
                match event {
                    Some(TcpClientEvent::Connected) => worker.connects += 1,
                    Some(TcpClientEvent::Disconnected { .. }) => {
                        worker.disconnects += 1;
                        worker.ready = false;
                    }
                    Some(TcpClientEvent::Ready { .. }) => worker.ready = true,
                    Some(TcpClientEvent::Follower(FollowerEvent::Rows {
                        stream: StreamName::Caches,
                        token,
                        rows,
                        ..
                    })) => {
                        worker.rows.extend(rows.into_iter().map(|row| (token, row)));
                        worker.position = Some(token);
                    }
                    Some(
                        TcpClientEvent::Follower(FollowerEvent::Position {
                            stream: StreamName::Caches,
                            token,
                            ..
                        })
                        | TcpClientEvent::Follower(FollowerEvent::Started {
                            stream: StreamName::Caches,
                            token,
                            ..
                        }),
                    ) => worker.position = Some(token),
                    Some(TcpClientEvent::Follower(FollowerEvent::CatchUp(_))) => {
                        worker.catch_ups += 1
                    }
                    Some(TcpClientEvent::CatchUpFailed { error, .. }) => {
                        panic!("worker{}: catch-up failed: {error}", index + 1)
                    }
                    _ => {}
                }
            }
        }
    }

    /// Runs until `done` holds; fails after [`PATIENCE`].
    async fn run_until(&mut self, what: &str, done: impl Fn(&World<R>) -> bool) {
        let mut sleep = self.runtime.sleep_until(Instant::now() + PATIENCE);
        while !done(self) {
            let happened = self.turn(&mut sleep).await;
            if matches!(happened, Happened::Timeout) {
                panic!("timed out waiting for {what}");
            }
            self.record(happened);
        }
    }

    fn at(&self, indices: &[usize], token: i64) -> bool {
        indices
            .iter()
            .all(|&i| self.worker(i).ready && self.worker(i).position == Some(Token(token)))
    }
}

async fn scenario<R: Runtime + Clone>(runtime: R) {
    let started = Instant::now();
    let mut world = World::new(runtime).await;
    for index in 0..3 {
        world.start(index, None);
    }
    world
        .run_until("three workers to connect", |w| w.at(&[0, 1, 2], 0))
        .await;

    for _ in 0..3 {
        world.write(10);
        let token = world.token;
        world
            .run_until("live rows", |w| w.at(&[0, 1, 2], token))
            .await;
    }

    // worker3 dies: what it applied is what it persisted.
    let dead = world.workers[2].take().unwrap();
    let persisted = dead.position;
    let applied_before = dead.rows.clone();
    drop(dead);
    world
        .run_until("the server to see worker3 go", |w| {
            w.server_disconnects == 1
        })
        .await;
    world.write(25);
    let token = world.token;
    world
        .run_until("live rows without worker3", |w| w.at(&[0, 1], token))
        .await;

    // worker3 restarts from its persisted position and catches up.
    world.start(2, persisted);
    world
        .run_until("worker3 to catch up", |w| w.at(&[0, 1, 2], token))
        .await;
    let expected = world.expected();
    let mut worker3 = applied_before;
    worker3.extend(world.worker(2).rows.iter().cloned());
    assert_eq!(
        worker3, expected,
        "worker3 over its two lives: every row once"
    );
    assert_eq!(
        world.worker(2).catch_ups,
        5,
        "(30, 55]: 33 rows in pages of at most 7"
    );

    // The server cuts worker1 off; it reconnects by itself and catches up.
    let id = world.names["worker1"];
    world.server.session_mut().close(id, "go away");
    world
        .run_until("worker1 to notice", |w| w.worker(0).disconnects == 1)
        .await;
    world.write(12);
    let token = world.token;
    world
        .run_until("worker1 to come back", |w| w.at(&[0, 1, 2], token))
        .await;
    let expected = world.expected();
    for index in 0..2 {
        assert_eq!(
            world.worker(index).rows,
            expected,
            "worker{}: every row once, in order",
            index + 1
        );
    }
    assert_eq!(world.worker(0).connects, 2);
    assert!(
        world.worker(0).catch_ups >= 1,
        "worker1 fetched what it missed"
    );
    assert!(started.elapsed() < PATIENCE);
}

#[test]
fn smol_one_server_three_clients_catch_up() {
    smol::block_on(scenario(SmolRuntime));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_one_server_three_clients_catch_up() {
    scenario(TokioRuntime::current().unwrap()).await;
}

#[test]
fn tokio_runtime_from_another_executor() {
    // The runtime's handle is entered for every socket and timer, so smol's
    // executor can drive tokio's sockets.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let tokio = TokioRuntime::new(runtime.handle().clone());
    smol::block_on(scenario(tokio));
}

#[test]
fn a_client_retries_until_a_server_listens() {
    smol::block_on(async {
        // Find a free port, then free it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let follower = Follower::new(InstanceName::from("worker1"), registry());
        let session = TcpClientSession::new(SERVER_NAME, follower).unwrap();
        let mut client = TcpClient::new(SmolRuntime, addr.clone(), session);
        let mut delays = Vec::new();
        while delays.len() < 3 {
            match client.next_event().await {
                Some(TcpClientEvent::ConnectFailed { retry_in, .. }) => delays.push(retry_in),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(delays[0] <= Duration::from_millis(100));
        assert!(delays[2] >= Duration::from_millis(200) && delays[2] <= Duration::from_millis(400));

        let mut writer = Writer::new(InstanceName::master(), registry());
        writer.advance(&StreamName::Typing, Token(0)).unwrap();
        let session = TcpServerSession::new(SERVER_NAME, writer, Instant::now()).unwrap();
        let mut server = TcpServer::bind(SmolRuntime, &addr, session).await.unwrap();
        let deadline = Instant::now() + PATIENCE;
        let mut sleep = SmolRuntime.sleep_until(deadline);
        loop {
            let event = poll_fn(|cx| {
                if let Poll::Ready(event) = server.poll_next_event(cx) {
                    return Poll::Ready(Err(event));
                }
                if let Poll::Ready(event) = client.poll_next_event(cx) {
                    return Poll::Ready(Ok(event));
                }
                if sleep.as_mut().poll(cx).is_ready() {
                    panic!("timed out");
                }
                Poll::Pending
            })
            .await;
            if let Ok(Some(TcpClientEvent::Ready { .. })) = event {
                break;
            }
        }
        client.close().await;
        assert!(client.next_event().await.is_none());
    });
}
