//! Issue 2, proof d — NACK safety (invariant 7) against a real Envoy.
//!
//! A snapshot Envoy 1.40 rejects (a route whose regex RE2 cannot compile; our
//! snapshot builder has no regex engine and accepts it) is published while
//! traffic flows. It must be NACKed and recorded with Envoy's message (node
//! registry and CSDS), never resent, Envoy must keep serving its last good
//! config with zero non-2xx, and the next good snapshot must be applied.

mod common;

use std::time::Duration;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, Traffic, TrafficConfig, Upstream, http_get};
use ballast_testkit::{wait_for, wait_until};
use ballast_xds::envoy_types::pb::envoy::admin::v3::ClientResourceStatus;
use ballast_xds::envoy_types::pb::envoy::config::core::v3::Node;
use ballast_xds::envoy_types::pb::envoy::config::route::v3::route::Action;
use ballast_xds::envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
use ballast_xds::envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use ballast_xds::envoy_types::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
};
use ballast_xds::envoy_types::pb::envoy::r#type::matcher::v3::RegexMatcher;
use ballast_xds::envoy_types::pb::envoy::service::status::v3::client_status_discovery_service_client::ClientStatusDiscoveryServiceClient;
use ballast_xds::envoy_types::pb::envoy::service::status::v3::{
    ClientStatusRequest, ConfigStatus,
};
use ballast_xds::{ResourceType, Snapshot, SnapshotCache, SyncState, XdsEvent, simple};
use common::EventLog;

const T: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);
/// How long we watch for a resend after the NACK. A resend loop (the classic
/// go-control-plane complaint) would show many responses in this window.
const QUIET: Duration = Duration::from_secs(3);

/// Clusters `svc-a` and `svc-b`, and route configuration `routes` whose only
/// route matches the regex `(` — RE2 refuses it, so Envoy NACKs the RDS response.
fn bad_snapshot(a: std::net::SocketAddr, b: std::net::SocketAddr) -> Snapshot {
    let mut s = Snapshot::builder();
    for (name, ep) in [("svc-a", a), ("svc-b", b)] {
        s.message(&simple::eds_cluster(name, Duration::from_millis(500)))
            .unwrap();
        s.message(&simple::load_assignment(
            name,
            &[(&ep.ip().to_string(), ep.port())],
        ))
        .unwrap();
    }
    s.message(&simple::http_listener("http", "127.0.0.1", 0, "routes"))
        .unwrap();
    s.message(&RouteConfiguration {
        name: "routes".into(),
        virtual_hosts: vec![VirtualHost {
            name: "all".into(),
            domains: vec!["*".into()],
            routes: vec![Route {
                r#match: Some(RouteMatch {
                    path_specifier: Some(PathSpecifier::SafeRegex(RegexMatcher {
                        regex: "(".into(),
                        ..Default::default()
                    })),
                    ..Default::default()
                }),
                action: Some(Action::Route(RouteAction {
                    cluster_specifier: Some(ClusterSpecifier::Cluster("svc-b".into())),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    })
    .unwrap();
    // Consistent as far as references go: the builder accepts it as is.
    s.build().unwrap()
}

async fn nack(mode: AdsMode) {
    let node = format!("envoy-nack-{mode:?}").to_lowercase();
    let a = Upstream::start("a").await.unwrap();
    let b = Upstream::start("b").await.unwrap();
    let cache = SnapshotCache::new();
    cache.set_snapshot(
        "g",
        common::routed_snapshot("svc-a", &[("svc-a", &[a.addr()])]),
    );
    cache.set_ready(true);
    let log = EventLog::new();
    let server = common::start_with(cache.clone(), Duration::from_secs(30), log.observer()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(server.addr, &node, "g", mode))
        .await
        .unwrap();
    envoy.wait_live(T).await.unwrap();
    let addr = common::listener_addr(&envoy, "http").await;
    let traffic = Traffic::start(TrafficConfig::new(addr, "web.example.com", "/"));
    wait_until(T, POLL, || {
        let ok = traffic.report().ok_2xx;
        async move { ok >= 20 }
    })
    .await
    .unwrap();

    // Publish the snapshot Envoy rejects.
    let bad = cache.set_snapshot("g", bad_snapshot(a.addr(), b.addr()));
    let bad_rds_version = bad.version(ResourceType::RouteConfiguration).clone();
    let nack = wait_for(T, POLL, || async {
        let n = server.server.registry().node(&node).expect("node known");
        let rds = n
            .types
            .iter()
            .find(|t| t.ty == ResourceType::RouteConfiguration)
            .expect("RDS requested");
        match &rds.nack {
            Some(nack) => {
                assert_eq!(rds.state, SyncState::Error);
                Ok(nack.clone())
            }
            None => anyhow::bail!("no NACK yet: {:?}", rds.state),
        }
    })
    .await
    .unwrap();
    let nacked_at = log.len();
    eprintln!("{mode:?}: recorded NACK {nack:?}");
    assert!(
        nack.message.contains("regex") || nack.message.contains("missing )"),
        "Envoy's message is recorded: {:?}",
        nack.message
    );
    assert_eq!(*nack.version, *bad_rds_version);
    let nack_events: Vec<_> = log
        .events()
        .into_iter()
        .filter(|e| {
            matches!(
                e,
                XdsEvent::Nack {
                    ty: ResourceType::RouteConfiguration,
                    ..
                }
            )
        })
        .collect();
    assert_eq!(nack_events.len(), 1, "{nack_events:?}");

    // CSDS reports the rejected route configuration as ERROR / NACKED.
    let mut csds = ClientStatusDiscoveryServiceClient::connect(format!("http://{}", server.addr))
        .await
        .unwrap();
    let status = csds
        .fetch_client_status(ClientStatusRequest {
            node: Some(Node {
                id: node.clone(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.config.len(), 1, "{status:?}");
    let rds: Vec<_> = status.config[0]
        .generic_xds_configs
        .iter()
        .filter(|c| c.type_url == ResourceType::RouteConfiguration.type_url())
        .collect();
    assert_eq!(rds.len(), 1, "{rds:?}");
    assert_eq!(rds[0].name, "routes");
    assert_eq!(rds[0].config_status, ConfigStatus::Error as i32, "{rds:?}");
    assert_eq!(
        rds[0].client_status,
        ClientResourceStatus::Nacked as i32,
        "{rds:?}"
    );
    let failure = rds[0].error_state.as_ref().expect("error_state");
    assert_eq!(failure.details, nack.message);
    assert_eq!(failure.version_info, *bad_rds_version);
    // The rest is in sync.
    for c in &status.config[0].generic_xds_configs {
        if c.type_url != ResourceType::RouteConfiguration.type_url() {
            assert_eq!(c.config_status, ConfigStatus::Synced as i32, "{c:?}");
        }
    }

    // Not resent: nothing goes out while the snapshot stays the same, and
    // Envoy keeps serving its last good route (everything to svc-a).
    let before_quiet = traffic.report();
    let rejected = envoy
        .stat("http.http.rds.routes.update_rejected")
        .await
        .unwrap();
    tokio::time::sleep(QUIET).await;
    let rds_resent = log.responses_since(nacked_at, Some(ResourceType::RouteConfiguration));
    let any_resent = log.responses_since(nacked_at, None);
    let during = traffic.report();
    eprintln!(
        "{mode:?}: over {QUIET:?} after the NACK: {rds_resent} RDS / {any_resent} total responses \
         sent; Envoy update_rejected {rejected:?} -> {:?}; requests {} (by body {:?})",
        envoy
            .stat("http.http.rds.routes.update_rejected")
            .await
            .unwrap(),
        during.total - before_quiet.total,
        during.by_body
    );
    assert_eq!(rds_resent, 0, "the rejected version was resent");
    assert_eq!(any_resent, 0, "responses after the NACK");
    assert_eq!(rejected, Some(1));
    assert_eq!(
        envoy
            .stat("http.http.rds.routes.update_rejected")
            .await
            .unwrap(),
        Some(1)
    );
    assert!(during.ok_2xx > before_quiet.ok_2xx, "traffic kept flowing");
    assert_eq!(
        during.by_body.get("b"),
        None,
        "the rejected route took effect"
    );

    // The next good snapshot is applied: the route moves to svc-b.
    cache.set_snapshot(
        "g",
        common::routed_snapshot("svc-b", &[("svc-b", &[b.addr()])]),
    );
    wait_until(T, POLL, || async {
        matches!(http_get(addr, "/").await, Ok((200, body)) if body == "b")
    })
    .await
    .unwrap();
    wait_until(T, POLL, || async {
        let n = server.server.registry().node(&node).unwrap();
        n.types
            .iter()
            .all(|t| t.state == SyncState::Synced && t.nack.is_none())
    })
    .await
    .unwrap();
    let ok = traffic.report().ok_2xx;
    wait_until(T, POLL, || {
        let now = traffic.report().ok_2xx;
        async move { now >= ok + 50 }
    })
    .await
    .unwrap();
    let report = traffic.stop().await;
    eprintln!("{mode:?}: {report}");
    report.assert_all_ok();
    assert!(
        report.by_body.get("b").copied().unwrap_or(0) >= 50,
        "{report}"
    );
    assert_eq!(
        envoy
            .stat("http.http.rds.routes.update_rejected")
            .await
            .unwrap(),
        Some(1)
    );
    assert_eq!(
        envoy
            .stat("listener_manager.listener_removed")
            .await
            .unwrap(),
        Some(0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_nack_is_recorded_not_resent_and_recovers() {
    nack(AdsMode::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_nack_is_recorded_not_resent_and_recovers() {
    nack(AdsMode::DeltaGrpc).await;
}
