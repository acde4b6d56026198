//! [`RedisConfigError`]: a configuration that cannot be used.

use std::io;
use std::path::PathBuf;

/// At most this many characters of a bad input are quoted in an error.
const SNIPPET_CHARS: usize = 40;

/// A configuration that cannot be used to reach Redis.
///
/// Messages quote the bad part of the input (truncated), never a password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisConfigError {
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
    /// The URL names no host.
    #[error("redis url has no host")]
    MissingHost,
    /// The host is not a name or an IP literal.
    #[error("invalid redis host {0:?}")]
    InvalidHost(String),
    /// The port is not a number from 1 to 65535.
    #[error("invalid redis port {0:?}")]
    InvalidPort(String),
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
    /// An ACL user name was given without a password.
    #[error("redis username given without a password")]
    UsernameWithoutPassword,
    /// `enabled` is false in Synapse's `redis:` section.
    #[error("redis is not enabled in the synapse config")]
    Disabled,
    /// Both `password` and `password_path` are set (Synapse refuses this
    /// too).
    #[error("redis password and password_path are both set")]
    ConflictingPasswords,
    /// The `password_path` file cannot be read.
    #[error("cannot read redis password_path {path:?}: {source}")]
    PasswordFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The `password_path` file holds nothing but whitespace.
    #[error("redis password_path {0:?} is empty")]
    EmptyPasswordFile(PathBuf),
    /// TLS was asked for over a Unix socket, which Redis does not offer.
    /// Refused rather than silently connecting in plaintext.
    #[error("redis tls cannot be used over a unix socket")]
    TlsOverUnix,
    /// TLS was asked for, but this build of the crate has no TLS.
    #[error(
        "redis tls is configured but synapse-replication was built without its `tls` feature \
         (enable it in Cargo.toml)"
    )]
    TlsUnavailable,
    /// Only one of `certificate_file` and `private_key_file` is set.
    #[error("redis tls certificate_file and private_key_file must be given together")]
    CertificateWithoutKey,
    /// A certificate or key file cannot be loaded.
    #[error("cannot load redis tls {what} {path:?}: {reason}")]
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
    #[error("no system root certificates for redis tls: {0} (set ca_file or ca_path)")]
    NoSystemRoots(String),
    /// The name to check the server's certificate against is not a DNS
    /// name or an IP address.
    #[error("invalid redis tls server name {0:?}")]
    InvalidServerName(String),
    /// A sentinel configuration without sentinels.
    #[error("redis sentinel configuration lists no sentinels")]
    NoSentinels,
    /// More sentinels than [`MAX_SENTINELS`](crate::session::sentinel::MAX_SENTINELS).
    #[error("redis sentinel configuration lists {0} sentinels, more than 16")]
    TooManySentinels(usize),
    /// A sentinel configuration without the master's service name.
    #[error("redis sentinel configuration has no service name")]
    MissingServiceName,
    /// An entry of the sentinels' allowed masters is not an IP address,
    /// a network, a host name or `*.domain` (see
    /// [`AllowedMasters::parse`](crate::session::AllowedMasters::parse)).
    #[error("{0}")]
    InvalidAllowedMaster(#[from] crate::session::AllowListError),
    /// A server name to verify the master's certificate against was
    /// given, but the master is not reached over TLS.
    #[error("redis sentinel master server name given without tls to the master")]
    MasterServerNameWithoutTls,
    /// rustls refused the configuration (a key that does not match its
    /// certificate, for instance).
    #[error("redis tls setup failed: {0}")]
    Tls(String),
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
