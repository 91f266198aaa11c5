//! Issue 2, proof c — make before break (invariant 6) under continuous load.
//!
//! In ONE publish the route moves from cluster A to a new cluster B (new EDS
//! cluster, new endpoints) and A disappears. Envoy must get B and its
//! endpoints before the route, and lose A only after the route stopped using
//! it: not a single non-2xx. Repeated back and forth (A→B→C→A→B), and in a
//! variant where the route moves to a cluster whose endpoints change in the
//! same publish: the old endpoints must never see a request.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use ballast_testkit::{
    AdsMode, Envoy, EnvoyConfig, Traffic, TrafficConfig, TrafficReport, Upstream, http_get,
    wait_until,
};
use ballast_xds::{Snapshot, SnapshotCache};

const T: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);

struct Setup {
    cache: SnapshotCache,
    envoy: Envoy,
    addr: SocketAddr,
    _server: common::Running,
}

async fn setup(mode: AdsMode, node: &str, first: Snapshot) -> Setup {
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", first);
    cache.set_ready(true);
    let server = common::start(cache.clone(), Duration::from_secs(30)).await;
    let envoy = Envoy::start(&EnvoyConfig::new(server.addr, node, "g", mode))
        .await
        .unwrap();
    envoy.wait_live(T).await.unwrap();
    let addr = common::listener_addr(&envoy, "http").await;
    Setup {
        cache,
        envoy,
        addr,
        _server: server,
    }
}

/// Continuous load: 4 keep-alive loops, 1 ms apart.
fn load(addr: SocketAddr) -> Traffic {
    Traffic::start(
        TrafficConfig::new(addr, "web.example.com", "/")
            .concurrency(4)
            .pause(Duration::from_millis(1)),
    )
}

/// Waits until `traffic` has `n` more 2xx responses than now.
async fn progress(traffic: &Traffic, n: u64) {
    let target = traffic.report().ok_2xx + n;
    wait_until(T, POLL, || {
        let ok = traffic.report().ok_2xx;
        async move { ok >= target }
    })
    .await
    .expect("traffic flows");
}

fn delta(from: &TrafficReport, to: &TrafficReport) -> BTreeMap<String, u64> {
    to.by_body
        .iter()
        .map(|(b, n)| (b.clone(), n - from.by_body.get(b).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Publishes `snap`, whose only cluster is `cluster` (answered by upstream
/// `body`), and waits until Envoy holds exactly that cluster and traffic
/// reaches it; then checks that every further request goes there.
async fn move_to(s: &Setup, traffic: &Traffic, snap: Snapshot, cluster: &str, body: &str) {
    s.cache.set_snapshot("g", snap);
    s.envoy
        .wait_until_config(T, false, |c| {
            c.clusters.len() == 1 && c.clusters.contains(cluster) && c.warming_clusters.is_empty()
        })
        .await
        .unwrap();
    wait_until(T, POLL, || async {
        matches!(http_get(s.addr, "/").await, Ok((200, b)) if b == body)
    })
    .await
    .unwrap();
    // Let requests started before the move finish, then look at a clean window.
    progress(traffic, 10).await;
    let before = traffic.report();
    progress(traffic, 50).await;
    let window = delta(&before, &traffic.report());
    assert_eq!(
        window.keys().collect::<Vec<_>>(),
        vec![body],
        "after moving to {cluster}, all traffic goes to {body}: {window:?}"
    );
    // A is gone from Envoy's config, and its endpoints with it.
    let summary = s.envoy.config_summary(true).await.unwrap();
    assert_eq!(
        summary.endpoints.keys().collect::<Vec<_>>(),
        vec![cluster],
        "{summary:?}"
    );
}

async fn removed_counters(envoy: &Envoy) -> (u64, u64) {
    (
        envoy
            .stat("listener_manager.listener_removed")
            .await
            .unwrap()
            .unwrap_or(0),
        envoy
            .stat("cluster_manager.cluster_removed")
            .await
            .unwrap()
            .unwrap_or(0),
    )
}

/// A → B → C → A → B, each move one publish that adds the new cluster, points
/// the route at it and removes the old one.
async fn route_moves_to_new_cluster(mode: AdsMode) {
    let ups = [
        Upstream::start("a").await.unwrap(),
        Upstream::start("b").await.unwrap(),
        Upstream::start("c").await.unwrap(),
    ];
    let clusters = ["svc-a", "svc-b", "svc-c"];
    let only = |i: usize| common::routed_snapshot(clusters[i], &[(clusters[i], &[ups[i].addr()])]);
    let s = setup(mode, "envoy-mbb", only(0)).await;
    let traffic = load(s.addr);
    progress(&traffic, 20).await;
    let moves = [1, 2, 0, 1, 2, 0, 1, 2];
    for &i in &moves {
        move_to(&s, &traffic, only(i), clusters[i], ups[i].name()).await;
    }
    let report = traffic.stop().await;
    let (listeners_removed, clusters_removed) = removed_counters(&s.envoy).await;
    eprintln!(
        "{mode:?}: {} moves; listeners removed {listeners_removed}, clusters removed {clusters_removed}\n{report}",
        moves.len()
    );
    report.assert_all_ok();
    assert_eq!(listeners_removed, 0);
    // Exactly the old cluster went away on each move.
    assert_eq!(clusters_removed, moves.len() as u64);
    let summary = s.envoy.config_summary(false).await.unwrap();
    assert_eq!(
        summary.clusters.iter().collect::<Vec<_>>(),
        vec![clusters[moves[moves.len() - 1]]],
        "{summary:?}"
    );
}

/// The route moves to a cluster that already exists while that cluster's
/// endpoints change in the same publish (and the old cluster goes). The
/// endpoints must change before the route does: the stale endpoints never
/// see a request.
async fn route_moves_while_endpoints_change(mode: AdsMode) {
    let a = Upstream::start("a").await.unwrap();
    let b_old = Upstream::start("b-old").await.unwrap();
    let b_new = Upstream::start("b-new").await.unwrap();
    let c_old = Upstream::start("c-old").await.unwrap();
    let c_new = Upstream::start("c-new").await.unwrap();
    let s = setup(
        mode,
        "envoy-mbb-eds",
        common::routed_snapshot(
            "svc-a",
            &[("svc-a", &[a.addr()]), ("svc-b", &[b_old.addr()])],
        ),
    )
    .await;
    s.envoy
        .wait_until_config(T, true, |c| c.clusters.len() == 2 && c.endpoints.len() == 2)
        .await
        .unwrap();
    let traffic = load(s.addr);
    progress(&traffic, 20).await;

    // svc-b: b-old → b-new, route → svc-b, svc-a removed: one publish.
    move_to(
        &s,
        &traffic,
        common::routed_snapshot("svc-b", &[("svc-b", &[b_new.addr()])]),
        "svc-b",
        "b-new",
    )
    .await;
    // Stage svc-c on c-old, then the same move again, the other way round.
    s.cache.set_snapshot(
        "g",
        common::routed_snapshot(
            "svc-b",
            &[("svc-b", &[b_new.addr()]), ("svc-c", &[c_old.addr()])],
        ),
    );
    s.envoy
        .wait_until_config(T, true, |c| {
            c.clusters.len() == 2 && c.endpoints.get("svc-c").is_some_and(|e| e.len() == 1)
        })
        .await
        .unwrap();
    progress(&traffic, 20).await;
    move_to(
        &s,
        &traffic,
        common::routed_snapshot("svc-c", &[("svc-c", &[c_new.addr()])]),
        "svc-c",
        "c-new",
    )
    .await;

    let report = traffic.stop().await;
    let (listeners_removed, clusters_removed) = removed_counters(&s.envoy).await;
    eprintln!(
        "{mode:?}: hits a={} b-old={} b-new={} c-old={} c-new={}; listeners removed \
         {listeners_removed}, clusters removed {clusters_removed}\n{report}",
        a.hits(),
        b_old.hits(),
        b_new.hits(),
        c_old.hits(),
        c_new.hits()
    );
    report.assert_all_ok();
    assert_eq!(b_old.hits(), 0, "stale endpoints of svc-b were used");
    assert_eq!(c_old.hits(), 0, "stale endpoints of svc-c were used");
    assert_eq!((listeners_removed, clusters_removed), (0, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_route_moves_to_new_cluster_without_errors() {
    route_moves_to_new_cluster(AdsMode::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_route_moves_to_new_cluster_without_errors() {
    route_moves_to_new_cluster(AdsMode::DeltaGrpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_route_moves_while_endpoints_change() {
    route_moves_while_endpoints_change(AdsMode::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_route_moves_while_endpoints_change() {
    route_moves_while_endpoints_change(AdsMode::DeltaGrpc).await;
}
