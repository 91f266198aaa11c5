//! Gateway API session persistence (`sessionPersistence`, Envoy stateful sessions) and listener
//! conflicts (`Conflicted`), through real Envoy with real traffic (see docs/gateway-api.md).

mod common;

use std::collections::BTreeSet;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, Upstream, wait_until};
use common::*;

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A route on `host` to Backend `web`, with `sp` (YAML) as its rule's sessionPersistence.
fn session_route(name: &str, host: &str, sp: &str) -> String {
    let mut r = route(name, host, "web");
    if !sp.is_empty() {
        r.push_str(&format!("    sessionPersistence: {sp}\n"));
    }
    r
}

/// GET on `host` with `headers`, asserting 200: (upstream name, response headers).
async fn get(
    gw: std::net::SocketAddr,
    host: &str,
    headers: &[&str],
) -> (String, Vec<(String, String)>) {
    let (status, h, body) = host_request(gw, "GET", host, headers).await.unwrap();
    assert_eq!(status, 200, "{host} {headers:?}: {h:?} {body}");
    (body, h)
}

/// Conformance `HTTPRouteSessionPersistenceCookie` (and the Permanent lifetime and header
/// variants), with three endpoints behind one Backend: the first response sets the session
/// cookie (a session cookie: no Max-Age/Expires), and 30 requests carrying it all reach the
/// endpoint that served the first, for sessions pinned to different endpoints; requests
/// without it spread. Header-based persistence the same with the `x-session` header. A rule
/// without sessionPersistence sets nothing and spreads; an unsupported setting (idleTimeout)
/// is reported as `UnsupportedValue` while the session still works. When a pinned endpoint
/// leaves the Backend and stops, requests with its cookie are load balanced and get a new
/// cookie. Every response is 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_persistence_pins_requests_to_one_endpoint() {
    let mut ups = [
        Upstream::start("a").await.unwrap(),
        Upstream::start("b").await.unwrap(),
        Upstream::start("c").await.unwrap(),
    ];
    let addrs: Vec<_> = ups.iter().map(|u| u.addr()).collect();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let config = |addrs: &[std::net::SocketAddr]| {
        gateway(port)
            + &session_route("cookie", "cookie.example.com", "{ sessionName: sticky }")
            + &session_route(
                "permanent",
                "permanent.example.com",
                "{ type: Cookie, absoluteTimeout: 1h, cookie: { name: perm, lifetimeType: Permanent } }",
            )
            + &session_route(
                "header",
                "header.example.com",
                "{ type: Header, header: { name: x-session } }",
            )
            + &session_route(
                "idle",
                "idle.example.com",
                "{ sessionName: idle, idleTimeout: 5m }",
            )
            + &session_route("plain", "plain.example.com", "")
            + &backend("web", addrs)
    };
    let file = dir.path().join("all.yaml");
    std::fs::write(&file, config(&addrs)).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-sessions",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    wait_until(T, POLL, || async {
        let mut ok = true;
        for h in [
            "cookie.example.com",
            "permanent.example.com",
            "header.example.com",
            "idle.example.com",
            "plain.example.com",
        ] {
            ok &= matches!(host_get(gw, h).await, Ok((200, _)));
        }
        ok
    })
    .await
    .unwrap();

    // Cookie sessions: a new session per request without the cookie; collect sessions until
    // two different endpoints hold one (bounded), then check each sticks.
    let mut sessions: Vec<(String, String)> = Vec::new(); // (endpoint, cookie pair)
    for _ in 0..30 {
        let (ep, h) = get(gw, "cookie.example.com", &[]).await;
        let set = header(&h, "set-cookie").unwrap_or_else(|| panic!("no set-cookie: {h:?}"));
        let attrs: Vec<String> = set
            .split(';')
            .map(|a| a.trim().to_ascii_lowercase())
            .collect();
        assert!(attrs[0].starts_with("sticky="), "{set}");
        assert!(
            !attrs
                .iter()
                .any(|a| a.starts_with("max-age") || a.starts_with("expires")),
            "a Session cookie has no Max-Age/Expires: {set}"
        );
        assert!(attrs.iter().any(|a| a == "path=/"), "{set}");
        let pair = set.split(';').next().unwrap().to_owned();
        if !sessions.iter().any(|(e, _)| *e == ep) {
            sessions.push((ep, pair));
        }
        if sessions.len() >= 2 {
            break;
        }
    }
    assert!(sessions.len() >= 2, "new sessions spread: {sessions:?}");
    for (ep, pair) in &sessions {
        for _ in 0..30 {
            let (got, h) = get(gw, "cookie.example.com", &[&format!("Cookie: {pair}")]).await;
            assert_eq!(&got, ep, "the session cookie {pair} pins its endpoint");
            assert_eq!(header(&h, "set-cookie"), None, "the session is kept: {h:?}");
        }
    }

    // The pinned endpoint leaves the Backend (scale-down): its sessions fall back to load
    // balancing with a new cookie, never an error (not `strict`).
    let (gone, pair) = sessions[0].clone();
    let gone_index = ups.iter().position(|u| u.name() == gone).unwrap();
    let rest: Vec<_> = addrs
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != gone_index)
        .map(|(_, a)| *a)
        .collect();
    write_atomic(&file, &config(&rest));
    wait_until(T, POLL, || async {
        get(gw, "cookie.example.com", &[&format!("Cookie: {pair}")])
            .await
            .0
            != gone
    })
    .await
    .unwrap();
    ups[gone_index].stop().await;
    let mut moved = BTreeSet::new();
    for _ in 0..30 {
        let (got, h) = get(gw, "cookie.example.com", &[&format!("Cookie: {pair}")]).await;
        assert_ne!(got, gone);
        assert!(
            header(&h, "set-cookie").is_some_and(|c| c.starts_with("sticky=")),
            "a new session replaces the stale one: {h:?}"
        );
        moved.insert(got);
    }
    assert!(!moved.is_empty());

    // Permanent cookie: Max-Age from absoluteTimeout.
    let (ep, h) = get(gw, "permanent.example.com", &[]).await;
    let set = header(&h, "set-cookie").unwrap().to_owned();
    assert!(set.starts_with("perm="), "{set}");
    assert!(set.contains("Max-Age=3600"), "{set}");
    let pair = set.split(';').next().unwrap();
    for _ in 0..30 {
        let (got, _) = get(gw, "permanent.example.com", &[&format!("Cookie: {pair}")]).await;
        assert_eq!(got, ep);
    }

    // Header sessions: the response header names the session; sending it back pins it.
    let mut sessions: Vec<(String, String)> = Vec::new();
    for _ in 0..30 {
        let (ep, h) = get(gw, "header.example.com", &[]).await;
        let v = header(&h, "x-session")
            .unwrap_or_else(|| panic!("no x-session: {h:?}"))
            .to_owned();
        assert_eq!(header(&h, "set-cookie"), None);
        if !sessions.iter().any(|(e, _)| *e == ep) {
            sessions.push((ep, v));
        }
        if sessions.len() >= 2 {
            break;
        }
    }
    assert!(sessions.len() >= 2, "new sessions spread: {sessions:?}");
    for (ep, v) in &sessions {
        for _ in 0..30 {
            let (got, _) = get(gw, "header.example.com", &[&format!("x-session: {v}")]).await;
            assert_eq!(&got, ep, "x-session {v} pins its endpoint");
        }
    }
    // The header route ignores cookies, the cookie route the header: those requests spread.
    let mut seen = BTreeSet::new();
    for _ in 0..30 {
        let (ep, _) = get(
            gw,
            "header.example.com",
            &[&format!("Cookie: {}", sessions[0].1)],
        )
        .await;
        seen.insert(ep);
    }
    assert!(seen.len() >= 2, "{seen:?}");

    // Unsupported idleTimeout: reported, and the session still sticks.
    let (ep, h) = get(gw, "idle.example.com", &[]).await;
    let pair = header(&h, "set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    assert!(pair.starts_with("idle="), "{pair}");
    for _ in 0..10 {
        assert_eq!(
            get(gw, "idle.example.com", &[&format!("Cookie: {pair}")])
                .await
                .0,
            ep
        );
    }
    let (_, sources) = ballast.get("/debug/sources").await.unwrap();
    assert!(
        sources.contains("UnsupportedValue")
            && sources.contains("rules[0].sessionPersistence.idleTimeout"),
        "{sources}"
    );

    // No sessionPersistence: no cookie, requests spread even with another route's cookie.
    let mut seen = BTreeSet::new();
    for _ in 0..30 {
        let (ep, h) = get(gw, "plain.example.com", &["Cookie: sticky=x"]).await;
        assert_eq!(header(&h, "set-cookie"), None, "{h:?}");
        assert_eq!(header(&h, "x-session"), None, "{h:?}");
        seen.insert(ep);
    }
    assert!(
        seen.len() >= 2,
        "without persistence requests spread: {seen:?}"
    );
}

/// A Gateway with indistinct listeners: two HTTP listeners on one port with the same hostname
/// (`HostnameConflict`) and an HTTP and an HTTPS listener on another port
/// (`ProtocolConflict`), next to a distinct listener. The distinct listener serves (30/30
/// requests 200, Envoy holds exactly its one listener); the conflicted ones get no Envoy
/// listener and report `Conflicted` in `/debug/sources`. Before, the whole Gateway was
/// rejected and nothing was served. Renaming one hostname resolves the conflict live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicted_listeners_are_not_served_and_the_others_are() {
    let up = Upstream::start("web").await.unwrap();
    let (p_ok, p_dup, p_mix) = (
        ballast_testkit::free_port(),
        ballast_testkit::free_port(),
        ballast_testkit::free_port(),
    );
    let dir = tempfile::tempdir().unwrap();
    let config = |second_host: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - {{ name: ok, port: {p_ok}, protocol: HTTP }}
  - {{ name: dup-1, port: {p_dup}, protocol: HTTP, hostname: dup.example.com }}
  - {{ name: dup-2, port: {p_dup}, protocol: HTTP, hostname: {second_host} }}
  - {{ name: mix-http, port: {p_mix}, protocol: HTTP }}
  - {{ name: mix-https, port: {p_mix}, protocol: HTTPS, tls: {{ certificateRefs: [{{ name: tls }}] }} }}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: web }}
spec:
  parentRefs: [{{ name: edge }}]
  rules:
  - backendRefs: [{{ group: ballast.dev, kind: Backend, name: web }}]
"
        ) + &backend("web", &[up.addr()])
    };
    let file = dir.path().join("all.yaml");
    std::fs::write(&file, config("dup.example.com")).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-conflicts",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let ok = loopback(p_ok);
    wait_until(T, POLL, || async {
        matches!(host_get(ok, "any.example.com").await, Ok((200, _)))
    })
    .await
    .unwrap();
    let mut statuses = Vec::new();
    for i in 0..30 {
        statuses.push(host_status(ok, &format!("h{i}.example.com")).await.unwrap());
    }
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let ports: Vec<u16> = envoy
        .listener_addrs()
        .await
        .unwrap()
        .values()
        .map(|a| a.port())
        .collect();
    assert_eq!(ports, [p_ok], "conflicted listeners get no Envoy listener");
    assert!(host_get(loopback(p_dup), "dup.example.com").await.is_err());
    let (_, sources) = ballast.get("/debug/sources").await.unwrap();
    for want in [
        "HostnameConflict",
        "ProtocolConflict",
        "Conflicted",
        "ListenersNotValid",
    ] {
        assert!(sources.contains(want), "{want}: {sources}");
    }

    // Distinct hostnames: both listeners of the port serve, and the first port still does.
    write_atomic(&file, &config("other.example.com"));
    let dup = loopback(p_dup);
    wait_until(T, POLL, || async {
        matches!(host_get(dup, "dup.example.com").await, Ok((200, _)))
            && matches!(host_get(dup, "other.example.com").await, Ok((200, _)))
    })
    .await
    .unwrap();
    assert_eq!(host_status(ok, "any.example.com").await.unwrap(), 200);
}
