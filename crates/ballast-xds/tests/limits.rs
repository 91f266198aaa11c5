//! Issue 8 §4 — bounded state and abuse resistance, against a real server on
//! loopback with in-process clients (tonic, and raw gRPC frames where a
//! well-behaved client cannot send what a hostile one would):
//! - cache slots for groups clients name are freed when they leave;
//! - every limit refuses with a status naming the limit and the value, and is
//!   reported as `XdsEvent::LimitExceeded` (counted by limit name).

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ballast_xds::envoy_types::pb::envoy::config::core::v3::Node;
use ballast_xds::envoy_types::pb::envoy::service::cluster::v3::cluster_discovery_service_client::ClusterDiscoveryServiceClient;
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DiscoveryRequest, DiscoveryResponse,
};
use ballast_xds::envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use ballast_xds::Limits;
use ballast_xds::{ResourceType, SnapshotCache, XdsEvent, XdsServer};
use bytes::Bytes;
use common::EventLog;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

const T: Duration = Duration::from_secs(60);
const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// A ready server with a snapshot for group "g"; nodes are grouped by
/// `node.cluster` (as Ballast does), so clients choose their group.
async fn server(limits: Limits) -> (Running, EventLog, SnapshotCache) {
    common::init_tracing();
    let web: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", common::http_snapshot(&[("web", 1, &[web])]));
    cache.set_ready(true);
    let log = EventLog::new();
    let server = XdsServer::builder(cache.clone())
        .grouper(Arc::new(|n: &Node| Ok(n.cluster.clone())))
        .observer(log.observer())
        .limits(limits)
        .build();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let s = server.clone();
    let task = tokio::spawn(async move {
        s.serve_with_shutdown(listener, async {
            let _ = stop_rx.await;
        })
        .await
        .unwrap();
    });
    (
        Running {
            addr,
            _stop: stop_tx,
            task,
        },
        log,
        cache,
    )
}

/// A running server; stops on drop.
struct Running {
    addr: SocketAddr,
    _stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn node(id: &str, group: &str) -> Node {
    Node {
        id: id.into(),
        cluster: group.into(),
        ..Default::default()
    }
}

fn cds(node: Option<Node>, names: &[String]) -> DiscoveryRequest {
    DiscoveryRequest {
        node,
        type_url: CDS.into(),
        resource_names: names.to_vec(),
        ..Default::default()
    }
}

/// Limit rejections reported so far, by limit name.
fn rejections(log: &EventLog) -> BTreeMap<&'static str, usize> {
    let mut out = BTreeMap::new();
    for e in log.events() {
        if let XdsEvent::LimitExceeded { limit, .. } = e {
            *out.entry(limit).or_default() += 1;
        }
    }
    out
}

/// An open SotW ADS stream: its request sender and responses.
struct Open {
    tx: mpsc::Sender<DiscoveryRequest>,
    rx: Streaming<DiscoveryResponse>,
}

/// Opens an ADS stream and sends `first`; `Err` when the server refuses it.
async fn open(ch: &Channel, first: DiscoveryRequest) -> Result<Open, Status> {
    let (tx, rx) = mpsc::channel(4);
    tx.send(first).await.unwrap();
    let rx = AggregatedDiscoveryServiceClient::new(ch.clone())
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok(Open { tx, rx })
}

impl Open {
    /// The next response, or the status the stream ended with.
    async fn next(&mut self) -> Result<DiscoveryResponse, Status> {
        match tokio::time::timeout(T, self.rx.message())
            .await
            .expect("bounded")
        {
            Ok(Some(r)) => Ok(r),
            Ok(None) => Err(Status::ok("ended")),
            Err(s) => Err(s),
        }
    }
}

fn assert_refused(r: Result<impl Sized, Status>, code: Code, text: &str) -> Status {
    let s = r.err().expect("refused");
    assert_eq!(s.code(), code, "{s:?}");
    assert!(
        s.message().contains(text),
        "{:?} lacks {text:?}",
        s.message()
    );
    s
}

/// 10,000 streams and fetches naming random groups (no snapshot) leave no
/// cache slot behind once they end; the served group keeps its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_groups_leave_no_slots_behind() {
    let (s, _log, cache) = server(Limits::default()).await;
    assert_eq!(cache.slot_count(), 1);
    let channels: Vec<Channel> =
        futures::future::join_all((0..4).map(|_| common::client::channel(s.addr))).await;
    const BATCH: usize = 500;
    let mut peak = 0;
    for batch in 0..20 {
        let mut held = Vec::new();
        let mut fetches = Vec::new();
        for i in 0..BATCH {
            let group = format!("random-{batch}-{i}-{}", rand_suffix(batch * BATCH + i));
            let ch = &channels[i % channels.len()];
            if i % 10 == 9 {
                // A gRPC Fetch for a group without snapshot waits: abandoned below.
                let mut client = ClusterDiscoveryServiceClient::new(ch.clone());
                let req = cds(Some(node(&format!("f{i}"), &group)), &[]);
                fetches.push(tokio::spawn(
                    async move { client.fetch_clusters(req).await },
                ));
            } else {
                let o = open(ch, cds(Some(node(&format!("n{batch}-{i}"), &group)), &[]))
                    .await
                    .unwrap();
                held.push(o);
            }
        }
        // Every stream and fetch has watched its group.
        ballast_testkit::wait_until(T, Duration::from_millis(5), || {
            let c = cache.clone();
            async move { c.slot_count() == BATCH + 1 }
        })
        .await
        .unwrap_or_else(|_| panic!("{} slots, expected {}", cache.slot_count(), BATCH + 1));
        peak = peak.max(cache.slot_count());
        drop(held);
        for f in fetches {
            f.abort();
        }
        ballast_testkit::wait_until(T, Duration::from_millis(5), || {
            let c = cache.clone();
            async move { c.slot_count() == 1 }
        })
        .await
        .unwrap_or_else(|_| panic!("{} slots left after batch {batch}", cache.slot_count()));
    }
    eprintln!("10,000 random groups: peak {peak} slots, 1 left (the served group)");
    assert_eq!(cache.groups(), vec![Arc::<str>::from("g")]);
    // The served group still serves.
    let mut o = open(&channels[0], cds(Some(node("ok", "g")), &[]))
        .await
        .unwrap();
    assert_eq!(o.next().await.unwrap().resources.len(), 1);
    drop(o.tx);
}

fn rand_suffix(i: usize) -> u64 {
    // Distinct, unordered names (no RNG needed).
    (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// A message larger than the limit is refused with its size and the limit,
/// on streams and on unary Fetch (tonic's own decoder would say OUT_OF_RANGE).
#[tokio::test]
async fn request_size_limit() {
    let limits = {
        let mut l = Limits::default();
        l.max_request_bytes = 1024;
        l
    };
    let (s, log, _) = server(limits).await;
    let ch = common::client::channel(s.addr).await;
    let big = vec!["x".repeat(2000)];
    let mut o = open(&ch, cds(Some(node("n", "g")), &[])).await.unwrap();
    o.next().await.unwrap();
    o.tx.send(cds(None, &big)).await.unwrap();
    assert_refused(
        o.next().await,
        Code::ResourceExhausted,
        "over the request_bytes limit of 1024",
    );
    let r = ClusterDiscoveryServiceClient::new(ch.clone())
        .fetch_clusters(cds(Some(node("f", "g")), &big))
        .await;
    assert_refused(
        r,
        Code::ResourceExhausted,
        "over the request_bytes limit of 1024",
    );
    assert_eq!(rejections(&log).get("request_bytes"), Some(&2));
}

/// The server's HTTP/2 window lets a client send one maximal request on a
/// stream and no more ahead of the server's reading: what a client can make
/// it buffer is bounded by the request limit (it was 16 MiB whatever the limit).
#[tokio::test]
async fn a_streams_window_is_one_maximal_request() {
    const MAX: usize = 200_000;
    let limits = {
        let mut l = Limits::default();
        l.max_request_bytes = MAX;
        l
    };
    let (s, _log, _) = server(limits).await;
    let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    let driver = tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let req = http::Request::post(
        "http://xds/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
    )
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    let (_resp, mut body) = client.send_request(req, false).unwrap();
    // Ask for far more than the window; the grant stops at the window.
    body.reserve_capacity(8 * MAX);
    let granted = tokio::time::timeout(T, async {
        loop {
            let c = std::future::poll_fn(|cx| body.poll_capacity(cx))
                .await
                .expect("capacity")
                .expect("stream open");
            // h2's default is 65,535 until the server's SETTINGS arrive.
            if c > 65_535 {
                return c;
            }
        }
    })
    .await
    .expect("the server's window in time");
    assert_eq!(granted, MAX, "stream window");
    driver.abort();
}

/// A hostile client sends only a 5-byte gRPC header declaring ~4 GiB: it is
/// refused at once (nothing reserved; see `body.rs` for the allocation test).
#[tokio::test]
async fn a_header_declaring_4_gib_is_refused_without_waiting_for_the_bytes() {
    let (s, log, _) = server(Limits::default()).await;
    let ch = common::client::channel(s.addr).await;
    for path in [
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
        "/envoy.service.cluster.v3.ClusterDiscoveryService/FetchClusters",
    ] {
        let status = raw_call(&ch, path, Bytes::from_static(&[0, 0xff, 0xff, 0xff, 0xff])).await;
        assert_eq!(status.code(), Code::ResourceExhausted, "{path}: {status:?}");
        assert!(
            status
                .message()
                .contains("4294967295, over the request_bytes limit of 4194304"),
            "{status:?}"
        );
    }
    assert_eq!(rejections(&log).get("request_bytes"), Some(&2));
}

/// Sends `first` as the request body (then keeps the body open forever) and
/// returns the call's gRPC status.
async fn raw_call(ch: &Channel, path: &str, first: Bytes) -> Status {
    use tower_service::Service;
    struct Hanging(Option<Bytes>);
    impl http_body::Body for Hanging {
        type Data = Bytes;
        type Error = Status;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
            match self.0.take() {
                Some(b) => Poll::Ready(Some(Ok(http_body::Frame::data(b)))),
                None => Poll::Pending,
            }
        }
    }
    let mut ch = ch.clone();
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://x{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(Hanging(Some(first))))
        .unwrap();
    std::future::poll_fn(|cx| ch.poll_ready(cx)).await.unwrap();
    let resp = tokio::time::timeout(T, ch.call(req))
        .await
        .unwrap()
        .unwrap();
    if let Some(s) = Status::from_header_map(resp.headers()) {
        return s;
    }
    let mut body = resp.into_body();
    loop {
        let frame = std::future::poll_fn(|cx| http_body::Body::poll_frame(Pin::new(&mut body), cx));
        match tokio::time::timeout(T, frame).await.expect("bounded") {
            Some(Ok(f)) => {
                if let Ok(t) = f.into_trailers() {
                    return Status::from_header_map(&t).expect("grpc-status");
                }
            }
            other => panic!("no trailers: {other:?}"),
        }
    }
}

/// Too many names in one request: SotW resource_names, Delta subscribe +
/// unsubscribe + initial versions, and Fetch.
#[tokio::test]
async fn resource_names_limit() {
    let limits = {
        let mut l = Limits::default();
        l.max_resource_names = 10;
        l
    };
    let (s, log, _) = server(limits).await;
    let ch = common::client::channel(s.addr).await;
    let names = |n: usize| (0..n).map(|i| format!("c{i}")).collect::<Vec<_>>();
    let mut o = open(&ch, cds(Some(node("n", "g")), &names(10)))
        .await
        .unwrap();
    o.next().await.unwrap();
    o.tx.send(cds(None, &names(11))).await.unwrap();
    assert_refused(
        o.next().await,
        Code::ResourceExhausted,
        "is 11, over the resource_names limit of 10",
    );

    let (tx, rx) = mpsc::channel(4);
    tx.send(DeltaDiscoveryRequest {
        node: Some(node("d", "g")),
        type_url: CDS.into(),
        resource_names_subscribe: names(6),
        resource_names_unsubscribe: names(3),
        initial_resource_versions: [
            ("c0".to_string(), "v".to_string()),
            ("c1".into(), "v".into()),
        ]
        .into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut d = AggregatedDiscoveryServiceClient::new(ch.clone())
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let r = tokio::time::timeout(T, d.message()).await.unwrap();
    assert_refused(
        r,
        Code::ResourceExhausted,
        "is 11, over the resource_names limit of 10",
    );

    let r = ClusterDiscoveryServiceClient::new(ch.clone())
        .fetch_clusters(cds(Some(node("f", "g")), &names(11)))
        .await;
    assert_refused(r, Code::ResourceExhausted, "resource_names limit of 10");
    assert_eq!(rejections(&log).get("resource_names"), Some(&3));
    drop(tx);
}

/// Streams per connection, per node and in total; a stream that ends gives
/// its place back.
#[tokio::test]
async fn stream_count_limits() {
    let limits = {
        let mut l = Limits::default();
        l.max_streams_per_connection = 2;
        l.max_streams_per_node = 2;
        l.max_streams = 4;
        l
    };
    let (s, log, _) = server(limits).await;
    let c1 = common::client::channel(s.addr).await;
    let c2 = common::client::channel(s.addr).await;
    let c3 = common::client::channel(s.addr).await;
    let mut a = open(&c1, cds(Some(node("a", "g")), &[])).await.unwrap();
    a.next().await.unwrap();
    let mut b = open(&c1, cds(Some(node("b", "g")), &[])).await.unwrap();
    b.next().await.unwrap();
    let r = open(&c1, cds(Some(node("c", "g")), &[])).await;
    assert_refused(
        r,
        Code::ResourceExhausted,
        "is 3, over the streams_per_connection limit of 2",
    );
    // Another connection may; the same node only twice.
    let mut a2 = open(&c2, cds(Some(node("a", "g")), &[])).await.unwrap();
    a2.next().await.unwrap();
    let mut a3 = open(&c2, cds(Some(node("a", "g")), &[])).await.unwrap();
    assert_refused(
        a3.next().await,
        Code::ResourceExhausted,
        "is 3, over the streams_per_node limit of 2",
    );
    let mut d = open(&c2, cds(Some(node("d", "g")), &[])).await.unwrap();
    d.next().await.unwrap();
    // Four open: the fifth is one too many on any connection.
    let r = open(&c3, cds(Some(node("e", "g")), &[])).await;
    assert_refused(
        r,
        Code::ResourceExhausted,
        "is 5, over the streams limit of 4",
    );
    // Waiting fetches count too (they may be held for long).
    let r = ClusterDiscoveryServiceClient::new(c3.clone())
        .fetch_clusters(cds(Some(node("f", "g")), &[]))
        .await;
    assert_refused(r, Code::ResourceExhausted, "over the streams limit of 4");
    // A stream that ends frees its places.
    drop(a);
    let deadline = tokio::time::Instant::now() + T;
    let e = loop {
        if let Ok(mut o) = open(&c3, cds(Some(node("e", "g")), &[])).await
            && o.next().await.is_ok()
        {
            break o;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a freed place is usable"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let r = rejections(&log);
    assert_eq!(r.get("streams_per_connection"), Some(&1));
    assert_eq!(r.get("streams_per_node"), Some(&1));
    assert!(r.get("streams").is_some_and(|n| *n >= 2), "{r:?}");
    drop((b, a2, d, e));
}

/// Node id, cluster and metadata sizes: INVALID_ARGUMENT on streams and fetches.
#[tokio::test]
async fn node_size_limits() {
    let limits = {
        let mut l = Limits::default();
        l.max_node_id_bytes = 64;
        l.max_node_metadata_bytes = 100;
        l
    };
    let (s, log, _) = server(limits).await;
    let ch = common::client::channel(s.addr).await;
    let long_id = node(&"i".repeat(65), "g");
    let mut o = open(&ch, cds(Some(long_id.clone()), &[])).await.unwrap();
    assert_refused(
        o.next().await,
        Code::InvalidArgument,
        "node.id length in bytes is 65, over the node_id_bytes limit of 64",
    );
    let mut o = open(&ch, cds(Some(node("n", &"g".repeat(65))), &[]))
        .await
        .unwrap();
    assert_refused(
        o.next().await,
        Code::InvalidArgument,
        "node.cluster length in bytes is 65",
    );
    let mut meta = node("m", "g");
    meta.metadata = Some(Struct {
        fields: [(
            "k".to_string(),
            Value {
                kind: Some(Kind::StringValue("v".repeat(200))),
            },
        )]
        .into(),
    });
    let mut o = open(&ch, cds(Some(meta), &[])).await.unwrap();
    assert_refused(
        o.next().await,
        Code::InvalidArgument,
        "over the node_metadata_bytes limit of 100",
    );
    let r = ClusterDiscoveryServiceClient::new(ch.clone())
        .fetch_clusters(cds(Some(long_id), &[]))
        .await;
    assert_refused(r, Code::InvalidArgument, "node_id_bytes limit of 64");
    let r = rejections(&log);
    assert_eq!(r.get("node_id_bytes"), Some(&3));
    assert_eq!(r.get("node_metadata_bytes"), Some(&1));
    // Within the limits all is well.
    let mut o = open(&ch, cds(Some(node(&"i".repeat(64), "g")), &[]))
        .await
        .unwrap();
    assert_eq!(o.next().await.unwrap().resources.len(), 1);
}

/// A REST body over the limit answers 413 naming the limit; one within it is served.
#[tokio::test]
async fn rest_body_limit() {
    let limits = {
        let mut l = Limits::default();
        l.max_rest_body_bytes = 256;
        l
    };
    let (s, log, _) = server(limits).await;
    let pad = "x".repeat(300);
    let body = format!(r#"{{"node":{{"id":"r","cluster":"g"}},"resourceNames":["{pad}"]}}"#);
    let (status, text) = post(s.addr, "/v3/discovery:clusters", &body).await;
    assert_eq!(status, 413, "{text}");
    assert!(
        text.contains("over the rest_body_bytes limit of 256"),
        "{text}"
    );
    assert_eq!(rejections(&log).get("rest_body_bytes"), Some(&1));
    let (status, text) = post(
        s.addr,
        "/v3/discovery:clusters",
        r#"{"node":{"id":"r","cluster":"g"}}"#,
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let _ = ResourceType::Cluster;
}

async fn post(addr: SocketAddr, path: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(T, s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let status: u16 = text[9..12].parse().unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}
