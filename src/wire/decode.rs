//! One line of bytes to one [`Command`].

use bytes::Bytes;
use bytestring::ByteString;
use nom::bytes::complete::{tag, take_till};
use nom::{IResult, Parser};

use super::command::{
    Command, CommandKind, FederationAck, LockReleased, Position, Rdata, UserIp, UserSync,
};
use super::error::{DecodeError, snippet};
use super::json::{self, JsonError};
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
    /// Synapse ignores. Fields of the command are slices of `line`: nothing
    /// is copied.
    pub fn decode(&self, line: Bytes) -> Result<Option<Command>, DecodeError> {
        if line.len() > self.max_line_len {
            return Err(DecodeError::LineTooLong {
                len: line.len(),
                max: self.max_line_len,
            });
        }
        // A line starting with a letter is not blank: skip the scan.
        if !line.first().is_some_and(u8::is_ascii_alphabetic) && is_blank(&line) {
            return Ok(None);
        }
        decode_command(&line).map(Some)
    }
}

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

fn field(input: &[u8]) -> IResult<&[u8], &[u8]> {
    take_till(|b| b == b' ')(input)
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
    let mut input = rest;
    for index in 0..N - 1 {
        let parsed: IResult<&[u8], (&[u8], &[u8])> = (field, tag(" ")).parse(input);
        let Ok((remaining, (value, _))) = parsed else {
            return Err(DecodeError::MissingField {
                command,
                field: names[index + 1],
            });
        };
        parts[index] = value;
        input = remaining;
    }
    parts[N - 1] = input;
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
    line: &Bytes,
    command: CommandKind,
    field: &'static str,
    value: &[u8],
) -> Result<InstanceName, DecodeError> {
    if value.is_empty() {
        return Err(DecodeError::InvalidField {
            command,
            field,
            expected: "a non-empty name",
            input: String::new(),
        });
    }
    InstanceName::from_line(line, value).ok_or_else(|| DecodeError::InvalidField {
        command,
        field,
        expected: "UTF-8 text",
        input: snippet(value),
    })
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
    if let Some(known) = StreamName::known_bytes(value) {
        return Ok(known);
    }
    Ok(StreamName::Other(name(
        line,
        command,
        "stream name",
        value,
    )?))
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

fn json_field<T: serde::de::DeserializeOwned>(
    command: CommandKind,
    field: &'static str,
    value: &[u8],
) -> Result<T, DecodeError> {
    json::from_slice_lossy(value).map_err(|source| DecodeError::InvalidJson {
        command,
        field,
        source,
        input: snippet(value),
    })
}

fn decode_command(line: &Bytes) -> Result<Command, DecodeError> {
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
    if kind == CommandKind::Rdata {
        // The hot path checks for newlines as it goes.
        return decode_rdata(line, rest).map(Command::Rdata);
    }
    if rest.contains(&b'\n') {
        return Err(DecodeError::Newline);
    }
    let simple = |field| text(line, kind, field, rest);
    Ok(match kind {
        CommandKind::Rdata => Command::Rdata(decode_rdata(line, rest)?),
        CommandKind::Position => {
            let [stream, instance, prev, new] = split(
                kind,
                ["stream name", "instance name", "prev_token", "new_token"],
                rest,
            )?;
            Command::Position(Position {
                stream: stream_name(line, kind, stream)?,
                instance: instance_name(line, kind, "instance name", instance)?,
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
                instance_id: instance_name(line, kind, "instance id", instance)?,
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
                instance: instance_name(line, kind, "instance name", instance)?,
                token: token(kind, "token", ack)?,
            })
        }
        CommandKind::UserIp => {
            let [user, data] = split(kind, ["user id", "JSON data"], rest)?;
            let (access_token, ip, user_agent, device_id, last_seen): (
                String,
                String,
                String,
                Option<String>,
                i64,
            ) = json_field(kind, "JSON data", data)?;
            Command::UserIp(UserIp {
                user_id: name(line, kind, "user id", user)?,
                access_token: access_token.into(),
                ip: ip.into(),
                user_agent: user_agent.into(),
                device_id: device_id.map(ByteString::from),
                last_seen,
            })
        }
        CommandKind::LockReleased => {
            let (instance, lock_name, lock_key): (String, String, String) =
                json_field(kind, "JSON data", rest)?;
            Command::LockReleased(LockReleased {
                instance: InstanceName::from(instance),
                lock_name: lock_name.into(),
                lock_key: lock_key.into(),
            })
        }
    })
}

/// The next space-separated field of an RDATA line and what follows it.
fn rdata_field<'a>(
    rest: &'a [u8],
    next: &'static str,
) -> Result<(&'a [u8], &'a [u8]), DecodeError> {
    match rest.iter().position(|b| *b == b' ' || *b == b'\n') {
        Some(end) if rest[end] == b' ' => Ok((&rest[..end], &rest[end + 1..])),
        Some(_) => Err(DecodeError::Newline),
        None => Err(DecodeError::MissingField {
            command: CommandKind::Rdata,
            field: next,
        }),
    }
}

fn decode_rdata(line: &Bytes, rest: &[u8]) -> Result<Rdata, DecodeError> {
    let kind = CommandKind::Rdata;
    let (stream, rest) = rdata_field(rest, "instance name")?;
    let (instance, rest) = rdata_field(rest, "token")?;
    let (rdata_token, row) = rdata_field(rest, "row")?;
    let token = match rdata_token {
        b"batch" => RdataToken::Batch,
        _ => RdataToken::At(token(kind, "token", rdata_token)?),
    };
    json::validate_row(row).map_err(|source: JsonError| match source {
        JsonError::Newline => DecodeError::Newline,
        source => DecodeError::InvalidJson {
            command: kind,
            field: "row",
            source,
            input: snippet(row),
        },
    })?;
    Ok(Rdata {
        stream: stream_name(line, kind, stream)?,
        instance: instance_name(line, kind, "instance name", instance)?,
        token,
        row: RawRow::from_validated(line.slice_ref(row)),
    })
}
