//! Gateway API `CORS` filter → Envoy's `envoy.filters.http.cors`.
//!
//! Every HTTP connection manager carries the CORS filter (before the router); it does nothing
//! for routes without a policy, so only rules with a `CORS` filter change behaviour. Those
//! routes get a `CorsPolicy` in `typed_per_filter_config`.

use ballast_model::Cors;
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::{
    Cors as CorsFilter, CorsPolicy,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpFilterConfig;
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::envoy::r#type::matcher::v3::{RegexMatcher, StringMatcher};
use envoy_types::pb::google::protobuf::{Any, BoolValue};
use envoy_types::util::pack_any;

/// The HTTP filter name, also the `typed_per_filter_config` key.
pub(crate) const FILTER_NAME: &str = "envoy.filters.http.cors";

/// The (policy-less) CORS HTTP filter to put before the router.
pub(crate) fn http_filter() -> HttpFilter {
    HttpFilter {
        name: FILTER_NAME.into(),
        config_type: Some(HttpFilterConfig::TypedConfig(pack_any(CorsFilter {}))),
        ..Default::default()
    }
}

/// The per-route policy of a rule's `CORS` filter.
pub(crate) fn route_policy(c: &Cors) -> Any {
    let join = |v: &[ballast_model::Spanned<String>]| {
        v.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(",")
    };
    pack_any(CorsPolicy {
        allow_origin_string_match: c.allow_origins.iter().map(|o| origin(o)).collect(),
        allow_methods: join(&c.allow_methods),
        allow_headers: join(&c.allow_headers),
        expose_headers: join(&c.expose_headers),
        max_age: c.max_age_seconds().to_string(),
        allow_credentials: c.allow_credentials.map(|value| BoolValue { value }),
        // Gateway API: a preflight from an origin not allowed is answered without CORS
        // headers; it is not the backend's business.
        forward_not_matching_preflights: Some(BoolValue { value: false }),
        ..Default::default()
    })
}

/// An allowed origin as a matcher: `*` matches all, a `*` in the host matches any characters
/// (any number of labels to its left), anything else exactly (origins are compared
/// case-insensitively, as hosts are).
fn origin(o: &str) -> StringMatcher {
    let pattern = if o == "*" {
        MatchPattern::SafeRegex(RegexMatcher {
            regex: ".*".into(),
            ..Default::default()
        })
    } else if o.contains('*') {
        let regex = o
            .split('*')
            .map(regex_escape)
            .collect::<Vec<_>>()
            .join(".*");
        MatchPattern::SafeRegex(RegexMatcher {
            regex,
            ..Default::default()
        })
    } else {
        MatchPattern::Exact(o.to_owned())
    };
    StringMatcher {
        match_pattern: Some(pattern),
        ignore_case: !o.contains('*'),
    }
}

/// RE2-escapes the characters an origin can contain (validated: letters, digits, `-.:/`).
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if !c.is_ascii_alphanumeric() && c != '-' && c != ':' && c != '/' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_become_exact_or_regex_matchers() {
        let m = origin("https://app.example");
        assert_eq!(
            m.match_pattern,
            Some(MatchPattern::Exact("https://app.example".into()))
        );
        assert!(m.ignore_case);
        let Some(MatchPattern::SafeRegex(r)) = origin("https://*.example.com:8443").match_pattern
        else {
            panic!()
        };
        assert_eq!(r.regex, "https://.*\\.example\\.com:8443");
        let Some(MatchPattern::SafeRegex(r)) = origin("*").match_pattern else {
            panic!()
        };
        assert_eq!(r.regex, ".*");
    }
}
