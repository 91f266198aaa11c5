//! TLS Secrets → SDS `Secret` with an inline certificate chain and private key.

use ballast_model::Secret;
use envoy_types::pb::envoy::config::core::v3::DataSource;
use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::secret::Type as SecretType;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    Secret as EnvoySecret, TlsCertificate,
};

use crate::names;

/// The SDS secret of a TLS Secret. `ca.crt` is not used: ballast terminates TLS without client
/// certificate validation.
pub(crate) fn secret(s: &Secret) -> EnvoySecret {
    let inline = |text: &str| {
        Some(DataSource {
            specifier: Some(Specifier::InlineBytes(text.as_bytes().to_vec())),
            ..Default::default()
        })
    };
    EnvoySecret {
        name: names::secret(&s.key()),
        r#type: Some(SecretType::TlsCertificate(TlsCertificate {
            certificate_chain: inline(&s.tls.certificate_chain),
            private_key: inline(&s.tls.private_key),
            ..Default::default()
        })),
    }
}
