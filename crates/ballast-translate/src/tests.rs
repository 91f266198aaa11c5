//! Unit tests of each translation feature against expected Envoy messages.

use std::sync::Arc;

use ballast_model::{ConfigSet, ObjectKey};
use ballast_xds::Resource;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret as EnvoySecret;
use prost::Message;

use crate::{GatewayResources, Options, Translator, translate_gateway};

pub(crate) fn config(yaml: &str) -> ConfigSet {
    match ConfigSet::build([("test.yaml", yaml)]) {
        Ok(c) => c,
        Err(es) => panic!(
            "{}",
            es.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        ),
    }
}

pub(crate) fn gw(name: &str) -> ObjectKey {
    ObjectKey::new("default", name)
}

fn decode<M: Message + Default>(r: &Arc<Resource>) -> M {
    M::decode(r.value_bytes()).unwrap()
}

fn find<'a>(list: &'a [Arc<Resource>], name: &str) -> &'a Arc<Resource> {
    list.iter()
        .find(|r| r.name() == name)
        .unwrap_or_else(|| panic!("no resource {name:?} in {:?}", names(list)))
}

fn names(list: &[Arc<Resource>]) -> Vec<&str> {
    list.iter().map(|r| r.name()).collect()
}

/// The errors building `yaml` as the file `r.yaml` gives, as text (panics if it builds).
fn build_errors(yaml: &str) -> Vec<String> {
    ConfigSet::build([("r.yaml", yaml)])
        .unwrap_err()
        .iter()
        .map(|e| e.to_string())
        .collect()
}

fn translate(yaml: &str, gateway: &str) -> GatewayResources {
    let set = config(yaml);
    let res = translate_gateway(&set, &gw(gateway), &Options::default()).unwrap();
    res.snapshot(None).expect("consistent snapshot");
    res
}

const GATEWAY_HTTP: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: { name: edge }
spec:
  gatewayClassName: ballast
  listeners:
  - { name: http, port: 10000, protocol: HTTP }
"#;

const BACKEND_WEB: &str = r#"
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: { name: web }
spec:
  endpoints:
  - { address: 127.0.0.1, port: 8080 }
"#;

#[test]
fn http_listener_route_and_backend() {
    let yaml = format!(
        "{GATEWAY_HTTP}---{BACKEND_WEB}---\n{}",
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: { name: web }
spec:
  parentRefs: [{ name: edge }]
  hostnames: [web.example.com]
  rules:
  - matches: [{ path: { type: PathPrefix, value: / } }]
    backendRefs: [{ name: web }]
"#
    );
    let res = translate(&yaml, "edge");
    assert_eq!(names(&res.listeners), ["default/edge/10000"]);
    assert_eq!(names(&res.route_configs), ["default/edge/10000"]);
    assert_eq!(names(&res.clusters), ["default/web"]);
    assert_eq!(names(&res.load_assignments), ["default/web"]);
    assert!(res.secrets.is_empty());
    let l: Listener = decode(&res.listeners[0]);
    assert_eq!(
        l.address,
        Some(ballast_xds::simple::socket_address("0.0.0.0", 10000))
    );
    let rc: RouteConfiguration = decode(&res.route_configs[0]);
    assert_eq!(rc.virtual_hosts.len(), 1);
    assert_eq!(rc.virtual_hosts[0].domains, ["web.example.com"]);
    let c: Cluster = decode(&res.clusters[0]);
    assert_eq!(c.name, "default/web");
    let cla: ClusterLoadAssignment = decode(&res.load_assignments[0]);
    assert_eq!(cla.endpoints[0].lb_endpoints.len(), 1);
}

#[test]
fn translator_first_update_matches_scratch_and_prints_yaml() {
    let yaml = format!("{GATEWAY_HTTP}---{BACKEND_WEB}");
    let set = Arc::new(config(&yaml));
    let mut t = Translator::new(Options::default());
    let out = t.update(&set);
    assert_eq!(out.changed.len(), 1);
    let res = &out.changed[&gw("edge")];
    assert_eq!(
        **res,
        translate_gateway(&set, &gw("edge"), &Options::default()).unwrap()
    );
    let yaml = res.to_yaml();
    assert!(yaml.starts_with("---\n{\n  \"@type\""), "{yaml}");
    assert!(yaml.contains("default/edge/10000"), "{yaml}");
    // Unchanged config: nothing changed.
    let out = t.update(&Arc::new(config(&format!(
        "{GATEWAY_HTTP}---{BACKEND_WEB}"
    ))));
    assert!(out.changed.is_empty() && out.removed.is_empty());
    let empty = t.update(&Arc::new(ConfigSet::default()));
    assert_eq!(empty.removed, vec![gw("edge")]);
}

use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType as TsConfig;
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfig;
use envoy_types::pb::envoy::config::route::v3::header_matcher::HeaderMatchSpecifier;
use envoy_types::pb::envoy::config::route::v3::redirect_action::{
    PathRewriteSpecifier, RedirectResponseCode, SchemeRewriteSpecifier,
};
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::{
    ClusterSpecifier, HostRewriteSpecifier,
};
use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::{Route, RouteAction, VirtualHost};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::StripPortMode;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
use envoy_types::pb::google::protobuf::{BoolValue, Duration as PbDuration, UInt32Value};

fn hcm(l: &Listener, chain: usize) -> HttpConnectionManager {
    // The connection manager is the chain's last (terminal) filter.
    let Some(FilterConfig::TypedConfig(any)) =
        &l.filter_chains[chain].filters.last().unwrap().config_type
    else {
        panic!("no typed config")
    };
    HttpConnectionManager::decode(any.value.as_slice()).unwrap()
}

fn route_yaml(name: &str, extra: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: {name} }}\nspec:\n  parentRefs: [{{ name: edge }}]\n{extra}"
    )
}

fn backend_yaml(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {{ name: {name} }}\nspec:\n{spec}"
    )
}

/// A Gateway `default/edge` with `listeners` (the YAML list items under `listeners:`).
fn gateway_yaml(listeners: &str) -> String {
    format!(
        "\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{ name: edge }}\nspec:\n  gatewayClassName: ballast\n  listeners:\n{listeners}"
    )
}

/// Header mutations as (name, value, append action).
fn header_options(
    opts: &[envoy_types::pb::envoy::config::core::v3::HeaderValueOption],
) -> Vec<(String, String, i32)> {
    opts.iter()
        .map(|o| {
            let hv = o.header.as_ref().unwrap();
            (hv.key.clone(), hv.value.clone(), o.append_action)
        })
        .collect()
}

fn docs(parts: &[&str]) -> String {
    parts.join("\n---\n")
}

/// The routes of the only virtual host of the only route configuration.
fn only_vhost(res: &GatewayResources) -> VirtualHost {
    let rc: RouteConfiguration = decode(&res.route_configs[0]);
    // Route configurations are assembled from encoded routes: byte for byte what prost
    // encodes (so versions do not depend on how a configuration was put together).
    assert_eq!(
        rc.encode_to_vec(),
        res.route_configs[0].value_bytes().to_vec(),
        "the assembled route configuration is not prost's encoding"
    );
    assert_eq!(rc.virtual_hosts.len(), 1, "{:?}", rc.virtual_hosts);
    rc.virtual_hosts.into_iter().next().unwrap()
}

fn route_action(r: &Route) -> &RouteAction {
    match &r.action {
        Some(Action::Route(a)) => a,
        other => panic!("not a route action: {other:?}"),
    }
}

const WEB: &str = "  endpoints: [{ address: 10.0.0.1, port: 80 }]\n";

#[test]
fn http_connection_manager_settings() {
    let res = translate(GATEWAY_HTTP, "edge");
    let l: Listener = decode(&res.listeners[0]);
    assert!(l.listener_filters.is_empty());
    assert_eq!(l.filter_chains.len(), 1);
    assert_eq!(l.filter_chains[0].filter_chain_match, None);
    assert_eq!(l.filter_chains[0].transport_socket, None);
    let mut want = ballast_xds::simple::rds_http_connection_manager(
        "default_edge_10000",
        "default/edge/10000",
    );
    want.strip_port_mode = Some(StripPortMode::StripAnyHostPort(true));
    want.normalize_path = Some(BoolValue { value: true });
    let got = hcm(&l, 0);
    // Access log on by default: stdout, one JSON line per request (access_log.rs tests it).
    assert_eq!(got.access_log.len(), 1);
    assert_eq!(got.access_log[0].name, "envoy.access_loggers.stdout");
    want.access_log = got.access_log.clone();
    assert_eq!(got.upgrade_configs.len(), 1);
    assert_eq!(got.upgrade_configs[0].upgrade_type, "websocket");
    want.upgrade_configs = got.upgrade_configs.clone();
    // CORS before the router (a no-op for routes without a CORS policy).
    want.http_filters.insert(0, crate::cors::http_filter());
    // Stateful sessions right before the router (inactive without sessionPersistence).
    want.http_filters.insert(1, crate::session::http_filter());
    assert_eq!(got, want);
    // No routes: an empty route configuration, still referenced by the listener.
    let rc: RouteConfiguration = decode(&res.route_configs[0]);
    assert!(rc.virtual_hosts.is_empty());
    // Stat prefix option.
    let opts = Options {
        stat_prefix: "edge".into(),
        ..Default::default()
    };
    let res = translate_gateway(&config(GATEWAY_HTTP), &gw("edge"), &opts).unwrap();
    assert_eq!(
        hcm(&decode(&res.listeners[0]), 0).stat_prefix,
        "edge_default_edge_10000"
    );
}

#[test]
fn client_policy_path_options_and_connection_limit() {
    use envoy_types::pb::envoy::extensions::filters::network::connection_limit::v3::ConnectionLimit;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::PathWithEscapedSlashesAction;
    let policy = |body: &str| {
        format!(
            "{GATEWAY_HTTP}---\napiVersion: ballast.dev/v1alpha1\nkind: ClientPolicy\nmetadata: {{ name: p }}\nspec:\n  targetRefs: [{{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }}]\n{body}"
        )
    };
    // No `path`: Envoy's defaults (no merging, escaped slashes kept).
    let l: Listener = decode(&translate(GATEWAY_HTTP, "edge").listeners[0]);
    assert_eq!(l.filter_chains[0].filters.len(), 1);
    assert!(!hcm(&l, 0).merge_slashes);
    // `path: {}` merges; disableMergeSlashes keeps `//`; the action maps one to one.
    let l: Listener = decode(&translate(&policy("  path: {}\n"), "edge").listeners[0]);
    assert!(hcm(&l, 0).merge_slashes);
    let l: Listener = decode(
        &translate(
            &policy("  path: { disableMergeSlashes: true, escapedSlashesAction: RejectRequest }\n  connection: { connectionLimit: { value: 3, closeDelay: 2s } }\n"),
            "edge",
        )
        .listeners[0],
    );
    let got = hcm(&l, 0);
    assert!(!got.merge_slashes);
    assert_eq!(
        got.path_with_escaped_slashes_action,
        PathWithEscapedSlashesAction::RejectRequest as i32
    );
    let filters = &l.filter_chains[0].filters;
    assert_eq!(filters.len(), 2);
    assert_eq!(filters[0].name, "envoy.filters.network.connection_limit");
    let Some(FilterConfig::TypedConfig(any)) = &filters[0].config_type else {
        panic!("no typed config")
    };
    let cl = ConnectionLimit::decode(any.value.as_slice()).unwrap();
    assert_eq!(cl.max_connections.map(|v| v.value), Some(3));
    assert_eq!(cl.delay.map(|d| d.seconds), Some(2));
    assert_eq!(cl.stat_prefix, "default_edge_10000");
}

#[test]
fn client_policy_http2_options() {
    let yaml = format!(
        "{GATEWAY_HTTP}---\napiVersion: ballast.dev/v1alpha1\nkind: ClientPolicy\nmetadata: {{ name: p }}\nspec:\n  targetRefs: [{{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }}]\n  http2: {{ maxConcurrentStreams: 7, initialStreamWindowSize: 64Ki, initialConnectionWindowSize: 1Mi }}\n"
    );
    let l: Listener = decode(&translate(&yaml, "edge").listeners[0]);
    let h2 = hcm(&l, 0).http2_protocol_options.unwrap();
    assert_eq!(h2.max_concurrent_streams.map(|v| v.value), Some(7));
    assert_eq!(h2.initial_stream_window_size.map(|v| v.value), Some(65536));
    assert_eq!(
        h2.initial_connection_window_size.map(|v| v.value),
        Some(1 << 20)
    );
    let l: Listener = decode(&translate(GATEWAY_HTTP, "edge").listeners[0]);
    assert_eq!(hcm(&l, 0).http2_protocol_options, None);
}

#[test]
fn gateway_addresses_bind_one_listener_per_port() {
    let yaml = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: { name: edge, namespace: infra }
spec:
  gatewayClassName: ballast
  addresses: [{ value: 127.0.0.1 }, { value: "::1" }]
  listeners:
  - { name: a, port: 80, protocol: HTTP }
  - { name: b, port: 81, protocol: HTTP }
"#;
    let set = config(yaml);
    let res =
        translate_gateway(&set, &ObjectKey::new("infra", "edge"), &Options::default()).unwrap();
    assert_eq!(names(&res.listeners), ["infra/edge/80", "infra/edge/81"]);
    let l: Listener = decode(&res.listeners[1]);
    assert_eq!(
        l.address,
        Some(ballast_xds::simple::socket_address("127.0.0.1", 81))
    );
    assert_eq!(l.additional_addresses.len(), 1);
    assert_eq!(
        l.additional_addresses[0].address,
        Some(ballast_xds::simple::socket_address("::1", 81))
    );
    // Default address option.
    let res = translate_gateway(
        &config(GATEWAY_HTTP),
        &gw("edge"),
        &Options {
            default_address: "127.0.0.2".parse().unwrap(),
            ..Default::default()
        },
    )
    .unwrap();
    let l: Listener = decode(&res.listeners[0]);
    assert_eq!(
        l.address,
        Some(ballast_xds::simple::socket_address("127.0.0.2", 10000))
    );
}

#[test]
fn path_header_query_and_method_matches() {
    let route = route_yaml(
        "web",
        r#"  rules:
  - matches:
    - path: { type: Exact, value: /exact }
    - path: { type: PathPrefix, value: /api/ }
      method: POST
      headers: [{ name: X-Version, value: "2" }, { type: RegularExpression, name: x-tenant, value: "[a-z]+" }]
      queryParams: [{ name: Debug, value: "true" }]
    - path: { type: RegularExpression, value: "/r/[0-9]+" }
    - path: { type: PathPrefix, value: / }
    backendRefs: [{ name: web }]
"#,
    );
    let res = translate(&docs(&[GATEWAY_HTTP, BACKEND_WEB, &route]), "edge");
    let vh = only_vhost(&res);
    assert_eq!(vh.name, "*");
    assert_eq!(vh.domains, ["*"]);
    let paths: Vec<_> = vh
        .routes
        .iter()
        .map(|r| r.r#match.as_ref().unwrap().path_specifier.clone().unwrap())
        .collect();
    use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
    use envoy_types::pb::envoy::r#type::matcher::v3::{RegexMatcher, StringMatcher};
    let regex = |r: &str| RegexMatcher {
        regex: r.into(),
        ..Default::default()
    };
    assert_eq!(
        paths,
        [
            PathSpecifier::Path("/exact".into()),
            PathSpecifier::SafeRegex(regex("/r/[0-9]+")),
            PathSpecifier::PathSeparatedPrefix("/api".into()),
            PathSpecifier::Prefix("/".into()),
        ]
    );
    // Route names keep the rule and match index (the regex was match 2).
    let route_names: Vec<&str> = vh.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        route_names,
        [
            "default/web/0/0",
            "default/web/0/2",
            "default/web/0/1",
            "default/web/0/3"
        ]
    );
    let m = vh.routes[2].r#match.as_ref().unwrap();
    let sm = |p| {
        Some(HeaderMatchSpecifier::StringMatch(StringMatcher {
            match_pattern: Some(p),
            ..Default::default()
        }))
    };
    let headers: Vec<(String, Option<HeaderMatchSpecifier>)> = m
        .headers
        .iter()
        .map(|h| (h.name.clone(), h.header_match_specifier.clone()))
        .collect();
    assert_eq!(
        headers,
        [
            ("x-version".into(), sm(MatchPattern::Exact("2".into()))),
            (
                "x-tenant".into(),
                sm(MatchPattern::SafeRegex(regex("[a-z]+")))
            ),
            (":method".into(), sm(MatchPattern::Exact("POST".into()))),
        ]
    );
    assert_eq!(m.query_parameters.len(), 1);
    assert_eq!(m.query_parameters[0].name, "Debug");
    // Every route forwards to the one backend.
    for r in &vh.routes {
        assert_eq!(
            route_action(r).cluster_specifier,
            Some(ClusterSpecifier::Cluster("default/web".into()))
        );
    }
}

#[test]
fn match_precedence_across_routes() {
    // Declared in the opposite order of precedence, spread over routes whose keys sort
    // against the precedence too.
    let a = route_yaml(
        "a",
        "  rules:\n  - matches: [{ path: { type: PathPrefix, value: / } }]\n    backendRefs: [{ name: web }]\n",
    );
    let b = route_yaml(
        "b",
        "  rules:\n  - matches: [{ path: { type: PathPrefix, value: /foo } }]\n    backendRefs: [{ name: web }]\n  - matches: [{ path: { type: PathPrefix, value: /foo }, method: GET }]\n    backendRefs: [{ name: web }]\n",
    );
    let c = route_yaml(
        "c",
        "  rules:\n  - matches: [{ path: { type: PathPrefix, value: /foo }, headers: [{ name: a, value: b }] }]\n    backendRefs: [{ name: web }]\n  - matches: [{ path: { type: PathPrefix, value: /foo }, headers: [{ name: a, value: b }], queryParams: [{ name: q, value: v }] }]\n    backendRefs: [{ name: web }]\n",
    );
    let d = route_yaml(
        "d",
        "  rules:\n  - matches: [{ path: { type: PathPrefix, value: /foo/bar } }]\n    backendRefs: [{ name: web }]\n  - matches: [{ path: { type: Exact, value: /x } }]\n    backendRefs: [{ name: web }]\n",
    );
    // Identical match in two routes: the smaller key (`e0`) wins.
    let e1 = route_yaml(
        "e1",
        "  rules:\n  - matches: [{ path: { type: Exact, value: /same } }]\n    backendRefs: [{ name: web }]\n",
    );
    let e0 = e1.replace("name: e1", "name: e0");
    let res = translate(
        &docs(&[GATEWAY_HTTP, BACKEND_WEB, &a, &b, &c, &d, &e1, &e0]),
        "edge",
    );
    let vh = only_vhost(&res);
    let got: Vec<&str> = vh.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        got,
        [
            "default/e0/0/0", // exact, longer
            "default/e1/0/0",
            "default/d/1/0", // exact
            "default/d/0/0", // longest prefix
            "default/b/1/0", // method
            "default/c/1/0", // headers + query
            "default/c/0/0", // headers
            "default/b/0/0", // plain /foo
            "default/a/0/0", // catch-all
        ]
    );
}

#[test]
fn header_modifiers() {
    let route = route_yaml(
        "web",
        r#"  rules:
  - filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{ name: x-env, value: prod }]
        add: [{ name: x-via, value: ballast }]
        remove: [x-internal]
    - type: ResponseHeaderModifier
      responseHeaderModifier:
        add: [{ name: x-served-by, value: ballast }]
        remove: [server]
    backendRefs: [{ name: web }]
"#,
    );
    let res = translate(&docs(&[GATEWAY_HTTP, BACKEND_WEB, &route]), "edge");
    let r = &only_vhost(&res).routes[0];
    assert_eq!(
        header_options(&r.request_headers_to_add),
        [
            (
                "x-env".into(),
                "prod".into(),
                HeaderAppendAction::OverwriteIfExistsOrAdd as i32
            ),
            (
                "x-via".into(),
                "ballast".into(),
                HeaderAppendAction::AppendIfExistsOrAdd as i32
            )
        ]
    );
    assert_eq!(r.request_headers_to_remove, ["x-internal"]);
    assert_eq!(
        header_options(&r.response_headers_to_add),
        [(
            "x-served-by".into(),
            "ballast".into(),
            HeaderAppendAction::AppendIfExistsOrAdd as i32
        )]
    );
    assert_eq!(r.response_headers_to_remove, ["server"]);
}

/// Gateway API `backendRefs[].filters`: header mutations on the one weighted cluster they belong
/// to, not on the route; a lone ref with filters still uses `weighted_clusters`; two refs to
/// one Backend with different filters stay separate.
#[test]
fn backend_ref_header_filters() {
    let route = route_yaml(
        "web",
        r#"  rules:
  - matches: [{ path: { value: /split } }]
    filters:
    - { type: RequestHeaderModifier, requestHeaderModifier: { set: [{ name: x-rule, value: r }] } }
    backendRefs:
    - name: web
      filters:
      - type: RequestHeaderModifier
        requestHeaderModifier:
          set: [{ name: x-backend, value: a }]
          add: [{ name: x-via, value: ballast }]
          remove: [x-internal]
      - type: ResponseHeaderModifier
        responseHeaderModifier: { add: [{ name: x-served-by, value: a }], remove: [server] }
    - { name: canary }
  - matches: [{ path: { value: /one } }]
    backendRefs:
    - { name: web, filters: [{ type: RequestHeaderModifier, requestHeaderModifier: { set: [{ name: x-one, value: "1" }] } }] }
  - matches: [{ path: { value: /same } }]
    backendRefs:
    - { name: web, weight: 2 }
    - { name: web, weight: 3, filters: [{ type: RequestHeaderModifier, requestHeaderModifier: { set: [{ name: x-b, value: b }] } }] }
  - matches: [{ path: { value: /plain } }]
    backendRefs: [{ name: web }]
"#,
    );
    let canary = backend_yaml("canary", WEB);
    let res = translate(&docs(&[GATEWAY_HTTP, BACKEND_WEB, &canary, &route]), "edge");
    let vh = only_vhost(&res);
    let by_name = |n: &str| vh.routes.iter().find(|r| r.name == n).unwrap().clone();
    let weighted = |n: &str| match route_action(&by_name(n)).cluster_specifier.clone() {
        Some(ClusterSpecifier::WeightedClusters(w)) => w.clusters,
        other => panic!("{n}: not weighted: {other:?}"),
    };
    let set = HeaderAppendAction::OverwriteIfExistsOrAdd as i32;
    let add = HeaderAppendAction::AppendIfExistsOrAdd as i32;

    let split = weighted("default/web/0/0");
    assert_eq!(split.len(), 2);
    assert_eq!(split[0].name, "default/web");
    assert_eq!(
        header_options(&split[0].request_headers_to_add),
        [
            ("x-backend".into(), "a".into(), set),
            ("x-via".into(), "ballast".into(), add)
        ]
    );
    assert_eq!(split[0].request_headers_to_remove, ["x-internal"]);
    assert_eq!(
        header_options(&split[0].response_headers_to_add),
        [("x-served-by".into(), "a".into(), add)]
    );
    assert_eq!(split[0].response_headers_to_remove, ["server"]);
    // The other backend gets nothing; the rule's own filter stays on the route.
    assert_eq!(split[1].name, "default/canary");
    assert!(split[1].request_headers_to_add.is_empty());
    assert!(split[1].response_headers_to_add.is_empty());
    assert!(split[1].request_headers_to_remove.is_empty());
    assert_eq!(
        header_options(&by_name("default/web/0/0").request_headers_to_add),
        [("x-rule".into(), "r".into(), set)]
    );

    let one = weighted("default/web/1/0");
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].weight.unwrap().value, 1);
    assert_eq!(
        header_options(&one[0].request_headers_to_add),
        [("x-one".into(), "1".into(), set)]
    );

    let same = weighted("default/web/2/0");
    let got: Vec<(String, u32, usize)> = same
        .iter()
        .map(|c| {
            (
                c.name.clone(),
                c.weight.unwrap().value,
                c.request_headers_to_add.len(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [("default/web".into(), 2, 0), ("default/web".into(), 3, 1)]
    );

    // Without backendRef filters a lone backend stays a plain cluster.
    assert_eq!(
        route_action(&by_name("default/web/3/0")).cluster_specifier,
        Some(ClusterSpecifier::Cluster("default/web".into()))
    );
}

#[test]
fn redirects() {
    let route = route_yaml(
        "web",
        r#"  rules:
  - matches: [{ path: { type: PathPrefix, value: /old } }]
    filters:
    - type: RequestRedirect
      requestRedirect:
        scheme: https
        hostname: www.example.com
        port: 8443
        statusCode: 301
        path: { type: ReplaceFullPath, replaceFullPath: /new }
  - matches: [{ path: { type: PathPrefix, value: /moved } }]
    filters:
    - type: RequestRedirect
      requestRedirect:
        path: { type: ReplacePrefixMatch, replacePrefixMatch: /here }
    backendRefs: [{ name: web }]
"#,
    );
    let res = translate(&docs(&[GATEWAY_HTTP, BACKEND_WEB, &route]), "edge");
    // A redirecting rule sends no traffic to its backendRefs: no cluster.
    assert!(res.clusters.is_empty());
    let vh = only_vhost(&res);
    let redirect = |r: &Route| match &r.action {
        Some(Action::Redirect(a)) => a.clone(),
        other => panic!("not a redirect: {other:?}"),
    };
    // `/moved` is the longer prefix, so it comes first.
    assert_eq!(vh.routes[1].name, "default/web/0/0");
    let a = redirect(&vh.routes[1]);
    assert_eq!(
        a.scheme_rewrite_specifier,
        Some(SchemeRewriteSpecifier::SchemeRedirect("https".into()))
    );
    assert_eq!(a.host_redirect, "www.example.com");
    assert_eq!(a.port_redirect, 8443);
    assert_eq!(
        a.response_code,
        RedirectResponseCode::MovedPermanently as i32
    );
    assert_eq!(
        a.path_rewrite_specifier,
        Some(PathRewriteSpecifier::PathRedirect("/new".into()))
    );
    let b = redirect(&vh.routes[0]);
    assert_eq!(b.response_code, RedirectResponseCode::Found as i32);
    assert_eq!(b.host_redirect, "");
    assert_eq!(b.scheme_rewrite_specifier, None);
    assert_eq!(
        b.path_rewrite_specifier,
        Some(PathRewriteSpecifier::PrefixRewrite("/here".into()))
    );
}

/// Gateway API: a redirect without scheme and port keeps the listener's port (conformance
/// `HTTPRouteRedirectPortAndScheme`), left out of the `Location` for the well-known port 80.
/// Envoy strips the port from `Host`, so Ballast sets `port_redirect` per listener port; an
/// explicit scheme or port is left as written. The incremental translator agrees.
#[test]
fn redirects_keep_a_non_default_listener_port() {
    let gateway = &gateway_yaml(
        r#"  - { name: std, port: 80, protocol: HTTP }
  - { name: alt, port: 8080, protocol: HTTP }
"#,
    );
    let route = |host: &str| {
        route_yaml(
            "web",
            &format!(
                r#"  hostnames: [{host}]
  rules:
  - matches: [{{ path: {{ value: /keep }} }}]
    filters: [{{ type: RequestRedirect, requestRedirect: {{ hostname: example.org }} }}]
  - matches: [{{ path: {{ value: /https }} }}]
    filters: [{{ type: RequestRedirect, requestRedirect: {{ scheme: https }} }}]
  - matches: [{{ path: {{ value: /port }} }}]
    filters: [{{ type: RequestRedirect, requestRedirect: {{ port: 9000 }} }}]
"#
            ),
        )
    };
    let ports = |res: &GatewayResources| -> std::collections::BTreeMap<String, Vec<(String, u32)>> {
        res.route_configs
            .iter()
            .map(|rc| {
                let rc: RouteConfiguration = decode(rc);
                let got = rc.virtual_hosts[0]
                    .routes
                    .iter()
                    .map(|r| match &r.action {
                        Some(Action::Redirect(a)) => (r.name.clone(), a.port_redirect),
                        other => panic!("not a redirect: {other:?}"),
                    })
                    .collect();
                (rc.name, got)
            })
            .collect()
    };
    let yaml = docs(&[gateway, &route("a.example.com")]);
    let res = translate(&yaml, "edge");
    let want = |keep: u32| {
        vec![
            ("default/web/1/0".to_owned(), 0),
            ("default/web/0/0".to_owned(), keep),
            ("default/web/2/0".to_owned(), 9000),
        ]
    };
    assert_eq!(
        ports(&res),
        std::collections::BTreeMap::from([
            ("default/edge/80".to_owned(), want(0)),
            ("default/edge/8080".to_owned(), want(8080)),
        ])
    );
    // Incremental: the route edited in place is re-encoded per port like from scratch.
    let mut t = Translator::new(Options::default());
    t.update(&Arc::new(config(&yaml)));
    let edited = docs(&[gateway, &route("b.example.com")]);
    let out = t.update(&Arc::new(config(&edited)));
    assert_eq!(*out.changed[&gw("edge")], translate(&edited, "edge"));
    assert_eq!(ports(&out.changed[&gw("edge")]), ports(&res));
}

#[test]
fn url_rewrites() {
    let route = route_yaml(
        "web",
        r#"  rules:
  - matches: [{ path: { type: PathPrefix, value: /app } }]
    filters:
    - type: URLRewrite
      urlRewrite:
        hostname: app.internal
        path: { type: ReplacePrefixMatch, replacePrefixMatch: / }
    backendRefs: [{ name: web }]
  - matches: [{ path: { type: Exact, value: /full } }]
    filters:
    - type: URLRewrite
      urlRewrite:
        path: { type: ReplaceFullPath, replaceFullPath: /other }
    backendRefs: [{ name: web }]
  - matches: [{ path: { type: PathPrefix, value: /v1 } }]
    filters:
    - type: URLRewrite
      urlRewrite:
        path: { type: ReplacePrefixMatch, replacePrefixMatch: /v2 }
    backendRefs: [{ name: web }]
"#,
    );
    let res = translate(&docs(&[GATEWAY_HTTP, BACKEND_WEB, &route]), "edge");
    let vh = only_vhost(&res);
    use envoy_types::pb::envoy::r#type::matcher::v3::{RegexMatchAndSubstitute, RegexMatcher};
    let rms = |p: &str, s: &str| {
        Some(RegexMatchAndSubstitute {
            pattern: Some(RegexMatcher {
                regex: p.into(),
                ..Default::default()
            }),
            substitution: s.into(),
        })
    };
    let full = route_action(&vh.routes[0]);
    assert_eq!(vh.routes[0].name, "default/web/1/0");
    assert_eq!(full.regex_rewrite, rms("^/.*$", "/other"));
    let app = route_action(&vh.routes[1]);
    assert_eq!(vh.routes[1].name, "default/web/0/0");
    assert_eq!(
        app.host_rewrite_specifier,
        Some(HostRewriteSpecifier::HostRewriteLiteral(
            "app.internal".into()
        ))
    );
    assert_eq!(app.regex_rewrite, rms("^/app/*", "/"));
    assert_eq!(app.prefix_rewrite, "");
    let v1 = route_action(&vh.routes[2]);
    assert_eq!(v1.prefix_rewrite, "/v2");
    assert_eq!(v1.regex_rewrite, None);
}

#[test]
fn weighted_and_unresolvable_backends() {
    let route = route_yaml(
        "web",
        r#"  rules:
  - matches: [{ path: { value: /split } }]
    backendRefs: [{ name: web, weight: 90 }, { name: canary, weight: 10 }, { name: zero, weight: 0 }]
  - matches: [{ path: { value: /partial } }]
    backendRefs: [{ name: web, weight: 3 }, { name: missing, weight: 1 }]
  - matches: [{ path: { value: /missing } }]
    backendRefs: [{ name: missing }, { kind: Service, name: web }]
  - matches: [{ path: { value: /none } }]
  - matches: [{ path: { value: /allzero } }]
    backendRefs: [{ name: web, weight: 0 }]
"#,
    );
    let canary = backend_yaml("canary", WEB);
    let zero = backend_yaml("zero", WEB);
    let unused = backend_yaml("unused", WEB);
    let res = translate(
        &docs(&[GATEWAY_HTTP, BACKEND_WEB, &canary, &zero, &unused, &route]),
        "edge",
    );
    // Only backends that receive traffic become clusters.
    assert_eq!(names(&res.clusters), ["default/canary", "default/web"]);
    assert_eq!(
        names(&res.load_assignments),
        ["default/canary", "default/web"]
    );
    let vh = only_vhost(&res);
    let by_name = |n: &str| {
        vh.routes
            .iter()
            .find(|r| r.name == n)
            .unwrap_or_else(|| panic!("no route {n}"))
    };
    let ClusterSpecifier::WeightedClusters(w) = route_action(by_name("default/web/0/0"))
        .cluster_specifier
        .clone()
        .unwrap()
    else {
        panic!("not weighted")
    };
    let got: Vec<(String, u32)> = w
        .clusters
        .iter()
        .map(|c| (c.name.clone(), c.weight.unwrap().value))
        .collect();
    assert_eq!(
        got,
        [("default/web".into(), 90), ("default/canary".into(), 10)]
    );
    // Partial: a 25% 500 route first, then the resolvable backend.
    let i = vh
        .routes
        .iter()
        .position(|r| r.name == "default/web/1/0/unresolved")
        .unwrap();
    assert_eq!(vh.routes[i + 1].name, "default/web/1/0");
    let frac = vh.routes[i]
        .r#match
        .as_ref()
        .unwrap()
        .runtime_fraction
        .clone()
        .unwrap()
        .default_value
        .unwrap();
    assert_eq!(frac.numerator, 250_000);
    let direct_500 = |r: &Route| matches!(&r.action, Some(Action::DirectResponse(d)) if d.status == 500 && d.body.is_none());
    assert!(direct_500(&vh.routes[i]));
    assert_eq!(
        route_action(&vh.routes[i + 1]).cluster_specifier,
        Some(ClusterSpecifier::Cluster("default/web".into()))
    );
    for n in ["default/web/2/0", "default/web/3/0", "default/web/4/0"] {
        assert!(direct_500(by_name(n)), "{n}");
    }
}

#[test]
fn timeouts_and_retries() {
    let route = route_yaml(
        "web",
        r#"  rules:
  - matches: [{ path: { value: /a } }]
    timeouts: { request: 10s, backendRequest: 3s }
    backendRefs: [{ name: web }]
  - matches: [{ path: { value: /b } }]
    retry: { attempts: 2, perTryTimeout: 1s, retryOn: [connect-failure, 5xx] }
    backendRefs: [{ name: web }]
  - matches: [{ path: { value: /c } }]
    retry: { attempts: 1 }
    timeouts: { request: 0s }
    backendRefs: [{ name: web }]
  - matches: [{ path: { value: /d } }]
    backendRefs: [{ name: web }]
"#,
    );
    let res = translate(&docs(&[GATEWAY_HTTP, BACKEND_WEB, &route]), "edge");
    let vh = only_vhost(&res);
    let secs = |s: i64| {
        Some(PbDuration {
            seconds: s,
            nanos: 0,
        })
    };
    let action = |n: &str| route_action(vh.routes.iter().find(|r| r.name == n).unwrap()).clone();
    let a = action("default/web/0/0");
    assert_eq!(a.timeout, secs(10));
    let rp = a.retry_policy.unwrap();
    assert_eq!(rp.per_try_timeout, secs(3));
    assert_eq!(rp.num_retries, Some(UInt32Value { value: 0 }));
    assert_eq!(rp.retry_on, "");
    let b = action("default/web/1/0");
    assert_eq!(b.timeout, None);
    let rp = b.retry_policy.unwrap();
    assert_eq!(rp.retry_on, "connect-failure,5xx");
    assert_eq!(rp.num_retries, Some(UInt32Value { value: 2 }));
    assert_eq!(rp.per_try_timeout, secs(1));
    let c = action("default/web/2/0");
    assert_eq!(c.timeout, secs(0));
    let rp = c.retry_policy.unwrap();
    assert_eq!(rp.retry_on, "connect-failure,refused-stream,unavailable");
    assert_eq!(rp.per_try_timeout, None);
    let d = action("default/web/3/0");
    assert_eq!((d.timeout, d.retry_policy), (None, None));
}

#[test]
fn backend_cluster_and_endpoints() {
    use envoy_types::pb::envoy::config::cluster::v3::cluster::{
        ClusterDiscoveryType, DiscoveryType, EdsClusterConfig, LbPolicy,
    };
    use envoy_types::pb::envoy::config::core::v3::HealthCheck;
    use envoy_types::pb::envoy::config::core::v3::health_check::{HealthChecker, HttpHealthCheck};
    let users = backend_yaml(
        "users",
        r#"  endpoints:
  - { address: 10.0.0.1, port: 8080 }
  - { address: 10.0.0.2, port: 8080, weight: 2, zone: us-east-1b }
  - { address: "fd00::3", port: 8080, health: Draining, zone: us-east-1a }
  - { address: 10.0.0.4, port: 8081, health: Unhealthy, zone: us-east-1b }
  loadBalancer: { policy: LeastRequest }
  connectTimeout: 1s
  healthCheck: { path: /healthz, interval: 5s, timeout: 1s, healthyThreshold: 1, unhealthyThreshold: 3 }
"#,
    );
    let route = route_yaml("web", "  rules:\n  - backendRefs: [{ name: users }]\n");
    let res = translate(&docs(&[GATEWAY_HTTP, &users, &route]), "edge");
    let c: Cluster = decode(find(&res.clusters, "default/users"));
    let secs = |s: i64| {
        Some(PbDuration {
            seconds: s,
            nanos: 0,
        })
    };
    let want = Cluster {
        name: "default/users".into(),
        connect_timeout: secs(1),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(EdsClusterConfig {
            eds_config: Some(ballast_xds::simple::ads_source()),
            service_name: String::new(),
        }),
        lb_policy: LbPolicy::LeastRequest as i32,
        health_checks: vec![HealthCheck {
            timeout: secs(1),
            interval: secs(5),
            healthy_threshold: Some(UInt32Value { value: 1 }),
            unhealthy_threshold: Some(UInt32Value { value: 3 }),
            health_checker: Some(HealthChecker::HttpHealthCheck(HttpHealthCheck {
                path: "/healthz".into(),
                // A valid Host (Envoy's default would be the cluster name `default/users`).
                host: "users".into(),
                ..Default::default()
            })),
            ..Default::default()
        }],
        ..Default::default()
    };
    assert_eq!(c, want);
    let cla: ClusterLoadAssignment = decode(find(&res.load_assignments, "default/users"));
    type Zone = (String, Vec<(String, u32, i32)>);
    let got: Vec<Zone> = cla
        .endpoints
        .iter()
        .map(|l| {
            (
                l.locality.as_ref().map(|l| l.zone.clone()).unwrap_or_default(),
                l.lb_endpoints
                    .iter()
                    .map(|e| {
                        let Some(
                            envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier::Endpoint(ep),
                        ) = &e.host_identifier
                        else {
                            panic!()
                        };
                        let Some(envoy_types::pb::envoy::config::core::v3::address::Address::SocketAddress(sa)) =
                            &ep.address.as_ref().unwrap().address
                        else {
                            panic!()
                        };
                        (
                            sa.address.clone(),
                            e.load_balancing_weight.unwrap().value,
                            e.health_status,
                        )
                    })
                    .collect(),
            )
        })
        .collect();
    let healthy = HealthStatus::Healthy as i32;
    assert_eq!(
        got,
        [
            ("".into(), vec![("10.0.0.1".into(), 1, healthy)]),
            (
                "us-east-1a".into(),
                vec![("fd00::3".into(), 1, HealthStatus::Draining as i32)]
            ),
            (
                "us-east-1b".into(),
                vec![
                    ("10.0.0.2".into(), 2, healthy),
                    ("10.0.0.4".into(), 1, HealthStatus::Unhealthy as i32)
                ]
            ),
        ]
    );
    assert!(cla.endpoints[0].locality.is_none());
}

#[test]
fn lb_policies_and_hash_policy() {
    use envoy_types::pb::envoy::config::cluster::v3::cluster::LbPolicy;
    let mut parts = vec![GATEWAY_HTTP.to_owned()];
    let policies = [
        ("RoundRobin", LbPolicy::RoundRobin, false),
        ("LeastRequest", LbPolicy::LeastRequest, false),
        ("Random", LbPolicy::Random, false),
        ("RingHash", LbPolicy::RingHash, true),
        ("Maglev", LbPolicy::Maglev, true),
    ];
    for (i, (p, _, _)) in policies.iter().enumerate() {
        parts.push(backend_yaml(
            &format!("b{i}"),
            &format!("{WEB}  loadBalancer: {{ policy: {p} }}\n"),
        ));
        parts.push(route_yaml(
            &format!("r{i}"),
            &format!(
                "  rules:\n  - matches: [{{ path: {{ value: /{i} }} }}]\n    backendRefs: [{{ name: b{i} }}]\n"
            ),
        ));
    }
    let parts: Vec<&str> = parts.iter().map(|s| s.as_str()).collect();
    let res = translate(&docs(&parts), "edge");
    let vh = only_vhost(&res);
    for (i, (_, want, hash)) in policies.iter().enumerate() {
        let c: Cluster = decode(find(&res.clusters, &format!("default/b{i}")));
        assert_eq!(c.lb_policy, *want as i32);
        let r = vh
            .routes
            .iter()
            .find(|r| r.name == format!("default/r{i}/0/0"))
            .unwrap();
        assert_eq!(!route_action(r).hash_policy.is_empty(), *hash, "{i}");
    }
}

const CERT: &str = "-----BEGIN CERTIFICATE-----\\nMIIB\\n-----END CERTIFICATE-----\\n";
const KEY: &str = "-----BEGIN PRIVATE KEY-----\\nMIGH\\n-----END PRIVATE KEY-----\\n";

pub(crate) fn secret_yaml(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{ name: {name} }}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: \"{CERT}\"\n  tls.key: \"{KEY}\"\n"
    )
}

const GATEWAY_HTTPS: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: { name: edge }
spec:
  gatewayClassName: ballast
  listeners:
  - name: a
    port: 443
    protocol: HTTPS
    hostname: a.example.com
    tls: { certificateRefs: [{ name: cert-a }] }
  - name: b
    port: 443
    protocol: HTTPS
    hostname: "*.example.com"
    tls: { certificateRefs: [{ name: cert-b }, { name: cert-missing }] }
  - name: broken
    port: 443
    protocol: HTTPS
    hostname: broken.example.org
    tls: { certificateRefs: [{ name: cert-missing }] }
  - name: any
    port: 443
    protocol: HTTPS
    tls: { certificateRefs: [{ name: cert-b }] }
"#;

#[test]
fn https_sni_filter_chains_with_sds_certificates() {
    let web = route_yaml(
        "web",
        "  hostnames: [a.example.com, b.example.com]\n  rules:\n  - backendRefs: [{ name: web }]\n",
    );
    let other = route_yaml("other", "  rules:\n  - backendRefs: [{ name: web }]\n");
    let yaml = docs(&[
        GATEWAY_HTTPS,
        BACKEND_WEB,
        &secret_yaml("cert-a"),
        &secret_yaml("cert-b"),
        &secret_yaml("cert-unused"),
        &web,
        &other,
    ]);
    let res = translate(&yaml, "edge");
    assert_eq!(names(&res.secrets), ["default/cert-a", "default/cert-b"]);
    assert_eq!(names(&res.listeners), ["default/edge/443"]);
    assert_eq!(
        names(&res.route_configs),
        [
            "default/edge/443/*",
            "default/edge/443/*.example.com",
            "default/edge/443/a.example.com"
        ]
    );
    let l: Listener = decode(&res.listeners[0]);
    assert_eq!(
        l.listener_filters
            .iter()
            .map(|f| f.name.as_str())
            .collect::<Vec<_>>(),
        ["envoy.filters.listener.tls_inspector"]
    );
    // One chain per served listener (not `broken`, whose certificate is missing).
    let chains: Vec<(Vec<String>, Vec<String>, String)> = l
        .filter_chains
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let Some(TsConfig::TypedConfig(any)) =
                &c.transport_socket.as_ref().unwrap().config_type
            else {
                panic!()
            };
            let tls = DownstreamTlsContext::decode(any.value.as_slice()).unwrap();
            let ctx = tls.common_tls_context.unwrap();
            assert_eq!(ctx.alpn_protocols, ["h2", "http/1.1"]);
            let sds: Vec<String> = ctx
                .tls_certificate_sds_secret_configs
                .iter()
                .map(|s| {
                    assert_eq!(s.sds_config, Some(ballast_xds::simple::ads_source()));
                    s.name.clone()
                })
                .collect();
            let rds = match hcm(&l, i).route_specifier {
                Some(envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier::Rds(r)) => r.route_config_name,
                other => panic!("{other:?}"),
            };
            (
                c.filter_chain_match
                    .as_ref()
                    .map(|m| m.server_names.clone())
                    .unwrap_or_default(),
                sds,
                rds,
            )
        })
        .collect();
    assert_eq!(
        chains,
        [
            (
                vec![],
                vec!["default/cert-b".into()],
                "default/edge/443/*".into()
            ),
            (
                vec!["*.example.com".into()],
                vec!["default/cert-b".into()],
                "default/edge/443/*.example.com".into()
            ),
            (
                vec!["a.example.com".into()],
                vec!["default/cert-a".into()],
                "default/edge/443/a.example.com".into()
            ),
        ]
    );
    // Each chain's routes only hold the hostnames of its own listener.
    let domains = |name: &str| {
        let rc: RouteConfiguration = decode(find(&res.route_configs, name));
        rc.virtual_hosts
            .iter()
            .map(|v| v.name.clone())
            .collect::<Vec<_>>()
    };
    // A chain selected by a listener hostname also answers 421 for any other host (SNI a,
    // Host b: misdirected), and keeps its own hostname (404 when no route matches).
    assert_eq!(
        domains("default/edge/443/a.example.com"),
        ["misdirected", "a.example.com"]
    );
    // `a.example.com` has its own listener (and chain): on the wildcard's chain it is
    // misdirected too, even though `web` (attached to both) names it.
    assert_eq!(
        domains("default/edge/443/*.example.com"),
        [
            "misdirected",
            "*.example.com",
            "misdirected/a.example.com",
            "b.example.com"
        ]
    );
    let wild: RouteConfiguration =
        decode(find(&res.route_configs, "default/edge/443/*.example.com"));
    let sibling = &wild.virtual_hosts[2];
    assert_eq!(sibling.domains, ["a.example.com"]);
    assert!(matches!(
        &sibling.routes[0].action,
        Some(envoy_types::pb::envoy::config::route::v3::route::Action::DirectResponse(d))
            if d.status == 421
    ));
    let rc: RouteConfiguration = decode(find(&res.route_configs, "default/edge/443/a.example.com"));
    let catch_all = &rc.virtual_hosts[0];
    assert_eq!(catch_all.domains, ["*"]);
    assert_eq!(catch_all.routes.len(), 1);
    match &catch_all.routes[0].action {
        Some(envoy_types::pb::envoy::config::route::v3::route::Action::DirectResponse(d)) => {
            assert_eq!(d.status, 421)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        domains("default/edge/443/*"),
        ["*", "a.example.com", "b.example.com"]
    );
    // The secret carries the PEM inline; to_yaml redacts the key.
    let s: EnvoySecret = decode(&res.secrets[0]);
    let Some(envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::secret::Type::TlsCertificate(tc)) = s.r#type else { panic!() };
    use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
    assert_eq!(
        tc.certificate_chain.unwrap().specifier,
        Some(Specifier::InlineBytes(
            CERT.replace("\\n", "\n").into_bytes()
        ))
    );
    assert_eq!(
        tc.private_key.unwrap().specifier,
        Some(Specifier::InlineBytes(
            KEY.replace("\\n", "\n").into_bytes()
        ))
    );
    let y = res.to_yaml();
    assert!(
        !y.contains("PRIVATE KEY") && !y.contains("LS0tLS1CRUdJTiBQUklW"),
        "{y}"
    );
    assert!(y.contains("[redacted]"));
}

#[test]
fn shared_http_port_picks_the_most_specific_listener() {
    let gateway = &gateway_yaml(
        r#"  - { name: any, port: 80, protocol: HTTP }
  - { name: wild, port: 80, protocol: HTTP, hostname: "*.example.com" }
  - { name: exact, port: 80, protocol: HTTP, hostname: only.example.com }
"#,
    );
    // `everywhere` attaches to every listener; `specific` names a host the wildcard listener
    // serves; `catchall` attaches only to `any` (sectionName).
    let everywhere = route_yaml("everywhere", "  rules:\n  - backendRefs: [{ name: web }]\n");
    let specific = route_yaml(
        "specific",
        "  hostnames: [x.example.com]\n  rules:\n  - backendRefs: [{ name: web }]\n",
    );
    let catchall = route_yaml("catchall", "  rules:\n  - backendRefs: [{ name: web }]\n")
        .replace("[{ name: edge }]", "[{ name: edge, sectionName: any }]")
        .replace(
            "  rules:",
            "  hostnames: [y.example.com, other.org]\n  rules:",
        );
    let res = translate(
        &docs(&[gateway, BACKEND_WEB, &everywhere, &specific, &catchall]),
        "edge",
    );
    let rc: RouteConfiguration = decode(&res.route_configs[0]);
    let vhosts: Vec<(String, Vec<String>)> = rc
        .virtual_hosts
        .iter()
        .map(|v| {
            (
                v.name.clone(),
                v.routes.iter().map(|r| r.name.clone()).collect(),
            )
        })
        .collect();
    assert_eq!(
        vhosts,
        [
            ("*".into(), vec!["default/everywhere/0/0".into()]),
            (
                "*.example.com".into(),
                vec!["default/everywhere/0/0".into()]
            ),
            (
                "only.example.com".into(),
                vec!["default/everywhere/0/0".into()]
            ),
            ("other.org".into(), vec!["default/catchall/0/0".into()]),
            // x.example.com belongs to the wildcard listener, where `specific` attached.
            ("x.example.com".into(), vec!["default/specific/0/0".into()]),
            // y.example.com also belongs to the wildcard listener, where `catchall` did not
            // attach: the host is not served by `catchall`'s rules (and falls to `*.example.com`).
        ]
    );

    // Hostname listeners without routes still get their (empty, 404) virtual host, so their
    // requests never fall through to a less specific listener's routes.
    let res = translate(&docs(&[gateway, BACKEND_WEB, &specific]), "edge");
    let rc: RouteConfiguration = decode(&res.route_configs[0]);
    let vhosts: Vec<(&str, usize)> = rc
        .virtual_hosts
        .iter()
        .map(|v| (v.name.as_str(), v.routes.len()))
        .collect();
    assert_eq!(
        vhosts,
        [
            ("*.example.com", 0),
            ("only.example.com", 0),
            ("x.example.com", 1)
        ]
    );
}

#[test]
fn routes_not_accepted_are_not_translated() {
    let wrong_section = route_yaml("a", "  rules:\n  - backendRefs: [{ name: web }]\n")
        .replace("[{ name: edge }]", "[{ name: edge, sectionName: nope }]");
    let other_ns = route_yaml("b", "  rules:\n  - backendRefs: [{ name: web }]\n")
        .replace(
            "metadata: { name: b }",
            "metadata: { name: b, namespace: apps }",
        )
        .replace("[{ name: edge }]", "[{ name: edge, namespace: default }]");
    let res = translate(
        &docs(&[GATEWAY_HTTP, BACKEND_WEB, &wrong_section, &other_ns]),
        "edge",
    );
    let rc: RouteConfiguration = decode(&res.route_configs[0]);
    assert!(rc.virtual_hosts.is_empty());
    assert!(res.clusters.is_empty());
    assert_eq!(
        translate_gateway(&config(GATEWAY_HTTP), &gw("nope"), &Options::default()),
        Err(crate::TranslateError::GatewayNotFound(gw("nope")))
    );
}

/// Every YAML example of docs/configuration.md, each as its own file, in one config set.
fn documentation_examples() -> ConfigSet {
    const DOCS: &str = include_str!("../../../docs/configuration.md");
    let mut files = Vec::new();
    let mut rest = DOCS;
    while let Some(start) = rest.find("```yaml\n") {
        let body = &rest[start + 8..];
        let end = body.find("```").unwrap();
        files.push((format!("doc{}.yaml", files.len()), body[..end].to_owned()));
        rest = &body[end..];
    }
    ConfigSet::build(files).unwrap()
}

/// Every Gateway of the documentation's examples translates to a consistent snapshot.
#[test]
fn documentation_examples_give_consistent_snapshots() {
    let set = documentation_examples();
    assert!(!set.gateways.is_empty());
    for key in set.gateways.keys() {
        let res = translate_gateway(&set, key, &Options::default()).unwrap();
        res.snapshot(None)
            .unwrap_or_else(|e| panic!("gateway {key}: {e}"));
        assert!(!res.listeners.is_empty());
    }
}

/// A route's request mirrors: (cluster, share per million when not all).
fn mirrors(r: &Route) -> Vec<(String, Option<u32>)> {
    route_action(r)
        .request_mirror_policies
        .iter()
        .map(|m| {
            (
                m.cluster.clone(),
                m.runtime_fraction
                    .as_ref()
                    .map(|f| f.default_value.unwrap().numerator),
            )
        })
        .collect()
}

fn grpc_yaml(name: &str, rules: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {{ name: {name} }}\nspec:\n  parentRefs: [{{ name: edge }}]\n{rules}"
    )
}

/// RequestMirror on a GRPCRoute: the mirror target gets the HTTP/2 copy of its Backend too
/// (a mirrored gRPC call must reach it over HTTP/2), with the share as for HTTPRoute.
#[test]
fn grpc_route_request_mirror_uses_h2c_clusters() {
    let grpc = grpc_yaml(
        "web",
        "  rules:\n  - filters:\n    - { type: RequestMirror, requestMirror: { backendRef: { name: shadow } } }\n    \
         - { type: RequestMirror, requestMirror: { backendRef: { name: h2 }, percent: 10 } }\n    \
         - { type: RequestMirror, requestMirror: { backendRef: { name: missing } } }\n    backendRefs: [{ name: web }]\n",
    );
    let yaml = docs(&[
        GATEWAY_HTTP,
        &grpc,
        &backend_yaml("web", WEB),
        &backend_yaml("shadow", WEB),
        &backend_yaml(
            "h2",
            "  appProtocol: kubernetes.io/h2c\n  endpoints: [{ address: 10.0.0.2, port: 80 }]\n",
        ),
    ]);
    let res = translate(&yaml, "edge");
    let vh = only_vhost(&res);
    assert_eq!(
        mirrors(&vh.routes[0]),
        [
            ("default/shadow:h2c".to_owned(), None),
            ("default/h2".to_owned(), Some(100_000))
        ]
    );
    assert_eq!(
        names(&res.clusters),
        vec!["default/h2", "default/shadow:h2c", "default/web:h2c"]
    );
}

#[test]
fn grpc_routes_share_virtual_hosts_with_http_routes_and_use_h2c_clusters() {
    let grpc = grpc_yaml(
        "web",
        "  rules:\n  - matches: [{ method: { service: pkg.Echo, method: Echo } }]\n    backendRefs: [{ name: web }, { name: h2, weight: 3 }]\n",
    );
    let yaml = docs(&[
        GATEWAY_HTTP,
        // Same name as the GRPCRoute: distinct objects, distinct Envoy routes.
        &route_yaml("web", "  rules: [{ backendRefs: [{ name: web }] }]\n"),
        &grpc,
        &backend_yaml("web", WEB),
        &backend_yaml(
            "h2",
            "  appProtocol: kubernetes.io/h2c\n  endpoints: [{ address: 10.0.0.2, port: 80 }]\n",
        ),
    ]);
    let res = translate(&yaml, "edge");
    let vh = only_vhost(&res);
    let got: Vec<&str> = vh.routes.iter().map(|r| r.name.as_str()).collect();
    // The exact gRPC method sorts before the HTTPRoute's `PathPrefix /`.
    assert_eq!(got, vec!["default/grpc:web/0/0", "default/web/0/0"]);
    assert_eq!(
        vh.routes[0].r#match.as_ref().unwrap().path_specifier,
        Some(PathSpecifier::Path("/pkg.Echo/Echo".into()))
    );
    let Some(ClusterSpecifier::WeightedClusters(w)) =
        &route_action(&vh.routes[0]).cluster_specifier
    else {
        panic!("{:?}", vh.routes[0])
    };
    let split: Vec<(&str, u32)> = w
        .clusters
        .iter()
        .map(|c| (c.name.as_str(), c.weight.as_ref().unwrap().value))
        .collect();
    // `web` gets an HTTP/2 copy; `h2` already speaks HTTP/2 and is used as it is.
    assert_eq!(split, vec![("default/web:h2c", 1), ("default/h2", 3)]);
    assert_eq!(
        names(&res.clusters),
        vec!["default/h2", "default/web", "default/web:h2c"]
    );
    let h2c: Cluster = decode(find(&res.clusters, "default/web:h2c"));
    assert!(
        h2c.typed_extension_protocol_options
            .contains_key("envoy.extensions.upstreams.http.v3.HttpProtocolOptions"),
        "{h2c:?}"
    );
    let plain: Cluster = decode(find(&res.clusters, "default/web"));
    assert!(plain.typed_extension_protocol_options.is_empty());
    let cla: ClusterLoadAssignment = decode(find(&res.load_assignments, "default/web:h2c"));
    assert_eq!(cla.endpoints[0].lb_endpoints.len(), 1);

    // Incremental: adding, editing and removing the GRPCRoute gives what a from-scratch
    // translation gives, and only touches what it must.
    let without = docs(&[
        GATEWAY_HTTP,
        &route_yaml("web", "  rules: [{ backendRefs: [{ name: web }] }]\n"),
        &backend_yaml("web", WEB),
    ]);
    let edited = yaml.replace("method: Echo", "method: EchoTwo");
    // An endpoint change of `web` reaches its HTTP/2 copy too.
    let moved = edited.replace("10.0.0.1", "10.0.0.9");
    let mut t = Translator::new(Options::default());
    for step in [&without, &yaml, &edited, &moved, &without] {
        let set = Arc::new(config(step));
        t.update(&set);
        assert_eq!(
            **t.gateway(&gw("edge")).as_ref().unwrap(),
            translate_gateway(&set, &gw("edge"), &Options::default()).unwrap()
        );
    }
    let set = Arc::new(config(&moved));
    t.update(&set);
    let res = t.gateway(&gw("edge")).unwrap();
    let cla: ClusterLoadAssignment = decode(find(&res.load_assignments, "default/web:h2c"));
    assert!(format!("{cla:?}").contains("10.0.0.9"), "{cla:?}");
}

fn service_yaml(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{ name: {name} }}\nspec:\n  ports: [{{ name: http, port: 80, targetPort: 8080 }}]\n"
    )
}

fn slice_yaml(service: &str, addrs: &[&str]) -> String {
    let eps: Vec<String> = addrs
        .iter()
        .map(|a| format!("{{ addresses: [{a}], conditions: {{ ready: true }}, zone: z1 }}"))
        .collect();
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{ name: {service}-abc, labels: {{ kubernetes.io/service-name: {service} }} }}\naddressType: IPv4\nports: [{{ name: http, port: 8080 }}]\nendpoints: [{}]\n",
        eps.join(", ")
    )
}

/// Service + EndpointSlice backends: one EDS cluster per Service port; an EndpointSlice change is
/// an EDS-only patch; a Service appearing takes over a shorthand ref that meant a Backend (and
/// every step equals a from-scratch translation).
#[test]
fn service_backends_translate_incrementally() {
    let route = route_yaml(
        "r",
        "  rules:\n  - backendRefs: [{ name: web, port: 80 }]\n",
    );
    let backend = backend_yaml("web", "  endpoints: [{ address: 127.0.0.1, port: 9 }]\n");
    let mut t = Translator::new(Options::default());
    let step = |t: &mut Translator, yaml: String| {
        let set = Arc::new(config(&yaml));
        let out = t.update(&set);
        let res = t.gateway(&gw("edge")).unwrap();
        assert_eq!(
            *res,
            translate_gateway(&set, &gw("edge"), &Options::default()).unwrap()
        );
        (out, res)
    };
    // Only a Backend named web: the shorthand ref resolves to it.
    let (_, res) = step(&mut t, docs(&[GATEWAY_HTTP, &route, &backend]));
    assert_eq!(names(&res.clusters), vec!["default/web"]);
    // A Service named web appears: the bare ref now means the Service (Gateway API).
    let (out, res) = step(
        &mut t,
        docs(&[
            GATEWAY_HTTP,
            &route,
            &backend,
            &service_yaml("web"),
            &slice_yaml("web", &["10.0.0.1", "10.0.0.2"]),
        ]),
    );
    assert_eq!(out.stats.gateways_translated, 1);
    assert_eq!(names(&res.clusters), vec!["default/web:80"]);
    let cla: ClusterLoadAssignment = decode(find(&res.load_assignments, "default/web:80"));
    let eps: Vec<_> = cla.endpoints[0].lb_endpoints.iter().collect();
    assert_eq!(eps.len(), 2);
    assert_eq!(cla.endpoints[0].locality.as_ref().unwrap().zone, "z1");
    // An endpoint change: only the load assignment is patched.
    let (out, res) = step(
        &mut t,
        docs(&[
            GATEWAY_HTTP,
            &route,
            &backend,
            &service_yaml("web"),
            &slice_yaml("web", &["10.0.0.3"]),
        ]),
    );
    assert_eq!(out.stats.gateways_translated, 0);
    assert_eq!(out.stats.gateways_patched, 1);
    let cla: ClusterLoadAssignment = decode(find(&res.load_assignments, "default/web:80"));
    assert_eq!(cla.endpoints[0].lb_endpoints.len(), 1);
    // The Service goes: back to the Backend.
    let (out, res) = step(&mut t, docs(&[GATEWAY_HTTP, &route, &backend]));
    assert_eq!(out.stats.gateways_translated, 1);
    assert_eq!(names(&res.clusters), vec!["default/web"]);
}

/// `protocol` (Backend) / `appProtocol` (Service port): h2c and grpc make the cluster speak
/// HTTP/2; the default and ws stay HTTP/1.1.
#[test]
fn upstream_protocols() {
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
    let h2 = backend_yaml(
        "h2",
        "  protocol: kubernetes.io/h2c\n  endpoints: [{ address: 127.0.0.1, port: 1 }]\n",
    );
    let ws = backend_yaml(
        "ws",
        "  protocol: kubernetes.io/ws\n  endpoints: [{ address: 127.0.0.1, port: 2 }]\n",
    );
    let svc = "apiVersion: v1\nkind: Service\nmetadata: { name: rpc }\nspec:\n  ports: [{ port: 50051, appProtocol: grpc }]\n";
    let route = route_yaml(
        "r",
        "  rules:\n  - backendRefs: [{ group: ballast.dev, kind: Backend, name: h2 }, { group: ballast.dev, kind: Backend, name: ws }, { name: rpc, port: 50051 }]\n",
    );
    let res = translate(&docs(&[GATEWAY_HTTP, &h2, &ws, svc, &route]), "edge");
    let opts = |name: &str| {
        let c: Cluster = decode(find(&res.clusters, name));
        c.typed_extension_protocol_options
            .get("envoy.extensions.upstreams.http.v3.HttpProtocolOptions")
            .map(|any| HttpProtocolOptions::decode(any.value.as_slice()).unwrap())
    };
    let is_h2 = |o: Option<HttpProtocolOptions>| format!("{o:?}").contains("Http2ProtocolOptions");
    assert!(is_h2(opts("default/h2")));
    assert!(is_h2(opts("default/rpc:50051")));
    assert_eq!(opts("default/ws"), None);
    // An unknown Backend protocol is an error at the field.
    let bad = backend_yaml("x", "  protocol: quic\n");
    let e = ballast_model::ConfigSet::build([("b.yaml", bad)]).unwrap_err();
    assert!(
        e[0].to_string()
            .contains("spec.protocol: unknown protocol \"quic\""),
        "{e:?}"
    );
}
/// A cross-namespace backendRef becomes a cluster only while a ReferenceGrant allows it, and the
/// incremental translator follows the grant being added and removed (nothing else changes).
#[test]
fn reference_grant_gates_cross_namespace_backends_incrementally() {
    let backend = "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: { name: web, namespace: backends }\nspec:\n  endpoints: [{ address: 10.0.0.1, port: 80 }]\n";
    let route = route_yaml(
        "web",
        "  rules: [{ backendRefs: [{ name: web, namespace: backends }] }]\n",
    );
    let grant = "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: { name: allow, namespace: backends }\nspec:\n  from: [{ group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: default }]\n  to: [{ group: ballast.dev, kind: Backend }]\n";
    let without = Arc::new(config(&docs(&[GATEWAY_HTTP, backend, &route])));
    let with = Arc::new(config(&docs(&[GATEWAY_HTTP, backend, &route, grant])));
    let mut t = Translator::new(Options::default());
    let is_500 = |res: &GatewayResources| matches!(&only_vhost(res).routes[0].action, Some(Action::DirectResponse(d)) if d.status == 500);
    let out = t.update(&without);
    let res = &out.changed[&gw("edge")];
    assert!(res.clusters.is_empty() && is_500(res));
    let out = t.update(&with);
    let res = out.changed[&gw("edge")].clone();
    assert_eq!(names(&res.clusters), ["backends/web"]);
    assert_eq!(
        route_action(&only_vhost(&res).routes[0]).cluster_specifier,
        Some(ClusterSpecifier::Cluster("backends/web".into()))
    );
    assert_eq!(
        *res,
        translate_gateway(&with, &gw("edge"), &Options::default()).unwrap()
    );
    let out = t.update(&without);
    let res = &out.changed[&gw("edge")];
    assert!(res.clusters.is_empty() && is_500(res));
}

/// Gateway API's standard `retry`: `codes` become Envoy retriable status codes (on top of the
/// connection-failure conditions), `attempts` the retry count (default 1), `backoff` the base
/// interval.
#[test]
fn standard_retry_codes_attempts_backoff() {
    let route = route_yaml(
        "web",
        r#"  rules:
  - matches: [{ path: { value: /a } }]
    retry: { codes: [500, 503], attempts: 3, backoff: 100ms }
    backendRefs: [{ name: web }]
  - matches: [{ path: { value: /b } }]
    retry: { codes: [502] }
    backendRefs: [{ name: web }]
"#,
    );
    let res = translate(&docs(&[GATEWAY_HTTP, BACKEND_WEB, &route]), "edge");
    let vh = only_vhost(&res);
    let action = |n: &str| route_action(vh.routes.iter().find(|r| r.name == n).unwrap()).clone();
    let rp = action("default/web/0/0").retry_policy.unwrap();
    assert_eq!(
        rp.retry_on,
        "connect-failure,refused-stream,unavailable,retriable-status-codes"
    );
    assert_eq!(rp.retriable_status_codes, [500, 503]);
    assert_eq!(rp.num_retries, Some(UInt32Value { value: 3 }));
    assert_eq!(
        rp.retry_back_off.unwrap().base_interval,
        Some(PbDuration {
            seconds: 0,
            nanos: 100_000_000
        })
    );
    let rp = action("default/web/1/0").retry_policy.unwrap();
    assert_eq!(rp.retriable_status_codes, [502]);
    assert_eq!(rp.num_retries, Some(UInt32Value { value: 1 }));
    assert_eq!(rp.retry_back_off, None);
    // Out-of-range codes and a zero backoff are errors at their position.
    let bad = route_yaml(
        "web",
        "  rules: [{ retry: { codes: [200], backoff: 0s }, backendRefs: [{ name: web }] }]\n",
    );
    let errs = build_errors(&bad);
    assert_eq!(
        errs,
        [
            "r.yaml:6:30: HTTPRoute default/web: spec.rules[0].retry.codes[0]: status code 200 is out of range 400..=599",
            "r.yaml:6:45: HTTPRoute default/web: spec.rules[0].retry.backoff: backoff must be greater than 0",
        ]
    );
}

/// A named rule names its Envoy routes and gives them a stat prefix; unnamed rules keep index
/// names and no per-route stats. Names are DNS labels, unique within the route.
#[test]
fn rule_names_in_route_names_and_stats() {
    let route = route_yaml(
        "web",
        r#"  rules:
  - name: users
    matches: [{ path: { value: /users } }, { path: { value: /people } }]
    backendRefs: [{ name: web }]
  - backendRefs: [{ name: web }]
"#,
    );
    let res = translate(&docs(&[GATEWAY_HTTP, BACKEND_WEB, &route]), "edge");
    let got: Vec<(String, String)> = only_vhost(&res)
        .routes
        .iter()
        .map(|r| (r.name.clone(), r.stat_prefix.clone()))
        .collect();
    let s = |a: &str, b: &str| (a.to_owned(), b.to_owned());
    assert_eq!(
        got,
        [
            s("default/web/users/1", "default/web/users"),
            s("default/web/users/0", "default/web/users"),
            s("default/web/1/0", ""),
        ]
    );
    let bad = route_yaml(
        "web",
        "  rules:\n  - { name: a, backendRefs: [{ name: web }] }\n  - { name: a }\n  - { name: Bad }\n",
    );
    let errs = build_errors(&bad);
    assert_eq!(errs.len(), 2, "{errs:#?}");
    assert_eq!(
        errs[0],
        "r.yaml:8:13: HTTPRoute default/web: spec.rules[1].name: rule name \"a\" is also used by spec.rules[0]"
    );
    assert!(errs[1].starts_with("r.yaml:9:13: HTTPRoute default/web: spec.rules[2].name: name \"Bad\" is not a valid DNS label"), "{errs:#?}");
}

/// RequestMirror: every mirror target becomes a mirror policy (a share below 100% as a
/// fraction in millionths) and a cluster; an unresolvable target mirrors nothing.
#[test]
fn request_mirror_percent_and_fraction() {
    let route = route_yaml(
        "web",
        r#"  rules:
  - filters:
    - { type: RequestMirror, requestMirror: { backendRef: { name: shadow } } }
    - { type: RequestMirror, requestMirror: { backendRef: { name: shadow2 }, percent: 25 } }
    - { type: RequestMirror, requestMirror: { backendRef: { name: shadow3 }, fraction: { numerator: 1, denominator: 3 } } }
    - { type: RequestMirror, requestMirror: { backendRef: { name: missing } } }
    backendRefs: [{ name: web }]
"#,
    );
    let shadows: Vec<String> = ["shadow", "shadow2", "shadow3"]
        .iter()
        .map(|n| backend_yaml(n, WEB))
        .collect();
    let mut parts = vec![GATEWAY_HTTP, BACKEND_WEB, route.as_str()];
    parts.extend(shadows.iter().map(String::as_str));
    let res = translate(&docs(&parts), "edge");
    assert_eq!(
        names(&res.clusters),
        [
            "default/shadow",
            "default/shadow2",
            "default/shadow3",
            "default/web"
        ]
    );
    let vh = only_vhost(&res);
    assert_eq!(
        mirrors(&vh.routes[0]),
        [
            ("default/shadow".to_owned(), None),
            ("default/shadow2".to_owned(), Some(250_000)),
            ("default/shadow3".to_owned(), Some(333_333)),
        ]
    );
    let bad = route_yaml(
        "web",
        "  rules: [{ filters: [{ type: RequestMirror, requestMirror: { backendRef: { name: s }, percent: 101, fraction: { numerator: 2, denominator: 1 } } }] }]\n",
    );
    let errs = build_errors(&bad);
    assert_eq!(errs.len(), 3, "{errs:#?}");
    assert!(
        errs[0].contains("requestMirror.percent: give percent or fraction, not both"),
        "{errs:#?}"
    );
    assert!(errs[1].contains("percent 101 is out of range"), "{errs:#?}");
    assert!(
        errs[2].contains("fraction.numerator: numerator 2 is greater than denominator 1"),
        "{errs:#?}"
    );
}

/// A listener admitting routes by namespace labels follows a Namespace's labels changing: the
/// incremental translator adds and removes the route (nothing else changes).
#[test]
fn namespace_labels_gate_selector_listeners_incrementally() {
    let gateway = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: edge }\nspec:\n  gatewayClassName: ballast\n  listeners:\n  - name: http\n    port: 10000\n    protocol: HTTP\n    allowedRoutes: { namespaces: { from: Selector, selector: { matchLabels: { gw: edge } } } }\n";
    let route = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: { name: web, namespace: team }\nspec:\n  parentRefs: [{ name: edge, namespace: default }]\n  rules: [{ backendRefs: [{ name: web, namespace: default }] }]\n---\napiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: { name: g }\nspec:\n  from: [{ group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: team }]\n  to: [{ group: ballast.dev, kind: Backend }]\n";
    let ns = |labels: &str| {
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{ name: team, labels: {{ {labels} }} }}\n"
        )
    };
    let with = Arc::new(config(&docs(&[
        gateway,
        BACKEND_WEB,
        route,
        &ns("gw: edge"),
    ])));
    let without = Arc::new(config(&docs(&[
        gateway,
        BACKEND_WEB,
        route,
        &ns("gw: other"),
    ])));
    let mut t = Translator::new(Options::default());
    let out = t.update(&without);
    assert!(out.changed[&gw("edge")].clusters.is_empty());
    let out = t.update(&with);
    let res = out.changed[&gw("edge")].clone();
    assert_eq!(names(&res.clusters), ["default/web"]);
    assert_eq!(
        *res,
        translate_gateway(&with, &gw("edge"), &Options::default()).unwrap()
    );
    let out = t.update(&without);
    assert!(out.changed[&gw("edge")].clusters.is_empty());
}

/// CORS: the HCM runs `envoy.filters.http.cors` just before the router; a rule with a CORS
/// filter gets a per-route CorsPolicy, a rule without one gets none.
#[test]
fn cors_filter_becomes_a_per_route_policy() {
    use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy;
    use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
    let route = route_yaml(
        "web",
        r#"  rules:
  - matches: [{ path: { type: PathPrefix, value: /api } }]
    filters:
    - type: CORS
      cors:
        allowOrigins: ["https://app.example", "https://*.example.com"]
        allowMethods: [GET, PUT]
        allowHeaders: [x-client]
        exposeHeaders: [x-trace]
        allowCredentials: true
    backendRefs: [{ name: web }]
  - backendRefs: [{ name: web }]
"#,
    );
    let res = translate(&docs(&[GATEWAY_HTTP, BACKEND_WEB, &route]), "edge");
    let filters: Vec<String> = hcm(&decode(&res.listeners[0]), 0)
        .http_filters
        .iter()
        .map(|f| f.name.clone())
        .collect();
    assert_eq!(
        filters,
        [
            "envoy.filters.http.cors",
            "envoy.filters.http.stateful_session",
            "envoy.filters.http.router"
        ]
    );
    let vh = only_vhost(&res);
    assert_eq!(vh.routes.len(), 2);
    let any = &vh.routes[0].typed_per_filter_config["envoy.filters.http.cors"];
    assert_eq!(
        any.type_url,
        "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy"
    );
    let p = CorsPolicy::decode(any.value.as_slice()).unwrap();
    let origins: Vec<_> = p
        .allow_origin_string_match
        .iter()
        .map(|m| m.match_pattern.clone().unwrap())
        .collect();
    assert_eq!(
        origins[0],
        MatchPattern::Exact("https://app.example".into())
    );
    assert!(
        matches!(&origins[1], MatchPattern::SafeRegex(r) if r.regex == "https://.*\\.example\\.com")
    );
    assert_eq!(p.allow_methods, "GET,PUT");
    assert_eq!(p.allow_headers, "x-client");
    assert_eq!(p.expose_headers, "x-trace");
    assert_eq!(p.max_age, "5");
    assert_eq!(p.allow_credentials, Some(BoolValue { value: true }));
    assert_eq!(
        p.forward_not_matching_preflights,
        Some(BoolValue { value: false })
    );
    assert!(
        vh.routes[1].typed_per_filter_config.is_empty(),
        "a rule without CORS is unchanged"
    );
}

/// `sessionPersistence` → a per-route `StatefulSessionPerRoute` with the cookie (name, path,
/// `Max-Age` only for `Permanent`) or header session state; rules without it get nothing (the
/// connection manager's filter has no session state, so it is inactive there).
#[test]
fn session_persistence_becomes_per_route_stateful_sessions() {
    use envoy_types::pb::envoy::extensions::filters::http::stateful_session::v3::StatefulSessionPerRoute;
    use envoy_types::pb::envoy::extensions::filters::http::stateful_session::v3::stateful_session_per_route::Override;
    use envoy_types::pb::envoy::extensions::http::stateful_session::cookie::v3::CookieBasedSessionState;
    use envoy_types::pb::envoy::extensions::http::stateful_session::header::v3::HeaderBasedSessionState;
    let route = route_yaml(
        "web",
        r#"  rules:
  - matches: [{ path: { type: PathPrefix, value: /session } }]
    sessionPersistence: { sessionName: sticky }
    backendRefs: [{ name: web }]
  - matches: [{ path: { type: PathPrefix, value: /permanent } }]
    sessionPersistence:
      type: Cookie
      absoluteTimeout: 1h
      cookie: { name: perm, path: /permanent, lifetimeType: Permanent }
    backendRefs: [{ name: web }]
  - matches: [{ path: { type: PathPrefix, value: /header } }]
    sessionPersistence: { type: Header, header: { name: x-session } }
    backendRefs: [{ name: web }]
  - matches: [{ path: { type: PathPrefix, value: /generated } }]
    sessionPersistence: {}
    backendRefs: [{ name: web }]
  - backendRefs: [{ name: web }]
"#,
    );
    let res = translate(&docs(&[GATEWAY_HTTP, BACKEND_WEB, &route]), "edge");
    let vh = only_vhost(&res);
    let state = |prefix: &str| {
        let r = vh
            .routes
            .iter()
            .find(|r| r.name.starts_with(prefix))
            .unwrap_or_else(|| panic!("no route {prefix}"));
        let any = r
            .typed_per_filter_config
            .get("envoy.filters.http.stateful_session")?;
        let per = StatefulSessionPerRoute::decode(any.value.as_slice()).unwrap();
        let Some(Override::StatefulSession(s)) = per.r#override else {
            panic!("not enabled")
        };
        assert!(!s.strict, "a gone endpoint falls back to load balancing");
        s.session_state
    };
    let cookie = |prefix: &str| {
        let st = state(prefix).unwrap();
        assert_eq!(st.name, "envoy.http.stateful_session.cookie");
        CookieBasedSessionState::decode(st.typed_config.unwrap().value.as_slice())
            .unwrap()
            .cookie
            .unwrap()
    };
    let c = cookie("default/web/0/");
    assert_eq!(
        (c.name.as_str(), c.path.as_str(), c.ttl),
        ("sticky", "/", None)
    );
    let c = cookie("default/web/1/");
    assert_eq!((c.name.as_str(), c.path.as_str()), ("perm", "/permanent"));
    assert_eq!(c.ttl.unwrap().seconds, 3600);
    let h = state("default/web/2/").unwrap();
    assert_eq!(h.name, "envoy.http.stateful_session.header");
    let h = HeaderBasedSessionState::decode(h.typed_config.unwrap().value.as_slice()).unwrap();
    assert_eq!(h.name, "x-session");
    let c = cookie("default/web/3/");
    assert_eq!(
        c.name,
        crate::session::default_name(&ObjectKey::new("default", "web"), 3)
    );
    assert!(
        state("default/web/4/").is_none(),
        "a rule without it is unchanged"
    );
}

/// Conflicted listeners are not served: no Envoy listener for a port whose listeners all
/// conflict (HTTP and HTTPS on 80), and a shared port (81) serves only its distinct listener's
/// hostname; the other ports are unchanged.
#[test]
fn conflicted_listeners_get_no_envoy_config() {
    let gateway = &gateway_yaml(
        r#"  - { name: http, port: 80, protocol: HTTP }
  - { name: tls, port: 80, protocol: HTTPS, tls: { certificateRefs: [{ name: s }] } }
  - { name: a, port: 81, protocol: HTTP, hostname: a.example.com }
  - { name: a-again, port: 81, protocol: HTTP, hostname: a.example.com }
  - { name: b, port: 81, protocol: HTTP, hostname: b.example.com }
  - { name: other, port: 82, protocol: HTTP }
"#,
    );
    let route = route_yaml(
        "web",
        "  hostnames: [a.example.com, b.example.com]\n  rules:\n  - backendRefs: [{ name: web }]\n",
    );
    let res = translate(&docs(&[gateway, BACKEND_WEB, &route]), "edge");
    assert_eq!(
        names(&res.listeners),
        ["default/edge/81", "default/edge/82"],
        "port 80 has no distinct listener"
    );
    let rc: RouteConfiguration = decode(find(&res.route_configs, "default/edge/81"));
    let domains: Vec<&str> = rc
        .virtual_hosts
        .iter()
        .flat_map(|v| v.domains.iter().map(String::as_str))
        .collect();
    assert_eq!(
        domains,
        ["b.example.com"],
        "a.example.com's listeners conflict"
    );
    let rc: RouteConfiguration = decode(find(&res.route_configs, "default/edge/82"));
    let mut domains: Vec<&str> = rc
        .virtual_hosts
        .iter()
        .flat_map(|v| v.domains.iter().map(String::as_str))
        .collect();
    domains.sort();
    assert_eq!(domains, ["a.example.com", "b.example.com"]);
}

/// GRPCRoute rules take `sessionPersistence` like HTTPRoute rules (header sessions suit gRPC
/// clients); the generated name differs from a same-named HTTPRoute's.
#[test]
fn grpc_route_session_persistence() {
    use envoy_types::pb::envoy::extensions::filters::http::stateful_session::v3::StatefulSessionPerRoute;
    let grpc = grpc_yaml(
        "web",
        "  rules:\n  - matches: [{ method: { service: pkg.Echo } }]\n    sessionPersistence: { type: Header, header: { name: x-grpc-session } }\n    backendRefs: [{ name: web }]\n  - sessionPersistence: {}\n    backendRefs: [{ name: web }]\n",
    );
    let res = translate(&docs(&[GATEWAY_HTTP, BACKEND_WEB, &grpc]), "edge");
    let vh = only_vhost(&res);
    let per_route: Vec<(&str, StatefulSessionPerRoute)> = vh
        .routes
        .iter()
        .map(|r| {
            let any = &r.typed_per_filter_config["envoy.filters.http.stateful_session"];
            (
                r.name.as_str(),
                StatefulSessionPerRoute::decode(any.value.as_slice()).unwrap(),
            )
        })
        .collect();
    assert_eq!(per_route.len(), 2);
    let dbg = format!("{per_route:?}");
    assert!(dbg.contains("envoy.http.stateful_session.header"), "{dbg}");
    let generated = crate::session::default_name(&ObjectKey::new("default", "grpc:web"), 1);
    assert_ne!(
        generated,
        crate::session::default_name(&ObjectKey::new("default", "web"), 1)
    );
    let cookie = &per_route
        .iter()
        .find(|(n, _)| *n == "default/grpc:web/1/0")
        .unwrap()
        .1;
    let Some(
        envoy_types::pb::envoy::extensions::filters::http::stateful_session::v3::stateful_session_per_route::Override::StatefulSession(s),
    ) = &cookie.r#override
    else {
        panic!()
    };
    let st = s.session_state.as_ref().unwrap();
    assert_eq!(st.name, "envoy.http.stateful_session.cookie");
    let c = envoy_types::pb::envoy::extensions::http::stateful_session::cookie::v3::CookieBasedSessionState::decode(
        st.typed_config.as_ref().unwrap().value.as_slice(),
    )
    .unwrap();
    assert_eq!(c.cookie.unwrap().name, generated);
}

/// RateLimitPolicy: a route policy becomes the route's per-filter configs (local buckets with
/// descriptors; the other filter disabled), a Gateway policy the connection manager's filter
/// configs with the service cluster; configs without policies keep their filters; the
/// incremental translator agrees with from-scratch translation as policies and the service
/// Backend come and go.
#[test]
fn rate_limit_policies_translate_incrementally() {
    use envoy_types::pb::envoy::extensions::filters::http::local_ratelimit::v3::LocalRateLimit;
    use envoy_types::pb::envoy::extensions::filters::http::ratelimit::v3::RateLimit as GlobalFilter;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpFilterConfig;
    let limited = route_yaml(
        "limited",
        "  rules:\n  - matches: [{ path: { type: PathPrefix, value: /limited } }]\n    backendRefs: [{ group: ballast.dev, kind: Backend, name: web }]\n",
    );
    let free = route_yaml(
        "free",
        "  rules:\n  - matches: [{ path: { type: PathPrefix, value: /free } }]\n    backendRefs: [{ group: ballast.dev, kind: Backend, name: web }]\n",
    );
    let route_policy = "apiVersion: ballast.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: { name: per-user }\nspec:\n  targetRefs: [{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: limited }]\n  local:\n    rules:\n    - clientSelectors: [{ headers: [{ name: X-User, type: Distinct }] }]\n      limit: { requests: 10, unit: Hour }\n";
    let gw_policy = "apiVersion: ballast.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: { name: edge-global }\nspec:\n  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }]\n  global:\n    backendRef: { name: rls }\n    failureModeDeny: true\n    rules: [{ name: all, clientSelectors: [{ sourceCIDR: { type: Distinct } }] }]\n";
    let rls = backend_yaml(
        "rls",
        "  protocol: grpc\n  endpoints: [{ address: 127.0.0.1, port: 8081 }]\n",
    );
    let mut t = Translator::new(Options::default());
    let step = |t: &mut Translator, parts: &[&str]| {
        let set = Arc::new(config(&docs(parts)));
        t.update(&set);
        let res = t.gateway(&gw("edge")).unwrap();
        let scratch = translate_gateway(&set, &gw("edge"), &Options::default()).unwrap();
        if *res != scratch {
            let a: RouteConfiguration = decode(&res.route_configs[0]);
            let b: RouteConfiguration = decode(&scratch.route_configs[0]);
            panic!("incremental {a:#?}\nscratch {b:#?}");
        }
        res
    };
    let filters = |res: &GatewayResources| -> Vec<String> {
        hcm(&decode(&res.listeners[0]), 0)
            .http_filters
            .iter()
            .map(|f| f.name.clone())
            .collect()
    };
    let per_filter = |res: &GatewayResources, route: &str| {
        let rc: RouteConfiguration = decode(&res.route_configs[0]);
        rc.virtual_hosts
            .iter()
            .flat_map(|v| &v.routes)
            .find(|r| r.name.starts_with(route))
            .unwrap()
            .typed_per_filter_config
            .clone()
    };
    let base = step(&mut t, &[GATEWAY_HTTP, BACKEND_WEB, &limited, &free]);
    let plain = filters(&base);
    assert!(!plain.iter().any(|f| f.contains("ratelimit")), "{plain:?}");

    // Route policy: the local filter appears (inactive at this level); the limited route
    // carries its buckets, the free route nothing.
    let res = step(
        &mut t,
        &[GATEWAY_HTTP, BACKEND_WEB, &limited, &free, route_policy],
    );
    let f = filters(&res);
    // Rate limits run before the stateful-session filter, which sits right before the router.
    assert_eq!(f[f.len() - 3], "envoy.filters.http.local_ratelimit");
    assert_eq!(f[f.len() - 2], "envoy.filters.http.stateful_session");
    assert_eq!(f.last().unwrap(), "envoy.filters.http.router");
    let cfg = per_filter(&res, "default/limited");
    let local =
        LocalRateLimit::decode(cfg["envoy.filters.http.local_ratelimit"].value.as_slice()).unwrap();
    assert_eq!(local.descriptors.len(), 1);
    let d = &local.descriptors[0];
    assert_eq!(
        d.entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect::<Vec<_>>(),
        [("generic_key", "default/per-user/0"), ("x-user", "")]
    );
    assert_eq!(d.token_bucket.as_ref().unwrap().max_tokens, 10);
    assert_eq!(
        d.token_bucket
            .as_ref()
            .unwrap()
            .fill_interval
            .as_ref()
            .unwrap()
            .seconds,
        3600
    );
    assert_eq!(local.enable_x_ratelimit_headers, 1);
    assert!(
        cfg.contains_key("envoy.filters.http.ratelimit"),
        "disabled there"
    );
    assert!(per_filter(&res, "default/free").is_empty());

    // Gateway policy with a global service that does not exist yet: no global filter.
    let res = step(
        &mut t,
        &[
            GATEWAY_HTTP,
            BACKEND_WEB,
            &limited,
            &free,
            route_policy,
            gw_policy,
        ],
    );
    assert!(!filters(&res).contains(&"envoy.filters.http.ratelimit".to_owned()));
    assert_eq!(names(&res.clusters), ["default/web"]);
    // The service appears: filter, cluster.
    let res = step(
        &mut t,
        &[
            GATEWAY_HTTP,
            BACKEND_WEB,
            &limited,
            &free,
            route_policy,
            gw_policy,
            &rls,
        ],
    );
    assert_eq!(names(&res.clusters), ["default/rls", "default/web"]);
    let l: Listener = decode(&res.listeners[0]);
    let h = hcm(&l, 0);
    let g = h
        .http_filters
        .iter()
        .find(|f| f.name == "envoy.filters.http.ratelimit")
        .expect("global filter");
    let Some(HttpFilterConfig::TypedConfig(any)) = &g.config_type else {
        panic!()
    };
    let g = GlobalFilter::decode(any.value.as_slice()).unwrap();
    assert_eq!(g.domain, "ballast");
    // A valid `:authority` (the cluster name's `/` makes HTTP/2 servers reset every call).
    let svc = g.rate_limit_service.unwrap().grpc_service.unwrap();
    assert!(
        format!("{svc:?}").contains("authority: \"rls.default\""),
        "{svc:?}"
    );
    assert!(g.failure_mode_deny);
    assert_eq!(g.rate_limits.len(), 1);
    assert_eq!(g.rate_limits[0].actions.len(), 2);
    // The policies go: back to the plain translation.
    let res = step(&mut t, &[GATEWAY_HTTP, BACKEND_WEB, &limited, &free, &rls]);
    assert_eq!(filters(&res), plain);
    assert_eq!(names(&res.clusters), ["default/web"]);
}

/// Hostname endpoints: the Backend is an `envoy.cluster.dns` cluster with its endpoints inline
/// (hostname, health check Host), c-ares pointed at the configured resolvers, and no EDS
/// resource; switching a Backend between IPs and hostnames incrementally equals a from-scratch
/// translation; an ExternalName Service is the same kind of cluster on the route's port.
#[test]
fn dns_backends_and_external_name_services() {
    use envoy_types::pb::envoy::config::cluster::v3::cluster::ClusterDiscoveryType;
    use envoy_types::pb::envoy::config::core::v3::health_check::HealthChecker;
    use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
    use envoy_types::pb::envoy::extensions::clusters::dns::v3::DnsCluster;
    use envoy_types::pb::envoy::extensions::network::dns_resolver::cares::v3::CaresDnsResolverConfig;

    let route = route_yaml(
        "r",
        "  rules:\n  - backendRefs: [{ group: ballast.dev, kind: Backend, name: api, port: 80 }]\n  - matches: [{ path: { type: PathPrefix, value: /ext } }]\n    backendRefs: [{ name: ext, port: 8443 }]\n",
    );
    let dns = backend_yaml(
        "api",
        "  endpoints: [{ address: api.test, port: 8080, zone: z1 }, { address: 10.0.0.1, port: 8081 }]\n  dns: { refreshRate: 2s, lookupFamily: V4Only }\n  healthCheck: { path: /healthz }\n",
    );
    let ip = backend_yaml("api", "  endpoints: [{ address: 10.0.0.1, port: 8081 }]\n");
    let ext = "apiVersion: v1\nkind: Service\nmetadata: { name: ext }\nspec:\n  type: ExternalName\n  externalName: ext.test\n  ports: [{ port: 8443 }]\n";
    let options = Options {
        dns_resolvers: vec!["127.0.0.1:5353".parse().unwrap()],
        ..Options::default()
    };
    let mut t = Translator::new(options.clone());
    let step = |t: &mut Translator, yaml: String| {
        let set = Arc::new(config(&yaml));
        t.update(&set);
        let res = t.gateway(&gw("edge")).unwrap();
        assert_eq!(
            *res,
            translate_gateway(&set, &gw("edge"), &options).unwrap()
        );
        res.snapshot(None).expect("consistent snapshot");
        res
    };
    let dns_cluster = |c: &Cluster| -> DnsCluster {
        let Some(ClusterDiscoveryType::ClusterType(t)) = &c.cluster_discovery_type else {
            panic!("not a custom cluster type: {c:?}");
        };
        assert_eq!(t.name, "envoy.cluster.dns");
        let any = t.typed_config.as_ref().unwrap();
        assert!(
            any.type_url
                .ends_with("envoy.extensions.clusters.dns.v3.DnsCluster")
        );
        DnsCluster::decode(any.value.as_slice()).unwrap()
    };

    let res = step(&mut t, docs(&[GATEWAY_HTTP, &route, &dns, ext]));
    assert_eq!(
        names(&res.clusters),
        vec!["default/api", "default/ext:8443"]
    );
    assert!(
        res.load_assignments.is_empty(),
        "{:?}",
        names(&res.load_assignments)
    );
    let c: Cluster = decode(find(&res.clusters, "default/api"));
    assert!(c.eds_cluster_config.is_none());
    let d = dns_cluster(&c);
    assert_eq!(d.dns_refresh_rate.as_ref().map(|d| d.seconds), Some(2));
    assert!(!d.respect_dns_ttl && !d.all_addresses_in_single_endpoint);
    assert_eq!(d.dns_lookup_family, 2 /* V4_ONLY */);
    let r = d.typed_dns_resolver_config.as_ref().unwrap();
    assert_eq!(r.name, "envoy.network.dns_resolver.cares");
    let cares =
        CaresDnsResolverConfig::decode(r.typed_config.as_ref().unwrap().value.as_slice()).unwrap();
    let a = cares.resolvers[0].address.as_ref().unwrap();
    assert_eq!(format!("{a:?}").matches("127.0.0.1").count(), 1, "{a:?}");
    assert!(format!("{a:?}").contains("5353"), "{a:?}");
    assert!(cares.dns_resolver_options.unwrap().no_default_search_domain);
    // Endpoints inline: the hostname endpoint carries its name, also as health check Host; the
    // IP one keeps the cluster-level Host (the Backend's name).
    let la = c.load_assignment.as_ref().unwrap();
    assert_eq!(la.cluster_name, "default/api");
    let ep = |i: usize, j: usize| match &la.endpoints[i].lb_endpoints[j].host_identifier {
        Some(HostIdentifier::Endpoint(e)) => e.clone(),
        other => panic!("{other:?}"),
    };
    let (named, by_ip) = (ep(1, 0), ep(0, 0));
    assert_eq!(la.endpoints[1].locality.as_ref().unwrap().zone, "z1");
    assert_eq!(named.hostname, "api.test");
    assert!(format!("{:?}", named.address).contains("\"api.test\""));
    assert_eq!(named.health_check_config.unwrap().hostname, "api.test");
    assert!(by_ip.health_check_config.is_none() && by_ip.hostname.is_empty());
    let Some(HealthChecker::HttpHealthCheck(hc)) = &c.health_checks[0].health_checker else {
        panic!()
    };
    assert_eq!(hc.host, "api");
    // The ExternalName Service: one strict DNS endpoint on the Service port, TTL-driven.
    let c: Cluster = decode(find(&res.clusters, "default/ext:8443"));
    let d = dns_cluster(&c);
    assert!(d.respect_dns_ttl && !d.all_addresses_in_single_endpoint);
    let la = c.load_assignment.unwrap();
    let Some(HostIdentifier::Endpoint(e)) = &la.endpoints[0].lb_endpoints[0].host_identifier else {
        panic!()
    };
    assert_eq!(e.hostname, "ext.test");
    assert!(
        format!("{:?}", e.address).contains("PortValue(8443)"),
        "{e:?}"
    );

    // An explicit health check Host wins over the endpoint names.
    let explicit = dns.replace(
        "{ path: /healthz }",
        "{ path: /healthz, host: api.example }",
    );
    let res = step(&mut t, docs(&[GATEWAY_HTTP, &route, &explicit, ext]));
    let c: Cluster = decode(find(&res.clusters, "default/api"));
    assert!(
        c.load_assignment.unwrap().endpoints[1].lb_endpoints[0]
            .host_identifier
            .as_ref()
            .is_some_and(|h| !format!("{h:?}").contains("HealthCheckConfig"))
    );
    // Switching to IPs only: an EDS cluster and its load assignment; and back.
    let res = step(&mut t, docs(&[GATEWAY_HTTP, &route, &ip, ext]));
    let c: Cluster = decode(find(&res.clusters, "default/api"));
    assert!(c.eds_cluster_config.is_some() && c.load_assignment.is_none());
    assert_eq!(names(&res.load_assignments), vec!["default/api"]);
    let res = step(&mut t, docs(&[GATEWAY_HTTP, &route, &dns, ext]));
    assert!(res.load_assignments.is_empty());
    // Logical mode.
    let logical = backend_yaml(
        "api",
        "  endpoints: [{ address: api.test, port: 8080 }]\n  dns: { mode: Logical, respectTtl: true }\n",
    );
    let res = step(&mut t, docs(&[GATEWAY_HTTP, &route, &logical, ext]));
    let d = dns_cluster(&decode(find(&res.clusters, "default/api")));
    assert!(d.all_addresses_in_single_endpoint && d.respect_dns_ttl);
    // Without resolvers, Envoy's own resolver configuration is used.
    let set = config(&docs(&[GATEWAY_HTTP, &route, &logical, ext]));
    let res = translate_gateway(&set, &gw("edge"), &Options::default()).unwrap();
    let d = dns_cluster(&decode(find(&res.clusters, "default/api")));
    assert!(d.typed_dns_resolver_config.is_none());
}

/// Every `@type` any translation in this test binary emitted (see [`assert_served_json`]).
static EMITTED_ANY_TYPES: std::sync::Mutex<std::collections::BTreeSet<String>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

fn collect_any_types(v: &serde_json::Value, out: &mut std::collections::BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            if let Some(serde_json::Value::String(t)) = m.get("@type") {
                out.insert(t.clone());
            }
            m.values().for_each(|v| collect_any_types(v, out));
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_any_types(v, out)),
        _ => {}
    }
}

/// Prints every resource of `res` as proto-JSON with the *served* descriptor
/// pool alone (no fallback to the full one): an `Any` whose type is not in
/// `ballast-xds/descriptors/served-types.txt` fails here. Called by
/// `translate_gateway` in every test of this crate, so each feature's tests
/// (and the property tests' random configs) walk the types they emit.
pub(crate) fn assert_served_json(res: &GatewayResources) {
    let pool = ballast_xds::json::served_pool();
    let mut seen = std::collections::BTreeSet::new();
    for r in res.iter() {
        let url = r.ty().type_url();
        let name = url.rsplit('/').next().unwrap();
        let desc = pool
            .get_message_by_name(name)
            .unwrap_or_else(|| panic!("{name} is not in the served pool"));
        let msg = prost_reflect::DynamicMessage::decode(desc, r.value_bytes()).unwrap();
        let v = serde_json::to_value(&msg).unwrap_or_else(|e| {
            panic!(
                "{} {:?} does not print with the served descriptor pool (add its typed_config \
                 type to crates/ballast-xds/descriptors/served-types.txt): {e}",
                r.ty(),
                r.name()
            )
        });
        collect_any_types(&v, &mut seen);
    }
    EMITTED_ANY_TYPES.lock().unwrap().extend(seen);
}

/// The typed_config types a rich configuration (every documentation example
/// plus HTTPS, CORS, connection limits, access logs and upstream protocols)
/// emits all print with the served pool; the list below is the floor, so a
/// walk that silently found nothing fails too.
#[test]
fn every_emitted_any_type_is_in_the_served_pool() {
    let set = documentation_examples();
    let mut seen = std::collections::BTreeSet::new();
    for key in set.gateways.keys() {
        let res = translate_gateway(&set, key, &Options::default()).unwrap();
        for r in res.iter() {
            let name = r.ty().type_url().rsplit('/').next().unwrap();
            let v = ballast_xds::json::bytes_to_json(name, &r.value_bytes()).unwrap();
            collect_any_types(&v, &mut seen);
        }
    }
    for expected in [
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "envoy.extensions.filters.http.router.v3.Router",
        "envoy.extensions.filters.http.cors.v3.Cors",
        "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        "envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector",
    ] {
        assert!(
            seen.contains(&format!("type.googleapis.com/{expected}")),
            "{expected} not emitted by the documentation examples: {seen:?}"
        );
    }
    let served = ballast_xds::json::served_pool();
    for url in EMITTED_ANY_TYPES.lock().unwrap().iter().chain(&seen) {
        let name = url.rsplit('/').next().unwrap();
        assert!(
            served.get_message_by_name(name).is_some(),
            "{name} is emitted but not served"
        );
    }
}

/// ClientPolicy `tracing`: the connection manager gets `envoy.tracers.opentelemetry` with the
/// sampling rate, exporting (gRPC by default, or OTLP/HTTP) to the collector Backend's cluster,
/// which the Gateway serves although no route uses it. A missing collector means no tracer
/// (and no cluster); adding it, editing its endpoints and routes, and removing the policy
/// translate incrementally exactly as from scratch.
#[test]
fn tracing_exports_to_the_collector_backend_cluster() {
    use envoy_types::pb::envoy::config::core::v3::grpc_service::TargetSpecifier;
    use envoy_types::pb::envoy::config::core::v3::http_uri::HttpUpstreamType;
    use envoy_types::pb::envoy::config::trace::v3::OpenTelemetryConfig;
    use envoy_types::pb::envoy::config::trace::v3::tracing::http::ConfigType;
    let policy = |body: &str| {
        format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: ClientPolicy\nmetadata: {{ name: p }}\nspec:\n  targetRefs: [{{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }}]\n  tracing:\n{body}"
        )
    };
    let otel = |l: &Listener| {
        let t = hcm(l, 0).tracing.expect("tracing");
        let p = t.provider.unwrap();
        assert_eq!(p.name, "envoy.tracers.opentelemetry");
        let Some(ConfigType::TypedConfig(any)) = p.config_type else {
            panic!("no typed config")
        };
        (
            t.random_sampling.unwrap().value,
            OpenTelemetryConfig::decode(any.value.as_slice()).unwrap(),
        )
    };
    let route = route_yaml("r", "  rules:\n  - backendRefs: [{ name: web }]\n");
    let web = backend_yaml("web", WEB);
    let collector = backend_yaml(
        "otel",
        "  protocol: grpc\n  endpoints: [{ address: 10.0.0.9, port: 4317 }]\n",
    );
    let grpc = policy("    backendRef: { name: otel }\n    samplingRate: 25\n");
    let res = translate(
        &docs(&[GATEWAY_HTTP, &route, &web, &collector, &grpc]),
        "edge",
    );
    assert_eq!(names(&res.clusters), vec!["default/otel", "default/web"]);
    let (rate, cfg) = otel(&decode(&res.listeners[0]));
    assert_eq!(rate, 25.0);
    assert_eq!(cfg.service_name, "edge");
    let Some(TargetSpecifier::EnvoyGrpc(g)) = cfg.grpc_service.unwrap().target_specifier else {
        panic!("no envoy_grpc")
    };
    assert_eq!(g.cluster_name, "default/otel");
    assert_eq!(g.authority, "otel");

    let http = policy(
        "    backendRef: { name: otel }\n    protocol: HTTP\n    samplingRate: 0\n    serviceName: front\n",
    );
    let res = translate(
        &docs(&[GATEWAY_HTTP, &route, &web, &collector, &http]),
        "edge",
    );
    let (rate, cfg) = otel(&decode(&res.listeners[0]));
    assert_eq!(rate, 0.0);
    assert_eq!(cfg.service_name, "front");
    let uri = cfg.http_service.unwrap().http_uri.unwrap();
    assert_eq!(uri.uri, "http://otel/v1/traces");
    assert_eq!(
        uri.http_upstream_type,
        Some(HttpUpstreamType::Cluster("default/otel".into()))
    );

    // No collector: no tracer, no cluster.
    let res = translate(&docs(&[GATEWAY_HTTP, &route, &web, &grpc]), "edge");
    assert!(hcm(&decode(&res.listeners[0]), 0).tracing.is_none());
    assert_eq!(names(&res.clusters), vec!["default/web"]);

    // Incrementally: each step equals a from-scratch translation.
    let mut t = Translator::new(Options::default());
    let mut step = |yaml: String| {
        let set = Arc::new(config(&yaml));
        t.update(&set);
        let res = t.gateway(&gw("edge")).unwrap();
        assert_eq!(
            *res,
            translate_gateway(&set, &gw("edge"), &Options::default()).unwrap()
        );
        res
    };
    let res = step(docs(&[GATEWAY_HTTP, &route, &web, &grpc]));
    assert_eq!(names(&res.clusters), vec!["default/web"]);
    // The collector appears: the Gateway (which depends on it) gets tracer and cluster.
    let res = step(docs(&[GATEWAY_HTTP, &route, &web, &collector, &grpc]));
    assert_eq!(names(&res.clusters), vec!["default/otel", "default/web"]);
    assert!(hcm(&decode(&res.listeners[0]), 0).tracing.is_some());
    // Its endpoints change (a patch), and a route starts and stops using it.
    let moved = backend_yaml(
        "otel",
        "  protocol: grpc\n  endpoints: [{ address: 10.0.0.8, port: 4317 }]\n",
    );
    step(docs(&[GATEWAY_HTTP, &route, &web, &moved, &grpc]));
    let to_otel = route_yaml("r", "  rules:\n  - backendRefs: [{ name: otel }]\n");
    let res = step(docs(&[GATEWAY_HTTP, &to_otel, &web, &moved, &grpc]));
    assert_eq!(names(&res.clusters), vec!["default/otel"]);
    let res = step(docs(&[GATEWAY_HTTP, &route, &web, &moved, &grpc]));
    assert_eq!(names(&res.clusters), vec!["default/otel", "default/web"]);
    // The policy goes: so do tracer and collector cluster.
    let res = step(docs(&[GATEWAY_HTTP, &route, &web, &moved]));
    assert_eq!(names(&res.clusters), vec!["default/web"]);
    assert!(hcm(&decode(&res.listeners[0]), 0).tracing.is_none());
}

/// ClientPolicy `http3`: an HTTPS port gets a UDP (QUIC) listener `{ns}/{gw}/{port}/udp` whose
/// chains mirror the TCP chains with HTTP/3 (same SNI, SDS certificates, routes; ALPN h3; HTTP/3
/// codec), and those TCP chains answer with `alt-svc`. Only chains whose policy has `http3`.
#[test]
fn client_policy_http3_adds_a_quic_listener_and_alt_svc() {
    use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
    use envoy_types::pb::envoy::config::core::v3::socket_address::Protocol;
    use envoy_types::pb::envoy::extensions::filters::http::header_mutation::v3::HeaderMutation;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::CodecType;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpFilterConfig;
    use envoy_types::pb::envoy::extensions::transport_sockets::quic::v3::QuicDownstreamTransport;
    let policy = |section: &str| {
        format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: ClientPolicy\nmetadata: {{ name: h3 }}\nspec:\n  targetRefs: [{{ group: gateway.networking.k8s.io, kind: Gateway, name: edge{section} }}]\n  http3: {{}}\n"
        )
    };
    let base = [
        GATEWAY_HTTPS,
        BACKEND_WEB,
        &secret_yaml("cert-a"),
        &secret_yaml("cert-b"),
    ];
    let alt_svc = |h: &HttpConnectionManager| -> Option<String> {
        let f = h.http_filters.first()?;
        if f.name != "envoy.filters.http.header_mutation" {
            return None;
        }
        let Some(HttpFilterConfig::TypedConfig(any)) = &f.config_type else {
            panic!("no typed config")
        };
        let m = HeaderMutation::decode(any.value.as_slice()).unwrap();
        let r = &m.mutations.unwrap().response_mutations;
        assert_eq!(r.len(), 1);
        let Some(envoy_types::pb::envoy::config::common::mutation_rules::v3::header_mutation::Action::Append(o)) = &r[0].action else {
            panic!("{r:?}")
        };
        let h = o.header.as_ref().unwrap();
        assert_eq!(h.key, "alt-svc");
        Some(h.value.clone())
    };
    // Without the policy: one TCP listener, no alt-svc.
    let res = translate(&docs(&base), "edge");
    assert_eq!(names(&res.listeners), ["default/edge/443"]);
    let tcp: Listener = decode(&res.listeners[0]);
    assert!((0..3).all(|i| alt_svc(&hcm(&tcp, i)).is_none()));

    // Gateway-wide: every served HTTPS chain (`*`, `*.example.com`, `a.example.com`).
    let p = policy("");
    let mut all = base.to_vec();
    all.push(&p);
    let res = translate(&docs(&all), "edge");
    assert_eq!(
        names(&res.listeners),
        ["default/edge/443", "default/edge/443/udp"]
    );
    let tcp: Listener = decode(&res.listeners[0]);
    let udp: Listener = decode(&res.listeners[1]);
    for i in 0..3 {
        assert_eq!(
            alt_svc(&hcm(&tcp, i)).as_deref(),
            Some("h3=\":443\"; ma=86400")
        );
    }
    let Some(AddressKind::SocketAddress(sa)) = udp.address.as_ref().unwrap().address.as_ref()
    else {
        panic!()
    };
    assert_eq!(sa.protocol, Protocol::Udp as i32);
    assert!(
        udp.udp_listener_config
            .as_ref()
            .unwrap()
            .quic_options
            .is_some()
    );
    assert!(udp.listener_filters.is_empty());
    assert_eq!(udp.filter_chains.len(), tcp.filter_chains.len());
    for (i, (q, t)) in udp.filter_chains.iter().zip(&tcp.filter_chains).enumerate() {
        assert_eq!(q.filter_chain_match, t.filter_chain_match);
        assert_eq!(q.filters.len(), 1, "the connection manager only");
        let ts = q.transport_socket.as_ref().unwrap();
        assert_eq!(ts.name, "envoy.transport_sockets.quic");
        let Some(TsConfig::TypedConfig(any)) = &ts.config_type else {
            panic!()
        };
        let quic = QuicDownstreamTransport::decode(any.value.as_slice()).unwrap();
        let ctx = quic
            .downstream_tls_context
            .unwrap()
            .common_tls_context
            .unwrap();
        assert_eq!(ctx.alpn_protocols, ["h3"]);
        let Some(TsConfig::TypedConfig(tany)) = &t.transport_socket.as_ref().unwrap().config_type
        else {
            panic!()
        };
        let tctx = DownstreamTlsContext::decode(tany.value.as_slice())
            .unwrap()
            .common_tls_context
            .unwrap();
        assert_eq!(
            ctx.tls_certificate_sds_secret_configs,
            tctx.tls_certificate_sds_secret_configs
        );
        let (qh, th) = (hcm(&udp, i), hcm(&tcp, i));
        assert_eq!(qh.codec_type, CodecType::Http3 as i32);
        assert!(qh.http3_protocol_options.is_some());
        assert_eq!(alt_svc(&qh), None, "QUIC responses need no alt-svc");
        assert_eq!(qh.route_specifier, th.route_specifier);
        assert_eq!(qh.stat_prefix, th.stat_prefix);
        assert_eq!(qh.http_filters[..], th.http_filters[1..]);
    }
    // Make-before-break sees the QUIC listener's certificates and routes.
    let refs: Vec<String> = res.listeners[1]
        .refs()
        .iter()
        .map(|r| r.name.to_string())
        .collect();
    for want in [
        "default/cert-a",
        "default/cert-b",
        "default/edge/443/a.example.com",
    ] {
        assert!(refs.iter().any(|r| r == want), "{want} in {refs:?}");
    }

    // One listener only: the QUIC listener has that chain, only its TCP chain says alt-svc.
    let p = policy(", sectionName: a");
    let mut one = base.to_vec();
    one.push(&p);
    let res = translate(&docs(&one), "edge");
    let tcp: Listener = decode(&res.listeners[0]);
    let udp: Listener = decode(&res.listeners[1]);
    assert_eq!(udp.filter_chains.len(), 1);
    assert_eq!(
        udp.filter_chains[0]
            .filter_chain_match
            .as_ref()
            .unwrap()
            .server_names,
        ["a.example.com"]
    );
    let with_alt_svc: Vec<String> = tcp
        .filter_chains
        .iter()
        .enumerate()
        .filter(|(i, _)| alt_svc(&hcm(&tcp, *i)).is_some())
        .map(|(_, c)| c.name.clone())
        .collect();
    assert_eq!(with_alt_svc, ["a.example.com"]);

    // A Gateway-wide policy on an HTTP Gateway: no QUIC listener, no alt-svc.
    let http = docs(&[GATEWAY_HTTP, &policy("")]);
    let res = translate(&http, "edge");
    assert_eq!(names(&res.listeners), ["default/edge/10000"]);
    assert_eq!(alt_svc(&hcm(&decode(&res.listeners[0]), 0)), None);
}

/// ClientPolicy `http1` → the connection manager's `http_protocol_options`; the default
/// HTTP/1.0 host is the listener's hostname.
#[test]
fn client_policy_http1_options() {
    let yaml = |listener: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{ name: edge }}\nspec:\n  gatewayClassName: ballast\n  listeners:\n  - {{ name: http, port: 10000, protocol: HTTP{listener} }}\n---\napiVersion: ballast.dev/v1alpha1\nkind: ClientPolicy\nmetadata: {{ name: p }}\nspec:\n  targetRefs: [{{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }}]\n  http1: {{ enableTrailers: true, preserveHeaderCase: true, http10: {{ useDefaultHost: true }} }}\n"
        )
    };
    let l: Listener = decode(&translate(&yaml(", hostname: www.example.com"), "edge").listeners[0]);
    let h1 = hcm(&l, 0).http_protocol_options.unwrap();
    assert!(h1.accept_http_10 && h1.enable_trailers);
    assert_eq!(h1.default_host_for_http_10, "www.example.com");
    let f = h1.header_key_format.unwrap().header_format;
    let Some(envoy_types::pb::envoy::config::core::v3::http1_protocol_options::header_key_format::HeaderFormat::StatefulFormatter(t)) = f else {
        panic!("{f:?}")
    };
    assert_eq!(
        t.name,
        "envoy.http.stateful_header_formatters.preserve_case"
    );
    // No hostname to give: HTTP/1.0 is accepted, requests without Host are refused (400).
    let l: Listener = decode(&translate(&yaml(""), "edge").listeners[0]);
    let h1 = hcm(&l, 0).http_protocol_options.unwrap();
    assert!(h1.accept_http_10);
    assert_eq!(h1.default_host_for_http_10, "");
    let l: Listener = decode(&translate(GATEWAY_HTTP, "edge").listeners[0]);
    assert_eq!(hcm(&l, 0).http_protocol_options, None);
}

/// A route edit re-assembles the whole route configuration (SotW) from its previous bytes and
/// the touched virtual hosts' new encodings, and keeps the previous version's reference list
/// while the set of clusters is the same (`gateway::ChainState::encode_spliced`). At every step
/// — a path edit, hosts added before, between and after the others, one removed, a route
/// moved to a cluster no other route used — bytes and references equal a from-scratch
/// translation.
#[test]
fn route_patches_splice_the_route_configuration_and_share_its_references() {
    let backends: Vec<String> = (0..3)
        .map(|i| {
            backend_yaml(
                &format!("b{i}"),
                &format!(
                    "  endpoints: [{{ address: 127.0.0.1, port: {} }}]\n",
                    8000 + i
                ),
            )
        })
        .collect();
    let route = |name: &str, host: &str, prefix: &str, backend: &str| {
        route_yaml(
            name,
            &format!(
                "  hostnames: [{host}]\n  rules:\n  - matches: [{{ path: {{ type: PathPrefix, value: {prefix} }} }}]\n    backendRefs: [{{ name: {backend} }}]\n"
            ),
        )
    };
    let mut t = Translator::new(Options::default());
    let mut step = |routes: &[String]| {
        let mut parts: Vec<&str> = vec![GATEWAY_HTTP];
        parts.extend(backends.iter().map(String::as_str));
        parts.extend(routes.iter().map(String::as_str));
        let set = Arc::new(config(&docs(&parts)));
        let out = t.update(&set);
        let res = t.gateway(&gw("edge")).unwrap();
        let scratch = translate_gateway(&set, &gw("edge"), &Options::default()).unwrap();
        assert_eq!(*res, scratch);
        let (rc, fresh) = (&res.route_configs[0], &scratch.route_configs[0]);
        assert_eq!(rc.any_bytes(), fresh.any_bytes());
        assert_eq!(rc.refs(), fresh.refs());
        let patched = out.versions[&gw("edge")].patch.is_some();
        (patched, rc.clone())
    };
    let mut routes = vec![
        route("r1", "b.example.com", "/a", "b0"),
        route("r2", "d.example.com", "/a", "b1"),
    ];
    let (_, first) = step(&routes);
    // A path edit: patched, and the same clusters, so the same reference list.
    routes[0] = route("r1", "b.example.com", "/changed", "b0");
    let (patched, rc) = step(&routes);
    assert!(patched, "a route edit is a patch");
    assert_ne!(rc.version(), first.version());
    assert!(
        std::ptr::eq(rc.refs(), first.refs()),
        "the reference list is shared"
    );
    // Hosts added before, between and after the others (same clusters: still shared).
    routes.push(route("r3", "a.example.com", "/", "b0"));
    routes.push(route("r4", "c.example.com", "/", "b1"));
    routes.push(route("r5", "e.example.com", "/", "b0"));
    let (patched, rc2) = step(&routes);
    assert!(patched);
    assert!(std::ptr::eq(rc2.refs(), first.refs()));
    // One host removed, another edited in the same config.
    routes.remove(3);
    routes[1] = route("r2", "d.example.com", "/z", "b1");
    step(&routes);
    // A route moved to a cluster none used: the list changes, then is shared again.
    routes[0] = route("r1", "b.example.com", "/changed", "b2");
    let (patched, rc3) = step(&routes);
    assert!(patched);
    assert_eq!(rc3.refs().len(), 3);
    routes[0] = route("r1", "b.example.com", "/again", "b2");
    let (_, rc4) = step(&routes);
    assert!(std::ptr::eq(rc4.refs(), rc3.refs()));
    // Every route but one gone.
    routes.truncate(1);
    let (_, rc5) = step(&routes);
    assert_eq!(rc5.refs().len(), 1);
}
