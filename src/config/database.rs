//! Synapse's `database` section: which database the deployment keeps its
//! streams in, and how psycopg2 connects to it ([`DatabaseConfig`]).

use std::fmt;

use super::error::{ConfigError, snippet};

/// The database engine of Synapse's `database.name`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DatabaseEngine {
    /// `psycopg2`: PostgreSQL.
    Postgres,
    /// `sqlite3` (Synapse's default): a single process only.
    Sqlite,
}

impl DatabaseEngine {
    /// The name Synapse's configuration gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            DatabaseEngine::Postgres => "psycopg2",
            DatabaseEngine::Sqlite => "sqlite3",
        }
    }
}

/// Synapse's `database` section, as Synapse 1.163.2 reads it
/// (`synapse/config/database.py`) and psycopg2 connects with it.
///
/// `database.args` are psycopg2's keyword arguments, which are libpq's
/// connection keywords (`host`, `port`, `user`, `password`, `dbname`,
/// `sslmode`, `sslrootcert`, `connect_timeout`, `application_name`,
/// `keepalives_idle`, ...). They are kept as psycopg2 passes them on:
/// every one as text (a YAML number becomes its digits), `database`
/// spelled `dbname` (psycopg2's alias), `null`s dropped; the ones Synapse
/// gives its connection pool instead (`cp_min`, `cp_max`,
/// `cp_reconnect`, ...) are dropped. Unknown ones are kept, for libpq to
/// judge.
///
/// Passwords (`password`, `sslpassword`, and a `dsn` string, which may
/// hold one) never show in `Debug` output or in errors.
///
/// With `databases` (several databases) instead, the one that holds the
/// `main` data store is read: it is where the streams are.
///
/// ```
/// use synapse_replication::config::{DatabaseEngine, SynapseConfig};
///
/// let synapse = SynapseConfig::from_json(r#"{
///     "server_name": "example.com",
///     "database": {
///         "name": "psycopg2",
///         "args": {
///             "user": "synapse", "password": "db-secret", "database": "synapse",
///             "host": "10.0.0.5", "port": 5432, "sslmode": "require",
///             "cp_min": 5, "cp_max": 10
///         }
///     }
/// }"#)?;
/// let database = synapse.database().expect("configured");
/// assert_eq!(database.engine(), DatabaseEngine::Postgres);
/// assert_eq!(database.dbname(), Some("synapse"));
/// assert_eq!(database.port(), Some("5432"));
/// let params: Vec<_> = database.postgres_params()?.collect();
/// assert!(params.contains(&("password", "db-secret")));
/// assert!(!params.iter().any(|(key, _)| key.starts_with("cp_")));
/// assert!(!format!("{database:?}").contains("db-secret"));
/// # Ok::<(), synapse_replication::config::ConfigError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseConfig {
    engine: DatabaseEngine,
    /// The key the section was read from (`database`,
    /// `databases.<name>` or `database_path`), for errors.
    section: String,
    /// Keyword and value, in the order given.
    args: Vec<(String, String)>,
}

/// Arguments whose values are secrets.
fn is_secret(key: &str) -> bool {
    key.contains("password") || key == "dsn"
}

impl DatabaseConfig {
    /// Reads the database sections of Synapse's configuration (`database`,
    /// `databases`, `database_path`), as parsed JSON values: `None` if
    /// there is none (Synapse then refuses to start, unless given a
    /// database on its command line).
    pub(crate) fn from_sections(
        database: Option<&serde_json::Value>,
        databases: Option<&serde_json::Value>,
        database_path: Option<&serde_json::Value>,
    ) -> Result<Option<DatabaseConfig>, ConfigError> {
        // Python's truthiness: an empty section counts as none.
        fn present(value: Option<&serde_json::Value>) -> Option<&serde_json::Value> {
            value.filter(|value| match value {
                serde_json::Value::Null | serde_json::Value::Bool(false) => false,
                serde_json::Value::Object(map) => !map.is_empty(),
                serde_json::Value::String(text) => !text.is_empty(),
                serde_json::Value::Array(items) => !items.is_empty(),
                _ => true,
            })
        }
        let (database, databases, path) = (
            present(database),
            present(databases),
            present(database_path),
        );
        if database.is_some() && databases.is_some() {
            return Err(invalid(
                "databases",
                "cannot be given with database (synapse refuses both)",
            ));
        }
        let mut config = match (database, databases) {
            (Some(section), _) => Some(DatabaseConfig::from_section("database", section)?),
            (None, Some(sections)) => {
                let serde_json::Value::Object(sections) = sections else {
                    return Err(invalid("databases", "expected a map of databases"));
                };
                let mut main = None;
                for (name, section) in sections {
                    let key = format!("databases.{}", snippet(name));
                    if holds_main(&key, section)? && main.is_none() {
                        main = Some(DatabaseConfig::from_section(&key, section)?);
                    }
                }
                if main.is_none() {
                    return Err(invalid(
                        "databases",
                        "no database holds the main data store",
                    ));
                }
                main
            }
            (None, None) => None,
        };
        if let Some(path) = path {
            if databases.is_some() {
                return Err(invalid(
                    "database_path",
                    "cannot be given with databases (synapse refuses both)",
                ));
            }
            let serde_json::Value::String(path) = path else {
                return Err(invalid("database_path", "expected a path"));
            };
            match &mut config {
                // Synapse warns and ignores the path for PostgreSQL.
                Some(config) if config.engine == DatabaseEngine::Postgres => {}
                Some(config) => config.set("database", path.clone()),
                None => {
                    config = Some(DatabaseConfig {
                        engine: DatabaseEngine::Sqlite,
                        section: "database_path".to_owned(),
                        args: vec![("database".to_owned(), path.clone())],
                    })
                }
            }
        }
        Ok(config)
    }

    /// Reads one section: `{name, args}`.
    fn from_section(key: &str, section: &serde_json::Value) -> Result<DatabaseConfig, ConfigError> {
        let serde_json::Value::Object(section) = section else {
            return Err(invalid(key, "expected a map with name and args"));
        };
        let engine = match section.get("name") {
            None | Some(serde_json::Value::Null) => DatabaseEngine::Sqlite,
            Some(serde_json::Value::String(name)) if name == "psycopg2" => DatabaseEngine::Postgres,
            Some(serde_json::Value::String(name)) if name == "sqlite3" => DatabaseEngine::Sqlite,
            Some(serde_json::Value::String(name)) => {
                return Err(invalid(
                    &format!("{key}.name"),
                    &format!(
                        "unsupported database type {:?} (expected psycopg2 or sqlite3)",
                        snippet(name)
                    ),
                ));
            }
            Some(_) => return Err(invalid(&format!("{key}.name"), "expected a string")),
        };
        let mut config = DatabaseConfig {
            engine,
            section: key.to_owned(),
            args: Vec::new(),
        };
        let args = match section.get("args") {
            None | Some(serde_json::Value::Null) => return Ok(config),
            Some(serde_json::Value::Object(args)) => args,
            Some(_) => return Err(invalid(&format!("{key}.args"), "expected a map")),
        };
        for (name, value) in args {
            // Synapse gives these to its connection pool, not to psycopg2.
            if name.starts_with("cp_") {
                continue;
            }
            let arg_key = || format!("{key}.args.{}", snippet(name));
            // As psycopg2 turns a keyword argument into libpq's text
            // (`str(value)`); never quoting a value, which may be a
            // password.
            let text = match value {
                serde_json::Value::Null => continue,
                serde_json::Value::String(text) => text.clone(),
                serde_json::Value::Number(number) => number.to_string(),
                serde_json::Value::Bool(true) => "True".to_owned(),
                serde_json::Value::Bool(false) => "False".to_owned(),
                _ => return Err(invalid(&arg_key(), "expected a string or a number")),
            };
            let name = match (engine, name.as_str()) {
                (DatabaseEngine::Postgres, "database") => "dbname",
                (_, name) => name,
            };
            if config.arg(name).is_some() {
                return Err(invalid(
                    &format!("{key}.args.dbname"),
                    "both database and dbname are given (psycopg2 refuses this)",
                ));
            }
            if engine == DatabaseEngine::Postgres && name == "port" {
                check_port(&text).map_err(|reason| invalid(&arg_key(), reason))?;
            }
            config.args.push((name.to_owned(), text));
        }
        Ok(config)
    }

    fn set(&mut self, name: &str, value: String) {
        match self.args.iter_mut().find(|(key, _)| key == name) {
            Some((_, old)) => *old = value,
            None => self.args.push((name.to_owned(), value)),
        }
    }

    /// The engine (`database.name`; `sqlite3` when absent, as in Synapse).
    pub fn engine(&self) -> DatabaseEngine {
        self.engine
    }

    /// An argument by its libpq name (`dbname` for psycopg2's `database`;
    /// for SQLite, `database` is the file).
    pub fn arg(&self, name: &str) -> Option<&str> {
        self.args
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// `host`: a host name, an address, or a Unix socket directory (a
    /// path), or several, comma-separated.
    pub fn host(&self) -> Option<&str> {
        self.arg("host")
    }

    /// `port`, as text (libpq also takes several, comma-separated).
    pub fn port(&self) -> Option<&str> {
        self.arg("port")
    }

    /// `user`.
    pub fn user(&self) -> Option<&str> {
        self.arg("user")
    }

    /// `password`. Never logged by this crate.
    pub fn password(&self) -> Option<&str> {
        self.arg("password")
    }

    /// `dbname` (or psycopg2's `database`).
    pub fn dbname(&self) -> Option<&str> {
        self.arg("dbname")
    }

    /// `sslmode` (`disable`, `prefer`, `require`, `verify-ca`,
    /// `verify-full`, ...).
    pub fn sslmode(&self) -> Option<&str> {
        self.arg("sslmode")
    }

    /// The connection's keywords and values as libpq takes them (what
    /// psycopg2 would pass on), to build a PostgreSQL client's
    /// configuration from. Passwords are among them: do not log them.
    ///
    /// Refused for SQLite, which Synapse runs only as a single process:
    /// a process that shares the database with Synapse's (a writer of a
    /// stream, a follower reading one) needs PostgreSQL. Refused also for
    /// a `dsn` string, which this crate does not take apart.
    pub fn postgres_params(&self) -> Result<impl Iterator<Item = (&str, &str)> + '_, ConfigError> {
        if self.engine != DatabaseEngine::Postgres {
            let key = match self.section.as_str() {
                "database_path" => "database_path".to_owned(),
                section => format!("{section}.name"),
            };
            return Err(ConfigError::NotPostgres {
                key,
                engine: self.engine.as_str(),
            });
        }
        if self.arg("dsn").is_some() {
            return Err(invalid(
                &format!("{}.args.dsn", self.section),
                "a dsn string is not read: give its parts as args (host, port, user, ...)",
            ));
        }
        Ok(self
            .args
            .iter()
            .map(|(key, value)| (key.as_str(), value.as_str())))
    }
}

impl fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Args<'a>(&'a [(String, String)]);
        impl fmt::Debug for Args<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_map()
                    .entries(self.0.iter().map(|(key, value)| {
                        let value = if is_secret(key) {
                            "<redacted>"
                        } else {
                            value.as_str()
                        };
                        (key, value)
                    }))
                    .finish()
            }
        }
        f.debug_struct("DatabaseConfig")
            .field("engine", &self.engine)
            .field("args", &Args(&self.args))
            .finish()
    }
}

/// Whether a `databases` entry holds the `main` data store (Synapse's
/// default `data_stores` is `[main, state]`).
fn holds_main(key: &str, section: &serde_json::Value) -> Result<bool, ConfigError> {
    match section.get("data_stores") {
        None | Some(serde_json::Value::Null) => Ok(true),
        Some(serde_json::Value::Array(stores)) => Ok(stores.iter().any(|store| store == "main")),
        Some(_) => Err(invalid(
            &format!("{key}.data_stores"),
            "expected a list of data stores",
        )),
    }
}

/// libpq's `port`: a number from 1 to 65535, or several, comma-separated
/// (an empty one means the default).
fn check_port(text: &str) -> Result<(), &'static str> {
    let valid = text
        .split(',')
        .all(|port| port.is_empty() || port.parse::<u16>().is_ok_and(|port| port != 0));
    if valid {
        Ok(())
    } else {
        Err("expected a port from 1 to 65535")
    }
}

fn invalid(key: &str, reason: &str) -> ConfigError {
    ConfigError::InvalidValue {
        key: key.to_owned(),
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(config: serde_json::Value) -> Result<Option<DatabaseConfig>, ConfigError> {
        DatabaseConfig::from_sections(
            config.get("database"),
            config.get("databases"),
            config.get("database_path"),
        )
    }

    #[test]
    fn psycopg2_args_as_psycopg2_passes_them() {
        let database = read(
            json!({"database": {"name": "psycopg2", "txn_limit": 10000, "args": {
                "user": "synapse", "password": "pw", "database": "synapse",
                "host": "/var/run/postgresql", "port": 5433, "cp_min": 5, "cp_max": 10,
                "keepalives_idle": 10, "sslmode": "verify-full", "application_name": null,
                "keepalives": true
            }}}),
        )
        .unwrap()
        .unwrap();
        assert_eq!(database.engine(), DatabaseEngine::Postgres);
        assert_eq!(database.user(), Some("synapse"));
        assert_eq!(database.password(), Some("pw"));
        assert_eq!(database.dbname(), Some("synapse"));
        assert_eq!(database.arg("database"), None);
        assert_eq!(database.host(), Some("/var/run/postgresql"));
        assert_eq!(database.port(), Some("5433"));
        assert_eq!(database.sslmode(), Some("verify-full"));
        assert_eq!(database.arg("keepalives_idle"), Some("10"));
        assert_eq!(database.arg("keepalives"), Some("True"));
        let params: Vec<_> = database.postgres_params().unwrap().collect();
        assert_eq!(
            params,
            [
                ("user", "synapse"),
                ("password", "pw"),
                ("dbname", "synapse"),
                ("host", "/var/run/postgresql"),
                ("port", "5433"),
                ("keepalives_idle", "10"),
                ("sslmode", "verify-full"),
                ("keepalives", "True"),
            ]
        );
    }

    #[test]
    fn sqlite_is_read_but_refused_for_postgres() {
        for config in [
            json!({"database": {"name": "sqlite3", "args": {"database": "/data/homeserver.db"}}}),
            json!({"database": {"args": {"database": "/data/homeserver.db"}}}),
            json!({"database_path": "/data/homeserver.db"}),
        ] {
            let database = read(config.clone()).unwrap().unwrap();
            assert_eq!(database.engine(), DatabaseEngine::Sqlite, "{config}");
            assert_eq!(database.arg("database"), Some("/data/homeserver.db"));
            let error = database.postgres_params().err().unwrap();
            assert!(error.to_string().contains("only on postgresql"), "{error}");
            let key = error.key().unwrap();
            assert!(key == "database.name" || key == "database_path", "{key}");
        }
        assert!(read(json!({})).unwrap().is_none());
        assert!(read(json!({"database": {}})).unwrap().is_none());
    }

    #[test]
    fn databases_gives_the_one_with_the_main_store() {
        let database = read(json!({"databases": {
            "state_db": {"name": "psycopg2", "data_stores": ["state"], "args": {"dbname": "state"}},
            "main_db": {"name": "psycopg2", "data_stores": ["main"], "args": {"dbname": "main"}}
        }}))
        .unwrap()
        .unwrap();
        assert_eq!(database.dbname(), Some("main"));
        // A path is Synapse's for SQLite only: ignored for PostgreSQL.
        let database = read(json!({
            "database": {"name": "psycopg2", "args": {"dbname": "main"}},
            "database_path": "/x.db"
        }))
        .unwrap()
        .unwrap();
        assert_eq!(database.arg("database"), None);
    }

    #[test]
    fn errors_name_the_key() {
        for (config, key) in [
            (json!({"database": "postgres"}), "database"),
            (json!({"database": {"name": "mysql"}}), "database.name"),
            (json!({"database": {"name": 3}}), "database.name"),
            (
                json!({"database": {"name": "psycopg2", "args": []}}),
                "database.args",
            ),
            (
                json!({"database": {"name": "psycopg2", "args": {"port": "x"}}}),
                "database.args.port",
            ),
            (
                json!({"database": {"name": "psycopg2", "args": {"port": 0}}}),
                "database.args.port",
            ),
            (
                json!({"database": {"name": "psycopg2", "args": {"host": ["a"]}}}),
                "database.args.host",
            ),
            (
                json!({"database": {"name": "psycopg2", "args": {"dbname": "a", "database": "b"}}}),
                "database.args.dbname",
            ),
            (
                json!({"database": {"name": "psycopg2"}, "databases": {"x": {}}}),
                "databases",
            ),
            (
                json!({"databases": {"x": {"data_stores": ["state"]}}}),
                "databases",
            ),
            (
                json!({"databases": {"x": {"data_stores": "main"}}}),
                "databases.x.data_stores",
            ),
            (
                json!({"databases": {"x": {"name": "pg"}}}),
                "databases.x.name",
            ),
            (
                json!({"databases": {"x": {}}, "database_path": "/x"}),
                "database_path",
            ),
        ] {
            let error = read(config.clone()).expect_err(&config.to_string());
            assert_eq!(error.key().as_deref(), Some(key), "{config}: {error}");
            assert!(error.to_string().starts_with(key), "{config}: {error}");
        }
        let database = read(json!({"database": {"name": "psycopg2", "args": {"dsn": "x"}}}))
            .unwrap()
            .unwrap();
        let error = database.postgres_params().err().unwrap();
        assert_eq!(error.key().as_deref(), Some("database.args.dsn"));
    }

    #[test]
    fn passwords_never_show() {
        let database = read(json!({"database": {"name": "psycopg2", "args": {
            "password": "hunter2-db", "sslpassword": "hunter2-key",
            "dsn": "password=hunter2-dsn", "user": "synapse"
        }}}))
        .unwrap()
        .unwrap();
        let shown = format!("{database:?} {database:#?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("synapse"), "{shown}");
        // A password of the wrong type is not quoted either.
        for password in [json!(["hunter2"]), json!({"x": "hunter2"})] {
            let error =
                read(json!({"database": {"name": "psycopg2", "args": {"password": password}}}))
                    .unwrap_err();
            let shown = format!("{error} {error:?}");
            assert!(!shown.contains("hunter2"), "{shown}");
            assert_eq!(error.key().as_deref(), Some("database.args.password"));
        }
    }
}
