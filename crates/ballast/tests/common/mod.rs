//! Shared helpers for `ballast` end-to-end tests: the real binary as a child
//! process, generated configs, real Envoy and traffic from ballast-testkit.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

pub const T: Duration = Duration::from_secs(90);
pub const POLL: Duration = Duration::from_millis(50);

/// A running `ballast serve` process; killed (SIGKILL) on drop.
pub struct Ballast {
    child: Child,
    pub xds: SocketAddr,
    pub admin: SocketAddr,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Ballast {
    /// Starts `ballast serve` with fixed ports (so a restart reuses them).
    /// Unless `args` name a `--state-dir`, each process gets its own empty
    /// one: runs never share the guard's state.
    pub fn start(xds: SocketAddr, admin: SocketAddr, args: &[&str]) -> Result<Ballast> {
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("ballast.log");
        let own_state = dir.path().join("state");
        let state: Vec<&std::ffi::OsStr> = if args.contains(&"--state-dir") {
            vec![]
        } else {
            vec!["--state-dir".as_ref(), own_state.as_os_str()]
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_ballast"))
            .arg("serve")
            .arg("--xds-addr")
            .arg(xds.to_string())
            .arg("--admin-addr")
            .arg(admin.to_string())
            .args(args)
            .args(state)
            .env(
                "RUST_LOG",
                std::env::var("BALLAST_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("spawning ballast")?;
        // Wait for both "listening" lines (bounded by the child's lifetime).
        let stdout = child.stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout).lines();
        let mut seen = 0;
        while seen < 2 {
            match lines.next() {
                Some(Ok(l)) if l.contains("listening on") => seen += 1,
                Some(Ok(_)) => {}
                _ => bail!(
                    "ballast exited early: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                ),
            }
        }
        std::thread::spawn(move || for _ in lines {});
        Ok(Ballast {
            child,
            xds,
            admin,
            log,
            _dir: dir,
        })
    }

    /// `ballast serve --config DIR` on free ports, once ready (what most
    /// end-to-end tests start from).
    pub async fn serve_ready(config: &Path) -> Ballast {
        let ballast = Ballast::start(
            free_addr(),
            free_addr(),
            &["--config", config.to_str().expect("a UTF-8 path")],
        )
        .expect("start ballast serve");
        ballast
            .wait_ready()
            .await
            .unwrap_or_else(|e| panic!("{e}: {}", ballast.log_tail()));
        ballast
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, as an orchestrator stopping the process would.
    pub fn terminate(&self) {
        signal(self.child.id(), "TERM");
    }

    /// The exit status, waiting at most `bound` (None: still running).
    pub fn wait_exit(&mut self, bound: Duration) -> Option<std::process::ExitStatus> {
        wait_exit(&mut self.child, bound)
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    pub async fn get(&self, path: &str) -> Result<(u16, String)> {
        ballast_testkit::http_get(self.admin, path).await
    }

    pub async fn wait_ready(&self) -> Result<()> {
        ballast_testkit::wait_until(T, POLL, || async {
            matches!(self.get("/readyz").await, Ok((200, _)))
        })
        .await
        .with_context(|| format!("ballast ready; log:\n{}", self.log_tail()))
    }

    /// A metric's value (sum over label sets) from /metrics.
    pub async fn metric(&self, name: &str) -> Result<f64> {
        let (_, body) = self.get("/metrics").await?;
        Ok(body
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }
}

impl Drop for Ballast {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- ballast log tail ---\n{}", self.log_tail());
        }
        self.kill();
    }
}

/// Sends `SIG<name>` to `pid` with the system's `kill`.
pub fn signal(pid: u32, name: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill -{name} {pid}");
}

/// Polls `child` until it exits or `bound` passes (None: still running).
pub fn wait_exit(child: &mut Child, bound: Duration) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + bound;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// Envoy `node` for `gateway` (`namespace/name`), fetching from `ballast` over gRPC ADS.
pub async fn ads_envoy(ballast: &Ballast, node: &str, gateway: &str) -> ballast_testkit::Envoy {
    use ballast_testkit::{AdsMode, Envoy, EnvoyConfig};
    Envoy::start(&EnvoyConfig::new(ballast.xds, node, gateway, AdsMode::Grpc))
        .await
        .unwrap_or_else(|e| panic!("envoy {node}: {e:#}"))
}

/// Waits (bounded by [`T`]) until GET / with `Host: host` through `addr` answers 200 with
/// `body` (a testkit upstream answers with its name): the config under test reached Envoy.
pub async fn wait_host_body(addr: SocketAddr, host: &str, body: &str) -> Result<()> {
    ballast_testkit::wait_until(T, POLL, || async {
        matches!(host_get(addr, host).await, Ok((200, b)) if b == body)
    })
    .await
    .with_context(|| format!("{host} never answered 200 {body:?}"))
}

pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

pub fn free_addr() -> SocketAddr {
    loopback(ballast_testkit::free_port())
}

/// A gateway `default/edge` on 127.0.0.1:`port` (HTTP), and `n` HTTPRoutes with
/// distinct hostnames `h{i}.example.com`, each to its own Backend `b{i}` whose
/// endpoint is one of `upstreams` (round-robin).
pub fn many_routes(port: u16, n: usize, upstreams: &[SocketAddr]) -> String {
    let mut s = gateway(port);
    for i in 0..n {
        s.push_str(&route(
            &format!("r{i}"),
            &format!("h{i}.example.com"),
            &format!("b{i}"),
        ));
        s.push_str(&backend(
            &format!("b{i}"),
            &[upstreams[i % upstreams.len()]],
        ));
    }
    s
}

pub fn gateway(port: u16) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - {{ name: http, port: {port}, protocol: HTTP }}
"
    )
}

pub fn route(name: &str, host: &str, backend: &str) -> String {
    format!(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name} }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [{host}]
  rules:
  - backendRefs: [{{ group: ballast.dev, kind: Backend, name: {backend} }}]
"
    )
}

pub fn backend(name: &str, endpoints: &[SocketAddr]) -> String {
    let eps: Vec<String> = endpoints
        .iter()
        .map(|a| format!("  - {{ address: {}, port: {} }}\n", a.ip(), a.port()))
        .collect();
    format!(
        "---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: {name} }}
spec:
  connectTimeout: 1s
  endpoints:
{}",
        eps.concat()
    )
}

/// Writes `text` to `path` atomically (write + rename), as editors and
/// config-management tools do.
pub fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// GET / through `addr` with a Host header, on a fresh connection: (status, body).
pub async fn host_get(addr: SocketAddr, host: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await??;
    let text = String::from_utf8_lossy(&out).to_string();
    let code = text.get(9..12).unwrap_or("0").parse()?;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Ok((code, body))
}

/// GET / through `addr` with a Host header and `extra` request headers, on a fresh
/// connection: (status, response headers with lowercase names, body).
pub async fn host_get_with_headers(
    addr: SocketAddr,
    host: &str,
    extra: &[(&str, &str)],
) -> Result<(u16, Vec<(String, String)>, String)> {
    let lines: Vec<String> = extra.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    host_request(addr, "GET", host, &lines).await
}

/// The status of [`host_get`].
pub async fn host_status(addr: SocketAddr, host: &str) -> Result<u16> {
    Ok(host_get(addr, host).await?.0)
}

/// Sends `method /` with a Host and extra header lines (each `Name: value`) on a fresh
/// connection: (status, lower-cased response headers, body).
pub async fn host_request(
    addr: SocketAddr,
    method: &str,
    host: &str,
    headers: &[&str],
) -> Result<(u16, Vec<(String, String)>, String)> {
    host_path_request(addr, method, host, "/", headers).await
}

/// Like [`host_request`], for any request `path` (e.g. `/v2/items?x=1`).
pub async fn host_path_request(
    addr: SocketAddr,
    method: &str,
    host: &str,
    path: &str,
    headers: &[&str],
) -> Result<(u16, Vec<(String, String)>, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    s.write_all(
        format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await??;
    let text = String::from_utf8_lossy(&out).to_string();
    let code = text.get(9..12).unwrap_or("0").parse()?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Ok((code, headers, body.to_owned()))
}

/// Every virtual host in an Envoy config dump, by its first domain.
pub fn dump_virtual_hosts(
    dump: &serde_json::Value,
) -> std::collections::BTreeMap<String, serde_json::Value> {
    fn walk(
        v: &serde_json::Value,
        out: &mut std::collections::BTreeMap<String, serde_json::Value>,
    ) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(d) = m.get("domains").and_then(|d| d[0].as_str()) {
                    out.insert(d.to_owned(), v.clone());
                }
                m.values().for_each(|c| walk(c, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|c| walk(c, out)),
            _ => {}
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(dump, &mut out);
    out
}

/// The section of an Envoy config dump whose `@type` is `envoy.admin.v3.{message}` (e.g.
/// `ClustersConfigDump`), as its JSON text: equal text means Envoy holds the same resources,
/// versions and update times.
pub fn dump_section(dump: &serde_json::Value, message: &str) -> String {
    dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["@type"].as_str().and_then(|t| t.rsplit('.').next()) == Some(message))
        .map(|c| c.to_string())
        .unwrap_or_default()
}

/// A self-signed certificate for `host` made with rcgen (CN and subjectAltName); writes the
/// certificate to `dir/{host}.crt` (a CA file for clients) and returns (cert PEM, key PEM).
pub fn rcgen_cert(dir: &Path, host: &str) -> (String, String) {
    let mut params = rcgen::CertificateParams::new(vec![host.to_string()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, host);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    std::fs::write(dir.join(format!("{host}.crt")), cert.pem()).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A `kubernetes.io/tls` Secret document holding `crt` and `key` (PEM) as `stringData`.
pub fn tls_secret(name: &str, crt: &str, key: &str) -> String {
    let indent = |pem: &str| -> String { pem.lines().map(|l| format!("    {l}\n")).collect() };
    format!(
        "---
apiVersion: v1
kind: Secret
metadata: {{ name: {name} }}
type: kubernetes.io/tls
stringData:
  tls.crt: |
{}  tls.key: |
{}",
        indent(crt),
        indent(key)
    )
}
