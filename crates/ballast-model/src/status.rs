//! Gateway API status for a [`ConfigSet`]: per route and parentRef `Accepted` / `ResolvedRefs`,
//! per Gateway and listener `Accepted` / `ResolvedRefs` / `Programmed`.
//!
//! Plain serializable data (field names as in Gateway API status) so the binary can print it as
//! JSON or YAML, `ballast validate` can list the problems, and `/debug/sources` can show it.
//! An unresolved reference is status, not an error: the config still loads, and the affected
//! rule answers 500 (backend) or the listener is not programmed (certificate).

use serde::Serialize;

use crate::kinds::*;
use crate::set::{BackendRefResolution, BackendTarget, CertificateRefResolution, ConfigSet};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ConditionStatus {
    True,
    False,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    pub reason: String,
    pub message: String,
}

impl Condition {
    fn new(type_: &str, ok: bool, reason: &str, message: impl Into<String>) -> Self {
        Condition {
            type_: type_.to_owned(),
            status: if ok {
                ConditionStatus::True
            } else {
                ConditionStatus::False
            },
            reason: reason.to_owned(),
            message: message.into(),
        }
    }

    pub fn is_true(&self) -> bool {
        self.status == ConditionStatus::True
    }
}

/// A parentRef as it appears in route status (defaults filled in).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentReference {
    pub group: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    pub parent_ref: ParentReference,
    pub conditions: Vec<Condition>,
}

/// A backendRef that does not resolve; requests it would receive are answered with 500.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnresolvedBackendRef {
    pub rule: usize,
    pub backend_ref: usize,
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    pub namespace: String,
    pub name: String,
    /// `file:line:col` of the route's definition.
    pub source: String,
    pub parents: Vec<RouteParentStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unresolved_backend_refs: Vec<UnresolvedBackendRef>,
    /// Things that work but should be fixed (deprecated backendRef shorthand), with the fix.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerStatus {
    pub name: String,
    /// Routes attached to this listener (Gateway API `attachedRoutes`).
    pub attached_routes: u32,
    pub conditions: Vec<Condition>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    pub namespace: String,
    pub name: String,
    pub source: String,
    pub conditions: Vec<Condition>,
    pub listeners: Vec<ListenerStatus>,
}

/// A Backend (Gateway API has no Backend status; this is what `ballast get backends` shows):
/// valid, how many endpoints, and which routes send to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendStatus {
    pub namespace: String,
    pub name: String,
    pub source: String,
    pub endpoints: u32,
    /// `namespace/name` of every HTTPRoute with a backendRef resolving to this Backend.
    pub routes: Vec<String>,
    pub conditions: Vec<Condition>,
}

/// The status of every Gateway, HTTPRoute and Backend, in key order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigStatus {
    pub gateways: Vec<GatewayStatus>,
    pub http_routes: Vec<RouteStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub backend_policies: Vec<PolicyStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub backend_tls_policies: Vec<PolicyStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub client_policies: Vec<PolicyStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rate_limit_policies: Vec<PolicyStatus>,
    pub security_policies: Vec<PolicyStatus>,
    /// GRPCRoutes, computed through their HTTPRoute equivalents (same attachment rules).
    pub grpc_routes: Vec<RouteStatus>,
    /// TLSRoutes and TCPRoutes, computed through their HTTPRoute equivalents with their own
    /// kind (only TLS / TCP listeners admit them; ReferenceGrants must name their kind).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tls_routes: Vec<RouteStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tcp_routes: Vec<RouteStatus>,
    pub backends: Vec<BackendStatus>,
}

/// One targetRef of a policy, as in Gateway API `PolicyAncestorStatus` (the target itself is
/// the ancestor: ballast policies attach directly).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyTargetStatus {
    pub group: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    pub conditions: Vec<Condition>,
}

/// The status of one policy: per targetRef whether it applies there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub source: String,
    pub targets: Vec<PolicyTargetStatus>,
}

impl PolicyStatus {
    /// The targets where the policy applies (`Accepted=True`), as `Kind ns/name[/section]`.
    pub fn applied_to(&self) -> Vec<String> {
        self.targets
            .iter()
            .filter(|t| t.conditions.iter().all(Condition::is_true))
            .map(|t| {
                let mut s = format!("{} {}/{}", t.kind, t.namespace, t.name);
                if let Some(sec) = &t.section_name {
                    s.push('/');
                    s.push_str(sec);
                }
                s
            })
            .collect()
    }
}

/// Status of every policy of one kind from its attachment resolution.
pub(crate) fn policy_statuses(
    kind: Kind,
    resolution: &crate::attach::Resolution,
    source: impl Fn(&ObjectKey) -> String,
    refs: impl Fn(&ObjectKey) -> Result<(), String>,
) -> Vec<PolicyStatus> {
    use crate::attach::Outcome;
    resolution
        .statuses
        .iter()
        .map(|(key, targets)| PolicyStatus {
            kind: kind.as_str().to_owned(),
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            source: source(key),
            targets: targets
                .iter()
                .map(|t| {
                    let accepted = match &t.outcome {
                        Outcome::Accepted { overridden } if overridden.is_empty() => {
                            Condition::new("Accepted", true, "Accepted", "policy applies")
                        }
                        Outcome::Accepted { overridden } => Condition::new(
                            "Accepted",
                            true,
                            "Accepted",
                            format!(
                                "policy applies, except on {}",
                                overridden
                                    .iter()
                                    .map(|(s, by)| format!(
                                        "section {s} (policy {by} is more specific)"
                                    ))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        ),
                        Outcome::Conflicted { winner } => Condition::new(
                            "Accepted",
                            false,
                            "Conflicted",
                            format!(
                                "older policy {winner} targets the same object and applies instead"
                            ),
                        ),
                        Outcome::TargetNotFound(m) => {
                            Condition::new("Accepted", false, "TargetNotFound", m.clone())
                        }
                        Outcome::Invalid(m) => {
                            Condition::new("Accepted", false, "Invalid", m.clone())
                        }
                    };
                    let mut conditions = vec![accepted];
                    if let Err(m) = refs(key) {
                        let reason = if kind == Kind::SecurityPolicy {
                            "InvalidReference"
                        } else {
                            "InvalidCACertificateRef"
                        };
                        conditions.push(Condition::new("ResolvedRefs", false, reason, m));
                    }
                    PolicyTargetStatus {
                        group: t.point.target.kind.group().to_owned(),
                        kind: t.point.target.kind.as_str().to_owned(),
                        namespace: t.point.target.key.namespace.clone(),
                        name: t.point.target.key.name.clone(),
                        section_name: t.point.section.clone(),
                        conditions,
                    }
                })
                .collect(),
        })
        .collect()
}

impl ConfigStatus {
    /// One line per `False` condition, `source: Kind ns/name: ... Type=False Reason: message`,
    /// for `ballast validate` and logs.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for g in &self.gateways {
            for c in g.conditions.iter().filter(|c| !c.is_true()) {
                out.push(format!(
                    "{}: Gateway {}/{}: {}=False {}: {}",
                    g.source, g.namespace, g.name, c.type_, c.reason, c.message
                ));
            }
            for l in &g.listeners {
                for c in l.conditions.iter().filter(|c| !c.is_true()) {
                    out.push(format!(
                        "{}: Gateway {}/{}: listener {}: {}=False {}: {}",
                        g.source, g.namespace, g.name, l.name, c.type_, c.reason, c.message
                    ));
                }
            }
        }
        for p in self
            .backend_policies
            .iter()
            .chain(&self.backend_tls_policies)
            .chain(&self.rate_limit_policies)
            .chain(&self.security_policies)
        {
            for t in &p.targets {
                for c in t.conditions.iter().filter(|c| !c.is_true()) {
                    out.push(format!(
                        "{}: {} {}/{}: target {} {}/{}{}: {}=False {}: {}",
                        p.source,
                        p.kind,
                        p.namespace,
                        p.name,
                        t.kind,
                        t.namespace,
                        t.name,
                        t.section_name
                            .as_deref()
                            .map(|s| format!("/{s}"))
                            .unwrap_or_default(),
                        c.type_,
                        c.reason,
                        c.message
                    ));
                }
            }
        }
        let routes = self.http_routes.iter().map(|r| ("HTTPRoute", r));
        let grpc = self.grpc_routes.iter().map(|r| ("GRPCRoute", r));
        let tls = self.tls_routes.iter().map(|r| ("TLSRoute", r));
        let tcp = self.tcp_routes.iter().map(|r| ("TCPRoute", r));
        for (kind, r) in routes.chain(grpc).chain(tls).chain(tcp) {
            for p in &r.parents {
                for c in p.conditions.iter().filter(|c| !c.is_true()) {
                    out.push(format!(
                        "{}: {kind} {}/{}: parent {}/{}{}: {}=False {}: {}",
                        r.source,
                        r.namespace,
                        r.name,
                        p.parent_ref.namespace,
                        p.parent_ref.name,
                        p.parent_ref
                            .section_name
                            .as_deref()
                            .map(|s| format!("/{s}"))
                            .unwrap_or_default(),
                        c.type_,
                        c.reason,
                        c.message
                    ));
                }
            }
            for w in &r.warnings {
                out.push(format!(
                    "{}: {kind} {}/{}: {w}",
                    r.source, r.namespace, r.name
                ));
            }
        }
        out
    }
}

/// Warnings of L4 routes whose SNI names (or TCP listener) another route serves, by kind and
/// route key ([`crate::kinds::l4_claims`], what translation builds from).
fn l4_shadowed(set: &ConfigSet) -> std::collections::BTreeMap<(RouteKind, ObjectKey), Vec<String>> {
    let mut out: std::collections::BTreeMap<(RouteKind, ObjectKey), Vec<String>> =
        Default::default();
    if set.tls_routes.is_empty() && set.tcp_routes.is_empty() {
        return out;
    }
    for g in set.gateways.keys() {
        for c in crate::kinds::l4_claims(set, g) {
            if c.shadowed.is_empty() {
                continue;
            }
            let mut by_winner: Vec<(&ObjectKey, Vec<&str>)> = Vec::new();
            for (h, w) in &c.shadowed {
                match by_winner.iter_mut().find(|(k, _)| *k == w) {
                    Some((_, hs)) => hs.push(h),
                    None => by_winner.push((w, vec![h])),
                }
            }
            for (w, hs) in by_winner {
                let what = if c.kind == RouteKind::Tcp {
                    "its connections".to_owned()
                } else {
                    format!("SNI {}", hs.join(", "))
                };
                out.entry((c.kind, c.route.key())).or_default().push(format!(
                    "Gateway {g} listener {} (port {}): {what} served by {} {w}, which comes first (namespace/name order); this route gets none of them",
                    c.listener,
                    c.port,
                    c.kind.as_str()
                ));
            }
        }
    }
    out
}

/// Computes the status of every Gateway and HTTPRoute in `set`.
pub fn compute(set: &ConfigSet) -> ConfigStatus {
    let mut shadowed = l4_shadowed(set);
    let mut l4_status = |kind: RouteKind, r: &HttpRoute| {
        let mut st = route_status_of(set, r, kind);
        st.warnings
            .extend(shadowed.remove(&(kind, r.key())).unwrap_or_default());
        st
    };
    let tls_routes = set
        .tls_routes
        .values()
        .map(|r| l4_status(RouteKind::Tls, &r.as_http))
        .collect();
    let tcp_routes = set
        .tcp_routes
        .values()
        .map(|r| l4_status(RouteKind::Tcp, &r.as_http))
        .collect();
    ConfigStatus {
        gateways: set
            .gateways
            .values()
            .map(|g| gateway_status(set, g))
            .collect(),
        http_routes: set
            .http_routes
            .values()
            .map(|r| route_status(set, r))
            .collect(),
        backend_policies: policy_statuses(
            Kind::BackendPolicy,
            &set.backend_policy_resolution(),
            |k| {
                set.backend_policies
                    .get(k)
                    .map(|p| p.source.to_string())
                    .unwrap_or_default()
            },
            |k| match set
                .backend_policies
                .get(k)
                .and_then(|p| set.backend_client_certificate(p))
            {
                Some(Err(m)) => Err(m),
                _ => Ok(()),
            },
        ),
        backend_tls_policies: policy_statuses(
            Kind::BackendTlsPolicy,
            &set.backend_tls_resolution(),
            |k| {
                set.backend_tls_policies
                    .get(k)
                    .map(|p| p.source.to_string())
                    .unwrap_or_default()
            },
            |k| match set.backend_tls_policies.get(k) {
                Some(p) => set.backend_tls_ca(p).map(|_| ()),
                None => Ok(()),
            },
        ),
        client_policies: note_unsupported_client_settings(
            set,
            policy_statuses(
                Kind::ClientPolicy,
                &set.client_policy_resolution(),
                |k| {
                    set.client_policies
                        .get(k)
                        .map(|p| p.source.to_string())
                        .unwrap_or_default()
                },
                |k| match set
                    .client_policies
                    .get(k)
                    .and_then(|p| Some((p, p.spec.tls.as_ref()?.client_validation.as_ref()?)))
                {
                    Some((p, v)) => set
                        .ca_bundle(&p.metadata.namespace, &v.ca_certificate_refs)
                        .map(|_| ()),
                    None => Ok(()),
                },
            ),
        ),
        rate_limit_policies: crate::kinds::rate_limit::statuses(set),
        security_policies: policy_statuses(
            Kind::SecurityPolicy,
            &set.security_policy_resolution(),
            |k| {
                set.security_policies
                    .get(k)
                    .map(|p| p.source.to_string())
                    .unwrap_or_default()
            },
            |k| match set.security_policies.get(k) {
                Some(p) => set.security_refs(p),
                None => Ok(()),
            },
        ),
        grpc_routes: set
            .grpc_routes
            .values()
            .map(|r| route_status(set, &r.as_http))
            .collect(),
        tls_routes,
        tcp_routes,
        backends: backend_statuses(set),
    }
}

/// A Gateway-wide ClientPolicy applies on every listener it wins, but without the settings
/// a listener cannot take (HTTP/3 on an HTTP listener, a default HTTP/1.0 host on a listener
/// without hostname); its `Accepted` message names them, so the user sees what is ignored.
fn note_unsupported_client_settings(
    set: &ConfigSet,
    mut statuses: Vec<PolicyStatus>,
) -> Vec<PolicyStatus> {
    for ps in &mut statuses {
        let key = ObjectKey::new(ps.namespace.as_str(), ps.name.as_str());
        let Some(p) = set.client_policies.get(&key) else {
            continue;
        };
        for t in &mut ps.targets {
            if t.section_name.is_some() || t.kind != "Gateway" {
                continue;
            }
            let gk = ObjectKey::new(t.namespace.as_str(), t.name.as_str());
            let Some(g) = set.gateways.get(&gk) else {
                continue;
            };
            let notes: Vec<String> = g
                .spec
                .listeners
                .iter()
                .filter(|l| {
                    set.client_policy_for(&gk, &l.name)
                        .is_some_and(|e| std::sync::Arc::ptr_eq(e, p))
                })
                .flat_map(|l| p.unsupported_on(l))
                .collect();
            if notes.is_empty() {
                continue;
            }
            if let Some(c) = t
                .conditions
                .iter_mut()
                .find(|c| c.type_ == "Accepted" && c.is_true())
            {
                c.message = format!(
                    "{}; ignored where it cannot work: {}",
                    c.message,
                    notes.join("; ")
                );
            }
        }
    }
    statuses
}

fn backend_statuses(set: &ConfigSet) -> Vec<BackendStatus> {
    let mut users: std::collections::BTreeMap<ObjectKey, Vec<String>> = Default::default();
    let l4 = set
        .tls_routes
        .values()
        .map(|r| (RouteKind::Tls, &r.as_http))
        .chain(
            set.tcp_routes
                .values()
                .map(|r| (RouteKind::Tcp, &r.as_http)),
        );
    for (kind, r) in set
        .http_routes
        .values()
        .map(|r| (RouteKind::Http, r))
        .chain(l4)
    {
        for b in r.spec.rules.iter().flat_map(|rule| &rule.backend_refs) {
            if let BackendRefResolution::Resolved(b) = set.resolve_backend_of(kind, r, b) {
                let list = users.entry(b.key()).or_default();
                let name = r.key().to_string();
                if !list.contains(&name) {
                    list.push(name);
                }
            }
        }
    }
    set.backends
        .values()
        .map(|b| {
            let routes = users.remove(&b.key()).unwrap_or_default();
            let endpoints = u32::try_from(b.spec.endpoints.len()).unwrap_or(u32::MAX);
            BackendStatus {
                namespace: b.metadata.namespace.clone(),
                name: b.metadata.name.clone(),
                source: b.source.to_string(),
                endpoints,
                conditions: vec![
                    Condition::new("Accepted", true, "Accepted", "Backend is valid"),
                    if routes.is_empty() {
                        Condition::new(
                            "Programmed",
                            false,
                            "NotReferenced",
                            "no route's backendRef resolves to this Backend",
                        )
                    } else {
                        Condition::new("Programmed", true, "Programmed", "referenced by routes")
                    },
                ],
                routes,
            }
        })
        .collect()
}

fn gateway_status(set: &ConfigSet, g: &Gateway) -> GatewayStatus {
    let mut attachments = set.attached_routes(&g.key());
    // GRPCRoutes attach like their HTTPRoute equivalents and count as attached routes too.
    for r in set.grpc_routes.values() {
        for a in set.route_attachments(&g.key(), &r.as_http) {
            attachments.push(crate::set::RouteAttachment {
                route: r.as_http.clone(),
                listener: a.listener,
                hostnames: a.hostnames,
            });
        }
    }
    // TLSRoutes and TCPRoutes count on the listeners (TLS / TCP) that admit their kind.
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
        for a in set.route_attachments_of(kind, &g.key(), r) {
            attachments.push(crate::set::RouteAttachment {
                route: r.clone(),
                listener: a.listener,
                hostnames: a.hostnames,
            });
        }
    }
    let mut listeners = Vec::new();
    for (index, l) in g.spec.listeners.iter().enumerate() {
        let mut bad = Vec::new();
        let mut bad_reason = None;
        let mut resolved = 0;
        for r in l.tls.iter().flat_map(|t| &t.certificate_refs) {
            let ns = r.namespace.as_deref().unwrap_or(&g.metadata.namespace);
            match set.resolve_certificate(g, r) {
                CertificateRefResolution::Resolved(_) => resolved += 1,
                CertificateRefResolution::NotFound => {
                    bad_reason.get_or_insert("InvalidCertificateRef");
                    bad.push(format!("Secret {ns}/{} not found", r.name.value))
                }
                CertificateRefResolution::InvalidKind => {
                    bad_reason.get_or_insert("InvalidCertificateRef");
                    bad.push(format!(
                        "certificateRef {ns}/{} has unsupported kind {:?} (group {:?}); only core Secret is supported",
                        r.name.value, r.kind.value, r.group
                    ))
                }
                CertificateRefResolution::NotPermitted => {
                    bad_reason.get_or_insert("RefNotPermitted");
                    bad.push(format!(
                        "Secret {ns}/{} is in another namespace and no ReferenceGrant in {ns} allows Gateway {}/{} to use it",
                        r.name.value, g.metadata.namespace, g.metadata.name
                    ))
                }
            }
        }
        let invalid_kinds = l.invalid_route_kinds();
        if !invalid_kinds.is_empty() {
            bad_reason.get_or_insert("InvalidRouteKinds");
            bad.push(format!(
                "allowedRoutes.kinds: {} not supported on a {} listener (supported: {})",
                invalid_kinds
                    .iter()
                    .map(|k| format!("{}/{}", k.group(), k.kind.value))
                    .collect::<Vec<_>>()
                    .join(", "),
                l.protocol.as_str(),
                l.protocol
                    .route_kinds()
                    .iter()
                    .map(|(_, k)| *k)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let refs_ok = bad.is_empty();
        // Listeners without certificates to serve are programmed as they are; conflicted
        // listeners are not served at all.
        let conflict = g.conflict(index);
        let programmed = conflict.is_none()
            && (matches!(*l.protocol, ListenerProtocol::Http | ListenerProtocol::Tcp)
                || l.is_passthrough()
                || resolved > 0);
        let attached = attachments.iter().filter(|a| a.listener == *l.name).count();
        listeners.push(ListenerStatus {
            name: l.name.value.clone(),
            attached_routes: u32::try_from(attached).unwrap_or(u32::MAX),
            conditions: vec![
                match conflict {
                    None => Condition::new("Accepted", true, "Accepted", "listener is valid"),
                    Some(c) => {
                        Condition::new("Accepted", false, c.reason.as_str(), c.message.clone())
                    }
                },
                if refs_ok {
                    Condition::new(
                        "ResolvedRefs",
                        true,
                        "ResolvedRefs",
                        "all references resolved",
                    )
                } else {
                    Condition::new(
                        "ResolvedRefs",
                        false,
                        bad_reason.unwrap_or("InvalidCertificateRef"),
                        bad.join("; "),
                    )
                },
                match conflict {
                    _ if programmed => {
                        Condition::new("Programmed", true, "Programmed", "listener is served")
                    }
                    Some(c) => {
                        Condition::new("Programmed", false, c.reason.as_str(), c.message.clone())
                    }
                    None => Condition::new(
                        "Programmed",
                        false,
                        "Invalid",
                        "no certificateRef resolves to a Secret; the listener is not served",
                    ),
                },
            ],
        });
        // `Conflicted` is a "negative polarity" condition (True is the problem); only set
        // when true (Gateway API: unset means no conflicts), so every other condition keeps
        // meaning "True is good" for `problems()` and `ballast get`.
        if let Some(c) = conflict {
            listeners
                .last_mut()
                .expect("just pushed")
                .conditions
                .push(Condition {
                    type_: "Conflicted".to_owned(),
                    status: ConditionStatus::True,
                    reason: c.reason.as_str().to_owned(),
                    message: c.message.clone(),
                });
        }
    }
    let conflicted: Vec<&str> = g
        .spec
        .listeners
        .iter()
        .enumerate()
        .filter(|(i, _)| g.conflict(*i).is_some())
        .map(|(_, l)| l.name.as_str())
        .collect();
    let any_programmed = listeners.iter().any(|l| {
        l.conditions
            .iter()
            .any(|c| c.type_ == "Programmed" && c.is_true())
    });
    GatewayStatus {
        namespace: g.metadata.namespace.clone(),
        name: g.metadata.name.clone(),
        source: g.source.to_string(),
        conditions: vec![
            if conflicted.is_empty() {
                Condition::new("Accepted", true, "Accepted", "Gateway is valid")
            } else {
                let all = conflicted.len() == g.spec.listeners.len();
                Condition::new(
                    "Accepted",
                    !all,
                    "ListenersNotValid",
                    format!(
                        "listeners {} are Conflicted and not served{}",
                        conflicted.join(", "),
                        if all {
                            "; no listener is left".to_owned()
                        } else {
                            format!(
                                "; serving {}",
                                g.distinct_listeners()
                                    .map(|l| l.name.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        }
                    ),
                )
            },
            if any_programmed {
                Condition::new("Programmed", true, "Programmed", "Gateway is served")
            } else {
                Condition::new("Programmed", false, "Invalid", "no listener can be served")
            },
        ],
        listeners,
    }
}

/// The distinct backends a rule sends traffic to (weight above zero): Envoy's stateful session
/// only picks the remembered endpoint within the backend (cluster) the route chose.
fn session_backends(rule: &HttpRouteRule) -> usize {
    let mut seen = Vec::new();
    for b in rule.backend_refs.iter().filter(|b| b.weight.value > 0) {
        let k = (
            b.group.as_ref().map(|g| g.as_str()),
            b.kind.as_ref().map(|k| k.as_str()),
            b.name.as_str(),
            b.namespace.as_deref(),
        );
        if !seen.contains(&k) {
            seen.push(k);
        }
    }
    seen.len()
}

fn route_status(set: &ConfigSet, r: &HttpRoute) -> RouteStatus {
    route_status_of(set, r, RouteKind::Http)
}

/// The status of `r`, a route of `kind` (or the HTTPRoute equivalent of one).
fn route_status_of(set: &ConfigSet, r: &HttpRoute, kind: RouteKind) -> RouteStatus {
    let mut unresolved = Vec::new();
    let mut warnings = Vec::new();
    let mut messages = Vec::new();
    let mut reason = None;
    for (i, rule) in r.spec.rules.iter().enumerate() {
        // backendRefs, then RequestMirror targets (reported in the condition, not in
        // `unresolvedBackendRefs`, which indexes backendRefs).
        let refs = rule
            .backend_refs
            .iter()
            .enumerate()
            .map(|(j, b)| (format!("rules[{i}].backendRefs[{j}]"), Some(j), b))
            .chain(rule.filters.iter().enumerate().filter_map(|(k, f)| {
                f.request_mirror.as_ref().map(|m| {
                    (
                        format!("rules[{i}].filters[{k}].requestMirror.backendRef"),
                        None,
                        &m.backend_ref,
                    )
                })
            }));
        for (at, j, b) in refs {
            let target = set.backend_target(&r.metadata.namespace, b);
            if let Some(w) = target.deprecation() {
                warnings.push(format!("{at}: {w}"));
            }
            let ns = b.namespace_or(&r.metadata.namespace);
            let target_kind = match &target {
                BackendTarget::Service(..) => "Service",
                _ => "Backend",
            };
            let why = match set.resolve_backend_of(kind, r, b) {
                BackendRefResolution::Resolved(_) => continue,
                BackendRefResolution::NotFound => {
                    let what = match &target {
                        BackendTarget::Service(key, None) if set.services.contains_key(key) => {
                            format!("Service {key}: port is required for a Service backendRef")
                        }
                        BackendTarget::Service(key, None) => format!("Service {key} not found"),
                        BackendTarget::Service(key, Some(port)) => match set.services.get(key) {
                            Some(_) => format!("Service {key} has no port {port}"),
                            None => format!("Service {key} not found"),
                        },
                        BackendTarget::Backend { key, .. } => format!("Backend {key} not found"),
                        BackendTarget::Invalid => String::new(),
                    };
                    messages.push(format!("{at}: {what}"));
                    "BackendNotFound"
                }
                BackendRefResolution::InvalidKind => {
                    messages.push(format!(
                        "{at}: unsupported kind {}/{}; only core Service and ballast.dev/Backend are supported",
                        b.group.as_ref().map_or("", |g| g.as_str()),
                        b.kind.as_ref().map_or("Service", |k| k.as_str())
                    ));
                    "InvalidKind"
                }
                BackendRefResolution::NotPermitted => {
                    messages.push(format!(
                        "{at}: {target_kind} {ns}/{} is in another namespace and no ReferenceGrant in {ns} allows {} {}/{} to use it",
                        b.name.value,
                        kind.grant_kind(),
                        r.metadata.namespace,
                        r.metadata.name
                    ));
                    "RefNotPermitted"
                }
            };
            reason.get_or_insert(why);
            if let Some(j) = j {
                unresolved.push(UnresolvedBackendRef {
                    rule: i,
                    backend_ref: j,
                    reason: why.to_owned(),
                });
            }
        }
    }
    // Filters on a backendRef that Ballast does not apply: ignored (the route is otherwise
    // served), so the status must say so, naming each field.
    let mut unsupported: Vec<String> = r
        .spec
        .rules
        .iter()
        .enumerate()
        .flat_map(|(i, rule)| {
            rule.backend_refs.iter().enumerate().flat_map(move |(j, b)| {
                b.unsupported_filters().map(move |(k, t)| {
                    format!(
                        "rules[{i}].backendRefs[{j}].filters[{k}].type: filter {} is not supported on a backendRef (ignored; only RequestHeaderModifier and ResponseHeaderModifier are)",
                        t.as_str()
                    )
                })
            })
        })
        .collect();
    // Session persistence settings Envoy cannot honour: the session still persists, without
    // them.
    for (i, rule) in r.spec.rules.iter().enumerate() {
        let Some(sp) = &rule.session_persistence else {
            continue;
        };
        for (field, why) in sp.unsupported() {
            unsupported.push(format!("rules[{i}].sessionPersistence.{field}: {why}"));
        }
        if session_backends(rule) > 1 {
            unsupported.push(format!(
                "rules[{i}].sessionPersistence: with several backendRefs a session sticks to an endpoint only while the weighted pick lands on its backend (use one backendRef)"
            ));
        }
    }
    let resolved_refs = match reason {
        None => Condition::new(
            "ResolvedRefs",
            true,
            "ResolvedRefs",
            "all references resolved",
        ),
        Some(reason) => Condition::new(
            "ResolvedRefs",
            false,
            reason,
            format!(
                "{} ({})",
                messages.join("; "),
                match kind {
                    RouteKind::Http | RouteKind::Grpc => "requests for these backends get 500",
                    RouteKind::Tls | RouteKind::Tcp => {
                        "connections for these backends are closed"
                    }
                }
            ),
        ),
    };
    let parents = set
        .resolve_parents_of(kind, r)
        .into_iter()
        .map(|p| {
            let pr = &r.spec.parent_refs[p.index];
            let accepted = match &p.result {
                Ok(_) if !unsupported.is_empty() => Condition::new(
                    "Accepted",
                    false,
                    "UnsupportedValue",
                    format!("{} (the route is otherwise served)", unsupported.join("; ")),
                ),
                Ok(listeners) => Condition::new(
                    "Accepted",
                    true,
                    "Accepted",
                    format!(
                        "attached to listener{} {}",
                        if listeners.len() == 1 { "" } else { "s" },
                        listeners
                            .iter()
                            .map(|l| l.listener.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ),
                Err((reason, message)) => {
                    Condition::new("Accepted", false, reason.as_str(), message.clone())
                }
            };
            RouteParentStatus {
                parent_ref: ParentReference {
                    group: pr.group.clone().unwrap_or_else(|| GATEWAY_GROUP.to_owned()),
                    kind: pr.kind.clone().unwrap_or_else(|| "Gateway".to_owned()),
                    namespace: p.gateway.namespace.clone(),
                    name: p.gateway.name.clone(),
                    section_name: pr.section_name.clone(),
                    port: pr.port.as_ref().map(|p| p.value),
                },
                conditions: vec![accepted, resolved_refs.clone()],
            }
        })
        .collect();
    RouteStatus {
        namespace: r.metadata.namespace.clone(),
        name: r.metadata.name.clone(),
        source: r.source.to_string(),
        parents,
        unresolved_backend_refs: unresolved,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::set::ConfigSet;

    const GATEWAY: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: { name: edge }
spec:
  gatewayClassName: ballast
  listeners:
  - { name: http, port: 80, protocol: HTTP }
  - name: https
    port: 443
    protocol: HTTPS
    hostname: "*.example.com"
    tls: { certificateRefs: [{ name: example-tls }, { group: cert-manager.io, kind: Certificate, name: c }] }
  - { name: open, port: 8080, protocol: HTTP, hostname: open.example.com, allowedRoutes: { namespaces: { from: All } } }
---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: { name: web }
spec: { endpoints: [{ address: 127.0.0.1, port: 8080 }] }
"#;

    const SECRET: &str = "apiVersion: v1\nkind: Secret\nmetadata: { name: example-tls }\ntype: kubernetes.io/tls\n\
        stringData:\n  tls.crt: \"-----BEGIN CERTIFICATE-----\\nMII\\n-----END CERTIFICATE-----\"\n  \
        tls.key: \"-----BEGIN PRIVATE KEY-----\\nMII\\n-----END PRIVATE KEY-----\"\n";

    fn route(name: &str, ns: &str, parent: &str, hostnames: &str, backends: &str) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: {name}, namespace: {ns} }}\n\
             spec:\n  parentRefs: [{parent}]\n  hostnames: [{hostnames}]\n  rules:\n  - backendRefs: [{backends}]\n"
        )
    }

    fn status_of(routes: &[String], with_secret: bool) -> (ConfigSet, ConfigStatus) {
        let mut files = vec![("gw.yaml".to_owned(), GATEWAY.to_owned())];
        for (i, r) in routes.iter().enumerate() {
            files.push((format!("r{i}.yaml"), r.clone()));
        }
        if with_secret {
            files.push(("secret.yaml".to_owned(), SECRET.to_owned()));
        }
        let set = ConfigSet::build(files).unwrap_or_else(|e| panic!("{e:?}"));
        let status = compute(&set);
        (set, status)
    }

    fn route_status<'a>(s: &'a ConfigStatus, name: &str) -> &'a RouteStatus {
        s.http_routes.iter().find(|r| r.name == name).unwrap()
    }

    /// (type, status, reason) of each condition of each parent.
    fn conds(r: &RouteStatus) -> Vec<Vec<(String, ConditionStatus, String)>> {
        r.parents
            .iter()
            .map(|p| {
                p.conditions
                    .iter()
                    .map(|c| (c.type_.clone(), c.status, c.reason.clone()))
                    .collect()
            })
            .collect()
    }

    fn c(t: &str, ok: bool, reason: &str) -> (String, ConditionStatus, String) {
        let s = if ok {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        };
        (t.to_owned(), s, reason.to_owned())
    }

    #[test]
    fn accepted_route_attaches_where_hostnames_intersect() {
        let (set, s) = status_of(
            &[route(
                "web",
                "default",
                "{ name: edge }",
                "web.example.com",
                "{ name: web }",
            )],
            true,
        );
        let r = route_status(&s, "web");
        assert_eq!(
            conds(r),
            vec![vec![
                c("Accepted", true, "Accepted"),
                c("ResolvedRefs", true, "ResolvedRefs")
            ]]
        );
        assert_eq!(
            r.parents[0].conditions[0].message,
            "attached to listeners http, https"
        );
        let att = set.attached_routes(&ObjectKey::new("default", "edge"));
        let got: Vec<(&str, Vec<String>)> = att
            .iter()
            .map(|a| (a.listener.as_str(), a.hostnames.clone()))
            .collect();
        // `open` only serves open.example.com, which does not intersect web.example.com.
        assert_eq!(
            got,
            vec![
                ("http", vec!["web.example.com".to_owned()]),
                ("https", vec!["web.example.com".to_owned()])
            ]
        );
        assert!(r.unresolved_backend_refs.is_empty());
        let g = &s.gateways[0];
        let attached: Vec<(&str, u32)> = g
            .listeners
            .iter()
            .map(|l| (l.name.as_str(), l.attached_routes))
            .collect();
        assert_eq!(attached, vec![("http", 1), ("https", 1), ("open", 0)]);
    }

    #[test]
    fn grpc_routes_get_route_status_and_count_as_attached() {
        let grpc = "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: { name: web }\n\
            spec:\n  parentRefs: [{ name: edge, sectionName: http }]\n  rules:\n  - backendRefs: [{ name: web }, { name: gone }]\n"
            .to_owned();
        let (_, s) = status_of(&[grpc], true);
        assert!(s.http_routes.is_empty());
        let r = &s.grpc_routes[0];
        assert_eq!((r.namespace.as_str(), r.name.as_str()), ("default", "web"));
        assert_eq!(r.unresolved_backend_refs.len(), 1);
        assert_eq!(r.parents[0].conditions[0].type_, "Accepted");
        assert!(r.parents[0].conditions[0].is_true());
        let attached: Vec<(&str, u32)> = s.gateways[0]
            .listeners
            .iter()
            .map(|l| (l.name.as_str(), l.attached_routes))
            .collect();
        assert_eq!(attached, vec![("http", 1), ("https", 0), ("open", 0)]);
        assert!(
            s.problems()
                .iter()
                .any(|p| p.contains("GRPCRoute default/web: parent default/edge/http: ResolvedRefs=False BackendNotFound")),
            "{:?}",
            s.problems()
        );
    }

    #[test]
    fn missing_gateway_or_section_is_no_matching_parent() {
        let (_, s) = status_of(
            &[
                route(
                    "a",
                    "default",
                    "{ name: nope }",
                    "web.example.com",
                    "{ name: web }",
                ),
                route(
                    "b",
                    "default",
                    "{ name: edge, sectionName: nope }",
                    "web.example.com",
                    "{ name: web }",
                ),
                route(
                    "c",
                    "default",
                    "{ name: edge, port: 9999 }",
                    "web.example.com",
                    "{ name: web }",
                ),
                route(
                    "d",
                    "default",
                    "{ name: edge, kind: Service, group: \"\" }",
                    "web.example.com",
                    "{ name: web }",
                ),
            ],
            true,
        );
        for (name, message) in [
            ("a", "Gateway default/nope not found"),
            ("b", "Gateway default/edge has no listener \"nope\""),
            ("c", "Gateway default/edge has no listener with port 9999"),
            (
                "d",
                "parent /Service is not a Gateway; only gateway.networking.k8s.io Gateway is supported",
            ),
        ] {
            let r = route_status(&s, name);
            assert_eq!(
                conds(r)[0][0],
                c("Accepted", false, "NoMatchingParent"),
                "{name}"
            );
            assert_eq!(r.parents[0].conditions[0].message, message);
        }
    }

    #[test]
    fn hostname_and_namespace_mismatches() {
        let (set, s) = status_of(
            &[
                route(
                    "h",
                    "default",
                    "{ name: edge, sectionName: https }",
                    "web.other.org",
                    "{ name: web }",
                ),
                route(
                    "n",
                    "team",
                    "{ name: edge, namespace: default, sectionName: http }",
                    "web.example.com",
                    "",
                ),
                route("o", "team", "{ name: edge, namespace: default }", "", ""),
            ],
            true,
        );
        assert_eq!(
            conds(route_status(&s, "h"))[0][0],
            c("Accepted", false, "NoMatchingListenerHostname")
        );
        assert_eq!(
            conds(route_status(&s, "n"))[0][0],
            c("Accepted", false, "NotAllowedByListeners")
        );
        // Without a sectionName the route reaches the listener that allows all namespaces, and
        // without hostnames it takes the listener's.
        let o = route_status(&s, "o");
        assert_eq!(conds(o)[0][0], c("Accepted", true, "Accepted"));
        let att = set.attached_routes(&ObjectKey::new("default", "edge"));
        let got: Vec<(&str, &str, Vec<String>)> = att
            .iter()
            .map(|a| {
                (
                    a.route.metadata.name.as_str(),
                    a.listener.as_str(),
                    a.hostnames.clone(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![("o", "open", vec!["open.example.com".to_owned()])]
        );
    }

    /// Session persistence settings Envoy cannot honour (idle timeout, a Session cookie's or a
    /// header session's absolute timeout, several backends) are `Accepted=False
    /// UnsupportedValue` naming the field; the route stays attached and served.
    #[test]
    fn unsupported_session_persistence_is_unsupported_value() {
        let web = "{ group: ballast.dev, kind: Backend, name: web }";
        let r = |name: &str, backends: &str, sp: &str| {
            route(
                name,
                "default",
                "{ name: edge }",
                "web.example.com",
                backends,
            ) + &format!("    sessionPersistence: {sp}\n")
        };
        let two = format!("{web}, {{ group: ballast.dev, kind: Backend, name: api }}");
        let (_, s) = status_of(
            &[
                r("idle", web, "{ idleTimeout: 10m }"),
                r("session", web, "{ absoluteTimeout: 1h }"),
                r("header", web, "{ type: Header, absoluteTimeout: 1h }"),
                r("split", &two, "{ sessionName: s }"),
                r(
                    "ok",
                    web,
                    "{ absoluteTimeout: 1h, cookieConfig: { lifetimeType: Permanent } }",
                ),
                r("header-ok", web, "{ type: Header, header: { name: x-s } }"),
            ],
            true,
        );
        let message = |name: &str| {
            let st = route_status(&s, name);
            assert_eq!(
                st.parents[0].conditions[0].reason, "UnsupportedValue",
                "{name}"
            );
            st.parents[0].conditions[0].message.clone()
        };
        assert!(
            message("idle").starts_with("rules[0].sessionPersistence.idleTimeout: "),
            "{}",
            message("idle")
        );
        assert!(message("session").starts_with("rules[0].sessionPersistence.absoluteTimeout: "));
        assert!(message("header").starts_with("rules[0].sessionPersistence.absoluteTimeout: "));
        assert!(
            message("split").starts_with("rules[0].sessionPersistence: with several backendRefs")
        );
        for ok in ["ok", "header-ok"] {
            assert_eq!(
                conds(route_status(&s, ok))[0][0],
                c("Accepted", true, "Accepted")
            );
        }
        // Still attached: the listener counts all six.
        assert_eq!(s.gateways[0].listeners[0].attached_routes, 6);
    }

    #[test]
    fn unsupported_backend_ref_filters_are_unsupported_value() {
        let (_, s) = status_of(
            &[
                route(
                    "r",
                    "default",
                    "{ name: edge }",
                    "web.example.com",
                    "{ group: ballast.dev, kind: Backend, name: web, filters: [{ type: RequestHeaderModifier, requestHeaderModifier: { set: [{ name: x, value: y }] } }, { type: URLRewrite, urlRewrite: { hostname: a.example } }] }",
                ),
                route(
                    "ok",
                    "default",
                    "{ name: edge }",
                    "web.example.com",
                    "{ group: ballast.dev, kind: Backend, name: web, filters: [{ type: RequestHeaderModifier, requestHeaderModifier: { set: [{ name: x, value: y }] } }] }",
                ),
            ],
            true,
        );
        let r = route_status(&s, "r");
        assert_eq!(
            conds(r)[0],
            vec![
                c("Accepted", false, "UnsupportedValue"),
                c("ResolvedRefs", true, "ResolvedRefs")
            ]
        );
        assert_eq!(
            r.parents[0].conditions[0].message,
            "rules[0].backendRefs[0].filters[1].type: filter URLRewrite is not supported on a backendRef \
             (ignored; only RequestHeaderModifier and ResponseHeaderModifier are) (the route is otherwise served)"
        );
        assert_eq!(
            conds(route_status(&s, "ok"))[0],
            vec![
                c("Accepted", true, "Accepted"),
                c("ResolvedRefs", true, "ResolvedRefs")
            ]
        );
        // Still attached: the listener counts it.
        assert_eq!(
            s.gateways[0]
                .listeners
                .iter()
                .map(|l| l.attached_routes)
                .sum::<u32>(),
            4
        );
    }

    #[test]
    fn unresolved_backends_are_status_not_errors() {
        let (set, s) = status_of(
            &[route(
                "r",
                "default",
                "{ name: edge }",
                "web.example.com",
                "{ group: ballast.dev, kind: Backend, name: web, weight: 3 }, { name: missing }, { group: example.com, kind: Thing, name: svc }",
            )],
            true,
        );
        let r = route_status(&s, "r");
        assert_eq!(
            conds(r)[0],
            vec![
                c("Accepted", true, "Accepted"),
                c("ResolvedRefs", false, "BackendNotFound")
            ]
        );
        assert_eq!(
            r.parents[0].conditions[1].message,
            "rules[0].backendRefs[1]: Service default/missing not found; rules[0].backendRefs[2]: unsupported kind \
             example.com/Thing; only core Service and ballast.dev/Backend are supported (requests for these backends get 500)"
        );
        let refs: Vec<(usize, usize, &str)> = r
            .unresolved_backend_refs
            .iter()
            .map(|u| (u.rule, u.backend_ref, u.reason.as_str()))
            .collect();
        assert_eq!(refs, vec![(0, 1, "BackendNotFound"), (0, 2, "InvalidKind")]);
        let route = &set.http_routes[&ObjectKey::new("default", "r")];
        let res: Vec<_> = route.spec.rules[0]
            .backend_refs
            .iter()
            .map(|b| set.resolve_backend(route, b))
            .collect();
        assert!(
            matches!(res[0], crate::set::BackendRefResolution::Resolved(ref b) if b.metadata.name == "web")
        );
        assert_eq!(res[1], crate::set::BackendRefResolution::NotFound);
        assert_eq!(res[2], crate::set::BackendRefResolution::InvalidKind);
    }

    #[test]
    fn missing_secret_makes_listener_unresolved_and_unprogrammed() {
        let (_, without) = status_of(&[], false);
        let https = &without.gateways[0].listeners[1];
        let got: Vec<_> = https
            .conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status, c.reason.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("Accepted", ConditionStatus::True, "Accepted"),
                (
                    "ResolvedRefs",
                    ConditionStatus::False,
                    "InvalidCertificateRef"
                ),
                ("Programmed", ConditionStatus::False, "Invalid"),
            ]
        );
        assert_eq!(
            https.conditions[1].message,
            "Secret default/example-tls not found; certificateRef default/c has unsupported kind \"Certificate\" \
             (group \"cert-manager.io\"); only core Secret is supported"
        );
        let (_, with) = status_of(&[], true);
        let https = &with.gateways[0].listeners[1];
        // The Certificate ref still does not resolve, but the listener has a usable certificate.
        assert_eq!(https.conditions[1].status, ConditionStatus::False);
        assert_eq!(https.conditions[2].status, ConditionStatus::True);
        assert!(with.gateways[0].conditions.iter().all(Condition::is_true));
    }

    #[test]
    fn problems_and_json_shape() {
        let (_, s) = status_of(
            &[route(
                "a",
                "default",
                "{ name: nope, sectionName: x }",
                "",
                "{ group: ballast.dev, kind: Backend, name: web }",
            )],
            true,
        );
        assert_eq!(
            s.problems(),
            vec![
                "gw.yaml:2:1: Gateway default/edge: listener https: ResolvedRefs=False InvalidCertificateRef: \
                 certificateRef default/c has unsupported kind \"Certificate\" (group \"cert-manager.io\"); only core Secret is supported",
                "r0.yaml:1:1: HTTPRoute default/a: parent default/nope/x: Accepted=False NoMatchingParent: Gateway default/nope not found",
            ]
        );
        let json = serde_json::to_value(&s).unwrap();
        let parent = &json["httpRoutes"][0]["parents"][0];
        assert_eq!(parent["parentRef"]["sectionName"], "x");
        assert_eq!(parent["parentRef"]["group"], "gateway.networking.k8s.io");
        assert_eq!(parent["conditions"][0]["type"], "Accepted");
        assert_eq!(parent["conditions"][0]["status"], "False");
        assert_eq!(json["gateways"][0]["listeners"][0]["attachedRoutes"], 0);
        assert!(parent["parentRef"].get("port").is_none());
    }
}
