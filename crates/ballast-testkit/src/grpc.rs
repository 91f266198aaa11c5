//! Real gRPC traffic for end-to-end tests: a grpcio echo upstream ([`GrpcUpstream`]) and a
//! grpcio client ([`grpc_calls`]), both the Python script `support/grpc_echo.py` run by the
//! project venv's interpreter (`$BALLAST_PYTHON`, else `<workspace>/.venv/bin/python`).
//! The script needs no generated code: it serves and calls methods by name with raw bytes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/support/grpc_echo.py");

/// The Python with grpcio.
pub fn python() -> PathBuf {
    let p = std::env::var_os("BALLAST_PYTHON")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace_root().join(".venv/bin/python"));
    assert!(
        p.is_file(),
        "Python not found at {}: run scripts/test (it creates the project venv with grpcio) \
         or set BALLAST_PYTHON",
        p.display()
    );
    p
}

/// A gRPC server answering every unary method with JSON naming itself, the method and the
/// request metadata it received; killed on drop. It also records every call it receives
/// ([`GrpcUpstream::received`]), so tests can see calls whose answers nobody reads (mirrors).
pub struct GrpcUpstream {
    addr: SocketAddr,
    name: String,
    received: Arc<Mutex<Vec<Value>>>,
    _reader: tokio::task::JoinHandle<()>,
    _child: Child,
}

impl GrpcUpstream {
    pub async fn start(name: &str) -> Result<GrpcUpstream> {
        let mut child = Command::new(python())
            .arg(SCRIPT)
            .args(["serve", name])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("spawning the grpcio upstream")?;
        let stdout = child.stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line())
            .await
            .context("grpcio upstream did not start within 30s")??;
        let Some(port) = line.and_then(|l| l.trim().parse::<u16>().ok()) else {
            bail!("grpcio upstream {name} printed no port");
        };
        // Keep reading: one JSON line per call; ends when the child dies (EOF).
        let received = Arc::new(Mutex::new(Vec::new()));
        let sink = received.clone();
        let reader = tokio::spawn(async move {
            while let Ok(Some(l)) = lines.next_line().await {
                if let Ok(v) = serde_json::from_str::<Value>(&l) {
                    sink.lock().expect("not poisoned").push(v);
                }
            }
        });
        Ok(GrpcUpstream {
            addr: ([127, 0, 0, 1], port).into(),
            name: name.to_owned(),
            received,
            _reader: reader,
            _child: child,
        })
    }

    /// The calls received so far, in order: `{"method": "/pkg.Svc/M", "metadata": {...}}`.
    pub fn received(&self) -> Vec<Value> {
        self.received.lock().expect("not poisoned").clone()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The outcome of one gRPC call.
#[derive(Clone, Debug, PartialEq)]
pub enum GrpcOutcome {
    /// The reply: `backend`, `method`, `metadata` (what the upstream received); response
    /// `headers` and `trailers` as the client saw them.
    Ok(Value),
    /// A gRPC status other than OK (`UNIMPLEMENTED`, `UNAVAILABLE`, ...) and its details.
    Err(String, String),
}

impl GrpcOutcome {
    /// The backend that answered, if the call succeeded.
    pub fn backend(&self) -> Option<&str> {
        match self {
            GrpcOutcome::Ok(v) => v["reply"]["backend"].as_str(),
            GrpcOutcome::Err(..) => None,
        }
    }
}

/// `n` unary calls of `method` (`/pkg.Service/Method`) to `target` over h2c with `:authority`
/// `authority` and request `metadata`, one after another on one channel. Bounded: each call
/// has a 10s deadline.
pub async fn grpc_calls(
    target: SocketAddr,
    authority: &str,
    method: &str,
    n: usize,
    metadata: &[(&str, &str)],
) -> Result<Vec<GrpcOutcome>> {
    calls(None, target, authority, method, n, metadata).await
}

/// [`grpc_calls`] over TLS: SNI and `:authority` are `authority`, the server certificate must
/// verify against the PEM file `ca`, and (grpcio insists) the server must select ALPN `h2`.
pub async fn grpc_calls_tls(
    target: SocketAddr,
    authority: &str,
    method: &str,
    n: usize,
    metadata: &[(&str, &str)],
    ca: &Path,
) -> Result<Vec<GrpcOutcome>> {
    calls(Some(ca), target, authority, method, n, metadata).await
}

async fn calls(
    ca: Option<&Path>,
    target: SocketAddr,
    authority: &str,
    method: &str,
    n: usize,
    metadata: &[(&str, &str)],
) -> Result<Vec<GrpcOutcome>> {
    let mut cmd = Command::new(python());
    cmd.arg(SCRIPT).arg("call");
    if let Some(ca) = ca {
        cmd.arg("--ca").arg(ca);
    }
    let out = cmd
        .args([&target.to_string(), authority, method, &n.to_string()])
        .args(metadata.iter().map(|(k, v)| format!("{k}={v}")))
        .kill_on_drop(true)
        .output()
        .await
        .context("running the grpcio client")?;
    if !out.status.success() {
        bail!(
            "grpcio client failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).context("grpcio client output")?;
            Ok(if v["ok"].as_bool() == Some(true) {
                GrpcOutcome::Ok(v)
            } else {
                GrpcOutcome::Err(
                    v["code"].as_str().unwrap_or_default().to_owned(),
                    v["details"].as_str().unwrap_or_default().to_owned(),
                )
            })
        })
        .collect()
}
