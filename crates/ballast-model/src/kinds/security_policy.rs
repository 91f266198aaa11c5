//! `ballast.dev/v1alpha1` `SecurityPolicy`: who may use the Gateways, listeners, HTTPRoutes or
//! single route rules it targets: allow/deny rules on client IP and token claims
//! (`authorization`), JWT authentication (`jwt`) and external authorization over HTTP or gRPC
//! (`extAuth`). Named after Envoy Gateway's `SecurityPolicy`, whose field names it follows
//! where features match.
//!
//! Precedence, most specific first: a rule (`HTTPRoute` + `sectionName`), the route, a listener
//! (`Gateway` + `sectionName`), the Gateway. The policy that applies is used as a whole (an
//! HTTPRoute policy with only `jwt` turns the Gateway's `authorization` off on that route).

use std::net::IpAddr;

use serde::Deserialize;

use super::policy::{PolicyTargetRef, TargetKind, validate_target_refs};
use super::{Metadata, Source, object_kind};
use crate::spanned::{Pos, Spanned};
use crate::validate::Ctx;

#[derive(Clone, Debug)]
pub struct SecurityPolicy {
    pub metadata: Metadata,
    pub spec: SecurityPolicySpec,
    pub source: Source,
}
object_kind!(SecurityPolicy, super::Kind::SecurityPolicy);

/// What a SecurityPolicy may target (a listener or a named rule through `sectionName`).
pub const SECURITY_POLICY_TARGETS: [TargetKind; 2] = [TargetKind::Gateway, TargetKind::HttpRoute];

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SecurityPolicySpec {
    pub target_refs: Vec<PolicyTargetRef>,
    #[serde(default)]
    pub authorization: Option<Authorization>,
    #[serde(default)]
    pub jwt: Option<Jwt>,
    #[serde(default)]
    pub ext_auth: Option<ExtAuth>,
}

/// External authorization: Envoy asks a service (a Backend) about every request, over HTTP
/// (`http`: a 2xx answer lets it through, any other answer is returned to the client) or gRPC
/// (`grpc`: `envoy.service.auth.v3.Authorization/Check`; OK lets it through, a denial is
/// returned). Exactly one of the two. When the service cannot be asked (down, timeout, 5xx),
/// the request gets 403 (fail closed) unless `failOpen`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtAuth {
    #[serde(default)]
    pub http: Option<ExtAuthHttp>,
    #[serde(default)]
    pub grpc: Option<ExtAuthGrpc>,
    /// Let requests through when the service cannot be asked (Envoy's `failure_mode_allow`);
    /// default false. Envoy then adds `x-envoy-auth-failure-mode-allowed: true` to them.
    #[serde(default)]
    pub fail_open: bool,
    /// Request headers sent to the service. HTTP: besides Host, Method, Path, Content-Length
    /// and Authorization (Envoy always sends those). gRPC: all headers when empty, else only
    /// these.
    #[serde(default, rename = "headersToExtAuth")]
    pub headers_to_ext_auth: Vec<Spanned<String>>,
}

impl ExtAuth {
    /// The service's Backend references (`http` or `grpc`, whichever is set).
    pub fn backend_refs(&self) -> &[JwksBackendRef] {
        match (&self.http, &self.grpc) {
            (Some(h), _) => &h.backend_refs,
            (None, Some(g)) => &g.backend_refs,
            (None, None) => &[],
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtAuthHttp {
    /// Exactly one `ballast.dev` Backend in the policy's namespace.
    pub backend_refs: Vec<JwksBackendRef>,
    /// Prefix of the check request's path (the client's path follows it).
    #[serde(default)]
    pub path: Option<Spanned<String>>,
    /// Headers of the service's 2xx answer copied into the request to the backend.
    #[serde(default)]
    pub headers_to_backend: Vec<Spanned<String>>,
}

/// An `envoy.service.auth.v3.Authorization` gRPC service. Its Backend must speak HTTP/2
/// (`protocol: grpc` or `h2c`); Ballast does not check that.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtAuthGrpc {
    /// Exactly one `ballast.dev` Backend in the policy's namespace.
    pub backend_refs: Vec<JwksBackendRef>,
}

/// Allow/deny rules on the client address and the verified token's claims. Rules are checked
/// in order and the first whose principal matches decides; without a match `defaultAction`
/// does (default `Deny`, as Envoy Gateway).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Authorization {
    #[serde(default)]
    pub default_action: Option<Spanned<AuthorizationAction>>,
    #[serde(default)]
    pub rules: Vec<AuthorizationRule>,
}

impl Authorization {
    pub fn default_action(&self) -> AuthorizationAction {
        self.default_action
            .as_ref()
            .map_or(AuthorizationAction::Deny, |a| a.value)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum AuthorizationAction {
    Allow,
    Deny,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AuthorizationRule {
    /// For status and logs only.
    #[serde(default)]
    pub name: Option<Spanned<String>>,
    pub action: Spanned<AuthorizationAction>,
    pub principal: Principal,
}

/// Who a rule is about. Every part that is set must match (clientCIDRs and jwt are ANDed).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Principal {
    /// Client addresses (`10.0.0.0/8`, `2001:db8::/32`, or a single address), as the
    /// connection manager detects them (the ClientPolicy's `clientIPDetection`).
    #[serde(default, rename = "clientCIDRs")]
    pub client_cidrs: Vec<Spanned<String>>,
    /// Claims and scopes of the token a provider of this policy's `jwt` verified.
    #[serde(default)]
    pub jwt: Option<JwtPrincipal>,
}

/// Matches requests whose token, verified by `provider`, has every claim (each with one of its
/// values) and every scope. A request without such a token never matches.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JwtPrincipal {
    /// A provider of the same policy's `jwt.providers`.
    pub provider: Spanned<String>,
    #[serde(default)]
    pub claims: Vec<JwtClaim>,
    /// Each must appear in the space-separated `scope` claim (RFC 6749).
    #[serde(default)]
    pub scopes: Vec<Spanned<String>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JwtClaim {
    /// The claim; `a.b` is member `b` of object claim `a`.
    pub name: Spanned<String>,
    /// `String` (default): the claim equals one of `values`; `StringArray`: the claim is an
    /// array containing one of them.
    #[serde(default)]
    pub value_type: Option<Spanned<JwtClaimValueType>>,
    pub values: Vec<Spanned<String>>,
}

impl JwtClaim {
    pub fn value_type(&self) -> JwtClaimValueType {
        self.value_type
            .as_ref()
            .map_or(JwtClaimValueType::String, |t| t.value)
    }

    /// The claim's path in the token's payload.
    pub fn path(&self) -> impl Iterator<Item = &str> {
        self.name.split('.')
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum JwtClaimValueType {
    String,
    StringArray,
}

/// A parsed CIDR range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    pub address: IpAddr,
    pub prefix_len: u32,
}

impl Cidr {
    /// `a.b.c.d/n`, `x::y/n`, or a bare address (a single host).
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let address: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("invalid CIDR {s:?}: {addr:?} is not an IP address"))?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        let prefix_len =
            match len {
                None => max,
                Some(l) => l.parse::<u32>().ok().filter(|n| *n <= max).ok_or_else(|| {
                    format!("invalid CIDR {s:?}: prefix length must be 0..={max}")
                })?,
            };
        Ok(Cidr {
            address,
            prefix_len,
        })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Jwt {
    /// A request must carry a valid token of one of these providers.
    pub providers: Vec<JwtProvider>,
    /// Let requests without a token through (an invalid token is still refused with 401);
    /// authorization rules can then tell them apart by `principal.jwt`.
    #[serde(default)]
    pub optional: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JwtProvider {
    /// Unique within the policy.
    pub name: Spanned<String>,
    /// Required `iss` claim; absent: any issuer.
    #[serde(default)]
    pub issuer: Option<Spanned<String>>,
    /// Accepted `aud` values; empty: any audience.
    #[serde(default)]
    pub audiences: Vec<Spanned<String>>,
    #[serde(default, rename = "localJWKS")]
    pub local_jwks: Option<LocalJwks>,
    #[serde(default, rename = "remoteJWKS")]
    pub remote_jwks: Option<RemoteJwks>,
    /// Copy claims of the verified token into request headers for the backend.
    #[serde(default)]
    pub claim_to_headers: Vec<ClaimToHeader>,
    /// Where the token is; absent: `Authorization: Bearer` (Envoy's default, which also
    /// reads an `access_token` query parameter).
    #[serde(default)]
    pub extract_from: Option<JwtExtractor>,
}

/// Places a provider reads tokens from (all of them; any one may carry it). Setting this
/// replaces the default `Authorization: Bearer`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JwtExtractor {
    #[serde(default)]
    pub headers: Vec<JwtHeaderExtractor>,
    /// Cookie names.
    #[serde(default)]
    pub cookies: Vec<Spanned<String>>,
    /// Query parameter names.
    #[serde(default)]
    pub params: Vec<Spanned<String>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JwtHeaderExtractor {
    pub name: Spanned<String>,
    /// Stripped before the token (`"Bearer "`, with its space); absent: the whole value.
    #[serde(default)]
    pub value_prefix: Option<Spanned<String>>,
}

/// The JSON Web Key Set verifying tokens: inline, or a key of a ConfigMap in the policy's
/// namespace (Ballast's Secrets are TLS Secrets only).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LocalJwks {
    /// `Inline` or `ValueRef` (Envoy Gateway's discriminator; optional here).
    #[serde(default, rename = "type")]
    pub type_: Option<Spanned<String>>,
    #[serde(default)]
    pub inline: Option<Spanned<String>>,
    #[serde(default)]
    pub value_ref: Option<JwksRef>,
}

/// A JWKS Envoy fetches over HTTP(S) from a Backend (TLS per the Backend's BackendTLSPolicy)
/// and caches.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RemoteJwks {
    /// `http://` or `https://` URL; its host is sent as `Host`.
    pub uri: Spanned<String>,
    /// Exactly one `ballast.dev` Backend in the policy's namespace serving `uri`.
    pub backend_refs: Vec<JwksBackendRef>,
    /// How long fetched keys are used before fetching again (Envoy default 10 minutes).
    #[serde(default, deserialize_with = "crate::duration::de_opt_duration")]
    pub cache_duration: Option<Spanned<std::time::Duration>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JwksBackendRef {
    #[serde(default)]
    pub group: String,
    pub kind: Spanned<String>,
    pub name: Spanned<String>,
    /// Accepted for Envoy Gateway compatibility (1..=65535) and ignored: a Backend's
    /// endpoints carry their own ports (as for HTTPRoute backendRefs).
    #[serde(default)]
    pub port: Option<Spanned<u32>>,
}

/// A ConfigMap key holding a JWKS (`key` default `jwks`, Envoy Gateway's convention).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JwksRef {
    #[serde(default)]
    pub group: String,
    pub kind: Spanned<String>,
    pub name: Spanned<String>,
    #[serde(default)]
    pub key: Option<Spanned<String>>,
}

impl JwksRef {
    pub fn key_name(&self) -> &str {
        self.key.as_ref().map_or("jwks", |k| k.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClaimToHeader {
    pub claim: Spanned<String>,
    pub header: Spanned<String>,
}

/// Checks that `text` is a JWKS: a JSON object with a non-empty `keys` array of objects
/// with a `kty`.
pub fn check_jwks(text: &str) -> Result<(), String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("JWKS is not valid JSON: {e}"))?;
    let keys = v
        .get("keys")
        .and_then(|k| k.as_array())
        .ok_or("JWKS has no \"keys\" array")?;
    if keys.is_empty() {
        return Err("JWKS has no keys".into());
    }
    for (i, k) in keys.iter().enumerate() {
        check_jwk(k).map_err(|m| format!("JWKS key {i}: {m}"))?;
    }
    Ok(())
}

/// The members Envoy needs for each key type, base64url-decodable with the right lengths.
/// (Envoy rejects a whole listener over a JWKS without a usable key, so catch it here.)
fn check_jwk(k: &serde_json::Value) -> Result<(), String> {
    use base64::Engine;
    let member = |name: &str| -> Result<Vec<u8>, String> {
        let v = k
            .get(name)
            .and_then(|v| v.as_str())
            .ok_or_else(|| format!("missing \"{name}\""))?;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(v.trim_end_matches('='))
            .map_err(|e| format!("\"{name}\" is not base64url: {e}"))
    };
    let kty = k
        .get("kty")
        .and_then(|t| t.as_str())
        .ok_or("missing \"kty\"")?;
    match kty {
        "EC" => {
            let len = match k.get("crv").and_then(|c| c.as_str()) {
                Some("P-256") => 32,
                Some("P-384") => 48,
                Some("P-521") => 66,
                other => return Err(format!("unsupported EC curve {other:?}")),
            };
            for m in ["x", "y"] {
                if member(m)?.len() != len {
                    return Err(format!("\"{m}\" must be {len} bytes for this curve"));
                }
            }
        }
        "RSA" => {
            if member("n")?.len() < 128 || member("e")?.is_empty() {
                return Err("RSA keys need \"n\" of at least 1024 bits and \"e\"".into());
            }
        }
        "OKP" => {
            if k.get("crv").and_then(|c| c.as_str()) != Some("Ed25519") || member("x")?.len() != 32
            {
                return Err("OKP keys must be Ed25519 with a 32-byte \"x\"".into());
            }
        }
        "oct" => {
            if member("k")?.is_empty() {
                return Err("empty \"k\"".into());
            }
        }
        other => return Err(format!("unsupported key type {other:?}")),
    }
    Ok(())
}

fn valid_header_name(h: &str) -> bool {
    !h.is_empty()
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

pub(crate) fn validate_security_policy(ctx: &mut Ctx, p: &SecurityPolicy) {
    crate::validate::metadata(ctx, &p.metadata);
    let s = &p.spec;
    validate_target_refs(ctx, &s.target_refs, &SECURITY_POLICY_TARGETS);
    if s.authorization.is_none() && s.jwt.is_none() && s.ext_auth.is_none() {
        ctx.err(
            Pos::UNKNOWN,
            "spec",
            "a SecurityPolicy needs authorization, jwt or extAuth",
        );
    }
    if let Some(e) = &s.ext_auth {
        let (kind, refs) = match (&e.http, &e.grpc) {
            (Some(h), None) => ("http", &h.backend_refs),
            (None, Some(g)) => ("grpc", &g.backend_refs),
            _ => {
                ctx.err(
                    Pos::UNKNOWN,
                    "spec.extAuth",
                    "set exactly one of http and grpc",
                );
                ("http", &Vec::new())
            }
        };
        if (e.http.is_some() != e.grpc.is_some()) && refs.len() != 1 {
            ctx.err(
                Pos::UNKNOWN,
                format!("spec.extAuth.{kind}.backendRefs"),
                "name exactly one Backend",
            );
        }
        for (k, b) in refs.iter().enumerate() {
            if b.group != super::BALLAST_GROUP || b.kind.as_str() != "Backend" {
                ctx.err(
                    b.kind.pos,
                    format!("spec.extAuth.{kind}.backendRefs[{k}].kind"),
                    format!(
                        "unsupported {:?} (group {:?}); expected ballast.dev Backend",
                        b.kind.value, b.group
                    ),
                );
            }
            if let Some(p) = &b.port
                && !(1..=65535).contains(&p.value)
            {
                ctx.err(
                    p.pos,
                    format!("spec.extAuth.{kind}.backendRefs[{k}].port"),
                    format!("port {} is out of range 1..=65535", p.value),
                );
            }
        }
        if let Some(p) = e.http.as_ref().and_then(|h| h.path.as_ref())
            && !p.starts_with('/')
        {
            ctx.err(p.pos, "spec.extAuth.http.path", "must start with /");
        }
        let no_headers = Vec::new();
        for (field, list) in [
            ("headersToExtAuth", &e.headers_to_ext_auth),
            (
                "http.headersToBackend",
                e.http
                    .as_ref()
                    .map_or(&no_headers, |h| &h.headers_to_backend),
            ),
        ] {
            for (k, h) in list.iter().enumerate() {
                if !valid_header_name(h) {
                    ctx.err(
                        h.pos,
                        format!("spec.extAuth.{field}[{k}]"),
                        format!("invalid header name {:?}", h.value),
                    );
                }
            }
        }
    }
    if let Some(a) = &s.authorization {
        for (i, r) in a.rules.iter().enumerate() {
            if r.principal.client_cidrs.is_empty() && r.principal.jwt.is_none() {
                ctx.err(
                    r.action.pos,
                    format!("spec.authorization.rules[{i}].principal"),
                    "a rule needs clientCIDRs or jwt",
                );
            }
            if let Some(j) = &r.principal.jwt {
                validate_jwt_principal(
                    ctx,
                    s,
                    j,
                    &format!("spec.authorization.rules[{i}].principal.jwt"),
                );
            }
            for (j, c) in r.principal.client_cidrs.iter().enumerate() {
                if let Err(m) = Cidr::parse(c) {
                    ctx.err(
                        c.pos,
                        format!("spec.authorization.rules[{i}].principal.clientCIDRs[{j}]"),
                        m,
                    );
                }
            }
        }
    }
    if let Some(j) = &s.jwt {
        if j.providers.is_empty() {
            ctx.err(
                Pos::UNKNOWN,
                "spec.jwt.providers",
                "jwt needs at least one provider",
            );
        }
        for (i, pr) in j.providers.iter().enumerate() {
            let f = format!("spec.jwt.providers[{i}]");
            if pr.name.is_empty()
                || !pr
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                ctx.err(
                    pr.name.pos,
                    format!("{f}.name"),
                    format!(
                        "invalid provider name {:?}; use letters, digits, '-', '_' and '.'",
                        pr.name.value
                    ),
                );
            }
            if let Some(k) = j.providers[..i]
                .iter()
                .position(|o| o.name.value == pr.name.value)
            {
                ctx.err(
                    pr.name.pos,
                    format!("{f}.name"),
                    format!("duplicate provider name (also spec.jwt.providers[{k}])"),
                );
            }
            if let Some(r) = &pr.remote_jwks {
                if !(r.uri.starts_with("http://") || r.uri.starts_with("https://"))
                    || r.uri.len() < 10
                {
                    ctx.err(
                        r.uri.pos,
                        format!("{f}.remoteJWKS.uri"),
                        format!("{:?} is not an http:// or https:// URL", r.uri.value),
                    );
                }
                if r.backend_refs.len() != 1 {
                    ctx.err(
                        r.uri.pos,
                        format!("{f}.remoteJWKS.backendRefs"),
                        "name exactly one Backend serving the URL",
                    );
                }
                for (k, b) in r.backend_refs.iter().enumerate() {
                    if b.group != super::BALLAST_GROUP || b.kind.as_str() != "Backend" {
                        ctx.err(
                            b.kind.pos,
                            format!("{f}.remoteJWKS.backendRefs[{k}].kind"),
                            format!(
                                "unsupported {:?} (group {:?}); expected ballast.dev Backend",
                                b.kind.value, b.group
                            ),
                        );
                    }
                }
                if pr.local_jwks.is_some() {
                    ctx.err(
                        pr.name.pos,
                        f.clone(),
                        "set either localJWKS or remoteJWKS, not both",
                    );
                }
            }
            match &pr.local_jwks {
                None if pr.remote_jwks.is_some() => {}
                None => ctx.err(
                    pr.name.pos,
                    f.clone(),
                    "a provider needs localJWKS (inline or valueRef) or remoteJWKS",
                ),
                Some(l) => {
                    if let Some(t) = &l.type_
                        && !matches!(t.as_str(), "Inline" | "ValueRef")
                    {
                        ctx.err(
                            t.pos,
                            format!("{f}.localJWKS.type"),
                            format!("unknown type {:?}; expected Inline or ValueRef", t.value),
                        );
                    }
                    match (&l.inline, &l.value_ref) {
                        (Some(text), None) => {
                            if let Err(m) = check_jwks(text) {
                                ctx.err(text.pos, format!("{f}.localJWKS.inline"), m);
                            }
                        }
                        (None, Some(r)) => {
                            if !r.group.is_empty() || r.kind.as_str() != "ConfigMap" {
                                ctx.err(
                                    r.kind.pos,
                                    format!("{f}.localJWKS.valueRef.kind"),
                                    format!(
                                        "unsupported kind {:?}; expected core ConfigMap",
                                        r.kind.value
                                    ),
                                );
                            }
                        }
                        _ => ctx.err(
                            pr.name.pos,
                            format!("{f}.localJWKS"),
                            "set exactly one of inline and valueRef",
                        ),
                    }
                }
            }
            if let Some(x) = &pr.extract_from {
                validate_extractor(ctx, x, pr.name.pos, &format!("{f}.extractFrom"));
            }
            for (k, c) in pr.claim_to_headers.iter().enumerate() {
                if c.claim.is_empty() {
                    ctx.err(
                        c.claim.pos,
                        format!("{f}.claimToHeaders[{k}].claim"),
                        "must not be empty",
                    );
                }
                if !valid_header_name(&c.header) {
                    ctx.err(
                        c.header.pos,
                        format!("{f}.claimToHeaders[{k}].header"),
                        format!("invalid header name {:?}", c.header.value),
                    );
                }
            }
        }
    }
}

/// A principal's provider is one of the policy's, and it names at least one claim or scope,
/// each well formed.
fn validate_jwt_principal(ctx: &mut Ctx, s: &SecurityPolicySpec, j: &JwtPrincipal, f: &str) {
    let providers = s.jwt.iter().flat_map(|j| &j.providers);
    if !providers.clone().any(|p| p.name.value == j.provider.value) {
        let names: Vec<&str> = providers.map(|p| p.name.as_str()).collect();
        ctx.err(
            j.provider.pos,
            format!("{f}.provider"),
            if names.is_empty() {
                format!(
                    "no provider {:?}: principal.jwt needs spec.jwt with that provider",
                    j.provider.value
                )
            } else {
                format!(
                    "no provider {:?} in spec.jwt.providers (have {})",
                    j.provider.value,
                    names.join(", ")
                )
            },
        );
    }
    if j.claims.is_empty() && j.scopes.is_empty() {
        ctx.err(
            j.provider.pos,
            f.to_owned(),
            "name at least one of claims and scopes",
        );
    }
    for (k, c) in j.claims.iter().enumerate() {
        if c.name.is_empty() || c.path().any(str::is_empty) {
            ctx.err(
                c.name.pos,
                format!("{f}.claims[{k}].name"),
                format!(
                    "invalid claim name {:?}; use `a` or `a.b` for a nested claim",
                    c.name.value
                ),
            );
        }
        if c.values.is_empty() {
            ctx.err(
                c.name.pos,
                format!("{f}.claims[{k}].values"),
                "name at least one value",
            );
        }
    }
    for (k, sc) in j.scopes.iter().enumerate() {
        if sc.is_empty() || sc.contains(char::is_whitespace) {
            ctx.err(
                sc.pos,
                format!("{f}.scopes[{k}]"),
                format!("invalid scope {:?}; one scope, without spaces", sc.value),
            );
        }
    }
}

/// At least one place, each a valid header, cookie or parameter name.
fn validate_extractor(ctx: &mut Ctx, x: &JwtExtractor, pos: Pos, f: &str) {
    if x.headers.is_empty() && x.cookies.is_empty() && x.params.is_empty() {
        ctx.err(
            pos,
            f.to_owned(),
            "name at least one of headers, cookies and params (or leave extractFrom out for Authorization: Bearer)",
        );
    }
    for (k, h) in x.headers.iter().enumerate() {
        if !valid_header_name(&h.name) {
            ctx.err(
                h.name.pos,
                format!("{f}.headers[{k}].name"),
                format!("invalid header name {:?}", h.name.value),
            );
        }
    }
    // Cookie names are RFC 6265 tokens; parameters anything non-empty without separators.
    let token = |v: &str| {
        !v.is_empty()
            && v.bytes()
                .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b))
    };
    for (k, c) in x.cookies.iter().enumerate() {
        if !token(c) {
            ctx.err(
                c.pos,
                format!("{f}.cookies[{k}]"),
                format!("invalid cookie name {:?}", c.value),
            );
        }
    }
    for (k, p) in x.params.iter().enumerate() {
        if p.is_empty() || p.contains(|c: char| c.is_whitespace() || "&=#?".contains(c)) {
            ctx.err(
                p.pos,
                format!("{f}.params[{k}]"),
                format!("invalid query parameter name {:?}", p.value),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ConfigSet;
    use crate::attach::TargetId;
    use crate::kinds::*;
    use proptest::prelude::*;

    const GW: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: edge }\nspec:\n  gatewayClassName: ballast\n  listeners:\n  - { name: a, port: 80, protocol: HTTP }\n  - { name: b, port: 81, protocol: HTTP }\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: { name: r }\nspec:\n  parentRefs: [{ name: edge }]\n  rules:\n  - { name: one, backendRefs: [{ name: x, port: 80 }] }\n  - { name: two, backendRefs: [{ name: x, port: 80 }] }\n";

    fn policy(name: &str, kind: &str, section: Option<&str>) -> String {
        let s = section
            .map(|s| format!(", sectionName: {s}"))
            .unwrap_or_default();
        let target = if kind == "Gateway" { "edge" } else { "r" };
        format!(
            "---\napiVersion: ballast.dev/v1alpha1\nkind: SecurityPolicy\nmetadata: {{ name: {name} }}\nspec:\n  targetRefs: [{{ group: gateway.networking.k8s.io, kind: {kind}, name: {target}{s} }}]\n  authorization: {{ defaultAction: Allow }}\n"
        )
    }

    #[test]
    fn jwks_members_are_checked() {
        let ec = r#"{"keys":[{"kty":"EC","crv":"P-256","x":"GrmKoLISinHtgZRMslA42Z2S4MTNYpi3Z8dRvmywZ9I","y":"lU0Hcj5rL6i0C6hoxxT8L1hdF6W-1cgZBJe9vOk6qXw"}]}"#;
        check_jwks(ec).unwrap();
        let short = ec.replace("GrmKoLISinHtgZRMslA42Z2S4MTNYpi3Z8dRvmywZ9I", "AAAA");
        assert!(
            check_jwks(&short)
                .unwrap_err()
                .contains("\"x\" must be 32 bytes")
        );
        assert!(check_jwks(r#"{"keys":[{"kty":"EC","crv":"P-256"}]}"#).is_err());
        assert!(check_jwks(r#"{"keys":[{"kty":"XYZ"}]}"#).is_err());
        assert!(check_jwks("{").is_err());
    }

    #[test]
    fn cidrs_parse() {
        assert_eq!(Cidr::parse("10.0.0.0/8").unwrap().prefix_len, 8);
        assert_eq!(Cidr::parse("127.0.0.2").unwrap().prefix_len, 32);
        assert_eq!(Cidr::parse("2001:db8::/32").unwrap().prefix_len, 32);
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("10.0.0/8").is_err());
        assert!(Cidr::parse("::/129").is_err());
    }

    #[test]
    fn bad_input_is_reported_with_positions() {
        let text = GW.to_owned()
            + "---\napiVersion: ballast.dev/v1alpha1\nkind: SecurityPolicy\nmetadata: { name: p }\nspec:\n  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }]\n  authorization:\n    rules:\n    - { action: Allow, principal: { clientCIDRs: [10.0.0.0/40] } }\n  jwt:\n    providers:\n    - name: a\n      localJWKS: { inline: '{\"keys\": []}' }\n      claimToHeaders: [{ claim: sub, header: \"x user\" }]\n";
        let errs = ConfigSet::build([("c.yaml", text)]).unwrap_err();
        let all = errs
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            all.contains("c.yaml:26:") && all.contains("clientCIDRs[0]"),
            "{all}"
        );
        assert!(all.contains("localJWKS.inline: JWKS has no keys"), "{all}");
        assert!(all.contains("claimToHeaders[0].header"), "{all}");
        let unknown = GW.to_owned()
            + "---\napiVersion: ballast.dev/v1alpha1\nkind: SecurityPolicy\nmetadata: { name: p }\nspec:\n  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }]\n  jwt:\n    providers:\n    - { name: a, issuer: x, jwksUri: y }\n";
        let errs = ConfigSet::build([("c.yaml", unknown)]).unwrap_err();
        let e = errs[0].to_string();
        assert!(e.contains("c.yaml:26:29") && e.contains("jwksUri"), "{e}");
        let refs = GW.to_owned()
            + "---\napiVersion: ballast.dev/v1alpha1\nkind: SecurityPolicy\nmetadata: { name: p }\nspec:\n  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }]\n  jwt:\n    providers:\n    - { name: a, remoteJWKS: { uri: ftp://x, backendRefs: [] } }\n  extAuth: { http: { backendRefs: [{ kind: Service, name: s }], path: check } }\n";
        let errs = ConfigSet::build([("c.yaml", refs)]).unwrap_err();
        let all = errs
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n");
        for want in [
            "remoteJWKS.uri",
            "remoteJWKS.backendRefs",
            "extAuth.http.backendRefs[0].kind",
            "extAuth.http.path",
        ] {
            assert!(all.contains(want), "{want}: {all}");
        }
    }

    fn errors(spec: &str) -> String {
        let text = GW.to_owned()
            + "---\napiVersion: ballast.dev/v1alpha1\nkind: SecurityPolicy\nmetadata: { name: p }\nspec:\n  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }]\n"
            + spec;
        match ConfigSet::build([("c.yaml", text)]) {
            Ok(_) => String::new(),
            Err(errs) => errs
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    #[test]
    fn ext_auth_grpc_and_fail_open_parse() {
        let text = GW.to_owned()
            + "---\napiVersion: ballast.dev/v1alpha1\nkind: SecurityPolicy\nmetadata: { name: p }\nspec:\n  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }]\n  extAuth:\n    failOpen: true\n    grpc: { backendRefs: [{ group: ballast.dev, kind: Backend, name: authz, port: 9001 }] }\n";
        let set = ConfigSet::build([("c.yaml", text)]).unwrap();
        let p = set.security_policies.values().next().unwrap();
        let e = p.spec.ext_auth.as_ref().unwrap();
        assert!(e.fail_open && e.http.is_none());
        assert_eq!(e.backend_refs().len(), 1);
        assert_eq!(e.backend_refs()[0].name.as_str(), "authz");
        assert_eq!(
            e.backend_refs()[0].port.as_ref().map(|p| p.value),
            Some(9001)
        );
        // failOpen defaults to false.
        assert_eq!(
            errors(
                "  extAuth: { http: { backendRefs: [{ group: ballast.dev, kind: Backend, name: a }] } }\n"
            ),
            ""
        );
    }

    /// Each mistake is reported with the field path (and position where it has one).
    #[test]
    fn ext_auth_mistakes_name_the_field() {
        let r = "backendRefs: [{ group: ballast.dev, kind: Backend, name: a }]";
        for (spec, want) in [
            (
                format!("  extAuth: {{ http: {{ {r} }}, grpc: {{ {r} }} }}\n"),
                "spec.extAuth: set exactly one of http and grpc",
            ),
            (
                "  extAuth: { failOpen: true }\n".to_owned(),
                "spec.extAuth: set exactly one of http and grpc",
            ),
            (
                "  extAuth: { grpc: { backendRefs: [] } }\n".to_owned(),
                "spec.extAuth.grpc.backendRefs: name exactly one Backend",
            ),
            (
                "  extAuth: { grpc: { backendRefs: [{ kind: Service, name: a }] } }\n".to_owned(),
                "c.yaml:24:44: SecurityPolicy default/p: spec.extAuth.grpc.backendRefs[0].kind: unsupported",
            ),
            (
                "  extAuth: { grpc: { backendRefs: [{ group: ballast.dev, kind: Backend, name: a, port: 0 }] } }\n".to_owned(),
                "spec.extAuth.grpc.backendRefs[0].port: port 0 is out of range",
            ),
            (
                format!("  extAuth: {{ grpc: {{ {r}, path: /check }} }}\n"),
                "c.yaml:24:85: SecurityPolicy default/p: spec.extAuth.grpc.path: unknown field `path`",
            ),
            (
                format!("  extAuth: {{ failOpen: maybe, grpc: {{ {r} }} }}\n"),
                "c.yaml:24:24: SecurityPolicy default/p: spec.extAuth.failOpen: invalid boolean",
            ),
            (
                format!("  extAuth: {{ headersToExtAuth: [\"x y\"], grpc: {{ {r} }} }}\n"),
                "spec.extAuth.headersToExtAuth[0]: invalid header name",
            ),
        ] {
            let all = errors(&spec);
            assert!(all.contains(want), "{spec}: want {want:?} in:\n{all}");
        }
    }

    const JWKS: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","x":"GrmKoLISinHtgZRMslA42Z2S4MTNYpi3Z8dRvmywZ9I","y":"lU0Hcj5rL6i0C6hoxxT8L1hdF6W-1cgZBJe9vOk6qXw"}]}"#;

    /// A `jwt` with provider `idp` and `extra` appended to it, then `rest` after `jwt`.
    fn jwt_spec(extra: &str, rest: &str) -> String {
        format!(
            "  jwt:\n    providers:\n    - name: idp\n      localJWKS: {{ inline: '{JWKS}' }}\n{extra}{rest}"
        )
    }

    #[test]
    fn extract_from_optional_and_claims_parse() {
        let text = GW.to_owned()
            + "---\napiVersion: ballast.dev/v1alpha1\nkind: SecurityPolicy\nmetadata: { name: p }\nspec:\n  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }]\n"
            + &jwt_spec(
                "      extractFrom:\n        headers: [{ name: x-token }, { name: x-auth, valuePrefix: 'Token ' }]\n        cookies: [session]\n        params: [jwt]\n",
                "    optional: true\n  authorization:\n    rules:\n    - action: Allow\n      principal:\n        jwt:\n          provider: idp\n          claims: [{ name: org.team, values: [a, b] }, { name: roles, valueType: StringArray, values: [admin] }]\n          scopes: [read]\n",
            );
        let set = ConfigSet::build([("c.yaml", text)]).unwrap();
        let p = set.security_policies.values().next().unwrap();
        let j = p.spec.jwt.as_ref().unwrap();
        assert!(j.optional);
        let x = j.providers[0].extract_from.as_ref().unwrap();
        assert_eq!(x.headers[0].name.as_str(), "x-token");
        assert_eq!(x.headers[0].value_prefix, None);
        assert_eq!(
            x.headers[1].value_prefix.as_ref().map(|v| v.as_str()),
            Some("Token ")
        );
        assert_eq!(x.cookies[0].as_str(), "session");
        assert_eq!(x.params[0].as_str(), "jwt");
        let r = &p.spec.authorization.as_ref().unwrap().rules[0];
        assert!(r.principal.client_cidrs.is_empty());
        let pj = r.principal.jwt.as_ref().unwrap();
        assert_eq!(pj.provider.as_str(), "idp");
        assert_eq!(pj.claims[0].path().collect::<Vec<_>>(), ["org", "team"]);
        assert_eq!(pj.claims[0].value_type(), JwtClaimValueType::String);
        assert_eq!(pj.claims[1].value_type(), JwtClaimValueType::StringArray);
        assert_eq!(pj.scopes[0].as_str(), "read");
        // optional defaults to false.
        assert_eq!(errors(&jwt_spec("", "")), "");
    }

    /// Each mistake in extractFrom and principal.jwt is reported with its field path (and
    /// position where it has one).
    #[test]
    fn jwt_extraction_and_claim_mistakes_name_the_field() {
        let allow = |principal: &str| {
            format!(
                "  authorization:\n    rules:\n    - action: Allow\n      principal: {principal}\n"
            )
        };
        for (spec, want) in [
            (
                jwt_spec("      extractFrom: {}\n", ""),
                "spec.jwt.providers[0].extractFrom: name at least one of headers, cookies and params",
            ),
            (
                jwt_spec(
                    "      extractFrom: { headers: [{ name: \"x token\" }] }\n",
                    "",
                ),
                "c.yaml:28:40: SecurityPolicy default/p: spec.jwt.providers[0].extractFrom.headers[0].name: invalid header name \"x token\"",
            ),
            (
                jwt_spec("      extractFrom: { headers: [{ valuePrefix: x }] }\n", ""),
                "spec.jwt.providers[0].extractFrom.headers[0]: missing field `name`",
            ),
            (
                jwt_spec("      extractFrom: { cookies: [\"a;b\"] }\n", ""),
                "spec.jwt.providers[0].extractFrom.cookies[0]: invalid cookie name \"a;b\"",
            ),
            (
                jwt_spec("      extractFrom: { params: [\"a=b\"] }\n", ""),
                "spec.jwt.providers[0].extractFrom.params[0]: invalid query parameter name",
            ),
            (
                jwt_spec("      extractFrom: { query: [a] }\n", ""),
                "spec.jwt.providers[0].extractFrom.query: unknown field `query`",
            ),
            (
                jwt_spec("", "    optional: sometimes\n"),
                "spec.jwt.optional: invalid boolean",
            ),
            (
                allow("{}"),
                "spec.authorization.rules[0].principal: a rule needs clientCIDRs or jwt",
            ),
            (
                allow("{ jwt: { provider: idp, claims: [{ name: sub, values: [a] }] } }"),
                "spec.authorization.rules[0].principal.jwt.provider: no provider \"idp\": principal.jwt needs spec.jwt",
            ),
            (
                jwt_spec("", &allow("{ jwt: { provider: other, scopes: [read] } }")),
                "c.yaml:31:37: SecurityPolicy default/p: spec.authorization.rules[0].principal.jwt.provider: no provider \"other\" in spec.jwt.providers (have idp)",
            ),
            (
                jwt_spec("", &allow("{ jwt: { provider: idp } }")),
                "spec.authorization.rules[0].principal.jwt: name at least one of claims and scopes",
            ),
            (
                jwt_spec(
                    "",
                    &allow("{ jwt: { provider: idp, claims: [{ name: a..b, values: [x] }] } }"),
                ),
                "spec.authorization.rules[0].principal.jwt.claims[0].name: invalid claim name \"a..b\"",
            ),
            (
                jwt_spec(
                    "",
                    &allow("{ jwt: { provider: idp, claims: [{ name: sub, values: [] }] } }"),
                ),
                "spec.authorization.rules[0].principal.jwt.claims[0].values: name at least one value",
            ),
            (
                jwt_spec(
                    "",
                    &allow(
                        "{ jwt: { provider: idp, claims: [{ name: sub, valueType: Int, values: [a] }] } }",
                    ),
                ),
                "spec.authorization.rules[0].principal.jwt.claims[0].valueType: unknown variant `Int`",
            ),
            (
                jwt_spec(
                    "",
                    &allow("{ jwt: { provider: idp, scopes: [\"read write\"] } }"),
                ),
                "spec.authorization.rules[0].principal.jwt.scopes[0]: invalid scope \"read write\"",
            ),
        ] {
            let all = errors(&spec);
            assert!(all.contains(want), "{spec}: want {want:?} in:\n{all}");
        }
        // A principal may combine addresses and claims.
        assert_eq!(
            errors(&jwt_spec(
                "",
                &allow("{ clientCIDRs: [10.0.0.0/8], jwt: { provider: idp, scopes: [read] } }")
            )),
            ""
        );
    }

    proptest! {
        /// The lookups translation uses equal the attachment resolution status reports, for
        /// listeners and for route rules.
        #[test]
        fn lookup_equals_resolution(policies in prop::collection::btree_map(0u8..6, (any::<bool>(), prop::option::of(0u8..3)), 0..6)) {
            let mut text = GW.to_owned();
            for (p, (gw, s)) in &policies {
                let (kind, sections) = if *gw { ("Gateway", ["a", "b", "zz"]) } else { ("HTTPRoute", ["one", "two", "zz"]) };
                text += &policy(&format!("p{p}"), kind, s.map(|s| sections[s as usize]));
            }
            let set = ConfigSet::build([("c.yaml", text)]).unwrap();
            let res = set.security_policy_resolution();
            let gw = ObjectKey::new("default", "edge");
            let t = TargetId { kind: TargetKind::Gateway, key: gw.clone() };
            for l in ["a", "b"] {
                prop_assert_eq!(
                    set.security_policy_for(TargetKind::Gateway, &gw, Some(l)).map(|p| p.key()),
                    res.effective(&t, Some(l)).cloned()
                );
            }
            let r = ObjectKey::new("default", "r");
            let t = TargetId { kind: TargetKind::HttpRoute, key: r.clone() };
            for rule in ["one", "two"] {
                prop_assert_eq!(
                    set.security_policy_for(TargetKind::HttpRoute, &r, Some(rule)).map(|p| p.key()),
                    res.effective(&t, Some(rule)).cloned()
                );
            }
        }
    }
}
