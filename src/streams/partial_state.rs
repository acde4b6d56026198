//! The rows of the partial-state streams (Synapse's
//! `streams/partial_state.py`).

use super::de::row_struct;

row_struct! {
    /// A row of the `un_partial_stated_room` stream: a room's partial-state
    /// join finished, so its full state is known (`UnPartialStatedRoomStreamRow`).
    pub struct UnPartialStatedRoomRow {
        expecting: "an un_partial_stated_room row",
        prefix: "",
        fields: {
            /// The room.
            room_id: String = "room_id",
        }
    }
}

row_struct! {
    /// A row of the `un_partial_stated_event` stream: an event's state
    /// became complete (`UnPartialStatedEventStreamRow`).
    pub struct UnPartialStatedEventRow {
        expecting: "an un_partial_stated_event row",
        prefix: "",
        fields: {
            /// The event.
            event_id: String = "event_id",
            /// Whether the event's rejection status changed as a result.
            rejection_status_changed: bool = "rejection_status_changed",
        }
    }
}
