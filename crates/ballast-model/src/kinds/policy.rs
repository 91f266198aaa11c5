//! Ballast's policy kinds (`ballast.dev/v1alpha1`), attached to other objects with Gateway API
//! policy attachment (GEP-713): a policy names its targets in `spec.targetRefs` (same namespace
//! as the policy), optionally narrowed by `sectionName`; [`crate::attach`] decides which policy
//! applies where.
//!
//! - [`BackendPolicy`]: how Envoy talks to a Backend (or, once the kind exists, a Service):
//!   circuit breakers, outlier detection, active health checks, load balancing, slow start and
//!   retry budgets. Field names follow Envoy Gateway's `BackendTrafficPolicy` where it has the
//!   same feature, so users of either find their way.
//!
//! Validation lives here (not in `validate.rs`) so each policy kind is one file.

use std::time::Duration;

use serde::Deserialize;

use super::{BALLAST_GROUP, GATEWAY_GROUP, Metadata, Source, object_kind};
use crate::duration::{de_duration, de_opt_duration};
use crate::spanned::{Pos, Spanned};
use crate::validate::Ctx;

/// GEP-713 `LocalPolicyTargetReferenceWithSectionName`: the target is in the policy's own
/// namespace.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PolicyTargetRef {
    /// `ballast.dev` for a Backend, `""` (core) for a Service, `gateway.networking.k8s.io` for a
    /// Gateway or HTTPRoute.
    #[serde(default)]
    pub group: String,
    pub kind: Spanned<String>,
    pub name: Spanned<String>,
    /// A Gateway listener name, a Service port name; none: the whole target.
    #[serde(default)]
    pub section_name: Option<Spanned<String>>,
}

/// The kinds a policy may target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum TargetKind {
    Gateway,
    #[serde(rename = "HTTPRoute")]
    HttpRoute,
    Backend,
    Service,
}

impl TargetKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TargetKind::Gateway => "Gateway",
            TargetKind::HttpRoute => "HTTPRoute",
            TargetKind::Backend => "Backend",
            TargetKind::Service => "Service",
        }
    }

    pub fn group(self) -> &'static str {
        match self {
            TargetKind::Gateway | TargetKind::HttpRoute => GATEWAY_GROUP,
            TargetKind::Backend => BALLAST_GROUP,
            TargetKind::Service => "",
        }
    }

    /// The kind a `(group, kind)` pair names, if any.
    pub fn from_ref(group: &str, kind: &str) -> Option<TargetKind> {
        [
            TargetKind::Gateway,
            TargetKind::HttpRoute,
            TargetKind::Backend,
            TargetKind::Service,
        ]
        .into_iter()
        .find(|k| k.group() == group && k.as_str() == kind)
    }
}

impl std::fmt::Display for TargetKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PolicyTargetRef {
    pub fn target_kind(&self) -> Option<TargetKind> {
        TargetKind::from_ref(&self.group, &self.kind)
    }
}

/// Checks `targetRefs`: at least one, each of a kind in `allowed`, no duplicates.
pub(crate) fn validate_target_refs(
    ctx: &mut Ctx,
    refs: &[PolicyTargetRef],
    allowed: &[TargetKind],
) {
    if refs.is_empty() {
        ctx.err(
            Pos::UNKNOWN,
            "spec.targetRefs",
            "a policy needs at least one targetRef",
        );
    }
    let mut seen: Vec<(&str, &str, &str, Option<&str>)> = Vec::new();
    for (i, r) in refs.iter().enumerate() {
        let f = format!("spec.targetRefs[{i}]");
        match r.target_kind() {
            Some(k) if allowed.contains(&k) => {}
            _ => ctx.err(
                r.kind.pos,
                format!("{f}.kind"),
                format!(
                    "cannot target {:?} (group {:?}); this policy targets {}",
                    r.kind.value,
                    r.group,
                    allowed
                        .iter()
                        .map(|k| format!("{}/{}", display_group(k.group()), k.as_str()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
        }
        let id = (
            r.group.as_str(),
            r.kind.as_str(),
            r.name.as_str(),
            r.section_name.as_ref().map(|s| s.as_str()),
        );
        if let Some(j) = seen.iter().position(|s| *s == id) {
            ctx.err(
                r.name.pos,
                f.clone(),
                format!("duplicate targetRef (also spec.targetRefs[{j}])"),
            );
        }
        seen.push(id);
    }
}

fn display_group(g: &str) -> &str {
    if g.is_empty() { "core" } else { g }
}

/// `ballast.dev/v1alpha1` `BackendPolicy`: connection and load-balancing behaviour towards the
/// Backends (Services) it targets. Settings given here replace the Backend's own
/// `loadBalancer` / `healthCheck`.
#[derive(Clone, Debug)]
pub struct BackendPolicy {
    pub metadata: Metadata,
    pub spec: BackendPolicySpec,
    pub source: Source,
}
object_kind!(BackendPolicy, super::Kind::BackendPolicy);

/// What a BackendPolicy may target.
pub const BACKEND_POLICY_TARGETS: [TargetKind; 2] = [TargetKind::Backend, TargetKind::Service];

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackendPolicySpec {
    pub target_refs: Vec<PolicyTargetRef>,
    #[serde(default)]
    pub circuit_breaker: Option<CircuitBreaker>,
    #[serde(default)]
    pub health_check: Option<PolicyHealthCheck>,
    #[serde(default)]
    pub load_balancer: Option<PolicyLoadBalancer>,
    #[serde(default)]
    pub retry_budget: Option<RetryBudget>,
    /// TLS towards the backend beyond what BackendTLSPolicy standardises.
    #[serde(default)]
    pub tls: Option<BackendPolicyTls>,
}

/// Ballast's TLS extras for backends; server validation is `BackendTLSPolicy`'s job.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackendPolicyTls {
    /// A TLS Secret (in the policy's namespace) Envoy presents as its client certificate:
    /// mutual TLS to backends. Only used where a BackendTLSPolicy enables TLS.
    pub client_certificate_ref: super::SecretObjectRef,
}

/// Envoy circuit breaker thresholds (default priority). Unset fields keep Envoy's defaults
/// (1024 each; 3 parallel retries).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CircuitBreaker {
    #[serde(default)]
    pub max_connections: Option<Spanned<u32>>,
    #[serde(default)]
    pub max_pending_requests: Option<Spanned<u32>>,
    #[serde(default)]
    pub max_parallel_requests: Option<Spanned<u32>>,
    #[serde(default)]
    pub max_parallel_retries: Option<Spanned<u32>>,
    /// Closes a connection after this many requests (Envoy's `max_requests_per_connection`).
    #[serde(default)]
    pub max_requests_per_connection: Option<Spanned<u32>>,
}

/// Limits retries to a share of active requests instead of a fixed count (Envoy
/// `retry_budget`); replaces `circuitBreaker.maxParallelRetries`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RetryBudget {
    /// Percent of active requests that may be retries (Envoy default 20).
    #[serde(default)]
    pub budget_percent: Option<Spanned<u32>>,
    /// Retries always allowed, whatever the active requests (Envoy default 3).
    #[serde(default)]
    pub min_retry_concurrency: Option<Spanned<u32>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PolicyHealthCheck {
    #[serde(default)]
    pub active: Option<ActiveHealthCheck>,
    /// Outlier detection: ejects endpoints that fail real traffic.
    #[serde(default)]
    pub passive: Option<PassiveHealthCheck>,
}

/// Active health checks by Envoy.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ActiveHealthCheck {
    #[serde(rename = "type")]
    pub type_: Spanned<HealthCheckType>,
    #[serde(default = "three_seconds", deserialize_with = "de_duration")]
    pub interval: Spanned<Duration>,
    #[serde(default = "one_second", deserialize_with = "de_duration")]
    pub timeout: Spanned<Duration>,
    #[serde(default = "one")]
    pub healthy_threshold: Spanned<u32>,
    #[serde(default = "three")]
    pub unhealthy_threshold: Spanned<u32>,
    #[serde(default)]
    pub http: Option<HttpActiveHealthCheck>,
    #[serde(default)]
    pub tcp: Option<TcpActiveHealthCheck>,
    #[serde(default)]
    pub grpc: Option<GrpcActiveHealthCheck>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum HealthCheckType {
    #[serde(rename = "HTTP")]
    Http,
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "GRPC")]
    Grpc,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpActiveHealthCheck {
    pub path: Spanned<String>,
    /// `Host` of the check request; Envoy sends the cluster name when unset.
    #[serde(default)]
    pub hostname: Option<Spanned<String>>,
    #[serde(default)]
    pub method: Option<Spanned<String>>,
    /// Healthy status codes; default `[200]`.
    #[serde(default)]
    pub expected_statuses: Vec<Spanned<u32>>,
}

/// A TCP connect check; with `send`/`receive` (hex payloads) a request/response check.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TcpActiveHealthCheck {
    #[serde(default)]
    pub send: Option<Spanned<String>>,
    #[serde(default)]
    pub receive: Option<Spanned<String>>,
}

/// gRPC health checking protocol (`grpc.health.v1.Health/Check`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GrpcActiveHealthCheck {
    #[serde(default)]
    pub service: Option<String>,
}

/// Outlier detection (Envoy `outlier_detection`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PassiveHealthCheck {
    /// Consecutive 5xx answers (or connect failures) that eject an endpoint (Envoy default 5).
    #[serde(default, rename = "consecutive5XxErrors")]
    pub consecutive_5xx_errors: Option<Spanned<u32>>,
    /// Consecutive 502/503/504 answers that eject an endpoint (disabled unless set).
    #[serde(default)]
    pub consecutive_gateway_errors: Option<Spanned<u32>>,
    /// How often ejections are reviewed (Envoy default 10s).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub interval: Option<Spanned<Duration>>,
    /// Ejection time, multiplied by the number of ejections (Envoy default 30s).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub base_ejection_time: Option<Spanned<Duration>>,
    /// Most endpoints (percent) ejected at once (Envoy default 10).
    #[serde(default)]
    pub max_ejection_percent: Option<Spanned<u32>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PolicyLoadBalancer {
    #[serde(rename = "type")]
    pub type_: Spanned<PolicyLbType>,
    #[serde(default)]
    pub consistent_hash: Option<ConsistentHash>,
    /// Ramps new endpoints' share up over `window` (round robin and least request only).
    #[serde(default)]
    pub slow_start: Option<SlowStart>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum PolicyLbType {
    RoundRobin,
    LeastRequest,
    Random,
    /// Ring hash on the key `consistentHash` names.
    ConsistentHash,
    /// Maglev on the key `consistentHash` names.
    Maglev,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConsistentHash {
    #[serde(rename = "type")]
    pub type_: Spanned<HashType>,
    #[serde(default)]
    pub header: Option<HashHeader>,
    #[serde(default)]
    pub cookie: Option<HashCookie>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum HashType {
    #[serde(rename = "SourceIP")]
    SourceIp,
    Header,
    Cookie,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HashHeader {
    pub name: Spanned<String>,
}

/// Hash on a cookie; with `ttl` Envoy sets the cookie when the request lacks it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HashCookie {
    pub name: Spanned<String>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub ttl: Option<Spanned<Duration>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlowStart {
    #[serde(deserialize_with = "de_duration")]
    pub window: Spanned<Duration>,
}

/// The request key routes hash on for consistent hashing (what the route's `hash_policy` is).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HashKey {
    SourceIp,
    Header(String),
    Cookie { name: String, ttl: Option<Duration> },
}

impl BackendPolicySpec {
    /// The hash key routes to a targeted Backend must carry, if the policy hashes.
    pub fn hash_key(&self) -> Option<HashKey> {
        let lb = self.load_balancer.as_ref()?;
        if !matches!(
            *lb.type_,
            PolicyLbType::ConsistentHash | PolicyLbType::Maglev
        ) {
            return None;
        }
        let Some(h) = &lb.consistent_hash else {
            return Some(HashKey::SourceIp);
        };
        Some(match *h.type_ {
            HashType::SourceIp => HashKey::SourceIp,
            HashType::Header => HashKey::Header(
                h.header
                    .as_ref()
                    .map(|x| x.name.value.to_ascii_lowercase())
                    .unwrap_or_default(),
            ),
            HashType::Cookie => {
                let c = h.cookie.as_ref();
                HashKey::Cookie {
                    name: c.map(|c| c.name.value.clone()).unwrap_or_default(),
                    ttl: c.and_then(|c| c.ttl.as_ref().map(|t| t.value)),
                }
            }
        })
    }
}

fn three_seconds() -> Spanned<Duration> {
    Spanned::new(Duration::from_secs(3), Pos::UNKNOWN)
}
fn one_second() -> Spanned<Duration> {
    Spanned::new(Duration::from_secs(1), Pos::UNKNOWN)
}
fn one() -> Spanned<u32> {
    Spanned::new(1, Pos::UNKNOWN)
}
fn three() -> Spanned<u32> {
    Spanned::new(3, Pos::UNKNOWN)
}

fn positive(ctx: &mut Ctx, field: String, d: &Spanned<Duration>) {
    if d.is_zero() {
        ctx.err(d.pos, field, "must be greater than 0");
    }
}

fn at_least_one(ctx: &mut Ctx, field: String, v: &Spanned<u32>) {
    if v.value == 0 {
        ctx.err(v.pos, field, "must be at least 1");
    }
}

fn percent(ctx: &mut Ctx, field: String, v: &Spanned<u32>) {
    if v.value > 100 {
        ctx.err(
            v.pos,
            field,
            format!("{} is not a percentage (0..=100)", v.value),
        );
    }
}

fn header_name(ctx: &mut Ctx, field: String, v: &Spanned<String>) {
    let ok = !v.is_empty()
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !ok {
        ctx.err(v.pos, field, format!("invalid header name {:?}", v.value));
    }
}

/// Checks one BackendPolicy (ranges, one-of fields).
pub(crate) fn validate_backend_policy(ctx: &mut Ctx, p: &BackendPolicy) {
    crate::validate::metadata(ctx, &p.metadata);
    let s = &p.spec;
    validate_target_refs(ctx, &s.target_refs, &BACKEND_POLICY_TARGETS);
    if let Some(cb) = &s.circuit_breaker {
        if let Some(v) = &cb.max_requests_per_connection {
            at_least_one(
                ctx,
                "spec.circuitBreaker.maxRequestsPerConnection".into(),
                v,
            );
        }
        if cb.max_parallel_retries.is_some() && s.retry_budget.is_some() {
            let pos = cb
                .max_parallel_retries
                .as_ref()
                .map_or(Pos::UNKNOWN, |v| v.pos);
            ctx.err(
                pos,
                "spec.circuitBreaker.maxParallelRetries",
                "maxParallelRetries and retryBudget are exclusive (Envoy ignores the first when \
                 a budget is set)",
            );
        }
    }
    if let Some(t) = &s.tls {
        let r = &t.client_certificate_ref;
        if !r.is_secret() {
            ctx.err(
                r.kind.pos,
                "spec.tls.clientCertificateRef.kind",
                format!("unsupported kind {:?}; expected core Secret", r.kind.value),
            );
        }
        if r.namespace
            .as_ref()
            .is_some_and(|n| *n != p.metadata.namespace)
        {
            ctx.err(
                r.name.pos,
                "spec.tls.clientCertificateRef.namespace",
                "the client certificate must be in the policy's namespace",
            );
        }
    }
    if let Some(v) = s
        .retry_budget
        .as_ref()
        .and_then(|rb| rb.budget_percent.as_ref())
    {
        percent(ctx, "spec.retryBudget.budgetPercent".into(), v);
    }
    if let Some(hc) = s.health_check.as_ref().and_then(|h| h.active.as_ref()) {
        let f = "spec.healthCheck.active";
        positive(ctx, format!("{f}.interval"), &hc.interval);
        positive(ctx, format!("{f}.timeout"), &hc.timeout);
        at_least_one(ctx, format!("{f}.healthyThreshold"), &hc.healthy_threshold);
        at_least_one(
            ctx,
            format!("{f}.unhealthyThreshold"),
            &hc.unhealthy_threshold,
        );
        let (want, name) = match *hc.type_ {
            HealthCheckType::Http => (hc.http.is_some(), "http"),
            HealthCheckType::Tcp => (true, "tcp"),
            HealthCheckType::Grpc => (true, "grpc"),
        };
        if !want {
            ctx.err(
                hc.type_.pos,
                format!("{f}.{name}"),
                format!("health check type HTTP needs field {name}"),
            );
        }
        for (other, present) in [
            ("http", hc.http.is_some()),
            ("tcp", hc.tcp.is_some()),
            ("grpc", hc.grpc.is_some()),
        ] {
            if present && other != name {
                ctx.err(
                    hc.type_.pos,
                    format!("{f}.{other}"),
                    format!("field {other} is not allowed with health check type {name}",),
                );
            }
        }
        if let Some(h) = &hc.http {
            if !h.path.starts_with('/') {
                ctx.err(
                    h.path.pos,
                    format!("{f}.http.path"),
                    format!("path {:?} must start with '/'", h.path.value),
                );
            }
            for (i, st) in h.expected_statuses.iter().enumerate() {
                if !(100..=599).contains(&st.value) {
                    ctx.err(
                        st.pos,
                        format!("{f}.http.expectedStatuses[{i}]"),
                        format!("status {} is out of range 100..=599", st.value),
                    );
                }
            }
            if let Some(m) = &h.method
                && ![
                    "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "PATCH",
                ]
                .contains(&m.as_str())
            {
                ctx.err(
                    m.pos,
                    format!("{f}.http.method"),
                    format!("unsupported method {:?}", m.value),
                );
            }
        }
        if let Some(t) = &hc.tcp {
            for (name, v) in [("send", &t.send), ("receive", &t.receive)] {
                if let Some(v) = v
                    && (v.is_empty()
                        || v.len() % 2 != 0
                        || !v.bytes().all(|b| b.is_ascii_hexdigit()))
                {
                    ctx.err(
                        v.pos,
                        format!("{f}.tcp.{name}"),
                        format!("{name} must be hex bytes, e.g. \"50494e47\""),
                    );
                }
            }
        }
    }
    if let Some(ph) = s.health_check.as_ref().and_then(|h| h.passive.as_ref()) {
        let f = "spec.healthCheck.passive";
        if let Some(v) = &ph.consecutive_5xx_errors {
            at_least_one(ctx, format!("{f}.consecutive5XxErrors"), v);
        }
        if let Some(v) = &ph.consecutive_gateway_errors {
            at_least_one(ctx, format!("{f}.consecutiveGatewayErrors"), v);
        }
        if let Some(d) = &ph.interval {
            positive(ctx, format!("{f}.interval"), d);
        }
        if let Some(d) = &ph.base_ejection_time {
            positive(ctx, format!("{f}.baseEjectionTime"), d);
        }
        if let Some(v) = &ph.max_ejection_percent {
            percent(ctx, format!("{f}.maxEjectionPercent"), v);
        }
    }
    if let Some(lb) = &s.load_balancer {
        let f = "spec.loadBalancer";
        let hashing = matches!(
            *lb.type_,
            PolicyLbType::ConsistentHash | PolicyLbType::Maglev
        );
        if let Some(h) = &lb.consistent_hash {
            if !hashing {
                ctx.err(
                    lb.type_.pos,
                    format!("{f}.consistentHash"),
                    "consistentHash needs type ConsistentHash or Maglev",
                );
            }
            match *h.type_ {
                HashType::Header => match &h.header {
                    Some(hd) => {
                        header_name(ctx, format!("{f}.consistentHash.header.name"), &hd.name)
                    }
                    None => ctx.err(
                        h.type_.pos,
                        format!("{f}.consistentHash.header"),
                        "hash type Header needs field header",
                    ),
                },
                HashType::Cookie => match &h.cookie {
                    Some(c) => {
                        if c.name.is_empty()
                            || !c.name.bytes().all(|b| {
                                b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b)
                            })
                        {
                            ctx.err(
                                c.name.pos,
                                format!("{f}.consistentHash.cookie.name"),
                                format!("invalid cookie name {:?}", c.name.value),
                            );
                        }
                        if let Some(t) = &c.ttl {
                            positive(ctx, format!("{f}.consistentHash.cookie.ttl"), t);
                        }
                    }
                    None => ctx.err(
                        h.type_.pos,
                        format!("{f}.consistentHash.cookie"),
                        "hash type Cookie needs field cookie",
                    ),
                },
                HashType::SourceIp => {}
            }
            if *h.type_ != HashType::Header && h.header.is_some() {
                ctx.err(
                    h.type_.pos,
                    format!("{f}.consistentHash.header"),
                    "field header is only allowed with hash type Header",
                );
            }
            if *h.type_ != HashType::Cookie && h.cookie.is_some() {
                ctx.err(
                    h.type_.pos,
                    format!("{f}.consistentHash.cookie"),
                    "field cookie is only allowed with hash type Cookie",
                );
            }
        }
        if let Some(ss) = &lb.slow_start {
            positive(ctx, format!("{f}.slowStart.window"), &ss.window);
            if !matches!(
                *lb.type_,
                PolicyLbType::RoundRobin | PolicyLbType::LeastRequest
            ) {
                ctx.err(
                    ss.window.pos,
                    format!("{f}.slowStart"),
                    "slowStart needs type RoundRobin or LeastRequest",
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::attach::{Outcome, TargetId};
    use crate::kinds::*;
    use crate::{ConfigSet, parse_file};
    use proptest::prelude::*;

    fn errors(text: &str) -> Vec<String> {
        match parse_file("p.yaml", text) {
            Ok(_) => panic!("expected errors"),
            Err(es) => es.iter().map(ToString::to_string).collect(),
        }
    }

    const FULL: &str = "apiVersion: ballast.dev/v1alpha1
kind: BackendPolicy
metadata: { name: resilient }
spec:
  targetRefs: [{ group: ballast.dev, kind: Backend, name: api }]
  circuitBreaker: { maxConnections: 10, maxPendingRequests: 5, maxParallelRequests: 20, maxRequestsPerConnection: 100 }
  retryBudget: { budgetPercent: 25, minRetryConcurrency: 2 }
  healthCheck:
    active:
      type: HTTP
      interval: 2s
      http: { path: /healthz, hostname: health.internal, expectedStatuses: [200, 204] }
    passive: { consecutive5XxErrors: 3, consecutiveGatewayErrors: 2, interval: 1s, baseEjectionTime: 30s, maxEjectionPercent: 50 }
  loadBalancer:
    type: ConsistentHash
    consistentHash: { type: Header, header: { name: X-User } }
";

    #[test]
    fn full_policy_parses() {
        let objs = parse_file("p.yaml", FULL).unwrap_or_else(|e| panic!("{e:?}"));
        let Object::BackendPolicy(p) = &objs[0] else {
            panic!()
        };
        assert_eq!(p.spec.hash_key(), Some(HashKey::Header("x-user".into())));
        let cb = p.spec.circuit_breaker.as_ref().unwrap();
        assert_eq!(cb.max_connections.as_ref().map(|v| v.value), Some(10));
    }

    #[test]
    fn policy_errors_are_positioned() {
        let text = "apiVersion: ballast.dev/v1alpha1
kind: BackendPolicy
metadata: { name: bad }
spec:
  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }]
  circuitBreaker: { maxParallelRetries: 3 }
  retryBudget: { budgetPercent: 120 }
  healthCheck:
    active: { type: HTTP, interval: 0s }
    passive: { maxEjectionPercent: 101 }
  loadBalancer:
    type: RoundRobin
    consistentHash: { type: Header }
    slowStart: { window: 0s }
";
        assert_eq!(
            errors(text),
            vec![
                "p.yaml:5:58: BackendPolicy default/bad: spec.targetRefs[0].kind: cannot target \"Gateway\" (group \"gateway.networking.k8s.io\"); this policy targets ballast.dev/Backend, core/Service",
                "p.yaml:6:41: BackendPolicy default/bad: spec.circuitBreaker.maxParallelRetries: maxParallelRetries and retryBudget are exclusive (Envoy ignores the first when a budget is set)",
                "p.yaml:7:33: BackendPolicy default/bad: spec.retryBudget.budgetPercent: 120 is not a percentage (0..=100)",
                "p.yaml:9:21: BackendPolicy default/bad: spec.healthCheck.active.http: health check type HTTP needs field http",
                "p.yaml:9:37: BackendPolicy default/bad: spec.healthCheck.active.interval: must be greater than 0",
                "p.yaml:10:36: BackendPolicy default/bad: spec.healthCheck.passive.maxEjectionPercent: 101 is not a percentage (0..=100)",
                "p.yaml:12:11: BackendPolicy default/bad: spec.loadBalancer.consistentHash: consistentHash needs type ConsistentHash or Maglev",
                "p.yaml:13:29: BackendPolicy default/bad: spec.loadBalancer.consistentHash.header: hash type Header needs field header",
                "p.yaml:14:26: BackendPolicy default/bad: spec.loadBalancer.slowStart.window: must be greater than 0",
            ]
        );
    }

    fn backend(name: &str) -> String {
        format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {{ name: {name} }}\nspec: {{}}\n---\n"
        )
    }

    fn policy(name: &str, targets: &[&str]) -> String {
        let refs: Vec<String> = targets
            .iter()
            .map(|t| format!("{{ group: ballast.dev, kind: Backend, name: {t} }}"))
            .collect();
        format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: BackendPolicy\nmetadata: {{ name: {name} }}\nspec:\n  targetRefs: [{}]\n---\n",
            refs.join(", ")
        )
    }

    #[test]
    fn status_lists_targets_and_conflicts() {
        let text = backend("a")
            + &backend("b")
            + &policy("p1", &["a", "missing"])
            + &policy("p2", &["a", "b"]);
        let set = ConfigSet::build([("c.yaml", text)]).unwrap();
        let st = crate::status::compute(&set);
        let by_name = |n: &str| st.backend_policies.iter().find(|p| p.name == n).unwrap();
        assert_eq!(by_name("p1").applied_to(), vec!["Backend default/a"]);
        assert_eq!(by_name("p2").applied_to(), vec!["Backend default/b"]);
        let problems = st.problems();
        assert!(
            problems.iter().any(|p| p.contains("BackendPolicy default/p1: target Backend default/missing: Accepted=False TargetNotFound: Backend default/missing not found")),
            "{problems:#?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("BackendPolicy default/p2: target Backend default/a: Accepted=False Conflicted: older policy default/p1")),
            "{problems:#?}"
        );
        assert_eq!(
            set.backend_policy_for(&ObjectKey::new("default", "a"))
                .unwrap()
                .metadata
                .name,
            "p1"
        );
        assert_eq!(
            set.backend_policy_for(&ObjectKey::new("default", "b"))
                .unwrap()
                .metadata
                .name,
            "p2"
        );
    }

    proptest! {
        /// The per-Backend lookup translation uses equals the full resolution status reports.
        #[test]
        fn lookup_equals_resolution(policies in prop::collection::btree_map(0u8..5, prop::collection::btree_set(0u8..4, 1..3), 0..5)) {
            let mut text = backend("b0") + &backend("b1") + &backend("b2");
            for (p, targets) in &policies {
                let t: Vec<String> = targets.iter().map(|t| format!("b{t}")).collect();
                let t: Vec<&str> = t.iter().map(String::as_str).collect();
                text += &policy(&format!("p{p}"), &t);
            }
            let set = ConfigSet::build([("c.yaml", text)]).unwrap();
            let res = set.backend_policy_resolution();
            for b in 0..4 {
                let key = ObjectKey::new("default", format!("b{b}"));
                let t = TargetId { kind: TargetKind::Backend, key: key.clone() };
                prop_assert_eq!(
                    set.backend_policy_for(&key).map(|p| p.key()),
                    res.effective(&t, None).cloned()
                );
            }
            for statuses in res.statuses.values() {
                for s in statuses {
                    if s.point.target.key.name == "b3" {
                        prop_assert!(matches!(s.outcome, Outcome::TargetNotFound(_)));
                    }
                }
            }
        }
    }
}
