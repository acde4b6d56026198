//! The follower's state, per stream and per writer, and the rules that
//! move it: what [`Follower`](super::Follower)'s methods drive.

use std::collections::{HashMap, VecDeque};
use std::mem;

use crate::wire::{InstanceName, Position, RawRow, Rdata, RdataToken, StreamName, Token};

use super::super::catch_up::{CatchUpError, CatchUpId, CatchUpPage, CatchUpRequest};
use super::super::tokens_only_grow;
use super::holes::{self, Batch, Holes};
use super::record::{self, Record};
use super::{FollowerCounters, FollowerEvent, FollowerLimits, RowOrigin, Rows};

/// State shared by every stream.
pub(super) struct Ctx {
    pub(super) limits: FollowerLimits,
    pub(super) events: VecDeque<FollowerEvent>,
    pub(super) counters: FollowerCounters,
    pub(super) connected: bool,
    /// Incremented on every new connection.
    pub(super) epoch: u64,
    /// The interval of time `REPLICATE`s are counted in (see
    /// [`Follower::handle_replicate_in`](super::Follower::handle_replicate_in)).
    pub(super) interval: u64,
    pub(super) next_id: u64,
    /// Pairs tracked, and those of writers the configuration does not
    /// name (which the limit counts).
    pub(super) pairs: usize,
    pub(super) open_pairs: usize,
    /// Counts commands of tracked writers: when each was last heard.
    pub(super) clock: u64,
    pub(super) buffered_bytes: usize,
}

impl Ctx {
    pub(super) fn next_id(&mut self) -> CatchUpId {
        self.next_id += 1;
        CatchUpId(self.next_id)
    }
}

/// [`WriterState::checked_in`] of a writer never checked.
pub(super) const NEVER: u64 = u64::MAX;

/// How many streams this crate knows.
pub(super) const KNOWN_STREAMS: usize = StreamName::KNOWN.len();

pub(super) struct Streams {
    /// One per [`StreamName::KNOWN`], in that order: a fixed number, so
    /// that an index from [`known_index`] needs no bounds check.
    pub(super) known: Box<[StreamState; KNOWN_STREAMS]>,
    /// Streams this crate does not know, created when a writer of one is
    /// admitted, removed when their last writer is forgotten.
    pub(super) others: Vec<StreamState>,
}

#[derive(Clone, Copy)]
pub(super) enum Slot {
    Known(usize),
    Other(usize),
}

impl Streams {
    pub(super) fn slot(&self, stream: &StreamName) -> Option<Slot> {
        match known_index(stream) {
            Some(index) => Some(Slot::Known(index)),
            None => self
                .others
                .iter()
                .position(|s| s.name == *stream)
                .map(Slot::Other),
        }
    }

    /// The stream and index of a tracked pair. Its writer is not marked
    /// heard from: [`StreamState::handle_rdata`] does that with the writer
    /// in hand.
    pub(super) fn find_pair(
        &mut self,
        stream: &StreamName,
        instance: &InstanceName,
    ) -> Option<(&mut StreamState, usize)> {
        let state = match known_index(stream) {
            Some(index) => self.known.get_mut(index)?,
            None => self.others.iter_mut().find(|s| s.name == *stream)?,
        };
        let wi = state.find_writer(instance)?;
        Some((state, wi))
    }

    pub(super) fn get(&self, slot: Slot) -> Option<&StreamState> {
        match slot {
            Slot::Known(i) => self.known.get(i),
            Slot::Other(i) => self.others.get(i),
        }
    }

    pub(super) fn get_mut(&mut self, slot: Slot) -> Option<&mut StreamState> {
        match slot {
            Slot::Known(i) => self.known.get_mut(i),
            Slot::Other(i) => self.others.get_mut(i),
        }
    }

    pub(super) fn find(&self, stream: &StreamName) -> Option<&StreamState> {
        self.slot(stream).and_then(|slot| self.get(slot))
    }

    pub(super) fn all_mut(&mut self) -> impl Iterator<Item = &mut StreamState> {
        self.known.iter_mut().chain(self.others.iter_mut())
    }

    pub(super) fn all(&self) -> impl Iterator<Item = &StreamState> {
        self.known.iter().chain(self.others.iter())
    }

    /// The stream and writer whose proof ([`Probe`]) has this id.
    pub(super) fn find_probe(&self, id: CatchUpId) -> Option<(Slot, usize)> {
        self.find_writer_where(|w| w.probe.as_ref().is_some_and(|p| p.id == id))
    }

    /// The stream and writer whose catch-up has this id.
    pub(super) fn find_catch_up(&self, id: CatchUpId) -> Option<(Slot, usize)> {
        self.find_writer_where(|w| w.catch_up().is_some_and(|c| c.id == id))
    }

    /// The stream and index of the first writer `matches`.
    fn find_writer_where(&self, matches: impl Fn(&WriterState) -> bool) -> Option<(Slot, usize)> {
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
        known.chain(others).find_map(|(slot, s)| {
            let wi = s.writers.iter().position(&matches)?;
            Some((slot, wi))
        })
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

/// A fingerprint of a row, never 0: enough to tell a row from another at
/// the same token, which a forger would have to predict. Its length and
/// four words of it (both ends, and two inside, where the ids are): it
/// runs on every row delivered, so its cost stays a few instructions
/// whatever the row's size.
fn fingerprint(row: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mix = |hash: u64, word: u64| (hash.rotate_left(5) ^ word).wrapping_mul(K);
    let word = |at: usize| {
        let mut word = [0u8; 8];
        if let Some(bytes) = row.get(at..at + 8) {
            word.copy_from_slice(bytes);
        }
        u64::from_le_bytes(word)
    };
    let len = row.len();
    let mut hash = len as u64;
    if len < 16 {
        for &byte in row {
            hash = mix(hash, u64::from(byte));
        }
    } else {
        // `len / 3` is at most `len - 8` here: the `min` changes no word
        // read, but tells the compiler that the word is within the row.
        for at in [0, (len / 3).min(len - 8), 2 * len / 3 - 8, len - 8] {
            hash = mix(hash, word(at));
        }
    }
    hash | 1
}

/// The fingerprints of `rows`, in order, mixed into one.
fn batch_print(rows: &[RawRow]) -> u64 {
    rows.iter().fold(0, |hash, row| {
        (hash.rotate_left(5) ^ fingerprint(row.as_bytes())).wrapping_mul(0x517c_c1b7_2722_0a95)
    })
}

/// The token and fingerprint of the last row at each token of `updates`
/// (in token order): what stands for the rows of a token, as when they
/// are delivered.
fn last_prints(updates: &[(Token, RawRow)]) -> Vec<(Token, u64)> {
    let mut prints: Vec<(Token, u64)> = Vec::new();
    for (token, row) in updates {
        let print = fingerprint(row.as_bytes());
        match prints.last_mut() {
            Some(last) if last.0 == *token => last.1 = print,
            _ => prints.push((*token, print)),
        }
    }
    prints
}

/// Applies writer `w`'s row at `token`, one [`WriterState::in_order`]
/// found in order (at `position`): the event takes the `RDATA`'s fields,
/// moved once.
#[inline(always)]
fn apply_in_order(
    w: &mut WriterState,
    top: &mut Token,
    token: Token,
    position: Token,
    rdata: Rdata,
    ctx: &mut Ctx,
) {
    let Rdata {
        stream,
        instance,
        row,
        ..
    } = rdata;
    let print = fingerprint(row.as_bytes());
    let batch = w.closing_batch(token);
    let rows = w.take_rows(row, ctx);
    w.note_delivered_above(token, position, print, ctx);
    if let Some(batch) = batch {
        w.holes.note_batch(token, batch);
    }
    raise(top, token);
    // Counted apart: side by side, the two counters are added as one
    // vector, which takes more instructions than two additions.
    ctx.counters.rdata_applied += 1;
    let delivered = rows.len() as u64;
    ctx.events.push_back(FollowerEvent::Rows {
        stream,
        writer: instance,
        token,
        rows,
        source: RowOrigin::Live,
    });
    ctx.counters.rows_delivered += delivered;
}

/// Raises `top`, the highest token delivered or seeded on a stream, to
/// `token`.
fn raise(top: &mut Token, token: Token) {
    *top = (*top).max(token);
}

/// How many different rows one token may be delivered with: the
/// writer's and forged ones. Beyond, a row at that token is dropped as
/// stale (so a forger needs this many lines at one token, ahead of the
/// writer's own, to hide its row).
const MAX_CONTESTED: usize = 4;

/// A stream's `top` before any row was delivered or seeded on it.
const NO_TOP: Token = Token(i64::MIN);

/// Up to this many writers per stream, a writer is found by comparing names;
/// beyond, through a hash map.
const LINEAR_WRITERS: usize = 8;

/// What a row at a token already delivered is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Contest {
    /// One of the rows delivered there.
    Duplicate,
    /// Another row: one of the two was forged, and it may be the first.
    /// Delivered too.
    Other,
    /// Another row, but as many were delivered there as are kept: the
    /// writer's own answer says which is its.
    Full,
}

pub(super) struct StreamState {
    pub(super) name: StreamName,
    monotonic: bool,
    pub(super) writers: Vec<WriterState>,
    /// The highest token of a row delivered (or seeded) for any writer:
    /// what a live row's token is measured against (see
    /// [`FollowerLimits::max_token_jump`]). [`NO_TOP`] before any: every
    /// use takes the larger of it and a writer's floor, so the lowest
    /// token stands for none, and raising it takes no branch.
    top: Token,
    /// Positions in `writers` by name, once there are more than
    /// [`LINEAR_WRITERS`] (`caches` over Redis can have many).
    pub(super) index: Option<HashMap<InstanceName, usize>>,
    /// The index in `writers` of the writer last heard from: most streams
    /// have one busy writer, found by one comparison. Only a hint (checked
    /// against the name), so removing writers need not keep it right.
    last: usize,
}

pub(super) struct WriterState {
    /// A copy of the name that shares no buffer with any line.
    pub(super) name: InstanceName,
    /// Where the writer is, as it announced (or a catch-up answered) and
    /// no row contradicted: a claim, which gap checks start from.
    pub(super) position: Option<Token>,
    /// The highest token of a row delivered, or the seeded or first
    /// announced position: the evidence. Rows at or below it are stale
    /// (but for `holes`), and catch-ups fetch from it. Meaningful once
    /// `position` is set; never above it.
    pub(super) floor: Token,
    /// `floor` is the writer's first announced position, not a row or a
    /// seed: a lower `POSITION` of the writer may lower it (nothing was
    /// delivered above it).
    floor_claimed: bool,
    /// Tokens the writer's live rows jumped over: never delivered, so a
    /// row there is taken, not dropped as stale (a forged row far ahead
    /// hides nothing below it), until an answer of the writer's settles
    /// them.
    holes: Holes,
    /// Rows delivered that the writer has not proved yet (see
    /// [`Record`]).
    record: Record,
    /// The proof asked of the writer and not yet answered: its last row
    /// delivered live, as [`Record::due`] gave it.
    probe: Option<Box<Probe>>,
    /// A [`fingerprint`] of the last row delivered at `floor`, 0 when no
    /// row was: another row at that token is not its duplicate.
    floor_print: u64,
    /// Fingerprints of the other rows delivered at `floor` (contested
    /// ones: only ever there when forged lines came), up to
    /// [`MAX_CONTESTED`] (0: a free slot; fingerprints are never 0).
    contested: Option<Box<[u64; MAX_CONTESTED]>>,
    /// A `POSITION` of this writer was processed on the current connection
    /// and no catch-up of it is outstanding.
    pub(super) connected: bool,
    /// Rows of the writer's open batch were lost: its numbered row must be
    /// fetched rather than applied.
    pub(super) batch_cut: bool,
    /// A `REPLICATE` came since this writer's last command: it may be the
    /// writer's own, sent on reconnecting after rows it wrote were lost, so
    /// its next command is checked by a catch-up rather than trusted.
    pub(super) unproven: bool,
    /// The interval ([`Ctx::interval`]) of its last check by a catch-up
    /// after a `REPLICATE` ([`NEVER`] if none): at most one a writer per
    /// interval.
    pub(super) checked_in: u64,
    /// A `REPLICATE` came after its check of this interval: it is made
    /// unproven when the next interval begins.
    pub(super) deferred: bool,
    pub(super) batch: Vec<RawRow>,
    batch_bytes: usize,
    /// The writer's outstanding catch-up and the commands held behind it.
    pub(super) pending: Option<Box<Pending>>,
    /// The configuration names it ([`WriterRegistry::is_configured`](crate::writers::WriterRegistry::is_configured)):
    /// never forgotten to make room.
    pub(super) configured: bool,
    /// `Ctx::clock` when it was last heard from.
    pub(super) heard: u64,
    /// It can be asked to prove its rows: the configuration names it, on
    /// a stream whose tokens only grow (set when added to one).
    askable: bool,
}

impl WriterState {
    pub(super) fn new(name: InstanceName, configured: bool) -> WriterState {
        WriterState {
            configured,
            heard: 0,
            askable: false,
            name,
            position: None,
            floor: Token(0),
            floor_claimed: false,
            holes: Holes::default(),
            record: Record::default(),
            probe: None,
            floor_print: 0,
            contested: None,
            connected: false,
            batch_cut: false,
            unproven: false,
            checked_in: NEVER,
            deferred: false,
            batch: Vec::new(),
            batch_bytes: 0,
            pending: None,
        }
    }

    /// Drops the pending batch; returns how many rows it had.
    pub(super) fn clear_batch(&mut self, ctx: &mut Ctx) -> usize {
        let rows = self.batch.len();
        ctx.buffered_bytes -= self.batch_bytes;
        ctx.counters.batch_rows_discarded += rows as u64;
        self.batch_bytes = 0;
        self.batch = Vec::new();
        rows
    }

    /// Starts the writer afresh at `token` (a seed, a first announcement,
    /// a reset); `claimed`: only announced, no row or seed behind it.
    pub(super) fn restart_at(&mut self, token: Token, claimed: bool) {
        self.position = Some(token);
        self.floor = token;
        self.floor_claimed = claimed;
        self.holes.clear();
        self.record = Record::starting_at(token);
        self.floor_print = 0;
        self.contested = None;
    }

    /// How many rows [`WriterState::record`] keeps before the oldest gives
    /// way: four proofs' worth for a writer that can be asked, else
    /// [`record::UNASKED`].
    fn keep(&self, limits: &FollowerLimits) -> usize {
        if self.askable {
            limits
                .max_unproven_rows
                .saturating_mul(4)
                .max(record::UNASKED)
        } else {
            record::UNASKED
        }
    }

    /// Records a row delivered at `token` in [`WriterState::record`].
    fn record(&mut self, token: Token, print: u64, live: bool, ctx: &mut Ctx) {
        let keep = self.keep(&ctx.limits);
        if self.record.note(token, print, live, keep) && self.askable {
            ctx.counters.unproven_forgotten += 1;
        }
    }

    /// Whether to ask the writer for a proof now: it can be asked, none is
    /// outstanding, and enough rows came since the last.
    fn proof_due(&self, limits: &FollowerLimits) -> bool {
        self.askable && self.probe.is_none() && self.record.due(limits.max_unproven_rows.max(1))
    }

    /// What a row at `token`, already delivered (last row `print`), is
    /// beside the rows delivered there.
    fn contest(&self, token: Token, print: u64) -> Contest {
        let (first, others): (u64, &[u64]) = if token == self.floor && self.floor_print != 0 {
            (
                self.floor_print,
                self.contested.as_deref().map_or(&[0][..], |v| &v[..]),
            )
        } else if let Some(prints) = self.holes.prints_at(token) {
            (0, prints)
        } else {
            return match self.record.knows(token, print) {
                Some(false) => Contest::Other,
                // One of the rows recorded, or a token the writer proved
                // (or whose rows were not kept): stale.
                Some(true) | None => Contest::Duplicate,
            };
        };
        if first == print || others.contains(&print) {
            Contest::Duplicate
        } else if others.contains(&0) {
            Contest::Other
        } else {
            Contest::Full
        }
    }

    /// Whether a row at `token` was delivered already, or lies before
    /// where following started. Only rows make rows stale: a `POSITION`
    /// never does. Below the last row, a token a live row jumped over
    /// (in a range kept, or with no row recorded there) is not.
    pub(super) fn is_stale(&self, token: Token) -> bool {
        token <= self.floor && !self.holes.contains(token) && !self.record.never_delivered(token)
    }

    /// Where a catch-up up to `token`, a row not stale, starts: the last
    /// row delivered (not the position: a `POSITION` only claimed the
    /// range above it, and the rows that would refute a false claim may
    /// be lost with a connection), or, below it, the bottom of the range
    /// it lies in.
    fn gap_start(&self, token: Token) -> Token {
        if token > self.floor {
            self.floor
        } else {
            self.holes
                .around(token)
                .map_or_else(|| self.record.delivered_below(token), |(low, _)| low)
        }
    }

    /// Whether `token` is below a row delivered (not a seed or a first
    /// announcement).
    fn below_last_row(&self, token: Token) -> bool {
        token < self.floor && self.floor_print != 0
    }

    /// Where a catch-up from `from` starts: at the bottom of the lowest
    /// hole below it, whose rows a lost connection or a forged row may
    /// have kept back, so that the writer's answer settles every hole.
    fn catch_up_start(&self, from: Token) -> Token {
        self.holes.lowest_below(from).unwrap_or(from)
    }

    /// Whether a `batch` row of `len` bytes joins the writer's open batch
    /// as it comes: the writer is connected and proven, the batch not
    /// cut, and both limits leave room (else
    /// [`StreamState::process_rdata_checked`] decides).
    fn batch_open_to(&self, len: usize, ctx: &Ctx) -> bool {
        self.position.is_some()
            && self.connected
            && !self.batch_cut
            && !self.unproven
            && self.batch.len() < ctx.limits.max_batch_rows
            && ctx.buffered_bytes.saturating_add(len) <= ctx.limits.max_buffered_bytes
    }

    /// The writer's position, if its row at `token` is the common case
    /// of [`StreamState::process_rdata`]: above everything the writer
    /// announced or delivered, from a writer connected and proven whose
    /// batch is not cut, within [`FollowerLimits::max_token_jump`] of the
    /// stream's `top`.
    fn in_order(&self, token: Token, top: Token, limits: &FollowerLimits) -> Option<Token> {
        let position = self.position?;
        let evidence = top.max(self.floor);
        (self.connected
            && !self.unproven
            && !self.batch_cut
            && token > position
            && token > self.floor
            && token.0 <= evidence.0.saturating_add(limits.max_token_jump))
        .then_some(position)
    }

    /// Adds `row` to the open batch. A batch's first row allocates what
    /// growing an empty `Vec` would (room for four rows), but directly:
    /// the batch is handed over with its numbered row, so every batch
    /// starts empty.
    fn push_batch(&mut self, row: RawRow) {
        if self.batch.capacity() == 0 {
            // Room for four rows at once, as growing it row by row would
            // end with, in one step.
            self.batch.reserve_exact(4);
        }
        self.batch.push(row);
    }

    /// What a live row at `token` closes of the open batch, if it jumps
    /// over tokens (see [`Batch`]).
    fn closing_batch(&self, token: Token) -> Option<Batch> {
        (!self.batch.is_empty() && token.0 > self.floor.0.saturating_add(1)).then(|| Batch {
            rows: self.batch.len(),
            print: batch_print(&self.batch),
        })
    }

    /// The rows of a numbered `row`: the open batch's, then it.
    fn take_rows(&mut self, row: RawRow, ctx: &mut Ctx) -> Rows {
        if self.batch.is_empty() {
            Rows::one(row)
        } else {
            ctx.buffered_bytes -= self.batch_bytes;
            self.batch_bytes = 0;
            let mut rows = mem::take(&mut self.batch);
            rows.push(row);
            Rows::from(rows)
        }
    }

    /// [`WriterState::note_delivered`] for a live row above both the
    /// position and the floor: what it does then, without the branches
    /// that cannot be taken.
    #[inline(always)]
    fn note_delivered_above(&mut self, token: Token, position: Token, print: u64, ctx: &mut Ctx) {
        debug_assert!(self.position == Some(position) && token > position && token > self.floor);
        self.floor_print = print;
        if self.contested.is_some() {
            // Only ever there when forged lines came: no store otherwise.
            self.contested = None;
        }
        // From the last row, not the position: a `POSITION` only claimed
        // the tokens between, and only rows make rows stale.
        self.holes.open(self.floor, token, print);
        self.record(token, print, true, ctx);
        self.floor = token;
        self.floor_claimed = false;
        self.position = Some(token);
    }

    /// Records that rows at `token` were delivered (`live`: from `RDATA`).
    fn note_delivered(&mut self, token: Token, print: u64, live: bool, ctx: &mut Ctx) {
        if token > self.floor {
            self.floor_print = print;
            self.contested = None;
        } else {
            if token == self.floor && print != self.floor_print {
                holes::note(&mut self.contested.get_or_insert_default()[..], print);
            }
            // The floor may be the top of a range too, and stay its top.
            self.holes.note_print(token, print);
        }
        self.record(token, print, live, ctx);
        if !live {
            // A row of the writer's own answer, which started below every
            // hole under it: nothing of the writer's is left there.
            self.holes.settle(token);
        }
        if token > self.floor {
            if live {
                self.holes.open(self.floor, token, print);
            }
            self.floor = token;
        }
        self.floor_claimed = false;
        match self.position {
            Some(position) if token < position && token == self.floor => {
                // The writer had been said to be beyond this row with
                // nothing in between: that claim was false.
                ctx.counters.claims_refuted += 1;
                self.position = Some(token);
            }
            Some(position) if token <= position => {}
            _ => self.position = Some(token),
        }
    }

    pub(super) fn catch_up(&self) -> Option<&CatchUp> {
        self.pending.as_ref()?.catch_up.as_ref()
    }

    pub(super) fn queued_commands(&self) -> usize {
        self.pending.as_ref().map_or(0, |p| p.queued_commands)
    }
}

/// One writer's catch-up, and its commands that wait for it.
pub(super) struct Pending {
    /// `None` only while the queue is being processed after a catch-up.
    pub(super) catch_up: Option<CatchUp>,
    pub(super) queue: VecDeque<Queued>,
    /// Entries of `queue` that are commands (not folds).
    pub(super) queued_commands: usize,
}

pub(super) struct CatchUp {
    pub(super) id: CatchUpId,
    /// Rows above this token are asked for.
    pub(super) cursor: Token,
    pub(super) to: Token,
    /// The connection it started on: only then does completing it connect
    /// the writer.
    pub(super) epoch: u64,
}

/// A proof asked of a writer: its rows at `token`, where a row was
/// delivered live that its answer either holds (proving every row below)
/// or not (it was forged, and stays recorded). Nothing waits for it.
pub(super) struct Probe {
    pub(super) id: CatchUpId,
    token: Token,
}

pub(super) enum Queued {
    Rdata(Rdata),
    /// An `RDATA` of this writer whose row could not be read.
    Lost(RdataToken),
    Position(Position),
    Replicate,
    Fold(Fold),
}

impl Queued {
    pub(super) fn bytes(&self) -> usize {
        match self {
            Queued::Rdata(rdata) => rdata.row.as_bytes().len(),
            Queued::Lost(_) | Queued::Position(_) | Queued::Replicate | Queued::Fold(_) => 0,
        }
    }
}

/// What a writer's folded commands amounted to.
#[derive(Default)]
pub(super) struct Fold {
    /// The new token of its first folded `POSITION`.
    baseline: Option<Token>,
    /// Its last token: the last `POSITION`'s, or a higher `RDATA`'s.
    pub(super) last: Option<Token>,
    /// `last` is a `POSITION`'s (which may announce a reset); an `RDATA`'s
    /// at or below the writer's position is only stale.
    last_announced: bool,
    /// Whether its last folded `RDATA` was a `batch` row (`None`: no
    /// `RDATA` was folded).
    open_batch: Option<bool>,
    /// A `REPLICATE` was folded after its last token.
    pub(super) unproven: bool,
    /// The highest token of its numbered `RDATA` (their rows dropped).
    rows_to: Option<Token>,
}

impl Fold {
    fn absorb_rdata(&mut self, token: RdataToken) {
        match token {
            RdataToken::Batch => self.open_batch = Some(true),
            RdataToken::At(token) => {
                self.rows_to = self.rows_to.max(Some(token));
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
                self.rows_to = self.rows_to.max(earlier.rows_to);
            }
        }
    }
}

impl StreamState {
    pub(super) fn new(name: StreamName) -> StreamState {
        StreamState {
            monotonic: tokens_only_grow(&name),
            name,
            writers: Vec::new(),
            top: NO_TOP,
            index: None,
            last: 0,
        }
    }

    /// Records that writer `wi`'s rows at `token` were delivered.
    fn delivered(&mut self, wi: usize, token: Token, print: u64, live: bool, ctx: &mut Ctx) {
        if let Some(w) = self.writers.get_mut(wi) {
            w.note_delivered(token, print, live, ctx);
        }
        self.raise_top(token);
    }

    /// Raises the highest token delivered or seeded on the stream.
    pub(super) fn raise_top(&mut self, token: Token) {
        raise(&mut self.top, token);
    }

    pub(super) fn writer_index(&self, instance: &InstanceName) -> Option<usize> {
        match &self.index {
            Some(index) => index.get(instance).copied(),
            None => self.writers.iter().position(|w| w.name == *instance),
        }
    }

    /// The index of writer `instance`, if tracked, heard from now (at
    /// `clock`, which moves on).
    pub(super) fn heard_from(&mut self, instance: &InstanceName, clock: &mut u64) -> Option<usize> {
        let wi = self.find_writer(instance)?;
        self.hear(wi, clock);
        Some(wi)
    }

    /// The index of writer `instance`, if tracked: the writer last found
    /// first, by one comparison.
    #[inline(always)]
    fn find_writer(&mut self, instance: &InstanceName) -> Option<usize> {
        match self.writers.get(self.last) {
            Some(w) if w.name == *instance => Some(self.last),
            _ => {
                let wi = self.writer_index(instance)?;
                self.last = wi;
                Some(wi)
            }
        }
    }

    /// Marks writer `wi` heard from at `clock`, which moves on.
    fn hear(&mut self, wi: usize, clock: &mut u64) {
        if let Some(w) = self.writers.get_mut(wi) {
            w.heard = *clock;
            *clock += 1;
        }
    }

    pub(super) fn writer(&self, instance: &InstanceName) -> Option<&WriterState> {
        self.writer_index(instance)
            .and_then(|wi| self.writers.get(wi))
    }

    pub(super) fn add_writer(&mut self, mut writer: WriterState) -> usize {
        writer.askable = writer.configured && self.monotonic;
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

    pub(super) fn remove_writer(&mut self, wi: usize) -> Option<WriterState> {
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
    pub(super) fn queued_commands(&self) -> usize {
        self.writers.iter().map(WriterState::queued_commands).sum()
    }

    /// Whether writer `wi` has a catch-up outstanding or commands held.
    pub(super) fn is_pending(&self, wi: usize) -> bool {
        self.writers.get(wi).is_some_and(|w| w.pending.is_some())
    }

    /// Processes a command of writer `wi` now, or holds it behind the
    /// writer's catch-up.
    pub(super) fn handle(&mut self, wi: usize, item: Queued, ctx: &mut Ctx) {
        if self.is_pending(wi) {
            self.enqueue(wi, item, ctx);
        } else {
            self.process(wi, item, ctx);
        }
    }

    pub(super) fn process(&mut self, wi: usize, item: Queued, ctx: &mut Ctx) {
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

    /// Handles an `RDATA` of writer `wi` (found by
    /// [`Streams::find_pair`]), heard from now: held behind its catch-up,
    /// or processed as [`StreamState::process_rdata`] does.
    pub(super) fn handle_rdata(&mut self, wi: usize, rdata: Rdata, ctx: &mut Ctx) {
        self.rdata_of(wi, rdata, true, ctx);
    }

    /// Processes an `RDATA` of writer `wi`, which has no catch-up
    /// outstanding.
    ///
    /// The common case, a numbered row above everything the writer
    /// announced or delivered, from a writer connected and proven, whose
    /// batch is not cut, within [`FollowerLimits::max_token_jump`], is
    /// applied here; the rest goes through every rule in
    /// [`StreamState::process_rdata_checked`]. Both give the same outcome
    /// for the common case: none of the checks there can fire for it.
    pub(super) fn process_rdata(&mut self, wi: usize, rdata: Rdata, ctx: &mut Ctx) {
        self.rdata_of(wi, rdata, false, ctx);
    }

    /// [`StreamState::handle_rdata`] (`heard`: the writer is heard from
    /// now, and may have commands held) or
    /// [`StreamState::process_rdata`]. The writer is looked up once, and
    /// every step of the common case works on it: a store through it
    /// would make the compiler look it up again.
    #[inline(always)]
    fn rdata_of(&mut self, wi: usize, rdata: Rdata, heard: bool, ctx: &mut Ctx) {
        let Some(w) = self.writers.get_mut(wi) else {
            return;
        };
        if heard {
            w.heard = ctx.clock;
            ctx.clock += 1;
            if w.pending.is_some() {
                self.enqueue(wi, Queued::Rdata(rdata), ctx);
                return;
            }
        }
        match rdata.token {
            RdataToken::At(token) => {
                if let Some(position) = w.in_order(token, self.top, &ctx.limits) {
                    apply_in_order(w, &mut self.top, token, position, rdata, ctx);
                    if w.proof_due(&ctx.limits) {
                        self.ask_for_proof(wi, ctx);
                    }
                    return;
                }
            }
            RdataToken::Batch => {
                let len = rdata.row.as_bytes().len();
                if w.batch_open_to(len, ctx) {
                    ctx.buffered_bytes += len;
                    w.batch_bytes += len;
                    w.push_batch(rdata.row);
                    return;
                }
            }
        }
        self.process_rdata_checked(wi, rdata, ctx);
    }

    /// [`StreamState::process_rdata`] with every rule.
    fn process_rdata_checked(&mut self, wi: usize, rdata: Rdata, ctx: &mut Ctx) {
        let top = self.top;
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
        let print = fingerprint(rdata.row.as_bytes());
        // A row at a token where rows were delivered: a duplicate, or
        // another row there (one of the two was forged, and it may be the
        // first), fetched from the token below it.
        let contest = w.is_stale(token).then(|| w.contest(token, print));
        if contest == Some(Contest::Duplicate) {
            ctx.counters.rdata_stale += 1;
            w.batch_cut = false;
            w.clear_batch(ctx);
            return;
        }
        let from = match contest {
            Some(_) => Token(token.0.saturating_sub(1)),
            None => w.gap_start(token),
        };
        if contest.is_some() {
            ctx.counters.rows_contested += 1;
        }
        if w.unproven {
            // Rows the writer wrote before this one may never have been
            // published: fetch up to it rather than apply it.
            w.unproven = false;
            w.batch_cut = false;
            w.clear_batch(ctx);
            ctx.counters.unproven_checked += 1;
            w.checked_in = ctx.interval;
            self.start_catch_up(wi, from, token, ctx);
            return;
        }
        if w.batch_cut {
            // Rows of its batch were lost: fetched with it.
            w.batch_cut = false;
            w.clear_batch(ctx);
            self.start_catch_up(wi, from, token, ctx);
            return;
        }
        match contest {
            // At the token of the last row: delivered as it comes, so that
            // a forged row sent just ahead of the writer's hides nothing.
            Some(Contest::Other) if token == w.floor => {}
            // Below the last row, or more rows there than are kept: the
            // writer's answer says which row at the token is its.
            Some(_) => {
                w.clear_batch(ctx);
                self.start_catch_up(wi, from, token, ctx);
                return;
            }
            None => {}
        }
        if token < w.floor {
            // Inside the hole (not stale): below the row atop it, which the
            // writer's own rows never come below, so one of the two was
            // forged. None of the hole's rows was delivered: the writer's
            // up to this one are fetched (taking this one as it comes
            // would make those below it stale).
            ctx.counters.claims_refuted += 1;
            w.clear_batch(ctx);
            let from = w.gap_start(token);
            self.start_catch_up(wi, from, token, ctx);
            return;
        }
        if token <= position && token > w.floor {
            // A row inside a range a `POSITION` said was empty: that claim
            // was false (a forged line), and it may have hidden rows lost
            // in transit since. The writer's answer settles the range.
            ctx.counters.claims_refuted += 1;
            w.clear_batch(ctx);
            let from = w.floor;
            self.start_catch_up(wi, from, token, ctx);
            return;
        }
        let evidence = top.max(w.floor);
        if token > position && token.0 > evidence.0.saturating_add(ctx.limits.max_token_jump) {
            // Far beyond every row of the stream: had it been forged, every
            // real row below it would look stale. The writer's own answer
            // says which rows are real.
            ctx.counters.jumps_checked += 1;
            w.clear_batch(ctx);
            let from = w.floor;
            self.start_catch_up(wi, from, token, ctx);
            return;
        }
        let batch = w.closing_batch(token);
        let rows = w.take_rows(rdata.row, ctx);
        ctx.counters.rdata_applied += 1;
        ctx.counters.rows_delivered += rows.len() as u64;
        self.delivered(wi, token, print, true, ctx);
        if let (Some(batch), Some(w)) = (batch, self.writers.get_mut(wi)) {
            w.holes.note_batch(token, batch);
        }
        ctx.events.push_back(FollowerEvent::Rows {
            stream: rdata.stream,
            writer: rdata.instance,
            token,
            rows,
            source: RowOrigin::Live,
        });
        if self
            .writers
            .get(wi)
            .is_some_and(|w| w.proof_due(&ctx.limits))
        {
            self.ask_for_proof(wi, ctx);
        }
    }

    /// Asks writer `wi` for its last row delivered live
    /// ([`FollowerLimits::max_unproven_rows`]): a request of one token,
    /// answered as any catch-up, that nothing waits for.
    fn ask_for_proof(&mut self, wi: usize, ctx: &mut Ctx) {
        let Some(w) = self.writers.get_mut(wi) else {
            return;
        };
        let Some(token) = w.record.last_live() else {
            return;
        };
        w.record.asked();
        let id = ctx.next_id();
        w.probe = Some(Box::new(Probe { id, token }));
        self.request_proof(wi, ctx);
    }

    /// Writer `wi`'s proof could not be fetched: asked again, with a new
    /// id, as a catch-up is.
    pub(super) fn proof_failed(&mut self, wi: usize, ctx: &mut Ctx) {
        let probe = self.writers.get_mut(wi).and_then(|w| w.probe.as_mut());
        if let Some(probe) = probe {
            probe.id = ctx.next_id();
            ctx.counters.catch_up_retries += 1;
            self.request_proof(wi, ctx);
        }
    }

    /// Sends writer `wi`'s proof request.
    fn request_proof(&mut self, wi: usize, ctx: &mut Ctx) {
        let Some(w) = self.writers.get(wi) else {
            return;
        };
        let Some(probe) = w.probe.as_ref() else {
            return;
        };
        ctx.counters.proofs_requested += 1;
        ctx.events.push_back(FollowerEvent::CatchUp(CatchUpRequest {
            id: probe.id,
            stream: self.name.clone(),
            writer: w.name.clone(),
            from: Token(probe.token.0.saturating_sub(1)),
            to: probe.token,
        }));
    }

    /// Applies writer `wi`'s answer to its proof: if it holds the row
    /// delivered live at the token asked, every row up to it is proven.
    /// It delivers nothing: a row it holds that was not delivered comes
    /// live, or through a catch-up, as any other.
    pub(super) fn apply_proof(&mut self, wi: usize, page: CatchUpPage, ctx: &mut Ctx) {
        let Some(w) = self.writers.get_mut(wi) else {
            return;
        };
        let Some(probe) = w.probe.take() else {
            return;
        };
        let held = last_prints(&page.updates)
            .into_iter()
            .find(|(token, _)| *token == probe.token);
        if held.is_some_and(|(token, print)| w.record.prove(token, print)) {
            ctx.counters.proofs_confirmed += 1;
        }
    }

    /// An `RDATA` of writer `wi` whose row is lost: a gap to fetch, never
    /// one to step over.
    fn process_lost(&mut self, wi: usize, token: RdataToken, ctx: &mut Ctx) {
        let Some(w) = self.writers.get_mut(wi) else {
            return;
        };
        ctx.counters.rdata_lost += 1;
        match w.position {
            Some(_) if w.connected => {}
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
            RdataToken::At(token) if !w.is_stale(token) => {
                w.batch_cut = false;
                w.unproven = false;
                w.clear_batch(ctx);
                let from = w.gap_start(token);
                self.start_catch_up(wi, from, token, ctx);
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
    pub(super) fn discardable(&self, wi: usize, new: Token) -> bool {
        self.monotonic
            && self.writers.get(wi).is_some_and(|w| {
                w.connected
                    && w.position.is_some_and(|p| {
                        // One below the position but not below every row
                        // delivered contradicts the position: kept.
                        (new < p
                            && new < w.floor
                            && !w.floor_claimed
                            && w.holes.lowest_below(new).is_none())
                            || (new == p && !w.unproven)
                    })
            })
    }

    /// `POSITION prev new`, or (`forced`) a fold's summary, which always
    /// fetches up to `new` what may be missing.
    pub(super) fn process_position(
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
        let was_connected = w.connected;
        w.connected = false;
        let Some(original) = w.position else {
            // A writer never seen: start from its announced position.
            w.restart_at(new, true);
            w.connected = ctx.connected;
            w.unproven = false;
            ctx.events.push_back(FollowerEvent::Started {
                stream: self.name.clone(),
                writer: w.name.clone(),
                token: new,
            });
            return;
        };
        let mut current = original;
        if current > new {
            if monotonic {
                if new < w.floor && !w.floor_claimed {
                    if let Some(from) = w.holes.lowest_below(new) {
                        // Below a row that jumped ahead (a forged one?),
                        // above tokens never delivered: the writer's rows
                        // there may have been lost in transit. Fetch them.
                        self.start_catch_up(wi, from, new, ctx);
                        return;
                    }
                    // A late POSITION: rows above it were delivered. It
                    // says nothing of what came since, so it does not
                    // announce the writer on a new connection.
                    w.connected = was_connected && ctx.connected;
                    return;
                }
                // The writer is below where it was said to be: what said
                // so was false (a forged line). Back to the rows delivered;
                // what lies between them and `new` is checked as usual.
                ctx.counters.claims_refuted += 1;
                if w.floor_claimed && new < w.floor {
                    // Nothing was delivered since the first announcement.
                    w.restart_at(new, true);
                }
                current = w.floor;
                w.position = Some(current);
            } else {
                ctx.counters.resets += 1;
                current = if new > Token(0) { Token(0) } else { new };
                w.restart_at(current, false);
                self.top = NO_TOP;
                w.batch_cut = false;
                ctx.events.push_back(FollowerEvent::Reset {
                    stream: self.name.clone(),
                    writer: w.name.clone(),
                    previous: original,
                    new,
                });
            }
        }
        // After a REPLICATE, `prev` does not prove that nothing was missed:
        // the writer may have lost what it published before reconnecting.
        let trusted = !forced && !w.unproven;
        // An unproven writer whose position rests on a claim (above its
        // last row), or with ranges its live rows jumped over still open
        // below, is checked now: the claim, or the row atop the range, may
        // have been forged, and the writer's rows there lost in transit
        // or, beside Synapse's writers, never published (they adopt a
        // forged token as their own position).
        let claimed = w.unproven && (current > w.floor || w.holes.lowest_below(new).is_some());
        if w.unproven && (current < new || claimed) {
            ctx.counters.unproven_checked += 1;
            w.checked_in = ctx.interval;
        }
        // Rows lost in transit with this follower's connection may lie in
        // the ranges a live row jumped over, still open: the writer's
        // first announcement on the new connection fetches them.
        let recheck = !was_connected && w.holes.lowest_below(new).is_some();
        // A writer's `prev` is never below a row it published: this
        // announcement or the last row delivered was forged. Neither is
        // taken: the writer's answer says what lies between (rows that
        // would have refuted a false claim may be lost with a connection),
        // down to the bottom of the hole if the row jumped one. With
        // nothing between (the claim was already refuted down to `new`),
        // there is nothing to ask.
        let contradicted = w.below_last_row(prev);
        if contradicted {
            ctx.counters.claims_refuted += 1;
        }
        let fetch = contradicted && w.catch_up_start(current) < new;
        // A claim far beyond every row of the stream is fetched, never
        // taken on the line's word: had it been forged, every later row of
        // the writer would look stale.
        let far = new > current
            && new.0
                > self
                    .top
                    .max(w.floor)
                    .0
                    .saturating_add(ctx.limits.max_token_jump);
        if far {
            ctx.counters.jumps_checked += 1;
        }
        if !fetch
            && !far
            && !recheck
            && ((current == new && !claimed) || (!contradicted && trusted && prev <= current))
        {
            // An unproven writer stays so: an announcement that moves
            // nothing proves nothing (any process may send it ahead of the
            // writer's own), so its next row is checked.
            w.position = Some(new);
            w.connected = ctx.connected;
            if new != original {
                self.push_position(wi, new, ctx);
            }
            return;
        }
        // Checked up to `new`; an announcement that moves nothing still
        // proves nothing of what lies above it (the writer's rows there may
        // have been lost in transit, and a forged one may come ahead of the
        // writer's own), so an unproven writer's next move is checked too.
        w.unproven &= current == new;
        // From the rows, not the position: see `gap_start`.
        let from = w.floor;
        self.start_catch_up(wi, from, new, ctx);
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
        let from = w.catch_up_start(from);
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

    pub(super) fn enqueue(&mut self, wi: usize, item: Queued, ctx: &mut Ctx) {
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
        // On a stream whose tokens only grow, a `POSITION` folded after
        // rows and below them (late, or forged) does not undo them: the
        // rows dropped are fetched.
        let (last, announced) = match (fold.last, fold.rows_to) {
            (Some(last), Some(rows)) if self.monotonic && rows > last => (Some(rows), false),
            _ => (fold.last, fold.last_announced),
        };
        if let Some(last) = last {
            let stale = !announced
                && self
                    .writers
                    .get(wi)
                    .is_some_and(|w| w.position.is_some() && w.is_stale(last));
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
    pub(super) fn drain(&mut self, wi: usize, ctx: &mut Ctx) {
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

    /// Completes writer `wi`'s catch-up, whose writer answered that it is
    /// at `reached` (the catch-up's `to`, or below it).
    fn finish_catch_up(&mut self, wi: usize, reached: Token, ctx: &mut Ctx) {
        let top = self.top;
        let Some(w) = self.writers.get_mut(wi) else {
            return;
        };
        let Some(catch_up) = w.pending.as_mut().and_then(|p| p.catch_up.take()) else {
            return;
        };
        ctx.counters.catch_ups_completed += 1;
        let position = if reached < catch_up.to {
            // The writer has not reached what it was said to be at: that
            // claim was false. Back to its rows.
            ctx.counters.claims_refuted += 1;
            reached.max(w.floor)
        } else if catch_up.to.0 > top.max(w.floor).0.saturating_add(ctx.limits.max_token_jump) {
            // Confirmed, but far beyond every row of the stream: Synapse's
            // writers confirm whatever range they are asked, so the answer
            // proves only its rows. The writer stays where they put it;
            // its next announcement is checked again.
            w.position.map_or(w.floor, |p| p.max(w.floor))
        } else {
            // Only a catch-up inside a hole ends below the position.
            w.position.map_or(catch_up.to, |p| p.max(catch_up.to))
        };
        w.position = Some(position);
        w.connected = ctx.connected && catch_up.epoch == ctx.epoch;
        self.push_position(wi, position, ctx);
        self.drain(wi, ctx);
    }

    /// Applies a page of writer `wi`'s catch-up.
    ///
    /// Rows outside what was asked for are skipped, not refused: Synapse
    /// answers `caches` beyond `upto_token` on purpose (its
    /// `get_all_updated_caches`), and rows above the range reach the
    /// follower live, after the command that asked for the range.
    pub(super) fn apply_page(
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
            if let Some(batch) = w.holes.batch_around(token) {
                if rows.len() > batch.rows && batch_print(&rows[..batch.rows]) == batch.print {
                    // A row forged ahead closed the writer's batch: those
                    // rows were delivered with it.
                    w.holes.forget_batch_around(token);
                    ctx.counters.catch_up_rows_skipped += batch.rows as u64;
                    let mut kept = rows.into_vec();
                    kept.drain(..batch.rows);
                    rows = Rows::from(kept);
                }
            }
            let print = rows.last().map_or(0, |row| fingerprint(row.as_bytes()));
            if w.is_stale(token) && w.contest(token, print) == Contest::Duplicate {
                // Delivered already; still the writer's word that nothing
                // of its own lies in the holes below, and, if it came live,
                // the proof of every row below it.
                w.holes.settle(token);
                if w.record.prove(token, print) {
                    ctx.counters.proofs_confirmed += 1;
                }
                ctx.counters.catch_up_rows_skipped += rows.len() as u64;
                continue;
            }
            w.note_delivered(token, print, false, ctx);
            raise(&mut self.top, token);
            ctx.counters.rows_delivered += rows.len() as u64;
            ctx.events.push_back(FollowerEvent::Rows {
                stream: self.name.clone(),
                writer: writer.clone(),
                token,
                rows,
                source: RowOrigin::CatchUp,
            });
        }
        if done {
            // An answer that stops short of `to` unlimited says the writer
            // is not there (a writer of this crate never confirms more than
            // it reached; Synapse's confirm whatever is asked).
            let reached = if page.limited { to } else { page.upto.min(to) };
            self.finish_catch_up(wi, reached, ctx);
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
        let new = |name: String| WriterState::new(InstanceName::from(name), false);
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

    fn ctx(max_token_jump: i64) -> Ctx {
        Ctx {
            limits: FollowerLimits {
                max_token_jump,
                ..FollowerLimits::default()
            },
            events: VecDeque::new(),
            counters: FollowerCounters::default(),
            connected: true,
            epoch: 1,
            interval: 0,
            next_id: 0,
            pairs: 1,
            open_pairs: 0,
            clock: 0,
            buffered_bytes: 0,
        }
    }

    /// What a writer's state amounts to, to compare two.
    fn summary(stream: &StreamState, ctx: &Ctx) -> String {
        let w = &stream.writers[0];
        format!(
            "{:?} {:?} {} {:?} {:?} {} {} {} {} {} {} {:?} {:?} {:?} {}",
            stream.top,
            w.position,
            w.floor,
            w.floor_claimed,
            w.holes,
            w.floor_print,
            w.connected,
            w.batch_cut,
            w.unproven,
            w.batch.len(),
            w.batch_bytes,
            w.contested,
            w.pending
                .as_ref()
                .map(|p| p.catch_up.as_ref().map(|c| (c.cursor, c.to))),
            ctx.counters,
            ctx.buffered_bytes,
        )
    }

    #[test]
    fn the_in_order_path_does_what_every_rule_does() {
        // `process_rdata` and `handle_rdata` apply the common case
        // themselves: for every state and row, their outcome must be that
        // of `process_rdata_checked`.
        let row = |text: &str| RawRow::new(text.to_owned()).expect("valid JSON");
        let print = fingerprint(row("[1]").as_bytes());
        let tokens = [
            None,
            Some(1),
            Some(2),
            Some(4),
            Some(5),
            Some(6),
            Some(7),
            Some(40),
            Some(2_000_000),
        ];
        let mut fast_taken = 0;
        let mut cases = 0;
        for bits in 0..1 << 7 {
            let flag = |bit: u32| bits & (1 << bit) != 0;
            for (position, floor) in [
                (None, 0),
                (Some(5), 5),
                (Some(5), 3),
                (Some(6), 2),
                (Some(4), 5),
            ] {
                for hole in [None, Some((1, 5)), Some((2, 3))] {
                    for top in [None, Some(5), Some(30)] {
                        for floor_print in [0, print, 7] {
                            for (jump, batch_limit, bytes_limit) in [
                                (1_000_000, 10_000, 64 << 20),
                                (10, 1, 64 << 20),
                                (1_000_000, 10_000, 4),
                            ] {
                                for token in tokens {
                                    let build = || {
                                        let mut stream = StreamState::new(StreamName::Events);
                                        let mut w = WriterState::new(InstanceName::master(), true);
                                        w.position = position.map(Token);
                                        w.floor = Token(floor);
                                        // Holes lie below the last row.
                                        if let Some((low, high)) =
                                            hole.filter(|&(_, high)| high <= floor)
                                        {
                                            w.holes.open(Token(low), Token(high), print);
                                        }
                                        w.floor_print = floor_print;
                                        w.connected = flag(0);
                                        w.unproven = flag(1);
                                        w.batch_cut = flag(2);
                                        w.floor_claimed = flag(3);
                                        if flag(4) {
                                            w.contested = Some(Box::new([print ^ 2, 0, 0, 0]));
                                        }
                                        let mut ctx = ctx(jump);
                                        ctx.limits.max_batch_rows = batch_limit;
                                        ctx.limits.max_buffered_bytes = bytes_limit;
                                        if flag(5) {
                                            w.batch.push(row("[0]"));
                                            w.batch_bytes = 3;
                                            ctx.buffered_bytes = 3;
                                        }
                                        stream.top = top.map_or(NO_TOP, Token);
                                        stream.add_writer(w);
                                        (stream, ctx)
                                    };
                                    let rdata = || Rdata {
                                        stream: StreamName::Events,
                                        instance: InstanceName::master(),
                                        token: token.map_or(RdataToken::Batch, |t| {
                                            RdataToken::At(Token(t))
                                        }),
                                        row: row(if flag(6) { "[1]" } else { "[2]" }),
                                    };
                                    let (mut fast, mut fast_ctx) = build();
                                    fast.process_rdata(0, rdata(), &mut fast_ctx);
                                    let (mut checked, mut checked_ctx) = build();
                                    checked.process_rdata_checked(0, rdata(), &mut checked_ctx);
                                    assert_eq!(
                                        summary(&fast, &fast_ctx),
                                        summary(&checked, &checked_ctx),
                                        "bits {bits:b} position {position:?} floor {floor} hole {hole:?} top {top:?} print {floor_print} jump {jump} batch {batch_limit} bytes {bytes_limit} token {token:?}"
                                    );
                                    assert!(fast_ctx.events.iter().eq(checked_ctx.events.iter()));
                                    // A live `RDATA` takes the same path, the writer
                                    // heard from on the way.
                                    let (mut live, mut live_ctx) = build();
                                    live_ctx.clock = 9;
                                    live.handle_rdata(0, rdata(), &mut live_ctx);
                                    assert_eq!((live.writers[0].heard, live_ctx.clock), (9, 10));
                                    assert_eq!(
                                        summary(&live, &live_ctx),
                                        summary(&fast, &fast_ctx)
                                    );
                                    assert!(live_ctx.events.iter().eq(fast_ctx.events.iter()));
                                    cases += 1;
                                    fast_taken += usize::from(fast_ctx.counters.rdata_applied > 0);
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(
            fast_taken > 1000 && cases > 100_000,
            "{fast_taken} of {cases}"
        );
    }

    #[test]
    fn the_last_writer_hint_never_finds_the_wrong_writer() {
        // `heard_from` tries the writer last heard from first; removing
        // writers (swap_remove) moves others under the hint, or leaves it
        // past the end.
        let name = |i: usize| {
            InstanceName::from(if i.is_multiple_of(2) {
                format!("w{i}")
            } else {
                format!("a_writer_name_too_long_to_be_inline_{i}")
            })
        };
        for count in [1, 3, LINEAR_WRITERS + 4] {
            let mut stream = StreamState::new(StreamName::Caches);
            let mut present: Vec<usize> = (0..count).collect();
            for &i in &present {
                stream.add_writer(WriterState::new(name(i), false));
            }
            let mut clock = 0;
            let check = |stream: &mut StreamState, present: &[usize], clock: &mut u64| {
                for i in 0..count {
                    let before = *clock;
                    let found = stream.heard_from(&name(i), clock);
                    assert_eq!(found, stream.writer_index(&name(i)), "{i} of {count}");
                    assert_eq!(found.is_some(), present.contains(&i), "{i} of {count}");
                    if let Some(wi) = found {
                        assert_eq!(stream.writers[wi].name, name(i));
                        assert_eq!(stream.writers[wi].heard, before);
                        assert_eq!(*clock, before + 1);
                        // Found again through the hint.
                        assert_eq!(stream.heard_from(&name(i), clock), Some(wi));
                    } else {
                        assert_eq!(*clock, before);
                    }
                }
            };
            check(&mut stream, &present, &mut clock);
            while let Some(&i) = present.get(present.len() / 2) {
                // Hear from the writer about to go, and from the last one
                // (which swap_remove moves into its place).
                let wi = stream.heard_from(&name(i), &mut clock).unwrap();
                assert!(stream.remove_writer(wi).is_some());
                present.retain(|&p| p != i);
                check(&mut stream, &present, &mut clock);
            }
            assert!(stream.writers.is_empty());
        }
    }

    #[test]
    fn fingerprints_read_both_ends_and_two_words_inside() {
        // What `fingerprint` computes, written plainly.
        fn plain(row: &[u8]) -> u64 {
            const K: u64 = 0x517c_c1b7_2722_0a95;
            let mix = |hash: u64, word: u64| (hash.rotate_left(5) ^ word).wrapping_mul(K);
            let len = row.len();
            let mut hash = len as u64;
            if len < 16 {
                for &byte in row {
                    hash = mix(hash, u64::from(byte));
                }
            } else {
                for at in [0, len / 3, 2 * len / 3 - 8, len - 8] {
                    let word: [u8; 8] = row[at..at + 8].try_into().expect("eight bytes");
                    hash = mix(hash, u64::from_le_bytes(word));
                }
            }
            hash | 1
        }
        let bytes: Vec<u8> = (0..200u8).map(|b| b.wrapping_mul(37)).collect();
        for len in 0..bytes.len() {
            assert_eq!(fingerprint(&bytes[..len]), plain(&bytes[..len]), "{len}");
        }
    }

    #[test]
    fn writer_state_is_small() {
        // Memory per tracked (stream, writer) pair, before the name's bytes
        // and the rows recorded (none allocated before the first).
        assert!(
            mem::size_of::<WriterState>() <= 208,
            "{}",
            mem::size_of::<WriterState>()
        );
    }
}
