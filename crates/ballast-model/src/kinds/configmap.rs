//! `v1` `ConfigMap`: plain data, here for CA bundles (`ca.crt`) that `BackendTLSPolicy`
//! `caCertificateRefs` name (Gateway API's convention). Only `data` is read.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{Metadata, Source};
use crate::spanned::Spanned;

#[derive(Clone, Debug)]
pub struct ConfigMap {
    pub metadata: Metadata,
    pub data: BTreeMap<String, String>,
    pub source: Source,
}

impl ConfigMap {
    pub const KIND: super::Kind = super::Kind::ConfigMap;
    pub fn key(&self) -> super::ObjectKey {
        self.metadata.key()
    }
}

impl PartialEq for ConfigMap {
    fn eq(&self, other: &Self) -> bool {
        self.metadata == other.metadata && self.data == other.data
    }
}
impl Eq for ConfigMap {}

/// The ConfigMap document as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ConfigMapDoc {
    #[allow(dead_code)] // checked from the document header before this parse
    pub api_version: String,
    #[allow(dead_code)]
    pub kind: String,
    pub metadata: Metadata,
    #[serde(default)]
    pub data: BTreeMap<String, Spanned<String>>,
    /// Kubernetes fields; ignored.
    #[serde(default)]
    #[allow(dead_code)]
    pub binary_data: Option<BTreeMap<String, String>>,
    #[serde(default)]
    #[allow(dead_code)]
    pub immutable: Option<bool>,
}

impl ConfigMapDoc {
    pub(crate) fn into_config_map(self, source: Source) -> ConfigMap {
        ConfigMap {
            metadata: self.metadata,
            data: self.data.into_iter().map(|(k, v)| (k, v.value)).collect(),
            source,
        }
    }
}
