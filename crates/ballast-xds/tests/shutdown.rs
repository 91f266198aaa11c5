//! Issue 8 §3 — graceful stop of the library server: when the shutdown future
//! resolves, every open stream (SotW and Delta) ends with UNAVAILABLE (a
//! status Envoy retries, keeping its config), held fetches end the same way,
//! and `serve_with_shutdown` completes — within the builder's
//! `shutdown_grace` even if a client stopped reading.

mod common;

use std::time::Duration;

use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DiscoveryRequest,
};
use ballast_xds::{ResourceType, SnapshotCache, XdsEvent, XdsServer};
use common::EventLog;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

/// Generous bound for things that happen at once; never a timing assertion.
const T: Duration = Duration::from_secs(30);

struct Server {
    addr: std::net::SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

async fn start(cache: SnapshotCache, shutdown_grace: Duration, log: &EventLog) -> Server {
    common::init_tracing();
    let server = XdsServer::builder(cache)
        .grouper(common::one_group())
        .observer(log.observer())
        .shutdown_grace(shutdown_grace)
        .build();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(server.serve_with_shutdown(listener, async {
        let _ = rx.await;
    }));
    Server { addr, stop, task }
}

fn request(ty: ResourceType, node: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        node: Some(common::client::node(node)),
        type_url: ty.type_url().into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn shutdown_ends_streams_with_unavailable_and_serve_completes() {
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", common::fixture(&["a", "b"], "a", 9));
    cache.set_ready(true);
    let log = EventLog::new();
    // A grace far beyond the test's bound: completing proves the streams
    // ended and connections closed on their own, not that the bound cut them.
    let server = start(cache, Duration::from_secs(3600), &log).await;
    let ch = common::client::channel(server.addr).await;
    let mut client = AggregatedDiscoveryServiceClient::new(ch);

    // A SotW stream that got its response and is idle, as Envoy's would be.
    let (sotw_tx, rx) = mpsc::channel(4);
    sotw_tx
        .send(request(ResourceType::Cluster, "sotw"))
        .await
        .unwrap();
    let mut sotw = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(T, sotw.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.resources.len(), 2);

    // A Delta stream likewise.
    let (delta_tx, rx) = mpsc::channel(4);
    delta_tx
        .send(DeltaDiscoveryRequest {
            node: Some(common::client::node("delta")),
            type_url: ResourceType::Cluster.type_url().into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut delta = client
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(T, delta.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.resources.len(), 2);

    // A stream that has not sent its first request yet.
    let (_silent_tx, rx) = mpsc::channel::<DiscoveryRequest>(4);
    let mut silent = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();

    server.stop.send(()).unwrap();

    for (what, next) in [
        (
            "sotw",
            tokio::time::timeout(T, sotw.message())
                .await
                .map(|r| r.map(|_| ())),
        ),
        (
            "delta",
            tokio::time::timeout(T, delta.message())
                .await
                .map(|r| r.map(|_| ())),
        ),
        (
            "silent",
            tokio::time::timeout(T, silent.message())
                .await
                .map(|r| r.map(|_| ())),
        ),
    ] {
        let status = next
            .unwrap_or_else(|_| panic!("{what}: the stream did not end after shutdown"))
            .expect_err("the stream ends with a status, not a clean end");
        assert_eq!(
            status.code(),
            tonic::Code::Unavailable,
            "{what}: {status:?}"
        );
    }
    // Clients keep their streams' senders open: the server ends them alone.
    let done = tokio::time::timeout(T, server.task)
        .await
        .expect("serve_with_shutdown completes once streams ended");
    done.unwrap().unwrap();
    drop((sotw_tx, delta_tx));
}

/// A client that stops reading keeps its HTTP/2 stream (and so its
/// connection) open: flow control holds the rest of a response larger than
/// its window. The serve future still completes, after the shutdown grace,
/// and the stream ends on the server: its connection is closed.
#[tokio::test]
async fn serve_completes_within_the_grace_when_a_client_stops_reading() {
    let names: Vec<String> = (0..3000)
        .map(|i| format!("cluster-{i:05}-with-a-long-name-to-fill-the-window"))
        .collect();
    let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", common::fixture(&names, names[0], 9));
    cache.set_ready(true);
    let log = EventLog::new();
    let server = start(cache, Duration::from_millis(500), &log).await;

    // HTTP/2's default windows (64 KiB; hyper's own default is 2 MiB): the
    // CDS response is several times larger.
    let ch = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .initial_stream_window_size(Some(65_535))
        .initial_connection_window_size(Some(65_535))
        .connect()
        .await
        .unwrap();
    let mut client = AggregatedDiscoveryServiceClient::new(ch);
    let (tx, rx) = mpsc::channel(4);
    tx.send(request(ResourceType::Cluster, "stalled"))
        .await
        .unwrap();
    let stalled = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    // The response left the stream task (into the transport); never read.
    ballast_testkit::wait_until(T, Duration::from_millis(20), || async {
        log.events()
            .iter()
            .any(|e| matches!(e, XdsEvent::ResponseSent { .. }))
    })
    .await
    .unwrap();

    server.stop.send(()).unwrap();
    let done = tokio::time::timeout(T, server.task)
        .await
        .expect("serve_with_shutdown completes after the grace despite a stalled client");
    done.unwrap().unwrap();
    // The stream ended on the server too (its body, which runs it, is no
    // longer polled): its connection is closed after the grace.
    ballast_testkit::wait_until(T, Duration::from_millis(20), || async {
        log.events()
            .iter()
            .any(|e| matches!(e, XdsEvent::StreamClosed { node, .. } if &**node == "stalled"))
    })
    .await
    .expect("the stalled stream ends after the grace");
    drop((stalled, tx));
}
