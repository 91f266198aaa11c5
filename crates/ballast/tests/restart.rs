//! The restart scenario (issue 3): 3,400 HTTPRoutes with distinct hostnames,
//! Envoy fully programmed and under continuous traffic; ballast is SIGKILLed and
//! restarted three times. Zero non-2xx, and Envoy's stats show no listener,
//! route or cluster removed (nor modified: versions are content hashes, so a
//! restarted ballast sends a resuming Envoy nothing it already has).
//! A second variant makes the initial sync slow: Envoy receives nothing until
//! it has finished.

mod common;

use std::time::Duration;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, Traffic, TrafficConfig, Upstream, wait_until};
use common::*;

const ROUTES: usize = 3400;

async fn scenario(mode: AdsMode) {
    let ups = [
        Upstream::start("u0").await.unwrap(),
        Upstream::start("u1").await.unwrap(),
    ];
    let addrs: Vec<_> = ups.iter().map(|u| u.addr()).collect();
    let gw_port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        many_routes(gw_port, ROUTES, &addrs),
    )
    .unwrap();
    let config = dir.path().to_str().unwrap().to_string();
    let (xds, admin) = (free_addr(), free_addr());
    let mut ballast = Ballast::start(xds, admin, &["--config", &config]).unwrap();
    ballast.wait_ready().await.unwrap();

    let envoy = Envoy::start(&EnvoyConfig::new(
        xds,
        "envoy-restart",
        "default/edge",
        mode,
    ))
    .await
    .unwrap();
    let gw = loopback(gw_port);
    // Fully programmed: the last route answers.
    wait_until(T, POLL, || async {
        matches!(
            host_status(gw, &format!("h{}.example.com", ROUTES - 1)).await,
            Ok(200)
        )
    })
    .await
    .unwrap();

    let sample: Vec<(String, String)> = (0..ROUTES)
        .step_by(ROUTES / 50)
        .map(|i| (format!("h{i}.example.com"), "/".to_string()))
        .collect();
    let traffic = Traffic::start(TrafficConfig::with_requests(gw, sample).concurrency(2));

    for round in 0..3 {
        ballast.kill();
        // Envoy notices the broken stream while traffic keeps flowing.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let args: Vec<&str> = if round == 2 {
            // Slow initial sync: nothing may be sent before it finishes.
            vec!["--config", &config, "--initial-sync-delay", "5s"]
        } else {
            vec!["--config", &config]
        };
        ballast = Ballast::start(xds, admin, &args).unwrap();
        if round == 2 {
            // Envoy reconnects while ballast is not ready: held, not answered.
            wait_until(T, POLL, || async {
                ballast
                    .metric("ballast_connected_proxies")
                    .await
                    .unwrap_or(0.0)
                    >= 1.0
            })
            .await
            .unwrap();
            let (code, _) = ballast.get("/readyz").await.unwrap();
            assert_eq!(code, 503, "still in the slow initial sync");
            // Connected, but nothing was sent while not ready.
            assert_eq!(
                ballast.metric("ballast_xds_responses_total").await.unwrap(),
                0.0
            );
        }
        ballast.wait_ready().await.unwrap();
        wait_until(T, POLL, || async {
            ballast
                .metric("ballast_connected_proxies")
                .await
                .unwrap_or(0.0)
                >= 1.0
        })
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let report = traffic.stop().await;
    report.assert_all_ok();
    assert!(report.total > 100, "{report}");
    for stat in [
        "listener_manager.listener_removed",
        "cluster_manager.cluster_removed",
        "listener_manager.listener_modified",
        "cluster_manager.cluster_modified",
    ] {
        assert_eq!(envoy.stat(stat).await.unwrap(), Some(0), "{stat}");
    }
    // Every route is still there.
    let summary = envoy.config_summary(false).await.unwrap();
    assert_eq!(
        summary
            .clusters
            .iter()
            .filter(|c| c.as_str() != "xds_cluster")
            .count(),
        ROUTES
    );
    assert_eq!(host_status(gw, "h0.example.com").await.unwrap(), 200);
    assert_eq!(
        host_status(gw, &format!("h{}.example.com", ROUTES - 1))
            .await
            .unwrap(),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_sotw() {
    scenario(AdsMode::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_delta() {
    scenario(AdsMode::DeltaGrpc).await;
}
