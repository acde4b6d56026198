//! Where and how to reach Redis: [`RedisConfig`], read from a URL or from
//! Synapse's `redis:` config section. The connection it opens is the
//! dialer's (`dial.rs`): TCP, a Unix socket, or TLS (feature `tls`).

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

pub(super) mod endpoint;
pub(super) mod error;
pub(super) mod sentinel;
mod synapse;
mod url;

pub use endpoint::RedisEndpoint;
pub use error::RedisConfigError;
pub(super) use error::snippet;
pub use sentinel::{DEFAULT_SENTINEL_PORT, SentinelConfig};
pub use synapse::SynapseRedisConfig;

use super::net::dial::{self, TlsClient, TlsConfig};
use super::runtime::{BoxConnection, BoxFuture, Runtime};
use crate::session::RedisAuth;

/// How to reach Redis: where, the credentials, the database, and TLS.
///
/// Built from a URL ([`RedisConfig::from_url`], or `parse`), from
/// Synapse's `redis:` section ([`RedisConfig::from_synapse`]), or by hand
/// ([`RedisConfig::new`] and the `with_` methods). [`RedisConfig::connect`]
/// opens a connection; call it again to reconnect. Its [`Debug`] output
/// hides the password.
///
/// **One Redis, one deployment (per server name).** Redis pub/sub ignores
/// the database number: two deployments with the same server name (the
/// channel prefix) on one Redis hear each other's commands whatever
/// [`database`](RedisConfig::database) says. Give each deployment its own
/// server name, or its own Redis. What can be detected is warned about
/// (rate limited, see [`RedisSession`](crate::session::RedisSession)):
/// `RDATA`/`POSITION` from an instance the configuration does not list as
/// a writer of the stream (rejected, never delivered), and commands under
/// this process's own name that it did not send
/// ([`RedisCounters::impostor_echoes`](crate::session::RedisCounters::impostor_echoes)).
/// Rows of `caches`, which every process writes, cannot be told apart.
///
/// ```
/// use synapse_replication::transport::{RedisConfig, RedisEndpoint};
///
/// let config: RedisConfig = "redis://worker:s%40cret@[::1]:6380/2".parse()?;
/// assert_eq!(
///     config.endpoint(),
///     &RedisEndpoint::Tcp { host: "::1".into(), port: 6380 }
/// );
/// let auth = config.auth().expect("credentials");
/// assert_eq!(auth.username.as_deref(), Some("worker"));
/// assert_eq!(auth.password, "s@cret");
/// assert_eq!(config.database(), Some(2));
/// assert!(!format!("{config:?}").contains("s@cret"));
/// # Ok::<(), synapse_replication::transport::RedisConfigError>(())
/// ```
#[derive(Clone)]
pub struct RedisConfig {
    endpoint: RedisEndpoint,
    auth: Option<RedisAuth>,
    database: Option<u32>,
    tls: Option<TlsConfig>,
    connect_timeout: Duration,
    /// The TLS client, built on first use and shared by clones (reset by
    /// [`RedisConfig::with_tls`]).
    tls_client: TlsClient,
    /// The sentinels that say where the master is, if any.
    sentinel: Option<Box<SentinelConfig>>,
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
    type Err = RedisConfigError;

    fn from_str(url: &str) -> Result<RedisConfig, RedisConfigError> {
        RedisConfig::from_url(url)
    }
}

impl RedisConfig {
    /// Redis' port when none is given.
    pub const DEFAULT_PORT: u16 = 6379;

    /// How long [`RedisConfig::connect`] may take unless told otherwise
    /// (Synapse's connect timeout).
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

    /// `endpoint`, without credentials, database or TLS.
    pub fn new(endpoint: RedisEndpoint) -> RedisConfig {
        RedisConfig {
            endpoint,
            auth: None,
            database: None,
            tls: None,
            connect_timeout: RedisConfig::DEFAULT_CONNECT_TIMEOUT,
            tls_client: TlsClient::default(),
            sentinel: None,
        }
    }

    /// Redis at `host:port` over TCP.
    pub fn tcp(host: impl Into<String>, port: u16) -> RedisConfig {
        RedisConfig::new(RedisEndpoint::Tcp {
            host: host.into(),
            port,
        })
    }

    /// Redis at the Unix socket `path`.
    pub fn unix(path: impl Into<PathBuf>) -> RedisConfig {
        RedisConfig::new(RedisEndpoint::Unix(path.into()))
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
        self.tls_client = TlsClient::default();
        self
    }

    /// With a limit on how long connecting may take, TLS handshake
    /// included (default [`RedisConfig::DEFAULT_CONNECT_TIMEOUT`]). A
    /// peer that accepts the connection but never answers the handshake
    /// (a plaintext server, to a TLS client) is then an error, not a hang.
    #[must_use]
    pub fn with_connect_timeout(mut self, timeout: Duration) -> RedisConfig {
        self.connect_timeout = timeout;
        self
    }

    /// Where Redis listens.
    pub fn endpoint(&self) -> &RedisEndpoint {
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

    /// How long connecting may take.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Checks now what [`RedisConfig::connect`] would find wrong without
    /// touching the network: TLS over a Unix socket, TLS without the `tls`
    /// feature, and certificate or key files that do not load (which it
    /// loads, once, for all later connections). Call it at startup to
    /// report a bad configuration before the first connection attempt.
    ///
    /// With sentinels: also an empty list, too long a list or no service
    /// name, and the sentinels' TLS files.
    pub fn prepare(&self) -> Result<(), RedisConfigError> {
        if let Some(sentinel) = &self.sentinel {
            sentinel.check()?;
            for endpoint in sentinel.sentinels() {
                dial::prepare(endpoint, self.sentinel_tls())?;
            }
            if let Some(tls) = &self.tls {
                // The master is a TCP address the sentinels name.
                let master = RedisEndpoint::Tcp {
                    host: "localhost".to_owned(),
                    port: RedisConfig::DEFAULT_PORT,
                };
                return dial::prepare(&master, Some((tls, &self.tls_client)));
            }
            return Ok(());
        }
        dial::prepare(&self.endpoint, self.dial_tls())
    }

    /// Opens a connection to Redis through `runtime`: TCP, the Unix
    /// socket ([`Runtime::connect_unix`]), or TCP then a TLS handshake.
    /// Callable any number of times (to reconnect); TLS certificates are
    /// loaded on the first call only.
    ///
    /// Only the byte stream: no `AUTH`, `SELECT` or `HELLO` is sent (the
    /// Redis session does that). A configuration error (see
    /// [`RedisConfig::prepare`]) comes back as an [`io::Error`] of kind
    /// `InvalidInput` (`Unsupported` for a build without `tls`) wrapping
    /// the [`RedisConfigError`]; a certificate the server presents that
    /// does not verify, as one of kind `InvalidData`; running out of
    /// [`RedisConfig::connect_timeout`], as one of kind `TimedOut`.
    ///
    /// A sentinel configuration ([`RedisConfig::sentinel`]) is not
    /// connected here: finding the master takes several connections over
    /// time, which the [`RedisClient`](super::RedisClient) makes (or your
    /// own driver, with
    /// [`SentinelDiscovery`](crate::session::SentinelDiscovery)); this
    /// fails with kind `Unsupported`.
    pub fn connect(&self, runtime: &dyn Runtime) -> BoxFuture<'static, io::Result<BoxConnection>> {
        if self.sentinel.is_some() {
            let error = io::Error::new(
                io::ErrorKind::Unsupported,
                "a redis sentinel configuration connects through RedisClient",
            );
            return Box::pin(async move { Err(error) });
        }
        dial::connect(
            runtime,
            &self.endpoint,
            self.dial_tls(),
            Some(self.connect_timeout),
        )
    }

    /// The TLS settings with their loaded client, if TLS is configured.
    pub(crate) fn dial_tls(&self) -> dial::Tls<'_> {
        self.tls.as_ref().map(|tls| (tls, &self.tls_client))
    }

    /// The sentinels' TLS settings with their loaded client.
    pub(crate) fn sentinel_tls(&self) -> dial::Tls<'_> {
        let sentinel = self.sentinel.as_deref()?;
        sentinel.tls.as_ref().map(|tls| (tls, &sentinel.tls_client))
    }
}

#[cfg(test)]
pub(super) mod test_files {
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
    #[cfg(feature = "tls")]
    use std::path::Path;

    #[cfg(feature = "tls")]
    use super::test_files::TempFile;
    use super::*;

    pub(super) fn url(text: &str) -> RedisConfig {
        RedisConfig::from_url(text).unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    pub(super) fn auth(username: Option<&str>, password: &str) -> Option<RedisAuth> {
        Some(RedisAuth {
            username: username.map(str::to_owned),
            password: password.to_owned(),
        })
    }

    pub(super) fn tcp(host: &str, port: u16) -> RedisEndpoint {
        RedisEndpoint::Tcp {
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
            &RedisEndpoint::Unix("/s".into())
        );
    }

    #[test]
    fn tls_over_unix_is_refused() {
        let config = RedisConfig::unix("/s").with_tls(TlsConfig::default());
        assert!(matches!(
            config.prepare(),
            Err(RedisConfigError::TlsOverUnix)
        ));
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn tls_without_the_feature_is_refused() {
        let config = url("rediss://h");
        let error = config.prepare().expect_err("no tls");
        assert!(matches!(error, RedisConfigError::TlsUnavailable));
        assert!(error.to_string().contains("`tls` feature"), "{error}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_file_errors() {
        let missing = TlsConfig {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..TlsConfig::default()
        };
        let error = RedisConfig::tcp("h", 1)
            .with_tls(missing)
            .prepare()
            .expect_err("missing ca");
        assert!(
            matches!(
                error,
                RedisConfigError::TlsFile {
                    what: "ca_file",
                    ..
                }
            ),
            "{error}"
        );

        let not_pem = TempFile::new("ca.pem", "not a certificate\n");
        let tls = TlsConfig {
            ca_file: Some(not_pem.0.clone()),
            ..TlsConfig::default()
        };
        let error = RedisConfig::tcp("h", 1)
            .with_tls(tls)
            .prepare()
            .expect_err("no certificate");
        assert!(error.to_string().contains("no certificate"), "{error}");

        let dir = TempFile::new("README", "nothing here\n");
        let tls = TlsConfig {
            ca_path: dir.0.parent().map(Path::to_owned),
            ..TlsConfig::default()
        };
        let error = RedisConfig::tcp("h", 1)
            .with_tls(tls)
            .prepare()
            .expect_err("empty ca_path");
        assert!(
            matches!(
                error,
                RedisConfigError::TlsFile {
                    what: "ca_path",
                    ..
                }
            ),
            "{error}"
        );

        let tls = TlsConfig {
            certificate_file: Some("/c.pem".into()),
            ..TlsConfig::default()
        };
        assert!(matches!(
            RedisConfig::tcp("h", 1).with_tls(tls).prepare(),
            Err(RedisConfigError::CertificateWithoutKey)
        ));

        let tls = TlsConfig {
            server_name: Some("not a name".to_owned()),
            ..TlsConfig::default()
        };
        assert!(matches!(
            RedisConfig::tcp("h", 1).with_tls(tls).prepare(),
            Err(RedisConfigError::InvalidServerName(_))
        ));
    }
}
