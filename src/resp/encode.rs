//! Frames and commands to bytes.
//!
//! Each writer computes the exact encoded length first and reserves it
//! once, so appending to a [`BytesMut`] reallocates at most once per call.

use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};

use super::error::{RespEncodeError, snippet};
use super::frame::Frame;
use super::value;

impl Frame {
    /// The number of bytes [`Frame::encode`] writes.
    ///
    /// Walks the frame with an explicit stack: no recursion.
    pub fn encoded_len(&self) -> usize {
        let mut total = 0usize;
        let mut stack = Vec::new();
        let mut next = Some(self);
        while let Some(frame) = next {
            total = total.saturating_add(head_len(frame));
            push_children(frame, &mut stack);
            next = stack.pop();
        }
        total
    }

    /// Appends the frame's RESP encoding to `buf`, reserving once.
    ///
    /// Fails, leaving `buf` as it was, for a frame that would not read back
    /// as itself: a simple string or error containing CR or LF, or a double
    /// or big number whose text the decoder refuses. Frames from the
    /// decoder always encode. Walks the frame with an explicit stack: no
    /// recursion. The decoder's [`Limits`](super::Limits) are not checked.
    pub fn encode(&self, buf: &mut BytesMut) -> Result<(), RespEncodeError> {
        let start = buf.len();
        buf.reserve(self.encoded_len());
        let mut stack = Vec::new();
        let mut next = Some(self);
        while let Some(frame) = next {
            if let Err(error) = put_head(buf, frame) {
                buf.truncate(start);
                return Err(error);
            }
            push_children(frame, &mut stack);
            next = stack.pop();
        }
        Ok(())
    }

    /// The frame's RESP encoding, in a buffer of its own.
    pub fn to_bytes(&self) -> Result<Bytes, RespEncodeError> {
        let mut buf = BytesMut::new();
        self.encode(&mut buf)?;
        Ok(buf.freeze())
    }
}

/// Pushes `frame`'s children onto `stack`, last first, so they pop in
/// order.
fn push_children<'a>(frame: &'a Frame, stack: &mut Vec<&'a Frame>) {
    match frame {
        Frame::Array(items) | Frame::Set(items) | Frame::Push(items) => {
            stack.extend(items.iter().rev());
        }
        Frame::Map(pairs) => push_pairs(pairs, stack),
        Frame::Attribute { attributes, data } => {
            stack.push(data);
            push_pairs(attributes, stack);
        }
        _ => {}
    }
}

fn push_pairs<'a>(pairs: &'a [(Frame, Frame)], stack: &mut Vec<&'a Frame>) {
    for (key, value) in pairs.iter().rev() {
        stack.push(value);
        stack.push(key);
    }
}

/// The length of a frame's own bytes, without its children's.
fn head_len(frame: &Frame) -> usize {
    match frame {
        Frame::SimpleString(text)
        | Frame::Error(text)
        | Frame::Double(text)
        | Frame::BigNumber(text) => 1 + text.len() + 2,
        Frame::Integer(value) => 1 + integer_len(*value) + 2,
        Frame::BulkString(bytes) | Frame::BulkError(bytes) => bulk_len(bytes.len()),
        Frame::VerbatimString { text, .. } => bulk_len(text.len().saturating_add(4)),
        Frame::NullBulkString | Frame::NullArray => 5,
        Frame::Null => 3,
        Frame::Boolean(_) => 4,
        Frame::Array(items) | Frame::Set(items) | Frame::Push(items) => header_len(items.len()),
        Frame::Map(pairs)
        | Frame::Attribute {
            attributes: pairs, ..
        } => header_len(pairs.len()),
    }
}

/// Writes a frame's own bytes (an aggregate's header), without its
/// children's.
fn put_head(buf: &mut BytesMut, frame: &Frame) -> Result<(), RespEncodeError> {
    match frame {
        Frame::SimpleString(text) => put_line(buf, b'+', text, "simple string")?,
        Frame::Error(text) => put_line(buf, b'-', text, "simple error")?,
        Frame::Integer(value) => {
            buf.put_u8(b':');
            put_integer(buf, *value);
            buf.put_slice(b"\r\n");
        }
        Frame::BulkString(bytes) => put_bulk(buf, bytes),
        Frame::NullBulkString => buf.put_slice(b"$-1\r\n"),
        Frame::Array(items) => put_header(buf, b'*', items.len()),
        Frame::NullArray => buf.put_slice(b"*-1\r\n"),
        Frame::Null => buf.put_slice(b"_\r\n"),
        Frame::Boolean(value) => buf.put_slice(if *value { b"#t\r\n" } else { b"#f\r\n" }),
        Frame::Double(text) if value::is_double(text) => put_line(buf, b',', text, "double")?,
        Frame::Double(text) => return Err(invalid_value("double", text)),
        Frame::BigNumber(text) if value::is_big_number(text) => {
            put_line(buf, b'(', text, "big number")?;
        }
        Frame::BigNumber(text) => return Err(invalid_value("big number", text)),
        Frame::BulkError(bytes) => {
            put_header(buf, b'!', bytes.len());
            buf.put_slice(bytes);
            buf.put_slice(b"\r\n");
        }
        Frame::VerbatimString { format, text } => {
            put_header(buf, b'=', text.len().saturating_add(4));
            buf.put_slice(format);
            buf.put_u8(b':');
            buf.put_slice(text);
            buf.put_slice(b"\r\n");
        }
        Frame::Map(pairs) => put_header(buf, b'%', pairs.len()),
        Frame::Set(items) => put_header(buf, b'~', items.len()),
        Frame::Attribute { attributes, .. } => put_header(buf, b'|', attributes.len()),
        Frame::Push(items) => put_header(buf, b'>', items.len()),
    }
    Ok(())
}

fn put_line(
    buf: &mut BytesMut,
    kind: u8,
    text: &[u8],
    what: &'static str,
) -> Result<(), RespEncodeError> {
    if text.iter().any(|&b| b == b'\r' || b == b'\n') {
        return Err(RespEncodeError::Newline {
            what,
            input: snippet(text),
        });
    }
    buf.put_u8(kind);
    buf.put_slice(text);
    buf.put_slice(b"\r\n");
    Ok(())
}

fn invalid_value(what: &'static str, text: &[u8]) -> RespEncodeError {
    RespEncodeError::InvalidValue {
        what,
        input: snippet(text),
    }
}

/// Digits in `value`.
fn decimal_len(value: u64) -> usize {
    value.checked_ilog10().map_or(1, |log| log as usize + 1)
}

fn integer_len(value: i64) -> usize {
    usize::from(value < 0) + decimal_len(value.unsigned_abs())
}

/// The length of `X<count>\r\n`.
fn header_len(count: usize) -> usize {
    1 + decimal_len(count as u64) + 2
}

/// The length of a bulk string of `len` bytes, header included.
fn bulk_len(len: usize) -> usize {
    header_len(len).saturating_add(len).saturating_add(2)
}

/// Writes `value` in decimal at the end of `digits`, returning the digits.
fn format_decimal(mut value: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    &digits[at..]
}

fn put_decimal(buf: &mut BytesMut, value: u64) {
    buf.put_slice(format_decimal(value, &mut [0; 20]));
}

fn put_integer(buf: &mut BytesMut, value: i64) {
    if value < 0 {
        buf.put_u8(b'-');
    }
    put_decimal(buf, value.unsigned_abs());
}

fn put_header(buf: &mut BytesMut, kind: u8, count: usize) {
    buf.put_u8(kind);
    put_decimal(buf, count as u64);
    buf.put_slice(b"\r\n");
}

fn put_bulk(buf: &mut BytesMut, bytes: &[u8]) {
    put_header(buf, b'$', bytes.len());
    buf.put_slice(bytes);
    buf.put_slice(b"\r\n");
}

/// The number of bytes [`encode_command`] writes for `args`.
pub fn command_len(args: &[&[u8]]) -> usize {
    args.iter().fold(header_len(args.len()), |total, arg| {
        total.saturating_add(bulk_len(arg.len()))
    })
}

/// Appends a command: an array of bulk strings, the way every Redis client
/// sends commands. Reserves once.
///
/// ```
/// use bytes::BytesMut;
/// use synapse_replication::resp::encode_command;
///
/// let mut buf = BytesMut::new();
/// encode_command(&mut buf, &[b"GET", b"key"]);
/// assert_eq!(&buf[..], b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n");
/// ```
///
/// An empty `args` writes `*0\r\n`, which Redis ignores.
pub fn encode_command(buf: &mut BytesMut, args: &[&[u8]]) {
    encode_args(buf, args, &[]);
}

/// Appends the command made of `head` then `tail`, reserving once.
fn encode_args(buf: &mut BytesMut, head: &[&[u8]], tail: &[&[u8]]) {
    let count = head.len() + tail.len();
    let len = head
        .iter()
        .chain(tail)
        .fold(header_len(count), |total, arg| {
            total.saturating_add(bulk_len(arg.len()))
        });
    buf.reserve(len);
    put_header(buf, b'*', count);
    for arg in head.iter().chain(tail) {
        put_bulk(buf, arg);
    }
}

/// The number of bytes [`encode_publish`] writes.
pub fn publish_len(channel: &[u8], payload: &[u8]) -> usize {
    PUBLISH_HEAD.len() + bulk_len(channel.len()) + bulk_len(payload.len())
}

const PUBLISH_HEAD: &[u8] = b"*3\r\n$7\r\nPUBLISH\r\n";

/// Appends `PUBLISH channel payload`, reserving once: the publisher's hot
/// path. Redis answers with the number of subscribers that received it,
/// an integer.
///
/// ```
/// use bytes::BytesMut;
/// use synapse_replication::resp::encode_publish;
///
/// let mut buf = BytesMut::new();
/// encode_publish(&mut buf, b"example.com", b"PING 1700000000000");
/// assert_eq!(
///     &buf[..],
///     &b"*3\r\n$7\r\nPUBLISH\r\n$11\r\nexample.com\r\n$18\r\nPING 1700000000000\r\n"[..]
/// );
/// ```
pub fn encode_publish(buf: &mut BytesMut, channel: &[u8], payload: &[u8]) {
    buf.reserve(publish_len(channel, payload));
    buf.put_slice(PUBLISH_HEAD);
    put_bulk(buf, channel);
    put_bulk(buf, payload);
}

/// Appends `SUBSCRIBE channel...`. Redis confirms each channel with one
/// `subscribe` reply ([`Incoming::Subscription`](super::Incoming::Subscription)).
/// `channels` must not be empty (Redis answers an error).
pub fn encode_subscribe(buf: &mut BytesMut, channels: &[&[u8]]) {
    encode_args(buf, &[b"SUBSCRIBE"], channels);
}

/// Appends `UNSUBSCRIBE channel...`; no channels unsubscribes from all.
pub fn encode_unsubscribe(buf: &mut BytesMut, channels: &[&[u8]]) {
    encode_args(buf, &[b"UNSUBSCRIBE"], channels);
}

/// Appends `PING`, or `PING message`.
pub fn encode_ping(buf: &mut BytesMut, message: Option<&[u8]>) {
    match message {
        Some(message) => encode_args(buf, &[b"PING", message], &[]),
        None => encode_args(buf, &[b"PING"], &[]),
    }
}

/// Appends `QUIT`. (Deprecated since Redis 7.2, where closing the
/// connection does the same; still answered `+OK`.)
pub fn encode_quit(buf: &mut BytesMut) {
    encode_args(buf, &[b"QUIT"], &[]);
}

/// Appends `SELECT db`. Pub/sub ignores the database number; Synapse sends
/// it anyway when `dbid` is configured.
pub fn encode_select(buf: &mut BytesMut, db: u32) {
    let mut digits = [0; 20];
    encode_args(
        buf,
        &[b"SELECT", format_decimal(u64::from(db), &mut digits)],
        &[],
    );
}

/// Appends `CLIENT SETNAME name`. Redis refuses names with spaces or
/// newlines.
pub fn encode_client_setname(buf: &mut BytesMut, name: &[u8]) {
    encode_args(buf, &[b"CLIENT", b"SETNAME", name], &[]);
}

/// A password, and the ACL user it belongs to.
///
/// Its [`Debug`] output hides the password, so it can be logged.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Credentials<'a> {
    /// The ACL user; none means Redis' `default` user (the `requirepass`
    /// password).
    pub username: Option<&'a [u8]>,
    /// The password.
    pub password: &'a [u8],
}

impl fmt::Debug for Credentials<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field(
                "username",
                &self.username.map(|name| String::from_utf8_lossy(name)),
            )
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Appends `AUTH password`, or `AUTH username password`.
pub fn encode_auth(buf: &mut BytesMut, credentials: &Credentials<'_>) {
    match credentials.username {
        Some(username) => encode_args(buf, &[b"AUTH", username, credentials.password], &[]),
        None => encode_args(buf, &[b"AUTH", credentials.password], &[]),
    }
}

/// A RESP protocol version, as negotiated by HELLO.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// RESP2: the default of every connection. A subscribed connection can
    /// only (un)subscribe and PING.
    Resp2,
    /// RESP3 (Redis 6 and later): pub/sub messages arrive as out-of-band
    /// pushes, so one connection can both subscribe and publish.
    Resp3,
}

/// The arguments of `HELLO`: switch protocol, and optionally authenticate
/// and name the connection in the same round trip (Redis 6 and later).
/// Redis answers a map (RESP3) or array (RESP2) describing the server, or
/// an error (e.g. `NOPROTO`, `WRONGPASS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello<'a> {
    /// The protocol to switch to.
    pub protocol: Protocol,
    /// `AUTH username password`; with no username, `default` is sent, as
    /// HELLO requires one.
    pub auth: Option<Credentials<'a>>,
    /// `SETNAME name`.
    pub client_name: Option<&'a [u8]>,
}

impl<'a> Hello<'a> {
    /// HELLO switching to `protocol`, without AUTH or SETNAME.
    pub const fn new(protocol: Protocol) -> Self {
        Hello {
            protocol,
            auth: None,
            client_name: None,
        }
    }
}

/// Appends `HELLO protover [AUTH username password] [SETNAME name]`.
pub fn encode_hello(buf: &mut BytesMut, hello: &Hello<'_>) {
    let mut args: [&[u8]; 7] = [b""; 7];
    args[0] = b"HELLO";
    args[1] = match hello.protocol {
        Protocol::Resp2 => b"2",
        Protocol::Resp3 => b"3",
    };
    let mut count = 2;
    if let Some(auth) = &hello.auth {
        args[2] = b"AUTH";
        args[3] = auth.username.unwrap_or(b"default");
        args[4] = auth.password;
        count = 5;
    }
    if let Some(name) = hello.client_name {
        args[count] = b"SETNAME";
        args[count + 1] = name;
        count += 2;
    }
    encode_args(buf, args.get(..count).unwrap_or(&args), &[]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(write: impl FnOnce(&mut BytesMut)) -> Vec<u8> {
        let mut buf = BytesMut::new();
        write(&mut buf);
        buf.to_vec()
    }

    #[test]
    fn commands() {
        assert_eq!(
            written(|buf| encode_hello(
                buf,
                &Hello {
                    protocol: Protocol::Resp3,
                    auth: Some(Credentials { username: None, password: b"pw" }),
                    client_name: Some(b"w1"),
                }
            )),
            b"*7\r\n$5\r\nHELLO\r\n$1\r\n3\r\n$4\r\nAUTH\r\n$7\r\ndefault\r\n$2\r\npw\r\n$7\r\nSETNAME\r\n$2\r\nw1\r\n"
        );
        assert_eq!(
            written(|buf| encode_hello(buf, &Hello::new(Protocol::Resp2))),
            b"*2\r\n$5\r\nHELLO\r\n$1\r\n2\r\n"
        );
        assert_eq!(
            written(|buf| encode_auth(
                buf,
                &Credentials {
                    username: Some(b"u"),
                    password: b"p"
                }
            )),
            b"*3\r\n$4\r\nAUTH\r\n$1\r\nu\r\n$1\r\np\r\n"
        );
        assert_eq!(
            written(|buf| encode_auth(
                buf,
                &Credentials {
                    username: None,
                    password: b"p"
                }
            )),
            b"*2\r\n$4\r\nAUTH\r\n$1\r\np\r\n"
        );
        assert_eq!(
            written(|buf| encode_select(buf, 4_000_000_000)),
            b"*2\r\n$6\r\nSELECT\r\n$10\r\n4000000000\r\n"
        );
        assert_eq!(
            written(|buf| encode_client_setname(buf, b"w1")),
            b"*3\r\n$6\r\nCLIENT\r\n$7\r\nSETNAME\r\n$2\r\nw1\r\n"
        );
        assert_eq!(
            written(|buf| encode_subscribe(buf, &[b"a", b"a/USER_IP"])),
            b"*3\r\n$9\r\nSUBSCRIBE\r\n$1\r\na\r\n$9\r\na/USER_IP\r\n"
        );
        assert_eq!(
            written(|buf| encode_unsubscribe(buf, &[])),
            b"*1\r\n$11\r\nUNSUBSCRIBE\r\n"
        );
        assert_eq!(
            written(|buf| encode_ping(buf, None)),
            b"*1\r\n$4\r\nPING\r\n"
        );
        assert_eq!(
            written(|buf| encode_ping(buf, Some(b"hi"))),
            b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n"
        );
        assert_eq!(written(encode_quit), b"*1\r\n$4\r\nQUIT\r\n");
    }

    #[test]
    fn lengths_are_exact() {
        let args: [&[u8]; 3] = [b"PUBLISH", b"chan", &[b'x'; 1234]];
        let mut buf = BytesMut::new();
        encode_command(&mut buf, &args);
        assert_eq!(buf.len(), command_len(&args));
        let mut publish = BytesMut::new();
        encode_publish(&mut publish, args[1], args[2]);
        assert_eq!(publish, buf);
        assert_eq!(publish.len(), publish_len(args[1], args[2]));
        for value in [0, 9, 10, -1, -10, i64::MIN, i64::MAX] {
            assert_eq!(
                Frame::Integer(value).encoded_len(),
                format!(":{value}\r\n").len()
            );
        }
    }

    #[test]
    fn credentials_debug_hides_the_password() {
        let text = format!(
            "{:?}",
            Credentials {
                username: Some(b"u"),
                password: b"hunter2"
            }
        );
        assert!(!text.contains("hunter2"), "{text}");
    }

    #[test]
    fn unencodable_frames_leave_the_buffer_alone() {
        let mut buf = BytesMut::from(&b"keep"[..]);
        let frame = Frame::Array(vec![
            Frame::Integer(1),
            Frame::SimpleString("a\r\nb".into()),
        ]);
        assert!(matches!(
            frame.encode(&mut buf),
            Err(RespEncodeError::Newline { .. })
        ));
        assert_eq!(&buf[..], b"keep");
        assert!(Frame::Double("1.5x".into()).to_bytes().is_err());
        assert!(Frame::BigNumber("".into()).to_bytes().is_err());
        assert_eq!(
            Frame::double(f64::INFINITY).to_bytes().unwrap(),
            &b",inf\r\n"[..]
        );
        assert_eq!(Frame::double(0.1).to_bytes().unwrap(), &b",0.1\r\n"[..]);
    }
}
