//! Unit tests of TLSRoute / TCPRoute parsing, validation, attachment and status.

use crate::ConfigSet;
use crate::parse::parse_file;
use crate::status::{ConfigStatus, RouteStatus, compute};

fn errors(text: &str) -> Vec<String> {
    match parse_file("f.yaml", text) {
        Ok(o) => panic!("expected errors, parsed {} objects", o.len()),
        Err(es) => es.iter().map(ToString::to_string).collect(),
    }
}

const GATEWAY: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: { name: edge }
spec:
  gatewayClassName: ballast
  listeners:
  - { name: http, port: 80, protocol: HTTP }
  - { name: tls, port: 8443, protocol: TLS, tls: { mode: Passthrough } }
  - { name: tls-b, port: 8443, protocol: TLS, hostname: '*.b.example', tls: { mode: Passthrough } }
  - { name: tcp, port: 9000, protocol: TCP }
---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: { name: one }
spec: { endpoints: [{ address: 127.0.0.1, port: 7001 }] }
---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: { name: two, namespace: other }
spec: { endpoints: [{ address: 127.0.0.1, port: 7002 }] }
";

fn status(extra: &str) -> ConfigStatus {
    let set = ConfigSet::build([("g.yaml", format!("{GATEWAY}---\n{extra}"))]).unwrap();
    compute(&set)
}

fn conds(r: &RouteStatus) -> Vec<Vec<(String, bool, String)>> {
    r.parents
        .iter()
        .map(|p| {
            p.conditions
                .iter()
                .map(|c| (c.type_.clone(), c.is_true(), c.reason.clone()))
                .collect()
        })
        .collect()
}

fn c(t: &str, ok: bool, reason: &str) -> (String, bool, String) {
    (t.to_owned(), ok, reason.to_owned())
}

fn attached(s: &ConfigStatus) -> Vec<(String, u32)> {
    s.gateways[0]
        .listeners
        .iter()
        .map(|l| (l.name.clone(), l.attached_routes))
        .collect()
}

fn tls_route(name: &str, parent: &str, hostnames: &str, backends: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TLSRoute\nmetadata: {{ name: {name} }}\n\
         spec:\n  parentRefs: [{parent}]\n  hostnames: [{hostnames}]\n  rules: [{{ backendRefs: [{backends}] }}]\n---\n"
    )
}

/// Field errors name file:line:col and the field; the kind's shape is strict.
#[test]
fn parse_errors_name_file_line_col() {
    let head = "apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TLSRoute\nmetadata: {name: t}\nspec:\n";
    assert_eq!(
        errors(&format!("{head}  rules: []\n")),
        ["f.yaml:1:1: TLSRoute default/t: spec.rules: at least one rule is required"]
    );
    assert_eq!(
        errors(&format!(
            "{head}  hostnames: [\"a..example\"]\n  rules:\n  - backendRefs: []\n  - backendRefs:\n    - {{name: b, weight: 2000000}}\n"
        )),
        [
            "f.yaml:1:1: TLSRoute default/t: spec.rules[0].backendRefs: at least one backendRef is required",
            "f.yaml:5:15: TLSRoute default/t: spec.hostnames[0]: invalid hostname \"a..example\": expected lowercase DNS labels (a-z, 0-9, '-'), optionally prefixed by \"*.\"",
            "f.yaml:9:25: TLSRoute default/t: spec.rules[1].backendRefs[0].weight: weight 2000000 is out of range 0..=1000000",
        ]
    );
    // BackendRefs of L4 routes have no filters; TCPRoute has no hostnames.
    let e = errors(&format!(
        "{head}  rules: [{{backendRefs: [{{name: b, filters: []}}]}}]\n"
    ));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("f.yaml:5:36: TLSRoute default/t: spec.rules[0].backendRefs[0].filters: ")
            && e[0].contains("unknown field `filters`"),
        "{e:?}"
    );
    let e = errors(
        "apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TCPRoute\nmetadata: {name: t}\nspec:\n  hostnames: [a.example]\n  rules: [{backendRefs: [{name: b}]}]\n",
    );
    assert!(
        e[0].starts_with("f.yaml:5:3: TCPRoute default/t: ")
            && e[0].contains("unknown field `hostnames`"),
        "{e:?}"
    );
    assert_eq!(
        errors(
            "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: TCPRoute\nmetadata: {name: t}\nspec: {}\n"
        ),
        [
            "f.yaml:1:13: TCPRoute default/t: apiVersion: unsupported apiVersion \"gateway.networking.k8s.io/v1beta1\" for TCPRoute; expected gateway.networking.k8s.io/v1alpha2"
        ]
    );
    // TLSRoute is served as v1alpha2, v1alpha3 and v1 (same fields).
    for v in ["v1alpha2", "v1alpha3", "v1"] {
        let text = format!(
            "apiVersion: gateway.networking.k8s.io/{v}\nkind: TLSRoute\nmetadata: {{name: t}}\nspec:\n  rules: [{{backendRefs: [{{name: b, port: 443}}]}}]\n"
        );
        assert_eq!(parse_file("f.yaml", &text).map(|o| o.len()), Ok(1), "{v}");
    }
}

/// Listener shapes: TLS needs a mode (Passthrough without certificates, Terminate with
/// them), TCP takes no tls, and protocols conflicting on one port are refused.
#[test]
fn tls_and_tcp_listener_errors() {
    let gw = |listeners: &str| {
        errors(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: g}}\nspec:\n  gatewayClassName: c\n  listeners:\n{listeners}"
        ))
    };
    assert_eq!(
        gw("  - {name: a, port: 1, protocol: TLS}\n"),
        [
            "f.yaml:7:34: Gateway default/g: spec.listeners[0].tls: a TLS listener needs tls.mode (Passthrough, or Terminate with certificateRefs)"
        ]
    );
    assert_eq!(
        gw(
            "  - {name: a, port: 1, protocol: TLS, tls: {mode: Passthrough, certificateRefs: [{name: s}]}}\n"
        ),
        [
            "f.yaml:7:34: Gateway default/g: spec.listeners[0].tls.certificateRefs: a TLS listener in mode Passthrough does not decrypt; certificateRefs are not allowed"
        ]
    );
    assert_eq!(
        gw("  - {name: a, port: 1, protocol: TLS, tls: {mode: Terminate}}\n"),
        [
            "f.yaml:7:34: Gateway default/g: spec.listeners[0].tls.certificateRefs: a TLS listener in mode Terminate needs at least one certificateRef"
        ]
    );
    assert_eq!(
        gw("  - {name: a, port: 1, protocol: TCP, tls: {mode: Passthrough}}\n"),
        [
            "f.yaml:7:34: Gateway default/g: spec.listeners[0].tls: tls is only allowed on HTTPS and TLS listeners"
        ]
    );
    assert_eq!(
        gw(
            "  - {name: a, port: 1, protocol: HTTPS, tls: {mode: Passthrough, certificateRefs: [{name: s}]}}\n"
        ),
        [
            "f.yaml:7:34: Gateway default/g: spec.listeners[0].tls.mode: an HTTPS listener terminates TLS; use protocol TLS for Passthrough"
        ]
    );
}

/// Listeners Envoy cannot tell apart are not an error but Gateway API `Conflicted` (all of
/// them, no winner), not served and taking no routes: TLS with HTTPS on one port, two TCP
/// listeners on one port (TCP has no hostname to tell them apart), two TLS listeners with
/// the same hostname. The distinct listeners beside them are served.
#[test]
fn tls_and_tcp_port_conflicts_are_conflicted_listeners() {
    let text = "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: { name: g }
spec:
  gatewayClassName: c
  listeners:
  - { name: tls-a, port: 443, protocol: TLS, hostname: a.example, tls: { mode: Passthrough } }
  - { name: https-b, port: 443, protocol: HTTPS, hostname: b.example, tls: { certificateRefs: [{ name: s }] } }
  - { name: tcp-a, port: 9, protocol: TCP, hostname: a.example }
  - { name: tcp-b, port: 9, protocol: TCP, hostname: b.example }
  - { name: tls-any, port: 10, protocol: TLS, tls: { mode: Passthrough } }
  - { name: tls-any-again, port: 10, protocol: TLS, tls: { mode: Passthrough } }
  - { name: tls-c, port: 10, protocol: TLS, hostname: c.example, tls: { mode: Passthrough } }
  - { name: tcp, port: 11, protocol: TCP }
---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: { name: one }
spec: { endpoints: [{ address: 127.0.0.1, port: 7001 }] }
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: { name: on-conflicted }
spec:
  parentRefs: [{ name: g, sectionName: tcp-a }]
  rules: [{ backendRefs: [{ kind: Backend, group: ballast.dev, name: one }] }]
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: { name: on-tcp }
spec:
  parentRefs: [{ name: g }]
  rules: [{ backendRefs: [{ kind: Backend, group: ballast.dev, name: one }] }]
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TLSRoute
metadata: { name: on-tls }
spec:
  parentRefs: [{ name: g }]
  rules: [{ backendRefs: [{ kind: Backend, group: ballast.dev, name: one }] }]
";
    let set = ConfigSet::build([("g.yaml", text)]).expect("conflicts are status, not errors");
    let s = compute(&set);
    let g = &s.gateways[0];
    let listener = |name: &str| g.listeners.iter().find(|l| l.name == name).unwrap();
    let kinds = |name: &str| {
        listener(name)
            .conditions
            .iter()
            .map(|c| (c.type_.clone(), c.is_true(), c.reason.clone()))
            .filter(|(t, _, _)| t != "ResolvedRefs")
            .collect::<Vec<_>>()
    };
    for (name, reason) in [
        ("tls-a", "ProtocolConflict"),
        ("https-b", "ProtocolConflict"),
        ("tcp-a", "ProtocolConflict"),
        ("tcp-b", "ProtocolConflict"),
        ("tls-any", "HostnameConflict"),
        ("tls-any-again", "HostnameConflict"),
    ] {
        assert_eq!(
            kinds(name),
            [
                c("Accepted", false, reason),
                c("Programmed", false, reason),
                c("Conflicted", true, reason),
            ],
            "{name}"
        );
        assert_eq!(listener(name).attached_routes, 0, "{name}");
    }
    let msg = |name: &str| listener(name).conditions.last().unwrap().message.clone();
    assert!(
        msg("tls-a").contains("\"https-b\" (HTTPS)"),
        "{}",
        msg("tls-a")
    );
    assert!(
        msg("tcp-a").contains("\"tcp-b\" (TCP)") && msg("tcp-a").contains("one listener"),
        "{}",
        msg("tcp-a")
    );
    for (name, routes) in [("tls-c", 1), ("tcp", 1)] {
        assert_eq!(
            kinds(name),
            [
                c("Accepted", true, "Accepted"),
                c("Programmed", true, "Programmed")
            ],
            "{name}"
        );
        assert_eq!(listener(name).attached_routes, routes, "{name}");
    }
    assert_eq!(g.conditions[0].reason, "ListenersNotValid");
    assert!(g.conditions[0].is_true(), "some listeners are served");
    // A route naming only a conflicted listener is not accepted; the others attach to the
    // distinct listeners only.
    let tcp = |n: &str| s.tcp_routes.iter().find(|r| r.name == n).unwrap();
    assert_eq!(
        conds(tcp("on-conflicted"))[0][0],
        c("Accepted", false, "NoMatchingParent")
    );
    assert_eq!(conds(tcp("on-tcp"))[0][0], c("Accepted", true, "Accepted"));
    assert_eq!(
        conds(&s.tls_routes[0])[0][0],
        c("Accepted", true, "Accepted")
    );
    // Nothing is claimed on a conflicted listener (so translation builds nothing there).
    let claims = crate::l4_claims(&set, &crate::ObjectKey::new("default", "g"));
    let served: Vec<(&str, u32)> = claims
        .iter()
        .map(|c| (c.listener.as_str(), c.port))
        .collect();
    assert_eq!(served, [("tls-c", 10), ("tcp", 11)]);
}

/// TLSRoutes attach only to TLS listeners (by protocol default kinds), with hostname
/// intersection; TCPRoutes only to TCP listeners; attachedRoutes counts them.
#[test]
fn routes_attach_by_kind_and_hostname() {
    let s = status(&format!(
        "{}{}{}{}\
         apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TCPRoute\nmetadata: {{ name: t }}\n\
         spec:\n  parentRefs: [{{ name: edge }}]\n  rules: [{{ backendRefs: [{{ kind: Backend, group: ballast.dev, name: one }}] }}]\n---\n\
         apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TCPRoute\nmetadata: {{ name: t-http }}\n\
         spec:\n  parentRefs: [{{ name: edge, sectionName: http }}]\n  rules: [{{ backendRefs: [{{ kind: Backend, group: ballast.dev, name: one }}] }}]\n",
        // Any listener of the Gateway: the two TLS listeners (a.example on the catch-all,
        // x.b.example on both).
        tls_route(
            "a",
            "{ name: edge }",
            "a.example, x.b.example",
            "{ kind: Backend, group: ballast.dev, name: one }"
        ),
        // Only the *.b.example listener intersects.
        tls_route(
            "b",
            "{ name: edge, sectionName: tls-b }",
            "'*.example', c.b.example",
            "{ kind: Backend, group: ballast.dev, name: one }"
        ),
        // No hostname intersects the section's.
        tls_route(
            "c",
            "{ name: edge, sectionName: tls-b }",
            "c.example",
            "{ kind: Backend, group: ballast.dev, name: one }"
        ),
        // The HTTP listener does not admit TLSRoutes.
        tls_route(
            "d",
            "{ name: edge, port: 80 }",
            "a.example",
            "{ kind: Backend, group: ballast.dev, name: one }"
        ),
    ));
    let ok = vec![vec![
        c("Accepted", true, "Accepted"),
        c("ResolvedRefs", true, "ResolvedRefs"),
    ]];
    assert_eq!(conds(&s.tls_routes[0]), ok);
    assert_eq!(
        s.tls_routes[0].parents[0].conditions[0].message,
        "attached to listeners tls, tls-b"
    );
    assert_eq!(conds(&s.tls_routes[1]), ok);
    assert_eq!(
        conds(&s.tls_routes[2]),
        vec![vec![
            c("Accepted", false, "NoMatchingListenerHostname"),
            c("ResolvedRefs", true, "ResolvedRefs")
        ]]
    );
    assert_eq!(
        conds(&s.tls_routes[3]),
        vec![vec![
            c("Accepted", false, "NotAllowedByListeners"),
            c("ResolvedRefs", true, "ResolvedRefs")
        ]]
    );
    assert_eq!(
        s.tls_routes[3].parents[0].conditions[0].message,
        "no listener of Gateway default/edge allows kind TLSRoute (allowedRoutes.kinds or its protocol)"
    );
    assert_eq!(conds(&s.tcp_routes[0]), ok);
    assert_eq!(
        s.tcp_routes[0].parents[0].conditions[0].message,
        "attached to listener tcp"
    );
    assert_eq!(
        conds(&s.tcp_routes[1])[0][0],
        c("Accepted", false, "NotAllowedByListeners")
    );
    assert_eq!(
        attached(&s),
        [
            ("http".to_owned(), 0),
            ("tls".to_owned(), 1),
            ("tls-b".to_owned(), 2),
            ("tcp".to_owned(), 1)
        ]
    );
    // Every listener is programmed (passthrough needs no certificate); problems name kinds.
    for l in &s.gateways[0].listeners {
        assert!(l.conditions.iter().all(|c| c.is_true()), "{l:?}");
    }
    let problems = s.problems();
    assert!(
        problems.iter().any(|p| p.contains(
            "TLSRoute default/d: parent default/edge: Accepted=False NotAllowedByListeners"
        )),
        "{problems:?}"
    );
    // The backend lists the L4 routes using it.
    let one = s.backends.iter().find(|b| b.name == "one").unwrap();
    assert_eq!(
        one.routes,
        [
            "default/a",
            "default/b",
            "default/c",
            "default/d",
            "default/t",
            "default/t-http"
        ]
    );
}

/// Backends: BackendNotFound, and cross-namespace refs need a ReferenceGrant naming the
/// route's own kind (an HTTPRoute grant does not count).
#[test]
fn backend_refs_need_grants_for_their_kind() {
    let route = tls_route(
        "a",
        "{ name: edge }",
        "a.example",
        "{ kind: Backend, group: ballast.dev, name: missing }, { kind: Backend, group: ballast.dev, name: two, namespace: other }",
    );
    let grant = |kind: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {{ name: g, namespace: other }}\n\
             spec:\n  from: [{{ group: gateway.networking.k8s.io, kind: {kind}, namespace: default }}]\n  to: [{{ group: ballast.dev, kind: Backend }}]\n---\n"
        )
    };
    for (extra, reason, unresolved) in [
        (String::new(), "BackendNotFound", 2),
        (grant("HTTPRoute"), "BackendNotFound", 2),
        (grant("TLSRoute"), "BackendNotFound", 1),
    ] {
        let s = status(&format!("{route}{extra}"));
        let r = &s.tls_routes[0];
        assert_eq!(conds(r)[0][1], c("ResolvedRefs", false, reason));
        assert_eq!(r.unresolved_backend_refs.len(), unresolved, "{extra}");
        let msg = &r.parents[0].conditions[1].message;
        assert!(
            msg.contains("rules[0].backendRefs[0]: Backend default/missing not found"),
            "{msg}"
        );
        assert!(
            msg.ends_with("(connections for these backends are closed)"),
            "{msg}"
        );
        if unresolved == 2 {
            assert!(
                msg.contains("rules[0].backendRefs[1]: Backend other/two is in another namespace and no ReferenceGrant in other allows TLSRoute default/a to use it"),
                "{msg}"
            );
            assert_eq!(r.unresolved_backend_refs[1].reason, "RefNotPermitted");
        }
    }
}

/// An SNI name claimed by two TLSRoutes on one port, or a TCP listener with two TCPRoutes: the
/// first route (namespace/name order) serves, the other's status says who has it instead.
#[test]
fn shadowed_names_and_tcp_listeners_are_warnings() {
    let one = "{ kind: Backend, group: ballast.dev, name: one }";
    let tcp = |name: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TCPRoute\nmetadata: {{ name: {name} }}\n\
             spec:\n  parentRefs: [{{ name: edge }}]\n  rules: [{{ backendRefs: [{one}] }}]\n---\n"
        )
    };
    let extra = format!(
        "{}{}{}{}",
        tls_route("a", "{ name: edge, sectionName: tls }", "a.example", one),
        tls_route(
            "b",
            "{ name: edge, sectionName: tls }",
            "a.example, z.example",
            one
        ),
        tcp("t1"),
        tcp("t2"),
    );
    let set = ConfigSet::build([("g.yaml", format!("{GATEWAY}---\n{extra}"))]).unwrap();
    let claims = crate::kinds::l4_claims(&set, &crate::ObjectKey::new("default", "edge"));
    let summary: Vec<(u32, String, String, Vec<String>, usize)> = claims
        .iter()
        .map(|c| {
            (
                c.port,
                c.listener.clone(),
                c.route.metadata.name.clone(),
                c.hostnames.clone(),
                c.shadowed.len(),
            )
        })
        .collect();
    let v = |h: &[&str]| h.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        summary,
        [
            (8443, "tls".into(), "a".into(), v(&["a.example"]), 0),
            (8443, "tls".into(), "b".into(), v(&["z.example"]), 1),
            (9000, "tcp".into(), "t1".into(), v(&["*"]), 0),
            (9000, "tcp".into(), "t2".into(), v(&[]), 1),
        ]
    );
    let s = compute(&set);
    assert!(s.tls_routes[0].warnings.is_empty());
    assert_eq!(
        s.tls_routes[1].warnings,
        [
            "Gateway default/edge listener tls (port 8443): SNI a.example served by TLSRoute default/a, which comes first (namespace/name order); this route gets none of them"
        ]
    );
    assert!(s.tcp_routes[0].warnings.is_empty());
    assert_eq!(
        s.tcp_routes[1].warnings,
        [
            "Gateway default/edge listener tcp (port 9000): its connections served by TCPRoute default/t1, which comes first (namespace/name order); this route gets none of them"
        ]
    );
    assert!(
        s.problems().iter().any(|p| p.starts_with("g.yaml:")
            && p.contains(": TCPRoute default/t2: Gateway default/edge listener tcp")),
        "{:?}",
        s.problems()
    );
}

/// Conformance `TLSRouteInvalidBackendRefUnknownKind`: a backendRef to a kind Ballast does not
/// serve is `ResolvedRefs=False InvalidKind`, the route stays `Accepted`.
#[test]
fn unknown_backend_kind_is_invalid_kind() {
    let route = tls_route(
        "a",
        "{ name: edge }",
        "a.example",
        "{ kind: UnknownKind, group: example.com, name: svc }",
    );
    let s = status(&route);
    let r = &s.tls_routes[0];
    assert_eq!(conds(r)[0][0], c("Accepted", true, "Accepted"));
    assert_eq!(conds(r)[0][1], c("ResolvedRefs", false, "InvalidKind"));
    assert_eq!(r.unresolved_backend_refs.len(), 1);
    assert_eq!(r.unresolved_backend_refs[0].reason, "InvalidKind");
}
