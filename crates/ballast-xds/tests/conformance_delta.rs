//! Delta (incremental) xDS conformance: each protocol rule (DESIGN §4) checked
//! with an in-process client over real gRPC.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use ballast_xds::ResourceType::{
    Cluster as CDS, ClusterLoadAssignment as EDS, Listener as LDS, RouteConfiguration as RDS,
};
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use common::client::Delta;
use common::{fixture, ready_paced_server, ready_server};

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
    // Every subscribed name is answered.
    let r = c.recv().await;
    assert_eq!(names(&r), ["a"]);
    c.ack(&r).await;
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
    // Removals wait for the listeners and routes (which may use z).
    c2.subscribe(ballast_xds::ResourceType::Listener, &[], &[])
        .await;
    c2.subscribe(RDS, &["r1"], &[]).await;
    let (mut got, mut removed) = (Vec::new(), Vec::new());
    while removed.is_empty() {
        let r = c2.recv().await;
        if r.type_url == CDS.type_url() {
            got.extend(names(&r).into_iter().map(String::from));
            removed.extend(r.removed_resources.clone());
        }
        c2.ack(&r).await;
    }
    assert_eq!(got, ["b", "c"], "only what differs");
    assert_eq!(removed, ["z"]);
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
    c.subscribed(EDS, &["a"]).await;
    c.subscribe(EDS, &[], &["a"]).await;
    c.expect_quiet().await;
    c.subscribe(EDS, &["a"], &[]).await;
    assert_eq!(names(&c.recv().await), ["a"]);
}

#[tokio::test]
async fn nack_is_recorded_and_not_resent() {
    let (cache, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribed(EDS, &["a"]).await;
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
    c.subscribed(CDS, &[]).await;
    c.subscribed(EDS, &["a"]).await;
    c.subscribed(RDS, &["r1"]).await;
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
    c.subscribed(EDS, &["a"]).await;
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

/// Issue #8: an upsert in flight while its name is unsubscribed is not held
/// once ACKed; subscribing again is answered with the resource.
#[tokio::test]
async fn resubscribe_after_unsubscribe_with_update_in_flight_is_answered() {
    let (cache, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribed(EDS, &["a"]).await;
    cache.set_snapshot("g", fixture(&["a"], "a", 2));
    let r2 = c.recv().await;
    assert_eq!(names(&r2), ["a"]);
    // The client unsubscribes before the update reaches it, then ACKs it.
    c.subscribe(EDS, &[], &["a"]).await;
    c.ack(&r2).await;
    c.expect_quiet().await;
    c.subscribe(EDS, &["a"], &[]).await;
    let r3 = c.recv().await;
    assert_eq!(names(&r3), ["a"], "a re-subscription is answered");
    assert_eq!(r3.resources[0].version, r2.resources[0].version);
}

/// Issue #8: a subscription to a name the client already receives (through
/// the wildcard) is answered too: Envoy waits for the server on it.
#[tokio::test]
async fn subscribing_to_a_held_name_is_answered() {
    let (_cache, s) = ready_server(fixture(&["a", "b"], "a", 1)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribed(CDS, &["*"]).await;
    c.subscribe(CDS, &["a"], &[]).await;
    assert_eq!(names(&c.recv().await), ["a"]);
}

/// Issue #8: Envoy's CDS and LDS apply the valid resources of a response they
/// NACK (and its removals), so the resources of a NACKed response may be held.
/// Each is sent again alone, which settles it; the ones held are removed when
/// they go away.
#[tokio::test]
async fn resources_of_a_nacked_response_are_settled_and_removed_when_they_go_away() {
    let (cache, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribe(CDS, &[], &[]).await;
    let r = c.recv().await;
    assert_eq!(names(&r), ["a"]);
    c.ack(&r).await;
    cache.set_snapshot("g", fixture(&["a", "x", "y"], "a", 1));
    let bad = c.recv().await;
    assert_eq!(names(&bad), ["x", "y"]);
    // y is invalid, x was applied (as Envoy's CDS does).
    c.nack(&bad).await;
    let r = c.recv().await;
    assert_eq!(names(&r), ["x"], "sent again alone");
    c.ack(&r).await;
    let r = c.recv().await;
    assert_eq!(names(&r), ["y"], "sent again alone");
    c.nack(&r).await;
    c.expect_quiet().await;
    cache.set_snapshot("g", fixture(&["a"], "a", 1));
    let r = c.recv().await;
    assert!(r.resources.is_empty());
    // x is held; y was rejected twice but is removed too (a client may
    // reject what it accepted before, so it is never assumed absent).
    assert_eq!(r.removed_resources, ["x", "y"]);
    c.ack(&r).await;
    c.expect_quiet().await;
}

/// Issue #8: a NACKed response's resources are neither held nor absent:
/// removed when they go away even before they are settled.
#[tokio::test]
async fn maybe_held_resources_are_removed_when_they_go_away() {
    let (cache, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribed(CDS, &[]).await;
    cache.set_snapshot("g", fixture(&["a", "x", "y"], "a", 1));
    let bad = c.recv().await;
    assert_eq!(names(&bad), ["x", "y"]);
    // Gone before the client's NACK arrives.
    cache.set_snapshot("g", fixture(&["a"], "a", 1));
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.nack(&bad).await;
    let r = c.recv().await;
    assert!(r.resources.is_empty());
    assert_eq!(r.removed_resources, ["x", "y"]);
    c.ack(&r).await;
    c.expect_quiet().await;
}

/// A snapshot with the cluster `cluster(name)` and a load assignment for each
/// of `names`, listener l1 and route configuration r1 to `route_to`.
fn clusters_snapshot(
    names: &[&str],
    route_to: &str,
    cluster: impl Fn(&str) -> ballast_xds::envoy_types::pb::envoy::config::cluster::v3::Cluster,
) -> ballast_xds::Snapshot {
    use ballast_xds::simple;
    let mut b = ballast_xds::Snapshot::builder();
    for n in names {
        b.message(&cluster(n)).unwrap();
        b.message(&simple::load_assignment(n, &[("127.0.0.1", 1)]))
            .unwrap();
    }
    b.message(&simple::http_listener("l1", "127.0.0.1", 0, "r1"))
        .unwrap();
    b.message(&simple::route_config("r1", &[("*", &[(route_to, 1)])]))
        .unwrap();
    b.build().unwrap()
}

/// [`fixture`] whose cluster `x` has a connect timeout of `x_timeout` seconds
/// (another version of the cluster).
fn with_x(names: &[&str], route_to: &str, x_timeout: u64) -> ballast_xds::Snapshot {
    clusters_snapshot(names, route_to, |n| {
        let t = if n == "x" { x_timeout } else { 1 };
        ballast_xds::simple::eds_cluster(n, Duration::from_secs(t))
    })
}

/// Issue #8: a route to a cluster that came in a NACKed response is not sent
/// until the cluster is re-sent (alone) and ACKed, and its endpoints delivered.
#[tokio::test]
async fn routes_wait_for_clusters_of_a_nacked_response() {
    let (cache, s) = ready_server(with_x(&["a"], "a", 1)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribed(CDS, &[]).await;
    c.subscribed(EDS, &["a"]).await;
    c.subscribed(RDS, &["r1"]).await;
    // x and y come together, with a route to x; the client rejects the clusters.
    cache.set_snapshot("g", with_x(&["a", "x", "y"], "x", 1));
    let bad = c.recv().await;
    assert_eq!(names(&bad), ["x", "y"]);
    c.nack(&bad).await;
    let mut x_acked = false;
    let mut eds_x = false;
    loop {
        let r = c.recv().await;
        if r.type_url == CDS.type_url() {
            assert_eq!(r.resources.len(), 1, "settled one at a time");
            if names(&r) == ["x"] {
                c.ack(&r).await;
                x_acked = true;
                c.subscribe(EDS, &["x"], &[]).await;
            } else {
                c.nack(&r).await;
            }
        } else if r.type_url == EDS.type_url() {
            assert!(x_acked);
            assert_eq!(names(&r), ["x"]);
            c.ack(&r).await;
            eds_x = true;
        } else {
            assert_eq!(r.type_url, RDS.type_url());
            assert!(
                x_acked && eds_x,
                "the route came before x was held and warm"
            );
            c.ack(&r).await;
            break;
        }
    }
}

/// Issue #8: legacy wildcard is only an empty first request: a first request
/// that only unsubscribes is not one.
#[tokio::test]
async fn first_request_with_only_unsubscribe_is_not_wildcard() {
    let (_cache, s) = ready_server(fixture(&["a", "b"], "a", 1)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribe(CDS, &[], &["zz"]).await;
    // The stream's one no-op response (invariant 2): no resources, so no wildcard.
    let r = c.recv().await;
    assert!(r.resources.is_empty() && r.removed_resources.is_empty());
    c.ack(&r).await;
    c.expect_quiet().await;
    c.subscribe(CDS, &["b"], &[]).await;
    assert_eq!(names(&c.recv().await), ["b"]);
}

/// Issue #8: `"*"` is the wildcard wherever it sorts among the names.
#[tokio::test]
async fn wildcard_is_recognised_anywhere_in_the_list() {
    let (_cache, s) = ready_server(fixture(&["a", "b"], "a", 1)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    // "!x" sorts before "*".
    c.subscribe(CDS, &["!x", "*"], &[]).await;
    let r = c.recv().await;
    assert_eq!(names(&r), ["a", "b"]);
    assert_eq!(r.removed_resources, ["!x"]);
}

/// Issue #8: with wildcard and an explicit name, unsubscribing the name is
/// answered: the resource stays (the wildcard covers it) and is sent again.
#[tokio::test]
async fn unsubscribing_a_name_the_wildcard_covers_is_answered() {
    let (_cache, s) = ready_server(fixture(&["a", "b"], "a", 1)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribe(CDS, &["*", "a", "ghost"], &[]).await;
    let r = c.recv().await;
    assert_eq!(names(&r), ["a", "b"]);
    assert_eq!(r.removed_resources, ["ghost"]);
    c.ack(&r).await;
    c.expect_quiet().await;
    c.subscribe(CDS, &[], &["a"]).await;
    let r = c.recv().await;
    assert_eq!(names(&r), ["a"]);
    assert!(r.removed_resources.is_empty());
    c.ack(&r).await;
    c.expect_quiet().await;
    // A name that does not exist is answered as removed.
    c.subscribe(CDS, &[], &["ghost"]).await;
    let r = c.recv().await;
    assert!(r.resources.is_empty());
    assert_eq!(r.removed_resources, ["ghost"]);
}

/// Clusters `names` of about `bytes` each (a long stat name), EDS load
/// assignments for them, and route r1 to `route_to`.
fn big_clusters(names: &[&str], bytes: usize, route_to: &str) -> ballast_xds::Snapshot {
    clusters_snapshot(names, route_to, |n| {
        let mut c = ballast_xds::simple::eds_cluster(n, Duration::from_secs(1));
        c.alt_stat_name = n.repeat(bytes / n.len());
        c
    })
}

/// Issue #8: a Delta response over 4 MiB (the clients' default gRPC limit;
/// this client keeps it) is split into several, each with its own nonce and
/// ACK; a route to a cluster of a later part waits for that part (and the
/// cluster's endpoints).
#[tokio::test]
async fn responses_over_4_mib_are_split() {
    let (cache, s) = ready_server(big_clusters(&["a"], 16, "a")).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribed(CDS, &[]).await;
    c.subscribed(EDS, &["a"]).await;
    c.subscribed(RDS, &["r1"]).await;
    c.expect_quiet().await;
    // 6 clusters of 1 MiB: 6 MiB of CDS.
    let big = ["b0", "b1", "b2", "b3", "b4", "b5"];
    cache.set_snapshot("g", big_clusters(&big, 1 << 20, "b5"));
    let mut got: Vec<String> = Vec::new();
    let mut nonces = std::collections::BTreeSet::new();
    let mut parts = 0;
    while got.len() < big.len() {
        let r = c.recv().await;
        assert_eq!(r.type_url, CDS.type_url(), "the route waits for b5");
        assert!(r.removed_resources.is_empty(), "a is still routed to");
        assert!(
            nonces.insert(r.nonce.clone()),
            "each part has its own nonce"
        );
        got.extend(names(&r).into_iter().map(String::from));
        parts += 1;
        // Nothing else comes before this part is ACKed.
        c.expect_quiet().await;
        c.ack(&r).await;
    }
    got.sort();
    assert_eq!(got, big);
    assert!(parts >= 2, "{parts} parts");
    c.subscribe(EDS, &big, &["a"]).await;
    let r = c.recv().await;
    assert_eq!(r.type_url, EDS.type_url());
    assert_eq!(names(&r), big);
    c.ack(&r).await;
    let r = c.recv().await;
    assert_eq!(r.type_url, RDS.type_url());
    c.ack(&r).await;
    let r = c.recv().await;
    assert_eq!(r.type_url, CDS.type_url());
    assert_eq!(r.removed_resources, ["a"]);
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
    c.subscribed(LDS, &[]).await;
    c.subscribe(RDS, &["r1"], &[]).await;
    let rds = c.recv().await;
    assert_eq!(rds.type_url, RDS.type_url());
    assert_eq!(
        names(&rds),
        ["r1"],
        "the route is not held for x's endpoints"
    );
}

/// Publish pacing (`push_interval`): a publish soon after the stream took a
/// snapshot is not pushed at once; once the interval is over, the stream
/// pushes the newest snapshot only, skipping the ones in between.
#[tokio::test]
async fn paced_publishes_are_pushed_once_at_the_newest_version() {
    let (cache, s) = ready_paced_server(fixture(&["a"], "a", 1), Duration::from_secs(5)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribed(EDS, &["a"]).await;
    cache.set_snapshot("g", fixture(&["a"], "a", 2));
    c.expect_quiet().await;
    let newest = fixture(&["a"], "a", 3);
    let want = newest.get(EDS, "a").unwrap().version().to_string();
    cache.set_snapshot("g", newest);
    let r = c.recv().await;
    assert_eq!(names(&r), ["a"]);
    assert_eq!(
        r.resources[0].version, want,
        "one push, at the newest version"
    );
    c.ack(&r).await;
    c.expect_quiet().await;
}

/// Pacing holds interval after interval: the stream's pace timer is armed
/// once and moved at each take, so every later interval again defers a
/// publish made right after a push and then pushes only the newest one.
#[tokio::test]
async fn pacing_repeats_every_interval() {
    let (cache, s) = ready_paced_server(fixture(&["a"], "a", 1), Duration::from_secs(2)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribed(EDS, &["a"]).await;
    for round in 0..3u16 {
        cache.set_snapshot("g", fixture(&["a"], "a", 10 * round + 2));
        c.expect_quiet().await;
        let newest = fixture(&["a"], "a", 10 * round + 3);
        let want = newest.get(EDS, "a").unwrap().version().to_string();
        cache.set_snapshot("g", newest);
        let r = c.recv().await;
        assert_eq!(names(&r), ["a"]);
        assert_eq!(r.resources[0].version, want, "round {round}: the newest");
        c.ack(&r).await;
    }
    c.expect_quiet().await;
}

/// A publish that changes only the type whose response is in flight is not
/// taken at once (nothing of it could be sent before the ACK); the ACK then
/// brings it, at the newest version. A change of an idle type on the same
/// stream is pushed without waiting for that ACK.
#[tokio::test]
async fn a_publish_while_in_flight_goes_out_with_the_ack() {
    let (cache, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut c = Delta::connect(s.addr, "n").await;
    c.subscribe(CDS, &[], &[]).await;
    let cds = c.recv().await;
    c.ack(&cds).await;
    c.subscribe(EDS, &["a"], &[]).await;
    let r1 = c.recv().await;
    assert_eq!(names(&r1), ["a"]);
    // r1 not ACKed: endpoint changes wait for it.
    cache.set_snapshot("g", fixture(&["a"], "a", 2));
    let newest = fixture(&["a"], "a", 3);
    let want = newest.get(EDS, "a").unwrap().version().to_string();
    cache.set_snapshot("g", newest);
    c.expect_quiet().await;
    c.ack(&r1).await;
    let r2 = c.recv().await;
    assert_eq!(names(&r2), ["a"]);
    assert_eq!(r2.resources[0].version, want, "the newest, after the ACK");
    // r2 in flight; a cluster added (CDS idle) goes out now.
    cache.set_snapshot("g", fixture(&["a", "b"], "a", 3));
    let r3 = c.recv().await;
    assert_eq!(r3.type_url, CDS.type_url());
    assert_eq!(names(&r3), ["b"]);
}
