//! The [`Runtime`] for smol (feature `runtime-smol`).

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
#[cfg(unix)]
use std::path::Path;
use std::task::{Context, Poll};
use std::time::Instant;

use smol::Async;

use super::{BoxConnection, BoxFuture, Listener, Runtime};

/// smol's reactor and timers (any executor may poll the futures: smol's
/// reactor runs on its own thread).
///
/// ```no_run
/// # #[cfg(feature = "runtime-smol")]
/// # fn main() -> std::io::Result<()> {
/// use synapse_replication::transport::{Runtime, SmolRuntime};
///
/// smol::block_on(async {
///     let connection = SmolRuntime.connect("127.0.0.1:9092").await?;
///     # drop(connection);
///     Ok(())
/// })
/// # }
/// # #[cfg(not(feature = "runtime-smol"))]
/// # fn main() {}
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct SmolRuntime;

struct SmolListener(Async<TcpListener>);

impl Listener for SmolListener {
    fn poll_accept(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(BoxConnection, SocketAddr)>> {
        loop {
            match self.0.get_ref().accept() {
                Ok((stream, peer)) => return Poll::Ready(wrap(stream).map(|io| (io, peer))),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    match self.0.poll_readable(cx) {
                        Poll::Ready(Ok(())) => continue,
                        Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                        Poll::Pending => return Poll::Pending,
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.get_ref().local_addr()
    }
}

fn wrap(stream: TcpStream) -> io::Result<BoxConnection> {
    stream.set_nodelay(true)?;
    Ok(Box::new(Async::new(stream)?))
}

impl Runtime for SmolRuntime {
    fn connect(&self, addr: &str) -> BoxFuture<'static, io::Result<BoxConnection>> {
        let addr = addr.to_owned();
        Box::pin(async move {
            let stream = smol::net::TcpStream::connect(addr.as_str()).await?;
            stream.set_nodelay(true)?;
            Ok(Box::new(stream) as BoxConnection)
        })
    }

    fn listen(&self, addr: &str) -> BoxFuture<'static, io::Result<Box<dyn Listener>>> {
        let addr = addr.to_owned();
        Box::pin(async move {
            let mut last = None;
            for addr in smol::net::resolve(addr.as_str()).await? {
                match Async::<TcpListener>::bind(addr) {
                    Ok(listener) => {
                        return Ok(Box::new(SmolListener(listener)) as Box<dyn Listener>);
                    }
                    Err(error) => last = Some(error),
                }
            }
            Err(last.unwrap_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "no address to listen on")
            }))
        })
    }

    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()> {
        let timer = smol::Timer::at(deadline);
        Box::pin(async move {
            timer.await;
        })
    }

    #[cfg(unix)]
    fn connect_unix(&self, path: &Path) -> BoxFuture<'static, io::Result<BoxConnection>> {
        let path = path.to_owned();
        Box::pin(async move {
            let stream = smol::net::unix::UnixStream::connect(&path).await?;
            Ok(Box::new(stream) as BoxConnection)
        })
    }
}
