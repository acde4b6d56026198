//! RESP2 and RESP3 values, and the pub/sub view of them.

use bytes::Bytes;

/// One RESP2 or RESP3 value.
///
/// Decoded strings are [`Bytes`] views of the buffer they were read from:
/// no payload is copied, and a frame keeps that buffer's allocation alive
/// until it is dropped (copy out with [`Bytes::copy_from_slice`] to keep a
/// small piece for long).
///
/// RESP2 has two nulls, the null bulk string `$-1` and the null array
/// `*-1`; RESP3 has one, `_`. They stay distinct here so that a frame
/// encodes back to the bytes it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// `+`: a line of text, e.g. `OK`.
    SimpleString(Bytes),
    /// `-`: an error line, e.g. `ERR unknown command`.
    Error(Bytes),
    /// `:`: a signed 64-bit integer.
    Integer(i64),
    /// `$`: binary-safe bytes.
    BulkString(Bytes),
    /// `$-1`: RESP2's null bulk string.
    NullBulkString,
    /// `*`: an ordered list of frames.
    Array(Vec<Frame>),
    /// `*-1`: RESP2's null array.
    NullArray,
    /// `_`: RESP3's null.
    Null,
    /// `#`: RESP3's boolean (`#t`, `#f`).
    Boolean(bool),
    /// `,`: RESP3's double, as the text the server sent (e.g. `3.14`, `inf`,
    /// `nan`), so that it encodes back byte for byte; [`Frame::as_f64`]
    /// parses it, [`Frame::double`] builds one.
    Double(Bytes),
    /// `(`: RESP3's big number, as its decimal text.
    BigNumber(Bytes),
    /// `!`: RESP3's binary-safe error.
    BulkError(Bytes),
    /// `=`: RESP3's verbatim string, e.g. `txt:` followed by the text.
    VerbatimString {
        /// The three-byte format, e.g. `txt` or `mkd`.
        format: [u8; 3],
        /// The text after the `xxx:` prefix.
        text: Bytes,
    },
    /// `%`: RESP3's map, as key-value pairs in the order received.
    Map(Vec<(Frame, Frame)>),
    /// `~`: RESP3's set, as elements in the order received.
    Set(Vec<Frame>),
    /// `|`: RESP3's attribute: auxiliary key-value pairs about the value
    /// that follows them, kept together with that value. Inside an
    /// aggregate, an attribute and its value count as one element.
    Attribute {
        /// The attribute's pairs.
        attributes: Vec<(Frame, Frame)>,
        /// The value the attributes describe.
        data: Box<Frame>,
    },
    /// `>`: RESP3's out-of-band push, e.g. a pub/sub message.
    Push(Vec<Frame>),
}

impl Frame {
    /// A bulk string.
    pub fn bulk(bytes: impl Into<Bytes>) -> Frame {
        Frame::BulkString(bytes.into())
    }

    /// A double, written as Redis writes them: `inf`, `-inf`, `nan`, or the
    /// shortest text that parses back to `value`.
    pub fn double(value: f64) -> Frame {
        let text = if value.is_nan() {
            "nan".to_owned()
        } else if value.is_infinite() {
            if value > 0.0 { "inf" } else { "-inf" }.to_owned()
        } else {
            format!("{value:?}")
        };
        Frame::Double(Bytes::from(text))
    }

    /// The bytes of a simple string, bulk string or verbatim string (its
    /// text, without the format).
    pub fn as_bytes(&self) -> Option<&Bytes> {
        match self {
            Frame::SimpleString(bytes)
            | Frame::BulkString(bytes)
            | Frame::VerbatimString { text: bytes, .. } => Some(bytes),
            _ => None,
        }
    }

    /// The message of a simple error or bulk error, e.g.
    /// `NOPERM this user has no permissions ...`.
    pub fn as_error(&self) -> Option<&Bytes> {
        match self {
            Frame::Error(bytes) | Frame::BulkError(bytes) => Some(bytes),
            _ => None,
        }
    }

    /// The value of an integer.
    pub fn as_integer(&self) -> Option<i64> {
        match self {
            Frame::Integer(value) => Some(*value),
            _ => None,
        }
    }

    /// The value of a double.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Frame::Double(text) => std::str::from_utf8(text).ok()?.parse().ok(),
            _ => None,
        }
    }

    /// The elements of an array, set or push.
    pub fn elements(&self) -> Option<&[Frame]> {
        match self {
            Frame::Array(items) | Frame::Set(items) | Frame::Push(items) => Some(items),
            _ => None,
        }
    }

    /// Whether this is one of the nulls (`_`, `$-1`, `*-1`).
    pub fn is_null(&self) -> bool {
        matches!(self, Frame::Null | Frame::NullBulkString | Frame::NullArray)
    }
}

/// A pub/sub message: something a client PUBLISHed on a channel this
/// connection subscribed to (`message`), or on a channel matching one of
/// its patterns (`pmessage`).
///
/// Redis sends it as an array (RESP2) or a push (RESP3) of bulk strings;
/// both read as this.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The pattern that matched, for a `pmessage`.
    pub pattern: Option<Bytes>,
    /// The channel it was published on.
    pub channel: Bytes,
    /// What was published: for Synapse, one replication command line.
    pub payload: Bytes,
}

/// What a subscription confirmation confirms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SubscriptionKind {
    /// `subscribe`.
    Subscribe,
    /// `unsubscribe`.
    Unsubscribe,
    /// `psubscribe`.
    PSubscribe,
    /// `punsubscribe`.
    PUnsubscribe,
    /// `ssubscribe` (sharded).
    SSubscribe,
    /// `sunsubscribe` (sharded).
    SUnsubscribe,
}

impl SubscriptionKind {
    fn from_name(name: &[u8]) -> Option<SubscriptionKind> {
        Some(match name {
            b"subscribe" => SubscriptionKind::Subscribe,
            b"unsubscribe" => SubscriptionKind::Unsubscribe,
            b"psubscribe" => SubscriptionKind::PSubscribe,
            b"punsubscribe" => SubscriptionKind::PUnsubscribe,
            b"ssubscribe" => SubscriptionKind::SSubscribe,
            b"sunsubscribe" => SubscriptionKind::SUnsubscribe,
            _ => return None,
        })
    }
}

/// A frame as a subscriber sees it: a message, a subscription
/// confirmation, a keep-alive answer, or any other reply.
///
/// [`RespDecoder::decode_pubsub`](super::RespDecoder::decode_pubsub) returns these;
/// [`Incoming::from_frame`] classifies a frame the same way.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Incoming {
    /// A published message.
    Message(Message),
    /// Redis confirms a SUBSCRIBE, UNSUBSCRIBE (one per channel) or one of
    /// their pattern and sharded forms.
    Subscription {
        /// What was confirmed.
        kind: SubscriptionKind,
        /// The channel or pattern; none when an UNSUBSCRIBE without
        /// arguments found nothing to unsubscribe from.
        channel: Option<Bytes>,
        /// How many subscriptions the connection has now.
        count: i64,
    },
    /// The answer to a PING: `+PONG`, or in RESP2 subscribe mode the array
    /// `pong` plus the PING's message (empty when PING had none). (Outside
    /// subscribe mode, `PING message` answers a plain bulk string, which
    /// arrives as [`Incoming::Frame`].)
    Pong(Bytes),
    /// Anything else: replies to other commands, errors, other pushes.
    Frame(Frame),
}

impl Incoming {
    /// Classifies a frame as
    /// [`RespDecoder::decode_pubsub`](super::RespDecoder::decode_pubsub) does.
    ///
    /// An array or push is a message, subscription confirmation or pong only
    /// when its shape is exactly Redis's: the lowercase name as a bulk
    /// string, then bulk strings (and the count, an integer, of a
    /// confirmation). Anything else comes back unchanged as
    /// [`Incoming::Frame`].
    pub fn from_frame(frame: Frame) -> Incoming {
        let (items, push) = match frame {
            Frame::SimpleString(text) if text.as_ref() == b"PONG" => {
                return Incoming::Pong(Bytes::new());
            }
            Frame::Array(items) => (items, false),
            Frame::Push(items) => (items, true),
            other => return Incoming::Frame(other),
        };
        let other = |items: Vec<Frame>| {
            Incoming::Frame(if push {
                Frame::Push(items)
            } else {
                Frame::Array(items)
            })
        };
        let Some(Frame::BulkString(name)) = items.first() else {
            return other(items);
        };
        match (name.as_ref(), items.len()) {
            (b"message", 3) => match <[Frame; 3]>::try_from(items) {
                Ok([_, Frame::BulkString(channel), Frame::BulkString(payload)]) => {
                    Incoming::Message(Message {
                        pattern: None,
                        channel,
                        payload,
                    })
                }
                Ok(items) => other(items.into()),
                Err(items) => other(items),
            },
            (b"pmessage", 4) => match <[Frame; 4]>::try_from(items) {
                Ok(
                    [
                        _,
                        Frame::BulkString(pattern),
                        Frame::BulkString(channel),
                        Frame::BulkString(payload),
                    ],
                ) => Incoming::Message(Message {
                    pattern: Some(pattern),
                    channel,
                    payload,
                }),
                Ok(items) => other(items.into()),
                Err(items) => other(items),
            },
            (b"pong", 2) => match <[Frame; 2]>::try_from(items) {
                Ok([_, Frame::BulkString(message)]) => Incoming::Pong(message),
                Ok(items) => other(items.into()),
                Err(items) => other(items),
            },
            (name, 3) => {
                let Some(kind) = SubscriptionKind::from_name(name) else {
                    return other(items);
                };
                match <[Frame; 3]>::try_from(items) {
                    Ok([_, Frame::BulkString(channel), Frame::Integer(count)]) => {
                        Incoming::Subscription {
                            kind,
                            channel: Some(channel),
                            count,
                        }
                    }
                    Ok(
                        [
                            _,
                            Frame::NullBulkString | Frame::Null,
                            Frame::Integer(count),
                        ],
                    ) => Incoming::Subscription {
                        kind,
                        channel: None,
                        count,
                    },
                    Ok(items) => other(items.into()),
                    Err(items) => other(items),
                }
            }
            _ => other(items),
        }
    }
}
