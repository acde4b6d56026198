//! Waiting for a writer's position from any task: [`PositionWaiter`] and
//! its future [`WaitForPosition`], over a [`PositionWaits`] table the
//! client feeds as the application applies its follower's events.
//!
//! # How the client feeds the table
//!
//! Nothing is fed while nobody waits: the client's receive path checks
//! one atomic flag per event. While waits exist, the client records the
//! position each follower event it hands over brings, and feeds it to the
//! table when the application comes back for the next event (it has then
//! applied the one before). Positions are not kept while nobody waits, so
//! a new wait on a (stream, writer) the table does not know is seeded by
//! the client, at the application's next call, from the follower's
//! position, unless events of that writer are still waiting to be taken
//! (then from the first of them to be applied).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;

use crate::positions::{Follower, FollowerEvent, PositionWaits, Registered, WaitId};
use crate::transport::runtime::{BoxFuture, Runtime, deadline_after};
use crate::wire::{InstanceName, StreamName, Token};

/// Why a [`WaitForPosition`] did not see the position reached.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The timeout passed first. Synapse logs a warning and goes on.
    #[error(
        "timed out waiting for {writer} to reach {token} on {stream} (reached {})",
        match reached { Some(token) => token.to_string(), None => "nothing known".to_owned() }
    )]
    Timeout {
        /// The stream.
        stream: StreamName,
        /// The writer waited for.
        writer: InstanceName,
        /// The token waited for.
        token: Token,
        /// The writer's position as applied when the wait gave up, if
        /// the client knew it.
        reached: Option<Token>,
    },
    /// The client holds its limit of waits already (its `max_waiters`
    /// option, [`PositionWaits::DEFAULT_LIMIT`] by default).
    #[error("too many waits for a position (at most {limit})")]
    TooManyWaiters {
        /// The most waits the client holds.
        limit: usize,
    },
    /// The client was closed or dropped: no position will be applied any
    /// more.
    #[error("the client is closed")]
    Closed,
}

/// A wait's state beside the table: whether it resolved, and whom to wake.
#[derive(Debug, Default)]
struct Slot {
    resolved: bool,
    waker: Option<Waker>,
}

#[derive(Debug)]
struct Inner {
    table: PositionWaits,
    slots: HashMap<WaitId, Slot>,
    closed: bool,
}

impl Inner {
    /// Marks `ids` resolved; the wakers to wake once the lock is released.
    fn resolve(&mut self, ids: Vec<WaitId>, wake: &mut Vec<Waker>) {
        for id in ids {
            if let Some(slot) = self.slots.get_mut(&id) {
                slot.resolved = true;
                wake.extend(slot.waker.take());
            }
        }
    }
}

/// In [`Shared::flags`]: waits are held, the client records what it
/// hands over.
const ACTIVE: u8 = 1;
/// In [`Shared::flags`]: a wait on a (stream, writer) the table does not
/// know was registered, the client must seed it.
const SEED: u8 = 2;

/// What the client and its waiters share.
struct Shared {
    /// [`ACTIVE`] and [`SEED`], in one atomic so that the client's
    /// hand-over checks both with one load.
    flags: AtomicU8,
    /// The client's task, woken to seed.
    client: AtomicWaker,
    /// This process's own name: a wait for its own writes resolves at once.
    own: InstanceName,
    inner: Mutex<Inner>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("flags", &self.flags)
            .field("own", &self.own)
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A waiter that panicked holding the lock left the table whole:
        // every change to it is made before anything that may panic.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Once no wait is held, positions stop being fed: forget them.
    fn settle(&self, inner: &mut Inner) {
        if inner.table.is_empty() {
            inner.table.forget_positions();
            self.flags.store(0, Ordering::Release);
        }
    }
}

/// A position change a follower event brings, kept from its handover
/// until the application comes back.
#[derive(Debug)]
enum Change {
    Advance(StreamName, InstanceName, Token),
    Set(StreamName, InstanceName, Token),
    Forget(StreamName, InstanceName),
}

impl Change {
    fn of(event: &FollowerEvent) -> Option<Change> {
        Some(match event {
            FollowerEvent::Rows {
                stream,
                writer,
                token,
                ..
            } => Change::Advance(stream.clone(), writer.clone(), *token),
            FollowerEvent::Position {
                stream,
                writer,
                token,
            }
            | FollowerEvent::Started {
                stream,
                writer,
                token,
            } => Change::Set(stream.clone(), writer.clone(), *token),
            // The follower restarts the writer at 0 (below, if the writer
            // announced less) and catches its new life up.
            FollowerEvent::Reset {
                stream,
                writer,
                new,
                ..
            } => Change::Set(stream.clone(), writer.clone(), (*new).min(Token(0))),
            FollowerEvent::Forgotten { stream, writer, .. } => {
                Change::Forget(stream.clone(), writer.clone())
            }
            _ => return None,
        })
    }

    fn apply(self, table: &mut PositionWaits) -> Vec<WaitId> {
        match self {
            Change::Advance(stream, writer, token) => table.advance(&stream, &writer, token),
            Change::Set(stream, writer, token) => table.reset(&stream, &writer, token),
            Change::Forget(stream, writer) => {
                table.forget(&stream, &writer);
                Vec::new()
            }
        }
    }
}

/// The (stream, writer) whose position an event moves.
fn pair_of(event: &FollowerEvent) -> Option<(&StreamName, &InstanceName)> {
    match event {
        FollowerEvent::Rows { stream, writer, .. }
        | FollowerEvent::Position { stream, writer, .. }
        | FollowerEvent::Started { stream, writer, .. }
        | FollowerEvent::Reset { stream, writer, .. }
        | FollowerEvent::Forgotten { stream, writer, .. } => Some((stream, writer)),
        _ => None,
    }
}

/// The client's side: feeds the table as the application takes events,
/// and closes it when the client goes.
pub(crate) struct Waits {
    shared: Arc<Shared>,
    /// What the event handed last brings, while waits are held.
    handed: Option<Change>,
}

impl fmt::Debug for Waits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waits")
            .field("shared", &self.shared)
            .field("handed", &self.handed)
            .finish()
    }
}

impl Waits {
    /// Waits of the process `own`, at most `limit` of them.
    pub(crate) fn new(own: InstanceName, limit: usize) -> Waits {
        Waits {
            shared: Arc::new(Shared {
                flags: AtomicU8::new(0),
                client: AtomicWaker::new(),
                own,
                inner: Mutex::new(Inner {
                    table: PositionWaits::with_limit(limit),
                    slots: HashMap::new(),
                    closed: false,
                }),
            }),
            handed: None,
        }
    }

    /// A handle for other tasks, timing out on `runtime`.
    pub(crate) fn waiter(&self, runtime: Arc<dyn Runtime>) -> PositionWaiter {
        PositionWaiter {
            shared: Arc::clone(&self.shared),
            runtime,
        }
    }

    /// Whether a wait is registered: only then does a hand-over need
    /// [`Waits::handing`].
    #[inline(always)]
    pub(crate) fn is_active(&self) -> bool {
        self.shared.flags.load(Ordering::Acquire) & ACTIVE != 0
    }

    /// Whether the hand-over has nothing to do for waits: none held,
    /// none to seed, nothing handed to apply. The client checks it first
    /// on every call, so that the common case costs two loads.
    #[inline(always)]
    pub(crate) fn is_idle(&self) -> bool {
        self.handed.is_none() && self.shared.flags.load(Ordering::Acquire) == 0
    }

    /// The client hands `event` to the application.
    #[inline]
    pub(crate) fn handing(&mut self, event: &FollowerEvent) {
        if self.is_active() {
            self.handed = Change::of(event);
        }
    }

    /// The application came back for the next event: what it was handed
    /// is applied. `queued` gives the follower events not taken yet, in
    /// order.
    #[inline]
    pub(crate) fn resume<'a, I>(&mut self, follower: &Follower, queued: impl Fn() -> I)
    where
        I: Iterator<Item = &'a FollowerEvent>,
    {
        if self.handed.is_none() && self.shared.flags.load(Ordering::Acquire) & SEED == 0 {
            return;
        }
        self.resume_slow(follower, queued);
    }

    #[cold]
    fn resume_slow<'a, I>(&mut self, follower: &Follower, queued: impl Fn() -> I)
    where
        I: Iterator<Item = &'a FollowerEvent>,
    {
        let shared = Arc::clone(&self.shared);
        let mut wake = Vec::new();
        {
            let mut inner = shared.lock();
            let inner = &mut *inner;
            if let Some(change) = self.handed.take() {
                if !inner.table.is_empty() {
                    let resolved = change.apply(&mut inner.table);
                    inner.resolve(resolved, &mut wake);
                }
            }
            if shared.flags.fetch_and(!SEED, Ordering::AcqRel) & SEED != 0 {
                let unknown: Vec<(StreamName, InstanceName)> = inner
                    .table
                    .unknown_positions()
                    .map(|(stream, writer)| (stream.clone(), writer.clone()))
                    .collect();
                for (stream, writer) in unknown {
                    let first = queued().find(|event| pair_of(event) == Some((&stream, &writer)));
                    let applied = match first {
                        None => follower.position(&stream, &writer),
                        Some(FollowerEvent::Reset { previous, .. }) => Some(*previous),
                        // Known once that event is applied.
                        Some(_) => None,
                    };
                    if let Some(token) = applied {
                        let resolved = inner.table.reset(&stream, &writer, token);
                        inner.resolve(resolved, &mut wake);
                    }
                }
            }
            shared.settle(inner);
        }
        for waker in wake {
            waker.wake();
        }
    }

    /// The client has nothing to report and waits: a new wait to seed
    /// wakes it.
    pub(crate) fn idle(&self, cx: &mut Context<'_>) {
        self.shared.client.register(cx.waker());
        if self.shared.flags.load(Ordering::Acquire) & SEED != 0 {
            cx.waker().wake_by_ref();
        }
    }

    /// The client stops: every wait still held fails with
    /// [`WaitError::Closed`], and new ones too.
    pub(crate) fn close(&mut self) {
        let mut wake = Vec::new();
        {
            let mut inner = self.shared.lock();
            if inner.closed {
                return;
            }
            inner.closed = true;
            inner.table = PositionWaits::with_limit(inner.table.limit());
            inner.slots.retain(|_, slot| {
                wake.extend(slot.waker.take());
                slot.resolved
            });
            self.shared.flags.store(0, Ordering::Release);
        }
        self.handed = None;
        for waker in wake {
            waker.wake();
        }
    }
}

impl Drop for Waits {
    fn drop(&mut self) {
        self.close();
    }
}

/// Waits, from any task, until a client's application has applied a
/// writer's rows up to a token: read-your-writes, and the replication
/// HTTP API's `_stream_positions` (Synapse's
/// `ReplicationDataHandler.wait_for_stream_position`). Cloneable and
/// `Send`; from [`RedisClient::waiter`](crate::transport::RedisClient::waiter)
/// or [`TcpClient::waiter`](crate::transport::TcpClient::waiter).
///
/// # What "applied" means
///
/// A wait resolves once the application has *taken* the follower event
/// that brings the writer to the token (`Rows` at or above it, or a
/// `Position` or `Started` there) from the client's `next_event` (or
/// `poll_next_event`) *and come back* for the next one: it has then
/// finished applying it, so whatever the waiter reads next sees those
/// rows. Resolving at handover instead would let a waiter read before the
/// rows are stored. The client must keep being polled, as it must anyway.
///
/// - A wait for a position already applied resolves at once (when the
///   client knows it: see below); so does a wait for the client's own
///   instance name, as in Synapse (its writes need no replication).
/// - A position moves as the follower's events say: rows and positions
///   move it up, a `Reset` moves it down (to where the writer's new life
///   starts), a `Forgotten` writer has none until it starts again. A
///   forged `POSITION` (see the follower's "Forged lines") moves it as a
///   real one does, and so can release a wait early: it affects when a
///   waiter goes on, never the rows delivered.
/// - While nobody waits the client keeps no positions (its receive path
///   checks one flag). The first wait on a (stream, writer) is checked
///   against the follower's position at the application's next call to
///   `next_event` (the client's task is woken for it), or, if events of
///   that writer wait to be taken, when the first of them is applied.
///
/// # Bounds and cancelling
///
/// The client holds at most its `max_waiters` waits (10 000 by default);
/// beyond, a wait fails at once with [`WaitError::TooManyWaiters`]. A wait
/// that resolves at once takes no slot. Dropping a [`WaitForPosition`]
/// removes its wait and frees its slot.
#[derive(Clone)]
pub struct PositionWaiter {
    shared: Arc<Shared>,
    runtime: Arc<dyn Runtime>,
}

impl fmt::Debug for PositionWaiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PositionWaiter")
            .field("own", &self.shared.own)
            .field("waiting", &self.waiting())
            .finish_non_exhaustive()
    }
}

impl PositionWaiter {
    /// Synapse's timeout for these waits (`_WAIT_FOR_REPLICATION_TIMEOUT_SECONDS`):
    /// 5 s.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

    /// A future that resolves once the application has applied `writer`'s
    /// rows of `stream` up to `token` (see the type's docs), or fails
    /// after `timeout` ([`WaitError::Timeout`], with the position
    /// reached), at once when the client holds its limit of waits
    /// ([`WaitError::TooManyWaiters`]), or when the client goes
    /// ([`WaitError::Closed`]).
    ///
    /// The wait is registered now, not when first polled, and its timeout
    /// counts from now. Any timeout works, up to `Duration::MAX` (a wait
    /// that in effect never times out). The future is `'static`, `Send` and cancel safe:
    /// dropping it removes the wait.
    ///
    /// ```no_run
    /// # #[cfg(feature = "runtime-smol")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use synapse_replication::config::SynapseConfig;
    /// use synapse_replication::transport::{PositionWaiter, RedisClient, SmolRuntime, WaitError};
    /// use synapse_replication::wire::{InstanceName, StreamName, Token};
    ///
    /// let synapse = SynapseConfig::from_json(
    ///     r#"{"server_name": "example.com", "redis": {"enabled": true}}"#,
    /// )?;
    /// let mut client = RedisClient::follow(SmolRuntime, &synapse, "worker1")?;
    /// let waiter = client.waiter();
    ///
    /// // Another task: the main process said it wrote event 1234; read
    /// // only once this process has applied it.
    /// let read = smol::spawn(async move {
    ///     let wait = waiter.wait_for_position(
    ///         &StreamName::Events,
    ///         &InstanceName::master(),
    ///         Token(1234),
    ///         PositionWaiter::DEFAULT_TIMEOUT,
    ///     );
    ///     match wait.await {
    ///         Ok(()) => println!("applied: read on"),
    ///         // Synapse goes on after its timeout too, with what it has.
    ///         Err(error @ WaitError::Timeout { .. }) => println!("{error}: reading anyway"),
    ///         Err(error) => println!("{error}"),
    ///     }
    /// });
    ///
    /// // The client's task applies events as they come.
    /// smol::block_on(async {
    ///     while let Some(event) = client.next_event().await {
    ///         println!("{event}"); // apply it here
    ///     }
    /// });
    /// # drop(read);
    /// # Ok(())
    /// # }
    /// # #[cfg(not(feature = "runtime-smol"))]
    /// # fn main() {}
    /// ```
    pub fn wait_for_position(
        &self,
        stream: &StreamName,
        writer: &InstanceName,
        token: Token,
        timeout: Duration,
    ) -> WaitForPosition {
        let done = |result| WaitForPosition {
            state: WaitState::Done(Some(result)),
        };
        if *writer == self.shared.own {
            return done(Ok(()));
        }
        let deadline = deadline_after(self.runtime.now(), timeout);
        let registered = {
            let mut inner = self.shared.lock();
            if inner.closed {
                return done(Err(WaitError::Closed));
            }
            let registered = inner.table.register(stream, writer, token, deadline);
            if let Ok(Registered::Waiting(id)) = registered {
                inner.slots.insert(id, Slot::default());
                let seed = if inner.table.position(stream, writer).is_none() {
                    SEED
                } else {
                    0
                };
                self.shared.flags.fetch_or(ACTIVE | seed, Ordering::Release);
            }
            registered
        };
        let id = match registered {
            Ok(Registered::Reached(_)) => return done(Ok(())),
            Err(error) => {
                return done(Err(WaitError::TooManyWaiters { limit: error.limit }));
            }
            Ok(Registered::Waiting(id)) => id,
        };
        if self.shared.flags.load(Ordering::Acquire) & SEED != 0 {
            self.shared.client.wake();
        }
        WaitForPosition {
            state: WaitState::Waiting(Box::new(Pending {
                shared: Arc::clone(&self.shared),
                runtime: Arc::clone(&self.runtime),
                id,
                deadline,
                sleep: None,
                stream: stream.clone(),
                writer: writer.clone(),
                token,
            })),
        }
    }

    /// [`wait_for_position`](Self::wait_for_position) until `deadline`:
    /// whether the position was reached (the replication HTTP API's waits,
    /// which go on either way, as Synapse's).
    #[cfg(any(feature = "http-catch-up", feature = "http-server"))]
    pub(crate) fn reached_by(
        &self,
        stream: StreamName,
        writer: InstanceName,
        token: Token,
        deadline: std::time::Instant,
    ) -> BoxFuture<'static, bool> {
        let timeout = deadline.saturating_duration_since(self.runtime.now());
        let wait = self.wait_for_position(&stream, &writer, token, timeout);
        Box::pin(async move { wait.await.is_ok() })
    }

    /// Waits held now (not resolved, expired or dropped).
    pub fn waiting(&self) -> usize {
        self.shared.lock().table.len()
    }

    /// The most waits the client holds.
    pub fn limit(&self) -> usize {
        self.shared.lock().table.limit()
    }
}

struct Pending {
    shared: Arc<Shared>,
    runtime: Arc<dyn Runtime>,
    id: WaitId,
    deadline: Instant,
    /// Made at the first poll (a runtime's timer may need its context).
    sleep: Option<BoxFuture<'static, ()>>,
    stream: StreamName,
    writer: InstanceName,
    token: Token,
}

enum WaitState {
    Done(Option<Result<(), WaitError>>),
    Waiting(Box<Pending>),
}

/// The future of [`PositionWaiter::wait_for_position`]: `Ok(())` once the
/// position is applied, or a [`WaitError`]. `'static`, `Send`, `Unpin`;
/// dropping it removes its wait.
#[must_use = "a wait does nothing unless awaited; dropping it removes the wait"]
pub struct WaitForPosition {
    state: WaitState,
}

impl fmt::Debug for WaitForPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            WaitState::Done(result) => f.debug_tuple("WaitForPosition").field(result).finish(),
            WaitState::Waiting(pending) => f
                .debug_struct("WaitForPosition")
                .field("stream", &pending.stream)
                .field("writer", &pending.writer)
                .field("token", &pending.token)
                .field("deadline", &pending.deadline)
                .finish(),
        }
    }
}

impl Future for WaitForPosition {
    type Output = Result<(), WaitError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let result = match &mut self.state {
            WaitState::Done(result) => match result.take() {
                Some(result) => result,
                None => return Poll::Pending, // polled after completion
            },
            WaitState::Waiting(pending) => match pending.poll(cx) {
                Poll::Ready(result) => result,
                Poll::Pending => return Poll::Pending,
            },
        };
        // The wait is no longer held: nothing to remove on drop.
        self.state = WaitState::Done(None);
        Poll::Ready(result)
    }
}

impl Pending {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), WaitError>> {
        if let Some(result) = self.check(Some(cx.waker()), false) {
            return Poll::Ready(result);
        }
        let (runtime, deadline) = (&self.runtime, self.deadline);
        let sleep = self
            .sleep
            .get_or_insert_with(|| runtime.sleep_until(deadline));
        if sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        match self.check(None, true) {
            Some(result) => Poll::Ready(result),
            None => Poll::Pending,
        }
    }

    /// The outcome, if there is one: resolved, closed, or (`expire`)
    /// timed out, the wait then removed. Otherwise keeps `waker`.
    fn check(&self, waker: Option<&Waker>, expire: bool) -> Option<Result<(), WaitError>> {
        let mut inner = self.shared.lock();
        let inner = &mut *inner;
        let Some(slot) = inner.slots.get_mut(&self.id) else {
            return Some(Err(WaitError::Closed));
        };
        if slot.resolved {
            inner.slots.remove(&self.id);
            return Some(Ok(()));
        }
        if expire {
            inner.slots.remove(&self.id);
            let _ = inner.table.cancel(self.id);
            let reached = inner.table.position(&self.stream, &self.writer);
            self.shared.settle(inner);
            tracing::debug!(
                stream = %self.stream,
                writer = %self.writer,
                token = %self.token,
                ?reached,
                "timed out waiting for a position"
            );
            return Some(Err(WaitError::Timeout {
                stream: self.stream.clone(),
                writer: self.writer.clone(),
                token: self.token,
                reached,
            }));
        }
        if let Some(waker) = waker {
            match &mut slot.waker {
                Some(kept) if kept.will_wake(waker) => {}
                kept => *kept = Some(waker.clone()),
            }
        }
        None
    }
}

impl Drop for WaitForPosition {
    fn drop(&mut self) {
        if let WaitState::Waiting(pending) = &self.state {
            let mut inner = pending.shared.lock();
            let inner = &mut *inner;
            inner.slots.remove(&pending.id);
            let _ = inner.table.cancel(pending.id);
            pending.shared.settle(inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn futures_are_send_and_static() {
        fn send<T: Send + Sync + 'static>() {}
        fn send_unpin<T: Send + Unpin + 'static>() {}
        send::<PositionWaiter>();
        send_unpin::<WaitForPosition>();
        send::<WaitError>();
    }
}
