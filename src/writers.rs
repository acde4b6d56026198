//! Layer 3: who writes which stream.
//!
//! A process may only write the streams its deployment gives it, and a
//! follower trusts only the writers a stream has. [`WriterRegistry`] is the
//! question ("may `w1` write `events`?"),
//! [`StreamWriters`] (in
//! [`config`](crate::config)) the answer that Synapse itself gives, read
//! from the same configuration keys (`stream_writers`, `instance_map`,
//! `redis.enabled`, `federation_sender_instances` / `send_federation`).
//!
//! ```
//! use synapse_replication::config::StreamWriters;
//! use synapse_replication::wire::{InstanceName, StreamName};
//! use synapse_replication::writers::{WriterRegistry, WriterList};
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
//! assert_eq!(writers.writers(&StreamName::Caches), WriterList::Any);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::config::StreamWriters;
use crate::wire::{InstanceName, StreamName};

/// Which processes write which replication streams.
///
/// Object safe and synchronous: the follower and the writer hold an
/// `Arc<dyn WriterRegistry>` and ask it once per (stream, instance) pair they
/// meet (the follower) or per call (the writer). Answers must not change
/// during the life of a [`Follower`](crate::positions::Follower): a follower
/// remembers the pairs it accepted.
///
/// [`StreamWriters`] (in [`config`](crate::config)) implements it the way
/// Synapse reads its configuration;
/// implement it yourself for other policies (a test deployment, a registry
/// fed by service discovery).
pub trait WriterRegistry: Send + Sync {
    /// Whether `instance` may write `stream`.
    fn may_write(&self, stream: &StreamName, instance: &InstanceName) -> bool;

    /// The processes that write `stream`.
    fn writers(&self, stream: &StreamName) -> WriterList<'_>;

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
            && matches!(self.writers(stream), WriterList::Only(list) if list.contains(instance))
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
pub enum WriterList<'a> {
    /// Exactly these processes (possibly none: `federation` when the main
    /// process sends federation itself).
    Only(&'a [InstanceName]),
    /// Every process of the deployment, whatever its name: `caches` when
    /// Redis is used.
    Any,
}

impl WriterList<'_> {
    /// Whether `instance` is among the writers.
    pub fn contains(&self, instance: &InstanceName) -> bool {
        match self {
            WriterList::Only(list) => list.contains(instance),
            WriterList::Any => true,
        }
    }

    /// Whether the stream may have more than one writer (tokens are then
    /// per writer, and the stream's position is the minimum over them).
    pub fn is_multi(&self) -> bool {
        match self {
            WriterList::Only(list) => list.len() > 1,
            WriterList::Any => true,
        }
    }
}

impl WriterRegistry for StreamWriters {
    fn may_write(&self, stream: &StreamName, instance: &InstanceName) -> bool {
        self.writers(stream).contains(instance)
    }

    fn writers(&self, stream: &StreamName) -> WriterList<'_> {
        match self.writers_of(stream) {
            Some(list) => WriterList::Only(list),
            None => WriterList::Any,
        }
    }

    /// As the default, and for `caches` over Redis (which any process may
    /// write): the processes the configuration names, in `instance_map`
    /// or `stream_writers`, and `master`.
    fn is_configured(&self, stream: &StreamName, instance: &InstanceName) -> bool {
        match self.writers(stream) {
            _ if matches!(stream, StreamName::Other(_)) => false,
            WriterList::Only(list) => list.contains(instance),
            WriterList::Any => self.names(instance),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigError, InstanceLocation};
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
            WriterList::Only(&[InstanceName::master()])
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
        assert_eq!(w.writers(&StreamName::Caches), WriterList::Any);
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
        assert_eq!(
            default.writers(&StreamName::Federation),
            WriterList::Only(&[])
        );
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
            assert!(
                matches!(
                    err,
                    ConfigError::Json(_)
                        | ConfigError::InvalidValue { .. }
                        | ConfigError::UnknownKey { .. }
                ),
                "{bad}: {err}"
            );
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
            WriterList::Only(&[name("w1"), InstanceName::master()])
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
