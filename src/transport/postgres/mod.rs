//! Stream ids from Synapse's PostgreSQL: the database side of a writer of
//! a database-backed stream.
//!
//! Sixteen of Synapse's nineteen replication streams live in its
//! database (all but `typing`, `federation` and `presence_federation`),
//! and one id sequence more that has no stream of its own (cross-signing
//! keys). Every writer of one takes ids from the stream's one PostgreSQL
//! sequence, writes rows carrying its `instance_name`, and after each
//! commit moves its row of `stream_positions` forward (Synapse's
//! `MultiWriterIdGenerator`). The
//! bookkeeping is sans-IO ([`StreamIds`](crate::positions::StreamIds));
//! this module is what meets the database:
//!
//! - [`DatabaseStream`]: each stream's sequence, tables and
//!   `stream_positions` name, and the SQL Synapse runs on them.
//! - [`StreamIdStore`]: what a writer needs from the database. Implement
//!   it on your own pool's connections, or take the implementation on
//!   `tokio_postgres::Client` (feature `postgres`).
//! - [`DatabaseIds`]: a [`StreamIds`](crate::positions::StreamIds) kept in
//!   step with a store: load at startup, take ids, persist.
//! - [`CacheInvalidations`]: cache invalidations written as Synapse's
//!   processes write them (`caches`), and [`CachesCatchUp`], their
//!   catch-up served from the table as Synapse's writer serves it, both
//!   on a [`CachesStore`].
//! - [`AccountDataStore`]: Synapse's account-data writer on its tables
//!   (the six changes, `ignored_users` and its invalidations,
//!   `max_stream_id`), and [`AccountDataCatchUp`], the stream's catch-up
//!   as Synapse's writer serves it, both on an [`AccountDataTables`].
//! - `PostgresConnect` (feature `postgres`): a tokio-postgres client for
//!   Synapse's `database` section, over a socket any
//!   [`Runtime`](crate::transport::Runtime) opens (smol or tokio).
//!
//! # The streams (Synapse 1.163.2)
//!
//! | Stream | `stream_positions` name | Sequence | Tables (id column) |
//! |---|---|---|---|
//! | `account_data` | `account_data` | `account_data_sequence` | `room_account_data`, `room_tags_revisions`, `account_data` |
//! | `caches` | (not kept) | `cache_invalidation_stream_seq` | `cache_invalidation_stream_by_instance` |
//! | `events` | `events` | `events_stream_seq` | `events` (`stream_ordering`), `current_state_delta_stream`, `ex_outlier_stream` (`event_stream_ordering`) |
//! | `backfill` (counts down) | `backfill` | `events_backfill_stream_seq` | `events` (`stream_ordering`), `ex_outlier_stream` (`event_stream_ordering`) |
//! | `presence` | `presence_stream` | `presence_stream_sequence` | `presence_stream` |
//! | `receipts` | `receipts` | `receipts_sequence` | `receipts_linearized` |
//! | `push_rules` | `push_rules_stream` | `push_rules_stream_sequence` | `push_rules_stream` |
//! | `pushers` | `pushers` | `pushers_sequence` | `pushers` (`id`), `deleted_pushers` |
//! | `device_lists` | `device_lists_stream` | `device_lists_sequence` | `device_lists_stream`, `user_signature_stream`, `device_lists_outbound_pokes`, `device_lists_changes_in_room`, `device_lists_remote_pending`, `device_lists_changes_converted_stream_position` |
//! | `to_device` | `to_device` | `device_inbox_sequence` | `device_inbox`, `device_federation_outbox` |
//! | `thread_subscriptions` | `thread_subscriptions` | `thread_subscriptions_sequence` | `thread_subscriptions` |
//! | `un_partial_stated_room` | `un_partial_stated_room_stream` | `un_partial_stated_room_stream_sequence` | `un_partial_stated_room_stream` |
//! | `un_partial_stated_event` | `un_partial_stated_event_stream` | `un_partial_stated_event_stream_sequence` | `un_partial_stated_event_stream` |
//! | `profile_updates` | `profile_updates` | `profile_updates_sequence` | `profile_updates` |
//! | `sticky_events` | `sticky_events` | `sticky_events_sequence` | `sticky_events` |
//! | `quarantined_media` | `quarantined_media` | `quarantined_media_id_seq` | `quarantined_media_changes` |
//! | (cross-signing keys) | (not kept) | `e2e_cross_signing_keys_sequence` | `e2e_cross_signing_keys` |
//!
//! The id column is `stream_id` where not named, the writer's column
//! `instance_name` everywhere (Synapse's account-data writer leaves it
//! `NULL` in its three tables; such rows count as persisted at startup).
//!
//! # Example
//!
//! On tokio (on smol, see `PostgresConnect`): a writer of `account_data`
//! takes an id, writes its row with it, and after the commit writes and
//! announces its position.
//!
//! ```no_run
//! # #[cfg(all(feature = "postgres", feature = "runtime-tokio"))]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use synapse_replication::config::SynapseConfig;
//! use synapse_replication::transport::TokioRuntime;
//! use synapse_replication::transport::postgres::{DatabaseIds, DatabaseStream, PostgresConnect};
//! use synapse_replication::wire::InstanceName;
//!
//! let synapse = SynapseConfig::from_json(&std::fs::read_to_string("homeserver.json")?)?;
//! let connect = PostgresConnect::new(synapse.database().ok_or("no database section")?)?;
//! let runtime = TokioRuntime::current().ok_or("not on a tokio runtime")?;
//! let (client, connection) = connect.connect(&runtime).await?;
//! tokio::spawn(connection);
//!
//! let me = InstanceName::from("rust_account_data");
//! let ids = DatabaseIds::load(client, DatabaseStream::ACCOUNT_DATA, me.clone(), [me.clone()])
//!     .await?;
//! let taken = ids.take(1).await?;
//! ids.store()
//!     .execute(
//!         "INSERT INTO account_data (user_id, account_data_type, stream_id, content, instance_name) \
//!          VALUES ($1, $2, $3, $4, $5)",
//!         &[&"@alice:example.com", &"org.example", &taken[0].0, &"{}", &me.as_str()],
//!     )
//!     .await?;
//! let position = ids.persisted(&taken).await?;
//! println!("RDATA account_data {me} {position} ...");
//! # Ok(())
//! # }
//! # fn main() {}
//! ```

mod account_data;
mod caches;
#[cfg(feature = "postgres")]
mod client;
mod store;
mod streams;

pub use account_data::{
    AccountDataCatchUp, AccountDataCatchUpError, AccountDataError, AccountDataStore,
    AccountDataTables, CLEAR_GLOBAL_SQL, CLEAR_ROOM_SQL, DELETE_ALL_IGNORED_USERS_SQL,
    DELETE_IGNORED_USERS_SQL, DELETE_TAG_SQL, IGNORED_USERS_SQL, INSERT_IGNORED_USERS_SQL,
    INSERT_TAG_REVISION_SQL, PendingAccountData, PublishRows, UPDATE_TAG_REVISION_SQL,
    UPSERT_GLOBAL_SQL, UPSERT_ROOM_SQL, UPSERT_TAG_SQL, updated_account_data_sql,
};
pub use caches::{
    CacheInvalidations, CacheInvalidationsError, CachesCatchUp, CachesCatchUpError, CachesStore,
    MAX_INVALIDATION_ROWS, PendingInvalidations, UPDATED_CACHES_SQL, insert_invalidations_sql,
};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use client::{PostgresConnect, PostgresConnection, PostgresError};
pub use store::{DatabaseIds, DatabaseIdsError, StreamIdStore};
pub use streams::{DatabaseStream, StreamTable};
