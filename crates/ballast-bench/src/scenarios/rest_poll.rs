//! REST-JSON poll cost (issue 15): one keep-alive HTTP/1.1 connection polls
//! `POST /v3/discovery:clusters` against a `serve-snapshot` child at N
//! clusters: `--polls` full answers (200: no `versionInfo` held) and then
//! `--polls` current ones (304: the served version held). Per kind it reports
//! the client-observed latency (p50/p99) and the server's CPU per request
//! (CPU-seconds of the child over the batch / polls), which is the "server
//! time" the encode-once and 304 work targets, and the child's RSS before and after the
//! first poll (the descriptor pool and JSON it builds). `--server-exe` points at
//! another build's `ballast-bench` (its `serve-snapshot`), so an older commit
//! is measured with this same client.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use ballast_xds::envoy_types::pb::envoy::config::core::v3::Node;
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use ballast_xds::json;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::Serialize;

use super::{MB, library_report};
use crate::measure::{self, percentiles_us};
use crate::report::Report;
use crate::row;
use crate::server::{BenchServer, ServerMode, ServerOptions};
use crate::workload::{Workload, WorkloadSpec};

#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct RestPollArgs {
    #[arg(long, default_value_t = 1000)]
    pub clusters: usize,
    #[arg(long, default_value_t = 10)]
    pub endpoints: usize,
    /// Polls per kind (200 and 304) and run (CPU is read in 10 ms ticks).
    #[arg(long, default_value_t = 500)]
    pub polls: usize,
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// The `ballast-bench` binary whose `serve-snapshot` is measured
    /// (default: this one), e.g. a build of an older commit.
    #[arg(long)]
    pub server_exe: Option<PathBuf>,
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn poll(sender: &mut Sender, host: &str, version: &str) -> Result<(u16, Bytes, u32)> {
    let req = DiscoveryRequest {
        node: Some(Node {
            id: "rest-poll".into(),
            cluster: "bench".into(),
            ..Default::default()
        }),
        version_info: version.to_string(),
        type_url: ballast_xds::ResourceType::Cluster.type_url().into(),
        ..Default::default()
    };
    let body = json::message_to_json(&req)?.to_string();
    let http_req = hyper::Request::post("/v3/discovery:clusters")
        .header(hyper::header::HOST, host)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))?;
    sender.ready().await?;
    let started = Instant::now();
    let resp = sender.send_request(http_req).await?;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await?.to_bytes();
    let us = started.elapsed().as_micros().min(u32::MAX as u128) as u32;
    Ok((status, bytes, us))
}

pub async fn run(server: &ServerOptions, args: &RestPollArgs) -> Result<Report> {
    let spec = WorkloadSpec {
        clusters: args.clusters,
        endpoints: args.endpoints,
    };
    let opts = ServerOptions {
        mode: ServerMode::Child,
        exe: args.server_exe.clone().or(server.exe.clone()),
        ..server.clone()
    };
    let mut report = library_report("rest-poll", args, &opts);
    let workload = Workload::new(spec);
    let mut summary: [Vec<(f64, f64, f64)>; 2] = [Vec::new(), Vec::new()];
    for run in 1..=args.runs {
        let bench = BenchServer::start(&opts, &workload).await?;
        let tcp = tokio::net::TcpStream::connect(bench.addr).await?;
        let _ = tcp.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        let conn = tokio::spawn(conn);
        let host = bench.addr.to_string();
        let rss_start = bench.memory().rss;
        // The first answer encodes (and, after encode-once, caches) the JSON.
        let (status, body, cold_us) = poll(&mut sender, &host, "").await?;
        if status != 200 {
            bail!("first poll: HTTP {status}");
        }
        let v: serde_json::Value = serde_json::from_slice(&body).context("response JSON")?;
        let version = v["versionInfo"].as_str().unwrap_or_default().to_string();
        let rss_first = bench.memory().rss;
        for (i, (kind, held, want)) in [("200", "", 200), ("304", version.as_str(), 304)]
            .into_iter()
            .enumerate()
        {
            let mut lat = Vec::with_capacity(args.polls);
            let cpu0 = bench.cpu_seconds();
            for _ in 0..args.polls {
                let (status, _, us) = poll(&mut sender, &host, held).await?;
                if status != want {
                    bail!("{kind} poll: HTTP {status}");
                }
                lat.push(us);
            }
            let cpu_us = (bench.cpu_seconds() - cpu0) * 1e6 / args.polls.max(1) as f64;
            let p = percentiles_us(&mut lat);
            summary[i].push((p.p50_ms, p.p99_ms, cpu_us));
            report.rows.push(row!(
                "run" => run.to_string(),
                "kind" => kind,
                "clusters" => args.clusters,
                "polls" => args.polls,
                "body_bytes" => if want == 200 { body.len() } else { 0 },
                "cold_200_ms" => cold_us as f64 / 1000.0,
                "p50_ms" => p.p50_ms,
                "p99_ms" => p.p99_ms,
                "server_cpu_us_per_poll" => cpu_us,
                "rss_before_first_mb" => rss_start as f64 / MB,
                "rss_after_first_mb" => rss_first as f64 / MB,
            ));
        }
        drop(sender);
        conn.abort();
        bench.stop().await;
    }
    for (i, kind) in ["200", "304"].into_iter().enumerate() {
        let col = |f: fn(&(f64, f64, f64)) -> f64| {
            measure::median(&mut summary[i].iter().map(f).collect::<Vec<_>>())
        };
        report.rows.push(row!(
            "run" => "median",
            "kind" => kind,
            "clusters" => args.clusters,
            "polls" => args.polls,
            "body_bytes" => "",
            "cold_200_ms" => "",
            "p50_ms" => col(|s| s.0),
            "p99_ms" => col(|s| s.1),
            "server_cpu_us_per_poll" => col(|s| s.2),
            "rss_before_first_mb" => "",
            "rss_after_first_mb" => "",
        ));
    }
    report.notes.push(format!(
        "server: {} serve-snapshot (child, {} threads); latency is client-observed over one \
         keep-alive HTTP/1.1 connection; CPU is the child's over each batch / polls; medians of {} runs",
        opts.exe
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "this ballast-bench".into()),
        opts.threads,
        args.runs
    ));
    Ok(report)
}
