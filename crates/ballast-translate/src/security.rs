//! SecurityPolicy → Envoy `envoy.filters.http.rbac` (client IP allow/deny) and
//! `envoy.filters.http.jwt_authn` (JWT authentication).
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
//! Each policy sets both filters, so the applying policy acts as a whole: one without `jwt`
//! turns JWT off there (`disabled`), one without `authorization` turns RBAC off.
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
    Authorization, AuthorizationAction, Cidr, ConfigSet, Listener, ObjectKey, SecurityPolicy,
    TargetKind,
};
use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
use envoy_types::pb::envoy::config::core::v3::{CidrRange, DataSource};
use envoy_types::pb::envoy::config::rbac::v3::permission::Rule;
use envoy_types::pb::envoy::config::rbac::v3::principal::{Identifier, Set};
use envoy_types::pb::envoy::config::rbac::v3::rbac::Action as RbacAction;
use envoy_types::pb::envoy::config::rbac::v3::{Permission, Policy, Principal, Rbac as RbacRules};
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::jwt_provider::JwksSourceSpecifier;
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::jwt_requirement::RequiresType;
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::per_route_config::RequirementSpecifier;
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::{
    JwtAuthentication, JwtClaimToHeader, JwtProvider, JwtRequirement, JwtRequirementOrList,
    PerRouteConfig,
};
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::{Rbac, RbacPerRoute};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpFilterConfig;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter,
};
use envoy_types::pb::google::protobuf::{Any, BoolValue, UInt32Value};
use envoy_types::util::pack_any;
use prost::Name;

use crate::index::names_gateway;

pub(crate) const RBAC_FILTER: &str = "envoy.filters.http.rbac";
pub(crate) const JWT_FILTER: &str = "envoy.filters.http.jwt_authn";

/// Used for a provider whose JWKS does not resolve: no token verifies (fail closed).
const NO_KEYS_JWKS: &str = r#"{"keys":[]}"#;

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
                    out.extend(
                        config
                            .gateways
                            .keys()
                            .filter(|g| names_gateway(route, g))
                            .cloned(),
                    );
                }
            }
            _ => {}
        }
    }
    out
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
    let mut providers: BTreeMap<String, JwtProvider> = BTreeMap::new();
    let mut requirements: BTreeMap<String, JwtRequirement> = BTreeMap::new();
    for p in policies {
        let Some(jwt) = &p.spec.jwt else { continue };
        let mut names = Vec::new();
        for pr in &jwt.providers {
            let name = provider_name(p, &pr.name);
            let jwks = config
                .security_jwks(p, pr)
                .unwrap_or_else(|_| NO_KEYS_JWKS.to_owned());
            providers.insert(
                name.clone(),
                JwtProvider {
                    issuer: pr
                        .issuer
                        .as_ref()
                        .map(|i| i.value.clone())
                        .unwrap_or_default(),
                    audiences: pr.audiences.iter().map(|a| a.value.clone()).collect(),
                    jwks_source_specifier: Some(JwksSourceSpecifier::LocalJwks(DataSource {
                        specifier: Some(Specifier::InlineString(jwks)),
                        ..Default::default()
                    })),
                    claim_to_headers: pr
                        .claim_to_headers
                        .iter()
                        .map(|c| JwtClaimToHeader {
                            header_name: c.header.value.clone(),
                            claim_name: c.claim.value.clone(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                },
            );
            names.push(name);
        }
        let requirement = if names.len() == 1 {
            JwtRequirement {
                requires_type: Some(RequiresType::ProviderName(names.remove(0))),
            }
        } else {
            JwtRequirement {
                requires_type: Some(RequiresType::RequiresAny(JwtRequirementOrList {
                    requirements: names
                        .into_iter()
                        .map(|n| JwtRequirement {
                            requires_type: Some(RequiresType::ProviderName(n)),
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
    let filters = [
        (RBAC_FILTER, pack_any(Rbac::default())),
        (
            JWT_FILTER,
            Any {
                type_url: JwtAuthentication::type_url(),
                value: jwt,
            },
        ),
    ];
    let at = hcm.http_filters.len().saturating_sub(1); // before the router
    for (i, (name, cfg)) in filters.into_iter().enumerate() {
        hcm.http_filters.insert(
            at + i,
            HttpFilter {
                name: name.into(),
                config_type: Some(HttpFilterConfig::TypedConfig(cfg)),
                ..Default::default()
            },
        );
    }
}

/// The `typed_per_filter_config` entries of `p` (RBAC and jwt_authn), encoded as field `tag`
/// of the message holding them (13 in `Route`, 15 in `VirtualHost`), in key order.
pub(crate) fn per_filter_config(p: &SecurityPolicy, tag: u32) -> Vec<u8> {
    let rbac = RbacPerRoute {
        rbac: p.spec.authorization.as_ref().map(|a| Rbac {
            rules: Some(rbac_rules(a)),
            ..Default::default()
        }),
    };
    let jwt = PerRouteConfig {
        requirement_specifier: Some(match &p.spec.jwt {
            Some(_) => RequirementSpecifier::RequirementName(requirement_name(p)),
            None => RequirementSpecifier::Disabled(true),
        }),
    };
    let entries: BTreeMap<String, Any> = [
        (JWT_FILTER.to_owned(), pack_any(jwt)),
        (RBAC_FILTER.to_owned(), pack_any(rbac)),
    ]
    .into_iter()
    .collect();
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

/// First-match-wins rules as one ALLOW policy: a request is allowed when some Allow rule
/// matches and no Deny rule before it does, or no Deny rule matches and the default allows.
/// (Envoy's RBAC has one action per filter; this keeps rule order without a matcher tree, and
/// one policy keeps the `policies` map to one entry.)
fn rbac_rules(a: &Authorization) -> RbacRules {
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
        let m = cidrs(&r.principal.client_cidrs);
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
        let rules = rbac_rules(a);
        rules
            .policies
            .values()
            .any(|p| p.principals.iter().any(|x| eval(x, ip)))
    }

    use proptest::prelude::*;

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
