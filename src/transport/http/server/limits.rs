//! What the connections of an [`HttpServer`](super::HttpServer) may
//! hold, and how much of its refusals reaches the log: pure bookkeeping,
//! with the time passed in.

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant};

/// Refusals logged per window; the rest are counted.
pub(super) const LOG_BURST: u32 = 5;

/// The window [`LOG_BURST`] counts in.
pub(super) const LOG_WINDOW: Duration = Duration::from_secs(60);

/// The longest path logged, in bytes; longer ones are cut, with `…`.
pub(super) const LOGGED_PATH: usize = 80;

/// The connections of one server, of two kinds. Pending: accepted, and
/// not yet shown a request with complete headers and the secret (a TLS
/// handshake, headers on their way, a request refused from its headers, a
/// route of the application's own). Admitted: a request with the secret
/// being answered. A new connection is always taken: when the pending
/// ones fill their share, the oldest of them is closed to make room for
/// it (as nginx reuses its oldest idle connections), whoever opened them,
/// so that sockets held open from the writer's own host (where all of
/// Synapse's processes connect from) or from many addresses cannot keep
/// out a request that comes with its headers at once. Admitted ones are
/// never closed for room; beyond their share a request is refused (503).
#[derive(Debug)]
pub(super) struct Slots {
    max_pending: usize,
    max_admitted: usize,
    /// The next connection's id: ids grow with the accepts, so the
    /// smallest pending id is the oldest.
    next: u64,
    pending: BTreeSet<u64>,
    admitted: HashSet<u64>,
}

/// What [`Slots::admit`] says of a request whose headers came with the
/// secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Admission {
    /// Answer it: its connection is no longer closed for room.
    Admitted,
    /// As many are answered already: refuse it (503).
    Busy,
}

impl Slots {
    /// At most `max_pending` connections pending and `max_admitted`
    /// admitted (at least one each).
    pub(super) fn new(max_pending: usize, max_admitted: usize) -> Slots {
        Slots {
            max_pending: max_pending.max(1),
            max_admitted: max_admitted.max(1),
            next: 0,
            pending: BTreeSet::new(),
            admitted: HashSet::new(),
        }
    }

    /// A connection accepted: its id, and the id of the connection to
    /// close to make room for it (the oldest pending), if any.
    #[must_use]
    pub(super) fn open(&mut self) -> (u64, Option<u64>) {
        let evicted = if self.pending.len() >= self.max_pending {
            self.pending.pop_first()
        } else {
            None
        };
        let id = self.next;
        self.next += 1;
        self.pending.insert(id);
        (id, evicted)
    }

    /// Connection `id` carries a request whose headers came complete,
    /// with the secret. A connection already closed, or admitted, is
    /// left as it is.
    #[must_use]
    pub(super) fn admit(&mut self, id: u64) -> Admission {
        if self.admitted.contains(&id) {
            return Admission::Admitted;
        }
        if self.admitted.len() >= self.max_admitted || !self.pending.contains(&id) {
            return Admission::Busy;
        }
        self.pending.remove(&id);
        self.admitted.insert(id);
        Admission::Admitted
    }

    /// Connection `id` is closed (a no-op if it was closed for room).
    pub(super) fn close(&mut self, id: u64) {
        if !self.pending.remove(&id) {
            self.admitted.remove(&id);
        }
    }

    /// Connections pending and admitted.
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        (self.pending.len(), self.admitted.len())
    }
}

/// What to log for one refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Log it; first say that `unlogged` refusals of an earlier window
    /// were not (when not zero).
    Log {
        /// Refusals counted but not logged since the last summary.
        unlogged: u64,
    },
    /// The first of this window not logged: say that the rest will be
    /// counted instead.
    FirstUnlogged,
    /// Count it, log nothing.
    Unlogged,
}

/// At most [`LOG_BURST`] refusals logged per [`LOG_WINDOW`]; the count of
/// the others is logged with the first refusal of a later window.
#[derive(Debug, Default)]
pub(super) struct RefusalLog {
    window: Option<Instant>,
    logged: u32,
    unlogged: u64,
}

impl RefusalLog {
    /// One more refusal, at `now`.
    pub(super) fn admit(&mut self, now: Instant) -> Verdict {
        let mut unlogged = 0;
        let expired = self
            .window
            .is_none_or(|start| now.saturating_duration_since(start) >= LOG_WINDOW);
        if expired {
            unlogged = std::mem::take(&mut self.unlogged);
            self.window = Some(now);
            self.logged = 0;
        }
        if self.logged < LOG_BURST {
            self.logged += 1;
            return Verdict::Log { unlogged };
        }
        self.unlogged += 1;
        if self.unlogged == 1 {
            Verdict::FirstUnlogged
        } else {
            Verdict::Unlogged
        }
    }
}

/// `path` as logged: at most [`LOGGED_PATH`] bytes of it, cut on a
/// character boundary and marked with `…`.
pub(super) fn short_path(path: &str) -> String {
    if path.len() <= LOGGED_PATH {
        return path.to_owned();
    }
    let mut end = LOGGED_PATH;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &path[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_pending_connection_makes_room_for_a_new_one() {
        let mut slots = Slots::new(3, 2);
        let ids: Vec<u64> = (0..3)
            .map(|_| {
                let (id, evicted) = slots.open();
                assert_eq!(evicted, None, "room for three");
                id
            })
            .collect();
        // A fourth: the oldest pending is closed for it, not the newcomer.
        let (fourth, evicted) = slots.open();
        assert_eq!(evicted, Some(ids[0]));
        assert_eq!(slots.counts(), (3, 0));
        // Admitted connections are not closed for room.
        assert_eq!(slots.admit(ids[1]), Admission::Admitted);
        assert_eq!(slots.admit(ids[1]), Admission::Admitted, "twice is once");
        let (_, evicted) = slots.open();
        assert_eq!(evicted, None, "the admitted one left a pending slot");
        let (_, evicted) = slots.open();
        assert_eq!(evicted, Some(ids[2]), "the oldest still pending");
        assert_eq!(slots.counts(), (3, 1));
        // One closed for room cannot be admitted any more.
        assert_eq!(slots.admit(ids[0]), Admission::Busy);
        slots.close(ids[0]);
        assert_eq!(slots.counts(), (3, 1));
        // Beyond the admitted share: busy, and still pending.
        assert_eq!(slots.admit(fourth), Admission::Admitted);
        let (late, _) = slots.open();
        assert_eq!(slots.admit(late), Admission::Busy);
        assert_eq!(slots.counts(), (3, 2));
        slots.close(ids[1]);
        assert_eq!(slots.admit(late), Admission::Admitted, "a slot given back");
        slots.close(late);
        slots.close(fourth);
        assert_eq!(slots.counts(), (2, 0));
        // Limits of zero are taken as one.
        let mut zero = Slots::new(0, 0);
        let (a, _) = zero.open();
        let (b, evicted) = zero.open();
        assert_eq!(evicted, Some(a));
        assert_eq!(zero.admit(b), Admission::Admitted);
    }

    #[test]
    fn a_few_refusals_are_logged_per_window_and_the_rest_counted() {
        let mut log = RefusalLog::default();
        let start = Instant::now();
        let verdicts: Vec<Verdict> = (0..8).map(|_| log.admit(start)).collect();
        let mut expected = vec![Verdict::Log { unlogged: 0 }; 5];
        expected.extend([Verdict::FirstUnlogged, Verdict::Unlogged, Verdict::Unlogged]);
        assert_eq!(verdicts, expected);
        // Within the window: still counted.
        assert_eq!(
            log.admit(start + LOG_WINDOW - Duration::from_secs(1)),
            Verdict::Unlogged
        );
        // A later window: the count of the last one, then logged again.
        let later = start + LOG_WINDOW;
        assert_eq!(log.admit(later), Verdict::Log { unlogged: 4 });
        assert_eq!(log.admit(later), Verdict::Log { unlogged: 0 });
        // A quiet window has nothing to report.
        assert_eq!(
            log.admit(later + 3 * LOG_WINDOW),
            Verdict::Log { unlogged: 0 }
        );
    }

    #[test]
    fn long_paths_are_cut() {
        assert_eq!(short_path("/x"), "/x");
        let long = format!("/{}", "é".repeat(100));
        let short = short_path(&long);
        assert!(short.ends_with('…') && short.len() <= LOGGED_PATH + '…'.len_utf8());
        assert!(long.starts_with(short.trim_end_matches('…')));
    }
}
