//! W4 cold start of the real `ballast` binary with V virtual hosts × R routes,
//! C clusters and EDS, and P proxies: load time (spawn → `/readyz`), time from
//! ready to every proxy holding the full config, and peak RSS.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;

use super::{BinaryRun, MB, binary_report};
use crate::client::Protocol;
use crate::gwconfig::GwSpec;
use crate::report::Report;
use crate::row;

#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct LargeColdArgs {
    #[arg(long, default_value_t = 4)]
    pub proxies: usize,
    #[arg(long, default_value_t = 3400)]
    pub vhosts: usize,
    #[arg(long, default_value_t = 5)]
    pub routes_per_vhost: usize,
    #[arg(long, default_value_t = 3400)]
    pub clusters: usize,
    #[arg(long, default_value_t = 2)]
    pub endpoints: usize,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "sotw")]
    pub protocols: Vec<Protocol>,
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    #[arg(long, default_value_t = 120)]
    pub timeout_s: u64,
}

pub async fn run(out: &Path, args: &LargeColdArgs) -> Result<Report> {
    let mut report = binary_report("w4-large-cold-start", args);
    let spec = GwSpec {
        vhosts: args.vhosts,
        routes_per_vhost: args.routes_per_vhost,
        clusters: args.clusters,
        endpoints: args.endpoints,
    };
    for &protocol in &args.protocols {
        for run in 0..args.runs.max(1) {
            let b = BinaryRun::start(out, "w4", &spec).await?;
            let server = &b.server;
            let load_cpu = server.cpu_seconds();
            let timeout = Duration::from_secs(args.timeout_s);
            let (f, cold) = b
                .cold(args.proxies, protocol, Duration::from_secs(1), timeout)
                .await;
            // The first last good sync runs a second after the first load (it re-reads every
            // file): the start's peak includes it, so wait for it before reading the peak.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let mem = server.memory();
            let n = args.proxies.max(1) as f64;
            report.rows.push(row!(
                "protocol" => protocol.to_string(),
                "run" => run + 1,
                "proxies" => args.proxies,
                "vhosts" => args.vhosts,
                "routes" => args.vhosts * args.routes_per_vhost,
                "clusters" => args.clusters,
                "load_s" => server.ready_after.as_secs_f64(),
                "load_cpu_s" => load_cpu,
                "full_ack_p50_ms" => cold.per_proxy.p50_ms,
                "all_acked_ms" => cold.all_acked_s.map(|s| s * 1000.0),
                "push_cpu_s" => cold.server_cpu_s,
                "peak_rss_mb" => mem.peak as f64 / MB,
                "rss_mb" => mem.rss as f64 / MB,
                "kb_per_proxy" => cold.totals.bytes as f64 / n / 1024.0,
                "nacks" => cold.totals.nacks,
            ));
            eprintln!(
                "w4 {protocol} run {}: load {:.2} s, all acked {:?} s after ready, peak RSS {:.1} MB",
                run + 1,
                server.ready_after.as_secs_f64(),
                cold.all_acked_s,
                mem.peak as f64 / MB
            );
            b.stop(f).await;
        }
    }
    report.notes.push(
        "load_s: spawn to /readyz 200 (parse, translate, first snapshot); full_ack_p50_ms: median proxy, from connecting after ready to holding every resource".into(),
    );
    Ok(report)
}
