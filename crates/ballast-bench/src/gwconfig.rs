//! A Gateway API config directory for the real `ballast` binary: one Gateway,
//! `vhosts` HTTPRoutes (one hostname each, `routes_per_vhost` rules) and
//! `clusters` Backends, written in files of [`PER_FILE`] objects (an edit
//! rewrites one file, like a config-management tool touching one manifest).
//! Edits are deterministic and numbered, so every edit is a new version.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

/// Objects per YAML file.
pub const PER_FILE: usize = 100;
pub const GATEWAY: &str = "edge";
/// The `node.cluster` a proxy of the gateway sends.
pub const NODE_CLUSTER: &str = "default/edge";
pub const LISTEN_PORT: u16 = 10000;

#[derive(Clone, Debug, Serialize)]
pub struct GwSpec {
    pub vhosts: usize,
    pub routes_per_vhost: usize,
    pub clusters: usize,
    pub endpoints: usize,
}

impl GwSpec {
    /// Resources a proxy of the gateway holds: clusters, load assignments,
    /// one listener and one route configuration (indexed like `ResourceType`).
    pub fn expected_counts(&self) -> [usize; 5] {
        [0, self.clusters, self.clusters, 1, 1]
    }
}

/// The edit counters of a config (this directory, or sovereign's instances):
/// every edit is numbered, so each is a new version, and the same edits give
/// the same config on either server.
#[derive(Clone, Debug)]
pub struct Edits {
    /// Per route: edits so far (its path prefix carries the number).
    pub route: Vec<u64>,
    /// Per backend: edits so far (its endpoint port carries the number).
    pub backend: Vec<u64>,
    /// Per backend: connect-timeout edits (a CDS change).
    pub timeout: Vec<u64>,
}

impl Edits {
    pub fn new(spec: &GwSpec) -> Edits {
        Edits {
            route: vec![0; spec.vhosts],
            backend: vec![0; spec.clusters],
            timeout: vec![0; spec.clusters],
        }
    }
    /// Counts an edit of route `i` (modulo the routes); returns its index.
    pub fn route(&mut self, i: usize) -> usize {
        bump(&mut self.route, i)
    }
    /// Counts an endpoint edit of backend `i` (modulo the backends).
    pub fn backend(&mut self, i: usize) -> usize {
        bump(&mut self.backend, i)
    }
    /// Counts a connect-timeout edit of backend `i` (modulo the backends).
    pub fn timeout(&mut self, i: usize) -> usize {
        bump(&mut self.timeout, i)
    }
}

fn bump(counters: &mut [u64], i: usize) -> usize {
    let i = i % counters.len().max(1);
    counters[i] += 1;
    i
}

/// Address of backend `i`'s endpoint `j`.
pub fn endpoint_address(i: usize, j: usize) -> String {
    format!("10.{}.{}.{}", (i >> 8) & 255, i & 255, j % 250 + 1)
}

/// Endpoint port of a backend after `generation` endpoint edits.
pub fn endpoint_port(generation: u64) -> u64 {
    8000 + generation % 50_000
}

/// Path prefix of rule `j` of a route after `generation` edits (the first
/// rule carries the edit number).
pub fn route_prefix(j: usize, generation: u64) -> String {
    if j == 0 && generation > 0 {
        format!("/p{j}-v{generation}")
    } else {
        format!("/p{j}")
    }
}

/// The Gateway every config of this module attaches to.
pub fn gateway_object() -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{ name: {GATEWAY} }}\nspec:\n  gatewayClassName: ballast\n  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]\n  listeners:\n  - {{ name: http, port: {LISTEN_PORT}, protocol: HTTP }}\n"
    )
}

/// The directory and the edit counters.
pub struct GwConfig {
    pub spec: GwSpec,
    pub dir: PathBuf,
    edits: Edits,
}

fn backend_yaml(out: &mut String, i: usize, endpoints: usize, generation: u64, timeout_gen: u64) {
    out.push_str("---\n");
    backend_object(out, i, endpoints, generation, timeout_gen);
}

/// Backend `i` (`b{i:05}`) as one YAML document: `endpoints` endpoints on
/// [`endpoint_port`]`(generation)`, connect timeout `1000 + timeout_gen` ms.
pub fn backend_object(
    out: &mut String,
    i: usize,
    endpoints: usize,
    generation: u64,
    timeout_gen: u64,
) {
    let _ = write!(
        out,
        "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {{ name: b{i:05} }}\nspec:\n  connectTimeout: {}ms\n  endpoints:\n",
        1000 + timeout_gen
    );
    let port = endpoint_port(generation);
    for j in 0..endpoints {
        let _ = writeln!(
            out,
            "  - {{ address: {}, port: {port} }}",
            endpoint_address(i, j)
        );
    }
}

fn route_yaml(out: &mut String, i: usize, spec: &GwSpec, generation: u64) {
    out.push_str("---\n");
    route_object(out, i, spec, generation);
}

/// HTTPRoute `i` (`r{i:05}`, hostname `h{i:05}.example.com`) as one YAML document.
pub fn route_object(out: &mut String, i: usize, spec: &GwSpec, generation: u64) {
    let _ = write!(
        out,
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: r{i:05} }}\nspec:\n  parentRefs: [{{ name: {GATEWAY} }}]\n  hostnames: [h{i:05}.example.com]\n  rules:\n"
    );
    for j in 0..spec.routes_per_vhost {
        let backend = (i * spec.routes_per_vhost + j) % spec.clusters.max(1);
        let prefix = route_prefix(j, generation);
        let _ = writeln!(
            out,
            "  - matches: [{{ path: {{ type: PathPrefix, value: {prefix} }} }}]\n    backendRefs: [{{ group: ballast.dev, kind: Backend, name: b{backend:05} }}]"
        );
    }
}

impl GwConfig {
    /// Writes the whole config into `dir` (created; existing YAML replaced).
    pub fn write(spec: GwSpec, dir: &Path) -> Result<GwConfig> {
        std::fs::create_dir_all(dir)?;
        let cfg = GwConfig {
            edits: Edits::new(&spec),
            spec,
            dir: dir.to_path_buf(),
        };
        std::fs::write(dir.join("gateway.yaml"), gateway_object())?;
        for f in 0..cfg.spec.clusters.div_ceil(PER_FILE) {
            cfg.write_backends(f)?;
        }
        for f in 0..cfg.spec.vhosts.div_ceil(PER_FILE) {
            cfg.write_routes(f)?;
        }
        Ok(cfg)
    }

    /// Atomically replaces a file (write + rename), as editors and config tools do.
    fn replace(&self, name: &str, text: &str) -> Result<()> {
        let tmp = self.dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, self.dir.join(name))?;
        Ok(())
    }

    fn write_backends(&self, file: usize) -> Result<()> {
        let mut out = String::new();
        let end = ((file + 1) * PER_FILE).min(self.spec.clusters);
        for i in file * PER_FILE..end {
            backend_yaml(
                &mut out,
                i,
                self.spec.endpoints,
                self.edits.backend[i],
                self.edits.timeout[i],
            );
        }
        self.replace(&format!("backends-{file:04}.yaml"), &out)
    }

    fn write_routes(&self, file: usize) -> Result<()> {
        let mut out = String::new();
        let end = ((file + 1) * PER_FILE).min(self.spec.vhosts);
        for i in file * PER_FILE..end {
            route_yaml(&mut out, i, &self.spec, self.edits.route[i]);
        }
        self.replace(&format!("routes-{file:04}.yaml"), &out)
    }

    /// Changes route `i`'s first path prefix (an RDS change).
    pub fn edit_route(&mut self, i: usize) -> Result<()> {
        let i = self.edits.route(i);
        self.write_routes(i / PER_FILE)
    }

    /// Changes backend `i`'s connect timeout (a CDS change).
    pub fn edit_timeout(&mut self, i: usize) -> Result<()> {
        let i = self.edits.timeout(i);
        self.write_backends(i / PER_FILE)
    }

    /// Changes backend `i`'s endpoint port (an EDS change).
    pub fn edit_backend(&mut self, i: usize) -> Result<()> {
        let i = self.edits.backend(i);
        self.write_backends(i / PER_FILE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_edits() {
        let dir = tempfile::tempdir().unwrap();
        let spec = GwSpec {
            vhosts: 150,
            routes_per_vhost: 2,
            clusters: 120,
            endpoints: 2,
        };
        let mut c = GwConfig::write(spec, dir.path()).unwrap();
        let before = std::fs::read_to_string(dir.path().join("routes-0001.yaml")).unwrap();
        assert_eq!(before.matches("kind: HTTPRoute").count(), 50);
        c.edit_route(120).unwrap();
        let after = std::fs::read_to_string(dir.path().join("routes-0001.yaml")).unwrap();
        assert!(after.contains("/p0-v1"), "{after}");
        c.edit_backend(5).unwrap();
        let b = std::fs::read_to_string(dir.path().join("backends-0000.yaml")).unwrap();
        assert!(b.contains("port: 8001"));
    }
}
