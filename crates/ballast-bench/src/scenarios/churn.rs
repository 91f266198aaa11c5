//! W2 endpoint churn: R endpoint changes per second over C clusters with N
//! proxies for D seconds. Convergence per proxy is the time from a change's
//! publication to that proxy's ACK of a version containing it (p50/p99/max),
//! with server CPU, bytes and pushes per proxy during the churn.

use std::time::Duration;

use anyhow::Result;
use serde::Serialize;

use super::{FleetParams, churn, cold_start, library_report};
use crate::client::Protocol;
use crate::report::Report;
use crate::row;
use crate::server::ServerOptions;
use crate::workload::WorkloadSpec;

#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct ChurnArgs {
    #[arg(long, default_value_t = 1000)]
    pub proxies: usize,
    #[arg(long, default_value_t = 1000)]
    pub clusters: usize,
    #[arg(long, default_value_t = 10)]
    pub endpoints: usize,
    /// Endpoint changes per second.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    #[arg(long, default_value_t = 60)]
    pub duration_s: u64,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "sotw,delta")]
    pub protocols: Vec<Protocol>,
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    #[arg(long, default_value_t = 1000)]
    pub rest_poll_ms: u64,
    #[arg(long, default_value_t = 120)]
    pub timeout_s: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

pub async fn run(server: &ServerOptions, args: &ChurnArgs) -> Result<Report> {
    let spec = WorkloadSpec {
        clusters: args.clusters,
        endpoints: args.endpoints,
    };
    let mut report = library_report("w2-endpoint-churn", args, server);
    for &protocol in &args.protocols {
        for run in 0..args.runs.max(1) {
            let params = FleetParams {
                rest_poll_ms: args.rest_poll_ms,
                ..FleetParams::new(args.proxies, protocol)
            };
            let timeout = Duration::from_secs(args.timeout_s);
            let mut r = cold_start(server, &spec, &params, timeout).await?;
            if r.cold.all_acked_s.is_none() {
                report.notes.push(format!(
                    "{protocol} run {}: cold start did not converge: {:?}",
                    run + 1,
                    r.cold.failures
                ));
                r.stop().await;
                continue;
            }
            let c = churn(
                &mut r,
                args.rate,
                Duration::from_secs(args.duration_s),
                timeout,
                args.seed + run as u64,
            )
            .await?;
            let n = args.proxies.max(1) as f64;
            let changes = c.changes.max(1) as f64;
            report.rows.push(row!(
                "protocol" => protocol.to_string(),
                "run" => run + 1,
                "proxies" => args.proxies,
                "clusters" => args.clusters,
                "changes" => c.changes,
                "rate_per_s" => c.changes as f64 / c.duration_s,
                "p50_ms" => c.convergence.p50_ms,
                "p99_ms" => c.convergence.p99_ms,
                "max_ms" => c.convergence.max_ms,
                "samples" => c.convergence.count,
                "expected_samples" => c.expected_samples,
                "server_cpu_s" => c.server_cpu_s,
                "server_cores" => c.server_cores,
                "server_peak_rss_mb" => c.memory.peak as f64 / 1024.0 / 1024.0,
                "pushes_per_proxy" => c.totals.responses as f64 / n,
                "kb_per_proxy" => c.totals.bytes as f64 / n / 1024.0,
                "bytes_per_update_per_proxy" => c.totals.bytes as f64 / changes / n,
                "settled" => c.settled,
                "nacks" => c.totals.nacks,
            ));
            if !c.failures.is_empty() {
                report.notes.push(format!(
                    "{protocol} run {}: not settled: {:?}",
                    run + 1,
                    c.failures
                ));
            }
            eprintln!(
                "w2 {protocol} run {}: {} changes, p50 {:.1} ms p99 {:.1} ms max {:.1} ms, {:.3} cores, settled {}",
                run + 1,
                c.changes,
                c.convergence.p50_ms,
                c.convergence.p99_ms,
                c.convergence.max_ms,
                c.server_cores,
                c.settled
            );
            r.stop().await;
        }
    }
    report.notes.push(
        "no debounce: the library cache publishes every change; SotW EDS pushes carry only the load assignments that changed (every SotW ACK still lists all 1,000 names)".into(),
    );
    if !server.push_interval.is_zero() {
        report.notes.push(format!(
            "push interval {} ms (XdsServerBuilder::push_interval): each stream takes a new snapshot at most once per interval",
            server.push_interval.as_millis()
        ));
    }
    if server.mode == crate::server::ServerMode::InProcess {
        report.notes.push(
            "in-process: server CPU excludes snapshot building (done by the bench); RSS includes the clients".into(),
        );
    }
    Ok(report)
}
