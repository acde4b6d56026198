//! Room for the writers the configuration does not name: which of them
//! to forget when the follower tracks as many as it may, and where the
//! ones it forgot stood.

use std::collections::{HashMap, VecDeque};

use crate::wire::{InstanceName, StreamName, Token};

/// How many forgotten writers' resume points are remembered: a writer
/// heard of again is caught up from there instead of starting afresh.
pub(super) const REMEMBERED: usize = 16_384;

type Pair = (StreamName, InstanceName);

/// The writers the configuration does not name, in the order they were
/// admitted, and the resume points of those forgotten.
#[derive(Debug, Default)]
pub(super) struct Room {
    /// Tracked pairs, oldest first, each with the clock when it was
    /// queued: the first not heard from since is forgotten first; one
    /// heard from since goes to the back (a second chance). Entries of
    /// pairs no longer tracked are dropped as they come up.
    queue: VecDeque<(u64, Pair)>,
    /// Resume points of forgotten writers, at most [`REMEMBERED`], each
    /// with the number it was remembered under.
    forgotten: HashMap<Pair, (Token, u64)>,
    /// The keys of `forgotten`, oldest first, with that number: an entry
    /// whose number no longer matches was recalled (or remembered again
    /// since), and is skipped.
    order: VecDeque<(Pair, u64)>,
    /// Numbers remembered so far.
    remembered: u64,
}

impl Room {
    /// Queues a pair admitted, or looked at and kept, at `clock`.
    pub(super) fn queue(&mut self, clock: u64, stream: StreamName, writer: InstanceName) {
        self.queue.push_back((clock, (stream, writer)));
    }

    /// The oldest queued pair and when it was queued.
    pub(super) fn next(&mut self) -> Option<(u64, StreamName, InstanceName)> {
        self.queue
            .pop_front()
            .map(|(clock, (stream, writer))| (clock, stream, writer))
    }

    /// How many entries are queued (pairs no longer tracked included).
    pub(super) fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Drops the queued entries of pairs `tracked` says are gone.
    pub(super) fn compact(&mut self, tracked: impl Fn(&StreamName, &InstanceName) -> bool) {
        self.queue
            .retain(|(_, (stream, writer))| tracked(stream, writer));
    }

    /// Remembers where a forgotten writer stood; the oldest remembered
    /// gives way beyond [`REMEMBERED`].
    pub(super) fn remember(&mut self, stream: StreamName, writer: InstanceName, token: Token) {
        let key = (stream, writer);
        self.remembered += 1;
        self.forgotten.insert(key.clone(), (token, self.remembered));
        self.order.push_back((key, self.remembered));
        while self.forgotten.len() > REMEMBERED {
            let Some((oldest, number)) = self.order.pop_front() else {
                break;
            };
            if self
                .forgotten
                .get(&oldest)
                .is_some_and(|(_, n)| *n == number)
            {
                self.forgotten.remove(&oldest);
            }
        }
        if self.order.len() > 2 * REMEMBERED {
            // Entries of writers recalled since: dropped all at once, so
            // that each costs once.
            let forgotten = &self.forgotten;
            self.order
                .retain(|(key, number)| forgotten.get(key).is_some_and(|(_, n)| n == number));
        }
    }

    /// Where a forgotten writer stood, if remembered (then forgotten here:
    /// it is tracked again).
    pub(super) fn recall(&mut self, stream: &StreamName, writer: &InstanceName) -> Option<Token> {
        if self.forgotten.is_empty() {
            return None;
        }
        let key = (stream.clone(), writer.clone());
        self.forgotten.remove(&key).map(|(token, _)| token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(i: usize) -> (StreamName, InstanceName) {
        (StreamName::Caches, InstanceName::from(format!("w{i}")))
    }

    #[test]
    fn pairs_come_out_in_the_order_queued() {
        let mut room = Room::default();
        for i in 0..3 {
            let (stream, writer) = pair(i);
            room.queue(i as u64, stream, writer);
        }
        room.compact(|_, writer| writer.as_str() != "w1");
        assert_eq!(room.queued(), 2);
        assert_eq!(
            room.next().map(|(clock, _, w)| (clock, w)),
            Some((0, pair(0).1))
        );
        assert_eq!(
            room.next().map(|(clock, _, w)| (clock, w)),
            Some((2, pair(2).1))
        );
        assert_eq!(room.next(), None);
    }

    #[test]
    fn forgotten_writers_are_recalled_once_and_bounded() {
        let mut room = Room::default();
        for i in 0..REMEMBERED + 10 {
            let (stream, writer) = pair(i);
            room.remember(stream, writer, Token(i as i64));
        }
        assert_eq!(room.forgotten.len(), REMEMBERED);
        assert_eq!(room.order.len(), REMEMBERED);
        let (stream, writer) = pair(3);
        assert_eq!(room.recall(&stream, &writer), None, "the oldest gave way");
        let (stream, writer) = pair(20);
        assert_eq!(room.recall(&stream, &writer), Some(Token(20)));
        assert_eq!(room.recall(&stream, &writer), None, "tracked again");
        // Recalled and forgotten over and over: the order stays bounded.
        for round in 0..3 * REMEMBERED {
            let (stream, writer) = pair(round % 7);
            room.remember(stream.clone(), writer.clone(), Token(1));
            assert_eq!(room.recall(&stream, &writer), Some(Token(1)));
        }
        assert!(
            room.order.len() <= 2 * REMEMBERED + 1,
            "{}",
            room.order.len()
        );
        assert!(room.forgotten.len() <= REMEMBERED);
    }
}
