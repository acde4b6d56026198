//! Layer 3: who writes which stream.
//!
//! A process may only write the streams its deployment gives it, and a
//! follower trusts only the writers a stream has. [`WriterRegistry`] is the
//! question ("may `w1` write `events`?"), [`StreamWriters`] the answer that
//! Synapse itself gives, read from the same configuration keys
//! (`stream_writers`, `instance_map`, `redis.enabled`,
//! `federation_sender_instances` / `send_federation`).
//!
//! ```
//! use synapse_replication::wire::{InstanceName, StreamName};
//! use synapse_replication::writers::{StreamWriters, WriterRegistry, Writers};
//!
//! let writers = StreamWriters::from_json(r#"{
//!     "redis": {"enabled": true},
//!     "instance_map": {
//!         "main": {"host": "127.0.0.1", "port": 9093},
//!         "persister1": {"host": "127.0.0.1", "port": 9094},
//!         "persister2": {"host": "127.0.0.1", "port": 9095}
//!     },
//!     "stream_writers": {"events": ["persister1", "persister2"], "typing": "main"}
//! }"#)?;
//!
//! let p1 = InstanceName::from("persister1");
//! assert!(writers.may_write(&StreamName::Events, &p1));
//! assert!(writers.may_write(&StreamName::Backfill, &p1));
//! assert!(!writers.may_write(&StreamName::Typing, &p1));
//! assert!(writers.may_write(&StreamName::Typing, &InstanceName::master()));
//! // With Redis, every process writes `caches`.
//! assert_eq!(writers.writers(&StreamName::Caches), Writers::Any);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use crate::wire::{InstanceName, StreamName};

/// Which processes write which replication streams.
///
/// Object safe and synchronous: the follower and the writer hold an
/// `Arc<dyn WriterRegistry>` and ask it once per (stream, instance) pair they
/// meet (the follower) or per call (the writer). Answers must not change
/// during the life of a [`Follower`](crate::positions::Follower): a follower
/// remembers the pairs it accepted.
///
/// [`StreamWriters`] implements it the way Synapse reads its configuration;
/// implement it yourself for other policies (a test deployment, a registry
/// fed by service discovery).
pub trait WriterRegistry: Send + Sync {
    /// Whether `instance` may write `stream`.
    fn may_write(&self, stream: &StreamName, instance: &InstanceName) -> bool;

    /// The processes that write `stream`.
    fn writers(&self, stream: &StreamName) -> Writers<'_>;

    /// Whether the configuration names `instance` as a writer of
    /// `stream`, rather than only letting it write (as any process may
    /// write `caches` over Redis). A [`Follower`](crate::positions::Follower)
    /// always tracks configured writers; the others share
    /// [`FollowerLimits::max_tracked_pairs`](crate::positions::FollowerLimits::max_tracked_pairs),
    /// the idlest making room. The default: a stream of
    /// [`StreamName::KNOWN`] whose writers are listed, and `instance` among
    /// them.
    fn is_configured(&self, stream: &StreamName, instance: &InstanceName) -> bool {
        !matches!(stream, StreamName::Other(_))
            && matches!(self.writers(stream), Writers::Only(list) if list.contains(instance))
    }

    /// The known streams (those of [`StreamName::KNOWN`]) that `instance`
    /// writes, in the order of `StreamName::KNOWN`.
    ///
    /// Streams this crate does not know ([`StreamName::Other`]) cannot be
    /// listed; ask [`may_write`](WriterRegistry::may_write) for them.
    fn streams_written_by(&self, instance: &InstanceName) -> Vec<StreamName>;
}

/// The answer to "who writes this stream?".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Writers<'a> {
    /// Exactly these processes (possibly none: `federation` when the main
    /// process sends federation itself).
    Only(&'a [InstanceName]),
    /// Every process of the deployment, whatever its name: `caches` when
    /// Redis is used.
    Any,
}

impl Writers<'_> {
    /// Whether `instance` is among the writers.
    pub fn contains(&self, instance: &InstanceName) -> bool {
        match self {
            Writers::Only(list) => list.contains(instance),
            Writers::Any => true,
        }
    }

    /// Whether the stream may have more than one writer (tokens are then
    /// per writer, and the stream's position is the minimum over them).
    pub fn is_multi(&self) -> bool {
        match self {
            Writers::Only(list) => list.len() > 1,
            Writers::Any => true,
        }
    }
}

/// Where an instance answers HTTP replication requests (an `instance_map`
/// entry): what a follower needs to fetch missed rows from a writer.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum InstanceLocation {
    /// `{host, port, tls}`.
    Tcp {
        /// Host name or address.
        host: String,
        /// TCP port.
        port: u16,
        /// Whether the listener speaks TLS (`false` when absent).
        #[serde(default)]
        tls: bool,
    },
    /// `{path}`: a unix socket.
    Unix {
        /// The socket's path.
        path: String,
    },
}

impl InstanceLocation {
    /// `https`, `http` or `unix`, as Synapse's `scheme()`.
    pub fn scheme(&self) -> &'static str {
        match self {
            InstanceLocation::Tcp { tls: true, .. } => "https",
            InstanceLocation::Tcp { tls: false, .. } => "http",
            InstanceLocation::Unix { .. } => "unix",
        }
    }
}

/// A configuration Synapse would refuse.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The JSON does not have the shape of Synapse's configuration (an
    /// unknown `stream_writers` key, a value of the wrong type, ...).
    #[error("invalid worker configuration: {0}")]
    Json(#[from] serde_json::Error),
    /// A single-writer stream was given several writers, or none.
    #[error(
        "stream_writers.{key}: must only specify one instance to handle `{key}` messages, got {count}"
    )]
    SingleWriter {
        /// The `stream_writers` key.
        key: &'static str,
        /// How many writers were given.
        count: usize,
    },
    /// A multi-writer stream was given an empty list.
    #[error("stream_writers.{key}: must specify at least one instance to handle `{key}` messages")]
    NoWriter {
        /// The `stream_writers` key.
        key: &'static str,
    },
    /// A writer other than the main process has no `instance_map` entry.
    #[error(
        "instance {instance:?} is configured to write {key} but does not appear in `instance_map` config"
    )]
    NotInInstanceMap {
        /// The `stream_writers` key.
        key: &'static str,
        /// The instance, truncated to 64 characters.
        instance: String,
    },
}

/// The configurable keys of `stream_writers`, in Synapse's order, and
/// whether each allows several writers.
const KEYS: [(&str, bool); 10] = [
    ("events", true),
    ("typing", false),
    ("to_device", false),
    ("account_data", false),
    ("receipts", true),
    ("presence", false),
    ("push_rules", false),
    ("device_lists", true),
    ("thread_subscriptions", true),
    ("quarantined_media_changes", true),
];

/// Indices into [`StreamWriters::keys`], named.
mod key {
    pub const EVENTS: usize = 0;
    pub const TYPING: usize = 1;
    pub const TO_DEVICE: usize = 2;
    pub const ACCOUNT_DATA: usize = 3;
    pub const RECEIPTS: usize = 4;
    pub const PRESENCE: usize = 5;
    pub const PUSH_RULES: usize = 6;
    pub const DEVICE_LISTS: usize = 7;
    pub const THREAD_SUBSCRIPTIONS: usize = 8;
    pub const QUARANTINED_MEDIA_CHANGES: usize = 9;
}

/// Synapse's answer to "who writes what", built from its configuration.
///
/// Follows `synapse/config/workers.py` and the stream list of
/// `ReplicationCommandHandler` in Synapse 1.163.2:
///
/// | stream | written by |
/// |---|---|
/// | `events`, `backfill`, `sticky_events`, `profile_updates` | `stream_writers.events` |
/// | `presence`, `presence_federation` | `stream_writers.presence` (one) |
/// | `typing`, `to_device`, `account_data`, `push_rules` | the key of that name (one) |
/// | `receipts`, `device_lists`, `thread_subscriptions` | the key of that name (one or more) |
/// | `quarantined_media` | `stream_writers.quarantined_media_changes` |
/// | `caches` | every process with Redis, else `master` |
/// | `federation` | `master`, only when `master` does **not** send federation itself (federation senders follow it) |
/// | any other stream | `master` |
///
/// Every key defaults to `master`. In the configuration the main process
/// may be called `main`; it is `master` here and on the wire (Synapse
/// renames `main` only in `instance_map`; this type renames it everywhere,
/// so `stream_writers: {typing: main}` means the main process).
///
/// Refused, as Synapse refuses them: unknown `stream_writers` keys, values
/// that are neither a name nor a list of names, several writers (or none)
/// for `typing`, `to_device`, `account_data`, `presence` and `push_rules`,
/// an empty list for the other keys, and writers other than `master` that
/// have no `instance_map` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamWriters {
    /// One list per entry of [`KEYS`].
    keys: [Vec<InstanceName>; 10],
    /// `[master]`, for master-only streams.
    master: [InstanceName; 1],
    /// `[master]` or `[]`.
    federation: Vec<InstanceName>,
    /// Whether Redis is used (every process writes `caches`).
    redis: bool,
    instance_map: BTreeMap<InstanceName, InstanceLocation>,
}

impl Default for StreamWriters {
    /// Synapse's defaults: `master` writes everything, no Redis, and
    /// `master` sends federation itself (so nobody writes `federation`).
    fn default() -> Self {
        StreamWriters {
            keys: std::array::from_fn(|_| vec![InstanceName::master()]),
            master: [InstanceName::master()],
            federation: Vec::new(),
            redis: false,
            instance_map: BTreeMap::new(),
        }
    }
}

impl StreamWriters {
    /// Reads the configuration from JSON text (the homeserver's YAML, as
    /// JSON). Keys other than those listed on [`StreamWriters`] are ignored.
    pub fn from_json(json: &str) -> Result<StreamWriters, ConfigError> {
        let raw: RawConfig = serde_json::from_str(json)?;
        raw.build()
    }

    /// Reads the configuration from a JSON value.
    pub fn from_value(value: serde_json::Value) -> Result<StreamWriters, ConfigError> {
        let raw: RawConfig = serde_json::from_value(value)?;
        raw.build()
    }

    /// The same configuration with Redis enabled or not (`redis.enabled`):
    /// with Redis every process writes `caches`.
    pub fn with_redis(mut self, enabled: bool) -> StreamWriters {
        self.redis = enabled;
        self
    }

    /// Whether Redis is enabled.
    pub fn redis(&self) -> bool {
        self.redis
    }

    /// Where `instance` answers HTTP replication requests, from
    /// `instance_map` (`main` is listed as `master`).
    pub fn location(&self, instance: &InstanceName) -> Option<&InstanceLocation> {
        self.instance_map.get(instance)
    }

    /// The whole `instance_map`.
    pub fn instance_map(&self) -> &BTreeMap<InstanceName, InstanceLocation> {
        &self.instance_map
    }

    fn list(&self, stream: &StreamName) -> Writers<'_> {
        let key = match stream {
            StreamName::Events
            | StreamName::Backfill
            | StreamName::StickyEvents
            | StreamName::ProfileUpdates => key::EVENTS,
            StreamName::Presence | StreamName::PresenceFederation => key::PRESENCE,
            StreamName::Typing => key::TYPING,
            StreamName::ToDevice => key::TO_DEVICE,
            StreamName::AccountData => key::ACCOUNT_DATA,
            StreamName::Receipts => key::RECEIPTS,
            StreamName::PushRules => key::PUSH_RULES,
            StreamName::DeviceLists => key::DEVICE_LISTS,
            StreamName::ThreadSubscriptions => key::THREAD_SUBSCRIPTIONS,
            StreamName::QuarantinedMedia => key::QUARANTINED_MEDIA_CHANGES,
            StreamName::Caches if self.redis => return Writers::Any,
            StreamName::Federation => return Writers::Only(&self.federation),
            StreamName::Caches
            | StreamName::Pushers
            | StreamName::UnPartialStatedRoom
            | StreamName::UnPartialStatedEvent
            | StreamName::Other(_) => return Writers::Only(&self.master),
        };
        Writers::Only(&self.keys[key])
    }
}

impl WriterRegistry for StreamWriters {
    fn may_write(&self, stream: &StreamName, instance: &InstanceName) -> bool {
        self.list(stream).contains(instance)
    }

    fn writers(&self, stream: &StreamName) -> Writers<'_> {
        self.list(stream)
    }

    /// As the default, and for `caches` over Redis (which any process may
    /// write): the processes the configuration names, in `instance_map`
    /// or `stream_writers`, and `master`.
    fn is_configured(&self, stream: &StreamName, instance: &InstanceName) -> bool {
        match self.list(stream) {
            _ if matches!(stream, StreamName::Other(_)) => false,
            Writers::Only(list) => list.contains(instance),
            Writers::Any => {
                instance.is_master()
                    || self.instance_map.contains_key(instance)
                    || self.keys.iter().any(|list| list.contains(instance))
            }
        }
    }

    fn streams_written_by(&self, instance: &InstanceName) -> Vec<StreamName> {
        StreamName::KNOWN
            .iter()
            .filter(|stream| self.may_write(stream, instance))
            .cloned()
            .collect()
    }
}

impl<'de> Deserialize<'de> for StreamWriters {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = RawConfig::deserialize(deserializer)?;
        raw.build().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for StreamWriters {
    /// One line per configurable key, e.g. `events: persister1, persister2`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for ((key, _), list) in KEYS.iter().zip(&self.keys) {
            write!(f, "{key}:")?;
            for (i, name) in list.iter().enumerate() {
                let sep = if i == 0 { " " } else { ", " };
                write!(f, "{sep}{name}")?;
            }
            writeln!(f)?;
        }
        writeln!(
            f,
            "caches: {}",
            if self.redis {
                "every process"
            } else {
                "master"
            }
        )?;
        write!(
            f,
            "federation: {}",
            if self.federation.is_empty() {
                "nobody (master sends federation)"
            } else {
                "master"
            }
        )
    }
}

/// `main` in configuration is `master` on the wire.
fn instance(name: String) -> InstanceName {
    if name == "main" {
        InstanceName::master()
    } else {
        InstanceName::from(name)
    }
}

fn truncate(name: &InstanceName) -> String {
    name.as_str().chars().take(64).collect()
}

/// A name or a list of names (Synapse's `_instance_to_list_converter`).
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_names(self) -> Vec<InstanceName> {
        match self {
            OneOrMany::One(name) => vec![instance(name)],
            OneOrMany::Many(names) => names.into_iter().map(instance).collect(),
        }
    }
}

/// Deserialises a present field that must not be `null` (Synapse's
/// converter passes `null` through and then fails on it).
fn not_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<OneOrMany>, D::Error> {
    OneOrMany::deserialize(d).map(Some)
}

/// `config.get("stream_writers") or {}`: any false-y value (`null`, `false`,
/// `0`, `""`, `[]`, `{}`) means the defaults.
fn falsy_is_default<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<RawStreamWriters>, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    let falsy = match &value {
        serde_json::Value::Null => true,
        serde_json::Value::Bool(b) => !b,
        serde_json::Value::Number(n) => n.as_f64() == Some(0.0),
        serde_json::Value::String(s) => s.is_empty(),
        serde_json::Value::Array(a) => a.is_empty(),
        serde_json::Value::Object(o) => o.is_empty(),
    };
    if falsy {
        return Ok(None);
    }
    RawStreamWriters::deserialize(value)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

#[derive(Deserialize, Default)]
struct RawRedis {
    #[serde(default)]
    enabled: bool,
}

#[derive(Deserialize, Default)]
struct RawConfig {
    #[serde(default, deserialize_with = "falsy_is_default")]
    stream_writers: Option<RawStreamWriters>,
    #[serde(default)]
    instance_map: Option<BTreeMap<String, InstanceLocation>>,
    #[serde(default)]
    redis: Option<RawRedis>,
    #[serde(default)]
    federation_sender_instances: Option<Vec<String>>,
    #[serde(default)]
    send_federation: Option<bool>,
}

/// `stream_writers`: values, when present, are not `null`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawStreamWriters {
    #[serde(default, deserialize_with = "not_null")]
    events: Option<OneOrMany>,
    #[serde(default, deserialize_with = "not_null")]
    typing: Option<OneOrMany>,
    #[serde(default, deserialize_with = "not_null")]
    to_device: Option<OneOrMany>,
    #[serde(default, deserialize_with = "not_null")]
    account_data: Option<OneOrMany>,
    #[serde(default, deserialize_with = "not_null")]
    receipts: Option<OneOrMany>,
    #[serde(default, deserialize_with = "not_null")]
    presence: Option<OneOrMany>,
    #[serde(default, deserialize_with = "not_null")]
    push_rules: Option<OneOrMany>,
    #[serde(default, deserialize_with = "not_null")]
    device_lists: Option<OneOrMany>,
    #[serde(default, deserialize_with = "not_null")]
    thread_subscriptions: Option<OneOrMany>,
    #[serde(default, deserialize_with = "not_null")]
    quarantined_media_changes: Option<OneOrMany>,
}

impl RawConfig {
    fn build(self) -> Result<StreamWriters, ConfigError> {
        let raw = self.stream_writers.unwrap_or_default();
        let given = [
            raw.events,
            raw.typing,
            raw.to_device,
            raw.account_data,
            raw.receipts,
            raw.presence,
            raw.push_rules,
            raw.device_lists,
            raw.thread_subscriptions,
            raw.quarantined_media_changes,
        ];
        let mut keys: [Vec<InstanceName>; 10] = Default::default();
        for (slot, value) in keys.iter_mut().zip(given) {
            *slot = match value {
                Some(value) => value.into_names(),
                None => vec![InstanceName::master()],
            };
        }

        // Synapse moves `main` to `master` (overwriting any `master` entry).
        let mut instance_map = BTreeMap::new();
        let mut main = None;
        for (name, location) in self.instance_map.unwrap_or_default() {
            if name == "main" {
                main = Some(location);
            } else {
                instance_map.insert(InstanceName::from(name), location);
            }
        }
        if let Some(location) = main {
            instance_map.insert(InstanceName::master(), location);
        }

        // Same order of checks as Synapse: instance_map first, then counts.
        for ((key, _), list) in KEYS.iter().zip(&keys) {
            for name in list {
                if !name.is_master() && !instance_map.contains_key(name) {
                    return Err(ConfigError::NotInInstanceMap {
                        key,
                        instance: truncate(name),
                    });
                }
            }
        }
        for ((key, multi), list) in KEYS.iter().zip(&keys) {
            if *multi {
                if list.is_empty() {
                    return Err(ConfigError::NoWriter { key });
                }
            } else if list.len() != 1 {
                return Err(ConfigError::SingleWriter {
                    key,
                    count: list.len(),
                });
            }
        }
        // Duplicates are harmless to Synapse; keep each name once.
        for list in &mut keys {
            let mut seen = Vec::with_capacity(list.len());
            list.retain(|name| {
                let fresh = !seen.contains(name);
                if fresh {
                    seen.push(name.clone());
                }
                fresh
            });
        }

        let federation_senders: Vec<InstanceName> = match self.federation_sender_instances {
            Some(names) => names.into_iter().map(instance).collect(),
            None if self.send_federation.unwrap_or(true) => vec![InstanceName::master()],
            None => Vec::new(),
        };
        let master_sends_federation = federation_senders.iter().any(InstanceName::is_master);
        let federation = if master_sends_federation {
            Vec::new()
        } else {
            vec![InstanceName::master()]
        };

        Ok(StreamWriters {
            keys,
            master: [InstanceName::master()],
            federation,
            redis: self.redis.is_some_and(|redis| redis.enabled),
            instance_map,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn name(s: &str) -> InstanceName {
        InstanceName::from(s)
    }

    fn map(names: &[&str]) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for (i, n) in names.iter().enumerate() {
            m.insert(
                (*n).to_owned(),
                json!({"host": "localhost", "port": 9000 + i}),
            );
        }
        serde_json::Value::Object(m)
    }

    #[test]
    fn defaults_are_master_for_everything_but_federation() {
        let w = StreamWriters::from_json("{}").unwrap();
        assert_eq!(w, StreamWriters::default());
        for stream in StreamName::KNOWN {
            let expected = *stream != StreamName::Federation;
            assert_eq!(
                w.may_write(stream, &InstanceName::master()),
                expected,
                "{stream}"
            );
            assert!(!w.may_write(stream, &name("w1")), "{stream}");
        }
        assert!(w.may_write(&StreamName::new("brand_new"), &InstanceName::master()));
        assert!(!w.may_write(&StreamName::new("brand_new"), &name("w1")));
    }

    #[test]
    fn null_stream_writers_is_the_default() {
        for falsy in [json!(null), json!([]), json!({}), json!(false), json!("")] {
            let w = StreamWriters::from_value(json!({"stream_writers": falsy})).unwrap();
            assert_eq!(w, StreamWriters::default());
        }
    }

    #[test]
    fn events_key_covers_four_streams() {
        let w = StreamWriters::from_value(json!({
            "instance_map": map(&["main", "p1", "p2"]),
            "stream_writers": {"events": ["p1", "p2"]},
        }))
        .unwrap();
        for stream in [
            StreamName::Events,
            StreamName::Backfill,
            StreamName::StickyEvents,
            StreamName::ProfileUpdates,
        ] {
            assert!(w.may_write(&stream, &name("p1")));
            assert!(w.may_write(&stream, &name("p2")));
            assert!(!w.may_write(&stream, &InstanceName::master()));
            assert!(w.writers(&stream).is_multi());
        }
        assert_eq!(
            w.streams_written_by(&name("p1")),
            vec![
                StreamName::Events,
                StreamName::Backfill,
                StreamName::ProfileUpdates,
                StreamName::StickyEvents
            ]
        );
    }

    #[test]
    fn each_key_maps_to_its_streams() {
        let keys = [
            ("typing", vec![StreamName::Typing]),
            ("to_device", vec![StreamName::ToDevice]),
            ("account_data", vec![StreamName::AccountData]),
            ("receipts", vec![StreamName::Receipts]),
            (
                "presence",
                vec![StreamName::Presence, StreamName::PresenceFederation],
            ),
            ("push_rules", vec![StreamName::PushRules]),
            ("device_lists", vec![StreamName::DeviceLists]),
            (
                "thread_subscriptions",
                vec![StreamName::ThreadSubscriptions],
            ),
            (
                "quarantined_media_changes",
                vec![StreamName::QuarantinedMedia],
            ),
        ];
        for (key, streams) in keys {
            let w = StreamWriters::from_value(json!({
                "instance_map": map(&["w1"]),
                "stream_writers": {key: "w1"},
            }))
            .unwrap();
            assert_eq!(w.streams_written_by(&name("w1")), streams, "{key}");
        }
    }

    #[test]
    fn main_means_master() {
        let w = StreamWriters::from_value(json!({
            "instance_map": {"main": {"host": "a", "port": 1}, "master": {"host": "b", "port": 2}},
            "stream_writers": {"typing": "main", "events": ["main", "master"]},
        }))
        .unwrap();
        assert!(w.may_write(&StreamName::Typing, &InstanceName::master()));
        assert_eq!(
            w.writers(&StreamName::Events),
            Writers::Only(&[InstanceName::master()])
        );
        // `main` overrides `master` in instance_map, as Synapse does.
        assert_eq!(
            w.location(&InstanceName::master()),
            Some(&InstanceLocation::Tcp {
                host: "a".into(),
                port: 2 - 1,
                tls: false
            })
        );
        assert!(w.location(&name("main")).is_none());
    }

    #[test]
    fn caches_is_everyone_with_redis_master_without() {
        let w = StreamWriters::from_value(json!({"redis": {"enabled": true}})).unwrap();
        assert_eq!(w.writers(&StreamName::Caches), Writers::Any);
        assert!(w.may_write(&StreamName::Caches, &name("anything")));
        assert_eq!(
            w.streams_written_by(&name("anything")),
            vec![StreamName::Caches]
        );
        let w = StreamWriters::from_value(json!({"redis": {"enabled": false}})).unwrap();
        assert!(!w.may_write(&StreamName::Caches, &name("anything")));
        assert!(w.may_write(&StreamName::Caches, &InstanceName::master()));
        assert!(StreamWriters::default().with_redis(true).redis());
    }

    #[test]
    fn federation_stream_only_when_master_does_not_send() {
        let master = InstanceName::master();
        let default = StreamWriters::from_value(json!({})).unwrap();
        assert_eq!(default.writers(&StreamName::Federation), Writers::Only(&[]));
        let legacy_off = StreamWriters::from_value(json!({"send_federation": false})).unwrap();
        assert!(legacy_off.may_write(&StreamName::Federation, &master));
        let senders =
            StreamWriters::from_value(json!({"federation_sender_instances": ["fed1"]})).unwrap();
        assert!(senders.may_write(&StreamName::Federation, &master));
        assert!(!senders.may_write(&StreamName::Federation, &name("fed1")));
        let master_too =
            StreamWriters::from_value(json!({"federation_sender_instances": ["master", "fed1"]}))
                .unwrap();
        assert!(!master_too.may_write(&StreamName::Federation, &master));
    }

    #[test]
    fn refuses_several_writers_for_single_writer_streams() {
        for key in [
            "typing",
            "to_device",
            "account_data",
            "presence",
            "push_rules",
        ] {
            let err = StreamWriters::from_value(json!({
                "instance_map": map(&["w1", "w2"]),
                "stream_writers": {key: ["w1", "w2"]},
            }))
            .unwrap_err();
            assert!(
                matches!(err, ConfigError::SingleWriter { key: k, count: 2 } if k == key),
                "{key}: {err}"
            );
            // Synapse counts before removing duplicates.
            let err = StreamWriters::from_value(json!({
                "instance_map": map(&["w1"]),
                "stream_writers": {key: ["w1", "w1"]},
            }))
            .unwrap_err();
            assert!(
                matches!(err, ConfigError::SingleWriter { count: 2, .. }),
                "{key}"
            );
            let err = StreamWriters::from_value(json!({"stream_writers": {key: []}})).unwrap_err();
            assert!(
                matches!(err, ConfigError::SingleWriter { count: 0, .. }),
                "{key}"
            );
        }
    }

    #[test]
    fn refuses_empty_multi_writer_lists() {
        for key in [
            "events",
            "receipts",
            "device_lists",
            "thread_subscriptions",
            "quarantined_media_changes",
        ] {
            let err = StreamWriters::from_value(json!({"stream_writers": {key: []}})).unwrap_err();
            assert!(
                matches!(err, ConfigError::NoWriter { key: k } if k == key),
                "{key}"
            );
        }
    }

    #[test]
    fn refuses_writers_missing_from_instance_map() {
        let err = StreamWriters::from_value(json!({
            "instance_map": map(&["w1"]),
            "stream_writers": {"events": ["w1", "w2"]},
        }))
        .unwrap_err();
        assert!(
            matches!(&err, ConfigError::NotInInstanceMap { key: "events", instance } if instance == "w2"),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "instance \"w2\" is configured to write events but does not appear in `instance_map` config"
        );
    }

    #[test]
    fn refuses_unknown_keys_and_bad_shapes() {
        for bad in [
            json!({"stream_writers": {"caches": "master"}}),
            json!({"stream_writers": {"events": null}}),
            json!({"stream_writers": {"events": 3}}),
            json!({"stream_writers": {"events": [1]}}),
            json!({"stream_writers": [1]}),
            json!({"instance_map": {"w1": {"host": "a"}}}),
            json!({"instance_map": {"w1": {"host": "a", "port": "80"}}}),
            json!({"redis": {"enabled": "yes"}}),
        ] {
            let err = StreamWriters::from_value(bad.clone()).unwrap_err();
            assert!(matches!(err, ConfigError::Json(_)), "{bad}: {err}");
        }
    }

    #[test]
    fn duplicates_are_kept_once() {
        let w = StreamWriters::from_value(json!({
            "instance_map": map(&["w1"]),
            "stream_writers": {"events": ["w1", "w1", "master"]},
        }))
        .unwrap();
        assert_eq!(
            w.writers(&StreamName::Events),
            Writers::Only(&[name("w1"), InstanceName::master()])
        );
    }

    #[test]
    fn unix_and_tls_locations() {
        let w = StreamWriters::from_value(json!({
            "instance_map": {"w1": {"path": "/run/w1.sock"}, "w2": {"host": "h", "port": 1, "tls": true, "extra": 1}},
        }))
        .unwrap();
        assert_eq!(
            w.location(&name("w1")).map(InstanceLocation::scheme),
            Some("unix")
        );
        assert_eq!(
            w.location(&name("w2")).map(InstanceLocation::scheme),
            Some("https")
        );
    }

    #[test]
    fn deserialises_with_serde_and_is_object_safe() {
        let w: StreamWriters =
            serde_json::from_value(json!({"redis": {"enabled": true}, "other_key": 1})).unwrap();
        let registry: std::sync::Arc<dyn WriterRegistry> = std::sync::Arc::new(w.clone());
        assert!(registry.may_write(&StreamName::Caches, &name("x")));
        let err =
            serde_json::from_value::<StreamWriters>(json!({"stream_writers": {"typing": []}}))
                .unwrap_err();
        assert!(err.to_string().contains("typing"), "{err}");
        assert!(w.to_string().contains("caches: every process"));
    }
}
