//! Opening the byte streams the drivers speak over: TCP, a Unix socket,
//! or TLS over TCP (feature `tls`), for Redis and for HTTP catch-up alike.
//! It takes the configuration's types ([`Endpoint`], [`TlsConfig`],
//! [`RedisConfig`]) and builds the rustls client from them.

use std::io;
#[cfg(feature = "tls")]
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "tls")]
use futures_rustls::rustls::{self, ClientConfig};

#[cfg(feature = "tls")]
use crate::config::error::snippet;
use crate::config::{ConfigError, Endpoint, RedisConfig, Tls, TlsCache, TlsConfig};
use crate::transport::runtime::{BoxConnection, BoxFuture, Runtime};

/// Opening the byte stream a configuration describes: implemented for
/// [`RedisConfig`]. Import it to call `config.connect(&runtime)`.
///
/// The configuration is data ([`config`](crate::config), the same in every
/// build); this is where it meets the network: TCP, a Unix socket, or TLS
/// over TCP (feature `tls`, rustls), which never falls back to plaintext.
pub trait Dial {
    /// Checks now what [`Dial::connect`] would find wrong without
    /// touching the network: TLS over a Unix socket, TLS without the `tls`
    /// feature, and certificate or key files that do not load (which it
    /// loads, once, for all later connections). Call it at startup to
    /// report a bad configuration before the first connection attempt.
    ///
    /// With sentinels: also an empty list, too long a list or no service
    /// name, and the sentinels' TLS files.
    fn prepare(&self) -> Result<(), ConfigError>;

    /// Opens a connection through `runtime`: TCP, the Unix socket
    /// ([`Runtime::connect_unix`]), or TCP then a TLS handshake, within
    /// the configuration's connect timeout
    /// ([`RedisConfig::connect_timeout`]). Callable any number of times
    /// (to reconnect); TLS certificates are loaded on the first call only.
    ///
    /// Only the byte stream: no `AUTH`, `SELECT` or `HELLO` is sent (the
    /// Redis session does that). A configuration error (see
    /// [`Dial::prepare`]) comes back as an [`io::Error`] of kind
    /// `InvalidInput` (`Unsupported` for a build without `tls`) wrapping
    /// the [`ConfigError`]; a certificate the server presents that does
    /// not verify, as one of kind `InvalidData`; running out of time, as
    /// one of kind `TimedOut`.
    ///
    /// A sentinel configuration ([`RedisConfig::sentinel`]) is not
    /// connected here: finding the master takes several connections over
    /// time, which the [`RedisClient`](crate::transport::RedisClient) makes
    /// (or your own driver, with
    /// [`SentinelDiscovery`](crate::session::sentinel::SentinelDiscovery)); this
    /// fails with kind `Unsupported`.
    fn connect(&self, runtime: &dyn Runtime) -> BoxFuture<'static, io::Result<BoxConnection>>;
}

impl Dial for RedisConfig {
    fn prepare(&self) -> Result<(), ConfigError> {
        if let Some(sentinel) = self.sentinel_config() {
            sentinel.check()?;
            for endpoint in sentinel.sentinels() {
                prepare(endpoint, self.sentinel_tls())?;
            }
            if let Some(tls) = self.dial_tls() {
                // The master is a TCP address the sentinels name.
                let master = Endpoint::Tcp {
                    host: "localhost".to_owned(),
                    port: RedisConfig::DEFAULT_PORT,
                };
                return prepare(&master, Some(tls));
            }
            return Ok(());
        }
        prepare(self.endpoint(), self.dial_tls())
    }

    fn connect(&self, runtime: &dyn Runtime) -> BoxFuture<'static, io::Result<BoxConnection>> {
        if self.sentinel_config().is_some() {
            let error = io::Error::new(
                io::ErrorKind::Unsupported,
                "a redis sentinel configuration connects through RedisClient",
            );
            return Box::pin(async move { Err(error) });
        }
        connect(
            runtime,
            self.endpoint(),
            self.dial_tls(),
            Some(self.connect_timeout()),
        )
    }
}

/// Checks now what [`connect`] would find wrong without touching the
/// network: TLS over a Unix socket, TLS without the `tls` feature,
/// certificate or key files that do not load (loaded here, once).
pub(crate) fn prepare(endpoint: &Endpoint, tls: Tls<'_>) -> Result<(), ConfigError> {
    match (endpoint, tls) {
        (_, None) => Ok(()),
        (Endpoint::Unix(_), Some(_)) => Err(ConfigError::TlsOverUnix { key: None }),
        (Endpoint::Tcp { host, .. }, Some((config, client))) => {
            tls_setup(host, config, client).map(drop)
        }
    }
}

/// Opens a stream to `endpoint` through `runtime`, within `timeout` if
/// given. A configuration error comes back as an [`io::Error`] of kind
/// `InvalidInput` (`Unsupported` for a build without `tls`) wrapping the
/// [`ConfigError`]; a certificate that does not verify, as one of
/// kind `InvalidData`; running out of time, as one of kind `TimedOut`.
pub(crate) fn connect(
    runtime: &dyn Runtime,
    endpoint: &Endpoint,
    tls: Tls<'_>,
    timeout: Option<Duration>,
) -> BoxFuture<'static, io::Result<BoxConnection>> {
    let connect = connect_without_timeout(runtime, endpoint, tls);
    let Some(deadline) = timeout.and_then(|limit| runtime.now().checked_add(limit)) else {
        return connect;
    };
    let sleep = runtime.sleep_until(deadline);
    let (endpoint, limit) = (endpoint.clone(), timeout.unwrap_or_default());
    Box::pin(async move {
        match futures::future::select(connect, sleep).await {
            futures::future::Either::Left((result, _)) => result,
            futures::future::Either::Right(((), _)) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connecting to {endpoint} timed out after {limit:?}"),
            )),
        }
    })
}

fn connect_without_timeout(
    runtime: &dyn Runtime,
    endpoint: &Endpoint,
    tls: Tls<'_>,
) -> BoxFuture<'static, io::Result<BoxConnection>> {
    match (endpoint, tls) {
        (Endpoint::Unix(path), None) => runtime.connect_unix(path),
        (Endpoint::Unix(_), Some(_)) => failed(ConfigError::TlsOverUnix { key: None }),
        (Endpoint::Tcp { host, port }, None) => {
            runtime.connect(&Endpoint::tcp_address(host, *port))
        }
        (Endpoint::Tcp { host, port }, Some((config, client))) => {
            let setup = match tls_setup(host, config, client) {
                Ok(setup) => setup,
                Err(error) => return failed(error),
            };
            let tcp = runtime.connect(&Endpoint::tcp_address(host, *port));
            tls_handshake(setup, tcp)
        }
    }
}

/// The rustls configuration (built once) and the name to verify.
#[cfg(feature = "tls")]
fn tls_setup(host: &str, tls: &TlsConfig, cache: &TlsCache) -> Result<TlsSetup, ConfigError> {
    let name = tls.server_name.as_deref().unwrap_or(host);
    let server_name = rustls::pki_types::ServerName::try_from(name)
        .map_err(|_| ConfigError::InvalidServerName(snippet(name)))?
        .to_owned();
    let client = cache.get_or_build(|| tls::client_config(tls))?;
    Ok(TlsSetup {
        client,
        server_name,
    })
}

#[cfg(not(feature = "tls"))]
fn tls_setup(_host: &str, _tls: &TlsConfig, _cache: &TlsCache) -> Result<TlsSetup, ConfigError> {
    Err(ConfigError::TlsUnavailable)
}

/// What a TLS handshake needs.
#[cfg(feature = "tls")]
struct TlsSetup {
    client: Arc<ClientConfig>,
    server_name: rustls::pki_types::ServerName<'static>,
}

/// Never built: without the `tls` feature, `tls_setup`
/// always fails.
#[cfg(not(feature = "tls"))]
enum TlsSetup {}

#[cfg(feature = "tls")]
fn tls_handshake(
    setup: TlsSetup,
    tcp: BoxFuture<'static, io::Result<BoxConnection>>,
) -> BoxFuture<'static, io::Result<BoxConnection>> {
    Box::pin(async move {
        let tcp = tcp.await?;
        let connector = futures_rustls::TlsConnector::from(setup.client);
        let stream = connector.connect(setup.server_name, tcp).await?;
        Ok(Box::new(stream) as BoxConnection)
    })
}

#[cfg(not(feature = "tls"))]
fn tls_handshake(
    setup: TlsSetup,
    _tcp: BoxFuture<'static, io::Result<BoxConnection>>,
) -> BoxFuture<'static, io::Result<BoxConnection>> {
    match setup {}
}

/// A future that fails at once with a configuration error.
fn failed(error: ConfigError) -> BoxFuture<'static, io::Result<BoxConnection>> {
    let kind = match error {
        ConfigError::TlsUnavailable => io::ErrorKind::Unsupported,
        _ => io::ErrorKind::InvalidInput,
    };
    let error = io::Error::new(kind, error);
    Box::pin(async move { Err(error) })
}

/// Building the rustls client configuration (feature `tls`).
#[cfg(feature = "tls")]
mod tls {
    use std::path::Path;
    use std::sync::Arc;

    use futures_rustls::rustls::pki_types::CertificateDer;
    use futures_rustls::rustls::pki_types::pem::PemObject;
    use futures_rustls::rustls::{ClientConfig, RootCertStore};

    use super::super::pem::{PemFileError, certificates, private_key};
    use crate::config::{ConfigError, TlsConfig};

    /// rustls with the ring provider, its safe default protocol versions,
    /// the configured roots and client certificate.
    pub(super) fn client_config(tls: &TlsConfig) -> Result<ClientConfig, ConfigError> {
        let roots = roots(tls)?;
        let provider = Arc::new(futures_rustls::rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| ConfigError::Tls(error.to_string()))?
            .with_root_certificates(roots);
        match (&tls.certificate_file, &tls.private_key_file) {
            (Some(certificate_file), Some(private_key_file)) => {
                let chain = certificates(certificate_file, "certificate_file")?;
                let key = private_key(private_key_file, "private_key_file")?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|error| ConfigError::Tls(error.to_string()))
            }
            (None, None) => Ok(builder.with_no_client_auth()),
            _ => Err(ConfigError::CertificateWithoutKey { key: None }),
        }
    }

    fn roots(tls: &TlsConfig) -> Result<RootCertStore, ConfigError> {
        let mut roots = RootCertStore::empty();
        if let Some(ca_file) = &tls.ca_file {
            for certificate in certificates(ca_file, "ca_file")? {
                roots
                    .add(certificate)
                    .map_err(|error| file_error("ca_file", ca_file, error))?;
            }
        } else if let Some(ca_path) = &tls.ca_path {
            add_directory(&mut roots, ca_path)?;
        } else {
            let native = rustls_native_certs::load_native_certs();
            let (added, _ignored) = roots.add_parsable_certificates(native.certs);
            if added == 0 {
                let reason = native
                    .errors
                    .first()
                    .map_or_else(|| "none found".to_owned(), ToString::to_string);
                return Err(ConfigError::NoSystemRoots(reason));
            }
        }
        Ok(roots)
    }

    /// Every certificate in the files of `dir` (OpenSSL's `CApath`:
    /// hashed links or plain files); files without any are skipped.
    fn add_directory(roots: &mut RootCertStore, dir: &Path) -> Result<(), ConfigError> {
        let entries = std::fs::read_dir(dir).map_err(|error| file_error("ca_path", dir, error))?;
        let mut paths = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|error| file_error("ca_path", dir, error))?;
            paths.push(entry.path());
        }
        paths.sort();
        for path in paths.iter().filter(|path| path.is_file()) {
            let Ok(iter) = CertificateDer::pem_file_iter(path) else {
                continue;
            };
            let certificates: Vec<_> = iter.map_while(Result::ok).collect();
            roots.add_parsable_certificates(certificates);
        }
        if roots.is_empty() {
            return Err(ConfigError::TlsFile {
                what: "ca_path",
                path: dir.to_owned(),
                reason: "no CA certificate found in the directory".to_owned(),
            });
        }
        Ok(())
    }

    impl From<PemFileError> for ConfigError {
        fn from(error: PemFileError) -> ConfigError {
            let PemFileError { what, path, reason } = error;
            ConfigError::TlsFile { what, path, reason }
        }
    }

    fn file_error(what: &'static str, path: &Path, reason: impl ToString) -> ConfigError {
        ConfigError::TlsFile {
            what,
            path: path.to_owned(),
            reason: reason.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(feature = "tls")]
    use std::path::Path;

    use super::*;
    #[cfg(feature = "tls")]
    use crate::config::TempFile;

    #[test]
    fn tls_over_unix_is_refused() {
        let config = RedisConfig::unix("/s").with_tls(TlsConfig::default());
        assert!(matches!(
            config.prepare(),
            Err(ConfigError::TlsOverUnix { .. })
        ));
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn tls_without_the_feature_is_refused() {
        let config = RedisConfig::from_url("rediss://h").expect("a valid url");
        let error = config.prepare().expect_err("no tls");
        assert!(matches!(error, ConfigError::TlsUnavailable));
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
                ConfigError::TlsFile {
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
                ConfigError::TlsFile {
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
            Err(ConfigError::CertificateWithoutKey { .. })
        ));

        let tls = TlsConfig {
            server_name: Some("not a name".to_owned()),
            ..TlsConfig::default()
        };
        assert!(matches!(
            RedisConfig::tcp("h", 1).with_tls(tls).prepare(),
            Err(ConfigError::InvalidServerName(_))
        ));
    }

    #[test]
    fn empty_sentinel_configs_are_refused_before_connecting() {
        let config = RedisConfig::sentinel("m", Vec::<(String, u16)>::new());
        assert!(matches!(config.prepare(), Err(ConfigError::NoSentinels)));
        let config = RedisConfig::sentinel("", [("h", 1)]);
        assert!(matches!(
            config.prepare(),
            Err(ConfigError::MissingServiceName { .. })
        ));
        assert!(RedisConfig::sentinel("m", [("h", 1)]).prepare().is_ok());
    }
}
