//! Property tests of the protocol machines against a simulated Envoy: for any
//! sequence of snapshots and NACKs, (1) the client never holds a route to a
//! cluster it lacks or that is not warm (make-before-break), and (2) once
//! quiet, what the client holds equals the snapshot restricted to what it
//! subscribes to (minus versions it rejected) — i.e. the incremental state
//! equals a recomputation from scratch.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use proptest::prelude::*;

use super::delta::DeltaMachine;
use super::sotw::SotwMachine;
use crate::resource::{Resource, ResourceType};
use crate::simple;
use crate::snapshot::Snapshot;

const POOL: [&str; 5] = ["c0", "c1", "c2", "c3", "c4"];

#[derive(Clone, Debug)]
struct Spec {
    clusters: Vec<(usize, u16)>,
    route_to: Vec<usize>,
    second_listener: bool,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        proptest::collection::btree_map(0usize..5, 1u16..4, 1..5),
        proptest::collection::vec(any::<prop::sample::Index>(), 1..3),
        any::<bool>(),
    )
        .prop_map(|(clusters, picks, second_listener)| {
            let clusters: Vec<(usize, u16)> = clusters.into_iter().collect();
            let mut route_to: Vec<usize> = picks
                .iter()
                .map(|i| clusters[i.index(clusters.len())].0)
                .collect();
            route_to.sort();
            route_to.dedup();
            Spec {
                clusters,
                route_to,
                second_listener,
            }
        })
}

fn build(spec: &Spec) -> Arc<Snapshot> {
    let mut b = Snapshot::builder();
    for (c, port) in &spec.clusters {
        b.message(&simple::eds_cluster(POOL[*c], Duration::from_secs(1)))
            .unwrap();
        b.message(&simple::load_assignment(POOL[*c], &[("127.0.0.1", *port)]))
            .unwrap();
    }
    let targets: Vec<(&str, u32)> = spec.route_to.iter().map(|c| (POOL[*c], 1)).collect();
    b.message(&simple::http_listener("l1", "127.0.0.1", 1, "r1"))
        .unwrap();
    b.message(&simple::route_config("r1", &[("*", &targets)]))
        .unwrap();
    if spec.second_listener {
        b.message(&simple::http_listener("l2", "127.0.0.1", 2, "r2"))
            .unwrap();
        b.message(&simple::route_config("r2", &[("*", &targets[..1])]))
            .unwrap();
    }
    Arc::new(b.build().unwrap())
}

/// The next snapshot, built like the cache's users do: sharing unchanged
/// resources with the previous one, with its change set recorded. Odd ports
/// skip both, so the machines also meet snapshots without a change set.
fn publish(prev: &Arc<Snapshot>, spec: &Spec) -> Arc<Snapshot> {
    let fresh = build(spec);
    if spec.clusters.first().is_some_and(|c| c.1 % 2 == 1) {
        return fresh;
    }
    let mut b = Snapshot::builder().reuse_from(prev.clone());
    for ty in ResourceType::ALL {
        for r in fresh.resources(ty).values() {
            b.add(r.clone());
        }
    }
    let s = Arc::new(b.build().unwrap());
    s.record_changes_from(prev);
    s
}

#[derive(Clone, Debug)]
enum Op {
    Publish(Spec),
    /// Reject the next response of this type.
    NackNext(usize),
    /// Let the client and server exchange up to n messages.
    Step(u8),
    /// The stream breaks and the client opens a new one (to this server or a
    /// replica with the same history): a new machine, the client keeps what
    /// it holds and reports it. The seed picks the order of its first
    /// requests and how many messages are exchanged between them.
    Reconnect(u64),
}

static DEBUG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Traces the exchange (`SIM_DEBUG=1`).
fn debug() -> bool {
    DEBUG.load(std::sync::atomic::Ordering::Relaxed) || std::env::var("SIM_DEBUG").is_ok()
}

/// Snapshots kept for resolving what a reconnecting client holds (like the cache).
const HISTORY: usize = 16;

fn remember(history: &mut Vec<Arc<Snapshot>>, snap: &Arc<Snapshot>) {
    history.insert(0, snap.clone());
    history.truncate(HISTORY);
}

/// The order of a reconnecting client's first requests (CDS first, like
/// Envoy), and how many
/// messages to exchange after each, from a seed.
fn reconnect_plan(seed: u64) -> Vec<(ResourceType, u8)> {
    let mut types = vec![
        ResourceType::Cluster,
        ResourceType::ClusterLoadAssignment,
        ResourceType::Listener,
        ResourceType::RouteConfiguration,
    ];
    let mut s = seed | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    // Envoy re-sends its subscriptions in the order it made them: CDS comes
    // first (a client that asks for routes before clusters is not gated on
    // clusters it may take from elsewhere, resumed or not); the rest may come
    // in any order.
    for i in (2..types.len()).rev() {
        let j = 1 + (next() % i as u64) as usize;
        types.swap(i, j);
    }
    types.into_iter().map(|t| (t, (next() % 3) as u8)).collect()
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => spec().prop_map(Op::Publish),
        1 => (0usize..5).prop_map(Op::NackNext),
        3 => (1u8..6).prop_map(Op::Step),
        1 => any::<u64>().prop_map(Op::Reconnect),
    ]
}

type View = BTreeMap<String, Arc<Resource>>;

/// What a simulated Envoy holds and wants.
#[derive(Default)]
struct Client {
    views: [View; crate::resource::TYPE_COUNT],
    nack_next: [bool; crate::resource::TYPE_COUNT],
    rejected: BTreeSet<(ResourceType, String, String)>,
    /// Highest named subscriptions sent, per type (EDS, RDS follow references).
    subs: [BTreeSet<String>; crate::resource::TYPE_COUNT],
    /// After a reconnect, types not requested again yet on the new stream
    /// (their first request reports what the client holds).
    not_resumed: [bool; crate::resource::TYPE_COUNT],
    /// Reconnected, then rejected a response. A server that could not tell
    /// what the client held (a SotW version no recent snapshot explains) may
    /// wait for the next change after such a NACK: convergence is not asserted.
    nacked_after_reconnect: bool,
    reconnected: bool,
}

impl Client {
    fn wanted(&self, ty: ResourceType) -> BTreeSet<String> {
        let from = match ty {
            ResourceType::ClusterLoadAssignment => ResourceType::Cluster,
            ResourceType::RouteConfiguration => ResourceType::Listener,
            _ => return BTreeSet::new(),
        };
        self.views[from.index()]
            .values()
            .flat_map(|r| {
                r.refs()
                    .iter()
                    .filter(|x| x.ty == ty)
                    .map(|x| x.name.to_string())
            })
            .collect()
    }

    /// No route refers to a cluster the client lacks, or whose endpoints it lacks.
    fn check_make_before_break(&self) -> Result<(), String> {
        for ty in [ResourceType::RouteConfiguration, ResourceType::Listener] {
            for r in self.views[ty.index()].values() {
                for x in r.refs().iter().filter(|x| x.hard) {
                    let Some(c) = self.views[ResourceType::Cluster.index()].get(&*x.name) else {
                        return Err(format!("{} routes to missing cluster {}", r.name(), x.name));
                    };
                    for e in c
                        .refs()
                        .iter()
                        .filter(|e| e.ty == ResourceType::ClusterLoadAssignment)
                    {
                        if !self.views[e.ty.index()].contains_key(&*e.name) {
                            return Err(format!("{} routes to cold cluster {}", r.name(), x.name));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Expected view: the snapshot for what is subscribed, except rejected versions.
    fn check_converged(&self, snap: &Snapshot) -> Result<(), String> {
        for ty in ResourceType::ALL {
            if ty == ResourceType::Secret {
                continue;
            }
            let wanted = match ty {
                ResourceType::Cluster | ResourceType::Listener => None,
                _ => Some(self.wanted(ty)),
            };
            for (name, res) in snap.resources(ty).iter() {
                if wanted.as_ref().is_some_and(|w| !w.contains(&**name)) {
                    continue;
                }
                let key = (ty, name.to_string(), res.version().to_string());
                let have = self.views[ty.index()].get(&**name);
                if have.is_none_or(|h| h.version() != res.version())
                    && !self.rejected.contains(&key)
                {
                    return Err(format!("{ty} {name} not converged"));
                }
            }
        }
        Ok(())
    }
}

/// A rejected update can leave old config at the client, so convergence is
/// only asserted when nothing was rejected in the run.
fn any_rejected(c: &Client) -> bool {
    !c.rejected.is_empty() || c.nacked_after_reconnect
}

/// Hands `req` to the machine as the gRPC stream does: names undecoded, so
/// the SotW models also check that skipping an unchanged list (issue #13)
/// never changes what is answered.
fn wire(m: &mut SotwMachine, req: &DiscoveryRequest, history: &[Arc<Snapshot>]) {
    let hasher = std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default();
    let req = crate::protocol::sotw_request::SotwRequest::from_request(req.clone(), &hasher);
    m.handle_wire_request(&req, history);
}

/// Hands `req` to the machine as the gRPC stream does: encoded, then decoded
/// with `initial_resource_versions` kept as the received bytes (issue #13),
/// so the Delta models check that path (and a resume's clean start) too.
fn wire_delta(m: &mut DeltaMachine, req: &DeltaDiscoveryRequest, history: &[Arc<Snapshot>]) {
    let req = crate::protocol::delta_request::DeltaRequest::through_wire(req);
    m.handle_wire_request(&req, history);
}

fn run_sotw(ops: &[Op]) -> Result<(), String> {
    let mut m = SotwMachine::new(None);
    let mut c = Client::default();
    let mut snap = build(
        &ops.iter()
            .find_map(|o| match o {
                Op::Publish(s) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or(Spec {
                clusters: vec![(0, 1)],
                route_to: vec![0],
                second_listener: false,
            }),
    );
    m.set_snapshot(Some(snap.clone()));
    let mut history = vec![snap.clone()];
    let mut last: [Option<(String, String)>; crate::resource::TYPE_COUNT] = Default::default();
    let req = |ty: ResourceType, names: Vec<String>, last: &Option<(String, String)>, err: bool| {
        DiscoveryRequest {
            type_url: ty.type_url().into(),
            resource_names: names,
            version_info: last.as_ref().map(|l| l.0.clone()).unwrap_or_default(),
            response_nonce: last.as_ref().map(|l| l.1.clone()).unwrap_or_default(),
            error_detail: err.then(|| RpcStatus {
                code: 3,
                message: "no".into(),
                details: vec![],
            }),
            ..Default::default()
        }
    };
    wire(
        &mut m,
        &req(ResourceType::Cluster, vec![], &None, false),
        &[],
    );
    wire(
        &mut m,
        &req(ResourceType::Listener, vec![], &None, false),
        &[],
    );
    let step = |m: &mut SotwMachine,
                c: &mut Client,
                last: &mut [Option<(String, String)>; crate::resource::TYPE_COUNT],
                history: &[Arc<Snapshot>]|
     -> Result<bool, String> {
        let Some(resp) = m.next_response() else {
            // Follow references like Envoy does.
            for ty in [
                ResourceType::ClusterLoadAssignment,
                ResourceType::RouteConfiguration,
            ] {
                let w = c.wanted(ty);
                if w != c.subs[ty.index()] && !c.not_resumed[ty.index()] {
                    if debug() {
                        eprintln!("subscribe {ty} {w:?}");
                    }
                    // Like Envoy, drop what nothing uses any more.
                    c.views[ty.index()].retain(|n, _| w.contains(n));
                    c.subs[ty.index()] = w.clone();
                    // A first request on a resumed stream reports a
                    // version and no nonce: the driver hands such a request
                    // the group's history, as at the stream's start.
                    let r = req(ty, w.into_iter().collect(), &last[ty.index()], false);
                    let resumes = !r.version_info.is_empty() && r.response_nonce.is_empty();
                    wire(m, &r, if resumes { history } else { &[] });
                    return Ok(true);
                }
            }
            return Ok(false);
        };
        let ty = resp.ty;
        let i = ty.index();
        if debug() {
            eprintln!("{ty}: {:?}", resp.resources.keys().collect::<Vec<_>>());
        }
        let reject = std::mem::take(&mut c.nack_next[i]);
        c.nacked_after_reconnect |= reject && c.reconnected;
        let names: Vec<String> = c.subs[i].iter().cloned().collect();
        if reject {
            for r in resp.resources.values() {
                if c.views[i]
                    .get(r.name())
                    .is_none_or(|h| h.version() != r.version())
                {
                    c.rejected
                        .insert((ty, r.name().to_string(), r.version().to_string()));
                }
            }
            if ty.is_full_state_in_sotw() {
                // Envoy's CDS and LDS apply a rejected response's removals
                // (what the server also assumes).
                c.views[i].retain(|n, _| resp.resources.contains_key(n.as_str()));
                c.check_make_before_break()?;
            }
            let prev = last[i].clone().map(|l| l.0).unwrap_or_default();
            last[i] = Some((prev, resp.nonce.to_string()));
            wire(m, &req(ty, names, &last[i], true), &[]);
            return Ok(true);
        }
        if ty.is_full_state_in_sotw() {
            c.views[i] = resp
                .resources
                .iter()
                .map(|(n, r)| (n.to_string(), r.clone()))
                .collect();
        } else {
            for (n, r) in resp.resources.iter() {
                c.views[i].insert(n.to_string(), r.clone());
            }
        }
        c.check_make_before_break()?;
        last[i] = Some((resp.version.to_string(), resp.nonce.to_string()));
        wire(m, &req(ty, names, &last[i], false), &[]);
        Ok(true)
    };
    // No request since the machine last had nothing to send.
    let mut drained = false;
    for op in ops {
        match op {
            Op::Publish(s) => {
                let newest = publish(&snap, s);
                // Like the driver at a publish, drained with what it holds.
                let can_wait = drained && m.newest_can_wait(&newest);
                snap = newest;
                remember(&mut history, &snap);
                m.set_snapshot(Some(snap.clone()));
                drained = false;
                // The driver leaves such a publish to the next request:
                // sound only if taking it now sends nothing.
                if can_wait {
                    if let Some(r) = m.next_response() {
                        return Err(format!("a publish left for the ACK had {} to send", r.ty));
                    }
                    drained = true;
                }
            }
            Op::NackNext(t) => c.nack_next[*t] = true,
            Op::Step(n) => {
                for _ in 0..*n {
                    drained = false;
                    if !step(&mut m, &mut c, &mut last, &history)? {
                        drained = true;
                        break;
                    }
                }
            }
            Op::Reconnect(seed) => {
                if debug() {
                    eprintln!("reconnect");
                }
                m = SotwMachine::new(None);
                m.set_snapshot(Some(snap.clone()));
                drained = false;
                // Nothing is in flight on the new stream: requests carry the
                // last accepted version and no nonce.
                for l in last.iter_mut().flatten() {
                    l.1.clear();
                }
                c.not_resumed = [true; crate::resource::TYPE_COUNT];
                c.reconnected = true;
                for (ty, n) in reconnect_plan(*seed) {
                    let i = ty.index();
                    c.not_resumed[i] = false;
                    let names: Vec<String> = c.subs[i].iter().cloned().collect();
                    if !ty.is_full_state_in_sotw() && names.is_empty() {
                        continue;
                    }
                    if debug() {
                        eprintln!("first {ty} {names:?}");
                    }
                    wire(&mut m, &req(ty, names, &last[i], false), &history);
                    for _ in 0..n {
                        if !step(&mut m, &mut c, &mut last, &history)? {
                            break;
                        }
                    }
                }
            }
        }
    }
    c.nack_next = Default::default();
    c.not_resumed = Default::default();
    for _ in 0..200 {
        if !step(&mut m, &mut c, &mut last, &history)? {
            break;
        }
    }
    if !any_rejected(&c) {
        c.check_converged(&snap)?;
    }
    Ok(())
}

fn run_delta(ops: &[Op]) -> Result<(), String> {
    let mut m = DeltaMachine::new(None);
    let mut c = Client::default();
    let mut snap = build(
        &ops.iter()
            .find_map(|o| match o {
                Op::Publish(s) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or(Spec {
                clusters: vec![(0, 1)],
                route_to: vec![0],
                second_listener: false,
            }),
    );
    m.set_snapshot(Some(snap.clone()));
    let mut history = vec![snap.clone()];
    let sub = |ty: ResourceType, s: Vec<String>, u: Vec<String>| DeltaDiscoveryRequest {
        type_url: ty.type_url().into(),
        resource_names_subscribe: s,
        resource_names_unsubscribe: u,
        ..Default::default()
    };
    wire_delta(&mut m, &sub(ResourceType::Cluster, vec![], vec![]), &[]);
    wire_delta(&mut m, &sub(ResourceType::Listener, vec![], vec![]), &[]);
    let step = |m: &mut DeltaMachine, c: &mut Client| -> Result<bool, String> {
        let Some(resp) = m.next_response() else {
            for ty in [
                ResourceType::ClusterLoadAssignment,
                ResourceType::RouteConfiguration,
            ] {
                let w = c.wanted(ty);
                let have = &c.subs[ty.index()];
                if w != *have && !c.not_resumed[ty.index()] {
                    let s: Vec<String> = w.difference(have).cloned().collect();
                    let u: Vec<String> = have.difference(&w).cloned().collect();
                    for n in &u {
                        c.views[ty.index()].remove(n);
                    }
                    c.subs[ty.index()] = w;
                    wire_delta(m, &sub(ty, s, u), &[]);
                    return Ok(true);
                }
            }
            return Ok(false);
        };
        let ty = resp.ty;
        let i = ty.index();
        if debug() {
            eprintln!(
                "{ty}: +{:?} -{:?}",
                resp.resources.iter().map(|r| r.name()).collect::<Vec<_>>(),
                resp.removed
            );
        }
        let mut ack = DeltaDiscoveryRequest {
            type_url: ty.type_url().into(),
            response_nonce: resp.nonce.to_string(),
            ..Default::default()
        };
        if std::mem::take(&mut c.nack_next[i]) {
            c.nacked_after_reconnect |= c.reconnected;
            for r in &resp.resources {
                c.rejected
                    .insert((ty, r.name().to_string(), r.version().to_string()));
            }
            for n in &resp.removed {
                c.rejected.insert((ty, n.to_string(), "removal".into()));
            }
            ack.error_detail = Some(RpcStatus {
                code: 3,
                message: "no".into(),
                details: vec![],
            });
            wire_delta(m, &ack, &[]);
            return Ok(true);
        }
        for r in &resp.resources {
            c.views[i].insert(r.name().to_string(), r.clone());
        }
        for n in &resp.removed {
            c.views[i].remove(&**n);
        }
        c.check_make_before_break()?;
        wire_delta(m, &ack, &[]);
        Ok(true)
    };
    // No request since the machine last had nothing to send.
    let mut drained = false;
    for op in ops {
        match op {
            Op::Publish(s) => {
                let newest = publish(&snap, s);
                // Like the driver at a publish, drained with what it holds.
                let can_wait = drained && m.newest_can_wait(&newest);
                snap = newest;
                remember(&mut history, &snap);
                m.set_snapshot(Some(snap.clone()));
                drained = false;
                // The driver leaves such a publish to the next request:
                // sound only if taking it now sends nothing.
                if can_wait {
                    if let Some(r) = m.next_response() {
                        return Err(format!("a publish left for the ACK had {} to send", r.ty));
                    }
                    drained = true;
                }
            }
            Op::NackNext(t) => c.nack_next[*t] = true,
            Op::Step(n) => {
                for _ in 0..*n {
                    drained = false;
                    if !step(&mut m, &mut c)? {
                        drained = true;
                        break;
                    }
                }
            }
            Op::Reconnect(seed) => {
                if debug() {
                    eprintln!("reconnect");
                }
                m = DeltaMachine::new(None);
                m.set_snapshot(Some(snap.clone()));
                drained = false;
                c.not_resumed = [true; crate::resource::TYPE_COUNT];
                c.reconnected = true;
                for (ty, n) in reconnect_plan(*seed) {
                    let i = ty.index();
                    c.not_resumed[i] = false;
                    let names: Vec<String> = c.subs[i].iter().cloned().collect();
                    if !ty.is_full_state_in_sotw() && names.is_empty() {
                        continue;
                    }
                    let mut r = sub(ty, names, vec![]);
                    r.initial_resource_versions = c.views[i]
                        .iter()
                        .map(|(n, res)| (n.clone(), res.version().to_string()))
                        .collect();
                    wire_delta(&mut m, &r, &history);
                    for _ in 0..n {
                        if !step(&mut m, &mut c)? {
                            break;
                        }
                    }
                }
            }
        }
    }
    c.nack_next = Default::default();
    c.not_resumed = Default::default();
    for _ in 0..200 {
        if !step(&mut m, &mut c)? {
            break;
        }
    }
    if !any_rejected(&c) {
        c.check_converged(&snap)?;
        // Delta views hold exactly the snapshot (nothing stale left behind).
        for ty in [ResourceType::Cluster, ResourceType::Listener] {
            let want: BTreeSet<&str> = snap.resources(ty).keys().map(|k| &**k).collect();
            let have: BTreeSet<&str> = c.views[ty.index()].keys().map(|k| k.as_str()).collect();
            if want != have {
                return Err(format!("{ty}: client has {have:?}, snapshot {want:?}"));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Hostile client (issue #8): responses are in flight while the client acts;
// it rejects part of a response (applying the rest, as Envoy's CDS and LDS
// do), unsubscribes and re-subscribes, sends stale nonces and spontaneous
// requests, and reconnects to this server or to a replica with another
// history. Invariants: make-before-break at every step; once quiet, what the
// server believes the client holds the client holds, every subscribed
// resource that exists arrived, and (Delta) every subscription was answered.
// ---------------------------------------------------------------------------

/// Types a hostile op picks from.
const HTYPES: [ResourceType; 4] = [
    ResourceType::Cluster,
    ResourceType::ClusterLoadAssignment,
    ResourceType::Listener,
    ResourceType::RouteConfiguration,
];

#[derive(Clone, Debug)]
enum HOp {
    Publish(Spec),
    /// Reject the resources of the next response of a type whose index bit
    /// is set in the mask (at least one); apply the rest and the removals.
    NackPart(usize, u8),
    /// Deliver up to n messages.
    Step(u8),
    /// New stream to a server with the same history.
    Reconnect(u64),
    /// New stream to a replica with another history, serving `Spec`.
    ReconnectElsewhere(u64, Spec),
    /// Unsubscribe from a named EDS (false) or RDS (true) resource and forget
    /// it; reference-following subscribes again later.
    Unsubscribe(bool, prop::sample::Index),
    /// Subscribe again to a named resource the client already subscribes to.
    Resubscribe(bool, prop::sample::Index),
    /// A request with a nonce of an earlier response of this stream.
    Stale(usize),
    /// A request with no nonce and nothing new.
    Spontaneous(usize),
}

fn hop() -> impl Strategy<Value = HOp> {
    prop_oneof![
        3 => spec().prop_map(HOp::Publish),
        2 => (0usize..4, 1u8..=255).prop_map(|(t, m)| HOp::NackPart(t, m)),
        4 => (1u8..6).prop_map(HOp::Step),
        1 => any::<u64>().prop_map(HOp::Reconnect),
        1 => (any::<u64>(), spec()).prop_map(|(s, p)| HOp::ReconnectElsewhere(s, p)),
        1 => (any::<bool>(), any::<prop::sample::Index>()).prop_map(|(r, i)| HOp::Unsubscribe(r, i)),
        1 => (any::<bool>(), any::<prop::sample::Index>()).prop_map(|(r, i)| HOp::Resubscribe(r, i)),
        1 => (0usize..4).prop_map(HOp::Stale),
        1 => (0usize..4).prop_map(HOp::Spontaneous),
    ]
}

fn named_type(rds: bool) -> ResourceType {
    if rds {
        ResourceType::RouteConfiguration
    } else {
        ResourceType::ClusterLoadAssignment
    }
}

/// What a hostile client tracks beyond [`Client`].
#[derive(Default)]
struct Hostile {
    c: Client,
    /// Per type: the NACK mask for its next response.
    nack_mask: [u8; 5],
    /// Named resources the client dropped itself (make-before-break does not
    /// apply to them until they arrive again).
    dropped: BTreeSet<(ResourceType, String)>,
    /// Delta: subscribed names not answered yet.
    awaiting: BTreeSet<(ResourceType, String)>,
    /// Nonces of responses already handled on the current stream.
    old_nonces: [Vec<String>; crate::resource::TYPE_COUNT],
}

impl Hostile {
    /// Which resources of a response (by index) the client rejects.
    fn rejects(&mut self, ty: ResourceType, n: usize) -> Vec<bool> {
        let mask = std::mem::take(&mut self.nack_mask[ty.index()]);
        if mask == 0 || n == 0 {
            return vec![false; n];
        }
        let mut out: Vec<bool> = (0..n).map(|i| mask & (1 << (i % 8)) != 0).collect();
        if !out.iter().any(|r| *r) {
            out[0] = true;
        }
        out
    }

    fn make_before_break(&self) -> Result<(), String> {
        let c = &self.c;
        // Routes in use: named by a listener (Envoy drops the others with
        // their listener; this client may hold them a while longer).
        let used = c.wanted(ResourceType::RouteConfiguration);
        for ty in [ResourceType::RouteConfiguration, ResourceType::Listener] {
            for r in c.views[ty.index()].values() {
                if ty == ResourceType::RouteConfiguration && !used.contains(r.name()) {
                    continue;
                }
                for x in r.refs().iter().filter(|x| x.hard) {
                    let Some(cl) = c.views[ResourceType::Cluster.index()].get(&*x.name) else {
                        return Err(format!("{} routes to missing cluster {}", r.name(), x.name));
                    };
                    for e in cl
                        .refs()
                        .iter()
                        .filter(|e| e.ty == ResourceType::ClusterLoadAssignment)
                    {
                        if !c.views[e.ty.index()].contains_key(&*e.name)
                            && !self.dropped.contains(&(e.ty, e.name.to_string()))
                        {
                            return Err(format!("{} routes to cold cluster {}", r.name(), x.name));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// A resource that may legitimately never arrive: a rejected version of
    /// it, or a route to a cluster the client lacks, rejected, or has cold.
    fn may_wait(&self, res: &Resource) -> bool {
        let c = &self.c;
        let rejected =
            |ty: ResourceType, name: &str| c.rejected.iter().any(|(t, n, _)| *t == ty && n == name);
        if rejected(res.ty(), res.name()) {
            return true;
        }
        res.refs().iter().filter(|x| x.hard).any(|x| {
            rejected(x.ty, &x.name)
                || match c.views[ResourceType::Cluster.index()].get(&*x.name) {
                    None => true,
                    Some(cl) => cl.refs().iter().any(|e| {
                        e.ty == ResourceType::ClusterLoadAssignment
                            && (!c.views[e.ty.index()].contains_key(&*e.name)
                                || rejected(e.ty, &e.name))
                    }),
                }
        })
    }

    /// Once quiet: the server's belief is held, subscribed resources that
    /// exist arrived (or may wait), and (Delta) subscriptions were answered.
    fn check_quiet(
        &self,
        snap: &Snapshot,
        believed: &[crate::status::TypeStatus],
        arrival: bool,
        named_believed: bool,
    ) -> Result<(), String> {
        let c = &self.c;
        let named = |t: ResourceType| !matches!(t, ResourceType::Cluster | ResourceType::Listener);
        for st in believed.iter().filter(|st| named_believed || !named(st.ty)) {
            for name in st.acked.keys() {
                if !c.views[st.ty.index()].contains_key(&**name) {
                    return Err(format!("server believes the client holds {} {name}", st.ty));
                }
            }
        }
        for ty in HTYPES.into_iter().filter(|_| arrival) {
            for (name, res) in snap.resources(ty).iter() {
                let wanted = match ty {
                    ResourceType::Cluster | ResourceType::Listener => true,
                    _ => c.subs[ty.index()].contains(&**name),
                };
                if wanted && !c.views[ty.index()].contains_key(&**name) && !self.may_wait(res) {
                    return Err(format!("{ty} {name} never arrived"));
                }
            }
        }
        for (ty, name) in &self.awaiting {
            // A name gone from the server is answered (removed) only once
            // nothing the client holds uses it, like any removal.
            let used = || {
                c.views
                    .iter()
                    .flat_map(|v| v.values())
                    .any(|r| r.refs().iter().any(|x| x.ty == *ty && *x.name == **name))
            };
            let waits = match snap.get(*ty, name) {
                Some(r) => self.may_wait(r),
                None => used(),
            };
            if !waits && c.subs[ty.index()].contains(name) {
                return Err(format!("subscription to {ty} {name} never answered"));
            }
        }
        Ok(())
    }
}

struct DeltaWorld {
    m: DeltaMachine,
    h: Hostile,
    snap: Arc<Snapshot>,
    history: Vec<Arc<Snapshot>>,
    inbox: std::collections::VecDeque<super::DeltaResponse>,
    max_bytes: Option<usize>,
}

impl DeltaWorld {
    fn machine(&self) -> DeltaMachine {
        let mut m = DeltaMachine::new(None);
        if let Some(b) = self.max_bytes {
            m.set_max_response_bytes(b);
        }
        m.set_snapshot(Some(self.snap.clone()));
        m
    }

    fn send(&mut self, req: DeltaDiscoveryRequest) {
        if debug() {
            eprintln!(
                "  -> {} +{:?} -{:?} nonce {:?} err {}",
                ResourceType::from_type_url(&req.type_url).unwrap(),
                req.resource_names_subscribe,
                req.resource_names_unsubscribe,
                req.response_nonce,
                req.error_detail.is_some()
            );
        }
        let ty = ResourceType::from_type_url(&req.type_url).unwrap();
        for n in &req.resource_names_subscribe {
            // What a new stream's first request reports holding needs no answer.
            if (ty == ResourceType::ClusterLoadAssignment || ty == ResourceType::RouteConfiguration)
                && !req.initial_resource_versions.contains_key(n)
            {
                self.h.awaiting.insert((ty, n.clone()));
            }
        }
        wire_delta(&mut self.m, &req, &self.history);
        while let Some(r) = self.m.next_response() {
            self.inbox.push_back(r);
        }
    }

    fn sub(ty: ResourceType, s: Vec<String>, u: Vec<String>) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: ty.type_url().into(),
            resource_names_subscribe: s,
            resource_names_unsubscribe: u,
            ..Default::default()
        }
    }

    /// Subscribes to what the client's resources reference, and drops
    /// what they no longer do (Envoy: as listeners and clusters come and go).
    fn follow(&mut self, ty: ResourceType) -> bool {
        let c = &mut self.h.c;
        let w = c.wanted(ty);
        let have = &c.subs[ty.index()];
        if w == *have || c.not_resumed[ty.index()] {
            return false;
        }
        let s: Vec<String> = w.difference(have).cloned().collect();
        let u: Vec<String> = have.difference(&w).cloned().collect();
        for n in &u {
            c.views[ty.index()].remove(n);
        }
        c.subs[ty.index()] = w;
        self.send(Self::sub(ty, s, u));
        true
    }

    fn step(&mut self) -> Result<bool, String> {
        while let Some(r) = self.m.next_response() {
            self.inbox.push_back(r);
        }
        let Some(resp) = self.inbox.pop_front() else {
            for ty in [
                ResourceType::ClusterLoadAssignment,
                ResourceType::RouteConfiguration,
            ] {
                if self.follow(ty) {
                    return Ok(true);
                }
            }
            return Ok(false);
        };
        let ty = resp.ty;
        let i = ty.index();
        if debug() {
            eprintln!(
                "{ty} #{}: +{:?} -{:?}",
                resp.nonce,
                resp.resources.iter().map(|r| r.name()).collect::<Vec<_>>(),
                resp.removed
            );
        }
        let rejects = self.h.rejects(ty, resp.resources.len());
        let nack = rejects.iter().any(|r| *r);
        let c = &mut self.h.c;
        let named = !matches!(ty, ResourceType::Cluster | ResourceType::Listener);
        for (r, rejected) in resp.resources.iter().zip(&rejects) {
            self.h.awaiting.remove(&(ty, r.name().to_string()));
            if *rejected {
                c.rejected
                    .insert((ty, r.name().to_string(), r.version().to_string()));
            } else if !named || c.subs[i].contains(r.name()) {
                // Envoy takes what it subscribes to.
                c.views[i].insert(r.name().to_string(), r.clone());
                self.h.dropped.remove(&(ty, r.name().to_string()));
            }
        }
        for n in &resp.removed {
            // (A name the client dropped itself may be gone from the server
            // meanwhile: its removal does not make it warm again.)
            self.h.awaiting.remove(&(ty, n.to_string()));
            c.views[i].remove(&**n);
        }
        c.nacked_after_reconnect |= nack && c.reconnected;
        self.h.make_before_break()?;
        if ty == ResourceType::Listener {
            // Envoy drops a removed listener's routes (and asks for a new
            // one's) as it applies the listeners.
            self.follow(ResourceType::RouteConfiguration);
        }
        self.h.old_nonces[i].push(resp.nonce.to_string());
        let mut ack = DeltaDiscoveryRequest {
            type_url: ty.type_url().into(),
            response_nonce: resp.nonce.to_string(),
            ..Default::default()
        };
        if nack {
            ack.error_detail = Some(RpcStatus {
                code: 3,
                message: "part".into(),
                details: vec![],
            });
        }
        self.send(ack);
        Ok(true)
    }

    fn reconnect(&mut self, seed: u64) -> Result<(), String> {
        self.m = self.machine();
        self.inbox.clear();
        self.h.old_nonces = Default::default();
        // Subscriptions are stated anew (what it holds, with versions).
        self.h.awaiting.clear();
        let c = &mut self.h.c;
        c.not_resumed = [true; crate::resource::TYPE_COUNT];
        c.reconnected = true;
        for (ty, n) in reconnect_plan(seed) {
            let c = &mut self.h.c;
            let i = ty.index();
            c.not_resumed[i] = false;
            let names: Vec<String> = c.subs[i].iter().cloned().collect();
            if !ty.is_full_state_in_sotw() && names.is_empty() {
                continue;
            }
            let mut r = Self::sub(ty, names, vec![]);
            r.initial_resource_versions = c.views[i]
                .iter()
                .map(|(n, res)| (n.clone(), res.version().to_string()))
                .collect();
            self.send(r);
            for _ in 0..n {
                if !self.step()? {
                    break;
                }
            }
        }
        Ok(())
    }
}

fn run_delta_hostile(ops: &[HOp], small: bool) -> Result<(), String> {
    let first = ops
        .iter()
        .find_map(|o| match o {
            HOp::Publish(s) => Some(s.clone()),
            _ => None,
        })
        .unwrap_or(Spec {
            clusters: vec![(0, 1)],
            route_to: vec![0],
            second_listener: false,
        });
    let snap = build(&first);
    let mut w = DeltaWorld {
        m: DeltaMachine::new(None),
        h: Hostile::default(),
        history: vec![snap.clone()],
        snap,
        inbox: Default::default(),
        // About one resource per response.
        max_bytes: small.then_some(super::delta::ENVELOPE_BYTES + 200),
    };
    w.m = w.machine();
    w.send(DeltaWorld::sub(ResourceType::Cluster, vec![], vec![]));
    w.send(DeltaWorld::sub(ResourceType::Listener, vec![], vec![]));
    for op in ops {
        if debug() {
            eprintln!("op {op:?}");
        }
        match op {
            HOp::Publish(s) => {
                w.snap = publish(&w.snap, s);
                remember(&mut w.history, &w.snap);
                w.m.set_snapshot(Some(w.snap.clone()));
            }
            HOp::NackPart(t, mask) => w.h.nack_mask[HTYPES[*t].index()] = *mask,
            HOp::Step(n) => {
                for _ in 0..*n {
                    if !w.step()? {
                        break;
                    }
                }
            }
            HOp::Reconnect(seed) => w.reconnect(*seed)?,
            HOp::ReconnectElsewhere(seed, spec) => {
                w.snap = build(spec);
                w.history = vec![w.snap.clone()];
                w.reconnect(*seed)?;
            }
            HOp::Unsubscribe(rds, idx) => {
                let ty = named_type(*rds);
                let c = &mut w.h.c;
                if c.subs[ty.index()].is_empty() || c.not_resumed[ty.index()] {
                    continue;
                }
                let n = c.subs[ty.index()]
                    .iter()
                    .nth(idx.index(c.subs[ty.index()].len()))
                    .unwrap()
                    .clone();
                c.subs[ty.index()].remove(&n);
                c.views[ty.index()].remove(&n);
                w.h.dropped.insert((ty, n.clone()));
                w.send(DeltaWorld::sub(ty, vec![], vec![n]));
            }
            HOp::Resubscribe(rds, idx) => {
                let ty = named_type(*rds);
                let c = &w.h.c;
                if c.subs[ty.index()].is_empty() || c.not_resumed[ty.index()] {
                    continue;
                }
                let n = c.subs[ty.index()]
                    .iter()
                    .nth(idx.index(c.subs[ty.index()].len()))
                    .unwrap()
                    .clone();
                w.send(DeltaWorld::sub(ty, vec![n], vec![]));
            }
            HOp::Stale(t) => {
                let ty = HTYPES[*t];
                if let Some(n) = w.h.old_nonces[ty.index()].first().cloned()
                    && !w.h.c.not_resumed[ty.index()]
                {
                    let mut r = DeltaWorld::sub(ty, vec![], vec![]);
                    r.response_nonce = n;
                    w.send(r);
                }
            }
            HOp::Spontaneous(t) => {
                let ty = HTYPES[*t];
                if !w.h.old_nonces[ty.index()].is_empty() && !w.h.c.not_resumed[ty.index()] {
                    w.send(DeltaWorld::sub(ty, vec![], vec![]));
                }
            }
        }
    }
    w.h.nack_mask = Default::default();
    w.h.c.not_resumed = Default::default();
    for _ in 0..400 {
        if !w.step()? {
            break;
        }
    }
    if w.step()? {
        return Err("not quiet after 400 steps".into());
    }
    w.h.check_quiet(&w.snap, &w.m.status(), true, true)?;
    if !any_rejected(&w.h.c) {
        w.h.c.check_converged(&w.snap)?;
    }
    Ok(())
}

struct SotwWorld {
    m: SotwMachine,
    h: Hostile,
    snap: Arc<Snapshot>,
    history: Vec<Arc<Snapshot>>,
    inbox: std::collections::VecDeque<super::SotwResponse>,
    /// Per type: the last accepted version, and the last nonce received.
    version: [String; crate::resource::TYPE_COUNT],
    nonce: [String; crate::resource::TYPE_COUNT],
}

impl SotwWorld {
    fn request(&self, ty: ResourceType, nonce: &str, err: bool) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: ty.type_url().into(),
            resource_names: self.h.c.subs[ty.index()].iter().cloned().collect(),
            version_info: self.version[ty.index()].clone(),
            response_nonce: nonce.to_string(),
            error_detail: err.then(|| RpcStatus {
                code: 3,
                message: "part".into(),
                details: vec![],
            }),
            ..Default::default()
        }
    }

    fn send(&mut self, req: DiscoveryRequest) {
        if debug() {
            eprintln!(
                "  -> {} {:?} v{:?} nonce {:?} err {}",
                ResourceType::from_type_url(&req.type_url).unwrap(),
                req.resource_names,
                req.version_info,
                req.response_nonce,
                req.error_detail.is_some()
            );
        }
        wire(&mut self.m, &req, &self.history);
        while let Some(r) = self.m.next_response() {
            self.inbox.push_back(r);
        }
    }

    /// [`DeltaWorld::follow`], with the whole list of names.
    fn follow(&mut self, ty: ResourceType) -> bool {
        let c = &mut self.h.c;
        let w = c.wanted(ty);
        if w == c.subs[ty.index()] || c.not_resumed[ty.index()] {
            return false;
        }
        c.views[ty.index()].retain(|n, _| w.contains(n));
        c.subs[ty.index()] = w;
        let nonce = self.nonce[ty.index()].clone();
        self.send(self.request(ty, &nonce, false));
        true
    }

    fn step(&mut self) -> Result<bool, String> {
        while let Some(r) = self.m.next_response() {
            self.inbox.push_back(r);
        }
        let Some(resp) = self.inbox.pop_front() else {
            for ty in [
                ResourceType::ClusterLoadAssignment,
                ResourceType::RouteConfiguration,
            ] {
                if self.follow(ty) {
                    return Ok(true);
                }
            }
            return Ok(false);
        };
        let ty = resp.ty;
        let i = ty.index();
        if debug() {
            eprintln!(
                "{ty} #{} v{}: {:?}",
                resp.nonce,
                resp.version,
                resp.resources.keys().collect::<Vec<_>>()
            );
        }
        // A SotW NACK rejects every resource of the response here (SotW has
        // no way to settle which ones a client applied: a route to a valid
        // cluster of a NACKed response waits for the next change of CDS),
        // but CDS and LDS still apply its removals, as Envoy does.
        let mut rejects = self.h.rejects(ty, resp.resources.len());
        let nack = rejects.iter().any(|r| *r);
        rejects.iter_mut().for_each(|r| *r = nack);
        let c = &mut self.h.c;
        let mut next: View = if ty.is_full_state_in_sotw() {
            View::new()
        } else {
            c.views[i].clone()
        };
        for (r, rejected) in resp.resources.values().zip(&rejects) {
            if *rejected {
                c.rejected
                    .insert((ty, r.name().to_string(), r.version().to_string()));
                // The client keeps what it had.
                if let Some(old) = c.views[i].get(r.name()) {
                    next.insert(r.name().to_string(), old.clone());
                }
            } else if ty.is_full_state_in_sotw() || c.subs[i].contains(r.name()) {
                next.insert(r.name().to_string(), r.clone());
                self.h.dropped.remove(&(ty, r.name().to_string()));
            }
        }
        // Envoy's SotW CDS and LDS apply removals (what the response lacks)
        // even when they NACK it.
        c.views[i] = next;
        c.nacked_after_reconnect |= nack && c.reconnected;
        self.h.make_before_break()?;
        if ty == ResourceType::Listener {
            // Envoy drops a removed listener's routes (and asks for a new
            // one's) as it applies the listeners.
            self.follow(ResourceType::RouteConfiguration);
        }
        self.h.old_nonces[i].push(resp.nonce.to_string());
        self.nonce[i] = resp.nonce.to_string();
        if !nack {
            self.version[i] = resp.version.to_string();
        }
        self.send(self.request(ty, &resp.nonce, nack));
        Ok(true)
    }
}

fn run_sotw_hostile(ops: &[HOp]) -> Result<(), String> {
    let first = ops
        .iter()
        .find_map(|o| match o {
            HOp::Publish(s) => Some(s.clone()),
            _ => None,
        })
        .unwrap_or(Spec {
            clusters: vec![(0, 1)],
            route_to: vec![0],
            second_listener: false,
        });
    let snap = build(&first);
    let mut specs = vec![first];
    let mut w = SotwWorld {
        m: SotwMachine::new(None),
        h: Hostile::default(),
        history: vec![snap.clone()],
        snap,
        inbox: Default::default(),
        version: Default::default(),
        nonce: Default::default(),
    };
    w.m.set_snapshot(Some(w.snap.clone()));
    w.send(w.request(ResourceType::Cluster, "", false));
    w.send(w.request(ResourceType::Listener, "", false));
    for op in ops {
        if debug() {
            eprintln!("op {op:?}");
        }
        match op {
            HOp::Publish(s) => {
                w.snap = publish(&w.snap, s);
                remember(&mut w.history, &w.snap);
                w.m.set_snapshot(Some(w.snap.clone()));
                specs.insert(0, s.clone());
                specs.truncate(HISTORY);
            }
            HOp::NackPart(t, mask) => w.h.nack_mask[HTYPES[*t].index()] = *mask,
            HOp::Step(n) => {
                for _ in 0..*n {
                    if !w.step()? {
                        break;
                    }
                }
            }
            // Not modelled for SotW yet (reported on issue #8): a SotW
            // client's version covers its whole type, so on a new stream it
            // reports endpoints (or, after a NACK whose removals it applied,
            // clusters) it no longer holds: the server resolves the version
            // to content the client dropped, and a route to a re-created
            // cluster goes out while its endpoints are missing. Reconnects
            // without unsubscribes are in `sotw_never_breaks_routes_and_converges`.
            HOp::Reconnect(_) | HOp::ReconnectElsewhere(..) => {}
            // A SotW client cannot say on a new stream that it dropped one
            // name of a type (its version covers the type), and Envoy drops
            // endpoints only with their cluster: unsubscribing is left to
            // reference-following here.
            HOp::Unsubscribe(rds, _) | HOp::Resubscribe(rds, _) => {
                let ty = named_type(*rds);
                if !w.h.c.subs[ty.index()].is_empty() && !w.h.c.not_resumed[ty.index()] {
                    let nonce = w.nonce[ty.index()].clone();
                    w.send(w.request(ty, &nonce, false));
                }
            }
            HOp::Stale(t) => {
                let ty = HTYPES[*t];
                if let Some(n) = w.h.old_nonces[ty.index()].first().cloned()
                    && !w.h.c.not_resumed[ty.index()]
                {
                    w.send(w.request(ty, &n, false));
                }
            }
            HOp::Spontaneous(t) => {
                let ty = HTYPES[*t];
                if !w.h.old_nonces[ty.index()].is_empty() && !w.h.c.not_resumed[ty.index()] {
                    w.send(w.request(ty, "", false));
                }
            }
        }
    }
    w.h.nack_mask = Default::default();
    w.h.c.not_resumed = Default::default();
    for _ in 0..400 {
        if !w.step()? {
            break;
        }
    }
    if w.step()? {
        return Err("not quiet after 400 steps".into());
    }
    // SotW asserts make-before-break and what the server believes of CDS
    // and LDS only. Two SotW findings of this model, reported on issue #8
    // and left to the SotW rules' owner: (1) a request that drops a route
    // configuration while a response is in flight carries a stale nonce and
    // is ignored, so if the route comes back before the next ACK the server
    // never learns it was dropped and never sends it again; (2) a route
    // whose cluster's endpoints were rejected holds back the other routes.
    w.h.check_quiet(&w.snap, &w.m.status(), false, false)?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("SIM_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(300), ..ProptestConfig::default() })]

    #[test]
    fn sotw_never_breaks_routes_and_converges(ops in proptest::collection::vec(op(), 1..25)) {
        run_sotw(&ops).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn delta_never_breaks_routes_and_converges(ops in proptest::collection::vec(op(), 1..25)) {
        run_delta(&ops).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn insertion_order_does_not_change_versions(spec in spec(), seed in any::<u64>()) {
        let a = build(&spec);
        let mut all: Vec<Arc<Resource>> = ResourceType::ALL.iter().flat_map(|t| a.resources(*t).values().cloned()).collect();
        // Deterministic shuffle from the seed.
        let mut s = seed | 1;
        for i in (1..all.len()).rev() {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            all.swap(i, (s % (i as u64 + 1)) as usize);
        }
        let mut b = Snapshot::builder();
        for r in all {
            b.add(r);
        }
        let b = b.build().unwrap();
        for t in ResourceType::ALL {
            prop_assert_eq!(a.version(t), b.version(t));
        }
    }
}

/// Cases of the hostile-client models (`SIM_CASES` overrides): the rare
/// interleavings they found took thousands.
fn hostile_cases() -> u32 {
    std::env::var("SIM_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(2000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: hostile_cases(), ..ProptestConfig::default() })]

    #[test]
    fn sotw_hostile_client_keeps_the_invariants(ops in proptest::collection::vec(hop(), 1..30)) {
        run_sotw_hostile(&ops).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn delta_hostile_client_keeps_the_invariants(
        ops in proptest::collection::vec(hop(), 1..30),
        small in any::<bool>(),
    ) {
        run_delta_hostile(&ops, small).map_err(TestCaseError::fail)?;
    }
}

fn spec_of(clusters: &[(usize, u16)], route_to: &[usize], second_listener: bool) -> Spec {
    Spec {
        clusters: clusters.to_vec(),
        route_to: route_to.to_vec(),
        second_listener,
    }
}

/// Found by `sotw_never_breaks_routes_and_converges` in CI: the client
/// ACKs an EDS response holding c1, CDS drops c1 (Envoy forgets its
/// endpoints), CDS adds c1 back and the client asks for it again — still
/// reporting the EDS version that held c1 — and the stream breaks before the
/// answer. A SotW version is per type, so the next stream must not take it
/// as proof that the rebuilt c1 has its endpoints before routing to it.
#[test]
fn a_sotw_resume_does_not_trust_endpoints_of_a_re_added_cluster() {
    let ops = [
        Op::Publish(spec_of(&[(1, 1), (2, 1), (4, 1)], &[4], true)),
        Op::Step(2),
        Op::NackNext(1),
        Op::Step(4),
        Op::Publish(spec_of(&[(0, 1), (3, 1)], &[0], false)),
        Op::Step(2),
        Op::Reconnect(18239499441812611804),
        Op::Publish(spec_of(&[(0, 1), (1, 1)], &[1], false)),
        Op::Reconnect(15323689046263917682),
        Op::Reconnect(0),
    ];
    run_sotw(&ops).unwrap();
}

/// The same for routes: LDS drops l2 (Envoy forgets r2), adds it back, the
/// client asks for r2 again and the stream breaks before the answer. The
/// re-added listener warms until r2 comes; a resume that trusts the RDS
/// version never sends it (Envoy then serves the listener with no routes
/// after its initial fetch timeout: 404s).
#[test]
fn a_sotw_resume_does_not_trust_routes_of_a_re_added_listener() {
    let ops = [
        Op::Publish(spec_of(&[(0, 2)], &[0], true)),
        Op::Step(20),
        Op::Publish(spec_of(&[(0, 2)], &[0], false)),
        Op::Step(20),
        Op::Publish(spec_of(&[(0, 2)], &[0], true)),
        Op::Step(2),
        Op::Reconnect(0),
    ];
    run_sotw(&ops).unwrap();
}

/// Found with 5,000 cases: two CDS responses rejected in a row. Envoy (and
/// the server's view of it) drops what a rejected CDS response lacks, so the
/// model must too, or it expects routes to a cluster the server rightly
/// thinks is gone.
#[test]
fn rejected_cds_responses_remove_what_they_lack() {
    let ops = [
        Op::Step(1),
        Op::NackNext(1),
        Op::Publish(spec_of(&[(0, 1), (1, 1), (2, 1)], &[0], false)),
        Op::Publish(spec_of(&[(2, 1)], &[2], false)),
        Op::Step(1),
        Op::NackNext(1),
        Op::Publish(spec_of(&[(0, 1)], &[0], false)),
        Op::Step(1),
    ];
    run_sotw(&ops).unwrap();
}

/// Envoy applies the removals of an LDS (CDS) response it rejects and keeps
/// reporting the version before it: here l2 is dropped that way, comes back
/// in the config, and the client resumes at a version that names l2. Found
/// once the model applied those removals.
#[test]
fn a_sotw_resume_does_not_trust_a_version_after_a_rejected_removal() {
    let ops = [
        Op::Publish(spec_of(&[(0, 1)], &[0], false)),
        Op::Step(1),
        Op::Step(1),
        Op::Publish(spec_of(&[(0, 1)], &[0], true)),
        Op::Step(1),
        Op::NackNext(3),
        Op::Publish(spec_of(&[(0, 1)], &[0], false)),
        Op::NackNext(0),
        Op::Step(1),
        Op::Publish(spec_of(&[(0, 1)], &[0], true)),
        Op::Reconnect(0),
    ];
    run_sotw(&ops).unwrap();
}

/// The client's EDS version names c1's endpoints from before its CDS lost c1
/// (a rejected response's removal); the new stream sends c1 again before the
/// client's first EDS request: that request's version predates the cluster
/// Envoy built, with or without the history that shows it.
#[test]
fn a_sotw_resume_does_not_trust_endpoints_of_a_cluster_the_stream_sent() {
    let ops = [
        Op::Publish(spec_of(&[(0, 1)], &[0], false)),
        Op::Publish(spec_of(&[(1, 1)], &[1], false)),
        Op::Step(3),
        Op::Publish(spec_of(&[(2, 1)], &[2], false)),
        Op::Step(1),
        Op::Publish(spec_of(&[(1, 1)], &[1], false)),
        Op::NackNext(1),
        Op::Step(3),
        Op::Reconnect(0),
    ];
    run_sotw(&ops).unwrap();
}

/// Found by a random seed: the client rejects an upsert of r2 (so that
/// version is maybe held), then a response removing r2 (so the version it
/// had is maybe held too). The second must not replace the first: the
/// client still routes through r2 to c2, which must stay.
#[test]
fn a_rejected_removal_keeps_every_version_the_client_may_hold() {
    let ops = [
        Op::Publish(spec_of(&[(1, 1), (2, 1), (4, 1)], &[1], true)),
        Op::Step(1),
        Op::NackNext(1),
        Op::Step(1),
        Op::Publish(spec_of(&[(2, 1)], &[2], true)),
        Op::Step(5),
        Op::NackNext(4),
        Op::Publish(spec_of(&[(1, 1)], &[1], true)),
        Op::Step(3),
        Op::NackNext(4),
        Op::Publish(spec_of(&[(0, 1)], &[0], false)),
        Op::Publish(spec_of(&[(4, 1)], &[4], false)),
        Op::Step(4),
    ];
    run_delta(&ops).unwrap();
}

/// The client resumes RDS at a version that named r1 and r2 while asking
/// for r1 only (it dropped r2 with l2), then asks for r2 again when l2
/// comes back: once the config returns to that content, the plan's version
/// equals the reported one, which no longer proves the client holds r2.
#[test]
fn a_resume_version_proves_nothing_about_names_asked_for_again() {
    let ops = [
        Op::Publish(spec_of(&[(4, 1)], &[4], true)),
        Op::Step(2),
        Op::Step(4),
        Op::Publish(spec_of(&[(4, 1)], &[4], false)),
        Op::NackNext(0),
        Op::Step(2),
        Op::Publish(spec_of(&[(0, 1)], &[0], true)),
        Op::Reconnect(14095116817841063656),
        Op::Publish(spec_of(&[(4, 1)], &[4], true)),
    ];
    run_sotw(&ops).unwrap();
}

/// The client accepted a CDS response no snapshot explains (c1 kept for
/// its routes beside the new c0 and c2), then rejected one that removed c2
/// (Envoy applies the removal). When the config routes to c2 again, the
/// plan happens to have the reported version: that must not pass for proof
/// that the client holds c2.
#[test]
fn an_unexplained_resume_version_is_no_proof_once_names_came_and_went() {
    let ops = [
        Op::Publish(spec_of(&[(1, 1)], &[1], true)),
        Op::Step(5),
        Op::Step(1),
        Op::Publish(spec_of(&[(0, 2), (2, 1)], &[0], false)),
        Op::NackNext(2),
        Op::Step(1),
        Op::Step(4),
        Op::Publish(spec_of(&[(0, 1)], &[0], false)),
        Op::NackNext(1),
        Op::Step(1),
        Op::Publish(spec_of(&[(2, 1)], &[2], false)),
        Op::Reconnect(7047910394600835938),
    ];
    run_sotw(&ops).unwrap();
}

/// The client dropped c2 (a rejected CDS response's removal) and its
/// endpoints; the new stream sends c2 again before the client's first EDS
/// request, whose version no recent snapshot explains for the names asked.
/// Later the plan comes to have that version: it must not pass for proof.
#[test]
fn an_unexplained_eds_version_is_no_proof_for_clusters_the_stream_sent() {
    let ops = [
        Op::Step(4),
        Op::Publish(spec_of(&[(2, 1)], &[2], true)),
        Op::Publish(spec_of(&[(0, 1)], &[0], true)),
        Op::NackNext(1),
        Op::Step(2),
        Op::Publish(spec_of(&[(0, 1)], &[0], true)),
        Op::Reconnect(7070640533036068816),
        Op::Step(1),
        Op::Publish(spec_of(&[(2, 1)], &[2], false)),
    ];
    run_sotw(&ops).unwrap();
}

/// c2 is dropped (a rejected CDS response's removal), added back, and the
/// stream breaks before the client asks for its endpoints; the client's
/// first EDS request comes late on the new stream, with a version that
/// names c2's endpoints from before. The history it is handed shows c2
/// came and went.
#[test]
fn a_late_first_eds_request_is_checked_against_the_history() {
    let ops = [
        Op::Step(4),
        Op::Publish(spec_of(&[(2, 1)], &[2], true)),
        Op::Publish(spec_of(&[(0, 1)], &[0], true)),
        Op::NackNext(1),
        Op::Step(2),
        Op::Publish(spec_of(&[(2, 1), (3, 1)], &[2], false)),
        Op::Step(1),
        Op::Reconnect(0),
        Op::Publish(spec_of(&[(2, 1)], &[2], false)),
    ];
    run_sotw(&ops).unwrap();
}

/// The client accepted a CDS plan (c0 beside c2 and c3, kept for its
/// routes), rejected the next one (Envoy removes c2 and c3), and the config
/// comes back to exactly that plan's content: the current snapshot matches
/// the reported version, but c2 and c3 went away in between.
#[test]
fn a_resume_version_matching_a_later_snapshot_is_no_proof() {
    let ops = [
        Op::Step(1),
        Op::Publish(spec_of(&[(2, 1), (3, 1)], &[2, 3], false)),
        Op::Step(5),
        Op::Publish(spec_of(&[(0, 1)], &[0], true)),
        Op::Step(4),
        Op::NackNext(1),
        Op::Step(2),
        Op::Publish(spec_of(&[(0, 1), (2, 1), (3, 1)], &[0], false)),
        Op::Reconnect(0),
    ];
    run_sotw(&ops).unwrap();
}
