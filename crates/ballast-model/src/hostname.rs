//! Hostnames as Gateway API defines them: lowercase DNS names, optionally with a leading `*.`
//! wildcard label that matches one *or more* labels (`*.example.com` matches `a.example.com` and
//! `a.b.example.com`, not `example.com`). Listener and route hostnames intersect per the spec.

/// The result of [`effective_hostnames`] that means "every host" (Envoy's `*` domain). Gateway API
/// hostnames can never be a bare `*`, so it cannot be confused with a real hostname.
pub const ANY_HOST: &str = "*";

/// Checks a Gateway API hostname (listener `hostname`, route `hostnames`).
pub fn validate_hostname(host: &str) -> Result<(), String> {
    if host.is_empty() {
        return Err("hostname must not be empty".into());
    }
    if host.len() > 253 {
        return Err(format!("hostname {host:?} is longer than 253 characters"));
    }
    let name = host.strip_prefix("*.").unwrap_or(host);
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Err(format!(
            "hostname {host:?} is an IP address; Gateway API hostnames must be DNS names"
        ));
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(format!(
                "invalid hostname {host:?}: expected lowercase DNS labels (a-z, 0-9, '-'), \
                 optionally prefixed by \"*.\""
            ));
        }
    }
    Ok(())
}

/// Whether `pattern` (exact or `*.suffix`) matches the concrete or wildcard name `host`.
/// A wildcard pattern matches any name with at least one more label in front of its suffix,
/// including wildcard names that are at least as specific (`*.example.com` ⊇ `*.a.example.com`).
pub fn hostname_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix('*') {
        // `suffix` keeps its leading dot, so `*.example.com` never matches `example.com`; the
        // host must add at least one label in front of it (equal wildcards are the caller's case).
        Some(suffix) => {
            let host_rest = host.strip_prefix('*').unwrap_or(host);
            host_rest.len() > suffix.len() && host_rest.ends_with(suffix)
        }
        None => !host.starts_with('*') && pattern == host,
    }
}

/// The hostname a route hostname and a listener hostname both accept, if any: the more specific
/// of the two (Gateway API "intersection").
pub fn intersect(listener: &str, route: &str) -> Option<String> {
    if listener == route {
        return Some(route.to_owned());
    }
    if hostname_matches(listener, route) {
        return Some(route.to_owned());
    }
    if hostname_matches(route, listener) {
        return Some(listener.to_owned());
    }
    None
}

/// The hostnames a route serves on a listener: `[ANY_HOST]` when neither restricts, the listener
/// hostname when only it does, otherwise each intersecting pair (deduplicated, in route order).
/// An empty result means the route does not attach to that listener
/// (`NoMatchingListenerHostname`).
pub fn effective_hostnames<S: AsRef<str>>(listener: Option<&str>, route: &[S]) -> Vec<String> {
    match (listener, route.is_empty()) {
        (None, true) => vec![ANY_HOST.to_owned()],
        (Some(l), true) => vec![l.to_owned()],
        (None, false) => dedup(route.iter().map(|r| r.as_ref().to_owned())),
        (Some(l), false) => dedup(route.iter().filter_map(|r| intersect(l, r.as_ref()))),
    }
}

fn dedup(items: impl Iterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_hostnames() {
        for ok in [
            "example.com",
            "*.example.com",
            "a-b.c1.io",
            "localhost",
            "*.io",
        ] {
            assert_eq!(validate_hostname(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "*",
            "Example.com",
            "a..b",
            "-a.com",
            "a-.com",
            "*.*.com",
            "a.*.com",
            "ex ample",
            "127.0.0.1",
            "foo.com.",
            "a_b.com",
            "**.com",
        ] {
            assert!(validate_hostname(bad).is_err(), "{bad:?} accepted");
        }
        assert!(validate_hostname(&format!("{}.com", "a".repeat(64))).is_err());
        assert!(validate_hostname(&"a.".repeat(127).to_string()).is_err());
    }

    #[test]
    fn intersection_table() {
        // (listener, route, expected)
        let table: &[(&str, &str, Option<&str>)] = &[
            (
                "foo.example.com",
                "foo.example.com",
                Some("foo.example.com"),
            ),
            ("foo.example.com", "bar.example.com", None),
            ("*.example.com", "foo.example.com", Some("foo.example.com")),
            ("*.example.com", "a.b.example.com", Some("a.b.example.com")),
            ("*.example.com", "example.com", None),
            ("*.example.com", "fooexample.com", None),
            ("foo.example.com", "*.example.com", Some("foo.example.com")),
            ("example.com", "*.example.com", None),
            ("*.example.com", "*.example.com", Some("*.example.com")),
            (
                "*.example.com",
                "*.foo.example.com",
                Some("*.foo.example.com"),
            ),
            (
                "*.foo.example.com",
                "*.example.com",
                Some("*.foo.example.com"),
            ),
            ("*.example.com", "*.example.org", None),
            ("*.com", "example.com", Some("example.com")),
            ("*.a.com", "*.b.com", None),
        ];
        for (l, r, want) in table {
            assert_eq!(intersect(l, r).as_deref(), *want, "listener {l} route {r}");
        }
    }

    #[test]
    fn effective_hostnames_table() {
        let none: &[&str] = &[];
        assert_eq!(effective_hostnames(None, none), vec!["*"]);
        assert_eq!(
            effective_hostnames(Some("*.example.com"), none),
            vec!["*.example.com"]
        );
        assert_eq!(
            effective_hostnames(None, &["a.com", "*.b.com", "a.com"]),
            vec!["a.com", "*.b.com"]
        );
        assert_eq!(
            effective_hostnames(
                Some("*.example.com"),
                &[
                    "web.example.com",
                    "other.org",
                    "*.example.com",
                    "*.x.example.com"
                ]
            ),
            vec!["web.example.com", "*.example.com", "*.x.example.com"]
        );
        assert_eq!(
            effective_hostnames(
                Some("web.example.com"),
                &["*.example.com", "api.example.com"]
            ),
            vec!["web.example.com"]
        );
        assert!(effective_hostnames(Some("a.example.com"), &["b.example.com"]).is_empty());
    }
}
