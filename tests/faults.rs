//! Faults against a real redis-server, on smol and on tokio: a Redis that
//! comes up after its clients, a password changed under connected clients
//! and restored, another process publishing under our instance name,
//! lines forged in a writer's name, a flood of malformed messages, and
//! `next_event` futures dropped at every await point.
//!
//! Each test starts its own redis-server (`common::redis_server`) and polls
//! every client in the test's one task (`common::nodes`). Nothing here
//! measures time: deadlines only stop a test that would otherwise hang.
//! Warnings are collected by a `tracing` subscriber on the test's thread
//! (`common::faults::Warnings`), where the clients run.

#![cfg(all(unix, feature = "runtime-smol", feature = "runtime-tokio"))]

mod common;

use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use common::faults::{RawRedis, Rng, Warnings};
use common::nodes::{
    Logs, Node, PREFIX, Process, Rt, both_ready_and_following, caught_up, events_node, poll_nodes,
    row, run_for, run_until, write_events,
};
use common::redis_server::RedisServer;
use synapse_replication::config::{RedisConfig, StreamWriters};
use synapse_replication::positions::FollowerLimits;
use synapse_replication::resp::Frame;
use synapse_replication::session::{RedisError, RedisLink, RedisSession};
use synapse_replication::transport::{BoxFuture, RedisClientConfig, SmolRuntime, TokioRuntime};
use synapse_replication::wire::{InstanceName, StreamName, Token};

/// Stops a test that would hang; never reached when things work.
const PATIENCE: Duration = Duration::from_secs(60);

/// Runs `scenario` on smol, then on tokio, each on the test's thread.
fn on_both_runtimes(scenario: impl Fn(Rt) -> BoxFuture<'static, ()>) {
    smol::block_on(scenario(Arc::new(SmolRuntime)));
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let runtime: Rt = Arc::new(TokioRuntime::new(tokio.handle().clone()));
    tokio.block_on(scenario(runtime));
}

fn fast_options() -> RedisClientConfig {
    let mut options = RedisClientConfig::default();
    options.initial_backoff = Duration::from_millis(20);
    options.catch_up_backoff = Duration::from_millis(20);
    options
}

fn master() -> InstanceName {
    InstanceName::master()
}

/// `master` writing `events` (announced at 0) and `worker1` following it
/// from the start, both with `options`, on Redis at `config`.
fn master_and_worker(
    runtime: &Rt,
    config: &RedisConfig,
    logs: &Logs,
    options: &RedisClientConfig,
) -> (Node, Node) {
    (
        events_node("master", runtime, config, logs, options.clone(), |_| {}),
        events_node("worker1", runtime, config, logs, options.clone(), |_| {}),
    )
}

// --- Redis comes up after its clients -------------------------------------

#[test]
fn redis_that_comes_up_late_is_joined_within_the_backoff_cap() {
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            // A port of our own, with nothing listening on it yet.
            let mut server = RedisServer::start();
            server.kill9();
            let config = RedisConfig::tcp("127.0.0.1", server.port());
            let logs = Logs::default();
            let mut options = fast_options();
            options.initial_backoff = Duration::from_millis(50);
            options.max_backoff = Duration::from_millis(400);
            let cap = options.max_backoff;
            let (mut writer, mut worker) = master_and_worker(&runtime, &config, &logs, &options);
            write_events(&mut writer, 1, 10);

            // Two seconds without Redis: refused, again and again, backing
            // off up to the cap.
            run_for(
                &runtime,
                &mut [&mut writer, &mut worker],
                Duration::from_secs(2),
            )
            .await;
            let before: Vec<usize> = [&writer, &worker]
                .iter()
                .map(|node| node.connect_failed.len())
                .collect();
            for node in [&writer, &worker] {
                assert_eq!(node.ready, 0, "{}", node.name);
                assert_eq!(node.connected, 0, "{}", node.name);
                for link in RedisLink::BOTH {
                    let delays: Vec<Duration> = node
                        .connect_failed
                        .iter()
                        .filter(|(failed, _)| *failed == link)
                        .map(|(_, delay)| *delay)
                        .collect();
                    // 50 + 100 + 200 + 400 ms < 2 s: the delay grew to
                    // the cap (the jitter keeps it in [cap/2, cap]).
                    assert!(delays.len() >= 5, "{} {link}: {delays:?}", node.name);
                    assert!(
                        delays.iter().all(|delay| *delay <= cap),
                        "{} {link}: {delays:?}",
                        node.name
                    );
                    assert!(
                        delays.iter().any(|delay| *delay >= cap / 2),
                        "{} {link}: {delays:?}",
                        node.name
                    );
                }
            }

            // Redis comes up. Each link's next attempt (at most one
            // retry delay away, itself at most the cap) succeeds: at most
            // one more refusal per link, from an attempt already under way
            // when Redis came up, then connected, then ready.
            server.restart();
            for node in [&mut writer, &mut worker] {
                node.keep_events = true;
            }
            run_until(
                &runtime,
                &mut [&mut writer, &mut worker],
                "ready",
                PATIENCE,
                |nodes| nodes.iter().all(|node| node.ready > 0),
            )
            .await;
            for (node, before) in [&writer, &worker].into_iter().zip(before) {
                let late = &node.connect_failed[before..];
                for link in RedisLink::BOTH {
                    let refused = late.iter().filter(|(failed, _)| *failed == link).count();
                    assert!(refused <= 1, "{} {link}: {late:?}", node.name);
                }
                assert!(late.iter().all(|(_, delay)| *delay <= cap), "{late:?}");
                let ready_at = node
                    .events
                    .iter()
                    .position(|event| event == "ready")
                    .expect("ready");
                let connected = node.events[..ready_at]
                    .iter()
                    .filter(|event| event.starts_with("connected "))
                    .count();
                assert_eq!(connected, 2, "{}: {:?}", node.name, node.events);
                assert!(node.disconnects.is_empty(), "{:?}", node.disconnects);
            }

            // What the writer wrote before Redis was there reaches the
            // follower (its POSITION shows the rows; a catch-up fetches
            // them), and what it writes now comes live.
            write_events(&mut writer, 11, 20);
            caught_up(&runtime, &mut writer, &mut worker, "every row").await;
            assert_eq!(worker.rows, logs.written(&StreamName::Events, &master()));
            assert!(worker.surprises.is_empty(), "{:?}", worker.surprises);
        })
    });
}

// --- A password changed under connected clients, then restored ------------

#[test]
fn a_password_changed_while_connected_is_reported_and_nothing_is_lost() {
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let server = RedisServer::options().requirepass("s3cret").start();
            let url = format!("redis://:s3cret@127.0.0.1:{}", server.port());
            let config = RedisConfig::from_url(&url).expect("a URL");
            let logs = Logs::default();
            let (mut writer, mut worker) =
                master_and_worker(&runtime, &config, &logs, &fast_options());
            both_ready_and_following(&runtime, &mut writer, &mut worker).await;
            write_events(&mut writer, 1, 20);
            caught_up(&runtime, &mut writer, &mut worker, "first rows").await;

            // An operator changes the password: connections already
            // authenticated stay, so they are killed for it to bite. The
            // admin connection authenticated before the change outlives
            // it.
            let mut admin = RawRedis::connect(server.port(), Some("s3cret"));
            let ok = Frame::SimpleString("OK".into());
            assert_eq!(admin.command(&["CONFIG", "SET", "requirepass", "n3w"]), ok);
            let killed = admin.command(&["CLIENT", "KILL", "TYPE", "pubsub"]);
            assert_eq!(killed.as_integer(), Some(2), "{killed:?}");
            let killed = admin.command(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
            assert!(killed.as_integer() >= Some(2), "{killed:?}");
            let ready_before = (writer.ready, worker.ready);

            // The writer goes on writing while refused.
            write_events(&mut writer, 21, 60);
            let refused = |node: &Node| {
                node.closing
                    .iter()
                    .filter(|error| matches!(error, RedisError::Auth(_)))
                    .count()
            };
            run_until(
                &runtime,
                &mut [&mut writer, &mut worker],
                "refusals on every link",
                PATIENCE,
                |nodes| nodes.iter().all(|node| refused(node) >= 4),
            )
            .await;
            assert_eq!((writer.ready, worker.ready), ready_before);
            for node in [&writer, &worker] {
                assert!(!node.client.is_ready());
                // The error says what is wrong, and never the password.
                let auth: Vec<String> = node
                    .closing
                    .iter()
                    .filter(|error| matches!(error, RedisError::Auth(_)))
                    .map(ToString::to_string)
                    .collect();
                for message in &auth {
                    assert!(
                        message.starts_with("authentication failed: WRONGPASS"),
                        "{message}"
                    );
                    assert!(!message.contains("s3cret"), "{message}");
                }
                // Each refusal is a connection given up and closed, on
                // both links, retried with backoff.
                for link in RedisLink::BOTH {
                    assert!(
                        node.disconnects
                            .iter()
                            .any(|(gone, reason, _)| *gone == link
                                && reason.contains("authentication failed: WRONGPASS")),
                        "{} {link}: {:?}",
                        node.name,
                        node.disconnects
                    );
                }
                assert_eq!(
                    node.client.session().counters().closes.get("auth").copied(),
                    Some(refused(node) as u64)
                );
            }

            // Restored: ready again, and the rows written meanwhile come
            // through a catch-up from the writer's log.
            assert_eq!(
                admin.command(&["CONFIG", "SET", "requirepass", "s3cret"]),
                ok
            );
            run_until(
                &runtime,
                &mut [&mut writer, &mut worker],
                "ready again",
                PATIENCE,
                |nodes| nodes[0].ready > ready_before.0 && nodes[1].ready > ready_before.1,
            )
            .await;
            write_events(&mut writer, 61, 80);
            caught_up(&runtime, &mut writer, &mut worker, "every row").await;
            assert_eq!(worker.rows, logs.written(&StreamName::Events, &master()));
            let follower = worker.client.follower().counters();
            assert!(follower.catch_ups_requested > 0, "{follower:?}");
            assert!(worker.surprises.is_empty(), "{:?}", worker.surprises);
        })
    });
}

// --- Another process under our name ----------------------------------------

#[test]
fn another_process_publishing_under_our_name_is_counted_and_warned_about() {
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let (warnings, _guard) = Warnings::install();
            let started = Instant::now();
            let server = RedisServer::start();
            let config = RedisConfig::tcp("127.0.0.1", server.port());
            let logs = Logs::default();
            let (mut writer, mut worker) =
                master_and_worker(&runtime, &config, &logs, &fast_options());
            // worker1 writes `caches` (with Redis, every process does), so
            // its own RDATA and POSITION come back to it.
            worker
                .client
                .advance(&StreamName::Caches, Token(0))
                .expect("worker1 writes caches");
            writer.follow_from_start(&StreamName::Caches, &InstanceName::from("worker1"));
            both_ready_and_following(&runtime, &mut writer, &mut worker).await;
            let caches_written = |node: &mut Node, from: u64, to: u64| {
                for n in from..=to {
                    let rows = vec![row(&StreamName::Caches, n, 0, 0)];
                    node.write(&StreamName::Caches, Token(n as i64), rows);
                }
            };
            caches_written(&mut worker, 1, 30);
            write_events(&mut writer, 1, 30);
            // Redis delivered worker1's last publish to master, hence its
            // echo to worker1 too.
            let worker1 = InstanceName::from("worker1");
            let settled = |nodes: &[&mut Node]| {
                nodes[1].caught_up(&StreamName::Events, &master())
                    && nodes[0]
                        .client
                        .follower()
                        .position(&StreamName::Caches, &worker1)
                        == Some(Token(30))
            };
            run_until(
                &runtime,
                &mut [&mut writer, &mut worker],
                "rows both ways",
                PATIENCE,
                settled,
            )
            .await;
            let counters = worker.client.session().counters().clone();
            assert!(
                worker.client.follower().counters().own_echoes >= 31,
                "its own echoes came back"
            );
            assert_eq!(counters.impostor_echoes, 0, "own echoes are no impostor");

            // Someone else publishes as worker1: commands the real
            // worker1 could have sent (stale for master, which ignores
            // them), 20 RDATA and 20 POSITION.
            let mut impostor = RawRedis::connect(server.port(), None);
            for n in 1..=20 {
                let rdata = format!(r#"RDATA caches worker1 {n} ["impostor",{n}]"#);
                impostor.queue_publish(PREFIX, rdata.as_bytes());
                let position = format!("POSITION caches worker1 {n} {n}");
                impostor.queue_publish(PREFIX, position.as_bytes());
            }
            impostor.flush();
            let receivers = impostor.replies();
            assert!(
                receivers.iter().all(|reply| reply.as_integer() == Some(2)),
                "both subscribers heard each: {receivers:?}"
            );
            // worker1 goes on writing meanwhile: its own echoes are not
            // counted as the impostor's.
            caches_written(&mut worker, 31, 60);
            run_until(
                &runtime,
                &mut [&mut writer, &mut worker],
                "the impostor noticed",
                PATIENCE,
                |nodes| nodes[1].client.session().counters().impostor_echoes >= 40,
            )
            .await;
            write_events(&mut writer, 31, 40);
            run_until(
                &runtime,
                &mut [&mut writer, &mut worker],
                "settled again",
                PATIENCE,
                |nodes| {
                    nodes[1].caught_up(&StreamName::Events, &master())
                        && nodes[0]
                            .client
                            .follower()
                            .position(&StreamName::Caches, &worker1)
                            == Some(Token(60))
                },
            )
            .await;

            let session = worker.client.session();
            let counters = session.counters();
            assert_eq!(counters.impostor_echoes, 40, "{counters:?}");
            // Ignored like worker1's own: nothing reached worker1's
            // follower, and master ignored the stale commands.
            assert!(worker.surprises.is_empty(), "{:?}", worker.surprises);
            assert!(writer.surprises.is_empty(), "{:?}", writer.surprises);
            assert_eq!(writer.client.session().counters().impostor_echoes, 0);

            // Warned about, at most once per interval.
            let warned = warnings.containing("another process publishes under this process");
            let intervals =
                started.elapsed().as_secs() / RedisSession::WARNING_INTERVAL.as_secs() + 1;
            assert!(
                !warned.is_empty() && warned.len() as u64 <= intervals,
                "{warned:#?}"
            );
            assert!(warned[0].contains("instance=worker1"), "{warned:?}");
            assert!(
                counters.suppressed_warnings >= 40 - warned.len() as u64,
                "{counters:?}"
            );
        })
    });
}

// --- forged lines in a writer's name --------------------------------------

#[test]
fn replicate_spam_costs_at_most_one_check_per_interval() {
    // Any process may publish REPLICATE, and each one makes a follower
    // check every writer's next move with a catch-up (the sender may be a
    // writer that lost what it published). Published before each of 40
    // rows of master's, they cost at most one check per interval, and
    // every row still arrives once, in order.
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let server = RedisServer::start();
            let config = RedisConfig::tcp("127.0.0.1", server.port());
            let logs = Logs::default();
            let (mut writer, mut worker) =
                master_and_worker(&runtime, &config, &logs, &fast_options());
            both_ready_and_following(&runtime, &mut writer, &mut worker).await;
            write_events(&mut writer, 1, 10);
            caught_up(&runtime, &mut writer, &mut worker, "rows 1-10").await;

            let checked = |worker: &Node| worker.client.follower().counters().unproven_checked;
            let before = checked(&worker);
            let started = Instant::now();
            let mut impostor = RawRedis::connect(server.port(), None);
            for n in 11..=50 {
                impostor.queue_publish(PREFIX, b"REPLICATE");
                impostor.flush();
                impostor.replies();
                write_events(&mut writer, n, n);
                caught_up(&runtime, &mut writer, &mut worker, "the next row").await;
            }
            // The checks deferred to the next interval are made when it
            // begins: master's next move after that is fetched.
            runtime
                .sleep_until(runtime.now() + 2 * RedisSession::REPLICATE_CHECK_INTERVAL)
                .await;
            for n in [51, 52] {
                write_events(&mut writer, n, n);
                caught_up(&runtime, &mut writer, &mut worker, "the last rows").await;
            }
            let elapsed = started.elapsed();
            let checks = checked(&worker) - before;
            let intervals =
                elapsed.as_secs_f64() / RedisSession::REPLICATE_CHECK_INTERVAL.as_secs_f64();
            assert!(
                checks >= 1 && checks as f64 <= 2.0 + intervals,
                "{checks} checks for 40 REPLICATEs in {elapsed:?}"
            );
            assert!(worker.surprises.is_empty(), "{:?}", worker.surprises);
        })
    });
}

#[test]
fn made_up_names_make_a_real_writer_lose_no_row() {
    // Writers the configuration does not name (a generic worker writing
    // `caches`) share a bounded number of tracked pairs with any name a
    // forger makes up. A flood of made-up names makes the follower forget
    // the real one while it is idle; when it writes again, every row
    // arrives, once, in order (Logs checks each delivery).
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let server = RedisServer::start();
            let config = RedisConfig::tcp("127.0.0.1", server.port());
            let logs = Logs::default();
            let caches = StreamName::Caches;
            let generic1 = InstanceName::from("generic1");
            let mut writer = Node::new(
                "generic1",
                runtime.clone(),
                config.clone(),
                &logs,
                fast_options(),
                |_| {},
            );
            writer
                .client
                .advance(&caches, Token(0))
                .expect("every process writes caches");
            let mut limits = FollowerLimits::default();
            limits.max_tracked_pairs = 4;
            let mut worker = Node::with_limits(
                "worker1",
                runtime.clone(),
                config.clone(),
                &logs,
                fast_options(),
                Arc::new(StreamWriters::default().with_redis(true)),
                limits,
                |_| {},
            );
            worker.keep_events = true;
            worker.follow_from_start(&caches, &generic1);
            let write = |writer: &mut Node, from: u64, to: u64| {
                for n in from..=to {
                    writer.write(&caches, Token(n as i64), vec![row(&caches, n, 0, 0)]);
                }
            };
            run_until(
                &runtime,
                &mut [&mut writer, &mut worker],
                "both ready, generic1 followed",
                PATIENCE,
                |nodes| {
                    nodes.iter().all(|node| node.ready > 0)
                        && nodes[1]
                            .client
                            .follower()
                            .is_writer_connected(&caches, &generic1)
                },
            )
            .await;
            write(&mut writer, 1, 10);
            let caught_up = |nodes: &[&mut Node]| nodes[1].caught_up(&caches, &generic1);
            run_until(
                &runtime,
                &mut [&mut writer, &mut worker],
                "rows 1-10",
                PATIENCE,
                caught_up,
            )
            .await;

            let mut impostor = RawRedis::connect(server.port(), None);
            for i in 0..50 {
                let line = format!("POSITION caches made_up{i} 0 1");
                impostor.queue_publish(PREFIX, line.as_bytes());
            }
            impostor.flush();
            impostor.replies();
            run_until(
                &runtime,
                &mut [&mut writer, &mut worker],
                "the made-up names",
                PATIENCE,
                |nodes| nodes[1].client.follower().counters().writers_forgotten >= 46,
            )
            .await;
            assert!(
                worker
                    .events
                    .iter()
                    .any(|event| event.contains("forgotten caches generic1")),
                "generic1 was forgotten to make room"
            );
            write(&mut writer, 11, 30);
            run_until(
                &runtime,
                &mut [&mut writer, &mut worker],
                "rows 11-30",
                PATIENCE,
                caught_up,
            )
            .await;
            // The made-up names start where they announce themselves.
            assert!(
                worker
                    .surprises
                    .iter()
                    .all(|event| event.contains("made_up")),
                "{:?}",
                worker.surprises
            );
        })
    });
}

#[test]
fn forged_rows_ahead_of_a_writer_hide_none_of_its_rows() {
    // Two rows forged in master's name just ahead of it, the second
    // jumping above the first, before master's own rows at the tokens
    // they jumped over and at their very tokens. The forged rows may
    // reach the application; every row of master's must too, once, in
    // order (Logs checks each delivery), whatever the forger sends.
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let server = RedisServer::start();
            let config = RedisConfig::tcp("127.0.0.1", server.port());
            let logs = Logs::default();
            let (mut writer, mut worker) =
                master_and_worker(&runtime, &config, &logs, &fast_options());
            both_ready_and_following(&runtime, &mut writer, &mut worker).await;
            write_events(&mut writer, 1, 10);
            caught_up(&runtime, &mut writer, &mut worker, "rows 1-10").await;

            let mut impostor = RawRedis::connect(server.port(), None);
            let mut forge = |lines: &[String]| {
                for line in lines {
                    impostor.queue_publish(PREFIX, line.as_bytes());
                }
                impostor.flush();
                let receivers = impostor.replies();
                assert!(
                    receivers.iter().all(|reply| reply.as_integer() == Some(2)),
                    "both subscribers heard {lines:?}: {receivers:?}"
                );
            };
            forge(&[
                r#"RDATA events master 40 ["forged",40]"#.to_owned(),
                r#"RDATA events master 42 ["forged",42]"#.to_owned(),
            ]);
            write_events(&mut writer, 11, 45);
            caught_up(&runtime, &mut writer, &mut worker, "rows 11-45").await;
            // Many more, each jumping above the last (a follower keeps the
            // last 32 ranges jumped over).
            let ahead: Vec<String> = (0..31)
                .map(|i| format!(r#"RDATA events master {} ["forged",{i}]"#, 50 + 3 * i))
                .collect();
            forge(&ahead);
            write_events(&mut writer, 46, 300);
            caught_up(&runtime, &mut writer, &mut worker, "rows 46-300").await;
            // Rows at master's very next tokens, one after the other: no
            // token jumped over.
            let next: Vec<String> = (301..=310)
                .map(|token| format!(r#"RDATA events master {token} ["forged",{token}]"#))
                .collect();
            forge(&next);
            write_events(&mut writer, 301, 320);
            caught_up(&runtime, &mut writer, &mut worker, "rows 301-320").await;

            assert!(worker.surprises.is_empty(), "{:?}", worker.surprises);
            assert!(worker.forged_rows > 0, "the forged rows are delivered too");
            let follower = worker.client.follower();
            assert_eq!(
                follower.resume_point(&StreamName::Events, &master()),
                Some(Token(320))
            );
        })
    });
}

#[test]
fn lines_forged_in_a_writers_name_hide_none_of_its_rows() {
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let server = RedisServer::start();
            let config = RedisConfig::tcp("127.0.0.1", server.port());
            let logs = Logs::default();
            let (mut writer, mut worker) =
                master_and_worker(&runtime, &config, &logs, &fast_options());
            both_ready_and_following(&runtime, &mut writer, &mut worker).await;
            write_events(&mut writer, 1, 10);
            caught_up(&runtime, &mut writer, &mut worker, "rows 1-10").await;
            // worker1's own REPLICATE, sent when it became ready, may come
            // back only after rows 1-10 (the harness stops polling it once it
            // follows master): then master's next move is checked as its
            // first since a REPLICATE. Published before rows 11-20, it is
            // handled before them, so that the forged lines below meet a
            // writer already proven, and the jump check.
            write_events(&mut writer, 11, 20);
            caught_up(&runtime, &mut writer, &mut worker, "rows 11-20").await;

            // Anyone who may publish on the Redis speaks as master: a
            // POSITION that claims every token up to the top, an RDATA at
            // the top, and a POSITION with a gap up to far ahead. Each
            // would make Synapse's followers (and this one, before) drop
            // every later row of master's as stale.
            let forgeries = [
                format!("POSITION events master 20 {}", i64::MAX),
                format!(r#"RDATA events master {} ["forged"]"#, i64::MAX),
                "POSITION events master 35 1000000".to_string(),
            ];
            let mut impostor = RawRedis::connect(server.port(), None);
            let mut next = 21;
            for forged in &forgeries {
                impostor.queue_publish(PREFIX, forged.as_bytes());
                impostor.flush();
                let receivers = impostor.replies();
                assert!(
                    receivers.iter().all(|reply| reply.as_integer() == Some(2)),
                    "both subscribers heard {forged}: {receivers:?}"
                );
                // master writes on; every row reaches worker1, once, in
                // order (Logs checks each delivery).
                write_events(&mut writer, next, next + 9);
                next += 10;
                caught_up(&runtime, &mut writer, &mut worker, forged).await;
            }
            let follower = worker.client.follower();
            let last = Token(next as i64 - 1);
            assert_eq!(
                follower.resume_point(&StreamName::Events, &master()),
                Some(last),
                "what worker1 would persist is the last row it has"
            );
            assert!(worker.surprises.is_empty(), "{:?}", worker.surprises);
            let counters = follower.counters();
            // Checked as jumps: the far POSITION (fetched, not taken, as
            // Synapse's writers confirm any range: master's answer refutes
            // it at once) and the far RDATA.
            assert!(
                counters.claims_refuted >= 1 && counters.jumps_checked == 2,
                "{counters:?}"
            );
        })
    });
}

// --- 100k malformed messages ----------------------------------------------

/// Not commands, each a different way. Two of them have the shape of
/// master's own `POSITION` and `RDATA`: master takes them, undecoded, for
/// echoes it did not publish (another process using its name), worker1
/// finds them malformed.
const MALFORMED: &[&[u8]] = &[
    b"HELLO there",
    b"RDATA events master",
    b"POSITION events master x y",
    b"\xff\xfe\x00 binary",
    b"USER_SYNC",
    b"RDATA events master 0 {not json",
    b"rdata events master 1 []",
];

#[test]
fn a_hundred_thousand_malformed_messages_cost_bounded_warnings_and_memory() {
    const TOTAL: u64 = 100_000;
    const BATCH: u64 = 1000;
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let (warnings, _guard) = Warnings::install();
            let started = Instant::now();
            let server = RedisServer::start();
            let config = RedisConfig::tcp("127.0.0.1", server.port());
            let logs = Logs::default();
            let (mut writer, mut worker) =
                master_and_worker(&runtime, &config, &logs, &fast_options());
            both_ready_and_following(&runtime, &mut writer, &mut worker).await;

            // Another process floods the channel, never more than a few
            // batches ahead of worker1 (Redis would cut a subscriber that
            // falls 32 MB behind, and the messages would be lost).
            let seen = Arc::new(AtomicU64::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let port = server.port();
            let flood = {
                let seen = seen.clone();
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut raw = RawRedis::connect(port, None);
                    let mut sent = 0;
                    while sent < TOTAL {
                        if stop.load(Ordering::Relaxed) {
                            return sent;
                        }
                        if sent >= seen.load(Ordering::Relaxed) + 5 * BATCH {
                            std::thread::sleep(Duration::from_millis(1));
                            continue;
                        }
                        for _ in 0..BATCH {
                            let message = MALFORMED[(sent % MALFORMED.len() as u64) as usize];
                            raw.queue_publish(PREFIX, message);
                            sent += 1;
                        }
                        raw.flush();
                        raw.replies();
                    }
                    sent
                })
            };

            // Meanwhile the writer writes, and every row arrives.
            let mut written = 0;
            let mut samples = Vec::new();
            let mut give_up = runtime.sleep_until(runtime.now() + PATIENCE * 3);
            let mut tick = runtime.sleep_until(runtime.now());
            let result = poll_fn(|cx| {
                loop {
                    poll_nodes(&mut [&mut writer, &mut worker], cx);
                    let stats = worker.client.stats();
                    samples.push((
                        stats.counters.malformed,
                        stats.buffered_input,
                        stats.follower_buffered_bytes,
                    ));
                    seen.store(stats.counters.malformed, Ordering::Relaxed);
                    let master_counters = writer.client.session().counters();
                    if stats.counters.malformed >= TOTAL
                        && master_counters.malformed + master_counters.impostor_echoes >= TOTAL
                        && worker.caught_up(&StreamName::Events, &master())
                    {
                        return Poll::Ready(Ok(()));
                    }
                    if give_up.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Err(worker.summary()));
                    }
                    if written < 200 && tick.as_mut().poll(cx).is_ready() {
                        written += 1;
                        write_events(&mut writer, written, written);
                        tick = runtime.sleep_until(runtime.now() + Duration::from_millis(5));
                        continue;
                    }
                    return Poll::Pending;
                }
            })
            .await;
            stop.store(true, Ordering::Relaxed);
            let sent = flood.join().expect("the flood thread");
            if let Err(summary) = result {
                panic!(
                    "timed out: {} malformed of {sent}\n{summary}",
                    seen.load(Ordering::Relaxed)
                );
            }

            let counters = worker.client.session().counters().clone();
            assert_eq!(counters.malformed, TOTAL, "{counters:?}");
            assert_eq!(worker.malformed, TOTAL);
            assert!(worker.disconnects.is_empty(), "{:?}", worker.disconnects);
            assert!(worker.surprises.is_empty(), "{:?}", worker.surprises);
            assert_eq!(worker.rows, logs.written(&StreamName::Events, &master()));

            // Warnings: at most one per interval, the rest counted.
            let warned: Vec<String> = warnings
                .containing("not a command")
                .into_iter()
                .filter(|line| line.contains("instance=worker1"))
                .collect();
            let intervals =
                started.elapsed().as_secs() / RedisSession::WARNING_INTERVAL.as_secs() + 1;
            assert!(
                !warned.is_empty() && warned.len() as u64 <= intervals,
                "{} warnings in {:?}: {:?}",
                warned.len(),
                started.elapsed(),
                &warned[..warned.len().min(5)]
            );
            assert_eq!(
                counters.suppressed_warnings,
                TOTAL - warned.len() as u64,
                "{counters:?}"
            );
            // master heard the flood too: malformed messages and, in the
            // shape of its own commands, impostor echoes, each warned
            // about as rarely; nothing else was warned about.
            let named_master = (0..TOTAL)
                .filter(|n| {
                    let message = MALFORMED[(n % MALFORMED.len() as u64) as usize];
                    message.starts_with(b"POSITION events master ")
                        || message.starts_with(b"RDATA events master ")
                })
                .count() as u64;
            let master_counters = writer.client.session().counters();
            assert_eq!(master_counters.impostor_echoes, named_master);
            assert_eq!(master_counters.malformed, TOTAL - named_master);
            let all = warnings.lines();
            let for_master = |kind: &str| {
                all.iter()
                    .filter(|line| line.contains(kind) && line.contains("instance=master"))
                    .count() as u64
            };
            for kind in ["not a command", "another process publishes"] {
                let count = for_master(kind);
                assert!(count >= 1 && count <= intervals, "{kind}: {all:?}");
            }
            assert_eq!(
                all.len() as u64,
                warned.len() as u64 + for_master("not a command") + for_master("another process"),
                "other warnings: {all:?}"
            );

            // Memory: what the session holds undecoded and what the
            // follower holds stay small, in the first tenth of the flood as
            // in the last (no per-message growth: the flood is 3 MB).
            let max_over = |range: std::ops::Range<u64>| {
                samples
                    .iter()
                    .filter(|(count, _, _)| range.contains(count))
                    .fold((0, 0), |(input, held), (_, i, h)| {
                        (input.max(*i), held.max(*h))
                    })
            };
            let early = max_over(0..TOTAL / 10);
            let late = max_over(TOTAL * 9 / 10..TOTAL + 1);
            eprintln!("buffered (input, follower): first tenth {early:?}, last tenth {late:?}");
            for (input, held) in [early, late] {
                assert!(input <= 256 << 10, "{input} bytes undecoded");
                assert!(held <= 64 << 10, "{held} bytes held by the follower");
            }
            assert!(late.0 <= early.0.max(64 << 10), "{early:?} {late:?}");
            assert!(late.1 <= early.1.max(16 << 10), "{early:?} {late:?}");
        })
    });
}

// --- next_event dropped at every await point -------------------------------

#[test]
fn next_event_dropped_at_any_await_point_loses_no_row() {
    const TOKENS: u64 = 3000;
    on_both_runtimes(|runtime| {
        Box::pin(async move {
            let mut rng = Rng::from_env("next_event_dropped");
            let server = RedisServer::start();
            let config = RedisConfig::tcp("127.0.0.1", server.port());
            let logs = Logs::default();
            let (mut writer, mut worker) =
                master_and_worker(&runtime, &config, &logs, &fast_options());
            both_ready_and_following(&runtime, &mut writer, &mut worker).await;

            let give_up = runtime.now() + PATIENCE;
            let (mut written, mut dropped, mut completed) = (0, 0u64, 0u64);
            while written < TOKENS || !worker.caught_up(&StreamName::Events, &master()) {
                assert!(
                    runtime.now() < give_up,
                    "timed out: {written} tokens written, {dropped} futures dropped\n{}",
                    worker.summary()
                );
                if written < TOKENS && rng.one_in(3) {
                    // A batch or single rows, a few tokens at once.
                    let to = (written + 1 + rng.below(4)).min(TOKENS);
                    write_events(&mut writer, written + 1, to);
                    written = to;
                }
                // The follower's next_event, dropped after a few polls or
                // when a short timer fires, whichever comes first.
                let polls_allowed = 1 + rng.below(3);
                let mut timer =
                    runtime.sleep_until(runtime.now() + Duration::from_micros(rng.below(200)));
                let outcome = {
                    let mut next = std::pin::pin!(worker.client.next_event());
                    let mut polls = 0;
                    poll_fn(|cx| {
                        poll_nodes(&mut [&mut writer], cx);
                        polls += 1;
                        if let Poll::Ready(event) = next.as_mut().poll(cx) {
                            return Poll::Ready(Some(event));
                        }
                        if polls >= polls_allowed || timer.as_mut().poll(cx).is_ready() {
                            return Poll::Ready(None);
                        }
                        Poll::Pending
                    })
                    .await
                };
                match outcome {
                    Some(Some(event)) => {
                        completed += 1;
                        worker.record(event);
                    }
                    Some(None) => panic!("the client closed"),
                    None => dropped += 1,
                }
            }
            eprintln!("{completed} events, {dropped} next_event futures dropped");
            assert!(dropped > 100, "the futures were dropped: {dropped}");
            // Every row once, in order (checked as they came), and all of
            // them, live: nothing was lost and recovered by a catch-up.
            assert_eq!(worker.rows, logs.written(&StreamName::Events, &master()));
            assert!(worker.disconnects.is_empty(), "{:?}", worker.disconnects);
            assert_eq!(worker.malformed, 0);
            let counters = worker.client.follower().counters();
            assert_eq!(
                counters.catch_ups_requested, counters.unproven_checked,
                "{counters:?}"
            );
            assert!(counters.catch_ups_requested <= 1, "{counters:?}");
            assert!(
                !worker
                    .client
                    .session()
                    .counters()
                    .closes
                    .keys()
                    .any(|reason| *reason == "protocol"),
            );
        })
    });
}
