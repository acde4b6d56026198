//! Properties of `StreamIds` (Synapse's `MultiWriterIdGenerator`) over
//! random schedules: writes of this process reserve ids, take them from a
//! simulated PostgreSQL sequence, hand them in and persist them (or roll
//! back) in any order, sometimes losing what the sequence gave; another
//! writer takes ids from the same sequence and announces its position.
//!
//! After every step:
//!
//! - this writer's position never moves backwards, and no id of its own
//!   that the sequence gave out and that is not yet persisted is at or
//!   below it (whatever order transactions finish in);
//! - the stream's position (`current_token`) never moves backwards, and no
//!   id of any writer that is not yet persisted is at or below it;
//! - with this writer alone and no id lost, the stream's position equals
//!   the reference model: the highest id up to which every id the
//!   sequence gave out is persisted. So does this writer's position
//!   whenever persisting leaves nothing in flight; in between it may lag
//!   behind, as Synapse's does: `_add_persisted_position` raises it to the
//!   stream's position before following a run of persisted ids (5, 6, 7)
//!   to its end, and nothing is recomputed when a reservation comes back,
//!   so it catches up at the next id persisted.

use std::collections::BTreeSet;

use proptest::prelude::*;
use synapse_replication::positions::{Reservation, StreamIds};
use synapse_replication::wire::{InstanceName, Token};

#[derive(Clone, Debug)]
enum Op {
    /// A write of this process starts: it reserves.
    Reserve,
    /// The sequence gives one reserved write `n` ids (`nextval`).
    Fetch { pick: usize, n: i64 },
    /// A reserved write hands in what the sequence gave it; `lose`: it
    /// failed after the sequence gave ids, which are then never used.
    HandIn { pick: usize, lose: bool },
    /// A transaction ends (commit or rollback alike): one id of a write,
    /// or all of them.
    Persist { pick: usize, all: bool },
    /// The other writer takes an id.
    OtherTake,
    /// The other writer persisted all it took, and announces it.
    OtherAnnounce,
}

fn op(with_other: bool, with_losses: bool) -> impl Strategy<Value = Op> {
    let other_weight = if with_other { 2 } else { 0 };
    prop_oneof![
        3 => Just(Op::Reserve),
        3 => (any::<usize>(), 1..4i64).prop_map(|(pick, n)| Op::Fetch { pick, n }),
        3 => (any::<usize>(), prop::bool::weighted(if with_losses { 0.2 } else { 0.0 }))
            .prop_map(|(pick, lose)| Op::HandIn { pick, lose }),
        4 => (any::<usize>(), any::<bool>()).prop_map(|(pick, all)| Op::Persist { pick, all }),
        other_weight => Just(Op::OtherTake),
        other_weight => Just(Op::OtherAnnounce),
    ]
}

/// The simulated deployment: the sequence, and what happened to each id.
struct Sim {
    ids: StreamIds,
    other: InstanceName,
    /// The sequence's `last_value`.
    seq: i64,
    /// Writes that reserved and have not handed in, with what the
    /// sequence gave them so far.
    reserved: Vec<(Reservation, Vec<i64>)>,
    /// Writes handed in and not yet persisted, by write.
    unfinished: Vec<Vec<i64>>,
    /// Ids that will never be missing: persisted (or rolled back), or
    /// lost (no row will ever carry them).
    done: BTreeSet<i64>,
    /// Ids the other writer took and has not announced.
    other_pending: Vec<i64>,
    last_own: Token,
    last_current: Token,
    /// The last step persisted ids and left nothing in flight.
    persisted_idle: bool,
}

impl Sim {
    fn new(last_value: i64, with_other: bool) -> Sim {
        let me = InstanceName::from("me");
        let other = InstanceName::from("other");
        let mut writers = vec![me.clone()];
        let mut positions = Vec::new();
        if with_other {
            writers.push(other.clone());
            positions.push((other.clone(), Token(last_value)));
        }
        let loading = StreamIds::loading(me, writers, positions, Token(last_value));
        assert_eq!(loading.rows_from(), Some(Token(last_value)));
        let ids = loading.with_rows([]).unwrap();
        let start = ids.own_position();
        assert_eq!(start, Token(last_value));
        Sim {
            ids,
            other,
            seq: last_value,
            reserved: Vec::new(),
            unfinished: Vec::new(),
            done: (1..=last_value).collect(),
            other_pending: Vec::new(),
            last_own: start,
            last_current: start,
            persisted_idle: false,
        }
    }

    fn take(&mut self, n: i64) -> Vec<i64> {
        let ids = (self.seq + 1..=self.seq + n).collect();
        self.seq += n;
        ids
    }

    fn apply(&mut self, op: &Op) {
        self.persisted_idle = false;
        match *op {
            Op::Reserve => {
                let reservation = self.ids.reserve().unwrap();
                self.reserved.push((reservation, Vec::new()));
            }
            Op::Fetch { pick, n } => {
                if self.reserved.is_empty() {
                    return;
                }
                let at = pick % self.reserved.len();
                if self.reserved[at].1.is_empty() {
                    self.reserved[at].1 = self.take(n);
                }
            }
            Op::HandIn { pick, lose } => {
                if self.reserved.is_empty() {
                    return;
                }
                let (reservation, ids) = self.reserved.remove(pick % self.reserved.len());
                if lose {
                    self.ids.allocated(reservation, &[]).unwrap();
                    self.done.extend(ids);
                } else {
                    let tokens: Vec<Token> = ids.iter().copied().map(Token).collect();
                    self.ids.allocated(reservation, &tokens).unwrap();
                    if !ids.is_empty() {
                        self.unfinished.push(ids);
                    }
                }
            }
            Op::Persist { pick, all } => {
                if self.unfinished.is_empty() {
                    return;
                }
                let at = pick % self.unfinished.len();
                let finished: Vec<i64> = if all {
                    self.unfinished.remove(at)
                } else {
                    let write = &mut self.unfinished[at];
                    let one = write.remove(pick % write.len());
                    if write.is_empty() {
                        self.unfinished.remove(at);
                    }
                    vec![one]
                };
                let tokens: Vec<Token> = finished.iter().copied().map(Token).collect();
                let own = self.ids.persisted(&tokens).unwrap();
                assert_eq!(own, self.ids.own_position());
                self.done.extend(finished);
                self.persisted_idle = !self.ids.in_flight();
            }
            Op::OtherTake => {
                let id = self.take(1);
                self.other_pending.extend(id);
            }
            Op::OtherAnnounce => {
                if let Some(&highest) = self.other_pending.iter().max() {
                    self.done.extend(self.other_pending.drain(..));
                    let other = self.other.clone();
                    self.ids.advance(&other, Token(highest)).unwrap();
                }
            }
        }
    }

    /// The reference model: the highest id up to which every id the
    /// sequence gave out is done.
    fn persisted_prefix(&self) -> i64 {
        let mut prefix = 0;
        while prefix < self.seq && self.done.contains(&(prefix + 1)) {
            prefix += 1;
        }
        prefix
    }

    /// This writer's ids the sequence gave out that are not done.
    fn own_missing(&self) -> impl Iterator<Item = i64> + '_ {
        self.reserved
            .iter()
            .flat_map(|(_, ids)| ids.iter().copied())
            .chain(self.unfinished.iter().flatten().copied())
    }

    fn check(&mut self, exact: bool) -> Result<(), TestCaseError> {
        let own = self.ids.own_position();
        let current = self.ids.current_token();
        prop_assert!(own >= self.last_own, "own position went back");
        prop_assert!(current >= self.last_current, "stream position went back");
        self.last_own = own;
        self.last_current = current;
        if let Some(missing) = self.own_missing().min() {
            prop_assert!(
                own.0 < missing,
                "announced {own} with {missing} unpersisted"
            );
        }
        let prefix = self.persisted_prefix();
        prop_assert!(
            current.0 <= prefix,
            "stream at {current}, persisted to {prefix}"
        );
        if exact {
            prop_assert_eq!(current.0, prefix);
            // This writer's own position catches up with it only when
            // Synapse recomputes it (see below).
            if self.persisted_idle {
                prop_assert_eq!(own.0, prefix);
            }
        }
        Ok(())
    }
}

fn run(last_value: i64, ops: &[Op], with_other: bool, exact: bool) -> Result<(), TestCaseError> {
    let mut sim = Sim::new(last_value, with_other);
    for op in ops {
        sim.apply(op);
        sim.check(exact)?;
    }
    // Every write finishes: the position reaches the end of the sequence
    // (after one more write, as Synapse recomputes on persisting).
    while let Some((reservation, ids)) = sim.reserved.pop() {
        let tokens: Vec<Token> = ids.iter().copied().map(Token).collect();
        sim.ids.allocated(reservation, &tokens).unwrap();
        if !ids.is_empty() {
            sim.unfinished.push(ids);
        }
    }
    while !sim.unfinished.is_empty() {
        sim.apply(&Op::Persist { pick: 0, all: true });
        sim.check(exact)?;
    }
    sim.apply(&Op::OtherAnnounce);
    sim.apply(&Op::Reserve);
    sim.apply(&Op::Fetch { pick: 0, n: 1 });
    sim.apply(&Op::HandIn {
        pick: 0,
        lose: false,
    });
    sim.apply(&Op::Persist { pick: 0, all: true });
    sim.check(exact)?;
    prop_assert_eq!(sim.ids.own_position().0, sim.seq);
    if !with_other {
        // (With another writer, the stream waits for it to announce.)
        prop_assert_eq!(sim.ids.current_token().0, sim.seq);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn alone_the_position_is_the_persisted_prefix(
        last_value in 1..5i64,
        ops in prop::collection::vec(op(false, false), 0..80),
    ) {
        run(last_value, &ops, false, true)?;
    }

    #[test]
    fn the_position_never_passes_an_unpersisted_id(
        last_value in 1..5i64,
        ops in prop::collection::vec(op(true, true), 0..120),
    ) {
        run(last_value, &ops, true, false)?;
    }
}
