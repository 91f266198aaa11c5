//! etcd churn (issue #12): W2 at fleet scale with the config in etcd. A real etcd (one member,
//! or `--members 3`), `ballast serve --etcd`, N simulated proxies (SotW or Delta) on one gateway
//! with B Backends (one HTTPRoute each); then R endpoint changes per second for D seconds, each
//! one etcd put of one Backend with a new endpoint port (an EDS change).
//!
//! The binary's versions are hashes of its own encoding, which the bench cannot predict, so a
//! change is recognised by content: every put gives the Backend's endpoints a port it never had
//! before, the proxies read the highest port of each load assignment they ACK
//! ([`crate::client::content_tag`]), and the change log is keyed by that port. Per change:
//! put → each proxy's ACK of a load assignment carrying it (or a later change of the same
//! Backend), and put → the last proxy's ACK; a change some proxy never got is counted as lost,
//! never dropped from the numbers.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ballast_etcd::{Client, ClientOptions, Op, Txn};
use ballast_testkit::EtcdCluster;
use ballast_xds::ResourceType;
use serde::Serialize;

use super::{MB, Rng};
use crate::client::Protocol;
use crate::external::{self, ExtFleet, External};
use crate::fleet::Undelivered;
use crate::gwconfig::{self, Edits, GwSpec, NODE_CLUSTER};
use crate::measure::{self, Percentiles};
use crate::proc::{self, Proc};
use crate::report::Report;
use crate::row;

#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct EtcdChurnArgs {
    #[arg(long, default_value_t = 1000)]
    pub proxies: usize,
    /// Backends (one EDS cluster and one HTTPRoute each).
    #[arg(long, default_value_t = 1000)]
    pub backends: usize,
    /// Endpoints per Backend.
    #[arg(long, default_value_t = 10)]
    pub endpoints: usize,
    /// Endpoint changes (etcd puts) per second.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    #[arg(long, default_value_t = 60)]
    pub duration_s: u64,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "sotw,delta")]
    pub protocols: Vec<Protocol>,
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// etcd members (1, or 3 for a raft cluster; writes go to every member's URL).
    #[arg(long, default_value_t = 1)]
    pub members: usize,
    #[arg(long, default_value_t = 120)]
    pub timeout_s: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Extra `ballast serve` flag (repeatable), e.g. `--ballast-arg=--debounce-max=200ms`.
    #[arg(long = "ballast-arg", allow_hyphen_values = true)]
    pub ballast_args: Vec<String>,
}

const PREFIX: &str = "/ballast/";
/// Puts in flight at most during the churn.
const MAX_IN_FLIGHT: usize = 64;
/// Objects per etcd transaction while loading (etcd's default limit is 128).
const PER_TXN: usize = 100;

fn backend_key(i: usize) -> String {
    format!("{PREFIX}backends/default/b{i:05}")
}

fn backend_value(i: usize, endpoints: usize, generation: u64) -> String {
    let mut s = String::new();
    gwconfig::backend_object(&mut s, i, endpoints, generation, 0);
    s
}

/// The load assignment (and cluster) name Ballast gives Backend `i`: `<namespace>/<name>`.
fn cla_name(i: usize) -> String {
    format!("default/b{i:05}")
}

/// One run's numbers.
#[derive(Clone, Debug, Serialize)]
pub struct EtcdChurnStats {
    pub changes: usize,
    pub duration_s: f64,
    /// etcd put latency as the bench saw it.
    pub put: Percentiles,
    /// Per proxy and change: put → that proxy's ACK.
    pub per_proxy: Percentiles,
    pub expected_samples: usize,
    /// Per change that every proxy ACKed: put → the last proxy's ACK.
    pub all_proxies: Percentiles,
    pub undelivered: Undelivered,
    pub settle_s: f64,
    pub server_cpu_s: f64,
    pub server_cores: f64,
    pub server_peak_rss_mb: f64,
    pub etcd_cpu_s: f64,
    pub etcd_cores: f64,
    pub etcd_peak_rss_mb: f64,
    pub pushes_per_proxy: f64,
    pub bytes_per_change_per_proxy: f64,
    pub kb_per_proxy: f64,
    pub nacks: u64,
    pub unmatched: u64,
    pub reconnects: u64,
    pub cold_all_acked_s: Option<f64>,
    pub load1_start: f64,
    pub load1_end: f64,
}

/// The 1-minute load average (`/proc/loadavg`), for the record of a run.
pub fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// etcd, the `ballast` binary on it and a converged fleet.
struct Setup {
    etcd: EtcdCluster,
    client: Client,
    server: External,
    fleet: ExtFleet,
    cold_all_acked_s: Option<f64>,
}

async fn setup(
    out: &Path,
    args: &EtcdChurnArgs,
    protocol: Protocol,
    timeout: Duration,
) -> Result<Setup> {
    let dir = external::run_dir(out, "etcd-churn")?;
    let etcd = EtcdCluster::start(args.members.max(1))
        .await
        .context("starting etcd ($BALLAST_ETCD or etcd on PATH)")?;
    let urls = etcd.client_urls();
    let client = Client::new(&urls, ClientOptions::default())?;
    let spec = GwSpec {
        vhosts: args.backends,
        routes_per_vhost: 1,
        clusters: args.backends,
        endpoints: args.endpoints,
    };
    let mut ops = vec![Op::put(
        format!("{PREFIX}gateways/default/{}", gwconfig::GATEWAY),
        gwconfig::gateway_object(),
    )];
    for i in 0..args.backends {
        let mut route = String::new();
        gwconfig::route_object(&mut route, i, &spec, 0);
        ops.push(Op::put(
            format!("{PREFIX}httproutes/default/r{i:05}"),
            route,
        ));
        ops.push(Op::put(backend_key(i), backend_value(i, args.endpoints, 0)));
    }
    while !ops.is_empty() {
        let rest = ops.split_off(ops.len().min(PER_TXN));
        client.txn(Txn::new().and_then(ops)).await?;
        ops = rest;
    }
    let (xds, admin) = (proc::free_addr()?, proc::free_addr()?);
    let mut cmd = tokio::process::Command::new(external::ballast_exe());
    cmd.arg("serve");
    for u in &urls {
        cmd.args(["--etcd", u]);
    }
    cmd.args(["--xds-addr", &xds.to_string()])
        .args(["--admin-addr", &admin.to_string()])
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args(&args.ballast_args)
        .env("RUST_LOG", "warn");
    let t0 = Instant::now();
    let mut proc = Proc::spawn("ballast", cmd, &dir.join("ballast.log"))?;
    if let Err(e) = proc::wait_ready(&mut proc, admin, "/readyz", timeout).await {
        proc.stop().await;
        return Err(e).context(format!(
            "ballast did not become ready; log: {}",
            dir.join("ballast.log").display()
        ));
    }
    let server = External {
        proc,
        xds,
        admin: Some(admin),
        ready_after: t0.elapsed(),
        node_cluster: NODE_CLUSTER.into(),
    };
    let (fleet, cold) = external::cold(
        &server,
        args.proxies,
        protocol,
        Duration::from_millis(200),
        spec.expected_counts(),
        timeout,
    )
    .await;
    let setup = Setup {
        etcd,
        client,
        server,
        fleet,
        cold_all_acked_s: cold.all_acked_s,
    };
    if cold.converged != args.proxies {
        let errors = cold
            .totals
            .errors
            .iter()
            .take(3)
            .cloned()
            .collect::<Vec<_>>();
        setup.stop().await;
        bail!(
            "cold start: {}/{} proxies hold the config ({errors:?})",
            cold.converged,
            args.proxies
        );
    }
    // The change log is keyed by these names: make sure the binary still uses them.
    let cla = ResourceType::ClusterLoadAssignment.index();
    let missing = (0..args.backends)
        .map(cla_name)
        .find(|n| !setup.fleet.fleet.clients[0].lock().view[cla].contains_key(n.as_str()));
    if let Some(n) = missing {
        setup.stop().await;
        bail!("no load assignment named {n:?} on the proxies: has Ballast's naming changed?");
    }
    Ok(setup)
}

impl Setup {
    async fn stop(self) {
        self.fleet.fleet.stop().await;
        self.server.stop().await;
        drop(self.etcd);
    }

    fn etcd_cpu(&self) -> f64 {
        (0..self.etcd.len())
            .filter_map(|i| self.etcd.pid(i))
            .map(measure::process_cpu_seconds)
            .sum()
    }

    fn etcd_peak(&self) -> u64 {
        (0..self.etcd.len())
            .filter_map(|i| self.etcd.pid(i))
            .map(|p| measure::process_memory(&p.to_string()).peak)
            .sum()
    }
}

/// One run: setup, churn through etcd, wait until every proxy has every change (or the
/// timeout), measure, tear down.
pub async fn run_once(
    out: &Path,
    args: &EtcdChurnArgs,
    protocol: Protocol,
    seed: u64,
) -> Result<EtcdChurnStats> {
    let timeout = Duration::from_secs(args.timeout_s);
    let load1_start = load1();
    let s = setup(out, args, protocol, timeout).await?;
    let shared = Arc::clone(&s.fleet.fleet.shared);
    shared.set_check_on_ack(false);
    shared.changes.set_by_tag(true);
    shared.changes.set_tracking(true);
    let before = s.fleet.fleet.totals();
    let cpu0 = s.server.cpu_seconds();
    let etcd0 = s.etcd_cpu();
    let mut edits = Edits::new(&GwSpec {
        vhosts: 0,
        routes_per_vhost: 1,
        clusters: args.backends,
        endpoints: args.endpoints,
    });
    let mut rng = Rng::new(seed);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate.max(0.001)));
    let duration = Duration::from_secs(args.duration_s);
    let mut put_us = Vec::new();
    // Puts run concurrently (up to MAX_IN_FLIGHT), so a slow etcd commit does not lower the
    // offered rate; a Backend with a put in flight is not picked again until it returns, so
    // a Backend's changes reach etcd in the order the change log has them.
    let mut in_flight: tokio::task::JoinSet<(usize, Result<u32>)> = tokio::task::JoinSet::new();
    let mut busy = std::collections::HashSet::new();
    let mut skipped_full = 0u64;
    let start = Instant::now();
    let result: Result<()> = async {
        while start.elapsed() < duration {
            tick.tick().await;
            while let Some(done) = in_flight.try_join_next() {
                let (i, r) = done?;
                busy.remove(&i);
                put_us.push(r?);
            }
            if in_flight.len() >= MAX_IN_FLIGHT || busy.len() >= args.backends {
                skipped_full += 1;
                continue;
            }
            let mut pick = (rng.next_u64() % args.backends.max(1) as u64) as usize;
            while busy.contains(&pick) {
                pick = (pick + 1) % args.backends.max(1);
            }
            let i = edits.backend(pick);
            let generation = edits.backend[i];
            let tag = gwconfig::endpoint_port(generation);
            let value = backend_value(i, args.endpoints, generation);
            let t0 = Instant::now();
            shared
                .changes
                .record_key(ResourceType::ClusterLoadAssignment, &cla_name(i), tag, t0);
            busy.insert(i);
            let client = s.client.clone();
            in_flight.spawn(async move {
                let r = client.put(backend_key(i), value).await;
                (
                    i,
                    r.map(|_| t0.elapsed().as_micros() as u32)
                        .map_err(Into::into),
                )
            });
        }
        while let Some(done) = in_flight.join_next().await {
            put_us.push(done?.1?);
        }
        Ok(())
    }
    .await;
    if skipped_full > 0 {
        eprintln!("etcd-churn: {skipped_full} ticks skipped with {MAX_IN_FLIGHT} puts in flight");
    }
    let duration_s = start.elapsed().as_secs_f64();
    let settle_start = Instant::now();
    let undelivered = s.fleet.fleet.wait_all_delivered(timeout).await;
    let settle_s = settle_start.elapsed().as_secs_f64();
    let server_cpu_s = s.server.cpu_seconds() - cpu0;
    let etcd_cpu_s = s.etcd_cpu() - etcd0;
    let after = s.fleet.fleet.totals();
    let per_change = shared.changes.per_change();
    let changes = per_change.len();
    let proxies = args.proxies;
    let mut all: Vec<u32> = per_change
        .iter()
        .filter(|(n, _)| *n as usize == proxies)
        .map(|(_, us)| *us)
        .collect();
    let mut lat = s.fleet.fleet.latencies_us();
    let n = proxies.max(1) as f64;
    let elapsed = duration_s + settle_s;
    let stats = EtcdChurnStats {
        changes,
        duration_s,
        put: measure::percentiles_us(&mut put_us),
        per_proxy: measure::percentiles_us(&mut lat),
        expected_samples: changes * proxies,
        all_proxies: measure::percentiles_us(&mut all),
        undelivered,
        settle_s,
        server_cpu_s,
        server_cores: server_cpu_s / elapsed,
        server_peak_rss_mb: s.server.memory().peak as f64 / MB,
        etcd_cpu_s,
        etcd_cores: etcd_cpu_s / elapsed,
        etcd_peak_rss_mb: s.etcd_peak() as f64 / MB,
        pushes_per_proxy: (after.responses - before.responses) as f64 / n,
        bytes_per_change_per_proxy: (after.bytes - before.bytes) as f64 / changes.max(1) as f64 / n,
        kb_per_proxy: (after.bytes - before.bytes) as f64 / n / 1024.0,
        nacks: after.nacks - before.nacks,
        unmatched: after.unmatched_versions - before.unmatched_versions,
        reconnects: after.reconnects - before.reconnects,
        cold_all_acked_s: s.cold_all_acked_s,
        load1_start,
        load1_end: load1(),
    };
    s.stop().await;
    result.context("etcd put during the churn")?;
    Ok(stats)
}

/// Checks a run must pass whatever the timing: every change reached every proxy, nothing
/// rejected, every ACKed load assignment carries a change the bench made.
pub fn correctness_failures(s: &EtcdChurnStats) -> Vec<String> {
    let mut f = Vec::new();
    if s.changes == 0 {
        f.push("no change was made".into());
    }
    if s.undelivered.lost_changes > 0 {
        f.push(format!(
            "{} of {} changes never reached every proxy ({} deliveries missing): {:?}",
            s.undelivered.lost_changes,
            s.changes,
            s.undelivered.missing_deliveries,
            s.undelivered.examples
        ));
    }
    if s.per_proxy.count != s.expected_samples {
        f.push(format!(
            "{} (proxy, change) samples, expected {}",
            s.per_proxy.count, s.expected_samples
        ));
    }
    if s.nacks > 0 || s.unmatched > 0 {
        f.push(format!(
            "{} NACKs, {} load assignments matching no change",
            s.nacks, s.unmatched
        ));
    }
    f
}

pub async fn run(out: &Path, args: &EtcdChurnArgs) -> Result<Report> {
    let mut report = Report::new(
        "etcd-churn",
        serde_json::json!({ "args": args, "server": "ballast binary, --etcd" }),
    );
    for &protocol in &args.protocols {
        if protocol == Protocol::Rest {
            bail!("etcd-churn runs SotW and Delta streams only");
        }
        for run in 0..args.runs.max(1) {
            let c = match run_once(out, args, protocol, args.seed + run as u64).await {
                Ok(c) => c,
                Err(e) => {
                    report
                        .notes
                        .push(format!("{protocol} run {}: failed: {e:#}", run + 1));
                    eprintln!("etcd-churn {protocol} run {}: failed: {e:#}", run + 1);
                    continue;
                }
            };
            report.rows.push(row!(
                "protocol" => protocol.to_string(),
                "run" => run + 1,
                "proxies" => args.proxies,
                "backends" => args.backends,
                "members" => args.members,
                "changes" => c.changes,
                "rate_per_s" => c.changes as f64 / c.duration_s,
                "put_p50_ms" => c.put.p50_ms,
                "put_p99_ms" => c.put.p99_ms,
                "p50_ms" => c.per_proxy.p50_ms,
                "p99_ms" => c.per_proxy.p99_ms,
                "max_ms" => c.per_proxy.max_ms,
                "all_p50_ms" => c.all_proxies.p50_ms,
                "all_p99_ms" => c.all_proxies.p99_ms,
                "all_max_ms" => c.all_proxies.max_ms,
                "lost_changes" => c.undelivered.lost_changes,
                "missing_deliveries" => c.undelivered.missing_deliveries,
                "settle_s" => c.settle_s,
                "server_cores" => c.server_cores,
                "cpu_ms_per_change" => c.server_cpu_s * 1000.0 / c.changes.max(1) as f64,
                "server_peak_rss_mb" => c.server_peak_rss_mb,
                "etcd_cores" => c.etcd_cores,
                "etcd_peak_rss_mb" => c.etcd_peak_rss_mb,
                "pushes_per_proxy" => c.pushes_per_proxy,
                "bytes_per_change_per_proxy" => c.bytes_per_change_per_proxy,
                "nacks" => c.nacks,
                "load1" => format!("{:.2}→{:.2}", c.load1_start, c.load1_end),
            ));
            for f in correctness_failures(&c) {
                report
                    .notes
                    .push(format!("{protocol} run {}: {f}", run + 1));
            }
            eprintln!(
                "etcd-churn {protocol} run {}: {} changes ({:.1}/s), per proxy p50 {:.1} p99 {:.1} max {:.1} ms, all proxies p50 {:.1} p99 {:.1} ms, lost {}, server {:.3} cores, etcd {:.3} cores, load {:.2}→{:.2}",
                run + 1,
                c.changes,
                c.changes as f64 / c.duration_s,
                c.per_proxy.p50_ms,
                c.per_proxy.p99_ms,
                c.per_proxy.max_ms,
                c.all_proxies.p50_ms,
                c.all_proxies.p99_ms,
                c.undelivered.lost_changes,
                c.server_cores,
                c.etcd_cores,
                c.load1_start,
                c.load1_end,
            );
        }
    }
    report.notes.push(
        "per proxy: put → that proxy's ACK of a load assignment with the change (or a later one of the same Backend); all_*: per change, put → the last proxy's ACK, over the changes every proxy got; lost_changes: changes some proxy never ACKed within --timeout-s after the churn".into(),
    );
    report.notes.push(
        "the etcd source is not debounced (--debounce-* apply to files): each watch batch is one new config; cores = CPU-s / (churn + settle time); etcd CPU and RSS summed over its members".into(),
    );
    Ok(report)
}
