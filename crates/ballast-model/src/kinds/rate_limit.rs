//! `ballast.dev/v1alpha1` `RateLimitPolicy`: request rate limits on the Gateways and HTTPRoutes
//! it targets, enforced by Envoy alone (`local`: token buckets in each Envoy) or by a rate-limit
//! service (`global`: Envoy's `envoy.service.ratelimit.v3.RateLimitService` protocol, served by a
//! Backend, e.g. envoyproxy/ratelimit).
//!
//! A kind of its own rather than a field of an existing one: BackendPolicy targets Backends and
//! ClientPolicy Gateway listeners, while rate limits are about *routes* (Envoy Gateway puts them
//! in `BackendTrafficPolicy.rateLimit`, which targets Gateways and HTTPRoutes). Field names follow
//! Envoy Gateway's `rateLimit` (`rules`, `clientSelectors`, `limit.requests/unit`).
//!
//! A policy naming an HTTPRoute applies to that route instead of a policy naming its Gateway
//! (most specific wins, settings not merged); see docs/policies.md.

use std::time::Duration;

use serde::Deserialize;

use super::policy::{PolicyTargetRef, TargetKind, validate_target_refs};
use super::{BALLAST_GROUP, Metadata, ObjectKey, Source, object_kind};
use crate::ConfigSet;
use crate::attach::{AttachPoint, Resolution, TargetId};
use crate::duration::de_opt_duration;
use crate::spanned::{Pos, Spanned};
use crate::validate::Ctx;

#[derive(Clone, Debug)]
pub struct RateLimitPolicy {
    pub metadata: Metadata,
    pub spec: RateLimitPolicySpec,
    pub source: Source,
}
object_kind!(RateLimitPolicy, super::Kind::RateLimitPolicy);

/// What a RateLimitPolicy may target (whole objects: no `sectionName`).
pub const RATE_LIMIT_POLICY_TARGETS: [TargetKind; 2] = [TargetKind::Gateway, TargetKind::HttpRoute];

/// Default `global.domain`: the key space of the rate-limit service's configuration.
pub const DEFAULT_RATE_LIMIT_DOMAIN: &str = "ballast";

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RateLimitPolicySpec {
    pub target_refs: Vec<PolicyTargetRef>,
    /// Token buckets kept by each Envoy (not shared between Envoys).
    #[serde(default)]
    pub local: Option<LocalRateLimit>,
    /// Limits decided by a rate-limit service (shared by every Envoy asking it).
    #[serde(default)]
    pub global: Option<GlobalRateLimit>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LocalRateLimit {
    pub rules: Vec<RateLimitRule>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GlobalRateLimit {
    /// The rate-limit service: a Ballast Backend speaking HTTP/2 (`protocol: grpc`).
    pub backend_ref: RateLimitBackendRef,
    /// The `domain` Envoy sends (the service's config namespace); default `ballast`.
    #[serde(default)]
    pub domain: Option<Spanned<String>>,
    /// Deny requests (500) when the service cannot be asked; default false: allow them.
    #[serde(default)]
    pub failure_mode_deny: bool,
    /// How long Envoy waits for the service (Envoy's default 20ms).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub timeout: Option<Spanned<Duration>>,
    pub rules: Vec<RateLimitRule>,
}

/// A Backend in the policy's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RateLimitBackendRef {
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub kind: Option<Spanned<String>>,
    pub name: Spanned<String>,
}

/// One limit: requests matching every `clientSelectors` entry count against it. Without
/// selectors the rule is one bucket for the whole target.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RateLimitRule {
    /// The rule's descriptor value (`generic_key`); default `{namespace}/{policy}/{index}`.
    /// Global rules are matched by it in the rate-limit service's configuration.
    #[serde(default)]
    pub name: Option<Spanned<String>>,
    #[serde(default)]
    pub client_selectors: Vec<ClientSelector>,
    /// Required for local rules; for global rules the service decides (the field is then
    /// rejected, so nobody believes Ballast enforces it).
    #[serde(default)]
    pub limit: Option<RateLimitValue>,
}

/// Which requests a rule counts, and how they are split into buckets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientSelector {
    #[serde(default)]
    pub headers: Vec<HeaderSelector>,
    /// `{ type: Distinct }`: one bucket per client address.
    #[serde(default, rename = "sourceCIDR")]
    pub source_cidr: Option<SourceSelector>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HeaderSelector {
    pub name: Spanned<String>,
    /// `Exact` (default; needs `value`): only requests with this value count. `Distinct`: one
    /// bucket per value of the header. Requests without the header never count.
    #[serde(default, rename = "type")]
    pub type_: SelectorType,
    #[serde(default)]
    pub value: Option<Spanned<String>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SourceSelector {
    #[serde(rename = "type")]
    pub type_: Spanned<SelectorType>,
    /// Only `0.0.0.0/0` / `::/0` (all clients) is supported so far.
    #[serde(default)]
    pub value: Option<Spanned<String>>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum SelectorType {
    #[default]
    Exact,
    Distinct,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RateLimitValue {
    pub requests: Spanned<u32>,
    pub unit: RateLimitUnit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum RateLimitUnit {
    Second,
    Minute,
    Hour,
    Day,
}

impl RateLimitUnit {
    pub fn duration(self) -> Duration {
        Duration::from_secs(match self {
            RateLimitUnit::Second => 1,
            RateLimitUnit::Minute => 60,
            RateLimitUnit::Hour => 3600,
            RateLimitUnit::Day => 86_400,
        })
    }
}

impl RateLimitRule {
    /// The descriptor value naming rule `index` of policy `policy`.
    pub fn descriptor_value(&self, policy: &ObjectKey, index: usize) -> String {
        match &self.name {
            Some(n) => n.value.clone(),
            None => format!("{}/{}/{index}", policy.namespace, policy.name),
        }
    }
}

impl GlobalRateLimit {
    pub fn domain(&self) -> &str {
        self.domain
            .as_ref()
            .map_or(DEFAULT_RATE_LIMIT_DOMAIN, |d| d.as_str())
    }

    /// The Backend key of the service, for a policy in `namespace`.
    pub fn backend_key(&self, namespace: &str) -> ObjectKey {
        ObjectKey::new(namespace, self.backend_ref.name.as_str())
    }
}

pub(crate) fn validate_rate_limit_policy(ctx: &mut Ctx, p: &RateLimitPolicy) {
    crate::validate::metadata(ctx, &p.metadata);
    let s = &p.spec;
    validate_target_refs(ctx, &s.target_refs, &RATE_LIMIT_POLICY_TARGETS);
    for (i, r) in s.target_refs.iter().enumerate() {
        if let Some(sec) = &r.section_name {
            ctx.err(
                sec.pos,
                format!("spec.targetRefs[{i}].sectionName"),
                "not supported by RateLimitPolicy; target the whole Gateway or HTTPRoute",
            );
        }
    }
    if s.local.is_none() && s.global.is_none() {
        ctx.err(Pos::UNKNOWN, "spec", "needs `local` or `global` (or both)");
    }
    if let Some(l) = &s.local {
        validate_rules(ctx, "spec.local", &l.rules, true);
    }
    if let Some(g) = &s.global {
        let f = "spec.global.backendRef";
        let group = g.backend_ref.group.as_deref().unwrap_or(BALLAST_GROUP);
        let kind = g
            .backend_ref
            .kind
            .as_ref()
            .map_or("Backend", |k| k.as_str());
        if group != BALLAST_GROUP || kind != "Backend" {
            let pos = g
                .backend_ref
                .kind
                .as_ref()
                .map_or(g.backend_ref.name.pos, |k| k.pos);
            ctx.err(
                pos,
                f,
                format!("must name a Backend (group {BALLAST_GROUP}), not {group:?}/{kind}"),
            );
        }
        if let Some(d) = &g.domain
            && d.is_empty()
        {
            ctx.err(d.pos, "spec.global.domain", "must not be empty");
        }
        if let Some(t) = &g.timeout
            && t.is_zero()
        {
            ctx.err(t.pos, "spec.global.timeout", "must be greater than 0");
        }
        validate_rules(ctx, "spec.global", &g.rules, false);
    }
}

fn validate_rules(ctx: &mut Ctx, at: &str, rules: &[RateLimitRule], local: bool) {
    if rules.is_empty() {
        ctx.err(
            Pos::UNKNOWN,
            format!("{at}.rules"),
            "needs at least one rule",
        );
    }
    for (i, r) in rules.iter().enumerate() {
        let f = format!("{at}.rules[{i}]");
        if let Some(n) = &r.name
            && n.is_empty()
        {
            ctx.err(n.pos, format!("{f}.name"), "must not be empty");
        }
        match (&r.limit, local) {
            (None, true) => ctx.err(
                Pos::UNKNOWN,
                format!("{f}.limit"),
                "a local rule needs `limit: { requests, unit }`",
            ),
            (Some(l), false) => ctx.err(
                l.requests.pos,
                format!("{f}.limit"),
                "global limits are configured in the rate-limit service (keyed by domain and \
                 descriptors), not here; remove `limit`",
            ),
            (Some(l), true) if l.requests.value == 0 => ctx.err(
                l.requests.pos,
                format!("{f}.limit.requests"),
                "must be at least 1",
            ),
            _ => {}
        }
        for (j, c) in r.client_selectors.iter().enumerate() {
            let f = format!("{f}.clientSelectors[{j}]");
            if c.headers.is_empty() && c.source_cidr.is_none() {
                ctx.err(Pos::UNKNOWN, f.clone(), "needs `headers` or `sourceCIDR`");
            }
            for (k, h) in c.headers.iter().enumerate() {
                let f = format!("{f}.headers[{k}]");
                if h.name.is_empty() || !h.name.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
                    ctx.err(h.name.pos, format!("{f}.name"), "not a valid header name");
                }
                match (h.type_, &h.value) {
                    (SelectorType::Exact, None) => ctx.err(
                        h.name.pos,
                        format!("{f}.value"),
                        "type Exact needs a value (or use type: Distinct)",
                    ),
                    (SelectorType::Distinct, Some(v)) => ctx.err(
                        v.pos,
                        format!("{f}.value"),
                        "type Distinct takes no value (one bucket per value of the header)",
                    ),
                    _ => {}
                }
            }
            if let Some(sc) = &c.source_cidr {
                if sc.type_.value != SelectorType::Distinct {
                    ctx.err(
                        sc.type_.pos,
                        format!("{f}.sourceCIDR.type"),
                        "only Distinct (one bucket per client address) is supported",
                    );
                }
                if let Some(v) = &sc.value
                    && !matches!(v.as_str(), "0.0.0.0/0" | "::/0")
                {
                    ctx.err(
                        v.pos,
                        format!("{f}.sourceCIDR.value"),
                        format!(
                            "{:?} is not supported; only 0.0.0.0/0 or ::/0 (all clients)",
                            v.value
                        ),
                    );
                }
            }
        }
    }
}

impl ConfigSet {
    /// Policy attachment of every RateLimitPolicy: Gateways and HTTPRoutes.
    pub fn rate_limit_resolution(&self) -> Resolution {
        crate::attach::resolve(
            self.rate_limit_policies
                .iter()
                .map(|(k, p)| (k, p.spec.target_refs.as_slice())),
            |p| {
                let found = match p.target.kind {
                    TargetKind::Gateway => self.gateways.contains_key(&p.target.key),
                    TargetKind::HttpRoute => self.http_routes.contains_key(&p.target.key),
                    _ => false,
                };
                if found {
                    Ok(())
                } else {
                    Err(format!("{} {} not found", p.target.kind, p.target.key))
                }
            },
        )
    }

    /// The RateLimitPolicy applying to `target` itself (the oldest naming it), ignoring
    /// policies of other levels: O(policies in the namespace).
    pub fn rate_limit_policy_for(
        &self,
        kind: TargetKind,
        target: &ObjectKey,
    ) -> Option<&std::sync::Arc<RateLimitPolicy>> {
        let ns = ObjectKey::new(target.namespace.as_str(), "");
        self.rate_limit_policies
            .range(ns..)
            .take_while(|(k, _)| k.namespace == target.namespace)
            .map(|(_, p)| p)
            .find(|p| {
                p.spec.target_refs.iter().any(|r| {
                    r.target_kind() == Some(kind)
                        && *r.name == target.name
                        && r.section_name.is_none()
                })
            })
    }

    /// The RateLimitPolicies in effect on Gateway `gw`: its own (if any), and the applying
    /// policies of the HTTPRoutes whose parentRefs name it (by key).
    pub fn rate_limit_policies_on(
        &self,
        gw: &ObjectKey,
    ) -> (
        Option<std::sync::Arc<RateLimitPolicy>>,
        Vec<std::sync::Arc<RateLimitPolicy>>,
    ) {
        let own = self.rate_limit_policy_for(TargetKind::Gateway, gw).cloned();
        let mut routes = Vec::new();
        for p in self.rate_limit_policies.values() {
            let ns = p.metadata.namespace.as_str();
            let here = p.spec.target_refs.iter().any(|r| {
                r.target_kind() == Some(TargetKind::HttpRoute) && {
                    let rk = ObjectKey::new(ns, r.name.as_str());
                    self.http_routes.get(&rk).is_some_and(|route| {
                        route_names_gateway(route, gw)
                            && self
                                .rate_limit_policy_for(TargetKind::HttpRoute, &rk)
                                .is_some_and(|w| std::sync::Arc::ptr_eq(w, p))
                    })
                }
            });
            if here {
                routes.push(p.clone());
            }
        }
        (own, routes)
    }

    /// The policy whose `global` service settings (Backend, failure mode, timeout, domain)
    /// Gateway `gw`'s connection manager uses: its own policy's, else the first (by key)
    /// route policy's, among those with a usable service.
    pub fn rate_limit_service_policy(
        &self,
        gw: &ObjectKey,
    ) -> Option<std::sync::Arc<RateLimitPolicy>> {
        let (own, routes) = self.rate_limit_policies_on(gw);
        own.into_iter()
            .chain(routes)
            .filter(|p| p.spec.global.is_some())
            .find(|p| self.rate_limit_service_problem(p).is_ok())
    }

    /// Why a RateLimitPolicy's service Backend cannot be used, if it cannot.
    pub fn rate_limit_service_problem(&self, p: &RateLimitPolicy) -> Result<(), String> {
        let Some(g) = &p.spec.global else {
            return Ok(());
        };
        let key = g.backend_key(&p.metadata.namespace);
        match self.backends.get(&key) {
            None => Err(format!("Backend {key} not found")),
            Some(b) if b.spec.upstream_protocol() != super::UpstreamProtocol::Http2 => Err(
                format!("Backend {key} must speak gRPC: set `protocol: grpc` on it"),
            ),
            Some(_) => Ok(()),
        }
    }
}

/// Whether a parentRef of `route` names Gateway `gw`.
fn route_names_gateway(route: &super::HttpRoute, gw: &ObjectKey) -> bool {
    let ns = route.metadata.namespace.as_str();
    route
        .spec
        .parent_refs
        .iter()
        .any(|p| p.is_gateway() && p.namespace_or(ns) == gw.namespace && *p.name == gw.name)
}

/// Why `p` (with a usable global service) on HTTPRoute `route` cannot have its own service
/// settings: a Gateway of the route calls another service (or with another failure mode or
/// timeout), chosen by [`ConfigSet::rate_limit_service_policy`].
fn service_conflict(set: &ConfigSet, p: &RateLimitPolicy, route: &ObjectKey) -> Option<String> {
    let g = p.spec.global.as_ref()?;
    set.rate_limit_service_problem(p).ok()?;
    let r = set.http_routes.get(route)?;
    let ns = r.metadata.namespace.as_str();
    let settings = |q: &RateLimitPolicy| {
        let g = q
            .spec
            .global
            .as_ref()
            .expect("service policies have global");
        (
            g.backend_key(&q.metadata.namespace),
            g.failure_mode_deny,
            g.timeout.as_ref().map(|t| t.value),
        )
    };
    let mine = (
        g.backend_key(&p.metadata.namespace),
        g.failure_mode_deny,
        g.timeout.as_ref().map(|t| t.value),
    );
    r.spec
        .parent_refs
        .iter()
        .filter(|pr| pr.is_gateway())
        .map(|pr| ObjectKey::new(pr.namespace_or(ns), pr.name.as_str()))
        .filter(|gw| set.gateways.contains_key(gw))
        .find_map(|gw| {
            let svc = set.rate_limit_service_policy(&gw)?;
            let theirs = settings(&svc);
            (theirs != mine).then(|| {
                format!(
                    "Gateway {gw} calls rate-limit service {} (failureModeDeny {}) as policy {} says;                      one service per Gateway: this policy's global rules go there",
                    theirs.0,
                    theirs.1,
                    svc.key()
                )
            })
        })
}

/// Per policy and target: `Accepted` from attachment, plus `ResolvedRefs=False` when the
/// global service Backend cannot be used, and `Accepted=False ServiceConflict` on an
/// HTTPRoute whose Gateway uses another policy's service settings.
pub(crate) fn statuses(set: &ConfigSet) -> Vec<crate::status::PolicyStatus> {
    let mut out = crate::status::policy_statuses(
        super::Kind::RateLimitPolicy,
        &set.rate_limit_resolution(),
        |k| {
            set.rate_limit_policies
                .get(k)
                .map(|p| p.source.to_string())
                .unwrap_or_default()
        },
        |k| match set.rate_limit_policies.get(k) {
            Some(p) => set.rate_limit_service_problem(p),
            None => Ok(()),
        },
    );
    for c in out
        .iter_mut()
        .flat_map(|p| &mut p.targets)
        .flat_map(|t| &mut t.conditions)
        .filter(|c| c.type_ == "ResolvedRefs")
    {
        c.reason = "InvalidBackendRef".to_owned();
    }
    for ps in &mut out {
        let Some(p) = set
            .rate_limit_policies
            .get(&ObjectKey::new(ps.namespace.as_str(), ps.name.as_str()))
        else {
            continue;
        };
        for t in ps.targets.iter_mut().filter(|t| t.kind == "HTTPRoute") {
            let route = ObjectKey::new(t.namespace.as_str(), t.name.as_str());
            if let Some(m) = service_conflict(set, p, &route) {
                t.conditions.push(crate::status::Condition {
                    type_: "Accepted".to_owned(),
                    status: crate::status::ConditionStatus::False,
                    reason: "ServiceConflict".to_owned(),
                    message: m,
                });
            }
        }
    }
    out
}

/// The attach point of a whole target (for [`Resolution::effective`]).
pub fn rate_limit_target(kind: TargetKind, key: &ObjectKey) -> AttachPoint {
    AttachPoint {
        target: TargetId {
            kind,
            key: key.clone(),
        },
        section: None,
    }
}

#[cfg(test)]
mod tests {
    use crate::{ConfigSet, parse_file};

    fn errors(yaml: &str) -> Vec<String> {
        match parse_file("rl.yaml", yaml) {
            Ok(_) => Vec::new(),
            Err(es) => es.iter().map(|e| e.to_string()).collect(),
        }
    }

    const HEAD: &str = "apiVersion: ballast.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: { name: p }\nspec:\n  targetRefs: [{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: r }]\n";

    #[test]
    fn valid_local_and_global_parse() {
        let y = format!(
            "{HEAD}  local:\n    rules:\n    - limit: {{ requests: 10, unit: Hour }}\n    - clientSelectors: [{{ headers: [{{ name: x-user, type: Distinct }}] }}]\n      limit: {{ requests: 5, unit: Minute }}\n  global:\n    backendRef: {{ name: rls }}\n    rules:\n    - clientSelectors: [{{ sourceCIDR: {{ type: Distinct }} }}]\n"
        );
        assert_eq!(errors(&y), Vec::<String>::new());
    }

    #[test]
    fn bad_input_is_reported_with_positions() {
        let cases = [
            (
                format!("{HEAD}  local:\n    rules:\n    - limit: {{ requests: 0, unit: Hour }}\n"),
                "rl.yaml:8:26",
                "limit.requests",
            ),
            (
                format!("{HEAD}  local:\n    rules:\n    - limit: {{ requests: 3, unit: Fortnight }}\n"),
                "rl.yaml:8:35",
                "Fortnight",
            ),
            (
                format!("{HEAD}  local:\n    rules:\n    - clientSelectors: [{{ headers: [{{ name: x-user }}] }}]\n      limit: {{ requests: 1, unit: Hour }}\n"),
                "rl.yaml:8:45",
                "type Exact needs a value",
            ),
            (
                format!("{HEAD}  global:\n    backendRef: {{ name: rls }}\n    rules:\n    - limit: {{ requests: 3, unit: Hour }}\n"),
                "rl.yaml:9:26",
                "configured in the rate-limit service",
            ),
            (
                format!("{HEAD}  local:\n    rules:\n    - clientSelectors: [{{ sourceCIDR: {{ type: Exact }} }}]\n      limit: {{ requests: 1, unit: Hour }}\n"),
                "rl.yaml:8:47",
                "only Distinct",
            ),
            (HEAD.to_owned(), "rl.yaml:1:1", "needs `local` or `global`"),
            (
                "apiVersion: ballast.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: { name: p }\nspec:\n  targetRefs: [{ group: ballast.dev, kind: Backend, name: b }]\n  local: { rules: [{ limit: { requests: 1, unit: Hour } }] }\n".to_owned(),
                "rl.yaml:5:44",
                "cannot target",
            ),
        ];
        for (yaml, at, what) in cases {
            let es = errors(&yaml);
            assert!(
                es.iter().any(|e| e.starts_with(at) && e.contains(what)),
                "expected {at} ... {what} in {es:#?}"
            );
        }
    }

    /// Two route policies on one Gateway naming different services: the Gateway's filter
    /// calls the first's, and the second reports the conflict on its route.
    #[test]
    fn second_service_on_a_gateway_is_reported() {
        let route = |n: &str| {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: {n} }}\nspec:\n  parentRefs: [{{ name: gw }}]\n  rules: [{{ backendRefs: [{{ group: ballast.dev, kind: Backend, name: b }}] }}]\n"
            )
        };
        let svc = |n: &str| {
            format!(
                "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {{ name: {n} }}\nspec:\n  protocol: grpc\n  endpoints: [{{ address: 127.0.0.1, port: 1 }}]\n"
            )
        };
        let policy = |n: &str, r: &str, s: &str| {
            format!(
                "apiVersion: ballast.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {{ name: {n} }}\nspec:\n  targetRefs: [{{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: {r} }}]\n  global: {{ backendRef: {{ name: {s} }}, rules: [{{}}] }}\n"
            )
        };
        let docs = [
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: gw }\nspec:\n  gatewayClassName: ballast\n  listeners: [{ name: http, port: 10000, protocol: HTTP }]\n".to_owned(),
            route("r1"),
            route("r2"),
            svc("rls-a"),
            svc("rls-b"),
            policy("p1", "r1", "rls-a"),
            policy("p2", "r2", "rls-b"),
        ];
        let set = ConfigSet::build([("a.yaml", docs.join("---\n"))]).unwrap();
        let gw = crate::ObjectKey::new("default", "gw");
        assert_eq!(
            set.rate_limit_service_policy(&gw)
                .map(|p| p.metadata.name.clone()),
            Some("p1".to_owned())
        );
        let status = crate::status::compute(&set);
        let applied: Vec<Vec<String>> = status
            .rate_limit_policies
            .iter()
            .map(|p| p.applied_to())
            .collect();
        assert_eq!(applied, [vec!["HTTPRoute default/r1".to_owned()], vec![]]);
        let problems = status.problems().join("\n");
        assert!(
            problems.contains("RateLimitPolicy default/p2")
                && problems.contains("ServiceConflict")
                && problems.contains("calls rate-limit service default/rls-a"),
            "{problems}"
        );
    }

    #[test]
    fn route_policy_beats_gateway_policy_and_status_lists_targets() {
        let set = ConfigSet::build([(
            "a.yaml",
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: gw }\nspec:\n  gatewayClassName: ballast\n  listeners: [{ name: http, port: 10000, protocol: HTTP }]\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: { name: r }\nspec:\n  parentRefs: [{ name: gw }]\n  rules: [{ backendRefs: [{ group: ballast.dev, kind: Backend, name: b }] }]\n---\napiVersion: ballast.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: { name: a-gw }\nspec:\n  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: gw }, { group: gateway.networking.k8s.io, kind: HTTPRoute, name: missing }]\n  local: { rules: [{ limit: { requests: 1, unit: Hour } }] }\n---\napiVersion: ballast.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: { name: b-route }\nspec:\n  targetRefs: [{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: r }]\n  global: { backendRef: { name: nope }, rules: [{}] }\n",
        )])
        .unwrap();
        let route = crate::ObjectKey::new("default", "r");
        let gw = crate::ObjectKey::new("default", "gw");
        use crate::TargetKind;
        assert_eq!(
            set.rate_limit_policy_for(TargetKind::HttpRoute, &route)
                .map(|p| p.metadata.name.as_str()),
            Some("b-route")
        );
        assert_eq!(
            set.rate_limit_policy_for(TargetKind::Gateway, &gw)
                .map(|p| p.metadata.name.as_str()),
            Some("a-gw")
        );
        let status = crate::status::compute(&set);
        let s = serde_json::to_string(&status.rate_limit_policies).unwrap();
        assert!(s.contains("TargetNotFound"), "{s}");
        assert!(s.contains("HTTPRoute default/missing not found"), "{s}");
        assert!(s.contains("Backend default/nope not found"), "{s}");
        let applied: Vec<String> = status
            .rate_limit_policies
            .iter()
            .flat_map(|p| p.applied_to())
            .collect();
        // b-route's service does not resolve, so it applies nowhere.
        assert_eq!(applied, ["Gateway default/gw"]);
    }
}
