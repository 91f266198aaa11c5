//! State-of-the-World: each response carries the full set of subscribed
//! resources of one type (all of them for LDS/CDS wildcard).
//!
//! Every stream gets at least one response once the client's state is known
//! (invariant 2, docs/architecture.md): Envoy resets its reconnect backoff only when a stream
//! delivers a message, so a resumed stream that owes the client nothing still
//! gets a no-op ([`SotwMachine`]'s keepalive): an EDS, RDS or SDS response with
//! no resources at the version the client holds (Envoy's SotW mux calls a
//! named watch only for resources present in the response, so it only ACKs);
//! for a client that subscribes to none of those, its CDS or LDS state again at
//! the same version (Envoy skips every resource whose hash is unchanged).
// Reachable from outside only through `crate::internals` (feature `unstable-internals`).
#![cfg_attr(not(feature = "unstable-internals"), allow(unreachable_pub))]

use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;

use super::sorted::{cmp_names, keys_subset};
use super::sotw_request::{NamesKey, SotwRequest};
use super::subscription::{SotwChange, Subscription, empty_first_request_is_wildcard};
use super::{
    PerType, Progress, RequestOutcome, Seeker, SotwResponse, StreamCore, TypeState,
    hard_refs_ready, referenced_by_client, share_if_whole, without_names,
};
use crate::resource::{Resource, ResourceType};
use crate::snapshot::{ResourceMap, Snapshot};
use crate::status::{NackInfo, TypeStatus};
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
    /// A full-state type resumed at a version no recent snapshot explains
    /// (e.g. a response that mixed old and new resources during a
    /// transition). Until its first ACK nothing is answered while the resume
    /// hold lasts, and then what the client's other resources reference is
    /// kept from `maybe`.
    unresolved: bool,
    /// On a resumed stream, what the client may hold beyond `acked` (every
    /// recent version of each subscribed name, newest first): an EDS/RDS client
    /// keeps resources from responses before the one its version names, an
    /// unresolved full-state type holds some of these, and a resolved one may
    /// still hold what [`maybe_dropped`] took out of `acked`. Only the removal
    /// gate looks at them (never the gate for additions).
    maybe: Option<Arc<[Arc<Resource>]>>,
    /// Identifies the last `resource_names` list applied from the wire.
    names_key: Option<NamesKey>,
}

/// Where a request's `resource_names` come from.
enum Names<'a> {
    List(&'a [String]),
    /// Undecoded: compared by [`NamesKey`] first.
    Wire(&'a SotwRequest),
}

impl SotwType {
    /// The client acknowledged exactly `whole` (the snapshot's own map) and
    /// nothing was sent or asked since: planning would find nothing to do.
    fn settled_on(&self, whole: &Arc<ResourceMap>) -> bool {
        Arc::ptr_eq(&self.acked, whole)
            && self.in_flight.is_none()
            && !self.must_answer
            && !self.unresolved
            && self.acked_version.is_some()
            && self.last_sent_version == self.acked_version
    }

    /// The client accepted `f`: it holds what `f` sent.
    fn apply_ack(&mut self, ty: ResourceType, f: InFlight) -> RequestOutcome {
        // Absence from an EDS/RDS/SDS response removes nothing at the
        // client: it keeps what it had until it unsubscribes (what it holds
        // is always covered by its subscription).
        // What the client holds is covered by its subscription, so when the
        // subscribed names are the keys of what was sent (O(1): shared), it
        // holds nothing beyond it: no walk of 1,000 names per ACK (W2).
        let covers_held = self.sub.is_keys_of(&f.resources) && {
            debug_assert!(keys_subset(&self.acked, &f.resources));
            true
        };
        if ty.is_full_state_in_sotw() || covers_held || keys_subset(&self.acked, &f.resources) {
            self.acked = f.resources;
        } else {
            Arc::make_mut(&mut self.acked)
                .extend(f.resources.iter().map(|(n, r)| (n.clone(), r.clone())));
        }
        self.acked_version = Some(f.version.clone());
        if ty.is_full_state_in_sotw() {
            // The client holds exactly what it acknowledged.
            self.unresolved = false;
            self.maybe = None;
        }
        self.nack = None;
        RequestOutcome::Ack {
            ty,
            version: f.version,
            nonce: f.nonce,
        }
    }

    /// The client rejected `f` with `message`: recorded, so that version is
    /// not sent again; the client keeps what it had, except removals.
    fn apply_nack(&mut self, ty: ResourceType, f: InFlight, message: &str) -> RequestOutcome {
        let info = NackInfo {
            version: f.version,
            nonce: f.nonce,
            message: message.to_string(),
        };
        let outcome = RequestOutcome::nacked(ty, &info);
        self.nack = Some(info);
        if ty.is_full_state_in_sotw() && !keys_subset(&self.acked, &f.resources) {
            // Envoy's CDS and LDS apply a NACKed response's removals (what
            // it lacks): the client no longer has those (found by the
            // hostile model in sim.rs).
            let sent = &f.resources;
            super::sorted::retain(Arc::make_mut(&mut self.acked), |n, _| sent.contains_key(n));
        }
        outcome
    }

    /// Applies the request's `resource_names`; `None` when they are the
    /// list applied last (an ACK repeats them), which is then not even
    /// decoded: applying it again would change nothing.
    fn apply_names(
        &mut self,
        ty: ResourceType,
        names: Names<'_>,
        first: bool,
        known: Option<&Arc<ResourceMap>>,
    ) -> Option<SotwChange> {
        let legacy_wildcard = first && empty_first_request_is_wildcard(ty);
        match names {
            Names::Wire(w) if self.names_key == Some(w.names_key()) => None,
            Names::Wire(w) => {
                self.names_key = Some(w.names_key());
                if let Some(k) = known
                    && !k.is_empty()
                    && !k.contains_key(super::subscription::WILDCARD)
                    && w.names_are_keys_of(k)
                {
                    // Every name of the type, as Envoy's first EDS request
                    // asks: shared, never decoded.
                    return Some(self.sub.apply_sotw_keys(k));
                }
                Some(self.sub.apply_sotw_with(&w.names(), legacy_wildcard, known))
            }
            Names::List(list) => {
                self.names_key = None;
                Some(self.sub.apply_sotw_with(list, legacy_wildcard, known))
            }
        }
    }

    /// A first request, and newly subscribed names, are answered even when
    /// nothing changed.
    fn owe_answer(&mut self, ty: ResourceType, first: bool, added: &[Arc<str>]) {
        if first {
            // Even one that subscribes to nothing (an empty EDS/RDS/SDS
            // list: "not interested").
            self.must_answer = true;
        }
        if added.is_empty() {
            return;
        }
        self.must_answer = true;
        if !first {
            // The version the client resumed at may name these (it held
            // them, dropped them, and asks again): it no longer proves the
            // client holds what it names.
            self.client_version = None;
        }
        if !first && !ty.is_full_state_in_sotw() && added.iter().any(|n| self.acked.contains_key(n))
        {
            // Newly requested names are always (re)sent: a client keeps
            // only what it asked for by name, so what it held under a
            // wildcard (or we believe it holds) may not be there.
            let acked = Arc::make_mut(&mut self.acked);
            for n in added {
                acked.remove(n);
            }
        }
    }

    /// A first request reporting `version`: the client resumes from an
    /// earlier stream, and gating starts from what it holds.
    fn resume(
        &mut self,
        ty: ResourceType,
        version: &str,
        current: Option<&Arc<Snapshot>>,
        history: &[Arc<Snapshot>],
        sent_anew: Vec<Arc<str>>,
    ) {
        if let Some((version, held)) = held_at_version(ty, &self.sub, version, current, history) {
            // The client holds exactly that content: gating (and the
            // removal gate of other types) starts from it.
            self.acked = held;
            self.acked_version = Some(version);
            self.distrust_maybe_dropped(ty, current, history, sent_anew);
        } else if !ty.is_full_state_in_sotw() {
            // Nothing is taken as held, but a plan may still come to have
            // the reported version: that proves nothing about names whose
            // referrer Envoy may have built after it.
            let snaps: Vec<&Arc<Snapshot>> = current.into_iter().chain(history).collect();
            if !sent_anew.is_empty()
                || !super::referred_anew(ty, |n| self.sub.covers(n), &snaps, true).is_empty()
            {
                self.client_version = None;
            }
        } else {
            self.unresolved = true;
            if !names_stable(ty, current, history) {
                // The version names a response no snapshot explains, and
                // some name came and went since: a rejected response may
                // have removed it at the client, so a plan that happens to
                // have that version again is not proof the client holds it.
                self.client_version = None;
            }
        }
        if self.unresolved || !ty.is_full_state_in_sotw() {
            let maybe = maybe_held(&self.sub, &self.acked, ty, current, history);
            self.maybe = (!maybe.is_empty()).then(|| maybe.into());
        }
    }

    /// A SotW version is one per type and names the last response the
    /// client accepted, which is not always what it holds:
    /// - EDS/RDS/SDS: when Envoy drops a cluster (or listener) and gets it
    ///   back, it forgets the load assignment (route configuration) and asks
    ///   for it again *at the same version*; if the stream breaks before the
    ///   answer, the next stream's first request reports a version that names
    ///   it. A rebuilt cluster waits for its endpoints again the same way.
    /// - CDS/LDS: Envoy applies the removals of a response it rejects and
    ///   keeps reporting the version before it; if the removed resource comes
    ///   back, that version names it again.
    ///
    /// So a resumed name that may have been lost that way within the recent
    /// snapshots ([`maybe_dropped`]) is not taken as held: it is sent again
    /// (bytes only after such a change) and gating waits for it. Routing to
    /// a cluster the client lacks or that is cold would 503; a listener
    /// re-added without its routes would serve 404s after its initial fetch
    /// timeout.
    fn distrust_maybe_dropped(
        &mut self,
        ty: ResourceType,
        current: Option<&Arc<Snapshot>>,
        history: &[Arc<Snapshot>],
        sent_anew: Vec<Arc<str>>,
    ) {
        let mut stale = maybe_dropped(ty, &self.acked, current, history);
        if !sent_anew.is_empty() {
            stale.extend(sent_anew.into_iter().filter(|n| self.acked.contains_key(n)));
            stale.sort_unstable();
            stale.dedup();
        }
        if stale.is_empty() {
            return;
        }
        if ty.is_full_state_in_sotw() {
            // It may hold them still: what its routes use must not be
            // removed (the removal gate keeps what `maybe` holds and is in
            // use, as for a version nothing explains).
            let mut there = Seeker::new(&self.acked);
            let maybe: Vec<Arc<Resource>> =
                stale.iter().filter_map(|n| there.get(n).cloned()).collect();
            self.maybe = Some(maybe.into());
        }
        if let Some(kept) = without_names(&self.acked, &stale) {
            self.acked = Arc::new(kept);
        }
        self.must_answer = true;
        // Not a resume at the reported version any more: something is owed.
        self.client_version = None;
    }

    /// The client drops what it no longer subscribes to.
    fn drop_unsubscribed(&mut self) {
        if self.acked.keys().any(|n| !self.sub.covers(n)) {
            let sub = &self.sub;
            super::sorted::retain(Arc::make_mut(&mut self.acked), |n, _| sub.covers(n));
        }
    }

    /// A resuming client already holds exactly `plan` at `version`: nothing
    /// to send (failover to a replica with the same config costs nothing).
    fn resumed_at(&mut self, plan: &Arc<ResourceMap>, version: &Arc<str>) -> bool {
        if self.last_sent_version.is_some() || self.client_version.as_deref() != Some(&**version) {
            return false;
        }
        self.acked = plan.clone();
        self.acked_version = Some(version.clone());
        self.last_sent_version = Some(version.clone());
        self.must_answer = false;
        true
    }

    /// Whether a response of `plan` at `version` would tell the client
    /// nothing (or what it rejected); if so, the state notes what the client
    /// holds instead.
    fn nothing_to_tell(&mut self, ty: ResourceType, plan: &Plan, version: &Arc<str>) -> bool {
        let rejected = self.nack.as_ref().is_some_and(|n| n.version == *version);
        let changed = self.last_sent_version.as_ref() != Some(version);
        // For EDS/RDS/SDS, absence from a SotW response does not remove
        // anything at the client: when the client already holds everything
        // in the plan, a push would tell it nothing.
        let only_drops = !ty.is_full_state_in_sotw() && plan.all_held;
        if !(rejected || !(changed || self.must_answer) || (only_drops && !self.must_answer)) {
            return false;
        }
        if !rejected && (only_drops || self.acked_version.as_ref() == Some(version)) {
            // The client holds what we want it to have (e.g. the config
            // went back to the version it kept after a NACK): in sync.
            self.nack = None;
        }
        if self.acked_version.as_ref() == Some(version)
            && self.last_sent_version == self.acked_version
            && self.acked.len() == plan.resources.len()
            && !Arc::ptr_eq(&self.acked, &plan.resources)
        {
            // Same content (the version is its hash; an EDS/RDS client may
            // hold more than its last version names, hence the length):
            // hold on to the newest map, so the next publish is planned
            // from its change set (or not at all).
            self.acked = plan.resources.clone();
        }
        self.must_answer = false;
        true
    }

    /// Records a response of `plan` at `version` as sent and in flight, and
    /// returns what goes on the wire.
    fn send(
        &mut self,
        ty: ResourceType,
        nonce: Arc<str>,
        version: Arc<str>,
        plan: Arc<ResourceMap>,
        known_wire: Option<Arc<ResourceMap>>,
    ) -> Arc<ResourceMap> {
        self.must_answer = false;
        self.last_sent_version = Some(version.clone());
        self.last_nonce = Some(nonce.clone());
        // EDS/RDS/SDS: what the client holds at the planned version is not
        // repeated (absence removes nothing; Envoy and gRPC update only the
        // resources a response carries). The version still names the whole
        // plan, which is what the client holds once it ACKs.
        let wire = if ty.is_full_state_in_sotw() {
            plan.clone()
        } else if let Some(w) = known_wire {
            // Test builds: the wire a plan found on its way is what the
            // client lacks of it.
            #[cfg(test)]
            {
                let content = |m: &ResourceMap| -> Vec<(String, String)> {
                    m.iter()
                        .map(|(n, r)| (n.to_string(), r.version().to_string()))
                        .collect()
                };
                assert_eq!(
                    content(&w),
                    content(&not_held(&plan, &self.acked)),
                    "{ty}: known wire"
                );
            }
            w
        } else {
            not_held(&plan, &self.acked)
        };
        self.in_flight = Some(InFlight {
            nonce,
            version,
            resources: plan,
        });
        wire
    }
}

#[derive(Debug)]
struct InFlight {
    nonce: Arc<str>,
    version: Arc<str>,
    resources: Arc<ResourceMap>,
}

/// What [`SotwMachine::plan`] decided for one type.
struct Plan {
    resources: Arc<ResourceMap>,
    /// A subscribed resource the client lacks was held back.
    held_missing: bool,
    /// Every planned resource is one the client holds at that version.
    all_held: bool,
    /// Load assignments of clusters the client holds at another version:
    /// Envoy rebuilds such a cluster and waits for its endpoints again.
    refetch_eds: Vec<Arc<str>>,
    /// What to put on the wire for EDS/RDS/SDS when already known.
    wire: Option<Arc<ResourceMap>>,
}

struct PlanFlags {
    held_missing: bool,
    all_held: bool,
    refetch_eds: Vec<Arc<str>>,
}

impl PlanFlags {
    fn with(self, resources: Arc<ResourceMap>) -> Plan {
        Plan {
            resources,
            held_missing: self.held_missing,
            all_held: self.all_held,
            refetch_eds: self.refetch_eds,
            wire: None,
        }
    }
}

/// One walk of a type's candidates ([`SotwMachine::walk`]).
struct Walk<'a> {
    /// Each candidate at the version to plan, in name order.
    picks: Vec<(&'a Arc<str>, &'a Arc<Resource>)>,
    /// Acknowledged resources no candidate names (full-state types only):
    /// the plan drops them unless something still uses them.
    gone: Vec<(&'a Arc<str>, &'a Arc<Resource>)>,
    out: PlanFlags,
    /// Every pick is the snapshot's own resource (so far).
    is_whole: bool,
    /// EDS/RDS/SDS: the picks the client does not hold at that version,
    /// i.e. what goes on the wire ([`not_held`] of the plan, found by the
    /// same walk instead of a second one with a lookup per name).
    wire: Vec<(&'a Arc<str>, &'a Arc<Resource>)>,
}

fn same_version(a: &Arc<Resource>, b: &Arc<Resource>) -> bool {
    Arc::ptr_eq(a, b) || a.version() == b.version()
}

/// The State-of-the-World protocol for one stream (ADS or a per-type service).
#[derive(Debug)]
pub struct SotwMachine {
    core: StreamCore<SotwType>,
    /// On a resumed stream, names of EDS/RDS/SDS whose referrer (a cluster
    /// or listener) this stream sent anew before the type's first request:
    /// the version that request reports predates what Envoy built, so it
    /// proves nothing about them ([`SotwType::distrust_maybe_dropped`]).
    /// Boxed: most streams never need it.
    sent_referrers: Option<Box<PerType<Vec<Arc<str>>>>>,
    /// Plans made from the change set (tests check the fast path is taken).
    #[cfg(test)]
    pub(crate) fast_plans: usize,
    /// Requests whose names were not decoded (tests check ACKs take it).
    #[cfg(test)]
    pub(crate) names_skipped: usize,
}

impl SotwMachine {
    /// `only`: the one type a per-type service (CDS, EDS, ...) serves; `None` for ADS.
    pub fn new(only: Option<ResourceType>) -> Self {
        SotwMachine {
            core: StreamCore::new(only),
            sent_referrers: None,
            #[cfg(test)]
            fast_plans: 0,
            #[cfg(test)]
            names_skipped: 0,
        }
    }

    /// The snapshot to serve; `None` while the server is not ready for this
    /// stream's group (requests are then held, never answered).
    pub fn set_snapshot(&mut self, snapshot: Option<Arc<Snapshot>>) {
        self.core.snapshot = snapshot;
    }

    /// Whether taking `newest` can wait for the client's next request
    /// (see `StreamCore::newest_can_wait`).
    pub(crate) fn newest_can_wait(&self, newest: &Arc<Snapshot>) -> bool {
        self.core.newest_can_wait(newest)
    }

    /// Whether `req` may be the first of its type on a stream that resumes
    /// (it reports a version but acknowledges nothing): the driver then passes
    /// the group's recent snapshots to [`SotwMachine::handle_request_with_history`].
    pub fn resumes(req: &DiscoveryRequest) -> bool {
        !req.version_info.is_empty() && req.response_nonce.is_empty()
    }

    /// Stops holding removals for requests that have not come (see
    /// [`super::resume_holds_removals`]); for clients that never send them.
    pub fn release_resume_hold(&mut self) {
        self.core.resume_released = true;
    }

    /// Applies one client request: subscription, ACK, NACK or stale nonce.
    pub fn handle_request(&mut self, req: &DiscoveryRequest) -> RequestOutcome {
        self.handle_request_with_history(req, &[])
    }

    /// Handles a request; `history` (recently published snapshots) lets the
    /// first request of a type that reports a version start from what the
    /// client holds: the content of that version, wherever it was sent.
    pub fn handle_request_with_history(
        &mut self,
        req: &DiscoveryRequest,
        history: &[Arc<Snapshot>],
    ) -> RequestOutcome {
        self.handle(req, Names::List(&req.resource_names), history)
    }

    /// [`SotwMachine::handle_request_with_history`] for a request decoded
    /// from the wire: its names are decoded only when they differ from the
    /// list applied last for the type (an ACK repeats them; issue #13).
    pub(crate) fn handle_wire_request(
        &mut self,
        req: &SotwRequest,
        history: &[Arc<Snapshot>],
    ) -> RequestOutcome {
        self.handle(&req.req, Names::Wire(req), history)
    }

    /// One request, in the order its fields matter: its type, its answer to
    /// the latest response (ACK, NACK or stale), its names, then — on a
    /// first request that reports a version — what the client holds already.
    fn handle(
        &mut self,
        req: &DiscoveryRequest,
        names: Names<'_>,
        history: &[Arc<Snapshot>],
    ) -> RequestOutcome {
        let ty = match self.core.request_type(&req.type_url) {
            Ok(ty) => ty,
            Err(ignored) => return ignored,
        };
        let first = !self.core.requested(ty);
        let known = self.core.snapshot.as_ref().map(|s| s.resources(ty).clone());
        let st = self.core.types[ty].get_or_insert_with(Box::default);
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
                outcome = match &req.error_detail {
                    Some(err) => st.apply_nack(ty, f, &err.message),
                    None => st.apply_ack(ty, f),
                };
            }
        }
        let applied = st.apply_names(ty, names, first, known.as_ref());
        #[cfg(test)]
        if applied.is_none() {
            self.names_skipped += 1;
        }
        let change = applied.unwrap_or_default();
        st.owe_answer(ty, first, &change.added);
        if first && !req.version_info.is_empty() {
            self.core.resumed = true;
            let sent_anew = self
                .sent_referrers
                .as_mut()
                .map(|p| std::mem::take(&mut p[ty]))
                .unwrap_or_default();
            st.resume(
                ty,
                &req.version_info,
                self.core.snapshot.as_ref(),
                history,
                sent_anew,
            );
        } else if change.changed {
            st.drop_unsubscribed();
        }
        outcome
    }

    /// The next response to send, if any. Call until it returns `None`; at most
    /// one response per type is in flight (unacknowledged) at a time, which
    /// also coalesces bursts of snapshots into one push. The first response
    /// of a stream that owes the client nothing is a keepalive (module docs).
    pub fn next_response(&mut self) -> Option<SotwResponse> {
        let resp = self.next_planned().or_else(|| self.keepalive());
        self.core.answered(resp)
    }

    /// A one-shot fetch (REST, gRPC `Fetch*`): no stream, so no keepalive; a
    /// client that is current gets no response (REST: 304 Not Modified).
    pub(crate) fn for_fetch(ty: ResourceType) -> Self {
        let mut m = SotwMachine::new(Some(ty));
        m.core.answered = true;
        m
    }

    /// A type the client holds exactly what we would send it, with nothing
    /// in flight or owed: a no-op response for it is safe.
    fn settled(st: &SotwType) -> bool {
        st.in_flight.is_none()
            && !st.must_answer
            && !st.unresolved
            && st.acked_version.is_some()
            && st.last_sent_version == st.acked_version
    }

    /// The no-op first response of a stream that owes the client nothing
    /// (resumed at the current versions), so Envoy resets its reconnect
    /// backoff. Preferably an EDS/RDS/SDS response with no resources (nothing
    /// re-sent); a full-state type is repeated only when no such request is
    /// coming: a per-type CDS/LDS stream, or a client whose clusters and
    /// listeners name no endpoints, routes or secrets served on this stream.
    fn keepalive(&mut self) -> Option<SotwResponse> {
        if self.core.answered || self.core.snapshot.is_none() {
            return None;
        }
        let named = ResourceType::ALL.into_iter().find(|ty| {
            !ty.is_full_state_in_sotw()
                && self.core.types[*ty].as_deref().is_some_and(Self::settled)
        });
        let (ty, wire) = match named {
            Some(ty) => (ty, Arc::new(ResourceMap::new())),
            None => {
                if self.core.named_request_expected() {
                    return None;
                }
                // The smallest full-state type, repeated as the client holds it.
                let ty = ResourceType::ALL
                    .into_iter()
                    .filter(|ty| {
                        ty.is_full_state_in_sotw()
                            && self.core.types[*ty].as_deref().is_some_and(Self::settled)
                    })
                    .min_by_key(|ty| {
                        let st = self.core.types[*ty].as_ref().expect("settled");
                        st.acked.values().map(|r| r.any_len()).sum::<usize>()
                    })?;
                let acked = self.core.types[ty].as_ref().expect("settled").acked.clone();
                (ty, acked)
            }
        };
        let nonce = self.core.nonces.next();
        let st = self.core.types[ty].as_mut().expect("settled");
        let version = st.acked_version.clone().expect("settled");
        st.last_nonce = Some(nonce.clone());
        st.in_flight = Some(InFlight {
            nonce: nonce.clone(),
            version: version.clone(),
            resources: st.acked.clone(),
        });
        Some(SotwResponse {
            ty,
            version,
            nonce,
            resources: wire,
        })
    }

    /// The response of the first type, in make-before-break order, that has
    /// something to tell the client: planned, worth sending, then sent.
    fn next_planned(&mut self) -> Option<SotwResponse> {
        let snap = self.core.snapshot.clone()?;
        for ty in ResourceType::ALL {
            if !self.ready_to_plan(ty, &snap) {
                continue;
            }
            let plan = self.plan_now(ty, &snap);
            if plan.held_missing && !ty.is_full_state_in_sotw() {
                // A subscribed resource the client lacks is held back (its
                // clusters are not warm yet). Answering without it would tell
                // the client it does not exist — Envoy would warm a listener
                // with no routes. Wait until it can be sent.
                continue;
            }
            let version = plan_version(ty, &plan.resources, &snap);
            let st = self.core.types[ty].as_mut().expect("checked");
            if st.resumed_at(&plan.resources, &version) || st.nothing_to_tell(ty, &plan, &version) {
                continue;
            }
            let nonce = self.core.nonces.next();
            let wire = st.send(
                ty,
                nonce.clone(),
                version.clone(),
                plan.resources,
                plan.wire,
            );
            if !plan.refetch_eds.is_empty() {
                self.refetch_endpoints(plan.refetch_eds);
            }
            if self.core.resumed && ty.is_full_state_in_sotw() {
                self.note_sent_referrers(ty);
            }
            return Some(SotwResponse {
                ty,
                version,
                nonce,
                resources: wire,
            });
        }
        None
    }

    /// Whether `ty` is worth planning now: requested, nothing in flight, not
    /// waiting on the resume hold, and not already settled on this map.
    fn ready_to_plan(&mut self, ty: ResourceType, snap: &Snapshot) -> bool {
        let Some(st) = self.core.types[ty].as_mut() else {
            return false;
        };
        if st.in_flight.is_some() {
            return false;
        }
        // Shared subscription names move to the new map when its keys are
        // the same, so old maps are not kept alive.
        st.sub
            .follow(snap.resources(ty), snap.of(ty).key_set(), |m| {
                snap.same_keys_since(ty, m)
            });
        if st.unresolved && self.core.resume_holds_removals(ty) {
            // We do not know what the client holds and cannot yet see what
            // it uses: any full-state answer could remove something in use.
            return false;
        }
        let st = self.core.types[ty].as_mut().expect("requested");
        if st.settled_on(snap.resources(ty)) {
            // The client acknowledged exactly this map and nothing was sent
            // since: nothing to plan (O(1) on every ACK of a large type).
            st.nack = None;
            return false;
        }
        true
    }

    /// The plan for `ty`: from the change set when it can be (test builds
    /// check it against the full plan), else in full.
    fn plan_now(&mut self, ty: ResourceType, snap: &Snapshot) -> Plan {
        match self.plan_changed(ty, snap) {
            Some(p) => {
                #[cfg(test)]
                {
                    self.check_plan_changed(ty, snap, &p);
                    self.fast_plans += 1;
                }
                p
            }
            None => self.plan(ty, snap),
        }
    }

    /// Envoy rebuilds a modified cluster and waits for its endpoints again
    /// (same EDS names, so no new subscription): the client no longer counts
    /// as holding `names` (routes to the cluster wait, as for a new one), and
    /// they follow the CDS response even though they did not change.
    fn refetch_endpoints(&mut self, mut names: Vec<Arc<str>>) {
        let Some(eds) = self.core.types[ResourceType::ClusterLoadAssignment].as_mut() else {
            return;
        };
        names.sort_unstable();
        names.dedup();
        eds.must_answer = true;
        if let Some(kept) = without_names(&eds.acked, &names) {
            eds.acked = Arc::new(kept);
        }
        // An EDS response still in flight went out before this one: the
        // client applies it to the old cluster, so its ACK must not count
        // the rebuilt clusters' endpoints as held (else they are never
        // re-sent and Envoy waits its 15 s initial fetch timeout, holding
        // every later CDS update meanwhile).
        if let Some(f) = eds.in_flight.as_mut()
            && let Some(kept) = without_names(&f.resources, &names)
        {
            f.resources = Arc::new(kept);
        }
    }

    /// After a CDS or LDS response on a resumed stream: for each type its
    /// resources refer to that has not been requested yet, the names that
    /// the clusters or listeners it adds (or, for endpoints, changes) refer
    /// to. Walks the response only while such a type is missing (the first
    /// responses of a resumed stream).
    fn note_sent_referrers(&mut self, ty: ResourceType) {
        let waiting: Vec<ResourceType> = ResourceType::ALL
            .into_iter()
            .filter(|t| !self.core.requested(*t) && super::referrers(*t).contains(&ty))
            .collect();
        if waiting.is_empty() {
            return;
        }
        let st = self.core.types[ty].as_ref().expect("sent");
        let Some(sent) = st.in_flight.as_ref().map(|f| f.resources.clone()) else {
            return;
        };
        let acked = st.acked.clone();
        let notes = self.sent_referrers.get_or_insert_with(Box::default);
        let mut held = Seeker::new(&acked);
        for (name, res) in sent.iter() {
            let (added, changed) = match held.get(name) {
                None => (true, true),
                Some(old) => (false, !same_version(old, res)),
            };
            if !changed {
                continue;
            }
            for x in res.refs() {
                if waiting.contains(&x.ty) && (added || x.ty == ResourceType::ClusterLoadAssignment)
                {
                    notes[x.ty].push(x.name.clone());
                }
            }
        }
        for t in waiting {
            notes[t].sort_unstable();
            notes[t].dedup();
        }
    }

    /// [`SotwMachine::plan`] in O(changes): when the client holds exactly an
    /// earlier snapshot's whole map (same names) and nothing is pending, only
    /// the names changed since are looked at, and the plan is the snapshot's
    /// own map. `None` when anything needs the full plan (a change held back
    /// by its references, a removal, a NACK, a resume, a partial subscription).
    fn plan_changed(&self, ty: ResourceType, snap: &Snapshot) -> Option<Plan> {
        let st = self.core.types[ty].as_ref()?;
        let whole = snap.resources(ty);
        if st.in_flight.is_some()
            || st.unresolved
            || st.maybe.is_some()
            || st.must_answer
            || st.nack.is_some()
            || st.acked_version.is_none()
            || st.last_sent_version != st.acked_version
            || !(st.sub.is_wildcard() || st.sub.is_keys_of(whole))
            || !snap.same_keys_since(ty, &st.acked)
        {
            return None;
        }
        // Shared with the group's other streams that hold the same map.
        let changed = snap.changes_since(ty, &st.acked, false)?;
        if changed.len() > whole.len() / 8 {
            // Most of the map changed (a global push): one walk beats lookups.
            return None;
        }
        let mut out = PlanFlags {
            held_missing: false,
            all_held: true,
            refetch_eds: Vec::new(),
        };
        let mut wire = Vec::with_capacity(changed.len());
        // Each change carries the resource the client holds (`acked` is its
        // base) and the snapshot's: no lookup in either map.
        for c in changed.iter() {
            let (name, res, held) = (&c.name, c.new.as_ref()?, c.old.as_ref()?);
            if same_version(held, res) {
                continue;
            }
            if !hard_refs_ready(res, snap, &self.core) || self.removing_hard_ref(res) {
                return None;
            }
            out.all_held = false;
            if ty == ResourceType::Cluster {
                out.refetch_eds.extend(
                    res.refs()
                        .iter()
                        .filter(|x| x.ty == ResourceType::ClusterLoadAssignment)
                        .map(|x| x.name.clone()),
                );
            }
            wire.push((name.clone(), res.clone()));
        }
        let mut plan = out.with(whole.clone());
        // Sorted names: the map is built in bulk.
        plan.wire = Some(Arc::new(wire.into_iter().collect()));
        Some(plan)
    }

    /// Test builds: the incremental plan says what the full plan says.
    #[cfg(test)]
    fn check_plan_changed(&self, ty: ResourceType, snap: &Snapshot, fast: &Plan) {
        let full = self.plan(ty, snap);
        let st = self.core.types[ty].as_ref().expect("requested");
        let content = |m: &ResourceMap| -> Vec<(String, String)> {
            m.iter()
                .map(|(n, r)| (n.to_string(), r.version().to_string()))
                .collect()
        };
        assert_eq!(
            content(&fast.resources),
            content(&full.resources),
            "{ty}: plan"
        );
        assert_eq!(fast.held_missing, full.held_missing, "{ty}: held_missing");
        assert_eq!(fast.all_held, full.all_held, "{ty}: all_held");
        let mut a = fast.refetch_eds.clone();
        let mut b = full.refetch_eds.clone();
        a.sort();
        a.dedup();
        b.sort();
        b.dedup();
        assert_eq!(a, b, "{ty}: refetch");
        if !ty.is_full_state_in_sotw() {
            let slow_wire = not_held(&full.resources, &st.acked);
            assert_eq!(
                content(fast.wire.as_ref().expect("set")),
                content(&slow_wire),
                "{ty}: wire"
            );
        }
    }

    /// The resources to send for `ty` now, after the ordering holds.
    ///
    /// One ordered walk of the candidates beside the client's acknowledged
    /// map (no lookups), and no new map when the answer is the snapshot's own
    /// (the common case): this runs per stream per push, so it is what a
    /// global push costs.
    fn plan(&self, ty: ResourceType, snap: &Snapshot) -> Plan {
        let st = self.core.types[ty].as_ref().expect("requested");
        let whole = snap.resources(ty);
        let Walk {
            picks,
            gone,
            mut out,
            is_whole,
            wire,
        } = self.walk(ty, st, snap);
        // A full-state type resumed at a version nothing explains, or whose
        // version may not name everything it holds.
        let unresolved_maybe = st.maybe.as_ref().filter(|_| ty.is_full_state_in_sotw());
        if gone.is_empty() && unresolved_maybe.is_none() {
            let resources = if is_whole && picks.len() == whole.len() {
                whole.clone()
            } else {
                Arc::new(
                    picks
                        .into_iter()
                        .map(|(n, r)| (n.clone(), r.clone()))
                        .collect(),
                )
            };
            // The plan is exactly the picks: what the client lacks of it is
            // known from the walk (shared when that is all of it, as
            // `not_held` does).
            let wire = (!ty.is_full_state_in_sotw()).then(|| {
                if wire.len() == resources.len() {
                    resources.clone()
                } else {
                    Arc::new(
                        wire.into_iter()
                            .map(|(n, r)| (n.clone(), r.clone()))
                            .collect(),
                    )
                }
            });
            let mut plan = out.with(resources);
            plan.wire = wire;
            return plan;
        }
        let mut plan: ResourceMap = picks
            .into_iter()
            .map(|(n, r)| (n.clone(), r.clone()))
            .collect();
        if let Some(maybe) = unresolved_maybe {
            // Keep whatever the client's other resources use (all of it
            // while a resumed stream cannot see every referrer yet).
            let refd = referenced_by_client(&self.core);
            let hold = self.core.resume_holds_removals(ty);
            for old in maybe.iter() {
                let name = old.name_arc();
                if !plan.contains_key(name) && (hold || refd.contains(&(ty, name.clone()))) {
                    plan.insert(name.clone(), old.clone());
                    out.all_held = false;
                }
            }
        }
        self.keep_in_use(ty, &mut plan, gone);
        out.with(share_if_whole(plan, whole))
    }

    /// The subscribed resources of `ty` in the snapshot, each at the version
    /// the ordering allows (the new one, the one the client holds, or none
    /// yet), beside what the client acknowledged and no candidate names.
    fn walk<'a>(&self, ty: ResourceType, st: &'a SotwType, snap: &'a Snapshot) -> Walk<'a> {
        let whole = snap.resources(ty);
        let full = ty.is_full_state_in_sotw();
        let candidates: Box<dyn Iterator<Item = (&Arc<str>, &Arc<Resource>)> + '_> =
            if st.sub.is_wildcard() || st.sub.is_keys_of(whole) {
                Box::new(whole.iter())
            } else {
                Box::new(st.sub.iter().filter_map(|n| whole.get_key_value(&**n)))
            };
        let mut w = Walk {
            picks: Vec::with_capacity(whole.len()),
            gone: Vec::new(),
            out: PlanFlags {
                held_missing: false,
                all_held: true,
                refetch_eds: Vec::new(),
            },
            is_whole: true,
            wire: Vec::new(),
        };
        let mut acked = st.acked.iter().peekable();
        for (name, res) in candidates {
            let mut held = None;
            while let Some(&(k, v)) = acked.peek() {
                match cmp_names(k, name) {
                    std::cmp::Ordering::Less => {
                        if full && st.sub.covers(k) {
                            w.gone.push((k, v));
                        }
                        acked.next();
                    }
                    std::cmp::Ordering::Equal => {
                        held = Some(v);
                        acked.next();
                        break;
                    }
                    std::cmp::Ordering::Greater => break,
                }
            }
            let unchanged = held.is_some_and(|h| same_version(h, res));
            let pick = match held {
                Some(h) if unchanged => h,
                _ if hard_refs_ready(res, snap, &self.core) && !self.removing_hard_ref(res) => res,
                Some(old) => old,
                None => {
                    w.out.held_missing = true;
                    w.is_whole = false;
                    continue;
                }
            };
            w.is_whole &= Arc::ptr_eq(pick, res);
            match held {
                Some(h) if same_version(h, pick) => {}
                Some(_) => {
                    w.out.all_held = false;
                    if ty == ResourceType::Cluster {
                        w.out.refetch_eds.extend(
                            pick.refs()
                                .iter()
                                .filter(|x| x.ty == ResourceType::ClusterLoadAssignment)
                                .map(|x| x.name.clone()),
                        );
                    }
                }
                None => w.out.all_held = false,
            }
            if !full && !held.is_some_and(|h| same_version(h, pick)) {
                w.wire.push((name, pick));
            }
            w.picks.push((name, pick));
        }
        if full {
            w.gone.extend(acked.filter(|(k, _)| st.sub.covers(k)));
        }
        w
    }

    /// Break after unlink: of the acknowledged resources the plan drops
    /// (`gone`), those something the client holds still references stay —
    /// all of them while a resumed stream cannot see every referrer yet.
    fn keep_in_use(
        &self,
        ty: ResourceType,
        plan: &mut ResourceMap,
        gone: Vec<(&Arc<str>, &Arc<Resource>)>,
    ) {
        if gone.is_empty() {
            return;
        }
        if self.core.resume_holds_removals(ty) {
            for (name, old) in gone {
                plan.insert(name.clone(), old.clone());
            }
            return;
        }
        let refd = referenced_by_client(&self.core);
        for (name, old) in gone {
            if refd.contains(&(ty, name.clone())) {
                plan.insert(name.clone(), old.clone());
            }
        }
    }

    /// A cluster `res` routes to is left out of the CDS response in flight:
    /// the client is about to remove it (found by the hostile model).
    fn removing_hard_ref(&self, res: &Resource) -> bool {
        let Some(f) = self.core.types[ResourceType::Cluster]
            .as_ref()
            .and_then(|t| t.in_flight.as_ref())
        else {
            return false;
        };
        res.refs()
            .iter()
            .any(|r| r.hard && r.ty == ResourceType::Cluster && !f.resources.contains_key(&r.name))
    }

    /// Per-type state, for status pages and CSDS.
    pub fn status(&self) -> Vec<TypeStatus> {
        self.core.status()
    }
}

/// The version naming `plan`: the snapshot's own when the plan is its
/// whole map (no hashing), else the hash of the plan's names and versions.
fn plan_version(ty: ResourceType, plan: &Arc<ResourceMap>, snap: &Snapshot) -> Arc<str> {
    if Arc::ptr_eq(plan, snap.resources(ty)) {
        snap.version(ty).clone()
    } else {
        set_version(plan.iter().map(|(n, r)| (&**n, r.version()))).into()
    }
}

/// What a client that reports `version` for `ty` holds, if a recent snapshot
/// explains it: the subscribed resources of that snapshot whose version (as
/// responses compute it) is `version`.
fn held_at_version(
    ty: ResourceType,
    sub: &Subscription,
    version: &str,
    current: Option<&Arc<Snapshot>>,
    history: &[Arc<Snapshot>],
) -> Option<(Arc<str>, Arc<ResourceMap>)> {
    for snap in current.into_iter().chain(history) {
        let whole = snap.resources(ty);
        if sub.is_wildcard() || sub.names_are_keys_of(whole) {
            if &**snap.version(ty) == version {
                return Some((snap.version(ty).clone(), whole.clone()));
            }
            // What it would hold is `whole`, whose set version is the
            // snapshot's: not this one (no copy of the map to find that out).
            continue;
        }
        let held: ResourceMap = sub
            .iter()
            .filter_map(|n| whole.get_key_value(n))
            .map(|(n, r)| (n.clone(), r.clone()))
            .collect();
        if set_version(held.iter().map(|(n, r)| (&**n, r.version()))) == version {
            return Some((version.into(), Arc::new(held)));
        }
    }
    None
}

/// The names in `held` (what a client resuming holds of `ty`, by the
/// version it reports and the snapshots) that it may have lost since, sorted
/// ([`SotwType::distrust_maybe_dropped`]):
/// - EDS/RDS/SDS: names a referrer started to use between two consecutive
///   recent snapshots — a cluster (for EDS), a listener (for RDS) or either
///   (for SDS) that appeared, or, for EDS, whose subscription belongs to the
///   cluster object Envoy rebuilds, changed. Envoy shares a route
///   configuration's or secret's subscription across a listener's versions,
///   so a changed listener does not ask for them again.
/// - CDS/LDS: names that went away between two consecutive recent
///   snapshots: only a response planned after that could have removed them
///   (a name merely added within the history was never missing after the
///   client could hold it). The reported version may name a plan, not a
///   snapshot (a removal held back for routes still using it), so when it
///   was accepted is not known.
///
/// O(1) per pair of snapshots that share the map looked at (an endpoint
/// change, for CDS), else O(changes) from the change set the cache recorded
/// at the publish (one walk of the map without it).
fn maybe_dropped(
    ty: ResourceType,
    held: &Arc<ResourceMap>,
    current: Option<&Arc<Snapshot>>,
    history: &[Arc<Snapshot>],
) -> Vec<Arc<str>> {
    let mut out: Vec<Arc<str>> = Vec::new();
    let snaps: Vec<&Arc<Snapshot>> = current.into_iter().chain(history).collect();
    if ty.is_full_state_in_sotw() {
        for pair in snaps.windows(2) {
            let (newer, older) = (pair[0].resources(ty), pair[1].resources(ty));
            if Arc::ptr_eq(newer, older) {
                continue;
            }
            // Recorded when one replaced the other in the cache: O(1).
            match pair[0].changed_since(ty, older) {
                Some(names) => {
                    let (mut now, mut before) = (
                        Seeker::sparse(newer, names.len()),
                        Seeker::sparse(older, names.len()),
                    );
                    out.extend(
                        names
                            .iter()
                            .filter(|n| {
                                held.contains_key(*n)
                                    && before.contains_key(n)
                                    && !now.contains_key(n)
                            })
                            .cloned(),
                    )
                }
                None => {
                    let (mut now, mut before) = (Seeker::new(newer), Seeker::new(older));
                    out.extend(
                        held.keys()
                            .filter(|n| before.contains_key(n) && !now.contains_key(n))
                            .cloned(),
                    )
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        return out;
    }
    super::referred_anew(ty, |n| held.contains_key(n), &snaps, true)
}

/// Whether every recent snapshot has the same names of `ty` (O(1) per pair
/// that shares the map or whose recorded changes keep the keys).
fn names_stable(
    ty: ResourceType,
    current: Option<&Arc<Snapshot>>,
    history: &[Arc<Snapshot>],
) -> bool {
    let snaps: Vec<&Arc<Snapshot>> = current.into_iter().chain(history).collect();
    snaps.windows(2).all(|p| {
        let (a, b) = (p[0].resources(ty), p[1].resources(ty));
        Arc::ptr_eq(a, b)
            || p[0].same_keys_since(ty, b)
            || (a.len() == b.len() && a.keys().zip(b.keys()).all(|(x, y)| x == y))
    })
}

/// Every recent version (newest first) of each name `sub` covers that
/// `acked` lacks.
fn maybe_held(
    sub: &Subscription,
    acked: &ResourceMap,
    ty: ResourceType,
    current: Option<&Arc<Snapshot>>,
    history: &[Arc<Snapshot>],
) -> Vec<Arc<Resource>> {
    let mut out: Vec<Arc<Resource>> = Vec::new();
    if !sub.is_wildcard() && {
        let mut held = Seeker::new(acked);
        sub.iter().all(|n| held.contains_key(n))
    } {
        // Every subscribed name is held (a client resumed at a version we
        // know, W5): one walk instead of a lookup per name and snapshot.
        return out;
    }
    let mut seen = std::collections::HashSet::new();
    for snap in current.into_iter().chain(history) {
        let map = snap.resources(ty);
        if std::ptr::eq(&**map, acked) {
            // Nothing in it is missing from `acked`.
            continue;
        }
        let mut take = |r: &Arc<Resource>| {
            if !acked.contains_key(r.name())
                && seen.insert((r.name_arc().clone(), r.version_arc().clone()))
            {
                out.push(r.clone());
            }
        };
        if sub.is_wildcard() {
            map.values().for_each(&mut take);
        }
        for n in sub.iter() {
            if let Some(r) = map.get(n) {
                take(r);
            }
        }
    }
    out
}

/// The resources of `plan` the client does not hold at that version (all of
/// them, shared, when it holds none of them).
fn not_held(plan: &Arc<ResourceMap>, acked: &ResourceMap) -> Arc<ResourceMap> {
    if acked.is_empty() {
        return plan.clone();
    }
    let mut held = Seeker::new(acked);
    let out: ResourceMap = plan
        .iter()
        .filter(|(n, r)| !held.get(n).is_some_and(|h| same_version(h, r)))
        .map(|(n, r)| (n.clone(), r.clone()))
        .collect();
    if out.len() == plan.len() {
        plan.clone()
    } else {
        Arc::new(out)
    }
}

impl TypeState for SotwType {
    fn sub(&self) -> &Subscription {
        &self.sub
    }

    fn acked(&self) -> &Arc<ResourceMap> {
        &self.acked
    }

    fn for_each_held(&self, f: &mut dyn FnMut(&Resource)) {
        self.acked.values().for_each(|r| f(r));
        if let Some(maybe) = &self.maybe {
            maybe
                .iter()
                .filter(|r| self.sub.covers(r.name()) && !self.acked.contains_key(r.name()))
                .for_each(|r| f(r));
        }
        if let Some(fl) = &self.in_flight {
            fl.resources.values().for_each(|r| f(r));
        }
    }

    fn progress(&self) -> Progress<'_> {
        Progress {
            sent_version: self.last_sent_version.as_ref(),
            last_nonce: self.last_nonce.as_ref(),
            acked_version: self.acked_version.as_ref(),
            nack: self.nack.as_ref(),
            in_flight: self.in_flight.is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(n: usize, changed: u16, prev: Option<&Arc<Snapshot>>) -> Arc<Snapshot> {
        crate::protocol::tests::eds_snapshot(n, changed, prev, |i| format!("c{i:04}"))
    }

    fn ack(m: &mut SotwMachine, r: &SotwResponse, names: &[String]) {
        m.handle_request(&DiscoveryRequest {
            type_url: r.ty.type_url().into(),
            version_info: r.version.to_string(),
            response_nonce: r.nonce.to_string(),
            resource_names: names.to_vec(),
            ..Default::default()
        });
    }

    /// As for Delta: a publish changing only the type in flight can wait for
    /// the ACK (taking it now sends nothing), then goes out at the newest
    /// version; a change of an idle type cannot wait.
    #[test]
    fn a_change_of_only_in_flight_types_can_wait_for_the_ack() {
        let (cds, eds) = (ResourceType::Cluster, ResourceType::ClusterLoadAssignment);
        let s1 = snapshot(10, 1, None);
        let mut m = SotwMachine::new(None);
        m.set_snapshot(Some(s1.clone()));
        let names: Vec<String> = (0..10).map(|i| format!("c{i:04}")).collect();
        for (ty, subscribe) in [(cds, vec![]), (eds, names.clone())] {
            m.handle_request(&DiscoveryRequest {
                type_url: ty.type_url().into(),
                resource_names: subscribe,
                ..Default::default()
            });
        }
        while let Some(r) = m.next_response() {
            let n = if r.ty == eds { names.clone() } else { vec![] };
            ack(&mut m, &r, &n);
        }
        let s2 = snapshot(10, 2, Some(&s1));
        assert!(!m.newest_can_wait(&s2), "EDS is idle: push now");
        m.set_snapshot(Some(s2.clone()));
        let r2 = m.next_response().expect("the change");
        assert_eq!(r2.ty, eds);
        let s3 = snapshot(10, 3, Some(&s2));
        assert!(
            m.newest_can_wait(&s3),
            "only EDS changed, and it is in flight"
        );
        assert!(
            !m.newest_can_wait(&snapshot(11, 3, Some(&s3))),
            "CDS changed and is idle"
        );
        m.set_snapshot(Some(s3.clone()));
        assert!(m.next_response().is_none());
        ack(&mut m, &r2, &names);
        let r3 = m.next_response().expect("the deferred change");
        assert_eq!(r3.ty, eds);
        assert_eq!(r3.version, *s3.version(eds));
        ack(&mut m, &r3, &names);
        assert!(m.next_response().is_none());
    }

    /// One changed load assignment among 1,000, two publishes later: the plan
    /// comes from the change chain (not a walk of 1,000 names), only that
    /// assignment goes on the wire, and the version names the whole map.
    #[test]
    fn a_change_is_planned_from_the_change_chain() {
        let s1 = snapshot(1000, 1, None);
        let mut m = SotwMachine::new(None);
        m.set_snapshot(Some(s1.clone()));
        let names: Vec<String> = (0..1000).map(|i| format!("c{i:04}")).collect();
        let eds = ResourceType::ClusterLoadAssignment;
        for (ty, subscribe) in [(ResourceType::Cluster, vec![]), (eds, names.clone())] {
            m.handle_request(&DiscoveryRequest {
                type_url: ty.type_url().into(),
                resource_names: subscribe,
                ..Default::default()
            });
        }
        while let Some(r) = m.next_response() {
            let n = if r.ty == eds { names.clone() } else { vec![] };
            ack(&mut m, &r, &n);
        }
        let st = m.core.types[eds].as_ref().unwrap();
        assert!(Arc::ptr_eq(&st.acked, s1.resources(eds)));
        let s2 = snapshot(1000, 2, Some(&s1));
        let s3 = snapshot(1000, 3, Some(&s2));
        let keep = [s1.clone(), s2.clone()]; // the cache's history would
        m.set_snapshot(Some(s3.clone()));
        let before = m.fast_plans;
        let r = m.next_response().expect("the change");
        assert_eq!(r.ty, eds);
        assert_eq!(
            r.resources.keys().map(|k| &**k).collect::<Vec<_>>(),
            ["c0001"]
        );
        assert_eq!(&r.version, s3.version(eds));
        assert!(m.fast_plans > before, "planned from the change chain");
        ack(&mut m, &r, &names);
        assert!(m.next_response().is_none());
        let st = m.core.types[eds].as_ref().unwrap();
        assert!(Arc::ptr_eq(&st.acked, s3.resources(eds)));
        drop(keep);
    }
    /// A stream further behind than the recorded changes reach (more than
    /// `MAX_CHAIN` publishes) is planned in full once, and
    /// the next publish is planned from the change chain again: its
    /// subscription moves to the new map's keys although the chain cannot
    /// say they are the same (issue #13, W2 SotW at 1,000 proxies).
    #[test]
    fn a_stream_behind_the_history_gets_back_to_the_change_chain() {
        let s1 = snapshot(1000, 1, None);
        let mut m = SotwMachine::new(None);
        m.set_snapshot(Some(s1.clone()));
        let names: Vec<String> = (0..1000).map(|i| format!("c{i:04}")).collect();
        let eds = ResourceType::ClusterLoadAssignment;
        for (ty, subscribe) in [(ResourceType::Cluster, vec![]), (eds, names.clone())] {
            m.handle_request(&DiscoveryRequest {
                type_url: ty.type_url().into(),
                resource_names: subscribe,
                ..Default::default()
            });
        }
        while let Some(r) = m.next_response() {
            let n = if r.ty == eds { names.clone() } else { vec![] };
            ack(&mut m, &r, &n);
        }
        // More publishes than the recorded changes reach: the chain back to
        // s1 is cut.
        let mut last = s1.clone();
        for port in 2..crate::snapshot::MAX_CHAIN as u16 + 3 {
            last = snapshot(1000, port, Some(&last));
        }
        assert!(!last.same_keys_since(eds, s1.resources(eds)));
        m.set_snapshot(Some(last.clone()));
        let r = m.next_response().expect("the change");
        assert_eq!(r.ty, eds);
        assert_eq!(
            r.resources.keys().map(|k| &**k).collect::<Vec<_>>(),
            ["c0001"]
        );
        ack(&mut m, &r, &names);
        assert!(m.next_response().is_none());
        let next = snapshot(1000, 99, Some(&last));
        m.set_snapshot(Some(next.clone()));
        let before = m.fast_plans;
        let r = m.next_response().expect("the next change");
        assert_eq!(&r.version, next.version(eds));
        assert!(m.fast_plans > before, "planned from the change chain again");
    }

    /// Issue 8 §1: a stream resumed at the current versions sends exactly one
    /// response — EDS, empty, at the version the client holds — once the
    /// snapshot is known and the EDS request its clusters announce has come.
    #[test]
    fn a_resumed_stream_sends_one_empty_eds_response() {
        let s1 = snapshot(3, 1, None);
        let (cds, eds) = (ResourceType::Cluster, ResourceType::ClusterLoadAssignment);
        let names: Vec<String> = (0..3).map(|i| format!("c{i:04}")).collect();
        let mut m = SotwMachine::new(None);
        m.handle_request(&DiscoveryRequest {
            type_url: cds.type_url().into(),
            version_info: s1.version(cds).to_string(),
            ..Default::default()
        });
        assert!(m.next_response().is_none(), "not ready: nothing");
        m.set_snapshot(Some(s1.clone()));
        assert!(m.next_response().is_none(), "waits for the EDS request");
        m.handle_request(&DiscoveryRequest {
            type_url: eds.type_url().into(),
            version_info: s1.version(eds).to_string(),
            resource_names: names.clone(),
            ..Default::default()
        });
        let r = m.next_response().expect("one response");
        assert_eq!(r.ty, eds);
        assert!(r.resources.is_empty());
        assert_eq!(&r.version, s1.version(eds));
        assert!(m.next_response().is_none(), "only one");
        ack(&mut m, &r, &names);
        assert!(m.next_response().is_none());
        let st = m.core.types[eds].as_ref().unwrap();
        assert_eq!(st.acked.len(), 3, "the client still holds everything");
        // Changes are pushed as before.
        let s2 = snapshot(3, 2, Some(&s1));
        m.set_snapshot(Some(s2));
        let r2 = m.next_response().expect("the change");
        assert_eq!(
            r2.resources.keys().map(|k| &**k).collect::<Vec<_>>(),
            ["c0001"]
        );
    }

    /// A resumed client's EDS version is trusted for every load assignment
    /// whose cluster stayed as it was across the recent snapshots (an
    /// endpoint change while it was away costs just that change: W5), and
    /// not for one whose cluster changed: Envoy rebuilt that cluster and
    /// waits for its endpoints, which the old stream may not have re-sent.
    #[test]
    fn a_resume_re_sends_only_endpoints_of_recently_rebuilt_clusters() {
        use crate::protocol::tests::cluster_snapshot;
        let (cds, eds) = (ResourceType::Cluster, ResourceType::ClusterLoadAssignment);
        let names: Vec<String> = ["c0000", "c0001"].map(String::from).to_vec();
        let resume = |current: &Arc<Snapshot>, history: &[Arc<Snapshot>], at: &Arc<Snapshot>| {
            let mut m = SotwMachine::new(None);
            m.set_snapshot(Some(current.clone()));
            for (ty, names, version) in [
                (cds, vec![], current.version(cds)),
                (eds, names.clone(), at.version(eds)),
            ] {
                m.handle_request_with_history(
                    &DiscoveryRequest {
                        type_url: ty.type_url().into(),
                        version_info: version.to_string(),
                        resource_names: names,
                        ..Default::default()
                    },
                    history,
                );
            }
            let r = m.next_response().expect("a response (or the keepalive)");
            assert_eq!(r.ty, eds);
            r.resources
                .keys()
                .map(|k| k.to_string())
                .collect::<Vec<_>>()
        };
        let s1 = cluster_snapshot(1, 80, None);
        let s2 = cluster_snapshot(1, 81, Some(&s1));
        // Away during an endpoint change: only the changed assignment.
        assert_eq!(resume(&s2, &[s2.clone(), s1.clone()], &s1), ["c0001"]);
        // c0001 rebuilt (its timeout changed): its assignment, unchanged and
        // named by the client's version, goes again; c0000's does not.
        let s3 = cluster_snapshot(2, 81, Some(&s2));
        let history = [s3.clone(), s2.clone(), s1.clone()];
        assert_eq!(s3.version(eds), s2.version(eds));
        assert_eq!(resume(&s3, &history, &s2), ["c0001"]);
        // Out of the history, nothing tells: the version is trusted (the
        // one response is the no-op keepalive).
        assert!(resume(&s3, std::slice::from_ref(&s3), &s3).is_empty());
    }

    /// Issue #13: an ACK that repeats the names list is applied without
    /// decoding it; a stale request with other names is not applied, so the
    /// next request with those names is decoded and changes the subscription.
    #[test]
    fn an_ack_repeating_the_names_is_not_decoded() {
        use crate::protocol::sotw_request::SotwRequest;
        let hasher = std::hash::RandomState::new();
        let s1 = snapshot(3, 1, None);
        let eds = ResourceType::ClusterLoadAssignment;
        let mut m = SotwMachine::new(Some(eds));
        m.set_snapshot(Some(s1.clone()));
        let send = |m: &mut SotwMachine, names: &[&str], nonce: &str| {
            let req = DiscoveryRequest {
                type_url: eds.type_url().into(),
                resource_names: names.iter().map(|n| n.to_string()).collect(),
                response_nonce: nonce.into(),
                ..Default::default()
            };
            m.handle_wire_request(&SotwRequest::from_request(req, &hasher), &[])
        };
        send(&mut m, &["c0000", "c0001"], "");
        let r = m.next_response().expect("first answer");
        assert_eq!(r.resources.len(), 2);
        assert_eq!(m.names_skipped, 0);
        let outcome = send(&mut m, &["c0000", "c0001"], &r.nonce);
        assert!(matches!(outcome, RequestOutcome::Ack { .. }), "{outcome:?}");
        assert_eq!(m.names_skipped, 1, "the ACK's names were not decoded");
        assert!(m.next_response().is_none());
        // A stale nonce with a new name is ignored ...
        let stale = send(&mut m, &["c0000", "c0001", "c0002"], "stale");
        assert!(matches!(stale, RequestOutcome::StaleNonce { .. }));
        // ... so the same list on a current nonce is decoded and subscribes.
        send(&mut m, &["c0000", "c0001", "c0002"], &r.nonce);
        assert_eq!(m.names_skipped, 1);
        let r2 = m.next_response().expect("the new name");
        assert!(r2.resources.contains_key("c0002"));
        // Dropping a name is decoded too: the next ACK has two names.
        send(&mut m, &["c0000"], &r2.nonce);
        assert_eq!(m.names_skipped, 1);
        let st = m.core.types[eds].as_ref().unwrap();
        assert_eq!(st.sub.len(), 1);
    }

    /// etcd-lane churn (6–7 s stalls, Envoy: "initial fetch timed out for
    /// ClusterLoadAssignment"): an EDS response is in flight when a CDS
    /// response modifies one of its clusters. Envoy applies the EDS response to
    /// the old cluster, then rebuilds the cluster and waits for its endpoints
    /// again; the late ACK of the earlier EDS response must not count as the
    /// client holding them, or they are never re-sent and the warming cluster
    /// (and with it every later CDS update) waits for Envoy's 15 s timeout.
    #[test]
    fn an_eds_ack_older_than_a_cluster_change_does_not_cover_the_refetch() {
        let (cds, eds) = (ResourceType::Cluster, ResourceType::ClusterLoadAssignment);
        let names: Vec<String> = vec!["c0000".into(), "c0001".into()];
        let s1 = crate::protocol::tests::cluster_snapshot(1, 80, None);
        let mut m = SotwMachine::new(None);
        m.set_snapshot(Some(s1.clone()));
        for (ty, subscribe) in [(cds, vec![]), (eds, names.clone())] {
            m.handle_request(&DiscoveryRequest {
                type_url: ty.type_url().into(),
                resource_names: subscribe,
                ..Default::default()
            });
        }
        while let Some(r) = m.next_response() {
            let n = if r.ty == eds { names.clone() } else { vec![] };
            ack(&mut m, &r, &n);
        }
        // An endpoint change: EDS response in flight, not yet ACKed.
        let s2 = crate::protocol::tests::cluster_snapshot(1, 81, Some(&s1));
        m.set_snapshot(Some(s2.clone()));
        let r_eds = m.next_response().expect("the endpoint change");
        assert_eq!(r_eds.ty, eds);
        assert!(m.next_response().is_none());
        // Then the cluster itself changes: CDS goes out while that EDS is in flight.
        let s3 = crate::protocol::tests::cluster_snapshot(2, 81, Some(&s2));
        m.set_snapshot(Some(s3.clone()));
        let r_cds = m.next_response().expect("the cluster change");
        assert_eq!(r_cds.ty, cds);
        // The ACKs arrive: first the EDS response's (sent before the CDS), then the CDS's.
        ack(&mut m, &r_eds, &names);
        ack(&mut m, &r_cds, &[]);
        let r = m
            .next_response()
            .expect("the rebuilt cluster's endpoints follow the CDS response");
        assert_eq!(r.ty, eds);
        assert_eq!(
            r.resources.keys().map(|k| &**k).collect::<Vec<_>>(),
            ["c0001"]
        );
    }
}
