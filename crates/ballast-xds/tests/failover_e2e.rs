//! Issue 2, proof b — disconnect/reconnect and failover (invariants 2, 5).
//!
//! Two server instances, each with its own cache holding an independently
//! built copy of the same snapshot, sit behind one TCP proxy that round-robins
//! connections. Envoy's ADS connection goes through the proxy and is cut
//! repeatedly while HTTP traffic flows. Because versions are content hashes,
//! a reconnect — to either replica — must cost Envoy nothing: zero non-2xx,
//! no listener or cluster removed or even modified, and no response carrying
//! anything: one empty response per new stream (issue 8 §1, so Envoy resets
//! its reconnect backoff).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use ballast_testkit::{
    AdsMode, Envoy, EnvoyConfig, TcpProxy, Traffic, TrafficConfig, Upstream, wait_for, wait_until,
};
use ballast_xds::{SnapshotCache, SyncState};
use common::{EventLog, Running};

const T: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);
const CUTS: usize = 8;
const NODE: &str = "envoy-failover";

/// Envoy counters that change when it adds, replaces or removes a listener or
/// cluster, or accepts/rejects an update of a type.
const WATCHED: &[&str] = &[
    "listener_manager.listener_added",
    "listener_manager.listener_modified",
    "listener_manager.listener_removed",
    "listener_manager.listener_create_success",
    "listener_manager.lds.update_success",
    "listener_manager.lds.update_rejected",
    "cluster_manager.cluster_added",
    "cluster_manager.cluster_modified",
    "cluster_manager.cluster_removed",
    "cluster_manager.cluster_updated",
    "cluster_manager.cds.update_success",
    "cluster_manager.cds.update_rejected",
    "cluster.web.update_success",
    "cluster.web.update_rejected",
    "http.http.rds.routes.config_reload",
    "http.http.rds.routes.update_success",
    "http.http.rds.routes.update_rejected",
];

async fn watched_stats(envoy: &Envoy) -> BTreeMap<String, u64> {
    let all = envoy.stats().await.unwrap();
    WATCHED
        .iter()
        .map(|n| (n.to_string(), all.get(*n).copied().unwrap_or(0)))
        .collect()
}

/// Waits until Envoy's xDS session has settled on a stream other than `prev`:
/// exactly one open stream for the node across both servers, every type
/// Envoy uses (CDS, EDS, LDS, RDS) requested on it, nothing in flight.
/// Returns (server index, stream id).
async fn settled(servers: &[&Running], prev: Option<(usize, u64)>) -> (usize, u64) {
    wait_for(T, POLL, || async {
        let mut open = Vec::new();
        for (i, s) in servers.iter().enumerate() {
            if let Some(n) = s.server.registry().node(NODE) {
                for (id, _) in &n.streams {
                    open.push((i, *id, n.types.clone()));
                }
            }
        }
        anyhow::ensure!(open.len() == 1, "{} streams open", open.len());
        let (i, id, types) = open.pop().unwrap();
        anyhow::ensure!(Some((i, id)) != prev, "still the old stream");
        anyhow::ensure!(types.len() == 4, "{} types requested so far", types.len());
        anyhow::ensure!(
            types.iter().all(|t| t.state != SyncState::Stale),
            "responses in flight: {:?}",
            types.iter().map(|t| (t.ty, t.state)).collect::<Vec<_>>()
        );
        Ok((i, id))
    })
    .await
    .expect("xDS session settles")
}

async fn failover(mode: AdsMode) {
    let web = Upstream::start("web").await.unwrap();
    // Separate caches, each snapshot built on its own: only content hashing
    // makes them agree.
    let logs = [EventLog::new(), EventLog::new()];
    let mut servers = Vec::new();
    for log in &logs {
        let cache = SnapshotCache::new();
        cache.set_snapshot("g", common::http_snapshot(&[("web", 1, &[web.addr()])]));
        cache.set_ready(true);
        servers.push(common::start_with(cache, Duration::from_secs(30), log.observer()).await);
    }
    let (s0, s1) = (&servers[0], &servers[1]);
    for ty in ballast_xds::ResourceType::ALL {
        assert_eq!(
            s0.server.cache().snapshot("g").unwrap().version(ty),
            s1.server.cache().snapshot("g").unwrap().version(ty),
        );
    }
    let proxy = TcpProxy::start(vec![s0.addr, s1.addr]).await.unwrap();
    let envoy = Envoy::start(&EnvoyConfig::new(proxy.addr(), NODE, "g", mode))
        .await
        .unwrap();
    envoy.wait_live(T).await.unwrap();
    let addr = common::listener_addr(&envoy, "http").await;
    let mut at = settled(&[s0, s1], None).await;
    let mut served_by = vec![at.0];

    let before = watched_stats(&envoy).await;
    let sent_before: Vec<usize> = logs.iter().map(EventLog::len).collect();

    let traffic = Traffic::start(TrafficConfig::new(addr, "web.example.com", "/"));
    let progress = |n: u64| {
        let t = &traffic;
        async move {
            wait_until(T, POLL, || {
                let ok = t.report().ok_2xx;
                async move { ok >= n }
            })
            .await
            .expect("traffic flows")
        }
    };
    progress(20).await;
    for _ in 0..CUTS {
        let accepted = proxy.connections_accepted();
        assert!(proxy.cut_all() >= 1, "Envoy's xDS connection was live");
        wait_until(T, POLL, || async {
            proxy.connections_accepted() > accepted && proxy.live() >= 1
        })
        .await
        .expect("Envoy reconnects");
        at = settled(&[s0, s1], Some(at)).await;
        served_by.push(at.0);
        let ok = traffic.report().ok_2xx;
        progress(ok + 20).await;
    }
    let report = traffic.stop().await;
    let after = watched_stats(&envoy).await;
    // (resources, removed) of every response after the initial sync.
    let responses: Vec<(usize, usize)> = logs
        .iter()
        .zip(&sent_before)
        .flat_map(|(l, from)| l.events().split_off(*from))
        .filter_map(|e| match e {
            ballast_xds::XdsEvent::ResponseSent {
                resources, removed, ..
            } => Some((resources, removed)),
            _ => None,
        })
        .collect();
    eprintln!(
        "{mode:?}: {CUTS} cuts, streams served by {served_by:?}, {} connections accepted\n\
         {report}responses sent after the initial sync (per server): {responses:?}\n\
         Envoy stats before cuts: {before:?}\nafter: {after:?}",
        proxy.connections_accepted()
    );

    report.assert_all_ok();
    assert!(
        served_by.contains(&0) && served_by.contains(&1),
        "both replicas served Envoy: {served_by:?}"
    );
    for name in [
        "listener_manager.listener_removed",
        "cluster_manager.cluster_removed",
    ] {
        assert_eq!(after[name], 0, "{name}");
    }
    // Nothing was replaced, and no type was even updated: a reconnect to
    // either replica resends nothing Envoy already has. Each new stream gets
    // one empty response (so Envoy resets its reconnect backoff), no more.
    assert_eq!(
        before, after,
        "Envoy's listener/cluster/route counters moved"
    );
    assert_eq!(
        responses,
        vec![(0, 0); CUTS],
        "responses sent on reconnects: (resources, removed)"
    );
    assert_eq!(
        envoy.stat("control_plane.connected_state").await.unwrap(),
        Some(1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_failover_between_replicas_changes_nothing() {
    failover(AdsMode::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_failover_between_replicas_changes_nothing() {
    failover(AdsMode::DeltaGrpc).await;
}
