//! Synapse's `redis:` config section.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::allow::parse_allowed_masters;
use super::auth::RedisAuth;
use super::error::ConfigError;
use super::redis::RedisConfig;
use super::redis_url::parse_authority_with;
use super::sentinel::DEFAULT_SENTINEL_PORT;
use super::tls::TlsConfig;

impl RedisConfig {
    /// Reads Synapse's `redis:` config section, as Synapse 1.163.2 does
    /// (`synapse/config/redis.py`): `path` wins over `host` and `port`;
    /// `password_path` is read now and stripped of surrounding
    /// whitespace, and may not be set together with `password`; the TLS
    /// files apply only with `use_tls`.
    ///
    /// Stricter than Synapse, so that nothing is silently less secure
    /// than configured: `use_tls` with a Unix `path` is refused
    /// ([`ConfigError::TlsOverUnix`]; Synapse connects in plaintext),
    /// and the server's certificate is verified (see [`TlsConfig`]).
    /// A section with `enabled: false` gives [`ConfigError::Disabled`].
    pub fn from_synapse(section: &SynapseRedisConfig) -> Result<RedisConfig, ConfigError> {
        if !section.enabled {
            return Err(ConfigError::Disabled);
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
            Some(_) if password.is_some() => return Err(ConfigError::ConflictingPasswords),
            Some(path) => Some(read_password_file(path)?),
            None => password,
        };
        let username = section
            .username
            .clone()
            .filter(|username| !username.is_empty());
        let auth = match (username, password) {
            (username, Some(password)) => Some(RedisAuth { username, password }),
            (Some(_), None) => {
                return Err(ConfigError::UsernameWithoutPassword {
                    key: Some("redis.username"),
                });
            }
            (None, None) => None,
        };
        let mut config = match &section.path {
            _ if !section.sentinels.is_empty() => sentinel_config(section)?,
            Some(path) if !path.as_os_str().is_empty() => {
                if section.use_tls {
                    return Err(ConfigError::TlsOverUnix {
                        key: Some("redis.use_tls"),
                    });
                }
                RedisConfig::unix(path.clone())
            }
            _ => {
                let host = section.host.trim_start_matches('[').trim_end_matches(']');
                if host.is_empty() {
                    return Err(ConfigError::MissingHost {
                        key: Some("redis.host"),
                    });
                }
                if section.port == 0 {
                    return Err(ConfigError::InvalidPort {
                        key: Some("redis.port"),
                        value: "0".to_owned(),
                    });
                }
                RedisConfig::tcp(host, section.port)
            }
        };
        config.auth = auth;
        config.database = section.dbid;
        let master_server_name = section
            .sentinel_master_tls_server_name
            .clone()
            .filter(|name| !name.is_empty() && !section.sentinels.is_empty());
        if section.use_tls {
            let mut tls = tls_files(section)?;
            tls.server_name = master_server_name;
            config = config.with_tls(tls);
        } else if master_server_name.is_some() {
            return Err(ConfigError::MasterServerNameWithoutTls {
                key: Some("redis.sentinel_master_tls_server_name"),
            });
        }
        Ok(config)
    }
}

/// The TLS files of the section.
fn tls_files(section: &SynapseRedisConfig) -> Result<TlsConfig, ConfigError> {
    let tls = TlsConfig {
        ca_file: section.ca_file.clone(),
        ca_path: section.ca_path.clone(),
        certificate_file: section.certificate_file.clone(),
        private_key_file: section.private_key_file.clone(),
        server_name: None,
    };
    if tls.certificate_file.is_some() != tls.private_key_file.is_some() {
        return Err(ConfigError::CertificateWithoutKey {
            key: Some("redis.certificate_file"),
        });
    }
    Ok(tls)
}

/// The sentinel form of the section: the sentinels, the service name, the
/// sentinels' credentials and TLS.
fn sentinel_config(section: &SynapseRedisConfig) -> Result<RedisConfig, ConfigError> {
    let service = section
        .sentinel_service_name
        .clone()
        .filter(|name| !name.is_empty())
        .ok_or(ConfigError::MissingServiceName {
            key: Some("redis.sentinel_service_name"),
        })?;
    let sentinels = section
        .sentinels
        .iter()
        .map(|address| {
            parse_authority_with(address, DEFAULT_SENTINEL_PORT)
                .map_err(|error| error.at("redis.sentinels"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut config = RedisConfig::sentinel_endpoints(service, sentinels);
    if !section.sentinel_allowed_masters.is_empty() {
        let allowed = parse_allowed_masters(&section.sentinel_allowed_masters)
            .map_err(|error| error.at("redis.sentinel_allowed_masters"))?;
        config = config.with_sentinel_allowed_masters(allowed);
    }
    let username = section
        .sentinel_username
        .clone()
        .filter(|username| !username.is_empty());
    match (username, section.sentinel_password.clone()) {
        (username, Some(password)) if !password.is_empty() => {
            config = config.with_sentinel_auth(RedisAuth { username, password });
        }
        (Some(_), _) => {
            return Err(ConfigError::UsernameWithoutPassword {
                key: Some("redis.sentinel_username"),
            });
        }
        _ => {}
    }
    if section.sentinel_use_tls {
        config = config.with_sentinel_tls(tls_files(section)?);
    }
    Ok(config)
}

/// Synapse's `redis:` config section (Synapse 1.163.2,
/// `synapse/config/redis.py`), plus `username` for Redis ACLs, which
/// Synapse lacks. Deserialize it from the homeserver's YAML with the
/// serde format crate of your choice, then hand it to
/// [`RedisConfig::from_synapse`]. Missing keys take Synapse's defaults;
/// unknown keys are ignored, as Synapse ignores them.
///
/// ```
/// use synapse_replication::config::{Endpoint, RedisConfig, SynapseRedisConfig};
///
/// let section: SynapseRedisConfig =
///     serde_json::from_str(r#"{"enabled": true, "host": "redis.internal", "dbid": 1}"#)?;
/// let config = RedisConfig::from_synapse(&section)?;
/// assert_eq!(
///     config.endpoint(),
///     &Endpoint::Tcp { host: "redis.internal".into(), port: 6379 }
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
    /// Redis Sentinel (not a Synapse setting; Synapse ignores these keys,
    /// so one section can serve both): the sentinels, as `host` or
    /// `host:port` (26379 by default; IPv6 in brackets). When set, the
    /// master is found through them and followed through failovers, and
    /// `host`, `port` and `path` are not used.
    pub sentinels: Vec<String>,
    /// The master's name, as the sentinels monitor it; needed with
    /// `sentinels`.
    pub sentinel_service_name: Option<String>,
    /// The sentinels' ACL user, if any.
    pub sentinel_username: Option<String>,
    /// The sentinels' password, if any (the data nodes' is `password`).
    pub sentinel_password: Option<String>,
    /// Whether to reach the sentinels with TLS (with the CA and client
    /// certificate files above).
    pub sentinel_use_tls: bool,
    /// The only nodes the sentinels may name as the master: IP addresses,
    /// networks (`10.0.0.0/8`), host names, `*.domain`, `private`, `*`
    /// (see [`AllowedMasters::parse`](super::AllowedMasters::parse)).
    /// Empty: the default, private addresses only (see
    /// [`RedisConfig::sentinel`] for what is trusted).
    pub sentinel_allowed_masters: Vec<String>,
    /// With `use_tls`, the name every master's certificate must carry,
    /// instead of the name a sentinel gives.
    pub sentinel_master_tls_server_name: Option<String>,
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
            sentinels: Vec::new(),
            sentinel_service_name: None,
            sentinel_username: None,
            sentinel_password: None,
            sentinel_use_tls: false,
            sentinel_allowed_masters: Vec::new(),
            sentinel_master_tls_server_name: None,
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
            .field("sentinels", &self.sentinels)
            .field("sentinel_service_name", &self.sentinel_service_name)
            .field("sentinel_username", &self.sentinel_username)
            .field(
                "sentinel_password",
                &self.sentinel_password.as_ref().map(|_| "<redacted>"),
            )
            .field("sentinel_use_tls", &self.sentinel_use_tls)
            .field("sentinel_allowed_masters", &self.sentinel_allowed_masters)
            .field(
                "sentinel_master_tls_server_name",
                &self.sentinel_master_tls_server_name,
            )
            .finish()
    }
}

/// The password in `path`, stripped of surrounding whitespace as Synapse
/// strips it.
fn read_password_file(path: &Path) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::PasswordFile {
        path: path.to_owned(),
        source,
    })?;
    let password = text.trim();
    if password.is_empty() {
        return Err(ConfigError::EmptyPasswordFile(path.to_owned()));
    }
    Ok(password.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Endpoint;
    use crate::config::redis::test_files::TempFile;
    use crate::config::redis::tests::{auth, tcp};

    fn section(json: &str) -> SynapseRedisConfig {
        serde_json::from_str(json).unwrap_or_else(|error| panic!("{json}: {error}"))
    }

    fn synapse(json: &str) -> Result<RedisConfig, ConfigError> {
        RedisConfig::from_synapse(&section(json))
    }

    #[test]
    fn synapse_defaults() {
        let defaults = section("{}");
        assert!(!defaults.enabled);
        assert_eq!(defaults, SynapseRedisConfig::default());
        assert!(matches!(
            RedisConfig::from_synapse(&defaults),
            Err(ConfigError::Disabled)
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
        assert_eq!(config.endpoint(), &Endpoint::Unix("/run/redis.sock".into()));
        assert_eq!(config.auth(), auth(Some("worker"), "pw").as_ref());
        // YAML's nulls and empty strings are absent values.
        let config = synapse(
            r#"{"enabled": true, "path": null, "password": "", "dbid": null, "host": "[::1]"}"#,
        )
        .expect("valid");
        assert_eq!(config, RedisConfig::tcp("::1", 6379));
        assert!(matches!(
            synapse(r#"{"enabled": true, "username": "worker"}"#),
            Err(ConfigError::UsernameWithoutPassword { .. })
        ));
        assert!(matches!(
            synapse(r#"{"enabled": true, "port": 0}"#),
            Err(ConfigError::InvalidPort { .. })
        ));
        assert!(matches!(
            synapse(r#"{"enabled": true, "host": ""}"#),
            Err(ConfigError::MissingHost { .. })
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
            Err(ConfigError::CertificateWithoutKey { .. })
        ));
        // Never plaintext when TLS was asked for.
        assert!(matches!(
            synapse(r#"{"enabled": true, "use_tls": true, "path": "/run/redis.sock"}"#),
            Err(ConfigError::TlsOverUnix { .. })
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
            Err(ConfigError::ConflictingPasswords)
        ));

        let empty = TempFile::new("empty", "\n");
        let json = format!(
            r#"{{"enabled": true, "password_path": {:?}}}"#,
            empty.0.display().to_string()
        );
        assert!(matches!(
            synapse(&json),
            Err(ConfigError::EmptyPasswordFile(_))
        ));

        let missing = file.0.with_file_name("missing");
        let json = format!(
            r#"{{"enabled": true, "password_path": {:?}}}"#,
            missing.display().to_string()
        );
        match synapse(&json) {
            Err(error @ ConfigError::PasswordFile { .. }) => {
                assert!(error.to_string().contains("missing"), "{error}");
            }
            other => panic!("{other:?}"),
        }
    }
    #[test]
    fn synapse_sentinels() {
        let config = synapse(
            r#"{"enabled": true, "password": "data-pw", "dbid": 2,
                "sentinels": ["10.0.0.1", "10.0.0.2:26380", "[::1]"],
                "sentinel_service_name": "mymaster",
                "sentinel_password": "sentinel-pw"}"#,
        )
        .unwrap();
        let sentinels = config.sentinel_config().expect("sentinels");
        assert_eq!(sentinels.service_name(), "mymaster");
        assert_eq!(
            sentinels.sentinels(),
            &[
                tcp("10.0.0.1", 26379),
                tcp("10.0.0.2", 26380),
                tcp("::1", 26379)
            ]
        );
        assert_eq!(sentinels.auth(), auth(None, "sentinel-pw").as_ref());
        assert_eq!(config.auth(), auth(None, "data-pw").as_ref());
        assert_eq!(config.database(), Some(2));
        // The same as the URL form.
        assert_eq!(
            config,
            "redis+sentinel://:data-pw@10.0.0.1,10.0.0.2:26380,[::1]/mymaster/2?sentinel_password=sentinel-pw"
                .parse()
                .unwrap()
        );
        let shown = format!(
            "{:?} {:?}",
            section(r#"{"sentinel_password": "s3cret"}"#),
            config
        );
        assert!(
            !shown.contains("s3cret") && !shown.contains("sentinel-pw"),
            "{shown}"
        );
        assert!(matches!(
            synapse(r#"{"enabled": true, "sentinels": ["h"]}"#),
            Err(ConfigError::MissingServiceName { .. })
        ));
        let config = synapse(
            r#"{"enabled": true, "use_tls": true, "sentinels": ["10.0.0.1"],
                "sentinel_service_name": "m",
                "sentinel_allowed_masters": ["10.0.1.0/24", "redis-0.internal"],
                "sentinel_master_tls_server_name": "redis.internal"}"#,
        )
        .unwrap();
        let allowed = config
            .sentinel_config()
            .expect("sentinels")
            .allowed_masters();
        assert!(allowed.allows("10.0.1.9") && allowed.allows("redis-0.internal"));
        assert!(!allowed.allows("10.0.2.9"));
        assert_eq!(
            config.tls().and_then(|tls| tls.server_name.as_deref()),
            Some("redis.internal")
        );
        assert!(matches!(
            synapse(
                r#"{"enabled": true, "sentinels": ["h"], "sentinel_service_name": "m",
                    "sentinel_allowed_masters": ["not a host"]}"#
            ),
            Err(ConfigError::InvalidAllowedMaster { .. })
        ));
        assert!(matches!(
            synapse(
                r#"{"enabled": true, "sentinels": ["h"], "sentinel_service_name": "m",
                    "sentinel_master_tls_server_name": "redis.internal"}"#
            ),
            Err(ConfigError::MasterServerNameWithoutTls { .. })
        ));
        assert!(matches!(
            synapse(r#"{"enabled": true, "sentinels": ["h:x"], "sentinel_service_name": "m"}"#),
            Err(ConfigError::InvalidPort { .. })
        ));
    }
}
