//! Transport security and authorization for the xDS port.
//!
//! - [`tls`]: TLS/mTLS with rustls (ring), certificate files re-read when they change.
//! - [`identity`]: who is on the other end of a connection (client certificate SANs).
//! - [`admission`]: the stream-admission hook deciding which groups an identity may be served.
//!
//! The pieces are generic: the library knows nothing of gateways or SPIFFE
//! naming rules; the binary plugs its policy into [`admission::Admission`].

pub mod admission;
pub mod identity;
pub mod tls;

pub use admission::{Access, Admission, AdmissionRequest, Rejection, RejectionRecord};
pub use identity::{ConnInfo, PeerIdentity};
pub use tls::{TlsFiles, TlsReloader};

/// Errors loading certificates or keys; each names the file it is about.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    #[error("TLS configuration: {0}")]
    Tls(String),
    #[error("client certificate: {0}")]
    Certificate(String),
}
