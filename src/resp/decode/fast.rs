//! The subscriber's hot path: a complete `message` on a known channel,
//! recognised by one comparison and split off the buffer without building
//! a [`Frame`](super::super::Frame).

use bytes::{Bytes, BytesMut};

use super::{Limits, MAX_LEN_DIGITS, RespDecoder, Span};

/// The channels a subscriber listens on, for
/// [`RespDecoder::decode_message_on`]: each with the bytes that every `message`
/// on it starts with (after the type byte), so that one comparison finds
/// both that a frame is a message and which channel it is on.
///
/// ```
/// use bytes::{Bytes, BytesMut};
/// use synapse_replication::resp::{Channels, RespDecoder};
///
/// let channels = Channels::new([Bytes::from_static(b"example.com")]);
/// let mut buf = BytesMut::from(&b"*3\r\n$7\r\nmessage\r\n$11\r\nexample.com\r\n$4\r\nPING\r\n"[..]);
/// let (index, payload) = RespDecoder::new().decode_message_on(&mut buf, &channels).unwrap();
/// assert_eq!((index, &payload[..]), (0, &b"PING"[..]));
/// assert!(buf.is_empty());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Channels {
    names: Vec<Bytes>,
    /// `3\r\n$7\r\nmessage\r\n$<len>\r\n<name>\r\n`, one per name.
    prefixes: Vec<Vec<u8>>,
}

impl Channels {
    /// The channels `names`, in this order (indices are positions here).
    pub fn new(names: impl IntoIterator<Item = Bytes>) -> Channels {
        let names: Vec<Bytes> = names.into_iter().collect();
        let prefixes = names
            .iter()
            .map(|name| {
                let mut prefix = b"3\r\n$7\r\nmessage\r\n$".to_vec();
                prefix.extend_from_slice(name.len().to_string().as_bytes());
                prefix.extend_from_slice(b"\r\n");
                prefix.extend_from_slice(name);
                prefix.extend_from_slice(b"\r\n");
                prefix
            })
            .collect();
        Channels { names, prefixes }
    }

    /// The channels' names.
    pub fn names(&self) -> &[Bytes] {
        &self.names
    }

    /// The index of `channel`, if it is one of these.
    pub fn index(&self, channel: &[u8]) -> Option<usize> {
        self.names.iter().position(|name| name[..] == *channel)
    }
}

/// The fast path's view of a pub/sub message.
pub(super) struct FastMessage {
    pub(super) pattern: Option<Span>,
    pub(super) channel: Span,
    pub(super) payload: Span,
    pub(super) end: usize,
}

impl RespDecoder {
    /// The subscriber's hot path: a complete `message` at the front of
    /// `buf` on one of `channels` is removed from the buffer, and its
    /// channel's index and payload returned. The payload is split off the
    /// buffer directly (one reference count increment, no [`Frame`](crate::resp::Frame), no
    /// channel `Bytes`). `None` (nothing consumed) for anything else,
    /// which [`RespDecoder::decode_pubsub`] then decodes.
    pub fn decode_message_on(
        &mut self,
        buf: &mut BytesMut,
        channels: &Channels,
    ) -> Option<(usize, Bytes)> {
        let (index, payload, end) = self.message_on(buf, channels)?;
        self.reset();
        bytes::Buf::advance(buf, payload.start);
        let payload_bytes = buf.split_to(payload.end - payload.start).freeze();
        bytes::Buf::advance(buf, end - payload.end);
        Some((index, payload_bytes))
    }

    /// [`RespDecoder::decode_message_on`] over a buffer that stays whole:
    /// the message starting at `at` in `buf`, as its channel's index, its
    /// payload (a slice of `buf`) and the offset after it. A run of
    /// messages costs one reference count each and no buffer bookkeeping;
    /// `None` (for anything but such a message, or while a frame is under
    /// way) leaves the rest to the buffered paths.
    #[inline(always)]
    pub(crate) fn decode_message_at(
        &mut self,
        buf: &Bytes,
        at: usize,
        channels: &Channels,
    ) -> Option<(usize, Bytes, usize)> {
        let (index, payload, end) = self.message_on(buf.get(at..)?, channels)?;
        let start = at.checked_add(payload.start)?;
        let stop = at.checked_add(payload.end)?;
        let end = at.checked_add(end)?;
        self.reset();
        Some((index, buf.slice(start..stop), end))
    }

    /// The checks of the message fast paths: a complete `message` at the
    /// front of `buf` on one of `channels`, within the limits, with the
    /// decoder idle: its channel's index, its payload and its end.
    #[inline(always)]
    fn message_on(&self, buf: &[u8], channels: &Channels) -> Option<(usize, Span, usize)> {
        if !self.is_idle() {
            return None;
        }
        let limits = &self.limits;
        if !self.fast {
            return None;
        }
        let (&first, rest) = buf.split_first()?;
        if first != b'*' && first != b'>' {
            return None;
        }
        let index = channels
            .prefixes
            .iter()
            .position(|prefix| rest.starts_with(prefix))?;
        let at = 1 + channels.prefixes.get(index)?.len();
        if channels.names.get(index)?.len() > limits.max_bulk_len {
            return None;
        }
        let (payload, end) = fast_bulk(buf, at, limits.max_bulk_len)?;
        // Checked here, not taken on `fast_bulk`'s word: the callers slice
        // the buffer with these offsets, and peer bytes must never panic.
        let within = payload.start <= payload.end && payload.end <= end && end <= buf.len();
        (within && end <= limits.max_frame_len).then_some((index, payload, end))
    }

    /// A complete, well-formed `message` or `pmessage` within the limits
    /// at the front of `buf`; `None` sends anything else down the general
    /// path, which decides between waiting and an error.
    pub(super) fn fast_message(&self, buf: &[u8]) -> Option<FastMessage> {
        const MESSAGE: &[u8] = b"3\r\n$7\r\nmessage\r\n";
        const PMESSAGE: &[u8] = b"4\r\n$8\r\npmessage\r\n";
        let limits = &self.limits;
        if !self.fast {
            return None;
        }
        let (&first, rest) = buf.split_first()?;
        if first != b'*' && first != b'>' {
            return None;
        }
        let (pattern, at) = if rest.starts_with(MESSAGE) {
            (None, 1 + MESSAGE.len())
        } else if rest.starts_with(PMESSAGE) {
            let (pattern, at) = fast_bulk(buf, 1 + PMESSAGE.len(), limits.max_bulk_len)?;
            (Some(pattern), at)
        } else {
            return None;
        };
        let (channel, at) = fast_bulk(buf, at, limits.max_bulk_len)?;
        let (payload, end) = fast_bulk(buf, at, limits.max_bulk_len)?;
        (end <= limits.max_frame_len).then_some(FastMessage {
            pattern,
            channel,
            payload,
            end,
        })
    }
}

/// Whether the message fast paths may run: under these limits, every
/// header they accept (at most 19 digits) is a line the general path
/// accepts too, a message's array fits, and so do its fixed bulk strings
/// (`message`, `pmessage`: they check only the variable ones). Tighter
/// limits (tests, fuzzing) leave everything to the general path, which
/// reports them exactly.
pub(super) const fn fast_paths_fit(limits: &Limits) -> bool {
    limits.depth() >= 1
        && limits.max_elements >= 4
        && limits.max_line_len > MAX_LEN_DIGITS
        && limits.max_bulk_len >= b"pmessage".len()
}

/// A complete `:<digits>\r\n` (at most 18 digits, optional `-`) at the
/// front of `buf`: its value and length. Anything else takes the general
/// path.
pub(super) fn fast_integer(buf: &[u8], limits: &Limits) -> Option<(i64, usize)> {
    let rest = buf.strip_prefix(b":")?;
    let (negative, digits_at) = match rest.first()? {
        b'-' => (true, 2),
        _ => (false, 1),
    };
    let mut value: i64 = 0;
    let mut index = digits_at;
    loop {
        let byte = *buf.get(index)?;
        if byte.is_ascii_digit() && index - digits_at < 18 {
            value = value * 10 + i64::from(byte - b'0');
            index += 1;
        } else if byte == b'\r' && index > digits_at {
            break;
        } else {
            return None;
        }
    }
    // Within the limits as the general path counts them (the line after
    // the type byte; the frame with its CRLF), or left to it to refuse.
    let within = index - 1 <= limits.max_line_len && index + 2 <= limits.max_frame_len;
    (within && buf.get(index + 1) == Some(&b'\n'))
        .then_some((if negative { -value } else { value }, index + 2))
}

/// A bulk string at `at` for the fast path: its payload and the offset
/// after it, if complete, well-formed and within `max` bytes.
pub(super) fn fast_bulk(buf: &[u8], at: usize, max: usize) -> Option<(Span, usize)> {
    let (&dollar, digits) = buf.get(at..)?.split_first()?;
    if dollar != b'$' {
        return None;
    }
    // At most 19 digits: no overflow in a u64.
    let mut len: u64 = 0;
    let mut count = 0;
    for &byte in digits.iter().take(MAX_LEN_DIGITS) {
        let digit = byte.wrapping_sub(b'0');
        if digit > 9 {
            break;
        }
        len = len * 10 + u64::from(digit);
        count += 1;
    }
    let cr = at + 1 + count;
    if count == 0 || buf.get(cr..cr + 2)? != b"\r\n" {
        return None;
    }
    let len = usize::try_from(len).ok().filter(|&len| len <= max)?;
    let start = cr + 2;
    let end = start.checked_add(len)?;
    let next = end.checked_add(2)?;
    (buf.get(end..next)? == b"\r\n").then_some((Span { start, end }, next))
}
