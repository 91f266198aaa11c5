//! W3 one route edit among R routes / C clusters with P gateway proxies, served
//! by the real `ballast` binary from a config directory: each edit rewrites the
//! file holding one HTTPRoute; convergence per proxy is from the write to its
//! ACK of the new route configuration — for Delta proxies, of the new VHDS
//! virtual host — (including the file watch and debounce),
//! with server CPU per edit from `/proc/<pid>`.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use ballast_xds::ResourceType;
use serde::Serialize;

use super::{BinaryRun, MB, Rng, binary_report};
use crate::client::Protocol;
use crate::external;
use crate::gwconfig::GwSpec;
use crate::report::Report;
use crate::row;

#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct RouteEditArgs {
    #[arg(long, default_value_t = 10)]
    pub proxies: usize,
    /// HTTPRoutes (one virtual host each).
    #[arg(long, default_value_t = 10_000)]
    pub routes: usize,
    #[arg(long, default_value_t = 10_000)]
    pub clusters: usize,
    #[arg(long, default_value_t = 1)]
    pub endpoints: usize,
    /// Edits per run (sequential, each waited for).
    #[arg(long, default_value_t = 20)]
    pub edits: usize,
    /// Pause after each converged edit (lets the server go idle; > debounce).
    #[arg(long, default_value_t = 300)]
    pub pause_ms: u64,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "sotw")]
    pub protocols: Vec<Protocol>,
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    #[arg(long, default_value_t = 1000)]
    pub rest_poll_ms: u64,
    #[arg(long, default_value_t = 120)]
    pub timeout_s: u64,
    /// Run `ballast serve --no-vhds`: Delta proxies get whole route
    /// configurations (what every proxy got before VHDS).
    #[arg(long)]
    pub no_vhds: bool,
}

pub async fn run(out: &Path, args: &RouteEditArgs) -> Result<Report> {
    let mut report = binary_report("w3-route-edit", args);
    let spec = GwSpec {
        vhosts: args.routes,
        routes_per_vhost: 1,
        clusters: args.clusters,
        endpoints: args.endpoints,
    };
    let timeout = Duration::from_secs(args.timeout_s);
    for &protocol in &args.protocols {
        for run in 0..args.runs.max(1) {
            let extra: Vec<String> = if args.no_vhds {
                vec!["--no-vhds".into()]
            } else {
                Vec::new()
            };
            let mut b = BinaryRun::start_with(out, "w3", &spec, &extra).await?;
            let poll = Duration::from_millis(args.rest_poll_ms);
            let (f, cold) = b.cold(args.proxies, protocol, poll, timeout).await;
            let (server, cfg) = (&b.server, &mut b.cfg);
            if cold.all_acked_s.is_none() {
                report.notes.push(format!(
                    "{protocol} run {}: cold start: {}/{} proxies converged",
                    run + 1,
                    cold.converged,
                    args.proxies
                ));
            }
            if protocol == Protocol::Delta && !args.no_vhds {
                // The cold start counts CDS/EDS/LDS/RDS; VHDS proxies also
                // wait for every virtual host, or the first edit would be
                // charged with them.
                let vh = ResourceType::VirtualHost.index();
                f.fleet
                    .wait_each(timeout, |_, c| {
                        (c.view[vh].len() >= args.routes).then(std::time::Instant::now)
                    })
                    .await;
            }
            let mut rng = Rng::new(run as u64 + 1);
            // Delta proxies get route configurations split into VHDS virtual
            // hosts: an edit reaches them as a new virtual host.
            let edited_type = if protocol == Protocol::Delta && !args.no_vhds {
                ResourceType::VirtualHost
            } else {
                ResourceType::RouteConfiguration
            };
            let e = external::edits(
                server,
                &f,
                edited_type,
                args.edits,
                Duration::from_millis(args.pause_ms),
                timeout,
                |_| cfg.edit_route((rng.next_u64() % args.routes as u64) as usize),
            )
            .await?;
            let idle_cpu = {
                // Idle baseline over the same pauses, to separate per-edit work.
                let c0 = server.cpu_seconds();
                tokio::time::sleep(Duration::from_millis(args.pause_ms * 3)).await;
                (server.cpu_seconds() - c0) / 3.0
            };
            report.rows.push(row!(
                "protocol" => protocol.to_string(),
                "vhds" => protocol == Protocol::Delta && !args.no_vhds,
                "run" => run + 1,
                "proxies" => args.proxies,
                "routes" => args.routes,
                "clusters" => args.clusters,
                "load_s" => server.ready_after.as_secs_f64(),
                "cold_all_acked_s" => cold.all_acked_s,
                "edits" => e.edits,
                "converged_edits" => e.converged_edits,
                "p50_ms" => e.convergence.p50_ms,
                "p99_ms" => e.convergence.p99_ms,
                "max_ms" => e.convergence.max_ms,
                "cpu_ms_per_edit" => e.cpu_ms_per_edit,
                "idle_cpu_ms_per_pause" => idle_cpu * 1000.0,
                "kb_per_edit_per_proxy" => e.bytes_per_edit_per_proxy / 1024.0,
                "pushes_per_edit_per_proxy" => e.pushes_per_edit_per_proxy,
                "peak_rss_mb" => e.peak.peak as f64 / MB,
                "nacks" => f.fleet.totals().nacks,
            ));
            eprintln!(
                "w3 {protocol} run {}: {}/{} edits converged, p50 {:.1} ms p99 {:.1} ms, {:.1} CPU-ms/edit",
                run + 1,
                e.converged_edits,
                e.edits,
                e.convergence.p50_ms,
                e.convergence.p99_ms,
                e.cpu_ms_per_edit
            );
            b.stop(f).await;
        }
    }
    report.notes.push(
        "convergence includes the file watch and the binary's debounce (quiet 100 ms); CPU per edit includes idle time during the wait".into(),
    );
    Ok(report)
}
