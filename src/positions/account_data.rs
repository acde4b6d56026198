//! The writer's side of the `account_data` stream, sans-IO: the rows it
//! puts on the wire, the catch-up page Synapse's writer builds from its
//! three tables, and what a change of `m.ignored_user_list` does to
//! `ignored_users`.
//!
//! As Synapse 1.163.2's `AccountDataStream` (`replication/tcp/streams/_base.py`)
//! and `AccountDataWorkerStore`, `TagsWorkerStore`
//! (`storage/databases/main/account_data.py`, `tags.py`). The database
//! side is `transport::postgres::AccountDataStore` (feature `postgres`).

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::wire::{JsonError, RawRow, Token};

use super::{CatchUpPage, CatchUpRequest};

/// The `data_type` of a tag row: Synapse's `AccountDataTypes.TAG`.
pub const TAG_DATA_TYPE: &str = "m.tag";

/// The account-data type whose content lists the users a user ignores
/// (`AccountDataTypes.IGNORED_USER_LIST`), kept also in `ignored_users`.
pub const IGNORED_USER_LIST: &str = "m.ignored_user_list";

/// One row of the `account_data` stream: a user's global item
/// (`room_id` `None`), a per-room item, or a room's tags (`data_type`
/// [`TAG_DATA_TYPE`]), at the id of its table row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountDataRow {
    /// The row's token (`stream_id` of its table row).
    pub stream_id: Token,
    /// `user_id`.
    pub user_id: String,
    /// `room_id`: `None` for global account data.
    pub room_id: Option<String>,
    /// `account_data_type`, or [`TAG_DATA_TYPE`] for tags.
    pub data_type: String,
}

impl AccountDataRow {
    /// The row on the wire, byte for byte as Synapse's writer sends it:
    /// `[user_id, room_id, data_type]`, `room_id` `null` for global data.
    pub fn to_raw_row(&self) -> Result<RawRow, JsonError> {
        #[derive(Serialize)]
        struct Row<'a>(&'a str, Option<&'a str>, &'a str);
        RawRow::from_value(&Row(
            &self.user_id,
            self.room_id.as_deref(),
            &self.data_type,
        ))
    }
}

/// Which of the stream's three tables a catch-up query reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccountDataTable {
    /// `account_data` (`get_updated_global_account_data`).
    Global,
    /// `room_account_data` (`get_updated_room_account_data`).
    Room,
    /// `room_tags_revisions` (`get_all_updated_tags`).
    Tags,
}

/// One query of a catch-up page: `table`'s rows with `from < stream_id <=
/// to`, by `stream_id`, at most `limit`. Of every writer: Synapse's
/// queries do not look at `instance_name` (its writer leaves it `NULL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccountDataQuery {
    /// The table.
    pub table: AccountDataTable,
    /// Exclusive.
    pub from: Token,
    /// Inclusive.
    pub to: Token,
    /// The most rows.
    pub limit: usize,
}

/// The page Synapse's writer answers an `account_data` catch-up with,
/// built from three queries run one after the other, each bounded by what
/// the one before found (`AccountDataStream._update_function` through
/// `Stream.get_updates_since`):
///
/// 1. global rows in `(from, to]`; if `limit` came back, `to` becomes the
///    last one's id and the page is `limited`;
/// 2. room rows in `(from, to]`, the same;
/// 3. tag revisions in `(from, to]`, the same;
///
/// then every row at or below the final `to`, merged by id (room rows
/// before global before tags at one id, as `heapq.merge` orders them),
/// `upto_token` the final `to`. A request with `from == to` asks nothing
/// and is an empty page at `to`; with `from > to` every query is empty.
///
/// Sans-IO: run each [`next_query`](Self::next_query), hand its rows to
/// [`answer`](Self::answer), then [`finish`](Self::finish).
///
/// ```
/// use synapse_replication::positions::{
///     AccountDataPage, AccountDataRow, AccountDataTable, CatchUpId, CatchUpRequest,
/// };
/// use synapse_replication::wire::{InstanceName, StreamName, Token};
///
/// let request = CatchUpRequest {
///     id: CatchUpId::new(1),
///     stream: StreamName::AccountData,
///     writer: InstanceName::from("rust_account_data"),
///     from: Token(0),
///     to: Token(10),
/// };
/// let row = |id, room: Option<&str>, data_type: &str| AccountDataRow {
///     stream_id: Token(id),
///     user_id: "@alice:example.com".into(),
///     room_id: room.map(Into::into),
///     data_type: data_type.into(),
/// };
/// let mut page = AccountDataPage::new(&request, 2);
/// while let Some(query) = page.next_query() {
///     page.answer(match query.table {
///         AccountDataTable::Global => vec![row(3, None, "m.direct"), row(5, None, "m.push")],
///         AccountDataTable::Room => vec![row(4, Some("!r:example.com"), "org.x")],
///         AccountDataTable::Tags => vec![],
///     });
/// }
/// let page = page.finish()?;
/// assert_eq!((page.upto, page.limited, page.updates.len()), (Token(5), true, 3));
/// assert_eq!(page.updates[1].1.as_str(), r#"["@alice:example.com","!r:example.com","org.x"]"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct AccountDataPage {
    from: Token,
    to: Token,
    limit: usize,
    limited: bool,
    /// The next table to read; `None` once all three are read.
    next: Option<AccountDataTable>,
    global: Vec<AccountDataRow>,
    room: Vec<AccountDataRow>,
    tags: Vec<AccountDataRow>,
}

impl AccountDataPage {
    /// A page for `request`, `limit` rows a query (Synapse's
    /// [`TARGET_ROW_COUNT`](super::TARGET_ROW_COUNT)).
    pub fn new(request: &CatchUpRequest, limit: usize) -> AccountDataPage {
        AccountDataPage {
            from: request.from,
            to: request.to,
            limit,
            limited: false,
            // `get_updates_since`: nothing asked when from == to.
            next: (request.from != request.to).then_some(AccountDataTable::Global),
            global: Vec::new(),
            room: Vec::new(),
            tags: Vec::new(),
        }
    }

    /// The next query to run, or `None` when the page is complete.
    #[must_use]
    pub fn next_query(&self) -> Option<AccountDataQuery> {
        self.next.map(|table| AccountDataQuery {
            table,
            from: self.from,
            to: self.to,
            limit: self.limit,
        })
    }

    /// The rows the last [`next_query`](Self::next_query) returned, in
    /// `stream_id` order. Ignored once the page is complete.
    pub fn answer(&mut self, rows: Vec<AccountDataRow>) {
        let Some(table) = self.next else {
            return;
        };
        if rows.len() >= self.limit {
            if let Some(last) = rows.last() {
                self.to = last.stream_id;
                self.limited = true;
            }
        }
        let (kept, next) = match table {
            AccountDataTable::Global => (&mut self.global, Some(AccountDataTable::Room)),
            AccountDataTable::Room => (&mut self.room, Some(AccountDataTable::Tags)),
            AccountDataTable::Tags => (&mut self.tags, None),
        };
        *kept = rows;
        // Synapse's store functions answer nothing, unasked, for an empty
        // range (`last_id == current_id`); to only ever comes down to a
        // row above from, so this is the request's own from == to.
        self.next = next.filter(|_| self.from != self.to);
    }

    /// The page: the rows at or below its `upto`, by id.
    pub fn finish(self) -> Result<CatchUpPage, JsonError> {
        let to = self.to;
        let mut rows: Vec<AccountDataRow> = [self.room, self.global, self.tags]
            .into_iter()
            .flatten()
            .filter(|row| row.stream_id <= to)
            .collect();
        // Stable: at one id, room before global before tags.
        rows.sort_by_key(|row| row.stream_id);
        let updates = rows
            .iter()
            .map(|row| Ok((row.stream_id, row.to_raw_row()?)))
            .collect::<Result<Vec<_>, JsonError>>()?;
        Ok(CatchUpPage {
            updates,
            upto: to,
            limited: self.limited,
        })
    }
}

/// A change of `m.ignored_user_list` that Synapse refuses: the user
/// ignores themself (400 `M_INVALID_PARAM`, "You cannot ignore yourself").
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("You cannot ignore yourself")]
pub struct IgnoreSelfError;

/// What setting `m.ignored_user_list` does to `ignored_users` and to
/// Synapse's caches of it (`_add_account_data_for_user`): rows to delete
/// and insert, the users whose `ignored_by` entry to invalidate (those
/// added or removed), then the ignorer's `ignored_users` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IgnoredUsersChange {
    /// `ignored_user_id`s no longer ignored: their rows are deleted.
    pub unignored: Vec<String>,
    /// `ignored_user_id`s newly ignored: rows inserted.
    pub ignored: Vec<String>,
}

impl IgnoredUsersChange {
    /// The change from `previously` (the ignorer's rows of
    /// `ignored_users`) to what `content` says: the keys of its
    /// `ignored_users` object (nobody when it is missing or not an
    /// object). `None` when nothing changes: Synapse then invalidates
    /// nothing either. Refused when the user ignores themself.
    pub fn new<'a>(
        user_id: &str,
        previously: impl IntoIterator<Item = &'a str>,
        content: &Map<String, Value>,
    ) -> Result<Option<IgnoredUsersChange>, IgnoreSelfError> {
        let previously: BTreeSet<&str> = previously.into_iter().collect();
        let currently: BTreeSet<&str> = match content.get("ignored_users") {
            Some(Value::Object(users)) => users.keys().map(String::as_str).collect(),
            _ => BTreeSet::new(),
        };
        if currently.contains(user_id) {
            return Err(IgnoreSelfError);
        }
        if previously == currently {
            return Ok(None);
        }
        let owned = |set: std::collections::btree_set::Difference<'_, &str>| {
            set.map(|user| (*user).to_owned()).collect::<Vec<_>>()
        };
        Ok(Some(IgnoredUsersChange {
            unignored: owned(previously.difference(&currently)),
            ignored: owned(currently.difference(&previously)),
        }))
    }

    /// The users whose `ignored_by` entry Synapse invalidates: those added
    /// or removed, sorted (Synapse walks a Python set, in no fixed order).
    pub fn changed(&self) -> Vec<String> {
        let mut changed: Vec<String> = self
            .unignored
            .iter()
            .chain(&self.ignored)
            .cloned()
            .collect();
        changed.sort();
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::positions::CatchUpId;
    use crate::wire::{InstanceName, StreamName};

    fn request(from: i64, to: i64) -> CatchUpRequest {
        CatchUpRequest {
            id: CatchUpId::new(1),
            stream: StreamName::AccountData,
            writer: InstanceName::from("w"),
            from: Token(from),
            to: Token(to),
        }
    }

    fn row(id: i64, room: Option<&str>, data_type: &str) -> AccountDataRow {
        AccountDataRow {
            stream_id: Token(id),
            user_id: "@é:x".into(),
            room_id: room.map(Into::into),
            data_type: data_type.into(),
        }
    }

    /// Runs a page over in-memory tables, as the database would answer.
    fn run(
        request: &CatchUpRequest,
        limit: usize,
        tables: [&[AccountDataRow]; 3],
    ) -> (CatchUpPage, Vec<AccountDataQuery>) {
        let mut page = AccountDataPage::new(request, limit);
        let mut asked = Vec::new();
        while let Some(query) = page.next_query() {
            asked.push(query);
            let table = match query.table {
                AccountDataTable::Global => tables[0],
                AccountDataTable::Room => tables[1],
                AccountDataTable::Tags => tables[2],
            };
            page.answer(
                table
                    .iter()
                    .filter(|row| query.from < row.stream_id && row.stream_id <= query.to)
                    .take(query.limit)
                    .cloned()
                    .collect(),
            );
        }
        (page.finish().unwrap(), asked)
    }

    #[test]
    fn rows_are_synapse_s_tuples() {
        assert_eq!(
            row(1, None, "m.direct").to_raw_row().unwrap().as_str(),
            r#"["@\u00e9:x",null,"m.direct"]"#
        );
        assert_eq!(
            row(1, Some("!r:x"), TAG_DATA_TYPE)
                .to_raw_row()
                .unwrap()
                .as_str(),
            r#"["@\u00e9:x","!r:x","m.tag"]"#
        );
    }

    #[test]
    fn each_table_that_fills_a_page_bounds_the_next_and_the_rows_before() {
        let global = [row(2, None, "a"), row(6, None, "b"), row(9, None, "c")];
        let room = [row(3, Some("!r"), "a"), row(5, Some("!r"), "b")];
        let tags = [
            row(4, Some("!r"), TAG_DATA_TYPE),
            row(8, Some("!r"), TAG_DATA_TYPE),
        ];
        // Global fills its 2: to = 6; room then fills 2 below it: to = 5;
        // tags read up to 5: one row.
        let (page, asked) = run(&request(0, 20), 2, [&global, &room, &tags]);
        assert_eq!((page.upto, page.limited), (Token(5), true));
        let ids: Vec<i64> = page.updates.iter().map(|(token, _)| token.0).collect();
        assert_eq!(ids, [2, 3, 4, 5]);
        assert_eq!(
            asked.iter().map(|query| query.to.0).collect::<Vec<_>>(),
            [20, 6, 5]
        );
        // Not limited: everything up to the request's to.
        let (page, _) = run(&request(0, 20), 100, [&global, &room, &tags]);
        assert_eq!(
            (page.upto, page.limited, page.updates.len()),
            (Token(20), false, 7)
        );
    }

    #[test]
    fn empty_ranges_ask_nothing_and_one_id_keeps_synapse_s_merge_order() {
        let (page, asked) = run(&request(7, 7), 100, [&[], &[], &[]]);
        assert!(asked.is_empty());
        assert_eq!((page.upto, page.limited), (Token(7), false));
        let (page, asked) = run(&request(9, 3), 100, [&[], &[], &[]]);
        assert_eq!(asked.len(), 3);
        assert_eq!((page.upto, page.updates.len()), (Token(3), 0));
        let same = [
            &[row(4, None, "g")][..],
            &[row(4, Some("!r"), "r")][..],
            &[row(4, Some("!r"), TAG_DATA_TYPE)][..],
        ];
        let (page, _) = run(&request(0, 5), 100, same);
        let types: Vec<&str> = page.updates.iter().map(|(_, row)| row.as_str()).collect();
        assert_eq!(
            types,
            [
                r#"["@\u00e9:x","!r","r"]"#,
                r#"["@\u00e9:x",null,"g"]"#,
                r#"["@\u00e9:x","!r","m.tag"]"#
            ]
        );
    }

    #[test]
    fn ignored_users_change_as_synapse_computes_it() {
        let content = |value: Value| value.as_object().cloned().unwrap();
        let list = content(serde_json::json!({"ignored_users": {"@b:x": {}, "@c:x": {}}}));
        let change = IgnoredUsersChange::new("@a:x", ["@c:x", "@d:x"], &list)
            .unwrap()
            .unwrap();
        assert_eq!(change.ignored, ["@b:x"]);
        assert_eq!(change.unignored, ["@d:x"]);
        assert_eq!(change.changed(), ["@b:x", "@d:x"]);
        assert_eq!(
            IgnoredUsersChange::new("@a:x", ["@b:x", "@c:x"], &list),
            Ok(None)
        );
        // Not an object: nobody is ignored.
        let bad = content(serde_json::json!({"ignored_users": ["@b:x"]}));
        let change = IgnoredUsersChange::new("@a:x", ["@b:x"], &bad)
            .unwrap()
            .unwrap();
        assert_eq!((change.ignored.len(), change.unignored.len()), (0, 1));
        let me = content(serde_json::json!({"ignored_users": {"@a:x": {}}}));
        assert_eq!(
            IgnoredUsersChange::new("@a:x", [], &me),
            Err(IgnoreSelfError)
        );
    }
}
