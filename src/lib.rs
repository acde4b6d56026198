//! Synapse's worker replication protocol, for Rust.
//!
//! Synapse, the Matrix homeserver, scales out into processes that tell each
//! other what changed through replication streams, carried over Redis
//! pub/sub (or, historically, direct TCP). This crate lets a Rust process
//! take part: follow the streams (positions, batches, gaps, catch-up),
//! write the streams the process owns and serve their catch-up, and
//! exchange the other replication commands, byte for byte as Synapse does.
//!
//! # Following a deployment over Redis
//!
//! Every Synapse process subscribes to the deployment's channel (its
//! server name) and hears every other process's rows as pub/sub messages.
//! The core does no network I/O: bytes and time go in; events, bytes to
//! send and deadlines come out. Here a [`session::RedisSession`] is given,
//! by hand, what Redis would send it: the subscription's confirmation,
//! then a `caches` row `master` published.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Instant;
//! use synapse_replication::config::StreamWriters;
//! use synapse_replication::positions::{CatchUpPage, Follower, FollowerEvent, Writer};
//! use synapse_replication::session::{RedisEvent, RedisLink, RedisSession, RedisSessionConfig};
//! use synapse_replication::wire::{InstanceName, RawRow, StreamName, Token};
//!
//! let now = Instant::now();
//! let writers = Arc::new(StreamWriters::default().with_redis(true));
//! let me = InstanceName::from("worker1");
//! let follower = Follower::new(me.clone(), writers.clone());
//! let config = RedisSessionConfig::new("example.com");
//! let mut session = RedisSession::new(config, follower, Writer::new(me, writers));
//! // Where this process stopped last time (say, from its database).
//! session.follower_mut().set_position(&StreamName::Caches, &InstanceName::master(), Token(6))?;
//!
//! // A driver connects both links; the session names them and subscribes
//! // (`CLIENT SETNAME`, `SUBSCRIBE example.com`): bytes for the sockets.
//! for link in RedisLink::BOTH {
//!     session.connect(link, now);
//!     while let Some(bytes) = session.poll_transmit(link) {
//!         assert!(!bytes.is_empty());
//!     }
//! }
//! session.handle_input(RedisLink::Publisher, b"+OK\r\n", now);
//!
//! // Redis confirms the subscription; then come what `master` published:
//! // its answer to this session's `REPLICATE`, and a row.
//! let row = r#"["get_user_by_id",["@alice:example.com"],1700000000000]"#;
//! let message = |line: &str| {
//!     format!("*3\r\n$7\r\nmessage\r\n$11\r\nexample.com\r\n${}\r\n{line}\r\n", line.len())
//! };
//! let input = format!(
//!     "+OK\r\n*3\r\n$9\r\nsubscribe\r\n$11\r\nexample.com\r\n:1\r\n{}{}",
//!     message("POSITION caches master 6 6"),
//!     message(&format!("RDATA caches master 7 {row}")),
//! );
//! session.handle_input(RedisLink::Subscriber, input.as_bytes(), now);
//!
//! // Any process may publish in master's name, and what master published
//! // while this one was away is lost: master's first row on a new
//! // connection is checked with master by a catch-up, which a driver
//! // fetches from master's replication endpoint. Here it is answered by
//! // hand; later rows are taken as they come.
//! let mut seen = Vec::new();
//! while let Some(event) = session.poll_event() {
//!     println!("{event}");
//!     match event {
//!         RedisEvent::Follower(FollowerEvent::CatchUp(request)) => {
//!             let updates = vec![(Token(7), RawRow::new(row)?)];
//!             let page = CatchUpPage { updates, upto: request.to, limited: false };
//!             session.handle_catch_up(request.id, page)?;
//!         }
//!         RedisEvent::Follower(FollowerEvent::Rows { stream, writer, token, rows, .. }) => {
//!             seen.push((stream, writer, token, rows.len()));
//!         }
//!         _ => {}
//!     }
//! }
//! assert_eq!(seen, [(StreamName::Caches, InstanceName::master(), Token(7), 1)]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Over real sockets the same session is driven by a
//! [`transport::RedisClient`], which reads what it needs from Synapse's
//! configuration ([`config::SynapseConfig`]), connects, reconnects and
//! fetches what was missed, and hands over one event at a time (the
//! README has the whole program, in twenty lines).
//!
//! # Which type do I need
//!
//! | to | take | and |
//! |---|---|---|
//! | follow a deployment | [`transport::RedisClient::follow`] | match its [`session::RedisEvent`]s; the follower's are in [`session::RedisEvent::Follower`] ([`positions::FollowerEvent`]) |
//! | read a row | [`streams::Row::decode`] | rows stay raw ([`wire::RawRow`]) until asked |
//! | write a stream | [`transport::RedisClient::write`] (or a [`transport::CommandSender`] from other tasks) | [`transport::RedisClient::advance`] once first |
//! | serve catch-up to Synapse's processes | [`transport::RedisClient::with_history`] and `HttpServer` (feature `http-server`) | one [`positions::History`] for both |
//! | answer Synapse's replication calls (`fed_send_edu`, ...) | `HttpServer::with_endpoint` (feature `http-server`) | an endpoint is an [`http::ReplicationEndpoint`]; the checks, the txn-id cache and the waits are the server's |
//! | call another process's endpoint | `ReplicationClient` (feature `http-catch-up`) | it waits for the callee's positions before it returns |
//! | fetch what was missed | `HttpCatchUp` (feature `http-catch-up`; `follow` takes it by itself) | or any [`transport::CatchUpSource`] |
//! | read Synapse's configuration | [`config::SynapseConfig`] | `redis:`, Sentinel, `stream_writers`, `instance_map`, the secret, `database:` ([`config::DatabaseConfig`]) |
//! | keep the ids of a database-backed stream | [`positions::StreamIds`] | Synapse's `MultiWriterIdGenerator`, sans-IO: the caller reads the sequence |
//! | run your own event loop | [`session::RedisSession`] (or [`session::TcpClientSession`], [`session::TcpServerSession`]) | the call order below |
//! | replicate between Rust processes without Redis | [`transport::TcpServer`] and [`transport::TcpClient`] | Synapse's direct TCP protocol |
//!
//! The layers, bottom up, each importing only those below it:
//!
//! - [`wire`]: one line <-> one [`wire::Command`];
//! - [`streams`]: the typed row of each stream, decoded on demand;
//! - [`positions`] and [`writers`]: the [`positions::Follower`] and
//!   [`positions::Writer`] state machines, and who may write which stream;
//! - [`http`]: Synapse's replication HTTP API, sans-IO: the catch-up
//!   endpoint and the calls between processes, their paths, bodies and
//!   checks, and the answers kept per txn id;
//! - [`resp`]: the Redis wire codec;
//! - [`session`]: sans-IO connection state machines, over Redis
//!   ([`session::RedisSession`]) and direct TCP (client and server);
//! - [`transport`]: thin async drivers over `futures::io`, the only layer
//!   that does I/O, with smol and tokio glue behind features.
//!
//! Beside them, [`config`]: Synapse's configuration, sans-IO, which every
//! layer may read.
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
pub mod http;
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
