//! State-of-the-World conformance: each xDS protocol rule (architecture.md §5) checked
//! with an in-process client over real gRPC.

mod common;

use std::time::Duration;

use ballast_xds::ResourceType::{
    Cluster as CDS, ClusterLoadAssignment as EDS, Listener as LDS, RouteConfiguration as RDS,
};
use ballast_xds::SnapshotCache;
use common::client::Sotw;
use common::{fixture, names, ready_paced_server, ready_server};

const GRACE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn legacy_wildcard_gets_full_state_and_nonces_are_per_response() {
    let (_c, s) = ready_server(fixture(&["a", "b"], "a", 1)).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    c.request(CDS, &[], "", "").await;
    let r1 = c.recv().await;
    assert_eq!(names(&r1), ["a", "b"]);
    assert!(!r1.nonce.is_empty() && !r1.version_info.is_empty());
    c.request(LDS, &[], "", "").await;
    let r2 = c.recv().await;
    assert_eq!(names(&r2), ["l1"]);
    assert_ne!(r1.nonce, r2.nonce, "nonces are unique on a stream");
}

#[tokio::test]
async fn explicit_wildcard_plus_names_and_named_only() {
    let (_c, s) = ready_server(fixture(&["a", "b"], "a", 1)).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    c.request(CDS, &["*", "zzz"], "", "").await;
    assert_eq!(names(&c.recv().await), ["a", "b"]);
    c.request(EDS, &["b"], "", "").await;
    assert_eq!(
        names(&c.recv().await),
        ["b"],
        "named types get only what is named"
    );
}

#[tokio::test]
async fn ack_is_not_answered_and_changes_are_pushed() {
    let (cache, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    let r = c.synced(EDS, &["a"]).await;
    c.expect_quiet().await;
    cache.set_snapshot("g", fixture(&["a"], "a", 2));
    let r2 = c.recv().await;
    assert_eq!(names(&r2), ["a"]);
    assert_ne!(r2.version_info, r.version_info);
}

#[tokio::test]
async fn stale_nonce_is_ignored() {
    let (cache, s) = ready_server(fixture(&["a", "b"], "a", 1)).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    let r1 = c.synced(EDS, &["a"]).await;
    cache.set_snapshot("g", fixture(&["a", "b"], "a", 2));
    let r2 = c.recv().await;
    // A request carrying the older nonce asks for "b": it must be ignored.
    c.request(EDS, &["a", "b"], &r1.version_info, &r1.nonce)
        .await;
    c.expect_quiet().await;
    // With the latest nonce the same request is honoured. EDS responses
    // group resources like Delta: "a", which the client holds at this
    // version, is not repeated (absence removes nothing for EDS/RDS/SDS).
    c.request(EDS, &["a", "b"], &r2.version_info, &r2.nonce)
        .await;
    let r3 = c.recv().await;
    assert_eq!(names(&r3), ["b"]);
    assert_ne!(r3.version_info, r2.version_info);
}

#[tokio::test]
async fn newly_subscribed_names_are_always_answered_even_if_absent() {
    let (_c, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    let r1 = c.synced(EDS, &["a"]).await;
    c.expect_quiet().await;
    // "missing" does not exist: the client still gets an answer, with
    // nothing it does not already hold ("a" is not repeated).
    c.request(EDS, &["a", "missing"], &r1.version_info, &r1.nonce)
        .await;
    let r2 = c.recv().await;
    assert!(names(&r2).is_empty(), "{:?}", names(&r2));
    assert_ne!(r2.nonce, r1.nonce);
}

#[tokio::test]
async fn named_then_empty_unsubscribes_everything() {
    let (cache, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    let r1 = c.synced(EDS, &["a"]).await;
    // An empty list after names unsubscribes (it is not wildcard): nothing to
    // answer, and later changes are not pushed.
    c.request(EDS, &[], &r1.version_info, &r1.nonce).await;
    c.expect_quiet().await;
    cache.set_snapshot("g", fixture(&["a"], "a", 3));
    c.expect_quiet().await;
    // Subscribing again is answered with the current content.
    c.request(EDS, &["a"], &r1.version_info, &r1.nonce).await;
    let r2 = c.recv().await;
    assert_eq!(names(&r2), ["a"]);
    assert_ne!(r2.version_info, r1.version_info);
}

#[tokio::test]
async fn full_state_cds_drops_removed_clusters() {
    let (cache, s) = ready_server(fixture(&["a", "b"], "a", 1)).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    c.synced(CDS, &[]).await;
    cache.set_snapshot("g", fixture(&["a"], "a", 1));
    let r2 = c.recv().await;
    assert_eq!(names(&r2), ["a"], "a CDS response is the full state");
}

#[tokio::test]
async fn nack_is_recorded_and_not_resent_next_version_is_sent() {
    let (cache, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    let r1 = c.synced(EDS, &["a"]).await;
    cache.set_snapshot("g", fixture(&["a"], "a", 2));
    let bad = c.recv().await;
    c.nack(&bad, &["a"], &r1.version_info).await;
    c.expect_quiet().await;
    let node = s.server.registry().node("n").unwrap();
    let eds = node.types.iter().find(|t| t.ty == EDS).unwrap();
    let nack = eds.nack.as_ref().expect("nack recorded");
    assert_eq!(&*nack.version, bad.version_info.as_str());
    assert_eq!(nack.message, "rejected by test");
    assert_eq!(eds.state, ballast_xds::SyncState::Error);
    // Re-publishing the same rejected content sends nothing...
    cache.set_snapshot("g", fixture(&["a"], "a", 2));
    c.expect_quiet().await;
    // ...a different version is sent.
    cache.set_snapshot("g", fixture(&["a"], "a", 3));
    let good = c.recv().await;
    assert_ne!(good.version_info, bad.version_info);
    c.ack(&good, &["a"]).await;
    c.expect_quiet().await;
    let node = s.server.registry().node("n").unwrap();
    let eds = node.types.iter().find(|t| t.ty == EDS).unwrap();
    assert!(eds.nack.is_none());
    assert_eq!(eds.state, ballast_xds::SyncState::Synced);
}

#[tokio::test]
async fn nothing_is_answered_before_ready_then_everything_is() {
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", fixture(&["a"], "a", 1));
    let s = common::start(cache.clone(), GRACE).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    c.request(CDS, &[], "", "").await;
    c.expect_quiet().await;
    cache.set_ready(true);
    assert_eq!(names(&c.recv().await), ["a"]);
}

#[tokio::test]
async fn unknown_group_waits_until_its_snapshot_exists() {
    let cache = SnapshotCache::new();
    cache.set_ready(true);
    let s = common::start(cache.clone(), GRACE).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    c.request(CDS, &[], "", "").await;
    c.expect_quiet().await;
    cache.set_snapshot("g", fixture(&["a"], "a", 1));
    assert_eq!(names(&c.recv().await), ["a"]);
}

#[tokio::test]
async fn resuming_client_with_current_version_gets_nothing() {
    let (_c, s) = ready_server(fixture(&["a", "b"], "a", 1)).await;
    let mut c = Sotw::connect(s.addr, "n1").await;
    c.request(CDS, &[], "", "").await;
    let r = c.recv().await;
    // Another stream (a reconnect, or a failover to a replica) with that version.
    let mut c2 = Sotw::connect(s.addr, "n2").await;
    c2.request(CDS, &[], &r.version_info, "").await;
    c2.expect_quiet().await;
    // An outdated version no recent snapshot explains gets the current state
    // once the client's listeners and routes were asked for (until then the
    // server cannot tell which clusters the client's routes use: a full-state
    // CDS answer could remove them). Envoy asks for them right away.
    let mut c3 = Sotw::connect(s.addr, "n3").await;
    c3.request(CDS, &[], "old", "").await;
    c3.expect_quiet().await;
    c3.request(LDS, &[], "", "").await;
    c3.request(RDS, &["r1"], "", "").await;
    let mut cds = None;
    for _ in 0..2 {
        let resp = c3.recv().await;
        if resp.type_url == CDS.type_url() {
            cds = Some(resp);
        }
    }
    assert_eq!(cds.expect("CDS answered").version_info, r.version_info);
}

#[tokio::test]
async fn versions_are_identical_across_servers() {
    let (_c1, s1) = ready_server(fixture(&["a", "b"], "a", 1)).await;
    let (_c2, s2) = ready_server(fixture(&["a", "b"], "a", 1)).await;
    let mut a = Sotw::connect(s1.addr, "n").await;
    let mut b = Sotw::connect(s2.addr, "n").await;
    for ty in [CDS, LDS] {
        a.request(ty, &[], "", "").await;
        b.request(ty, &[], "", "").await;
        assert_eq!(a.recv().await.version_info, b.recv().await.version_info);
    }
}

#[tokio::test]
async fn make_before_break_on_ads() {
    // Route moves from cluster a to b, and a is removed, in one publish.
    let (cache, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    c.synced(CDS, &[]).await;
    let eds = c.synced(EDS, &["a"]).await;
    c.synced(LDS, &[]).await;
    c.synced(RDS, &["r1"]).await;
    c.expect_quiet().await;

    cache.set_snapshot("g", fixture(&["b"], "b", 1));
    // 1. CDS adds b and keeps a: routes still use a.
    let cds2 = c.recv().await;
    assert_eq!(cds2.type_url, CDS.type_url());
    assert_eq!(names(&cds2), ["a", "b"]);
    c.ack(&cds2, &[]).await;
    // Nothing else until the client asks for b's endpoints (RDS is held).
    c.expect_quiet().await;
    c.request(EDS, &["a", "b"], &eds.version_info, &eds.nonce)
        .await;
    let eds2 = c.recv().await;
    assert_eq!(names(&eds2), ["b"]);
    c.ack(&eds2, &["a", "b"]).await;
    // 2. Now b is warm: the route moves.
    let rds2 = c.recv().await;
    assert_eq!(rds2.type_url, RDS.type_url());
    c.ack(&rds2, &["r1"]).await;
    // 3. Only then is a removed.
    let cds3 = c.recv().await;
    assert_eq!(names(&cds3), ["b"]);
}

#[tokio::test]
async fn removal_is_held_while_the_client_rejects_the_route_update() {
    let (cache, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    c.synced(CDS, &[]).await;
    let eds = c.synced(EDS, &["a"]).await;
    let rds = c.synced(RDS, &["r1"]).await;
    cache.set_snapshot("g", fixture(&["b"], "b", 1));
    let cds2 = c.recv().await;
    c.ack(&cds2, &[]).await;
    c.request(EDS, &["a", "b"], &eds.version_info, &eds.nonce)
        .await;
    let eds2 = c.recv().await;
    c.ack(&eds2, &["a", "b"]).await;
    let rds2 = c.recv().await;
    c.nack(&rds2, &["r1"], &rds.version_info).await;
    // The client still routes to a: a must not be removed.
    c.expect_quiet().await;
}

#[tokio::test]
async fn per_type_service_ignores_other_types() {
    use ballast_xds::envoy_types::pb::envoy::service::cluster::v3::cluster_discovery_service_client::ClusterDiscoveryServiceClient;
    use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
    let (_c, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut client = ClusterDiscoveryServiceClient::new(common::client::channel(s.addr).await);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(DiscoveryRequest {
        node: Some(common::client::node("n")),
        type_url: LDS.type_url().into(),
        ..Default::default()
    })
    .await
    .unwrap();
    tx.send(DiscoveryRequest {
        type_url: CDS.type_url().into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut stream = client
        .stream_clusters(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let r = tokio::time::timeout(common::client::RECV, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(r.type_url, CDS.type_url(), "only CDS is answered on CDS");
    // Fetch on the same service.
    let f = client
        .fetch_clusters(DiscoveryRequest {
            node: Some(common::client::node("f")),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(names(&f), ["a"]);
}

#[tokio::test]
async fn rest_json_answers_and_says_not_modified() {
    let (_c, s) = ready_server(fixture(&["a", "b"], "a", 1)).await;
    let body = r#"{"node":{"id":"rest-1"},"resourceNames":["b"]}"#;
    let (status, text) = post(s.addr, "/v3/discovery:endpoints", body).await;
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["resources"][0]["clusterName"], "b");
    assert_eq!(
        v["resources"][0]["@type"],
        "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
    );
    let version = v["versionInfo"].as_str().unwrap().to_string();
    let again =
        format!(r#"{{"node":{{"id":"rest-1"}},"resourceNames":["b"],"versionInfo":"{version}"}}"#);
    let (status, _) = post(s.addr, "/v3/discovery:endpoints", &again).await;
    assert_eq!(status, 304);
    let (status, text) = post(s.addr, "/v3/discovery:clusters", "{\"node\": {\"id\": 1").await;
    assert_eq!(status, 400);
    assert!(text.contains("line 1"), "{text}");
}

async fn post(addr: std::net::SocketAddr, path: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(common::client::RECV, s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let status: u16 = text[9..12].parse().unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

#[tokio::test]
async fn held_route_is_not_answered_empty() {
    // RDS is requested before the endpoints of its cluster were delivered:
    // an empty RDS answer would make Envoy warm the listener with no routes.
    let (_c, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    c.synced(CDS, &[]).await;
    c.request(RDS, &["r1"], "", "").await;
    c.expect_quiet().await;
    c.request(EDS, &["a"], "", "").await;
    let eds = c.recv().await;
    assert_eq!(eds.type_url, EDS.type_url());
    c.ack(&eds, &["a"]).await;
    let rds = c.recv().await;
    assert_eq!(names(&rds), ["r1"]);
}

#[tokio::test]
async fn responses_over_4_mib_are_reported() {
    use ballast_xds::XdsEvent;
    use ballast_xds::envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let big = Cluster {
        name: "big".into(),
        alt_stat_name: "x".repeat(5 * 1024 * 1024),
        ..Default::default()
    };
    let snap = ballast_xds::Snapshot::builder()
        .with(&big)
        .unwrap()
        .build()
        .unwrap();
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", snap);
    cache.set_ready(true);
    let oversized = Arc::new(AtomicUsize::new(0));
    let seen = oversized.clone();
    let observer = move |e: &XdsEvent| {
        if let XdsEvent::OversizedResponse { bytes, .. } = e {
            assert!(*bytes > 4 * 1024 * 1024);
            seen.fetch_add(1, Ordering::SeqCst);
        }
    };
    let s = common::start_with(cache, GRACE, Arc::new(observer)).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    c.request(CDS, &[], "", "").await;
    let r = c.recv().await;
    assert_eq!(names(&r), ["big"]);
    assert_eq!(oversized.load(Ordering::SeqCst), 1);
    // A small response is not reported.
    c.request(LDS, &[], "", "").await;
    assert!(names(&c.recv().await).is_empty());
    assert_eq!(oversized.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn nack_state_clears_when_config_returns_to_what_the_client_kept() {
    let (cache, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    let good = c.synced(EDS, &["a"]).await;
    cache.set_snapshot("g", fixture(&["a"], "a", 2));
    let bad = c.recv().await;
    c.nack(&bad, &["a"], &good.version_info).await;
    c.expect_quiet().await;
    // Back to the version the client kept: nothing to send, and in sync again.
    cache.set_snapshot("g", fixture(&["a"], "a", 1));
    c.expect_quiet().await;
    let node = s.server.registry().node("n").unwrap();
    let eds = node.types.iter().find(|t| t.ty == EDS).unwrap();
    assert!(eds.nack.is_none());
    assert_eq!(eds.state, ballast_xds::SyncState::Synced);
}

/// Clusters `a` and `b` (connect timeouts in ms) with one endpoint each (ports).
fn two_clusters(timeouts: [u64; 2], ports: [u16; 2]) -> ballast_xds::Snapshot {
    use ballast_xds::simple;
    let mut b = ballast_xds::Snapshot::builder();
    for (i, n) in ["a", "b"].into_iter().enumerate() {
        b.message(&simple::eds_cluster(n, Duration::from_millis(timeouts[i])))
            .unwrap();
        b.message(&simple::load_assignment(n, &[("127.0.0.1", ports[i])]))
            .unwrap();
    }
    b.build().unwrap()
}

/// SotW EDS responses group resources like Delta (the xDS spec: only LDS and
/// CDS are full state): an endpoint change sends that one load assignment,
/// and a modified cluster's endpoints follow it (Envoy rebuilds the cluster
/// and waits for them) while the other cluster's are not repeated.
#[tokio::test]
async fn eds_pushes_carry_only_what_the_client_lacks() {
    let (cache, s) = ready_server(two_clusters([1000, 1000], [1, 1])).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    c.synced(CDS, &[]).await;
    c.request(EDS, &["a", "b"], "", "").await;
    let eds = c.recv().await;
    assert_eq!(
        names(&eds),
        ["a", "b"],
        "the first answer carries everything"
    );
    c.ack(&eds, &["a", "b"]).await;
    c.expect_quiet().await;

    cache.set_snapshot("g", two_clusters([1000, 1000], [1, 2]));
    let eds2 = c.recv().await;
    assert_eq!(names(&eds2), ["b"], "only the changed load assignment");
    assert_ne!(eds2.version_info, eds.version_info);
    c.ack(&eds2, &["a", "b"]).await;
    c.expect_quiet().await;

    cache.set_snapshot("g", two_clusters([2000, 1000], [1, 2]));
    let cds2 = c.recv().await;
    assert_eq!(names(&cds2), ["a", "b"], "CDS is full state");
    let eds3 = c.recv().await;
    assert_eq!(
        names(&eds3),
        ["a"],
        "the modified cluster's endpoints, again"
    );
    assert_eq!(eds3.version_info, eds2.version_info, "content unchanged");
    c.ack(&cds2, &[]).await;
    c.ack(&eds3, &["a", "b"]).await;
    c.expect_quiet().await;
}

/// Issue 8 §2: an empty first request is wildcard only for LDS and CDS. For
/// EDS (and RDS) it means "not interested": answered with nothing, and a later
/// request naming resources (with that nonce) delivers them.
#[tokio::test]
async fn empty_first_eds_or_rds_request_is_not_wildcard() {
    let (_c, s) = ready_server(fixture(&["a", "b"], "a", 1)).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    for (ty, wanted) in [(EDS, &["a", "b"][..]), (RDS, &["r1"][..])] {
        c.request(ty, &[], "", "").await;
        let r0 = c.recv().await;
        assert_eq!(r0.type_url, ty.type_url());
        assert!(names(&r0).is_empty(), "{ty}: {:?}", names(&r0));
        c.ack(&r0, &[]).await;
        c.expect_quiet().await;
        c.request(ty, wanted, &r0.version_info, &r0.nonce).await;
        let r1 = c.recv().await;
        assert_eq!(names(&r1), wanted, "{ty}: the named resources arrive");
        assert_ne!(r1.version_info, r0.version_info);
    }
}

/// Issue 8 §2: newly requested names are always (re)sent, even when the
/// client was sent them before under a wildcard it then dropped.
#[tokio::test]
async fn newly_named_resources_are_resent_after_an_explicit_wildcard() {
    let (_c, s) = ready_server(fixture(&["a", "b"], "a", 1)).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    c.request(EDS, &["*"], "", "").await;
    let r0 = c.recv().await;
    assert_eq!(names(&r0), ["a", "b"]);
    c.ack(&r0, &["*"]).await;
    c.request(EDS, &["a", "b"], &r0.version_info, &r0.nonce)
        .await;
    assert_eq!(names(&c.recv().await), ["a", "b"]);
}

/// Syncs CDS, EDS [a], LDS, RDS [r1] on a new stream; returns each type's
/// ACKed version.
async fn full_sync(c: &mut Sotw) -> std::collections::HashMap<ballast_xds::ResourceType, String> {
    let mut held = std::collections::HashMap::new();
    for (ty, sub) in [
        (CDS, &[][..]),
        (EDS, &["a"][..]),
        (LDS, &[][..]),
        (RDS, &["r1"][..]),
    ] {
        let r = c.synced(ty, sub).await;
        held.insert(ty, r.version_info);
    }
    c.expect_quiet().await;
    held
}

/// Issue 8 §1: Envoy resets its reconnect backoff only when a stream delivers
/// a message. A stream resumed at the current versions gets exactly one
/// response: EDS with no resources at the version the client holds (Envoy's
/// SotW mux gives a named watch only resources present in a response). It
/// waits for the EDS request Envoy's clusters say is coming, rather than
/// repeat CDS.
#[tokio::test]
async fn resumed_stream_gets_one_empty_eds_response() {
    let (_c, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut c1 = Sotw::connect(s.addr, "n").await;
    let held = full_sync(&mut c1).await;
    drop(c1);
    let mut c = Sotw::connect(s.addr, "n").await;
    c.request(CDS, &[], &held[&CDS], "").await;
    c.expect_quiet().await;
    c.request(EDS, &["a"], &held[&EDS], "").await;
    c.request(LDS, &[], &held[&LDS], "").await;
    c.request(RDS, &["r1"], &held[&RDS], "").await;
    let r = c.recv().await;
    assert_eq!(r.type_url, EDS.type_url());
    assert!(names(&r).is_empty(), "nothing is re-sent: {:?}", names(&r));
    assert_eq!(r.version_info, held[&EDS], "the version the client holds");
    c.ack(&r, &["a"]).await;
    c.expect_quiet().await;
    let node = s.server.registry().node("n").unwrap();
    assert!(
        node.types
            .iter()
            .all(|t| t.state == ballast_xds::SyncState::Synced),
        "{:?}",
        node.types
            .iter()
            .map(|t| (t.ty, t.state))
            .collect::<Vec<_>>()
    );
}

/// Issue 8 §1: a resumed client that subscribes to no EDS/RDS/SDS (static
/// clusters, inline routes) gets its smallest full-state type again at the
/// same version: Envoy skips every cluster or listener whose hash is
/// unchanged, and it is the only message it accepts without effect.
#[tokio::test]
async fn resumed_stream_without_named_types_gets_its_state_again() {
    use ballast_xds::envoy_types::pb::envoy::config::cluster::v3::Cluster;
    let snap = || {
        ballast_xds::Snapshot::builder()
            .with(&Cluster {
                name: "static".into(),
                ..Default::default()
            })
            .unwrap()
            .build()
            .unwrap()
    };
    let (_c, s) = ready_server(snap()).await;
    let mut c1 = Sotw::connect(s.addr, "n").await;
    c1.request(CDS, &[], "", "").await;
    let r1 = c1.recv().await;
    c1.ack(&r1, &[]).await;
    c1.request(LDS, &[], "", "").await;
    let l1 = c1.recv().await;
    c1.ack(&l1, &[]).await;
    drop(c1);
    let mut c = Sotw::connect(s.addr, "n").await;
    c.request(CDS, &[], &r1.version_info, "").await;
    let r = c.recv().await;
    // LDS holds nothing (smaller) but was not asked for yet: CDS, as held.
    assert_eq!(r.type_url, CDS.type_url());
    assert_eq!(r.version_info, r1.version_info);
    assert_eq!(names(&r), ["static"]);
    c.ack(&r, &[]).await;
    c.request(LDS, &[], &l1.version_info, "").await;
    c.expect_quiet().await;
}

/// Issue 8 §1 on a per-type CDS stream: no other type comes on it, so the
/// resumed client gets its clusters again at the version it holds.
#[tokio::test]
async fn resumed_per_type_cds_stream_is_answered() {
    use ballast_xds::envoy_types::pb::envoy::service::cluster::v3::cluster_discovery_service_client::ClusterDiscoveryServiceClient;
    use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
    let (_c, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut ads = Sotw::connect(s.addr, "n").await;
    ads.request(CDS, &[], "", "").await;
    let held = ads.recv().await;
    drop(ads);
    let mut client = ClusterDiscoveryServiceClient::new(common::client::channel(s.addr).await);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(DiscoveryRequest {
        node: Some(common::client::node("n")),
        type_url: CDS.type_url().into(),
        version_info: held.version_info.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut stream = client
        .stream_clusters(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let r = tokio::time::timeout(common::client::RECV, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(r.version_info, held.version_info);
    assert_eq!(names(&r), ["a"]);
}

/// Issue 8 §2: endpoints from another config source (an ApiConfigSource, a
/// file, `self`) never come on this stream: a route to such a cluster is
/// sent once the client holds the cluster, without waiting for them.
#[tokio::test]
async fn route_to_a_cluster_with_endpoints_from_elsewhere_is_not_held() {
    use ballast_xds::envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
    use ballast_xds::envoy_types::pb::envoy::config::core::v3::{ApiConfigSource, ConfigSource};
    let mut x = ballast_xds::simple::eds_cluster("x", Duration::from_secs(1));
    x.eds_cluster_config.as_mut().unwrap().eds_config = Some(ConfigSource {
        config_source_specifier: Some(ConfigSourceSpecifier::ApiConfigSource(
            ApiConfigSource::default(),
        )),
        ..Default::default()
    });
    let mut b = ballast_xds::Snapshot::builder();
    b.message(&x).unwrap();
    b.message(&ballast_xds::simple::http_listener(
        "l1",
        "127.0.0.1",
        0,
        "r1",
    ))
    .unwrap();
    b.message(&ballast_xds::simple::route_config(
        "r1",
        &[("*", &[("x", 1)])],
    ))
    .unwrap();
    let (_c, s) = ready_server(b.build().unwrap()).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    c.request(CDS, &[], "", "").await;
    let cds = c.recv().await;
    assert_eq!(names(&cds), ["x"]);
    c.ack(&cds, &[]).await;
    c.synced(LDS, &[]).await;
    c.request(RDS, &["r1"], "", "").await;
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
    let mut c = Sotw::connect(s.addr, "n").await;
    c.synced(EDS, &["a"]).await;
    cache.set_snapshot("g", fixture(&["a"], "a", 2));
    c.expect_quiet().await;
    let newest = fixture(&["a"], "a", 3);
    let want = newest.version(EDS).to_string();
    cache.set_snapshot("g", newest);
    let r = c.recv().await;
    assert_eq!(r.version_info, want, "one push, at the newest version");
    c.ack(&r, &["a"]).await;
    c.expect_quiet().await;
}

/// As for Delta: a publish changing only the type in flight goes out with the
/// ACK, at the newest version; an idle type's change goes out at once.
#[tokio::test]
async fn a_publish_while_in_flight_goes_out_with_the_ack() {
    let (cache, s) = ready_server(fixture(&["a"], "a", 1)).await;
    let mut c = Sotw::connect(s.addr, "n").await;
    c.synced(CDS, &[]).await;
    c.request(EDS, &["a"], "", "").await;
    let r1 = c.recv().await;
    assert_eq!(r1.type_url, EDS.type_url());
    cache.set_snapshot("g", fixture(&["a"], "a", 2));
    let newest = fixture(&["a"], "a", 3);
    let want = newest.version(EDS).to_string();
    cache.set_snapshot("g", newest);
    c.expect_quiet().await;
    c.ack(&r1, &["a"]).await;
    let r2 = c.recv().await;
    assert_eq!(r2.version_info, want, "the newest, after the ACK");
    cache.set_snapshot("g", fixture(&["a", "b"], "a", 3));
    let r3 = c.recv().await;
    assert_eq!(r3.type_url, CDS.type_url());
}
