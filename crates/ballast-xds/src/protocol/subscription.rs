//! Which resources of one type a stream wants, following the xDS wildcard rules
//! for State-of-the-World and Delta (including legacy wildcard).
//!
//! An empty first request is a (legacy) wildcard subscription only for the
//! types that have wildcard: Listener and Cluster. For EDS, RDS and SDS an
//! empty name list means "not interested" (the xDS spec; Envoy never sends
//! one, other clients do), so the machines pass `first` only for those types
//! ([`empty_first_request_is_wildcard`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::resource::ResourceType;
use crate::snapshot::ResourceMap;

pub(crate) const WILDCARD: &str = "*";

/// Whether an empty first request for `ty` subscribes to everything (legacy
/// wildcard). Only LDS and CDS: answering an empty EDS request with every
/// load assignment would make the server believe the client holds what it
/// ignored, and a later request naming them would get nothing.
///
/// VHDS too: Envoy 1.40's VirtualHost subscription (namespace matching) opens
/// with an empty request and never names its route configuration (seen on
/// the wire, `tests/route_split.rs`); it takes the virtual hosts of the route
/// configurations it watches and ignores the rest. Every virtual host of a
/// group belongs to a route configuration its listeners use.
pub(crate) fn empty_first_request_is_wildcard(ty: ResourceType) -> bool {
    matches!(
        ty,
        ResourceType::Listener | ResourceType::Cluster | ResourceType::VirtualHost
    )
}

/// Explicitly subscribed names. When they are exactly the names of a snapshot
/// map (Envoy's EDS subscription is every cluster), the map's keys are shared
/// instead of copied per stream.
#[derive(Clone, Debug)]
enum Names {
    Owned(BTreeSet<Arc<str>>),
    /// The map, and its key-set id ([`crate::snapshot::TypeResources::key_set`])
    /// when known (0: not known).
    Keys(Arc<ResourceMap>, u64),
}

impl Default for Names {
    fn default() -> Self {
        Names::Owned(BTreeSet::new())
    }
}

/// The set of resource names one stream subscribes to, for one type.
#[derive(Clone, Debug, Default)]
pub(crate) struct Subscription {
    wildcard: bool,
    /// Wildcard came from an empty first request: empty lists keep it on.
    legacy: bool,
    names: Names,
    /// A name also covers the resources in its namespace (VHDS, see
    /// [`ResourceType::is_namespaced`]).
    namespaced: bool,
}

/// The namespace of a namespaced resource name: everything before the last
/// `/` (Envoy's `namespaceFromName`), if there is one.
pub(crate) fn namespace_of(name: &str) -> Option<&str> {
    name.rfind('/').map(|i| &name[..i])
}

/// The resources of `map` in namespace `ns` (named `ns/<no further '/'>`), in
/// name order: one range walk of the sorted map.
pub(crate) fn namespace_members<'a, V>(
    map: &'a imbl::OrdMap<Arc<str>, V>,
    ns: &'a str,
) -> impl Iterator<Item = (&'a Arc<str>, &'a V)> + 'a {
    use std::ops::Bound;
    let prefix = format!("{ns}/");
    let start = map.range::<_, str>((Bound::Included(prefix.as_str()), Bound::Unbounded));
    start
        .take_while(move |(k, _)| k.starts_with(prefix.as_str()))
        .filter(move |(k, _)| !k[ns.len() + 1..].contains('/'))
}

impl PartialEq for Subscription {
    fn eq(&self, other: &Self) -> bool {
        self.wildcard == other.wildcard
            && self.legacy == other.legacy
            && self.len() == other.len()
            && self.iter().eq(other.iter())
    }
}
impl Eq for Subscription {}

/// Interns `name` with a known map's key (shared with the snapshot).
fn intern(name: &str, known: Option<&Arc<ResourceMap>>) -> Arc<str> {
    match known.and_then(|k| k.get_key_value(name)) {
        Some((k, _)) => k.clone(),
        None => Arc::from(name),
    }
}

/// What a SotW `resource_names` list changed in a [`Subscription`].
#[derive(Debug, Default)]
pub(crate) struct SotwChange {
    /// Names that became subscribed (and `"*"` if wildcard was turned on):
    /// they must be answered even if nothing changed.
    pub(crate) added: Vec<Arc<str>>,
    /// The subscription is not what it was (names may also have gone).
    pub(crate) changed: bool,
}

impl Subscription {
    pub(crate) fn is_wildcard(&self) -> bool {
        self.wildcard
    }
    /// Explicitly subscribed names, sorted.
    pub(crate) fn iter(&self) -> Box<dyn Iterator<Item = &Arc<str>> + '_> {
        match &self.names {
            Names::Owned(s) => Box::new(s.iter()),
            Names::Keys(m, _) => Box::new(m.keys()),
        }
    }
    /// Number of explicitly subscribed names.
    pub(crate) fn len(&self) -> usize {
        match &self.names {
            Names::Owned(s) => s.len(),
            Names::Keys(m, _) => m.len(),
        }
    }
    /// Explicitly subscribed.
    pub(crate) fn contains(&self, name: &str) -> bool {
        match &self.names {
            Names::Owned(s) => s.contains(name),
            Names::Keys(m, _) => m.contains_key(name),
        }
    }
    pub(crate) fn covers(&self, name: &str) -> bool {
        self.wildcard
            || self.contains(name)
            || (self.namespaced && namespace_of(name).is_some_and(|ns| self.contains(ns)))
    }
    /// Names of this type are namespaces too (set once, at the first request).
    pub(crate) fn set_namespaced(&mut self, on: bool) {
        self.namespaced = on;
    }
    pub(crate) fn is_namespaced(&self) -> bool {
        self.namespaced
    }
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        !self.wildcard && self.len() == 0
    }
    /// The names are shared with `map`'s keys (O(1); false does not mean
    /// they differ).
    pub(crate) fn is_keys_of(&self, map: &Arc<ResourceMap>) -> bool {
        matches!(&self.names, Names::Keys(m, _) if Arc::ptr_eq(m, map))
    }
    /// The names are exactly the keys of `map` (cheap when shared).
    pub(crate) fn names_are_keys_of(&self, map: &Arc<ResourceMap>) -> bool {
        match &self.names {
            Names::Keys(m, _) if Arc::ptr_eq(m, map) => true,
            _ => self.len() == map.len() && self.iter().zip(map.keys()).all(|(a, b)| a == b),
        }
    }

    /// Shares `map`'s keys when they are exactly the subscribed names, and
    /// otherwise interns the names with them. O(names).
    pub(crate) fn share_with(&mut self, map: &Arc<ResourceMap>) {
        if matches!(&self.names, Names::Keys(m, _) if Arc::ptr_eq(m, map)) {
            return;
        }
        if self.len() == map.len() && self.iter().zip(map.keys()).all(|(a, b)| a == b) {
            if !map.is_empty() {
                self.names = Names::Keys(map.clone(), 0);
            }
            return;
        }
        if let Names::Owned(set) = &mut self.names
            && set.iter().any(|n| {
                map.get_key_value(&**n)
                    .is_some_and(|(k, _)| !Arc::ptr_eq(k, n))
            })
        {
            *set = set.iter().map(|n| intern(n, Some(map))).collect();
        }
    }

    /// Moves shared names to `map` when its keys are the same (so an old map
    /// is not kept alive). O(1) when the map's key-set id (`map_keys`,
    /// [`crate::snapshot::TypeResources::key_set`]) is the one the names
    /// were last moved with (maps derived by changing only values share it,
    /// however many publishes apart), or with the snapshot's recorded
    /// changes (`keys_same`). Otherwise the keys are compared in one walk
    /// (interned, so mostly by address): else the names would stay on the
    /// old map and every later plan of the stream take the slow path, a
    /// lookup per name (W2 SotW at 1,000 proxies, issue #13).
    pub(crate) fn follow(
        &mut self,
        map: &Arc<ResourceMap>,
        map_keys: u64,
        keys_same: impl FnOnce(&Arc<ResourceMap>) -> bool,
    ) {
        let Names::Keys(m, id) = &mut self.names else {
            return;
        };
        if Arc::ptr_eq(m, map) {
            *id = map_keys;
            return;
        }
        if (*id != 0 && *id == map_keys) || keys_same(m) || same_keys(m, map) {
            self.names = Names::Keys(map.clone(), map_keys);
        }
    }

    fn owned(&mut self) -> &mut BTreeSet<Arc<str>> {
        if let Names::Keys(m, _) = &self.names {
            self.names = Names::Owned(m.keys().cloned().collect());
        }
        match &mut self.names {
            Names::Owned(s) => s,
            Names::Keys(..) => unreachable!(),
        }
    }

    /// Whether a SotW `resource_names` list (without `"*"`) names exactly the
    /// current names; no allocation when the list is sorted.
    fn same_names(&self, names: &[String]) -> bool {
        let listed = names.iter().filter(|n| *n != WILDCARD);
        let sorted = names
            .windows(2)
            .all(|w| w[0] < w[1] || w[0] == WILDCARD || w[1] == WILDCARD);
        if sorted {
            return listed.clone().count() == self.len()
                && listed.zip(self.iter()).all(|(a, b)| a.as_str() == &**b);
        }
        let mut v: Vec<&str> = listed.map(String::as_str).collect();
        v.sort_unstable();
        v.dedup();
        v.len() == self.len() && v.into_iter().zip(self.iter()).all(|(a, b)| a == &**b)
    }

    /// Applies a State-of-the-World request's full `resource_names` list.
    /// Returns the names that became subscribed (and `"*"` if wildcard was turned on),
    /// which must be answered even if nothing changed.
    #[cfg(test)]
    pub(crate) fn apply_sotw(&mut self, names: &[String], first: bool) -> Vec<Arc<str>> {
        self.apply_sotw_with(names, first, None).added
    }

    /// [`Subscription::apply_sotw`], interning names with `known` (the
    /// snapshot's map for the type); also says whether anything changed.
    pub(crate) fn apply_sotw_with(
        &mut self,
        names: &[String],
        first: bool,
        known: Option<&Arc<ResourceMap>>,
    ) -> SotwChange {
        if names.is_empty() {
            let before = (self.wildcard, self.legacy, self.len());
            let turned_on = (first || self.legacy) && !self.wildcard;
            if first || self.legacy {
                self.wildcard = true;
                self.legacy = true;
            } else {
                self.wildcard = false;
            }
            self.names = Names::default();
            let changed = before != (self.wildcard, self.legacy, 0);
            let added = if turned_on {
                vec![WILDCARD.into()]
            } else {
                vec![]
            };
            return SotwChange { added, changed };
        }
        let wildcard = names.iter().any(|n| n == WILDCARD);
        if !self.legacy && wildcard == self.wildcard && self.same_names(names) {
            return SotwChange::default();
        }
        let new: BTreeSet<Arc<str>> = names
            .iter()
            .filter(|n| *n != WILDCARD)
            .map(|n| intern(n, known))
            .collect();
        let mut added: Vec<Arc<str>> = new.iter().filter(|n| !self.contains(n)).cloned().collect();
        if wildcard && !self.wildcard {
            added.push(WILDCARD.into());
        }
        self.legacy = false;
        self.wildcard = wildcard;
        self.names = Names::Owned(new);
        if let Some(k) = known {
            self.share_with(k);
        }
        SotwChange {
            added,
            changed: true,
        }
    }

    /// [`Subscription::apply_sotw_with`] for a list that is exactly the keys
    /// of `known` (sorted; non-empty, without `"*"`), found so on the
    /// undecoded names (Envoy's first EDS request: every cluster): shares
    /// the keys without decoding or collecting the names.
    pub(crate) fn apply_sotw_keys(&mut self, known: &Arc<ResourceMap>) -> SotwChange {
        debug_assert!(!known.is_empty() && !known.contains_key(WILDCARD));
        if !self.legacy && !self.wildcard && self.names_are_keys_of(known) {
            return SotwChange::default();
        }
        let added = known
            .keys()
            .filter(|n| !self.contains(n))
            .cloned()
            .collect();
        self.legacy = false;
        self.wildcard = false;
        self.names = Names::Keys(known.clone(), 0);
        SotwChange {
            added,
            changed: true,
        }
    }

    /// Applies a Delta request's subscribe/unsubscribe lists.
    /// Returns newly subscribed names (and `"*"` if wildcard was turned on).
    #[cfg(test)]
    pub(crate) fn apply_delta(
        &mut self,
        subscribe: &[String],
        unsubscribe: &[String],
        first: bool,
    ) -> Vec<Arc<str>> {
        let subscribe: Vec<&str> = subscribe.iter().map(String::as_str).collect();
        self.apply_delta_added(&subscribe, unsubscribe, first, None)
    }

    /// [`Subscription::apply_delta_with`], returning the newly subscribed
    /// names (and `"*"` if wildcard was turned on).
    #[cfg(test)]
    pub(crate) fn apply_delta_added(
        &mut self,
        subscribe: &[&str],
        unsubscribe: &[String],
        first: bool,
        known: Option<&Arc<ResourceMap>>,
    ) -> Vec<Arc<str>> {
        let mut added = Vec::new();
        self.apply(subscribe, unsubscribe, first, known, Some(&mut added));
        added
    }

    /// [`Subscription::apply_delta`], interning names with `known`.
    /// The common first subscription — a sorted list of names into an empty
    /// set (Envoy's EDS: every cluster) — in one walk: shared with `known`'s
    /// keys when they are the same names, else interned in order.
    fn first_names(
        &mut self,
        subscribe: &[&str],
        unsubscribe: &[String],
        known: Option<&Arc<ResourceMap>>,
        added: Option<&mut Vec<Arc<str>>>,
    ) -> bool {
        let simple = unsubscribe.is_empty()
            && matches!(&self.names, Names::Owned(s) if s.is_empty())
            && !subscribe.is_empty()
            && subscribe.windows(2).all(|w| w[0] < w[1])
            // `"*"` may sort anywhere ("!a" < "*" < "a").
            && subscribe.binary_search_by(|n| (*n).cmp(WILDCARD)).is_err();
        if !simple {
            return false;
        }
        if let Some(k) = known
            && k.len() == subscribe.len()
            && k.keys().zip(subscribe).all(|(a, b)| **a == **b)
        {
            self.names = Names::Keys(k.clone(), 0);
            if let Some(added) = added {
                added.extend(k.keys().cloned());
            }
            return true;
        }
        let mut seek = known.map(|k| super::Seeker::new(k));
        let names: BTreeSet<Arc<str>> = subscribe
            .iter()
            .map(|n| match seek.as_mut().and_then(|s| s.get_key_value(n)) {
                Some((k, _)) => k.clone(),
                None => Arc::from(*n),
            })
            .collect();
        if let Some(added) = added {
            added.extend(names.iter().cloned());
        }
        self.names = Names::Owned(names);
        true
    }

    /// Applies a Delta request's subscribe/unsubscribe lists, interning
    /// names with `known`. What was newly subscribed is not collected: the
    /// stream does not need it, and cloning every name's `Arc` (shared by
    /// every stream) to drop it again was most of a resumed EDS
    /// subscription's cost (W5).
    pub(crate) fn apply_delta_with(
        &mut self,
        subscribe: &[&str],
        unsubscribe: &[String],
        first: bool,
        known: Option<&Arc<ResourceMap>>,
    ) {
        self.apply(subscribe, unsubscribe, first, known, None);
    }

    fn apply(
        &mut self,
        subscribe: &[&str],
        unsubscribe: &[String],
        first: bool,
        known: Option<&Arc<ResourceMap>>,
        mut added: Option<&mut Vec<Arc<str>>>,
    ) {
        // Legacy wildcard: a first request that names nothing at all.
        if first && subscribe.is_empty() && unsubscribe.is_empty() {
            self.wildcard = true;
            self.legacy = true;
            if let Some(out) = added.as_deref_mut() {
                out.push(WILDCARD.into());
            }
        }
        if subscribe.is_empty() && unsubscribe.is_empty() {
            return;
        }
        if self.first_names(subscribe, unsubscribe, known, added.as_deref_mut()) {
            return;
        }
        let was_wildcard = self.wildcard;
        for &n in subscribe {
            if n == WILDCARD {
                self.wildcard = true;
            } else if !self.contains(n) {
                let name = intern(n, known);
                if let Some(out) = added.as_deref_mut() {
                    out.push(name.clone());
                }
                self.owned().insert(name);
            }
        }
        // Names subscribed and unsubscribed in one request leave `out` in one
        // pass at the end: a retain per name was quadratic (100,000 names
        // each way cost 17 CPU-seconds).
        let mut dropped: BTreeSet<&str> = BTreeSet::new();
        for n in unsubscribe {
            if n == WILDCARD {
                self.wildcard = false;
                self.legacy = false;
            } else if self.contains(n) {
                self.owned().remove(n.as_str());
                dropped.insert(n.as_str());
            }
        }
        if let Some(out) = added {
            if !dropped.is_empty() {
                out.retain(|x| !dropped.contains(&**x));
            }
            if self.wildcard && !was_wildcard && !out.iter().any(|n| &**n == WILDCARD) {
                out.push(WILDCARD.into());
            }
        }
        if let Some(k) = known {
            self.share_with(k);
        }
    }
}

/// `a` and `b` have the same keys (one walk; interned keys compare by address).
/// Keys are compared by address first (successive snapshots share their
/// keys' `Arc`s): `Arc<str>`'s `==` compared the bytes of equal keys in the
/// W2 profiles (`memcmp` under `same_keys`, round 9).
fn same_keys(a: &ResourceMap, b: &ResourceMap) -> bool {
    a.len() == b.len()
        && a.keys()
            .zip(b.keys())
            .all(|(x, y)| Arc::ptr_eq(x, y) || x == y)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    proptest::proptest! {
        /// The first-subscription fast path gives what name-by-name
        /// subscribing gives: the same names, the same new-name list, and
        /// names interned with the known map's keys.
        #[test]
        fn first_delta_subscription_matches_the_general_path(
            known in proptest::collection::btree_set("[a-d]{1,2}", 0..12),
            asked in proptest::collection::btree_set("[a-d]{1,2}", 1..12),
            same in proptest::prelude::any::<bool>(),
        ) {
            let asked: Vec<String> = if same { known.iter().cloned().collect() } else { asked.into_iter().collect() };
            let asked: Vec<&str> = asked.iter().map(String::as_str).collect();
            proptest::prop_assume!(!asked.is_empty());
            let known: Arc<ResourceMap> = Arc::new(
                known
                    .iter()
                    .map(|n| {
                        let r = crate::Resource::new(&crate::simple::load_assignment(n, &[("127.0.0.1", 80)]))
                            .expect("valid");
                        (r.name_arc().clone(), r)
                    })
                    .collect(),
            );
            let mut fast = Subscription::default();
            let got = fast.apply_delta_added(&asked, &[], true, Some(&known));
            // The general path: one name at a time.
            let mut slow = Subscription::default();
            let mut want = Vec::new();
            for (i, n) in asked.iter().enumerate() {
                want.extend(slow.apply_delta_added(std::slice::from_ref(n), &[], i == 0, Some(&known)));
            }
            proptest::prop_assert_eq!(&got, &want);
            proptest::prop_assert!(fast == slow);
            for n in fast.iter() {
                if let Some((k, _)) = known.get_key_value(&**n) {
                    proptest::prop_assert!(Arc::ptr_eq(k, n), "{} not interned", n);
                }
            }
        }
    }

    proptest::proptest! {
        /// A SotW list that is exactly the known map's keys, applied as
        /// keys, gives what applying the decoded list gives (from any
        /// earlier state): the same names, shared, and the same change.
        #[test]
        fn sotw_keys_match_the_decoded_list(
            known in proptest::collection::btree_set("[a-d]{1,2}", 1..8),
            before in proptest::collection::vec("[a-d*]{1,2}", 0..6),
            first in proptest::prelude::any::<bool>(),
            legacy in proptest::prelude::any::<bool>(),
        ) {
            let known: Arc<ResourceMap> = Arc::new(
                known
                    .iter()
                    .map(|n| {
                        let r = crate::Resource::new(&crate::simple::load_assignment(n, &[("127.0.0.1", 80)]))
                            .expect("valid");
                        (r.name_arc().clone(), r)
                    })
                    .collect(),
            );
            let mut fast = Subscription::default();
            if legacy {
                fast.apply_sotw(&[], true);
            }
            fast.apply_sotw(&before, !legacy);
            let mut slow = fast.clone();
            let list: Vec<String> = known.keys().map(|k| k.to_string()).collect();
            let want = slow.apply_sotw_with(&list, first, Some(&known));
            let got = fast.apply_sotw_keys(&known);
            proptest::prop_assert!(fast == slow);
            proptest::prop_assert_eq!(fast.is_keys_of(&known), slow.is_keys_of(&known));
            proptest::prop_assert_eq!(got.changed, want.changed);
            proptest::prop_assert_eq!(got.added, want.added);
        }
    }

    proptest::proptest! {
        /// Delta subscription updates (done in one pass per list) match a
        /// plain model: names subscribed then unsubscribed, in that order;
        /// the new names are those subscribed that were not before and are
        /// not unsubscribed by the same request.
        #[test]
        fn delta_updates_match_the_model(
            before in proptest::collection::btree_set("[a-c*]{1,2}", 0..6),
            subscribe in proptest::collection::vec("[a-c*]{1,2}", 0..8),
            unsubscribe in proptest::collection::vec("[a-c*]{1,2}", 0..8),
        ) {
            let before: Vec<String> = before.into_iter().collect();
            let mut sub = Subscription::default();
            sub.apply_delta(&before, &[], true);
            let was_wildcard = sub.is_wildcard();
            let mut names: BTreeSet<String> = before.iter().filter(|n| *n != WILDCARD).cloned().collect();
            let old = names.clone();
            let mut wildcard = was_wildcard;
            for n in &subscribe {
                if n == WILDCARD { wildcard = true } else { names.insert(n.clone()); }
            }
            for n in &unsubscribe {
                if n == WILDCARD { wildcard = false } else { names.remove(n); }
            }
            let got = sub.apply_delta(&subscribe, &unsubscribe, false);
            proptest::prop_assert_eq!(sub.is_wildcard(), wildcard);
            let have: BTreeSet<String> = sub.iter().map(|n| n.to_string()).collect();
            proptest::prop_assert_eq!(&have, &names);
            let mut want: BTreeSet<String> = names.difference(&old).cloned().collect();
            if wildcard && !was_wildcard {
                want.insert(WILDCARD.into());
            }
            let got: BTreeSet<String> = got.iter().map(|n| n.to_string()).collect();
            proptest::prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn sotw_legacy_wildcard_rules() {
        let mut sub = Subscription::default();
        assert_eq!(sub.apply_sotw(&[], true), vec![Arc::<str>::from("*")]);
        assert!(sub.is_wildcard());
        // Empty again: still wildcard, nothing new.
        assert!(sub.apply_sotw(&[], false).is_empty());
        assert!(sub.is_wildcard());
        // Names without "*": no longer wildcard.
        sub.apply_sotw(&s(&["a"]), false);
        assert!(!sub.is_wildcard());
        assert!(sub.covers("a") && !sub.covers("b"));
        // Empty after explicit names: unsubscribes everything.
        sub.apply_sotw(&[], false);
        assert!(sub.is_empty());
    }

    #[test]
    fn sotw_explicit_wildcard_with_names() {
        let mut sub = Subscription::default();
        let added = sub.apply_sotw(&s(&["*", "x"]), true);
        assert!(sub.is_wildcard() && sub.contains("x"));
        assert_eq!(added.len(), 2);
        sub.apply_sotw(&s(&["x"]), false);
        assert!(!sub.is_wildcard());
    }

    #[test]
    fn sotw_named_first_request_is_not_wildcard() {
        let mut sub = Subscription::default();
        sub.apply_sotw(&s(&["a", "b"]), true);
        assert!(!sub.is_wildcard());
        assert_eq!(
            sub.apply_sotw(&s(&["b", "c"]), false),
            vec![Arc::<str>::from("c")]
        );
    }

    /// Legacy wildcard is a first request naming nothing at all; `"*"` is
    /// the wildcard wherever it sorts (the fast path for sorted lists too).
    #[test]
    fn delta_wildcard_only_when_both_lists_are_empty_and_anywhere_in_the_list() {
        let mut sub = Subscription::default();
        assert!(sub.apply_delta(&[], &s(&["x"]), true).is_empty());
        assert!(!sub.is_wildcard() && sub.is_empty());
        for first in [true, false] {
            let mut sub = Subscription::default();
            if !first {
                sub.apply_delta(&s(&["z"]), &[], true);
            }
            // Sorted: "!x" < "*" < "a".
            let added = sub.apply_delta(&s(&["!x", "*", "a"]), &[], first);
            assert!(sub.is_wildcard(), "first={first}");
            assert!(!sub.contains("*"));
            assert!(sub.contains("!x") && sub.contains("a"));
            assert!(added.iter().any(|n| &**n == WILDCARD));
        }
    }

    #[test]
    fn empty_first_request_is_wildcard_only_for_listeners_clusters_and_vhds() {
        use ResourceType::*;
        for ty in ResourceType::ALL {
            let mut sub = Subscription::default();
            let added = sub.apply_sotw(&[], empty_first_request_is_wildcard(ty));
            let wildcard = matches!(ty, Listener | Cluster | VirtualHost);
            assert_eq!(sub.is_wildcard(), wildcard, "{ty}");
            assert_eq!(!added.is_empty(), wildcard, "{ty}");
            assert!(!sub.covers("a") || wildcard, "{ty}");
            let mut sub = Subscription::default();
            sub.apply_delta(&[], &[], empty_first_request_is_wildcard(ty));
            assert_eq!(sub.is_wildcard(), wildcard, "{ty}");
        }
    }

    #[test]
    fn delta_rules() {
        let mut sub = Subscription::default();
        sub.apply_delta(&[], &[], true);
        assert!(sub.is_wildcard());
        sub.apply_delta(&s(&["a"]), &[], false);
        assert!(sub.is_wildcard() && sub.contains("a"));
        sub.apply_delta(&[], &s(&["*"]), false);
        assert!(!sub.is_wildcard() && sub.covers("a"));
        sub.apply_delta(&[], &s(&["a"]), false);
        assert!(sub.is_empty());
        let mut named = Subscription::default();
        named.apply_delta(&s(&["a"]), &[], true);
        assert!(!named.is_wildcard());
        // An empty later request does not turn wildcard on.
        named.apply_delta(&[], &[], false);
        assert!(!named.is_wildcard());
    }
}
