//! [`TlsConfig`]: the client side of TLS, as a user configures it.

use std::any::Any;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

/// The client side of TLS, for every connection this crate opens: to
/// Redis and its sentinels (`rediss://`, Synapse's `use_tls`) and to the
/// HTTPS replication listeners of `instance_map` (`tls: true`). Only the
/// settings: connecting needs the crate's `tls` feature (rustls
/// underneath).
///
/// The server's certificate is always verified, against the CAs of
/// `ca_file`, or if none is given of `ca_path`, or if neither is given of
/// the system's root store. (Synapse, through Twisted's default client
/// context, does not verify Redis' certificate at all; a certificate
/// Synapse accepts may need its CA given here.) A TLS connection never
/// falls back to plaintext.
///
/// ```
/// use synapse_replication::config::TlsConfig;
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
    /// server that asks for one (Redis' `tls-auth-clients`).
    pub certificate_file: Option<PathBuf>,
    /// A PEM file with the client certificate's private key.
    pub private_key_file: Option<PathBuf>,
    /// The name the server's certificate must carry, instead of the host
    /// connected to.
    pub server_name: Option<String>,
}

/// What the dialer builds from one [`TlsConfig`] (its TLS client, with
/// the certificates read), kept so that the files are read once and the
/// result shared by clones. Opaque here: reading files and building the
/// client is the dialer's, in `transport`.
#[derive(Clone, Default)]
pub(crate) struct TlsCache(Arc<Mutex<Option<Arc<dyn Any + Send + Sync>>>>);

impl TlsCache {
    /// The cached value, or the one `build` makes (then cached); an error
    /// is not cached.
    // Used by the dialer of the `tls` feature only.
    #[allow(dead_code)]
    pub(crate) fn get_or_build<T, E>(
        &self,
        build: impl FnOnce() -> Result<T, E>,
    ) -> Result<Arc<T>, E>
    where
        T: Any + Send + Sync,
    {
        let mut cached = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(value) = cached
            .as_ref()
            .and_then(|value| Arc::clone(value).downcast::<T>().ok())
        {
            return Ok(value);
        }
        let value = Arc::new(build()?);
        *cached = Some(Arc::clone(&value) as Arc<dyn Any + Send + Sync>);
        Ok(value)
    }
}

/// A connection's TLS: the settings and what the dialer built from them.
pub(crate) type Tls<'a> = Option<(&'a TlsConfig, &'a TlsCache)>;
