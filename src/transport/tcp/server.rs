//! The async driver of a direct TCP replication server: [`TcpServer`]
//! accepts clients and serves a [`TcpServerSession`].

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use crate::session::{
    ConnectionState, Disconnect, TcpClientId, TcpError, TcpServerEvent, TcpServerSession,
};

use crate::transport::net::socket::{BUDGET, Link, Timer};
use crate::transport::runtime::{BoxFuture, Listener, Runtime, deadline_after};

/// Options of a [`TcpServer`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpServerConfig {
    /// Bytes read from a socket at once (64 KiB).
    pub read_buffer: usize,
    /// After accepting fails (too many open files...), wait this long
    /// before accepting again (100 ms).
    pub accept_pause: Duration,
    /// Connections served at once (1024), those closing included. A
    /// connection accepted beyond it is closed at once, before a byte is
    /// sent, reported as [`TcpServerEvent::Refused`] and counted in
    /// [`TcpServer::refused_connections`]; once a connection ends, the
    /// next is served again. 0 refuses every connection.
    pub max_connections: usize,
}

impl TcpServerConfig {
    /// The default of [`TcpServerConfig::max_connections`].
    pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
}

impl Default for TcpServerConfig {
    fn default() -> Self {
        TcpServerConfig {
            read_buffer: 64 << 10,
            accept_pause: Duration::from_millis(100),
            max_connections: TcpServerConfig::DEFAULT_MAX_CONNECTIONS,
        }
    }
}

struct ServerLink {
    link: Link,
    /// Why the session closes it, once it does.
    error: Option<TcpError>,
}

/// A direct TCP replication server: accepts clients and serves them a
/// [`TcpServerSession`] (the streams its [`Writer`](crate::positions::Writer)
/// writes).
///
/// Nothing happens unless [`next_event`](TcpServer::next_event) is awaited:
/// it accepts, reads, writes and runs the timers, and returns as soon as
/// there is something to report. Write rows between two calls through
/// [`session_mut`](TcpServer::session_mut) (`write`, `advance`, `send`);
/// they are sent during the next call.
///
/// It serves at most [`TcpServerConfig::max_connections`] clients at
/// once (1024 by default); a connection beyond that is closed as soon as
/// it is accepted ([`TcpServerEvent::Refused`]).
///
/// ```no_run
/// # #[cfg(feature = "runtime-smol")]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Instant;
/// use synapse_replication::positions::Writer;
/// use synapse_replication::session::TcpServerSession;
/// use synapse_replication::transport::{SmolRuntime, TcpServer};
/// use synapse_replication::wire::{InstanceName, StreamName, Token};
/// use synapse_replication::config::StreamWriters;
///
/// let mut writer = Writer::new(InstanceName::master(), Arc::new(StreamWriters::default()));
/// writer.advance(&StreamName::Caches, Token(0))?;
/// let session = TcpServerSession::new("example.com", writer, Instant::now())?;
/// smol::block_on(async {
///     let mut server = TcpServer::bind(SmolRuntime, "127.0.0.1:9092", session).await?;
///     loop {
///         let event = server.next_event().await;
///         println!("{event:?}");
///     }
/// })
/// # }
/// # #[cfg(not(feature = "runtime-smol"))]
/// # fn main() {}
/// ```
pub struct TcpServer<R: Runtime> {
    runtime: R,
    listener: Box<dyn Listener>,
    session: TcpServerSession,
    links: BTreeMap<TcpClientId, ServerLink>,
    events: VecDeque<TcpServerEvent>,
    timer: Timer,
    read_buffer: Vec<u8>,
    options: TcpServerConfig,
    accept_pause: Option<BoxFuture<'static, ()>>,
    refused: u64,
}

impl<R: Runtime> fmt::Debug for TcpServer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpServer")
            .field("local_addr", &self.listener.local_addr().ok())
            .field("clients", &self.links.len())
            .field("refused", &self.refused)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

impl<R: Runtime> TcpServer<R> {
    /// Listens on `addr` (`host:port`, port 0 picks one) with the default
    /// options.
    pub async fn bind(
        runtime: R,
        addr: &str,
        session: TcpServerSession,
    ) -> io::Result<TcpServer<R>> {
        TcpServer::bind_with(runtime, addr, session, TcpServerConfig::default()).await
    }

    /// Listens on `addr` with the given options.
    pub async fn bind_with(
        runtime: R,
        addr: &str,
        mut session: TcpServerSession,
        options: TcpServerConfig,
    ) -> io::Result<TcpServer<R>> {
        let listener = runtime.listen(addr).await?;
        session.set_wall_clock(runtime.now(), SystemTime::now());
        Ok(TcpServer {
            runtime,
            listener,
            session,
            links: BTreeMap::new(),
            events: VecDeque::new(),
            timer: Timer::new(),
            read_buffer: Vec::new(),
            options,
            accept_pause: None,
            refused: 0,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The session.
    pub fn session(&self) -> &TcpServerSession {
        &self.session
    }

    /// Connections closed at once because
    /// [`TcpServerConfig::max_connections`] were already served.
    pub fn refused_connections(&self) -> u64 {
        self.refused
    }

    /// The session, to write rows and send commands. Do not `accept` or
    /// disconnect clients through it: the server does.
    pub fn session_mut(&mut self) -> &mut TcpServerSession {
        &mut self.session
    }

    /// Drives every connection until there is something to report. Never
    /// ends: a failing client only ends its own connection.
    pub async fn next_event(&mut self) -> TcpServerEvent {
        poll_fn(|cx| self.poll_next_event(cx)).await
    }

    /// Polls for the next event; see [`next_event`](TcpServer::next_event).
    pub fn poll_next_event(&mut self, cx: &mut Context<'_>) -> Poll<TcpServerEvent> {
        for _ in 0..BUDGET {
            if let Some(event) = self.events.pop_front() {
                return Poll::Ready(event);
            }
            let now = self.runtime.now();
            let mut progress = self.poll_accept(cx, now);
            progress |= self.poll_links(cx, now);
            if let Some(deadline) = self.session.poll_timeout() {
                if self.timer.poll(&self.runtime, deadline, now, cx) {
                    self.session.handle_timeout(now.max(deadline));
                    progress = true;
                }
            }
            self.drain_session();
            if !progress && self.events.is_empty() {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Moves the session's events into the server's queue, in order with
    /// the server's own. `Closing` is kept for the client's
    /// `Disconnected`, which reports its error.
    fn drain_session(&mut self) {
        while let Some(event) = self.session.poll_event() {
            if let TcpServerEvent::Closing { client, error } = event {
                if let Some(link) = self.links.get_mut(&client) {
                    link.error = Some(error);
                }
                continue;
            }
            self.events.push_back(event);
        }
    }

    fn poll_accept(&mut self, cx: &mut Context<'_>, now: Instant) -> bool {
        if let Some(pause) = self.accept_pause.as_mut() {
            if pause.as_mut().poll(cx).is_pending() {
                return false;
            }
            self.accept_pause = None;
        }
        let mut progress = false;
        for _ in 0..BUDGET {
            match self.listener.poll_accept(cx) {
                Poll::Ready(Ok((io, peer))) if self.links.len() >= self.options.max_connections => {
                    // Dropping the socket closes it: nothing was sent.
                    drop(io);
                    self.refused += 1;
                    self.events.push_back(TcpServerEvent::Refused { peer });
                    progress = true;
                }
                Poll::Ready(Ok((io, peer))) => {
                    let client = self.session.accept(now);
                    self.links.insert(
                        client,
                        ServerLink {
                            link: Link::new(io),
                            error: None,
                        },
                    );
                    self.events
                        .push_back(TcpServerEvent::Accepted { client, peer });
                    progress = true;
                }
                Poll::Ready(Err(error)) => {
                    self.events.push_back(TcpServerEvent::AcceptFailed(error));
                    let until = deadline_after(now, self.options.accept_pause);
                    self.accept_pause = Some(self.runtime.sleep_until(until));
                    return true;
                }
                Poll::Pending => return progress,
            }
        }
        cx.waker().wake_by_ref();
        progress
    }

    fn poll_links(&mut self, cx: &mut Context<'_>, now: Instant) -> bool {
        let mut progress = false;
        let mut gone = Vec::new();
        for (&client, server_link) in self.links.iter_mut() {
            let session = &mut self.session;
            let link = &mut server_link.link;
            let state = session.client_state(client);
            if matches!(state, None | Some(ConnectionState::Aborted)) {
                let reason = server_link
                    .error
                    .take()
                    .map_or(Disconnect::Shutdown, Disconnect::Tcp);
                gone.push((client, reason));
                continue;
            }
            let written = match link.poll_write(cx, || session.poll_transmit(client)) {
                Ok(written) => written,
                Err(error) => {
                    gone.push((client, Disconnect::Io(error)));
                    continue;
                }
            };
            progress |= written.progress;
            if state == Some(ConnectionState::Closing) {
                if written.drained {
                    match link.poll_close(cx) {
                        Poll::Ready(_) => {
                            let reason = server_link
                                .error
                                .take()
                                .map_or(Disconnect::Shutdown, Disconnect::Tcp);
                            gone.push((client, reason));
                        }
                        Poll::Pending => {}
                    }
                }
                continue;
            }
            let size = self.options.read_buffer.max(1);
            if self.read_buffer.len() < size {
                self.read_buffer.resize(size, 0);
            }
            match link.poll_read_into(cx, &mut self.read_buffer) {
                Poll::Ready(Ok(0)) => gone.push((client, Disconnect::Closed)),
                Poll::Ready(Ok(n)) => {
                    session.handle_input(
                        client,
                        self.read_buffer.get(..n).unwrap_or_default(),
                        now,
                    );
                    progress = true;
                }
                Poll::Ready(Err(error)) => gone.push((client, Disconnect::Io(error))),
                Poll::Pending => {}
            }
        }
        for (client, reason) in gone {
            self.links.remove(&client);
            self.session.disconnected(client);
            self.events
                .push_back(TcpServerEvent::Disconnected { client, reason });
            progress = true;
        }
        progress
    }
}
