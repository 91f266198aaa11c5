//! W6 global full push: every cluster changes at once (a full CDS push of a
//! ~84 KB config to every proxy), R repetitions; server CPU per push and time
//! until every proxy ACKed each push.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;

use super::{FleetParams, MB, cold_start, library_report};
use crate::client::Protocol;
use crate::measure;
use crate::report::Report;
use crate::row;
use crate::server::ServerOptions;
use crate::workload::{Change, WorkloadSpec};
use ballast_xds::ResourceType;

#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct GlobalPushArgs {
    /// Proxies (the 1,000 is heavy for the client side on 2 cores).
    #[arg(long, default_value_t = 300)]
    pub proxies: usize,
    /// Clusters; 1,000 EDS clusters encode to ~84 KB of CDS.
    #[arg(long, default_value_t = 1000)]
    pub clusters: usize,
    #[arg(long, default_value_t = 1)]
    pub endpoints: usize,
    #[arg(long, default_value_t = 20)]
    pub repetitions: usize,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "sotw,delta")]
    pub protocols: Vec<Protocol>,
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    #[arg(long, default_value_t = 300)]
    pub timeout_s: u64,
}

pub async fn run(server: &ServerOptions, args: &GlobalPushArgs) -> Result<Report> {
    let spec = WorkloadSpec {
        clusters: args.clusters,
        endpoints: args.endpoints,
    };
    let mut report = library_report("w6-global-push", args, server);
    let timeout = Duration::from_secs(args.timeout_s);
    for &protocol in &args.protocols {
        for run in 0..args.runs.max(1) {
            let params = FleetParams::new(args.proxies, protocol);
            let mut r = cold_start(server, &spec, &params, timeout).await?;
            let cds_kb: f64 = r
                .workload
                .snapshot()
                .resources(ResourceType::Cluster)
                .values()
                .map(|res| res.any_bytes().len() as f64)
                .sum::<f64>()
                / 1024.0;
            let before = r.fleet.totals();
            let mut cpu = Vec::new();
            let mut all_s = Vec::new();
            let mut us = Vec::new();
            for k in 0..args.repetitions {
                let change = Change::Global {
                    generation: k as u64 + 1,
                };
                r.workload.apply(change);
                r.shared.set_expected(r.workload.snapshot().clone());
                let cpu0 = r.server.cpu_seconds();
                let t0 = Instant::now();
                r.server.publish(change, &r.workload).await?;
                if r.shared.wait_converged(args.proxies, timeout).await {
                    all_s.push(t0.elapsed().as_secs_f64());
                }
                cpu.push(r.server.cpu_seconds() - cpu0);
                us.extend(r.fleet.us_since(t0, |c| c.converged_at));
            }
            r.server.flush().await?;
            let after = r.fleet.totals();
            let reps = args.repetitions.max(1) as f64;
            let n = args.proxies.max(1) as f64;
            let p = measure::percentiles_us(&mut us);
            let total_cpu: f64 = cpu.iter().sum();
            report.rows.push(row!(
                "protocol" => protocol.to_string(),
                "run" => run + 1,
                "proxies" => args.proxies,
                "clusters" => args.clusters,
                "cds_kb" => cds_kb,
                "pushes" => args.repetitions,
                "all_acked" => all_s.len(),
                "all_acked_median_ms" => measure::median(&mut all_s) * 1000.0,
                "proxy_p50_ms" => p.p50_ms,
                "proxy_p99_ms" => p.p99_ms,
                "cpu_ms_per_push" => total_cpu * 1000.0 / reps,
                "cpu_ms_per_push_median" => measure::median(&mut cpu) * 1000.0,
                "kb_per_push_per_proxy" => (after.bytes - before.bytes) as f64 / reps / n / 1024.0,
                "server_peak_rss_mb" => r.server.memory().peak as f64 / MB,
            ));
            eprintln!(
                "w6 {protocol} run {}: {:.1} CPU-ms/push, all acked median {:.0} ms",
                run + 1,
                total_cpu * 1000.0 / reps,
                measure::median(&mut all_s) * 1000.0
            );
            r.stop().await;
        }
    }
    report.notes.push("CPU per push: server CPU from publish until every proxy ACKed (10 ms clock ticks; use the mean over all pushes)".into());
    Ok(report)
}
