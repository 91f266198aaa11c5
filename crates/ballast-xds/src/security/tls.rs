//! TLS and mTLS for the xDS port (rustls with the `ring` provider: no
//! OpenSSL, no cmake). Certificate, key and client CA files are re-read on
//! every accepted connection and the server configuration is rebuilt when
//! their content changes, so rotation needs no restart: new connections get
//! the new certificate, open streams keep theirs. A broken or half-written
//! set of files never replaces the last good one.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rustls::RootCertStore;
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::SecurityError;
use super::identity::PeerIdentity;
use super::listen::{ServerConn, conn_info};

/// A client that has not finished its handshake by then is dropped (a
/// silent client must not hold a task forever).
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the xDS port's certificate material lives (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Server certificate chain, leaf first.
    pub cert: PathBuf,
    /// The server certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA bundle for client certificates: when set, every client must present
    /// a certificate signed by it (mTLS); without it, TLS only.
    pub client_ca: Option<PathBuf>,
}

struct Loaded {
    inputs: Vec<Vec<u8>>,
    config: Arc<ServerConfig>,
    serial: String,
}

/// The current rustls server configuration, rebuilt when the files change.
pub struct TlsReloader {
    files: TlsFiles,
    loaded: Mutex<Loaded>,
    reloads: AtomicU64,
    reload_errors: AtomicU64,
    handshake_failures: AtomicU64,
}

fn read(path: &Path) -> Result<Vec<u8>, SecurityError> {
    std::fs::read(path).map_err(|source| SecurityError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn invalid(path: &Path, message: impl std::fmt::Display) -> SecurityError {
    SecurityError::Invalid {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

fn certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, SecurityError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(path, e))?;
    if certs.is_empty() {
        return Err(invalid(path, "no PEM certificate found"));
    }
    Ok(certs)
}

impl TlsFiles {
    fn read_inputs(&self) -> Result<Vec<Vec<u8>>, SecurityError> {
        let mut v = vec![read(&self.cert)?, read(&self.key)?];
        if let Some(ca) = &self.client_ca {
            v.push(read(ca)?);
        }
        Ok(v)
    }

    fn build(&self, inputs: &[Vec<u8>]) -> Result<(ServerConfig, String), SecurityError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certs(&self.cert, &inputs[0])?;
        let serial = PeerIdentity::from_der(&chain[0])
            .map(|id| id.serial)
            .map_err(|e| invalid(&self.cert, e))?;
        let key = PrivateKeyDer::from_pem_slice(&inputs[1]).map_err(|e| invalid(&self.key, e))?;
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| SecurityError::Tls(e.to_string()))?;
        let builder = match &self.client_ca {
            Some(ca_path) => {
                let mut roots = RootCertStore::empty();
                for c in certs(ca_path, &inputs[2])? {
                    roots.add(c).map_err(|e| invalid(ca_path, e))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| invalid(ca_path, e))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| {
            invalid(
                &self.key,
                format!("does not fit {}: {e}", self.cert.display()),
            )
        })?;
        // gRPC needs h2; REST-JSON clients may speak HTTP/1.1.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok((config, serial))
    }
}

impl TlsReloader {
    /// Loads the files once; an error here names the file and stops start-up.
    pub fn new(files: TlsFiles) -> Result<TlsReloader, SecurityError> {
        let inputs = files.read_inputs()?;
        let (config, serial) = files.build(&inputs)?;
        info!(cert = %files.cert.display(), %serial, mtls = files.client_ca.is_some(), "xDS TLS certificate loaded");
        Ok(TlsReloader {
            files,
            loaded: Mutex::new(Loaded {
                inputs,
                config: Arc::new(config),
                serial,
            }),
            reloads: AtomicU64::new(0),
            reload_errors: AtomicU64::new(0),
            handshake_failures: AtomicU64::new(0),
        })
    }

    /// The files this reloader reads.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// Whether clients must present a certificate.
    pub fn mutual(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// The configuration for the next connection: re-reads the files (a few
    /// KiB) and rebuilds when they changed and are valid.
    pub fn current(&self) -> Arc<ServerConfig> {
        match self.files.read_inputs() {
            Ok(inputs) => {
                if self.loaded.lock().inputs == inputs {
                    return self.loaded.lock().config.clone();
                }
                match self.files.build(&inputs) {
                    Ok((config, serial)) => {
                        let config = Arc::new(config);
                        let mut l = self.loaded.lock();
                        info!(old = %l.serial, new = %serial, "xDS TLS files changed: new connections get the new certificate");
                        *l = Loaded {
                            inputs,
                            config: config.clone(),
                            serial,
                        };
                        self.reloads.fetch_add(1, Ordering::Relaxed);
                        config
                    }
                    Err(e) => {
                        self.reload_errors.fetch_add(1, Ordering::Relaxed);
                        warn!(error = %e, "xDS TLS files changed but are not usable (yet): keeping the last good certificate");
                        self.loaded.lock().config.clone()
                    }
                }
            }
            Err(e) => {
                self.reload_errors.fetch_add(1, Ordering::Relaxed);
                warn!(error = %e, "xDS TLS files unreadable: keeping the last good certificate");
                self.loaded.lock().config.clone()
            }
        }
    }

    /// Serial (hex) of the certificate new connections get.
    pub fn serial(&self) -> String {
        self.loaded.lock().serial.clone()
    }

    /// (reloads applied, reloads refused, handshakes refused) since start.
    pub fn counters(&self) -> (u64, u64, u64) {
        (
            self.reloads.load(Ordering::Relaxed),
            self.reload_errors.load(Ordering::Relaxed),
            self.handshake_failures.load(Ordering::Relaxed),
        )
    }
}

/// Completes a TLS handshake (bounded by [`HANDSHAKE_TIMEOUT`]) and hands
/// the connection, with the client certificate's identity, to the server.
pub(crate) async fn handshake(
    tls: Arc<TlsReloader>,
    tcp: TcpStream,
    remote: SocketAddr,
    tx: mpsc::Sender<io::Result<ServerConn>>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tls.handshake_failures.fetch_add(1, Ordering::Relaxed);
            debug!(%remote, error = %e, "xDS TLS handshake refused");
            return;
        }
        Err(_) => {
            tls.handshake_failures.fetch_add(1, Ordering::Relaxed);
            debug!(%remote, "xDS TLS handshake timed out");
            return;
        }
    };
    let peer = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| match PeerIdentity::from_der(c) {
            Ok(id) => Some(Arc::new(id)),
            Err(e) => {
                warn!(%remote, error = %e, "client certificate verified but unreadable");
                None
            }
        });
    let _ = tx
        .send(Ok(ServerConn::Tls(
            Box::new(stream),
            conn_info(remote, peer),
        )))
        .await;
}
