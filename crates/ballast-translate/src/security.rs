//! SecurityPolicy → Envoy `envoy.filters.http.rbac` (client IP allow/deny),
//! `envoy.filters.http.jwt_authn` (JWT authentication) and `envoy.filters.http.ext_authz`
//! (external authorization over HTTP or gRPC).
//!
//! The connection managers of a Gateway with any SecurityPolicy (naming the Gateway, or an
//! HTTPRoute naming the Gateway) carry both filters, configured to do nothing by default: RBAC
//! without rules, jwt_authn with every provider and requirement but no rules. The policies
//! act through `typed_per_filter_config`, where Envoy uses the most specific entry:
//!
//! - a Gateway or listener policy on every virtual host of that listener;
//! - an HTTPRoute or rule policy on the Envoy routes of that route or rule (shared by every
//!   Gateway the route attaches to, so it never depends on the Gateway).
//!
//! Each policy sets every filter, so the applying policy acts as a whole: one without `jwt`
//! turns JWT off there (`disabled`), one without `authorization` turns RBAC off, one without
//! `extAuth` turns ext_authz off. ext_authz (present only when some policy uses it) is
//! disabled by default and each enabling entry names its policy's service
//! (`service_override`, HTTP or gRPC), so policies with different services share one filter.
//! Envoy's failure mode (`failure_mode_allow`) exists only on the filter, and Envoy 1.40 fails
//! every check of an HTTP `service_override` on a filter configured with a gRPC service (seen
//! in `ext_auth_grpc_and_fail_open`), so a Gateway has one ext_authz filter per service type
//! and failure mode its policies use ([`EXT_AUTHZ_FILTERS`]); a policy enables its own and
//! disables the others (so a less specific policy's filter never runs as well).
//!
//! The client address RBAC matches is `remote_ip`: the address the connection manager
//! detected. Connection managers with these filters always set `use_remote_address`, so it
//! is the peer address unless the ClientPolicy's `clientIPDetection.xForwardedFor` trusts
//! hops, and a client can never pick its address by sending `X-Forwarded-For` itself.
//!
//! prost encodes `map` fields in `HashMap` order, which differs between processes; the
//! messages here with maps of more than one entry are encoded by hand in key order so that
//! translation stays deterministic.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ballast_model::{
    Authorization, AuthorizationAction, AuthorizationRule, Cidr, ConfigSet, JwtClaimValueType,
    Listener, ObjectKey, SecurityPolicy, TargetKind,
};
use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
use envoy_types::pb::envoy::config::core::v3::http_uri::HttpUpstreamType;
use envoy_types::pb::envoy::config::core::v3::grpc_service::{EnvoyGrpc, TargetSpecifier};
use envoy_types::pb::envoy::config::core::v3::{CidrRange, DataSource, GrpcService, HttpUri};
use envoy_types::pb::envoy::config::rbac::v3::permission::Rule;
use envoy_types::pb::envoy::config::rbac::v3::principal::{Identifier, Set};
use envoy_types::pb::envoy::config::rbac::v3::rbac::Action as RbacAction;
use envoy_types::pb::envoy::config::rbac::v3::{
    MetadataSource, Permission, Policy, Principal, Rbac as RbacRules, SourcedMetadata,
};
use envoy_types::pb::envoy::r#type::matcher::v3::list_matcher::MatchPattern as ListPattern;
use envoy_types::pb::envoy::r#type::matcher::v3::metadata_matcher::PathSegment;
use envoy_types::pb::envoy::r#type::matcher::v3::metadata_matcher::path_segment::Segment;
use envoy_types::pb::envoy::r#type::matcher::v3::value_matcher::MatchPattern as ValuePattern;
use envoy_types::pb::envoy::r#type::matcher::v3::{ListMatcher, MetadataMatcher, ValueMatcher};
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::jwt_provider::JwksSourceSpecifier;
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::jwt_requirement::RequiresType;
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::per_route_config::RequirementSpecifier;
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::jwt_provider::NormalizePayload;
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::{
    JwksAsyncFetch, JwtAuthentication, JwtClaimToHeader, JwtHeader, JwtProvider, JwtRequirement,
    JwtRequirementOrList, PerRouteConfig, RemoteJwks,
};
use envoy_types::pb::envoy::config::core::v3::ApiVersion;
use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::check_settings::ServiceOverride;
use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::ext_authz::Services;
use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::ext_authz_per_route::Override;
use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::{
    AuthorizationResponse, CheckSettings, ExtAuthz, ExtAuthzPerRoute, HttpService,
};
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::{Rbac, RbacPerRoute};
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::envoy::r#type::matcher::v3::{ListStringMatcher, StringMatcher};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpFilterConfig;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter,
};
use envoy_types::pb::google::protobuf::{Any, BoolValue, UInt32Value};
use envoy_types::util::pack_any;
use prost::Name;

use crate::{names, pb_duration};

pub(crate) const RBAC_FILTER: &str = "envoy.filters.http.rbac";
pub(crate) const JWT_FILTER: &str = "envoy.filters.http.jwt_authn";
pub(crate) const EXT_AUTHZ_FILTER: &str = "envoy.filters.http.ext_authz";
/// The ext_authz filters by (gRPC, fail open), in filter-chain order (see the module docs).
/// HTTP failing closed keeps the plain name.
pub(crate) const EXT_AUTHZ_FILTERS: [(&str, bool, bool); 4] = [
    (EXT_AUTHZ_FILTER, false, false),
    ("envoy.filters.http.ext_authz/grpc", true, false),
    ("envoy.filters.http.ext_authz/fail-open", false, true),
    ("envoy.filters.http.ext_authz/grpc-fail-open", true, true),
];

/// How long Envoy waits for the authorization service's answer (then: the failure mode).
const CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Used for a provider whose JWKS does not resolve: no token verifies (fail closed). Envoy
/// rejects a JWKS without a valid key, so this is a real P-256 public key whose private key
/// was never stored (generated by `openssl ecparam` into a pipe), with a key id no issuer uses.
const NO_KEYS_JWKS: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","alg":"ES256","kid":"ballast-unresolved-jwks","x":"GrmKoLISinHtgZRMslA42Z2S4MTNYpi3Z8dRvmywZ9I","y":"lU0Hcj5rL6i0C6hoxxT8L1hdF6W-1cgZBJe9vOk6qXw"}]}"#;

/// The SecurityPolicies whose filters and providers the connection managers of Gateway `gw`
/// carry: those naming the Gateway, or an HTTPRoute whose parentRefs name it.
pub(crate) fn gateway_policies<'a>(
    config: &'a ConfigSet,
    gw: &ObjectKey,
) -> Vec<&'a Arc<SecurityPolicy>> {
    config
        .security_policies
        .values()
        .filter(|p| policy_gateways(config, p).contains(gw))
        .collect()
}

/// Gateways whose translation a SecurityPolicy (this version, in `config`) affects.
pub(crate) fn policy_gateways(config: &ConfigSet, p: &SecurityPolicy) -> BTreeSet<ObjectKey> {
    let ns = p.metadata.namespace.as_str();
    let mut out = BTreeSet::new();
    for r in &p.spec.target_refs {
        let key = ObjectKey::new(ns, r.name.as_str());
        match r.target_kind() {
            Some(TargetKind::Gateway) => {
                out.insert(key);
            }
            Some(TargetKind::HttpRoute) => {
                if let Some(route) = config.http_routes.get(&key) {
                    // The Gateways its parentRefs name (as `names_gateway`), without a scan
                    // of every Gateway. The route is in the policy's namespace.
                    out.extend(
                        route
                            .spec
                            .parent_refs
                            .iter()
                            .filter(|p| p.is_gateway())
                            .map(|p| ObjectKey::new(p.namespace_or(ns), p.name.as_str()))
                            .filter(|g| config.gateways.contains_key(g)),
                    );
                }
            }
            _ => {}
        }
    }
    out
}

/// Backends the SecurityPolicies of Gateway `gw` name (remote JWKS, extAuth): the Gateway needs their
/// clusters, and depends on them like on its routes' Backends.
pub(crate) fn policy_backends(config: &ConfigSet, gw: &ObjectKey) -> BTreeSet<ObjectKey> {
    if config.security_policies.is_empty() {
        return BTreeSet::new();
    }
    gateway_policies(config, gw)
        .into_iter()
        .flat_map(|p| {
            p.spec
                .jwt
                .iter()
                .flat_map(|j| &j.providers)
                .filter_map(|pr| pr.remote_jwks.as_ref())
                .flat_map(|r| &r.backend_refs)
                .chain(p.spec.ext_auth.iter().flat_map(|e| e.backend_refs()))
                .map(|b| ObjectKey::new(p.metadata.namespace.as_str(), b.name.as_str()))
        })
        .collect()
}

/// Whether any SecurityPolicy names HTTPRoute `route`.
pub(crate) fn route_targeted(config: &ConfigSet, route: &ObjectKey) -> bool {
    config.security_policies.values().any(|p| {
        p.metadata.namespace == route.namespace
            && p.spec
                .target_refs
                .iter()
                .any(|r| r.target_kind() == Some(TargetKind::HttpRoute) && *r.name == route.name)
    })
}

/// Gateways using ConfigMap `key` as a JWKS.
pub(crate) fn gateways_using_config_map(config: &ConfigSet, key: &ObjectKey) -> Vec<ObjectKey> {
    config
        .security_policies
        .values()
        .filter(|p| {
            p.metadata.namespace == key.namespace
                && p.spec.jwt.iter().flat_map(|j| &j.providers).any(|pr| {
                    pr.local_jwks
                        .as_ref()
                        .and_then(|l| l.value_ref.as_ref())
                        .is_some_and(|r| *r.name == key.name)
                })
        })
        .flat_map(|p| policy_gateways(config, p))
        .collect()
}

fn requirement_name(p: &SecurityPolicy) -> String {
    format!("{}/{}", p.metadata.namespace, p.metadata.name)
}

fn provider_name(p: &SecurityPolicy, provider: &str) -> String {
    format!("{}/{}/{}", p.metadata.namespace, p.metadata.name, provider)
}

/// Adds the RBAC and jwt_authn filters (before the router) for `policies`, and makes the
/// connection manager detect the client address itself (see the module docs).
pub(crate) fn apply_hcm(
    hcm: &mut HttpConnectionManager,
    config: &ConfigSet,
    policies: &[&Arc<SecurityPolicy>],
) {
    if policies.is_empty() {
        return;
    }
    if hcm.use_remote_address.is_none() {
        hcm.use_remote_address = Some(BoolValue { value: true });
    }
    let local = |text: String| {
        JwksSourceSpecifier::LocalJwks(DataSource {
            specifier: Some(Specifier::InlineString(text)),
            ..Default::default()
        })
    };
    let mut providers: BTreeMap<String, JwtProvider> = BTreeMap::new();
    let mut requirements: BTreeMap<String, JwtRequirement> = BTreeMap::new();
    for p in policies {
        let Some(jwt) = &p.spec.jwt else { continue };
        let mut names = Vec::new();
        // Providers that rules of this policy authorize by, and whether by scopes.
        let mut authorized: BTreeMap<&str, bool> = BTreeMap::new();
        for j in p
            .spec
            .authorization
            .iter()
            .flat_map(|a| &a.rules)
            .filter_map(|r| r.principal.jwt.as_ref())
        {
            *authorized.entry(j.provider.as_str()).or_default() |= !j.scopes.is_empty();
        }
        for pr in &jwt.providers {
            let name = provider_name(p, &pr.name);
            let extract = &pr.extract_from;
            let resolved = config.security_jwks(p, pr);
            let source = match (&pr.remote_jwks, resolved) {
                (Some(r), Ok(_)) => JwksSourceSpecifier::RemoteJwks(RemoteJwks {
                    http_uri: Some(HttpUri {
                        uri: r.uri.value.clone(),
                        http_upstream_type: r.backend_refs.first().map(|b| {
                            HttpUpstreamType::Cluster(names::cluster(&ObjectKey::new(
                                p.metadata.namespace.as_str(),
                                b.name.as_str(),
                            )))
                        }),
                        timeout: Some(pb_duration(std::time::Duration::from_secs(5))),
                    }),
                    cache_duration: r.cache_duration.as_ref().map(|d| pb_duration(d.value)),
                    // Fetch when the listener starts (it waits for the keys, bounded by the
                    // timeout), not on the first request; retry failed fetches.
                    async_fetch: Some(JwksAsyncFetch {
                        failed_refetch_duration: Some(pb_duration(std::time::Duration::from_secs(
                            1,
                        ))),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                (None, Ok(text)) => local(text),
                (_, Err(_)) => local(NO_KEYS_JWKS.to_owned()),
            };
            providers.insert(
                name.clone(),
                JwtProvider {
                    issuer: pr
                        .issuer
                        .as_ref()
                        .map(|i| i.value.clone())
                        .unwrap_or_default(),
                    audiences: pr.audiences.iter().map(|a| a.value.clone()).collect(),
                    jwks_source_specifier: Some(source),
                    claim_to_headers: pr
                        .claim_to_headers
                        .iter()
                        .map(|c| JwtClaimToHeader {
                            header_name: c.header.value.clone(),
                            claim_name: c.claim.value.clone(),
                            ..Default::default()
                        })
                        .collect(),
                    from_headers: extract
                        .iter()
                        .flat_map(|x| &x.headers)
                        .map(|h| JwtHeader {
                            name: h.name.to_ascii_lowercase(),
                            value_prefix: h
                                .value_prefix
                                .as_ref()
                                .map(|v| v.value.clone())
                                .unwrap_or_default(),
                        })
                        .collect(),
                    from_cookies: extract
                        .iter()
                        .flat_map(|x| &x.cookies)
                        .map(|c| c.value.clone())
                        .collect(),
                    from_params: extract
                        .iter()
                        .flat_map(|x| &x.params)
                        .map(|c| c.value.clone())
                        .collect(),
                    // Only providers whose claims a rule of the policy matches.
                    payload_in_metadata: match authorized.get(pr.name.as_str()) {
                        Some(_) => name.clone(),
                        None => String::new(),
                    },
                    normalize_payload_in_metadata: (authorized.get(pr.name.as_str())
                        == Some(&true))
                    .then(|| NormalizePayload {
                        space_delimited_claims: vec!["scope".to_owned()],
                    }),
                    ..Default::default()
                },
            );
            names.push(name);
        }
        let requirement = if names.len() == 1 && !jwt.optional {
            JwtRequirement {
                requires_type: Some(RequiresType::ProviderName(names.remove(0))),
            }
        } else {
            JwtRequirement {
                requires_type: Some(RequiresType::RequiresAny(JwtRequirementOrList {
                    // Optional: no token passes, a token no provider accepts still fails.
                    requirements: names
                        .into_iter()
                        .map(RequiresType::ProviderName)
                        .chain(
                            jwt.optional
                                .then(|| RequiresType::AllowMissing(Default::default())),
                        )
                        .map(|r| JwtRequirement {
                            requires_type: Some(r),
                        })
                        .collect(),
                })),
            }
        };
        requirements.insert(requirement_name(p), requirement);
    }
    let mut jwt = Vec::new();
    use prost::encoding::{btree_map, message, string};
    btree_map::encode(
        string::encode,
        string::encoded_len,
        message::encode,
        message::encoded_len,
        1,
        &providers,
        &mut jwt,
    );
    btree_map::encode(
        string::encode,
        string::encoded_len,
        message::encode,
        message::encoded_len,
        5,
        &requirements,
        &mut jwt,
    );
    // Authentication before authorization (as Envoy Gateway orders them): RBAC rules match
    // the payloads jwt_authn verified.
    let mut filters = vec![
        (
            JWT_FILTER,
            Any {
                type_url: JwtAuthentication::type_url(),
                value: jwt,
            },
            false,
        ),
        (RBAC_FILTER, pack_any(Rbac::default()), false),
    ];
    // ext_authz is off unless a virtual host or route enables it with its policy's service
    // (`service_override`); the filter-level service is only a valid placeholder. One filter
    // per service type and failure mode in use.
    for (name, grpc, fail_open) in EXT_AUTHZ_FILTERS {
        let of_kind: Vec<&Arc<SecurityPolicy>> = policies
            .iter()
            .copied()
            .filter(|p| {
                p.spec
                    .ext_auth
                    .as_ref()
                    .is_some_and(|e| e.grpc.is_some() == grpc && e.fail_open == fail_open)
            })
            .collect();
        let Some(first) = of_kind.first() else {
            continue;
        };
        let headers: BTreeSet<String> = of_kind
            .iter()
            .flat_map(|p| p.spec.ext_auth.iter().flat_map(|e| &e.headers_to_ext_auth))
            .map(|h| h.value.to_ascii_lowercase())
            .collect();
        let cfg = ExtAuthz {
            services: Some(match service(first) {
                ServiceOverride::HttpService(h) => Services::HttpService(h),
                ServiceOverride::GrpcService(g) => Services::GrpcService(g),
            }),
            transport_api_version: ApiVersion::V3 as i32,
            allowed_headers: (!headers.is_empty()).then(|| exact_list(headers)),
            failure_mode_allow: fail_open,
            // Tells the backend that nobody authorized this request.
            failure_mode_allow_header_add: fail_open,
            ..Default::default()
        };
        filters.push((name, pack_any(cfg), true));
    }
    // Right after CORS (preflights are answered without credentials), before rate limits
    // (a request is identified before it is counted), sessions and the router.
    let at = hcm
        .http_filters
        .iter()
        .position(|f| f.name == "envoy.filters.http.cors")
        .map_or(0, |i| i + 1);
    for (i, (name, cfg, disabled)) in filters.into_iter().enumerate() {
        hcm.http_filters.insert(
            at + i,
            HttpFilter {
                name: name.into(),
                config_type: Some(HttpFilterConfig::TypedConfig(cfg)),
                disabled,
                ..Default::default()
            },
        );
    }
}

fn exact_list(names: impl IntoIterator<Item = String>) -> ListStringMatcher {
    ListStringMatcher {
        patterns: names
            .into_iter()
            .map(|n| StringMatcher {
                match_pattern: Some(MatchPattern::Exact(n)),
                ..Default::default()
            })
            .collect(),
    }
}

/// The Backend of a policy's `extAuth` service (the policy's own key when there is none:
/// validation rules that out).
fn ext_auth_backend(p: &SecurityPolicy) -> ObjectKey {
    p.spec
        .ext_auth
        .iter()
        .flat_map(|e| e.backend_refs())
        .next()
        .map(|b| ObjectKey::new(p.metadata.namespace.as_str(), b.name.as_str()))
        .unwrap_or_else(|| p.key())
}

/// The authorization service of a policy with `extAuth`: HTTP or gRPC to its Backend's
/// cluster.
fn service(p: &SecurityPolicy) -> ServiceOverride {
    let backend = ext_auth_backend(p);
    let http = p.spec.ext_auth.as_ref().and_then(|e| e.http.as_ref());
    let Some(h) = http else {
        return ServiceOverride::GrpcService(GrpcService {
            target_specifier: Some(TargetSpecifier::EnvoyGrpc(EnvoyGrpc {
                cluster_name: names::cluster(&backend),
                // The default, the cluster name `ns/name`, is not a valid `:authority`
                // (HTTP/2 servers reset such streams).
                authority: backend.name.to_string(),
                ..Default::default()
            })),
            timeout: Some(pb_duration(CHECK_TIMEOUT)),
            ..Default::default()
        });
    };
    ServiceOverride::HttpService(HttpService {
        server_uri: Some(HttpUri {
            uri: format!("http://{}.{}", backend.name, backend.namespace),
            http_upstream_type: Some(HttpUpstreamType::Cluster(names::cluster(&backend))),
            timeout: Some(pb_duration(CHECK_TIMEOUT)),
        }),
        path_prefix: h.path.as_ref().map(|p| p.value.clone()).unwrap_or_default(),
        authorization_response: (!h.headers_to_backend.is_empty()).then(|| AuthorizationResponse {
            allowed_upstream_headers: Some(exact_list(
                h.headers_to_backend
                    .iter()
                    .map(|h| h.value.to_ascii_lowercase()),
            )),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The `typed_per_filter_config` entries of `p` (RBAC, jwt_authn, every ext_authz), encoded as
/// field `tag` of the message holding them (13 in `Route`, 15 in `VirtualHost`), in key order.
pub(crate) fn per_filter_config(p: &SecurityPolicy, tag: u32) -> Vec<u8> {
    let rbac = RbacPerRoute {
        rbac: p.spec.authorization.as_ref().map(|a| Rbac {
            rules: Some(rbac_rules(a, |provider| provider_name(p, provider))),
            ..Default::default()
        }),
    };
    let jwt = PerRouteConfig {
        requirement_specifier: Some(match &p.spec.jwt {
            Some(_) => RequirementSpecifier::RequirementName(requirement_name(p)),
            None => RequirementSpecifier::Disabled(true),
        }),
    };
    // Every ext_authz filter: the policy's own (by service type and `failOpen`) checks with its
    // service, the others are off, so none runs for a policy without `extAuth`.
    let mut entries: BTreeMap<String, Any> = EXT_AUTHZ_FILTERS
        .iter()
        .map(|(name, grpc, fail_open)| {
            let own = p
                .spec
                .ext_auth
                .as_ref()
                .is_some_and(|e| e.grpc.is_some() == *grpc && e.fail_open == *fail_open);
            let cfg = ExtAuthzPerRoute {
                r#override: Some(if own {
                    Override::CheckSettings(CheckSettings {
                        service_override: Some(service(p)),
                        ..Default::default()
                    })
                } else {
                    Override::Disabled(true)
                }),
            };
            ((*name).to_owned(), pack_any(cfg))
        })
        .collect();
    entries.extend([
        (JWT_FILTER.to_owned(), pack_any(jwt)),
        (RBAC_FILTER.to_owned(), pack_any(rbac)),
    ]);
    let mut out = Vec::new();
    prost::encoding::btree_map::encode(
        prost::encoding::string::encode,
        prost::encoding::string::encoded_len,
        prost::encoding::message::encode,
        prost::encoding::message::encoded_len,
        tag,
        &entries,
        &mut out,
    );
    out
}

fn principal(id: Identifier) -> Principal {
    Principal {
        identifier: Some(id),
    }
}

fn cidrs(list: &[ballast_model::Spanned<String>]) -> Principal {
    let ids = list
        .iter()
        .filter_map(|c| Cidr::parse(c).ok())
        .map(|c| {
            principal(Identifier::RemoteIp(CidrRange {
                address_prefix: c.address.to_string(),
                prefix_len: Some(UInt32Value {
                    value: c.prefix_len,
                }),
            }))
        })
        .collect();
    principal(Identifier::OrIds(Set { ids }))
}

/// A rule's principal: its addresses and its token's claims, ANDed (each when set).
fn rule_principal(r: &AuthorizationRule, payload_key: &impl Fn(&str) -> String) -> Principal {
    let mut parts = Vec::new();
    if !r.principal.client_cidrs.is_empty() {
        parts.push(cidrs(&r.principal.client_cidrs));
    }
    if let Some(j) = &r.principal.jwt {
        parts.push(jwt_principal(&payload_key(&j.provider), j));
    }
    all_of(parts)
}

fn all_of(mut ids: Vec<Principal>) -> Principal {
    if ids.len() == 1 {
        ids.remove(0)
    } else {
        principal(Identifier::AndIds(Set { ids }))
    }
}

fn any_of(mut ids: Vec<Principal>) -> Principal {
    if ids.len() == 1 {
        ids.remove(0)
    } else {
        principal(Identifier::OrIds(Set { ids }))
    }
}

/// Matches `value` at `path` of the jwt_authn filter's dynamic metadata, where a provider with
/// `payload_in_metadata` puts its verified payload. Absent (no token, another provider's
/// token): no match.
fn payload_matches<'a>(path: impl IntoIterator<Item = &'a str>, value: ValueMatcher) -> Principal {
    principal(Identifier::SourcedMetadata(SourcedMetadata {
        metadata_matcher: Some(MetadataMatcher {
            filter: JWT_FILTER.to_owned(),
            path: path
                .into_iter()
                .map(|k| PathSegment {
                    segment: Some(Segment::Key(k.to_owned())),
                })
                .collect(),
            value: Some(value),
            invert: false,
        }),
        metadata_source: MetadataSource::Dynamic as i32,
    }))
}

fn exact_value(v: &str) -> ValueMatcher {
    ValueMatcher {
        match_pattern: Some(ValuePattern::StringMatch(StringMatcher {
            match_pattern: Some(MatchPattern::Exact(v.to_owned())),
            ..Default::default()
        })),
    }
}

/// A list value with an element equal to `v`.
fn contains_value(v: &str) -> ValueMatcher {
    ValueMatcher {
        match_pattern: Some(ValuePattern::ListMatch(Box::new(ListMatcher {
            match_pattern: Some(ListPattern::OneOf(Box::new(exact_value(v)))),
        }))),
    }
}

/// Every claim (one of its values) and every scope of the payload under `key`. Scopes are
/// list elements because the provider splits `scope` at spaces (`normalize_payload_in_metadata`).
fn jwt_principal(key: &str, j: &ballast_model::JwtPrincipal) -> Principal {
    let mut all = Vec::new();
    for c in &j.claims {
        let alternatives = c
            .values
            .iter()
            .map(|v| {
                let value = match c.value_type() {
                    JwtClaimValueType::String => exact_value(v),
                    JwtClaimValueType::StringArray => contains_value(v),
                };
                payload_matches(std::iter::once(key).chain(c.path()), value)
            })
            .collect();
        all.push(any_of(alternatives));
    }
    for scope in &j.scopes {
        all.push(payload_matches([key, "scope"], contains_value(scope)));
    }
    all_of(all)
}

/// First-match-wins rules as one ALLOW policy: a request is allowed when some Allow rule
/// matches and no Deny rule before it does, or no Deny rule matches and the default allows.
/// (Envoy's RBAC has one action per filter; this keeps rule order without a matcher tree, and
/// one policy keeps the `policies` map to one entry.)
///
/// `payload_key` names the metadata key of a provider's verified payload (its Envoy name).
fn rbac_rules(a: &Authorization, payload_key: impl Fn(&str) -> String) -> RbacRules {
    let mut alternatives = Vec::new();
    let mut denied_before: Vec<Principal> = Vec::new();
    let not_denied = |denied: &[Principal]| {
        principal(Identifier::NotId(Box::new(principal(Identifier::OrIds(
            Set {
                ids: denied.to_vec(),
            },
        )))))
    };
    for r in &a.rules {
        let m = rule_principal(r, &payload_key);
        match r.action.value {
            AuthorizationAction::Deny => denied_before.push(m),
            AuthorizationAction::Allow if denied_before.is_empty() => alternatives.push(m),
            AuthorizationAction::Allow => alternatives.push(principal(Identifier::AndIds(Set {
                ids: vec![m, not_denied(&denied_before)],
            }))),
        }
    }
    if a.default_action() == AuthorizationAction::Allow {
        alternatives.push(if denied_before.is_empty() {
            principal(Identifier::Any(true))
        } else {
            not_denied(&denied_before)
        });
    }
    let mut policies = std::collections::HashMap::new();
    if !alternatives.is_empty() {
        policies.insert(
            "ballast".to_owned(),
            Policy {
                permissions: vec![Permission {
                    rule: Some(Rule::Any(true)),
                }],
                principals: alternatives,
                ..Default::default()
            },
        );
    }
    RbacRules {
        action: RbacAction::Allow as i32,
        policies,
        ..Default::default()
    }
}

/// The policy of the Gateway listener owning virtual host `host` of a filter chain serving
/// `listeners` (the most specific listener matching the host, as routes are placed).
pub(crate) fn host_policy(
    config: &ConfigSet,
    gateway: &ObjectKey,
    listeners: &[&Listener],
    host: &str,
) -> Option<Arc<SecurityPolicy>> {
    if config.security_policies.is_empty() {
        return None;
    }
    let owner = if listeners.len() == 1 {
        Some(listeners[0])
    } else {
        listeners
            .iter()
            .copied()
            .filter(|l| crate::route::listener_matches(l, host))
            .max_by_key(|l| crate::route::specificity(l))
    }?;
    config
        .security_policy_for(TargetKind::Gateway, gateway, Some(&owner.name))
        .cloned()
}

/// Per rule of `route`, the policy applying to its Envoy routes.
pub(crate) fn route_policies(
    config: &ConfigSet,
    route: &ballast_model::HttpRoute,
) -> Vec<Option<Arc<SecurityPolicy>>> {
    if config.security_policies.is_empty() {
        return vec![None; route.spec.rules.len()];
    }
    let key = route.key();
    route
        .spec
        .rules
        .iter()
        .map(|rule| {
            config
                .security_policy_for(
                    TargetKind::HttpRoute,
                    &key,
                    rule.name.as_ref().map(|n| n.as_str()),
                )
                .cloned()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast_model::Spanned;

    fn rule(action: AuthorizationAction, cidr: &str) -> ballast_model::AuthorizationRule {
        ballast_model::AuthorizationRule {
            name: None,
            action: Spanned::unpositioned(action),
            principal: ballast_model::Principal {
                client_cidrs: vec![Spanned::unpositioned(cidr.to_owned())],
                jwt: None,
            },
        }
    }

    /// Evaluates a principal against an IPv4 address (the subset of RBAC used here).
    fn eval(p: &Principal, ip: std::net::Ipv4Addr) -> bool {
        match p.identifier.as_ref().unwrap() {
            Identifier::Any(b) => *b,
            Identifier::OrIds(s) => s.ids.iter().any(|x| eval(x, ip)),
            Identifier::AndIds(s) => s.ids.iter().all(|x| eval(x, ip)),
            Identifier::NotId(x) => !eval(x, ip),
            Identifier::RemoteIp(c) => {
                let net: std::net::Ipv4Addr = c.address_prefix.parse().unwrap();
                let len = c.prefix_len.as_ref().unwrap().value;
                let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
                u32::from(ip) & mask == u32::from(net) & mask
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    fn allowed(a: &Authorization, ip: std::net::Ipv4Addr) -> bool {
        let rules = rbac_rules(a, |p| p.to_owned());
        rules
            .policies
            .values()
            .any(|p| p.principals.iter().any(|x| eval(x, ip)))
    }

    use proptest::prelude::*;

    const JWKS: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","x":"GrmKoLISinHtgZRMslA42Z2S4MTNYpi3Z8dRvmywZ9I","y":"lU0Hcj5rL6i0C6hoxxT8L1hdF6W-1cgZBJe9vOk6qXw"}]}"#;

    fn yaml() -> String {
        let mut docs = Vec::new();
        for g in ["g0", "g1"] {
            docs.push(format!("apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{ name: {g} }}\nspec:\n  gatewayClassName: ballast\n  listeners:\n  - {{ name: http, port: 80, protocol: HTTP }}\n"));
        }
        docs.push("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: { name: api }\nspec:\n  parentRefs: [{ name: g0 }]\n  hostnames: [api.example.com]\n  rules:\n  - { name: secure, matches: [{ path: { value: /s } }], backendRefs: [{ name: b }] }\n  - backendRefs: [{ name: b }]\n".to_owned());
        docs.push("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: { name: other }\nspec:\n  parentRefs: [{ name: g1 }]\n  rules:\n  - backendRefs: [{ name: b }]\n".to_owned());
        docs.push("apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: { name: b }\nspec:\n  endpoints: [{ address: 10.0.0.1, port: 80 }]\n".to_owned());
        docs.push("apiVersion: ballast.dev/v1alpha1\nkind: SecurityPolicy\nmetadata: { name: gw }\nspec:\n  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: g0, sectionName: http }]\n  authorization: { rules: [{ action: Allow, principal: { clientCIDRs: [10.0.0.0/8] } }] }\n".to_owned());
        docs.push(format!("apiVersion: ballast.dev/v1alpha1\nkind: SecurityPolicy\nmetadata: {{ name: rule }}\nspec:\n  targetRefs: [{{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: api, sectionName: secure }}]\n  jwt: {{ providers: [{{ name: a, issuer: x, localJWKS: {{ inline: '{JWKS}' }}, claimToHeaders: [{{ claim: sub, header: x-sub }}] }}, {{ name: b, localJWKS: {{ inline: '{JWKS}' }} }}] }}\n"));
        docs.join("---\n")
    }

    fn any_of<'a>(m: &'a std::collections::HashMap<String, Any>, k: &str) -> &'a Any {
        m.get(k)
            .unwrap_or_else(|| panic!("no {k} in {:?}", m.keys()))
    }

    /// Filters before the router, listener policy on the virtual host, rule policy on the
    /// rule's routes only (RBAC off there, JWT on), nothing on the other Gateway; the bytes are
    /// the same across translations (maps in key order).
    #[test]
    fn filters_and_per_filter_config_land_where_they_apply() {
        use envoy_types::pb::envoy::config::listener::v3::Listener;
        use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
        use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
        use prost::Message;
        let set = crate::tests::config(&yaml());
        let g0 =
            crate::translate_gateway(&set, &crate::tests::gw("g0"), &Default::default()).unwrap();
        let l = Listener::decode(g0.listeners[0].value_bytes()).unwrap();
        let Some(ConfigType::TypedConfig(any)) = &l.filter_chains[0].filters[0].config_type else {
            panic!()
        };
        let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
        let names: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "envoy.filters.http.cors",
                JWT_FILTER,
                RBAC_FILTER,
                "envoy.filters.http.stateful_session",
                "envoy.filters.http.router"
            ]
        );
        assert_eq!(hcm.use_remote_address, Some(BoolValue { value: true }));
        let Some(HttpFilterConfig::TypedConfig(jwt)) = &hcm.http_filters[1].config_type else {
            panic!()
        };
        let jwt = JwtAuthentication::decode(jwt.value.as_slice()).unwrap();
        let mut providers: Vec<&String> = jwt.providers.keys().collect();
        providers.sort();
        assert_eq!(providers, ["default/rule/a", "default/rule/b"]);
        assert_eq!(
            jwt.providers["default/rule/a"].claim_to_headers[0].header_name,
            "x-sub"
        );
        assert!(
            jwt.rules.is_empty(),
            "nothing is enforced without per-route config"
        );

        let rc = RouteConfiguration::decode(g0.route_configs[0].value_bytes()).unwrap();
        let vh = &rc.virtual_hosts[0];
        let rbac = RbacPerRoute::decode(
            any_of(&vh.typed_per_filter_config, RBAC_FILTER)
                .value
                .as_slice(),
        )
        .unwrap();
        assert_eq!(rbac.rbac.unwrap().rules.unwrap().policies.len(), 1);
        let jwt = PerRouteConfig::decode(
            any_of(&vh.typed_per_filter_config, JWT_FILTER)
                .value
                .as_slice(),
        )
        .unwrap();
        assert_eq!(
            jwt.requirement_specifier,
            Some(RequirementSpecifier::Disabled(true))
        );
        let secure = vh
            .routes
            .iter()
            .find(|r| r.name.contains("/secure/"))
            .unwrap();
        let rbac = RbacPerRoute::decode(
            any_of(&secure.typed_per_filter_config, RBAC_FILTER)
                .value
                .as_slice(),
        )
        .unwrap();
        assert_eq!(
            rbac.rbac, None,
            "the rule policy has no authorization: RBAC off"
        );
        let jwt = PerRouteConfig::decode(
            any_of(&secure.typed_per_filter_config, JWT_FILTER)
                .value
                .as_slice(),
        )
        .unwrap();
        assert_eq!(
            jwt.requirement_specifier,
            Some(RequirementSpecifier::RequirementName("default/rule".into()))
        );
        let plain = vh
            .routes
            .iter()
            .find(|r| !r.name.contains("/secure/"))
            .unwrap();
        assert!(plain.typed_per_filter_config.is_empty());

        let g1 =
            crate::translate_gateway(&set, &crate::tests::gw("g1"), &Default::default()).unwrap();
        let l = Listener::decode(g1.listeners[0].value_bytes()).unwrap();
        let Some(ConfigType::TypedConfig(any)) = &l.filter_chains[0].filters[0].config_type else {
            panic!()
        };
        let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
        assert_eq!(hcm.http_filters.len(), 3, "no SecurityPolicy concerns g1");
        assert_eq!(hcm.use_remote_address, None);

        for _ in 0..8 {
            let again = crate::translate_gateway(
                &crate::tests::config(&yaml()),
                &crate::tests::gw("g0"),
                &Default::default(),
            )
            .unwrap();
            let bytes = |r: &crate::GatewayResources| {
                r.iter().map(|x| x.any_bytes().clone()).collect::<Vec<_>>()
            };
            assert_eq!(bytes(&again), bytes(&g0));
        }
    }

    /// Gateway `g0` with a listener policy asking a gRPC service and failing open, and a rule
    /// policy asking an HTTP service and failing closed.
    fn ext_auth_yaml() -> String {
        let mut y = yaml()
            .split("---\n")
            .filter(|d| !d.contains("kind: SecurityPolicy"))
            .collect::<Vec<_>>()
            .join("---\n");
        y += "---\napiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: { name: authz }\nspec:\n  protocol: grpc\n  endpoints: [{ address: 10.0.0.2, port: 9001 }]\n";
        y += "---\napiVersion: ballast.dev/v1alpha1\nkind: SecurityPolicy\nmetadata: { name: gw }\nspec:\n  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: g0, sectionName: http }]\n  extAuth:\n    failOpen: true\n    grpc: { backendRefs: [{ group: ballast.dev, kind: Backend, name: authz, port: 9001 }] }\n";
        y += "---\napiVersion: ballast.dev/v1alpha1\nkind: SecurityPolicy\nmetadata: { name: rule }\nspec:\n  targetRefs: [{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: api, sectionName: secure }]\n  extAuth:\n    headersToExtAuth: [X-Session]\n    http: { backendRefs: [{ group: ballast.dev, kind: Backend, name: b }], path: /check, headersToBackend: [x-user] }\n";
        y
    }

    fn per_route_override(m: &std::collections::HashMap<String, Any>, filter: &str) -> Override {
        use prost::Message;
        ExtAuthzPerRoute::decode(any_of(m, filter).value.as_slice())
            .unwrap()
            .r#override
            .unwrap()
    }

    const GRPC_CLOSED: &str = EXT_AUTHZ_FILTERS[1].0;
    const GRPC_OPEN: &str = EXT_AUTHZ_FILTERS[3].0;

    /// Exactly what ext_authz emits: a filter per service type and failure mode in use
    /// (disabled until a virtual host or route enables it), the gRPC service (envoy_grpc to the
    /// Backend's cluster, `:authority` its name, 10 s, V3) and the HTTP one; each policy
    /// enables its own filter and disables the other three.
    #[test]
    fn ext_auth_grpc_and_fail_open_are_emitted_exactly() {
        use envoy_types::pb::envoy::config::listener::v3::Listener;
        use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
        use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
        use prost::Message;
        let set = crate::tests::config(&ext_auth_yaml());
        let g0 =
            crate::translate_gateway(&set, &crate::tests::gw("g0"), &Default::default()).unwrap();
        let l = Listener::decode(g0.listeners[0].value_bytes()).unwrap();
        let Some(ConfigType::TypedConfig(any)) = &l.filter_chains[0].filters[0].config_type else {
            panic!()
        };
        let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
        let names: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names[1..5],
            [JWT_FILTER, RBAC_FILTER, EXT_AUTHZ_FILTER, GRPC_OPEN]
        );
        let filter = |name: &str| {
            let f = hcm.http_filters.iter().find(|f| f.name == name).unwrap();
            assert!(f.disabled, "{name} runs only where a policy enables it");
            let Some(HttpFilterConfig::TypedConfig(any)) = &f.config_type else {
                panic!()
            };
            ExtAuthz::decode(any.value.as_slice()).unwrap()
        };
        let grpc = GrpcService {
            target_specifier: Some(TargetSpecifier::EnvoyGrpc(EnvoyGrpc {
                cluster_name: crate::names::cluster(&ObjectKey::new("default", "authz")),
                authority: "authz".into(),
                ..Default::default()
            })),
            timeout: Some(pb_duration(std::time::Duration::from_secs(10))),
            ..Default::default()
        };
        let http = HttpService {
            server_uri: Some(HttpUri {
                uri: "http://b.default".into(),
                http_upstream_type: Some(HttpUpstreamType::Cluster(crate::names::cluster(
                    &ObjectKey::new("default", "b"),
                ))),
                timeout: Some(pb_duration(std::time::Duration::from_secs(10))),
            }),
            path_prefix: "/check".into(),
            authorization_response: Some(AuthorizationResponse {
                allowed_upstream_headers: Some(exact_list(["x-user".to_owned()])),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            filter(GRPC_OPEN),
            ExtAuthz {
                services: Some(Services::GrpcService(grpc.clone())),
                transport_api_version: ApiVersion::V3 as i32,
                failure_mode_allow: true,
                failure_mode_allow_header_add: true,
                ..Default::default()
            }
        );
        assert_eq!(
            filter(EXT_AUTHZ_FILTER),
            ExtAuthz {
                services: Some(Services::HttpService(http.clone())),
                transport_api_version: ApiVersion::V3 as i32,
                allowed_headers: Some(exact_list(["x-session".to_owned()])),
                ..Default::default()
            }
        );
        // The listener policy on the virtual host: gRPC through the gRPC fail-open filter.
        let rc = RouteConfiguration::decode(g0.route_configs[0].value_bytes()).unwrap();
        let vh = &rc.virtual_hosts[0];
        for (name, ..) in EXT_AUTHZ_FILTERS {
            assert_eq!(
                per_route_override(&vh.typed_per_filter_config, name),
                if name == GRPC_OPEN {
                    Override::CheckSettings(CheckSettings {
                        service_override: Some(ServiceOverride::GrpcService(grpc.clone())),
                        ..Default::default()
                    })
                } else {
                    Override::Disabled(true)
                },
                "{name}"
            );
        }
        // The rule policy on its routes: HTTP through the fail-closed filter, the listener's
        // fail-open filter off there.
        let secure = vh
            .routes
            .iter()
            .find(|r| r.name.contains("/secure/"))
            .unwrap();
        for (name, ..) in EXT_AUTHZ_FILTERS {
            assert_eq!(
                per_route_override(&secure.typed_per_filter_config, name),
                if name == EXT_AUTHZ_FILTER {
                    Override::CheckSettings(CheckSettings {
                        service_override: Some(ServiceOverride::HttpService(http.clone())),
                        ..Default::default()
                    })
                } else {
                    Override::Disabled(true)
                },
                "{name}"
            );
        }
        // g1: no policy, no ext_authz filter.
        let g1 =
            crate::translate_gateway(&set, &crate::tests::gw("g1"), &Default::default()).unwrap();
        let l = Listener::decode(g1.listeners[0].value_bytes()).unwrap();
        let Some(ConfigType::TypedConfig(any)) = &l.filter_chains[0].filters[0].config_type else {
            panic!()
        };
        let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
        assert!(
            hcm.http_filters
                .iter()
                .all(|f| !f.name.starts_with(EXT_AUTHZ_FILTER))
        );
    }

    /// A Gateway whose policies all fail closed gets the fail-closed filters of the service
    /// types they use, each with one of them as its placeholder service.
    #[test]
    fn one_filter_per_service_type_and_failure_mode() {
        use envoy_types::pb::envoy::config::listener::v3::Listener;
        use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
        use prost::Message;
        let set =
            crate::tests::config(&ext_auth_yaml().replace("failOpen: true", "failOpen: false"));
        let g0 =
            crate::translate_gateway(&set, &crate::tests::gw("g0"), &Default::default()).unwrap();
        let l = Listener::decode(g0.listeners[0].value_bytes()).unwrap();
        let Some(ConfigType::TypedConfig(any)) = &l.filter_chains[0].filters[0].config_type else {
            panic!()
        };
        let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
        let ext: Vec<&str> = hcm
            .http_filters
            .iter()
            .map(|f| f.name.as_str())
            .filter(|n| n.starts_with(EXT_AUTHZ_FILTER))
            .collect();
        assert_eq!(ext, [EXT_AUTHZ_FILTER, GRPC_CLOSED]);
        let cfg = |name: &str| {
            let Some(HttpFilterConfig::TypedConfig(any)) = &hcm
                .http_filters
                .iter()
                .find(|f| f.name == name)
                .unwrap()
                .config_type
            else {
                panic!()
            };
            ExtAuthz::decode(any.value.as_slice()).unwrap()
        };
        let (http, grpc) = (cfg(EXT_AUTHZ_FILTER), cfg(GRPC_CLOSED));
        for c in [&http, &grpc] {
            assert!(!c.failure_mode_allow && !c.failure_mode_allow_header_add);
        }
        assert!(matches!(http.services, Some(Services::HttpService(_))));
        assert!(matches!(grpc.services, Some(Services::GrpcService(_))));
        // Headers are a filter setting: each filter sends its own policies' headers.
        assert_eq!(
            http.allowed_headers,
            Some(exact_list(["x-session".to_owned()]))
        );
        assert_eq!(grpc.allowed_headers, None);
    }

    /// Gateway `g0` with one listener policy: provider `idp` reading tokens from a header, a
    /// cookie and a parameter, optional, and rules on its claims and scopes.
    fn claims_yaml() -> String {
        let mut y = yaml()
            .split("---\n")
            .filter(|d| !d.contains("kind: SecurityPolicy"))
            .collect::<Vec<_>>()
            .join("---\n");
        y += &format!(
            "---\napiVersion: ballast.dev/v1alpha1\nkind: SecurityPolicy\nmetadata: {{ name: gw }}\nspec:\n  targetRefs: [{{ group: gateway.networking.k8s.io, kind: Gateway, name: g0 }}]\n  jwt:\n    optional: true\n    providers:\n    - name: idp\n      localJWKS: {{ inline: '{JWKS}' }}\n      extractFrom:\n        headers: [{{ name: X-Token }}, {{ name: x-auth, valuePrefix: 'Token ' }}]\n        cookies: [session]\n        params: [jwt]\n    - name: plain\n      localJWKS: {{ inline: '{JWKS}' }}\n  authorization:\n    rules:\n    - action: Deny\n      principal: {{ jwt: {{ provider: idp, claims: [{{ name: org.team, values: [red, blue] }}] }} }}\n    - action: Allow\n      principal:\n        clientCIDRs: [10.0.0.0/8]\n        jwt: {{ provider: idp, claims: [{{ name: roles, valueType: StringArray, values: [admin] }}], scopes: [read] }}\n"
        );
        y
    }

    /// Exactly what extractFrom, optional and principal.jwt emit: the provider's places and
    /// payload metadata (scopes split at spaces), `requires_any` with `allow_missing`, and the
    /// rules as metadata matchers on the jwt_authn filter's payload, in first-match order.
    #[test]
    fn jwt_extraction_optional_and_claims_are_emitted_exactly() {
        use envoy_types::pb::envoy::config::listener::v3::Listener;
        use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
        use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
        use prost::Message;
        let set = crate::tests::config(&claims_yaml());
        let g0 =
            crate::translate_gateway(&set, &crate::tests::gw("g0"), &Default::default()).unwrap();
        let l = Listener::decode(g0.listeners[0].value_bytes()).unwrap();
        let Some(ConfigType::TypedConfig(any)) = &l.filter_chains[0].filters[0].config_type else {
            panic!()
        };
        let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
        let names: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names[1..3],
            [JWT_FILTER, RBAC_FILTER],
            "authentication first"
        );
        let Some(HttpFilterConfig::TypedConfig(jwt)) = &hcm.http_filters[1].config_type else {
            panic!()
        };
        let jwt = JwtAuthentication::decode(jwt.value.as_slice()).unwrap();
        let idp = &jwt.providers["default/gw/idp"];
        assert_eq!(
            idp.from_headers,
            [
                JwtHeader {
                    name: "x-token".into(),
                    value_prefix: String::new()
                },
                JwtHeader {
                    name: "x-auth".into(),
                    value_prefix: "Token ".into()
                }
            ]
        );
        assert_eq!(idp.from_cookies, ["session"]);
        assert_eq!(idp.from_params, ["jwt"]);
        assert_eq!(idp.payload_in_metadata, "default/gw/idp");
        assert_eq!(
            idp.normalize_payload_in_metadata,
            Some(NormalizePayload {
                space_delimited_claims: vec!["scope".into()]
            })
        );
        let plain = &jwt.providers["default/gw/plain"];
        assert!(
            plain.from_headers.is_empty()
                && plain.from_cookies.is_empty()
                && plain.from_params.is_empty(),
            "default: Authorization: Bearer"
        );
        assert_eq!(plain.payload_in_metadata, "", "no rule uses its claims");
        assert_eq!(plain.normalize_payload_in_metadata, None);
        let provider = |n: &str| JwtRequirement {
            requires_type: Some(RequiresType::ProviderName(n.into())),
        };
        assert_eq!(
            jwt.requirement_map["default/gw"],
            JwtRequirement {
                requires_type: Some(RequiresType::RequiresAny(JwtRequirementOrList {
                    requirements: vec![
                        provider("default/gw/idp"),
                        provider("default/gw/plain"),
                        JwtRequirement {
                            requires_type: Some(RequiresType::AllowMissing(Default::default()))
                        }
                    ]
                }))
            }
        );

        let rc = RouteConfiguration::decode(g0.route_configs[0].value_bytes()).unwrap();
        let rbac = RbacPerRoute::decode(
            any_of(&rc.virtual_hosts[0].typed_per_filter_config, RBAC_FILTER)
                .value
                .as_slice(),
        )
        .unwrap();
        let rules = rbac.rbac.unwrap().rules.unwrap();
        let key = "default/gw/idp";
        let team = |v: &str| payload_matches([key, "org", "team"], exact_value(v));
        let deny = principal(Identifier::OrIds(Set {
            ids: vec![team("red"), team("blue")],
        }));
        let allow = principal(Identifier::AndIds(Set {
            ids: vec![
                cidrs(&[Spanned::unpositioned("10.0.0.0/8".to_owned())]),
                principal(Identifier::AndIds(Set {
                    ids: vec![
                        payload_matches([key, "roles"], contains_value("admin")),
                        payload_matches([key, "scope"], contains_value("read")),
                    ],
                })),
            ],
        }));
        let not_denied = principal(Identifier::NotId(Box::new(principal(Identifier::OrIds(
            Set { ids: vec![deny] },
        )))));
        assert_eq!(
            rules.policies["ballast"].principals,
            [principal(Identifier::AndIds(Set {
                ids: vec![allow, not_denied]
            }))]
        );
        // One matcher, spelled out: dynamic metadata of jwt_authn at the claim's path.
        let Some(Identifier::SourcedMetadata(m)) =
            payload_matches([key, "roles"], contains_value("admin")).identifier
        else {
            panic!()
        };
        assert_eq!(m.metadata_source, MetadataSource::Dynamic as i32);
        let m = m.metadata_matcher.unwrap();
        assert_eq!(m.filter, "envoy.filters.http.jwt_authn");
        assert_eq!(
            m.path,
            ["default/gw/idp", "roles"].map(|k| PathSegment {
                segment: Some(Segment::Key(k.into()))
            })
        );
        assert_eq!(
            m.value.unwrap().match_pattern,
            Some(ValuePattern::ListMatch(Box::new(ListMatcher {
                match_pattern: Some(ListPattern::OneOf(Box::new(ValueMatcher {
                    match_pattern: Some(ValuePattern::StringMatch(StringMatcher {
                        match_pattern: Some(MatchPattern::Exact("admin".into())),
                        ..Default::default()
                    }))
                })))
            })))
        );
        assert!(!m.invert);
    }

    /// A single provider, not optional: its name alone (as before optional existed).
    #[test]
    fn required_single_provider_is_its_name() {
        use envoy_types::pb::envoy::config::listener::v3::Listener;
        use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
        use prost::Message;
        let y = claims_yaml().replace("    optional: true\n", "").replace(
            "    - name: plain\n      localJWKS: { inline: '",
            "    - name: plain\n      x: { inline: '",
        );
        let y = y
            .split('\n')
            .filter(|l| !l.contains("- name: plain") && !l.contains("x: { inline:"))
            .collect::<Vec<_>>()
            .join("\n");
        let set = crate::tests::config(&y);
        let g0 =
            crate::translate_gateway(&set, &crate::tests::gw("g0"), &Default::default()).unwrap();
        let l = Listener::decode(g0.listeners[0].value_bytes()).unwrap();
        let Some(ConfigType::TypedConfig(any)) = &l.filter_chains[0].filters[0].config_type else {
            panic!()
        };
        let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
        let Some(HttpFilterConfig::TypedConfig(jwt)) = &hcm.http_filters[1].config_type else {
            panic!()
        };
        let jwt = JwtAuthentication::decode(jwt.value.as_slice()).unwrap();
        assert_eq!(
            jwt.requirement_map["default/gw"].requires_type,
            Some(RequiresType::ProviderName("default/gw/idp".into()))
        );
    }

    /// Envoy rejects a listener whose JWKS has no valid key; the fail-closed one is valid.
    #[test]
    fn unresolved_jwks_is_a_valid_key_set() {
        ballast_model::check_jwks(NO_KEYS_JWKS).unwrap();
    }

    /// Editing a SecurityPolicy rebuilds only the Gateways it concerns.
    #[test]
    fn policy_edit_rebuilds_only_its_gateways() {
        let mut t = crate::Translator::new(Default::default());
        t.update(&Arc::new(crate::tests::config(&yaml())));
        let edited = yaml().replace("clientCIDRs: [10.0.0.0/8]", "clientCIDRs: [10.0.0.0/16]");
        let out = t.update(&Arc::new(crate::tests::config(&edited)));
        assert_eq!(
            out.changed.keys().collect::<Vec<_>>(),
            [&crate::tests::gw("g0")]
        );
        assert_eq!(out.stats.gateways_translated, 1, "{:?}", out.stats);
        assert_eq!(out.stats.routes_translated, 0, "{:?}", out.stats);
    }

    proptest! {
        /// The single ALLOW policy agrees with evaluating the rules first-match-wins.
        #[test]
        fn rbac_equals_first_match(
            rules in prop::collection::vec((any::<bool>(), 0u8..4, 0u8..3), 0..6),
            default_allow in any::<bool>(),
            ip in 0u8..4,
        ) {
            let nets = ["10.0.0.0/8", "10.1.0.0/16", "192.168.1.0/24"];
            let a = Authorization {
                default_action: Some(Spanned::unpositioned(if default_allow { AuthorizationAction::Allow } else { AuthorizationAction::Deny })),
                rules: rules.iter().map(|(allow, _, n)| rule(if *allow { AuthorizationAction::Allow } else { AuthorizationAction::Deny }, nets[*n as usize])).collect(),
            };
            let ips = [[10, 1, 2, 3], [10, 2, 0, 1], [192, 168, 1, 5], [8, 8, 8, 8]];
            let addr = std::net::Ipv4Addr::from(ips[ip as usize]);
            let first = a.rules.iter().find(|r| {
                let c = Cidr::parse(&r.principal.client_cidrs[0]).unwrap();
                let std::net::IpAddr::V4(net) = c.address else { unreachable!() };
                let mask = if c.prefix_len == 0 { 0 } else { u32::MAX << (32 - c.prefix_len) };
                u32::from(addr) & mask == u32::from(net) & mask
            });
            let want = match first {
                Some(r) => r.action.value == AuthorizationAction::Allow,
                None => default_allow,
            };
            prop_assert_eq!(allowed(&a, addr), want);
        }
    }
}
