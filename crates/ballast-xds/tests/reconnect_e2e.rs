//! Issue 8 §1 — prompt reconnects (invariant 2, docs/architecture.md). Envoy resets its xDS
//! reconnect backoff only when a stream delivers a message. A server that
//! sends nothing on a resumed stream (the client already holds everything)
//! makes every cut cost more: with Envoy's default backoff (500 ms base, 30 s
//! max) the gaps between a cut and the next connection grew 0.9, 1.7, 2.8,
//! 4.6 ... 26.8 s. Every stream therefore gets one response once the client's
//! state is known — a no-op that re-sends nothing Envoy holds.
//!
//! One server behind a TCP proxy that cuts Envoy's xDS connection 10 times in
//! a row, Envoy with its DEFAULT reconnect backoff: each reconnect comes
//! within 2 s, the responses after the first sync carry no resources and no
//! removals, Envoy rejects nothing, and HTTP traffic through Envoy meanwhile
//! sees zero non-2xx.

mod common;

use std::time::{Duration, Instant};

use ballast_testkit::{
    AdsMode, Envoy, EnvoyConfig, TcpProxy, Traffic, TrafficConfig, Upstream, http_get, wait_until,
};
use ballast_xds::{SnapshotCache, XdsEvent};
use common::EventLog;

const T: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(10);
const CUTS: usize = 10;
/// A reconnect after a reset backoff comes within Envoy's 500 ms base
/// interval (jittered); 2 s leaves room for a busy machine, and a backoff
/// that never resets passes it within a few cuts.
const PROMPT: Duration = Duration::from_secs(2);
const NODE: &str = "envoy-reconnect";

async fn reconnects_stay_prompt(mode: AdsMode) {
    let web = Upstream::start("web").await.unwrap();
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", common::http_snapshot(&[("web", 1, &[web.addr()])]));
    cache.set_ready(true);
    let log = EventLog::new();
    let server = common::start_with(cache, Duration::from_secs(30), log.observer()).await;
    let proxy = TcpProxy::start(vec![server.addr]).await.unwrap();
    let mut bootstrap = EnvoyConfig::new(proxy.addr(), NODE, "g", mode).bootstrap_json();
    // Envoy's own backoff, not the testkit's faster one: that is the point.
    bootstrap["dynamic_resources"]["ads_config"]["grpc_services"][0]["envoy_grpc"]
        .as_object_mut()
        .unwrap()
        .remove("retry_policy")
        .expect("the testkit sets a retry policy");
    let envoy = Envoy::start_bootstrap(&bootstrap.to_string())
        .await
        .unwrap();
    envoy.wait_live(T).await.unwrap();
    let addr = common::listener_addr(&envoy, "http").await;
    wait_until(T, POLL, || async {
        matches!(http_get(addr, "/").await, Ok((200, body)) if body == "web")
    })
    .await
    .unwrap();
    // The first sync is over once every type is ACKed and nothing is in flight.
    wait_until(T, POLL, || async {
        server.server.registry().node(NODE).is_some_and(|n| {
            n.types.len() == 4
                && n.types
                    .iter()
                    .all(|t| t.state == ballast_xds::SyncState::Synced)
        })
    })
    .await
    .expect("first sync");
    let synced_at = log.len();

    let traffic = Traffic::start(TrafficConfig::new(addr, "web.example.com", "/"));
    wait_until(T, POLL, || async { traffic.report().ok_2xx >= 20 })
        .await
        .unwrap();
    let mut gaps: Vec<Duration> = Vec::new();
    for _ in 0..CUTS {
        // Let the new stream run its course (requests, response, ACK).
        tokio::time::sleep(Duration::from_secs(1)).await;
        let accepted = proxy.connections_accepted();
        assert!(proxy.cut_all() >= 1, "Envoy's xDS connection was live");
        let cut = Instant::now();
        // Wait longer than PROMPT so a failure reports the real gap.
        wait_until(T, POLL, || async {
            proxy.connections_accepted() > accepted
        })
        .await
        .expect("Envoy reconnects");
        gaps.push(cut.elapsed());
        if gaps.last().is_some_and(|g| *g > PROMPT) {
            break;
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = traffic.stop().await;
    let after: Vec<XdsEvent> = log.events()[synced_at..].to_vec();
    let sent: Vec<(ballast_xds::ResourceType, usize, usize)> = after
        .iter()
        .filter_map(|e| match e {
            XdsEvent::ResponseSent {
                ty,
                resources,
                removed,
                ..
            } => Some((*ty, *resources, *removed)),
            _ => None,
        })
        .collect();
    let stats = envoy.stats().await.unwrap();
    let rejected: Vec<(&String, &u64)> = stats
        .iter()
        .filter(|(k, v)| k.ends_with("update_rejected") && **v > 0)
        .collect();
    eprintln!(
        "{mode:?}: gaps between cut and reconnect {:?}\nresponses after the first sync: {sent:?}\n{report}",
        gaps.iter()
            .map(|g| format!("{:.2}s", g.as_secs_f64()))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        gaps.len(),
        CUTS,
        "a reconnect took over {PROMPT:?}: {gaps:?}"
    );
    assert!(gaps.iter().all(|g| *g <= PROMPT), "{gaps:?}");
    report.assert_all_ok();
    assert!(rejected.is_empty(), "Envoy rejected updates: {rejected:?}");
    // One no-op per new stream: nothing re-sent, nothing removed.
    assert!(sent.len() >= CUTS, "responses on new streams: {sent:?}");
    assert!(
        sent.iter().all(|(_, res, rem)| *res == 0 && *rem == 0),
        "a reconnect re-sent or removed resources: {sent:?}"
    );
    assert_eq!(
        envoy.stat("control_plane.connected_state").await.unwrap(),
        Some(1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_reconnects_stay_prompt_with_default_backoff() {
    reconnects_stay_prompt(AdsMode::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_reconnects_stay_prompt_with_default_backoff() {
    reconnects_stay_prompt(AdsMode::DeltaGrpc).await;
}
