//! Gateway API conformance cases ported to files and real Envoy (see docs/gateway-api.md):
//! the upstream suite's manifests adapted to Ballast's kinds, the same request → expected
//! backend/response assertions.
//!
//! A case is a manifest, the Envoy serving it and a table of requests with the answer each must
//! get; the steps every case shares (serve, start Envoy, wait for the config, send the table,
//! read route status) are the helpers below, so that a case shows only what it checks.

mod common;

use std::net::SocketAddr;

use ballast_testkit::{Envoy, Upstream, wait_until};
use common::*;
use serde_json::Value;

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

/// A Gateway `infra/{name}` on 127.0.0.1 with `listeners` (the YAML list items under
/// `listeners:`).
fn infra_gateway_with(name: &str, listeners: &str) -> String {
    format!(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: {name}, namespace: infra }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
{listeners}"
    )
}

/// The parentRef of most routes here: [`infra_gateway`].
const EDGE: &str = "{ name: edge }";

/// An HTTPRoute `{ns}/{name}` (no namespace field when `ns` is empty: `default`) on `parents`
/// (parentRef items), for `hostnames` (items; none when empty), with `rules` (the YAML list
/// items under `rules:`, see [`rule`]).
fn http_route(ns: &str, name: &str, parents: &str, hostnames: &str, rules: &str) -> String {
    let ns = if ns.is_empty() {
        String::new()
    } else {
        format!(", namespace: {ns}")
    };
    let hostnames = if hostnames.is_empty() {
        String::new()
    } else {
        format!("  hostnames: [{hostnames}]\n")
    };
    format!(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name}{ns} }}
spec:
  parentRefs: [{parents}]
{hostnames}  rules:
{rules}"
    )
}

/// [`http_route`] in `infra`, where most cases here put their routes.
fn infra_route(name: &str, parents: &str, hostnames: &str, rules: &str) -> String {
    http_route("infra", name, parents, hostnames, rules)
}

/// A rule sending requests that meet `matches` (a YAML flow list; every request when empty) to
/// the Backend `backend`.
fn rule(matches: &str, backend: &str) -> String {
    let matches = if matches.is_empty() {
        String::new()
    } else {
        format!("matches: {matches}\n    ")
    };
    format!(
        "  - {matches}backendRefs: [{{ group: ballast.dev, kind: Backend, name: {backend} }}]\n"
    )
}

/// [`rule`] for each `(matches, backend)`.
fn rules(rules: &[(&str, &str)]) -> String {
    rules.iter().map(|(m, b)| rule(m, b)).collect()
}

/// A `matches` list of one PathPrefix match.
fn prefix(path: &str) -> String {
    format!("[{{ path: {{ type: PathPrefix, value: {path} }} }}]")
}

/// A Backend `{ns}/{name}` whose one endpoint is `up`.
fn backend_in(ns: &str, name: &str, up: &Upstream) -> String {
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
}

/// A Backend in `infra` named like `up` (whose answers are its name): the one a table's
/// `Backend(name)` expects.
fn infra_backend(up: &Upstream) -> String {
    backend_in("infra", up.name(), up)
}

/// Upstreams v1, v2 and v3 (to keep alive) and their Backends in `infra`: what most of the
/// upstream suite's manifests route to.
async fn v1_v2_v3() -> (Vec<Upstream>, String) {
    let mut ups = Vec::new();
    for name in ["v1", "v2", "v3"] {
        ups.push(Upstream::start(name).await.unwrap());
    }
    let backends = ups.iter().map(infra_backend).collect();
    (ups, backends)
}

/// A config directory served by `ballast serve`, with a real Envoy for one Gateway (fields drop
/// in order: Envoy, then Ballast, then the directory).
struct Served {
    envoy: Envoy,
    ballast: Ballast,
    dir: tempfile::TempDir,
}

impl Served {
    /// Writes `config` into a fresh directory, serves it once ready and starts Envoy `node` for
    /// `gateway` (`namespace/name`) over ADS.
    async fn start(config: &str, node: &str, gateway: &str) -> Served {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.yaml"), config).unwrap();
        let ballast = Ballast::serve_ready(dir.path()).await;
        let envoy = ads_envoy(&ballast, node, gateway).await;
        Served {
            envoy,
            ballast,
            dir,
        }
    }

    /// `/debug/sources` (config and status) as JSON.
    async fn sources(&self) -> Value {
        let (_, body) = self.ballast.get("/debug/sources").await.unwrap();
        serde_json::from_str(&body).unwrap()
    }
}

/// The status of HTTPRoute `name` in `/debug/sources` JSON.
fn route_named<'a>(sources: &'a Value, name: &str) -> &'a Value {
    sources["status"]["httpRoutes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no status for {name}: {sources}"))
}

/// A status condition as `(type, status, reason)`; a missing field is "" (never expected).
fn condition(c: &Value) -> (&str, &str, &str) {
    fn field<'a>(c: &'a Value, key: &str) -> &'a str {
        c[key].as_str().unwrap_or("")
    }
    (field(c, "type"), field(c, "status"), field(c, "reason"))
}

/// What a request must get: 200 with a backend's body (our upstreams answer with their name),
/// or only a status.
#[derive(Clone, Copy, Debug)]
enum Want {
    Backend(&'static str),
    Status(u16),
}
use Want::{Backend, Status};

impl Want {
    fn met_by(self, code: u16, body: &str) -> bool {
        match self {
            Backend(name) => code == 200 && body == name,
            Status(status) => code == status,
        }
    }
}

/// One request of a conformance table and the answer it must get.
struct Req {
    /// `None`: the address [`check`] is given.
    addr: Option<SocketAddr>,
    method: &'static str,
    host: String,
    path: String,
    headers: Vec<&'static str>,
    want: Want,
}

/// `method path` with `Host: host`.
fn req(method: &'static str, host: impl Into<String>, path: impl Into<String>, want: Want) -> Req {
    Req {
        addr: None,
        method,
        host: host.into(),
        path: path.into(),
        headers: Vec::new(),
        want,
    }
}

/// `GET path` with `Host: host`.
fn get(host: impl Into<String>, path: impl Into<String>, want: Want) -> Req {
    req("GET", host, path, want)
}

impl Req {
    /// With these header lines (`Name: value`).
    fn headers(mut self, headers: &[&'static str]) -> Req {
        self.headers.extend_from_slice(headers);
        self
    }

    /// Sent to `addr` instead of the table's address.
    fn via(mut self, addr: SocketAddr) -> Req {
        self.addr = Some(addr);
        self
    }
}

/// Sends the whole `table` `rounds` times (each request on a fresh connection, to `gw` unless it
/// names its own address) and fails listing every answer that missed its want, not only the
/// first.
async fn check(gw: SocketAddr, rounds: usize, table: &[Req]) {
    let mut failures = Vec::new();
    for _ in 0..rounds {
        for r in table {
            let addr = r.addr.unwrap_or(gw);
            let mut headers = r.headers.clone();
            // A method that may carry a body says it has none (else Envoy waits for one).
            if r.method != "GET" && r.method != "HEAD" {
                headers.push("Content-Length: 0");
            }
            let (code, _, body) = host_path_request(addr, r.method, &r.host, &r.path, &headers)
                .await
                .unwrap();
            if !r.want.met_by(code, &body) {
                failures.push(format!(
                    "{addr} {} {}{} {:?}: got {code} {body:?}, want {:?}",
                    r.method, r.host, r.path, r.headers, r.want
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Waits (bounded) until `GET path` with `Host: host` through `addr` gets `want`: the config
/// under test has reached Envoy.
async fn wait_answer(addr: SocketAddr, host: &str, path: &str, want: Want) {
    wait_until(T, POLL, || async {
        matches!(host_path_request(addr, "GET", host, path, &[]).await,
            Ok((code, _, body)) if want.met_by(code, &body))
    })
    .await
    .unwrap_or_else(|e| panic!("{host}{path} never got {want:?}: {e:#}"));
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
    let config = infra_gateway(port)
        + &http_route(
            "apps",
            "cross",
            "{ name: edge, namespace: infra }",
            "cross.example.com",
            "  - backendRefs: [{ group: ballast.dev, kind: Backend, name: web, namespace: backends }]\n",
        )
        + &backend_in("backends", "web", &up);
    let served = Served::start(&config, "envoy-grant", "infra/edge").await;
    let gw = loopback(port);
    wait_answer(gw, "cross.example.com", "/", Status(500)).await;
    let route_status = || async {
        served.sources().await["status"]["httpRoutes"][0]["parents"][0]["conditions"][1].clone()
    };
    let c = route_status().await;
    assert_eq!(
        condition(&c),
        ("ResolvedRefs", "False", "RefNotPermitted"),
        "{c}"
    );
    assert_eq!(up.hits(), 0, "no request may reach the ungranted backend");
    // `ballast get` shows the same, from the running server and from the files.
    let admin = served.ballast.admin.to_string();
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
    let from_files = ballast_get(&["routes", served.dir.path().to_str().unwrap()]);
    assert_eq!(from_files, from_server);
    let yaml = ballast_get(&["backends", "-o", "yaml", "--admin-addr", &admin]);
    assert!(yaml.contains("reason: NotReferenced"), "{yaml}");

    let grant = served.dir.path().join("grant.yaml");
    write_atomic(&grant, GRANT);
    wait_answer(gw, "cross.example.com", "/", Backend("backends-web")).await;
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
    wait_answer(gw, "cross.example.com", "/", Status(500)).await;
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
    let rule = |name: &str, host: &str, retry: &str| {
        http_route(
            "",
            name,
            EDGE,
            host,
            &format!(
                "  - name: main\n    backendRefs: [{{ group: ballast.dev, kind: Backend, name: flaky }}]\n{retry}"
            ),
        )
    };
    let config = gateway(port)
        + &rule(
            "retried",
            "retry.example.com",
            "    retry: { codes: [503], attempts: 2, backoff: 10ms }\n",
        )
        + &rule("plain", "plain.example.com", "")
        + &backend("flaky", &[bad.addr(), good.addr()]);
    let served = Served::start(&config, "envoy-retry", "default/edge").await;
    let gw = loopback(port);
    wait_answer(gw, "retry.example.com", "/", Status(200)).await;
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
    let stats = served.envoy.stats().await.unwrap();
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
    let rule = |name: &str, host: &str, extra: &str| {
        http_route(
            "",
            name,
            EDGE,
            host,
            &format!(
                "  - backendRefs: [{{ group: ballast.dev, kind: Backend, name: primary }}]
    filters:
    - type: RequestMirror
      requestMirror: {{ backendRef: {{ group: ballast.dev, kind: Backend, name: shadow }}{extra} }}
"
            ),
        )
    };
    let config = gateway(port)
        + &rule("mirrored", "mirror.example.com", "")
        + &rule("none", "none.example.com", ", percent: 0")
        + &backend("primary", &[primary.addr()])
        + &backend("shadow", &[shadow.addr()]);
    let _served = Served::start(&config, "envoy-mirror", "default/edge").await;
    let gw = loopback(port);
    wait_answer(gw, "none.example.com", "/", Status(200)).await;
    check(gw, 10, &[get("none.example.com", "/", Backend("primary"))]).await;
    assert_eq!(shadow.hits(), 0, "percent: 0 mirrors nothing");
    // Both routes came in the same route configuration: mirror.example.com is served too, and
    // every request to it from here on is counted (so late mirror copies cannot skew counts).
    let (p0, s0) = (primary.hits(), shadow.hits());
    check(
        gw,
        10,
        &[get("mirror.example.com", "/", Backend("primary"))],
    )
    .await;
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
    let config = gateway(port)
        + &http_route(
            "",
            "split",
            EDGE,
            "split.example.com",
            "  - backendRefs:
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
",
        )
        + &backend("a", &[a.addr()])
        + &backend("b", &[b.addr()]);
    let served = Served::start(&config, "envoy-backend-filters", "default/edge").await;
    let gw = loopback(port);
    wait_answer(gw, "split.example.com", "/", Status(200)).await;
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
    let status = ballast_get(&["routes", "-o", "yaml", served.dir.path().to_str().unwrap()]);
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
    let cors_route = http_route(
        "",
        "cors",
        EDGE,
        "cors.example.com",
        "  - backendRefs: [{ group: ballast.dev, kind: Backend, name: web }]
    filters:
    - type: CORS
      cors:
        allowOrigins: [\"https://app.example\", \"https://*.wild.example\"]
        allowMethods: [GET, PUT]
        allowHeaders: [x-client]
        exposeHeaders: [x-trace]
        maxAge: 600
        allowCredentials: true
",
    );
    let config = gateway(port)
        + &cors_route
        + &route("plain", "plain.example.com", "web")
        + &backend("web", &[up.addr()]);
    let _served = Served::start(&config, "envoy-cors", "default/edge").await;
    let gw = loopback(port);
    wait_answer(gw, "cors.example.com", "/", Status(200)).await;
    wait_answer(gw, "plain.example.com", "/", Status(200)).await;
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
    let redirect = |prefix: &str, spec: &str| {
        format!(
            "  - matches: [{{ path: {{ type: PathPrefix, value: {prefix} }} }}]
    filters: [{{ type: RequestRedirect, requestRedirect: {spec} }}]
"
        )
    };
    let redirects = [
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
    let config = infra_gateway(port)
        + &infra_route("redirects", EDGE, "", &(redirects + &rule("", "web")))
        + &backend_in("infra", "web", &up);
    let _served = Served::start(&config, "envoy-redirects", "infra/edge").await;
    let gw = loopback(port);
    // The Host a client of the listener sends: the Gateway's address with its port.
    let host = format!("127.0.0.1:{port}");
    wait_answer(gw, &host, "/", Backend("redirect-web")).await;
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
    let timeout_rule = |path: &str, timeouts: &str, backend: &str| {
        format!(
            "  - matches: {}\n    timeouts: {timeouts}\n    backendRefs: [{{ group: ballast.dev, kind: Backend, name: {backend} }}]\n",
            prefix(path)
        )
    };
    let config = infra_gateway(port)
        + &infra_route(
            "omitted",
            EDGE,
            "omitted.example.com",
            "  - matches: [{ path: { type: PathPrefix, value: /omitted-no-forward } }]
  - matches: [{ path: { type: PathPrefix, value: /empty-no-forward } }]
    backendRefs: []
  - backendRefs: [{ group: ballast.dev, kind: Backend, name: fast }]
",
        )
        + &infra_route(
            "partial",
            EDGE,
            "partial.example.com",
            "  - matches: [{ path: { type: PathPrefix, value: /v2 } }]
    backendRefs: [{ group: ballast.dev, kind: Backend, name: app-v2, namespace: app-backend }]
  - backendRefs: [{ group: ballast.dev, kind: Backend, name: app-v1, namespace: app-backend }]
",
        )
        + "---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: { name: only-v1, namespace: app-backend }
spec:
  from: [{ group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: infra }]
  to: [{ group: ballast.dev, kind: Backend, name: app-v1 }]
" + &infra_route(
        "timeouts",
        EDGE,
        "timeout.example.com",
        &[
            timeout_rule("/request-timeout", "{ request: 500ms }", "slow"),
            timeout_rule("/disable-request-timeout", "{ request: 0s }", "slow"),
            timeout_rule("/backend-timeout", "{ backendRequest: 500ms }", "slow"),
            timeout_rule("/disable-backend-timeout", "{ backendRequest: 0s }", "slow"),
            timeout_rule("/fast", "{ request: 500ms, backendRequest: 500ms }", "fast"),
        ]
        .concat(),
    ) + &infra_backend(&fast)
        + &infra_backend(&slow)
        + &backend_in("app-backend", "app-v1", &app_v1)
        + &backend_in("app-backend", "app-v2", &app_v2);
    let served = Served::start(&config, "envoy-partial", "infra/edge").await;
    let gw = loopback(port);
    wait_answer(gw, "omitted.example.com", "/", Backend("fast")).await;
    check(
        gw,
        1,
        &[
            get("omitted.example.com", "/omitted-no-forward", Status(500)),
            get("omitted.example.com", "/empty-no-forward", Status(500)),
            get("omitted.example.com", "/", Backend("fast")),
            get("partial.example.com", "/v2", Status(500)),
            get("partial.example.com", "/", Backend("app-v1")),
            get("timeout.example.com", "/request-timeout", Status(504)),
            get(
                "timeout.example.com",
                "/disable-request-timeout",
                Backend("slow"),
            ),
            get("timeout.example.com", "/backend-timeout", Status(504)),
            get(
                "timeout.example.com",
                "/disable-backend-timeout",
                Backend("slow"),
            ),
            get("timeout.example.com", "/fast", Backend("fast")),
            get("partial.example.com", "/v2/x", Status(500)),
        ],
    )
    .await;
    assert_eq!(app_v2.hits(), 0, "the ungranted backend must get nothing");
    // Status: the omitted route resolves its refs; the partial one is RefNotPermitted.
    let sources = served.sources().await;
    let resolved = |name: &str| {
        route_named(&sources, name)["parents"][0]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "ResolvedRefs")
            .cloned()
            .unwrap()
    };
    let c = resolved("omitted");
    assert_eq!(
        condition(&c),
        ("ResolvedRefs", "True", "ResolvedRefs"),
        "{c}"
    );
    let c = resolved("partial");
    assert_eq!(
        condition(&c),
        ("ResolvedRefs", "False", "RefNotPermitted"),
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
    let [p1, p2, p3] = [(); 3].map(|_| ballast_testkit::free_port());
    let config = [
        infra_gateway_with(
            "ports",
            &format!(
                "  - {{ name: listener-1, port: {p1}, protocol: HTTP, hostname: foo.com }}
  - {{ name: listener-2, port: {p2}, protocol: HTTP, hostname: foo.com }}
  - {{ name: listener-3, port: {p2}, protocol: HTTP, hostname: bar.com }}
  - {{ name: listener-4, port: {p3}, protocol: HTTP, hostname: foo.com }}
  - {{ name: listener-5, port: {p3}, protocol: HTTP, hostname: bar.com }}
"
            ),
        ),
        infra_route(
            "backend-v1",
            &format!("{{ name: ports, port: {p1} }}"),
            "",
            &rule("", "v1"),
        ),
        infra_route(
            "backend-v2",
            &format!("{{ name: ports, port: {p2} }}"),
            "",
            &rule("", "v2"),
        ),
        infra_route(
            "backend-v3",
            &format!("{{ name: ports, port: {p3}, sectionName: listener-4 }}"),
            "",
            &rule("", "v3"),
        ),
        infra_route(
            "mismatch",
            &format!("{{ name: ports, port: {p2}, sectionName: listener-1 }}"),
            "",
            &rule("", "stray"),
        ),
        infra_backend(&v1),
        infra_backend(&v2),
        infra_backend(&v3),
        infra_backend(&stray),
    ]
    .concat();
    let served = Served::start(&config, "envoy-ports", "infra/ports").await;
    wait_answer(loopback(p3), &format!("foo.com:{p3}"), "/", Backend("v3")).await;
    // The Host of each request names the port it is sent to.
    let at = |port: u16, host: &str, want: Want| {
        get(format!("{host}:{port}"), "/", want).via(loopback(port))
    };
    check(
        loopback(p1),
        3,
        &[
            at(p1, "foo.com", Backend("v1")),
            at(p2, "foo.com", Backend("v2")),
            at(p2, "bar.com", Backend("v2")),
            at(p3, "foo.com", Backend("v3")),
            at(p3, "bar.com", Status(404)),
        ],
    )
    .await;
    assert_eq!(stray.hits(), 0, "the unattached route must get no traffic");
    let sources = served.sources().await;
    let r = route_named(&sources, "mismatch");
    assert_eq!(
        condition(&r["parents"][0]["conditions"][0]),
        ("Accepted", "False", "NoMatchingParent"),
        "{r}"
    );
    let attached: Vec<(String, u64)> = sources["status"]["gateways"][0]["listeners"]
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
    assert_eq!(attached, want, "{sources}");
}

/// Conformance `HTTPRouteMultipleGateways`: one route with parentRefs on two Gateways (each
/// served by its own Envoy) answers `/shared` from v1 through both, while each Gateway's
/// dedicated `/` route answers from its own backend (v2, v3) and only there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_shared_by_two_gateways_serves_through_both() {
    let (_ups, backends) = v1_v2_v3().await;
    let (pa, pb) = (ballast_testkit::free_port(), ballast_testkit::free_port());
    let listener = |port: u16| format!("  - {{ name: http, port: {port}, protocol: HTTP }}\n");
    let config = [
        infra_gateway_with("same-namespace", &listener(pa)),
        infra_gateway_with("all-namespaces", &listener(pb)),
        infra_route(
            "shared",
            "{ name: same-namespace }, { name: all-namespaces }",
            "",
            &rule(&prefix("/shared"), "v1"),
        ),
        infra_route(
            "dedicated-a",
            "{ name: same-namespace }",
            "",
            &rule(&prefix("/"), "v2"),
        ),
        infra_route(
            "dedicated-b",
            "{ name: all-namespaces }",
            "",
            &rule(&prefix("/"), "v3"),
        ),
    ]
    .concat()
        + &backends;
    let served = Served::start(&config, "envoy-gw-a", "infra/same-namespace").await;
    let _b = ads_envoy(&served.ballast, "envoy-gw-b", "infra/all-namespaces").await;
    let (a, b) = (loopback(pa), loopback(pb));
    for gw in [a, b] {
        wait_answer(gw, "example.com", "/shared", Backend("v1")).await;
    }
    check(
        a,
        5,
        &[
            get("example.com", "/shared", Backend("v1")),
            get("example.com", "/", Backend("v2")),
            get("example.com", "/shared", Backend("v1")).via(b),
            get("example.com", "/", Backend("v3")).via(b),
        ],
    )
    .await;
    let sources = served.sources().await;
    let shared = route_named(&sources, "shared");
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
    let route_rule = |path: &str, version: &str, backend: &str| {
        format!(
            "  - matches:
    - path: {{ type: PathPrefix, value: {path} }}
    - headers: [{{ name: version, value: {version} }}]
    backendRefs: [{{ group: ballast.dev, kind: Backend, name: {backend} }}]
"
        )
    };
    let config = infra_gateway(port)
        + &infra_route(
            "matching-part1",
            EDGE,
            "example.com, example.net",
            &route_rule("/", "one", "v1"),
        )
        + &infra_route(
            "matching-part2",
            EDGE,
            "example.com",
            &route_rule("/v2", "two", "v2"),
        )
        + &infra_backend(&v1)
        + &infra_backend(&v2);
    let _served = Served::start(&config, "envoy-matching", "infra/edge").await;
    let gw = loopback(port);
    wait_answer(gw, "example.com", "/v2", Backend("v2")).await;
    check(
        gw,
        3,
        &[
            get("example.com", "/", Backend("v1")),
            get("example.com", "/example", Backend("v1")),
            get("example.net", "/example", Backend("v1")),
            get("example.com", "/example", Backend("v1")).headers(&["Version: one"]),
            get("example.com", "/v2", Backend("v2")),
            get("example.net", "/v2", Backend("v1")),
            get("example.com", "/v2/example", Backend("v2")),
            get("example.com", "/", Backend("v2")).headers(&["Version: two"]),
        ],
    )
    .await;
}

/// Conformance `HTTPRouteExactPathMatching`, `HTTPRouteHeaderMatching` and
/// `HTTPRouteMethodMatching`: the upstream manifests (one hostname each here) and every
/// request of their tables, expected backend or 404, 2 rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_path_header_and_method_matches() {
    let (_ups, backends) = v1_v2_v3().await;
    let port = ballast_testkit::free_port();
    let config = infra_gateway(port)
        + &infra_route(
            "exact",
            EDGE,
            "exact.example.com",
            &rules(&[
                ("[{ path: { type: Exact, value: /one } }]", "v1"),
                ("[{ path: { type: Exact, value: /two } }]", "v2"),
            ]),
        )
        + &infra_route(
            "headers",
            EDGE,
            "headers.example.com",
            &rules(&[
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
            ]),
        )
        + &infra_route(
            "methods",
            EDGE,
            "method.example.com",
            &rules(&[
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
            ]),
        )
        + &backends;
    let _served = Served::start(&config, "envoy-matches", "infra/edge").await;
    let gw = loopback(port);
    wait_answer(gw, "exact.example.com", "/one", Backend("v1")).await;
    let (exact, headers, method) = (
        "exact.example.com",
        "headers.example.com",
        "method.example.com",
    );
    let not_found = Status(404);
    check(
        gw,
        2,
        &[
            get(exact, "/one", Backend("v1")),
            get(exact, "/two", Backend("v2")),
            get(exact, "/", not_found),
            get(exact, "/one/example", not_found),
            get(exact, "/two/", not_found),
            get(exact, "/Two", not_found),
            get(headers, "/", Backend("v1")).headers(&["Version: one"]),
            get(headers, "/", Backend("v2")).headers(&["Version: two"]),
            get(headers, "/", Backend("v1")).headers(&["Version: two", "Color: orange"]),
            get(headers, "/", Backend("v2")).headers(&["Version: two", "Color: blue"]),
            get(headers, "/", not_found).headers(&["Color: orange"]),
            get(headers, "/", not_found).headers(&["Some-Other-Header: one"]),
            get(headers, "/", Backend("v1")).headers(&["Color: blue"]),
            get(headers, "/", Backend("v1")).headers(&["Color: green"]),
            get(headers, "/", Backend("v2")).headers(&["Color: red"]),
            get(headers, "/", Backend("v2")).headers(&["Color: yellow"]),
            get(headers, "/", not_found).headers(&["Color: purple"]),
            req("POST", method, "/", Backend("v1")),
            req("GET", method, "/", Backend("v2")),
            req("HEAD", method, "/", not_found),
            req("GET", method, "/path1", Backend("v1")),
            req("PUT", method, "/", Backend("v2")).headers(&["version: one"]),
            req("POST", method, "/path2", Backend("v3")).headers(&["version: two"]),
            req("PATCH", method, "/path3", Backend("v1")),
            req("DELETE", method, "/path4", Backend("v1")).headers(&["version: three"]),
            req("PUT", method, "/", not_found),
            req("DELETE", method, "/path4", not_found),
            req("PATCH", method, "/path5", Backend("v1")),
            req("PATCH", method, "/", Backend("v2")).headers(&["version: four"]),
        ],
    )
    .await;
}

/// Conformance `HTTPRouteRewritePath` and `HTTPRouteRewriteHost`: the upstream manifests (the
/// path route on its own hostname here); for each request the backend receives the rewritten
/// path / Host, and with a RequestHeaderModifier beside the rewrite the modified headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_rewrites_reach_the_backend_rewritten() {
    let v1 = Upstream::start("v1").await.unwrap();
    let v2 = Upstream::start("v2").await.unwrap();
    let port = ballast_testkit::free_port();
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
    let path_rules = [
        rewrite(
            "/prefix/one",
            "{ path: { type: ReplacePrefixMatch, replacePrefixMatch: /one } }",
            "v1",
            "",
        ),
        rewrite(
            "/strip-prefix",
            "{ path: { type: ReplacePrefixMatch, replacePrefixMatch: / } }",
            "v1",
            "",
        ),
        rewrite(
            "/full/one",
            "{ path: { type: ReplaceFullPath, replaceFullPath: /one } }",
            "v1",
            "",
        ),
        rewrite(
            "/full/rewrite-path-and-modify-headers",
            "{ path: { type: ReplaceFullPath, replaceFullPath: /test } }",
            "v1",
            &with_headers,
        ),
        rewrite(
            "/prefix/rewrite-path-and-modify-headers",
            "{ path: { type: ReplacePrefixMatch, replacePrefixMatch: /prefix } }",
            "v1",
            &with_headers,
        ),
    ];
    let host_rules = [
        rewrite("/one", "{ hostname: one.example.org }", "v1", ""),
        rewrite("", "{ hostname: example.org }", "v2", ""),
        rewrite(
            "/rewrite-host-and-modify-headers",
            "{ hostname: test.example.org }",
            "v2",
            &with_headers,
        ),
    ];
    let config = infra_gateway(port)
        + &infra_route("rewrite-path", EDGE, "path.example", &path_rules.concat())
        + &infra_route(
            "rewrite-host",
            EDGE,
            "rewrite.example",
            &host_rules.concat(),
        )
        + &infra_backend(&v1)
        + &infra_backend(&v2);
    let _served = Served::start(&config, "envoy-rewrites", "infra/edge").await;
    let gw = loopback(port);
    wait_answer(gw, "rewrite.example", "/two", Backend("v2")).await;
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
    let (_ups, backends) = v1_v2_v3().await;
    let port = ballast_testkit::free_port();
    let config = infra_gateway(port)
        + &infra_route(
            "matching",
            EDGE,
            "match.example.com",
            &rules(&[
                (
                    "[{ path: { type: PathPrefix, value: / } }, { headers: [{ name: version, value: one }] }]",
                    "v1",
                ),
                (
                    "[{ path: { type: PathPrefix, value: /v2 } }, { headers: [{ name: version, value: two }] }]",
                    "v2",
                ),
            ]),
        )
        + &infra_route(
            "query",
            EDGE,
            "query.example.com",
            &rules(&[
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
            ]),
        )
        + &backends;
    let _served = Served::start(&config, "envoy-query", "infra/edge").await;
    let gw = loopback(port);
    wait_answer(gw, "match.example.com", "/", Backend("v1")).await;
    let (matching, query) = ("match.example.com", "query.example.com");
    let not_found = Status(404);
    check(
        gw,
        1,
        &[
            get(matching, "/", Backend("v1")),
            get(matching, "/example", Backend("v1")),
            get(matching, "/", Backend("v1")).headers(&["Version: one"]),
            get(matching, "/v2", Backend("v2")),
            get(matching, "/v2/example", Backend("v2")),
            get(matching, "/", Backend("v2")).headers(&["Version: two"]),
            get(matching, "/v2/", Backend("v2")),
            get(matching, "/v2example", Backend("v1")),
            get(matching, "/foo/v2/example", Backend("v1")),
            get(query, "/?animal=whale", Backend("v1")),
            get(query, "/?animal=dolphin", Backend("v2")),
            get(query, "/?animal=dolphin&color=blue", Backend("v3")),
            get(query, "/?ANIMAL=Whale", Backend("v3")),
            get(query, "/?animal=whale&otherparam=irrelevant", Backend("v1")),
            get(query, "/?animal=dolphin&color=yellow", Backend("v2")),
            get(query, "/?color=blue", not_found),
            get(query, "/?animal=dog", not_found),
            get(query, "/?animal=whaledolphin", not_found),
            get(query, "/", not_found),
            get(query, "/path1?animal=whale", Backend("v1")),
            get(query, "/?animal=whale", Backend("v2")).headers(&["version: one"]),
            get(query, "/path2?animal=whale", Backend("v3")).headers(&["version: two"]),
            get(query, "/path3?animal=shark", Backend("v1")),
            get(query, "/path4?animal=kraken", Backend("v1")).headers(&["version: three"]),
            get(query, "/?animal=shark", not_found),
            get(query, "/path4?animal=kraken", not_found),
        ],
    )
    .await;
}

/// Conformance `HTTPRouteResponseHeaderModifier` (its operations on our upstream, which answers
/// with `x-upstream: NAME`): `set` replaces a backend's header and adds new ones, `add`
/// appends a value beside the backend's, `remove` drops it; a rule without the filter passes
/// the backend's headers unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_header_modifier_sets_adds_and_removes() {
    let up = Upstream::start("v1").await.unwrap();
    let port = ballast_testkit::free_port();
    let modify = |path: &str, modifier: &str| {
        format!(
            "  - matches: {}
    filters: [{{ type: ResponseHeaderModifier, responseHeaderModifier: {modifier} }}]
    backendRefs: [{{ group: ballast.dev, kind: Backend, name: v1 }}]
",
            prefix(path)
        )
    };
    let route_rules = [
        modify(
            "/set",
            "{ set: [{ name: X-Upstream, value: replaced }, { name: X-Header-Set, value: set-value }] }",
        ),
        modify(
            "/add",
            "{ add: [{ name: X-Upstream, value: appended }, { name: X-Header-Add, value: add-value }] }",
        ),
        modify("/remove", "{ remove: [X-Upstream] }"),
        modify(
            "/multiple",
            "{ set: [{ name: X-Header-Set, value: set-value }], add: [{ name: X-Header-Add, value: add-value }], remove: [X-Upstream] }",
        ),
        rule("", "v1"),
    ]
    .concat();
    let config = infra_gateway(port)
        + &infra_route("response-headers", EDGE, "response.example", &route_rules)
        + &infra_backend(&up);
    let _served = Served::start(&config, "envoy-response-headers", "infra/edge").await;
    let gw = loopback(port);
    wait_answer(gw, "response.example", "/", Backend("v1")).await;
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
    let (_ups, backends) = v1_v2_v3().await;
    let port = ballast_testkit::free_port();
    let config = infra_gateway_with(
        "hosts",
        &format!(
            "  - {{ name: listener-1, port: {port}, protocol: HTTP, hostname: bar.com }}
  - {{ name: listener-2, port: {port}, protocol: HTTP, hostname: foo.bar.com }}
  - {{ name: listener-3, port: {port}, protocol: HTTP, hostname: \"*.bar.com\" }}
  - {{ name: listener-4, port: {port}, protocol: HTTP, hostname: \"*.foo.com\" }}
"
        ),
    ) + &infra_route(
        "backend-v1",
        "{ name: hosts, sectionName: listener-1 }",
        "",
        &rule("", "v1"),
    ) + &infra_route(
        "backend-v2",
        "{ name: hosts, sectionName: listener-2 }",
        "",
        &rule("", "v2"),
    ) + &infra_route(
        "backend-v3",
        "{ name: hosts, sectionName: listener-3 }, { name: hosts, sectionName: listener-4 }",
        "",
        &rule("", "v3"),
    ) + &backends;
    let _served = Served::start(&config, "envoy-hosts", "infra/hosts").await;
    let gw = loopback(port);
    wait_answer(gw, "bar.com", "/", Backend("v1")).await;
    check(
        gw,
        3,
        &[
            get("bar.com", "/", Backend("v1")),
            get("foo.bar.com", "/", Backend("v2")),
            get("baz.bar.com", "/", Backend("v3")),
            get("boo.bar.com", "/", Backend("v3")),
            get("multiple.prefixes.bar.com", "/", Backend("v3")),
            get("multiple.prefixes.foo.com", "/", Backend("v3")),
            get("foo.com", "/", Status(404)),
            get("no.matching.host", "/", Status(404)),
        ],
    )
    .await;
}

/// Conformance `GatewayHTTPListenerIsolation`: four HTTP listeners on one port (no hostname,
/// `*.example.com`, `*.foo.example.com`, `abc.foo.example.com`), one route per listener. A
/// request is served only by the routes of the most specific listener matching its host: of
/// the 16 host × path requests only the 4 on the diagonal reach the backend, the rest get 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_listeners_on_one_port_are_isolated() {
    let up = Upstream::start("v1").await.unwrap();
    let port = ballast_testkit::free_port();
    // (listener and path name, listener hostname, a host only that listener matches)
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
    let mut config = infra_gateway_with(
        "isolation",
        &listeners
            .iter()
            .map(|(name, hostname, _)| {
                let hostname = hostname
                    .map(|h| format!(", hostname: {h}"))
                    .unwrap_or_default();
                format!("  - {{ name: {name}, port: {port}, protocol: HTTP{hostname} }}\n")
            })
            .collect::<String>(),
    );
    for (name, _, _) in listeners {
        config += &infra_route(
            &format!("attaches-to-{name}"),
            &format!("{{ name: isolation, sectionName: {name} }}"),
            "",
            &rule(&prefix(&format!("/{name}")), "v1"),
        );
    }
    config += &infra_backend(&up);
    let _served = Served::start(&config, "envoy-isolation", "infra/isolation").await;
    let gw = loopback(port);
    wait_answer(gw, "bar.com", "/empty-hostname", Backend("v1")).await;
    let mut table = Vec::new();
    for (i, (_, _, host)) in listeners.iter().enumerate() {
        for (j, (path, _, _)) in listeners.iter().enumerate() {
            let want = if i == j { Backend("v1") } else { Status(404) };
            table.push(get(*host, format!("/{path}"), want));
        }
    }
    check(gw, 1, &table).await;
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
    let part = |ns: &str, host: &str, up: &Upstream| {
        http_route(
            ns,
            "route",
            "{ name: same, namespace: infra }",
            host,
            &rule("", "web"),
        ) + &backend_in(ns, "web", up)
    };
    let config = infra_gateway_with(
        "same",
        &format!(
            "  - {{ name: http, port: {port}, protocol: HTTP, allowedRoutes: {{ namespaces: {{ from: Same }} }} }}\n"
        ),
    ) + &part("infra", "own.example.com", &own)
        + &part("web-backend", "foreign.example.com", &foreign);
    let served = Served::start(&config, "envoy-same-ns", "infra/same").await;
    let gw = loopback(port);
    wait_answer(gw, "own.example.com", "/", Backend("own")).await;
    check(gw, 10, &[get("foreign.example.com", "/", Status(404))]).await;
    assert_eq!(foreign.hits(), 0);
    let sources = served.sources().await;
    let r = sources["status"]["httpRoutes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["namespace"] == "web-backend")
        .unwrap();
    assert_eq!(
        condition(&r["parents"][0]["conditions"][0]),
        ("Accepted", "False", "NotAllowedByListeners"),
        "{r}"
    );
}

/// Conformance `HTTPRouteHostnameIntersection` (the cases of its first Gateway): listeners for
/// `very.specific.com`, `*.wildcard.io` and `*.anotherwildcard.io`; routes whose hostnames
/// intersect them specifically or by wildcard, plus a route intersecting none. Each of the
/// upstream suite's 27 requests gets its expected backend or 404 (`Host` with a port too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_hostnames_intersect_listener_hostnames() {
    let (_ups, backends) = v1_v2_v3().await;
    let port = ballast_testkit::free_port();
    let route = |name: &str, hostnames: &str, path: &str, backend: &str| {
        infra_route(
            name,
            "{ name: intersection }",
            hostnames,
            &rule(&prefix(path), backend),
        )
    };
    let config = infra_gateway_with(
        "intersection",
        &format!(
            "  - {{ name: listener-1, port: {port}, protocol: HTTP, hostname: very.specific.com }}
  - {{ name: listener-2, port: {port}, protocol: HTTP, hostname: \"*.wildcard.io\" }}
  - {{ name: listener-3, port: {port}, protocol: HTTP, hostname: \"*.anotherwildcard.io\" }}
"
        ),
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
    ) + &backends;
    let _served = Served::start(&config, "envoy-intersection", "infra/intersection").await;
    let gw = loopback(port);
    wait_answer(gw, "very.specific.com", "/s1", Backend("v1")).await;
    let not_found = Status(404);
    check(
        gw,
        1,
        &[
            get("very.specific.com", "/s1", Backend("v1")),
            get("very.specific.com:1234", "/s1", Backend("v1")),
            get("non.matching.com", "/s1", not_found),
            get("foo.nonmatchingwildcard.io", "/s1", not_found),
            get("foo.wildcard.io", "/s1", not_found),
            get("very.specific.com", "/non-matching-prefix", not_found),
            get("foo.wildcard.io", "/s2", Backend("v2")),
            get("bar.wildcard.io", "/s2", Backend("v2")),
            get("foo.bar.wildcard.io", "/s2", Backend("v2")),
            get("non.matching.com", "/s2", not_found),
            get("wildcard.io", "/s2", not_found),
            get("very.specific.com", "/s2", not_found),
            get("foo.wildcard.io", "/non-matching-prefix", not_found),
            get("very.specific.com", "/s3", Backend("v3")),
            get("non.matching.com", "/s3", not_found),
            get("foo.specific.com", "/s3", not_found),
            get("foo.wildcard.io", "/s3", not_found),
            get("very.specific.com", "/non-matching-prefix", not_found),
            get("foo.anotherwildcard.io", "/s4", Backend("v1")),
            get("bar.anotherwildcard.io", "/s4", Backend("v1")),
            get("foo.bar.anotherwildcard.io", "/s4", Backend("v1")),
            get("anotherwildcard.io", "/s4", not_found),
            get("foo.wildcard.io", "/s4", not_found),
            get("very.specific.com", "/s4", not_found),
            get("foo.anotherwildcard.io", "/non-matching-prefix", not_found),
            get("specific.but.wrong.com", "/s5", not_found),
            get("wildcard.io", "/s5", not_found),
        ],
    )
    .await;
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
    let route = |name: &str, parent: &str, backend: &str| {
        infra_route(
            name,
            parent,
            &format!("{name}.example.com"),
            &rule("", backend),
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
        + &infra_backend(&good)
        + &infra_backend(&bad);
    let served = Served::start(&config, "envoy-parents", "infra/edge").await;
    let gw = loopback(port);
    wait_answer(gw, "valid.example.com", "/", Backend("good")).await;
    check(
        gw,
        5,
        &[
            get("section.example.com", "/", Status(404)),
            get("port.example.com", "/", Status(404)),
        ],
    )
    .await;
    assert_eq!(bad.hits(), 0);
    let sources = served.sources().await;
    for name in ["section", "port"] {
        let r = route_named(&sources, name);
        assert_eq!(
            condition(&r["parents"][0]["conditions"][0]),
            ("Accepted", "False", "NoMatchingParent"),
            "{r}"
        );
    }
    assert_eq!(
        sources["status"]["gateways"][0]["listeners"][0]["attachedRoutes"], 1,
        "{sources}"
    );
}

/// Conformance `HTTPRouteInvalidNonExistentBackendRef` and
/// `HTTPRouteInvalidBackendRefUnknownKind`: a backendRef to a Backend that does not exist is
/// `ResolvedRefs=False BackendNotFound`, one to an unknown kind `InvalidKind`; both routes stay
/// `Accepted` and answer 500 (every request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unresolvable_backend_refs_answer_500() {
    let port = ballast_testkit::free_port();
    let route = |name: &str, backend_ref: &str| {
        infra_route(
            name,
            EDGE,
            &format!("{name}.example.com"),
            &format!("  - backendRefs: [{backend_ref}]\n"),
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
    let served = Served::start(&config, "envoy-refs", "infra/edge").await;
    let gw = loopback(port);
    wait_answer(gw, "nonexistent.example.com", "/", Status(500)).await;
    check(
        gw,
        5,
        &[
            get("nonexistent.example.com", "/", Status(500)),
            get("unknown-kind.example.com", "/", Status(500)),
        ],
    )
    .await;
    let sources = served.sources().await;
    for (name, reason) in [
        ("nonexistent", "BackendNotFound"),
        ("unknown-kind", "InvalidKind"),
    ] {
        let r = route_named(&sources, name);
        let conds = &r["parents"][0]["conditions"];
        assert_eq!(conds[0]["status"], "True", "{r}");
        assert_eq!(
            condition(&conds[1]),
            ("ResolvedRefs", "False", reason),
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
        + &infra_route(
            "invalid-grant",
            EDGE,
            "grant.example.com",
            "  - backendRefs: [{ group: ballast.dev, kind: Backend, name: web, namespace: web-backend }]\n",
        )
        + &backend_in("web-backend", "web", &up)
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
    let served = Served::start(&config, "envoy-invalid-grant", "infra/edge").await;
    let gw = loopback(port);
    wait_answer(gw, "grant.example.com", "/", Status(500)).await;
    check(gw, 10, &[get("grant.example.com", "/", Status(500))]).await;
    assert_eq!(
        up.hits(),
        0,
        "no grant covers the ref: nothing may reach the backend"
    );
    let sources = served.sources().await;
    assert_eq!(
        condition(&sources["status"]["httpRoutes"][0]["parents"][0]["conditions"][1]),
        ("ResolvedRefs", "False", "RefNotPermitted"),
        "{sources}"
    );
}
