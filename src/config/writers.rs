//! `stream_writers` and `instance_map`: who writes which stream, and
//! where each process listens for replication ([`StreamWriters`]), read
//! as Synapse reads them. The question a follower and a writer ask ("may
//! `w1` write `events`?") is the `WriterRegistry` trait, beside the
//! positions; [`StreamWriters`] is the answer Synapse's configuration
//! gives.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use super::endpoint::Endpoint;
use super::error::{ConfigError, snippet};
use crate::wire::{InstanceName, StreamName};

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

    /// Where to connect: the TCP address (an IPv6 host without its
    /// brackets), or the Unix socket.
    pub fn endpoint(&self) -> Endpoint {
        match self {
            InstanceLocation::Tcp { host, port, .. } => Endpoint::Tcp {
                host: host
                    .strip_prefix('[')
                    .and_then(|host| host.strip_suffix(']'))
                    .unwrap_or(host)
                    .to_owned(),
                port: *port,
            },
            InstanceLocation::Unix { path } => Endpoint::Unix(path.into()),
        }
    }
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
        StreamWriters::from_value(serde_json::from_str(json)?)
    }

    /// Reads the configuration from a JSON value.
    pub fn from_value(value: serde_json::Value) -> Result<StreamWriters, ConfigError> {
        RawConfig::read(&value)?.build()
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

    /// The processes that write `stream`; `None`: every process (`caches`
    /// with Redis).
    pub(crate) fn writers_of(&self, stream: &StreamName) -> Option<&[InstanceName]> {
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
            StreamName::Caches if self.redis => return None,
            StreamName::Federation => return Some(&self.federation),
            StreamName::Caches
            | StreamName::Pushers
            | StreamName::UnPartialStatedRoom
            | StreamName::UnPartialStatedEvent
            | StreamName::Other(_) => return Some(&self.master),
        };
        self.keys.get(key).map(Vec::as_slice)
    }

    /// Whether the configuration names `instance`: `master`, or in
    /// `instance_map` or `stream_writers`.
    pub(crate) fn names(&self, instance: &InstanceName) -> bool {
        instance.is_master()
            || self.instance_map.contains_key(instance)
            || self.keys.iter().any(|list| list.contains(instance))
    }
}

impl<'de> Deserialize<'de> for StreamWriters {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        StreamWriters::from_value(value).map_err(serde::de::Error::custom)
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
fn falsy_is_default(value: &serde_json::Value) -> Result<Option<RawStreamWriters>, ConfigError> {
    let falsy = match value {
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
    // Each key and value on its own first, so that an error names it.
    if let serde_json::Value::Object(entries) = value {
        for (name, entry) in entries {
            let key = format!("stream_writers.{}", snippet(name));
            if !KEYS.iter().any(|(known, _)| known == name) {
                return Err(ConfigError::UnknownKey { key });
            }
            if OneOrMany::deserialize(entry).is_err() {
                return Err(invalid(
                    key,
                    &"expected an instance name or a list of names",
                ));
            }
        }
    }
    RawStreamWriters::deserialize(value)
        .map(Some)
        .map_err(|error| invalid("stream_writers".to_owned(), &error))
}

#[derive(Deserialize, Default)]
struct RawRedis {
    #[serde(default)]
    enabled: bool,
}

#[derive(Default)]
struct RawConfig {
    stream_writers: Option<RawStreamWriters>,
    instance_map: Option<BTreeMap<String, InstanceLocation>>,
    redis: Option<RawRedis>,
    federation_sender_instances: Option<Vec<String>>,
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
    /// The keys read here, each error naming its key.
    fn read(value: &serde_json::Value) -> Result<RawConfig, ConfigError> {
        let keys = serde_json::Map::<String, serde_json::Value>::deserialize(value)?;
        let stream_writers = match keys.get("stream_writers") {
            Some(value) => falsy_is_default(value)?,
            None => None,
        };
        let instance_map = match keys.get("instance_map") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::Object(entries)) => {
                let mut map = BTreeMap::new();
                for (name, entry) in entries {
                    map.insert(name.clone(), read_location(name, entry)?);
                }
                Some(map)
            }
            Some(_) => {
                return Err(invalid(
                    "instance_map".to_owned(),
                    &"expected a map of instance names to {host, port} or {path}",
                ));
            }
        };
        Ok(RawConfig {
            stream_writers,
            instance_map,
            redis: super::read_key(&keys, "redis")?,
            federation_sender_instances: super::read_key(&keys, "federation_sender_instances")?,
            send_federation: super::read_key(&keys, "send_federation")?,
        })
    }

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

/// One `instance_map` entry; an error names the entry, and its `port` when
/// that is what is wrong.
fn read_location(name: &str, entry: &serde_json::Value) -> Result<InstanceLocation, ConfigError> {
    InstanceLocation::deserialize(entry).map_err(|error| {
        let port = entry.get("port");
        let bad_port =
            entry.get("path").is_none() && port.is_some_and(|port| u16::deserialize(port).is_err());
        let key = format!("instance_map.{}", snippet(name));
        if bad_port {
            let reason = port
                .and_then(|port| u16::deserialize(port).err())
                .map_or_else(|| error.to_string(), |error| error.to_string());
            return invalid(format!("{key}.port"), &reason);
        }
        if entry.get("path").is_none() && entry.get("port").is_none() && entry.is_object() {
            return ConfigError::InvalidValue {
                key: format!("{key}.port"),
                reason: "missing (an entry is {host, port} or {path})".to_owned(),
            };
        }
        invalid(key, &error)
    })
}

/// A value of the wrong type or shape at `key`.
fn invalid(key: String, reason: &dyn fmt::Display) -> ConfigError {
    ConfigError::InvalidValue {
        key,
        reason: reason.to_string(),
    }
}
