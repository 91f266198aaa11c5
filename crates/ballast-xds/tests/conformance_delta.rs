//! Delta (incremental) xDS conformance: each protocol rule (architecture.md §5) checked
//! with an in-process client over real gRPC.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use ballast_xds::ResourceType::{
    Cluster as CDS, ClusterLoadAssignment as EDS, Listener as LDS, RouteConfiguration as RDS,
};
use ballast_xds::SnapshotCache;
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use common::client::Delta;
use common::fixture;

const GRACE: Duration = Duration::from_secs(30);

async fn ready_server(snap: ballast_xds::Snapshot) -> (SnapshotCache, common::Running) {
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", snap);
    cache.set_ready(true);
    let server = common::start(cache.clone(), GRACE).await;
    (cache, server)
}

fn names(r: &DeltaDiscoveryResponse) -> Vec<&str> {
    r.resources.iter().map(|r| r.name.as_str()).collect()
}

#[tokio::test]
async fn legacy_wildcard_then_only_changes() {
    let (cache, s) = ready_server(fixture(&["a", "b"], "a", 1)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribe(CDS, &[], &[]).await;
    let r1 = c.recv().await;
    assert_eq!(names(&r1), ["a", "b"]);
    assert!(r1.resources.iter().all(|r| !r.version.is_empty()));
    c.ack(&r1).await;
    c.expect_quiet().await;
    // Cluster c added: only c is sent.
    cache.set_snapshot("g", fixture(&["a", "b", "c"], "a", 1));
    let r2 = c.recv().await;
    assert_eq!(names(&r2), ["c"]);
    assert!(r2.removed_resources.is_empty());
    c.ack(&r2).await;
    // Cluster b deleted: named in removed_resources.
    cache.set_snapshot("g", fixture(&["a", "c"], "a", 1));
    let r3 = c.recv().await;
    assert!(r3.resources.is_empty());
    assert_eq!(r3.removed_resources, ["b"]);
}

#[tokio::test]
async fn named_subscription_and_never_existing_names_are_removed() {
    let (_c, s) = ready_server(fixture(&["a", "b"], "a", 1)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribe(EDS, &["b", "ghost"], &[]).await;
    let r = c.recv().await;
    assert_eq!(names(&r), ["b"]);
    assert_eq!(
        r.removed_resources,
        ["ghost"],
        "a name that never existed is reported removed"
    );
    c.ack(&r).await;
    c.expect_quiet().await;
    // Subscribing to ghost again is answered again.
    c.subscribe(EDS, &["ghost"], &[]).await;
    let r = c.recv().await;
    assert_eq!(r.removed_resources, ["ghost"]);
}

#[tokio::test]
async fn explicit_wildcard_can_be_removed() {
    let (cache, s) = ready_server(fixture(&["a", "b"], "a", 1)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribe(CDS, &["*"], &[]).await;
    let r = c.recv().await;
    assert_eq!(names(&r), ["a", "b"]);
    c.ack(&r).await;
    c.subscribe(CDS, &["a"], &["*"]).await;
    c.expect_quiet().await;
    // Only a is still subscribed: new cluster c is not sent, b's removal is not sent.
    cache.set_snapshot("g", fixture(&["a", "c"], "a", 5));
    c.expect_quiet().await;
    // Subscribing to the wildcard again brings c (b is gone, a is current).
    c.subscribe(CDS, &["*"], &[]).await;
    let r = c.recv().await;
    assert_eq!(names(&r), ["c"]);
    assert!(r.removed_resources.is_empty());
}

#[tokio::test]
async fn initial_resource_versions_are_honoured() {
    let (_c, s) = ready_server(fixture(&["a", "b", "c"], "a", 1)).await;
    // Learn the versions.
    let mut c1 = Delta::connect(s.addr, "n1").await;
    c1.subscribe(CDS, &[], &[]).await;
    let full = c1.recv().await;
    let versions: BTreeMap<String, String> = full
        .resources
        .iter()
        .map(|r| (r.name.clone(), r.version.clone()))
        .collect();
    // A reconnecting client that has a (current), b (outdated) and z (deleted).
    let mut c2 = Delta::connect(s.addr, "n2").await;
    let mut initial = BTreeMap::new();
    initial.insert("a".to_string(), versions["a"].clone());
    initial.insert("b".to_string(), "outdated".to_string());
    initial.insert("z".to_string(), "whatever".to_string());
    c2.send(DeltaDiscoveryRequest {
        type_url: CDS.type_url().into(),
        initial_resource_versions: initial.into_iter().collect(),
        ..Default::default()
    })
    .await;
    let r = c2.recv().await;
    assert_eq!(names(&r), ["b", "c"], "only what differs");
    assert_eq!(r.removed_resources, ["z"]);
    // A client that has everything current gets nothing re-sent (its one
    // empty response waits for the EDS request its clusters say is coming).
    let mut c3 = Delta::connect(s.addr, "n3").await;
    c3.send(DeltaDiscoveryRequest {
        type_url: CDS.type_url().into(),
        initial_resource_versions: versions.into_iter().collect(),
        ..Default::default()
    })
    .await;
    c3.expect_quiet().await;
}

#[tokio::test]
async fn unsubscribe_then_resubscribe_resends() {
    let (_c, s) = ready_server(fixture(&["a", "b"], "a", 1)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribe(EDS, &["a"], &[]).await;
    let r = c.recv().await;
    c.ack(&r).await;
    c.subscribe(EDS, &[], &["a"]).await;
    c.expect_quiet().await;
    c.subscribe(EDS, &["a"], &[]).await;
    assert_eq!(names(&c.recv().await), ["a"]);
}

#[tokio::test]
async fn nack_is_recorded_and_not_resent() {
    let (cache, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribe(EDS, &["a"], &[]).await;
    let r = c.recv().await;
    c.ack(&r).await;
    cache.set_snapshot("g", fixture(&["a"], "a", 2));
    let bad = c.recv().await;
    c.nack(&bad).await;
    c.expect_quiet().await;
    let node = s.server.registry().node("n").unwrap();
    let eds = node.types.iter().find(|t| t.ty == EDS).unwrap();
    assert_eq!(eds.nack.as_ref().unwrap().message, "rejected by test");
    cache.set_snapshot("g", fixture(&["a"], "a", 2));
    c.expect_quiet().await;
    cache.set_snapshot("g", fixture(&["a"], "a", 3));
    let good = c.recv().await;
    assert_ne!(good.resources[0].version, bad.resources[0].version);
}

#[tokio::test]
async fn make_before_break_on_delta_ads() {
    let (cache, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribe(CDS, &[], &[]).await;
    let r = c.recv().await;
    c.ack(&r).await;
    c.subscribe(EDS, &["a"], &[]).await;
    let r = c.recv().await;
    c.ack(&r).await;
    c.subscribe(RDS, &["r1"], &[]).await;
    let r = c.recv().await;
    c.ack(&r).await;
    c.expect_quiet().await;

    cache.set_snapshot("g", fixture(&["b"], "b", 1));
    let cds = c.recv().await;
    assert_eq!(cds.type_url, CDS.type_url());
    assert_eq!(names(&cds), ["b"]);
    assert!(cds.removed_resources.is_empty(), "a is still routed to");
    c.ack(&cds).await;
    c.expect_quiet().await;
    c.subscribe(EDS, &["b"], &[]).await;
    let eds = c.recv().await;
    assert_eq!(names(&eds), ["b"]);
    c.ack(&eds).await;
    let rds = c.recv().await;
    assert_eq!(rds.type_url, RDS.type_url());
    c.ack(&rds).await;
    // Now nothing references a: its endpoints and the cluster can go.
    let mut removed = Vec::new();
    for _ in 0..2 {
        let r = c.recv().await;
        removed.push((r.type_url.clone(), r.removed_resources.clone()));
        c.ack(&r).await;
    }
    removed.sort();
    assert_eq!(
        removed,
        [
            (CDS.type_url().to_string(), vec!["a".to_string()]),
            (EDS.type_url().to_string(), vec!["a".to_string()])
        ]
    );
}

#[tokio::test]
async fn nack_state_clears_when_config_returns_to_what_the_client_kept() {
    let (cache, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribe(EDS, &["a"], &[]).await;
    let r = c.recv().await;
    c.ack(&r).await;
    cache.set_snapshot("g", fixture(&["a"], "a", 2));
    let bad = c.recv().await;
    c.nack(&bad).await;
    c.expect_quiet().await;
    cache.set_snapshot("g", fixture(&["a"], "a", 1));
    c.expect_quiet().await;
    let node = s.server.registry().node("n").unwrap();
    let eds = node.types.iter().find(|t| t.ty == EDS).unwrap();
    assert!(eds.nack.is_none());
    assert_eq!(eds.state, ballast_xds::SyncState::Synced);
    // The rejected version is still never resent; a new one is.
    cache.set_snapshot("g", fixture(&["a"], "a", 3));
    assert_eq!(names(&c.recv().await), ["a"]);
}

/// Issue 8 §2: an empty first subscription is wildcard only for LDS and CDS;
/// for EDS it means "not interested". Naming resources later delivers them.
#[tokio::test]
async fn empty_first_eds_subscription_is_not_wildcard() {
    let (_c, s) = ready_server(fixture(&["a", "b"], "a", 1)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribe(EDS, &[], &[]).await;
    let r0 = c.recv().await;
    assert!(names(&r0).is_empty(), "{:?}", names(&r0));
    assert!(r0.removed_resources.is_empty());
    c.ack(&r0).await;
    c.expect_quiet().await;
    c.subscribe(EDS, &["a", "b"], &[]).await;
    assert_eq!(names(&c.recv().await), ["a", "b"]);
}

/// Issue 8 §1: Envoy resets its reconnect backoff only when a stream delivers
/// a message. A stream resumed at the current versions gets exactly one
/// response, with no resources and no removals; on ADS it goes on EDS, whose
/// request the client's clusters announce (Envoy gives an empty update only
/// to wildcard watches, so nothing happens at all).
#[tokio::test]
async fn resumed_stream_gets_one_empty_response() {
    let (_c, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut c1 = Delta::connect(s.addr, "n").await;
    let mut held = std::collections::HashMap::new();
    for (ty, sub) in [
        (CDS, &[][..]),
        (EDS, &["a"][..]),
        (LDS, &[][..]),
        (RDS, &["r1"][..]),
    ] {
        c1.subscribe(ty, sub, &[]).await;
        let r = c1.recv().await;
        c1.ack(&r).await;
        let versions: BTreeMap<String, String> = r
            .resources
            .iter()
            .map(|x| (x.name.clone(), x.version.clone()))
            .collect();
        held.insert(ty, (sub, versions));
    }
    c1.expect_quiet().await;
    drop(c1);
    let mut c = Delta::connect(s.addr, "n").await;
    let first = |ty| {
        let (sub, versions): &(&[&str], BTreeMap<String, String>) = &held[&ty];
        DeltaDiscoveryRequest {
            type_url: ballast_xds::ResourceType::type_url(ty).into(),
            resource_names_subscribe: sub.iter().map(|x| x.to_string()).collect(),
            initial_resource_versions: versions.clone().into_iter().collect(),
            ..Default::default()
        }
    };
    c.send(first(CDS)).await;
    c.expect_quiet().await;
    for ty in [EDS, LDS, RDS] {
        c.send(first(ty)).await;
    }
    let r = c.recv().await;
    assert_eq!(r.type_url, EDS.type_url());
    assert!(r.resources.is_empty() && r.removed_resources.is_empty());
    c.ack(&r).await;
    c.expect_quiet().await;
}

/// Issue 8 §2: a cluster whose endpoints come from another config source
/// (here an ApiConfigSource) is warm as far as this stream can tell: the
/// route to it is sent once the client holds the cluster.
#[tokio::test]
async fn route_to_a_cluster_with_endpoints_from_elsewhere_is_not_held() {
    use ballast_xds::envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
    use ballast_xds::envoy_types::pb::envoy::config::core::v3::{ApiConfigSource, ConfigSource};
    use ballast_xds::simple;
    let mut x = simple::eds_cluster("x", Duration::from_secs(1));
    x.eds_cluster_config.as_mut().unwrap().eds_config = Some(ConfigSource {
        config_source_specifier: Some(ConfigSourceSpecifier::ApiConfigSource(
            ApiConfigSource::default(),
        )),
        ..Default::default()
    });
    let mut b = ballast_xds::Snapshot::builder();
    b.message(&x).unwrap();
    b.message(&simple::http_listener("l1", "127.0.0.1", 0, "r1"))
        .unwrap();
    b.message(&simple::route_config("r1", &[("*", &[("x", 1)])]))
        .unwrap();
    let (_c, s) = ready_server(b.build().unwrap()).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribe(CDS, &[], &[]).await;
    let cds = c.recv().await;
    assert_eq!(names(&cds), ["x"]);
    c.ack(&cds).await;
    c.subscribe(LDS, &[], &[]).await;
    let lds = c.recv().await;
    c.ack(&lds).await;
    c.subscribe(RDS, &["r1"], &[]).await;
    let rds = c.recv().await;
    assert_eq!(rds.type_url, RDS.type_url());
    assert_eq!(
        names(&rds),
        ["r1"],
        "the route is not held for x's endpoints"
    );
}
