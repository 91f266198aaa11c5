//! `gateway.networking.k8s.io` `TLSRoute` and `TCPRoute`: connections (not requests) sent to
//! Backends. A TLSRoute is chosen by the TLS SNI of the connection on a `TLS` listener (the
//! bytes pass through untouched), a TCPRoute takes every connection of a `TCP` listener.
//!
//! Both carry what an HTTPRoute carries minus the request matching: parentRefs, (TLS only)
//! hostnames and rules of weighted backendRefs. Parsing therefore also builds the equivalent
//! HTTPRoute ([`TlsRoute::as_http`], [`TcpRoute::as_http`]) so attachment, hostname intersection,
//! backend resolution (ReferenceGrants included), validation and status reuse the HTTPRoute
//! code; only the route *kind* differs (which listeners admit it, which grants apply).

use std::sync::Arc;

use serde::Deserialize;

use super::{
    HttpBackendRef, HttpRoute, HttpRouteMatch, HttpRouteRule, HttpRouteSpec, Metadata, ParentRef,
    Source, object_kind,
};
use crate::spanned::{Pos, Spanned};

/// A TLSRoute: connections whose SNI matches `hostnames` (intersected with the listener's).
#[derive(Clone, Debug)]
pub struct TlsRoute {
    pub metadata: Metadata,
    pub spec: TlsRouteSpec,
    pub source: Source,
    /// The equivalent HTTPRoute (same metadata, source, parentRefs, hostnames, backendRefs).
    pub as_http: Arc<HttpRoute>,
}
object_kind!(TlsRoute, super::Kind::TlsRoute);

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsRouteSpec {
    #[serde(default)]
    pub parent_refs: Vec<ParentRef>,
    /// SNI names (may be `*.` wildcards); none means every name the listener accepts.
    #[serde(default)]
    pub hostnames: Vec<Spanned<String>>,
    #[serde(default)]
    pub rules: Vec<L4RouteRule>,
}

/// A TCPRoute: every connection of the `TCP` listeners it attaches to.
#[derive(Clone, Debug)]
pub struct TcpRoute {
    pub metadata: Metadata,
    pub spec: TcpRouteSpec,
    pub source: Source,
    /// The equivalent HTTPRoute (same metadata, source, parentRefs, backendRefs).
    pub as_http: Arc<HttpRoute>,
}
object_kind!(TcpRoute, super::Kind::TcpRoute);

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TcpRouteSpec {
    #[serde(default)]
    pub parent_refs: Vec<ParentRef>,
    #[serde(default)]
    pub rules: Vec<L4RouteRule>,
}

/// Gateway API `TLSRouteRule` / `TCPRouteRule`. Envoy's `tcp_proxy` takes one weighted set of
/// clusters per filter chain, so the backendRefs of all rules of a route form one set.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct L4RouteRule {
    #[serde(default)]
    pub name: Option<Spanned<String>>,
    #[serde(default)]
    pub backend_refs: Vec<L4BackendRef>,
}

/// Gateway API `BackendRef` (no filters): a weighted Service port or Ballast Backend.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct L4BackendRef {
    #[serde(default)]
    pub group: Option<Spanned<String>>,
    #[serde(default)]
    pub kind: Option<Spanned<String>>,
    pub name: Spanned<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub port: Option<Spanned<u32>>,
    #[serde(default = "one")]
    pub weight: Spanned<u32>,
}

fn one() -> Spanned<u32> {
    Spanned::new(1, Pos::UNKNOWN)
}

impl L4BackendRef {
    fn to_http(&self) -> HttpBackendRef {
        HttpBackendRef {
            group: self.group.clone(),
            kind: self.kind.clone(),
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            port: self.port.clone(),
            weight: self.weight.clone(),
            filters: Vec::new(),
        }
    }
}

/// The HTTPRoute equivalent of an L4 route: one default match per rule (never used for
/// traffic; it keeps the HTTPRoute invariants), the rules' backendRefs as they are.
fn to_http(
    metadata: &Metadata,
    source: &Source,
    parent_refs: &[ParentRef],
    hostnames: &[Spanned<String>],
    rules: &[L4RouteRule],
) -> HttpRoute {
    HttpRoute {
        metadata: metadata.clone(),
        spec: HttpRouteSpec {
            parent_refs: parent_refs.to_vec(),
            hostnames: hostnames.to_vec(),
            rules: rules
                .iter()
                .map(|r| HttpRouteRule {
                    name: r.name.clone(),
                    matches: vec![HttpRouteMatch::default()],
                    filters: Vec::new(),
                    backend_refs: r.backend_refs.iter().map(L4BackendRef::to_http).collect(),
                    timeouts: None,
                    retry: None,
                    session_persistence: None,
                })
                .collect(),
        },
        source: source.clone(),
    }
}

impl TlsRoute {
    pub fn new(metadata: Metadata, spec: TlsRouteSpec, source: Source) -> TlsRoute {
        let as_http = Arc::new(to_http(
            &metadata,
            &source,
            &spec.parent_refs,
            &spec.hostnames,
            &spec.rules,
        ));
        TlsRoute {
            metadata,
            spec,
            source,
            as_http,
        }
    }
}

impl TcpRoute {
    pub fn new(metadata: Metadata, spec: TcpRouteSpec, source: Source) -> TcpRoute {
        let as_http = Arc::new(to_http(
            &metadata,
            &source,
            &spec.parent_refs,
            &[],
            &spec.rules,
        ));
        TcpRoute {
            metadata,
            spec,
            source,
            as_http,
        }
    }
}

/// Which kind a route is, for what depends on it: which listeners admit it
/// (`allowedRoutes.kinds`) and which ReferenceGrants (`from.kind`) let it reach other
/// namespaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteKind {
    Http,
    Grpc,
    Tls,
    Tcp,
}

impl RouteKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RouteKind::Http => "HTTPRoute",
            RouteKind::Grpc => "GRPCRoute",
            RouteKind::Tls => "TLSRoute",
            RouteKind::Tcp => "TCPRoute",
        }
    }

    /// The kind listeners must admit. GRPCRoutes attach as their HTTPRoute equivalents (the
    /// behaviour before route kinds were distinguished).
    pub fn attach_kind(self) -> &'static str {
        match self {
            RouteKind::Grpc => "HTTPRoute",
            k => k.as_str(),
        }
    }

    /// The kind ReferenceGrants name in `from` (GRPCRoute: as before, HTTPRoute).
    pub fn grant_kind(self) -> &'static str {
        self.attach_kind()
    }
}

/// What one attached L4 route serves on one listener of a Gateway ([`l4_claims`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct L4Claim {
    pub kind: RouteKind,
    pub port: u32,
    /// The Gateway listener.
    pub listener: String,
    pub route: Arc<HttpRoute>,
    /// The SNI names it serves there (`*`: any); a TCPRoute that serves its listener has `[*]`.
    /// Empty: everything it asked for is served by other routes.
    pub hostnames: Vec<String>,
    /// The names it asked for that an earlier route serves, with that route.
    pub shadowed: Vec<(String, super::ObjectKey)>,
}

/// Who serves what on the TLS and TCP listeners of `gateway`, in the order Envoy filter chains
/// are built (port, listener order, route namespace/name). A name is served by the first route
/// claiming it on its port (Envoy needs the SNI matches of one port to be distinct); a TCP
/// listener is served by its first route. `Terminate` listeners without a resolvable
/// certificate are not served and claim nothing. The one place translation and status learn
/// this from, so they agree.
pub fn l4_claims(set: &crate::ConfigSet, gateway: &super::ObjectKey) -> Vec<L4Claim> {
    use super::{ListenerProtocol, TlsMode};
    use crate::set::CertificateRefResolution;
    use std::collections::BTreeMap;
    let Some(gw) = set.gateways.get(gateway) else {
        return Vec::new();
    };
    let mut ports: BTreeMap<u32, Vec<&super::Listener>> = BTreeMap::new();
    // Conflicted listeners are not served and claim nothing.
    for l in gw.distinct_listeners() {
        if matches!(*l.protocol, ListenerProtocol::Tls | ListenerProtocol::Tcp) {
            ports.entry(l.port.value).or_default().push(l);
        }
    }
    let mut out = Vec::new();
    if ports.is_empty() {
        return out;
    }
    // (listener, hostnames, kind, route), in route key order.
    let mut attached = Vec::new();
    for (kind, r) in set
        .tls_routes
        .values()
        .map(|r| (RouteKind::Tls, &r.as_http))
        .chain(
            set.tcp_routes
                .values()
                .map(|r| (RouteKind::Tcp, &r.as_http)),
        )
    {
        for a in set.route_attachments_of(kind, gateway, r) {
            attached.push((a.listener, a.hostnames, kind, r));
        }
    }
    for (port, listeners) in ports {
        let mut owner: BTreeMap<String, super::ObjectKey> = BTreeMap::new();
        for l in listeners {
            let terminate = *l.protocol == ListenerProtocol::Tls
                && l.tls.as_ref().is_some_and(|t| t.mode == TlsMode::Terminate);
            if terminate
                && !l.tls.iter().flat_map(|t| &t.certificate_refs).any(|r| {
                    matches!(
                        set.resolve_certificate(gw, r),
                        CertificateRefResolution::Resolved(_)
                    )
                })
            {
                continue;
            }
            let tcp = *l.protocol == ListenerProtocol::Tcp;
            for (ln, hostnames, kind, r) in &attached {
                if *ln != *l.name {
                    continue;
                }
                let asked: Vec<String> = if tcp {
                    vec![crate::hostname::ANY_HOST.to_owned()]
                } else {
                    hostnames.clone()
                };
                let mut claim = L4Claim {
                    kind: *kind,
                    port,
                    listener: l.name.value.clone(),
                    route: (*r).clone(),
                    hostnames: Vec::new(),
                    shadowed: Vec::new(),
                };
                for h in asked {
                    match owner.get(&h) {
                        Some(w) => claim.shadowed.push((h, w.clone())),
                        None => {
                            owner.insert(h.clone(), r.key());
                            claim.hostnames.push(h);
                        }
                    }
                }
                out.push(claim);
            }
        }
    }
    out
}

#[cfg(test)]
#[path = "l4route_tests.rs"]
mod tests;
