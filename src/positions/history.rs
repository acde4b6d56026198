//! A writer's recent rows, kept in memory to answer catch-ups: the history
//! of streams that live in memory (`typing`, and any of an application's
//! own), or a cache in front of a store.

use std::collections::{BTreeMap, HashMap, VecDeque};

use bytes::Bytes;
use serde_json::value::RawValue;

use crate::wire::{InstanceName, RawRow, StreamName, Token};

use super::{CatchUpPage, CatchUpRequest};

/// How many rows a catch-up page holds: Synapse's
/// `_STREAM_UPDATE_TARGET_ROW_COUNT` (`replication/tcp/streams/_base.py`),
/// the limit its writers are given for each answer.
pub const TARGET_ROW_COUNT: usize = 100;

/// What a [`History`] answers for a stream when asked for a range older
/// than it keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HistoryMode {
    /// Rows one for one; a range reaching below the rows kept is
    /// [`HistoryError::Truncated`] (the follower retries, and is reported
    /// stuck: its rows are gone).
    #[default]
    Log,
    /// Rows are the whole state of a key (the first `key_len` elements of
    /// the row): a range older than the rows kept is answered with the
    /// latest row of every key whose latest row lies in the range, as
    /// Synapse's typing writer answers (`TypingWriterHandler.get_all_typing_updates`:
    /// the current users of every room changed since). Typing is keyed by
    /// its first element, the room id.
    Keyed {
        /// How many leading elements of the row make its key (at least 1).
        key_len: usize,
    },
}

/// The last rows each (stream, writer) wrote, and what a catch-up over them
/// answers: [`History::answer`].
///
/// Sans-IO: no clock, no lock. Share it between the task that writes and
/// the one that serves as a `Mutex<History>`, which is a
/// [`CatchUpSource`](crate::transport::CatchUpSource): the same source
/// serves a Rust follower directly (give it to
/// [`RedisClient::with_catch_up`](crate::transport::RedisClient::with_catch_up)
/// or [`TcpClient::with_catch_up`](crate::transport::TcpClient::with_catch_up))
/// and Synapse's processes over HTTP (`HttpServer`, feature
/// `http-server`).
///
/// Each (stream, writer) keeps its last `capacity` rows. Asked for a range
/// it still holds, it answers the rows one for one, in pages of at most
/// `limit` rows cut between tokens (a batch is never split; a batch larger
/// than `limit` is a page of its own). Asked for an older range, it
/// answers as the stream's [`HistoryMode`] says. A history starts complete
/// from token 0 (a stream that has written nothing yet);
/// [`History::begin`] says it starts later (a writer resuming from a
/// stored token, or restarting above its previous run's tokens, as
/// [`Writer`](super::Writer) asks of in-memory streams too: a keyed stream
/// then answers a follower at an older token with the rows written since
/// the start).
///
/// Keyed streams also keep the latest row of every key, up to
/// [`History::with_max_keys`] keys; beyond that the key whose latest row is
/// the oldest is forgotten (as Synapse's writer forgets rooms nobody typed
/// in for ten minutes), and a follower catching up from before it does not
/// see that key's last row.
///
/// ```
/// use synapse_replication::positions::{CatchUpId, CatchUpRequest, History, HistoryMode};
/// use synapse_replication::wire::{InstanceName, RawRow, StreamName, Token};
///
/// let me = InstanceName::from("typing1");
/// let mut history = History::new(2).with_mode(StreamName::Typing, HistoryMode::Keyed { key_len: 1 });
/// for (token, row) in [
///     (1, r#"["!a:x",["@u:x"]]"#),
///     (2, r#"["!b:x",["@v:x"]]"#),
///     (3, r#"["!a:x",[]]"#),
///     (4, r#"["!b:x",[]]"#),
/// ] {
///     history.record(&StreamName::Typing, &me, [(Token(token), RawRow::new(row)?)])?;
/// }
/// let request = |from, to| CatchUpRequest {
///     id: CatchUpId::new(1),
///     stream: StreamName::Typing,
///     writer: me.clone(),
///     from: Token(from),
///     to: Token(to),
/// };
/// // Rows 3 and 4 are still kept: one for one.
/// let page = history.answer(&request(2, 4), 100)?;
/// assert_eq!(page.updates.len(), 2);
/// // From 0 is older: the latest row of each room.
/// let page = history.answer(&request(0, 4), 100)?;
/// let rows: Vec<_> = page.updates.iter().map(|(t, r)| (t.get(), r.as_str())).collect();
/// assert_eq!(rows, [(3, r#"["!a:x",[]]"#), (4, r#"["!b:x",[]]"#)]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct History {
    capacity: usize,
    max_keys: usize,
    modes: HashMap<StreamName, HistoryMode>,
    logs: HashMap<(StreamName, InstanceName), Log>,
}

/// The default for [`History::with_max_keys`].
const DEFAULT_MAX_KEYS: usize = 100_000;

/// One (stream, writer).
#[derive(Clone, Debug, Default)]
struct Log {
    /// The last rows, by token.
    rows: VecDeque<(Token, RawRow)>,
    /// Rows at or below this token may be missing from `rows`.
    floor: Option<Token>,
    /// The highest token recorded.
    last: Option<Token>,
    /// Keyed streams: the latest row of each key.
    keys: Option<Keys>,
}

#[derive(Clone, Debug)]
struct Keys {
    key_len: usize,
    /// Key -> where its latest row is in `by_token`.
    latest: HashMap<Bytes, (Token, u64)>,
    /// (token, sequence) -> (key, row): the latest rows in token order
    /// (the sequence keeps rows of one token in the order recorded).
    by_token: BTreeMap<(Token, u64), (Bytes, RawRow)>,
    sequence: u64,
    /// The highest token of a key forgotten to stay under the cap.
    forgotten: Option<Token>,
}

/// A history that cannot record or answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// Rows recorded below the last recorded token, or out of order.
    #[error("{stream} {writer}: row token {token} below {last}")]
    OutOfOrder {
        /// The stream.
        stream: StreamName,
        /// The writer.
        writer: InstanceName,
        /// The row's token.
        token: Token,
        /// The highest token recorded before it.
        last: Token,
    },
    /// The range asked for reaches below the rows kept, and the stream is
    /// not keyed: those rows are gone.
    #[error("{stream} {writer}: rows from {from} are no longer kept (only above {floor})")]
    Truncated {
        /// The stream.
        stream: StreamName,
        /// The writer.
        writer: InstanceName,
        /// The request's `from`.
        from: Token,
        /// Rows above this token are kept.
        floor: Token,
    },
}

impl History {
    /// A history that keeps the last `capacity` rows of each (stream,
    /// writer) (at least one), every stream in [`HistoryMode::Log`] until
    /// told otherwise.
    pub fn new(capacity: usize) -> History {
        History {
            capacity: capacity.max(1),
            max_keys: DEFAULT_MAX_KEYS,
            modes: HashMap::new(),
            logs: HashMap::new(),
        }
    }

    /// Answers for `stream` as `mode` says. Set it before recording: a
    /// keyed stream knows only the keys recorded after.
    #[must_use]
    pub fn with_mode(mut self, stream: StreamName, mode: HistoryMode) -> History {
        self.set_mode(stream, mode);
        self
    }

    /// Answers for `stream` as `mode` says (see [`History::with_mode`]).
    pub fn set_mode(&mut self, stream: StreamName, mode: HistoryMode) {
        for ((log_stream, _), log) in &mut self.logs {
            if *log_stream == stream {
                log.keys = Keys::new(mode);
                if log.keys.is_some() {
                    // Keys recorded before are unknown: nothing older than
                    // the last row can be answered from them.
                    log.floor = log.floor.max(log.last);
                    log.rows.clear();
                }
            }
        }
        self.modes.insert(stream, mode);
    }

    /// Keyed streams keep the latest row of at most `max_keys` keys per
    /// writer (100 000 unless set; at least 1).
    #[must_use]
    pub fn with_max_keys(mut self, max_keys: usize) -> History {
        self.max_keys = max_keys.max(1);
        self
    }

    /// The history of `writer` on `stream` starts after `token`: nothing at
    /// or below it is known (a writer resuming from a stored position).
    /// Forgets what was recorded.
    pub fn begin(&mut self, stream: &StreamName, writer: &InstanceName, token: Token) {
        let keys = Keys::new(self.mode(stream));
        self.logs.insert(
            (stream.clone(), writer.clone()),
            Log {
                rows: VecDeque::new(),
                floor: Some(token),
                last: Some(token),
                keys,
            },
        );
    }

    /// Forgets everything of `writer` on `stream`: its history starts again
    /// from token 0 (a writer that restarted its tokens).
    pub fn clear(&mut self, stream: &StreamName, writer: &InstanceName) {
        self.logs.remove(&(stream.clone(), writer.clone()));
    }

    /// Records rows `writer` wrote to `stream`, sorted by token, none below
    /// the last one recorded (rows sharing a token are one batch, and may
    /// be recorded in several calls). The rows [`Writer::write`](super::Writer::write)
    /// is given. Refused whole if out of order.
    pub fn record(
        &mut self,
        stream: &StreamName,
        writer: &InstanceName,
        updates: impl IntoIterator<Item = (Token, RawRow)>,
    ) -> Result<(), HistoryError> {
        let updates: Vec<(Token, RawRow)> = updates.into_iter().collect();
        let key = (stream.clone(), writer.clone());
        let mut last = self.logs.get(&key).and_then(|log| log.last);
        for &(token, _) in &updates {
            if let Some(last) = last.filter(|last| token < *last) {
                return Err(HistoryError::OutOfOrder {
                    stream: stream.clone(),
                    writer: writer.clone(),
                    token,
                    last,
                });
            }
            last = Some(token);
        }
        let (capacity, max_keys) = (self.capacity, self.max_keys);
        let mode = self.mode(stream);
        let log = self.logs.entry(key).or_insert_with(|| Log {
            keys: Keys::new(mode),
            ..Log::default()
        });
        for (token, row) in updates {
            log.last = Some(token);
            if let Some(keys) = &mut log.keys {
                keys.record(token, &row, max_keys);
            }
            log.rows.push_back((token, row));
            if log.rows.len() > capacity
                && let Some((dropped, _)) = log.rows.pop_front()
            {
                log.floor = log.floor.max(Some(dropped));
            }
        }
        Ok(())
    }

    /// `writer`'s token of `stream` moved to `token` without rows (what
    /// [`Writer::advance`](super::Writer::advance) is told): answers may
    /// now confirm up to it. Lower tokens change nothing.
    pub fn advance(&mut self, stream: &StreamName, writer: &InstanceName, token: Token) {
        let mode = self.mode(stream);
        let log = self
            .logs
            .entry((stream.clone(), writer.clone()))
            .or_insert_with(|| Log {
                keys: Keys::new(mode),
                ..Log::default()
            });
        log.last = log.last.max(Some(token));
    }

    /// One page of the rows `request.writer` wrote to `request.stream` with
    /// tokens in `(request.from, request.to]`, at most `limit` rows (see
    /// the type's docs; [`TARGET_ROW_COUNT`] is Synapse's).
    ///
    /// As Synapse's writers: `from >= to` (nothing asked for, or a writer
    /// whose tokens restarted) answers no rows up to `to`; a limited page
    /// reaches the token of its last row. Unlike them, an answer never
    /// confirms more than the history reached (its last row, or what
    /// [`History::advance`] or [`History::begin`] said; 0 for a writer it
    /// never heard of): asked beyond, the page ends there, and the
    /// [`Follower`](super::Follower) takes the request's `to` for a false
    /// claim (a forged `POSITION`) rather than skip the writer's later
    /// rows. A writer whose token moves without rows must tell its history
    /// ([`History::advance`]).
    pub fn answer(
        &self,
        request: &CatchUpRequest,
        limit: usize,
    ) -> Result<CatchUpPage, HistoryError> {
        let empty = CatchUpPage {
            updates: Vec::new(),
            upto: request.to,
            limited: false,
        };
        if request.from >= request.to {
            return Ok(empty);
        }
        let reached = self
            .last(&request.stream, &request.writer)
            .unwrap_or(Token(0));
        let mut page = self.page_of(request, limit)?;
        if !page.limited {
            page.upto = page.upto.min(reached);
        }
        Ok(page)
    }

    fn page_of(&self, request: &CatchUpRequest, limit: usize) -> Result<CatchUpPage, HistoryError> {
        let empty = CatchUpPage {
            updates: Vec::new(),
            upto: request.to,
            limited: false,
        };
        let Some(log) = self
            .logs
            .get(&(request.stream.clone(), request.writer.clone()))
        else {
            return Ok(empty);
        };
        let limit = limit.max(1);
        if log.floor.is_none_or(|floor| request.from >= floor) {
            let start = log
                .rows
                .partition_point(|(token, _)| *token <= request.from);
            let rows = log
                .rows
                .range(start..)
                .take_while(|(token, _)| *token <= request.to);
            return Ok(page(rows.cloned(), request.to, limit));
        }
        match &log.keys {
            Some(keys) => {
                let rows = keys
                    .by_token
                    .range((request.from, u64::MAX)..)
                    .take_while(|((token, _), _)| *token <= request.to)
                    .map(|((token, _), (_, row))| (*token, row.clone()));
                Ok(page(rows, request.to, limit))
            }
            None => Err(HistoryError::Truncated {
                stream: request.stream.clone(),
                writer: request.writer.clone(),
                from: request.from,
                floor: log.floor.unwrap_or_default(),
            }),
        }
    }

    /// The highest token recorded for `writer` on `stream` (or given to
    /// [`History::begin`]).
    pub fn last(&self, stream: &StreamName, writer: &InstanceName) -> Option<Token> {
        self.logs
            .get(&(stream.clone(), writer.clone()))
            .and_then(|log| log.last)
    }

    /// How many rows are kept for `writer` on `stream` (keyed streams also
    /// keep the latest row of each key).
    pub fn len(&self, stream: &StreamName, writer: &InstanceName) -> usize {
        self.logs
            .get(&(stream.clone(), writer.clone()))
            .map_or(0, |log| log.rows.len())
    }

    /// Whether no rows are kept for `writer` on `stream`.
    pub fn is_empty(&self, stream: &StreamName, writer: &InstanceName) -> bool {
        self.len(stream, writer) == 0
    }

    fn mode(&self, stream: &StreamName) -> HistoryMode {
        self.modes.get(stream).copied().unwrap_or_default()
    }
}

impl Keys {
    fn new(mode: HistoryMode) -> Option<Keys> {
        match mode {
            HistoryMode::Log => None,
            HistoryMode::Keyed { key_len } => Some(Keys {
                key_len: key_len.max(1),
                latest: HashMap::new(),
                by_token: BTreeMap::new(),
                sequence: 0,
                forgotten: None,
            }),
        }
    }

    fn record(&mut self, token: Token, row: &RawRow, max_keys: usize) {
        let key = row_key(row, self.key_len);
        self.sequence += 1;
        let at = (token, self.sequence);
        if let Some(previous) = self.latest.insert(key.clone(), at) {
            self.by_token.remove(&previous);
        }
        self.by_token.insert(at, (key, row.clone()));
        while self.latest.len() > max_keys {
            let Some(((token, _), (key, _))) = self.by_token.pop_first() else {
                break;
            };
            self.latest.remove(&key);
            self.forgotten = self.forgotten.max(Some(token));
        }
    }
}

/// The key of a row: the JSON text of its first `key_len` elements (the
/// row itself when it is not an array, or is shorter).
fn row_key(row: &RawRow, key_len: usize) -> Bytes {
    let whole = || row.to_bytes();
    let Ok(elements) = serde_json::from_slice::<Vec<&RawValue>>(row.as_bytes()) else {
        return whole();
    };
    let Some(key) = elements.get(..key_len) else {
        return whole();
    };
    let mut bytes = Vec::new();
    for (index, element) in key.iter().enumerate() {
        if index > 0 {
            bytes.push(b',');
        }
        bytes.extend_from_slice(element.get().as_bytes());
    }
    Bytes::from(bytes)
}

/// A page of at most `limit` rows from `rows` (sorted, in range), cut
/// between two tokens: a batch is never split, and one larger than the
/// limit is a page of its own. Limited pages reach their last row's token.
fn page(rows: impl Iterator<Item = (Token, RawRow)>, to: Token, limit: usize) -> CatchUpPage {
    let mut rows = rows.peekable();
    let mut updates: Vec<(Token, RawRow)> = Vec::new();
    while let Some((token, row)) = rows.next_if(|(token, _)| {
        updates.len() < limit || updates.last().is_some_and(|(last, _)| last == token)
    }) {
        updates.push((token, row));
    }
    let Some(&(next, _)) = rows.peek() else {
        return CatchUpPage {
            updates,
            upto: to,
            limited: false,
        };
    };
    // More rows: end the page on a whole token. Past the limit, the last
    // batch was taken whole; drop it unless it is the only one.
    let last = updates.last().map_or(next, |(token, _)| *token);
    if updates.len() > limit {
        let first = updates.first().map_or(last, |(token, _)| *token);
        if first != last {
            updates.retain(|(token, _)| *token != last);
        }
    }
    let upto = updates.last().map_or(last, |(token, _)| *token);
    CatchUpPage {
        updates,
        upto,
        limited: true,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::positions::CatchUpId;

    fn row(text: &str) -> RawRow {
        RawRow::new(text.to_owned()).unwrap()
    }

    fn request(from: i64, to: i64) -> CatchUpRequest {
        CatchUpRequest {
            id: CatchUpId(1),
            stream: StreamName::Typing,
            writer: InstanceName::from("w"),
            from: Token(from),
            to: Token(to),
        }
    }

    fn rows(page: &CatchUpPage) -> Vec<(i64, &str)> {
        page.updates
            .iter()
            .map(|(t, r)| (t.0, r.as_str()))
            .collect()
    }

    fn writer() -> InstanceName {
        InstanceName::from("w")
    }

    #[test]
    fn log_answers_one_for_one_and_pages_between_tokens() {
        let mut history = History::new(10);
        history
            .record(
                &StreamName::Typing,
                &writer(),
                [
                    (Token(1), row("[1]")),
                    (Token(2), row("[2]")),
                    (Token(2), row("[22]")),
                    (Token(3), row("[3]")),
                ],
            )
            .unwrap();
        let page = history.answer(&request(0, 3), 100).unwrap();
        assert_eq!(
            rows(&page),
            [(1, "[1]"), (2, "[2]"), (2, "[22]"), (3, "[3]")]
        );
        assert_eq!((page.upto, page.limited), (Token(3), false));
        // Two rows would split token 2: the page ends at 1.
        let page = history.answer(&request(0, 3), 2).unwrap();
        assert_eq!(rows(&page), [(1, "[1]")]);
        assert_eq!((page.upto, page.limited), (Token(1), true));
        // A batch larger than the limit is a page of its own.
        let page = history.answer(&request(1, 3), 1).unwrap();
        assert_eq!(rows(&page), [(2, "[2]"), (2, "[22]")]);
        assert_eq!((page.upto, page.limited), (Token(2), true));
        // The range is kept to: nothing above `to`, `upto` is `to`.
        let page = history.answer(&request(1, 2), 100).unwrap();
        assert_eq!(rows(&page).len(), 2);
        assert_eq!((page.upto, page.limited), (Token(2), false));
        // Beyond what it reached, it confirms only what it reached: a
        // forged POSITION asked for is not confirmed.
        let page = history.answer(&request(3, 9), 100).unwrap();
        assert_eq!(
            (page.updates.len(), page.upto, page.limited),
            (0, Token(3), false)
        );
        history.advance(&StreamName::Typing, &writer(), Token(7));
        let page = history.answer(&request(3, 9), 100).unwrap();
        assert_eq!((page.upto, page.limited), (Token(7), false));
    }

    #[test]
    fn nothing_asked_or_reset_answers_empty() {
        let mut history = History::new(10);
        history
            .record(&StreamName::Typing, &writer(), [(Token(5), row("[5]"))])
            .unwrap();
        for (from, to) in [(3, 3), (9, 2), (5, 0)] {
            let page = history.answer(&request(from, to), 100).unwrap();
            assert_eq!(
                (page.updates.len(), page.upto, page.limited),
                (0, Token(to), false)
            );
        }
        // A writer it never heard of: nothing, and not beyond 0.
        let other = CatchUpRequest {
            writer: InstanceName::from("x"),
            ..request(0, 4)
        };
        assert_eq!(history.answer(&other, 100).unwrap().upto, Token(0));
    }

    #[test]
    fn log_refuses_a_range_it_no_longer_keeps() {
        let mut history = History::new(2);
        for token in 1..=4 {
            history
                .record(&StreamName::Typing, &writer(), [(Token(token), row("[]"))])
                .unwrap();
        }
        assert_eq!(history.len(&StreamName::Typing, &writer()), 2);
        assert!(history.answer(&request(2, 4), 100).is_ok());
        assert_eq!(
            history.answer(&request(1, 4), 100),
            Err(HistoryError::Truncated {
                stream: StreamName::Typing,
                writer: writer(),
                from: Token(1),
                floor: Token(2),
            })
        );
        // `begin` starts later: nothing at or below is known.
        history.begin(&StreamName::Typing, &writer(), Token(10));
        assert!(history.answer(&request(9, 11), 100).is_err());
        assert!(history.answer(&request(10, 11), 100).is_ok());
        assert_eq!(
            history.last(&StreamName::Typing, &writer()),
            Some(Token(10))
        );
    }

    #[test]
    fn out_of_order_rows_are_refused_whole() {
        let mut history = History::new(10);
        history
            .record(&StreamName::Typing, &writer(), [(Token(5), row("[5]"))])
            .unwrap();
        let error = history
            .record(
                &StreamName::Typing,
                &writer(),
                [(Token(6), row("[6]")), (Token(4), row("[4]"))],
            )
            .unwrap_err();
        assert!(matches!(
            error,
            HistoryError::OutOfOrder {
                token: Token(4),
                last: Token(6),
                ..
            }
        ));
        assert_eq!(history.len(&StreamName::Typing, &writer()), 1);
        // The same token again is more of its batch.
        history
            .record(&StreamName::Typing, &writer(), [(Token(5), row("[55]"))])
            .unwrap();
        history.clear(&StreamName::Typing, &writer());
        assert!(history.is_empty(&StreamName::Typing, &writer()));
        history
            .record(&StreamName::Typing, &writer(), [(Token(1), row("[1]"))])
            .unwrap();
    }

    #[test]
    fn keyed_answers_the_latest_row_per_key_like_synapse_s_typing_writer() {
        let mut history =
            History::new(1).with_mode(StreamName::Typing, HistoryMode::Keyed { key_len: 1 });
        for (token, text) in [
            (1, r#"["!a",["@u"]]"#),
            (2, r#"["!b",["@v"]]"#),
            (3, r#"["!a",["@u","@w"]]"#),
            (4, r#"["!c",[]]"#),
            (5, r#"["!b",[]]"#),
        ] {
            history
                .record(&StreamName::Typing, &writer(), [(Token(token), row(text))])
                .unwrap();
        }
        let page = history.answer(&request(0, 5), 100).unwrap();
        assert_eq!(
            rows(&page),
            [
                (3, r#"["!a",["@u","@w"]]"#),
                (4, r#"["!c",[]]"#),
                (5, r#"["!b",[]]"#)
            ]
        );
        // Rooms whose latest change is above `to` are left out, as Synapse
        // leaves them (their row reaches the follower as RDATA).
        let page = history.answer(&request(0, 4), 100).unwrap();
        assert_eq!(
            rows(&page),
            [(3, r#"["!a",["@u","@w"]]"#), (4, r#"["!c",[]]"#)]
        );
        // Synapse's strict limit: the page reaches its last row.
        let page = history.answer(&request(0, 5), 2).unwrap();
        assert_eq!(
            (page.updates.len(), page.upto, page.limited),
            (2, Token(4), true)
        );
        let page = history.answer(&request(4, 5), 2).unwrap();
        assert_eq!(rows(&page), [(5, r#"["!b",[]]"#)]);
        // Within what it keeps: one for one.
        assert_eq!(
            history.answer(&request(4, 5), 100).unwrap().updates.len(),
            1
        );
    }

    #[test]
    fn keys_beyond_the_cap_are_forgotten_oldest_first() {
        let mut history = History::new(1)
            .with_mode(StreamName::Typing, HistoryMode::Keyed { key_len: 1 })
            .with_max_keys(2);
        for (token, text) in [
            (1, r#"["!a",[]]"#),
            (2, r#"["!b",[]]"#),
            (3, r#"["!c",[]]"#),
        ] {
            history
                .record(&StreamName::Typing, &writer(), [(Token(token), row(text))])
                .unwrap();
        }
        let page = history.answer(&request(0, 3), 100).unwrap();
        assert_eq!(rows(&page), [(2, r#"["!b",[]]"#), (3, r#"["!c",[]]"#)]);
    }

    #[test]
    fn keys_are_leading_elements_or_the_whole_row() {
        assert_eq!(
            row_key(&row(r#"["!a", 1, 2]"#), 1),
            Bytes::from_static(br#""!a""#)
        );
        assert_eq!(
            row_key(&row(r#"["!a",1,2]"#), 2),
            Bytes::from_static(br#""!a",1"#)
        );
        assert_eq!(
            row_key(&row(r#"["!a"]"#), 2),
            Bytes::from_static(br#"["!a"]"#)
        );
        assert_eq!(
            row_key(&row(r#"{"a":1}"#), 1),
            Bytes::from_static(br#"{"a":1}"#)
        );
        assert_eq!(
            row_key(&row(r#"["\ud800"]"#), 1),
            Bytes::from_static(br#""\ud800""#)
        );
    }

    #[test]
    fn switching_a_stream_to_keyed_forgets_what_came_before() {
        let mut history = History::new(10);
        history
            .record(
                &StreamName::Typing,
                &writer(),
                [(Token(1), row(r#"["!a",[]]"#))],
            )
            .unwrap();
        history.set_mode(StreamName::Typing, HistoryMode::Keyed { key_len: 1 });
        history
            .record(
                &StreamName::Typing,
                &writer(),
                [(Token(2), row(r#"["!b",[]]"#))],
            )
            .unwrap();
        let page = history.answer(&request(0, 2), 100).unwrap();
        assert_eq!(rows(&page), [(2, r#"["!b",[]]"#)]);
    }

    /// Rows with tokens 1.. (several per token, sometimes), keyed by a
    /// small room number.
    fn log_strategy() -> impl Strategy<Value = Vec<(i64, u8, u8)>> {
        proptest::collection::vec((0i64..3, 0u8..6, any::<u8>()), 0..60).prop_map(|steps| {
            let mut token = 0;
            steps
                .into_iter()
                .map(|(step, room, value)| {
                    token += step;
                    (token.max(1), room, value)
                })
                .collect()
        })
    }

    fn record_all(history: &mut History, log: &[(i64, u8, u8)]) {
        for &(token, room, value) in log {
            history
                .record(
                    &StreamName::Typing,
                    &writer(),
                    [(Token(token), row(&format!(r#"["!{room}",{value}]"#)))],
                )
                .unwrap();
        }
    }

    /// Follows pages from `from` to `to` as a follower does.
    fn fetch_all(history: &History, from: i64, to: i64, limit: usize) -> Vec<(i64, String)> {
        let mut from = from;
        let mut all = Vec::new();
        for _ in 0..1000 {
            let page = history.answer(&request(from, to), limit).unwrap();
            for (token, _) in &page.updates {
                assert!(
                    token.0 > from && token.0 <= page.upto.0,
                    "{token} outside ({from}, {}]",
                    page.upto
                );
            }
            all.extend(
                page.updates
                    .iter()
                    .map(|(t, r)| (t.0, r.as_str().to_owned())),
            );
            if !page.limited {
                assert_eq!(page.upto, Token(to));
                return all;
            }
            assert!(page.upto.0 > from, "no progress");
            assert!(!page.updates.is_empty());
            from = page.upto.0;
        }
        panic!("too many pages");
    }

    proptest! {
        #[test]
        fn pages_of_any_size_reassemble_the_log(
            log in log_strategy(),
            limit in 1usize..8,
            cut in 0usize..60,
        ) {
            let mut history = History::new(1000);
            record_all(&mut history, &log);
            let to = log.last().map_or(0, |(token, _, _)| *token);
            let from = log.get(cut).map_or(0, |(token, _, _)| *token);
            let expected: Vec<(i64, String)> = log
                .iter()
                .filter(|(token, _, _)| *token > from)
                .map(|(token, room, value)| (*token, format!(r#"["!{room}",{value}]"#)))
                .collect();
            prop_assert_eq!(fetch_all(&history, from, to, limit), expected);
        }

        #[test]
        fn keyed_answers_are_the_latest_row_per_key_of_the_whole_log(
            log in log_strategy(),
            capacity in 1usize..10,
            limit in 1usize..8,
            cut in 0usize..60,
        ) {
            let mut history = History::new(capacity)
                .with_mode(StreamName::Typing, HistoryMode::Keyed { key_len: 1 });
            record_all(&mut history, &log);
            let to = log.last().map_or(0, |(token, _, _)| *token);
            let from = log.get(cut).map_or(0, |(token, _, _)| *token);
            let kept_from = log.len().saturating_sub(capacity);
            let older = log
                .get(kept_from.wrapping_sub(1))
                .is_some_and(|(floor, _, _)| from < *floor);
            let got = fetch_all(&history, from, to, limit);
            // Latest per key of the full log, in range.
            let mut latest: BTreeMap<u8, (usize, i64, String)> = BTreeMap::new();
            for (index, (token, room, value)) in log.iter().enumerate() {
                latest.insert(*room, (index, *token, format!(r#"["!{room}",{value}]"#)));
            }
            let mut expected: Vec<(usize, i64, String)> = latest
                .into_values()
                .filter(|(_, token, _)| *token > from)
                .collect();
            expected.sort();
            let expected: Vec<(i64, String)> =
                expected.into_iter().map(|(_, token, row)| (token, row)).collect();
            // Applied in order, the pages end in the latest row of each key
            // (one for one within what is kept, latest per key before it).
            let mut state: BTreeMap<String, (i64, String)> = BTreeMap::new();
            for (token, row) in &got {
                let key = row[..row.find(',').unwrap_or(row.len())].to_owned();
                state.insert(key, (*token, row.clone()));
            }
            let mut state: Vec<(i64, String)> = state.into_values().collect();
            state.sort();
            let mut sorted = expected.clone();
            sorted.sort();
            prop_assert_eq!(state, sorted);
            if older {
                // In one page: exactly the latest row per key, in token order.
                let page = history.answer(&request(from, to), usize::MAX).unwrap();
                let rows: Vec<(i64, String)> = page
                    .updates
                    .iter()
                    .map(|(t, r)| (t.0, r.as_str().to_owned()))
                    .collect();
                prop_assert_eq!(rows, expected);
            }
        }
    }
}
