//! The dependency index: which routes, Backends and Secrets each Gateway's resources depend on,
//! and the reverse maps that tell which Gateways a changed object affects.
//!
//! Reconciled by keep-set (invariant 4, docs/architecture.md): each rebuilt Gateway sets its
//! complete new dependency set and the reverse maps are diffed against the old one, so the index
//! always equals one computed from scratch ([`DependencyIndex::build`]) — property-tested.

use std::collections::{BTreeMap, BTreeSet};

use ballast_model::{ConfigSet, HttpRoute, ObjectKey};

use crate::listener::certificate_refs;
use crate::route::backend_refs;

/// What one Gateway's resources depend on. Includes references that do not resolve (yet), so
/// that adding the missing object finds the Gateway.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deps {
    /// Routes with a parentRef naming the Gateway (attached or not: a change may attach them).
    pub routes: BTreeSet<ObjectKey>,
    /// Backends named by the backendRefs of the routes attached to the Gateway.
    pub backends: BTreeSet<ObjectKey>,
    /// Secrets named by the Gateway's certificateRefs.
    pub secrets: BTreeSet<ObjectKey>,
}

/// Whether a parentRef of `route` names `gateway` (attaching or not).
pub(crate) fn names_gateway(route: &HttpRoute, gateway: &ObjectKey) -> bool {
    let ns = route.metadata.namespace.as_str();
    route.spec.parent_refs.iter().any(|p| {
        p.is_gateway() && p.namespace_or(ns) == gateway.namespace && *p.name == gateway.name
    })
}

/// Routes whose parentRefs name `gateway`.
pub(crate) fn routes_naming<'a>(
    config: &'a ConfigSet,
    gateway: &'a ObjectKey,
) -> impl Iterator<Item = ObjectKey> + 'a {
    config
        .http_routes
        .iter()
        .filter(move |(_, r)| names_gateway(r, gateway))
        .map(|(k, _)| k.clone())
}

impl Deps {
    /// The dependencies of `gateway` in `config`, from scratch; `None` if it does not exist.
    pub fn compute(config: &ConfigSet, gateway: &ObjectKey) -> Option<Deps> {
        let gw = config.gateways.get(gateway)?;
        let mut backends = BTreeSet::new();
        for a in config.attached_routes(gateway) {
            backends.extend(backend_refs(&a.route));
        }
        // TLSRoutes / TCPRoutes on its TLS and TCP listeners (no work without such listeners).
        backends.extend(
            crate::l4::plan(config, gw, &crate::Options::default())
                .refs
                .into_keys(),
        );
        // The rate-limit service the connection manager's global filter calls.
        backends.extend(crate::rate_limit::service_backend(config, gw));
        backends.extend(crate::security::policy_backends(config, gateway));
        Some(Deps {
            routes: routes_naming(config, gateway).collect(),
            backends,
            secrets: certificate_refs(gw).collect(),
        })
    }
}

/// Gateway → dependencies, and object → Gateways.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DependencyIndex {
    gateways: BTreeMap<ObjectKey, Deps>,
    routes: BTreeMap<ObjectKey, Users>,
    backends: BTreeMap<ObjectKey, Users>,
    secrets: BTreeMap<ObjectKey, Users>,
}

/// The Gateways depending on one object, sorted and distinct. Nearly always one: a `BTreeSet`
/// would allocate a node for eleven per route and Backend (issue #13: 3.7 MB for W4's 3,400 of
/// each); with many Gateways, inserting is linear, still far below translating them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Users(Vec<ObjectKey>);

impl Users {
    fn insert(&mut self, gateway: &ObjectKey) {
        if let Err(at) = self.0.binary_search(gateway) {
            self.0.reserve_exact(1);
            self.0.insert(at, gateway.clone());
        }
    }

    fn remove(&mut self, gateway: &ObjectKey) {
        if let Ok(at) = self.0.binary_search(gateway) {
            self.0.remove(at);
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Objects that no Gateway depends on any more after [`DependencyIndex::set`] (so caches
/// holding their translations can drop them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Orphans {
    pub routes: Vec<ObjectKey>,
    pub backends: Vec<ObjectKey>,
    pub secrets: Vec<ObjectKey>,
}

impl Orphans {
    pub(crate) fn extend(&mut self, other: Orphans) {
        self.routes.extend(other.routes);
        self.backends.extend(other.backends);
        self.secrets.extend(other.secrets);
    }
}

fn reconcile(
    map: &mut BTreeMap<ObjectKey, Users>,
    gateway: &ObjectKey,
    old: Option<&BTreeSet<ObjectKey>>,
    new: &BTreeSet<ObjectKey>,
    orphans: &mut Vec<ObjectKey>,
) {
    let empty = BTreeSet::new();
    let old = old.unwrap_or(&empty);
    for gone in old.difference(new) {
        if let Some(users) = map.get_mut(gone) {
            users.remove(gateway);
            if users.is_empty() {
                map.remove(gone);
                orphans.push(gone.clone());
            }
        }
    }
    for added in new.difference(old) {
        map.entry(added.clone()).or_default().insert(gateway);
    }
}

/// Adds or removes one dependency `key` of `gateway` (`deps` is the gateway's set of that kind,
/// `map` the reverse map); an object no gateway depends on any more goes to `orphans`.
fn toggle(
    deps: &mut BTreeSet<ObjectKey>,
    map: &mut BTreeMap<ObjectKey, Users>,
    gateway: &ObjectKey,
    key: &ObjectKey,
    uses: bool,
    orphans: &mut Vec<ObjectKey>,
) {
    if uses {
        if deps.insert(key.clone()) {
            map.entry(key.clone()).or_default().insert(gateway);
        }
    } else if deps.remove(key)
        && let Some(users) = map.get_mut(key)
    {
        users.remove(gateway);
        if users.is_empty() {
            map.remove(key);
            orphans.push(key.clone());
        }
    }
}

impl DependencyIndex {
    /// The index of every Gateway of `config`, from scratch.
    pub fn build(config: &ConfigSet) -> Self {
        let mut index = DependencyIndex::default();
        for key in config.gateways.keys() {
            if let Some(deps) = Deps::compute(config, key) {
                index.set(key, deps);
            }
        }
        index
    }

    /// Replaces the dependencies of `gateway` (keep-set reconcile of the reverse maps).
    /// Returns the objects no Gateway depends on any more.
    pub fn set(&mut self, gateway: &ObjectKey, deps: Deps) -> Orphans {
        let mut orphans = Orphans::default();
        if self.gateways.get(gateway) == Some(&deps) {
            return orphans;
        }
        let old = self.gateways.get(gateway);
        reconcile(
            &mut self.routes,
            gateway,
            old.map(|d| &d.routes),
            &deps.routes,
            &mut orphans.routes,
        );
        reconcile(
            &mut self.backends,
            gateway,
            old.map(|d| &d.backends),
            &deps.backends,
            &mut orphans.backends,
        );
        reconcile(
            &mut self.secrets,
            gateway,
            old.map(|d| &d.secrets),
            &deps.secrets,
            &mut orphans.secrets,
        );
        self.gateways.insert(gateway.clone(), deps);
        orphans
    }

    /// Forgets `gateway` (it was removed). Returns the objects no Gateway depends on any more.
    pub fn remove(&mut self, gateway: &ObjectKey) -> Orphans {
        let orphans = self.set(gateway, Deps::default());
        self.gateways.remove(gateway);
        orphans
    }

    /// Records whether `gateway` (already in the index) depends on `route`: one entry of
    /// [`Self::set`], for a gateway whose other dependencies are unchanged.
    pub(crate) fn set_route(
        &mut self,
        gateway: &ObjectKey,
        route: &ObjectKey,
        uses: bool,
        orphans: &mut Orphans,
    ) {
        let deps = self.gateways.get_mut(gateway).expect("gateway is indexed");
        toggle(
            &mut deps.routes,
            &mut self.routes,
            gateway,
            route,
            uses,
            &mut orphans.routes,
        );
    }

    /// Records whether `gateway` (already in the index) depends on `backend`.
    pub(crate) fn set_backend(
        &mut self,
        gateway: &ObjectKey,
        backend: &ObjectKey,
        uses: bool,
        orphans: &mut Orphans,
    ) {
        let deps = self.gateways.get_mut(gateway).expect("gateway is indexed");
        toggle(
            &mut deps.backends,
            &mut self.backends,
            gateway,
            backend,
            uses,
            &mut orphans.backends,
        );
    }

    pub fn deps(&self, gateway: &ObjectKey) -> Option<&Deps> {
        self.gateways.get(gateway)
    }

    pub fn gateways(&self) -> impl Iterator<Item = &ObjectKey> {
        self.gateways.keys()
    }

    fn users<'a>(
        map: &'a BTreeMap<ObjectKey, Users>,
        key: &ObjectKey,
    ) -> impl Iterator<Item = &'a ObjectKey> + 'a {
        map.get(key).into_iter().flat_map(|u| u.0.iter())
    }

    /// Gateways a change of this route may affect (besides those its new parentRefs name).
    pub fn gateways_of_route(&self, route: &ObjectKey) -> impl Iterator<Item = &ObjectKey> {
        Self::users(&self.routes, route)
    }

    pub fn gateways_of_backend(&self, backend: &ObjectKey) -> impl Iterator<Item = &ObjectKey> {
        Self::users(&self.backends, backend)
    }

    pub fn gateways_of_secret(&self, secret: &ObjectKey) -> impl Iterator<Item = &ObjectKey> {
        Self::users(&self.secrets, secret)
    }

    pub fn uses_route(&self, route: &ObjectKey) -> bool {
        self.routes.contains_key(route)
    }

    pub fn uses_backend(&self, backend: &ObjectKey) -> bool {
        self.backends.contains_key(backend)
    }

    pub fn uses_secret(&self, secret: &ObjectKey) -> bool {
        self.secrets.contains_key(secret)
    }
}
