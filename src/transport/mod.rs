//! Layer 6, transports: thin async drivers that move bytes between a
//! session and a socket. The only layer that does I/O.
//!
//! Drivers use `futures::io::{AsyncRead, AsyncWrite}` and a small
//! [`Runtime`] trait (connect, listen, sleep), implemented for smol
//! (`SmolRuntime`, feature `runtime-smol`) and tokio (`TokioRuntime`,
//! feature `runtime-tokio`). They read into one large buffer and hand the
//! session many lines per read, and write the session's lines in batches.
//!
//! Direct TCP ([`TcpServer`], [`TcpClient`]):
//!
//! ```no_run
//! # #[cfg(feature = "runtime-smol")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use synapse_replication::config::StreamWriters;
//! use synapse_replication::positions::{Follower, FollowerEvent};
//! use synapse_replication::session::{TcpClientEvent, TcpClientSession};
//! use synapse_replication::transport::{SmolRuntime, TcpClient};
//! use synapse_replication::wire::InstanceName;
//!
//! let follower = Follower::new(InstanceName::from("worker1"), Arc::new(StreamWriters::default()));
//! let session = TcpClientSession::new("example.com", follower)?;
//! let mut client = TcpClient::new(SmolRuntime, "127.0.0.1:9092", session);
//! smol::block_on(async {
//!     while let Some(event) = client.next_event().await {
//!         match event {
//!             TcpClientEvent::Follower(FollowerEvent::Rows { stream, writer, token, rows, .. }) => {
//!                 println!("{stream} {writer} {token}: {} rows", rows.len())
//!             }
//!             other => println!("{other}"),
//!         }
//!     }
//! });
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "runtime-smol"))]
//! # fn main() {}
//! ```
//!
//! # Catching up
//!
//! Rows a follower missed (it was away, or the server restarted) are
//! fetched out of band, never through the replication connection: that is
//! Synapse's design (its workers fetch over HTTP from the writer, which
//! reads its database), and the direct TCP protocol has no command for it,
//! so any in-band answer would break compatibility with Synapse peers. A
//! [`TcpClient`] given a [`CatchUpSource`] fetches every page the follower
//! asks for and retries failures with backoff; without one, the
//! application answers the follower's
//! [`CatchUp`](crate::positions::FollowerEvent::CatchUp) events itself with
//! [`TcpClient::handle_catch_up`]. Between Rust processes the source is
//! whatever holds the writer's log: the shared database, as in Synapse, or
//! an endpoint the server's application exposes.
//!
//! Against Synapse, `HttpCatchUp` (feature `http-catch-up`) is that
//! source: it asks the writer's `instance_map` address over HTTP, as
//! Synapse's workers do.
//!
//! # Reaching Redis
//!
//! [`RedisConfig`](crate::config::RedisConfig) (in
//! [`config`](crate::config)) says where Redis is and how to reach it,
//! read from a URL (`redis://`, `rediss://`, `unix://`) or from Synapse's
//! `redis:` config section; [`Dial::connect`] opens the byte stream over
//! TCP, a Unix socket, or TLS (feature `tls`, rustls), which never falls
//! back to plaintext. The same dialer opens HTTP catch-up's connections,
//! to an `instance_map` [`Endpoint`](crate::config::Endpoint).
//!
//! # Synapse's database
//!
//! [`postgres`]: the ids of a database-backed stream from Synapse's
//! PostgreSQL (its sequence and `stream_positions`), behind a trait an
//! application can implement on its own pool, and a tokio-postgres client
//! on any runtime's socket (feature `postgres`).

mod client;
#[cfg(any(feature = "http-catch-up", feature = "http-server"))]
mod http;
mod net;
pub mod postgres;
mod redis;
mod runtime;
mod tcp;

pub use async_trait::async_trait;

pub use client::backoff::Backoff;
pub use client::source::CatchUpSource;
pub use client::waits::{PositionWaiter, WaitError, WaitForPosition};
#[cfg(feature = "http-catch-up")]
#[cfg_attr(docsrs, doc(cfg(feature = "http-catch-up")))]
pub use http::call::{CallFailure, CallRetries, ReplicationCallError, ReplicationClient};
#[cfg(feature = "http-catch-up")]
#[cfg_attr(docsrs, doc(cfg(feature = "http-catch-up")))]
pub use http::catch_up::{HttpCatchUp, HttpCatchUpError};
#[cfg(feature = "http-server")]
#[cfg_attr(docsrs, doc(cfg(feature = "http-server")))]
pub use http::server::{
    HttpRequest, HttpResponse, HttpServer, HttpServerConfig, HttpServerCounters, HttpServerTls,
    HttpServerTlsError,
};
pub use net::dial::Dial;
pub use redis::client::{RedisClient, RedisClientConfig};
#[cfg(feature = "runtime-smol")]
#[cfg_attr(docsrs, doc(cfg(feature = "runtime-smol")))]
pub use runtime::smol::SmolRuntime;
pub use runtime::{BoxConnection, BoxFuture, Connection, Listener, Runtime};

pub use client::command_queue::{CommandSendError, CommandSender, Queued};
#[cfg(feature = "runtime-tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "runtime-tokio")))]
pub use runtime::tokio::TokioRuntime;
pub use tcp::client::{TcpClient, TcpClientConfig};
pub use tcp::server::{TcpServer, TcpServerConfig};
