//! hyper's I/O traits over this crate's `futures::io` connections, for
//! the HTTP catch-up client and the HTTP server alike.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures::io::{AsyncRead, AsyncWrite};
use hyper::rt::ReadBufCursor;

use crate::transport::runtime::BoxConnection;

/// hyper's I/O traits over a `futures::io` connection. Reads go through a
/// small buffer of our own (hyper's is uninitialised, and this crate
/// forbids `unsafe`).
pub(super) struct HyperIo {
    inner: BoxConnection,
    scratch: Box<[u8]>,
}

impl HyperIo {
    /// `inner`, read `chunk` bytes at a time at most.
    pub(super) fn new(inner: BoxConnection, chunk: usize) -> HyperIo {
        HyperIo {
            inner,
            scratch: vec![0; chunk.max(1)].into_boxed_slice(),
        }
    }
}

impl hyper::rt::Read for HyperIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let len = buf.remaining().min(this.scratch.len());
        let scratch = &mut this.scratch[..len];
        let read = ready!(Pin::new(&mut this.inner).poll_read(cx, scratch))?;
        buf.put_slice(&scratch[..read.min(len)]);
        Poll::Ready(Ok(()))
    }
}

impl hyper::rt::Write for HyperIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_close(cx)
    }
}

#[cfg(all(test, feature = "runtime-smol"))]
mod tests {
    use std::future::poll_fn;

    use super::*;

    const CHUNK: usize = 32 * 1024;

    #[test]
    fn io_reads_through_the_scratch_buffer() {
        let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let mut io = HyperIo::new(Box::new(futures::io::Cursor::new(data.clone())), CHUNK);
        let mut out = Vec::new();
        let mut storage = vec![std::mem::MaybeUninit::<u8>::uninit(); 10_000];
        smol::block_on(async {
            loop {
                let mut buf = hyper::rt::ReadBuf::uninit(&mut storage);
                poll_fn(|cx| hyper::rt::Read::poll_read(Pin::new(&mut io), cx, buf.unfilled()))
                    .await
                    .unwrap();
                if buf.filled().is_empty() {
                    break;
                }
                assert!(buf.filled().len() <= CHUNK);
                out.extend_from_slice(buf.filled());
            }
        });
        assert_eq!(out, data);
    }
}
