//! W10 burst: E config events within T (default 1,000 in 1 s), each rewriting
//! one Backend's endpoints in the real `ballast` binary's config directory,
//! with P proxies. Measured: pushes per proxy (and the most in any 100 ms
//! window), and the time from the last write until every proxy holds the
//! final config (observed as: every proxy on the same EDS version, with no ACK
//! for a quiet period longer than the binary's maximum debounce).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use ballast_xds::ResourceType;
use serde::Serialize;

use super::{BinaryRun, MB, Rng, binary_report};
use crate::client::{EventKind, Protocol};
use crate::gwconfig::GwSpec;
use crate::report::Report;
use crate::row;

#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct BurstArgs {
    #[arg(long, default_value_t = 100)]
    pub proxies: usize,
    #[arg(long, default_value_t = 1000)]
    pub clusters: usize,
    #[arg(long, default_value_t = 2)]
    pub endpoints: usize,
    #[arg(long, default_value_t = 1000)]
    pub events: usize,
    #[arg(long, default_value_t = 1000)]
    pub burst_ms: u64,
    /// No ACK for this long (and equal versions everywhere) = converged.
    #[arg(long, default_value_t = 1500)]
    pub quiet_ms: u64,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "sotw")]
    pub protocols: Vec<Protocol>,
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    #[arg(long, default_value_t = 120)]
    pub timeout_s: u64,
}

/// Most responses of any 100 ms window (at 10 ms steps) per client, after `from_ms`.
fn max_per_window(events: &[crate::client::Event], from_ms: u32) -> usize {
    let times: Vec<u32> = events
        .iter()
        .filter(|e| e.kind == EventKind::Response && e.at_ms >= from_ms)
        .map(|e| e.at_ms)
        .collect();
    let mut best = 0;
    let mut j = 0;
    for i in 0..times.len() {
        while times[i] - times[j] >= 100 {
            j += 1;
        }
        best = best.max(i - j + 1);
    }
    best
}

pub async fn run(out: &Path, args: &BurstArgs) -> Result<Report> {
    let mut report = binary_report("w10-burst", args);
    let spec = GwSpec {
        vhosts: args.clusters,
        routes_per_vhost: 1,
        clusters: args.clusters,
        endpoints: args.endpoints,
    };
    let timeout = Duration::from_secs(args.timeout_s);
    for &protocol in &args.protocols {
        for run in 0..args.runs.max(1) {
            let mut b = BinaryRun::start(out, "w10", &spec).await?;
            let server = &b.server;
            let (f, cold) = b
                .cold(args.proxies, protocol, Duration::from_millis(200), timeout)
                .await;
            let before = f.fleet.totals();
            let cpu0 = server.cpu_seconds();
            let from_ms = f.fleet.shared.start.elapsed().as_millis() as u32;
            let mut rng = Rng::new(run as u64 + 10);
            let gap =
                Duration::from_secs_f64(args.burst_ms as f64 / 1000.0 / args.events.max(1) as f64);
            let start = Instant::now();
            for k in 0..args.events {
                let due = start + gap * k as u32;
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    tokio::time::sleep(wait).await;
                }
                b.cfg
                    .edit_backend((rng.next_u64() % args.clusters as u64) as usize)?;
            }
            let last_write = Instant::now();
            let burst_s = start.elapsed().as_secs_f64();
            // Quiescence: no ACK anywhere for quiet_ms, every proxy on one EDS version.
            let eds = ResourceType::ClusterLoadAssignment.index();
            let deadline = Instant::now() + timeout;
            let quiet = Duration::from_millis(args.quiet_ms);
            let converged_at = loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let last_ack = f
                    .fleet
                    .per_client(|c| c.stats.last_ack_at)
                    .into_iter()
                    .flatten()
                    .max();
                let versions: std::collections::HashSet<String> = f
                    .fleet
                    .per_client(|c| c.stats.type_version[eds].clone())
                    .into_iter()
                    .collect();
                let quiet_for = last_ack.map(|t| t.elapsed()).unwrap_or(quiet);
                if quiet_for >= quiet && versions.len() == 1 {
                    break last_ack;
                }
                if Instant::now() > deadline {
                    break None;
                }
            };
            let server_cpu = server.cpu_seconds() - cpu0;
            let after = f.fleet.totals();
            let n = args.proxies.max(1) as f64;
            let windows = f.fleet.per_client(|c| max_per_window(&c.events, from_ms));
            let max_window = windows.iter().copied().max().unwrap_or(0);
            let converge_ms = converged_at
                .map(|t| t.saturating_duration_since(last_write).as_secs_f64() * 1000.0);
            report.rows.push(row!(
                "protocol" => protocol.to_string(),
                "run" => run + 1,
                "proxies" => args.proxies,
                "clusters" => args.clusters,
                "events" => args.events,
                "burst_s" => burst_s,
                "cold_all_acked_s" => cold.all_acked_s,
                "pushes_per_proxy" => (after.responses - before.responses) as f64 / n,
                "max_pushes_per_100ms" => max_window,
                "converged_after_burst_ms" => converge_ms,
                "server_cpu_s" => server_cpu,
                "peak_rss_mb" => server.memory().peak as f64 / MB,
                "nacks" => after.nacks,
            ));
            eprintln!(
                "w10 {protocol} run {}: {:.1} pushes/proxy, max {max_window}/100 ms, converged {converge_ms:?} ms after the burst",
                run + 1,
                (after.responses - before.responses) as f64 / n
            );
            b.stop(f).await;
        }
    }
    report.notes.push("pushes: responses of any type received per proxy from the first write to convergence; the binary debounces (quiet 100 ms, max 1 s)".into());
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Event;

    #[test]
    fn window_counts() {
        let ev = |at_ms| Event {
            at_ms,
            ty: 2,
            kind: EventKind::Response,
        };
        let events = vec![ev(0), ev(50), ev(99), ev(100), ev(300)];
        assert_eq!(max_per_window(&events, 0), 3);
        assert_eq!(max_per_window(&events, 60), 2);
    }
}
