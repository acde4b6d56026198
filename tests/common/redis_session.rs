//! The sans-IO Redis session the session tests drive
//! (`tests/redis_transcripts.rs`, `tests/secrets.rs`): `worker1` of the
//! deployment `example.com`.

use std::sync::Arc;

use synapse_replication::config::StreamWriters;
use synapse_replication::positions::{Follower, Writer};
use synapse_replication::session::{RedisSession, RedisSessionConfig};
use synapse_replication::wire::{InstanceName, StreamName, Token};

/// The channel prefix (the deployment's server name).
pub const PREFIX: &str = "example.com";

/// Synapse's default writers, over Redis: `master` writes every stream,
/// and every process writes `caches`.
pub fn registry() -> Arc<StreamWriters> {
    Arc::new(StreamWriters::default().with_redis(true))
}

/// `worker1`: follows what `master` writes, writes `caches` (every process
/// does with Redis), whose token is 7.
pub fn redis_session(options: RedisSessionConfig) -> RedisSession {
    let me = InstanceName::from("worker1");
    let mut writer = Writer::new(me.clone(), registry());
    writer
        .advance(&StreamName::Caches, Token(7))
        .expect("caches advances");
    RedisSession::new(options, Follower::new(me, registry()), writer)
}
