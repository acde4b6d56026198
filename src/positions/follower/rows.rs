//! [`Rows`]: the rows of one token, one inline or a batch.

use std::fmt;
use std::mem;

use crate::wire::RawRow;

/// The rows of one token, in the order written: one row inline (the common
/// case: no allocation per row), or a batch. Use it as a slice (it derefs
/// to `[RawRow]`), iterate it, or take a `Vec` with [`Rows::into_vec`]; it
/// compares equal to a `Vec` of the same rows.
#[derive(Clone, PartialEq, Eq)]
pub struct Rows(RowsRepr);

#[derive(Clone, PartialEq, Eq)]
enum RowsRepr {
    One(RawRow),
    Many(Vec<RawRow>),
}

impl Rows {
    /// One row.
    pub fn one(row: RawRow) -> Rows {
        Rows(RowsRepr::One(row))
    }

    /// The rows as a `Vec`.
    pub fn into_vec(self) -> Vec<RawRow> {
        match self.0 {
            RowsRepr::One(row) => vec![row],
            RowsRepr::Many(rows) => rows,
        }
    }

    pub(super) fn push(&mut self, row: RawRow) {
        match &mut self.0 {
            RowsRepr::Many(rows) => rows.push(row),
            RowsRepr::One(_) => {
                let RowsRepr::One(first) =
                    mem::replace(&mut self.0, RowsRepr::Many(Vec::with_capacity(2)))
                else {
                    return;
                };
                if let RowsRepr::Many(rows) = &mut self.0 {
                    rows.push(first);
                    rows.push(row);
                }
            }
        }
    }
}

impl From<Vec<RawRow>> for Rows {
    fn from(rows: Vec<RawRow>) -> Rows {
        Rows(RowsRepr::Many(rows))
    }
}

impl std::ops::Deref for Rows {
    type Target = [RawRow];

    fn deref(&self) -> &[RawRow] {
        match &self.0 {
            RowsRepr::One(row) => std::slice::from_ref(row),
            RowsRepr::Many(rows) => rows,
        }
    }
}

impl fmt::Debug for Rows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl From<Rows> for Vec<RawRow> {
    fn from(rows: Rows) -> Vec<RawRow> {
        rows.into_vec()
    }
}

impl PartialEq<Vec<RawRow>> for Rows {
    fn eq(&self, other: &Vec<RawRow>) -> bool {
        **self == other[..]
    }
}

impl PartialEq<Rows> for Vec<RawRow> {
    fn eq(&self, other: &Rows) -> bool {
        self[..] == **other
    }
}

impl<'a> IntoIterator for &'a Rows {
    type Item = &'a RawRow;
    type IntoIter = std::slice::Iter<'a, RawRow>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl IntoIterator for Rows {
    type Item = RawRow;
    type IntoIter = std::vec::IntoIter<RawRow>;

    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}

#[cfg(test)]
mod rows_tests {
    use super::*;
    use crate::wire::RawRow;

    fn row(n: u32) -> RawRow {
        RawRow::new(bytes::Bytes::from(format!("[{n}]"))).expect("valid JSON")
    }

    #[test]
    fn rows_hold_one_inline_and_grow_into_a_batch() {
        let mut rows = Rows::one(row(1));
        assert_eq!(rows.len(), 1);
        assert_eq!(rows, vec![row(1)]);
        rows.push(row(2));
        rows.push(row(3));
        assert_eq!(&rows[..], &[row(1), row(2), row(3)][..]);
        assert_eq!(vec![row(1), row(2), row(3)], rows);
        assert_eq!(
            format!("{rows:?}"),
            format!("{:?}", [row(1), row(2), row(3)])
        );
        let borrowed: Vec<&RawRow> = (&rows).into_iter().collect();
        assert_eq!(borrowed.len(), 3);
        assert_eq!(rows.clone().into_vec(), vec![row(1), row(2), row(3)]);
        assert_eq!(rows.into_iter().count(), 3);
        assert_eq!(Vec::from(Rows::from(vec![row(4)])), vec![row(4)]);
    }
}
