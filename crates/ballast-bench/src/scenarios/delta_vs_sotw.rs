//! W7 Delta vs SotW on W2 (endpoint churn, library server) and W3 (route edit,
//! `ballast` binary): bytes per update per proxy and server CPU per update,
//! medians over runs, with the Delta / SotW ratio.

use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use super::churn::{self, ChurnArgs};
use super::route_edit::{self, RouteEditArgs};
use crate::client::Protocol;
use crate::report::{Report, column_median};
use crate::row;
use crate::server::ServerOptions;

#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct DeltaVsSotwArgs {
    #[arg(long, default_value_t = 200)]
    pub churn_proxies: usize,
    #[arg(long, default_value_t = 1000)]
    pub churn_clusters: usize,
    #[arg(long, default_value_t = 50.0)]
    pub churn_rate: f64,
    #[arg(long, default_value_t = 10)]
    pub churn_duration_s: u64,
    #[arg(long, default_value_t = 10)]
    pub edit_proxies: usize,
    #[arg(long, default_value_t = 10_000)]
    pub edit_routes: usize,
    #[arg(long, default_value_t = 10)]
    pub edits: usize,
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
}

pub async fn run(server: &ServerOptions, out: &Path, args: &DeltaVsSotwArgs) -> Result<Report> {
    let protocols = vec![Protocol::Sotw, Protocol::Delta];
    let w2 = churn::run(
        server,
        &ChurnArgs {
            proxies: args.churn_proxies,
            clusters: args.churn_clusters,
            endpoints: 10,
            rate: args.churn_rate,
            duration_s: args.churn_duration_s,
            protocols: protocols.clone(),
            runs: args.runs,
            rest_poll_ms: 1000,
            timeout_s: 120,
            seed: 1,
        },
    )
    .await?;
    let w3 = route_edit::run(
        out,
        &RouteEditArgs {
            proxies: args.edit_proxies,
            routes: args.edit_routes,
            clusters: args.edit_routes,
            endpoints: 1,
            edits: args.edits,
            pause_ms: 300,
            protocols: protocols.clone(),
            runs: args.runs,
            rest_poll_ms: 1000,
            timeout_s: 120,
            no_vhds: false,
        },
    )
    .await?;
    let mut report = Report::new("w7-delta-vs-sotw", serde_json::json!({ "args": args }));
    // (workload, source report, bytes column (×1 B), CPU column (→ ms per update), p99)
    let cases: [(&str, &Report, &str, f64, &str, f64); 2] = [
        (
            "W2 endpoint churn",
            &w2,
            "bytes_per_update_per_proxy",
            1.0,
            "server_cpu_s",
            1000.0 / (args.churn_rate * args.churn_duration_s as f64),
        ),
        (
            "W3 route edit",
            &w3,
            "kb_per_edit_per_proxy",
            1024.0,
            "cpu_ms_per_edit",
            1.0,
        ),
    ];
    for (name, rep, bytes_col, bytes_scale, cpu_col, cpu_scale) in cases {
        let get = |p: Protocol, col: &str| column_median(rep, "protocol", &p.to_string(), col);
        let sb = get(Protocol::Sotw, bytes_col) * bytes_scale;
        let db = get(Protocol::Delta, bytes_col) * bytes_scale;
        let sc = get(Protocol::Sotw, cpu_col) * cpu_scale;
        let dc = get(Protocol::Delta, cpu_col) * cpu_scale;
        report.rows.push(row!(
            "workload" => name,
            "sotw_bytes_per_update_per_proxy" => sb,
            "delta_bytes_per_update_per_proxy" => db,
            "delta_over_sotw_bytes" => db / sb,
            "sotw_cpu_ms_per_update" => sc,
            "delta_cpu_ms_per_update" => dc,
            "delta_over_sotw_cpu" => dc / sc,
            "sotw_p99_ms" => get(Protocol::Sotw, "p99_ms"),
            "delta_p99_ms" => get(Protocol::Delta, "p99_ms"),
        ));
    }
    report.notes.push(format!("medians of {} runs each; W2 CPU per update = churn server CPU-s / changes (approximate: the churn rate × duration)", args.runs));
    report
        .notes
        .extend(w2.notes.iter().chain(&w3.notes).cloned());
    println!("{}\n{}", w2.markdown(), w3.markdown());
    w2.write_json(out)?;
    w3.write_json(out)?;
    Ok(report)
}
