//! Incremental (Delta) xDS: responses carry only what changed, and removals by
//! name; the server tracks what each client holds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;

use super::subscription::Subscription;
use super::{
    ClientViews, DeltaResponse, Nonces, RequestOutcome, hard_refs_ready, referenced_by_client,
    share_if_whole,
};
use crate::resource::{Resource, ResourceType};
use crate::snapshot::{ResourceMap, Snapshot};
use crate::status::{NackInfo, SyncState, TypeStatus};

/// Marks a rejected removal in `rejected`: not retried until the name reappears.
const REMOVAL: &str = "";

#[derive(Debug, Default)]
struct DeltaType {
    sub: Subscription,
    /// What the client holds, as resources we know.
    acked: Arc<ResourceMap>,
    /// Versions the client said it has (`initial_resource_versions`) that do not
    /// match a resource we know: it holds *something* under that name.
    unknown: BTreeMap<Arc<str>, String>,
    /// Explicitly subscribed names we told the client do not exist.
    told_absent: BTreeSet<Arc<str>>,
    /// name → version the client rejected; never sent again.
    rejected: BTreeMap<Arc<str>, Arc<str>>,
    in_flight: Option<InFlight>,
    last_nonce: Option<Arc<str>>,
    sent_version: Option<Arc<str>>,
    acked_version: Option<Arc<str>>,
    nack: Option<NackInfo>,
}

#[derive(Debug)]
struct InFlight {
    nonce: Arc<str>,
    version: Arc<str>,
    upserts: Vec<Arc<Resource>>,
    removed: Vec<Arc<str>>,
}

/// The Delta protocol for one stream (ADS or a per-type service).
#[derive(Debug)]
pub struct DeltaMachine {
    only: Option<ResourceType>,
    types: [Option<DeltaType>; 5],
    nonces: Nonces,
    snapshot: Option<Arc<Snapshot>>,
}

impl DeltaMachine {
    pub fn new(only: Option<ResourceType>) -> Self {
        DeltaMachine {
            only,
            types: Default::default(),
            nonces: Nonces::default(),
            snapshot: None,
        }
    }

    pub fn set_snapshot(&mut self, snapshot: Option<Arc<Snapshot>>) {
        self.snapshot = snapshot;
    }

    pub fn handle_request(&mut self, req: &DeltaDiscoveryRequest) -> RequestOutcome {
        let Some(ty) = ResourceType::from_type_url(&req.type_url) else {
            return RequestOutcome::UnknownType {
                type_url: req.type_url.clone(),
            };
        };
        if self.only.is_some_and(|only| only != ty) {
            return RequestOutcome::WrongType {
                type_url: req.type_url.clone(),
            };
        }
        let first = self.types[ty.index()].is_none();
        let st = self.types[ty.index()].get_or_insert_with(DeltaType::default);
        let mut outcome = RequestOutcome::Subscribed { ty };
        if first {
            for (name, version) in &req.initial_resource_versions {
                st.unknown.insert(name.as_str().into(), version.clone());
            }
        }
        if !req.response_nonce.is_empty()
            && st.in_flight.as_ref().map(|f| &*f.nonce) == Some(req.response_nonce.as_str())
        {
            let f = st.in_flight.take().expect("matched");
            if let Some(err) = &req.error_detail {
                for r in &f.upserts {
                    st.rejected
                        .insert(r.name_arc().clone(), r.version_arc().clone());
                }
                for n in &f.removed {
                    if st.acked.contains_key(n) || st.unknown.contains_key(n) {
                        st.rejected.insert(n.clone(), REMOVAL.into());
                    }
                }
                st.nack = Some(NackInfo {
                    version: f.version.clone(),
                    nonce: f.nonce.clone(),
                    message: err.message.clone(),
                });
                outcome = RequestOutcome::Nack {
                    ty,
                    version: f.version,
                    nonce: f.nonce,
                    message: err.message.clone(),
                };
            } else {
                let mut acked = (*st.acked).clone();
                for r in &f.upserts {
                    st.rejected.remove(r.name());
                    st.unknown.remove(r.name());
                    acked.insert(r.name_arc().clone(), r.clone());
                }
                for n in &f.removed {
                    st.unknown.remove(n);
                    st.rejected.remove(n);
                    acked.remove(n);
                }
                st.acked = match &self.snapshot {
                    Some(s) => share_if_whole(acked, s.resources(ty)),
                    None => Arc::new(acked),
                };
                st.acked_version = Some(f.version.clone());
                st.nack = None;
                outcome = RequestOutcome::Ack {
                    ty,
                    version: f.version,
                    nonce: f.nonce,
                };
            }
        }
        st.sub.apply_delta(
            &req.resource_names_subscribe,
            &req.resource_names_unsubscribe,
            first,
        );
        for name in &req.resource_names_subscribe {
            // Always answer a (re)subscription to a name we said is absent.
            st.told_absent.remove(name.as_str());
        }
        let dropped: Vec<Arc<str>> = req
            .resource_names_unsubscribe
            .iter()
            .filter(|n| !st.sub.covers(n))
            .map(|n| Arc::from(n.as_str()))
            .collect();
        if !dropped.is_empty() {
            // The client forgets what it unsubscribed from.
            let mut acked = (*st.acked).clone();
            for n in &dropped {
                acked.remove(n);
                st.unknown.remove(n);
                st.told_absent.remove(n);
                st.rejected.remove(n);
            }
            st.acked = Arc::new(acked);
        }
        {
            // Wildcard removed: drop what is no longer covered.
            let uncovered: Vec<Arc<str>> = st
                .acked
                .keys()
                .filter(|n| !st.sub.covers(n))
                .cloned()
                .collect();
            if !uncovered.is_empty() {
                let mut acked = (*st.acked).clone();
                for n in &uncovered {
                    acked.remove(n);
                }
                st.acked = Arc::new(acked);
            }
        }
        outcome
    }

    /// The next response to send, if any (at most one in flight per type).
    pub fn next_response(&mut self) -> Option<DeltaResponse> {
        let snap = self.snapshot.clone()?;
        for ty in ResourceType::ALL {
            let ready = matches!(&self.types[ty.index()], Some(st) if st.in_flight.is_none());
            if !ready {
                continue;
            }
            self.resolve_unknown(ty, &snap);
            let (upserts, removed, absent) = self.plan(ty, &snap);
            if upserts.is_empty() && removed.is_empty() && absent.is_empty() {
                continue;
            }
            let nonce = self.nonces.next();
            let st = self.types[ty.index()].as_mut().expect("checked");
            let version = snap.version(ty).clone();
            st.told_absent.extend(absent.iter().cloned());
            let mut all_removed = removed;
            all_removed.extend(absent);
            st.last_nonce = Some(nonce.clone());
            st.sent_version = Some(version.clone());
            st.in_flight = Some(InFlight {
                nonce: nonce.clone(),
                version: version.clone(),
                upserts: upserts.clone(),
                removed: all_removed.clone(),
            });
            return Some(DeltaResponse {
                ty,
                system_version: version,
                nonce,
                resources: upserts,
                removed: all_removed,
            });
        }
        None
    }

    /// Client-declared versions that match a resource we serve become known content.
    fn resolve_unknown(&mut self, ty: ResourceType, snap: &Snapshot) {
        let st = self.types[ty.index()].as_mut().expect("requested");
        if st.unknown.is_empty() {
            return;
        }
        let whole = snap.resources(ty);
        let mut acked = (*st.acked).clone();
        st.unknown.retain(|name, version| match whole.get(name) {
            Some(res) if res.version() == version => {
                acked.insert(name.clone(), res.clone());
                false
            }
            _ => true,
        });
        st.acked = share_if_whole(acked, whole);
    }

    #[allow(clippy::type_complexity)]
    fn plan(
        &self,
        ty: ResourceType,
        snap: &Snapshot,
    ) -> (Vec<Arc<Resource>>, Vec<Arc<str>>, Vec<Arc<str>>) {
        let st = self.types[ty.index()].as_ref().expect("requested");
        let whole = snap.resources(ty);
        let mut upserts = Vec::new();
        let mut consider = |res: &Arc<Resource>| {
            if st
                .acked
                .get(res.name())
                .is_some_and(|h| h.version() == res.version())
            {
                return;
            }
            if st
                .rejected
                .get(res.name())
                .is_some_and(|v| **v == *res.version())
            {
                return;
            }
            if hard_refs_ready(res, snap, self) {
                upserts.push(res.clone());
            }
        };
        if st.sub.is_wildcard() {
            whole.values().for_each(&mut consider);
        } else {
            for name in st.sub.names() {
                if let Some(res) = whole.get(name) {
                    consider(res);
                }
            }
        }
        let mut removed = Vec::new();
        let gone: Vec<&Arc<str>> = st
            .acked
            .keys()
            .chain(st.unknown.keys())
            .filter(|n| !whole.contains_key(*n) && st.sub.covers(n))
            .filter(|n| st.rejected.get(*n).is_none_or(|v| &**v != REMOVAL))
            .collect();
        if !gone.is_empty() {
            let refd = referenced_by_client(self);
            for name in gone {
                if !refd.contains(&(ty, name.clone())) {
                    removed.push(name.clone());
                }
            }
            removed.sort();
            removed.dedup();
        }
        let absent: Vec<Arc<str>> = st
            .sub
            .names()
            .iter()
            .filter(|n| {
                !whole.contains_key(*n)
                    && !st.acked.contains_key(*n)
                    && !st.unknown.contains_key(*n)
                    && !st.told_absent.contains(*n)
            })
            .cloned()
            .collect();
        (upserts, removed, absent)
    }

    pub fn status(&self) -> Vec<TypeStatus> {
        ResourceType::ALL
            .into_iter()
            .filter_map(|ty| {
                let st = self.types[ty.index()].as_ref()?;
                let state = if st.nack.is_some() {
                    SyncState::Error
                } else if st.in_flight.is_some() {
                    SyncState::Stale
                } else if st.sent_version.is_none() {
                    SyncState::NotSent
                } else {
                    SyncState::Synced
                };
                Some(TypeStatus {
                    ty,
                    wildcard: st.sub.is_wildcard(),
                    subscribed: st.sub.names().len(),
                    sent_version: st.sent_version.clone(),
                    sent_nonce: st.last_nonce.clone(),
                    acked_version: st.acked_version.clone(),
                    acked: st.acked.clone(),
                    nack: st.nack.clone(),
                    state,
                })
            })
            .collect()
    }
}

impl ClientViews for DeltaMachine {
    fn client_has(&self, ty: ResourceType, name: &str) -> Option<bool> {
        let st = self.types[ty.index()].as_ref()?;
        if ty != ResourceType::ClusterLoadAssignment && !st.sub.covers(name) {
            return None;
        }
        Some(st.acked.contains_key(name))
    }

    fn for_each_held(&self, f: &mut dyn FnMut(&Resource)) {
        for st in self.types.iter().flatten() {
            st.acked.values().for_each(|r| f(r));
            if let Some(fl) = &st.in_flight {
                fl.upserts.iter().for_each(|r| f(r));
            }
        }
    }
}
