//! A SotW `DiscoveryRequest` whose `resource_names` stay undecoded bytes.
//!
//! Every SotW ACK repeats the client's whole subscription; decoding each name
//! into a `String` only to find the list unchanged was half of the server's
//! CPU under SotW churn (issue #13). [`SotwRequest`] decodes every other field
//! with prost, validates and hashes the names' raw bytes (no allocation), and
//! decodes them only when [`super::sotw::SotwMachine`] finds the hash differs
//! from that of the list it applied last for the type.

use std::hash::{BuildHasher, Hasher};

use bytes::{Buf, Bytes};
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use prost::Message;
use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint};

/// `DiscoveryRequest.resource_names`.
const RESOURCE_NAMES: u32 = 3;

/// Identifies a `resource_names` list by its bytes: a keyed 64-bit hash (the
/// key is random per stream, so a client cannot aim for a collision), with the
/// count and total length.
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
    /// hashed with `hasher`, never allocated.
    pub(crate) fn decode(
        raw: Bytes,
        hasher: &impl BuildHasher,
    ) -> Result<SotwRequest, prost::DecodeError> {
        let mut req = DiscoveryRequest::default();
        let mut h = hasher.build_hasher();
        let mut count = 0;
        let mut bytes = 0;
        let mut buf = raw.clone();
        while buf.has_remaining() {
            let (tag, wire_type) = decode_key(&mut buf)?;
            if tag == RESOURCE_NAMES && wire_type == WireType::LengthDelimited {
                let name = take_len_delimited(&mut buf)?;
                if std::str::from_utf8(&name).is_err() {
                    // The same error prost reports for a bad string.
                    return Err(DiscoveryRequest::decode(raw.as_ref()).unwrap_err());
                }
                h.write_usize(name.len());
                h.write(&name);
                count += 1;
                bytes += name.len();
            } else {
                req.merge_field(tag, wire_type, &mut buf, DecodeContext::default())?;
            }
        }
        let key = NamesKey {
            hash: h.finish(),
            count,
            bytes,
        };
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
        let mut buf = self.raw.clone();
        while buf.has_remaining() {
            let (tag, wire_type) = decode_key(&mut buf).expect("decoded before");
            if tag == RESOURCE_NAMES && wire_type == WireType::LengthDelimited {
                let name = take_len_delimited(&mut buf).expect("decoded before");
                if keys.next().is_none_or(|k| k.as_bytes() != &name[..]) {
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
        let mut buf = self.raw.clone();
        while buf.has_remaining() {
            let (tag, wire_type) = decode_key(&mut buf).expect("decoded before");
            if tag == RESOURCE_NAMES && wire_type == WireType::LengthDelimited {
                let name = take_len_delimited(&mut buf).expect("decoded before");
                out.push(String::from_utf8(name.to_vec()).expect("checked UTF-8"));
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

fn take_len_delimited(buf: &mut Bytes) -> Result<Bytes, prost::DecodeError> {
    let len = decode_varint(buf)?;
    if len > buf.remaining() as u64 {
        // prost's own error for a truncated field.
        return Err(DiscoveryRequest::decode(&[0x1a, 0x01][..]).unwrap_err());
    }
    Ok(buf.split_to(len as usize))
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
