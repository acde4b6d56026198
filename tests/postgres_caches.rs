//! Cache invalidations on a real PostgreSQL (feature `postgres`), checked
//! against Synapse 1.163.2's own code: the server on 127.0.0.1:5432 (trust
//! authentication, user `postgres`), and the Synapse venv's Python
//! (`tests/synapse/caches.py` runs Synapse's cache.py functions on the
//! same database).
//!
//! Each test creates a database of its own (`synrep_caches_<pid>_<n>`),
//! with the table, indexes and sequence of Synapse's own full schema (read
//! from the venv, not written here), and drops it at the end, also when it
//! fails. No other database is touched.
#![cfg(feature = "postgres")]

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use serde_json::{Value, json};
use synapse_replication::config::SynapseConfig;
use synapse_replication::http::page_body;
use synapse_replication::positions::{CacheInvalidation, CatchUpId, CatchUpRequest, Writer};
use synapse_replication::transport::postgres::{
    CacheInvalidations, CacheInvalidationsError, CachesCatchUp,
};
use synapse_replication::transport::{CatchUpSource, TokioRuntime};
use synapse_replication::wire::{InstanceName, RawRow, StreamName, Token};
use tokio_postgres::Client;

use common::synapse::run_script;

#[path = "common/postgres.rs"]
mod postgres;
use postgres::TestDb;

/// One timestamp for every write compared with Synapse's (its clock is a
/// stand-in that answers this).
const TS: i64 = 1_700_000_000_123;

fn at_ts() -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(TS as u64)
}

/// Runs `tests/synapse/caches.py` with `args`, `stdin` in, stdout out.
fn python(args: &[&str], stdin: &str) -> String {
    run_script("caches.py", args, stdin)
}

/// Synapse's own code runs `ops` on the database (see caches.py).
fn synapse_runs(dbname: &str, ops: &Value) -> Vec<Value> {
    let out = python(&["run", dbname], &ops.to_string());
    serde_json::from_str(&out).expect("caches.py's answer")
}

/// The statements of Synapse's full schema for the caches stream.
fn synapse_schema() -> String {
    let out = python(&["schema"], "");
    let statements: Vec<String> = out
        .lines()
        .map(|line| serde_json::from_str(line).expect("a statement"))
        .collect();
    assert!(
        statements
            .iter()
            .any(|s| s.starts_with("CREATE TABLE cache_invalidation_stream_by_instance")),
        "{statements:?}"
    );
    assert_eq!(statements.len(), 7, "{statements:?}");
    statements.join("\n")
}

fn name(name: &str) -> InstanceName {
    InstanceName::from(name)
}

/// A writer of `caches` as every process of a Redis deployment is.
fn writer(own: &str) -> Writer {
    let synapse =
        SynapseConfig::from_json(r#"{"server_name": "example.com", "redis": {"enabled": true}}"#)
            .expect("configuration");
    let mut writer = Writer::new(name(own), synapse.writers().clone());
    writer.connected(std::time::Instant::now());
    while writer.poll_command().is_some() {}
    writer
}

/// The lines a writer queued.
fn lines(writer: &mut Writer) -> Vec<String> {
    let mut lines = Vec::new();
    while let Some(command) = writer.poll_command() {
        let mut out = BytesMut::new();
        command.encode(&mut out).expect("encode");
        let text = String::from_utf8(out.to_vec()).expect("utf-8");
        lines.push(text.trim_end_matches('\n').to_owned());
    }
    lines
}

/// The table's rows of `instance`, as text a human can compare.
async fn table(client: &Client, instance: &str) -> Vec<(String, Option<String>, Option<i64>)> {
    client
        .query(
            "SELECT cache_func, keys::text, invalidation_ts FROM cache_invalidation_stream_by_instance \
             WHERE instance_name = $1 ORDER BY stream_id",
            &[&instance],
        )
        .await
        .expect("read the table")
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect()
}

/// The invalidations compared: one key, a key of several parts, the empty
/// key, text that needs escaping, many keys at once, whole caches, and
/// Synapse's magic current-state cache.
fn cases() -> Vec<(CacheInvalidation, Value)> {
    let bulk: Vec<Vec<String>> = (0..3)
        .map(|n| vec![format!("@user{n}:example.com"), format!("DEVICE{n}")])
        .collect();
    vec![
        (
            CacheInvalidation::entry("ignored_users", ["@alice:example.com"]),
            json!({"op": "entry", "cache": "ignored_users", "key": ["@alice:example.com"]}),
        ),
        (
            CacheInvalidation::entry("get_e2e_device_keys", ["@a:x", "DEV"]),
            json!({"op": "entry", "cache": "get_e2e_device_keys", "key": ["@a:x", "DEV"]}),
        ),
        (
            CacheInvalidation::entry("get_server_version", Vec::<String>::new()),
            json!({"op": "entry", "cache": "get_server_version", "key": []}),
        ),
        (
            CacheInvalidation::entry(
                "_get_server_keys_json",
                [r#"["example.org", "ed25519:a"]"#, "é \\ \" \u{1F600} {x,y}"],
            ),
            json!({"op": "entry", "cache": "_get_server_keys_json",
                   "key": [r#"["example.org", "ed25519:a"]"#, "é \\ \" \u{1F600} {x,y}"]}),
        ),
        (
            CacheInvalidation::entries("get_e2e_one_time_keys", bulk.clone()),
            json!({"op": "entries", "cache": "get_e2e_one_time_keys", "keys": bulk}),
        ),
        (
            CacheInvalidation::all("get_rooms_for_user"),
            json!({"op": "all", "cache": "get_rooms_for_user"}),
        ),
        (
            CacheInvalidation::entry("cs_cache_fake", ["!room:x", "@a:x", "@b:x"]),
            json!({"op": "entry", "cache": "cs_cache_fake", "key": ["!room:x", "@a:x", "@b:x"]}),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_table_and_wire_are_what_synapse_s_own_code_writes() {
    let db = TestDb::create("synrep_caches", &synapse_schema()).await;
    let caches = CacheInvalidations::load(db.client().await, name("rust"))
        .await
        .expect("load");
    let mut rust = writer("rust");
    rust.advance(&StreamName::Caches, caches.position())
        .expect("announce");
    lines(&mut rust);

    let mut ops = Vec::new();
    for (invalidation, mut op) in cases() {
        caches
            .invalidate(&invalidation, at_ts(), |position, rows| {
                rust.write(&StreamName::Caches, position, rows)
            })
            .await
            .expect("invalidate")
            .expect("write");
        op["instance"] = json!("synapse");
        op["ts"] = json!(TS);
        ops.push(op);
    }
    // A bulk invalidation of no key writes nothing, as in Synapse.
    caches
        .invalidate(
            &CacheInvalidation::entries("f", Vec::<Vec<String>>::new()),
            at_ts(),
            |_, rows| assert!(rows.is_empty()),
        )
        .await
        .expect("nothing");
    let sent = lines(&mut rust);
    synapse_runs(&db.name, &Value::Array(ops));

    // The table: the same rows, column for column (keys as PostgreSQL
    // prints the array: NULL for a whole cache, {} for the empty key).
    let client = db.client().await;
    let ours = table(&client, "rust").await;
    let theirs = table(&client, "synapse").await;
    assert_eq!(ours.len(), 9);
    assert_eq!(ours, theirs);
    assert_eq!(ours[2].1.as_deref(), Some("{}"));
    assert_eq!(ours[7].1, None);

    // The wire: what this writer sent for its rows is what Synapse's
    // writer sends for the same rows of the table, byte for byte.
    let page = synapse_runs(
        &db.name,
        &json!([{"op": "page", "instance": "rust", "from": 0, "to": 100, "limit": 100}]),
    );
    let expected: Vec<String> = page[0]["lines"]
        .as_array()
        .expect("lines")
        .iter()
        .map(|line| line.as_str().expect("a line").to_owned())
        .collect();
    assert_eq!(sent, expected);
    assert!(
        sent.iter()
            .any(|line| line.ends_with(r#"["get_rooms_for_user",null,1700000000123]"#)),
        "{sent:#?}"
    );
    // And Synapse's rows differ only in the instance and the ids.
    let page = synapse_runs(
        &db.name,
        &json!([{"op": "page", "instance": "synapse", "from": 0, "to": 100, "limit": 100}]),
    );
    let theirs: Vec<String> = page[0]["lines"]
        .as_array()
        .expect("lines")
        .iter()
        .map(|line| strip_head(line.as_str().expect("a line")))
        .collect();
    let ours: Vec<String> = sent.iter().map(|line| strip_head(line)).collect();
    assert_eq!(ours, theirs);

    // Synapse refuses to invalidate its magic caches whole: so does this.
    let refused = caches
        .invalidate(&CacheInvalidation::all("cs_cache_fake"), at_ts(), |_, _| ())
        .await;
    assert!(matches!(refused, Err(CacheInvalidationsError::Invalid(_))));
    assert_eq!(table(&client, "rust").await.len(), 9);
}

/// `RDATA caches <instance> <token> <row>` -> `<row>`.
fn strip_head(line: &str) -> String {
    line.splitn(5, ' ')
        .nth(4)
        .expect("an RDATA line")
        .to_owned()
}

fn request(writer: &str, from: i64, to: i64) -> CatchUpRequest {
    CatchUpRequest {
        id: CatchUpId::new(1),
        stream: StreamName::Caches,
        writer: name(writer),
        from: Token(from),
        to: Token(to),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_pages_are_the_pages_synapse_s_query_gives() {
    let db = TestDb::create("synrep_caches", &synapse_schema()).await;
    let caches = CacheInvalidations::load(db.client().await, name("rust"))
        .await
        .expect("load");
    // Rows of this writer and of others, interleaved, more than a page.
    let other = CacheInvalidations::load(db.client().await, name("other"))
        .await
        .expect("load");
    for (invalidation, _) in cases() {
        caches
            .invalidate(&invalidation, at_ts(), |_, _| ())
            .await
            .expect("invalidate");
        other
            .invalidate(&invalidation, at_ts(), |_, _| ())
            .await
            .expect("invalidate");
    }
    let keys: Vec<[String; 1]> = (0..150).map(|n| [format!("@u{n}:x")]).collect();
    caches
        .invalidate(
            &CacheInvalidation::entries("get_user_by_id", keys),
            at_ts(),
            |_, _| (),
        )
        .await
        .expect("invalidate many");
    synapse_runs(
        &db.name,
        &json!([{"op": "entries", "instance": "synapse", "cache": "f", "keys": [["a"], ["b"]],
                 "ts": TS}]),
    );
    let last = caches.position().0;
    assert!(last > 160, "{last}");

    let source: Arc<dyn CatchUpSource> = Arc::new(CachesCatchUp::new(db.client().await));
    // Ranges as followers ask: from the start, a narrow one (the answer
    // reaches beyond it: Synapse's is not bounded by upto_token), one
    // that is limited and the one after it, one past the end, one with
    // from above to, nothing, and a writer with no rows.
    let mut requests = vec![
        request("rust", 0, last),
        request("rust", last - 20, last - 18),
        request("rust", 0, 3),
        request("rust", last - 1, last),
        request("rust", last, last + 5),
        request("rust", last, 3),
        request("rust", 7, 7),
        request("nobody", 0, last),
        request("synapse", 0, last + 2),
    ];
    let mut answers = Vec::new();
    let mut ops = Vec::new();
    let mut at = 0;
    while at < requests.len() {
        let request = requests[at].clone();
        let page = source.fetch(request.clone()).await.expect("fetch");
        // Follow a limited page as a follower does: from its upto.
        if page.limited && request.from == Token(0) && request.writer == name("rust") {
            requests.push(self::request("rust", page.upto.0, request.to.0));
        }
        ops.push(json!({"op": "page", "instance": request.writer.as_str(),
                        "from": request.from.0, "to": request.to.0, "limit": 100}));
        answers.push(page_body(&page));
        at += 1;
    }
    let synapse = synapse_runs(&db.name, &Value::Array(ops));
    let expected: Vec<String> = synapse
        .iter()
        .map(|page| page["body"].as_str().expect("a body").to_owned())
        .collect();
    for ((request, ours), theirs) in requests.iter().zip(&answers).zip(&expected) {
        assert_eq!(ours, theirs, "{request}");
    }
    assert_eq!(answers.len(), requests.len());
    // What was checked: a limited page, rows above upto, an empty one.
    let first: Value = serde_json::from_str(&answers[0]).expect("json");
    assert_eq!(first["limited"], json!(true));
    assert_eq!(first["updates"].as_array().map(Vec::len), Some(100));
    let narrow: Value = serde_json::from_str(&answers[1]).expect("json");
    assert_eq!(narrow["upto_token"], json!(last - 18));
    assert_eq!(narrow["limited"], json!(false));
    assert_eq!(narrow["updates"].as_array().map(Vec::len), Some(20));

    // Another stream is not this source's.
    let mut typing = request("rust", 0, 1);
    typing.stream = StreamName::Typing;
    assert!(source.fetch(typing).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_transaction_publishes_nothing_and_leaves_no_row() {
    let db = TestDb::create("synrep_caches", &synapse_schema()).await;
    let caches = CacheInvalidations::load(db.client().await, name("rust"))
        .await
        .expect("load");
    let mut rust = writer("rust");
    rust.advance(&StreamName::Caches, caches.position())
        .expect("announce");
    lines(&mut rust);
    let mut app = db.client().await;
    let check = db.client().await;
    let ignored = CacheInvalidation::entry("ignored_users", ["@alice:example.com"]);

    // Rolled back: no row, nothing sent, and the position passes the id.
    let transaction = app.transaction().await.expect("begin");
    let pending = caches
        .invalidate_on(&transaction, &ignored, at_ts())
        .await
        .expect("invalidate");
    let lost = pending.ids().to_vec();
    transaction.rollback().await.expect("rollback");
    caches
        .rolled_back(pending, |position, rows| {
            assert!(rows.is_empty());
            rust.write(&StreamName::Caches, position, rows)
        })
        .expect("rolled back")
        .expect("write");
    assert!(table(&check, "rust").await.is_empty());
    assert!(caches.position() >= lost[0]);
    let sent = lines(&mut rust);
    assert!(
        sent.iter().all(|line| !line.starts_with("RDATA")),
        "{sent:?}"
    );

    // Two transactions commit out of order: nothing goes out before the
    // earlier id is committed, then both, in token order.
    let mut second_client = db.client().await;
    let first = app.transaction().await.expect("begin");
    let a = caches
        .invalidate_on(&first, &ignored, at_ts())
        .await
        .expect("a");
    let second = second_client.transaction().await.expect("begin");
    let b = caches
        .invalidate_on(&second, &CacheInvalidation::all("get_user_by_id"), at_ts())
        .await
        .expect("b");
    let (a_id, b_id) = (a.ids()[0], b.ids()[0]);
    assert!(a_id < b_id);
    second.commit().await.expect("commit b");
    caches
        .committed(b, |position, rows| {
            assert!(position < b_id && rows.is_empty());
            rust.write(&StreamName::Caches, position, rows)
        })
        .expect("b")
        .expect("write");
    assert!(
        lines(&mut rust)
            .iter()
            .all(|line| !line.starts_with("RDATA"))
    );
    first.commit().await.expect("commit a");
    let mut tokens = Vec::new();
    caches
        .committed(a, |position, rows| {
            tokens = rows.iter().map(|(token, _)| *token).collect();
            assert_eq!(position, b_id);
            rust.write(&StreamName::Caches, position, rows)
        })
        .expect("a")
        .expect("write");
    assert_eq!(tokens, [a_id, b_id]);
    let sent = lines(&mut rust);
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert!(sent[0].starts_with(&format!("RDATA caches rust {a_id} ")));
    assert!(sent[1].starts_with(&format!("RDATA caches rust {b_id} ")));
    assert_eq!(table(&check, "rust").await.len(), 2);

    // A failed insert (the application's transaction aborted before it)
    // takes its id back too: nothing is sent, the position passes it.
    let transaction = app.transaction().await.expect("begin");
    assert!(transaction.execute("SELECT 1/0", &[]).await.is_err());
    let failed = caches.invalidate_on(&transaction, &ignored, at_ts()).await;
    assert!(
        matches!(failed, Err(CacheInvalidationsError::Database(_))),
        "{failed:?}"
    );
    drop(transaction);
    caches
        .invalidate(&ignored, at_ts(), |position, rows| {
            rust.write(&StreamName::Caches, position, rows)
        })
        .await
        .expect("invalidate")
        .expect("write");
    let sent = lines(&mut rust);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(table(&check, "rust").await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_at_once_never_share_an_id_with_each_other_or_synapse() {
    let db = TestDb::create("synrep_caches", &synapse_schema()).await;
    const TASKS: usize = 3;
    const WRITES: usize = 25;
    // Synapse's own code writes as `synapse` meanwhile, from another
    // process, on the same sequence.
    let synapse_ops: Vec<Value> = (0..40)
        .map(|n| {
            if n % 4 == 0 {
                json!({"op": "entries", "instance": "synapse", "cache": "f",
                       "keys": [[format!("a{n}")], [format!("b{n}")]], "ts": TS})
            } else {
                json!({"op": "entry", "instance": "synapse", "cache": "f",
                       "key": [format!("k{n}")], "ts": TS})
            }
        })
        .collect();
    let dbname = db.name.clone();
    let synapse = tokio::task::spawn_blocking(move || {
        synapse_runs(&dbname, &Value::Array(synapse_ops));
    });

    let mut tasks = Vec::new();
    let mut published = Vec::new();
    for own in ["w1", "w2"] {
        let caches = Arc::new(
            CacheInvalidations::load(db.client().await, name(own))
                .await
                .expect("load"),
        );
        let writer = Arc::new(Mutex::new(writer(own)));
        writer
            .lock()
            .unwrap()
            .advance(&StreamName::Caches, caches.position())
            .unwrap();
        let sent: Arc<Mutex<Vec<(Token, RawRow)>>> = Arc::default();
        published.push((own, caches.clone(), writer.clone(), sent.clone()));
        for task in 0..TASKS {
            let (caches, writer, sent) = (caches.clone(), writer.clone(), sent.clone());
            let mut app = db.client().await;
            tasks.push(tokio::spawn(async move {
                for write in 0..WRITES {
                    let key = format!("@{own}_{task}_{write}:x");
                    let invalidation = if write % 3 == 0 {
                        CacheInvalidation::entries("f", [[key.clone()], [format!("{key}2")]])
                    } else {
                        CacheInvalidation::entry("f", [key])
                    };
                    let publish = |position: Token, rows: Vec<(Token, RawRow)>| {
                        sent.lock().unwrap().extend(rows.iter().cloned());
                        writer
                            .lock()
                            .unwrap()
                            .write(&StreamName::Caches, position, rows)
                    };
                    if write % 2 == 0 {
                        caches
                            .invalidate(&invalidation, SystemTime::now(), publish)
                            .await
                            .expect("invalidate")
                            .expect("the writer takes rows in order");
                    } else {
                        // In a transaction that waits a little before it
                        // commits, so that commits finish out of order.
                        let transaction = app.transaction().await.expect("begin");
                        let pending = caches
                            .invalidate_on(&transaction, &invalidation, SystemTime::now())
                            .await
                            .expect("invalidate");
                        let wait = (pending.ids()[0].0 as u64 * 7 + task as u64) % 4;
                        tokio::time::sleep(Duration::from_millis(wait)).await;
                        transaction.commit().await.expect("commit");
                        caches
                            .committed(pending, publish)
                            .expect("committed")
                            .expect("the writer takes rows in order");
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("writer task");
    }
    synapse.await.expect("synapse's writes");

    let client = db.client().await;
    let row = client
        .query_one(
            "SELECT count(*), count(DISTINCT stream_id) FROM cache_invalidation_stream_by_instance",
            &[],
        )
        .await
        .expect("count");
    let (rows, distinct): (i64, i64) = (row.get(0), row.get(1));
    let per_writer = TASKS * WRITES + TASKS * WRITES.div_ceil(3);
    assert_eq!(rows as usize, 2 * per_writer + 30 + 20);
    assert_eq!(rows, distinct, "an id was given twice");

    // Each writer sent every row it committed, once, in token order, and
    // its rows are in the table under its name with those ids.
    for (own, caches, writer, sent) in published {
        let sent = sent.lock().unwrap().clone();
        let tokens: Vec<Token> = sent.iter().map(|(token, _)| *token).collect();
        assert!(tokens.windows(2).all(|pair| pair[0] < pair[1]), "{own}");
        let ids: BTreeSet<i64> = client
            .query(
                "SELECT stream_id FROM cache_invalidation_stream_by_instance WHERE instance_name = $1",
                &[&own],
            )
            .await
            .expect("ids")
            .iter()
            .map(|row| row.get(0))
            .collect();
        assert_eq!(
            tokens.iter().map(|token| token.0).collect::<BTreeSet<_>>(),
            ids,
            "{own}"
        );
        assert_eq!(caches.position().0, *ids.last().expect("rows"));
        let rdata = lines(&mut writer.lock().unwrap())
            .into_iter()
            .filter(|line| line.starts_with("RDATA"))
            .count();
        assert_eq!(rdata, per_writer, "{own}");
    }
}

/// Synapse's processes fetch `caches` over HTTP: `HttpServer` serving
/// `CachesCatchUp` answers the body Synapse's writer answers.
#[cfg(feature = "http-server")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_server_answers_caches_catch_up_as_synapse_does() {
    use synapse_replication::http::CatchUpEndpoint;
    use synapse_replication::transport::HttpServer;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let db = TestDb::create("synrep_caches", &synapse_schema()).await;
    let caches = CacheInvalidations::load(db.client().await, name("rust1"))
        .await
        .expect("load");
    for (invalidation, _) in cases() {
        caches
            .invalidate(&invalidation, at_ts(), |_, _| ())
            .await
            .expect("invalidate");
    }
    let endpoint = CatchUpEndpoint::new(name("rust1"), Some("s3cret".into()))
        .with_streams([StreamName::Caches]);
    let runtime = TokioRuntime::current().expect("on tokio");
    let source = Arc::new(CachesCatchUp::new(db.client().await));
    let server = HttpServer::bind(runtime, "127.0.0.1:0", endpoint, source)
        .await
        .expect("bind");
    let addr = server.local_addr().expect("address");
    let serving = tokio::spawn(server.run());

    // As Synapse's client asks: a range narrower than the rows there are.
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(
            b"GET /_synapse/replication/get_repl_stream_updates/caches/AbCdEf?from_token=3&upto_token=4 \
              HTTP/1.1\r\nHost: rust1:80\r\nAuthorization: Bearer s3cret\r\nConnection: close\r\n\r\n",
        )
        .await
        .expect("request");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("answer");
    let answer = String::from_utf8(answer).expect("utf-8");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let body = answer.split_once("\r\n\r\n").expect("a body").1;

    let synapse = synapse_runs(
        &db.name,
        &json!([{"op": "page", "instance": "rust1", "from": 3, "to": 4, "limit": 100}]),
    );
    assert_eq!(body, synapse[0]["body"].as_str().expect("a body"));
    assert!(
        body.contains(r#""upto_token":4"#) && body.contains("[10,"),
        "{body}"
    );
    serving.abort();
}

/// What Synapse's own `caches` id generator, started as `instance` on the
/// database now, announces for itself (caches.py `position`).
fn synapse_start_position(dbname: &str, instance: &str) -> Token {
    let out = python(&["position", dbname, instance], "");
    Token(serde_json::from_str(out.trim()).expect("caches.py's position"))
}

/// The position a restarted writer announces is the one Synapse's own
/// writer announces in the same database, also where that is below what
/// it announced before the restart (its ids whose transaction rolled back
/// have no row), and never above a row not yet committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_writer_starts_where_synapse_s_own_writer_starts() {
    let db = TestDb::create("synrep_caches", &synapse_schema()).await;
    let ignored = CacheInvalidation::entry("ignored_users", ["@alice:example.com"]);
    let restart = |instance: &'static str| {
        let dbname = db.name.clone();
        async move {
            let rust = CacheInvalidations::load(postgres::client(&dbname).await, name(instance))
                .await
                .expect("load")
                .position();
            let synapse = synapse_start_position(&dbname, instance);
            assert_eq!(rust, synapse, "{instance}'s start: the crate, Synapse");
            rust
        }
    };
    // An empty table: both start at 1 (ids start at 2).
    assert_eq!(restart("rust").await, Token(1));

    // Written by this writer and by Synapse's code as `main`; then this
    // writer's last transaction rolls back, so its position passes an id
    // no row carries.
    let caches = CacheInvalidations::load(db.client().await, name("rust"))
        .await
        .expect("load");
    for _ in 0..2 {
        caches
            .invalidate(&ignored, at_ts(), |_, _| ())
            .await
            .expect("invalidate");
    }
    synapse_runs(
        &db.name,
        &json!([{"op": "entry", "instance": "main", "cache": "ignored_users",
                 "key": ["@bob:example.com"], "ts": TS}]),
    );
    let mut app = db.client().await;
    let transaction = app.transaction().await.expect("begin");
    let pending = caches
        .invalidate_on(&transaction, &ignored, at_ts())
        .await
        .expect("invalidate");
    let lost = pending.ids()[0];
    transaction.rollback().await.expect("rollback");
    caches.rolled_back(pending, |_, _| ()).expect("rolled back");
    let before = caches.position();
    assert_eq!(before, lost, "the position passes an id rolled back");
    drop(caches);

    // Restarted: the highest id in the table, of any instance (main's
    // 4), below the 5 announced before. Synapse's writer does the same;
    // its followers, ahead, catch up from 5 to 4 (nothing) and go on.
    let started = restart("rust").await;
    assert_eq!(started, Token(4));
    assert!(started < before);
    assert_eq!(restart("main").await, Token(4));

    // A transaction of main's holds id 6, uncommitted, while id 7 commits:
    // a writer starting then (this one, or Synapse's) announces 7, which
    // says nothing of main's rows; its own are all at or below it.
    let synapse_txn = app.transaction().await.expect("begin");
    let held: i64 = synapse_txn
        .query_one("SELECT nextval('cache_invalidation_stream_seq')", &[])
        .await
        .expect("nextval")
        .get(0);
    synapse_txn
        .execute(
            "INSERT INTO cache_invalidation_stream_by_instance \
             (stream_id, instance_name, cache_func, keys, invalidation_ts) \
             VALUES ($1, 'main', 'ignored_users', '{@carol:example.com}', $2)",
            &[&held, &TS],
        )
        .await
        .expect("insert");
    let caches = CacheInvalidations::load(db.client().await, name("rust"))
        .await
        .expect("load");
    caches
        .invalidate(&ignored, at_ts(), |_, _| ())
        .await
        .expect("invalidate");
    let own = caches.position();
    assert_eq!(own, Token(held + 1));
    drop(caches);
    assert_eq!(restart("rust").await, own);
    synapse_txn.rollback().await.expect("rollback");
}
