//! One line of bytes to one [`Command`].

use std::sync::Arc;

use bytes::{Buf, Bytes};
use bytestring::ByteString;

use super::command::{
    Command, CommandKind, FederationAck, LockReleased, Position, Rdata, UserIp, UserSync,
};
use super::error::{DecodeError, snippet};
use super::json::{self, JsonError, Text};
use super::names::{InstanceName, StreamName};
use super::row::RawRow;
use super::token::{RdataToken, Token};

/// Decodes lines into commands, with a limit on line length.
///
/// Synapse's direct TCP transport refuses lines over 16384 bytes
/// ([`Decoder::SYNAPSE_TCP_MAX_LINE`]); over Redis it has no limit, and rows
/// of 36 kB have been seen, so the default here is 1 MiB.
///
/// ```
/// use synapse_replication::wire::{Command, Decoder};
///
/// let decoder = Decoder::new().max_line_len(Decoder::SYNAPSE_TCP_MAX_LINE);
/// let command = decoder.decode("PING 1700000000000".into()).unwrap();
/// assert_eq!(command, Some(Command::Ping("1700000000000".into())));
/// assert_eq!(decoder.decode("  ".into()).unwrap(), None, "blank lines are skipped");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoder {
    max_line_len: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::new()
    }
}

impl Decoder {
    /// The longest line Synapse's direct TCP transport accepts.
    pub const SYNAPSE_TCP_MAX_LINE: usize = 16384;

    /// The default limit on line length: 1 MiB.
    pub const DEFAULT_MAX_LINE: usize = 1 << 20;

    /// A decoder with the default limit.
    pub const fn new() -> Self {
        Decoder {
            max_line_len: Self::DEFAULT_MAX_LINE,
        }
    }

    /// Sets the longest line accepted, in bytes (without the `\n`).
    #[must_use]
    pub const fn max_line_len(mut self, max: usize) -> Self {
        self.max_line_len = max;
        self
    }

    /// The longest line accepted, in bytes.
    pub const fn limit(&self) -> usize {
        self.max_line_len
    }

    /// Decodes one line, given without its `\n`.
    ///
    /// Returns `Ok(None)` for a blank line (only ASCII whitespace), which
    /// Synapse ignores. Rows and text fields are slices of `line` (JSON
    /// strings too, unless they hold escapes); stream and instance names,
    /// a few bytes, are stored inline (a name this crate does not know, or
    /// longer than 22 bytes, is copied once into an `Arc<str>`).
    pub fn decode(&self, line: Bytes) -> Result<Option<Command>, DecodeError> {
        self.decode_salvaging(line).map_err(|failed| failed.0)
    }

    /// [`Decoder::decode`], and for an `RDATA` line that does not decode,
    /// what can still be read of it (see [`LostRdata`]), found on the error
    /// path only.
    #[inline(always)]
    pub(crate) fn decode_salvaging(&self, line: Bytes) -> Result<Option<Command>, Salvaged> {
        // Most lines are rows, and most others positions: go straight to
        // them.
        if is_rdata(&line) {
            return self
                .decode_rdata_salvaging(line)
                .map(|rdata| Some(Command::Rdata(rdata)));
        }
        self.check_len(&line)?;
        if line.starts_with(POSITION) {
            return decode_position(&line)
                .map(|position| Some(Command::Position(position)))
                .map_err(|error| Box::new((error, None)));
        }
        // A line starting with a letter is not blank: skip the scan.
        if !line.first().is_some_and(u8::is_ascii_alphabetic) && is_blank(&line) {
            return Ok(None);
        }
        decode_command(&line)
            .map(Some)
            .map_err(|error| salvage(error, &line))
    }

    /// [`Decoder::decode_salvaging`] for a line that starts with `RDATA `:
    /// the row itself, not wrapped in a [`Command`] (the receive path hands
    /// it straight to the follower).
    #[inline(always)]
    pub(crate) fn decode_rdata_salvaging(&self, line: Bytes) -> Result<Rdata, Salvaged> {
        self.check_len(&line)?;
        decode_rdata(line)
    }

    /// Refuses a line over the length limit.
    #[inline(always)]
    fn check_len(&self, line: &Bytes) -> Result<(), Salvaged> {
        if line.len() > self.max_line_len {
            let error = DecodeError::LineTooLong {
                len: line.len(),
                max: self.max_line_len,
            };
            return Err(salvage(error, line));
        }
        Ok(())
    }
}

/// Whether `line` is an `RDATA` line (for
/// [`Decoder::decode_rdata_salvaging`]).
#[inline(always)]
pub(crate) fn is_rdata(line: &[u8]) -> bool {
    line.starts_with(RDATA)
}

/// A line that did not decode, and what could be read of it if it was an
/// `RDATA` (boxed: the error path must not make every result larger).
pub(crate) type Salvaged = Box<(DecodeError, Option<LostRdata>)>;

#[cold]
fn salvage(error: DecodeError, line: &[u8]) -> Salvaged {
    Box::new((error, LostRdata::from_line(line)))
}

/// What can still be read of an `RDATA` line that does not decode (a row
/// that is not valid JSON, a line over the length limit, a bad name or
/// token): its row is lost. A follower must not step over it: with the
/// writer and token known it fetches up to the token
/// ([`Follower::handle_lost_rdata`](crate::positions::Follower::handle_lost_rdata));
/// with less known, it checks the next move of every writer it may have
/// come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostRdata {
    /// The stream, if its name could be read.
    pub stream: Option<StreamName>,
    /// The writer, if its name could be read.
    pub instance: Option<InstanceName>,
    /// The row's token, if it could be read.
    pub token: Option<RdataToken>,
}

impl LostRdata {
    /// Reads what it can of `line`, an `RDATA` line that did not decode;
    /// `None` if `line` is not an `RDATA` line at all.
    pub fn from_line(line: &[u8]) -> Option<LostRdata> {
        let rest = match line.strip_prefix(b"RDATA") {
            Some([]) => &[][..],
            Some([b' ', rest @ ..]) => rest,
            _ => return None,
        };
        // Names and tokens are short: look no further than this for them
        // in a line that may be megabytes long.
        let head = rest.get(..HEADER_SCAN).unwrap_or(rest);
        let mut fields = head.splitn(4, |b| *b == b' ');
        let stream = fields.next().filter(|f| !f.is_empty()).and_then(|f| {
            StreamName::known_bytes(f).or_else(|| {
                std::str::from_utf8(f)
                    .ok()
                    .filter(|name| !name.contains('\n'))
                    .map(StreamName::new)
            })
        });
        let instance = fields
            .next()
            .filter(|f| !f.is_empty() && !f.contains(&b'\n'))
            .and_then(InstanceName::from_line);
        // A token is complete only if the row's separator follows it.
        let token = fields
            .next()
            .filter(|_| fields.next().is_some())
            .and_then(|f| match f {
                b"batch" => Some(RdataToken::Batch),
                digits => parse_i64(digits).map(|value| RdataToken::At(Token(value))),
            });
        // In a head cut short, the last field read may be cut too: trust a
        // name there only if a space followed it.
        let (stream, instance) = match token {
            Some(_) => (stream, instance),
            None if head.len() < rest.len() => (
                stream.filter(|_| head.contains(&b' ')),
                instance.filter(|_| head.iter().filter(|b| **b == b' ').count() >= 2),
            ),
            None => (stream, instance),
        };
        Some(LostRdata {
            stream,
            instance,
            token,
        })
    }
}

/// How far into an `RDATA` line [`LostRdata::from_line`] looks for the
/// stream, the writer and the token.
const HEADER_SCAN: usize = 1024;

impl Command {
    /// Decodes one line with the default [`Decoder`].
    #[inline]
    pub fn decode(line: Bytes) -> Result<Option<Command>, DecodeError> {
        Decoder::new().decode(line)
    }
}

/// Whether Synapse would skip `line` as blank (only ASCII whitespace).
pub fn is_blank(line: &[u8]) -> bool {
    line.iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\x0b' | b'\x0c'))
}

/// Splits off the first `N` space-separated fields, like Python's
/// `rest.split(" ", N - 1)` when it must give exactly `N` parts; the last
/// part keeps any further spaces.
fn split<'a, const N: usize>(
    command: CommandKind,
    names: [&'static str; N],
    rest: &'a [u8],
) -> Result<[&'a [u8]; N], DecodeError> {
    let mut parts = [&rest[..0]; N];
    let mut start = 0;
    for index in 0..N - 1 {
        let Some(space) = next_space(rest, start) else {
            return Err(DecodeError::MissingField {
                command,
                field: names[index + 1],
            });
        };
        parts[index] = rest.get(start..space).unwrap_or_default();
        start = space + 1;
    }
    parts[N - 1] = rest.get(start..).unwrap_or_default();
    Ok(parts)
}

/// The offset of the first space in `bytes` from `at`, eight bytes at a
/// time.
#[inline(always)]
fn next_space(bytes: &[u8], mut at: usize) -> Option<usize> {
    while at < bytes.len() {
        // Bytes past the end read as zero, which is not a space.
        let word = word_at(bytes, at) ^ (ONES * u64::from(b' '));
        // The lowest high bit set marks the first zero byte, that is the
        // first space (a borrow only runs upwards).
        let spaces = word.wrapping_sub(ONES) & !word & HIGHS;
        if spaces != 0 {
            return Some(at + spaces.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    None
}

fn text(
    line: &Bytes,
    command: CommandKind,
    field: &'static str,
    value: &[u8],
) -> Result<ByteString, DecodeError> {
    ByteString::try_from(line.slice_ref(value)).map_err(|_| DecodeError::InvalidField {
        command,
        field,
        expected: "UTF-8 text",
        input: snippet(value),
    })
}

#[inline(always)]
fn instance_name(
    command: CommandKind,
    field: &'static str,
    value: &[u8],
) -> Result<InstanceName, DecodeError> {
    match InstanceName::from_line(value) {
        Some(name) if !value.is_empty() => Ok(name),
        _ => Err(invalid_instance_name(command, field, value)),
    }
}

#[cold]
fn invalid_instance_name(command: CommandKind, field: &'static str, value: &[u8]) -> DecodeError {
    DecodeError::InvalidField {
        command,
        field,
        expected: if value.is_empty() {
            "a non-empty name"
        } else {
            "UTF-8 text"
        },
        input: snippet(value),
    }
}

fn name(
    line: &Bytes,
    command: CommandKind,
    field: &'static str,
    value: &[u8],
) -> Result<ByteString, DecodeError> {
    if value.is_empty() {
        return Err(DecodeError::InvalidField {
            command,
            field,
            expected: "a non-empty name",
            input: String::new(),
        });
    }
    text(line, command, field, value)
}

#[inline(always)]
fn stream_name(
    line: &Bytes,
    command: CommandKind,
    value: &[u8],
) -> Result<StreamName, DecodeError> {
    // Known names are matched without touching the line's reference count.
    match StreamName::known_bytes(value) {
        Some(known) => Ok(known),
        None => other_stream_name(line, command, value),
    }
}

#[cold]
fn other_stream_name(
    line: &Bytes,
    command: CommandKind,
    value: &[u8],
) -> Result<StreamName, DecodeError> {
    let name = name(line, command, "stream name", value)?;
    Ok(StreamName::Other(Arc::from(&*name)))
}

fn token(command: CommandKind, field: &'static str, value: &[u8]) -> Result<Token, DecodeError> {
    parse_i64(value)
        .map(Token)
        .ok_or_else(|| DecodeError::InvalidToken {
            command,
            field,
            input: snippet(value),
        })
}

/// `-?[0-9]+` within `i64`, and nothing else (no `+`, spaces or `_`).
fn parse_i64(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', digits)) => (true, digits),
        _ => (false, text),
    };
    if digits.is_empty() {
        return None;
    }
    // Eight to sixteen digits (timestamps in ms have thirteen), eight
    // bytes at a time: the last eight, and those before them in the high
    // bytes of the first eight's word, `0`s below them.
    if let (Some(first), Some(last), 8..=16) = (
        digits.first_chunk::<8>(),
        digits.last_chunk::<8>(),
        digits.len(),
    ) {
        let shift = 8 * (16 - digits.len()) as u32;
        let high = u64::from_le_bytes(*first).checked_shl(shift).unwrap_or(0)
            | (ONES * u64::from(b'0'))
                .checked_shr(64 - shift)
                .unwrap_or(0);
        let value = eight_digits(high)? * 100_000_000 + eight_digits(u64::from_le_bytes(*last))?;
        // Below 10^16: no overflow.
        let value = value as i64;
        return Some(if negative { -value } else { value });
    }
    // Eighteen digits cannot overflow: no checks but for digits.
    if digits.len() <= 18 {
        let mut value: i64 = 0;
        for &byte in digits {
            let digit = byte.wrapping_sub(b'0');
            if digit > 9 {
                return None;
            }
            value = value * 10 + i64::from(digit);
        }
        return Some(if negative { -value } else { value });
    }
    let mut value: i64 = 0;
    for &byte in digits {
        let digit = i64::from(byte.checked_sub(b'0').filter(|digit| *digit <= 9)?);
        // Accumulate on the sign's side so that i64::MIN parses.
        value = value.checked_mul(10)?;
        value = if negative {
            value.checked_sub(digit)?
        } else {
            value.checked_add(digit)?
        };
    }
    Some(value)
}

/// The fields of a JSON array, their strings borrowed from `value` where
/// they hold no escapes (see [`json::from_slice_borrowed`]).
fn json_texts<'a, T, O>(
    command: CommandKind,
    field: &'static str,
    value: &'a [u8],
    own: impl FnOnce(O) -> T,
) -> Result<T, DecodeError>
where
    T: serde::Deserialize<'a>,
    O: serde::de::DeserializeOwned,
{
    json::from_slice_borrowed(value, own).map_err(|source| DecodeError::InvalidJson {
        command,
        field,
        source,
        input: snippet(value),
    })
}

/// The strings of `USER_IP`'s JSON data (access token, IP, user agent and
/// device, as they stand in the text: not yet checked as UTF-8), and
/// `last_seen`.
type UserIpFields<'a> = ([&'a [u8]; 3], Option<&'a [u8]>, i64);

/// A string without escapes or control characters at `at` (on its
/// opening quote), and the offset after its closing quote.
#[inline(always)]
fn json_string(data: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let body = data.get(at..)?.strip_prefix(b"\"")?;
    // Eight bytes at a time to the first quote, backslash, control
    // or non-ASCII byte (past the end, words read as zeros: control
    // characters).
    let mut len = 0;
    loop {
        let special = json::ascii_string_specials(word_at(body, len));
        if special != 0 {
            len += special.trailing_zeros() as usize / 8;
            break;
        }
        len += 8;
    }
    if body.get(len) != Some(&b'"') {
        // Non-ASCII text, or the end: byte by byte.
        len += body
            .get(len..)?
            .iter()
            .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
        if body.get(len) != Some(&b'"') {
            return None;
        }
    }
    Some((body.get(..len)?, at + len + 2))
}

/// `USER_IP`'s JSON data as Synapse writes it, compact and without
/// escapes: `["<token>","<ip>","<agent>",null|"<device>",<last_seen>]`,
/// read without serde_json. `None` for anything else (whitespace, an
/// escape, another number), which serde_json then reads, or refuses: so
/// what this accepts (its strings being UTF-8) reads exactly as
/// serde_json reads it.
fn user_ip_fields(data: &[u8]) -> Option<UserIpFields<'_>> {
    let expect = |at: usize, byte: u8| (data.get(at) == Some(&byte)).then_some(at + 1);
    let at = expect(0, b'[')?;
    let (token, at) = json_string(data, at)?;
    let (ip, at) = json_string(data, expect(at, b',')?)?;
    let (agent, at) = json_string(data, expect(at, b',')?)?;
    let at = expect(at, b',')?;
    let (device, at) = match data.get(at..)?.strip_prefix(b"null") {
        Some(_) => (None, at + 4),
        None => {
            let (device, at) = json_string(data, at)?;
            (Some(device), at)
        }
    };
    let at = expect(at, b',')?;
    let digits = data.get(at..data.len().checked_sub(1)?)?;
    // JSON has no leading zeros (`0` and `-0` are left to serde_json too).
    let unsigned = digits.strip_prefix(b"-").unwrap_or(digits);
    if data.last() != Some(&b']') || digits.len() > 18 || unsigned.first() == Some(&b'0') {
        return None;
    }
    Some(([token, ip, agent], device, parse_i64(digits)?))
}

/// `USER_IP` from its fields read by [`user_ip_fields`], every string a
/// slice of `line`; `None` if one is not UTF-8 (or the user id is
/// empty), for the general path to refuse.
fn user_ip_fast(line: &Bytes, user: &[u8], data: &[u8]) -> Option<UserIp> {
    let ([token, ip, agent], device, last_seen) = user_ip_fields(data)?;
    let text = |bytes: &[u8]| ByteString::try_from(line.slice_ref(bytes)).ok();
    if user.is_empty() {
        return None;
    }
    Some(UserIp {
        user_id: text(user)?,
        access_token: text(token)?,
        ip: text(ip)?,
        user_agent: text(agent)?,
        device_id: match device {
            Some(device) => Some(text(device)?),
            None => None,
        },
        last_seen,
    })
}

/// A string of a JSON field of `line`: a slice of the line if it was
/// borrowed from it (no copy), else its unescaped copy.
fn line_text(line: &Bytes, text: Text<'_>) -> ByteString {
    let text = match text {
        Text::Borrowed(text) => text,
        Text::Owned(text) => return ByteString::from(text),
    };
    let offset = (text.as_ptr() as usize).wrapping_sub(line.as_ptr() as usize);
    let inside = offset <= line.len() && text.len() <= line.len() - offset;
    if !inside {
        return ByteString::from(text);
    }
    ByteString::try_from(line.slice(offset..offset + text.len()))
        .unwrap_or_else(|_| ByteString::from(text))
}

/// `USER_IP` data starts with an access token: an error must not quote it
/// (errors end up in logs).
fn redact_input(error: DecodeError) -> DecodeError {
    match error {
        DecodeError::InvalidJson {
            command,
            field,
            source,
            input: _,
        } => DecodeError::InvalidJson {
            command,
            field,
            source,
            input: "<not quoted: may hold an access token>".to_owned(),
        },
        other => other,
    }
}

fn decode_command(line: &Bytes) -> Result<Command, DecodeError> {
    if let Some(command) = common_command(line) {
        return Ok(command);
    }
    decode_any_command(line)
}

/// How a `USER_IP` line starts.
const USER_IP: &[u8] = b"USER_IP ";

/// How a `USER_SYNC` line starts.
const USER_SYNC: &[u8] = b"USER_SYNC ";

/// The commonest commands after `RDATA` and `POSITION`, as Synapse writes
/// them, each read in one pass over the line with one UTF-8 check for all
/// its text fields; `None` for anything else, which
/// [`decode_any_command`] then reads (or refuses). What this returns,
/// [`decode_any_command`] returns too.
#[inline(always)]
fn common_command(line: &Bytes) -> Option<Command> {
    if line.starts_with(USER_IP) {
        return user_ip_line(line).map(|user_ip| Command::UserIp(Box::new(user_ip)));
    }
    if line.starts_with(USER_SYNC) {
        return user_sync_line(line).map(Command::UserSync);
    }
    if line.starts_with(FEDERATION_ACK) {
        return federation_ack_line(line).map(Command::FederationAck);
    }
    if line.starts_with(LOCK_RELEASED) {
        return lock_released_line(line).map(Command::LockReleased);
    }
    None
}

/// How a `FEDERATION_ACK` line starts.
const FEDERATION_ACK: &[u8] = b"FEDERATION_ACK ";

/// How a `LOCK_RELEASED` line starts.
const LOCK_RELEASED: &[u8] = b"LOCK_RELEASED ";

/// A `FEDERATION_ACK` line with a non-empty name and a token, and no
/// newline; `None` otherwise.
#[inline(never)]
fn federation_ack_line(line: &Bytes) -> Option<FederationAck> {
    let start = FEDERATION_ACK.len();
    let [instance_end] = spaces::<1>(line, start)?;
    // The token has no space or newline if it is a number.
    let token = Token(parse_i64(line.get(instance_end + 1..)?)?);
    let instance = line.get(start..instance_end)?;
    if instance.is_empty() {
        return None;
    }
    Some(FederationAck {
        instance: InstanceName::from_line(instance)?,
        token,
    })
}

/// A `LOCK_RELEASED` line whose data is three strings as Synapse writes
/// them, compact, without escapes or control characters (so without a
/// newline): `["<instance>","<lock_name>","<lock_key>"]`; `None`
/// otherwise. serde_json reads such data as these three strings.
#[inline(never)]
fn lock_released_line(line: &Bytes) -> Option<LockReleased> {
    let data = line.get(LOCK_RELEASED.len()..)?;
    let expect = |at: usize, byte: u8| (data.get(at) == Some(&byte)).then_some(at + 1);
    let (instance, at) = json_string(data, expect(0, b'[')?)?;
    let (lock_name, at) = json_string(data, expect(at, b',')?)?;
    let (lock_key, at) = json_string(data, expect(at, b',')?)?;
    if expect(at, b']')? != data.len() {
        return None;
    }
    // Every byte outside the strings is ASCII: the line is UTF-8 if and
    // only if they all are.
    let text = ByteString::try_from(line.clone()).ok()?;
    let field = |part: &[u8]| {
        let from = offset_in(line, part);
        text_at(&text, from, from.wrapping_add(part.len()))
    };
    let instance = field(instance)?;
    Some(LockReleased {
        instance: InstanceName::from(&*instance),
        lock_name: field(lock_name)?,
        lock_key: field(lock_key)?,
    })
}

/// The offsets of the first `N` spaces in `line` from `start`, found
/// eight bytes at a time; `None` if there are fewer, or if a newline comes
/// before the last of them.
#[inline(always)]
fn spaces<const N: usize>(line: &[u8], start: usize) -> Option<[usize; N]> {
    let mut spaces = [0; N];
    let mut found = 0;
    let mut base = start;
    while base < line.len() {
        let mut marks = spaces_and_newlines(word_at(line, base));
        while marks != 0 {
            let at = base + marks.trailing_zeros() as usize / 8;
            if line.get(at) != Some(&b' ') {
                return None;
            }
            *spaces.get_mut(found)? = at;
            found += 1;
            if found == N {
                return Some(spaces);
            }
            marks &= marks - 1;
        }
        base += 8;
    }
    None
}

/// Where `part` (a slice of `line`) starts in `line`.
#[inline(always)]
fn offset_in(line: &[u8], part: &[u8]) -> usize {
    (part.as_ptr() as usize).wrapping_sub(line.as_ptr() as usize)
}

/// `line[start..end]` as a slice of `text` (the whole line, known to be
/// UTF-8): no UTF-8 check of its own.
#[inline(always)]
fn text_at(text: &ByteString, start: usize, end: usize) -> Option<ByteString> {
    Some(text.slice_ref(text.get(start..end)?))
}

/// A `USER_IP` line whose data [`user_ip_fields`] reads, with a non-empty
/// user id and no newline; `None` otherwise. (A newline in the data is a
/// control character in a string, or not JSON that
/// [`user_ip_fields`] reads.)
#[inline(never)]
fn user_ip_line(line: &Bytes) -> Option<UserIp> {
    let start = USER_IP.len();
    let [user_end] = spaces::<1>(line, start)?;
    if user_end == start {
        return None;
    }
    let data = line.get(user_end + 1..)?;
    let ([token, ip, agent], device, last_seen) = user_ip_fields(data)?;
    // Every byte outside the strings is ASCII: the line is UTF-8 if and
    // only if they all are.
    let text = ByteString::try_from(line.clone()).ok()?;
    let field = |part: &[u8]| {
        let from = offset_in(line, part);
        text_at(&text, from, from.wrapping_add(part.len()))
    };
    Some(UserIp {
        user_id: text_at(&text, start, user_end)?,
        access_token: field(token)?,
        ip: field(ip)?,
        user_agent: field(agent)?,
        device_id: match device {
            Some(device) => Some(field(device)?),
            None => None,
        },
        last_seen,
    })
}

/// A `USER_SYNC` line with its five fields, none empty, and no newline;
/// `None` otherwise.
#[inline(never)]
fn user_sync_line(line: &Bytes) -> Option<UserSync> {
    let start = USER_SYNC.len();
    let [instance_end, user_end, device_end, state_end] = spaces::<4>(line, start)?;
    let is_syncing = match line.get(device_end + 1..state_end)? {
        b"start" => true,
        b"end" => false,
        _ => return None,
    };
    // The last field has no newline if it is a number.
    let last_sync_ms = parse_i64(line.get(state_end + 1..)?)?;
    let instance = line.get(start..instance_end)?;
    if instance.is_empty() || user_end == instance_end + 1 || device_end == user_end + 1 {
        return None;
    }
    let instance_id = InstanceName::from_line(instance)?;
    let text = ByteString::try_from(line.clone()).ok()?;
    Some(UserSync {
        instance_id,
        user_id: text_at(&text, instance_end + 1, user_end)?,
        device_id: match line.get(user_end + 1..device_end)? {
            b"None" => None,
            _ => Some(text_at(&text, user_end + 1, device_end)?),
        },
        is_syncing,
        last_sync_ms,
    })
}

/// Decodes any line but an `RDATA ` or a blank one.
fn decode_any_command(line: &Bytes) -> Result<Command, DecodeError> {
    let (name_bytes, rest) = match line.iter().position(|b| *b == b' ') {
        Some(space) => (&line[..space], &line[space + 1..]),
        None => (&line[..], &line[line.len()..]),
    };
    let Some(kind) = CommandKind::from_name(name_bytes) else {
        if line.contains(&b'\n') {
            return Err(DecodeError::Newline);
        }
        return Err(DecodeError::UnknownCommand {
            name: snippet(name_bytes),
        });
    };
    if rest.contains(&b'\n') {
        return Err(DecodeError::Newline);
    }
    let simple = |field| text(line, kind, field, rest);
    Ok(match kind {
        // `RDATA ` lines never get here; `RDATA` alone lacks its fields.
        CommandKind::Rdata => return decode_rdata_cold(line.clone()),
        CommandKind::Position => {
            let [stream, instance, prev, new] = split(
                kind,
                ["stream name", "instance name", "prev_token", "new_token"],
                rest,
            )?;
            Command::Position(Position {
                stream: stream_name(line, kind, stream)?,
                instance: instance_name(kind, "instance name", instance)?,
                prev_token: token(kind, "prev_token", prev)?,
                new_token: token(kind, "new_token", new)?,
            })
        }
        CommandKind::Server => Command::Server(simple("server name")?),
        CommandKind::Error => Command::Error(simple("message")?),
        CommandKind::Ping => Command::Ping(simple("data")?),
        CommandKind::Name => Command::Name(simple("name")?),
        CommandKind::Replicate => Command::Replicate,
        CommandKind::RemoteServerUp => Command::RemoteServerUp(simple("server name")?),
        CommandKind::NewActiveTask => Command::NewActiveTask(simple("task id")?),
        CommandKind::CancelTask => Command::CancelTask(simple("task id")?),
        CommandKind::ClearUserSync => {
            Command::ClearUserSync(InstanceName::from(simple("instance id")?))
        }
        CommandKind::UserSync => {
            let [instance, user, device, state, ms] = split(
                kind,
                [
                    "instance id",
                    "user id",
                    "device id",
                    "state",
                    "last_sync_ms",
                ],
                rest,
            )?;
            let is_syncing = match state {
                b"start" => true,
                b"end" => false,
                _ => {
                    return Err(DecodeError::InvalidField {
                        command: kind,
                        field: "state",
                        expected: "`start` or `end`",
                        input: snippet(state),
                    });
                }
            };
            Command::UserSync(UserSync {
                instance_id: instance_name(kind, "instance id", instance)?,
                user_id: name(line, kind, "user id", user)?,
                device_id: match device {
                    b"None" => None,
                    _ => Some(name(line, kind, "device id", device)?),
                },
                is_syncing,
                last_sync_ms: token(kind, "last_sync_ms", ms)?.0,
            })
        }
        CommandKind::FederationAck => {
            let [instance, ack] = split(kind, ["instance name", "token"], rest)?;
            if ack.contains(&b' ') {
                return Err(DecodeError::InvalidField {
                    command: kind,
                    field: "token",
                    expected: "exactly two fields",
                    input: snippet(rest),
                });
            }
            Command::FederationAck(FederationAck {
                instance: instance_name(kind, "instance name", instance)?,
                token: token(kind, "token", ack)?,
            })
        }
        CommandKind::UserIp => {
            let [user, data] = split(kind, ["user id", "JSON data"], rest)?;
            if let Some(user_ip) = user_ip_fast(line, user, data) {
                return Ok(Command::UserIp(Box::new(user_ip)));
            }
            type Fields<T> = (T, T, T, Option<T>, i64);
            let (access_token, ip, user_agent, device_id, last_seen) =
                json_texts(kind, "JSON data", data, |fields: Fields<String>| {
                    let (token, ip, agent, device, last_seen) = fields;
                    let device = device.map(Text::from);
                    (token.into(), ip.into(), agent.into(), device, last_seen)
                })
                .map_err(redact_input)?;
            Command::UserIp(Box::new(UserIp {
                user_id: name(line, kind, "user id", user)?,
                access_token: line_text(line, access_token),
                ip: line_text(line, ip),
                user_agent: line_text(line, user_agent),
                device_id: device_id.map(|device| line_text(line, device)),
                last_seen,
            }))
        }
        CommandKind::LockReleased => {
            let (instance, lock_name, lock_key): (Text, Text, Text) = json_texts(
                kind,
                "JSON data",
                rest,
                |fields: (String, String, String)| {
                    let (instance, name, key) = fields;
                    (instance.into(), name.into(), key.into())
                },
            )?;
            Command::LockReleased(LockReleased {
                instance: InstanceName::from(instance.as_str()),
                lock_name: line_text(line, lock_name),
                lock_key: line_text(line, lock_key),
            })
        }
    })
}

/// [`decode_rdata`] for `RDATA` lines without the space after the name.
#[inline(never)]
fn decode_rdata_cold(line: Bytes) -> Result<Command, DecodeError> {
    decode_rdata(line)
        .map(Command::Rdata)
        .map_err(|failed| failed.0)
}

/// How every complete `RDATA` line starts.
const RDATA: &[u8] = b"RDATA ";

/// How every complete `POSITION` line starts.
const POSITION: &[u8] = b"POSITION ";

/// Decodes a `POSITION` line, as [`decode_command`] would.
#[inline(never)]
fn decode_position(line: &Bytes) -> Result<Position, DecodeError> {
    match position_fast(line) {
        Some(position) => Ok(position),
        None => decode_position_general(line),
    }
}

/// A `POSITION` line as Synapse writes it, read as [`rdata_fields_fast`]
/// reads an `RDATA` header (the new token ends the line); `None` for any
/// other line, which [`decode_position_general`] then reads (or
/// refuses). What this returns, [`decode_position_general`] returns too.
#[inline(always)]
fn position_fast(line: &[u8]) -> Option<Position> {
    let start = POSITION.len();
    let (stream, stream_end) = known_stream(line, start)?;
    let (instance, instance_end) = rdata_instance(line, stream_end + 1)?;
    let (RdataToken::At(prev_token), prev_end) = rdata_token(line, instance_end + 1)? else {
        return None;
    };
    // A token is digits: no newline.
    let new_token = Token(token_at(line, prev_end + 1, line.len())?);
    Some(Position {
        stream,
        instance,
        prev_token,
        new_token,
    })
}

/// [`decode_position`] for the lines [`position_fast`] does not read.
fn decode_position_general(line: &Bytes) -> Result<Position, DecodeError> {
    let kind = CommandKind::Position;
    if line
        .get(POSITION.len()..)
        .unwrap_or_default()
        .contains(&b'\n')
    {
        return Err(DecodeError::Newline);
    }
    let [stream_end, instance_end, prev_end] = three_spaces(
        line,
        POSITION.len(),
        kind,
        ["stream name", "instance name", "prev_token", "new_token"],
    )?;
    let part = |start: usize, end: usize| line.get(start..end).unwrap_or_default();
    let token = |field, start, end| match token_at(line, start, end) {
        Some(value) => Ok(Token(value)),
        None => Err(DecodeError::InvalidToken {
            command: kind,
            field,
            input: snippet(part(start, end)),
        }),
    };
    Ok(Position {
        stream: stream_name(line, kind, part(POSITION.len(), stream_end))?,
        instance: instance_name(kind, "instance name", part(stream_end + 1, instance_end))?,
        prev_token: token("prev_token", instance_end + 1, prev_end)?,
        new_token: token("new_token", prev_end + 1, line.len())?,
    })
}

const ONES: u64 = 0x0101_0101_0101_0101;
const LOWS: u64 = 0x7f7f_7f7f_7f7f_7f7f;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of every byte of `word` that is a space or a newline; exact
/// for every byte (no borrows between bytes).
const fn spaces_and_newlines(word: u64) -> u64 {
    let spaces = word ^ (ONES * b' ' as u64);
    let newlines = word ^ (ONES * b'\n' as u64);
    // A byte's high bit is set in `nonzero(x)` iff the byte of x is not zero.
    const fn nonzero(x: u64) -> u64 {
        ((x & LOWS) + LOWS) | x
    }
    !(nonzero(spaces) & nonzero(newlines)) & HIGHS
}

/// The eight bytes of `bytes` from `at` as a little-endian word; bytes past
/// the end read as zero.
#[inline(always)]
fn word_at(bytes: &[u8], at: usize) -> u64 {
    match bytes.get(at..).and_then(<[u8]>::first_chunk::<8>) {
        Some(chunk) => u64::from_le_bytes(*chunk),
        None => short_word_at(bytes, at),
    }
}

#[cold]
fn short_word_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0; 8];
    for (to, from) in word.iter_mut().zip(bytes.get(at..).unwrap_or_default()) {
        *to = *from;
    }
    u64::from_le_bytes(word)
}

/// The offsets in `line` of the first three spaces from `start`, found
/// eight bytes at a time: those that end the first three of the four
/// fields of `command` named in `fields`. A newline before the third space
/// is [`DecodeError::Newline`]; a missing space makes the field it would
/// start [`DecodeError::MissingField`].
#[inline(always)]
fn three_spaces(
    line: &[u8],
    start: usize,
    command: CommandKind,
    fields: [&'static str; 4],
) -> Result<[usize; 3], DecodeError> {
    let mut spaces = [0; 3];
    let mut found = 0;
    let mut base = start;
    while base < line.len() {
        let mut marks = spaces_and_newlines(word_at(line, base));
        while marks != 0 {
            let at = base + marks.trailing_zeros() as usize / 8;
            if line.get(at) != Some(&b' ') {
                return Err(DecodeError::Newline);
            }
            match found {
                0 => spaces[0] = at,
                1 => spaces[1] = at,
                _ => {
                    spaces[2] = at;
                    return Ok(spaces);
                }
            }
            found += 1;
            marks &= marks - 1;
        }
        base += 8;
    }
    Err(DecodeError::MissingField {
        command,
        field: match found {
            0 => fields[1],
            1 => fields[2],
            _ => fields[3],
        },
    })
}

/// The token in `line[start..end]`: [`parse_i64`], with up to eight digits
/// converted eight bytes at a time.
#[inline(always)]
fn token_at(line: &[u8], start: usize, end: usize) -> Option<i64> {
    let len = end.wrapping_sub(start);
    if (1..=8).contains(&len) {
        if let Some(word) = end.checked_sub(8).and_then(|from| line.get(from..end)) {
            if let Some(word) = word.first_chunk::<8>() {
                // The token fills the high bytes; the bytes before it become
                // `0`s, leading zeros that change nothing.
                let keep = u64::MAX << (8 * (8 - len));
                let zeros = ONES * u64::from(b'0');
                let word = (u64::from_le_bytes(*word) & keep) | (zeros & !keep);
                if let Some(value) = eight_digits(word) {
                    return Some(value as i64);
                }
            }
        }
    }
    parse_i64(line.get(start..end).unwrap_or_default())
}

/// Eight ASCII digits, the first in the lowest byte, as a number; `None` if
/// any byte is not a digit.
const fn eight_digits(word: u64) -> Option<u64> {
    let digits = word.wrapping_sub(ONES * b'0' as u64);
    // A byte is a digit iff, less `0`, it and it plus 6 are below 16. (A
    // byte below `0` borrows from the next, but is caught itself.)
    if (digits | digits.wrapping_add(ONES * 6)) & (ONES * 0xf0) != 0 {
        return None;
    }
    // Combine neighbours: pairs, then fours, then all eight.
    let pairs = (digits * 10 + (digits >> 8)) & 0x00ff_00ff_00ff_00ff;
    let fours = (pairs * 100 + (pairs >> 16)) & 0x0000_ffff_0000_ffff;
    Some((fours * 10000 + (fours >> 32)) & 0xffff_ffff)
}

/// Decodes an `RDATA` line. The row keeps the line's reference (the row
/// ends the line), so no reference count is touched.
#[inline(always)]
fn decode_rdata(line: Bytes) -> Result<Rdata, Salvaged> {
    match rdata_fields_fast(&line) {
        Some((stream, instance, token, row_start)) => {
            let mut row = line;
            row.advance(row_start);
            Ok(Rdata {
                stream,
                instance,
                token,
                row: RawRow::from_validated(row),
            })
        }
        None => decode_rdata_general(line),
    }
}

/// [`rdata_fields`] for the lines Synapse writes: a known stream, a
/// writer's name and a token each found with one word read where they are
/// short, and a valid row; `None` for any other line, which
/// [`rdata_fields`] then reads (or refuses). What this returns,
/// [`rdata_fields`] returns too.
#[inline(always)]
fn rdata_fields_fast(line: &[u8]) -> Option<(StreamName, InstanceName, RdataToken, usize)> {
    let start = RDATA.len();
    let (stream, stream_end) = known_stream(line, start)?;
    let (instance, instance_end) = rdata_instance(line, stream_end + 1)?;
    let (token, token_end) = rdata_token(line, instance_end + 1)?;
    json::validate_row(line.get(token_end + 1..)?).ok()?;
    Some((stream, instance, token, token_end + 1))
}

/// The known stream whose name starts `line` at `start` and is followed
/// by a space, and where it ends; a short name is compared as a word.
#[inline(always)]
fn known_stream(line: &[u8], start: usize) -> Option<(StreamName, usize)> {
    // A known name holds no space, newline or other control character:
    // the first such byte ends it.
    let (word, end) = short_field(line, start)?;
    let len = end - start;
    let stream = match len {
        1..8 => StreamName::known_word(word & (u64::MAX >> (64 - 8 * len))),
        _ => None,
    };
    match stream {
        Some(stream) => Some((stream, end)),
        None => Some((StreamName::known_bytes(line.get(start..end)?)?, end)),
    }
}

/// The first space or newline in `line` from `at`, eight bytes at a time.
#[inline(always)]
fn next_mark(line: &[u8], mut at: usize) -> Option<usize> {
    while at < line.len() {
        let marks = spaces_and_newlines(word_at(line, at));
        if marks != 0 {
            return Some(at + marks.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    None
}

/// The non-empty field at `start` ended by a space: the first word of
/// the line from `start` (a field of up to seven bytes is in its low
/// bytes), and the field's end. `None` if a newline ends the field, or
/// any other control character is in its first word.
#[inline(always)]
fn short_field(line: &[u8], start: usize) -> Option<(u64, usize)> {
    let word = word_at(line, start);
    // The high bit of the first byte below `!` (a space, a control
    // character, or past the end of the line) is set, exactly: no borrow
    // reaches it.
    let low = word.wrapping_sub(ONES * 0x21) & !word & HIGHS;
    if low != 0 {
        let len = low.trailing_zeros() as usize / 8;
        if len == 0 || (word >> (8 * len)) as u8 != b' ' {
            return None;
        }
        return Some((word, start + len));
    }
    let end = next_mark(line, start + 8)?;
    if line.get(end) != Some(&b' ') {
        return None;
    }
    Some((word, end))
}

/// The writer's name of an `RDATA` line, from `start`, and its end.
#[inline(always)]
fn rdata_instance(line: &[u8], start: usize) -> Option<(InstanceName, usize)> {
    let (word, end) = short_field(line, start)?;
    let len = end - start;
    let name = match len {
        ..8 => InstanceName::from_word(word & (u64::MAX >> (64 - 8 * len)), len),
        _ => None,
    };
    match name {
        Some(name) => Some((name, end)),
        None => Some((InstanceName::from_line(line.get(start..end)?)?, end)),
    }
}

/// The token of an `RDATA` line, from `start`, and its end.
#[inline(always)]
fn rdata_token(line: &[u8], start: usize) -> Option<(RdataToken, usize)> {
    const BATCH: u64 = u64::from_le_bytes(*b"batch\0\0\0");
    let (word, end) = short_field(line, start)?;
    let len = end - start;
    if len >= 8 {
        return Some((RdataToken::At(Token(token_at(line, start, end)?)), end));
    }
    let shift = 8 * (8 - len) as u32;
    if len == 5 && word << shift >> shift == BATCH {
        return Some((RdataToken::Batch, end));
    }
    // As in `token_at`: the token in the high bytes, `0`s below it.
    let digits = word << shift | (ONES * u64::from(b'0')) >> (64 - shift);
    Some((RdataToken::At(Token(eight_digits(digits)? as i64)), end))
}

/// [`decode_rdata`] for the lines [`rdata_fields_fast`] does not read.
#[inline(never)]
fn decode_rdata_general(line: Bytes) -> Result<Rdata, Salvaged> {
    match rdata_fields(&line) {
        Ok((stream, instance, token, row_start)) => {
            let mut row = line;
            row.advance(row_start);
            Ok(Rdata {
                stream,
                instance,
                token,
                row: RawRow::from_validated(row),
            })
        }
        Err(error) => Err(salvage(error, &line)),
    }
}

/// The fields of an `RDATA` line, its row validated, and where the row
/// starts.
#[inline(always)]
fn rdata_fields(
    line: &Bytes,
) -> Result<(StreamName, InstanceName, RdataToken, usize), DecodeError> {
    let kind = CommandKind::Rdata;
    let [stream_end, instance_end, token_end] = three_spaces(
        line,
        RDATA.len(),
        kind,
        ["stream name", "instance name", "token", "row"],
    )?;
    let part = |start: usize, end: usize| line.get(start..end).unwrap_or_default();
    let token = match part(instance_end + 1, token_end) {
        b"batch" => RdataToken::Batch,
        text => match token_at(line, instance_end + 1, token_end) {
            Some(value) => RdataToken::At(Token(value)),
            None => {
                return Err(DecodeError::InvalidToken {
                    command: kind,
                    field: "token",
                    input: snippet(text),
                });
            }
        },
    };
    let row = part(token_end + 1, line.len());
    json::validate_row(row).map_err(|source: JsonError| match source {
        JsonError::Newline => DecodeError::Newline,
        source => DecodeError::InvalidJson {
            command: kind,
            field: "row",
            source,
            input: snippet(row),
        },
    })?;
    let stream = stream_name(line, kind, part(RDATA.len(), stream_end))?;
    let instance = instance_name(kind, "instance name", part(stream_end + 1, instance_end))?;
    Ok((stream, instance, token, token_end + 1))
}

/// For the fast paths' tests: whether `fast` read `line`; what it reads,
/// `general` must read the same (and not refuse).
#[cfg(test)]
fn fast_path_agrees<T, E>(
    line: &[u8],
    fast: impl FnOnce(&Bytes) -> Option<T>,
    general: impl FnOnce(&Bytes) -> Result<T, E>,
) -> Result<bool, proptest::test_runner::TestCaseError>
where
    T: PartialEq + std::fmt::Debug,
    E: std::fmt::Display,
{
    let line = Bytes::copy_from_slice(line);
    let Some(fast) = fast(&line) else {
        return Ok(false);
    };
    match general(&line) {
        Ok(general) => proptest::prop_assert_eq!(fast, general),
        Err(error) => {
            return Err(proptest::test_runner::TestCaseError::fail(format!(
                "the fast path read {fast:?} from {line:?}, the general path refused it: {error}"
            )));
        }
    }
    Ok(true)
}

/// For the fast paths' tests: a property's inputs (from `lines`) take the
/// fast path often and fall back often, so that it tests something.
#[cfg(test)]
fn takes_both_paths(
    lines: impl proptest::strategy::Strategy<Value = Vec<u8>>,
    fast: impl Fn(&[u8]) -> bool,
) {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let taken = (0..1000)
        .filter(|_| {
            let line = lines
                .new_tree(&mut runner)
                .map(|tree| tree.current())
                .unwrap_or_default();
            fast(&line)
        })
        .count();
    assert!(
        (50..950).contains(&taken),
        "{taken} of 1000 took the fast path"
    );
}

#[cfg(test)]
mod redaction_tests {
    use super::*;

    #[test]
    fn a_bad_user_ip_is_not_quoted() {
        let line =
            Bytes::from_static(br#"USER_IP @a:x ["syt_secret_token","1.2.3.4","ua",null,"x"]"#);
        let error = Command::decode(line).expect_err("last_seen is not a number");
        let text = format!("{error} {error:?}");
        assert!(!text.contains("syt_secret_token"), "{text}");
        assert!(text.contains("not quoted"), "{text}");
    }
}

#[cfg(test)]
mod json_field_tests {
    use super::*;

    /// Whether `text` is a slice of `line`'s own bytes (not a copy).
    fn shares(line: &Bytes, text: &ByteString) -> bool {
        line.as_ptr_range().contains(&text.as_ptr())
    }

    #[test]
    fn user_ip_strings_are_slices_of_the_line_unless_escaped() {
        let line = Bytes::from_static(
            br#"USER_IP @a:x ["syt_t","1.2.3.4","caf\u00e9 agent","DEV",1700000000000]"#,
        );
        let Ok(Some(Command::UserIp(ip))) = Command::decode(line.clone()) else {
            panic!("USER_IP decodes");
        };
        assert_eq!(&*ip.access_token, "syt_t");
        assert_eq!(&*ip.user_agent, "café agent");
        assert_eq!(ip.device_id.as_deref(), Some("DEV"));
        assert_eq!(ip.last_seen, 1_700_000_000_000);
        assert!(shares(&line, &ip.access_token) && shares(&line, &ip.ip));
        assert!(
            !shares(&line, &ip.user_agent),
            "an escaped string is unescaped"
        );
        assert!(ip.device_id.as_ref().is_some_and(|d| shares(&line, d)));
    }

    #[test]
    fn a_lone_surrogate_reads_as_a_replacement_character() {
        let line = Bytes::from_static(br#"USER_IP @a:x ["t","ip","a\ud800b",null,1]"#);
        let Ok(Some(Command::UserIp(ip))) = Command::decode(line) else {
            panic!("USER_IP decodes");
        };
        assert_eq!(&*ip.user_agent, "a\u{fffd}b");
        assert_eq!((&*ip.access_token, ip.device_id), ("t", None));
        let line = Bytes::from_static(br#"LOCK_RELEASED ["w1","lock\udc00","key"]"#);
        let Ok(Some(Command::LockReleased(lock))) = Command::decode(line) else {
            panic!("LOCK_RELEASED decodes");
        };
        assert_eq!(lock.instance, "w1");
        assert_eq!(&*lock.lock_name, "lock\u{fffd}");
        assert_eq!(&*lock.lock_key, "key");
    }

    #[test]
    fn lock_released_strings_are_slices_of_the_line() {
        let line = Bytes::from_static(br#"LOCK_RELEASED ["w1","new_event_lock","!room:x"]"#);
        let Ok(Some(Command::LockReleased(lock))) = Command::decode(line.clone()) else {
            panic!("LOCK_RELEASED decodes");
        };
        assert_eq!(lock.instance, "w1");
        assert_eq!(
            (&*lock.lock_name, &*lock.lock_key),
            ("new_event_lock", "!room:x")
        );
        assert!(shares(&line, &lock.lock_name) && shares(&line, &lock.lock_key));
    }
}

#[cfg(test)]
mod user_ip_tests {
    use proptest::prelude::*;

    use super::user_ip_fields;

    type Fields = (String, String, String, Option<String>, i64);

    /// JSON text that is `USER_IP` data or close to it: strings with
    /// quotes, escapes, control and non-ASCII characters, numbers with
    /// signs, leading zeros, fractions and exponents, extra fields and
    /// trailing bytes.
    fn near_user_ip() -> impl Strategy<Value = Vec<u8>> {
        // Weighted so that about one case in ten takes the fast path.
        let string = prop_oneof![
            8 => "[a-z0-9_.:@ é-]{0,12}".prop_map(|s| format!("\"{s}\"")),
            1 => "[a-z\"\\\\\u{1}é\u{10000}]{0,6}".prop_map(|s| format!("\"{s}\"")),
            1 => Just("\"a\\u00e9\"".to_owned()),
            1 => Just("\"unterminated".to_owned()),
        ];
        let device = prop_oneof![
            3 => string.clone(),
            3 => Just("null".to_owned()),
            1 => Just("nul".to_owned()),
        ];
        let number = prop_oneof![
            6 => (-(1i64 << 50)..1 << 50).prop_map(|n| n.to_string()),
            1 => any::<i64>().prop_map(|n| n.to_string()),
            2 => (0u64..1000).prop_map(|n| n.to_string()),
            1 => Just("-0".to_owned()),
            1 => Just("007".to_owned()),
            1 => Just("-01".to_owned()),
            1 => Just("1.5".to_owned()),
            1 => Just("1e3".to_owned()),
            1 => Just("99999999999999999999".to_owned()),
            1 => Just("-".to_owned()),
        ];
        let tail = prop_oneof![
            6 => Just(String::new()),
            1 => Just(" ".to_owned()),
            1 => Just(",1".to_owned()),
            1 => Just("]".to_owned()),
        ];
        (string.clone(), string.clone(), string, device, number, tail).prop_map(
            |(token, ip, agent, device, number, tail)| {
                format!("[{token},{ip},{agent},{device},{number}]{tail}").into_bytes()
            },
        )
    }

    #[test]
    fn synapse_s_data_takes_the_fast_path() {
        let data = br#"["syt_abc","10.0.0.1","Mozilla/5.0 (X11)","DEVICE",1700000000000]"#;
        assert_eq!(
            user_ip_fields(data),
            Some((
                [&b"syt_abc"[..], b"10.0.0.1", b"Mozilla/5.0 (X11)"],
                Some(&b"DEVICE"[..]),
                1_700_000_000_000
            ))
        );
        let data = br#"["t","::1","",null,-5]"#;
        assert_eq!(
            user_ip_fields(data),
            Some(([&b"t"[..], b"::1", b""], None, -5))
        );
    }

    /// The property below tests something: its inputs take the fast path
    /// often, and fall back often.
    #[test]
    fn the_inputs_take_both_paths() {
        super::takes_both_paths(near_user_ip(), |data| user_ip_fields(data).is_some());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// What the fast path reads, serde_json reads the same.
        #[test]
        fn the_fast_path_reads_as_serde_json(data in near_user_ip()) {
            let text = |bytes: &[u8]| std::str::from_utf8(bytes).ok().map(str::to_owned);
            if let Some(([token, ip, agent], device, last_seen)) = user_ip_fields(&data) {
                // Taken only if its strings are UTF-8 (`user_ip_fast`).
                let device = match device.map(text) {
                    Some(None) => return Ok(()),
                    device => device.flatten(),
                };
                let (Some(token), Some(ip), Some(agent)) = (text(token), text(ip), text(agent))
                else {
                    return Ok(());
                };
                let fields: Fields = serde_json::from_slice(&data)
                    .map_err(|e| TestCaseError::fail(format!("serde_json refused it: {e}")))?;
                prop_assert_eq!(fields, (token, ip, agent, device, last_seen));
            }
        }
    }
}

#[cfg(test)]
mod common_command_tests {
    use proptest::prelude::*;

    use super::*;

    /// What [`common_command`] reads, [`decode_any_command`] reads the
    /// same; and it reads Synapse's lines.
    fn agrees(line: &[u8]) -> Result<bool, TestCaseError> {
        fast_path_agrees(line, common_command, decode_any_command)
    }

    #[test]
    fn synapse_s_lines_take_the_fast_path() {
        for line in [
            &br#"USER_IP @a:x ["syt_abc","10.0.0.1","Mozilla/5.0 (X11)","DEVICE",1700000000000]"#[..],
            br#"USER_IP @a:x ["t","::1","",null,-5]"#,
            b"USER_IP @\xc3\xa9:x [\"t\xc3\xa9\",\"::1\",\"\xf0\x9f\x8d\x94\",null,5]",
            b"USER_SYNC synchrotron1 @a:x DEVICE start 1700000000000",
            b"USER_SYNC synchrotron1 @a:x None end 1",
            b"FEDERATION_ACK federation_sender1 1700000000000",
            b"FEDERATION_ACK f\xc3\xa9 -1",
            br#"LOCK_RELEASED ["w1","new_event_lock","!room:x"]"#,
            br#"LOCK_RELEASED ["","",""]"#,
            b"LOCK_RELEASED [\"w\xc3\xa9\",\"\xf0\x9f\x8d\x94\",\"k\"]",
            "USER_SYNC sync\u{e9} @\u{e9}:x d\u{e9}v start -1".as_bytes(),
        ] {
            assert!(
                matches!(agrees(line), Ok(true)),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        for line in [
            &br#"USER_IP  ["t","::1","",null,5]"#[..],
            br#"USER_IP @a:x ["t","::1","",null,5] "#,
            b"USER_IP @a\n:x [\"t\",\"::1\",\"\",null,5]",
            b"USER_IP @a:\xff [\"t\",\"::1\",\"\",null,5]",
            b"USER_IP @a:x [\"t\xff\",\"::1\",\"\",null,5]",
            b"USER_IP @a:x [\"t\",\"::1\",\"\xe9\",null,5]",
            b"USER_SYNC  @a:x DEVICE start 1",
            b"USER_SYNC s1  DEVICE start 1",
            b"USER_SYNC s1 @a:x  start 1",
            b"USER_SYNC s1 @a:x DEVICE stop 1",
            b"USER_SYNC s1 @a:x DEVICE start 1 ",
            b"USER_SYNC s1 @a:x DEVICE start 1\n",
            b"USER_SYNC s1 @a:x DEV\nICE start 1",
            b"USER_SYNC s1 @a:\xff DEVICE start 1",
            b"USER_SYNC s\xff @a:x DEVICE start 1",
            b"USER_SYNC s1 @a:x DEVICE start",
            b"FEDERATION_ACK  1",
            b"FEDERATION_ACK f1 1 2",
            b"FEDERATION_ACK f1 1\n",
            b"FEDERATION_ACK f\n1 1",
            b"FEDERATION_ACK f\xff 1",
            b"FEDERATION_ACK f1",
            br#"LOCK_RELEASED ["w1","l","k"] "#,
            br#"LOCK_RELEASED ["w1","l","k","x"]"#,
            br#"LOCK_RELEASED ["w1","l\u00e9","k"]"#,
            br#"LOCK_RELEASED [ "w1","l","k"]"#,
            b"LOCK_RELEASED [\"w1\",\"l\xff\",\"k\"]",
            b"LOCK_RELEASED [\"w1\",\"l\n\",\"k\"]",
        ] {
            assert!(
                matches!(agrees(line), Ok(false)),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
    }

    /// Text around the fast paths' boundaries: every length across a few
    /// words, spaces, newlines, non-ASCII and invalid UTF-8.
    fn field() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            12 => "[a-z@:._]{0,20}".prop_map(String::into_bytes),
            1 => "[a-z é\n\u{1f354}]{0,20}".prop_map(String::into_bytes),
            1 => prop::collection::vec(any::<u8>(), 0..20),
            1 => Just(b"None".to_vec()),
        ]
    }

    fn json_string() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            12 => field().prop_map(|f| [&b"\""[..], &f, b"\""].concat()),
            1 => Just(b"null".to_vec()),
            1 => Just(b"\"a\\u00e9\"".to_vec()),
        ]
    }

    fn number() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            6 => (-(1i64 << 50)..1 << 50).prop_map(|n| n.to_string().into_bytes()),
            1 => any::<i64>().prop_map(|n| n.to_string().into_bytes()),
            1 => Just(b"start".to_vec()),
            1 => Just(b"end".to_vec()),
            1 => "[0-9 \n-]{0,20}".prop_map(String::into_bytes),
        ]
    }

    fn user_ip() -> impl Strategy<Value = Vec<u8>> {
        (
            field(),
            prop::collection::vec(json_string(), 4),
            number(),
            prop_oneof![4 => Just(&b""[..]), 1 => Just(&b" "[..]), 1 => Just(&b"\n"[..])],
        )
            .prop_map(|(user, strings, number, tail)| {
                let mut line = b"USER_IP ".to_vec();
                line.extend_from_slice(&user);
                line.extend_from_slice(b" [");
                for string in &strings {
                    line.extend_from_slice(string);
                    line.push(b',');
                }
                line.extend_from_slice(&number);
                line.push(b']');
                line.extend_from_slice(tail);
                line
            })
    }

    fn federation_ack() -> impl Strategy<Value = Vec<u8>> {
        (
            field(),
            number(),
            prop_oneof![4 => Just(&b""[..]), 1 => Just(&b" 1"[..])],
        )
            .prop_map(|(instance, number, tail)| {
                [&b"FEDERATION_ACK "[..], &instance, b" ", &number, tail].concat()
            })
    }

    fn lock_released() -> impl Strategy<Value = Vec<u8>> {
        (
            prop::collection::vec(json_string(), 3),
            prop_oneof![4 => Just(&b""[..]), 1 => Just(&b" "[..]), 1 => Just(&b","[..])],
        )
            .prop_map(|(strings, tail)| {
                let mut line = b"LOCK_RELEASED [".to_vec();
                line.extend_from_slice(&strings.join(&b","[..]));
                line.push(b']');
                line.extend_from_slice(tail);
                line
            })
    }

    fn user_sync() -> impl Strategy<Value = Vec<u8>> {
        (
            prop::collection::vec(field(), 3),
            prop_oneof![Just(&b"start"[..]), Just(&b"end"[..]), Just(&b"en"[..])],
            number(),
        )
            .prop_map(|(fields, state, number)| {
                let mut line = b"USER_SYNC".to_vec();
                for field in fields.iter().map(Vec::as_slice).chain([state, &number]) {
                    line.push(b' ');
                    line.extend_from_slice(field);
                }
                line
            })
    }

    /// The properties below test something: their inputs take the fast
    /// paths often, and fall back often.
    #[test]
    fn the_inputs_take_both_paths() {
        for lines in [
            user_ip().boxed(),
            user_sync().boxed(),
            federation_ack().boxed(),
            lock_released().boxed(),
        ] {
            takes_both_paths(lines, |line| {
                common_command(&Bytes::copy_from_slice(line)).is_some()
            });
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn user_ip_reads_as_the_general_path(line in user_ip()) {
            agrees(&line)?;
        }

        #[test]
        fn user_sync_reads_as_the_general_path(line in user_sync()) {
            agrees(&line)?;
        }

        #[test]
        fn federation_ack_reads_as_the_general_path(line in federation_ack()) {
            agrees(&line)?;
        }

        #[test]
        fn lock_released_reads_as_the_general_path(line in lock_released()) {
            agrees(&line)?;
        }
    }
}

#[cfg(test)]
mod rdata_fast_tests {
    use proptest::prelude::*;

    use super::*;

    /// What [`rdata_fields_fast`] reads, [`rdata_fields`] reads the same.
    fn agrees(line: &[u8]) -> Result<bool, TestCaseError> {
        fast_path_agrees(line, |line| rdata_fields_fast(line), rdata_fields)
    }

    /// Every length of writer's name and token across the word sizes,
    /// with and without a non-ASCII or non-digit byte at each place.
    #[test]
    fn every_length_of_name_and_token() {
        let fast = |line: &[u8]| agrees(line).unwrap_or_else(|e| panic!("{e}"));
        for len in 1..=24 {
            let name = "abcdefghijklmnopqrstuvwxyz".get(..len).unwrap_or_default();
            let line = format!("RDATA events {name} 12 [1]");
            assert!(fast(line.as_bytes()), "{line}");
            for at in 0..len {
                let mut other = name.as_bytes().to_vec();
                other[at] = 0xe9;
                fast(&[&b"RDATA events "[..], &other, b" 12 [1]"].concat());
                let mut other = name.to_owned();
                other.replace_range(at..=at, "\u{e9}");
                assert!(fast(format!("RDATA events {other} 12 [1]").as_bytes()));
                let mut other = name.to_owned();
                other.replace_range(at..=at, "\n");
                assert!(!fast(format!("RDATA events {other} 12 [1]").as_bytes()));
            }
        }
        for len in 1..=19 {
            let token = "9123456789012345678".get(..len).unwrap_or_default();
            let line = format!("RDATA caches master {token} [1]");
            assert!(fast(line.as_bytes()), "{line}");
            for at in 0..len {
                for byte in ["-", "+", "a", "/", ":", "\n", "\u{e9}", "_"] {
                    let mut other = token.to_owned();
                    other.replace_range(at..=at, byte);
                    fast(format!("RDATA caches master {other} [1]").as_bytes());
                }
            }
        }
        for token in [
            "batch", "batc", "batchx", "Batch", "batch\n", "-1", "-0", "0",
        ] {
            fast(format!("RDATA caches master {token} [1]").as_bytes());
        }
        assert!(fast(b"RDATA caches master batch [1]"));
        for line in [
            &b"RDATA caches master 1 [1"[..],
            b"RDATA caches master 1 [1]\n",
            b"RDATA caches  1 [1]",
            b"RDATA caches master  [1]",
            b"RDATA caches\nmaster 1 [1]",
            b"RDATA caches master\n1 [1]",
            b"RDATA caches master 1\n[1]",
            b"RDATA new_stream master 1 [1]",
            b"RDATA  master 1 [1]",
            b"RDATA caches master 1",
            b"RDATA caches master",
        ] {
            assert!(!fast(line), "{}", String::from_utf8_lossy(line));
        }
    }

    fn field() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            8 => "[a-z_0-9]{0,20}".prop_map(String::into_bytes),
            1 => "[a-z é\n\u{1f354}]{0,12}".prop_map(String::into_bytes),
            1 => prop::collection::vec(any::<u8>(), 0..12),
        ]
    }

    fn line() -> impl Strategy<Value = Vec<u8>> {
        let stream = prop_oneof![
            6 => prop::sample::select(StreamName::KNOWN.to_vec())
                .prop_map(|s| s.as_str().as_bytes().to_vec()),
            1 => field(),
        ];
        let token = prop_oneof![
            4 => any::<i64>().prop_map(|n| n.to_string().into_bytes()),
            4 => (0i64..100_000_000).prop_map(|n| n.to_string().into_bytes()),
            1 => Just(b"batch".to_vec()),
            1 => field(),
        ];
        let row = prop_oneof![
            4 => Just(&b"[1]"[..]),
            1 => Just(&b"{\"a\":[null]} "[..]),
            1 => Just(&b"[1"[..]),
            1 => Just(&b"[\"\n\"]"[..]),
        ];
        (stream, field(), token, row).prop_map(|(stream, instance, token, row)| {
            [
                &b"RDATA "[..],
                &stream,
                b" ",
                &instance,
                b" ",
                &token,
                b" ",
                row,
            ]
            .concat()
        })
    }

    /// The property below tests something: its inputs take the fast path
    /// often, and fall back often.
    #[test]
    fn the_inputs_take_both_paths() {
        takes_both_paths(line(), |line| rdata_fields_fast(line).is_some());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn rdata_reads_as_the_general_path(line in line()) {
            agrees(&line)?;
        }
    }
}

#[cfg(test)]
mod parse_i64_tests {
    use proptest::prelude::*;

    use super::parse_i64;

    /// `-?[0-9]+` within `i64`, the slow way.
    fn reference(text: &[u8]) -> Option<i64> {
        let digits = text.strip_prefix(b"-").unwrap_or(text);
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(text).ok()?.parse().ok()
    }

    #[test]
    fn every_length_and_every_wrong_byte() {
        for len in 0..=20 {
            let digits = &"98765432109876543210"[..len];
            for sign in ["", "-", "+"] {
                let text = format!("{sign}{digits}");
                assert_eq!(
                    parse_i64(text.as_bytes()),
                    reference(text.as_bytes()),
                    "{text}"
                );
                for at in 0..len {
                    for byte in [b'/', b':', b' ', b'-', 0xb0, 0x30 + 0x80, 0] {
                        let mut text = text.clone().into_bytes();
                        text[sign.len() + at] = byte;
                        assert_eq!(parse_i64(&text), reference(&text), "{text:?}");
                    }
                }
            }
        }
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"9223372036854775808"), None);
    }

    proptest! {
        #[test]
        fn reads_as_the_reference(text in "-?[0-9]{0,20}|[0-9/: +-]{0,20}") {
            prop_assert_eq!(parse_i64(text.as_bytes()), reference(text.as_bytes()));
        }
    }
}

#[cfg(test)]
mod position_fast_tests {
    use proptest::prelude::*;

    use super::*;

    /// What [`position_fast`] reads, [`decode_position_general`] reads the
    /// same.
    fn agrees(line: &[u8]) -> Result<bool, TestCaseError> {
        fast_path_agrees(line, |line| position_fast(line), decode_position_general)
    }

    #[test]
    fn every_length_of_token() {
        let fast = |line: &[u8]| agrees(line).unwrap_or_else(|e| panic!("{e}"));
        for len in 1..=19 {
            let token = "9123456789012345678".get(..len).unwrap_or_default();
            for line in [
                format!("POSITION events master {token} 12"),
                format!("POSITION events master 12 {token}"),
                format!("POSITION events event_persister1 {token} {token}"),
            ] {
                assert!(fast(line.as_bytes()), "{line}");
            }
            for at in 0..len {
                for byte in ["-", "+", "a", "/", ":", "\n", " ", "\u{e9}", "_"] {
                    let mut other = token.to_owned();
                    other.replace_range(at..=at, byte);
                    fast(format!("POSITION caches master {other} 1").as_bytes());
                    fast(format!("POSITION caches master 1 {other}").as_bytes());
                }
            }
        }
        for line in [
            &b"POSITION caches master batch 1"[..],
            b"POSITION caches master 1 batch",
            b"POSITION caches master 1 2 ",
            b"POSITION caches master 1 2\n",
            b"POSITION caches master 1 2 3",
            b"POSITION caches master 1 ",
            b"POSITION caches master 1",
            b"POSITION caches  1 2",
            b"POSITION caches ma\nster 1 2",
            b"POSITION caches\n master 1 2",
            b"POSITION new_stream master 1 2",
            b"POSITION caches m\xff 1 2",
        ] {
            assert!(!fast(line), "{}", String::from_utf8_lossy(line));
        }
        assert!(fast("POSITION caches m\u{e9} 1 2".as_bytes()));
    }

    fn field() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            8 => "[a-z_0-9]{0,20}".prop_map(String::into_bytes),
            1 => "[a-z é\n\u{1f354}]{0,12}".prop_map(String::into_bytes),
            1 => prop::collection::vec(any::<u8>(), 0..12),
        ]
    }

    fn line() -> impl Strategy<Value = Vec<u8>> {
        let stream = prop_oneof![
            6 => prop::sample::select(StreamName::KNOWN.to_vec())
                .prop_map(|s| s.as_str().as_bytes().to_vec()),
            1 => field(),
        ];
        let token = || {
            prop_oneof![
                4 => any::<i64>().prop_map(|n| n.to_string().into_bytes()),
                4 => (0i64..100_000_000).prop_map(|n| n.to_string().into_bytes()),
                1 => field(),
            ]
        };
        (stream, field(), token(), token()).prop_map(|(stream, instance, prev, new)| {
            [
                &b"POSITION "[..],
                &stream,
                b" ",
                &instance,
                b" ",
                &prev,
                b" ",
                &new,
            ]
            .concat()
        })
    }

    /// The property below tests something: its inputs take the fast path
    /// often, and fall back often.
    #[test]
    fn the_inputs_take_both_paths() {
        takes_both_paths(line(), |line| position_fast(line).is_some());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn position_reads_as_the_general_path(line in line()) {
            agrees(&line)?;
        }
    }
}
