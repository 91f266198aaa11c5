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
    /// Per listener (spec order): why it is Conflicted, if it is ([`listener_conflicts`]).
    /// Computed once at parse time: route attachment asks for every route.
    conflicts: Vec<Option<ListenerConflict>>,
}
object_kind!(Gateway, super::Kind::Gateway);

impl Gateway {
    pub fn new(metadata: Metadata, spec: GatewaySpec, source: Source) -> Gateway {
        let conflicts = listener_conflicts(&spec.listeners);
        Gateway {
            metadata,
            spec,
            source,
            conflicts,
        }
    }

    pub fn listener(&self, name: &str) -> Option<&Listener> {
        self.spec.listeners.iter().find(|l| *l.name == name)
    }

    /// Why listener `index` (spec order) is Conflicted; `None` when it is distinct.
    pub fn conflict(&self, index: usize) -> Option<&ListenerConflict> {
        self.conflicts.get(index).and_then(Option::as_ref)
    }

    /// Whether the listener named `name` is Conflicted (and so neither served nor attachable).
    pub fn is_conflicted(&self, name: &str) -> bool {
        self.spec
            .listeners
            .iter()
            .position(|l| *l.name == name)
            .is_some_and(|i| self.conflict(i).is_some())
    }

    /// The listeners that are not Conflicted: the ones Ballast serves.
    pub fn distinct_listeners(&self) -> impl Iterator<Item = &Listener> {
        self.spec
            .listeners
            .iter()
            .enumerate()
            .filter(|(i, _)| self.conflict(*i).is_none())
            .map(|(_, l)| l)
    }
}

/// Gateway API `Conflicted=True` reasons: listeners Envoy cannot tell apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConflictReason {
    /// Same port, protocols that cannot share it (HTTP and HTTPS).
    ProtocolConflict,
    /// Same port and protocol, same hostname (or both without one).
    HostnameConflict,
}

impl ConflictReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ConflictReason::ProtocolConflict => "ProtocolConflict",
            ConflictReason::HostnameConflict => "HostnameConflict",
        }
    }
}

/// Why a listener is Conflicted, naming the listeners it conflicts with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerConflict {
    pub reason: ConflictReason,
    pub message: String,
}

/// Whether listeners of protocol `p` can share a port, told apart by hostname (HTTP by `Host`,
/// HTTPS and TLS by SNI). Gateway API: for TCP and UDP only the port distinguishes listeners,
/// so such a protocol gets one listener per port.
fn distinct_by_hostname(p: ListenerProtocol) -> bool {
    match p {
        ListenerProtocol::Http | ListenerProtocol::Https | ListenerProtocol::Tls => true,
        ListenerProtocol::Tcp => false,
    }
}

/// Gateway API "distinct listeners": on one port, every listener must share the protocol (an
/// HTTP and an HTTPS listener cannot share a socket here) and, within it, have its own hostname
/// (or be alone, for a protocol not `distinct_by_hostname`).
/// Listeners that are not distinct are *all* Conflicted (the spec forbids picking a winner);
/// the others are served. A protocol conflict outranks a hostname conflict.
pub fn listener_conflicts(listeners: &[Listener]) -> Vec<Option<ListenerConflict>> {
    let protocol = |l: &Listener| l.protocol.as_str();
    listeners
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let same_port = || {
                listeners
                    .iter()
                    .enumerate()
                    .filter(move |(j, o)| *j != i && o.port.value == l.port.value)
                    .map(|(_, o)| o)
            };
            let names = |v: Vec<&Listener>| {
                v.iter()
                    .map(|o| format!("{:?} ({})", o.name.value, protocol(o)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let other_protocol: Vec<&Listener> =
                same_port().filter(|o| *o.protocol != *l.protocol).collect();
            if !other_protocol.is_empty() {
                return Some(ListenerConflict {
                    reason: ConflictReason::ProtocolConflict,
                    message: format!(
                        "port {} is also used by listener {} with another protocol; {} cannot share it (the listener is not served)",
                        l.port.value,
                        names(other_protocol),
                        protocol(l)
                    ),
                });
            }
            if !distinct_by_hostname(*l.protocol) {
                let others: Vec<&Listener> = same_port().collect();
                if !others.is_empty() {
                    return Some(ListenerConflict {
                        reason: ConflictReason::ProtocolConflict,
                        message: format!(
                            "port {} is also used by listener {}; a {} port has one listener (the listener is not served)",
                            l.port.value,
                            names(others),
                            protocol(l)
                        ),
                    });
                }
            }
            let same_host: Vec<&Listener> =
                same_port().filter(|o| o.hostname() == l.hostname()).collect();
            (!same_host.is_empty()).then(|| ListenerConflict {
                reason: ConflictReason::HostnameConflict,
                message: format!(
                    "listener {} also serves hostname {} on port {} (the listener is not served)",
                    names(same_host),
                    l.hostname().unwrap_or("(any)"),
                    l.port.value
                ),
            })
        })
        .collect()
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

    const CONFLICTS: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: edge }\nspec:\n  gatewayClassName: ballast\n  listeners:\n  \
        - { name: http, port: 80, protocol: HTTP }\n  \
        - { name: tls, port: 80, protocol: HTTPS, tls: { certificateRefs: [{ name: s }] } }\n  \
        - { name: a, port: 81, protocol: HTTP, hostname: a.example.com }\n  \
        - { name: a-again, port: 81, protocol: HTTP, hostname: a.example.com }\n  \
        - { name: b, port: 81, protocol: HTTP, hostname: b.example.com }\n  \
        - { name: other, port: 82, protocol: HTTP }\n";

    fn route(name: &str, section: &str) -> String {
        format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: {name} }}\nspec:\n  parentRefs: [{{ name: edge{section} }}]\n"
        )
    }

    /// (type, status, reason) of each condition.
    fn conds(c: &[crate::status::Condition]) -> Vec<(String, bool, String)> {
        c.iter()
            .map(|c| (c.type_.clone(), c.is_true(), c.reason.clone()))
            .collect()
    }

    /// Listeners Envoy cannot tell apart (HTTP and HTTPS on one port; one port, protocol and
    /// hostname) are all `Conflicted=True` with `Accepted/Programmed=False` and take no
    /// routes; the distinct ones are served, and the Gateway says which (`ListenersNotValid`).
    #[test]
    fn indistinct_listeners_are_conflicted_and_take_no_routes() {
        let text = CONFLICTS.to_owned() + &route("all", "") + &route("on-a", ", sectionName: a");
        let set = ConfigSet::build([("g.yaml", text)]).unwrap();
        let s = compute(&set);
        let g = &s.gateways[0];
        let listener = |name: &str| g.listeners.iter().find(|l| l.name == name).unwrap();
        let c = |t: &str, ok: bool, r: &str| (t.to_owned(), ok, r.to_owned());
        for name in ["http", "tls"] {
            let l = listener(name);
            let cs = conds(&l.conditions);
            assert_eq!(cs[0], c("Accepted", false, "ProtocolConflict"), "{name}");
            assert_eq!(cs[2], c("Programmed", false, "ProtocolConflict"), "{name}");
            assert_eq!(cs[3], c("Conflicted", true, "ProtocolConflict"), "{name}");
            assert_eq!(l.attached_routes, 0);
        }
        assert!(
            listener("http").conditions[3]
                .message
                .contains("\"tls\" (HTTPS)"),
            "{}",
            listener("http").conditions[3].message
        );
        for name in ["a", "a-again"] {
            let l = listener(name);
            let cs = conds(&l.conditions);
            assert_eq!(cs[0], c("Accepted", false, "HostnameConflict"), "{name}");
            assert_eq!(cs[2], c("Programmed", false, "HostnameConflict"), "{name}");
            assert_eq!(cs[3], c("Conflicted", true, "HostnameConflict"), "{name}");
            assert_eq!(l.attached_routes, 0);
        }
        for name in ["b", "other"] {
            let l = listener(name);
            assert_eq!(
                conds(&l.conditions),
                vec![
                    c("Accepted", true, "Accepted"),
                    c("ResolvedRefs", true, "ResolvedRefs"),
                    c("Programmed", true, "Programmed"),
                ],
                "{name}: no Conflicted condition (unset means no conflicts)"
            );
            assert_eq!(l.attached_routes, 1, "{name}");
        }
        assert_eq!(
            conds(&g.conditions),
            vec![
                c("Accepted", true, "ListenersNotValid"),
                c("Programmed", true, "Programmed")
            ]
        );
        assert!(
            g.conditions[0].message.contains("serving b, other"),
            "{}",
            g.conditions[0].message
        );
        // A route naming a conflicted listener does not attach.
        let on_a = s.http_routes.iter().find(|r| r.name == "on-a").unwrap();
        assert_eq!(on_a.parents[0].conditions[0].reason, "NoMatchingParent");
        assert!(
            on_a.parents[0].conditions[0].message.contains("Conflicted"),
            "{}",
            on_a.parents[0].conditions[0].message
        );
        let all = s.http_routes.iter().find(|r| r.name == "all").unwrap();
        assert_eq!(
            all.parents[0].conditions[0].message,
            "attached to listeners b, other"
        );
        // `ballast validate` lists the conflicted listeners as problems.
        assert!(
            s.problems()
                .iter()
                .any(|p| p.contains("listener a-again: Accepted=False HostnameConflict")),
            "{:#?}",
            s.problems()
        );
    }

    /// With every listener conflicted nothing is left: the Gateway is not accepted.
    #[test]
    fn gateway_with_only_conflicted_listeners_is_not_accepted() {
        let text = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: edge }\nspec:\n  gatewayClassName: ballast\n  listeners:\n  \
            - { name: one, port: 80, protocol: HTTP }\n  \
            - { name: two, port: 80, protocol: HTTP }\n";
        let set = ConfigSet::build([("g.yaml", text)]).unwrap();
        let s = compute(&set);
        let g = &s.gateways[0];
        assert_eq!(
            conds(&g.conditions),
            vec![
                ("Accepted".to_owned(), false, "ListenersNotValid".to_owned()),
                ("Programmed".to_owned(), false, "Invalid".to_owned())
            ]
        );
    }
}
