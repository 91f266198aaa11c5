//! Failover to a replica whose config moved on while Envoy was connected to
//! another one (invariants 2, 6): Envoy holds V1 (route → a); replica B has
//! since published V2 (route → b, cluster a removed). Envoy's xDS connection
//! is cut and lands on B. B knows from its snapshot history exactly what Envoy
//! holds (content-hash versions), so it adds b first, moves the route once b is
//! warm, and removes a last: zero non-2xx under continuous traffic.

mod common;

use std::time::Duration;

use ballast_testkit::{
    AdsMode, Envoy, EnvoyConfig, TcpProxy, Traffic, TrafficConfig, Upstream, http_get, wait_until,
};
use ballast_xds::SnapshotCache;

const T: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);

async fn failover_to_newer_replica(mode: AdsMode) {
    let a = Upstream::start("a").await.unwrap();
    let b = Upstream::start("b").await.unwrap();
    let v1 = || common::routed_snapshot("a", &[("a", &[a.addr()])]);
    let mut servers = Vec::new();
    for _ in 0..2 {
        let cache = SnapshotCache::new();
        cache.set_snapshot("g", v1());
        cache.set_ready(true);
        servers.push(common::start(cache, Duration::from_secs(30)).await);
    }
    let proxy = TcpProxy::start(vec![servers[0].addr]).await.unwrap();
    let envoy = Envoy::start(&EnvoyConfig::new(proxy.addr(), "envoy-resume", "g", mode))
        .await
        .unwrap();
    envoy.wait_live(T).await.unwrap();
    let addr = common::listener_addr(&envoy, "http").await;
    wait_until(T, POLL, || async {
        matches!(http_get(addr, "/").await, Ok((200, body)) if body == "a")
    })
    .await
    .unwrap();

    // Replica 1 moves on to V2 while Envoy is connected to replica 0.
    servers[1]
        .cache
        .set_snapshot("g", common::routed_snapshot("b", &[("b", &[b.addr()])]));
    let traffic = Traffic::start(TrafficConfig::new(addr, "web.example.com", "/").concurrency(3));
    wait_until(T, POLL, || async { traffic.report().ok_2xx >= 50 })
        .await
        .unwrap();
    proxy.set_backends(vec![servers[1].addr]);
    assert!(proxy.cut_all() >= 1);
    wait_until(T, POLL, || async {
        matches!(http_get(addr, "/").await, Ok((200, body)) if body == "b")
    })
    .await
    .unwrap();
    // a leaves Envoy only after nothing routes to it.
    wait_until(T, POLL, || async {
        envoy
            .config_summary(false)
            .await
            .is_ok_and(|s| !s.clusters.contains("a") && s.clusters.contains("b"))
    })
    .await
    .unwrap();
    let ok = traffic.report().ok_2xx;
    wait_until(T, POLL, || async { traffic.report().ok_2xx >= ok + 50 })
        .await
        .unwrap();
    let report = traffic.stop().await;
    eprintln!("{mode:?}: {report}");
    report.assert_all_ok();
    assert!(
        report.by_body.get("b").copied().unwrap_or(0) > 0,
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_failover_to_a_replica_with_newer_config() {
    failover_to_newer_replica(AdsMode::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_failover_to_a_replica_with_newer_config() {
    failover_to_newer_replica(AdsMode::DeltaGrpc).await;
}
