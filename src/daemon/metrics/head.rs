//! A `/metrics` request's head: read whole under the caller's deadline before the connection
//! takes an answering slot, then handed to hyper as if unread ([`Primed`]). Reads at most
//! [`MAX_REQUEST`] bytes; parses nothing (hyper does).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::MAX_REQUEST;

/// The request head, up to its blank line (with whatever came after it in the same reads), or
/// [`MAX_REQUEST`] bytes of one that does not end (hyper answers those 431); `None` when the
/// client closed first.
pub(super) async fn read_head(stream: &mut TcpStream) -> io::Result<Option<Vec<u8>>> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let room = (MAX_REQUEST - head.len()).min(chunk.len());
        let n = stream.read(&mut chunk[..room]).await?;
        if n == 0 {
            return Ok(None);
        }
        // The blank line may straddle two reads.
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..n]);
        if ends_head(&head[from..]) || head.len() >= MAX_REQUEST {
            return Ok(Some(head));
        }
    }
}

/// Whether `bytes` hold the blank line that ends a request head (hyper takes a bare `\n` too).
fn ends_head(bytes: &[u8]) -> bool {
    bytes.windows(2).any(|w| w == b"\n\n") || bytes.windows(4).any(|w| w == b"\r\n\r\n")
}

/// A connection whose first bytes were already read: hyper reads them again, then the rest.
pub(super) struct Primed {
    stream: TcpStream,
    head: Vec<u8>,
    at: usize,
}

impl Primed {
    pub(super) fn new(stream: TcpStream, head: Vec<u8>) -> Primed {
        Primed {
            stream,
            head,
            at: 0,
        }
    }
}

impl AsyncRead for Primed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.head.len() {
            let n = buf.remaining().min(this.head.len() - this.at);
            buf.put_slice(&this.head[this.at..this.at + n]);
            this.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Primed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
