//! W8 idle memory: 1k/5k/10k proxies sharing one C-cluster config; server
//! memory per connected, idle proxy = (RSS with the fleet − RSS before) / N.
//! Only meaningful with `--server child` (in-process RSS includes the clients).

use std::time::Duration;

use anyhow::Result;
use serde::Serialize;

use super::{FleetParams, MB, cold_start, library_report};
use crate::client::Protocol;
use crate::report::Report;
use crate::row;
use crate::server::{ServerMode, ServerOptions};
use crate::workload::WorkloadSpec;

#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct IdleMemoryArgs {
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,10000")]
    pub proxies: Vec<usize>,
    #[arg(long, default_value_t = 1000)]
    pub clusters: usize,
    #[arg(long, default_value_t = 10)]
    pub endpoints: usize,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "sotw")]
    pub protocols: Vec<Protocol>,
    /// Clients loading their first config at once (the measure is idle memory,
    /// not a connection storm).
    #[arg(long, default_value_t = 200)]
    pub connect_concurrency: usize,
    /// Idle time before measuring.
    #[arg(long, default_value_t = 3)]
    pub idle_s: u64,
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
}

pub async fn run(server: &ServerOptions, args: &IdleMemoryArgs) -> Result<Report> {
    let spec = WorkloadSpec {
        clusters: args.clusters,
        endpoints: args.endpoints,
    };
    let mut report = library_report("w8-idle-memory", args, server);
    for &protocol in &args.protocols {
        for &n in &args.proxies {
            let params = FleetParams {
                connect_concurrency: args.connect_concurrency,
                ..FleetParams::new(n, protocol)
            };
            let r = cold_start(server, &spec, &params, Duration::from_secs(args.timeout_s)).await?;
            tokio::time::sleep(Duration::from_secs(args.idle_s)).await;
            let before = r.cold.memory_before;
            let after = r.server.memory();
            let per_proxy_kib = (after.rss as f64 - before.rss as f64) / n.max(1) as f64 / 1024.0;
            report.rows.push(row!(
                "protocol" => protocol.to_string(),
                "proxies" => n,
                "clusters" => args.clusters,
                "converged" => r.cold.converged,
                "load_s" => r.cold.all_acked_s,
                "rss_before_mb" => before.rss as f64 / MB,
                "rss_idle_mb" => after.rss as f64 / MB,
                "peak_rss_mb" => after.peak as f64 / MB,
                "kib_per_proxy" => per_proxy_kib,
                "server_cpu_s" => r.cold.server_cpu_s,
            ));
            eprintln!(
                "w8 {protocol} {n}: {}/{n} converged in {:?} s, RSS {:.1} → {:.1} MB, {per_proxy_kib:.1} KiB/proxy",
                r.cold.converged,
                r.cold.all_acked_s,
                before.rss as f64 / MB,
                after.rss as f64 / MB
            );
            r.stop().await;
        }
    }
    if server.mode == ServerMode::InProcess {
        report
            .notes
            .push("in-process: RSS includes the clients; use --server child".into());
    }
    Ok(report)
}
