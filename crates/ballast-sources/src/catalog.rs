//! The live catalog: endpoints that service instances register in etcd, merged into their
//! Backend's endpoints.
//!
//! A registration is one key `<prefix>_catalog/<namespace>/<backend>/<id>` (see
//! [`crate::etcd_keys`]) whose value is a JSON [`Registration`], written with a lease. The
//! registrar keeps the lease alive (heartbeats); if it dies, etcd deletes the key when the
//! lease's TTL runs out and the endpoint leaves EDS. Nobody has to notice the death: the store
//! does, identically for every replica.
//!
//! [`CatalogSource`] lists the catalog at one revision and watches from there (relisting after
//! compaction or a lost connection, keeping what it has meanwhile); [`overlay`] merges its
//! registrations into a config source's state, so the pipeline downstream sees ordinary Backend
//! endpoints and translation stays pure.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use ballast_etcd::{Client, EventKind, KeyRange, WatchOptions};
use ballast_model::{Backend, ConfigSet, Endpoint, HealthStatus, ObjectKey, Pos, Spanned};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::etcd_keys;
use crate::state::SourceState;

/// A registrar's health check result, as in Consul: `passing` → HEALTHY, `warning` → DEGRADED
/// (used only when nothing healthy is left), `critical` → UNHEALTHY (no traffic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CatalogHealth {
    #[default]
    Passing,
    Warning,
    Critical,
}

impl CatalogHealth {
    pub fn status(self) -> HealthStatus {
        match self {
            CatalogHealth::Passing => HealthStatus::Healthy,
            CatalogHealth::Warning => HealthStatus::Degraded,
            CatalogHealth::Critical => HealthStatus::Unhealthy,
        }
    }
}

/// The value of a registration key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registration {
    pub address: IpAddr,
    pub port: u16,
    #[serde(default)]
    pub health: CatalogHealth,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

impl Registration {
    fn endpoint(&self) -> Endpoint {
        Endpoint {
            address: Spanned::new(self.address.into(), Pos::UNKNOWN),
            port: Spanned::new(u32::from(self.port), Pos::UNKNOWN),
            weight: self
                .weight
                .map(|w| Spanned::new(w.clamp(1, 1_000_000), Pos::UNKNOWN)),
            zone: self.zone.clone(),
            health: self.health.status(),
        }
    }
}

/// Registrations by Backend, then id.
pub type Registrations = BTreeMap<ObjectKey, BTreeMap<String, Registration>>;

/// What the catalog source publishes.
#[derive(Clone, Debug, Default)]
pub struct CatalogState {
    /// The first listing finished (readiness waits for it: invariant 1).
    pub synced: bool,
    /// The store revision the registrations reflect.
    pub revision: i64,
    pub registrations: Arc<Registrations>,
    /// Keys whose value is not a valid registration (ignored), with why.
    pub invalid: Arc<BTreeMap<String, String>>,
    /// Lost contact with etcd (what was registered is kept meanwhile).
    pub stale: bool,
}

/// Lists and watches `<prefix>_catalog/`.
#[derive(Clone, Debug)]
pub struct CatalogSource {
    client: Client,
    prefix: String,
}

/// Pause between attempts while etcd is unreachable.
const RETRY: Duration = Duration::from_secs(1);

impl CatalogSource {
    pub fn new(client: Client, prefix: impl Into<String>) -> Self {
        CatalogSource {
            client,
            prefix: prefix.into(),
        }
    }

    /// Starts the list+watch loop (panics outside a tokio runtime); it stops when every
    /// receiver is gone.
    pub fn start(self) -> watch::Receiver<CatalogState> {
        let (tx, rx) = watch::channel(CatalogState::default());
        tokio::spawn(self.run(tx));
        rx
    }

    async fn run(self, tx: watch::Sender<CatalogState>) {
        let range = KeyRange::prefix(etcd_keys::catalog_prefix(&self.prefix));
        loop {
            if let Err(e) = self.list_and_watch(&range, &tx).await {
                tracing::warn!(error = %e, "catalog: etcd list/watch ended; keeping the registrations known, retrying");
                tx.send_if_modified(|s| !std::mem::replace(&mut s.stale, true));
            }
            tokio::select! {
                _ = tx.closed() => return,
                _ = tokio::time::sleep(RETRY) => {}
            }
        }
    }

    /// One listing (a full replacement: keys gone meanwhile disappear, by keep-set) and the
    /// watch after it, until it fails.
    async fn list_and_watch(
        &self,
        range: &KeyRange,
        tx: &watch::Sender<CatalogState>,
    ) -> Result<(), ballast_etcd::Error> {
        let listing = self.client.list(range, 0, 1000).await?;
        let mut regs = Registrations::new();
        let mut invalid = BTreeMap::new();
        for kv in &listing.kvs {
            self.put(&mut regs, &mut invalid, &kv.key, &kv.value);
        }
        let mut revision = listing.revision;
        publish(tx, &regs, &invalid, revision);
        let mut watch = self
            .client
            .watch(
                range.clone(),
                WatchOptions {
                    start_revision: revision + 1,
                    ..WatchOptions::default()
                },
            )
            .await?;
        loop {
            let batch = tokio::select! {
                _ = tx.closed() => return Ok(()),
                b = watch.next() => b,
            };
            let batch = match batch {
                Some(Ok(b)) => b,
                Some(Err(e)) => return Err(e),
                None => {
                    return Err(ballast_etcd::Error::WatchCanceled {
                        reason: "watch stream ended".into(),
                    });
                }
            };
            for e in &batch.events {
                match e.kind {
                    EventKind::Put => self.put(&mut regs, &mut invalid, &e.kv.key, &e.kv.value),
                    EventKind::Delete => self.delete(&mut regs, &mut invalid, &e.kv.key),
                }
            }
            let changed = !batch.events.is_empty() || tx.borrow().stale;
            revision = revision.max(batch.revision);
            if changed {
                publish(tx, &regs, &invalid, revision);
            }
        }
    }

    fn put(
        &self,
        regs: &mut Registrations,
        invalid: &mut BTreeMap<String, String>,
        key: &[u8],
        value: &[u8],
    ) {
        let key = String::from_utf8_lossy(key);
        let Some((backend, id)) = etcd_keys::parse_registration_key(&self.prefix, &key) else {
            invalid.insert(key.into_owned(), "not a registration key".into());
            return;
        };
        match serde_json::from_slice::<Registration>(value) {
            Ok(r) => {
                invalid.remove(key.as_ref());
                regs.entry(backend).or_default().insert(id, r);
            }
            Err(e) => {
                // An invalid value replaces nothing: drop an earlier registration under the key
                // (its writer meant to change it) and report.
                if let Some(m) = regs.get_mut(&backend) {
                    m.remove(&id);
                }
                invalid.insert(key.into_owned(), e.to_string());
            }
        }
    }

    fn delete(&self, regs: &mut Registrations, invalid: &mut BTreeMap<String, String>, key: &[u8]) {
        let key = String::from_utf8_lossy(key);
        invalid.remove(key.as_ref());
        if let Some((backend, id)) = etcd_keys::parse_registration_key(&self.prefix, &key)
            && let Some(m) = regs.get_mut(&backend)
        {
            m.remove(&id);
            if m.is_empty() {
                regs.remove(&backend);
            }
        }
    }
}

/// Publishes the registrations, waking receivers only if something changed: a relist (after a
/// lost connection or compaction) that finds what was already published is no news (#12). The
/// registrations keep their `Arc` while equal, so [`overlay`] can tell a change by identity.
fn publish(
    tx: &watch::Sender<CatalogState>,
    regs: &Registrations,
    invalid: &BTreeMap<String, String>,
    revision: i64,
) {
    tx.send_if_modified(|s| {
        let mut changed = !s.synced || s.stale || s.revision != revision;
        s.synced = true;
        s.stale = false;
        s.revision = revision;
        if *s.registrations != *regs {
            s.registrations = Arc::new(regs.clone());
            changed = true;
        }
        if *s.invalid != *invalid {
            s.invalid = Arc::new(invalid.clone());
            changed = true;
        }
        changed
    });
}

/// The config with every registered endpoint appended to its Backend's static endpoints
/// (registrations for Backends that do not exist are ignored: the Backend defines the cluster).
/// A registration with the same address and port as a static endpoint replaces it, so a
/// registrar can report health for an endpoint also listed statically.
pub fn merge_registrations(config: &ConfigSet, regs: &Registrations) -> ConfigSet {
    let mut out = config.clone();
    for (key, by_id) in regs {
        let Some(backend) = config.backends.get(key) else {
            continue;
        };
        let mut b: Backend = (**backend).clone();
        for r in by_id.values() {
            let ep = r.endpoint();
            b.spec.endpoints.retain(|e| {
                !(e.address.value == ep.address.value && e.port.value == ep.port.value)
            });
            b.spec.endpoints.push(ep);
        }
        out.backends.insert(key.clone(), Arc::new(b));
    }
    out
}

/// The config source's state with the catalog merged in: synced once both are.
///
/// A new generation only when the merged config can differ: the config source published a new
/// generation, or the catalog's registrations changed (a new `Arc`; [`CatalogSource`] keeps the
/// old one while the content is equal). Anything else either side publishes (stale, revision,
/// errors, a relist that found nothing new) is passed on under the same generation, so a resync
/// never makes the pipeline re-translate and push (#12). The check is O(1) per wake-up.
/// Runs until every receiver is gone.
pub fn overlay(
    mut config: watch::Receiver<SourceState>,
    mut catalog: watch::Receiver<CatalogState>,
) -> watch::Receiver<SourceState> {
    let (tx, rx) = watch::channel(SourceState::new(String::new()));
    let mut merger = Overlay::new();
    merger.next(&config.borrow_and_update(), &catalog.borrow_and_update());
    tx.send_replace(merger.out.clone());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tx.closed() => return,
                r = config.changed() => if r.is_err() { return },
                r = catalog.changed() => if r.is_err() { return },
            }
            let changed = merger.next(&config.borrow_and_update(), &catalog.borrow_and_update());
            if changed {
                tx.send_replace(merger.out.clone());
            }
        }
    });
    rx
}

/// [`overlay`]'s state: what the last merged config was built from.
struct Overlay {
    /// The config source's generation and the registrations the merged config was built from
    /// (`None` before the first build). Holding the `Arc` keeps its address from being reused.
    built_from: Option<(u64, Arc<Registrations>)>,
    out: SourceState,
}

impl Overlay {
    fn new() -> Self {
        Overlay {
            built_from: None,
            out: SourceState::new(String::new()),
        }
    }

    /// Folds the inputs into `out`; returns whether anything visible changed.
    fn next(&mut self, s: &SourceState, c: &CatalogState) -> bool {
        let mut out = s.clone();
        out.synced = s.synced && c.synced;
        out.name = format!("{}+catalog", s.name);
        let same = self.built_from.as_ref().is_some_and(|(generation, regs)| {
            *generation == s.generation && Arc::ptr_eq(regs, &c.registrations)
        });
        if same {
            out.generation = self.out.generation;
            out.config = self.out.config.clone();
        } else {
            out.generation = self.out.generation + 1;
            if let Some(set) = &s.config
                && !c.registrations.is_empty()
            {
                out.config = Some(Arc::new(merge_registrations(set, &c.registrations)));
            }
            self.built_from = Some((s.generation, c.registrations.clone()));
        }
        let changed = !same || !same_visible(&self.out, &out);
        self.out = out;
        changed
    }
}

/// Everything but the config (compared by generation) and the timestamps of attempts (which
/// ride along with the next real change).
fn same_visible(a: &SourceState, b: &SourceState) -> bool {
    a.generation == b.generation
        && a.synced == b.synced
        && a.name == b.name
        && a.files == b.files
        && a.revision == b.revision
        && a.stale_since == b.stale_since
        && a.store_error == b.store_error
        && a.last_error == b.last_error
        && a.report == b.report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ConfigSet {
        ConfigSet::build([(
            "b.yaml",
            "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata:\n  name: api\nspec:\n  endpoints:\n  - address: 10.0.0.1\n    port: 80\n",
        )])
        .unwrap()
    }

    fn reg(addr: &str, health: CatalogHealth) -> Registration {
        Registration {
            address: addr.parse().unwrap(),
            port: 80,
            health,
            weight: None,
            zone: None,
        }
    }

    #[test]
    fn registrations_join_static_endpoints_with_their_health() {
        let mut regs = Registrations::new();
        let api = ObjectKey::new("default", "api");
        regs.entry(api.clone())
            .or_default()
            .insert("a".into(), reg("10.0.0.2", CatalogHealth::Warning));
        regs.entry(api.clone())
            .or_default()
            .insert("b".into(), reg("10.0.0.1", CatalogHealth::Critical));
        regs.entry(ObjectKey::new("default", "nope"))
            .or_default()
            .insert("c".into(), reg("10.0.0.3", CatalogHealth::Passing));
        let set = merge_registrations(&config(), &regs);
        let eps: Vec<(String, HealthStatus)> = set.backends[&api]
            .spec
            .endpoints
            .iter()
            .map(|e| (e.address.value.to_string(), e.health))
            .collect();
        assert_eq!(
            eps,
            vec![
                ("10.0.0.2".into(), HealthStatus::Degraded),
                ("10.0.0.1".into(), HealthStatus::Unhealthy)
            ]
        );
        assert_eq!(set.backends.len(), 1, "no Backend is made up");
    }

    fn regs(addrs: &[&str]) -> Registrations {
        let mut regs = Registrations::new();
        for a in addrs {
            regs.entry(ObjectKey::new("default", "api"))
                .or_default()
                .insert((*a).into(), reg(a, CatalogHealth::Passing));
        }
        regs
    }

    /// #12: a relist that finds what was published wakes no one; a real change does.
    #[test]
    fn unchanged_relist_publishes_nothing() {
        let (tx, mut rx) = watch::channel(CatalogState::default());
        let none = BTreeMap::new();
        publish(&tx, &regs(&["10.0.0.2"]), &none, 5);
        assert!(rx.has_changed().unwrap());
        let first = rx.borrow_and_update().registrations.clone();
        publish(&tx, &regs(&["10.0.0.2"]), &none, 5);
        assert!(
            !rx.has_changed().unwrap(),
            "same registrations, same revision"
        );
        // Reconnected after a loss: not stale any more is news, but the registrations keep
        // their identity.
        tx.send_modify(|s| s.stale = true);
        rx.borrow_and_update();
        publish(&tx, &regs(&["10.0.0.2"]), &none, 5);
        assert!(rx.has_changed().unwrap());
        assert!(Arc::ptr_eq(&first, &rx.borrow_and_update().registrations));
        publish(&tx, &regs(&["10.0.0.2", "10.0.0.3"]), &none, 6);
        assert!(!Arc::ptr_eq(&first, &rx.borrow_and_update().registrations));
    }

    /// #12: the merged generation moves once per new config or new registrations, never for a
    /// resync, a stale flip or a revision that brought nothing (what etcd_e2e counts exactly).
    #[tokio::test]
    async fn overlay_generation_moves_only_with_content() {
        let now = std::time::SystemTime::now();
        let mut s = SourceState::new("etcd");
        s.apply_success(config(), 1, now);
        s.revision = Some(1);
        let (config_tx, config_rx) = watch::channel(s);
        let (cat_tx, cat_rx) = watch::channel(CatalogState::default());
        publish(&cat_tx, &regs(&["10.0.0.2"]), &BTreeMap::new(), 1);
        let mut out = overlay(config_rx, cat_rx);
        let gen0 = out.borrow_and_update().generation;
        let eps = |s: &SourceState| {
            s.config.as_ref().unwrap().backends[&ObjectKey::new("default", "api")]
                .spec
                .endpoints
                .len()
        };
        assert_eq!(eps(&out.borrow()), 2);

        // Noise from both sides: the catalog loses etcd and relists the same registrations;
        // the config source goes stale, comes back, and applies revisions without changes.
        cat_tx.send_modify(|c| c.stale = true);
        publish(&cat_tx, &regs(&["10.0.0.2"]), &BTreeMap::new(), 7);
        for rev in 2..5 {
            config_tx.send_modify(|s| {
                s.stale_since = Some(now);
                s.store_error = Some("down".into());
            });
            config_tx.send_modify(|s| {
                s.stale_since = None;
                s.store_error = None;
                s.revision = Some(rev);
                assert!(!s.apply_success(config(), 1, now), "same config");
            });
            tokio::task::yield_now().await;
        }
        // Then one real change on each side.
        publish(
            &cat_tx,
            &regs(&["10.0.0.2", "10.0.0.3"]),
            &BTreeMap::new(),
            8,
        );
        let s = out
            .wait_for(|s| s.config.as_ref().is_some_and(|_| eps(s) == 3))
            .await
            .unwrap()
            .clone();
        assert_eq!(s.generation, gen0 + 1, "one new generation for one change");
        assert_eq!(s.revision, Some(4), "revisions still pass through");
        config_tx.send_modify(|s| {
            let mut set = config();
            set.backends.clear();
            assert!(s.apply_success(set, 1, now));
        });
        let s = out
            .wait_for(|s| s.config.as_ref().is_some_and(|c| c.backends.is_empty()))
            .await
            .unwrap()
            .clone();
        assert_eq!(s.generation, gen0 + 2);
        assert!(s.synced);
    }

    #[test]
    fn registration_json() {
        let r: Registration =
            serde_json::from_str(r#"{"address":"127.0.0.1","port":8080}"#).unwrap();
        assert_eq!(r.health, CatalogHealth::Passing);
        assert!(serde_json::from_str::<Registration>(r#"{"address":"x","port":1}"#).is_err());
        let r: Registration = serde_json::from_str(
            r#"{"address":"::1","port":1,"health":"critical","zone":"z","weight":3}"#,
        )
        .unwrap();
        assert_eq!(r.health.status(), HealthStatus::Unhealthy);
    }
}
