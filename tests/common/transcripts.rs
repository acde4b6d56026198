//! What the follower's and the writer's transcript tests share
//! (`tests/follower_transcripts.rs`, `tests/writer_transcripts.rs`): the
//! deployment they run in.

use std::sync::Arc;

use serde_json::json;
use synapse_replication::config::StreamWriters;
use synapse_replication::wire::InstanceName;
use synapse_replication::writers::WriterRegistry;

/// master, w1, w2 (events and receipts), w3 (typing); Redis, so every
/// process writes `caches`.
pub fn deployment() -> Arc<dyn WriterRegistry> {
    Arc::new(
        StreamWriters::from_value(json!({
            "redis": {"enabled": true},
            "instance_map": {
                "main": {"host": "m", "port": 8000},
                "w1": {"host": "w1", "port": 8001},
                "w2": {"host": "w2", "port": 8002},
                "w3": {"host": "w3", "port": 8003},
            },
            "stream_writers": {"events": ["w1", "w2"], "receipts": ["w1", "w2"], "typing": "w3"},
        }))
        .unwrap(),
    )
}

/// The instance `s`.
pub fn name(s: &str) -> InstanceName {
    InstanceName::from(s)
}
