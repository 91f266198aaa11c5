//! The identity a client proves with its certificate, read once per
//! connection and carried to every request on it.

use std::net::SocketAddr;
use std::sync::Arc;

#[cfg(feature = "tls")]
use x509_parser::extensions::GeneralName;
#[cfg(feature = "tls")]
use x509_parser::prelude::{FromDer, X509Certificate};

#[cfg(feature = "tls")]
use super::SecurityError;

/// What a verified client certificate says about its holder. Only the
/// leaf certificate is read; its chain was verified during the handshake.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerIdentity {
    /// URI SANs (SPIFFE IDs live here).
    pub uris: Vec<String>,
    /// DNS SANs.
    pub dns: Vec<String>,
    /// Subject distinguished name, for messages.
    pub subject: String,
    /// Serial number, hex, for messages and audits.
    pub serial: String,
}

impl PeerIdentity {
    #[cfg(feature = "tls")]
    /// Parses a DER certificate (x509-parser: a maintained, pure-Rust parser
    /// from the rusticata project; rustls exposes no SAN accessors).
    pub fn from_der(der: &[u8]) -> Result<PeerIdentity, SecurityError> {
        let (_, cert) = X509Certificate::from_der(der)
            .map_err(|e| SecurityError::Certificate(e.to_string()))?;
        let mut id = PeerIdentity {
            subject: cert.subject().to_string(),
            serial: cert.raw_serial_as_string(),
            ..Default::default()
        };
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::URI(u) => id.uris.push(u.to_string()),
                    GeneralName::DNSName(d) => id.dns.push(d.to_string()),
                    _ => {}
                }
            }
        }
        Ok(id)
    }

    /// A short name for messages: the first URI SAN, else DNS SAN, else subject.
    pub fn display_name(&self) -> String {
        self.uris
            .first()
            .or(self.dns.first())
            .cloned()
            .unwrap_or_else(|| self.subject.clone())
    }
}

/// Connection info set on every request's extensions by the xDS server's
/// listener (tonic's `Connected`): where it comes from and, with mTLS, who it is.
#[derive(Debug, Clone, Default)]
pub struct ConnInfo {
    /// The peer's address.
    pub remote: Option<SocketAddr>,
    /// Its client certificate's identity (mTLS only).
    pub peer: Option<Arc<PeerIdentity>>,
}

impl ConnInfo {
    /// The peer identity of a request served by [`crate::XdsServer`], if any.
    pub fn peer_of(ext: &http::Extensions) -> Option<Arc<PeerIdentity>> {
        ext.get::<ConnInfo>().and_then(|c| c.peer.clone())
    }
}
