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
            address: Spanned::new(self.address, Pos::UNKNOWN),
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

fn publish(
    tx: &watch::Sender<CatalogState>,
    regs: &Registrations,
    invalid: &BTreeMap<String, String>,
    revision: i64,
) {
    tx.send_modify(|s| {
        s.synced = true;
        s.stale = false;
        s.revision = revision;
        if *s.registrations != *regs {
            s.registrations = Arc::new(regs.clone());
        }
        if *s.invalid != *invalid {
            s.invalid = Arc::new(invalid.clone());
        }
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

/// The config source's state with the catalog merged in: synced once both are, a new
/// generation whenever either changes. Runs until every receiver is gone.
pub fn overlay(
    mut config: watch::Receiver<SourceState>,
    mut catalog: watch::Receiver<CatalogState>,
) -> watch::Receiver<SourceState> {
    let combine = |s: &SourceState, c: &CatalogState, generation: u64| {
        let mut out = s.clone();
        out.synced = s.synced && c.synced;
        out.generation = generation;
        out.name = format!("{}+catalog", s.name);
        if let Some(set) = &s.config
            && !c.registrations.is_empty()
        {
            out.config = Some(Arc::new(merge_registrations(set, &c.registrations)));
        }
        out
    };
    let first = combine(&config.borrow_and_update(), &catalog.borrow_and_update(), 1);
    let (tx, rx) = watch::channel(first);
    tokio::spawn(async move {
        let mut generation = 1;
        loop {
            tokio::select! {
                _ = tx.closed() => return,
                r = config.changed() => if r.is_err() { return },
                r = catalog.changed() => if r.is_err() { return },
            }
            generation += 1;
            let next = combine(
                &config.borrow_and_update(),
                &catalog.borrow_and_update(),
                generation,
            );
            tx.send_replace(next);
        }
    });
    rx
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
