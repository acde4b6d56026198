//! The writer side of a database-backed stream: the ids a writer takes
//! from the stream's PostgreSQL sequence, and the positions that follow
//! from them.
//!
//! [`StreamIds`] is the bookkeeping of Synapse 1.163.2's
//! `MultiWriterIdGenerator` (`synapse/storage/util/id_generators.py`),
//! without the database: the caller takes ids from the sequence, writes its
//! rows and `stream_positions`, and tells [`StreamIds`] what happened.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::wire::{InstanceName, Token};

/// The most instances whose positions a [`StreamIds`] keeps. Synapse keeps
/// one per instance it hears of; anyone who can publish on Redis can make
/// up names, so a new instance beyond this many is refused
/// ([`StreamIdError::TooManyInstances`]).
pub const MAX_INSTANCES: usize = 1024;

/// The most persisted ids kept above the stream's position, waiting for
/// the ids below them (Synapse's `_known_persisted_positions`, which has no
/// bound: it grows while one writer is idle and the others' announcements
/// leave gaps). Beyond this the highest are forgotten, which only makes the
/// stream's position wait for the writers' positions instead of skipping
/// ahead over a gapless run.
const MAX_KNOWN_PERSISTED: usize = 65_536;

/// Tells reservations of one [`StreamIds`] from another's.
static NEXT_TAG: AtomicU64 = AtomicU64::new(0);

/// A call to [`StreamIds`] that is refused. Nothing changed, except where
/// a variant says so.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamIdError {
    /// The stream has a list of writers and this process is not on it
    /// (Synapse: "Tried to allocate stream ID on non-writer").
    #[error("{instance} is not a writer of the stream")]
    NotAWriter {
        /// This process.
        instance: InstanceName,
    },
    /// An id handed to [`StreamIds::allocated`] is not above the highest id
    /// seen when it was reserved, so it cannot have come from the sequence
    /// after the reservation (and the position may already have passed
    /// it). The reservation is released and none of the ids are tracked:
    /// write no row with them.
    #[error("id {id} is not above {floor}, the highest id seen when it was reserved")]
    IdNotAbove {
        /// The id.
        id: Token,
        /// The highest id seen when the reservation was made.
        floor: Token,
    },
    /// An id handed to [`StreamIds::allocated`] is already allocated. The
    /// reservation is released and none of the ids are tracked.
    #[error("id {0} is already allocated")]
    AlreadyAllocated(Token),
    /// An id given to [`StreamIds::persisted`] is not allocated and
    /// unfinished.
    #[error("id {0} is not an unfinished allocated id")]
    NotAllocated(Token),
    /// The reservation is another [`StreamIds`]'s.
    #[error("the reservation is not this stream's")]
    UnknownReservation,
    /// [`StreamIds::advance`] for a new instance when
    /// [`MAX_INSTANCES`] are known.
    #[error("more than {MAX_INSTANCES} instances write the stream")]
    TooManyInstances,
    /// [`Loading::with_max_id`] when [`Loading::rows_from`] asked for rows,
    /// or [`Loading::with_rows`] when it asked for the max id.
    #[error("startup needs {needs}")]
    StartupRead {
        /// What [`Loading::rows_from`] asked for.
        needs: &'static str,
    },
}

/// A fetch from the sequence under way: the ids it will return are not
/// known yet, so no position may pass the highest id seen before it
/// (Synapse's `_in_flight_fetches`). Give it back to
/// [`StreamIds::allocated`] with the ids, or with none if the fetch failed:
/// until then the writer's position cannot pass it.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a reservation not given back holds the position forever"]
pub struct Reservation {
    tag: u64,
    serial: u64,
    floor: i64,
}

impl Reservation {
    /// The highest id seen when the reservation was made; every id the
    /// sequence returns for it is above.
    pub fn floor(&self) -> Token {
        Token(self.floor)
    }
}

/// Ids of one database-backed stream as Synapse allocates them: taken from
/// one PostgreSQL sequence by every writer, finished in any order, and the
/// positions that follow (Synapse's `MultiWriterIdGenerator`).
///
/// Sans-IO: the caller reads the sequence and the tables, and tells this
/// what happened. One per stream (Synapse's `stream_positions.stream_name`:
/// `account_data`, `caches`, `receipts`, ...), in the one process that
/// writes with it.
///
/// # Call order
///
/// 1. At startup, [`StreamIds::loading`] with what was read from the
///    database (Synapse's `_load_current_ids`; see [`Loading`]), then
///    [`Loading::with_max_id`] or [`Loading::with_rows`].
/// 2. To write: [`StreamIds::reserve`], then take the ids from the
///    sequence (`SELECT nextval(...)`), then [`StreamIds::allocated`]
///    with them (with none if that failed). Write the rows with the ids.
/// 3. When the transaction that wrote them has committed or rolled back,
///    [`StreamIds::persisted`]. After a commit, write the position it
///    returns to `stream_positions` (`GREATEST`, as Synapse's
///    `_update_stream_positions_table_txn`) and announce it (`POSITION`,
///    or with the rows' `RDATA`). After a rollback write nothing
///    (Synapse keeps `stream_positions` pointing at a row of this
///    instance's).
/// 4. Feed other writers' positions from `POSITION` and `RDATA` to
///    [`StreamIds::advance`].
///
/// # Positions
///
/// - [`StreamIds::own_position`] (Synapse's `get_current_token_for_writer`
///   of this instance) is what this writer announces. While ids are in
///   flight (reserved, allocated and not yet persisted) it is the highest
///   persisted id below all of them: never an id whose row may not be
///   there yet, whatever order transactions finish in. With nothing in
///   flight it is the highest id seen of any writer (`_max_seen_allocated_stream_id`):
///   every id this writer takes later will be above it.
/// - [`StreamIds::position`] of another writer: what it announced, but at
///   least [`StreamIds::current_token`].
/// - [`StreamIds::current_token`] (Synapse's `get_current_token`,
///   `_persisted_upto_position`): the position of the stream for a reader,
///   below which every writer's rows are persisted. The minimum of the
///   writers' positions, but a writer with nothing in flight counts only
///   through the others (its next id will be above theirs), and it skips
///   ahead over runs of persisted ids with no gap (5, 6, 7 seen: 7).
///
/// Synapse recomputes these only when ids are persisted
/// (`_mark_ids_as_finished`) or another writer advances (`advance`); so
/// does this. A reservation given back, or ids allocated, move nothing
/// until then. And this writer's position is raised to the stream's
/// before the stream's follows a run of persisted ids, so it may trail the
/// stream's by that run until the next recomputation. Both only delay an
/// announcement.
///
/// # Where Synapse's comments and code differ
///
/// `_add_persisted_position` says that with no writes outstanding the
/// stream's position "can be the minimum of all *other* writers' current
/// positions". The code leaves this writer out also when it has no
/// position at all (`if our_current_position and ...`: a position of 0
/// counts as none), and when it is the only writer the minimum is its own
/// position, in flight or not. [`StreamIds`] does as the code does.
/// `AbstractStreamIdGenerator` calls a writer's position the id up to
/// which all its writes finished; for this writer with nothing in flight,
/// the code returns the highest id seen of any writer instead.
///
/// # Memory
///
/// Ids in flight are the caller's: one entry per reservation not given
/// back and per id allocated and not persisted, plus ids persisted above an
/// unpersisted one, which the caller bounds by bounding its concurrent
/// writes. Other writers' positions are kept for at most
/// [`MAX_INSTANCES`] instances; persisted ids above the stream's position
/// (waiting for a gap below them to close) for at most 65,536, beyond
/// which the stream's position waits for the writers' positions instead.
///
/// # Ids
///
/// Ids are positive, as every stream but one has them. Synapse's one
/// negative stream (backfilled events, `positive=False`) keeps them
/// positive internally too: negate on the way in and out.
///
/// ```
/// use synapse_replication::positions::StreamIds;
/// use synapse_replication::wire::{InstanceName, Token};
///
/// let me = InstanceName::from("rust_account_data");
/// // At startup: no stream_positions rows yet, the sequence's last_value
/// // is 7 and this process is the stream's one writer.
/// let loading = StreamIds::loading(me.clone(), [me.clone()], [], Token(7));
/// assert_eq!(loading.rows_from(), Some(Token(7)));
/// // The rows of the stream's tables from id 7 on: the one at 7.
/// let mut ids = loading.with_rows([(me.clone(), Token(7))])?;
/// assert_eq!(ids.own_position(), Token(7));
///
/// // Two writes take ids 8 and 9 from the sequence...
/// let first = ids.reserve()?;
/// let second = ids.reserve()?;
/// ids.allocated(first, &[Token(8)])?;
/// ids.allocated(second, &[Token(9)])?;
/// // ...and 9 commits first: the position cannot pass 8 yet.
/// assert_eq!(ids.persisted(&[Token(9)])?, Token(7));
/// assert_eq!(ids.persisted(&[Token(8)])?, Token(9));
/// # Ok::<(), synapse_replication::positions::StreamIdError>(())
/// ```
#[derive(Debug)]
pub struct StreamIds {
    own: InstanceName,
    /// The configured writers; empty when any process may write (`caches`).
    writers: Vec<InstanceName>,
    /// Each instance's position (`_current_positions`).
    positions: BTreeMap<InstanceName, i64>,
    /// This writer's ids allocated and not yet persisted (`_unfinished_ids`).
    unfinished: BTreeSet<i64>,
    /// Reservations not given back, by serial: the highest id seen when
    /// each was made (`_in_flight_fetches`).
    in_flight: BTreeMap<u64, i64>,
    /// This writer's persisted ids above its position (`_finished_ids`).
    finished: BTreeSet<i64>,
    /// `_persisted_upto_position`.
    persisted_upto: i64,
    /// Persisted ids above `persisted_upto` (`_known_persisted_positions`).
    known_persisted: BTreeSet<i64>,
    /// `_max_seen_allocated_stream_id`.
    max_seen: i64,
    /// `_max_position_of_local_instance`.
    max_local: i64,
    tag: u64,
    next_serial: u64,
}

/// Startup, half done: what `stream_positions` and the sequence said, and
/// which of the stream's tables' rows are still to read (the rest of
/// Synapse's `_load_current_ids`).
///
/// Read what [`Loading::rows_from`] asks for from every table of the
/// stream (for `account_data`: `account_data`, `room_account_data`,
/// `room_tags_revisions`), then finish with [`Loading::with_max_id`] or
/// [`Loading::with_rows`].
#[derive(Debug)]
pub struct Loading {
    ids: StreamIds,
    stale: Vec<InstanceName>,
    min: Option<i64>,
}

impl Loading {
    /// The instances of the `stream_positions` rows given that are no
    /// longer writers of the stream: Synapse deletes their rows
    /// (`DELETE FROM stream_positions WHERE stream_name = ? AND
    /// instance_name NOT IN (writers)`), so that a writer added back after
    /// a long time starts afresh. Empty when any process may write.
    pub fn stale(&self) -> &[InstanceName] {
        &self.stale
    }

    /// What to read from the stream's tables.
    ///
    /// - `None` (no writer has a position): the highest id of each table
    ///   (`SELECT GREATEST(COALESCE(MAX(stream_id), 1), 1) FROM table`),
    ///   for [`Loading::with_max_id`].
    /// - `Some(min)`: every row with an id at or above `min`, as
    ///   `(instance_name, stream_id)` (`SELECT instance_name, stream_id
    ///   FROM table WHERE stream_id >= min`), for [`Loading::with_rows`].
    pub fn rows_from(&self) -> Option<Token> {
        self.min.map(Token)
    }

    /// Finishes startup with the highest id of the stream's tables (the
    /// maximum over tables; 1 if they are empty), when
    /// [`Loading::rows_from`] is `None`.
    pub fn with_max_id(self, max_id: Token) -> Result<StreamIds, StreamIdError> {
        if self.min.is_some() {
            return Err(StreamIdError::StartupRead {
                needs: "the rows from the lowest position, not the max id",
            });
        }
        let mut ids = self.ids;
        // Synapse's GREATEST(..., 1): stream ids start above 1.
        ids.persisted_upto = max_id.0.max(1);
        Ok(ids.started())
    }

    /// Finishes startup with the rows of the stream's tables from
    /// [`Loading::rows_from`] on, in any order. Each counts as persisted;
    /// this writer's own rows among them set its position (the last one
    /// wins, as in Synapse, where `stream_positions` was not written
    /// before a restart).
    pub fn with_rows(
        self,
        rows: impl IntoIterator<Item = (InstanceName, Token)>,
    ) -> Result<StreamIds, StreamIdError> {
        let Some(min) = self.min else {
            return Err(StreamIdError::StartupRead {
                needs: "the max id of the stream's tables, not rows",
            });
        };
        let mut ids = self.ids;
        ids.persisted_upto = min;
        // Rows below `min` are not what Synapse's query returns.
        let mut rows: Vec<(InstanceName, i64)> = rows
            .into_iter()
            .map(|(instance, id)| (instance, id.0))
            .filter(|&(_, id)| id >= min)
            .collect();
        // Ascending, so that an instance's position ends at its highest id.
        rows.sort_by_key(|&(_, id)| id);
        for (instance, id) in rows {
            ids.add_persisted_position(id);
            if instance == ids.own {
                ids.positions.insert(instance, id);
            }
        }
        Ok(ids.started())
    }
}

impl StreamIds {
    /// Starts loading a stream's ids from what the database holds
    /// (Synapse's `_load_current_ids`):
    ///
    /// - `writers`: the stream's writers (`stream_writers`), in Synapse's
    ///   instance names; none when any process may write (`caches`).
    /// - `stream_positions`: the rows of `stream_positions` for the
    ///   stream, as `(instance_name, stream_id)`. Those of instances not
    ///   in `writers` are dropped ([`Loading::stale`]); with no writers,
    ///   all are (Synapse does not read them then).
    /// - `last_value`: the sequence's `last_value`, taken as this
    ///   process's own position if it is a writer (the end of the stream:
    ///   `stream_positions` may lag, after a rollback of Synapse for
    ///   instance).
    ///
    /// Then [`Loading::rows_from`] says what else to read.
    pub fn loading(
        own: InstanceName,
        writers: impl IntoIterator<Item = InstanceName>,
        stream_positions: impl IntoIterator<Item = (InstanceName, Token)>,
        last_value: Token,
    ) -> Loading {
        let mut configured: Vec<InstanceName> = Vec::new();
        for writer in writers {
            if !configured.contains(&writer) {
                configured.push(writer);
            }
        }
        let mut positions = BTreeMap::new();
        let mut stale = Vec::new();
        if !configured.is_empty() {
            for (instance, id) in stream_positions {
                if configured.contains(&instance) {
                    positions.insert(instance, id.0);
                } else if !stale.contains(&instance) {
                    stale.push(instance);
                }
            }
            if configured.contains(&own) {
                positions.insert(own.clone(), last_value.0);
            }
        }
        let min = positions.values().copied().min();
        Loading {
            ids: StreamIds {
                own,
                writers: configured,
                positions,
                unfinished: BTreeSet::new(),
                in_flight: BTreeMap::new(),
                finished: BTreeSet::new(),
                persisted_upto: 1,
                known_persisted: BTreeSet::new(),
                max_seen: 1,
                max_local: 1,
                tag: NEXT_TAG.fetch_add(1, Ordering::Relaxed),
                next_serial: 0,
            },
            stale,
            min,
        }
    }

    /// The end of `_load_current_ids` and of `__init__`.
    fn started(mut self) -> StreamIds {
        for writer in &self.writers {
            self.positions
                .entry(writer.clone())
                .or_insert(self.persisted_upto);
        }
        self.max_seen = self
            .positions
            .values()
            .copied()
            .max()
            .unwrap_or(1)
            .max(self.persisted_upto);
        self.max_local = self.max_seen;
        if self.writers.is_empty() {
            // Any process may write: start this one at the stream's
            // position.
            self.positions.insert(self.own.clone(), self.persisted_upto);
        }
        self
    }

    /// This process.
    pub fn instance(&self) -> &InstanceName {
        &self.own
    }

    /// Reserves ids about to be taken from the sequence. Refused if the
    /// stream has writers and this process is not one.
    pub fn reserve(&mut self) -> Result<Reservation, StreamIdError> {
        if !self.writers.is_empty() && !self.writers.contains(&self.own) {
            return Err(StreamIdError::NotAWriter {
                instance: self.own.clone(),
            });
        }
        let serial = self.next_serial;
        self.next_serial = self.next_serial.wrapping_add(1);
        self.in_flight.insert(serial, self.max_seen);
        Ok(Reservation {
            tag: self.tag,
            serial,
            floor: self.max_seen,
        })
    }

    /// Gives a reservation back with the ids the sequence returned for it
    /// (none if taking them failed). The ids are in flight until
    /// [`StreamIds::persisted`].
    ///
    /// Refused if an id is not above [`Reservation::floor`] or is already
    /// allocated; the reservation is released all the same and no id is
    /// kept, so write no row with them.
    pub fn allocated(
        &mut self,
        reservation: Reservation,
        ids: &[Token],
    ) -> Result<(), StreamIdError> {
        if reservation.tag != self.tag || self.in_flight.remove(&reservation.serial).is_none() {
            return Err(StreamIdError::UnknownReservation);
        }
        for (at, id) in ids.iter().enumerate() {
            if id.0 <= reservation.floor {
                return Err(StreamIdError::IdNotAbove {
                    id: *id,
                    floor: Token(reservation.floor),
                });
            }
            if self.unfinished.contains(&id.0)
                || self.finished.contains(&id.0)
                || ids[..at].contains(id)
            {
                return Err(StreamIdError::AlreadyAllocated(*id));
            }
        }
        self.unfinished.extend(ids.iter().map(|id| id.0));
        if let Some(&highest) = self.unfinished.last() {
            self.max_seen = self.max_seen.max(highest);
        }
        Ok(())
    }

    /// Marks allocated ids finished: their transaction committed, or rolled
    /// back (no row will ever carry them, which for the position is the
    /// same). Returns [`StreamIds::own_position`]: after a commit, write it
    /// to `stream_positions` and announce it.
    ///
    /// Refused, with nothing changed, if an id is not allocated and
    /// unfinished.
    pub fn persisted(&mut self, ids: &[Token]) -> Result<Token, StreamIdError> {
        // An id given twice in one call is still unfinished when checked.
        if let Some(id) = ids.iter().find(|id| !self.unfinished.contains(&id.0)) {
            return Err(StreamIdError::NotAllocated(*id));
        }
        // Synapse's `_mark_ids_as_finished`.
        for id in ids {
            self.unfinished.remove(&id.0);
            self.finished.insert(id.0);
        }
        let new_cur = match self.in_flight_bound() {
            Some(bound) => {
                // The highest finished id below every id in flight; those
                // below it are behind the position from now on.
                let above = self.finished.split_off(&bound);
                let below = std::mem::replace(&mut self.finished, above);
                below.last().copied()
            }
            None => {
                let highest = self.finished.last().copied();
                self.finished.clear();
                highest
            }
        };
        if let Some(new_cur) = new_cur {
            let current = self.positions.get(&self.own).copied().unwrap_or(0);
            self.positions
                .insert(self.own.clone(), current.max(new_cur));
            self.max_local = self.max_local.max(current).max(new_cur);
        }
        for id in ids {
            self.add_persisted_position(id.0);
        }
        Ok(self.own_position())
    }

    /// The lowest id that may still be in flight: the lowest unfinished id,
    /// or one above the lowest reservation's floor. `None` if nothing is.
    fn in_flight_bound(&self) -> Option<i64> {
        let reserved = self
            .in_flight
            .values()
            .min()
            .map(|floor| floor.saturating_add(1));
        let unfinished = self.unfinished.first().copied();
        match (unfinished, reserved) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Another writer's position moved (a `POSITION`, or an `RDATA`'s
    /// token). This process's own echoes are ignored, as Synapse's
    /// replication handler drops them before they get here.
    pub fn advance(&mut self, instance: &InstanceName, token: Token) -> Result<(), StreamIdError> {
        if *instance == self.own {
            return Ok(());
        }
        let new_id = token.0;
        match self.positions.get_mut(instance) {
            Some(position) => *position = (*position).max(new_id),
            None => {
                if self.positions.len() >= MAX_INSTANCES {
                    return Err(StreamIdError::TooManyInstances);
                }
                self.positions.insert(instance.clone(), new_id.max(0));
            }
        }
        self.max_seen = self.max_seen.max(new_id);
        self.add_persisted_position(new_id);
        Ok(())
    }

    /// Synapse's `_add_persisted_position`: `new_id` is persisted; move the
    /// stream's position up as far as is known to be persisted.
    fn add_persisted_position(&mut self, new_id: i64) {
        self.known_persisted.insert(new_id);
        if self.known_persisted.len() > MAX_KNOWN_PERSISTED {
            // The highest wait longest to be of use.
            self.known_persisted.pop_last();
        }
        let in_flight = !self.unfinished.is_empty() || !self.in_flight.is_empty();
        let ours = self.positions.get(&self.own).copied().unwrap_or(0);
        let mut min_curr = self
            .positions
            .iter()
            .filter(|(name, _)| **name != self.own)
            .map(|(_, &token)| token)
            .min()
            .unwrap_or(ours);
        // Python's `if our_current_position and ...`: a position of 0 is
        // no position.
        if ours != 0 && in_flight {
            min_curr = min_curr.min(ours);
        }
        self.persisted_upto = self.persisted_upto.max(min_curr);
        self.max_local = self.max_local.max(self.persisted_upto);
        if !in_flight {
            // Every id this writer takes next is above all seen.
            self.max_local = self.max_local.max(self.max_seen);
        }
        while let Some(&lowest) = self.known_persisted.first() {
            if lowest <= self.persisted_upto {
                self.known_persisted.pop_first();
            } else if Some(lowest) == self.persisted_upto.checked_add(1) {
                self.known_persisted.pop_first();
                self.persisted_upto = lowest;
            } else {
                break;
            }
        }
    }

    /// The position this writer announces and writes to
    /// `stream_positions` (Synapse's `get_current_token_for_writer` of its
    /// own instance). Never moves backwards.
    pub fn own_position(&self) -> Token {
        Token(self.max_local)
    }

    /// The highest id up to which every id this writer took is persisted,
    /// or the stream's position if it has none (Synapse's
    /// `get_minimal_local_current_token`, which `caches` announces).
    pub fn own_minimal_position(&self) -> Token {
        Token(
            self.positions
                .get(&self.own)
                .copied()
                .unwrap_or(self.persisted_upto),
        )
    }

    /// A writer's position (Synapse's `get_current_token_for_writer`): this
    /// writer's [`StreamIds::own_position`]; for another, what it
    /// announced, but at least [`StreamIds::current_token`] (a writer not
    /// heard of is taken to be there).
    pub fn position(&self, instance: &InstanceName) -> Token {
        if *instance == self.own {
            return self.own_position();
        }
        let announced = self
            .positions
            .get(instance)
            .copied()
            .unwrap_or(self.persisted_upto);
        Token(announced.max(self.persisted_upto))
    }

    /// The stream's position for a reader: every id at or below it, of
    /// every writer, is persisted (Synapse's `get_current_token`).
    pub fn current_token(&self) -> Token {
        Token(self.persisted_upto)
    }

    /// Every instance's position as kept (Synapse's `get_positions`):
    /// writers that have not written may be missing.
    pub fn positions(&self) -> impl Iterator<Item = (&InstanceName, Token)> + '_ {
        self.positions
            .iter()
            .map(|(name, &token)| (name, Token(token)))
    }

    /// Whether ids are in flight: reserved, or allocated and not
    /// persisted.
    pub fn in_flight(&self) -> bool {
        !self.unfinished.is_empty() || !self.in_flight.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(name: &str) -> InstanceName {
        InstanceName::from(name)
    }

    /// The one writer of a stream whose sequence is at `last`.
    fn sole_writer(last: i64) -> StreamIds {
        let me = name("me");
        StreamIds::loading(me.clone(), [me.clone()], [], Token(last))
            .with_rows([(me, Token(last))])
            .unwrap()
    }

    fn take(ids: &mut StreamIds, id: i64) -> Token {
        let reservation = ids.reserve().unwrap();
        ids.allocated(reservation, &[Token(id)]).unwrap();
        Token(id)
    }

    #[test]
    fn the_position_waits_for_the_lowest_unfinished_id() {
        let mut ids = sole_writer(7);
        let (a, b, c) = (take(&mut ids, 8), take(&mut ids, 9), take(&mut ids, 10));
        assert_eq!(ids.persisted(&[c]).unwrap(), Token(7));
        assert_eq!(ids.persisted(&[a]).unwrap(), Token(8));
        assert_eq!(ids.persisted(&[b]).unwrap(), Token(10));
        assert_eq!(ids.current_token(), Token(10));
        assert!(!ids.in_flight());
    }

    #[test]
    fn a_reservation_holds_the_position_until_its_ids_are_known() {
        // Two writes fetch at once; the sequence gives the first 8 and the
        // second 9, and the second hands its id in and commits first.
        let mut ids = sole_writer(7);
        let first = ids.reserve().unwrap();
        let second = ids.reserve().unwrap();
        assert_eq!(first.floor(), Token(7));
        ids.allocated(second, &[Token(9)]).unwrap();
        // Without the reservation this would be 9, with 8 unwritten.
        assert_eq!(ids.persisted(&[Token(9)]).unwrap(), Token(7));
        ids.allocated(first, &[Token(8)]).unwrap();
        assert_eq!(ids.own_position(), Token(7));
        assert_eq!(ids.persisted(&[Token(8)]).unwrap(), Token(9));
    }

    #[test]
    fn a_failed_fetch_releases_its_reservation_at_the_next_persist() {
        let mut ids = sole_writer(7);
        let failed = ids.reserve().unwrap();
        let a = take(&mut ids, 8);
        assert_eq!(ids.persisted(&[a]).unwrap(), Token(7));
        ids.allocated(failed, &[]).unwrap();
        // As in Synapse, nothing is recomputed until ids are persisted.
        assert_eq!(ids.own_position(), Token(7));
        let b = take(&mut ids, 9);
        assert_eq!(ids.persisted(&[b]).unwrap(), Token(9));
    }

    #[test]
    fn a_rolled_back_id_finishes_like_a_persisted_one() {
        let mut ids = sole_writer(1);
        let reservation = ids.reserve().unwrap();
        ids.allocated(reservation, &[Token(2), Token(3), Token(4)])
            .unwrap();
        assert_eq!(ids.persisted(&[Token(3), Token(4)]).unwrap(), Token(1));
        assert_eq!(ids.persisted(&[Token(2)]).unwrap(), Token(4));
    }

    #[test]
    fn other_writers_advance_the_stream_to_their_minimum() {
        let me = name("me");
        let (w1, w2) = (name("w1"), name("w2"));
        let mut ids = StreamIds::loading(
            me.clone(),
            [me.clone(), w1.clone(), w2.clone()],
            [(w1.clone(), Token(5)), (w2.clone(), Token(6))],
            Token(9),
        )
        .with_rows([(me.clone(), Token(9)), (w2.clone(), Token(6))])
        .unwrap();
        assert_eq!(ids.current_token(), Token(6));
        assert_eq!(ids.position(&w1), Token(6), "at least the stream's");
        assert_eq!(ids.own_position(), Token(9));

        ids.advance(&w1, Token(12)).unwrap();
        // Idle, this writer counts only through the others: min(12, 6).
        assert_eq!(ids.current_token(), Token(6));
        ids.advance(&w2, Token(11)).unwrap();
        // min(12, 11), and 12 is known persisted (w1 announced it).
        assert_eq!(ids.current_token(), Token(12));
        // With nothing in flight, its next id is above all seen.
        assert_eq!(ids.own_position(), Token(12));

        // In flight, its own position (still 9) counts too.
        let id = take(&mut ids, 13);
        ids.advance(&w2, Token(15)).unwrap();
        assert_eq!(ids.current_token(), Token(12));
        assert_eq!(ids.own_position(), Token(12));
        assert_eq!(ids.persisted(&[id]).unwrap(), Token(15));
        // 13 follows 12, but 14 is nobody's known id.
        assert_eq!(ids.current_token(), Token(13));
        ids.advance(&w1, Token(14)).unwrap();
        assert_eq!(ids.current_token(), Token(15));
        let positions: Vec<_> = ids.positions().map(|(n, t)| (n.as_str(), t.0)).collect();
        assert_eq!(positions, [("me", 13), ("w1", 14), ("w2", 15)]);
    }

    #[test]
    fn a_gapless_run_moves_the_stream_past_an_idle_writer() {
        let mut ids = sole_writer(3);
        let other = name("other");
        ids.advance(&other, Token(3)).unwrap();
        let a = take(&mut ids, 4);
        ids.advance(&other, Token(5)).unwrap();
        assert_eq!(ids.current_token(), Token(3));
        ids.persisted(&[a]).unwrap();
        // 4 (ours) and 5 (theirs) follow 3 with no gap.
        assert_eq!(ids.current_token(), Token(5));
    }

    #[test]
    fn own_echoes_are_ignored() {
        let mut ids = sole_writer(7);
        let a = take(&mut ids, 8);
        ids.advance(&name("me"), Token(100)).unwrap();
        assert_eq!(ids.own_position(), Token(7));
        assert_eq!(ids.persisted(&[a]).unwrap(), Token(8));
    }

    #[test]
    fn startup_drops_former_writers_and_takes_the_sequence_as_its_own() {
        let me = name("me");
        let loading = StreamIds::loading(
            me.clone(),
            [me.clone(), name("w1")],
            [
                (name("gone"), Token(2)),
                (name("w1"), Token(40)),
                (me.clone(), Token(30)),
            ],
            Token(50),
        );
        assert_eq!(loading.stale(), [name("gone")]);
        assert_eq!(loading.rows_from(), Some(Token(40)));
        let ids = loading
            .with_rows([(name("w1"), Token(41)), (name("x"), Token(39))])
            .unwrap();
        // 41 follows 40 with no gap; 39 was below what was asked for.
        assert_eq!(ids.current_token(), Token(41));
        assert_eq!(ids.own_position(), Token(50));
        assert_eq!(ids.own_minimal_position(), Token(50));
        assert_eq!(ids.position(&name("w1")), Token(41));
    }

    #[test]
    fn startup_takes_this_writers_latest_row_over_the_sequence() {
        // As Synapse: its own rows at or above the minimum set its
        // position, even below the sequence's last_value.
        let me = name("me");
        let ids = StreamIds::loading(
            me.clone(),
            [me.clone(), name("w1")],
            [(name("w1"), Token(20))],
            Token(30),
        )
        .with_rows([(me.clone(), Token(25)), (me.clone(), Token(22))])
        .unwrap();
        assert_eq!(ids.own_minimal_position(), Token(25));
        assert_eq!(ids.own_position(), Token(25));
    }

    #[test]
    fn startup_with_no_positions_reads_the_tables_max() {
        // `caches`: any process writes, nothing in stream_positions is read.
        let loading = StreamIds::loading(name("me"), [], [(name("w"), Token(9))], Token(99));
        assert!(loading.stale().is_empty());
        assert_eq!(loading.rows_from(), None);
        let ids = loading.with_max_id(Token(17)).unwrap();
        assert_eq!(ids.current_token(), Token(17));
        assert_eq!(ids.own_position(), Token(17));
        assert_eq!(ids.own_minimal_position(), Token(17));
        let positions: Vec<_> = ids.positions().map(|(n, t)| (n.as_str(), t.0)).collect();
        assert_eq!(positions, [("me", 17)]);

        // Empty tables: Synapse's GREATEST(..., 1).
        let empty = StreamIds::loading(name("me"), [], [], Token(1));
        assert_eq!(
            empty.with_max_id(Token(0)).unwrap().current_token(),
            Token(1)
        );

        // A reader (not a writer) of a stream with no positions yet.
        let reader = StreamIds::loading(name("me"), [name("w")], [], Token(5))
            .with_max_id(Token(4))
            .unwrap();
        assert_eq!(reader.position(&name("w")), Token(4));
    }

    #[test]
    fn misuse_is_refused() {
        let mut reader = StreamIds::loading(name("me"), [name("w")], [], Token(5))
            .with_max_id(Token(4))
            .unwrap();
        assert_eq!(
            reader.reserve(),
            Err(StreamIdError::NotAWriter {
                instance: name("me")
            })
        );

        let mut ids = sole_writer(7);
        let reservation = ids.reserve().unwrap();
        assert_eq!(
            ids.allocated(reservation, &[Token(7)]),
            Err(StreamIdError::IdNotAbove {
                id: Token(7),
                floor: Token(7)
            })
        );
        // Released: nothing holds the position.
        assert!(!ids.in_flight());
        let (first, second) = (ids.reserve().unwrap(), ids.reserve().unwrap());
        ids.allocated(first, &[Token(8)]).unwrap();
        let a = Token(8);
        assert_eq!(
            ids.allocated(second, &[Token(8)]),
            Err(StreamIdError::AlreadyAllocated(Token(8)))
        );
        let reservation = ids.reserve().unwrap();
        assert_eq!(
            ids.allocated(reservation, &[Token(9), Token(9)]),
            Err(StreamIdError::AlreadyAllocated(Token(9)))
        );
        assert_eq!(
            ids.persisted(&[a, Token(9)]),
            Err(StreamIdError::NotAllocated(Token(9)))
        );
        assert!(ids.in_flight(), "8 is still unfinished");
        assert_eq!(ids.persisted(&[a, a]).unwrap(), Token(8));
        assert_eq!(
            ids.persisted(&[a]),
            Err(StreamIdError::NotAllocated(Token(8)))
        );

        let foreign = sole_writer(7).reserve().unwrap();
        assert_eq!(
            ids.allocated(foreign, &[Token(9)]),
            Err(StreamIdError::UnknownReservation)
        );

        let loading = StreamIds::loading(name("me"), [], [], Token(1));
        assert!(matches!(
            loading.with_rows([]),
            Err(StreamIdError::StartupRead { .. })
        ));
        let loading = StreamIds::loading(name("me"), [name("me")], [], Token(1));
        assert!(matches!(
            loading.with_max_id(Token(1)),
            Err(StreamIdError::StartupRead { .. })
        ));
    }

    #[test]
    fn state_from_others_is_bounded() {
        let mut ids = sole_writer(1);
        // This writer is one of them.
        for n in 1..MAX_INSTANCES {
            let id = i64::try_from(n).unwrap() * 2 + 10;
            ids.advance(&InstanceName::new(format!("w{n}")), Token(id))
                .unwrap();
        }
        assert_eq!(
            ids.advance(&name("one-more"), Token(3)),
            Err(StreamIdError::TooManyInstances)
        );
        // Extreme ids neither panic nor wrap.
        ids.advance(&name("w1"), Token(i64::MAX)).unwrap();
        ids.advance(&name("w2"), Token(i64::MIN)).unwrap();
        let reservation = ids.reserve().unwrap();
        assert!(ids.allocated(reservation, &[Token(i64::MAX)]).is_err());
    }

    #[test]
    fn persisted_ids_waiting_for_a_gap_are_bounded() {
        let mut ids = sole_writer(1);
        let idle = name("idle");
        ids.advance(&idle, Token(10)).unwrap();
        for id in 0..(MAX_KNOWN_PERSISTED as i64 + 10) {
            ids.advance(&name("busy"), Token(100 + 2 * id)).unwrap();
        }
        assert_eq!(ids.known_persisted.len(), MAX_KNOWN_PERSISTED);
        assert_eq!(ids.position(&idle), Token(10));
    }
}
