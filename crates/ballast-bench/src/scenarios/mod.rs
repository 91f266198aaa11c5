//! Benchmark scenarios (the W-numbers of the benchmark issue). Each builds a
//! workload, starts the server, runs a fleet and returns a [`Report`].
//!
//! The building blocks here — a cold start that waits for every client to
//! match the expected config, and churn that publishes timed changes — are
//! shared by the scenarios and by `--smoke`.

pub mod burst;
pub mod churn;
pub mod cold_start;
pub mod compare_sovereign;
pub mod delta_vs_sotw;
pub mod envoy_lane;
pub mod etcd_churn;
pub mod etcd_lane;
pub mod global_push;
pub mod idle_memory;
pub mod large_cold;
pub mod reconnect;
pub mod rest_poll;
pub mod route_edit;
pub mod scaling;
pub mod smoke;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;

use crate::client::{NackPredicate, Protocol};
use crate::external::{self, ExtCold, ExtFleet, External};
use crate::fleet::{Fleet, FleetConfig, FleetShared, FleetTotals};
use crate::gwconfig::{GwConfig, GwSpec};
use crate::measure::{self, Memory, Percentiles};
use crate::report::Report;
use crate::server::{BenchServer, ServerOptions};
use crate::workload::{Change, Workload, WorkloadSpec};

const MB: f64 = 1024.0 * 1024.0;

/// Fleet parameters common to every scenario.
#[derive(Clone, Serialize)]
pub struct FleetParams {
    pub proxies: usize,
    pub protocol: Protocol,
    pub rest_poll_ms: u64,
    pub connect_concurrency: usize,
    #[serde(skip)]
    pub nack: Option<NackPredicate>,
}

impl FleetParams {
    /// `proxies` clients over `protocol`, all connecting at once, REST polling
    /// every second, accepting everything.
    pub fn new(proxies: usize, protocol: Protocol) -> FleetParams {
        FleetParams {
            proxies,
            protocol,
            rest_poll_ms: 1000,
            connect_concurrency: 0,
            nack: None,
        }
    }
}

/// The report of a scenario on the library server (`args` and the server's
/// mode and threads as parameters).
pub fn library_report(name: &str, args: &impl Serialize, server: &ServerOptions) -> Report {
    Report::new(
        name,
        serde_json::json!({ "args": args, "server_mode": server.mode, "server_threads": server.threads }),
    )
}

/// The report of a scenario on the real `ballast` binary.
pub fn binary_report(name: &str, args: &impl Serialize) -> Report {
    Report::new(
        name,
        serde_json::json!({ "args": args, "server": "ballast binary" }),
    )
}

/// The real `ballast` binary serving a fresh Gateway API config for a spec,
/// in its own directory under `out/work/` (removed by [`BinaryRun::stop`]).
pub struct BinaryRun {
    pub dir: PathBuf,
    pub cfg: GwConfig,
    pub server: External,
}

impl BinaryRun {
    /// Writes the config and starts the binary on it; returns once it is ready.
    pub async fn start(out: &Path, name: &str, spec: &GwSpec) -> Result<BinaryRun> {
        Self::start_with(out, name, spec, &[]).await
    }

    /// [`BinaryRun::start`] with extra `ballast serve` flags.
    pub async fn start_with(
        out: &Path,
        name: &str,
        spec: &GwSpec,
        extra: &[String],
    ) -> Result<BinaryRun> {
        let dir = external::run_dir(out, name)?;
        let cfg = GwConfig::write(spec.clone(), &dir.join("config"))?;
        let server = External::ballast(&cfg.dir, extra, &dir.join("ballast.log")).await?;
        Ok(BinaryRun { dir, cfg, server })
    }

    /// Connects `proxies` clients at once and waits until each holds the
    /// whole config.
    pub async fn cold(
        &self,
        proxies: usize,
        protocol: Protocol,
        rest_poll: Duration,
        timeout: Duration,
    ) -> (ExtFleet, ExtCold) {
        let counts = self.cfg.spec.expected_counts();
        external::cold(&self.server, proxies, protocol, rest_poll, counts, timeout).await
    }

    /// Stops the fleet and the binary, and removes the run's directory.
    pub async fn stop(self, fleet: ExtFleet) {
        fleet.fleet.stop().await;
        self.server.stop().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A cold-started fleet, converged (or not) on the initial config.
pub struct Running {
    pub workload: Workload,
    pub server: BenchServer,
    pub fleet: Fleet,
    pub shared: Arc<FleetShared>,
    pub cold: ColdStats,
}

/// What a cold start measured.
#[derive(Clone, Debug, Serialize)]
pub struct ColdStats {
    pub converged: usize,
    pub all_acked_s: Option<f64>,
    pub per_proxy: Percentiles,
    /// From the start to each client's connection, and to its first response.
    pub connected: Percentiles,
    pub first_response: Percentiles,
    pub server_cpu_s: f64,
    /// CPU-seconds of the bench process minus the server's (the clients).
    pub client_cpu_s: f64,
    pub memory_before: Memory,
    pub memory_after: Memory,
    pub totals: FleetTotals,
    /// First few clients that did not converge, with their first difference.
    pub failures: Vec<String>,
}

impl ColdStats {
    pub fn rss_mb(&self) -> f64 {
        self.memory_after.rss as f64 / MB
    }
    pub fn peak_mb(&self) -> f64 {
        self.memory_after.peak as f64 / MB
    }
}

/// CPU-seconds of this process that are not the in-process server's.
fn own_cpu(server: &BenchServer) -> f64 {
    let own = measure::process_cpu_seconds(std::process::id());
    match server.mode() {
        crate::server::ServerMode::InProcess => own - server.cpu_seconds(),
        crate::server::ServerMode::Child => own,
    }
}

/// Starts the server with `spec`, connects `params.proxies` clients at once
/// and waits until each one's acknowledged view equals the config.
pub async fn cold_start(
    server_opts: &ServerOptions,
    spec: &WorkloadSpec,
    params: &FleetParams,
    timeout: Duration,
) -> Result<Running> {
    let workload = Workload::new(spec.clone());
    let server = BenchServer::start(server_opts, &workload).await?;
    let shared = Arc::new(FleetShared::default());
    shared.set_expected(workload.snapshot().clone());
    let memory_before = server.memory();
    let cpu0 = server.cpu_seconds();
    let own0 = own_cpu(&server);
    let cfg = FleetConfig {
        rest_poll: Duration::from_millis(params.rest_poll_ms),
        connect_concurrency: params.connect_concurrency,
        nack: params.nack.clone(),
        ..FleetConfig::new(server.addr, params.proxies, params.protocol)
    };
    let t0 = Instant::now();
    let fleet = Fleet::spawn(&cfg, shared.clone());
    let all = shared.wait_converged(params.proxies, timeout).await;
    let elapsed = t0.elapsed();
    let server_cpu_s = server.cpu_seconds() - cpu0;
    let client_cpu_s = own_cpu(&server) - own0;
    let memory_after = server.memory();
    let mut times = fleet.us_since(t0, |c| c.converged_at);
    let connected = measure::percentiles_us(&mut fleet.us_since(t0, |c| c.stats.connected_at));
    let first_response =
        measure::percentiles_us(&mut fleet.us_since(t0, |c| c.stats.first_response_at));
    let failures = if all {
        Vec::new()
    } else {
        fleet
            .mismatches(workload.snapshot())
            .into_iter()
            .take(5)
            .map(|(i, d)| format!("client {i}: {d}"))
            .collect()
    };
    let cold = ColdStats {
        converged: shared.converged(),
        all_acked_s: all.then_some(elapsed.as_secs_f64()),
        per_proxy: measure::percentiles_us(&mut times),
        connected,
        first_response,
        server_cpu_s,
        client_cpu_s,
        memory_before,
        memory_after,
        totals: fleet.totals(),
        failures,
    };
    Ok(Running {
        workload,
        server,
        fleet,
        shared,
        cold,
    })
}

/// What a churn phase measured.
#[derive(Clone, Debug, Serialize)]
pub struct ChurnStats {
    pub changes: usize,
    pub duration_s: f64,
    pub convergence: Percentiles,
    /// Samples expected: changes × proxies (each proxy sees every change).
    pub expected_samples: usize,
    pub server_cpu_s: f64,
    pub server_cores: f64,
    pub memory: Memory,
    pub settled: bool,
    pub settle_s: f64,
    pub totals: FleetTotals,
    pub failures: Vec<String>,
}

/// Small deterministic PRNG (xorshift64*): reproducible change sequences.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn diff_totals(after: &FleetTotals, before: &FleetTotals) -> FleetTotals {
    FleetTotals {
        clients: after.clients,
        responses: after.responses - before.responses,
        responses_by_type: std::array::from_fn(|i| {
            after.responses_by_type[i] - before.responses_by_type[i]
        }),
        acks: after.acks - before.acks,
        nacks: after.nacks - before.nacks,
        bytes: after.bytes - before.bytes,
        reconnects: after.reconnects - before.reconnects,
        version_mismatches: after.version_mismatches - before.version_mismatches,
        unmatched_versions: after.unmatched_versions - before.unmatched_versions,
        errors: after.errors.clone(),
    }
}

/// Publishes `rate` endpoint changes per second over random clusters for
/// `duration`, timing each from just before it is published to each proxy's
/// ACK of a version containing it; then waits for every proxy to hold the
/// final config.
pub async fn churn(
    run: &mut Running,
    rate: f64,
    duration: Duration,
    settle_timeout: Duration,
    seed: u64,
) -> Result<ChurnStats> {
    let shared = &run.shared;
    shared.set_check_on_ack(false);
    shared.changes.set_tracking(true);
    let before = run.fleet.totals();
    let cpu0 = run.server.cpu_seconds();
    let clusters = run.workload.spec().clusters.max(1);
    let mut rng = Rng::new(seed);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.001)));
    let start = Instant::now();
    let mut changes = 0usize;
    let mut counter = 0u64;
    while start.elapsed() < duration {
        tick.tick().await;
        counter += 1;
        let change = Change::Endpoints {
            cluster: (rng.next_u64() % clusters as u64) as usize,
            counter,
        };
        let changed = run.workload.apply(change);
        let t0 = Instant::now();
        for (ty, name, version) in &changed {
            shared.changes.record(*ty, name, version, t0);
        }
        run.server.publish(change, &run.workload).await?;
        changes += 1;
    }
    let duration_s = start.elapsed().as_secs_f64();
    run.server.flush().await?;
    let settle_start = Instant::now();
    let expected = run.workload.snapshot().clone();
    shared.set_expected(expected.clone());
    let mismatches = run.fleet.wait_all_match(&expected, settle_timeout).await;
    let settle_s = settle_start.elapsed().as_secs_f64();
    let server_cpu_s = run.server.cpu_seconds() - cpu0;
    let after = run.fleet.totals();
    let mut lat = run.fleet.latencies_us();
    Ok(ChurnStats {
        changes,
        duration_s,
        convergence: measure::percentiles_us(&mut lat),
        expected_samples: changes * run.fleet.clients.len(),
        server_cpu_s,
        server_cores: server_cpu_s / (duration_s + settle_s),
        memory: run.server.memory(),
        settled: mismatches.is_empty(),
        settle_s,
        totals: diff_totals(&after, &before),
        failures: mismatches
            .into_iter()
            .take(5)
            .map(|(i, d)| format!("client {i}: {d}"))
            .collect(),
    })
}

impl Running {
    pub async fn stop(self) {
        self.fleet.stop().await;
        self.server.stop().await;
    }
}
