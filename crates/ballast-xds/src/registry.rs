//! The node registry: which proxies are connected, on how many streams, and
//! where each stands per type. A node's state is evicted a grace period after
//! its last stream closes (invariant 3); a reconnect within it resumes.
//! Disconnects never touch snapshots (invariant 2, docs/architecture.md).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use envoy_types::pb::envoy::config::core::v3::Node;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::events::{StreamKind, XdsEvent, XdsObserver};
use crate::status::TypeStatus;

/// Default time a disconnected node's state is kept.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

#[derive(Clone)]
/// The nodes the server knows (connected, or disconnected within their grace
/// period) and their per-type sync state: go-control-plane's `GetStatusInfo`.
/// Read it through [`XdsServer::registry`](crate::XdsServer::registry).
pub struct NodeRegistry {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Mutex<HashMap<Arc<str>, NodeEntry>>,
    grace: Duration,
    observer: Arc<dyn XdsObserver>,
    /// Number of nodes held, for waiters (tests, status).
    count: watch::Sender<usize>,
    next_stream: std::sync::atomic::AtomicU64,
}

struct NodeEntry {
    node: Arc<Node>,
    group: Arc<str>,
    streams: HashMap<u64, StreamEntry>,
    /// Bumped on every connect: an eviction timer from an older disconnect is void.
    generation: u64,
    disconnected_at: Option<Instant>,
    connected_since: SystemTime,
    last_types: Vec<TypeStatus>,
}

/// Computes a stream's current status on demand (status pages and CSDS are
/// rare; streams do not publish their state on every message).
pub(crate) type StatusSource = Arc<dyn Fn() -> Vec<TypeStatus> + Send + Sync>;

#[derive(Clone)]
struct StreamEntry {
    kind: StreamKind,
    types: Vec<TypeStatus>,
    source: Option<StatusSource>,
}

impl StreamEntry {
    fn types(&self) -> Vec<TypeStatus> {
        match &self.source {
            Some(f) => f(),
            None => self.types.clone(),
        }
    }
}

/// A snapshot of one node's state, for status pages and CSDS.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NodeStatus {
    /// The node's id.
    pub id: Arc<str>,
    /// The node as it last identified itself.
    pub node: Arc<Node>,
    /// The group (snapshot) it is served from.
    pub group: Arc<str>,
    /// Its open streams: a server-wide stream number and the protocol.
    pub streams: Vec<(u64, StreamKind)>,
    /// Whether any stream is open.
    pub connected: bool,
    /// When its first current stream opened (or its last one closed, when disconnected).
    pub connected_since: SystemTime,
    /// Per type, merged over the node's streams (a per-type service opens one each).
    pub types: Vec<TypeStatus>,
}

impl NodeRegistry {
    pub(crate) fn new(grace: Duration, observer: Arc<dyn XdsObserver>) -> Self {
        NodeRegistry {
            inner: Arc::new(Inner {
                nodes: Mutex::new(HashMap::new()),
                grace,
                observer,
                count: watch::Sender::new(0),
                next_stream: std::sync::atomic::AtomicU64::new(1),
            }),
        }
    }

    /// How long a disconnected node's state is kept.
    pub fn grace(&self) -> Duration {
        self.inner.grace
    }

    /// Registers a stream; dropping the handle unregisters it.
    pub fn open(&self, node: Node, group: Arc<str>, kind: StreamKind) -> StreamHandle {
        let id: Arc<str> = node.id.as_str().into();
        let stream = self
            .inner
            .next_stream
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let count = {
            let mut nodes = self.inner.nodes.lock();
            let entry = nodes.entry(id.clone()).or_insert_with(|| NodeEntry {
                node: Arc::new(node.clone()),
                group: group.clone(),
                streams: HashMap::new(),
                generation: 0,
                disconnected_at: None,
                connected_since: SystemTime::now(),
                last_types: Vec::new(),
            });
            entry.node = Arc::new(node);
            entry.group = group.clone();
            entry.generation += 1;
            entry.disconnected_at = None;
            entry.streams.insert(
                stream,
                StreamEntry {
                    kind,
                    types: Vec::new(),
                    source: None,
                },
            );
            nodes.len()
        };
        self.inner.count.send_replace(count);
        let group_for_handle = group.clone();
        self.inner.observer.on_event(&XdsEvent::StreamOpened {
            node: id.clone(),
            group,
            kind,
        });
        StreamHandle {
            registry: self.clone(),
            node: id,
            group: group_for_handle,
            stream,
            kind,
        }
    }

    /// Number of nodes held (connected or within their grace period).
    pub fn len(&self) -> usize {
        self.inner.nodes.lock().len()
    }

    /// Whether no node is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Watches the number of nodes held.
    pub fn watch_len(&self) -> watch::Receiver<usize> {
        self.inner.count.subscribe()
    }

    /// Every node held, sorted by id.
    pub fn nodes(&self) -> Vec<NodeStatus> {
        let nodes = self.inner.nodes.lock();
        let mut out: Vec<NodeStatus> = nodes.iter().map(|(id, e)| status_of(id, e)).collect();
        drop(nodes);
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// One node's state, if held.
    pub fn node(&self, id: &str) -> Option<NodeStatus> {
        let nodes = self.inner.nodes.lock();
        nodes.get_key_value(id).map(|(id, e)| status_of(id, e))
    }

    fn update(&self, node: &str, stream: u64, types: Vec<TypeStatus>) {
        let mut nodes = self.inner.nodes.lock();
        if let Some(s) = nodes.get_mut(node).and_then(|e| e.streams.get_mut(&stream)) {
            s.types = types;
        }
    }

    fn set_source(&self, node: &str, stream: u64, source: StatusSource) {
        let mut nodes = self.inner.nodes.lock();
        if let Some(s) = nodes.get_mut(node).and_then(|e| e.streams.get_mut(&stream)) {
            s.source = Some(source);
        }
    }

    fn close(&self, node: &Arc<str>, stream: u64, kind: StreamKind) {
        let schedule = {
            let mut nodes = self.inner.nodes.lock();
            match nodes.get_mut(node) {
                Some(e) => {
                    if let Some(last) = e.streams.remove(&stream)
                        && e.streams.is_empty()
                    {
                        // Kept for status during the grace period.
                        e.last_types = last.types();
                    }
                    if e.streams.is_empty() {
                        e.disconnected_at = Some(Instant::now());
                        Some(e.generation)
                    } else {
                        None
                    }
                }
                None => None,
            }
        };
        self.inner.observer.on_event(&XdsEvent::StreamClosed {
            node: node.clone(),
            kind,
        });
        if let Some(generation) = schedule {
            let registry = self.clone();
            let node = node.clone();
            let grace = self.inner.grace;
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    tokio::time::sleep(grace).await;
                    registry.evict_if_idle(&node, generation);
                });
            } else {
                self.evict_if_idle(node.as_ref(), generation);
            }
        }
    }

    fn evict_if_idle(&self, node: &str, generation: u64) {
        let (evicted, count) = {
            let mut nodes = self.inner.nodes.lock();
            let idle = nodes
                .get(node)
                .is_some_and(|e| e.streams.is_empty() && e.generation == generation);
            if idle {
                nodes.remove(node);
            }
            (idle, nodes.len())
        };
        if evicted {
            self.inner.count.send_replace(count);
            self.inner
                .observer
                .on_event(&XdsEvent::Evicted { node: node.into() });
        }
    }
}

fn status_of(id: &Arc<str>, e: &NodeEntry) -> NodeStatus {
    let mut types: Vec<TypeStatus> = Vec::new();
    if e.streams.is_empty() {
        types = e.last_types.clone();
    }
    for s in e.streams.values() {
        for t in s.types() {
            // A per-type service has one stream per type; on ADS the stream has all.
            match types.iter_mut().find(|x| x.ty == t.ty) {
                Some(x) => *x = t,
                None => types.push(t),
            }
        }
    }
    types.sort_by_key(|t| t.ty);
    let mut streams: Vec<(u64, StreamKind)> = e.streams.iter().map(|(k, s)| (*k, s.kind)).collect();
    streams.sort_by_key(|s| s.0);
    NodeStatus {
        id: id.clone(),
        node: e.node.clone(),
        group: e.group.clone(),
        connected: e.disconnected_at.is_none(),
        streams,
        connected_since: e.connected_since,
        types,
    }
}

/// One open stream in the registry; unregisters on drop.
pub struct StreamHandle {
    registry: NodeRegistry,
    node: Arc<str>,
    group: Arc<str>,
    stream: u64,
    kind: StreamKind,
}

impl StreamHandle {
    pub fn node(&self) -> &Arc<str> {
        &self.node
    }
    pub fn group(&self) -> &Arc<str> {
        &self.group
    }
    pub fn update(&self, types: Vec<TypeStatus>) {
        self.registry.update(&self.node, self.stream, types);
    }
    /// Status is read from `source` whenever asked, instead of [`StreamHandle::update`].
    pub fn set_status_source(&self, source: StatusSource) {
        self.registry.set_source(&self.node, self.stream, source);
    }
    pub fn observer(&self) -> &Arc<dyn XdsObserver> {
        &self.registry.inner.observer
    }
}

impl Drop for StreamHandle {
    fn drop(&mut self) {
        self.registry.close(&self.node, self.stream, self.kind);
    }
}
