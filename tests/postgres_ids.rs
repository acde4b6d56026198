//! Stream ids from a real PostgreSQL (feature `postgres`): the server on
//! 127.0.0.1:5432 (trust authentication, user `postgres`), as on every
//! machine the suite runs on.
//!
//! Each test creates a database of its own (`synrep_ids_<pid>_<n>`), with
//! the tables and sequences Synapse's schema has for the streams it uses,
//! and drops it at the end, also when it fails. No other database is
//! touched.
#![cfg(feature = "postgres")]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use synapse_replication::positions::StreamIdError;
use synapse_replication::transport::SmolRuntime;
use synapse_replication::transport::postgres::{
    DatabaseIds, DatabaseIdsError, DatabaseStream, StreamIdStore,
};
use synapse_replication::wire::{InstanceName, Token};
use tokio_postgres::Client;

#[path = "common/postgres.rs"]
mod postgres;
use postgres::{HOST, PORT, TestDb, connect_to};

/// What Synapse's schema has for `stream_positions`, `account_data` and
/// `caches` (a new database's sequences stand at 1, called).
const SCHEMA: &str = "
    CREATE TABLE stream_positions (
        stream_name TEXT NOT NULL,
        instance_name TEXT NOT NULL,
        stream_id BIGINT NOT NULL
    );
    CREATE UNIQUE INDEX stream_positions_idx ON stream_positions (stream_name, instance_name);

    CREATE SEQUENCE account_data_sequence;
    SELECT setval('account_data_sequence', 1, true);
    CREATE TABLE account_data (
        user_id TEXT NOT NULL,
        account_data_type TEXT NOT NULL,
        stream_id BIGINT NOT NULL,
        content TEXT NOT NULL,
        instance_name TEXT,
        UNIQUE (user_id, account_data_type)
    );
    CREATE TABLE room_account_data (
        user_id TEXT NOT NULL,
        room_id TEXT NOT NULL,
        account_data_type TEXT NOT NULL,
        stream_id BIGINT NOT NULL,
        content TEXT NOT NULL,
        instance_name TEXT,
        UNIQUE (user_id, room_id, account_data_type)
    );
    CREATE TABLE room_tags_revisions (
        user_id TEXT NOT NULL,
        room_id TEXT NOT NULL,
        stream_id BIGINT NOT NULL,
        instance_name TEXT,
        UNIQUE (user_id, room_id)
    );

    CREATE SEQUENCE cache_invalidation_stream_seq;
    SELECT setval('cache_invalidation_stream_seq', 1, true);
    CREATE TABLE cache_invalidation_stream_by_instance (
        stream_id BIGINT NOT NULL,
        instance_name TEXT NOT NULL,
        cache_func TEXT NOT NULL,
        keys TEXT[],
        invalidation_ts BIGINT
    );
";

fn name(name: &str) -> InstanceName {
    InstanceName::from(name)
}

async fn stream_position(client: &Client, stream: &str, instance: &str) -> Option<i64> {
    client
        .query_opt(
            "SELECT stream_id FROM stream_positions WHERE stream_name = $1 AND instance_name = $2",
            &[&stream, &instance],
        )
        .await
        .expect("read stream_positions")
        .map(|row| row.get(0))
}

/// Writes an `account_data` row with `id` for `instance`, committed.
async fn write_row(client: &mut Client, instance: &InstanceName, id: Token) {
    let transaction = client.transaction().await.expect("begin");
    transaction
        .execute(
            "INSERT INTO account_data (user_id, account_data_type, stream_id, content, instance_name) \
             VALUES ($1, 'org.example.test', $2, '{}', $3)",
            &[&format!("@u{}:example.com", id.0), &id.0, &instance.as_str()],
        )
        .await
        .expect("insert");
    transaction.commit().await.expect("commit");
}

async fn load(client: Client, own: &str, writers: &[&str]) -> DatabaseIds<Client> {
    DatabaseIds::load(
        client,
        DatabaseStream::ACCOUNT_DATA,
        name(own),
        writers.iter().map(|writer| name(writer)),
    )
    .await
    .expect("load")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_of_two_writers_never_repeat_and_positions_never_pass_a_missing_row() {
    let db = TestDb::create("synrep_ids", SCHEMA).await;
    const TASKS: usize = 3;
    const WRITES: usize = 30;
    let taken_by: Arc<Mutex<Vec<(String, Token)>>> = Arc::default();
    let mut tasks = Vec::new();
    for writer in ["w1", "w2"] {
        let ids = Arc::new(load(db.client().await, writer, &["w1", "w2"]).await);
        for task in 0..TASKS {
            let (ids, taken_by) = (ids.clone(), taken_by.clone());
            let mut rows = db.client().await;
            tasks.push(tokio::spawn(async move {
                let me = name(writer);
                for write in 0..WRITES {
                    let n = 1 + (write + task) % 3;
                    let taken = ids.take(n).await.expect("take");
                    taken_by
                        .lock()
                        .unwrap()
                        .extend(taken.iter().map(|&id| (writer.to_owned(), id)));
                    // Writes finish out of order: some wait before
                    // committing while later ids commit.
                    let wait = (taken[0].0 as u64 * 7 + task as u64) % 5;
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                    for &id in &taken {
                        write_row(&mut rows, &me, id).await;
                    }
                    ids.persisted(&taken).await.expect("persisted");
                }
            }));
        }
    }
    // While they write: in one snapshot, each writer's stream_positions
    // row and its committed rows. Every id the writer took at or below
    // its position must be committed. (Ids taken after the snapshot come
    // from the sequence later, so are above any position written before.)
    let watcher = db.client().await;
    let mut checks = 0;
    while tasks.iter().any(|task| !task.is_finished()) {
        for writer in ["w1", "w2"] {
            let row = watcher
                .query_one(
                    "SELECT (SELECT stream_id FROM stream_positions \
                             WHERE stream_name = 'account_data' AND instance_name = $1), \
                            ARRAY(SELECT stream_id FROM account_data WHERE instance_name = $1)",
                    &[&writer],
                )
                .await
                .unwrap();
            let position: Option<i64> = row.get(0);
            let committed: BTreeSet<i64> = row.get::<_, Vec<i64>>(1).into_iter().collect();
            let Some(position) = position else { continue };
            let missing: Vec<i64> = taken_by
                .lock()
                .unwrap()
                .iter()
                .filter(|(by, id)| by == writer && id.0 <= position && !committed.contains(&id.0))
                .map(|(_, id)| id.0)
                .collect();
            assert!(
                missing.is_empty(),
                "{writer} wrote position {position} with ids {missing:?} not committed"
            );
            checks += 1;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for task in tasks {
        task.await.expect("writer task");
    }
    assert!(checks > 0);

    let taken = taken_by.lock().unwrap().clone();
    let distinct: BTreeSet<Token> = taken.iter().map(|&(_, id)| id).collect();
    assert_eq!(distinct.len(), taken.len(), "an id was given twice");
    let client = db.client().await;
    let rows: i64 = client
        .query_one("SELECT count(DISTINCT stream_id) FROM account_data", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows as usize, taken.len());
    // Every write finished: each writer's row is its highest id.
    for writer in ["w1", "w2"] {
        let highest = taken
            .iter()
            .filter(|(by, _)| by == writer)
            .map(|&(_, id)| id.0)
            .max();
        assert_eq!(
            stream_position(&client, "account_data", writer).await,
            highest,
            "{writer}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_positions_only_moves_forward_when_writes_finish_out_of_order() {
    let db = TestDb::create("synrep_ids", SCHEMA).await;
    let me = name("writer");
    let ids = load(db.client().await, "writer", &["writer"]).await;
    let mut rows = db.client().await;
    let check = db.client().await;
    let (a, b, c) = (
        ids.take(1).await.unwrap()[0],
        ids.take(1).await.unwrap()[0],
        ids.take(1).await.unwrap()[0],
    );
    assert_eq!((a, b, c), (Token(2), Token(3), Token(4)));

    // c commits first: nothing below it is, so the position stays at the
    // start (1), which is written.
    write_row(&mut rows, &me, c).await;
    assert_eq!(ids.persisted(&[c]).await.unwrap(), Token(1));
    assert_eq!(
        stream_position(&check, "account_data", "writer").await,
        Some(1)
    );
    write_row(&mut rows, &me, a).await;
    assert_eq!(ids.persisted(&[a]).await.unwrap(), Token(2));
    assert_eq!(
        stream_position(&check, "account_data", "writer").await,
        Some(2)
    );
    write_row(&mut rows, &me, b).await;
    assert_eq!(ids.persisted(&[b]).await.unwrap(), Token(4));
    assert_eq!(
        stream_position(&check, "account_data", "writer").await,
        Some(4)
    );

    // A late, lower position never moves the row back (Synapse's upsert).
    ids.store()
        .write_position(&DatabaseStream::ACCOUNT_DATA, &me, Token(3))
        .await
        .unwrap();
    assert_eq!(
        stream_position(&check, "account_data", "writer").await,
        Some(4)
    );

    // Ids taken in the transaction that writes their rows, which rolls
    // back: finished without a row, nothing written, and the sequence
    // does not give them again.
    let transaction = rows.transaction().await.unwrap();
    let d = ids.take_on(&transaction, 2).await.unwrap();
    assert_eq!(d, [Token(5), Token(6)]);
    transaction.rollback().await.unwrap();
    assert_eq!(ids.rolled_back(&d).unwrap(), Token(6));
    assert_eq!(
        stream_position(&check, "account_data", "writer").await,
        Some(4)
    );
    assert_eq!(ids.take(1).await.unwrap(), [Token(7)]);
}

/// Where a writer is stopped between taking an id and persisting it.
#[derive(Clone, Copy, Debug)]
enum KillPoint {
    /// Ids reserved, the sequence not yet asked.
    Reserved,
    /// The id taken, no row written.
    Taken,
    /// The row written, its transaction open.
    Uncommitted,
    /// The row committed, not yet marked persisted.
    Committed,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_killed_between_taking_and_persisting_never_writes_past_it() {
    let db = TestDb::create("synrep_ids", SCHEMA).await;
    let check = db.client().await;
    for point in [
        KillPoint::Reserved,
        KillPoint::Taken,
        KillPoint::Uncommitted,
        KillPoint::Committed,
    ] {
        // One writer per point, one after the other in one database: the
        // sequence's end is each one's last id when it restarts.
        let writer = format!("writer_{point:?}").to_lowercase();
        let me = name(&writer);
        let ids = load(db.client().await, &writer, &[&writer]).await;
        let mut rows = db.client().await;
        let before = ids.take(1).await.unwrap();
        write_row(&mut rows, &me, before[0]).await;
        let persisted = ids.persisted(&before).await.unwrap();

        // The victim: reserved or taken, then a later write commits and
        // is persisted, which writes a position.
        let mut reservation = None;
        let mut victim = None;
        match point {
            KillPoint::Reserved => reservation = Some(ids.with_ids(|ids| ids.reserve()).unwrap()),
            _ => victim = Some(ids.take(1).await.unwrap()[0]),
        }
        let later = ids.take(1).await.unwrap();
        write_row(&mut rows, &me, later[0]).await;
        let announced = ids.persisted(&later).await.unwrap();
        assert_eq!(announced, persisted, "{point:?}: passed an id in flight");

        match point {
            KillPoint::Reserved | KillPoint::Taken => {}
            KillPoint::Uncommitted => {
                let victim = victim.unwrap();
                let transaction = rows.transaction().await.unwrap();
                transaction
                    .execute(
                        "INSERT INTO account_data (user_id, account_data_type, stream_id, content, \
                         instance_name) VALUES ('@victim:example.com', 't', $1, '{}', $2)",
                        &[&victim.0, &writer],
                    )
                    .await
                    .unwrap();
                // Killed with the transaction open: PostgreSQL rolls it
                // back when the connection goes.
                std::mem::forget(transaction);
            }
            KillPoint::Committed => write_row(&mut rows, &me, victim.unwrap()).await,
        }
        // Killed: nothing more of this writer runs.
        let _never_given_back = reservation;
        drop(ids);
        drop(rows);

        let position = stream_position(&check, "account_data", &writer).await;
        assert_eq!(
            position,
            Some(persisted.0),
            "{point:?}: stream_positions moved past what was persisted"
        );
        if let Some(victim) = victim {
            assert!(position < Some(victim.0), "{point:?}");
        }

        // Restarted: its next id is above every id it took before, and
        // its position is the sequence's end (Synapse's startup).
        let ids = load(db.client().await, &writer, &[&writer]).await;
        assert_eq!(
            ids.with_ids(|ids| ids.own_position()),
            later[0],
            "{point:?}"
        );
        let next = ids.take(1).await.unwrap()[0];
        assert!(next > later[0], "{point:?}: {next} reused");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_reads_the_positions_back_and_deletes_former_writers() {
    let db = TestDb::create("synrep_ids", SCHEMA).await;
    let client = db.client().await;
    client
        .batch_execute(
            "INSERT INTO stream_positions VALUES \
                ('account_data', 'gone', 3), ('account_data', 'w1', 5), \
                ('account_data', 'me', 4), ('receipts', 'gone', 7);
             INSERT INTO account_data VALUES \
                ('@a:x', 't', 4, '{}', 'me'), ('@b:x', 't', 5, '{}', 'w1'), \
                ('@c:x', 't', 7, '{}', 'w1'), ('@d:x', 't', 2, '{}', NULL);
             INSERT INTO room_tags_revisions VALUES ('@a:x', '!r:x', 6, 'w1');
             INSERT INTO room_account_data VALUES ('@a:x', '!r:x', 't', 8, '{}', NULL);
             SELECT setval('account_data_sequence', 9, true);",
        )
        .await
        .unwrap();
    let ids = load(db.client().await, "me", &["me", "w1"]).await;
    // The former writer's row is gone; another stream's is not.
    let rows: Vec<(String, String, i64)> = client
        .query(
            "SELECT stream_name, instance_name, stream_id FROM stream_positions ORDER BY 1, 2",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    assert_eq!(
        rows,
        [
            ("account_data".to_owned(), "me".to_owned(), 4),
            ("account_data".to_owned(), "w1".to_owned(), 5),
            ("receipts".to_owned(), "gone".to_owned(), 7),
        ]
    );
    ids.with_ids(|ids| {
        // This writer is at the sequence's end; w1 at its highest row
        // above the lowest position; the stream up to 8 with no gap
        // (5, 6, 7 by w1, 8 by an older writer).
        assert_eq!(ids.own_position(), Token(9));
        assert_eq!(ids.position(&name("w1")), Token(8));
        assert_eq!(ids.current_token(), Token(8));
    });
    assert_eq!(ids.take(1).await.unwrap(), [Token(10)]);

    // Not a writer: refused, nothing taken.
    let reader = load(db.client().await, "reader", &["me", "w1"]).await;
    assert!(matches!(
        reader.take(1).await,
        Err(DatabaseIdsError::Ids(StreamIdError::NotAWriter { .. }))
    ));

    // `caches`: any process writes, no stream_positions, the tables' max.
    client
        .batch_execute(
            "INSERT INTO cache_invalidation_stream_by_instance VALUES (12, 'x', 'f', '{a}', 0);
             SELECT setval('cache_invalidation_stream_seq', 12, true);",
        )
        .await
        .unwrap();
    let caches = DatabaseIds::load(
        db.client().await,
        DatabaseStream::CACHES,
        name("me"),
        [name("ignored")],
    )
    .await
    .unwrap();
    assert_eq!(caches.with_ids(|ids| ids.current_token()), Token(12));
    let taken = caches.take(1).await.unwrap();
    assert_eq!(taken, [Token(13)]);
    assert_eq!(caches.persisted(&taken).await.unwrap(), Token(13));
    assert_eq!(stream_position(&client, "caches", "me").await, None);
}

#[test]
fn connects_over_smol() {
    // The same client on smol's socket: no tokio runtime anywhere.
    smol::block_on(async {
        let (client, connection) = match connect_to("postgres").connect(&SmolRuntime).await {
            Ok(connected) => connected,
            Err(error) => panic!(
                "PostgreSQL at {HOST}:{PORT} (user postgres, trust authentication) is needed \
                 by these tests and did not answer: {error}"
            ),
        };
        let task = smol::spawn(connection);
        let row = client.query_one("SELECT 1 + 1", &[]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), 2);
        drop(client);
        task.await.unwrap();
    });
}
