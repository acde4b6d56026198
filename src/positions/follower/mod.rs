//! The follower: per (stream, writer) positions, batches, gaps and catch-up.
//!
//! [`Follower`] is the entry point; `events` holds what it reports,
//! `rows` the rows of one token, and `state` the per-stream, per-writer
//! state and the rules that move it.

mod events;
mod holes;
mod record;
mod room;
mod rows;
mod state;

pub use events::{
    FollowerCounters, FollowerEvent, FollowerLimits, RejectReason, RowOrigin, SeedError,
};
pub use rows::Rows;

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use crate::wire::{
    Command, CommandKind, InstanceName, LostRdata, Position, Rdata, StreamName, Token,
};
use crate::writers::{WriterList, WriterRegistry};

use super::catch_up::{CatchUpError, CatchUpId, CatchUpPage, CatchUpRequest};
use room::Room;
use state::{Ctx, Queued, Slot, StreamState, Streams, WriterState};

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
///    act on each event in order: apply rows, start the catch-ups asked
///    for. Persist [`Follower::resume_points`], not the tokens of
///    [`FollowerEvent::Position`] (see "Forged lines" below).
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
/// - `batch` rows wait for their numbered row; `RDATA` at a token whose
///   rows were already delivered (or at or below where following started)
///   is stale and dropped (with its batch). A `POSITION` never makes a
///   row stale: see "Forged lines" below.
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
/// names no sender), and this follower's own new connection, make every
/// writer unproven until its next move is checked. Its next numbered
/// `RDATA` above its position is fetched by a catch-up up to that token
/// instead of being applied, and its next `POSITION` above its position is
/// caught up to whatever its `prev` says. A `POSITION` at its position
/// proves nothing (any process may send one ahead of the writer's own):
/// the writer stays unproven, and where that position rests on a claim
/// (above the last row delivered) the claim is checked at once, and the
/// writer's next move after it too. Commands held behind a catch-up keep
/// their place relative to the `REPLICATE`. The cost is at most one
/// catch-up per writer that moves after a `REPLICATE` or a reconnection
/// (two where its position rests on a claim); what a writer
/// publishes after its `REPLICATE` reaches every connected subscriber, so
/// one check per writer is enough. Any process
/// may publish `REPLICATE`, in a loop too: with
/// [`Follower::handle_replicate_in`] (what the Redis session calls) a
/// writer is checked by a catch-up at most once an interval, those that
/// come after its check waiting for the next.
///
/// # Forged lines
///
/// Redis authenticates no publisher: any process that may publish on the
/// deployment's Redis can speak in any writer's name. One forged
/// `POSITION events persister1 <cur> 9223372036854775807` makes Synapse's
/// followers (and Synapse's writers, which then announce it as their own)
/// drop every later row of that writer as stale. This follower keeps two
/// things per writer: its *position*, what the writer announced (a claim,
/// which gap checks start from, as Synapse's), and its *resume point*,
/// the highest token of a row it delivered (evidence). The rules:
///
/// - Only rows make rows stale. A row above the resume point is never
///   dropped, whatever a `POSITION` claimed; one inside a range a
///   `POSITION` claimed empty proves that claim false, and the range is
///   fetched from the writer by a catch-up (counted in
///   [`FollowerCounters::claims_refuted`]). A `POSITION` below the
///   position, on a stream whose tokens only grow, proves the higher claim
///   false too: the follower goes back to its rows and checks the gap.
///   A `POSITION` whose `prev` is below the last row delivered (a writer
///   never announces a `prev` below a row it published) is not taken
///   either: that row or the announcement was forged, and what it claims
///   is fetched (the rows that would refute it may be lost with a
///   connection).
/// - Catch-ups start at the last row delivered, not at the position: what
///   a `POSITION` claimed (or a writer's answer confirmed) above it is
///   asked again, so a false claim whose refuting rows were lost with a
///   connection hides nothing. A writer's answer holds only its own rows,
///   so this costs no rows, only a wider range in its query.
/// - A catch-up answer that stops short of what was asked (`upto` below
///   `to`, not limited) says the writer is not there: the follower takes
///   that, not the request. [`History`](super::History), the crate's own
///   catch-up source, never confirms a token it has not reached. Synapse's
///   writers confirm whatever is asked, so a `POSITION` more than
///   [`FollowerLimits::max_token_jump`] above every row delivered on its
///   stream is always fetched, and the writer's position after the answer
///   is what its rows show, not the claim: its next announcement is
///   checked again. This matters beside Synapse: after one forged
///   `POSITION events persister1 0 9223372036854775807`, Synapse's
///   persisters adopt the claim and publish no row below it; their rows
///   reach this follower through their next announcements (any
///   `REPLICATE`) and catch-ups. The same happens after forged *rows*
///   just ahead of a stream: Synapse's other writers adopt their token
///   and publish none of their rows below it. Those rows reach this
///   follower through the checks after the next `REPLICATE` (a writer's
///   announcement with ranges its live rows jumped over still open below
///   is checked at once), after that writer's later rows.
/// - A live row more than [`FollowerLimits::max_token_jump`] above every
///   row delivered on its stream is not applied as it comes: the writer's
///   rows up to it are fetched instead, so a row forged far ahead never
///   lands. A forged row within that distance lands (rows are not
///   signed), but hides nothing: the tokens each live row jumped over stay
///   open until a row of the writer's own answer settles them, so the
///   writer's rows below a forged one are still delivered when they come
///   (fetched up to each: a live row below the last one says one of the
///   two was forged), and a catch-up after a lost connection fetches
///   them. The last 32 such ranges are kept per writer (in multi-writer
///   streams a writer's tokens jump over the others' at every row, so no
///   catch-up is spent on them). Only rows settle a range: an answer's
///   `upto` does not, as Synapse's writers confirm whatever range they
///   are asked.
/// - A row of the writer's at the very token of a forged one (other rows
///   at that token) is delivered too ([`FollowerCounters::rows_contested`]):
///   as it comes at the last row's token; below it, through a catch-up
///   (the writer's answer says which row there is its). The follower
///   knows the rows delivered at the top of each range kept, and records
///   every row a writer delivered until the writer proves it: forged
///   rows at the writer's next tokens one after the other jump over
///   nothing, and only that record tells the writer's own rows there from
///   duplicates. Every [`FollowerLimits::max_unproven_rows`] rows
///   delivered live, the writer is asked for the last one (a
///   [`CatchUpRequest`] of one token that nothing waits for); its answer
///   holding that row proves every row below, which is then forgotten.
///   A `POSITION` below
///   the last row, or a writer's first on a new connection, with a range
///   still open below it fetches that range: the writer's rows there may
///   have been lost in transit.
/// - What to persist is [`Follower::resume_points`]: never beyond a row
///   delivered, whatever was announced. Resuming from it costs at most a
///   catch-up.
///
/// What a forger can still do: add rows (nothing on the wire is signed);
/// delay rows and make the follower fetch (each refuted claim, each
/// writer's row below a forged one, costs a catch-up); close a writer's
/// open batch with a forged numbered row (the batch's rows are then
/// delivered under the forged token, once: when a catch-up fetches them
/// again with their own numbered row, they are recognised and skipped);
/// send more than 32 rows ahead of the writer, each jumping above the one
/// before, so that the range the first jumped over is no longer kept: the
/// writer's rows there that are lost in transit (a disconnection) are then
/// not fetched by the next announcement (one that arrives live is: the
/// record of rows delivered says none was there); send rows at the writer's
/// next tokens *one after the other*, ahead of the writer's own, faster
/// than the writer proves its rows: beyond four times
/// [`FollowerLimits::max_unproven_rows`] rows not yet proven (16 for a
/// writer the configuration does not name, which is never asked), the
/// oldest are forgotten ([`FollowerCounters::unproven_forgotten`]), and a
/// row of the writer's at such a token is taken as a duplicate. Announcing
/// a writer before the writer does, after this follower (re)connects or
/// after a `REPLICATE`, makes the writer's next move checked whatever was
/// announced (see "A writer that lost its own connection"). On streams
/// whose tokens restart (`typing`, ...), a forged `POSITION` below the
/// position is taken as a restart, as Synapse takes it. The model test's
/// adversary forges every other kind of line, at any token (runs of rows
/// ahead that jump over the writer's, and rows at the very tokens the
/// writer writes next, included), and checks that every row a writer wrote
/// is delivered once, in order.
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
    /// The writers the configuration does not name, and where those
    /// forgotten to make room stood.
    room: Room,
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
                known: Box::new(std::array::from_fn(|i| {
                    StreamState::new(StreamName::KNOWN[i].clone())
                })),
                others: Vec::new(),
            },
            ctx: Ctx {
                limits,
                events: VecDeque::new(),
                counters: FollowerCounters::default(),
                connected: false,
                epoch: 0,
                interval: 0,
                next_id: 0,
                pairs: 0,
                open_pairs: 0,
                clock: 0,
                buffered_bytes: 0,
            },
            room: Room::default(),
        }
    }

    /// A connection to a shared bus (Redis) is ready: commands handled
    /// from now on belong to it. What a writer published while this
    /// follower was away is lost, and any process may speak in its name
    /// before it answers, so every writer's next move is checked by a
    /// catch-up, as after a `REPLICATE`.
    ///
    /// Calling it while connected counts as a disconnection first.
    pub fn connected(&mut self) {
        self.connect();
        for stream in self.streams.all_mut() {
            for w in &mut stream.writers {
                w.unproven = w.position.is_some();
            }
        }
    }

    /// A connection straight to the writer is ready (Synapse's direct TCP
    /// replication): only the writer speaks on it, so its announcements
    /// are taken as they come, with no check as on a shared bus
    /// ([`Follower::connected`]).
    ///
    /// Calling it while connected counts as a disconnection first.
    pub fn connected_direct(&mut self) {
        self.connect();
    }

    fn connect(&mut self) {
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
                // The next connection's own REPLICATE and announcements
                // check every writer anew.
                w.deferred = false;
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

    /// [`Follower::handle_replicate`], with at most one check by a
    /// catch-up per writer in each interval of time: any process may
    /// publish `REPLICATE`, and one that does so in a loop would make
    /// every move of every writer a catch-up. `interval` numbers the
    /// interval `now` falls in (the caller chooses its length; the Redis
    /// session's is [`RedisSession::REPLICATE_CHECK_INTERVAL`](crate::session::RedisSession::REPLICATE_CHECK_INTERVAL)),
    /// never decreasing. A writer already checked by a catch-up in this
    /// interval is checked again only once the next begins: call
    /// [`Follower::begin_interval`] then, while
    /// [`Follower::has_deferred_checks`] says some wait. Its answer to this
    /// `REPLICATE` may then already have come, so its next move is fetched:
    /// one catch-up per writer per interval.
    pub fn handle_replicate_in(&mut self, interval: u64) {
        self.ctx.interval = self.ctx.interval.max(interval);
        if !self.ctx.connected {
            self.ctx.counters.while_disconnected += 1;
            return;
        }
        self.ctx.counters.replicates += 1;
        let now = self.ctx.interval;
        for stream in self.streams.all_mut() {
            for wi in 0..stream.writers.len() {
                let checked = stream
                    .writers
                    .get_mut(wi)
                    .filter(|w| w.checked_in == now)
                    .map(|w| w.deferred = true)
                    .is_some();
                if !checked {
                    stream.handle(wi, Queued::Replicate, &mut self.ctx);
                }
            }
        }
    }

    /// Whether a writer's check waits for the next interval (see
    /// [`Follower::handle_replicate_in`]).
    pub fn has_deferred_checks(&self) -> bool {
        self.streams
            .all()
            .any(|stream| stream.writers.iter().any(|w| w.deferred))
    }

    /// Interval `interval` has begun: the checks deferred to it are made
    /// (each writer's next move is checked, as after a `REPLICATE`).
    pub fn begin_interval(&mut self, interval: u64) {
        if interval <= self.ctx.interval {
            return;
        }
        self.ctx.interval = interval;
        if !self.ctx.connected {
            return;
        }
        for stream in self.streams.all_mut() {
            for wi in 0..stream.writers.len() {
                let deferred = stream
                    .writers
                    .get_mut(wi)
                    .filter(|w| w.deferred)
                    .map(|w| w.deferred = false)
                    .is_some();
                if deferred {
                    stream.handle(wi, Queued::Replicate, &mut self.ctx);
                }
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
        // A tracked writer is never this follower: every way in refuses
        // its own name before admitting a pair. So a tracked pair needs no
        // echo check, and the common case compares one name, not two.
        let Some((stream, wi)) = self.streams.find_pair(&rdata.stream, &rdata.instance) else {
            self.handle_untracked_rdata(rdata);
            return;
        };
        stream.handle_rdata(wi, rdata, &mut self.ctx);
    }

    /// [`Follower::handle_rdata`] for a pair not tracked (yet): an echo of
    /// this follower's own, a writer to admit, or one to reject.
    #[cold]
    fn handle_untracked_rdata(&mut self, rdata: Rdata) {
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

    /// The event [`Follower::poll_event`] would return next.
    pub(crate) fn peek_event(&self) -> Option<&FollowerEvent> {
        self.ctx.events.front()
    }

    /// How many events wait for [`Follower::poll_event`].
    pub(crate) fn queued_events(&self) -> usize {
        self.ctx.events.len()
    }

    /// The events waiting for [`Follower::poll_event`], in order.
    pub(crate) fn queued(&self) -> impl Iterator<Item = &FollowerEvent> {
        self.ctx.events.iter()
    }

    /// Applies one page of the answer to catch-up `id`.
    ///
    /// Rows are delivered grouped by token ([`RowOrigin::CatchUp`]). A
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
        if let Some((slot, wi)) = self.streams.find_probe(id) {
            if let Some(stream) = self.streams.get_mut(slot) {
                stream.apply_proof(wi, page, &mut self.ctx);
            }
            return Ok(());
        }
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
        if let Some((slot, wi)) = self.streams.find_probe(id) {
            if let Some(stream) = self.streams.get_mut(slot) {
                stream.proof_failed(wi, &mut self.ctx);
            }
            return Ok(());
        }
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
            w.restart_at(token, false);
        }
        state.raise_top(token);
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
        if !removed.configured {
            ctx.open_pairs -= 1;
        }
        if let Slot::Other(index) = slot {
            if state.writers.is_empty() {
                self.streams.others.swap_remove(index);
            }
        }
        true
    }

    /// Forgets a writer the configuration does not name to make room: the
    /// first in line not heard from since it was queued (one heard from
    /// goes to the back, a second chance, as does one with a catch-up
    /// outstanding). Its resume point is remembered, so that heard of
    /// again it is caught up from there. Whether one was forgotten: not
    /// when every one has a catch-up outstanding.
    ///
    /// Each pair sent to the back in the first pass was heard from since
    /// it was queued, and the second pass forgets the first it meets
    /// without a catch-up: over any run of commands, the pairs looked at
    /// number at most the admissions and commands handled, so admitting
    /// costs O(1) amortised.
    fn make_room(&mut self) -> bool {
        let passes = 2 * self.room.queued() + 1;
        for _ in 0..passes {
            let Some((queued, stream, writer)) = self.room.next() else {
                return false;
            };
            let Some(w) = self.streams.find(&stream).and_then(|s| s.writer(&writer)) else {
                // Forgotten already.
                continue;
            };
            if w.heard > queued || w.pending.is_some() {
                let clock = self.ctx.clock;
                self.ctx.clock += 1;
                self.room.queue(clock, stream, writer);
                continue;
            }
            let token = w.position.map(|_| w.floor);
            if !self.forget_writer(&stream, &writer) {
                continue;
            }
            self.ctx.counters.writers_forgotten += 1;
            if let Some(token) = token {
                self.room.remember(stream.clone(), writer.clone(), token);
                self.ctx.events.push_back(FollowerEvent::Forgotten {
                    stream,
                    writer,
                    token,
                });
            }
            return true;
        }
        false
    }

    /// Where `writer` is on `stream`: the token up to which its rows were
    /// delivered or, beyond the last of them, what it announced and no row
    /// contradicted. An announcement is only a claim (see "Forged lines"
    /// above): to persist, take [`Follower::resume_point`].
    pub fn position(&self, stream: &StreamName, writer: &InstanceName) -> Option<Token> {
        self.streams.find(stream)?.writer(writer)?.position
    }

    /// The token to persist for `writer` on `stream` and to resume from
    /// with [`Follower::set_position`] after a restart: the highest token
    /// of a row delivered (or where following started). Never beyond a
    /// row this follower delivered, whatever a forged `POSITION` said;
    /// resuming from it costs at most one catch-up of rows already known
    /// to be missing from it.
    pub fn resume_point(&self, stream: &StreamName, writer: &InstanceName) -> Option<Token> {
        let w = self.streams.find(stream)?.writer(writer)?;
        w.position.map(|_| w.floor)
    }

    /// Every (stream, writer) with a known position, and its
    /// [`Follower::resume_point`]: what to persist.
    pub fn resume_points(&self) -> impl Iterator<Item = (&StreamName, &InstanceName, Token)> {
        self.streams.all().flat_map(|s| {
            s.writers
                .iter()
                .filter(|w| w.position.is_some())
                .map(move |w| (&s.name, &w.name, w.floor))
        })
    }

    /// The token up to which `stream` is complete: the minimum over its
    /// writers' positions (Synapse's `MultiWriterIdGenerator` persisted
    /// position, as seen by a process that writes nothing to the stream).
    ///
    /// WriterList the registry lists whose position is unknown are left out,
    /// as Synapse assumes a writer it never heard of is at the stream's
    /// position. `None` when no writer's position is known.
    pub fn stream_position(&self, stream: &StreamName) -> Option<Token> {
        let state = self.streams.find(stream)?;
        match self.registry.writers(stream) {
            WriterList::Only(list) => list
                .iter()
                .filter(|name| **name != self.own)
                .filter_map(|name| state.writer(name)?.position)
                .min(),
            _ => state.writers.iter().filter_map(|w| w.position).min(),
        }
    }

    /// Whether `writer` announced itself on `stream` on this connection
    /// and no catch-up of it is outstanding: its rows are taken as they
    /// come (after a `REPLICATE` or a reconnection, its next move is
    /// checked by a catch-up first: see "A writer that lost its own
    /// connection" above).
    pub fn is_writer_connected(&self, stream: &StreamName, writer: &InstanceName) -> bool {
        self.streams
            .find(stream)
            .and_then(|s| s.writer(writer))
            .is_some_and(|w| w.connected && self.ctx.connected)
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

    /// (stream, writer) pairs tracked, configured writers included (only
    /// the others count against [`FollowerLimits::max_tracked_pairs`]).
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
        if let Some(pair) = self.tracked(stream, instance) {
            return Ok(pair);
        }
        self.admit(stream, instance)
    }

    /// The pair, if tracked, its writer heard from now. Never this
    /// follower's own name: no pair of it is ever admitted.
    fn tracked(&mut self, stream: &StreamName, instance: &InstanceName) -> Option<(Slot, usize)> {
        let slot = self.streams.slot(stream)?;
        let wi = self
            .streams
            .get_mut(slot)?
            .heard_from(instance, &mut self.ctx.clock)?;
        Some((slot, wi))
    }

    /// [`Follower::pair`] for a pair not tracked yet: admitted if the
    /// registry agrees (and there is room).
    #[cold]
    fn admit(
        &mut self,
        stream: &StreamName,
        instance: &InstanceName,
    ) -> Result<(Slot, usize), RejectReason> {
        // Callers refuse the follower's own name first: `tracked` relies on it.
        debug_assert!(*instance != self.own, "admitting the follower's own name");
        if !self.registry.may_write(stream, instance) {
            return Err(RejectReason::NotAWriter);
        }
        let configured = self.registry.is_configured(stream, instance);
        if !configured
            && self.ctx.open_pairs >= self.ctx.limits.max_tracked_pairs
            && !self.make_room()
        {
            return Err(RejectReason::TooManyWriters);
        }
        // Forgetting may have removed a stream of `others`: look again.
        let slot = self.streams.slot(stream);
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
        let mut writer = WriterState::new(InstanceName::from(instance.as_str()), configured);
        writer.heard = self.ctx.clock;
        self.ctx.clock += 1;
        let recalled = (!configured)
            .then(|| self.room.recall(stream, instance))
            .flatten();
        if let Some(token) = recalled {
            // Forgotten to make room: it goes on from its resume point,
            // and its next move is fetched from there (what it wrote
            // meanwhile was not delivered).
            writer.restart_at(token, false);
            writer.connected = self.ctx.connected;
            writer.unproven = true;
            state.raise_top(token);
        }
        let heard = writer.heard;
        let name = writer.name.clone();
        let wi = state.add_writer(writer);
        self.ctx.pairs += 1;
        if !configured {
            self.ctx.open_pairs += 1;
            self.room
                .queue(heard, StreamName::from(stream.as_str()), name);
            if self.room.queued() > 2 * self.ctx.open_pairs + 64 {
                // Entries of pairs forgotten through `forget_writer`.
                let streams = &self.streams;
                self.room.compact(|stream, writer| {
                    streams
                        .find(stream)
                        .is_some_and(|s| s.writer(writer).is_some())
                });
            }
        }
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
    use crate::config::StreamWriters;
    use crate::wire::{RawRow, RdataToken};

    fn rdata_on(stream: &str, writer: &str, token: i64) -> Rdata {
        Rdata {
            stream: StreamName::from(stream),
            instance: InstanceName::from(writer),
            token: RdataToken::At(Token(token)),
            row: RawRow::new(&b"[1]"[..]).expect("valid JSON"),
        }
    }

    fn position_on(stream: &str, writer: &str, token: i64) -> Position {
        Position {
            stream: StreamName::from(stream),
            instance: InstanceName::from(writer),
            prev_token: Token(token),
            new_token: Token(token),
        }
    }

    /// Lets anyone write anything.
    struct Anyone;

    impl WriterRegistry for Anyone {
        fn may_write(&self, _: &StreamName, _: &InstanceName) -> bool {
            true
        }

        fn writers(&self, _: &StreamName) -> WriterList<'_> {
            WriterList::Any
        }

        fn streams_written_by(&self, _: &InstanceName) -> Vec<StreamName> {
            Vec::new()
        }
    }

    #[test]
    fn writers_are_found_after_streams_and_writers_move() {
        // Writers of streams this crate does not know live in `others`,
        // which forgetting the last writer of one reorders
        // (`swap_remove`); a stream's writers are reordered the same way.
        let mut follower = Follower::new(InstanceName::from("worker1"), Arc::new(Anyone));
        follower.connected();
        for stream in ["s_a", "s_b", "s_c"] {
            for writer in ["w1", "w2", "a_writer_name_too_long_to_be_inline"] {
                follower.handle_position(position_on(stream, writer, 1));
            }
        }
        assert_eq!(follower.tracked_pairs(), 9);
        for writer in ["w1", "w2", "a_writer_name_too_long_to_be_inline"] {
            assert!(follower.forget_writer(&StreamName::from("s_a"), &InstanceName::from(writer)));
        }
        assert!(follower.forget_writer(&StreamName::from("s_b"), &InstanceName::from("w1")));
        events(&mut follower);
        let mut token = 1;
        for stream in ["s_c", "s_b"] {
            for writer in ["a_writer_name_too_long_to_be_inline", "w2", "w1"] {
                token += 1;
                follower.handle_rdata(rdata_on(stream, writer, token));
                let applied = events(&mut follower);
                if stream == "s_b" && writer == "w1" {
                    // Forgotten: admitted again, not announced.
                    assert!(applied.is_empty());
                    continue;
                }
                assert!(
                    matches!(&applied[..], [FollowerEvent::Rows { stream: s, writer: w, .. }]
                        if s.as_str() == stream && w.as_str() == writer),
                    "{stream} {writer}: {applied:?}"
                );
                assert_eq!(
                    follower.position(&StreamName::from(stream), &InstanceName::from(writer)),
                    Some(Token(token))
                );
            }
        }
        assert_eq!(follower.counters().rdata_applied, 5);
        assert_eq!(follower.counters().rdata_unconnected, 1);
        assert_eq!(follower.counters().rejected, 0);
    }

    fn rdata(writer: &str, token: Option<i64>) -> Rdata {
        Rdata {
            stream: StreamName::Events,
            instance: InstanceName::from(writer),
            token: token.map_or(RdataToken::Batch, |t| RdataToken::At(Token(t))),
            row: RawRow::new(&b"[1]"[..]).expect("valid JSON"),
        }
    }

    fn position(writer: &str, prev: i64, new: i64) -> Position {
        Position {
            stream: StreamName::Events,
            instance: InstanceName::from(writer),
            prev_token: Token(prev),
            new_token: Token(new),
        }
    }

    fn events(follower: &mut Follower) -> Vec<FollowerEvent> {
        std::iter::from_fn(|| follower.poll_event()).collect()
    }

    #[test]
    fn replicate_checks_a_writer_by_a_catch_up_at_most_once_an_interval() {
        // A REPLICATE before each of w1's rows: the first makes its next
        // row fetched; the others, within the same interval, only once
        // the next interval begins.
        let mut follower = Follower::new(InstanceName::from("me"), Arc::new(Anyone));
        follower.connected();
        follower.handle_position(position_on("events", "w1", 0));
        let mut catch_ups = 0;
        let mut rows = 0;
        let mut step = |follower: &mut Follower, interval: u64, token: i64| {
            follower.handle_replicate_in(interval);
            follower.handle_rdata(rdata_on("events", "w1", token));
            for event in events(follower) {
                match event {
                    FollowerEvent::CatchUp(request) => {
                        catch_ups += 1;
                        let page = CatchUpPage {
                            updates: vec![(Token(token), RawRow::new(&b"[1]"[..]).expect("JSON"))],
                            upto: Token(token),
                            limited: false,
                        };
                        follower.handle_catch_up(request.id, page).expect("a page");
                        rows += events(follower)
                            .iter()
                            .filter(|e| matches!(e, FollowerEvent::Rows { .. }))
                            .count();
                    }
                    FollowerEvent::Rows { .. } => rows += 1,
                    _ => {}
                }
            }
        };
        for token in 1..=10 {
            step(&mut follower, 0, token);
        }
        assert_eq!((catch_ups, rows), (1, 10));
        assert!(follower.has_deferred_checks());
        follower.begin_interval(1);
        assert!(!follower.has_deferred_checks());
        follower.handle_rdata(rdata_on("events", "w1", 11));
        assert!(
            events(&mut follower)
                .iter()
                .any(|e| matches!(e, FollowerEvent::CatchUp(_))),
            "checked once the next interval began"
        );
    }

    #[test]
    fn tokens_that_jump_at_every_row_cost_no_catch_up() {
        // In multi-writer streams a writer's tokens jump over the others'
        // at every row, with its POSITIONs between: however many jumps,
        // none asks for a catch-up (a `caches` writer outside
        // `instance_map` cannot be asked), and every row is delivered.
        let mut follower = Follower::new(InstanceName::from("me"), Arc::new(Anyone));
        follower.connected();
        follower.handle_position(position_on("events", "w1", 0));
        for i in 1..=1000 {
            follower.handle_rdata(rdata_on("events", "w1", 3 * i));
            if i % 20 == 0 {
                // Its token moved on without rows: `POSITION last new`.
                follower.handle_position(Position {
                    prev_token: Token(3 * i),
                    ..position_on("events", "w1", 3 * i + 1)
                });
            }
        }
        let events = events(&mut follower);
        let rows = events
            .iter()
            .filter(|event| matches!(event, FollowerEvent::Rows { .. }))
            .count();
        assert_eq!(rows, 1000);
        assert!(
            !events
                .iter()
                .any(|event| matches!(event, FollowerEvent::CatchUp(_))),
            "{:?}",
            follower.counters()
        );
    }

    #[test]
    fn own_rows_are_echoes_whether_or_not_others_are_tracked() {
        // `handle_rdata` looks the pair up before the echo check: the
        // follower's own name must never be tracked.
        let mut follower =
            Follower::new(InstanceName::master(), Arc::new(StreamWriters::default()));
        follower.connected();
        follower.handle_rdata(rdata("master", Some(1)));
        assert_eq!(follower.counters().own_echoes, 1);
        assert_eq!(follower.tracked_pairs(), 0);
        assert!(
            follower
                .set_position(&StreamName::Events, &InstanceName::master(), Token(1))
                .is_err()
        );
        follower.handle_position(position("master", 0, 1));
        follower.handle_rdata(rdata("master", Some(2)));
        assert_eq!(follower.counters().own_echoes, 3);
        assert_eq!(follower.tracked_pairs(), 0);
        assert!(events(&mut follower).is_empty());
    }

    #[test]
    fn a_forgotten_writer_is_looked_up_afresh() {
        let mut follower = Follower::new(
            InstanceName::from("worker1"),
            Arc::new(StreamWriters::default()),
        );
        follower.connected();
        follower.handle_position(position("master", 0, 1));
        follower.handle_rdata(rdata("master", Some(2)));
        assert_eq!(follower.counters().rdata_applied, 1);
        assert!(follower.forget_writer(&StreamName::Events, &InstanceName::master()));
        assert_eq!(follower.tracked_pairs(), 0);
        // Admitted again, but not announced on this connection: dropped.
        follower.handle_rdata(rdata("master", Some(3)));
        assert_eq!(follower.tracked_pairs(), 1);
        assert_eq!(follower.counters().rdata_unconnected, 1);
        follower.handle_position(position("master", 3, 3));
        follower.handle_rdata(rdata("master", Some(4)));
        assert_eq!(follower.counters().rdata_applied, 2);
        assert_eq!(
            follower.position(&StreamName::Events, &InstanceName::master()),
            Some(Token(4))
        );
        assert_eq!(follower.counters().own_echoes, 0);
    }
}
