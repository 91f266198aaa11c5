//! Proto-JSON for Envoy messages, via `prost-reflect` over the descriptor set
//! of the same protos `envoy-types` was generated from. Used for REST-xDS,
//! config dumps and printing resources; never on the gRPC hot path.

use prost::Message;
use prost_reflect::{DynamicMessage, SerializeOptions};

/// The descriptor pool of every Envoy API message. Decoding it costs ~35 MiB
/// resident, so the conversions below use [`served_pool`] and only fall back
/// to this one for a type it lacks.
pub fn pool() -> &'static prost_reflect::DescriptorPool {
    crate::descriptors::pool()
}

/// The compact pool: the served resource types, the REST envelope and the
/// typed_config types Ballast emits (`descriptors/served-types.txt`), with
/// their imports. Conversions try it first.
pub fn served_pool() -> &'static prost_reflect::DescriptorPool {
    crate::descriptors::served()
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
///
/// Uses [`served_pool`]; if that fails (the type, or a type packed in an `Any`
/// inside it, is not served) the full [`pool`] gets a second try, so only
/// content outside the served types pays for decoding it.
pub fn bytes_to_json(full_name: &str, bytes: &[u8]) -> Result<serde_json::Value, JsonError> {
    match served_pool().get_message_by_name(full_name) {
        Some(desc) => to_json(desc, bytes).or_else(|served_err| {
            let full = pool()
                .get_message_by_name(full_name)
                .expect("the full pool holds every served type");
            to_json(full, bytes).map_err(|_| served_err)
        }),
        None => to_json(
            pool()
                .get_message_by_name(full_name)
                .ok_or_else(|| JsonError::UnknownType(full_name.to_string()))?,
            bytes,
        ),
    }
}

fn to_json(
    desc: prost_reflect::MessageDescriptor,
    bytes: &[u8],
) -> Result<serde_json::Value, JsonError> {
    let full_name = desc.full_name().to_string();
    let msg = DynamicMessage::decode(desc, bytes).map_err(|e| JsonError::Decode {
        ty: full_name.clone(),
        message: e.to_string(),
    })?;
    let opts = SerializeOptions::new().skip_default_fields(true);
    msg.serialize_with_options(serde_json::value::Serializer, &opts)
        .map_err(|e| JsonError::Parse {
            ty: full_name,
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
    let desc =
        crate::descriptors::message(&name).ok_or_else(|| JsonError::UnknownType(name.clone()))?;
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

    /// A typed_config the served pool lacks still prints: the full pool
    /// takes over for that one conversion.
    #[test]
    fn unserved_any_falls_back_to_the_full_pool() {
        use envoy_types::pb::envoy::extensions::filters::http::buffer::v3::Buffer;
        use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
            HttpConnectionManager, HttpFilter, http_filter::ConfigType,
        };
        let name = "envoy.extensions.filters.http.buffer.v3.Buffer";
        assert!(served_pool().get_message_by_name(name).is_none());
        let hcm = HttpConnectionManager {
            stat_prefix: "s".into(),
            http_filters: vec![HttpFilter {
                name: "envoy.filters.http.buffer".into(),
                config_type: Some(ConfigType::TypedConfig(envoy_types::util::pack_any(
                    Buffer {
                        max_request_bytes: Some(envoy_types::pb::google::protobuf::UInt32Value {
                            value: 7,
                        }),
                    },
                ))),
                ..Default::default()
            }],
            ..Default::default()
        };
        let v = message_to_json(&hcm).unwrap();
        let cfg = &v["httpFilters"][0]["typedConfig"];
        assert_eq!(cfg["@type"], format!("type.googleapis.com/{name}"));
        assert_eq!(cfg["maxRequestBytes"], 7);
        assert!(bytes_to_json("no.such.Type", b"").is_err());
    }
}
