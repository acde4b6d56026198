//! Synapse's worker replication protocol, for Rust.
//!
//! Synapse, the Matrix homeserver, scales out into processes that tell each
//! other what changed through replication streams, carried over Redis
//! pub/sub or direct TCP. This crate lets a Rust process take part: follow
//! the streams (positions, batches, gaps, catch-up), write the streams the
//! process owns, and exchange the other replication commands, byte for
//! byte as Synapse does.
//!
//! This crate does no network I/O in its core: bytes and time go in;
//! events, bytes to send and deadlines come out. Here a writer (a direct
//! TCP server session) and a follower (a client session) pass their bytes
//! to each other in memory, and the follower sees the writer's rows:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Instant;
//! use synapse_replication::config::StreamWriters;
//! use synapse_replication::positions::{Follower, FollowerEvent, Writer};
//! use synapse_replication::session::{TcpClientEvent, TcpClientSession, TcpServerSession};
//! use synapse_replication::wire::{InstanceName, RawRow, StreamName, Token};
//!
//! let now = Instant::now();
//! let registry = Arc::new(StreamWriters::default()); // master writes everything
//!
//! // master writes `typing`...
//! let mut writer = Writer::new(InstanceName::master(), registry.clone());
//! writer.advance(&StreamName::Typing, Token(0))?;
//! let mut server = TcpServerSession::new("example.com", writer, now)?;
//!
//! // ...and worker1 follows it.
//! let follower = Follower::new(InstanceName::from("worker1"), registry);
//! let mut client = TcpClientSession::new("example.com", follower)?;
//!
//! // A connection: bytes from each side go to the other until both are quiet.
//! let id = server.accept(now);
//! client.connect(now);
//! let mut pass_bytes = |server: &mut TcpServerSession, client: &mut TcpClientSession| loop {
//!     let mut moved = false;
//!     while let Some(bytes) = client.poll_transmit() {
//!         server.handle_input(id, &bytes, now);
//!         moved = true;
//!     }
//!     while let Some(bytes) = server.poll_transmit(id) {
//!         client.handle_input(&bytes, now);
//!         moved = true;
//!     }
//!     if !moved {
//!         break;
//!     }
//! };
//! pass_bytes(&mut server, &mut client);
//!
//! let row = RawRow::new(&br#"["!room:example.com",["@alice:example.com"]]"#[..])?;
//! server.write(&StreamName::Typing, Token(1), [(Token(1), row.clone())])?;
//! pass_bytes(&mut server, &mut client);
//!
//! let mut seen = Vec::new();
//! while let Some(event) = client.poll_event() {
//!     if let TcpClientEvent::Follower(FollowerEvent::Rows { stream, token, rows, .. }) = event {
//!         seen.push((stream, token, rows.into_vec()));
//!     }
//! }
//! assert_eq!(seen, [(StreamName::Typing, Token(1), vec![row])]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Joining a real deployment takes the async drivers of [`transport`]:
//! [`transport::RedisClient::follow`] reads what it needs from Synapse's
//! configuration ([`config::SynapseConfig`]) and hands over one event at
//! a time (see the README for a whole program).
//!
//! The layers, bottom up:
//!
//! - [`wire`]: one line <-> one [`wire::Command`];
//! - [`streams`]: the typed row of each stream, decoded on demand;
//! - [`positions`] and [`writers`]: the [`positions::Follower`] and
//!   [`positions::Writer`] state machines, and who may write which stream;
//! - [`session`]: sans-IO connection state machines, over Redis
//!   ([`session::RedisSession`]) and direct TCP (client and server);
//! - [`resp`]: the Redis wire codec;
//! - [`transport`]: thin async drivers over `futures::io`, the only layer
//!   that does I/O, with smol and tokio glue behind features.
//!
//! Beside the layers, [`config`]: everything read from Synapse's
//! configuration (server name, `redis:` and Sentinel, `stream_writers` and
//! `instance_map`, the replication secret, TLS settings) and where to
//! connect, sans-IO and the same in every build, with one error type,
//! [`config::ConfigError`], that names the key a user got wrong. Every
//! layer may use it; it uses none of them but the wire's names.
//!
//! # Call order of the sans-IO sessions
//!
//! After every input (`handle_input`, `handle_timeout`, a `send` or a
//! write), drain `poll_transmit` and send the bytes, then drain
//! `poll_event` and act on each event in order, then read `poll_timeout`
//! and call `handle_timeout` when it passes. Time must never go backwards.
//!
//! # Panic policy
//!
//! No input from a peer makes this crate panic: bad input gives a typed
//! error. A panic is a bug; please report it.

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod config;
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
