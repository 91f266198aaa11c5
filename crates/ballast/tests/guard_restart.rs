//! The blast-radius guard survives restarts (issue 16), with real Envoy:
//! 100 HTTPRoutes (distinct hosts, distinct backends) served; ballast is
//! killed; 80 route files go away; ballast starts again (or a fresh replica
//! takes over). During the settle period all 100 hosts still answer 200; after
//! it the 80 answer 404 if their files are still gone; if the files come back
//! during the settle period nothing is ever removed.
//!
//! The baseline is the state file (`--state-dir`), or, with the state file
//! deleted or on a fresh replica, what the reconnecting Envoy reports holding.

mod common;

use std::path::Path;
use std::time::Duration;

use ballast_testkit::{
    AdsMode, Envoy, EnvoyConfig, TcpProxy, Traffic, TrafficConfig, Upstream, wait_until,
};
use common::*;
use serde_json::Value;
use tokio::time::Instant;

const N: usize = 100;
const KEEP: usize = 20;
const SETTLE: Duration = Duration::from_secs(6);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Baseline {
    /// Restart with the state file in place.
    StateFile,
    /// Restart with the state file deleted: only Envoy's report.
    ClientReport,
    /// A second replica with its own (empty) state takes over.
    FreshReplica,
    /// Restart with `--no-guard`: nothing is held.
    Off,
}

fn route_file(dir: &Path, i: usize) -> std::path::PathBuf {
    dir.join(format!("r{i}.yaml"))
}

async fn pipeline(b: &Ballast) -> Value {
    let (_, body) = b.get("/debug/pipeline").await.unwrap();
    serde_json::from_str(&body).unwrap()
}

async fn scenario(mode: AdsMode, baseline: Baseline, come_back: bool) {
    let ups = [
        Upstream::start("u0").await.unwrap(),
        Upstream::start("u1").await.unwrap(),
    ];
    let gw_port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let stash = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gateway.yaml"), gateway(gw_port)).unwrap();
    let texts: Vec<String> = (0..N)
        .map(|i| {
            let (r, b) = (format!("r{i}"), format!("b{i}"));
            route(&r, &format!("h{i}.example.com"), &b) + &backend(&b, &[ups[i % ups.len()].addr()])
        })
        .collect();
    for (i, t) in texts.iter().enumerate() {
        std::fs::write(route_file(dir.path(), i), t).unwrap();
    }
    let config = dir.path().to_str().unwrap().to_string();
    let settle = format!("{}s", SETTLE.as_secs());
    let args = |state_dir: &Path, off: bool| -> Vec<String> {
        let mut a = vec![
            "--config".to_string(),
            config.clone(),
            "--guard-settle".into(),
            settle.clone(),
            "--state-dir".into(),
            state_dir.to_str().unwrap().into(),
        ];
        if off {
            a.push("--no-guard".into());
        }
        a
    };
    let (xds, admin) = (free_addr(), free_addr());
    let first_args = args(state.path(), false);
    let first_args: Vec<&str> = first_args.iter().map(|s| s.as_str()).collect();
    let mut ballast = Ballast::start(xds, admin, &first_args).unwrap();
    ballast.wait_ready().await.unwrap();
    // Envoy reaches ballast through a relay, so a replica can take over.
    let proxy = TcpProxy::start(vec![xds]).await.unwrap();
    let envoy = Envoy::start(&EnvoyConfig::new(
        proxy.addr(),
        "envoy-guard-restart",
        "default/edge",
        mode,
    ))
    .await
    .unwrap();
    let gw = loopback(gw_port);
    wait_until(T, POLL, || async {
        matches!(
            host_status(gw, &format!("h{}.example.com", N - 1)).await,
            Ok(200)
        ) && matches!(host_status(gw, "h0.example.com").await, Ok(200))
    })
    .await
    .unwrap();
    // The state file names what was published: 100 clusters, 100 routes.
    let state_file = state.path().join("guard-state.json");
    wait_until(T, POLL, || async {
        let Ok(text) = std::fs::read_to_string(&state_file) else {
            return false;
        };
        let v: Value = serde_json::from_str(&text).unwrap_or_default();
        let g = &v["gateways"]["default/edge"];
        v["format"] == 1
            && g["clusters"].as_array().map(|a| a.len()) == Some(N)
            && g["routes"].as_array().map(|a| a.len()) == Some(N)
    })
    .await
    .unwrap();

    let all: Vec<(String, String)> = (0..N)
        .map(|i| (format!("h{i}.example.com"), "/".to_string()))
        .collect();
    let traffic = Traffic::start(TrafficConfig::with_requests(gw, all).concurrency(2));

    ballast.kill();
    // While ballast is down, 80 of the 100 route files go away.
    for i in KEEP..N {
        std::fs::rename(route_file(dir.path(), i), stash.path().join(i.to_string())).unwrap();
    }
    let replica_state = tempfile::tempdir().unwrap();
    let (xds, admin, state_dir) = match baseline {
        Baseline::FreshReplica => (free_addr(), free_addr(), replica_state.path()),
        Baseline::ClientReport => {
            std::fs::remove_file(&state_file).unwrap();
            (xds, admin, state.path())
        }
        Baseline::StateFile | Baseline::Off => (xds, admin, state.path()),
    };
    proxy.set_backends(vec![xds]);
    let restarted = Instant::now();
    let next_args = args(state_dir, baseline == Baseline::Off);
    let next_args: Vec<&str> = next_args.iter().map(|s| s.as_str()).collect();
    ballast = Ballast::start(xds, admin, &next_args).unwrap();
    // Readiness is unchanged: ready once the source synced, held or not.
    ballast.wait_ready().await.unwrap();

    if baseline == Baseline::Off {
        // --no-guard turns all of it off: the removal applies at once.
        wait_until(T, POLL, || async {
            matches!(
                host_status(gw, &format!("h{}.example.com", N - 1)).await,
                Ok(404)
            )
        })
        .await
        .unwrap();
        for m in [
            "ballast_guard_holds_total",
            "ballast_guard_client_holds_total",
        ] {
            assert_eq!(ballast.metric(m).await.unwrap(), 0.0, "{m}");
        }
        assert_eq!(pipeline(&ballast).await["guard"]["enabled"], false);
        drop(traffic);
        return;
    }

    // The hold is visible, and says where its baseline comes from.
    wait_until(T, POLL, || async {
        let p = pipeline(&ballast).await;
        match baseline {
            Baseline::StateFile => {
                p["gateways"]["default/edge"]["held"]["origin"] == "restart"
                    && p["gateways"]["default/edge"]["held"]["reason"]
                        .as_str()
                        .unwrap_or("")
                        .contains("would remove 80 of 100 routes")
            }
            _ => {
                p["client_holds"][0]["origin"] == "client_report"
                    && p["client_holds"][0]["node"] == "envoy-guard-restart"
            }
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", ballast.log_tail()));
    match baseline {
        Baseline::StateFile => {
            assert_eq!(
                ballast
                    .metric("ballast_guard_restart_holds_total")
                    .await
                    .unwrap(),
                1.0
            );
            // Once Envoy has reconnected, it shows as waiting on the hold.
            wait_until(T, POLL, || async {
                let (_, status) = ballast.get("/debug/proxies").await.unwrap();
                status.contains("gateway default/edge is held by the blast-radius guard")
            })
            .await
            .unwrap();
        }
        _ => {
            assert_eq!(
                ballast.metric("ballast_guard_client_held").await.unwrap(),
                1.0
            );
            let reason = pipeline(&ballast).await["client_holds"][0]["reason"]
                .as_str()
                .unwrap()
                .to_string();
            assert!(reason.contains("remove 80 of the 100"), "{reason}");
        }
    }
    let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args(["status", "--admin-addr", &admin.to_string()])
        .output()
        .await
        .unwrap();
    let status = String::from_utf8_lossy(&status.stdout).to_string();
    let expected = match baseline {
        Baseline::StateFile => "judged against the state file",
        _ => "the proxy's own report",
    };
    assert!(status.contains(expected), "{status}");

    if come_back {
        // The files come back within the settle period: nothing is ever removed.
        for i in KEEP..N {
            std::fs::rename(stash.path().join(i.to_string()), route_file(dir.path(), i)).unwrap();
        }
        tokio::time::sleep_until(restarted + SETTLE + Duration::from_secs(3)).await;
        let report = traffic.stop().await;
        report.assert_all_ok();
        for stat in [
            "cluster_manager.cluster_removed",
            "listener_manager.listener_removed",
        ] {
            assert_eq!(envoy.stat(stat).await.unwrap(), Some(0), "{stat}");
        }
        assert_eq!(
            host_status(gw, &format!("h{}.example.com", N - 1))
                .await
                .unwrap(),
            200
        );
        return;
    }

    // Every hold lasts at least the settle period from the restart: until
    // shortly before its end, all 100 hosts still answer 200.
    tokio::time::sleep_until(restarted + SETTLE - Duration::from_secs(1)).await;
    let report = traffic.stop().await;
    report.assert_all_ok();
    assert!(report.total > 100, "{report}");
    // After it, the source wins: the 80 go, the 20 stay.
    wait_until(T, POLL, || async {
        matches!(
            host_status(gw, &format!("h{}.example.com", N - 1)).await,
            Ok(404)
        ) && matches!(
            host_status(gw, &format!("h{KEEP}.example.com")).await,
            Ok(404)
        )
    })
    .await
    .unwrap();
    for i in [0, KEEP - 1] {
        assert_eq!(
            host_status(gw, &format!("h{i}.example.com")).await.unwrap(),
            200
        );
    }
    wait_until(T, POLL, || async {
        ballast.metric("ballast_guard_held").await.unwrap_or(1.0) == 0.0
            && ballast
                .metric("ballast_guard_client_held")
                .await
                .unwrap_or(1.0)
                == 0.0
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_file_sotw_held_then_applied() {
    scenario(AdsMode::Grpc, Baseline::StateFile, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_file_delta_held_then_applied() {
    scenario(AdsMode::DeltaGrpc, Baseline::StateFile, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_file_sotw_files_come_back() {
    scenario(AdsMode::Grpc, Baseline::StateFile, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_file_delta_files_come_back() {
    scenario(AdsMode::DeltaGrpc, Baseline::StateFile, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_report_sotw_held_then_applied() {
    scenario(AdsMode::Grpc, Baseline::ClientReport, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_report_delta_held_then_applied() {
    scenario(AdsMode::DeltaGrpc, Baseline::ClientReport, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_report_sotw_files_come_back() {
    scenario(AdsMode::Grpc, Baseline::ClientReport, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_report_delta_files_come_back() {
    scenario(AdsMode::DeltaGrpc, Baseline::ClientReport, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_replica_sotw_held_then_applied() {
    scenario(AdsMode::Grpc, Baseline::FreshReplica, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_replica_delta_files_come_back() {
    scenario(AdsMode::DeltaGrpc, Baseline::FreshReplica, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_guard_turns_it_all_off() {
    scenario(AdsMode::DeltaGrpc, Baseline::Off, false).await;
}
