//! Names of streams and of instances (processes), as they appear on the wire.

use std::borrow::Borrow;
use std::fmt;

use bytestring::ByteString;

macro_rules! stream_names {
    ($( $(#[$doc:meta])* $variant:ident => $name:literal, )*) => {
        /// The name of a replication stream.
        ///
        /// Every stream of Synapse 1.163.2 has a variant; any other name is
        /// carried unchanged in [`StreamName::Other`], so a newer Synapse's
        /// streams pass through. Decoding a known name allocates nothing.
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum StreamName {
            $( $(#[$doc])* $variant, )*
            /// A stream this version of the crate does not know.
            Other(ByteString),
        }

        impl StreamName {
            /// Every stream Synapse 1.163.2 knows, in the order of its `STREAMS_MAP`.
            pub const KNOWN: &'static [StreamName] = &[ $( StreamName::$variant, )* ];

            /// The name as written on the wire.
            pub fn as_str(&self) -> &str {
                match self {
                    $( StreamName::$variant => $name, )*
                    StreamName::Other(name) => name,
                }
            }

            /// Looks a name up among the known streams, without allocating.
            pub fn known(name: &str) -> Option<StreamName> {
                match name {
                    $( $name => Some(StreamName::$variant), )*
                    _ => None,
                }
            }
        }
    };
}

stream_names! {
    /// `events`: new events and current-state changes (multi-writer).
    Events => "events",
    /// `backfill`: events fetched from other servers' history.
    Backfill => "backfill",
    /// `presence`: users' presence states.
    Presence => "presence",
    /// `presence_federation`: presence destined for remote servers.
    PresenceFederation => "presence_federation",
    /// `typing`: typing notifications per room.
    Typing => "typing",
    /// `receipts`: read receipts (multi-writer).
    Receipts => "receipts",
    /// `push_rules`: a user's push rules changed.
    PushRules => "push_rules",
    /// `pushers`: pushers added or removed.
    Pushers => "pushers",
    /// `caches`: cache invalidations; every process writes it over Redis.
    Caches => "caches",
    /// `device_lists`: device list changes.
    DeviceLists => "device_lists",
    /// `to_device`: to-device messages.
    ToDevice => "to_device",
    /// `federation`: outgoing federation traffic (EDUs).
    Federation => "federation",
    /// `account_data`: global and per-room account data.
    AccountData => "account_data",
    /// `profile_updates`: profile field changes.
    ProfileUpdates => "profile_updates",
    /// `sticky_events`: sticky events (MSC4354).
    StickyEvents => "sticky_events",
    /// `thread_subscriptions`: users' thread subscriptions.
    ThreadSubscriptions => "thread_subscriptions",
    /// `un_partial_stated_room`: a room finished its partial-state join.
    UnPartialStatedRoom => "un_partial_stated_room",
    /// `un_partial_stated_event`: an event's state became complete.
    UnPartialStatedEvent => "un_partial_stated_event",
    /// `quarantined_media`: media quarantined or released.
    QuarantinedMedia => "quarantined_media",
}

impl StreamName {
    /// The stream with this name: a known variant, or [`StreamName::Other`].
    pub fn new(name: impl Into<ByteString>) -> StreamName {
        let name = name.into();
        StreamName::known(&name).unwrap_or(StreamName::Other(name))
    }

    /// Whether this version of the crate knows the stream.
    pub fn is_known(&self) -> bool {
        !matches!(self, StreamName::Other(_))
    }
}

impl From<&str> for StreamName {
    fn from(name: &str) -> Self {
        StreamName::known(name).unwrap_or_else(|| StreamName::Other(ByteString::from(name)))
    }
}

impl From<ByteString> for StreamName {
    fn from(name: ByteString) -> Self {
        StreamName::new(name)
    }
}

impl AsRef<str> for StreamName {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for StreamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name of a Synapse process: `master` for the main process, or a
/// worker's `worker_name`.
///
/// Cheap to clone (a reference-counted slice of the line it came from).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceName(ByteString);

impl InstanceName {
    /// The main process's name on the wire.
    ///
    /// Configuration may call it `main`; on the wire it is always `master`.
    pub const MASTER: &'static str = "master";

    /// Wraps a name.
    pub fn new(name: impl Into<ByteString>) -> Self {
        InstanceName(name.into())
    }

    /// The main process, `master`.
    pub fn master() -> Self {
        InstanceName(ByteString::from_static(Self::MASTER))
    }

    /// The name as written on the wire.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is the main process.
    pub fn is_master(&self) -> bool {
        &*self.0 == Self::MASTER
    }
}

impl From<&str> for InstanceName {
    fn from(name: &str) -> Self {
        InstanceName(ByteString::from(name))
    }
}

impl From<String> for InstanceName {
    fn from(name: String) -> Self {
        InstanceName(ByteString::from(name))
    }
}

impl From<ByteString> for InstanceName {
    fn from(name: ByteString) -> Self {
        InstanceName(name)
    }
}

impl AsRef<str> for InstanceName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for InstanceName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for InstanceName {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for InstanceName {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl fmt::Display for InstanceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
