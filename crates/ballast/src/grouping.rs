//! Node → gateway (README, "Which Envoy gets which gateway"): an Envoy serves
//! the gateway named by its `node.cluster` (`namespace/name`, or `name` in
//! namespace `default`); node metadata `ballast.gateway` overrides it.

use ballast_xds::GroupError;
use ballast_xds::envoy_types::pb::envoy::config::core::v3::Node;
use ballast_xds::envoy_types::pb::google::protobuf::value::Kind;

pub const METADATA_KEY: &str = "ballast.gateway";

/// The group key (`namespace/name`) of the gateway a node serves.
pub fn gateway_of(node: &Node) -> Result<String, GroupError> {
    let from_metadata = node
        .metadata
        .as_ref()
        .and_then(|m| m.fields.get(METADATA_KEY))
        .and_then(|v| match &v.kind {
            Some(Kind::StringValue(s)) => Some(s.as_str()),
            _ => None,
        });
    let raw = from_metadata.unwrap_or(node.cluster.as_str()).trim();
    if raw.is_empty() {
        return Err(GroupError::new(format!(
            "node {:?} names no gateway: set node.cluster to `namespace/name` or metadata {METADATA_KEY}",
            node.id
        )));
    }
    let (ns, name) = match raw.split_once('/') {
        Some((ns, name)) => (ns, name),
        None => ("default", raw),
    };
    if ns.is_empty() || name.is_empty() || name.contains('/') {
        return Err(GroupError::new(format!(
            "node {:?}: {raw:?} is not `namespace/name`",
            node.id
        )));
    }
    Ok(format!("{ns}/{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast_xds::envoy_types::pb::google::protobuf::{Struct, Value};

    fn node(cluster: &str, meta: Option<&str>) -> Node {
        Node {
            id: "n".into(),
            cluster: cluster.into(),
            metadata: meta.map(|g| Struct {
                fields: [(
                    METADATA_KEY.to_string(),
                    Value {
                        kind: Some(Kind::StringValue(g.into())),
                    },
                )]
                .into_iter()
                .collect(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn mapping() {
        assert_eq!(gateway_of(&node("edge", None)).unwrap(), "default/edge");
        assert_eq!(gateway_of(&node("prod/edge", None)).unwrap(), "prod/edge");
        assert_eq!(gateway_of(&node("x", Some("a/b"))).unwrap(), "a/b");
        assert!(gateway_of(&node("", None)).is_err());
        assert!(gateway_of(&node("a/b/c", None)).is_err());
        assert!(gateway_of(&node("/b", None)).is_err());
    }
}
