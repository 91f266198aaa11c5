//! sovereign (PyPI `sovereign`, a Python control plane serving REST-JSON xDS)
//! as a peer under the same scenarios: installed into its own venv
//! (`.venv-sovereign` in the workspace, created when missing), configured with
//! a file source holding one instance per cluster and Python templates that
//! render the same resources Ballast serves for the same Gateway API config
//! (EDS clusters `default/bNNNNN` with REST EDS, one listener and one route
//! configuration `default/edge/10000` with one virtual host per route).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::external::External;
use crate::gwconfig::{Edits, GwSpec, LISTEN_PORT, endpoint_address, endpoint_port, route_prefix};
use crate::proc::{self, Proc};

/// The workspace root (where `Cargo.lock` is), for the venvs.
pub fn workspace() -> PathBuf {
    let mut dir = std::env::current_dir().unwrap_or_default();
    loop {
        if dir.join("Cargo.lock").exists() {
            return dir;
        }
        if !dir.pop() {
            return std::env::current_dir().unwrap_or_default();
        }
    }
}

/// `<workspace>/.venv-sovereign/bin/sovereign`, installing it when missing.
pub fn ensure_installed() -> Result<PathBuf> {
    let venv = workspace().join(".venv-sovereign");
    let bin = venv.join("bin/sovereign");
    if bin.exists() {
        return Ok(bin);
    }
    eprintln!("installing sovereign into {}", venv.display());
    let ok = std::process::Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()?
        .success()
        && std::process::Command::new(venv.join("bin/pip"))
            .args(["install", "-q", "sovereign"])
            .status()?
            .success();
    if !ok || !bin.exists() {
        bail!("could not install sovereign into {}", venv.display());
    }
    Ok(bin)
}

const CLUSTERS: &str = r#"
def call(instances, discovery_request, **kwargs):
    for i in instances:
        yield {
            "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            "name": i["name"],
            "type": "EDS",
            "connect_timeout": i["connect_timeout"],
            "eds_cluster_config": {"eds_config": {
                "api_config_source": {"api_type": "REST", "transport_api_version": "V3",
                    "cluster_names": ["xds"], "refresh_delay": i["refresh"]},
                "resource_api_version": "V3"}},
        }
"#;

const ENDPOINTS: &str = r#"
def call(instances, discovery_request, **kwargs):
    wanted = set(discovery_request.resource_names)
    for i in instances:
        if wanted and i["name"] not in wanted:
            continue
        yield {
            "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
            "cluster_name": i["name"],
            "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": e["address"], "port_value": e["port"]}}}}
                for e in i["endpoints"]]}],
        }
"#;

const LISTENERS: &str = r#"
def call(instances, discovery_request, **kwargs):
    refresh = instances[0]["refresh"] if instances else "1s"
    yield {
        "@type": "type.googleapis.com/envoy.config.listener.v3.Listener",
        "name": "default/edge/PORT",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": PORT}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "default_edge_PORT",
                "rds": {"route_config_name": "default/edge/PORT", "config_source": {
                    "api_config_source": {"api_type": "REST", "transport_api_version": "V3",
                        "cluster_names": ["xds"], "refresh_delay": refresh},
                    "resource_api_version": "V3"}},
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
            }}]}],
    }
"#;

const ROUTES: &str = r#"
def call(instances, discovery_request, **kwargs):
    hosts = {}
    for i in instances:
        for r in i["routes"]:
            hosts.setdefault(r["host"], []).append(
                {"match": {"prefix": r["prefix"]}, "route": {"cluster": i["name"]}})
    yield {
        "@type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
        "name": "default/edge/PORT",
        "virtual_hosts": [{"name": h, "domains": [h], "routes": rs} for h, rs in sorted(hosts.items())],
    }
"#;

/// The sovereign side of a [`GwSpec`]: instances (one per cluster, carrying
/// the routes that point at it) and the same edits as [`crate::gwconfig::GwConfig`].
pub struct SovConfig {
    pub spec: GwSpec,
    pub dir: PathBuf,
    edits: Edits,
    refresh: String,
}

impl SovConfig {
    pub fn write(spec: GwSpec, dir: &Path, poll: Duration, refresh_s: u64) -> Result<SovConfig> {
        std::fs::create_dir_all(dir)?;
        let port = LISTEN_PORT.to_string();
        for (name, text) in [
            ("clusters.py", CLUSTERS),
            ("endpoints.py", ENDPOINTS),
            ("listeners.py", LISTENERS),
            ("routes.py", ROUTES),
        ] {
            std::fs::write(dir.join(name), text.replace("PORT", &port))?;
        }
        let d = dir.display();
        let templates: String = ["clusters", "endpoints", "listeners", "routes"]
            .iter()
            .map(|t| {
                format!(
                    "    - type: {t}\n      spec: {{ protocol: python, serialization: raw, path: {d}/{t}.py }}\n"
                )
            })
            .collect();
        std::fs::write(
            dir.join("config.yaml"),
            format!(
                "sources:\n  - type: file\n    scope: default\n    config:\n      path: file+json://{d}/instances.json\nsource_config:\n  refresh_rate: {refresh_s}\nmatching:\n  enabled: false\ntemplates:\n  default:\n{templates}"
            ),
        )?;
        let cfg = SovConfig {
            edits: Edits::new(&spec),
            spec,
            dir: dir.to_path_buf(),
            refresh: format!("{}s", poll.as_secs_f64()),
        };
        cfg.write_instances()?;
        Ok(cfg)
    }

    fn write_instances(&self) -> Result<()> {
        let s = &self.spec;
        let mut routes: Vec<Vec<serde_json::Value>> = vec![Vec::new(); s.clusters];
        for i in 0..s.vhosts {
            for j in 0..s.routes_per_vhost {
                let b = (i * s.routes_per_vhost + j) % s.clusters.max(1);
                let prefix = route_prefix(j, self.edits.route[i]);
                routes[b].push(
                    serde_json::json!({ "host": format!("h{i:05}.example.com"), "prefix": prefix }),
                );
            }
        }
        let instances: Vec<serde_json::Value> = (0..s.clusters)
            .map(|i| {
                let port = endpoint_port(self.edits.backend[i]);
                let eps: Vec<serde_json::Value> = (0..s.endpoints)
                    .map(|j| serde_json::json!({ "address": endpoint_address(i, j), "port": port }))
                    .collect();
                serde_json::json!({
                    "name": format!("default/b{i:05}"),
                    "service_clusters": ["*"],
                    "connect_timeout": format!("{}s", 1.0 + self.edits.timeout[i] as f64 / 1000.0),
                    "refresh": self.refresh,
                    "endpoints": eps,
                    "routes": routes[i],
                })
            })
            .collect();
        let tmp = self.dir.join(".instances.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(&instances)?)?;
        std::fs::rename(tmp, self.dir.join("instances.json"))?;
        Ok(())
    }

    pub fn edit_route(&mut self, i: usize) -> Result<()> {
        self.edits.route(i);
        self.write_instances()
    }
    pub fn edit_backend(&mut self, i: usize) -> Result<()> {
        self.edits.backend(i);
        self.write_instances()
    }
    pub fn edit_timeout(&mut self, i: usize) -> Result<()> {
        self.edits.timeout(i);
        self.write_instances()
    }

    /// Starts sovereign (gunicorn with `workers` uvicorn workers) on a free
    /// port; returns once `/healthcheck` answers and the clusters render.
    pub async fn start(&self, workers: usize, log: &Path) -> Result<External> {
        let bin = ensure_installed()?;
        let addr = proc::free_addr()?;
        let mut cmd = tokio::process::Command::new(bin);
        cmd.env(
            "SOVEREIGN_CONFIG",
            format!("file://{}", self.dir.join("config.yaml").display()),
        )
        .env("SOVEREIGN_HOST", "127.0.0.1")
        .env("SOVEREIGN_PORT", addr.port().to_string())
        .env("SOVEREIGN_WORKERS", workers.to_string())
        .env("SOVEREIGN_ENABLE_ACCESS_LOGS", "false")
        .env("SOVEREIGN_NODE_MATCHING_ENABLED", "false")
        .current_dir(&self.dir);
        let t0 = Instant::now();
        let proc = Proc::spawn("sovereign", cmd, log)?;
        proc::wait_http_ok(addr, "/healthcheck", Duration::from_secs(120))
            .await
            .with_context(|| format!("sovereign did not start; log: {}", log.display()))?;
        Ok(External {
            proc,
            xds: addr,
            admin: None,
            ready_after: t0.elapsed(),
            node_cluster: "bench".into(),
        })
    }
}
