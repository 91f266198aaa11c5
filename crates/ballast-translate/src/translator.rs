//! The incremental [`Translator`].
//!
//! On each new config it diffs the previous [`ConfigSet`] against the new one, uses the
//! dependency index to find the Gateways each changed object affects, and rebuilds only those.
//! A Backend change that only touches its endpoints (or other cluster settings, but not whether
//! it resolves nor its load-balancing policy) does not change any route: the affected Gateways
//! get the re-encoded cluster/load assignment swapped into their lists, with no route or
//! listener work at all.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ballast_model::set::{Change, ChangeKind};
use ballast_model::{ConfigSet, Kind, ObjectKey, ObjectMap};
use ballast_xds::ResourceType;

use crate::gateway::{Caches, GatewayState, build_gateway, patch_routes};
use crate::index::{DependencyIndex, Orphans};
use crate::policy::{
    backends_using_object, gateways_using_object, hash_key, targeted_backends, targeted_gateways,
    tls_targeted_backends,
};
use crate::{GatewayResources, Options, names};

/// Counts of work done by one [`Translator::update`] (or a from-scratch translation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TranslateStats {
    /// Gateways rebuilt (routes → virtual hosts → route configurations, listeners).
    pub gateways_translated: usize,
    /// Gateways that only had Backend resources swapped in (endpoint changes).
    pub gateways_patched: usize,
    /// HTTPRoutes translated to Envoy routes.
    pub routes_translated: usize,
    /// HTTPRoutes whose cached Envoy routes were reused.
    pub routes_reused: usize,
    /// Resources encoded.
    pub resources_encoded: usize,
    /// Resources reused instead of re-encoded (per use: a Backend used by two rebuilt gateways
    /// counts twice).
    pub resources_reused: usize,
}

/// The result of [`Translator::update`].
#[derive(Clone, Debug, Default)]
pub struct TranslateOutput {
    /// Gateways whose resources changed (or are new), with their new full resource set.
    pub changed: BTreeMap<ObjectKey, Arc<GatewayResources>>,
    /// For every gateway of `changed`: its resources' version, and what changed since the
    /// version before when the translator knows (route and endpoint patches), so a snapshot
    /// can be derived from the previous one in O(change) ([`GatewayResources::snapshot_patched`]).
    pub versions: BTreeMap<ObjectKey, ResourcesVersion>,
    /// Gateways that no longer exist.
    pub removed: Vec<ObjectKey>,
    pub stats: TranslateStats,
}

/// One version of a Gateway's resources as output by a [`Translator`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourcesVersion {
    /// Increases with every output of the translator (unique per translator, not across).
    pub version: u64,
    /// What differs from an earlier version; `None` after a rebuild.
    pub patch: Option<ResourcePatch>,
}

/// The resources that may differ between two versions of a Gateway's resources.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourcePatch {
    /// The version these changes apply to.
    pub base: u64,
    /// Type and name of each resource added, removed or replaced since `base` (a name may
    /// repeat); every other resource is the same as in `base`.
    pub touched: Vec<(ResourceType, Arc<str>)>,
}

/// Incremental translator: keeps the previous config, per-object caches and the dependency index.
pub struct Translator {
    options: Options,
    config: Arc<ConfigSet>,
    caches: Caches,
    index: DependencyIndex,
    gateways: BTreeMap<ObjectKey, GatewayState>,
    /// The last [`ResourcesVersion::version`] given out.
    last_version: u64,
}

impl Translator {
    pub fn new(options: Options) -> Self {
        Translator {
            caches: Caches::new(&options),
            options,
            config: Arc::new(ConfigSet::default()),
            index: DependencyIndex::default(),
            gateways: BTreeMap::new(),
            last_version: 0,
        }
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The config last applied, as translated (GRPCRoutes as HTTPRoutes, see [`crate::grpc`]).
    pub fn config(&self) -> &Arc<ConfigSet> {
        &self.config
    }

    /// The dependency index (for tests and debugging).
    pub fn index(&self) -> &DependencyIndex {
        &self.index
    }

    /// The current resources of a Gateway.
    pub fn gateway(&self, key: &ObjectKey) -> Option<Arc<GatewayResources>> {
        self.gateways.get(key).map(|g| g.resources.clone())
    }

    /// Every Gateway with its current resources.
    pub fn gateways(&self) -> impl Iterator<Item = (&ObjectKey, &Arc<GatewayResources>)> {
        self.gateways.iter().map(|(k, g)| (k, &g.resources))
    }

    /// Applies a whole new config. Returns the gateways whose resources changed, with their new
    /// full resource set, and the gateways removed.
    pub fn update(&mut self, config: &Arc<ConfigSet>) -> TranslateOutput {
        let config = &crate::grpc::translation_view(config);
        let old = std::mem::replace(&mut self.config, config.clone());
        let mut out = TranslateOutput::default();
        let mut rebuild: BTreeSet<ObjectKey> = BTreeSet::new();
        // Gateways only some of whose routes changed, with those routes.
        let mut route_changes: BTreeMap<ObjectKey, Vec<ObjectKey>> = BTreeMap::new();
        let mut patch: BTreeMap<ObjectKey, BTreeSet<ObjectKey>> = BTreeMap::new();
        let changes = diff(&old, config);
        for c in &changes {
            match c.kind {
                Kind::Gateway => {
                    rebuild.insert(c.key.clone());
                }
                Kind::HttpRoute => {
                    let mut affected: BTreeSet<ObjectKey> =
                        self.index.gateways_of_route(&c.key).cloned().collect();
                    if let Some(r) = config.http_routes.get(&c.key) {
                        let ns = r.metadata.namespace.as_str();
                        affected.extend(
                            r.spec
                                .parent_refs
                                .iter()
                                .filter(|p| p.is_gateway())
                                .map(|p| ObjectKey::new(p.namespace_or(ns), p.name.as_str())),
                        );
                    }
                    // A route with a RateLimitPolicy of its own decides which rate-limit
                    // filters its Gateways' connection managers carry, and a route a
                    // SecurityPolicy names which policies (JWT providers): rebuild them.
                    if crate::rate_limit::targets_route(&old, &c.key)
                        || crate::rate_limit::targets_route(config, &c.key)
                        || crate::security::route_targeted(&old, &c.key)
                        || crate::security::route_targeted(config, &c.key)
                    {
                        rebuild.extend(affected);
                        continue;
                    }
                    for g in affected {
                        route_changes.entry(g).or_default().push(c.key.clone());
                    }
                }
                Kind::RateLimitPolicy => {
                    // Connection-manager filters and the targeted routes' per-filter configs:
                    // rebuild every Gateway either version can reach.
                    for p in [
                        old.rate_limit_policies.get(&c.key),
                        config.rate_limit_policies.get(&c.key),
                    ]
                    .into_iter()
                    .flatten()
                    {
                        rebuild.extend(crate::rate_limit::affected_gateways(&old, p));
                        rebuild.extend(crate::rate_limit::affected_gateways(config, p));
                    }
                }
                Kind::Backend
                    if crate::rate_limit::is_service(&old, &c.key)
                        || crate::rate_limit::is_service(config, &c.key) =>
                {
                    // Whether a rate-limit service is usable (exists, speaks gRPC) decides
                    // the filters and routes of the Gateways its policies reach.
                    rebuild.extend(self.index.gateways_of_backend(&c.key).cloned());
                    for set in [&old, config] {
                        for p in set.rate_limit_policies.values() {
                            if p.spec
                                .global
                                .as_ref()
                                .is_some_and(|g| g.backend_key(&p.metadata.namespace) == c.key)
                            {
                                rebuild.extend(crate::rate_limit::affected_gateways(set, p));
                            }
                        }
                    }
                }
                Kind::Backend => {
                    let users = self.index.gateways_of_backend(&c.key).cloned();
                    let routes_unchanged = c.change == ChangeKind::Modified
                        && old.backend(&c.key).map(|b| hash_key(&old, b))
                            == config.backend(&c.key).map(|b| hash_key(config, b));
                    if routes_unchanged {
                        for g in users {
                            patch.entry(g).or_default().insert(c.key.clone());
                        }
                    } else {
                        rebuild.extend(users);
                    }
                }
                Kind::BackendPolicy => {
                    // Every Backend either version names may change policy (the winner of a
                    // conflict can change too); only their clusters change, unless the hash
                    // key routes carry does.
                    let versions = [
                        old.backend_policies.get(&c.key),
                        config.backend_policies.get(&c.key),
                    ];
                    let targets: BTreeSet<ObjectKey> = versions
                        .into_iter()
                        .flatten()
                        .flat_map(|p| targeted_backends(p))
                        .collect();
                    for b in targets {
                        let (Some(ob), Some(nb)) = (old.backend(&b), config.backend(&b)) else {
                            continue; // the Backend's own change (if any) handles it
                        };
                        let users = self.index.gateways_of_backend(&b).cloned();
                        if hash_key(&old, ob) == hash_key(config, nb) {
                            for g in users {
                                patch.entry(g).or_default().insert(b.clone());
                            }
                        } else {
                            rebuild.extend(users);
                        }
                    }
                }
                Kind::ClientPolicy => {
                    // Listener-level settings: rebuild the Gateways either version names.
                    for p in [
                        old.client_policies.get(&c.key),
                        config.client_policies.get(&c.key),
                    ]
                    .into_iter()
                    .flatten()
                    {
                        rebuild.extend(targeted_gateways(p));
                    }
                }
                Kind::SecurityPolicy => {
                    // Filters, providers and per-route config of the Gateways either version
                    // affects (directly, or through the HTTPRoutes it names).
                    if let Some(p) = old.security_policies.get(&c.key) {
                        rebuild.extend(crate::security::policy_gateways(&old, p));
                    }
                    if let Some(p) = config.security_policies.get(&c.key) {
                        rebuild.extend(crate::security::policy_gateways(config, p));
                    }
                }
                Kind::Secret | Kind::ConfigMap | Kind::BackendTlsPolicy => {
                    if c.kind == Kind::ConfigMap {
                        // JWKS of SecurityPolicies.
                        rebuild.extend(crate::security::gateways_using_config_map(&old, &c.key));
                        rebuild.extend(crate::security::gateways_using_config_map(config, &c.key));
                    }
                    if c.kind == Kind::Secret {
                        rebuild.extend(self.index.gateways_of_secret(&c.key).cloned());
                    }
                    if c.kind != Kind::BackendTlsPolicy {
                        // Client CA bundles of ClientPolicies.
                        rebuild.extend(gateways_using_object(&old, c.kind, &c.key));
                        rebuild.extend(gateways_using_object(config, c.kind, &c.key));
                    }
                    // CA bundles, client certificates and upstream TLS only change clusters.
                    let mut backends: BTreeSet<ObjectKey> = BTreeSet::new();
                    if c.kind == Kind::BackendTlsPolicy {
                        for p in [
                            old.backend_tls_policies.get(&c.key),
                            config.backend_tls_policies.get(&c.key),
                        ]
                        .into_iter()
                        .flatten()
                        {
                            backends.extend(tls_targeted_backends(p));
                        }
                    } else {
                        backends.extend(backends_using_object(&old, c.kind, &c.key));
                        backends.extend(backends_using_object(config, c.kind, &c.key));
                    }
                    for b in backends {
                        if old.backend(&b).is_some() && config.backend(&b).is_some() {
                            for g in self.index.gateways_of_backend(&b) {
                                patch.entry(g.clone()).or_default().insert(b.clone());
                            }
                        }
                    }
                }
                // The view holds GRPCRoutes as HTTPRoutes (`crate::grpc`).
                Kind::GrpcRoute => {}
                // TLS/TCP routes are few and shape listeners, not virtual hosts: rebuild the
                // Gateways either version names.
                Kind::TlsRoute | Kind::TcpRoute => {
                    for set in [&old, config] {
                        let route = match c.kind {
                            Kind::TlsRoute => set.tls_routes.get(&c.key).map(|r| &r.as_http),
                            _ => set.tcp_routes.get(&c.key).map(|r| &r.as_http),
                        };
                        if let Some(r) = route {
                            let ns = r.metadata.namespace.as_str();
                            rebuild.extend(
                                r.spec
                                    .parent_refs
                                    .iter()
                                    .filter(|p| p.is_gateway())
                                    .map(|p| ObjectKey::new(p.namespace_or(ns), p.name.as_str())),
                            );
                        }
                    }
                }
                // A Service appearing or going changes what bare backendRefs of its name mean
                // (Service or the Backend shorthand); those refs depend on the Backend key of
                // the same name. Its ports and endpoints reach the translation as the derived
                // Backends' changes.
                Kind::Service if c.change != ChangeKind::Modified => {
                    rebuild.extend(self.index.gateways_of_backend(&c.key).cloned());
                }
                Kind::Service | Kind::EndpointSlice => {}
                // A grant can make any cross-namespace backendRef or certificateRef (un)resolve.
                // Grants change rarely: rebuild every gateway rather than index who uses which.
                // A Namespace's labels decide which routes `from: Selector` listeners admit.
                Kind::ReferenceGrant | Kind::Namespace => {
                    rebuild.extend(config.gateways.keys().cloned())
                }
            }
        }

        // A gateway without state (not translated yet) is rebuilt; so is one whose routes
        // changed together with anything else of it.
        route_changes.retain(|g, _| {
            if !config.gateways.contains_key(g) {
                return false; // named by a parentRef but does not exist (and did not before)
            }
            if !self.gateways.contains_key(g) {
                rebuild.insert(g.clone());
            }
            !rebuild.contains(g)
        });

        let stats = &mut out.stats;
        let mut orphans = Orphans::default();
        for key in &rebuild {
            let mut prev = self.gateways.remove(key);
            let prev_resources = prev.as_ref().map(|p| p.resources.clone());
            let prev_version = prev.as_mut().map(|p| p.take_version());
            match build_gateway(config, key, &self.options, &mut self.caches, prev, stats) {
                Some(mut built) => {
                    orphans.extend(self.index.set(key, built.deps));
                    match prev_resources {
                        Some(p) if same_resources(&p, &built.state.resources) => {
                            // Still the version output before, with what is pending since.
                            built.state.resources = p;
                            if let Some(v) = prev_version {
                                built.state.restore_version(v);
                            }
                        }
                        _ => {
                            out.changed
                                .insert(key.clone(), built.state.resources.clone());
                        }
                    }
                    self.gateways.insert(key.clone(), built.state);
                }
                None => {
                    orphans.extend(self.index.remove(key));
                    if prev_resources.is_some() {
                        out.removed.push(key.clone());
                    }
                }
            }
        }

        for (key, routes) in &route_changes {
            let state = self.gateways.get_mut(key).expect("checked above");
            if patch_routes(
                config,
                key,
                state,
                routes,
                &mut self.caches,
                &mut self.index,
                &mut orphans,
                stats,
            ) {
                out.changed.insert(key.clone(), state.resources.clone());
            }
        }

        for (key, backends) in patch {
            if rebuild.contains(&key) {
                continue;
            }
            let Some(state) = self.gateways.get_mut(&key) else {
                continue;
            };
            // In place when no output still holds the resources (the pipeline drops each
            // output once published): an endpoint change among 10,000 Backends then costs
            // what it swaps, not a copy of every list.
            let res = Arc::make_mut(&mut state.resources);
            let mut changed = false;
            let mut touched: Vec<Arc<str>> = Vec::new();
            for b in &backends {
                let name = names::cluster(b);
                let Ok(ci) = res.clusters.binary_search_by(|r| r.name().cmp(&name)) else {
                    continue; // referenced only with weight 0 or from unserved listeners
                };
                let Some(backend) = config.backend(b) else {
                    continue;
                };
                let entry = self.caches.backend(config, backend, stats);
                changed |= res.clusters[ci] != entry.cluster;
                res.clusters[ci] = entry.cluster.clone();
                let name: Arc<str> = name.into();
                touched.push(name.clone());
                // An EDS Backend has a load assignment, a DNS one none; an edit may switch.
                let at = res
                    .load_assignments
                    .binary_search_by(|r| r.name().cmp(&name));
                match (at, &entry.load_assignment) {
                    (Ok(li), Some(la)) => {
                        changed |= res.load_assignments[li] != *la;
                        res.load_assignments[li] = la.clone();
                    }
                    (Err(li), Some(la)) => {
                        res.load_assignments.insert(li, la.clone());
                        changed = true;
                    }
                    (Ok(li), None) => {
                        res.load_assignments.remove(li);
                        changed = true;
                    }
                    (Err(_), None) => {}
                }
            }
            for name in &touched {
                state.touch(ResourceType::Cluster, name);
                state.touch(ResourceType::ClusterLoadAssignment, name);
            }
            stats.gateways_patched += 1;
            if changed {
                out.changed.insert(key.clone(), state.resources.clone());
            }
        }

        // Number what is output; a gateway not rebuilt this time tells what its patches
        // touched since its version before.
        for key in out.changed.keys() {
            let state = self.gateways.get_mut(key).expect("changed gateways exist");
            self.last_version += 1;
            let v = state.output_version(self.last_version, !rebuild.contains(key));
            out.versions.insert(key.clone(), v);
        }

        // Keep-set garbage collection: cache only what some gateway still depends on. An entry
        // can only become garbage by leaving the config (a change) or the index (an orphan), so
        // only those keys are checked, never the whole cache.
        for c in changes.iter().filter(|c| c.change == ChangeKind::Removed) {
            match c.kind {
                Kind::HttpRoute => orphans.routes.push(c.key.clone()),
                Kind::Backend => orphans.backends.push(c.key.clone()),
                Kind::Secret => orphans.secrets.push(c.key.clone()),
                Kind::Gateway
                | Kind::BackendPolicy
                | Kind::ConfigMap
                | Kind::BackendTlsPolicy
                | Kind::ClientPolicy
                | Kind::SecurityPolicy
                | Kind::GrpcRoute
                | Kind::Service
                | Kind::EndpointSlice
                | Kind::ReferenceGrant
                | Kind::Namespace
                | Kind::TlsRoute
                | Kind::TcpRoute => {}
                Kind::RateLimitPolicy => {}
            }
        }
        for k in orphans.routes {
            if !self.index.uses_route(&k) || !config.http_routes.contains_key(&k) {
                self.caches.routes.remove(&k);
            }
        }
        for k in orphans.backends {
            if !self.index.uses_backend(&k) || config.backend(&k).is_none() {
                self.caches.backends.remove(&k);
            }
        }
        for k in orphans.secrets {
            if !self.index.uses_secret(&k) || !config.secrets.contains_key(&k) {
                self.caches.secrets.remove(&k);
            }
        }
        debug_assert!(self.caches_are_minimal());
        out
    }

    /// Every cache entry is for an object in the config that some gateway depends on.
    fn caches_are_minimal(&self) -> bool {
        let c = &self.config;
        self.caches
            .routes
            .keys()
            .all(|k| self.index.uses_route(k) && c.http_routes.contains_key(k))
            && self
                .caches
                .backends
                .keys()
                .all(|k| self.index.uses_backend(k) && c.backend(k).is_some())
            && self
                .caches
                .secrets
                .keys()
                .all(|k| self.index.uses_secret(k) && c.secrets.contains_key(k))
    }
}

/// Whether two resource sets hold the same versions (pointer checks first: unchanged resources
/// are shared).
fn same_resources(a: &GatewayResources, b: &GatewayResources) -> bool {
    a.by_type()
        .iter()
        .zip(b.by_type().iter())
        .all(|((_, x), (_, y))| {
            x.len() == y.len()
                && x.iter()
                    .zip(y.iter())
                    .all(|(p, q)| Arc::ptr_eq(p, q) || **p == **q)
        })
}

/// `ConfigSet::diff` without grouping by kind first: unchanged objects (shared nodes, shared
/// `Arc`s) cost nothing or a pointer comparison.
fn diff(old: &ConfigSet, new: &ConfigSet) -> Vec<Change> {
    let mut out = Vec::new();
    diff_map(Kind::Gateway, &old.gateways, &new.gateways, &mut out);
    diff_map(
        Kind::HttpRoute,
        &old.http_routes,
        &new.http_routes,
        &mut out,
    );
    diff_map(Kind::Backend, &old.backends, &new.backends, &mut out);
    diff_map(
        Kind::Backend,
        &old.service_backends,
        &new.service_backends,
        &mut out,
    );
    diff_map(Kind::Secret, &old.secrets, &new.secrets, &mut out);
    diff_map(
        Kind::BackendPolicy,
        &old.backend_policies,
        &new.backend_policies,
        &mut out,
    );
    diff_map(
        Kind::ConfigMap,
        &old.config_maps,
        &new.config_maps,
        &mut out,
    );
    diff_map(
        Kind::BackendTlsPolicy,
        &old.backend_tls_policies,
        &new.backend_tls_policies,
        &mut out,
    );
    diff_map(
        Kind::ClientPolicy,
        &old.client_policies,
        &new.client_policies,
        &mut out,
    );
    diff_map(Kind::Service, &old.services, &new.services, &mut out);
    diff_map(
        Kind::ReferenceGrant,
        &old.reference_grants,
        &new.reference_grants,
        &mut out,
    );
    diff_map(Kind::Namespace, &old.namespaces, &new.namespaces, &mut out);
    diff_map(Kind::TlsRoute, &old.tls_routes, &new.tls_routes, &mut out);
    diff_map(Kind::TcpRoute, &old.tcp_routes, &new.tcp_routes, &mut out);
    diff_map(
        Kind::RateLimitPolicy,
        &old.rate_limit_policies,
        &new.rate_limit_policies,
        &mut out,
    );
    diff_map(
        Kind::SecurityPolicy,
        &old.security_policies,
        &new.security_policies,
        &mut out,
    );
    out
}

/// Skips the nodes the two sets share ([`ballast_model::ObjectMap`]): O(change · log n).
fn diff_map<T: PartialEq>(
    kind: Kind,
    old: &ObjectMap<T>,
    new: &ObjectMap<T>,
    out: &mut Vec<Change>,
) {
    ballast_model::set::diff_objects(kind, old, new, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The merge diff agrees with `ConfigSet::diff`.
        #[test]
        fn merge_diff_equals_model_diff(a in prop::collection::btree_map(0u8..12, 0u8..3, 0..8), b in prop::collection::btree_map(0u8..12, 0u8..3, 0..8)) {
            let render = |m: &BTreeMap<u8, u8>| {
                m.iter()
                    .map(|(k, v)| format!("apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {{ name: b{k} }}\nspec:\n  endpoints: [{{ address: 10.0.0.1, port: {} }}]\n", 80 + u32::from(*v)))
                    .collect::<Vec<_>>()
                    .join("---\n")
            };
            let x = ConfigSet::build([("a.yaml", render(&a))]).unwrap();
            let y = ConfigSet::build([("b.yaml", render(&b))]).unwrap();
            let mut got = diff(&x, &y);
            got.sort();
            prop_assert_eq!(got, x.diff(&y));
        }
    }
}
