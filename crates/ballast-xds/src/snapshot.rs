//! Snapshots: an immutable, internally consistent set of resources for one
//! group of proxies, with deterministic per-type versions.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock, Weak};

use crate::resource::{Resource, ResourceError, ResourceType, XdsResource};
use crate::version::set_version;

/// Resources of one type keyed by name (sorted: versions and responses are deterministic).
pub type ResourceMap = BTreeMap<Arc<str>, Arc<Resource>>;

/// The resources of one type in a snapshot, with their set version.
#[derive(Clone, Debug)]
pub struct TypeResources {
    version: Arc<str>,
    resources: Arc<ResourceMap>,
}

impl TypeResources {
    fn new(resources: ResourceMap) -> Self {
        let version = set_version(resources.iter().map(|(n, r)| (&**n, r.version())));
        TypeResources {
            version: version.into(),
            resources: Arc::new(resources),
        }
    }
    /// The type's version: a hash of every resource's name and version.
    pub fn version(&self) -> &Arc<str> {
        &self.version
    }
    /// The resources by name.
    pub fn resources(&self) -> &Arc<ResourceMap> {
        &self.resources
    }
    /// One resource by name.
    pub fn get(&self, name: &str) -> Option<&Arc<Resource>> {
        self.resources.get(name)
    }
    /// How many resources.
    pub fn len(&self) -> usize {
        self.resources.len()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
    }
}

/// How far back [`Snapshot::changed_since`] follows predecessors (the
/// cache's history is shorter; this only bounds odd publish orders).
const MAX_CHAIN: usize = 64;

/// An immutable set of resources for one group, shared by every stream of that group.
#[derive(Clone, Debug)]
pub struct Snapshot {
    types: [TypeResources; crate::resource::TYPE_COUNT],
    /// What changed since the snapshot this one replaced, recorded once when it
    /// is published ([`crate::SnapshotCache::set_snapshot`]), so every stream
    /// planned against the predecessor only looks at what changed.
    changes: OnceLock<Arc<[TypeChanges; crate::resource::TYPE_COUNT]>>,
    /// The snapshot this one replaced, while something (the cache's bounded
    /// history) keeps it: a stream several publishes behind follows the chain
    /// of recorded changes instead of walking whole maps.
    prev: OnceLock<Weak<Snapshot>>,
    /// Built with every reference checked ([`SnapshotBuilder::build`]): a
    /// snapshot built from this one only needs its changes checked.
    checked: bool,
}

/// The names of one type whose resource differs between two maps.
#[derive(Debug)]
pub(crate) struct TypeChanges {
    /// The map these changes are relative to. A `Weak` keeps the allocation,
    /// so comparing its address with a live map's is sound.
    base: Weak<ResourceMap>,
    /// Added, removed, or with another version; sorted.
    names: Vec<Arc<str>>,
    /// Some name was added or removed (not only new versions).
    keys_changed: bool,
}

impl TypeChanges {
    /// Compares two maps by walking them in order (pointer comparisons first).
    pub(crate) fn between(base: &Arc<ResourceMap>, new: &Arc<ResourceMap>) -> TypeChanges {
        let mut names = Vec::new();
        let mut keys_changed = false;
        if !Arc::ptr_eq(base, new) {
            let mut a = base.iter().peekable();
            let mut b = new.iter().peekable();
            loop {
                let ord = match (a.peek(), b.peek()) {
                    (None, None) => break,
                    (Some(_), None) => Ordering::Less,
                    (None, Some(_)) => Ordering::Greater,
                    (Some((ka, _)), Some((kb, _))) => {
                        if Arc::ptr_eq(ka, kb) {
                            Ordering::Equal
                        } else {
                            ka.cmp(kb)
                        }
                    }
                };
                match ord {
                    Ordering::Less => {
                        names.push(a.next().expect("peeked").0.clone());
                        keys_changed = true;
                    }
                    Ordering::Greater => {
                        names.push(b.next().expect("peeked").0.clone());
                        keys_changed = true;
                    }
                    Ordering::Equal => {
                        let (_, ra) = a.next().expect("peeked");
                        let (kb, rb) = b.next().expect("peeked");
                        if !Arc::ptr_eq(ra, rb) && ra.version() != rb.version() {
                            names.push(kb.clone());
                        }
                    }
                }
            }
        }
        TypeChanges {
            base: Arc::downgrade(base),
            names,
            keys_changed,
        }
    }

    /// Whether these changes are relative to `map`.
    pub(crate) fn is_from(&self, map: &Arc<ResourceMap>) -> bool {
        std::ptr::eq(self.base.as_ptr(), Arc::as_ptr(map))
    }
    pub(crate) fn names(&self) -> &[Arc<str>] {
        &self.names
    }
    pub(crate) fn keys_changed(&self) -> bool {
        self.keys_changed
    }
}

/// One problem that makes a snapshot inconsistent.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Inconsistency {
    /// Two resources of one type with one name.
    Duplicate {
        /// The type.
        ty: ResourceType,
        /// The name used twice.
        name: String,
    },
    /// A reference to a resource the snapshot lacks.
    MissingRef {
        /// The referrer's type.
        from_ty: ResourceType,
        /// The referrer's name.
        from: String,
        /// The missing resource's type.
        ty: ResourceType,
        /// The missing resource's name.
        name: String,
    },
    /// An EDS or RDS resource nothing references (it would never be requested).
    Unreferenced {
        /// The type (EDS or RDS).
        ty: ResourceType,
        /// The resource's name.
        name: String,
    },
}

impl fmt::Display for Inconsistency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Inconsistency::Duplicate { ty, name } => write!(f, "duplicate {ty} resource {name:?}"),
            Inconsistency::MissingRef {
                from_ty,
                from,
                ty,
                name,
            } => write!(f, "{from_ty} {from:?} references missing {ty} {name:?}"),
            Inconsistency::Unreferenced { ty, name } => {
                let by = match ty {
                    ResourceType::ClusterLoadAssignment => "cluster",
                    _ => "listener",
                };
                write!(f, "{ty} {name:?} is not referenced by any {by}")
            }
        }
    }
}

/// A snapshot was refused; every problem is listed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub struct SnapshotError {
    /// Every problem found, in a stable order.
    pub problems: Vec<Inconsistency>,
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "inconsistent snapshot ({} problems): ",
            self.problems.len()
        )?;
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot {
            types: std::array::from_fn(|_| TypeResources::new(ResourceMap::new())),
            changes: OnceLock::new(),
            prev: OnceLock::new(),
            checked: true,
        }
    }
}

impl Snapshot {
    /// Starts an empty snapshot.
    pub fn builder() -> SnapshotBuilder {
        SnapshotBuilder::default()
    }

    /// Everything of one type.
    pub fn of(&self, ty: ResourceType) -> &TypeResources {
        &self.types[ty.index()]
    }
    /// One type's version.
    pub fn version(&self, ty: ResourceType) -> &Arc<str> {
        self.of(ty).version()
    }
    /// One type's resources by name.
    pub fn resources(&self, ty: ResourceType) -> &Arc<ResourceMap> {
        self.of(ty).resources()
    }
    /// One resource.
    pub fn get(&self, ty: ResourceType, name: &str) -> Option<&Arc<Resource>> {
        self.of(ty).get(name)
    }
    /// How many resources of every type.
    pub fn total(&self) -> usize {
        self.types.iter().map(TypeResources::len).sum()
    }

    /// Records what changed since `prev` (once; later calls are ignored).
    /// Called when the snapshot replaces `prev` in the cache.
    pub(crate) fn record_changes_from(&self, prev: &Arc<Snapshot>) {
        if self.changes.get().is_some() {
            return;
        }
        let changes = std::array::from_fn(|i| {
            TypeChanges::between(&prev.types[i].resources, &self.types[i].resources)
        });
        let _ = self.changes.set(Arc::new(changes));
        let _ = self.prev.set(Arc::downgrade(prev));
    }

    /// What changed for `ty` since the predecessor this snapshot replaced, if recorded.
    pub(crate) fn changes(&self, ty: ResourceType) -> Option<&TypeChanges> {
        self.changes.get().map(|c| &c[ty.index()])
    }

    /// The names of `ty` that changed since `base` (a map of an earlier
    /// snapshot), if known without walking the maps: empty when `base` is this
    /// snapshot's map, the recorded changes when `base` is the predecessor's.
    ///
    /// When `base` is older, the recorded changes of the snapshots in between
    /// (kept alive by the cache's history) are merged: bounded by the history
    /// length, and cheaper than comparing the maps once they are large.
    pub(crate) fn changed_since(
        &self,
        ty: ResourceType,
        base: &Arc<ResourceMap>,
    ) -> Option<std::borrow::Cow<'_, [Arc<str>]>> {
        use std::borrow::Cow;
        if Arc::ptr_eq(base, self.resources(ty)) {
            return Some(Cow::Borrowed(&[]));
        }
        let first = self.changes(ty)?;
        if first.is_from(base) {
            return Some(Cow::Borrowed(first.names()));
        }
        let mut names: Vec<Arc<str>> = first.names().to_vec();
        let mut cur = self.prev.get()?.upgrade()?;
        // Bounded: a snapshot published in two groups in opposite orders
        // links both ways.
        for _ in 0..MAX_CHAIN {
            let c = cur.changes(ty)?;
            names.extend(c.names().iter().cloned());
            if c.is_from(base) {
                names.sort_unstable();
                names.dedup();
                return Some(Cow::Owned(names));
            }
            cur = cur.prev.get()?.upgrade()?;
        }
        None
    }

    /// Whether `base` (a map of an earlier snapshot) has exactly the names of
    /// this snapshot's map of `ty`, as far as the recorded changes tell
    /// (`false` when they do not reach back to `base`).
    pub(crate) fn same_keys_since(&self, ty: ResourceType, base: &Arc<ResourceMap>) -> bool {
        if Arc::ptr_eq(base, self.resources(ty)) {
            return true;
        }
        let Some(c) = self.changes(ty) else {
            return false;
        };
        if c.keys_changed() {
            return false;
        }
        if c.is_from(base) {
            return true;
        }
        let Some(mut cur) = self.prev.get().and_then(Weak::upgrade) else {
            return false;
        };
        for _ in 0..MAX_CHAIN {
            let next = {
                let Some(c) = cur.changes(ty) else {
                    return false;
                };
                if c.keys_changed() {
                    return false;
                }
                if c.is_from(base) {
                    return true;
                }
                match cur.prev.get().and_then(Weak::upgrade) {
                    Some(s) => s,
                    None => return false,
                }
            };
            cur = next;
        }
        false
    }
}

/// Collects resources and checks the result is consistent before it can be published.
///
/// Built from a previous snapshot ([`SnapshotBuilder::reuse_from`]), it costs about what
/// changed: a type whose resources are all the previous snapshot's shares its map and
/// version, and when that snapshot was checked, only the changed resources' references are
/// (a route edit among 10,000 clusters no longer re-checks 10,000 references).
#[derive(Default)]
pub struct SnapshotBuilder {
    /// Per type, in the order added (sorted and merged at build).
    added: [Vec<Arc<Resource>>; crate::resource::TYPE_COUNT],
    problems: Vec<Inconsistency>,
    reuse: Option<Arc<Snapshot>>,
}

impl SnapshotBuilder {
    /// Shares the `Arc` of every resource whose version is unchanged from
    /// `prev`, so a version lives in memory once however many snapshots hold it.
    pub fn reuse_from(mut self, prev: Arc<Snapshot>) -> Self {
        self.reuse = Some(prev);
        self
    }

    /// Adds a resource; a second resource with the same type and name is
    /// recorded as a problem and makes `build` fail.
    pub fn add(&mut self, resource: Arc<Resource>) -> &mut Self {
        self.added[resource.ty().index()].push(resource);
        self
    }

    /// Encodes and adds a typed Envoy message.
    pub fn message<M: XdsResource>(&mut self, msg: &M) -> Result<&mut Self, ResourceError> {
        let r = Resource::new(msg)?;
        Ok(self.add(r))
    }

    /// [`message`](Self::message), for chaining by value.
    pub fn with<M: XdsResource>(mut self, msg: &M) -> Result<Self, ResourceError> {
        self.message(msg)?;
        Ok(self)
    }

    /// Checks consistency: every reference resolves; every load assignment is
    /// used by a cluster and every route configuration by a listener. Unused
    /// secrets are allowed.
    pub fn build(self) -> Result<Snapshot, SnapshotError> {
        let prev = self.reuse.clone();
        let mut snapshot = self.into_snapshot()?;
        let quick = prev
            .as_deref()
            .filter(|p| p.checked)
            .and_then(|p| check_changes(p, &snapshot));
        let problems = match quick {
            Some(true) => Vec::new(),
            // A problem found in the changes, or changes the shortcut does not cover:
            // the full check gives the complete list.
            Some(false) | None => check_all(&snapshot),
        };
        if !problems.is_empty() {
            return Err(SnapshotError { problems });
        }
        snapshot.checked = true;
        Ok(snapshot)
    }

    /// Builds without the reference checks (duplicates are still refused).
    /// For clients that resolve references themselves, e.g. tests of bad input.
    pub fn build_unchecked(self) -> Result<Snapshot, SnapshotError> {
        self.into_snapshot()
    }

    /// Sorts each type's resources by name, refuses duplicates, shares every
    /// unchanged resource (and a wholly unchanged type's map) with `reuse`.
    fn into_snapshot(self) -> Result<Snapshot, SnapshotError> {
        let SnapshotBuilder {
            added,
            mut problems,
            reuse,
        } = self;
        let mut types: [Option<TypeResources>; crate::resource::TYPE_COUNT] = Default::default();
        for (i, mut list) in added.into_iter().enumerate() {
            // Stable and adaptive: already sorted input (translated resources) costs
            // one pass, and the first of two duplicates stays first.
            list.sort_by(|a, b| a.name().cmp(b.name()));
            let prev = reuse.as_ref().map(|p| &p.types[i]);
            let mut old = prev
                .map(|t| t.resources.iter())
                .into_iter()
                .flatten()
                .peekable();
            let mut all_reused = true;
            let mut entries: Vec<(Arc<str>, Arc<Resource>)> = Vec::with_capacity(list.len());
            for r in list {
                if entries.last().is_some_and(|(n, _)| **n == *r.name()) {
                    problems.push(Inconsistency::Duplicate {
                        ty: r.ty(),
                        name: r.name().to_string(),
                    });
                    continue;
                }
                let mut kept = None;
                while let Some((k, v)) = old.peek() {
                    match (***k).cmp(r.name()) {
                        Ordering::Less => {
                            old.next();
                            all_reused = false; // a name gone
                        }
                        Ordering::Equal => {
                            if Arc::ptr_eq(v, &r) || v.version() == r.version() {
                                kept = Some(((*k).clone(), (*v).clone()));
                            }
                            old.next();
                            break;
                        }
                        Ordering::Greater => break,
                    }
                }
                match kept {
                    Some(e) => entries.push(e),
                    None => {
                        all_reused = false;
                        entries.push((r.name_arc().clone(), r));
                    }
                }
            }
            all_reused &= old.next().is_none();
            types[i] = Some(match prev {
                Some(p) if all_reused => p.clone(),
                _ => TypeResources::new(entries.into_iter().collect()),
            });
        }
        if !problems.is_empty() {
            return Err(SnapshotError { problems });
        }
        Ok(Snapshot {
            types: types.map(|t| t.expect("every type is built")),
            changes: OnceLock::new(),
            prev: OnceLock::new(),
            checked: false,
        })
    }
}

/// Every problem of `snapshot`: references that do not resolve, load
/// assignments and route configurations nothing references.
fn check_all(snapshot: &Snapshot) -> Vec<Inconsistency> {
    let mut problems = Vec::new();
    let mut referenced: [std::collections::BTreeSet<Arc<str>>; crate::resource::TYPE_COUNT] =
        Default::default();
    for t in &snapshot.types {
        for res in t.resources.values() {
            for r in res.refs() {
                referenced[r.ty.index()].insert(r.name.clone());
                if !snapshot.types[r.ty.index()].resources.contains_key(&r.name) {
                    problems.push(Inconsistency::MissingRef {
                        from_ty: res.ty(),
                        from: res.name().to_string(),
                        ty: r.ty,
                        name: r.name.to_string(),
                    });
                }
            }
        }
    }
    for ty in [
        ResourceType::ClusterLoadAssignment,
        ResourceType::RouteConfiguration,
    ] {
        for name in snapshot.resources(ty).keys() {
            if !referenced[ty.index()].contains(name) {
                problems.push(Inconsistency::Unreferenced {
                    ty,
                    name: name.to_string(),
                });
            }
        }
    }
    problems
}

/// Checks `next` against `prev`, a checked (consistent) snapshot, by what
/// changed: `Some(true)` if `next` is consistent, `Some(false)` if a changed
/// resource has a reference that does not resolve, `None` when the changes
/// are of a kind only [`check_all`] can judge.
///
/// Sound because, when no name was removed, no load assignment or route
/// configuration was added and no changed resource dropped a reference, every
/// reference of an unchanged resource still resolves, and everything
/// referenced before still is (by the same, still present, referrers).
fn check_changes(prev: &Snapshot, next: &Snapshot) -> Option<bool> {
    let mut changed: Vec<(&Arc<Resource>, Option<&Arc<Resource>>)> = Vec::new();
    for (i, (p, n)) in prev.types.iter().zip(&next.types).enumerate() {
        if Arc::ptr_eq(&p.resources, &n.resources) {
            continue;
        }
        let mut old = p.resources.iter().peekable();
        for (name, r) in n.resources.iter() {
            let before = match old.peek().map(|(k, v)| ((***k).cmp(&**name), *v)) {
                Some((Ordering::Less, _)) => return None, // removed
                Some((Ordering::Equal, v)) => {
                    old.next();
                    Some(v)
                }
                _ => None,
            };
            match before {
                Some(b) if Arc::ptr_eq(b, r) => {}
                Some(b) => {
                    // Dropping a reference may leave its target unreferenced.
                    if !includes(r.refs(), b.refs()) {
                        return None;
                    }
                    changed.push((r, Some(b)));
                }
                None => {
                    if i == ResourceType::ClusterLoadAssignment.index()
                        || i == ResourceType::RouteConfiguration.index()
                    {
                        return None;
                    }
                    changed.push((r, None));
                }
            }
        }
        if old.next().is_some() {
            return None; // removed
        }
    }
    Some(changed.iter().all(|(r, _)| {
        r.refs()
            .iter()
            .all(|x| next.types[x.ty.index()].resources.contains_key(&x.name))
    }))
}

/// Whether sorted `all` holds every element of sorted `part`.
fn includes<T: Ord>(all: &[T], part: &[T]) -> bool {
    let mut it = all.iter();
    part.iter().all(|x| it.any(|y| y == x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::Ref;
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use envoy_types::pb::envoy::config::listener::v3::Listener;
    use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
    use proptest::prelude::*;

    /// A resource of type `ty` (0..4: cluster, load assignment, listener, route
    /// configuration) named `n{name}` with references to `refs` of the type it
    /// refers to; its bytes (and so its version) name its references.
    fn resource(ty: u8, name: u8, refs: &[u8]) -> Arc<Resource> {
        let (target, prefix) = match ty % 4 {
            0 => (ResourceType::ClusterLoadAssignment, "c"),
            1 => (ResourceType::ClusterLoadAssignment, "e"),
            2 => (ResourceType::RouteConfiguration, "l"),
            _ => (ResourceType::Cluster, "r"),
        };
        let n = format!("{prefix}{name}");
        let refs: Vec<Ref> = if ty % 4 == 1 {
            Vec::new()
        } else {
            refs.iter()
                .map(|r| Ref {
                    ty: target,
                    name: format!(
                        "{}{r}",
                        match target {
                            ResourceType::ClusterLoadAssignment => "e",
                            ResourceType::RouteConfiguration => "r",
                            _ => "c",
                        }
                    )
                    .into(),
                    hard: ty % 4 == 3,
                })
                .collect()
        };
        let bytes = format!("{n}{refs:?}").into_bytes();
        match ty % 4 {
            0 => Resource::from_encoded::<Cluster>(&n, &bytes, refs),
            1 => Resource::from_encoded::<ClusterLoadAssignment>(&n, &bytes, refs),
            2 => Resource::from_encoded::<Listener>(&n, &bytes, refs),
            _ => Resource::from_encoded::<RouteConfiguration>(&n, &bytes, refs),
        }
        .unwrap()
    }

    type Spec = Vec<(u8, u8, Vec<u8>)>;

    fn build(spec: &Spec, reuse: Option<&Arc<Snapshot>>) -> Result<Snapshot, SnapshotError> {
        let mut b = Snapshot::builder();
        if let Some(p) = reuse {
            b = b.reuse_from(p.clone());
        }
        for (ty, name, refs) in spec {
            b.add(resource(*ty, *name, refs));
        }
        b.build()
    }

    fn names(s: &Snapshot) -> Vec<Vec<(String, String)>> {
        ResourceType::ALL
            .iter()
            .map(|t| {
                s.resources(*t)
                    .iter()
                    .map(|(n, r)| (n.to_string(), r.version().to_string()))
                    .collect()
            })
            .collect()
    }

    proptest! {
        /// A snapshot built from a previous (checked) one, which checks only what changed,
        /// accepts and refuses exactly what a build from scratch does, with the same problems
        /// and the same resources and versions.
        #[test]
        fn building_from_a_previous_snapshot_equals_building_afresh(
            steps in proptest::collection::vec(
                proptest::collection::vec((0u8..4, 0u8..4, proptest::collection::vec(0u8..4, 0..3)), 0..12),
                1..10,
            ),
        ) {
            let mut prev: Option<Arc<Snapshot>> = None;
            for spec in &steps {
                let fresh = build(spec, None);
                let reused = build(spec, prev.as_ref());
                match (&fresh, &reused) {
                    (Ok(a), Ok(b)) => {
                        prop_assert_eq!(names(a), names(b));
                        prop_assert!(b.checked);
                    }
                    (Err(a), Err(b)) => prop_assert_eq!(a, b),
                    _ => prop_assert!(false, "fresh {:?} vs reused {:?}", fresh.is_ok(), reused.is_ok()),
                }
                if let Ok(s) = reused {
                    prev = Some(Arc::new(s));
                }
            }
        }
    }

    /// A type none of whose resources changed keeps the previous snapshot's map.
    #[test]
    fn an_unchanged_type_shares_its_map() {
        let a: Spec = vec![
            (0, 1, vec![1]),
            (1, 1, vec![]),
            (2, 1, vec![1]),
            (3, 1, vec![1]),
        ];
        let first = Arc::new(build(&a, None).unwrap());
        let mut b = a.clone();
        b[3] = (3, 1, vec![1, 1]);
        b.push((0, 2, vec![]));
        let second = build(&b, Some(&first)).unwrap();
        let cla = ResourceType::ClusterLoadAssignment;
        assert!(Arc::ptr_eq(first.resources(cla), second.resources(cla)));
        assert!(!Arc::ptr_eq(
            first.resources(ResourceType::Cluster),
            second.resources(ResourceType::Cluster)
        ));
        // A route configuration changed to name a missing cluster is refused.
        let mut c = a.clone();
        c[3] = (3, 1, vec![1, 3]);
        let err = build(&c, Some(&first)).unwrap_err();
        assert!(
            matches!(&err.problems[..], [Inconsistency::MissingRef { .. }]),
            "{err}"
        );
    }
}
