//! A gRPC codec that writes responses around pre-encoded resources: each
//! resource is copied into the stream's frame, never re-encoded (DESIGN §3.10).
//! Requests are decoded with prost as usual.

use std::marker::PhantomData;

use bytes::BufMut;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};

use crate::protocol::{DeltaResponse, SotwResponse};
use crate::wire::{
    WIRE_LEN, bytes_field_len, put_bytes_field, put_key, put_str_field, str_field_len,
};

/// A message written by hand onto the wire.
pub trait WireMessage {
    fn encoded_len(&self) -> usize;
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
                .map(|r| bytes_field_len(2, r.any_bytes().len()))
                .sum::<usize>()
            + str_field_len(4, self.ty.type_url())
            + str_field_len(5, &self.nonce)
            + control_plane_len(6)
    }

    fn encode_raw(&self, buf: &mut impl BufMut) {
        put_str_field(buf, 1, &self.version);
        for r in self.resources.values() {
            put_bytes_field(buf, 2, r.any_bytes());
        }
        put_str_field(buf, 4, self.ty.type_url());
        put_str_field(buf, 5, &self.nonce);
        put_control_plane(buf, 6);
    }
}

/// Length of a Delta `Resource { version=1, resource=2 (Any), name=3 }`.
fn delta_resource_len(r: &crate::resource::Resource) -> usize {
    str_field_len(1, r.version())
        + bytes_field_len(2, r.any_bytes().len())
        + str_field_len(3, r.name())
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
            put_bytes_field(buf, 2, r.any_bytes());
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

/// Codec: `E` written by hand, `D` decoded by prost.
pub struct XdsCodec<E, D>(PhantomData<fn(E) -> D>);

impl<E, D> Default for XdsCodec<E, D> {
    fn default() -> Self {
        XdsCodec(PhantomData)
    }
}

/// Small initial buffer: an idle stream should cost little memory (DESIGN §6).
fn buffer() -> BufferSettings {
    BufferSettings::new(4 * 1024, 32 * 1024)
}

impl<E, D> Codec for XdsCodec<E, D>
where
    E: WireMessage + Send + 'static,
    D: prost::Message + Default + Send + 'static,
{
    type Encode = E;
    type Decode = D;
    type Encoder = WireEncoder<E>;
    type Decoder = tonic_prost::ProstDecoder<D>;

    fn encoder(&mut self) -> Self::Encoder {
        WireEncoder(PhantomData)
    }
    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(BufferSettings::default())
    }
}

pub struct WireEncoder<E>(PhantomData<fn(E)>);

impl<E: WireMessage> Encoder for WireEncoder<E> {
    type Item = E;
    type Error = Status;

    fn encode(&mut self, item: E, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.reserve(item.encoded_len());
        item.encode_raw(dst);
        Ok(())
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffer()
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
}
