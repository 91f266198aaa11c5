//! Per-object checks that serde cannot express: ranges, formats, regexes, uniqueness, and the
//! Gateway API rules that make an object structurally invalid. References to other objects are
//! not checked here: an unresolved reference is *status* ([`crate::status`]), not an error.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use base64::Engine;

use crate::error::{ConfigError, ObjectRef};
use crate::hostname::validate_hostname;
use crate::kinds::secret::{SecretDoc, TLS_SECRET_TYPE};
use crate::kinds::*;
use crate::spanned::{Pos, Spanned};

/// Largest backendRef / endpoint weight (Gateway API's bound; keeps Envoy's sums in `u32`).
pub const MAX_WEIGHT: u32 = 1_000_000;

/// Collects the errors of one object.
pub(crate) struct Ctx {
    file: Arc<str>,
    object: ObjectRef,
    doc_pos: Pos,
    errors: Vec<ConfigError>,
}

impl Ctx {
    pub(crate) fn new(file: Arc<str>, object: ObjectRef, doc_pos: Pos) -> Self {
        Ctx {
            file,
            object,
            doc_pos,
            errors: Vec::new(),
        }
    }

    /// Records an error at `pos` (the document start when unknown, e.g. for defaulted values).
    pub(crate) fn err(&mut self, pos: Pos, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(ConfigError {
            file: self.file.clone(),
            pos: pos.or(self.doc_pos),
            object: Some(self.object.clone()),
            field: Some(field.into()),
            message: message.into(),
        });
    }

    pub(crate) fn into_errors(self) -> Vec<ConfigError> {
        self.errors
    }
}

pub(crate) fn metadata(ctx: &mut Ctx, m: &Metadata) {
    if let Err(e) = check_dns_subdomain(&m.name) {
        ctx.err(Pos::UNKNOWN, "metadata.name", format!("name {e}"));
    }
    if let Err(e) = check_dns_label(&m.namespace) {
        ctx.err(Pos::UNKNOWN, "metadata.namespace", format!("namespace {e}"));
    }
}

/// Kubernetes object names (RFC 1123 subdomain), so manifests stay valid in a cluster.
fn check_dns_subdomain(s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{s:?} is not a valid DNS subdomain (lowercase a-z, 0-9, '-', '.', at most 253 characters)"
        ))
    }
}

/// Kubernetes namespaces and Gateway API section names (RFC 1123 label).
fn check_dns_label(s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{s:?} is not a valid DNS label (lowercase a-z, 0-9, '-', at most 63 characters)"
        ))
    }
}

fn port(ctx: &mut Ctx, p: &Spanned<u32>, field: String) {
    if !(1..=65535).contains(&p.value) {
        ctx.err(
            p.pos,
            field,
            format!("port {} is out of range 1..=65535", p.value),
        );
    }
}

fn hostname(ctx: &mut Ctx, h: &Spanned<String>, field: String, allow_wildcard: bool) {
    if let Err(e) = validate_hostname(h) {
        ctx.err(h.pos, field, e);
    } else if !allow_wildcard && h.starts_with('*') {
        ctx.err(
            h.pos,
            field,
            format!("hostname {:?} must not be a wildcard here", h.value),
        );
    }
}

pub(crate) fn gateway(ctx: &mut Ctx, g: &Gateway) {
    metadata(ctx, &g.metadata);
    let a = &g.metadata.annotations;
    if let Some(Err(e)) = a.get(ACCESS_LOG_ANNOTATION).map(|v| parse_sink(v)) {
        ctx.err(
            Pos::UNKNOWN,
            format!("metadata.annotations[{ACCESS_LOG_ANNOTATION}]"),
            e,
        );
    }
    if let Some(Err(e)) = a.get(ACCESS_LOG_FORMAT_ANNOTATION).map(|v| parse_format(v)) {
        ctx.err(
            Pos::UNKNOWN,
            format!("metadata.annotations[{ACCESS_LOG_FORMAT_ANNOTATION}]"),
            e,
        );
    }
    if g.spec.gateway_class_name.is_empty() {
        ctx.err(
            Pos::UNKNOWN,
            "spec.gatewayClassName",
            "gatewayClassName must not be empty",
        );
    }
    if g.spec.listeners.is_empty() {
        ctx.err(
            Pos::UNKNOWN,
            "spec.listeners",
            "a Gateway needs at least one listener",
        );
    }
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (i, l) in g.spec.listeners.iter().enumerate() {
        let f = format!("spec.listeners[{i}]");
        let ns = &l.allowed_routes.namespaces;
        match (ns.from, &ns.selector) {
            (FromNamespaces::Selector, None) => ctx.err(
                Pos::UNKNOWN,
                format!("{f}.allowedRoutes.namespaces.selector"),
                "from: Selector needs a selector",
            ),
            (FromNamespaces::Same | FromNamespaces::All, Some(_)) => ctx.err(
                Pos::UNKNOWN,
                format!("{f}.allowedRoutes.namespaces.selector"),
                "selector is only used with from: Selector",
            ),
            _ => {}
        }
        if let Err(e) = check_dns_label(&l.name) {
            ctx.err(
                l.name.pos,
                format!("{f}.name"),
                format!("listener name {e}"),
            );
        }
        if let Some(first) = names.insert(&l.name, i) {
            ctx.err(
                l.name.pos,
                format!("{f}.name"),
                format!(
                    "duplicate listener name {:?} (also spec.listeners[{first}])",
                    l.name.value
                ),
            );
        }
        port(ctx, &l.port, format!("{f}.port"));
        if let Some(h) = &l.hostname {
            hostname(ctx, h, format!("{f}.hostname"), true);
        }
        match (*l.protocol, &l.tls) {
            (ListenerProtocol::Http | ListenerProtocol::Tcp, Some(_)) => ctx.err(
                l.protocol.pos,
                format!("{f}.tls"),
                "tls is only allowed on HTTPS and TLS listeners",
            ),
            (ListenerProtocol::Https, None) => ctx.err(
                l.protocol.pos,
                format!("{f}.tls"),
                "an HTTPS listener needs tls.certificateRefs",
            ),
            (ListenerProtocol::Https, Some(tls)) if tls.mode == TlsMode::Passthrough => ctx.err(
                l.protocol.pos,
                format!("{f}.tls.mode"),
                "an HTTPS listener terminates TLS; use protocol TLS for Passthrough",
            ),
            (ListenerProtocol::Https, Some(tls)) if tls.certificate_refs.is_empty() => ctx.err(
                l.protocol.pos,
                format!("{f}.tls.certificateRefs"),
                "an HTTPS listener needs at least one certificateRef",
            ),
            (ListenerProtocol::Tls, None) => ctx.err(
                l.protocol.pos,
                format!("{f}.tls"),
                "a TLS listener needs tls.mode (Passthrough, or Terminate with certificateRefs)",
            ),
            (ListenerProtocol::Tls, Some(tls))
                if tls.mode == TlsMode::Terminate && tls.certificate_refs.is_empty() =>
            {
                ctx.err(
                    l.protocol.pos,
                    format!("{f}.tls.certificateRefs"),
                    "a TLS listener in mode Terminate needs at least one certificateRef",
                )
            }
            (ListenerProtocol::Tls, Some(tls))
                if tls.mode == TlsMode::Passthrough && !tls.certificate_refs.is_empty() =>
            {
                ctx.err(
                    l.protocol.pos,
                    format!("{f}.tls.certificateRefs"),
                    "a TLS listener in mode Passthrough does not decrypt; certificateRefs are not allowed",
                )
            }
            _ => {}
        }
        if let Some(tls) = &l.tls {
            for (j, r) in tls.certificate_refs.iter().enumerate() {
                if let Err(e) = check_dns_subdomain(&r.name) {
                    ctx.err(
                        r.name.pos,
                        format!("{f}.tls.certificateRefs[{j}].name"),
                        format!("name {e}"),
                    );
                }
            }
        }
    }
    // Listeners sharing a port that Envoy cannot tell apart are not an error: they are
    // `Conflicted` in status and not served ([`crate::kinds::listener_conflicts`]).
}

pub(crate) fn http_route(ctx: &mut Ctx, r: &HttpRoute) {
    metadata(ctx, &r.metadata);
    for (i, p) in r.spec.parent_refs.iter().enumerate() {
        let f = format!("spec.parentRefs[{i}]");
        if p.name.is_empty() {
            ctx.err(p.name.pos, format!("{f}.name"), "name must not be empty");
        }
        if let Some(port_) = &p.port {
            port(ctx, port_, format!("{f}.port"));
        }
    }
    for (i, h) in r.spec.hostnames.iter().enumerate() {
        hostname(ctx, h, format!("spec.hostnames[{i}]"), true);
    }
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (i, rule) in r.spec.rules.iter().enumerate() {
        route_rule(ctx, rule, &format!("spec.rules[{i}]"));
        if let Some(n) = &rule.name {
            if let Err(e) = check_dns_label(n) {
                ctx.err(n.pos, format!("spec.rules[{i}].name"), format!("name {e}"));
            } else if let Some(first) = names.insert(n.as_str(), i) {
                ctx.err(
                    n.pos,
                    format!("spec.rules[{i}].name"),
                    format!(
                        "rule name {:?} is also used by spec.rules[{first}]",
                        n.value
                    ),
                );
            }
        }
    }
}

/// TLSRoute / TCPRoute through their HTTPRoute equivalents (same field paths for parentRefs,
/// hostnames, rule names and backendRefs), plus what Gateway API requires of them: at least
/// one rule, and backendRefs in every rule (a connection has no other place to go).
pub(crate) fn l4_route(ctx: &mut Ctx, r: &HttpRoute, rules: usize) {
    if rules == 0 {
        ctx.err(Pos::UNKNOWN, "spec.rules", "at least one rule is required");
    }
    for (i, rule) in r.spec.rules.iter().enumerate() {
        if rule.backend_refs.is_empty() {
            ctx.err(
                Pos::UNKNOWN,
                format!("spec.rules[{i}].backendRefs"),
                "at least one backendRef is required",
            );
        }
    }
    http_route(ctx, r);
}

/// GRPCRoute: the method matches here; everything else (parentRefs, hostnames, headers,
/// filters, backendRefs) through its HTTPRoute equivalent, whose field paths are the same.
pub(crate) fn grpc_route(ctx: &mut Ctx, r: &GrpcRoute) {
    for (i, rule) in r.spec.rules.iter().enumerate() {
        for (j, m) in rule.matches.iter().enumerate() {
            let Some(mm) = &m.method else { continue };
            let f = format!("spec.rules[{i}].matches[{j}].method");
            if mm.service.is_none() && mm.method.is_none() {
                ctx.err(
                    Pos::UNKNOWN,
                    f.clone(),
                    "a method match needs service, method or both",
                );
            }
            for (part, value) in [("service", &mm.service), ("method", &mm.method)] {
                let Some(v) = value else { continue };
                let field = format!("{f}.{part}");
                match mm.type_ {
                    GrpcMethodMatchType::RegularExpression => regex(ctx, v, field),
                    GrpcMethodMatchType::Exact => {
                        let ok = if part == "service" {
                            is_grpc_service(v)
                        } else {
                            is_grpc_ident(v)
                        };
                        if !ok || v.len() > 1024 {
                            ctx.err(
                                v.pos,
                                field,
                                format!(
                                    "invalid gRPC {part} name {:?}: expected {}",
                                    v.value,
                                    if part == "service" {
                                        "dot-separated identifiers (a-z, A-Z, 0-9, '_'), e.g. \"pkg.Echo\""
                                    } else {
                                        "an identifier (a-z, A-Z, 0-9, '_'), e.g. \"Echo\""
                                    }
                                ),
                            );
                        }
                    }
                }
            }
        }
    }
    // The derived path matches only fail where a method match did (reported above, at the
    // field the user wrote): drop their duplicates, which name a field GRPCRoute does not have.
    let before = ctx.errors.len();
    http_route(ctx, &r.as_http);
    let mut i = before;
    while i < ctx.errors.len() {
        if ctx.errors[i]
            .field
            .as_deref()
            .is_some_and(|f| f.contains(".path."))
        {
            ctx.errors.remove(i);
        } else {
            i += 1;
        }
    }
}

/// A protobuf identifier: a letter or `_`, then letters, digits, `_`.
fn is_grpc_ident(s: &str) -> bool {
    let mut b = s.bytes();
    b.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// A fully qualified protobuf service name (`pkg.sub.Service`, an optional leading `.`).
fn is_grpc_service(s: &str) -> bool {
    s.strip_prefix('.')
        .unwrap_or(s)
        .split('.')
        .all(is_grpc_ident)
}

fn route_rule(ctx: &mut Ctx, rule: &HttpRouteRule, f: &str) {
    for (j, m) in rule.matches.iter().enumerate() {
        route_match(ctx, m, &format!("{f}.matches[{j}]"));
    }
    let seen = filter_list(ctx, &rule.filters, rule, f, false);
    if let (Some(redirect), Some(_)) = (
        seen.get(&FilterType::RequestRedirect),
        seen.get(&FilterType::UrlRewrite),
    ) {
        ctx.err(
            rule.filters[*redirect].type_.pos,
            format!("{f}.filters"),
            "RequestRedirect and URLRewrite cannot be used in the same rule",
        );
    }
    for (j, b) in rule.backend_refs.iter().enumerate() {
        let bf = format!("{f}.backendRefs[{j}]");
        if b.name.is_empty() {
            ctx.err(b.name.pos, format!("{bf}.name"), "name must not be empty");
        }
        if let Some(p) = &b.port {
            port(ctx, p, format!("{bf}.port"));
        }
        if b.weight.value > MAX_WEIGHT {
            ctx.err(
                b.weight.pos,
                format!("{bf}.weight"),
                format!("weight {} is out of range 0..={MAX_WEIGHT}", b.weight.value),
            );
        }
        filter_list(ctx, &b.filters, rule, &bf, true);
    }
    if let Some(t) = &rule.timeouts
        && let (Some(req), Some(backend)) = (&t.request, &t.backend_request)
        && !req.is_zero()
        && (backend.is_zero() || backend.value > req.value)
    {
        ctx.err(
            backend.pos,
            format!("{f}.timeouts.backendRequest"),
            format!(
                "backendRequest ({}) must not be longer than request ({})",
                crate::duration::format_duration(backend.value),
                crate::duration::format_duration(req.value)
            ),
        );
    }
    for (k, c) in rule
        .retry
        .iter()
        .flat_map(|r| r.codes.iter().flatten())
        .enumerate()
    {
        if !(400..=599).contains(&c.value) {
            ctx.err(
                c.pos,
                format!("{f}.retry.codes[{k}]"),
                format!("status code {} is out of range 400..=599", c.value),
            );
        }
    }
    if let Some(b) = rule.retry.as_ref().and_then(|r| r.backoff.as_ref())
        && b.is_zero()
    {
        ctx.err(
            b.pos,
            format!("{f}.retry.backoff"),
            "backoff must be greater than 0",
        );
    }
    if let Some(sp) = &rule.session_persistence {
        session_persistence(ctx, sp, &format!("{f}.sessionPersistence"));
    }
    if let Some(retry) = &rule.retry
        && let Some(list) = &retry.retry_on
    {
        if list.is_empty() {
            ctx.err(
                Pos::UNKNOWN,
                format!("{f}.retry.retryOn"),
                "retryOn must not be empty (omit it for the default)",
            );
        }
        for (k, c) in list.iter().enumerate() {
            if !RETRY_ON_CONDITIONS.contains(&c.as_str()) {
                ctx.err(
                    c.pos,
                    format!("{f}.retry.retryOn[{k}]"),
                    format!(
                        "unknown retry condition {:?}; expected one of {}",
                        c.value,
                        RETRY_ON_CONDITIONS.join(", ")
                    ),
                );
            }
        }
    }
}

/// Checks a list of filters (a rule's, or a backendRef's when `on_backend`); returns where each
/// type first appears.
fn filter_list(
    ctx: &mut Ctx,
    list: &[HttpRouteFilter],
    rule: &HttpRouteRule,
    f: &str,
    on_backend: bool,
) -> HashMap<FilterType, usize> {
    let mut seen: HashMap<FilterType, usize> = HashMap::new();
    for (j, filter) in list.iter().enumerate() {
        let ff = format!("{f}.filters[{j}]");
        let t = *filter.type_;
        // On a backendRef only the header modifiers are served; the others are reported in
        // the route's status (UnsupportedValue) rather than refusing the whole config.
        if on_backend
            && !matches!(
                t,
                FilterType::RequestHeaderModifier | FilterType::ResponseHeaderModifier
            )
        {
            continue;
        }
        // RequestMirror is the one filter Gateway API allows several of in a rule.
        if let Some(first) = seen.insert(t, j).filter(|_| t != FilterType::RequestMirror) {
            ctx.err(
                filter.type_.pos,
                format!("{ff}.type"),
                format!(
                    "filter {} appears twice in one rule (also {f}.filters[{first}])",
                    t.as_str()
                ),
            );
        }
        let set: [(FilterType, bool); 6] = [
            (FilterType::RequestMirror, filter.request_mirror.is_some()),
            (FilterType::Cors, filter.cors.is_some()),
            (
                FilterType::RequestHeaderModifier,
                filter.request_header_modifier.is_some(),
            ),
            (
                FilterType::ResponseHeaderModifier,
                filter.response_header_modifier.is_some(),
            ),
            (
                FilterType::RequestRedirect,
                filter.request_redirect.is_some(),
            ),
            (FilterType::UrlRewrite, filter.url_rewrite.is_some()),
        ];
        for (other, present) in set {
            if other == t && !present {
                ctx.err(
                    filter.type_.pos,
                    format!("{ff}.{}", other.field()),
                    format!("filter type {} needs field {}", t.as_str(), other.field()),
                );
            } else if other != t && present {
                ctx.err(
                    filter.type_.pos,
                    format!("{ff}.{}", other.field()),
                    format!(
                        "field {} is not allowed on a filter of type {}",
                        other.field(),
                        t.as_str()
                    ),
                );
            }
        }
        match filter.action() {
            Some(FilterAction::RequestMirror(m)) => {
                request_mirror(ctx, m, &format!("{ff}.requestMirror"))
            }
            Some(FilterAction::Cors(c)) => cors(ctx, c, &format!("{ff}.cors")),
            Some(FilterAction::RequestHeaderModifier(m)) => {
                header_modifier(ctx, m, &format!("{ff}.requestHeaderModifier"))
            }
            Some(FilterAction::ResponseHeaderModifier(m)) => {
                header_modifier(ctx, m, &format!("{ff}.responseHeaderModifier"))
            }
            Some(FilterAction::RequestRedirect(rr)) => {
                let rf = format!("{ff}.requestRedirect");
                if let Some(s) = &rr.scheme
                    && s.as_str() != "http"
                    && s.as_str() != "https"
                {
                    ctx.err(
                        s.pos,
                        format!("{rf}.scheme"),
                        format!("scheme must be http or https, not {:?}", s.value),
                    );
                }
                if let Some(h) = &rr.hostname {
                    hostname(ctx, h, format!("{rf}.hostname"), false);
                }
                if let Some(p) = &rr.port {
                    port(ctx, p, format!("{rf}.port"));
                }
                if ![301, 302, 303, 307, 308].contains(&rr.status_code.value) {
                    ctx.err(
                        rr.status_code.pos,
                        format!("{rf}.statusCode"),
                        format!(
                            "statusCode must be 301, 302, 303, 307 or 308, not {}",
                            rr.status_code.value
                        ),
                    );
                }
                if let Some(p) = &rr.path {
                    path_modifier(ctx, p, rule, &format!("{rf}.path"));
                }
            }
            Some(FilterAction::UrlRewrite(u)) => {
                let uf = format!("{ff}.urlRewrite");
                if let Some(h) = &u.hostname {
                    hostname(ctx, h, format!("{uf}.hostname"), false);
                }
                if let Some(p) = &u.path {
                    path_modifier(ctx, p, rule, &format!("{uf}.path"));
                }
            }
            None => {}
        }
    }
    seen
}

fn request_mirror(ctx: &mut Ctx, m: &RequestMirror, f: &str) {
    if let Some(first) = m.backend_ref.filters.first() {
        ctx.err(
            first.type_.pos,
            format!("{f}.backendRef.filters"),
            "a requestMirror backendRef cannot have filters",
        );
    }
    if m.backend_ref.name.is_empty() {
        ctx.err(
            m.backend_ref.name.pos,
            format!("{f}.backendRef.name"),
            "name must not be empty",
        );
    }
    if let Some(p) = &m.percent {
        if m.fraction.is_some() {
            ctx.err(
                p.pos,
                format!("{f}.percent"),
                "give percent or fraction, not both",
            );
        }
        if p.value > 100 {
            ctx.err(
                p.pos,
                format!("{f}.percent"),
                format!("percent {} is out of range 0..=100", p.value),
            );
        }
    }
    if let Some(fr) = &m.fraction {
        if fr.denominator.value == 0 {
            ctx.err(
                fr.denominator.pos,
                format!("{f}.fraction.denominator"),
                "denominator must be greater than 0",
            );
        } else if fr.numerator.value > fr.denominator.value {
            ctx.err(
                fr.numerator.pos,
                format!("{f}.fraction.numerator"),
                format!(
                    "numerator {} is greater than denominator {}",
                    fr.numerator.value, fr.denominator.value
                ),
            );
        }
    }
}

fn route_match(ctx: &mut Ctx, m: &HttpRouteMatch, f: &str) {
    let p = &m.path;
    match p.type_ {
        PathMatchType::Exact | PathMatchType::PathPrefix => {
            if let Err(e) = check_path(&p.value) {
                ctx.err(p.value.pos, format!("{f}.path.value"), e);
            }
        }
        PathMatchType::RegularExpression => {
            regex(ctx, &p.value, format!("{f}.path.value"));
        }
    }
    let mut names = HashSet::new();
    for (k, h) in m.headers.iter().enumerate() {
        let hf = format!("{f}.headers[{k}]");
        header_name(ctx, &h.name, format!("{hf}.name"));
        if !names.insert(h.name.to_ascii_lowercase()) {
            ctx.err(
                h.name.pos,
                format!("{hf}.name"),
                format!("header {:?} is matched twice", h.name.value),
            );
        }
        if h.type_ == StringMatchType::RegularExpression {
            regex(ctx, &h.value, format!("{hf}.value"));
        }
    }
    let mut names = HashSet::new();
    for (k, q) in m.query_params.iter().enumerate() {
        let qf = format!("{f}.queryParams[{k}]");
        if q.name.is_empty() {
            ctx.err(q.name.pos, format!("{qf}.name"), "name must not be empty");
        }
        if !names.insert(q.name.as_str()) {
            ctx.err(
                q.name.pos,
                format!("{qf}.name"),
                format!("query parameter {:?} is matched twice", q.name.value),
            );
        }
        if q.type_ == StringMatchType::RegularExpression {
            regex(ctx, &q.value, format!("{qf}.value"));
        }
    }
}

/// Gateway API path rules: absolute, and no segments that proxies normalize differently.
fn check_path(p: &str) -> Result<(), String> {
    let bad = if !p.starts_with('/') {
        Some("must start with '/'")
    } else if p.contains("//") {
        Some("must not contain '//'")
    } else if p.contains("/./") || p.contains("/../") || p.ends_with("/.") || p.ends_with("/..") {
        Some("must not contain '.' or '..' segments")
    } else if p.contains('#') || p.contains('?') {
        Some("must not contain '#' or '?'")
    } else if p.to_ascii_lowercase().contains("%2f") {
        Some("must not contain an encoded '/' (%2F)")
    } else if p.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some("must not contain whitespace")
    } else {
        None
    };
    match bad {
        Some(why) => Err(format!("path {p:?} {why}")),
        None => Ok(()),
    }
}

fn regex(ctx: &mut Ctx, r: &Spanned<String>, field: String) {
    if let Err(e) = regex::Regex::new(r) {
        // The regex crate's message spans several lines with a caret diagram; keep the last line.
        let msg = e.to_string();
        let reason = msg
            .lines()
            .last()
            .unwrap_or("")
            .trim_start_matches("error: ");
        ctx.err(
            r.pos,
            field,
            format!("invalid regular expression {:?}: {reason}", r.value),
        );
    }
}

/// RFC 7230 token, as Gateway API requires of header names.
fn header_name(ctx: &mut Ctx, n: &Spanned<String>, field: String) {
    let ok = !n.is_empty()
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !ok {
        ctx.err(n.pos, field, format!("invalid header name {:?}", n.value));
    }
}

/// Gateway API's CEL rules for `SessionPersistence` (each shape's settings only with its type,
/// `Permanent` needs `absoluteTimeout`), plus what Envoy needs: a token as cookie or header
/// name, a path starting with `/`, timeouts above zero.
fn session_persistence(ctx: &mut Ctx, sp: &SessionPersistence, f: &str) {
    let at = sp.type_.as_ref().map_or(Pos::UNKNOWN, |t| t.pos);
    let cookie_type = sp.type_() == SessionPersistenceType::Cookie;
    if sp.cookie.is_some() && sp.cookie_config.is_some() {
        ctx.err(
            at,
            format!("{f}.cookie"),
            "cookie and cookieConfig are two versions of one field; use one",
        );
    }
    if !cookie_type {
        for (name, set) in [
            ("cookie", sp.cookie.is_some()),
            ("cookieConfig", sp.cookie_config.is_some()),
        ] {
            if set {
                ctx.err(
                    at,
                    format!("{f}.{name}"),
                    format!("{name} is only allowed with type: Cookie"),
                );
            }
        }
    }
    if cookie_type && let Some(h) = &sp.header {
        ctx.err(
            h.name.pos,
            format!("{f}.header"),
            "header is only allowed with type: Header (the default type is Cookie)",
        );
    }
    let specific = match sp.type_() {
        SessionPersistenceType::Cookie => sp.cookie_settings().and_then(|c| c.name.as_ref()),
        SessionPersistenceType::Header => sp.header.as_ref().map(|h| &h.name),
    };
    if let (Some(a), Some(b)) = (&sp.session_name, specific)
        && a.value != b.value
    {
        ctx.err(
            b.pos,
            format!("{f}.sessionName"),
            format!(
                "sessionName {:?} and the {} name {:?} disagree; give one",
                a.value,
                if cookie_type { "cookie" } else { "header" },
                b.value
            ),
        );
    }
    let named = [
        ("sessionName", sp.session_name.as_ref()),
        (
            "cookie.name",
            sp.cookie.as_ref().and_then(|c| c.name.as_ref()),
        ),
        (
            "cookieConfig.name",
            sp.cookie_config.as_ref().and_then(|c| c.name.as_ref()),
        ),
        ("header.name", sp.header.as_ref().map(|h| &h.name)),
    ];
    for (field, n) in named {
        let Some(n) = n else { continue };
        let token = !n.is_empty()
            && n.len() <= 128
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token {
            ctx.err(
                n.pos,
                format!("{f}.{field}"),
                format!(
                    "invalid {} name {:?}: 1 to 128 token characters (letters, digits, !#$%&'*+-.^_`|~)",
                    if cookie_type { "cookie" } else { "header" },
                    n.value
                ),
            );
        }
    }
    if let Some(p) = sp.cookie_settings().and_then(|c| c.path.as_ref())
        && (!p.starts_with('/') || p.len() > 1024 || p.bytes().any(|b| b == b';' || b < 0x20))
    {
        ctx.err(
            p.pos,
            format!("{f}.cookie.path"),
            format!(
                "invalid cookie path {:?}: must start with / (at most 1024 characters, no ;)",
                p.value
            ),
        );
    }
    for (field, d) in [
        ("absoluteTimeout", &sp.absolute_timeout),
        ("idleTimeout", &sp.idle_timeout),
    ] {
        if let Some(d) = d
            && d.is_zero()
        {
            ctx.err(
                d.pos,
                format!("{f}.{field}"),
                format!("{field} must be greater than 0"),
            );
        }
    }
    if cookie_type
        && sp.lifetime() == CookieLifetimeType::Permanent
        && sp.absolute_timeout.is_none()
    {
        let pos = sp
            .cookie_settings()
            .and_then(|c| c.lifetime_type.as_ref())
            .map_or(at, |l| l.pos);
        ctx.err(
            pos,
            format!("{f}.absoluteTimeout"),
            "absoluteTimeout is required when cookie lifetimeType is Permanent",
        );
    }
}

/// The methods Gateway API's `HTTPMethodWithWildcard` admits.
const CORS_METHODS: [&str; 10] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "*",
];

/// Gateway API `HTTPCORSFilter` rules: well-formed origins and methods, `*` only alone, no
/// repeats (the lists are sets), the CRD's item limits, `maxAge >= 1`.
fn cors(ctx: &mut Ctx, c: &Cors, f: &str) {
    let lists: [(&str, &Vec<Spanned<String>>, usize, bool); 4] = [
        ("allowOrigins", &c.allow_origins, 64, false),
        ("allowMethods", &c.allow_methods, 9, false),
        ("allowHeaders", &c.allow_headers, 64, true),
        ("exposeHeaders", &c.expose_headers, 64, true),
    ];
    for (name, list, max, case_insensitive) in lists {
        if list.len() > max {
            ctx.err(
                list[max].pos,
                format!("{f}.{name}"),
                format!(
                    "{name} has {} entries; at most {max} are allowed",
                    list.len()
                ),
            );
        }
        let mut seen = HashSet::new();
        for (k, v) in list.iter().enumerate() {
            let key = if case_insensitive {
                v.to_ascii_lowercase()
            } else {
                v.value.clone()
            };
            if !seen.insert(key) {
                ctx.err(
                    v.pos,
                    format!("{f}.{name}[{k}]"),
                    format!("{:?} appears twice in {name}", v.value),
                );
            }
        }
        // allowOrigins and allowMethods: the wildcard means "all", so it must stand alone.
        if !case_insensitive
            && list.len() > 1
            && let Some(star) = list.iter().find(|v| v.as_str() == "*")
        {
            ctx.err(
                star.pos,
                format!("{f}.{name}"),
                format!("{name} cannot contain '*' alongside other entries"),
            );
        }
    }
    for (k, o) in c.allow_origins.iter().enumerate() {
        if let Err(why) = cors_origin(o) {
            ctx.err(
                o.pos,
                format!("{f}.allowOrigins[{k}]"),
                format!("invalid origin {:?}: {why}", o.value),
            );
        }
    }
    for (k, m) in c.allow_methods.iter().enumerate() {
        if !CORS_METHODS.contains(&m.as_str()) {
            ctx.err(
                m.pos,
                format!("{f}.allowMethods[{k}]"),
                format!(
                    "invalid method {:?}: expected one of {} (case-sensitive)",
                    m.value,
                    CORS_METHODS.join(", ")
                ),
            );
        }
    }
    for (name, list) in [
        ("allowHeaders", &c.allow_headers),
        ("exposeHeaders", &c.expose_headers),
    ] {
        for (k, h) in list.iter().enumerate() {
            header_name(ctx, h, format!("{f}.{name}[{k}]"));
        }
    }
    if let Some(m) = &c.max_age
        && !(1..=i64::from(i32::MAX)).contains(&m.value)
    {
        ctx.err(
            m.pos,
            format!("{f}.maxAge"),
            format!(
                "maxAge must be between 1 and {} seconds, not {}",
                i32::MAX,
                m.value
            ),
        );
    }
}

/// `*`, or `http(s)://host[:port]` whose host is DNS-ish characters and `*` wildcards.
fn cors_origin(o: &str) -> Result<(), &'static str> {
    if o == "*" {
        return Ok(());
    }
    let Some((scheme, rest)) = o.split_once("://") else {
        return Err("expected \"*\" or <scheme>://<host>[:<port>]");
    };
    if scheme != "http" && scheme != "https" {
        return Err("scheme must be http or https");
    }
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (rest, None),
    };
    if host.is_empty()
        || !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.*".contains(&b))
    {
        return Err("host must be letters, digits, '-', '.' and '*' wildcards (no path)");
    }
    if let Some(p) = port
        && !p.parse::<u16>().is_ok_and(|p| p > 0)
    {
        return Err("port must be 1..=65535");
    }
    Ok(())
}

fn header_modifier(ctx: &mut Ctx, m: &HeaderModifier, f: &str) {
    for (list_name, list) in [("set", &m.set), ("add", &m.add)] {
        let mut names = HashSet::new();
        for (k, h) in list.iter().enumerate() {
            let hf = format!("{f}.{list_name}[{k}]");
            header_name(ctx, &h.name, format!("{hf}.name"));
            if !names.insert(h.name.to_ascii_lowercase()) {
                ctx.err(
                    h.name.pos,
                    format!("{hf}.name"),
                    format!("header {:?} appears twice in {list_name}", h.name.value),
                );
            }
            if h.value.contains(['\r', '\n', '\0']) {
                ctx.err(
                    h.value.pos,
                    format!("{hf}.value"),
                    "header value must not contain CR, LF or NUL",
                );
            }
        }
    }
    let mut names = HashSet::new();
    for (k, n) in m.remove.iter().enumerate() {
        header_name(ctx, n, format!("{f}.remove[{k}]"));
        if !names.insert(n.to_ascii_lowercase()) {
            ctx.err(
                n.pos,
                format!("{f}.remove[{k}]"),
                format!("header {:?} appears twice in remove", n.value),
            );
        }
    }
}

fn path_modifier(ctx: &mut Ctx, p: &PathModifier, rule: &HttpRouteRule, f: &str) {
    let (wanted, other) = match *p.type_ {
        PathModifierType::ReplaceFullPath => (
            ("replaceFullPath", &p.replace_full_path),
            ("replacePrefixMatch", &p.replace_prefix_match),
        ),
        PathModifierType::ReplacePrefixMatch => (
            ("replacePrefixMatch", &p.replace_prefix_match),
            ("replaceFullPath", &p.replace_full_path),
        ),
    };
    match wanted.1 {
        None => ctx.err(
            p.type_.pos,
            format!("{f}.{}", wanted.0),
            format!("path type {:?} needs field {}", p.type_.value, wanted.0),
        ),
        Some(v) => {
            if let Err(e) = check_path(v) {
                ctx.err(v.pos, format!("{f}.{}", wanted.0), e);
            }
        }
    }
    if other.1.is_some() {
        ctx.err(
            p.type_.pos,
            format!("{f}.{}", other.0),
            format!(
                "field {} is not allowed with path type {:?}",
                other.0, p.type_.value
            ),
        );
    }
    if *p.type_ == PathModifierType::ReplacePrefixMatch
        && rule
            .matches
            .iter()
            .any(|m| m.path.type_ != PathMatchType::PathPrefix)
    {
        ctx.err(
            p.type_.pos,
            f.to_owned(),
            "ReplacePrefixMatch needs every match of the rule to be a PathPrefix match",
        );
    }
}

/// A ConfigMap: only `ca.crt`, when present, is interpreted (a PEM CA bundle).
pub(crate) fn config_map(ctx: &mut Ctx, c: &ConfigMap) {
    metadata(ctx, &c.metadata);
    if let Some(ca) = c.data.get("ca.crt")
        && !ca.contains("-----BEGIN CERTIFICATE-----")
    {
        ctx.err(
            Pos::UNKNOWN,
            "data.ca.crt",
            "ca.crt is not PEM (expected \"-----BEGIN CERTIFICATE-----\")",
        );
    }
}

/// A Namespace is cluster-scoped: `metadata.namespace` must not be given (it defaults to
/// `default`, and the key's name is what routes' namespaces are compared with).
pub(crate) fn namespace(ctx: &mut Ctx, n: &Namespace) {
    if let Err(e) = check_dns_label(&n.metadata.name) {
        ctx.err(Pos::UNKNOWN, "metadata.name", format!("name {e}"));
    }
    if n.metadata.namespace != DEFAULT_NAMESPACE {
        ctx.err(
            Pos::UNKNOWN,
            "metadata.namespace",
            "a Namespace is cluster-scoped: omit metadata.namespace",
        );
    }
}

/// Gateway API requires at least one `from` and one `to`, non-empty kinds and valid names.
pub(crate) fn reference_grant(ctx: &mut Ctx, g: &ReferenceGrant) {
    metadata(ctx, &g.metadata);
    if g.spec.from.is_empty() {
        ctx.err(Pos::UNKNOWN, "spec.from", "must list at least one referrer");
    }
    if g.spec.to.is_empty() {
        ctx.err(Pos::UNKNOWN, "spec.to", "must list at least one target");
    }
    for (i, f) in g.spec.from.iter().enumerate() {
        if f.kind.is_empty() {
            ctx.err(
                f.kind.pos,
                format!("spec.from[{i}].kind"),
                "kind must not be empty",
            );
        }
        if let Err(e) = check_dns_label(&f.namespace) {
            ctx.err(
                f.namespace.pos,
                format!("spec.from[{i}].namespace"),
                format!("namespace {e}"),
            );
        }
    }
    for (i, t) in g.spec.to.iter().enumerate() {
        if t.kind.is_empty() {
            ctx.err(
                t.kind.pos,
                format!("spec.to[{i}].kind"),
                "kind must not be empty",
            );
        }
        if let Some(n) = &t.name
            && let Err(e) = check_dns_subdomain(n)
        {
            ctx.err(n.pos, format!("spec.to[{i}].name"), format!("name {e}"));
        }
    }
}

pub(crate) fn backend(ctx: &mut Ctx, b: &Backend) {
    metadata(ctx, &b.metadata);
    let mut seen = HashMap::new();
    for (i, e) in b.spec.endpoints.iter().enumerate() {
        let f = format!("spec.endpoints[{i}]");
        port(ctx, &e.port, format!("{f}.port"));
        if let Some(w) = &e.weight
            && !(1..=MAX_WEIGHT).contains(&w.value)
        {
            ctx.err(
                w.pos,
                format!("{f}.weight"),
                format!("weight {} is out of range 1..={MAX_WEIGHT}", w.value),
            );
        }
        if let Some(z) = &e.zone
            && z.is_empty()
        {
            ctx.err(e.address.pos, format!("{f}.zone"), "zone must not be empty");
        }
        if let Some(h) = e.address.hostname()
            && let Err(why) = check_endpoint_hostname(h)
        {
            ctx.err(e.address.pos, format!("{f}.address"), why);
        }
        if let Some(first) = seen.insert((e.address.value.clone(), e.port.value), i) {
            ctx.err(
                e.address.pos,
                format!("{f}.address"),
                format!(
                    "duplicate endpoint {}:{} (also spec.endpoints[{first}])",
                    e.address.value, e.port.value
                ),
            );
        }
    }
    if let Some(dns) = &b.spec.dns {
        if *dns.mode == DnsMode::Logical && b.spec.is_dns() && b.spec.endpoints.len() != 1 {
            ctx.err(
                dns.mode.pos,
                "spec.dns.mode",
                format!(
                    "mode Logical needs exactly one endpoint (Envoy LOGICAL_DNS), found {}; use Strict for several",
                    b.spec.endpoints.len()
                ),
            );
        }
        if let Some(r) = &dns.refresh_rate
            && r.value < std::time::Duration::from_millis(1)
        {
            ctx.err(
                r.pos,
                "spec.dns.refreshRate",
                "refreshRate must be at least 1ms",
            );
        }
    }
    if let Some(p) = &b.spec.protocol
        && upstream_protocol(p).is_none()
    {
        ctx.err(
            p.pos,
            "spec.protocol",
            format!(
                "unknown protocol {:?}; expected http, kubernetes.io/h2c, h2c, grpc, kubernetes.io/ws or ws",
                p.value
            ),
        );
    }
    if let Some(t) = &b.spec.connect_timeout
        && t.is_zero()
    {
        ctx.err(
            t.pos,
            "spec.connectTimeout",
            "connectTimeout must be greater than 0",
        );
    }
    if let Some(hc) = &b.spec.health_check {
        let f = "spec.healthCheck";
        if let Err(e) = check_path(&hc.path) {
            ctx.err(hc.path.pos, format!("{f}.path"), e);
        }
        if let Some(h) = &hc.host {
            hostname(ctx, h, format!("{f}.host"), false);
        }
        for (name, d) in [("interval", &hc.interval), ("timeout", &hc.timeout)] {
            if d.is_zero() {
                ctx.err(
                    d.pos,
                    format!("{f}.{name}"),
                    format!("{name} must be greater than 0"),
                );
            }
        }
        for (name, t) in [
            ("healthyThreshold", &hc.healthy_threshold),
            ("unhealthyThreshold", &hc.unhealthy_threshold),
        ] {
            if t.value == 0 {
                ctx.err(
                    t.pos,
                    format!("{f}.{name}"),
                    format!("{name} must be at least 1"),
                );
            }
        }
    }
}

/// A Backend endpoint hostname: a concrete DNS name (lowercase, no wildcard) that cannot be
/// mistaken for a mistyped IP address (a numeric last label, as in `10.0.0.300`).
fn check_endpoint_hostname(h: &str) -> Result<(), String> {
    let numeric_tld = h
        .rsplit('.')
        .next()
        .is_some_and(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()));
    if numeric_tld || h.contains(':') {
        return Err(format!("{h:?} is not a valid IP address"));
    }
    if h.starts_with('*') {
        return Err(format!(
            "{h:?} is a wildcard; an endpoint needs an IP address or a DNS name Envoy can resolve"
        ));
    }
    validate_hostname(h).map_err(|e| {
        format!("{e}; an endpoint address is an IP address or a DNS name Envoy resolves")
    })
}

/// A Service: Kubernetes' own rules for what Ballast reads (ports, type, externalName).
pub(crate) fn service(ctx: &mut Ctx, s: &Service) {
    metadata(ctx, &s.metadata);
    let mut names = HashMap::new();
    let mut numbers = HashMap::new();
    let several = s.spec.ports.len() > 1;
    for (i, p) in s.spec.ports.iter().enumerate() {
        let f = format!("spec.ports[{i}]");
        port(ctx, &p.port, format!("{f}.port"));
        if several && p.name.is_none() {
            ctx.err(
                p.port.pos,
                format!("{f}.name"),
                "name is required when a Service has several ports",
            );
        }
        if let Some(first) = names.insert(p.name(), i) {
            ctx.err(
                p.port.pos,
                format!("{f}.name"),
                format!(
                    "duplicate port name {:?} (also spec.ports[{first}])",
                    p.name()
                ),
            );
        }
        let proto = p.protocol.as_ref().map_or("TCP", |p| p.as_str());
        if let Some(first) = numbers.insert((p.port.value, proto.to_owned()), i) {
            ctx.err(
                p.port.pos,
                format!("{f}.port"),
                format!("duplicate port {} (also spec.ports[{first}])", p.port.value),
            );
        }
    }
    if let Some(t) = &s.spec.type_
        && !matches!(
            t.as_str(),
            "ClusterIP" | "NodePort" | "LoadBalancer" | "ExternalName"
        )
    {
        ctx.err(
            t.pos,
            "spec.type",
            format!(
                "unknown Service type {:?}; expected ClusterIP, NodePort, LoadBalancer or ExternalName",
                t.value
            ),
        );
    }
    match (&s.spec.external_name, s.is_external_name()) {
        (Some(n), true) => {
            // A trailing dot (absolute name) is valid in Kubernetes and means the same here.
            let bare = Spanned::new(n.strip_suffix('.').unwrap_or(n).to_owned(), n.pos);
            hostname(ctx, &bare, "spec.externalName".into(), false);
        }
        (None, true) => ctx.err(
            s.spec.type_.as_ref().map_or(Pos::UNKNOWN, |t| t.pos),
            "spec.externalName",
            "a Service of type ExternalName needs spec.externalName",
        ),
        _ => {}
    }
}

/// An EndpointSlice: a known address type and addresses of that type.
pub(crate) fn endpoint_slice(ctx: &mut Ctx, e: &EndpointSlice) {
    metadata(ctx, &e.metadata);
    let t = &e.spec.address_type;
    let want_ip = match t.as_str() {
        "IPv4" => Some(false),
        "IPv6" => Some(true),
        "FQDN" => None,
        other => {
            ctx.err(
                t.pos,
                "addressType",
                format!("unknown addressType {other:?}; expected IPv4, IPv6 or FQDN"),
            );
            return;
        }
    };
    for (i, ep) in e.spec.endpoints.iter().flatten().enumerate() {
        for (j, a) in ep.addresses.iter().enumerate() {
            let f = format!("endpoints[{i}].addresses[{j}]");
            match (want_ip, a.parse::<std::net::IpAddr>()) {
                (Some(v6), Ok(ip)) if ip.is_ipv6() == v6 => {}
                (Some(_), _) => ctx.err(
                    a.pos,
                    f,
                    format!("{:?} is not an {} address", a.value, t.value),
                ),
                (None, _) => hostname(ctx, a, f, false),
            }
        }
    }
    for (i, p) in e.spec.ports.iter().flatten().enumerate() {
        if let Some(n) = p.port
            && !(1..=65535).contains(&n)
        {
            ctx.err(
                Pos::UNKNOWN,
                format!("ports[{i}].port"),
                format!("port {n} is out of range 1..=65535"),
            );
        }
    }
}

/// Checks a Secret document and decodes it; `None` when it has errors.
pub(crate) fn secret(ctx: &mut Ctx, d: SecretDoc, source: Source) -> Option<Secret> {
    metadata(ctx, &d.metadata);
    match &d.type_ {
        None => ctx.err(
            Pos::UNKNOWN,
            "type",
            format!("missing field `type` (must be {TLS_SECRET_TYPE})"),
        ),
        Some(t) if t.as_str() != TLS_SECRET_TYPE => ctx.err(
            t.pos,
            "type",
            format!(
                "unsupported Secret type {:?}; only {TLS_SECRET_TYPE} is supported",
                t.value
            ),
        ),
        Some(_) => {}
    }
    const KEYS: [&str; 3] = ["tls.crt", "tls.key", "ca.crt"];
    let mut values: BTreeMap<&str, (String, Pos, String)> = BTreeMap::new();
    // Keys present but undecodable are reported as such, not also as missing.
    let mut present: HashSet<&str> = HashSet::new();
    for (key, v) in &d.data {
        let field = format!("data.{key}");
        let Some(k) = KEYS.iter().find(|k| *k == key) else {
            ctx.err(v.pos, field, unknown_key(key));
            continue;
        };
        present.insert(k);
        let compact: String = v.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        match base64::engine::general_purpose::STANDARD.decode(compact) {
            Err(e) => ctx.err(v.pos, field, format!("invalid base64: {e}")),
            Ok(bytes) => match String::from_utf8(bytes) {
                Err(_) => ctx.err(v.pos, field, "decoded value is not PEM text (not UTF-8)"),
                Ok(text) => {
                    values.insert(
                        KEYS.iter().find(|k| *k == key).copied()?,
                        (text, v.pos, field),
                    );
                }
            },
        }
    }
    // Kubernetes merges stringData over data.
    for (key, v) in &d.string_data {
        let field = format!("stringData.{key}");
        match KEYS.iter().find(|k| *k == key) {
            None => ctx.err(v.pos, field, unknown_key(key)),
            Some(k) => {
                values.insert(k, (v.value.clone(), v.pos, field));
            }
        }
    }
    for (key, marker) in [
        ("tls.crt", "CERTIFICATE-----"),
        ("tls.key", "PRIVATE KEY-----"),
        ("ca.crt", "CERTIFICATE-----"),
    ] {
        match values.get(key) {
            None if key != "ca.crt" && !present.contains(key) => ctx.err(
                Pos::UNKNOWN,
                "data",
                format!("missing {key} (in data or stringData)"),
            ),
            Some((text, pos, field)) if !looks_like_pem(text, marker) => ctx.err(
                *pos,
                field.clone(),
                format!("{key} is not PEM (expected \"-----BEGIN ...{marker}\")"),
            ),
            _ => {}
        }
    }
    if !ctx.errors.is_empty() {
        return None;
    }
    let mut take = |k: &str| values.remove(k).map(|(text, _, _)| text);
    Some(Secret {
        metadata: d.metadata,
        tls: TlsKeyPair {
            certificate_chain: take("tls.crt")?,
            private_key: take("tls.key")?,
            ca_certificate: take("ca.crt"),
        },
        source,
    })
}

fn unknown_key(key: &str) -> String {
    format!("unsupported key {key:?}; a TLS Secret has tls.crt, tls.key and optionally ca.crt")
}

/// A cheap shape check (`-----BEGIN <...marker>` … `-----END`), so an obviously wrong value is
/// reported with its position instead of as an Envoy NACK later.
fn looks_like_pem(text: &str, marker: &str) -> bool {
    let t = text.trim();
    t.starts_with("-----BEGIN ")
        && t.lines()
            .next()
            .is_some_and(|l| l.trim_end().ends_with(marker))
        && t.contains("-----END ")
}
