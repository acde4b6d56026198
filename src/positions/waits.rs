//! Waiting for a writer's position: [`PositionWaits`], the table behind
//! read-your-writes and the replication HTTP API's `_stream_positions`
//! (Synapse's `ReplicationDataHandler.wait_for_stream_position`).

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use crate::wire::{InstanceName, StreamName, Token};

/// Names one wait of a [`PositionWaits`] table, unique within it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaitId(u64);

/// What a wait waits for (see [`PositionWaits::register`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Wait {
    /// The stream.
    pub stream: StreamName,
    /// The writer whose position is awaited.
    pub writer: InstanceName,
    /// The token it must reach.
    pub token: Token,
    /// When the wait expires ([`PositionWaits::handle_timeout`]).
    pub deadline: Instant,
}

/// What [`PositionWaits::register`] made of a wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Registered {
    /// The writer is there already (at this position): nothing to wait
    /// for, and nothing was registered.
    Reached(Token),
    /// The wait is registered under this id, until the writer reaches the
    /// token, it expires or it is cancelled.
    Waiting(WaitId),
}

/// A wait refused because the table holds its limit
/// ([`PositionWaits::with_limit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("too many waits for a position (at most {limit})")]
#[non_exhaustive]
pub struct TooManyWaiters {
    /// The most waits the table holds.
    pub limit: usize,
}

/// One (stream, writer): its position as fed, and the waits on it, in
/// token order.
#[derive(Debug, Default)]
struct Pair {
    position: Option<Token>,
    waiting: BTreeSet<(Token, WaitId)>,
}

/// Waits for writers' positions, sans-IO: register a wait for a (stream,
/// writer, token), feed the positions the application has applied, and
/// learn which waits they resolve. No clock and no wakers: time is passed
/// in, and what a resolved wait wakes is the caller's business (the
/// clients' [`PositionWaiter`](crate::transport::PositionWaiter) is one
/// such caller).
///
/// As Synapse's `wait_for_stream_position`: waits are kept per (stream,
/// writer) sorted by token, a wait resolves when that writer's position
/// reaches its token (`position >= token`), and one for a position already
/// reached resolves at once. Unlike it, nothing here knows this process's
/// own name: a wait for the process's own writes needs no table (Synapse
/// and the clients resolve it at once).
///
/// # Feeding positions
///
/// The table knows a writer's position only from what it is told:
///
/// - [`advance`](PositionWaits::advance) for rows applied
///   ([`FollowerEvent::Rows`](super::FollowerEvent::Rows)): the position
///   never moves down, so rows that come after a forged one, at lower
///   tokens, change nothing;
/// - [`reset`](PositionWaits::reset) for a position set exactly, up or
///   down (`Position`, `Started`, `Reset`, or a position read from a
///   [`Follower`](super::Follower));
/// - [`forget`](PositionWaits::forget) (`Forgotten`) and
///   [`forget_positions`](PositionWaits::forget_positions) to drop what it
///   knows. A wait outlives its writer's position: it resolves when a
///   position is fed again, or expires.
///
/// Feed it what the application has *applied*, not what it was handed,
/// so that a resolved wait means the rows are visible. A forged
/// `POSITION` (see the follower's "Forged lines") moves a position as a
/// real one does, and so can resolve a wait early: it changes when a
/// waiter goes on, never what the follower delivers.
///
/// # Bounds
///
/// At most [`limit`](PositionWaits::limit) waits are held (a wait that
/// resolves at once takes none); beyond, [`register`](PositionWaits::register)
/// refuses with [`TooManyWaiters`]. Positions are kept per (stream,
/// writer) fed, until forgotten: fed from a [`Follower`](super::Follower)'s
/// events, as many as the follower tracks (bounded by its
/// [`FollowerLimits`](super::FollowerLimits)).
///
/// ```
/// use std::time::{Duration, Instant};
/// use synapse_replication::positions::{PositionWaits, Registered};
/// use synapse_replication::wire::{InstanceName, StreamName, Token};
///
/// let now = Instant::now();
/// let deadline = now + Duration::from_secs(5);
/// let (events, persister) = (StreamName::Events, InstanceName::from("persister1"));
/// let mut waits = PositionWaits::new();
/// waits.reset(&events, &persister, Token(10));
///
/// // Already there: resolved at once.
/// assert_eq!(waits.register(&events, &persister, Token(9), deadline)?, Registered::Reached(Token(10)));
/// // Not yet: registered, and resolved once the rows of 12 are applied.
/// let Registered::Waiting(id) = waits.register(&events, &persister, Token(12), deadline)? else {
///     unreachable!()
/// };
/// assert!(waits.advance(&events, &persister, Token(11)).is_empty());
/// assert_eq!(waits.advance(&events, &persister, Token(12)), vec![id]);
///
/// // A wait that is never satisfied expires at its deadline.
/// let Registered::Waiting(late) = waits.register(&events, &persister, Token(99), deadline)? else {
///     unreachable!()
/// };
/// assert_eq!(waits.poll_timeout(), Some(deadline));
/// assert_eq!(waits.handle_timeout(deadline), vec![late]);
/// assert!(waits.is_empty());
/// # Ok::<(), synapse_replication::positions::TooManyWaiters>(())
/// ```
#[derive(Debug)]
pub struct PositionWaits {
    limit: usize,
    next: u64,
    streams: HashMap<StreamName, HashMap<InstanceName, Pair>>,
    waits: HashMap<WaitId, Wait>,
    deadlines: BTreeSet<(Instant, WaitId)>,
}

impl Default for PositionWaits {
    fn default() -> Self {
        PositionWaits::new()
    }
}

impl PositionWaits {
    /// The default limit on waits held: 10 000.
    pub const DEFAULT_LIMIT: usize = 10_000;

    /// An empty table holding at most [`PositionWaits::DEFAULT_LIMIT`]
    /// waits.
    pub fn new() -> PositionWaits {
        PositionWaits::with_limit(PositionWaits::DEFAULT_LIMIT)
    }

    /// An empty table holding at most `limit` waits (0: every wait that
    /// does not resolve at once is refused).
    pub fn with_limit(limit: usize) -> PositionWaits {
        PositionWaits {
            limit,
            next: 0,
            streams: HashMap::new(),
            waits: HashMap::new(),
            deadlines: BTreeSet::new(),
        }
    }

    /// The most waits held.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Waits held.
    pub fn len(&self) -> usize {
        self.waits.len()
    }

    /// Whether no wait is held.
    pub fn is_empty(&self) -> bool {
        self.waits.is_empty()
    }

    /// The position fed for `writer` on `stream`, if any.
    pub fn position(&self, stream: &StreamName, writer: &InstanceName) -> Option<Token> {
        self.streams.get(stream)?.get(writer)?.position
    }

    /// The wait `id`, while it is held.
    pub fn get(&self, id: WaitId) -> Option<&Wait> {
        self.waits.get(&id)
    }

    /// Waits for `writer`'s position on `stream` to reach `token`, until
    /// `deadline`. [`Registered::Reached`] when the position fed is at
    /// `token` or beyond (nothing is held); otherwise the wait is held
    /// under the id returned, or refused when [`limit`](PositionWaits::limit)
    /// waits are held already.
    pub fn register(
        &mut self,
        stream: &StreamName,
        writer: &InstanceName,
        token: Token,
        deadline: Instant,
    ) -> Result<Registered, TooManyWaiters> {
        if let Some(position) = self.position(stream, writer) {
            if position >= token {
                return Ok(Registered::Reached(position));
            }
        }
        if self.waits.len() >= self.limit {
            return Err(TooManyWaiters { limit: self.limit });
        }
        let id = WaitId(self.next);
        self.next += 1;
        self.pair_mut(stream, writer).waiting.insert((token, id));
        self.deadlines.insert((deadline, id));
        self.waits.insert(
            id,
            Wait {
                stream: stream.clone(),
                writer: writer.clone(),
                token,
                deadline,
            },
        );
        Ok(Registered::Waiting(id))
    }

    /// `writer`'s rows up to `token` on `stream` were applied: its
    /// position becomes `token` unless it is beyond already (it never
    /// moves down here). Returns the waits this resolves, in token order;
    /// they are no longer held.
    #[must_use = "the waits resolved are no longer held: wake their waiters"]
    pub fn advance(
        &mut self,
        stream: &StreamName,
        writer: &InstanceName,
        token: Token,
    ) -> Vec<WaitId> {
        let position = match self.position(stream, writer) {
            Some(position) if position >= token => return Vec::new(),
            _ => token,
        };
        self.set(stream, writer, position)
    }

    /// `writer`'s position on `stream` is `token`, up or down (a position
    /// announced, a writer started or reset, a position read from the
    /// follower). Returns the waits this resolves, in token order.
    #[must_use = "the waits resolved are no longer held: wake their waiters"]
    pub fn reset(
        &mut self,
        stream: &StreamName,
        writer: &InstanceName,
        token: Token,
    ) -> Vec<WaitId> {
        self.set(stream, writer, token)
    }

    /// Drops the position of `writer` on `stream` (the follower no longer
    /// tracks it). Its waits stay, until a position is fed again or they
    /// expire.
    pub fn forget(&mut self, stream: &StreamName, writer: &InstanceName) {
        let Some(writers) = self.streams.get_mut(stream) else {
            return;
        };
        if let Some(pair) = writers.get_mut(writer) {
            pair.position = None;
            if pair.waiting.is_empty() {
                writers.remove(writer);
            }
        }
        if writers.is_empty() {
            self.streams.remove(stream);
        }
    }

    /// Drops every position fed (the waits stay): for a caller that stops
    /// feeding positions for a while and must not trust them when it
    /// starts again.
    pub fn forget_positions(&mut self) {
        self.streams.retain(|_, writers| {
            writers.retain(|_, pair| {
                pair.position = None;
                !pair.waiting.is_empty()
            });
            !writers.is_empty()
        });
    }

    /// The (stream, writer) pairs that have waits but no position fed:
    /// what to seed (with [`reset`](PositionWaits::reset)) when positions
    /// are fed only while waits exist.
    pub fn unknown_positions(&self) -> impl Iterator<Item = (&StreamName, &InstanceName)> {
        self.streams.iter().flat_map(|(stream, writers)| {
            writers
                .iter()
                .filter(|(_, pair)| pair.position.is_none() && !pair.waiting.is_empty())
                .map(move |(writer, _)| (stream, writer))
        })
    }

    /// Removes the wait `id` (its waiter gave up); what it waited for, or
    /// `None` if it is not held (resolved, expired, cancelled).
    pub fn cancel(&mut self, id: WaitId) -> Option<Wait> {
        let wait = self.waits.remove(&id)?;
        self.deadlines.remove(&(wait.deadline, id));
        if let Some(writers) = self.streams.get_mut(&wait.stream) {
            if let Some(pair) = writers.get_mut(&wait.writer) {
                pair.waiting.remove(&(wait.token, id));
                if pair.waiting.is_empty() && pair.position.is_none() {
                    writers.remove(&wait.writer);
                }
            }
            if writers.is_empty() {
                self.streams.remove(&wait.stream);
            }
        }
        Some(wait)
    }

    /// Expires every wait whose deadline is at or before `now`; returns
    /// them, earliest deadline first. Their writers' positions, to report,
    /// are still [`position`](PositionWaits::position).
    #[must_use = "the waits expired are no longer held: tell their waiters"]
    pub fn handle_timeout(&mut self, now: Instant) -> Vec<WaitId> {
        let mut expired = Vec::new();
        while let Some(&(deadline, id)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            expired.push(id);
            self.cancel(id);
        }
        expired
    }

    /// The earliest deadline of the waits held: when to call
    /// [`handle_timeout`](PositionWaits::handle_timeout) next.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadlines.first().map(|(deadline, _)| *deadline)
    }

    fn pair_mut(&mut self, stream: &StreamName, writer: &InstanceName) -> &mut Pair {
        self.streams
            .entry(stream.clone())
            .or_default()
            .entry(writer.clone())
            .or_default()
    }

    fn set(&mut self, stream: &StreamName, writer: &InstanceName, token: Token) -> Vec<WaitId> {
        let pair = self.pair_mut(stream, writer);
        pair.position = Some(token);
        let mut resolved = Vec::new();
        while let Some(&(wanted, id)) = pair.waiting.first() {
            if wanted > token {
                break;
            }
            pair.waiting.pop_first();
            resolved.push(id);
        }
        for id in &resolved {
            if let Some(wait) = self.waits.remove(id) {
                self.deadlines.remove(&(wait.deadline, *id));
            }
        }
        resolved
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn at(base: Instant, secs: u64) -> Instant {
        base + Duration::from_secs(secs)
    }

    fn waiting(registered: Result<Registered, TooManyWaiters>) -> WaitId {
        match registered {
            Ok(Registered::Waiting(id)) => id,
            other => panic!("expected a wait, got {other:?}"),
        }
    }

    fn names() -> (StreamName, InstanceName, InstanceName) {
        (
            StreamName::Events,
            InstanceName::from("persister1"),
            InstanceName::from("persister2"),
        )
    }

    #[test]
    fn resolves_in_token_order_per_writer() {
        let now = Instant::now();
        let (events, one, two) = names();
        let mut waits = PositionWaits::new();
        let w5 = waiting(waits.register(&events, &one, Token(5), at(now, 5)));
        let w3 = waiting(waits.register(&events, &one, Token(3), at(now, 5)));
        let w4 = waiting(waits.register(&events, &two, Token(4), at(now, 5)));
        assert_eq!(waits.len(), 3);
        // Another writer's rows resolve nothing of this one's.
        assert_eq!(waits.advance(&events, &two, Token(9)), vec![w4]);
        assert_eq!(waits.advance(&events, &one, Token(2)), vec![]);
        assert_eq!(waits.advance(&events, &one, Token(6)), vec![w3, w5]);
        assert!(waits.is_empty());
        assert_eq!(waits.poll_timeout(), None);
    }

    #[test]
    fn reached_takes_no_slot() {
        let now = Instant::now();
        let (events, one, _) = names();
        let mut waits = PositionWaits::with_limit(0);
        waits.reset(&events, &one, Token(7)).clear();
        assert_eq!(
            waits.register(&events, &one, Token(7), now),
            Ok(Registered::Reached(Token(7)))
        );
        assert_eq!(
            waits.register(&events, &one, Token(8), now),
            Err(TooManyWaiters { limit: 0 })
        );
    }

    #[test]
    fn bounded_until_a_slot_is_freed() {
        let now = Instant::now();
        let (events, one, _) = names();
        let mut waits = PositionWaits::with_limit(2);
        let a = waiting(waits.register(&events, &one, Token(1), now));
        let _b = waiting(waits.register(&events, &one, Token(2), now));
        let refused = waits.register(&events, &one, Token(3), now);
        assert_eq!(refused, Err(TooManyWaiters { limit: 2 }));
        assert_eq!(
            refused.map_err(|e| e.to_string()),
            Err("too many waits for a position (at most 2)".to_owned())
        );
        let cancelled = waits.cancel(a).expect("held");
        assert_eq!((cancelled.token, cancelled.deadline), (Token(1), now));
        assert_eq!(waits.cancel(a), None);
        waiting(waits.register(&events, &one, Token(3), now));
    }

    #[test]
    fn advance_never_moves_down_reset_does() {
        let now = Instant::now();
        let (events, one, _) = names();
        let mut waits = PositionWaits::new();
        assert!(waits.advance(&events, &one, Token(10)).is_empty());
        assert!(waits.advance(&events, &one, Token(4)).is_empty());
        assert_eq!(waits.position(&events, &one), Some(Token(10)));
        let w = waiting(waits.register(&events, &one, Token(11), at(now, 1)));
        assert!(waits.reset(&events, &one, Token(0)).is_empty());
        assert_eq!(waits.position(&events, &one), Some(Token(0)));
        assert_eq!(waits.reset(&events, &one, Token(11)), vec![w]);
    }

    #[test]
    fn waits_outlive_forgotten_positions() {
        let now = Instant::now();
        let (events, one, two) = names();
        let mut waits = PositionWaits::new();
        waits.reset(&events, &one, Token(3)).clear();
        waits.reset(&events, &two, Token(3)).clear();
        let w = waiting(waits.register(&events, &one, Token(5), at(now, 1)));
        assert_eq!(waits.unknown_positions().count(), 0);
        waits.forget(&events, &one);
        assert_eq!(waits.position(&events, &one), None);
        assert_eq!(
            waits.unknown_positions().collect::<Vec<_>>(),
            vec![(&events, &one)]
        );
        waits.forget_positions();
        assert_eq!(waits.position(&events, &two), None);
        assert_eq!(waits.advance(&events, &one, Token(5)), vec![w]);
        // Nothing left but the position just fed.
        waits.forget(&events, &one);
        assert!(waits.streams.is_empty());
    }

    #[test]
    fn expires_at_deadlines_earliest_first() {
        let now = Instant::now();
        let (events, one, two) = names();
        let mut waits = PositionWaits::new();
        let late = waiting(waits.register(&events, &one, Token(5), at(now, 9)));
        let early = waiting(waits.register(&events, &two, Token(5), at(now, 2)));
        let middle = waiting(waits.register(&events, &one, Token(6), at(now, 4)));
        assert_eq!(waits.poll_timeout(), Some(at(now, 2)));
        assert_eq!(waits.handle_timeout(at(now, 1)), vec![]);
        assert_eq!(waits.handle_timeout(at(now, 4)), vec![early, middle]);
        assert_eq!(waits.get(late).map(|w| w.token), Some(Token(5)));
        assert_eq!(waits.poll_timeout(), Some(at(now, 9)));
        assert_eq!(waits.advance(&events, &one, Token(5)), vec![late]);
        assert_eq!(waits.poll_timeout(), None);
        assert!(
            waits
                .streams
                .get(&events)
                .is_some_and(|w| !w.contains_key(&two))
        );
    }

    #[derive(Clone, Debug)]
    enum Op {
        Register(u8, u8, i64, u64),
        Advance(u8, u8, i64),
        Reset(u8, u8, i64),
        Forget(u8, u8),
        ForgetAll,
        Cancel(usize),
        Timeout(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..2, 0u8..3, 0i64..12, 0u64..10).prop_map(|(s, w, t, d)| Op::Register(s, w, t, d)),
            3 => (0u8..2, 0u8..3, 0i64..12).prop_map(|(s, w, t)| Op::Advance(s, w, t)),
            1 => (0u8..2, 0u8..3, 0i64..12).prop_map(|(s, w, t)| Op::Reset(s, w, t)),
            1 => (0u8..2, 0u8..3).prop_map(|(s, w)| Op::Forget(s, w)),
            1 => Just(Op::ForgetAll),
            1 => any::<usize>().prop_map(Op::Cancel),
            1 => (0u64..10).prop_map(Op::Timeout),
        ]
    }

    fn pair(s: u8, w: u8) -> (StreamName, InstanceName) {
        let stream = if s == 0 {
            StreamName::Events
        } else {
            StreamName::Caches
        };
        (stream, InstanceName::from(format!("writer{w}")))
    }

    proptest! {
        /// The table against a model of lists: every operation gives what
        /// the model gives, the bound holds, and the next deadline is the
        /// earliest held.
        #[test]
        fn matches_a_model(ops in proptest::collection::vec(op(), 0..80), limit in 0usize..6) {
            let base = Instant::now();
            let mut waits = PositionWaits::with_limit(limit);
            let mut positions: BTreeMap<(u8, u8), i64> = BTreeMap::new();
            // Held waits, in registration order: (id, pair, token, deadline).
            let mut held: Vec<(WaitId, (u8, u8), i64, u64)> = Vec::new();
            // Resolves the model's waits on `key` at `position`, in token
            // order (then registration order, as ids grow).
            let resolve = |held: &mut Vec<(WaitId, (u8, u8), i64, u64)>, key: (u8, u8), position: i64| {
                let mut out: Vec<(i64, WaitId)> = held
                    .iter()
                    .filter(|(_, k, t, _)| *k == key && *t <= position)
                    .map(|(id, _, t, _)| (*t, *id))
                    .collect();
                out.sort();
                held.retain(|(_, k, t, _)| !(*k == key && *t <= position));
                out.into_iter().map(|(_, id)| id).collect::<Vec<_>>()
            };
            for op in ops {
                match op {
                    Op::Register(s, w, t, d) => {
                        let (stream, writer) = pair(s, w);
                        let got = waits.register(&stream, &writer, Token(t), at(base, d));
                        match positions.get(&(s, w)) {
                            Some(&p) if p >= t => prop_assert_eq!(got, Ok(Registered::Reached(Token(p)))),
                            _ if held.len() >= limit => prop_assert_eq!(got, Err(TooManyWaiters { limit })),
                            _ => {
                                let Ok(Registered::Waiting(id)) = got else {
                                    return Err(TestCaseError::fail(format!("{got:?}")));
                                };
                                held.push((id, (s, w), t, d));
                            }
                        }
                    }
                    Op::Advance(s, w, t) => {
                        let (stream, writer) = pair(s, w);
                        let got = waits.advance(&stream, &writer, Token(t));
                        let p = positions.get(&(s, w)).map_or(t, |&p| p.max(t));
                        positions.insert((s, w), p);
                        prop_assert_eq!(got, resolve(&mut held, (s, w), p));
                    }
                    Op::Reset(s, w, t) => {
                        let (stream, writer) = pair(s, w);
                        let got = waits.reset(&stream, &writer, Token(t));
                        positions.insert((s, w), t);
                        prop_assert_eq!(got, resolve(&mut held, (s, w), t));
                    }
                    Op::Forget(s, w) => {
                        let (stream, writer) = pair(s, w);
                        waits.forget(&stream, &writer);
                        positions.remove(&(s, w));
                    }
                    Op::ForgetAll => {
                        waits.forget_positions();
                        positions.clear();
                    }
                    Op::Cancel(index) => {
                        if held.is_empty() {
                            continue;
                        }
                        let (id, key, t, d) = held.remove(index % held.len());
                        let wait = waits.cancel(id).expect("held");
                        prop_assert_eq!((wait.token, wait.deadline), (Token(t), at(base, d)));
                        prop_assert_eq!((wait.stream, wait.writer), pair(key.0, key.1));
                        prop_assert_eq!(waits.cancel(id), None);
                    }
                    Op::Timeout(now) => {
                        let got = waits.handle_timeout(at(base, now));
                        let mut want: Vec<(u64, WaitId)> = held
                            .iter()
                            .filter(|(_, _, _, d)| *d <= now)
                            .map(|(id, _, _, d)| (*d, *id))
                            .collect();
                        want.sort();
                        held.retain(|(_, _, _, d)| *d > now);
                        prop_assert_eq!(got, want.into_iter().map(|(_, id)| id).collect::<Vec<_>>());
                    }
                }
                prop_assert_eq!(waits.len(), held.len());
                prop_assert!(waits.len() <= limit);
                prop_assert_eq!(
                    waits.poll_timeout(),
                    held.iter().map(|(_, _, _, d)| at(base, *d)).min()
                );
                for s in 0..2 {
                    for w in 0..3 {
                        let (stream, writer) = pair(s, w);
                        prop_assert_eq!(
                            waits.position(&stream, &writer),
                            positions.get(&(s, w)).map(|&p| Token(p))
                        );
                    }
                }
                let mut unknown: Vec<_> = waits
                    .unknown_positions()
                    .map(|(s, w)| (s.clone(), w.clone()))
                    .collect();
                unknown.sort();
                let mut want: Vec<_> = held
                    .iter()
                    .map(|(_, k, _, _)| *k)
                    .filter(|k| !positions.contains_key(k))
                    .map(|(s, w)| pair(s, w))
                    .collect();
                want.sort();
                want.dedup();
                prop_assert_eq!(unknown, want);
                // Memory: a pair is kept only for a position or a wait.
                let kept: usize = waits.streams.values().map(HashMap::len).sum();
                let mut live: Vec<(u8, u8)> = positions.keys().copied().collect();
                live.extend(held.iter().map(|(_, k, _, _)| *k));
                live.sort();
                live.dedup();
                prop_assert_eq!(kept, live.len());
            }
        }
    }
}
