//! Layer-4 upstreams for TCPRoute / TLSRoute tests: a named TCP echo server, the same behind
//! TLS with its own certificate, and clients that say which upstream answered.
//!
//! Protocol: on accept the server writes its name and `\n`, then echoes every byte until the
//! client closes. A client therefore learns which upstream it reached from the first line and
//! that the path carries data both ways from the echo. The TLS server presents a certificate
//! for its own hostname (rcgen, self-signed); [`tls_hello`] trusts only the certificate it is
//! given, so a handshake that succeeds proves which server terminated it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Bound on every client step (connect, handshake, read): a test never hangs on a dead path.
const STEP: Duration = Duration::from_secs(10);

/// A named echo server on `127.0.0.1:<ephemeral>` (plain TCP or TLS); stops on drop, with
/// every connection it serves.
pub struct EchoServer {
    name: String,
    addr: SocketAddr,
    cert_pem: Option<String>,
    accepted: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EchoServer {
    /// A plain TCP echo server.
    pub async fn tcp(name: &str) -> Result<EchoServer> {
        Self::start(name, None).await
    }

    /// A TLS echo server presenting a self-signed certificate for `hostname`.
    pub async fn tls(name: &str, hostname: &str) -> Result<EchoServer> {
        let params = rcgen::CertificateParams::new(vec![hostname.to_owned()])?;
        let key = rcgen::KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::try_from(key.serialize_der()).map_err(anyhow::Error::msg)?,
            )?;
        Self::start(
            name,
            Some((
                tokio_rustls::TlsAcceptor::from(Arc::new(config)),
                cert.pem(),
            )),
        )
        .await
    }

    async fn start(
        name: &str,
        tls: Option<(tokio_rustls::TlsAcceptor, String)>,
    ) -> Result<EchoServer> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let accepted = Arc::new(AtomicU64::new(0));
        let (acceptor, cert_pem) = match tls {
            Some((a, c)) => (Some(a), Some(c)),
            None => (None, None),
        };
        let (n, count) = (name.to_owned(), accepted.clone());
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    r = listener.accept() => {
                        let Ok((sock, _)) = r else { continue };
                        count.fetch_add(1, Ordering::Relaxed);
                        let (n, acceptor) = (n.clone(), acceptor.clone());
                        conns.spawn(async move {
                            match acceptor {
                                Some(a) => {
                                    if let Ok(s) = a.accept(sock).await {
                                        let _ = echo(s, &n).await;
                                    }
                                }
                                None => {
                                    let _ = echo(sock, &n).await;
                                }
                            }
                        });
                    }
                    // Reap finished connections (the set aborts the rest when dropped).
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        Ok(EchoServer {
            name: name.to_owned(),
            addr,
            cert_pem,
            accepted,
            task,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The certificate (PEM) a TLS server presents; `None` for plain TCP.
    pub fn cert_pem(&self) -> Option<&str> {
        self.cert_pem.as_deref()
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

async fn echo<S: AsyncRead + AsyncWrite + Unpin>(s: S, name: &str) -> std::io::Result<()> {
    let (r, mut w) = tokio::io::split(s);
    w.write_all(format!("{name}\n").as_bytes()).await?;
    w.flush().await?;
    let mut r = BufReader::new(r);
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).await? == 0 {
            return w.shutdown().await;
        }
        w.write_all(line.as_bytes()).await?;
        w.flush().await?;
    }
}

/// An open client connection to an echo server (possibly through Envoy).
pub struct EchoConn<S> {
    /// The name of the server that answered.
    pub server: String,
    r: BufReader<tokio::io::ReadHalf<S>>,
    w: tokio::io::WriteHalf<S>,
}

impl<S: AsyncRead + AsyncWrite> EchoConn<S> {
    async fn open(s: S) -> Result<EchoConn<S>> {
        let (r, w) = tokio::io::split(s);
        let mut r = BufReader::new(r);
        let mut server = String::new();
        tokio::time::timeout(STEP, r.read_line(&mut server))
            .await
            .context("timed out waiting for the server's name")??;
        if !server.ends_with('\n') {
            bail!("connection closed before the server said its name");
        }
        server.pop();
        Ok(EchoConn { server, r, w })
    }

    /// Sends one line and checks it comes back.
    pub async fn roundtrip(&mut self, msg: &str) -> Result<()> {
        self.w.write_all(format!("{msg}\n").as_bytes()).await?;
        self.w.flush().await?;
        let mut line = String::new();
        tokio::time::timeout(STEP, self.r.read_line(&mut line))
            .await
            .context("timed out waiting for the echo")??;
        if line != format!("{msg}\n") {
            bail!("echo {line:?} instead of {msg:?}");
        }
        Ok(())
    }
}

/// Connects over plain TCP; returns the connection once the server said its name.
pub async fn tcp_hello(addr: SocketAddr) -> Result<EchoConn<TcpStream>> {
    tcp_hello_with(addr, b"").await
}

/// [`tcp_hello`] sending `preface` first (e.g. a PROXY protocol header).
pub async fn tcp_hello_with(addr: SocketAddr, preface: &[u8]) -> Result<EchoConn<TcpStream>> {
    let mut s = tokio::time::timeout(STEP, TcpStream::connect(addr))
        .await
        .context("connect timed out")??;
    if !preface.is_empty() {
        s.write_all(preface).await?;
    }
    EchoConn::open(s).await
}

/// Connects over TLS with SNI `sni`, trusting only `cert_pem` (the certificate the expected
/// server presents); returns the connection once the server said its name.
pub async fn tls_hello(
    addr: SocketAddr,
    sni: &str,
    cert_pem: &str,
) -> Result<EchoConn<tokio_rustls::client::TlsStream<TcpStream>>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(cert_pem.as_bytes()) {
        roots.add(c?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::time::timeout(STEP, TcpStream::connect(addr))
        .await
        .context("connect timed out")??;
    let s = tokio::time::timeout(
        STEP,
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from(sni.to_owned())?, tcp),
    )
    .await
    .context("TLS handshake timed out")??;
    EchoConn::open(s).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tcp_and_tls_echo_name_themselves() {
        let t = EchoServer::tcp("plain").await.unwrap();
        let mut c = tcp_hello(t.addr()).await.unwrap();
        assert_eq!(c.server, "plain");
        c.roundtrip("hello").await.unwrap();
        let s = EchoServer::tls("secure", "a.example").await.unwrap();
        let mut c = tls_hello(s.addr(), "a.example", s.cert_pem().unwrap())
            .await
            .unwrap();
        assert_eq!(c.server, "secure");
        c.roundtrip("hello").await.unwrap();
        // Another server's certificate does not verify this one.
        let other = EchoServer::tls("other", "a.example").await.unwrap();
        assert!(
            tls_hello(s.addr(), "a.example", other.cert_pem().unwrap())
                .await
                .is_err()
        );
        assert_eq!(s.accepted(), 2);
    }
}
