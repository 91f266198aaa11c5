//! Policies → Envoy config. A [`BackendPolicy`] only changes the `Cluster` of each Backend it
//! applies to (and, for consistent hashing, the `hash_policy` of routes to it), so a policy
//! edit re-encodes those clusters and patches the Gateways using them; routes are re-translated
//! only when the hash key changes (see [`hash_key`] and the route signature).

use ballast_model::{
    Backend, BackendPolicy, ConfigSet, HashKey, HealthCheckType, PolicyLbType, ObjectKey,
};
use envoy_types::pb::envoy::config::cluster::v3::circuit_breakers::Thresholds;
use envoy_types::pb::envoy::config::cluster::v3::circuit_breakers::thresholds::RetryBudget;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    LbConfig, LbPolicy as EnvoyLbPolicy, LeastRequestLbConfig, RoundRobinLbConfig, SlowStartConfig,
};
use envoy_types::pb::envoy::config::cluster::v3::{CircuitBreakers, Cluster, OutlierDetection};
use envoy_types::pb::envoy::config::core::v3::health_check::payload::Payload as PayloadKind;
use envoy_types::pb::envoy::config::core::v3::health_check::{
    GrpcHealthCheck, HealthChecker, HttpHealthCheck, Payload, TcpHealthCheck,
};
use envoy_types::pb::envoy::config::core::v3::{
    HealthCheck, Http1ProtocolOptions, HttpProtocolOptions as CommonHttpProtocolOptions,
    RequestMethod, RoutingPriority,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::explicit_http_config::ProtocolConfig;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
    ExplicitHttpConfig, UpstreamProtocolOptions,
};
use envoy_types::pb::envoy::r#type::v3::{Int64Range, Percent};
use envoy_types::pb::google::protobuf::UInt32Value;
use envoy_types::util::pack_any;

use crate::cluster::needs_hash;
use crate::pb_duration;

/// Key of Envoy's upstream HTTP protocol options in `typed_extension_protocol_options`.
const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

/// The key routes to `backend` must hash on for affinity, if its load balancer hashes: the
/// policy's `consistentHash`, else source IP for a Backend's own `RingHash`/`Maglev`.
pub(crate) fn hash_key(config: &ConfigSet, backend: &Backend) -> Option<HashKey> {
    let policy = config.backend_policy_for(&backend.key());
    match policy.filter(|p| p.spec.load_balancer.is_some()) {
        Some(p) => p.spec.hash_key(),
        None => needs_hash(backend.spec.load_balancer.policy).then_some(HashKey::SourceIp),
    }
}

/// The Backends a version of a policy names (whether or not it applies to them).
pub(crate) fn targeted_backends(p: &BackendPolicy) -> impl Iterator<Item = ObjectKey> + '_ {
    p.spec
        .target_refs
        .iter()
        .filter(|r| r.target_kind() == Some(ballast_model::TargetKind::Backend))
        .map(|r| ObjectKey::new(p.metadata.namespace.as_str(), r.name.as_str()))
}

fn u32v(v: &Option<ballast_model::Spanned<u32>>) -> Option<UInt32Value> {
    v.as_ref().map(|v| UInt32Value { value: v.value })
}

/// Applies `policy` to the cluster of a Backend (built from the Backend alone).
pub(crate) fn apply_backend_policy(c: &mut Cluster, policy: &BackendPolicy) {
    let s = &policy.spec;
    if s.circuit_breaker.is_some() || s.retry_budget.is_some() {
        let cb = s.circuit_breaker.clone().unwrap_or_default();
        c.circuit_breakers = Some(CircuitBreakers {
            thresholds: vec![Thresholds {
                priority: RoutingPriority::Default as i32,
                max_connections: u32v(&cb.max_connections),
                max_pending_requests: u32v(&cb.max_pending_requests),
                max_requests: u32v(&cb.max_parallel_requests),
                max_retries: u32v(&cb.max_parallel_retries),
                retry_budget: s.retry_budget.as_ref().map(|rb| RetryBudget {
                    budget_percent: rb.budget_percent.as_ref().map(|p| Percent {
                        value: f64::from(p.value),
                    }),
                    min_retry_concurrency: u32v(&rb.min_retry_concurrency),
                    budget_interval: None,
                }),
                // Exposes `remaining_*` gauges, so operators see how close they are.
                track_remaining: true,
                ..Default::default()
            }],
            ..Default::default()
        });
        if let Some(n) = &cb.max_requests_per_connection {
            let opts = HttpProtocolOptions {
                common_http_protocol_options: Some(CommonHttpProtocolOptions {
                    max_requests_per_connection: Some(UInt32Value { value: n.value }),
                    ..Default::default()
                }),
                // Required by Envoy; HTTP/1.1 is what a cluster without options uses anyway.
                upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
                    ExplicitHttpConfig {
                        protocol_config: Some(ProtocolConfig::HttpProtocolOptions(
                            Http1ProtocolOptions::default(),
                        )),
                    },
                )),
                ..Default::default()
            };
            c.typed_extension_protocol_options
                .insert(HTTP_PROTOCOL_OPTIONS.to_owned(), pack_any(opts));
        }
    }
    if let Some(hc) = s.health_check.as_ref() {
        if let Some(a) = &hc.active {
            let checker = match *a.type_ {
                HealthCheckType::Http => {
                    let h = a.http.as_ref().expect("validated: HTTP check has http");
                    HealthChecker::HttpHealthCheck(HttpHealthCheck {
                        host: h
                            .hostname
                            .as_ref()
                            .map(|x| x.value.clone())
                            .unwrap_or_default(),
                        path: h.path.value.clone(),
                        method: h
                            .method
                            .as_ref()
                            .map_or(RequestMethod::MethodUnspecified, |m| {
                                RequestMethod::from_str_name(m.as_str())
                                    .unwrap_or(RequestMethod::MethodUnspecified)
                            }) as i32,
                        expected_statuses: h
                            .expected_statuses
                            .iter()
                            .map(|s| Int64Range {
                                start: i64::from(s.value),
                                end: i64::from(s.value) + 1,
                            })
                            .collect(),
                        ..Default::default()
                    })
                }
                HealthCheckType::Tcp => {
                    let t = a.tcp.clone().unwrap_or_default();
                    let payload = |hex: &ballast_model::Spanned<String>| Payload {
                        payload: Some(PayloadKind::Text(hex.value.clone())),
                    };
                    HealthChecker::TcpHealthCheck(TcpHealthCheck {
                        send: t.send.as_ref().map(payload),
                        receive: t.receive.as_ref().map(payload).into_iter().collect(),
                        ..Default::default()
                    })
                }
                HealthCheckType::Grpc => HealthChecker::GrpcHealthCheck(GrpcHealthCheck {
                    service_name: a
                        .grpc
                        .as_ref()
                        .and_then(|g| g.service.clone())
                        .unwrap_or_default(),
                    ..Default::default()
                }),
            };
            c.health_checks = vec![HealthCheck {
                timeout: Some(pb_duration(a.timeout.value)),
                interval: Some(pb_duration(a.interval.value)),
                healthy_threshold: Some(UInt32Value {
                    value: a.healthy_threshold.value,
                }),
                unhealthy_threshold: Some(UInt32Value {
                    value: a.unhealthy_threshold.value,
                }),
                health_checker: Some(checker),
                ..Default::default()
            }];
        }
        if let Some(p) = &hc.passive {
            let gateway = p.consecutive_gateway_errors.is_some();
            c.outlier_detection = Some(OutlierDetection {
                consecutive_5xx: u32v(&p.consecutive_5xx_errors),
                consecutive_gateway_failure: u32v(&p.consecutive_gateway_errors),
                // Envoy enforces gateway-failure ejection 0% by default: asking for it means on.
                enforcing_consecutive_gateway_failure: gateway
                    .then_some(UInt32Value { value: 100 }),
                interval: p.interval.as_ref().map(|d| pb_duration(d.value)),
                base_ejection_time: p.base_ejection_time.as_ref().map(|d| pb_duration(d.value)),
                max_ejection_percent: u32v(&p.max_ejection_percent),
                ..Default::default()
            });
        }
    }
    if let Some(lb) = &s.load_balancer {
        c.lb_policy = match *lb.type_ {
            PolicyLbType::RoundRobin => EnvoyLbPolicy::RoundRobin,
            PolicyLbType::LeastRequest => EnvoyLbPolicy::LeastRequest,
            PolicyLbType::Random => EnvoyLbPolicy::Random,
            PolicyLbType::ConsistentHash => EnvoyLbPolicy::RingHash,
            PolicyLbType::Maglev => EnvoyLbPolicy::Maglev,
        } as i32;
        c.lb_config = lb.slow_start.as_ref().and_then(|ss| {
            let cfg = Some(SlowStartConfig {
                slow_start_window: Some(pb_duration(ss.window.value)),
                ..Default::default()
            });
            match *lb.type_ {
                PolicyLbType::RoundRobin => {
                    Some(LbConfig::RoundRobinLbConfig(RoundRobinLbConfig {
                        slow_start_config: cfg,
                        ..Default::default()
                    }))
                }
                PolicyLbType::LeastRequest => {
                    Some(LbConfig::LeastRequestLbConfig(LeastRequestLbConfig {
                        slow_start_config: cfg,
                        ..Default::default()
                    }))
                }
                _ => None,
            }
        });
    }
}
