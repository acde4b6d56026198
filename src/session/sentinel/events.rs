//! [`SentinelEvent`]: what a driver heard from the sentinels.

use std::fmt;
use std::time::Duration;

use crate::config::Endpoint;
use crate::session::RedisLink;

use super::{MasterAddr, SentinelError};

/// What the sentinels told a [`RedisClient`](crate::transport::RedisClient), reported as
/// [`RedisEvent::Sentinel`](crate::session::RedisEvent::Sentinel).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SentinelEvent {
    /// A link found the master: a sentinel named it and it said `master`.
    MasterFound {
        /// The link that connects to it now.
        link: RedisLink,
        /// The master.
        master: MasterAddr,
        /// The sentinel that named it.
        sentinel: Endpoint,
        /// The sentinels asked before in this round, and why they did not
        /// do (down, no such master, named a replica, ...).
        rejected: Vec<(Endpoint, SentinelError)>,
    },
    /// Failovers are heard through this sentinel from now on.
    Watching {
        /// The sentinel.
        sentinel: Endpoint,
    },
    /// The sentinels switched the master: links to another node are
    /// closed and connect again through discovery.
    ///
    /// Switches that follow one within
    /// [`SWITCH_HOLDOFF`](SentinelEvent::SWITCH_HOLDOFF) are held back
    /// and reported as one when it is up (`from` the first one's, `to`
    /// the last one's), so that a storm of `+switch-master` messages
    /// (a flapping deployment, or a sentinel that lies) closes the links
    /// at most once per holdoff rather than once per message.
    Switched {
        /// The master before.
        from: MasterAddr,
        /// The master now.
        to: MasterAddr,
    },
    /// The connection watching for failovers was lost; the next sentinel
    /// is tried after `retry_in`. Until then a failover is noticed when
    /// the old master drops its clients or stops answering.
    WatchLost {
        /// The sentinel.
        sentinel: Endpoint,
        /// Why.
        error: SentinelError,
        /// The delay before the next attempt.
        retry_in: Duration,
    },
}

impl SentinelEvent {
    /// The least time between two [`SentinelEvent::Switched`] (one
    /// second): the first switch is acted on at once, the last of those
    /// that follow within this when it is up.
    pub const SWITCH_HOLDOFF: Duration = Duration::from_secs(1);
}

impl fmt::Display for SentinelEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SentinelEvent::MasterFound {
                link,
                master,
                sentinel,
                rejected,
            } => {
                write!(f, "{link}: master {master} (from sentinel {sentinel})")?;
                for (sentinel, error) in rejected {
                    write!(f, "; sentinel {sentinel}: {error}")?;
                }
                Ok(())
            }
            SentinelEvent::Watching { sentinel } => {
                write!(f, "watching failovers through sentinel {sentinel}")
            }
            SentinelEvent::Switched { from, to } => write!(f, "master switched {from} -> {to}"),
            SentinelEvent::WatchLost {
                sentinel,
                error,
                retry_in,
            } => write!(
                f,
                "lost sentinel {sentinel}: {error}; retry in {} ms",
                retry_in.as_millis()
            ),
        }
    }
}
