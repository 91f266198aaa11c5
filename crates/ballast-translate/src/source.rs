//! How translated resources tell Envoy where to fetch what they reference: a
//! cluster's endpoints (EDS), an HTTP connection manager's routes (RDS) and a
//! TLS context's certificates (SDS). Every such reference is built by
//! [`config_source`], so the choice lives in one place.
//!
//! Envoy 1.40 only accepts a reference it can subscribe to on its own
//! (`SubscriptionFactoryImpl::subscriptionFromConfigSource`): `ads: {}` needs
//! `dynamic_resources.ads_config` ("ADS must be configured to support an ADS
//! config source"), and `self: {}` is not implemented there at all ("Missing
//! config source specifier", `SelfConfigSource` is `#not-implemented-hide`).
//! So an Envoy without ADS must be told explicitly which transport to use,
//! and the resources of one gateway differ by the transport its Envoys use:
//! Ballast translates once per transport in use (see the serve pipeline).

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::api_config_source::ApiType;
use envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
use envoy_types::pb::envoy::config::core::v3::grpc_service::{EnvoyGrpc, TargetSpecifier};
use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiConfigSource, ApiVersion, ConfigSource, GrpcService,
};

use crate::pb_duration;

/// The transport an Envoy fetches its referenced resources (EDS, RDS, SDS) over:
/// the same one it fetched the referencing cluster or listener over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum XdsTransport {
    /// `ads: {}`: the Envoy's ADS stream (SotW or Delta, whichever it opened).
    #[default]
    Ads,
    /// `ads: {}` too, for Envoys whose ADS stream is Delta: their route
    /// configurations carry `vhds` and each virtual host is its own resource
    /// ([`XdsTransport::splits_routes`]), which a SotW ADS Envoy would reject
    /// (Envoy's `vhds.cc`: "ADS must use DELTA_GRPC api_type").
    DeltaAds,
    /// A State-of-the-World gRPC stream per type to the xDS cluster.
    Grpc,
    /// A Delta gRPC stream per type to the xDS cluster.
    DeltaGrpc,
    /// REST-JSON polling of the xDS cluster.
    Rest,
}

impl XdsTransport {
    pub const ALL: [XdsTransport; 5] = [
        Self::Ads,
        Self::DeltaAds,
        Self::Grpc,
        Self::DeltaGrpc,
        Self::Rest,
    ];

    /// Route configurations are served split (VHDS): one `VirtualHost`
    /// resource per host, so a route edit re-sends one virtual host instead
    /// of the whole route configuration. Envoy's VHDS is Delta only.
    pub fn splits_routes(self) -> bool {
        matches!(self, Self::DeltaAds | Self::DeltaGrpc)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ads => "ads",
            Self::DeltaAds => "delta-ads",
            Self::Grpc => "grpc",
            Self::DeltaGrpc => "delta-grpc",
            Self::Rest => "rest",
        }
    }
}

/// What [`config_source`] needs to know about the Envoy's xDS connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigSources {
    pub transport: XdsTransport,
    /// The bootstrap's cluster pointing at Ballast (`ballast bootstrap` names it
    /// [`DEFAULT_XDS_CLUSTER`]); unused for ADS.
    pub xds_cluster: String,
    /// How often a REST Envoy polls for referenced resources.
    pub rest_refresh: Duration,
    /// Split route configurations into VHDS virtual hosts on the transports
    /// that can ([`XdsTransport::splits_routes`]); `ballast serve --no-vhds`
    /// turns it off.
    pub vhds: bool,
}

impl ConfigSources {
    /// Whether route configurations are served split (VHDS).
    pub fn splits_routes(&self) -> bool {
        self.vhds && self.transport.splits_routes()
    }
}

/// The xDS cluster name `ballast bootstrap` writes.
pub const DEFAULT_XDS_CLUSTER: &str = "ballast_xds";

impl Default for ConfigSources {
    fn default() -> Self {
        ConfigSources {
            transport: XdsTransport::Ads,
            xds_cluster: DEFAULT_XDS_CLUSTER.into(),
            rest_refresh: Duration::from_secs(1),
            vhds: true,
        }
    }
}

/// The `ConfigSource` every EDS/RDS/SDS reference of a translation uses.
pub fn config_source(c: &ConfigSources) -> ConfigSource {
    let api = |api_type: ApiType| ApiConfigSource {
        api_type: api_type as i32,
        transport_api_version: ApiVersion::V3 as i32,
        ..Default::default()
    };
    let grpc = |api_type| ApiConfigSource {
        grpc_services: vec![GrpcService {
            target_specifier: Some(TargetSpecifier::EnvoyGrpc(EnvoyGrpc {
                cluster_name: c.xds_cluster.clone(),
                ..Default::default()
            })),
            ..Default::default()
        }],
        set_node_on_first_message_only: true,
        ..api(api_type)
    };
    let specifier = match c.transport {
        XdsTransport::Ads | XdsTransport::DeltaAds => {
            ConfigSourceSpecifier::Ads(AggregatedConfigSource {})
        }
        XdsTransport::Grpc => ConfigSourceSpecifier::ApiConfigSource(grpc(ApiType::Grpc)),
        XdsTransport::DeltaGrpc => ConfigSourceSpecifier::ApiConfigSource(grpc(ApiType::DeltaGrpc)),
        XdsTransport::Rest => ConfigSourceSpecifier::ApiConfigSource(ApiConfigSource {
            cluster_names: vec![c.xds_cluster.clone()],
            refresh_delay: Some(pb_duration(c.rest_refresh)),
            // A poll is answered at once (200 or 304); this only bounds a hung server.
            request_timeout: Some(pb_duration(Duration::from_secs(5))),
            ..api(ApiType::Rest)
        }),
    };
    ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(specifier),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ads_is_the_default_and_unchanged() {
        assert_eq!(
            config_source(&ConfigSources::default()),
            ballast_xds::simple::ads_source()
        );
    }

    #[test]
    fn other_transports_name_the_xds_cluster() {
        for (t, ty) in [
            (XdsTransport::Grpc, ApiType::Grpc),
            (XdsTransport::DeltaGrpc, ApiType::DeltaGrpc),
            (XdsTransport::Rest, ApiType::Rest),
        ] {
            let c = ConfigSources {
                transport: t,
                xds_cluster: "xds".into(),
                ..Default::default()
            };
            let Some(ConfigSourceSpecifier::ApiConfigSource(a)) =
                config_source(&c).config_source_specifier
            else {
                panic!("{t:?}: not an api_config_source");
            };
            assert_eq!(a.api_type, ty as i32, "{t:?}");
            assert_eq!(a.transport_api_version, ApiVersion::V3 as i32);
            if t == XdsTransport::Rest {
                assert_eq!(a.cluster_names, ["xds"]);
                assert_eq!(a.refresh_delay.unwrap().seconds, 1);
            } else {
                let Some(TargetSpecifier::EnvoyGrpc(g)) = &a.grpc_services[0].target_specifier
                else {
                    panic!("{t:?}: no envoy_grpc");
                };
                assert_eq!(g.cluster_name, "xds");
            }
        }
    }
}
