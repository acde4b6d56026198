//! The async driver for Redis replication: [`RedisClient`] keeps a
//! [`RedisSession`]'s two connections up, forever.

use crate::session::sentinel::{MasterAddr, SentinelEvent};
use std::fmt;
use std::future::poll_fn;
use std::io;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::positions::{
    CatchUpError, CatchUpId, CatchUpPage, Follower, FollowerEvent, History, SeedError,
    StuckCatchUp, WriteError, Writer,
};
use crate::session::{
    Disconnect, RedisEvent, RedisLink, RedisSession, RedisSessionConfig, RedisStats, SendError,
};
use crate::wire::{Command, InstanceName, RawRow, StreamName, Token};
use crate::writers::WriterRegistry;

use super::sentinel::{FoundMaster, MasterSearch, SentinelWatcher};
use crate::config::{ConfigError, RedisConfig, SynapseConfig};
use crate::transport::client::backoff::Backoff;
use crate::transport::client::catch_ups::CatchUps;
use crate::transport::client::command_queue::{CommandQueue, CommandSender, Queued};
use crate::transport::client::source::CatchUpSource;
use crate::transport::client::waits::{PositionWaiter, WaitForPosition, Waits};
use crate::transport::net::dial::Dial;
use crate::transport::net::socket::{Link, Timer};
use crate::transport::runtime::{BoxConnection, BoxFuture, Runtime, deadline_after};

/// Passes of a driver's poll before it yields to the executor.
const BUDGET: usize = 32;

/// Options of a [`RedisClient`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisClientConfig {
    /// The first reconnection delay (100 ms); it doubles after each failed
    /// attempt, with jitter (see [`Backoff`]).
    pub initial_backoff: Duration,
    /// The longest reconnection delay (5 s, as Synapse).
    pub max_backoff: Duration,
    /// A connection that was up for this long resets its delay (5 s), so
    /// that a server that accepts and then drops clients is not hammered.
    pub stable_after: Duration,
    /// The first delay before asking a failed catch-up again (500 ms,
    /// doubling to `max_backoff`).
    pub catch_up_backoff: Duration,
    /// Bytes read from a socket at once (256 KiB): a subscriber decodes
    /// every message of one read before reading again.
    pub read_buffer: usize,
    /// Commands the client's [`CommandSender`]s may queue between two
    /// turns of [`next_event`](RedisClient::next_event) (4096, see
    /// [`CommandSender::DEFAULT_CAPACITY`]). Beyond it
    /// [`CommandSender::send`] refuses with
    /// [`CommandSendError::Full`](crate::transport::CommandSendError::Full), counted
    /// in [`RedisStats::refused_commands`] ([`RedisClient::stats`]). 0
    /// refuses every command.
    pub command_queue: usize,
    /// Waits for a position the client holds at once
    /// ([`RedisClient::wait_for_position`]; 10 000,
    /// [`PositionWaits::DEFAULT_LIMIT`](crate::positions::PositionWaits::DEFAULT_LIMIT)).
    /// Beyond it a wait fails with
    /// [`WaitError::TooManyWaiters`](crate::transport::WaitError::TooManyWaiters).
    pub max_waiters: usize,
}

impl Default for RedisClientConfig {
    fn default() -> Self {
        RedisClientConfig {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            stable_after: Duration::from_secs(5),
            catch_up_backoff: Duration::from_millis(500),
            read_buffer: 256 << 10,
            command_queue: CommandSender::DEFAULT_CAPACITY,
            max_waiters: crate::positions::PositionWaits::DEFAULT_LIMIT,
        }
    }
}

struct Live {
    socket: Link,
    since: Instant,
    /// Set when the driver gives the connection up (a failover, a replica).
    error: Option<Disconnect>,
    /// The master the sentinels named (sentinel configurations only).
    master: Option<MasterAddr>,
}

enum State {
    Start,
    Connecting {
        connect: BoxFuture<'static, io::Result<BoxConnection>>,
    },
    /// Asking the sentinels where the master is (sentinel configurations
    /// only).
    Searching {
        search: Box<MasterSearch>,
    },
    Connected(Box<Live>),
    Waiting(BoxFuture<'static, ()>),
    Idle,
}

impl State {
    fn name(&self) -> &'static str {
        match self {
            State::Start => "start",
            State::Connecting { .. } => "connecting",
            State::Searching { .. } => "searching",
            State::Connected(_) => "connected",
            State::Waiting(_) => "waiting",
            State::Idle => "idle",
        }
    }
}

struct Slot {
    state: State,
    backoff: Backoff,
}

/// A Redis replication client: keeps a [`RedisSession`]'s subscriber and
/// publisher connections up, reconnecting forever with backoff, and fetches
/// what the follower missed from a [`CatchUpSource`].
///
/// Nothing happens unless [`next_event`](RedisClient::next_event) is
/// awaited: it connects, reads, writes, runs the timers and the catch-ups,
/// and returns as soon as there is something to report. Apply the
/// follower's events in order as they come.
///
/// Reading: each read takes up to [`RedisClientConfig::read_buffer`]
/// bytes and the session decodes every message in it before the next read,
/// so a burst costs one system call per read, not per message, and the
/// socket is drained as fast as the application takes events.
///
/// ```no_run
/// # #[cfg(feature = "runtime-smol")]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use synapse_replication::config::SynapseConfig;
/// use synapse_replication::positions::FollowerEvent;
/// use synapse_replication::session::RedisEvent;
/// use synapse_replication::transport::{RedisClient, SmolRuntime};
///
/// let synapse = SynapseConfig::from_json(
///     r#"{"server_name": "example.com", "redis": {"enabled": true}}"#,
/// )?;
/// let mut client = RedisClient::follow(SmolRuntime, &synapse, "worker1")?;
/// smol::block_on(async {
///     while let Some(event) = client.next_event().await {
///         match event {
///             RedisEvent::Follower(FollowerEvent::Rows { stream, writer, token, rows, .. }) => {
///                 println!("{stream} {writer} {token}: {} rows", rows.len())
///             }
///             other => println!("{other}"),
///         }
///     }
/// });
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "runtime-smol"))]
/// # fn main() {}
/// ```
///
/// # Cancel safety
///
/// [`next_event`](RedisClient::next_event) is cancel safe: dropping its
/// future (in a `select!` with a timer, say) loses no event and no row;
/// what was read is kept for the next call.
pub struct RedisClient<R: Runtime> {
    runtime: R,
    config: RedisConfig,
    options: RedisClientConfig,
    session: RedisSession,
    slots: [Slot; 2],
    catch_ups: CatchUps,
    timer: Timer,
    read_buffer: Vec<u8>,
    commands: CommandQueue,
    sender: CommandSender,
    /// Waits for positions, fed as the application takes events.
    waits: Waits,
    shutdown: bool,
    /// Hears the sentinels' failovers (sentinel configurations only).
    watcher: Option<SentinelWatcher>,
    /// The sentinel to ask first: the last that named the master.
    first_sentinel: usize,
}

impl<R: Runtime> fmt::Debug for RedisClient<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisClient")
            .field("config", &self.config)
            .field("subscriber", &self.slots[0].state.name())
            .field("publisher", &self.slots[1].state.name())
            .field("session", &self.session)
            .field("fetches", &self.catch_ups.len())
            .field("refused_commands", &self.commands.refused())
            .finish_non_exhaustive()
    }
}

impl<R: Runtime> RedisClient<R> {
    /// A client for the process `name` of the deployment `synapse`
    /// describes (see [`SynapseConfig`]): it follows every stream, trusting
    /// the writers the configuration lists, over the deployment's Redis,
    /// under the name `name` (also its Redis client name). It writes no
    /// stream until told to ([`RedisClient::advance`],
    /// [`RedisClient::write`]).
    ///
    /// Missed rows are fetched as Synapse's workers fetch them: with the
    /// feature `http-catch-up`, from each writer's `instance_map` address
    /// over Synapse's HTTP replication endpoint, with the configuration's
    /// secret (`HttpCatchUp::from_synapse`); without it, the follower's
    /// `CatchUp` events are the application's to answer
    /// ([`RedisClient::handle_catch_up`]). [`RedisClient::with_catch_up`]
    /// gives another source.
    ///
    /// Fails with [`ConfigError::Disabled`] when the deployment does
    /// not use Redis.
    pub fn follow(
        runtime: R,
        synapse: &SynapseConfig,
        name: impl Into<InstanceName>,
    ) -> Result<RedisClient<R>, ConfigError>
    where
        R: Clone,
    {
        let config = synapse.redis().ok_or(ConfigError::Disabled)?.clone();
        let name = name.into();
        let mut options = config.session_config(synapse.server_name());
        options.client_name = Some(name.to_string());
        let writers: Arc<dyn WriterRegistry> = synapse.writers().clone();
        let session = RedisSession::new(
            options,
            Follower::new(name.clone(), writers.clone()),
            Writer::new(name, writers),
        );
        let client = RedisClient::new(runtime.clone(), config, session);
        #[cfg(feature = "http-catch-up")]
        let client = client.with_catch_up(Arc::new(
            crate::transport::http::catch_up::HttpCatchUp::from_synapse(runtime, synapse),
        ));
        #[cfg(not(feature = "http-catch-up"))]
        drop(runtime);
        Ok(client)
    }

    /// A client connecting as `config` says, with the default options. It
    /// connects on the first [`next_event`](RedisClient::next_event).
    ///
    /// The session's credentials and database are its own
    /// ([`RedisConfig::session_config`] fills them from `config`).
    pub fn new(runtime: R, config: RedisConfig, session: RedisSession) -> RedisClient<R> {
        RedisClient::with_config(runtime, config, session, RedisClientConfig::default())
    }

    /// A client with the given options.
    pub fn with_config(
        runtime: R,
        config: RedisConfig,
        session: RedisSession,
        options: RedisClientConfig,
    ) -> RedisClient<R> {
        let (commands, sender) = CommandQueue::new(options.command_queue);
        let waits = Waits::new(session.follower().own_name().clone(), options.max_waiters);
        let slot = || Slot {
            state: State::Start,
            backoff: Backoff::new(options.initial_backoff, options.max_backoff),
        };
        let watcher = SentinelWatcher::new(
            &config,
            Backoff::new(options.initial_backoff, options.max_backoff),
            options.stable_after,
        );
        RedisClient {
            watcher,
            first_sentinel: 0,
            runtime,
            config,
            slots: [slot(), slot()],
            catch_ups: CatchUps::new(options.catch_up_backoff, options.max_backoff),
            read_buffer: vec![0; options.read_buffer.max(1)],
            options,
            session,
            timer: Timer::new(),
            commands,
            sender,
            waits,
            shutdown: false,
        }
    }

    /// Fetches missed rows from `source`: every catch-up the follower asks
    /// for is fetched and applied by the client, failures retried with
    /// backoff. The follower's `CatchUp` events are still reported.
    #[must_use]
    pub fn with_catch_up(mut self, source: Arc<dyn CatchUpSource>) -> RedisClient<R> {
        self.catch_ups.set_source(source);
        self
    }

    /// Keeps every row this client writes in `history` too (see
    /// [`Writer::with_history`]), so that writing a row is also keeping it
    /// for catch-ups: serve the same `Arc` (a [`CatchUpSource`]) to
    /// Synapse's processes with `HttpServer` (feature `http-server`), or to
    /// a Rust follower's client.
    ///
    /// ```
    /// # #[cfg(feature = "runtime-smol")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::{Arc, Mutex};
    /// use synapse_replication::config::SynapseConfig;
    /// use synapse_replication::positions::{History, HistoryMode};
    /// use synapse_replication::transport::{RedisClient, SmolRuntime};
    /// use synapse_replication::wire::StreamName;
    ///
    /// let synapse = SynapseConfig::from_json(
    ///     r#"{"server_name": "example.com", "redis": {"enabled": true},
    ///         "stream_writers": {"typing": ["typing1"]},
    ///         "instance_map": {"main": {"host": "10.0.0.1", "port": 9093},
    ///                          "typing1": {"host": "10.0.0.5", "port": 9100}}}"#,
    /// )?;
    /// let history = History::new(10_000).with_mode(StreamName::Typing, HistoryMode::Keyed { key_len: 1 });
    /// let history = Arc::new(Mutex::new(history));
    /// let client = RedisClient::follow(SmolRuntime, &synapse, "typing1")?.with_history(history.clone());
    /// assert!(client.writer().history().is_some());
    /// # Ok(())
    /// # }
    /// # #[cfg(not(feature = "runtime-smol"))]
    /// # fn main() {}
    /// ```
    #[must_use]
    pub fn with_history(mut self, history: Arc<Mutex<History>>) -> RedisClient<R> {
        self.session.writer_mut().set_history(history);
        self
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

    /// The writer: what this process announced of the streams it writes.
    pub fn writer(&self) -> &Writer {
        self.session.writer()
    }

    /// Writes rows of `stream` up to its `current` token (see
    /// [`Writer::write`]): kept in the writer's history if it has one
    /// ([`RedisClient::with_history`]), and published as `RDATA` and
    /// `POSITION` on the next [`next_event`](RedisClient::next_event) when
    /// ready, announced on the next connection otherwise. Other tasks write
    /// through [`RedisClient::sender`] ([`CommandSender::write`]).
    pub fn write(
        &mut self,
        stream: &StreamName,
        current: Token,
        updates: impl IntoIterator<Item = (Token, RawRow)>,
    ) -> Result<(), WriteError> {
        self.session.write(stream, current, updates)
    }

    /// Moves `stream`'s token without rows, or starts writing `stream` (see
    /// [`Writer::advance`]).
    pub fn advance(&mut self, stream: &StreamName, current: Token) -> Result<(), WriteError> {
        self.session.advance(stream, current)
    }

    /// The catch-ups that failed [`STUCK_AFTER_FAILURES`](crate::positions::STUCK_AFTER_FAILURES) times or more in
    /// a row and have not succeeded since, oldest first: what is stuck, and
    /// since when.
    pub fn stuck_catch_ups(&self) -> Vec<StuckCatchUp> {
        self.catch_ups.stuck()
    }

    /// The session (the follower, the writer, counters).
    pub fn session(&self) -> &RedisSession {
        &self.session
    }

    /// The session, to write rows, seed positions or send commands. Do not
    /// connect or disconnect it: the client does.
    pub fn session_mut(&mut self) -> &mut RedisSession {
        &mut self.session
    }

    /// Ends the client without closing gracefully, giving back its session
    /// (see [`RedisSession::into_parts`] to carry positions on).
    pub fn into_session(self) -> RedisSession {
        self.session
    }

    /// A handle to send commands and write rows from other tasks, through
    /// a queue of [`RedisClientConfig::command_queue`] entries.
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
    /// there from [`next_event`](RedisClient::next_event) and came back
    /// for the next one. Fails after `timeout`
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

    /// The session's [`RedisStats`], with what only the client knows:
    /// [`RedisStats::refused_commands`].
    pub fn stats(&self) -> RedisStats {
        let mut stats = self.session.stats();
        stats.refused_commands = self.commands.refused();
        stats
    }

    /// Publishes a command (see [`RedisSession::send`]); it is written
    /// during the next [`next_event`](RedisClient::next_event).
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

    /// Whether both connections are up and every channel subscribed.
    pub fn is_ready(&self) -> bool {
        self.session.is_ready()
    }

    /// Drives the connections until there is something to report; `None`
    /// once [`close`](RedisClient::close) was called. Cancel safe (see the
    /// type's docs).
    pub async fn next_event(&mut self) -> Option<RedisEvent> {
        poll_fn(|cx| self.poll_next_event(cx)).await
    }

    /// Writes what is queued (for at most `timeout`), closes both
    /// connections and stops: [`next_event`](RedisClient::next_event)
    /// returns `None` from now on. Send `CLEAR_USER_SYNC` first if this
    /// process had users syncing.
    pub async fn close(&mut self, timeout: Duration) {
        let deadline = deadline_after(self.runtime.now(), timeout);
        let mut sleep = self.runtime.sleep_until(deadline);
        let session = &mut self.session;
        let slots = &mut self.slots;
        poll_fn(|cx| {
            if sleep.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            let mut done = true;
            for (slot, link) in slots.iter_mut().zip(RedisLink::BOTH) {
                if let State::Connected(live) = &mut slot.state {
                    match live.socket.poll_write(cx, || session.poll_transmit(link)) {
                        Ok(written) if written.drained => {
                            if live.socket.poll_close(cx).is_pending() {
                                done = false;
                            }
                        }
                        Ok(_) => done = false,
                        Err(_) => {}
                    }
                }
            }
            if done { Poll::Ready(()) } else { Poll::Pending }
        })
        .await;
        self.shut_down();
    }

    /// Stops at once: connections dropped, nothing more reported.
    fn shut_down(&mut self) {
        let now = self.runtime.now();
        for (slot, link) in self.slots.iter_mut().zip(RedisLink::BOTH) {
            if matches!(slot.state, State::Connected(_)) {
                self.session.disconnected(link, now);
            }
            slot.state = State::Idle;
        }
        self.shutdown = true;
        self.commands.close();
        self.catch_ups.clear();
        self.waits.close();
    }

    /// Polls for the next event; see [`next_event`](RedisClient::next_event).
    ///
    /// Events come straight from the session's queue, which the client's
    /// own events join, so that each event is moved once and one order
    /// holds for all.
    #[inline]
    pub fn poll_next_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<RedisEvent>> {
        // Nearly every call: the follower's next event, with nothing to
        // shut down and no wait to feed. Everything else is out of line,
        // so that this path is small enough to inline into the
        // application's loop: no call, and the event is not returned
        // through this function's result before the loop matches on it.
        if self.is_plain_handover() {
            if let Some(event) = self.session.poll_rows_event() {
                return Poll::Ready(Some(event));
            }
        }
        self.poll_next_event_slow(cx)
    }

    /// Whether the hand-over has nothing to do but hand the event over:
    /// not shutting down, and no wait to feed or seed.
    #[inline(always)]
    fn is_plain_handover(&self) -> bool {
        !self.shutdown && !self.commands.shutdown_requested() && self.waits.is_idle()
    }

    /// [`poll_next_event`](RedisClient::poll_next_event) when the
    /// follower's next event is not rows or a position, or there is more
    /// to do: shutting down, feeding waits, the session's own events,
    /// driving the connections.
    #[inline(never)]
    fn poll_next_event_slow(&mut self, cx: &mut Context<'_>) -> Poll<Option<RedisEvent>> {
        if !self.shutdown && self.commands.shutdown_requested() {
            self.shut_down();
        }
        // The application is back: what it took last is applied.
        let session = &self.session;
        self.waits
            .resume(session.follower(), || session.queued_follower_events());
        // Rows and positions, nearly every event, straight from the
        // follower's queue while no one waits for a position.
        if !self.waits.is_active() {
            if let Some(event) = self.session.poll_rows_event() {
                return Poll::Ready(Some(event));
            }
        }
        for _ in 0..BUDGET {
            if let Some(event) = self.next_queued() {
                return Poll::Ready(Some(event));
            }
            if self.shutdown {
                return Poll::Ready(None);
            }
            let mut progress = self.poll_commands(cx);
            let mut failures = Vec::new();
            progress |= self
                .catch_ups
                .poll(cx, &self.runtime, &mut self.session, |failure| {
                    failures.push(failure)
                });
            for failure in failures {
                self.session.push_event(RedisEvent::CatchUpFailed {
                    request: failure.request,
                    error: failure.error,
                    retry_in: failure.retry_in,
                    failures: failure.failures,
                });
                if let Some(stuck) = failure.stuck {
                    self.session.push_event(RedisEvent::CatchUpStuck(stuck));
                }
            }
            let now = self.runtime.now();
            for link in RedisLink::BOTH {
                progress |= self.poll_link(cx, link, now);
            }
            progress |= self.poll_timer(cx, now);
            progress |= self.poll_watcher(cx, now);
            if !progress {
                if let Some(event) = self.next_queued() {
                    return Poll::Ready(Some(event));
                }
                self.waits.idle(cx);
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// The next event for the application. `Closing` is not one: the
    /// link's `Disconnected` reports its error.
    #[inline(always)]
    fn next_queued(&mut self) -> Option<RedisEvent> {
        loop {
            let event = self.session.poll_event()?;
            if let RedisEvent::Follower(follower) = &event {
                self.waits.handing(follower);
                // Rows and positions, nearly every event, need nothing
                // more here: no call for them.
                if matches!(
                    follower,
                    FollowerEvent::Rows { .. } | FollowerEvent::Position { .. }
                ) {
                    return Some(event);
                }
            }
            // Commands received, most of the session's own events, need
            // nothing either.
            if !matches!(event, RedisEvent::Command(_)) {
                self.observe(&event);
            }
            if !matches!(event, RedisEvent::Closing { .. }) {
                return Some(event);
            }
        }
    }

    fn poll_commands(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        while let Poll::Ready(Some(queued)) = self.commands.poll_next(cx) {
            progress = true;
            match queued {
                Queued::Command(command) => {
                    let kind = command.kind();
                    if let Err(error) = self.session.send(command) {
                        self.session.push_event(RedisEvent::SendFailed {
                            command: kind,
                            error,
                        });
                    }
                }
                Queued::Write {
                    stream,
                    current,
                    updates,
                } => {
                    if let Err(error) = self.session.write(&stream, current, updates) {
                        self.session.push_event(RedisEvent::WriteFailed { error });
                    }
                }
            }
        }
        progress
    }

    /// What the client does about a session event, as it hands it over.
    fn observe(&mut self, event: &RedisEvent) {
        match event {
            RedisEvent::Follower(FollowerEvent::CatchUp(request)) => {
                tracing::debug!(%request, "rows missed: catching up");
                self.catch_ups.start(request);
            }
            RedisEvent::Ready => tracing::info!("replicating over Redis"),
            // The session warns, rate limited; each one for debugging.
            RedisEvent::Malformed { error, .. } => {
                tracing::debug!(%error, "ignored a message that is not a command");
            }
            RedisEvent::PublishFailed { command, error } => {
                tracing::warn!(%command, %error, "Redis refused a publish");
                if error.code == "READONLY" && self.watcher.is_some() {
                    // The node became a replica: nothing more goes to it.
                    // Both links find the master again through the
                    // sentinels. (Heard after a reconnect, this costs one
                    // more reconnect, no row: catch-ups fetch what a
                    // reconnect skips.)
                    for slot in &mut self.slots {
                        if let State::Connected(live) = &mut slot.state {
                            live.error = Some(Disconnect::Replica {
                                node: live.master.clone(),
                            });
                        }
                    }
                }
            }
            RedisEvent::Closing { link, error } => {
                tracing::warn!(%link, %error, "closing the connection to Redis");
            }
            _ => {}
        }
    }

    fn poll_timer(&mut self, cx: &mut Context<'_>, now: Instant) -> bool {
        let Some(deadline) = self.session.poll_timeout() else {
            return false;
        };
        if self.timer.poll(&self.runtime, deadline, now, cx) {
            self.session.handle_timeout(now.max(deadline));
            return true;
        }
        false
    }

    fn poll_link(&mut self, cx: &mut Context<'_>, link: RedisLink, now: Instant) -> bool {
        let index = slot_index(link);
        let wanted = self.session.wants(link);
        let Some(slot) = self.slots.get_mut(index) else {
            return false;
        };
        match &mut slot.state {
            State::Idle => {
                if wanted && !self.shutdown {
                    slot.state = State::Start;
                    return true;
                }
                false
            }
            State::Start => {
                if !wanted {
                    slot.state = State::Idle;
                    return false;
                }
                if let Some(search) = MasterSearch::new(&self.config, self.first_sentinel) {
                    slot.state = State::Searching {
                        search: Box::new(search),
                    };
                    return true;
                }
                slot.state = State::Connecting {
                    connect: self.config.connect(&self.runtime),
                };
                true
            }
            State::Waiting(sleep) => {
                if sleep.as_mut().poll(cx).is_pending() {
                    return false;
                }
                slot.state = State::Start;
                true
            }
            State::Connecting { connect } => {
                let result = match connect.as_mut().poll(cx) {
                    Poll::Ready(result) => result,
                    Poll::Pending => return false,
                };
                match result {
                    Ok(io) => {
                        tracing::debug!(%link, endpoint = %self.config.endpoint(), "connected to Redis");
                        slot.state = State::Connected(Box::new(Live {
                            socket: Link::new(io),
                            since: now,
                            error: None,
                            master: None,
                        }));
                        self.session.connect(link, now);
                        self.session.push_event(RedisEvent::Connected { link });
                    }
                    Err(error) => {
                        let retry_in = slot.backoff.next_delay();
                        tracing::warn!(
                            %link,
                            endpoint = %self.config.endpoint(),
                            %error,
                            ?retry_in,
                            "cannot connect to Redis"
                        );
                        slot.state =
                            State::Waiting(self.runtime.sleep_until(deadline_after(now, retry_in)));
                        self.session.push_event(RedisEvent::ConnectFailed {
                            link,
                            error,
                            retry_in,
                        });
                    }
                }
                true
            }
            State::Searching { search } => {
                let result = match search.poll(cx, &self.runtime) {
                    Poll::Ready(result) => result,
                    Poll::Pending => return false,
                };
                match result {
                    Ok(found) => self.found_master(link, found, now),
                    Err(error) => {
                        let retry_in = slot.backoff.next_delay();
                        tracing::warn!(%link, %error, ?retry_in, "no master from the sentinels");
                        slot.state =
                            State::Waiting(self.runtime.sleep_until(deadline_after(now, retry_in)));
                        self.session.push_event(RedisEvent::ConnectFailed {
                            link,
                            error,
                            retry_in,
                        });
                    }
                }
                true
            }
            State::Connected(live) => {
                let reason = live.error.take().or_else(|| {
                    self.session
                        .failure(link)
                        .map(|error| Disconnect::Redis(error.clone()))
                });
                if let Some(reason) = reason {
                    self.lost(link, reason, now);
                    return true;
                }
                let session = &mut self.session;
                let written = match live.socket.poll_write(cx, || session.poll_transmit(link)) {
                    Ok(written) => written,
                    Err(error) => {
                        self.lost(link, Disconnect::Io(error), now);
                        return true;
                    }
                };
                let mut progress = written.progress;
                match live.socket.poll_read_into(cx, &mut self.read_buffer) {
                    Poll::Ready(Ok(0)) => {
                        self.lost(link, Disconnect::Closed, now);
                        return true;
                    }
                    Poll::Ready(Ok(n)) => {
                        let data = self.read_buffer.get(..n).unwrap_or_default();
                        self.session.handle_input(link, data, now);
                        progress = true;
                    }
                    Poll::Ready(Err(error)) => {
                        self.lost(link, Disconnect::Io(error), now);
                        return true;
                    }
                    Poll::Pending => {}
                }
                progress
            }
        }
    }

    /// A link's discovery found the master: the link is up on the
    /// connection that checked it.
    fn found_master(&mut self, link: RedisLink, found: FoundMaster, now: Instant) {
        let Some(slot) = self.slots.get_mut(slot_index(link)) else {
            return;
        };
        let sentinels = self.config.sentinel_config();
        let endpoint = |index: usize| {
            sentinels
                .and_then(|sentinels| sentinels.sentinels().get(index))
                .cloned()
                .unwrap_or_else(|| self.config.endpoint().clone())
        };
        let event = SentinelEvent::MasterFound {
            link,
            master: found.master.clone(),
            sentinel: endpoint(found.sentinel),
            rejected: found
                .rejected
                .into_iter()
                .map(|(index, error)| (endpoint(index), error))
                .collect(),
        };
        tracing::info!(%event, "found the Redis master");
        self.first_sentinel = found.sentinel;
        if let Some(watcher) = &mut self.watcher {
            watcher.prefer(found.sentinel);
        }
        slot.state = State::Connected(Box::new(Live {
            socket: Link::new(found.connection),
            since: now,
            error: None,
            master: Some(found.master),
        }));
        self.session.connect(link, now);
        self.session.push_event(RedisEvent::Sentinel(event));
        self.session.push_event(RedisEvent::Connected { link });
    }

    /// Hears the sentinels: on a switch, links to another node than the
    /// new master are closed and connect again at once.
    fn poll_watcher(&mut self, cx: &mut Context<'_>, now: Instant) -> bool {
        if self.shutdown {
            return false;
        }
        let Some(watcher) = &mut self.watcher else {
            return false;
        };
        let Poll::Ready(event) = watcher.poll(cx, &self.runtime, now) else {
            return false;
        };
        match &event {
            SentinelEvent::Switched { to, .. } => {
                tracing::warn!(%event, "Redis failover");
                self.session.push_event(RedisEvent::Sentinel(event.clone()));
                for link in RedisLink::BOTH {
                    let Some(slot) = self.slots.get_mut(slot_index(link)) else {
                        continue;
                    };
                    let stale = match &slot.state {
                        State::Connected(live) => live.master.as_ref() != Some(to),
                        _ => false,
                    };
                    if stale {
                        slot.backoff.reset();
                        self.lost(link, Disconnect::MasterSwitched { to: to.clone() }, now);
                    }
                }
                return true;
            }
            SentinelEvent::WatchLost { .. } => tracing::warn!(%event, "Redis sentinel"),
            _ => tracing::debug!(%event, "Redis sentinel"),
        }
        self.session.push_event(RedisEvent::Sentinel(event));
        true
    }

    fn lost(&mut self, link: RedisLink, reason: Disconnect, now: Instant) {
        let Some(slot) = self.slots.get_mut(slot_index(link)) else {
            return;
        };
        if let State::Connected(live) = &slot.state {
            if now.saturating_duration_since(live.since) >= self.options.stable_after {
                slot.backoff.reset();
            }
        }
        let retry_in = slot.backoff.next_delay();
        tracing::warn!(%link, %reason, ?retry_in, "lost the connection to Redis");
        slot.state = State::Waiting(self.runtime.sleep_until(deadline_after(now, retry_in)));
        self.session.disconnected(link, now);
        self.session.push_event(RedisEvent::Disconnected {
            link,
            reason,
            retry_in,
        });
    }
}

impl RedisConfig {
    /// Session options for the deployment named `prefix` (its
    /// `server_name`), with this configuration's credentials and database.
    pub fn session_config(&self, prefix: impl Into<String>) -> RedisSessionConfig {
        let mut options = RedisSessionConfig::new(prefix);
        options.auth = self.auth().cloned();
        options.database = self.database();
        options
    }
}

fn slot_index(link: RedisLink) -> usize {
    match link {
        RedisLink::Subscriber => 0,
        RedisLink::Publisher => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client can be moved to a spawned task.
    #[test]
    fn client_is_send() {
        fn send<T: Send>() {}
        send::<RedisClient<Arc<dyn Runtime>>>();
        send::<RedisEvent>();
    }
}
