//! The [`Runtime`] for tokio (feature `runtime-tokio`), through
//! `tokio_util::compat` for the `futures::io` traits.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
#[cfg(unix)]
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::runtime::Handle;
use tokio_util::compat::TokioAsyncReadCompatExt;

use super::{BoxConnection, BoxFuture, Listener, Runtime};

/// A tokio runtime's reactor and timers.
///
/// It keeps a [`Handle`] and enters it whenever it creates or polls a
/// socket or timer, so the drivers may be polled from any executor as long
/// as the tokio runtime runs (a multi-thread runtime, or a current-thread
/// one inside `block_on`).
#[derive(Clone, Debug)]
pub struct TokioRuntime {
    handle: Handle,
}

impl TokioRuntime {
    /// The runtime of `handle`.
    pub fn new(handle: Handle) -> TokioRuntime {
        TokioRuntime { handle }
    }

    /// The runtime this is called from, if any.
    pub fn current() -> Option<TokioRuntime> {
        Handle::try_current().ok().map(TokioRuntime::new)
    }

    fn entered<F>(&self, future: F) -> BoxFuture<'static, F::Output>
    where
        F: Future + Send + 'static,
    {
        Box::pin(Entered {
            handle: self.handle.clone(),
            future: Box::pin(future),
        })
    }
}

/// Polls the inner future inside the runtime's context.
struct Entered<F> {
    handle: Handle,
    future: Pin<Box<F>>,
}

impl<F: Future> Future for Entered<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let _guard = this.handle.enter();
        this.future.as_mut().poll(cx)
    }
}

struct TokioListener {
    handle: Handle,
    listener: tokio::net::TcpListener,
}

impl Listener for TokioListener {
    fn poll_accept(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(BoxConnection, SocketAddr)>> {
        let _guard = self.handle.enter();
        self.listener.poll_accept(cx).map(|accepted| {
            let (stream, peer) = accepted?;
            stream.set_nodelay(true)?;
            Ok((Box::new(stream.compat()) as BoxConnection, peer))
        })
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

impl Runtime for TokioRuntime {
    fn connect(&self, addr: &str) -> BoxFuture<'static, io::Result<BoxConnection>> {
        let addr = addr.to_owned();
        self.entered(async move {
            let stream = tokio::net::TcpStream::connect(addr.as_str()).await?;
            stream.set_nodelay(true)?;
            Ok(Box::new(stream.compat()) as BoxConnection)
        })
    }

    fn listen(&self, addr: &str) -> BoxFuture<'static, io::Result<Box<dyn Listener>>> {
        let addr = addr.to_owned();
        let handle = self.handle.clone();
        self.entered(async move {
            let listener = tokio::net::TcpListener::bind(addr.as_str()).await?;
            Ok(Box::new(TokioListener { handle, listener }) as Box<dyn Listener>)
        })
    }

    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()> {
        let deadline = tokio::time::Instant::from_std(deadline);
        self.entered(async move { tokio::time::sleep_until(deadline).await })
    }

    #[cfg(unix)]
    fn connect_unix(&self, path: &Path) -> BoxFuture<'static, io::Result<BoxConnection>> {
        let path = path.to_owned();
        self.entered(async move {
            let stream = tokio::net::UnixStream::connect(&path).await?;
            Ok(Box::new(stream.compat()) as BoxConnection)
        })
    }
}
