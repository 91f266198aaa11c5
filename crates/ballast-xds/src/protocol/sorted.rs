//! Sorted-map helpers shared by the SotW and Delta machines: resource maps
//! are `BTreeMap`s keyed by name, and most lookups come in name order (a
//! resource's references are sorted), so one forward walk serves them.

use std::sync::Arc;

use crate::resource::Resource;

/// Lookups of names in a sorted map, in one walk when they come in order
/// (a resource's references are sorted): a route configuration naming
/// thousands of clusters is checked in O(n) string compares, not O(n log n).
/// A name far ahead is found by a range lookup (few names in a large map
/// cost O(k log n), not a walk of the map); a name out of order falls back to
/// a plain lookup.
pub(crate) struct Seeker<'a, V = Arc<Resource>> {
    map: &'a std::collections::BTreeMap<Arc<str>, V>,
    iter: std::iter::Peekable<std::collections::btree_map::Range<'a, Arc<str>, V>>,
    /// The greatest key behind the walk's position.
    passed: Option<&'a Arc<str>>,
}

/// Steps a [`Seeker`] walks before it jumps with a range lookup instead.
const SEEK_STEPS: usize = 8;

impl<'a, V> Seeker<'a, V> {
    pub(crate) fn new(map: &'a std::collections::BTreeMap<Arc<str>, V>) -> Self {
        Seeker {
            map,
            iter: map.range::<str, _>(..).peekable(),
            passed: None,
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
        if self.passed.is_some_and(|p| name <= &**p) {
            return self.map.get_key_value(name);
        }
        for _ in 0..SEEK_STEPS {
            let &(k, v) = self.iter.peek()?;
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
                    self.iter.next();
                }
                std::cmp::Ordering::Equal => {
                    self.passed = Some(k);
                    self.iter.next();
                    return Some((k, v));
                }
                std::cmp::Ordering::Greater => return None,
            }
        }
        // Far ahead: jump there.
        self.passed = self
            .map
            .range::<str, _>((Unbounded, Excluded(name)))
            .next_back()
            .map(|(k, _)| k)
            .or(self.passed);
        self.iter = self
            .map
            .range::<str, _>((Included(name), Unbounded))
            .peekable();
        let &(k, v) = self.iter.peek()?;
        if **k == *name {
            self.passed = Some(k);
            self.iter.next();
            Some((k, v))
        } else {
            None
        }
    }
}
