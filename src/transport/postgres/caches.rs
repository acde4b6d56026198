//! The `caches` stream on Synapse's database: [`CacheInvalidations`]
//! writes an invalidation as Synapse's processes do, [`CachesCatchUp`]
//! answers catch-up from the table as Synapse's writer does.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use super::store::{DatabaseIds, DatabaseIdsError, StreamIdStore};
use super::streams::DatabaseStream;
use crate::positions::{
    BoxError, CacheInvalidation, CacheInvalidationError, CatchUpPage, CatchUpRequest,
    InvalidationRow, Outbox, StreamIdError, TARGET_ROW_COUNT, caches_page,
};
use crate::transport::CatchUpSource;
use crate::wire::{InstanceName, JsonError, RawRow, StreamName, Token};

/// Synapse's `caches` catch-up query (`get_all_updated_caches`,
/// `storage/databases/main/cache.py`), in PostgreSQL's parameter style.
/// Parameters: `from` (`bigint`, exclusive), the writer (`text`), the
/// limit (`bigint`). Not bounded above: see
/// [`caches_page`](crate::positions::caches_page).
pub const UPDATED_CACHES_SQL: &str = "SELECT stream_id, cache_func, keys, invalidation_ts \
     FROM cache_invalidation_stream_by_instance \
     WHERE stream_id > $1 AND instance_name = $2 \
     ORDER BY stream_id ASC \
     LIMIT $3";

/// The most rows one call writes: each row is four parameters of one
/// statement, and PostgreSQL takes at most 65 535.
pub const MAX_INVALIDATION_ROWS: usize = 10_000;

/// The `INSERT` of `rows` rows into `cache_invalidation_stream_by_instance`
/// in one statement (so that it is one transaction on its own, as
/// Synapse's `simple_insert_many_txn` is within its own). Parameters: the
/// instance (`text`), then per row `stream_id` (`bigint`), `cache_func`
/// (`text`), `keys` (`text[]`, `NULL` for a whole cache) and
/// `invalidation_ts` (`bigint`).
pub fn insert_invalidations_sql(rows: usize) -> String {
    let mut sql = String::from(
        "INSERT INTO cache_invalidation_stream_by_instance \
         (stream_id, instance_name, cache_func, keys, invalidation_ts) VALUES ",
    );
    for row in 0..rows {
        let at = 2 + 4 * row;
        if row > 0 {
            sql.push_str(", ");
        }
        sql.push_str(&format!(
            "(${at}::bigint, $1::text, ${}::text, ${}::text[], ${}::bigint)",
            at + 1,
            at + 2,
            at + 3
        ));
    }
    sql
}

/// What the `caches` stream needs from Synapse's database, beside its ids
/// ([`StreamIdStore`]): writing invalidations and reading them back for
/// catch-up.
///
/// Implemented for `tokio_postgres::Client` and
/// `tokio_postgres::Transaction` (feature `postgres`) with
/// [`insert_invalidations_sql`] and [`UPDATED_CACHES_SQL`]; implement it
/// on your own pool's connections with the same statements.
#[async_trait]
pub trait CachesStore: StreamIdStore {
    /// Writes the rows, as `instance`'s, in one statement
    /// ([`insert_invalidations_sql`]). At most [`MAX_INVALIDATION_ROWS`].
    async fn insert_invalidations(
        &self,
        instance: &InstanceName,
        rows: &[InvalidationRow],
    ) -> Result<(), Self::Error>;

    /// `instance`'s rows above `from`, at most `limit`, by id
    /// ([`UPDATED_CACHES_SQL`]).
    async fn updated_caches(
        &self,
        instance: &InstanceName,
        from: Token,
        limit: usize,
    ) -> Result<Vec<InvalidationRow>, Self::Error>;
}

/// A cache invalidation that was not written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheInvalidationsError<E: std::error::Error + 'static> {
    /// Synapse would not write it (a magic cache invalidated whole, ...).
    #[error(transparent)]
    Invalid(#[from] CacheInvalidationError),
    /// More rows than one call writes.
    #[error("{rows} cache keys in one call: at most {MAX_INVALIDATION_ROWS}, split it")]
    TooManyRows {
        /// The rows asked for.
        rows: usize,
    },
    /// The ids' bookkeeping refused.
    #[error(transparent)]
    Ids(#[from] StreamIdError),
    /// A row could not be written as JSON.
    #[error("caches row: {0}")]
    Json(#[from] JsonError),
    /// The database failed. The ids taken are given up (the position
    /// passes them); the application's transaction, if any, is to be
    /// rolled back.
    #[error("database: {0}")]
    Database(#[source] E),
}

impl<E: std::error::Error + 'static> From<DatabaseIdsError<E>> for CacheInvalidationsError<E> {
    fn from(error: DatabaseIdsError<E>) -> Self {
        match error {
            DatabaseIdsError::Ids(error) => CacheInvalidationsError::Ids(error),
            DatabaseIdsError::Database(error) => CacheInvalidationsError::Database(error),
        }
    }
}

/// Invalidations written in a transaction not yet committed: give them to
/// [`CacheInvalidations::committed`] once it commits, or to
/// [`CacheInvalidations::rolled_back`]. Until then the writer's position
/// stays below their ids.
#[derive(Debug)]
#[must_use = "the position waits for these ids until they are committed or rolled back"]
pub struct PendingInvalidations {
    ids: Vec<Token>,
    rows: Vec<(Token, RawRow)>,
}

impl PendingInvalidations {
    /// The ids taken, one per row.
    pub fn ids(&self) -> &[Token] {
        &self.ids
    }

    /// The rows to send once committed.
    pub fn rows(&self) -> &[(Token, RawRow)] {
        &self.rows
    }
}

/// This process's invalidations of Synapse's caches: each is an id from
/// `cache_invalidation_stream_seq`, a row in
/// `cache_invalidation_stream_by_instance` and, after the commit, a
/// `caches` row on the wire, as Synapse 1.163.2's
/// `_invalidate_cache_and_stream` (and `_bulk`, `_all`) makes them
/// (`storage/databases/main/cache.py`). Synapse's processes drop the
/// entries named; without it they go on serving what they cached.
///
/// In the application's own transaction, so that the invalidation is
/// kept exactly when the change it is about is:
///
/// 1. [`invalidate_on`](CacheInvalidations::invalidate_on) the
///    transaction (ids and rows are taken and written there);
/// 2. after the commit, [`committed`](CacheInvalidations::committed):
///    it hands the rows to send and the position to a closure (give them
///    to [`Writer::write`](crate::positions::Writer::write) or
///    [`CommandSender::write`](crate::transport::CommandSender::write));
///    after a rollback, [`rolled_back`](CacheInvalidations::rolled_back).
///
/// Or on its own ([`invalidate`](CacheInvalidations::invalidate)): one
/// statement, committed when it returns.
///
/// Rows are sent in token order and only once the position covers them
/// (see [`Outbox`]), and the closure runs under a lock, so that writes
/// from several tasks reach the writer in order. Every process writes
/// `caches`: no `stream_positions` row is kept, as in Synapse. The row on
/// the wire is `[cache_func, keys, invalidation_ts]`, `keys` `null` for a
/// whole cache.
///
/// ```no_run
/// # #[cfg(all(feature = "postgres", feature = "runtime-tokio"))]
/// # async fn run(
/// #     mut client: tokio_postgres::Client,
/// #     other: tokio_postgres::Client,
/// #     sender: synapse_replication::transport::CommandSender,
/// # ) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::SystemTime;
/// use synapse_replication::positions::CacheInvalidation;
/// use synapse_replication::transport::postgres::CacheInvalidations;
/// use synapse_replication::wire::{InstanceName, StreamName};
///
/// let caches = CacheInvalidations::load(other, InstanceName::from("rust_account_data")).await?;
///
/// // The change and its invalidation commit together.
/// let transaction = client.transaction().await?;
/// transaction
///     .execute("INSERT INTO ignored_users (ignorer_user_id, ignored_user_id) VALUES ($1, $2)",
///              &[&"@alice:example.com", &"@spam:example.com"])
///     .await?;
/// let ignored = CacheInvalidation::entry("ignored_users", ["@alice:example.com"]);
/// let pending = caches.invalidate_on(&transaction, &ignored, SystemTime::now()).await?;
/// transaction.commit().await?;
/// caches.committed(pending, |position, rows| sender.write(&StreamName::Caches, position, rows))??;
/// # Ok(())
/// # }
/// # fn main() {}
/// ```
#[derive(Debug)]
pub struct CacheInvalidations<S> {
    own: InstanceName,
    ids: DatabaseIds<S>,
    outbox: Mutex<Outbox>,
}

fn millis(at: SystemTime) -> i64 {
    // Synapse's `time_msec`: whole ms since the epoch.
    at.duration_since(UNIX_EPOCH).map_or(0, |since| {
        i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
    })
}

impl<S: CachesStore> CacheInvalidations<S> {
    /// Reads the stream's ids back (Synapse gives `caches` no writers:
    /// its position starts at the highest id in the table).
    ///
    /// # Where a restarted writer starts
    ///
    /// At the highest `stream_id` in `cache_invalidation_stream_by_instance`,
    /// of any instance (at least 1), which is what Synapse 1.163.2's own
    /// processes announce after a restart: `CacheInvalidationWorkerStore`
    /// builds its `MultiWriterIdGenerator` with `writers=[]`, so
    /// `_load_current_ids` reads no `stream_positions` and no sequence,
    /// only `MAX(stream_id)`, and `get_current_token_for_writer` of itself
    /// (what `POSITION caches <me>` carries) is that. The test
    /// `a_restarted_writer_starts_where_synapse_s_own_writer_starts`
    /// (tests/postgres_caches.rs) runs Synapse's generator on the same
    /// database and compares.
    ///
    /// That can be below what this writer announced before the restart,
    /// and followers then log a fetch "between 20 and 18", harmlessly:
    ///
    /// - ids whose transaction rolled back carry no row, yet the position
    ///   passed them (they are finished, as Synapse's
    ///   `call_on_exception` finishes them);
    /// - a Synapse follower's token for a writer is at least its own
    ///   `_persisted_upto_position` (`get_current_token_for_writer` of
    ///   another instance), which other processes' ids move.
    ///
    /// A follower whose token is above the announced position fetches
    /// `(20, 18]`, gets nothing, and takes 18; this writer's next ids come
    /// from the sequence, above both. Announcing the old, higher position
    /// again would need it kept somewhere Synapse does not keep it, and
    /// buys nothing: the position is a claim about this instance's rows,
    /// every one of which at or below the table's maximum is committed,
    /// and a process just started has none in flight. So it never
    /// announces a position beyond what is persisted.
    pub async fn load(
        store: S,
        own: InstanceName,
    ) -> Result<CacheInvalidations<S>, DatabaseIdsError<S::Error>> {
        let ids = DatabaseIds::load(store, DatabaseStream::CACHES, own.clone(), []).await?;
        Ok(CacheInvalidations {
            own,
            ids,
            outbox: Mutex::new(Outbox::new()),
        })
    }

    /// Takes the ids and writes the rows of `invalidation` in `on`, the
    /// application's transaction (or any [`CachesStore`]), stamped `at`.
    /// Nothing is sent until [`committed`](CacheInvalidations::committed).
    /// An invalidation of no key writes nothing.
    pub async fn invalidate_on<T: CachesStore + ?Sized>(
        &self,
        on: &T,
        invalidation: &CacheInvalidation,
        at: SystemTime,
    ) -> Result<PendingInvalidations, CacheInvalidationsError<T::Error>> {
        invalidation.check()?;
        if invalidation.len() > MAX_INVALIDATION_ROWS {
            return Err(CacheInvalidationsError::TooManyRows {
                rows: invalidation.len(),
            });
        }
        // As Synapse: all the ids in one statement, one timestamp.
        let ids = self.ids.take_on(on, invalidation.len()).await?;
        let written = async {
            let rows = invalidation.rows(&ids, millis(at))?;
            let raw = rows
                .iter()
                .map(|row| Ok((row.stream_id, row.to_raw_row()?)))
                .collect::<Result<Vec<_>, CacheInvalidationsError<T::Error>>>()?;
            if !rows.is_empty() {
                on.insert_invalidations(self.instance(), &rows)
                    .await
                    .map_err(CacheInvalidationsError::Database)?;
            }
            Ok(raw)
        };
        match written.await {
            Ok(rows) => Ok(PendingInvalidations { ids, rows }),
            Err(error) => {
                // No row will carry them: the position may pass them.
                self.ids.rolled_back(&ids)?;
                Err(error)
            }
        }
    }

    /// The transaction of `pending` committed: hands `publish` this
    /// writer's position and the rows now covered by it (these and any
    /// held before), in token order, and returns what it returns.
    /// `publish` runs under a lock: it must not block (queue the rows).
    pub fn committed<R>(
        &self,
        pending: PendingInvalidations,
        publish: impl FnOnce(Token, Vec<(Token, RawRow)>) -> R,
    ) -> Result<R, StreamIdError> {
        self.finish(&pending.ids, pending.rows, publish)
    }

    /// The transaction of `pending` rolled back: nothing of it is sent,
    /// and the position may pass its ids. `publish` is given the position
    /// and any rows held before that it now covers.
    pub fn rolled_back<R>(
        &self,
        pending: PendingInvalidations,
        publish: impl FnOnce(Token, Vec<(Token, RawRow)>) -> R,
    ) -> Result<R, StreamIdError> {
        self.finish(&pending.ids, Vec::new(), publish)
    }

    fn finish<R>(
        &self,
        ids: &[Token],
        rows: Vec<(Token, RawRow)>,
        publish: impl FnOnce(Token, Vec<(Token, RawRow)>) -> R,
    ) -> Result<R, StreamIdError> {
        // One lock from the position to the hand-over: a later position
        // never reaches the writer before an earlier one.
        let mut outbox = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
        let position = self.ids.with_ids(|stream_ids| stream_ids.persisted(ids))?;
        for (token, row) in rows {
            outbox.push(token, row);
        }
        let released = outbox.release(position);
        Ok(publish(position, released))
    }

    /// [`invalidate_on`](CacheInvalidations::invalidate_on) the store
    /// itself, in one statement (its own transaction), then
    /// [`committed`](CacheInvalidations::committed).
    pub async fn invalidate<R>(
        &self,
        invalidation: &CacheInvalidation,
        at: SystemTime,
        publish: impl FnOnce(Token, Vec<(Token, RawRow)>) -> R,
    ) -> Result<R, CacheInvalidationsError<S::Error>> {
        let pending = self
            .invalidate_on(self.ids.store(), invalidation, at)
            .await?;
        Ok(self.committed(pending, publish)?)
    }

    /// This writer's position: what to announce (`POSITION caches ...`)
    /// before anything is written.
    pub fn position(&self) -> Token {
        self.ids.with_ids(|ids| ids.own_position())
    }

    /// This process.
    pub fn instance(&self) -> &InstanceName {
        &self.own
    }

    /// The ids, for what else they do (other writers' positions).
    pub fn ids(&self) -> &DatabaseIds<S> {
        &self.ids
    }
}

/// A writer's `caches` catch-up served from Synapse's database: the pages
/// Synapse's own writer gives for `get_repl_stream_updates/caches`
/// (`CachesStream`, `get_all_updated_caches`), at most
/// [`TARGET_ROW_COUNT`] rows each, not bounded by the `upto_token` asked
/// for. A [`CatchUpSource`]: give it to `HttpServer` (feature
/// `http-server`) for Synapse's processes, or to a Rust follower's client.
///
/// Other streams go to the source given with
/// [`with_others`](CachesCatchUp::with_others), or fail.
///
/// ```no_run
/// # #[cfg(all(feature = "postgres", feature = "http-server", feature = "runtime-tokio"))]
/// # async fn run(client: tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::{Arc, Mutex};
/// use synapse_replication::http::CatchUpEndpoint;
/// use synapse_replication::positions::History;
/// use synapse_replication::transport::postgres::CachesCatchUp;
/// use synapse_replication::transport::{HttpServer, TokioRuntime};
/// use synapse_replication::wire::{InstanceName, StreamName};
///
/// let history = Arc::new(Mutex::new(History::new(1000)));
/// let source = Arc::new(CachesCatchUp::new(client).with_others(history));
/// let endpoint = CatchUpEndpoint::new(InstanceName::from("rust1"), Some("secret".into()))
///     .with_streams([StreamName::Caches, StreamName::Typing]);
/// let runtime = TokioRuntime::current().ok_or("not on tokio")?;
/// HttpServer::bind(runtime, "127.0.0.1:9093", endpoint, source).await?.run().await;
/// # Ok(())
/// # }
/// # fn main() {}
/// ```
pub struct CachesCatchUp<S> {
    store: S,
    others: Option<Arc<dyn CatchUpSource>>,
}

impl<S> std::fmt::Debug for CachesCatchUp<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachesCatchUp")
            .field("others", &self.others.is_some())
            .finish_non_exhaustive()
    }
}

/// A `caches` catch-up that could not be answered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CachesCatchUpError<E: std::error::Error + 'static> {
    /// Asked for another stream, with no source for it.
    #[error("stream {0}: this source serves caches only")]
    NotCaches(StreamName),
    /// A row could not be written as JSON.
    #[error("caches row: {0}")]
    Json(#[from] JsonError),
    /// The database failed.
    #[error("database: {0}")]
    Database(#[source] E),
}

impl<S: CachesStore> CachesCatchUp<S> {
    /// Serves `caches` from `store`.
    pub fn new(store: S) -> CachesCatchUp<S> {
        CachesCatchUp {
            store,
            others: None,
        }
    }

    /// Serves every other stream from `others` (an in-memory
    /// [`History`](crate::positions::History), say).
    #[must_use]
    pub fn with_others(mut self, others: Arc<dyn CatchUpSource>) -> CachesCatchUp<S> {
        self.others = Some(others);
        self
    }

    /// The page Synapse's writer answers `request` with
    /// (`Stream.get_updates_since`: nothing asked when `from == to`).
    pub async fn page(
        &self,
        request: &CatchUpRequest,
    ) -> Result<CatchUpPage, CachesCatchUpError<S::Error>> {
        if request.stream != StreamName::Caches {
            return Err(CachesCatchUpError::NotCaches(request.stream.clone()));
        }
        if request.from == request.to {
            return Ok(CatchUpPage {
                updates: Vec::new(),
                upto: request.to,
                limited: false,
            });
        }
        let rows = self
            .store
            .updated_caches(&request.writer, request.from, TARGET_ROW_COUNT)
            .await
            .map_err(CachesCatchUpError::Database)?;
        Ok(caches_page(request, &rows, TARGET_ROW_COUNT)?)
    }
}

#[async_trait]
impl<S: CachesStore + 'static> CatchUpSource for CachesCatchUp<S> {
    async fn fetch(&self, request: CatchUpRequest) -> Result<CatchUpPage, BoxError> {
        match &self.others {
            Some(others) if request.stream != StreamName::Caches => others.fetch(request).await,
            _ => Ok(self.page(&request).await?),
        }
    }
}
