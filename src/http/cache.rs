//! The answers a callee keeps per txn id (Synapse's `ResponseCache`), so
//! that a retried call is answered, not handled twice.

use std::collections::VecDeque;
use std::collections::hash_map::{Entry as MapEntry, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::{Duration, Instant};

/// How long an answer is kept: Synapse's 30 minutes.
const KEEP_ANSWERS: Duration = Duration::from_secs(30 * 60);

/// The most calls kept at once, by default (handled or in flight).
const MAX_KEPT: usize = 10_000;

/// The most bytes of answers kept at once, by default.
const MAX_KEPT_BYTES: usize = 64 * 1024 * 1024;

/// The most calls that may wait for one txn id's first.
const MAX_WAITING: usize = 16;

/// An answer as a handler gave it: a status and a JSON object, without
/// `_INT_STREAM_POS` (added afresh to each answer, as Synapse does).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedAnswer {
    /// The HTTP status.
    pub status: u16,
    /// The JSON body.
    pub body: String,
}

/// What to do with a call, by its txn id.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum CacheLookup {
    /// The first call with this txn id: handle it, then
    /// [`ResponseCache::finish`] it.
    Handle,
    /// A call with this txn id is being handled: wait for its answer
    /// ([`ResponseCache::wait`]).
    Wait,
    /// Handled already: answer this.
    Answer(CachedAnswer),
    /// The txn id was used for another request (another fingerprint):
    /// refuse it.
    Conflict,
    /// Too many calls are kept, all in flight: refuse it for now.
    Full,
}

/// A fingerprint of a call, to tell a retry (the same request again) from
/// a txn id reused for another: its endpoint, path arguments, query and
/// body.
pub fn fingerprint(endpoint: &str, args: &[&str], query: Option<&str>, body: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    endpoint.hash(&mut hasher);
    args.hash(&mut hasher);
    query.hash(&mut hasher);
    body.hash(&mut hasher);
    hasher.finish()
}

enum Entry<W> {
    InFlight {
        fingerprint: u64,
        waiters: Vec<W>,
    },
    Done {
        fingerprint: u64,
        answer: CachedAnswer,
        at: Instant,
    },
}

type Key = (String, String);

/// The answers of one process's endpoints, per (endpoint, txn id): what
/// Synapse's `ResponseCache` does for each endpoint that caches, bounded
/// in time (30 minutes, as Synapse), in count and in bytes (which Synapse
/// is not), sans-IO.
///
/// A call is [looked up](ResponseCache::lookup) before it is handled: the
/// first with a txn id is handled; one that comes while the first is in
/// flight [waits](ResponseCache::wait) for its answer (`W` is what the
/// transport wakes it with); one that comes after is answered what the
/// first was. Only answers are kept: a call whose handling failed is
/// [finished](ResponseCache::finish) with `keep == false`, its waiters get
/// its answer, and the next call with that txn id is handled again, as
/// Synapse forgets a failed one.
///
/// ```
/// use std::time::Instant;
/// use synapse_replication::http::{CacheLookup, CachedAnswer, ResponseCache, fingerprint};
///
/// let mut cache: ResponseCache<()> = ResponseCache::new();
/// let now = Instant::now();
/// let print = fingerprint("fed_send_edu", &["m.typing"], None, b"{}");
/// assert_eq!(cache.lookup("fed_send_edu", "t1", print, now), CacheLookup::Handle);
/// let answer = CachedAnswer { status: 200, body: "{}".into() };
/// let waiters = cache.finish("fed_send_edu", "t1", answer.clone(), true, now);
/// assert!(waiters.is_empty());
/// // The retry is answered, not handled.
/// assert_eq!(cache.lookup("fed_send_edu", "t1", print, now), CacheLookup::Answer(answer));
/// // The same txn id for another request is refused.
/// let other = fingerprint("fed_send_edu", &["m.typing"], None, b"{\"a\":1}");
/// assert_eq!(cache.lookup("fed_send_edu", "t1", other, now), CacheLookup::Conflict);
/// ```
pub struct ResponseCache<W> {
    entries: HashMap<Key, Entry<W>>,
    /// Handled calls, oldest first, to forget in order.
    order: VecDeque<(Instant, Key)>,
    keep: Duration,
    max_kept: usize,
    max_bytes: usize,
    bytes: usize,
}

impl<W> std::fmt::Debug for ResponseCache<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseCache")
            .field("kept", &self.entries.len())
            .field("bytes", &self.bytes)
            .field("max_kept", &self.max_kept)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

impl<W> Default for ResponseCache<W> {
    fn default() -> Self {
        ResponseCache::new()
    }
}

impl<W> ResponseCache<W> {
    /// Answers kept 30 minutes, as Synapse keeps them; at most 10,000
    /// calls and 64 MiB of answers.
    pub fn new() -> ResponseCache<W> {
        ResponseCache::with_limits(KEEP_ANSWERS, MAX_KEPT, MAX_KEPT_BYTES)
    }

    /// Answers kept `keep`, at most `max_kept` calls and `max_bytes` bytes
    /// of answers: beyond either, the oldest answers are forgotten early
    /// (a retry of a forgotten call is handled again).
    pub fn with_limits(keep: Duration, max_kept: usize, max_bytes: usize) -> ResponseCache<W> {
        ResponseCache {
            entries: HashMap::new(),
            order: VecDeque::new(),
            keep,
            max_kept: max_kept.max(1),
            max_bytes,
            bytes: 0,
        }
    }

    /// What to do with a call of `endpoint` with `txn_id` and this
    /// [`fingerprint`], at `now`. [`CacheLookup::Handle`] marks it in flight.
    pub fn lookup(
        &mut self,
        endpoint: &str,
        txn_id: &str,
        fingerprint: u64,
        now: Instant,
    ) -> CacheLookup {
        self.forget(now);
        let key = (endpoint.to_owned(), txn_id.to_owned());
        if let Some(entry) = self.entries.get(&key) {
            let (kept, answer) = match entry {
                Entry::InFlight { fingerprint, .. } => (*fingerprint, None),
                Entry::Done {
                    fingerprint,
                    answer,
                    ..
                } => (*fingerprint, Some(answer)),
            };
            return match (kept == fingerprint, answer) {
                (false, _) => CacheLookup::Conflict,
                (true, None) => CacheLookup::Wait,
                (true, Some(answer)) => CacheLookup::Answer(answer.clone()),
            };
        }
        while self.entries.len() >= self.max_kept {
            if !self.forget_oldest() {
                return CacheLookup::Full;
            }
        }
        self.entries.insert(
            key,
            Entry::InFlight {
                fingerprint,
                waiters: Vec::new(),
            },
        );
        CacheLookup::Handle
    }

    /// Waits for the call in flight with `txn_id`: `waiter` is given back
    /// by [`finish`](ResponseCache::finish). Refused (`Err(waiter)`) when
    /// no call with that txn id is in flight, or 16 already wait.
    pub fn wait(&mut self, endpoint: &str, txn_id: &str, waiter: W) -> Result<(), W> {
        let key = (endpoint.to_owned(), txn_id.to_owned());
        match self.entries.get_mut(&key) {
            Some(Entry::InFlight { waiters, .. }) if waiters.len() < MAX_WAITING => {
                waiters.push(waiter);
                Ok(())
            }
            _ => Err(waiter),
        }
    }

    /// The call in flight with `txn_id` was answered `answer`: kept for
    /// its retries if `keep` (a success), forgotten otherwise. Gives back
    /// the waiters to answer with it.
    pub fn finish(
        &mut self,
        endpoint: &str,
        txn_id: &str,
        answer: CachedAnswer,
        keep: bool,
        now: Instant,
    ) -> Vec<W> {
        let key = (endpoint.to_owned(), txn_id.to_owned());
        let MapEntry::Occupied(mut entry) = self.entries.entry(key.clone()) else {
            return Vec::new();
        };
        let Entry::InFlight {
            fingerprint,
            waiters,
        } = entry.get_mut()
        else {
            return Vec::new();
        };
        let waiters = std::mem::take(waiters);
        if keep && answer.body.len() <= self.max_bytes {
            self.bytes += answer.body.len();
            let fingerprint = *fingerprint;
            entry.insert(Entry::Done {
                fingerprint,
                answer,
                at: now,
            });
            self.order.push_back((now, key));
            while self.bytes > self.max_bytes && self.forget_oldest() {}
        } else {
            entry.remove();
        }
        waiters
    }

    /// How many calls are kept (answered or in flight).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The bytes of the answers kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Forgets answers older than `keep`.
    fn forget(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front() {
            if now.saturating_duration_since(*at) < self.keep {
                break;
            }
            self.forget_oldest();
        }
    }

    /// Forgets the oldest answer kept; false when none is.
    fn forget_oldest(&mut self) -> bool {
        while let Some((at, key)) = self.order.pop_front() {
            // Only an answer kept at `at`: the key may have been forgotten
            // early and handled again since.
            if let MapEntry::Occupied(entry) = self.entries.entry(key) {
                if let Entry::Done {
                    at: done, answer, ..
                } = entry.get()
                {
                    if *done == at {
                        self.bytes -= answer.body.len();
                        entry.remove();
                        return true;
                    }
                }
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(body: &str) -> CachedAnswer {
        CachedAnswer {
            status: 200,
            body: body.to_owned(),
        }
    }

    #[test]
    fn concurrent_duplicates_wait_for_the_first() {
        let mut cache: ResponseCache<u32> = ResponseCache::new();
        let now = Instant::now();
        assert_eq!(cache.lookup("e", "t", 1, now), CacheLookup::Handle);
        assert_eq!(cache.lookup("e", "t", 1, now), CacheLookup::Wait);
        assert_eq!(cache.wait("e", "t", 7), Ok(()));
        assert_eq!(cache.lookup("e", "t", 2, now), CacheLookup::Conflict);
        // Other endpoints and txn ids are apart.
        assert_eq!(cache.lookup("f", "t", 1, now), CacheLookup::Handle);
        assert_eq!(cache.lookup("e", "u", 1, now), CacheLookup::Handle);
        assert_eq!(cache.finish("e", "t", answer("{}"), true, now), vec![7]);
        assert_eq!(
            cache.lookup("e", "t", 1, now),
            CacheLookup::Answer(answer("{}"))
        );
        assert_eq!(cache.wait("e", "t", 8), Err(8));
    }

    #[test]
    fn failures_are_not_kept() {
        let mut cache: ResponseCache<u32> = ResponseCache::new();
        let now = Instant::now();
        assert_eq!(cache.lookup("e", "t", 1, now), CacheLookup::Handle);
        assert_eq!(cache.wait("e", "t", 1), Ok(()));
        let failed = CachedAnswer {
            status: 500,
            body: "{}".into(),
        };
        assert_eq!(cache.finish("e", "t", failed, false, now), vec![1]);
        assert!(cache.is_empty());
        assert_eq!(cache.lookup("e", "t", 1, now), CacheLookup::Handle);
    }

    #[test]
    fn waiters_are_bounded() {
        let mut cache: ResponseCache<usize> = ResponseCache::new();
        let now = Instant::now();
        assert_eq!(cache.lookup("e", "t", 1, now), CacheLookup::Handle);
        for waiter in 0..MAX_WAITING {
            assert_eq!(cache.wait("e", "t", waiter), Ok(()));
        }
        assert_eq!(cache.wait("e", "t", 99), Err(99));
    }

    #[test]
    fn answers_are_forgotten_after_keep_and_beyond_the_bounds() {
        let mut cache: ResponseCache<()> =
            ResponseCache::with_limits(Duration::from_secs(60), 3, 10);
        let start = Instant::now();
        for (index, txn) in ["a", "b", "c"].into_iter().enumerate() {
            let at = start + Duration::from_secs(index as u64);
            assert_eq!(cache.lookup("e", txn, 1, at), CacheLookup::Handle);
            let _ = cache.finish("e", txn, answer("{}"), true, at);
        }
        assert_eq!(cache.len(), 3);
        // A fourth makes room by forgetting the oldest.
        assert_eq!(cache.lookup("e", "d", 1, start), CacheLookup::Handle);
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.lookup("e", "a", 1, start), CacheLookup::Handle);
        // Bytes: a 9-byte answer pushes out older ones.
        let _ = cache.finish("e", "a", answer("{\"x\":123}"), true, start);
        assert!(cache.bytes() <= 10);
        // Time: after `keep`, nothing answered is left.
        let later = start + Duration::from_secs(120);
        assert_eq!(cache.lookup("e", "b", 1, later), CacheLookup::Handle);
        assert_eq!(cache.lookup("e", "c", 1, later), CacheLookup::Handle);
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn all_in_flight_is_full() {
        let mut cache: ResponseCache<()> =
            ResponseCache::with_limits(Duration::from_secs(60), 2, 100);
        let now = Instant::now();
        assert_eq!(cache.lookup("e", "a", 1, now), CacheLookup::Handle);
        assert_eq!(cache.lookup("e", "b", 1, now), CacheLookup::Handle);
        assert_eq!(cache.lookup("e", "c", 1, now), CacheLookup::Full);
    }

    #[test]
    fn fingerprints_tell_requests_apart() {
        let a = fingerprint("e", &["x"], None, b"{}");
        assert_eq!(a, fingerprint("e", &["x"], None, b"{}"));
        assert_ne!(a, fingerprint("e", &["y"], None, b"{}"));
        assert_ne!(a, fingerprint("e", &["x"], Some(""), b"{}"));
        assert_ne!(a, fingerprint("e", &["x"], None, b"{ }"));
        assert_ne!(a, fingerprint("f", &["x"], None, b"{}"));
    }
}
