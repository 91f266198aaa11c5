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

#[derive(Clone)]
pub struct SnapshotCache {
    inner: Arc<Inner>,
}

struct Inner {
    groups: Mutex<HashMap<Arc<str>, Slot>>,
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

    pub fn build(self) -> SnapshotCache {
        SnapshotCache {
            inner: Arc::new(Inner {
                groups: Mutex::new(HashMap::new()),
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

    pub fn is_ready(&self) -> bool {
        *self.inner.ready.borrow()
    }

    pub fn watch_ready(&self) -> watch::Receiver<bool> {
        self.inner.ready.subscribe()
    }

    fn slot(&self, group: &str) -> Slot {
        let mut groups = self.inner.groups.lock();
        if let Some(s) = groups.get(group) {
            return s.clone();
        }
        let slot: Slot = Arc::new(SlotInner {
            tx: watch::Sender::new(None),
            history: Mutex::new(VecDeque::new()),
        });
        groups.insert(group.into(), slot.clone());
        slot
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

    pub fn snapshot(&self, group: &str) -> Option<Arc<Snapshot>> {
        let slot = self.inner.groups.lock().get(group).cloned();
        slot.and_then(|s| s.tx.borrow().clone())
    }

    /// The group's recently published snapshots, newest (the current one) first.
    pub fn history(&self, group: &str) -> Vec<Arc<Snapshot>> {
        let slot = self.inner.groups.lock().get(group).cloned();
        slot.map(|s| s.history.lock().iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Watches a group's snapshot; `None` until its first one is published.
    pub fn watch(&self, group: &str) -> watch::Receiver<Option<Arc<Snapshot>>> {
        self.slot(group).tx.subscribe()
    }

    /// Groups that have a snapshot, sorted.
    pub fn groups(&self) -> Vec<Arc<str>> {
        let groups = self.inner.groups.lock();
        let mut out: Vec<Arc<str>> = groups
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
    /// of recorded changes, as long as the history keeps the snapshots in
    /// between; beyond it the answer is "unknown" (the caller compares maps).
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
        assert_eq!(names(t3.changed_since(EDS, &base)), None);
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
}
