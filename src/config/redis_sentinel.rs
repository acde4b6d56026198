//! [`RedisConfig`]'s sentinel form: the constructors and settings of a
//! configuration that finds the master through Redis Sentinel
//! ([`SentinelConfig`]).

use super::allow::AllowedMasters;
use super::auth::RedisAuth;
use super::endpoint::Endpoint;
use super::redis::RedisConfig;
use super::sentinel::{DEFAULT_SENTINEL_PORT, SentinelConfig};
use super::tls::{TlsCache, TlsConfig};

impl RedisConfig {
    /// The master named `service_name` that `sentinels` (host and port
    /// each) monitor: every connection asks the sentinels where it is,
    /// checks it is a master, and follows its failovers (see the
    /// transport's `RedisClient`).
    ///
    /// The data nodes' credentials, database and TLS are set as for one
    /// node ([`RedisConfig::with_auth`], [`RedisConfig::with_database`],
    /// [`RedisConfig::with_tls`]); the sentinels' with
    /// [`RedisConfig::with_sentinel_auth`] and
    /// [`RedisConfig::with_sentinel_tls`]. [`RedisConfig::endpoint`] is
    /// the first sentinel.
    ///
    /// # What the sentinels are trusted with
    ///
    /// A sentinel says where the master is; the client then connects
    /// there and (for a Redis with `requirepass`) sends it the data
    /// nodes' password, and takes the rows it sends. Whoever can answer
    /// as a sentinel (a compromised sentinel, or anyone on the path to one
    /// reached without TLS) could name a host of their own. What bounds
    /// it:
    ///
    /// - **The allowed masters**
    ///   ([`RedisConfig::with_sentinel_allowed_masters`], URL parameter
    ///   `allowed_masters`, Synapse key `sentinel_allowed_masters`): a
    ///   named node outside them is refused (the session's
    ///   `SentinelError::NotAllowed`, in the `DiscoveryError` of a
    ///   `RedisEvent::ConnectFailed`) and never connected to; a
    ///   `+switch-master` to one is not acted on, and that sentinel is no
    ///   longer listened to (`SentinelEvent::WatchLost`).
    ///   **By default only IP literals in the private, loopback, shared,
    ///   link-local and unique-local ranges are allowed**: no public
    ///   address and no host name. The sentinels' own addresses and the
    ///   service name are not taken as a reason to trust anything more.
    ///   So, by default, a lying sentinel can send the client to any node
    ///   of the private network, never out of it; list the master's hosts
    ///   or networks to bound it to those (and to allow the host names of
    ///   `announce-hostnames yes`).
    /// - **The `ROLE` check**: the node is asked `ROLE` before it is sent
    ///   the password, and taken only if it says `master`. A Redis with
    ///   `requirepass` (or whose `default` user may not run `ROLE`)
    ///   answers `NOAUTH` until authenticated: the password is then sent
    ///   first, and only the allowed masters (and TLS) protect it. A node
    ///   that answers `master` is sent the password by the session in any
    ///   case: the role check tells a replica from the master, not a
    ///   friend from a foe.
    /// - **TLS to the master** ([`RedisConfig::with_tls`]): by default
    ///   the certificate is verified against the name the sentinel gave,
    ///   with the system's roots (or `ca_file`/`ca_path`). That proves
    ///   only that the host owns the name the sentinel chose: with host
    ///   names allowed, pin the name
    ///   ([`TlsConfig::server_name`]:
    ///   every master must then present a certificate for that name; URL
    ///   parameter `master_server_name`, Synapse key
    ///   `sentinel_master_tls_server_name`) and/or the CA (`ca_file`, a CA
    ///   that signs only your Redis nodes), so that no host the sentinel
    ///   names gets the password without a certificate you issued.
    /// - **Failover storms**: a burst of `+switch-master` messages does
    ///   not become a burst of reconnections: the first is acted on at
    ///   once, the last of those that follow within a second when the
    ///   second is up.
    ///
    /// ```
    /// use synapse_replication::config::{AllowedMasters, RedisConfig, TlsConfig};
    ///
    /// let mut tls = TlsConfig::default();
    /// tls.server_name = Some("redis.internal".into());
    /// tls.ca_file = Some("/etc/redis/ca.pem".into());
    /// let config = RedisConfig::sentinel("mymaster", [("10.0.0.1", 26379)])
    ///     .with_sentinel_allowed_masters(AllowedMasters::parse(["10.0.1.0/24"])?)
    ///     .with_tls(tls);
    /// let url: RedisConfig =
    ///     "rediss+sentinel://10.0.0.1/mymaster?allowed_masters=10.0.1.0/24&master_server_name=redis.internal"
    ///         .parse()?;
    /// for config in [&config, &url] {
    ///     let allowed = config.sentinel_config().expect("sentinels").allowed_masters();
    ///     assert!(allowed.allows("10.0.1.5") && !allowed.allows("10.0.2.5"));
    ///     let pinned = config.tls().and_then(|tls| tls.server_name.as_deref());
    ///     assert_eq!(pinned, Some("redis.internal"));
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// ```
    /// use synapse_replication::config::{RedisAuth, RedisConfig};
    ///
    /// let config = RedisConfig::sentinel("mymaster", [("10.0.0.1", 26379), ("10.0.0.2", 26379)])
    ///     .with_sentinel_auth(RedisAuth { username: None, password: "sentinel-pw".into() })
    ///     .with_auth(RedisAuth { username: None, password: "redis-pw".into() });
    /// assert_eq!(config.sentinel_config().map(|s| s.sentinels().len()), Some(2));
    /// assert_eq!(config, "redis+sentinel://:redis-pw@10.0.0.1,10.0.0.2/mymaster?sentinel_password=sentinel-pw".parse()?);
    /// # Ok::<(), synapse_replication::config::ConfigError>(())
    /// ```
    pub fn sentinel<I, H>(service_name: impl Into<String>, sentinels: I) -> RedisConfig
    where
        I: IntoIterator<Item = (H, u16)>,
        H: Into<String>,
    {
        let sentinels: Vec<Endpoint> = sentinels
            .into_iter()
            .map(|(host, port)| Endpoint::Tcp {
                host: host.into(),
                port,
            })
            .collect();
        RedisConfig::sentinel_endpoints(service_name.into(), sentinels)
    }

    /// [`RedisConfig::sentinel`] with the addresses made.
    pub(super) fn sentinel_endpoints(
        service_name: String,
        sentinels: Vec<Endpoint>,
    ) -> RedisConfig {
        let first = sentinels.first().cloned().unwrap_or(Endpoint::Tcp {
            host: String::new(),
            port: DEFAULT_SENTINEL_PORT,
        });
        let mut config = RedisConfig::new(first);
        config.sentinel = Some(Box::new(SentinelConfig {
            service_name,
            sentinels,
            auth: None,
            allowed_masters: AllowedMasters::default(),
            tls: None,
            tls_cache: TlsCache::default(),
        }));
        config
    }

    /// With these nodes as the only ones the sentinels may name as the
    /// master (default [`AllowedMasters::private_networks`]; see
    /// [`RedisConfig::sentinel`]). No effect without sentinels.
    #[must_use]
    pub fn with_sentinel_allowed_masters(mut self, allowed: AllowedMasters) -> RedisConfig {
        if let Some(sentinel) = &mut self.sentinel {
            sentinel.allowed_masters = allowed;
        }
        self
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
            sentinel.tls_cache = TlsCache::default();
        }
        self
    }

    /// The sentinels, when the master is found through them.
    pub fn sentinel_config(&self) -> Option<&SentinelConfig> {
        self.sentinel.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::error::ConfigError;
    use crate::config::redis::tests::{auth, url};
    use crate::config::sentinel::MAX_SENTINELS;

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
            Err(ConfigError::TooManySentinels(_))
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
    fn allowed_masters_and_the_master_server_name() {
        let config = url("redis+sentinel://h/m");
        assert_eq!(
            config
                .sentinel_config()
                .map(SentinelConfig::allowed_masters),
            Some(&AllowedMasters::private_networks())
        );
        let config = url(
            "rediss+sentinel://h/m?allowed_masters=10.0.0.0/8,redis.internal&master_server_name=redis.internal",
        );
        let allowed = config
            .sentinel_config()
            .map(SentinelConfig::allowed_masters)
            .expect("sentinels");
        assert!(allowed.allows("10.1.1.1") && allowed.allows("redis.internal"));
        assert!(!allowed.allows("192.168.1.1"));
        assert_eq!(
            config.tls().and_then(|tls| tls.server_name.as_deref()),
            Some("redis.internal")
        );
        assert_eq!(
            config.sentinel_config().and_then(|s| s.tls()),
            Some(&TlsConfig::default())
        );
        assert!(
            url("redis+sentinel://h/m?allowed_masters=*")
                .sentinel_config()
                .is_some_and(|s| s.allowed_masters().allows("203.0.113.1"))
        );
        for (text, check) in [
            (
                "redis+sentinel://h/m?allowed_masters=",
                "invalid allowed master \"\"",
            ),
            (
                "redis+sentinel://h/m?allowed_masters=10.0.0.0/40",
                "invalid allowed master \"10.0.0.0/40\"",
            ),
            ("redis+sentinel://h/m?master_server_name=r", "without tls"),
        ] {
            let error = RedisConfig::from_url(text).expect_err(text).to_string();
            assert!(error.contains(check), "{text}: {error}");
        }
    }
}
