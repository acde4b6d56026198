//! The crate's `ReplicationClient` calling a real Synapse 1.163.2's
//! replication HTTP API, as Synapse's own workers call their main
//! process: a call that caches is handled once per txn id on Synapse's
//! side too, and a call returns only once this process's follower has
//! seen the rows the answer's positions name.
//!
//! Needs the Synapse venv (`SYNAPSE_PYTHON`, see tests/common/synapse.rs)
//! and redis-server.

#![cfg(all(unix, feature = "http-catch-up", feature = "runtime-smol"))]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::synapse::SynapseRig;
use serde_json::{Value, json};
use synapse_replication::config::SynapseConfig;
use synapse_replication::http::{Method, ReplicationEndpoint};
use synapse_replication::positions::FollowerEvent;
use synapse_replication::session::RedisEvent;
use synapse_replication::transport::{CallFailure, RedisClient, ReplicationClient, SmolRuntime};
use synapse_replication::wire::{InstanceName, StreamName, Token};

/// The deployment as a Rust process `rust1` of `rig` reads it.
fn deployment(rig: &SynapseRig) -> SynapseConfig {
    SynapseConfig::from_value(json!({
        "server_name": rig.server_name,
        "redis": {"enabled": true, "host": "127.0.0.1", "port": rig.redis_port},
        "worker_replication_secret": rig.secret,
        "instance_map": {"main": {"host": "127.0.0.1", "port": rig.replication_port}},
    }))
    .expect("config")
}

/// `register_user`'s body, as a worker's registration handler sends it.
fn registration() -> Value {
    json!({
        "password_hash": null,
        "was_guest": false,
        "make_guest": false,
        "appservice_id": null,
        "create_profile_with_displayname": "Bob",
        "admin": false,
        "user_type": null,
        "address": "127.0.0.1",
        "shadow_banned": false,
        "approved": true,
    })
}

#[test]
fn synapse_handles_a_cached_call_once_per_txn_id() {
    let rig = SynapseRig::start();
    let user = rig.user_id("bob");
    let endpoint = ReplicationEndpoint::new(Method::Post, "register_user", &["user_id"]);
    let url = |txn: &str| {
        format!(
            "{}{}",
            rig.replication_url,
            endpoint.path(&[&user], Some(txn))
        )
    };
    let body = registration();

    // The first call registers bob.
    let (status, first) = rig.request_url("POST", &url("txnA"), Some(&rig.secret), Some(&body));
    assert_eq!(status, 200, "{first}");
    // The same txn id again (Synapse's retry after a timeout): answered
    // from Synapse's cache, the same answer, bob not registered twice.
    let (status, again) = rig.request_url("POST", &url("txnA"), Some(&rig.secret), Some(&body));
    assert_eq!((status, &again), (200, &first));
    // A fresh txn id is handled: bob exists, so Synapse refuses it.
    let (status, fresh) = rig.request_url("POST", &url("txnB"), Some(&rig.secret), Some(&body));
    assert_eq!(status, 400, "{fresh}");
    assert_eq!(fresh["errcode"], "M_USER_IN_USE", "{fresh}");

    // The crate's client: a fresh txn id per call, so a second
    // registration of the same user is handled, and refused.
    let synapse = deployment(&rig);
    let client = ReplicationClient::from_synapse(SmolRuntime, &synapse, "rust1");
    let call = |localpart: &str| {
        let user = rig.user_id(localpart);
        smol::block_on(client.call(
            &InstanceName::master(),
            &endpoint,
            &[&user],
            registration().as_object().cloned().unwrap_or_default(),
        ))
    };
    let answer = call("carol").expect("carol registered");
    assert!(
        !answer.positions.is_empty(),
        "main's answer carries the positions of the streams it writes"
    );
    let error = call("carol").expect_err("carol exists");
    match &error.failure {
        CallFailure::Remote(remote) => {
            assert_eq!(
                (remote.status, remote.errcode.as_str()),
                (400, "M_USER_IN_USE")
            );
        }
        other => panic!("{other}"),
    }
    assert!(
        error
            .to_string()
            .starts_with("replication call register_user on master: 400"),
        "{error}"
    );
}

#[test]
fn presence_set_state_returns_once_this_process_applied_the_presence_row() {
    let rig = SynapseRig::start();
    let alice_token = rig.register("alice", "alice-password");
    let alice = rig.user_id("alice");
    let synapse = deployment(&rig);

    // This process follows the deployment; the application records the
    // presence rows it has applied.
    let mut follower = RedisClient::follow(SmolRuntime, &synapse, "rust1").expect("a client");
    let waiter = follower.waiter();
    let rows: Arc<Mutex<Vec<(Token, String)>>> = Arc::default();
    let following = Arc::new(Mutex::new(false));
    {
        let (rows, following) = (Arc::clone(&rows), Arc::clone(&following));
        std::thread::spawn(move || {
            smol::block_on(async move {
                while let Some(event) = follower.next_event().await {
                    match event {
                        RedisEvent::Follower(FollowerEvent::Rows {
                            stream: StreamName::Presence,
                            token,
                            rows: taken,
                            ..
                        }) => {
                            // An application that takes its time to apply
                            // a row: the call must wait for it, not only
                            // for the row's arrival.
                            smol::Timer::after(Duration::from_millis(300)).await;
                            rows.lock()
                                .unwrap()
                                .extend(taken.iter().map(|row| (token, row.as_str().to_owned())));
                        }
                        RedisEvent::Follower(
                            FollowerEvent::Started {
                                stream: StreamName::Presence,
                                ..
                            }
                            | FollowerEvent::Position {
                                stream: StreamName::Presence,
                                ..
                            },
                        ) => *following.lock().unwrap() = true,
                        _ => {}
                    }
                }
            })
        });
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !*following.lock().unwrap() {
        assert!(Instant::now() < deadline, "never followed presence");
        std::thread::sleep(Duration::from_millis(20));
    }

    // The call, as a worker's presence handler makes it on the presence
    // writer (main here).
    let client =
        ReplicationClient::from_synapse(SmolRuntime, &synapse, "rust1").with_waiter(waiter);
    let content = json!({
        "device_id": null,
        "state": {"presence": "online", "status_msg": "set from Rust"},
        "force_notify": false,
        "is_sync": false,
    });
    let started = Instant::now();
    let answer = smol::block_on(client.call(
        &InstanceName::master(),
        &ReplicationEndpoint::presence_set_state(),
        &[&alice],
        content.as_object().cloned().unwrap_or_default(),
    ))
    .expect("presence set");
    let took = started.elapsed();
    // At return, the row main wrote is applied here: nothing to poll for.
    let applied = rows.lock().unwrap().clone();
    let row = applied
        .iter()
        .find(|(_, row)| row.contains(&alice) && row.contains("set from Rust"))
        .unwrap_or_else(|| panic!("the presence row is not applied at return: {applied:?}"));
    assert!(answer.seen, "the wait for main's positions gave up");
    let presence = answer
        .positions
        .iter()
        .find(|(stream, _)| *stream == StreamName::Presence)
        .map(|(_, token)| *token)
        .expect("main writes presence");
    assert!(row.0 <= presence, "row {row:?}, main at {presence}");
    eprintln!("presence_set_state answered and applied in {took:?}, row {row:?}");
    // And Synapse shows it.
    let shown = rig.get_presence(&alice_token, &alice);
    assert_eq!(shown["status_msg"], "set from Rust", "{shown}");
}

#[test]
fn a_get_call_sends_its_content_as_the_query() {
    let rig = SynapseRig::start();
    let token = rig.register("alice", "alice-password");
    rig.create_room(&token);
    let synapse = deployment(&rig);
    let client = ReplicationClient::from_synapse(SmolRuntime, &synapse, "rust1");
    // Synapse's only GET endpoint: catch-up, with its arguments in the
    // query, as Synapse's own client sends them.
    let endpoint =
        ReplicationEndpoint::new(Method::Get, "get_repl_stream_updates", &["stream_name"]);
    let query = json!({"from_token": 0, "upto_token": 3});
    let answer = smol::block_on(client.call(
        &InstanceName::master(),
        &endpoint,
        &["events"],
        query.as_object().cloned().unwrap_or_default(),
    ))
    .expect("a page");
    assert_eq!(answer.content["upto_token"], 3, "{:?}", answer.content);
    let updates = answer.content["updates"].as_array().expect("updates");
    assert!(
        !updates.is_empty(),
        "the room's first events: {:?}",
        answer.content
    );
    assert!(
        updates
            .iter()
            .all(|update| update[0].as_i64().is_some_and(|t| (1..=3).contains(&t)))
    );
    // Without the query, Synapse says which argument is missing.
    let error = smol::block_on(client.call(
        &InstanceName::master(),
        &endpoint,
        &["events"],
        serde_json::Map::new(),
    ))
    .expect_err("no from_token");
    assert!(
        matches!(&error.failure, CallFailure::Remote(remote) if remote.status == 400 && remote.errcode == "M_MISSING_PARAM"),
        "{error}"
    );
}
