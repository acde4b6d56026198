//! Opening the byte streams the drivers speak over: TCP, a Unix socket,
//! or TLS over TCP (feature `tls`), for Redis and for HTTP catch-up alike.

use std::io;
use std::path::PathBuf;
#[cfg(feature = "tls")]
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[cfg(feature = "tls")]
use futures_rustls::rustls::{self, ClientConfig};

use crate::transport::redis_config::endpoint::RedisEndpoint;
use crate::transport::redis_config::error::RedisConfigError;
#[cfg(feature = "tls")]
use crate::transport::redis_config::error::snippet;
use crate::transport::runtime::{BoxConnection, BoxFuture, Runtime};

/// TLS to Redis (needs the crate's `tls` feature; rustls underneath).
///
/// The server's certificate is always verified, against the CAs of
/// `ca_file`, or if none is given of `ca_path`, or if neither is given of
/// the system's root store. (Synapse, through Twisted's default client
/// context, does not verify it at all; a certificate Synapse accepts may
/// need its CA given here.) A TLS connection never falls back to
/// plaintext.
///
/// ```
/// use synapse_replication::transport::TlsConfig;
///
/// let mut tls = TlsConfig::default();
/// tls.ca_file = Some("/etc/redis/ca.crt".into());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct TlsConfig {
    /// A PEM file of CA certificates to trust.
    pub ca_file: Option<PathBuf>,
    /// A directory of PEM files of CA certificates to trust (OpenSSL's
    /// `CApath`; every certificate in its files is loaded). Ignored when
    /// `ca_file` is set, as in Synapse.
    pub ca_path: Option<PathBuf>,
    /// A PEM file with the client certificate (and its chain), for a
    /// server that asks for one (`tls-auth-clients`).
    pub certificate_file: Option<PathBuf>,
    /// A PEM file with the client certificate's private key.
    pub private_key_file: Option<PathBuf>,
    /// The name the server's certificate must carry, instead of the host
    /// connected to.
    pub server_name: Option<String>,
}

/// The client side of one [`TlsConfig`]: its rustls configuration, built
/// on first use (certificates are read once) and shared by clones.
#[derive(Clone, Default)]
pub(crate) struct TlsClient {
    #[cfg(feature = "tls")]
    cache: Arc<Mutex<Option<Arc<ClientConfig>>>>,
}

/// A connection's TLS: the settings and their loaded client.
pub(crate) type Tls<'a> = Option<(&'a TlsConfig, &'a TlsClient)>;

/// Checks now what [`connect`] would find wrong without touching the
/// network: TLS over a Unix socket, TLS without the `tls` feature,
/// certificate or key files that do not load (loaded here, once).
pub(crate) fn prepare(endpoint: &RedisEndpoint, tls: Tls<'_>) -> Result<(), RedisConfigError> {
    match (endpoint, tls) {
        (_, None) => Ok(()),
        (RedisEndpoint::Unix(_), Some(_)) => Err(RedisConfigError::TlsOverUnix),
        (RedisEndpoint::Tcp { host, .. }, Some((config, client))) => {
            tls_setup(host, config, client).map(drop)
        }
    }
}

/// Opens a stream to `endpoint` through `runtime`, within `timeout` if
/// given. A configuration error comes back as an [`io::Error`] of kind
/// `InvalidInput` (`Unsupported` for a build without `tls`) wrapping the
/// [`RedisConfigError`]; a certificate that does not verify, as one of
/// kind `InvalidData`; running out of time, as one of kind `TimedOut`.
pub(crate) fn connect(
    runtime: &dyn Runtime,
    endpoint: &RedisEndpoint,
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
    endpoint: &RedisEndpoint,
    tls: Tls<'_>,
) -> BoxFuture<'static, io::Result<BoxConnection>> {
    match (endpoint, tls) {
        (RedisEndpoint::Unix(path), None) => runtime.connect_unix(path),
        (RedisEndpoint::Unix(_), Some(_)) => failed(RedisConfigError::TlsOverUnix),
        (RedisEndpoint::Tcp { host, port }, None) => {
            runtime.connect(&RedisEndpoint::tcp_address(host, *port))
        }
        (RedisEndpoint::Tcp { host, port }, Some((config, client))) => {
            let setup = match tls_setup(host, config, client) {
                Ok(setup) => setup,
                Err(error) => return failed(error),
            };
            let tcp = runtime.connect(&RedisEndpoint::tcp_address(host, *port));
            tls_handshake(setup, tcp)
        }
    }
}

/// The rustls configuration (built once) and the name to verify.
#[cfg(feature = "tls")]
fn tls_setup(
    host: &str,
    tls: &TlsConfig,
    client: &TlsClient,
) -> Result<TlsSetup, RedisConfigError> {
    let name = tls.server_name.as_deref().unwrap_or(host);
    let server_name = rustls::pki_types::ServerName::try_from(name)
        .map_err(|_| RedisConfigError::InvalidServerName(snippet(name)))?
        .to_owned();
    let mut cached = client
        .cache
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let client = match &*cached {
        Some(client) => Arc::clone(client),
        None => {
            let client = Arc::new(tls::client_config(tls)?);
            *cached = Some(Arc::clone(&client));
            client
        }
    };
    Ok(TlsSetup {
        client,
        server_name,
    })
}

#[cfg(not(feature = "tls"))]
fn tls_setup(
    _host: &str,
    _tls: &TlsConfig,
    _client: &TlsClient,
) -> Result<TlsSetup, RedisConfigError> {
    Err(RedisConfigError::TlsUnavailable)
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
fn failed(error: RedisConfigError) -> BoxFuture<'static, io::Result<BoxConnection>> {
    let kind = match error {
        RedisConfigError::TlsUnavailable => io::ErrorKind::Unsupported,
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
    use super::TlsConfig;
    use crate::transport::redis_config::error::RedisConfigError;

    /// rustls with the ring provider, its safe default protocol versions,
    /// the configured roots and client certificate.
    pub(super) fn client_config(tls: &TlsConfig) -> Result<ClientConfig, RedisConfigError> {
        let roots = roots(tls)?;
        let provider = Arc::new(futures_rustls::rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| RedisConfigError::Tls(error.to_string()))?
            .with_root_certificates(roots);
        match (&tls.certificate_file, &tls.private_key_file) {
            (Some(certificate_file), Some(private_key_file)) => {
                let chain = certificates(certificate_file, "certificate_file")?;
                let key = private_key(private_key_file, "private_key_file")?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|error| RedisConfigError::Tls(error.to_string()))
            }
            (None, None) => Ok(builder.with_no_client_auth()),
            _ => Err(RedisConfigError::CertificateWithoutKey),
        }
    }

    fn roots(tls: &TlsConfig) -> Result<RootCertStore, RedisConfigError> {
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
                return Err(RedisConfigError::NoSystemRoots(reason));
            }
        }
        Ok(roots)
    }

    /// Every certificate in the files of `dir` (OpenSSL's `CApath`:
    /// hashed links or plain files); files without any are skipped.
    fn add_directory(roots: &mut RootCertStore, dir: &Path) -> Result<(), RedisConfigError> {
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
            return Err(RedisConfigError::TlsFile {
                what: "ca_path",
                path: dir.to_owned(),
                reason: "no CA certificate found in the directory".to_owned(),
            });
        }
        Ok(())
    }

    impl From<PemFileError> for RedisConfigError {
        fn from(error: PemFileError) -> RedisConfigError {
            let PemFileError { what, path, reason } = error;
            RedisConfigError::TlsFile { what, path, reason }
        }
    }

    fn file_error(what: &'static str, path: &Path, reason: impl ToString) -> RedisConfigError {
        RedisConfigError::TlsFile {
            what,
            path: path.to_owned(),
            reason: reason.to_string(),
        }
    }
}
