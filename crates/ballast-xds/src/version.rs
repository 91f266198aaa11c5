//! Deterministic versions (invariant 5, docs/architecture.md): the same content gives the same
//! version on every replica and after every restart, so a proxy that fails over
//! receives nothing it already has.

use xxhash_rust::xxh3::Xxh3;

/// Version of one resource: a hash of its encoded bytes.
pub fn content_version(bytes: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(bytes))
}

/// Version of a set of resources: a hash of the sorted (name, version) pairs.
/// The iterator must yield names in sorted order (BTreeMap order).
pub fn set_version<'a>(items: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut h = Xxh3::new();
    let mut n = 0u64;
    for (name, version) in items {
        h.update(&(name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        h.update(&(version.len() as u64).to_le_bytes());
        h.update(version.as_bytes());
        n += 1;
    }
    h.update(&n.to_le_bytes());
    format!("{:016x}", h.digest())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_version_is_sensitive_to_names_and_versions() {
        let a = set_version([("a", "1"), ("b", "2")]);
        assert_eq!(a, set_version([("a", "1"), ("b", "2")]));
        assert_ne!(a, set_version([("a", "1"), ("b", "3")]));
        assert_ne!(a, set_version([("a", "1")]));
        // No ambiguity from concatenation.
        assert_ne!(set_version([("ab", "1")]), set_version([("a", "b1")]));
        assert_ne!(set_version([]), set_version([("", "")]));
    }
}
