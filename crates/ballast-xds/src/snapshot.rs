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
#[derive(Default)]
pub struct SnapshotBuilder {
    maps: [ResourceMap; crate::resource::TYPE_COUNT],
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
        let ty = resource.ty();
        if self.maps[ty.index()].contains_key(resource.name()) {
            self.problems.push(Inconsistency::Duplicate {
                ty,
                name: resource.name().to_string(),
            });
            return self;
        }
        let resource = match self.reuse.as_ref().and_then(|p| p.get(ty, resource.name())) {
            Some(prev) if prev.version() == resource.version() => prev.clone(),
            _ => resource,
        };
        self.maps[ty.index()].insert(resource.name_arc().clone(), resource);
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
    pub fn build(mut self) -> Result<Snapshot, SnapshotError> {
        let mut problems = std::mem::take(&mut self.problems);
        let mut referenced: [std::collections::BTreeSet<Arc<str>>; crate::resource::TYPE_COUNT] =
            Default::default();
        for map in &self.maps {
            for res in map.values() {
                for r in res.refs() {
                    referenced[r.ty.index()].insert(r.name.clone());
                    if !self.maps[r.ty.index()].contains_key(&r.name) {
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
            for name in self.maps[ty.index()].keys() {
                if !referenced[ty.index()].contains(name) {
                    problems.push(Inconsistency::Unreferenced {
                        ty,
                        name: name.to_string(),
                    });
                }
            }
        }
        if !problems.is_empty() {
            return Err(SnapshotError { problems });
        }
        Ok(self.build_unchecked_inner())
    }

    /// Builds without the reference checks (duplicates are still refused).
    /// For clients that resolve references themselves, e.g. tests of bad input.
    pub fn build_unchecked(self) -> Result<Snapshot, SnapshotError> {
        if !self.problems.is_empty() {
            return Err(SnapshotError {
                problems: self.problems,
            });
        }
        Ok(self.build_unchecked_inner())
    }

    fn build_unchecked_inner(self) -> Snapshot {
        Snapshot {
            types: self.maps.map(TypeResources::new),
            changes: OnceLock::new(),
            prev: OnceLock::new(),
        }
    }
}
