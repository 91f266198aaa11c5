//! Proto-JSON for Envoy messages, via `prost-reflect` over the descriptor set
//! of the same protos `envoy-types` was generated from. Used for REST-xDS,
//! config dumps and printing resources; never on the gRPC hot path.

use prost::Message;
use prost_reflect::{DynamicMessage, SerializeOptions};

/// The descriptor pool of every Envoy API message.
pub fn pool() -> &'static prost_reflect::DescriptorPool {
    crate::descriptors::pool()
}

#[derive(Debug, thiserror::Error)]
/// Errors converting between protobuf bytes and proto-JSON.
#[non_exhaustive]
pub enum JsonError {
    #[error("unknown message type {0}")]
    /// The message type is not in the bundled descriptor set.
    UnknownType(String),
    #[error("invalid {ty} JSON: {source}")]
    /// The JSON does not parse as that message type.
    Parse {
        /// The message type.
        ty: String,
        #[source]
        /// What the parser said.
        source: serde_json::Error,
    },
    #[error("cannot decode {ty}: {message}")]
    /// The bytes do not decode as that message type (`ty`; `message` says why).
    Decode {
        /// The message type.
        ty: String,
        /// What the decoder said.
        message: String,
    },
}

/// Encoded protobuf bytes of `full_name` → proto-JSON value.
pub fn bytes_to_json(full_name: &str, bytes: &[u8]) -> Result<serde_json::Value, JsonError> {
    let desc = pool()
        .get_message_by_name(full_name)
        .ok_or_else(|| JsonError::UnknownType(full_name.to_string()))?;
    let msg = DynamicMessage::decode(desc, bytes).map_err(|e| JsonError::Decode {
        ty: full_name.to_string(),
        message: e.to_string(),
    })?;
    let opts = SerializeOptions::new().skip_default_fields(true);
    msg.serialize_with_options(serde_json::value::Serializer, &opts)
        .map_err(|e| JsonError::Parse {
            ty: full_name.to_string(),
            source: e,
        })
}

/// A prost message → proto-JSON value.
pub fn message_to_json<M: prost::Message + prost::Name>(
    msg: &M,
) -> Result<serde_json::Value, JsonError> {
    bytes_to_json(&M::full_name(), &msg.encode_to_vec())
}

/// Proto-JSON text → prost message (unknown fields are errors, with line:column).
pub fn message_from_json<M: prost::Message + prost::Name + Default>(
    text: &[u8],
) -> Result<M, JsonError> {
    let name = M::full_name();
    let desc = pool()
        .get_message_by_name(&name)
        .ok_or_else(|| JsonError::UnknownType(name.clone()))?;
    let mut de = serde_json::Deserializer::from_slice(text);
    let dynamic = DynamicMessage::deserialize(desc, &mut de).map_err(|e| JsonError::Parse {
        ty: name.clone(),
        source: e,
    })?;
    de.end().map_err(|e| JsonError::Parse {
        ty: name.clone(),
        source: e,
    })?;
    M::decode(dynamic.encode_to_vec().as_slice()).map_err(|e| JsonError::Decode {
        ty: name,
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;

    #[test]
    fn roundtrip_and_errors() {
        let c = Cluster {
            name: "web".into(),
            ..Default::default()
        };
        let v = message_to_json(&c).unwrap();
        assert_eq!(v["name"], "web");
        let back: Cluster = message_from_json(v.to_string().as_bytes()).unwrap();
        assert_eq!(back, c);
        let req: DiscoveryRequest =
            message_from_json(br#"{"node":{"id":"n1"},"resourceNames":["a"]}"#).unwrap();
        assert_eq!(req.node.unwrap().id, "n1");
        let err = message_from_json::<DiscoveryRequest>(b"{\n \"nope\": 1}").unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
    }
}
