//! What a transport needs from an async runtime: TCP connect and listen,
//! and timers. Object safe, so a driver can hold an `Arc<dyn Runtime>`.
//! Implemented for smol (`smol`, feature `runtime-smol`) and tokio
//! (`tokio`, feature `runtime-tokio`).

#[cfg(feature = "runtime-smol")]
pub(crate) mod smol;
#[cfg(feature = "runtime-tokio")]
pub(crate) mod tokio;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::io::{AsyncRead, AsyncWrite};

/// `now + timeout`, as a deadline to sleep until. Any timeout a caller
/// may pass works, up to `Duration::MAX` ("as long as it takes"): past
/// about 30 years (tokio's own "far future", which every runtime's timer
/// takes) it is 30 years, and `Instant`'s `+` would panic long before a
/// `Duration` runs out.
pub(crate) fn deadline_after(now: Instant, timeout: Duration) -> Instant {
    const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 24 * 60 * 60);
    let mut timeout = timeout.min(FAR_FUTURE);
    loop {
        // Ends: `now + 0` is always an instant.
        match now.checked_add(timeout) {
            Some(deadline) => return deadline,
            None => timeout /= 2,
        }
    }
}

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A byte stream a transport reads and writes: a TCP connection, or
/// anything else with the same traits (a TLS stream, an in-memory pipe).
///
/// Implemented for every `AsyncRead + AsyncWrite + Unpin + Send + 'static`
/// type.
pub trait Connection: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Connection for T {}

/// A connection of any type.
pub type BoxConnection = Box<dyn Connection>;

/// A bound TCP listener.
pub trait Listener: Send + 'static {
    /// Accepts the next connection, or registers the waker and returns
    /// `Pending`.
    fn poll_accept(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(BoxConnection, SocketAddr)>>;

    /// The address the listener is bound to (to learn the port after
    /// binding port 0).
    fn local_addr(&self) -> io::Result<SocketAddr>;
}

/// The runtime services the transports use: connecting, listening, and
/// sleeping until a deadline.
///
/// `SmolRuntime` (feature `runtime-smol`) and
/// `TokioRuntime` (feature `runtime-tokio`)
/// implement it; implement it yourself for another runtime, or to wrap
/// connections (TLS, a proxy).
pub trait Runtime: Send + Sync + 'static {
    /// Opens a TCP connection to `addr` (`host:port`; names are resolved).
    /// Implementations should disable Nagle's algorithm: drivers batch
    /// their writes already.
    fn connect(&self, addr: &str) -> BoxFuture<'static, io::Result<BoxConnection>>;

    /// Binds a TCP listener on `addr` (`host:port`; port 0 picks one).
    fn listen(&self, addr: &str) -> BoxFuture<'static, io::Result<Box<dyn Listener>>>;

    /// A future that completes at `deadline` (at once if it has passed).
    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()>;

    /// Opens a connection to the Unix domain socket at `path` (Redis'
    /// `unixsocket`). The default refuses with
    /// [`io::ErrorKind::Unsupported`]; `SmolRuntime` and `TokioRuntime`
    /// implement it on Unix.
    fn connect_unix(&self, path: &Path) -> BoxFuture<'static, io::Result<BoxConnection>> {
        let error = io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "this runtime cannot connect to unix sockets ({})",
                path.display()
            ),
        );
        Box::pin(async move { Err(error) })
    }

    /// The current time; drivers give it to the sessions. Must not go
    /// backwards.
    fn now(&self) -> Instant {
        Instant::now()
    }
}

impl<R: Runtime + ?Sized> Runtime for Arc<R> {
    fn connect(&self, addr: &str) -> BoxFuture<'static, io::Result<BoxConnection>> {
        (**self).connect(addr)
    }

    fn listen(&self, addr: &str) -> BoxFuture<'static, io::Result<Box<dyn Listener>>> {
        (**self).listen(addr)
    }

    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()> {
        (**self).sleep_until(deadline)
    }

    fn connect_unix(&self, path: &Path) -> BoxFuture<'static, io::Result<BoxConnection>> {
        (**self).connect_unix(path)
    }

    fn now(&self) -> Instant {
        (**self).now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_timeout_is_a_deadline() {
        let now = Instant::now();
        let secs = Duration::from_secs;
        assert_eq!(deadline_after(now, secs(5)), now + secs(5));
        assert_eq!(deadline_after(now, Duration::ZERO), now);
        let far = deadline_after(now, Duration::MAX);
        assert!(far >= now + secs(29 * 365 * 24 * 60 * 60), "{far:?}");
        assert_eq!(deadline_after(now, Duration::from_secs(u64::MAX)), far);
    }
}
