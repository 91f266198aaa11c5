//! TLS and TCP listener translation: SNI filter chains, weighted tcp_proxy, closed chains, and
//! the incremental translator agreeing with a from-scratch translation.

use std::sync::Arc;

use ballast_xds::Resource;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfig;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::ClusterSpecifier;
use prost::Message;

use crate::tests::{config, gw};
use crate::{GatewayResources, Options, Translator, translate_gateway};

const GATEWAY: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: { name: edge }
spec:
  gatewayClassName: ballast
  listeners:
  - { name: tls, port: 8443, protocol: TLS, tls: { mode: Passthrough } }
  - { name: tcp, port: 9000, protocol: TCP }
---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: { name: one }
spec: { endpoints: [{ address: 127.0.0.1, port: 7001 }] }
---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: { name: two }
spec: { endpoints: [{ address: 127.0.0.1, port: 7002 }] }
";

fn tls(name: &str, hostnames: &str, backends: &str) -> String {
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TLSRoute\nmetadata: {{ name: {name} }}\n\
         spec:\n  parentRefs: [{{ name: edge }}]\n  hostnames: [{hostnames}]\n  rules: [{{ backendRefs: [{backends}] }}]\n"
    )
}

fn tcp(name: &str, backends: &str) -> String {
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TCPRoute\nmetadata: {{ name: {name} }}\n\
         spec:\n  parentRefs: [{{ name: edge }}]\n  rules: [{{ backendRefs: [{backends}] }}]\n"
    )
}

fn b(name: &str, weight: u32) -> String {
    format!("{{ group: ballast.dev, kind: Backend, name: {name}, weight: {weight} }}")
}

fn listener(res: &GatewayResources, name: &str) -> Listener {
    let r: &Arc<Resource> = res
        .listeners
        .iter()
        .find(|r| r.name() == name)
        .unwrap_or_else(|| panic!("no listener {name}"));
    Listener::decode(r.value_bytes()).unwrap()
}

/// Per filter chain: (name, server names, filter name, tcp_proxy target as text).
fn chains(l: &Listener) -> Vec<(String, Vec<String>, String, String)> {
    l.filter_chains
        .iter()
        .map(|c| {
            let f = &c.filters[0];
            let target = match &f.config_type {
                Some(FilterConfig::TypedConfig(any))
                    if f.name == "envoy.filters.network.tcp_proxy" =>
                {
                    match TcpProxy::decode(any.value.as_slice())
                        .unwrap()
                        .cluster_specifier
                    {
                        Some(ClusterSpecifier::Cluster(c)) => c,
                        Some(ClusterSpecifier::WeightedClusters(w)) => w
                            .clusters
                            .iter()
                            .map(|c| format!("{}={}", c.name, c.weight))
                            .collect::<Vec<_>>()
                            .join(","),
                        None => String::new(),
                    }
                }
                _ => String::new(),
            };
            assert!(
                c.transport_socket.is_none(),
                "passthrough and TCP do not decrypt"
            );
            (
                c.name.clone(),
                c.filter_chain_match
                    .as_ref()
                    .map(|m| m.server_names.clone())
                    .unwrap_or_default(),
                f.name.clone(),
                target,
            )
        })
        .collect()
}

fn chain(
    name: &str,
    sni: &[&str],
    filter: &str,
    target: &str,
) -> (String, Vec<String>, String, String) {
    (
        name.to_owned(),
        sni.iter().map(|s| (*s).to_owned()).collect(),
        format!("envoy.filters.network.{filter}"),
        target.to_owned(),
    )
}

fn scratch(yaml: &str) -> GatewayResources {
    let res = translate_gateway(&config(yaml), &gw("edge"), &Options::default()).unwrap();
    res.snapshot(None).expect("consistent snapshot");
    res
}

/// One SNI filter chain per TLSRoute (a hostname claimed twice goes to the first route),
/// weighted clusters for several backendRefs, the unresolvable refs' share rejected (none
/// resolvable: every connection closed), a TCP port proxying to its route's backend.
#[test]
fn tls_sni_chains_and_tcp_proxy() {
    let yaml = format!(
        "{GATEWAY}{}{}{}{}{}",
        tls("a", "a.example", &b("one", 1)),
        tls(
            "b",
            "b.example, '*.w.example'",
            &format!("{}, {}, {}", b("one", 1), b("two", 3), b("missing", 5))
        ),
        tls("c", "a.example, c.example", &b("missing", 1)),
        tls("d", "a.example", &b("two", 1)),
        tcp("t", &b("one", 1)),
    );
    let res = scratch(&yaml);
    let l = listener(&res, "default/edge/8443");
    assert_eq!(l.listener_filters.len(), 1);
    assert_eq!(
        l.listener_filters[0].name,
        "envoy.filters.listener.tls_inspector"
    );
    assert_eq!(
        chains(&l),
        [
            chain(
                "default/edge/8443/tls/default/a",
                &["a.example"],
                "tcp_proxy",
                "default/one"
            ),
            chain(
                "default/edge/8443/tls/default/b",
                &["b.example", "*.w.example"],
                "tcp_proxy",
                "default/one=1,default/two=3,ballast:unresolved=5"
            ),
            chain(
                "default/edge/8443/tls/default/c",
                &["c.example"],
                "direct_response",
                ""
            ),
        ]
    );
    let l = listener(&res, "default/edge/9000");
    assert!(l.listener_filters.is_empty());
    assert_eq!(
        chains(&l),
        [chain(
            "default/edge/9000/tcp/default/t",
            &[],
            "tcp_proxy",
            "default/one"
        )]
    );
    let clusters: Vec<&str> = res.clusters.iter().map(|r| r.name()).collect();
    // The unresolvable share (weight 5 of 9) goes to the static cluster without endpoints,
    // where Envoy closes the connection (Gateway API: reject that share).
    assert_eq!(
        clusters,
        ["ballast:unresolved", "default/one", "default/two"]
    );
    // The listener references its clusters (make-before-break orders them first).
    let mut refs: Vec<&str> = res.listeners[0].refs().iter().map(|r| &*r.name).collect();
    refs.sort();
    assert_eq!(refs, ["ballast:unresolved", "default/one", "default/two"]);
}

/// Edits of TCP/TLS routes and their Backends through the incremental translator give what a
/// from-scratch translation gives; a port without routes keeps its listener with a closing
/// chain.
#[test]
fn l4_routes_translate_incrementally() {
    let steps = [
        format!(
            "{GATEWAY}{}{}",
            tcp("t", &b("one", 1)),
            tls("a", "a.example", &b("one", 1))
        ),
        // Move the TCPRoute to another backend.
        format!(
            "{GATEWAY}{}{}",
            tcp("t", &b("two", 1)),
            tls("a", "a.example", &b("one", 1))
        ),
        // Endpoint change of a Backend only a TLSRoute uses.
        format!(
            "{GATEWAY}{}{}",
            tcp("t", &b("two", 1)),
            tls("a", "a.example", &b("one", 1))
        )
        .replace("port: 7001", "port: 7011"),
        // No routes at all.
        GATEWAY.to_owned(),
        format!("{GATEWAY}{}", tls("a", "a.example", &b("two", 1))),
    ];
    let mut t = Translator::new(Options::default());
    for (i, yaml) in steps.iter().enumerate() {
        let set = Arc::new(config(yaml));
        t.update(&set);
        let inc = t.gateway(&gw("edge")).unwrap();
        assert_eq!(*inc, scratch(yaml), "step {i}");
    }
    let res = scratch(&steps[3]);
    assert_eq!(
        chains(&listener(&res, "default/edge/9000")),
        [chain(
            "default/edge/9000/closed",
            &[],
            "direct_response",
            ""
        )]
    );
    assert_eq!(
        chains(&listener(&res, "default/edge/8443")),
        [chain(
            "default/edge/8443/closed",
            &[],
            "direct_response",
            ""
        )]
    );
    assert!(res.clusters.is_empty());
    let res = scratch(&steps[2]);
    assert_eq!(
        chains(&listener(&res, "default/edge/9000")),
        [chain(
            "default/edge/9000/tcp/default/t",
            &[],
            "tcp_proxy",
            "default/two"
        )]
    );
}

/// A route attached to two TLS listeners of one port gets a chain per listener (named apart,
/// each with that listener's hostname); a `Terminate` listener's chain decrypts with its
/// certificate over SDS and offers no ALPN (the bytes are not HTTP).
#[test]
fn route_on_two_listeners_of_a_port_and_terminate() {
    use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType as TsConfig;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
    let yaml = format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge }}
spec:
  gatewayClassName: ballast
  listeners:
  - {{ name: a, port: 8443, protocol: TLS, hostname: a.example, tls: {{ mode: Passthrough }} }}
  - {{ name: b, port: 8443, protocol: TLS, hostname: b.example, tls: {{ mode: Terminate, certificateRefs: [{{ name: cert }}] }} }}
---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: one }}
spec: {{ endpoints: [{{ address: 127.0.0.1, port: 7001 }}] }}
---
{}{}",
        crate::tests::secret_yaml("cert"),
        tls("r", "", &b("one", 1))
    );
    let res = scratch(&yaml);
    let l = listener(&res, "default/edge/8443");
    let got: Vec<(&str, &[String], bool)> = l
        .filter_chains
        .iter()
        .map(|c| {
            (
                c.name.as_str(),
                c.filter_chain_match
                    .as_ref()
                    .unwrap()
                    .server_names
                    .as_slice(),
                c.transport_socket.is_some(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "default/edge/8443/a/default/r",
                &["a.example".to_owned()][..],
                false
            ),
            (
                "default/edge/8443/b/default/r",
                &["b.example".to_owned()][..],
                true
            ),
        ]
    );
    let Some(TsConfig::TypedConfig(any)) = &l.filter_chains[1]
        .transport_socket
        .as_ref()
        .unwrap()
        .config_type
    else {
        panic!("typed transport socket");
    };
    let ctx = DownstreamTlsContext::decode(any.value.as_slice()).unwrap();
    let common = ctx.common_tls_context.unwrap();
    assert!(common.alpn_protocols.is_empty());
    assert_eq!(
        common.tls_certificate_sds_secret_configs[0].name,
        "default/cert"
    );
    let secrets: Vec<&str> = res.secrets.iter().map(|r| r.name()).collect();
    assert_eq!(secrets, ["default/cert"]);
}

/// A ClientPolicy on a TLS/TCP listener: PROXY protocol before the `tls_inspector` (the header
/// precedes the ClientHello) and the connection limit before `tcp_proxy`; a listener it does
/// not target is unaffected.
#[test]
fn client_policy_applies_to_tls_and_tcp_listeners() {
    let policy = |section: &str| {
        format!(
            "---\napiVersion: ballast.dev/v1alpha1\nkind: ClientPolicy\nmetadata: {{ name: p-{section} }}\nspec:\n  \
             targetRefs: [{{ group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: {section} }}]\n  \
             enableProxyProtocol: true\n  connection: {{ connectionLimit: {{ value: 3 }} }}\n"
        )
    };
    let yaml = format!(
        "{GATEWAY}{}{}{}",
        tls("a", "a.example", &b("one", 1)),
        tcp("t", &b("one", 1)),
        policy("tls")
    );
    let res = scratch(&yaml);
    let l = listener(&res, "default/edge/8443");
    let names: Vec<&str> = l.listener_filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "envoy.filters.listener.proxy_protocol",
            "envoy.filters.listener.tls_inspector"
        ]
    );
    let filters: Vec<&str> = l.filter_chains[0]
        .filters
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(
        filters,
        [
            "envoy.filters.network.connection_limit",
            "envoy.filters.network.tcp_proxy"
        ]
    );
    let l = listener(&res, "default/edge/9000");
    assert!(l.listener_filters.is_empty());
    assert_eq!(l.filter_chains[0].filters.len(), 1);
    let res = scratch(&format!("{yaml}{}", policy("tcp")));
    let l = listener(&res, "default/edge/9000");
    assert_eq!(
        l.listener_filters[0].name,
        "envoy.filters.listener.proxy_protocol"
    );
    assert_eq!(
        l.filter_chains[0].filters[0].name,
        "envoy.filters.network.connection_limit"
    );
}

/// Conflicted TLS/TCP listeners (two TCP listeners on one port, TLS beside HTTPS) get no Envoy
/// listener and their routes no cluster use; the distinct TLS/TCP listeners are served.
#[test]
fn conflicted_tls_and_tcp_listeners_get_no_envoy_listener() {
    let yaml = format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge }}
spec:
  gatewayClassName: ballast
  listeners:
  - {{ name: tls, port: 8443, protocol: TLS, tls: {{ mode: Passthrough }} }}
  - {{ name: tcp, port: 9000, protocol: TCP }}
  - {{ name: tcp-a, port: 9001, protocol: TCP }}
  - {{ name: tcp-b, port: 9001, protocol: TCP }}
  - {{ name: tls-x, port: 9443, protocol: TLS, hostname: x.example, tls: {{ mode: Passthrough }} }}
  - {{ name: https-y, port: 9443, protocol: HTTPS, hostname: y.example, tls: {{ certificateRefs: [{{ name: s }}] }} }}
---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: one }}
spec: {{ endpoints: [{{ address: 127.0.0.1, port: 7001 }}] }}
---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: two }}
spec: {{ endpoints: [{{ address: 127.0.0.1, port: 7002 }}] }}
{}{}",
        tls("a", "a.example, x.example", &b("one", 1)),
        tcp("t", &b("two", 1)),
    );
    let res = scratch(&yaml);
    let names: Vec<&str> = res.listeners.iter().map(|r| r.name()).collect();
    assert_eq!(names, ["default/edge/8443", "default/edge/9000"]);
    assert_eq!(
        chains(&listener(&res, "default/edge/8443")),
        [chain(
            "default/edge/8443/tls/default/a",
            &["a.example", "x.example"],
            "tcp_proxy",
            "default/one"
        )]
    );
    assert_eq!(
        chains(&listener(&res, "default/edge/9000")),
        [chain(
            "default/edge/9000/tcp/default/t",
            &[],
            "tcp_proxy",
            "default/two"
        )]
    );
}
