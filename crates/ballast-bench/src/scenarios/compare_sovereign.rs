//! Ballast (the binary) and sovereign side by side over REST polling, with
//! the same clusters, listener and routes: cold start of P polling proxies,
//! then sequential edits (a route edit: RDS; a backend endpoint edit: EDS),
//! each timed from the file write to every proxy holding the new version.
//! Ratios ballast / sovereign for CPU-seconds, peak RSS and convergence.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use ballast_xds::ResourceType;
use serde::Serialize;

use super::MB;
use crate::client::Protocol;
use crate::external::{self, External};
use crate::gwconfig::{GwConfig, GwSpec};
use crate::report::{Report, column_median};
use crate::row;
use crate::sovereign::SovConfig;

#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct CompareSovereignArgs {
    #[arg(long, default_value_t = 10)]
    pub proxies: usize,
    #[arg(long, default_value_t = 100)]
    pub clusters: usize,
    #[arg(long, default_value_t = 2)]
    pub endpoints: usize,
    #[arg(long, default_value_t = 5)]
    pub edits: usize,
    /// REST polling interval of every proxy (Envoy's refresh_delay).
    #[arg(long, default_value_t = 200)]
    pub poll_ms: u64,
    /// sovereign's source refresh rate (seconds; its minimum is 1).
    #[arg(long, default_value_t = 1)]
    pub sovereign_refresh_s: u64,
    /// sovereign's gunicorn workers.
    #[arg(long, default_value_t = 1)]
    pub sovereign_workers: usize,
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    #[arg(long, default_value_t = 120)]
    pub timeout_s: u64,
}

/// Either server's config, with the same edits.
pub enum Cfg {
    Ballast(GwConfig),
    Sovereign(SovConfig),
}

impl Cfg {
    pub fn edit(&mut self, ty: ResourceType, i: usize) -> Result<()> {
        match (self, ty) {
            (Cfg::Ballast(c), ResourceType::RouteConfiguration) => c.edit_route(i),
            (Cfg::Ballast(c), ResourceType::Cluster) => c.edit_timeout(i),
            (Cfg::Ballast(c), _) => c.edit_backend(i),
            (Cfg::Sovereign(c), ResourceType::RouteConfiguration) => c.edit_route(i),
            (Cfg::Sovereign(c), ResourceType::Cluster) => c.edit_timeout(i),
            (Cfg::Sovereign(c), _) => c.edit_backend(i),
        }
    }
}

/// Starts `server` ("ballast" or "sovereign") on a config for `spec` in `dir`.
pub async fn start(
    server: &str,
    spec: &GwSpec,
    dir: &Path,
    poll: Duration,
    refresh_s: u64,
    workers: usize,
) -> Result<(Cfg, External)> {
    Ok(if server == "ballast" {
        let c = GwConfig::write(spec.clone(), &dir.join("config"))?;
        let s = External::ballast(&c.dir, &[], &dir.join("server.log")).await?;
        (Cfg::Ballast(c), s)
    } else {
        let c = SovConfig::write(spec.clone(), &dir.join("config"), poll, refresh_s)?;
        let s = c.start(workers, &dir.join("server.log")).await?;
        (Cfg::Sovereign(c), s)
    })
}

pub async fn run(out: &Path, args: &CompareSovereignArgs) -> Result<Report> {
    let mut report = Report::new("compare-sovereign", serde_json::json!({ "args": args }));
    let spec = GwSpec {
        vhosts: args.clusters,
        routes_per_vhost: 1,
        clusters: args.clusters,
        endpoints: args.endpoints,
    };
    let poll = Duration::from_millis(args.poll_ms);
    let timeout = Duration::from_secs(args.timeout_s);
    let mut rows = Report::new("compare-sovereign-runs", serde_json::json!({}));
    for run in 0..args.runs.max(1) {
        for server in ["ballast", "sovereign"] {
            let dir = external::run_dir(out, &format!("sov-{server}"))?;
            let (mut cfg, s) = match start(
                server,
                &spec,
                &dir,
                poll,
                args.sovereign_refresh_s,
                args.sovereign_workers,
            )
            .await
            {
                Ok(x) => x,
                Err(e) => {
                    report
                        .notes
                        .push(format!("{server} run {}: {e:#}", run + 1));
                    continue;
                }
            };
            let cpu0 = s.cpu_seconds();
            let (f, cold) = external::cold(
                &s,
                args.proxies,
                Protocol::Rest,
                poll,
                spec.expected_counts(),
                timeout,
            )
            .await;
            let mut edit_stats = Vec::new();
            for ty in [
                ResourceType::RouteConfiguration,
                ResourceType::ClusterLoadAssignment,
            ] {
                let e = external::edits(
                    &s,
                    &f,
                    ty,
                    args.edits,
                    Duration::from_millis(200),
                    timeout,
                    |k| cfg.edit(ty, k * 7 + 1),
                )
                .await?;
                edit_stats.push(e);
            }
            let cpu = s.cpu_seconds() - cpu0;
            let mem = s.memory();
            let t = f.fleet.totals();
            rows.rows.push(row!(
                "server" => server,
                "run" => run + 1,
                "startup_s" => s.ready_after.as_secs_f64(),
                "cold_all_acked_s" => cold.all_acked_s,
                "cold_cpu_s" => cold.server_cpu_s,
                "rds_edit_p50_ms" => edit_stats[0].convergence.p50_ms,
                "rds_edit_p99_ms" => edit_stats[0].convergence.p99_ms,
                "eds_edit_p50_ms" => edit_stats[1].convergence.p50_ms,
                "eds_edit_p99_ms" => edit_stats[1].convergence.p99_ms,
                "converged_edits" => format!("{}/{}", edit_stats[0].converged_edits + edit_stats[1].converged_edits, 2 * args.edits),
                "total_cpu_s" => cpu,
                "peak_rss_mb" => mem.peak as f64 / MB,
                "rss_mb" => mem.rss as f64 / MB,
                "kb_per_proxy" => t.bytes as f64 / args.proxies.max(1) as f64 / 1024.0,
                "errors" => t.errors.len(),
            ));
            eprintln!(
                "compare {server} run {}: cold {:?} s, RDS edit p50 {:.0} ms, EDS edit p50 {:.0} ms, {cpu:.2} CPU-s, peak {:.1} MB",
                run + 1,
                cold.all_acked_s,
                edit_stats[0].convergence.p50_ms,
                edit_stats[1].convergence.p50_ms,
                mem.peak as f64 / MB
            );
            if cold.all_acked_s.is_none() {
                report.notes.push(format!(
                    "{server} run {}: only {}/{} proxies loaded the config: {:?}",
                    run + 1,
                    cold.converged,
                    args.proxies,
                    t.errors.first()
                ));
            }
            f.fleet.stop().await;
            s.stop().await;
        }
    }
    let cols = [
        "cold_all_acked_s",
        "cold_cpu_s",
        "rds_edit_p50_ms",
        "rds_edit_p99_ms",
        "eds_edit_p50_ms",
        "eds_edit_p99_ms",
        "total_cpu_s",
        "peak_rss_mb",
    ];
    for col in cols {
        let b = column_median(&rows, "server", "ballast", col);
        let s = column_median(&rows, "server", "sovereign", col);
        report.rows.push(row!("measure" => col, "ballast" => b, "sovereign" => s, "ballast_over_sovereign" => b / s));
    }
    println!("{}", rows.markdown());
    report.notes.push(format!(
        "REST polling every {} ms for both; sovereign re-reads its file source every {} s (its minimum), Ballast watches files and debounces 100 ms; medians of {} runs; sovereign CPU/RSS summed over its gunicorn master and {} worker(s)",
        args.poll_ms, args.sovereign_refresh_s, args.runs, args.sovereign_workers
    ));
    report.notes.push("sovereign cannot do: gRPC (SotW/Delta ADS) — W1/W2/W5/W6/W7/W8 stream scenarios are ballast-only; no push (every change waits for the next poll)".into());
    Ok(report)
}
