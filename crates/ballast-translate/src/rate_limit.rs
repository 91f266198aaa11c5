//! `RateLimitPolicy` → Envoy's `envoy.filters.http.local_ratelimit` (token buckets in Envoy) and
//! `envoy.filters.http.ratelimit` (a rate-limit service over gRPC).
//!
//! Both filters take their descriptor actions (`rate_limits`) in their own config, so nothing
//! else of the route or virtual host changes:
//! - a policy on a **Gateway** is the filters' connection-manager-level config: one set of
//!   buckets per listener port, shared by every route without a policy of its own;
//! - a policy on an **HTTPRoute** is the route's `typed_per_filter_config` (its own buckets),
//!   which replaces the Gateway's; a filter the route's policy does not configure is disabled on
//!   the route, so the more specific policy applies as a whole.
//!
//! Each rule becomes one descriptor: `generic_key` = the rule's name (default
//! `{ns}/{policy}/{index}`) followed by one entry per client selector (`Distinct` header: the
//! header's value; `Exact` header: the header name with the value; `sourceCIDR: Distinct`:
//! `remote_address`). Local buckets of `Distinct` entries are wildcard descriptors: Envoy keeps
//! one bucket per distinct value (up to `max_dynamic_descriptors` per rule, LRU).
//!
//! The filters are in a connection manager only when some policy applies on its Gateway, so
//! configs without RateLimitPolicies translate exactly as before.

use ballast_model::{
    ConfigSet, Gateway, HttpRoute, ObjectKey, RateLimitPolicy, RateLimitRule, SelectorType,
    TargetKind,
};
use envoy_types::pb::envoy::config::core::v3::grpc_service::{EnvoyGrpc, TargetSpecifier};
use envoy_types::pb::envoy::config::core::v3::{ApiVersion, GrpcService, RuntimeFractionalPercent};
use envoy_types::pb::envoy::config::ratelimit::v3::RateLimitServiceConfig;
use envoy_types::pb::envoy::config::route::v3::header_matcher::HeaderMatchSpecifier;
use envoy_types::pb::envoy::config::route::v3::rate_limit::action::{
    ActionSpecifier, GenericKey, HeaderValueMatch, RemoteAddress, RequestHeaders,
};
use envoy_types::pb::envoy::config::route::v3::rate_limit::Action;
use envoy_types::pb::envoy::config::route::v3::{FilterConfig, HeaderMatcher, RateLimit};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    LocalRateLimitDescriptor, XRateLimitHeadersRfcVersion, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::extensions::filters::http::local_ratelimit::v3::LocalRateLimit;
use envoy_types::pb::envoy::extensions::filters::http::ratelimit::v3::{
    RateLimit as GlobalFilter, RateLimitPerRoute, rate_limit::XRateLimitHeadersRfcVersion as GlobalHeaders,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpFilterConfig;
use envoy_types::pb::envoy::r#type::matcher::v3::StringMatcher;
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::envoy::r#type::v3::fractional_percent::DenominatorType;
use envoy_types::pb::envoy::r#type::v3::{FractionalPercent, TokenBucket};
use envoy_types::pb::google::protobuf::{Any, BoolValue, UInt32Value};
use envoy_types::util::pack_any;
use std::sync::Arc;

use crate::{names, pb_duration};

/// Filter names, also the `typed_per_filter_config` keys.
pub(crate) const LOCAL_FILTER: &str = "envoy.filters.http.local_ratelimit";
pub(crate) const GLOBAL_FILTER: &str = "envoy.filters.http.ratelimit";
/// Stat prefix of the local filter (`<prefix>.http_local_rate_limit.rate_limited`).
const LOCAL_STAT_PREFIX: &str = "ballast_local_rate_limit";
/// Distinct values kept per wildcard rule (Envoy's default is 20).
const MAX_DYNAMIC_DESCRIPTORS: u32 = 10_000;

/// The RateLimitPolicy naming HTTPRoute `route` that applies to it (the oldest), if any.
pub(crate) fn route_policy(config: &ConfigSet, route: &HttpRoute) -> Option<Arc<RateLimitPolicy>> {
    config
        .rate_limit_policy_for(TargetKind::HttpRoute, &route.key())
        .cloned()
}

/// The `typed_per_filter_config` entries of a route with policy `p`.
pub(crate) fn route_filter_configs(config: &ConfigSet, p: &RateLimitPolicy) -> Vec<(String, Any)> {
    let key = p.key();
    let disabled = || {
        pack_any(FilterConfig {
            config: None,
            is_optional: true,
            disabled: true,
        })
    };
    let local = match &p.spec.local {
        Some(l) => pack_any(local_config(&key, &l.rules)),
        None => disabled(),
    };
    let global = match &p.spec.global {
        Some(g) if config.rate_limit_service_problem(p).is_ok() => pack_any(RateLimitPerRoute {
            rate_limits: g
                .rules
                .iter()
                .enumerate()
                .map(|(i, r)| descriptor_actions(&key, i, r))
                .collect(),
            domain: g.domain().to_owned(),
            ..Default::default()
        }),
        _ => disabled(),
    };
    vec![
        (LOCAL_FILTER.to_owned(), local),
        (GLOBAL_FILTER.to_owned(), global),
    ]
}

/// The policies in effect on Gateway `gw`: its own, and those of routes naming it.
fn policies_on(
    config: &ConfigSet,
    gw: &Gateway,
) -> (Option<Arc<RateLimitPolicy>>, Vec<Arc<RateLimitPolicy>>) {
    config.rate_limit_policies_on(&gw.key())
}

/// The Backend whose cluster Gateway `gw` needs as its rate-limit service (one: the
/// connection manager has one global filter); only a usable one (existing, gRPC). A service
/// Backend appearing or changing rebuilds the Gateways its policies reach (the translator's
/// Backend rule), so it need not be in the index before.
pub(crate) fn service_backend(config: &ConfigSet, gw: &Gateway) -> Option<ObjectKey> {
    service_policy(config, gw).map(|p| {
        p.spec
            .global
            .as_ref()
            .expect("service policies have global")
            .backend_key(&p.metadata.namespace)
    })
}

/// The policy whose `global` service settings the Gateway's global filter uses.
fn service_policy(config: &ConfigSet, gw: &Gateway) -> Option<Arc<RateLimitPolicy>> {
    config.rate_limit_service_policy(&gw.key())
}

/// The rate-limit filters (before the router) of a connection manager of Gateway `gw`; none
/// when no policy applies there.
pub(crate) fn http_filters(config: &ConfigSet, gw: &Gateway) -> Vec<HttpFilter> {
    if config.rate_limit_policies.is_empty() {
        return Vec::new();
    }
    let (own, routes) = policies_on(config, gw);
    let mut out = Vec::new();
    let any_local = own.iter().chain(&routes).any(|p| p.spec.local.is_some());
    if any_local {
        let cfg = match own
            .as_ref()
            .and_then(|p| Some((p.key(), p.spec.local.as_ref()?)))
        {
            Some((key, l)) => local_config(&key, &l.rules),
            // Present for the routes' own configs; without a token bucket it does nothing.
            None => LocalRateLimit {
                stat_prefix: LOCAL_STAT_PREFIX.into(),
                ..Default::default()
            },
        };
        out.push(HttpFilter {
            name: LOCAL_FILTER.into(),
            config_type: Some(HttpFilterConfig::TypedConfig(pack_any(cfg))),
            ..Default::default()
        });
    }
    if let Some(svc) = service_policy(config, gw) {
        let g = svc
            .spec
            .global
            .as_ref()
            .expect("service policies have global");
        let service = g.backend_key(&svc.metadata.namespace);
        // The Gateway's own rules apply on routes without a policy; a route policy's rules
        // come with the route.
        let rate_limits = own
            .as_ref()
            .filter(|p| config.rate_limit_service_problem(p).is_ok())
            .and_then(|p| Some((p.key(), p.spec.global.as_ref()?)))
            .map(|(key, og)| {
                og.rules
                    .iter()
                    .enumerate()
                    .map(|(i, r)| descriptor_actions(&key, i, r))
                    .collect()
            })
            .unwrap_or_default();
        let cfg = GlobalFilter {
            domain: g.domain().to_owned(),
            failure_mode_deny: g.failure_mode_deny,
            timeout: g.timeout.as_ref().map(|t| pb_duration(t.value)),
            rate_limit_service: Some(RateLimitServiceConfig {
                grpc_service: Some(GrpcService {
                    target_specifier: Some(TargetSpecifier::EnvoyGrpc(EnvoyGrpc {
                        cluster_name: names::cluster(&service),
                        // The default `:authority` is the cluster name, whose `/` HTTP/2
                        // servers (hyper, Go) reject as malformed: every call would fail.
                        authority: format!("{}.{}", service.name, service.namespace),
                        ..Default::default()
                    })),
                    ..Default::default()
                }),
                transport_api_version: ApiVersion::V3 as i32,
            }),
            rate_limits,
            enable_x_ratelimit_headers: GlobalHeaders::DraftVersion03 as i32,
            ..Default::default()
        };
        out.push(HttpFilter {
            name: GLOBAL_FILTER.into(),
            config_type: Some(HttpFilterConfig::TypedConfig(pack_any(cfg))),
            ..Default::default()
        });
    }
    out
}

/// One local filter config (connection manager or route level) enforcing `rules`.
fn local_config(policy: &ObjectKey, rules: &[RateLimitRule]) -> LocalRateLimit {
    let hundred = |key: &str| RuntimeFractionalPercent {
        default_value: Some(FractionalPercent {
            numerator: 100,
            denominator: DenominatorType::Hundred as i32,
        }),
        runtime_key: key.into(),
    };
    LocalRateLimit {
        stat_prefix: LOCAL_STAT_PREFIX.into(),
        // Requests no rule counts are never limited: the default bucket is never empty and is
        // not consumed when a rule's descriptor matches.
        token_bucket: Some(TokenBucket {
            max_tokens: u32::MAX,
            tokens_per_fill: Some(UInt32Value { value: u32::MAX }),
            fill_interval: Some(pb_duration(std::time::Duration::from_secs(1))),
        }),
        always_consume_default_token_bucket: Some(BoolValue { value: false }),
        filter_enabled: Some(hundred("ballast.local_rate_limit.enabled")),
        filter_enforced: Some(hundred("ballast.local_rate_limit.enforced")),
        enable_x_ratelimit_headers: XRateLimitHeadersRfcVersion::DraftVersion03 as i32,
        rate_limits: rules
            .iter()
            .enumerate()
            .map(|(i, r)| descriptor_actions(policy, i, r))
            .collect(),
        descriptors: rules
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let limit = r
                    .limit
                    .as_ref()
                    .expect("validated: local rules have a limit");
                LocalRateLimitDescriptor {
                    entries: descriptor_entries(policy, i, r),
                    token_bucket: Some(TokenBucket {
                        max_tokens: limit.requests.value,
                        tokens_per_fill: Some(UInt32Value {
                            value: limit.requests.value,
                        }),
                        fill_interval: Some(pb_duration(limit.unit.duration())),
                    }),
                    ..Default::default()
                }
            })
            .collect(),
        max_dynamic_descriptors: Some(UInt32Value {
            value: MAX_DYNAMIC_DESCRIPTORS,
        }),
        ..Default::default()
    }
}

/// The actions producing rule `index`'s descriptor.
fn descriptor_actions(policy: &ObjectKey, index: usize, rule: &RateLimitRule) -> RateLimit {
    let mut actions = vec![ActionSpecifier::GenericKey(GenericKey {
        descriptor_value: rule.descriptor_value(policy, index),
        ..Default::default()
    })];
    for s in &rule.client_selectors {
        for h in &s.headers {
            let name = h.name.to_ascii_lowercase();
            actions.push(match (h.type_, &h.value) {
                (SelectorType::Exact, Some(v)) => {
                    ActionSpecifier::HeaderValueMatch(HeaderValueMatch {
                        descriptor_key: name.clone(),
                        descriptor_value: v.value.clone(),
                        expect_match: Some(BoolValue { value: true }),
                        headers: vec![HeaderMatcher {
                            name,
                            header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(
                                StringMatcher {
                                    match_pattern: Some(MatchPattern::Exact(v.value.clone())),
                                    ..Default::default()
                                },
                            )),
                            ..Default::default()
                        }],
                        ..Default::default()
                    })
                }
                _ => ActionSpecifier::RequestHeaders(RequestHeaders {
                    header_name: name.clone(),
                    descriptor_key: name,
                    skip_if_absent: false,
                }),
            });
        }
        if s.source_cidr.is_some() {
            actions.push(ActionSpecifier::RemoteAddress(RemoteAddress::default()));
        }
    }
    RateLimit {
        actions: actions
            .into_iter()
            .map(|a| Action {
                action_specifier: Some(a),
            })
            .collect(),
        ..Default::default()
    }
}

/// The local descriptor [`descriptor_actions`] produces (`Distinct` values as wildcards).
fn descriptor_entries(policy: &ObjectKey, index: usize, rule: &RateLimitRule) -> Vec<Entry> {
    let mut out = vec![Entry {
        key: "generic_key".into(),
        value: rule.descriptor_value(policy, index),
    }];
    for s in &rule.client_selectors {
        for h in &s.headers {
            out.push(Entry {
                key: h.name.to_ascii_lowercase(),
                value: match (h.type_, &h.value) {
                    (SelectorType::Exact, Some(v)) => v.value.clone(),
                    _ => String::new(),
                },
            });
        }
        if s.source_cidr.is_some() {
            out.push(Entry {
                key: "remote_address".into(),
                value: String::new(),
            });
        }
    }
    out
}

/// Whether any RateLimitPolicy names HTTPRoute `route` (such a route's edits rebuild its
/// Gateways: the connection manager's filters may change).
pub(crate) fn targets_route(config: &ConfigSet, route: &ObjectKey) -> bool {
    config
        .rate_limit_policy_for(TargetKind::HttpRoute, route)
        .is_some()
}

/// Whether Backend `backend` is the rate-limit service of any policy (its protocol decides
/// whether the service is usable, so its edits rebuild rather than patch).
pub(crate) fn is_service(config: &ConfigSet, backend: &ObjectKey) -> bool {
    config.rate_limit_policies.values().any(|p| {
        p.spec
            .global
            .as_ref()
            .is_some_and(|g| g.backend_key(&p.metadata.namespace) == *backend)
    })
}

/// Gateways a version of a RateLimitPolicy can affect: those it names, and those of the
/// routes it names.
pub(crate) fn affected_gateways(config: &ConfigSet, p: &RateLimitPolicy) -> Vec<ObjectKey> {
    let ns = p.metadata.namespace.as_str();
    let mut out = Vec::new();
    for r in &p.spec.target_refs {
        let key = ObjectKey::new(ns, r.name.as_str());
        match r.target_kind() {
            Some(TargetKind::Gateway) => out.push(key),
            Some(TargetKind::HttpRoute) => {
                if let Some(route) = config.http_routes.get(&key) {
                    let rns = route.metadata.namespace.as_str();
                    out.extend(
                        route
                            .spec
                            .parent_refs
                            .iter()
                            .filter(|p| p.is_gateway())
                            .map(|p| ObjectKey::new(p.namespace_or(rns), p.name.as_str())),
                    );
                }
            }
            _ => {}
        }
    }
    out
}
