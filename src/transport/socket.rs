//! One socket and one timer, as the drivers use them: writes taken from a
//! session only when the socket can take them, reads into one buffer.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures::io::{AsyncRead, AsyncWrite};

use super::runtime::{BoxConnection, BoxFuture, Runtime};

/// Sleeps until the session's deadline, re-armed when it changes.
pub(super) struct Timer {
    deadline: Option<Instant>,
    sleep: Option<BoxFuture<'static, ()>>,
}

impl Timer {
    pub(super) fn new() -> Timer {
        Timer {
            deadline: None,
            sleep: None,
        }
    }

    /// Whether `deadline` has passed (registering the waker if not).
    pub(super) fn poll(
        &mut self,
        runtime: &dyn Runtime,
        deadline: Instant,
        now: Instant,
        cx: &mut Context<'_>,
    ) -> bool {
        if deadline <= now {
            self.deadline = None;
            self.sleep = None;
            return true;
        }
        if self.deadline != Some(deadline) {
            self.deadline = Some(deadline);
            self.sleep = Some(runtime.sleep_until(deadline));
        }
        let Some(sleep) = self.sleep.as_mut() else {
            return false;
        };
        if sleep.as_mut().poll(cx).is_ready() {
            self.deadline = None;
            self.sleep = None;
            return true;
        }
        false
    }
}

/// One socket: what is being written, and whether a flush is owed.
pub(super) struct Link {
    io: BoxConnection,
    out: Option<(Bytes, usize)>,
    unflushed: bool,
}

/// What writing achieved.
pub(super) struct Written {
    pub(super) progress: bool,
    /// Nothing is left to write and the socket is flushed.
    pub(super) drained: bool,
}

impl Link {
    pub(super) fn new(io: BoxConnection) -> Link {
        Link {
            io,
            out: None,
            unflushed: false,
        }
    }

    /// Writes what `next` gives until the socket is full or nothing is
    /// left, then flushes. Chunks are taken only when the socket can take
    /// them, so the session's queue measures what the peer has not read.
    pub(super) fn poll_write(
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

    /// Reads once into `buffer`: `Some(bytes)`, `None` at the end of the
    /// stream, or `Pending`.
    pub(super) fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        buffer: &mut BytesMut,
        size: usize,
    ) -> Poll<io::Result<Option<Bytes>>> {
        if buffer.len() < size {
            buffer.resize(size, 0);
        }
        loop {
            return match Pin::new(&mut self.io).poll_read(cx, &mut buffer[..]) {
                Poll::Ready(Ok(0)) => Poll::Ready(Ok(None)),
                Poll::Ready(Ok(n)) => Poll::Ready(Ok(Some(buffer.split_to(n).freeze()))),
                Poll::Ready(Err(error)) if error.kind() == io::ErrorKind::Interrupted => continue,
                Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
                Poll::Pending => Poll::Pending,
            };
        }
    }

    /// Reads once into `buffer`: the number of bytes read, 0 at the end of
    /// the stream, or `Pending`.
    pub(super) fn poll_read_into(
        &mut self,
        cx: &mut Context<'_>,
        buffer: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            return match Pin::new(&mut self.io).poll_read(cx, buffer) {
                Poll::Ready(Err(error)) if error.kind() == io::ErrorKind::Interrupted => continue,
                other => other,
            };
        }
    }

    pub(super) fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_close(cx)
    }
}
