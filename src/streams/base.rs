//! The rows of the streams Synapse defines in `streams/_base.py`.

use serde::de::SeqAccess;
use serde::ser::{Error as _, SerializeTuple as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::de::{Field, SeqRow, Tracker, read_extra, row_struct};
use super::raw::RawJson;

row_struct! {
    /// A row of the `backfill` stream: an event fetched from another
    /// server's history, or one that stopped being an outlier
    /// (`BackfillStreamRow`).
    ///
    /// The stream's tokens are the negated backfill stream ids, so they grow.
    pub struct BackfillRow {
        expecting: "a backfill row",
        prefix: "",
        fields: {
            /// The event's id.
            event_id: String = "event_id",
            /// The room the event is in.
            room_id: String = "room_id",
            /// The event's type (`m.room.message`, ...).
            event_type: String = "type",
            /// The state key, for state events.
            state_key: Option<String> = "state_key",
            /// The event this one redacts, for redactions.
            redacts: Option<String> = "redacts",
            /// The event this one relates to (`m.relates_to`), if any.
            relates_to: Option<String> = "relates_to",
        }
    }
}

row_struct! {
    /// A row of the `presence` stream: a user's presence state
    /// (`PresenceStreamRow`).
    ///
    /// Synapse annotates `status_msg` as `str`, but writes `null` for a user
    /// without a status message (the database column is nullable), so it is
    /// optional here.
    pub struct PresenceRow {
        expecting: "a presence row",
        prefix: "",
        fields: {
            /// The user.
            user_id: String = "user_id",
            /// `online`, `unavailable`, `offline` or `busy`.
            state: String = "state",
            /// When the user was last active, in ms since the epoch.
            last_active_ts: i64 = "last_active_ts",
            /// When the state was last sent over federation, in ms.
            last_federation_update_ts: i64 = "last_federation_update_ts",
            /// When the user last synced, in ms.
            last_user_sync_ts: i64 = "last_user_sync_ts",
            /// The status message, if the user set one.
            status_msg: Option<String> = "status_msg",
            /// Whether the user is currently active.
            currently_active: bool = "currently_active",
        }
    }
}

row_struct! {
    /// A row of the `presence_federation` stream: presence to send to a
    /// remote server (`PresenceFederationStreamRow`).
    pub struct PresenceFederationRow {
        expecting: "a presence_federation row",
        prefix: "",
        fields: {
            /// The remote server.
            destination: String = "destination",
            /// The user whose presence to send.
            user_id: String = "user_id",
        }
    }
}

row_struct! {
    /// A row of the `typing` stream: everyone typing in a room right now
    /// (`TypingStreamRow`). The list replaces the room's previous one.
    pub struct TypingRow {
        expecting: "a typing row",
        prefix: "",
        fields: {
            /// The room.
            room_id: String = "room_id",
            /// The users typing in it now.
            user_ids: Vec<String> = "user_ids",
        }
    }
}

row_struct! {
    /// A row of the `receipts` stream: a read receipt (`ReceiptsStreamRow`).
    pub struct ReceiptsRow {
        expecting: "a receipts row",
        prefix: "",
        fields: {
            /// The room.
            room_id: String = "room_id",
            /// `m.read`, `m.read.private`, ...
            receipt_type: String = "receipt_type",
            /// The user who sent the receipt.
            user_id: String = "user_id",
            /// The event the receipt is for.
            event_id: String = "event_id",
            /// The thread, for threaded receipts.
            thread_id: Option<String> = "thread_id",
            /// The receipt's content (a JSON object, such as `{"ts":...}`).
            data: super::RawJson = "data",
        }
    }
}

row_struct! {
    /// A row of the `push_rules` stream: a user changed their push rules
    /// (`PushRulesStreamRow`).
    pub struct PushRulesRow {
        expecting: "a push_rules row",
        prefix: "",
        fields: {
            /// The user.
            user_id: String = "user_id",
        }
    }
}

row_struct! {
    /// A row of the `pushers` stream: a pusher was added, changed or
    /// removed (`PushersStreamRow`).
    pub struct PushersRow {
        expecting: "a pushers row",
        prefix: "",
        fields: {
            /// The pusher's owner.
            user_id: String = "user_id",
            /// The pusher's app id.
            app_id: String = "app_id",
            /// The pusher's push key.
            pushkey: String = "pushkey",
            /// Whether the pusher was removed.
            deleted: bool = "deleted",
        }
    }
}

row_struct! {
    /// A row of the `caches` stream: invalidate entries of a cache
    /// (`CachesStreamRow`).
    ///
    /// Rows may repeat, and every process writes this stream over Redis.
    pub struct CachesRow {
        expecting: "a caches row",
        prefix: "",
        fields: {
            /// The cached function's name (`get_user_by_id`, ...), or one of
            /// Synapse's magic names (`cs_cache_fake`, ...).
            cache_func: String = "cache_func",
            /// The key to invalidate, as a list of JSON values (a
            /// PostgreSQL-backed Synapse writes strings and nulls; JSON text
            /// inside a string is kept as a string), or `None` (`null`) to
            /// invalidate the whole cache. Integers beyond 64 bits are
            /// refused, as they would not re-encode exactly.
            keys: Option<Vec<Value>> = "keys",
            /// When the invalidation happened, in ms since the epoch.
            invalidation_ts: i64 = "invalidation_ts",
        }
    }
}

/// A row of the `device_lists` stream: a user's devices changed, or the
/// servers to tell about it were worked out (`DeviceListsStreamRow`).
///
/// Its JSON form is an array of the fields in the order below (names in
/// [`DeviceListsRow::FIELDS`]), and its shape depends on the release that
/// wrote it:
///
/// - Synapse 1.110 and later write `[user_id, is_signature,
///   hosts_calculated]`: `hosts_calculated` is `Some`.
/// - Synapse up to 1.109 wrote `[entity, is_signature]`: `hosts_calculated`
///   is `None`, and the first field (`entity` in those releases, kept here
///   in `user_id`) is a user id, or, for a row that announces outbound
///   pokes to a remote server, that server's name (the `destination` column
///   of `device_lists_outbound_pokes`).
///
/// Each shape re-encodes to the bytes its release wrote. Booleans are read
/// as `true`/`false` or `0`/`1` (a SQLite-backed Synapse writes
/// `hosts_calculated` as `0`/`1`) and written as `true`/`false`. Fields
/// after `hosts_calculated` are kept in `extra`; a row without
/// `hosts_calculated` has none, and encoding one that has some is an error
/// ([`RowError::Encode`](super::RowError::Encode)), as it would not decode
/// back to the same row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceListsRow {
    /// The user (from 1.110 always a user id; up to 1.109 a user id or a
    /// remote server name).
    pub user_id: String,
    /// Whether the user signed their own device with their user-signing
    /// key.
    pub is_signature: bool,
    /// Whether the hosts to send the update to have been calculated;
    /// `None` for a row from Synapse 1.109 or older, which had no such
    /// field.
    pub hosts_calculated: Option<bool>,
    /// Fields after the ones Synapse 1.163.2 writes (from a newer Synapse),
    /// kept in order and written back after the known fields, so
    /// re-encoding gives the same bytes. Usually empty.
    pub extra: Vec<RawJson>,
}

impl DeviceListsRow {
    /// Synapse's names of the fields this version knows, in order (as in
    /// Synapse 1.110 and later; up to 1.109 the first was called `entity`
    /// and the last did not exist).
    pub const FIELDS: &'static [&'static str] = &["user_id", "is_signature", "hosts_calculated"];
}

impl SeqRow for DeviceListsRow {
    const EXPECTING: &'static str = "a device_lists row";

    fn visit<'de, A: SeqAccess<'de>>(mut seq: A, tracker: &Tracker) -> Result<Self, A::Error> {
        tracker.at(0, "user_id");
        let Some(user_id) = seq.next_element::<String>()? else {
            return Err(tracker.missing(0, &Self::EXPECTING));
        };
        tracker.at(1, "is_signature");
        let Some(is_signature) = seq.next_element::<<bool as Field>::Wire>()? else {
            return Err(tracker.missing(1, &Self::EXPECTING));
        };
        // Absent in rows from Synapse 1.109 and older; never null.
        tracker.at(2, "hosts_calculated");
        let hosts_calculated = seq.next_element::<<bool as Field>::Wire>()?.map(bool::from);
        let extra = match hosts_calculated {
            Some(_) => read_extra(&mut seq, tracker, 3)?,
            None => Vec::new(),
        };
        Ok(DeviceListsRow {
            user_id,
            is_signature: is_signature.into(),
            hosts_calculated,
            extra,
        })
    }
}

impl Serialize for DeviceListsRow {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let known = match self.hosts_calculated {
            Some(_) => 3,
            None if self.extra.is_empty() => 2,
            None => {
                return Err(S::Error::custom(
                    "extra fields need hosts_calculated before them",
                ));
            }
        };
        let mut tuple = serializer.serialize_tuple(known + self.extra.len())?;
        tuple.serialize_element(&self.user_id)?;
        tuple.serialize_element(&self.is_signature)?;
        if let Some(hosts_calculated) = &self.hosts_calculated {
            tuple.serialize_element(hosts_calculated)?;
        }
        for field in &self.extra {
            tuple.serialize_element(field)?;
        }
        tuple.end()
    }
}

impl<'de> Deserialize<'de> for DeviceListsRow {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        super::de::deserialize(deserializer)
    }
}

row_struct! {
    /// A row of the `to_device` stream: new to-device messages
    /// (`ToDeviceStreamRow`).
    pub struct ToDeviceRow {
        expecting: "a to_device row",
        prefix: "",
        fields: {
            /// A local user id, or a remote server name for messages to send
            /// over federation.
            entity: String = "entity",
        }
    }
}

row_struct! {
    /// A row of the `account_data` stream: global or per-room account data
    /// changed (`AccountDataStreamRow`).
    pub struct AccountDataRow {
        expecting: "an account_data row",
        prefix: "",
        fields: {
            /// The user.
            user_id: String = "user_id",
            /// The room, or `None` for global account data.
            room_id: Option<String> = "room_id",
            /// The account data type (`m.tag` for room tags).
            data_type: String = "data_type",
        }
    }
}

row_struct! {
    /// A row of the `thread_subscriptions` stream: a user's subscription to
    /// a thread changed (`ThreadSubscriptionsStreamRow`).
    pub struct ThreadSubscriptionsRow {
        expecting: "a thread_subscriptions row",
        prefix: "",
        fields: {
            /// The user.
            user_id: String = "user_id",
            /// The room.
            room_id: String = "room_id",
            /// The thread's root event.
            event_id: String = "event_id",
        }
    }
}

row_struct! {
    /// A row of the `profile_updates` stream (`ProfileUpdatesStreamRow`).
    ///
    /// Synapse turns `affected_fields` into a set when it reads the row;
    /// here it stays a list, in the order written, so the row re-encodes
    /// byte for byte.
    pub struct ProfileUpdatesRow {
        expecting: "a profile_updates row",
        prefix: "",
        fields: {
            /// The user whose profile changed.
            user_id: String = "user_id",
            /// `update` (profile fields changed), `joined_room` or
            /// `left_room` (Synapse's `ProfileUpdateAction`).
            action: String = "action",
            /// The profile fields added, updated or removed; `None` unless
            /// `action` is `update`.
            affected_fields: Option<Vec<String>> = "affected_fields",
        }
    }
}

row_struct! {
    /// A row of the `sticky_events` stream: a sticky event changed
    /// (`StickyEventsStreamRow`).
    pub struct StickyEventsRow {
        expecting: "a sticky_events row",
        prefix: "",
        fields: {
            /// The room.
            room_id: String = "room_id",
            /// The sticky event.
            event_id: String = "event_id",
        }
    }
}

row_struct! {
    /// A row of the `quarantined_media` stream: media was quarantined or
    /// released (`QuarantinedMediaStreamRow`).
    ///
    /// Synapse annotates `origin` as `str`, but the column it comes from
    /// (`quarantined_media_changes.origin`) is NULL for local media, and
    /// Synapse writes that `null` as is: `[null,"<media_id>",true]`.
    pub struct QuarantinedMediaRow {
        expecting: "a quarantined_media row",
        prefix: "",
        fields: {
            /// The server the media belongs to; `None` for this server's
            /// own (local) media.
            origin: Option<String> = "origin",
            /// The media's id on that server.
            media_id: String = "media_id",
            /// Whether the media is now quarantined.
            quarantined: bool = "quarantined",
        }
    }
}
