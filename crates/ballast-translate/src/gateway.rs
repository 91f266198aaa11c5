//! Building the full resource set of one Gateway, reusing whatever is cached and still valid,
//! and patching it when only some of its HTTPRoutes changed.
//!
//! Every cache entry remembers the objects it was computed from and is only reused when they
//! are unchanged (`Arc` identity or equality), so a stale cache can cost time but never produce
//! wrong resources; which gateways to rebuild is the dependency index's job.
//!
//! A Gateway's state keeps, per route configuration, each virtual host's contributing
//! translated routes and its encoding: a route configuration is encoded by concatenating its
//! virtual hosts' encodings (exactly the bytes prost would produce for the whole message), so
//! editing one route among thousands re-encodes only the virtual hosts it touches.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ballast_model::hostname::ANY_HOST;
use ballast_model::set::ListenerAttachment;
use ballast_model::{Backend, ConfigSet, Gateway, HttpRoute, ListenerProtocol, ObjectKey, Secret};
use ballast_xds::{Ref, Resource, ResourceType, XdsResource};
use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::ConfigSource;
use envoy_types::pb::envoy::config::listener::v3::Listener as EnvoyListener;
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, Vhds, VirtualHost};
use prost::encoding::{WireType, encode_key, encode_varint};
use xxhash_rust::xxh3::xxh3_64;

use crate::index::{DependencyIndex, Deps, Orphans, names_gateway};
use crate::listener::{ChainPlan, certificate_refs, envoy_listeners, plan};
use crate::policy::ClusterInputs;
use crate::route::{
    RateLimitSignature, TranslatedRoute, backend_signature, contributions, encode_misdirected_host,
    encode_virtual_host, fixed_hosts, rate_limit_signature, translate_route,
};
use crate::{
    ConfigSources, GatewayResources, Options, TranslateStats, cluster, encode, names, secret,
};

/// Encoded cluster and load assignment of one Backend version.
pub(crate) struct BackendEntry {
    pub backend: Arc<Backend>,
    /// The policies (and objects they name) the cluster was built with.
    pub inputs: ClusterInputs,
    pub cluster: Arc<Resource>,
    /// `None` for a DNS Backend: its endpoints are inline in its cluster.
    pub load_assignment: Option<Arc<Resource>>,
}

pub(crate) struct SecretEntry {
    pub secret: Arc<Secret>,
    pub resource: Arc<Resource>,
}

/// Per-object caches shared by all gateways: a Backend used by a thousand gateways is encoded
/// once and every gateway holds the same `Arc<Resource>`.
pub(crate) struct Caches {
    pub backends: BTreeMap<ObjectKey, BackendEntry>,
    pub secrets: BTreeMap<ObjectKey, SecretEntry>,
    pub routes: BTreeMap<ObjectKey, Arc<TranslatedRoute>>,
    /// Where clusters fetch their endpoints (fixed for the translator's life).
    pub config_sources: ConfigSources,
    /// The DNS servers of DNS clusters (fixed for the translator's life).
    pub dns_resolvers: Vec<std::net::SocketAddr>,
}

fn same<T: PartialEq>(a: &Arc<T>, b: &Arc<T>) -> bool {
    Arc::ptr_eq(a, b) || **a == **b
}

fn same_rate_limit(a: &RateLimitSignature, b: &RateLimitSignature) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some((p, u)), Some((q, v))) => u == v && same(p, q),
        _ => false,
    }
}

impl Caches {
    pub fn new(options: &Options) -> Self {
        Caches {
            backends: BTreeMap::new(),
            secrets: BTreeMap::new(),
            routes: BTreeMap::new(),
            config_sources: options.config_sources.clone(),
            dns_resolvers: options.dns_resolvers.clone(),
        }
    }

    pub fn route(
        &mut self,
        config: &ConfigSet,
        route: &Arc<HttpRoute>,
        stats: &mut TranslateStats,
    ) -> Arc<TranslatedRoute> {
        let key = route.key();
        if let Some(t) = self.routes.get(&key)
            && same(&t.route, route)
            && t.signature == backend_signature(config, route)
            && same_rate_limit(&t.rate_limit, &rate_limit_signature(config, route))
            && t.security == crate::security::route_policies(config, route)
        {
            stats.routes_reused += 1;
            return t.clone();
        }
        stats.routes_translated += 1;
        let t = Arc::new(translate_route(config, route));
        self.routes.insert(key, t.clone());
        t
    }

    /// The encoded resources of `backend` (with the BackendPolicy applying to it in `config`),
    /// re-encoding only the parts that changed.
    pub fn backend(
        &mut self,
        config: &ConfigSet,
        backend: &Arc<Backend>,
        stats: &mut TranslateStats,
    ) -> &BackendEntry {
        let key = backend.key();
        let inputs = ClusterInputs::compute(config, &key);
        let same_policy = |e: &BackendEntry| e.inputs == inputs;
        let env = cluster::ClusterEnv {
            sources: &self.config_sources,
            dns_resolvers: &self.dns_resolvers,
        };
        let entry = match self.backends.remove(&key) {
            Some(e) if same(&e.backend, backend) && same_policy(&e) => {
                stats.resources_reused += 2;
                e
            }
            Some(e) => {
                let cluster = if cluster::same_cluster(&e.backend, backend) && same_policy(&e) {
                    stats.resources_reused += 1;
                    e.cluster
                } else {
                    stats.resources_encoded += 1;
                    encode(&cluster::cluster(backend, &inputs, &env))
                };
                // Same endpoints: same kind (EDS or DNS), so the same load assignment or none.
                let load_assignment = if e.backend.spec.endpoints == backend.spec.endpoints {
                    stats.resources_reused += usize::from(e.load_assignment.is_some());
                    e.load_assignment
                } else {
                    let la = cluster::load_assignment(backend).map(|la| encode(&la));
                    stats.resources_encoded += usize::from(la.is_some());
                    la
                };
                BackendEntry {
                    backend: backend.clone(),
                    inputs,
                    cluster,
                    load_assignment,
                }
            }
            None => {
                let load_assignment = cluster::load_assignment(backend).map(|la| encode(&la));
                stats.resources_encoded += 1 + usize::from(load_assignment.is_some());
                BackendEntry {
                    backend: backend.clone(),
                    cluster: encode(&cluster::cluster(backend, &inputs, &env)),
                    inputs,
                    load_assignment,
                }
            }
        };
        self.backends.entry(key).or_insert(entry)
    }

    pub fn secret(&mut self, s: &Arc<Secret>, stats: &mut TranslateStats) -> Arc<Resource> {
        let key = s.key();
        if let Some(e) = self.secrets.get(&key)
            && same(&e.secret, s)
        {
            stats.resources_reused += 1;
            return e.resource.clone();
        }
        stats.resources_encoded += 1;
        let resource = encode(&secret::secret(s));
        self.secrets.insert(
            key,
            SecretEntry {
                secret: s.clone(),
                resource: resource.clone(),
            },
        );
        resource
    }
}

/// A route attached to the Gateway: where, and its (shared) translation.
struct RouteSlot {
    attachments: Vec<ListenerAttachment>,
    translated: Arc<TranslatedRoute>,
}

/// One virtual host of a route configuration.
#[derive(Default)]
struct HostState {
    /// The translated routes contributing to it, by route key.
    routes: HostRoutes<Arc<TranslatedRoute>>,
    /// A hostname of a listener sharing the route configuration, or of an HTTPS chain's own
    /// listener: kept even without routes.
    fixed: bool,
    /// The `*` catch-all of an HTTPS chain with a hostname, answering 421 (never has routes).
    misdirected: bool,
    /// The SecurityPolicy of the listener owning this host ([`crate::security::host_policy`]).
    security: Option<Arc<ballast_model::SecurityPolicy>>,
    /// The virtual host as an entry of `RouteConfiguration.virtual_hosts` (field key, length,
    /// message).
    encoded: Vec<u8>,
    /// The clusters its routes reference.
    clusters: Vec<Arc<str>>,
    /// With VHDS (`vhds_of` set): the virtual host as its own resource, named
    /// `{route configuration}/{host}` (also its message name: Envoy removes
    /// VHDS virtual hosts by that name), sharing `encoded`'s message bytes.
    vhds: Option<Arc<Resource>>,
}

/// The translated routes of one virtual host by route key, in key order: a sorted `Vec`,
/// because a `BTreeMap` allocates a whole node (11 entries, ~600 bytes) for the usual one
/// route per host (issue #13: 3,400 hosts at W4 spent ~2 MB on them).
struct HostRoutes<V>(Vec<(ObjectKey, V)>);

impl<V> Default for HostRoutes<V> {
    fn default() -> Self {
        HostRoutes(Vec::new())
    }
}

impl<V> HostRoutes<V> {
    /// As `BTreeMap::insert` (an existing key keeps its key and gets the value).
    fn insert(&mut self, key: ObjectKey, value: V) {
        match self.0.binary_search_by(|(k, _)| k.cmp(&key)) {
            Ok(i) => self.0[i].1 = value,
            Err(i) => {
                // Exact capacity for the usual handful, amortised growth beyond.
                if self.0.len() == self.0.capacity() && self.0.len() < 4 {
                    self.0.reserve_exact(1);
                }
                self.0.insert(i, (key, value));
            }
        }
    }

    fn remove(&mut self, key: &ObjectKey) {
        if let Ok(i) = self.0.binary_search_by(|(k, _)| k.cmp(key)) {
            self.0.remove(i);
        }
    }

    fn iter(&self) -> std::slice::Iter<'_, (ObjectKey, V)> {
        self.0.iter()
    }

    fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The VHDS resource name of `host` in route configuration `rc`. Envoy takes
/// the namespace as everything before the last `/`, and hostnames have none.
pub(crate) fn vhds_name(rc: &str, host: &str) -> String {
    format!("{rc}/{host}")
}

impl HostState {
    /// Encodes the virtual host; `vhds_of` is its route configuration's name
    /// when virtual hosts are served by VHDS.
    /// `redirect_port`: see [`encode_virtual_host`].
    fn encode(&mut self, host: &str, vhds_of: Option<&str>, redirect_port: u32) {
        self.encoded.clear();
        let name = vhds_of.map(|rc| vhds_name(rc, host));
        if self.misdirected {
            self.clusters = Vec::new();
            encode_misdirected_host(host, name.as_deref(), &mut self.encoded);
        } else {
            let extra = self
                .security
                .as_ref()
                .map(|p| crate::security::per_filter_config(p, 15))
                .unwrap_or_default();
            self.clusters = encode_virtual_host(
                host,
                name.as_deref(),
                self.routes.values(),
                &extra,
                redirect_port,
                &mut self.encoded,
            );
        }
        self.vhds = name.map(|name| {
            // `encoded` is the `virtual_hosts` field: key (1 byte), length, message.
            let mut rest = &self.encoded[1..];
            prost::encoding::decode_varint(&mut rest).expect("we just encoded the length");
            let refs = self
                .clusters
                .iter()
                .map(|c| Ref {
                    ty: ResourceType::Cluster,
                    name: c.clone(),
                    hard: true,
                })
                .collect();
            Resource::from_encoded::<VirtualHost>(&name, rest, refs)
                .expect("virtual host names are never empty")
        });
    }
}

/// One route configuration of the Gateway (one per HTTP port, one per HTTPS filter chain).
struct ChainState {
    name: String,
    hosts: BTreeMap<String, HostState>,
    /// Cluster name → number of virtual hosts referencing it.
    refs: BTreeMap<Arc<str>, u32>,
    /// `refs`' names as the route configuration's references, shared by its versions; `None`
    /// once the set of names changed (rebuilt on the next encoding).
    ref_list: Option<Arc<[Ref]>>,
    /// Without VHDS: the virtual hosts' encodings cut into chunks ([`build_blocks`]), which
    /// `resource` is made of; a patch rebuilds only the chunks of the hosts it touched.
    blocks: Blocks,
    resource: Arc<Resource>,
    /// Virtual hosts are served by VHDS (`Some`: the route configuration's
    /// `vhds.config_source`).
    vhds: Option<ConfigSource>,
    /// The listener port redirects keep ([`redirect_port`]).
    redirect_port: u32,
}

/// The port a redirect without scheme and port keeps: the listener's, or 0 (none in the
/// `Location`) for the protocol's well-known port, as Gateway API asks.
fn redirect_port(port: &crate::listener::PortPlan<'_>) -> u32 {
    match (port.protocol, port.port) {
        (ListenerProtocol::Http, 80) | (ListenerProtocol::Https, 443) => 0,
        (_, p) => p,
    }
}

impl ChainState {
    fn add_refs(&mut self, clusters: &[Arc<str>]) {
        for c in clusters {
            let n = self.refs.entry(c.clone()).or_default();
            if *n == 0 {
                self.ref_list = None;
            }
            *n += 1;
        }
    }

    fn remove_refs(&mut self, clusters: &[Arc<str>]) {
        for c in clusters {
            if let Some(n) = self.refs.get_mut(c) {
                *n -= 1;
                if *n == 0 {
                    self.refs.remove(c);
                    self.ref_list = None;
                }
            }
        }
    }

    /// The route configuration's references (`refs`' names), built only when they changed.
    fn ref_list(&mut self) -> Arc<[Ref]> {
        self.ref_list
            .get_or_insert_with(|| cluster_refs(&self.refs))
            .clone()
    }

    /// The route configuration after a patch that re-encoded or removed the virtual hosts
    /// `dirty` (already done in `hosts`): re-cuts the chunks around them, rebuilds only the
    /// chunks holding one of them (and the one before a host that starts or stops starting a
    /// chunk), and shares every other chunk with the current resource. Costs O(log hosts) per
    /// dirty host plus the bytes of the chunks rebuilt: neither the whole configuration nor
    /// its hosts up to the edited one are read.
    fn encode_patched(&mut self, dirty: &BTreeSet<String>) -> Arc<Resource> {
        patch_blocks(&self.hosts, &mut self.blocks, dirty);
        self.encode()
    }

    fn encode(&mut self) -> Arc<Resource> {
        // With VHDS the route configuration references nothing.
        let refs = match self.vhds {
            None => self.ref_list(),
            Some(_) => Arc::new([]),
        };
        encode_route_config(&self.name, &self.blocks, refs, self.vhds.as_ref())
    }
    fn vhds_of(&self) -> Option<&str> {
        self.vhds.as_ref().map(|_| self.name.as_str())
    }
}

/// The route configuration `name` with the virtual hosts cut into `blocks` (whose clusters are
/// the keys of `refs`): its name, then every virtual host in hostname order, exactly as prost
/// encodes `RouteConfiguration { name, virtual_hosts, ..Default::default() }`, as chunks: the
/// name field, then each block's shared bytes.
///
/// With VHDS it is only the name and where to fetch the virtual hosts: a
/// route edit changes one `VirtualHost` resource and never this one.
fn encode_route_config(
    name: &str,
    blocks: &Blocks,
    refs: Arc<[Ref]>,
    vhds: Option<&ConfigSource>,
) -> Arc<Resource> {
    if let Some(source) = vhds {
        return encode(&RouteConfiguration {
            name: name.to_owned(),
            vhds: Some(Vhds {
                config_source: Some(source.clone()),
            }),
            ..Default::default()
        });
    }
    let head = Bytes::from(route_config_head(name));
    let chunks = std::iter::once(head).chain(blocks.values().cloned());
    Resource::from_encoded_chunks_shared::<RouteConfiguration>(name, chunks, refs)
        .expect("route configuration names are never empty")
}

/// A route configuration's virtual hosts in chunks, by the hostname each starts with: `""`
/// for the hosts before the first that [`starts_block`] (possibly none), then each host that
/// does. A chunk is its hosts' encodings, concatenated.
type Blocks = BTreeMap<String, Bytes>;

/// Average size of a route configuration's chunks: large enough that the wire shares them
/// instead of copying them per stream (`codec::SHARE_MIN`, 16 KiB), small enough that an
/// edit copies and hashes little.
const BLOCK_BYTES: u64 = 32 * 1024;

/// Whether virtual host `host`, encoded in `len` bytes, starts a chunk: with probability
/// `len / BLOCK_BYTES`, decided by a hash of its name. Chunks average `BLOCK_BYTES` whatever
/// the hosts' sizes, and where they are cut depends only on the hosts themselves, so a
/// patched route configuration is cut exactly as one built from scratch.
fn starts_block(host: &str, len: usize) -> bool {
    !host.is_empty() && xxh3_64(host.as_bytes()) % BLOCK_BYTES < len as u64
}

/// The key of the chunk holding `host` (`inclusive`), or of the chunk before the one
/// `host` starts (`!inclusive`).
fn block_of<'a>(blocks: &'a Blocks, host: &str, inclusive: bool) -> &'a str {
    use std::ops::Bound::{Excluded, Included, Unbounded};
    let end = if inclusive {
        Included(host)
    } else {
        Excluded(host)
    };
    blocks
        .range::<str, _>((Unbounded, end))
        .next_back()
        .map_or("", |(k, _)| k.as_str())
}

/// The chunk `key` of `blocks`: the encodings of `hosts` from `key` up to the next chunk's.
fn build_block(hosts: &BTreeMap<String, HostState>, blocks: &Blocks, key: &str) -> Bytes {
    use std::ops::Bound::{Excluded, Included, Unbounded};
    let next = blocks
        .range::<str, _>((Excluded(key), Unbounded))
        .next()
        .map_or(Unbounded, |(k, _)| Excluded(k.as_str()));
    let run = || {
        hosts
            .range::<str, _>((Included(key), next))
            .map(|(_, s)| &s.encoded)
    };
    let mut buf = Vec::with_capacity(run().map(Vec::len).sum());
    for e in run() {
        buf.extend_from_slice(e);
    }
    Bytes::from(buf)
}

/// Re-cuts `blocks` after the hosts `dirty` were re-encoded, added or removed in `hosts`:
/// rebuilds only the chunks holding one of them (and the one before a host that starts or
/// stops starting a chunk). Gives [`build_blocks`]`(hosts)`.
fn patch_blocks(
    hosts: &BTreeMap<String, HostState>,
    blocks: &mut Blocks,
    dirty: &BTreeSet<String>,
) {
    let mut touched: BTreeSet<String> = BTreeSet::new();
    for h in dirty {
        let starts = hosts
            .get(h)
            .is_some_and(|s| starts_block(h, s.encoded.len()));
        if starts != blocks.contains_key(h.as_str()) && !h.is_empty() {
            // The chunk before it loses or gains its hosts.
            touched.insert(block_of(blocks, h, false).to_owned());
            if starts {
                blocks.insert(h.clone(), Bytes::new());
            } else {
                blocks.remove(h.as_str());
            }
        }
        touched.insert(block_of(blocks, h, true).to_owned());
    }
    for key in touched {
        if blocks.contains_key(&key) {
            let block = build_block(hosts, blocks, &key);
            blocks.insert(key, block);
        }
    }
}

/// `hosts` cut into chunks from scratch (see [`Blocks`]).
fn build_blocks(hosts: &BTreeMap<String, HostState>) -> Blocks {
    let mut blocks: Blocks = std::iter::once((String::new(), Bytes::new()))
        .chain(
            hosts
                .iter()
                .filter(|(h, s)| starts_block(h, s.encoded.len()))
                .map(|(h, _)| (h.clone(), Bytes::new())),
        )
        .collect();
    let keys: Vec<String> = blocks.keys().cloned().collect();
    for key in keys {
        let block = build_block(hosts, &blocks, &key);
        blocks.insert(key, block);
    }
    blocks
}

/// The encoded `RouteConfiguration.name` field: what precedes the virtual hosts.
fn route_config_head(name: &str) -> Vec<u8> {
    let mut head = Vec::with_capacity(name.len() + 8);
    encode_key(1, WireType::LengthDelimited, &mut head);
    encode_varint(name.len() as u64, &mut head);
    head.extend_from_slice(name.as_bytes());
    head
}

/// A route configuration's references: hard ones to each cluster named in `refs` (sorted
/// and distinct, being a map's keys).
fn cluster_refs(refs: &BTreeMap<Arc<str>, u32>) -> Arc<[Ref]> {
    refs.keys()
        .map(|name| Ref {
            ty: ResourceType::Cluster,
            name: name.clone(),
            hard: true,
        })
        .collect()
}

/// Everything kept about a translated Gateway so the next change costs what it touches.
pub(crate) struct GatewayState {
    pub gateway: Arc<Gateway>,
    pub resources: Arc<GatewayResources>,
    /// Attached routes.
    routes: BTreeMap<ObjectKey, RouteSlot>,
    /// Backend → number of attached routes whose backendRefs name it (the index's
    /// `Deps::backends`).
    backend_refs: BTreeMap<ObjectKey, u32>,
    /// Backend → number of (route configuration, route) pairs sending traffic to it: the
    /// Gateway's clusters.
    used: BTreeMap<ObjectKey, u32>,
    /// In plan order (ports, then chains).
    chains: Vec<ChainState>,
    listeners: BTreeMap<String, (EnvoyListener, Arc<Resource>)>,
    /// The [`crate::ResourcesVersion::version`] `resources` had when last output (0: none).
    version: u64,
    /// Resources patched since (type, name): what a snapshot of `version` needs changed.
    pending: Vec<(ResourceType, Arc<str>)>,
}

impl GatewayState {
    /// Records that the resource `ty`/`name` was added, removed or replaced.
    pub(crate) fn touch(&mut self, ty: ResourceType, name: &Arc<str>) {
        self.pending.push((ty, name.clone()));
    }

    /// The version last output and what is pending since (for [`Self::restore_version`]).
    pub(crate) fn take_version(&mut self) -> (u64, Vec<(ResourceType, Arc<str>)>) {
        (self.version, std::mem::take(&mut self.pending))
    }

    /// Keeps counting from a version output by an earlier state of the same resources.
    pub(crate) fn restore_version(
        &mut self,
        (version, pending): (u64, Vec<(ResourceType, Arc<str>)>),
    ) {
        self.version = version;
        self.pending = pending;
    }

    /// `resources` are output as `version`: with the patch since the version before when
    /// `patched` (only touched through [`Self::touch`] since) and there was one.
    pub(crate) fn output_version(
        &mut self,
        version: u64,
        patched: bool,
    ) -> crate::ResourcesVersion {
        let pending = std::mem::take(&mut self.pending);
        let patch = (patched && self.version != 0).then_some(crate::ResourcePatch {
            base: self.version,
            touched: pending,
        });
        self.version = version;
        crate::ResourcesVersion { version, patch }
    }
}

fn encode_reusing<M: XdsResource + PartialEq + Clone>(
    prev: Option<&BTreeMap<String, (M, Arc<Resource>)>>,
    next: &mut BTreeMap<String, (M, Arc<Resource>)>,
    msg: M,
    stats: &mut TranslateStats,
) -> Arc<Resource> {
    let name = msg.resource_name().to_owned();
    let resource = match prev.and_then(|p| p.get(&name)) {
        Some((old, r)) if *old == msg => {
            stats.resources_reused += 1;
            r.clone()
        }
        _ => {
            stats.resources_encoded += 1;
            encode(&msg)
        }
    };
    next.insert(name, (msg, resource.clone()));
    resource
}

fn count_up<'a>(map: &mut BTreeMap<ObjectKey, u32>, keys: impl IntoIterator<Item = &'a ObjectKey>) {
    for k in keys {
        *map.entry(k.clone()).or_default() += 1;
    }
}

/// Decrements; returns the keys that dropped to zero (and were removed).
fn count_down<'a>(
    map: &mut BTreeMap<ObjectKey, u32>,
    keys: impl IntoIterator<Item = &'a ObjectKey>,
) -> Vec<ObjectKey> {
    let mut gone = Vec::new();
    for k in keys {
        if let Some(n) = map.get_mut(k) {
            *n -= 1;
            if *n == 0 {
                map.remove(k);
                gone.push(k.clone());
            }
        }
    }
    gone
}

pub(crate) struct Built {
    pub state: GatewayState,
    pub deps: Deps,
}

/// Translates one Gateway; `None` if it does not exist. `prev` (the Gateway's previous state)
/// only saves work: virtual hosts with the same contributing routes and identical listeners
/// are not re-encoded.
pub(crate) fn build_gateway(
    config: &ConfigSet,
    key: &ObjectKey,
    options: &Options,
    caches: &mut Caches,
    prev: Option<GatewayState>,
    stats: &mut TranslateStats,
) -> Option<Built> {
    let gw = config.gateways.get(key)?;
    stats.gateways_translated += 1;
    let mut deps = Deps {
        routes: BTreeSet::new(),
        backends: BTreeSet::new(),
        secrets: certificate_refs(gw).collect(),
    };
    let mut routes = BTreeMap::new();
    let mut backend_refs = BTreeMap::new();
    for (rk, route) in &config.http_routes {
        if !names_gateway(route, key) {
            continue;
        }
        deps.routes.insert(rk.clone());
        let attachments = config.route_attachments(key, route);
        if attachments.is_empty() {
            continue;
        }
        let translated = caches.route(config, route, stats);
        count_up(&mut backend_refs, translated.backend_refs.iter());
        routes.insert(
            rk.clone(),
            RouteSlot {
                attachments,
                translated,
            },
        );
    }
    // TLS and TCP ports: their routes' Backends count like an HTTPRoute's (one reference per
    // route, one use per chain), so patching HTTPRoutes later never drops them. L4 route
    // changes rebuild the Gateway (`Translator::update`), so their counts never need patching.
    let l4 = crate::l4::plan(config, gw, options);
    for (b, n) in &l4.refs {
        *backend_refs.entry(b.clone()).or_default() += n;
    }
    // The rate-limit service's cluster, used by the connection manager's global filter.
    let rate_limit_service = crate::rate_limit::service_backend(config, gw);
    if let Some(svc) = &rate_limit_service {
        count_up(&mut backend_refs, &BTreeSet::from([svc.clone()]));
    }
    // Backends SecurityPolicies fetch from (remote JWKS) count like one more route using
    // them, so route patches never drop their clusters or index entries.
    let policy_backends = crate::security::policy_backends(config, key);
    count_up(&mut backend_refs, &policy_backends);
    deps.backends = backend_refs.keys().cloned().collect();

    let mut prev_chains: BTreeMap<String, ChainState> = BTreeMap::new();
    let mut prev_listeners = None;
    if let Some(p) = prev {
        prev_chains = p.chains.into_iter().map(|c| (c.name.clone(), c)).collect();
        prev_listeners = Some(p.listeners);
    }
    let mut resources = GatewayResources::empty(key.clone());
    let mut used = BTreeMap::new();
    count_up(&mut used, &policy_backends);
    let mut chains = Vec::new();
    let mut listeners = BTreeMap::new();
    let mut used_secrets = BTreeSet::new();
    let security = crate::security::gateway_policies(config, key);
    for port in plan(config, gw) {
        for chain in &port.chains {
            let mut hosts: BTreeMap<String, HostState> = BTreeMap::new();
            for (rk, slot) in &routes {
                let contributed =
                    contributions(&chain.listeners, &chain.siblings, &slot.attachments);
                if contributed.is_empty() {
                    continue;
                }
                count_up(&mut used, slot.translated.clusters.iter());
                for h in contributed {
                    hosts
                        .entry(h.to_owned())
                        .or_default()
                        .routes
                        .insert(rk.clone(), slot.translated.clone());
                }
            }
            for h in fixed_hosts(&chain.listeners) {
                hosts.entry(h.to_owned()).or_default().fixed = true;
            }
            if let Some(sni) = &chain.server_name {
                // The chain's own hostname answers 404 when no route matches; any other host
                // reached this chain through another listener's SNI and gets 421.
                hosts.entry(sni.clone()).or_default().fixed = true;
                let siblings = chain.siblings.iter().filter_map(|l| l.hostname());
                for h in std::iter::once(ANY_HOST).chain(siblings) {
                    let m = hosts.entry(h.to_owned()).or_default();
                    m.fixed = true;
                    m.misdirected = true;
                }
            }
            for (h, state) in hosts.iter_mut() {
                if !state.misdirected {
                    state.security = crate::security::host_policy(config, key, &chain.listeners, h);
                }
            }
            let mut old = prev_chains.remove(&chain.route_config);
            let vhds = caches
                .config_sources
                .splits_routes()
                .then(|| crate::config_source(&caches.config_sources));
            let vhds_of = vhds.as_ref().map(|_| chain.route_config.as_str());
            let mut reused_all = old.as_ref().is_some_and(|o| o.hosts.len() == hosts.len());
            for (h, state) in hosts.iter_mut() {
                let same = old.as_mut().and_then(|o| o.hosts.get_mut(h)).filter(|o| {
                    o.misdirected == state.misdirected
                        && o.security == state.security
                        && o.routes.len() == state.routes.len()
                        && o.routes
                            .iter()
                            .zip(state.routes.iter())
                            .all(|((a, x), (b, y))| a == b && Arc::ptr_eq(x, y))
                });
                match same {
                    Some(o) => {
                        state.encoded = std::mem::take(&mut o.encoded);
                        state.clusters = std::mem::take(&mut o.clusters);
                        state.vhds = o.vhds.take();
                    }
                    None => {
                        reused_all = false;
                        state.encode(h, vhds_of, redirect_port(&port));
                    }
                }
            }
            let mut refs = BTreeMap::new();
            for h in hosts.values() {
                for c in &h.clusters {
                    *refs.entry(c.clone()).or_default() += 1;
                }
            }
            let (resource, ref_list, blocks) = match old {
                Some(o) if reused_all => {
                    stats.resources_reused += 1;
                    (o.resource, None, o.blocks)
                }
                _ => {
                    stats.resources_encoded += 1;
                    let list = vhds.is_none().then(|| cluster_refs(&refs));
                    let blocks = if vhds.is_none() {
                        build_blocks(&hosts)
                    } else {
                        Blocks::new()
                    };
                    let resource = encode_route_config(
                        &chain.route_config,
                        &blocks,
                        list.clone().unwrap_or_else(|| Arc::new([])),
                        vhds.as_ref(),
                    );
                    (resource, list, blocks)
                }
            };
            resources
                .virtual_hosts
                .extend(hosts.values().filter_map(|h| h.vhds.clone()));
            let state = ChainState {
                name: chain.route_config.clone(),
                hosts,
                refs,
                ref_list,
                blocks,
                resource,
                vhds,
                redirect_port: redirect_port(&port),
            };
            resources.route_configs.push(state.resource.clone());
            used_secrets.extend(chain.certificates.iter().cloned());
            chains.push(state);
        }
        for l in envoy_listeners(config, gw, &port, options, &security) {
            let r = encode_reusing(prev_listeners.as_ref(), &mut listeners, l, stats);
            resources.listeners.push(r);
        }
    }
    for l in l4.listeners {
        let r = encode_reusing(prev_listeners.as_ref(), &mut listeners, l, stats);
        resources.listeners.push(r);
    }
    for (b, n) in &l4.used {
        *used.entry(b.clone()).or_default() += n;
    }
    used_secrets.extend(l4.secrets);
    if l4.rejects {
        let r = encode(&crate::l4::reject_cluster());
        resources.clusters.push(r);
    }
    if let Some(svc) = rate_limit_service {
        count_up(&mut used, &BTreeSet::from([svc]));
    }
    // Collector Backends of the connection managers' tracers are clusters of the Gateway and
    // dependencies like a route's backends (counted once each, so route patches never drop them).
    let collectors = crate::otel::tracing_backends(config, key);
    count_up(&mut used, &collectors);
    count_up(&mut backend_refs, &collectors);
    deps.backends.extend(collectors);
    for b in used.keys() {
        // Used backends resolved when their routes were translated against this config.
        if let Some(backend) = config.backend(b) {
            let e = caches.backend(config, backend, stats);
            resources.clusters.push(e.cluster.clone());
            resources.load_assignments.extend(e.load_assignment.clone());
        }
    }
    for s in &used_secrets {
        if let Some(secret) = config.secrets.get(s) {
            resources.secrets.push(caches.secret(secret, stats));
        }
    }
    resources.sort();
    Some(Built {
        state: GatewayState {
            gateway: gw.clone(),
            resources: Arc::new(resources),
            routes,
            backend_refs,
            used,
            chains,
            listeners,
            version: 0,
            pending: Vec::new(),
        },
        deps,
    })
}

/// Applies changes of `changed` routes (edited, added or removed) to the state of Gateway
/// `key`, which must be otherwise unaffected: the Gateway, its Secrets and the Backends its
/// other routes reference are unchanged (or only changed endpoints), so every other route's
/// attachment and translation still holds. Re-encodes only the virtual hosts the changed
/// routes touched (before or after) and updates the index in place. Gives the same state and
/// resources as [`build_gateway`]. Returns whether the resources changed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn patch_routes(
    config: &ConfigSet,
    key: &ObjectKey,
    state: &mut GatewayState,
    changed: &[ObjectKey],
    caches: &mut Caches,
    index: &mut DependencyIndex,
    orphans: &mut Orphans,
    stats: &mut TranslateStats,
) -> bool {
    let gw = state.gateway.clone();
    stats.gateways_translated += 1;
    let plan = plan(config, &gw);
    let chains: Vec<&ChainPlan> = plan.iter().flat_map(|p| &p.chains).collect();
    debug_assert_eq!(chains.len(), state.chains.len());
    let mut dirty: Vec<BTreeSet<String>> = vec![BTreeSet::new(); chains.len()];
    let mut used_touched: BTreeSet<ObjectKey> = BTreeSet::new();
    for rk in changed {
        let route = config.http_routes.get(rk);
        let naming = route.is_some_and(|r| names_gateway(r, key));
        index.set_route(key, rk, naming, orphans);
        let new = route.filter(|_| naming).and_then(|r| {
            let attachments = config.route_attachments(key, r);
            (!attachments.is_empty()).then(|| RouteSlot {
                attachments,
                translated: caches.route(config, r, stats),
            })
        });
        let old = state.routes.remove(rk);
        // Counts go up for the new version before they go down for the old one, so an
        // unchanged dependency never drops out in between.
        if let Some(n) = &new {
            for b in n.translated.backend_refs.iter() {
                let c = state.backend_refs.entry(b.clone()).or_default();
                *c += 1;
                if *c == 1 {
                    index.set_backend(key, b, true, orphans);
                }
            }
        }
        if let Some(o) = &old {
            for b in count_down(&mut state.backend_refs, o.translated.backend_refs.iter()) {
                index.set_backend(key, &b, false, orphans);
            }
        }
        for (i, chain) in chains.iter().enumerate() {
            let cs = &mut state.chains[i];
            let before = old
                .as_ref()
                .map(|o| contributions(&chain.listeners, &chain.siblings, &o.attachments))
                .unwrap_or_default();
            let after = new
                .as_ref()
                .map(|n| contributions(&chain.listeners, &chain.siblings, &n.attachments))
                .unwrap_or_default();
            if let Some(n) = new.as_ref().filter(|_| !after.is_empty()) {
                count_up(&mut state.used, n.translated.clusters.iter());
                used_touched.extend(n.translated.clusters.iter().cloned());
            }
            if let Some(o) = old.as_ref().filter(|_| !before.is_empty()) {
                count_down(&mut state.used, o.translated.clusters.iter());
                used_touched.extend(o.translated.clusters.iter().cloned());
            }
            for h in before {
                if let Some(hs) = cs.hosts.get_mut(h) {
                    hs.routes.remove(rk);
                }
                dirty[i].insert(h.to_owned());
            }
            if let Some(n) = &new {
                for h in after {
                    cs.hosts
                        .entry(h.to_owned())
                        .or_default()
                        .routes
                        .insert(rk.clone(), n.translated.clone());
                    dirty[i].insert(h.to_owned());
                }
            }
        }
        if let Some(n) = new {
            state.routes.insert(rk.clone(), n);
        }
    }

    let res = Arc::make_mut(&mut state.resources);
    let mut changed_any = false;
    for (i, (cs, hosts)) in state.chains.iter_mut().zip(dirty).enumerate() {
        if hosts.is_empty() {
            continue;
        }
        let vhds_of = cs.vhds_of().map(str::to_owned);
        let redirect_port = cs.redirect_port;
        let patched = vhds_of.is_none().then(|| hosts.clone());
        for h in hosts {
            let Some(hs) = cs.hosts.get_mut(&h) else {
                continue;
            };
            let old_clusters = std::mem::take(&mut hs.clusters);
            let old_vhds = hs.vhds.take();
            let mut new_vhds = None;
            if hs.routes.is_empty() && !hs.fixed {
                cs.hosts.remove(&h);
            } else {
                if !hs.misdirected {
                    hs.security =
                        crate::security::host_policy(config, key, &chains[i].listeners, &h);
                }
                hs.encode(&h, vhds_of.as_deref(), redirect_port);
                new_vhds = hs.vhds.clone();
                let new_clusters = hs.clusters.clone();
                cs.add_refs(&new_clusters);
            }
            cs.remove_refs(&old_clusters);
            if let Some(rc) = &vhds_of {
                // One virtual host changed: only its resource is replaced.
                let name = vhds_name(rc, &h);
                state
                    .pending
                    .push((ResourceType::VirtualHost, name.as_str().into()));
                let at = res.virtual_hosts.binary_search_by(|r| r.name().cmp(&name));
                match (at, new_vhds) {
                    (Ok(i), Some(n)) => {
                        if *n != *res.virtual_hosts[i] {
                            changed_any = true;
                        }
                        res.virtual_hosts[i] = n;
                    }
                    (Ok(i), None) => {
                        res.virtual_hosts.remove(i);
                        changed_any = true;
                    }
                    (Err(i), Some(n)) => {
                        res.virtual_hosts.insert(i, n);
                        changed_any = true;
                    }
                    (Err(_), None) => {}
                }
                let _ = old_vhds;
            }
        }
        stats.resources_encoded += 1;
        let resource = match &patched {
            Some(dirty) => cs.encode_patched(dirty),
            None => cs.encode(),
        };
        if *resource != *cs.resource {
            changed_any = true;
            let i = res
                .route_configs
                .binary_search_by(|r| r.name().cmp(&cs.name))
                .expect("every route configuration is in the resources");
            res.route_configs[i] = resource.clone();
            state.pending.push((
                ResourceType::RouteConfiguration,
                resource.name_arc().clone(),
            ));
        }
        cs.resource = resource;
    }
    for b in used_touched {
        let name = names::cluster(&b);
        let arc: Arc<str> = name.as_str().into();
        state.pending.push((ResourceType::Cluster, arc.clone()));
        state
            .pending
            .push((ResourceType::ClusterLoadAssignment, arc));
        let at = res.clusters.binary_search_by(|r| r.name().cmp(&name));
        let backend = config.backend(&b);
        match (at, state.used.contains_key(&b), backend) {
            (Err(ci), true, Some(backend)) => {
                let e = caches.backend(config, backend, stats);
                res.clusters.insert(ci, e.cluster.clone());
                if let Some(la) = &e.load_assignment {
                    let li = res
                        .load_assignments
                        .binary_search_by(|r| r.name().cmp(&name))
                        .expect_err("no load assignment without its cluster");
                    res.load_assignments.insert(li, la.clone());
                }
                changed_any = true;
            }
            (Ok(ci), false, _) => {
                res.clusters.remove(ci);
                // A DNS cluster has none.
                if let Ok(li) = res
                    .load_assignments
                    .binary_search_by(|r| r.name().cmp(&name))
                {
                    res.load_assignments.remove(li);
                }
                changed_any = true;
            }
            _ => {}
        }
    }
    changed_any
}

#[cfg(test)]
mod host_routes_tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// `HostRoutes` behaves as the `BTreeMap` it replaces: same entries in the same order
        /// (`encode_virtual_host` breaks precedence ties by it).
        #[test]
        fn host_routes_equal_a_btreemap(ops in proptest::collection::vec((any::<bool>(), 0u8..12, any::<u32>()), 0..60)) {
            let mut got = HostRoutes::default();
            let mut want = BTreeMap::new();
            for (insert, k, v) in ops {
                let key = ObjectKey::new("ns", format!("r{k}"));
                if insert {
                    got.insert(key.clone(), v);
                    want.insert(key, v);
                } else {
                    got.remove(&key);
                    want.remove(&key);
                }
                prop_assert_eq!(got.len(), want.len());
                prop_assert_eq!(got.is_empty(), want.is_empty());
                prop_assert!(got.iter().map(|(k, v)| (k, v)).eq(want.iter()));
                prop_assert!(got.values().eq(want.values()));
            }
        }
    }

    proptest! {
        /// A route configuration's chunks patched after any edits of its hosts (added,
        /// removed, resized: a host may start or stop starting a chunk) are the chunks cut
        /// from scratch, and hold every host's bytes in hostname order.
        #[test]
        fn patched_blocks_equal_blocks_from_scratch(
            start in proptest::collection::btree_map(0u16..300, 0usize..6000, 0..40),
            edits in proptest::collection::vec(
                proptest::collection::btree_map(0u16..300, proptest::option::of(0usize..6000), 1..6),
                1..12,
            ),
        ) {
            let host = |n: u16, len: usize| HostState {
                encoded: vec![(n % 251) as u8; len],
                ..Default::default()
            };
            let mut hosts: BTreeMap<String, HostState> = start
                .iter()
                .map(|(&n, &len)| (format!("h{n}.example"), host(n, len)))
                .collect();
            let mut blocks = build_blocks(&hosts);
            for edit in edits {
                let mut dirty = BTreeSet::new();
                for (n, len) in edit {
                    let name = format!("h{n}.example");
                    match len {
                        Some(len) => hosts.insert(name.clone(), host(n, len)),
                        None => hosts.remove(&name),
                    };
                    dirty.insert(name);
                }
                patch_blocks(&hosts, &mut blocks, &dirty);
                let scratch = build_blocks(&hosts);
                prop_assert_eq!(&blocks, &scratch);
                let all: Vec<u8> = hosts.values().flat_map(|h| h.encoded.iter().copied()).collect();
                let chunks: Vec<u8> = blocks.values().flat_map(|b| b.iter().copied()).collect();
                prop_assert_eq!(all, chunks);
            }
        }
    }

    /// Chunks average [`BLOCK_BYTES`] whatever the hosts' sizes: 10,000 hosts of 87 bytes
    /// (W3's) make a few dozen chunks, not one and not thousands.
    #[test]
    fn blocks_average_their_target_size() {
        let hosts: BTreeMap<String, HostState> = (0..10_000)
            .map(|i| {
                let h = HostState {
                    encoded: vec![0; 87],
                    ..Default::default()
                };
                (format!("host-{i}.example.com"), h)
            })
            .collect();
        let blocks = build_blocks(&hosts);
        assert!((10..=60).contains(&blocks.len()), "{} chunks", blocks.len());
    }

    #[test]
    fn one_route_per_host_has_no_spare_room() {
        let mut h = HostRoutes::default();
        h.insert(ObjectKey::new("ns", "r"), 1u32);
        assert_eq!(h.0.capacity(), 1);
        h.insert(ObjectKey::new("ns", "q"), 2u32);
        assert_eq!(h.0.capacity(), 2);
    }
}
