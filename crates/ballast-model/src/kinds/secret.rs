//! `v1` `Secret` of type `kubernetes.io/tls`: a certificate chain and private key served over SDS.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use super::{Metadata, Source};
use crate::spanned::Spanned;

/// The only Secret type ballast accepts.
pub const TLS_SECRET_TYPE: &str = "kubernetes.io/tls";

/// A TLS Secret, decoded (base64 `data` and plain `stringData` merged, `stringData` winning as in
/// Kubernetes).
#[derive(Clone)]
pub struct Secret {
    pub metadata: Metadata,
    pub tls: TlsKeyPair,
    pub source: Source,
}

impl Secret {
    pub const KIND: super::Kind = super::Kind::Secret;
    pub fn key(&self) -> super::ObjectKey {
        self.metadata.key()
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.metadata == other.metadata && self.tls == other.tls
    }
}
impl Eq for Secret {}

/// Manual so that logs and `{:?}` of a config never print a private key.
impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("metadata", &self.metadata)
            .field("tls", &self.tls)
            .field("source", &self.source)
            .finish()
    }
}

/// PEM text of `tls.crt`, `tls.key` and the optional `ca.crt`.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsKeyPair {
    pub certificate_chain: String,
    pub private_key: String,
    pub ca_certificate: Option<String>,
}

impl fmt::Debug for TlsKeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsKeyPair")
            .field("certificate_chain", &self.certificate_chain)
            .field("private_key", &"<redacted>")
            .field("ca_certificate", &self.ca_certificate)
            .finish()
    }
}

/// The Secret document as written; [`crate::validate`] turns it into a [`Secret`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct SecretDoc {
    #[allow(dead_code)] // checked from the document header before this parse
    pub api_version: String,
    #[allow(dead_code)]
    pub kind: String,
    pub metadata: Metadata,
    #[serde(rename = "type")]
    pub type_: Option<Spanned<String>>,
    #[serde(default)]
    pub data: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    pub string_data: BTreeMap<String, Spanned<String>>,
    /// Kubernetes field; meaningless for files but harmless.
    #[serde(default)]
    #[allow(dead_code)]
    pub immutable: Option<bool>,
}
