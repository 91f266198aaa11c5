//! The server runs over any `XdsCache`, not only `SnapshotCache`: a second
//! implementation here, a linear cache (go-control-plane's `LinearCache`):
//! resources keyed by name, the same for every node, each update published
//! as a new snapshot at once.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use ballast_xds::{GroupWatch, Resource, ResourceType, Snapshot, XdsCache, XdsServer, simple};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::watch;

use common::client::Sotw;

/// Every node sees the same resources; `set`/`delete` publish immediately.
#[derive(Clone)]
struct LinearCache {
    resources: Arc<Mutex<BTreeMap<String, Arc<Resource>>>>,
    snapshot: watch::Sender<Option<Arc<Snapshot>>>,
    ready: watch::Sender<bool>,
}

impl LinearCache {
    fn new() -> Self {
        LinearCache {
            resources: Default::default(),
            snapshot: watch::Sender::new(None),
            ready: watch::Sender::new(true),
        }
    }

    fn set(&self, resource: Arc<Resource>) {
        let mut map = self.resources.lock();
        map.insert(resource.name().to_string(), resource);
        self.publish(&map);
    }

    fn delete(&self, name: &str) {
        let mut map = self.resources.lock();
        map.remove(name);
        self.publish(&map);
    }

    fn publish(&self, map: &BTreeMap<String, Arc<Resource>>) {
        let mut b = Snapshot::builder();
        for r in map.values() {
            b.add(r.clone());
        }
        // Clusters only: their EDS references are not this cache's business.
        let snap = b.build_unchecked().expect("no duplicate names in a map");
        self.snapshot.send_replace(Some(Arc::new(snap)));
    }
}

impl XdsCache for LinearCache {
    fn watch_ready(&self) -> watch::Receiver<bool> {
        self.ready.subscribe()
    }
    fn watch_group(&self, _group: &str) -> GroupWatch {
        GroupWatch::new(self.snapshot.subscribe())
    }
    fn snapshot(&self, _group: &str) -> Option<Arc<Snapshot>> {
        self.snapshot.borrow().clone()
    }
}

fn cluster(name: &str) -> Arc<Resource> {
    Resource::new(&simple::eds_cluster(name, Duration::from_secs(1))).unwrap()
}

fn names(resp: &DiscoveryResponse) -> Vec<String> {
    use ballast_xds::envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use prost::Message;
    resp.resources
        .iter()
        .map(|a| Cluster::decode(a.value.as_slice()).unwrap().name)
        .collect()
}

#[tokio::test]
async fn server_serves_a_linear_cache_and_follows_its_updates() {
    let cache = LinearCache::new();
    cache.set(cluster("a"));
    cache.set(cluster("b"));
    let server = XdsServer::builder(cache.clone()).build();
    assert!(server.cache().is_ready());
    assert_eq!(server.cache().snapshot("any").unwrap().total(), 2);

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let s = server.clone();
    let task = tokio::spawn(async move {
        s.serve_with_shutdown(listener, std::future::pending())
            .await
            .unwrap()
    });

    let mut c = Sotw::connect(addr, "node-1").await;
    c.request(ResourceType::Cluster, &[], "", "").await;
    let first = c.recv().await;
    assert_eq!(names(&first), ["a", "b"]);
    c.ack(&first, &[]).await;

    // An update of the cache reaches the connected client.
    cache.delete("a");
    let second = c.recv().await;
    assert_eq!(names(&second), ["b"]);
    assert_ne!(second.version_info, first.version_info);

    // A second node sees the same resources (no grouping in this cache).
    let mut d = Sotw::connect(addr, "node-2").await;
    d.request(ResourceType::Cluster, &[], "", "").await;
    assert_eq!(names(&d.recv().await), ["b"]);

    server.shutdown();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
}
