//! Issue 8 §2 — REST-JSON errors a client can act on: an unknown
//! `/v3/discovery:<type>` is 404 with a message (it was 200 with an empty
//! body), and a request the server cannot answer because it is shutting down
//! is 503 (retry elsewhere), not 400.

mod common;

use std::time::Duration;

use ballast_xds::{SnapshotCache, XdsServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const T: Duration = Duration::from_secs(30);

async fn post(addr: std::net::SocketAddr, path: &str, body: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(T, s.read_to_end(&mut out))
        .await
        .expect("an answer within the bound")
        .unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let code = text.get(9..12).unwrap_or("0").parse().unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (code, body)
}

#[tokio::test]
async fn unknown_discovery_type_is_404_with_a_message() {
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", common::fixture(&["a"], "a", 1));
    cache.set_ready(true);
    let s = common::start(cache, Duration::from_secs(30)).await;
    let body = r#"{"node":{"id":"rest-1"}}"#;
    let (status, text) = post(s.addr, "/v3/discovery:clustres", body).await;
    assert_eq!(status, 404, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let msg = v["error"].as_str().unwrap();
    assert!(msg.contains("/v3/discovery:clustres"), "{msg}");
    assert!(msg.contains("/v3/discovery:clusters"), "{msg}");
    // The known endpoints still answer.
    let (status, text) = post(s.addr, "/v3/discovery:clusters", body).await;
    assert_eq!(status, 200, "{text}");
}

/// Issue 15: a poll naming a gateway the (ready) server does not have is
/// answered at once with 404 and a message, not held until the client's own
/// timeout; once the gateway appears the same poll gets 200.
#[tokio::test]
async fn unknown_gateway_is_404_at_once_then_200_when_it_appears() {
    common::init_tracing();
    let cache = SnapshotCache::new();
    cache.set_snapshot("edge", common::fixture(&["a"], "a", 1));
    cache.set_ready(true);
    let by_cluster: ballast_xds::NodeGrouper = std::sync::Arc::new(|n| Ok(n.cluster.clone()));
    let server = XdsServer::builder(cache.clone())
        .grouper(by_cluster)
        .build();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(server.serve_with_shutdown(listener, std::future::pending::<()>()));
    let body = r#"{"node":{"id":"rest-1","cluster":"nope"}}"#;
    // `post` fails unless answered within its bound (before: held forever).
    let (status, text) = post(addr, "/v3/discovery:clusters", body).await;
    assert_eq!(status, 404, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let msg = v["error"].as_str().unwrap();
    assert!(
        msg.contains(r#"no gateway "nope""#) && msg.contains("rest-1"),
        "{msg}"
    );
    // A known gateway still answers.
    let known = r#"{"node":{"id":"rest-2","cluster":"edge"}}"#;
    let (status, text) = post(addr, "/v3/discovery:clusters", known).await;
    assert_eq!(status, 200, "{text}");
    // The gateway appears: the same poll is answered with its config.
    cache.set_snapshot("nope", common::fixture(&["a"], "a", 1));
    let (status, text) = post(addr, "/v3/discovery:clusters", body).await;
    assert_eq!(status, 200, "{text}");
    task.abort();
}

#[tokio::test]
async fn fetch_held_during_shutdown_is_503() {
    common::init_tracing();
    // Not ready: the fetch is held (invariant 1, docs/architecture.md) until shutdown ends it.
    let cache = SnapshotCache::new();
    let server = XdsServer::builder(cache)
        .grouper(common::one_group())
        .build();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.clone().serve_with_shutdown(listener, async {
        let _ = rx.await;
    }));
    let held = tokio::spawn(async move {
        post(
            addr,
            "/v3/discovery:clusters",
            r#"{"node":{"id":"rest-held"}}"#,
        )
        .await
    });
    // Held: the request reached the server and waits.
    ballast_testkit::wait_until(T, Duration::from_millis(20), || async {
        !server.registry().nodes().is_empty()
    })
    .await
    .unwrap();
    stop.send(()).unwrap();
    let (status, text) = tokio::time::timeout(T, held).await.unwrap().unwrap();
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("shutting down"), "{text}");
    tokio::time::timeout(T, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// Issue 15: a gRPC `FetchClusters` for a gateway the ready server does not
/// have ends with NOT_FOUND naming it (it used to wait until the client's own
/// deadline); a group published within `UNKNOWN_GROUP_WAIT` of the request
/// (published on demand) is answered. The grouper sees each request's
/// transport.
#[tokio::test]
async fn grpc_fetch_for_an_unknown_gateway_is_not_found() {
    use ballast_xds::Transport;
    use ballast_xds::envoy_types::pb::envoy::config::core::v3::Node;
    use ballast_xds::envoy_types::pb::envoy::service::cluster::v3::cluster_discovery_service_client::ClusterDiscoveryServiceClient;
    use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
    common::init_tracing();
    let cache = SnapshotCache::new();
    cache.set_snapshot("edge@Fetch", common::fixture(&["a"], "a", 1));
    cache.set_ready(true);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let grouper: ballast_xds::TransportGrouper =
        std::sync::Arc::new(move |n: &Node, t: Transport| {
            s2.lock().unwrap().push(t);
            Ok(format!("{}@{t:?}", n.cluster))
        });
    let server = XdsServer::builder(cache.clone())
        .transport_grouper(grouper)
        .build();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(server.serve_with_shutdown(listener, std::future::pending::<()>()));
    let mut client = ClusterDiscoveryServiceClient::new(common::client::channel(addr).await);
    let req = |cluster: &str| DiscoveryRequest {
        node: Some(Node {
            id: "f-1".into(),
            cluster: cluster.into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let err = tokio::time::timeout(T, client.fetch_clusters(req("nope")))
        .await
        .expect("answered within the bound")
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{err}");
    assert!(
        err.message().contains(r#"no gateway "nope@Fetch""#) && err.message().contains("f-1"),
        "{err}"
    );
    let ok = client
        .fetch_clusters(req("edge"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.resources.len(), 1);
    // Published on demand shortly after the request: answered, not 404.
    let late = cache.clone();
    let publish = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        late.set_snapshot("later@Fetch", common::fixture(&["b"], "b", 1));
    });
    let ok = client
        .fetch_clusters(req("later"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.resources.len(), 1);
    publish.await.unwrap();
    // REST polls are grouped as REST.
    let body = r#"{"node":{"id":"rest-1","cluster":"edge"}}"#;
    let (status, _) = post(addr, "/v3/discovery:clusters", body).await;
    assert_eq!(status, 404, "group edge@Rest is not published");
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.contains(&Transport::Fetch) && seen.contains(&Transport::Rest),
        "{seen:?}"
    );
    task.abort();
}
