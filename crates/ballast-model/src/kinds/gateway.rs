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

    /// Whether this is a TLS listener passing connections through undecrypted.
    pub fn is_passthrough(&self) -> bool {
        *self.protocol == ListenerProtocol::Tls
            && self
                .tls
                .as_ref()
                .is_some_and(|t| t.mode == TlsMode::Passthrough)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
pub enum ListenerProtocol {
    #[serde(rename = "HTTP")]
    Http,
    #[serde(rename = "HTTPS")]
    Https,
    /// TLS connections routed by SNI (TLSRoute); `tls.mode` says whether Envoy passes the
    /// bytes through or terminates TLS first.
    #[serde(rename = "TLS")]
    Tls,
    /// Plain TCP connections (TCPRoute).
    #[serde(rename = "TCP")]
    Tcp,
}

impl ListenerProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            ListenerProtocol::Http => "HTTP",
            ListenerProtocol::Https => "HTTPS",
            ListenerProtocol::Tls => "TLS",
            ListenerProtocol::Tcp => "TCP",
        }
    }

    /// The route kinds (group, kind) a listener of this protocol serves.
    pub fn route_kinds(self) -> &'static [(&'static str, &'static str)] {
        match self {
            ListenerProtocol::Http | ListenerProtocol::Https => HTTP_ROUTE_KINDS,
            ListenerProtocol::Tls => TLS_ROUTE_KINDS,
            ListenerProtocol::Tcp => TCP_ROUTE_KINDS,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListenerTls {
    #[serde(default)]
    pub mode: TlsMode,
    #[serde(default)]
    pub certificate_refs: Vec<SecretObjectRef>,
}

/// `Terminate`: Envoy decrypts with certificates served over SDS (HTTPS, TLS listeners).
/// `Passthrough` (TLS listeners only): Envoy reads the SNI and forwards the encrypted bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum TlsMode {
    #[default]
    Terminate,
    Passthrough,
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
    /// Route kinds that may attach; empty means the kinds the listener's protocol supports.
    #[serde(default)]
    pub kinds: Vec<RouteGroupKind>,
}

/// A route kind in `allowedRoutes.kinds`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteGroupKind {
    /// Defaults to `gateway.networking.k8s.io`.
    #[serde(default)]
    pub group: Option<String>,
    pub kind: Spanned<String>,
}

impl RouteGroupKind {
    pub fn group(&self) -> &str {
        self.group.as_deref().unwrap_or(super::GATEWAY_GROUP)
    }
}

/// The route kinds (group, kind) HTTP and HTTPS listeners serve.
pub const HTTP_ROUTE_KINDS: &[(&str, &str)] = &[(super::GATEWAY_GROUP, "HTTPRoute")];
/// The route kinds TLS listeners serve.
pub const TLS_ROUTE_KINDS: &[(&str, &str)] = &[(super::GATEWAY_GROUP, "TLSRoute")];
/// The route kinds TCP listeners serve.
pub const TCP_ROUTE_KINDS: &[(&str, &str)] = &[(super::GATEWAY_GROUP, "TCPRoute")];

impl Listener {
    /// Whether routes of `group`/`kind` may attach (`allowedRoutes.kinds`, or the protocol's
    /// kinds when it lists none).
    pub fn allows_kind(&self, group: &str, kind: &str) -> bool {
        let supported = self.protocol.route_kinds().contains(&(group, kind));
        if self.allowed_routes.kinds.is_empty() {
            supported
        } else {
            supported
                && self
                    .allowed_routes
                    .kinds
                    .iter()
                    .any(|k| k.group() == group && *k.kind == kind)
        }
    }

    /// `allowedRoutes.kinds` entries the listener cannot serve (status `InvalidRouteKinds`).
    pub fn invalid_route_kinds(&self) -> Vec<&RouteGroupKind> {
        self.allowed_routes
            .kinds
            .iter()
            .filter(|k| {
                !self
                    .protocol
                    .route_kinds()
                    .contains(&(k.group(), k.kind.as_str()))
            })
            .collect()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RouteNamespaces {
    #[serde(default)]
    pub from: FromNamespaces,
    /// With `from: Selector`: routes whose namespace's labels (its `Namespace` object) match.
    #[serde(default)]
    pub selector: Option<super::LabelSelector>,
}

/// Gateway API default is `Same`: routes from other namespaces attach only when allowed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum FromNamespaces {
    #[default]
    Same,
    All,
    Selector,
}

#[cfg(test)]
mod tests {
    use crate::ConfigSet;
    use crate::status::compute;

    fn gateway(kinds: &str) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{ name: edge }}\nspec:\n  gatewayClassName: ballast\n  listeners:\n  - name: http\n    port: 80\n    protocol: HTTP\n    allowedRoutes: {{ kinds: [{kinds}] }}\n---\n\
             apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: r }}\nspec:\n  parentRefs: [{{ name: edge }}]\n"
        )
    }

    /// (route Accepted reason, listener ResolvedRefs reason, attached routes).
    fn outcome(kinds: &str) -> (String, String, u32) {
        let set = ConfigSet::build([("g.yaml", gateway(kinds))]).unwrap();
        let s = compute(&set);
        let l = &s.gateways[0].listeners[0];
        (
            s.http_routes[0].parents[0].conditions[0].reason.clone(),
            l.conditions[1].reason.clone(),
            l.attached_routes,
        )
    }

    /// `allowedRoutes.kinds` restricts which route kinds attach; kinds the listener cannot serve
    /// are `ResolvedRefs=False InvalidRouteKinds`.
    #[test]
    fn allowed_route_kinds() {
        let ok = |a: &str, b: &str, n| (a.to_owned(), b.to_owned(), n);
        assert_eq!(outcome(""), ok("Accepted", "ResolvedRefs", 1));
        assert_eq!(
            outcome("{ kind: HTTPRoute }"),
            ok("Accepted", "ResolvedRefs", 1)
        );
        assert_eq!(
            outcome("{ group: gateway.networking.k8s.io, kind: HTTPRoute }, { kind: TCPRoute }"),
            ok("Accepted", "InvalidRouteKinds", 1)
        );
        assert_eq!(
            outcome("{ kind: TCPRoute }"),
            ok("NotAllowedByListeners", "InvalidRouteKinds", 0)
        );
        assert_eq!(
            outcome("{ group: example.com, kind: HTTPRoute }"),
            ok("NotAllowedByListeners", "InvalidRouteKinds", 0)
        );
    }
}
