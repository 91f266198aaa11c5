//! W1 cold start: N proxies × C clusters (+M endpoints each) connecting at
//! once; time until every proxy has ACKed the full config, server CPU-seconds
//! and memory.

use std::time::Duration;

use anyhow::Result;
use serde::Serialize;

use super::{FleetParams, cold_start, library_report};
use crate::client::Protocol;
use crate::report::Report;
use crate::row;
use crate::server::ServerOptions;
use crate::workload::WorkloadSpec;

#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct ColdStartArgs {
    #[arg(long, default_value_t = 1000)]
    pub proxies: usize,
    #[arg(long, default_value_t = 1000)]
    pub clusters: usize,
    #[arg(long, default_value_t = 10)]
    pub endpoints: usize,
    /// Protocols to run, one fresh server each.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "sotw,delta")]
    pub protocols: Vec<Protocol>,
    /// Repetitions per protocol (the table reports each run and the median).
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    #[arg(long, default_value_t = 120)]
    pub timeout_s: u64,
    #[arg(long, default_value_t = 1000)]
    pub rest_poll_ms: u64,
}

pub async fn run(server: &ServerOptions, args: &ColdStartArgs) -> Result<Report> {
    let spec = WorkloadSpec {
        clusters: args.clusters,
        endpoints: args.endpoints,
    };
    let mut report = library_report("w1-cold-start", args, server);
    for &protocol in &args.protocols {
        for run in 0..args.runs.max(1) {
            let params = FleetParams {
                rest_poll_ms: args.rest_poll_ms,
                ..FleetParams::new(args.proxies, protocol)
            };
            let r = cold_start(server, &spec, &params, Duration::from_secs(args.timeout_s)).await?;
            let c = &r.cold;
            let n = args.proxies.max(1) as f64;
            report.rows.push(row!(
                "protocol" => protocol.to_string(),
                "run" => run + 1,
                "proxies" => args.proxies,
                "clusters" => args.clusters,
                "converged" => c.converged,
                "all_acked_s" => c.all_acked_s,
                "connect_p50_ms" => c.connected.p50_ms,
                "connect_max_ms" => c.connected.max_ms,
                "first_resp_p50_ms" => c.first_response.p50_ms,
                "proxy_p50_ms" => c.per_proxy.p50_ms,
                "proxy_p99_ms" => c.per_proxy.p99_ms,
                "server_cpu_s" => c.server_cpu_s,
                "client_cpu_s" => c.client_cpu_s,
                "server_peak_rss_mb" => c.peak_mb(),
                "server_rss_mb" => c.rss_mb(),
                "kb_per_proxy" => c.totals.bytes as f64 / n / 1024.0,
                "responses_per_proxy" => c.totals.responses as f64 / n,
                "nacks" => c.totals.nacks,
                "reconnects" => c.totals.reconnects,
            ));
            if !c.failures.is_empty() {
                report.notes.push(format!(
                    "{protocol} run {}: not converged: {:?}",
                    run + 1,
                    c.failures
                ));
            }
            eprintln!(
                "w1 {protocol} run {}: {}/{} converged, all acked {:?} s, server {:.2} CPU-s, peak RSS {:.1} MB",
                run + 1,
                c.converged,
                args.proxies,
                c.all_acked_s,
                c.server_cpu_s,
                c.peak_mb()
            );
            r.stop().await;
        }
    }
    if server.mode == crate::server::ServerMode::InProcess {
        report.notes.push(
            "in-process: server CPU is its runtime's threads; RSS is the whole process (clients included)".into(),
        );
    }
    Ok(report)
}
