//! Builders for the few resources a basic HTTP setup needs: an HTTP listener
//! using RDS, a route configuration, an EDS cluster and its endpoints. They are
//! what the example server and the tests use, and a starting point for users;
//! Ballast's own translation lives in `ballast-translate`.

use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, EdsClusterConfig,
};
use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::{
    Address, AggregatedConfigSource, ApiVersion, ConfigSource, SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfig;
use envoy_types::pb::envoy::config::listener::v3::{ApiListener, Filter, FilterChain, Listener};
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::weighted_cluster::ClusterWeight;
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, WeightedCluster,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpFilterConfig;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use envoy_types::util::pack_any;

/// `ConfigSource { ads: {} }`: fetch through the same ADS stream.
pub fn ads_source() -> ConfigSource {
    ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        ..Default::default()
    }
}

/// A TCP socket address.
pub fn socket_address(ip: &str, port: u16) -> Address {
    Address {
        address: Some(AddressKind::SocketAddress(SocketAddress {
            address: ip.to_string(),
            port_specifier: Some(PortSpecifier::PortValue(port as u32)),
            ..Default::default()
        })),
    }
}

/// An HTTP connection manager with the router filter, its routes from RDS
/// `route_config` over ADS.
pub fn rds_http_connection_manager(stat_prefix: &str, route_config: &str) -> HttpConnectionManager {
    HttpConnectionManager {
        stat_prefix: stat_prefix.to_string(),
        route_specifier: Some(RouteSpecifier::Rds(Rds {
            config_source: Some(ads_source()),
            route_config_name: route_config.to_string(),
        })),
        http_filters: vec![HttpFilter {
            name: "envoy.filters.http.router".into(),
            config_type: Some(HttpFilterConfig::TypedConfig(pack_any(Router::default()))),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// An HTTP listener whose routes come from RDS `route_config`.
pub fn http_listener(name: &str, ip: &str, port: u16, route_config: &str) -> Listener {
    let hcm = rds_http_connection_manager(name, route_config);
    Listener {
        name: name.to_string(),
        address: Some(socket_address(ip, port)),
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: "envoy.filters.network.http_connection_manager".into(),
                config_type: Some(FilterConfig::TypedConfig(pack_any(hcm))),
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// A listener for proxyless gRPC clients (`xds:///name` targets): no address
/// or filter chains, only an `api_listener` holding an HTTP connection manager
/// whose routes come from RDS `route_config`. Name it exactly like the target.
pub fn api_listener(name: &str, route_config: &str) -> Listener {
    Listener {
        name: name.to_string(),
        api_listener: Some(ApiListener {
            api_listener: Some(pack_any(rds_http_connection_manager(name, route_config))),
        }),
        ..Default::default()
    }
}

/// One virtual host per `(domain, clusters with weights)`, each routing `/` to
/// its clusters.
pub fn route_config(name: &str, hosts: &[(&str, &[(&str, u32)])]) -> RouteConfiguration {
    RouteConfiguration {
        name: name.to_string(),
        virtual_hosts: hosts
            .iter()
            .map(|(domain, clusters)| VirtualHost {
                name: domain.to_string(),
                domains: vec![domain.to_string()],
                routes: vec![Route {
                    r#match: Some(RouteMatch {
                        path_specifier: Some(PathSpecifier::Prefix("/".into())),
                        ..Default::default()
                    }),
                    action: Some(Action::Route(RouteAction {
                        cluster_specifier: Some(match clusters {
                            [(one, _)] => ClusterSpecifier::Cluster(one.to_string()),
                            many => ClusterSpecifier::WeightedClusters(WeightedCluster {
                                clusters: many
                                    .iter()
                                    .map(|(c, w)| ClusterWeight {
                                        name: c.to_string(),
                                        weight: Some(UInt32Value { value: *w }),
                                        ..Default::default()
                                    })
                                    .collect(),
                                ..Default::default()
                            }),
                        }),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// A cluster whose endpoints come from EDS (load assignment named like the cluster).
pub fn eds_cluster(name: &str, connect_timeout: Duration) -> Cluster {
    Cluster {
        name: name.to_string(),
        connect_timeout: Some(PbDuration {
            seconds: connect_timeout.as_secs() as i64,
            nanos: connect_timeout.subsec_nanos() as i32,
        }),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(EdsClusterConfig {
            eds_config: Some(ads_source()),
            service_name: String::new(),
        }),
        ..Default::default()
    }
}

/// The endpoints of `cluster`, all in one locality.
pub fn load_assignment(cluster: &str, endpoints: &[(&str, u16)]) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: cluster.to_string(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints: endpoints
                .iter()
                .map(|(ip, port)| LbEndpoint {
                    host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                        address: Some(socket_address(ip, *port)),
                        ..Default::default()
                    })),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    }
}
