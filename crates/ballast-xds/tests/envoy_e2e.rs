//! End-to-end with real Envoy 1.40: ADS over gRPC SotW and Delta, real HTTP
//! traffic through Envoy to upstreams started here, every non-2xx counted.

mod common;

use std::time::Duration;

use ballast_testkit::{
    AdsMode, Envoy, EnvoyConfig, Traffic, TrafficConfig, Upstream, http_get, wait_for, wait_until,
};
use ballast_xds::SnapshotCache;

const T: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);

async fn listener_addr(envoy: &Envoy) -> std::net::SocketAddr {
    wait_for(T, POLL, || async {
        envoy
            .listener_addrs()
            .await?
            .get("http")
            .copied()
            .ok_or_else(|| anyhow::anyhow!("listener http not there yet"))
    })
    .await
    .expect("listener http appears")
}

async fn basic_and_endpoint_move(mode: AdsMode) {
    let a = Upstream::start("a").await.unwrap();
    let b = Upstream::start("b").await.unwrap();
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", common::http_snapshot(&[("web", 1, &[a.addr()])]));
    cache.set_ready(true);
    let server = common::start(cache.clone(), Duration::from_secs(30)).await;
    let envoy = Envoy::start(&EnvoyConfig::new(server.addr, "envoy-a", "g", mode))
        .await
        .unwrap();
    envoy.wait_live(T).await.unwrap();
    let addr = listener_addr(&envoy).await;

    let traffic =
        Traffic::start(TrafficConfig::new(addr, "web.example.com", "/").max_requests(200));
    let report = traffic.wait().await;
    report.assert_all_ok();
    assert_eq!(report.by_body.get("a").copied(), Some(200), "{report}");

    // Move the endpoints: traffic follows, without errors.
    cache.set_snapshot("g", common::http_snapshot(&[("web", 1, &[b.addr()])]));
    wait_until(T, POLL, || async {
        matches!(http_get(addr, "/").await, Ok((200, body)) if body == "b")
    })
    .await
    .unwrap();
    let traffic =
        Traffic::start(TrafficConfig::new(addr, "web.example.com", "/").max_requests(100));
    let report = traffic.wait().await;
    report.assert_all_ok();
    assert_eq!(report.by_body.get("b").copied(), Some(100), "{report}");
    // The listener and cluster were never replaced.
    assert_eq!(
        envoy
            .stat("listener_manager.listener_removed")
            .await
            .unwrap(),
        Some(0)
    );
    assert_eq!(
        envoy.stat("cluster_manager.cluster_removed").await.unwrap(),
        Some(0)
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_serves_traffic_and_moves_endpoints() {
    basic_and_endpoint_move(AdsMode::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_serves_traffic_and_moves_endpoints() {
    basic_and_endpoint_move(AdsMode::DeltaGrpc).await;
}
