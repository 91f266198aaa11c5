//! Snapshots: an immutable, internally consistent set of resources for one
//! group of proxies, with deterministic per-type versions.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock, Weak};

use crate::resource::{Ref, Resource, ResourceError, ResourceType, XdsResource};
use crate::version::SetHash;

/// Resources of one type keyed by name (sorted: versions and responses are deterministic).
///
/// A persistent map: a clone costs O(1) and shares every node, and an insert
/// or remove copies only the O(log n) path to its key, so a snapshot patched
/// by one route among 10,000 shares everything else with its predecessor,
/// and dropping an old snapshot frees only the nodes it alone holds.
pub type ResourceMap = imbl::OrdMap<Arc<str>, Arc<Resource>>;

/// The resources of one type in a snapshot, with their set version.
#[derive(Clone, Debug)]
pub struct TypeResources {
    version: Arc<str>,
    /// What `version` is made from, kept to update it by changes.
    hash: SetHash,
    resources: Arc<ResourceMap>,
    /// Which set of names `resources` has: a map derived from another by
    /// changing only values keeps its id; a new map or one with a name added
    /// or removed gets a new one. Equal ids mean equal names (unequal ids may
    /// still have them).
    keys: u64,
}

/// The last key-set id given out ([`TypeResources::key_set`]; 0 is "not known").
static KEY_SETS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn new_key_set() -> u64 {
    KEY_SETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
}

impl TypeResources {
    fn new(resources: ResourceMap) -> Self {
        let mut hash = SetHash::default();
        for (n, r) in &resources {
            hash.add(n, r.version());
        }
        TypeResources {
            version: hash.version().into(),
            hash,
            resources: Arc::new(resources),
            keys: new_key_set(),
        }
    }

    /// `resources`, which differ from `prev`'s by `diff`: hashes only those.
    fn updated(prev: &TypeResources, resources: ResourceMap, diff: &TypeDiff) -> Self {
        let mut hash = prev.hash;
        for old in &diff.gone {
            hash.remove(old.name(), old.version());
        }
        for (new, old) in &diff.changed {
            if let Some(old) = old {
                hash.remove(old.name(), old.version());
            }
            hash.add(new.name(), new.version());
        }
        debug_assert_eq!(hash.count(), resources.len() as u64);
        TypeResources {
            version: hash.version().into(),
            hash,
            resources: Arc::new(resources),
            keys: if diff.keys_changed {
                new_key_set()
            } else {
                prev.keys
            },
        }
    }
    /// The id of the map's set of names: equal ids mean equal names, in O(1)
    /// however many publishes apart (a subscription sharing a map's keys
    /// follows the next map by it, [`crate::protocol`]'s `Subscription::follow`).
    pub(crate) fn key_set(&self) -> u64 {
        self.keys
    }
    /// The order-independent hash of every resource's name and version
    /// that `version` is made from.
    pub(crate) fn set_hash(&self) -> SetHash {
        self.hash
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

/// How many publishes back the recorded changes are kept ([`ChangeLink`]),
/// and so how far back [`Snapshot::changed_since`] answers without walking
/// maps. Longer than the cache's history (16 snapshots): at 100 publishes a
/// second a stream paced at 100 ms is often more than 16 publishes behind
/// (W2, issue #13), and the changes are small next to the snapshots.
pub(crate) const MAX_CHAIN: usize = 128;

/// What one publish changed, linked to what the publish before it changed.
/// The links outlive the snapshots (the cache keeps only a short history),
/// so a stream many publishes behind still learns what changed since the map
/// it holds from the names alone. Each publish cuts the chain
/// [`MAX_CHAIN`] links back, or earlier once the links behind it name more
/// resources than the snapshot holds (merging them would cost more than
/// comparing the maps): the memory kept is bounded by about one snapshot's
/// names.
#[derive(Debug)]
struct ChangeLink {
    types: Arc<[TypeChanges; crate::resource::TYPE_COUNT]>,
    prev: parking_lot::Mutex<Option<Arc<ChangeLink>>>,
}

impl ChangeLink {
    fn prev(&self) -> Option<Arc<ChangeLink>> {
        self.prev.lock().clone()
    }

    /// How many names it lists, over every type.
    fn names(&self) -> usize {
        self.types.iter().map(|c| c.names.len()).sum()
    }
}

/// An immutable set of resources for one group, shared by every stream of that group.
#[derive(Clone, Debug)]
pub struct Snapshot {
    types: [TypeResources; crate::resource::TYPE_COUNT],
    /// What changed since the snapshot this one replaced, recorded once when it
    /// is published ([`crate::SnapshotCache::set_snapshot`]), so every stream
    /// planned against the predecessor only looks at what changed; linked to
    /// the predecessor's own changes, so a stream several publishes behind
    /// follows the chain instead of walking whole maps.
    changes: OnceLock<Arc<ChangeLink>>,
    /// Built with every reference checked ([`SnapshotBuilder::build`]): a
    /// snapshot built from this one only needs its changes checked.
    checked: bool,
    /// What differs from the snapshot this one was built from
    /// ([`SnapshotBuilder::reuse_from`]), found by the build's merge: when that
    /// snapshot is the one it replaces in the cache, recording the changes
    /// costs nothing more (no walk of 10,000 names per edit).
    built: Option<Arc<[TypeChanges; crate::resource::TYPE_COUNT]>>,
    /// [`Snapshot::changes_since`] answers already computed, per base map:
    /// the streams of a group that were last in sync with the same map share
    /// one merge and one lookup per changed name (issue #13, W2).
    since: SinceCache,
}

/// One name whose resource differs between a base map and a snapshot's map.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Change {
    /// The name.
    pub(crate) name: Arc<str>,
    /// Its resource in the base map, if any.
    pub(crate) old: Option<Arc<Resource>>,
    /// Its resource in the snapshot, if any.
    pub(crate) new: Option<Arc<Resource>>,
}

/// How many answers of [`Snapshot::changes_since`] a snapshot keeps (a
/// stream paced at 100 ms is about 10 publishes behind at 100 publishes a
/// second: about 10 distinct bases at a time).
const SINCE_ENTRIES: usize = 16;

/// Cached [`Snapshot::changes_since`] answers, oldest first. Never cloned
/// with the snapshot (a clone starts empty), emptied when the snapshot is
/// replaced in the cache, and bounded by [`SINCE_ENTRIES`] and a number of
/// changes proportional to the snapshot's size.
#[derive(Default)]
struct SinceCache(parking_lot::Mutex<Vec<SinceEntry>>);

struct SinceEntry {
    ty: ResourceType,
    /// The base map (a `Weak` keeps the allocation: comparing its address
    /// with a live map's is sound).
    base: Weak<ResourceMap>,
    changes: Arc<[Change]>,
}

impl Clone for SinceCache {
    fn clone(&self) -> Self {
        SinceCache::default()
    }
}

impl fmt::Debug for SinceCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SinceCache({} entries)", self.0.lock().len())
    }
}

/// The names of one type whose resource differs between two maps.
#[derive(Clone, Debug)]
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
            checked: true,
            built: None,
            since: SinceCache::default(),
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

    /// The names of `ty` whose resource differs from `base`'s (added, removed or
    /// with another version), when this snapshot was built or patched from `base`
    /// ([`SnapshotBuilder::reuse_from`], [`Snapshot::patched`]) or shares its map;
    /// `None` when that is not known without comparing the maps. Lets a consumer
    /// compare a snapshot with the one it replaces in O(change) (the guard).
    pub fn changed_from(&self, ty: ResourceType, base: &Snapshot) -> Option<&[Arc<str>]> {
        if Arc::ptr_eq(self.resources(ty), base.resources(ty)) {
            return Some(&[]);
        }
        let c = &self.built.as_ref()?[ty.index()];
        c.is_from(base.resources(ty)).then(|| c.names())
    }

    /// Whether every reference of every resource resolves here (built by
    /// [`SnapshotBuilder::build`], which checks).
    pub(crate) fn is_checked(&self) -> bool {
        self.checked
    }

    /// Records what changed since `prev` (once; later calls are ignored).
    /// Called when the snapshot replaces `prev` in the cache.
    pub(crate) fn record_changes_from(&self, prev: &Arc<Snapshot>) {
        if self.changes.get().is_some() {
            return;
        }
        let changes = std::array::from_fn(|i| {
            let base = &prev.types[i].resources;
            match self.built.as_ref().map(|b| &b[i]) {
                Some(c) if c.is_from(base) => c.clone(),
                _ => TypeChanges::between(base, &self.types[i].resources),
            }
        });
        let link = Arc::new(ChangeLink {
            types: Arc::new(changes),
            prev: parking_lot::Mutex::new(prev.changes.get().cloned()),
        });
        if self.changes.set(link.clone()).is_err() {
            return;
        }
        // Streams move to this snapshot: the predecessor's answers would
        // only keep memory.
        prev.since.0.lock().clear();
        // Bound the chain: cut it MAX_CHAIN links back, or where the links
        // behind name more resources than this snapshot holds.
        let budget = self.total().max(MAX_CHAIN);
        let mut names = link.names();
        let mut cur = link;
        for _ in 1..MAX_CHAIN {
            let Some(next) = cur.prev() else {
                return;
            };
            names += next.names();
            if names > budget {
                break;
            }
            cur = next;
        }
        // Dropped here, outside the lock: at most a few links (each publish
        // cuts), so no deep recursive drop.
        let cut = cur.prev.lock().take();
        drop(cut);
    }

    /// What changed for `ty` since the predecessor this snapshot replaced, if recorded.
    pub(crate) fn changes(&self, ty: ResourceType) -> Option<&TypeChanges> {
        self.changes.get().map(|c| &c.types[ty.index()])
    }

    /// The names of `ty` that changed since `base` (a map of an earlier
    /// snapshot), if known without walking the maps: empty when `base` is this
    /// snapshot's map, the recorded changes when `base` is the predecessor's.
    ///
    /// When `base` is older, the recorded changes of the publishes in between
    /// (kept by the chain of [`ChangeLink`]s, up to [`MAX_CHAIN`] publishes,
    /// beyond the cache's history) are merged: cheaper than comparing the maps
    /// once they are large.
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
        let mut cur = self.changes.get()?.prev()?;
        // Bounded: the chain is cut at MAX_CHAIN links, and a link is made
        // once, pointing to an existing one (no cycle).
        for _ in 0..MAX_CHAIN {
            let c = &cur.types[ty.index()];
            names.extend(c.names().iter().cloned());
            if c.is_from(base) {
                names.sort_unstable_by(crate::protocol::cmp_names);
                names.dedup_by(|a, b| Arc::ptr_eq(a, b) || a == b);
                return Some(Cow::Owned(names));
            }
            cur = cur.prev()?;
        }
        None
    }

    /// What changed for `ty` since `base` (a map of an earlier snapshot), with
    /// each changed name's resource there and here: the names of
    /// [`Snapshot::changed_since`] (sorted), or of comparing the maps when
    /// `walk` is set and the recorded changes do not reach `base` (else
    /// `None`). Computed once per base map and kept (bounded, see
    /// [`SINCE_ENTRIES`]): the streams of a group that were last in sync
    /// with the same map share one merge and the lookups, so a stream's plan
    /// looks nothing up in either map for a changed name.
    pub(crate) fn changes_since(
        &self,
        ty: ResourceType,
        base: &Arc<ResourceMap>,
        walk: bool,
    ) -> Option<Arc<[Change]>> {
        let whole = self.resources(ty);
        if Arc::ptr_eq(base, whole) {
            static NONE: OnceLock<Arc<[Change]>> = OnceLock::new();
            return Some(NONE.get_or_init(|| Arc::from(Vec::new())).clone());
        }
        let key = Arc::as_ptr(base);
        {
            let cache = self.since.0.lock();
            if let Some(e) = cache
                .iter()
                .find(|e| e.ty == ty && std::ptr::eq(e.base.as_ptr(), key))
            {
                return Some(e.changes.clone());
            }
        }
        let walked;
        let names: &[Arc<str>] = match self.changed_since(ty, base) {
            Some(names) => {
                walked = names.into_owned();
                &walked
            }
            None if walk => {
                walked = TypeChanges::between(base, whole).names;
                &walked
            }
            None => return None,
        };
        let (mut old, mut new) = (
            crate::protocol::Seeker::sparse(&**base, names.len()),
            crate::protocol::Seeker::sparse(&**whole, names.len()),
        );
        let changes: Arc<[Change]> = names
            .iter()
            .map(|n| Change {
                name: n.clone(),
                old: old.get(n).cloned(),
                new: new.get(n).cloned(),
            })
            .collect();
        let mut cache = self.since.0.lock();
        let held: usize = cache.iter().map(|e| e.changes.len()).sum();
        // Bounded: a few bases, and about twice the snapshot's names.
        if held + changes.len() <= 2 * self.total() + 1024
            && !cache
                .iter()
                .any(|e| e.ty == ty && std::ptr::eq(e.base.as_ptr(), key))
        {
            if cache.len() >= SINCE_ENTRIES {
                cache.remove(0);
            }
            cache.push(SinceEntry {
                ty,
                base: Arc::downgrade(base),
                changes: changes.clone(),
            });
        }
        Some(changes)
    }

    /// Whether `base` (a map of an earlier snapshot) has exactly the names of
    /// this snapshot's map of `ty`, as far as the recorded changes tell
    /// (`false` when they do not reach back to `base`).
    pub(crate) fn same_keys_since(&self, ty: ResourceType, base: &Arc<ResourceMap>) -> bool {
        if Arc::ptr_eq(base, self.resources(ty)) {
            return true;
        }
        let Some(mut cur) = self.changes.get().cloned() else {
            return false;
        };
        for _ in 0..=MAX_CHAIN {
            let c = &cur.types[ty.index()];
            if c.keys_changed() {
                return false;
            }
            if c.is_from(base) {
                return true;
            }
            match cur.prev() {
                Some(next) => cur = next,
                None => return false,
            }
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
        let (snapshot, built) = self.into_snapshot()?;
        checked(snapshot, built.as_ref())
    }

    /// Builds without the reference checks (duplicates are still refused).
    /// For clients that resolve references themselves, e.g. tests of bad input.
    pub fn build_unchecked(self) -> Result<Snapshot, SnapshotError> {
        self.into_snapshot().map(|(s, _)| s)
    }

    /// Sorts each type's resources by name, refuses duplicates, shares every
    /// unchanged resource (and a wholly unchanged type's map) with `reuse`.
    ///
    /// Also returns, per type, what differs from `reuse` (found during the
    /// merge, so neither the reference check nor the cache's change record
    /// walks the maps again).
    fn into_snapshot(self) -> Result<(Snapshot, Option<Built>), SnapshotError> {
        let SnapshotBuilder {
            added,
            mut problems,
            reuse,
        } = self;
        let mut types: [Option<TypeResources>; crate::resource::TYPE_COUNT] = Default::default();
        let mut built: [TypeDiff; crate::resource::TYPE_COUNT] = Default::default();
        for (i, mut list) in added.into_iter().enumerate() {
            let prev = reuse.as_ref().map(|p| &p.types[i]);
            let merged = match merge_type(&list, prev) {
                Some(m) => m,
                None => {
                    // Stable: the first of two duplicates stays first.
                    list.sort_by(|a, b| a.name().cmp(b.name()));
                    merge_type(&list, prev).expect("sorted input merges")
                }
            };
            problems.extend(merged.problems);
            types[i] = Some(match (prev, merged.entries) {
                (Some(p), None) => p.clone(),
                (None, None) => TypeResources::new(ResourceMap::new()),
                // The previous map with the differences applied: shares every
                // untouched node with it instead of building a second map.
                (Some(p), Some(_)) => {
                    let mut m = (*p.resources).clone();
                    for old in &merged.diff.gone {
                        m.remove(old.name());
                    }
                    for (r, _) in &merged.diff.changed {
                        m.insert(interned(&p.resources, r.name_arc()), r.clone());
                    }
                    TypeResources::updated(p, m, &merged.diff)
                }
                (None, Some(entries)) => TypeResources::new(entries.into_iter().collect()),
            });
            built[i] = merged.diff;
        }
        if !problems.is_empty() {
            return Err(SnapshotError { problems });
        }
        let snapshot = Snapshot {
            types: types.map(|t| t.expect("every type is built")),
            changes: OnceLock::new(),
            checked: false,
            built: None,
            since: SinceCache::default(),
        };
        let mut snapshot = snapshot;
        let built = reuse.map(|prev| {
            let changes: [TypeChanges; crate::resource::TYPE_COUNT] =
                std::array::from_fn(|i| TypeChanges {
                    base: Arc::downgrade(&prev.types[i].resources),
                    names: std::mem::take(&mut built[i].names),
                    keys_changed: built[i].keys_changed,
                });
            snapshot.built = Some(Arc::new(changes));
            Built {
                prev,
                changed: built,
            }
        });
        Ok((snapshot, built))
    }
}

/// Checks `snapshot` (built from `built.prev` when given): by its changes when the snapshot
/// it was built from was checked, else every reference.
fn checked(mut snapshot: Snapshot, built: Option<&Built>) -> Result<Snapshot, SnapshotError> {
    let quick = built
        .filter(|b| b.prev.checked)
        .and_then(|b| check_changes(b, &snapshot));
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

/// One change for [`Snapshot::patched`].
#[derive(Clone, Debug)]
pub enum SnapshotChange {
    /// Adds the resource, or replaces the one of its type and name.
    Put(Arc<Resource>),
    /// Removes the resource of this type and name, if there is one.
    Remove(ResourceType, Arc<str>),
}

impl Snapshot {
    /// `prev` with `changes` applied in order (the last change of a name wins): the snapshot
    /// a [`SnapshotBuilder`] reusing `prev` builds from the resulting resources, checked
    /// ([`SnapshotBuilder::build`]) or not ([`SnapshotBuilder::build_unchecked`]), without
    /// being handed every resource: untouched types share `prev`'s maps, a touched type's
    /// map is `prev`'s with the changes applied (O(changes · log n): the persistent map shares
    /// every untouched node), and only the changes are hashed and (when `prev` was checked)
    /// checked. For a producer that knows what changed (the
    /// translator patching one virtual host among 10,000).
    pub fn patched(
        prev: &Arc<Snapshot>,
        changes: impl IntoIterator<Item = SnapshotChange>,
        check: bool,
    ) -> Result<Snapshot, SnapshotError> {
        const N: usize = crate::resource::TYPE_COUNT;
        let mut last: [BTreeMap<Arc<str>, Option<Arc<Resource>>>; N] = Default::default();
        for c in changes {
            match c {
                SnapshotChange::Put(r) => {
                    last[r.ty().index()].insert(r.name_arc().clone(), Some(r));
                }
                SnapshotChange::Remove(ty, name) => {
                    last[ty.index()].insert(name, None);
                }
            }
        }
        let mut diffs: [TypeDiff; N] = Default::default();
        let mut types: [Option<TypeResources>; N] = Default::default();
        for (i, wanted) in last.into_iter().enumerate() {
            let p = &prev.types[i];
            let diff = &mut diffs[i];
            let mut map: Option<ResourceMap> = None;
            for (name, new) in wanted {
                let (name, old) = match p.resources.get_key_value(&name) {
                    Some((k, o)) => (k.clone(), Some(o)),
                    None => (name, None),
                };
                // An equal version keeps the previous `Arc`, as the builder's merge does.
                if let (Some(o), Some(r)) = (old, &new)
                    && o.version() == r.version()
                {
                    continue;
                }
                if old.is_none() && new.is_none() {
                    continue;
                }
                let m = map.get_or_insert_with(|| (*p.resources).clone());
                diff.names.push(name.clone());
                match new {
                    Some(r) => {
                        diff.keys_changed |= old.is_none();
                        diff.changed.push((r.clone(), old.cloned()));
                        m.insert(name, r);
                    }
                    None => {
                        diff.keys_changed = true;
                        diff.removed = true;
                        diff.gone.extend(m.remove(&name));
                    }
                }
            }
            types[i] = Some(match map {
                None => p.clone(),
                Some(m) => TypeResources::updated(p, m, diff),
            });
        }
        let changes: [TypeChanges; N] = std::array::from_fn(|i| TypeChanges {
            base: Arc::downgrade(&prev.types[i].resources),
            names: std::mem::take(&mut diffs[i].names),
            keys_changed: diffs[i].keys_changed,
        });
        let snapshot = Snapshot {
            types: types.map(|t| t.expect("every type is patched")),
            changes: OnceLock::new(),
            checked: false,
            built: Some(Arc::new(changes)),
            since: SinceCache::default(),
        };
        if !check {
            return Ok(snapshot);
        }
        let built = Built {
            prev: prev.clone(),
            changed: diffs,
        };
        checked(snapshot, Some(&built))
    }
}

/// The key `prev` already has for `name`, else `name`: a resource replaced
/// by a new version keeps its map key's `Arc`, so the names of successive
/// snapshots stay equal by address (subscriptions share them, and comparing
/// two maps' keys, `same_keys`, or seeking a name, `Seeker`, then needs no
/// string comparison).
fn interned(prev: &ResourceMap, name: &Arc<str>) -> Arc<str> {
    match prev.get_key_value(name) {
        Some((k, _)) => k.clone(),
        None => name.clone(),
    }
}

/// What a build changed relative to the snapshot it reused: per type, the
/// resources added or given a new version (with the one they replace), and
/// whether some name was removed.
struct Built {
    prev: Arc<Snapshot>,
    changed: [TypeDiff; crate::resource::TYPE_COUNT],
}

/// One type's differences from the reused snapshot, in name order.
#[derive(Default)]
struct TypeDiff {
    /// Added (`None`) or replaced resources.
    changed: Vec<(Arc<Resource>, Option<Arc<Resource>>)>,
    /// Names added, removed or with a new version (sorted).
    names: Vec<Arc<str>>,
    /// Some name was added or removed.
    keys_changed: bool,
    /// Some name was removed.
    removed: bool,
    /// The removed resources.
    gone: Vec<Arc<Resource>>,
}

/// One type merged with the previous snapshot's map.
struct Merged {
    /// `None`: exactly the previous map (share it). With a previous map,
    /// `Some` is empty: apply `diff` to it.
    entries: Option<Vec<(Arc<str>, Arc<Resource>)>>,
    problems: Vec<Inconsistency>,
    diff: TypeDiff,
}

/// Merges `list` (expected sorted by name) with `prev`'s map in one walk:
/// a resource that is the previous map's next entry (the same `Arc`, the
/// translator's cache hit) costs a pointer comparison — it is necessarily
/// after the last name taken, since the previous map is sorted — and only
/// the others are compared by name. `None` if `list` is not sorted.
///
/// No vector is built while the merge only repeats a prefix of the previous
/// map, so a type without changes costs no allocation.
fn merge_type(list: &[Arc<Resource>], prev: Option<&TypeResources>) -> Option<Merged> {
    let prev_map = prev.map(|p| &*p.resources);
    let mut old = prev_map.into_iter().flat_map(|m| m.iter()).peekable();
    let mut problems = Vec::new();
    let mut diff = TypeDiff::default();
    // `None` while every entry so far is the previous map's prefix of length `prefix`.
    let mut entries: Option<Vec<(Arc<str>, Arc<Resource>)>> = None;
    let mut prefix = 0usize;
    // With a previous map the caller applies `diff` to it: the entries are
    // only collected without one (`Some(empty)` then just says "differs").
    let collect = prev.is_none();
    let diverge = |entries: &mut Option<Vec<(Arc<str>, Arc<Resource>)>>, prefix: usize| {
        if entries.is_none() && !collect {
            *entries = Some(Vec::new());
        }
        if entries.is_none() {
            let mut v = Vec::with_capacity(list.len());
            v.extend(
                prev_map
                    .into_iter()
                    .flat_map(|m| m.iter())
                    .take(prefix)
                    .map(|(k, r)| (k.clone(), r.clone())),
            );
            *entries = Some(v);
        }
    };
    let mut last: Option<&str> = None;
    for r in list {
        // Invariant: the next old name is after `last`.
        if let Some(&(k, v)) = old.peek()
            && Arc::ptr_eq(v, r)
        {
            old.next();
            match entries.as_mut() {
                None => prefix += 1,
                Some(e) if collect => e.push((k.clone(), v.clone())),
                Some(_) => {}
            }
            last = Some(k);
            continue;
        }
        if let Some(l) = last {
            match r.name().cmp(l) {
                Ordering::Less => return None,
                Ordering::Equal => {
                    problems.push(Inconsistency::Duplicate {
                        ty: r.ty(),
                        name: r.name().to_string(),
                    });
                    continue;
                }
                Ordering::Greater => {}
            }
        }
        let mut kept = None;
        let mut before = None;
        while let Some(&(k, v)) = old.peek() {
            match (**k).cmp(r.name()) {
                Ordering::Less => {
                    // A name gone.
                    diverge(&mut entries, prefix);
                    diff.names.push(k.clone());
                    diff.gone.push(v.clone());
                    diff.keys_changed = true;
                    diff.removed = true;
                    old.next();
                }
                Ordering::Equal => {
                    if v.version() == r.version() {
                        kept = Some((k, v));
                    } else {
                        before = Some(v);
                    }
                    old.next();
                    break;
                }
                Ordering::Greater => break,
            }
        }
        match kept {
            Some((k, v)) => {
                match entries.as_mut() {
                    None => prefix += 1,
                    Some(e) if collect => e.push((k.clone(), v.clone())),
                    Some(_) => {}
                }
                last = Some(k);
            }
            None => {
                diverge(&mut entries, prefix);
                diff.names.push(r.name_arc().clone());
                diff.keys_changed |= before.is_none();
                diff.changed.push((r.clone(), before.cloned()));
                if collect {
                    entries
                        .as_mut()
                        .expect("diverged")
                        .push((r.name_arc().clone(), r.clone()));
                }
                last = Some(r.name());
            }
        }
    }
    if old.peek().is_some() {
        diverge(&mut entries, prefix);
        for (k, v) in old {
            diff.names.push(k.clone());
            diff.gone.push(v.clone());
        }
        diff.keys_changed = true;
        diff.removed = true;
    }
    Some(Merged {
        entries,
        problems,
        diff,
    })
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

/// Checks `next` against `b.prev`, a checked (consistent) snapshot, by what
/// the build changed: `Some(true)` if `next` is consistent, `Some(false)` if a
/// changed resource has a reference that does not resolve, `None` when the
/// changes are of a kind only [`check_all`] can judge.
///
/// Sound because, when no name was removed, no load assignment or route
/// configuration was added and no changed resource dropped a reference, every
/// reference of an unchanged resource still resolves, and everything
/// referenced before still is (by the same, still present, referrers). For
/// the same reason a replaced resource's references that its predecessor
/// also had still resolve: only its new ones are looked up (a route edit
/// among 10,000 clusters looks up none).
fn check_changes(b: &Built, next: &Snapshot) -> Option<bool> {
    let mut fresh: Vec<&Ref> = Vec::new();
    for (i, d) in b.changed.iter().enumerate() {
        if d.removed {
            return None;
        }
        for (r, before) in &d.changed {
            match before {
                Some(old) => fresh.extend(added_refs(r.refs(), old.refs())?),
                None => {
                    if i == ResourceType::ClusterLoadAssignment.index()
                        || i == ResourceType::RouteConfiguration.index()
                    {
                        return None;
                    }
                    fresh.extend(r.refs());
                }
            }
        }
    }
    Some(
        fresh
            .iter()
            .all(|x| next.types[x.ty.index()].resources.contains_key(&x.name)),
    )
}

/// The elements of sorted `all` that sorted `part` lacks, or `None` when
/// `part` has one `all` lacks (a dropped reference).
fn added_refs<'a, T: Ord>(all: &'a [T], part: &[T]) -> Option<Vec<&'a T>> {
    // A route configuration patched with the same clusters shares its reference list
    // (`Resource::from_encoded_parts_shared`): nothing to walk.
    if std::ptr::eq(all, part) {
        return Some(Vec::new());
    }
    let mut out = Vec::new();
    let mut it = all.iter();
    for x in part {
        loop {
            match it.next() {
                None => return None,
                Some(y) => match y.cmp(x) {
                    Ordering::Less => out.push(y),
                    Ordering::Equal => break,
                    Ordering::Greater => return None,
                },
            }
        }
    }
    out.extend(it);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
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

    /// A resource replaced by a new version keeps its map key's `Arc`, built
    /// or patched: successive snapshots' names stay equal by address.
    #[test]
    fn a_replaced_resource_keeps_its_key() {
        let ty = ResourceType::ClusterLoadAssignment;
        let first = Arc::new(
            Snapshot::builder()
                .with(&crate::simple::load_assignment("e1", &[("10.0.0.1", 80)]))
                .unwrap()
                .build_unchecked()
                .unwrap(),
        );
        let key = |s: &Snapshot| s.resources(ty).keys().next().unwrap().clone();
        let next =
            Resource::new(&crate::simple::load_assignment("e1", &[("10.0.0.2", 80)])).unwrap();
        assert!(!Arc::ptr_eq(next.name_arc(), &key(&first)));
        let patched =
            Snapshot::patched(&first, [SnapshotChange::Put(next.clone())], false).unwrap();
        assert_eq!(patched.get(ty, "e1").unwrap().version(), next.version());
        assert!(Arc::ptr_eq(&key(&patched), &key(&first)));
        assert!(Arc::ptr_eq(
            &patched.changed_from(ty, &first).unwrap()[0],
            &key(&first)
        ));
        let mut b = Snapshot::builder().reuse_from(first.clone());
        b.add(next.clone());
        let built = b.build_unchecked().unwrap();
        assert_eq!(built.get(ty, "e1").unwrap().version(), next.version());
        assert!(Arc::ptr_eq(&key(&built), &key(&first)));
    }

    type Spec = Vec<(u8, u8, Vec<u8>)>;

    fn build(spec: &Spec, reuse: Option<&Arc<Snapshot>>) -> Result<Snapshot, SnapshotError> {
        build_shared(spec, reuse, None)
    }

    /// Resources already made for a spec entry: a translator's cache, so
    /// unchanged resources come back as the same `Arc`.
    type Made = std::collections::HashMap<(u8, u8, Vec<u8>), Arc<Resource>>;

    fn build_shared(
        spec: &Spec,
        reuse: Option<&Arc<Snapshot>>,
        mut made: Option<&mut Made>,
    ) -> Result<Snapshot, SnapshotError> {
        let mut b = Snapshot::builder();
        if let Some(p) = reuse {
            b = b.reuse_from(p.clone());
        }
        for (ty, name, refs) in spec {
            let r = match made.as_deref_mut() {
                Some(m) => m
                    .entry((*ty % 4, *name, refs.clone()))
                    .or_insert_with(|| resource(*ty, *name, refs))
                    .clone(),
                None => resource(*ty, *name, refs),
            };
            b.add(r);
        }
        b.build()
    }

    /// The changes a build recorded against `prev` are those a walk of both finds.
    fn assert_built_changes(prev: &Snapshot, next: &Snapshot) -> Result<(), TestCaseError> {
        let built = next.built.as_ref().expect("built from prev");
        for ty in ResourceType::ALL {
            let i = ty.index();
            let walked = TypeChanges::between(prev.resources(ty), next.resources(ty));
            prop_assert!(built[i].is_from(prev.resources(ty)));
            prop_assert_eq!(built[i].names(), walked.names(), "{}", ty);
            // A name added and one removed in one walk count as a key change
            // either way; with no names listed, no key changed.
            prop_assert_eq!(built[i].keys_changed(), walked.keys_changed(), "{}", ty);
        }
        Ok(())
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
                (
                    proptest::collection::vec((0u8..4, 0u8..4, proptest::collection::vec(0u8..4, 0..3)), 0..12),
                    any::<bool>(),
                ),
                1..10,
            ),
        ) {
            let mut prev: Option<Arc<Snapshot>> = None;
            // Half the steps reuse the `Arc`s of equal resources (the merge's pointer path).
            let mut made = Made::new();
            for (spec, share) in &steps {
                let fresh = build(spec, None);
                let reused = build_shared(spec, prev.as_ref(), share.then_some(&mut made));
                match (&fresh, &reused) {
                    (Ok(a), Ok(b)) => {
                        prop_assert_eq!(names(a), names(b));
                        for ty in ResourceType::ALL {
                            prop_assert_eq!(a.version(ty), b.version(ty), "{}", ty);
                        }
                        prop_assert!(b.checked);
                        if let Some(p) = &prev {
                            assert_built_changes(p, b)?;
                        }
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

    /// The type and name `resource(ty, name, _)` has.
    fn key_of(ty: u8, name: u8) -> (ResourceType, Arc<str>) {
        let (t, prefix) = match ty % 4 {
            0 => (ResourceType::Cluster, "c"),
            1 => (ResourceType::ClusterLoadAssignment, "e"),
            2 => (ResourceType::Listener, "l"),
            _ => (ResourceType::RouteConfiguration, "r"),
        };
        (t, format!("{prefix}{name}").into())
    }

    proptest! {
        /// Patching a snapshot with changes equals building the resulting resources with a
        /// builder reusing it: same acceptance, problems, resources, versions, recorded
        /// changes and `checked`, with and without the check, from checked and unchecked
        /// predecessors.
        #[test]
        fn patching_equals_building_the_result(
            base in proptest::collection::vec((0u8..4, 0u8..4, proptest::collection::vec(0u8..4, 0..3)), 0..12),
            steps in proptest::collection::vec(
                (
                    proptest::collection::vec(
                        (any::<bool>(), 0u8..4, 0u8..4, proptest::collection::vec(0u8..4, 0..3)),
                        0..6,
                    ),
                    any::<bool>(),
                ),
                1..8,
            ),
        ) {
            // Duplicates would make the base fail: keep the last of each name.
            let mut cur: BTreeMap<(ResourceType, Arc<str>), Arc<Resource>> = base
                .iter()
                .map(|(t, n, refs)| (key_of(*t, *n), resource(*t, *n, refs)))
                .collect();
            let mut b = Snapshot::builder();
            for r in cur.values() {
                b.add(r.clone());
            }
            let mut prev = Arc::new(b.build_unchecked().unwrap());
            for (changes, check) in &steps {
                let mut list = Vec::new();
                let mut next = cur.clone();
                for (put, t, n, refs) in changes {
                    let (ty, name) = key_of(*t, *n);
                    if *put {
                        let r = resource(*t, *n, refs);
                        next.insert((ty, name), r.clone());
                        list.push(SnapshotChange::Put(r));
                    } else {
                        next.remove(&(ty, name.clone()));
                        list.push(SnapshotChange::Remove(ty, name));
                    }
                }
                let mut b = Snapshot::builder().reuse_from(prev.clone());
                for r in next.values() {
                    b.add(r.clone());
                }
                let fresh = if *check { b.build() } else { b.build_unchecked() };
                let patched = Snapshot::patched(&prev, list, *check);
                match (&fresh, &patched) {
                    (Ok(a), Ok(p)) => {
                        prop_assert_eq!(names(a), names(p));
                        for ty in ResourceType::ALL {
                            prop_assert_eq!(a.version(ty), p.version(ty), "{}", ty);
                            // Untouched types share the map, as the builder's do.
                            prop_assert_eq!(
                                Arc::ptr_eq(a.resources(ty), prev.resources(ty)),
                                Arc::ptr_eq(p.resources(ty), prev.resources(ty)),
                                "{}", ty
                            );
                        }
                        prop_assert_eq!(a.checked, p.checked);
                        assert_built_changes(&prev, p)?;
                    }
                    (Err(a), Err(p)) => prop_assert_eq!(a, p),
                    _ => prop_assert!(false, "built {:?} vs patched {:?}", fresh.is_ok(), patched.is_ok()),
                }
                if let Ok(p) = patched {
                    prev = Arc::new(p);
                    cur = next;
                }
            }
        }
    }

    /// Maps of every type of a snapshot, and their key-set ids.
    type Published = (Vec<Arc<ResourceMap>>, Vec<u64>);

    /// Publishes `steps` after `base` as the cache does, keeping only the
    /// last `history` snapshots alive but every map (streams hold them):
    /// returns the maps (and key-set ids) of every snapshot, in order, and
    /// the last snapshot. With `rebuild`, every other step builds the next
    /// snapshot from all its resources reusing the previous one instead of
    /// patching it.
    fn publish_chain(
        base: &[(u8, u8)],
        steps: &[Vec<(bool, u8, u8)>],
        history: usize,
        rebuild: bool,
    ) -> (Vec<Published>, Arc<Snapshot>) {
        let mut cur: BTreeMap<(ResourceType, Arc<str>), Arc<Resource>> = base
            .iter()
            .map(|(t, n)| (key_of(*t, *n), resource(*t, *n, &[])))
            .collect();
        let mut b = Snapshot::builder();
        for r in cur.values() {
            b.add(r.clone());
        }
        let mut prev = Arc::new(b.build_unchecked().unwrap());
        let maps_of = |s: &Snapshot| {
            (
                ResourceType::ALL.map(|ty| s.resources(ty).clone()).to_vec(),
                ResourceType::ALL.map(|ty| s.of(ty).key_set()).to_vec(),
            )
        };
        let mut maps = vec![maps_of(&prev)];
        let mut kept = std::collections::VecDeque::from([prev.clone()]);
        for (round, changes) in steps.iter().enumerate() {
            let list: Vec<SnapshotChange> = changes
                .iter()
                .map(|(put, t, n)| {
                    let key = key_of(*t, *n);
                    if *put {
                        // A new version each round (the bytes name the round).
                        let r = resource(*t, *n, &[round as u8 % 4, *n]);
                        cur.insert(key, r.clone());
                        SnapshotChange::Put(r)
                    } else {
                        cur.remove(&key);
                        SnapshotChange::Remove(key.0, key.1)
                    }
                })
                .collect();
            let next = if rebuild && round % 2 == 1 {
                let mut b = Snapshot::builder().reuse_from(prev.clone());
                for r in cur.values() {
                    b.add(r.clone());
                }
                b.build_unchecked().unwrap()
            } else {
                Snapshot::patched(&prev, list, false).unwrap()
            };
            let next = Arc::new(next);
            next.record_changes_from(&prev);
            maps.push(maps_of(&next));
            kept.push_front(next.clone());
            kept.truncate(history);
            prev = next;
        }
        (maps, prev)
    }

    proptest! {
        /// What the chain of recorded changes says since any earlier map a
        /// stream may hold, however far the cache's history reaches, agrees
        /// with comparing the maps: `changed_since` lists every name that
        /// differs (and only names that changed and maybe changed back), and
        /// `same_keys_since` is true exactly when no publish in between added
        /// or removed a name. Within MAX_CHAIN publishes both always answer.
        #[test]
        fn recorded_changes_agree_with_comparing_the_maps(
            base in proptest::collection::btree_set((0u8..4, 0u8..6), 0..12),
            steps in proptest::collection::vec(
                proptest::collection::vec((proptest::bool::weighted(0.8), 0u8..4, 0u8..6), 0..5),
                1..24,
            ),
            history in 1usize..4,
            rebuild in any::<bool>(),
        ) {
            let base: Vec<(u8, u8)> = base.into_iter().collect();
            let (published, last) = publish_chain(&base, &steps, history, rebuild);
            let maps: Vec<&Vec<Arc<ResourceMap>>> = published.iter().map(|p| &p.0).collect();
            let now = maps[maps.len() - 1];
            for (i, held) in maps.iter().enumerate() {
                for ty in ResourceType::ALL {
                    let t = ty.index();
                    let walked = TypeChanges::between(&held[t], &now[t]);
                    let listed = last.changed_since(ty, &held[t]);
                    prop_assert!(listed.is_some(), "{} from map {} of {}: not reached", ty, i, maps.len());
                    let listed = listed.unwrap();
                    prop_assert!(listed.windows(2).all(|w| w[0] < w[1]), "sorted, deduplicated");
                    for n in walked.names() {
                        prop_assert!(listed.contains(n), "{} {} missing", ty, n);
                    }
                    for n in listed.iter() {
                        let (a, b) = (held[t].get(n), now[t].get(n));
                        let differs = match (a, b) {
                            (Some(a), Some(b)) => a.version() != b.version(),
                            (None, None) => false,
                            _ => true,
                        };
                        prop_assert_eq!(differs, walked.names().contains(n), "{} {}", ty, n);
                    }
                    // The changes with their resources, computed once per
                    // base and then answered from the snapshot's cache: equal
                    // to looking each listed name up in both maps.
                    let scratch: Vec<Change> = listed
                        .iter()
                        .map(|n| Change {
                            name: n.clone(),
                            old: held[t].get(n).cloned(),
                            new: now[t].get(n).cloned(),
                        })
                        .collect();
                    let first = last.changes_since(ty, &held[t], true);
                    let again = last.changes_since(ty, &held[t], false);
                    prop_assert_eq!(first.as_deref(), Some(&scratch[..]), "{} from map {}", ty, i);
                    prop_assert_eq!(again.as_deref(), Some(&scratch[..]), "{} from map {}, cached", ty, i);
                    // Shared, not merged again.
                    prop_assert!(Arc::ptr_eq(&first.unwrap(), &again.unwrap()));
                    let keys_kept = maps[i..].windows(2).all(|w| {
                        w[0][t].keys().eq(w[1][t].keys())
                    });
                    prop_assert_eq!(last.same_keys_since(ty, &held[t]), keys_kept, "{} from map {}", ty, i);
                    // Key-set ids: equal exactly when no step in between
                    // added or removed a name (patched or built alike).
                    let same_id = published[i].1[t] == last.of(ty).key_set();
                    prop_assert_eq!(same_id, keys_kept, "{} key set from map {}", ty, i);
                    if same_id {
                        prop_assert!(held[t].keys().eq(now[t].keys()));
                    }
                }
            }
        }
    }

    /// The chain is cut MAX_CHAIN publishes back: older maps are compared.
    #[test]
    fn recorded_changes_reach_back_max_chain_publishes() {
        let steps: Vec<Vec<(bool, u8, u8)>> = (0..MAX_CHAIN + 3)
            .map(|i| vec![(true, 0, (i % 3) as u8)])
            .collect();
        let (published, last) = publish_chain(&[(0, 0), (0, 1), (0, 2)], &steps, 1, false);
        let maps: Vec<&Vec<Arc<ResourceMap>>> = published.iter().map(|p| &p.0).collect();
        let eds = ResourceType::Cluster;
        let t = eds.index();
        let at = |i: usize| last.changed_since(eds, &maps[i][t]).map(|c| c.len());
        assert_eq!(at(maps.len() - 1), Some(0));
        assert_eq!(at(maps.len() - MAX_CHAIN - 1), Some(3));
        assert_eq!(at(maps.len() - MAX_CHAIN - 2), None);
        // Past the chain: only by comparing the maps.
        let old = &maps[maps.len() - MAX_CHAIN - 2][t];
        assert_eq!(last.changes_since(eds, old, false), None);
        let walked = last.changes_since(eds, old, true).expect("walked");
        let names: Vec<&Arc<str>> = walked.iter().map(|c| &c.name).collect();
        let between = TypeChanges::between(old, last.resources(eds));
        assert_eq!(names, between.names().iter().collect::<Vec<_>>());
        assert!(walked.iter().all(|c| c.old.as_ref() != c.new.as_ref()));
        assert!(!last.same_keys_since(eds, &maps[0][t]));
        assert!(last.same_keys_since(eds, &maps[maps.len() - MAX_CHAIN - 1][t]));
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
