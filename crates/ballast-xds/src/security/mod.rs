//! Transport security and authorization for the xDS port.
//!
//! - [`TlsReloader`]: TLS/mTLS with rustls (ring), certificate files re-read when they change.
//! - [`PeerIdentity`]: who is on the other end of a connection (client certificate SANs).
//! - [`Admission`]: the stream-admission hook deciding which groups an identity may be served.
//!
//! The pieces are generic: the library knows nothing of gateways or SPIFFE
//! naming rules; the binary plugs its policy into [`admission::Admission`].

pub(crate) mod admission;
pub(crate) mod identity;
pub(crate) mod listen;
#[cfg(feature = "tls")]
pub(crate) mod tls;

pub use admission::{Access, Admission, AdmissionRequest, Rejection, RejectionRecord};
pub use identity::{ConnInfo, PeerIdentity};
#[cfg(feature = "tls")]
pub use tls::{TlsFiles, TlsReloader};

/// Errors loading certificates or keys; each names the file it is about.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecurityError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// A file was read but holds no usable certificate or key.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// rustls refused the certificate and key together.
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// A client certificate could not be parsed.
    #[error("client certificate: {0}")]
    Certificate(String),
}
