//! The `account_data` stream on Synapse's database: [`AccountDataStore`]
//! makes the six changes as Synapse's account-data writer makes them,
//! [`AccountDataCatchUp`] answers catch-up from the tables as Synapse's
//! writer does, both on an [`AccountDataTables`].

use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use async_trait::async_trait;
use serde_json::{Map, Value};

use super::caches::{
    CacheInvalidations, CacheInvalidationsError, CachesStore, MAX_INVALIDATION_ROWS,
    PendingInvalidations,
};
use super::store::{DatabaseIds, DatabaseIdsError};
use super::streams::DatabaseStream;
use crate::http::{AccountDataRequest, ReplicationError};
use crate::positions::{
    AccountDataPage, AccountDataQuery, AccountDataRow, AccountDataTable, BoxError,
    CacheInvalidation, CacheInvalidationError, CatchUpPage, CatchUpRequest, IGNORED_USER_LIST,
    IgnoreSelfError, IgnoredUsersChange, Outbox, StreamIdError, TAG_DATA_TYPE, TARGET_ROW_COUNT,
};
use crate::transport::CatchUpSource;
use crate::wire::{InstanceName, JsonError, RawRow, StreamName, Token};

/// `add_account_data_for_user`'s upsert (`simple_upsert_txn` on
/// PostgreSQL). Parameters: `user_id`, `account_data_type`, `stream_id`
/// (`bigint`), `content` (JSON text). `instance_name` is not written, as
/// Synapse does not write it (new rows have it `NULL`).
pub const UPSERT_GLOBAL_SQL: &str = "INSERT INTO account_data \
     (user_id, account_data_type, stream_id, content) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (user_id, account_data_type) \
     DO UPDATE SET stream_id=EXCLUDED.stream_id, content=EXCLUDED.content";

/// `remove_account_data_for_user`'s update: the item's content becomes
/// `{}` at a new id, unless it is `{}` already. Parameters: `stream_id`,
/// `user_id`, `account_data_type`.
pub const CLEAR_GLOBAL_SQL: &str = "UPDATE account_data SET stream_id = $1, content = '{}' \
     WHERE user_id = $2 AND account_data_type = $3 AND content != '{}'";

/// `add_account_data_to_room`'s upsert. Parameters: `user_id`, `room_id`,
/// `account_data_type`, `stream_id`, `content`.
pub const UPSERT_ROOM_SQL: &str = "INSERT INTO room_account_data \
     (user_id, room_id, account_data_type, stream_id, content) VALUES ($1, $2, $3, $4, $5) \
     ON CONFLICT (user_id, room_id, account_data_type) \
     DO UPDATE SET stream_id=EXCLUDED.stream_id, content=EXCLUDED.content";

/// `remove_account_data_for_room`'s update. Parameters: `stream_id`,
/// `user_id`, `room_id`, `account_data_type`.
pub const CLEAR_ROOM_SQL: &str = "UPDATE room_account_data SET stream_id = $1, content = '{}' \
     WHERE user_id = $2 AND room_id = $3 AND account_data_type = $4 AND content != '{}'";

/// `add_tag_to_room`'s upsert. Parameters: `user_id`, `room_id`, `tag`,
/// `content`.
pub const UPSERT_TAG_SQL: &str = "INSERT INTO room_tags (user_id, room_id, tag, content) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (user_id, room_id, tag) \
     DO UPDATE SET content=EXCLUDED.content";

/// `remove_tag_from_room`'s delete. Parameters: `user_id`, `room_id`,
/// `tag`.
pub const DELETE_TAG_SQL: &str =
    "DELETE FROM room_tags WHERE user_id = $1 AND room_id = $2 AND tag = $3";

/// `_update_revision_txn`'s update of a room's tag revision. Parameters:
/// `stream_id`, `user_id`, `room_id`. When it updates no row,
/// [`INSERT_TAG_REVISION_SQL`] follows.
pub const UPDATE_TAG_REVISION_SQL: &str =
    "UPDATE room_tags_revisions SET stream_id = $1 WHERE user_id = $2 AND room_id = $3";

/// `_update_revision_txn`'s insert. Parameters: `user_id`, `room_id`,
/// `stream_id`. Synapse runs a plain `INSERT` and ignores the unique
/// violation of a concurrent insert ("it doesn't matter which stream_id
/// ends up in the table"); on PostgreSQL that violation aborts its
/// transaction, so this says what Synapse means instead: `ON CONFLICT DO
/// NOTHING`.
pub const INSERT_TAG_REVISION_SQL: &str = "INSERT INTO room_tags_revisions (user_id, room_id, stream_id) VALUES ($1, $2, $3) \
     ON CONFLICT (user_id, room_id) DO NOTHING";

/// The users a user ignores (`simple_select_onecol_txn`). Parameter:
/// `ignorer_user_id`.
pub const IGNORED_USERS_SQL: &str =
    "SELECT ignored_user_id FROM ignored_users WHERE ignorer_user_id = $1";

/// Some of a user's rows of `ignored_users` deleted. Parameters:
/// `ignorer_user_id`, the `ignored_user_id`s (`text[]`).
pub const DELETE_IGNORED_USERS_SQL: &str =
    "DELETE FROM ignored_users WHERE ignorer_user_id = $1 AND ignored_user_id = ANY($2)";

/// All of a user's rows of `ignored_users` deleted. Parameter:
/// `ignorer_user_id`.
pub const DELETE_ALL_IGNORED_USERS_SQL: &str =
    "DELETE FROM ignored_users WHERE ignorer_user_id = $1";

/// Rows of `ignored_users` inserted. Parameters: `ignorer_user_id`, the
/// `ignored_user_id`s (`text[]`).
pub const INSERT_IGNORED_USERS_SQL: &str =
    "INSERT INTO ignored_users (ignorer_user_id, ignored_user_id) SELECT $1, unnest($2::text[])";

/// The catch-up query of `table` (Synapse's
/// `get_updated_global_account_data`, `get_updated_room_account_data`,
/// `get_all_updated_tags`), each row as `stream_id, user_id, room_id,
/// type` (`NULL` room for global data; tags' type added by the caller).
/// Parameters: `from` (exclusive), `to` (inclusive), the limit.
pub fn updated_account_data_sql(table: AccountDataTable) -> &'static str {
    match table {
        AccountDataTable::Global => {
            "SELECT stream_id, user_id, NULL::text, account_data_type \
             FROM account_data WHERE $1 < stream_id AND stream_id <= $2 \
             ORDER BY stream_id ASC LIMIT $3"
        }
        AccountDataTable::Room => {
            "SELECT stream_id, user_id, room_id, account_data_type \
             FROM room_account_data WHERE $1 < stream_id AND stream_id <= $2 \
             ORDER BY stream_id ASC LIMIT $3"
        }
        AccountDataTable::Tags => {
            "SELECT stream_id, user_id, room_id, NULL::text \
             FROM room_tags_revisions as r WHERE $1 < stream_id AND stream_id <= $2 \
             ORDER BY stream_id ASC LIMIT $3"
        }
    }
}

/// What the `account_data` stream needs from Synapse's database, beside
/// its ids ([`StreamIdStore`](super::StreamIdStore)) and cache
/// invalidations ([`CachesStore`]): the statements Synapse's writer runs
/// on `account_data`, `room_account_data`, `room_tags`,
/// `room_tags_revisions` and `ignored_users`.
///
/// Implemented for `tokio_postgres::Client` and
/// `tokio_postgres::Transaction` (feature `postgres`) with the `*_SQL`
/// constants of this module; implement it on your own pool's connections
/// with the same statements.
#[async_trait]
pub trait AccountDataTables: CachesStore {
    /// [`UPSERT_GLOBAL_SQL`].
    async fn upsert_global(
        &self,
        user_id: &str,
        data_type: &str,
        stream_id: Token,
        content: &str,
    ) -> Result<(), Self::Error>;

    /// [`CLEAR_GLOBAL_SQL`]: the rows updated.
    async fn clear_global(
        &self,
        user_id: &str,
        data_type: &str,
        stream_id: Token,
    ) -> Result<u64, Self::Error>;

    /// [`UPSERT_ROOM_SQL`].
    async fn upsert_room(
        &self,
        user_id: &str,
        room_id: &str,
        data_type: &str,
        stream_id: Token,
        content: &str,
    ) -> Result<(), Self::Error>;

    /// [`CLEAR_ROOM_SQL`]: the rows updated.
    async fn clear_room(
        &self,
        user_id: &str,
        room_id: &str,
        data_type: &str,
        stream_id: Token,
    ) -> Result<u64, Self::Error>;

    /// [`UPSERT_TAG_SQL`].
    async fn upsert_tag(
        &self,
        user_id: &str,
        room_id: &str,
        tag: &str,
        content: &str,
    ) -> Result<(), Self::Error>;

    /// [`DELETE_TAG_SQL`].
    async fn delete_tag(&self, user_id: &str, room_id: &str, tag: &str) -> Result<(), Self::Error>;

    /// [`UPDATE_TAG_REVISION_SQL`], then [`INSERT_TAG_REVISION_SQL`] if it
    /// updated no row.
    async fn update_tag_revision(
        &self,
        user_id: &str,
        room_id: &str,
        stream_id: Token,
    ) -> Result<(), Self::Error>;

    /// [`IGNORED_USERS_SQL`].
    async fn ignored_users(&self, user_id: &str) -> Result<Vec<String>, Self::Error>;

    /// [`DELETE_IGNORED_USERS_SQL`] with `ignored`, or
    /// [`DELETE_ALL_IGNORED_USERS_SQL`] with `None`.
    async fn delete_ignored_users(
        &self,
        user_id: &str,
        ignored: Option<&[String]>,
    ) -> Result<(), Self::Error>;

    /// [`INSERT_IGNORED_USERS_SQL`].
    async fn insert_ignored_users(
        &self,
        user_id: &str,
        ignored: &[String],
    ) -> Result<(), Self::Error>;

    /// The rows `query` asks for ([`updated_account_data_sql`]), tags'
    /// `data_type` [`TAG_DATA_TYPE`].
    async fn updated_account_data(
        &self,
        query: &AccountDataQuery,
    ) -> Result<Vec<AccountDataRow>, Self::Error>;
}

/// A change of account data that was not made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AccountDataError<E: std::error::Error + 'static> {
    /// `m.ignored_user_list` naming its own user: Synapse's 400
    /// `M_INVALID_PARAM`. Nothing was written.
    #[error(transparent)]
    IgnoreSelf(#[from] IgnoreSelfError),
    /// The ids' bookkeeping refused (this process is not
    /// `stream_writers.account_data`, ...).
    #[error(transparent)]
    Ids(#[from] StreamIdError),
    /// A cache invalidation Synapse would not write (not expected: the
    /// caches named are Synapse's own).
    #[error(transparent)]
    Invalidation(#[from] CacheInvalidationError),
    /// More cache keys in one invalidation than one statement writes (not
    /// expected: they are split to [`MAX_INVALIDATION_ROWS`]).
    #[error("{rows} cache keys in one invalidation")]
    TooManyInvalidations {
        /// The keys.
        rows: usize,
    },
    /// The content or a row could not be written as JSON.
    #[error("account data: {0}")]
    Json(#[from] JsonError),
    /// The database failed: the transaction is to be rolled back (the
    /// ids taken are given up).
    #[error("database: {0}")]
    Database(#[source] E),
}

impl<E: std::error::Error + 'static> From<DatabaseIdsError<E>> for AccountDataError<E> {
    fn from(error: DatabaseIdsError<E>) -> Self {
        match error {
            DatabaseIdsError::Ids(error) => AccountDataError::Ids(error),
            DatabaseIdsError::Database(error) => AccountDataError::Database(error),
        }
    }
}

impl<E: std::error::Error + 'static> From<CacheInvalidationsError<E>> for AccountDataError<E> {
    fn from(error: CacheInvalidationsError<E>) -> Self {
        match error {
            CacheInvalidationsError::Invalid(error) => AccountDataError::Invalidation(error),
            CacheInvalidationsError::Ids(error) => AccountDataError::Ids(error),
            CacheInvalidationsError::Json(error) => AccountDataError::Json(error),
            CacheInvalidationsError::Database(error) => AccountDataError::Database(error),
            CacheInvalidationsError::TooManyRows { rows } => {
                AccountDataError::TooManyInvalidations { rows }
            }
        }
    }
}

impl<E: std::error::Error + 'static> AccountDataError<E> {
    /// The answer Synapse's writer gives its caller for this failure:
    /// 400 `M_INVALID_PARAM` "You cannot ignore yourself", else a 500.
    pub fn to_replication_error(&self) -> ReplicationError {
        match self {
            AccountDataError::IgnoreSelf(error) => {
                ReplicationError::refused(400, "M_INVALID_PARAM", error.to_string())
            }
            _ => ReplicationError::refused(500, "M_UNKNOWN", "Internal server error"),
        }
    }
}

/// A change written in a transaction not yet committed: give it to
/// [`AccountDataStore::committed`] once it commits, or to
/// [`AccountDataStore::rolled_back`]. Until then the writer's position
/// stays below its id.
#[derive(Debug)]
#[must_use = "the position waits for this id until it is committed or rolled back"]
pub struct PendingAccountData {
    id: Token,
    row: Option<(Token, RawRow)>,
    invalidations: Vec<PendingInvalidations>,
}

impl PendingAccountData {
    /// The id taken from `account_data_sequence`.
    pub fn id(&self) -> Token {
        self.id
    }

    /// The `account_data` row to send once committed: none for a removal
    /// that found nothing to remove.
    pub fn row(&self) -> Option<&(Token, RawRow)> {
        self.row.as_ref()
    }

    /// The cache invalidations written with it (`m.ignored_user_list`).
    pub fn invalidations(&self) -> &[PendingInvalidations] {
        &self.invalidations
    }
}

/// Where committed rows go: the stream, this writer's position, the rows
/// now covered by it (give them to
/// [`Writer::write`](crate::positions::Writer::write) or
/// [`CommandSender::write`](crate::transport::CommandSender::write)).
/// Called under a lock, in position order: it must not block.
pub type PublishRows = dyn Fn(&StreamName, Token, Vec<(Token, RawRow)>) + Send + Sync;

/// Synapse's account-data writer on its database (the process
/// `stream_writers.account_data` names): the six changes of
/// `AccountDataWorkerStore` and `TagsWorkerStore` in Synapse 1.163.2
/// (`add_account_data_for_user`, `remove_account_data_for_user`,
/// `add_account_data_to_room`, `remove_account_data_for_room`,
/// `add_tag_to_room`, `remove_tag_from_room`), writing the same rows of the
/// same tables, with ids from `account_data_sequence`, its row of
/// `stream_positions` after each commit, and, for `m.ignored_user_list`,
/// `ignored_users` and the `caches` rows that make Synapse's processes
/// drop their `ignored_users` and `ignored_by` entries (in the same
/// transaction). Each answers `max_stream_id`: the stream's position once
/// the change is persisted (Synapse's `get_current_token()`), what
/// [`AccountDataAnswer`](crate::http::AccountDataAnswer) carries.
///
/// As Synapse's, whatever its annotations say:
///
/// - every change takes an id, also a removal that finds nothing to
///   remove (no row carries it; the position passes it), and answers the
///   position then;
/// - rows' `instance_name` is left `NULL` (Synapse's upserts do not set
///   it; the id generator counts such rows as persisted);
/// - a removal sets the content to `{}` at the new id and keeps the row;
///   removing `m.ignored_user_list` deletes every `ignored_users` row of
///   the user and invalidates `ignored_users` even when there were none;
///   setting it invalidates only when the set of ignored users changed;
/// - a change of tags writes `room_tags` and moves the room's
///   `room_tags_revisions` row to the new id (the stream's row for tags).
///
/// One deliberate difference: Synapse invalidates `ignored_by` for the
/// users whose ignoring changed in the order of a Python set (by hash);
/// this does it in sorted order. The same rows, with the same ids as a
/// set, and only the pairing of ids and keys may differ.
///
/// The rows for the wire (`account_data` and `caches`) go to the
/// publisher given with [`with_publisher`](Self::with_publisher), in
/// token order, only once this writer's position covers them.
///
/// ```no_run
/// # #[cfg(all(feature = "postgres", feature = "runtime-tokio"))]
/// # async fn run(
/// #     ids: tokio_postgres::Client,
/// #     caches: tokio_postgres::Client,
/// #     mut writes: tokio_postgres::Client,
/// # ) -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use synapse_replication::http::AccountDataRequest;
/// use synapse_replication::transport::postgres::{AccountDataStore, CacheInvalidations};
/// use synapse_replication::wire::InstanceName;
///
/// let me = InstanceName::from("rust_account_data");
/// let caches = Arc::new(CacheInvalidations::load(caches, me.clone()).await?);
/// let store = AccountDataStore::load(ids, caches, me.clone(), [me]).await?
///     .with_publisher(|stream, position, rows| {
///         // sender.write(stream, position, rows) ...
///         println!("{stream} at {position}: {} rows", rows.len());
///     });
/// let content = serde_json::json!({"ignored_users": {"@spam:example.com": {}}});
/// let change = AccountDataRequest::AddUserAccountData {
///     user_id: "@alice:example.com".to_owned(),
///     account_data_type: "m.ignored_user_list".to_owned(),
///     content: content.as_object().cloned().unwrap_or_default(),
/// };
/// let max_stream_id = store.apply(&mut writes, &change).await?;
/// println!("max_stream_id {max_stream_id}");
/// # Ok(())
/// # }
/// # fn main() {}
/// ```
pub struct AccountDataStore<S> {
    ids: DatabaseIds<S>,
    caches: Arc<CacheInvalidations<S>>,
    outbox: Mutex<Outbox>,
    publish: Option<Arc<PublishRows>>,
    clock: fn() -> SystemTime,
}

impl<S> std::fmt::Debug for AccountDataStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccountDataStore")
            .field("publishes", &self.publish.is_some())
            .finish_non_exhaustive()
    }
}

/// The content as Synapse stores it (`json_encoder.encode`): compact,
/// keys in the order they came, non-ASCII escaped.
fn content_json(content: &Map<String, Value>) -> Result<String, JsonError> {
    let bytes = crate::wire::json::to_vec(content)?;
    // The encoder writes ASCII only.
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

impl<S: AccountDataTables> AccountDataStore<S> {
    /// Reads the stream's ids back from the database (Synapse's
    /// `_load_current_ids`: see [`DatabaseIds::load`]) as `own`, one of
    /// `writers` (`stream_writers.account_data`); cache invalidations go
    /// through `caches`, this process's.
    pub async fn load(
        store: S,
        caches: Arc<CacheInvalidations<S>>,
        own: InstanceName,
        writers: impl IntoIterator<Item = InstanceName>,
    ) -> Result<AccountDataStore<S>, DatabaseIdsError<S::Error>> {
        let ids = DatabaseIds::load(store, DatabaseStream::ACCOUNT_DATA, own, writers).await?;
        Ok(AccountDataStore {
            ids,
            caches,
            outbox: Mutex::new(Outbox::new()),
            publish: None,
            clock: SystemTime::now,
        })
    }

    /// Sends committed rows (`account_data` and `caches`) to `publish`.
    #[must_use]
    pub fn with_publisher(
        mut self,
        publish: impl Fn(&StreamName, Token, Vec<(Token, RawRow)>) + Send + Sync + 'static,
    ) -> AccountDataStore<S> {
        self.publish = Some(Arc::new(publish));
        self
    }

    /// The clock cache invalidations are stamped with (Synapse's
    /// `time_msec`; `SystemTime::now` unless given).
    #[must_use]
    pub fn with_clock(mut self, clock: fn() -> SystemTime) -> AccountDataStore<S> {
        self.clock = clock;
        self
    }

    /// Makes `change` in `on` (a transaction of the application's, or any
    /// [`AccountDataTables`]): takes its id, writes its rows and, for
    /// `m.ignored_user_list`, `ignored_users` and the cache
    /// invalidations. Nothing is sent until
    /// [`committed`](Self::committed). On an error the ids are given up:
    /// roll the transaction back.
    pub async fn write_on<T: AccountDataTables + ?Sized>(
        &self,
        on: &T,
        change: &AccountDataRequest,
    ) -> Result<PendingAccountData, AccountDataError<T::Error>> {
        let taken = self.ids.take_on(on, 1).await?;
        let id = taken
            .first()
            .copied()
            .ok_or(StreamIdError::NotAllocated(Token(0)))?;
        let mut invalidations = Vec::new();
        let written = self.write_rows(on, change, id, &mut invalidations).await;
        match written {
            Ok(row) => Ok(PendingAccountData {
                id,
                row,
                invalidations,
            }),
            Err(error) => {
                // No row will carry them: the positions may pass them.
                self.ids.rolled_back(&taken)?;
                for pending in invalidations {
                    self.caches.rolled_back(pending, |_, _| ())?;
                }
                Err(error)
            }
        }
    }

    async fn write_rows<T: AccountDataTables + ?Sized>(
        &self,
        on: &T,
        change: &AccountDataRequest,
        id: Token,
        invalidations: &mut Vec<PendingInvalidations>,
    ) -> Result<Option<(Token, RawRow)>, AccountDataError<T::Error>> {
        let database = AccountDataError::Database;
        let (user_id, room_id, data_type, written) = match change {
            AccountDataRequest::AddUserAccountData {
                user_id,
                account_data_type,
                content,
            } => {
                on.upsert_global(user_id, account_data_type, id, &content_json(content)?)
                    .await
                    .map_err(database)?;
                if account_data_type == IGNORED_USER_LIST {
                    let previously = on.ignored_users(user_id).await.map_err(database)?;
                    let change = IgnoredUsersChange::new(
                        user_id,
                        previously.iter().map(String::as_str),
                        content,
                    )?;
                    if let Some(change) = change {
                        on.delete_ignored_users(user_id, Some(&change.unignored))
                            .await
                            .map_err(database)?;
                        on.insert_ignored_users(user_id, &change.ignored)
                            .await
                            .map_err(database)?;
                        self.invalidate_ignored(on, user_id, change.changed(), invalidations)
                            .await?;
                    }
                }
                (user_id, None, account_data_type.as_str(), true)
            }
            AccountDataRequest::RemoveUserAccountData {
                user_id,
                account_data_type,
            } => {
                let updated = on
                    .clear_global(user_id, account_data_type, id)
                    .await
                    .map_err(database)?;
                if updated > 0 && account_data_type == IGNORED_USER_LIST {
                    let previously = on.ignored_users(user_id).await.map_err(database)?;
                    on.delete_ignored_users(user_id, None)
                        .await
                        .map_err(database)?;
                    let mut changed = previously;
                    changed.sort();
                    self.invalidate_ignored(on, user_id, changed, invalidations)
                        .await?;
                }
                (user_id, None, account_data_type.as_str(), updated > 0)
            }
            AccountDataRequest::AddRoomAccountData {
                user_id,
                room_id,
                account_data_type,
                content,
            } => {
                on.upsert_room(
                    user_id,
                    room_id,
                    account_data_type,
                    id,
                    &content_json(content)?,
                )
                .await
                .map_err(database)?;
                (user_id, Some(room_id), account_data_type.as_str(), true)
            }
            AccountDataRequest::RemoveRoomAccountData {
                user_id,
                room_id,
                account_data_type,
            } => {
                let updated = on
                    .clear_room(user_id, room_id, account_data_type, id)
                    .await
                    .map_err(database)?;
                (
                    user_id,
                    Some(room_id),
                    account_data_type.as_str(),
                    updated > 0,
                )
            }
            AccountDataRequest::AddTag {
                user_id,
                room_id,
                tag,
                content,
            } => {
                on.upsert_tag(user_id, room_id, tag, &content_json(content)?)
                    .await
                    .map_err(database)?;
                on.update_tag_revision(user_id, room_id, id)
                    .await
                    .map_err(database)?;
                (user_id, Some(room_id), TAG_DATA_TYPE, true)
            }
            AccountDataRequest::RemoveTag {
                user_id,
                room_id,
                tag,
            } => {
                on.delete_tag(user_id, room_id, tag)
                    .await
                    .map_err(database)?;
                on.update_tag_revision(user_id, room_id, id)
                    .await
                    .map_err(database)?;
                (user_id, Some(room_id), TAG_DATA_TYPE, true)
            }
        };
        if !written {
            return Ok(None);
        }
        let row = AccountDataRow {
            stream_id: id,
            user_id: user_id.clone(),
            room_id: room_id.cloned(),
            data_type: data_type.to_owned(),
        };
        Ok(Some((id, row.to_raw_row()?)))
    }

    /// `ignored_by` of each user in `changed` (one bulk invalidation, ids
    /// taken together), then `ignored_users` of the ignorer, as Synapse
    /// does.
    async fn invalidate_ignored<T: AccountDataTables + ?Sized>(
        &self,
        on: &T,
        user_id: &str,
        changed: Vec<String>,
        invalidations: &mut Vec<PendingInvalidations>,
    ) -> Result<(), AccountDataError<T::Error>> {
        let at = (self.clock)();
        for chunk in changed.chunks(MAX_INVALIDATION_ROWS) {
            let ignored_by =
                CacheInvalidation::entries("ignored_by", chunk.iter().map(|user| [user.as_str()]));
            invalidations.push(self.caches.invalidate_on(on, &ignored_by, at).await?);
        }
        let ignored_users = CacheInvalidation::entry("ignored_users", [user_id]);
        invalidations.push(self.caches.invalidate_on(on, &ignored_users, at).await?);
        Ok(())
    }

    /// The transaction of `pending` committed: hands the publisher the
    /// rows now covered (its cache invalidations, then its `account_data`
    /// row and any held before it), writes this writer's position to
    /// `stream_positions`, and returns `max_stream_id`: the stream's
    /// position (Synapse's `get_current_token()`).
    ///
    /// If writing the position fails the change still counts as
    /// persisted; the next call writes a position at least as high.
    pub async fn committed(
        &self,
        pending: PendingAccountData,
    ) -> Result<Token, AccountDataError<S::Error>> {
        for invalidations in pending.invalidations {
            self.caches.committed(invalidations, |position, rows| {
                self.publish(&StreamName::Caches, position, rows);
            })?;
        }
        self.finish(pending.id, pending.row)?;
        self.ids.write_position().await?;
        Ok(self.max_stream_id())
    }

    /// The transaction of `pending` rolled back: nothing of it is sent,
    /// and the positions may pass its ids.
    pub fn rolled_back(&self, pending: PendingAccountData) -> Result<Token, StreamIdError> {
        for invalidations in pending.invalidations {
            self.caches.rolled_back(invalidations, |position, rows| {
                self.publish(&StreamName::Caches, position, rows);
            })?;
        }
        self.finish(pending.id, None)
    }

    fn finish(&self, id: Token, row: Option<(Token, RawRow)>) -> Result<Token, StreamIdError> {
        // One lock from the position to the hand-over: a later position
        // never reaches the publisher before an earlier one.
        let mut outbox = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
        let position = self.ids.with_ids(|ids| ids.persisted(&[id]))?;
        if let Some((token, row)) = row {
            outbox.push(token, row);
        }
        let released = outbox.release(position);
        self.publish(&StreamName::AccountData, position, released);
        Ok(position)
    }

    fn publish(&self, stream: &StreamName, position: Token, rows: Vec<(Token, RawRow)>) {
        if let Some(publish) = &self.publish {
            publish(stream, position, rows);
        }
    }

    /// The stream's position for a reader (Synapse's
    /// `get_current_token()`): what each change answers.
    pub fn max_stream_id(&self) -> Token {
        self.ids.with_ids(|ids| ids.current_token())
    }

    /// This writer's position: what to announce (`POSITION account_data
    /// ...`) before anything is written.
    pub fn position(&self) -> Token {
        self.ids.with_ids(|ids| ids.own_position())
    }

    /// The ids, for what else they do (other writers' positions).
    pub fn ids(&self) -> &DatabaseIds<S> {
        &self.ids
    }

    /// This process's cache invalidations.
    pub fn caches(&self) -> &Arc<CacheInvalidations<S>> {
        &self.caches
    }
}

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl AccountDataStore<tokio_postgres::Client> {
    /// Makes `change` in a transaction of its own on `client`, commits it,
    /// and returns `max_stream_id`: what Synapse's writer answers each of
    /// the six calls. The typed handler of
    /// `HttpServer::with_account_data` (feature `http-server`) calls this.
    pub async fn apply(
        &self,
        client: &mut tokio_postgres::Client,
        change: &AccountDataRequest,
    ) -> Result<Token, AccountDataError<tokio_postgres::Error>> {
        let transaction = client
            .transaction()
            .await
            .map_err(AccountDataError::Database)?;
        // On an error the transaction is dropped: rolled back.
        let pending = self.write_on(&transaction, change).await?;
        match transaction.commit().await {
            Ok(()) => self.committed(pending).await,
            Err(error) => {
                self.rolled_back(pending)?;
                Err(AccountDataError::Database(error))
            }
        }
    }
}

/// A writer's `account_data` catch-up served from Synapse's database: the
/// pages Synapse's own writer gives for
/// `get_repl_stream_updates/account_data` ([`AccountDataPage`]: global,
/// room and tag rows by id, [`TARGET_ROW_COUNT`] a table, the page's
/// `upto_token` brought down to the last row of a table that filled it).
/// The rows are every writer's, as Synapse's queries do not look at the
/// writer, and each key's latest only (a row's id moves with each change).
///
/// Other streams go to the source given with
/// [`with_others`](AccountDataCatchUp::with_others) (a
/// [`CachesCatchUp`](super::CachesCatchUp), say), or fail.
pub struct AccountDataCatchUp<S> {
    store: S,
    others: Option<Arc<dyn CatchUpSource>>,
}

impl<S> std::fmt::Debug for AccountDataCatchUp<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccountDataCatchUp")
            .field("others", &self.others.is_some())
            .finish_non_exhaustive()
    }
}

/// An `account_data` catch-up that could not be answered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AccountDataCatchUpError<E: std::error::Error + 'static> {
    /// Asked for another stream, with no source for it.
    #[error("stream {0}: this source serves account_data only")]
    NotAccountData(StreamName),
    /// A row could not be written as JSON.
    #[error("account_data row: {0}")]
    Json(#[from] JsonError),
    /// The database failed.
    #[error("database: {0}")]
    Database(#[source] E),
}

impl<S: AccountDataTables> AccountDataCatchUp<S> {
    /// Serves `account_data` from `store`.
    pub fn new(store: S) -> AccountDataCatchUp<S> {
        AccountDataCatchUp {
            store,
            others: None,
        }
    }

    /// Serves every other stream from `others`.
    #[must_use]
    pub fn with_others(mut self, others: Arc<dyn CatchUpSource>) -> AccountDataCatchUp<S> {
        self.others = Some(others);
        self
    }

    /// The page Synapse's writer answers `request` with.
    pub async fn page(
        &self,
        request: &CatchUpRequest,
    ) -> Result<CatchUpPage, AccountDataCatchUpError<S::Error>> {
        if request.stream != StreamName::AccountData {
            return Err(AccountDataCatchUpError::NotAccountData(
                request.stream.clone(),
            ));
        }
        let mut page = AccountDataPage::new(request, TARGET_ROW_COUNT);
        while let Some(query) = page.next_query() {
            let rows = self
                .store
                .updated_account_data(&query)
                .await
                .map_err(AccountDataCatchUpError::Database)?;
            page.answer(rows);
        }
        Ok(page.finish()?)
    }
}

#[async_trait]
impl<S: AccountDataTables + 'static> CatchUpSource for AccountDataCatchUp<S> {
    async fn fetch(&self, request: CatchUpRequest) -> Result<CatchUpPage, BoxError> {
        match &self.others {
            Some(others) if request.stream != StreamName::AccountData => {
                others.fetch(request).await
            }
            _ => Ok(self.page(&request).await?),
        }
    }
}

#[cfg(feature = "postgres")]
mod on_tokio_postgres {
    //! [`AccountDataTables`] on tokio-postgres.

    use async_trait::async_trait;
    use tokio_postgres::GenericClient;

    use super::*;

    async fn execute<C: GenericClient + Sync>(
        client: &C,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        client.execute(sql, params).await
    }

    async fn update_tag_revision<C: GenericClient + Sync>(
        client: &C,
        user_id: &str,
        room_id: &str,
        stream_id: Token,
    ) -> Result<(), tokio_postgres::Error> {
        let updated = execute(
            client,
            UPDATE_TAG_REVISION_SQL,
            &[&stream_id.0, &user_id, &room_id],
        )
        .await?;
        if updated == 0 {
            execute(
                client,
                INSERT_TAG_REVISION_SQL,
                &[&user_id, &room_id, &stream_id.0],
            )
            .await?;
        }
        Ok(())
    }

    async fn updated_account_data<C: GenericClient + Sync>(
        client: &C,
        query: &AccountDataQuery,
    ) -> Result<Vec<AccountDataRow>, tokio_postgres::Error> {
        let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
        let rows = client
            .query(
                updated_account_data_sql(query.table),
                &[&query.from.0, &query.to.0, &limit],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let data_type: Option<String> = row.try_get(3)?;
                Ok(AccountDataRow {
                    stream_id: Token(row.try_get(0)?),
                    user_id: row.try_get(1)?,
                    room_id: row.try_get(2)?,
                    data_type: data_type.unwrap_or_else(|| TAG_DATA_TYPE.to_owned()),
                })
            })
            .collect()
    }

    macro_rules! impl_tables {
        ($($ty:ty),*) => {$(
            #[async_trait]
            impl AccountDataTables for $ty {
                async fn upsert_global(
                    &self,
                    user_id: &str,
                    data_type: &str,
                    stream_id: Token,
                    content: &str,
                ) -> Result<(), Self::Error> {
                    execute(self, UPSERT_GLOBAL_SQL, &[&user_id, &data_type, &stream_id.0, &content])
                        .await
                        .map(drop)
                }

                async fn clear_global(
                    &self,
                    user_id: &str,
                    data_type: &str,
                    stream_id: Token,
                ) -> Result<u64, Self::Error> {
                    execute(self, CLEAR_GLOBAL_SQL, &[&stream_id.0, &user_id, &data_type]).await
                }

                async fn upsert_room(
                    &self,
                    user_id: &str,
                    room_id: &str,
                    data_type: &str,
                    stream_id: Token,
                    content: &str,
                ) -> Result<(), Self::Error> {
                    execute(
                        self,
                        UPSERT_ROOM_SQL,
                        &[&user_id, &room_id, &data_type, &stream_id.0, &content],
                    )
                    .await
                    .map(drop)
                }

                async fn clear_room(
                    &self,
                    user_id: &str,
                    room_id: &str,
                    data_type: &str,
                    stream_id: Token,
                ) -> Result<u64, Self::Error> {
                    execute(self, CLEAR_ROOM_SQL, &[&stream_id.0, &user_id, &room_id, &data_type])
                        .await
                }

                async fn upsert_tag(
                    &self,
                    user_id: &str,
                    room_id: &str,
                    tag: &str,
                    content: &str,
                ) -> Result<(), Self::Error> {
                    execute(self, UPSERT_TAG_SQL, &[&user_id, &room_id, &tag, &content])
                        .await
                        .map(drop)
                }

                async fn delete_tag(
                    &self,
                    user_id: &str,
                    room_id: &str,
                    tag: &str,
                ) -> Result<(), Self::Error> {
                    execute(self, DELETE_TAG_SQL, &[&user_id, &room_id, &tag]).await.map(drop)
                }

                async fn update_tag_revision(
                    &self,
                    user_id: &str,
                    room_id: &str,
                    stream_id: Token,
                ) -> Result<(), Self::Error> {
                    update_tag_revision(self, user_id, room_id, stream_id).await
                }

                async fn ignored_users(&self, user_id: &str) -> Result<Vec<String>, Self::Error> {
                    self.query(IGNORED_USERS_SQL, &[&user_id])
                        .await?
                        .iter()
                        .map(|row| row.try_get(0))
                        .collect()
                }

                async fn delete_ignored_users(
                    &self,
                    user_id: &str,
                    ignored: Option<&[String]>,
                ) -> Result<(), Self::Error> {
                    match ignored {
                        // simple_delete_many_txn: nothing asked, nothing run.
                        Some([]) => Ok(()),
                        Some(ignored) => {
                            execute(self, DELETE_IGNORED_USERS_SQL, &[&user_id, &ignored])
                                .await
                                .map(drop)
                        }
                        None => execute(self, DELETE_ALL_IGNORED_USERS_SQL, &[&user_id])
                            .await
                            .map(drop),
                    }
                }

                async fn insert_ignored_users(
                    &self,
                    user_id: &str,
                    ignored: &[String],
                ) -> Result<(), Self::Error> {
                    if ignored.is_empty() {
                        return Ok(());
                    }
                    execute(self, INSERT_IGNORED_USERS_SQL, &[&user_id, &ignored])
                        .await
                        .map(drop)
                }

                async fn updated_account_data(
                    &self,
                    query: &AccountDataQuery,
                ) -> Result<Vec<AccountDataRow>, Self::Error> {
                    updated_account_data(self, query).await
                }
            }
        )*};
    }

    impl_tables!(tokio_postgres::Client, tokio_postgres::Transaction<'_>);
}
