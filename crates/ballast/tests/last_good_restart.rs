//! Per-object last known good survives a restart, with real Envoy (invariant 8): 10 routes
//! served; r3 gets an invalid field and r5's file a YAML syntax error while Ballast runs (both
//! keep serving); Ballast is restarted (SIGTERM, or SIGKILL) into that config. It serves r3
//! and r5 from the state dir (`--state-dir`, `last-good/`), reported as "restored from
//! state", so all 10 hosts answer 200 across the restart with no non-2xx; fixing r3 then
//! applies its new version.

mod common;

use std::path::Path;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, Traffic, TrafficConfig, Upstream, wait_until};
use common::*;
use serde_json::Value;

const N: usize = 10;

fn file(dir: &Path, i: usize) -> std::path::PathBuf {
    dir.join(format!("r{i}.yaml"))
}

/// Route `r{i}` (host `h{i}.example.com`) and its Backend `b{i}`, in one file.
fn text(i: usize, up: std::net::SocketAddr) -> String {
    route(
        &format!("r{i}"),
        &format!("h{i}.example.com"),
        &format!("b{i}"),
    ) + &backend(&format!("b{i}"), &[up])
}

async fn sources(b: &Ballast) -> Value {
    let (_, body) = b.get("/debug/sources").await.unwrap();
    serde_json::from_str(&body).unwrap()
}

fn errors(v: &Value) -> Vec<String> {
    v["sources"][0]["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            e.as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| e.to_string())
        })
        .collect()
}

async fn scenario(kill: bool) {
    let ups = [
        Upstream::start("u0").await.unwrap(),
        Upstream::start("u1").await.unwrap(),
    ];
    let gw_port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gateway.yaml"), gateway(gw_port)).unwrap();
    for i in 0..N {
        std::fs::write(file(dir.path(), i), text(i, ups[0].addr())).unwrap();
    }
    let args = [
        "--config",
        dir.path().to_str().unwrap(),
        "--state-dir",
        state.path().to_str().unwrap(),
    ];
    let (xds, admin) = (free_addr(), free_addr());
    let mut ballast = Ballast::start(xds, admin, &args).unwrap();
    ballast.wait_ready().await.unwrap();
    let envoy = Envoy::start(&EnvoyConfig::new(
        xds,
        "envoy-lkg-restart",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(gw_port);
    for i in 0..N {
        wait_host_body(gw, &format!("h{i}.example.com"), "u0")
            .await
            .unwrap();
    }
    // Every object's last good document is stored: the gateway, 10 routes, 10 backends, in
    // one group file per source file.
    let last_good = ballast_sources::last_good::dir_in(state.path());
    wait_until(T, POLL, || async {
        // Groups and journal together.
        let docs = ballast_sources::last_good::stored_documents(&last_good);
        let files: std::collections::BTreeSet<&String> = docs.iter().map(|d| &d.file).collect();
        (files.len(), docs.len()) == (1 + N, 1 + 2 * N)
    })
    .await
    .unwrap();

    // While running: r3 gets an invalid field, r5's file a YAML syntax error.
    write_atomic(
        &file(dir.path(), 3),
        &text(3, ups[0].addr()).replace("  rules:", "  typo: 1\n  rules:"),
    );
    write_atomic(
        &file(dir.path(), 5),
        &(text(5, ups[0].addr()) + "---\nkind: [HTTPRoute\n"),
    );
    wait_until(T, POLL, || async {
        let e = errors(&sources(&ballast).await);
        e.iter()
            .any(|e| e.contains("r3.yaml") && e.contains("typo"))
            && e.iter().any(|e| e.contains("r5.yaml"))
    })
    .await
    .unwrap();
    for i in [3, 5] {
        assert_eq!(
            host_get(gw, &format!("h{i}.example.com")).await.unwrap(),
            (200, "u0".to_string()),
            "r{i} keeps its last good version while running"
        );
    }

    let all: Vec<(String, String)> = (0..N)
        .map(|i| (format!("h{i}.example.com"), "/".to_string()))
        .collect();
    let traffic = Traffic::start(TrafficConfig::with_requests(gw, all).concurrency(2));
    if kill {
        ballast.kill();
    } else {
        ballast.terminate();
        assert!(
            ballast.wait_exit(T).is_some_and(|s| s.success()),
            "{}",
            ballast.log_tail()
        );
    }
    drop(ballast);
    let ballast = Ballast::start(xds, admin, &args).unwrap();
    ballast.wait_ready().await.unwrap();
    // Reported as a live fallback is, with "restored from state".
    let v = sources(&ballast).await;
    let errs = errors(&v);
    assert!(
        errs.iter()
            .any(|e| e.contains("r3.yaml")
                && e.contains("HTTPRoute default/r3: restored from state")),
        "{errs:#?}"
    );
    assert!(
        errs.iter()
            .any(|e| e.contains("r5.yaml:1:1: restored from state")),
        "{errs:#?}"
    );
    let r3 = v["sources"][0]["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "r3")
        .unwrap_or_else(|| panic!("{v:#}"));
    assert!(r3["serving"].as_str().unwrap().contains("r3.yaml"), "{r3}");
    assert!(
        ballast.metric("ballast_source_errors_total").await.unwrap() >= 1.0,
        "the errors metric counts the restored fallback"
    );
    // A good edit after the restart: once h10 answers, Envoy holds a route configuration
    // published by the restarted process, and r3 and r5 must still be in it.
    std::fs::write(file(dir.path(), N), text(N, ups[1].addr())).unwrap();
    wait_host_body(gw, &format!("h{N}.example.com"), "u1")
        .await
        .unwrap_or_else(|e| panic!("{e}: {}", ballast.log_tail()));
    let report = traffic.stop().await;
    report.assert_all_ok();
    assert!(report.total > N as u64, "{report}");
    for i in 0..N {
        assert_eq!(
            host_get(gw, &format!("h{i}.example.com")).await.unwrap(),
            (200, "u0".to_string()),
            "h{i} after the restart"
        );
    }
    for stat in [
        "listener_manager.listener_removed",
        "cluster_manager.cluster_removed",
    ] {
        assert_eq!(envoy.stat(stat).await.unwrap(), Some(0), "{stat}");
    }

    // Fixing r3 applies its new version (to u1), and its restored report goes away.
    write_atomic(&file(dir.path(), 3), &text(3, ups[1].addr()));
    wait_host_body(gw, "h3.example.com", "u1").await.unwrap();
    wait_until(T, POLL, || async {
        let e = errors(&sources(&ballast).await);
        !e.iter().any(|e| e.contains("r3.yaml")) && e.iter().any(|e| e.contains("r5.yaml"))
    })
    .await
    .unwrap();
    assert_eq!(
        host_get(gw, "h5.example.com").await.unwrap(),
        (200, "u0".to_string())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_route_and_broken_file_survive_sigterm_restart() {
    scenario(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_route_and_broken_file_survive_sigkill_restart() {
    scenario(true).await;
}
