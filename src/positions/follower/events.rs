//! What a [`Follower`](super::Follower) tells the application, the limits
//! it keeps to, and what it counts.

use std::fmt;

use crate::wire::{CommandKind, InstanceName, StreamName, Token};

use super::super::catch_up::CatchUpRequest;
use super::Rows;

/// What the application must do, as a [`Follower`](super::Follower) decides it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FollowerEvent {
    /// Rows of one token, to apply together (a batch is never split).
    ///
    /// Rows of one (stream, writer) come each exactly once, in the order
    /// the writer wrote them, unless a [`FollowerEvent::Reset`] intervenes:
    /// in strictly increasing token order, but where a forged line came
    /// between (see the follower's "Forged lines"): the writer's rows a
    /// forged row jumped over then come after it, at lower tokens, and a
    /// row of the writer's at a forged row's token comes at that token
    /// again.
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
        source: RowOrigin,
    },
    /// The writer's position moved to `token` without rows (a `POSITION`
    /// with nothing missed, the end of a catch-up). It goes down only when
    /// a claim is found false (see the follower's "Forged lines"), and
    /// never below the rows delivered, but for a writer that has
    /// delivered none since it [`FollowerEvent::Started`]: a lower
    /// announcement then moves its start down.
    Position {
        /// The stream.
        stream: StreamName,
        /// The writer.
        writer: InstanceName,
        /// The new position.
        token: Token,
    },
    /// The follower began following `writer` on `stream` at `token`, the
    /// first position the writer announced: it had no position for the
    /// pair (none was seeded with
    /// [`Follower::set_position`](super::Follower::set_position)), so rows
    /// before `token` were not fetched. Rows after it come as usual.
    Started {
        /// The stream.
        stream: StreamName,
        /// The writer.
        writer: InstanceName,
        /// Where following starts.
        token: Token,
    },
    /// Rows were missed: fetch them (see [`CatchUpRequest`]) and answer with
    /// [`Follower::handle_catch_up`](super::Follower::handle_catch_up) or [`Follower::catch_up_failed`](super::Follower::catch_up_failed). The
    /// stream's later commands wait until then.
    CatchUp(CatchUpRequest),
    /// The writer's stream went backwards (`POSITION` with a new token below
    /// the current one, on a stream whose tokens may restart: see
    /// [`tokens_only_grow`](crate::positions::tokens_only_grow)). The writer restarted:
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
    /// A writer the configuration does not name, admitted before the
    /// others and not heard from since, is no longer tracked: it made room
    /// for another under [`FollowerLimits::max_tracked_pairs`]. Its resume
    /// point is remembered (among the last 16,384 forgotten): if it writes
    /// again, it goes on from there, and what it wrote in between is
    /// fetched by a catch-up. Configured writers are never forgotten.
    Forgotten {
        /// The stream.
        stream: StreamName,
        /// The writer.
        writer: InstanceName,
        /// Its resume point (see
        /// [`Follower::resume_point`](super::Follower::resume_point)).
        token: Token,
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
            FollowerEvent::Started {
                stream,
                writer,
                token,
            } => {
                write!(f, "started {stream} {writer} {token}")
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
            FollowerEvent::Forgotten {
                stream,
                writer,
                token,
            } => {
                write!(f, "forgotten {stream} {writer} at {token}")
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
pub enum RowOrigin {
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

/// Bounds on what a [`Follower`](super::Follower) holds, whatever its input.
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
    /// (stream, writer) pairs tracked of writers the configuration does
    /// not name (default 4096): `caches` writers over Redis that are in
    /// neither `instance_map` nor `stream_writers`, and writers of streams
    /// this crate does not know. Anyone who may publish can create those;
    /// configured writers ([`WriterRegistry::is_configured`](crate::writers::WriterRegistry::is_configured))
    /// are always tracked and not counted. At the limit, a pair is
    /// forgotten to make room ([`FollowerEvent::Forgotten`]): the first
    /// admitted that was not heard from since and has no catch-up
    /// outstanding (one heard from gets a second chance), found in O(1)
    /// amortised. Its resume point is kept (for the last 16,384
    /// forgotten): heard of again, the writer goes on from there, and a
    /// catch-up fetches what it wrote meanwhile, so that made-up names
    /// make a real writer lose no row. Only when every pair has a
    /// catch-up outstanding is the newcomer rejected
    /// ([`RejectReason::TooManyWriters`]). See also
    /// [`Follower::forget_writer`](super::Follower::forget_writer).
    pub max_tracked_pairs: usize,
    /// How far above the highest row delivered on its stream a live row's
    /// token may be and still be applied as it comes (default 1 000 000).
    /// Beyond, the writer's rows up to it are fetched through a catch-up
    /// instead: a row forged far ahead never lands, and a real one arrives
    /// through the writer's own answer.
    pub max_token_jump: i64,
    /// Rows delivered live per writer between two proofs (default 256).
    /// Until a writer proves its rows, the follower keeps the token and a
    /// fingerprint of each: that is how the writer's own row at a token
    /// where a forged one was delivered first is told from a duplicate.
    /// Every this many rows it asks the writer for its last row (a
    /// [`FollowerEvent::CatchUp`] of one token, answered, retried and
    /// reported by the drivers as any other; nothing waits for it): an
    /// answer that holds it proves every row below, which is then
    /// forgotten. Only writers the configuration names, on streams whose
    /// tokens only grow, are asked. Beyond four times this many unproven
    /// rows (16 for other writers), the oldest gives way
    /// ([`FollowerCounters::unproven_forgotten`]).
    pub max_unproven_rows: usize,
}

impl Default for FollowerLimits {
    fn default() -> Self {
        FollowerLimits {
            max_queued_commands: 10_000,
            max_batch_rows: 10_000,
            max_buffered_bytes: 64 << 20,
            max_tracked_pairs: 4096,
            max_token_jump: 1_000_000,
            max_unproven_rows: 256,
        }
    }
}

/// What a [`Follower`](super::Follower) has done, for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FollowerCounters {
    /// Numbered `RDATA` applied (each gave a [`FollowerEvent::Rows`]).
    pub rdata_applied: u64,
    /// Rows delivered, live and caught up.
    pub rows_delivered: u64,
    /// `RDATA` of a token already delivered (or before following started),
    /// dropped.
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
    /// WriterList forgotten to make room (see [`FollowerEvent::Forgotten`]).
    pub writers_forgotten: u64,
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
    /// Catch-ups asked again after [`Follower::catch_up_failed`](super::Follower::catch_up_failed).
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
    /// Positions found false: a row inside a range a `POSITION` said was
    /// empty, or the writer announcing itself below them. A real writer
    /// never causes one; a forged line does.
    pub claims_refuted: u64,
    /// Live rows too far ahead of the stream (see
    /// [`FollowerLimits::max_token_jump`]), fetched rather than applied.
    pub jumps_checked: u64,
    /// `RDATA` at the token of the writer's last row but with other rows:
    /// delivered, not dropped as a duplicate (one of the two was forged).
    pub rows_contested: u64,
    /// Proofs asked of writers (see [`FollowerLimits::max_unproven_rows`]),
    /// retries included.
    pub proofs_requested: u64,
    /// Answers that held a row delivered live, proving every row below it.
    pub proofs_confirmed: u64,
    /// Rows of writers that can be asked whose fingerprints were forgotten
    /// before the writer proved them (it did not answer in time): a row of
    /// the writer's at such a token, after a forged one there, is taken as
    /// a duplicate.
    pub unproven_forgotten: u64,
}
