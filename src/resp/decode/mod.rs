//! Bytes to frames: an incremental decoder that never recurses.
//!
//! Decoding runs in two passes over one frame. The first, [`RespDecoder::scan`],
//! walks the headers, skips bulk payloads by their declared length, checks
//! every cap before waiting for (or allocating for) what a header declares,
//! and records each value as a small token of offsets, keeping an explicit
//! stack of open aggregates instead of recursing. It allocates nothing
//! but its reusable token list, and saves its progress, so a frame that
//! arrives in many small reads is scanned once, not once per read. Only
//! when the frame is complete is it split off the buffer and frozen, and
//! the second pass, [`RespDecoder::build`], turns the tokens into a [`Frame`]
//! whose strings are views of the frozen bytes.

//!
//! `limits` holds the caps; `fast` the subscriber's hot path for
//! `message` frames on known channels.

mod fast;
mod limits;

pub use fast::Channels;
pub use limits::Limits;

use bytes::{Bytes, BytesMut};

use super::error::{RespError, snippet};
use super::frame::{Frame, Incoming, Message};
use super::value;
use fast::fast_integer;

/// An incremental RESP2 and RESP3 decoder: bytes in, [`Frame`]s out.
///
/// # The decode contract
///
/// Give it the connection's unconsumed input. Each call returns:
/// - `Ok(Some(frame))`: the first frame, which was removed from the front
///   of the buffer (as [`BytesMut::split_to`], so the frame's strings are
///   views of those bytes, with no copy);
/// - `Ok(None)`: the buffer holds no complete frame yet. Nothing was
///   consumed; read more bytes, append them, call again. Any split of the
///   input decodes to the same frames;
/// - `Err(_)`: the input is not RESP or breaks a [`Limits`] cap. The buffer
///   is left as it was; the connection cannot continue (RESP has no way to
///   resynchronise), so close it.
///
/// Call it in a loop until `Ok(None)` after every read: one read can hold
/// many frames.
///
/// Between calls the buffer may only grow at the back: the decoder
/// remembers how far it got into an incomplete frame. Use one decoder per
/// connection and [`RespDecoder::reset`] it when the buffer is discarded (on a
/// reconnect). RESP2 and RESP3 types are accepted at any time.
///
/// [`RespDecoder::decode_pubsub`] is the subscriber's hot path, and
/// [`RespDecoder::decode_bytes`] the same contract on an immutable [`Bytes`].
#[derive(Clone, Debug, Default)]
pub struct RespDecoder {
    pub(super) limits: Limits,
    /// Where the next header of the pending frame starts.
    pos: usize,
    /// The buffer length below which no progress is possible.
    need: usize,
    /// Where the search for the end of the line at `pos` resumes.
    line_from: usize,
    /// Elements still expected by each open aggregate, outermost first.
    open: Vec<usize>,
    /// The values of the pending frame, in order.
    tokens: Vec<Token>,
    /// Aggregates under construction, reused across frames.
    building: Vec<Building>,
    /// Whether the message fast paths may run under `limits`
    /// ([`fast::fast_paths_fit`]), decided once: they run for every message.
    fast: bool,
}

/// A range of the buffer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Span {
    pub(super) start: usize,
    pub(super) end: usize,
}

/// A scalar, located in the buffer.
#[derive(Clone, Copy, Debug)]
enum Leaf {
    SimpleString(Span),
    Error(Span),
    Integer(i64),
    BulkString(Span),
    NullBulkString,
    NullArray,
    Null,
    Boolean(bool),
    Double(Span),
    BigNumber(Span),
    BulkError(Span),
    Verbatim { format: [u8; 3], text: Span },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Aggregate {
    Array,
    Map,
    Set,
    Attribute,
    Push,
}

#[derive(Clone, Copy, Debug)]
enum Token {
    Leaf(Leaf),
    /// An aggregate header, with its declared count (pairs for maps and
    /// attributes).
    Open(Aggregate, usize),
}

#[derive(Clone, Debug)]
enum Building {
    List {
        kind: Aggregate,
        left: usize,
        items: Vec<Frame>,
    },
    Pairs {
        attribute: bool,
        left: usize,
        pairs: Vec<(Frame, Frame)>,
        key: Option<Frame>,
    },
    /// An attribute whose pairs are complete, waiting for its value.
    Annotated { attributes: Vec<(Frame, Frame)> },
}

enum Progress {
    /// A frame ends at this offset.
    Complete(usize),
    Incomplete,
}

/// Token lists longer than this are trimmed after their frame is built,
/// so one huge frame does not pin memory for the connection's lifetime.
const TOKENS_KEPT: usize = 4096;

impl RespDecoder {
    /// Whether no frame is under way (nothing scanned, nothing pending).
    pub(crate) fn is_idle(&self) -> bool {
        self.pos == 0 && self.tokens.is_empty()
    }

    /// A decoder with the default [`Limits`].
    pub const fn new() -> Self {
        Self::with_limits(Limits::new())
    }

    /// A decoder with the given limits.
    pub const fn with_limits(limits: Limits) -> Self {
        RespDecoder {
            limits,
            pos: 0,
            need: 0,
            line_from: 0,
            open: Vec::new(),
            tokens: Vec::new(),
            building: Vec::new(),
            fast: fast::fast_paths_fit(&limits),
        }
    }

    /// The decoder's limits.
    pub const fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Forgets the progress made into an incomplete frame: call it when
    /// the buffer is discarded, e.g. on a reconnect.
    pub fn reset(&mut self) {
        self.pos = 0;
        self.need = 0;
        self.line_from = 0;
        self.open.clear();
        self.tokens.clear();
    }

    /// A length the buffer must reach before the next call can return a
    /// frame: after `Ok(None)`, at least one byte more than the buffer had,
    /// and, when a bulk header has been read, the end of its payload. A
    /// transport may use it to size its next read; it never exceeds
    /// [`Limits::max_frame_len`] by more than one header (24 bytes).
    pub const fn min_buffer_len(&self) -> usize {
        self.need
    }

    /// Decodes the first frame in `buf`, removing it from the front. See
    /// the [decode contract](RespDecoder#the-decode-contract).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, RespError> {
        match self.scan(buf)? {
            Progress::Incomplete => Ok(None),
            Progress::Complete(end) => {
                let frame = buf.split_to(end).freeze();
                let built = self.build(&frame);
                self.reset();
                built.map(Some)
            }
        }
    }

    /// Decodes the first frame in `input`, returning it with the number of
    /// bytes it took; the caller advances past them (e.g. with
    /// [`Bytes::slice`]) before the next call. The frame's strings are
    /// views of `input`. Otherwise the same contract as
    /// [`RespDecoder::decode`].
    pub fn decode_bytes(&mut self, input: &Bytes) -> Result<Option<(Frame, usize)>, RespError> {
        match self.scan(input)? {
            Progress::Incomplete => Ok(None),
            Progress::Complete(end) => {
                let built = self.build(input);
                self.reset();
                built.map(|frame| Some((frame, end)))
            }
        }
    }

    /// Decodes the first frame in `buf` as a pub/sub subscriber sees it:
    /// the same contract as [`RespDecoder::decode`], and the same result as
    /// [`Incoming::from_frame`] on what `decode` returns.
    ///
    /// A complete `message` or `pmessage` (RESP2 array or RESP3 push) at the
    /// front of the buffer takes a fast path that slices channel and
    /// payload out of the buffer without building a [`Frame`]: no
    /// allocation per message.
    pub fn decode_pubsub(&mut self, buf: &mut BytesMut) -> Result<Option<Incoming>, RespError> {
        // Only when no value of the pending frame has been scanned yet
        // (a first header may have been cut short: forget that).
        if self.pos == 0 && self.tokens.is_empty() {
            // A publisher's replies: `:<subscribers>\r\n` each.
            if let Some((value, end)) = fast_integer(buf, &self.limits) {
                self.reset();
                bytes::Buf::advance(buf, end);
                return Ok(Some(Incoming::Frame(Frame::Integer(value))));
            }
            if let Some(fast) = self.fast_message(buf) {
                self.reset();
                let frame = buf.split_to(fast.end).freeze();
                let pattern = match fast.pattern {
                    Some(span) => Some(slice(&frame, span)?),
                    None => None,
                };
                return Ok(Some(Incoming::Message(Message {
                    pattern,
                    channel: slice(&frame, fast.channel)?,
                    payload: slice(&frame, fast.payload)?,
                })));
            }
        }
        Ok(self.decode(buf)?.map(Incoming::from_frame))
    }

    /// Pass one: finds where the first frame ends, or that it has not
    /// arrived yet, resuming where the last call stopped.
    fn scan(&mut self, buf: &[u8]) -> Result<Progress, RespError> {
        if buf.len() < self.pos {
            // The caller dropped bytes we had seen: start over.
            self.reset();
        }
        if buf.len() < self.need {
            return Ok(Progress::Incomplete);
        }
        let scanned = self.scan_from_pos(buf);
        if scanned.is_err() {
            self.reset();
        }
        scanned
    }

    fn scan_from_pos(&mut self, buf: &[u8]) -> Result<Progress, RespError> {
        let limits = self.limits;
        loop {
            let pos = self.pos;
            let Some(&kind) = buf.get(pos) else {
                self.need = pos.saturating_add(1);
                return Ok(Progress::Incomplete);
            };
            let here = buf.get(pos..).unwrap_or_default();
            match kind {
                b'+' | b'-' | b':' | b',' | b'(' | b'#' | b'_' => {
                    let Some(cr) = self.line_end(buf, pos)? else {
                        return Ok(Progress::Incomplete);
                    };
                    let span = Span {
                        start: pos + 1,
                        end: cr,
                    };
                    let content = buf.get(span.start..span.end).unwrap_or_default();
                    let leaf = match kind {
                        b'+' => Leaf::SimpleString(span),
                        b'-' => Leaf::Error(span),
                        b':' => Leaf::Integer(
                            value::integer(content).ok_or_else(|| invalid("integer", here))?,
                        ),
                        b',' if value::is_double(content) => Leaf::Double(span),
                        b',' => return Err(invalid("double", here)),
                        b'(' if value::is_big_number(content) => Leaf::BigNumber(span),
                        b'(' => return Err(invalid("big number", here)),
                        b'#' => Leaf::Boolean(
                            value::boolean(content).ok_or_else(|| invalid("boolean", here))?,
                        ),
                        _ if content.is_empty() => Leaf::Null,
                        _ => return Err(invalid("null", here)),
                    };
                    self.tokens.push(Token::Leaf(leaf));
                    self.pos = cr + 2;
                }
                b'$' | b'!' | b'=' => {
                    let Some((len, body)) = self.header(buf, pos)? else {
                        return Ok(Progress::Incomplete);
                    };
                    let leaf = match len {
                        None if kind == b'$' => {
                            self.pos = body;
                            Leaf::NullBulkString
                        }
                        None => return Err(invalid_length(here)),
                        Some(len) => {
                            if len > limits.max_bulk_len {
                                return Err(RespError::BulkTooLong {
                                    len: len as u64,
                                    max: limits.max_bulk_len,
                                });
                            }
                            let end = body.saturating_add(len);
                            let next = end.saturating_add(2);
                            if next > limits.max_frame_len {
                                return Err(RespError::FrameTooLarge {
                                    len: next as u64,
                                    max: limits.max_frame_len,
                                });
                            }
                            if buf.len() < next {
                                self.need = next;
                                return Ok(Progress::Incomplete);
                            }
                            if buf.get(end..next) != Some(b"\r\n") {
                                return Err(RespError::MissingCrlf {
                                    input: snippet(buf.get(end..).unwrap_or_default()),
                                });
                            }
                            let span = Span { start: body, end };
                            let leaf = match kind {
                                b'$' => Leaf::BulkString(span),
                                b'!' => Leaf::BulkError(span),
                                _ => match buf.get(body..body + 4) {
                                    Some(&[a, b, c, b':']) if len >= 4 => Leaf::Verbatim {
                                        format: [a, b, c],
                                        text: Span {
                                            start: body + 4,
                                            end,
                                        },
                                    },
                                    _ => return Err(invalid("verbatim string", here)),
                                },
                            };
                            self.pos = next;
                            leaf
                        }
                    };
                    self.tokens.push(Token::Leaf(leaf));
                }
                b'*' | b'%' | b'~' | b'|' | b'>' => {
                    let Some((len, body)) = self.header(buf, pos)? else {
                        return Ok(Progress::Incomplete);
                    };
                    match len {
                        None if kind == b'*' => {
                            self.tokens.push(Token::Leaf(Leaf::NullArray));
                            self.pos = body;
                        }
                        None => return Err(invalid_length(here)),
                        Some(count) => {
                            if count > limits.max_elements {
                                return Err(RespError::TooManyElements {
                                    len: count as u64,
                                    max: limits.max_elements,
                                });
                            }
                            if self.open.len() >= limits.depth() {
                                return Err(RespError::TooDeep {
                                    max: limits.depth(),
                                });
                            }
                            let (aggregate, children) = match kind {
                                b'*' => (Aggregate::Array, count),
                                b'%' => (Aggregate::Map, count.saturating_mul(2)),
                                b'~' => (Aggregate::Set, count),
                                b'|' => (
                                    Aggregate::Attribute,
                                    count.saturating_mul(2).saturating_add(1),
                                ),
                                _ => (Aggregate::Push, count),
                            };
                            self.tokens.push(Token::Open(aggregate, count));
                            self.pos = body;
                            if children > 0 {
                                self.open.push(children);
                                continue;
                            }
                        }
                    }
                }
                _ => {
                    return Err(RespError::InvalidType {
                        byte: kind,
                        input: snippet(here),
                    });
                }
            }
            // A value ended at `self.pos`: close the aggregates it completes.
            if self.element_done() {
                return Ok(Progress::Complete(self.pos));
            }
        }
    }

    /// Counts one element against the innermost open aggregate, closing
    /// every aggregate that this completes; true when no aggregate is left
    /// open, i.e. the frame is complete.
    fn element_done(&mut self) -> bool {
        while let Some(left) = self.open.last_mut() {
            *left = left.saturating_sub(1);
            if *left > 0 {
                return false;
            }
            self.open.pop();
        }
        true
    }

    /// The offset of the `\r` ending the line whose type byte is at `pos`,
    /// or `None` (with `need` set) if it has not arrived. The search
    /// resumes where it stopped, and stops at the line and frame caps.
    fn line_end(&mut self, buf: &[u8], pos: usize) -> Result<Option<usize>, RespError> {
        let limits = &self.limits;
        let start = pos + 1;
        // The `\r` must come before these offsets.
        let line_limit = start.saturating_add(limits.max_line_len).saturating_add(1);
        let frame_limit = limits.max_frame_len;
        let limit = line_limit.min(frame_limit).min(buf.len());
        let from = self.line_from.max(start);
        let found = buf
            .get(from..limit)
            .and_then(|rest| rest.iter().position(|&b| b == b'\r' || b == b'\n'));
        let line = buf.get(pos..).unwrap_or_default();
        if let Some(offset) = found {
            let cr = from + offset;
            return match (buf.get(cr), buf.get(cr + 1)) {
                (Some(b'\r'), None) => {
                    self.line_from = cr;
                    self.need = cr + 2;
                    Ok(None)
                }
                (Some(b'\r'), Some(b'\n')) if cr + 2 > frame_limit => {
                    Err(RespError::FrameTooLarge {
                        len: (cr + 2) as u64,
                        max: frame_limit,
                    })
                }
                (Some(b'\r'), Some(b'\n')) => {
                    self.line_from = 0;
                    Ok(Some(cr))
                }
                _ => Err(RespError::MissingCrlf {
                    input: snippet(line),
                }),
            };
        }
        if limit == line_limit {
            return Err(RespError::LineTooLong {
                max: limits.max_line_len,
                input: snippet(line),
            });
        }
        if limit == frame_limit {
            return Err(RespError::FrameTooLarge {
                len: frame_limit as u64 + 1,
                max: frame_limit,
            });
        }
        self.line_from = limit;
        self.need = limit + 1;
        Ok(None)
    }

    /// Reads the length header at `pos`: `Some((None, body))` for `-1`,
    /// `Some((Some(len), body))` otherwise, `body` being the offset after
    /// the CRLF; `None` (with `need` set) if the header is incomplete.
    #[allow(clippy::type_complexity)]
    fn header(
        &mut self,
        buf: &[u8],
        pos: usize,
    ) -> Result<Option<(Option<usize>, usize)>, RespError> {
        let here = buf.get(pos..).unwrap_or_default();
        let Some((len, body)) = parse_len(here)? else {
            self.need = buf.len().saturating_add(1);
            return Ok(None);
        };
        let body = pos + body;
        if body > self.limits.max_frame_len {
            return Err(RespError::FrameTooLarge {
                len: body as u64,
                max: self.limits.max_frame_len,
            });
        }
        let len = match len {
            Len::Null => None,
            Len::Count(count) => Some(usize::try_from(count).unwrap_or(usize::MAX)),
        };
        Ok(Some((len, body)))
    }

    /// Pass two: turns the pending frame's tokens into a [`Frame`] whose
    /// strings are views of `base`, with an explicit stack, no recursion.
    fn build(&mut self, base: &Bytes) -> Result<Frame, RespError> {
        let RespDecoder {
            tokens, building, ..
        } = self;
        building.clear();
        let mut pending = tokens.drain(..);
        while let Some(token) = pending.next() {
            let mut done = match token {
                Token::Leaf(leaf) => leaf_frame(leaf, base)?,
                Token::Open(Aggregate::Map, 0) => Frame::Map(Vec::new()),
                Token::Open(Aggregate::Attribute, 0) => {
                    building.push(Building::Annotated {
                        attributes: Vec::new(),
                    });
                    continue;
                }
                Token::Open(kind @ (Aggregate::Map | Aggregate::Attribute), count) => {
                    // `count` is backed by bytes received: the frame is complete.
                    building.push(Building::Pairs {
                        attribute: kind == Aggregate::Attribute,
                        left: count,
                        pairs: Vec::with_capacity(count),
                        key: None,
                    });
                    continue;
                }
                Token::Open(kind, 0) => list_frame(kind, Vec::new()),
                Token::Open(kind, count) => {
                    building.push(Building::List {
                        kind,
                        left: count,
                        items: Vec::with_capacity(count),
                    });
                    continue;
                }
            };
            // Attach the value to the innermost open aggregate, closing
            // every aggregate it completes.
            loop {
                let Some(top) = building.last_mut() else {
                    if pending.next().is_some() {
                        return Err(RespError::Desync);
                    }
                    drop(pending);
                    if tokens.capacity() > TOKENS_KEPT {
                        tokens.shrink_to(TOKENS_KEPT);
                    }
                    return Ok(done);
                };
                match top {
                    Building::List { left, items, .. } => {
                        items.push(done);
                        *left = left.saturating_sub(1);
                        if *left > 0 {
                            break;
                        }
                        let Some(Building::List { kind, items, .. }) = building.pop() else {
                            return Err(RespError::Desync);
                        };
                        done = list_frame(kind, items);
                    }
                    Building::Pairs {
                        attribute,
                        left,
                        pairs,
                        key,
                    } => {
                        let Some(k) = key.take() else {
                            *key = Some(done);
                            break;
                        };
                        pairs.push((k, done));
                        *left = left.saturating_sub(1);
                        if *left > 0 {
                            break;
                        }
                        let attribute = *attribute;
                        let Some(Building::Pairs { pairs, .. }) = building.pop() else {
                            return Err(RespError::Desync);
                        };
                        if attribute {
                            building.push(Building::Annotated { attributes: pairs });
                            break;
                        }
                        done = Frame::Map(pairs);
                    }
                    Building::Annotated { .. } => {
                        let Some(Building::Annotated { attributes }) = building.pop() else {
                            return Err(RespError::Desync);
                        };
                        done = Frame::Attribute {
                            attributes,
                            data: Box::new(done),
                        };
                    }
                }
            }
        }
        Err(RespError::Desync)
    }
}

fn list_frame(kind: Aggregate, items: Vec<Frame>) -> Frame {
    match kind {
        Aggregate::Set => Frame::Set(items),
        Aggregate::Push => Frame::Push(items),
        _ => Frame::Array(items),
    }
}

fn leaf_frame(leaf: Leaf, base: &Bytes) -> Result<Frame, RespError> {
    Ok(match leaf {
        Leaf::SimpleString(span) => Frame::SimpleString(slice(base, span)?),
        Leaf::Error(span) => Frame::Error(slice(base, span)?),
        Leaf::Integer(value) => Frame::Integer(value),
        Leaf::BulkString(span) => Frame::BulkString(slice(base, span)?),
        Leaf::NullBulkString => Frame::NullBulkString,
        Leaf::NullArray => Frame::NullArray,
        Leaf::Null => Frame::Null,
        Leaf::Boolean(value) => Frame::Boolean(value),
        Leaf::Double(span) => Frame::Double(slice(base, span)?),
        Leaf::BigNumber(span) => Frame::BigNumber(slice(base, span)?),
        Leaf::BulkError(span) => Frame::BulkError(slice(base, span)?),
        Leaf::Verbatim { format, text } => Frame::VerbatimString {
            format,
            text: slice(base, text)?,
        },
    })
}

/// A view of `base`, checked (a mismatch can only come from a caller that
/// changed the buffer between calls).
fn slice(base: &Bytes, span: Span) -> Result<Bytes, RespError> {
    if span.start <= span.end && span.end <= base.len() {
        Ok(base.slice(span.start..span.end))
    } else {
        Err(RespError::Desync)
    }
}

enum Len {
    /// `-1`.
    Null,
    Count(u64),
}

/// The most digits a length may have: any more cannot fit the caps.
pub(super) const MAX_LEN_DIGITS: usize = 19;

/// Reads a length header (type byte, `-1` or decimal digits, CRLF) at the
/// start of `input`: the length and the header's size, or `None` if it is
/// incomplete. Decided byte by byte, so a prefix of a bad header is
/// already an error, whatever the split.
fn parse_len(input: &[u8]) -> Result<Option<(Len, usize)>, RespError> {
    let negative = input.get(1) == Some(&b'-');
    let digits_from = if negative { 2 } else { 1 };
    let mut value: u64 = 0;
    let mut index = digits_from;
    loop {
        let Some(&byte) = input.get(index) else {
            return Ok(None);
        };
        match byte {
            b'0'..=b'9' if index - digits_from < MAX_LEN_DIGITS => {
                value = value * 10 + u64::from(byte - b'0');
                index += 1;
            }
            b'\r' if index > digits_from => break,
            _ => return Err(invalid_length(input)),
        }
    }
    match input.get(index + 1) {
        None => return Ok(None),
        Some(b'\n') => {}
        Some(_) => return Err(invalid_length(input)),
    }
    let len = match (negative, value, index - digits_from) {
        (false, value, _) => Len::Count(value),
        (true, 1, 1) => Len::Null,
        (true, _, _) => return Err(invalid_length(input)),
    };
    Ok(Some((len, index + 2)))
}

fn invalid(what: &'static str, input: &[u8]) -> RespError {
    RespError::InvalidValue {
        what,
        input: snippet(input),
    }
}

fn invalid_length(input: &[u8]) -> RespError {
    RespError::InvalidLength {
        input: snippet(input),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8]) -> Result<Vec<Frame>, RespError> {
        let mut decoder = RespDecoder::new();
        let mut buf = BytesMut::from(input);
        let mut frames = Vec::new();
        while let Some(frame) = decoder.decode(&mut buf)? {
            frames.push(frame);
        }
        assert!(buf.is_empty(), "trailing bytes: {buf:?}");
        Ok(frames)
    }

    fn one(input: &[u8]) -> Frame {
        let mut frames = decode_all(input).unwrap();
        assert_eq!(frames.len(), 1);
        frames.pop().unwrap()
    }

    fn bulk(text: &str) -> Frame {
        Frame::bulk(text.to_owned())
    }

    /// Found by fuzzing and review: the fast paths took a line longer than
    /// `max_line_len`, or a `message` bulk longer than `max_bulk_len`,
    /// which the general path refuses.
    #[test]
    fn fast_paths_keep_the_line_and_frame_limits() {
        for (limits, input) in [
            (
                Limits::new().with_max_bulk_len(4),
                &b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n"[..],
            ),
            (
                Limits::new().with_max_bulk_len(7),
                &b"*4\r\n$8\r\npmessage\r\n$1\r\nc\r\n$2\r\nch\r\n$2\r\nhi\r\n"[..],
            ),
            (Limits::new().with_max_line_len(8), &b":9999999999\r\n"[..]),
            (Limits::new().with_max_frame_len(6), &b":12345\r\n"[..]),
            (
                Limits::new().with_max_line_len(8),
                &b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$0000000002\r\nhi\r\n"[..],
            ),
        ] {
            let general = RespDecoder::with_limits(limits).decode(&mut BytesMut::from(input));
            let fast = RespDecoder::with_limits(limits).decode_pubsub(&mut BytesMut::from(input));
            match (general, fast) {
                (Ok(general), Ok(fast)) => assert_eq!(general.map(Incoming::from_frame), fast),
                (Err(general), Err(fast)) => assert_eq!(
                    std::mem::discriminant(&general),
                    std::mem::discriminant(&fast)
                ),
                (general, fast) => panic!("{input:?} within {limits:?}: {general:?}, {fast:?}"),
            }
            // The channel fast path leaves such input to the general path.
            let channels = Channels::new([Bytes::from_static(b"ch")]);
            let mut buf = BytesMut::from(input);
            let mut decoder = RespDecoder::with_limits(limits);
            assert!(decoder.decode_message_on(&mut buf, &channels).is_none());
            assert_eq!(&buf[..], input);
        }
    }

    /// The offset fast path (what the Redis session reads a chunk with)
    /// slices the buffer with offsets it computes from peer bytes: at any
    /// offset, in or beyond the buffer, with lengths that lie (too long,
    /// too short, 19 digits, past the end) and cut anywhere, it never
    /// panics, and what it takes is what the general path decodes there.
    #[test]
    fn the_offset_fast_path_never_slices_outside_the_buffer() {
        let channels = Channels::new([Bytes::from_static(b"ch")]);
        let messages: [&[u8]; 7] = [
            b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$5\r\nhello\r\n",
            b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$9\r\nhello\r\n",
            b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$3\r\nhello\r\n",
            b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$9999999999999999999\r\nhi\r\n",
            b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$18446744073709551615\r\nhi\r\n",
            b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$-1\r\n",
            b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$0\r\n\r\n",
        ];
        for message in messages {
            for cut in 0..=message.len() {
                let mut input = b":1\r\n".to_vec();
                input.extend_from_slice(&message[..cut]);
                let buf = Bytes::from(input);
                for at in 0..buf.len() + 3 {
                    let mut decoder = RespDecoder::new();
                    let Some((index, payload, end)) =
                        decoder.decode_message_at(&buf, at, &channels)
                    else {
                        continue;
                    };
                    assert_eq!(index, 0);
                    assert!(end <= buf.len(), "{buf:?} at {at}: end {end}");
                    let general = RespDecoder::new()
                        .decode(&mut BytesMut::from(&buf[at..end]))
                        .unwrap_or_else(|e| panic!("{buf:?} at {at}: {e}"))
                        .unwrap_or_else(|| panic!("{buf:?} at {at}: incomplete"));
                    let parts = vec![bulk("message"), bulk("ch"), Frame::bulk(payload)];
                    let expected = match buf[at] {
                        b'>' => Frame::Push(parts),
                        _ => Frame::Array(parts),
                    };
                    assert_eq!(general, expected, "{buf:?} at {at}");
                }
            }
        }
    }

    /// The fast paths give what the general path gives, for every prefix
    /// of the input (so, for input cut anywhere).
    #[test]
    fn fast_paths_agree_with_the_general_path() {
        let input: &[u8] = b":0\r\n:-5\r\n:123456789012345678\r\n:1234567890123456789\r\n\
            *3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$5\r\nhello\r\n\
            *3\r\n$7\r\nmessage\r\n$5\r\nother\r\n$2\r\nhi\r\n\
            >3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$0\r\n\r\n:7\r\n";
        let channels = Channels::new([Bytes::from_static(b"ch")]);
        let expected = decode_all(input).unwrap();
        for cut in 0..=input.len() {
            let mut decoder = RespDecoder::new();
            let mut buf = BytesMut::from(&input[..cut]);
            let mut seen = Vec::new();
            let mut step = |buf: &mut BytesMut, seen: &mut Vec<Frame>| loop {
                if let Some((index, payload)) = decoder.decode_message_on(buf, &channels) {
                    assert_eq!(index, 0);
                    seen.push(Frame::Array(vec![
                        bulk("message"),
                        Frame::BulkString(channels.names()[0].clone()),
                        Frame::BulkString(payload),
                    ]));
                    continue;
                }
                match decoder.decode_pubsub(buf).unwrap() {
                    Some(Incoming::Frame(frame)) => seen.push(frame),
                    Some(Incoming::Message(message)) => seen.push(Frame::Array(vec![
                        bulk("message"),
                        Frame::BulkString(message.channel),
                        Frame::BulkString(message.payload),
                    ])),
                    Some(other) => panic!("{other:?}"),
                    None => break,
                }
            };
            step(&mut buf, &mut seen);
            buf.extend_from_slice(&input[cut..]);
            step(&mut buf, &mut seen);
            assert!(buf.is_empty(), "cut at {cut}: {buf:?}");
            // Pushes and arrays of a message read the same.
            let normalise = |frame: &Frame| match frame {
                Frame::Push(items) => Frame::Array(items.clone()),
                other => other.clone(),
            };
            let expected: Vec<Frame> = expected.iter().map(normalise).collect();
            assert_eq!(seen, expected, "cut at {cut}");
        }
    }

    #[test]
    fn resp2_types() {
        assert_eq!(one(b"+OK\r\n"), Frame::SimpleString("OK".into()));
        assert_eq!(one(b"-ERR no\r\n"), Frame::Error("ERR no".into()));
        assert_eq!(one(b":-42\r\n"), Frame::Integer(-42));
        assert_eq!(one(b"$3\r\na\r\n\r\n"), bulk("a\r\n"));
        assert_eq!(one(b"$0\r\n\r\n"), bulk(""));
        assert_eq!(one(b"$-1\r\n"), Frame::NullBulkString);
        assert_eq!(one(b"*-1\r\n"), Frame::NullArray);
        assert_eq!(one(b"*0\r\n"), Frame::Array(vec![]));
        assert_eq!(
            one(b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n"),
            Frame::Array(vec![bulk("a"), Frame::Array(vec![Frame::Integer(1)])])
        );
    }

    #[test]
    fn resp3_types() {
        assert_eq!(one(b"_\r\n"), Frame::Null);
        assert_eq!(one(b"#t\r\n"), Frame::Boolean(true));
        assert_eq!(one(b",1.5\r\n"), Frame::Double("1.5".into()));
        assert_eq!(one(b",-inf\r\n").as_f64(), Some(f64::NEG_INFINITY));
        assert_eq!(
            one(b"(-12345678901234567890\r\n"),
            Frame::BigNumber("-12345678901234567890".into())
        );
        assert_eq!(one(b"!3\r\nERR\r\n"), Frame::BulkError("ERR".into()));
        assert_eq!(
            one(b"=8\r\ntxt:abcd\r\n"),
            Frame::VerbatimString {
                format: *b"txt",
                text: "abcd".into()
            }
        );
        assert_eq!(
            one(b"%2\r\n+a\r\n:1\r\n+b\r\n%0\r\n"),
            Frame::Map(vec![
                (Frame::SimpleString("a".into()), Frame::Integer(1)),
                (Frame::SimpleString("b".into()), Frame::Map(vec![])),
            ])
        );
        assert_eq!(
            one(b"~1\r\n#f\r\n"),
            Frame::Set(vec![Frame::Boolean(false)])
        );
        assert_eq!(
            one(b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\np\r\n"),
            Frame::Push(vec![bulk("message"), bulk("c"), bulk("p")])
        );
    }

    #[test]
    fn attributes_wrap_the_next_value() {
        assert_eq!(
            one(b"|1\r\n+k\r\n:1\r\n*2\r\n:2\r\n|0\r\n:3\r\n"),
            Frame::Attribute {
                attributes: vec![(Frame::SimpleString("k".into()), Frame::Integer(1))],
                data: Box::new(Frame::Array(vec![
                    Frame::Integer(2),
                    Frame::Attribute {
                        attributes: vec![],
                        data: Box::new(Frame::Integer(3))
                    },
                ])),
            }
        );
    }

    #[test]
    fn several_frames_in_one_buffer() {
        let frames = decode_all(b"+OK\r\n:1\r\n*1\r\n_\r\n").unwrap();
        assert_eq!(frames.len(), 3);
    }

    #[test]
    fn resumes_a_large_bulk_without_rescanning() {
        let mut decoder = RespDecoder::new();
        let mut buf = BytesMut::from(&b"$10\r\n01234"[..]);
        assert_eq!(decoder.decode(&mut buf), Ok(None));
        assert_eq!(decoder.min_buffer_len(), 17);
        buf.extend_from_slice(b"56789\r");
        assert_eq!(decoder.decode(&mut buf), Ok(None));
        buf.extend_from_slice(b"\n");
        assert_eq!(decoder.decode(&mut buf), Ok(Some(bulk("0123456789"))));
    }

    #[test]
    fn resumes_a_long_line_where_it_stopped() {
        let mut decoder = RespDecoder::new();
        let mut buf = BytesMut::from(&b"*2\r\n+abc"[..]);
        assert_eq!(decoder.decode(&mut buf), Ok(None));
        assert_eq!(decoder.line_from, 8);
        buf.extend_from_slice(b"def\r\n:1\r\n");
        assert_eq!(
            decoder.decode(&mut buf),
            Ok(Some(Frame::Array(vec![
                Frame::SimpleString("abcdef".into()),
                Frame::Integer(1)
            ])))
        );
    }

    #[test]
    fn a_shrunk_buffer_restarts_the_scan() {
        let mut decoder = RespDecoder::new();
        let mut buf = BytesMut::from(&b"*2\r\n:1\r\n"[..]);
        assert_eq!(decoder.decode(&mut buf), Ok(None));
        let mut other = BytesMut::from(&b":7\r\n"[..]);
        assert_eq!(decoder.decode(&mut other), Ok(Some(Frame::Integer(7))));
    }

    #[test]
    fn pubsub_fast_path_and_general_path_agree() {
        let inputs: [&[u8]; 4] = [
            b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$5\r\nhello\r\n",
            b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$0\r\n\r\n",
            b"*4\r\n$8\r\npmessage\r\n$3\r\nc*h\r\n$2\r\nch\r\n$1\r\nx\r\n",
            b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$-1\r\n",
        ];
        for input in inputs {
            let fast = RespDecoder::new()
                .decode_pubsub(&mut BytesMut::from(input))
                .unwrap();
            let slow = RespDecoder::new()
                .decode(&mut BytesMut::from(input))
                .unwrap();
            assert_eq!(fast, slow.map(Incoming::from_frame));
        }
    }

    #[test]
    fn the_fast_path_forgets_progress_into_the_frame_it_took() {
        // A first read that ends inside the first header saves `need`
        // without a token; the fast path then takes the whole message and
        // must not leave that stale bound behind for the next frame.
        let mut decoder = RespDecoder::new();
        let mut buf = BytesMut::from(&b"*3\r"[..]);
        assert_eq!(decoder.decode_pubsub(&mut buf), Ok(None));
        buf.extend_from_slice(b"\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\np\r\n_\r\n");
        assert!(matches!(
            decoder.decode_pubsub(&mut buf),
            Ok(Some(Incoming::Message(_)))
        ));
        assert_eq!(
            decoder.decode_pubsub(&mut buf),
            Ok(Some(Incoming::Frame(Frame::Null)))
        );
    }

    #[test]
    fn caps() {
        let limits = Limits::new()
            .with_max_bulk_len(4)
            .with_max_elements(2)
            .with_max_depth(2);
        let run =
            |input: &[u8]| RespDecoder::with_limits(limits).decode(&mut BytesMut::from(input));
        assert_eq!(
            run(b"$5\r\n"),
            Err(RespError::BulkTooLong { len: 5, max: 4 })
        );
        assert_eq!(
            run(b"*3\r\n"),
            Err(RespError::TooManyElements { len: 3, max: 2 })
        );
        assert_eq!(
            run(b"*1\r\n*1\r\n*1\r\n"),
            Err(RespError::TooDeep { max: 2 })
        );
        assert_eq!(
            run(b"*1\r\n*1\r\n*0\r\n"),
            Err(RespError::TooDeep { max: 2 })
        );
        assert!(run(b"*1\r\n*0\r\n").is_ok());
    }

    #[test]
    fn lengths() {
        assert!(matches!(parse_len(b"$-1\r\n"), Ok(Some((Len::Null, 5)))));
        assert!(matches!(
            parse_len(b"$12\r\n"),
            Ok(Some((Len::Count(12), 5)))
        ));
        assert!(matches!(parse_len(b"$12\r"), Ok(None)));
        assert!(matches!(parse_len(b"$"), Ok(None)));
        assert!(matches!(parse_len(b"$-"), Ok(None)));
        assert!(parse_len(b"$-2\r\n").is_err());
        assert!(parse_len(b"$-0\r\n").is_err());
        assert!(parse_len(b"$-10\r\n").is_err());
        assert!(parse_len(b"$\r\n").is_err());
        assert!(parse_len(b"$-\r\n").is_err());
        assert!(parse_len(b"$1x").is_err());
        assert!(parse_len(b"$1\rx").is_err());
        assert!(parse_len(b"$+1\r\n").is_err());
        assert!(parse_len(b"$?\r\n").is_err());
        assert!(parse_len(b"$99999999999999999999").is_err());
        assert!(matches!(
            parse_len(b"$9999999999999999999\r\n"),
            Ok(Some((Len::Count(9_999_999_999_999_999_999), _)))
        ));
    }
}
