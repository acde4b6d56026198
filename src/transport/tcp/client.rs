//! The async driver of a direct TCP replication client: [`TcpClient`]
//! connects a [`TcpClientSession`], reconnecting forever.

use std::collections::VecDeque;
use std::fmt;
use std::future::poll_fn;
use std::io;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use crate::positions::{
    CatchUpError, CatchUpId, CatchUpPage, Follower, FollowerEvent, SeedError, StuckCatchUp,
};
use crate::session::{
    ConnectionState, Disconnect, SendError, TcpClientEvent, TcpClientSession, TcpError,
};
use crate::wire::{Command, CommandKind, InstanceName, Side, StreamName, Token};

use crate::transport::client::backoff::Backoff;
use crate::transport::client::catch_ups::CatchUps;
use crate::transport::client::command_queue::{CommandQueue, CommandSender, Queued};
use crate::transport::client::source::CatchUpSource;
use crate::transport::client::waits::{PositionWaiter, WaitForPosition, Waits};
use crate::transport::net::socket::{BUDGET, Link, Timer};
use crate::transport::runtime::{BoxConnection, BoxFuture, Runtime, deadline_after};

/// Options of a [`TcpClient`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpClientConfig {
    /// The first reconnection delay (100 ms); it doubles after each failed
    /// attempt, with jitter (see [`Backoff`]).
    pub initial_backoff: Duration,
    /// The longest reconnection delay (5 s).
    pub max_backoff: Duration,
    /// A connection that was ready for this long resets the delay (5 s),
    /// so that a server that accepts and then drops clients at once is not
    /// hammered.
    pub stable_after: Duration,
    /// Give up a connection attempt after this long (30 s, as Synapse).
    pub connect_timeout: Duration,
    /// The first delay before asking a failed catch-up again (500 ms,
    /// doubling to `max_backoff`).
    pub catch_up_backoff: Duration,
    /// Bytes read from the socket at once (64 KiB).
    pub read_buffer: usize,
    /// Commands the client's [`CommandSender`]s may queue between two
    /// turns of [`next_event`](TcpClient::next_event) (4096, see
    /// [`CommandSender::DEFAULT_CAPACITY`]). Beyond it
    /// [`CommandSender::send`] refuses with [`CommandSendError::Full`](crate::transport::CommandSendError::Full),
    /// counted in [`TcpClient::refused_commands`]. 0 refuses every command.
    pub command_queue: usize,
    /// Waits for a position the client holds at once
    /// ([`TcpClient::wait_for_position`]; 10 000,
    /// [`PositionWaits::DEFAULT_LIMIT`](crate::positions::PositionWaits::DEFAULT_LIMIT)).
    /// Beyond it a wait fails with
    /// [`WaitError::TooManyWaiters`](crate::transport::WaitError::TooManyWaiters).
    pub max_waiters: usize,
}

impl Default for TcpClientConfig {
    fn default() -> Self {
        TcpClientConfig {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            stable_after: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(30),
            catch_up_backoff: Duration::from_millis(500),
            read_buffer: 64 << 10,
            command_queue: CommandSender::DEFAULT_CAPACITY,
            max_waiters: crate::positions::PositionWaits::DEFAULT_LIMIT,
        }
    }
}

struct Live {
    link: Link,
    ready_at: Option<Instant>,
    /// Why the session closes it, once it does.
    error: Option<TcpError>,
}

enum ClientState {
    Start,
    Connecting {
        connect: BoxFuture<'static, io::Result<BoxConnection>>,
        timeout: BoxFuture<'static, ()>,
    },
    Connected(Box<Live>),
    Waiting(BoxFuture<'static, ()>),
    Shutdown,
}

/// A direct TCP replication client: connects a [`TcpClientSession`] to a
/// server and reconnects forever, with backoff.
///
/// Nothing happens unless [`next_event`](TcpClient::next_event) is awaited:
/// it connects, reads, writes, runs the timers and the catch-ups, and
/// returns as soon as there is something to report. Apply the follower's
/// events in order as they come; a client whose application stops calling
/// `next_event` stops answering pings and is disconnected by the server.
///
/// Reconnecting: after a lost connection the next attempt waits a delay
/// that doubles from [`TcpClientConfig::initial_backoff`] up to
/// [`TcpClientConfig::max_backoff`] (5 s), with jitter; a connection that
/// stayed ready for [`TcpClientConfig::stable_after`] resets it. The first
/// attempt is immediate.
pub struct TcpClient<R: Runtime> {
    runtime: R,
    addr: String,
    options: TcpClientConfig,
    session: TcpClientSession,
    state: ClientState,
    events: VecDeque<TcpClientEvent>,
    catch_ups: CatchUps,
    backoff: Backoff,
    timer: Timer,
    read_buffer: Vec<u8>,
    commands: CommandQueue,
    sender: CommandSender,
    /// Waits for positions, fed as the application takes events.
    waits: Waits,
}

impl<R: Runtime> fmt::Debug for TcpClient<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            ClientState::Start => "start",
            ClientState::Connecting { .. } => "connecting",
            ClientState::Connected(_) => "connected",
            ClientState::Waiting(_) => "waiting",
            ClientState::Shutdown => "shut down",
        };
        f.debug_struct("TcpClient")
            .field("addr", &self.addr)
            .field("state", &state)
            .field("session", &self.session)
            .field("fetches", &self.catch_ups.len())
            .field("refused_commands", &self.commands.refused())
            .finish_non_exhaustive()
    }
}

impl<R: Runtime> TcpClient<R> {
    /// A client of the server at `addr` (`host:port`) with the default
    /// options. It connects on the first
    /// [`next_event`](TcpClient::next_event).
    pub fn new(runtime: R, addr: impl Into<String>, session: TcpClientSession) -> TcpClient<R> {
        TcpClient::with_config(runtime, addr, session, TcpClientConfig::default())
    }

    /// A client with the given options.
    pub fn with_config(
        runtime: R,
        addr: impl Into<String>,
        session: TcpClientSession,
        options: TcpClientConfig,
    ) -> TcpClient<R> {
        let (commands, sender) = CommandQueue::new(options.command_queue);
        let waits = Waits::new(session.follower().own_name().clone(), options.max_waiters);
        TcpClient {
            runtime,
            addr: addr.into(),
            backoff: Backoff::new(options.initial_backoff, options.max_backoff),
            catch_ups: CatchUps::new(options.catch_up_backoff, options.max_backoff),
            options,
            session,
            state: ClientState::Start,
            events: VecDeque::new(),
            timer: Timer::new(),
            read_buffer: Vec::new(),
            commands,
            sender,
            waits,
        }
    }

    /// Fetches missed rows from `source`: every catch-up the follower asks
    /// for is fetched and applied by the client, failures retried with
    /// backoff. The follower's `CatchUp` events are still reported.
    #[must_use]
    pub fn with_catch_up(mut self, source: Arc<dyn CatchUpSource>) -> TcpClient<R> {
        self.catch_ups.set_source(source);
        self
    }

    /// The catch-ups that failed [`STUCK_AFTER_FAILURES`](crate::positions::STUCK_AFTER_FAILURES) times or more in
    /// a row and have not succeeded since, oldest first: what is stuck, and
    /// since when.
    pub fn stuck_catch_ups(&self) -> Vec<StuckCatchUp> {
        self.catch_ups.stuck()
    }

    /// Sets where following `writer` on `stream` resumes (a position the
    /// application persisted; see [`Follower::set_position`]).
    pub fn set_position(
        &mut self,
        stream: &StreamName,
        writer: &InstanceName,
        token: Token,
    ) -> Result<(), SeedError> {
        self.session
            .follower_mut()
            .set_position(stream, writer, token)
    }

    /// The follower: what to persist ([`Follower::resume_points`]), counters.
    pub fn follower(&self) -> &Follower {
        self.session.follower()
    }

    /// The session (the follower, the connection's state).
    pub fn session(&self) -> &TcpClientSession {
        &self.session
    }

    /// The session, to seed positions through its follower. Do not
    /// connect or disconnect it: the client does.
    pub fn session_mut(&mut self) -> &mut TcpClientSession {
        &mut self.session
    }

    /// A handle to send commands from other tasks, through a queue of
    /// [`TcpClientConfig::command_queue`] commands.
    pub fn sender(&self) -> CommandSender {
        self.sender.clone()
    }

    /// A handle to wait, from any task, until the application has applied
    /// a writer's rows up to a token (see [`PositionWaiter`]).
    pub fn waiter(&self) -> PositionWaiter
    where
        R: Clone,
    {
        self.waits.waiter(Arc::new(self.runtime.clone()))
    }

    /// Resolves once the application has applied `writer`'s rows of
    /// `stream` up to `token`: it took the event that brings the writer
    /// there from [`next_event`](TcpClient::next_event) and came back for
    /// the next one. Fails after `timeout`
    /// ([`PositionWaiter::DEFAULT_TIMEOUT`] is Synapse's 5 s). The future
    /// borrows nothing: keep calling `next_event` while it waits, in this
    /// task or another. See [`PositionWaiter::wait_for_position`], which
    /// this is, for the rules and an example.
    pub fn wait_for_position(
        &self,
        stream: &StreamName,
        writer: &InstanceName,
        token: Token,
        timeout: Duration,
    ) -> WaitForPosition
    where
        R: Clone,
    {
        self.waiter()
            .wait_for_position(stream, writer, token, timeout)
    }

    /// Commands a [`CommandSender`] refused because the queue was full.
    pub fn refused_commands(&self) -> u64 {
        self.commands.refused()
    }

    /// Queues a command for the server (see [`TcpClientSession::send`]); it is
    /// written during the next [`next_event`](TcpClient::next_event).
    pub fn send(&mut self, command: Command) -> Result<(), SendError> {
        self.session.send(command)
    }

    /// Answers a catch-up the application fetched itself (without a
    /// [`CatchUpSource`]).
    pub fn handle_catch_up(
        &mut self,
        id: CatchUpId,
        page: CatchUpPage,
    ) -> Result<(), CatchUpError> {
        self.session.handle_catch_up(id, page)
    }

    /// A catch-up the application fetched itself failed: it is asked again.
    pub fn catch_up_failed(&mut self, id: CatchUpId) -> Result<(), CatchUpError> {
        self.session.catch_up_failed(id)
    }

    /// Whether the connection is up and the server greeted as expected.
    pub fn is_ready(&self) -> bool {
        self.session.is_ready()
    }

    /// Drives the connection until there is something to report; `None`
    /// once [`close`](TcpClient::close) was called.
    ///
    /// Cancel safe: dropping the future (in a `select!` with a timer, say)
    /// loses no event and no row.
    pub async fn next_event(&mut self) -> Option<TcpClientEvent> {
        poll_fn(|cx| self.poll_next_event(cx)).await
    }

    /// Writes what is queued (within
    /// [`TcpSessionConfig::close_timeout`](crate::session::TcpSessionConfig::close_timeout)),
    /// closes the connection and stops: [`next_event`](TcpClient::next_event)
    /// returns `None` from now on.
    pub async fn close(&mut self) {
        if let ClientState::Connected(live) = &mut self.state {
            let deadline = deadline_after(self.runtime.now(), self.session.config().close_timeout);
            let mut sleep = self.runtime.sleep_until(deadline);
            let session = &mut self.session;
            poll_fn(|cx| {
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(());
                }
                match live.link.poll_write(cx, || session.poll_transmit()) {
                    Ok(written) if written.drained => live.link.poll_close(cx).map(|_| ()),
                    Ok(_) => Poll::Pending,
                    Err(_) => Poll::Ready(()),
                }
            })
            .await;
        }
        self.shut_down();
    }

    /// Stops at once: the connection is dropped, nothing more is reported.
    fn shut_down(&mut self) {
        if !matches!(self.state, ClientState::Shutdown) {
            self.session.disconnected();
        }
        self.state = ClientState::Shutdown;
        self.commands.close();
        self.catch_ups.clear();
        self.events.clear();
        self.waits.close();
    }

    /// Polls for the next event; see [`next_event`](TcpClient::next_event).
    pub fn poll_next_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<TcpClientEvent>> {
        if self.commands.shutdown_requested() {
            self.shut_down();
        }
        // The application is back: what it took last is applied.
        let (session, events) = (&self.session, &self.events);
        self.waits.resume(session.follower(), || {
            events
                .iter()
                .filter_map(|event| match event {
                    TcpClientEvent::Follower(event) => Some(event),
                    _ => None,
                })
                .chain(session.queued_follower_events())
        });
        for _ in 0..BUDGET {
            if let Some(event) = self.events.pop_front() {
                if let TcpClientEvent::Follower(event) = &event {
                    self.waits.handing(event);
                }
                return Poll::Ready(Some(event));
            }
            if matches!(self.state, ClientState::Shutdown) {
                return Poll::Ready(None);
            }
            let mut progress = self.poll_commands(cx);
            progress |= self.poll_fetches(cx);
            progress |= self.poll_state(cx);
            self.drain_session();
            if !progress && self.events.is_empty() {
                self.waits.idle(cx);
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn poll_commands(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        while let Poll::Ready(Some(queued)) = self.commands.poll_next(cx) {
            progress = true;
            let (command, result) = match queued {
                Queued::Command(command) => (command.kind(), self.session.send(command)),
                // A client of direct TCP follows; only its server writes.
                Queued::Write { .. } => (
                    CommandKind::Rdata,
                    Err(SendError::WrongDirection {
                        command: CommandKind::Rdata,
                        sender: Side::Client,
                    }),
                ),
            };
            if let Err(error) = result {
                self.events
                    .push_back(TcpClientEvent::SendFailed { command, error });
            }
        }
        progress
    }

    fn poll_fetches(&mut self, cx: &mut Context<'_>) -> bool {
        let events = &mut self.events;
        self.catch_ups
            .poll(cx, &self.runtime, &mut self.session, |failure| {
                events.push_back(TcpClientEvent::CatchUpFailed {
                    request: failure.request,
                    error: failure.error,
                    retry_in: failure.retry_in,
                    failures: failure.failures,
                });
                if let Some(stuck) = failure.stuck {
                    events.push_back(TcpClientEvent::CatchUpStuck(stuck));
                }
            })
    }

    fn drain_session(&mut self) {
        while let Some(event) = self.session.poll_event() {
            if let TcpClientEvent::Follower(FollowerEvent::CatchUp(request)) = &event {
                self.catch_ups.start(request);
            }
            // Kept for the connection's `Disconnected`, which reports it.
            if let TcpClientEvent::Closing(error) = event {
                if let ClientState::Connected(live) = &mut self.state {
                    live.error = Some(error);
                }
                continue;
            }
            self.events.push_back(event);
        }
    }

    fn poll_state(&mut self, cx: &mut Context<'_>) -> bool {
        let now = self.runtime.now();
        match &mut self.state {
            ClientState::Shutdown => false,
            ClientState::Start => {
                self.start_connecting(now);
                true
            }
            ClientState::Waiting(sleep) => {
                if sleep.as_mut().poll(cx).is_pending() {
                    return false;
                }
                self.start_connecting(now);
                true
            }
            ClientState::Connecting { connect, timeout } => {
                let result = match connect.as_mut().poll(cx) {
                    Poll::Ready(result) => result,
                    Poll::Pending => match timeout.as_mut().poll(cx) {
                        Poll::Ready(()) => Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "connection attempt timed out",
                        )),
                        Poll::Pending => return false,
                    },
                };
                match result {
                    Ok(io) => {
                        self.session.set_wall_clock(now, SystemTime::now());
                        self.session.connect(now);
                        self.state = ClientState::Connected(Box::new(Live {
                            link: Link::new(io),
                            ready_at: None,
                            error: None,
                        }));
                        self.events.push_back(TcpClientEvent::Connected);
                    }
                    Err(error) => {
                        let retry_in = self.wait(now);
                        self.events
                            .push_back(TcpClientEvent::ConnectFailed { error, retry_in });
                    }
                }
                true
            }
            ClientState::Connected(_) => self.poll_connected(cx, now),
        }
    }

    fn start_connecting(&mut self, now: Instant) {
        let deadline = deadline_after(now, self.options.connect_timeout);
        self.state = ClientState::Connecting {
            connect: self.runtime.connect(&self.addr),
            timeout: self.runtime.sleep_until(deadline),
        };
    }

    /// Schedules the next attempt; returns its delay.
    fn wait(&mut self, now: Instant) -> Duration {
        let retry_in = self.backoff.next_delay();
        self.state = ClientState::Waiting(self.runtime.sleep_until(deadline_after(now, retry_in)));
        retry_in
    }

    fn poll_connected(&mut self, cx: &mut Context<'_>, now: Instant) -> bool {
        let ClientState::Connected(live) = &mut self.state else {
            return false;
        };
        let session = &mut self.session;
        if live.ready_at.is_none() && session.is_ready() {
            live.ready_at = Some(now);
        }
        let state = session.state();
        if matches!(state, None | Some(ConnectionState::Aborted)) {
            let reason = live
                .error
                .take()
                .map_or(Disconnect::Shutdown, Disconnect::Tcp);
            self.lost(reason, now);
            return true;
        }
        let written = match live.link.poll_write(cx, || session.poll_transmit()) {
            Ok(written) => written,
            Err(error) => {
                self.lost(Disconnect::Io(error), now);
                return true;
            }
        };
        let mut progress = written.progress;
        if state == Some(ConnectionState::Closing) {
            if written.drained && live.link.poll_close(cx).is_ready() {
                let reason = live
                    .error
                    .take()
                    .map_or(Disconnect::Shutdown, Disconnect::Tcp);
                self.lost(reason, now);
                return true;
            }
        } else {
            let size = self.options.read_buffer.max(1);
            if self.read_buffer.len() < size {
                self.read_buffer.resize(size, 0);
            }
            match live.link.poll_read_into(cx, &mut self.read_buffer) {
                Poll::Ready(Ok(n)) if n > 0 => {
                    session.handle_input(self.read_buffer.get(..n).unwrap_or_default(), now);
                    progress = true;
                }
                Poll::Ready(Ok(_)) => {
                    self.lost(Disconnect::Closed, now);
                    return true;
                }
                Poll::Ready(Err(error)) => {
                    self.lost(Disconnect::Io(error), now);
                    return true;
                }
                Poll::Pending => {}
            }
        }
        if let Some(deadline) = self.session.poll_timeout() {
            if self.timer.poll(&self.runtime, deadline, now, cx) {
                self.session.handle_timeout(now.max(deadline));
                progress = true;
            }
        }
        progress
    }

    fn lost(&mut self, reason: Disconnect, now: Instant) {
        let stable = match &self.state {
            ClientState::Connected(live) => live.ready_at.is_some_and(|ready| {
                now.saturating_duration_since(ready) >= self.options.stable_after
            }),
            _ => false,
        };
        if stable {
            self.backoff.reset();
        }
        self.session.disconnected();
        self.drain_session();
        let retry_in = self.wait(now);
        self.events
            .push_back(TcpClientEvent::Disconnected { reason, retry_in });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::TcpServerEvent;
    use crate::transport::TcpServer;

    /// Drivers can be moved to a spawned task.
    #[test]
    fn drivers_are_send() {
        fn send<T: Send>() {}
        send::<TcpClient<Arc<dyn Runtime>>>();
        send::<TcpServer<Arc<dyn Runtime>>>();
        send::<TcpClientEvent>();
        send::<TcpServerEvent>();
        send::<CommandSender>();
    }
}
