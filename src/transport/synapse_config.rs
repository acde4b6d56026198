//! A Synapse deployment's configuration, read in one call: everything a
//! process joining it needs from `homeserver.yaml`.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;

use crate::writers::{ConfigError, StreamWriters};

use super::redis_config::{RedisConfig, RedisConfigError, SynapseRedisConfig};

/// What a process joining a Synapse deployment needs from Synapse's
/// configuration (`homeserver.yaml`, or the shared part of it every
/// worker reads): the server name, which process writes which stream and
/// where each listens for replication (`stream_writers`, `instance_map`),
/// how to reach Redis (`redis:`), and the replication secret.
///
/// Read it from the YAML's JSON form (turn the YAML into JSON with the
/// YAML library of your choice; this crate has no YAML parser). Unknown
/// keys are ignored, so the whole file can be given.
///
/// ```
/// use synapse_replication::transport::SynapseConfig;
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
}

/// A Synapse configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SynapseConfigError {
    /// The text is not JSON, or a known key has the wrong type.
    #[error("synapse config: {0}")]
    Json(#[from] serde_json::Error),
    /// `server_name` is missing or empty.
    #[error("synapse config: server_name is missing")]
    MissingServerName,
    /// `stream_writers` or `instance_map` is wrong.
    #[error("synapse config: {0}")]
    Writers(#[from] ConfigError),
    /// The `redis:` section is enabled but cannot be used.
    #[error("synapse config: {0}")]
    Redis(#[from] RedisConfigError),
    /// Both `worker_replication_secret` and
    /// `worker_replication_secret_path` are set (Synapse refuses this
    /// too).
    #[error(
        "synapse config: worker_replication_secret and worker_replication_secret_path are both set"
    )]
    ConflictingSecrets,
    /// `worker_replication_secret_path` cannot be read.
    #[error("synapse config: cannot read worker_replication_secret_path {path:?}: {source}")]
    SecretFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The keys read here; the rest of the file is ignored.
#[derive(Deserialize)]
struct Keys {
    #[serde(default)]
    server_name: Option<String>,
    #[serde(default)]
    redis: Option<SynapseRedisConfig>,
    #[serde(default)]
    worker_replication_secret: Option<String>,
    #[serde(default)]
    worker_replication_secret_path: Option<PathBuf>,
}

impl SynapseConfig {
    /// Reads Synapse's configuration from its JSON form.
    pub fn from_json(text: &str) -> Result<SynapseConfig, SynapseConfigError> {
        SynapseConfig::from_value(serde_json::from_str(text)?)
    }

    /// Reads Synapse's configuration from a parsed JSON value.
    ///
    /// As Synapse 1.163.2 does: `redis.enabled` decides whether Redis is
    /// used (and with it, that every process writes `caches`);
    /// `worker_replication_secret_path` is read now and stripped of
    /// surrounding whitespace. See [`StreamWriters::from_value`] and
    /// [`RedisConfig::from_synapse`] for the other sections.
    pub fn from_value(value: serde_json::Value) -> Result<SynapseConfig, SynapseConfigError> {
        let keys = Keys::deserialize(&value)?;
        let server_name = keys
            .server_name
            .filter(|name| !name.is_empty())
            .ok_or(SynapseConfigError::MissingServerName)?;
        let writers = StreamWriters::from_value(value)?;
        let redis = match &keys.redis {
            Some(section) if section.enabled => Some(RedisConfig::from_synapse(section)?),
            _ => None,
        };
        let secret = keys
            .worker_replication_secret
            .filter(|secret| !secret.is_empty());
        let replication_secret = match keys.worker_replication_secret_path {
            Some(_) if secret.is_some() => return Err(SynapseConfigError::ConflictingSecrets),
            Some(path) => match std::fs::read_to_string(&path) {
                Ok(text) => Some(text.trim().to_owned()),
                Err(source) => return Err(SynapseConfigError::SecretFile { path, source }),
            },
            None => secret,
        };
        Ok(SynapseConfig {
            server_name,
            writers: Arc::new(writers),
            redis,
            replication_secret,
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
            .finish()
    }
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
