//! A modified cluster (same name, new settings, same endpoints) must finish
//! warming at once: Envoy rebuilds the cluster and waits for its endpoints
//! again, re-requesting EDS names it already had. A server that stays silent
//! leaves the new cluster warming until Envoy's initial fetch timeout (15 s by
//! default; forever with the `0s` the test bootstraps use).

mod common;

use std::time::Duration;

use ballast_testkit::{
    AdsMode, Envoy, EnvoyConfig, Traffic, TrafficConfig, Upstream, http_get, wait_until,
};
use ballast_xds::{Snapshot, SnapshotCache, simple};

const T: Duration = Duration::from_secs(30);
/// Bound for a modified cluster to finish warming. Answered, it takes
/// milliseconds; unanswered, Envoy waits out a 15 s fetch timeout, which this
/// bound (well above any scheduling noise) tells apart.
const WARM: Duration = Duration::from_secs(8);
const POLL: Duration = Duration::from_millis(20);

fn snapshot(connect_timeout_ms: u64, upstream: std::net::SocketAddr) -> Snapshot {
    let ip = upstream.ip().to_string();
    Snapshot::builder()
        .with(&simple::eds_cluster(
            "web",
            Duration::from_millis(connect_timeout_ms),
        ))
        .unwrap()
        .with(&simple::load_assignment(
            "web",
            &[(ip.as_str(), upstream.port())],
        ))
        .unwrap()
        .with(&simple::http_listener("http", "127.0.0.1", 0, "routes"))
        .unwrap()
        .with(&simple::route_config("routes", &[("*", &[("web", 1)])]))
        .unwrap()
        .build()
        .unwrap()
}

async fn modified_cluster_warms(mode: AdsMode) {
    let up = Upstream::start("web").await.unwrap();
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", snapshot(500, up.addr()));
    cache.set_ready(true);
    let server = common::start(cache.clone(), Duration::from_secs(30)).await;
    let envoy = Envoy::start(&EnvoyConfig::new(server.addr, "envoy-cu", "g", mode))
        .await
        .unwrap();
    envoy.wait_live(T).await.unwrap();
    let addr = common::listener_addr(&envoy, "http").await;
    wait_until(T, POLL, || async {
        matches!(http_get(addr, "/").await, Ok((200, _)))
    })
    .await
    .unwrap();
    let traffic = Traffic::start(TrafficConfig::new(addr, "web.example.com", "/"));
    for (round, ms) in [700u64, 900, 1100].into_iter().enumerate() {
        cache.set_snapshot("g", snapshot(ms, up.addr()));
        let want = format!("{}.{:03}s", ms / 1000, ms % 1000);
        wait_until(WARM, POLL, || async {
            let Ok(dump) = envoy.config_dump(false).await else {
                return false;
            };
            let text = dump.to_string();
            envoy
                .stat("cluster_manager.warming_clusters")
                .await
                .ok()
                .flatten()
                == Some(0)
                && text.contains(&format!("\"connect_timeout\":\"{want}\""))
        })
        .await
        .unwrap_or_else(|e| panic!("round {round}: modified cluster did not finish warming: {e}"));
    }
    traffic.stop().await.assert_all_ok();
    assert_eq!(
        envoy
            .stat("cluster_manager.cluster_modified")
            .await
            .unwrap(),
        Some(3)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_modified_cluster_warms() {
    modified_cluster_warms(AdsMode::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_modified_cluster_warms() {
    modified_cluster_warms(AdsMode::DeltaGrpc).await;
}
