//! Policies → Envoy config. A [`BackendPolicy`] only changes the `Cluster` of each Backend it
//! applies to (and, for consistent hashing, the `hash_policy` of routes to it), so a policy
//! edit re-encodes those clusters and patches the Gateways using them; routes are re-translated
//! only when the hash key changes (see [`hash_key`] and the route signature).

use std::sync::Arc;

use ballast_model::{ClientPolicy, EscapedSlashesAction, TlsVersion};
use envoy_types::pb::envoy::config::listener::v3::Filter;
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfig;
use envoy_types::pb::envoy::extensions::filters::network::connection_limit::v3::ConnectionLimit;
use envoy_types::pb::envoy::config::core::v3::Http2ProtocolOptions;
use envoy_types::pb::google::protobuf::UInt64Value;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::{
    ForwardClientCertDetails, PathWithEscapedSlashesAction, SetCurrentClientCertDetails,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::tls_parameters::TlsProtocol;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{DownstreamTlsContext, TlsParameters};
use envoy_types::pb::google::protobuf::BoolValue;

use ballast_model::{
    Backend, BackendPolicy, BackendTlsPolicy, ConfigSet, HashKey, HealthCheckType, ObjectKey,
    PolicyLbType, SanKind, Secret,
};
use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType as TsConfig;
use envoy_types::pb::envoy::config::core::v3::{DataSource, TransportSocket};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::common_tls_context::ValidationContextType;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::subject_alt_name_matcher::SanType;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, SubjectAltNameMatcher, TlsCertificate,
    UpstreamTlsContext,
};
use envoy_types::pb::envoy::r#type::matcher::v3::StringMatcher;
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
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

use envoy_types::pb::envoy::config::common::mutation_rules::v3::HeaderMutation as HeaderMutationAction;
use envoy_types::pb::envoy::config::common::mutation_rules::v3::header_mutation::Action as MutationAction;
use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::extensions::filters::http::header_mutation::v3::{
    HeaderMutation, Mutations,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpFilterConfig;

use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
use envoy_types::pb::envoy::config::core::v3::http1_protocol_options::HeaderKeyFormat;
use envoy_types::pb::envoy::config::core::v3::http1_protocol_options::header_key_format::HeaderFormat;
use envoy_types::pb::envoy::extensions::http::header_formatters::preserve_case::v3::PreserveCaseFormatterConfig;

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

/// The Host an active HTTP health check of `policy` sends, if it names one.
pub(crate) fn health_check_hostname(p: &BackendPolicy) -> Option<&str> {
    let active = p.spec.health_check.as_ref()?.active.as_ref()?;
    active
        .http
        .as_ref()?
        .hostname
        .as_deref()
        .map(String::as_str)
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

/// Stand-in trust anchor when a BackendTLSPolicy's CA does not resolve: a CA whose private key
/// was never kept, so no backend certificate verifies and connections fail closed (Gateway
/// API: an unresolved CA must not fall back to plaintext or unverified TLS).
const UNRESOLVED_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBtjCCAV2gAwIBAgIUUM4X62+cnx1she9+eoc5Q4ArMp8wCgYIKoZIzj0EAwIw
MDEuMCwGA1UEAwwlYmFsbGFzdCB1bnJlc29sdmVkIENBIChubyBrZXkgZXhpc3Rz
KTAgFw0yNjExMzAyMDMxMDlaGA8yMTI2MTEwNjIwMzEwOVowMDEuMCwGA1UEAwwl
YmFsbGFzdCB1bnJlc29sdmVkIENBIChubyBrZXkgZXhpc3RzKTBZMBMGByqGSM49
AgEGCCqGSM49AwEHA0IABDFzuZ18UVu9AZpYnJacooTyg1y/RcD6F5vvVurpRwud
GSz2s/t3PK8LfxcaOVlWfctrXQtWhYItaznIUlzVcV2jUzBRMB0GA1UdDgQWBBS+
DFlUWn+Kticwe0avsi6Fuh1vTjAfBgNVHSMEGDAWgBS+DFlUWn+Kticwe0avsi6F
uh1vTjAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0cAMEQCICg0TC0qKrXi
lcmne8TuLVbGimnFJyZJurXMQJHYuuCBAiAt5IcDtmDLsYf54ClBQivyiwl4N/xr
QYDqB14+DHIIEQ==
-----END CERTIFICATE-----
";

/// Everything besides the Backend its cluster is built from: the cache compares these to
/// decide whether to re-encode, so an edit to any of them (policy, CA ConfigMap, client
/// certificate Secret) re-encodes exactly the clusters using it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ClusterInputs {
    pub policy: Option<Arc<BackendPolicy>>,
    pub tls: Option<UpstreamTls>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UpstreamTls {
    pub policy: Arc<BackendTlsPolicy>,
    /// PEM bundle, or why it does not resolve.
    pub ca: Result<String, String>,
    pub client_certificate: Option<Arc<Secret>>,
}

impl ClusterInputs {
    pub(crate) fn compute(config: &ConfigSet, backend: &ObjectKey) -> Self {
        let policy = config.backend_policy_for(backend).cloned();
        let tls = config.backend_tls_policy_for(backend).map(|p| UpstreamTls {
            policy: p.clone(),
            ca: config.backend_tls_ca(p),
            client_certificate: policy
                .as_ref()
                .and_then(|bp| config.backend_client_certificate(bp))
                .and_then(Result::ok),
        });
        ClusterInputs { policy, tls }
    }
}

/// The Backends a version of a BackendTLSPolicy names.
pub(crate) fn tls_targeted_backends(p: &BackendTlsPolicy) -> impl Iterator<Item = ObjectKey> + '_ {
    p.spec
        .target_refs
        .iter()
        .filter(|r| r.target_kind() == Some(ballast_model::TargetKind::Backend))
        .map(|r| ObjectKey::new(p.metadata.namespace.as_str(), r.name.as_str()))
}

/// Backends whose cluster inputs may involve ConfigMap or Secret `key` (as a CA or client
/// certificate), in either config.
pub(crate) fn backends_using_object(
    config: &ConfigSet,
    kind: ballast_model::Kind,
    key: &ObjectKey,
) -> Vec<ObjectKey> {
    let mut out = Vec::new();
    for p in config.backend_tls_policies.values() {
        if p.metadata.namespace == key.namespace
            && p.spec
                .validation
                .ca_certificate_refs
                .iter()
                .any(|r| *r.name == key.name && r.kind.as_str() == kind.as_str())
        {
            out.extend(tls_targeted_backends(p));
        }
    }
    if kind == ballast_model::Kind::Secret {
        for p in config.backend_policies.values() {
            if p.metadata.namespace == key.namespace
                && p.spec
                    .tls
                    .as_ref()
                    .is_some_and(|t| *t.client_certificate_ref.name == key.name)
            {
                out.extend(targeted_backends(p));
            }
        }
    }
    out
}

fn inline(pem: &str) -> DataSource {
    DataSource {
        specifier: Some(Specifier::InlineString(pem.to_owned())),
        ..Default::default()
    }
}

/// TLS to the backend: verify its certificate against the CA and hostname (or the listed
/// SANs), send the hostname as SNI, present the client certificate if one is configured.
pub(crate) fn apply_upstream_tls(c: &mut Cluster, tls: &UpstreamTls) {
    let v = &tls.policy.spec.validation;
    let exact = |s: &str| StringMatcher {
        match_pattern: Some(MatchPattern::Exact(s.to_owned())),
        ..Default::default()
    };
    let sans: Vec<SubjectAltNameMatcher> = if v.subject_alt_names.is_empty() {
        vec![SubjectAltNameMatcher {
            san_type: SanType::Dns as i32,
            matcher: Some(exact(&v.hostname)),
            ..Default::default()
        }]
    } else {
        v.subject_alt_names
            .iter()
            .map(|s| match *s.type_ {
                SanKind::Hostname => SubjectAltNameMatcher {
                    san_type: SanType::Dns as i32,
                    matcher: Some(exact(s.hostname.as_deref().map_or("", |h| h.as_str()))),
                    ..Default::default()
                },
                SanKind::Uri => SubjectAltNameMatcher {
                    san_type: SanType::Uri as i32,
                    matcher: Some(exact(s.uri.as_deref().map_or("", |h| h.as_str()))),
                    ..Default::default()
                },
            })
            .collect()
    };
    let ca = tls.ca.as_deref().unwrap_or(UNRESOLVED_CA);
    let ctx = UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificates: tls
                .client_certificate
                .iter()
                .map(|s| TlsCertificate {
                    certificate_chain: Some(inline(&s.tls.certificate_chain)),
                    private_key: Some(inline(&s.tls.private_key)),
                    ..Default::default()
                })
                .collect(),
            validation_context_type: Some(ValidationContextType::ValidationContext(
                CertificateValidationContext {
                    trusted_ca: Some(inline(ca)),
                    match_typed_subject_alt_names: sans,
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
        sni: v.hostname.value.clone(),
        ..Default::default()
    };
    c.transport_socket = Some(TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(TsConfig::TypedConfig(pack_any(ctx))),
    });
}

/// What a ClientPolicy turns into for one filter chain, with its resolved client CA.
pub(crate) struct ClientSettings<'a> {
    pub policy: &'a ClientPolicy,
    /// PEM bundle for client validation (`None`: no validation configured; `Err`: unresolved,
    /// then every client certificate is rejected: fail closed).
    pub client_ca: Option<Result<String, String>>,
    /// The connection manager's tracing (`None`: no `tracing`, or its Backend is missing).
    pub tracing: Option<envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing>,
    /// The listener's port when HTTP/3 applies there (`http3` set, HTTPS listener): the
    /// port's QUIC listener serves this chain and TCP responses advertise it in `alt-svc`.
    pub http3_port: Option<u32>,
    /// The `Host` given to HTTP/1.0 requests without one (`http1.http10.useDefaultHost`).
    pub default_host: Option<String>,
}

impl<'a> ClientSettings<'a> {
    pub(crate) fn for_listener(
        config: &'a ConfigSet,
        gateway: &ObjectKey,
        listener: &str,
    ) -> Option<Self> {
        let policy = config.client_policy_for(gateway, listener)?;
        let client_ca = policy
            .spec
            .tls
            .as_ref()
            .and_then(|t| t.client_validation.as_ref())
            .map(|v| config.ca_bundle(&policy.metadata.namespace, &v.ca_certificate_refs));
        let tracing = crate::otel::hcm_tracing(config, gateway, policy);
        let l = config
            .gateways
            .get(gateway)
            .and_then(|g| g.listener(listener));
        Some(ClientSettings {
            policy,
            client_ca,
            tracing,
            http3_port: l.filter(|l| policy.http3_on(l)).map(|l| l.port.value),
            default_host: l
                .and_then(|l| policy.default_host_for(l))
                .map(str::to_owned),
        })
    }
}

/// Gateways a version of a ClientPolicy names.
pub(crate) fn targeted_gateways(p: &ClientPolicy) -> impl Iterator<Item = ObjectKey> + '_ {
    p.spec
        .target_refs
        .iter()
        .filter(|r| r.target_kind() == Some(ballast_model::TargetKind::Gateway))
        .map(|r| ObjectKey::new(p.metadata.namespace.as_str(), r.name.as_str()))
}

/// Gateways whose ClientPolicies use ConfigMap or Secret `key` as a client CA.
pub(crate) fn gateways_using_object(
    config: &ConfigSet,
    kind: ballast_model::Kind,
    key: &ObjectKey,
) -> Vec<ObjectKey> {
    config
        .client_policies
        .values()
        .filter(|p| {
            p.metadata.namespace == key.namespace
                && p.spec
                    .tls
                    .as_ref()
                    .and_then(|t| t.client_validation.as_ref())
                    .is_some_and(|v| {
                        v.ca_certificate_refs
                            .iter()
                            .any(|r| *r.name == key.name && r.kind.as_str() == kind.as_str())
                    })
        })
        .flat_map(|p| targeted_gateways(p).collect::<Vec<_>>())
        .collect()
}

/// Applies the HTTP-level client settings to a connection manager.
pub(crate) fn apply_client_hcm(hcm: &mut HttpConnectionManager, s: &ClientSettings<'_>) {
    let spec = &s.policy.spec;
    if let Some(x) = spec
        .client_ip_detection
        .as_ref()
        .and_then(|c| c.x_forwarded_for.as_ref())
    {
        hcm.use_remote_address = Some(BoolValue { value: true });
        hcm.xff_num_trusted_hops = x.num_trusted_hops.value;
    }
    if let Some(t) = &spec.timeout {
        hcm.request_timeout = t.request_timeout.as_ref().map(|d| pb_duration(d.value));
        hcm.stream_idle_timeout = t.stream_idle_timeout.as_ref().map(|d| pb_duration(d.value));
        if let Some(d) = &t.idle_timeout {
            hcm.common_http_protocol_options = Some(CommonHttpProtocolOptions {
                idle_timeout: Some(pb_duration(d.value)),
                ..Default::default()
            });
        }
    }
    hcm.max_request_headers_kb = u32v(&spec.max_request_headers_kb);
    hcm.tracing = s.tracing.clone();
    if let Some(h) = &spec.http2 {
        // Validation bounds the values to Envoy's ranges (below u32::MAX).
        let u32_of = |v: u64| UInt32Value {
            value: u32::try_from(v).unwrap_or(u32::MAX),
        };
        hcm.http2_protocol_options = Some(Http2ProtocolOptions {
            max_concurrent_streams: u32v(&h.max_concurrent_streams),
            initial_stream_window_size: h
                .initial_stream_window_size
                .as_ref()
                .map(|w| u32_of(w.value.0)),
            initial_connection_window_size: h
                .initial_connection_window_size
                .as_ref()
                .map(|w| u32_of(w.value.0)),
            ..Default::default()
        });
    }
    if let Some(h1) = &spec.http1 {
        hcm.http_protocol_options = Some(Http1ProtocolOptions {
            accept_http_10: h1.http10.is_some(),
            default_host_for_http_10: s.default_host.clone().unwrap_or_default(),
            enable_trailers: h1.enable_trailers,
            // The downstream codec records each header name's case and attaches it to the
            // request, whose encoder to HTTP/1 backends then writes it back.
            header_key_format: h1.preserve_header_case.then(|| HeaderKeyFormat {
                header_format: Some(HeaderFormat::StatefulFormatter(TypedExtensionConfig {
                    name: "envoy.http.stateful_header_formatters.preserve_case".into(),
                    typed_config: Some(pack_any(PreserveCaseFormatterConfig::default())),
                })),
            }),
            ..Default::default()
        });
    }
    if let Some(p) = &spec.path {
        hcm.merge_slashes = !p.disable_merge_slashes;
        if let Some(a) = &p.escaped_slashes_action {
            hcm.path_with_escaped_slashes_action = match a.value {
                EscapedSlashesAction::KeepUnchanged => PathWithEscapedSlashesAction::KeepUnchanged,
                EscapedSlashesAction::RejectRequest => PathWithEscapedSlashesAction::RejectRequest,
                EscapedSlashesAction::UnescapeAndRedirect => {
                    PathWithEscapedSlashesAction::UnescapeAndRedirect
                }
                EscapedSlashesAction::UnescapeAndForward => {
                    PathWithEscapedSlashesAction::UnescapeAndForward
                }
            } as i32;
        }
    }
    let forward = spec
        .tls
        .as_ref()
        .and_then(|t| t.client_validation.as_ref())
        .is_some_and(|v| v.forward_client_certificate);
    if forward {
        hcm.forward_client_cert_details = ForwardClientCertDetails::SanitizeSet as i32;
        hcm.set_current_client_cert_details = Some(SetCurrentClientCertDetails {
            subject: Some(BoolValue { value: true }),
            cert: true,
            dns: true,
            uri: true,
            ..Default::default()
        });
    }
}

/// Makes every response of a TCP connection manager advertise HTTP/3 on `port`
/// (`alt-svc: h3=":port"; ma=86400`, as browsers expect), so clients switch to the port's
/// QUIC listener. First in the chain, so local replies of later filters carry it too.
pub(crate) fn add_alt_svc(hcm: &mut HttpConnectionManager, port: u32) {
    let mutation = HeaderMutation {
        mutations: Some(Mutations {
            response_mutations: vec![HeaderMutationAction {
                action: Some(MutationAction::Append(HeaderValueOption {
                    header: Some(HeaderValue {
                        key: "alt-svc".into(),
                        value: format!("h3=\":{port}\"; ma=86400"),
                        ..Default::default()
                    }),
                    append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
                    ..Default::default()
                })),
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    hcm.http_filters.insert(
        0,
        HttpFilter {
            name: "envoy.filters.http.header_mutation".into(),
            config_type: Some(HttpFilterConfig::TypedConfig(pack_any(mutation))),
            ..Default::default()
        },
    );
}

/// The `connection_limit` network filter of a chain, when the policy sets one. It must come
/// before the connection manager so over-limit connections are closed before any HTTP work.
pub(crate) fn connection_limit_filter(s: &ClientSettings<'_>, stat_prefix: &str) -> Option<Filter> {
    let l = s
        .policy
        .spec
        .connection
        .as_ref()?
        .connection_limit
        .as_ref()?;
    let cfg = ConnectionLimit {
        stat_prefix: stat_prefix.to_owned(),
        max_connections: Some(UInt64Value {
            value: l.value.value,
        }),
        delay: l.close_delay.as_ref().map(|d| pb_duration(d.value)),
        ..Default::default()
    };
    Some(Filter {
        name: "envoy.filters.network.connection_limit".into(),
        config_type: Some(FilterConfig::TypedConfig(pack_any(cfg))),
    })
}

/// Applies TLS versions, ciphers and client validation to a downstream TLS context.
pub(crate) fn apply_client_tls(ctx: &mut DownstreamTlsContext, s: &ClientSettings<'_>) {
    let Some(tls) = &s.policy.spec.tls else {
        return;
    };
    let version = |v: &Option<ballast_model::Spanned<TlsVersion>>| match v.as_ref().map(|v| v.value)
    {
        None => TlsProtocol::TlsAuto,
        Some(TlsVersion::V1_2) => TlsProtocol::TlSv12,
        Some(TlsVersion::V1_3) => TlsProtocol::TlSv13,
    } as i32;
    let common = ctx.common_tls_context.get_or_insert_with(Default::default);
    if !tls.alpn_protocols.is_empty() {
        common.alpn_protocols = tls.alpn_protocols.iter().map(|a| a.value.clone()).collect();
    }
    if tls.min_version.is_some() || tls.max_version.is_some() || !tls.ciphers.is_empty() {
        common.tls_params = Some(TlsParameters {
            tls_minimum_protocol_version: version(&tls.min_version),
            tls_maximum_protocol_version: version(&tls.max_version),
            cipher_suites: tls.ciphers.iter().map(|c| c.value.clone()).collect(),
            ..Default::default()
        });
    }
    if let Some(v) = &tls.client_validation {
        let ca = match &s.client_ca {
            Some(Ok(pem)) => pem.as_str(),
            _ => UNRESOLVED_CA,
        };
        let exact = |s: &str| StringMatcher {
            match_pattern: Some(MatchPattern::Exact(s.to_owned())),
            ..Default::default()
        };
        common.validation_context_type = Some(ValidationContextType::ValidationContext(
            CertificateValidationContext {
                trusted_ca: Some(inline(ca)),
                match_typed_subject_alt_names: v
                    .subject_alt_names
                    .iter()
                    .flat_map(|n| {
                        let t = if n.contains("://") {
                            SanType::Uri
                        } else {
                            SanType::Dns
                        };
                        [SubjectAltNameMatcher {
                            san_type: t as i32,
                            matcher: Some(exact(n)),
                            ..Default::default()
                        }]
                    })
                    .collect(),
                ..Default::default()
            },
        ));
        ctx.require_client_certificate = Some(BoolValue { value: !v.optional });
    }
}
