//! Unit tests of each translation feature against expected Envoy messages.

use std::sync::Arc;

use ballast_model::{ConfigSet, ObjectKey};
use ballast_xds::{Resource, Snapshot};
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
    let _: Option<(EnvoySecret, Snapshot)> = None;
    let _ = find;
}
