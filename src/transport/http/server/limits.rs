//! What one peer may hold of an [`HttpServer`](super::HttpServer), and
//! how much of its refusals reaches the log: pure bookkeeping, with the
//! time passed in.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Refusals logged per window; the rest are counted.
pub(super) const LOG_BURST: u32 = 5;

/// The window [`LOG_BURST`] counts in.
pub(super) const LOG_WINDOW: Duration = Duration::from_secs(60);

/// The longest path logged, in bytes; longer ones are cut, with `…`.
pub(super) const LOGGED_PATH: usize = 80;

/// The connections open per peer address, each at most `max`.
#[derive(Debug)]
pub(super) struct PeerSlots {
    max: usize,
    open: HashMap<IpAddr, usize>,
}

impl PeerSlots {
    /// At most `max` connections per address (at least one).
    pub(super) fn new(max: usize) -> PeerSlots {
        PeerSlots {
            max: max.max(1),
            open: HashMap::new(),
        }
    }

    /// Takes a slot for `peer` (an IPv4 address mapped into IPv6 counts
    /// as the IPv4 one), or says `false` if it holds all of its own.
    pub(super) fn take(&mut self, peer: IpAddr) -> bool {
        let open = self.open.entry(peer.to_canonical()).or_insert(0);
        if *open >= self.max {
            return false;
        }
        *open += 1;
        true
    }

    /// Gives back a slot [`take`](PeerSlots::take) gave `peer`.
    pub(super) fn release(&mut self, peer: IpAddr) {
        let peer = peer.to_canonical();
        if let Some(open) = self.open.get_mut(&peer) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                self.open.remove(&peer);
            }
        }
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
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    #[test]
    fn each_peer_gets_its_own_slots() {
        let mut slots = PeerSlots::new(2);
        let a = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
        let b = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert!(slots.take(a) && slots.take(a));
        assert!(!slots.take(a), "a third for one peer");
        // The same address, mapped into IPv6.
        assert!(!slots.take(IpAddr::V6(Ipv4Addr::new(127, 0, 0, 2).to_ipv6_mapped())));
        assert!(slots.take(b), "another peer");
        slots.release(a);
        assert!(slots.take(a), "a slot given back");
        slots.release(IpAddr::V6(Ipv6Addr::LOCALHOST));
        slots.release(b);
        slots.release(b);
        assert!(slots.take(b) && slots.take(b) && !slots.take(b));
        // A limit of zero is taken as one.
        let mut zero = PeerSlots::new(0);
        assert!(zero.take(a) && !zero.take(a));
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
