//! [`Backoff`]: exponential backoff with jitter.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// Exponential backoff with jitter, for reconnecting and retrying.
///
/// Delays double from `initial` up to `max`; each is drawn uniformly from
/// its upper half (`[d/2, d]`), so that many clients cut off at once do not
/// come back at once. The randomness is a xorshift generator seeded from
/// the clock and a process-wide counter (no `rand` dependency; it need not
/// be unpredictable, only different per client).
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    attempt: u32,
    state: u64,
}

impl Backoff {
    /// Backoff from `initial` doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos() as u64);
        let count = COUNTER.fetch_add(1, Ordering::Relaxed);
        let seed = nanos ^ count.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Backoff {
            initial,
            max: max.max(initial),
            attempt: 0,
            state: seed | 1,
        }
    }

    /// The next delay; each call doubles the next one, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let base = self
            .initial
            .saturating_mul(1u32.checked_shl(self.attempt).unwrap_or(u32::MAX))
            .min(self.max);
        self.attempt = self.attempt.saturating_add(1).min(31);
        let half = base / 2;
        let span = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let jitter = if span == 0 {
            0
        } else {
            // A delay past u64 nanoseconds (585 years) gets less jitter.
            self.next_random() % span.saturating_add(1)
        };
        half.saturating_add(Duration::from_nanos(jitter))
    }

    /// Back to the initial delay (after a connection that lasted).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_jitter_and_caps() {
        let ms = Duration::from_millis;
        let mut backoff = Backoff::new(ms(100), ms(5000));
        let mut previous_cap = ms(0);
        for attempt in 0..12 {
            let cap = (ms(100) * 2u32.pow(attempt)).min(ms(5000));
            let delay = backoff.next_delay();
            assert!(delay >= cap / 2 && delay <= cap, "{attempt}: {delay:?}");
            assert!(cap >= previous_cap);
            previous_cap = cap;
        }
        backoff.reset();
        assert!(backoff.next_delay() <= ms(100));
    }

    #[test]
    fn two_backoffs_differ() {
        let ms = Duration::from_millis;
        let mut a = Backoff::new(ms(1000), ms(5000));
        let mut b = Backoff::new(ms(1000), ms(5000));
        let a: Vec<_> = (0..4).map(|_| a.next_delay()).collect();
        let b: Vec<_> = (0..4).map(|_| b.next_delay()).collect();
        assert_ne!(a, b);
    }
}
