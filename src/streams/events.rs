//! The row of the `events` stream (Synapse's `streams/events.py`).
//!
//! An `events` row is `[type_id, data]`: `ev` rows announce an event,
//! `state` rows a change of a room's current state, `state-all` rows that a
//! room's whole current state changed (too many changes for one row each).

use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeTuple as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::de::{RowSeed, SeqRow, Tracker, read_extra, row_struct};
use super::raw::RawJson;

row_struct! {
    /// The data of an `ev` row of the `events` stream: a new event, or an
    /// event that stopped being an outlier (`EventsStreamEventRow`).
    pub struct EventRow {
        expecting: "the data of an events ev row",
        prefix: "data.",
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
            /// The membership, for `m.room.member` events.
            membership: Option<String> = "membership",
            /// Whether the event was rejected.
            rejected: bool = "rejected",
            /// Whether the event is an outlier.
            outlier: bool = "outlier",
        }
    }
}

row_struct! {
    /// The data of a `state` row of the `events` stream: one entry of a
    /// room's current state changed (`EventsStreamCurrentStateRow`).
    pub struct CurrentStateRow {
        expecting: "the data of an events state row",
        prefix: "data.",
        fields: {
            /// The room.
            room_id: String = "room_id",
            /// The state event type.
            event_type: String = "type",
            /// The state key.
            state_key: String = "state_key",
            /// The new state event, or `None` if the entry was removed.
            event_id: Option<String> = "event_id",
        }
    }
}

row_struct! {
    /// The data of a `state-all` row of the `events` stream: the room's
    /// whole current state changed; forget all of it
    /// (`EventsStreamAllStateRow`).
    pub struct AllStateRow {
        expecting: "the data of an events state-all row",
        prefix: "data.",
        fields: {
            /// The room.
            room_id: String = "room_id",
        }
    }
}

/// A row of the `events` stream: `[type_id, data]` (`EventsStreamRow`).
///
/// ```
/// use synapse_replication::streams::{EventsRow, EventsRowData, StreamRow};
/// use synapse_replication::wire::RawRow;
///
/// let raw = RawRow::new(&br#"["state",["!r:example.com","m.room.name","",null]]"#[..])?;
/// let row = EventsRow::decode(&raw)?;
/// let EventsRowData::CurrentState(state) = &row.data else { unreachable!() };
/// assert_eq!(state.event_type, "m.room.name");
/// assert_eq!(state.event_id, None, "the state entry was removed");
/// assert_eq!(row.type_id(), "state");
/// assert_eq!(row.encode()?, raw);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventsRow {
    /// The data, by type id.
    pub data: EventsRowData,
    /// Fields after `data` (from a newer Synapse), kept in order and written
    /// back, so re-encoding gives the same bytes. Usually empty.
    pub extra: Vec<RawJson>,
}

/// The data of an `events` row, by its type id.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventsRowData {
    /// `ev`: a new event, or an event that stopped being an outlier.
    Event(EventRow),
    /// `state`: an entry of a room's current state changed.
    CurrentState(CurrentStateRow),
    /// `state-all`: a room's whole current state changed.
    AllState(AllStateRow),
    /// A type id this version does not know (from a newer Synapse), with its
    /// data as JSON text.
    Unknown {
        /// The type id.
        type_id: String,
        /// The data.
        data: RawJson,
    },
}

impl EventsRow {
    /// The names of the fields, in order (Synapse calls the first `type`).
    pub const FIELDS: &'static [&'static str] = &["type_id", "data"];

    /// A row holding `data`, with no extra fields.
    pub fn new(data: EventsRowData) -> Self {
        EventsRow {
            data,
            extra: Vec::new(),
        }
    }

    /// The row's type id: `ev`, `state`, `state-all`, or an unknown one.
    pub fn type_id(&self) -> &str {
        self.data.type_id()
    }
}

impl EventsRowData {
    /// The type id of `ev` rows.
    pub const EVENT: &'static str = "ev";
    /// The type id of `state` rows.
    pub const CURRENT_STATE: &'static str = "state";
    /// The type id of `state-all` rows.
    pub const ALL_STATE: &'static str = "state-all";

    /// The type id: `ev`, `state`, `state-all`, or an unknown one.
    pub fn type_id(&self) -> &str {
        match self {
            EventsRowData::Event(_) => Self::EVENT,
            EventsRowData::CurrentState(_) => Self::CURRENT_STATE,
            EventsRowData::AllState(_) => Self::ALL_STATE,
            EventsRowData::Unknown { type_id, .. } => type_id,
        }
    }
}

impl From<EventsRowData> for EventsRow {
    fn from(data: EventsRowData) -> Self {
        EventsRow::new(data)
    }
}

impl From<EventRow> for EventsRow {
    fn from(row: EventRow) -> Self {
        EventsRow::new(EventsRowData::Event(row))
    }
}

impl From<CurrentStateRow> for EventsRow {
    fn from(row: CurrentStateRow) -> Self {
        EventsRow::new(EventsRowData::CurrentState(row))
    }
}

impl From<AllStateRow> for EventsRow {
    fn from(row: AllStateRow) -> Self {
        EventsRow::new(EventsRowData::AllState(row))
    }
}

/// A type id as read: known ones without allocating.
enum TypeId {
    Event,
    CurrentState,
    AllState,
    Unknown(String),
}

impl<'de> Deserialize<'de> for TypeId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(TypeIdVisitor)
    }
}

struct TypeIdVisitor;

impl Visitor<'_> for TypeIdVisitor {
    type Value = TypeId;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an events row type id")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<TypeId, E> {
        Ok(match value {
            EventsRowData::EVENT => TypeId::Event,
            EventsRowData::CURRENT_STATE => TypeId::CurrentState,
            EventsRowData::ALL_STATE => TypeId::AllState,
            other => TypeId::Unknown(other.to_owned()),
        })
    }
}

impl SeqRow for EventsRow {
    const EXPECTING: &'static str = "an events row";

    fn visit<'de, A: SeqAccess<'de>>(mut seq: A, tracker: &Tracker) -> Result<Self, A::Error> {
        tracker.at(0, "type_id");
        let Some(type_id) = seq.next_element::<TypeId>()? else {
            return Err(tracker.missing(0, &Self::EXPECTING));
        };
        tracker.at(1, "data");
        let data = match type_id {
            TypeId::Event => seq
                .next_element_seed(RowSeed::<EventRow>::new(tracker))?
                .map(EventsRowData::Event),
            TypeId::CurrentState => seq
                .next_element_seed(RowSeed::<CurrentStateRow>::new(tracker))?
                .map(EventsRowData::CurrentState),
            TypeId::AllState => seq
                .next_element_seed(RowSeed::<AllStateRow>::new(tracker))?
                .map(EventsRowData::AllState),
            TypeId::Unknown(type_id) => seq
                .next_element::<RawJson>()?
                .map(|data| EventsRowData::Unknown { type_id, data }),
        };
        let Some(data) = data else {
            tracker.at(1, "data");
            return Err(tracker.missing(1, &Self::EXPECTING));
        };
        let extra = read_extra(&mut seq, tracker, 2)?;
        Ok(EventsRow { data, extra })
    }
}

impl Serialize for EventsRow {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut tuple = serializer.serialize_tuple(2 + self.extra.len())?;
        tuple.serialize_element(self.type_id())?;
        match &self.data {
            EventsRowData::Event(row) => tuple.serialize_element(row)?,
            EventsRowData::CurrentState(row) => tuple.serialize_element(row)?,
            EventsRowData::AllState(row) => tuple.serialize_element(row)?,
            EventsRowData::Unknown { data, .. } => tuple.serialize_element(data)?,
        }
        for field in &self.extra {
            tuple.serialize_element(field)?;
        }
        tuple.end()
    }
}

impl<'de> Deserialize<'de> for EventsRow {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        super::de::deserialize(deserializer)
    }
}
