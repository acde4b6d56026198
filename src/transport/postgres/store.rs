//! [`StreamIdStore`]: what a writer of a database-backed stream needs from
//! the database, and [`DatabaseIds`], which keeps a
//! [`StreamIds`] and the database in step.

use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;

use super::streams::DatabaseStream;
use crate::positions::{StreamIdError, StreamIds};
use crate::wire::{InstanceName, Token};

/// What a writer of a database-backed stream needs from Synapse's
/// database: the stream's sequence, `stream_positions`, and the startup
/// reads of Synapse's `_load_current_ids`.
///
/// Ids here are as [`StreamIds`] keeps them: positive, also for a stream
/// counting down ([`DatabaseStream::positive`]); an implementation negates
/// them on the way to and from such a stream's tables.
///
/// Implemented for `tokio_postgres::Client` and
/// `tokio_postgres::Transaction` (feature `postgres`), with the SQL of
/// [`DatabaseStream`]'s `*_sql` methods; implement it on your own pool's
/// connections with the same statements.
#[async_trait]
pub trait StreamIdStore: Send + Sync {
    /// The database's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Takes `n` ids from the stream's sequence
    /// ([`DatabaseStream::nextval_sql`]). They are the writer's whether or
    /// not its transaction commits: a sequence never gives an id twice.
    async fn next_ids(&self, stream: &DatabaseStream, n: usize) -> Result<Vec<Token>, Self::Error>;

    /// Moves this instance's row of `stream_positions` up to `position`,
    /// never down ([`DatabaseStream::upsert_position_sql`]).
    async fn write_position(
        &self,
        stream: &DatabaseStream,
        instance: &InstanceName,
        position: Token,
    ) -> Result<(), Self::Error>;

    /// Deletes the stream's `stream_positions` rows of instances not in
    /// `writers` (`DELETE FROM stream_positions WHERE stream_name = $1
    /// AND NOT instance_name = ANY($2)`).
    async fn delete_stale_positions(
        &self,
        stream: &DatabaseStream,
        writers: &[InstanceName],
    ) -> Result<(), Self::Error>;

    /// The stream's rows of `stream_positions`, as `(instance_name,
    /// stream_id)`.
    async fn positions(
        &self,
        stream: &DatabaseStream,
    ) -> Result<Vec<(InstanceName, Token)>, Self::Error>;

    /// The sequence's `last_value` ([`DatabaseStream::last_value_sql`]).
    async fn last_value(&self, stream: &DatabaseStream) -> Result<Token, Self::Error>;

    /// The highest id in the stream's tables, at least 1
    /// ([`DatabaseStream::max_id_sql`], the maximum over its tables).
    async fn max_id(&self, stream: &DatabaseStream) -> Result<Token, Self::Error>;

    /// The rows of the stream's tables with an id at or above `from`, as
    /// `(instance_name, id)` ([`DatabaseStream::rows_from_sql`]); `None`
    /// where `instance_name` is NULL (rows older than multi-writer
    /// streams).
    async fn rows_from(
        &self,
        stream: &DatabaseStream,
        from: Token,
    ) -> Result<Vec<(Option<InstanceName>, Token)>, Self::Error>;
}

/// A [`DatabaseIds`] call that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DatabaseIdsError<E: std::error::Error + 'static> {
    /// The bookkeeping refused the call (this process is not a writer of
    /// the stream, an id was persisted twice, ...).
    #[error(transparent)]
    Ids(#[from] StreamIdError),
    /// The database failed. Ids taken are released (the position waits
    /// for none of them); a position not written is written with the next
    /// one.
    #[error("database: {0}")]
    Database(#[source] E),
}

/// A writer's ids of one database-backed stream: a [`StreamIds`] kept in
/// step with the stream's sequence and `stream_positions` through a
/// [`StreamIdStore`] (Synapse's `MultiWriterIdGenerator`, database and
/// all).
///
/// 1. [`DatabaseIds::load`] at startup.
/// 2. [`DatabaseIds::take`] ids; write the rows with them, in your own
///    transaction.
/// 3. After it commits, [`DatabaseIds::persisted`]: it writes the position
///    to `stream_positions` and returns it, to announce. After a rollback,
///    [`DatabaseIds::rolled_back`].
///
/// The position written and returned never passes an id whose row may
/// not be committed: an id taken is held until it is persisted or rolled
/// back, whatever order writes finish in. A writer that dies between
/// taking an id and persisting it leaves `stream_positions` where it was
/// (and a `take` whose future is dropped before the sequence answers
/// holds this process's position from then on, as a write that never
/// finished would).
///
/// Shared by the tasks that write: methods take `&self`.
#[derive(Debug)]
pub struct DatabaseIds<S> {
    store: S,
    stream: DatabaseStream,
    ids: Mutex<StreamIds>,
    /// Whether `stream_positions` is written: the stream keeps positions
    /// and has configured writers (Synapse writes none otherwise).
    writes_positions: bool,
}

impl<S: StreamIdStore> DatabaseIds<S> {
    /// Reads the stream's ids back from the database, as Synapse's
    /// `_load_current_ids`: deletes the `stream_positions` rows of former
    /// writers, reads the others, the sequence's `last_value` (this
    /// writer's own position) and the stream's tables.
    ///
    /// `writers`: the stream's writers (`stream_writers`); none when any
    /// process may write. Ignored for a stream that keeps no positions
    /// ([`DatabaseStream::keeps_positions`]: `caches`), as Synapse gives
    /// it none.
    pub async fn load(
        store: S,
        stream: DatabaseStream,
        own: InstanceName,
        writers: impl IntoIterator<Item = InstanceName>,
    ) -> Result<DatabaseIds<S>, DatabaseIdsError<S::Error>> {
        let writers: Vec<InstanceName> = if stream.keeps_positions {
            writers.into_iter().collect()
        } else {
            // Synapse gives these streams no writers: any process writes.
            Vec::new()
        };
        let positions = if writers.is_empty() {
            Vec::new()
        } else {
            store
                .delete_stale_positions(&stream, &writers)
                .await
                .map_err(DatabaseIdsError::Database)?;
            store
                .positions(&stream)
                .await
                .map_err(DatabaseIdsError::Database)?
        };
        let last_value = if writers.contains(&own) {
            store
                .last_value(&stream)
                .await
                .map_err(DatabaseIdsError::Database)?
        } else {
            // Not read: StreamIds takes it only for a writer.
            Token(1)
        };
        let writes_positions = !writers.is_empty();
        let loading = StreamIds::loading(own, writers, positions, last_value);
        let ids = match loading.rows_from() {
            None => {
                let max_id = store
                    .max_id(&stream)
                    .await
                    .map_err(DatabaseIdsError::Database)?;
                loading.with_max_id(max_id)?
            }
            Some(from) => {
                let rows = store
                    .rows_from(&stream, from)
                    .await
                    .map_err(DatabaseIdsError::Database)?;
                // A row with no instance counts as persisted, and as no
                // writer's (Synapse compares None with its own name).
                let unnamed = InstanceName::from("");
                loading.with_rows(
                    rows.into_iter()
                        .map(|(instance, id)| (instance.unwrap_or_else(|| unnamed.clone()), id)),
                )?
            }
        };
        Ok(DatabaseIds {
            store,
            stream,
            ids: Mutex::new(ids),
            writes_positions,
        })
    }

    /// Takes `n` ids from the sequence, held until
    /// [`DatabaseIds::persisted`] or [`DatabaseIds::rolled_back`]. Refused
    /// if this process is not a writer of the stream.
    pub async fn take(&self, n: usize) -> Result<Vec<Token>, DatabaseIdsError<S::Error>> {
        self.take_on(&self.store, n).await
    }

    /// [`DatabaseIds::take`] on another connection: the transaction that
    /// writes the rows, as Synapse takes its ids (`tokio_postgres::Transaction`
    /// implements [`StreamIdStore`]). The ids stay taken if it rolls back:
    /// give them to [`DatabaseIds::rolled_back`].
    pub async fn take_on<T: StreamIdStore + ?Sized>(
        &self,
        on: &T,
        n: usize,
    ) -> Result<Vec<Token>, DatabaseIdsError<T::Error>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let reservation = self.with_ids(StreamIds::reserve)?;
        match on.next_ids(&self.stream, n).await {
            Ok(taken) => {
                self.with_ids(|ids| ids.allocated(reservation, &taken))?;
                Ok(taken)
            }
            Err(error) => {
                // Released: the position waits for no id it will not see.
                self.with_ids(|ids| ids.allocated(reservation, &[]))?;
                Err(DatabaseIdsError::Database(error))
            }
        }
    }

    /// The transaction that wrote the rows of `ids` committed: writes this
    /// writer's position to `stream_positions` (if the stream keeps it)
    /// and returns it, to announce.
    ///
    /// If writing the position fails the ids still count as persisted; the
    /// next call writes a position at least as high.
    pub async fn persisted(&self, ids: &[Token]) -> Result<Token, DatabaseIdsError<S::Error>> {
        let position = self.with_ids(|stream_ids| stream_ids.persisted(ids))?;
        if self.writes_positions {
            let own = self.with_ids(|stream_ids| stream_ids.instance().clone());
            self.store
                .write_position(&self.stream, &own, position)
                .await
                .map_err(DatabaseIdsError::Database)?;
        }
        Ok(position)
    }

    /// Writes this writer's position as it stands now to
    /// `stream_positions` (if the stream keeps it), as Synapse does after
    /// each write that commits (`get_current_token_for_writer` of itself,
    /// never moving the row down). For a caller that finished its ids
    /// with [`with_ids`](Self::with_ids) under a lock of its own, to hand
    /// rows over in order; [`persisted`](Self::persisted) does both.
    pub async fn write_position(&self) -> Result<Token, DatabaseIdsError<S::Error>> {
        let (own, position) =
            self.with_ids(|stream_ids| (stream_ids.instance().clone(), stream_ids.own_position()));
        if self.writes_positions {
            self.store
                .write_position(&self.stream, &own, position)
                .await
                .map_err(DatabaseIdsError::Database)?;
        }
        Ok(position)
    }

    /// The transaction that would have written the rows of `ids` rolled
    /// back: they are finished, and nothing is written (Synapse keeps
    /// `stream_positions` at a row of this instance's). Returns the
    /// position.
    pub fn rolled_back(&self, ids: &[Token]) -> Result<Token, StreamIdError> {
        self.with_ids(|stream_ids| stream_ids.persisted(ids))
    }

    /// The bookkeeping, for what else it does: other writers' positions
    /// ([`StreamIds::advance`]), the positions to announce.
    pub fn with_ids<T>(&self, f: impl FnOnce(&mut StreamIds) -> T) -> T {
        // A panic elsewhere while holding the lock left the bookkeeping
        // as consistent as any call leaves it: no call panics midway.
        let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut ids)
    }

    /// The stream.
    pub fn stream(&self) -> &DatabaseStream {
        &self.stream
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }
}
