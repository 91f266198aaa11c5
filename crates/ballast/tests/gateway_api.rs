//! Gateway API conformance cases ported to files and real Envoy (see docs/gateway-api.md):
//! the upstream suite's manifests adapted to Ballast's kinds, the same request → expected
//! backend/response assertions.

mod common;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, Upstream, wait_until};
use common::*;

/// A gateway in `infra` whose listener admits routes from all namespaces.
fn infra_gateway(port: u16) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge, namespace: infra }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - name: http
    port: {port}
    protocol: HTTP
    allowedRoutes: {{ namespaces: {{ from: All }} }}
"
    )
}

/// Runs `ballast get ARGS` and returns its stdout (asserting success).
fn ballast_get(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ballast"))
        .arg("get")
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

const GRANT: &str = "apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: { name: allow-apps, namespace: backends }
spec:
  from: [{ group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: apps }]
  to: [{ group: ballast.dev, kind: Backend }]
";

/// Conformance `HTTPRouteReferenceGrant` / `HTTPRouteInvalidCrossNamespaceBackendRef`: a route's
/// backendRef into another namespace answers 500 with `ResolvedRefs=False RefNotPermitted` until
/// a ReferenceGrant there allows it; then traffic reaches the backend; removing the grant
/// closes the path again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_namespace_backend_ref_needs_reference_grant() {
    let up = Upstream::start("backends-web").await.unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let base = format!(
        "{}---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: cross, namespace: apps }}
spec:
  parentRefs: [{{ name: edge, namespace: infra }}]
  hostnames: [cross.example.com]
  rules:
  - backendRefs: [{{ group: ballast.dev, kind: Backend, name: web, namespace: backends }}]
---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: web, namespace: backends }}
spec:
  endpoints: [{{ address: {}, port: {} }}]
",
        infra_gateway(port),
        up.addr().ip(),
        up.addr().port()
    );
    std::fs::write(dir.path().join("base.yaml"), &base).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-grant",
        "infra/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    wait_until(T, POLL, || async {
        matches!(host_status(gw, "cross.example.com").await, Ok(500))
    })
    .await
    .unwrap();
    let route_status = || async {
        let (_, body) = ballast.get("/debug/sources").await.unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["status"]["httpRoutes"][0]["parents"][0]["conditions"][1].clone()
    };
    let c = route_status().await;
    assert_eq!(c["type"], "ResolvedRefs", "{c}");
    assert_eq!(c["status"], "False", "{c}");
    assert_eq!(c["reason"], "RefNotPermitted", "{c}");
    assert_eq!(up.hits(), 0, "no request may reach the ungranted backend");
    // `ballast get` shows the same, from the running server and from the files.
    let admin = ballast.admin.to_string();
    let from_server = ballast_get(&["routes", "--admin-addr", &admin]);
    assert!(
        from_server
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == [
                    "apps",
                    "cross",
                    "infra/edge",
                    "True",
                    "False",
                    "(RefNotPermitted)"
                ]),
        "{from_server}"
    );
    let from_files = ballast_get(&["routes", dir.path().to_str().unwrap()]);
    assert_eq!(from_files, from_server);
    let yaml = ballast_get(&["backends", "-o", "yaml", "--admin-addr", &admin]);
    assert!(yaml.contains("reason: NotReferenced"), "{yaml}");

    let grant = dir.path().join("grant.yaml");
    write_atomic(&grant, GRANT);
    wait_until(T, POLL, || async {
        matches!(host_get(gw, "cross.example.com").await, Ok((200, body)) if body == "backends-web")
    })
    .await
    .unwrap();
    assert_eq!(route_status().await["reason"], "ResolvedRefs");
    let table = ballast_get(&["routes", "--admin-addr", &admin]);
    assert!(
        table.contains("apps       cross  infra/edge  True      True"),
        "{table}"
    );

    // A grant for another namespace's routes does not count.
    write_atomic(
        &grant,
        &GRANT.replace("namespace: apps }", "namespace: other }"),
    );
    wait_until(T, POLL, || async {
        matches!(host_status(gw, "cross.example.com").await, Ok(500))
    })
    .await
    .unwrap();
    assert_eq!(route_status().await["reason"], "RefNotPermitted");
}

/// Standard `retry` (conformance `HTTPRouteRetry`-style): a Backend with one endpoint answering
/// 503 and one answering 200. With `retry: { codes: [503], attempts: 2 }` every request succeeds
/// (the 503 is retried on the other endpoint); the same route without retry lets 503s through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_retry_retries_listed_codes() {
    let bad = Upstream::start("bad").await.unwrap();
    bad.set_status(503);
    let good = Upstream::start("good").await.unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let rule = |name: &str, host: &str, retry: &str| {
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name} }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [{host}]
  rules:
  - name: main
    backendRefs: [{{ group: ballast.dev, kind: Backend, name: flaky }}]
{retry}"
        )
    };
    std::fs::write(
        dir.path().join("all.yaml"),
        gateway(port)
            + &rule(
                "retried",
                "retry.example.com",
                "    retry: { codes: [503], attempts: 2, backoff: 10ms }\n",
            )
            + &rule("plain", "plain.example.com", "")
            + &backend("flaky", &[bad.addr(), good.addr()]),
    )
    .unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-retry",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    wait_until(T, POLL, || async {
        matches!(host_get(gw, "retry.example.com").await, Ok((200, _)))
    })
    .await
    .unwrap();
    let before = bad.hits();
    let mut statuses = Vec::new();
    for _ in 0..20 {
        statuses.push(host_status(gw, "retry.example.com").await.unwrap());
    }
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert!(
        bad.hits() > before,
        "the failing endpoint was tried (and retried away from)"
    );
    // The named rule has its own Envoy stats (rule `name` → route stat prefix).
    let stats = envoy.stats().await.unwrap();
    let rule_stat = |suffix: &str| {
        stats
            .iter()
            .find(|(k, _)| k.ends_with(&format!(".route.default/retried/main.{suffix}")))
            .map(|(_, v)| *v)
    };
    assert!(
        rule_stat("upstream_rq_retry").is_some_and(|v| v > 0),
        "{:#?}",
        stats
            .keys()
            .filter(|k| k.contains(".route."))
            .collect::<Vec<_>>()
    );
    assert!(rule_stat("upstream_rq_completed").is_some_and(|v| v >= 20));
    let mut plain = Vec::new();
    for _ in 0..20 {
        plain.push(host_status(gw, "plain.example.com").await.unwrap());
    }
    assert!(
        plain.contains(&503),
        "without retry 503s reach the client: {plain:?}"
    );
}

/// Conformance `HTTPRouteRequestMirror`: every request answered by the primary backend also
/// reaches the mirror backend (whose answers are ignored); a rule mirroring `percent: 0` sends
/// it none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_mirror_copies_requests_to_another_backend() {
    let primary = Upstream::start("primary").await.unwrap();
    let shadow = Upstream::start("shadow").await.unwrap();
    shadow.set_status(500); // a mirror's answer never reaches the client
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let rule = |name: &str, host: &str, extra: &str| {
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name} }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [{host}]
  rules:
  - backendRefs: [{{ group: ballast.dev, kind: Backend, name: primary }}]
    filters:
    - type: RequestMirror
      requestMirror: {{ backendRef: {{ group: ballast.dev, kind: Backend, name: shadow }}{extra} }}
"
        )
    };
    std::fs::write(
        dir.path().join("all.yaml"),
        gateway(port)
            + &rule("mirrored", "mirror.example.com", "")
            + &rule("none", "none.example.com", ", percent: 0")
            + &backend("primary", &[primary.addr()])
            + &backend("shadow", &[shadow.addr()]),
    )
    .unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-mirror",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    wait_until(T, POLL, || async {
        matches!(host_get(gw, "none.example.com").await, Ok((200, _)))
    })
    .await
    .unwrap();
    for _ in 0..10 {
        assert_eq!(
            host_get(gw, "none.example.com").await.unwrap(),
            (200, "primary".to_owned())
        );
    }
    assert_eq!(shadow.hits(), 0, "percent: 0 mirrors nothing");
    // Both routes came in the same route configuration: mirror.example.com is served too, and
    // every request to it from here on is counted (so late mirror copies cannot skew counts).
    let (p0, s0) = (primary.hits(), shadow.hits());
    for _ in 0..10 {
        assert_eq!(
            host_get(gw, "mirror.example.com").await.unwrap(),
            (200, "primary".to_owned())
        );
    }
    assert_eq!(primary.hits() - p0, 10);
    // Mirrored requests are sent asynchronously: wait (bounded) until all 10 arrived.
    wait_until(T, POLL, || async { shadow.hits() - s0 >= 10 })
        .await
        .unwrap();
    assert_eq!(shadow.hits() - s0, 10);
}

/// Gateway API `backendRefs[].filters` (conformance `HTTPRouteBackendRequestHeaderModifier`
/// shape): two backends split 1:1, only backend A's ref has header modifiers, so only requests
/// to A carry (and lack) the headers and only A's responses get the response header. Backend B's
/// ref has an unsupported URLRewrite: ignored (B still served, Host unchanged) and reported as
/// `Accepted=False UnsupportedValue`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_ref_filters_apply_only_to_their_backend() {
    let a = Upstream::start("a").await.unwrap();
    let b = Upstream::start("b").await.unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("all.yaml"),
        gateway(port)
            + "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: { name: split }
spec:
  parentRefs: [{ name: edge }]
  hostnames: [split.example.com]
  rules:
  - backendRefs:
    - group: ballast.dev
      kind: Backend
      name: a
      filters:
      - type: RequestHeaderModifier
        requestHeaderModifier:
          set: [{ name: x-backend, value: a }]
          remove: [x-internal]
      - type: ResponseHeaderModifier
        responseHeaderModifier: { add: [{ name: x-via-a, value: yes }] }
    - group: ballast.dev
      kind: Backend
      name: b
      filters: [{ type: URLRewrite, urlRewrite: { hostname: rewritten.example } }]
" + &backend("a", &[a.addr()])
            + &backend("b", &[b.addr()]),
    )
    .unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-backend-filters",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    wait_until(T, POLL, || async {
        matches!(host_status(gw, "split.example.com").await, Ok(200))
    })
    .await
    .unwrap();
    let (a0, b0) = (a.hits(), b.hits());
    let (mut to_a, mut to_b, mut non_2xx) = (0u32, 0u32, 0u32);
    let sent = [("x-internal", "1"), ("x-backend", "client")];
    for _ in 0..40 {
        let (code, headers, body) = host_get_with_headers(gw, "split.example.com", &sent)
            .await
            .unwrap();
        if !(200..300).contains(&code) {
            non_2xx += 1;
            continue;
        }
        let via_a = headers.iter().any(|(k, v)| k == "x-via-a" && v == "yes");
        // Requests are sequential: the answering upstream's last request is this one.
        match body.as_str() {
            "a" => {
                to_a += 1;
                assert_eq!(a.last_header("x-backend").as_deref(), Some("a"));
                assert_eq!(a.last_header("x-internal"), None);
                assert!(via_a, "A's response lacks x-via-a: {headers:?}");
            }
            "b" => {
                to_b += 1;
                assert_eq!(b.last_header("x-backend").as_deref(), Some("client"));
                assert_eq!(b.last_header("x-internal").as_deref(), Some("1"));
                assert_eq!(b.last_host().as_deref(), Some("split.example.com"));
                assert!(!via_a, "B's response has x-via-a: {headers:?}");
            }
            other => panic!("unexpected body {other:?}"),
        }
    }
    assert_eq!(non_2xx, 0, "every request answered 2xx");
    assert_eq!(
        (a.hits() - a0, b.hits() - b0),
        (u64::from(to_a), u64::from(to_b))
    );
    assert!(
        to_a > 0 && to_b > 0,
        "both backends served: a={to_a} b={to_b}"
    );
    let status = ballast_get(&["routes", "-o", "yaml", dir.path().to_str().unwrap()]);
    assert!(
        status.contains("UnsupportedValue")
            && status.contains("rules[0].backendRefs[1].filters[0].type: filter URLRewrite"),
        "{status}"
    );
}

/// The value of response header `name` (lower-case), if present.
fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Conformance `HTTPRouteCORS`: Envoy answers a preflight from an allowed origin (exact or
/// `*` wildcard) itself with 200 and the configured `Access-Control-*` headers; a disallowed
/// origin gets no `Access-Control-Allow-Origin` and never reaches the backend; a normal GET
/// with an allowed Origin gets ACAO and the expose list; a route without the filter is
/// unchanged (its OPTIONS reach the backend, no CORS headers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_filter_answers_preflights_for_allowed_origins() {
    let up = Upstream::start("web").await.unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let cors_route = "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: { name: cors }
spec:
  parentRefs: [{ name: edge }]
  hostnames: [cors.example.com]
  rules:
  - backendRefs: [{ group: ballast.dev, kind: Backend, name: web }]
    filters:
    - type: CORS
      cors:
        allowOrigins: [\"https://app.example\", \"https://*.wild.example\"]
        allowMethods: [GET, PUT]
        allowHeaders: [x-client]
        exposeHeaders: [x-trace]
        maxAge: 600
        allowCredentials: true
";
    std::fs::write(
        dir.path().join("all.yaml"),
        gateway(port)
            + cors_route
            + &route("plain", "plain.example.com", "web")
            + &backend("web", &[up.addr()]),
    )
    .unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-cors",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    wait_until(T, POLL, || async {
        matches!(host_get(gw, "cors.example.com").await, Ok((200, _)))
            && matches!(host_get(gw, "plain.example.com").await, Ok((200, _)))
    })
    .await
    .unwrap();
    let preflight = |host: &'static str, origin: &'static str| async move {
        host_request(
            gw,
            "OPTIONS",
            host,
            &[
                &format!("Origin: {origin}"),
                "Access-Control-Request-Method: PUT",
                "Access-Control-Request-Headers: x-client",
            ],
        )
        .await
        .unwrap()
    };

    let hits = up.hits();
    for origin in ["https://app.example", "https://a.b.wild.example"] {
        let (status, h, _) = preflight("cors.example.com", origin).await;
        assert_eq!(status, 200, "{origin}: {h:?}");
        assert_eq!(
            header(&h, "access-control-allow-origin"),
            Some(origin),
            "{h:?}"
        );
        assert_eq!(header(&h, "access-control-allow-methods"), Some("GET,PUT"));
        assert_eq!(header(&h, "access-control-allow-headers"), Some("x-client"));
        assert_eq!(header(&h, "access-control-max-age"), Some("600"));
        assert_eq!(header(&h, "access-control-allow-credentials"), Some("true"));
    }
    // Not allowed: Envoy answers 200 without CORS headers (Gateway API allows 200/204/403).
    for origin in [
        "https://evil.example",
        "http://app.example",
        "https://wild.example",
    ] {
        let (status, h, _) = preflight("cors.example.com", origin).await;
        assert_eq!(status, 200, "{origin}: {h:?}");
        assert_eq!(
            header(&h, "access-control-allow-origin"),
            None,
            "{origin}: {h:?}"
        );
    }
    assert_eq!(
        up.hits(),
        hits,
        "preflights are answered by Envoy, not the backend"
    );

    // Actual requests: the allowed Origin is echoed with the expose list; others get nothing.
    let (status, h, body) = host_request(
        gw,
        "GET",
        "cors.example.com",
        &["Origin: https://app.example"],
    )
    .await
    .unwrap();
    assert_eq!((status, body.as_str()), (200, "web"), "{h:?}");
    assert_eq!(
        header(&h, "access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(header(&h, "access-control-expose-headers"), Some("x-trace"));
    assert_eq!(header(&h, "access-control-allow-credentials"), Some("true"));
    let (status, h, _) = host_request(
        gw,
        "GET",
        "cors.example.com",
        &["Origin: https://evil.example"],
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    assert_eq!(header(&h, "access-control-allow-origin"), None, "{h:?}");

    // Without the filter nothing changes: the preflight is an ordinary request to the backend.
    let hits = up.hits();
    let (status, h, body) = preflight("plain.example.com", "https://app.example").await;
    assert_eq!((status, body.as_str()), (200, "web"), "{h:?}");
    assert_eq!(up.hits(), hits + 1);
    assert!(
        h.iter().all(|(k, _)| !k.starts_with("access-control-")),
        "{h:?}"
    );
    let (status, h, _) = host_request(
        gw,
        "GET",
        "plain.example.com",
        &["Origin: https://app.example"],
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    assert!(
        h.iter().all(|(k, _)| !k.starts_with("access-control-")),
        "{h:?}"
    );
}

/// Splits a `Location` into (scheme, host, port, path); `port` is `None` when absent.
fn split_location(loc: &str) -> (String, String, Option<u16>, String) {
    let (scheme, rest) = loc.split_once("://").unwrap_or(("", loc));
    let (authority, path) = rest
        .find('/')
        .map_or((rest, "/"), |i| (&rest[..i], &rest[i..]));
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, Some(p.parse().unwrap())),
        None => (authority, None),
    };
    (scheme.into(), host.into(), port, path.into())
}

/// Conformance `HTTPRouteRedirectPortAndScheme` (the HTTP listener cases), `HTTPRouteRedirectPath`
/// and `HTTPRoute303Redirect` / `307` / `308`: each request gets the upstream suite's expected
/// status and `Location` from real Envoy, and no request reaches the backend. A well-known port
/// (80 for http, 443 for https) may be omitted; without scheme and port the listener's own port
/// must be kept (Envoy strips the port from `Host`, so Ballast sets it per listener port:
/// without that, every case below with the listener's port fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_redirects_set_scheme_host_port_path_and_status() {
    let up = Upstream::start("redirect-web").await.unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let redirect = |prefix: &str, spec: &str| {
        format!(
            "  - matches: [{{ path: {{ type: PathPrefix, value: {prefix} }} }}]
    filters: [{{ type: RequestRedirect, requestRedirect: {spec} }}]
"
        )
    };
    let rules = [
        redirect("/scheme-nil-and-port-nil", "{ hostname: example.org }"),
        redirect("/scheme-nil-and-port-80", "{ port: 80, hostname: example.org }"),
        redirect(
            "/scheme-nil-and-port-8080",
            "{ port: 8080, hostname: example.org }",
        ),
        redirect(
            "/scheme-https-and-port-nil",
            "{ scheme: https, hostname: example.org }",
        ),
        redirect(
            "/scheme-https-and-port-443",
            "{ scheme: https, port: 443, hostname: example.org }",
        ),
        redirect(
            "/scheme-https-and-port-8443",
            "{ scheme: https, port: 8443, hostname: example.org }",
        ),
        redirect(
            "/original-prefix",
            "{ path: { type: ReplacePrefixMatch, replacePrefixMatch: /replacement-prefix } }",
        ),
        redirect(
            "/full",
            "{ path: { type: ReplaceFullPath, replaceFullPath: /full-path-replacement } }",
        ),
        redirect(
            "/path-and-host",
            "{ hostname: example.org, path: { type: ReplacePrefixMatch, replacePrefixMatch: /replacement-prefix } }",
        ),
        redirect(
            "/path-and-status",
            "{ statusCode: 301, path: { type: ReplacePrefixMatch, replacePrefixMatch: /replacement-prefix } }",
        ),
        redirect("/303", "{ statusCode: 303 }"),
        redirect("/307", "{ statusCode: 307 }"),
        redirect("/308", "{ statusCode: 308 }"),
    ]
    .concat();
    let config = format!(
        "{}---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: redirects, namespace: infra }}
spec:
  parentRefs: [{{ name: edge }}]
  rules:
{rules}  - backendRefs: [{{ group: ballast.dev, kind: Backend, name: web }}]
---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: web, namespace: infra }}
spec:
  endpoints: [{{ address: {}, port: {} }}]
",
        infra_gateway(port),
        up.addr().ip(),
        up.addr().port()
    );
    std::fs::write(dir.path().join("redirects.yaml"), &config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-redirects",
        "infra/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    // The Host a client of the listener sends: the Gateway's address with its port.
    let host = format!("127.0.0.1:{port}");
    wait_until(T, POLL, || async {
        matches!(host_path_request(gw, "GET", &host, "/", &[]).await, Ok((200, _, b)) if b == "redirect-web")
    })
    .await
    .unwrap();
    let hits = up.hits();
    let http = |h: &str, p: Option<u16>, path: &str| ("http", h.to_owned(), p, path.to_owned());
    let https = |h: &str, p: Option<u16>, path: &str| ("https", h.to_owned(), p, path.to_owned());
    let own = "127.0.0.1";
    // (request path, status, scheme, host, port (None: absent or the scheme's well-known), path)
    let cases = [
        (
            "/scheme-nil-and-port-nil",
            302,
            http("example.org", Some(port), "/scheme-nil-and-port-nil"),
        ),
        (
            "/scheme-nil-and-port-80",
            302,
            http("example.org", None, "/scheme-nil-and-port-80"),
        ),
        (
            "/scheme-nil-and-port-8080",
            302,
            http("example.org", Some(8080), "/scheme-nil-and-port-8080"),
        ),
        (
            "/scheme-https-and-port-nil",
            302,
            https("example.org", None, "/scheme-https-and-port-nil"),
        ),
        (
            "/scheme-https-and-port-443",
            302,
            https("example.org", None, "/scheme-https-and-port-443"),
        ),
        (
            "/scheme-https-and-port-8443",
            302,
            https("example.org", Some(8443), "/scheme-https-and-port-8443"),
        ),
        (
            "/original-prefix/lemon",
            302,
            http(own, Some(port), "/replacement-prefix/lemon"),
        ),
        (
            "/full/path/original",
            302,
            http(own, Some(port), "/full-path-replacement"),
        ),
        (
            "/path-and-host",
            302,
            http("example.org", Some(port), "/replacement-prefix"),
        ),
        (
            "/path-and-status",
            301,
            http(own, Some(port), "/replacement-prefix"),
        ),
        ("/303", 303, http(own, Some(port), "/303")),
        ("/307", 307, http(own, Some(port), "/307")),
        ("/308", 308, http(own, Some(port), "/308")),
    ];
    let mut failures = Vec::new();
    for (path, status, (scheme, want_host, want_port, want_path)) in cases {
        let (code, headers, _) = host_path_request(gw, "GET", &host, path, &[])
            .await
            .unwrap();
        let loc = headers
            .iter()
            .find(|(k, _)| k == "location")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let (s, h, p, pa) = split_location(&loc);
        let well_known = match scheme {
            "http" => 80,
            _ => 443,
        };
        let port_ok = p == want_port || (want_port.is_none() && p == Some(well_known));
        if code != status || s != scheme || h != want_host || !port_ok || pa != want_path {
            failures.push(format!(
                "{path}: got {code} {loc:?}, want {status} {scheme}://{want_host}{}{want_path}",
                want_port.map(|p| format!(":{p}")).unwrap_or_default()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(up.hits(), hits, "a redirect must not reach the backend");
}

/// Conformance `HTTPRouteNoBackendRefs`, `HTTPRoutePartiallyInvalidViaInvalidReferenceGrant`,
/// `HTTPRouteTimeoutRequest` and `HTTPRouteTimeoutBackendRequest`, one route each on one
/// Gateway:
/// - a rule without `backendRefs` (omitted or `[]`) answers 500 while its sibling serves;
/// - a grant naming only `app-v1`: the rule to `app-v2` answers 500 (`RefNotPermitted`), the
///   rule to `app-v1` 200, and `app-v2`'s upstream receives nothing;
/// - `timeouts.request` / `backendRequest` of 500ms against a backend answering after 1.5s:
///   504; the same backend behind `0s` (timeout disabled) and the fast backend behind 500ms: 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn omitted_backends_partial_grants_and_timeouts() {
    let fast = Upstream::start("fast").await.unwrap();
    let slow = Upstream::start("slow").await.unwrap();
    slow.set_delay(std::time::Duration::from_millis(1500));
    let app_v1 = Upstream::start("app-v1").await.unwrap();
    let app_v2 = Upstream::start("app-v2").await.unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let backend = |name: &str, ns: &str, up: &Upstream| {
        format!(
            "---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: {name}, namespace: {ns} }}
spec:
  endpoints: [{{ address: {}, port: {} }}]
",
            up.addr().ip(),
            up.addr().port()
        )
    };
    let config = format!(
        "{gateway}---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: omitted, namespace: infra }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [omitted.example.com]
  rules:
  - matches: [{{ path: {{ type: PathPrefix, value: /omitted-no-forward }} }}]
  - matches: [{{ path: {{ type: PathPrefix, value: /empty-no-forward }} }}]
    backendRefs: []
  - backendRefs: [{{ group: ballast.dev, kind: Backend, name: fast }}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: partial, namespace: infra }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [partial.example.com]
  rules:
  - matches: [{{ path: {{ type: PathPrefix, value: /v2 }} }}]
    backendRefs: [{{ group: ballast.dev, kind: Backend, name: app-v2, namespace: app-backend }}]
  - backendRefs: [{{ group: ballast.dev, kind: Backend, name: app-v1, namespace: app-backend }}]
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {{ name: only-v1, namespace: app-backend }}
spec:
  from: [{{ group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: infra }}]
  to: [{{ group: ballast.dev, kind: Backend, name: app-v1 }}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: timeouts, namespace: infra }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [timeout.example.com]
  rules:
  - matches: [{{ path: {{ type: PathPrefix, value: /request-timeout }} }}]
    timeouts: {{ request: 500ms }}
    backendRefs: [{{ group: ballast.dev, kind: Backend, name: slow }}]
  - matches: [{{ path: {{ type: PathPrefix, value: /disable-request-timeout }} }}]
    timeouts: {{ request: 0s }}
    backendRefs: [{{ group: ballast.dev, kind: Backend, name: slow }}]
  - matches: [{{ path: {{ type: PathPrefix, value: /backend-timeout }} }}]
    timeouts: {{ backendRequest: 500ms }}
    backendRefs: [{{ group: ballast.dev, kind: Backend, name: slow }}]
  - matches: [{{ path: {{ type: PathPrefix, value: /disable-backend-timeout }} }}]
    timeouts: {{ backendRequest: 0s }}
    backendRefs: [{{ group: ballast.dev, kind: Backend, name: slow }}]
  - matches: [{{ path: {{ type: PathPrefix, value: /fast }} }}]
    timeouts: {{ request: 500ms, backendRequest: 500ms }}
    backendRefs: [{{ group: ballast.dev, kind: Backend, name: fast }}]
{}{}{}{}",
        backend("fast", "infra", &fast),
        backend("slow", "infra", &slow),
        backend("app-v1", "app-backend", &app_v1),
        backend("app-v2", "app-backend", &app_v2),
        gateway = infra_gateway(port),
    );
    std::fs::write(dir.path().join("routes.yaml"), &config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-partial",
        "infra/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    let get = |host: &'static str, path: &'static str| async move {
        host_path_request(gw, "GET", host, path, &[])
            .await
            .map(|(code, _, body)| (code, body))
    };
    wait_until(T, POLL, || async {
        matches!(get("omitted.example.com", "/").await, Ok((200, b)) if b == "fast")
    })
    .await
    .unwrap();
    let cases: [(&str, &str, u16, Option<&str>); 11] = [
        ("omitted.example.com", "/omitted-no-forward", 500, None),
        ("omitted.example.com", "/empty-no-forward", 500, None),
        ("omitted.example.com", "/", 200, Some("fast")),
        ("partial.example.com", "/v2", 500, None),
        ("partial.example.com", "/", 200, Some("app-v1")),
        ("timeout.example.com", "/request-timeout", 504, None),
        (
            "timeout.example.com",
            "/disable-request-timeout",
            200,
            Some("slow"),
        ),
        ("timeout.example.com", "/backend-timeout", 504, None),
        (
            "timeout.example.com",
            "/disable-backend-timeout",
            200,
            Some("slow"),
        ),
        ("timeout.example.com", "/fast", 200, Some("fast")),
        ("partial.example.com", "/v2/x", 500, None),
    ];
    let mut failures = Vec::new();
    for (host, path, status, body) in cases {
        let (code, got) = get(host, path).await.unwrap();
        if code != status || body.is_some_and(|b| b != got) {
            failures.push(format!(
                "{host}{path}: got {code} {got:?}, want {status} {body:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(app_v2.hits(), 0, "the ungranted backend must get nothing");
    // Status: the omitted route resolves its refs; the partial one is RefNotPermitted.
    let (_, body) = ballast.get("/debug/sources").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let resolved = |name: &str| {
        let r = v["status"]["httpRoutes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("no status for {name}: {body}"));
        r["parents"][0]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "ResolvedRefs")
            .cloned()
            .unwrap()
    };
    let c = resolved("omitted");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("True"), Some("ResolvedRefs")),
        "{c}"
    );
    let c = resolved("partial");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("RefNotPermitted")),
        "{c}"
    );
}

/// Conformance `HTTPRouteListenerPortMatching` and
/// `HTTPRouteInvalidParentRefSectionNameNotMatchingPort`: five listeners on three ports
/// (`foo.com` on each, `bar.com` on the second and third); routes choose them by parentRef
/// `port` (and `sectionName`). `foo.com` reaches v1, v2 and v3 on its three ports, `bar.com`
/// reaches v2 on the second port and gets 404 on the third (no route attached there). A
/// parentRef whose `sectionName` names a listener on another `port` is `Accepted=False
/// NoMatchingParent` and attaches nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parent_ref_port_selects_listeners() {
    let v1 = Upstream::start("v1").await.unwrap();
    let v2 = Upstream::start("v2").await.unwrap();
    let v3 = Upstream::start("v3").await.unwrap();
    let stray = Upstream::start("stray").await.unwrap();
    let ports = [
        ballast_testkit::free_port(),
        ballast_testkit::free_port(),
        ballast_testkit::free_port(),
    ];
    let [p1, p2, p3] = ports;
    let dir = tempfile::tempdir().unwrap();
    let route = |name: &str, parent: &str, backend: &str| {
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name}, namespace: infra }}
spec:
  parentRefs: [{parent}]
  rules: [{{ backendRefs: [{{ group: ballast.dev, kind: Backend, name: {backend} }}] }}]
"
        )
    };
    let backend = |name: &str, up: &Upstream| {
        format!(
            "---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: {name}, namespace: infra }}
spec:
  endpoints: [{{ address: {}, port: {} }}]
",
            up.addr().ip(),
            up.addr().port()
        )
    };
    let config = [
        format!(
            "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: ports, namespace: infra }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - {{ name: listener-1, port: {p1}, protocol: HTTP, hostname: foo.com }}
  - {{ name: listener-2, port: {p2}, protocol: HTTP, hostname: foo.com }}
  - {{ name: listener-3, port: {p2}, protocol: HTTP, hostname: bar.com }}
  - {{ name: listener-4, port: {p3}, protocol: HTTP, hostname: foo.com }}
  - {{ name: listener-5, port: {p3}, protocol: HTTP, hostname: bar.com }}
"
        ),
        route(
            "backend-v1",
            &format!("{{ name: ports, port: {p1} }}"),
            "v1",
        ),
        route(
            "backend-v2",
            &format!("{{ name: ports, port: {p2} }}"),
            "v2",
        ),
        route(
            "backend-v3",
            &format!("{{ name: ports, port: {p3}, sectionName: listener-4 }}"),
            "v3",
        ),
        route(
            "mismatch",
            &format!("{{ name: ports, port: {p2}, sectionName: listener-1 }}"),
            "stray",
        ),
        backend("v1", &v1),
        backend("v2", &v2),
        backend("v3", &v3),
        backend("stray", &stray),
    ]
    .concat();
    std::fs::write(dir.path().join("ports.yaml"), &config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-ports",
        "infra/ports",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    wait_until(T, POLL, || async {
        matches!(host_get(loopback(p3), &format!("foo.com:{p3}")).await, Ok((200, b)) if b == "v3")
    })
    .await
    .unwrap();
    let cases = [
        (p1, "foo.com", 200, "v1"),
        (p2, "foo.com", 200, "v2"),
        (p2, "bar.com", 200, "v2"),
        (p3, "foo.com", 200, "v3"),
        (p3, "bar.com", 404, ""),
    ];
    let mut failures = Vec::new();
    for _ in 0..3 {
        for (port, host, status, body) in cases {
            let got = host_get(loopback(port), &format!("{host}:{port}"))
                .await
                .unwrap();
            if got.0 != status || (status == 200 && got.1 != body) {
                failures.push(format!("{host}:{port}: got {got:?}, want {status} {body}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(stray.hits(), 0, "the unattached route must get no traffic");
    let (_, body) = ballast.get("/debug/sources").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let r = v["status"]["httpRoutes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "mismatch")
        .unwrap();
    let c = &r["parents"][0]["conditions"][0];
    assert_eq!(
        (
            c["type"].as_str(),
            c["status"].as_str(),
            c["reason"].as_str()
        ),
        (Some("Accepted"), Some("False"), Some("NoMatchingParent")),
        "{r}"
    );
    let attached: Vec<(String, u64)> = v["status"]["gateways"][0]["listeners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap().to_owned(),
                l["attachedRoutes"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<(String, u64)> = [1, 1, 1, 1, 0]
        .iter()
        .enumerate()
        .map(|(i, n)| (format!("listener-{}", i + 1), *n))
        .collect();
    assert_eq!(attached, want, "{body}");
}

/// Conformance `HTTPRouteMultipleGateways`: one route with parentRefs on two Gateways (each
/// served by its own Envoy) answers `/shared` from v1 through both, while each Gateway's
/// dedicated `/` route answers from its own backend (v2, v3) and only there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_shared_by_two_gateways_serves_through_both() {
    let ups = [
        Upstream::start("v1").await.unwrap(),
        Upstream::start("v2").await.unwrap(),
        Upstream::start("v3").await.unwrap(),
    ];
    let (pa, pb) = (ballast_testkit::free_port(), ballast_testkit::free_port());
    let dir = tempfile::tempdir().unwrap();
    let gateway = |name: &str, port: u16| {
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: {name}, namespace: infra }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners: [{{ name: http, port: {port}, protocol: HTTP }}]
"
        )
    };
    let route = |name: &str, parents: &str, prefix: &str, backend: &str| {
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name}, namespace: infra }}
spec:
  parentRefs: [{parents}]
  rules:
  - matches: [{{ path: {{ type: PathPrefix, value: {prefix} }} }}]
    backendRefs: [{{ group: ballast.dev, kind: Backend, name: {backend} }}]
"
        )
    };
    let mut config = [
        gateway("same-namespace", pa),
        gateway("all-namespaces", pb),
        route(
            "shared",
            "{ name: same-namespace }, { name: all-namespaces }",
            "/shared",
            "v1",
        ),
        route("dedicated-a", "{ name: same-namespace }", "/", "v2"),
        route("dedicated-b", "{ name: all-namespaces }", "/", "v3"),
    ]
    .concat();
    for up in &ups {
        config.push_str(&format!(
            "---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: {}, namespace: infra }}
spec:
  endpoints: [{{ address: {}, port: {} }}]
",
            up.name(),
            up.addr().ip(),
            up.addr().port()
        ));
    }
    std::fs::write(dir.path().join("gateways.yaml"), &config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _a = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-gw-a",
        "infra/same-namespace",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let _b = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-gw-b",
        "infra/all-namespaces",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let get = |port: u16, path: &'static str| async move {
        host_path_request(loopback(port), "GET", "example.com", path, &[])
            .await
            .map(|(code, _, body)| (code, body))
    };
    for port in [pa, pb] {
        wait_until(T, POLL, || async {
            matches!(get(port, "/shared").await, Ok((200, b)) if b == "v1")
        })
        .await
        .unwrap();
    }
    let cases = [
        (pa, "/shared", "v1"),
        (pa, "/", "v2"),
        (pb, "/shared", "v1"),
        (pb, "/", "v3"),
    ];
    let mut failures = Vec::new();
    for _ in 0..5 {
        for (port, path, want) in cases {
            let got = get(port, path).await.unwrap();
            if got != (200, want.to_owned()) {
                failures.push(format!("{port}{path}: got {got:?}, want 200 {want}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let (_, body) = ballast.get("/debug/sources").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let shared = v["status"]["httpRoutes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "shared")
        .unwrap();
    let parents = shared["parents"].as_array().unwrap();
    assert_eq!(parents.len(), 2, "{shared}");
    for p in parents {
        assert_eq!(p["conditions"][0]["status"], "True", "{shared}");
    }
}

/// Conformance `HTTPRouteMatchingAcrossRoutes`: two routes sharing `example.com` (the first
/// also on `example.net`), each with a path match and a header match; the most specific match
/// across both routes wins per request (the upstream suite's 8 requests, 3 rounds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matches_are_ordered_across_routes() {
    let v1 = Upstream::start("v1").await.unwrap();
    let v2 = Upstream::start("v2").await.unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let backend = |up: &Upstream| {
        format!(
            "---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: {}, namespace: infra }}
spec:
  endpoints: [{{ address: {}, port: {} }}]
",
            up.name(),
            up.addr().ip(),
            up.addr().port()
        )
    };
    let config = format!(
        "{}---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: matching-part1, namespace: infra }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [example.com, example.net]
  rules:
  - matches:
    - path: {{ type: PathPrefix, value: / }}
    - headers: [{{ name: version, value: one }}]
    backendRefs: [{{ group: ballast.dev, kind: Backend, name: v1 }}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: matching-part2, namespace: infra }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [example.com]
  rules:
  - matches:
    - path: {{ type: PathPrefix, value: /v2 }}
    - headers: [{{ name: version, value: two }}]
    backendRefs: [{{ group: ballast.dev, kind: Backend, name: v2 }}]
{}{}",
        infra_gateway(port),
        backend(&v1),
        backend(&v2)
    );
    std::fs::write(dir.path().join("matching.yaml"), &config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-matching",
        "infra/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    let get = |host: &'static str, path: &'static str, headers: &'static [&'static str]| async move {
        host_path_request(gw, "GET", host, path, headers)
            .await
            .map(|(code, _, body)| (code, body))
    };
    wait_until(T, POLL, || async {
        matches!(get("example.com", "/v2", &[]).await, Ok((200, b)) if b == "v2")
    })
    .await
    .unwrap();
    let cases: [(&str, &str, &[&str], &str); 8] = [
        ("example.com", "/", &[], "v1"),
        ("example.com", "/example", &[], "v1"),
        ("example.net", "/example", &[], "v1"),
        ("example.com", "/example", &["Version: one"], "v1"),
        ("example.com", "/v2", &[], "v2"),
        ("example.net", "/v2", &[], "v1"),
        ("example.com", "/v2/example", &[], "v2"),
        ("example.com", "/", &["Version: two"], "v2"),
    ];
    let mut failures = Vec::new();
    for _ in 0..3 {
        for (host, path, headers, want) in cases {
            let got = get(host, path, headers).await.unwrap();
            if got != (200, want.to_owned()) {
                failures.push(format!(
                    "{host}{path} {headers:?}: got {got:?}, want 200 {want}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Conformance `HTTPRouteExactPathMatching`, `HTTPRouteHeaderMatching` and
/// `HTTPRouteMethodMatching`: the upstream manifests (one hostname each here) and every
/// request of their tables, expected backend or 404, 2 rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_path_header_and_method_matches() {
    let ups = [
        Upstream::start("v1").await.unwrap(),
        Upstream::start("v2").await.unwrap(),
        Upstream::start("v3").await.unwrap(),
    ];
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let route = |name: &str, host: &str, rules: &[(&str, &str)]| {
        let rules: String = rules
            .iter()
            .map(|(matches, backend)| {
                format!(
                    "  - matches: {matches}\n    backendRefs: [{{ group: ballast.dev, kind: Backend, name: {backend} }}]\n"
                )
            })
            .collect();
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name}, namespace: infra }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [{host}]
  rules:
{rules}"
        )
    };
    let mut config = infra_gateway(port)
        + &route(
            "exact",
            "exact.example.com",
            &[
                ("[{ path: { type: Exact, value: /one } }]", "v1"),
                ("[{ path: { type: Exact, value: /two } }]", "v2"),
            ],
        )
        + &route(
            "headers",
            "headers.example.com",
            &[
                ("[{ headers: [{ name: version, value: one }] }]", "v1"),
                ("[{ headers: [{ name: version, value: two }] }]", "v2"),
                (
                    "[{ headers: [{ name: version, value: two }, { name: color, value: orange }] }]",
                    "v1",
                ),
                (
                    "[{ headers: [{ name: color, value: blue }] }, { headers: [{ name: color, value: green }] }]",
                    "v1",
                ),
                (
                    "[{ headers: [{ name: color, value: red }] }, { headers: [{ name: color, value: yellow }] }]",
                    "v2",
                ),
            ],
        )
        + &route(
            "methods",
            "method.example.com",
            &[
                ("[{ method: POST }]", "v1"),
                ("[{ method: GET }]", "v2"),
                (
                    "[{ path: { type: PathPrefix, value: /path1 }, method: GET }]",
                    "v1",
                ),
                (
                    "[{ headers: [{ name: version, value: one }], method: PUT }]",
                    "v2",
                ),
                (
                    "[{ path: { type: PathPrefix, value: /path2 }, headers: [{ name: version, value: two }], method: POST }]",
                    "v3",
                ),
                (
                    "[{ path: { type: PathPrefix, value: /path3 }, method: PATCH }, { path: { type: PathPrefix, value: /path4 }, headers: [{ name: version, value: three }], method: DELETE }]",
                    "v1",
                ),
                ("[{ path: { type: PathPrefix, value: /path5 } }]", "v1"),
                ("[{ method: PATCH }]", "v2"),
                ("[{ headers: [{ name: version, value: four }] }]", "v3"),
            ],
        );
    for up in &ups {
        config.push_str(&format!(
            "---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: {}, namespace: infra }}
spec:
  endpoints: [{{ address: {}, port: {} }}]
",
            up.name(),
            up.addr().ip(),
            up.addr().port()
        ));
    }
    std::fs::write(dir.path().join("matches.yaml"), &config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-matches",
        "infra/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    wait_until(T, POLL, || async {
        matches!(host_path_request(gw, "GET", "exact.example.com", "/one", &[]).await, Ok((200, _, b)) if b == "v1")
    })
    .await
    .unwrap();
    // (method, host, path, headers, backend or "" for 404)
    let cases: &[(&str, &str, &str, &[&str], &str)] = &[
        ("GET", "exact.example.com", "/one", &[], "v1"),
        ("GET", "exact.example.com", "/two", &[], "v2"),
        ("GET", "exact.example.com", "/", &[], ""),
        ("GET", "exact.example.com", "/one/example", &[], ""),
        ("GET", "exact.example.com", "/two/", &[], ""),
        ("GET", "exact.example.com", "/Two", &[], ""),
        ("GET", "headers.example.com", "/", &["Version: one"], "v1"),
        ("GET", "headers.example.com", "/", &["Version: two"], "v2"),
        (
            "GET",
            "headers.example.com",
            "/",
            &["Version: two", "Color: orange"],
            "v1",
        ),
        (
            "GET",
            "headers.example.com",
            "/",
            &["Version: two", "Color: blue"],
            "v2",
        ),
        ("GET", "headers.example.com", "/", &["Color: orange"], ""),
        (
            "GET",
            "headers.example.com",
            "/",
            &["Some-Other-Header: one"],
            "",
        ),
        ("GET", "headers.example.com", "/", &["Color: blue"], "v1"),
        ("GET", "headers.example.com", "/", &["Color: green"], "v1"),
        ("GET", "headers.example.com", "/", &["Color: red"], "v2"),
        ("GET", "headers.example.com", "/", &["Color: yellow"], "v2"),
        ("GET", "headers.example.com", "/", &["Color: purple"], ""),
        ("POST", "method.example.com", "/", &[], "v1"),
        ("GET", "method.example.com", "/", &[], "v2"),
        ("HEAD", "method.example.com", "/", &[], ""),
        ("GET", "method.example.com", "/path1", &[], "v1"),
        ("PUT", "method.example.com", "/", &["version: one"], "v2"),
        (
            "POST",
            "method.example.com",
            "/path2",
            &["version: two"],
            "v3",
        ),
        ("PATCH", "method.example.com", "/path3", &[], "v1"),
        (
            "DELETE",
            "method.example.com",
            "/path4",
            &["version: three"],
            "v1",
        ),
        ("PUT", "method.example.com", "/", &[], ""),
        ("DELETE", "method.example.com", "/path4", &[], ""),
        ("PATCH", "method.example.com", "/path5", &[], "v1"),
        ("PATCH", "method.example.com", "/", &["version: four"], "v2"),
    ];
    let mut failures = Vec::new();
    for _ in 0..2 {
        for (method, host, path, headers, want) in cases {
            let mut hs = headers.to_vec();
            if *method != "GET" && *method != "HEAD" {
                hs.push("Content-Length: 0");
            }
            let (code, _, body) = host_path_request(gw, method, host, path, &hs)
                .await
                .unwrap();
            let ok = if want.is_empty() {
                code == 404
            } else {
                code == 200 && body == *want
            };
            if !ok {
                failures.push(format!(
                    "{method} {host}{path} {headers:?}: got {code} {body:?}, want {want:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Conformance `HTTPRouteRewritePath` and `HTTPRouteRewriteHost`: the upstream manifests (the
/// path route on its own hostname here); for each request the backend receives the rewritten
/// path / Host, and with a RequestHeaderModifier beside the rewrite the modified headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_rewrites_reach_the_backend_rewritten() {
    let v1 = Upstream::start("v1").await.unwrap();
    let v2 = Upstream::start("v2").await.unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let headers = "{ type: RequestHeaderModifier, requestHeaderModifier: { set: [{ name: X-Header-Set, value: set-overwrites-values }], add: [{ name: X-Header-Add, value: header-val-1 }], remove: [X-Header-Remove] } }";
    let rewrite = |prefix: &str, rewrite: &str, backend: &str, extra: &str| {
        let matches = if prefix.is_empty() {
            String::new()
        } else {
            format!("  - matches: [{{ path: {{ type: PathPrefix, value: {prefix} }} }}]\n    ")
        };
        let lead = if prefix.is_empty() { "  - " } else { "" };
        format!(
            "{matches}{lead}filters: [{{ type: URLRewrite, urlRewrite: {rewrite} }}{extra}]\n    backendRefs: [{{ group: ballast.dev, kind: Backend, name: {backend} }}]\n"
        )
    };
    let with_headers = format!(", {headers}");
    let backend = |up: &Upstream| {
        format!(
            "---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: {}, namespace: infra }}
spec:
  endpoints: [{{ address: {}, port: {} }}]
",
            up.name(),
            up.addr().ip(),
            up.addr().port()
        )
    };
    let config = format!(
        "{}---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: rewrite-path, namespace: infra }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [path.example]
  rules:
{}{}{}{}{}---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: rewrite-host, namespace: infra }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [rewrite.example]
  rules:
{}{}{}{}{}",
        infra_gateway(port),
        rewrite(
            "/prefix/one",
            "{ path: { type: ReplacePrefixMatch, replacePrefixMatch: /one } }",
            "v1",
            ""
        ),
        rewrite(
            "/strip-prefix",
            "{ path: { type: ReplacePrefixMatch, replacePrefixMatch: / } }",
            "v1",
            ""
        ),
        rewrite(
            "/full/one",
            "{ path: { type: ReplaceFullPath, replaceFullPath: /one } }",
            "v1",
            ""
        ),
        rewrite(
            "/full/rewrite-path-and-modify-headers",
            "{ path: { type: ReplaceFullPath, replaceFullPath: /test } }",
            "v1",
            &with_headers
        ),
        rewrite(
            "/prefix/rewrite-path-and-modify-headers",
            "{ path: { type: ReplacePrefixMatch, replacePrefixMatch: /prefix } }",
            "v1",
            &with_headers
        ),
        rewrite("/one", "{ hostname: one.example.org }", "v1", ""),
        rewrite("", "{ hostname: example.org }", "v2", ""),
        rewrite(
            "/rewrite-host-and-modify-headers",
            "{ hostname: test.example.org }",
            "v2",
            &with_headers
        ),
        backend(&v1),
        backend(&v2),
    );
    std::fs::write(dir.path().join("rewrites.yaml"), &config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-rewrites",
        "infra/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    wait_until(T, POLL, || async {
        matches!(host_path_request(gw, "GET", "rewrite.example", "/two", &[]).await, Ok((200, _, b)) if b == "v2")
    })
    .await
    .unwrap();
    // (host, path, backend, path at the backend, Host at the backend, headers modified)
    let cases = [
        (
            "path.example",
            "/prefix/one/two",
            &v1,
            "/one/two",
            "path.example",
            false,
        ),
        (
            "path.example",
            "/strip-prefix/three",
            &v1,
            "/three",
            "path.example",
            false,
        ),
        (
            "path.example",
            "/strip-prefix",
            &v1,
            "/",
            "path.example",
            false,
        ),
        (
            "path.example",
            "/full/one/two",
            &v1,
            "/one",
            "path.example",
            false,
        ),
        (
            "path.example",
            "/full/rewrite-path-and-modify-headers/test",
            &v1,
            "/test",
            "path.example",
            true,
        ),
        (
            "path.example",
            "/prefix/rewrite-path-and-modify-headers/one",
            &v1,
            "/prefix/one",
            "path.example",
            true,
        ),
        (
            "rewrite.example",
            "/one",
            &v1,
            "/one",
            "one.example.org",
            false,
        ),
        ("rewrite.example", "/two", &v2, "/two", "example.org", false),
        (
            "rewrite.example",
            "/rewrite-host-and-modify-headers",
            &v2,
            "/rewrite-host-and-modify-headers",
            "test.example.org",
            true,
        ),
    ];
    let mut failures = Vec::new();
    for (host, path, up, want_path, want_host, modified) in cases {
        let sent = ["X-Header-Set: some-other-value", "X-Header-Remove: gone"];
        let (code, _, body) = host_path_request(gw, "GET", host, path, &sent)
            .await
            .unwrap();
        let got = (
            code,
            body,
            up.last_header(":path"),
            up.last_host(),
            up.last_header("x-header-set"),
            up.last_header("x-header-add"),
            up.last_header("x-header-remove"),
        );
        let want = if modified {
            (Some("set-overwrites-values"), Some("header-val-1"), None)
        } else {
            (Some("some-other-value"), None, Some("gone"))
        };
        let ok = got.0 == 200
            && got.1 == up.name()
            && got.2.as_deref() == Some(want_path)
            && got.3.as_deref() == Some(want_host)
            && (got.4.as_deref(), got.5.as_deref(), got.6.as_deref()) == want;
        if !ok {
            failures.push(format!(
                "{host}{path}: got {got:?}, want {} {want_path} {want_host} {want:?}",
                up.name()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Conformance `HTTPRouteMatching` and `HTTPRouteQueryParamMatching`: the upstream manifests
/// (one hostname each here) and every request of their tables: expected backend or 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_and_query_param_matches() {
    let ups = [
        Upstream::start("v1").await.unwrap(),
        Upstream::start("v2").await.unwrap(),
        Upstream::start("v3").await.unwrap(),
    ];
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let route = |name: &str, host: &str, rules: &[(&str, &str)]| {
        let rules: String = rules
            .iter()
            .map(|(matches, backend)| {
                format!(
                    "  - matches: {matches}\n    backendRefs: [{{ group: ballast.dev, kind: Backend, name: {backend} }}]\n"
                )
            })
            .collect();
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name}, namespace: infra }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [{host}]
  rules:
{rules}"
        )
    };
    let mut config = infra_gateway(port)
        + &route(
            "matching",
            "match.example.com",
            &[
                (
                    "[{ path: { type: PathPrefix, value: / } }, { headers: [{ name: version, value: one }] }]",
                    "v1",
                ),
                (
                    "[{ path: { type: PathPrefix, value: /v2 } }, { headers: [{ name: version, value: two }] }]",
                    "v2",
                ),
            ],
        )
        + &route(
            "query",
            "query.example.com",
            &[
                ("[{ queryParams: [{ name: animal, value: whale }] }]", "v1"),
                (
                    "[{ queryParams: [{ name: animal, value: dolphin }] }]",
                    "v2",
                ),
                (
                    "[{ queryParams: [{ name: animal, value: dolphin }, { name: color, value: blue }] }, { queryParams: [{ name: ANIMAL, value: Whale }] }]",
                    "v3",
                ),
                (
                    "[{ path: { type: PathPrefix, value: /path1 }, queryParams: [{ name: animal, value: whale }] }]",
                    "v1",
                ),
                (
                    "[{ headers: [{ name: version, value: one }], queryParams: [{ name: animal, value: whale }] }]",
                    "v2",
                ),
                (
                    "[{ path: { type: PathPrefix, value: /path2 }, headers: [{ name: version, value: two }], queryParams: [{ name: animal, value: whale }] }]",
                    "v3",
                ),
                (
                    "[{ path: { type: PathPrefix, value: /path3 }, queryParams: [{ name: animal, value: shark }] }, { path: { type: PathPrefix, value: /path4 }, headers: [{ name: version, value: three }], queryParams: [{ name: animal, value: kraken }] }]",
                    "v1",
                ),
                ("[{ path: { type: PathPrefix, value: /path5 } }]", "v1"),
                ("[{ queryParams: [{ name: animal, value: hydra }] }]", "v2"),
                ("[{ headers: [{ name: version, value: four }] }]", "v3"),
            ],
        );
    for up in &ups {
        config.push_str(&format!(
            "---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: {}, namespace: infra }}
spec:
  endpoints: [{{ address: {}, port: {} }}]
",
            up.name(),
            up.addr().ip(),
            up.addr().port()
        ));
    }
    std::fs::write(dir.path().join("matches.yaml"), &config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-query",
        "infra/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    wait_until(T, POLL, || async {
        matches!(host_path_request(gw, "GET", "match.example.com", "/", &[]).await, Ok((200, _, b)) if b == "v1")
    })
    .await
    .unwrap();
    // (host, path, headers, backend or "" for 404)
    let cases: &[(&str, &str, &[&str], &str)] = &[
        ("match.example.com", "/", &[], "v1"),
        ("match.example.com", "/example", &[], "v1"),
        ("match.example.com", "/", &["Version: one"], "v1"),
        ("match.example.com", "/v2", &[], "v2"),
        ("match.example.com", "/v2/example", &[], "v2"),
        ("match.example.com", "/", &["Version: two"], "v2"),
        ("match.example.com", "/v2/", &[], "v2"),
        ("match.example.com", "/v2example", &[], "v1"),
        ("match.example.com", "/foo/v2/example", &[], "v1"),
        ("query.example.com", "/?animal=whale", &[], "v1"),
        ("query.example.com", "/?animal=dolphin", &[], "v2"),
        (
            "query.example.com",
            "/?animal=dolphin&color=blue",
            &[],
            "v3",
        ),
        ("query.example.com", "/?ANIMAL=Whale", &[], "v3"),
        (
            "query.example.com",
            "/?animal=whale&otherparam=irrelevant",
            &[],
            "v1",
        ),
        (
            "query.example.com",
            "/?animal=dolphin&color=yellow",
            &[],
            "v2",
        ),
        ("query.example.com", "/?color=blue", &[], ""),
        ("query.example.com", "/?animal=dog", &[], ""),
        ("query.example.com", "/?animal=whaledolphin", &[], ""),
        ("query.example.com", "/", &[], ""),
        ("query.example.com", "/path1?animal=whale", &[], "v1"),
        (
            "query.example.com",
            "/?animal=whale",
            &["version: one"],
            "v2",
        ),
        (
            "query.example.com",
            "/path2?animal=whale",
            &["version: two"],
            "v3",
        ),
        ("query.example.com", "/path3?animal=shark", &[], "v1"),
        (
            "query.example.com",
            "/path4?animal=kraken",
            &["version: three"],
            "v1",
        ),
        ("query.example.com", "/?animal=shark", &[], ""),
        ("query.example.com", "/path4?animal=kraken", &[], ""),
    ];
    let mut failures = Vec::new();
    for (host, path, headers, want) in cases {
        let (code, _, body) = host_path_request(gw, "GET", host, path, headers)
            .await
            .unwrap();
        let ok = if want.is_empty() {
            code == 404
        } else {
            code == 200 && body == *want
        };
        if !ok {
            failures.push(format!(
                "{host}{path} {headers:?}: got {code} {body:?}, want {want:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Conformance `HTTPRouteResponseHeaderModifier` (its operations on our upstream, which answers
/// with `x-upstream: NAME`): `set` replaces a backend's header and adds new ones, `add`
/// appends a value beside the backend's, `remove` drops it; a rule without the filter passes
/// the backend's headers unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_header_modifier_sets_adds_and_removes() {
    let up = Upstream::start("v1").await.unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let rule = |prefix: &str, modifier: &str| {
        format!(
            "  - matches: [{{ path: {{ type: PathPrefix, value: {prefix} }} }}]
    filters: [{{ type: ResponseHeaderModifier, responseHeaderModifier: {modifier} }}]
    backendRefs: [{{ group: ballast.dev, kind: Backend, name: v1 }}]
"
        )
    };
    let config = format!(
        "{}---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: response-headers, namespace: infra }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [response.example]
  rules:
{}{}{}{}  - backendRefs: [{{ group: ballast.dev, kind: Backend, name: v1 }}]
---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: v1, namespace: infra }}
spec:
  endpoints: [{{ address: {}, port: {} }}]
",
        infra_gateway(port),
        rule(
            "/set",
            "{ set: [{ name: X-Upstream, value: replaced }, { name: X-Header-Set, value: set-value }] }",
        ),
        rule(
            "/add",
            "{ add: [{ name: X-Upstream, value: appended }, { name: X-Header-Add, value: add-value }] }",
        ),
        rule("/remove", "{ remove: [X-Upstream] }"),
        rule(
            "/multiple",
            "{ set: [{ name: X-Header-Set, value: set-value }], add: [{ name: X-Header-Add, value: add-value }], remove: [X-Upstream] }",
        ),
        up.addr().ip(),
        up.addr().port()
    );
    std::fs::write(dir.path().join("response.yaml"), &config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-response-headers",
        "infra/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    wait_until(T, POLL, || async {
        matches!(host_path_request(gw, "GET", "response.example", "/", &[]).await, Ok((200, _, b)) if b == "v1")
    })
    .await
    .unwrap();
    let values = |headers: &[(String, String)], name: &str| -> Vec<String> {
        headers
            .iter()
            .filter(|(k, _)| k == name)
            .flat_map(|(_, v)| v.split(',').map(|s| s.trim().to_owned()))
            .collect()
    };
    // (path, x-upstream values, x-header-set, x-header-add)
    type Case<'a> = (&'a str, &'a [&'a str], &'a [&'a str], &'a [&'a str]);
    let cases: [Case; 5] = [
        ("/", &["v1"], &[], &[]),
        ("/set", &["replaced"], &["set-value"], &[]),
        ("/add", &["v1", "appended"], &[], &["add-value"]),
        ("/remove", &[], &[], &[]),
        ("/multiple", &[], &["set-value"], &["add-value"]),
    ];
    let mut failures = Vec::new();
    for (path, upstream, set, add) in cases {
        let (code, headers, _) = host_path_request(gw, "GET", "response.example", path, &[])
            .await
            .unwrap();
        let got = (
            code,
            values(&headers, "x-upstream"),
            values(&headers, "x-header-set"),
            values(&headers, "x-header-add"),
        );
        let want = (
            200,
            upstream.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            set.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            add.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        );
        if got != want {
            failures.push(format!("{path}: got {got:?}, want {want:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Conformance `HTTPRouteListenerHostnameMatching`: four HTTP listeners on one port
/// (`bar.com`, `foo.bar.com`, `*.bar.com`, `*.foo.com`), one route per listener by
/// `sectionName` (v3 on both wildcards): each host reaches its most specific listener's route,
/// wildcards match several labels, hosts no listener names get 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_hostnames_pick_the_most_specific_listener() {
    let ups = [
        Upstream::start("v1").await.unwrap(),
        Upstream::start("v2").await.unwrap(),
        Upstream::start("v3").await.unwrap(),
    ];
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let route = |name: &str, parents: &str, backend: &str| {
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name}, namespace: infra }}
spec:
  parentRefs: [{parents}]
  rules: [{{ backendRefs: [{{ group: ballast.dev, kind: Backend, name: {backend} }}] }}]
"
        )
    };
    let mut config = format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: hosts, namespace: infra }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - {{ name: listener-1, port: {port}, protocol: HTTP, hostname: bar.com }}
  - {{ name: listener-2, port: {port}, protocol: HTTP, hostname: foo.bar.com }}
  - {{ name: listener-3, port: {port}, protocol: HTTP, hostname: \"*.bar.com\" }}
  - {{ name: listener-4, port: {port}, protocol: HTTP, hostname: \"*.foo.com\" }}
"
    ) + &route(
        "backend-v1",
        "{ name: hosts, sectionName: listener-1 }",
        "v1",
    ) + &route(
        "backend-v2",
        "{ name: hosts, sectionName: listener-2 }",
        "v2",
    ) + &route(
        "backend-v3",
        "{ name: hosts, sectionName: listener-3 }, { name: hosts, sectionName: listener-4 }",
        "v3",
    );
    for up in &ups {
        config.push_str(&format!(
            "---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: {}, namespace: infra }}
spec:
  endpoints: [{{ address: {}, port: {} }}]
",
            up.name(),
            up.addr().ip(),
            up.addr().port()
        ));
    }
    std::fs::write(dir.path().join("hosts.yaml"), &config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-hosts",
        "infra/hosts",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    wait_until(T, POLL, || async {
        matches!(host_get(gw, "bar.com").await, Ok((200, b)) if b == "v1")
    })
    .await
    .unwrap();
    let cases = [
        ("bar.com", "v1"),
        ("foo.bar.com", "v2"),
        ("baz.bar.com", "v3"),
        ("boo.bar.com", "v3"),
        ("multiple.prefixes.bar.com", "v3"),
        ("multiple.prefixes.foo.com", "v3"),
        ("foo.com", ""),
        ("no.matching.host", ""),
    ];
    let mut failures = Vec::new();
    for _ in 0..3 {
        for (host, want) in cases {
            let (code, body) = host_get(gw, host).await.unwrap();
            let ok = if want.is_empty() {
                code == 404
            } else {
                code == 200 && body == want
            };
            if !ok {
                failures.push(format!("{host}: got {code} {body:?}, want {want:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Conformance `GatewayHTTPListenerIsolation`: four HTTP listeners on one port (no hostname,
/// `*.example.com`, `*.foo.example.com`, `abc.foo.example.com`), one route per listener. A
/// request is served only by the routes of the most specific listener matching its host: of
/// the 16 host × path requests only the 4 on the diagonal reach the backend, the rest get 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_listeners_on_one_port_are_isolated() {
    let up = Upstream::start("v1").await.unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let listeners = [
        ("empty-hostname", None, "bar.com"),
        (
            "wildcard-example-com",
            Some("\"*.example.com\""),
            "bar.example.com",
        ),
        (
            "wildcard-foo-example-com",
            Some("\"*.foo.example.com\""),
            "bar.foo.example.com",
        ),
        (
            "abc-foo-example-com",
            Some("abc.foo.example.com"),
            "abc.foo.example.com",
        ),
    ];
    let mut config = String::from(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: { name: isolation, namespace: infra }
spec:
  gatewayClassName: ballast
  addresses: [{ type: IPAddress, value: 127.0.0.1 }]
  listeners:
",
    );
    for (name, hostname, _) in listeners {
        let hostname = hostname
            .map(|h| format!(", hostname: {h}"))
            .unwrap_or_default();
        config.push_str(&format!(
            "  - {{ name: {name}, port: {port}, protocol: HTTP{hostname} }}\n"
        ));
    }
    for (name, _, _) in listeners {
        config.push_str(&format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: attaches-to-{name}, namespace: infra }}
spec:
  parentRefs: [{{ name: isolation, sectionName: {name} }}]
  rules:
  - matches: [{{ path: {{ type: PathPrefix, value: /{name} }} }}]
    backendRefs: [{{ group: ballast.dev, kind: Backend, name: v1 }}]
"
        ));
    }
    config.push_str(&format!(
        "---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: v1, namespace: infra }}
spec:
  endpoints: [{{ address: {}, port: {} }}]
",
        up.addr().ip(),
        up.addr().port()
    ));
    std::fs::write(dir.path().join("isolation.yaml"), &config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-isolation",
        "infra/isolation",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    wait_until(T, POLL, || async {
        matches!(host_path_request(gw, "GET", "bar.com", "/empty-hostname", &[]).await, Ok((200, _, b)) if b == "v1")
    })
    .await
    .unwrap();
    let mut failures = Vec::new();
    for (i, (_, _, host)) in listeners.iter().enumerate() {
        for (j, (path, _, _)) in listeners.iter().enumerate() {
            let (code, _, body) = host_path_request(gw, "GET", host, &format!("/{path}"), &[])
                .await
                .unwrap();
            let ok = if i == j {
                code == 200 && body == "v1"
            } else {
                code == 404
            };
            if !ok {
                failures.push(format!("{host}/{path}: got {code} {body:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Conformance `HTTPRouteInvalidCrossNamespaceParentRef`: a route in another namespace than a
/// Gateway whose listener allows only its own namespace is `Accepted=False
/// NotAllowedByListeners` and serves nothing (404, its backend gets no request), while a
/// same-namespace route on the listener serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_namespace_parent_ref_is_not_allowed_by_a_same_namespace_listener() {
    let own = Upstream::start("own").await.unwrap();
    let foreign = Upstream::start("foreign").await.unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let part = |ns: &str, host: &str, up: &Upstream| {
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: route, namespace: {ns} }}
spec:
  parentRefs: [{{ name: same, namespace: infra }}]
  hostnames: [{host}]
  rules: [{{ backendRefs: [{{ group: ballast.dev, kind: Backend, name: web }}] }}]
---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: web, namespace: {ns} }}
spec:
  endpoints: [{{ address: {}, port: {} }}]
",
            up.addr().ip(),
            up.addr().port()
        )
    };
    let config = format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: same, namespace: infra }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - {{ name: http, port: {port}, protocol: HTTP, allowedRoutes: {{ namespaces: {{ from: Same }} }} }}
"
    ) + &part("infra", "own.example.com", &own)
        + &part("web-backend", "foreign.example.com", &foreign);
    std::fs::write(dir.path().join("parent.yaml"), &config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-same-ns",
        "infra/same",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    wait_until(T, POLL, || async {
        matches!(host_get(gw, "own.example.com").await, Ok((200, b)) if b == "own")
    })
    .await
    .unwrap();
    for _ in 0..10 {
        assert_eq!(host_status(gw, "foreign.example.com").await.unwrap(), 404);
    }
    assert_eq!(foreign.hits(), 0);
    let (_, body) = ballast.get("/debug/sources").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let r = v["status"]["httpRoutes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["namespace"] == "web-backend")
        .unwrap();
    let c = &r["parents"][0]["conditions"][0];
    assert_eq!(
        (
            c["type"].as_str(),
            c["status"].as_str(),
            c["reason"].as_str()
        ),
        (
            Some("Accepted"),
            Some("False"),
            Some("NotAllowedByListeners")
        ),
        "{r}"
    );
}

/// Conformance `HTTPRouteHostnameIntersection` (the cases of its first Gateway): listeners for
/// `very.specific.com`, `*.wildcard.io` and `*.anotherwildcard.io`; routes whose hostnames
/// intersect them specifically or by wildcard, plus a route intersecting none. Each of the
/// upstream suite's 27 requests gets its expected backend or 404 (`Host` with a port too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_hostnames_intersect_listener_hostnames() {
    let ups = [
        Upstream::start("v1").await.unwrap(),
        Upstream::start("v2").await.unwrap(),
        Upstream::start("v3").await.unwrap(),
    ];
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let route = |name: &str, hostnames: &str, prefix: &str, backend: &str| {
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name}, namespace: infra }}
spec:
  parentRefs: [{{ name: intersection }}]
  hostnames: [{hostnames}]
  rules:
  - matches: [{{ path: {{ type: PathPrefix, value: {prefix} }} }}]
    backendRefs: [{{ group: ballast.dev, kind: Backend, name: {backend} }}]
"
        )
    };
    let mut config = format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: intersection, namespace: infra }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - {{ name: listener-1, port: {port}, protocol: HTTP, hostname: very.specific.com }}
  - {{ name: listener-2, port: {port}, protocol: HTTP, hostname: \"*.wildcard.io\" }}
  - {{ name: listener-3, port: {port}, protocol: HTTP, hostname: \"*.anotherwildcard.io\" }}
"
    ) + &route(
        "specific-host-matches-listener-specific-host",
        "non.matching.com, \"*.nonmatchingwildcard.io\", very.specific.com",
        "/s1",
        "v1",
    ) + &route(
        "specific-host-matches-listener-wildcard-host",
        "non.matching.com, wildcard.io, foo.wildcard.io, bar.wildcard.io, foo.bar.wildcard.io",
        "/s2",
        "v2",
    ) + &route(
        "wildcard-host-matches-listener-specific-host",
        "non.matching.com, \"*.specific.com\"",
        "/s3",
        "v3",
    ) + &route(
        "wildcard-host-matches-listener-wildcard-host",
        "\"*.anotherwildcard.io\"",
        "/s4",
        "v1",
    ) + &route(
        "no-intersecting-hosts",
        "specific.but.wrong.com, wildcard.io",
        "/s5",
        "v2",
    );
    for up in &ups {
        config.push_str(&format!(
            "---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: {}, namespace: infra }}
spec:
  endpoints: [{{ address: {}, port: {} }}]
",
            up.name(),
            up.addr().ip(),
            up.addr().port()
        ));
    }
    std::fs::write(dir.path().join("intersection.yaml"), &config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-intersection",
        "infra/intersection",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    wait_until(T, POLL, || async {
        matches!(host_path_request(gw, "GET", "very.specific.com", "/s1", &[]).await, Ok((200, _, b)) if b == "v1")
    })
    .await
    .unwrap();
    let cases = [
        ("very.specific.com", "/s1", "v1"),
        ("very.specific.com:1234", "/s1", "v1"),
        ("non.matching.com", "/s1", ""),
        ("foo.nonmatchingwildcard.io", "/s1", ""),
        ("foo.wildcard.io", "/s1", ""),
        ("very.specific.com", "/non-matching-prefix", ""),
        ("foo.wildcard.io", "/s2", "v2"),
        ("bar.wildcard.io", "/s2", "v2"),
        ("foo.bar.wildcard.io", "/s2", "v2"),
        ("non.matching.com", "/s2", ""),
        ("wildcard.io", "/s2", ""),
        ("very.specific.com", "/s2", ""),
        ("foo.wildcard.io", "/non-matching-prefix", ""),
        ("very.specific.com", "/s3", "v3"),
        ("non.matching.com", "/s3", ""),
        ("foo.specific.com", "/s3", ""),
        ("foo.wildcard.io", "/s3", ""),
        ("very.specific.com", "/non-matching-prefix", ""),
        ("foo.anotherwildcard.io", "/s4", "v1"),
        ("bar.anotherwildcard.io", "/s4", "v1"),
        ("foo.bar.anotherwildcard.io", "/s4", "v1"),
        ("anotherwildcard.io", "/s4", ""),
        ("foo.wildcard.io", "/s4", ""),
        ("very.specific.com", "/s4", ""),
        ("foo.anotherwildcard.io", "/non-matching-prefix", ""),
        ("specific.but.wrong.com", "/s5", ""),
        ("wildcard.io", "/s5", ""),
    ];
    let mut failures = Vec::new();
    for (host, path, want) in cases {
        let (code, _, body) = host_path_request(gw, "GET", host, path, &[]).await.unwrap();
        let ok = if want.is_empty() {
            code == 404
        } else {
            code == 200 && body == want
        };
        if !ok {
            failures.push(format!("{host}{path}: got {code} {body:?}, want {want:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Conformance `HTTPRouteInvalidParentRefNotMatchingSectionName` and
/// `HTTPRouteInvalidParentRefNotMatchingListenerPort`: parentRefs naming a listener the Gateway
/// does not have, or a port none of its listeners uses, are `Accepted=False NoMatchingParent`;
/// the listener counts no attached route and their hosts get 404 while a valid route serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parent_refs_to_missing_sections_or_ports_attach_nowhere() {
    let good = Upstream::start("good").await.unwrap();
    let bad = Upstream::start("bad").await.unwrap();
    let port = ballast_testkit::free_port();
    let other_port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let route = |name: &str, parent: &str, backend: &str| {
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name}, namespace: infra }}
spec:
  parentRefs: [{parent}]
  hostnames: [{name}.example.com]
  rules: [{{ backendRefs: [{{ group: ballast.dev, kind: Backend, name: {backend} }}] }}]
"
        )
    };
    let backend = |up: &Upstream| {
        format!(
            "---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: {}, namespace: infra }}
spec:
  endpoints: [{{ address: {}, port: {} }}]
",
            up.name(),
            up.addr().ip(),
            up.addr().port()
        )
    };
    let config = infra_gateway(port)
        + &route("valid", "{ name: edge, sectionName: http }", "good")
        + &route("section", "{ name: edge, sectionName: nonexistent }", "bad")
        + &route(
            "port",
            &format!("{{ name: edge, port: {other_port} }}"),
            "bad",
        )
        + &backend(&good)
        + &backend(&bad);
    std::fs::write(dir.path().join("parents.yaml"), &config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-parents",
        "infra/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    wait_until(T, POLL, || async {
        matches!(host_get(gw, "valid.example.com").await, Ok((200, b)) if b == "good")
    })
    .await
    .unwrap();
    for _ in 0..5 {
        assert_eq!(host_status(gw, "section.example.com").await.unwrap(), 404);
        assert_eq!(host_status(gw, "port.example.com").await.unwrap(), 404);
    }
    assert_eq!(bad.hits(), 0);
    let (_, body) = ballast.get("/debug/sources").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    for name in ["section", "port"] {
        let r = v["status"]["httpRoutes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap();
        let c = &r["parents"][0]["conditions"][0];
        assert_eq!(
            (
                c["type"].as_str(),
                c["status"].as_str(),
                c["reason"].as_str()
            ),
            (Some("Accepted"), Some("False"), Some("NoMatchingParent")),
            "{r}"
        );
    }
    assert_eq!(
        v["status"]["gateways"][0]["listeners"][0]["attachedRoutes"], 1,
        "{body}"
    );
}

/// Conformance `HTTPRouteInvalidNonExistentBackendRef` and
/// `HTTPRouteInvalidBackendRefUnknownKind`: a backendRef to a Backend that does not exist is
/// `ResolvedRefs=False BackendNotFound`, one to an unknown kind `InvalidKind`; both routes stay
/// `Accepted` and answer 500 (every request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unresolvable_backend_refs_answer_500() {
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let route = |name: &str, backend_ref: &str| {
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name}, namespace: infra }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [{name}.example.com]
  rules: [{{ backendRefs: [{backend_ref}] }}]
"
        )
    };
    let config = infra_gateway(port)
        + &route(
            "nonexistent",
            "{ group: ballast.dev, kind: Backend, name: does-not-exist }",
        )
        + &route(
            "unknown-kind",
            "{ group: unknownkind.example.com, kind: NonExistent, name: web }",
        );
    std::fs::write(dir.path().join("refs.yaml"), &config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-refs",
        "infra/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    wait_until(T, POLL, || async {
        matches!(host_status(gw, "nonexistent.example.com").await, Ok(500))
    })
    .await
    .unwrap();
    for _ in 0..5 {
        for host in ["nonexistent.example.com", "unknown-kind.example.com"] {
            assert_eq!(host_status(gw, host).await.unwrap(), 500, "{host}");
        }
    }
    let (_, body) = ballast.get("/debug/sources").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    for (name, reason) in [
        ("nonexistent", "BackendNotFound"),
        ("unknown-kind", "InvalidKind"),
    ] {
        let r = v["status"]["httpRoutes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap();
        let conds = &r["parents"][0]["conditions"];
        assert_eq!(conds[0]["status"], "True", "{r}");
        let c = &conds[1];
        assert_eq!(
            (
                c["type"].as_str(),
                c["status"].as_str(),
                c["reason"].as_str()
            ),
            (Some("ResolvedRefs"), Some("False"), Some(reason)),
            "{r}"
        );
    }
}

/// Conformance `HTTPRouteInvalidReferenceGrant`: a cross-namespace backendRef with only
/// ReferenceGrants that do not cover it (in the wrong namespace; wrong `from` group, kind or
/// namespace; wrong `to` group, kind or name) is `ResolvedRefs=False RefNotPermitted`, answers
/// 500 and never reaches the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_grants_that_do_not_cover_the_ref_permit_nothing() {
    let up = Upstream::start("web").await.unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let grant = |name: &str, ns: &str, from: &str, to: &str| {
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {{ name: {name}, namespace: {ns} }}
spec:
  from: [{from}]
  to: [{to}]
"
        )
    };
    let from_ok = "{ group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: infra }";
    let to_ok = "{ group: ballast.dev, kind: Backend, name: web }";
    let config = infra_gateway(port)
        + &format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: invalid-grant, namespace: infra }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [grant.example.com]
  rules: [{{ backendRefs: [{{ group: ballast.dev, kind: Backend, name: web, namespace: web-backend }}] }}]
---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: web, namespace: web-backend }}
spec:
  endpoints: [{{ address: {}, port: {} }}]
",
            up.addr().ip(),
            up.addr().port()
        )
        + &grant("wrong-namespace", "infra", from_ok, to_ok)
        + &grant(
            "wrong-from-group",
            "web-backend",
            "{ group: not-the-group.example.com, kind: HTTPRoute, namespace: infra }",
            to_ok,
        )
        + &grant(
            "wrong-from-kind",
            "web-backend",
            "{ group: gateway.networking.k8s.io, kind: Gateway, namespace: infra }",
            to_ok,
        )
        + &grant(
            "wrong-from-namespace",
            "web-backend",
            "{ group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: not-infra }",
            to_ok,
        )
        + &grant(
            "wrong-to-group",
            "web-backend",
            from_ok,
            "{ group: not-the-group.example.com, kind: Backend, name: web }",
        )
        + &grant(
            "wrong-to-kind",
            "web-backend",
            from_ok,
            "{ group: ballast.dev, kind: Service, name: web }",
        )
        + &grant(
            "wrong-to-name",
            "web-backend",
            from_ok,
            "{ group: ballast.dev, kind: Backend, name: not-web }",
        );
    std::fs::write(dir.path().join("grants.yaml"), &config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-invalid-grant",
        "infra/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    wait_until(T, POLL, || async {
        matches!(host_status(gw, "grant.example.com").await, Ok(500))
    })
    .await
    .unwrap();
    for _ in 0..10 {
        assert_eq!(host_status(gw, "grant.example.com").await.unwrap(), 500);
    }
    assert_eq!(
        up.hits(),
        0,
        "no grant covers the ref: nothing may reach the backend"
    );
    let (_, body) = ballast.get("/debug/sources").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let c = &v["status"]["httpRoutes"][0]["parents"][0]["conditions"][1];
    assert_eq!(
        (
            c["type"].as_str(),
            c["status"].as_str(),
            c["reason"].as_str()
        ),
        (Some("ResolvedRefs"), Some("False"), Some("RefNotPermitted")),
        "{body}"
    );
}
