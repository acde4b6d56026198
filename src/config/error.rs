//! [`ConfigError`]: a configuration a user got wrong.

use std::io;
use std::path::PathBuf;

/// At most this many characters of a bad input are quoted in an error.
const SNIPPET_CHARS: usize = 40;

/// A configuration that cannot be used: Synapse's (`homeserver.yaml`, as
/// JSON), a Redis URL, or settings built by hand.
///
/// Messages say what is wrong, name the key of Synapse's configuration
/// where there is one (`redis.port`, `stream_writers.typing`,
/// `instance_map.worker1.port`; [`ConfigError::key`]), and quote the bad
/// part of the input, truncated. They never quote a password or a secret.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The text is not JSON, or not a map of keys.
    #[error("synapse config: {0}")]
    Json(#[from] serde_json::Error),
    /// A key holds a value of the wrong type or shape.
    #[error("{key}: {reason}")]
    InvalidValue {
        /// The key (`instance_map.worker1.port`), its user-given parts
        /// truncated.
        key: String,
        /// What is wrong with the value.
        reason: String,
    },
    /// A key that is refused because it is not known (`stream_writers`
    /// refuses unknown streams, as Synapse does).
    #[error("unknown key {key}")]
    UnknownKey {
        /// The key (`stream_writers.caches`), truncated.
        key: String,
    },
    /// `server_name` is missing or empty.
    #[error("server_name is missing")]
    MissingServerName,
    /// Both `worker_replication_secret` and
    /// `worker_replication_secret_path` are set (Synapse refuses this
    /// too).
    #[error("worker_replication_secret and worker_replication_secret_path are both set")]
    ConflictingSecrets,
    /// `worker_replication_secret_path` cannot be read.
    #[error("cannot read worker_replication_secret_path {path:?}: {source}")]
    SecretFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A single-writer stream was given several writers, or none.
    #[error(
        "stream_writers.{key}: must only specify one instance to handle `{key}` messages, got {count}"
    )]
    SingleWriter {
        /// The `stream_writers` key.
        key: &'static str,
        /// How many writers were given.
        count: usize,
    },
    /// A multi-writer stream was given an empty list.
    #[error("stream_writers.{key}: must specify at least one instance to handle `{key}` messages")]
    NoWriter {
        /// The `stream_writers` key.
        key: &'static str,
    },
    /// A writer other than the main process has no `instance_map` entry.
    #[error(
        "instance {instance:?} is configured to write {key} but does not appear in `instance_map` config"
    )]
    NotInInstanceMap {
        /// The `stream_writers` key.
        key: &'static str,
        /// The instance, truncated to 64 characters.
        instance: String,
    },
    /// A PostgreSQL connection was asked of a database section that is
    /// not PostgreSQL.
    #[error(
        "{key}: synapse runs workers only on postgresql (psycopg2), not {engine}: \
         a process sharing its database needs postgresql"
    )]
    NotPostgres {
        /// The key that names the engine (`database.name`).
        key: String,
        /// The engine it names (`sqlite3`).
        engine: &'static str,
    },
    /// The URL has no `scheme:` in front.
    #[error("redis url has no scheme (expected redis://, rediss:// or unix://)")]
    MissingScheme,
    /// The URL's scheme is not one this crate speaks.
    #[error(
        "unknown redis url scheme {0:?} (expected redis, rediss, unix, redis+unix, \
         redis+sentinel or rediss+sentinel)"
    )]
    UnknownScheme(String),
    /// The URL is malformed in a way the reason names.
    #[error("malformed redis url: {0}")]
    InvalidUrl(&'static str),
    /// The database is not a number.
    #[error("invalid redis database {0:?} (expected a number)")]
    InvalidDatabase(String),
    /// A `%` not followed by two hex digits, or escapes that decode to
    /// something other than UTF-8, in the part named.
    #[error("invalid percent-encoding in the redis url's {0}")]
    InvalidPercentEncoding(&'static str),
    /// A `?name=value` parameter this crate does not know.
    #[error("unsupported redis url parameter {0:?}")]
    UnknownParameter(String),
    /// A Unix socket URL without a path.
    #[error("redis unix url has no socket path")]
    MissingPath,
    /// No host: in a URL, or an empty `redis.host`.
    #[error("{}no host for redis", at(.key))]
    MissingHost {
        /// The key, when it came from Synapse's configuration.
        key: Option<&'static str>,
    },
    /// The host is not a name or an IP literal.
    #[error("{}invalid redis host {value:?}", at(.key))]
    InvalidHost {
        /// The key, when it came from Synapse's configuration.
        key: Option<&'static str>,
        /// The host, truncated.
        value: String,
    },
    /// The port is not a number from 1 to 65535.
    #[error("{}invalid redis port {value:?}", at(.key))]
    InvalidPort {
        /// The key, when it came from Synapse's configuration.
        key: Option<&'static str>,
        /// The port, truncated.
        value: String,
    },
    /// An ACL user name was given without a password.
    #[error("{}redis username given without a password", at(.key))]
    UsernameWithoutPassword {
        /// The key, when it came from Synapse's configuration.
        key: Option<&'static str>,
    },
    /// `enabled` is false in Synapse's `redis:` section.
    #[error("redis is not enabled in the synapse config (redis.enabled)")]
    Disabled,
    /// Both `password` and `password_path` are set (Synapse refuses this
    /// too).
    #[error("redis.password and redis.password_path are both set")]
    ConflictingPasswords,
    /// The `password_path` file cannot be read.
    #[error("cannot read redis.password_path {path:?}: {source}")]
    PasswordFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The `password_path` file holds nothing but whitespace.
    #[error("redis.password_path {0:?} is empty")]
    EmptyPasswordFile(PathBuf),
    /// TLS was asked for over a Unix socket, which Redis does not offer.
    /// Refused rather than silently connecting in plaintext.
    #[error("{}redis tls cannot be used over a unix socket", at(.key))]
    TlsOverUnix {
        /// The key, when it came from Synapse's configuration.
        key: Option<&'static str>,
    },
    /// TLS was asked for, but this build of the crate has no TLS.
    #[error(
        "tls is configured but synapse-replication was built without its `tls` feature \
         (enable it in Cargo.toml)"
    )]
    TlsUnavailable,
    /// Only one of `certificate_file` and `private_key_file` is set.
    #[error("{}tls certificate_file and private_key_file must be given together", at(.key))]
    CertificateWithoutKey {
        /// The key, when it came from Synapse's configuration.
        key: Option<&'static str>,
    },
    /// A certificate or key file cannot be loaded.
    #[error("cannot load tls {what} {path:?}: {reason}")]
    TlsFile {
        /// The setting that names the file: `ca_file`, `ca_path`,
        /// `certificate_file` or `private_key_file`.
        what: &'static str,
        /// The file (or directory, for `ca_path`).
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// No `ca_file` or `ca_path` was given and the system has no usable
    /// root certificates.
    #[error("no system root certificates for tls: {0} (set ca_file or ca_path)")]
    NoSystemRoots(String),
    /// The name to check the server's certificate against is not a DNS
    /// name or an IP address.
    #[error("invalid tls server name {0:?}")]
    InvalidServerName(String),
    /// rustls refused the configuration (a key that does not match its
    /// certificate, for instance).
    #[error("tls setup failed: {0}")]
    Tls(String),
    /// A sentinel configuration without sentinels.
    #[error("redis sentinel configuration lists no sentinels")]
    NoSentinels,
    /// More sentinels than [`MAX_SENTINELS`](super::MAX_SENTINELS).
    #[error("redis sentinel configuration lists {0} sentinels, more than 16")]
    TooManySentinels(usize),
    /// A sentinel configuration without the master's service name.
    #[error("{}redis sentinel configuration has no service name", at(.key))]
    MissingServiceName {
        /// The key, when it came from Synapse's configuration.
        key: Option<&'static str>,
    },
    /// An entry of the sentinels' allowed masters is not an IP address,
    /// a network, a host name or `*.domain` (see
    /// [`AllowedMasters::parse`](super::AllowedMasters::parse)).
    #[error(
        "{}invalid allowed master {entry:?} (expected an ip address, a network such as \
         10.0.0.0/8, a host name, *.domain, private or *)",
        at(.key)
    )]
    InvalidAllowedMaster {
        /// The key, when it came from Synapse's configuration.
        key: Option<&'static str>,
        /// The entry, truncated.
        entry: String,
    },
    /// A server name to verify the master's certificate against was
    /// given, but the master is not reached over TLS.
    #[error(
        "{}redis sentinel master server name given without tls to the master",
        at(.key)
    )]
    MasterServerNameWithoutTls {
        /// The key, when it came from Synapse's configuration.
        key: Option<&'static str>,
    },
}

impl ConfigError {
    /// The key of Synapse's configuration the error is about, where
    /// there is one (`redis.port`, `stream_writers.typing`).
    pub fn key(&self) -> Option<String> {
        match self {
            ConfigError::InvalidValue { key, .. }
            | ConfigError::UnknownKey { key }
            | ConfigError::NotPostgres { key, .. } => Some(key.clone()),
            ConfigError::MissingServerName => Some("server_name".to_owned()),
            ConfigError::ConflictingSecrets | ConfigError::SecretFile { .. } => {
                Some("worker_replication_secret_path".to_owned())
            }
            ConfigError::SingleWriter { key, .. } | ConfigError::NoWriter { key } => {
                Some(format!("stream_writers.{key}"))
            }
            ConfigError::NotInInstanceMap { instance, .. } => {
                Some(format!("instance_map.{instance}"))
            }
            ConfigError::Disabled => Some("redis.enabled".to_owned()),
            ConfigError::ConflictingPasswords
            | ConfigError::PasswordFile { .. }
            | ConfigError::EmptyPasswordFile(_) => Some("redis.password_path".to_owned()),
            ConfigError::MissingHost { key }
            | ConfigError::InvalidHost { key, .. }
            | ConfigError::InvalidPort { key, .. }
            | ConfigError::UsernameWithoutPassword { key }
            | ConfigError::TlsOverUnix { key }
            | ConfigError::CertificateWithoutKey { key }
            | ConfigError::MissingServiceName { key }
            | ConfigError::InvalidAllowedMaster { key, .. }
            | ConfigError::MasterServerNameWithoutTls { key } => key.map(str::to_owned),
            _ => None,
        }
    }

    /// The same error, said of `at`, a key of Synapse's configuration
    /// (for the errors a URL can make too; the others name their key
    /// already).
    pub(crate) fn at(mut self, at: &'static str) -> ConfigError {
        match &mut self {
            ConfigError::MissingHost { key }
            | ConfigError::InvalidHost { key, .. }
            | ConfigError::InvalidPort { key, .. }
            | ConfigError::UsernameWithoutPassword { key }
            | ConfigError::TlsOverUnix { key }
            | ConfigError::CertificateWithoutKey { key }
            | ConfigError::MissingServiceName { key }
            | ConfigError::InvalidAllowedMaster { key, .. }
            | ConfigError::MasterServerNameWithoutTls { key } => *key = Some(at),
            _ => {}
        }
        self
    }
}

/// `key: `, in front of a message, when there is a key.
fn at(key: &Option<&'static str>) -> String {
    key.map(|key| format!("{key}: ")).unwrap_or_default()
}

/// At most [`SNIPPET_CHARS`] characters of `text`, for an error message.
pub(crate) fn snippet(text: &str) -> String {
    let mut chars = text.chars();
    let mut out: String = chars.by_ref().take(SNIPPET_CHARS).collect();
    if chars.next().is_some() {
        out.push('…');
    }
    out
}
