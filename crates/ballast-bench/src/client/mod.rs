//! One simulated proxy: what an Envoy does on the xDS side, and what the bench
//! needs to know about it afterwards.
//!
//! The protocol drivers (`sotw`, `delta`, `rest`) share the bookkeeping here:
//! decoding resources, following references (clusters → EDS names, listeners →
//! RDS names), the acknowledged view, statistics and convergence latencies —
//! [`Subscriptions::apply`] is the one response handler behind all three, and
//! `session` holds the reconnect loop and the ADS stream they run in. Each
//! driver keeps only its framing (requests, nonces, ACK/NACK messages).
//! Resource versions are kept as the server's content hash (xxh3 of the encoded
//! message, as `u64`) so a view compares directly with an expected snapshot and
//! ten thousand clients × thousands of resources stay affordable in memory.

pub mod delta;
pub mod rest;
mod session;
pub mod sotw;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use ballast_xds::envoy_types::pb::envoy::config::cluster::v3::Cluster;
use ballast_xds::envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType,
};
use ballast_xds::envoy_types::pb::envoy::config::core::v3::Node;
use ballast_xds::envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use ballast_xds::envoy_types::pb::envoy::config::listener::v3::Listener;
use ballast_xds::envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
use ballast_xds::envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use ballast_xds::envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use ballast_xds::envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use ballast_xds::envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use ballast_xds::envoy_types::pb::google::rpc::Status as RpcStatus;
use ballast_xds::{ResourceType, Snapshot};
use parking_lot::{Mutex, RwLock};
use prost::{Message, Name};
use serde::Serialize;

use crate::fleet::FleetShared;

/// How a simulated proxy talks to the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// ADS, State of the World.
    Sotw,
    /// ADS, incremental (Delta).
    Delta,
    /// REST-JSON polling (`POST /v3/discovery:<type>`), one HTTP/1.1 connection.
    Rest,
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::Sotw => "sotw",
            Protocol::Delta => "delta",
            Protocol::Rest => "rest",
        })
    }
}

/// Decides whether a client rejects a resource: `Some(message)` NACKs the
/// whole response carrying it (the client keeps its previous config).
pub type NackPredicate = Arc<dyn Fn(ResourceType, &str) -> Option<String> + Send + Sync>;

/// Everything one client needs to run.
#[derive(Clone)]
pub struct ClientConfig {
    pub addr: SocketAddr,
    pub node_id: String,
    /// `node.cluster`: Ballast maps it to a gateway; the bench server ignores it.
    pub node_cluster: String,
    pub protocol: Protocol,
    pub nack: Option<NackPredicate>,
    /// REST polling interval (Envoy's `refresh_delay`).
    pub rest_poll: Duration,
    pub shared: Arc<FleetShared>,
    /// Limits how many clients connect and load their first config at once.
    pub gate: Option<Arc<tokio::sync::Semaphore>>,
}

impl ClientConfig {
    pub(crate) fn node(&self) -> Node {
        Node {
            id: self.node_id.clone(),
            cluster: self.node_cluster.clone(),
            user_agent_name: "ballast-bench".into(),
            ..Default::default()
        }
    }

    fn nack_for(&self, ty: ResourceType, name: &str) -> Option<String> {
        self.nack.as_ref().and_then(|p| p(ty, name))
    }
}

/// How many resource types there are (per-type arrays).
pub const N_TYPES: usize = ResourceType::ALL.len();

/// The types a proxy follows, in the order Envoy asks for them (and, once
/// it holds a VHDS route configuration, `VirtualHost`).
pub const TYPES: [ResourceType; 4] = [
    ResourceType::Cluster,
    ResourceType::ClusterLoadAssignment,
    ResourceType::Listener,
    ResourceType::RouteConfiguration,
];

/// A fast non-cryptographic hasher for resource names (FxHash with a final
/// mix so short names differing in their last bytes spread over the buckets):
/// a cold start hashes every name of every response on every client, and
/// SipHash showed at the top of the client threads.
#[derive(Clone, Copy, Default)]
pub struct NameHasher(u64);

impl NameHasher {
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl std::hash::Hasher for NameHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().unwrap_or_default()));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(b));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^ (h >> 33)
    }
}

pub type NameBuildHasher = std::hash::BuildHasherDefault<NameHasher>;

/// What a client holds of one type: name → version.
pub type View = HashMap<Arc<str>, u64, NameBuildHasher>;

/// Resource names are shared by every client (one allocation per name) so a
/// large fleet's views cost pointers, not strings.
static NAMES: LazyLock<RwLock<HashSet<Arc<str>, NameBuildHasher>>> =
    LazyLock::new(Default::default);

pub(crate) fn intern(name: &str) -> Arc<str> {
    if let Some(n) = NAMES.read().get(name) {
        return n.clone();
    }
    let mut names = NAMES.write();
    if let Some(n) = names.get(name) {
        return n.clone();
    }
    let n: Arc<str> = name.into();
    names.insert(n.clone());
    n
}

/// A version string as the server's 16-hex-digit content hash; anything else
/// is hashed so it still compares by equality.
pub fn version_u64(v: &str) -> u64 {
    if let (16, Ok(x)) = (v.len(), u64::from_str_radix(v, 16)) {
        return x;
    }
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    v.hash(&mut h);
    h.finish() | (1 << 63)
}

/// What one event on a client was, for the per-client timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    Response,
    Ack,
    Nack,
}

/// One timeline entry: milliseconds since the fleet started.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Event {
    pub at_ms: u32,
    pub ty: u8,
    pub kind: EventKind,
}

/// Per-client counters, indexed by `ResourceType::index()`.
#[derive(Clone, Debug, Default)]
pub struct ClientStats {
    pub connected_at: Option<Instant>,
    pub first_response_at: Option<Instant>,
    pub last_ack_at: Option<Instant>,
    pub responses: [u64; N_TYPES],
    pub acks: [u64; N_TYPES],
    pub nacks: [u64; N_TYPES],
    /// Encoded bytes of the responses (protobuf size; JSON body size for REST).
    pub bytes: [u64; N_TYPES],
    /// Type version (`version_info` / `system_version_info`) last acknowledged.
    pub type_version: [String; N_TYPES],
    pub ack_at: [Option<Instant>; N_TYPES],
    /// When the type version last changed to a different value (ACK time).
    pub type_changed_at: [Option<Instant>; N_TYPES],
    pub reconnects: u64,
    /// Delta resources whose `version` is not the content hash of their bytes.
    pub version_mismatches: u64,
    /// Versions of tracked resources that match no published change.
    pub unmatched_versions: u64,
    pub last_error: Option<String>,
}

/// Everything the bench reads back from a client.
#[derive(Debug, Default)]
pub struct ClientState {
    /// The acknowledged config: per type, name → version.
    pub view: [View; N_TYPES],
    pub stats: ClientStats,
    pub events: Vec<Event>,
    /// Convergence samples (µs from publish to ACK), one per published change.
    pub latencies_us: Vec<u32>,
    /// Per tracked resource, the index of the last change seen in the change log.
    change_idx: HashMap<Arc<str>, usize>,
    /// Per resource, its content tag as last ACKed (only while the change
    /// log is keyed by tag).
    tags: HashMap<Arc<str>, u64>,
    /// Expected-config generation this client last matched, and when.
    pub converged_gen: Option<u64>,
    pub converged_at: Option<Instant>,
}

impl ClientState {
    /// Does the acknowledged view equal `expected` (every type, name and version)?
    pub fn matches(&self, expected: &Snapshot) -> bool {
        // Counts first, for every type: they differ on every ACK of a load
        // but the last, which then costs a lookup per resource, not one per
        // resource and ACK.
        ResourceType::ALL
            .into_iter()
            .all(|ty| self.view[ty.index()].len() == expected.resources(ty).len())
            && ResourceType::ALL.into_iter().all(|ty| {
                let have = &self.view[ty.index()];
                expected
                    .resources(ty)
                    .iter()
                    .all(|(n, r)| have.get(&**n) == Some(&version_u64(r.version())))
            })
    }

    /// Human-readable first difference from `expected`, for failure reports.
    pub fn first_difference(&self, expected: &Snapshot) -> Option<String> {
        for ty in ResourceType::ALL {
            let want = expected.resources(ty);
            let have = &self.view[ty.index()];
            for (n, r) in want.iter() {
                match have.get(&**n) {
                    None => return Some(format!("{ty} {n:?} missing")),
                    Some(v) if *v != version_u64(r.version()) => {
                        return Some(format!("{ty} {n:?} at {v:016x}, expected {}", r.version()));
                    }
                    _ => {}
                }
            }
            for n in have.keys() {
                if !want.contains_key(&**n) {
                    return Some(format!("{ty} {n:?} held but not expected"));
                }
            }
        }
        None
    }

    fn event(&mut self, shared: &FleetShared, ty: ResourceType, kind: EventKind, at: Instant) {
        let at_ms = at.saturating_duration_since(shared.start).as_millis() as u32;
        self.events.push(Event {
            at_ms,
            ty: ty.index() as u8,
            kind,
        });
    }

    /// Records a received response (before it is decoded and acknowledged).
    pub(crate) fn on_response(
        &mut self,
        shared: &FleetShared,
        ty: ResourceType,
        bytes: usize,
        at: Instant,
    ) {
        self.stats.first_response_at.get_or_insert(at);
        self.stats.responses[ty.index()] += 1;
        self.stats.bytes[ty.index()] += bytes as u64;
        self.event(shared, ty, EventKind::Response, at);
    }

    pub(crate) fn on_nack(&mut self, shared: &FleetShared, ty: ResourceType) {
        self.stats.nacks[ty.index()] += 1;
        self.event(shared, ty, EventKind::Nack, Instant::now());
    }

    /// How many changes of the change log for `name` this client has ACKed
    /// (a later change covers the earlier ones it replaced).
    pub fn changes_seen(&self, name: &str) -> usize {
        self.change_idx.get(name).map_or(0, |i| i + 1)
    }

    /// Applies an accepted response to the view and records the ACK.
    /// `replace`: the response is the full set of its type (SotW CDS/LDS).
    /// `removed`: names the server removed (Delta). `tags`: content tags of
    /// the upserts that have one (when the change log is keyed by tag).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_ack(
        &mut self,
        shared: &FleetShared,
        ty: ResourceType,
        type_version: &str,
        replace: bool,
        upserts: &[(Arc<str>, u64)],
        tags: &[(Arc<str>, u64)],
        removed: &[Arc<str>],
    ) {
        let now = Instant::now();
        for (n, t) in tags {
            self.tags.insert(n.clone(), *t);
        }
        let view = &mut self.view[ty.index()];
        // What changed matters only while the harness times changes.
        let tracking = shared.changes.is_tracking();
        let mut changed: Vec<Arc<str>> = Vec::new();
        if replace {
            let mut next = View::with_capacity_and_hasher(upserts.len(), Default::default());
            for (n, v) in upserts {
                if tracking && view.get(n) != Some(v) {
                    changed.push(n.clone());
                }
                next.insert(n.clone(), *v);
            }
            *view = next;
        } else {
            for (n, v) in upserts {
                if view.insert(n.clone(), *v) != Some(*v) && tracking {
                    changed.push(n.clone());
                }
            }
        }
        for n in removed {
            view.remove(n);
        }
        self.stats.acks[ty.index()] += 1;
        self.stats.last_ack_at = Some(now);
        self.stats.ack_at[ty.index()] = Some(now);
        if self.stats.type_version[ty.index()] != type_version {
            self.stats.type_version[ty.index()] = type_version.to_string();
            self.stats.type_changed_at[ty.index()] = Some(now);
        }
        self.event(shared, ty, EventKind::Ack, now);
        if !changed.is_empty() {
            self.record_latencies(shared, ty, &changed, now);
        }
        if shared.check_on_ack() {
            self.check_converged(shared, now);
        }
    }

    /// Every published change this ACK makes visible: from the change after
    /// the last one this client saw up to the one whose version it now holds.
    fn record_latencies(
        &mut self,
        shared: &FleetShared,
        ty: ResourceType,
        changed: &[Arc<str>],
        now: Instant,
    ) {
        let log = shared.changes.log.read();
        let by_tag = shared.changes.is_by_tag();
        for name in changed {
            let Some(list) = log.get(&(ty, name.clone())) else {
                continue;
            };
            let key = if by_tag {
                self.tags.get(name).copied()
            } else {
                self.view[ty.index()].get(name).copied()
            };
            let Some(idx) = key.and_then(|k| list.iter().rposition(|(v, _, _)| *v == k)) else {
                self.stats.unmatched_versions += 1;
                continue;
            };
            let from = match self.change_idx.get(name) {
                Some(prev) if *prev >= idx => continue,
                Some(prev) => prev + 1,
                None => 0,
            };
            let acks = shared.changes.acks.read();
            for (_, t0, seq) in &list[from..=idx] {
                let us = now.saturating_duration_since(*t0).as_micros();
                let us = us.min(u32::MAX as u128) as u32;
                self.latencies_us.push(us);
                if let Some(a) = acks.get(*seq as usize) {
                    a.clients.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                    a.max_us.fetch_max(us, std::sync::atomic::Ordering::AcqRel);
                }
            }
            self.change_idx.insert(name.clone(), idx);
        }
    }

    /// Compares with the fleet's current expected config; counts this client
    /// once per expected generation.
    pub(crate) fn check_converged(&mut self, shared: &FleetShared, now: Instant) {
        let (generation, expected) = shared.expected();
        let Some(expected) = expected else { return };
        if self.converged_gen == Some(generation) {
            return;
        }
        if self.matches(&expected) {
            self.converged_gen = Some(generation);
            self.converged_at = Some(now);
            shared.mark_converged(generation);
        }
    }

    /// Drops what the client no longer subscribes to (named types only).
    pub(crate) fn retain_subscribed(&mut self, ty: ResourceType, names: &BTreeSet<String>) {
        self.view[ty.index()].retain(|n, _| names.contains(&**n));
    }
}

/// A resource as the client decoded it.
pub(crate) struct Decoded {
    pub name: Arc<str>,
    pub version: u64,
    /// Cluster → the load assignment it needs (EDS service name or its name).
    pub eds: Option<String>,
    /// Listener → route configurations it needs; VHDS route configuration →
    /// the namespace of its virtual hosts (its name).
    pub rds: Vec<String>,
    /// Load assignment → its [`content_tag`].
    pub tag: Option<u64>,
}

/// The content tag of a load assignment: its highest endpoint port. The
/// bench's etcd scenarios give a Backend's endpoints a port that is new for
/// that Backend on every change, so the tag says which change a load
/// assignment carries even though its version (a hash of the server's
/// encoding) cannot be predicted.
pub fn content_tag(cla: &ClusterLoadAssignment) -> Option<u64> {
    use ballast_xds::envoy_types::pb::envoy::config::core::v3::address::Address as Addr;
    use ballast_xds::envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
    use ballast_xds::envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
    cla.endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .filter_map(|e| match &e.host_identifier {
            Some(HostIdentifier::Endpoint(ep)) => ep.address.as_ref(),
            _ => None,
        })
        .filter_map(|a| match &a.address {
            Some(Addr::SocketAddress(sa)) => match sa.port_specifier {
                Some(PortSpecifier::PortValue(p)) => Some(u64::from(p)),
                _ => None,
            },
            _ => None,
        })
        .max()
}

/// Decodes one resource like Envoy would before accepting it; the version is
/// the content hash of the bytes received (what the server versions by).
pub(crate) fn decode(ty: ResourceType, type_url: &str, value: &[u8]) -> Result<Decoded, String> {
    if type_url != ty.type_url() {
        return Err(format!("resource of type {type_url} in a {ty} response"));
    }
    let version = version_u64(&ballast_xds::content_version(value));
    let err = |e: prost::DecodeError| format!("cannot decode {ty}: {e}");
    let mut tag = None;
    let (name, eds, rds) = match ty {
        ResourceType::Cluster => {
            let c = Cluster::decode(value).map_err(err)?;
            let is_eds = matches!(c.cluster_discovery_type,
                Some(ClusterDiscoveryType::Type(t)) if t == DiscoveryType::Eds as i32);
            let eds = is_eds.then(|| {
                let svc = c
                    .eds_cluster_config
                    .as_ref()
                    .map(|e| e.service_name.clone())
                    .unwrap_or_default();
                if svc.is_empty() { c.name.clone() } else { svc }
            });
            (c.name, eds, Vec::new())
        }
        ResourceType::ClusterLoadAssignment => {
            let c = ClusterLoadAssignment::decode(value).map_err(err)?;
            tag = content_tag(&c);
            (c.cluster_name, None, Vec::new())
        }
        ResourceType::Listener => {
            let l = Listener::decode(value).map_err(err)?;
            let mut rds = Vec::new();
            for chain in l.filter_chains.iter().chain(l.default_filter_chain.iter()) {
                for f in &chain.filters {
                    let Some(ConfigType::TypedConfig(any)) = &f.config_type else {
                        continue;
                    };
                    if any.type_url != HttpConnectionManager::type_url() {
                        continue;
                    }
                    let hcm = HttpConnectionManager::decode(any.value.as_slice()).map_err(err)?;
                    if let Some(RouteSpecifier::Rds(r)) = hcm.route_specifier {
                        rds.push(r.route_config_name);
                    }
                }
            }
            (l.name, None, rds)
        }
        ResourceType::RouteConfiguration => {
            let r = RouteConfiguration::decode(value).map_err(err)?;
            // VHDS: the virtual hosts come in the route configuration's namespace.
            let vhds = if r.vhds.is_some() {
                vec![r.name.clone()]
            } else {
                Vec::new()
            };
            (r.name, None, vhds)
        }
        ResourceType::Secret => {
            let s = Secret::decode(value).map_err(err)?;
            (s.name, None, Vec::new())
        }
        ResourceType::VirtualHost => {
            let v = VirtualHost::decode(value).map_err(err)?;
            (v.name, None, Vec::new())
        }
    };
    if name.is_empty() {
        return Err(format!("{ty} resource without a name"));
    }
    Ok(Decoded {
        name: intern(&name),
        version,
        eds,
        rds,
        tag,
    })
}

/// References the client follows: which EDS and RDS names it must subscribe to.
#[derive(Debug, Default)]
pub(crate) struct Refs {
    cluster_eds: HashMap<Arc<str>, String>,
    listener_rds: HashMap<Arc<str>, Vec<String>>,
    route_vhds: HashMap<Arc<str>, Vec<String>>,
}

impl Refs {
    /// Records what a decoded cluster or listener references.
    pub fn add(&mut self, ty: ResourceType, d: &Decoded) {
        match ty {
            ResourceType::Cluster => {
                match &d.eds {
                    Some(e) => self.cluster_eds.insert(d.name.clone(), e.clone()),
                    None => self.cluster_eds.remove(&d.name),
                };
            }
            ResourceType::Listener => {
                self.listener_rds.insert(d.name.clone(), d.rds.clone());
            }
            ResourceType::RouteConfiguration => {
                self.route_vhds.insert(d.name.clone(), d.rds.clone());
            }
            _ => {}
        }
    }
    pub fn remove(&mut self, ty: ResourceType, name: &str) {
        match ty {
            ResourceType::Cluster => {
                self.cluster_eds.remove(name);
            }
            ResourceType::Listener => {
                self.listener_rds.remove(name);
            }
            ResourceType::RouteConfiguration => {
                self.route_vhds.remove(name);
            }
            _ => {}
        }
    }
    pub fn clear(&mut self, ty: ResourceType) {
        match ty {
            ResourceType::Cluster => self.cluster_eds.clear(),
            ResourceType::Listener => self.listener_rds.clear(),
            ResourceType::RouteConfiguration => self.route_vhds.clear(),
            _ => {}
        }
    }
    /// The names of `ty` (EDS or RDS) that the held clusters/listeners need.
    pub fn wanted(&self, ty: ResourceType) -> BTreeSet<String> {
        match ty {
            ResourceType::ClusterLoadAssignment => self.cluster_eds.values().cloned().collect(),
            ResourceType::RouteConfiguration => {
                self.listener_rds.values().flatten().cloned().collect()
            }
            ResourceType::VirtualHost => self.route_vhds.values().flatten().cloned().collect(),
            _ => BTreeSet::new(),
        }
    }
}

/// Envoy asks for listeners only once its clusters are warm (cluster manager
/// initialization precedes the listener manager's): CDS acknowledged and every
/// load assignment the clusters need received.
fn clusters_warm(state: &ClientState, eds_wanted: &BTreeSet<String>) -> bool {
    state.stats.acks[ResourceType::Cluster.index()] > 0
        && eds_wanted.iter().all(|n| {
            state.view[ResourceType::ClusterLoadAssignment.index()].contains_key(n.as_str())
        })
}

/// The type whose names follow from a response of `ty`, if any.
fn dependent(ty: ResourceType) -> Option<ResourceType> {
    match ty {
        ResourceType::Cluster => Some(ResourceType::ClusterLoadAssignment),
        ResourceType::Listener => Some(ResourceType::RouteConfiguration),
        ResourceType::RouteConfiguration => Some(ResourceType::VirtualHost),
        _ => None,
    }
}

/// Named types (EDS, RDS) are subscribed by name; CDS and LDS are wildcard.
pub(crate) fn is_named(ty: ResourceType) -> bool {
    !ty.is_full_state_in_sotw()
}

/// How a response turned out.
pub(crate) enum Outcome {
    /// Rejected (the message goes in the NACK); the view is unchanged.
    Nack(String),
    /// Applied and acknowledged; `Some((dep, previous))` when the names of
    /// the dependent type `dep` changed (they were `previous`).
    Ack(Option<(ResourceType, BTreeSet<String>)>),
}

/// What a client follows, whatever the protocol, and which survives
/// reconnects (a reconnecting Envoy resumes with its subscriptions): the named
/// subscriptions (EDS/RDS) following the references of the clusters and
/// listeners held, and whether LDS still waits for warm clusters.
#[derive(Debug, Default)]
pub(crate) struct Subscriptions {
    /// Subscribed names per type (EDS/RDS); empty for the wildcard types.
    pub names: [BTreeSet<String>; N_TYPES],
    /// Bumped whenever a type's `names` change, so a client can keep them
    /// encoded between changes (a SotW ACK repeats every name).
    pub names_gen: [u64; N_TYPES],
    /// Whether the type was requested on the current stream.
    pub requested: [bool; N_TYPES],
    refs: Refs,
    /// LDS waits for warm clusters on a first start (see `clusters_warm`).
    lds_deferred: bool,
}

impl Subscriptions {
    /// The types to request when a stream opens (or resumes), in Envoy's
    /// order: LDS is deferred on a first start, named types without names
    /// wait for the references that give them names.
    pub fn open(&mut self, state: &ClientState) -> Vec<ResourceType> {
        let fresh = state.stats.acks[ResourceType::Listener.index()] == 0;
        self.lds_deferred = fresh;
        let mut out = Vec::with_capacity(TYPES.len() + 1);
        for ty in TYPES.into_iter().chain([ResourceType::VirtualHost]) {
            let deferred = fresh && ty == ResourceType::Listener;
            let idle = deferred || (is_named(ty) && self.names[ty.index()].is_empty());
            self.requested[ty.index()] = !idle;
            if !idle {
                out.push(ty);
            }
        }
        out
    }

    /// Handles one response of `ty`, like Envoy before it ACKs: records it,
    /// decodes every resource (`resources` yields each decoded with the
    /// version the response gives it, or the reason to reject it), applies the
    /// NACK predicate, then updates the view — replacing the type's set when
    /// `replace` (SotW CDS/LDS), dropping `removed` (Delta) — and follows the
    /// references to the dependent type. Resources of a named type the client
    /// did not subscribe to are ignored.
    #[allow(clippy::too_many_arguments)]
    pub fn apply(
        &mut self,
        cfg: &ClientConfig,
        state: &SharedState,
        ty: ResourceType,
        (bytes, at): (usize, Instant),
        type_version: &str,
        replace: bool,
        resources: impl ExactSizeIterator<Item = Result<(Decoded, u64), String>>,
        removed: &[String],
    ) -> Outcome {
        let mut st = state.lock();
        st.on_response(&cfg.shared, ty, bytes, at);
        let mut decoded = Vec::with_capacity(resources.len());
        let mut nack = None;
        let mut mismatches = 0;
        for r in resources {
            let (d, version) = match r {
                Ok(x) => x,
                Err(e) => {
                    nack = Some(e);
                    break;
                }
            };
            if let Some(m) = cfg.nack_for(ty, &d.name) {
                nack = Some(m);
                break;
            }
            if version != d.version {
                mismatches += 1;
            }
            decoded.push((d, version));
        }
        st.stats.version_mismatches += mismatches;
        if let Some(message) = nack {
            st.on_nack(&cfg.shared, ty);
            return Outcome::Nack(message);
        }
        if replace {
            self.refs.clear(ty);
        }
        let subscribed = &self.names[ty.index()];
        let by_tag = cfg.shared.changes.is_by_tag();
        let mut tags = Vec::new();
        let mut upserts = Vec::with_capacity(decoded.len());
        for (d, version) in &decoded {
            // Envoy ignores resources it did not ask for on named types
            // (VHDS: by namespace, everything before the last '/').
            let wanted = if ty.is_namespaced() {
                d.name
                    .rsplit_once('/')
                    .is_some_and(|(ns, _)| subscribed.contains(ns))
            } else {
                subscribed.contains(&*d.name)
            };
            if is_named(ty) && !wanted {
                continue;
            }
            self.refs.add(ty, d);
            if let (true, Some(t)) = (by_tag, d.tag) {
                tags.push((d.name.clone(), t));
            }
            upserts.push((d.name.clone(), *version));
        }
        let removed: Vec<Arc<str>> = removed
            .iter()
            .map(|n| {
                self.refs.remove(ty, n);
                intern(n)
            })
            .collect();
        let mut resubscribed = None;
        if let Some(dep) = dependent(ty) {
            let wanted = self.refs.wanted(dep);
            if wanted != self.names[dep.index()] {
                st.retain_subscribed(dep, &wanted);
                let previous = std::mem::replace(&mut self.names[dep.index()], wanted);
                self.names_gen[dep.index()] += 1;
                resubscribed = Some((dep, previous));
            }
        }
        st.on_ack(
            &cfg.shared,
            ty,
            type_version,
            replace,
            &upserts,
            &tags,
            &removed,
        );
        Outcome::Ack(resubscribed)
    }

    /// After a response: whether the deferred LDS request is due now (the
    /// clusters are warm); marks it requested.
    pub fn listeners_due(&mut self, state: &ClientState) -> bool {
        let eds = &self.names[ResourceType::ClusterLoadAssignment.index()];
        if self.lds_deferred && clusters_warm(state, eds) {
            self.lds_deferred = false;
            self.requested[ResourceType::Listener.index()] = true;
            return true;
        }
        false
    }
}

/// Holds a connect-gate permit until the client has acknowledged every type once.
pub(crate) struct GatePermit(Option<tokio::sync::OwnedSemaphorePermit>);

impl GatePermit {
    pub async fn acquire(cfg: &ClientConfig) -> GatePermit {
        match &cfg.gate {
            Some(g) => GatePermit(g.clone().acquire_owned().await.ok()),
            None => GatePermit(None),
        }
    }
    pub fn release_when_loaded(&mut self, state: &ClientState) {
        if self.0.is_some() && TYPES.iter().all(|t| state.stats.acks[t.index()] > 0) {
            self.0 = None;
        }
    }
}

/// The state handle every driver writes into.
pub type SharedState = Arc<Mutex<ClientState>>;

/// Runs a client until `stop` turns true, reconnecting on errors.
pub async fn run(cfg: ClientConfig, state: SharedState, stop: tokio::sync::watch::Receiver<bool>) {
    match cfg.protocol {
        Protocol::Sotw => session::run::<sotw::SotwClient>(cfg, state, stop).await,
        Protocol::Delta => session::run::<delta::DeltaClient>(cfg, state, stop).await,
        Protocol::Rest => session::run::<rest::RestClient>(cfg, state, stop).await,
    }
}

/// The `error_detail` of a NACK: INVALID_ARGUMENT, as Envoy sends.
pub(crate) fn nack_status(message: String) -> RpcStatus {
    RpcStatus {
        code: 3,
        message,
        details: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast_xds::simple;

    #[test]
    fn content_tag_is_the_highest_endpoint_port() {
        let cla =
            simple::load_assignment("default/b00001", &[("10.0.0.1", 8003), ("10.0.0.2", 8007)]);
        assert_eq!(content_tag(&cla), Some(8007));
        let empty = simple::load_assignment("default/b00002", &[]);
        assert_eq!(content_tag(&empty), None);
        let d = decode(
            ResourceType::ClusterLoadAssignment,
            ResourceType::ClusterLoadAssignment.type_url(),
            &cla.encode_to_vec(),
        )
        .unwrap();
        assert_eq!((&*d.name, d.tag), ("default/b00001", Some(8007)));
    }

    /// Keyed by tag, an ACK of a later change covers the earlier ones of the same resource;
    /// a tag nobody published is counted, not matched.
    #[test]
    fn changes_keyed_by_tag_are_matched_and_counted_per_change() {
        let shared = FleetShared::default();
        shared.set_check_on_ack(false);
        shared.changes.set_by_tag(true);
        shared.changes.set_tracking(true);
        let ty = ResourceType::ClusterLoadAssignment;
        let t0 = Instant::now();
        for tag in [8001, 8002, 8003] {
            shared.changes.record_key(ty, "default/b1", tag, t0);
        }
        let name = intern("default/b1");
        let mut c = ClientState::default();
        c.on_ack(
            &shared,
            ty,
            "v1",
            false,
            &[(name.clone(), 1)],
            &[(name.clone(), 8002)],
            &[],
        );
        assert_eq!((c.changes_seen("default/b1"), c.latencies_us.len()), (2, 2));
        // The same content again changes nothing; a tag nobody wrote is unmatched.
        c.on_ack(
            &shared,
            ty,
            "v1",
            false,
            &[(name.clone(), 1)],
            &[(name.clone(), 8002)],
            &[],
        );
        c.on_ack(
            &shared,
            ty,
            "v2",
            false,
            &[(name.clone(), 2)],
            &[(name.clone(), 9999)],
            &[],
        );
        assert_eq!(c.stats.unmatched_versions, 1);
        c.on_ack(
            &shared,
            ty,
            "v3",
            false,
            &[(name.clone(), 3)],
            &[(name, 8003)],
            &[],
        );
        assert_eq!((c.changes_seen("default/b1"), c.latencies_us.len()), (3, 3));
        let per_change: Vec<u32> = shared.changes.per_change().iter().map(|p| p.0).collect();
        assert_eq!(per_change, vec![1, 1, 1]);
    }
}
