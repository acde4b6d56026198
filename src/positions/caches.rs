//! The writer's side of the `caches` stream, sans-IO: what one
//! invalidation writes to `cache_invalidation_stream_by_instance`, the row
//! it puts on the wire, the rows held until the writer's position covers
//! them, and the catch-up page Synapse's writer answers from that table.
//!
//! As Synapse 1.163.2's `storage/databases/main/cache.py`
//! (`_invalidate_cache_and_stream`, `_invalidate_cache_and_stream_bulk`,
//! `_invalidate_all_cache_and_stream`, `_send_invalidation_to_replication*`,
//! `get_all_updated_caches`). The database side is
//! `transport::postgres::CacheInvalidations` (feature `postgres`).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::wire::{JsonError, RawRow, Token};

use super::{CatchUpPage, CatchUpRequest};

/// Synapse's cache names that stand for several caches at once
/// (`CURRENT_STATE_CACHE_NAME`, `PURGE_HISTORY_CACHE_NAME`,
/// `DELETE_ROOM_CACHE_NAME`): their keys name a room, and Synapse refuses
/// to invalidate them whole.
const MAGIC_CACHES: &[&str] = &["cs_cache_fake", "ph_cache_fake", "dr_cache_fake"];

/// An invalidation Synapse would refuse to write.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CacheInvalidationError {
    /// A cache that stands for several (`cs_cache_fake`, ...) invalidated
    /// whole: Synapse raises, and its followers would raise on the row.
    #[error("cache {cache_func} cannot be invalidated whole: give the room's keys")]
    WholeMagicCache {
        /// The cache's name.
        cache_func: String,
    },
    /// The cache's name is empty.
    #[error("a cache invalidation needs the cache's name")]
    NoCacheName,
    /// Ids given for the rows are not one per row.
    #[error("{rows} rows need as many ids, not {ids}")]
    IdCount {
        /// Rows the invalidation writes.
        rows: usize,
        /// Ids given.
        ids: usize,
    },
}

/// One call's worth of cache invalidation, as Synapse's writer makes it:
/// one entry of a cache, several entries (one row each, sharing one
/// timestamp: `_invalidate_cache_and_stream_bulk`), or the whole cache
/// (one row whose keys are `NULL`, `null` on the wire).
///
/// A key is the cached function's arguments as text, the elements of the
/// `keys TEXT[]` column; a function of no arguments has the empty key
/// (`{}` in the table, `[]` on the wire), which is not the whole cache.
///
/// ```
/// use synapse_replication::positions::CacheInvalidation;
/// use synapse_replication::wire::Token;
///
/// let ignored = CacheInvalidation::entry("ignored_users", ["@alice:example.com"]);
/// let rows = ignored.rows(&[Token(7)], 1_700_000_000_000)?;
/// assert_eq!(rows[0].to_raw_row()?.as_str(), r#"["ignored_users",["@alice:example.com"],1700000000000]"#);
///
/// let all = CacheInvalidation::all("get_rooms_for_user");
/// assert_eq!(all.rows(&[Token(8)], 5)?[0].to_raw_row()?.as_str(), r#"["get_rooms_for_user",null,5]"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheInvalidation {
    cache_func: String,
    /// `None`: the whole cache.
    keys: Option<Vec<Vec<String>>>,
}

impl CacheInvalidation {
    /// One entry of `cache_func` (Synapse's `_invalidate_cache_and_stream`):
    /// one row.
    pub fn entry(
        cache_func: impl Into<String>,
        key: impl IntoIterator<Item = impl Into<String>>,
    ) -> CacheInvalidation {
        CacheInvalidation {
            cache_func: cache_func.into(),
            keys: Some(vec![key.into_iter().map(Into::into).collect()]),
        }
    }

    /// Several entries of `cache_func` (`_invalidate_cache_and_stream_bulk`):
    /// one row per key, ids taken together, one timestamp. No key, no row.
    pub fn entries<K>(cache_func: impl Into<String>, keys: impl IntoIterator<Item = K>) -> Self
    where
        K: IntoIterator,
        K::Item: Into<String>,
    {
        CacheInvalidation {
            cache_func: cache_func.into(),
            keys: Some(
                keys.into_iter()
                    .map(|key| key.into_iter().map(Into::into).collect())
                    .collect(),
            ),
        }
    }

    /// The whole of `cache_func` (`_invalidate_all_cache_and_stream`): one
    /// row, its keys `NULL`.
    pub fn all(cache_func: impl Into<String>) -> CacheInvalidation {
        CacheInvalidation {
            cache_func: cache_func.into(),
            keys: None,
        }
    }

    /// The cache's name.
    pub fn cache_func(&self) -> &str {
        &self.cache_func
    }

    /// How many rows (and ids) it writes.
    pub fn len(&self) -> usize {
        self.keys.as_ref().map_or(1, Vec::len)
    }

    /// Whether it writes nothing (entries of no key).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether Synapse would write it (the checks of
    /// `_send_invalidation_to_replication`).
    pub fn check(&self) -> Result<(), CacheInvalidationError> {
        if self.cache_func.is_empty() {
            return Err(CacheInvalidationError::NoCacheName);
        }
        if self.keys.is_none() && MAGIC_CACHES.contains(&self.cache_func.as_str()) {
            return Err(CacheInvalidationError::WholeMagicCache {
                cache_func: self.cache_func.clone(),
            });
        }
        Ok(())
    }

    /// Its rows of `cache_invalidation_stream_by_instance`, with `ids`
    /// (one per row, in order) and the time in ms since the epoch.
    pub fn rows(
        &self,
        ids: &[Token],
        invalidation_ts: i64,
    ) -> Result<Vec<InvalidationRow>, CacheInvalidationError> {
        self.check()?;
        if ids.len() != self.len() {
            return Err(CacheInvalidationError::IdCount {
                rows: self.len(),
                ids: ids.len(),
            });
        }
        let row = |stream_id: Token, keys: Option<&Vec<String>>| InvalidationRow {
            stream_id,
            cache_func: self.cache_func.clone(),
            keys: keys.map(|key| key.iter().cloned().map(Some).collect()),
            invalidation_ts: Some(invalidation_ts),
        };
        Ok(match &self.keys {
            None => ids.iter().map(|&id| row(id, None)).collect(),
            Some(keys) => ids
                .iter()
                .zip(keys)
                .map(|(&id, key)| row(id, Some(key)))
                .collect(),
        })
    }
}

/// A row of `cache_invalidation_stream_by_instance` (less its
/// `instance_name`), as Synapse's schema types it: `keys TEXT[]` and
/// `invalidation_ts BIGINT` may be `NULL`, and so may an element of `keys`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidationRow {
    /// `stream_id`: the row's token.
    pub stream_id: Token,
    /// `cache_func`.
    pub cache_func: String,
    /// `keys`: `None` for the whole cache.
    pub keys: Option<Vec<Option<String>>>,
    /// `invalidation_ts`, in ms since the epoch. Synapse always writes it;
    /// the column allows `NULL`, which goes on the wire as `null` (as
    /// Synapse sends it, whatever `CachesStreamRow` says).
    pub invalidation_ts: Option<i64>,
}

impl InvalidationRow {
    /// The `caches` row on the wire, byte for byte as Synapse's writer
    /// sends it: `[cache_func, keys, invalidation_ts]`, compact, non-ASCII
    /// as `\uXXXX` (its `json_encoder` over the tuple psycopg2 reads).
    pub fn to_raw_row(&self) -> Result<RawRow, JsonError> {
        #[derive(Serialize)]
        struct Row<'a>(&'a str, &'a Option<Vec<Option<String>>>, Option<i64>);
        RawRow::from_value(&Row(&self.cache_func, &self.keys, self.invalidation_ts))
    }
}

/// The page Synapse's writer answers a `caches` catch-up with, from the
/// rows its query returned (`get_all_updated_caches` in
/// `storage/databases/main/cache.py`, through
/// `Stream.get_updates_since`).
///
/// `rows`: `SELECT stream_id, cache_func, keys, invalidation_ts FROM
/// cache_invalidation_stream_by_instance WHERE stream_id > from AND
/// instance_name = writer ORDER BY stream_id ASC LIMIT limit`. Not bounded
/// by `request.to`, on purpose: Synapse sends invalidations as early as it
/// can, as repeating one is harmless. With `limit` rows or more the page
/// is `limited` and reaches its last row; otherwise it reaches
/// `request.to`. `from == to` is an empty page without asking (Synapse
/// asks even when `from > to`).
pub fn caches_page(
    request: &CatchUpRequest,
    rows: &[InvalidationRow],
    limit: usize,
) -> Result<CatchUpPage, JsonError> {
    let updates = rows
        .iter()
        .map(|row| Ok((row.stream_id, row.to_raw_row()?)))
        .collect::<Result<Vec<_>, JsonError>>()?;
    let (upto, limited) = match updates.last() {
        Some(&(last, _)) if updates.len() >= limit => (last, true),
        _ => (request.to, false),
    };
    Ok(CatchUpPage {
        updates,
        upto,
        limited,
    })
}

/// Rows whose transaction committed, held until the writer's position
/// covers them, then handed over in token order.
///
/// A database-backed stream's ids finish out of order, and a follower
/// takes a row's token for the writer's position: a row sent before an
/// earlier id is persisted would make followers drop that earlier row
/// when it comes (its token is then not above their position). So rows
/// go out only once every id below them is finished, which is when
/// [`StreamIds::persisted`](super::StreamIds::persisted) returns a
/// position at or above them. (Synapse's own `caches` writer sends rows
/// above its position, reading them unbounded from the table: its
/// followers can drop an invalidation that way.)
#[derive(Clone, Debug, Default)]
pub struct Outbox {
    rows: BTreeMap<Token, Vec<RawRow>>,
}

impl Outbox {
    /// An empty outbox.
    pub fn new() -> Outbox {
        Outbox::default()
    }

    /// Holds a committed row.
    pub fn push(&mut self, token: Token, row: RawRow) {
        self.rows.entry(token).or_default().push(row);
    }

    /// The rows at or below `position`, in token order (rows of one token
    /// in the order pushed), no longer held.
    pub fn release(&mut self, position: Token) -> Vec<(Token, RawRow)> {
        let above = match position.0.checked_add(1) {
            Some(next) => self.rows.split_off(&Token(next)),
            None => BTreeMap::new(),
        };
        let released = std::mem::replace(&mut self.rows, above);
        released
            .into_iter()
            .flat_map(|(token, rows)| rows.into_iter().map(move |row| (token, row)))
            .collect()
    }

    /// How many rows are held.
    pub fn len(&self) -> usize {
        self.rows.values().map(Vec::len).sum()
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
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
            stream: StreamName::Caches,
            writer: InstanceName::from("w"),
            from: Token(from),
            to: Token(to),
        }
    }

    fn row(id: i64) -> InvalidationRow {
        InvalidationRow {
            stream_id: Token(id),
            cache_func: "f".into(),
            keys: Some(vec![Some(format!("k{id}"))]),
            invalidation_ts: Some(1),
        }
    }

    #[test]
    fn rows_are_encoded_as_synapse_s_json_encoder_writes_them() {
        // Expected bytes: Synapse's `json_encoder.encode(("f", [...], ts))`.
        let row = InvalidationRow {
            stream_id: Token(3),
            cache_func: "get_user_by_id".into(),
            keys: Some(vec![Some("@é:x".into()), None, Some(r#"["a","b"]"#.into())]),
            invalidation_ts: None,
        };
        assert_eq!(
            row.to_raw_row().unwrap().as_str(),
            r#"["get_user_by_id",["@\u00e9:x",null,"[\"a\",\"b\"]"],null]"#
        );
        let empty = CacheInvalidation::entry("get_f", Vec::<String>::new());
        assert_eq!(
            empty.rows(&[Token(1)], 2).unwrap()[0]
                .to_raw_row()
                .unwrap()
                .as_str(),
            r#"["get_f",[],2]"#
        );
    }

    #[test]
    fn entries_are_one_row_each_with_one_timestamp() {
        let bulk = CacheInvalidation::entries("f", [["a", "b"], ["c", "d"]]);
        assert_eq!(bulk.len(), 2);
        let rows = bulk.rows(&[Token(4), Token(5)], 9).unwrap();
        assert_eq!(
            rows.iter()
                .map(|row| row.to_raw_row().unwrap().as_str().to_owned())
                .collect::<Vec<_>>(),
            [r#"["f",["a","b"],9]"#, r#"["f",["c","d"],9]"#]
        );
        assert_eq!(
            bulk.rows(&[Token(4)], 9),
            Err(CacheInvalidationError::IdCount { rows: 2, ids: 1 })
        );
        assert!(CacheInvalidation::entries("f", Vec::<Vec<String>>::new()).is_empty());
    }

    #[test]
    fn magic_caches_are_never_invalidated_whole() {
        for name in MAGIC_CACHES {
            assert!(matches!(
                CacheInvalidation::all(*name).check(),
                Err(CacheInvalidationError::WholeMagicCache { .. })
            ));
            assert!(CacheInvalidation::entry(*name, ["!r:x"]).check().is_ok());
        }
        assert_eq!(
            CacheInvalidation::all("").check(),
            Err(CacheInvalidationError::NoCacheName)
        );
    }

    #[test]
    fn pages_are_limited_at_the_limit_and_not_bounded_by_upto() {
        let rows: Vec<InvalidationRow> = (11..=13).map(row).collect();
        let page = caches_page(&request(10, 11), &rows, 100).unwrap();
        assert_eq!(
            (page.updates.len(), page.upto, page.limited),
            (3, Token(11), false)
        );
        let page = caches_page(&request(10, 20), &rows, 3).unwrap();
        assert_eq!((page.upto, page.limited), (Token(13), true));
        let page = caches_page(&request(10, 20), &[], 3).unwrap();
        assert_eq!((page.upto, page.limited), (Token(20), false));
    }

    #[test]
    fn the_outbox_releases_in_token_order_up_to_the_position() {
        let mut outbox = Outbox::new();
        let raw = |text: &str| RawRow::new(text.to_owned()).unwrap();
        outbox.push(Token(7), raw("[7]"));
        outbox.push(Token(5), raw("[5]"));
        outbox.push(Token(5), raw("[55]"));
        assert_eq!(outbox.release(Token(4)), []);
        let released: Vec<(i64, String)> = outbox
            .release(Token(6))
            .into_iter()
            .map(|(token, row)| (token.0, row.as_str().to_owned()))
            .collect();
        assert_eq!(released, [(5, "[5]".to_owned()), (5, "[55]".to_owned())]);
        assert_eq!(outbox.len(), 1);
        assert_eq!(outbox.release(Token(i64::MAX)).len(), 1);
        assert!(outbox.is_empty());
    }
}
