//! State-of-the-World: each response carries the full set of subscribed
//! resources of one type (all of them for LDS/CDS wildcard).

use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;

use super::subscription::Subscription;
use super::{
    ClientViews, Nonces, RequestOutcome, SotwResponse, hard_refs_ready, referenced_by_client,
    share_if_whole,
};
use crate::resource::{Resource, ResourceType};
use crate::snapshot::{ResourceMap, Snapshot};
use crate::status::{NackInfo, SyncState, TypeStatus};
use crate::version::set_version;

#[derive(Debug, Default)]
struct SotwType {
    sub: Subscription,
    /// Newly subscribed names not answered yet: they must be answered even when
    /// nothing changed.
    must_answer: bool,
    /// `version_info` of the client's first request on this stream (it resumes).
    client_version: Option<String>,
    /// Version of the last response, accepted or not: never sent twice in a row.
    last_sent_version: Option<Arc<str>>,
    last_nonce: Option<Arc<str>>,
    in_flight: Option<InFlight>,
    acked: Arc<ResourceMap>,
    acked_version: Option<Arc<str>>,
    nack: Option<NackInfo>,
}

#[derive(Debug)]
struct InFlight {
    nonce: Arc<str>,
    version: Arc<str>,
    resources: Arc<ResourceMap>,
}

/// The State-of-the-World protocol for one stream (ADS or a per-type service).
#[derive(Debug)]
pub struct SotwMachine {
    only: Option<ResourceType>,
    types: [Option<SotwType>; 5],
    nonces: Nonces,
    snapshot: Option<Arc<Snapshot>>,
}

impl SotwMachine {
    /// `only`: the one type a per-type service (CDS, EDS, ...) serves; `None` for ADS.
    pub fn new(only: Option<ResourceType>) -> Self {
        SotwMachine {
            only,
            types: Default::default(),
            nonces: Nonces::default(),
            snapshot: None,
        }
    }

    /// The snapshot to serve; `None` while the server is not ready for this
    /// stream's group (requests are then held, never answered).
    pub fn set_snapshot(&mut self, snapshot: Option<Arc<Snapshot>>) {
        self.snapshot = snapshot;
    }

    pub fn handle_request(&mut self, req: &DiscoveryRequest) -> RequestOutcome {
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
        let known = self.snapshot.as_ref().map(|s| s.resources(ty).clone());
        let st = self.types[ty.index()].get_or_insert_with(SotwType::default);
        let mut outcome = RequestOutcome::Subscribed { ty };
        if first {
            if !req.version_info.is_empty() {
                st.client_version = Some(req.version_info.clone());
            }
        } else if !req.response_nonce.is_empty() {
            if st.last_nonce.as_deref() != Some(req.response_nonce.as_str()) {
                // Not the latest response: the client will send another request
                // after it processes the latest one. Ignored, per the protocol.
                return RequestOutcome::StaleNonce {
                    ty,
                    nonce: req.response_nonce.clone(),
                };
            }
            if let Some(f) = st.in_flight.take() {
                if let Some(err) = &req.error_detail {
                    let info = NackInfo {
                        version: f.version.clone(),
                        nonce: f.nonce.clone(),
                        message: err.message.clone(),
                    };
                    outcome = RequestOutcome::Nack {
                        ty,
                        version: f.version,
                        nonce: f.nonce,
                        message: err.message.clone(),
                    };
                    st.nack = Some(info);
                } else {
                    // Absence from an EDS/RDS/SDS response removes nothing
                    // at the client: it keeps what it had until it unsubscribes
                    // (what it holds is always covered by its subscription).
                    if ty.is_full_state_in_sotw() || keys_subset(&st.acked, &f.resources) {
                        st.acked = f.resources;
                    } else {
                        Arc::make_mut(&mut st.acked)
                            .extend(f.resources.iter().map(|(n, r)| (n.clone(), r.clone())));
                    }
                    st.acked_version = Some(f.version.clone());
                    st.nack = None;
                    outcome = RequestOutcome::Ack {
                        ty,
                        version: f.version,
                        nonce: f.nonce,
                    };
                }
            }
        }
        let (added, changed) = st
            .sub
            .apply_sotw_with(&req.resource_names, first, known.as_ref());
        if !added.is_empty() {
            st.must_answer = true;
        }
        if changed && st.acked.keys().any(|n| !st.sub.covers(n)) {
            // The client drops what it no longer subscribes to.
            let sub = &st.sub;
            Arc::make_mut(&mut st.acked).retain(|n, _| sub.covers(n));
        }
        outcome
    }

    /// The next response to send, if any. Call until it returns `None`; at most
    /// one response per type is in flight (unacknowledged) at a time, which
    /// also coalesces bursts of snapshots into one push.
    pub fn next_response(&mut self) -> Option<SotwResponse> {
        let snap = self.snapshot.clone()?;
        for ty in ResourceType::ALL {
            let ready = matches!(&self.types[ty.index()], Some(st) if st.in_flight.is_none());
            if !ready {
                continue;
            }
            if let Some(st) = self.types[ty.index()].as_mut() {
                // Shared subscription names move to the new map when its keys
                // are the same, so old maps are not kept alive.
                st.sub.follow(snap.resources(ty), |m| {
                    snap.changes(ty)
                        .is_some_and(|c| c.is_from(m) && !c.keys_changed())
                });
            }
            let (plan, held_missing) = self.plan(ty, &snap);
            if held_missing && !ty.is_full_state_in_sotw() {
                // A subscribed resource the client lacks is held back (its
                // clusters are not warm yet). Answering without it would tell
                // the client it does not exist — Envoy would warm a listener
                // with no routes. Wait until it can be sent.
                continue;
            }
            let version: Arc<str> = if Arc::ptr_eq(&plan, snap.resources(ty)) {
                snap.version(ty).clone()
            } else {
                set_version(plan.iter().map(|(n, r)| (&**n, r.version()))).into()
            };
            let st = self.types[ty.index()].as_mut().expect("checked");
            if st.last_sent_version.is_none() && st.client_version.as_deref() == Some(&*version) {
                // A resuming client already holds exactly this: nothing to send
                // (failover to a replica with the same config costs nothing).
                st.acked = plan;
                st.acked_version = Some(version.clone());
                st.last_sent_version = Some(version);
                st.must_answer = false;
                continue;
            }
            let rejected = st.nack.as_ref().is_some_and(|n| n.version == version);
            let changed = st.last_sent_version.as_ref() != Some(&version);
            // For EDS/RDS/SDS, absence from a SotW response does not remove
            // anything at the client: when the client already holds everything
            // in the plan, a push would tell it nothing.
            let only_drops = !ty.is_full_state_in_sotw()
                && plan
                    .iter()
                    .all(|(n, r)| st.acked.get(n).is_some_and(|a| a.version() == r.version()));
            if rejected || !(changed || st.must_answer) || (only_drops && !st.must_answer) {
                if !rejected && (only_drops || st.acked_version.as_ref() == Some(&version)) {
                    // The client holds what we want it to have (e.g. the config
                    // went back to the version it kept after a NACK): in sync.
                    st.nack = None;
                }
                st.must_answer = false;
                continue;
            }
            let nonce = self.nonces.next();
            st.must_answer = false;
            st.last_sent_version = Some(version.clone());
            st.last_nonce = Some(nonce.clone());
            st.in_flight = Some(InFlight {
                nonce: nonce.clone(),
                version: version.clone(),
                resources: plan.clone(),
            });
            return Some(SotwResponse {
                ty,
                version,
                nonce,
                resources: plan,
            });
        }
        None
    }

    /// The resources to send for `ty` now, after the ordering holds.
    /// Also says whether a resource the client lacks was held back.
    fn plan(&self, ty: ResourceType, snap: &Snapshot) -> (Arc<ResourceMap>, bool) {
        let st = self.types[ty.index()].as_ref().expect("requested");
        let whole = snap.resources(ty);
        let mut plan = ResourceMap::new();
        let mut held_missing = false;
        let mut consider = |name: &Arc<str>, res: &Arc<Resource>| {
            let held = st.acked.get(name);
            let unchanged = held.is_some_and(|h| h.version() == res.version());
            if unchanged || hard_refs_ready(res, snap, self) {
                plan.insert(
                    name.clone(),
                    held.filter(|_| unchanged).unwrap_or(res).clone(),
                );
            } else if let Some(old) = held {
                plan.insert(name.clone(), old.clone());
            } else {
                held_missing = true;
            }
        };
        if st.sub.is_wildcard() {
            for (name, res) in whole.iter() {
                consider(name, res);
            }
        } else {
            for name in st.sub.iter() {
                if let Some(res) = whole.get(name) {
                    consider(name, res);
                }
            }
        }
        if ty.is_full_state_in_sotw() {
            let gone: Vec<_> = st
                .acked
                .iter()
                .filter(|(n, _)| !plan.contains_key(*n) && st.sub.covers(n))
                .collect();
            if !gone.is_empty() {
                let refd = referenced_by_client(self);
                for (name, old) in gone {
                    if refd.contains(&(ty, name.clone())) {
                        plan.insert(name.clone(), old.clone());
                    }
                }
            }
        }
        (share_if_whole(plan, whole), held_missing)
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
                } else if st.last_sent_version.is_none() {
                    SyncState::NotSent
                } else {
                    SyncState::Synced
                };
                Some(TypeStatus {
                    ty,
                    wildcard: st.sub.is_wildcard(),
                    subscribed: st.sub.len(),
                    sent_version: st.last_sent_version.clone(),
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

/// Every key of `a` is a key of `b` (a walk of both maps in order).
fn keys_subset(a: &Arc<ResourceMap>, b: &Arc<ResourceMap>) -> bool {
    if a.is_empty() || Arc::ptr_eq(a, b) {
        return true;
    }
    if a.len() > b.len() {
        return false;
    }
    let mut bs = b.keys();
    'outer: for ka in a.keys() {
        for kb in bs.by_ref() {
            if Arc::ptr_eq(ka, kb) || ka == kb {
                continue 'outer;
            }
            if kb > ka {
                return false;
            }
        }
        return false;
    }
    true
}

impl ClientViews for SotwMachine {
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
                fl.resources.values().for_each(|r| f(r));
            }
        }
    }
}
