//! The follower: per (stream, writer) positions, batches, gaps and catch-up.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::mem;
use std::sync::Arc;

use crate::wire::{
    Command, CommandKind, InstanceName, LostRdata, Position, RawRow, Rdata, RdataToken, StreamName,
    Token,
};
use crate::writers::{WriterRegistry, Writers};

use super::catch_up::{CatchUpError, CatchUpId, CatchUpPage, CatchUpRequest};
use super::tokens_only_grow;

/// The rows of one token, in the order written: one row inline (the common
/// case: no allocation per row), or a batch. Use it as a slice (it derefs
/// to `[RawRow]`), iterate it, or take a `Vec` with [`Rows::into_vec`]; it
/// compares equal to a `Vec` of the same rows.
#[derive(Clone, PartialEq, Eq)]
pub struct Rows(RowsRepr);

#[derive(Clone, PartialEq, Eq)]
enum RowsRepr {
    One(RawRow),
    Many(Vec<RawRow>),
}

impl Rows {
    /// One row.
    pub fn one(row: RawRow) -> Rows {
        Rows(RowsRepr::One(row))
    }

    /// The rows as a `Vec`.
    pub fn into_vec(self) -> Vec<RawRow> {
        match self.0 {
            RowsRepr::One(row) => vec![row],
            RowsRepr::Many(rows) => rows,
        }
    }

    fn push(&mut self, row: RawRow) {
        match &mut self.0 {
            RowsRepr::Many(rows) => rows.push(row),
            RowsRepr::One(_) => {
                let RowsRepr::One(first) =
                    mem::replace(&mut self.0, RowsRepr::Many(Vec::with_capacity(2)))
                else {
                    return;
                };
                if let RowsRepr::Many(rows) = &mut self.0 {
                    rows.push(first);
                    rows.push(row);
                }
            }
        }
    }
}

impl From<Vec<RawRow>> for Rows {
    fn from(rows: Vec<RawRow>) -> Rows {
        Rows(RowsRepr::Many(rows))
    }
}

impl std::ops::Deref for Rows {
    type Target = [RawRow];

    fn deref(&self) -> &[RawRow] {
        match &self.0 {
            RowsRepr::One(row) => std::slice::from_ref(row),
            RowsRepr::Many(rows) => rows,
        }
    }
}

impl fmt::Debug for Rows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl From<Rows> for Vec<RawRow> {
    fn from(rows: Rows) -> Vec<RawRow> {
        rows.into_vec()
    }
}

impl PartialEq<Vec<RawRow>> for Rows {
    fn eq(&self, other: &Vec<RawRow>) -> bool {
        **self == other[..]
    }
}

impl PartialEq<Rows> for Vec<RawRow> {
    fn eq(&self, other: &Rows) -> bool {
        self[..] == **other
    }
}

impl<'a> IntoIterator for &'a Rows {
    type Item = &'a RawRow;
    type IntoIter = std::slice::Iter<'a, RawRow>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl IntoIterator for Rows {
    type Item = RawRow;
    type IntoIter = std::vec::IntoIter<RawRow>;

    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}

/// What the application must do, as a [`Follower`] decides it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FollowerEvent {
    /// Rows of one token, to apply together (a batch is never split).
    ///
    /// Rows of one (stream, writer) come in strictly increasing token order,
    /// each exactly once, unless a [`FollowerEvent::Reset`] intervenes.
    Rows {
        /// The stream.
        stream: StreamName,
        /// The writer that wrote them.
        writer: InstanceName,
        /// Their token: the writer's position once they are applied.
        token: Token,
        /// The rows, in the order written.
        rows: Rows,
        /// Whether they came live or from a catch-up.
        source: RowSource,
    },
    /// The writer's position moved to `token` without rows (a `POSITION`
    /// with nothing missed, the end of a catch-up, a first position).
    Position {
        /// The stream.
        stream: StreamName,
        /// The writer.
        writer: InstanceName,
        /// The new position.
        token: Token,
    },
    /// Rows were missed: fetch them (see [`CatchUpRequest`]) and answer with
    /// [`Follower::handle_catch_up`] or [`Follower::catch_up_failed`]. The
    /// stream's later commands wait until then.
    CatchUp(CatchUpRequest),
    /// The writer's stream went backwards (`POSITION` with a new token below
    /// the current one, on a stream whose tokens may restart: see
    /// [`tokens_only_grow`](super::tokens_only_grow)). The writer restarted:
    /// forget what its rows built (Synapse's typing handler clears every
    /// room). Rows of its new life follow, starting above 0, through a
    /// catch-up when some were already written.
    Reset {
        /// The stream.
        stream: StreamName,
        /// The writer.
        writer: InstanceName,
        /// The position before the reset.
        previous: Token,
        /// The writer's announced position.
        new: Token,
    },
    /// A command from an instance that may not write the stream (or one
    /// more writer than the limit) was ignored; no state changed.
    Rejected {
        /// The stream.
        stream: StreamName,
        /// The sender named in the command.
        instance: InstanceName,
        /// `RDATA` or `POSITION`.
        command: CommandKind,
        /// Why.
        reason: RejectReason,
    },
}

impl fmt::Display for FollowerEvent {
    /// A one-line summary (rows are counted, not printed).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FollowerEvent::Rows {
                stream,
                writer,
                token,
                rows,
                source,
            } => {
                write!(
                    f,
                    "rows {stream} {writer} {token} ({} rows, {source:?})",
                    rows.len()
                )
            }
            FollowerEvent::Position {
                stream,
                writer,
                token,
            } => {
                write!(f, "position {stream} {writer} {token}")
            }
            FollowerEvent::CatchUp(request) => write!(f, "{request}"),
            FollowerEvent::Reset {
                stream,
                writer,
                previous,
                new,
            } => {
                write!(f, "reset {stream} {writer} {previous} -> {new}")
            }
            FollowerEvent::Rejected {
                stream,
                instance,
                command,
                reason,
            } => {
                write!(f, "rejected {command} {stream} {instance}: {reason}")
            }
        }
    }
}

/// Where rows came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowSource {
    /// `RDATA` on the connection.
    Live,
    /// A catch-up page.
    CatchUp,
}

/// Why a command was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum RejectReason {
    /// The registry does not list the instance as a writer of the stream.
    #[error("not a writer of this stream")]
    NotAWriter,
    /// The follower already tracks [`FollowerLimits::max_tracked_pairs`]
    /// (stream, writer) pairs.
    #[error("too many (stream, writer) pairs tracked")]
    TooManyWriters,
}

/// A position that cannot be set.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SeedError {
    /// The registry refuses the pair.
    #[error("cannot track {instance} on {stream}: {reason}")]
    Rejected {
        /// The stream.
        stream: StreamName,
        /// The instance.
        instance: InstanceName,
        /// Why.
        reason: RejectReason,
    },
    /// The follower's own rows are not followed (its echoes are ignored).
    #[error("{0} is this follower's own name")]
    OwnName(InstanceName),
    /// A catch-up for the stream is outstanding.
    #[error("a catch-up for {0} is outstanding")]
    CatchUpOutstanding(StreamName),
}

/// Bounds on what a [`Follower`] holds, whatever its input.
///
/// When a bound is reached nothing is lost silently: the rows that could
/// not be held are fetched again through a catch-up.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FollowerLimits {
    /// Commands of one writer held while a catch-up of it is outstanding
    /// (default 10 000). Beyond, the held commands are folded into one
    /// summary (its last token, and whether a batch was open), which turns
    /// into a catch-up up to that token once the current one completes.
    pub max_queued_commands: usize,
    /// `batch` rows held for one writer until their numbered row (default
    /// 10 000). Beyond, the batch is dropped and its numbered row triggers a
    /// catch-up up to its token instead of being applied.
    pub max_batch_rows: usize,
    /// Row bytes held in all queues and batches together (default 64 MiB);
    /// beyond, the same as either limit above.
    pub max_buffered_bytes: usize,
    /// (stream, writer) pairs tracked (default 4096). A command that would
    /// add one more is rejected with [`RejectReason::TooManyWriters`]; see
    /// [`Follower::forget_writer`].
    pub max_tracked_pairs: usize,
}

impl Default for FollowerLimits {
    fn default() -> Self {
        FollowerLimits {
            max_queued_commands: 10_000,
            max_batch_rows: 10_000,
            max_buffered_bytes: 64 << 20,
            max_tracked_pairs: 4096,
        }
    }
}

/// What a [`Follower`] has done, for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FollowerCounters {
    /// Numbered `RDATA` applied (each gave a [`FollowerEvent::Rows`]).
    pub rdata_applied: u64,
    /// Rows delivered, live and caught up.
    pub rows_delivered: u64,
    /// `RDATA` not above the writer's position, dropped.
    pub rdata_stale: u64,
    /// `RDATA` dropped because no `POSITION` of its writer was processed on
    /// this connection yet.
    pub rdata_unconnected: u64,
    /// `batch` rows dropped (cut batches, stale batches, batches a
    /// `POSITION` or a disconnection discarded).
    pub batch_rows_discarded: u64,
    /// Commands naming this follower as their sender, ignored.
    pub own_echoes: u64,
    /// Stream commands received while disconnected, ignored.
    pub while_disconnected: u64,
    /// Commands other than `RDATA` and `POSITION`, ignored.
    pub ignored_commands: u64,
    /// `POSITION`s processed.
    pub positions_processed: u64,
    /// Redundant `POSITION`s dropped (tokens only grow, nothing new).
    pub positions_discarded: u64,
    /// Commands rejected (see [`FollowerEvent::Rejected`]).
    pub rejected: u64,
    /// Resets (see [`FollowerEvent::Reset`]).
    pub resets: u64,
    /// Catch-up requests made (every page and retry counts).
    pub catch_ups_requested: u64,
    /// Catch-up pages applied.
    pub catch_up_pages: u64,
    /// Catch-ups completed.
    pub catch_ups_completed: u64,
    /// Catch-ups asked again after [`Follower::catch_up_failed`].
    pub catch_up_retries: u64,
    /// Times a stream's held commands were folded (queue limit reached).
    pub queue_overflows: u64,
    /// Times a batch was cut (batch limit reached).
    pub batch_overflows: u64,
    /// Held commands dropped because the connection was lost.
    pub dropped_on_disconnect: u64,
    /// `REPLICATE`s seen (each makes every writer's next command checked).
    pub replicates: u64,
    /// Commands after a `REPLICATE` that moved a writer forward and so
    /// were checked by a catch-up rather than trusted.
    pub unproven_checked: u64,
    /// Catch-up rows outside the range asked for, skipped.
    pub catch_up_rows_skipped: u64,
    /// `RDATA` lines whose row could not be read, of a known writer and
    /// token (each a gap to fetch).
    pub rdata_lost: u64,
    /// `RDATA` lines too broken to say whose row they held (each makes the
    /// next move of every writer they may have come from checked).
    pub rdata_unattributed: u64,
}

/// Follows replication streams: the positions half of Synapse's
/// `ReplicationCommandHandler`.
///
/// # Call order
///
/// 1. Create it with [`Follower::new`], then seed the positions the
///    application persisted with [`Follower::set_position`]. A writer with
///    no seeded position starts at the first `POSITION` it announces (rows
///    before it are not fetched).
/// 2. Call [`Follower::connected`] when the connection is ready (over
///    Redis: once the subscription is confirmed), and
///    [`Follower::disconnected`] when it is lost.
/// 3. Feed every received command to [`Follower::handle_command`], in the
///    order received. Only `RDATA`, `POSITION` and `REPLICATE` matter;
///    the rest is ignored.
/// 4. After every input, drain [`Follower::poll_event`] until `None` and
///    act on each event in order: apply rows, record positions, start the
///    catch-ups asked for.
/// 5. Answer each [`CatchUpRequest`] exactly once, with
///    [`Follower::handle_catch_up`] (a page of rows) or
///    [`Follower::catch_up_failed`] (which asks again), then drain events.
///    Catch-ups survive disconnections.
///
/// # Rules (Synapse's `handler.py`)
///
/// - Commands naming this follower as sender are its own echoes: ignored.
/// - `RDATA` of a writer is dropped until a `POSITION` of that writer was
///   processed on the current connection.
/// - `batch` rows wait for their numbered row; `RDATA` not above the
///   writer's position is stale and dropped (with its batch).
/// - `POSITION prev new` with `prev <= current <= new`: nothing was missed,
///   the position becomes `new`. Otherwise rows are missing: a catch-up
///   from `current` to `new`. For streams whose tokens only grow, a
///   `POSITION` with `new <= current` changes nothing; for the others it is
///   a reset (the position restarts from 0).
/// - While a catch-up of a writer is outstanding, that writer's commands
///   on the stream wait, in order, and are processed when it completes.
///   Other writers, and other streams, go on.
/// - Catch-up rows outside the range asked for are skipped, not refused
///   (see [`Follower::handle_catch_up`]).
/// - Commands from instances the [`WriterRegistry`] does not list as
///   writers of the stream are rejected (Synapse does not check this).
///
/// # A writer that lost its own connection
///
/// A Synapse writer whose Redis connection drops while it keeps writing
/// loses what it publishes meanwhile. On reconnecting it publishes
/// `REPLICATE`, may publish `RDATA` at its latest token, then
/// `POSITION t t`; nothing on the wire shows the gap, and Synapse's own
/// followers lose those rows. This follower does not: a `REPLICATE` (which
/// names no sender) makes the next command of every writer unproven. Its
/// next numbered `RDATA` above its position is fetched by a catch-up up to
/// that token instead of being applied, and its next `POSITION` above its
/// position is caught up to whatever its `prev` says. Commands held behind
/// a catch-up keep their place relative to the `REPLICATE`. The cost is at
/// most one catch-up per writer that moves forward right after a
/// `REPLICATE`; what a writer publishes after its `REPLICATE` reaches every
/// connected subscriber, so one check per writer is enough.
///
/// Deliberate differences from Synapse: connection state and `batch` rows
/// are kept per (stream, writer), not per stream, so that a `POSITION` of
/// one writer neither lets another writer's `RDATA` through before that
/// writer announced itself, nor discards another writer's open batch; a
/// reset fetches the rows of the writer's new life (Synapse's catch-up asks
/// for the empty range `(current, new]`); a batch whose first rows were
/// dropped (before the writer's `POSITION`, or over a limit) is fetched by a
/// catch-up instead of being delivered incomplete; catch-ups and held
/// commands are per writer, not per stream, so one writer's failing
/// catch-up holds back no other; and `REPLICATE` is taken as a sign of a
/// possible gap (above).
///
/// # Performance and memory
///
/// The common case (a numbered `RDATA` of a known stream, no catch-up
/// outstanding) allocates only the event's `Vec` of rows and clones
/// nothing: the event takes the command's names. Memory is bounded by
/// [`FollowerLimits`] whatever the input.
pub struct Follower {
    own: InstanceName,
    registry: Arc<dyn WriterRegistry>,
    streams: Streams,
    ctx: Ctx,
}

impl fmt::Debug for Follower {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Follower")
            .field("own", &self.own)
            .field("connected", &self.ctx.connected)
            .field("tracked_pairs", &self.ctx.pairs)
            .field("buffered_bytes", &self.ctx.buffered_bytes)
            .field("counters", &self.ctx.counters)
            .finish_non_exhaustive()
    }
}

/// State shared by every stream.
struct Ctx {
    limits: FollowerLimits,
    events: VecDeque<FollowerEvent>,
    counters: FollowerCounters,
    connected: bool,
    /// Incremented on every new connection.
    epoch: u64,
    next_id: u64,
    pairs: usize,
    buffered_bytes: usize,
}

impl Ctx {
    fn next_id(&mut self) -> CatchUpId {
        self.next_id += 1;
        CatchUpId(self.next_id)
    }
}

struct Streams {
    /// One per [`StreamName::KNOWN`], in that order.
    known: Vec<StreamState>,
    /// Streams this crate does not know, created when a writer of one is
    /// admitted, removed when their last writer is forgotten.
    others: Vec<StreamState>,
}

#[derive(Clone, Copy)]
enum Slot {
    Known(usize),
    Other(usize),
}

impl Streams {
    fn slot(&self, stream: &StreamName) -> Option<Slot> {
        match known_index(stream) {
            Some(index) => Some(Slot::Known(index)),
            None => self
                .others
                .iter()
                .position(|s| s.name == *stream)
                .map(Slot::Other),
        }
    }

    fn get(&self, slot: Slot) -> Option<&StreamState> {
        match slot {
            Slot::Known(i) => self.known.get(i),
            Slot::Other(i) => self.others.get(i),
        }
    }

    fn get_mut(&mut self, slot: Slot) -> Option<&mut StreamState> {
        match slot {
            Slot::Known(i) => self.known.get_mut(i),
            Slot::Other(i) => self.others.get_mut(i),
        }
    }

    fn find(&self, stream: &StreamName) -> Option<&StreamState> {
        self.slot(stream).and_then(|slot| self.get(slot))
    }

    fn all_mut(&mut self) -> impl Iterator<Item = &mut StreamState> {
        self.known.iter_mut().chain(self.others.iter_mut())
    }

    fn all(&self) -> impl Iterator<Item = &StreamState> {
        self.known.iter().chain(self.others.iter())
    }

    /// The stream and writer whose catch-up has this id.
    fn find_catch_up(&self, id: CatchUpId) -> Option<(Slot, usize)> {
        let find = |s: &StreamState| {
            s.writers
                .iter()
                .position(|w| w.catch_up().is_some_and(|c| c.id == id))
        };
        let known = self
            .known
            .iter()
            .enumerate()
            .map(|(i, s)| (Slot::Known(i), s));
        let others = self
            .others
            .iter()
            .enumerate()
            .map(|(i, s)| (Slot::Other(i), s));
        known
            .chain(others)
            .find_map(|(slot, s)| find(s).map(|wi| (slot, wi)))
    }
}

/// The index of a known stream in [`StreamName::KNOWN`], without comparing
/// strings.
fn known_index(stream: &StreamName) -> Option<usize> {
    Some(match stream {
        StreamName::Events => 0,
        StreamName::Backfill => 1,
        StreamName::Presence => 2,
        StreamName::PresenceFederation => 3,
        StreamName::Typing => 4,
        StreamName::Receipts => 5,
        StreamName::PushRules => 6,
        StreamName::Pushers => 7,
        StreamName::Caches => 8,
        StreamName::DeviceLists => 9,
        StreamName::ToDevice => 10,
        StreamName::Federation => 11,
        StreamName::AccountData => 12,
        StreamName::ProfileUpdates => 13,
        StreamName::StickyEvents => 14,
        StreamName::ThreadSubscriptions => 15,
        StreamName::UnPartialStatedRoom => 16,
        StreamName::UnPartialStatedEvent => 17,
        StreamName::QuarantinedMedia => 18,
        StreamName::Other(_) => return None,
    })
}

/// Up to this many writers per stream, a writer is found by comparing names;
/// beyond, through a hash map.
const LINEAR_WRITERS: usize = 8;

struct StreamState {
    name: StreamName,
    monotonic: bool,
    writers: Vec<WriterState>,
    /// Positions in `writers` by name, once there are more than
    /// [`LINEAR_WRITERS`] (`caches` over Redis can have many).
    index: Option<HashMap<InstanceName, usize>>,
}

struct WriterState {
    /// A copy of the name that shares no buffer with any line.
    name: InstanceName,
    position: Option<Token>,
    /// A `POSITION` of this writer was processed on the current connection
    /// and no catch-up of it is outstanding.
    connected: bool,
    /// Rows of the writer's open batch were lost: its numbered row must be
    /// fetched rather than applied.
    batch_cut: bool,
    /// A `REPLICATE` came since this writer's last command: it may be the
    /// writer's own, sent on reconnecting after rows it wrote were lost, so
    /// its next command is checked by a catch-up rather than trusted.
    unproven: bool,
    batch: Vec<RawRow>,
    batch_bytes: usize,
    /// The writer's outstanding catch-up and the commands held behind it.
    pending: Option<Box<Pending>>,
}

impl WriterState {
    fn new(name: InstanceName) -> WriterState {
        WriterState {
            name,
            position: None,
            connected: false,
            batch_cut: false,
            unproven: false,
            batch: Vec::new(),
            batch_bytes: 0,
            pending: None,
        }
    }

    /// Drops the pending batch; returns how many rows it had.
    fn clear_batch(&mut self, ctx: &mut Ctx) -> usize {
        let rows = self.batch.len();
        ctx.buffered_bytes -= self.batch_bytes;
        ctx.counters.batch_rows_discarded += rows as u64;
        self.batch_bytes = 0;
        self.batch = Vec::new();
        rows
    }

    fn catch_up(&self) -> Option<&CatchUp> {
        self.pending.as_ref()?.catch_up.as_ref()
    }

    fn queued_commands(&self) -> usize {
        self.pending.as_ref().map_or(0, |p| p.queued_commands)
    }
}

/// One writer's catch-up, and its commands that wait for it.
struct Pending {
    /// `None` only while the queue is being processed after a catch-up.
    catch_up: Option<CatchUp>,
    queue: VecDeque<Queued>,
    /// Entries of `queue` that are commands (not folds).
    queued_commands: usize,
}

struct CatchUp {
    id: CatchUpId,
    /// Rows above this token are asked for.
    cursor: Token,
    to: Token,
    /// The connection it started on: only then does completing it connect
    /// the writer.
    epoch: u64,
}

enum Queued {
    Rdata(Rdata),
    /// An `RDATA` of this writer whose row could not be read.
    Lost(RdataToken),
    Position(Position),
    Replicate,
    Fold(Fold),
}

impl Queued {
    fn bytes(&self) -> usize {
        match self {
            Queued::Rdata(rdata) => rdata.row.as_bytes().len(),
            Queued::Lost(_) | Queued::Position(_) | Queued::Replicate | Queued::Fold(_) => 0,
        }
    }
}

/// What a writer's folded commands amounted to.
#[derive(Default)]
struct Fold {
    /// The new token of its first folded `POSITION`.
    baseline: Option<Token>,
    /// Its last token: the last `POSITION`'s, or a higher `RDATA`'s.
    last: Option<Token>,
    /// `last` is a `POSITION`'s (which may announce a reset); an `RDATA`'s
    /// at or below the writer's position is only stale.
    last_announced: bool,
    /// Whether its last folded `RDATA` was a `batch` row (`None`: no
    /// `RDATA` was folded).
    open_batch: Option<bool>,
    /// A `REPLICATE` was folded after its last token.
    unproven: bool,
}

impl Fold {
    fn absorb_rdata(&mut self, token: RdataToken) {
        match token {
            RdataToken::Batch => self.open_batch = Some(true),
            RdataToken::At(token) => {
                if self.last.is_none_or(|last| token > last) {
                    self.last = Some(token);
                    self.last_announced = false;
                }
                self.open_batch = Some(false);
                // The fold's catch-up reaches this token.
                self.unproven = false;
            }
        }
    }

    fn absorb(&mut self, item: Queued) {
        match item {
            Queued::Rdata(rdata) => self.absorb_rdata(rdata.token),
            Queued::Position(position) => {
                // As when processed: the POSITION does not close an open batch.
                self.baseline = self.baseline.or(Some(position.new_token));
                self.last = Some(position.new_token);
                self.last_announced = true;
                self.unproven = false;
            }
            // A lost row: its fold's catch-up fetches it.
            Queued::Lost(token) => self.absorb_rdata(token),
            Queued::Replicate => self.unproven = true,
            // A fold only ever heads the queue it is folded with.
            Queued::Fold(earlier) => {
                self.baseline = self.baseline.or(earlier.baseline);
                if earlier.last.is_some() {
                    self.last = earlier.last;
                    self.last_announced = earlier.last_announced;
                }
                self.open_batch = earlier.open_batch.or(self.open_batch);
                self.unproven |= earlier.unproven;
            }
        }
    }
}

impl StreamState {
    fn new(name: StreamName) -> StreamState {
        StreamState {
            monotonic: tokens_only_grow(&name),
            name,
            writers: Vec::new(),
            index: None,
        }
    }

    fn writer_index(&self, instance: &InstanceName) -> Option<usize> {
        match &self.index {
            Some(index) => index.get(instance).copied(),
            None => self.writers.iter().position(|w| w.name == *instance),
        }
    }

    fn writer(&self, instance: &InstanceName) -> Option<&WriterState> {
        self.writer_index(instance)
            .and_then(|wi| self.writers.get(wi))
    }

    fn add_writer(&mut self, writer: WriterState) -> usize {
        let wi = self.writers.len();
        if let Some(index) = &mut self.index {
            index.insert(writer.name.clone(), wi);
        }
        if wi < LINEAR_WRITERS {
            // Most streams have one to four writers: no slack.
            self.writers.reserve_exact(1);
        }
        self.writers.push(writer);
        if self.index.is_none() && self.writers.len() > LINEAR_WRITERS {
            let index = self
                .writers
                .iter()
                .enumerate()
                .map(|(i, w)| (w.name.clone(), i))
                .collect();
            self.index = Some(index);
        }
        wi
    }

    fn remove_writer(&mut self, wi: usize) -> Option<WriterState> {
        if wi >= self.writers.len() {
            return None;
        }
        let removed = self.writers.swap_remove(wi);
        if let Some(index) = &mut self.index {
            index.remove(&removed.name);
            if let Some(moved) = self.writers.get(wi) {
                index.insert(moved.name.clone(), wi);
            }
        }
        Some(removed)
    }

    /// Commands held behind this stream's catch-ups.
    fn queued_commands(&self) -> usize {
        self.writers.iter().map(WriterState::queued_commands).sum()
    }

    /// Whether writer `wi` has a catch-up outstanding or commands held.
    fn is_pending(&self, wi: usize) -> bool {
        self.writers.get(wi).is_some_and(|w| w.pending.is_some())
    }

    /// Processes a command of writer `wi` now, or holds it behind the
    /// writer's catch-up.
    fn handle(&mut self, wi: usize, item: Queued, ctx: &mut Ctx) {
        if self.is_pending(wi) {
            self.enqueue(wi, item, ctx);
        } else {
            self.process(wi, item, ctx);
        }
    }

    fn process(&mut self, wi: usize, item: Queued, ctx: &mut Ctx) {
        match item {
            Queued::Rdata(rdata) => self.process_rdata(wi, rdata, ctx),
            Queued::Position(position) => {
                self.process_position(wi, position.prev_token, position.new_token, false, ctx)
            }
            Queued::Lost(token) => self.process_lost(wi, token, ctx),
            Queued::Replicate => {
                if let Some(w) = self.writers.get_mut(wi) {
                    w.unproven = w.position.is_some();
                }
            }
            Queued::Fold(fold) => self.process_fold(wi, fold, ctx),
        }
    }

    fn process_rdata(&mut self, wi: usize, rdata: Rdata, ctx: &mut Ctx) {
        let Some(w) = self.writers.get_mut(wi) else {
            return;
        };
        let position = match w.position {
            Some(position) if w.connected => position,
            _ => {
                ctx.counters.rdata_unconnected += 1;
                // Remember whether this writer's open batch lost rows.
                w.batch_cut = rdata.token.is_batch();
                return;
            }
        };
        let token = match rdata.token {
            RdataToken::At(token) => token,
            RdataToken::Batch => {
                if w.batch_cut || w.unproven {
                    // Its numbered row is fetched, with the whole batch.
                    ctx.counters.batch_rows_discarded += 1;
                    return;
                }
                let len = rdata.row.as_bytes().len();
                if w.batch.len() >= ctx.limits.max_batch_rows
                    || ctx.buffered_bytes.saturating_add(len) > ctx.limits.max_buffered_bytes
                {
                    ctx.counters.batch_overflows += 1;
                    ctx.counters.batch_rows_discarded += 1;
                    w.clear_batch(ctx);
                    w.batch_cut = true;
                    return;
                }
                ctx.buffered_bytes += len;
                w.batch_bytes += len;
                w.batch.push(rdata.row);
                return;
            }
        };
        if w.unproven && token > position {
            // Rows the writer wrote before this one may never have been
            // published: fetch up to it rather than apply it.
            w.unproven = false;
            w.batch_cut = false;
            w.clear_batch(ctx);
            ctx.counters.unproven_checked += 1;
            self.start_catch_up(wi, position, token, ctx);
            return;
        }
        if w.batch_cut {
            w.batch_cut = false;
            w.clear_batch(ctx);
            if token > position {
                self.start_catch_up(wi, position, token, ctx);
            } else {
                ctx.counters.rdata_stale += 1;
            }
            return;
        }
        if token <= position {
            ctx.counters.rdata_stale += 1;
            w.clear_batch(ctx);
            return;
        }
        let rows = if w.batch.is_empty() {
            Rows::one(rdata.row)
        } else {
            ctx.buffered_bytes -= w.batch_bytes;
            w.batch_bytes = 0;
            let mut rows = mem::take(&mut w.batch);
            rows.push(rdata.row);
            Rows::from(rows)
        };
        w.position = Some(token);
        ctx.counters.rdata_applied += 1;
        ctx.counters.rows_delivered += rows.len() as u64;
        ctx.events.push_back(FollowerEvent::Rows {
            stream: rdata.stream,
            writer: rdata.instance,
            token,
            rows,
            source: RowSource::Live,
        });
    }

    /// An `RDATA` of writer `wi` whose row is lost: a gap to fetch, never
    /// one to step over.
    fn process_lost(&mut self, wi: usize, token: RdataToken, ctx: &mut Ctx) {
        let Some(w) = self.writers.get_mut(wi) else {
            return;
        };
        ctx.counters.rdata_lost += 1;
        let position = match w.position {
            Some(position) if w.connected => position,
            _ => {
                // Dropped anyway; its POSITION brings a catch-up.
                w.batch_cut = token.is_batch();
                return;
            }
        };
        match token {
            RdataToken::Batch => {
                // The batch is incomplete: its numbered row is fetched.
                w.clear_batch(ctx);
                w.batch_cut = true;
            }
            RdataToken::At(token) if token > position => {
                w.batch_cut = false;
                w.unproven = false;
                w.clear_batch(ctx);
                self.start_catch_up(wi, position, token, ctx);
            }
            RdataToken::At(_) => {
                // A row at or below the position was delivered already.
                ctx.counters.rdata_stale += 1;
                w.clear_batch(ctx);
                w.batch_cut = false;
            }
        }
    }

    /// Whether a `POSITION` can be dropped unseen (Synapse's
    /// `can_discard_position` on a connected stream). One at the writer's
    /// position after a `REPLICATE` is kept: it proves the writer lost
    /// nothing.
    fn discardable(&self, wi: usize, new: Token) -> bool {
        self.monotonic
            && self.writers.get(wi).is_some_and(|w| {
                w.connected
                    && w.position
                        .is_some_and(|p| new < p || (new == p && !w.unproven))
            })
    }

    /// `POSITION prev new`, or (`forced`) a fold's summary, which always
    /// fetches up to `new` what may be missing.
    fn process_position(
        &mut self,
        wi: usize,
        prev: Token,
        new: Token,
        forced: bool,
        ctx: &mut Ctx,
    ) {
        if !forced && self.discardable(wi, new) {
            ctx.counters.positions_discarded += 1;
            return;
        }
        let monotonic = self.monotonic;
        let Some(w) = self.writers.get_mut(wi) else {
            return;
        };
        ctx.counters.positions_processed += 1;
        if w.clear_batch(ctx) > 0 {
            // The batch's numbered row, if it comes, must not be applied alone.
            w.batch_cut = true;
        }
        w.connected = false;
        let Some(original) = w.position else {
            // A writer never seen: start from its announced position.
            w.position = Some(new);
            w.connected = ctx.connected;
            w.unproven = false;
            self.push_position(wi, new, ctx);
            return;
        };
        let mut current = original;
        if current > new {
            if monotonic {
                // A late POSITION: this stream cannot go backwards.
                w.connected = ctx.connected;
                return;
            }
            ctx.counters.resets += 1;
            current = if new > Token(0) { Token(0) } else { new };
            w.position = Some(current);
            w.batch_cut = false;
            ctx.events.push_back(FollowerEvent::Reset {
                stream: self.name.clone(),
                writer: w.name.clone(),
                previous: original,
                new,
            });
        }
        // After a REPLICATE, `prev` does not prove that nothing was missed:
        // the writer may have lost what it published before reconnecting.
        let trusted = !forced && !w.unproven;
        if w.unproven && current < new {
            ctx.counters.unproven_checked += 1;
        }
        w.unproven = false;
        if current == new || (trusted && prev <= current) {
            w.position = Some(new);
            w.connected = ctx.connected;
            if new != original {
                self.push_position(wi, new, ctx);
            }
            return;
        }
        self.start_catch_up(wi, current, new, ctx);
    }

    /// Reports that writer `wi` reached `token`.
    fn push_position(&self, wi: usize, token: Token, ctx: &mut Ctx) {
        if let Some(w) = self.writers.get(wi) {
            ctx.events.push_back(FollowerEvent::Position {
                stream: self.name.clone(),
                writer: w.name.clone(),
                token,
            });
        }
    }

    fn start_catch_up(&mut self, wi: usize, from: Token, to: Token, ctx: &mut Ctx) {
        let Some(w) = self.writers.get_mut(wi) else {
            return;
        };
        w.connected = false;
        let id = ctx.next_id();
        ctx.counters.catch_ups_requested += 1;
        let catch_up = CatchUp {
            id,
            cursor: from,
            to,
            epoch: ctx.epoch,
        };
        match &mut w.pending {
            // Started while the writer's held commands are processed: the
            // rest of them wait for this one.
            Some(pending) => pending.catch_up = Some(catch_up),
            None => {
                w.pending = Some(Box::new(Pending {
                    catch_up: Some(catch_up),
                    queue: VecDeque::new(),
                    queued_commands: 0,
                }))
            }
        }
        ctx.events.push_back(FollowerEvent::CatchUp(CatchUpRequest {
            id,
            stream: self.name.clone(),
            writer: w.name.clone(),
            from,
            to,
        }));
    }

    fn enqueue(&mut self, wi: usize, item: Queued, ctx: &mut Ctx) {
        let Some(pending) = self.writers.get_mut(wi).and_then(|w| w.pending.as_mut()) else {
            return;
        };
        let bytes = item.bytes();
        if pending.queued_commands >= ctx.limits.max_queued_commands
            || ctx.buffered_bytes.saturating_add(bytes) > ctx.limits.max_buffered_bytes
        {
            // Replaces the queue (and `item`) by one summary.
            ctx.counters.queue_overflows += 1;
            let mut fold = Fold::default();
            for held in mem::take(&mut pending.queue) {
                ctx.buffered_bytes -= held.bytes();
                fold.absorb(held);
            }
            fold.absorb(item);
            pending.queued_commands = 0;
            pending.queue.push_back(Queued::Fold(fold));
            return;
        }
        ctx.buffered_bytes += bytes;
        pending.queued_commands += 1;
        pending.queue.push_back(item);
    }

    fn process_fold(&mut self, wi: usize, fold: Fold, ctx: &mut Ctx) {
        if self.writers.get(wi).is_some_and(|w| w.position.is_none()) {
            // Its commands before its first POSITION would have been dropped.
            let Some(baseline) = fold.baseline else {
                return;
            };
            self.process_position(wi, baseline, baseline, false, ctx);
        }
        if let Some(last) = fold.last {
            let stale = !fold.last_announced
                && self
                    .writers
                    .get(wi)
                    .and_then(|w| w.position)
                    .is_some_and(|position| last <= position);
            if stale {
                ctx.counters.rdata_stale += 1;
            } else {
                self.process_position(wi, last, last, true, ctx);
            }
        }
        if let Some(w) = self.writers.get_mut(wi) {
            if let Some(open_batch) = fold.open_batch {
                w.batch_cut = open_batch;
            }
            w.unproven |= fold.unproven && w.position.is_some();
        }
    }

    /// Processes writer `wi`'s held commands until none is left or a
    /// catch-up starts.
    fn drain(&mut self, wi: usize, ctx: &mut Ctx) {
        loop {
            let Some(w) = self.writers.get_mut(wi) else {
                return;
            };
            let Some(pending) = w.pending.as_mut() else {
                return;
            };
            if pending.catch_up.is_some() {
                return;
            }
            let Some(item) = pending.queue.pop_front() else {
                w.pending = None;
                return;
            };
            ctx.buffered_bytes -= item.bytes();
            if !matches!(item, Queued::Fold(_)) {
                pending.queued_commands -= 1;
            }
            self.process(wi, item, ctx);
        }
    }

    fn finish_catch_up(&mut self, wi: usize, ctx: &mut Ctx) {
        let Some(w) = self.writers.get_mut(wi) else {
            return;
        };
        let Some(catch_up) = w.pending.as_mut().and_then(|p| p.catch_up.take()) else {
            return;
        };
        ctx.counters.catch_ups_completed += 1;
        w.position = Some(catch_up.to);
        w.connected = ctx.connected && catch_up.epoch == ctx.epoch;
        self.push_position(wi, catch_up.to, ctx);
        self.drain(wi, ctx);
    }

    /// Applies a page of writer `wi`'s catch-up.
    ///
    /// Rows outside what was asked for are skipped, not refused: Synapse
    /// answers `caches` beyond `upto_token` on purpose (its
    /// `get_all_updated_caches`), and rows above the range reach the
    /// follower live, after the command that asked for the range.
    fn apply_page(
        &mut self,
        wi: usize,
        page: CatchUpPage,
        ctx: &mut Ctx,
    ) -> Result<(), CatchUpError> {
        let Some(w) = self.writers.get_mut(wi) else {
            return Ok(());
        };
        let Some(catch_up) = w.catch_up() else {
            return Ok(());
        };
        let (id, from, to) = (catch_up.id, catch_up.cursor, catch_up.to);
        let mut previous: Option<Token> = None;
        for (token, _) in &page.updates {
            if let Some(previous) = previous.filter(|p| token < p) {
                return Err(CatchUpError::RowsOutOfOrder {
                    id,
                    token: *token,
                    previous,
                });
            }
            previous = Some(*token);
        }
        let done = !page.limited || page.upto >= to;
        if !done && page.upto <= from {
            return Err(CatchUpError::NoProgress {
                id,
                upto: page.upto,
                from,
            });
        }
        // Rows above a limited page's `upto` come again with the next page.
        let end = if done { to } else { page.upto };

        ctx.counters.catch_up_pages += 1;
        let writer = w.name.clone();
        let mut updates = page.updates.into_iter().peekable();
        while let Some((token, row)) = updates.next() {
            if token <= from || token > end {
                ctx.counters.catch_up_rows_skipped += 1;
                continue;
            }
            let mut rows = Rows::one(row);
            while let Some((_, row)) = updates.next_if(|(next, _)| *next == token) {
                rows.push(row);
            }
            w.position = Some(token);
            ctx.counters.rows_delivered += rows.len() as u64;
            ctx.events.push_back(FollowerEvent::Rows {
                stream: self.name.clone(),
                writer: writer.clone(),
                token,
                rows,
                source: RowSource::CatchUp,
            });
        }
        if done {
            self.finish_catch_up(wi, ctx);
        } else if let Some(catch_up) = w.pending.as_mut().and_then(|p| p.catch_up.as_mut()) {
            catch_up.cursor = page.upto;
            catch_up.id = ctx.next_id();
            ctx.counters.catch_ups_requested += 1;
            ctx.events.push_back(FollowerEvent::CatchUp(CatchUpRequest {
                id: catch_up.id,
                stream: self.name.clone(),
                writer,
                from: page.upto,
                to,
            }));
        }
        Ok(())
    }
}

impl Follower {
    /// A follower named `own_name` (its echoes are ignored), trusting the
    /// writers `registry` lists, with the default [`FollowerLimits`].
    pub fn new(own_name: InstanceName, registry: Arc<dyn WriterRegistry>) -> Follower {
        Follower::with_limits(own_name, registry, FollowerLimits::default())
    }

    /// A follower with the given limits.
    pub fn with_limits(
        own_name: InstanceName,
        registry: Arc<dyn WriterRegistry>,
        limits: FollowerLimits,
    ) -> Follower {
        Follower {
            own: own_name,
            registry,
            streams: Streams {
                known: StreamName::KNOWN
                    .iter()
                    .cloned()
                    .map(StreamState::new)
                    .collect(),
                others: Vec::new(),
            },
            ctx: Ctx {
                limits,
                events: VecDeque::new(),
                counters: FollowerCounters::default(),
                connected: false,
                epoch: 0,
                next_id: 0,
                pairs: 0,
                buffered_bytes: 0,
            },
        }
    }

    /// A connection is ready: commands handled from now on belong to it.
    ///
    /// Calling it while connected counts as a disconnection first.
    pub fn connected(&mut self) {
        if self.ctx.connected {
            self.disconnected();
        }
        self.ctx.epoch += 1;
        self.ctx.connected = true;
    }

    /// The connection is lost: every writer must announce itself again
    /// before its `RDATA` is applied; open batches and commands held behind
    /// catch-ups are dropped (the `POSITION`s of the next connection bring
    /// them back through catch-ups). Outstanding catch-ups stay valid.
    pub fn disconnected(&mut self) {
        let ctx = &mut self.ctx;
        ctx.connected = false;
        for stream in self.streams.all_mut() {
            for w in &mut stream.writers {
                if let Some(mut pending) = w.pending.take() {
                    for item in pending.queue.drain(..) {
                        ctx.buffered_bytes -= item.bytes();
                        match item {
                            Queued::Fold(fold) => w.unproven |= fold.unproven,
                            Queued::Replicate => w.unproven = true,
                            _ => ctx.counters.dropped_on_disconnect += 1,
                        }
                    }
                    if pending.catch_up.is_some() {
                        pending.queued_commands = 0;
                        w.pending = Some(pending);
                    }
                }
                w.unproven &= w.position.is_some();
                w.clear_batch(ctx);
                w.batch_cut = false;
                w.connected = false;
            }
        }
    }

    /// Whether a connection is up.
    pub fn is_connected(&self) -> bool {
        self.ctx.connected
    }

    /// Handles one received command. Only `RDATA`, `POSITION` and
    /// `REPLICATE` matter.
    pub fn handle_command(&mut self, command: Command) {
        match command {
            Command::Rdata(rdata) => self.handle_rdata(rdata),
            Command::Position(position) => self.handle_position(position),
            Command::Replicate => self.handle_replicate(),
            _ => self.ctx.counters.ignored_commands += 1,
        }
    }

    /// Handles a received `REPLICATE`: some process (re)connected, and it
    /// may be a writer that lost what it published while it was away
    /// (Synapse drops it). `REPLICATE` does not say who sent it, so the
    /// next command of every writer is checked: a numbered `RDATA` above
    /// the writer's position is fetched through a catch-up up to its token
    /// instead of being applied, and a `POSITION` above it is caught up to
    /// even when its `prev` says nothing was missed.
    ///
    /// Over direct TCP no `REPLICATE` reaches a client; over Redis every
    /// process hears every other's (and its own).
    pub fn handle_replicate(&mut self) {
        if !self.ctx.connected {
            self.ctx.counters.while_disconnected += 1;
            return;
        }
        self.ctx.counters.replicates += 1;
        for stream in self.streams.all_mut() {
            for wi in 0..stream.writers.len() {
                stream.handle(wi, Queued::Replicate, &mut self.ctx);
            }
        }
    }

    /// Counts a command of this follower's own that was not decoded (the
    /// session recognised it as an echo): what `handle_command` would have
    /// done with it.
    pub(crate) fn note_own_echo(&mut self) {
        if self.ctx.connected {
            self.ctx.counters.own_echoes += 1;
        } else {
            self.ctx.counters.while_disconnected += 1;
        }
    }

    /// Handles an `RDATA` line whose row could not be read (see
    /// [`LostRdata`]). Its row is never stepped over:
    ///
    /// - stream, writer and token known: as the row itself would be, but
    ///   fetched through a catch-up up to its token (a `batch` row makes
    ///   its batch fetched whole);
    /// - less known: every writer it may have come from (of its stream, if
    ///   known; named, if known) has its next forward move checked, as
    ///   after a `REPLICATE`. Whatever that writer sends next, the follower
    ///   fetches from its own position rather than trust that nothing was
    ///   missed.
    pub fn handle_lost_rdata(&mut self, lost: &LostRdata) {
        if !self.ctx.connected {
            self.ctx.counters.while_disconnected += 1;
            return;
        }
        if lost.instance.as_ref() == Some(&self.own) {
            self.ctx.counters.own_echoes += 1;
            return;
        }
        if let (Some(stream), Some(instance), Some(token)) =
            (&lost.stream, &lost.instance, lost.token)
        {
            let Some((slot, wi)) = self.pair_or_reject(stream, instance, CommandKind::Rdata) else {
                return;
            };
            if let Some(state) = self.streams.get_mut(slot) {
                state.handle(wi, Queued::Lost(token), &mut self.ctx);
            }
            return;
        }
        self.ctx.counters.rdata_unattributed += 1;
        for state in self.streams.all_mut() {
            if lost.stream.as_ref().is_some_and(|s| *s != state.name) {
                continue;
            }
            for wi in 0..state.writers.len() {
                let named = lost.instance.as_ref();
                if named.is_some_and(|n| state.writers.get(wi).is_none_or(|w| w.name != *n)) {
                    continue;
                }
                state.handle(wi, Queued::Replicate, &mut self.ctx);
            }
        }
    }

    /// Handles one received `RDATA`.
    pub fn handle_rdata(&mut self, rdata: Rdata) {
        if !self.ctx.connected {
            self.ctx.counters.while_disconnected += 1;
            return;
        }
        if rdata.instance == self.own {
            self.ctx.counters.own_echoes += 1;
            return;
        }
        let Some((slot, wi)) =
            self.pair_or_reject(&rdata.stream, &rdata.instance, CommandKind::Rdata)
        else {
            return;
        };
        let Some(stream) = self.streams.get_mut(slot) else {
            return;
        };
        if stream.is_pending(wi) {
            stream.enqueue(wi, Queued::Rdata(rdata), &mut self.ctx);
        } else {
            stream.process_rdata(wi, rdata, &mut self.ctx);
        }
    }

    /// Handles one received `POSITION`.
    pub fn handle_position(&mut self, position: Position) {
        if !self.ctx.connected {
            self.ctx.counters.while_disconnected += 1;
            return;
        }
        if position.instance == self.own {
            self.ctx.counters.own_echoes += 1;
            return;
        }
        let Some((slot, wi)) =
            self.pair_or_reject(&position.stream, &position.instance, CommandKind::Position)
        else {
            return;
        };
        let Some(stream) = self.streams.get_mut(slot) else {
            return;
        };
        if stream.discardable(wi, position.new_token) {
            self.ctx.counters.positions_discarded += 1;
        } else if stream.is_pending(wi) {
            stream.enqueue(wi, Queued::Position(position), &mut self.ctx);
        } else {
            stream.process_position(
                wi,
                position.prev_token,
                position.new_token,
                false,
                &mut self.ctx,
            );
        }
    }

    /// The next event, or `None` when there is none. Drain after every input.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<FollowerEvent> {
        self.ctx.events.pop_front()
    }

    /// How many events wait for [`Follower::poll_event`].
    pub(crate) fn queued_events(&self) -> usize {
        self.ctx.events.len()
    }

    /// Applies one page of the answer to catch-up `id`.
    ///
    /// Rows are delivered grouped by token ([`RowSource::CatchUp`]). A
    /// `limited` page yields a [`FollowerEvent::CatchUp`] for the next page
    /// (a new id); the last page moves the writer to the requested `to`
    /// ([`FollowerEvent::Position`]) and processes the writer's held
    /// commands. Rows outside what was asked for are skipped (counted in
    /// [`FollowerCounters::catch_up_rows_skipped`]): rows above the range
    /// arrive live after the command that asked for it, rows at or below
    /// its start were delivered already, and Synapse's `caches` endpoint
    /// answers beyond the range on purpose. A page with rows out of token
    /// order, or a `limited` page that does not advance, is refused whole
    /// and the request stays outstanding.
    pub fn handle_catch_up(
        &mut self,
        id: CatchUpId,
        page: CatchUpPage,
    ) -> Result<(), CatchUpError> {
        let Some((slot, wi)) = self.streams.find_catch_up(id) else {
            return Err(CatchUpError::UnknownId(id));
        };
        let Some(stream) = self.streams.get_mut(slot) else {
            return Err(CatchUpError::UnknownId(id));
        };
        stream.apply_page(wi, page, &mut self.ctx)
    }

    /// Catch-up `id` could not be fetched: it is asked again, with a new id
    /// ([`FollowerEvent::CatchUp`]). The writer's commands keep waiting
    /// (other writers' and other streams' do not); retrying (and backing
    /// off) is the application's choice.
    pub fn catch_up_failed(&mut self, id: CatchUpId) -> Result<(), CatchUpError> {
        let Some((stream, wi)) = self
            .streams
            .find_catch_up(id)
            .and_then(|(slot, wi)| Some((self.streams.get_mut(slot)?, wi)))
        else {
            return Err(CatchUpError::UnknownId(id));
        };
        let ctx = &mut self.ctx;
        let Some(w) = stream.writers.get_mut(wi) else {
            return Err(CatchUpError::UnknownId(id));
        };
        let writer = w.name.clone();
        let Some(catch_up) = w.pending.as_mut().and_then(|p| p.catch_up.as_mut()) else {
            return Err(CatchUpError::UnknownId(id));
        };
        catch_up.id = ctx.next_id();
        ctx.counters.catch_ups_requested += 1;
        ctx.counters.catch_up_retries += 1;
        ctx.events.push_back(FollowerEvent::CatchUp(CatchUpRequest {
            id: catch_up.id,
            stream: stream.name.clone(),
            writer,
            from: catch_up.cursor,
            to: catch_up.to,
        }));
        Ok(())
    }

    /// Sets the position of `writer` on `stream` (one the application
    /// persisted), before following. The writer must still announce itself
    /// with a `POSITION` on the connection; rows missed since `token` are
    /// then caught up.
    pub fn set_position(
        &mut self,
        stream: &StreamName,
        writer: &InstanceName,
        token: Token,
    ) -> Result<(), SeedError> {
        if *writer == self.own {
            return Err(SeedError::OwnName(writer.clone()));
        }
        let (slot, wi) = self
            .pair(stream, writer)
            .map_err(|reason| SeedError::Rejected {
                stream: stream.clone(),
                instance: writer.clone(),
                reason,
            })?;
        let ctx = &mut self.ctx;
        let Some(state) = self.streams.get_mut(slot) else {
            return Ok(());
        };
        if state.writers.get(wi).is_some_and(|w| w.pending.is_some()) {
            return Err(SeedError::CatchUpOutstanding(stream.clone()));
        }
        if let Some(w) = state.writers.get_mut(wi) {
            w.clear_batch(ctx);
            w.batch_cut = false;
            w.unproven = false;
            w.connected = false;
            w.position = Some(token);
        }
        Ok(())
    }

    /// Stops tracking `writer` on `stream` (a worker removed from the
    /// deployment), freeing its slot under
    /// [`FollowerLimits::max_tracked_pairs`]. Returns `false`, changing
    /// nothing, if the pair is unknown or a catch-up of it is
    /// outstanding.
    pub fn forget_writer(&mut self, stream: &StreamName, writer: &InstanceName) -> bool {
        let Some(slot) = self.streams.slot(stream) else {
            return false;
        };
        let ctx = &mut self.ctx;
        let Some(state) = self.streams.get_mut(slot) else {
            return false;
        };
        let Some(wi) = state.writer_index(writer) else {
            return false;
        };
        if state.is_pending(wi) {
            return false;
        }
        let Some(mut removed) = state.remove_writer(wi) else {
            return false;
        };
        removed.clear_batch(ctx);
        ctx.pairs -= 1;
        if let Slot::Other(index) = slot {
            if state.writers.is_empty() {
                self.streams.others.swap_remove(index);
            }
        }
        true
    }

    /// The token up to which `writer`'s rows of `stream` were delivered.
    pub fn position(&self, stream: &StreamName, writer: &InstanceName) -> Option<Token> {
        self.streams.find(stream)?.writer(writer)?.position
    }

    /// The token up to which `stream` is complete: the minimum over its
    /// writers' positions (Synapse's `MultiWriterIdGenerator` persisted
    /// position, as seen by a process that writes nothing to the stream).
    ///
    /// Writers the registry lists whose position is unknown are left out,
    /// as Synapse assumes a writer it never heard of is at the stream's
    /// position. `None` when no writer's position is known.
    pub fn stream_position(&self, stream: &StreamName) -> Option<Token> {
        let state = self.streams.find(stream)?;
        match self.registry.writers(stream) {
            Writers::Only(list) => list
                .iter()
                .filter(|name| **name != self.own)
                .filter_map(|name| state.writer(name)?.position)
                .min(),
            _ => state.writers.iter().filter_map(|w| w.position).min(),
        }
    }

    /// Whether `writer`'s next `RDATA` on `stream` would be applied as it
    /// comes: it announced itself on this connection, no catch-up of it is
    /// outstanding, and no `REPLICATE` came since its last command (see
    /// "A writer that lost its own connection" above).
    pub fn is_writer_connected(&self, stream: &StreamName, writer: &InstanceName) -> bool {
        self.streams
            .find(stream)
            .and_then(|s| s.writer(writer))
            .is_some_and(|w| w.connected && !w.unproven && self.ctx.connected)
    }

    /// The catch-ups waiting for an answer (at most one per stream and
    /// writer).
    pub fn outstanding_catch_ups(&self) -> Vec<CatchUpRequest> {
        self.streams
            .all()
            .flat_map(|s| {
                s.writers.iter().filter_map(|w| {
                    let c = w.catch_up()?;
                    Some(CatchUpRequest {
                        id: c.id,
                        stream: s.name.clone(),
                        writer: w.name.clone(),
                        from: c.cursor,
                        to: c.to,
                    })
                })
            })
            .collect()
    }

    /// Commands of `stream` held behind its writers' catch-ups (folded
    /// summaries not counted).
    pub fn queued_commands(&self, stream: &StreamName) -> usize {
        self.streams
            .find(stream)
            .map_or(0, StreamState::queued_commands)
    }

    /// Every stream with commands held behind a catch-up, and how many:
    /// how far behind the application is, per stream (Synapse's
    /// `synapse_replication_tcp_command_queue`).
    pub fn queued_by_stream(&self) -> impl Iterator<Item = (&StreamName, usize)> {
        self.streams
            .all()
            .map(|s| (&s.name, s.queued_commands()))
            .filter(|(_, queued)| *queued > 0)
    }

    /// Row bytes held in queues and batches.
    pub fn buffered_bytes(&self) -> usize {
        self.ctx.buffered_bytes
    }

    /// (stream, writer) pairs tracked.
    pub fn tracked_pairs(&self) -> usize {
        self.ctx.pairs
    }

    /// What the follower has done so far.
    pub fn counters(&self) -> &FollowerCounters {
        &self.ctx.counters
    }

    /// The limits in force.
    pub fn limits(&self) -> &FollowerLimits {
        &self.ctx.limits
    }

    /// The follower's own instance name.
    pub fn own_name(&self) -> &InstanceName {
        &self.own
    }

    /// Finds the pair, or admits it if the registry agrees.
    fn pair(
        &mut self,
        stream: &StreamName,
        instance: &InstanceName,
    ) -> Result<(Slot, usize), RejectReason> {
        let slot = self.streams.slot(stream);
        if let Some(wi) = slot
            .and_then(|s| self.streams.get(s))
            .and_then(|s| s.writer_index(instance))
        {
            if let Some(slot) = slot {
                return Ok((slot, wi));
            }
        }
        if !self.registry.may_write(stream, instance) {
            return Err(RejectReason::NotAWriter);
        }
        if self.ctx.pairs >= self.ctx.limits.max_tracked_pairs {
            return Err(RejectReason::TooManyWriters);
        }
        let slot = match slot {
            Some(slot) => slot,
            None => {
                // A stored copy, sharing no buffer with the line.
                self.streams
                    .others
                    .push(StreamState::new(StreamName::from(stream.as_str())));
                Slot::Other(self.streams.others.len() - 1)
            }
        };
        let Some(state) = self.streams.get_mut(slot) else {
            return Err(RejectReason::NotAWriter);
        };
        let wi = state.add_writer(WriterState::new(InstanceName::from(instance.as_str())));
        self.ctx.pairs += 1;
        Ok((slot, wi))
    }

    fn pair_or_reject(
        &mut self,
        stream: &StreamName,
        instance: &InstanceName,
        command: CommandKind,
    ) -> Option<(Slot, usize)> {
        match self.pair(stream, instance) {
            Ok(pair) => Some(pair),
            Err(reason) => {
                self.ctx.counters.rejected += 1;
                self.ctx.events.push_back(FollowerEvent::Rejected {
                    stream: stream.clone(),
                    instance: instance.clone(),
                    command,
                    reason,
                });
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_indices_follow_known_order() {
        for (index, stream) in StreamName::KNOWN.iter().enumerate() {
            assert_eq!(known_index(stream), Some(index), "{stream}");
        }
        assert_eq!(known_index(&StreamName::new("x")), None);
    }

    #[test]
    fn many_writers_are_found_through_an_index() {
        let mut stream = StreamState::new(StreamName::Caches);
        let new = |name: String| WriterState::new(InstanceName::from(name));
        for i in 0..20 {
            assert_eq!(stream.add_writer(new(format!("w{i}"))), i);
            assert_eq!(stream.index.is_some(), i >= LINEAR_WRITERS);
        }
        for i in [0, 5, 19, 7] {
            let wi = stream
                .writer_index(&InstanceName::from(format!("w{i}")))
                .unwrap();
            assert!(stream.remove_writer(wi).is_some());
        }
        assert!(stream.remove_writer(100).is_none());
        for i in 0..20 {
            let name = InstanceName::from(format!("w{i}"));
            let found = stream.writer_index(&name);
            if [0, 5, 19, 7].contains(&i) {
                assert_eq!(found, None);
            } else {
                assert_eq!(stream.writers[found.unwrap()].name, name);
            }
        }
    }

    #[test]
    fn writer_state_is_small() {
        // Memory per tracked (stream, writer) pair, before the name's bytes.
        assert!(
            mem::size_of::<WriterState>() <= 96,
            "{}",
            mem::size_of::<WriterState>()
        );
    }
}

#[cfg(test)]
mod rows_tests {
    use super::*;

    fn row(n: u32) -> RawRow {
        RawRow::new(bytes::Bytes::from(format!("[{n}]"))).expect("valid JSON")
    }

    #[test]
    fn rows_hold_one_inline_and_grow_into_a_batch() {
        let mut rows = Rows::one(row(1));
        assert_eq!(rows.len(), 1);
        assert_eq!(rows, vec![row(1)]);
        rows.push(row(2));
        rows.push(row(3));
        assert_eq!(&rows[..], &[row(1), row(2), row(3)][..]);
        assert_eq!(vec![row(1), row(2), row(3)], rows);
        assert_eq!(
            format!("{rows:?}"),
            format!("{:?}", [row(1), row(2), row(3)])
        );
        let borrowed: Vec<&RawRow> = (&rows).into_iter().collect();
        assert_eq!(borrowed.len(), 3);
        assert_eq!(rows.clone().into_vec(), vec![row(1), row(2), row(3)]);
        assert_eq!(rows.into_iter().count(), 3);
        assert_eq!(Vec::from(Rows::from(vec![row(4)])), vec![row(4)]);
    }
}
