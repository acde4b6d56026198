//! Where and how to reach Redis: [`RedisConfig`], read from a URL
//! (`redis_url`) or from Synapse's `redis:` section (`synapse_redis`),
//! and its sentinel form (`redis_sentinel`). Only the settings: the connection is the dialer's,
//! in `transport`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use super::auth::RedisAuth;
use super::endpoint::Endpoint;
use super::error::ConfigError;
use super::sentinel::SentinelConfig;
use super::tls::{Tls, TlsCache, TlsConfig};

/// How to reach Redis: where, the credentials, the database, TLS, and how
/// long connecting may take.
///
/// Built from a URL ([`RedisConfig::from_url`], or `parse`), from
/// Synapse's `redis:` section ([`RedisConfig::from_synapse`]), or by hand
/// ([`RedisConfig::new`] and the `with_` methods). The transport's
/// `Dial::connect` opens a connection as it says (`Dial::prepare` checks
/// it first). Its [`Debug`] output hides the password.
///
/// **One Redis, one deployment (per server name).** Redis pub/sub ignores
/// the database number: two deployments with the same server name (the
/// channel prefix) on one Redis hear each other's commands whatever
/// [`database`](RedisConfig::database) says. Give each deployment its own
/// server name, or its own Redis. What can be detected is warned about
/// (rate limited, see the session's `RedisSession`): `RDATA`/`POSITION`
/// from an instance the configuration does not list as a writer of the
/// stream (rejected, never delivered), and commands under this process's
/// own name that it did not send (`RedisCounters::impostor_echoes`). Rows
/// of `caches`, which every process writes, cannot be told apart.
///
/// ```
/// use synapse_replication::config::{Endpoint, RedisConfig};
///
/// let config: RedisConfig = "redis://worker:s%40cret@[::1]:6380/2".parse()?;
/// assert_eq!(
///     config.endpoint(),
///     &Endpoint::Tcp { host: "::1".into(), port: 6380 }
/// );
/// let auth = config.auth().expect("credentials");
/// assert_eq!(auth.username.as_deref(), Some("worker"));
/// assert_eq!(auth.password, "s@cret");
/// assert_eq!(config.database(), Some(2));
/// assert!(!format!("{config:?}").contains("s@cret"));
/// # Ok::<(), synapse_replication::config::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct RedisConfig {
    pub(super) endpoint: Endpoint,
    pub(super) auth: Option<RedisAuth>,
    pub(super) database: Option<u32>,
    pub(super) tls: Option<TlsConfig>,
    pub(super) connect_timeout: Duration,
    /// What the dialer builds from `tls`, built on first use and shared
    /// by clones (reset by [`RedisConfig::with_tls`]).
    pub(super) tls_cache: TlsCache,
    /// The sentinels that say where the master is, if any.
    pub(super) sentinel: Option<Box<SentinelConfig>>,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("endpoint", &self.endpoint)
            .field("auth", &self.auth)
            .field("database", &self.database)
            .field("tls", &self.tls)
            .field("connect_timeout", &self.connect_timeout)
            .field("sentinel", &self.sentinel)
            .finish()
    }
}

impl PartialEq for RedisConfig {
    fn eq(&self, other: &RedisConfig) -> bool {
        self.endpoint == other.endpoint
            && self.auth == other.auth
            && self.database == other.database
            && self.tls == other.tls
            && self.connect_timeout == other.connect_timeout
            && self.sentinel == other.sentinel
    }
}

impl Eq for RedisConfig {}

impl FromStr for RedisConfig {
    type Err = ConfigError;

    fn from_str(url: &str) -> Result<RedisConfig, ConfigError> {
        RedisConfig::from_url(url)
    }
}

impl RedisConfig {
    /// Redis' port when none is given.
    pub const DEFAULT_PORT: u16 = 6379;

    /// How long connecting may take unless told otherwise (10 s).
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

    /// `endpoint`, without credentials, database or TLS.
    pub fn new(endpoint: Endpoint) -> RedisConfig {
        RedisConfig {
            endpoint,
            auth: None,
            database: None,
            tls: None,
            connect_timeout: RedisConfig::DEFAULT_CONNECT_TIMEOUT,
            tls_cache: TlsCache::default(),
            sentinel: None,
        }
    }

    /// Redis at `host:port` over TCP.
    pub fn tcp(host: impl Into<String>, port: u16) -> RedisConfig {
        RedisConfig::new(Endpoint::Tcp {
            host: host.into(),
            port,
        })
    }

    /// Redis at the Unix socket `path`.
    pub fn unix(path: impl Into<PathBuf>) -> RedisConfig {
        RedisConfig::new(Endpoint::Unix(path.into()))
    }

    /// With these credentials (`AUTH`, or `HELLO ... AUTH`).
    #[must_use]
    pub fn with_auth(mut self, auth: RedisAuth) -> RedisConfig {
        self.auth = Some(auth);
        self
    }

    /// With this database (`SELECT`; pub/sub ignores it, so it does not
    /// keep two deployments apart, but Synapse selects it on its publishing
    /// connection).
    #[must_use]
    pub fn with_database(mut self, database: u32) -> RedisConfig {
        self.database = Some(database);
        self
    }

    /// With TLS (needs the `tls` feature to connect).
    #[must_use]
    pub fn with_tls(mut self, tls: TlsConfig) -> RedisConfig {
        self.tls = Some(tls);
        self.tls_cache = TlsCache::default();
        self
    }

    /// With a limit on how long opening one connection may take, TLS
    /// handshake included (default
    /// [`RedisConfig::DEFAULT_CONNECT_TIMEOUT`]); with sentinels, how long
    /// each sentinel and each node it names has to connect and answer. A
    /// peer that accepts the connection but never answers the handshake
    /// (a plaintext server, to a TLS client) is then an error, not a hang.
    /// The one connect timeout of a Redis connection: the dialer applies
    /// it, and the client reconnects with backoff after it.
    #[must_use]
    pub fn with_connect_timeout(mut self, timeout: Duration) -> RedisConfig {
        self.connect_timeout = timeout;
        self
    }

    /// Where Redis listens.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The credentials, if any.
    pub fn auth(&self) -> Option<&RedisAuth> {
        self.auth.as_ref()
    }

    /// The database to select, if any.
    pub fn database(&self) -> Option<u32> {
        self.database
    }

    /// The TLS settings, if TLS is on.
    pub fn tls(&self) -> Option<&TlsConfig> {
        self.tls.as_ref()
    }

    /// How long opening a connection may take.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The TLS settings with what the dialer built from them, if TLS is
    /// configured.
    pub(crate) fn dial_tls(&self) -> Tls<'_> {
        self.tls.as_ref().map(|tls| (tls, &self.tls_cache))
    }

    /// The sentinels' TLS settings with what the dialer built from them.
    pub(crate) fn sentinel_tls(&self) -> Tls<'_> {
        let sentinel = self.sentinel.as_deref()?;
        sentinel.tls.as_ref().map(|tls| (tls, &sentinel.tls_cache))
    }
}

#[cfg(test)]
pub(crate) mod test_files {
    use std::path::PathBuf;

    /// A file in a fresh temporary directory, removed on drop.
    pub(crate) struct TempFile(pub(crate) PathBuf);

    impl TempFile {
        pub(crate) fn new(name: &str, contents: &str) -> TempFile {
            use std::sync::atomic::{AtomicU32, Ordering};
            static COUNT: AtomicU32 = AtomicU32::new(0);
            let dir = std::env::temp_dir().join(format!(
                "synapse-replication-redis-config-{}-{}",
                std::process::id(),
                COUNT.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&dir).expect("temp dir");
            let path = dir.join(name);
            std::fs::write(&path, contents).expect("write temp file");
            TempFile(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            if let Some(dir) = self.0.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::config::SynapseRedisConfig;

    pub(crate) fn url(text: &str) -> RedisConfig {
        RedisConfig::from_url(text).unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    pub(crate) fn auth(username: Option<&str>, password: &str) -> Option<RedisAuth> {
        Some(RedisAuth {
            username: username.map(str::to_owned),
            password: password.to_owned(),
        })
    }

    pub(crate) fn tcp(host: &str, port: u16) -> Endpoint {
        Endpoint::Tcp {
            host: host.to_owned(),
            port,
        }
    }

    #[test]
    fn debug_hides_the_password() {
        let config = url("rediss://worker:hunter2@h:1/2");
        let debug = format!("{config:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains("worker"), "{debug}");

        let section = SynapseRedisConfig {
            enabled: true,
            password: Some("hunter2".to_owned()),
            ..SynapseRedisConfig::default()
        };
        let debug = format!("{section:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains("<redacted>"), "{debug}");
        let debug = format!("{:?}", RedisConfig::from_synapse(&section));
        assert!(!debug.contains("hunter2"), "{debug}");
    }

    #[test]
    fn builders() {
        let tls = TlsConfig {
            server_name: Some("redis.internal".to_owned()),
            ..TlsConfig::default()
        };
        let config = RedisConfig::tcp("10.0.0.1", 6380)
            .with_auth(RedisAuth {
                username: None,
                password: "pw".to_owned(),
            })
            .with_database(4)
            .with_tls(tls.clone());
        assert_eq!(config.endpoint(), &tcp("10.0.0.1", 6380));
        assert_eq!(config.auth(), auth(None, "pw").as_ref());
        assert_eq!(config.database(), Some(4));
        assert_eq!(config.tls(), Some(&tls));
        assert_eq!(
            RedisConfig::unix("/s").endpoint(),
            &Endpoint::Unix("/s".into())
        );
    }
}
