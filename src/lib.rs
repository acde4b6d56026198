//! Synapse's worker replication protocol, for Rust.
//!
//! Synapse, the Matrix homeserver, scales out into processes that tell each
//! other what changed through replication streams, carried over Redis
//! pub/sub or direct TCP. This crate lets a Rust process take part: decode
//! and encode every replication command byte for byte as Synapse 1.163.2
//! does, decode each stream's rows, follow streams (positions, batches,
//! gaps, catch-up) and write the streams the process owns.
//!
//! This crate does no network I/O in its core: bytes and time go in;
//! commands, events and bytes to send come out. The layers, bottom up:
//!
//! - [`wire`]: one line <-> one [`wire::Command`];
//! - [`streams`]: the typed row of each stream, decoded on demand;
//! - [`positions`] and [`writers`]: the [`positions::Follower`] and
//!   [`positions::Writer`] state machines, and who may write which stream;
//! - [`session`]: sans-IO connection state machines (direct TCP);
//! - [`resp`]: the Redis wire codec;
//! - [`transport`]: thin async drivers over `futures::io`, the only layer
//!   that does I/O, with smol and tokio glue behind features.
//!
//! ```
//! use bytes::Bytes;
//! use synapse_replication::wire::{Command, Position, StreamName, Token};
//!
//! let line = Bytes::from_static(b"POSITION events master 41 42");
//! let Some(Command::Position(position)) = Command::decode(line.clone())? else {
//!     unreachable!("a POSITION line decodes to a POSITION")
//! };
//! assert_eq!(position.stream, StreamName::Events);
//! assert_eq!(position.new_token, Token(42));
//! assert_eq!(Command::Position(position).to_bytes()?, line);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Panic policy
//!
//! No input from a peer makes this crate panic: bad input gives a typed
//! error. A panic is a bug; please report it.

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod positions;
pub mod resp;
pub mod session;
pub mod streams;
pub mod transport;
pub mod wire;
pub mod writers;

pub use bytestring::ByteString;

/// The README's code, compiled and run as doc tests so that it cannot drift.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
