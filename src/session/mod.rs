//! Layer 5, sessions: sans-IO state machines that combine the wire codec
//! and the replication core with a transport's connection rules.
//!
//! Over Redis, [`RedisSession`] is one process's pair of connections
//! (subscriber and publisher, or one RESP3 connection). Over direct TCP,
//! [`TcpClientSession`] is a worker following a server's streams and
//! [`TcpServerSession`] a process serving the streams it writes to many
//! clients. They take bytes and the current time in and give back events,
//! bytes to write and the next deadline; they open no socket, read no
//! clock and spawn no task. The async drivers in `transport` move their
//! bytes over real sockets.
//!
//! Every session takes input the same way: `handle_input(<which
//! connection>, &bytes, now)` (a [`TcpClientSession`] has one connection, so
//! it takes no first argument), and `handle_timeout(now)`. After each,
//! drain `poll_transmit`, then `poll_event`, then read `poll_timeout`.
//!
//! Two sessions can talk through memory, which is how this crate tests
//! them:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Instant;
//! use synapse_replication::positions::{Follower, FollowerEvent, Writer};
//! use synapse_replication::session::{TcpClientEvent, TcpClientId, TcpClientSession, TcpServerSession};
//! use synapse_replication::wire::{InstanceName, RawRow, StreamName, Token};
//! use synapse_replication::config::StreamWriters;
//!
//! let registry = Arc::new(StreamWriters::default());
//! let now = Instant::now();
//!
//! // The main process serves the `typing` stream, which it writes...
//! let mut writer = Writer::new(InstanceName::master(), registry.clone());
//! writer.advance(&StreamName::Typing, Token(0))?;
//! let mut server = TcpServerSession::new("example.com", writer, now)?;
//!
//! // ...and a worker connects to follow it.
//! let follower = Follower::new(InstanceName::from("worker1"), registry);
//! let mut client = TcpClientSession::new("example.com", follower)?;
//! let id = server.accept(now);
//! client.connect(now);
//!
//! // The wire: bytes one way and the other until both are quiet.
//! fn pump(server: &mut TcpServerSession, id: TcpClientId, client: &mut TcpClientSession, now: Instant) {
//!     loop {
//!         let mut moved = false;
//!         while let Some(bytes) = client.poll_transmit() {
//!             server.handle_input(id, &bytes, now);
//!             moved = true;
//!         }
//!         while let Some(bytes) = server.poll_transmit(id) {
//!             client.handle_input(&bytes, now);
//!             moved = true;
//!         }
//!         if !moved {
//!             break;
//!         }
//!     }
//! }
//! pump(&mut server, id, &mut client, now);
//! assert!(client.is_ready(), "SERVER, PING / NAME, PING, REPLICATE / POSITION");
//!
//! // The server writes a row; the worker's follower hands it over.
//! let row = RawRow::new(&br#"["!room:example.com",["@alice:example.com"]]"#[..])?;
//! server.write(&StreamName::Typing, Token(1), [(Token(1), row.clone())])?;
//! pump(&mut server, id, &mut client, now);
//!
//! let mut delivered = Vec::new();
//! while let Some(event) = client.poll_event() {
//!     if let TcpClientEvent::Follower(FollowerEvent::Rows { stream, token, rows, .. }) = event {
//!         delivered.push((stream, token, rows.into_vec()));
//!     }
//! }
//! assert_eq!(delivered, vec![(StreamName::Typing, Token(1), vec![row])]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Which Synapse speaks direct TCP
//!
//! Synapse's main process served this protocol on a listener of type
//! `replication`, and workers connected to it (`worker_replication_host`,
//! `worker_replication_port`), from 2017 until Synapse 1.66. Redis
//! replication replaced it: direct TCP was deprecated in 1.18.0 and removed
//! from worker deployments in 1.67.0 (as announced in the 1.66.0 release
//! notes). Synapse 1.67 and later, including 1.163.2 against which this
//! crate is checked, refuse a `replication` listener at startup
//! (`synapse/config/server.py`: "Using direct TCP replication for workers is
//! no longer supported") and have no connector for it; but the protocol
//! classes (`synapse/replication/tcp/protocol.py`) are still there and
//! Synapse's own test suite still runs replication over them. This crate's
//! tests run its sessions against those classes of Synapse 1.163.2. Against
//! a live Synapse, only releases before 1.67 speak it, and older ones wrote
//! some commands with fewer fields (a `POSITION` with one token, `RDATA`
//! without an instance name before the multi-writer work of 2020); those
//! were not checked. The transport remains the simplest way for Rust
//! processes to replicate to each other without a broker.

mod error;
mod lines;
mod redis;
pub mod sentinel;
mod tcp;

pub use error::{Disconnect, SendError};

pub use redis::{
    CommandCounts, RedisCounters, RedisError, RedisErrorReply, RedisEvent, RedisLink, RedisSession,
    RedisSessionConfig, RedisStats,
};

pub use tcp::{
    ConnectionState, TcpClientEvent, TcpClientId, TcpClientSession, TcpError, TcpServerEvent,
    TcpServerSession, TcpSessionConfig,
};
