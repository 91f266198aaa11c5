//! `gateway.networking.k8s.io/v1` `HTTPRoute`: how requests on a Gateway's listeners are matched,
//! modified and sent to Backends.

use std::time::Duration;

use serde::Deserialize;

use super::{BALLAST_GROUP, Metadata, Source, object_kind};
use crate::duration::de_opt_duration;
use crate::spanned::{Pos, Spanned};

#[derive(Clone, Debug)]
pub struct HttpRoute {
    pub metadata: Metadata,
    pub spec: HttpRouteSpec,
    pub source: Source,
}
object_kind!(HttpRoute, super::Kind::HttpRoute);

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpRouteSpec {
    #[serde(default)]
    pub parent_refs: Vec<ParentRef>,
    #[serde(default)]
    pub hostnames: Vec<Spanned<String>>,
    /// Never empty after parsing: no rules means one rule with the default match.
    #[serde(default)]
    pub rules: Vec<HttpRouteRule>,
}

/// The Gateway (and optionally one of its listeners) a route attaches to.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ParentRef {
    /// Defaults to `gateway.networking.k8s.io`.
    #[serde(default)]
    pub group: Option<String>,
    /// Defaults to `Gateway`.
    #[serde(default)]
    pub kind: Option<String>,
    pub name: Spanned<String>,
    /// Defaults to the route's namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub section_name: Option<String>,
    #[serde(default)]
    pub port: Option<Spanned<u32>>,
}

impl ParentRef {
    /// Whether this names a Gateway (the only parent kind ballast serves).
    pub fn is_gateway(&self) -> bool {
        self.group.as_deref().unwrap_or(super::GATEWAY_GROUP) == super::GATEWAY_GROUP
            && self.kind.as_deref().unwrap_or("Gateway") == "Gateway"
    }

    pub fn namespace_or<'a>(&'a self, route_namespace: &'a str) -> &'a str {
        self.namespace.as_deref().unwrap_or(route_namespace)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpRouteRule {
    /// Unique within the route (a DNS label); names the rule's Envoy routes and, when set,
    /// gives them per-rule stats (`vhost.*.route.{ns}/{route}/{name}.*`).
    #[serde(default)]
    pub name: Option<Spanned<String>>,
    /// Never empty after parsing: Gateway API's default is `PathPrefix /`.
    #[serde(default)]
    pub matches: Vec<HttpRouteMatch>,
    #[serde(default)]
    pub filters: Vec<HttpRouteFilter>,
    /// Empty means the rule answers 500 unless a filter (redirect) answers.
    #[serde(default)]
    pub backend_refs: Vec<HttpBackendRef>,
    ///
    /// This and the next two are boxed: rarely set, and inline they made every rule ~600 bytes
    /// where 17,000 rules (issue #13, W4) set none of them.
    #[serde(default)]
    pub timeouts: Option<Box<HttpRouteTimeouts>>,
    /// Gateway API `retry` (`codes`, `attempts`, `backoff`), plus ballast's older
    /// `perTryTimeout`/`retryOn` extension fields.
    #[serde(default)]
    pub retry: Option<Box<RetryPolicy>>,
    /// Gateway API `sessionPersistence`: requests of one session (a cookie or header Envoy
    /// sets) keep going to the endpoint that served the first one.
    #[serde(default)]
    pub session_persistence: Option<Box<SessionPersistence>>,
}

/// Gateway API `SessionPersistence` (GEP-1619). Both published shapes load: v1.1–v1.4's
/// `sessionName` / `idleTimeout` / `cookieConfig.lifetimeType`, and the later union with
/// `cookie: {name, path, lifetimeType}` / `header: {name}`, so manifests of either carry over.
/// Envoy's stateful session filter remembers the endpoint in the cookie or header; see
/// [`SessionPersistence::mode`] and [`SessionPersistence::unsupported`] for what it can do.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SessionPersistence {
    /// The cookie or header name (v1.1–v1.4); generated from the route and rule when unset.
    #[serde(default)]
    pub session_name: Option<Spanned<String>>,
    /// Cookie `Permanent`: the cookie's `Max-Age` (required).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub absolute_timeout: Option<Spanned<Duration>>,
    /// Not supported by Envoy (status `UnsupportedValue`); removed from Gateway API later.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub idle_timeout: Option<Spanned<Duration>>,
    /// `Cookie` (the default) or `Header`.
    #[serde(rename = "type", default)]
    pub type_: Option<Spanned<SessionPersistenceType>>,
    /// v1.1–v1.4 cookie settings (`lifetimeType`).
    #[serde(default)]
    pub cookie_config: Option<CookieConfig>,
    /// Later Gateway API cookie settings (`name`, `path`, `lifetimeType`).
    #[serde(default)]
    pub cookie: Option<CookieConfig>,
    /// Later Gateway API header settings (`name`).
    #[serde(default)]
    pub header: Option<SessionHeaderConfig>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
pub enum SessionPersistenceType {
    #[default]
    Cookie,
    Header,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CookieConfig {
    #[serde(default)]
    pub name: Option<Spanned<String>>,
    /// The cookie's `Path`; `/` when unset (Gateway API's default).
    #[serde(default)]
    pub path: Option<Spanned<String>>,
    #[serde(default)]
    pub lifetime_type: Option<Spanned<CookieLifetimeType>>,
}

/// `Session` (the default): no `Max-Age`, the browser drops the cookie when it closes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
pub enum CookieLifetimeType {
    #[default]
    Session,
    Permanent,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionHeaderConfig {
    pub name: Spanned<String>,
}

/// What a valid [`SessionPersistence`] asks Envoy for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionMode {
    /// `ttl`: the cookie's `Max-Age` (`None`: a session cookie).
    Cookie {
        name: String,
        path: String,
        ttl: Option<Duration>,
    },
    Header {
        name: String,
    },
}

impl SessionPersistence {
    pub fn type_(&self) -> SessionPersistenceType {
        self.type_.as_ref().map(|t| t.value).unwrap_or_default()
    }

    /// The cookie settings, whichever shape gave them.
    pub fn cookie_settings(&self) -> Option<&CookieConfig> {
        self.cookie.as_ref().or(self.cookie_config.as_ref())
    }

    pub fn lifetime(&self) -> CookieLifetimeType {
        self.cookie_settings()
            .and_then(|c| c.lifetime_type.as_ref())
            .map(|l| l.value)
            .unwrap_or_default()
    }

    /// The explicit cookie/header name, if any.
    pub fn explicit_name(&self) -> Option<&Spanned<String>> {
        let specific = match self.type_() {
            SessionPersistenceType::Cookie => self.cookie_settings().and_then(|c| c.name.as_ref()),
            SessionPersistenceType::Header => self.header.as_ref().map(|h| &h.name),
        };
        specific.or(self.session_name.as_ref())
    }

    /// The Envoy session settings; `default_name` (unique per route rule) names the cookie or
    /// header when the config does not.
    pub fn mode(&self, default_name: impl FnOnce() -> String) -> SessionMode {
        let name = self
            .explicit_name()
            .map_or_else(default_name, |n| n.value.clone());
        match self.type_() {
            SessionPersistenceType::Cookie => SessionMode::Cookie {
                name,
                path: self
                    .cookie_settings()
                    .and_then(|c| c.path.as_ref())
                    .map_or_else(|| "/".to_owned(), |p| p.value.clone()),
                ttl: match self.lifetime() {
                    CookieLifetimeType::Permanent => {
                        self.absolute_timeout.as_ref().map(|d| d.value)
                    }
                    CookieLifetimeType::Session => None,
                },
            },
            SessionPersistenceType::Header => SessionMode::Header { name },
        }
    }

    /// `(field, why)` for each setting Envoy cannot honour: the route is served without it and
    /// the status says so (`Accepted=False UnsupportedValue`). `field` is relative to the
    /// `sessionPersistence` object.
    pub fn unsupported(&self) -> Vec<(&'static str, &'static str)> {
        let mut out = Vec::new();
        if self.idle_timeout.is_some() {
            out.push((
                "idleTimeout",
                "Envoy's stateful sessions have no idle timeout (ignored)",
            ));
        }
        if self.absolute_timeout.is_some() {
            match (self.type_(), self.lifetime()) {
                (SessionPersistenceType::Cookie, CookieLifetimeType::Permanent) => {}
                (SessionPersistenceType::Cookie, CookieLifetimeType::Session) => out.push((
                    "absoluteTimeout",
                    "a Session cookie's lifetime is not tracked by Envoy (ignored; use lifetimeType: Permanent for a Max-Age)",
                )),
                (SessionPersistenceType::Header, _) => out.push((
                    "absoluteTimeout",
                    "Envoy does not expire header-based sessions (ignored)",
                )),
            }
        }
        out
    }
}

/// All conditions of one match must hold (AND); the matches of a rule are alternatives (OR).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpRouteMatch {
    #[serde(default)]
    pub path: PathMatch,
    #[serde(default)]
    pub headers: Vec<HeaderMatch>,
    #[serde(default)]
    pub query_params: Vec<QueryParamMatch>,
    #[serde(default)]
    pub method: Option<HttpMethod>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathMatch {
    #[serde(rename = "type", default)]
    pub type_: PathMatchType,
    #[serde(default = "slash")]
    pub value: Spanned<String>,
}

fn slash() -> Spanned<String> {
    Spanned::new("/".to_owned(), Pos::UNKNOWN)
}

impl Default for PathMatch {
    fn default() -> Self {
        PathMatch {
            type_: PathMatchType::PathPrefix,
            value: slash(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
pub enum PathMatchType {
    Exact,
    /// Element-wise prefix: `/foo` matches `/foo` and `/foo/bar`, not `/foobar`.
    #[default]
    PathPrefix,
    RegularExpression,
}

/// A header match; header names compare case-insensitively.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderMatch {
    #[serde(rename = "type", default)]
    pub type_: StringMatchType,
    pub name: Spanned<String>,
    pub value: Spanned<String>,
}

/// A query parameter match; names compare exactly (case-sensitively).
pub type QueryParamMatch = HeaderMatch;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
pub enum StringMatchType {
    #[default]
    Exact,
    RegularExpression,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Connect,
    Options,
    Trace,
    Patch,
}

impl HttpMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Get => "GET",
            HttpMethod::Head => "HEAD",
            HttpMethod::Post => "POST",
            HttpMethod::Put => "PUT",
            HttpMethod::Delete => "DELETE",
            HttpMethod::Connect => "CONNECT",
            HttpMethod::Options => "OPTIONS",
            HttpMethod::Trace => "TRACE",
            HttpMethod::Patch => "PATCH",
        }
    }
}

/// A filter in Gateway API shape: `type` plus the one field named after it. Validation ensures
/// exactly that field is set; use [`HttpRouteFilter::action`] to read it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpRouteFilter {
    #[serde(rename = "type")]
    pub type_: Spanned<FilterType>,
    #[serde(default)]
    pub request_header_modifier: Option<HeaderModifier>,
    #[serde(default)]
    pub response_header_modifier: Option<HeaderModifier>,
    #[serde(default)]
    pub request_redirect: Option<RequestRedirect>,
    #[serde(default, rename = "urlRewrite")]
    pub url_rewrite: Option<UrlRewrite>,
    #[serde(default)]
    pub request_mirror: Option<RequestMirror>,
    #[serde(default)]
    pub cors: Option<Cors>,
}

/// Gateway API `CORS` (HTTPCORSFilter, v1.2+): Envoy's CORS filter answers preflights and adds
/// the `Access-Control-*` headers for the rule's routes. Lists keep their YAML positions so
/// validation can point at the bad entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Cors {
    /// `*`, or `scheme://host[:port]` where the host may contain `*` (any labels to its left).
    #[serde(default)]
    pub allow_origins: Vec<Spanned<String>>,
    /// Sends `Access-Control-Allow-Credentials: true` when set.
    #[serde(default)]
    pub allow_credentials: Option<bool>,
    /// Method names (case-sensitive) or `*` alone.
    #[serde(default)]
    pub allow_methods: Vec<Spanned<String>>,
    #[serde(default)]
    pub allow_headers: Vec<Spanned<String>>,
    #[serde(default)]
    pub expose_headers: Vec<Spanned<String>>,
    /// Seconds a preflight answer may be cached; Gateway API's default is 5.
    #[serde(default)]
    pub max_age: Option<Spanned<i64>>,
}

impl Cors {
    /// `Access-Control-Max-Age` in seconds (the Gateway API default when unset).
    pub fn max_age_seconds(&self) -> i64 {
        self.max_age.as_ref().map_or(5, |m| m.value)
    }
}

/// Gateway API `RequestMirror`: a copy of each request (or of `percent` / `fraction` of them) is
/// sent to another Backend; its answer is ignored. The only filter a rule may have several of.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RequestMirror {
    /// Resolved like a rule's backendRefs (ReferenceGrant included); `weight` is ignored.
    pub backend_ref: HttpBackendRef,
    /// 0..=100; all requests when neither this nor `fraction` is given.
    #[serde(default)]
    pub percent: Option<Spanned<u32>>,
    #[serde(default)]
    pub fraction: Option<Fraction>,
}

/// `numerator / denominator` of requests (denominator defaults to 100).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fraction {
    pub numerator: Spanned<u32>,
    #[serde(default = "hundred")]
    pub denominator: Spanned<u32>,
}

fn hundred() -> Spanned<u32> {
    Spanned::new(100, Pos::UNKNOWN)
}

impl RequestMirror {
    /// The mirrored share in millionths (validated: at most a million).
    pub fn millionths(&self) -> u32 {
        let share = match (&self.percent, &self.fraction) {
            (Some(p), _) => u64::from(p.value) * 10_000,
            (None, Some(f)) if f.denominator.value > 0 => {
                u64::from(f.numerator.value) * 1_000_000 / u64::from(f.denominator.value)
            }
            _ => 1_000_000,
        };
        u32::try_from(share.min(1_000_000)).unwrap_or(1_000_000)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
pub enum FilterType {
    RequestHeaderModifier,
    ResponseHeaderModifier,
    RequestRedirect,
    #[serde(rename = "URLRewrite")]
    UrlRewrite,
    RequestMirror,
    #[serde(rename = "CORS")]
    Cors,
}

impl FilterType {
    pub fn as_str(self) -> &'static str {
        match self {
            FilterType::RequestHeaderModifier => "RequestHeaderModifier",
            FilterType::ResponseHeaderModifier => "ResponseHeaderModifier",
            FilterType::RequestRedirect => "RequestRedirect",
            FilterType::UrlRewrite => "URLRewrite",
            FilterType::RequestMirror => "RequestMirror",
            FilterType::Cors => "CORS",
        }
    }

    /// The YAML field that carries this filter's configuration.
    pub fn field(self) -> &'static str {
        match self {
            FilterType::RequestHeaderModifier => "requestHeaderModifier",
            FilterType::ResponseHeaderModifier => "responseHeaderModifier",
            FilterType::RequestRedirect => "requestRedirect",
            FilterType::UrlRewrite => "urlRewrite",
            FilterType::RequestMirror => "requestMirror",
            FilterType::Cors => "cors",
        }
    }
}

/// A filter's configuration, selected by its type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterAction<'a> {
    RequestHeaderModifier(&'a HeaderModifier),
    ResponseHeaderModifier(&'a HeaderModifier),
    RequestRedirect(&'a RequestRedirect),
    UrlRewrite(&'a UrlRewrite),
    RequestMirror(&'a RequestMirror),
    Cors(&'a Cors),
}

impl HttpRouteFilter {
    /// The configuration matching `type`; `None` only for filters that failed validation.
    pub fn action(&self) -> Option<FilterAction<'_>> {
        match *self.type_ {
            FilterType::RequestHeaderModifier => self
                .request_header_modifier
                .as_ref()
                .map(FilterAction::RequestHeaderModifier),
            FilterType::ResponseHeaderModifier => self
                .response_header_modifier
                .as_ref()
                .map(FilterAction::ResponseHeaderModifier),
            FilterType::RequestRedirect => self
                .request_redirect
                .as_ref()
                .map(FilterAction::RequestRedirect),
            FilterType::UrlRewrite => self.url_rewrite.as_ref().map(FilterAction::UrlRewrite),
            FilterType::RequestMirror => self
                .request_mirror
                .as_ref()
                .map(FilterAction::RequestMirror),
            FilterType::Cors => self.cors.as_ref().map(FilterAction::Cors),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderModifier {
    /// Overwrite (or add) these headers.
    #[serde(default)]
    pub set: Vec<HttpHeader>,
    /// Append these headers (keeping existing values).
    #[serde(default)]
    pub add: Vec<HttpHeader>,
    /// Remove these headers (by name, case-insensitive).
    #[serde(default)]
    pub remove: Vec<Spanned<String>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpHeader {
    pub name: Spanned<String>,
    pub value: Spanned<String>,
}

/// Answers with a redirect instead of forwarding; unset parts keep the request's.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RequestRedirect {
    #[serde(default)]
    pub scheme: Option<Spanned<String>>,
    #[serde(default)]
    pub hostname: Option<Spanned<String>>,
    #[serde(default)]
    pub path: Option<PathModifier>,
    #[serde(default)]
    pub port: Option<Spanned<u32>>,
    /// 301, 302 (default), 303, 307 or 308.
    #[serde(default = "found")]
    pub status_code: Spanned<u16>,
}

fn found() -> Spanned<u16> {
    Spanned::new(302, Pos::UNKNOWN)
}

/// Rewrites the request before forwarding it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UrlRewrite {
    #[serde(default)]
    pub hostname: Option<Spanned<String>>,
    #[serde(default)]
    pub path: Option<PathModifier>,
}

/// Gateway API `HTTPPathModifier`: `type` plus the field named after it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PathModifier {
    #[serde(rename = "type")]
    pub type_: Spanned<PathModifierType>,
    #[serde(default)]
    pub replace_full_path: Option<Spanned<String>>,
    /// Replaces the part of the path the rule's `PathPrefix` match matched.
    #[serde(default)]
    pub replace_prefix_match: Option<Spanned<String>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
pub enum PathModifierType {
    ReplaceFullPath,
    ReplacePrefixMatch,
}

/// The validated meaning of a [`PathModifier`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathRewrite<'a> {
    FullPath(&'a str),
    PrefixMatch(&'a str),
}

impl PathModifier {
    /// The replacement matching `type`; `None` only for modifiers that failed validation.
    pub fn rewrite(&self) -> Option<PathRewrite<'_>> {
        match *self.type_ {
            PathModifierType::ReplaceFullPath => self
                .replace_full_path
                .as_ref()
                .map(|s| PathRewrite::FullPath(s.as_str())),
            PathModifierType::ReplacePrefixMatch => self
                .replace_prefix_match
                .as_ref()
                .map(|s| PathRewrite::PrefixMatch(s.as_str())),
        }
    }
}

/// A weighted reference to a core `Service` (the Gateway API default) or a Ballast `Backend`
/// (`group: ballast.dev`, `kind: Backend`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpBackendRef {
    /// `""` (core, the default) for a Service; `ballast.dev` for a Backend.
    #[serde(default)]
    pub group: Option<Spanned<String>>,
    /// `Service` (the default) or `Backend`.
    #[serde(default)]
    pub kind: Option<Spanned<String>>,
    pub name: Spanned<String>,
    /// Defaults to the route's namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The Service port (required for a Service, as in Gateway API); ignored for a Backend,
    /// whose endpoints carry their own ports.
    #[serde(default)]
    pub port: Option<Spanned<u32>>,
    /// Share of the rule's traffic, relative to its other backendRefs (0 = none).
    #[serde(default = "one")]
    pub weight: Spanned<u32>,
    /// Gateway API `HTTPBackendRef.filters`: applied only to requests sent to this backend (so
    /// one backend of a split can get a header the others do not). Ballast serves the header
    /// modifiers; other types are ignored and reported (`Accepted=False UnsupportedValue`),
    /// so the route keeps serving.
    #[serde(default)]
    pub filters: Vec<HttpRouteFilter>,
}

fn one() -> Spanned<u32> {
    Spanned::new(1, Pos::UNKNOWN)
}

/// What the `group`/`kind` of a backendRef say, before looking anything up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendRefKind {
    /// Neither given: a Service in Gateway API; older Ballast configs meant a Backend
    /// ([`crate::set::ConfigSet::backend_target`] decides).
    Unspecified,
    Service,
    Backend,
    /// Anything else: not served.
    Other,
}

impl HttpBackendRef {
    pub fn ref_kind(&self) -> BackendRefKind {
        let group = self.group.as_ref().map(|g| g.as_str());
        let kind = self.kind.as_ref().map(|k| k.as_str());
        match (group, kind) {
            (None, None) => BackendRefKind::Unspecified,
            (None | Some(""), Some("Service")) | (Some(""), None) => BackendRefKind::Service,
            // `kind: Backend` alone was accepted before Services existed.
            (Some(BALLAST_GROUP), None | Some("Backend")) | (None, Some("Backend")) => {
                BackendRefKind::Backend
            }
            _ => BackendRefKind::Other,
        }
    }

    /// Whether this may name a Ballast `Backend` (explicitly or by the old shorthand).
    pub fn is_backend(&self) -> bool {
        matches!(
            self.ref_kind(),
            BackendRefKind::Backend | BackendRefKind::Unspecified
        )
    }

    /// Whether this may name a core Service.
    pub fn is_service(&self) -> bool {
        matches!(
            self.ref_kind(),
            BackendRefKind::Service | BackendRefKind::Unspecified
        )
    }

    /// Every Backend key this ref may resolve to, from the ref alone (for dependency
    /// tracking): the Ballast Backend and/or the Backend derived from the Service port.
    pub fn candidate_keys(&self, route_namespace: &str) -> Vec<super::ObjectKey> {
        let ns = self.namespace_or(route_namespace);
        let mut out = Vec::new();
        if self.is_backend() {
            out.push(super::ObjectKey::new(ns, self.name.as_str()));
        }
        if self.is_service()
            && let Some(p) = &self.port
        {
            out.push(super::ObjectKey::new(
                ns,
                super::service_backend_name(&self.name, p.value),
            ));
        }
        out
    }

    pub fn namespace_or<'a>(&'a self, route_namespace: &'a str) -> &'a str {
        self.namespace.as_deref().unwrap_or(route_namespace)
    }

    /// The header modifiers among this ref's own filters (the last of each type wins;
    /// validation refuses duplicates), as (request, response).
    pub fn header_modifiers(&self) -> (Option<&HeaderModifier>, Option<&HeaderModifier>) {
        let (mut req, mut resp) = (None, None);
        for f in &self.filters {
            match f.action() {
                Some(FilterAction::RequestHeaderModifier(m)) => req = Some(m),
                Some(FilterAction::ResponseHeaderModifier(m)) => resp = Some(m),
                _ => {}
            }
        }
        (req, resp)
    }

    /// `(index, type)` of each of this ref's filters Ballast does not apply on a backendRef.
    pub fn unsupported_filters(&self) -> impl Iterator<Item = (usize, FilterType)> + '_ {
        self.filters.iter().enumerate().filter_map(|(k, f)| {
            let t = *f.type_;
            (!matches!(
                t,
                FilterType::RequestHeaderModifier | FilterType::ResponseHeaderModifier
            ))
            .then_some((k, t))
        })
    }
}

/// Gateway API timeouts; `0s` disables a timeout.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpRouteTimeouts {
    /// Whole request, from the client's point of view (including retries).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub request: Option<Spanned<Duration>>,
    /// Each request to a backend (each try).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub backend_request: Option<Spanned<Duration>>,
}

/// Retries for a rule (Envoy's retry policy): Gateway API `HTTPRouteRetry` (`codes`, `attempts`,
/// `backoff`) and ballast's extension fields (`perTryTimeout`, `retryOn`), which predate it; both
/// shapes load, so existing configs keep working and standard manifests load unchanged.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RetryPolicy {
    /// Retries after the first try (0 disables retrying); Gateway API leaves the default to the
    /// implementation: 1, as Envoy's.
    #[serde(default = "one")]
    pub attempts: Spanned<u32>,
    /// Gateway API: response codes (400..=599) that are retried, besides connection failures.
    #[serde(default)]
    pub codes: Option<Vec<Spanned<u32>>>,
    /// Gateway API: the base interval between retries (Envoy backs off exponentially with jitter
    /// from it, up to 10 times it); Envoy's 25ms when omitted.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub backoff: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub per_try_timeout: Option<Spanned<Duration>>,
    /// Envoy `retry_on` conditions; default [`DEFAULT_RETRY_ON`].
    #[serde(default)]
    pub retry_on: Option<Vec<Spanned<String>>>,
}

/// Conditions retried when `retryOn` is not given: failures where the request was not processed.
pub const DEFAULT_RETRY_ON: &[&str] = &["connect-failure", "refused-stream", "unavailable"];

/// The Envoy `x-envoy-retry-on` / gRPC conditions accepted in `retryOn`.
pub const RETRY_ON_CONDITIONS: &[&str] = &[
    "5xx",
    "gateway-error",
    "reset",
    "reset-before-request",
    "connect-failure",
    "envoy-ratelimited",
    "retriable-4xx",
    "refused-stream",
    "retriable-status-codes",
    "retriable-headers",
    "http3-post-connect-failure",
    "cancelled",
    "deadline-exceeded",
    "internal",
    "resource-exhausted",
    "unavailable",
];

impl RetryPolicy {
    /// The conditions to retry on, with the default applied, and `retriable-status-codes` when
    /// `codes` are given.
    pub fn retry_on(&self) -> Vec<&str> {
        let mut on: Vec<&str> = match &self.retry_on {
            Some(list) => list.iter().map(|s| s.as_str()).collect(),
            None => DEFAULT_RETRY_ON.to_vec(),
        };
        if self.codes.as_ref().is_some_and(|c| !c.is_empty())
            && !on.contains(&"retriable-status-codes")
        {
            on.push("retriable-status-codes");
        }
        on
    }

    /// The `codes` to retry (empty when none).
    pub fn codes(&self) -> Vec<u32> {
        self.codes.iter().flatten().map(|c| c.value).collect()
    }
}
