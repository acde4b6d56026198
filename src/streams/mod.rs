//! Layer 2, the streams: the typed row of each of Synapse 1.163.2's
//! nineteen streams, decoded on demand from the raw row an `RDATA` carries
//! and encoded back to the exact bytes Synapse writes.
//!
//! ```
//! use synapse_replication::streams::{CachesRow, EventsRowData, Row, StreamName, StreamRow};
//! use synapse_replication::wire::RawRow;
//!
//! // An `ev` row of the events stream, decoded through the `Row` enum...
//! let raw = RawRow::new(&br#"["ev",["$e:example.com","!r:example.com","m.room.member","@u:example.com",null,null,"join",false,false]]"#[..])?;
//! let Row::Events(row) = Row::decode(&StreamName::Events, &raw)? else { unreachable!() };
//! let EventsRowData::Event(event) = &row.data else { unreachable!() };
//! assert_eq!(event.event_type, "m.room.member");
//! assert_eq!(event.membership.as_deref(), Some("join"));
//! assert_eq!(row.encode()?, raw, "re-encoding gives Synapse's bytes");
//!
//! // ...and a caches row through its own type (non-ASCII text arrives as
//! // `\uXXXX` escapes, and is written back the same way).
//! let raw = RawRow::new(&br#"["get_user_by_id",["@caf\u00e9:example.com"],1700000000000]"#[..])?;
//! let row = CachesRow::decode(&raw)?;
//! assert_eq!(row.cache_func, "get_user_by_id");
//! assert_eq!(row.keys, Some(vec![serde_json::json!("@café:example.com")]));
//! assert_eq!(row.encode()?, raw);
//!
//! // A malformed row is an error for that row alone, naming the field.
//! let raw = RawRow::new(&br#"["get_user_by_id",["@a:example.com"],"yesterday"]"#[..])?;
//! let error = CachesRow::decode(&raw).unwrap_err();
//! assert_eq!(error.field(), Some((2, "invalidation_ts")));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What decoding accepts
//!
//! - Each row is a JSON array of its type's fields, in Synapse's order and
//!   with Synapse's types (`Option` where Synapse writes `null`). Field
//!   names in errors and in each type's `FIELDS` are Synapse's; Rust names
//!   differ only where Synapse's is a keyword (`type` is `event_type`, or
//!   `row_type` for `federation`).
//! - Rows with **more** fields than Synapse 1.163.2 writes decode: the
//!   fields this version knows are the ones listed in each type's `FIELDS`
//!   (as in Synapse 1.163.2); the rest are kept, in order, as [`RawJson`] in
//!   the row's `extra` and written back after the known fields, so
//!   re-encoding is byte exact. Rows with fewer fields are an error
//!   ([`RowError::MissingField`]). (Synapse 1.163.2 itself refuses both,
//!   as its row classes take exactly their fields.)
//! - Booleans are read as `true`/`false` (PostgreSQL-backed Synapse) or
//!   `0`/`1` (SQLite-backed); any other number is an error. Encoding writes
//!   `true`/`false`, as a PostgreSQL-backed Synapse does.
//! - A string holding a lone UTF-16 surrogate escape (`"\ud800"`), which
//!   Python writes and Rust strings cannot hold, is an error for that row
//!   ([`Row::decode_lossy`] reads it as U+FFFD instead). Inside JSON kept as
//!   text ([`RawJson`]: `federation` and `receipts` data, an unknown
//!   `events` type's data, extra fields) it is kept as is.
//! - Integers beyond 64 bits are refused in typed fields and in cache keys,
//!   as they could not be written back exactly (serde_json reads them as
//!   floats, and cannot tell `1e+20` from `100000000000000000000`, so a
//!   float whose value is an integer beyond 64 bits is refused in cache keys
//!   too); [`RawJson`] keeps them as text. A cache key `-0` (which Python
//!   never writes) reads as the float `-0.0`. NaN and infinities are not
//!   JSON and never reach this layer.
//! - Rows of a stream this version does not know ([`StreamName::Other`])
//!   pass through untouched as [`Row::Other`]; so do `events` rows of an
//!   unknown type id ([`EventsRowData::Unknown`]).
//!
//! # What encoding writes
//!
//! Encoding goes through the wire codec's JSON writer
//! ([`crate::wire::json`]), so a typed row encodes to the bytes Synapse
//! would write for it: any Synapse worker accepts it, and a row Synapse
//! wrote re-encodes to the same bytes. A row Synapse wrote in its SQLite
//! form (`0`/`1` booleans) re-encodes in its PostgreSQL form.

mod base;
pub(crate) mod de;
mod error;
mod events;
mod federation;
mod partial_state;
mod raw;

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use base::{
    AccountDataRow, BackfillRow, CachesRow, DeviceListsRow, PresenceFederationRow, PresenceRow,
    ProfileUpdatesRow, PushRulesRow, PushersRow, QuarantinedMediaRow, ReceiptsRow, StickyEventsRow,
    ThreadSubscriptionsRow, ToDeviceRow, TypingRow,
};
pub use error::RowError;
pub use events::{AllStateRow, CurrentStateRow, EventRow, EventsRow, EventsRowData};
pub use federation::FederationRow;
pub use partial_state::{UnPartialStatedEventRow, UnPartialStatedRoomRow};
pub use raw::RawJson;

pub use crate::wire::StreamName;
use crate::wire::json;
use crate::wire::{InstanceName, RawRow, Rdata, RdataToken};

/// The typed row of one known stream.
///
/// Implemented by the row type of each of Synapse 1.163.2's streams (and
/// sealed: only this crate implements it). Decode a row of a stream you
/// already know with it, or go through [`Row`] for any stream.
pub trait StreamRow: de::SeqRow + Serialize + DeserializeOwned + Into<Row> {
    /// The stream this is the row of.
    const STREAM: StreamName;

    /// The names of the fields this version knows, in order (Synapse's
    /// names).
    const FIELDS: &'static [&'static str];

    /// Decodes a row that arrived in an `RDATA`.
    fn decode(row: &RawRow) -> Result<Self, RowError> {
        de::decode(row.as_bytes())
    }

    /// Decodes a row from JSON text (as found in a catch-up answer, say).
    fn from_slice(json: &[u8]) -> Result<Self, RowError> {
        de::decode(json)
    }

    /// Encodes the row as Synapse writes it.
    fn encode(&self) -> Result<RawRow, RowError> {
        RawRow::from_value(self).map_err(|source| RowError::Encode {
            stream: Self::STREAM,
            source,
        })
    }
}

macro_rules! rows {
    ($( $(#[$doc:meta])* $variant:ident($ty:ty), )*) => {
        /// A typed row of any stream: decode one with [`Row::decode`] (or
        /// [`Row::from_rdata`]) and encode it with [`Row::encode`].
        ///
        /// Rows of streams this version does not know stay raw
        /// ([`Row::Other`]).
        #[derive(Clone, Debug, PartialEq, Eq)]
        #[non_exhaustive]
        pub enum Row {
            $( $(#[$doc])* $variant($ty), )*
            /// A row of a stream this version does not know, as received.
            Other {
                /// The stream.
                stream: StreamName,
                /// The row.
                row: RawRow,
            },
        }

        $(
            impl StreamRow for $ty {
                const STREAM: StreamName = StreamName::$variant;
                const FIELDS: &'static [&'static str] = <$ty>::FIELDS;
            }

            impl From<$ty> for Row {
                fn from(row: $ty) -> Row {
                    Row::$variant(row)
                }
            }
        )*

        impl Row {
            /// Decodes a row of `stream`. Rows of streams this version does
            /// not know pass through as [`Row::Other`].
            pub fn decode(stream: &StreamName, row: &RawRow) -> Result<Row, RowError> {
                Ok(match stream {
                    $( StreamName::$variant => Row::$variant(<$ty>::decode(row)?), )*
                    _ => Row::Other { stream: stream.clone(), row: row.clone() },
                })
            }

            /// The stream the row belongs to.
            pub fn stream(&self) -> StreamName {
                match self {
                    $( Row::$variant(_) => StreamName::$variant, )*
                    Row::Other { stream, .. } => stream.clone(),
                }
            }

            /// Encodes the row as Synapse writes it; a [`Row::Other`] is
            /// given back unchanged.
            pub fn encode(&self) -> Result<RawRow, RowError> {
                match self {
                    $( Row::$variant(row) => row.encode(), )*
                    Row::Other { row, .. } => Ok(row.clone()),
                }
            }
        }
    };
}

rows! {
    /// `events`
    Events(EventsRow),
    /// `backfill`
    Backfill(BackfillRow),
    /// `presence`
    Presence(PresenceRow),
    /// `presence_federation`
    PresenceFederation(PresenceFederationRow),
    /// `typing`
    Typing(TypingRow),
    /// `receipts`
    Receipts(ReceiptsRow),
    /// `push_rules`
    PushRules(PushRulesRow),
    /// `pushers`
    Pushers(PushersRow),
    /// `caches`
    Caches(CachesRow),
    /// `device_lists`
    DeviceLists(DeviceListsRow),
    /// `to_device`
    ToDevice(ToDeviceRow),
    /// `federation`
    Federation(FederationRow),
    /// `account_data`
    AccountData(AccountDataRow),
    /// `profile_updates`
    ProfileUpdates(ProfileUpdatesRow),
    /// `sticky_events`
    StickyEvents(StickyEventsRow),
    /// `thread_subscriptions`
    ThreadSubscriptions(ThreadSubscriptionsRow),
    /// `un_partial_stated_room`
    UnPartialStatedRoom(UnPartialStatedRoomRow),
    /// `un_partial_stated_event`
    UnPartialStatedEvent(UnPartialStatedEventRow),
    /// `quarantined_media`
    QuarantinedMedia(QuarantinedMediaRow),
}

impl Row {
    /// Decodes the row of an `RDATA`, for its stream.
    pub fn from_rdata(rdata: &Rdata) -> Result<Row, RowError> {
        Row::decode(&rdata.stream, &rdata.row)
    }

    /// Like [`Row::decode`], but a lone UTF-16 surrogate escape in a string
    /// (`"\ud800"`: Python writes and reads it, Rust strings cannot hold it)
    /// reads as U+FFFD, as the wire layer reads `USER_IP`: the row is kept,
    /// one character is not, and it re-encodes as `\ufffd`.
    ///
    /// Rows without lone surrogates decode exactly as with [`Row::decode`],
    /// at the same cost; a row that fails for another reason fails with the
    /// same error.
    ///
    /// ```
    /// use synapse_replication::streams::{Row, StreamName};
    /// use synapse_replication::wire::RawRow;
    ///
    /// let raw = RawRow::new(&br#"["@a:example.com","online",1,2,3,"hi \ud83d",true]"#[..])?;
    /// assert!(Row::decode(&StreamName::Presence, &raw).is_err());
    /// let Row::Presence(row) = Row::decode_lossy(&StreamName::Presence, &raw)? else {
    ///     unreachable!()
    /// };
    /// assert_eq!(row.status_msg.as_deref(), Some("hi \u{fffd}"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn decode_lossy(stream: &StreamName, row: &RawRow) -> Result<Row, RowError> {
        match Row::decode(stream, row) {
            Err(error) if has_surrogate_escape(row.as_bytes()) => {
                let respelt = json::from_slice_lossy::<serde_json::Value>(row.as_bytes())
                    .ok()
                    .filter(|value| json::check_exact_numbers(value).is_ok())
                    .and_then(|value| RawRow::from_value(&value).ok());
                match respelt {
                    Some(respelt) => Row::decode(stream, &respelt).map_err(|_| error),
                    None => Err(error),
                }
            }
            result => result,
        }
    }

    /// Encodes the row into an `RDATA` from `instance` at `token`, ready to
    /// send.
    pub fn to_rdata(
        &self,
        instance: InstanceName,
        token: impl Into<RdataToken>,
    ) -> Result<Rdata, RowError> {
        Ok(Rdata {
            stream: self.stream(),
            instance,
            token: token.into(),
            row: self.encode()?,
        })
    }
}

/// Whether `bytes` hold a `\uD800`-`\uDFFF` escape (paired or not).
fn has_surrogate_escape(bytes: &[u8]) -> bool {
    bytes.windows(4).any(|window| {
        window[0] == b'\\'
            && window[1] == b'u'
            && matches!(window[2], b'd' | b'D')
            && matches!(window[3], b'8'..=b'9' | b'a'..=b'f' | b'A'..=b'F')
    })
}

/// Decodes the row of an `RDATA` into its stream's typed row and encodes it
/// back: the bytes a Rust writer would send for the same row. Rows of
/// unknown streams pass through unchanged.
///
/// For a row Synapse wrote, the result equals the row received, except
/// that SQLite's `0`/`1` booleans come back as `false`/`true`.
///
/// ```
/// use synapse_replication::streams::recode;
/// use synapse_replication::wire::Command;
///
/// let line = br#"RDATA pushers master 12 ["@u:example.com","m.http","key",1]"#;
/// let Some(Command::Rdata(rdata)) = Command::decode(bytes::Bytes::from_static(line))? else {
///     unreachable!()
/// };
/// assert_eq!(recode(&rdata)?.as_str(), r#"["@u:example.com","m.http","key",true]"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn recode(rdata: &Rdata) -> Result<RawRow, RowError> {
    Row::from_rdata(rdata)?.encode()
}
