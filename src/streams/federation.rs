//! The row of the `federation` stream (Synapse's `streams/federation.py`).

use super::de::row_struct;

row_struct! {
    /// A row of the `federation` stream: traffic for the federation sender
    /// to send (`FederationStreamRow`). Only written when the main process
    /// does not send federation itself.
    ///
    /// `data` is the serialisation of one of Synapse's
    /// `federation.send_queue` rows, kept as JSON text: `pd` rows carry
    /// `{"state": ..., "dests": [...]}`, `k` rows `{"key": [...], "edu":
    /// {...}}` and `e` rows the EDU itself (`{"edu_type": ..., "content":
    /// {...}, "origin": ..., "destination": ...}`). These are the same in
    /// every release from 1.98.0 to 1.163.2.
    pub struct FederationRow {
        expecting: "a federation row",
        prefix: "",
        fields: {
            /// The kind of data: `pd` (presence to destinations), `k` (keyed
            /// EDU) or `e` (EDU).
            row_type: String = "type",
            /// The data, as JSON text in Synapse's spelling.
            data: super::RawJson = "data",
        }
    }
}
