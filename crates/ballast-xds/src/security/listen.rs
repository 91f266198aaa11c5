//! The xDS port's accept loop: plaintext, or TLS with the `tls` feature
//! (handshakes in their own tasks, see `super::tls`). Each connection carries
//! a [`ConnInfo`] (remote address, client certificate identity) to the
//! handlers through tonic's `Connected`.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tracing::warn;

use super::identity::{ConnInfo, PeerIdentity};

/// The TLS configuration of the xDS port; uninhabited without the `tls`
/// feature, so a server built without it can only be plaintext.
#[cfg(feature = "tls")]
pub(crate) type TlsHandle = Arc<super::tls::TlsReloader>;
/// The TLS configuration of the xDS port; uninhabited without the `tls`
/// feature, so a server built without it can only be plaintext.
#[cfg(not(feature = "tls"))]
pub(crate) type TlsHandle = std::convert::Infallible;

/// One accepted connection on the xDS port, plaintext or TLS; tells tonic
/// (and through request extensions, the handlers) who is on the other end.
pub(crate) enum ServerConn {
    Plain(TcpStream, ConnInfo),
    #[cfg(feature = "tls")]
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>, ConnInfo),
}

impl tonic::transport::server::Connected for ServerConn {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> ConnInfo {
        match self {
            ServerConn::Plain(_, c) => c.clone(),
            #[cfg(feature = "tls")]
            ServerConn::Tls(_, c) => c.clone(),
        }
    }
}

impl AsyncRead for ServerConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerConn::Plain(s, _) => Pin::new(s).poll_read(cx, buf),
            #[cfg(feature = "tls")]
            ServerConn::Tls(s, _) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ServerConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ServerConn::Plain(s, _) => Pin::new(s).poll_write(cx, buf),
            #[cfg(feature = "tls")]
            ServerConn::Tls(s, _) => Pin::new(s).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ServerConn::Plain(s, _) => Pin::new(s).poll_write_vectored(cx, bufs),
            #[cfg(feature = "tls")]
            ServerConn::Tls(s, _) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            ServerConn::Plain(s, _) => s.is_write_vectored(),
            #[cfg(feature = "tls")]
            ServerConn::Tls(s, _) => s.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerConn::Plain(s, _) => Pin::new(s).poll_flush(cx),
            #[cfg(feature = "tls")]
            ServerConn::Tls(s, _) => Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerConn::Plain(s, _) => Pin::new(s).poll_shutdown(cx),
            #[cfg(feature = "tls")]
            ServerConn::Tls(s, _) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Idle time before the kernel probes a silent peer.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// Time between two probes.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Probes that go unanswered before the connection is dropped.
const KEEPALIVE_PROBES: u32 = 3;
/// How long sent data may stay unacknowledged (a peer that vanished while a
/// push was on the wire) before the connection is dropped. Linux also counts
/// a window held shut that long: a client that stops reading for a minute is
/// dropped, and reconnects to be resumed from what it holds.
const UNACKED_TIMEOUT: Duration = Duration::from_secs(60);

/// Makes the kernel find a peer that is gone (its host died, a network
/// partition) without our help: keepalive probes on an idle connection,
/// and a bound on unacknowledged data on a busy one. Both cost nothing per
/// message, unlike HTTP/2 PINGs (see `serve_with_shutdown`); a proxy whose
/// host died is closed within about a minute either way, so its stream and
/// its registry entry do not linger.
fn dead_peer_detection(sock: &socket2::SockRef<'_>) -> io::Result<()> {
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL);
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "macos"))]
    let keepalive = keepalive.with_retries(KEEPALIVE_PROBES);
    sock.set_tcp_keepalive(&keepalive)?;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    sock.set_tcp_user_timeout(Some(UNACKED_TIMEOUT))?;
    Ok(())
}

/// Responses are written as soon as they are planned and a client's next
/// request waits for them: Nagle's algorithm would hold a small write
/// behind the TCP ACK of the previous one (a delayed ACK: up to 40 ms on
/// Linux) on every busy stream. So: TCP_NODELAY, and [`dead_peer_detection`].
fn connection_options(tcp: &impl std::os::fd::AsFd) -> io::Result<()> {
    let sock = socket2::SockRef::from(tcp);
    sock.set_tcp_nodelay(true)?;
    dead_peer_detection(&sock)
}

/// Linux copies a listening socket's TCP options to every connection it
/// accepts: set once on the listener, they cost no system call per
/// connection (six `setsockopt`s each, 0.8 % of a reconnect storm, W5).
/// Elsewhere, or if the listener refuses them, each connection gets them.
fn options_inherited(listener: &TcpListener) -> bool {
    if !cfg!(any(target_os = "linux", target_os = "android")) {
        return false;
    }
    match connection_options(listener) {
        Ok(()) => true,
        Err(e) => {
            warn!(error = %e, "could not set TCP options on the xDS listener; setting them per connection");
            false
        }
    }
}

/// Accepted connections for tonic: TLS handshakes run in their own tasks so
/// a slow or hostile client never delays the others. Ends when the server
/// drops the stream.
pub(crate) fn incoming(
    listener: TcpListener,
    tls: Option<&TlsHandle>,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<ServerConn>> {
    let tls = tls.cloned();
    let (tx, rx) = mpsc::channel(64);
    let inherited = options_inherited(&listener);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                r = listener.accept() => r,
            };
            let (tcp, remote) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    warn!(error = %e, "xDS accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if !inherited && let Err(e) = connection_options(&tcp) {
                warn!(error = %e, "could not set TCP_NODELAY and keepalive on an xDS connection");
            }
            match &tls {
                None => {
                    let conn = ServerConn::Plain(tcp, conn_info(remote, None));
                    if tx.send(Ok(conn)).await.is_err() {
                        return;
                    }
                }
                #[cfg(feature = "tls")]
                Some(tls) => {
                    let (tls, tx) = (tls.clone(), tx.clone());
                    tokio::spawn(async move { super::tls::handshake(tls, tcp, remote, tx).await });
                }
                #[cfg(not(feature = "tls"))]
                Some(never) => match *never {},
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

pub(crate) fn conn_info(remote: SocketAddr, peer: Option<Arc<PeerIdentity>>) -> ConnInfo {
    ConnInfo {
        remote: Some(remote),
        peer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    /// Every accepted plaintext connection has Nagle's algorithm off, so a
    /// push is not held behind the TCP ACK of the one before (W2 p99), and
    /// TCP keepalive plus a bound on unacknowledged data on. On Linux they
    /// are set on the listener only: this proves the kernel copies them.
    #[tokio::test]
    async fn accepted_connections_have_nodelay_and_keepalive() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut conns = incoming(listener, None);
        let _client = TcpStream::connect(addr).await.expect("connect");
        let conn = tokio::time::timeout(Duration::from_secs(10), conns.next())
            .await
            .expect("accepted in time")
            .expect("a connection")
            .expect("no accept error");
        match conn {
            ServerConn::Plain(tcp, _) => {
                assert!(tcp.nodelay().expect("nodelay"));
                // The kernel finds dead peers (no HTTP/2 PINGs).
                let sock = socket2::SockRef::from(&tcp);
                assert!(sock.keepalive().expect("SO_KEEPALIVE"));
                assert_eq!(sock.tcp_keepalive_time().expect("idle"), KEEPALIVE_IDLE);
                assert_eq!(
                    sock.tcp_keepalive_interval().expect("interval"),
                    KEEPALIVE_INTERVAL
                );
                #[cfg(target_os = "linux")]
                {
                    assert_eq!(
                        sock.tcp_keepalive_retries().expect("probes"),
                        KEEPALIVE_PROBES
                    );
                    assert_eq!(
                        sock.tcp_user_timeout().expect("user timeout"),
                        Some(UNACKED_TIMEOUT)
                    );
                }
            }
            #[cfg(feature = "tls")]
            ServerConn::Tls(..) => unreachable!("plaintext listener"),
        }
    }
}
