//! Beside the layers, configuration: everything read from Synapse's own
//! configuration, and where and how to connect. Sans-IO (the one file it
//! reads is a secret or password file Synapse names) and the same in every
//! build: no cargo feature changes it.
//!
//! - [`SynapseConfig`]: a deployment's configuration, read in one call
//!   from `homeserver.yaml` (as JSON): the server name, the replication
//!   secret, and the sections below.
//! - [`StreamWriters`] and [`InstanceLocation`]: `stream_writers` and
//!   `instance_map`, who writes which stream and where each process
//!   listens.
//! - [`RedisConfig`] (with [`RedisAuth`], [`SentinelConfig`] and
//!   [`AllowedMasters`]): where and how to reach Redis, from a URL or from
//!   Synapse's `redis:` section ([`SynapseRedisConfig`]).
//! - [`DatabaseConfig`]: Synapse's `database` section, the PostgreSQL
//!   database a writer of a database-backed stream shares with Synapse's
//!   processes (psycopg2's arguments, passwords kept out of `Debug`).
//! - [`Endpoint`] and [`TlsConfig`]: where a server listens and the
//!   client side of TLS, for Redis and HTTP alike.
//! - [`ConfigError`]: the one error for a configuration a user got wrong,
//!   naming the key.
//!
//! Every layer may use it; it uses none of them but the wire's names.
//! Connecting is the transports' (`transport`, whose dialer takes these
//! types).

mod allow;
mod auth;
mod database;
mod endpoint;
pub(crate) mod error;
mod redis;
mod redis_sentinel;
mod redis_url;
mod sentinel;
mod synapse_redis;
mod tls;
mod writers;

pub use allow::AllowedMasters;
pub use auth::RedisAuth;
pub use database::{DatabaseConfig, DatabaseEngine};
pub use endpoint::Endpoint;
pub use error::ConfigError;
pub use redis::RedisConfig;
pub use sentinel::{DEFAULT_SENTINEL_PORT, MAX_SENTINELS, SentinelConfig};
pub use synapse_redis::SynapseRedisConfig;
pub use tls::TlsConfig;
pub use writers::{InstanceLocation, StreamWriters};

#[cfg(test)]
pub(crate) use redis::test_files::TempFile;
pub(crate) use tls::{Tls, TlsCache};

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::DeserializeOwned;

/// What a process joining a Synapse deployment needs from Synapse's
/// configuration (`homeserver.yaml`, or the shared part of it every
/// worker reads): the server name, which process writes which stream and
/// where each listens for replication (`stream_writers`, `instance_map`),
/// how to reach Redis (`redis:`), the replication secret, and the
/// database (`database:`).
///
/// Read it from the YAML's JSON form (turn the YAML into JSON with the
/// YAML library of your choice; this crate has no YAML parser). Unknown
/// keys are ignored, so the whole file can be given.
///
/// ```
/// use synapse_replication::config::SynapseConfig;
/// use synapse_replication::wire::{InstanceName, StreamName};
///
/// let synapse = SynapseConfig::from_json(r#"{
///     "server_name": "example.com",
///     "redis": {"enabled": true, "host": "10.0.0.2", "password": "redis-secret"},
///     "worker_replication_secret": "replication-secret",
///     "instance_map": {
///         "main": {"host": "10.0.0.1", "port": 9093},
///         "persister1": {"host": "10.0.0.3", "port": 9093}
///     },
///     "stream_writers": {"events": ["persister1"]}
/// }"#)?;
/// assert_eq!(synapse.server_name(), "example.com");
/// assert!(synapse.redis().is_some());
/// assert_eq!(synapse.replication_secret(), Some("replication-secret"));
/// let writers = synapse.writers();
/// assert!(writers.location(&InstanceName::from("persister1")).is_some());
/// // Secrets stay out of Debug output.
/// assert!(!format!("{synapse:?}").contains("secret\""));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct SynapseConfig {
    server_name: String,
    writers: Arc<StreamWriters>,
    redis: Option<RedisConfig>,
    replication_secret: Option<String>,
    database: Option<DatabaseConfig>,
}

impl SynapseConfig {
    /// Reads Synapse's configuration from its JSON form.
    pub fn from_json(text: &str) -> Result<SynapseConfig, ConfigError> {
        SynapseConfig::from_value(serde_json::from_str(text)?)
    }

    /// Reads Synapse's configuration from a parsed JSON value.
    ///
    /// As Synapse 1.163.2 does: `redis.enabled` decides whether Redis is
    /// used (and with it, that every process writes `caches`);
    /// `worker_replication_secret_path` is read now and stripped of
    /// surrounding whitespace. See [`StreamWriters::from_value`],
    /// [`RedisConfig::from_synapse`] and [`DatabaseConfig`] for the other
    /// sections.
    pub fn from_value(value: serde_json::Value) -> Result<SynapseConfig, ConfigError> {
        let keys = serde_json::Map::<String, serde_json::Value>::deserialize(&value)?;
        let server_name = read_key::<String>(&keys, "server_name")?
            .filter(|name| !name.is_empty())
            .ok_or(ConfigError::MissingServerName)?;
        let redis_section = read_key::<SynapseRedisConfig>(&keys, "redis")?;
        let secret = read_key::<String>(&keys, "worker_replication_secret")?
            .filter(|secret| !secret.is_empty());
        let secret_path = read_key::<PathBuf>(&keys, "worker_replication_secret_path")?;
        let database = DatabaseConfig::from_sections(
            keys.get("database"),
            keys.get("databases"),
            keys.get("database_path"),
        )?;
        let writers = StreamWriters::from_value(value)?;
        let redis = match &redis_section {
            Some(section) if section.enabled => Some(RedisConfig::from_synapse(section)?),
            _ => None,
        };
        let replication_secret = match secret_path {
            Some(_) if secret.is_some() => return Err(ConfigError::ConflictingSecrets),
            Some(path) => match std::fs::read_to_string(&path) {
                Ok(text) => Some(text.trim().to_owned()),
                Err(source) => return Err(ConfigError::SecretFile { path, source }),
            },
            None => secret,
        };
        Ok(SynapseConfig {
            server_name,
            writers: Arc::new(writers),
            redis,
            replication_secret,
            database,
        })
    }

    /// The server name: the prefix of the Redis channels, and what a
    /// direct TCP server announces.
    pub fn server_name(&self) -> &str {
        &self.server_name
    }

    /// Who writes which stream, and where each process listens for
    /// replication.
    pub fn writers(&self) -> &Arc<StreamWriters> {
        &self.writers
    }

    /// How to reach Redis, if Redis is enabled.
    pub fn redis(&self) -> Option<&RedisConfig> {
        self.redis.as_ref()
    }

    /// The database (`database`, or the `main` one of `databases`), if
    /// one is configured. See [`DatabaseConfig::postgres_params`] to
    /// connect.
    pub fn database(&self) -> Option<&DatabaseConfig> {
        self.database.as_ref()
    }

    /// The secret every replication HTTP request carries
    /// (`Authorization: Bearer`), if one is configured.
    pub fn replication_secret(&self) -> Option<&str> {
        self.replication_secret.as_deref()
    }
}

impl fmt::Debug for SynapseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SynapseConfig")
            .field("server_name", &self.server_name)
            .field("writers", &self.writers)
            .field("redis", &self.redis)
            .field(
                "replication_secret",
                &self.replication_secret.as_ref().map(|_| "<redacted>"),
            )
            .field("database", &self.database)
            .finish()
    }
}

/// The value of `key`, if present and not `null`; a value of the wrong
/// type is a [`ConfigError::InvalidValue`] that names `key`.
fn read_key<T: DeserializeOwned>(
    keys: &serde_json::Map<String, serde_json::Value>,
    key: &'static str,
) -> Result<Option<T>, ConfigError> {
    match keys.get(key) {
        None => Ok(None),
        Some(value) => Option::<T>::deserialize(value).map_err(|error| {
            let reason = error.to_string();
            // These may hold a password or the secret, in a value of the
            // wrong type (a YAML number): say what was wrong, not what it was.
            let reason = match key {
                "redis" | "worker_replication_secret" | "worker_replication_secret_path" => {
                    without_values(&reason)
                }
                _ => reason,
            };
            ConfigError::InvalidValue {
                key: key.to_owned(),
                reason,
            }
        }),
    }
}

/// A serde message with the values it quotes (between backticks or double
/// quotes) left out.
fn without_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut closing = None;
    for c in message.chars() {
        match closing {
            Some(end) if c == end => {
                closing = None;
                out.push('…');
                out.push(c);
            }
            Some(_) => {}
            None => {
                out.push(c);
                if c == '`' || c == '"' {
                    closing = Some(c);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_config_without_redis() {
        let synapse = SynapseConfig::from_json(r#"{"server_name": "x.org"}"#).unwrap();
        assert_eq!(synapse.server_name(), "x.org");
        assert!(synapse.redis().is_none());
        assert_eq!(synapse.replication_secret(), None);
        assert!(!synapse.writers().redis());
    }

    #[test]
    fn redis_enabled_means_every_process_writes_caches() {
        let synapse =
            SynapseConfig::from_json(r#"{"server_name": "x.org", "redis": {"enabled": true}}"#)
                .unwrap();
        assert!(synapse.redis().is_some());
        assert!(synapse.writers().redis());
    }

    #[test]
    fn errors_name_what_is_wrong() {
        for (text, expected) in [
            ("{", "synapse config: "),
            ("{}", "server_name is missing"),
            (r#"{"server_name": ""}"#, "server_name is missing"),
            (
                r#"{"server_name": "x", "redis": {"enabled": true, "port": 0}}"#,
                "invalid redis port",
            ),
            (
                r#"{"server_name": "x", "worker_replication_secret": "a",
                    "worker_replication_secret_path": "/nonexistent"}"#,
                "both set",
            ),
            (
                r#"{"server_name": "x", "worker_replication_secret_path": "/nonexistent/s"}"#,
                "cannot read worker_replication_secret_path",
            ),
        ] {
            let error = SynapseConfig::from_json(text).unwrap_err().to_string();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn errors_name_the_key() {
        for (text, key) in [
            (r#"{"server_name": 7}"#, "server_name"),
            (
                r#"{"server_name": "x", "redis": {"enabled": true, "port": 0}}"#,
                "redis.port",
            ),
            (
                r#"{"server_name": "x", "redis": {"enabled": true, "host": ""}}"#,
                "redis.host",
            ),
            (r#"{"server_name": "x", "redis": {"port": "80"}}"#, "redis"),
            (
                r#"{"server_name": "x", "redis": {"enabled": true, "sentinels": ["h"]}}"#,
                "redis.sentinel_service_name",
            ),
            (
                r#"{"server_name": "x", "redis": {"enabled": true, "sentinels": ["h:x"],
                    "sentinel_service_name": "m"}}"#,
                "redis.sentinels",
            ),
            (
                r#"{"server_name": "x", "instance_map": {"worker1": {"host": "h", "port": "80"}}}"#,
                "instance_map.worker1.port",
            ),
            (
                r#"{"server_name": "x", "instance_map": {"worker1": {"host": "h"}}}"#,
                "instance_map.worker1.port",
            ),
            (
                r#"{"server_name": "x", "instance_map": {"worker1": 3}}"#,
                "instance_map.worker1",
            ),
            (
                r#"{"server_name": "x", "stream_writers": {"typing": ["a", "b"]},
                    "instance_map": {"a": {"host": "h", "port": 1}, "b": {"host": "h", "port": 2}}}"#,
                "stream_writers.typing",
            ),
            (
                r#"{"server_name": "x", "stream_writers": {"events": null}}"#,
                "stream_writers.events",
            ),
            (
                r#"{"server_name": "x", "stream_writers": {"caches": "master"}}"#,
                "stream_writers.caches",
            ),
            (
                r#"{"server_name": "x", "send_federation": "no"}"#,
                "send_federation",
            ),
            (
                r#"{"server_name": "x", "database": {"name": "psycopg2", "args": {"port": "x"}}}"#,
                "database.args.port",
            ),
        ] {
            let error = SynapseConfig::from_json(text).expect_err(text);
            assert_eq!(error.key().as_deref(), Some(key), "{text}: {error}");
            assert!(error.to_string().contains(key), "{text}: {error}");
        }
        let url = RedisConfig::from_url("redis://h:0").expect_err("port 0");
        assert_eq!(url.key(), None, "{url}");
    }

    #[test]
    fn the_database_password_is_never_shown() {
        let synapse = SynapseConfig::from_json(
            r#"{"server_name": "x", "database": {"name": "psycopg2",
                "args": {"user": "synapse", "password": "db-hunter2", "host": "db"}}}"#,
        )
        .unwrap();
        let database = synapse.database().unwrap();
        assert_eq!(database.password(), Some("db-hunter2"));
        let shown = format!("{synapse:?} {synapse:#?}");
        assert!(!shown.contains("db-hunter2"), "{shown}");
        assert!(shown.contains("host"), "{shown}");
        assert!(
            SynapseConfig::from_json(r#"{"server_name": "x"}"#)
                .unwrap()
                .database()
                .is_none()
        );
    }

    #[test]
    fn a_secret_of_the_wrong_type_is_not_quoted() {
        for text in [
            r#"{"server_name": "x", "redis": {"enabled": true, "password": 918273645}}"#,
            r#"{"server_name": "x", "worker_replication_secret": 918273645}"#,
        ] {
            let error = SynapseConfig::from_json(text).expect_err(text);
            let shown = format!("{error} {error:?}");
            assert!(!shown.contains("918273645"), "{shown}");
            assert!(matches!(error, ConfigError::InvalidValue { .. }), "{shown}");
        }
    }

    #[test]
    fn the_secret_is_read_from_its_file_and_never_shown() {
        let dir = std::env::temp_dir().join(format!("synapse-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        std::fs::write(&path, "  from-a-file-secret\n").unwrap();
        let text = format!(
            r#"{{"server_name": "x", "worker_replication_secret_path": {:?}}}"#,
            path.to_str().unwrap()
        );
        let synapse = SynapseConfig::from_json(&text).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(synapse.replication_secret(), Some("from-a-file-secret"));
        assert!(!format!("{synapse:?} {synapse:#?}").contains("from-a-file"));
    }
}
