//! The writer side: rows to `RDATA`, positions to `POSITION`, and
//! `REPLICATE` rate limiting.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::wire::{Command, InstanceName, Position, RawRow, Rdata, RdataToken, StreamName, Token};
use crate::writers::WriterRegistry;

use super::history::{History, HistoryError};

/// A write the [`Writer`] refuses. Nothing was sent and no position changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The registry does not give this process the stream.
    #[error("{instance} is not a writer of stream {stream}")]
    NotAWriter {
        /// The stream.
        stream: StreamName,
        /// This process.
        instance: InstanceName,
    },
    /// A row's token is not above the last token sent for the stream (rows
    /// of one token must be written in one call).
    #[error("stream {stream}: row token {token} is not above the last token sent, {last}")]
    TokenNotAbove {
        /// The stream.
        stream: StreamName,
        /// The row's token.
        token: Token,
        /// The last token sent.
        last: Token,
    },
    /// Rows are not sorted by token.
    #[error("stream {stream}: row token {token} after {previous}")]
    OutOfOrder {
        /// The stream.
        stream: StreamName,
        /// The out-of-order token.
        token: Token,
        /// The token before it.
        previous: Token,
    },
    /// The current token is below a row's token, or below the last token
    /// sent.
    #[error("stream {stream}: current token {current} is below {token}")]
    CurrentTooLow {
        /// The stream.
        stream: StreamName,
        /// The current token given.
        current: Token,
        /// The token it must reach.
        token: Token,
    },
    /// The writer's [`History`] refused the rows (rows it holds of this
    /// writer are above them: the history was written to by hand).
    #[error(transparent)]
    History(#[from] HistoryError),
}

/// Spacing of an action repeated too often: the first goes at once; one
/// asked for within `interval` of the previous waits until then, and the
/// interval doubles (up to `max_interval`) each time that happens; after a
/// quiet spell of twice the interval it is back to `min_interval`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimit {
    /// The interval after a quiet spell.
    pub min_interval: Duration,
    /// The largest interval.
    pub max_interval: Duration,
}

impl RateLimit {
    /// A limit from `min_interval` doubling up to `max_interval`.
    pub fn new(min_interval: Duration, max_interval: Duration) -> RateLimit {
        RateLimit {
            min_interval,
            max_interval: max_interval.max(min_interval),
        }
    }

    /// No limit at all.
    pub fn none() -> RateLimit {
        RateLimit {
            min_interval: Duration::ZERO,
            max_interval: Duration::ZERO,
        }
    }
}

/// How a [`Writer`] spaces what it sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriterConfig {
    /// `REPLICATE`s this process sends (every writer of the deployment
    /// answers each with all its positions): 1 s doubling up to 30 s.
    pub replicate: RateLimit,
    /// Answers to the `REPLICATE`s of others (coalesced; one answer serves
    /// every process, as it is broadcast): 250 ms doubling up to 5 s.
    pub answer: RateLimit,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            replicate: RateLimit::new(Duration::from_secs(1), Duration::from_secs(30)),
            answer: RateLimit::new(Duration::from_millis(250), Duration::from_secs(5)),
        }
    }
}

/// What a [`Writer`] has done, for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriterCounters {
    /// `RDATA` commands queued.
    pub rdata_sent: u64,
    /// `POSITION` commands queued (announcements included).
    pub positions_sent: u64,
    /// Announcements of every position (on connect, answering `REPLICATE`).
    pub announcements: u64,
    /// `REPLICATE`s answered by an announcement already queued.
    pub answers_coalesced: u64,
    /// `REPLICATE`s received.
    pub replicates_received: u64,
    /// `REPLICATE`s sent.
    pub replicates_sent: u64,
    /// `REPLICATE`s delayed by the rate limit.
    pub replicates_delayed: u64,
    /// Rows written while disconnected (not sent: followers catch up after
    /// the announcement of the next connection).
    pub rows_unsent: u64,
    /// Commands dropped from the queue by a disconnection.
    pub dropped_on_disconnect: u64,
}

/// Writes the streams this process owns: the sending half of Synapse's
/// `ReplicationStreamer` (`resource.py`).
///
/// # Call order
///
/// 1. Create it with [`Writer::new`]; tell it the current token of every
///    stream it writes with [`Writer::advance`] (from the database; for
///    in-memory streams such as `typing`, a start token above the previous
///    run's: see [Restarts](#restarts-tokens-never-go-backwards)). Streams
///    with no known token are not announced.
/// 2. When the connection is ready (over Redis: once the subscription is
///    confirmed), call [`Writer::request_replicate`] (if this process
///    follows streams, to learn the positions of others), then
///    [`Writer::connected`], which sends that `REPLICATE` and announces
///    every position at once. Call [`Writer::disconnected`] when the
///    connection is lost.
/// 3. Write with [`Writer::write`] (new rows and the stream's current
///    token) and [`Writer::advance`] (the token moved without rows).
/// 4. Feed received `REPLICATE`s to [`Writer::handle_replicate`] (or every
///    command to [`Writer::handle_command`]).
/// 5. After every input, drain [`Writer::poll_command`] until `None` and
///    send the commands in order, then arm a timer for
///    [`Writer::poll_timeout`] and call [`Writer::handle_timeout`] when it
///    passes. `now` must never go backwards.
///
/// What is sent is Synapse's: rows sharing a token go as `RDATA` with token
/// `batch` except the last; `POSITION last_row current` follows when the
/// current token is ahead of the last row; `POSITION last current` when the
/// token moved without rows; announcements are `POSITION t t` for every
/// stream, `t` the last token sent. While disconnected nothing is queued
/// and positions still move, as Synapse's `discard_updates_and_advance`:
/// followers fetch the rows after the next announcement.
///
/// Synapse skips the `POSITION` of `caches` when its token moved only
/// because other processes wrote; that is the caller's choice here (do not
/// call [`Writer::advance`] for it then).
///
/// # Restarts: tokens never go backwards
///
/// The tokens are the application's, and followers remember them: a
/// Synapse process drops `RDATA` at or below the last token it saw of a
/// writer, and a client whose `/sync` carries an older run's token sees
/// nothing of a stream until its tokens pass it. So a stream's tokens must
/// never go backwards, not even across the writer's restarts, and not for
/// a stream that lives in memory (Synapse's own typing writer starts again
/// at 0, and is not followed until it passes its old tokens). Start at
/// `max(the last token the previous run persisted + 1, a clock floor)`,
/// the floor e.g. milliseconds since the Unix epoch: with the persisted
/// token lost, that is still above the old run unless it averaged more
/// than one token per millisecond (or the clock stepped back).
///
/// What the previous run left standing as current (the rooms of `typing`,
/// which Synapse's followers show until a row replaces them) is replaced
/// by rows at the tokens after the start, written before connecting. With
/// a [`History`], the first announcement (`POSITION stream me cur cur`)
/// makes every follower at an older token fetch `(old, cur]`, and the
/// history, which begins at the start token and answers older ranges per
/// key ([`HistoryMode::Keyed`](crate::positions::HistoryMode::Keyed)),
/// answers those rows. `examples/typing_writer` does all of it.
pub struct Writer {
    own: InstanceName,
    registry: Arc<dyn WriterRegistry>,
    /// Last token sent (or that would have been sent) per stream.
    streams: Vec<(StreamName, Token)>,
    out: VecDeque<Command>,
    /// The queue ends with an announcement, so a new one adds nothing.
    ends_with_announcement: bool,
    connected: bool,
    replicate: Limiter,
    answer: Limiter,
    counters: WriterCounters,
    /// Where what is written is kept for catch-ups, if anywhere.
    history: Option<Arc<Mutex<History>>>,
}

impl fmt::Debug for Writer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Writer")
            .field("own", &self.own)
            .field("connected", &self.connected)
            .field("streams", &self.streams)
            .field("queued", &self.out.len())
            .field("counters", &self.counters)
            .field("history", &self.history.is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Limiter {
    limit: RateLimit,
    interval: Duration,
    last: Option<Instant>,
    pending: bool,
}

impl Limiter {
    fn new(limit: RateLimit) -> Limiter {
        Limiter {
            limit,
            interval: limit.min_interval,
            last: None,
            pending: false,
        }
    }

    fn deadline(&self) -> Option<Instant> {
        if !self.pending {
            return None;
        }
        let last = self.last?;
        // An interval beyond the clock's range never comes.
        last.checked_add(self.interval)
    }

    /// Asks for the action; true if it must happen now.
    fn request(&mut self, now: Instant) -> bool {
        self.pending = true;
        self.poll(now)
    }

    /// True if a pending action is due at `now` (and records it).
    fn poll(&mut self, now: Instant) -> bool {
        if !self.pending {
            return false;
        }
        if let Some(last) = self.last {
            match last.checked_add(self.interval) {
                Some(due) if now < due => return false,
                None => return false,
                Some(_) => {}
            }
            let since = now.saturating_duration_since(last);
            self.interval = if since < self.interval.saturating_mul(2) {
                self.interval
                    .saturating_mul(2)
                    .clamp(self.limit.min_interval, self.limit.max_interval)
            } else {
                self.limit.min_interval
            };
        }
        self.last = Some(now);
        self.pending = false;
        true
    }
}

/// Sort key: known streams in Synapse's order, then the others by name.
fn order(stream: &StreamName) -> (usize, &str) {
    let index = StreamName::KNOWN
        .iter()
        .position(|s| s == stream)
        .unwrap_or(usize::MAX);
    (index, stream.as_str())
}

impl Writer {
    /// A writer named `own_name`, writing what `registry` gives it, with the
    /// default [`WriterConfig`].
    pub fn new(own_name: InstanceName, registry: Arc<dyn WriterRegistry>) -> Writer {
        Writer::with_config(own_name, registry, WriterConfig::default())
    }

    /// A writer with the given rate limits.
    pub fn with_config(
        own_name: InstanceName,
        registry: Arc<dyn WriterRegistry>,
        config: WriterConfig,
    ) -> Writer {
        Writer {
            own: own_name,
            registry,
            streams: Vec::new(),
            out: VecDeque::new(),
            ends_with_announcement: false,
            connected: false,
            replicate: Limiter::new(config.replicate),
            answer: Limiter::new(config.answer),
            counters: WriterCounters::default(),
            history: None,
        }
    }

    /// Keeps what this writer writes in `history` too, so that writing a
    /// row is also keeping it where catch-ups are answered from: every
    /// row given to [`Writer::write`] is recorded, and every position
    /// [`Writer::write`] or [`Writer::advance`] reaches is told, before
    /// anything is sent. A stream first advanced to a token above 0 begins
    /// there ([`History::begin`]: nothing below it is known), unless the
    /// history already holds this writer's rows of it.
    ///
    /// Serve the same `Arc` to followers: it is a
    /// [`CatchUpSource`](crate::transport::CatchUpSource) (for a Rust
    /// follower's client, and `HttpServer` for Synapse's processes).
    /// Write to it only through this writer.
    #[must_use]
    pub fn with_history(mut self, history: Arc<Mutex<History>>) -> Writer {
        self.set_history(history);
        self
    }

    /// [`Writer::with_history`], for a writer a session holds.
    pub(crate) fn set_history(&mut self, history: Arc<Mutex<History>>) {
        self.history = Some(history);
    }

    /// The history given to [`Writer::with_history`], if any.
    pub fn history(&self) -> Option<&Arc<Mutex<History>>> {
        self.history.as_ref()
    }

    fn lock_history(&self) -> Option<MutexGuard<'_, History>> {
        self.history
            .as_ref()
            .map(|history| history.lock().unwrap_or_else(|poison| poison.into_inner()))
    }

    fn check(&self, stream: &StreamName) -> Result<Option<Token>, WriteError> {
        if !self.registry.may_write(stream, &self.own) {
            return Err(WriteError::NotAWriter {
                stream: stream.clone(),
                instance: self.own.clone(),
            });
        }
        Ok(self.position(stream))
    }

    fn set(&mut self, stream: &StreamName, token: Token) {
        match self.streams.iter_mut().find(|(s, _)| s == stream) {
            Some((_, last)) => *last = token,
            None => {
                // A stored copy, sharing no buffer with anything else.
                let stream = StreamName::from(stream.as_str());
                let at = self
                    .streams
                    .partition_point(|(s, _)| order(s) < order(&stream));
                self.streams.insert(at, (stream, token));
            }
        }
    }

    fn push(&mut self, command: Command) {
        self.ends_with_announcement = false;
        self.out.push_back(command);
    }

    fn position_command(&self, stream: &StreamName, prev: Token, new: Token) -> Command {
        Command::Position(Position {
            stream: stream.clone(),
            instance: self.own.clone(),
            prev_token: prev,
            new_token: new,
        })
    }

    /// Sends new rows of `stream` (sorted by token, each above the last
    /// token sent) and the stream's `current` token.
    ///
    /// Rows sharing a token are sent as one batch; `POSITION last_row
    /// current` follows when `current` is ahead. With no rows this is
    /// [`Writer::advance`]. Refused whole, with nothing sent, if the
    /// registry does not give this process the stream or the tokens are
    /// inconsistent.
    pub fn write(
        &mut self,
        stream: &StreamName,
        current: Token,
        updates: impl IntoIterator<Item = (Token, RawRow)>,
    ) -> Result<(), WriteError> {
        let last = self.check(stream)?;
        let updates: Vec<(Token, RawRow)> = updates.into_iter().collect();
        let Some(&(last_row, _)) = updates.last() else {
            return self.advance(stream, current);
        };
        let mut previous: Option<Token> = None;
        for &(token, _) in &updates {
            if let Some(last) = last.filter(|last| token <= *last) {
                return Err(WriteError::TokenNotAbove {
                    stream: stream.clone(),
                    token,
                    last,
                });
            }
            if let Some(previous) = previous.filter(|previous| token < *previous) {
                return Err(WriteError::OutOfOrder {
                    stream: stream.clone(),
                    token,
                    previous,
                });
            }
            previous = Some(token);
        }
        if current < last_row {
            return Err(WriteError::CurrentTooLow {
                stream: stream.clone(),
                current,
                token: last_row,
            });
        }
        if let Some(mut history) = self.lock_history() {
            history.record(stream, &self.own, updates.iter().cloned())?;
            history.advance(stream, &self.own, current);
        }
        self.set(stream, current);
        if !self.connected {
            self.counters.rows_unsent += updates.len() as u64;
            return Ok(());
        }
        let mut updates = updates.into_iter().peekable();
        while let Some((token, row)) = updates.next() {
            let batched = updates.peek().is_some_and(|(next, _)| *next == token);
            self.counters.rdata_sent += 1;
            self.push(Command::Rdata(Rdata {
                stream: stream.clone(),
                instance: self.own.clone(),
                token: if batched {
                    RdataToken::Batch
                } else {
                    RdataToken::At(token)
                },
                row,
            }));
        }
        if last_row < current {
            self.counters.positions_sent += 1;
            let command = self.position_command(stream, last_row, current);
            self.push(command);
        }
        Ok(())
    }

    /// The token of `stream` moved to `current` without rows (or, before
    /// connecting, the stream's starting token): `POSITION last current`.
    /// Nothing is sent if it did not move.
    pub fn advance(&mut self, stream: &StreamName, current: Token) -> Result<(), WriteError> {
        let last = self.check(stream)?;
        if let Some(last) = last {
            if current < last {
                return Err(WriteError::CurrentTooLow {
                    stream: stream.clone(),
                    current,
                    token: last,
                });
            }
            if current == last {
                return Ok(());
            }
        }
        if let Some(mut history) = self.lock_history() {
            if last.is_none() && current > Token(0) && history.last(stream, &self.own).is_none() {
                history.begin(stream, &self.own, current);
            } else {
                history.advance(stream, &self.own, current);
            }
        }
        self.set(stream, current);
        if self.connected {
            self.counters.positions_sent += 1;
            let command = self.position_command(stream, last.unwrap_or(current), current);
            self.push(command);
        }
        Ok(())
    }

    /// The connection is ready: every position is announced at once (a new
    /// subscriber cannot be seen by the others, so they cannot ask), before
    /// anything written from now on. Not rate limited: followers rely on it
    /// to see the rows written while this process was away.
    ///
    /// A `REPLICATE` asked for with [`Writer::request_replicate`] while
    /// disconnected goes first, if the rate limit allows.
    pub fn connected(&mut self, now: Instant) {
        self.connected = true;
        if self.replicate.poll(now) {
            self.counters.replicates_sent += 1;
            self.push(Command::Replicate);
        }
        self.announce();
    }

    /// The connection is lost: queued commands are dropped (positions keep
    /// moving; the next connection's announcement covers them), as are
    /// delayed `REPLICATE`s and answers. The rate limits remember their
    /// history, so a reconnect loop stays slowed down.
    pub fn disconnected(&mut self) {
        self.connected = false;
        self.counters.dropped_on_disconnect += self.out.len() as u64;
        self.out.clear();
        self.ends_with_announcement = false;
        self.replicate.pending = false;
        self.answer.pending = false;
    }

    /// Whether a connection is up.
    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// Asks every writer of the deployment for its positions (`REPLICATE`),
    /// now or, if one was sent recently, when the rate limit allows. Asked
    /// while disconnected, it is sent by the next [`Writer::connected`]
    /// (before the announcement), unless [`Writer::disconnected`] comes
    /// first.
    pub fn request_replicate(&mut self, now: Instant) {
        if !self.connected {
            self.replicate.pending = true;
            return;
        }
        if self.replicate.request(now) {
            self.counters.replicates_sent += 1;
            self.push(Command::Replicate);
        } else {
            self.counters.replicates_delayed += 1;
        }
    }

    /// Another process asked for positions (`REPLICATE`): announce them,
    /// now or when the rate limit allows; requests while an announcement is
    /// pending share it.
    pub fn handle_replicate(&mut self, now: Instant) {
        self.counters.replicates_received += 1;
        if !self.connected {
            return;
        }
        if self.answer.request(now) {
            self.announce();
        }
    }

    /// Handles one received command: only `REPLICATE` matters here.
    pub fn handle_command(&mut self, command: &Command, now: Instant) {
        if matches!(command, Command::Replicate) {
            self.handle_replicate(now);
        }
    }

    /// When [`Writer::handle_timeout`] must be called next, if ever (never
    /// while disconnected). Handling a timeout at or after this instant
    /// always moves it forward or clears it.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        if !self.connected {
            return None;
        }
        match (self.replicate.deadline(), self.answer.deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Sends what the rate limits held back, if due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if !self.connected {
            return;
        }
        if self.replicate.poll(now) {
            self.counters.replicates_sent += 1;
            self.push(Command::Replicate);
        }
        if self.answer.poll(now) {
            self.announce();
        }
    }

    /// The next command to send, or `None`. Drain after every input.
    #[must_use]
    pub fn poll_command(&mut self) -> Option<Command> {
        let command = self.out.pop_front();
        if self.out.is_empty() {
            self.ends_with_announcement = false;
        }
        command
    }

    /// The last token sent for `stream`.
    pub fn position(&self, stream: &StreamName) -> Option<Token> {
        self.streams
            .iter()
            .find(|(s, _)| s == stream)
            .map(|(_, token)| *token)
    }

    /// Every stream with a known token, in Synapse's order.
    pub fn positions(&self) -> impl Iterator<Item = (&StreamName, Token)> {
        self.streams.iter().map(|(s, t)| (s, *t))
    }

    /// What the writer has done so far.
    pub fn counters(&self) -> &WriterCounters {
        &self.counters
    }

    /// The writer's own instance name.
    pub fn own_name(&self) -> &InstanceName {
        &self.own
    }

    fn announce(&mut self) {
        if self.ends_with_announcement {
            self.counters.answers_coalesced += 1;
            return;
        }
        self.counters.announcements += 1;
        let commands: Vec<Command> = self
            .streams
            .iter()
            .filter(|(stream, _)| self.registry.may_write(stream, &self.own))
            .map(|(stream, token)| self.position_command(stream, *token, *token))
            .collect();
        for command in commands {
            self.counters.positions_sent += 1;
            self.push(command);
        }
        self.ends_with_announcement = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiter_backs_off_and_recovers() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut l = Limiter::new(RateLimit::new(s(1), s(4)));
        assert!(l.request(t0));
        assert!(!l.request(t0 + Duration::from_millis(10)));
        assert_eq!(l.deadline(), Some(t0 + s(1)));
        assert!(!l.poll(t0 + Duration::from_millis(999)));
        assert!(l.poll(t0 + s(1)));
        assert_eq!(l.interval, s(2));
        assert!(!l.request(t0 + s(2)));
        assert!(l.poll(t0 + s(3)));
        assert_eq!(l.interval, s(4));
        assert!(!l.request(t0 + s(4)));
        assert!(l.poll(t0 + s(7)));
        assert_eq!(l.interval, s(4), "capped");
        // A quiet spell of twice the interval resets it.
        assert!(l.request(t0 + s(16)));
        assert_eq!(l.interval, s(1));
        assert_eq!(l.deadline(), None);
    }

    /// Writing keeps what was written, and a history asked beyond the
    /// writer's position confirms no more than it reached.
    #[test]
    fn a_writer_with_a_history_keeps_what_it_writes() {
        use crate::positions::{CatchUpId, CatchUpRequest};
        let registry = std::sync::Arc::new(crate::config::StreamWriters::default());
        let history = Arc::new(Mutex::new(History::new(10)));
        let mut writer =
            Writer::new(InstanceName::master(), registry).with_history(history.clone());
        let row = |text: &str| RawRow::new(format!("[\"{text}\"]").into_bytes()).unwrap();
        writer.advance(&StreamName::Caches, Token(3)).unwrap();
        writer
            .write(
                &StreamName::Caches,
                Token(6),
                [(Token(4), row("a")), (Token(5), row("b"))],
            )
            .unwrap();
        writer.advance(&StreamName::Typing, Token(0)).unwrap();
        let ask = |from, to| CatchUpRequest {
            id: CatchUpId::new(1),
            stream: StreamName::Caches,
            writer: InstanceName::master(),
            from: Token(from),
            to: Token(to),
        };
        let history = history.lock().unwrap();
        let page = history.answer(&ask(3, 9), 100).unwrap();
        assert_eq!(page.updates, [(Token(4), row("a")), (Token(5), row("b"))]);
        assert_eq!(
            page.upto,
            Token(6),
            "confirmed up to the writer's position only"
        );
        // Below where the stream began nothing is known.
        assert!(history.answer(&ask(1, 4), 100).is_err());
        assert_eq!(
            history.last(&StreamName::Typing, &InstanceName::master()),
            Some(Token(0))
        );
    }

    /// A restart as the docs say: the start token above the old run, the
    /// rows replacing what it left written before connecting, announced
    /// once, and answered to a follower at the old run's token.
    #[test]
    fn a_restarted_writer_announces_its_start_and_answers_the_rows_replacing_the_old_run() {
        use crate::positions::{CatchUpId, CatchUpRequest, HistoryMode};
        let registry = std::sync::Arc::new(crate::config::StreamWriters::default());
        let history =
            History::new(10).with_mode(StreamName::Typing, HistoryMode::Keyed { key_len: 1 });
        let history = Arc::new(Mutex::new(history));
        let mut writer =
            Writer::new(InstanceName::master(), registry).with_history(history.clone());
        // The old run reached 1_700_000_000_005; the clock says more.
        let (old, start) = (1_700_000_000_005, 1_700_000_000_100);
        writer.advance(&StreamName::Typing, Token(start)).unwrap();
        for (token, room) in [(start + 1, "!a"), (start + 2, "!b")] {
            let row = RawRow::new(format!(r#"["{room}",[]]"#).into_bytes()).unwrap();
            writer
                .write(&StreamName::Typing, Token(token), [(Token(token), row)])
                .unwrap();
        }
        writer.connected(Instant::now());
        let sent: Vec<Command> = std::iter::from_fn(|| writer.poll_command()).collect();
        let cur = start + 2;
        let announced = Command::Position(Position {
            stream: StreamName::Typing,
            instance: InstanceName::master(),
            prev_token: Token(cur),
            new_token: Token(cur),
        });
        assert_eq!(sent, [announced]);
        let ask = |from| CatchUpRequest {
            id: CatchUpId::new(1),
            stream: StreamName::Typing,
            writer: InstanceName::master(),
            from: Token(from),
            to: Token(cur),
        };
        let history = history.lock().unwrap();
        let cleared = [
            (Token(start + 1), r#"["!a",[]]"#),
            (Token(start + 2), r#"["!b",[]]"#),
        ];
        for from in [old, 0, start] {
            let page = history.answer(&ask(from), 100).unwrap();
            let rows: Vec<_> = page.updates.iter().map(|(t, r)| (*t, r.as_str())).collect();
            assert_eq!(rows, cleared, "from {from}");
            assert_eq!((page.upto, page.limited), (Token(cur), false));
        }
        // A follower above (a lost state file and a clock that stepped
        // back): nothing to give it.
        assert!(
            history
                .answer(&ask(cur + 7), 100)
                .unwrap()
                .updates
                .is_empty()
        );
    }

    #[test]
    fn timeouts_move_forward() {
        let t0 = Instant::now();
        let registry = std::sync::Arc::new(crate::config::StreamWriters::default());
        let mut w = Writer::new(InstanceName::master(), registry);
        w.request_replicate(t0);
        assert_eq!(w.poll_timeout(), None, "disconnected");
        w.connected(t0);
        w.request_replicate(t0);
        w.handle_replicate(t0);
        w.handle_replicate(t0);
        let mut now = t0;
        let mut fired = 0;
        while let Some(due) = w.poll_timeout() {
            assert!(due > now || fired == 0);
            now = due;
            w.handle_timeout(now);
            fired += 1;
            assert!(fired < 3);
        }
        let sent: Vec<Command> = std::iter::from_fn(|| w.poll_command()).collect();
        assert_eq!(
            sent.iter()
                .filter(|c| matches!(c, Command::Replicate))
                .count(),
            2
        );
    }

    #[test]
    fn no_limit_never_delays() {
        let t0 = Instant::now();
        let mut l = Limiter::new(RateLimit::none());
        for _ in 0..5 {
            assert!(l.request(t0));
        }
    }
}
