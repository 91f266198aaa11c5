//! Gateway API status for a [`ConfigSet`]: per route and parentRef `Accepted` / `ResolvedRefs`,
//! per Gateway and listener `Accepted` / `ResolvedRefs` / `Programmed`.
//!
//! Plain serializable data (field names as in Gateway API status) so the binary can print it as
//! JSON or YAML, `ballast validate` can list the problems, and `/debug/sources` can show it.
//! An unresolved reference is status, not an error: the config still loads, and the affected
//! rule answers 500 (backend) or the listener is not programmed (certificate).

use serde::Serialize;

use crate::kinds::*;
use crate::set::{BackendRefResolution, CertificateRefResolution, ConfigSet};

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

/// The status of every Gateway and HTTPRoute, in key order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigStatus {
    pub gateways: Vec<GatewayStatus>,
    pub http_routes: Vec<RouteStatus>,
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
        for r in &self.http_routes {
            for p in &r.parents {
                for c in p.conditions.iter().filter(|c| !c.is_true()) {
                    out.push(format!(
                        "{}: HTTPRoute {}/{}: parent {}/{}{}: {}=False {}: {}",
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
        }
        out
    }
}

/// Computes the status of every Gateway and HTTPRoute in `set`.
pub fn compute(set: &ConfigSet) -> ConfigStatus {
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
    }
}

fn gateway_status(set: &ConfigSet, g: &Gateway) -> GatewayStatus {
    let attachments = set.attached_routes(&g.key());
    let mut listeners = Vec::new();
    for l in &g.spec.listeners {
        let mut bad = Vec::new();
        let mut resolved = 0;
        for r in l.tls.iter().flat_map(|t| &t.certificate_refs) {
            let ns = r.namespace.as_deref().unwrap_or(&g.metadata.namespace);
            match set.resolve_certificate(g, r) {
                CertificateRefResolution::Resolved(_) => resolved += 1,
                CertificateRefResolution::NotFound => {
                    bad.push(format!("Secret {ns}/{} not found", r.name.value))
                }
                CertificateRefResolution::InvalidKind => bad.push(format!(
                    "certificateRef {ns}/{} has unsupported kind {:?} (group {:?}); only core Secret is supported",
                    r.name.value, r.kind.value, r.group
                )),
            }
        }
        let refs_ok = bad.is_empty();
        let programmed = *l.protocol == ListenerProtocol::Http || resolved > 0;
        let attached = attachments.iter().filter(|a| a.listener == *l.name).count();
        listeners.push(ListenerStatus {
            name: l.name.value.clone(),
            attached_routes: u32::try_from(attached).unwrap_or(u32::MAX),
            conditions: vec![
                Condition::new("Accepted", true, "Accepted", "listener is valid"),
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
                        "InvalidCertificateRef",
                        bad.join("; "),
                    )
                },
                if programmed {
                    Condition::new("Programmed", true, "Programmed", "listener is served")
                } else {
                    Condition::new(
                        "Programmed",
                        false,
                        "Invalid",
                        "no certificateRef resolves to a Secret; the listener is not served",
                    )
                },
            ],
        });
    }
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
            Condition::new("Accepted", true, "Accepted", "Gateway is valid"),
            if any_programmed {
                Condition::new("Programmed", true, "Programmed", "Gateway is served")
            } else {
                Condition::new("Programmed", false, "Invalid", "no listener can be served")
            },
        ],
        listeners,
    }
}

fn route_status(set: &ConfigSet, r: &HttpRoute) -> RouteStatus {
    let mut unresolved = Vec::new();
    let mut messages = Vec::new();
    let mut reason = None;
    for (i, rule) in r.spec.rules.iter().enumerate() {
        for (j, b) in rule.backend_refs.iter().enumerate() {
            let ns = b.namespace_or(&r.metadata.namespace);
            let why = match set.resolve_backend(r, b) {
                BackendRefResolution::Resolved(_) => continue,
                BackendRefResolution::NotFound => {
                    messages.push(format!(
                        "rules[{i}].backendRefs[{j}]: Backend {ns}/{} not found",
                        b.name.value
                    ));
                    "BackendNotFound"
                }
                BackendRefResolution::InvalidKind => {
                    messages.push(format!(
                        "rules[{i}].backendRefs[{j}]: unsupported kind {}/{}; only ballast.dev/Backend is supported",
                        b.group.as_ref().map_or(BALLAST_GROUP, |g| g.as_str()),
                        b.kind.as_ref().map_or("Backend", |k| k.as_str())
                    ));
                    "InvalidKind"
                }
            };
            reason.get_or_insert(why);
            unresolved.push(UnresolvedBackendRef {
                rule: i,
                backend_ref: j,
                reason: why.to_owned(),
            });
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
                "{} (requests for these backends get 500)",
                messages.join("; ")
            ),
        ),
    };
    let parents = set
        .resolve_parents(r)
        .into_iter()
        .map(|p| {
            let pr = &r.spec.parent_refs[p.index];
            let accepted = match &p.result {
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
    }
}
