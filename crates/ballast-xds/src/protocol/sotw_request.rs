//! A SotW `DiscoveryRequest` whose `resource_names` stay undecoded bytes.
//!
//! Every SotW ACK repeats the client's whole subscription; decoding each name
//! into a `String` only to find the list unchanged was half of the server's
//! CPU under SotW churn (issue #13). [`SotwRequest`] decodes every other field
//! with prost, validates and hashes the names' raw bytes (no allocation), and
//! decodes them only when [`super::sotw::SotwMachine`] finds the hash differs
//! from that of the list it applied last for the type.

use std::hash::BuildHasher;

use bytes::{Buf, Bytes};
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use prost::Message;
use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// `DiscoveryRequest.resource_names`.
const RESOURCE_NAMES: u32 = 3;

/// The one-byte key of a `resource_names` element (field 3, length-delimited).
const NAME_KEY: u8 = (RESOURCE_NAMES as u8) << 3 | 2;

/// Hashed with the stream's keyed hasher into the seed of a names key.
const NAMES_SEED: u64 = 0x6e61_6d65_735f_6b65;

/// Identifies a `resource_names` list by its bytes: a 64-bit xxh3 chain
/// seeded per stream from a random key (so a list cannot be chosen to collide
/// with another without knowing it), with the count and total length. xxh3
/// is fast rather than a keyed PRF; a collision a client did find would
/// only make its own stream keep its old subscription.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NamesKey {
    hash: u64,
    count: usize,
    bytes: usize,
}

/// A SotW request as decoded from the wire: `req` has every field but
/// `resource_names`, which [`SotwRequest::names`] decodes on demand.
#[derive(Debug)]
pub(crate) struct SotwRequest {
    pub(crate) req: DiscoveryRequest,
    /// The encoded message (shared with the receive buffer, not copied).
    raw: Bytes,
    key: NamesKey,
}

impl SotwRequest {
    /// Decodes `raw`; names are checked to be UTF-8 (as prost would) and
    /// hashed with a seed drawn from `hasher`, never allocated. The message
    /// is walked as a slice: a `Bytes` split per name was two atomic
    /// reference-count updates per name, and SipHash over ~30 KB of names
    /// per ACK a fifth of the server's samples under W2 (issue #13).
    ///
    /// The names are hashed as the encoded runs they arrive in (tags and
    /// lengths included), one xxh3 call per run rather than one per name:
    /// every encoder writes a repeated field's elements back to back, so an
    /// ACK is one run of ~1,000 names, and a call per name was a sixth of
    /// the server's samples under SotW churn. A run's bytes determine its
    /// names, so equal keys still mean equal lists; the same list split into
    /// other runs (interleaved fields) only gets another key, which costs
    /// the caller one decode of the names.
    pub(crate) fn decode(
        raw: Bytes,
        hasher: &impl BuildHasher,
    ) -> Result<SotwRequest, prost::DecodeError> {
        let mut req = DiscoveryRequest::default();
        let mut hash = hasher.hash_one(NAMES_SEED);
        let mut count = 0;
        let mut bytes = 0;
        // An all-ASCII message (every ACK of ASCII names) has only valid
        // UTF-8 names: one pass over the bytes instead of one check per name.
        let ascii = raw.is_ascii();
        let whole: &[u8] = &raw;
        let mut buf: &[u8] = whole;
        while buf.has_remaining() {
            let start = whole.len() - buf.len();
            let (tag, wire_type) = decode_key(&mut buf)?;
            if tag == RESOURCE_NAMES && wire_type == WireType::LengthDelimited {
                let mut name = take_len_delimited(&mut buf)?;
                loop {
                    if !ascii && std::str::from_utf8(name).is_err() {
                        // The same error prost reports for a bad string.
                        return Err(DiscoveryRequest::decode(raw.as_ref()).unwrap_err());
                    }
                    count += 1;
                    bytes += name.len();
                    name = match buf {
                        // The next name, with a one-byte length (the common case).
                        [NAME_KEY, len, rest @ ..]
                            if *len < 0x80 && usize::from(*len) <= rest.len() =>
                        {
                            let (n, tail) = rest.split_at(usize::from(*len));
                            buf = tail;
                            n
                        }
                        [NAME_KEY, ..] => {
                            buf = &buf[1..];
                            take_len_delimited(&mut buf)?
                        }
                        _ => break,
                    };
                }
                let end = whole.len() - buf.len();
                // Chained through the seed: the key depends on every name,
                // its length and its place in the list.
                hash = xxh3_64_with_seed(&whole[start..end], hash);
            } else {
                req.merge_field(tag, wire_type, &mut buf, DecodeContext::default())?;
            }
        }
        let key = NamesKey { hash, count, bytes };
        Ok(SotwRequest { req, raw, key })
    }

    /// A request whose names are already decoded (tests, REST, fetches).
    #[cfg(test)]
    pub(crate) fn from_request(req: DiscoveryRequest, hasher: &impl BuildHasher) -> SotwRequest {
        let raw = Bytes::from(req.encode_to_vec());
        SotwRequest::decode(raw, hasher).expect("re-decodes its own encoding")
    }

    /// Identifies the names list.
    pub(crate) fn names_key(&self) -> NamesKey {
        self.key
    }

    /// How many names the request carries.
    pub(crate) fn name_count(&self) -> usize {
        self.key.count
    }

    /// Whether the names are exactly the keys of `map`, in order (no
    /// `String`s: compared as the received bytes).
    pub(crate) fn names_are_keys_of<V>(&self, map: &imbl::OrdMap<std::sync::Arc<str>, V>) -> bool {
        if self.key.count != map.len() {
            return false;
        }
        let mut keys = map.keys();
        let mut buf: &[u8] = &self.raw;
        while buf.has_remaining() {
            let (tag, wire_type) = decode_key(&mut buf).expect("decoded before");
            if tag == RESOURCE_NAMES && wire_type == WireType::LengthDelimited {
                let name = take_len_delimited(&mut buf).expect("decoded before");
                if keys.next().is_none_or(|k| k.as_bytes() != name) {
                    return false;
                }
            } else {
                prost::encoding::skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                    .expect("decoded before");
            }
        }
        true
    }

    /// Decodes the names (one `String` each): only when they may differ from
    /// what was applied.
    pub(crate) fn names(&self) -> Vec<String> {
        let mut out = Vec::with_capacity(self.key.count);
        let mut buf: &[u8] = &self.raw;
        while buf.has_remaining() {
            let (tag, wire_type) = decode_key(&mut buf).expect("decoded before");
            if tag == RESOURCE_NAMES && wire_type == WireType::LengthDelimited {
                let name = take_len_delimited(&mut buf).expect("decoded before");
                out.push(std::str::from_utf8(name).expect("checked UTF-8").to_owned());
            } else {
                prost::encoding::skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                    .expect("decoded before");
            }
        }
        out
    }

    /// The full request, names included (rare paths: resume reports).
    pub(crate) fn to_request(&self) -> DiscoveryRequest {
        DiscoveryRequest {
            resource_names: self.names(),
            ..self.req.clone()
        }
    }
}

fn take_len_delimited<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8], prost::DecodeError> {
    let len = decode_varint(buf)?;
    if len > buf.remaining() as u64 {
        // prost's own error for a truncated field.
        return Err(DiscoveryRequest::decode(&[0x1a, 0x01][..]).unwrap_err());
    }
    let (name, rest) = buf.split_at(len as usize);
    *buf = rest;
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::RandomState;

    fn req(names: &[&str], nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: "v1".into(),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            type_url: "t".into(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    #[test]
    fn decodes_like_prost_with_names_on_demand() {
        let s = RandomState::new();
        let r = req(&["b", "a", "", "c"], "7");
        let got = SotwRequest::decode(Bytes::from(r.encode_to_vec()), &s).unwrap();
        assert!(got.req.resource_names.is_empty());
        assert_eq!(got.name_count(), 4);
        assert_eq!(got.to_request(), r);
    }

    #[test]
    fn the_key_follows_the_names_only() {
        let s = RandomState::new();
        let key = |r: DiscoveryRequest| SotwRequest::from_request(r, &s).names_key();
        assert_eq!(key(req(&["a", "b"], "1")), key(req(&["a", "b"], "2")));
        assert_ne!(key(req(&["a", "b"], "1")), key(req(&["b", "a"], "1")));
        assert_ne!(key(req(&["ab"], "1")), key(req(&["a", "b"], "1")));
        assert_ne!(key(req(&[], "1")), key(req(&[""], "1")));
    }

    #[test]
    fn names_compare_with_map_keys_in_order() {
        let s = RandomState::new();
        let map: imbl::OrdMap<std::sync::Arc<str>, ()> = ["a", "b", "c"]
            .into_iter()
            .map(|k| (std::sync::Arc::<str>::from(k), ()))
            .collect();
        let of = |names: &[&str]| SotwRequest::from_request(req(names, "1"), &s);
        assert!(of(&["a", "b", "c"]).names_are_keys_of(&map));
        assert!(!of(&["b", "a", "c"]).names_are_keys_of(&map));
        assert!(!of(&["a", "b"]).names_are_keys_of(&map));
        assert!(!of(&["a", "b", "d"]).names_are_keys_of(&map));
        assert!(!of(&["a", "b", "c", "d"]).names_are_keys_of(&map));
    }

    proptest::proptest! {
        /// The slice walk decodes what prost decodes, names included, for
        /// ASCII and non-ASCII messages (the UTF-8 shortcut) and names longer
        /// than one length byte; the key is equal exactly for equal lists.
        #[test]
        fn decodes_as_prost_and_keys_follow_the_names(
            a in proptest::collection::vec("[a-z/.é]{0,3}|[a-z]{120,140}", 0..6),
            b in proptest::collection::vec("[a-z/.é]{0,3}", 0..6),
            version in "[a-zé0-9]{0,4}",
        ) {
            let s = RandomState::new();
            let ra = DiscoveryRequest { version_info: version.clone(), ..req(&[], "n") };
            let ra = DiscoveryRequest {
                resource_names: a.clone(),
                ..ra
            };
            let rb = DiscoveryRequest { resource_names: b.clone(), ..req(&[], "m") };
            let raw = Bytes::from(ra.encode_to_vec());
            let got = SotwRequest::decode(raw.clone(), &s).unwrap();
            proptest::prop_assert_eq!(got.to_request(), DiscoveryRequest::decode(raw).unwrap());
            proptest::prop_assert_eq!(got.names(), a.clone());
            let kb = SotwRequest::from_request(rb, &s).names_key();
            proptest::prop_assert_eq!(got.names_key() == kb, a == b);
        }
    }

    /// `names` encoded as field 3, with `type_url` (field 4) written before
    /// the names at each index of `splits`: other encoders may interleave.
    fn interleaved(names: &[String], splits: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, n) in names.iter().enumerate() {
            if splits.contains(&i) {
                prost::encoding::string::encode(4, &"t".to_string(), &mut out);
            }
            prost::encoding::string::encode(3, n, &mut out);
        }
        out
    }

    proptest::proptest! {
        /// Names hashed as runs: whatever fields split the list into runs, the
        /// request decodes as prost decodes it, and equal keys always mean
        /// equal lists (the same list in other runs may get another key).
        #[test]
        fn runs_of_names_decode_as_prost_and_keys_stay_sound(
            a in proptest::collection::vec("[a-c]{0,2}|[a-z]{126,130}", 0..8),
            b in proptest::collection::vec("[a-c]{0,2}|[a-z]{126,130}", 0..8),
            sa in proptest::collection::vec(0usize..8, 0..3),
            sb in proptest::collection::vec(0usize..8, 0..3),
        ) {
            let s = RandomState::new();
            let (ra, rb) = (Bytes::from(interleaved(&a, &sa)), Bytes::from(interleaved(&b, &sb)));
            let (ga, gb) = (SotwRequest::decode(ra.clone(), &s).unwrap(), SotwRequest::decode(rb, &s).unwrap());
            proptest::prop_assert_eq!(ga.to_request(), DiscoveryRequest::decode(ra).unwrap());
            proptest::prop_assert_eq!(ga.name_count(), a.len());
            if ga.names_key() == gb.names_key() {
                proptest::prop_assert_eq!(&a, &b);
            }
            if a == b && sa.iter().all(|i| *i >= a.len()) && sb.iter().all(|i| *i >= b.len()) {
                // One run each (no field inside the list): the same key.
                proptest::prop_assert_eq!(ga.names_key(), gb.names_key());
            }
        }
    }

    #[test]
    fn bad_names_are_refused_as_prost_refuses_them() {
        let s = RandomState::new();
        let mut bytes = req(&["ok"], "").encode_to_vec();
        let at = bytes.windows(2).position(|w| w == b"ok").unwrap();
        bytes[at] = 0xff;
        let e = SotwRequest::decode(Bytes::from(bytes.clone()), &s).unwrap_err();
        assert_eq!(
            e.to_string(),
            DiscoveryRequest::decode(bytes.as_slice())
                .unwrap_err()
                .to_string()
        );
        let truncated = &req(&["ok"], "").encode_to_vec()[..6];
        assert!(SotwRequest::decode(Bytes::copy_from_slice(truncated), &s).is_err());
    }
}
