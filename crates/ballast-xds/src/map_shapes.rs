//! Which fields of which Envoy messages can hold a `map`, as static tables
//! that `build.rs` derives from the bundled descriptor set (`map_shapes`).
//!
//! Canonical versions (`crate::version`) only need to find map fields to sort
//! their entries. Walking a decoded `prost_reflect` pool for that made every
//! process decode the served descriptor set at its first resource (~11 MB of
//! heap in a thousand small allocations: issue #13, W4); these tables are
//! read-only data, paged in as they are used, and cover the whole set, so an
//! `Any` packing any Envoy type is sorted too without the full pool.

include!(concat!(env!("OUT_DIR"), "/map_shapes.rs"));

/// The shape of a map entry whose value can hold no map: no fields to follow.
const NONE: u16 = u16::MAX;

/// A message type that can hold a map (or a map entry that is sorted as a
/// whole), as an index into the generated tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape(u16);

impl Shape {
    /// The shape of the message named `full_name` (no leading dot), or `None`
    /// when it cannot hold a map (then its encoding is already canonical) or
    /// is not an Envoy API type.
    pub(crate) fn of(full_name: &str) -> Option<Shape> {
        NAMES
            .binary_search(&full_name)
            .ok()
            .map(|i| Shape(i as u16))
    }

    /// Whether this is `google.protobuf.Any` (its payload's shape is named by
    /// its type URL).
    pub(crate) fn is_any(self) -> bool {
        self.0 == ANY
    }

    /// Field `number`'s shape and whether it is a map, if it can hold a map
    /// or is one.
    pub(crate) fn field(self, number: u32) -> Option<(Shape, bool)> {
        let fields = FIELDS.get(usize::from(self.0)).copied().unwrap_or_default();
        let i = fields.binary_search_by_key(&number, |f| f.0).ok()?;
        let (_, ty, map) = fields[i];
        Some((Shape(ty), map))
    }

    #[cfg(test)]
    pub(crate) fn name(self) -> Option<&'static str> {
        NAMES.get(usize::from(self.0)).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_sorted_and_point_inside() {
        assert!(NAMES.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(NAMES.len(), FIELDS.len());
        assert_eq!(NAMES[usize::from(ANY)], "google.protobuf.Any");
        for fields in FIELDS {
            assert!(fields.windows(2).all(|w| w[0].0 < w[1].0));
            for &(_, ty, map) in *fields {
                assert!(usize::from(ty) < NAMES.len() || (ty == NONE && map));
            }
        }
    }

    /// Spot checks against the descriptors: maps are found where they are,
    /// through message fields and `Any`, and map-free types are left out.
    #[test]
    fn shapes_follow_the_descriptors() {
        let s = Shape::of("google.protobuf.Struct").unwrap();
        let (entry, map) = s.field(1).unwrap();
        assert!(map);
        assert_eq!(
            entry.name(),
            Some("google.protobuf.Struct.FieldsEntry"),
            "a Struct's value can hold a Struct"
        );
        let meta = Shape::of("envoy.config.core.v3.Metadata").unwrap();
        assert!(meta.field(1).unwrap().1, "filter_metadata is a map");
        let cluster = Shape::of("envoy.config.cluster.v3.Cluster").unwrap();
        assert_eq!(cluster.field(25).map(|f| f.0), Some(meta), "metadata");
        assert!(Shape::of("google.protobuf.Any").unwrap().is_any());
        assert_eq!(Shape::of("google.protobuf.Duration"), None);
        assert_eq!(Shape::of("no.such.Type"), None);
        assert_eq!(Shape::of("envoy.config.core.v3.HeaderValue"), None);
    }
}
