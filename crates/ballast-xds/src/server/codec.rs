//! Wire framing of responses around pre-encoded resources, never re-encoded
//! (invariant 10, docs/architecture.md).
//!
//! Streams write responses as a chain of chunks ([`Chunks`]): a resource's
//! shared `Bytes` goes out as its own chunk (zero copy: the bytes are never
//! copied per stream), while the hand-framed fields and small resources are
//! copied into short-lived chunks (an HTTP/2 DATA frame and a body poll cost
//! more than copying a few hundred bytes). Nothing is kept per stream between
//! messages.
// Reachable from outside only through `crate::internals` (feature `unstable-internals`).
#![cfg_attr(not(feature = "unstable-internals"), allow(unreachable_pub))]

use std::collections::VecDeque;
use std::ops::Bound;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use crate::protocol::{DeltaResponse, SotwResponse};
use crate::wire::{
    WIRE_LEN, bytes_field_len, put_bytes_field, put_key, put_str_field, str_field_len,
};

/// A message written by hand onto the wire.
pub trait WireMessage {
    /// Exact encoded size.
    fn encoded_len(&self) -> usize;
    /// Writes the message (no length prefix).
    #[cfg_attr(not(feature = "unstable-internals"), allow(dead_code))]
    fn encode_raw(&self, buf: &mut impl BufMut);
}

/// `control_plane` identifier carried by every response (DiscoveryResponse field 6,
/// DeltaDiscoveryResponse field 7): `ControlPlane { identifier = 1 }`.
pub(crate) static CONTROL_PLANE_ID: &str = concat!("ballast/", env!("CARGO_PKG_VERSION"));

fn control_plane_len(field: u32) -> usize {
    bytes_field_len(field, str_field_len(1, CONTROL_PLANE_ID))
}

fn put_control_plane(buf: &mut impl BufMut, field: u32) {
    put_key(buf, field, WIRE_LEN);
    prost::encoding::encode_varint(str_field_len(1, CONTROL_PLANE_ID) as u64, buf);
    put_str_field(buf, 1, CONTROL_PLANE_ID);
}

impl WireMessage for SotwResponse {
    fn encoded_len(&self) -> usize {
        // DiscoveryResponse { version_info=1, resources=2, type_url=4, nonce=5, control_plane=6 }
        str_field_len(1, &self.version)
            + self
                .resources
                .values()
                .map(|r| bytes_field_len(2, r.any_len()))
                .sum::<usize>()
            + str_field_len(4, self.ty.type_url())
            + str_field_len(5, &self.nonce)
            + control_plane_len(6)
    }

    fn encode_raw(&self, buf: &mut impl BufMut) {
        put_str_field(buf, 1, &self.version);
        for r in self.resources.values() {
            put_any(buf, 2, r);
        }
        put_str_field(buf, 4, self.ty.type_url());
        put_str_field(buf, 5, &self.nonce);
        put_control_plane(buf, 6);
    }
}

/// Length of a Delta `Resource { version=1, resource=2 (Any), name=3 }`.
fn delta_resource_len(r: &crate::resource::Resource) -> usize {
    str_field_len(1, r.version()) + bytes_field_len(2, r.any_len()) + str_field_len(3, r.name())
}

/// A resource's `Any` as field `field`, chunk by chunk.
fn put_any(buf: &mut impl BufMut, field: u32, r: &crate::resource::Resource) {
    put_key(buf, field, WIRE_LEN);
    prost::encoding::encode_varint(r.any_len() as u64, buf);
    for c in r.any_chunks() {
        buf.put_slice(c);
    }
}

impl WireMessage for DeltaResponse {
    fn encoded_len(&self) -> usize {
        // DeltaDiscoveryResponse { system_version_info=1, resources=2, type_url=4,
        //   nonce=5, removed_resources=6, control_plane=7 }
        str_field_len(1, &self.system_version)
            + self
                .resources
                .iter()
                .map(|r| bytes_field_len(2, delta_resource_len(r)))
                .sum::<usize>()
            + str_field_len(4, self.ty.type_url())
            + str_field_len(5, &self.nonce)
            + self
                .removed
                .iter()
                .map(|n| bytes_field_len(6, n.len()))
                .sum::<usize>()
            + control_plane_len(7)
    }

    fn encode_raw(&self, buf: &mut impl BufMut) {
        put_str_field(buf, 1, &self.system_version);
        for r in &self.resources {
            put_key(buf, 2, WIRE_LEN);
            prost::encoding::encode_varint(delta_resource_len(r) as u64, buf);
            put_str_field(buf, 1, r.version());
            put_any(buf, 2, r);
            put_str_field(buf, 3, r.name());
        }
        put_str_field(buf, 4, self.ty.type_url());
        put_str_field(buf, 5, &self.nonce);
        for n in &self.removed {
            put_bytes_field(buf, 6, n.as_bytes());
        }
        put_control_plane(buf, 7);
    }
}

/// Resource bytes at least this long are sent as their own chunk, shared with
/// the snapshot; shorter pieces are copied into the current chunk.
///
/// Every chunk is one entry in h2's per-connection send queue, a slab that
/// never shrinks: it keeps room for as many frames as were ever queued at
/// once (up to hyper's 400 KiB of buffered data per stream). Copying up to
/// 16 KiB costs less than a frame, and keeps that slab at a few entries per
/// idle proxy instead of one per resource of a large response.
pub(crate) const SHARE_MIN: usize = 16 * 1024;
/// Size of the chunks that small pieces are copied into (few queued frames
/// per response, see [`SHARE_MIN`]).
pub(crate) const CHUNK: usize = 64 * 1024;

/// The chunks of one gRPC message being written: a 5-byte gRPC header, then
/// the message (total `len` bytes after the header).
pub(crate) struct Chunks {
    staging: BytesMut,
    ready: VecDeque<Bytes>,
    /// Bytes of the framed message (header included) not yet staged or shared.
    remaining: usize,
}

impl Chunks {
    /// Starts a gRPC message of `len` bytes (uncompressed).
    pub(crate) fn new(len: usize) -> Self {
        let mut c = Chunks {
            staging: BytesMut::new(),
            ready: VecDeque::new(),
            remaining: len + 5,
        };
        c.put(5, |b| {
            b.put_u8(0);
            b.put_u32(len as u32);
        });
        c
    }

    /// Room for `n` copied bytes in the current chunk. The caller writes them,
    /// then [`Chunks::wrote`] is implied by the length change.
    fn small(&mut self, n: usize) -> &mut BytesMut {
        if self.staging.capacity() - self.staging.len() < n {
            self.flush();
            let cap = CHUNK.min(self.remaining).max(n);
            self.staging = BytesMut::with_capacity(cap);
        }
        &mut self.staging
    }

    /// Writes copied bytes through `f` (at most `n` of them).
    fn put(&mut self, n: usize, f: impl FnOnce(&mut BytesMut)) {
        let b = self.small(n);
        let before = b.len();
        f(b);
        let wrote = b.len() - before;
        debug_assert!(wrote <= n);
        self.remaining = self.remaining.saturating_sub(wrote);
        if self.staging.len() >= CHUNK {
            self.flush();
        }
    }

    /// Appends shared bytes: zero copy when long enough.
    fn shared(&mut self, bytes: &Bytes) {
        if bytes.len() < SHARE_MIN {
            self.put(bytes.len(), |b| b.put_slice(bytes));
        } else {
            self.flush();
            self.remaining = self.remaining.saturating_sub(bytes.len());
            self.ready.push_back(bytes.clone());
        }
    }

    fn flush(&mut self) {
        if !self.staging.is_empty() {
            self.ready
                .push_back(std::mem::take(&mut self.staging).freeze());
        }
    }

    /// A chunk is ready to go.
    fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    pub(crate) fn pop(&mut self) -> Option<Bytes> {
        self.ready.pop_front()
    }

    /// All of the message was written: the rest of it becomes ready.
    fn finish(&mut self) {
        debug_assert_eq!(self.remaining, 0, "encoded_len disagrees with the chunks");
        self.flush();
    }
}

/// Where a chunked write stands.
#[derive(Debug, Default)]
pub(crate) struct WritePos {
    phase: u8,
    index: usize,
    last: Option<Arc<str>>,
}

/// A message written as chunks, resumably: each call writes until a chunk is
/// ready, so only the chunks the transport can take exist at a time.
pub(crate) trait ChunkedMessage: WireMessage {
    /// Writes on from `pos` until `out` has a chunk ready or the message is
    /// complete; returns `true` once complete (all chunks then ready in `out`).
    fn write_chunks(&self, pos: &mut WritePos, out: &mut Chunks) -> bool;
}

/// Worst-case length of a field key plus a length varint.
const FIELD_HEAD: usize = 5 + 10;

impl ChunkedMessage for SotwResponse {
    fn write_chunks(&self, pos: &mut WritePos, out: &mut Chunks) -> bool {
        if pos.phase == 0 {
            out.put(FIELD_HEAD + self.version.len(), |b| {
                put_str_field(b, 1, &self.version)
            });
            pos.phase = 1;
        }
        if pos.phase == 1 {
            let range = match &pos.last {
                None => self.resources.range::<_, str>(..),
                Some(last) => self
                    .resources
                    .range::<_, str>((Bound::Excluded(&**last), Bound::Unbounded)),
            };
            for (name, r) in range {
                out.put(FIELD_HEAD, |b| {
                    put_key(b, 2, WIRE_LEN);
                    prost::encoding::encode_varint(r.any_len() as u64, b);
                });
                for c in r.any_chunks() {
                    out.shared(c);
                }
                if out.has_ready() {
                    pos.last = Some(name.clone());
                    return false;
                }
            }
            pos.phase = 2;
        }
        let tail = str_field_len(4, self.ty.type_url())
            + str_field_len(5, &self.nonce)
            + control_plane_len(6);
        out.put(tail, |b| {
            put_str_field(b, 4, self.ty.type_url());
            put_str_field(b, 5, &self.nonce);
            put_control_plane(b, 6);
        });
        out.finish();
        true
    }
}

impl ChunkedMessage for DeltaResponse {
    fn write_chunks(&self, pos: &mut WritePos, out: &mut Chunks) -> bool {
        if pos.phase == 0 {
            out.put(FIELD_HEAD + self.system_version.len(), |b| {
                put_str_field(b, 1, &self.system_version)
            });
            pos.phase = 1;
        }
        if pos.phase == 1 {
            while let Some(r) = self.resources.get(pos.index) {
                pos.index += 1;
                out.put(3 * FIELD_HEAD + r.version().len(), |b| {
                    put_key(b, 2, WIRE_LEN);
                    prost::encoding::encode_varint(delta_resource_len(r) as u64, b);
                    put_str_field(b, 1, r.version());
                    put_key(b, 2, WIRE_LEN);
                    prost::encoding::encode_varint(r.any_len() as u64, b);
                });
                for c in r.any_chunks() {
                    out.shared(c);
                }
                out.put(FIELD_HEAD + r.name().len(), |b| {
                    put_str_field(b, 3, r.name())
                });
                if out.has_ready() {
                    return false;
                }
            }
            pos.phase = 2;
            pos.index = 0;
        }
        if pos.phase == 2 {
            out.put(
                str_field_len(4, self.ty.type_url()) + str_field_len(5, &self.nonce),
                |b| {
                    put_str_field(b, 4, self.ty.type_url());
                    put_str_field(b, 5, &self.nonce);
                },
            );
            pos.phase = 3;
        }
        while let Some(n) = self.removed.get(pos.index) {
            pos.index += 1;
            out.put(FIELD_HEAD + n.len(), |b| {
                put_bytes_field(b, 6, n.as_bytes())
            });
            if out.has_ready() {
                return false;
            }
        }
        out.put(control_plane_len(7), |b| put_control_plane(b, 7));
        out.finish();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{Resource, ResourceType};
    use crate::snapshot::ResourceMap;
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse,
    };
    use prost::Message;
    use std::sync::Arc;

    fn res(name: &str) -> Arc<Resource> {
        Resource::new(&Cluster {
            name: name.into(),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn sotw_wire_bytes_decode_with_prost() {
        let mut map = ResourceMap::new();
        for n in ["a", "b"] {
            let r = res(n);
            map.insert(r.name_arc().clone(), r);
        }
        let resp = SotwResponse {
            ty: ResourceType::Cluster,
            version: "v1".into(),
            nonce: "7".into(),
            resources: Arc::new(map),
        };
        let mut buf = Vec::new();
        resp.encode_raw(&mut buf);
        assert_eq!(buf.len(), resp.encoded_len());
        let d = DiscoveryResponse::decode(buf.as_slice()).unwrap();
        assert_eq!(d.version_info, "v1");
        assert_eq!(d.nonce, "7");
        assert_eq!(d.type_url, ResourceType::Cluster.type_url());
        assert_eq!(d.resources.len(), 2);
        let c = Cluster::decode(d.resources[1].value.as_slice()).unwrap();
        assert_eq!(c.name, "b");
        assert_eq!(d.control_plane.unwrap().identifier, CONTROL_PLANE_ID);
    }

    #[test]
    fn delta_wire_bytes_decode_with_prost() {
        let resp = DeltaResponse {
            ty: ResourceType::Cluster,
            system_version: "sv".into(),
            nonce: "3".into(),
            resources: vec![res("a")],
            removed: vec!["gone".into(), "x".into()],
        };
        let mut buf = Vec::new();
        resp.encode_raw(&mut buf);
        assert_eq!(buf.len(), resp.encoded_len());
        let d = DeltaDiscoveryResponse::decode(buf.as_slice()).unwrap();
        assert_eq!(d.system_version_info, "sv");
        assert_eq!(d.removed_resources, vec!["gone", "x"]);
        assert_eq!(d.resources[0].name, "a");
        assert_eq!(d.resources[0].version, res("a").version());
        let any = d.resources[0].resource.as_ref().unwrap();
        assert_eq!(Cluster::decode(any.value.as_slice()).unwrap().name, "a");
    }

    /// A route configuration built from chunks goes out as the same bytes as its whole
    /// encoding, through both writers and both protocols, and its chunks of at least
    /// [`SHARE_MIN`] bytes go out as themselves (no copy per stream); nothing makes it whole.
    #[test]
    fn chunked_resources_go_out_as_their_chunks() {
        use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
        let rc = RouteConfiguration {
            name: "rc".into(),
            virtual_hosts: (0..40)
                .map(|i| VirtualHost {
                    name: format!("h{i:02}"),
                    domains: vec!["d".repeat(100 + i * 1000)],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let bytes = Bytes::from(rc.encode_to_vec());
        let cuts = [0, 7, 5000, 30_000, 31_000, 200_000, 500_000, bytes.len()];
        let chunks: Vec<Bytes> = cuts.windows(2).map(|w| bytes.slice(w[0]..w[1])).collect();
        let chunked =
            Resource::from_encoded_chunks_shared::<RouteConfiguration>("rc", chunks, Arc::new([]))
                .unwrap();
        let whole = Resource::from_encoded::<RouteConfiguration>("rc", &bytes, vec![]).unwrap();
        let map = |r: &Arc<Resource>| -> Arc<ResourceMap> {
            Arc::new([(r.name_arc().clone(), r.clone())].into_iter().collect())
        };
        let sotw = |r: &Arc<Resource>| SotwResponse {
            ty: ResourceType::RouteConfiguration,
            version: "v".into(),
            nonce: "1".into(),
            resources: map(r),
        };
        let delta = |r: &Arc<Resource>| DeltaResponse {
            ty: ResourceType::RouteConfiguration,
            system_version: "s".into(),
            nonce: "2".into(),
            resources: vec![r.clone()],
            removed: vec![],
        };
        /// `a` (with `chunked`'s resource) goes out as `b` (with the whole one) does,
        /// through both writers, and `chunked`'s large chunks go out as themselves.
        fn same_wire(a: &impl ChunkedMessage, b: &impl ChunkedMessage, chunked: &Resource) {
            let raw = |m: &dyn Fn(&mut Vec<u8>)| {
                let mut v = Vec::new();
                m(&mut v);
                v
            };
            assert_eq!(a.encoded_len(), b.encoded_len());
            let got = chunks_of(a);
            assert_eq!(got.concat(), chunks_of(b).concat());
            assert_eq!(raw(&|v| a.encode_raw(v)), raw(&|v| b.encode_raw(v)));
            for c in chunked.any_chunks().iter().filter(|c| c.len() >= SHARE_MIN) {
                assert!(
                    got.iter()
                        .any(|g| g.as_ptr() == c.as_ptr() && g.len() == c.len())
                );
            }
        }
        same_wire(&sotw(&chunked), &sotw(&whole), &chunked);
        same_wire(&delta(&chunked), &delta(&whole), &chunked);
        assert_eq!(chunked.version(), whole.version());
        assert!(
            !chunked.made_whole(),
            "the wire never concatenates the chunks"
        );
    }

    /// Writes `msg` through [`ChunkedMessage`] and returns the chunks.
    fn chunks_of(msg: &impl ChunkedMessage) -> Vec<Bytes> {
        let mut out = Chunks::new(msg.encoded_len());
        let mut pos = WritePos::default();
        let mut all = Vec::new();
        loop {
            let done = msg.write_chunks(&mut pos, &mut out);
            while let Some(c) = out.pop() {
                all.push(c);
            }
            if done {
                return all;
            }
        }
    }

    fn framed(body: Vec<u8>) -> Vec<u8> {
        let mut v = vec![0u8];
        v.extend_from_slice(&(body.len() as u32).to_be_bytes());
        v.extend(body);
        v
    }

    /// A cluster whose encoding is about `size` bytes.
    fn sized(name: &str, size: usize) -> Arc<Resource> {
        Resource::new(&Cluster {
            name: name.into(),
            alt_stat_name: "x".repeat(size),
            ..Default::default()
        })
        .unwrap()
    }

    fn sotw_of(resources: &[Arc<Resource>], version: &str, nonce: &str) -> SotwResponse {
        let map: ResourceMap = resources
            .iter()
            .map(|r| (r.name_arc().clone(), r.clone()))
            .collect();
        SotwResponse {
            ty: ResourceType::Cluster,
            version: version.into(),
            nonce: nonce.into(),
            resources: Arc::new(map),
        }
    }

    fn control_plane() -> Option<envoy_types::pb::envoy::config::core::v3::ControlPlane> {
        Some(envoy_types::pb::envoy::config::core::v3::ControlPlane {
            identifier: CONTROL_PLANE_ID.into(),
        })
    }

    fn check_sotw(resources: &[Arc<Resource>], version: &str, nonce: &str) {
        let resp = sotw_of(resources, version, nonce);
        let chunks = chunks_of(&resp);
        let got: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        let want = DiscoveryResponse {
            version_info: version.into(),
            resources: resp.resources.values().map(|r| r.to_any()).collect(),
            type_url: ResourceType::Cluster.type_url().into(),
            nonce: nonce.into(),
            control_plane: control_plane(),
            ..Default::default()
        };
        assert_eq!(got, framed(want.encode_to_vec()));
        // Large resources go out as the snapshot's own bytes, never copied.
        for r in resp.resources.values() {
            let shared = chunks.iter().any(|c| c.as_ptr() == r.any_bytes().as_ptr());
            assert_eq!(shared, r.any_bytes().len() >= SHARE_MIN, "{}", r.name());
        }
        // Every chunk stays small unless it is one shared resource.
        for c in &chunks {
            assert!(
                c.len() <= CHUNK + 64
                    || resp
                        .resources
                        .values()
                        .any(|r| r.any_bytes().as_ptr() == c.as_ptr())
            );
        }
    }

    fn check_delta(resources: &[Arc<Resource>], removed: &[String]) {
        let resp = DeltaResponse {
            ty: ResourceType::Cluster,
            system_version: "sys".into(),
            nonce: "42".into(),
            resources: resources.to_vec(),
            removed: removed.iter().map(|n| Arc::from(n.as_str())).collect(),
        };
        let got: Vec<u8> = chunks_of(&resp)
            .iter()
            .flat_map(|c| c.iter().copied())
            .collect();
        let want = DeltaDiscoveryResponse {
            system_version_info: "sys".into(),
            resources: resources
                .iter()
                .map(
                    |r| envoy_types::pb::envoy::service::discovery::v3::Resource {
                        name: r.name().into(),
                        version: r.version().into(),
                        resource: Some(r.to_any()),
                        ..Default::default()
                    },
                )
                .collect(),
            type_url: ResourceType::Cluster.type_url().into(),
            removed_resources: removed.to_vec(),
            nonce: "42".into(),
            control_plane: control_plane(),
            ..Default::default()
        };
        assert_eq!(got, framed(want.encode_to_vec()));
    }

    #[test]
    fn chunked_bytes_equal_prost_encoding() {
        check_sotw(&[], "", "1");
        check_sotw(&[res("a")], "v", "1");
        let many: Vec<_> = (0..3000)
            .map(|i| sized(&format!("c{i:05}"), i % 1500))
            .collect();
        check_sotw(&many, "v9", "123");
        check_delta(&[], &[]);
        check_delta(&many[..500], &["gone".to_string()]);
        let removed: Vec<String> = (0..5000).map(|i| format!("removed-{i}")).collect();
        check_delta(&many[..10], &removed);
    }

    /// A large response of small and mid-size resources goes out in a few
    /// chunks of [`CHUNK`] bytes, not one (or two) per resource: each chunk
    /// holds a slot of the connection's send queue while queued, and the
    /// queue keeps its largest size for the life of the connection.
    #[test]
    fn a_large_response_of_small_resources_is_few_chunks() {
        let resources: Vec<_> = (0..400)
            .map(|i| sized(&format!("c{i:05}"), 500 + (i % 4) * 1000))
            .collect();
        let resp = sotw_of(&resources, "v1", "1");
        let len = resp.encoded_len();
        let chunks = chunks_of(&resp).len();
        assert!(
            chunks <= len / CHUNK + 2,
            "{chunks} chunks for {len} bytes of {} resources",
            resources.len()
        );
    }

    proptest::proptest! {
        #[test]
        fn chunked_bytes_equal_prost_encoding_for_any_sizes(
            sizes in proptest::collection::vec(0usize..40_000, 0..40),
            removed in proptest::collection::vec("[a-z]{0,300}", 0..20),
            version in "[a-f0-9]{0,20}",
        ) {
            let resources: Vec<_> = sizes
                .iter()
                .enumerate()
                .map(|(i, s)| sized(&format!("r{i:03}"), *s))
                .collect();
            check_sotw(&resources, &version, "7");
            check_delta(&resources, &removed);
        }
    }
}
