//! Where and how to reach Redis: [`RedisConfig`], read from a URL or from
//! Synapse's `redis:` config section. The connection it opens is the
//! dialer's (`dial.rs`): TCP, a Unix socket, or TLS (feature `tls`).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;

use super::dial::{self, TlsClient, TlsConfig};
use super::runtime::{BoxConnection, BoxFuture, Runtime};
use crate::session::RedisAuth;

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
    #[error("unknown redis url scheme {0:?} (expected redis, rediss, unix or redis+unix)")]
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
    /// rustls refused the configuration (a key that does not match its
    /// certificate, for instance).
    #[error("redis tls setup failed: {0}")]
    Tls(String),
}

/// At most [`SNIPPET_CHARS`] characters of `text`, for an error message.
pub(super) fn snippet(text: &str) -> String {
    let mut chars = text.chars();
    let mut out: String = chars.by_ref().take(SNIPPET_CHARS).collect();
    if chars.next().is_some() {
        out.push('…');
    }
    out
}

/// Where Redis listens.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RedisEndpoint {
    /// A TCP address.
    Tcp {
        /// A name to resolve, or an IP literal (IPv6 without brackets).
        host: String,
        /// The port.
        port: u16,
    },
    /// A Unix domain socket (Redis' `unixsocket`).
    Unix(PathBuf),
}

impl RedisEndpoint {
    /// `host:port`, with brackets around an IPv6 host, as
    /// [`Runtime::connect`] takes it.
    pub(super) fn tcp_address(host: &str, port: u16) -> String {
        if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        }
    }
}

impl fmt::Display for RedisEndpoint {
    /// `host:port` (`[::1]:6379` for IPv6), or `unix:/path`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisEndpoint::Tcp { host, port } => {
                f.write_str(&RedisEndpoint::tcp_address(host, *port))
            }
            RedisEndpoint::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// How to reach Redis: where, the credentials, the database, and TLS.
///
/// Built from a URL ([`RedisConfig::from_url`], or `parse`), from
/// Synapse's `redis:` section ([`RedisConfig::from_synapse`]), or by hand
/// ([`RedisConfig::new`] and the `with_` methods). [`RedisConfig::connect`]
/// opens a connection; call it again to reconnect. Its [`Debug`] output
/// hides the password.
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
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("endpoint", &self.endpoint)
            .field("auth", &self.auth)
            .field("database", &self.database)
            .field("tls", &self.tls)
            .field("connect_timeout", &self.connect_timeout)
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

    /// With this database (`SELECT`; pub/sub ignores it, but Synapse
    /// selects it on its publishing connection).
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

    /// Reads a Redis URL, in the forms redis-rs and redis-py accept:
    ///
    /// - `redis://[[username]:password@]host[:port][/database]`, TCP; the
    ///   host may be an IPv6 literal in brackets, `[::1]`; the port is
    ///   6379 unless given;
    /// - `rediss://...`, the same over TLS, verified against the system's
    ///   root certificates (use [`RedisConfig::with_tls`] for other CAs);
    /// - `unix:///path/to/redis.sock[?db=N&username=U&password=P]` (also
    ///   `unix:/path`, `redis+unix://`, and `user`, `pass` for the
    ///   parameters, as in redis-rs).
    ///
    /// User names, passwords, socket paths and parameter values are
    /// percent-decoded (`%40` is `@`; `+` stays `+`). An empty password is
    /// no password.
    pub fn from_url(url: &str) -> Result<RedisConfig, RedisConfigError> {
        let (scheme, rest) = url.split_once(':').ok_or(RedisConfigError::MissingScheme)?;
        match scheme.to_ascii_lowercase().as_str() {
            "redis" => parse_tcp_url(rest, false),
            "rediss" => parse_tcp_url(rest, true),
            "unix" | "redis+unix" => parse_unix_url(rest),
            _ => {
                let looks_like_scheme = !scheme.is_empty()
                    && scheme
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
                if looks_like_scheme {
                    Err(RedisConfigError::UnknownScheme(snippet(scheme)))
                } else {
                    // Whatever came before the colon may be a password.
                    Err(RedisConfigError::MissingScheme)
                }
            }
        }
    }

    /// Reads Synapse's `redis:` config section, as Synapse 1.163.2 does
    /// (`synapse/config/redis.py`): `path` wins over `host` and `port`;
    /// `password_path` is read now and stripped of surrounding
    /// whitespace, and may not be set together with `password`; the TLS
    /// files apply only with `use_tls`.
    ///
    /// Stricter than Synapse, so that nothing is silently less secure
    /// than configured: `use_tls` with a Unix `path` is refused
    /// ([`RedisConfigError::TlsOverUnix`]; Synapse connects in plaintext),
    /// and the server's certificate is verified (see [`TlsConfig`]).
    /// A section with `enabled: false` gives [`RedisConfigError::Disabled`].
    pub fn from_synapse(section: &SynapseRedisConfig) -> Result<RedisConfig, RedisConfigError> {
        if !section.enabled {
            return Err(RedisConfigError::Disabled);
        }
        let password = section
            .password
            .clone()
            .filter(|password| !password.is_empty());
        let password_path = section
            .password_path
            .as_ref()
            .filter(|path| !path.as_os_str().is_empty());
        let password = match password_path {
            Some(_) if password.is_some() => return Err(RedisConfigError::ConflictingPasswords),
            Some(path) => Some(read_password_file(path)?),
            None => password,
        };
        let username = section
            .username
            .clone()
            .filter(|username| !username.is_empty());
        let auth = match (username, password) {
            (username, Some(password)) => Some(RedisAuth { username, password }),
            (Some(_), None) => return Err(RedisConfigError::UsernameWithoutPassword),
            (None, None) => None,
        };
        let mut config = match &section.path {
            Some(path) if !path.as_os_str().is_empty() => {
                if section.use_tls {
                    return Err(RedisConfigError::TlsOverUnix);
                }
                RedisConfig::unix(path.clone())
            }
            _ => {
                let host = section.host.trim_start_matches('[').trim_end_matches(']');
                if host.is_empty() {
                    return Err(RedisConfigError::MissingHost);
                }
                if section.port == 0 {
                    return Err(RedisConfigError::InvalidPort("0".to_owned()));
                }
                RedisConfig::tcp(host, section.port)
            }
        };
        config.auth = auth;
        config.database = section.dbid;
        if section.use_tls {
            let tls = TlsConfig {
                ca_file: section.ca_file.clone(),
                ca_path: section.ca_path.clone(),
                certificate_file: section.certificate_file.clone(),
                private_key_file: section.private_key_file.clone(),
                server_name: None,
            };
            if tls.certificate_file.is_some() != tls.private_key_file.is_some() {
                return Err(RedisConfigError::CertificateWithoutKey);
            }
            config = config.with_tls(tls);
        }
        Ok(config)
    }

    /// Checks now what [`RedisConfig::connect`] would find wrong without
    /// touching the network: TLS over a Unix socket, TLS without the `tls`
    /// feature, and certificate or key files that do not load (which it
    /// loads, once, for all later connections). Call it at startup to
    /// report a bad configuration before the first connection attempt.
    pub fn prepare(&self) -> Result<(), RedisConfigError> {
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
    pub fn connect(&self, runtime: &dyn Runtime) -> BoxFuture<'static, io::Result<BoxConnection>> {
        dial::connect(
            runtime,
            &self.endpoint,
            self.dial_tls(),
            Some(self.connect_timeout),
        )
    }

    /// The TLS settings with their loaded client, if TLS is configured.
    fn dial_tls(&self) -> dial::Tls<'_> {
        self.tls.as_ref().map(|tls| (tls, &self.tls_client))
    }
}

/// Synapse's `redis:` config section (Synapse 1.163.2,
/// `synapse/config/redis.py`), plus `username` for Redis ACLs, which
/// Synapse lacks. Deserialize it from the homeserver's YAML with the
/// serde format crate of your choice, then hand it to
/// [`RedisConfig::from_synapse`]. Missing keys take Synapse's defaults;
/// unknown keys are ignored, as Synapse ignores them.
///
/// ```
/// use synapse_replication::transport::{RedisConfig, RedisEndpoint, SynapseRedisConfig};
///
/// let section: SynapseRedisConfig =
///     serde_json::from_str(r#"{"enabled": true, "host": "redis.internal", "dbid": 1}"#)?;
/// let config = RedisConfig::from_synapse(&section)?;
/// assert_eq!(
///     config.endpoint(),
///     &RedisEndpoint::Tcp { host: "redis.internal".into(), port: 6379 }
/// );
/// assert_eq!(config.database(), Some(1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct SynapseRedisConfig {
    /// Whether Synapse uses Redis at all (default false).
    pub enabled: bool,
    /// The host (default `localhost`).
    pub host: String,
    /// The port (default 6379).
    pub port: u16,
    /// A Unix socket; when set, `host` and `port` are ignored.
    pub path: Option<PathBuf>,
    /// The database to select.
    pub dbid: Option<u32>,
    /// The password (`requirepass`, or the ACL user's).
    pub password: Option<String>,
    /// A file holding the password; not together with `password`.
    pub password_path: Option<PathBuf>,
    /// The ACL user (not a Synapse setting).
    pub username: Option<String>,
    /// Whether to connect with TLS (default false).
    pub use_tls: bool,
    /// A PEM client certificate, with `use_tls`.
    pub certificate_file: Option<PathBuf>,
    /// The client certificate's PEM private key, with `use_tls`.
    pub private_key_file: Option<PathBuf>,
    /// A PEM file of CAs to trust, with `use_tls`.
    pub ca_file: Option<PathBuf>,
    /// A directory of PEM CA files, with `use_tls` (ignored when
    /// `ca_file` is set).
    pub ca_path: Option<PathBuf>,
}

impl Default for SynapseRedisConfig {
    fn default() -> SynapseRedisConfig {
        SynapseRedisConfig {
            enabled: false,
            host: "localhost".to_owned(),
            port: RedisConfig::DEFAULT_PORT,
            path: None,
            dbid: None,
            password: None,
            password_path: None,
            username: None,
            use_tls: false,
            certificate_file: None,
            private_key_file: None,
            ca_file: None,
            ca_path: None,
        }
    }
}

impl fmt::Debug for SynapseRedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SynapseRedisConfig")
            .field("enabled", &self.enabled)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("path", &self.path)
            .field("dbid", &self.dbid)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("password_path", &self.password_path)
            .field("username", &self.username)
            .field("use_tls", &self.use_tls)
            .field("certificate_file", &self.certificate_file)
            .field("private_key_file", &self.private_key_file)
            .field("ca_file", &self.ca_file)
            .field("ca_path", &self.ca_path)
            .finish()
    }
}

/// The password in `path`, stripped of surrounding whitespace as Synapse
/// strips it.
fn read_password_file(path: &Path) -> Result<String, RedisConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| RedisConfigError::PasswordFile {
        path: path.to_owned(),
        source,
    })?;
    let password = text.trim();
    if password.is_empty() {
        return Err(RedisConfigError::EmptyPasswordFile(path.to_owned()));
    }
    Ok(password.to_owned())
}

/// `//[userinfo@]host[:port][/db]` after `redis:` or `rediss:`.
fn parse_tcp_url(rest: &str, tls: bool) -> Result<RedisConfig, RedisConfigError> {
    let rest = rest
        .strip_prefix("//")
        .ok_or(RedisConfigError::InvalidUrl("expected // after the scheme"))?;
    // The last `@` ends the credentials, so that a password may hold an
    // unescaped `@`, `/` or `?`; nothing after it is ever quoted in an
    // error together with the password.
    let (userinfo, rest) = match rest.rfind('@') {
        Some(at) => (rest.get(..at), rest.get(at + 1..).unwrap_or_default()),
        None => (None, rest),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (host, port) = parse_authority(authority)?;
    if tail.contains('#') {
        return Err(RedisConfigError::InvalidUrl("unexpected #fragment"));
    }
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (tail, None),
    };
    if let Some(query) = query {
        if let Some(parameter) = query.split('&').find(|parameter| !parameter.is_empty()) {
            let name = parameter.split('=').next().unwrap_or_default();
            return Err(RedisConfigError::UnknownParameter(snippet(name)));
        }
    }
    let database = match path.strip_prefix('/') {
        None | Some("") => None,
        Some(database) => Some(parse_database(database)?),
    };
    let auth = match userinfo {
        None => None,
        Some(userinfo) => {
            let (username, password) = match userinfo.split_once(':') {
                Some((username, password)) => (username, Some(password)),
                None => (userinfo, None),
            };
            let username = percent_decode(username, "username")?;
            let password = password
                .map(|password| percent_decode(password, "password"))
                .transpose()?;
            credentials(Some(username), password)?
        }
    };
    let mut config = RedisConfig::tcp(host, port);
    config.auth = auth;
    config.database = database;
    if tls {
        config = config.with_tls(TlsConfig::default());
    }
    Ok(config)
}

/// `host[:port]` or `[ipv6][:port]`.
fn parse_authority(authority: &str) -> Result<(String, u16), RedisConfigError> {
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or_else(|| RedisConfigError::InvalidHost(snippet(authority)))?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(RedisConfigError::InvalidHost(snippet(host)));
        }
        let port = match after {
            "" => None,
            after => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| RedisConfigError::InvalidHost(snippet(authority)))?,
            ),
        };
        (host, port)
    } else {
        match authority.split_once(':') {
            Some((host, port)) => {
                if port.contains(':') {
                    // An IPv6 literal needs brackets.
                    return Err(RedisConfigError::InvalidHost(snippet(authority)));
                }
                (host, Some(port))
            }
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(RedisConfigError::MissingHost);
    }
    if host.contains(['%', ' ', '\\']) {
        return Err(RedisConfigError::InvalidHost(snippet(host)));
    }
    let port = match port {
        None | Some("") => RedisConfig::DEFAULT_PORT,
        Some(port) => parse_port(port)?,
    };
    Ok((host.to_owned(), port))
}

fn parse_port(port: &str) -> Result<u16, RedisConfigError> {
    match port.parse::<u16>() {
        Ok(number) if number != 0 && port.bytes().all(|b| b.is_ascii_digit()) => Ok(number),
        _ => Err(RedisConfigError::InvalidPort(snippet(port))),
    }
}

fn parse_database(database: &str) -> Result<u32, RedisConfigError> {
    if !database.bytes().all(|b| b.is_ascii_digit()) {
        return Err(RedisConfigError::InvalidDatabase(snippet(database)));
    }
    database
        .parse()
        .map_err(|_| RedisConfigError::InvalidDatabase(snippet(database)))
}

/// Credentials from a URL: none, a password, or a user and a password.
fn credentials(
    username: Option<String>,
    password: Option<String>,
) -> Result<Option<RedisAuth>, RedisConfigError> {
    let username = username.filter(|username| !username.is_empty());
    let password = password.filter(|password| !password.is_empty());
    match (username, password) {
        (username, Some(password)) => Ok(Some(RedisAuth { username, password })),
        (Some(_), None) => Err(RedisConfigError::UsernameWithoutPassword),
        (None, None) => Ok(None),
    }
}

/// `///path[?query]`, `//path` or `/path` after `unix:` or `redis+unix:`.
fn parse_unix_url(rest: &str) -> Result<RedisConfig, RedisConfigError> {
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    if rest.contains('#') {
        return Err(RedisConfigError::InvalidUrl("unexpected #fragment"));
    }
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, query),
        None => (rest, ""),
    };
    if path.is_empty() {
        return Err(RedisConfigError::MissingPath);
    }
    if !path.starts_with('/') {
        return Err(RedisConfigError::InvalidUrl(
            "a unix url needs an absolute socket path, as in unix:///run/redis.sock",
        ));
    }
    let path = percent_decode(path, "socket path")?;
    let mut database = None;
    let mut username = None;
    let mut password = None;
    for parameter in query.split('&').filter(|parameter| !parameter.is_empty()) {
        let (name, value) = parameter.split_once('=').unwrap_or((parameter, ""));
        match name {
            "db" => database = Some(parse_database(value)?),
            "username" | "user" => username = Some(percent_decode(value, "username")?),
            "password" | "pass" => password = Some(percent_decode(value, "password")?),
            _ => return Err(RedisConfigError::UnknownParameter(snippet(name))),
        }
    }
    let mut config = RedisConfig::unix(path);
    config.auth = credentials(username, password)?;
    config.database = database;
    Ok(config)
}

/// Decodes `%XX` escapes; the result must be UTF-8.
fn percent_decode(text: &str, part: &'static str) -> Result<String, RedisConfigError> {
    if !text.contains('%') {
        return Ok(text.to_owned());
    }
    let invalid = || RedisConfigError::InvalidPercentEncoding(part);
    let mut bytes = text.bytes();
    let mut out = Vec::with_capacity(text.len());
    while let Some(byte) = bytes.next() {
        if byte != b'%' {
            out.push(byte);
            continue;
        }
        let high = bytes.next().and_then(hex_digit).ok_or_else(invalid)?;
        let low = bytes.next().and_then(hex_digit).ok_or_else(invalid)?;
        out.push((high << 4) | low);
    }
    String::from_utf8(out).map_err(|_| invalid())
}

fn hex_digit(byte: u8) -> Option<u8> {
    char::from(byte)
        .to_digit(16)
        .and_then(|digit| u8::try_from(digit).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> RedisConfig {
        RedisConfig::from_url(text).unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    fn url_error(text: &str) -> RedisConfigError {
        match RedisConfig::from_url(text) {
            Ok(config) => panic!("{text} parsed as {config:?}"),
            Err(error) => error,
        }
    }

    fn tcp(host: &str, port: u16) -> RedisEndpoint {
        RedisEndpoint::Tcp {
            host: host.to_owned(),
            port,
        }
    }

    fn auth(username: Option<&str>, password: &str) -> Option<RedisAuth> {
        Some(RedisAuth {
            username: username.map(str::to_owned),
            password: password.to_owned(),
        })
    }

    #[test]
    fn plain_urls() {
        let config = url("redis://localhost");
        assert_eq!(config.endpoint(), &tcp("localhost", 6379));
        assert_eq!(config.auth(), None);
        assert_eq!(config.database(), None);
        assert_eq!(config.tls(), None);

        assert_eq!(url("redis://localhost/").database(), None);
        assert_eq!(
            url("redis://localhost:").endpoint(),
            &tcp("localhost", 6379)
        );
        assert_eq!(
            url("REDIS://redis.internal:6380/15").endpoint(),
            &tcp("redis.internal", 6380)
        );
        assert_eq!(url("redis://redis.internal:6380/15").database(), Some(15));
        assert_eq!(url("redis://127.0.0.1:1/0").database(), Some(0));
        assert_eq!(
            url("redis://127.0.0.1:65535").endpoint(),
            &tcp("127.0.0.1", 65535)
        );
        assert_eq!(
            "redis://h:7/3".parse::<RedisConfig>().ok(),
            Some(RedisConfig::tcp("h", 7).with_database(3))
        );
    }

    #[test]
    fn credentials_in_urls() {
        assert_eq!(
            url("redis://:secret@h").auth(),
            auth(None, "secret").as_ref()
        );
        assert_eq!(
            url("redis://worker:secret@h:1/2").auth(),
            auth(Some("worker"), "secret").as_ref()
        );
        // A password may hold colons; the last `@` ends it.
        assert_eq!(
            url("redis://u:a:b@c@h").auth(),
            auth(Some("u"), "a:b@c").as_ref()
        );
        assert_eq!(url("redis://u:a:b@c@h").endpoint(), &tcp("h", 6379));
        assert_eq!(url("redis://:@h").auth(), None);
        assert!(matches!(
            url_error("redis://worker@h"),
            RedisConfigError::UsernameWithoutPassword
        ));
        assert!(matches!(
            url_error("redis://worker:@h"),
            RedisConfigError::UsernameWithoutPassword
        ));
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(
            url("redis://us%65r:p%40ss%2Fw%3Ard%25%20x@h").auth(),
            auth(Some("user"), "p@ss/w:rd% x").as_ref()
        );
        // `+` is not a space, and UTF-8 escapes decode.
        assert_eq!(
            url("redis://:a+b%C3%A9@h").auth(),
            auth(None, "a+bé").as_ref()
        );
        assert_eq!(
            url("unix:///run/redis%20dir/redis.sock?password=p%26q").endpoint(),
            &RedisEndpoint::Unix("/run/redis dir/redis.sock".into())
        );
        assert_eq!(
            url("unix:///r.sock?password=p%26q").auth(),
            auth(None, "p&q").as_ref()
        );
        for bad in [
            "redis://:abc%@h",
            "redis://:abc%4@h",
            "redis://:abc%zz@h",
            "redis://:%+1@h",
            "redis://:%ff@h",
        ] {
            match url_error(bad) {
                RedisConfigError::InvalidPercentEncoding("password") => {}
                other => panic!("{bad}: {other:?}"),
            }
        }
        assert!(matches!(
            url_error("redis://%zz:pw@h"),
            RedisConfigError::InvalidPercentEncoding("username")
        ));
        assert!(matches!(
            url_error("unix:///r%zz.sock"),
            RedisConfigError::InvalidPercentEncoding("socket path")
        ));
    }

    #[test]
    fn ipv6_hosts() {
        assert_eq!(url("redis://[::1]").endpoint(), &tcp("::1", 6379));
        assert_eq!(url("redis://[::1]:6380/1").endpoint(), &tcp("::1", 6380));
        assert_eq!(
            url("rediss://:pw@[2001:db8::7]:7000").endpoint(),
            &tcp("2001:db8::7", 7000)
        );
        assert_eq!(tcp("::1", 6380).to_string(), "[::1]:6380");
        assert_eq!(tcp("h", 1).to_string(), "h:1");
        for bad in [
            "redis://[::1",
            "redis://[nope]:1",
            "redis://[::1]x",
            "redis://::1",
        ] {
            assert!(
                matches!(url_error(bad), RedisConfigError::InvalidHost(_)),
                "{bad}"
            );
        }
    }

    #[test]
    fn tls_urls() {
        let config = url("rediss://:pw@redis.example.com:6380/1");
        assert_eq!(config.tls(), Some(&TlsConfig::default()));
        assert_eq!(config.endpoint(), &tcp("redis.example.com", 6380));
        assert_eq!(config.auth(), auth(None, "pw").as_ref());
        assert_eq!(url("RedisS://h").tls(), Some(&TlsConfig::default()));
    }

    #[test]
    fn unix_urls() {
        let socket = RedisEndpoint::Unix("/run/redis/redis.sock".into());
        for text in [
            "unix:///run/redis/redis.sock",
            "unix:/run/redis/redis.sock",
            "redis+unix:///run/redis/redis.sock",
            "unix:///run/redis/redis.sock?",
        ] {
            let config = url(text);
            assert_eq!(config.endpoint(), &socket, "{text}");
            assert_eq!(config.auth(), None, "{text}");
            assert_eq!(config.database(), None, "{text}");
        }
        let config = url("unix:///run/redis/redis.sock?db=3&username=w&password=pw");
        assert_eq!(config.endpoint(), &socket);
        assert_eq!(config.database(), Some(3));
        assert_eq!(config.auth(), auth(Some("w"), "pw").as_ref());
        let config = url("redis+unix:///run/redis/redis.sock?user=w&pass=pw&db=0");
        assert_eq!(config.auth(), auth(Some("w"), "pw").as_ref());
        assert_eq!(config.database(), Some(0));
        assert_eq!(socket.to_string(), "unix:/run/redis/redis.sock");

        assert!(matches!(
            url_error("unix://"),
            RedisConfigError::MissingPath
        ));
        assert!(matches!(url_error("unix:"), RedisConfigError::MissingPath));
        assert!(matches!(
            url_error("unix://run/redis.sock"),
            RedisConfigError::InvalidUrl(_)
        ));
        assert!(matches!(
            url_error("unix:///r.sock?db=x"),
            RedisConfigError::InvalidDatabase(db) if db == "x"
        ));
        assert!(matches!(
            url_error("unix:///r.sock?timeout=3"),
            RedisConfigError::UnknownParameter(name) if name == "timeout"
        ));
        assert!(matches!(
            url_error("unix:///r.sock?user=w"),
            RedisConfigError::UsernameWithoutPassword
        ));
    }

    #[test]
    fn bad_urls() {
        for (text, check) in [
            ("localhost:6379", "unknown redis url scheme \"localhost\""),
            ("http://h", "unknown redis url scheme \"http\""),
            ("redis-sentinel://h", "unknown redis url scheme"),
            ("h", "has no scheme"),
            ("", "has no scheme"),
            ("redis:h", "expected //"),
            ("redis://", "no host"),
            ("redis:///0", "no host"),
            ("redis://:pw@", "no host"),
            ("redis://:6379", "no host"),
            ("redis://h:0", "invalid redis port \"0\""),
            ("redis://h:65536", "invalid redis port \"65536\""),
            ("redis://h:-1", "invalid redis port \"-1\""),
            ("redis://h:+1", "invalid redis port \"+1\""),
            ("redis://h:port", "invalid redis port \"port\""),
            ("redis://h/x", "invalid redis database \"x\""),
            ("redis://h/-1", "invalid redis database \"-1\""),
            ("redis://h/1/2", "invalid redis database \"1/2\""),
            ("redis://h/99999999999", "invalid redis database"),
            (
                "redis://h/0?protocol=resp3",
                "unsupported redis url parameter \"protocol\"",
            ),
            ("redis://h/0#x", "fragment"),
            ("redis://h h", "invalid redis host"),
        ] {
            let message = url_error(text).to_string();
            assert!(message.contains(check), "{text}: {message}");
        }
        let long = format!("redis://h/{}", "x".repeat(200));
        let message = url_error(&long).to_string();
        assert!(message.len() < 120, "{message}");
    }

    #[test]
    fn errors_never_show_the_password() {
        for text in [
            "hunter2",
            "hunter2@h",
            "x:hunter2@h:bad",
            "redis://u:hunter2@h:bad",
            "redis://u:hunter2@h/bad",
            "redis://u:hunter2@[bad",
            "redis://u:hunter2%zz@h",
            "redis://u:hunter2@h?x=1",
            "redis://u:hunter2@h:1/1#f",
            "redis://u:hunter2@",
            "unix:///s?password=hunter2&db=z",
            "unix:///s?password=hunter2&other=1",
            "unix:///s?password=hunter2%z",
        ] {
            let error = url_error(text);
            let shown = format!("{error} {error:?}");
            assert!(!shown.contains("hunter2"), "{text}: {shown}");
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

    fn section(json: &str) -> SynapseRedisConfig {
        serde_json::from_str(json).unwrap_or_else(|error| panic!("{json}: {error}"))
    }

    fn synapse(json: &str) -> Result<RedisConfig, RedisConfigError> {
        RedisConfig::from_synapse(&section(json))
    }

    /// A file in a fresh temporary directory, removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str, contents: &str) -> TempFile {
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

    #[test]
    fn synapse_defaults() {
        let defaults = section("{}");
        assert!(!defaults.enabled);
        assert_eq!(defaults, SynapseRedisConfig::default());
        assert!(matches!(
            RedisConfig::from_synapse(&defaults),
            Err(RedisConfigError::Disabled)
        ));
        let config = synapse(r#"{"enabled": true}"#).expect("valid");
        assert_eq!(config, RedisConfig::tcp("localhost", 6379));
    }

    #[test]
    fn synapse_fields() {
        let config = synapse(
            r#"{"enabled": true, "host": "redis.internal", "port": 6380, "dbid": 2,
                "password": "pw", "unknown_key": [1, 2]}"#,
        )
        .expect("valid");
        assert_eq!(
            config,
            RedisConfig::tcp("redis.internal", 6380)
                .with_database(2)
                .with_auth(RedisAuth {
                    username: None,
                    password: "pw".to_owned()
                })
        );
        let config = synapse(
            r#"{"enabled": true, "host": "h", "port": 1, "path": "/run/redis.sock",
                "username": "worker", "password": "pw"}"#,
        )
        .expect("valid");
        assert_eq!(
            config.endpoint(),
            &RedisEndpoint::Unix("/run/redis.sock".into())
        );
        assert_eq!(config.auth(), auth(Some("worker"), "pw").as_ref());
        // YAML's nulls and empty strings are absent values.
        let config = synapse(
            r#"{"enabled": true, "path": null, "password": "", "dbid": null, "host": "[::1]"}"#,
        )
        .expect("valid");
        assert_eq!(config, RedisConfig::tcp("::1", 6379));
        assert!(matches!(
            synapse(r#"{"enabled": true, "username": "worker"}"#),
            Err(RedisConfigError::UsernameWithoutPassword)
        ));
        assert!(matches!(
            synapse(r#"{"enabled": true, "port": 0}"#),
            Err(RedisConfigError::InvalidPort(_))
        ));
        assert!(matches!(
            synapse(r#"{"enabled": true, "host": ""}"#),
            Err(RedisConfigError::MissingHost)
        ));
        assert!(serde_json::from_str::<SynapseRedisConfig>(r#"{"port": 70000}"#).is_err());
    }

    #[test]
    fn synapse_tls() {
        let config = synapse(
            r#"{"enabled": true, "host": "redis", "use_tls": true,
                "certificate_file": "/c.pem", "private_key_file": "/k.pem",
                "ca_file": "/ca.pem", "ca_path": "/etc/ssl/certs"}"#,
        )
        .expect("valid");
        let tls = config.tls().expect("tls");
        assert_eq!(tls.certificate_file.as_deref(), Some(Path::new("/c.pem")));
        assert_eq!(tls.private_key_file.as_deref(), Some(Path::new("/k.pem")));
        assert_eq!(tls.ca_file.as_deref(), Some(Path::new("/ca.pem")));
        assert_eq!(tls.ca_path.as_deref(), Some(Path::new("/etc/ssl/certs")));
        assert_eq!(tls.server_name, None);
        // The TLS files mean nothing without use_tls, as in Synapse.
        let config = synapse(r#"{"enabled": true, "ca_file": "/ca.pem"}"#).expect("valid");
        assert_eq!(config.tls(), None);
        assert!(matches!(
            synapse(r#"{"enabled": true, "use_tls": true, "certificate_file": "/c.pem"}"#),
            Err(RedisConfigError::CertificateWithoutKey)
        ));
        // Never plaintext when TLS was asked for.
        assert!(matches!(
            synapse(r#"{"enabled": true, "use_tls": true, "path": "/run/redis.sock"}"#),
            Err(RedisConfigError::TlsOverUnix)
        ));
    }

    #[test]
    fn synapse_password_path() {
        let file = TempFile::new("password", "  s3cret pass\n\n");
        let json = format!(
            r#"{{"enabled": true, "password_path": {:?}}}"#,
            file.0.display().to_string()
        );
        let config = synapse(&json).expect("valid");
        assert_eq!(config.auth(), auth(None, "s3cret pass").as_ref());

        let json = format!(
            r#"{{"enabled": true, "password": "other", "password_path": {:?}}}"#,
            file.0.display().to_string()
        );
        assert!(matches!(
            synapse(&json),
            Err(RedisConfigError::ConflictingPasswords)
        ));

        let empty = TempFile::new("empty", "\n");
        let json = format!(
            r#"{{"enabled": true, "password_path": {:?}}}"#,
            empty.0.display().to_string()
        );
        assert!(matches!(
            synapse(&json),
            Err(RedisConfigError::EmptyPasswordFile(_))
        ));

        let missing = file.0.with_file_name("missing");
        let json = format!(
            r#"{{"enabled": true, "password_path": {:?}}}"#,
            missing.display().to_string()
        );
        match synapse(&json) {
            Err(error @ RedisConfigError::PasswordFile { .. }) => {
                assert!(error.to_string().contains("missing"), "{error}");
            }
            other => panic!("{other:?}"),
        }
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
