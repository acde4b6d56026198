//! Layer 1, the wire: one line of bytes <-> one [`Command`].
//!
//! Pure functions, no state. Lines are given and returned without their
//! `\n`; over Redis a line is one pub/sub message, over direct TCP the
//! session splits the byte stream on `\n`.
//!
//! What this layer does with inputs Synapse never writes:
//! - Tokens must match `-?[0-9]+` and fit in 64 signed bits. Python's `int()`
//!   also takes `+5`, ` 5`, `1_000` and integers of any size; those lines
//!   are refused here with [`DecodeError::InvalidToken`].
//! - Stream and instance names must be non-empty.
//! - Row JSON is validated, not parsed, without recursion (any depth passes;
//!   parsing a row later refuses nesting beyond 128 levels). Numbers beyond `f64` range (Python reads `1e400` as infinity)
//!   pass, and fail only when the row is parsed. Lone surrogate escapes (`"\ud800"`) are accepted at this layer, as
//!   Python accepts them: the row is carried as is, and only a typed decode
//!   of that string fails (an error for that one row, never for the
//!   connection). In `USER_IP` and `LOCK_RELEASED`, whose JSON is parsed at
//!   decode, a lone surrogate reads as U+FFFD (and is written back as
//!   `\ufffd`): the command is kept, one character is not.
//! - `RDATA` rows are forwarded byte for byte; [`RawRow::canonical`] gives
//!   Synapse's spelling of a row that arrived in another spelling.
//! - `USER_IP` and `LOCK_RELEASED` fields must have the types Synapse
//!   writes (strings, an integer `last_seen`), where Python only checks the
//!   array length.

mod command;
mod decode;
mod encode;
mod error;
pub mod json;
mod names;
pub(crate) mod prefix;
mod row;
mod token;

pub use command::{
    Command, CommandKind, FederationAck, LockReleased, Position, Rdata, Side, UserIp, UserSync,
};
pub(crate) use decode::is_rdata;
pub use decode::{Decoder, LostRdata, is_blank};
pub(crate) use error::snippet;
pub use error::{DecodeError, EncodeError};
pub use json::JsonError;
pub use names::{InstanceName, StreamName};
pub use row::RawRow;
pub use token::{RdataToken, Token};
