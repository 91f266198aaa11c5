//! Which resources of one type a stream wants, following the xDS wildcard rules
//! for State-of-the-World and Delta (including legacy wildcard).

use std::collections::BTreeSet;
use std::sync::Arc;

pub const WILDCARD: &str = "*";

/// The set of resource names one stream subscribes to, for one type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subscription {
    wildcard: bool,
    /// Wildcard came from an empty first request: empty lists keep it on.
    legacy: bool,
    names: BTreeSet<Arc<str>>,
}

impl Subscription {
    pub fn is_wildcard(&self) -> bool {
        self.wildcard
    }
    pub fn names(&self) -> &BTreeSet<Arc<str>> {
        &self.names
    }
    pub fn covers(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }
    pub fn is_empty(&self) -> bool {
        !self.wildcard && self.names.is_empty()
    }

    /// Applies a State-of-the-World request's full `resource_names` list.
    /// Returns the names that became subscribed (and `"*"` if wildcard was turned on),
    /// which must be answered even if nothing changed.
    pub fn apply_sotw(&mut self, names: &[String], first: bool) -> Vec<Arc<str>> {
        let before = self.clone();
        if names.is_empty() {
            if first || self.legacy {
                self.wildcard = true;
                self.legacy = true;
            } else {
                self.wildcard = false;
            }
            self.names.clear();
        } else {
            self.legacy = false;
            self.wildcard = names.iter().any(|n| n == WILDCARD);
            self.names = names
                .iter()
                .filter(|n| *n != WILDCARD)
                .map(|n| Arc::from(n.as_str()))
                .collect();
        }
        self.newly_added(&before)
    }

    /// Applies a Delta request's subscribe/unsubscribe lists.
    /// Returns newly subscribed names (and `"*"` if wildcard was turned on).
    pub fn apply_delta(
        &mut self,
        subscribe: &[String],
        unsubscribe: &[String],
        first: bool,
    ) -> Vec<Arc<str>> {
        let before = self.clone();
        if first && subscribe.is_empty() {
            self.wildcard = true;
            self.legacy = true;
        }
        for n in subscribe {
            if n == WILDCARD {
                self.wildcard = true;
            } else {
                self.names.insert(Arc::from(n.as_str()));
            }
        }
        for n in unsubscribe {
            if n == WILDCARD {
                self.wildcard = false;
                self.legacy = false;
            } else {
                self.names.remove(n.as_str());
            }
        }
        self.newly_added(&before)
    }

    fn newly_added(&self, before: &Subscription) -> Vec<Arc<str>> {
        let mut out: Vec<Arc<str>> = self.names.difference(&before.names).cloned().collect();
        if self.wildcard && !before.wildcard {
            out.push(WILDCARD.into());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
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
        assert!(sub.is_wildcard() && sub.names().contains("x"));
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

    #[test]
    fn delta_rules() {
        let mut sub = Subscription::default();
        sub.apply_delta(&[], &[], true);
        assert!(sub.is_wildcard());
        sub.apply_delta(&s(&["a"]), &[], false);
        assert!(sub.is_wildcard() && sub.names().contains("a"));
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
