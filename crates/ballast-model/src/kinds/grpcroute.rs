//! `gateway.networking.k8s.io/v1` `GRPCRoute`: gRPC requests matched by service, method and
//! headers, sent to Backends over HTTP/2.
//!
//! A gRPC call is an HTTP/2 `POST /{service}/{method}`, so a GRPCRoute *is* an HTTPRoute with
//! path matches built from its method matches. Parsing therefore also builds that HTTPRoute
//! ([`GrpcRoute::as_http`]): attachment, hostname intersection, precedence against HTTPRoutes
//! on the same listener, filters, weights and status all reuse the HTTPRoute code instead of a
//! copy of it.

use std::sync::Arc;

use serde::Deserialize;

use super::{
    FilterType, HeaderMatch, HeaderModifier, HttpBackendRef, HttpRoute, HttpRouteFilter,
    HttpRouteMatch, HttpRouteRule, HttpRouteSpec, Metadata, ParentRef, PathMatch, PathMatchType,
    RequestMirror, Source, object_kind,
};
use crate::spanned::{Pos, Spanned};

#[derive(Clone, Debug)]
pub struct GrpcRoute {
    pub metadata: Metadata,
    pub spec: GrpcRouteSpec,
    pub source: Source,
    /// The equivalent HTTPRoute (same metadata and source), built once at parse time so every
    /// consumer shares one `Arc` (translation caches compare by pointer first).
    pub as_http: Arc<HttpRoute>,
}
object_kind!(GrpcRoute, super::Kind::GrpcRoute);

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GrpcRouteSpec {
    #[serde(default)]
    pub parent_refs: Vec<ParentRef>,
    #[serde(default)]
    pub hostnames: Vec<Spanned<String>>,
    #[serde(default)]
    pub rules: Vec<GrpcRouteRule>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GrpcRouteRule {
    #[serde(default)]
    pub name: Option<String>,
    /// None: every gRPC request.
    #[serde(default)]
    pub matches: Vec<GrpcRouteMatch>,
    #[serde(default)]
    pub filters: Vec<GrpcRouteFilter>,
    #[serde(default)]
    pub backend_refs: Vec<HttpBackendRef>,
    /// As on an HTTPRoute rule (validated, translated and reported through [`GrpcRoute::as_http`]).
    #[serde(default)]
    pub session_persistence: Option<super::SessionPersistence>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcRouteMatch {
    #[serde(default)]
    pub method: Option<GrpcMethodMatch>,
    #[serde(default)]
    pub headers: Vec<HeaderMatch>,
}

/// Gateway API `GRPCMethodMatch`: at least one of `service` and `method`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcMethodMatch {
    #[serde(rename = "type", default)]
    pub type_: GrpcMethodMatchType,
    #[serde(default)]
    pub service: Option<Spanned<String>>,
    #[serde(default)]
    pub method: Option<Spanned<String>>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
pub enum GrpcMethodMatchType {
    #[default]
    Exact,
    RegularExpression,
}

/// The filters GRPCRoute shares with HTTPRoute (Gateway API core + extended `RequestMirror`;
/// `ExtensionRef`, which ballast does not implement, is rejected at parse naming the type).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GrpcRouteFilter {
    #[serde(rename = "type")]
    pub type_: Spanned<GrpcFilterType>,
    #[serde(default)]
    pub request_header_modifier: Option<HeaderModifier>,
    #[serde(default)]
    pub response_header_modifier: Option<HeaderModifier>,
    /// Validated and translated like HTTPRoute's (the target gets an HTTP/2 cluster).
    #[serde(default)]
    pub request_mirror: Option<RequestMirror>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
pub enum GrpcFilterType {
    RequestHeaderModifier,
    ResponseHeaderModifier,
    RequestMirror,
}

/// Regex of one path segment (a service or method name never contains `/`).
const ANY_SEGMENT: &str = "[^/]+";

impl GrpcMethodMatch {
    /// The HTTP path match of this method match. Exact service and method → `Exact
    /// /{service}/{method}`; service only → `PathPrefix /{service}`; anything else → a
    /// regular expression over the two path segments.
    pub fn path_match(&self) -> PathMatch {
        let pos = self
            .service
            .as_ref()
            .or(self.method.as_ref())
            .map_or(Pos::UNKNOWN, |s| s.pos);
        let (type_, value) = match (self.type_, &self.service, &self.method) {
            (GrpcMethodMatchType::Exact, Some(s), Some(m)) => {
                (PathMatchType::Exact, format!("/{}/{}", s.value, m.value))
            }
            (GrpcMethodMatchType::Exact, Some(s), None) => {
                (PathMatchType::PathPrefix, format!("/{}", s.value))
            }
            (GrpcMethodMatchType::Exact, None, m) => (
                PathMatchType::RegularExpression,
                format!(
                    "/{ANY_SEGMENT}/{}",
                    m.as_ref().map_or(ANY_SEGMENT.into(), |m| regex::escape(m))
                ),
            ),
            (GrpcMethodMatchType::RegularExpression, s, m) => {
                let part = |p: &Option<Spanned<String>>| {
                    p.as_ref()
                        .map_or(ANY_SEGMENT.to_owned(), |p| format!("(?:{})", p.value))
                };
                (
                    PathMatchType::RegularExpression,
                    format!("/{}/{}", part(s), part(m)),
                )
            }
        };
        PathMatch {
            type_,
            value: Spanned::new(value, pos),
        }
    }
}

impl GrpcRouteSpec {
    /// The equivalent HTTPRoute spec (rules and matches defaulted as HTTPRoute parsing does).
    pub fn to_http(&self) -> HttpRouteSpec {
        let mut rules: Vec<HttpRouteRule> = self
            .rules
            .iter()
            .map(|r| HttpRouteRule {
                name: r.name.clone().map(|n| Spanned::new(n, Pos::UNKNOWN)),
                matches: r
                    .matches
                    .iter()
                    .map(|m| HttpRouteMatch {
                        path: m
                            .method
                            .as_ref()
                            .map_or_else(PathMatch::default, |mm| mm.path_match()),
                        headers: m.headers.clone(),
                        query_params: Vec::new(),
                        method: None,
                    })
                    .collect(),
                filters: r.filters.iter().map(GrpcRouteFilter::to_http).collect(),
                backend_refs: r.backend_refs.clone(),
                timeouts: None,
                retry: None,
                session_persistence: r.session_persistence.clone().map(Box::new),
            })
            .collect();
        if rules.is_empty() {
            rules.push(HttpRouteRule {
                name: None,
                matches: Vec::new(),
                filters: Vec::new(),
                backend_refs: Vec::new(),
                timeouts: None,
                retry: None,
                session_persistence: None,
            });
        }
        for rule in &mut rules {
            if rule.matches.is_empty() {
                rule.matches.push(HttpRouteMatch::default());
            }
        }
        HttpRouteSpec {
            parent_refs: self.parent_refs.clone(),
            hostnames: self.hostnames.clone(),
            rules,
        }
    }
}

impl GrpcRouteFilter {
    fn to_http(&self) -> HttpRouteFilter {
        let type_ = match *self.type_ {
            GrpcFilterType::RequestHeaderModifier => FilterType::RequestHeaderModifier,
            GrpcFilterType::ResponseHeaderModifier => FilterType::ResponseHeaderModifier,
            GrpcFilterType::RequestMirror => FilterType::RequestMirror,
        };
        HttpRouteFilter {
            type_: Spanned::new(type_, self.type_.pos),
            request_header_modifier: self.request_header_modifier.clone(),
            response_header_modifier: self.response_header_modifier.clone(),
            request_redirect: None,
            url_rewrite: None,
            request_mirror: self.request_mirror.clone(),
            cors: None,
        }
    }
}

impl GrpcRoute {
    /// Builds the route and its HTTPRoute equivalent.
    pub fn new(metadata: Metadata, spec: GrpcRouteSpec, source: Source) -> GrpcRoute {
        let as_http = Arc::new(HttpRoute {
            metadata: metadata.clone(),
            spec: spec.to_http(),
            source: source.clone(),
        });
        GrpcRoute {
            metadata,
            spec,
            source,
            as_http,
        }
    }
}
