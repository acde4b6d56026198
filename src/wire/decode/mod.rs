//! One line of bytes to one [`Command`].
//!
//! The general path here reads any line as Synapse does; `fast` reads the
//! lines Synapse itself writes (and only lines the general path reads the
//! same), eight bytes at a time with the helpers of `words`, and hands
//! anything else back to it.

mod fast;
mod words;

use std::sync::Arc;

use bytes::{Buf, Bytes};
use bytestring::ByteString;

use super::command::{
    Command, CommandKind, FederationAck, LockReleased, Position, Rdata, UserIp, UserSync,
};
use super::error::{DecodeError, snippet};
use super::json::{self, JsonError, Text};
use super::names::{InstanceName, StreamName};
use super::prefix;
use super::row::RawRow;
use super::token::{RdataToken, Token};
use fast::{
    common_command, position_fast, position_rest_fast, position_stream, rdata_fields_fast,
    rdata_rest_fast, rdata_stream, user_ip_fast,
};
use words::{
    ONES, eight_digits, next_space, parse_i64, short_field, spaces, three_spaces, token_at, word_at,
};

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
    pub(crate) fn decode_salvaging(&self, line: Bytes) -> Result<Option<Command>, Salvaged> {
        // Most lines are rows, and most others positions: go straight to
        // them.
        if is_rdata(&line) {
            return self
                .decode_rdata_salvaging(line)
                .map(|rdata| Some(Command::Rdata(rdata)));
        }
        if line.starts_with(POSITION) {
            self.check_len(&line)?;
            return decode_position(&line)
                .map(|position| Some(Command::Position(position)))
                .map_err(|error| Box::new((error, None)));
        }
        self.decode_other_salvaging(line)
    }

    /// [`Decoder::decode_salvaging`] for a line that starts with neither
    /// `RDATA ` nor `POSITION ` (the caller has looked).
    pub(crate) fn decode_other_salvaging(&self, line: Bytes) -> Result<Option<Command>, Salvaged> {
        self.check_len(&line)?;
        // A line starting with a letter is not blank: skip the scan.
        if !line.first().is_some_and(u8::is_ascii_alphabetic) && is_blank(&line) {
            return Ok(None);
        }
        decode_command(&line)
            .map(Some)
            .map_err(|error| salvage(error, &line))
    }

    /// [`Decoder::decode_salvaging`] for a line that starts with
    /// `POSITION `, unless the line names `own` as its sender: `Ok(None)`
    /// then, as [`Decoder::decode_rdata_unless_from`].
    pub(crate) fn decode_position_unless_from(
        &self,
        line: &Bytes,
        own: &[u8],
    ) -> Result<Option<Position>, Salvaged> {
        let stream = position_stream(line);
        if sent_by(line, POSITION.len(), stream.as_ref(), own) {
            return Ok(None);
        }
        self.check_len(line)?;
        if let Some(position) =
            stream.and_then(|(stream, end)| position_rest_fast(line, stream, end))
        {
            return Ok(Some(position));
        }
        decode_position_general(line)
            .map(Some)
            .map_err(|error| Box::new((error, None)))
    }

    /// [`Decoder::decode_salvaging`] for a line that starts with `RDATA `:
    /// the row itself, not wrapped in a [`Command`] (the receive path hands
    /// it straight to the follower).
    pub(crate) fn decode_rdata_salvaging(&self, line: Bytes) -> Result<Rdata, Salvaged> {
        self.check_len(&line)?;
        decode_rdata(line)
    }

    /// [`Decoder::decode_rdata_salvaging`], unless the line names `own` as
    /// its sender: `Ok(None)` then, and the line is not read further (an
    /// echo of this process's own publish). The sender is the field after
    /// the stream's name, which is the first space after `RDATA `: found
    /// once, by the fast path's reading of the stream where it can, for
    /// both the echo check and the decoding.
    pub(crate) fn decode_rdata_unless_from(
        &self,
        line: Bytes,
        own: &[u8],
    ) -> Result<Option<Rdata>, Salvaged> {
        let stream = rdata_stream(&line);
        if sent_by(&line, RDATA.len(), stream.as_ref(), own) {
            return Ok(None);
        }
        self.check_len(&line)?;
        if let Some(fields) = stream.and_then(|(stream, end)| rdata_rest_fast(&line, stream, end)) {
            return Ok(Some(rdata_of(line, fields)));
        }
        decode_rdata_general(line).map(Some)
    }

    /// Refuses a line over the length limit.
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
pub(crate) fn is_rdata(line: &[u8]) -> bool {
    line.starts_with(RDATA)
}

/// Whether `line`, whose stream's name starts at `start`, names `own` as
/// its sender, as the session's echo check (`own_echo`) reads it: the
/// field after the stream's name (which ends at the first space from
/// `start`: where `stream`, the fast path's reading of it, ends if it
/// read it) starts with `own` and a space.
#[inline(always)]
fn sent_by(line: &[u8], start: usize, stream: Option<&(StreamName, usize)>, own: &[u8]) -> bool {
    let stream_end = match stream {
        Some((_, end)) => Some(*end),
        None => next_space(line, start),
    };
    stream_end.is_some_and(|end| names_at(line, end + 1, own))
}

/// Whether `line` at `at` starts with `own` and a space.
fn names_at(line: &[u8], at: usize, own: &[u8]) -> bool {
    // The space after it first: one byte, which rules out most lines.
    line.get(at.wrapping_add(own.len())) == Some(&b' ')
        && line
            .get(at..)
            .is_some_and(|rest| prefix::starts_with(rest, own))
}

/// A line that did not decode, and what could be read of it if it was an
/// `RDATA` (boxed: the error path must not make every result larger).
pub(crate) type Salvaged = Box<(DecodeError, Option<LostRdata>)>;

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
fn decode_position(line: &Bytes) -> Result<Position, DecodeError> {
    match position_fast(line) {
        Some(position) => Ok(position),
        None => decode_position_general(line),
    }
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

/// Decodes an `RDATA` line. The row keeps the line's reference (the row
/// ends the line), so no reference count is touched.
fn decode_rdata(line: Bytes) -> Result<Rdata, Salvaged> {
    match rdata_fields_fast(&line) {
        Some(fields) => Ok(rdata_of(line, fields)),
        None => decode_rdata_general(line),
    }
}

/// The fields of an `RDATA` line, its row validated, and where the row
/// starts.
pub(super) type RdataFields = (StreamName, InstanceName, RdataToken, usize);

/// The `Rdata` of `line`, from its fields.
#[inline(always)]
fn rdata_of(line: Bytes, (stream, instance, token, row_start): RdataFields) -> Rdata {
    let mut row = line;
    row.advance(row_start);
    Rdata {
        stream,
        instance,
        token,
        row: RawRow::from_validated(row),
    }
}

/// [`decode_rdata`] for the lines [`rdata_fields_fast`] does not read.
fn decode_rdata_general(line: Bytes) -> Result<Rdata, Salvaged> {
    match rdata_fields(&line) {
        Ok(fields) => Ok(rdata_of(line, fields)),
        Err(error) => Err(salvage(error, &line)),
    }
}

/// The fields of an `RDATA` line, read by the general path.
fn rdata_fields(line: &Bytes) -> Result<RdataFields, DecodeError> {
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
