//! Metrics (issue 3 §6): after a real Envoy converges, `/metrics` shows it
//! connected, responses and ACKs per type, publish → ACK convergence,
//! translation time and the source synced. A config that passes ballast's
//! validation but that Envoy rejects (a regex over RE2's default program size
//! limit) is NACKed: the NACK counter, `/debug/proxies` and `ballast status`
//! show it, and Envoy keeps serving its last accepted config.

mod common;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, Upstream, wait_for, wait_until};
use common::*;
use serde_json::Value;

/// An HTTPRoute whose path regex Envoy rejects: RE2 program size ~900 > 100.
fn oversized_regex_route() -> String {
    "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: { name: greedy }
spec:
  parentRefs: [{ name: edge }]
  hostnames: [greedy.example.com]
  rules:
  - matches: [{ path: { type: RegularExpression, value: \"/x{900}\" } }]
    backendRefs: [{ group: ballast.dev, kind: Backend, name: web }]
"
    .to_string()
}

/// The type that carries routes: RDS, or VHDS for a Delta Envoy (route
/// configurations split into virtual hosts, docs/architecture.md §5.10).
fn routes_type(mode: AdsMode) -> &'static str {
    match mode {
        AdsMode::Grpc => "RDS",
        AdsMode::DeltaGrpc => "VHDS",
    }
}

async fn rds_state(ballast: &Ballast, ty: &str) -> Value {
    let (_, body) = ballast.get("/debug/proxies").await.unwrap();
    let v: Value = serde_json::from_str(&body).unwrap();
    v["proxies"][0]["types"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["type"] == ty)
        .cloned()
        .unwrap_or(Value::Null)
}

async fn scenario(mode: AdsMode) {
    let routes = routes_type(mode);
    let up = Upstream::start("web").await.unwrap();
    let gw_port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        gateway(gw_port) + &route("web", "web.example.com", "web") + &backend("web", &[up.addr()]),
    )
    .unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-metrics",
        "default/edge",
        mode,
    ))
    .await
    .unwrap();
    let gw = loopback(gw_port);
    wait_until(T, POLL, || async {
        matches!(host_status(gw, "web.example.com").await, Ok(200))
    })
    .await
    .unwrap();

    // Converged: every type ACKed, hence counted.
    for name in [
        "ballast_connected_proxies",
        "ballast_xds_responses_total",
        "ballast_xds_response_bytes_total",
        "ballast_xds_acks_total",
        "ballast_convergence_seconds_count",
        "ballast_xds_ack_latency_seconds_count",
        "ballast_translate_seconds_count",
        "ballast_snapshot_publishes_total",
        "ballast_source_synced",
        "ballast_ready",
    ] {
        wait_until(T, POLL, || async {
            ballast.metric(name).await.unwrap_or(0.0) > 0.0
        })
        .await
        .unwrap_or_else(|_| panic!("{name} stays 0"));
    }
    let (_, text) = ballast.get("/metrics").await.unwrap();
    for ty in ["CDS", "EDS", "LDS", "RDS"] {
        assert!(
            text.contains(&format!("ballast_xds_acks_total{{type=\"{ty}\"}}")),
            "ACKs of {ty}:\n{text}"
        );
    }
    assert_eq!(
        ballast.metric("ballast_connected_proxies").await.unwrap(),
        1.0
    );
    // Zero-valued counters are exported, not absent.
    assert!(
        text.contains("ballast_xds_nacks_total{type=\"RDS\"} 0"),
        "{text}"
    );
    assert!(text.contains("ballast_guard_holds_total{gateway=\"default/edge\"} 0"));
    assert!(text.contains("ballast_source_errors_total{source="));
    assert_eq!(
        ballast.metric("ballast_xds_nacks_total").await.unwrap(),
        0.0
    );
    assert_eq!(rds_state(&ballast, routes).await["state"], "SYNCED");

    // A route Envoy rejects. Ballast's validation accepts it (RE2's program
    // size limit is Envoy's), so it is published and NACKed.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ballast"))
        .arg("validate")
        .arg(dir.path().join("config.yaml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    write_atomic(&dir.path().join("greedy.yaml"), &oversized_regex_route());
    wait_until(T, POLL, || async {
        ballast
            .metric("ballast_xds_nacks_total")
            .await
            .unwrap_or(0.0)
            >= 1.0
    })
    .await
    .unwrap();
    let (_, text) = ballast.get("/metrics").await.unwrap();
    assert!(
        text.contains(&format!("ballast_xds_nacks_total{{type=\"{routes}\"}} 1")),
        "{text}"
    );
    let rds = rds_state(&ballast, routes).await;
    assert_eq!(rds["state"], "ERROR", "{rds}");
    let message = rds["nack"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("program size"), "{rds}");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args(["status", "--admin-addr", &ballast.admin.to_string()])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(
        table.contains(&format!("envoy-metrics {routes} NACK of")),
        "{table}"
    );
    // Envoy keeps its last accepted config.
    assert_eq!(host_status(gw, "web.example.com").await.unwrap(), 200);

    // Fixing the offending route: the next (different) version is sent and
    // accepted. (Deleting it instead would bring back exactly the version
    // Envoy still holds; nothing needs sending then.)
    write_atomic(
        &dir.path().join("greedy.yaml"),
        &oversized_regex_route().replace("/x{900}", "/x+"),
    );
    let rds = wait_for(T, POLL, || async {
        let rds = rds_state(&ballast, routes).await;
        anyhow::ensure!(rds["state"] == "SYNCED", "still {rds}");
        Ok(rds)
    })
    .await
    .unwrap();
    assert_eq!(rds["nack"], Value::Null, "{rds}");
    assert_eq!(host_status(gw, "web.example.com").await.unwrap(), 200);
    assert_eq!(host_status(gw, "greedy.example.com").await.unwrap(), 404);
    assert_eq!(
        ballast.metric("ballast_xds_nacks_total").await.unwrap(),
        1.0
    );
    drop(envoy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_sotw() {
    scenario(AdsMode::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_delta() {
    scenario(AdsMode::DeltaGrpc).await;
}
