//! One socket and one timer, as the drivers use them: writes taken from a
//! session only when the socket can take them, reads into one buffer.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures::io::{AsyncRead, AsyncWrite};
use futures::task::{ArcWake, AtomicWaker, waker_ref};

use crate::transport::runtime::{BoxConnection, BoxFuture, Runtime};

/// Sleeps until the session's deadline.
///
/// The sleep is re-armed only when the deadline comes earlier than the one
/// armed. A later deadline (a keep-alive deadline moves with every input)
/// keeps the armed sleep, and is looked at again when that fires: a busy
/// connection does not create and register a new timer at every wake-up.
pub(crate) struct Timer {
    armed: Option<Instant>,
    sleep: Option<BoxFuture<'static, ()>>,
}

impl Timer {
    pub(crate) fn new() -> Timer {
        Timer {
            armed: None,
            sleep: None,
        }
    }

    /// Whether `deadline` has passed (registering the waker if not).
    pub(crate) fn poll(
        &mut self,
        runtime: &dyn Runtime,
        deadline: Instant,
        now: Instant,
        cx: &mut Context<'_>,
    ) -> bool {
        if deadline <= now {
            self.disarm();
            return true;
        }
        if self.armed.is_none_or(|armed| deadline < armed) {
            self.arm(runtime, deadline);
        }
        loop {
            let Some(sleep) = self.sleep.as_mut() else {
                return false;
            };
            if sleep.as_mut().poll(cx).is_pending() {
                return false;
            }
            if self.armed == Some(deadline) {
                self.disarm();
                return true;
            }
            // It fired for an earlier deadline than the current one:
            // sleep on until that.
            self.arm(runtime, deadline);
        }
    }

    fn arm(&mut self, runtime: &dyn Runtime, deadline: Instant) {
        self.armed = Some(deadline);
        self.sleep = Some(runtime.sleep_until(deadline));
    }

    fn disarm(&mut self) {
        self.armed = None;
        self.sleep = None;
    }
}

/// One socket: what is being written, and whether a flush is owed.
pub(crate) struct Link {
    io: BoxConnection,
    out: Option<(Bytes, usize)>,
    unflushed: bool,
    readable: Arc<Readiness>,
}

/// The waker a socket's reads register: it records that the socket asked
/// to be read before waking the task. A driver polls all its sockets each
/// time its task wakes; without this, every wake-up of a busy subscriber
/// would cost a read (a system call that finds nothing) on each idle
/// socket beside it.
struct Readiness {
    /// Set when the socket woke us, and after each read that found data
    /// (there may be more: read until the socket says to wait).
    woken: AtomicBool,
    task: AtomicWaker,
}

impl ArcWake for Readiness {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        arc_self.woken.store(true, Ordering::Release);
        arc_self.task.wake();
    }
}

/// What writing achieved.
pub(crate) struct Written {
    pub(crate) progress: bool,
    /// Nothing is left to write and the socket is flushed.
    pub(crate) drained: bool,
}

impl Link {
    pub(crate) fn new(io: BoxConnection) -> Link {
        Link {
            io,
            out: None,
            unflushed: false,
            readable: Arc::new(Readiness {
                woken: AtomicBool::new(true),
                task: AtomicWaker::new(),
            }),
        }
    }

    /// Writes what `next` gives until the socket is full or nothing is
    /// left, then flushes. Chunks are taken only when the socket can take
    /// them, so the session's queue measures what the peer has not read.
    pub(crate) fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        mut next: impl FnMut() -> Option<Bytes>,
    ) -> io::Result<Written> {
        let mut progress = false;
        loop {
            if self.out.is_none() {
                self.out = next().map(|bytes| (bytes, 0));
            }
            let Some((bytes, offset)) = self.out.as_mut() else {
                break;
            };
            match Pin::new(&mut self.io).poll_write(cx, &bytes[*offset..]) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => {
                    progress = true;
                    self.unflushed = true;
                    *offset += n;
                    if *offset >= bytes.len() {
                        self.out = None;
                    }
                }
                Poll::Ready(Err(error)) if error.kind() == io::ErrorKind::Interrupted => {}
                Poll::Ready(Err(error)) => return Err(error),
                Poll::Pending => {
                    return Ok(Written {
                        progress,
                        drained: false,
                    });
                }
            }
        }
        if self.unflushed {
            match Pin::new(&mut self.io).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.unflushed = false,
                Poll::Ready(Err(error)) => return Err(error),
                Poll::Pending => {}
            }
        }
        Ok(Written {
            progress,
            drained: !self.unflushed,
        })
    }

    /// Reads once into `buffer`: the number of bytes read, 0 at the end of
    /// the stream, or `Pending`. Only tries when the socket may have
    /// something: it last gave data, or woke the task since it said to
    /// wait (see [`Readiness`]).
    pub(crate) fn poll_read_into(
        &mut self,
        cx: &mut Context<'_>,
        buffer: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        // Registered before the flag is looked at, so a wake between the
        // two still reaches the task.
        self.readable.task.register(cx.waker());
        if !self.readable.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let waker = waker_ref(&self.readable);
        let mut socket_cx = Context::from_waker(&waker);
        loop {
            return match Pin::new(&mut self.io).poll_read(&mut socket_cx, buffer) {
                Poll::Ready(Err(error)) if error.kind() == io::ErrorKind::Interrupted => continue,
                Poll::Ready(result) => {
                    self.readable.woken.store(true, Ordering::Release);
                    Poll::Ready(result)
                }
                Poll::Pending => Poll::Pending,
            };
        }
    }

    pub(crate) fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_close(cx)
    }
}

/// Passes of a driver's poll before it yields to the executor.
pub(crate) const BUDGET: usize = 32;

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::task::Waker;

    use futures::task::{ArcWake, waker};

    use super::*;
    use crate::transport::Listener;

    /// A socket that has data only when the test says so, and counts how
    /// often it was asked.
    #[derive(Clone, Default)]
    struct Scripted(Arc<Mutex<ScriptedState>>);

    #[derive(Default)]
    struct ScriptedState {
        data: Vec<u8>,
        reads: usize,
        waker: Option<Waker>,
    }

    impl Scripted {
        fn arrive(&self, bytes: &[u8]) {
            let mut state = self.0.lock().expect("state");
            state.data.extend_from_slice(bytes);
            if let Some(waker) = state.waker.take() {
                waker.wake();
            }
        }

        fn reads(&self) -> usize {
            self.0.lock().expect("state").reads
        }
    }

    impl AsyncRead for Scripted {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut [u8],
        ) -> Poll<io::Result<usize>> {
            let mut state = self.0.lock().expect("state");
            state.reads += 1;
            if state.data.is_empty() {
                state.waker = Some(cx.waker().clone());
                return Poll::Pending;
            }
            let n = buf.len().min(state.data.len());
            buf[..n].copy_from_slice(&state.data[..n]);
            state.data.drain(..n);
            Poll::Ready(Ok(n))
        }
    }

    impl AsyncWrite for Scripted {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// The task's waker: counts wake-ups.
    #[derive(Default)]
    struct Task(Mutex<usize>);

    impl ArcWake for Task {
        fn wake_by_ref(arc_self: &Arc<Self>) {
            *arc_self.0.lock().expect("task") += 1;
        }
    }

    #[test]
    fn an_idle_socket_is_read_again_only_once_it_wakes_the_task() {
        let socket = Scripted::default();
        let mut link = Link::new(Box::new(socket.clone()));
        let task = Arc::new(Task::default());
        let task_waker = waker(task.clone());
        let mut cx = Context::from_waker(&task_waker);
        let mut buffer = [0u8; 4];

        // Never read yet: tried, nothing there.
        assert!(link.poll_read_into(&mut cx, &mut buffer).is_pending());
        assert_eq!(socket.reads(), 1);
        // The task woke for something else: the socket is left alone.
        for _ in 0..3 {
            assert!(link.poll_read_into(&mut cx, &mut buffer).is_pending());
        }
        assert_eq!(socket.reads(), 1);

        // Data arrives: the socket wakes the task, and is read.
        socket.arrive(b"abcdef");
        assert_eq!(*task.0.lock().expect("task"), 1);
        assert!(matches!(
            link.poll_read_into(&mut cx, &mut buffer),
            Poll::Ready(Ok(4))
        ));
        assert_eq!(&buffer, b"abcd");
        // After data, read again until the socket says to wait.
        assert!(matches!(
            link.poll_read_into(&mut cx, &mut buffer),
            Poll::Ready(Ok(2))
        ));
        assert!(link.poll_read_into(&mut cx, &mut buffer).is_pending());
        assert_eq!(socket.reads(), 4);
        assert!(link.poll_read_into(&mut cx, &mut buffer).is_pending());
        assert_eq!(socket.reads(), 4);

        // A wake-up with nothing behind it costs one read.
        socket
            .0
            .lock()
            .expect("state")
            .waker
            .take()
            .expect("registered")
            .wake();
        assert!(link.poll_read_into(&mut cx, &mut buffer).is_pending());
        assert_eq!(socket.reads(), 5);
    }

    /// A runtime with a virtual clock: its sleeps complete once the test
    /// moves the clock to their deadline; it counts the sleeps made.
    #[derive(Default)]
    struct Clock(Mutex<ClockState>);

    #[derive(Default)]
    struct ClockState {
        now: Option<Instant>,
        sleeps: Vec<Instant>,
    }

    impl Clock {
        fn now(&self) -> Instant {
            self.0
                .lock()
                .expect("clock")
                .now
                .unwrap_or_else(Instant::now)
        }

        fn sleeps(&self) -> Vec<Instant> {
            self.0.lock().expect("clock").sleeps.clone()
        }
    }

    /// The runtime the timer sees: only `sleep_until` is used.
    struct ClockRuntime(Arc<Clock>);

    impl Runtime for ClockRuntime {
        fn connect(&self, _: &str) -> BoxFuture<'static, io::Result<BoxConnection>> {
            Box::pin(async { Err(io::ErrorKind::Unsupported.into()) })
        }

        fn listen(&self, _: &str) -> BoxFuture<'static, io::Result<Box<dyn Listener>>> {
            Box::pin(async { Err(io::ErrorKind::Unsupported.into()) })
        }

        fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()> {
            self.0.0.lock().expect("clock").sleeps.push(deadline);
            let clock = self.0.clone();
            Box::pin(futures::future::poll_fn(move |_| {
                if clock.now() >= deadline {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            }))
        }
    }

    #[test]
    fn a_later_deadline_keeps_the_armed_sleep_until_it_fires() {
        let clock = Arc::new(Clock::default());
        let start = Instant::now();
        let at = |ms: u64| start + std::time::Duration::from_millis(ms);
        let set = |ms: u64| clock.0.lock().expect("clock").now = Some(at(ms));
        let runtime = ClockRuntime(clock.clone());
        let task = Arc::new(Task::default());
        let task_waker = waker(task.clone());
        let mut cx = Context::from_waker(&task_waker);
        let mut timer = Timer::new();

        set(0);
        assert!(!timer.poll(&runtime, at(100), at(0), &mut cx));
        // The deadline moves later at every input: no new sleep.
        for ms in 1..50 {
            set(ms);
            assert!(!timer.poll(&runtime, at(100 + ms), at(ms), &mut cx));
        }
        assert_eq!(clock.sleeps(), vec![at(100)]);
        // The armed sleep fires before the current deadline: it is not
        // due, and the timer sleeps on until it.
        set(100);
        assert!(!timer.poll(&runtime, at(149), at(99), &mut cx));
        assert_eq!(clock.sleeps(), vec![at(100), at(149)]);
        // An earlier deadline re-arms at once.
        assert!(!timer.poll(&runtime, at(120), at(100), &mut cx));
        assert_eq!(clock.sleeps(), vec![at(100), at(149), at(120)]);
        set(120);
        assert!(timer.poll(&runtime, at(120), at(119), &mut cx));
        // Due by the caller's clock: no sleep at all.
        assert!(timer.poll(&runtime, at(130), at(130), &mut cx));
        assert_eq!(clock.sleeps().len(), 3);
    }
}
