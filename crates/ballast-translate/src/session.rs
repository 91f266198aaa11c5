//! Gateway API `sessionPersistence` → Envoy's `envoy.filters.http.stateful_session`.
//!
//! Every HTTP connection manager carries the filter with no session state, which does nothing;
//! routes of a rule with `sessionPersistence` override it (`StatefulSessionPerRoute`) with a
//! cookie- or header-based session state. Envoy then puts the chosen endpoint's address in the
//! cookie (or response header) and prefers that endpoint for requests that carry it back, falling
//! back to load balancing when it is gone (not `strict`: a removed endpoint must not turn a
//! session into errors).

use ballast_model::{ObjectKey, SessionMode};
use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
use envoy_types::pb::envoy::extensions::filters::http::stateful_session::v3::stateful_session_per_route::Override;
use envoy_types::pb::envoy::extensions::filters::http::stateful_session::v3::{
    StatefulSession, StatefulSessionPerRoute,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpFilterConfig;
use envoy_types::pb::envoy::extensions::http::stateful_session::cookie::v3::CookieBasedSessionState;
use envoy_types::pb::envoy::extensions::http::stateful_session::header::v3::HeaderBasedSessionState;
use envoy_types::pb::envoy::r#type::http::v3::Cookie;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::util::pack_any;

use crate::pb_duration;

/// The HTTP filter name, also the `typed_per_filter_config` key.
pub(crate) const FILTER_NAME: &str = "envoy.filters.http.stateful_session";

/// The (session-less, so inactive) filter to put before the router.
pub(crate) fn http_filter() -> HttpFilter {
    HttpFilter {
        name: FILTER_NAME.into(),
        config_type: Some(HttpFilterConfig::TypedConfig(pack_any(
            StatefulSession::default(),
        ))),
        ..Default::default()
    }
}

/// The cookie or header name of a rule that names none: unique per route rule (Gateway API
/// asks for a generated unique name) and the same on every replica and restart.
pub(crate) fn default_name(route: &ObjectKey, rule: usize) -> String {
    // FNV-1a: stable across Rust versions, unlike `DefaultHasher`.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in format!("{}/{}/{rule}", route.namespace, route.name).bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("ballast-session-{h:016x}")
}

/// The per-route override enabling the session of `mode`.
pub(crate) fn route_config(mode: &SessionMode) -> Any {
    let session_state = match mode {
        SessionMode::Cookie { name, path, ttl } => TypedExtensionConfig {
            name: "envoy.http.stateful_session.cookie".into(),
            typed_config: Some(pack_any(CookieBasedSessionState {
                cookie: Some(Cookie {
                    name: name.clone(),
                    // Unset (0s) makes a session cookie: no Max-Age / Expires.
                    ttl: ttl.map(pb_duration),
                    path: path.clone(),
                    attributes: Vec::new(),
                }),
            })),
        },
        SessionMode::Header { name } => TypedExtensionConfig {
            name: "envoy.http.stateful_session.header".into(),
            typed_config: Some(pack_any(HeaderBasedSessionState { name: name.clone() })),
        },
    };
    pack_any(StatefulSessionPerRoute {
        r#override: Some(Override::StatefulSession(StatefulSession {
            session_state: Some(session_state),
            ..Default::default()
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names_are_stable_and_distinct_per_rule() {
        let k = ObjectKey::new("default", "web");
        assert_eq!(default_name(&k, 0), default_name(&k, 0));
        assert_ne!(default_name(&k, 0), default_name(&k, 1));
        assert_ne!(
            default_name(&k, 0),
            default_name(&ObjectKey::new("x", "web"), 0)
        );
        assert!(default_name(&k, 0).starts_with("ballast-session-"));
    }
}
