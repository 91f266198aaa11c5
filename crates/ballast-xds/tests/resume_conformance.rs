//! A proxy that opens a NEW stream (reconnect, or failover to another replica)
//! while the config changed meanwhile (invariants 2, 5, 6).
//!
//! Stream 1 gets V1 (route r1 → cluster a) and ACKs everything. It closes; the
//! group moves to V2 (r1 → b, a removed). Stream 2 — to the same server, or to
//! another replica that published the same history — reports what the client
//! holds (SotW `version_info`, Delta `initial_resource_versions`). The server
//! must resolve those versions to content, so make-before-break applies: CDS
//! first adds b and keeps a, RDS moves only once b's endpoints are ACKed, and
//! a goes only after the RDS ACK. Without the history the server would treat
//! the client as holding nothing it knows and remove a at once (503s).
//!
//! The history also tells when a reported version proves less than it names:
//! a SotW client that dropped a cluster and got it back asks for its
//! endpoints again at the same EDS version; if the stream breaks before the
//! answer, the next one must send them before routing there.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use ballast_xds::ResourceType::{
    Cluster as CDS, ClusterLoadAssignment as EDS, Listener as LDS, RouteConfiguration as RDS,
};
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use ballast_xds::{ResourceType, SnapshotCache};
use common::client::{Delta, Sotw};
use common::{fixture, names};

const GRACE: Duration = Duration::from_secs(30);

fn v1() -> ballast_xds::Snapshot {
    fixture(&["a"], "a", 1)
}
fn v2() -> ballast_xds::Snapshot {
    fixture(&["b"], "b", 1)
}

/// Server A serves stream 1; stream 2 goes to A again or to replica B, whose
/// cache published the same snapshots (built independently).
async fn servers(
    replica: bool,
) -> (
    SnapshotCache,
    common::Running,
    SnapshotCache,
    Option<common::Running>,
) {
    let a = SnapshotCache::new();
    a.set_snapshot("g", v1());
    a.set_ready(true);
    let sa = common::start(a.clone(), GRACE).await;
    if !replica {
        return (a.clone(), sa, a, None);
    }
    let b = SnapshotCache::new();
    b.set_snapshot("g", v1());
    b.set_ready(true);
    let sb = common::start(b.clone(), GRACE).await;
    (a, sa, b, Some(sb))
}

async fn sotw_resume(replica: bool) {
    let (cache_a, sa, cache_b, sb) = servers(replica).await;
    // Stream 1: the full V1 config, everything ACKed.
    let mut c1 = Sotw::connect(sa.addr, "n").await;
    let mut held = HashMap::new();
    for (ty, sub) in [
        (CDS, &[][..]),
        (EDS, &["a"][..]),
        (LDS, &[][..]),
        (RDS, &["r1"][..]),
    ] {
        c1.request(ty, sub, "", "").await;
        let r = c1.recv().await;
        c1.ack(&r, sub).await;
        held.insert(ty, r.version_info.clone());
    }
    c1.expect_quiet().await;
    drop(c1);
    // The config changes while the proxy is away (on A, or already on B).
    cache_a.set_snapshot("g", v2());
    if replica {
        cache_b.set_snapshot("g", v2());
    }
    let addr2 = sb.as_ref().map_or(sa.addr, |s| s.addr);
    let mut c2 = Sotw::connect(addr2, "n").await;
    // Envoy asks for CDS first, reporting the version it holds.
    c2.request(CDS, &[], &held[&CDS], "").await;
    let cds = c2.recv().await;
    assert_eq!(cds.type_url, CDS.type_url());
    assert_eq!(
        names(&cds),
        ["a", "b"],
        "the new cluster is added, the one the client's routes use is kept"
    );
    c2.request(EDS, &["a"], &held[&EDS], "").await;
    c2.request(LDS, &[], &held[&LDS], "").await;
    c2.request(RDS, &["r1"], &held[&RDS], "").await;
    // The subscription to a is answered (a no longer exists: nothing for it,
    // which removes nothing in SotW EDS); the listener is unchanged and the
    // route waits for b to be warm.
    let eds0 = c2.recv().await;
    assert_eq!(eds0.type_url, EDS.type_url());
    assert!(names(&eds0).is_empty());
    c2.ack(&eds0, &["a"]).await;
    c2.expect_quiet().await;
    c2.ack(&cds, &[]).await;
    c2.expect_quiet().await;
    c2.request(EDS, &["a", "b"], &eds0.version_info, &eds0.nonce)
        .await;
    let eds = c2.recv().await;
    assert_eq!(eds.type_url, EDS.type_url());
    assert_eq!(names(&eds), ["b"]);
    c2.expect_quiet().await;
    c2.ack(&eds, &["a", "b"]).await;
    let rds = c2.recv().await;
    assert_eq!(
        rds.type_url,
        RDS.type_url(),
        "the route moves once b is warm"
    );
    assert_eq!(names(&rds), ["r1"]);
    // a stays until the client has ACKed the route that stopped using it.
    c2.expect_quiet().await;
    c2.ack(&rds, &["r1"]).await;
    let cds2 = c2.recv().await;
    assert_eq!(cds2.type_url, CDS.type_url());
    assert_eq!(names(&cds2), ["b"], "a is removed after the RDS ACK");
    c2.ack(&cds2, &[]).await;
    c2.request(EDS, &["b"], &eds.version_info, &eds.nonce).await;
    c2.expect_quiet().await;
    if let Some(sb) = sb {
        sb.stop().await;
    }
    sa.stop().await;
}

#[tokio::test]
async fn sotw_reconnect_after_config_change_is_make_before_break() {
    sotw_resume(false).await;
}

#[tokio::test]
async fn sotw_failover_to_replica_after_config_change_is_make_before_break() {
    sotw_resume(true).await;
}

/// SotW versions are per type: Envoy that drops cluster b (CDS) forgets its
/// endpoints, and when b comes back it asks for them again reporting the EDS
/// version it had, which named b's endpoints. Here the stream breaks before
/// that answer and the config then routes to b. The next stream (same server
/// or a replica with the same history) must send b's endpoints before the
/// route: the version proves nothing about b.
async fn sotw_resume_after_a_cluster_came_back(replica: bool) {
    let x = || fixture(&["a", "b"], "a", 1);
    let y = || fixture(&["a"], "a", 1);
    let z = || fixture(&["a", "b"], "b", 1);
    let a = SnapshotCache::new();
    a.set_snapshot("g", x());
    a.set_ready(true);
    let sa = common::start(a.clone(), GRACE).await;
    let b = replica.then(SnapshotCache::new);
    if let Some(b) = &b {
        b.set_snapshot("g", x());
        b.set_ready(true);
    }
    let sb = match &b {
        Some(b) => Some(common::start(b.clone(), GRACE).await),
        None => None,
    };
    let publish = |s: fn() -> ballast_xds::Snapshot| {
        a.set_snapshot("g", s());
        if let Some(b) = &b {
            b.set_snapshot("g", s());
        }
    };
    let mut c1 = Sotw::connect(sa.addr, "n").await;
    let mut held = HashMap::new();
    let mut eds_nonce = String::new();
    for (ty, sub) in [
        (CDS, &[][..]),
        (EDS, &["a", "b"][..]),
        (LDS, &[][..]),
        (RDS, &["r1"][..]),
    ] {
        let r = c1.synced(ty, sub).await;
        held.insert(ty, r.version_info.clone());
        if ty == EDS {
            eds_nonce = r.nonce.clone();
        }
    }
    c1.expect_quiet().await;
    // b goes: the client takes the CDS update and stops asking for b.
    publish(y);
    let cds = c1.recv().await;
    assert_eq!(names(&cds), ["a"]);
    c1.ack(&cds, &[]).await;
    c1.request(EDS, &["a"], &held[&EDS], &eds_nonce).await;
    c1.expect_quiet().await;
    // b comes back; the client asks for it at the same EDS version, and the
    // stream breaks before any answer is read.
    publish(x);
    let cds = c1.recv().await;
    assert_eq!(names(&cds), ["a", "b"]);
    c1.ack(&cds, &[]).await;
    held.insert(CDS, cds.version_info.clone());
    c1.request(EDS, &["a", "b"], &held[&EDS], &eds_nonce).await;
    drop(c1);
    // Meanwhile the route moves to b.
    publish(z);
    let addr2 = sb.as_ref().map_or(sa.addr, |s| s.addr);
    let mut c2 = Sotw::connect(addr2, "n").await;
    let subs = |ty| match ty {
        EDS => &["a", "b"][..],
        RDS => &["r1"][..],
        _ => &[][..],
    };
    for ty in [CDS, EDS, LDS, RDS] {
        c2.request(ty, subs(ty), &held[&ty], "").await;
    }
    let mut endpoints_of_b = false;
    let mut route = None;
    for _ in 0..16 {
        let Some(r) = c2.recv_if_any().await else {
            break;
        };
        let ty = ResourceType::from_type_url(&r.type_url).unwrap();
        if ty == EDS && names(&r).iter().any(|n| n == "b") {
            endpoints_of_b = true;
        }
        if ty == RDS {
            assert!(
                endpoints_of_b,
                "the route to b went out before b's endpoints"
            );
            route = Some(r.clone());
        }
        c2.ack(&r, subs(ty)).await;
    }
    assert!(route.is_some(), "the route moves to b once b is warm");
    if let Some(sb) = sb {
        sb.stop().await;
    }
    sa.stop().await;
}

#[tokio::test]
async fn sotw_reconnect_after_a_cluster_came_back_re_sends_its_endpoints() {
    sotw_resume_after_a_cluster_came_back(false).await;
}

#[tokio::test]
async fn sotw_failover_after_a_cluster_came_back_re_sends_its_endpoints() {
    sotw_resume_after_a_cluster_came_back(true).await;
}

/// One cluster, listener l1 → r1 and, with `second`, l2 → r2.
fn listeners(second: bool) -> ballast_xds::Snapshot {
    use ballast_xds::simple;
    let mut b = ballast_xds::Snapshot::builder();
    b.message(&simple::eds_cluster("a", Duration::from_secs(1)))
        .unwrap();
    b.message(&simple::load_assignment("a", &[("127.0.0.1", 1)]))
        .unwrap();
    let pairs: &[(&str, &str)] = if second {
        &[("l1", "r1"), ("l2", "r2")]
    } else {
        &[("l1", "r1")]
    };
    for (l, r) in pairs {
        b.message(&simple::http_listener(l, "127.0.0.1", 0, r))
            .unwrap();
        b.message(&simple::route_config(r, &[("*", &[("a", 1)])]))
            .unwrap();
    }
    b.build().unwrap()
}

/// The same for routes: Envoy drops listener l2 (and forgets r2), gets l2
/// back and asks for r2 again at the RDS version that named it; the stream
/// breaks before the answer. The next stream must send r2, else the
/// re-added listener warms until Envoy's initial fetch timeout and then
/// serves no routes.
#[tokio::test]
async fn sotw_reconnect_after_a_listener_came_back_re_sends_its_routes() {
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", listeners(true));
    cache.set_ready(true);
    let server = common::start(cache.clone(), GRACE).await;
    let mut c1 = Sotw::connect(server.addr, "n").await;
    let mut held = HashMap::new();
    let mut rds_nonce = String::new();
    for (ty, sub) in [
        (CDS, &[][..]),
        (EDS, &["a"][..]),
        (LDS, &[][..]),
        (RDS, &["r1", "r2"][..]),
    ] {
        let r = c1.synced(ty, sub).await;
        held.insert(ty, r.version_info.clone());
        if ty == RDS {
            rds_nonce = r.nonce.clone();
        }
    }
    c1.expect_quiet().await;
    cache.set_snapshot("g", listeners(false));
    let lds = c1.recv().await;
    assert_eq!(names(&lds), ["l1"]);
    c1.ack(&lds, &[]).await;
    c1.request(RDS, &["r1"], &held[&RDS], &rds_nonce).await;
    c1.expect_quiet().await;
    cache.set_snapshot("g", listeners(true));
    let lds = c1.recv().await;
    assert_eq!(names(&lds), ["l1", "l2"]);
    c1.ack(&lds, &[]).await;
    held.insert(LDS, lds.version_info.clone());
    c1.request(RDS, &["r1", "r2"], &held[&RDS], &rds_nonce)
        .await;
    drop(c1);
    let mut c2 = Sotw::connect(server.addr, "n").await;
    let subs = |ty| match ty {
        EDS => &["a"][..],
        RDS => &["r1", "r2"][..],
        _ => &[][..],
    };
    for ty in [CDS, EDS, LDS, RDS] {
        c2.request(ty, subs(ty), &held[&ty], "").await;
    }
    let mut routes = Vec::new();
    for _ in 0..8 {
        let Some(r) = c2.recv_if_any().await else {
            break;
        };
        let ty = ResourceType::from_type_url(&r.type_url).unwrap();
        if ty == RDS {
            routes.extend(names(&r));
        }
        c2.ack(&r, subs(ty)).await;
    }
    assert_eq!(routes, ["r2"], "r2 is sent again, r1 is not");
    server.stop().await;
}

fn delta_names(r: &DeltaDiscoveryResponse) -> Vec<&str> {
    r.resources.iter().map(|r| r.name.as_str()).collect()
}

fn first_request(
    ty: ResourceType,
    sub: &[&str],
    held: &HashMap<String, String>,
) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: ty.type_url().into(),
        resource_names_subscribe: sub.iter().map(|s| s.to_string()).collect(),
        initial_resource_versions: held.clone(),
        ..Default::default()
    }
}

async fn delta_resume(replica: bool) {
    let (cache_a, sa, cache_b, sb) = servers(replica).await;
    let mut c1 = Delta::connect(sa.addr, "n").await;
    let mut held: HashMap<ResourceType, HashMap<String, String>> = HashMap::new();
    for (ty, sub) in [
        (CDS, &[][..]),
        (EDS, &["a"][..]),
        (LDS, &[][..]),
        (RDS, &["r1"][..]),
    ] {
        c1.subscribe(ty, sub, &[]).await;
        let r = c1.recv().await;
        c1.ack(&r).await;
        held.insert(
            ty,
            r.resources
                .iter()
                .map(|x| (x.name.clone(), x.version.clone()))
                .collect(),
        );
    }
    c1.expect_quiet().await;
    drop(c1);
    cache_a.set_snapshot("g", v2());
    if replica {
        cache_b.set_snapshot("g", v2());
    }
    let addr2 = sb.as_ref().map_or(sa.addr, |s| s.addr);
    let mut c2 = Delta::connect(addr2, "n").await;
    c2.send(first_request(CDS, &[], &held[&CDS])).await;
    let cds = c2.recv().await;
    assert_eq!(cds.type_url, CDS.type_url());
    assert_eq!(delta_names(&cds), ["b"]);
    assert!(
        cds.removed_resources.is_empty(),
        "a is still used by the client's route: {:?}",
        cds.removed_resources
    );
    c2.send(first_request(EDS, &["a"], &held[&EDS])).await;
    c2.send(first_request(LDS, &[], &held[&LDS])).await;
    c2.send(first_request(RDS, &["r1"], &held[&RDS])).await;
    c2.expect_quiet().await;
    c2.ack(&cds).await;
    c2.expect_quiet().await;
    c2.subscribe(EDS, &["b"], &[]).await;
    let eds = c2.recv().await;
    assert_eq!(eds.type_url, EDS.type_url());
    assert_eq!(delta_names(&eds), ["b"]);
    c2.expect_quiet().await;
    c2.ack(&eds).await;
    let rds = c2.recv().await;
    assert_eq!(
        rds.type_url,
        RDS.type_url(),
        "the route moves once b is warm"
    );
    assert_eq!(delta_names(&rds), ["r1"]);
    c2.expect_quiet().await;
    c2.ack(&rds).await;
    let cds2 = c2.recv().await;
    assert_eq!(cds2.type_url, CDS.type_url());
    assert!(cds2.resources.is_empty());
    assert_eq!(
        cds2.removed_resources,
        ["a"],
        "a is removed after the RDS ACK"
    );
    c2.ack(&cds2).await;
    // Then a's endpoints, which nothing uses any more.
    let eds2 = c2.recv().await;
    assert_eq!(eds2.type_url, EDS.type_url());
    assert_eq!(eds2.removed_resources, ["a"]);
    c2.ack(&eds2).await;
    c2.expect_quiet().await;
    if let Some(sb) = sb {
        sb.stop().await;
    }
    sa.stop().await;
}

#[tokio::test]
async fn delta_reconnect_after_config_change_is_make_before_break() {
    delta_resume(false).await;
}

#[tokio::test]
async fn delta_failover_to_replica_after_config_change_is_make_before_break() {
    delta_resume(true).await;
}
