//! Layer 3: positions, batches and catch-up — the replication core.
//!
//! Two state machines, both sans-IO (no sockets, no clock, no runtime):
//!
//! - [`Follower`] keeps, for every (stream, writer), the last token applied,
//!   and turns incoming `RDATA` and `POSITION` commands into
//!   [`FollowerEvent`]s: rows to apply, positions reached, and
//!   [`CatchUpRequest`]s for rows that were missed and must be fetched out
//!   of band.
//! - [`Writer`] turns the rows a process writes into `RDATA` and `POSITION`
//!   commands, announces its positions on connect and in answer to
//!   `REPLICATE`, and rate-limits the `REPLICATE`s it sends.
//!
//! Beside them, [`PositionWaits`] holds waits for a writer's position
//! (read-your-writes, the replication HTTP API's `_stream_positions`),
//! resolved by the positions the application has applied; and
//! [`StreamIds`] keeps the ids of a database-backed stream as Synapse's
//! `MultiWriterIdGenerator` does (taken from a PostgreSQL sequence,
//! persisted in any order), and the position its writer may announce;
//! [`CacheInvalidation`] and [`Outbox`] are what a writer of `caches`
//! writes and when it may send it, [`caches_page`] the catch-up page
//! Synapse's writer answers from its table; [`AccountDataPage`] is the
//! `account_data` page Synapse's writer builds from its three tables, and
//! [`IgnoredUsersChange`] what `m.ignored_user_list` does to
//! `ignored_users`.
//!
//! Both follow Synapse 1.163.2 (`replication/tcp/handler.py`,
//! `replication/tcp/resource.py`), with the deliberate differences listed
//! on each type.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Instant;
//! use synapse_replication::positions::{Follower, FollowerEvent, Writer};
//! use synapse_replication::wire::{InstanceName, RawRow, StreamName, Token};
//! use synapse_replication::config::StreamWriters;
//!
//! let registry = Arc::new(StreamWriters::default());
//! let now = Instant::now();
//!
//! // The main process writes `typing`...
//! let mut writer = Writer::new(InstanceName::master(), registry.clone());
//! writer.advance(&StreamName::Typing, Token(0))?;
//! writer.connected(now);
//! writer.write(
//!     &StreamName::Typing,
//!     Token(1),
//!     [(Token(1), RawRow::new(&br#"["!room:example.com",["@a:example.com"]]"#[..])?)],
//! )?;
//!
//! // ...and a worker follows it.
//! let mut follower = Follower::new(InstanceName::from("worker1"), registry);
//! follower.set_position(&StreamName::Typing, &InstanceName::master(), Token(0))?;
//! // Commands straight from the writer: no other process speaks here.
//! follower.connected_direct();
//! while let Some(command) = writer.poll_command() {
//!     follower.handle_command(command);
//! }
//! let mut rows = Vec::new();
//! while let Some(event) = follower.poll_event() {
//!     if let FollowerEvent::Rows { token, rows: batch, .. } = event {
//!         rows.push((token, batch));
//!     }
//! }
//! assert_eq!(rows.len(), 1);
//! assert_eq!(follower.position(&StreamName::Typing, &InstanceName::master()), Some(Token(1)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod account_data;
mod caches;
mod catch_up;
mod follower;
mod history;
mod ids;
mod waits;
mod writer;

pub use account_data::{
    AccountDataPage, AccountDataQuery, AccountDataRow, AccountDataTable, IGNORED_USER_LIST,
    IgnoreSelfError, IgnoredUsersChange, TAG_DATA_TYPE,
};
pub use caches::{CacheInvalidation, CacheInvalidationError, InvalidationRow, Outbox, caches_page};
pub use catch_up::{
    BoxError, CatchUpError, CatchUpId, CatchUpPage, CatchUpPageError, CatchUpRequest,
    STUCK_AFTER_FAILURES, StuckCatchUp,
};
pub use follower::{
    Follower, FollowerCounters, FollowerEvent, FollowerLimits, RejectReason, RowOrigin, Rows,
    SeedError,
};
pub use history::{History, HistoryError, HistoryMode, TARGET_ROW_COUNT};
pub use ids::{Loading, MAX_INSTANCES, Reservation, StreamIdError, StreamIds};
pub use waits::{PositionWaits, Registered, TooManyWaiters, Wait, WaitId};
pub use writer::{RateLimit, WriteError, Writer, WriterConfig, WriterCounters};

use crate::wire::StreamName;

/// Whether a stream's tokens only ever grow, per writer.
///
/// True for every stream backed by a database sequence. False for the
/// three streams whose writer keeps its position in memory and starts
/// again from 0 when it restarts: `typing`, `presence_federation` and
/// `federation`. Streams this crate does not know are assumed to grow (as
/// every stream Synapse added since 2020 does).
///
/// For a stream whose tokens only grow, a follower drops a `POSITION` whose
/// new token is not above its current one (Synapse's
/// `can_discard_position`); for the others such a `POSITION` is a reset.
pub fn tokens_only_grow(stream: &StreamName) -> bool {
    !matches!(
        stream,
        StreamName::Typing | StreamName::PresenceFederation | StreamName::Federation
    )
}
