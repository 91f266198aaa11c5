//! `gateway.networking.k8s.io/v1beta1` `ReferenceGrant`: lets objects of other namespaces refer to
//! objects of this one. Without a grant, a cross-namespace `backendRef` or `certificateRef` does
//! not resolve (status `ResolvedRefs=False RefNotPermitted`): a route in one namespace must not be
//! able to send traffic to, or a Gateway serve the key of, another namespace's objects unless that
//! namespace's owner agreed. The check is [`crate::ConfigSet::ref_permitted`].

use serde::Deserialize;

use super::{Metadata, Source, object_kind};
use crate::spanned::Spanned;

#[derive(Clone, Debug)]
pub struct ReferenceGrant {
    pub metadata: Metadata,
    pub spec: ReferenceGrantSpec,
    pub source: Source,
}
object_kind!(ReferenceGrant, super::Kind::ReferenceGrant);

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceGrantSpec {
    /// Who may refer (at least one).
    pub from: Vec<ReferenceGrantFrom>,
    /// What they may refer to, in the grant's own namespace (at least one).
    pub to: Vec<ReferenceGrantTo>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceGrantFrom {
    /// `""` is the core group.
    pub group: String,
    pub kind: Spanned<String>,
    pub namespace: Spanned<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceGrantTo {
    /// `""` is the core group.
    pub group: String,
    pub kind: Spanned<String>,
    /// Only this object; all objects of the kind when omitted.
    #[serde(default)]
    pub name: Option<Spanned<String>>,
}

/// An API group and kind, the unit a [`ReferenceGrant`] grants by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupKind<'a> {
    /// `""` is the core group.
    pub group: &'a str,
    pub kind: &'a str,
}

impl<'a> GroupKind<'a> {
    pub const fn new(group: &'a str, kind: &'a str) -> Self {
        GroupKind { group, kind }
    }
}

/// The referrer kinds ballast checks grants for.
pub const HTTP_ROUTE_GK: GroupKind<'static> = GroupKind::new(super::GATEWAY_GROUP, "HTTPRoute");
pub const GATEWAY_GK: GroupKind<'static> = GroupKind::new(super::GATEWAY_GROUP, "Gateway");
/// The core `Secret` (target of certificateRefs).
pub const SECRET_GK: GroupKind<'static> = GroupKind::new("", "Secret");

impl ReferenceGrant {
    /// Whether this grant (which lives in the target's namespace) lets `from` in `from_ns` refer to
    /// the object `to`/`to_name` of the grant's namespace.
    pub fn permits(
        &self,
        from: GroupKind<'_>,
        from_ns: &str,
        to: GroupKind<'_>,
        to_name: &str,
    ) -> bool {
        self.spec
            .from
            .iter()
            .any(|f| f.group == from.group && *f.kind == from.kind && *f.namespace == from_ns)
            && self.spec.to.iter().any(|t| {
                t.group == to.group
                    && *t.kind == to.kind
                    && t.name.as_ref().is_none_or(|n| **n == to_name)
            })
    }
}

#[cfg(test)]
mod tests {
    use crate::set::{BackendRefResolution, CertificateRefResolution};
    use crate::status::compute;
    use crate::{ConfigSet, ObjectKey, parse_file};

    const ROUTE: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
        metadata: { name: r, namespace: apps }\nspec:\n  parentRefs: [{ name: edge, namespace: infra }]\n\
        \x20 rules: [{ backendRefs: [{ name: web, namespace: backends }, { name: local }] }]\n";
    const BACKENDS: &str = "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: { name: web, namespace: backends }\n\
        spec: { endpoints: [{ address: 127.0.0.1, port: 80 }] }\n---\n\
        apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: { name: local, namespace: apps }\n\
        spec: { endpoints: [{ address: 127.0.0.1, port: 81 }] }\n";

    fn grant(ns: &str, from: &str, to: &str) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\n\
             metadata: {{ name: g, namespace: {ns} }}\nspec:\n  from: [{from}]\n  to: [{to}]\n"
        )
    }

    fn resolutions(extra: &str) -> Vec<BackendRefResolution> {
        let set =
            ConfigSet::build([("r.yaml", ROUTE), ("b.yaml", BACKENDS), ("g.yaml", extra)]).unwrap();
        let r = &set.http_routes[&ObjectKey::new("apps", "r")];
        r.spec.rules[0]
            .backend_refs
            .iter()
            .map(|b| set.resolve_backend(r, b))
            .collect()
    }

    const FROM_APPS: &str =
        "{ group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: apps }";

    /// A cross-namespace backendRef resolves only with a grant in the target namespace naming
    /// the route's kind and namespace and the Backend kind (and its name, if any).
    #[test]
    fn cross_namespace_backend_needs_a_matching_grant() {
        let permitted =
            |extra: &str| matches!(resolutions(extra)[0], BackendRefResolution::Resolved(_));
        // Same namespace: always resolves.
        assert!(matches!(
            resolutions("")[1],
            BackendRefResolution::Resolved(_)
        ));
        assert_eq!(resolutions("")[0], BackendRefResolution::NotPermitted);
        let to_backend = "{ group: ballast.dev, kind: Backend }";
        assert!(permitted(&grant("backends", FROM_APPS, to_backend)));
        assert!(permitted(&grant(
            "backends",
            FROM_APPS,
            "{ group: ballast.dev, kind: Backend, name: web }"
        )));
        for (ns, from, to) in [
            // Grant in the wrong namespace (the route's, not the target's).
            ("apps", FROM_APPS, to_backend),
            // Another referrer namespace, kind or group.
            (
                "backends",
                "{ group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: other }",
                to_backend,
            ),
            (
                "backends",
                "{ group: gateway.networking.k8s.io, kind: GRPCRoute, namespace: apps }",
                to_backend,
            ),
            (
                "backends",
                "{ group: '', kind: HTTPRoute, namespace: apps }",
                to_backend,
            ),
            // Another target name, kind or group.
            (
                "backends",
                FROM_APPS,
                "{ group: ballast.dev, kind: Backend, name: other }",
            ),
            ("backends", FROM_APPS, "{ group: '', kind: Service }"),
            ("backends", FROM_APPS, "{ group: other.dev, kind: Backend }"),
        ] {
            assert_eq!(
                resolutions(&grant(ns, from, to))[0],
                BackendRefResolution::NotPermitted,
                "{ns} {from} {to}"
            );
        }
    }

    /// Not-permitted wins over not-found: status must not reveal whether another namespace has
    /// an object of that name.
    #[test]
    fn not_permitted_is_reported_before_not_found() {
        let set = ConfigSet::build([("r.yaml", ROUTE)]).unwrap();
        let s = compute(&set);
        let c = &s.http_routes[0].parents[0].conditions[1];
        assert_eq!(
            (c.type_.as_str(), c.reason.as_str()),
            ("ResolvedRefs", "RefNotPermitted")
        );
        assert!(
            c.message.starts_with(
                "rules[0].backendRefs[0]: Service backends/web is in another namespace and no ReferenceGrant in backends allows HTTPRoute apps/r to use it"
            ),
            "{}",
            c.message
        );
        let u: Vec<_> = s.http_routes[0]
            .unresolved_backend_refs
            .iter()
            .map(|u| u.reason.as_str())
            .collect();
        assert_eq!(u, ["RefNotPermitted", "BackendNotFound"]);
    }

    /// Backend status lists the routes that reach it: an ungranted cross-namespace ref does not.
    #[test]
    fn backend_status_lists_routes_that_resolve_to_it() {
        let routes_of = |extra: &str| {
            let set =
                ConfigSet::build([("r.yaml", ROUTE), ("b.yaml", BACKENDS), ("g.yaml", extra)])
                    .unwrap();
            compute(&set)
                .backends
                .iter()
                .map(|b| {
                    (
                        b.namespace.clone(),
                        b.routes.clone(),
                        b.conditions[1].reason.clone(),
                    )
                })
                .collect::<Vec<_>>()
        };
        let apps_r = vec!["apps/r".to_owned()];
        assert_eq!(
            routes_of(""),
            [
                ("apps".to_owned(), apps_r.clone(), "Programmed".to_owned()),
                ("backends".to_owned(), vec![], "NotReferenced".to_owned()),
            ]
        );
        let g = grant(
            "backends",
            FROM_APPS,
            "{ group: ballast.dev, kind: Backend }",
        );
        assert_eq!(
            routes_of(&g)[1],
            ("backends".to_owned(), apps_r, "Programmed".to_owned())
        );
    }

    /// A RequestMirror target is a reference like a backendRef: a grant is needed across
    /// namespaces, and status names the filter.
    #[test]
    fn mirror_targets_need_grants_and_show_in_status() {
        let route = ROUTE.replace(
            "rules: [{ backendRefs: [{ name: web, namespace: backends }, { name: local }] }]",
            "rules: [{ filters: [{ type: RequestMirror, requestMirror: { backendRef: { name: web, namespace: backends } } }], backendRefs: [{ name: local }] }]",
        );
        let status = |extra: &str| {
            let set = ConfigSet::build([
                ("r.yaml", route.as_str()),
                ("b.yaml", BACKENDS),
                ("g.yaml", extra),
            ])
            .unwrap();
            let s = compute(&set);
            let c = s.http_routes[0].parents[0].conditions[1].clone();
            (
                c.reason,
                c.message,
                s.http_routes[0].unresolved_backend_refs.len(),
            )
        };
        let (reason, message, listed) = status("");
        assert_eq!(reason, "RefNotPermitted");
        assert!(
            message
                .starts_with("rules[0].filters[0].requestMirror.backendRef: Backend backends/web"),
            "{message}"
        );
        assert_eq!(listed, 0);
        let g = grant(
            "backends",
            FROM_APPS,
            "{ group: ballast.dev, kind: Backend }",
        );
        assert_eq!(status(&g).0, "ResolvedRefs");
    }

    #[test]
    fn cross_namespace_certificate_needs_a_grant() {
        let gw = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: edge, namespace: infra }\n\
            spec:\n  gatewayClassName: ballast\n  listeners:\n  - name: https\n    port: 443\n    protocol: HTTPS\n\
            \x20   tls: { certificateRefs: [{ name: tls, namespace: certs }] }\n";
        let secret = "apiVersion: v1\nkind: Secret\nmetadata: { name: tls, namespace: certs }\ntype: kubernetes.io/tls\n\
             stringData:\n  tls.crt: |\n    -----BEGIN CERTIFICATE-----\n    x\n    -----END CERTIFICATE-----\n\
             \x20 tls.key: |\n    -----BEGIN PRIVATE KEY-----\n    x\n    -----END PRIVATE KEY-----\n";
        let check = |extra: &str| {
            let set =
                ConfigSet::build([("g.yaml", gw), ("s.yaml", secret), ("rg.yaml", extra)]).unwrap();
            let g = &set.gateways[&ObjectKey::new("infra", "edge")];
            let r = &g.spec.listeners[0].tls.as_ref().unwrap().certificate_refs[0];
            let res = set.resolve_certificate(g, r);
            let l = &compute(&set).gateways[0].listeners[0];
            (res, l.conditions[1].reason.clone(), l.conditions[2].status)
        };
        let (res, reason, programmed) = check("");
        assert_eq!(res, CertificateRefResolution::NotPermitted);
        assert_eq!(reason, "RefNotPermitted");
        assert_eq!(programmed, crate::status::ConditionStatus::False);
        let from_gw = "{ group: gateway.networking.k8s.io, kind: Gateway, namespace: infra }";
        let (res, reason, programmed) =
            check(&grant("certs", from_gw, "{ group: '', kind: Secret }"));
        assert!(matches!(res, CertificateRefResolution::Resolved(_)));
        assert_eq!(reason, "ResolvedRefs");
        assert_eq!(programmed, crate::status::ConditionStatus::True);
        // A grant for routes does not let the Gateway use the Secret.
        let (res, ..) = check(&grant("certs", FROM_APPS, "{ group: '', kind: Secret }"));
        assert_eq!(res, CertificateRefResolution::NotPermitted);
    }

    #[test]
    fn grant_validation_and_versions() {
        let errs: Vec<String> = parse_file(
            "g.yaml",
            "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: { name: g }\n\
             spec: { from: [], to: [{ group: '', kind: '', name: Bad_Name }] }\n",
        )
        .unwrap_err()
        .iter()
        .map(|e| e.to_string())
        .collect();
        assert_eq!(errs.len(), 3, "{errs:#?}");
        assert!(
            errs[0].starts_with("g.yaml:1:1: ReferenceGrant default/g: spec.from: must list"),
            "{errs:#?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.contains("spec.to[0].kind: kind must not be empty")),
            "{errs:#?}"
        );
        assert!(
            errs.iter().any(|e| e.starts_with(
                "g.yaml:4:53: ReferenceGrant default/g: spec.to[0].name: name \"Bad_Name\""
            )),
            "{errs:#?}"
        );
        // v1 (newer Gateway API) loads too; unknown fields are errors.
        let v1 = grant("b", FROM_APPS, "{ group: '', kind: Secret }").replace("v1beta1", "v1");
        assert_eq!(parse_file("g.yaml", &v1).unwrap().len(), 1);
        assert!(
            parse_file(
                "g.yaml",
                &v1.replace("kind: Secret", "kind: Secret, bogus: 1")
            )
            .is_err()
        );
    }
}
