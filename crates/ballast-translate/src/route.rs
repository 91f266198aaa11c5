//! HTTPRoutes → Envoy routes, and routes → virtual hosts.
//!
//! An HTTPRoute's Envoy routes depend only on the route itself and on which of its backendRefs
//! resolve (and their load-balancing policy, for hash policies), never on the Gateway or
//! listener it is attached to. [`TranslatedRoute`] is therefore computed once per route and
//! shared by every virtual host and Gateway that uses it.

use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::sync::Arc;

use ballast_model::set::{BackendRefResolution, ListenerAttachment};
use ballast_model::{
    ConfigSet, HashKey, HeaderMatch, HeaderModifier, HttpBackendRef, HttpRoute, HttpRouteMatch,
    HttpRouteRule, Listener, ObjectKey, PathMatchType, PathRewrite, RequestRedirect,
    StringMatchType, UrlRewrite, hostname_matches,
};
use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{
    HeaderValue, HeaderValueOption, RuntimeFractionalPercent,
};
use envoy_types::pb::envoy::config::route::v3::header_matcher::HeaderMatchSpecifier;
use envoy_types::pb::envoy::config::route::v3::query_parameter_matcher::QueryParameterMatchSpecifier;
use envoy_types::pb::envoy::config::route::v3::redirect_action::{
    PathRewriteSpecifier, RedirectResponseCode, SchemeRewriteSpecifier,
};
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::hash_policy::{
    ConnectionProperties, Cookie, Header as HashHeader, PolicySpecifier,
};
use envoy_types::pb::envoy::config::route::v3::route_action::{
    ClusterSpecifier, HashPolicy, HostRewriteSpecifier, RequestMirrorPolicy,
};
use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::weighted_cluster::ClusterWeight;
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, HeaderMatcher, QueryParameterMatcher, RedirectAction, RetryPolicy, Route,
    RouteAction, RouteConfiguration, RouteMatch, VirtualHost, WeightedCluster,
};
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    RegexMatchAndSubstitute, RegexMatcher, StringMatcher,
};
use envoy_types::pb::envoy::r#type::v3::FractionalPercent;
use envoy_types::pb::envoy::r#type::v3::fractional_percent::DenominatorType;
use envoy_types::pb::google::protobuf::UInt32Value;

use crate::policy::hash_key;
use crate::{names, pb_duration};
use ballast_xds::{ResourceType, XdsResource};
use prost::Message;

/// Gateway API match precedence, as a sort key (smaller sorts first, i.e. wins in Envoy).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Precedence {
    /// 0 exact, 1 regex, 2 prefix.
    path_class: u8,
    path_len: Reverse<usize>,
    method: Reverse<bool>,
    headers: Reverse<usize>,
    query: Reverse<usize>,
    /// Shared by every entry of the route: a copy each was two `String`s per match (issue
    /// #13: 17,000 at W4).
    route: Arc<ObjectKey>,
    rule: usize,
    matcher: usize,
}

/// The Envoy routes of one match of one rule (two when part of the rule's weight is
/// unresolvable: the 500 share first), with their precedence.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RouteEntry {
    pub precedence: Precedence,
    /// The Envoy routes, each encoded as a `VirtualHost.routes` field (key, length, bytes).
    /// Kept encoded: a prost `Route` takes ~2 KiB, its encoding ~200 bytes, and a gateway
    /// holds every route of every HTTPRoute (17,000 routes: ~40 MB as structs).
    pub encoded: Box<[u8]>,
    /// The clusters these routes send traffic to, sorted.
    pub clusters: Box<[Arc<str>]>,
    /// A redirect with neither scheme nor port must keep the listener's port (Gateway API
    /// `requestRedirect.port`), which Envoy cannot: the HTTP connection manager strips the
    /// port from `Host` before routing. Such an entry keeps its route (and `extra`) to be
    /// re-encoded with `port_redirect` set per listener port ([`encode_virtual_host`]).
    pub keeps_listener_port: Option<Box<(Route, Box<[u8]>)>>,
}

impl RouteEntry {
    /// `extra`: fields appended to every route (pre-encoded `typed_per_filter_config`
    /// entries, see [`crate::security`]).
    fn new(precedence: Precedence, routes: Vec<Route>, extra: &[u8]) -> RouteEntry {
        let mut encoded = Vec::with_capacity(
            routes
                .iter()
                .map(|r| r.encoded_len() + extra.len() + 4)
                .sum(),
        );
        for r in &routes {
            // Maps of two or more entries are written in key order (prost's HashMap order
            // differs between processes); `extra` holds more entries of the same map field,
            // which protobuf merges, pre-encoded in order.
            if r.typed_per_filter_config.len() < 2 {
                prost::encoding::encode_key(
                    3,
                    prost::encoding::WireType::LengthDelimited,
                    &mut encoded,
                );
                prost::encoding::encode_varint(
                    (r.encoded_len() + extra.len()) as u64,
                    &mut encoded,
                );
                r.encode_raw(&mut encoded);
            } else {
                let body = encode_sorted(r);
                prost::encoding::encode_key(
                    3,
                    prost::encoding::WireType::LengthDelimited,
                    &mut encoded,
                );
                prost::encoding::encode_varint((body.len() + extra.len()) as u64, &mut encoded);
                encoded.extend_from_slice(&body);
            }
            encoded.extend_from_slice(extra);
        }
        // The same references a route configuration holding these routes has.
        let holder = RouteConfiguration {
            virtual_hosts: vec![VirtualHost {
                routes,
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut clusters: Vec<Arc<str>> = holder
            .refs()
            .into_iter()
            .filter(|r| r.ty == ResourceType::Cluster)
            .map(|r| r.name)
            .collect();
        clusters.sort();
        clusters.dedup();
        let keeps_listener_port = match holder.virtual_hosts[0].routes.as_slice() {
            [
                r @ Route {
                    action: Some(Action::Redirect(a)),
                    ..
                },
            ] if a.scheme_rewrite_specifier.is_none() && a.port_redirect == 0 => {
                Some(Box::new((r.clone(), extra.into())))
            }
            _ => None,
        };
        RouteEntry {
            precedence,
            encoded: encoded.into_boxed_slice(),
            clusters: clusters.into_boxed_slice(),
            keeps_listener_port,
        }
    }

    /// The encoded routes for a listener on `redirect_port` (0: the protocol's well-known
    /// port, which a `Location` leaves out).
    fn encoded_for(&self, redirect_port: u32) -> std::borrow::Cow<'_, [u8]> {
        match &self.keeps_listener_port {
            Some(kept) if redirect_port != 0 => {
                let (route, extra) = &**kept;
                let mut route = route.clone();
                if let Some(Action::Redirect(a)) = &mut route.action {
                    a.port_redirect = redirect_port;
                }
                let entry = RouteEntry::new(self.precedence.clone(), vec![route], extra);
                std::borrow::Cow::Owned(entry.encoded.into_vec())
            }
            _ => std::borrow::Cow::Borrowed(&self.encoded),
        }
    }
}

/// `route` encoded with its `typed_per_filter_config` entries in key order. prost encodes the
/// map (a `HashMap`) in iteration order, which differs between map instances: with two or
/// more entries the same route would get different bytes, hence versions (invariant 5).
fn encode_sorted(route: &Route) -> Vec<u8> {
    let mut bare = route.clone();
    let map: std::collections::BTreeMap<String, envoy_types::pb::google::protobuf::Any> =
        std::mem::take(&mut bare.typed_per_filter_config)
            .into_iter()
            .collect();
    let mut out = bare.encode_to_vec();
    prost::encoding::btree_map::encode(
        prost::encoding::string::encode,
        prost::encoding::string::encoded_len,
        prost::encoding::message::encode,
        prost::encoding::message::encoded_len,
        13,
        &map,
        &mut out,
    );
    out
}

/// A sorted set of keys that never changes once built: a shared slice, because a `BTreeSet`
/// allocates a whole node (11 keys) for the usual handful, twice per translated route (issue
/// #13: 3,400 routes spent 3.7 MB on them); shared, because a route's two sets are usually
/// the same keys ([`translate_route`]).
pub(crate) type KeySet = Arc<[ObjectKey]>;

/// An HTTPRoute translated to Envoy routes, valid while the route and the resolution of its
/// backendRefs ([`backend_signature`]) are unchanged.
#[derive(Debug)]
pub(crate) struct TranslatedRoute {
    pub route: Arc<HttpRoute>,
    pub signature: Signature,
    /// Per rule, the SecurityPolicy applying to its routes (also part of the cache key).
    pub security: Vec<Option<Arc<ballast_model::SecurityPolicy>>>,
    pub entries: Vec<RouteEntry>,
    /// Backends the Envoy routes send traffic to, sorted and distinct.
    pub clusters: KeySet,
    /// Every Backend any backendRef names, resolvable or not: adding, removing or changing one
    /// of them may change these routes. Sorted and distinct.
    pub backend_refs: KeySet,
    /// The RateLimitPolicy of the route's own the routes carry ([`crate::rate_limit`]), and
    /// whether its service was usable: these routes are valid while both are unchanged.
    pub rate_limit: RateLimitSignature,
}

/// What the rate-limit part of a route's translation depends on.
pub(crate) type RateLimitSignature = Option<(Arc<ballast_model::RateLimitPolicy>, bool)>;

pub(crate) fn rate_limit_signature(config: &ConfigSet, route: &HttpRoute) -> RateLimitSignature {
    crate::rate_limit::route_policy(config, route).map(|p| {
        let usable = config.rate_limit_service_problem(&p).is_ok();
        (p, usable)
    })
}

/// What the Envoy routes of `route` depend on besides the route: per backendRef, the policy of
/// the Backend it resolves to (which can change without the Backend changing: a Service
/// appearing takes over a shorthand ref), or `None`; as one byte string ([`Signature`]).
pub(crate) fn backend_signature(config: &ConfigSet, route: &HttpRoute) -> Signature {
    encode_signature(
        route
            .spec
            .rules
            .iter()
            .flat_map(rule_backend_refs)
            .map(|r| match config.resolve_backend(route, r) {
                BackendRefResolution::Resolved(b) => Some((b.key(), hash_key(config, &b))),
                _ => None,
            }),
    )
}

/// A [`backend_signature`], encoded: equal exactly when the per-backendRef list of (Backend,
/// hash key) it encodes is (length-prefixed fields, a tag per variant). One allocation per
/// translated route instead of a `Vec` of `ObjectKey`s with two `String`s each (issue #13:
/// 17,000 backendRefs at W4 kept ~2 MB in them).
pub(crate) type Signature = Box<[u8]>;

fn encode_signature(
    items: impl Iterator<Item = Option<(ObjectKey, Option<HashKey>)>>,
) -> Signature {
    fn varint(out: &mut Vec<u8>, mut n: u64) {
        while n >= 0x80 {
            out.push((n as u8) | 0x80);
            n >>= 7;
        }
        out.push(n as u8);
    }
    fn put_str(out: &mut Vec<u8>, s: &str) {
        varint(out, s.len() as u64);
        out.extend_from_slice(s.as_bytes());
    }
    let mut out = Vec::new();
    for item in items {
        let Some((key, hash)) = item else {
            out.push(0);
            continue;
        };
        out.push(1);
        put_str(&mut out, &key.namespace);
        put_str(&mut out, &key.name);
        match hash {
            None => out.push(0),
            Some(HashKey::SourceIp) => out.push(1),
            Some(HashKey::Header(h)) => {
                out.push(2);
                put_str(&mut out, &h);
            }
            Some(HashKey::Cookie { name, ttl }) => {
                out.push(3);
                put_str(&mut out, &name);
                match ttl {
                    None => out.push(0),
                    Some(d) => {
                        out.push(1);
                        varint(&mut out, d.as_secs());
                        varint(&mut out, u64::from(d.subsec_nanos()));
                    }
                }
            }
        }
    }
    out.into_boxed_slice()
}

/// A rule's backendRefs and its RequestMirror targets: everything its Envoy routes may send to.
fn rule_backend_refs(rule: &HttpRouteRule) -> impl Iterator<Item = &HttpBackendRef> {
    rule.backend_refs.iter().chain(
        rule.filters
            .iter()
            .filter_map(|f| f.request_mirror.as_ref().map(|m| &m.backend_ref)),
    )
}

/// Every Backend key the backendRefs (and mirror targets) of `route` may name (Ballast
/// Backends and the Backends derived from Service ports, see
/// [`ballast_model::HttpBackendRef::candidate_keys`]).
pub(crate) fn backend_refs(route: &HttpRoute) -> impl Iterator<Item = ObjectKey> + '_ {
    let ns = route.metadata.namespace.as_str();
    route
        .spec
        .rules
        .iter()
        .flat_map(rule_backend_refs)
        .flat_map(move |r| r.candidate_keys(ns))
}

pub(crate) fn translate_route(config: &ConfigSet, route: &Arc<HttpRoute>) -> TranslatedRoute {
    let key = Arc::new(route.key());
    let mut out = TranslatedRoute {
        route: route.clone(),
        signature: backend_signature(config, route),
        security: crate::security::route_policies(config, route),
        entries: Vec::new(),
        clusters: KeySet::default(),
        backend_refs: backend_refs(route)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
        rate_limit: rate_limit_signature(config, route),
    };
    let mut clusters = BTreeSet::new();
    let rate_limit = out
        .rate_limit
        .as_ref()
        .map(|(p, _)| crate::rate_limit::route_filter_configs(config, p))
        .unwrap_or_default();
    for (ri, rule) in route.spec.rules.iter().enumerate() {
        let parts = RuleParts::new(config, route, ri, rule);
        if parts.redirect.is_none() {
            clusters.extend(parts.clusters.iter().map(|c| c.key.clone()));
            if parts.resolved_weight > 0 {
                clusters.extend(parts.mirrors.iter().map(|(k, _)| k.clone()));
            }
        }
        let extra = out.security[ri]
            .as_ref()
            .map(|p| crate::security::per_filter_config(p, 13))
            .unwrap_or_default();
        for (mi, m) in rule.matches.iter().enumerate() {
            let mut routes = parts.routes(&key, ri, rule.name.as_ref().map(|n| n.as_str()), mi, m);
            for r in &mut routes {
                r.typed_per_filter_config.extend(rate_limit.iter().cloned());
            }
            out.entries
                .push(RouteEntry::new(precedence(m, &key, ri, mi), routes, &extra));
        }
    }
    // Every backendRef resolving to the Backend it names (the usual case): one copy of the
    // keys for both sets (issue #13: 17,000 keys at W4).
    out.clusters = if clusters.iter().eq(out.backend_refs.iter()) {
        out.backend_refs.clone()
    } else {
        clusters.into_iter().collect()
    };
    out.entries.shrink_to_fit();
    out
}

fn precedence(
    m: &HttpRouteMatch,
    route: &Arc<ObjectKey>,
    rule: usize,
    matcher: usize,
) -> Precedence {
    let (path_class, len) = match m.path.type_ {
        PathMatchType::Exact => (0, m.path.value.len()),
        PathMatchType::RegularExpression => (1, m.path.value.len()),
        PathMatchType::PathPrefix => (2, trim_prefix(&m.path.value).len()),
    };
    Precedence {
        path_class,
        path_len: Reverse(len),
        method: Reverse(m.method.is_some()),
        headers: Reverse(m.headers.len()),
        query: Reverse(m.query_params.len()),
        route: route.clone(),
        rule,
        matcher,
    }
}

/// A `PathPrefix` value without trailing slashes (`/` → ``): Gateway API prefixes match whole
/// segments and ignore a trailing slash.
fn trim_prefix(value: &str) -> &str {
    value.trim_end_matches('/')
}

/// One weighted cluster of a rule, with the header modifiers of the backendRef(s) it came from
/// (Gateway API `backendRefs[].filters`), which Envoy applies only to requests sent to it.
struct ClusterShare<'a> {
    key: ObjectKey,
    weight: u32,
    request_headers: Option<&'a HeaderModifier>,
    response_headers: Option<&'a HeaderModifier>,
}

impl ClusterShare<'_> {
    fn has_headers(&self) -> bool {
        self.request_headers.is_some() || self.response_headers.is_some()
    }
}

/// What a rule does, computed once for all its matches.
struct RuleParts<'a> {
    rule: &'a HttpRouteRule,
    redirect: Option<&'a RequestRedirect>,
    rewrite: Option<&'a UrlRewrite>,
    request_headers: Option<&'a HeaderModifier>,
    response_headers: Option<&'a HeaderModifier>,
    cors: Option<&'a ballast_model::Cors>,
    /// `sessionPersistence`, with the generated name filled in.
    session: Option<ballast_model::SessionMode>,
    /// Resolvable backends with weight > 0, merged per Backend (and backendRef filters), in
    /// first-reference order.
    clusters: Vec<ClusterShare<'a>>,
    resolved_weight: u64,
    unresolved_weight: u64,
    /// The keys the rule's backends hash on (usually none or one), in first-reference order.
    hash: Vec<HashKey>,
    /// Resolvable RequestMirror targets with their share in millionths.
    mirrors: Vec<(ObjectKey, u32)>,
}

impl<'a> RuleParts<'a> {
    fn new(config: &ConfigSet, route: &HttpRoute, ri: usize, rule: &'a HttpRouteRule) -> Self {
        use ballast_model::FilterAction as F;
        let mut parts = RuleParts {
            rule,
            redirect: None,
            rewrite: None,
            request_headers: None,
            response_headers: None,
            cors: None,
            session: None,
            clusters: Vec::new(),
            resolved_weight: 0,
            unresolved_weight: 0,
            hash: Vec::new(),
            mirrors: Vec::new(),
        };
        parts.session = rule
            .session_persistence
            .as_ref()
            .map(|sp| sp.mode(|| crate::session::default_name(&route.key(), ri)));
        for f in &rule.filters {
            match f.action() {
                Some(F::RequestHeaderModifier(m)) => parts.request_headers = Some(m),
                Some(F::ResponseHeaderModifier(m)) => parts.response_headers = Some(m),
                Some(F::RequestRedirect(r)) => parts.redirect = Some(r),
                Some(F::UrlRewrite(r)) => parts.rewrite = Some(r),
                Some(F::Cors(c)) => parts.cors = Some(c),
                // An unresolvable mirror target mirrors nothing (status reports it).
                Some(F::RequestMirror(m)) => {
                    if let BackendRefResolution::Resolved(b) =
                        config.resolve_backend(route, &m.backend_ref)
                    {
                        parts.mirrors.push((b.key(), m.millionths()));
                    }
                }
                None => {}
            }
        }
        for r in &rule.backend_refs {
            let weight = r.weight.value;
            match config.resolve_backend(route, r) {
                BackendRefResolution::Resolved(b) => {
                    if weight == 0 {
                        continue;
                    }
                    parts.resolved_weight += u64::from(weight);
                    if let Some(k) = hash_key(config, &b)
                        && !parts.hash.contains(&k)
                    {
                        parts.hash.push(k);
                    }
                    let key = b.key();
                    let (request_headers, response_headers) = r.header_modifiers();
                    // Refs to one Backend merge only when their filters agree: otherwise each
                    // keeps its own share and header mutations.
                    match parts.clusters.iter_mut().find(|c| {
                        c.key == key
                            && c.request_headers == request_headers
                            && c.response_headers == response_headers
                    }) {
                        Some(c) => c.weight = c.weight.saturating_add(weight),
                        None => parts.clusters.push(ClusterShare {
                            key,
                            weight,
                            request_headers,
                            response_headers,
                        }),
                    }
                }
                _ => parts.unresolved_weight += u64::from(weight),
            }
        }
        parts
    }

    /// The Envoy routes of match `mi` of rule `ri`. A named rule's routes are named after it
    /// and carry a stat prefix, so Envoy keeps per-rule stats (opt-in: unnamed rules add no
    /// stats).
    fn routes(
        &self,
        route: &ObjectKey,
        ri: usize,
        rule_name: Option<&str>,
        mi: usize,
        m: &HttpRouteMatch,
    ) -> Vec<Route> {
        let rule = rule_name.map_or_else(|| ri.to_string(), str::to_owned);
        let mut base = Route {
            name: format!("{}/{}/{rule}/{mi}", route.namespace, route.name),
            r#match: Some(route_match(m)),
            stat_prefix: rule_name
                .map(|n| format!("{}/{}/{n}", route.namespace, route.name))
                .unwrap_or_default(),
            ..Default::default()
        };
        if let Some(h) = self.request_headers {
            base.request_headers_to_add = headers_to_add(h);
            base.request_headers_to_remove = h.remove.iter().map(|s| s.value.clone()).collect();
        }
        if let Some(h) = self.response_headers {
            base.response_headers_to_add = headers_to_add(h);
            base.response_headers_to_remove = h.remove.iter().map(|s| s.value.clone()).collect();
        }
        if let Some(c) = self.cors {
            base.typed_per_filter_config.insert(
                crate::cors::FILTER_NAME.into(),
                crate::cors::route_policy(c),
            );
        }
        if let Some(s) = &self.session {
            base.typed_per_filter_config.insert(
                crate::session::FILTER_NAME.into(),
                crate::session::route_config(s),
            );
        }
        if let Some(r) = self.redirect {
            base.action = Some(Action::Redirect(redirect_action(r, m)));
            return vec![base];
        }
        if self.resolved_weight == 0 {
            base.action = Some(internal_error());
            return vec![base];
        }
        let mut out = Vec::new();
        if self.unresolved_weight > 0 {
            // The unresolvable share answers 500 (Gateway API); the rest falls through to the
            // next route with the same match.
            let total = self.unresolved_weight + self.resolved_weight;
            let numerator = u32::try_from(self.unresolved_weight * 1_000_000 / total)
                .expect("a share is at most a million");
            let mut fail = base.clone();
            fail.name.push_str("/unresolved");
            if let Some(rm) = fail.r#match.as_mut() {
                rm.runtime_fraction = Some(RuntimeFractionalPercent {
                    default_value: Some(FractionalPercent {
                        numerator,
                        denominator: DenominatorType::Million as i32,
                    }),
                    runtime_key: format!(
                        "ballast.unresolved_backends.{}.{}.{}",
                        route.namespace, route.name, ri
                    ),
                });
            }
            fail.action = Some(internal_error());
            out.push(fail);
        }
        base.action = Some(Action::Route(self.route_action(m)));
        out.push(base);
        out
    }

    fn route_action(&self, m: &HttpRouteMatch) -> RouteAction {
        // A single cluster with backendRef filters still uses `weighted_clusters`, the place
        // for per-backend header mutations (the route's own fields hold the rule's filters).
        let cluster_specifier = match self.clusters.as_slice() {
            [one] if !one.has_headers() => ClusterSpecifier::Cluster(names::cluster(&one.key)),
            many => ClusterSpecifier::WeightedClusters(WeightedCluster {
                clusters: many
                    .iter()
                    .map(|c| {
                        let mut cw = ClusterWeight {
                            name: names::cluster(&c.key),
                            weight: Some(UInt32Value { value: c.weight }),
                            ..Default::default()
                        };
                        if let Some(h) = c.request_headers {
                            cw.request_headers_to_add = headers_to_add(h);
                            cw.request_headers_to_remove =
                                h.remove.iter().map(|s| s.value.clone()).collect();
                        }
                        if let Some(h) = c.response_headers {
                            cw.response_headers_to_add = headers_to_add(h);
                            cw.response_headers_to_remove =
                                h.remove.iter().map(|s| s.value.clone()).collect();
                        }
                        cw
                    })
                    .collect(),
                ..Default::default()
            }),
        };
        let mut action = RouteAction {
            cluster_specifier: Some(cluster_specifier),
            ..Default::default()
        };
        if let Some(rw) = self.rewrite {
            if let Some(host) = &rw.hostname {
                action.host_rewrite_specifier =
                    Some(HostRewriteSpecifier::HostRewriteLiteral(host.value.clone()));
            }
            match rw.path.as_ref().and_then(|p| p.rewrite()) {
                Some(PathRewrite::FullPath(p)) => action.regex_rewrite = Some(full_path_regex(p)),
                Some(PathRewrite::PrefixMatch(r)) => match prefix_rewrite(&m.path.value, r) {
                    Some(PrefixRewrite::Prefix(p)) => action.prefix_rewrite = p,
                    Some(PrefixRewrite::Regex(re)) => action.regex_rewrite = Some(re),
                    None => {}
                },
                None => {}
            }
        }
        let timeouts = self.rule.timeouts.as_ref();
        if let Some(t) = timeouts.and_then(|t| t.request.as_ref()) {
            action.timeout = Some(pb_duration(t.value));
        }
        let per_try = self
            .rule
            .retry
            .as_ref()
            .and_then(|r| r.per_try_timeout.as_ref())
            .or(timeouts.and_then(|t| t.backend_request.as_ref()));
        if self.rule.retry.is_some() || per_try.is_some() {
            let retry = self.rule.retry.as_ref();
            action.retry_policy = Some(RetryPolicy {
                retry_on: retry.map(|r| r.retry_on().join(",")).unwrap_or_default(),
                // Explicit: Envoy's default for an unset `num_retries` is 1.
                num_retries: Some(UInt32Value {
                    value: retry.map_or(0, |r| r.attempts.value),
                }),
                per_try_timeout: per_try.map(|d| pb_duration(d.value)),
                retriable_status_codes: retry.map(|r| r.codes()).unwrap_or_default(),
                retry_back_off: retry.and_then(|r| r.backoff.as_ref()).map(|b| {
                    envoy_types::pb::envoy::config::route::v3::retry_policy::RetryBackOff {
                        base_interval: Some(pb_duration(b.value)),
                        max_interval: None,
                    }
                }),
                ..Default::default()
            });
        }
        action.request_mirror_policies = self
            .mirrors
            .iter()
            .map(|(k, share)| RequestMirrorPolicy {
                cluster: names::cluster(k),
                runtime_fraction: (*share < 1_000_000).then(|| RuntimeFractionalPercent {
                    default_value: Some(FractionalPercent {
                        numerator: *share,
                        denominator: DenominatorType::Million as i32,
                    }),
                    runtime_key: String::new(),
                }),
                ..Default::default()
            })
            .collect();
        action.hash_policy = self
            .hash
            .iter()
            .map(|k| HashPolicy {
                policy_specifier: Some(match k {
                    HashKey::SourceIp => {
                        PolicySpecifier::ConnectionProperties(ConnectionProperties {
                            source_ip: true,
                        })
                    }
                    HashKey::Header(name) => PolicySpecifier::Header(HashHeader {
                        header_name: name.clone(),
                        regex_rewrite: None,
                    }),
                    HashKey::Cookie { name, ttl } => PolicySpecifier::Cookie(Cookie {
                        name: name.clone(),
                        ttl: ttl.map(pb_duration),
                        path: "/".to_owned(),
                        ..Default::default()
                    }),
                }),
                terminal: false,
            })
            .collect();
        action
    }
}

fn internal_error() -> Action {
    Action::DirectResponse(DirectResponseAction {
        status: 500,
        ..Default::default()
    })
}

fn string_matcher(type_: StringMatchType, value: &str) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(match type_ {
            StringMatchType::Exact => MatchPattern::Exact(value.to_owned()),
            StringMatchType::RegularExpression => MatchPattern::SafeRegex(regex(value)),
        }),
        ..Default::default()
    }
}

fn regex(value: &str) -> RegexMatcher {
    RegexMatcher {
        regex: value.to_owned(),
        ..Default::default()
    }
}

fn header_matcher(h: &HeaderMatch) -> HeaderMatcher {
    HeaderMatcher {
        name: h.name.value.to_ascii_lowercase(),
        header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(string_matcher(
            h.type_,
            &h.value.value,
        ))),
        ..Default::default()
    }
}

pub(crate) fn route_match(m: &HttpRouteMatch) -> RouteMatch {
    let value = m.path.value.as_str();
    let path_specifier = match m.path.type_ {
        PathMatchType::Exact => PathSpecifier::Path(value.to_owned()),
        PathMatchType::RegularExpression => PathSpecifier::SafeRegex(regex(value)),
        PathMatchType::PathPrefix => match trim_prefix(value) {
            "" => PathSpecifier::Prefix("/".to_owned()),
            p => PathSpecifier::PathSeparatedPrefix(p.to_owned()),
        },
    };
    let mut headers: Vec<HeaderMatcher> = m.headers.iter().map(header_matcher).collect();
    if let Some(method) = m.method {
        headers.push(HeaderMatcher {
            name: ":method".to_owned(),
            header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(string_matcher(
                StringMatchType::Exact,
                method.as_str(),
            ))),
            ..Default::default()
        });
    }
    RouteMatch {
        path_specifier: Some(path_specifier),
        headers,
        query_parameters: m
            .query_params
            .iter()
            .map(|q| QueryParameterMatcher {
                name: q.name.value.clone(),
                query_parameter_match_specifier: Some(QueryParameterMatchSpecifier::StringMatch(
                    string_matcher(q.type_, &q.value.value),
                )),
            })
            .collect(),
        ..Default::default()
    }
}

/// `set` overwrites (or adds), `add` appends.
fn headers_to_add(h: &HeaderModifier) -> Vec<HeaderValueOption> {
    let opt = |name: &str, value: &str, action: HeaderAppendAction| HeaderValueOption {
        header: Some(HeaderValue {
            key: name.to_owned(),
            value: value.to_owned(),
            ..Default::default()
        }),
        append_action: action as i32,
        ..Default::default()
    };
    h.set
        .iter()
        .map(|x| {
            opt(
                &x.name,
                &x.value,
                HeaderAppendAction::OverwriteIfExistsOrAdd,
            )
        })
        .chain(
            h.add
                .iter()
                .map(|x| opt(&x.name, &x.value, HeaderAppendAction::AppendIfExistsOrAdd)),
        )
        .collect()
}

fn redirect_action(r: &RequestRedirect, m: &HttpRouteMatch) -> RedirectAction {
    let response_code = match r.status_code.value {
        301 => RedirectResponseCode::MovedPermanently,
        303 => RedirectResponseCode::SeeOther,
        307 => RedirectResponseCode::TemporaryRedirect,
        308 => RedirectResponseCode::PermanentRedirect,
        _ => RedirectResponseCode::Found,
    };
    RedirectAction {
        scheme_rewrite_specifier: r
            .scheme
            .as_ref()
            .map(|s| SchemeRewriteSpecifier::SchemeRedirect(s.value.clone())),
        host_redirect: r
            .hostname
            .as_ref()
            .map(|h| h.value.clone())
            .unwrap_or_default(),
        port_redirect: r.port.as_ref().map_or(0, |p| p.value),
        response_code: response_code as i32,
        path_rewrite_specifier: match r.path.as_ref().and_then(|p| p.rewrite()) {
            Some(PathRewrite::FullPath(p)) => Some(PathRewriteSpecifier::PathRedirect(p.into())),
            Some(PathRewrite::PrefixMatch(rep)) => match prefix_rewrite(&m.path.value, rep) {
                Some(PrefixRewrite::Prefix(p)) => Some(PathRewriteSpecifier::PrefixRewrite(p)),
                Some(PrefixRewrite::Regex(re)) => Some(PathRewriteSpecifier::RegexRewrite(re)),
                None => None,
            },
            None => None,
        },
        ..Default::default()
    }
}

#[derive(Debug, PartialEq)]
enum PrefixRewrite {
    Prefix(String),
    Regex(RegexMatchAndSubstitute),
}

/// `ReplacePrefixMatch` of the segment prefix `matched` by `replacement`, without doubling or
/// losing the `/` between the replaced prefix and the rest of the path:
/// `/foo` → `/bar`: `/foo/x` → `/bar/x`; `/foo` → `/`: `/foo/x` → `/x`, `/foo` → `/`;
/// `/` → `/bar`: `/x` → `/bar/x`.
fn prefix_rewrite(matched: &str, replacement: &str) -> Option<PrefixRewrite> {
    let p = trim_prefix(matched);
    let r = replacement.trim_end_matches('/');
    match (p.is_empty(), r.is_empty()) {
        (true, true) => None,
        (true, false) => Some(PrefixRewrite::Prefix(format!("{r}/"))),
        (false, true) => Some(PrefixRewrite::Regex(RegexMatchAndSubstitute {
            pattern: Some(regex(&format!("^{}/*", regex_escape(p)))),
            substitution: "/".to_owned(),
        })),
        (false, false) => Some(PrefixRewrite::Prefix(r.to_owned())),
    }
}

/// `ReplaceFullPath`: the whole path (Envoy keeps the query string).
fn full_path_regex(path: &str) -> RegexMatchAndSubstitute {
    RegexMatchAndSubstitute {
        pattern: Some(regex("^/.*$")),
        substitution: path.replace('\\', "\\\\"),
    }
}

fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 4);
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Specificity of a Gateway listener hostname for picking the listener of a request host:
/// exact names beat wildcards, longer wildcards beat shorter ones, and no hostname comes last.
pub(crate) fn specificity(l: &Listener) -> (u8, usize) {
    match l.hostname() {
        None => (0, 0),
        Some(h) if h.starts_with('*') => (1, h.len()),
        Some(h) => (2, h.len()),
    }
}

pub(crate) fn listener_matches(l: &Listener, host: &str) -> bool {
    match l.hostname() {
        None => true,
        Some(lh) => lh == host || hostname_matches(lh, host),
    }
}

/// The hosts of one route configuration (filter chain) serving the Gateway `listeners` that a
/// route attached as `attachments` contributes to: every hostname it serves on one of these
/// listeners, except (when several listeners share the configuration) hostnames whose requests
/// belong to a more specific listener, as Gateway API specifies. `siblings` (HTTPS: more
/// specific listeners with chains of their own) only take hostnames away from this chain.
pub(crate) fn contributions<'a>(
    listeners: &[&Listener],
    siblings: &[&Listener],
    attachments: &'a [ListenerAttachment],
) -> Vec<&'a str> {
    let shared = listeners.len() > 1 || !siblings.is_empty();
    let mut out = Vec::new();
    for a in attachments {
        if !listeners.iter().any(|l| *l.name == a.listener) {
            continue;
        }
        for h in &a.hostnames {
            if shared {
                // Gateway API: a request belongs to the most specific listener matching its host.
                let best = listeners
                    .iter()
                    .chain(siblings)
                    .filter(|l| listener_matches(l, h))
                    .max_by_key(|l| specificity(l));
                if best.is_none_or(|l| *l.name != a.listener) {
                    continue;
                }
            }
            out.push(h.as_str());
        }
    }
    out
}

/// Hostnames of `listeners` that get a virtual host even without routes, so their requests
/// never fall through to a less specific listener sharing the route configuration.
pub(crate) fn fixed_hosts<'a>(listeners: &[&'a Listener]) -> impl Iterator<Item = &'a str> {
    let shared = listeners.len() > 1;
    listeners
        .iter()
        .filter(move |_| shared)
        .filter_map(|l| l.hostname())
}

/// Name of the catch-all virtual host of an HTTPS filter chain whose listener has a hostname.
pub(crate) const MISDIRECTED_VHOST: &str = "misdirected";

/// The catch-all (`*`) virtual host of an HTTPS filter chain selected by a listener hostname: a
/// request whose `:authority` is not this listener's (HTTP/2 connection coalescing, or a client
/// sending SNI `a` and `Host: b`) must not be served by this chain's routes, and Gateway API
/// (GEP-3567) wants `421 Misdirected Request` so the client retries on a new connection.
/// Encoded as a `RouteConfiguration.virtual_hosts` entry, like [`encode_virtual_host`].
/// `host` is `*` (named `misdirected`) or a more specific sibling listener's hostname (named
/// `misdirected/{host}`).
/// `vhds_name` replaces the name when the virtual host is served by VHDS.
pub(crate) fn encode_misdirected_host(host: &str, vhds_name: Option<&str>, out: &mut Vec<u8>) {
    let name = if let Some(n) = vhds_name {
        n.to_owned()
    } else if host == ballast_model::hostname::ANY_HOST {
        MISDIRECTED_VHOST.to_owned()
    } else {
        format!("{MISDIRECTED_VHOST}/{host}")
    };
    let vhost = VirtualHost {
        name,
        domains: vec![host.into()],
        routes: vec![Route {
            name: MISDIRECTED_VHOST.into(),
            r#match: Some(RouteMatch {
                path_specifier: Some(PathSpecifier::Prefix("/".into())),
                ..Default::default()
            }),
            action: Some(Action::DirectResponse(DirectResponseAction {
                status: 421,
                ..Default::default()
            })),
            ..Default::default()
        }],
        ..Default::default()
    };
    prost::encoding::message::encode(2, &vhost, out);
}

/// The virtual host of `host` with the Envoy routes of `routes`, in match precedence order
/// (a total order: it ends with the route key, rule and match indices).
/// Encodes the `RouteConfiguration.virtual_hosts` field for `host` into `out` — name, domain,
/// then every route in precedence order, exactly as prost encodes `VirtualHost { name, domains:
/// [host], routes, ..Default::default() }` — and returns the clusters its routes send to, sorted.
/// `extra`: fields after the routes (the `typed_per_filter_config` of a listener's
/// SecurityPolicy, [`crate::security`]).
/// `vhds_name` replaces the name when the virtual host is served by VHDS.
/// `redirect_port`: the listener port redirects without scheme and port keep (0 when it is
/// the protocol's well-known port).
pub(crate) fn encode_virtual_host<'a>(
    host: &str,
    vhds_name: Option<&str>,
    routes: impl Iterator<Item = &'a Arc<TranslatedRoute>>,
    extra: &[u8],
    redirect_port: u32,
    out: &mut Vec<u8>,
) -> Vec<Arc<str>> {
    let mut entries: Vec<&RouteEntry> = routes.flat_map(|t| &t.entries).collect();
    entries.sort_by(|a, b| a.precedence.cmp(&b.precedence));
    let bytes: Vec<std::borrow::Cow<'_, [u8]>> = entries
        .iter()
        .map(|e| e.encoded_for(redirect_port))
        .collect();
    // Fields 1 (name) and 2 (domains) come before 3 (routes).
    let head = VirtualHost {
        name: vhds_name.unwrap_or(host).to_owned(),
        domains: vec![host.to_owned()],
        ..Default::default()
    };
    let len = head.encoded_len() + bytes.iter().map(|b| b.len()).sum::<usize>() + extra.len();
    out.reserve(len + 8);
    prost::encoding::encode_key(2, prost::encoding::WireType::LengthDelimited, out);
    prost::encoding::encode_varint(len as u64, out);
    head.encode_raw(out);
    for b in &bytes {
        out.extend_from_slice(b);
    }
    out.extend_from_slice(extra);
    let mut clusters: Vec<Arc<str>> = entries
        .iter()
        .flat_map(|e| e.clusters.iter().cloned())
        .collect();
    clusters.sort();
    clusters.dedup();
    clusters
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_rewrites_keep_one_slash() {
        assert_eq!(
            prefix_rewrite("/foo", "/bar"),
            Some(PrefixRewrite::Prefix("/bar".into()))
        );
        assert_eq!(
            prefix_rewrite("/foo/", "/bar/"),
            Some(PrefixRewrite::Prefix("/bar".into()))
        );
        assert_eq!(
            prefix_rewrite("/", "/bar"),
            Some(PrefixRewrite::Prefix("/bar/".into()))
        );
        assert_eq!(prefix_rewrite("/", "/"), None);
        assert_eq!(
            prefix_rewrite("/a.b", "/"),
            Some(PrefixRewrite::Regex(RegexMatchAndSubstitute {
                pattern: Some(regex("^/a\\.b/*")),
                substitution: "/".into()
            }))
        );
    }
}

#[cfg(test)]
mod signature_tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    fn item() -> impl Strategy<Value = Option<(ObjectKey, Option<HashKey>)>> {
        // Few, short names: equal lists come up often, and names that run into each other
        // ("a"+"ab" vs "aa"+"b") too.
        let name = "[ab]{0,3}";
        let hash = prop_oneof![
            Just(None),
            Just(Some(HashKey::SourceIp)),
            name.prop_map(|h| Some(HashKey::Header(h))),
            (name, proptest::option::of((0u64..3, 0u32..3))).prop_map(|(name, ttl)| Some(
                HashKey::Cookie {
                    name,
                    ttl: ttl.map(|(s, n)| Duration::new(s, n)),
                }
            )),
        ];
        proptest::option::of((name, name, hash).prop_map(|(ns, n, h)| (ObjectKey::new(ns, n), h)))
    }

    proptest! {
        /// The encoded signature is equal exactly when the list it encodes is: the route cache
        /// (`Caches::route`) keeps a translation only while it is.
        #[test]
        fn encoded_signatures_are_equal_exactly_when_the_lists_are(
            a in proptest::collection::vec(item(), 0..4),
            b in proptest::collection::vec(item(), 0..4),
        ) {
            let (ea, eb) = (encode_signature(a.clone().into_iter()), encode_signature(b.clone().into_iter()));
            prop_assert_eq!(ea == eb, a == b);
            prop_assert_eq!(&ea, &encode_signature(a.into_iter()));
        }
    }
}
