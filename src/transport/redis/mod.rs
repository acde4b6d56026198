//! The Redis transport: [`client::RedisClient`] keeps a session's
//! connections up, and `sentinel` finds the master through Redis Sentinel.

pub(crate) mod client;
pub(crate) mod sentinel;
