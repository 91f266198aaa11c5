//! `gateway.networking.k8s.io/v1` `Gateway`: where Envoy listens.

use std::net::IpAddr;

use serde::Deserialize;

use super::{Metadata, Source, object_kind};
use crate::spanned::{Pos, Spanned};

/// A Gateway: a set of listeners an Envoy fleet (the proxies whose node names it) serves.
#[derive(Clone, Debug)]
pub struct Gateway {
    pub metadata: Metadata,
    pub spec: GatewaySpec,
    pub source: Source,
}
object_kind!(Gateway, super::Kind::Gateway);

impl Gateway {
    pub fn listener(&self, name: &str) -> Option<&Listener> {
        self.spec.listeners.iter().find(|l| *l.name == name)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GatewaySpec {
    /// Carried for Kubernetes compatibility; ballast serves every Gateway it is given.
    pub gateway_class_name: String,
    /// Addresses Envoy listeners bind to; none means `0.0.0.0`.
    #[serde(default)]
    pub addresses: Vec<GatewayAddress>,
    pub listeners: Vec<Listener>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayAddress {
    #[serde(rename = "type", default)]
    pub type_: AddressType,
    pub value: Spanned<IpAddr>,
}

/// Only IP addresses: Envoy binds sockets, it does not resolve names to bind to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum AddressType {
    #[default]
    IPAddress,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Listener {
    /// Unique within the Gateway; routes select it with `parentRefs[].sectionName`.
    pub name: Spanned<String>,
    /// Restricts the hosts this listener serves (may be a `*.` wildcard); none means all.
    #[serde(default)]
    pub hostname: Option<Spanned<String>>,
    pub port: Spanned<u32>,
    pub protocol: Spanned<ListenerProtocol>,
    #[serde(default)]
    pub tls: Option<ListenerTls>,
    #[serde(default)]
    pub allowed_routes: AllowedRoutes,
}

impl Listener {
    pub fn hostname(&self) -> Option<&str> {
        self.hostname.as_ref().map(|h| h.value.as_str())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
pub enum ListenerProtocol {
    #[serde(rename = "HTTP")]
    Http,
    #[serde(rename = "HTTPS")]
    Https,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListenerTls {
    #[serde(default)]
    pub mode: TlsMode,
    #[serde(default)]
    pub certificate_refs: Vec<SecretObjectRef>,
}

/// Only termination: Envoy decrypts with certificates served over SDS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum TlsMode {
    #[default]
    Terminate,
}

/// A reference to a TLS `Secret` (Gateway API `SecretObjectReference`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SecretObjectRef {
    /// `""` (the core API group) is the only group with Secrets.
    #[serde(default)]
    pub group: String,
    #[serde(default = "secret_kind")]
    pub kind: Spanned<String>,
    pub name: Spanned<String>,
    /// Defaults to the Gateway's namespace.
    #[serde(default)]
    pub namespace: Option<String>,
}

fn secret_kind() -> Spanned<String> {
    Spanned::new("Secret".to_owned(), Pos::UNKNOWN)
}

impl SecretObjectRef {
    /// Whether this names a core `Secret` (the only kind ballast can serve over SDS).
    pub fn is_secret(&self) -> bool {
        self.group.is_empty() && *self.kind == "Secret"
    }
}

/// Which routes may attach to a listener.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AllowedRoutes {
    #[serde(default)]
    pub namespaces: RouteNamespaces,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RouteNamespaces {
    #[serde(default)]
    pub from: FromNamespaces,
}

/// Gateway API default is `Same`: routes from other namespaces attach only when allowed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum FromNamespaces {
    #[default]
    Same,
    All,
}
