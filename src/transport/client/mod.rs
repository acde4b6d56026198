//! What the Redis and TCP clients share: where catch-ups come from, the
//! catch-ups they fetch for their follower, their backoff, the queue
//! other tasks send and write through, and the waits for a position.

pub(crate) mod backoff;
pub(crate) mod catch_ups;
pub(crate) mod command_queue;
pub(crate) mod source;
pub(crate) mod waits;
