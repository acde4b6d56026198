//! The account-data writer on a real PostgreSQL (feature `postgres`),
//! checked against Synapse 1.163.2's own code: the server on
//! 127.0.0.1:5432 (trust authentication, user `postgres`), and the Synapse
//! venv's Python (`tests/synapse/account_data_store.py` runs Synapse's
//! `AccountDataWorkerStore`, `TagsWorkerStore`, its `MultiWriterIdGenerator`
//! and `AccountDataStream`'s update function on a database of the test's).
//!
//! Each test creates databases of its own (`synrep_acct_<pid>_<n>`), with
//! the tables, indexes and sequences of Synapse's own full schema (read
//! from the venv, not written here), and drops them at the end, also when
//! it fails. No other database is touched.
#![cfg(feature = "postgres")]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};
use synapse_replication::http::{AccountDataRequest, page_body};
use synapse_replication::positions::{CatchUpId, CatchUpRequest};
use synapse_replication::transport::CatchUpSource;
use synapse_replication::transport::postgres::{
    AccountDataCatchUp, AccountDataStore, CacheInvalidations,
};
use synapse_replication::wire::{InstanceName, RawRow, StreamName, Token};
use tokio_postgres::Client;

use common::synapse::run_script;

#[path = "common/postgres.rs"]
mod postgres;
use postgres::TestDb;

#[path = "common/kill_points.rs"]
mod kill_points;
use kill_points::{Gate, Gated};

/// One timestamp for every cache invalidation (Synapse's clock is a
/// stand-in that answers it).
const TS: i64 = 1_700_000_000_123;

fn at_ts() -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(TS as u64)
}

/// The writer's name, the same in both databases.
const WRITER: &str = "rust_account_data";

/// The statements of Synapse's full schema for the writer's tables.
fn synapse_schema() -> String {
    let out = run_script("account_data_store.py", &["schema"], "");
    let statements: Vec<String> = out
        .lines()
        .map(|line| serde_json::from_str(line).expect("a statement"))
        .collect();
    for table in [
        "account_data",
        "room_account_data",
        "room_tags",
        "room_tags_revisions",
        "ignored_users",
        "stream_positions",
    ] {
        assert!(
            statements
                .iter()
                .any(|s| s.starts_with(&format!("CREATE TABLE {table} ("))),
            "{table}: {statements:?}"
        );
    }
    statements.join("\n")
}

/// Synapse's own code runs `ops` on the database as `WRITER` (see
/// account_data_store.py).
fn synapse_runs(dbname: &str, ops: &[Value]) -> Vec<Value> {
    let out = run_script(
        "account_data_store.py",
        &["run", dbname, WRITER, &TS.to_string()],
        &Value::Array(ops.to_vec()).to_string(),
    );
    serde_json::from_str(&out).expect("account_data_store.py's answer")
}

fn object(value: Value) -> Map<String, Value> {
    value.as_object().cloned().expect("an object")
}

/// A change as the crate's call and as the script's op.
fn change(op: Value) -> (AccountDataRequest, Value) {
    let text = |key: &str| op[key].as_str().expect(key).to_owned();
    let request = match op["op"].as_str().expect("op") {
        "add_user" => AccountDataRequest::AddUserAccountData {
            user_id: text("user_id"),
            account_data_type: text("type"),
            content: object(op["content"].clone()),
        },
        "remove_user" => AccountDataRequest::RemoveUserAccountData {
            user_id: text("user_id"),
            account_data_type: text("type"),
        },
        "add_room" => AccountDataRequest::AddRoomAccountData {
            user_id: text("user_id"),
            room_id: text("room_id"),
            account_data_type: text("type"),
            content: object(op["content"].clone()),
        },
        "remove_room" => AccountDataRequest::RemoveRoomAccountData {
            user_id: text("user_id"),
            room_id: text("room_id"),
            account_data_type: text("type"),
        },
        "add_tag" => AccountDataRequest::AddTag {
            user_id: text("user_id"),
            room_id: text("room_id"),
            tag: text("tag"),
            content: object(op["content"].clone()),
        },
        "remove_tag" => AccountDataRequest::RemoveTag {
            user_id: text("user_id"),
            room_id: text("room_id"),
            tag: text("tag"),
        },
        other => panic!("unknown op {other}"),
    };
    (request, op)
}

/// What was handed to the publisher.
type Published = Arc<Mutex<Vec<(StreamName, Token, Vec<(Token, RawRow)>)>>>;

/// The Rust writer on `db`, as `WRITER`, the only writer.
async fn rust_writer(db: &TestDb) -> (AccountDataStore<Client>, Published) {
    let me = InstanceName::from(WRITER);
    let caches = Arc::new(
        CacheInvalidations::load(db.client().await, me.clone())
            .await
            .expect("caches"),
    );
    let published: Published = Arc::default();
    let sink = published.clone();
    let store = AccountDataStore::load(db.client().await, caches, me.clone(), [me])
        .await
        .expect("load")
        .with_clock(at_ts)
        .with_publisher(move |stream, position, rows| {
            sink.lock().unwrap().push((stream.clone(), position, rows));
        });
    (store, published)
}

/// Every row of `table`, as JSON text, in one order.
async fn rows(client: &Client, table: &str, without: &[&str]) -> Vec<String> {
    let mut drop = String::new();
    for column in without {
        drop.push_str(&format!(" - '{column}'"));
    }
    client
        .query(
            &format!("SELECT (to_jsonb(t){drop})::text FROM {table} t ORDER BY 1"),
            &[],
        )
        .await
        .expect("read the table")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// The changes compared: each of the six, on items that exist and do
/// not, `m.ignored_user_list` set, changed, set again unchanged, made not
/// an object, refused (ignoring oneself) and removed, content with
/// non-ASCII text, floats and keys out of order.
fn changes() -> Vec<Value> {
    let alice = "@alice:example.com";
    let room = "!room:example.com";
    vec![
        json!({"op": "add_user", "user_id": alice, "type": "org.example.x",
               "content": {"z": 1, "a": [0.5, 1e-7, 12345678901234567890u64], "é": "\u{1F600}"}}),
        json!({"op": "add_user", "user_id": alice, "type": "m.ignored_user_list",
               "content": {"ignored_users": {"@spam:example.com": {}, "@eve:example.com": {}}}}),
        json!({"op": "add_user", "user_id": alice, "type": "m.ignored_user_list",
               "content": {"ignored_users": {"@spam:example.com": {}, "@mallory:example.com": {}}}}),
        json!({"op": "add_user", "user_id": alice, "type": "m.ignored_user_list",
               "content": {"ignored_users": {"@mallory:example.com": {}, "@spam:example.com": {}},
                           "other": true}}),
        json!({"op": "add_user", "user_id": alice, "type": "m.ignored_user_list",
               "content": {"ignored_users": {"@spam:example.com": {}, alice: {}}}}),
        json!({"op": "add_user", "user_id": "@bob:example.com", "type": "m.ignored_user_list",
               "content": {"ignored_users": {"@spam:example.com": {}}}}),
        json!({"op": "add_user", "user_id": "@bob:example.com", "type": "m.ignored_user_list",
               "content": {"ignored_users": ["@spam:example.com"]}}),
        json!({"op": "add_room", "user_id": alice, "room_id": room, "type": "org.example.r",
               "content": {"b": null, "a": {"deep": [1, 2]}}}),
        json!({"op": "add_room", "user_id": alice, "room_id": room, "type": "org.example.r",
               "content": {"again": 1}}),
        json!({"op": "remove_room", "user_id": alice, "room_id": room, "type": "org.example.r"}),
        json!({"op": "remove_room", "user_id": alice, "room_id": room, "type": "org.example.r"}),
        json!({"op": "remove_room", "user_id": alice, "room_id": room, "type": "org.none"}),
        json!({"op": "add_tag", "user_id": alice, "room_id": room, "tag": "u.work",
               "content": {"order": 0.25}}),
        json!({"op": "add_tag", "user_id": alice, "room_id": room, "tag": "m.favourite",
               "content": {}}),
        json!({"op": "add_tag", "user_id": alice, "room_id": "!other:example.com",
               "tag": "u.work", "content": {"order": 1}}),
        json!({"op": "remove_tag", "user_id": alice, "room_id": room, "tag": "u.work"}),
        json!({"op": "remove_tag", "user_id": alice, "room_id": "!never:example.com",
               "tag": "u.none"}),
        json!({"op": "remove_user", "user_id": alice, "type": "m.ignored_user_list"}),
        json!({"op": "remove_user", "user_id": alice, "type": "m.ignored_user_list"}),
        json!({"op": "remove_user", "user_id": alice, "type": "org.example.x"}),
        json!({"op": "remove_user", "user_id": "@carol:example.com", "type": "org.none"}),
        json!({"op": "add_user", "user_id": alice, "type": "m.ignored_user_list",
               "content": {"ignored_users": {}}}),
        json!({"op": "remove_user", "user_id": alice, "type": "m.ignored_user_list"}),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_writes_what_synapse_s_writer_writes() {
    let schema = synapse_schema();
    let ours = TestDb::create("synrep_acct", &schema).await;
    let theirs = TestDb::create("synrep_acct", &schema).await;
    let (store, published) = rust_writer(&ours).await;
    let mut client = ours.client().await;

    let (requests, ops): (Vec<_>, Vec<_>) = changes().into_iter().map(change).unzip();
    let mut answers = Vec::new();
    for request in &requests {
        answers.push(match store.apply(&mut client, request).await {
            Ok(max_stream_id) => json!({"max_stream_id": max_stream_id.0}),
            Err(error) => match error.to_replication_error() {
                synapse_replication::http::ReplicationError::Refused {
                    status,
                    errcode,
                    message,
                } => json!({"error": [status, errcode, message]}),
                other => panic!("{other:?}"),
            },
        });
    }
    let expected = synapse_runs(&theirs.name, &ops);
    // The answers: max_stream_id after each, the refusal of ignoring
    // oneself.
    assert_eq!(answers, expected);
    assert!(
        answers
            .iter()
            .any(|answer| answer["error"][2] == "You cannot ignore yourself"),
        "{answers:?}"
    );

    // The tables, column for column, ids and all.
    let (a, b) = (ours.client().await, theirs.client().await);
    for table in [
        "account_data",
        "room_account_data",
        "room_tags",
        "room_tags_revisions",
        "ignored_users",
        "stream_positions",
    ] {
        let (ours, theirs) = (rows(&a, table, &[]).await, rows(&b, table, &[]).await);
        assert_eq!(ours, theirs, "{table}");
        assert!(!ours.is_empty() || table == "ignored_users", "{table}");
    }
    let bob: Vec<String> = rows(&a, "ignored_users", &[]).await;
    assert!(bob.iter().all(|row| !row.contains("@alice")), "{bob:?}");
    // Cache invalidations: the same rows, and the same ids as a set (the
    // `ignored_by` keys of one change pair with them in a Python set's
    // order in Synapse's, sorted here).
    let ours_caches = rows(&a, "cache_invalidation_stream_by_instance", &["stream_id"]).await;
    assert_eq!(
        ours_caches,
        rows(&b, "cache_invalidation_stream_by_instance", &["stream_id"]).await
    );
    assert!(ours_caches.len() >= 10, "{ours_caches:?}");
    let ids = |rows: Vec<tokio_postgres::Row>| rows.iter().map(|r| r.get(0)).collect::<Vec<i64>>();
    assert_eq!(
        ids(a.query(ids_sql(), &[]).await.expect("ids")),
        ids(b.query(ids_sql(), &[]).await.expect("ids"))
    );
    // Both sequences stand where they were left.
    for sequence in ["account_data_sequence", "cache_invalidation_stream_seq"] {
        let sql = format!("SELECT last_value FROM {sequence}");
        let (x, y): (i64, i64) = (
            a.query_one(&sql, &[]).await.expect("seq").get(0),
            b.query_one(&sql, &[]).await.expect("seq").get(0),
        );
        assert_eq!(x, y, "{sequence}");
    }

    // What was published: account_data rows in token order, each the
    // stream's row for its change, and the caches rows of the table.
    let published = published.lock().unwrap().clone();
    let mut last = Token(0);
    let mut account_rows = Vec::new();
    let mut caches_rows = 0;
    for (stream, position, rows) in &published {
        for (token, _) in rows {
            assert!(token <= position);
        }
        match stream {
            StreamName::AccountData => {
                assert!(*position >= last);
                last = *position;
                account_rows.extend(rows.iter().map(|(t, r)| (t.0, r.as_str().to_owned())));
            }
            StreamName::Caches => caches_rows += rows.len(),
            other => panic!("{other}"),
        }
    }
    assert_eq!(caches_rows, ours_caches.len());
    assert!(
        account_rows.contains(&(
            3,
            r#"["@alice:example.com",null,"m.ignored_user_list"]"#.to_owned()
        )),
        "{account_rows:?}"
    );
    assert!(
        account_rows
            .iter()
            .any(|(_, row)| row == r#"["@alice:example.com","!room:example.com","m.tag"]"#),
        "{account_rows:?}"
    );
    assert!(account_rows.windows(2).all(|pair| pair[0].0 < pair[1].0));
}

fn ids_sql() -> &'static str {
    "SELECT stream_id FROM cache_invalidation_stream_by_instance ORDER BY 1"
}

fn request(from: i64, to: i64) -> CatchUpRequest {
    CatchUpRequest {
        id: CatchUpId::new(1),
        stream: StreamName::AccountData,
        writer: InstanceName::from(WRITER),
        from: Token(from),
        to: Token(to),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_pages_are_the_pages_synapse_s_update_function_gives() {
    let db = TestDb::create("synrep_acct", &synapse_schema()).await;
    let (store, _) = rust_writer(&db).await;
    let mut client = db.client().await;
    // More than a page in each table, interleaved, with keys written
    // again (their rows move up) and removals.
    let mut ops = Vec::new();
    for n in 0..130 {
        let user = format!("@u{}:example.com", n % 40);
        let room = format!("!r{}:example.com", n % 7);
        ops.push(
            json!({"op": "add_user", "user_id": user, "type": format!("t{}", n % 50),
                        "content": {"n": n}}),
        );
        ops.push(json!({"op": "add_room", "user_id": user, "room_id": room,
                        "type": format!("t{}", n % 45), "content": {"n": n}}));
        if n % 3 == 0 {
            ops.push(
                json!({"op": "remove_room", "user_id": user, "room_id": room,
                            "type": format!("t{}", n % 45)}),
            );
        }
        ops.push(
            json!({"op": "add_tag", "user_id": format!("@t{n}:example.com"),
                        "room_id": room, "tag": "u.x", "content": {}}),
        );
    }
    for op in ops {
        let (request, _) = change(op);
        store.apply(&mut client, &request).await.expect("write");
    }
    let last = store.max_stream_id().0;
    assert!(last > 400, "{last}");

    let source: Arc<dyn CatchUpSource> = Arc::new(AccountDataCatchUp::new(db.client().await));
    let mut requests = vec![
        request(0, last),
        request(0, 150),
        request(100, 110),
        request(last - 30, last),
        request(last, last + 5),
        request(last, 3),
        request(7, 7),
        request(0, 2),
    ];
    let mut answers = Vec::new();
    let mut ops = Vec::new();
    let mut at = 0;
    while at < requests.len() {
        let request = requests[at].clone();
        let page = source.fetch(request.clone()).await.expect("fetch");
        // Follow a limited page from the start as a follower does.
        if page.limited && (at == 0 || at >= 8) {
            requests.push(self::request(page.upto.0, request.to.0));
        }
        ops.push(json!({"op": "page", "from": request.from.0, "to": request.to.0}));
        answers.push(page_body(&page));
        at += 1;
    }
    let expected = synapse_runs(&db.name, &ops);
    assert_eq!(answers.len(), expected.len());
    for ((request, ours), theirs) in requests.iter().zip(&answers).zip(&expected) {
        assert_eq!(Value::String(ours.clone()), *theirs, "{request}");
    }
    // What was checked: limited pages, and the pages that followed them
    // to the end.
    let first: Value = serde_json::from_str(&answers[0]).expect("json");
    assert_eq!(first["limited"], json!(true));
    let limited = answers
        .iter()
        .filter(|answer| answer.contains(r#""limited":true"#))
        .count();
    assert!(limited >= 1, "{limited}");
    let final_page: Value = serde_json::from_str(answers.last().expect("one")).expect("json");
    assert_eq!(final_page["limited"], json!(false));
    assert_eq!(final_page["upto_token"], json!(last));

    // Another stream is not this source's.
    let mut typing = request(0, 1);
    typing.stream = StreamName::Typing;
    assert!(source.fetch(typing).await.is_err());
}

/// Synapse's processes call the writer over HTTP: `HttpServer`'s typed
/// handler calls `AccountDataStore::apply`, answers `max_stream_id` (and
/// Synapse's refusal of ignoring oneself), and serves the stream's
/// catch-up from the tables, as Synapse's writer answers.
#[cfg(feature = "http-server")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_server_makes_the_changes_and_serves_their_catch_up() {
    use futures::FutureExt;
    use synapse_replication::http::{AccountDataAnswer, CatchUpEndpoint};
    use synapse_replication::transport::{HttpServer, TokioRuntime};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let schema = synapse_schema();
    let db = TestDb::create("synrep_acct", &schema).await;
    let theirs = TestDb::create("synrep_acct", &schema).await;
    let (store, _) = rust_writer(&db).await;
    let store = Arc::new(store);
    let writes = Arc::new(tokio::sync::Mutex::new(db.client().await));
    let endpoint = CatchUpEndpoint::new(InstanceName::from(WRITER), Some("s3cret".into()))
        .with_streams([StreamName::AccountData]);
    let runtime = TokioRuntime::current().expect("on tokio");
    let source = Arc::new(AccountDataCatchUp::new(db.client().await));
    let positions = Arc::clone(&store);
    let server = HttpServer::bind(runtime, "127.0.0.1:0", endpoint, source)
        .await
        .expect("bind")
        .with_account_data("example.com", move |request| {
            let (store, writes) = (Arc::clone(&store), Arc::clone(&writes));
            async move {
                let mut client = writes.lock().await;
                store
                    .apply(&mut client, &request)
                    .await
                    .map(|max_stream_id| AccountDataAnswer { max_stream_id })
                    .map_err(|error| error.to_replication_error())
            }
            .boxed()
        })
        .with_positions(move || vec![(StreamName::AccountData, positions.position())]);
    let addr = server.local_addr().expect("address");
    let serving = tokio::spawn(server.run());

    let send = |method: &'static str, path: String, body: String| async move {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {WRITER}:80\r\nAuthorization: Bearer s3cret\r\n\
             Connection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.expect("request");
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.expect("answer");
        let answer = String::from_utf8(answer).expect("utf-8");
        let status: u16 = answer[9..12].parse().expect("status");
        let body = answer.split_once("\r\n\r\n").expect("a body").1.to_owned();
        (status, body)
    };
    // As main calls: the body canonical JSON, with its positions.
    let ignore = r#"{"_INT_STREAM_POS":{"instance_name":"master","streams":{}},"content":{"ignored_users":{"@spam:example.com":{}}}}"#;
    let (status, body) = send(
        "POST",
        "/_synapse/replication/add_user_account_data/%40alice%3Aexample.com/m.ignored_user_list"
            .into(),
        ignore.into(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(answer["max_stream_id"], json!(2));
    assert_eq!(answer["_INT_STREAM_POS"]["account_data"], json!(2));
    let myself = r#"{"_INT_STREAM_POS":{"instance_name":"master","streams":{}},"content":{"ignored_users":{"@alice:example.com":{}}}}"#;
    let (status, body) = send(
        "POST",
        "/_synapse/replication/add_user_account_data/%40alice%3Aexample.com/m.ignored_user_list"
            .into(),
        myself.into(),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains(r#""errcode":"M_INVALID_PARAM""#), "{body}");
    assert!(body.contains("You cannot ignore yourself"), "{body}");

    // The same two changes by Synapse's own writer: the same tables.
    let expected = synapse_runs(
        &theirs.name,
        &[
            json!({"op": "add_user", "user_id": "@alice:example.com",
                   "type": "m.ignored_user_list",
                   "content": {"ignored_users": {"@spam:example.com": {}}}}),
            json!({"op": "add_user", "user_id": "@alice:example.com",
                   "type": "m.ignored_user_list",
                   "content": {"ignored_users": {"@alice:example.com": {}}}}),
            json!({"op": "page", "from": 0, "to": 3}),
        ],
    );
    assert_eq!(expected[0], json!({"max_stream_id": 2}));
    let (a, b) = (db.client().await, theirs.client().await);
    for table in ["account_data", "ignored_users", "stream_positions"] {
        assert_eq!(
            rows(&a, table, &[]).await,
            rows(&b, table, &[]).await,
            "{table}"
        );
    }
    // Catch-up, as Synapse's processes fetch it.
    let (status, body) = send(
        "GET",
        "/_synapse/replication/get_repl_stream_updates/account_data/AbC?from_token=0&upto_token=3"
            .to_owned(),
        String::new(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(Value::String(body), expected[2]);
    serving.abort();
}

/// The writer of the kill-point test, on gated stores (`gate`: the
/// connection its ids and `stream_positions` go through).
async fn gated_writer(
    db: &TestDb,
    gate: &Arc<Gate>,
) -> (AccountDataStore<Gated<Client>>, Published) {
    let me = InstanceName::from(WRITER);
    let gated = |inner| Gated {
        inner,
        gate: Arc::clone(gate),
    };
    let caches = Arc::new(
        CacheInvalidations::load(gated(db.client().await), me.clone())
            .await
            .expect("caches"),
    );
    let published: Published = Arc::default();
    let sink = published.clone();
    let store = AccountDataStore::load(gated(db.client().await), caches, me.clone(), [me])
        .await
        .expect("load")
        .with_clock(at_ts)
        .with_publisher(move |stream, position, rows| {
            sink.lock().unwrap().push((stream.clone(), position, rows));
        });
    (store, published)
}

/// `user` ignores `@spam`: the change with most steps (its row,
/// `ignored_users`, two cache invalidations).
fn ignore(user: &str) -> AccountDataRequest {
    AccountDataRequest::AddUserAccountData {
        user_id: user.to_owned(),
        account_data_type: "m.ignored_user_list".to_owned(),
        content: object(json!({"ignored_users": {"@spam:example.com": {}}})),
    }
}

/// What the victim's change does on its transaction, in order (each id
/// taken: asked for, then answered by the sequence before the writer
/// hears of it); the test stops it at each.
const VICTIM_CALLS: [&str; 12] = [
    "next_ids",
    "next_ids answered",
    "upsert_global",
    "ignored_users",
    "delete_ignored_users",
    "insert_ignored_users",
    "next_ids",
    "next_ids answered",
    "insert_invalidations",
    "next_ids",
    "next_ids answered",
    "insert_invalidations",
];

/// Where the victim is killed after its calls: its rows written and not
/// committed, committed and not handed to `committed`, handed over (rows
/// published) with its `stream_positions` not yet written.
const AFTER_CALLS: [&str; 3] = ["uncommitted", "committed", "position unwritten"];

/// Every id of both streams that has a committed row.
async fn committed_ids(client: &Client) -> Vec<(String, i64)> {
    client
        .query(
            "SELECT 'account_data', stream_id FROM account_data \
             UNION ALL SELECT 'account_data', stream_id FROM room_account_data \
             UNION ALL SELECT 'account_data', stream_id FROM room_tags_revisions \
             UNION ALL SELECT 'caches', stream_id FROM cache_invalidation_stream_by_instance",
            &[],
        )
        .await
        .expect("read the tables")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// The highest position of `stream` the writer published.
fn published_max(published: &Published, stream: &StreamName) -> Token {
    published
        .lock()
        .unwrap()
        .iter()
        .filter(|(of, _, _)| of == stream)
        .map(|&(_, position, _)| position)
        .max()
        .unwrap_or(Token(0))
}

/// Another user ignores `@spam`, all the way through (committed and
/// handed over); the ids it took.
async fn other_change(
    db: &TestDb,
    store: &AccountDataStore<Gated<Client>>,
    point: usize,
) -> Vec<(&'static str, Token)> {
    let gate = Arc::new(Gate::default());
    let mut client = db.client().await;
    let other = Gated {
        inner: client.transaction().await.expect("begin"),
        gate: Arc::clone(&gate),
    };
    let pending = store
        .write_on(&other, &ignore(&format!("@other{point}:example.com")))
        .await
        .expect("the other change");
    other.inner.commit().await.expect("commit");
    store.committed(pending).await.expect("committed");
    gate.taken()
}

/// The highest position of each stream the writer ever announced: in
/// the rows handed over, in its answer to a `REPLICATE` now, and (for
/// `account_data`) in `stream_positions`.
async fn snapshot(
    check: &Client,
    store: &AccountDataStore<Gated<Client>>,
    published: &Published,
) -> [(&'static str, Token); 2] {
    let stream_position: Option<i64> = check
        .query_opt(
            "SELECT stream_id FROM stream_positions WHERE stream_name = 'account_data' \
             AND instance_name = $1",
            &[&WRITER],
        )
        .await
        .expect("stream_positions")
        .map(|row| row.get(0));
    [
        (
            "account_data",
            published_max(published, &StreamName::AccountData)
                .max(store.position())
                .max(Token(stream_position.unwrap_or(0))),
        ),
        (
            "caches",
            published_max(published, &StreamName::Caches).max(store.caches().position()),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_killed_between_taking_ids_and_persisting_rows_never_announced_past_them() {
    let db = TestDb::create("synrep_acct", &synapse_schema()).await;
    let check = db.client().await;
    let mut taken_before: Vec<(&'static str, Token)> = Vec::new();
    for point in 1..=VICTIM_CALLS.len() + AFTER_CALLS.len() {
        let name = VICTIM_CALLS
            .get(point - 1)
            .map(|call| format!("before {call} #{point}"))
            .unwrap_or_else(|| AFTER_CALLS[point - 1 - VICTIM_CALLS.len()].to_owned());
        // Each point a run of its own, started where the last was killed.
        let store_gate = Arc::new(Gate::default());
        let (store, published) = gated_writer(&db, &store_gate).await;

        // The victim's change, on a transaction of its own, stopped at
        // `point` (or run through).
        let victim_gate = Arc::new(Gate::default());
        let mut victim_client = db.client().await;
        let on = Gated {
            inner: victim_client.transaction().await.expect("begin"),
            gate: Arc::clone(&victim_gate),
        };
        if point <= VICTIM_CALLS.len() {
            victim_gate.arm(point);
        }
        let victim = ignore(&format!("@victim{point}:example.com"));
        let mut write = Box::pin(store.write_on(&on, &victim));
        let pending = tokio::select! {
            written = &mut write => Some(written.expect("the victim's change")),
            () = victim_gate.stopped() => None,
        };
        let passed = victim_gate.passed();
        let stopped_at = passed.len().min(VICTIM_CALLS.len());
        assert_eq!(passed[..stopped_at], VICTIM_CALLS[..stopped_at], "{name}");

        // Meanwhile another change goes all the way (the writer publishes
        // and writes positions while the victim is in flight); then the
        // writer is killed: nothing more of this run goes on. A victim
        // transaction left open is not rolled back by the client (no
        // ROLLBACK is sent): its connection just goes, as a killed
        // process's does, and PostgreSQL rolls it back.
        let announced;
        let other_taken;
        match pending {
            None => {
                other_taken = other_change(&db, &store, point).await;
                announced = snapshot(&check, &store, &published).await;
                drop(write);
                std::mem::forget(on);
            }
            Some(pending) => {
                assert_eq!(passed, VICTIM_CALLS, "{name}");
                drop(write);
                other_taken = other_change(&db, &store, point).await;
                if name == "uncommitted" {
                    announced = snapshot(&check, &store, &published).await;
                    drop(pending);
                    std::mem::forget(on);
                } else {
                    let Gated { inner, .. } = on;
                    inner.commit().await.expect("commit");
                    if name == "committed" {
                        announced = snapshot(&check, &store, &published).await;
                        drop(pending);
                    } else {
                        // Stopped in the hand-over, at writing
                        // stream_positions: the rows went out already.
                        store_gate.arm(1);
                        let mut committed = Box::pin(store.committed(pending));
                        tokio::select! {
                            done = &mut committed => panic!("not stopped: {done:?}"),
                            () = store_gate.stopped() => {}
                        }
                        assert_eq!(store_gate.passed().last(), Some(&"write_position"));
                        announced = snapshot(&check, &store, &published).await;
                        drop(committed);
                    }
                }
            }
        }
        drop(store);

        let committed = committed_ids(&check).await;
        let mut taken = victim_gate.taken();
        taken.extend(other_taken);
        for &(stream, id) in &taken {
            let position = announced.iter().find(|(of, _)| *of == stream).unwrap().1;
            assert!(
                id > position || committed.contains(&(stream.to_owned(), id.0)),
                "{name}: {stream} announced at {position} with id {id} not persisted \
                 (taken: {taken:?}, committed: {committed:?})"
            );
        }
        // A victim that took ids was held below them until they committed.
        if name != "position unwritten" {
            for &(stream, id) in &victim_gate.taken() {
                let position = announced.iter().find(|(of, _)| *of == stream).unwrap().1;
                assert!(id > position, "{name}: {stream} passed {id} in flight");
            }
        }
        // And no run ever took an id an earlier one took.
        for &(stream, id) in &taken {
            assert!(
                taken_before
                    .iter()
                    .all(|&(of, before)| of != stream || before < id),
                "{name}: {stream} id {id} again"
            );
        }
        taken_before.extend(taken);
        // Its connection goes last (PostgreSQL rolls back what it left
        // open): nothing it left uncommitted was ever visible above.
    }
}
