//! The etcd source: config objects stored one per key under a prefix, listed at one revision
//! and then watched from the next.
//!
//! How it keeps the [`Source`] guarantees over a store that can fail:
//! - **Consistent**: the initial sync is one listing at one revision (paged, pinned to the
//!   first page's revision), then a watch from `revision + 1`, so no change falls between the
//!   two. Each watch response (one or more whole etcd transactions) is applied whole, so
//!   objects written in one transaction are published together.
//! - **Ready after the list** (invariant 1): `synced` turns true with the first listing;
//!   before that nothing is served.
//! - **Last known good, per object** (invariant 8): every key is parsed like a file named
//!   `etcd:<key>` (so errors read `etcd:/ballast/x:3:5: ...`), and the set is assembled over
//!   the one served now with [`ConfigSet::assemble`]: an invalid value keeps its object's last
//!   good version, everything else applies.
//! - **Reconciled by keep-set** (invariant 4): a relist (after `ErrCompacted`, when the
//!   watch cannot resume) replaces the key map with exactly the listed keys in one step; it
//!   never clears first, so a deleted key disappears and every other object stays.
//! - **A store that went back** (restored from an older backup, or a new store on the same
//!   endpoints): etcd accepts a watch from a revision it has not reached and stays silent until
//!   it does, so every write up to the old revision would be missed. A watch created below the
//!   revision already applied makes the source relist (linearizable); a listing below it is a
//!   confirmed regression: logged, counted in [`SourceState::revision_regressions`], and the
//!   listing replaces the key map by keep-set with every key parsed afresh (a key's
//!   `mod_revision` no longer identifies its value). The result is published like any change,
//!   so the snapshot guard judges it.
//! - **Applies of several transactions, all or nothing**: etcd bounds the operations of one
//!   transaction (`--max-txn-ops`), so `ballast apply` writes a larger change in several,
//!   opened by creating `<prefix>_meta/apply` and committed by deleting it while touching
//!   `<prefix>_meta/config` ([`crate::etcd_keys::apply_marker_key`]). From the open to the commit
//!   the source keeps applying events to its view but publishes nothing (the config of before
//!   the apply stays served, [`SourceState::held_apply`] says why); the commit publishes the
//!   whole apply at once. A listing that finds the marker lists again at the revision before
//!   it was created and watches from there. An apply that dies leaves its marker to expire with
//!   its lease: the source keeps holding (`abandoned`) until the next apply or delete commits.
//! - **Stale, not empty**: while no member answers, the last good config stays served and
//!   [`SourceState::stale_since`] says since when; the source retries with backoff across the
//!   endpoints and, on reconnecting, resumes the watch from the last revision it applied.
//!
//! Keys whose first segment after the prefix starts with `_` (e.g. `/ballast/_state/guard`)
//! are Ballast's own bookkeeping, not config, and are ignored.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ballast_etcd::{Client, ClientOptions, Error as EtcdError, EventKind, KeyRange, WatchOptions};
use ballast_model::{ConfigSet, FileParse, parse_file_report};
use futures::{FutureExt, StreamExt};
use tokio::sync::watch as tokio_watch;

use crate::state::{HeldApply, RevisionRegression, Source, SourceState};

/// The default key prefix (`--etcd-prefix`).
pub const DEFAULT_PREFIX: &str = "/ballast/";

/// How to reach etcd and where the config lives.
#[derive(Clone, Debug)]
pub struct EtcdSourceOptions {
    /// Client URLs of the cluster's members (`http://host:2379`, `https://...`).
    pub endpoints: Vec<String>,
    /// Every key under this prefix is one config object (except `<prefix>_...`).
    pub prefix: String,
    pub client: ClientOptions,
    /// Retry delay after a failed list or watch: doubles from `backoff_min` up to `backoff_max`.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Keys per page of a listing.
    pub page: i64,
}

impl EtcdSourceOptions {
    pub fn new(endpoints: Vec<String>, prefix: impl Into<String>) -> Self {
        EtcdSourceOptions {
            endpoints,
            prefix: prefix.into(),
            client: ClientOptions::default(),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
            page: 500,
        }
    }
}

/// Config objects from etcd (see the module docs).
#[derive(Clone, Debug)]
pub struct EtcdSource {
    client: Client,
    options: EtcdSourceOptions,
    name: String,
}

impl EtcdSource {
    /// Validates the endpoints and builds the client (lazily connected: etcd may be down at
    /// start; the source then stays unsynced until it answers). Needs a tokio runtime.
    pub fn new(options: EtcdSourceOptions) -> Result<Self, EtcdError> {
        let client = Client::new(&options.endpoints, options.client.clone())?;
        let name = format!("etcd:{}{}", options.endpoints.join(","), options.prefix);
        Ok(EtcdSource {
            client,
            options,
            name,
        })
    }

    /// `etcd:` + endpoints + prefix (the name in [`SourceState`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client, for other users of the same store (e.g. guard state).
    pub fn client(&self) -> &Client {
        &self.client
    }
}

impl Source for EtcdSource {
    fn start(self: Box<Self>) -> tokio_watch::Receiver<SourceState> {
        let (tx, rx) = tokio_watch::channel(SourceState::new(self.name.clone()));
        tokio::spawn(run(*self, tx));
        rx
    }
}

/// One key's value, parsed once per revision of the key.
#[derive(Clone)]
struct Entry {
    mod_revision: i64,
    name: Arc<str>,
    parse: FileParse,
}

/// The source's view of the store: every config key at `revision`.
#[derive(Default)]
struct View {
    keys: BTreeMap<Vec<u8>, Entry>,
    revision: i64,
    /// An apply of several transactions is open (or was abandoned): nothing is published.
    held: Option<HeldApply>,
}

/// The bookkeeping keys an apply of several transactions uses (see the module docs).
struct Markers {
    apply: Vec<u8>,
    config: Vec<u8>,
}

impl Markers {
    fn new(prefix: &str) -> Self {
        Markers {
            apply: crate::etcd_keys::apply_marker_key(prefix).into_bytes(),
            config: crate::etcd_keys::config_marker_key(prefix).into_bytes(),
        }
    }
}

impl View {
    /// Whether `key` is config (not `<prefix>_...` bookkeeping).
    fn is_config(prefix: &[u8], key: &[u8]) -> bool {
        key.strip_prefix(prefix)
            .is_some_and(|rest| !rest.starts_with(b"_"))
    }

    fn entry(&self, key: &[u8], mod_revision: i64, value: &[u8]) -> Entry {
        match self.keys.get(key) {
            // Same revision of the key: same value, keep the parse (and its objects' Arcs).
            Some(e) if e.mod_revision == mod_revision => e.clone(),
            _ => {
                let name: Arc<str> = Arc::from(format!("etcd:{}", String::from_utf8_lossy(key)));
                let text = String::from_utf8_lossy(value);
                Entry {
                    mod_revision,
                    parse: parse_file_report(&name, &text),
                    name,
                }
            }
        }
    }

    /// Replaces the view with a listing: exactly the listed keys (keep-set), reusing parses of
    /// unchanged keys unless `afresh` (the store went back: the same `mod_revision` may hold
    /// another value).
    fn relist(&mut self, prefix: &[u8], listing: ballast_etcd::Listing, afresh: bool) {
        let mut keys = BTreeMap::new();
        if afresh {
            self.keys.clear();
        }
        for kv in listing.kvs {
            if Self::is_config(prefix, &kv.key) {
                let e = self.entry(&kv.key, kv.mod_revision, &kv.value);
                keys.insert(kv.key, e);
            }
        }
        self.keys = keys;
        self.revision = listing.revision;
    }

    /// Applies a watch batch; returns whether it touched config keys or the apply hold (else
    /// only the revision moved: bookkeeping such as status, guard state or registrations).
    fn apply(&mut self, prefix: &[u8], markers: &Markers, batch: ballast_etcd::WatchBatch) -> bool {
        let held = self.held;
        let mut touched = false;
        // Revisions that touched the config marker: an apply marker deleted in one of them
        // was committed; deleted in another, abandoned.
        let commits: Vec<i64> = batch
            .events
            .iter()
            .filter(|e| e.kind == EventKind::Put && e.kv.key == markers.config)
            .map(|e| e.kv.mod_revision)
            .collect();
        for ev in batch.events {
            if ev.kv.key == markers.apply {
                match ev.kind {
                    EventKind::Put => {
                        self.held = Some(HeldApply {
                            opened: ev.kv.create_revision,
                            abandoned: false,
                        });
                    }
                    EventKind::Delete if commits.contains(&ev.kv.mod_revision) => {
                        self.held = None;
                    }
                    EventKind::Delete => {
                        if let Some(h) = &mut self.held {
                            h.abandoned = true;
                        }
                    }
                }
                continue;
            }
            if ev.kv.key == markers.config {
                // Any later apply or delete commits over an abandoned one.
                if ev.kind == EventKind::Put && self.held.is_some_and(|h| h.abandoned) {
                    self.held = None;
                }
                continue;
            }
            if !Self::is_config(prefix, &ev.kv.key) {
                continue;
            }
            touched = true;
            match ev.kind {
                EventKind::Put => {
                    let e = self.entry(&ev.kv.key, ev.kv.mod_revision, &ev.kv.value);
                    self.keys.insert(ev.kv.key, e);
                }
                EventKind::Delete => {
                    self.keys.remove(&ev.kv.key);
                }
            }
        }
        self.revision = self.revision.max(batch.revision);
        touched || held != self.held
    }
}

/// Retry delays: doubling, capped.
struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max,
            next: min,
        }
    }

    fn reset(&mut self) {
        self.next = self.min;
    }

    fn next(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }
}

async fn run(source: EtcdSource, tx: tokio_watch::Sender<SourceState>) {
    let EtcdSource {
        client,
        options,
        name,
    } = source;
    let prefix = options.prefix.as_bytes().to_vec();
    let markers = Markers::new(&options.prefix);
    let range = KeyRange::prefix(prefix.clone());
    let mut view = View::default();
    let mut listed = false;
    let mut backoff = Backoff::new(options.backoff_min, options.backoff_max);
    loop {
        if !listed {
            let listing = tokio::select! {
                _ = tx.closed() => return,
                r = client.list(&range, 0, options.page) => r,
            };
            match listing {
                Ok(listing) => {
                    // Linearizable: a revision below one already applied is the store's.
                    let went_back = view.revision > 0 && listing.revision < view.revision;
                    if went_back {
                        regressed(&tx, &name, view.revision, listing.revision);
                    }
                    // An apply in progress: take the store as it was before it (the watch
                    // from there sees it open, and its commit).
                    let opened = listing
                        .kvs
                        .iter()
                        .find(|kv| kv.key == markers.apply)
                        .map(|kv| kv.create_revision);
                    // A hold from before this listing: its apply committed (or a later one
                    // did) if the config marker moved after the apply opened it.
                    let committed_at = listing
                        .kvs
                        .iter()
                        .find(|kv| kv.key == markers.config)
                        .map(|kv| kv.mod_revision);
                    view.held = match (opened, view.held) {
                        (None, Some(h))
                            if !went_back && committed_at.is_none_or(|r| r <= h.opened) =>
                        {
                            Some(HeldApply {
                                opened: h.opened,
                                abandoned: true,
                            })
                        }
                        // Listed before an open apply (below): the watch sees it open.
                        _ => None,
                    };
                    let listing = match opened {
                        None => listing,
                        Some(opened) => {
                            let before = tokio::select! {
                                _ = tx.closed() => return,
                                r = client.list(&range, opened - 1, options.page) => r,
                            };
                            match before {
                                Ok(before) => before,
                                Err(e) => {
                                    // Compacted: hold what is there until the commit.
                                    tracing::warn!(source = %name, opened, error = %e,
                                        "cannot list the store before an open apply; holding until it commits");
                                    view.held = Some(HeldApply {
                                        opened,
                                        abandoned: false,
                                    });
                                    listing
                                }
                            }
                        }
                    };
                    view.relist(&prefix, listing, went_back);
                    listed = true;
                    publish(&tx, &name, &view, true);
                }
                Err(e) => {
                    disconnected(&tx, &name, &e);
                    if !pause(&tx, backoff.next()).await {
                        return;
                    }
                    continue;
                }
            }
        }
        let opts = WatchOptions {
            start_revision: view.revision + 1,
            prev_kv: false,
            progress_notify: true,
        };
        let watch = tokio::select! {
            _ = tx.closed() => return,
            w = client.watch(range.clone(), opts) => w,
        };
        let mut watch = match watch {
            Ok(w) => w,
            Err(EtcdError::Compacted { compact_revision }) => {
                tracing::warn!(source = %name, revision = view.revision, compact_revision,
                    "etcd compacted past the last applied revision; relisting");
                listed = false;
                continue;
            }
            Err(e) => {
                disconnected(&tx, &name, &e);
                if !pause(&tx, backoff.next()).await {
                    return;
                }
                continue;
            }
        };
        if watch.created_revision() < view.revision {
            // The member is behind what was applied: restored from an older backup (confirmed
            // by the linearizable relist), or a lagging member (the relist says so).
            tracing::info!(source = %name, endpoint = watch.endpoint(), applied = view.revision,
                store = watch.created_revision(), "etcd store below the applied revision; relisting");
            drop(watch);
            listed = false;
            if !pause(&tx, backoff.next()).await {
                return;
            }
            continue;
        }
        backoff.reset();
        // Connected and caught up to the watch start: no longer stale.
        publish(&tx, &name, &view, false);
        tracing::debug!(source = %name, endpoint = watch.endpoint(), revision = view.revision, "watching etcd");
        let ended = loop {
            let item = tokio::select! {
                _ = tx.closed() => return,
                item = watch.next() => item,
            };
            match item {
                Some(Ok(batch)) => {
                    let mut touched = view.apply(&prefix, &markers, batch);
                    // Whatever else already arrived goes into the same publish.
                    while let Some(Some(Ok(batch))) = watch.next().now_or_never() {
                        touched |= view.apply(&prefix, &markers, batch);
                    }
                    if touched {
                        publish(&tx, &name, &view, false);
                    } else if view.held.is_none() {
                        // No config key changed: the config is the same at a later revision
                        // (no need to assemble it again).
                        tx.send_if_modified(|s| {
                            let changed = s.revision != Some(view.revision);
                            s.revision = Some(view.revision);
                            changed
                        });
                    }
                }
                Some(Err(e)) => break e,
                None => {
                    break EtcdError::Unavailable {
                        endpoint: watch.endpoint().to_string(),
                        message: "watch ended".into(),
                    };
                }
            }
        };
        match ended {
            EtcdError::Compacted { compact_revision } => {
                tracing::warn!(source = %name, revision = view.revision, compact_revision,
                    "etcd watch compacted; relisting");
                listed = false;
            }
            e => {
                disconnected(&tx, &name, &e);
                if !pause(&tx, backoff.next()).await {
                    return;
                }
            }
        }
    }
}

/// Records that the store went back from revision `from` to `to` (the relist that follows
/// publishes what it holds now).
fn regressed(tx: &tokio_watch::Sender<SourceState>, name: &str, from: i64, to: i64) {
    tracing::warn!(source = %name, applied = from, store = to,
        "etcd store revision went back (restored from an older backup?); reconciling to what it holds");
    let at = SystemTime::now();
    tx.send_modify(|s| {
        s.revision_regressions += 1;
        s.last_regression = Some(RevisionRegression { from, to, at });
    });
}

/// Sleeps, unless every receiver is gone (then returns false).
async fn pause(tx: &tokio_watch::Sender<SourceState>, d: Duration) -> bool {
    tokio::select! {
        _ = tx.closed() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// Records that the store cannot be reached: the config stays, the state says since when.
fn disconnected(tx: &tokio_watch::Sender<SourceState>, name: &str, e: &EtcdError) {
    let now = SystemTime::now();
    let message = e.to_string();
    let mut first = false;
    tx.send_if_modified(|s| {
        let mut changed = false;
        if s.stale_since.is_none() {
            s.stale_since = Some(now);
            first = true;
            changed = true;
        }
        if s.store_error.as_deref() != Some(message.as_str()) {
            s.store_error = Some(message.clone());
            changed = true;
        }
        changed
    });
    if first {
        let s = tx.borrow();
        tracing::warn!(source = %name, error = %message, synced = s.synced, generation = s.generation,
            revision = ?s.revision, "etcd unreachable; keeping the last good config");
    } else {
        tracing::debug!(source = %name, error = %message, "etcd still unreachable");
    }
}

/// Publishes the view: assembled over the config served now (per-object last known good),
/// with the revision, and no longer stale.
fn publish(tx: &tokio_watch::Sender<SourceState>, name: &str, view: &View, listing: bool) {
    let now = SystemTime::now();
    if view.held.is_some() {
        // Connected, but an apply is open: the config of before it stays.
        let mut first = false;
        tx.send_if_modified(|s| {
            first = s.held_apply.is_none();
            let changed =
                s.held_apply != view.held || s.stale_since.is_some() || s.store_error.is_some();
            s.held_apply = view.held;
            s.stale_since = None;
            s.store_error = None;
            changed
        });
        if first {
            tracing::info!(source = %name, revision = view.revision, held = ?view.held,
                "an apply of several etcd transactions is open; holding its changes until it commits");
        }
        return;
    }
    let prev = tx.borrow().config.clone();
    let files = view.keys.len();
    let (set, report) = ConfigSet::assemble(
        prev.as_deref(),
        view.keys
            .values()
            .map(|e| (e.name.clone(), e.parse.clone())),
    );
    crate::file::log_report(name, &report, &tx.borrow());
    let objects = set.len();
    let mut changes = None;
    let mut recovered = None;
    tx.send_if_modified(|s| {
        let before = s.generation;
        let old = s.config.clone();
        let mut changed = s.apply_load(set, files, report, now);
        if s.generation != before {
            changes = Some(match (&old, &s.config) {
                (Some(old), Some(new)) => old.diff(new).len(),
                _ => objects,
            });
        }
        if s.revision != Some(view.revision) {
            s.revision = Some(view.revision);
            changed = true;
        }
        if let Some(since) = s.stale_since.take() {
            recovered = Some(since);
            changed = true;
        }
        changed |= s.store_error.take().is_some();
        changed |= s.held_apply.take().is_some();
        changed
    });
    if let Some(since) = recovered {
        tracing::info!(source = %name, revision = view.revision,
            stale_for = ?now.duration_since(since).unwrap_or_default(), "etcd reachable again");
    }
    let s = tx.borrow();
    match changes {
        Some(changes) => {
            tracing::info!(source = %name, generation = s.generation, revision = view.revision,
            keys = files, objects, changes, listing, errors = s.report.errors.len(), "config loaded")
        }
        None => {
            tracing::debug!(source = %name, revision = view.revision, "etcd revision applied, config unchanged")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bookkeeping_keys_are_not_config() {
        let p = b"/ballast/";
        assert!(View::is_config(p, b"/ballast/backends/default/web"));
        assert!(!View::is_config(p, b"/ballast/_state/guard"));
        assert!(!View::is_config(p, b"/other/x"));
    }

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let seq: Vec<_> = (0..4).map(|_| b.next().as_millis()).collect();
        assert_eq!(seq, [100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.next().as_millis(), 100);
    }
}
