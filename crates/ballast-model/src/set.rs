//! [`ConfigSet`]: every object of a config, keyed by kind and (namespace, name).
//!
//! Values are `Arc`s so a set is cheap to clone and two sets can be compared object by object
//! (unchanged objects usually share their `Arc`, making the comparison a pointer check).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::{ConfigError, ObjectRef, sort_errors};
use crate::hostname::effective_hostnames;
use crate::kinds::*;
use crate::parse::parse_file;

/// All objects of a config, in deterministic (namespace, name) order per kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigSet {
    pub gateways: BTreeMap<ObjectKey, Arc<Gateway>>,
    pub http_routes: BTreeMap<ObjectKey, Arc<HttpRoute>>,
    pub backends: BTreeMap<ObjectKey, Arc<Backend>>,
    pub secrets: BTreeMap<ObjectKey, Arc<Secret>>,
}

/// How one object differs between two sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ChangeKind {
    Added,
    Removed,
    Modified,
}

/// One entry of [`ConfigSet::diff`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Change {
    pub kind: Kind,
    pub key: ObjectKey,
    pub change: ChangeKind,
}

/// What a route's backendRef points at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendRefResolution {
    Resolved(Arc<Backend>),
    /// Names a Backend that does not exist: requests this ref would get are answered with 500.
    NotFound,
    /// Names a group/kind other than `ballast.dev` `Backend`; treated like `NotFound` for traffic.
    InvalidKind,
}

/// What a listener's certificateRef points at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertificateRefResolution {
    Resolved(Arc<Secret>),
    NotFound,
    InvalidKind,
}

/// Why a parentRef does not attach (Gateway API `Accepted=False` reasons).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NotAcceptedReason {
    /// The Gateway, its `sectionName` listener or a listener on `port` does not exist, or the
    /// parent is not a Gateway.
    NoMatchingParent,
    /// The listeners' `allowedRoutes` exclude the route's namespace.
    NotAllowedByListeners,
    /// No listener hostname intersects the route's hostnames.
    NoMatchingListenerHostname,
}

impl NotAcceptedReason {
    pub fn as_str(self) -> &'static str {
        match self {
            NotAcceptedReason::NoMatchingParent => "NoMatchingParent",
            NotAcceptedReason::NotAllowedByListeners => "NotAllowedByListeners",
            NotAcceptedReason::NoMatchingListenerHostname => "NoMatchingListenerHostname",
        }
    }
}

/// A route attached to one listener, with the hostnames it serves there
/// ([`crate::ANY_HOST`] for all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerAttachment {
    pub listener: String,
    pub hostnames: Vec<String>,
}

/// The outcome of one parentRef of a route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParentResolution {
    /// Index into `spec.parentRefs`.
    pub index: usize,
    /// The referenced Gateway's key (whether or not it exists).
    pub gateway: ObjectKey,
    /// The listeners attached to (never empty), or why none.
    pub result: Result<Vec<ListenerAttachment>, (NotAcceptedReason, String)>,
}

/// A route on a listener of a Gateway (the unit translation works with).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteAttachment {
    pub route: Arc<HttpRoute>,
    pub listener: String,
    pub hostnames: Vec<String>,
}

impl ConfigSet {
    /// Parses and merges files given as `(path for messages, text)`. Reports every error of every
    /// file (sorted by file and position), including objects defined twice.
    pub fn build<P, T>(
        files: impl IntoIterator<Item = (P, T)>,
    ) -> Result<ConfigSet, Vec<ConfigError>>
    where
        P: AsRef<str>,
        T: AsRef<str>,
    {
        let mut objects = Vec::new();
        let mut errors = Vec::new();
        for (path, text) in files {
            match parse_file(path.as_ref(), text.as_ref()) {
                Ok(mut o) => objects.append(&mut o),
                Err(mut e) => errors.append(&mut e),
            }
        }
        match ConfigSet::from_objects(objects) {
            Ok(set) if errors.is_empty() => Ok(set),
            Ok(_) => {
                sort_errors(&mut errors);
                Err(errors)
            }
            Err(mut e) => {
                errors.append(&mut e);
                sort_errors(&mut errors);
                Err(errors)
            }
        }
    }

    /// Merges already parsed objects (e.g. cached per file by a source). An object defined twice is
    /// an error at the later definition (by file and position, so the input order does not
    /// matter) naming the earlier one.
    pub fn from_objects(
        objects: impl IntoIterator<Item = Object>,
    ) -> Result<ConfigSet, Vec<ConfigError>> {
        let mut objects: Vec<Object> = objects.into_iter().collect();
        objects.sort_by(|a, b| a.source().cmp(b.source()));
        let mut set = ConfigSet::default();
        let mut errors = Vec::new();
        for o in objects {
            if let Some(existing) = set.get(o.kind(), &o.key()) {
                let key = o.key();
                errors.push(ConfigError {
                    file: o.source().file.clone(),
                    pos: o.source().pos,
                    object: Some(ObjectRef {
                        kind: o.kind(),
                        namespace: key.namespace,
                        name: Some(key.name),
                    }),
                    field: None,
                    message: format!("duplicate: also defined at {}", existing.source()),
                });
                continue;
            }
            set.insert(o);
        }
        if errors.is_empty() {
            Ok(set)
        } else {
            Err(errors)
        }
    }

    /// Adds or replaces an object.
    pub fn insert(&mut self, o: Object) -> Option<Object> {
        let key = o.key();
        match o {
            Object::Gateway(g) => self.gateways.insert(key, g).map(Object::Gateway),
            Object::HttpRoute(r) => self.http_routes.insert(key, r).map(Object::HttpRoute),
            Object::Backend(b) => self.backends.insert(key, b).map(Object::Backend),
            Object::Secret(s) => self.secrets.insert(key, s).map(Object::Secret),
        }
    }

    pub fn remove(&mut self, kind: Kind, key: &ObjectKey) -> Option<Object> {
        match kind {
            Kind::Gateway => self.gateways.remove(key).map(Object::Gateway),
            Kind::HttpRoute => self.http_routes.remove(key).map(Object::HttpRoute),
            Kind::Backend => self.backends.remove(key).map(Object::Backend),
            Kind::Secret => self.secrets.remove(key).map(Object::Secret),
        }
    }

    pub fn get(&self, kind: Kind, key: &ObjectKey) -> Option<Object> {
        match kind {
            Kind::Gateway => self.gateways.get(key).cloned().map(Object::Gateway),
            Kind::HttpRoute => self.http_routes.get(key).cloned().map(Object::HttpRoute),
            Kind::Backend => self.backends.get(key).cloned().map(Object::Backend),
            Kind::Secret => self.secrets.get(key).cloned().map(Object::Secret),
        }
    }

    /// Every object, by kind then key.
    pub fn objects(&self) -> impl Iterator<Item = Object> + '_ {
        let g = self.gateways.values().cloned().map(Object::Gateway);
        let r = self.http_routes.values().cloned().map(Object::HttpRoute);
        let b = self.backends.values().cloned().map(Object::Backend);
        let s = self.secrets.values().cloned().map(Object::Secret);
        g.chain(r).chain(b).chain(s)
    }

    pub fn len(&self) -> usize {
        self.gateways.len() + self.http_routes.len() + self.backends.len() + self.secrets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The objects added, removed or modified from `self` to `new`, sorted by kind and key.
    /// Positions are not content: moving an object within or between files is no change.
    pub fn diff(&self, new: &ConfigSet) -> Vec<Change> {
        let mut out = Vec::new();
        diff_map(Kind::Gateway, &self.gateways, &new.gateways, &mut out);
        diff_map(
            Kind::HttpRoute,
            &self.http_routes,
            &new.http_routes,
            &mut out,
        );
        diff_map(Kind::Backend, &self.backends, &new.backends, &mut out);
        diff_map(Kind::Secret, &self.secrets, &new.secrets, &mut out);
        out
    }

    /// Resolves a backendRef of `route` (its namespace defaults to the route's).
    pub fn resolve_backend(&self, route: &HttpRoute, r: &HttpBackendRef) -> BackendRefResolution {
        if !r.is_backend() {
            return BackendRefResolution::InvalidKind;
        }
        let key = ObjectKey::new(r.namespace_or(&route.metadata.namespace), r.name.as_str());
        match self.backends.get(&key) {
            Some(b) => BackendRefResolution::Resolved(b.clone()),
            None => BackendRefResolution::NotFound,
        }
    }

    /// Resolves a certificateRef of `gateway` (its namespace defaults to the Gateway's).
    pub fn resolve_certificate(
        &self,
        gateway: &Gateway,
        r: &SecretObjectRef,
    ) -> CertificateRefResolution {
        if !r.is_secret() {
            return CertificateRefResolution::InvalidKind;
        }
        let ns = r
            .namespace
            .as_deref()
            .unwrap_or(&gateway.metadata.namespace);
        match self.secrets.get(&ObjectKey::new(ns, r.name.as_str())) {
            Some(s) => CertificateRefResolution::Resolved(s.clone()),
            None => CertificateRefResolution::NotFound,
        }
    }

    /// Where each parentRef of `route` attaches, following Gateway API: the Gateway must exist;
    /// `sectionName` and `port` narrow the listeners; each listener must allow the route's
    /// namespace and share a hostname with it.
    pub fn resolve_parents(&self, route: &HttpRoute) -> Vec<ParentResolution> {
        let route_ns = route.metadata.namespace.as_str();
        let hostnames: Vec<&str> = route.spec.hostnames.iter().map(|h| h.as_str()).collect();
        let mut out = Vec::new();
        for (index, p) in route.spec.parent_refs.iter().enumerate() {
            let gateway = ObjectKey::new(p.namespace_or(route_ns), p.name.as_str());
            let fail = |reason, message: String| Err((reason, message));
            let result = if !p.is_gateway() {
                fail(
                    NotAcceptedReason::NoMatchingParent,
                    format!(
                        "parent {}/{} is not a Gateway; only gateway.networking.k8s.io Gateway is supported",
                        p.group.as_deref().unwrap_or(GATEWAY_GROUP),
                        p.kind.as_deref().unwrap_or("Gateway")
                    ),
                )
            } else if let Some(g) = self.gateways.get(&gateway) {
                attach(g, p, route_ns, &hostnames)
            } else {
                fail(
                    NotAcceptedReason::NoMatchingParent,
                    format!("Gateway {gateway} not found"),
                )
            };
            out.push(ParentResolution {
                index,
                gateway,
                result,
            });
        }
        out
    }

    /// The routes attached to each listener of `gateway`, by route key then listener order.
    /// A route attached to a listener through several parentRefs appears once, with the union
    /// of its hostnames.
    pub fn attached_routes(&self, gateway: &ObjectKey) -> Vec<RouteAttachment> {
        let Some(g) = self.gateways.get(gateway) else {
            return Vec::new();
        };
        let mut out: Vec<RouteAttachment> = Vec::new();
        for route in self.http_routes.values() {
            for a in route_attachments(gateway, g, route) {
                out.push(RouteAttachment {
                    route: route.clone(),
                    listener: a.listener,
                    hostnames: a.hostnames,
                });
            }
        }
        out
    }

    /// The listeners of `gateway` that `route` attaches to, in listener order, each with the
    /// union of the hostnames of every parentRef attaching it there: `route`'s entries of
    /// [`Self::attached_routes`]. Depends only on the route and the Gateway.
    pub fn route_attachments(
        &self,
        gateway: &ObjectKey,
        route: &HttpRoute,
    ) -> Vec<ListenerAttachment> {
        match self.gateways.get(gateway) {
            Some(g) => route_attachments(gateway, g, route),
            None => Vec::new(),
        }
    }
}

fn route_attachments(
    gateway: &ObjectKey,
    g: &Gateway,
    route: &HttpRoute,
) -> Vec<ListenerAttachment> {
    // Cheap pre-filter: most routes in a large config name other gateways.
    let route_ns = route.metadata.namespace.as_str();
    if !route
        .spec
        .parent_refs
        .iter()
        .any(|p| p.namespace_or(route_ns) == gateway.namespace && *p.name == gateway.name)
    {
        return Vec::new();
    }
    let hostnames: Vec<&str> = route.spec.hostnames.iter().map(|h| h.as_str()).collect();
    let mut mine: Vec<ListenerAttachment> = Vec::new();
    for p in &route.spec.parent_refs {
        // `resolve_parents` restricted to the parentRefs naming this Gateway.
        if !p.is_gateway()
            || p.namespace_or(route_ns) != gateway.namespace
            || *p.name != gateway.name
        {
            continue;
        }
        for a in attach(g, p, route_ns, &hostnames).into_iter().flatten() {
            match mine.iter_mut().find(|m| m.listener == a.listener) {
                Some(m) => {
                    for h in a.hostnames {
                        if !m.hostnames.contains(&h) {
                            m.hostnames.push(h);
                        }
                    }
                }
                None => mine.push(a),
            }
        }
    }
    let mut out = Vec::with_capacity(mine.len());
    for l in &g.spec.listeners {
        if let Some(m) = mine.iter().find(|m| m.listener == *l.name) {
            out.push(m.clone());
        }
    }
    out
}

fn attach(
    g: &Gateway,
    p: &ParentRef,
    route_ns: &str,
    hostnames: &[&str],
) -> Result<Vec<ListenerAttachment>, (NotAcceptedReason, String)> {
    let candidates: Vec<&Listener> = g
        .spec
        .listeners
        .iter()
        .filter(|l| p.section_name.as_deref().is_none_or(|s| s == *l.name))
        .filter(|l| {
            p.port
                .as_ref()
                .is_none_or(|port| port.value == l.port.value)
        })
        .collect();
    if candidates.is_empty() {
        let what = match (&p.section_name, &p.port) {
            (Some(s), Some(port)) => format!("listener {s:?} with port {}", port.value),
            (Some(s), None) => format!("listener {s:?}"),
            (None, Some(port)) => format!("listener with port {}", port.value),
            (None, None) => "listener".to_owned(),
        };
        return Err((
            NotAcceptedReason::NoMatchingParent,
            format!("Gateway {} has no {what}", g.key()),
        ));
    }
    let allowed: Vec<&Listener> = candidates
        .into_iter()
        .filter(|l| match l.allowed_routes.namespaces.from {
            FromNamespaces::All => true,
            FromNamespaces::Same => g.metadata.namespace == route_ns,
        })
        .collect();
    if allowed.is_empty() {
        return Err((
            NotAcceptedReason::NotAllowedByListeners,
            format!(
                "listeners of Gateway {} only allow routes from namespace {:?}",
                g.key(),
                g.metadata.namespace
            ),
        ));
    }
    let attached: Vec<ListenerAttachment> = allowed
        .into_iter()
        .filter_map(|l| {
            let hostnames = effective_hostnames(l.hostname(), hostnames);
            (!hostnames.is_empty()).then(|| ListenerAttachment {
                listener: l.name.value.clone(),
                hostnames,
            })
        })
        .collect();
    if attached.is_empty() {
        return Err((
            NotAcceptedReason::NoMatchingListenerHostname,
            format!(
                "no listener hostname of Gateway {} intersects the route's hostnames",
                g.key()
            ),
        ));
    }
    Ok(attached)
}

fn diff_map<T: PartialEq>(
    kind: Kind,
    old: &BTreeMap<ObjectKey, Arc<T>>,
    new: &BTreeMap<ObjectKey, Arc<T>>,
    out: &mut Vec<Change>,
) {
    let change = |key: &ObjectKey, change| Change {
        kind,
        key: key.clone(),
        change,
    };
    for (key, o) in old {
        match new.get(key) {
            None => out.push(change(key, ChangeKind::Removed)),
            Some(n) if !Arc::ptr_eq(o, n) && **o != **n => {
                out.push(change(key, ChangeKind::Modified))
            }
            Some(_) => {}
        }
    }
    for key in new.keys() {
        if !old.contains_key(key) {
            out.push(change(key, ChangeKind::Added));
        }
    }
    out.sort();
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn backend(name: &str, port: u16) -> String {
        format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {{ name: {name} }}\nspec:\n  endpoints: [{{ address: 10.0.0.1, port: {port} }}]\n"
        )
    }

    fn msgs(r: Result<ConfigSet, Vec<ConfigError>>) -> Vec<String> {
        r.expect_err("expected errors")
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    #[test]
    fn builds_from_many_files() {
        let canonical = include_str!("../testdata/canonical.yaml");
        let set = ConfigSet::build([
            ("a.yaml", canonical.to_owned()),
            ("b.yaml", backend("api", 81)),
        ])
        .unwrap();
        assert_eq!(set.len(), 4);
        assert_eq!(
            set.backends
                .keys()
                .map(|k| k.to_string())
                .collect::<Vec<_>>(),
            vec!["default/api", "default/web"]
        );
        assert_eq!(
            set.gateways[&ObjectKey::new("default", "edge")]
                .source
                .file
                .as_ref(),
            "a.yaml"
        );
        let clone = set.clone();
        assert!(Arc::ptr_eq(
            &clone.backends[&ObjectKey::new("default", "api")],
            &set.backends[&ObjectKey::new("default", "api")]
        ));
    }

    #[test]
    fn duplicates_across_files_name_both_places() {
        let r = ConfigSet::build([
            ("b.yaml", format!("\n{}", backend("web", 80))),
            ("a.yaml", backend("web", 81)),
        ]);
        assert_eq!(
            msgs(r),
            vec!["b.yaml:2:1: Backend default/web: duplicate: also defined at a.yaml:1:1"]
        );
        // Same name in another kind (the canonical HTTPRoute and Backend `web`) or namespace is
        // no duplicate.
        let other_ns = backend("web", 80).replace("name: web", "name: web, namespace: x");
        let gw = include_str!("../testdata/canonical.yaml");
        assert!(ConfigSet::build([("b.yaml", other_ns), ("c.yaml", gw.to_owned())]).is_ok());
    }

    #[test]
    fn errors_of_all_files_are_reported() {
        let r = ConfigSet::build([
            ("b.yaml", "kind: X\n".to_owned()),
            ("a.yaml", backend("web", 0)),
            ("c.yaml", backend("ok", 80)),
        ]);
        assert_eq!(
            msgs(r),
            vec![
                "a.yaml:5:42: Backend default/web: spec.endpoints[0].port: port 0 is out of range 1..=65535",
                "b.yaml:1:7: kind: unknown kind \"X\"; supported: Gateway, HTTPRoute (gateway.networking.k8s.io/v1), Backend (ballast.dev/v1alpha1), Secret (v1)",
            ]
        );
    }

    #[test]
    fn diff_reports_changes_per_object_and_ignores_moves() {
        let old = ConfigSet::build([(
            "a.yaml",
            format!("{}---\n{}", backend("a", 80), backend("b", 80)),
        )])
        .unwrap();
        // `a` moves to another file and line, `b` changes, `c` is new.
        let new = ConfigSet::build([
            ("z.yaml", format!("\n\n{}", backend("a", 80))),
            (
                "y.yaml",
                format!("{}---\n{}", backend("b", 81), backend("c", 80)),
            ),
        ])
        .unwrap();
        let d = old.diff(&new);
        let got: Vec<(String, ChangeKind)> =
            d.iter().map(|c| (c.key.name.clone(), c.change)).collect();
        assert_eq!(
            got,
            vec![
                ("b".into(), ChangeKind::Modified),
                ("c".into(), ChangeKind::Added)
            ]
        );
        assert_eq!(
            new.diff(&old).iter().map(|c| c.change).collect::<Vec<_>>(),
            vec![ChangeKind::Modified, ChangeKind::Removed]
        );
        assert!(old.diff(&old.clone()).is_empty());
        assert_ne!(old, new);
    }

    #[test]
    fn insert_get_remove() {
        let mut set = ConfigSet::build([("a.yaml", backend("a", 80))]).unwrap();
        let key = ObjectKey::new("default", "a");
        let o = set.get(Kind::Backend, &key).unwrap();
        assert!(set.get(Kind::Gateway, &key).is_none());
        assert_eq!(set.remove(Kind::Backend, &key), Some(o.clone()));
        assert!(set.is_empty());
        assert_eq!(set.insert(o.clone()), None);
        assert_eq!(set.insert(o.clone()), Some(o));
        assert_eq!(set.objects().count(), 1);
    }

    proptest! {
        /// The set and the errors do not depend on the order files are given in.
        #[test]
        fn build_is_independent_of_file_order(
            files in proptest::collection::vec(proptest::collection::vec((0u8..6, 1u16..3), 0..4), 1..5),
            seed in any::<u64>(),
        ) {
            let files: Vec<(String, String)> = files
                .iter()
                .enumerate()
                .map(|(i, objs)| {
                    let text = objs
                        .iter()
                        .map(|(n, port)| backend(&format!("b{n}"), *port))
                        .collect::<Vec<_>>()
                        .join("---\n");
                    (format!("f{i}.yaml"), text)
                })
                .collect();
            let mut shuffled = files.clone();
            // Deterministic shuffle from the seed.
            let mut s = seed;
            for i in (1..shuffled.len()).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                shuffled.swap(i, (s >> 33) as usize % (i + 1));
            }
            let a = ConfigSet::build(files);
            let b = ConfigSet::build(shuffled);
            prop_assert_eq!(&a, &b);
            if let Ok(set) = a {
                // Sources agree too, not just content.
                let sa: Vec<_> = set.objects().map(|o| o.source().clone()).collect();
                let sb: Vec<_> = b.unwrap().objects().map(|o| o.source().clone()).collect();
                prop_assert_eq!(sa, sb);
            }
        }
    }
}
