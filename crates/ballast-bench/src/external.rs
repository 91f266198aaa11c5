//! Servers the bench cannot look inside: the real `ballast` binary (driven by
//! editing files) and sovereign (see [`crate::sovereign`]). Their resource
//! versions are not predictable by the bench, so convergence is observed on
//! the clients: a cold start is done when a proxy holds the expected number of
//! resources of every type; an edit is done when the edited type's version on
//! a proxy differs from what it held before the edit (edits are sequential).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ballast_xds::ResourceType;
use serde::Serialize;

use crate::client::{ClientState, Protocol, TYPES};
use crate::fleet::{Fleet, FleetConfig, FleetShared, FleetTotals};
use crate::measure::{self, Memory, Percentiles};
use crate::proc::{self, Proc};

/// A server process under test, measured from `/proc`.
pub struct External {
    pub proc: Proc,
    /// xDS (gRPC and REST) address.
    pub xds: SocketAddr,
    /// Admin address, if any.
    pub admin: Option<SocketAddr>,
    /// From spawn to ready (`/readyz` or the port answering).
    pub ready_after: Duration,
    /// What proxies send as `node.cluster`.
    pub node_cluster: String,
}

/// The `ballast` binary: `$BALLAST_BIN`, else beside this executable, else
/// `target/release/ballast`.
pub fn ballast_exe() -> PathBuf {
    if let Some(p) = std::env::var_os("BALLAST_BIN") {
        return p.into();
    }
    if let Ok(me) = std::env::current_exe()
        && let Some(dir) = me.parent()
    {
        let p = dir.join("ballast");
        if p.exists() {
            return p;
        }
    }
    PathBuf::from("target/release/ballast")
}

impl External {
    /// `ballast serve --config DIR` on free ports; returns once `/readyz` is 200.
    pub async fn ballast(config: &Path, extra: &[String], log: &Path) -> Result<External> {
        // A port found free can be taken before ballast binds it (tests running
        // beside the bench): a ballast that exits is started again on others.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let xds = proc::free_addr()?;
            let admin = proc::free_addr()?;
            let mut cmd = tokio::process::Command::new(ballast_exe());
            cmd.arg("serve")
                .arg("--config")
                .arg(config)
                .args(["--xds-addr", &xds.to_string()])
                .args(["--admin-addr", &admin.to_string()])
                .args(extra)
                // Its own guard state beside its log: runs never share it.
                .arg("--state-dir")
                .arg(log.with_extension("state"))
                .env("RUST_LOG", "warn");
            let t0 = Instant::now();
            let mut proc = Proc::spawn("ballast", cmd, log)?;
            match proc::wait_ready(&mut proc, admin, "/readyz", Duration::from_secs(300)).await {
                Ok(()) => {
                    return Ok(External {
                        proc,
                        xds,
                        admin: Some(admin),
                        ready_after: t0.elapsed(),
                        node_cluster: crate::gwconfig::NODE_CLUSTER.into(),
                    });
                }
                Err(e) if attempt < 3 && proc.check_alive().is_err() => {
                    eprintln!("ballast exited before ready ({e:#}); starting it again");
                }
                Err(e) => {
                    proc.stop().await;
                    return Err(e).with_context(|| {
                        format!("ballast did not become ready; log: {}", log.display())
                    });
                }
            }
        }
    }

    pub fn cpu_seconds(&self) -> f64 {
        self.proc.cpu_seconds()
    }
    pub fn memory(&self) -> Memory {
        self.proc.memory()
    }
    pub async fn stop(self) {
        self.proc.stop().await;
    }
}

/// A cold start against an external server.
#[derive(Clone, Debug, Serialize)]
pub struct ExtCold {
    pub converged: usize,
    pub all_acked_s: Option<f64>,
    pub per_proxy: Percentiles,
    pub server_cpu_s: f64,
    pub totals: FleetTotals,
}

/// A fleet connected to an external server.
pub struct ExtFleet {
    pub fleet: Fleet,
    pub counts: [usize; 5],
}

fn holds_all(c: &ClientState, counts: &[usize; 5]) -> bool {
    TYPES
        .iter()
        .all(|t| c.stats.acks[t.index()] > 0 && c.view[t.index()].len() == counts[t.index()])
}

/// Connects `proxies` clients at once and waits until each holds `counts`
/// resources per type.
pub async fn cold(
    server: &External,
    proxies: usize,
    protocol: Protocol,
    rest_poll: Duration,
    counts: [usize; 5],
    timeout: Duration,
) -> (ExtFleet, ExtCold) {
    let shared = Arc::new(FleetShared::default());
    let cfg = FleetConfig {
        rest_poll,
        node_cluster: server.node_cluster.clone(),
        ..FleetConfig::new(server.xds, proxies, protocol)
    };
    let cpu0 = server.cpu_seconds();
    let t0 = Instant::now();
    let fleet = Fleet::spawn(&cfg, shared);
    let done = fleet
        .wait_each(timeout, |_, c| {
            holds_all(c, &counts).then(|| c.stats.last_ack_at.unwrap_or_else(Instant::now))
        })
        .await;
    let mut us: Vec<u32> = done
        .iter()
        .flatten()
        .map(|t| t.saturating_duration_since(t0).as_micros() as u32)
        .collect();
    let converged = us.len();
    let all = (converged == proxies).then(|| us.iter().copied().max().unwrap_or(0) as f64 / 1e6);
    let stats = ExtCold {
        converged,
        all_acked_s: all,
        per_proxy: measure::percentiles_us(&mut us),
        server_cpu_s: server.cpu_seconds() - cpu0,
        totals: fleet.totals(),
    };
    (ExtFleet { fleet, counts }, stats)
}

/// Sequential edits of one type, each waited for on every proxy.
#[derive(Clone, Debug, Serialize)]
pub struct ExtEdits {
    pub edits: usize,
    /// Edits every proxy converged on.
    pub converged_edits: usize,
    pub convergence: Percentiles,
    pub server_cpu_s: f64,
    pub cpu_ms_per_edit: f64,
    pub bytes_per_edit_per_proxy: f64,
    pub pushes_per_edit_per_proxy: f64,
    pub peak: Memory,
}

/// Runs `edits` edits (`edit(k)` changes the config so that `ty` changes),
/// waiting after each until every proxy's `ty` version changed, then `pause`.
/// Waits (at most 15 s) until the server spends under 20 ms of CPU in 1.5 s,
/// so work a cold start leaves behind (the first state writes, one second
/// after the load; dropping the load's temporaries) is not charged to the
/// first edits.
pub async fn settle_cpu(server: &External) {
    for _ in 0..10 {
        let c0 = server.cpu_seconds();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        if server.cpu_seconds() - c0 < 0.020 {
            return;
        }
    }
}

pub async fn edits(
    server: &External,
    f: &ExtFleet,
    ty: ResourceType,
    edits: usize,
    pause: Duration,
    timeout: Duration,
    mut edit: impl FnMut(usize) -> Result<()>,
) -> Result<ExtEdits> {
    settle_cpu(server).await;
    let before = f.fleet.totals();
    let cpu0 = server.cpu_seconds();
    let mut samples = Vec::new();
    let mut converged_edits = 0;
    for k in 0..edits {
        let base: Vec<String> = f
            .fleet
            .per_client(|c| c.stats.type_version[ty.index()].clone());
        let t0 = Instant::now();
        edit(k)?;
        let done = f
            .fleet
            .wait_each(timeout, |i, c| {
                (c.stats.type_version[ty.index()] != base[i])
                    .then(|| c.stats.type_changed_at[ty.index()].unwrap_or_else(Instant::now))
            })
            .await;
        if done.iter().all(Option::is_some) {
            converged_edits += 1;
        }
        samples.extend(
            done.iter()
                .flatten()
                .map(|t| t.saturating_duration_since(t0).as_micros() as u32),
        );
        tokio::time::sleep(pause).await;
    }
    let server_cpu_s = server.cpu_seconds() - cpu0;
    let after = f.fleet.totals();
    let n = f.fleet.clients.len().max(1) as f64;
    let e = edits.max(1) as f64;
    Ok(ExtEdits {
        edits,
        converged_edits,
        convergence: measure::percentiles_us(&mut samples),
        server_cpu_s,
        cpu_ms_per_edit: server_cpu_s * 1000.0 / e,
        bytes_per_edit_per_proxy: (after.bytes - before.bytes) as f64 / e / n,
        pushes_per_edit_per_proxy: (after.responses - before.responses) as f64 / e / n,
        peak: server.memory(),
    })
}

/// A fresh directory for one run's config and logs under `out/work/`.
pub fn run_dir(out: &Path, name: &str) -> Result<PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = out.join("work").join(format!("{name}-{secs}"));
    std::fs::create_dir_all(&dir)?;
    Ok(std::path::absolute(dir)?)
}
