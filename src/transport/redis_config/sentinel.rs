//! Redis Sentinel: [`SentinelConfig`], the sentinel form of a
//! [`RedisConfig`], and its URL, `redis+sentinel://`.

use std::fmt;

use crate::session::RedisAuth;
use crate::session::sentinel::MAX_SENTINELS;

use super::endpoint::RedisEndpoint;
use super::url::{credentials, parse_authority_with, parse_database, percent_decode};
use super::{RedisConfig, RedisConfigError, TlsConfig, snippet};
use crate::transport::dial::TlsClient;

/// A sentinel's port when none is given.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// Where the sentinels of a high-availability Redis are, and how to talk
/// to them: the master's service name, the sentinels' addresses, their
/// credentials and TLS (the data nodes' are the [`RedisConfig`]'s own).
///
/// Made by [`RedisConfig::sentinel`], a `redis+sentinel://` URL, or
/// Synapse's `redis:` section with `sentinels:`. Its [`Debug`] output
/// hides the password.
#[derive(Clone)]
pub struct SentinelConfig {
    pub(super) service_name: String,
    pub(super) sentinels: Vec<RedisEndpoint>,
    pub(super) auth: Option<RedisAuth>,
    pub(super) tls: Option<TlsConfig>,
    pub(crate) tls_client: TlsClient,
}

impl fmt::Debug for SentinelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelConfig")
            .field("service_name", &self.service_name)
            .field("sentinels", &self.sentinels)
            .field("auth", &self.auth)
            .field("tls", &self.tls)
            .finish()
    }
}

impl PartialEq for SentinelConfig {
    fn eq(&self, other: &SentinelConfig) -> bool {
        self.service_name == other.service_name
            && self.sentinels == other.sentinels
            && self.auth == other.auth
            && self.tls == other.tls
    }
}

impl Eq for SentinelConfig {}

impl SentinelConfig {
    /// The master's name, as the sentinels monitor it (`sentinel monitor
    /// <name> ...`).
    pub fn service_name(&self) -> &str {
        &self.service_name
    }

    /// The sentinels, asked in this order (after the one that answered
    /// last).
    pub fn sentinels(&self) -> &[RedisEndpoint] {
        &self.sentinels
    }

    /// The sentinels' credentials (`requirepass` of the sentinels, or an
    /// ACL user of theirs), if any.
    pub fn auth(&self) -> Option<&RedisAuth> {
        self.auth.as_ref()
    }

    /// TLS to the sentinels, if on.
    pub fn tls(&self) -> Option<&TlsConfig> {
        self.tls.as_ref()
    }

    /// The sentinel at `index`.
    pub(crate) fn sentinel(&self, index: usize) -> Option<&RedisEndpoint> {
        self.sentinels.get(index)
    }

    /// Refuses an empty list, too long a list, and an empty name.
    pub(super) fn check(&self) -> Result<(), RedisConfigError> {
        if self.service_name.is_empty() {
            return Err(RedisConfigError::MissingServiceName);
        }
        if self.sentinels.is_empty() {
            return Err(RedisConfigError::NoSentinels);
        }
        if self.sentinels.len() > MAX_SENTINELS {
            return Err(RedisConfigError::TooManySentinels(self.sentinels.len()));
        }
        Ok(())
    }
}

impl RedisConfig {
    /// The master named `service_name` that `sentinels` (host and port
    /// each) monitor: every connection asks the sentinels where it is,
    /// checks it is a master, and follows its failovers (see
    /// [`RedisClient`](crate::transport::RedisClient)).
    ///
    /// The data nodes' credentials, database and TLS are set as for one
    /// node ([`RedisConfig::with_auth`], [`RedisConfig::with_database`],
    /// [`RedisConfig::with_tls`]); the sentinels' with
    /// [`RedisConfig::with_sentinel_auth`] and
    /// [`RedisConfig::with_sentinel_tls`]. [`RedisConfig::endpoint`] is
    /// the first sentinel.
    ///
    /// ```
    /// use synapse_replication::session::RedisAuth;
    /// use synapse_replication::transport::RedisConfig;
    ///
    /// let config = RedisConfig::sentinel("mymaster", [("10.0.0.1", 26379), ("10.0.0.2", 26379)])
    ///     .with_sentinel_auth(RedisAuth { username: None, password: "sentinel-pw".into() })
    ///     .with_auth(RedisAuth { username: None, password: "redis-pw".into() });
    /// assert_eq!(config.sentinel_config().map(|s| s.sentinels().len()), Some(2));
    /// assert_eq!(config, "redis+sentinel://:redis-pw@10.0.0.1,10.0.0.2/mymaster?sentinel_password=sentinel-pw".parse()?);
    /// # Ok::<(), synapse_replication::transport::RedisConfigError>(())
    /// ```
    pub fn sentinel<I, H>(service_name: impl Into<String>, sentinels: I) -> RedisConfig
    where
        I: IntoIterator<Item = (H, u16)>,
        H: Into<String>,
    {
        let sentinels: Vec<RedisEndpoint> = sentinels
            .into_iter()
            .map(|(host, port)| RedisEndpoint::Tcp {
                host: host.into(),
                port,
            })
            .collect();
        RedisConfig::sentinel_endpoints(service_name.into(), sentinels)
    }

    /// [`RedisConfig::sentinel`] with the addresses made.
    pub(super) fn sentinel_endpoints(
        service_name: String,
        sentinels: Vec<RedisEndpoint>,
    ) -> RedisConfig {
        let first = sentinels.first().cloned().unwrap_or(RedisEndpoint::Tcp {
            host: String::new(),
            port: DEFAULT_SENTINEL_PORT,
        });
        let mut config = RedisConfig::new(first);
        config.sentinel = Some(Box::new(SentinelConfig {
            service_name,
            sentinels,
            auth: None,
            tls: None,
            tls_client: TlsClient::default(),
        }));
        config
    }

    /// With these credentials for the sentinels (no effect without
    /// sentinels).
    #[must_use]
    pub fn with_sentinel_auth(mut self, auth: RedisAuth) -> RedisConfig {
        if let Some(sentinel) = &mut self.sentinel {
            sentinel.auth = Some(auth);
        }
        self
    }

    /// With TLS to the sentinels (no effect without sentinels).
    #[must_use]
    pub fn with_sentinel_tls(mut self, tls: TlsConfig) -> RedisConfig {
        if let Some(sentinel) = &mut self.sentinel {
            sentinel.tls = Some(tls);
            sentinel.tls_client = TlsClient::default();
        }
        self
    }

    /// The sentinels, when the master is found through them.
    pub fn sentinel_config(&self) -> Option<&SentinelConfig> {
        self.sentinel.as_deref()
    }
}

/// `//[userinfo@]host[:port][,host[:port]...]/service[/db][?params]` after
/// `redis+sentinel:` or `rediss+sentinel:`.
pub(super) fn parse_sentinel_url(rest: &str, tls: bool) -> Result<RedisConfig, RedisConfigError> {
    let rest = rest
        .strip_prefix("//")
        .ok_or(RedisConfigError::InvalidUrl("expected // after the scheme"))?;
    let (userinfo, rest) = match rest.rfind('@') {
        Some(at) => (rest.get(..at), rest.get(at + 1..).unwrap_or_default()),
        None => (None, rest),
    };
    let hosts_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (hosts, tail) = rest.split_at(hosts_end);
    if tail.contains('#') {
        return Err(RedisConfigError::InvalidUrl("unexpected #fragment"));
    }
    let mut sentinels = Vec::new();
    for host in hosts.split(',') {
        sentinels.push(parse_authority_with(host, DEFAULT_SENTINEL_PORT)?);
        if sentinels.len() > MAX_SENTINELS {
            return Err(RedisConfigError::TooManySentinels(sentinels.len()));
        }
    }
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, query),
        None => (tail, ""),
    };
    let path = path.strip_prefix('/').unwrap_or(path);
    let (service, database) = match path.split_once('/') {
        Some((service, "")) => (service, None),
        Some((service, database)) => (service, Some(parse_database(database)?)),
        None => (path, None),
    };
    let service = percent_decode(service, "service name")?;
    if service.is_empty() {
        return Err(RedisConfigError::MissingServiceName);
    }
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
    let mut sentinel_username = None;
    let mut sentinel_password = None;
    for parameter in query.split('&').filter(|parameter| !parameter.is_empty()) {
        let (name, value) = parameter.split_once('=').unwrap_or((parameter, ""));
        match name {
            "sentinel_username" => {
                sentinel_username = Some(percent_decode(value, "sentinel_username")?);
            }
            "sentinel_password" => {
                sentinel_password = Some(percent_decode(value, "sentinel_password")?);
            }
            _ => return Err(RedisConfigError::UnknownParameter(snippet(name))),
        }
    }
    let mut config = RedisConfig::sentinel_endpoints(service, sentinels);
    config.auth = auth;
    config.database = database;
    if let Some(auth) = credentials(sentinel_username, sentinel_password)? {
        config = config.with_sentinel_auth(auth);
    }
    if tls {
        config = config
            .with_tls(TlsConfig::default())
            .with_sentinel_tls(TlsConfig::default());
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{auth, url};
    use super::*;

    #[test]
    fn sentinel_urls() {
        let config =
            url("redis+sentinel://:pw@10.0.0.1:26380,[::1],s3/mymaster/2?sentinel_password=sp");
        let sentinel = config.sentinel_config().expect("sentinels");
        assert_eq!(sentinel.service_name(), "mymaster");
        assert_eq!(
            sentinel
                .sentinels()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["10.0.0.1:26380", "[::1]:26379", "s3:26379"]
        );
        assert_eq!(config.auth(), auth(None, "pw").as_ref());
        assert_eq!(sentinel.auth(), auth(None, "sp").as_ref());
        assert_eq!(config.database(), Some(2));
        assert_eq!(config.tls(), None);
        assert_eq!(config.endpoint().to_string(), "10.0.0.1:26380");

        let config =
            url("rediss+sentinel://u:p@h/m%2F1/?sentinel_username=su&sentinel_password=s%26p");
        let sentinel = config.sentinel_config().expect("sentinels");
        assert_eq!(sentinel.service_name(), "m/1");
        assert_eq!(config.auth(), auth(Some("u"), "p").as_ref());
        assert_eq!(sentinel.auth(), auth(Some("su"), "s&p").as_ref());
        assert_eq!(config.tls(), Some(&TlsConfig::default()));
        assert_eq!(sentinel.tls(), Some(&TlsConfig::default()));
        assert_eq!(config.database(), None);
        assert_eq!(
            url("REDIS+SENTINEL://h/m"),
            RedisConfig::sentinel("m", [("h", DEFAULT_SENTINEL_PORT)])
        );
        assert!(url("redis://h").sentinel_config().is_none());
    }

    #[test]
    fn bad_sentinel_urls() {
        for (text, check) in [
            ("redis+sentinel://h", "no service name"),
            ("redis+sentinel://h/", "no service name"),
            ("redis+sentinel:///m", "no host"),
            ("redis+sentinel://h,,g/m", "no host"),
            ("redis+sentinel://h:0/m", "invalid redis port"),
            ("redis+sentinel://h/m/x", "invalid redis database"),
            (
                "redis+sentinel://h/m?db=1",
                "unsupported redis url parameter \"db\"",
            ),
            ("redis+sentinel://h/m#f", "fragment"),
            (
                "redis+sentinel://u@h/m",
                "username given without a password",
            ),
            (
                "redis+sentinel://h/m?sentinel_username=u",
                "username given without a password",
            ),
        ] {
            let error = RedisConfig::from_url(text).expect_err(text).to_string();
            assert!(error.contains(check), "{text}: {error}");
        }
        let many = format!(
            "redis+sentinel://{}/m",
            vec!["h"; MAX_SENTINELS + 1].join(",")
        );
        assert!(matches!(
            RedisConfig::from_url(&many),
            Err(RedisConfigError::TooManySentinels(_))
        ));
        let error =
            RedisConfig::from_url("redis+sentinel://u:hunter2@h/m?sentinel_password=hunter3&x=1")
                .expect_err("unknown parameter");
        assert!(!format!("{error} {error:?}").contains("hunter"), "{error}");
        assert!(
            !format!(
                "{:?}",
                url("redis+sentinel://:hunter2@h/m?sentinel_password=hunter3")
            )
            .contains("hunter")
        );
    }

    #[test]
    fn empty_sentinel_configs_are_refused_before_connecting() {
        let config = RedisConfig::sentinel("m", Vec::<(String, u16)>::new());
        assert!(matches!(
            config.prepare(),
            Err(RedisConfigError::NoSentinels)
        ));
        let config = RedisConfig::sentinel("", [("h", 1)]);
        assert!(matches!(
            config.prepare(),
            Err(RedisConfigError::MissingServiceName)
        ));
        assert!(RedisConfig::sentinel("m", [("h", 1)]).prepare().is_ok());
    }
}
