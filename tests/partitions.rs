//! Hostile neighbours of a real redis-server: a network partition both
//! ways (a proxy of the test's own that stops every byte while the sockets
//! stay open), one long enough for the keep-alive to notice and one that
//! heals first; Redis answering `-LOADING` while it loads its dataset after
//! a restart; and two deployments with one server name on one Redis.
//!
//! Each test starts its own redis-server (`common::redis_server`) and polls
//! every client in the test's one task (`common::nodes`); every row a
//! follower receives is checked on arrival against its writer's log (the
//! next one, once, in order). Nothing here measures time: deadlines only
//! stop a test that would otherwise hang, and the keep-alive is tuned so
//! that a partition is either far longer or far shorter than it.

#![cfg(all(unix, feature = "runtime-smol"))]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::faults::Warnings;
use common::nodes::{
    Logs, Node, Process, Rt, both_ready_and_following, caught_up, events_node, run_for, run_until,
    write_events,
};
use common::proxy::Proxy;
use common::redis_server::RedisServer;
use synapse_replication::config::{RedisConfig, StreamWriters};
use synapse_replication::resp::Frame;
use synapse_replication::session::{RedisError, RedisLink, RedisSession, RedisSessionConfig};
use synapse_replication::transport::{RedisClientConfig, SmolRuntime};
use synapse_replication::wire::{InstanceName, StreamName, Token};

/// Stops a test that would hang; never reached when things work.
const PATIENCE: Duration = Duration::from_secs(30);

fn runtime() -> Rt {
    Arc::new(SmolRuntime)
}

fn fast_options() -> RedisClientConfig {
    let mut options = RedisClientConfig::default();
    options.initial_backoff = Duration::from_millis(20);
    options.max_backoff = Duration::from_millis(500);
    options.catch_up_backoff = Duration::from_millis(20);
    options
}

fn master() -> InstanceName {
    InstanceName::master()
}

/// `master` writing `events` (announced at 0) and `worker1` following it
/// from the start, on Redis at `config`, with the session options `tune`
/// makes.
fn master_and_worker(
    config: &RedisConfig,
    logs: &Logs,
    tune: impl Fn(&mut RedisSessionConfig),
) -> (Node, Node) {
    (
        writer_node(config, logs, &tune),
        worker_node(config, logs, &tune),
    )
}

fn writer_node(config: &RedisConfig, logs: &Logs, tune: impl Fn(&mut RedisSessionConfig)) -> Node {
    events_node("master", &runtime(), config, logs, fast_options(), tune)
}

fn worker_node(config: &RedisConfig, logs: &Logs, tune: impl Fn(&mut RedisSessionConfig)) -> Node {
    events_node("worker1", &runtime(), config, logs, fast_options(), tune)
}

/// Token `n` of `events` on `writer`.
fn write_event(writer: &mut Node, n: u64) {
    write_events(writer, n, n);
}

/// Whether a disconnection's reason is the keep-alive's: the session gave
/// the link up for silence.
fn silent(reason: &str) -> bool {
    reason.starts_with("closed: no reply for")
}

/// Whether `node` gave its subscriber up for silence.
fn subscriber_timed_out(node: &Node) -> bool {
    node.disconnects
        .iter()
        .any(|(link, reason, _)| *link == RedisLink::Subscriber && silent(reason))
}

// --- A partition both ways, past the keep-alive ----------------------------

#[test]
fn a_partition_is_noticed_by_the_keep_alive_and_caught_up_once_it_heals() {
    smol::block_on(async {
        let runtime = runtime();
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        let config = RedisConfig::tcp("127.0.0.1", proxy.port());
        let logs = Logs::default();
        let (mut writer, mut worker) = master_and_worker(&config, &logs, |session| {
            session.ping_interval = Duration::from_millis(200);
            session.ping_timeout = Duration::from_secs(1);
        });
        both_ready_and_following(&runtime, &mut writer, &mut worker).await;
        write_events(&mut writer, 1, 20);
        caught_up(&runtime, &mut writer, &mut worker, "rows 1-20").await;
        let before = worker.received(&StreamName::Events, &master());
        let ready_before = worker.ready;

        // The network goes; the writer goes on writing, a token every
        // 10 ms, until the follower's keep-alive gives its subscription up.
        proxy.partition();
        let mut next = 21;
        let give_up = Instant::now() + PATIENCE;
        while !subscriber_timed_out(&worker) {
            assert!(
                Instant::now() < give_up,
                "the follower never noticed the partition\n{}",
                worker.summary()
            );
            run_for(
                &runtime,
                &mut [&mut writer, &mut worker],
                Duration::from_millis(10),
            )
            .await;
            write_event(&mut writer, next);
            next += 1;
        }
        // Still cut off: nothing crossed, and every connection the clients
        // lost they gave up themselves, for silence (no socket closed
        // under them).
        assert_eq!(worker.received(&StreamName::Events, &master()), before);
        for node in [&writer, &worker] {
            assert!(
                node.closing
                    .iter()
                    .all(|error| matches!(error, RedisError::Timeout(_))),
                "{}: {:?}",
                node.name,
                node.closing
            );
            assert!(
                node.disconnects.iter().all(|(_, reason, _)| silent(reason)),
                "{}: {:?}",
                node.name,
                node.disconnects
            );
        }
        let written_while_cut = next - 21;

        // Healed: both reconnect, and every row arrives, once, in order,
        // those written while cut off through a catch-up.
        proxy.heal();
        write_events(&mut writer, next, next + 19);
        run_until(
            &runtime,
            &mut [&mut writer, &mut worker],
            "ready again and every row",
            PATIENCE,
            |nodes| {
                nodes[1].ready > ready_before && nodes[1].caught_up(&StreamName::Events, &master())
            },
        )
        .await;
        eprintln!(
            "{written_while_cut} tokens written while cut off; worker1: {:?}; {} proxied connections",
            worker.client.follower().counters(),
            proxy.accepted()
        );
        assert_eq!(worker.rows, logs.written(&StreamName::Events, &master()));
        assert!(
            worker.client.follower().counters().catch_ups_requested > 0,
            "{:?}",
            worker.client.follower().counters()
        );
        assert!(worker.surprises.is_empty(), "{:?}", worker.surprises);
        assert_eq!(worker.malformed, 0);
        assert_eq!(worker.client.session().counters().impostor_echoes, 0);
    });
}

// --- A partition that heals before the keep-alive notices ------------------

#[test]
fn a_short_partition_heals_before_the_keep_alive_and_loses_nothing() {
    smol::block_on(async {
        let runtime = runtime();
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        let config = RedisConfig::tcp("127.0.0.1", proxy.port());
        let logs = Logs::default();
        // PINGs go out during the pause and stay unanswered; the deadline
        // is far beyond it.
        let (mut writer, mut worker) = master_and_worker(&config, &logs, |session| {
            session.ping_interval = Duration::from_millis(50);
            session.ping_timeout = Duration::from_secs(10);
        });
        both_ready_and_following(&runtime, &mut writer, &mut worker).await;
        write_events(&mut writer, 1, 20);
        caught_up(&runtime, &mut writer, &mut worker, "rows 1-20").await;
        let before = worker.received(&StreamName::Events, &master());
        let counters = worker.client.follower().counters().clone();

        // 300 ms without a network, the writer writing all along.
        proxy.partition();
        let mut next = 21;
        for _ in 0..30 {
            run_for(
                &runtime,
                &mut [&mut writer, &mut worker],
                Duration::from_millis(10),
            )
            .await;
            write_event(&mut writer, next);
            next += 1;
        }
        assert_eq!(
            worker.received(&StreamName::Events, &master()),
            before,
            "nothing crossed the partition"
        );

        // Healed: what was held arrives, live, and what follows too.
        proxy.heal();
        write_events(&mut writer, next, next + 19);
        caught_up(&runtime, &mut writer, &mut worker, "every row").await;
        assert_eq!(worker.rows, logs.written(&StreamName::Events, &master()));
        for node in [&writer, &worker] {
            assert!(
                node.disconnects.is_empty(),
                "{}: {:?}",
                node.name,
                node.disconnects
            );
            assert!(node.closing.is_empty(), "{}: {:?}", node.name, node.closing);
            assert_eq!(node.ready, 1, "{}", node.name);
        }
        // Nothing to catch up: every row came live. (A catch-up may check
        // master's first move after a REPLICATE, as the follower does
        // after any; that is no gap.)
        let now = worker.client.follower().counters();
        assert_eq!(
            now.catch_ups_requested - counters.catch_ups_requested,
            now.unproven_checked - counters.unproven_checked,
            "{counters:?}\n{now:?}"
        );
        assert!(
            now.catch_ups_requested - counters.catch_ups_requested <= 1,
            "{now:?}"
        );
        assert!(worker.surprises.is_empty(), "{:?}", worker.surprises);
        assert_eq!(proxy.accepted(), 4, "no connection but the first ones");
    });
}

// --- Redis loading its dataset after a restart -----------------------------

/// `rejected_calls` of `command` in `INFO commandstats` (0 if absent).
fn rejected_calls(server: &RedisServer, command: &str) -> u64 {
    let info = server.command(&["INFO", "commandstats"]);
    let text = String::from_utf8_lossy(info.as_bytes().map_or(&[][..], |b| &b[..])).into_owned();
    let prefix = format!("cmdstat_{command}:");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|stats| {
            stats
                .split(',')
                .find_map(|field| field.strip_prefix("rejected_calls="))
        })
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn redis_loading_its_dataset_after_a_restart_is_waited_out_and_loses_nothing() {
    smol::block_on(async {
        let runtime = runtime();
        // A dataset that takes as long to load as the test wants: 1 ms per
        // key (Redis' `key-load-delay`, for tests), handling clients every
        // KiB read, until the test sets the delay to 0.
        let mut server = RedisServer::options()
            .args(&[
                "--enable-debug-command",
                "local",
                "--key-load-delay",
                "1000",
                "--loading-process-events-interval-bytes",
                "1024",
            ])
            .start();
        let ok = Frame::SimpleString("OK".into());
        assert_eq!(
            server.command(&["DEBUG", "POPULATE", "50000", "filler", "64"]),
            ok
        );
        assert_eq!(server.command(&["SAVE"]), ok);
        let config = RedisConfig::tcp("127.0.0.1", server.port());
        let logs = Logs::default();
        // worker1 on one RESP3 connection (`HELLO 3` while loading), master
        // on two RESP2 ones.
        let tune = |session: &mut RedisSessionConfig| {
            session.ping_interval = Duration::from_millis(100);
            session.ping_timeout = Duration::from_secs(5);
        };
        let mut writer = writer_node(&config, &logs, tune);
        let mut worker = worker_node(&config, &logs, |session| {
            tune(session);
            session.single_connection = true;
        });
        both_ready_and_following(&runtime, &mut writer, &mut worker).await;
        write_events(&mut writer, 1, 20);
        caught_up(&runtime, &mut writer, &mut worker, "rows 1-20").await;
        let connected_before = (writer.connected, worker.connected);
        let ready_before = (writer.ready, worker.ready);

        // Restarted: it answers, and loads for as long as the delay holds.
        server.restart();
        assert!(server.is_loading(), "Redis loads its dataset");
        assert_eq!(server.command(&["CONFIG", "RESETSTAT"]), ok);

        // While it loads, the clients come back (once per link), every
        // PING refused with -LOADING, and rows flow: those written during
        // the restart through a catch-up, the next ones live.
        write_events(&mut writer, 21, 40);
        run_until(
            &runtime,
            &mut [&mut writer, &mut worker],
            "ready again while Redis loads",
            PATIENCE,
            |nodes| nodes[0].ready > ready_before.0 && nodes[1].ready > ready_before.1,
        )
        .await;
        write_events(&mut writer, 41, 60);
        caught_up(
            &runtime,
            &mut writer,
            &mut worker,
            "rows 1-60 while loading",
        )
        .await;
        // A few keep-alive rounds while loading.
        run_for(
            &runtime,
            &mut [&mut writer, &mut worker],
            Duration::from_millis(500),
        )
        .await;
        assert!(
            server.is_loading(),
            "still loading: the test proves nothing"
        );
        let refused = rejected_calls(&server, "ping");
        assert!(refused >= 2, "PINGs refused while loading: {refused}");

        // Loaded: nothing changes for the clients.
        assert_eq!(
            server.command(&["CONFIG", "SET", "key-load-delay", "0"]),
            ok
        );
        let give_up = Instant::now() + PATIENCE;
        while server.is_loading() {
            assert!(Instant::now() < give_up, "Redis never finished loading");
            run_for(
                &runtime,
                &mut [&mut writer, &mut worker],
                Duration::from_millis(20),
            )
            .await;
        }
        write_events(&mut writer, 61, 80);
        caught_up(&runtime, &mut writer, &mut worker, "every row").await;

        // Each link was lost once, to the restart, and came back once: no
        // link given up (a refusal is no fatal error), no reconnect loop.
        for (node, connected, ready, links) in [
            (&writer, connected_before.0, ready_before.0, 2),
            (&worker, connected_before.1, ready_before.1, 1),
        ] {
            assert!(node.closing.is_empty(), "{}: {:?}", node.name, node.closing);
            assert_eq!(
                node.disconnects.len(),
                links,
                "{}: {:?}",
                node.name,
                node.disconnects
            );
            assert_eq!(node.connected, connected + links, "{}", node.name);
            assert_eq!(node.ready, ready + 1, "{}", node.name);
        }
        assert_eq!(worker.rows, logs.written(&StreamName::Events, &master()));
        assert!(worker.surprises.is_empty(), "{:?}", worker.surprises);
        assert_eq!(server.command(&["DBSIZE"]), Frame::Integer(50_000));
    });
}

// --- Two deployments with one server name on one Redis --------------------

#[test]
fn two_deployments_on_one_redis_are_warned_about_and_never_mixed() {
    smol::block_on(async {
        let (warnings, _guard) = Warnings::install();
        let started = Instant::now();
        let runtime = runtime();
        let server = RedisServer::start();
        // Both on one Redis, one server name; B even selects another
        // database, which pub/sub ignores.
        let config_a = RedisConfig::tcp("127.0.0.1", server.port());
        let config_b = RedisConfig::tcp("127.0.0.1", server.port()).with_database(1);

        // Deployment A: Synapse's defaults, master writes events.
        let logs_a = Logs::default();
        let (mut a_master, mut a_worker) = master_and_worker(&config_a, &logs_a, |_| {});

        // Deployment B: event_writer writes events, and B's main process,
        // named master like A's, follows them.
        let registry_b = Arc::new(
            StreamWriters::from_json(
                r#"{"stream_writers": {"events": ["event_writer"]},
                    "instance_map": {"event_writer": {"host": "127.0.0.1", "port": 9}}}"#,
            )
            .expect("B's stream_writers")
            .with_redis(true),
        );
        let logs_b = Logs::default();
        let node_b = |name: &'static str| {
            Node::with_registry(
                name,
                runtime.clone(),
                config_b.clone(),
                &logs_b,
                fast_options(),
                registry_b.clone(),
                |_| {},
            )
        };
        let mut b_writer = node_b("event_writer");
        b_writer
            .client
            .advance(&StreamName::Events, Token(0))
            .expect("event_writer writes events in B");
        let mut b_master = node_b("master");
        b_master.follow_from_start(&StreamName::Events, &InstanceName::from("event_writer"));

        let event_writer = InstanceName::from("event_writer");
        let mut nodes = [&mut a_master, &mut a_worker, &mut b_writer, &mut b_master];
        run_until(
            &runtime,
            &mut nodes,
            "everyone ready, each writer followed",
            PATIENCE,
            |nodes| {
                nodes.iter().all(|node| node.ready > 0)
                    && nodes[1]
                        .client
                        .follower()
                        .is_writer_connected(&StreamName::Events, &master())
                    && nodes[3]
                        .client
                        .follower()
                        .is_writer_connected(&StreamName::Events, &event_writer)
            },
        )
        .await;

        // Both write events, at the same tokens.
        for n in 1..=30 {
            write_event(nodes[0], n);
            write_event(nodes[2], n);
        }
        run_until(
            &runtime,
            &mut nodes,
            "each deployment's rows",
            PATIENCE,
            |nodes| {
                nodes[1].caught_up(&StreamName::Events, &master())
                    && nodes[3].caught_up(&StreamName::Events, &event_writer)
                    && nodes[3].client.session().counters().impostor_echoes > 0
            },
        )
        .await;

        // Each follower got its own deployment's rows, every one once, in
        // order, and no other (a row of an instance its writers' log does
        // not know fails the test on arrival). A's processes rejected
        // event_writer's commands; B's master took A's master's for echoes
        // of its own, and ignored them.
        assert_eq!(
            a_worker.rows,
            logs_a.written(&StreamName::Events, &master())
        );
        assert_eq!(
            b_master.rows,
            logs_b.written(&StreamName::Events, &event_writer)
        );
        for node in [&a_master, &a_worker, &b_writer, &b_master] {
            assert!(
                node.surprises.is_empty(),
                "{}: {:?}",
                node.name,
                node.surprises
            );
        }
        for node in [&a_master, &a_worker] {
            let rejected = node.client.follower().counters().rejected;
            assert!(
                rejected > 0,
                "{}: the other deployment's commands",
                node.name
            );
        }
        assert_eq!(b_master.client.follower().counters().rejected, 0);

        // Warned about: the other deployment's writer, and, for B's master,
        // A's master publishing under its name.
        let neighbour = warnings.containing("a second deployment with the same server name");
        let intervals = started.elapsed().as_secs() / RedisSession::WARNING_INTERVAL.as_secs() + 1;
        for (instance, sender) in [("worker1", "event_writer"), ("master", "event_writer")] {
            let warned: Vec<&String> = neighbour
                .iter()
                .filter(|line| {
                    line.contains("not list as a writer")
                        && line.contains(&format!("instance={instance} "))
                })
                .collect();
            assert!(
                !warned.is_empty() && warned.len() as u64 <= intervals,
                "{instance}: {neighbour:#?}"
            );
            assert!(
                warned[0].contains(&format!("sender={sender} ")),
                "{warned:?}"
            );
        }
        assert!(
            neighbour.iter().any(|line| {
                line.contains("another process publishes under this process's instance name")
                    && line.contains("instance=master ")
            }),
            "{neighbour:#?}"
        );
    });
}
