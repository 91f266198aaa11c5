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
///
/// Also the bound of a graceful stop: a stream runs in its response body, which the HTTP/2
/// server polls only while the stream has send capacity, so a client that stopped reading
/// keeps its stream (its permit, its registry entry) and its connection. Once the server
/// drains, such a connection is abandoned after the shutdown grace: it reads as closed and
/// its writes fail, and the HTTP/2 server drops it with its streams.
pub(crate) struct Aged<C> {
    inner: C,
    deadline: Option<Pin<Box<Sleep>>>,
    expired: bool,
    drain: Option<(super::drain::Drain, Duration)>,
    /// The drain was seen: `deadline` is now the end of the grace.
    draining: bool,
    abandoned: bool,
}

impl<C> Aged<C> {
    /// `drain`: the server's drain signal and its shutdown grace.
    pub(crate) fn new(
        inner: C,
        max_age: Option<Duration>,
        drain: Option<(super::drain::Drain, Duration)>,
    ) -> Self {
        Aged {
            inner,
            deadline: max_age.map(|a| Box::pin(tokio::time::sleep(jittered(a)))),
            expired: false,
            drain,
            draining: false,
            abandoned: false,
        }
    }

    /// Whether the grace after a drain is over (until the drain, an atomic
    /// load per I/O: `drain::Drain`). The grace starts when the connection first sees
    /// the drain: at once, as the server then writes its GOAWAY.
    fn abandoned(&mut self, cx: &mut Context<'_>) -> bool {
        if self.abandoned {
            return true;
        }
        let Some((token, grace)) = &self.drain else {
            return false;
        };
        if !self.draining {
            if !token.is_cancelled() {
                return false;
            }
            self.draining = true;
            let end = tokio::time::Instant::now() + *grace;
            match &mut self.deadline {
                // The age comes first: it stays (reads end then).
                Some(d) if d.deadline() <= end => {}
                Some(d) => d.as_mut().reset(end),
                None => self.deadline = Some(Box::pin(tokio::time::sleep_until(end))),
            }
        }
        if let Some(d) = &mut self.deadline
            && d.as_mut().poll(cx).is_ready()
        {
            self.deadline = None;
            self.abandoned = true;
            tracing::debug!("xDS connection still open after the shutdown grace; closing it");
        }
        self.abandoned
    }

    fn gone() -> io::Error {
        io::Error::new(
            io::ErrorKind::BrokenPipe,
            "abandoned after the shutdown grace",
        )
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
        if this.abandoned(cx) {
            return Poll::Ready(Ok(())); // end of stream
        }
        if !this.draining
            && let Some(d) = &mut this.deadline
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
        let this = self.get_mut();
        if this.abandoned(cx) {
            return Poll::Ready(Err(Self::gone()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.abandoned(cx) {
            return Poll::Ready(Err(Self::gone()));
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.abandoned(cx) {
            return Poll::Ready(Err(Self::gone()));
        }
        Pin::new(&mut this.inner).poll_flush(cx)
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
        let mut aged = Aged::new(a, Some(Duration::from_secs(10)), None);
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
        let mut forever = Aged::new(c, None, None);
        assert!(
            tokio::time::timeout(Duration::from_secs(3600), forever.read(&mut buf))
                .await
                .is_err()
        );
    }

    /// Once the server drains, a connection that is still open after the
    /// grace reads as closed and its writes fail, so the HTTP/2 server drops
    /// it with its streams (whose bodies it no longer polled).
    #[tokio::test(start_paused = true)]
    async fn a_connection_is_abandoned_a_grace_after_the_drain() {
        let (a, mut b) = tokio::io::duplex(64);
        let drain = crate::server::drain::Drain::new();
        let grace = Duration::from_secs(5);
        let mut conn = Aged::new(a, None, Some((drain.clone(), grace)));
        let mut buf = [0u8; 8];
        // Before the drain, and during the grace, it is the connection.
        b.write_all(b"x").await.unwrap();
        assert_eq!(conn.read(&mut buf).await.unwrap(), 1);
        drain.cancel();
        let start = tokio::time::Instant::now();
        conn.write_all(b"goaway").await.unwrap();
        b.write_all(b"y").await.unwrap();
        assert_eq!(conn.read(&mut buf).await.unwrap(), 1);
        // Then reads end and writes fail, though the peer is still there.
        assert_eq!(conn.read(&mut buf).await.unwrap(), 0);
        assert!(start.elapsed() >= grace);
        let e = conn.write_all(b"z").await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe);
        drop(b);
        // Without a drain, the same connection is read from forever.
        let (c, _peer) = tokio::io::duplex(8);
        let mut forever = Aged::new(c, None, Some((crate::server::drain::Drain::new(), grace)));
        assert!(
            tokio::time::timeout(Duration::from_secs(3600), forever.read(&mut buf))
                .await
                .is_err()
        );
    }
}
