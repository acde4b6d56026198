//! Redis Sentinel: [`SentinelConfig`], the sentinel form of a
//! [`RedisConfig`](super::RedisConfig) (its URL, `redis+sentinel://`, is read with the other
//! URLs, in `redis_url`).

use std::fmt;

use super::allow::AllowedMasters;
use super::auth::RedisAuth;
use super::endpoint::Endpoint;
use super::error::ConfigError;
use super::tls::{TlsCache, TlsConfig};

/// A sentinel's port when none is given.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// The most sentinels one configuration may list (a deployment has three
/// or five).
pub const MAX_SENTINELS: usize = 16;

/// Where the sentinels of a high-availability Redis are, and how to talk
/// to them: the master's service name, the sentinels' addresses, their
/// credentials and TLS (the data nodes' are the [`RedisConfig`](super::RedisConfig)'s own).
///
/// Made by [`RedisConfig::sentinel`](super::RedisConfig::sentinel), a `redis+sentinel://` URL, or
/// Synapse's `redis:` section with `sentinels:`. Its [`Debug`] output
/// hides the password. What it trusts the sentinels with is in
/// [`RedisConfig::sentinel`](super::RedisConfig::sentinel).
#[derive(Clone)]
pub struct SentinelConfig {
    pub(super) service_name: String,
    pub(super) sentinels: Vec<Endpoint>,
    pub(super) auth: Option<RedisAuth>,
    pub(super) allowed_masters: AllowedMasters,
    pub(super) tls: Option<TlsConfig>,
    /// What the dialer builds from `tls`, shared by clones.
    pub(super) tls_cache: TlsCache,
}

impl fmt::Debug for SentinelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelConfig")
            .field("service_name", &self.service_name)
            .field("sentinels", &self.sentinels)
            .field("auth", &self.auth)
            .field("allowed_masters", &self.allowed_masters)
            .field("tls", &self.tls)
            .finish()
    }
}

impl PartialEq for SentinelConfig {
    fn eq(&self, other: &SentinelConfig) -> bool {
        self.service_name == other.service_name
            && self.sentinels == other.sentinels
            && self.auth == other.auth
            && self.allowed_masters == other.allowed_masters
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
    pub fn sentinels(&self) -> &[Endpoint] {
        &self.sentinels
    }

    /// The sentinels' credentials (`requirepass` of the sentinels, or an
    /// ACL user of theirs), if any.
    pub fn auth(&self) -> Option<&RedisAuth> {
        self.auth.as_ref()
    }

    /// The nodes the sentinels may name as the master (default
    /// [`AllowedMasters::private_networks`]).
    pub fn allowed_masters(&self) -> &AllowedMasters {
        &self.allowed_masters
    }

    /// TLS to the sentinels, if on.
    pub fn tls(&self) -> Option<&TlsConfig> {
        self.tls.as_ref()
    }

    /// The sentinel at `index`.
    pub(crate) fn sentinel(&self, index: usize) -> Option<&Endpoint> {
        self.sentinels.get(index)
    }

    /// Refuses an empty list, too long a list, and an empty name.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.service_name.is_empty() {
            return Err(ConfigError::MissingServiceName { key: None });
        }
        if self.sentinels.is_empty() {
            return Err(ConfigError::NoSentinels);
        }
        if self.sentinels.len() > MAX_SENTINELS {
            return Err(ConfigError::TooManySentinels(self.sentinels.len()));
        }
        Ok(())
    }
}
