//! A database of a test's own on the local PostgreSQL server (127.0.0.1:5432,
//! user `postgres`, trust authentication), created with Synapse's tables
//! and dropped with the test, whatever happens. Included by path by the
//! tests that need it (`#[path = "common/postgres.rs"] mod postgres;`):
//! the rest of `common` needs no database.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use synapse_replication::config::SynapseConfig;
use synapse_replication::transport::TokioRuntime;
use synapse_replication::transport::postgres::PostgresConnect;
use tokio_postgres::Client;

pub const HOST: &str = "127.0.0.1";
pub const PORT: u16 = 5432;

/// How to reach `dbname`, read from a `database` section as Synapse's
/// configuration has it.
pub fn connect_to(dbname: &str) -> PostgresConnect {
    let synapse = SynapseConfig::from_json(&format!(
        r#"{{"server_name": "example.com", "database": {{"name": "psycopg2", "args": {{
            "host": "{HOST}", "port": {PORT}, "user": "postgres", "dbname": "{dbname}",
            "sslmode": "prefer", "connect_timeout": 10, "cp_min": 1
        }}}}}}"#
    ))
    .expect("configuration");
    PostgresConnect::new(synapse.database().expect("database section")).expect("connect")
}

/// A client on tokio, its connection task spawned.
pub async fn client(dbname: &str) -> Client {
    let runtime = TokioRuntime::current().expect("on tokio");
    let (client, connection) = match connect_to(dbname).connect(&runtime).await {
        Ok(connected) => connected,
        Err(error) => panic!(
            "PostgreSQL at {HOST}:{PORT} (user postgres, trust authentication) is needed by \
             these tests and did not answer: {error}. Start it (e.g. `pg_ctlcluster 15 main \
             start`, or `service postgresql start`)."
        ),
    };
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            eprintln!("postgres connection: {error}");
        }
    });
    client
}

static NEXT_DB: AtomicUsize = AtomicUsize::new(0);

/// A database of the test's own, dropped with it.
pub struct TestDb {
    pub name: String,
}

impl TestDb {
    /// A new database named after `prefix` and this process, with
    /// `schema` run in it.
    pub async fn create(prefix: &str, schema: &str) -> TestDb {
        let name = format!(
            "{prefix}_{}_{}",
            std::process::id(),
            NEXT_DB.fetch_add(1, Ordering::Relaxed)
        );
        client("postgres")
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create the test database");
        // From here on Drop removes it, whatever happens.
        let db = TestDb { name };
        db.client()
            .await
            .batch_execute(schema)
            .await
            .expect("create Synapse's tables");
        db
    }

    pub async fn client(&self) -> Client {
        client(&self.name).await
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Synchronous, so that it runs on a panic too; FORCE ends the
        // sessions the test left open. Only this test's database.
        let dropped = Command::new("psql")
            .args(["-h", HOST, "-p", &PORT.to_string(), "-U", "postgres", "-d"])
            .args(["postgres", "-q", "-c"])
            .arg(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .status();
        if !matches!(dropped, Ok(status) if status.success()) {
            eprintln!("could not drop test database {} ({dropped:?})", self.name);
        }
    }
}
