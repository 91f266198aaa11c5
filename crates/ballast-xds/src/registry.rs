//! The node registry: which proxies are connected, on how many streams, and
//! where each stands per type. A node's state is evicted a grace period after
//! its last stream closes (invariant 3); a reconnect within it resumes.
//! Disconnects never touch snapshots (invariant 2, docs/architecture.md).

use std::collections::{HashMap, VecDeque};
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
    evictions: Mutex<Evictions>,
}

/// Nodes whose last stream closed, in the order their grace periods end
/// (the grace is the same for all), and whether a task sweeps them. One
/// task and one timer for all: a task per close was 6 % of a reconnect
/// storm's CPU (W5, issue #13), mostly allocating its aligned task cell.
#[derive(Default)]
struct Evictions {
    due: VecDeque<(tokio::time::Instant, Arc<str>, u64)>,
    sweeping: bool,
}

/// Clears [`Evictions::sweeping`] if the sweeping task is dropped before it
/// finishes (with its runtime): the next close then starts one on the
/// current runtime. Disarmed (`None`) once the task clears it itself.
struct Sweeping(Option<Arc<Inner>>);

impl Sweeping {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for Sweeping {
    fn drop(&mut self) {
        if let Some(inner) = &self.0 {
            inner.evictions.lock().sweeping = false;
        }
    }
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
                evictions: Mutex::new(Evictions::default()),
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
            let node = Arc::new(node);
            let entry = nodes.entry(id.clone()).or_insert_with(|| NodeEntry {
                node: node.clone(),
                group: group.clone(),
                streams: HashMap::new(),
                generation: 0,
                disconnected_at: None,
                connected_since: SystemTime::now(),
                last_types: Vec::new(),
            });
            entry.node = node;
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
        // Dropped after the lock: the stream's status source owns its
        // protocol machine, and the replaced status its resources.
        let mut removed = None;
        let mut replaced = Vec::new();
        let schedule = {
            let mut nodes = self.inner.nodes.lock();
            match nodes.get_mut(node) {
                Some(e) => {
                    removed = e.streams.remove(&stream);
                    if let Some(last) = &removed
                        && e.streams.is_empty()
                    {
                        // Kept for status during the grace period.
                        replaced = std::mem::replace(&mut e.last_types, last.types());
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
        drop((removed, replaced));
        self.inner.observer.on_event(&XdsEvent::StreamClosed {
            node: node.clone(),
            kind,
        });
        if let Some(generation) = schedule {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => self.schedule_eviction(&rt, node.clone(), generation),
                Err(_) => self.evict_if_idle(node.as_ref(), generation),
            }
        }
    }

    /// Evicts `node` a grace period from now unless it reconnected (its
    /// generation moved on), through the one sweeping task.
    fn schedule_eviction(&self, rt: &tokio::runtime::Handle, node: Arc<str>, generation: u64) {
        let start = {
            let mut ev = self.inner.evictions.lock();
            let due = tokio::time::Instant::now() + self.inner.grace;
            ev.due.push_back((due, node, generation));
            !std::mem::replace(&mut ev.sweeping, true)
        };
        if start {
            let registry = self.clone();
            let mut guard = Sweeping(Some(self.inner.clone()));
            rt.spawn(async move {
                registry.sweep().await;
                guard.disarm();
            });
        }
    }

    /// Evicts what is due, in order, until nothing is left to wait for.
    async fn sweep(&self) {
        loop {
            let now = tokio::time::Instant::now();
            let (ready, next) = {
                let mut ev = self.inner.evictions.lock();
                let n = ev.due.iter().take_while(|(at, ..)| *at <= now).count();
                let ready: Vec<_> = ev.due.drain(..n).collect();
                let next = ev.due.front().map(|(at, ..)| *at);
                if ready.is_empty() && next.is_none() {
                    // Cleared under the lock: a close that queues after
                    // this starts a new task.
                    ev.sweeping = false;
                    return;
                }
                (ready, next)
            };
            for (_, node, generation) in ready {
                self.evict_if_idle(&node, generation);
            }
            if let Some(at) = next {
                tokio::time::sleep_until(at).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn registry(grace: Duration) -> (NodeRegistry, Arc<Mutex<Vec<Arc<str>>>>) {
        let evicted = Arc::new(Mutex::new(Vec::new()));
        let e = evicted.clone();
        let observer: Arc<dyn XdsObserver> = Arc::new(move |ev: &XdsEvent| {
            if let XdsEvent::Evicted { node } = ev {
                e.lock().push(node.clone());
            }
        });
        (NodeRegistry::new(grace, observer), evicted)
    }

    fn open(r: &NodeRegistry, id: &str) -> StreamHandle {
        let node = Node {
            id: id.into(),
            ..Default::default()
        };
        r.open(node, "g".into(), StreamKind::Delta(None))
    }

    /// One sweeping task evicts each node a grace period after its last
    /// stream closed, in order; a node back within its grace is kept, and
    /// the task ends when nothing is due (a later close starts another).
    #[tokio::test(start_paused = true)]
    async fn nodes_are_evicted_a_grace_after_their_last_close() {
        let grace = Duration::from_secs(30);
        let (r, evicted) = registry(grace);
        let (a, b, c) = (open(&r, "a"), open(&r, "b"), open(&r, "c"));
        drop(a);
        tokio::time::sleep(Duration::from_secs(10)).await;
        drop(b);
        drop(c);
        let c2 = open(&r, "c");
        assert!(r.inner.evictions.lock().sweeping);
        tokio::time::sleep(Duration::from_secs(21)).await;
        assert_eq!(*evicted.lock(), [Arc::<str>::from("a")]);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(evicted.lock().len(), 2, "b too; c reconnected");
        assert_eq!(r.len(), 1);
        assert!(r.node("c").unwrap().connected);
        tokio::task::yield_now().await;
        assert!(!r.inner.evictions.lock().sweeping, "the task ended");
        drop(c2);
        tokio::time::sleep(grace + Duration::from_secs(1)).await;
        assert_eq!(evicted.lock().len(), 3);
        assert!(r.is_empty());
    }

    /// A sweeping task dropped with its runtime leaves no stale flag: the
    /// next close, on another runtime, sweeps again.
    #[test]
    fn a_sweeper_lost_with_its_runtime_is_replaced() {
        let (r, evicted) = registry(Duration::from_millis(10));
        let rt = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap()
        };
        let first = rt();
        first.block_on(async { drop(open(&r, "a")) });
        assert!(r.inner.evictions.lock().sweeping);
        drop(first);
        assert!(!r.inner.evictions.lock().sweeping);
        rt().block_on(async {
            drop(open(&r, "b"));
            // Paused clock: each sleep lets the sweeper run first.
            for _ in 0..100 {
                if evicted.lock().len() == 2 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        assert_eq!(evicted.lock().len(), 2, "a (still queued) and b");
    }
}
