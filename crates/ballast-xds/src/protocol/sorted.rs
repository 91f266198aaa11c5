//! Sorted-map helpers shared by the SotW and Delta machines: resource maps
//! are persistent ordered maps keyed by name, and most lookups come in name order (a
//! resource's references are sorted), so one forward walk serves them.

use std::sync::Arc;

use crate::resource::Resource;
use crate::snapshot::ResourceMap;

/// Lookups of names in a sorted map, in one walk when they come in order
/// (a resource's references are sorted): a route configuration naming
/// thousands of clusters is checked in O(n) string compares, not O(n log n).
/// A name far ahead is found by a range lookup (few names in a large map
/// cost O(k log n), not a walk of the map); a name out of order falls back to
/// a plain lookup. For a few names in a large map ([`Seeker::sparse`]) every
/// lookup is a plain one: a walk or a range lookup (two cursors, each a
/// descent and an allocation) costs more than one descent when the names are
/// far apart (a change set of ten names among 1,000 load assignments).
pub(crate) struct Seeker<'a, V = Arc<Resource>> {
    map: &'a imbl::OrdMap<Arc<str>, V>,
    /// `None`: plain lookups only.
    iter: Option<
        std::iter::Peekable<
            imbl::ordmap::RangedIter<'a, Arc<str>, V, imbl::shared_ptr::DefaultSharedPtr>,
        >,
    >,
    /// The greatest key behind the walk's position.
    passed: Option<&'a Arc<str>>,
}

/// Steps a [`Seeker`] walks before it jumps with a range lookup instead.
const SEEK_STEPS: usize = 8;

/// [`Seeker::sparse`] looks names up one by one when the map has at least
/// this many entries per name.
const SPARSE_RATIO: usize = 16;

impl<'a, V> Seeker<'a, V> {
    pub(crate) fn new(map: &'a imbl::OrdMap<Arc<str>, V>) -> Self {
        Seeker {
            map,
            iter: Some(map.range::<_, str>(..).peekable()),
            passed: None,
        }
    }

    /// A seeker for about `names` lookups: plain lookups when they are few
    /// for the map's size, else [`Seeker::new`]. Same answers either way.
    pub(crate) fn sparse(map: &'a imbl::OrdMap<Arc<str>, V>, names: usize) -> Self {
        if names.saturating_mul(SPARSE_RATIO) <= map.len() {
            Seeker {
                map,
                iter: None,
                passed: None,
            }
        } else {
            Seeker::new(map)
        }
    }

    pub(crate) fn get(&mut self, name: &str) -> Option<&'a V> {
        self.get_key_value(name).map(|(_, v)| v)
    }

    pub(crate) fn contains_key(&mut self, name: &str) -> bool {
        self.get_key_value(name).is_some()
    }

    pub(crate) fn get_key_value(&mut self, name: &str) -> Option<(&'a Arc<str>, &'a V)> {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let Some(iter) = self.iter.as_mut() else {
            return self.map.get_key_value(name);
        };
        if self.passed.is_some_and(|p| name <= &**p) {
            return self.map.get_key_value(name);
        }
        for _ in 0..SEEK_STEPS {
            let &(k, v) = iter.peek()?;
            // Names are mostly the map's own (interned) keys: equal by address.
            let same = std::ptr::eq(k.as_ptr(), name.as_ptr()) && k.len() == name.len();
            let order = if same {
                std::cmp::Ordering::Equal
            } else {
                (**k).cmp(name)
            };
            match order {
                std::cmp::Ordering::Less => {
                    self.passed = Some(k);
                    iter.next();
                }
                std::cmp::Ordering::Equal => {
                    self.passed = Some(k);
                    iter.next();
                    return Some((k, v));
                }
                std::cmp::Ordering::Greater => return None,
            }
        }
        // Far ahead: jump there.
        self.passed = self
            .map
            .range::<_, str>((Unbounded, Excluded(name)))
            .next_back()
            .map(|(k, _)| k)
            .or(self.passed);
        let iter = self.iter.insert(
            self.map
                .range::<_, str>((Included(name), Unbounded))
                .peekable(),
        );
        let &(k, v) = iter.peek()?;
        if **k == *name {
            self.passed = Some(k);
            iter.next();
            Some((k, v))
        } else {
            None
        }
    }
}

/// `map` without `names` (sorted, deduplicated), in one walk of both (a global
/// cluster change names every load assignment); `None` when none is in `map`.
pub(crate) fn without_names(map: &ResourceMap, names: &[Arc<str>]) -> Option<ResourceMap> {
    let mut gone = names.iter().peekable();
    let kept: ResourceMap = map
        .iter()
        .filter(|(n, _)| {
            while gone.next_if(|g| ***g < ***n).is_some() {}
            gone.next_if(|g| ***g == ***n).is_none()
        })
        .map(|(n, r)| (n.clone(), r.clone()))
        .collect();
    (kept.len() != map.len()).then_some(kept)
}

/// Builds a map, sharing the snapshot's own `Arc` when the selection is the
/// whole snapshot type (the common wildcard case): no per-stream copy.
pub(crate) fn share_if_whole(map: ResourceMap, whole: &Arc<ResourceMap>) -> Arc<ResourceMap> {
    if map.len() == whole.len()
        && map
            .iter()
            .zip(whole.iter())
            .all(|((_, a), (_, b))| Arc::ptr_eq(a, b))
    {
        whole.clone()
    } else {
        Arc::new(map)
    }
}

/// `BTreeMap::retain` for a resource map: removes the entries `keep` refuses
/// one by one, so what stays keeps sharing its nodes with the map it came from.
pub(crate) fn retain(
    map: &mut ResourceMap,
    mut keep: impl FnMut(&Arc<str>, &Arc<Resource>) -> bool,
) {
    let gone: Vec<Arc<str>> = map
        .iter()
        .filter(|(n, r)| !keep(n, r))
        .map(|(n, _)| n.clone())
        .collect();
    for n in &gone {
        map.remove(n);
    }
}

/// Name order of the maps, with the interned (shared) case first.
pub(crate) fn cmp_names(a: &Arc<str>, b: &Arc<str>) -> std::cmp::Ordering {
    if Arc::ptr_eq(a, b) {
        std::cmp::Ordering::Equal
    } else {
        (**a).cmp(&**b)
    }
}

/// Every key of `a` is a key of `b` (a walk of both maps in order).
pub(crate) fn keys_subset(a: &Arc<ResourceMap>, b: &Arc<ResourceMap>) -> bool {
    if a.is_empty() || Arc::ptr_eq(a, b) {
        return true;
    }
    if a.len() > b.len() {
        return false;
    }
    let mut bs = b.keys();
    'outer: for ka in a.keys() {
        for kb in bs.by_ref() {
            if Arc::ptr_eq(ka, kb) || ka == kb {
                continue 'outer;
            }
            if kb > ka {
                return false;
            }
        }
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn map(names: &BTreeSet<String>) -> Arc<ResourceMap> {
        Arc::new(
            names
                .iter()
                .map(|n| {
                    let r = Resource::new(&crate::simple::load_assignment(n, &[("127.0.0.1", 80)]))
                        .expect("valid");
                    (r.name_arc().clone(), r)
                })
                .collect(),
        )
    }

    proptest! {
        /// The one-walk helpers answer like plain set operations.
        #[test]
        fn walks_answer_like_set_operations(
            a in proptest::collection::btree_set("[a-d]{1,2}", 0..12),
            b in proptest::collection::btree_set("[a-d]{1,2}", 0..12),
        ) {
            let (ma, mb) = (map(&a), map(&b));
            prop_assert_eq!(keys_subset(&ma, &mb), a.is_subset(&b));
            let names: Vec<Arc<str>> = b.iter().map(|n| Arc::from(n.as_str())).collect();
            let kept: Option<BTreeSet<String>> = without_names(&ma, &names)
                .map(|m| m.keys().map(|k| k.to_string()).collect());
            let want: BTreeSet<String> = a.difference(&b).cloned().collect();
            prop_assert_eq!(kept, (want.len() != a.len()).then_some(want));
        }

        /// Every seeker, walking or sparse, answers a lookup (in order or
        /// not, present or not) as the map does.
        #[test]
        fn seekers_answer_like_the_map(
            keys in proptest::collection::btree_set("[a-f]{1,3}", 0..80),
            lookups in proptest::collection::vec(("[a-f]{1,3}", 0usize..4), 0..40),
        ) {
            let m = map(&keys);
            // Mostly in order, as callers look names up, with some out of order.
            let mut names: Vec<(String, usize)> = lookups;
            names.sort_by(|a, b| (a.1 == 0, &a.0).cmp(&(b.1 == 0, &b.0)));
            let mut walking = Seeker::new(&*m);
            let mut sparse = Seeker::sparse(&*m, names.len());
            let mut forced: Seeker<'_> = Seeker { map: &*m, iter: None, passed: None };
            for (name, _) in &names {
                let want = m.get_key_value(name.as_str()).map(|(k, _)| k.clone());
                let got = |s: &mut Seeker<'_>| s.get_key_value(name).map(|(k, _)| k.clone());
                prop_assert_eq!(got(&mut walking), want.clone());
                prop_assert_eq!(got(&mut sparse), want.clone());
                prop_assert_eq!(got(&mut forced), want);
            }
        }
    }

    #[test]
    fn sparse_seekers_walk_only_for_many_names() {
        let keys: BTreeSet<String> = (0..64).map(|i| format!("n{i:03}")).collect();
        let m = map(&keys);
        assert!(Seeker::sparse(&*m, 4).iter.is_none());
        assert!(Seeker::sparse(&*m, 5).iter.is_some());
    }
}
