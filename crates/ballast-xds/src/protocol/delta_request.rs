//! A `DeltaDiscoveryRequest` whose `initial_resource_versions` stay the
//! received bytes.
//!
//! A reconnecting Delta client reports every resource it holds, per type, as
//! a `map<string, string>`. prost decodes it into a `HashMap<String, String>`:
//! two allocations and a SipHash per name, only for the server to compare the
//! pairs with a snapshot's sorted map and drop them. That was the largest
//! item of a Delta reconnect storm (W5, issue #13: 24 % of the server's CPU).
//! [`DeltaRequest`] decodes every other field with prost and keeps the map as
//! offsets into the received message, checked as prost checks them (UTF-8,
//! lengths). A client that holds a published map exactly is recognised by the
//! map's order-independent hash ([`InitialVersions::set_hash`]), with the
//! entries as received; only other clients need them sorted by name (last
//! entry wins, as in a decoded map), so [`InitialVersions::iter`] sorts on
//! first use and walks them in the order of a [`crate::snapshot`] map.
//! Sorting the ~100 names of every resumed type was 5.6 % of a Delta
//! reconnect storm (W5) and the walk comparing them another 2.4 %.
//!
//! `resource_names_subscribe` stays the received bytes too ([`SubscribeNames`]):
//! a resuming Envoy names every cluster it watches on its EDS request, and
//! prost gave each its own `String` (3.8 % of a Delta storm).

use std::collections::HashMap;
use std::sync::OnceLock;

use bytes::{Buf, Bytes};
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use prost::Message;
use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint};

use crate::version::SetHash;

/// `DeltaDiscoveryRequest.resource_names_subscribe`.
const RESOURCE_NAMES_SUBSCRIBE: u32 = 3;
/// `DeltaDiscoveryRequest.initial_resource_versions`.
const INITIAL_RESOURCE_VERSIONS: u32 = 5;
/// A map entry's key and value.
const ENTRY_KEY: u32 = 1;
const ENTRY_VALUE: u32 = 2;

/// One map entry: byte ranges of its name and version in the message.
#[derive(Clone, Copy, Debug)]
struct Entry {
    name: (u32, u32),
    version: (u32, u32),
}

/// `initial_resource_versions` as the client sent them: names and versions
/// are ranges of the received bytes (checked UTF-8).
#[derive(Clone, Debug, Default)]
pub(crate) struct InitialVersions {
    raw: Bytes,
    /// In message order, repeats kept.
    entries: Vec<Entry>,
    /// Sorted by name and unique, made on first use; `None` when `entries`
    /// already are.
    sorted: OnceLock<Option<Vec<Entry>>>,
}

impl InitialVersions {
    /// From a decoded map (requests not from the wire: tests, the public API).
    pub(crate) fn from_map(map: &HashMap<String, String>) -> InitialVersions {
        let mut raw = Vec::with_capacity(map.iter().map(|(n, v)| n.len() + v.len()).sum());
        let mut entries = Vec::with_capacity(map.len());
        for (n, v) in map {
            let at = raw.len() as u32;
            raw.extend_from_slice(n.as_bytes());
            raw.extend_from_slice(v.as_bytes());
            entries.push(Entry {
                name: (at, n.len() as u32),
                version: (at + n.len() as u32, v.len() as u32),
            });
        }
        InitialVersions {
            raw: Bytes::from(raw),
            entries,
            sorted: OnceLock::new(),
        }
    }

    /// The entries sorted by name; of entries with the same name the last
    /// one received stays (protobuf map semantics).
    fn sorted(&self) -> &[Entry] {
        let sorted = self.sorted.get_or_init(|| {
            let raw = &self.raw;
            let name = |e: &Entry| &raw[e.name.0 as usize..(e.name.0 + e.name.1) as usize];
            if self.entries.windows(2).all(|w| name(&w[0]) < name(&w[1])) {
                return None;
            }
            let mut entries = self.entries.clone();
            // Entries are in message order: ties broken by position.
            entries.sort_unstable_by(|a, b| name(a).cmp(name(b)).then(a.name.0.cmp(&b.name.0)));
            // `dedup_by` keeps the first of a run: give it the last one's version.
            entries.dedup_by(|later, kept| {
                let same = name(later) == name(kept);
                if same {
                    *kept = *later;
                }
                same
            });
            Some(entries)
        });
        sorted.as_deref().unwrap_or(&self.entries)
    }

    /// How many entries were received (repeated names counted each time).
    pub(crate) fn received(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The order-independent hash of the received pairs, as
    /// [`crate::snapshot::TypeResources`] keeps one of its map: equal when
    /// the client holds exactly that map's names at its versions (a
    /// repeated name makes it differ). O(entries), no sorting.
    pub(crate) fn set_hash(&self) -> SetHash {
        let mut h = SetHash::default();
        for e in &self.entries {
            h.add_bytes(self.slice(e.name), self.slice(e.version));
        }
        h
    }

    fn slice(&self, (at, len): (u32, u32)) -> &[u8] {
        &self.raw[at as usize..(at + len) as usize]
    }

    /// `(name, version)` as bytes (checked UTF-8), sorted by name and unique.
    pub(crate) fn iter_bytes(&self) -> impl ExactSizeIterator<Item = (&[u8], &[u8])> + '_ {
        self.sorted()
            .iter()
            .map(|e| (self.slice(e.name), self.slice(e.version)))
    }

    /// `(name, version)`, sorted by name and unique.
    pub(crate) fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        let s = |b| std::str::from_utf8(b).expect("checked UTF-8 when decoded");
        self.iter_bytes().map(move |(n, v)| (s(n), s(v)))
    }

    /// The map prost would have decoded.
    #[cfg(test)]
    pub(crate) fn to_map(&self) -> HashMap<String, String> {
        self.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }
}

/// `resource_names_subscribe` as the client sent them: ranges of the
/// received bytes (checked UTF-8), in message order, repeats kept.
#[derive(Clone, Debug, Default)]
pub(crate) struct SubscribeNames {
    raw: Bytes,
    ranges: Vec<(u32, u32)>,
}

impl SubscribeNames {
    /// From decoded names (requests not from the wire, or decoded by prost).
    fn from_strings(names: &[String]) -> SubscribeNames {
        let mut raw = Vec::with_capacity(names.iter().map(String::len).sum());
        let mut ranges = Vec::with_capacity(names.len());
        for n in names {
            ranges.push((raw.len() as u32, n.len() as u32));
            raw.extend_from_slice(n.as_bytes());
        }
        SubscribeNames {
            raw: Bytes::from(raw),
            ranges,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.ranges.len()
    }

    /// The names, in message order: one allocation (the list), none per name.
    pub(crate) fn to_strs(&self) -> Vec<&str> {
        self.ranges
            .iter()
            .map(|&(at, len)| {
                std::str::from_utf8(&self.raw[at as usize..(at + len) as usize])
                    .expect("checked UTF-8 when decoded")
            })
            .collect()
    }
}

/// A Delta request as decoded from the wire: `req` has every field but
/// `resource_names_subscribe` and `initial_resource_versions`, which are in
/// `subscribe` and `versions`.
#[derive(Debug)]
pub(crate) struct DeltaRequest {
    pub(crate) req: DeltaDiscoveryRequest,
    pub(crate) subscribe: SubscribeNames,
    pub(crate) versions: InitialVersions,
}

impl DeltaRequest {
    /// Decodes `raw` as prost would (same result, same errors), without
    /// decoding `initial_resource_versions` into strings.
    pub(crate) fn decode(raw: Bytes) -> Result<DeltaRequest, prost::DecodeError> {
        match Self::decode_fast(&raw) {
            Some(r) => Ok(r),
            // Something the fast path does not handle exactly as prost
            // (an error, unknown fields in a map entry): prost decides.
            None => DeltaDiscoveryRequest::decode(raw).map(DeltaRequest::from_request),
        }
    }

    /// `None` when prost must decide.
    fn decode_fast(raw: &Bytes) -> Option<DeltaRequest> {
        if raw.len() > u32::MAX as usize {
            return None;
        }
        let mut req = DeltaDiscoveryRequest::default();
        let mut entries = Vec::new();
        let mut subscribe = Vec::new();
        let mut buf = raw.clone();
        while buf.has_remaining() {
            let Ok((tag, wire_type)) = decode_key(&mut buf) else {
                return None;
            };
            if tag == INITIAL_RESOURCE_VERSIONS {
                if wire_type != WireType::LengthDelimited {
                    return None;
                }
                let at = raw.len() - buf.remaining();
                let (entry, used) = entry(&raw[at..], at as u32)?;
                buf.advance(used);
                if entries.is_empty() {
                    entries.reserve(estimate(buf.remaining(), used));
                }
                entries.push(entry);
            } else if tag == RESOURCE_NAMES_SUBSCRIBE {
                if wire_type != WireType::LengthDelimited {
                    return None;
                }
                let at = raw.len() - buf.remaining();
                let (range, used) = string(&raw[at..], at as u32)?;
                buf.advance(used);
                if subscribe.is_empty() {
                    subscribe.reserve(estimate(buf.remaining(), used));
                }
                subscribe.push(range);
            } else if req
                .merge_field(tag, wire_type, &mut buf, DecodeContext::default())
                .is_err()
            {
                return None;
            }
        }
        let versions = InitialVersions {
            raw: raw.clone(),
            entries,
            sorted: OnceLock::new(),
        };
        let subscribe = SubscribeNames {
            raw: raw.clone(),
            ranges: subscribe,
        };
        Some(DeltaRequest {
            req,
            subscribe,
            versions,
        })
    }

    /// From a decoded request (its names move to `subscribe`, its map to
    /// `versions`).
    pub(crate) fn from_request(mut req: DeltaDiscoveryRequest) -> DeltaRequest {
        let map = std::mem::take(&mut req.initial_resource_versions);
        let names = std::mem::take(&mut req.resource_names_subscribe);
        DeltaRequest {
            req,
            subscribe: SubscribeNames::from_strings(&names),
            versions: InitialVersions::from_map(&map),
        }
    }

    /// Through the wire encoding, as the server receives it (tests).
    #[cfg(test)]
    pub(crate) fn through_wire(req: &DeltaDiscoveryRequest) -> DeltaRequest {
        DeltaRequest::decode(Bytes::from(req.encode_to_vec())).expect("decodes its own encoding")
    }

    /// The request prost would have decoded.
    #[cfg(test)]
    pub(crate) fn to_request(&self) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            resource_names_subscribe: self
                .subscribe
                .to_strs()
                .into_iter()
                .map(String::from)
                .collect(),
            initial_resource_versions: self.versions.to_map(),
            ..self.req.clone()
        }
    }
}

/// Room for a repeated field's values, from the bytes left and the size of
/// its first value (a resuming client's names are alike: `cluster-17`, ...),
/// instead of growing the list one doubling at a time; bounded, since the
/// first value may be much smaller than the rest.
fn estimate(remaining: usize, first: usize) -> usize {
    (remaining / first.max(2)).min(1 << 14) + 1
}

/// A length-delimited string at the start of `b` (its length prefix first),
/// found at `at` in the message: its range and the bytes it took. `None`
/// unless it fits and is UTF-8 (else prost decides, and fails as it fails).
fn string(mut b: &[u8], at: u32) -> Option<((u32, u32), usize)> {
    let start = b.len();
    let len = decode_varint(&mut b).ok()?;
    if len > b.len() as u64 {
        return None;
    }
    let len = len as usize;
    std::str::from_utf8(&b[..len]).ok()?;
    let prefix = start - b.len();
    Some((((at as usize + prefix) as u32, len as u32), prefix + len))
}

/// A map entry at the start of `b` (its length prefix first), found at `at`
/// in the message: the entry and the bytes it took. `None` unless it is only
/// a key and a value field, each valid UTF-8 (else prost decides).
fn entry(mut b: &[u8], at: u32) -> Option<(Entry, usize)> {
    let start = b.len();
    let len = decode_varint(&mut b).ok()?;
    if len > b.remaining() as u64 {
        return None;
    }
    let prefix = start - b.len();
    let mut body = &b[..len as usize];
    // A missing key or value is empty; placed at the entry, so names stay
    // in message order by position (ties of a sort are broken by it).
    let here = (at as usize + prefix) as u32;
    let mut e = Entry {
        name: (here, 0),
        version: (here, 0),
    };
    while !body.is_empty() {
        let (tag, wire_type) = decode_key(&mut body).ok()?;
        if wire_type != WireType::LengthDelimited || !(tag == ENTRY_KEY || tag == ENTRY_VALUE) {
            return None;
        }
        let n = decode_varint(&mut body).ok()?;
        if n > body.len() as u64 {
            return None;
        }
        let n = n as usize;
        std::str::from_utf8(&body[..n]).ok()?;
        let offset = at as usize + start - b.len() + len as usize - body.len();
        let range = (offset as u32, n as u32);
        // A field given twice: the last one counts, as in prost.
        if tag == ENTRY_KEY {
            e.name = range;
        } else {
            e.version = range;
        }
        body = &body[n..];
    }
    Some((e, prefix + len as usize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    fn request(pairs: &[(&str, &str)]) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: "t".into(),
            resource_names_subscribe: vec!["a".into(), "b".into()],
            initial_resource_versions: map(pairs),
            response_nonce: "7".into(),
            ..Default::default()
        }
    }

    /// Decodes like prost, with the pairs kept as ranges of the received
    /// bytes (not copied) and sorted by name.
    #[test]
    fn decodes_like_prost_with_sorted_pairs() {
        let r = request(&[("c", "3"), ("a", "1"), ("", "e"), ("b", "")]);
        let raw = Bytes::from(r.encode_to_vec());
        let got = DeltaRequest::decode(raw.clone()).unwrap();
        assert!(got.req.initial_resource_versions.is_empty());
        assert!(got.req.resource_names_subscribe.is_empty());
        assert_eq!(got.subscribe.to_strs(), ["a", "b"]);
        assert_eq!(got.to_request(), r);
        let pairs: Vec<_> = got.versions.iter().collect();
        assert_eq!(pairs, [("", "e"), ("a", "1"), ("b", ""), ("c", "3")]);
        assert_eq!(got.versions.raw.as_ptr(), raw.as_ptr(), "not copied");
    }

    /// A name sent twice keeps its last version, as a decoded map does;
    /// an entry without key or value has them empty.
    #[test]
    fn the_last_of_a_repeated_name_wins() {
        let mut raw = request(&[("a", "1")]).encode_to_vec();
        raw.extend_from_slice(&request(&[("a", "2")]).encode_to_vec());
        raw.extend_from_slice(&[0x2a, 0x00]); // an empty entry: "" → ""
        raw.extend_from_slice(&[0x2a, 0x03, 0x12, 0x01, b'v']); // no key: "" → "v"
        let got = DeltaRequest::decode(Bytes::from(raw.clone())).unwrap();
        let want = DeltaDiscoveryRequest::decode(raw.as_slice()).unwrap();
        assert_eq!(got.to_request(), want);
        let pairs: Vec<_> = got.versions.iter().collect();
        assert_eq!(pairs, [("", "v"), ("a", "2")]);
    }

    /// Malformed maps fail with prost's own error; an unknown field inside an
    /// entry is skipped, as prost skips it.
    #[test]
    fn malformed_maps_fail_as_prost_fails() {
        let good = request(&[("ok", "v")]).encode_to_vec();
        let at = good.windows(2).position(|w| w == b"ok").unwrap();
        let mut bad_utf8 = good.clone();
        bad_utf8[at] = 0xff;
        let truncated = good[..good.len() - 1].to_vec();
        let varint_key = [0x2a, 0x02, 0x08, 0x01]; // key sent as a varint
        let over = [0x2a, 0x05, 0x0a, 0x09, b'a']; // key longer than its entry
        let unknown = [0x2a, 0x06, 0x0a, 0x01, b'a', 0x18, 0x05, 0x00];
        for raw in [&bad_utf8[..], &truncated, &varint_key, &over, &unknown] {
            let got = DeltaRequest::decode(Bytes::copy_from_slice(raw));
            let want = DeltaDiscoveryRequest::decode(raw);
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g.to_request(), w),
                (Err(g), Err(w)) => assert_eq!(g.to_string(), w.to_string()),
                (g, w) => panic!("{raw:?}: {g:?} vs prost {w:?}"),
            }
        }
        assert!(DeltaRequest::decode(Bytes::from(bad_utf8)).is_err());
    }

    /// Subscribed names are kept in order with their repeats, not copied;
    /// malformed ones fail with prost's own error.
    #[test]
    fn subscribed_names_decode_like_prost() {
        let r = DeltaDiscoveryRequest {
            resource_names_subscribe: vec!["b".into(), "a".into(), "".into(), "b".into()],
            resource_names_unsubscribe: vec!["c".into()],
            ..Default::default()
        };
        let raw = Bytes::from(r.encode_to_vec());
        let got = DeltaRequest::decode_fast(&raw).expect("fast path");
        assert_eq!(got.subscribe.to_strs(), ["b", "a", "", "b"]);
        assert_eq!(got.subscribe.raw.as_ptr(), raw.as_ptr(), "not copied");
        assert_eq!(got.to_request(), r);
        let bad_utf8 = [0x1a, 0x02, b'a', 0xff];
        let varint = [0x18, 0x01]; // a name sent as a varint
        let over = [0x1a, 0x05, b'a']; // longer than the message
        for raw in [&bad_utf8[..], &varint, &over] {
            assert!(DeltaRequest::decode_fast(&Bytes::copy_from_slice(raw)).is_none());
            let got = DeltaRequest::decode(Bytes::copy_from_slice(raw)).unwrap_err();
            let want = DeltaDiscoveryRequest::decode(raw).unwrap_err();
            assert_eq!(got.to_string(), want.to_string());
        }
    }

    /// Fields of a request (and whether they are well formed), for the
    /// property below.
    fn field() -> impl Strategy<Value = (Vec<u8>, bool)> {
        let s = || proptest::string::string_regex("[a-c\u{e9}]{0,3}").unwrap();
        let entry = (s(), s(), any::<bool>()).prop_map(|(n, v, swap)| {
            let mut e = DeltaDiscoveryRequest::default();
            e.initial_resource_versions.insert(n, v);
            let mut b = e.encode_to_vec();
            if swap && b.len() > 3 {
                // Value before key inside the entry.
                let inner = b.split_off(2);
                let (k, v) = inner.split_at(2 + inner[1] as usize);
                b.extend_from_slice(v);
                b.extend_from_slice(k);
            }
            b
        });
        let other = (s(), 1u32..=7).prop_map(|(x, tag)| {
            let r = match tag {
                1 => DeltaDiscoveryRequest {
                    node: Some(envoy_types::pb::envoy::config::core::v3::Node {
                        id: x,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                2 => DeltaDiscoveryRequest {
                    type_url: x,
                    ..Default::default()
                },
                3 => DeltaDiscoveryRequest {
                    resource_names_subscribe: vec![x.clone(), "*".into(), x],
                    ..Default::default()
                },
                4 => DeltaDiscoveryRequest {
                    resource_names_unsubscribe: vec![x],
                    ..Default::default()
                },
                7 => DeltaDiscoveryRequest {
                    error_detail: Some(envoy_types::pb::google::rpc::Status {
                        code: 3,
                        message: x,
                        details: vec![],
                    }),
                    ..Default::default()
                },
                _ => DeltaDiscoveryRequest {
                    response_nonce: x,
                    ..Default::default()
                },
            };
            r.encode_to_vec()
        });
        prop_oneof![
            3 => entry.prop_map(|b| (b, true)),
            2 => other.prop_map(|b| (b, true)),
            1 => proptest::collection::vec(any::<u8>(), 0..6).prop_map(|b| (b, false)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// On any bytes — valid requests, repeated and reordered entries,
        /// random fields and corruptions — the decoder says what prost says:
        /// the same request, or the same error.
        #[test]
        fn equals_prost_on_arbitrary_bytes(
            fields in proptest::collection::vec(field(), 0..8),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
            cut in proptest::option::of(any::<prop::sample::Index>()),
        ) {
            let well_formed = fields.iter().all(|(_, ok)| *ok) && flips.is_empty() && cut.is_none();
            let mut raw: Vec<u8> = fields.into_iter().flat_map(|(b, _)| b).collect();
            let want = DeltaDiscoveryRequest::decode(raw.as_slice());
            // The fast path itself, not only prost behind it: it takes every
            // well-formed request, and agrees with prost on whatever it takes.
            let fast = DeltaRequest::decode_fast(&Bytes::from(raw.clone()));
            prop_assert!(!well_formed || fast.is_some(), "{:?}: fast path declined", raw);
            if let (Some(f), Ok(w)) = (&fast, &want) {
                prop_assert_eq!(&f.to_request(), w);
            }
            for (i, b) in flips {
                if !raw.is_empty() {
                    let i = i.index(raw.len());
                    raw[i] = b;
                }
            }
            if let Some(c) = cut && !raw.is_empty() {
                raw.truncate(c.index(raw.len()));
            }
            let fast = DeltaRequest::decode_fast(&Bytes::from(raw.clone()));
            let got = DeltaRequest::decode(Bytes::from(raw.clone()));
            let want = DeltaDiscoveryRequest::decode(raw.as_slice());
            if let (Some(f), Ok(w)) = (&fast, &want) {
                prop_assert_eq!(&f.to_request(), w);
            }
            prop_assert!(fast.is_none() || want.is_ok(), "{:?}: fast path took what prost refuses", raw);
            match (got, want) {
                (Ok(g), Ok(w)) => {
                    let names: Vec<&str> = g.versions.iter().map(|(n, _)| n).collect();
                    prop_assert!(names.windows(2).all(|w| w[0] < w[1]), "sorted, unique");
                    prop_assert_eq!(g.versions.iter().len(), w.initial_resource_versions.len());
                    // The set hash of the entries as received is the decoded
                    // map's unless a name came more than once.
                    let mut want = SetHash::default();
                    for (n, v) in &w.initial_resource_versions {
                        want.add(n, v);
                    }
                    let repeats = g.versions.received() != w.initial_resource_versions.len();
                    prop_assert_eq!(g.versions.set_hash() == want, !repeats);
                    prop_assert_eq!(g.to_request(), w);
                }
                (Err(g), Err(w)) => prop_assert_eq!(g.to_string(), w.to_string()),
                (g, w) => prop_assert!(false, "{:?}: {:?} vs prost {:?}", raw, g, w),
            }
        }

        /// A decoded map and the same map from the wire hold the same pairs.
        #[test]
        fn from_map_equals_the_wire(pairs in proptest::collection::hash_map("[a-z]{0,4}", "[0-9]{0,3}", 0..20)) {
            let r = DeltaDiscoveryRequest { initial_resource_versions: pairs.clone(), ..Default::default() };
            let wire = DeltaRequest::through_wire(&r);
            let from = InitialVersions::from_map(&pairs);
            prop_assert!(wire.versions.iter().eq(from.iter()));
            prop_assert_eq!(from.to_map(), pairs);
        }
    }
}
