//! The pipeline: source state → incremental translation → blast-radius guard →
//! snapshot cache. One task, so publishes for a gateway are strictly ordered;
//! everything it knows is published through `watch` for the admin API.
//!
//! Envoys on per-type gRPC or REST need other EDS/RDS/SDS references than
//! ADS Envoys (crate::grouping): once an Envoy asks over such a transport,
//! the pipeline keeps one more translator for it, in lockstep with the ADS
//! one, and publishes each gateway's snapshot for that transport next to the
//! ADS one. The guard judges the ADS snapshot; the others follow its verdict.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use ballast_model::ObjectKey;
use ballast_sources::SourceState;
use ballast_translate::{GatewayResources, Options, ResourcesVersion, Translator, XdsTransport};
use ballast_xds::ResourceType;
use ballast_xds::Snapshot;
use ballast_xds::SnapshotCache;
use serde::Serialize;
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::guard::{Book, GuardConfig, Inventory, judge, judge_removal};
use crate::metrics::{GatewayLabel, Metrics, SourceLabel};
use crate::state::{Recorded, Records};

/// What the pipeline knows, for `/readyz`, `/debug/*` and `ballast status`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PipelineStatus {
    pub ready: bool,
    /// Generation of the source config last translated.
    pub generation: Option<u64>,
    pub gateways: BTreeMap<String, GatewayStatus>,
    pub last_translate_ms: Option<f64>,
    pub guard: GuardInfo,
}

/// The guard's configuration and restart baseline, for status pages.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GuardInfo {
    pub enabled: bool,
    pub max_removal: f64,
    pub settle_ms: u128,
    /// Where the last published inventories are kept across restarts.
    pub state_file: Option<PathBuf>,
    /// Gateways of the state file not yet published since the start: their
    /// first snapshot is judged against it.
    pub restart_baseline: Vec<String>,
    pub state_written_at: Option<SystemTime>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct GatewayStatus {
    pub published: bool,
    pub published_at: Option<SystemTime>,
    pub versions: BTreeMap<&'static str, String>,
    pub listeners: usize,
    pub routes: usize,
    pub clusters: usize,
    pub held: Option<HeldStatus>,
    pub removed: bool,
    pub error: Option<String>,
}

/// What a held publish was judged against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldOrigin {
    /// The snapshot published before, by this process.
    Live,
    /// The inventory in the state file: the gateway's first snapshot after a restart.
    Restart,
}

#[derive(Clone, Debug, Serialize)]
pub struct HeldStatus {
    pub reason: String,
    pub origin: HoldOrigin,
    pub since: SystemTime,
    pub settle_ms: u128,
}

/// A gateway's snapshots for the non-ADS transports in use.
type Variants = BTreeMap<XdsTransport, Arc<Snapshot>>;

struct Held {
    /// `None`: the gateway itself was removed.
    snapshot: Option<Arc<Snapshot>>,
    variants: Variants,
    /// The guard's book of `snapshot` (`None` with it).
    book: Option<Book>,
    deadline: tokio::time::Instant,
    status: HeldStatus,
}

pub struct Pipeline {
    pub cache: SnapshotCache,
    pub metrics: Arc<Metrics>,
    pub guard: GuardConfig,
    pub options: Options,
    pub status: watch::Sender<PipelineStatus>,
    /// Inventories from the state file (issue 16), by gateway.
    pub baseline: BTreeMap<ObjectKey, Inventory>,
    /// Receives every gateway's last published snapshot for the state file.
    pub state: Option<watch::Sender<Arc<Records>>>,
    /// Non-ADS transports Envoys have asked over (set by the grouper).
    pub demand: watch::Receiver<BTreeSet<XdsTransport>>,
}

/// Published snapshots (in the guard's books), by gateway.
type Published = BTreeMap<ObjectKey, Book>;

/// Per translator (`None`: the ADS one) and gateway: the version of the resources last
/// turned into a snapshot, and that snapshot (published, held or not yet: the next version
/// is patched onto it).
#[derive(Default)]
struct Built(BTreeMap<(Option<XdsTransport>, ObjectKey), (u64, Arc<Snapshot>)>);

impl Built {
    /// The snapshot of `resources`: patched onto the one built for the version its patch
    /// starts from (costs what changed), else built by merging every resource with `prev`.
    fn snapshot(
        &mut self,
        transport: Option<XdsTransport>,
        key: &ObjectKey,
        resources: &GatewayResources,
        version: Option<&ResourcesVersion>,
        prev: impl FnOnce() -> Option<Arc<Snapshot>>,
        check: bool,
    ) -> Result<Arc<Snapshot>, ballast_xds::SnapshotError> {
        let slot = (transport, key.clone());
        let base = self.0.remove(&slot);
        let patch = version.and_then(|v| v.patch.as_ref());
        let result = match (patch, base) {
            (Some(p), Some((b, snap))) if b == p.base => {
                resources.snapshot_patched(&snap, &p.touched, check)
            }
            _ if check => resources.snapshot(prev()),
            _ => resources.snapshot_unchecked(prev()),
        };
        let snap = Arc::new(result?);
        if let Some(v) = version {
            self.0.insert(slot, (v.version, snap.clone()));
        }
        Ok(snap)
    }

    fn remove(&mut self, key: &ObjectKey) {
        self.0.retain(|(_, k), _| k != key);
    }
}

fn group_of(key: &ObjectKey) -> String {
    format!("{}/{}", key.namespace, key.name)
}

impl Pipeline {
    pub async fn run(mut self, mut source: watch::Receiver<SourceState>) {
        let mut translator = Translator::new(self.options.clone());
        let mut variants: BTreeMap<XdsTransport, Translator> = BTreeMap::new();
        let mut demand = self.demand.clone();
        let mut baseline = std::mem::take(&mut self.baseline);
        if !self.guard.enabled {
            baseline.clear();
        }
        self.status
            .send_modify(|s| s.guard.restart_baseline = baseline.keys().map(group_of).collect());
        let mut published: Published = BTreeMap::new();
        let mut built = Built::default();
        let mut held: BTreeMap<ObjectKey, Held> = BTreeMap::new();
        let mut last_generation: Option<u64> = None;
        let mut last_error_seen: Option<usize> = None;
        loop {
            let state = source.borrow_and_update().clone();
            self.source_metrics(&state, &mut last_error_seen);
            #[allow(clippy::collapsible_if)]
            if let Some(config) = state.config.as_ref() {
                if last_generation != Some(state.generation) {
                    last_generation = Some(state.generation);
                    let started = Instant::now();
                    let out = translator.update(config);
                    let mut variant_outs: BTreeMap<XdsTransport, _> = variants
                        .iter_mut()
                        .map(|(t, tr)| (*t, tr.update(config)))
                        .collect();
                    let took = started.elapsed();
                    self.metrics.translate_seconds.observe(took.as_secs_f64());
                    self.status.send_modify(|s| {
                        s.generation = Some(state.generation);
                        s.last_translate_ms = Some(took.as_secs_f64() * 1000.0);
                    });
                    info!(
                        generation = state.generation,
                        changed = out.changed.len(),
                        removed = out.removed.len(),
                        ms = took.as_secs_f64() * 1000.0,
                        "translated"
                    );
                    for (key, resources) in &out.changed {
                        let mut vs = Variants::new();
                        for (t, o) in &mut variant_outs {
                            let Some(r) = o.changed.remove(key) else {
                                continue;
                            };
                            let version = o.versions.get(key);
                            let prev = || self.variant_prev(*t, key);
                            match built.snapshot(Some(*t), key, &r, version, prev, false) {
                                Ok(snap) => {
                                    vs.insert(*t, snap);
                                }
                                Err(e) => {
                                    error!(gateway = %key, transport = t.as_str(), error = %e, "inconsistent snapshot for a transport")
                                }
                            }
                        }
                        let version = out.versions.get(key);
                        let prev = || published.get(key).map(|p| p.snapshot.clone());
                        match built.snapshot(None, key, resources, version, prev, true) {
                            Ok(snap) => self.offer(
                                key,
                                Some(snap),
                                vs,
                                &mut published,
                                &mut held,
                                &mut baseline,
                            ),
                            Err(e) => {
                                error!(gateway = %key, error = %e, "translation produced an inconsistent snapshot; keeping the last one");
                                self.status.send_modify(|s| {
                                    s.gateways.entry(group_of(key)).or_default().error =
                                        Some(e.to_string());
                                });
                            }
                        }
                    }
                    for key in &out.removed {
                        built.remove(key);
                        self.offer(
                            key,
                            None,
                            Variants::new(),
                            &mut published,
                            &mut held,
                            &mut baseline,
                        );
                    }
                }
            }
            if state.synced && !self.status.borrow().ready {
                // Gateways served before the restart that the synced source no
                // longer has: their removal is judged like a live one.
                let gone: Vec<ObjectKey> = baseline
                    .keys()
                    .filter(|k| !published.contains_key(*k) && !held.contains_key(*k))
                    .cloned()
                    .collect();
                for key in gone {
                    self.offer(
                        &key,
                        None,
                        Variants::new(),
                        &mut published,
                        &mut held,
                        &mut baseline,
                    );
                }
                // Every gateway of the initial config is published (above, synchronously).
                self.cache.set_ready(true);
                self.metrics.ready.set(1);
                self.status.send_modify(|s| s.ready = true);
                info!(
                    gateways = published.len(),
                    "ready: initial sync done and snapshots published"
                );
            }
            let next_deadline = held.values().map(|h| h.deadline).min();
            tokio::select! {
                r = source.changed() => if r.is_err() { return; },
                Ok(()) = demand.changed() => {
                    let wanted = demand.borrow_and_update().clone();
                    for t in wanted {
                        if variants.contains_key(&t) {
                            continue;
                        }
                        let mut options = self.options.clone();
                        options.config_sources.transport = t;
                        let mut tr = Translator::new(options);
                        if let Some(config) = state.config.as_ref() {
                            let out = tr.update(config);
                            info!(transport = t.as_str(), gateways = out.changed.len(), "first Envoy on this transport: translating for it");
                            for (key, resources) in &out.changed {
                                let version = out.versions.get(key);
                                let snap = match built.snapshot(Some(t), key, resources, version, || None, false) {
                                    Ok(s) => s,
                                    Err(e) => { error!(gateway = %key, transport = t.as_str(), error = %e, "inconsistent snapshot for a transport"); continue; }
                                };
                                // A held gateway's proxies get it when the hold ends.
                                if let Some(h) = held.get_mut(key) {
                                    h.variants.insert(t, snap);
                                } else if published.contains_key(key) {
                                    self.cache.set_snapshot(&crate::grouping::group_name(&group_of(key), t), snap);
                                }
                            }
                        }
                        variants.insert(t, tr);
                    }
                }
                _ = sleep_until(next_deadline) => {
                    let now = tokio::time::Instant::now();
                    let due: Vec<ObjectKey> = held.iter().filter(|(_, h)| h.deadline <= now).map(|(k, _)| k.clone()).collect();
                    for key in due {
                        let h = held.remove(&key).expect("due");
                        warn!(gateway = %key, reason = %h.status.reason, "guard: settle period over and the source still says so; applying");
                        self.publish(&key, h.snapshot, h.variants, h.book, &mut published, &mut baseline);
                    }
                }
            }
        }
    }

    /// A new snapshot (or removal) for a gateway: publish now, or hold it.
    fn offer(
        &self,
        key: &ObjectKey,
        snapshot: Option<Arc<Snapshot>>,
        variants: Variants,
        published: &mut Published,
        held: &mut BTreeMap<ObjectKey, Held>,
        baseline: &mut BTreeMap<ObjectKey, Inventory>,
    ) {
        // Against the published snapshot: by what changed. Against the state file's
        // baseline (a first publish after a restart): by a full inventory, once.
        let (verdict, book, origin) = match published.get(key) {
            Some(p) => {
                let next = snapshot
                    .clone()
                    .unwrap_or_else(|| Arc::new(Snapshot::default()));
                let (removal, book) = p.next(next);
                (
                    judge_removal(&self.guard, &removal),
                    snapshot.is_some().then_some(book),
                    HoldOrigin::Live,
                )
            }
            None => {
                let inventory = snapshot.as_deref().map(Inventory::of).unwrap_or_default();
                let verdict = judge(&self.guard, baseline.get(key), &inventory);
                let book = snapshot
                    .clone()
                    .map(|s| Book::counted(s, inventory.routes.len()));
                (verdict, book, HoldOrigin::Restart)
            }
        };
        match verdict {
            None => {
                if held.remove(key).is_some() {
                    info!(gateway = %key, "guard: the source changed its mind; hold released");
                }
                self.publish(key, snapshot, variants, book, published, baseline);
            }
            Some(reason) => {
                let reason = match origin {
                    HoldOrigin::Live => reason,
                    HoldOrigin::Restart => {
                        format!("{reason} of what was served before the restart (state file)")
                    }
                };
                let label = GatewayLabel {
                    gateway: group_of(key),
                };
                match held.get_mut(key) {
                    Some(h) => {
                        // Still a mass removal: keep the original deadline, hold the latest.
                        h.snapshot = snapshot;
                        h.variants.extend(variants);
                        h.book = book;
                        h.status.reason = reason;
                    }
                    None => {
                        warn!(gateway = %key, %reason, settle = ?self.guard.settle, "guard: holding snapshot");
                        self.metrics.guard_holds.get_or_create(&label).inc();
                        if origin == HoldOrigin::Restart {
                            self.metrics.guard_restart_holds.get_or_create(&label).inc();
                        }
                        held.insert(
                            key.clone(),
                            Held {
                                snapshot,
                                variants,
                                book,
                                deadline: tokio::time::Instant::now() + self.guard.settle,
                                status: HeldStatus {
                                    reason,
                                    origin,
                                    since: SystemTime::now(),
                                    settle_ms: self.guard.settle.as_millis(),
                                },
                            },
                        );
                    }
                }
                self.metrics.guard_held.get_or_create(&label).set(1);
                let status = held.get(key).map(|h| h.status.clone());
                self.status
                    .send_modify(|s| s.gateways.entry(group_of(key)).or_default().held = status);
            }
        }
    }

    fn publish(
        &self,
        key: &ObjectKey,
        snapshot: Option<Arc<Snapshot>>,
        variants: Variants,
        book: Option<Book>,
        published: &mut Published,
        baseline: &mut BTreeMap<ObjectKey, Inventory>,
    ) {
        let from_baseline = baseline.remove(key).is_some();
        // The state file holds inventories: one that did not change need not be rewritten
        // (taking every gateway's inventory is O(config)).
        let same_inventory =
            !from_baseline && snapshot.is_some() && book.as_ref().is_some_and(|b| b.same_inventory);
        let group = group_of(key);
        // A removed gateway's proxies get an empty snapshot: the deletion was
        // deliberate (and passed the guard), not an accident of the control plane.
        let snap = snapshot
            .clone()
            .unwrap_or_else(|| Arc::new(Snapshot::default()));
        self.cache.set_snapshot(&group, snap.clone());
        if snapshot.is_some() {
            for (t, v) in variants {
                self.cache
                    .set_snapshot(&crate::grouping::group_name(&group, t), v);
            }
        } else {
            // Every transport's proxies of a removed gateway get an empty snapshot.
            for t in self.demand.borrow().iter() {
                let g = crate::grouping::group_name(&group, *t);
                if self.cache.snapshot(&g).is_some() {
                    self.cache.set_snapshot(&g, Arc::new(Snapshot::default()));
                }
            }
        }
        self.metrics.published(&group);
        let label = GatewayLabel {
            gateway: group.clone(),
        };
        self.metrics.guard_held.get_or_create(&label).set(0);
        self.metrics.guard_holds.get_or_create(&label).inc_by(0);
        self.metrics
            .guard_restart_holds
            .get_or_create(&label)
            .inc_by(0);
        self.metrics
            .guard_client_holds
            .get_or_create(&label)
            .inc_by(0);
        self.metrics
            .guard_client_held
            .get_or_create(&label)
            .inc_by(0);
        let gs = GatewayStatus {
            published: true,
            published_at: Some(SystemTime::now()),
            versions: ResourceType::ALL
                .iter()
                .map(|t| (t.short_name(), snap.version(*t).to_string()))
                .collect(),
            listeners: snap.resources(ResourceType::Listener).len(),
            routes: book.as_ref().map_or(0, |b| b.routes),
            clusters: snap.resources(ResourceType::Cluster).len(),
            held: None,
            removed: snapshot.is_none(),
            error: None,
        };
        self.status.send_modify(|s| {
            s.gateways.insert(group.clone(), gs);
        });
        match book {
            Some(b) => {
                published.insert(key.clone(), b);
            }
            None => {
                published.remove(key);
            }
        }
        if from_baseline {
            self.status.send_modify(|s| {
                s.guard.restart_baseline = baseline.keys().map(group_of).collect()
            });
        }
        if let Some(state) = &self.state
            && !same_inventory
        {
            // Gateways still waiting on their baseline keep it in the file: a
            // second restart during the hold must not forget it.
            let all: Records = published
                .iter()
                .map(|(k, b)| (group_of(k), Recorded::Snapshot(b.snapshot.clone())))
                .chain(
                    baseline
                        .iter()
                        .map(|(k, inv)| (group_of(k), Recorded::Inventory(Arc::new(inv.clone())))),
                )
                .collect();
            state.send_replace(Arc::new(all));
        }
    }

    /// The snapshot last published for `key` on transport `t` (to share
    /// unchanged resources with).
    fn variant_prev(&self, t: XdsTransport, key: &ObjectKey) -> Option<Arc<Snapshot>> {
        self.cache
            .snapshot(&crate::grouping::group_name(&group_of(key), t))
    }

    fn source_metrics(&self, state: &SourceState, last_error_seen: &mut Option<usize>) {
        let label = SourceLabel {
            source: state.name.clone(),
        };
        self.metrics
            .source_synced
            .get_or_create(&label)
            .set(state.synced as i64);
        self.metrics
            .source_generation
            .get_or_create(&label)
            .set(state.generation as i64);
        self.metrics.source_errors.get_or_create(&label).inc_by(0);
        self.metrics
            .source_stale
            .get_or_create(&label)
            .set(state.stale_since.is_some() as i64);
        if let Some(rev) = state.revision {
            self.metrics.source_revision.get_or_create(&label).set(rev);
        }
        // The state counts since the source started, as the counter does.
        let regressions = self
            .metrics
            .source_revision_regressions
            .get_or_create(&label);
        regressions.inc_by(state.revision_regressions.saturating_sub(regressions.get()));
        self.metrics
            .set_source_skipped(&state.name, &state.report.skipped);
        if let Some(errors) = &state.last_error {
            let id = Arc::as_ptr(errors) as *const () as usize;
            if *last_error_seen != Some(id) {
                *last_error_seen = Some(id);
                self.metrics.source_errors.get_or_create(&label).inc();
            }
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast_sources::{Source, StaticSource};
    use std::time::Duration;

    const CONFIG: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: { name: edge }
spec:
  gatewayClassName: ballast
  listeners:
  - { name: http, port: 10000, protocol: HTTP }
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: { name: web }
spec:
  parentRefs: [{ name: edge }]
  hostnames: [web.example.com]
  rules:
  - backendRefs: [{ group: ballast.dev, kind: Backend, name: web }]
---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: { name: web }
spec:
  endpoints:
  - { address: 127.0.0.1, port: 8080 }
";

    /// An inventory of `n` clusters (and nothing else) that no config has.
    fn lost(n: usize) -> Inventory {
        Inventory {
            clusters: (0..n).map(|i| format!("lost{i}")).collect(),
            ..Inventory::default()
        }
    }

    struct Run {
        cache: SnapshotCache,
        status: watch::Receiver<PipelineStatus>,
        state: watch::Receiver<Arc<Records>>,
        _task: tokio::task::JoinHandle<()>,
    }

    fn run(baseline: BTreeMap<ObjectKey, Inventory>, enabled: bool) -> Run {
        let source = Box::new(StaticSource::from_files("t", [("t.yaml", CONFIG)]).unwrap());
        let cache = SnapshotCache::new();
        let (status_tx, status) = watch::channel(PipelineStatus::default());
        let (state_tx, state) = watch::channel(Arc::new(Records::new()));
        let pipeline = Pipeline {
            cache: cache.clone(),
            metrics: Metrics::new(),
            guard: GuardConfig {
                enabled,
                max_removal: 0.5,
                settle: Duration::from_millis(300),
            },
            options: Options::default(),
            status: status_tx,
            baseline,
            state: Some(state_tx),
            demand: watch::channel(BTreeSet::new()).1,
        };
        let task = tokio::spawn(pipeline.run(source.start()));
        Run {
            cache,
            status,
            state,
            _task: task,
        }
    }

    async fn until(mut f: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !f() {
            assert!(tokio::time::Instant::now() < deadline, "condition not met");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn edge() -> ObjectKey {
        ObjectKey::new("default", "edge")
    }

    #[tokio::test]
    async fn first_snapshot_is_judged_against_the_state_file() {
        let r = run([(edge(), lost(10))].into(), true);
        until(|| r.status.borrow().ready).await;
        // Ready, yet nothing published for the held gateway: its proxies wait.
        let held = r.status.borrow().gateways["default/edge"].held.clone();
        let held = held.expect("held");
        assert_eq!(held.origin, HoldOrigin::Restart);
        assert!(
            held.reason.contains("would remove 10 of 10 clusters"),
            "{}",
            held.reason
        );
        assert!(
            held.reason.contains("before the restart"),
            "{}",
            held.reason
        );
        assert!(r.cache.snapshot("default/edge").is_none());
        assert_eq!(
            r.status.borrow().guard.restart_baseline,
            vec!["default/edge"]
        );
        // After the settle period the source wins.
        until(|| r.cache.snapshot("default/edge").is_some()).await;
        assert!(r.status.borrow().gateways["default/edge"].held.is_none());
        assert!(r.status.borrow().guard.restart_baseline.is_empty());
        until(|| {
            r.state
                .borrow()
                .get("default/edge")
                .map(|r| r.inventory())
                .is_some_and(|i| i.clusters.len() == 1 && !i.clusters.contains("lost0"))
        })
        .await;
    }

    #[tokio::test]
    async fn a_gateway_gone_while_down_is_judged_as_a_removal() {
        let old = ObjectKey::new("default", "old");
        let r = run([(old.clone(), lost(5))].into(), true);
        until(|| r.status.borrow().ready).await;
        // The gateway the source has is published at once (nothing to compare).
        assert!(r.cache.snapshot("default/edge").is_some());
        let held = r.status.borrow().gateways["default/old"].held.clone();
        assert_eq!(held.expect("held").origin, HoldOrigin::Restart);
        assert!(
            r.state.borrow().contains_key("default/old"),
            "kept while held"
        );
        // Applied after the settle period: its proxies get an empty config.
        until(|| r.cache.snapshot("default/old").is_some()).await;
        assert_eq!(r.cache.snapshot("default/old").unwrap().total(), 0);
        assert!(r.status.borrow().gateways["default/old"].removed);
        until(|| !r.state.borrow().contains_key("default/old")).await;
    }

    #[tokio::test]
    async fn no_guard_ignores_the_state_file() {
        let r = run([(edge(), lost(10))].into(), false);
        until(|| r.status.borrow().ready).await;
        assert!(r.cache.snapshot("default/edge").is_some());
        assert!(r.status.borrow().gateways["default/edge"].held.is_none());
        // Still written, so turning the guard on again starts from now.
        until(|| r.state.borrow().contains_key("default/edge")).await;
    }
}
