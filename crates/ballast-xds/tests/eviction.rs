//! Issue 2, proof e — bounded node state (invariant 3).
//!
//! 1,000 distinct node ids connect (in-process gRPC clients over loopback,
//! SotW and Delta ADS), each gets a response and leaves: after the grace
//! period the registry is empty again and every node was evicted exactly
//! once. A node that reconnects within its grace period keeps its state.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ballast_xds::envoy_types::pb::envoy::config::core::v3::Node;
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DiscoveryRequest,
};
use ballast_xds::{ResourceType, SnapshotCache, XdsEvent};
use common::{EventLog, Running};
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

const T: Duration = Duration::from_secs(60);
const NODES: usize = 1000;
/// Streams in flight at once (spread over a few HTTP/2 connections).
const PARALLEL: usize = 100;
const CHANNELS: usize = 4;

#[derive(Clone, Copy, Debug)]
enum Mode {
    Sotw,
    Delta,
}

async fn server(grace: Duration) -> (Running, EventLog) {
    let web: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", common::http_snapshot(&[("web", 1, &[web])]));
    cache.set_ready(true);
    let log = EventLog::new();
    let running = common::start_with(cache, grace, log.observer()).await;
    (running, log)
}

async fn channel(s: &Running) -> Channel {
    Channel::from_shared(format!("http://{}", s.addr))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// One open ADS stream of node `id`, after its first response (CDS, one
/// cluster). Dropping it closes the stream from the client side.
struct Held {
    _tx: Box<dyn std::any::Any + Send>,
    _rx: Box<dyn std::any::Any + Send>,
}

async fn connect(channel: Channel, id: &str, mode: Mode) -> Held {
    let node = Some(Node {
        id: id.to_string(),
        cluster: "g".into(),
        ..Default::default()
    });
    let type_url = ResourceType::Cluster.type_url().to_string();
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    match mode {
        Mode::Sotw => {
            let (tx, rx) = mpsc::channel(1);
            tx.send(DiscoveryRequest {
                node,
                type_url: type_url.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
            let mut resp = client
                .stream_aggregated_resources(ReceiverStream::new(rx))
                .await
                .unwrap()
                .into_inner();
            let r = resp.message().await.unwrap().expect("a response");
            assert_eq!((r.type_url.as_str(), r.resources.len()), (&*type_url, 1));
            Held {
                _tx: Box::new(tx),
                _rx: Box::new(resp),
            }
        }
        Mode::Delta => {
            let (tx, rx) = mpsc::channel(1);
            tx.send(DeltaDiscoveryRequest {
                node,
                type_url: type_url.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
            let mut resp = client
                .delta_aggregated_resources(ReceiverStream::new(rx))
                .await
                .unwrap()
                .into_inner();
            let r = resp.message().await.unwrap().expect("a response");
            assert_eq!((r.type_url.as_str(), r.resources.len()), (&*type_url, 1));
            Held {
                _tx: Box::new(tx),
                _rx: Box::new(resp),
            }
        }
    }
}

fn evictions(log: &EventLog) -> BTreeMap<Arc<str>, usize> {
    let mut out = BTreeMap::new();
    for e in log.events() {
        if let XdsEvent::Evicted { node } = e {
            *out.entry(node).or_default() += 1;
        }
    }
    out
}

async fn thousand_nodes_come_and_go(mode: Mode) {
    let (s, log) = server(Duration::from_millis(300)).await;
    let mut channels = Vec::new();
    for _ in 0..CHANNELS {
        channels.push(channel(&s).await);
    }
    let mut len = s.server.registry().watch_len();
    let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let peak_task = {
        let mut len = len.clone();
        let peak = peak.clone();
        tokio::spawn(async move {
            while len.changed().await.is_ok() {
                peak.fetch_max(
                    *len.borrow_and_update(),
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
        })
    };
    let ids: Vec<String> = (0..NODES).map(|i| format!("{mode:?}-node-{i}")).collect();
    futures::stream::iter(ids.iter().enumerate())
        .for_each_concurrent(PARALLEL, |(i, id)| {
            let ch = channels[i % CHANNELS].clone();
            async move {
                let held = connect(ch, id, mode).await;
                drop(held); // and leave
            }
        })
        .await;
    tokio::time::timeout(T, len.wait_for(|n| *n == 0))
        .await
        .expect("the registry empties within the bound")
        .unwrap();
    assert!(s.server.registry().is_empty());
    assert_eq!(s.server.registry().nodes().len(), 0);
    // The count is published just before the last `Evicted` event is emitted.
    ballast_testkit::wait_until(T, Duration::from_millis(5), || async {
        evictions(&log).len() >= NODES
    })
    .await
    .expect("an Evicted event per node");

    let evicted = evictions(&log);
    let opened = log
        .events()
        .iter()
        .filter(|e| matches!(e, XdsEvent::StreamOpened { .. }))
        .count();
    let closed = log
        .events()
        .iter()
        .filter(|e| matches!(e, XdsEvent::StreamClosed { .. }))
        .count();
    eprintln!(
        "{mode:?}: {NODES} nodes; streams opened {opened}, closed {closed}; evicted {} distinct; \
         peak registry size {}",
        evicted.len(),
        peak.load(std::sync::atomic::Ordering::Relaxed)
    );
    assert_eq!((opened, closed), (NODES, NODES));
    assert_eq!(evicted.len(), NODES, "every node evicted");
    assert!(evicted.values().all(|n| *n == 1), "each exactly once");
    for id in &ids {
        assert!(evicted.contains_key(id.as_str()), "{id} evicted");
    }
    peak_task.abort();
}

/// X disconnects and reconnects within its grace period; Y, which leaves
/// after X's disconnect, is evicted — so X's eviction timer has run too, and
/// must have found X back.
async fn reconnect_within_grace_keeps_the_node(mode: Mode) {
    let grace = Duration::from_secs(2);
    let (s, log) = server(grace).await;
    let ch = channel(&s).await;
    let reg = s.server.registry();
    let x1 = connect(ch.clone(), "x", mode).await;
    let y = connect(ch.clone(), "y", mode).await;
    let since = reg.node("x").unwrap().connected_since;

    drop(x1);
    ballast_testkit::wait_until(T, Duration::from_millis(5), || async {
        reg.node("x").is_some_and(|n| !n.connected)
    })
    .await
    .unwrap();
    let x2 = connect(ch.clone(), "x", mode).await;
    assert!(reg.node("x").unwrap().connected);

    drop(y);
    ballast_testkit::wait_until(T, Duration::from_millis(20), || async {
        evictions(&log).contains_key("y")
    })
    .await
    .unwrap();
    // X's timer was armed before Y's; give it time to have run in any case.
    tokio::time::sleep(grace / 4).await;
    let x = reg.node("x").expect("x kept");
    assert!(x.connected);
    assert_eq!(x.streams.len(), 1);
    assert_eq!(
        x.connected_since, since,
        "x's state was kept, not recreated"
    );
    assert!(!evictions(&log).contains_key("x"));
    assert_eq!(reg.len(), 1);

    // Leaving for good: evicted after the grace period.
    drop(x2);
    let mut len = reg.watch_len();
    tokio::time::timeout(T, len.wait_for(|n| *n == 0))
        .await
        .expect("x is evicted")
        .unwrap();
    ballast_testkit::wait_until(T, Duration::from_millis(5), || async {
        evictions(&log).contains_key("x")
    })
    .await
    .expect("an Evicted event for x");
    assert_eq!(evictions(&log).get("x"), Some(&1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_thousand_nodes_evicted_after_grace() {
    thousand_nodes_come_and_go(Mode::Sotw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_thousand_nodes_evicted_after_grace() {
    thousand_nodes_come_and_go(Mode::Delta).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_reconnect_within_grace_keeps_node() {
    reconnect_within_grace_keeps_the_node(Mode::Sotw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_reconnect_within_grace_keeps_node() {
    reconnect_within_grace_keeps_the_node(Mode::Delta).await;
}
