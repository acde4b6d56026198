//! The tokens a writer's live rows jumped over: never delivered, and not
//! yet settled by an answer of the writer's.

use crate::wire::Token;

/// How many ranges one writer keeps; the oldest gives way to a new one.
/// In multi-writer streams a writer's tokens jump over the others' at
/// every row, so ranges are opened all the time: settling them by
/// catch-ups would cost one per so many rows, and stall a follower whose
/// writer cannot be asked (a `caches` writer outside `instance_map`).
pub(super) const MAX_HOLES: usize = 32;

/// How many different rows one top keeps fingerprints of.
const PRINTS: usize = 4;

/// Ranges of tokens, each strictly between a row delivered live (or the
/// writer's position) below and a row delivered live above, that no row
/// was delivered at. Sorted, disjoint, none empty.
///
/// A writer publishes its rows in token order, so its own rows never land
/// there: one that does proves that the row above the range was forged,
/// and the rows the forgery jumped over are still to come. Keeping every
/// range until the writer's answer covers it (rather than the last one
/// only) is what makes any number of forged rows hide nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Holes {
    ranges: Vec<Hole>,
}

/// One range, and the rows delivered at its top.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hole {
    low: Token,
    high: Token,
    /// Fingerprints of the rows delivered at `high` (0: a free slot): the
    /// live row that opened the range first. A row there with another
    /// fingerprint is not a duplicate: the one that opened the range may
    /// have been forged at the very token of a row of the writer's.
    prints: [u64; PRINTS],
    /// The open batch the row that opened the range closed, if any: how
    /// many rows, and their fingerprint together ([`Batch`]).
    batch: Option<Batch>,
}

/// The `batch` rows a numbered row closed, delivered with it: if that
/// row was forged ahead of the writer's own, they are the writer's rows
/// at a token inside the range, and its answer gives them again, first
/// among the rows at that token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Batch {
    /// How many rows.
    pub(super) rows: usize,
    /// Their fingerprints, in order, mixed into one.
    pub(super) print: u64,
}

impl Holes {
    /// The range `token` lies strictly inside, if any.
    pub(super) fn around(&self, token: Token) -> Option<(Token, Token)> {
        self.ranges
            .iter()
            .find(|hole| hole.low < token && token < hole.high)
            .map(|hole| (hole.low, hole.high))
    }

    /// The fingerprints of the rows delivered at `token`, if it is the
    /// top of a range (0: a free slot).
    pub(super) fn prints_at(&self, token: Token) -> Option<&[u64]> {
        self.ranges
            .iter()
            .find(|hole| hole.high == token)
            .map(|hole| &hole.prints[..])
    }

    /// Records that a row `print` was delivered at `token`, if it is the
    /// top of a range: in a free slot, or over the last one (only a row
    /// of the writer's own answer comes with none free; the ones it
    /// replaces were forged).
    pub(super) fn note_print(&mut self, token: Token, print: u64) {
        if let Some(hole) = self.ranges.iter_mut().find(|hole| hole.high == token) {
            note(&mut hole.prints, print);
        }
    }

    /// The batch delivered at the top of the range `token` lies strictly
    /// inside, if any.
    pub(super) fn batch_around(&self, token: Token) -> Option<Batch> {
        self.ranges
            .iter()
            .find(|hole| hole.low < token && token < hole.high)
            .and_then(|hole| hole.batch)
    }

    /// Records that the row delivered live at `token`, the top of the
    /// last range, closed `batch`.
    pub(super) fn note_batch(&mut self, token: Token, batch: Batch) {
        if let Some(hole) = self.ranges.last_mut().filter(|hole| hole.high == token) {
            hole.batch = Some(batch);
        }
    }

    /// Forgets the batch of the range `token` lies inside: its rows were
    /// found again at `token`.
    pub(super) fn forget_batch_around(&mut self, token: Token) {
        if let Some(hole) = self
            .ranges
            .iter_mut()
            .find(|hole| hole.low < token && token < hole.high)
        {
            hole.batch = None;
        }
    }

    /// Whether `token` lies strictly inside a range.
    pub(super) fn contains(&self, token: Token) -> bool {
        self.around(token).is_some()
    }

    /// The bottom of the lowest range that starts below `token`: where a
    /// catch-up up to above it starts, so that the writer's answer covers
    /// every range below.
    pub(super) fn lowest_below(&self, token: Token) -> Option<Token> {
        self.ranges
            .first()
            .map(|hole| hole.low)
            .filter(|&low| low < token)
    }

    /// Records that a live row at `high` (fingerprint `print`) jumped over
    /// everything above `low`. Rows come above every range, so it goes
    /// last, and the oldest gives way beyond [`MAX_HOLES`]; nothing when
    /// nothing lies between.
    pub(super) fn open(&mut self, low: Token, high: Token, print: u64) {
        if high.0 <= low.0.saturating_add(1) {
            return;
        }
        // A row is delivered live only above every row delivered: `low`
        // is at or above the last range's top, and the ranges stay sorted.
        debug_assert!(self.ranges.last().is_none_or(|hole| hole.high <= low));
        let mut prints = [0; PRINTS];
        prints[0] = print;
        if self.ranges.len() >= MAX_HOLES {
            self.ranges.remove(0);
        }
        self.ranges.push(Hole {
            low,
            high,
            prints,
            batch: None,
        });
    }

    /// A row of the writer's own answer arrived at `token`: the answer
    /// started at or below every range below it, so nothing of the
    /// writer's lies in them below `token` that the answer did not carry.
    pub(super) fn settle(&mut self, token: Token) {
        self.ranges.retain(|hole| hole.high > token);
        for hole in &mut self.ranges {
            hole.low = hole.low.max(token);
        }
    }

    /// Forgets every range (the writer starts afresh).
    pub(super) fn clear(&mut self) {
        self.ranges = Vec::new();
    }
}

/// Records `print` among `prints` (0: a free slot), unless it is there:
/// in a free slot, or over the last.
pub(super) fn note(prints: &mut [u64], print: u64) {
    if prints.contains(&print) {
        return;
    }
    let free = prints.iter().position(|slot| *slot == 0);
    if let Some(slot) = free.or(prints.len().checked_sub(1)) {
        prints[slot] = print;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holes(ranges: &[(i64, i64)]) -> Holes {
        let mut holes = Holes::default();
        for &(low, high) in ranges {
            holes.open(Token(low), Token(high), 7);
        }
        holes
    }

    #[test]
    fn ranges_hold_only_what_was_jumped_over() {
        let h = holes(&[(0, 1), (1, 5), (5, 6), (6, 9)]);
        let ranges = |h: &Holes| -> Vec<(i64, i64)> {
            h.ranges
                .iter()
                .map(|hole| (hole.low.0, hole.high.0))
                .collect()
        };
        assert_eq!(ranges(&h), [(1, 5), (6, 9)]);
        for (token, inside) in [
            (1, false),
            (2, true),
            (4, true),
            (5, false),
            (6, false),
            (7, true),
            (9, false),
        ] {
            assert_eq!(h.contains(Token(token)), inside, "{token}");
        }
        assert_eq!(h.around(Token(8)), Some((Token(6), Token(9))));
        assert_eq!(h.lowest_below(Token(3)), Some(Token(1)));
        assert_eq!(h.lowest_below(Token(1)), None);
    }

    #[test]
    fn an_answer_settles_what_lies_below_its_rows() {
        let mut h = holes(&[(1, 5), (6, 9), (10, 20)]);
        h.settle(Token(7));
        assert_eq!(h.around(Token(8)), Some((Token(7), Token(9))));
        assert!(!h.contains(Token(7)));
        h.settle(Token(8));
        // (8, 9) holds nothing; its top is still a row to compare with.
        assert!(!h.contains(Token(8)) && h.prints_at(Token(9)).is_some());
        h.settle(Token(9));
        assert_eq!(h.around(Token(11)), Some((Token(10), Token(20))));
        assert!(h.prints_at(Token(9)).is_none());
        h.settle(Token(i64::MAX));
        assert!(h.ranges.is_empty());
    }

    #[test]
    fn a_writer_keeps_a_bounded_number_of_ranges() {
        let mut h = Holes::default();
        for i in 0..MAX_HOLES as i64 + 3 {
            h.open(Token(3 * i), Token(3 * i + 2), 7);
        }
        assert_eq!(h.ranges.len(), MAX_HOLES);
        // The oldest gave way.
        assert!(!h.contains(Token(7)));
        assert!(h.contains(Token(10)));
    }

    #[test]
    fn tops_keep_the_prints_of_the_rows_delivered_there() {
        let mut h = holes(&[(1, 5)]);
        assert_eq!(h.prints_at(Token(5)), Some(&[7, 0, 0, 0][..]));
        assert_eq!(h.prints_at(Token(4)), None, "not a top");
        for print in [8, 8, 9, 10] {
            h.note_print(Token(5), print);
        }
        assert_eq!(h.prints_at(Token(5)), Some(&[7, 8, 9, 10][..]));
        // Full: the last slot gives way.
        h.note_print(Token(5), 11);
        assert_eq!(h.prints_at(Token(5)), Some(&[7, 8, 9, 11][..]));
    }
}
