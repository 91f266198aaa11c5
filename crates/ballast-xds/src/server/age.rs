//! Maximum connection age: each xDS connection is closed after a jittered age, so that after a
//! scale-out the Envoys spread over the new replicas instead of staying on the old ones forever
//! (gRPC's `MAX_CONNECTION_AGE`).
//!
//! The connection is closed, not drained with GOAWAY: tonic has no per-connection hook for that.
//! It costs Envoy nothing (it keeps its config, reconnects, and a replica at the same store
//! revision sends nothing it already has: invariant 5), and the ±10% jitter keeps a fleet
//! connected at the same moment from reconnecting at the same moment.

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `age` ±10%, chosen at random per connection.
pub(crate) fn jittered(age: Duration) -> Duration {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(age.as_nanos() as u64);
    let unit = (h.finish() % 10_001) as f64 / 10_000.0; // 0..=1
    age.mul_f64(0.9 + 0.2 * unit)
}

/// A connection that reads as closed by the peer once its age is reached: the HTTP/2 server
/// then ends every stream on it and drops (closes) the socket.
pub(crate) struct Aged<C> {
    inner: C,
    deadline: Option<Pin<Box<Sleep>>>,
    expired: bool,
}

impl<C> Aged<C> {
    pub(crate) fn new(inner: C, max_age: Option<Duration>) -> Self {
        Aged {
            inner,
            deadline: max_age.map(|a| Box::pin(tokio::time::sleep(jittered(a)))),
            expired: false,
        }
    }
}

impl<C: tonic::transport::server::Connected> tonic::transport::server::Connected for Aged<C> {
    type ConnectInfo = C::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<C: AsyncRead + Unpin> AsyncRead for Aged<C> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(d) = &mut this.deadline
            && d.as_mut().poll(cx).is_ready()
        {
            this.deadline = None;
            this.expired = true;
            tracing::debug!("xDS connection reached its maximum age; closing it");
        }
        if this.expired {
            return Poll::Ready(Ok(())); // end of stream
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<C: AsyncWrite + Unpin> AsyncWrite for Aged<C> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn jitter_stays_within_ten_percent_and_varies() {
        let age = Duration::from_secs(100);
        let all: Vec<Duration> = (0..200).map(|_| jittered(age)).collect();
        assert!(
            all.iter()
                .all(|d| *d >= age.mul_f64(0.9) && *d <= age.mul_f64(1.1))
        );
        assert!(all.iter().any(|d| *d != all[0]), "jitter varies");
    }

    #[tokio::test(start_paused = true)]
    async fn reads_end_at_the_age() {
        let (a, mut b) = tokio::io::duplex(64);
        let start = tokio::time::Instant::now();
        let mut aged = Aged::new(a, Some(Duration::from_secs(10)));
        b.write_all(b"x").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(aged.read(&mut buf).await.unwrap(), 1);
        // Nothing more arrives; at the age the read ends (EOF) though the peer is still there.
        assert_eq!(aged.read(&mut buf).await.unwrap(), 0);
        // (Paused clock: this is the timer's time, not the wall clock's.)
        assert!(start.elapsed() >= Duration::from_secs(9));
        drop(b);
        // Without an age, a connection whose peer stays is read from forever.
        let (c, _peer) = tokio::io::duplex(8);
        let mut forever = Aged::new(c, None);
        assert!(
            tokio::time::timeout(Duration::from_secs(3600), forever.read(&mut buf))
                .await
                .is_err()
        );
    }
}
