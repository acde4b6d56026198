//! Layer 4, RESP: the Redis wire codec (RESP2 and RESP3), sans-IO.
//!
//! What this module does not do: open sockets, read clocks, or know which
//! reply answers which command. It turns bytes from Redis into [`Frame`]s
//! (or, for a subscriber, [`Incoming`] messages) and the commands pub/sub
//! needs into bytes. The Redis session builds on it.
//!
//! A subscriber decodes pub/sub messages as they arrive, in reads of any
//! size; channel and payload are views of the read buffer, not copies:
//!
//! ```
//! use bytes::BytesMut;
//! use synapse_replication::resp::{RespDecoder, Incoming};
//! use synapse_replication::wire::Command;
//!
//! let wire: &[u8] = b"*3\r\n$7\r\nmessage\r\n$11\r\nexample.com\r\n\
//!                     $28\r\nPOSITION events master 41 42\r\n";
//! let (first_read, second_read) = wire.split_at(30);
//!
//! let mut decoder = RespDecoder::new();
//! let mut buf = BytesMut::new();
//! buf.extend_from_slice(first_read);
//! assert_eq!(decoder.decode_pubsub(&mut buf)?, None, "not all there yet");
//! buf.extend_from_slice(second_read);
//! let Some(Incoming::Message(message)) = decoder.decode_pubsub(&mut buf)? else {
//!     panic!("a message")
//! };
//! assert_eq!(&message.channel[..], b"example.com");
//! assert!(matches!(Command::decode(message.payload)?, Some(Command::Position(_))));
//! assert!(buf.is_empty());
//! assert_eq!(decoder.decode_pubsub(&mut buf)?, None);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A publisher appends commands to one buffer and writes it out, without
//! waiting for each reply (pipelining); Redis answers in order:
//!
//! ```
//! use bytes::BytesMut;
//! use synapse_replication::resp::{Credentials, Hello, Protocol, encode_hello, encode_publish};
//!
//! let mut out = BytesMut::new();
//! encode_hello(&mut out, &Hello {
//!     protocol: Protocol::Resp3,
//!     auth: Some(Credentials { username: None, password: b"secret" }),
//!     client_name: Some(b"synapse-replication"),
//! });
//! for line in [&b"REPLICATE "[..], b"POSITION events master 41 42"] {
//!     encode_publish(&mut out, b"example.com", line);
//! }
//! // write `out` to the socket; decode the HELLO map, then one integer per PUBLISH.
//! ```
//!
//! # Choices
//!
//! - Decoding is incremental and never recursive: a scan pass with an
//!   explicit stack finds the end of a frame, saving its progress between
//!   reads, then a build pass makes the [`Frame`] from the frozen bytes.
//!   The framing is hand-written (it is the hot path, and it must stop at
//!   each byte the input runs out); the scalar lines (integers, doubles,
//!   big numbers) are parsed with nom.
//! - Every [`Limits`] cap is checked when the header that declares a size
//!   is read, before anything is buffered or allocated for it.
//! - RESP3 attributes (`|`) wrap the value they describe
//!   ([`Frame::Attribute`]); RESP3 streamed strings and aggregates (`$?`,
//!   `*?`), which Redis never sends, are refused.
//! - Both protocols are accepted on any connection, whatever HELLO said.

mod decode;
mod encode;
mod error;
mod frame;
mod value;

pub use decode::{Channels, Limits, RespDecoder};
pub use encode::{
    Credentials, Hello, Protocol, command_len, encode_auth, encode_client_setname, encode_command,
    encode_hello, encode_ping, encode_publish, encode_quit, encode_select, encode_subscribe,
    encode_unsubscribe, publish_len,
};
pub use error::{RespEncodeError, RespError};
pub use frame::{Frame, Incoming, Message, SubscriptionKind};
