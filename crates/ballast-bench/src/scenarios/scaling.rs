//! Scaling curves: for each fleet size, a cold start, idle memory per proxy
//! and a short endpoint churn (convergence p50/p99); writes the table and two
//! SVG plots (memory per proxy vs fleet size, convergence vs fleet size).

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;

use super::{FleetParams, churn, cold_start};
use crate::client::Protocol;
use crate::report::{Report, column_median};
use crate::row;
use crate::server::ServerOptions;
use crate::svg::{Series, line_chart};
use crate::workload::WorkloadSpec;

#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct ScalingArgs {
    #[arg(long, value_delimiter = ',', default_value = "100,500,1000,2000")]
    pub proxies: Vec<usize>,
    #[arg(long, default_value_t = 1000)]
    pub clusters: usize,
    #[arg(long, default_value_t = 10)]
    pub endpoints: usize,
    #[arg(long, default_value_t = 20.0)]
    pub churn_rate: f64,
    #[arg(long, default_value_t = 5)]
    pub churn_duration_s: u64,
    #[arg(long, value_enum, default_value = "sotw")]
    pub protocol: Protocol,
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    #[arg(long, default_value_t = 200)]
    pub connect_concurrency: usize,
    /// Where the SVG plots go.
    #[arg(long, default_value = "crates/ballast-bench/plots")]
    pub plots: std::path::PathBuf,
}

pub async fn run(server: &ServerOptions, args: &ScalingArgs) -> Result<Report> {
    let spec = WorkloadSpec {
        clusters: args.clusters,
        endpoints: args.endpoints,
    };
    let mut report = Report::new("scaling", serde_json::json!({ "args": args }));
    let mut runs = Report::new("scaling-runs", serde_json::json!({}));
    for &n in &args.proxies {
        for run in 0..args.runs.max(1) {
            let params = FleetParams {
                connect_concurrency: args.connect_concurrency,
                ..FleetParams::new(n, args.protocol)
            };
            let mut r = cold_start(server, &spec, &params, Duration::from_secs(600)).await?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let before = r.cold.memory_before;
            let idle = r.server.memory();
            let kib = (idle.rss as f64 - before.rss as f64) / n.max(1) as f64 / 1024.0;
            let c = churn(
                &mut r,
                args.churn_rate,
                Duration::from_secs(args.churn_duration_s),
                Duration::from_secs(120),
                run as u64 + 1,
            )
            .await?;
            runs.rows.push(row!(
                "proxies" => n.to_string(), "run" => run + 1, "kib_per_proxy" => kib,
                "cold_all_acked_s" => r.cold.all_acked_s, "p50_ms" => c.convergence.p50_ms, "p99_ms" => c.convergence.p99_ms,
                "server_cores" => c.server_cores,
            ));
            eprintln!(
                "scaling {n} run {}: {kib:.1} KiB/proxy, churn p50 {:.1} p99 {:.1} ms",
                run + 1,
                c.convergence.p50_ms,
                c.convergence.p99_ms
            );
            r.stop().await;
        }
    }
    let med = |n: usize, col: &str| column_median(&runs, "proxies", &n.to_string(), col);
    let spread = |n: usize, col: &str| {
        let v: Vec<f64> = runs
            .rows
            .iter()
            .filter(|r| {
                r.iter()
                    .any(|(k, v)| k == "proxies" && v.as_str() == Some(&n.to_string()))
            })
            .filter_map(|r| {
                r.iter()
                    .find(|(k, _)| k == col)
                    .and_then(|(_, v)| v.as_f64())
            })
            .collect();
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
        format!("{lo:.1}–{hi:.1}")
    };
    for &n in &args.proxies {
        report.rows.push(row!(
            "proxies" => n, "kib_per_proxy" => med(n, "kib_per_proxy"), "kib_range" => spread(n, "kib_per_proxy"),
            "cold_all_acked_s" => med(n, "cold_all_acked_s"), "churn_p50_ms" => med(n, "p50_ms"), "churn_p99_ms" => med(n, "p99_ms"),
            "p99_range" => spread(n, "p99_ms"), "server_cores" => med(n, "server_cores"),
        ));
    }
    let pts = |col: &str| {
        args.proxies
            .iter()
            .map(|&n| (n as f64, med(n, col)))
            .collect::<Vec<_>>()
    };
    std::fs::create_dir_all(&args.plots)?;
    write_plot(
        &args.plots.join("memory-per-proxy.svg"),
        &line_chart(
            "Server memory per idle proxy",
            "proxies",
            "KiB per proxy",
            &[Series {
                name: "RSS delta / proxies".into(),
                points: pts("kib_per_proxy"),
            }],
        ),
    )?;
    write_plot(
        &args.plots.join("convergence-vs-fleet.svg"),
        &line_chart(
            &format!(
                "Endpoint-change convergence ({} changes/s)",
                args.churn_rate
            ),
            "proxies",
            "ms",
            &[
                Series {
                    name: "p50".into(),
                    points: pts("p50_ms"),
                },
                Series {
                    name: "p99".into(),
                    points: pts("p99_ms"),
                },
            ],
        ),
    )?;
    println!("{}", runs.markdown());
    report.notes.push(format!(
        "medians of {} runs; plots in {}",
        args.runs,
        args.plots.display()
    ));
    Ok(report)
}

fn write_plot(path: &Path, svg: &str) -> Result<()> {
    std::fs::write(path, svg)?;
    eprintln!("plot: {}", path.display());
    Ok(())
}
