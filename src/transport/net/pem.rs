//! Loading PEM certificates and private keys (feature `tls`), for the
//! client side's TLS (Redis, HTTP catch-up) and the HTTP server's alike.

use std::path::{Path, PathBuf};

use futures_rustls::rustls::pki_types::pem::{self, PemObject};
use futures_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A certificate or key file that does not load: which setting named it,
/// the file, and why (never the file's contents).
#[derive(Debug)]
pub(crate) struct PemFileError {
    /// The setting that names the file (`certificate_file`...).
    pub(crate) what: &'static str,
    /// The file.
    pub(crate) path: PathBuf,
    /// Why it does not load.
    pub(crate) reason: String,
}

/// All certificates in a PEM file; at least one.
pub(crate) fn certificates(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, PemFileError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|error| file_error(what, path, error))?;
    if certificates.is_empty() {
        return Err(file_error(what, path, "no certificate in the file"));
    }
    Ok(certificates)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file. The
/// parser's own messages are not passed on: they may quote the file.
pub(crate) fn private_key(
    path: &Path,
    what: &'static str,
) -> Result<PrivateKeyDer<'static>, PemFileError> {
    PrivateKeyDer::from_pem_file(path).map_err(|error| {
        let reason = match error {
            pem::Error::Io(error) => error.to_string(),
            pem::Error::NoItemsFound => "no private key in the file".to_owned(),
            _ => "malformed PEM".to_owned(),
        };
        file_error(what, path, reason)
    })
}

fn file_error(what: &'static str, path: &Path, reason: impl ToString) -> PemFileError {
    PemFileError {
        what,
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}
