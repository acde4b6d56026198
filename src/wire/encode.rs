//! One [`Command`] to one line of bytes.

use bytes::{BufMut, BytesMut};

use super::command::{Command, CommandKind};
use super::error::{EncodeError, snippet};
use super::json;

impl Command {
    /// Appends the command to `out` as one line, without the `\n`, exactly
    /// as Synapse writes it: the name, a space, then the arguments (so an
    /// empty `REPLICATE` is written `REPLICATE ` with a trailing space).
    ///
    /// Fails, writing nothing, if a field would not read back as the same
    /// value: a newline anywhere, or a space inside a space-separated field.
    pub fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        let start = out.len();
        let result = self.encode_unchecked(out);
        if result.is_err() {
            out.truncate(start);
        }
        result
    }

    fn encode_unchecked(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        let kind = self.kind();
        out.put_slice(kind.as_str().as_bytes());
        out.put_u8(b' ');
        match self {
            Command::Server(data)
            | Command::Error(data)
            | Command::Ping(data)
            | Command::Name(data)
            | Command::RemoteServerUp(data)
            | Command::NewActiveTask(data)
            | Command::CancelTask(data) => put_text(out, kind, "data", data)?,
            Command::Replicate => {}
            Command::ClearUserSync(instance) => {
                put_text(out, kind, "instance id", instance.as_str())?
            }
            Command::Rdata(rdata) => {
                out.reserve(rdata.row.as_bytes().len() + 48);
                put_field(out, kind, "stream name", rdata.stream.as_str())?;
                out.put_u8(b' ');
                put_field(out, kind, "instance name", rdata.instance.as_str())?;
                out.put_u8(b' ');
                put_display(out, rdata.token);
                out.put_u8(b' ');
                // A RawRow is valid single-line JSON by construction.
                out.put_slice(rdata.row.as_bytes());
            }
            Command::Position(position) => {
                put_field(out, kind, "stream name", position.stream.as_str())?;
                out.put_u8(b' ');
                put_field(out, kind, "instance name", position.instance.as_str())?;
                out.put_u8(b' ');
                put_display(out, position.prev_token);
                out.put_u8(b' ');
                put_display(out, position.new_token);
            }
            Command::UserSync(sync) => {
                put_field(out, kind, "instance id", sync.instance_id.as_str())?;
                out.put_u8(b' ');
                put_field(out, kind, "user id", &sync.user_id)?;
                out.put_u8(b' ');
                match &sync.device_id {
                    Some(device) if &**device == "None" => {
                        return Err(EncodeError::AmbiguousDeviceId);
                    }
                    Some(device) => put_field(out, kind, "device id", device)?,
                    None => out.put_slice(b"None"),
                }
                out.put_u8(b' ');
                out.put_slice(if sync.is_syncing { b"start" } else { b"end" });
                out.put_u8(b' ');
                put_display(out, sync.last_sync_ms);
            }
            Command::FederationAck(ack) => {
                put_field(out, kind, "instance name", ack.instance.as_str())?;
                out.put_u8(b' ');
                put_display(out, ack.token);
            }
            Command::UserIp(ip) => {
                put_field(out, kind, "user id", &ip.user_id)?;
                out.put_u8(b' ');
                let data = (
                    &*ip.access_token,
                    &*ip.ip,
                    &*ip.user_agent,
                    ip.device_id.as_deref(),
                    ip.last_seen,
                );
                put_json(out, kind, &data)?;
            }
            Command::LockReleased(lock) => {
                let data = [lock.instance.as_str(), &lock.lock_name, &lock.lock_key];
                put_json(out, kind, &data)?;
            }
        }
        Ok(())
    }
}

/// Free text that ends the line: anything but a newline.
fn put_text(
    out: &mut BytesMut,
    command: CommandKind,
    field: &'static str,
    value: &str,
) -> Result<(), EncodeError> {
    if value.contains('\n') {
        return Err(EncodeError::Newline { command, field });
    }
    out.put_slice(value.as_bytes());
    Ok(())
}

/// A space-separated field: non-empty, no space, no newline.
fn put_field(
    out: &mut BytesMut,
    command: CommandKind,
    field: &'static str,
    value: &str,
) -> Result<(), EncodeError> {
    if value.is_empty() || value.contains(' ') {
        return Err(EncodeError::InvalidField {
            command,
            field,
            input: snippet(value.as_bytes()),
        });
    }
    put_text(out, command, field, value)
}

fn put_display(out: &mut BytesMut, value: impl std::fmt::Display) {
    use std::fmt::Write;
    // Writing to a BytesMut cannot fail.
    let _ = write!(WriteBytes(out), "{value}");
}

fn put_json<T: serde::Serialize>(
    out: &mut BytesMut,
    command: CommandKind,
    value: &T,
) -> Result<(), EncodeError> {
    json::to_writer(out.writer(), value).map_err(|source| EncodeError::Json {
        command,
        field: "JSON data",
        source,
    })
}

struct WriteBytes<'a>(&'a mut BytesMut);

impl std::fmt::Write for WriteBytes<'_> {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        self.0.put_slice(text.as_bytes());
        Ok(())
    }
}
