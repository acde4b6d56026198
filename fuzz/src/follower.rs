//! Drives a follower with arbitrary command sequences, connections and
//! catch-up answers (honest or not), under tiny limits, and checks after
//! every step what the follower promises:
//!
//! - rows of a (stream, writer) come above where following started (its
//!   first position, a seed, a reset), never the same rows at the same
//!   token twice; `resume_point()` is the highest token delivered (or the
//!   start) and `position()` is never below it; position events are not
//!   below it either; a writer starts only where it had no position (or
//!   was forgotten);
//! - a catch-up asks for a non-empty range above the start; at most one
//!   is outstanding per (stream, writer); caught-up rows lie in the range
//!   asked for, and no live rows of a writer come while its catch-up is
//!   outstanding;
//! - rejected commands, own echoes and refused catch-up pages change
//!   nothing; rejections are for non-writers, or at the pair limit;
//! - held bytes, held commands (per writer waiting) and the pairs of
//!   writers the configuration does not name stay within the limits.
//!
//! Inputs speak in any writer's name, so every line may be forged: rows
//! below the last delivered, and positions that go down, are what the
//! follower does when a forged line is refuted.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use synapse_replication::config::StreamWriters;
use synapse_replication::positions::{
    CatchUpId, CatchUpPage, CatchUpRequest, Follower, FollowerEvent, FollowerLimits, RejectReason,
    RowOrigin,
};
use synapse_replication::wire::{
    Command, InstanceName, Position, RawRow, Rdata, RdataToken, StreamName, Token,
};
use synapse_replication::writers::WriterRegistry;

const STREAMS: [&str; 5] = ["events", "typing", "caches", "receipts", "org.example.x"];
const WRITERS: [&str; 8] = ["w1", "w2", "w3", "master", "me", "evil", "c1", "c2"];
const ROWS: [&str; 4] = [
    "[]",
    r#"["a",null,1]"#,
    r#"{"k":"0123456789"}"#,
    "[1,[2,[3]]]",
];

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*first)
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        Some(items[usize::from(self.byte()?) % items.len()])
    }

    /// A token near `around`: mostly just above it, sometimes anywhere.
    fn token(&mut self, around: Token) -> Option<Token> {
        let b = self.byte()?;
        Some(if b >= 240 {
            Token(i64::from(b & 0x0f) - 4)
        } else {
            Token(around.0.saturating_add(i64::from(b % 12) - 3))
        })
    }
}

type Pair = (StreamName, InstanceName);

/// Rows delivered at one token, as bytes.
type Delivery = (Token, Vec<Vec<u8>>);

struct Harness {
    follower: Follower,
    /// Every (stream, writer) the input can name.
    all_pairs: Vec<Pair>,
    registry: Arc<dyn WriterRegistry>,
    /// Where following started (first position, seed, reset).
    starts: HashMap<Pair, Token>,
    /// The highest token delivered, or the start.
    positions: HashMap<Pair, Token>,
    /// Every (token, rows) delivered since the start.
    delivered: HashMap<Pair, HashSet<Delivery>>,
    /// Pairs the configuration names: not counted by the limit.
    configured: usize,
    /// Pairs whose start is only their first announcement, with no row
    /// since: a lower announcement moves the start down.
    claimed: HashSet<Pair>,
    /// Outstanding catch-ups, by (stream, writer).
    catch_ups: HashMap<Pair, CatchUpRequest>,
    /// Every id ever handed out (to answer stale ones).
    ids: Vec<CatchUpId>,
}

impl Harness {
    fn snapshot(&self) -> Vec<Option<Token>> {
        self.all_pairs
            .iter()
            .map(|(s, w)| self.follower.position(s, w))
            .collect()
    }

    fn check_state(&self) {
        let f = &self.follower;
        let limits = f.limits();
        assert!(f.buffered_bytes() <= limits.max_buffered_bytes);
        assert!(f.tracked_pairs() <= limits.max_tracked_pairs + self.configured);
        // Commands are held per writer, behind its outstanding catch-up.
        for s in STREAMS {
            let stream = StreamName::from(s);
            let waiting = self.catch_ups.keys().filter(|(s, _)| *s == stream).count();
            assert!(f.queued_commands(&stream) <= limits.max_queued_commands * waiting);
        }
        for pair in &self.all_pairs {
            let (s, w) = pair;
            let expected = self.positions.get(pair).copied();
            let actual = f.resume_point(s, w);
            // A pair seen for the first time may have no event yet (no position).
            if expected.is_some() || actual.is_some() {
                assert_eq!(actual, expected, "resume point of {s} {w}");
                assert!(f.position(s, w) >= actual, "position of {s} {w}");
            }
            if w.as_str() == "me" {
                assert_eq!(actual, None, "own positions are never tracked");
            }
        }
        let outstanding = f.outstanding_catch_ups();
        assert_eq!(outstanding.len(), self.catch_ups.len());
        for request in outstanding {
            let key = (request.stream.clone(), request.writer.clone());
            assert_eq!(self.catch_ups.get(&key), Some(&request));
        }
    }

    /// Drains events, checking each against the model.
    fn drain(&mut self) {
        while let Some(event) = self.follower.poll_event() {
            match event {
                FollowerEvent::Rows {
                    stream,
                    writer,
                    token,
                    rows,
                    source,
                } => {
                    assert!(!rows.is_empty());
                    let key = (stream.clone(), writer.clone());
                    let start = self.starts.get(&key).copied();
                    assert!(
                        start.is_some_and(|start| token > start),
                        "rows {stream} {writer} {token}, started at {start:?}"
                    );
                    let bytes = rows.iter().map(|r| r.as_bytes().to_vec()).collect();
                    assert!(
                        self.delivered
                            .entry(key.clone())
                            .or_default()
                            .insert((token, bytes)),
                        "rows {stream} {writer} {token} delivered twice"
                    );
                    if source == RowOrigin::CatchUp {
                        let request = self.catch_ups.get(&key).expect("rows of no catch-up");
                        assert!(request.from < token && token <= request.to);
                    } else {
                        assert!(
                            !self.catch_ups.contains_key(&key),
                            "live rows while the writer waits"
                        );
                    }
                    self.claimed.remove(&key);
                    let last = self.positions.entry(key).or_insert(token);
                    *last = (*last).max(token);
                }
                FollowerEvent::Position {
                    stream,
                    writer,
                    token,
                } => {
                    let key = (stream.clone(), writer.clone());
                    let below = self
                        .positions
                        .get(&key)
                        .copied()
                        .filter(|last| token < *last);
                    if let Some(last) = below {
                        assert!(
                            self.claimed.contains(&key),
                            "position {stream} {writer} {token} below the rows, at {last}"
                        );
                        self.restart(key.clone(), token);
                        self.claimed.insert(key.clone());
                    }
                    // A position ends the catch-up of this writer, if any.
                    self.catch_ups.remove(&key);
                }
                FollowerEvent::Started {
                    stream,
                    writer,
                    token,
                } => {
                    // Only a writer without a position starts.
                    let key = (stream, writer);
                    assert_eq!(self.positions.get(&key), None, "started again at {token}");
                    assert!(!self.catch_ups.contains_key(&key));
                    self.restart(key.clone(), token);
                    self.claimed.insert(key);
                }
                FollowerEvent::Reset {
                    stream,
                    writer,
                    previous,
                    new,
                } => {
                    let key = (stream.clone(), writer.clone());
                    assert!(new < previous);
                    assert_eq!(stream, StreamName::Typing, "only typing resets here");
                    self.restart(key, if new > Token(0) { Token(0) } else { new });
                }
                FollowerEvent::CatchUp(request) => {
                    assert!(request.from < request.to, "{request}");
                    let key = (request.stream.clone(), request.writer.clone());
                    let start = self.starts.get(&key).copied();
                    match self.catch_ups.get(&key) {
                        // The next page (or a retry) of the same catch-up.
                        Some(previous) => {
                            assert_eq!(previous.to, request.to);
                            assert!(request.from >= previous.from);
                        }
                        None => assert!(
                            start.is_some_and(|start| request.from >= start),
                            "{request}, started at {start:?}"
                        ),
                    }
                    self.ids.push(request.id);
                    self.catch_ups.insert(key, request);
                }
                FollowerEvent::Rejected {
                    stream,
                    instance,
                    reason,
                    ..
                } => match reason {
                    RejectReason::NotAWriter => {
                        assert!(!self.registry.may_write(&stream, &instance))
                    }
                    RejectReason::TooManyWriters => assert!(
                        self.follower.tracked_pairs() >= self.follower.limits().max_tracked_pairs
                    ),
                    _ => {}
                },
                FollowerEvent::Forgotten { stream, writer, .. } => {
                    let key = (stream, writer);
                    assert!(
                        !self.catch_ups.contains_key(&key),
                        "forgotten while caught up"
                    );
                    assert!(!self.registry.is_configured(&key.0, &key.1));
                    self.forget(&key);
                }
                _ => {}
            }
        }
    }

    /// Following `key` starts (again) at `token`.
    fn restart(&mut self, key: Pair, token: Token) {
        self.claimed.remove(&key);
        self.starts.insert(key.clone(), token);
        self.positions.insert(key.clone(), token);
        self.delivered.remove(&key);
    }

    fn forget(&mut self, key: &Pair) {
        self.claimed.remove(key);
        self.starts.remove(key);
        self.positions.remove(key);
        self.delivered.remove(key);
    }

    /// Applies a command; rejected or echoed ones must change nothing.
    fn command(&mut self, command: Command) {
        let before = self.snapshot();
        let echo = match &command {
            Command::Rdata(r) => r.instance.as_str() == "me",
            Command::Position(p) => p.instance.as_str() == "me",
            _ => false,
        };
        let rejected_before = self.follower.counters().rejected;
        self.follower.handle_command(command);
        if echo || self.follower.counters().rejected > rejected_before {
            assert_eq!(self.snapshot(), before);
        }
        if echo {
            assert_eq!(self.follower.poll_event(), None);
        }
        self.drain();
    }

    fn page(&mut self, input: &mut Input<'_>) -> Option<()> {
        let mut requests: Vec<CatchUpRequest> = self.catch_ups.values().cloned().collect();
        requests.sort_by_key(|r| r.id);
        let honest = input.byte()? % 4 != 0;
        let id = if requests.is_empty() || input.byte()? % 8 == 0 {
            let Some(id) = self
                .ids
                .get(usize::from(input.byte()?) % self.ids.len().max(1))
            else {
                return Some(());
            };
            *id
        } else {
            requests[usize::from(input.byte()?) % requests.len()].id
        };
        let request = requests.iter().find(|r| r.id == id).cloned();
        let mut updates = Vec::new();
        let (upto, limited);
        match (&request, honest) {
            (Some(request), true) => {
                let mut token = request.from;
                for _ in 0..input.byte()? % 5 {
                    token = Token(token.0.saturating_add(i64::from(input.byte()? % 3)));
                    if token <= request.from || token > request.to {
                        continue;
                    }
                    updates.push((token, RawRow::new(Bytes::from_static(b"[0]")).ok()?));
                }
                limited = input.byte()? % 2 == 0;
                let last = updates.last().map_or(request.from, |(t, _)| *t);
                upto = if limited {
                    Token(last.0.max(request.from.0 + 1))
                } else {
                    request.to
                };
            }
            _ => {
                for _ in 0..input.byte()? % 4 {
                    updates.push((
                        input.token(Token(0))?,
                        RawRow::new(Bytes::from_static(b"[1]")).ok()?,
                    ));
                }
                upto = input.token(Token(0))?;
                limited = input.byte()? % 2 == 0;
            }
        }
        let before = self.snapshot();
        let result = self.follower.handle_catch_up(
            id,
            CatchUpPage {
                updates,
                upto,
                limited,
            },
        );
        match result {
            Ok(()) => {
                assert!(request.is_some(), "a page for no catch-up was accepted");
                self.drain();
            }
            Err(_) => {
                assert!(!(honest && request.is_some()), "an honest page was refused");
                assert_eq!(self.follower.poll_event(), None);
                assert_eq!(self.snapshot(), before);
            }
        }
        Some(())
    }

    fn step(&mut self, input: &mut Input<'_>) -> Option<()> {
        match input.byte()? % 12 {
            0..=3 => {
                let stream = StreamName::from(input.pick(&STREAMS)?);
                let writer = InstanceName::from(input.pick(&WRITERS)?);
                let around = self
                    .positions
                    .get(&(stream.clone(), writer.clone()))
                    .copied();
                let token = if input.byte()? % 3 == 0 {
                    RdataToken::Batch
                } else {
                    RdataToken::At(input.token(around.unwrap_or(Token(0)))?)
                };
                let row = RawRow::new(Bytes::from_static(input.pick(&ROWS)?.as_bytes())).ok()?;
                self.command(Command::Rdata(Rdata {
                    stream,
                    instance: writer,
                    token,
                    row,
                }));
            }
            4..=5 => {
                let stream = StreamName::from(input.pick(&STREAMS)?);
                let writer = InstanceName::from(input.pick(&WRITERS)?);
                let around = self
                    .positions
                    .get(&(stream.clone(), writer.clone()))
                    .copied()
                    .unwrap_or_default();
                let prev_token = input.token(around)?;
                let new_token = input.token(around)?;
                self.command(Command::Position(Position {
                    stream,
                    instance: writer,
                    prev_token,
                    new_token,
                }));
            }
            6 => {
                self.follower.connected();
                self.drain();
            }
            7 => {
                self.follower.disconnected();
                self.drain();
            }
            8 | 9 => self.page(input)?,
            10 => {
                let pick = usize::from(input.byte()?) % self.ids.len().max(1);
                if let Some(id) = self.ids.get(pick).copied() {
                    let outstanding = self.catch_ups.values().any(|c| c.id == id);
                    let result = self.follower.catch_up_failed(id);
                    assert_eq!(result.is_ok(), outstanding);
                    self.drain();
                }
            }
            _ => {
                let stream = StreamName::from(input.pick(&STREAMS)?);
                let writer = InstanceName::from(input.pick(&WRITERS)?);
                if input.byte()? % 2 == 0 {
                    let token = input.token(Token(0))?;
                    if self.follower.set_position(&stream, &writer, token).is_ok() {
                        self.restart((stream, writer), token);
                    }
                } else if self.follower.forget_writer(&stream, &writer) {
                    self.forget(&(stream, writer));
                }
                self.drain();
            }
        }
        Some(())
    }
}

fn registry() -> Arc<dyn WriterRegistry> {
    static REGISTRY: OnceLock<Arc<dyn WriterRegistry>> = OnceLock::new();
    REGISTRY
        .get_or_init(|| {
            Arc::new(
                StreamWriters::from_json(
                    r#"{"redis": {"enabled": true},
                        "instance_map": {"w1": {"host": "a", "port": 1},
                                         "w2": {"host": "b", "port": 2},
                                         "w3": {"host": "c", "port": 3}},
                        "stream_writers": {"events": ["w1", "w2"], "receipts": ["w1", "w2"],
                                           "typing": "w3"}}"#,
                )
                .unwrap(),
            )
        })
        .clone()
}

/// Runs one input through the checks; panics where one fails.
pub fn check(data: &[u8]) {
    let registry = registry();
    let all_pairs: Vec<Pair> = STREAMS
        .iter()
        .flat_map(|s| {
            WRITERS
                .iter()
                .map(move |w| (StreamName::from(*s), InstanceName::from(*w)))
        })
        .collect();
    let configured = all_pairs
        .iter()
        .filter(|(s, w)| registry.is_configured(s, w))
        .count();
    let mut limits = FollowerLimits::default();
    limits.max_queued_commands = 4;
    limits.max_batch_rows = 3;
    limits.max_buffered_bytes = 100;
    limits.max_tracked_pairs = 6;
    let mut harness = Harness {
        follower: Follower::with_limits(InstanceName::from("me"), registry.clone(), limits),
        all_pairs,
        registry,
        starts: HashMap::new(),
        positions: HashMap::new(),
        delivered: HashMap::new(),
        configured,
        claimed: HashSet::new(),
        catch_ups: HashMap::new(),
        ids: Vec::new(),
    };
    let mut input = Input(data);
    while harness.step(&mut input).is_some() {
        harness.check_state();
    }
    harness.check_state();
}
