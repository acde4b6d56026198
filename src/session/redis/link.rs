//! One Redis connection's state inside a session: the replies it waits
//! for, its buffers, and the checks run on every message.

use std::collections::VecDeque;
use std::fmt;
use std::time::Instant;

use bytes::BytesMut;

use crate::resp::{self, Frame};
use crate::wire::{CommandKind, prefix};

use super::{RedisError, RedisSession, RedisSessionConfig};

/// A reply a link waits for, in the order the commands went out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Expect {
    Hello,
    Auth,
    Select,
    SetName,
    Subscribe,
    Ping,
    Publish(CommandKind),
}

/// One connection to Redis. Its [`Debug`] output shows the sizes of its
/// buffers, never their bytes (`AUTH` and published lines are in them).
pub(super) struct Link {
    pub(super) decoder: resp::RespDecoder,
    pub(super) input: BytesMut,
    pub(super) out: BytesMut,
    /// Replies owed, run-length encoded (a burst of publishes is one entry).
    pub(super) expect: VecDeque<(Expect, u64)>,
    /// Handshake replies still owed (the link is usable once none are).
    pub(super) handshake: usize,
    /// Subscription confirmations still owed.
    pub(super) unconfirmed: usize,
    pub(super) last_ping: Instant,
    /// The last time something arrived, or replies began to be owed.
    pub(super) last_progress: Instant,
    pub(super) failed: bool,
    /// Why the session gave it up, once `failed`.
    pub(super) failure: Option<super::RedisError>,
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link")
            .field("decoder", &self.decoder)
            .field("input_bytes", &self.input.len())
            .field("unsent_bytes", &self.out.len())
            .field("expect", &self.expect)
            .field("handshake", &self.handshake)
            .field("unconfirmed", &self.unconfirmed)
            .field("last_ping", &self.last_ping)
            .field("last_progress", &self.last_progress)
            .field("failed", &self.failed)
            .finish()
    }
}

impl Link {
    pub(super) fn new(limits: resp::Limits, now: Instant) -> Link {
        Link {
            decoder: resp::RespDecoder::with_limits(limits),
            input: BytesMut::new(),
            // Also the size of the buffers that follow each chunk taken by
            // `poll_transmit` (BytesMut keeps the first capacity as a hint):
            // a burst of publishes fills them without regrowing from zero.
            out: BytesMut::with_capacity(64 << 10),
            expect: VecDeque::new(),
            handshake: 0,
            unconfirmed: 0,
            last_ping: now,
            last_progress: now,
            failed: false,
            failure: None,
        }
    }

    pub(super) fn owe(&mut self, expect: Expect, now: Instant) {
        if self.expect.is_empty() {
            self.last_progress = now;
        }
        match self.expect.back_mut() {
            Some((last, count)) if *last == expect => *count += 1,
            _ => self.expect.push_back((expect, 1)),
        }
    }

    pub(super) fn take(&mut self) -> Option<Expect> {
        let (expect, count) = self.expect.front_mut()?;
        let expect = *expect;
        *count -= 1;
        if *count == 0 {
            self.expect.pop_front();
        }
        Some(expect)
    }

    pub(super) fn deadline(&self, options: &RedisSessionConfig) -> Option<Instant> {
        if self.failed {
            return None;
        }
        let interval = options.ping_interval.max(RedisSessionConfig::MIN_TIMER);
        let ping = self.last_ping.checked_add(interval);
        let silence = if self.expect.is_empty() {
            None
        } else {
            let timeout = options.ping_timeout.max(RedisSessionConfig::MIN_TIMER);
            self.last_progress.checked_add(timeout)
        };
        match (ping, silence) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

impl Link {
    /// `RDATA`s and `POSITION`s published on this link and not yet
    /// answered: Redis may still run them (and echo them).
    pub(super) fn unanswered_echoes(&self) -> u64 {
        self.expect
            .iter()
            .filter(|(expect, _)| {
                matches!(
                    expect,
                    Expect::Publish(CommandKind::Rdata | CommandKind::Position)
                )
            })
            .map(|(_, count)| *count)
            .sum()
    }
}

/// What this process published of `RDATA` and `POSITION`, and what came
/// back naming it as their sender, since its subscription was confirmed.
/// Redis echoes each publish at most once to the one subscription, so an
/// echo beyond what was published is another process using this name.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct EchoTally {
    /// Publishes that may come back: those since the subscription, plus
    /// those still unanswered when it was confirmed (Redis may have run
    /// them after the `SUBSCRIBE`).
    pub(super) published: u64,
    /// Echoes of this process's own publishes.
    pub(super) echoed: u64,
    /// Unanswered publishes of links given up since the last
    /// subscription (Redis may still run what reached it).
    pub(super) unanswered_lost: u64,
}

/// A warning logged at most once per [`RedisSession::WARNING_INTERVAL`];
/// those in between are counted, and the next one logged says how many.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RateLimited {
    pub(super) last: Option<Instant>,
    pub(super) suppressed: u64,
}

impl RateLimited {
    /// Whether to log at `now`: `Some(warnings suppressed since the last
    /// one logged)`, or `None` (counted as suppressed).
    pub(super) fn allow(&mut self, now: Instant) -> Option<u64> {
        if self.last.is_some_and(|last| {
            now.saturating_duration_since(last) < RedisSession::WARNING_INTERVAL
        }) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// The subscriber's handshake state, for [`RedisSession::is_ready`].
pub(super) fn usable(link: Option<&Link>) -> bool {
    link.is_some_and(|link| !link.failed && link.handshake == 0 && link.unconfirmed == 0)
}

/// How every `POSITION` line starts.
const POSITION: &[u8] = b"POSITION ";

/// Whether `line` is a `POSITION` line.
pub(super) fn is_position(line: &[u8]) -> bool {
    line.starts_with(POSITION)
}

/// The kind of `line` if it is an `RDATA` or `POSITION` sent by `own`.
/// (Unless every command is reported, the decoder checks `RDATA` and
/// `POSITION` lines itself, as this does, from the stream's name it reads
/// anyway: its tests hold it to the same reading.)
pub(super) fn own_echo(line: &[u8], own: &[u8]) -> Option<CommandKind> {
    let (kind, rest) = if let Some(rest) = line.strip_prefix(b"RDATA ") {
        (CommandKind::Rdata, rest)
    } else if let Some(rest) = line.strip_prefix(POSITION) {
        (CommandKind::Position, rest)
    } else {
        return None;
    };
    let stream_end = first_space(rest)?;
    let rest = rest.get(stream_end + 1..)?;
    (prefix::starts_with(rest, own) && rest.get(own.len()) == Some(&b' ')).then_some(kind)
}

/// The offset of the first space in `bytes`, eight bytes at a time: this
/// runs for every message, ahead of the decoder.
fn first_space(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let mut chunks = bytes.chunks_exact(8);
    let mut base = 0;
    for chunk in &mut chunks {
        let Ok(chunk) = <[u8; 8]>::try_from(chunk) else {
            break;
        };
        let word = u64::from_le_bytes(chunk) ^ (ONES * u64::from(b' '));
        // The lowest high bit set marks the first zero byte (a borrow only
        // runs upwards), that is the first space.
        let spaces = word.wrapping_sub(ONES) & !word & (ONES << 7);
        if spaces != 0 {
            return Some(base + spaces.trailing_zeros() as usize / 8);
        }
        base += 8;
    }
    let tail = chunks.remainder();
    tail.iter().position(|b| *b == b' ').map(|at| base + at)
}

pub(super) fn is_ok(frame: &Frame) -> bool {
    matches!(frame, Frame::SimpleString(text) if text.as_ref() == b"OK")
}

pub(super) fn unexpected(expect: Expect, frame: &Frame) -> RedisError {
    let text = format!("{frame:?}");
    let cut: String = text.chars().take(64).collect();
    RedisError::Unexpected(format!("{cut} in answer to {expect:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_space_agrees_with_a_plain_search() {
        // Bytes next to a space's value, and with its bits plus the high
        // bit, around spaces at every offset of a word.
        let text = b"ab\xa0!\x1fcdefgh ijklmnopqrstuvwxyz0123456\x20789 \xe2\x80\x82x";
        for start in 0..text.len() {
            for end in start..=text.len() {
                let part = &text[start..end];
                let plain = part.iter().position(|b| *b == b' ');
                assert_eq!(first_space(part), plain, "{part:?}");
            }
        }
    }

    #[test]
    fn own_echoes_are_recognised_by_their_instance() {
        let own = b"rust_worker1";
        let echo = |line: &[u8]| own_echo(line, own);
        assert_eq!(
            echo(b"RDATA events rust_worker1 5 [1]"),
            Some(CommandKind::Rdata)
        );
        assert_eq!(
            echo(b"POSITION un_partial_stated_event rust_worker1 4 5"),
            Some(CommandKind::Position)
        );
        assert_eq!(echo(b"RDATA events rust_worker12 5 [1]"), None);
        assert_eq!(echo(b"RDATA events master 5 [1]"), None);
        assert_eq!(echo(b"RDATA rust_worker1 x 5 [1]"), None);
        assert_eq!(echo(b"USER_SYNC rust_worker1 @a:x D start 1"), None);
        assert_eq!(echo(b"RDATA eventsrust_worker1"), None);
    }
}
