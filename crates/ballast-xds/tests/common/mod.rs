//! Shared helpers for ballast-xds integration tests.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ballast_xds::NodeGrouper;
use ballast_xds::{Snapshot, SnapshotCache, XdsServer, simple};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub mod client;

/// A running server on a loopback port; stops on drop.
pub struct Running {
    pub addr: SocketAddr,
    pub server: XdsServer,
    /// The cache the server runs over (a handle to publish into).
    pub cache: SnapshotCache,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Running {
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

pub fn one_group() -> NodeGrouper {
    Arc::new(|_| Ok("g".to_string()))
}

pub async fn start(cache: SnapshotCache, grace: Duration) -> Running {
    start_with(cache, grace, Arc::new(ballast_xds::NoopObserver)).await
}

/// A server over a cache holding `snap` for group `g`, ready (answering), with a 30 s grace
/// for resumed streams: where the conformance tests start.
pub async fn ready_server(snap: Snapshot) -> (SnapshotCache, Running) {
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", snap);
    cache.set_ready(true);
    let server = start(cache.clone(), Duration::from_secs(30)).await;
    (cache, server)
}

/// Logs to the test output when `RUST_LOG` is set.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

pub async fn start_with(
    cache: SnapshotCache,
    grace: Duration,
    observer: Arc<dyn ballast_xds::XdsObserver>,
) -> Running {
    init_tracing();
    let server = XdsServer::builder(cache.clone())
        .grouper(one_group())
        .grace(grace)
        .observer(observer)
        .build();
    serve(cache, server).await
}

/// A ready server for `snap` (group `g`) whose streams take a new snapshot
/// at most once per `interval` (`XdsServerBuilder::push_interval`).
pub async fn ready_paced_server(snap: Snapshot, interval: Duration) -> (SnapshotCache, Running) {
    init_tracing();
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", snap);
    cache.set_ready(true);
    let server = XdsServer::builder(cache.clone())
        .grouper(one_group())
        .push_interval(interval)
        .build();
    let running = serve(cache.clone(), server).await;
    (cache, running)
}

/// Serves `server` on a loopback port.
pub async fn serve(cache: SnapshotCache, server: XdsServer) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel();
    let s = server.clone();
    let task = tokio::spawn(async move {
        s.serve_with_shutdown(listener, async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    Running {
        addr,
        server,
        cache,
        stop: Some(tx),
        task: Some(task),
    }
}

/// Listener `http` on 127.0.0.1:0 (port chosen by Envoy) routing every host to
/// `clusters` (weighted), each an EDS cluster with the given endpoints.
pub fn http_snapshot(clusters: &[(&str, u32, &[SocketAddr])]) -> Snapshot {
    let mut b = Snapshot::builder();
    for (name, _, eps) in clusters {
        let eps: Vec<(String, u16)> = eps.iter().map(|a| (a.ip().to_string(), a.port())).collect();
        let eps: Vec<(&str, u16)> = eps.iter().map(|(i, p)| (i.as_str(), *p)).collect();
        b.message(&simple::eds_cluster(name, Duration::from_millis(500)))
            .unwrap();
        b.message(&simple::load_assignment(name, &eps)).unwrap();
    }
    let weights: Vec<(&str, u32)> = clusters.iter().map(|(n, w, _)| (*n, *w)).collect();
    b.message(&simple::http_listener("http", "127.0.0.1", 0, "routes"))
        .unwrap();
    b.message(&simple::route_config("routes", &[("*", &weights)]))
        .unwrap();
    b.build().unwrap()
}

/// Clusters `names` (EDS, endpoints on 127.0.0.1:`port`), listener `l1` with
/// route configuration `r1` sending everything to `route_to`.
pub fn fixture(names: &[&str], route_to: &str, port: u16) -> Snapshot {
    let mut b = Snapshot::builder();
    for n in names {
        b.message(&simple::eds_cluster(n, Duration::from_secs(1)))
            .unwrap();
        b.message(&simple::load_assignment(n, &[("127.0.0.1", port)]))
            .unwrap();
    }
    b.message(&simple::http_listener("l1", "127.0.0.1", 0, "r1"))
        .unwrap();
    b.message(&simple::route_config("r1", &[("*", &[(route_to, 1)])]))
        .unwrap();
    b.build().unwrap()
}

/// Names of the resources in a SotW response, in order.
pub fn names(
    resp: &ballast_xds::envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse,
) -> Vec<String> {
    use ballast_xds::Resource;
    resp.resources
        .iter()
        .map(|a| Resource::from_any(a).unwrap().name().to_string())
        .collect()
}

/// Records every event, for assertions on what a server did.
#[derive(Clone, Default)]
pub struct EventLog(Arc<std::sync::Mutex<Vec<ballast_xds::XdsEvent>>>);

impl EventLog {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn observer(&self) -> Arc<dyn ballast_xds::XdsObserver> {
        let log = self.0.clone();
        Arc::new(move |e: &ballast_xds::XdsEvent| log.lock().unwrap().push(e.clone()))
    }

    pub fn events(&self) -> Vec<ballast_xds::XdsEvent> {
        self.0.lock().unwrap().clone()
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// `ResponseSent` events of type `ty` (any type if `None`) from index `from` on.
    pub fn responses_since(&self, from: usize, ty: Option<ballast_xds::ResourceType>) -> usize {
        self.0.lock().unwrap()[from..]
            .iter()
            .filter(|e| {
                matches!(e, ballast_xds::XdsEvent::ResponseSent { ty: t, .. } if ty.is_none_or(|ty| ty == *t))
            })
            .count()
    }
}

/// The bound address of Envoy listener `name` once it is active.
pub async fn listener_addr(envoy: &ballast_testkit::Envoy, name: &str) -> SocketAddr {
    ballast_testkit::wait_for(
        Duration::from_secs(60),
        Duration::from_millis(50),
        || async {
            envoy
                .listener_addrs()
                .await?
                .get(name)
                .copied()
                .ok_or_else(|| anyhow::anyhow!("listener {name} not there yet"))
        },
    )
    .await
    .expect("listener appears")
}

/// Like [`http_snapshot`], but every host routes to `route_to` alone while
/// `clusters` (each an EDS cluster with its endpoints) may hold more.
pub fn routed_snapshot(route_to: &str, clusters: &[(&str, &[SocketAddr])]) -> Snapshot {
    let mut b = Snapshot::builder();
    for (name, eps) in clusters {
        let eps: Vec<(String, u16)> = eps.iter().map(|a| (a.ip().to_string(), a.port())).collect();
        let eps: Vec<(&str, u16)> = eps.iter().map(|(i, p)| (i.as_str(), *p)).collect();
        b.message(&simple::eds_cluster(name, Duration::from_millis(500)))
            .unwrap();
        b.message(&simple::load_assignment(name, &eps)).unwrap();
    }
    b.message(&simple::http_listener("http", "127.0.0.1", 0, "routes"))
        .unwrap();
    b.message(&simple::route_config("routes", &[("*", &[(route_to, 1)])]))
        .unwrap();
    b.build().unwrap()
}
