//! The resume guard as a library feature (issue 16): a server configured with
//! `XdsServerBuilder::resume_guard` does not strip a reconnecting client in its
//! first push. The client reports holding 10 clusters; the server (a fresh
//! replica, say) has only 2. Nothing is sent until the source comes back
//! (Delta) or the settle period passes (SotW); events say so.

mod common;

use std::time::Duration;

use ballast_xds::ResourceType::{
    Cluster as CDS, ClusterLoadAssignment as EDS, Listener as LDS, RouteConfiguration as RDS,
};
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use ballast_xds::{ResumeGuardConfig, ResumeRelease};
use ballast_xds::{SnapshotCache, XdsEvent, XdsServer};
use common::client::{Delta, Sotw};
use common::{EventLog, fixture};
use tokio::net::TcpListener;

const ALL: [&str; 10] = ["c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9"];

async fn start(cache: SnapshotCache, settle: Duration, log: &EventLog) -> std::net::SocketAddr {
    common::init_tracing();
    let server = XdsServer::builder(cache)
        .grouper(common::one_group())
        .observer(log.observer())
        .resume_guard(Some(ResumeGuardConfig {
            max_removal: 0.5,
            settle,
        }))
        .build();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(server.serve_with_shutdown(listener, std::future::pending()));
    addr
}

fn held(log: &EventLog) -> Vec<String> {
    log.events()
        .into_iter()
        .filter_map(|e| match e {
            XdsEvent::ResumeHeld { reason, .. } => Some(reason),
            _ => None,
        })
        .collect()
}

fn released(log: &EventLog) -> Vec<ResumeRelease> {
    log.events()
        .into_iter()
        .filter_map(|e| match e {
            XdsEvent::ResumeReleased { why, .. } => Some(why),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn delta_first_push_held_until_the_source_comes_back() {
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", fixture(&ALL[..2], "c0", 1));
    cache.set_ready(true);
    let log = EventLog::new();
    let addr = start(cache.clone(), Duration::from_secs(60), &log).await;

    let mut c = Delta::connect(addr, "n1").await;
    for (ty, names) in [
        (CDS, &ALL[..]),
        (EDS, &ALL[..]),
        (LDS, &["l1"][..]),
        (RDS, &["r1"][..]),
    ] {
        c.send(DeltaDiscoveryRequest {
            type_url: ty.type_url().into(),
            resource_names_subscribe: if ty == EDS || ty == RDS {
                names.iter().map(|s| s.to_string()).collect()
            } else {
                vec![]
            },
            initial_resource_versions: names
                .iter()
                .map(|n| (n.to_string(), "old".to_string()))
                .collect(),
            ..Default::default()
        })
        .await;
    }
    // Without the guard, CDS would remove c2..c9 at once.
    c.expect_quiet().await;
    let reasons = held(&log);
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(
        reasons[0].contains("remove 8 of the 10 CDS"),
        "{}",
        reasons[0]
    );

    // The source comes back: delivered at once, removing nothing.
    cache.set_snapshot("g", fixture(&ALL, "c0", 1));
    let resp = c.recv().await;
    assert!(resp.removed_resources.is_empty(), "{resp:?}");
    assert_eq!(released(&log), vec![ResumeRelease::SourceChanged]);
}

#[tokio::test]
async fn sotw_first_push_held_for_the_settle_period() {
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", fixture(&ALL[..2], "c0", 1));
    cache.set_ready(true);
    let log = EventLog::new();
    let addr = start(cache.clone(), Duration::from_secs(2), &log).await;

    let mut c = Sotw::connect(addr, "n1").await;
    // SotW CDS says only a version (one this server never published): the
    // EDS request names the clusters.
    c.request(CDS, &[], "old-cds", "").await;
    c.request(EDS, &ALL, "old-eds", "").await;
    c.request(LDS, &[], "old-lds", "").await;
    c.request(RDS, &["r1"], "old-rds", "").await;
    c.expect_quiet().await;
    let reasons = held(&log);
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(
        reasons[0].contains("remove 8 of the 10 EDS"),
        "{}",
        reasons[0]
    );
    // The source still says so after the settle period: it wins.
    let resp = c.recv().await;
    assert_eq!(resp.type_url, CDS.type_url());
    assert_eq!(resp.resources.len(), 2);
    assert_eq!(released(&log), vec![ResumeRelease::SettleElapsed]);
}

#[tokio::test]
async fn fresh_clients_and_small_removals_are_not_held() {
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", fixture(&ALL[..6], "c0", 1));
    cache.set_ready(true);
    let log = EventLog::new();
    let addr = start(cache.clone(), Duration::from_secs(60), &log).await;

    // A client holding nothing gets its config at once.
    let mut fresh = Sotw::connect(addr, "fresh").await;
    fresh.request(CDS, &[], "", "").await;
    assert_eq!(fresh.recv().await.resources.len(), 6);

    // A reconnecting client losing 4 of 10 (under the share) is not held.
    let mut c = Delta::connect(addr, "n1").await;
    for ty in [CDS, EDS, LDS, RDS] {
        let names: &[&str] = match ty {
            CDS | EDS => &ALL,
            LDS => &["l1"],
            _ => &["r1"],
        };
        c.send(DeltaDiscoveryRequest {
            type_url: ty.type_url().into(),
            resource_names_subscribe: if ty == EDS || ty == RDS {
                names.iter().map(|s| s.to_string()).collect()
            } else {
                vec![]
            },
            initial_resource_versions: names
                .iter()
                .map(|n| (n.to_string(), "old".to_string()))
                .collect(),
            ..Default::default()
        })
        .await;
    }
    let resp = c.recv().await;
    assert_eq!(resp.type_url, CDS.type_url());
    assert!(held(&log).is_empty(), "{:?}", held(&log));
}
