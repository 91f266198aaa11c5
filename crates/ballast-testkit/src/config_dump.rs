//! What an Envoy holds, extracted from its admin `/config_dump`.
//!
//! End-to-end tests assert on *names* ("the listener is there, cluster A is gone, EDS for B lists these
//! endpoints"), not on the full proto-JSON, which changes shape with every Envoy release. [`ConfigSummary`]
//! pulls exactly those sets out of the dump, tolerating sections that are absent.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::Value;

const LISTENERS: &str = "type.googleapis.com/envoy.admin.v3.ListenersConfigDump";
const CLUSTERS: &str = "type.googleapis.com/envoy.admin.v3.ClustersConfigDump";
const ROUTES: &str = "type.googleapis.com/envoy.admin.v3.RoutesConfigDump";
const ENDPOINTS: &str = "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump";
const SECRETS: &str = "type.googleapis.com/envoy.admin.v3.SecretsConfigDump";

/// Names of the resources an Envoy holds, by kind. "Dynamic" means received over xDS.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ConfigSummary {
    /// Dynamic listeners with an active (serving) state.
    pub listeners: BTreeSet<String>,
    /// Dynamic listeners currently warming (waiting for their RDS/SDS/etc.).
    pub warming_listeners: BTreeSet<String>,
    /// Listeners from the bootstrap.
    pub static_listeners: BTreeSet<String>,
    /// Dynamic active clusters.
    pub clusters: BTreeSet<String>,
    /// Dynamic clusters still warming (e.g. waiting for EDS).
    pub warming_clusters: BTreeSet<String>,
    /// Clusters from the bootstrap (e.g. `xds_cluster`).
    pub static_clusters: BTreeSet<String>,
    /// Dynamic route configurations (RDS).
    pub routes: BTreeSet<String>,
    /// Dynamic active secrets (SDS).
    pub secrets: BTreeSet<String>,
    /// EDS endpoints (`ip:port`) per cluster, from dynamic endpoint configs. Only present when the dump was
    /// taken with `include_eds`.
    pub endpoints: BTreeMap<String, BTreeSet<String>>,
    /// Endpoints (`ip:port`) per bootstrap cluster, likewise only with `include_eds`.
    pub static_endpoints: BTreeMap<String, BTreeSet<String>>,
}

impl ConfigSummary {
    /// Extracts the summary from a `/config_dump` JSON document (missing sections give empty sets).
    pub fn from_dump(dump: &Value) -> ConfigSummary {
        let mut s = ConfigSummary::default();
        let configs = dump["configs"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        for c in configs {
            match c["@type"].as_str().unwrap_or_default() {
                LISTENERS => {
                    names(
                        &mut s.static_listeners,
                        &c["static_listeners"],
                        &["listener"],
                    );
                    for l in items(&c["dynamic_listeners"]) {
                        let Some(name) = l["name"].as_str() else {
                            continue;
                        };
                        if l.get("active_state").is_some() {
                            s.listeners.insert(name.to_owned());
                        }
                        if l.get("warming_state").is_some() {
                            s.warming_listeners.insert(name.to_owned());
                        }
                    }
                }
                CLUSTERS => {
                    names(&mut s.static_clusters, &c["static_clusters"], &["cluster"]);
                    names(&mut s.clusters, &c["dynamic_active_clusters"], &["cluster"]);
                    names(
                        &mut s.warming_clusters,
                        &c["dynamic_warming_clusters"],
                        &["cluster"],
                    );
                }
                ROUTES => {
                    names(
                        &mut s.routes,
                        &c["dynamic_route_configs"],
                        &["route_config"],
                    );
                }
                SECRETS => {
                    names(&mut s.secrets, &c["dynamic_active_secrets"], &[]);
                }
                ENDPOINTS => {
                    endpoints(&mut s.endpoints, &c["dynamic_endpoint_configs"]);
                    endpoints(&mut s.static_endpoints, &c["static_endpoint_configs"]);
                }
                _ => {}
            }
        }
        s
    }
}

/// Collects `ip:port` per cluster from an array of `{endpoint_config: ClusterLoadAssignment}`.
fn endpoints(out: &mut BTreeMap<String, BTreeSet<String>>, configs: &Value) {
    for e in items(configs) {
        let cfg = &e["endpoint_config"];
        let Some(cluster) = cfg["cluster_name"].as_str() else {
            continue;
        };
        let set = out.entry(cluster.to_owned()).or_default();
        for locality in items(&cfg["endpoints"]) {
            for lb in items(&locality["lb_endpoints"]) {
                let sa = &lb["endpoint"]["address"]["socket_address"];
                if let (Some(a), Some(p)) = (sa["address"].as_str(), sa["port_value"].as_u64()) {
                    set.insert(format!("{a}:{p}"));
                }
            }
        }
    }
}

fn items(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// Inserts `item[path...]["name"]` for each item of the array `v`.
fn names(out: &mut BTreeSet<String>, v: &Value, path: &[&str]) {
    for item in items(v) {
        let inner = path.iter().fold(item, |acc, k| &acc[*k]);
        if let Some(n) = inner["name"].as_str() {
            out.insert(n.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn extracts_names_and_endpoints() {
        let dump = json!({"configs": [
            {"@type": CLUSTERS,
             "static_clusters": [{"cluster": {"name": "xds_cluster"}}],
             "dynamic_active_clusters": [{"version_info": "1", "cluster": {"name": "web"}}],
             "dynamic_warming_clusters": [{"cluster": {"name": "cold"}}]},
            {"@type": LISTENERS,
             "dynamic_listeners": [
                {"name": "http", "active_state": {"listener": {"name": "http"}}},
                {"name": "https", "warming_state": {"listener": {"name": "https"}}}]},
            {"@type": ROUTES, "dynamic_route_configs": [{"route_config": {"name": "http-routes"}}]},
            {"@type": SECRETS, "dynamic_active_secrets": [{"name": "tls"}]},
            {"@type": ENDPOINTS, "dynamic_endpoint_configs": [{"endpoint_config": {
                "cluster_name": "web",
                "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 8080}}}},
                    {"endpoint": {"address": {"socket_address": {"address": "127.0.0.2", "port_value": 8081}}}}]}]}}]}
        ]});
        let s = ConfigSummary::from_dump(&dump);
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(s.static_clusters, set(&["xds_cluster"]));
        assert_eq!(s.clusters, set(&["web"]));
        assert_eq!(s.warming_clusters, set(&["cold"]));
        assert_eq!(s.listeners, set(&["http"]));
        assert_eq!(s.warming_listeners, set(&["https"]));
        assert_eq!(s.routes, set(&["http-routes"]));
        assert_eq!(s.secrets, set(&["tls"]));
        assert_eq!(
            s.endpoints["web"],
            set(&["127.0.0.1:8080", "127.0.0.2:8081"])
        );
        assert_eq!(
            ConfigSummary::from_dump(&json!({})),
            ConfigSummary::default()
        );
    }
}
