//! W5 reconnect storm: N connected proxies lose their streams at once (the
//! bench drops them; each client keeps its view, like an Envoy whose control
//! plane connection broke), one endpoint change is published meanwhile, and
//! all N streams are restored at once. Measured: time from the restore until
//! every proxy ACKed the changed config (re-synced), and server CPU-seconds.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;

use super::{FleetParams, MB, Running, cold_start, library_report};
use crate::client::Protocol;
use crate::measure;
use crate::report::Report;
use crate::row;
use crate::server::ServerOptions;
use crate::workload::{Change, WorkloadSpec};

#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct ReconnectArgs {
    /// Streams dropped and restored (the 10,000 needs ~10k sockets on each side).
    #[arg(long, default_value_t = 2000)]
    pub proxies: usize,
    #[arg(long, default_value_t = 100)]
    pub clusters: usize,
    #[arg(long, default_value_t = 5)]
    pub endpoints: usize,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "sotw,delta")]
    pub protocols: Vec<Protocol>,
    /// Storms per run (drop → change → restore → wait).
    #[arg(long, default_value_t = 3)]
    pub storms: usize,
    #[arg(long, default_value_t = 200)]
    pub connect_concurrency: usize,
    #[arg(long, default_value_t = 300)]
    pub timeout_s: u64,
}

/// One storm's result.
pub struct Storm {
    pub all: bool,
    pub resynced_s: f64,
    pub server_cpu_s: f64,
    pub per_proxy: measure::Percentiles,
}

/// Drops every stream, publishes endpoint change `k` while they are down,
/// restores them and waits until every proxy holds the new config.
pub async fn storm_once(r: &mut Running, k: usize, timeout: Duration) -> Result<Storm> {
    r.shared.set_check_on_ack(true);
    r.fleet.set_streams_dropped(true);
    // Let the server see every stream close.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let change = Change::Endpoints {
        cluster: k,
        counter: 1_000_000 + k as u64,
    };
    r.workload.apply(change);
    r.shared.set_expected(r.workload.snapshot().clone());
    r.server.publish(change, &r.workload).await?;
    r.server.flush().await?;
    let cpu0 = r.server.cpu_seconds();
    let t0 = Instant::now();
    r.fleet.set_streams_dropped(false);
    let all = r
        .shared
        .wait_converged(r.fleet.clients.len(), timeout)
        .await;
    let resynced_s = t0.elapsed().as_secs_f64();
    let server_cpu_s = r.server.cpu_seconds() - cpu0;
    let mut us = r.fleet.us_since(t0, |c| c.converged_at);
    Ok(Storm {
        all,
        resynced_s,
        server_cpu_s,
        per_proxy: measure::percentiles_us(&mut us),
    })
}

pub async fn run(server: &ServerOptions, args: &ReconnectArgs) -> Result<Report> {
    let spec = WorkloadSpec {
        clusters: args.clusters,
        endpoints: args.endpoints,
    };
    let mut report = library_report("w5-reconnect-storm", args, server);
    let timeout = Duration::from_secs(args.timeout_s);
    for &protocol in &args.protocols {
        let params = FleetParams {
            connect_concurrency: args.connect_concurrency,
            ..FleetParams::new(args.proxies, protocol)
        };
        let mut r = cold_start(server, &spec, &params, timeout).await?;
        if r.cold.all_acked_s.is_none() {
            report.notes.push(format!(
                "{protocol}: cold start did not converge: {:?}",
                r.cold.failures
            ));
            r.stop().await;
            continue;
        }
        for storm in 0..args.storms.max(1) {
            let before = r.fleet.totals();
            let st = storm_once(&mut r, storm, timeout).await?;
            let (all, resynced_s, cpu, p) = (st.all, st.resynced_s, st.server_cpu_s, st.per_proxy);
            let after = r.fleet.totals();
            let n = args.proxies.max(1) as f64;
            report.rows.push(row!(
                "protocol" => protocol.to_string(),
                "storm" => storm + 1,
                "streams" => args.proxies,
                "clusters" => args.clusters,
                "resynced" => r.shared.converged(),
                "all_resynced_s" => all.then_some(resynced_s),
                "proxy_p50_ms" => p.p50_ms,
                "proxy_p99_ms" => p.p99_ms,
                "server_cpu_s" => cpu,
                "kb_per_proxy" => (after.bytes - before.bytes) as f64 / n / 1024.0,
                "responses_per_proxy" => (after.responses - before.responses) as f64 / n,
                "server_peak_rss_mb" => r.server.memory().peak as f64 / MB,
            ));
            eprintln!(
                "w5 {protocol} storm {}: {}/{} re-synced in {resynced_s:.2} s, {cpu:.2} CPU-s",
                storm + 1,
                r.shared.converged(),
                args.proxies
            );
        }
        r.stop().await;
    }
    report.notes.push(
        "streams are dropped by the clients (no server restart): the server sees N stream closes, then N new streams carrying the versions each client holds".into(),
    );
    Ok(report)
}
