//! The snapshot cache: the latest snapshot per group, published atomically
//! through `watch` channels, plus the server-wide readiness gate (DESIGN §3.1).
//!
//! Publishing never waits for clients: each stream holds a receiver and
//! computes its own diff when it next runs, so a slow or stuck client cannot
//! block publishing or other clients.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::snapshot::Snapshot;

type Slot = Arc<watch::Sender<Option<Arc<Snapshot>>>>;

#[derive(Clone)]
pub struct SnapshotCache {
    inner: Arc<Inner>,
}

struct Inner {
    groups: Mutex<HashMap<Arc<str>, Slot>>,
    ready: watch::Sender<bool>,
}

impl Default for SnapshotCache {
    fn default() -> Self {
        Self::new()
    }
}

impl SnapshotCache {
    /// A cache that is not ready: streams are accepted, requests are held.
    pub fn new() -> Self {
        SnapshotCache {
            inner: Arc::new(Inner {
                groups: Mutex::new(HashMap::new()),
                ready: watch::Sender::new(false),
            }),
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
        let slot: Slot = Arc::new(watch::Sender::new(None));
        groups.insert(group.into(), slot.clone());
        slot
    }

    /// Publishes a group's snapshot atomically. The snapshot was checked for
    /// consistency when it was built.
    pub fn set_snapshot(&self, group: &str, snapshot: impl Into<Arc<Snapshot>>) -> Arc<Snapshot> {
        let snapshot = snapshot.into();
        let slot = self.slot(group);
        if let Some(prev) = slot.borrow().as_ref()
            && !Arc::ptr_eq(prev, &snapshot)
        {
            // Once per publish, so streams need only look at what changed.
            snapshot.record_changes_from(prev);
        }
        // Sent outside the lock (DESIGN §1).
        slot.send_replace(Some(snapshot.clone()));
        snapshot
    }

    pub fn snapshot(&self, group: &str) -> Option<Arc<Snapshot>> {
        let slot = self.inner.groups.lock().get(group).cloned();
        slot.and_then(|s| s.borrow().clone())
    }

    /// Watches a group's snapshot; `None` until its first one is published.
    pub fn watch(&self, group: &str) -> watch::Receiver<Option<Arc<Snapshot>>> {
        self.slot(group).subscribe()
    }

    /// Groups that have a snapshot, sorted.
    pub fn groups(&self) -> Vec<Arc<str>> {
        let groups = self.inner.groups.lock();
        let mut out: Vec<Arc<str>> = groups
            .iter()
            .filter(|(_, s)| s.borrow().is_some())
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
