//! Node → gateway (README, "Which Envoy gets which gateway"): an Envoy serves
//! the gateway named by its `node.cluster` (`namespace/name`, or `name` in
//! namespace `default`); node metadata `ballast.gateway` overrides it.
//!
//! Envoys of one gateway on different transports get different resources
//! (their EDS/RDS/SDS references name the transport, see
//! `ballast_translate::config_source`), so the group is the gateway plus,
//! for anything but SotW ADS, `@transport`: `default/edge` (ADS SotW),
//! `default/edge@delta-ads` (ADS Delta: route configurations split into VHDS
//! virtual hosts), `default/edge@grpc`, `default/edge@delta-grpc` (VHDS too),
//! `default/edge@rest`.
//! Each reference names the transport the referencing resource came over,
//! so an Envoy mixing transports (CDS by REST, LDS over ADS) gets consistent
//! config per type.

use ballast_xds::GroupError;
use ballast_xds::envoy_types::pb::envoy::config::core::v3::Node;
use ballast_xds::envoy_types::pb::google::protobuf::value::Kind;

pub const METADATA_KEY: &str = "ballast.gateway";

use ballast_translate::XdsTransport;
use ballast_xds::Transport;

/// The config-source form a request over `t` is served with. A unary gRPC
/// Fetch (no Envoy uses it) gets per-type gRPC references.
pub fn config_transport(t: Transport) -> XdsTransport {
    match t {
        Transport::Ads => XdsTransport::Ads,
        // Delta ADS Envoys get split route configurations (VHDS), which a
        // SotW ADS Envoy would reject: a group of their own.
        Transport::DeltaAds => XdsTransport::DeltaAds,
        Transport::Grpc | Transport::Fetch => XdsTransport::Grpc,
        Transport::DeltaGrpc => XdsTransport::DeltaGrpc,
        Transport::Rest => XdsTransport::Rest,
    }
}

/// The snapshot group of `gateway` (`namespace/name`) for Envoys on `t`.
pub fn group_name(gateway: &str, t: XdsTransport) -> String {
    match t {
        XdsTransport::Ads => gateway.to_string(),
        t => format!("{gateway}@{}", t.as_str()),
    }
}

/// The gateway (`namespace/name`) a group serves ('@' is never in a name).
pub fn gateway_part(group: &str) -> &str {
    group.split_once('@').map_or(group, |(g, _)| g)
}

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

    #[test]
    fn groups_per_transport() {
        let g = |t| group_name("default/edge", config_transport(t));
        assert_eq!(g(Transport::Ads), "default/edge");
        assert_eq!(g(Transport::DeltaAds), "default/edge@delta-ads");
        assert_eq!(g(Transport::Grpc), "default/edge@grpc");
        assert_eq!(g(Transport::Fetch), "default/edge@grpc");
        assert_eq!(g(Transport::DeltaGrpc), "default/edge@delta-grpc");
        assert_eq!(g(Transport::Rest), "default/edge@rest");
        for t in XdsTransport::ALL {
            assert_eq!(gateway_part(&group_name("ns/gw", t)), "ns/gw");
        }
    }
}
