//! The blast-radius guard (invariant 9, docs/architecture.md): a new snapshot
//! that would remove more than a configured share of a gateway's listeners,
//! routes or clusters is held for a settle period and published only if the
//! source still says so.
//!
//! A mass deletion is more often an accident (a half-synced directory, a bad
//! template, a truncated file) than an intent; holding it costs a few seconds
//! when it is intended and saves an outage when it is not.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ballast_xds::{Resource, ResourceMap, ResourceType, Snapshot};
use prost::Message;

#[derive(Clone, Debug)]
pub struct GuardConfig {
    pub enabled: bool,
    /// Share (0..=1) of a kind that may be removed in one publish.
    pub max_removal: f64,
    pub settle: Duration,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            enabled: true,
            max_removal: 0.5,
            settle: Duration::from_secs(10),
        }
    }
}

/// The identities the guard counts in a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inventory {
    pub listeners: BTreeSet<String>,
    pub clusters: BTreeSet<String>,
    /// Routes by (route configuration, virtual host, route name or encoded match), and the
    /// routes of TLS/TCP listeners (their `tcp_proxy` filter chains) by (`listener:{name}`,
    /// filter chain name, empty): removing every TLSRoute of a listener is as much a mass
    /// deletion as removing every HTTPRoute.
    pub routes: BTreeSet<(String, String, Vec<u8>)>,
}

impl Inventory {
    pub fn of(snapshot: &Snapshot) -> Inventory {
        let names = |ty| {
            snapshot
                .resources(ty)
                .keys()
                .map(|k| k.to_string())
                .collect::<BTreeSet<_>>()
        };
        let mut routes = BTreeSet::new();
        for (name, res) in snapshot.resources(ResourceType::RouteConfiguration).iter() {
            let Ok(rc) = RouteIds::decode(res.value_bytes()) else {
                continue;
            };
            for vh in rc.virtual_hosts {
                for r in vh.routes {
                    // A named route keeps its identity when its match is edited;
                    // unnamed routes are identified by their (encoded) match.
                    let id = if r.name.is_empty() {
                        r.r#match
                    } else {
                        r.name.into_bytes()
                    };
                    routes.insert((name.to_string(), vh.name.clone(), id));
                }
            }
        }
        for (name, res) in snapshot.resources(ResourceType::Listener).iter() {
            let Ok(l) = ListenerIds::decode(res.value_bytes()) else {
                continue;
            };
            for chain in l.filter_chains {
                if chain.filters.iter().any(|f| f.name == TCP_PROXY) {
                    routes.insert((format!("listener:{name}"), chain.name, Vec::new()));
                }
            }
        }
        Inventory {
            listeners: names(ResourceType::Listener),
            clusters: names(ResourceType::Cluster),
            routes,
        }
    }
}

/// The fields of a `RouteConfiguration` the guard counts (same field numbers):
/// decoding only these skips every route's action, a few times cheaper than a
/// full decode of a large configuration on every publish.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RouteIds {
    #[prost(message, repeated, tag = "2")]
    pub(crate) virtual_hosts: Vec<HostIds>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HostIds {
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    #[prost(message, repeated, tag = "3")]
    pub(crate) routes: Vec<RouteId>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RouteId {
    /// `Route.match`, kept encoded.
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) r#match: Vec<u8>,
    #[prost(string, tag = "14")]
    pub(crate) name: String,
}

pub(crate) const TCP_PROXY: &str = "envoy.filters.network.tcp_proxy";

/// The fields of a `Listener` the guard counts: filter chain names and filter names.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ListenerIds {
    #[prost(message, repeated, tag = "3")]
    pub(crate) filter_chains: Vec<ChainIds>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ChainIds {
    #[prost(message, repeated, tag = "3")]
    pub(crate) filters: Vec<FilterName>,
    #[prost(string, tag = "7")]
    pub(crate) name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct FilterName {
    #[prost(string, tag = "1")]
    pub(crate) name: String,
}

/// The guard's record of a published snapshot, so that judging the next snapshot costs what
/// changed: the names the snapshot's build recorded as changed ([`Snapshot::changed_from`];
/// a walk of the names, pointer comparisons, when it did not), and the bytes of the route
/// configurations and listeners that changed, instead of a fresh [`Inventory`] of every
/// cluster name and route identity on every publish (a route edit among 10,000 routes copied
/// 10,000 names and decoded 10,000 route ids).
#[derive(Clone, Debug)]
pub struct Book {
    pub snapshot: Arc<Snapshot>,
    /// Distinct route identities in `snapshot`, as [`Inventory::routes`] counts them.
    pub routes: usize,
    /// `snapshot`'s [`Inventory`] is that of the book this one followed
    /// ([`Book::next`]): the state file need not be written again (a route's
    /// backend edited among 10,000 routes changes no name and no route id).
    pub same_inventory: bool,
    /// Where the top-level fields of route configurations of `snapshot` start, by name, as
    /// far as known: finding the changed virtual hosts of the next version then parses only
    /// them, not the length prefixes of all 10,000 on both sides (5 % of a W3 edit).
    fields: BTreeMap<Arc<str>, RouteFields>,
}

/// The field starts of one encoded route configuration ([`field_starts`]).
#[derive(Clone, Debug)]
struct RouteFields {
    /// The resource they are of.
    resource: Arc<Resource>,
    starts: Arc<[u32]>,
}

impl Book {
    /// The book of `snapshot` with `routes` route identities (counted by the caller's full
    /// [`Inventory`], e.g. the one a first publish is judged with).
    pub fn counted(snapshot: Arc<Snapshot>, routes: usize) -> Book {
        Book {
            snapshot,
            routes,
            same_inventory: false,
            fields: BTreeMap::new(),
        }
    }

    /// Counts everything.
    #[cfg(test)]
    pub fn new(snapshot: Arc<Snapshot>) -> Book {
        let routes = Inventory::of(&snapshot).routes.len();
        Book::counted(snapshot, routes)
    }

    /// What publishing `next` instead of this book's snapshot would remove (equal to
    /// [`Removal::between`] their inventories), and the book of `next`.
    pub fn next(&self, next: Arc<Snapshot>) -> (Removal, Book) {
        let old = &self.snapshot;
        let count = |ty| {
            let removed = match next.changed_from(ty, old) {
                Some(names) => names
                    .iter()
                    .filter(|n| old.get(ty, n).is_some() && next.get(ty, n).is_none())
                    .count(),
                None => removed_names(old.resources(ty), next.resources(ty)),
            };
            (removed, old.resources(ty).len())
        };
        let mut routes = RouteDelta::default();
        let mut fields = self.fields.clone();
        changed_pairs(
            old,
            &next,
            ResourceType::RouteConfiguration,
            |name, a, b| {
                let known = a.and_then(|a| {
                    self.fields
                        .get(name)
                        .filter(|f| {
                            Arc::ptr_eq(&f.resource, a) || f.resource.version() == a.version()
                        })
                        .map(|f| &*f.starts)
                });
                match (b, routes.route_config(a, b, known)) {
                    (Some(b), Some(starts)) => {
                        fields.insert(
                            Arc::from(name),
                            RouteFields {
                                resource: b.clone(),
                                starts,
                            },
                        );
                    }
                    _ => {
                        fields.remove(name);
                    }
                }
            },
        );
        changed_pairs(old, &next, ResourceType::Listener, |_, a, b| {
            routes.listener(a.map(|a| &**a), b.map(|b| &**b))
        });
        let removal = Removal {
            listeners: count(ResourceType::Listener),
            routes: (routes.removed, self.routes),
            clusters: count(ResourceType::Cluster),
        };
        // No name removed and as many names: the same names.
        let same_names = |ty| {
            old.resources(ty).len() == next.resources(ty).len()
                && match ty {
                    ResourceType::Listener => removal.listeners.0 == 0,
                    _ => removal.clusters.0 == 0,
                }
        };
        let same_inventory = !routes.ids_changed
            && same_names(ResourceType::Listener)
            && same_names(ResourceType::Cluster);
        debug_assert!(
            routes.dropped <= self.routes + routes.added,
            "the dropped ids were counted in this book"
        );
        let total = (self.routes + routes.added).saturating_sub(routes.dropped);
        (
            removal,
            Book {
                snapshot: next,
                routes: total,
                same_inventory,
                fields,
            },
        )
    }
}

/// How many names of `old` are not in `new`: one ordered walk; names of resources kept from
/// the previous snapshot share their `Arc`, so most steps are pointer comparisons.
fn removed_names(old: &Arc<ResourceMap>, new: &Arc<ResourceMap>) -> usize {
    if Arc::ptr_eq(old, new) {
        return 0;
    }
    let mut removed = 0;
    let mut b = new.keys().peekable();
    for ka in old.keys() {
        loop {
            match b.peek() {
                Some(kb) if Arc::ptr_eq(ka, kb) => {
                    b.next();
                    break;
                }
                Some(kb) => match (***kb).cmp(&**ka) {
                    std::cmp::Ordering::Less => {
                        b.next();
                    }
                    std::cmp::Ordering::Equal => {
                        b.next();
                        break;
                    }
                    std::cmp::Ordering::Greater => {
                        removed += 1;
                        break;
                    }
                },
                None => {
                    removed += 1;
                    break;
                }
            }
        }
    }
    removed
}

/// Calls `f` for every name of `ty` whose resource differs between `old` and `new` (either
/// side `None` when absent): the names `new`'s build recorded, else a walk of both maps.
fn changed_pairs(
    old: &Snapshot,
    new: &Snapshot,
    ty: ResourceType,
    mut f: impl FnMut(&str, Option<&Arc<Resource>>, Option<&Arc<Resource>>),
) {
    let (om, nm) = (old.resources(ty), new.resources(ty));
    if Arc::ptr_eq(om, nm) {
        return;
    }
    let same =
        |a: &Arc<Resource>, b: &Arc<Resource>| Arc::ptr_eq(a, b) || a.version() == b.version();
    if let Some(names) = new.changed_from(ty, old) {
        for name in names {
            match (om.get(name), nm.get(name)) {
                (None, None) => {}
                (Some(a), Some(b)) if same(a, b) => {}
                (a, b) => f(name, a, b),
            }
        }
        return;
    }
    for (name, a) in om.iter() {
        match nm.get(name) {
            Some(b) if same(a, b) => {}
            b => f(name, Some(a), b),
        }
    }
    for (name, b) in nm.iter() {
        if !om.contains_key(name) {
            f(name, None, Some(b));
        }
    }
}

/// Route identities (virtual host, id) of a part of a route configuration, or chain names
/// of a listener; a set, as [`Inventory::routes`] counts them.
type Ids = BTreeSet<(String, Vec<u8>)>;

/// Route identities removed, dropped and added by the changed resources.
#[derive(Default)]
struct RouteDelta {
    /// In the old version, not in the new one (what the guard judges).
    removed: usize,
    /// Counted in the old version's part that changed (leaves the total).
    dropped: usize,
    /// Counted in the new version's part that changed (joins the total).
    added: usize,
    /// Some changed part has other identities than before.
    ids_changed: bool,
}

impl RouteDelta {
    fn add(&mut self, old: Ids, new: Ids) {
        self.ids_changed |= old != new;
        self.removed += old.difference(&new).count();
        self.dropped += old.len();
        self.added += new.len();
    }

    /// Counts a route configuration's change; `known`: the field starts of `old`, if known.
    /// Returns those of `new`, if it parses as fields.
    fn route_config(
        &mut self,
        old: Option<&Arc<Resource>>,
        new: Option<&Arc<Resource>>,
        known: Option<&[u32]>,
    ) -> Option<Arc<[u32]>> {
        if let (Some(a), Some(b)) = (
            old.and_then(|r| r.value_chunks()),
            new.and_then(|r| r.value_chunks()),
        ) {
            self.route_config_chunks(a, b);
            return None;
        }
        let (old, new) = (
            old.map(|r| r.value_bytes()).unwrap_or_default(),
            new.map(|r| r.value_bytes()).unwrap_or_default(),
        );
        let (a, b, starts) = changed_hosts(&old, &new, known);
        self.add(a, b);
        starts
    }

    /// [`RouteDelta::route_config`] of two versions built from chunks, each chunk whole fields
    /// (the translator cuts route configurations between virtual hosts): the chunks both
    /// share at the front and at the back are skipped unread, and only the ones between
    /// are compared, field by field. Counts the same removals and the same net total as
    /// comparing the whole bytes (the window may hold more unchanged hosts, counted both as
    /// dropped and as added).
    fn route_config_chunks<B: AsRef<[u8]>>(&mut self, old: &[B], new: &[B]) {
        let (front, back) = shared_ends(old, new);
        let window = |c: &[B]| -> Vec<u8> {
            let c = &c[front..c.len() - back];
            let mut v = Vec::with_capacity(c.iter().map(|x| x.as_ref().len()).sum());
            for x in c {
                v.extend_from_slice(x.as_ref());
            }
            v
        };
        let (a, b) = (window(old), window(new));
        let (a, b, _) = changed_hosts(&a, &b, None);
        self.add(a, b);
    }

    fn listener(&mut self, old: Option<&Resource>, new: Option<&Resource>) {
        let ids = |r: Option<&Resource>| -> Ids {
            let Some(l) = r.and_then(|r| ListenerIds::decode(r.value_bytes()).ok()) else {
                return Ids::new();
            };
            l.filter_chains
                .into_iter()
                .filter(|c| c.filters.iter().any(|f| f.name == TCP_PROXY))
                .map(|c| (c.name, Vec::new()))
                .collect()
        };
        self.add(ids(old), ids(new));
    }
}

/// One top-level field of an encoded message: its start, end and payload (length-delimited
/// fields only). `None` at anything but a well-formed field.
pub(crate) fn next_field(buf: &[u8], at: usize) -> Option<(u32, usize, Option<&[u8]>)> {
    let mut rest = buf.get(at..)?;
    let len = rest.len();
    let key = prost::encoding::decode_varint(&mut rest).ok()?;
    let number = u32::try_from(key >> 3).ok()?;
    if number == 0 {
        return None;
    }
    let payload = match key & 7 {
        0 => {
            prost::encoding::decode_varint(&mut rest).ok()?;
            None
        }
        1 => {
            rest = rest.get(8..)?;
            None
        }
        5 => {
            rest = rest.get(4..)?;
            None
        }
        2 => {
            let n = usize::try_from(prost::encoding::decode_varint(&mut rest).ok()?).ok()?;
            let p = rest.get(..n)?;
            rest = &rest[n..];
            Some(p)
        }
        _ => return None,
    };
    Some((number, at + len - rest.len(), payload))
}

/// The start offsets of every top-level field, or `None` if the bytes do not parse as fields
/// (or are 4 GiB or more).
fn field_starts(buf: &[u8]) -> Option<Vec<u32>> {
    u32::try_from(buf.len()).ok()?;
    let mut starts = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        starts.push(at as u32);
        at = next_field(buf, at)?.1;
    }
    Some(starts)
}

/// The route identities of the virtual hosts (`RouteConfiguration.virtual_hosts`, field 2)
/// among the fields of `buf` starting at `starts`.
fn host_ids(buf: &[u8], starts: &[u32]) -> Ids {
    let mut ids = Ids::new();
    for &at in starts {
        let Some((2, _, Some(payload))) = next_field(buf, at as usize) else {
            continue;
        };
        let Ok(vh) = HostIds::decode(payload) else {
            continue;
        };
        for r in vh.routes {
            ids.insert((vh.name.clone(), route_id(r)));
        }
    }
    ids
}

/// A named route keeps its identity when its match is edited; unnamed routes are identified
/// by their (encoded) match.
fn route_id(r: RouteId) -> Vec<u8> {
    if r.name.is_empty() {
        r.r#match
    } else {
        r.name.into_bytes()
    }
}

/// The route identities of the virtual hosts that differ between two encodings of a route
/// configuration, as (old part, new part) — the rest is byte-identical in both — and the
/// field starts of `new`. `known`: those of `old`, if known (else they are found).
///
/// Fields before the first differing byte are identical, and so are the fields from the
/// first field boundary, within the common suffix, that both encodings share: from there on
/// both parse the same bytes. With `old`'s field starts known, a route edit among 10,000
/// virtual hosts parses one virtual host on each side and finds the boundaries around it by
/// binary search; `new`'s starts are `old`'s around the new middle, shifted. Counting the
/// parts as sets is exact because Envoy (and Ballast) name virtual hosts uniquely within a
/// route configuration.
/// How many chunks `old` and `new` share at the front and at the back (not overlapping): the
/// same bytes, most often the same `Bytes` (compared by pointer, unread); a chunk rebuilt
/// with equal bytes (the route configuration's name field is encoded anew each time) is
/// compared, and a differing one costs a compare up to its first differing byte.
fn shared_ends<B: AsRef<[u8]>>(old: &[B], new: &[B]) -> (usize, usize) {
    let same = |(x, y): &(&B, &B)| {
        let (x, y) = (x.as_ref(), y.as_ref());
        (x.as_ptr() == y.as_ptr() && x.len() == y.len()) || x == y
    };
    let front = old.iter().zip(new).take_while(same).count();
    let back = old[front..]
        .iter()
        .rev()
        .zip(new[front..].iter().rev())
        .take_while(same)
        .count();
    (front, back)
}

fn changed_hosts(old: &[u8], new: &[u8], known: Option<&[u32]>) -> (Ids, Ids, Option<Arc<[u32]>>) {
    // Not parseable as fields: count whatever decodes, whole.
    let whole = || {
        let all = |b: &[u8]| match RouteIds::decode(b) {
            Ok(rc) => rc
                .virtual_hosts
                .into_iter()
                .flat_map(|vh| {
                    let host = vh.name;
                    vh.routes
                        .into_iter()
                        .map(move |r| (host.clone(), route_id(r)))
                })
                .collect(),
            Err(_) => Ids::new(),
        };
        (all(old), all(new), field_starts(new).map(Arc::from))
    };
    let found;
    let so: &[u32] = match known {
        Some(k) => k,
        None => match field_starts(old) {
            Some(s) => {
                found = s;
                &found
            }
            None => return whole(),
        },
    };
    if u32::try_from(new.len()).is_err() {
        return whole();
    }
    let prefix = common_prefix(old, new);
    let max_suffix = old.len().min(new.len()) - prefix;
    let suffix = common_suffix(&old[prefix..], &new[prefix..]).min(max_suffix);
    let (old_tail, new_tail) = (old.len() - suffix, new.len() - suffix);
    // The first field that does not end within the common prefix (fields before it are the
    // same in both: same bytes, same boundaries).
    // Field `k` ends where field `k + 1` starts (the last at the end).
    let first = match so.get(1..) {
        None => 0,
        Some(next) => {
            let m = next.partition_point(|&e| e as usize <= prefix);
            if m == next.len() && old.len() <= prefix {
                so.len()
            } else {
                m
            }
        }
    };
    let begin = so.get(first).map_or(old.len(), |&b| b as usize);
    // `new`'s fields from there, up to the first boundary in the common suffix that is one
    // in `old` too (the end of both at the latest).
    let mut middle = Vec::new();
    let mut t = begin;
    let last = loop {
        if t >= new_tail {
            let s = t - new_tail + old_tail;
            if s == old.len() {
                break so.len();
            }
            if let Ok(k) = so.binary_search(&(s as u32)) {
                break k;
            }
        }
        if t >= new.len() {
            // Unreachable for well-formed `old` starts; be safe.
            return whole();
        }
        middle.push(t as u32);
        match next_field(new, t) {
            Some((_, end, _)) => t = end,
            None => return whole(),
        }
    };
    let shift = |s: u32| (i64::from(s) + new.len() as i64 - old.len() as i64) as u32;
    let starts: Arc<[u32]> = so[..first]
        .iter()
        .copied()
        .chain(middle.iter().copied())
        .chain(so[last..].iter().map(|&s| shift(s)))
        .collect();
    (
        host_ids(old, &so[first..last]),
        host_ids(new, &middle),
        Some(starts),
    )
}

/// Block sizes of [`common_prefix`] and [`common_suffix`]: 4 KiB blocks find the block where
/// the two differ in ~210 `memcmp` calls over a 869 KB route configuration (256-byte blocks
/// took ~3,400, each call's overhead above its 256 bytes' compare: issue #13, W3), then 64-byte
/// blocks within it, then bytes.
const COMMON_BLOCKS: [usize; 2] = [4096, 64];

/// How many leading bytes `a` and `b` share; block by block (memcmp), then byte by byte.
pub(crate) fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let mut at = 0;
    for block in COMMON_BLOCKS {
        let same = a[at..]
            .chunks_exact(block)
            .zip(b[at..].chunks_exact(block))
            .take_while(|(x, y)| x == y)
            .count();
        at += same * block;
    }
    at + a[at..]
        .iter()
        .zip(&b[at..])
        .take_while(|(x, y)| x == y)
        .count()
}

/// How many trailing bytes `a` and `b` share.
pub(crate) fn common_suffix(a: &[u8], b: &[u8]) -> usize {
    let mut at = 0;
    for block in COMMON_BLOCKS {
        let same = a[..a.len() - at]
            .rchunks_exact(block)
            .zip(b[..b.len() - at].rchunks_exact(block))
            .take_while(|(x, y)| x == y)
            .count();
        at += same * block;
    }
    at + a[..a.len() - at]
        .iter()
        .rev()
        .zip(b[..b.len() - at].iter().rev())
        .take_while(|(x, y)| x == y)
        .count()
}

/// What would be removed, per kind, as (removed, of total).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal {
    pub listeners: (usize, usize),
    pub routes: (usize, usize),
    pub clusters: (usize, usize),
}

impl Removal {
    pub fn between(current: &Inventory, next: &Inventory) -> Removal {
        fn count<T: Ord>(cur: &BTreeSet<T>, next: &BTreeSet<T>) -> (usize, usize) {
            (cur.difference(next).count(), cur.len())
        }
        Removal {
            listeners: count(&current.listeners, &next.listeners),
            routes: count(&current.routes, &next.routes),
            clusters: count(&current.clusters, &next.clusters),
        }
    }

    /// The first kind whose removed share exceeds `max`, described for status and logs.
    pub fn exceeds(&self, max: f64) -> Option<String> {
        for (kind, (removed, total)) in [
            ("listeners", self.listeners),
            ("routes", self.routes),
            ("clusters", self.clusters),
        ] {
            if total > 0 && removed as f64 / total as f64 > max {
                return Some(format!(
                    "would remove {removed} of {total} {kind} ({:.0}% > {:.0}%)",
                    100.0 * removed as f64 / total as f64,
                    100.0 * max
                ));
            }
        }
        None
    }
}

/// Decides whether a new snapshot may be published now.
pub fn judge(cfg: &GuardConfig, current: Option<&Inventory>, next: &Inventory) -> Option<String> {
    if !cfg.enabled {
        return None;
    }
    let current = current?;
    judge_removal(cfg, &Removal::between(current, next))
}

/// [`judge`] for a removal already counted (e.g. by [`Book::next`]).
pub fn judge_removal(cfg: &GuardConfig, removal: &Removal) -> Option<String> {
    if !cfg.enabled {
        return None;
    }
    removal.exceeds(cfg.max_removal)
}

/// A virtual host `h{h}` (domain `h{h}.example`) with routes given as (name `r{n}` or none,
/// prefix `/{p}`): the fixture of the guard's and the state encoder's property tests.
#[cfg(test)]
pub(crate) fn test_virtual_host(
    h: u8,
    routes: &[(Option<u8>, u8)],
) -> ballast_xds::envoy_types::pb::envoy::config::route::v3::VirtualHost {
    use ballast_xds::envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
    use ballast_xds::envoy_types::pb::envoy::config::route::v3::{Route, RouteMatch, VirtualHost};
    VirtualHost {
        name: format!("h{h}"),
        domains: vec![format!("h{h}.example")],
        routes: routes
            .iter()
            .map(|(name, prefix)| Route {
                name: name.map(|n| format!("r{n}")).unwrap_or_default(),
                r#match: Some(RouteMatch {
                    path_specifier: Some(PathSpecifier::Prefix(format!("/{prefix}"))),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inv(listeners: usize, clusters: usize, routes: usize) -> Inventory {
        Inventory {
            listeners: (0..listeners).map(|i| format!("l{i}")).collect(),
            clusters: (0..clusters).map(|i| format!("c{i}")).collect(),
            routes: (0..routes)
                .map(|i| ("rc".to_string(), format!("vh{i}"), vec![]))
                .collect(),
        }
    }

    #[test]
    fn holds_large_removals_only() {
        let cfg = GuardConfig::default();
        let cur = inv(2, 10, 100);
        assert_eq!(
            judge(&cfg, Some(&cur), &inv(2, 10, 60)),
            None,
            "40% is allowed"
        );
        let held = judge(&cfg, Some(&cur), &inv(2, 10, 20)).unwrap();
        assert!(held.contains("80 of 100 routes"), "{held}");
        assert!(judge(&cfg, Some(&cur), &inv(0, 10, 100)).is_some());
        assert!(judge(&cfg, Some(&cur), &inv(2, 4, 100)).is_some());
        // Additions and first publishes are never held.
        assert_eq!(judge(&cfg, Some(&cur), &inv(5, 50, 500)), None);
        assert_eq!(judge(&cfg, None, &inv(0, 0, 0)), None);
    }

    #[test]
    fn replacing_most_routes_counts_as_removal() {
        let cur = inv(1, 1, 10);
        let mut next = inv(1, 1, 0);
        next.routes = (100..110)
            .map(|i| ("rc".to_string(), format!("vh{i}"), vec![]))
            .collect();
        assert!(judge(&GuardConfig::default(), Some(&cur), &next).is_some());
    }

    /// The block-by-block common prefix and suffix equal a byte-by-byte count, for byte
    /// strings that differ at every position around the 64-byte and 4 KiB block edges (or
    /// nowhere), with lengths around them, both ways round.
    #[test]
    fn common_prefix_and_suffix_count_bytes() {
        let naive = |a: &[u8], b: &[u8]| {
            (
                a.iter().zip(b).take_while(|(x, y)| x == y).count(),
                a.iter()
                    .rev()
                    .zip(b.iter().rev())
                    .take_while(|(x, y)| x == y)
                    .count(),
            )
        };
        let base: Vec<u8> = (0..9000u32).map(|i| (i * 7 % 13) as u8).collect();
        let edges = [
            0, 1, 63, 64, 65, 127, 4095, 4096, 4097, 4160, 8191, 8192, 8193,
        ];
        let mut checked = 0;
        for len in [0, 1, 64, 100, 4096, 4159, 8192, 9000] {
            let a = &base[..len];
            for cut in [0, 1, 64, 4096] {
                for at in edges
                    .iter()
                    .flat_map(|&e| [Some(e), Some(len.saturating_sub(e + 1))])
                    .chain([None])
                {
                    let mut b = a[..len.saturating_sub(cut)].to_vec();
                    if let Some(x) = at.and_then(|at| b.get_mut(at)) {
                        *x ^= 0x80;
                    }
                    let (prefix, suffix) = naive(a, &b);
                    assert_eq!(
                        common_prefix(a, &b),
                        prefix,
                        "len {len} cut {cut} at {at:?}"
                    );
                    assert_eq!(
                        common_suffix(a, &b),
                        suffix,
                        "len {len} cut {cut} at {at:?}"
                    );
                    assert_eq!(common_prefix(&b, a), prefix);
                    assert_eq!(common_suffix(&b, a), suffix);
                    checked += 1;
                }
            }
        }
        assert!(checked > 500);
    }

    #[test]
    fn disabled_guard_never_holds() {
        let cfg = GuardConfig {
            enabled: false,
            ..GuardConfig::default()
        };
        assert_eq!(judge(&cfg, Some(&inv(5, 5, 5)), &inv(0, 0, 0)), None);
    }
}

#[cfg(test)]
mod inventory_tests {
    use super::*;
    use ballast_xds::envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
    use ballast_xds::envoy_types::pb::envoy::config::route::v3::{
        Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route::Action,
        route_action::ClusterSpecifier,
    };

    fn snap(routes: &[(&str, &str)]) -> Snapshot {
        let rc = RouteConfiguration {
            name: "rc".into(),
            virtual_hosts: vec![VirtualHost {
                name: "vh".into(),
                domains: vec!["*".into()],
                routes: routes
                    .iter()
                    .map(|(name, prefix)| Route {
                        name: name.to_string(),
                        r#match: Some(RouteMatch {
                            path_specifier: Some(PathSpecifier::Prefix(prefix.to_string())),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        };
        Snapshot::builder()
            .with(&rc)
            .unwrap()
            .build_unchecked()
            .unwrap()
    }

    /// The guard reads only names and matches; what it reads equals a full
    /// decode, whatever else the routes carry.
    #[test]
    fn route_ids_equal_those_of_a_full_decode() {
        let route = |name: &str, prefix: &str, cluster: &str| Route {
            name: name.into(),
            r#match: Some(RouteMatch {
                path_specifier: Some(PathSpecifier::Prefix(prefix.into())),
                ..Default::default()
            }),
            action: Some(Action::Route(RouteAction {
                cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.into())),
                ..Default::default()
            })),
            ..Default::default()
        };
        let rc = RouteConfiguration {
            name: "rc".into(),
            virtual_hosts: vec![
                VirtualHost {
                    name: "a".into(),
                    domains: vec!["a".into()],
                    routes: vec![route("r1", "/x", "c1"), route("", "/y", "c2")],
                    ..Default::default()
                },
                VirtualHost {
                    name: "b".into(),
                    domains: vec!["b".into()],
                    routes: vec![route("", "/z", "c3")],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let full: Vec<(String, Vec<u8>)> = rc
            .virtual_hosts
            .iter()
            .flat_map(|vh| {
                vh.routes.iter().map(|r| {
                    let id = if r.name.is_empty() {
                        r.r#match
                            .as_ref()
                            .map(|m| m.encode_to_vec())
                            .unwrap_or_default()
                    } else {
                        r.name.clone().into_bytes()
                    };
                    (vh.name.clone(), id)
                })
            })
            .collect();
        let lean: Vec<(String, Vec<u8>)> = RouteIds::decode(rc.encode_to_vec().as_slice())
            .unwrap()
            .virtual_hosts
            .into_iter()
            .flat_map(|vh| {
                let host = vh.name;
                vh.routes.into_iter().map(move |r| {
                    let id = if r.name.is_empty() {
                        r.r#match
                    } else {
                        r.name.into_bytes()
                    };
                    (host.clone(), id)
                })
            })
            .collect();
        assert_eq!(lean, full);
    }

    #[test]
    fn editing_a_named_routes_match_is_not_a_removal() {
        let cfg = GuardConfig::default();
        let before = Inventory::of(&snap(&[("r1", "/a")]));
        assert_eq!(
            judge(&cfg, Some(&before), &Inventory::of(&snap(&[("r1", "/b")]))),
            None
        );
        // Unnamed routes are identified by their match.
        let before = Inventory::of(&snap(&[("", "/a")]));
        assert!(judge(&cfg, Some(&before), &Inventory::of(&snap(&[("", "/b")]))).is_some());
        // Deleting the only route is held.
        let before = Inventory::of(&snap(&[("r1", "/a"), ("r2", "/b")]));
        assert!(judge(&cfg, Some(&before), &Inventory::of(&snap(&[("r3", "/c")]))).is_some());
    }
}

#[cfg(test)]
mod l4_tests {
    use super::*;

    /// A TLS passthrough listener with `n` TLSRoutes, translated and snapshotted.
    fn snapshot(n: usize) -> Snapshot {
        let mut yaml = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: edge }\nspec:\n  gatewayClassName: c\n  listeners:\n  - { name: tls, port: 8443, protocol: TLS, tls: { mode: Passthrough } }\n---\napiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: { name: b }\nspec: { endpoints: [{ address: 127.0.0.1, port: 7001 }] }\n".to_owned();
        for i in 0..n {
            yaml.push_str(&format!(
                "---\napiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TLSRoute\nmetadata: {{ name: r{i} }}\nspec:\n  parentRefs: [{{ name: edge }}]\n  hostnames: [h{i}.example]\n  rules: [{{ backendRefs: [{{ group: ballast.dev, kind: Backend, name: b }}] }}]\n"
            ));
        }
        let set = ballast_model::ConfigSet::build([("c.yaml", yaml)]).unwrap();
        ballast_translate::translate_gateway(
            &set,
            &ballast_model::ObjectKey::new("default", "edge"),
            &ballast_translate::Options::default(),
        )
        .unwrap()
        .snapshot(None)
        .unwrap()
    }

    /// TLS/TCP routes live in listener filter chains, not route configurations: the guard
    /// counts each `tcp_proxy` chain as a route, so removing most TLSRoutes of a listener
    /// (its listener stays) is held like removing most HTTPRoutes.
    #[test]
    fn tcp_proxy_filter_chains_count_as_routes() {
        let cfg = GuardConfig::default();
        let four = Inventory::of(&snapshot(4));
        assert_eq!(four.listeners.len(), 1);
        assert_eq!(four.routes.len(), 4, "{:?}", four.routes);
        assert!(four.routes.contains(&(
            "listener:default/edge/8443".into(),
            "default/edge/8443/tls/default/r0".into(),
            vec![]
        )));
        let held = judge(&cfg, Some(&four), &Inventory::of(&snapshot(1))).unwrap();
        assert!(held.contains("3 of 4 routes"), "{held}");
        let held = judge(&cfg, Some(&four), &Inventory::of(&snapshot(0))).unwrap();
        assert!(held.contains("4 of 4 routes"), "{held}");
        assert_eq!(judge(&cfg, Some(&four), &Inventory::of(&snapshot(2))), None);
        // The closing chain of a listener without routes is not a route.
        assert!(Inventory::of(&snapshot(0)).routes.is_empty());
    }
}

#[cfg(test)]
mod http3_tests {
    use super::*;

    /// One HTTPS port whose ClientPolicy may turn HTTP/3 on, translated and snapshotted.
    fn snapshot(http3: bool) -> Snapshot {
        let mut yaml = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: edge }\nspec:\n  gatewayClassName: c\n  listeners:\n  - { name: s, port: 443, protocol: HTTPS, hostname: s.example, tls: { certificateRefs: [{ name: s }] } }\n---\napiVersion: v1\nkind: Secret\nmetadata: { name: s }\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: \"-----BEGIN CERTIFICATE-----\\nMIIB\\n-----END CERTIFICATE-----\\n\"\n  tls.key: \"-----BEGIN PRIVATE KEY-----\\nMIGH\\n-----END PRIVATE KEY-----\\n\"\n---\napiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: { name: b }\nspec: { endpoints: [{ address: 127.0.0.1, port: 7001 }] }\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: { name: r }\nspec:\n  parentRefs: [{ name: edge }]\n  rules: [{ backendRefs: [{ group: ballast.dev, kind: Backend, name: b }] }]\n".to_owned();
        if http3 {
            yaml.push_str("---\napiVersion: ballast.dev/v1alpha1\nkind: ClientPolicy\nmetadata: { name: h3 }\nspec:\n  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }]\n  http3: {}\n");
        }
        let set = ballast_model::ConfigSet::build([("c.yaml", yaml)]).unwrap();
        ballast_translate::translate_gateway(
            &set,
            &ballast_model::ObjectKey::new("default", "edge"),
            &ballast_translate::Options::default(),
        )
        .unwrap()
        .snapshot(None)
        .unwrap()
    }

    /// The QUIC listener of an HTTPS port is one more listener sharing the TCP one's routes:
    /// turning HTTP/3 on or off moves no route, and off removes 1 of 2 listeners, which the
    /// default guard (more than 50%) lets through while a stricter one holds it.
    #[test]
    fn the_http3_listener_counts_once_and_shares_routes() {
        let (on, off) = (
            Inventory::of(&snapshot(true)),
            Inventory::of(&snapshot(false)),
        );
        assert_eq!(
            on.listeners.iter().collect::<Vec<_>>(),
            ["default/edge/443", "default/edge/443/udp"]
        );
        assert_eq!(on.routes, off.routes);
        assert_eq!(on.clusters, off.clusters);
        let cfg = GuardConfig::default();
        assert_eq!(judge(&cfg, Some(&off), &on), None);
        assert_eq!(judge(&cfg, Some(&on), &off), None);
        let strict = GuardConfig {
            max_removal: 0.3,
            ..GuardConfig::default()
        };
        let held = judge(&strict, Some(&on), &off).unwrap();
        assert!(held.contains("1 of 2 listeners"), "{held}");
    }
}

#[cfg(test)]
mod book_tests {
    use super::*;
    use ballast_xds::XdsResource;
    use ballast_xds::envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use ballast_xds::envoy_types::pb::envoy::config::listener::v3::{
        Filter, FilterChain, Listener,
    };
    use ballast_xds::envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
    use std::collections::BTreeMap;

    /// A gateway's config as the guard sees it.
    #[derive(Clone, Debug, Default)]
    struct Model {
        clusters: BTreeSet<u8>,
        /// Listener → its filter chains (name, whether it is a `tcp_proxy` chain).
        listeners: BTreeMap<u8, Vec<(u8, bool)>>,
        /// Route configuration → (virtual hosts in reverse order, host → routes as (name or
        /// none, prefix)).
        rcs: BTreeMap<u8, (bool, Hosts)>,
    }

    /// A virtual host's routes: (name or none, prefix).
    type Routes = Vec<(Option<u8>, u8)>;
    type Hosts = BTreeMap<u8, Routes>;

    /// One edit: what, which, and two parameters.
    type Op = (u8, u8, u8, Routes);

    impl Model {
        fn apply(&mut self, (what, a, b, routes): &Op) {
            match what % 7 {
                0 => {
                    if !self.clusters.remove(a) {
                        self.clusters.insert(*a);
                    }
                }
                1 => {
                    let chains = routes.iter().map(|(n, p)| (p % 4, n.is_some())).collect();
                    self.listeners.insert(a % 3, chains);
                }
                2 => {
                    self.listeners.remove(&(a % 3));
                }
                3 | 4 => {
                    // Edit one virtual host's routes (the common case).
                    let rc = self.rcs.entry(a % 2).or_default();
                    rc.1.insert(*b, routes.clone());
                }
                5 => {
                    if let Some(rc) = self.rcs.get_mut(&(a % 2)) {
                        rc.1.remove(b);
                    }
                }
                _ => {
                    if self.rcs.remove(&(a % 2)).is_none() {
                        self.rcs.insert(a % 2, (b % 2 == 0, BTreeMap::new()));
                    }
                }
            }
        }

        fn snapshot(&self, prev: Option<&Arc<Snapshot>>) -> Arc<Snapshot> {
            self.snapshot_chunked(prev, None)
        }

        /// With `chunks`, route configurations are built from chunks of whole fields, as the
        /// translator builds them: a chunk's bytes seen before are the same `Bytes` (a
        /// version shares its unchanged chunks with the previous one), and where chunks are
        /// cut depends on the fields, so an edit regroups the fields around it.
        fn snapshot_chunked(
            &self,
            prev: Option<&Arc<Snapshot>>,
            mut chunks: Option<&mut BTreeMap<Vec<u8>, bytes::Bytes>>,
        ) -> Arc<Snapshot> {
            let mut b = Snapshot::builder();
            if let Some(p) = prev {
                b = b.reuse_from(p.clone());
            }
            for c in &self.clusters {
                b.message(&Cluster {
                    name: format!("c{c}"),
                    ..Default::default()
                })
                .unwrap();
            }
            for (l, chains) in &self.listeners {
                let filter_chains = chains
                    .iter()
                    .map(|(n, tcp)| FilterChain {
                        name: format!("ch{n}"),
                        filters: vec![Filter {
                            name: if *tcp { TCP_PROXY } else { "other" }.into(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    })
                    .collect();
                b.message(&Listener {
                    name: format!("l{l}"),
                    filter_chains,
                    ..Default::default()
                })
                .unwrap();
            }
            for (rc, (reverse, hosts)) in &self.rcs {
                let mut virtual_hosts: Vec<VirtualHost> = hosts
                    .iter()
                    .map(|(h, routes)| test_virtual_host(*h, routes))
                    .collect();
                if *reverse {
                    virtual_hosts.reverse();
                }
                let msg = RouteConfiguration {
                    name: format!("rc{rc}"),
                    virtual_hosts,
                    ..Default::default()
                };
                let Some(seen) = chunks.as_deref_mut() else {
                    b.message(&msg).unwrap();
                    continue;
                };
                let value = msg.encode_to_vec();
                let starts = field_starts(&value).unwrap();
                let mut cuts: Vec<usize> = starts
                    .iter()
                    .zip(starts.iter().skip(1).chain([&(value.len() as u32)]))
                    .filter(|(s, e)| *s == &0 || (*e - *s) % 3 == 0)
                    .map(|(s, _)| *s as usize)
                    .collect();
                cuts.push(value.len());
                let parts: Vec<bytes::Bytes> = cuts
                    .windows(2)
                    .map(|w| {
                        let c = &value[w[0]..w[1]];
                        seen.entry(c.to_vec())
                            .or_insert_with(|| bytes::Bytes::copy_from_slice(c))
                            .clone()
                    })
                    .collect();
                let mut refs = msg.refs();
                refs.sort();
                refs.dedup();
                b.add(
                    Resource::from_encoded_chunks_shared::<RouteConfiguration>(
                        &msg.name,
                        parts,
                        refs.into(),
                    )
                    .unwrap(),
                );
            }
            Arc::new(b.build_unchecked().unwrap())
        }
    }

    /// A small deterministic generator (xorshift): a fixed seed makes a failure
    /// reproducible without a property-testing dependency in this crate.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u8 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n) as u8
        }

        fn op(&mut self) -> Op {
            let routes = (0..self.below(4))
                .map(|_| {
                    let name = (self.below(2) == 0).then(|| self.below(4));
                    (name, self.below(4))
                })
                .collect();
            (self.below(7), self.below(12), self.below(8), routes)
        }
    }

    /// The book's incremental count equals a full count of both inventories, over 500
    /// random edit sequences (single virtual hosts edited, added and removed, whole route
    /// configurations, listeners and clusters coming and going), with route configurations
    /// whole or in chunks (the chunks shared between versions are skipped unread).
    #[test]
    fn book_equals_full_count() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for case in 0..500 {
            // Every other case with route configurations built from chunks.
            let mut seen = BTreeMap::new();
            let mut chunks = (case % 2 == 1).then_some(&mut seen);
            let mut model = Model::default();
            for _ in 0..rng.below(12) {
                let o = rng.op();
                model.apply(&o);
            }
            let first = model.snapshot_chunked(None, chunks.as_deref_mut());
            let mut book = Book::new(first.clone());
            let mut inv = Inventory::of(&first);
            assert_eq!(book.routes, inv.routes.len(), "case {case}");
            for step in 0..=rng.below(12) {
                for _ in 0..=rng.below(2) {
                    let o = rng.op();
                    model.apply(&o);
                }
                // Mostly built from the book's snapshot (changes recorded), sometimes not.
                let base = (rng.below(4) != 0).then_some(&book.snapshot);
                let next = model.snapshot_chunked(base, chunks.as_deref_mut());
                let next_inv = Inventory::of(&next);
                let (removal, next_book) = book.next(next.clone());
                // The field starts the book keeps are those of the route configurations.
                for (name, f) in &next_book.fields {
                    let rc = next.get(ResourceType::RouteConfiguration, name).unwrap();
                    assert!(Arc::ptr_eq(&f.resource, rc) || f.resource.version() == rc.version());
                    assert_eq!(
                        f.starts.to_vec(),
                        field_starts(&rc.value_bytes()).unwrap(),
                        "case {case} step {step}: {model:?}"
                    );
                }
                assert_eq!(
                    removal,
                    Removal::between(&inv, &next_inv),
                    "case {case} step {step}: {model:?}"
                );
                assert_eq!(next_book.routes, next_inv.routes.len(), "case {case}");
                assert_eq!(
                    next_book.same_inventory,
                    inv == next_inv,
                    "case {case} step {step}: {model:?}"
                );
                book = next_book;
                inv = next_inv;
            }
            // To nothing (a removed gateway).
            let (removal, empty) = book.next(Arc::new(Snapshot::default()));
            assert_eq!(removal, Removal::between(&inv, &Inventory::default()));
            assert_eq!(empty.routes, 0);
        }
    }

    /// Chunks shared by pointer, or rebuilt with the same bytes (the name field), are skipped
    /// at both ends; only the ones between are compared.
    #[test]
    fn shared_chunks_are_skipped_at_both_ends() {
        let a: Vec<bytes::Bytes> = ["name", "b1", "b2", "b3", "b4"]
            .iter()
            .map(|s| bytes::Bytes::copy_from_slice(s.as_bytes()))
            .collect();
        let mut b = a.clone();
        b[0] = bytes::Bytes::copy_from_slice(b"name");
        b[2] = bytes::Bytes::copy_from_slice(b"B2");
        assert_eq!(shared_ends(&a, &b), (2, 2));
        assert_eq!(shared_ends(&a, &a), (5, 0));
        b.remove(2);
        assert_eq!(shared_ends(&a, &b), (2, 2));
        b[0] = bytes::Bytes::copy_from_slice(b"other");
        assert_eq!(shared_ends(&a, &b), (0, 2));
    }

    /// One virtual host edited among many: only it is decoded on either side.
    #[test]
    fn one_host_edit_reads_one_host() {
        let mut model = Model::default();
        for h in 0..200u8 {
            model.apply(&(3, 0, h, vec![(None, h % 4), (Some(1), 2)]));
        }
        let a = model.snapshot(None);
        model.apply(&(3, 0, 100, vec![(None, 3)]));
        let b = model.snapshot(Some(&a));
        let bytes = |s: &Snapshot| {
            s.get(ResourceType::RouteConfiguration, "rc0")
                .unwrap()
                .value_bytes()
        };
        let hosts = |ids: &Ids| ids.iter().map(|(h, _)| h.clone()).collect::<BTreeSet<_>>();
        let starts = field_starts(&bytes(&a)).unwrap();
        for known in [None, Some(&starts[..])] {
            let (old, new, _) = changed_hosts(&bytes(&a), &bytes(&b), known);
            assert_eq!(hosts(&old), BTreeSet::from(["h100".to_owned()]));
            assert_eq!(hosts(&new), BTreeSet::from(["h100".to_owned()]));
        }
        let (removal, book) = Book::new(a).next(b.clone());
        assert_eq!(removal.routes, (2, 400));
        assert_eq!(book.routes, 399);
        // The next edit starts from the starts the book kept.
        assert_eq!(
            book.fields["rc0"].starts.len(),
            201,
            "the name and 200 hosts"
        );
        model.apply(&(3, 0, 7, vec![]));
        let c = model.snapshot(Some(&b));
        let (removal, book) = book.next(c);
        assert_eq!(removal.routes, (2, 399));
        assert_eq!(book.routes, 397);
    }
}
