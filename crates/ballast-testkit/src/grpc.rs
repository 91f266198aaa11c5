//! Real gRPC traffic for end-to-end tests: a grpcio echo upstream ([`GrpcUpstream`]) and a
//! grpcio client ([`grpc_calls`]), both the Python script `support/grpc_echo.py` run by the
//! project venv's interpreter (`$BALLAST_PYTHON`, else `<workspace>/.venv/bin/python`).
//! The script needs no generated code: it serves and calls methods by name with raw bytes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;

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
/// request metadata it received; killed on drop.
pub struct GrpcUpstream {
    addr: SocketAddr,
    name: String,
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
        Ok(GrpcUpstream {
            addr: ([127, 0, 0, 1], port).into(),
            name: name.to_owned(),
            _child: child,
        })
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
    let out = Command::new(python())
        .arg(SCRIPT)
        .args([
            "call",
            &target.to_string(),
            authority,
            method,
            &n.to_string(),
        ])
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
