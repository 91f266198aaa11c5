//! `ballast.dev/v1alpha1` `ClientPolicy`: how Envoy treats downstream clients on the Gateways
//! (or single listeners, via `sectionName`) it targets: client IP detection, PROXY protocol,
//! timeouts, header size limits, TLS versions, ciphers and ALPN, client certificate validation
//! (frontend mTLS) with certificate details forwarded to backends, path normalisation,
//! connection limits, HTTP/1 options, HTTP/2 settings, HTTP/3 (QUIC) and OpenTelemetry
//! tracing. Named after Envoy Gateway's
//! `ClientTrafficPolicy`, whose field names it follows where features match.

use std::time::Duration;

use serde::Deserialize;

use super::backend_tls::LocalObjectRef;
use super::policy::{PolicyTargetRef, TargetKind, validate_target_refs};
use super::{Metadata, Source, object_kind};
use crate::duration::de_opt_duration;
use crate::spanned::Spanned;
use crate::validate::Ctx;

#[derive(Clone, Debug)]
pub struct ClientPolicy {
    pub metadata: Metadata,
    pub spec: ClientPolicySpec,
    pub source: Source,
}
object_kind!(ClientPolicy, super::Kind::ClientPolicy);

/// What a ClientPolicy may target (a listener through `sectionName`).
pub const CLIENT_POLICY_TARGETS: [TargetKind; 1] = [TargetKind::Gateway];

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientPolicySpec {
    pub target_refs: Vec<PolicyTargetRef>,
    #[serde(default, rename = "clientIPDetection")]
    pub client_ip_detection: Option<ClientIpDetection>,
    /// Accept the PROXY protocol (v1/v2) header before any other bytes.
    #[serde(default)]
    pub enable_proxy_protocol: bool,
    #[serde(default)]
    pub timeout: Option<ClientTimeouts>,
    /// Largest request header block, in KiB (Envoy default 60).
    #[serde(default)]
    pub max_request_headers_kb: Option<Spanned<u32>>,
    #[serde(default)]
    pub tls: Option<ClientTls>,
    /// URL path handling (merging `//`, escaped slashes); absent: Envoy's defaults plus the
    /// `normalize_path` Ballast always sets.
    #[serde(default)]
    pub path: Option<PathSettings>,
    #[serde(default)]
    pub connection: Option<ClientConnection>,
    /// HTTP/2 settings for downstream connections (HTTPS with ALPN `h2`, or h2c).
    #[serde(default)]
    pub http2: Option<ClientHttp2>,
    /// OpenTelemetry tracing of the requests to an OTLP collector Backend.
    #[serde(default)]
    pub tracing: Option<ClientTracing>,
    /// HTTP/3 over QUIC on the targeted HTTPS listeners (Envoy Gateway's shape: `http3: {}`,
    /// presence enables): a UDP listener on the same port, and `alt-svc` on TCP responses so
    /// clients learn about it.
    #[serde(default)]
    pub http3: Option<Spanned<ClientHttp3>>,
    /// HTTP/1.x options of the connection manager.
    #[serde(default)]
    pub http1: Option<ClientHttp1>,
}

/// Envoy Gateway's `ClientTrafficPolicy.http3`: no settings yet, its presence turns HTTP/3 on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientHttp3 {}

/// Envoy Gateway's `ClientTrafficPolicy.http1` (HCM `http_protocol_options`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientHttp1 {
    /// Accept and forward HTTP/1.1 chunked trailers (Envoy drops them by default).
    #[serde(default)]
    pub enable_trailers: bool,
    /// Keep the letter case of HTTP/1 header names as the client sent them (Envoy's
    /// `preserve_case` formatter; Envoy lower-cases them by default).
    #[serde(default)]
    pub preserve_header_case: bool,
    /// Accept HTTP/1.0 requests (Envoy answers them 426 by default).
    #[serde(default)]
    pub http10: Option<ClientHttp10>,
}

/// HTTP/1.0 acceptance.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientHttp10 {
    /// An HTTP/1.0 request without `Host` gets the listener's hostname (which must be set and
    /// not a wildcard); without this such requests are answered 400.
    #[serde(default)]
    pub use_default_host: bool,
}

impl ClientPolicy {
    /// Why settings of this policy cannot work on `listener`, one message per setting
    /// (empty: all can). A policy naming such a listener by `sectionName` is not applied
    /// there (status `Accepted=False Invalid`); a Gateway-wide policy applies without them.
    pub fn unsupported_on(&self, listener: &super::Listener) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(h3) = &self.spec.http3
            && *listener.protocol != super::ListenerProtocol::Https
        {
            out.push(format!(
                "http3 (line {}) needs an HTTPS listener; listener {:?} is {}",
                h3.pos.line,
                listener.name.as_str(),
                listener.protocol.as_str()
            ));
        }
        if self.default_host_for(listener).is_none()
            && self
                .spec
                .http1
                .as_ref()
                .and_then(|h| h.http10.as_ref())
                .is_some_and(|h| h.use_default_host)
        {
            out.push(format!(
                "http1.http10.useDefaultHost needs a listener hostname without wildcard; listener {:?} has {}",
                listener.name.as_str(),
                listener
                    .hostname()
                    .map_or_else(|| "none".to_owned(), |h| format!("{h:?}"))
            ));
        }
        out
    }

    /// Whether HTTP/3 applies on `listener` (set, and the listener is HTTPS).
    pub fn http3_on(&self, listener: &super::Listener) -> bool {
        self.spec.http3.is_some() && *listener.protocol == super::ListenerProtocol::Https
    }

    /// The `Host` an HTTP/1.0 request without one gets on `listener`: its hostname, when
    /// `useDefaultHost` is set and the hostname is not a wildcard.
    pub fn default_host_for<'l>(&self, listener: &'l super::Listener) -> Option<&'l str> {
        let wanted = self
            .spec
            .http1
            .as_ref()
            .and_then(|h| h.http10.as_ref())
            .is_some_and(|h| h.use_default_host);
        listener.hostname().filter(|h| wanted && !h.contains('*'))
    }
}

/// Envoy's `envoy.tracers.opentelemetry` on the connection manager: spans of a sampled share
/// of requests, exported over OTLP to a Backend (in the policy's namespace) that becomes one of
/// the Gateway's clusters. Envoy Gateway puts this in its `EnvoyProxy.telemetry.tracing`;
/// Ballast's per-Gateway (or per-listener) knob is the ClientPolicy.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientTracing {
    /// The collector: a `Backend` (group `ballast.dev`) in the policy's namespace.
    pub backend_ref: TracingBackendRef,
    /// `GRPC` (OTLP `TraceService/Export`; the Backend must speak HTTP/2: `protocol: grpc`)
    /// or `HTTP` (OTLP/HTTP protobuf `POST` to `path`). Default `GRPC`.
    #[serde(default)]
    pub protocol: Option<Spanned<OtlpProtocol>>,
    /// OTLP/HTTP path (default `/v1/traces`); `HTTP` only.
    #[serde(default)]
    pub path: Option<Spanned<String>>,
    /// Percent of requests traced, 0..=100 (default 100). Requests arriving with a sampled
    /// trace context are traced regardless (Envoy honours the caller's decision).
    #[serde(default)]
    pub sampling_rate: Option<Spanned<u32>>,
    /// The spans' `service.name` (default: the Gateway's name).
    #[serde(default)]
    pub service_name: Option<Spanned<String>>,
}

/// A Backend in the policy's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingBackendRef {
    #[serde(default)]
    pub group: Option<Spanned<String>>,
    #[serde(default)]
    pub kind: Option<Spanned<String>>,
    pub name: Spanned<String>,
}

/// How spans reach the collector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum OtlpProtocol {
    #[default]
    Grpc,
    Http,
}

/// Envoy Gateway's `ClientTrafficPolicy.http2` (window sizes in bytes, or `64Ki`/`1Mi`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientHttp2 {
    #[serde(default)]
    pub max_concurrent_streams: Option<Spanned<u32>>,
    #[serde(default)]
    pub initial_stream_window_size: Option<Spanned<ByteSize>>,
    #[serde(default)]
    pub initial_connection_window_size: Option<Spanned<ByteSize>>,
}

/// A size in bytes written as a number or a Kubernetes quantity with a binary suffix
/// (`Ki`, `Mi`, `Gi`), as Envoy Gateway writes HTTP/2 window sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => {
                let (num, mul) = [("Ki", 1u64 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30)]
                    .iter()
                    .find_map(|(suf, m)| s.strip_suffix(suf).map(|n| (n, *m)))
                    .unwrap_or((s.as_str(), 1));
                num.trim()
                    .parse::<u64>()
                    .ok()
                    .and_then(|n| n.checked_mul(mul))
                    .map(ByteSize)
                    .ok_or_else(|| {
                        serde::de::Error::custom(format!(
                            "invalid size {s:?}; expected bytes or a number with Ki, Mi or Gi"
                        ))
                    })
            }
        }
    }
}

/// Envoy Gateway's `ClientTrafficPolicy.path`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PathSettings {
    /// What to do with `%2F`, `%2f`, `%5C`, `%5c` in the path (Envoy default: KeepUnchanged).
    #[serde(default)]
    pub escaped_slashes_action: Option<Spanned<EscapedSlashesAction>>,
    /// Keep `//` in paths; by default (with `path` set) repeated slashes are merged so that
    /// `/a//b` matches rules for `/a/b`.
    #[serde(default)]
    pub disable_merge_slashes: bool,
}

/// HCM `path_with_escaped_slashes_action`, with Envoy Gateway's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum EscapedSlashesAction {
    KeepUnchanged,
    /// 400 Bad Request.
    RejectRequest,
    /// Unescape and answer with a redirect to the unescaped path.
    UnescapeAndRedirect,
    /// Unescape and forward (routing and the backend see `/`).
    UnescapeAndForward,
}

/// Envoy Gateway's `ClientTrafficPolicy.connection`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientConnection {
    #[serde(default)]
    pub connection_limit: Option<ConnectionLimit>,
}

/// At most `value` concurrent downstream connections per filter chain (the listener, or the
/// HTTPS hostname); Envoy closes further ones (`envoy.filters.network.connection_limit`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConnectionLimit {
    pub value: Spanned<u64>,
    /// Wait this long before closing a rejected connection (slows down reconnect loops).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub close_delay: Option<Spanned<Duration>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientIpDetection {
    #[serde(default)]
    pub x_forwarded_for: Option<XForwardedFor>,
}

/// The client address is the `numTrustedHops`-th address from the right of
/// `X-Forwarded-For` (proxies in front of Envoy that are trusted to append it).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct XForwardedFor {
    pub num_trusted_hops: Spanned<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientTimeouts {
    /// Whole request, headers to end of response (HCM `request_timeout`).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub request_timeout: Option<Spanned<Duration>>,
    /// Connection without any stream for this long is closed.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub idle_timeout: Option<Spanned<Duration>>,
    /// A stream without activity for this long is reset.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub stream_idle_timeout: Option<Spanned<Duration>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientTls {
    #[serde(default)]
    pub min_version: Option<Spanned<TlsVersion>>,
    #[serde(default)]
    pub max_version: Option<Spanned<TlsVersion>>,
    /// ALPN protocols offered to clients (`h2`, `http/1.1`), in preference order; default
    /// both. `[http/1.1]` turns HTTP/2 off for the listener's HTTPS clients.
    #[serde(default)]
    pub alpn_protocols: Vec<Spanned<String>>,
    /// BoringSSL cipher suite names (TLS 1.2 and below; 1.3 suites are not configurable).
    #[serde(default)]
    pub ciphers: Vec<Spanned<String>>,
    #[serde(default)]
    pub client_validation: Option<ClientValidation>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum TlsVersion {
    #[serde(rename = "1.2")]
    V1_2,
    #[serde(rename = "1.3")]
    V1_3,
}

/// Frontend mTLS: verify client certificates against CA bundles (`ca.crt` of ConfigMaps or
/// TLS Secrets in the policy's namespace).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientValidation {
    pub ca_certificate_refs: Vec<LocalObjectRef>,
    /// Accept clients without a certificate (a presented one must still verify).
    #[serde(default)]
    pub optional: bool,
    /// Accepted client certificate SANs (DNS or URI, exact); none: any the CA signed.
    #[serde(default)]
    pub subject_alt_names: Vec<Spanned<String>>,
    /// Send the verified certificate's subject, URI/DNS SANs and PEM to backends in
    /// `x-forwarded-client-cert` (replacing any the client sent).
    #[serde(default)]
    pub forward_client_certificate: bool,
}

pub(crate) fn validate_client_policy(ctx: &mut Ctx, p: &ClientPolicy) {
    crate::validate::metadata(ctx, &p.metadata);
    let s = &p.spec;
    validate_target_refs(ctx, &s.target_refs, &CLIENT_POLICY_TARGETS);
    if let Some(t) = &s.timeout {
        for (name, d) in [
            ("requestTimeout", &t.request_timeout),
            ("idleTimeout", &t.idle_timeout),
            ("streamIdleTimeout", &t.stream_idle_timeout),
        ] {
            if let Some(d) = d
                && d.is_zero()
            {
                ctx.err(
                    d.pos,
                    format!("spec.timeout.{name}"),
                    "must be greater than 0",
                );
            }
        }
    }
    if let Some(kb) = &s.max_request_headers_kb
        && !(1..=8192).contains(&kb.value)
    {
        ctx.err(
            kb.pos,
            "spec.maxRequestHeadersKb",
            format!("{} is out of range 1..=8192", kb.value),
        );
    }
    if let Some(l) = s
        .connection
        .as_ref()
        .and_then(|c| c.connection_limit.as_ref())
        && l.value.value == 0
    {
        ctx.err(
            l.value.pos,
            "spec.connection.connectionLimit.value",
            "must be at least 1",
        );
    }
    if let Some(h) = &s.http2 {
        if let Some(m) = &h.max_concurrent_streams
            && !(1..=2_147_483_647).contains(&m.value)
        {
            ctx.err(
                m.pos,
                "spec.http2.maxConcurrentStreams",
                format!("{} is out of range 1..=2147483647", m.value),
            );
        }
        for (name, w) in [
            ("initialStreamWindowSize", &h.initial_stream_window_size),
            (
                "initialConnectionWindowSize",
                &h.initial_connection_window_size,
            ),
        ] {
            if let Some(w) = w
                && !(65_535..=2_147_483_647).contains(&w.value.0)
            {
                ctx.err(
                    w.pos,
                    format!("spec.http2.{name}"),
                    format!("{} bytes is out of range 65535..=2147483647", w.value.0),
                );
            }
        }
    }
    if let Some(t) = &s.tracing {
        validate_tracing(ctx, t);
    }
    // QUIC is TLS 1.3 only: a policy capping TLS at 1.2 cannot serve HTTP/3.
    if let (Some(h3), Some(max)) = (
        &s.http3,
        s.tls.as_ref().and_then(|t| t.max_version.as_ref()),
    ) && max.value == TlsVersion::V1_2
    {
        ctx.err(
            h3.pos,
            "spec.http3",
            "HTTP/3 needs TLS 1.3, but spec.tls.maxVersion is 1.2",
        );
    }
    if let Some(tls) = &s.tls {
        for (i, a) in tls.alpn_protocols.iter().enumerate() {
            if !matches!(a.as_str(), "h2" | "http/1.1") {
                ctx.err(
                    a.pos,
                    format!("spec.tls.alpnProtocols[{i}]"),
                    format!(
                        "unsupported protocol {:?}; expected h2 or http/1.1",
                        a.value
                    ),
                );
            }
        }
        if let (Some(min), Some(max)) = (&tls.min_version, &tls.max_version)
            && min.value == TlsVersion::V1_3
            && max.value == TlsVersion::V1_2
        {
            ctx.err(
                max.pos,
                "spec.tls.maxVersion",
                "maxVersion is below minVersion",
            );
        }
        for (i, c) in tls.ciphers.iter().enumerate() {
            if c.is_empty()
                || !c
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_[]|".contains(&b))
            {
                ctx.err(
                    c.pos,
                    format!("spec.tls.ciphers[{i}]"),
                    format!("invalid cipher suite name {:?}", c.value),
                );
            }
        }
        if let Some(v) = &tls.client_validation {
            if v.ca_certificate_refs.is_empty() {
                ctx.err(
                    crate::spanned::Pos::UNKNOWN,
                    "spec.tls.clientValidation.caCertificateRefs",
                    "caCertificateRefs must name at least one ConfigMap or Secret",
                );
            }
            for (i, r) in v.ca_certificate_refs.iter().enumerate() {
                if !r.group.is_empty() || !matches!(r.kind.as_str(), "ConfigMap" | "Secret") {
                    ctx.err(
                        r.kind.pos,
                        format!("spec.tls.clientValidation.caCertificateRefs[{i}].kind"),
                        format!(
                            "unsupported kind {:?}; expected core ConfigMap or Secret",
                            r.kind.value
                        ),
                    );
                }
            }
        }
    }
}

fn validate_tracing(ctx: &mut Ctx, t: &ClientTracing) {
    let r = &t.backend_ref;
    if let Some(g) = &r.group
        && !matches!(g.as_str(), "" | "ballast.dev")
    {
        ctx.err(
            g.pos,
            "spec.tracing.backendRef.group",
            format!("unsupported group {:?}; expected ballast.dev", g.value),
        );
    }
    if let Some(k) = &r.kind
        && k.as_str() != "Backend"
    {
        ctx.err(
            k.pos,
            "spec.tracing.backendRef.kind",
            format!("unsupported kind {:?}; expected Backend", k.value),
        );
    }
    if r.name.is_empty() {
        ctx.err(
            r.name.pos,
            "spec.tracing.backendRef.name",
            "must not be empty",
        );
    }
    if let Some(rate) = &t.sampling_rate
        && rate.value > 100
    {
        ctx.err(
            rate.pos,
            "spec.tracing.samplingRate",
            format!("{} is out of range 0..=100 (percent)", rate.value),
        );
    }
    if let Some(p) = &t.path {
        if t.protocol.as_ref().map(|p| p.value).unwrap_or_default() != OtlpProtocol::Http {
            ctx.err(
                p.pos,
                "spec.tracing.path",
                "path is for protocol: HTTP only",
            );
        } else if !p.starts_with('/') {
            ctx.err(p.pos, "spec.tracing.path", "must start with /");
        }
    }
    if let Some(n) = &t.service_name
        && n.is_empty()
    {
        ctx.err(n.pos, "spec.tracing.serviceName", "must not be empty");
    }
}

#[cfg(test)]
mod tests {
    use crate::ConfigSet;
    use crate::attach::TargetId;
    use crate::kinds::*;
    use proptest::prelude::*;

    const GW: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: edge }\nspec:\n  gatewayClassName: ballast\n  listeners:\n  - { name: a, port: 80, protocol: HTTP }\n  - { name: b, port: 81, protocol: HTTP }\n";

    fn policy(name: &str, section: Option<&str>) -> String {
        let s = section
            .map(|s| format!(", sectionName: {s}"))
            .unwrap_or_default();
        format!(
            "---\napiVersion: ballast.dev/v1alpha1\nkind: ClientPolicy\nmetadata: {{ name: {name} }}\nspec:\n  targetRefs: [{{ group: gateway.networking.k8s.io, kind: Gateway, name: edge{s} }}]\n"
        )
    }

    #[test]
    fn path_and_connection_limit_parse_with_envoy_gateway_names() {
        let text = GW.to_owned()
            + &policy("p", None)
            + "  path: { escapedSlashesAction: RejectRequest, disableMergeSlashes: true }\n  connection:\n    connectionLimit: { value: 2, closeDelay: 1s }\n";
        let set = ConfigSet::build([("c.yaml", text)]).unwrap();
        let p = set
            .client_policy_for(&ObjectKey::new("default", "edge"), "a")
            .unwrap();
        let path = p.spec.path.as_ref().unwrap();
        assert_eq!(
            path.escaped_slashes_action.as_ref().map(|a| a.value),
            Some(EscapedSlashesAction::RejectRequest)
        );
        assert!(path.disable_merge_slashes);
        let l = p
            .spec
            .connection
            .as_ref()
            .unwrap()
            .connection_limit
            .as_ref()
            .unwrap();
        assert_eq!(l.value.value, 2);
        assert_eq!(
            l.close_delay.as_ref().map(|d| d.value),
            Some(std::time::Duration::from_secs(1))
        );
    }

    #[test]
    fn zero_connection_limit_and_unknown_action_are_errors_with_positions() {
        let zero = GW.to_owned()
            + &policy("p", None)
            + "  connection:\n    connectionLimit: { value: 0 }\n";
        let errs = ConfigSet::build([("c.yaml", zero)]).unwrap_err();
        let e = errs[0].to_string();
        assert!(
            e.contains("c.yaml:") && e.contains("connectionLimit.value"),
            "{e}"
        );
        let bad = GW.to_owned() + &policy("p", None) + "  path: { escapedSlashesAction: Drop }\n";
        let errs = ConfigSet::build([("c.yaml", bad)]).unwrap_err();
        assert!(errs[0].to_string().contains("Drop"), "{errs:?}");
    }

    #[test]
    fn http2_settings_and_alpn_parse_and_validate() {
        let ok = GW.to_owned()
            + &policy("p", None)
            + "  http2: { maxConcurrentStreams: 10, initialStreamWindowSize: 64Ki, initialConnectionWindowSize: 1048576 }\n  tls: { alpnProtocols: [http/1.1] }\n";
        let set = ConfigSet::build([("c.yaml", ok)]).unwrap();
        let p = set
            .client_policy_for(&ObjectKey::new("default", "edge"), "a")
            .unwrap();
        let h = p.spec.http2.as_ref().unwrap();
        assert_eq!(h.max_concurrent_streams.as_ref().map(|m| m.value), Some(10));
        assert_eq!(
            h.initial_stream_window_size.as_ref().map(|w| w.value),
            Some(ByteSize(65536))
        );
        assert_eq!(
            h.initial_connection_window_size.as_ref().map(|w| w.value),
            Some(ByteSize(1 << 20))
        );
        assert_eq!(
            p.spec.tls.as_ref().unwrap().alpn_protocols[0].as_str(),
            "http/1.1"
        );
        let bad = GW.to_owned()
            + &policy("p", None)
            + "  http2: { initialStreamWindowSize: 1Ki }\n  tls: { alpnProtocols: [h3] }\n";
        let errs = ConfigSet::build([("c.yaml", bad)]).unwrap_err();
        let all = errs
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            all.contains("initialStreamWindowSize") && all.contains("alpnProtocols[0]"),
            "{all}"
        );
        let bad =
            GW.to_owned() + &policy("p", None) + "  http2: { initialStreamWindowSize: 1Ti }\n";
        assert!(ConfigSet::build([("c.yaml", bad)]).is_err());
    }

    #[test]
    fn tracing_parses_and_validates_with_positions() {
        let ok = GW.to_owned()
            + &policy("p", None)
            + "  tracing:\n    backendRef: { name: otel }\n    protocol: HTTP\n    path: /v1/traces\n    samplingRate: 25\n    serviceName: edge-gw\n";
        let set = ConfigSet::build([("c.yaml", ok)]).unwrap();
        let p = set
            .client_policy_for(&ObjectKey::new("default", "edge"), "a")
            .unwrap();
        let t = p.spec.tracing.as_ref().unwrap();
        assert_eq!(t.backend_ref.name.as_str(), "otel");
        assert_eq!(
            t.protocol.as_ref().map(|p| p.value),
            Some(OtlpProtocol::Http)
        );
        assert_eq!(t.sampling_rate.as_ref().map(|r| r.value), Some(25));
        assert_eq!(t.service_name.as_ref().map(|n| n.as_str()), Some("edge-gw"));
        let bad = GW.to_owned()
            + &policy("p", None)
            + "  tracing:\n    backendRef: { kind: Service, name: otel }\n    samplingRate: 101\n    path: /v1/traces\n";
        let errs = ConfigSet::build([("c.yaml", bad)]).unwrap_err();
        let all = errs
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n");
        for want in [
            "c.yaml:17:",
            "spec.tracing.backendRef.kind",
            "spec.tracing.samplingRate",
            "spec.tracing.path",
        ] {
            assert!(all.contains(want), "{want} missing in {all}");
        }
        let unknown = GW.to_owned()
            + &policy("p", None)
            + "  tracing: { backendRef: { name: otel }, protocol: ZIPKIN }\n";
        assert!(ConfigSet::build([("c.yaml", unknown)]).is_err());
    }

    const GW3: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: edge }\nspec:\n  gatewayClassName: ballast\n  listeners:\n  - { name: a, port: 80, protocol: HTTP }\n  - { name: b, port: 81, protocol: HTTP, hostname: b.example.com }\n  - { name: s, port: 443, protocol: HTTPS, hostname: s.example.com, tls: { certificateRefs: [{ name: s-tls }] } }\n";

    fn accepted(set: &ConfigSet, policy: &str, section: Option<&str>) -> (bool, String, String) {
        let st = crate::status::compute(set);
        let p = st
            .client_policies
            .iter()
            .find(|p| p.name == policy)
            .unwrap();
        let t = p
            .targets
            .iter()
            .find(|t| t.section_name.as_deref() == section)
            .unwrap();
        let c = &t.conditions[0];
        (c.is_true(), c.reason.clone(), c.message.clone())
    }

    #[test]
    fn http3_and_http1_parse_with_envoy_gateway_names() {
        let text = GW3.to_owned()
            + &policy("p", None)
            + "  http3: {}\n  http1:\n    enableTrailers: true\n    preserveHeaderCase: true\n    http10: { useDefaultHost: true }\n";
        let set = ConfigSet::build([("c.yaml", text)]).unwrap();
        let gw = ObjectKey::new("default", "edge");
        let p = set.client_policy_for(&gw, "s").unwrap();
        assert!(p.spec.http3.is_some());
        let h1 = p.spec.http1.as_ref().unwrap();
        assert!(h1.enable_trailers && h1.preserve_header_case);
        assert!(h1.http10.as_ref().unwrap().use_default_host);
        let g = &set.gateways[&gw];
        let (a, b, s) = (
            g.listener("a").unwrap(),
            g.listener("b").unwrap(),
            g.listener("s").unwrap(),
        );
        assert!(p.http3_on(s) && !p.http3_on(a) && !p.http3_on(b));
        assert_eq!(p.default_host_for(s), Some("s.example.com"));
        assert_eq!(p.default_host_for(b), Some("b.example.com"));
        assert_eq!(p.default_host_for(a), None, "no hostname to inject");
        // Gateway-wide: applies everywhere, and says what it ignores where.
        for l in ["a", "b", "s"] {
            assert!(set.client_policy_for(&gw, l).is_some(), "{l}");
        }
        let (ok, _, msg) = accepted(&set, "p", None);
        assert!(ok, "{msg}");
        assert!(
            msg.contains("http3 (line 16) needs an HTTPS listener; listener \"a\" is HTTP")
                && msg.contains("listener \"b\" is HTTP")
                && msg.contains("useDefaultHost needs a listener hostname without wildcard; listener \"a\" has none"),
            "{msg}"
        );
        assert!(!msg.contains("\"s\""), "{msg}");
        for unknown in [
            "  http3: { enabled: true }\n",
            "  http1: { http10: { defaultHost: x } }\n",
        ] {
            let text = GW3.to_owned() + &policy("p", None) + unknown;
            assert!(ConfigSet::build([("c.yaml", text)]).is_err(), "{unknown}");
        }
    }

    #[test]
    fn http3_on_an_http_listener_is_invalid_there_and_not_applied() {
        let text = GW3.to_owned()
            + &policy("all", None)
            + "  maxRequestHeadersKb: 10\n"
            + &policy("h3-on-a", Some("a"))
            + "  http3: {}\n"
            + &policy("h3-on-s", Some("s"))
            + "  http3: {}\n"
            + &policy("h10-on-a", Some("a"))
            + "  http1: { http10: { useDefaultHost: true } }\n";
        let set = ConfigSet::build([("c.yaml", text)]).unwrap();
        let gw = ObjectKey::new("default", "edge");
        let (ok, reason, msg) = accepted(&set, "h3-on-a", Some("a"));
        assert!(!ok);
        assert_eq!(reason, "Invalid");
        assert!(
            msg.contains("needs an HTTPS listener; listener \"a\" is HTTP"),
            "{msg}"
        );
        let (ok, reason, msg) = accepted(&set, "h10-on-a", Some("a"));
        assert!(
            !ok && reason == "Invalid" && msg.contains("useDefaultHost"),
            "{msg}"
        );
        assert!(accepted(&set, "h3-on-s", Some("s")).0);
        // Listener a falls back to the Gateway-wide policy; s gets its own.
        assert_eq!(
            set.client_policy_for(&gw, "a").unwrap().metadata.name,
            "all"
        );
        assert_eq!(
            set.client_policy_for(&gw, "s").unwrap().metadata.name,
            "h3-on-s"
        );
        let problems = crate::status::compute(&set).problems().join("\n");
        assert!(problems.contains("Invalid"), "{problems}");
    }

    #[test]
    fn http3_with_tls_1_2_is_an_error_with_its_position() {
        let text = GW3.to_owned()
            + &policy("p", Some("s"))
            + "  tls: { maxVersion: \"1.2\" }\n  http3: {}\n";
        let errs = ConfigSet::build([("c.yaml", text)]).unwrap_err();
        let e = errs[0].to_string();
        assert!(e.contains("c.yaml:17:") && e.contains("TLS 1.3"), "{e}");
    }

    proptest! {
        /// The per-listener lookup translation uses equals the attachment resolution status
        /// reports (listener policy beats gateway policy; oldest wins a tie; unknown sections
        /// attach nowhere).
        #[test]
        fn listener_lookup_equals_resolution(policies in prop::collection::btree_map(0u8..6, (prop::option::of(0u8..4), 0u8..3), 0..6)) {
            let mut text = GW3.to_owned();
            for (p, (s, extra)) in &policies {
                text += &policy(&format!("p{p}"), s.map(|s| ["a", "b", "s", "zz"][s as usize]));
                // Settings some listeners cannot take: such a listener policy is Invalid there.
                text += ["", "  http3: {}\n", "  http1: { http10: { useDefaultHost: true } }\n"][*extra as usize];
            }
            let set = ConfigSet::build([("c.yaml", text)]).unwrap();
            let res = set.client_policy_resolution();
            let gw = ObjectKey::new("default", "edge");
            let t = TargetId { kind: TargetKind::Gateway, key: gw.clone() };
            for l in ["a", "b", "s"] {
                prop_assert_eq!(
                    set.client_policy_for(&gw, l).map(|p| p.key()),
                    res.effective(&t, Some(l)).cloned()
                );
            }
        }
    }
}
