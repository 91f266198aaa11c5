//! OpenTelemetry tracing from a ClientPolicy's `tracing`: the connection manager's `tracing`
//! with `envoy.tracers.opentelemetry`, exporting OTLP (gRPC or HTTP) to the cluster of a
//! collector Backend, and the set of such Backends a Gateway needs as clusters.
//!
//! The HCM depends only on whether the Backend exists (a Backend added or removed rebuilds its
//! Gateways, see `Translator`), never on its other fields, so a Backend edit that only patches
//! clusters cannot leave a stale tracer behind.

use std::collections::BTreeSet;

use ballast_model::{ClientPolicy, ConfigSet, ObjectKey, OtlpProtocol};
use envoy_types::pb::envoy::config::core::v3::grpc_service::{EnvoyGrpc, TargetSpecifier};
use envoy_types::pb::envoy::config::core::v3::http_uri::HttpUpstreamType;
use envoy_types::pb::envoy::config::core::v3::{GrpcService, HttpService, HttpUri};
use envoy_types::pb::envoy::config::trace::v3::OpenTelemetryConfig;
use envoy_types::pb::envoy::config::trace::v3::tracing::Http as TracingProvider;
use envoy_types::pb::envoy::config::trace::v3::tracing::http::ConfigType as ProviderConfig;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing;
use envoy_types::pb::envoy::r#type::v3::Percent;
use envoy_types::util::pack_any;

use crate::listener::plan;
use crate::{names, pb_duration};

/// Envoy's name of the OpenTelemetry tracer.
pub(crate) const TRACER: &str = "envoy.tracers.opentelemetry";
/// How long one OTLP export may take before Envoy gives up on it.
const EXPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// OTLP/HTTP's standard traces path.
const DEFAULT_PATH: &str = "/v1/traces";

/// The collector Backend a policy's `tracing` names.
pub(crate) fn backend_of(p: &ClientPolicy) -> Option<ObjectKey> {
    let t = p.spec.tracing.as_ref()?;
    Some(ObjectKey::new(
        p.metadata.namespace.as_str(),
        t.backend_ref.name.as_str(),
    ))
}

/// The HCM `tracing` for policy `p` on Gateway `gateway`; `None` without `tracing`, or while
/// the collector Backend does not exist (its cluster would not either, and Envoy would reject
/// a tracer naming an unknown cluster).
pub(crate) fn hcm_tracing(
    config: &ConfigSet,
    gateway: &ObjectKey,
    p: &ClientPolicy,
) -> Option<Tracing> {
    let t = p.spec.tracing.as_ref()?;
    let backend = backend_of(p)?;
    config.backend(&backend)?;
    let cluster = names::cluster(&backend);
    let mut otel = OpenTelemetryConfig {
        service_name: t
            .service_name
            .as_ref()
            .map(|n| n.value.clone())
            .unwrap_or_else(|| gateway.name.to_string()),
        ..Default::default()
    };
    match t.protocol.as_ref().map(|p| p.value).unwrap_or_default() {
        OtlpProtocol::Grpc => {
            otel.grpc_service = Some(GrpcService {
                target_specifier: Some(TargetSpecifier::EnvoyGrpc(EnvoyGrpc {
                    cluster_name: cluster,
                    // The default, the cluster name `ns/name`, is not a valid `:authority`
                    // (HTTP/2 servers reset such streams).
                    authority: backend.name.to_string(),
                    ..Default::default()
                })),
                timeout: Some(pb_duration(EXPORT_TIMEOUT)),
                ..Default::default()
            });
        }
        OtlpProtocol::Http => {
            let path = t.path.as_ref().map(|p| p.as_str()).unwrap_or(DEFAULT_PATH);
            otel.http_service = Some(HttpService {
                http_uri: Some(HttpUri {
                    // The authority is the Backend's name; the cluster decides where it goes.
                    uri: format!("http://{}{path}", backend.name),
                    timeout: Some(pb_duration(EXPORT_TIMEOUT)),
                    http_upstream_type: Some(HttpUpstreamType::Cluster(cluster)),
                }),
                ..Default::default()
            });
        }
    }
    Some(Tracing {
        random_sampling: Some(Percent {
            value: f64::from(t.sampling_rate.as_ref().map(|r| r.value).unwrap_or(100)),
        }),
        provider: Some(TracingProvider {
            name: TRACER.into(),
            config_type: Some(ProviderConfig::TypedConfig(pack_any(otel))),
        }),
        ..Default::default()
    })
}

/// The collector Backends Gateway `key`'s connection managers export to (each filter chain's
/// policy is its first listener's, as in `listener::envoy_listener`): they are clusters of the
/// Gateway even when no route sends traffic there. Missing ones are listed too: the Gateway
/// depends on them, so their creation rebuilds it.
pub(crate) fn tracing_backends(config: &ConfigSet, key: &ObjectKey) -> BTreeSet<ObjectKey> {
    let Some(gw) = config.gateways.get(key) else {
        return BTreeSet::new();
    };
    plan(config, gw)
        .iter()
        .flat_map(|port| &port.chains)
        .filter_map(|c| config.client_policy_for(key, &c.listeners[0].name))
        .filter_map(|p| backend_of(p))
        .collect()
}
