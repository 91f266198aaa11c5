//! etcd lane: config in etcd, `ballast serve --etcd`, N real Envoys. Convergence is timed from
//! an etcd write (one Backend's connect timeout: a CDS change) until every Envoy's
//! `cluster_manager.cds.version_text` changed; then W2-style churn (R Backend writes per second
//! through etcd for D seconds) with the server's CPU, and the convergence of one more write
//! right after the churn.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ballast_etcd::{Client, ClientOptions};
use serde::Serialize;

use super::MB;
use super::envoy_lane::{bootstrap, cds_count, cds_version, envoy_exe};
use crate::external;
use crate::measure;
use crate::proc::{self, Proc};
use crate::report::Report;
use crate::row;

#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct EtcdLaneArgs {
    #[arg(long, default_value_t = 5)]
    pub envoys: usize,
    #[arg(long, default_value_t = 20)]
    pub backends: usize,
    #[arg(long, default_value_t = 10)]
    pub changes: usize,
    /// Backend writes per second during the churn.
    #[arg(long, default_value_t = 50.0)]
    pub churn_rate: f64,
    #[arg(long, default_value_t = 10)]
    pub churn_s: u64,
    #[arg(long, default_value_t = 60)]
    pub timeout_s: u64,
    /// Incremental ADS (`DELTA_GRPC`) instead of State-of-the-World.
    #[arg(long)]
    pub delta: bool,
}

const PREFIX: &str = "/ballast/";

fn backend(i: usize, timeout_ms: u64) -> String {
    format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {{ name: b{i} }}\nspec:\n  connectTimeout: {timeout_ms}ms\n  endpoints: [{{ address: 127.0.0.1, port: {} }}]\n",
        20000 + i
    )
}

async fn put_backend(c: &Client, i: usize, timeout_ms: u64) -> Result<()> {
    c.put(
        format!("{PREFIX}backends/default/b{i}"),
        backend(i, timeout_ms),
    )
    .await?;
    Ok(())
}

/// Until every Envoy's CDS version differs from `base`; the time taken, or `None`.
async fn all_changed(
    envoys: &[(Proc, std::net::SocketAddr)],
    base: &[Option<String>],
    t: Instant,
    timeout: Duration,
) -> Option<f64> {
    let mut done = vec![false; envoys.len()];
    while t.elapsed() < timeout {
        for (i, (_, a)) in envoys.iter().enumerate() {
            if !done[i] && cds_version(*a).await != base[i] {
                done[i] = true;
            }
        }
        if done.iter().all(|d| *d) {
            return Some(t.elapsed().as_secs_f64() * 1000.0);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

async fn versions(envoys: &[(Proc, std::net::SocketAddr)]) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for (_, a) in envoys {
        out.push(cds_version(*a).await);
    }
    out
}

pub async fn run(out: &Path, args: &EtcdLaneArgs) -> Result<Report> {
    let mut report = Report::new("etcd-lane", serde_json::json!({ "args": args }));
    let timeout = Duration::from_secs(args.timeout_s);
    let dir = external::run_dir(out, "etcd-lane")?;
    let etcd_bin = std::env::var_os("BALLAST_ETCD").unwrap_or_else(|| "etcd".into());
    let (cport, pport) = (proc::free_port()?, proc::free_port()?);
    let url = format!("http://127.0.0.1:{cport}");
    let mut cmd = tokio::process::Command::new(&etcd_bin);
    cmd.arg("--data-dir")
        .arg(dir.join("etcd.data"))
        .args([
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
        ])
        .args([
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{pport}"),
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{pport}"),
            "--initial-cluster",
            &format!("default=http://127.0.0.1:{pport}"),
        ]);
    let etcd = Proc::spawn("etcd", cmd, &dir.join("etcd.log")).context("starting etcd")?;
    let client = Client::new(std::slice::from_ref(&url), ClientOptions::default())?;
    let t0 = Instant::now();
    while client.status().await.is_err() {
        if t0.elapsed() > timeout {
            bail!("etcd not up");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    client
        .put(
            format!("{PREFIX}gateways/default/edge"),
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: edge }\nspec:\n  gatewayClassName: ballast\n  addresses: [{ type: IPAddress, value: 127.0.0.1 }]\n  listeners: [{ name: http, port: 1, protocol: HTTP }]\n",
        )
        .await?;
    for i in 0..args.backends {
        client
            .put(
                format!("{PREFIX}httproutes/default/r{i}"),
                format!("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: r{i} }}\nspec:\n  parentRefs: [{{ name: edge }}]\n  hostnames: [h{i}.example.com]\n  rules: [{{ backendRefs: [{{ group: ballast.dev, kind: Backend, name: b{i} }}] }}]\n"),
            )
            .await?;
        put_backend(&client, i, 1000).await?;
    }
    let (xds, admin) = (proc::free_addr()?, proc::free_addr()?);
    let mut cmd = tokio::process::Command::new(external::ballast_exe());
    cmd.arg("serve")
        .args(["--etcd", &url])
        .args([
            "--xds-addr",
            &xds.to_string(),
            "--admin-addr",
            &admin.to_string(),
        ])
        .arg("--state-dir")
        .arg(dir.join("state"));
    let mut server = Proc::spawn("ballast", cmd, &dir.join("ballast.log"))?;
    proc::wait_ready(&mut server, admin, "/readyz", timeout).await?;
    let envoy = envoy_exe()?;
    let mut envoys: Vec<(Proc, std::net::SocketAddr)> = Vec::new();
    for i in 0..args.envoys {
        let a = proc::free_addr()?;
        let b = dir.join(format!("envoy-{i}.yaml"));
        let mut boot = bootstrap(i, a.port(), xds, false, 1000);
        if args.delta {
            boot = boot.replace("api_type: GRPC,", "api_type: DELTA_GRPC,");
        }
        std::fs::write(&b, boot)?;
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
            a,
        ));
    }
    let t0 = Instant::now();
    loop {
        let mut ready = 0;
        for (_, a) in &envoys {
            if cds_count(*a).await > args.backends {
                ready += 1;
            }
        }
        if ready == envoys.len() {
            break;
        }
        if t0.elapsed() > timeout {
            bail!("Envoys did not load the config");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Single writes, quiet in between.
    let mut quiet_ms = Vec::new();
    for k in 0..args.changes {
        let base = versions(&envoys).await;
        let t = Instant::now();
        put_backend(&client, (k * 7) % args.backends, 2000 + k as u64).await?;
        if let Some(ms) = all_changed(&envoys, &base, t, timeout).await {
            quiet_ms.push(ms);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Churn through etcd.
    let cpu0 = server.cpu_seconds();
    let every = Duration::from_secs_f64(1.0 / args.churn_rate.max(0.1));
    let end = Instant::now() + Duration::from_secs(args.churn_s);
    let mut writes = 0u64;
    let mut next = Instant::now();
    while Instant::now() < end {
        put_backend(&client, writes as usize % args.backends, 3000 + writes).await?;
        writes += 1;
        next += every;
        tokio::time::sleep_until(next.into()).await;
    }
    let churn_cpu = server.cpu_seconds() - cpu0;
    let churn_s = args.churn_s as f64;
    let base = versions(&envoys).await;
    let t = Instant::now();
    put_backend(&client, 0, 9999).await?;
    let after_ms = all_changed(&envoys, &base, t, timeout).await;
    let mut sorted = quiet_ms.clone();
    // Envoy waited for endpoints it was never sent (a rebuilt cluster warming to its 15 s
    // initial fetch timeout): the stall this lane found.
    let fetch_timeouts: usize = (0..args.envoys)
        .map(|i| {
            std::fs::read_to_string(dir.join(format!("envoy-{i}.log")))
                .unwrap_or_default()
                .matches("initial fetch timed out")
                .count()
        })
        .sum();
    report.rows.push(row!(
        "delta" => args.delta,
        "envoy_initial_fetch_timeouts" => fetch_timeouts,
        "envoys" => args.envoys,
        "backends" => args.backends,
        "write_to_all_envoys_ms_median" => measure::median(&mut sorted),
        "write_to_all_envoys_ms_max" => quiet_ms.iter().copied().fold(0.0, f64::max),
        "converged_writes" => quiet_ms.len(),
        "churn_writes_per_s" => writes as f64 / churn_s,
        "churn_server_cores" => churn_cpu / churn_s,
        "after_churn_write_ms" => after_ms.unwrap_or(f64::NAN),
        "server_peak_rss_mb" => server.memory().peak as f64 / MB,
    ));
    eprintln!(
        "etcd-lane: write → all Envoys {quiet_ms:?} ms; churn {writes} writes, {churn_cpu:.2} CPU-s; after churn {after_ms:?} ms; Envoy initial fetch timeouts {fetch_timeouts}"
    );
    for (p, _) in envoys {
        p.stop().await;
    }
    server.stop().await;
    etcd.stop().await;
    Ok(report)
}
