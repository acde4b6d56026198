//! The rows a writer delivered that its own answer has not yet proved:
//! what tells its row at a token from a forged one delivered there first.

use std::collections::VecDeque;

use crate::wire::Token;

/// How many rows a writer the configuration does not name keeps: it may
/// not be askable (a `caches` writer outside `instance_map`), and anyone
/// may make up such writers, so their record stays small.
pub(super) const UNASKED: usize = 16;

/// Every row delivered (token and fingerprint), oldest first, since the
/// writer last proved one. Above `known_from`, a token with no row
/// recorded had none delivered: a row there is not a duplicate, even
/// below the last row (the range a forged row jumped over, no longer
/// kept by [`Holes`](super::holes::Holes)).
///
/// Forged rows at the writer's next tokens one after the other jump over
/// nothing (no range of [`Holes`](super::holes::Holes) opens): the
/// writer's own rows there then come below the last row, and only the
/// fingerprints kept here say that they are not duplicates. So they are
/// kept until the writer proves them: a row delivered live that the
/// writer's answer holds is its own, published after every row of its
/// below (a writer publishes in token order), all of which were then
/// delivered or recognised here. What lies at or below it is no longer
/// needed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Record {
    rows: VecDeque<Entry>,
    /// Where following started, the last row proven, or the last row
    /// forgotten unproven, whichever is highest: at or below it, what was
    /// delivered is no longer known row by row.
    known_from: Token,
    /// Rows delivered live since the writer was last asked for a proof.
    since_asked: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    token: Token,
    print: u64,
    /// Delivered live, not from the writer's answer: only such a row,
    /// found again in an answer, proves what lies below it.
    live: bool,
}

impl Default for Record {
    fn default() -> Record {
        Record::starting_at(Token(i64::MIN))
    }
}

impl Record {
    /// An empty record of a writer followed from `token`.
    pub(super) fn starting_at(token: Token) -> Record {
        Record {
            rows: VecDeque::new(),
            known_from: token,
            since_asked: 0,
        }
    }

    /// Whether no row at `token` was delivered, as far as the record
    /// knows row by row (above `known_from`).
    pub(super) fn never_delivered(&self, token: Token) -> bool {
        token > self.known_from && self.rows.iter().all(|e| e.token != token)
    }

    /// The last token below `token` that a row was delivered at, or
    /// `known_from`: where the writer's rows up to `token` are fetched
    /// from when none was delivered there.
    pub(super) fn delivered_below(&self, token: Token) -> Token {
        self.rows
            .iter()
            .map(|e| e.token)
            .filter(|&t| t < token)
            .fold(self.known_from, Token::max)
    }

    /// Whether a row at `token` with fingerprint `print` was delivered
    /// (`Some(true)`), others at that token were but not it
    /// (`Some(false)`), or none at that token is recorded (`None`).
    pub(super) fn knows(&self, token: Token, print: u64) -> Option<bool> {
        let mut at = self.rows.iter().filter(|e| e.token == token);
        let first = at.next()?;
        Some(first.print == print || at.any(|e| e.print == print))
    }

    /// Records a row delivered at `token`. Beyond `keep` rows the oldest
    /// gives way (the writer has not answered for that long); returns
    /// whether one did.
    pub(super) fn note(&mut self, token: Token, print: u64, live: bool, keep: usize) -> bool {
        let full = self.rows.len() >= keep;
        if full {
            if let Some(forgotten) = self.rows.pop_front() {
                self.known_from = self.known_from.max(forgotten.token);
            }
        }
        self.rows.push_back(Entry { token, print, live });
        self.since_asked += usize::from(live);
        full
    }

    /// Whether `every` rows were delivered live since the writer was last
    /// asked.
    pub(super) fn due(&self, every: usize) -> bool {
        self.since_asked >= every
    }

    /// The last row delivered live: what to ask the writer for.
    pub(super) fn last_live(&self) -> Option<Token> {
        self.rows.iter().rev().find(|e| e.live).map(|e| e.token)
    }

    /// The writer was asked for a proof.
    pub(super) fn asked(&mut self) {
        self.since_asked = 0;
    }

    /// The writer's answer holds row `print` at `token`. If a row
    /// delivered live there was it, everything up to `token` is proven
    /// and forgotten; returns whether.
    pub(super) fn prove(&mut self, token: Token, print: u64) -> bool {
        let proven = self
            .rows
            .iter()
            .any(|e| e.live && e.token == token && e.print == print);
        if proven {
            self.rows.retain(|e| e.token > token);
            self.known_from = self.known_from.max(token);
        }
        proven
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_recognised_by_token_and_print() {
        let mut r = Record::default();
        assert_eq!(r.knows(Token(1), 5), None);
        r.note(Token(1), 5, true, 8);
        r.note(Token(1), 6, false, 8);
        assert_eq!(r.knows(Token(1), 5), Some(true));
        assert_eq!(r.knows(Token(1), 6), Some(true));
        assert_eq!(r.knows(Token(1), 7), Some(false));
        assert_eq!(r.knows(Token(2), 5), None);
    }

    #[test]
    fn the_oldest_gives_way_only_beyond_what_is_kept() {
        let mut r = Record::default();
        for token in 1..=4 {
            assert!(!r.note(Token(token), 100, true, 4));
        }
        assert!(r.note(Token(5), 100, true, 4));
        assert_eq!((r.rows.len(), r.knows(Token(1), 100)), (4, None));
        assert_eq!(r.knows(Token(2), 100), Some(true));
    }

    #[test]
    fn a_proof_is_asked_for_the_last_live_row_every_so_many() {
        let mut r = Record::default();
        r.note(Token(1), 11, true, 8);
        r.note(Token(2), 12, true, 8);
        assert!(!r.due(3));
        r.note(Token(3), 13, true, 8);
        r.note(Token(4), 14, false, 8);
        assert!(r.due(3));
        assert_eq!(r.last_live(), Some(Token(3)));
        r.asked();
        assert!(!r.due(3));
    }

    #[test]
    fn tokens_with_no_row_above_what_is_known_were_never_delivered() {
        let mut r = Record::starting_at(Token(10));
        for token in [12, 15] {
            r.note(Token(token), 100, true, 2);
        }
        assert!(!r.never_delivered(Token(10)), "where following started");
        assert!(r.never_delivered(Token(11)) && r.never_delivered(Token(13)));
        assert!(!r.never_delivered(Token(12)));
        assert_eq!(r.delivered_below(Token(14)), Token(12));
        assert_eq!(r.delivered_below(Token(11)), Token(10));
        // Forgetting 12 unproven: what lies at or below it is no longer
        // known.
        r.note(Token(17), 100, true, 2);
        assert!(!r.never_delivered(Token(11)) && r.never_delivered(Token(16)));
        // Proving 17: nor what lies below it.
        assert!(r.prove(Token(17), 100));
        assert!(!r.never_delivered(Token(16)) && r.never_delivered(Token(18)));
    }

    #[test]
    fn only_a_live_row_found_in_an_answer_proves_what_lies_below() {
        let mut r = Record::default();
        for (token, print, live) in [(1, 11, true), (3, 13, false), (5, 15, true), (7, 17, true)] {
            r.note(Token(token), print, live, 8);
        }
        assert!(!r.prove(Token(3), 13), "fetched, not live");
        assert!(!r.prove(Token(5), 99), "another row");
        assert!(r.prove(Token(5), 15));
        assert_eq!(r.rows.len(), 1);
        assert_eq!(r.knows(Token(1), 11), None);
        assert_eq!(r.knows(Token(7), 17), Some(true));
    }
}
