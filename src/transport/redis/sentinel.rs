//! The async side of Redis Sentinel: [`MasterSearch`] drives a
//! [`SentinelDiscovery`] round over real connections, and
//! [`SentinelWatcher`] keeps a [`SentinelWatch`] subscribed to one of the
//! sentinels, moving to the next when it fails. The protocol is in
//! [`session::sentinel`](crate::session::sentinel); this is only I/O.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::io::{AsyncRead, AsyncWrite};

use crate::session::sentinel::{
    DiscoveryError, DiscoveryStep, MasterAddr, SentinelDiscovery, SentinelError, SentinelEvent,
    SentinelTarget, SentinelWatch, WatchEvent,
};

use crate::config::{Endpoint, RedisConfig};
use crate::transport::client::backoff::Backoff;
use crate::transport::net::dial;
use crate::transport::runtime::{BoxConnection, BoxFuture, Runtime, deadline_after};

/// The master a [`MasterSearch`] found, and the connection that checked
/// its role.
pub(crate) struct FoundMaster {
    pub(crate) connection: BoxConnection,
    pub(crate) master: MasterAddr,
    /// The sentinel's index in the configuration.
    pub(crate) sentinel: usize,
    pub(crate) rejected: Vec<(usize, SentinelError)>,
}

/// One connection's bytes, for a question and its answer.
struct Wire {
    io: BoxConnection,
    unsent: Bytes,
    buf: Vec<u8>,
}

enum Read {
    Data(usize),
    Closed,
    Pending,
}

impl Wire {
    fn new(io: BoxConnection) -> Wire {
        Wire {
            io,
            unsent: Bytes::new(),
            buf: vec![0; 4096],
        }
    }

    /// Writes what `next` gives until it is empty or the socket is full.
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        mut next: impl FnMut() -> Option<Bytes>,
    ) -> io::Result<()> {
        loop {
            if self.unsent.is_empty() {
                match next() {
                    Some(bytes) => self.unsent = bytes,
                    None => break,
                }
            }
            match Pin::new(&mut self.io).poll_write(cx, &self.unsent) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => bytes::Buf::advance(&mut self.unsent, n),
                Poll::Ready(Err(error)) => return Err(error),
                Poll::Pending => return Ok(()),
            }
        }
        match Pin::new(&mut self.io).poll_flush(cx) {
            Poll::Ready(Err(error)) => Err(error),
            _ => Ok(()),
        }
    }

    fn poll_read(&mut self, cx: &mut Context<'_>) -> io::Result<Read> {
        match Pin::new(&mut self.io).poll_read(cx, &mut self.buf) {
            Poll::Ready(Ok(0)) => Ok(Read::Closed),
            Poll::Ready(Ok(n)) => Ok(Read::Data(n)),
            Poll::Ready(Err(error)) => Err(error),
            Poll::Pending => Ok(Read::Pending),
        }
    }

    fn data(&self, n: usize) -> &[u8] {
        self.buf.get(..n).unwrap_or_default()
    }
}

enum SearchState {
    Idle,
    Connecting(BoxFuture<'static, io::Result<BoxConnection>>),
    Talking(Wire),
}

/// One discovery round over real connections: each step's connection has
/// [`RedisConfig::connect_timeout`] to open and answer.
pub(crate) struct MasterSearch {
    config: RedisConfig,
    round: SentinelDiscovery,
    state: SearchState,
    deadline: Option<BoxFuture<'static, ()>>,
}

impl MasterSearch {
    /// A round for `config` (which must have sentinels), from sentinel
    /// `first`.
    pub(crate) fn new(config: &RedisConfig, first: usize) -> Option<MasterSearch> {
        let sentinel = config.sentinel_config()?;
        let round = SentinelDiscovery::new(
            sentinel.service_name(),
            sentinel.sentinels().len(),
            first,
            sentinel.auth().cloned(),
            config.auth().cloned(),
        )
        .with_allowed_masters(sentinel.allowed_masters().clone());
        Some(MasterSearch {
            config: config.clone(),
            round,
            state: SearchState::Idle,
            deadline: None,
        })
    }

    /// Drives the round; ready with the master, or with an error of kind
    /// `NotFound` wrapping the [`DiscoveryError`].
    pub(crate) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        runtime: &dyn Runtime,
    ) -> Poll<io::Result<FoundMaster>> {
        loop {
            if let Some(step) = self.round.poll_step() {
                match step {
                    DiscoveryStep::Connect(target) => self.open(runtime, &target),
                    DiscoveryStep::Found { master, sentinel } => {
                        let SearchState::Talking(wire) =
                            std::mem::replace(&mut self.state, SearchState::Idle)
                        else {
                            return Poll::Ready(Err(io::Error::other(
                                "lost the checked connection",
                            )));
                        };
                        self.deadline = None;
                        return Poll::Ready(Ok(FoundMaster {
                            connection: wire.io,
                            master,
                            sentinel,
                            rejected: self.round.failures().to_vec(),
                        }));
                    }
                    DiscoveryStep::Failed(error) => {
                        self.state = SearchState::Idle;
                        self.deadline = None;
                        return Poll::Ready(Err(discovery_error(error)));
                    }
                }
                continue;
            }
            if let Some(deadline) = &mut self.deadline {
                if deadline.as_mut().poll(cx).is_ready() {
                    self.state = SearchState::Idle;
                    self.deadline = None;
                    self.round.timed_out();
                    continue;
                }
            }
            match &mut self.state {
                SearchState::Idle => return Poll::Pending,
                SearchState::Connecting(connect) => match connect.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(io)) => {
                        self.state = SearchState::Talking(Wire::new(io));
                        self.round.connected();
                    }
                    Poll::Ready(Err(error)) => {
                        self.state = SearchState::Idle;
                        self.round.connect_failed(error);
                    }
                },
                SearchState::Talking(wire) => {
                    let round = &mut self.round;
                    if let Err(error) = wire.poll_write(cx, || round.poll_transmit()) {
                        self.state = SearchState::Idle;
                        self.round.connect_failed(error);
                        continue;
                    }
                    match wire.poll_read(cx) {
                        Ok(Read::Data(n)) => self.round.handle_input(wire.data(n)),
                        Ok(Read::Pending) => return Poll::Pending,
                        Ok(Read::Closed) => {
                            self.state = SearchState::Idle;
                            self.round.connect_failed("closed by the peer");
                        }
                        Err(error) => {
                            self.state = SearchState::Idle;
                            self.round.connect_failed(error);
                        }
                    }
                }
            }
        }
    }

    fn open(&mut self, runtime: &dyn Runtime, target: &SentinelTarget) {
        let timeout = self.config.connect_timeout();
        let connect = match target {
            SentinelTarget::Sentinel(index) => {
                match self
                    .config
                    .sentinel_config()
                    .and_then(|s| s.sentinel(*index))
                {
                    Some(endpoint) => {
                        dial::connect(runtime, endpoint, self.config.sentinel_tls(), None)
                    }
                    None => {
                        let error = io::Error::other("no such sentinel");
                        Box::pin(async move { Err(error) })
                    }
                }
            }
            SentinelTarget::Master(master) => {
                let endpoint = Endpoint::Tcp {
                    host: master.host.clone(),
                    port: master.port,
                };
                dial::connect(runtime, &endpoint, self.config.dial_tls(), None)
            }
        };
        self.state = SearchState::Connecting(connect);
        self.deadline = Some(runtime.sleep_until(deadline_after(runtime.now(), timeout)));
    }
}

fn discovery_error(error: DiscoveryError) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, error)
}

enum WatchState {
    Start,
    Connecting {
        connect: BoxFuture<'static, io::Result<BoxConnection>>,
        timeout: BoxFuture<'static, ()>,
    },
    Watching(Box<Watching>),
    Waiting(BoxFuture<'static, ()>),
}

struct Watching {
    wire: Wire,
    watch: SentinelWatch,
    since: Instant,
    timer: Option<(Instant, BoxFuture<'static, ()>)>,
}

/// Keeps a subscription to `+switch-master` on one sentinel after the
/// other.
pub(crate) struct SentinelWatcher {
    config: RedisConfig,
    index: usize,
    state: WatchState,
    backoff: Backoff,
    stable_after: Duration,
    /// When a switch was last reported.
    last_switch: Option<Instant>,
    /// Switches heard since, not yet reported (the first `from`, the
    /// last `to`), and the end of the holdoff.
    held: Option<(MasterAddr, MasterAddr, BoxFuture<'static, ()>)>,
}

impl SentinelWatcher {
    pub(crate) fn new(
        config: &RedisConfig,
        backoff: Backoff,
        stable_after: Duration,
    ) -> Option<SentinelWatcher> {
        config.sentinel_config()?;
        Some(SentinelWatcher {
            config: config.clone(),
            index: 0,
            state: WatchState::Start,
            backoff,
            stable_after,
            last_switch: None,
            held: None,
        })
    }

    /// A switch heard: reported now, or held until the holdoff since
    /// the last one reported is up.
    fn switch(
        &mut self,
        runtime: &dyn Runtime,
        from: MasterAddr,
        to: MasterAddr,
        now: Instant,
    ) -> Option<SentinelEvent> {
        let until = self
            .last_switch
            .map(|at| at + SentinelEvent::SWITCH_HOLDOFF)
            .filter(|until| now < *until);
        let Some(until) = until else {
            self.last_switch = Some(now);
            return Some(SentinelEvent::Switched { from, to });
        };
        tracing::debug!(%from, %to, "Redis sentinel: switch held back (switch storm)");
        self.held = Some(match self.held.take() {
            Some((first, _, timer)) => (first, to, timer),
            None => (from, to, runtime.sleep_until(until)),
        });
        None
    }

    /// Starts with this sentinel next time (the one that answered).
    pub(crate) fn prefer(&mut self, index: usize) {
        if matches!(self.state, WatchState::Start | WatchState::Waiting(_)) {
            self.index = index;
        }
    }

    fn endpoint(&self) -> Endpoint {
        self.config
            .sentinel_config()
            .and_then(|s| s.sentinel(self.index))
            .cloned()
            .unwrap_or_else(|| self.config.endpoint().clone())
    }

    fn lose(&mut self, runtime: &dyn Runtime, error: SentinelError, now: Instant) -> SentinelEvent {
        if let WatchState::Watching(watching) = &self.state {
            if now.saturating_duration_since(watching.since) >= self.stable_after {
                self.backoff.reset();
            }
        }
        let sentinel = self.endpoint();
        let count = self
            .config
            .sentinel_config()
            .map_or(1, |s| s.sentinels().len().max(1));
        self.index = (self.index + 1) % count;
        let retry_in = self.backoff.next_delay();
        self.state = WatchState::Waiting(runtime.sleep_until(deadline_after(now, retry_in)));
        SentinelEvent::WatchLost {
            sentinel,
            error,
            retry_in,
        }
    }

    /// Drives the watch; ready with what it heard.
    pub(crate) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        runtime: &dyn Runtime,
        now: Instant,
    ) -> Poll<SentinelEvent> {
        loop {
            if let Some((_, _, timer)) = &mut self.held {
                if timer.as_mut().poll(cx).is_ready() {
                    if let Some((from, to, _)) = self.held.take() {
                        self.last_switch = Some(now);
                        return Poll::Ready(SentinelEvent::Switched { from, to });
                    }
                }
            }
            match &mut self.state {
                WatchState::Start => {
                    let endpoint = self.endpoint();
                    let connect =
                        dial::connect(runtime, &endpoint, self.config.sentinel_tls(), None);
                    let timeout =
                        runtime.sleep_until(deadline_after(now, self.config.connect_timeout()));
                    self.state = WatchState::Connecting { connect, timeout };
                }
                WatchState::Waiting(sleep) => {
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    self.state = WatchState::Start;
                }
                WatchState::Connecting { connect, timeout } => {
                    let result = match connect.as_mut().poll(cx) {
                        Poll::Ready(result) => result,
                        Poll::Pending => match timeout.as_mut().poll(cx) {
                            Poll::Ready(()) => {
                                return Poll::Ready(self.lose(
                                    runtime,
                                    SentinelError::Timeout,
                                    now,
                                ));
                            }
                            Poll::Pending => return Poll::Pending,
                        },
                    };
                    match result {
                        Ok(io) => {
                            let auth = self.config.sentinel_config().and_then(|s| s.auth());
                            let service = self
                                .config
                                .sentinel_config()
                                .map(|s| s.service_name().to_owned())
                                .unwrap_or_default();
                            let allowed = self
                                .config
                                .sentinel_config()
                                .map(|s| s.allowed_masters().clone())
                                .unwrap_or_default();
                            let mut watch =
                                SentinelWatch::new(service, auth).with_allowed_masters(allowed);
                            watch.connected(now);
                            self.state = WatchState::Watching(Box::new(Watching {
                                wire: Wire::new(io),
                                watch,
                                since: now,
                                timer: None,
                            }));
                        }
                        Err(error) => {
                            let error = SentinelError::Unreachable(error.to_string());
                            return Poll::Ready(self.lose(runtime, error, now));
                        }
                    }
                }
                WatchState::Watching(watching) => {
                    let Watching {
                        wire, watch, timer, ..
                    } = &mut **watching;
                    if let Some(event) = watch.poll_event() {
                        match event {
                            WatchEvent::Watching => {
                                return Poll::Ready(SentinelEvent::Watching {
                                    sentinel: self.endpoint(),
                                });
                            }
                            WatchEvent::Switched { from, to } => {
                                match self.switch(runtime, from, to, now) {
                                    Some(event) => return Poll::Ready(event),
                                    None => continue,
                                }
                            }
                            WatchEvent::Failed(error) => {
                                return Poll::Ready(self.lose(runtime, error, now));
                            }
                        }
                    }
                    if let Err(error) = wire.poll_write(cx, || watch.poll_transmit()) {
                        let error = SentinelError::Unreachable(error.to_string());
                        return Poll::Ready(self.lose(runtime, error, now));
                    }
                    match wire.poll_read(cx) {
                        Ok(Read::Data(n)) => {
                            watch.handle_input(wire.data(n), now);
                            continue;
                        }
                        Ok(Read::Pending) => {}
                        Ok(Read::Closed) => {
                            let error = SentinelError::Unreachable("closed by the sentinel".into());
                            return Poll::Ready(self.lose(runtime, error, now));
                        }
                        Err(error) => {
                            let error = SentinelError::Unreachable(error.to_string());
                            return Poll::Ready(self.lose(runtime, error, now));
                        }
                    }
                    let Some(deadline) = watch.poll_timeout() else {
                        return Poll::Pending;
                    };
                    if deadline <= now {
                        watch.handle_timeout(now);
                        continue;
                    }
                    if timer.as_ref().is_none_or(|(armed, _)| *armed != deadline) {
                        *timer = Some((deadline, runtime.sleep_until(deadline)));
                    }
                    if let Some((_, sleep)) = timer {
                        if sleep.as_mut().poll(cx).is_ready() {
                            *timer = None;
                            watch.handle_timeout(deadline);
                            continue;
                        }
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}
