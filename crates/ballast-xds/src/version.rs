//! Deterministic versions (invariant 5, docs/architecture.md): the same content gives the same
//! version on every replica and after every restart, so a proxy that fails over
//! receives nothing it already has.

use crate::map_shapes::Shape;

/// Version of one resource: a hash of its encoded bytes.
pub fn content_version(bytes: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(bytes))
}

/// What the canonical walk needs to know of a message type: where its maps
/// are. Served by the generated [`Shape`] tables; the tests also walk the
/// decoded descriptors with it to prove the tables say the same.
pub(crate) trait Schema: Sized {
    /// The type named `full_name` (an `Any`'s payload), if it is known and can
    /// hold a map.
    fn named(full_name: &str) -> Option<Self>;
    /// Whether this is `google.protobuf.Any`.
    fn is_any(&self) -> bool;
    /// Field `number`'s message type and whether it is a map field, if it is a
    /// message field worth following.
    fn message_field(&self, number: u32) -> Option<(Self, bool)>;
}

impl Schema for Shape {
    fn named(full_name: &str) -> Option<Self> {
        Shape::of(full_name)
    }
    fn is_any(&self) -> bool {
        Shape::is_any(*self)
    }
    fn message_field(&self, number: u32) -> Option<(Self, bool)> {
        self.field(number)
    }
}

/// Version of one encoded message of type `full_name` (no leading dot): the
/// hash of its canonical encoding, in which the entries of every `map` field
/// (also inside `Any`s) are sorted. prost writes maps in `HashMap` order,
/// which differs between processes, so equal content could otherwise get
/// different versions. Costs one scan of the bytes; a second pass and a copy
/// only when some map has two or more entries; no scan at all for a type that
/// cannot hold a map.
pub(crate) fn message_version(full_name: &str, bytes: &[u8]) -> String {
    match Shape::of(full_name) {
        Some(shape) => version_with(&shape, bytes),
        None => content_version(bytes),
    }
}

/// [`message_version`] walking `desc`'s schema.
fn version_with<S: Schema>(desc: &S, bytes: &[u8]) -> String {
    if needs_sorting(desc, bytes, 0) {
        let mut out = Vec::with_capacity(bytes.len());
        canonical_into(desc, bytes, &mut out, 0);
        debug_assert_eq!(out.len(), bytes.len(), "sorting keeps the length");
        content_version(&out)
    } else {
        content_version(bytes)
    }
}

/// Nesting beyond this is hashed as is (prost's own decode limit is 100).
const MAX_DEPTH: u32 = 64;

/// One field of an encoded message.
struct Field<'a> {
    number: u32,
    /// The whole field: key, (length,) payload.
    raw: &'a [u8],
    /// Payload of a length-delimited field.
    payload: Option<&'a [u8]>,
}

/// Iterates the fields of an encoded message; stops (`None`) at the end or
/// at anything it cannot parse (groups, truncation), after which the caller
/// hashes the rest as it is.
struct Fields<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Iterator for Fields<'a> {
    type Item = Field<'a>;
    fn next(&mut self) -> Option<Field<'a>> {
        let start = self.pos;
        let mut rest = &self.buf[start..];
        if rest.is_empty() {
            return None;
        }
        let key = prost::encoding::decode_varint(&mut rest).ok()?;
        let number = u32::try_from(key >> 3).ok()?;
        let mut payload = None;
        match key & 7 {
            0 => {
                prost::encoding::decode_varint(&mut rest).ok()?;
            }
            1 => rest = rest.get(8..)?,
            5 => rest = rest.get(4..)?,
            2 => {
                let len = usize::try_from(prost::encoding::decode_varint(&mut rest).ok()?).ok()?;
                payload = Some(rest.get(..len)?);
                rest = &rest[len..];
            }
            _ => return None,
        }
        self.pos = self.buf.len() - rest.len();
        Some(Field {
            number,
            raw: &self.buf[start..self.pos],
            payload,
        })
    }
}

fn fields(buf: &[u8]) -> Fields<'_> {
    Fields { buf, pos: 0 }
}

/// The message type of a length-delimited field's payload, if it is one.
fn message_kind<S: Schema>(desc: &S, number: u32) -> Option<(S, bool)> {
    desc.message_field(number)
}

/// The type packed in an `Any`'s payload and the payload's value bytes.
fn any_content<S: Schema>(any: &[u8]) -> Option<(S, &[u8])> {
    let (mut url, mut value) = (None, None);
    for f in fields(any) {
        match f.number {
            1 => url = f.payload,
            2 => value = f.payload,
            _ => {}
        }
    }
    let url = std::str::from_utf8(url?).ok()?;
    let name = url.rsplit('/').next()?;
    Some((S::named(name)?, value?))
}

fn needs_sorting<S: Schema>(desc: &S, bytes: &[u8], depth: u32) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    if desc.is_any() {
        return any_content::<S>(bytes).is_some_and(|(d, v)| needs_sorting(&d, v, depth + 1));
    }
    let mut last_map: Option<u32> = None;
    let mut maps_seen: Vec<u32> = Vec::new();
    for f in fields(bytes) {
        let Some(payload) = f.payload else { continue };
        let Some((m, is_map)) = message_kind(desc, f.number) else {
            continue;
        };
        if is_map {
            // A second entry of a map: its order is HashMap order.
            if last_map == Some(f.number) || maps_seen.contains(&f.number) {
                return true;
            }
            maps_seen.push(f.number);
            last_map = Some(f.number);
        }
        if needs_sorting(&m, payload, depth + 1) {
            return true;
        }
    }
    false
}

/// Writes `bytes` with every map's entries sorted (recursively); lengths are
/// unchanged, so length prefixes are copied as they are.
fn canonical_into<S: Schema>(desc: &S, bytes: &[u8], out: &mut Vec<u8>, depth: u32) {
    if depth > MAX_DEPTH {
        out.extend_from_slice(bytes);
        return;
    }
    if desc.is_any() {
        canonical_any::<S>(bytes, out, depth);
        return;
    }
    let mut it = fields(bytes);
    let mut emitted_maps: Vec<u32> = Vec::new();
    for f in it.by_ref() {
        let kind = f.payload.and_then(|_| message_kind(desc, f.number));
        match (kind, f.payload) {
            (Some((m, true)), _) => {
                if emitted_maps.contains(&f.number) {
                    continue;
                }
                emitted_maps.push(f.number);
                // All entries of this map, wherever they are, sorted.
                let mut entries: Vec<Vec<u8>> = fields(bytes)
                    .filter(|e| e.number == f.number)
                    .map(|e| {
                        let p = e.payload.unwrap_or_default();
                        let head = e.raw.len() - p.len();
                        let mut v = e.raw[..head].to_vec();
                        canonical_into(&m, p, &mut v, depth + 1);
                        v
                    })
                    .collect();
                entries.sort_unstable();
                for e in entries {
                    out.extend_from_slice(&e);
                }
            }
            (Some((m, false)), Some(p)) => {
                out.extend_from_slice(&f.raw[..f.raw.len() - p.len()]);
                canonical_into(&m, p, out, depth + 1);
            }
            _ => out.extend_from_slice(f.raw),
        }
    }
    // Whatever could not be parsed, as it is.
    out.extend_from_slice(&bytes[it.pos..]);
}

fn canonical_any<S: Schema>(bytes: &[u8], out: &mut Vec<u8>, depth: u32) {
    let content = any_content::<S>(bytes);
    let mut it = fields(bytes);
    for f in it.by_ref() {
        match (&content, f.number, f.payload) {
            (Some((d, _)), 2, Some(p)) => {
                out.extend_from_slice(&f.raw[..f.raw.len() - p.len()]);
                canonical_into(d, p, out, depth + 1);
            }
            _ => out.extend_from_slice(f.raw),
        }
    }
    out.extend_from_slice(&bytes[it.pos..]);
}

/// Version of a set of resources: a hash of its (name, version) pairs.
pub(crate) fn set_version<'a>(items: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut acc = SetHash::default();
    for (name, version) in items {
        acc.add(name, version);
    }
    acc.version()
}

/// An order-independent hash of a set of distinct (name, version) pairs: the
/// wrapping sum of each pair's 128-bit hash, and the count. Updating it by a
/// set's changes gives what hashing the whole set gives, so a snapshot
/// built from the previous one hashes only the resources that changed (one
/// route edit among 50,000 virtual hosts hashed all 50,000 names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SetHash {
    sum: u128,
    count: u64,
}

/// Pairs up to this size are hashed in one call from a stack buffer:
/// XXH3's streaming state costs more to set up than a short pair to hash.
const PAIR_BUF: usize = 256;

impl SetHash {
    /// XXH3-128 of `len(name) ‖ name ‖ len(version) ‖ version` (lengths as
    /// little-endian u64): one-shot from a stack buffer when it fits (names
    /// and versions are short), streamed otherwise; the same digest either
    /// way, as XXH3 specifies.
    fn pair(name: &[u8], version: &[u8]) -> u128 {
        let len = 16 + name.len() + version.len();
        if len <= PAIR_BUF {
            let mut buf = [0u8; PAIR_BUF];
            buf[..8].copy_from_slice(&(name.len() as u64).to_le_bytes());
            buf[8..8 + name.len()].copy_from_slice(name);
            let v = 8 + name.len();
            buf[v..v + 8].copy_from_slice(&(version.len() as u64).to_le_bytes());
            buf[v + 8..len].copy_from_slice(version);
            return xxhash_rust::xxh3::xxh3_128(&buf[..len]);
        }
        Self::pair_streamed(name, version)
    }
    fn pair_streamed(name: &[u8], version: &[u8]) -> u128 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&(name.len() as u64).to_le_bytes());
        h.update(name);
        h.update(&(version.len() as u64).to_le_bytes());
        h.update(version);
        h.digest128()
    }
    /// Adds a pair not in the set.
    pub(crate) fn add(&mut self, name: &str, version: &str) {
        self.add_bytes(name.as_bytes(), version.as_bytes());
    }
    /// [`SetHash::add`] for a pair kept as received bytes.
    pub(crate) fn add_bytes(&mut self, name: &[u8], version: &[u8]) {
        self.sum = self.sum.wrapping_add(Self::pair(name, version));
        self.count += 1;
    }
    /// Removes a pair that is in the set.
    pub(crate) fn remove(&mut self, name: &str, version: &str) {
        self.sum = self
            .sum
            .wrapping_sub(Self::pair(name.as_bytes(), version.as_bytes()));
        self.count -= 1;
    }
    /// How many pairs.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }
    /// The set's version string.
    pub(crate) fn version(&self) -> String {
        let mut bytes = [0u8; 24];
        bytes[..16].copy_from_slice(&self.sum.to_le_bytes());
        bytes[16..].copy_from_slice(&self.count.to_le_bytes());
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind as VKind};
    use prost::Message;

    fn string(s: &str) -> Value {
        Value {
            kind: Some(VKind::StringValue(s.into())),
        }
    }

    /// A Struct with `keys` inserted in the given order, one nested Struct.
    fn build(keys: &[String]) -> Struct {
        let mut s = Struct::default();
        for k in keys {
            let inner = Struct {
                fields: (0..8).map(|i| (format!("inner-{i}"), string(k))).collect(),
            };
            s.fields.insert(
                k.clone(),
                Value {
                    kind: Some(VKind::StructValue(inner)),
                },
            );
        }
        s
    }

    /// The same Struct content built in different insertion orders (and so
    /// different HashMap orders) has one version; other content another.
    /// The decoded descriptors as a schema: the reference the generated
    /// tables are checked against.
    impl Schema for prost_reflect::MessageDescriptor {
        fn named(full_name: &str) -> Option<Self> {
            crate::descriptors::message(full_name)
        }
        fn is_any(&self) -> bool {
            self.full_name() == "google.protobuf.Any"
        }
        fn message_field(&self, number: u32) -> Option<(Self, bool)> {
            let f = self.get_field(number)?;
            match f.kind() {
                prost_reflect::Kind::Message(m) => Some((m, f.is_map())),
                _ => None,
            }
        }
    }

    #[test]
    fn map_order_does_not_change_the_version() {
        let desc = "google.protobuf.Struct";
        let keys: Vec<String> = (0..64).map(|i| format!("key-{i}")).collect();
        let a = build(&keys).encode_to_vec();
        let mut rev = keys.clone();
        rev.reverse();
        let b = build(&rev).encode_to_vec();
        assert_ne!(a, b, "the encodings differ (HashMap order)");
        assert_ne!(content_version(&a), content_version(&b));
        assert_eq!(message_version(desc, &a), message_version(desc, &b));
        let mut other = build(&keys);
        other.fields.insert("key-0".into(), string("changed"));
        assert_ne!(
            message_version(desc, &other.encode_to_vec()),
            message_version(desc, &a)
        );
        // No map with two entries: the plain content hash, no copy needed.
        let one = Struct {
            fields: [("only".to_string(), string("x"))].into(),
        }
        .encode_to_vec();
        assert!(!needs_sorting(&Shape::of(desc).unwrap(), &one, 0));
        assert_eq!(message_version(desc, &one), content_version(&one));
    }

    /// Every message field of every type in the full descriptor set is in
    /// the generated tables exactly when it is a map or its type can hold one,
    /// and a type has a shape exactly when it is `Any` or has such a field: the
    /// tables are the descriptors, minus what cannot change a version.
    #[test]
    fn shapes_equal_the_descriptors() {
        let pool = crate::descriptors::pool();
        let mut shaped = 0;
        for m in pool.all_messages() {
            let shape = Shape::of(m.full_name());
            let mut follows = m.full_name() == "google.protobuf.Any";
            for f in m.fields() {
                let prost_reflect::Kind::Message(t) = f.kind() else {
                    assert!(shape.is_none_or(|s| s.field(f.number()).is_none()));
                    continue;
                };
                let want = (f.is_map() || Shape::of(t.full_name()).is_some())
                    .then(|| (Shape::of(t.full_name()), f.is_map()));
                let got = shape.and_then(|s| s.field(f.number()));
                match (want, got) {
                    (None, None) => {}
                    (Some((ty, map)), Some((s, smap))) => {
                        assert_eq!(map, smap, "{}.{}", m.full_name(), f.name());
                        assert_eq!(ty.and_then(|t| t.name()), s.name(), "{}", f.full_name());
                        follows = true;
                    }
                    (w, g) => panic!("{}: want {w:?}, table has {g:?}", f.full_name()),
                }
            }
            assert_eq!(shape.is_some(), follows, "{}", m.full_name());
            shaped += usize::from(follows);
        }
        assert!(shaped > 100, "only {shaped} types can hold a map");
    }

    use envoy_types::pb::envoy::config::core::v3::Metadata;
    use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
    use envoy_types::pb::google::protobuf::Any;
    use proptest::prelude::*;

    /// A Struct from `(key, nested keys)` pairs, inserted in the given order.
    fn structure(entries: &[(u8, Vec<u8>)]) -> Struct {
        let mut s = Struct::default();
        for (k, inner) in entries {
            let v = if inner.is_empty() {
                string(&format!("v{k}"))
            } else {
                Value {
                    kind: Some(VKind::StructValue(Struct {
                        fields: inner
                            .iter()
                            .map(|i| (format!("i{i}"), string("x")))
                            .collect(),
                    })),
                }
            };
            s.fields.insert(format!("k{k}"), v);
        }
        s
    }

    fn pack<M: prost::Name>(m: &M) -> Any {
        Any {
            type_url: M::type_url(),
            value: m.encode_to_vec(),
        }
    }

    proptest! {
        /// The version walked over the generated tables equals the one walked
        /// over the decoded descriptors, for listeners holding maps at several
        /// depths: metadata Structs, `Any`s packing Structs and Metadata,
        /// typed filter metadata.
        #[test]
        fn table_versions_equal_descriptor_versions(
            entries in proptest::collection::vec(
                (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..4)), 0..8),
            filters in proptest::collection::vec(0u8..3, 0..4),
        ) {
            let st = structure(&entries);
            let mut md = Metadata::default();
            for (k, _) in &entries {
                md.filter_metadata.insert(format!("f{k}"), st.clone());
                md.typed_filter_metadata.insert(format!("t{k}"), pack(&st));
            }
            let chain = FilterChain {
                filters: filters
                    .iter()
                    .map(|&f| Filter {
                        name: format!("f{f}"),
                        config_type: Some(filter::ConfigType::TypedConfig(match f {
                            0 => pack(&st),
                            1 => pack(&md),
                            _ => pack(&envoy_types::pb::google::protobuf::Duration::default()),
                        })),
                    })
                    .collect(),
                metadata: Some(md.clone()),
                ..Default::default()
            };
            let l = Listener {
                name: "l".into(),
                metadata: Some(md),
                filter_chains: vec![chain],
                ..Default::default()
            };
            let bytes = l.encode_to_vec();
            let name = "envoy.config.listener.v3.Listener";
            let desc = crate::descriptors::pool().get_message_by_name(name).unwrap();
            prop_assert_eq!(message_version(name, &bytes), version_with(&desc, &bytes));
            let sbytes = st.encode_to_vec();
            let sdesc = crate::descriptors::pool()
                .get_message_by_name("google.protobuf.Struct")
                .unwrap();
            prop_assert_eq!(
                message_version("google.protobuf.Struct", &sbytes),
                version_with(&sdesc, &sbytes)
            );
        }
    }

    proptest! {
        /// A pair hashed in one call from the stack buffer hashes as the
        /// streamed pair does, on both sides of the buffer's size.
        #[test]
        fn one_shot_pairs_hash_as_streamed(
            name in proptest::collection::vec(any::<u8>(), 0..300),
            version in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            prop_assert_eq!(SetHash::pair(&name, &version), SetHash::pair_streamed(&name, &version));
        }
    }

    /// Adding and removing pairs gives the version of hashing the resulting set.
    #[test]
    fn set_hash_updates_equal_hashing_afresh() {
        let mut h = SetHash::default();
        h.add("a", "1");
        h.add("b", "2");
        h.add("c", "3");
        h.remove("b", "2");
        h.remove("c", "3");
        h.add("c", "4");
        assert_eq!(h.version(), set_version([("a", "1"), ("c", "4")]));
        assert_eq!(h.count(), 2);
        h.remove("a", "1");
        h.remove("c", "4");
        assert_eq!(h, SetHash::default());
        assert_eq!(h.version(), set_version([]));
    }

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
