//! The snapshot cache: the latest snapshot per group, published atomically
//! through `watch` channels, plus the server-wide readiness gate (invariant 1).
//!
//! Publishing never waits for clients: each stream holds a receiver and
//! computes its own diff when it next runs, so a slow or stuck client cannot
//! block publishing or other clients.
//!
//! Each group also keeps its last few published snapshots (a bounded history,
//! default [`DEFAULT_HISTORY`]). Versions are content hashes (invariant 5), so
//! a version a reconnecting proxy reports names content exactly — whichever
//! replica sent it — and the history tells a new stream what that proxy holds
//! (its make-before-break gating then starts from the truth, not from empty).
//! Resources are shared `Arc`s, so the history costs little beyond the
//! resource versions that exist only in older snapshots.
//!
//! Slots are created for any group a client names (Ballast groups by the
//! client-chosen `node.cluster`), so they must not outlive their use: a slot
//! with no snapshot and no watcher is freed when the server's last watcher of
//! it goes away, and otherwise swept lazily as new slots are created.
//! [`SnapshotCache::clear`] drops a group the application no longer serves.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::snapshot::Snapshot;

/// How many published snapshots per group are kept by default (the current one included).
pub const DEFAULT_HISTORY: usize = 16;

struct SlotInner {
    tx: watch::Sender<Option<Arc<Snapshot>>>,
    /// Recently published snapshots, newest first (the current one included).
    history: Mutex<VecDeque<Arc<Snapshot>>>,
}

type Slot = Arc<SlotInner>;

impl SlotInner {
    /// Nobody needs this slot: no snapshot, no watcher, and no caller
    /// holding it (`held` = references the caller itself knows of).
    fn unused(self: &Slot, held: usize) -> bool {
        Arc::strong_count(self) <= held
            && self.tx.receiver_count() == 0
            && self.tx.borrow().is_none()
    }
}

#[derive(Default)]
struct Groups {
    map: HashMap<Arc<str>, Slot>,
    /// Size after the last sweep: the next sweep runs when the map has doubled
    /// since, so sweeping costs O(1) amortised per created slot.
    swept_at: usize,
}

impl Groups {
    fn sweep(&mut self) {
        self.map.retain(|_, s| !s.unused(1));
        self.swept_at = self.map.len();
    }
}

#[derive(Clone)]
/// The latest snapshot per group of nodes (go-control-plane's `SnapshotCache`),
/// published through `tokio::sync::watch`, plus the readiness gate. Cheap to
/// clone: clones share one cache.
pub struct SnapshotCache {
    inner: Arc<Inner>,
}

struct Inner {
    groups: Mutex<Groups>,
    ready: watch::Sender<bool>,
    history: usize,
}

/// Configures a [`SnapshotCache`].
#[derive(Clone, Debug)]
pub struct SnapshotCacheBuilder {
    history: usize,
}

impl SnapshotCacheBuilder {
    /// How many published snapshots per group to keep (the current one
    /// included; at least 1) for resolving what a reconnecting proxy holds.
    pub fn history(mut self, n: usize) -> Self {
        self.history = n.max(1);
        self
    }

    /// The cache, not ready yet.
    pub fn build(self) -> SnapshotCache {
        SnapshotCache {
            inner: Arc::new(Inner {
                groups: Mutex::new(Groups::default()),
                ready: watch::Sender::new(false),
                history: self.history,
            }),
        }
    }
}

impl Default for SnapshotCache {
    fn default() -> Self {
        Self::new()
    }
}

impl SnapshotCache {
    /// A cache that is not ready: streams are accepted, requests are held.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// Configures a cache (e.g. how much history to keep).
    pub fn builder() -> SnapshotCacheBuilder {
        SnapshotCacheBuilder {
            history: DEFAULT_HISTORY,
        }
    }

    /// The application says every source finished its initial sync. Until
    /// then no response leaves, whatever snapshots exist.
    pub fn set_ready(&self, ready: bool) {
        self.inner.ready.send_replace(ready);
    }

    /// Whether [`set_ready`](Self::set_ready)`(true)` was called (and not undone).
    pub fn is_ready(&self) -> bool {
        *self.inner.ready.borrow()
    }

    /// The readiness gate as a watch, for tasks that wait for it.
    pub fn watch_ready(&self) -> watch::Receiver<bool> {
        self.inner.ready.subscribe()
    }

    fn slot(&self, group: &str) -> Slot {
        Self::slot_in(&mut self.inner.groups.lock(), group)
    }

    fn slot_in(groups: &mut Groups, group: &str) -> Slot {
        if let Some(s) = groups.map.get(group) {
            return s.clone();
        }
        if groups.map.len() >= (2 * groups.swept_at).max(64) {
            groups.sweep();
        }
        let slot: Slot = Arc::new(SlotInner {
            tx: watch::Sender::new(None),
            history: Mutex::new(VecDeque::new()),
        });
        groups.map.insert(group.into(), slot.clone());
        slot
    }

    /// Forgets a group (go-control-plane's `ClearSnapshot`): its snapshot and
    /// history are dropped and its watchers see `None`, so streams of that
    /// group hold their requests as before its first snapshot (proxies keep
    /// what they have; nothing is removed from them). Call it when the
    /// application stops serving a group for good, e.g. a deleted gateway:
    /// clients naming it afterwards are held until a snapshot is set again.
    /// The slot itself is freed once no watcher remains.
    pub fn clear(&self, group: &str) {
        let slot = {
            let mut groups = self.inner.groups.lock();
            let Some(slot) = groups.map.get(group).cloned() else {
                return;
            };
            // Kept while watched: its watchers must see the group's next
            // snapshot if one is set again.
            if Arc::strong_count(&slot) <= 2 && slot.tx.receiver_count() == 0 {
                groups.map.remove(group);
            }
            slot
        };
        slot.history.lock().clear();
        slot.tx.send_replace(None);
    }

    /// Frees `group`'s slot if it has no snapshot, no watcher and no other
    /// user: the server calls it when a stream or fetch that watched the group
    /// ends, so groups named by clients leave nothing behind.
    pub(crate) fn release(&self, group: &str) {
        let mut groups = self.inner.groups.lock();
        if groups.map.get(group).is_some_and(|s| s.unused(1)) {
            groups.map.remove(group);
        }
    }

    /// How many group slots exist (with or without a snapshot); for tests and
    /// memory accounting.
    pub fn slot_count(&self) -> usize {
        self.inner.groups.lock().map.len()
    }

    /// Publishes a group's snapshot atomically. The snapshot was checked for
    /// consistency when it was built.
    pub fn set_snapshot(&self, group: &str, snapshot: impl Into<Arc<Snapshot>>) -> Arc<Snapshot> {
        let snapshot = snapshot.into();
        let slot = self.slot(group);
        if let Some(prev) = slot.tx.borrow().as_ref()
            && !Arc::ptr_eq(prev, &snapshot)
        {
            // Once per publish, so streams need only look at what changed.
            snapshot.record_changes_from(prev);
        }
        {
            let mut h = slot.history.lock();
            if h.front().is_none_or(|f| !Arc::ptr_eq(f, &snapshot)) {
                h.push_front(snapshot.clone());
                h.truncate(self.inner.history);
            }
        }
        // Sent outside the lock (docs/architecture.md §3).
        slot.tx.send_replace(Some(snapshot.clone()));
        snapshot
    }

    /// The group's current snapshot (go-control-plane's `GetSnapshot`).
    pub fn snapshot(&self, group: &str) -> Option<Arc<Snapshot>> {
        let slot = self.inner.groups.lock().map.get(group).cloned();
        slot.and_then(|s| s.tx.borrow().clone())
    }

    /// The group's recently published snapshots, newest (the current one) first.
    pub fn history(&self, group: &str) -> Vec<Arc<Snapshot>> {
        let slot = self.inner.groups.lock().map.get(group).cloned();
        slot.map(|s| s.history.lock().iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Watches a group's snapshot; `None` until its first one is published.
    /// A slot created only for this watch is freed lazily after the receiver
    /// is dropped (see [`SnapshotCache::watch_group`] to free it at once).
    pub fn watch(&self, group: &str) -> watch::Receiver<Option<Arc<Snapshot>>> {
        // Subscribed under the lock, so a concurrent release sees the watcher.
        let mut groups = self.inner.groups.lock();
        Self::slot_in(&mut groups, group).tx.subscribe()
    }

    /// Like [`SnapshotCache::watch`], but the group's slot is freed as soon as
    /// the returned watch is dropped, if it is then unused.
    pub fn watch_group(&self, group: &str) -> GroupWatch {
        let cache = self.clone();
        let group: Arc<str> = group.into();
        GroupWatch::with_release(self.watch(&group), move || cache.release(&group))
    }

    /// Groups that have a snapshot, sorted.
    pub fn groups(&self) -> Vec<Arc<str>> {
        let groups = self.inner.groups.lock();
        let mut out: Vec<Arc<str>> = groups
            .map
            .iter()
            .filter(|(_, s)| s.tx.borrow().is_some())
            .map(|(g, _)| g.clone())
            .collect();
        out.sort();
        out
    }

    /// Ready for this group: the server is ready and the group has a snapshot.
    pub fn is_group_ready(&self, group: &str) -> bool {
        self.is_ready() && self.snapshot(group).is_some()
    }
}

/// A group's snapshot receiver, with an optional action run when it is
/// dropped (the [`SnapshotCache`] frees the group's slot then, if nothing else
/// uses it). Derefs to the `watch::Receiver`.
pub struct GroupWatch {
    rx: Option<watch::Receiver<Option<Arc<Snapshot>>>>,
    release: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl GroupWatch {
    /// A watch with nothing to do on drop.
    pub fn new(rx: watch::Receiver<Option<Arc<Snapshot>>>) -> Self {
        GroupWatch {
            rx: Some(rx),
            release: None,
        }
    }

    /// A watch that calls `release` once it is dropped (after the receiver
    /// itself is gone, so `release` no longer sees it as a watcher).
    pub fn with_release(
        rx: watch::Receiver<Option<Arc<Snapshot>>>,
        release: impl FnOnce() + Send + Sync + 'static,
    ) -> Self {
        GroupWatch {
            rx: Some(rx),
            release: Some(Box::new(release)),
        }
    }
}

impl std::ops::Deref for GroupWatch {
    type Target = watch::Receiver<Option<Arc<Snapshot>>>;
    fn deref(&self) -> &Self::Target {
        self.rx.as_ref().expect("present until drop")
    }
}

impl std::ops::DerefMut for GroupWatch {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.rx.as_mut().expect("present until drop")
    }
}

impl Drop for GroupWatch {
    fn drop(&mut self) {
        // The receiver goes first, so the slot no longer counts it.
        drop(self.rx.take());
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// What an [`XdsServer`](crate::XdsServer) reads from a cache (go-control-plane's
/// `cache.Cache`): the readiness gate and, per group, the current snapshot as
/// a watch. [`SnapshotCache`] is the library's implementation; implement it to
/// serve from something else (a linear cache keyed by resource, a mux of
/// caches by group, ...). Every stream calls [`watch_group`](Self::watch_group)
/// once and then only reads its watch, so implementations publish by sending
/// on the watch and never wait for clients.
pub trait XdsCache: Send + Sync + 'static {
    /// The readiness gate: no response leaves while it is `false`.
    fn watch_ready(&self) -> watch::Receiver<bool>;

    /// Whether the gate is open now.
    fn is_ready(&self) -> bool {
        *self.watch_ready().borrow()
    }

    /// A group's snapshot as a watch: `None` until it has one. Called once
    /// per stream and per fetch; the watch is dropped when they end.
    fn watch_group(&self, group: &str) -> GroupWatch;

    /// The group's current snapshot.
    fn snapshot(&self, group: &str) -> Option<Arc<Snapshot>> {
        self.watch_group(group).borrow().clone()
    }

    /// The group's recent snapshots, newest first: lets a reconnecting client
    /// that reports a version resume from exactly what it holds. By default
    /// only the current one.
    fn history(&self, group: &str) -> Vec<Arc<Snapshot>> {
        self.snapshot(group).into_iter().collect()
    }

    /// Groups that have a snapshot, sorted, for status pages. By default none
    /// are listed.
    fn groups(&self) -> Vec<Arc<str>> {
        Vec::new()
    }
}

impl XdsCache for SnapshotCache {
    fn watch_ready(&self) -> watch::Receiver<bool> {
        SnapshotCache::watch_ready(self)
    }
    fn is_ready(&self) -> bool {
        SnapshotCache::is_ready(self)
    }
    fn watch_group(&self, group: &str) -> GroupWatch {
        SnapshotCache::watch_group(self, group)
    }
    fn snapshot(&self, group: &str) -> Option<Arc<Snapshot>> {
        SnapshotCache::snapshot(self, group)
    }
    fn history(&self, group: &str) -> Vec<Arc<Snapshot>> {
        SnapshotCache::history(self, group)
    }
    fn groups(&self) -> Vec<Arc<str>> {
        SnapshotCache::groups(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ResourceType::ClusterLoadAssignment as EDS;
    use crate::simple;

    /// EDS clusters `a`..`d`, each with one endpoint on the port given.
    fn snap(ports: [u16; 4]) -> Snapshot {
        let mut b = Snapshot::builder();
        for (n, p) in ["a", "b", "c", "d"].into_iter().zip(ports) {
            b.message(&simple::eds_cluster(n, std::time::Duration::from_secs(1)))
                .unwrap();
            b.message(&simple::load_assignment(n, &[("127.0.0.1", p)]))
                .unwrap();
        }
        b.build().unwrap()
    }

    fn names(c: Option<std::borrow::Cow<'_, [Arc<str>]>>) -> Option<Vec<String>> {
        c.map(|c| c.iter().map(|n| n.to_string()).collect())
    }

    /// A stream several publishes behind learns what changed from the chain
    /// of recorded changes, also beyond the history (the changes outlive the
    /// snapshots; `snapshot::tests` covers the chain's bound).
    #[test]
    fn changes_since_an_older_snapshot_follow_the_history() {
        let cache = SnapshotCache::builder().history(4).build();
        let s1 = cache.set_snapshot("g", snap([1, 1, 1, 1]));
        let base = s1.resources(EDS).clone();
        cache.set_snapshot("g", snap([2, 1, 1, 1]));
        cache.set_snapshot("g", snap([2, 1, 3, 1]));
        let s4 = cache.set_snapshot("g", snap([1, 1, 3, 1]));
        assert_eq!(
            names(s4.changed_since(EDS, &base)),
            Some(vec!["a".into(), "c".into()]),
            "a changed and changed back: listed (it plans to nothing); c changed"
        );
        drop(s1);
        let small = SnapshotCache::builder().history(1).build();
        let t1 = small.set_snapshot("g", snap([1, 1, 1, 1]));
        let base = t1.resources(EDS).clone();
        drop(t1);
        small.set_snapshot("g", snap([2, 1, 1, 1]));
        let t3 = small.set_snapshot("g", snap([2, 2, 1, 1]));
        assert_eq!(
            names(t3.changed_since(EDS, &base)),
            Some(vec!["a".into(), "b".into()])
        );
    }

    /// One snapshot published in two groups in opposite orders links both
    /// ways; asking about a map neither holds ends (no endless walk).
    #[test]
    fn a_cycle_of_predecessors_is_walked_a_bounded_number_of_times() {
        let cache = SnapshotCache::new();
        let a: Arc<Snapshot> = Arc::new(snap([1, 1, 1, 1]));
        let b: Arc<Snapshot> = Arc::new(snap([2, 1, 1, 1]));
        cache.set_snapshot("g1", a.clone());
        cache.set_snapshot("g1", b.clone());
        cache.set_snapshot("g2", b.clone());
        cache.set_snapshot("g2", a.clone());
        let other = Arc::new(snap([3, 3, 3, 3]).resources(EDS).as_ref().clone());
        assert_eq!(names(a.changed_since(EDS, &other)), None);
        assert!(!a.same_keys_since(EDS, &other), "unknown: not the same");
    }

    /// `clear` drops a group's snapshot and history; a watcher sees `None`
    /// and keeps the slot (it must see the group's next snapshot), which is
    /// freed once the last watcher goes. Unwatched groups go at once.
    #[test]
    fn clear_forgets_a_group_and_its_watchers_see_none() {
        let cache = SnapshotCache::new();
        cache.set_snapshot("g", snap([1, 1, 1, 1]));
        cache.set_snapshot("h", snap([1, 1, 1, 1]));
        let mut rx = cache.watch_group("g");
        assert!(rx.borrow_and_update().is_some());
        cache.clear("g");
        assert!(rx.has_changed().unwrap());
        assert!(rx.borrow_and_update().is_none());
        assert!(cache.snapshot("g").is_none() && cache.history("g").is_empty());
        assert_eq!(cache.groups(), vec![Arc::<str>::from("h")]);
        assert_eq!(cache.slot_count(), 2, "kept while watched");
        let s2 = cache.set_snapshot("g", snap([2, 2, 2, 2]));
        assert!(Arc::ptr_eq(rx.borrow_and_update().as_ref().unwrap(), &s2));
        cache.clear("g");
        drop(rx);
        assert_eq!(cache.slot_count(), 1, "freed with its last watcher");
        cache.clear("h");
        assert_eq!(cache.slot_count(), 0, "unwatched: freed at once");
        cache.clear("never-seen");
    }

    /// Slots created by plain `watch` calls (library users) are swept lazily
    /// once their receivers are gone: their number stays bounded.
    #[test]
    fn unwatched_empty_slots_are_swept_as_new_ones_are_created() {
        let cache = SnapshotCache::new();
        cache.set_snapshot("kept", snap([1, 1, 1, 1]));
        let held = cache.watch("held");
        for i in 0..10_000 {
            drop(cache.watch(&format!("g{i}")));
            assert!(
                cache.slot_count() <= 130,
                "{} slots at {i}",
                cache.slot_count()
            );
        }
        assert!(cache.snapshot("kept").is_some());
        assert!(cache.inner.groups.lock().map.contains_key("held"));
        drop(held);
    }
}
