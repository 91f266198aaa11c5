//! Backends → EDS `Cluster` + `ClusterLoadAssignment`.
//!
//! The two are separate so an endpoint change re-encodes only the load assignment (EDS) and
//! Envoy keeps its cluster (and connection pools) untouched.

use std::collections::BTreeMap;

use ballast_model::{Backend, HealthStatus, LbPolicy, UpstreamProtocol};
use ballast_xds::simple::socket_address;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, EdsClusterConfig, LbPolicy as EnvoyLbPolicy,
};
use envoy_types::pb::envoy::config::core::v3::health_check::{HealthChecker, HttpHealthCheck};
use envoy_types::pb::envoy::config::core::v3::{
    HealthCheck, HealthStatus as EnvoyHealthStatus, Locality,
};
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::envoy::config::core::v3::Http2ProtocolOptions;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::explicit_http_config::ProtocolConfig;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
    ExplicitHttpConfig, UpstreamProtocolOptions,
};
use envoy_types::pb::google::protobuf::UInt32Value;
use envoy_types::util::pack_any;

use crate::{ConfigSources, config_source, names, pb_duration};

/// The EDS cluster of a Backend (everything but its endpoints), with the BackendPolicy that
/// applies to it, if any, and its EDS config source for the Envoys' transport.
pub(crate) fn cluster(
    backend: &Backend,
    inputs: &crate::policy::ClusterInputs,
    sources: &ConfigSources,
) -> Cluster {
    let mut c = backend_cluster(backend, sources);
    if let Some(p) = &inputs.policy {
        crate::policy::apply_backend_policy(&mut c, p);
    }
    if let Some(tls) = &inputs.tls {
        crate::policy::apply_upstream_tls(&mut c, tls);
    }
    c
}

fn backend_cluster(backend: &Backend, sources: &ConfigSources) -> Cluster {
    let spec = &backend.spec;
    Cluster {
        name: names::cluster(&backend.key()),
        connect_timeout: spec.connect_timeout.as_ref().map(|d| pb_duration(d.value)),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(EdsClusterConfig {
            eds_config: Some(config_source(sources)),
            service_name: String::new(),
        }),
        lb_policy: lb_policy(spec.load_balancer.policy) as i32,
        health_checks: spec
            .health_check
            .iter()
            .map(|hc| HealthCheck {
                timeout: Some(pb_duration(hc.timeout.value)),
                interval: Some(pb_duration(hc.interval.value)),
                healthy_threshold: Some(UInt32Value {
                    value: hc.healthy_threshold.value,
                }),
                unhealthy_threshold: Some(UInt32Value {
                    value: hc.unhealthy_threshold.value,
                }),
                health_checker: Some(HealthChecker::HttpHealthCheck(HttpHealthCheck {
                    path: hc.path.value.clone(),
                    host: hc
                        .host
                        .as_ref()
                        .map_or_else(|| backend.metadata.name.clone(), |h| h.value.clone()),
                    ..Default::default()
                })),
                ..Default::default()
            })
            .collect(),
        // One entry: the map's (random) iteration order cannot change the encoding.
        typed_extension_protocol_options: match spec.upstream_protocol() {
            UpstreamProtocol::Http1 => Default::default(),
            UpstreamProtocol::Http2 => [(
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".to_owned(),
                pack_any(HttpProtocolOptions {
                    upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
                        ExplicitHttpConfig {
                            protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(
                                Http2ProtocolOptions::default(),
                            )),
                        },
                    )),
                    ..Default::default()
                }),
            )]
            .into_iter()
            .collect(),
        },
        ..Default::default()
    }
}

pub(crate) fn lb_policy(p: LbPolicy) -> EnvoyLbPolicy {
    match p {
        LbPolicy::RoundRobin => EnvoyLbPolicy::RoundRobin,
        LbPolicy::LeastRequest => EnvoyLbPolicy::LeastRequest,
        LbPolicy::Random => EnvoyLbPolicy::Random,
        LbPolicy::RingHash => EnvoyLbPolicy::RingHash,
        LbPolicy::Maglev => EnvoyLbPolicy::Maglev,
    }
}

/// Whether routes to this policy need a hash policy to get affinity.
pub(crate) fn needs_hash(p: LbPolicy) -> bool {
    matches!(p, LbPolicy::RingHash | LbPolicy::Maglev)
}

fn health(h: HealthStatus) -> EnvoyHealthStatus {
    match h {
        HealthStatus::Healthy => EnvoyHealthStatus::Healthy,
        HealthStatus::Unhealthy => EnvoyHealthStatus::Unhealthy,
        HealthStatus::Draining => EnvoyHealthStatus::Draining,
        HealthStatus::Degraded => EnvoyHealthStatus::Degraded,
    }
}

/// The endpoints of a Backend: one `LocalityLbEndpoints` per zone (endpoints without a zone
/// first, in the empty locality), endpoints in spec order within a zone.
pub(crate) fn load_assignment(backend: &Backend) -> ClusterLoadAssignment {
    let mut zones: BTreeMap<Option<&str>, Vec<LbEndpoint>> = BTreeMap::new();
    for e in &backend.spec.endpoints {
        let port = u16::try_from(e.port.value).unwrap_or(0);
        zones
            .entry(e.zone.as_deref())
            .or_default()
            .push(LbEndpoint {
                host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                    address: Some(socket_address(&e.address.value.to_string(), port)),
                    ..Default::default()
                })),
                health_status: health(e.health) as i32,
                load_balancing_weight: Some(UInt32Value { value: e.weight() }),
                ..Default::default()
            });
    }
    ClusterLoadAssignment {
        cluster_name: names::cluster(&backend.key()),
        endpoints: zones
            .into_iter()
            .map(|(zone, lb_endpoints)| LocalityLbEndpoints {
                locality: zone.map(|z| Locality {
                    zone: z.to_owned(),
                    ..Default::default()
                }),
                lb_endpoints,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// Whether two versions of a Backend give the same `Cluster` (only endpoints differ).
pub(crate) fn same_cluster(a: &Backend, b: &Backend) -> bool {
    a.metadata.namespace == b.metadata.namespace
        && a.metadata.name == b.metadata.name
        && a.spec.load_balancer == b.spec.load_balancer
        && a.spec.connect_timeout == b.spec.connect_timeout
        && a.spec.health_check == b.spec.health_check
        && a.spec.upstream_protocol() == b.spec.upstream_protocol()
}
