//! Backends → EDS `Cluster` + `ClusterLoadAssignment`, or a DNS `Cluster` with its endpoints
//! inline when a Backend has hostname endpoints.
//!
//! The two are separate so an endpoint change re-encodes only the load assignment (EDS) and
//! Envoy keeps its cluster (and connection pools) untouched. A DNS cluster cannot use EDS
//! (Envoy resolves the names, so the endpoints belong to the cluster): its endpoint changes
//! are cluster changes, which Envoy applies by warming the new cluster before swapping it in.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use ballast_model::{
    Backend, DnsMode, EndpointAddress, HealthStatus, LbPolicy, LookupFamily, UpstreamProtocol,
};
use ballast_xds::simple::socket_address;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, CustomClusterType, DiscoveryType, EdsClusterConfig,
    LbPolicy as EnvoyLbPolicy,
};
use envoy_types::pb::envoy::config::core::v3::health_check::{HealthChecker, HttpHealthCheck};
use envoy_types::pb::envoy::config::core::v3::{
    DnsResolverOptions, HealthCheck, HealthStatus as EnvoyHealthStatus, Locality,
    TypedExtensionConfig,
};
use envoy_types::pb::envoy::config::endpoint::v3::endpoint::HealthCheckConfig;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::envoy::config::core::v3::Http2ProtocolOptions;
use envoy_types::pb::envoy::extensions::clusters::common::dns::v3::DnsLookupFamily;
use envoy_types::pb::envoy::extensions::clusters::dns::v3::DnsCluster;
use envoy_types::pb::envoy::extensions::network::dns_resolver::cares::v3::CaresDnsResolverConfig;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::explicit_http_config::ProtocolConfig;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
    ExplicitHttpConfig, UpstreamProtocolOptions,
};
use envoy_types::pb::google::protobuf::UInt32Value;
use envoy_types::util::pack_any;

use crate::{ConfigSources, config_source, names, pb_duration};

/// Envoy's DNS cluster extension (1.40 deprecates the `Cluster`'s own DNS fields for it):
/// strict DNS, or logical DNS with `all_addresses_in_single_endpoint`.
const DNS_CLUSTER: &str = "envoy.cluster.dns";
/// The c-ares resolver, the one that takes explicit resolver addresses.
const CARES_RESOLVER: &str = "envoy.network.dns_resolver.cares";

/// What a Backend's cluster is built with besides the Backend: the BackendPolicy that applies
/// to it and where its EDS or DNS answers come from.
pub(crate) struct ClusterEnv<'a> {
    pub sources: &'a ConfigSources,
    pub dns_resolvers: &'a [SocketAddr],
}

/// The cluster of a Backend (for EDS everything but its endpoints), with the BackendPolicy
/// that applies to it, if any, and its EDS config source for the Envoys' transport.
pub(crate) fn cluster(
    backend: &Backend,
    inputs: &crate::policy::ClusterInputs,
    env: &ClusterEnv<'_>,
) -> Cluster {
    let mut c = backend_cluster(backend, env);
    if let Some(p) = &inputs.policy {
        crate::policy::apply_backend_policy(&mut c, p);
    }
    if let Some(tls) = &inputs.tls {
        crate::policy::apply_upstream_tls(&mut c, tls);
    }
    if backend.spec.is_dns() {
        // A health check's Host is the endpoint's hostname (a name-based server answers its
        // own name, not the cluster's), unless the Backend or its policy names one.
        let explicit_host = backend
            .spec
            .health_check
            .as_ref()
            .is_some_and(|h| h.host.is_some())
            || inputs
                .policy
                .as_ref()
                .is_some_and(|p| crate::policy::health_check_hostname(p).is_some());
        c.load_assignment = Some(endpoints(backend, !explicit_host));
    }
    c
}

fn discovery(
    backend: &Backend,
    env: &ClusterEnv<'_>,
) -> (ClusterDiscoveryType, Option<EdsClusterConfig>) {
    if !backend.spec.is_dns() {
        return (
            ClusterDiscoveryType::Type(DiscoveryType::Eds as i32),
            Some(EdsClusterConfig {
                eds_config: Some(config_source(env.sources)),
                service_name: String::new(),
            }),
        );
    }
    let dns = backend.spec.dns.clone().unwrap_or_default();
    let config = DnsCluster {
        dns_refresh_rate: dns.refresh_rate.as_ref().map(|d| pb_duration(d.value)),
        respect_dns_ttl: dns.respect_ttl,
        dns_lookup_family: dns
            .lookup_family
            .map_or(DnsLookupFamily::Unspecified, |f| match f {
                LookupFamily::Auto => DnsLookupFamily::Auto,
                LookupFamily::V4Only => DnsLookupFamily::V4Only,
                LookupFamily::V6Only => DnsLookupFamily::V6Only,
                LookupFamily::V4Preferred => DnsLookupFamily::V4Preferred,
                LookupFamily::All => DnsLookupFamily::All,
            }) as i32,
        all_addresses_in_single_endpoint: *dns.mode == DnsMode::Logical,
        typed_dns_resolver_config: (!env.dns_resolvers.is_empty()).then(|| TypedExtensionConfig {
            name: CARES_RESOLVER.to_owned(),
            typed_config: Some(pack_any(CaresDnsResolverConfig {
                resolvers: env
                    .dns_resolvers
                    .iter()
                    .map(|a| socket_address(&a.ip().to_string(), a.port()))
                    .collect(),
                // Names are asked as written: the Envoy host's search domains must not turn
                // `api` into `api.corp.example` behind the configured servers' back.
                dns_resolver_options: Some(DnsResolverOptions {
                    no_default_search_domain: true,
                    ..Default::default()
                }),
                ..Default::default()
            })),
        }),
        ..Default::default()
    };
    (
        ClusterDiscoveryType::ClusterType(CustomClusterType {
            name: DNS_CLUSTER.to_owned(),
            typed_config: Some(pack_any(config)),
        }),
        None,
    )
}

fn backend_cluster(backend: &Backend, env: &ClusterEnv<'_>) -> Cluster {
    let spec = &backend.spec;
    let (discovery, eds_cluster_config) = discovery(backend, env);
    Cluster {
        name: names::cluster(&backend.key()),
        connect_timeout: spec.connect_timeout.as_ref().map(|d| pb_duration(d.value)),
        cluster_discovery_type: Some(discovery),
        eds_cluster_config,
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

/// The EDS load assignment of a Backend, `None` for a DNS Backend (its endpoints are inline in
/// its cluster).
pub(crate) fn load_assignment(backend: &Backend) -> Option<ClusterLoadAssignment> {
    (!backend.spec.is_dns()).then(|| endpoints(backend, false))
}

/// The endpoints of a Backend: one `LocalityLbEndpoints` per zone (endpoints without a zone
/// first, in the empty locality), endpoints in spec order within a zone. Hostname endpoints
/// carry their name (Envoy's `hostname`, and the health check Host when `hc_host`).
fn endpoints(backend: &Backend, hc_host: bool) -> ClusterLoadAssignment {
    let mut zones: BTreeMap<Option<&str>, Vec<LbEndpoint>> = BTreeMap::new();
    for e in &backend.spec.endpoints {
        let port = u16::try_from(e.port.value).unwrap_or(0);
        let hostname = match &e.address.value {
            EndpointAddress::Hostname(h) => h.clone(),
            EndpointAddress::Ip(_) => String::new(),
        };
        zones
            .entry(e.zone.as_deref())
            .or_default()
            .push(LbEndpoint {
                host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                    address: Some(socket_address(&e.address.value.to_string(), port)),
                    health_check_config: (hc_host && !hostname.is_empty()).then(|| {
                        HealthCheckConfig {
                            hostname: hostname.clone(),
                            ..Default::default()
                        }
                    }),
                    hostname,
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

/// Whether two versions of a Backend give the same `Cluster` (only endpoints differ, and they
/// are not part of the cluster).
pub(crate) fn same_cluster(a: &Backend, b: &Backend) -> bool {
    let dns = a.spec.is_dns() || b.spec.is_dns();
    (!dns || (a.spec.endpoints == b.spec.endpoints && a.spec.dns == b.spec.dns))
        && a.metadata.namespace == b.metadata.namespace
        && a.metadata.name == b.metadata.name
        && a.spec.load_balancer == b.spec.load_balancer
        && a.spec.connect_timeout == b.spec.connect_timeout
        && a.spec.health_check == b.spec.health_check
        && a.spec.upstream_protocol() == b.spec.upstream_protocol()
}
