//! Real-manifest scenarios (issue #10 proof items), with real Envoy and real traffic.
//!
//! `envoy_gateway_style_directory_serves_and_reports_what_it_skips`: a directory laid out as a
//! user exports an Envoy Gateway quickstart-style setup (GatewayClass, Gateway with HTTP and
//! HTTPS listeners, TLS Secret as base64 `data`, HTTPRoutes with path/header matches, a
//! RequestHeaderModifier and weighted backends, a GRPCRoute, a cross-namespace backendRef
//! allowed by a ReferenceGrant, Services + EndpointSlices, Namespaces, a ConfigMap, and objects
//! of kinds Ballast does not implement: GatewayClass, EnvoyProxy, BackendTrafficPolicy,
//! ClientTrafficPolicy, ServiceAccount, Deployment). Ballast must become ready, serve every
//! supported route from the right upstream with zero non-2xx, and report each unsupported
//! thing in `/debug/sources` and `ballast validate`.
//!
//! `bad_edit_to_one_of_3400_routes_changes_nothing_in_envoy`: 3,400 HTTPRoutes, one Envoy under
//! traffic to a sample of hosts. A bad field value in one route's new version leaves Envoy's
//! whole config dump (listeners, clusters, route configs: names, versions, update times)
//! byte-for-byte unchanged, the route keeps serving its last good version and the error names
//! file:line:col; the fixed version then changes that one virtual host and nothing else.

mod common;

use std::net::SocketAddr;
use std::path::Path;

use ballast_testkit::{
    AdsMode, Envoy, EnvoyConfig, GrpcUpstream, Traffic, TrafficConfig, Upstream, grpc_calls,
    wait_for, wait_until,
};
use common::*;

/// `kubectl get -o yaml`-style Service (server-set fields included) with one named port.
fn service(ns: &str, name: &str, port: u16, app_protocol: Option<&str>) -> String {
    let app = app_protocol
        .map(|p| format!(", appProtocol: {p}"))
        .unwrap_or_default();
    format!(
        "---
apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: {ns}
  labels: {{ app: {name}, service: {name} }}
  resourceVersion: \"1187\"
  uid: 0b5d6a52-7f1e-4f7e-9c55-2d1b3c4d5e6f
spec:
  clusterIP: 10.96.0.{port_lo}
  ports:
  - {{ name: http, port: {port}, protocol: TCP, targetPort: {port}{app} }}
  selector: {{ app: {name} }}
  type: ClusterIP
status:
  loadBalancer: {{}}
",
        port_lo = port % 250
    )
}

/// The EndpointSlice the endpoints controller writes for `svc`: one ready pod at `addr`.
fn slice(ns: &str, svc: &str, addr: SocketAddr) -> String {
    format!(
        "---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {svc}-x7k2p
  namespace: {ns}
  generateName: {svc}-
  labels:
    kubernetes.io/service-name: {svc}
    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
addressType: IPv4
endpoints:
- addresses: [\"{ip}\"]
  conditions: {{ ready: true, serving: true, terminating: false }}
  nodeName: kind-control-plane
  targetRef: {{ kind: Pod, name: {svc}-6fbd6c9d4-abcde, namespace: {ns} }}
ports:
- {{ name: http, port: {port}, protocol: TCP }}
",
        ip = addr.ip(),
        port = addr.port()
    )
}

fn b64(data: &str) -> String {
    let out = std::process::Command::new("base64")
        .arg("-w0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().expect("piped").write_all(data.as_bytes())?;
            c.wait_with_output()
        })
        .expect("run base64");
    String::from_utf8(out.stdout).unwrap()
}

/// Upstreams of the scenario, by the name each answers with.
struct Ups {
    backend: Upstream,
    api_v1: Upstream,
    api_v2: Upstream,
    api_canary: Upstream,
    billing: Upstream,
    legacy: Upstream,
    grpc: GrpcUpstream,
}

/// Writes the exported directory: one file per concern, as users keep them.
fn write_export(dir: &Path, http: u16, https: u16, u: &Ups, crt: &str, key: &str) {
    let w = |name: &str, text: String| std::fs::write(dir.join(name), text).unwrap();
    w(
        "00-namespaces.yaml",
        "apiVersion: v1
kind: Namespace
metadata:
  name: envoy-gateway-system
  labels: { kubernetes.io/metadata.name: envoy-gateway-system }
---
apiVersion: v1
kind: Namespace
metadata:
  name: billing
  labels: { kubernetes.io/metadata.name: billing, team: payments }
"
        .into(),
    );
    w(
        "01-envoy-gateway.yaml",
        "# Envoy Gateway's own objects: not Ballast kinds (skipped, reported).
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: { name: eg }
spec:
  controllerName: gateway.envoyproxy.io/gatewayclass-controller
  parametersRef:
    group: gateway.envoyproxy.io
    kind: EnvoyProxy
    name: custom-proxy-config
    namespace: envoy-gateway-system
---
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyProxy
metadata: { name: custom-proxy-config, namespace: envoy-gateway-system }
spec:
  provider:
    type: Kubernetes
    kubernetes:
      envoyDeployment: { replicas: 2 }
---
apiVersion: v1
kind: ConfigMap
metadata: { name: envoy-gateway-config, namespace: envoy-gateway-system }
data:
  envoy-gateway.yaml: |
    apiVersion: gateway.envoyproxy.io/v1alpha1
    kind: EnvoyGateway
    provider: { type: Kubernetes }
    gateway: { controllerName: gateway.envoyproxy.io/gatewayclass-controller }
"
        .into(),
    );
    w(
        "10-gateway.yaml",
        format!(
            "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: eg
  namespace: default
spec:
  gatewayClassName: eg
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - name: http
    protocol: HTTP
    port: {http}
  - name: https
    protocol: HTTPS
    port: {https}
    hostname: www.example.com
    tls:
      mode: Terminate
      certificateRefs:
      - {{ kind: Secret, group: \"\", name: eg-https }}
---
apiVersion: v1
kind: Secret
metadata: {{ name: eg-https, namespace: default }}
type: kubernetes.io/tls
data:
  tls.crt: {}
  tls.key: {}
",
            b64(crt),
            b64(key)
        ),
    );
    w(
        "20-policies.yaml",
        "apiVersion: gateway.envoyproxy.io/v1alpha1
kind: BackendTrafficPolicy
metadata: { name: retries, namespace: default }
spec:
  targetRefs: [{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: api }]
  retry: { numRetries: 3 }
---
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: ClientTrafficPolicy
metadata: { name: client-timeouts, namespace: default }
spec:
  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: eg }]
  timeout: { http: { requestReceivedTimeout: 10s } }
"
        .into(),
    );
    w(
        "30-routes.yaml",
        "# The quickstart route: every path of www.example.com, on both listeners.
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: { name: backend, namespace: default }
spec:
  parentRefs: [{ name: eg }]
  hostnames: [www.example.com]
  rules:
  - matches: [{ path: { type: PathPrefix, value: / } }]
    backendRefs: [{ group: \"\", kind: Service, name: backend, port: 3000, weight: 1 }]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: { name: api, namespace: default }
spec:
  parentRefs: [{ name: eg, sectionName: http }]
  hostnames: [api.example.com]
  rules:
  - matches:
    - path: { type: PathPrefix, value: /v2 }
      headers: [{ type: Exact, name: x-canary, value: \"true\" }]
    backendRefs: [{ name: api-canary, port: 8080 }]
  - matches: [{ path: { type: PathPrefix, value: /v2 } }]
    backendRefs: [{ name: api-v2, port: 8080 }]
  - matches: [{ path: { type: PathPrefix, value: / } }]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{ name: x-gateway, value: ballast }]
        add: [{ name: x-env, value: prod }]
        remove: [x-debug]
    backendRefs: [{ name: api-v1, port: 8080 }]
---
# Weighted split (canary gets nothing at weight 0).
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: { name: split, namespace: default }
spec:
  parentRefs: [{ name: eg, sectionName: http }]
  hostnames: [split.example.com]
  rules:
  - backendRefs:
    - { name: api-v1, port: 8080, weight: 3 }
    - { name: api-v2, port: 8080, weight: 1 }
    - { name: api-canary, port: 8080, weight: 0 }
---
# A backend in another namespace, allowed by the ReferenceGrant in billing.
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: { name: billing, namespace: default }
spec:
  parentRefs: [{ name: eg, sectionName: http }]
  hostnames: [billing.example.com]
  rules:
  - backendRefs: [{ name: billing, namespace: billing, port: 8080 }]
---
# A backendRef filter Ballast does not implement: served, reported as UnsupportedValue.
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: { name: legacy, namespace: default }
spec:
  parentRefs: [{ name: eg, sectionName: http }]
  hostnames: [legacy.example.com]
  rules:
  - backendRefs:
    - name: legacy
      port: 8080
      filters:
      - type: URLRewrite
        urlRewrite: { hostname: legacy.internal }
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: { name: echo, namespace: default }
spec:
  parentRefs: [{ name: eg, sectionName: http }]
  hostnames: [grpc.example.com]
  rules:
  - matches: [{ method: { service: gateway_api_conformance.echo_basic.grpcecho.GrpcEcho } }]
    backendRefs: [{ name: grpc-echo, port: 9000 }]
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: { name: allow-default-routes, namespace: billing }
spec:
  from: [{ group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: default }]
  to: [{ group: \"\", kind: Service, name: billing }]
"
        .into(),
    );
    w(
        "40-backends.yaml",
        "# The quickstart's workload objects: not Ballast kinds (skipped, reported).
apiVersion: v1
kind: ServiceAccount
metadata: { name: backend, namespace: default }
---
apiVersion: apps/v1
kind: Deployment
metadata: { name: backend, namespace: default }
spec:
  replicas: 1
  selector: { matchLabels: { app: backend, version: v1 } }
  template:
    metadata: { labels: { app: backend, version: v1 } }
    spec:
      serviceAccountName: backend
      containers:
      - name: backend
        image: gcr.io/k8s-staging-gateway-api/echo-basic:v20231214-v1.0.0-140-gf544a46e
        ports: [{ containerPort: 3000 }]
"
        .to_owned()
            + &service("default", "backend", 3000, None)
            + &slice("default", "backend", u.backend.addr())
            + &service("default", "api-v1", 8080, None)
            + &slice("default", "api-v1", u.api_v1.addr())
            + &service("default", "api-v2", 8080, None)
            + &slice("default", "api-v2", u.api_v2.addr())
            + &service("default", "api-canary", 8080, None)
            + &slice("default", "api-canary", u.api_canary.addr())
            + &service("default", "legacy", 8080, None)
            + &slice("default", "legacy", u.legacy.addr())
            + &service("billing", "billing", 8080, None)
            + &slice("billing", "billing", u.billing.addr())
            + &service("default", "grpc-echo", 9000, Some("kubernetes.io/h2c"))
            + &slice("default", "grpc-echo", u.grpc.addr()),
    );
}

/// A self-signed certificate for `host` (rcgen); writes it to `dir/ca.crt` for curl.
fn self_signed(dir: &Path, host: &str) -> (String, String) {
    let mut params = rcgen::CertificateParams::new(vec![host.to_string()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, host);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    std::fs::write(dir.join("ca.crt"), cert.pem()).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// `GET https://www.example.com:{port}{path}` verified against `ca`: (status, body).
async fn https_get(port: u16, path: &str, ca: &Path) -> (u16, String) {
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(["--resolve", &format!("www.example.com:{port}:127.0.0.1")])
        .arg("--cacert")
        .arg(ca)
        .arg(format!("https://www.example.com:{port}{path}"))
        .output()
        .await
        .expect("run curl");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = stdout.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

const GRPC_ECHO: &str = "/gateway_api_conformance.echo_basic.grpcecho.GrpcEcho/Echo";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateway_style_directory_serves_and_reports_what_it_skips() {
    let u = Ups {
        backend: Upstream::start("backend").await.unwrap(),
        api_v1: Upstream::start("api-v1").await.unwrap(),
        api_v2: Upstream::start("api-v2").await.unwrap(),
        api_canary: Upstream::start("api-canary").await.unwrap(),
        billing: Upstream::start("billing").await.unwrap(),
        legacy: Upstream::start("legacy").await.unwrap(),
        grpc: GrpcUpstream::start("grpc-echo").await.unwrap(),
    };
    let certs = tempfile::tempdir().unwrap();
    let (crt, key) = self_signed(certs.path(), "www.example.com");
    let ca = certs.path().join("ca.crt");
    let (http_port, https_port) = (ballast_testkit::free_port(), ballast_testkit::free_port());
    let dir = tempfile::tempdir().unwrap();
    write_export(dir.path(), http_port, https_port, &u, &crt, &key);

    // `ballast validate` accepts the export (exit 0) and names every skipped object and the
    // unsupported filter by file:line.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ballast"))
        .arg("validate")
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    for (file, kind) in [
        ("01-envoy-gateway.yaml", "GatewayClass eg"),
        (
            "01-envoy-gateway.yaml",
            "EnvoyProxy envoy-gateway-system/custom-proxy-config",
        ),
        ("20-policies.yaml", "BackendTrafficPolicy default/retries"),
        (
            "20-policies.yaml",
            "ClientTrafficPolicy default/client-timeouts",
        ),
        ("40-backends.yaml", "ServiceAccount default/backend"),
        ("40-backends.yaml", "Deployment default/backend"),
    ] {
        assert!(
            text.lines().any(|l| l.starts_with("warning: ")
                && l.contains(file)
                && l.contains(&format!("skipped {}", kind.split(' ').next().unwrap()))),
            "{file} {kind}: {text}"
        );
    }
    assert!(
        text.lines().any(|l| l.contains("HTTPRoute default/legacy")
            && l.contains("UnsupportedValue")
            && l.contains("URLRewrite")),
        "{text}"
    );

    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-eg",
        "default/eg",
        AdsMode::DeltaGrpc,
    ))
    .await
    .unwrap();
    let gw = loopback(http_port);

    // Every supported route, with the upstream that must answer it.
    let cases: &[(&str, &str, &[&str], &str)] = &[
        ("www.example.com", "/", &[], "backend"),
        ("www.example.com", "/get/anything", &[], "backend"),
        ("api.example.com", "/", &[], "api-v1"),
        ("api.example.com", "/users/7", &[], "api-v1"),
        ("api.example.com", "/v2/items", &[], "api-v2"),
        (
            "api.example.com",
            "/v2/items",
            &["x-canary: true"],
            "api-canary",
        ),
        (
            "api.example.com",
            "/v2/items",
            &["x-canary: false"],
            "api-v2",
        ),
        ("billing.example.com", "/invoices", &[], "billing"),
        ("legacy.example.com", "/", &[], "legacy"),
    ];
    // Bounded wait until Envoy holds the whole config (the last case and HTTPS answer).
    wait_for(T, POLL, || async {
        for (host, path, headers, want) in cases {
            let (code, _, body) = host_path_request(gw, "GET", host, path, headers).await?;
            if code != 200 || body != *want {
                anyhow::bail!("{host}{path}: {code} {body}");
            }
        }
        match https_get(https_port, "/", &ca).await {
            (200, body) if body == "backend" => Ok(()),
            other => anyhow::bail!("https: {other:?}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\nenvoy log:\n{}", envoy.log_tail(30)));

    // The RequestHeaderModifier reached api-v1 (checked before other traffic shares api-v1).
    let (code, _, body) = host_path_request(
        gw,
        "GET",
        "api.example.com",
        "/",
        &["x-debug: 1", "x-gateway: spoofed"],
    )
    .await
    .unwrap();
    assert_eq!((code, body.as_str()), (200, "api-v1"));
    assert_eq!(
        u.api_v1.last_header("x-gateway").as_deref(),
        Some("ballast")
    );
    assert_eq!(u.api_v1.last_header("x-env").as_deref(), Some("prod"));
    assert_eq!(u.api_v1.last_header("x-debug"), None);

    // A traffic loop over every HTTP route while each case, HTTPS and gRPC are checked one by
    // one: no non-2xx anywhere.
    let mut requests: Vec<(String, String)> = cases
        .iter()
        .filter(|c| c.2.is_empty())
        .map(|c| (c.0.to_owned(), c.1.to_owned()))
        .collect();
    requests.push(("split.example.com".into(), "/".into()));
    let traffic = Traffic::start(
        TrafficConfig::with_requests(gw, requests)
            .concurrency(2)
            .max_requests(600),
    );
    let mut non_2xx = Vec::new();
    let mut split = std::collections::BTreeMap::<String, u32>::new();
    for _ in 0..5 {
        for (host, path, headers, want) in cases {
            let (code, _, body) = host_path_request(gw, "GET", host, path, headers)
                .await
                .unwrap();
            if code != 200 || body != *want {
                non_2xx.push(format!("{host}{path} {headers:?}: {code} {body}"));
            }
        }
        let (code, body) = https_get(https_port, "/get", &ca).await;
        if (code, body.as_str()) != (200, "backend") {
            non_2xx.push(format!("https: {code} {body}"));
        }
        for o in grpc_calls(gw, "grpc.example.com", GRPC_ECHO, 3, &[])
            .await
            .unwrap()
        {
            if o.backend() != Some("grpc-echo") {
                non_2xx.push(format!("grpc: {o:?}"));
            }
        }
    }
    for _ in 0..60 {
        let (code, _, body) = host_path_request(gw, "GET", "split.example.com", "/", &[])
            .await
            .unwrap();
        if code != 200 {
            non_2xx.push(format!("split: {code} {body}"));
        }
        *split.entry(body).or_default() += 1;
    }
    let report = traffic.wait().await;
    assert!(non_2xx.is_empty(), "{non_2xx:#?}");
    report.assert_all_ok();
    for name in ["backend", "api-v1", "api-v2", "billing", "legacy"] {
        assert!(
            report.by_body.get(name).is_some_and(|n| *n > 0),
            "{name}: {report}"
        );
    }
    // Weighted 3:1:0 — both weighted backends answer, the weight-0 one never does.
    assert!(split.get("api-v1").is_some_and(|n| *n > 0), "{split:?}");
    assert!(split.get("api-v2").is_some_and(|n| *n > 0), "{split:?}");
    assert_eq!(split.get("api-canary"), None, "{split:?}");
    assert!(!report.by_body.contains_key("api-canary"), "{report}");

    // /debug/sources: no errors, every foreign object skipped (by kind, file:line), and the
    // unsupported filter in the route's status.
    let (_, body) = ballast.get("/debug/sources").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let src = &v["sources"][0];
    assert_eq!(src["errors"], serde_json::json!([]), "{src:#}");
    assert_eq!(src["rejected"], serde_json::json!([]), "{src:#}");
    let mut skipped: Vec<String> = src["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            assert!(s["line"].as_u64().unwrap() > 0, "{s}");
            format!(
                "{} {}",
                s["file"].as_str().unwrap().rsplit('/').next().unwrap(),
                s["kind"].as_str().unwrap()
            )
        })
        .collect();
    skipped.sort();
    assert_eq!(
        skipped,
        [
            "01-envoy-gateway.yaml EnvoyProxy",
            "01-envoy-gateway.yaml GatewayClass",
            "20-policies.yaml BackendTrafficPolicy",
            "20-policies.yaml ClientTrafficPolicy",
            "40-backends.yaml Deployment",
            "40-backends.yaml ServiceAccount",
        ],
        "{src:#}"
    );
    let routes = v["status"]["httpRoutes"].as_array().unwrap();
    let legacy = routes.iter().find(|r| r["name"] == "legacy").unwrap();
    let accepted = &legacy["parents"][0]["conditions"][0];
    assert_eq!(accepted["reason"], "UnsupportedValue", "{legacy:#}");
    assert!(
        accepted["message"].as_str().unwrap().contains("URLRewrite"),
        "{legacy:#}"
    );
    for r in routes.iter().filter(|r| r["name"] != "legacy") {
        for c in r["parents"][0]["conditions"].as_array().unwrap() {
            assert_eq!(c["status"], "True", "{r:#}");
        }
    }
    assert_eq!(
        ballast
            .metric("ballast_source_skipped_objects")
            .await
            .unwrap(),
        6.0
    );
}

const ROUTES: usize = 3400;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_edit_to_one_of_3400_routes_changes_nothing_in_envoy() {
    let ups = [
        Upstream::start("u0").await.unwrap(),
        Upstream::start("u1").await.unwrap(),
    ];
    let addrs: Vec<_> = ups.iter().map(|u| u.addr()).collect();
    let gw_port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("routes.yaml");
    let v1 = many_routes(gw_port, ROUTES, &addrs);
    write_atomic(&file, &v1);
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-3400",
        "default/edge",
        AdsMode::DeltaGrpc,
    ))
    .await
    .unwrap();
    let gw = loopback(gw_port);
    wait_until(T, POLL, || async {
        matches!(
            host_status(gw, &format!("h{}.example.com", ROUTES - 1)).await,
            Ok(200)
        )
    })
    .await
    .unwrap();
    // The edited route is part of the sampled traffic.
    let target = 1700;
    let host = format!("h{target}.example.com");
    let sample: Vec<(String, String)> = (0..ROUTES)
        .step_by(ROUTES / 50)
        .chain([target, target + 1])
        .map(|i| (format!("h{i}.example.com"), "/".to_string()))
        .collect();
    assert!(sample.iter().any(|(h, _)| *h == host));
    let traffic = Traffic::start(TrafficConfig::with_requests(gw, sample).concurrency(2));
    let before = envoy.config_dump(false).await.unwrap();
    assert_eq!(dump_virtual_hosts(&before).len(), ROUTES);
    let responses = ballast.metric("ballast_xds_responses_total").await.unwrap();

    // The new version of the route adds a response header; the bad one also has an invalid
    // timeout value.
    let old = route(&format!("r{target}"), &host, &format!("b{target}"));
    assert!(v1.contains(&old));
    let good = old.clone()
        + "    filters:\n    - type: ResponseHeaderModifier\n      \
           responseHeaderModifier: { set: [{ name: x-route-version, value: \"2\" }] }\n";
    let bad = good.clone() + "    timeouts: { request: 1parsec }\n";
    let v2 = v1.replace(&old, &bad);
    write_atomic(&file, &v2);
    let bad_line = v2
        .lines()
        .position(|l| l == "    timeouts: { request: 1parsec }")
        .unwrap()
        + 1;
    let errors = wait_for(T, POLL, || async {
        let (_, body) = ballast.get("/debug/sources").await?;
        let v: serde_json::Value = serde_json::from_str(&body)?;
        match v["sources"][0]["errors"].as_array() {
            Some(e) if !e.is_empty() => Ok(v["sources"][0].clone()),
            _ => anyhow::bail!("no error yet"),
        }
    })
    .await
    .unwrap();
    let bad_col = "    timeouts: { request: ".len() + 1;
    let at = format!("{}:{bad_line}:{bad_col}: ", file.display());
    let error = errors["errors"][0].as_str().unwrap();
    assert!(
        error.starts_with(&at) && error.contains(&format!("HTTPRoute default/r{target}")),
        "{at} in {errors:#}"
    );
    assert_eq!(errors["errors"].as_array().unwrap().len(), 1, "{errors:#}");
    assert_eq!(errors["rejected"][0]["name"], format!("r{target}"));
    // Let any (wrong) push land before comparing: nothing was sent, nothing changed.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(
        ballast.metric("ballast_xds_responses_total").await.unwrap(),
        responses,
        "a rejected edit sends Envoy nothing"
    );
    let during = envoy.config_dump(false).await.unwrap();
    assert_eq!(
        ballast_testkit::ConfigSummary::from_dump(&before),
        ballast_testkit::ConfigSummary::from_dump(&during)
    );
    for section in [
        "ListenersConfigDump",
        "ClustersConfigDump",
        "RoutesConfigDump",
    ] {
        let text = dump_section(&before, section);
        assert!(!text.is_empty(), "{section} in the dump");
        assert!(
            text == dump_section(&during, section),
            "{section} changed after a rejected edit"
        );
    }
    // Still the last good version: no x-route-version.
    let (code, headers, body) = host_get_with_headers(gw, &host, &[]).await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(
        !headers.iter().any(|(k, _)| k == "x-route-version"),
        "{headers:?}"
    );

    // The fix applies; only that virtual host changed.
    write_atomic(&file, &v1.replace(&old, &good));
    wait_until(T, POLL, || async {
        matches!(host_get_with_headers(gw, &host, &[]).await,
            Ok((200, h, _)) if h.iter().any(|(k, v)| k == "x-route-version" && v == "2"))
    })
    .await
    .unwrap();
    let after = envoy.config_dump(false).await.unwrap();
    for section in ["ListenersConfigDump", "ClustersConfigDump"] {
        assert!(
            dump_section(&before, section) == dump_section(&after, section),
            "{section} changed by a one-route edit"
        );
    }
    // The same comparison sees the route configuration change (new version, one host).
    assert!(dump_section(&before, "RoutesConfigDump") != dump_section(&after, "RoutesConfigDump"));
    assert_eq!(
        ballast_testkit::ConfigSummary::from_dump(&before),
        ballast_testkit::ConfigSummary::from_dump(&after)
    );
    let (vh_before, vh_after) = (dump_virtual_hosts(&before), dump_virtual_hosts(&after));
    let changed: Vec<&String> = vh_before
        .keys()
        .chain(vh_after.keys())
        .filter(|h| vh_before.get(*h) != vh_after.get(*h))
        .collect();
    assert_eq!(changed, [&host, &host]);
    assert_eq!(vh_after.len(), ROUTES);
    let (_, body) = ballast.get("/debug/sources").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["sources"][0]["errors"], serde_json::json!([]));
    let report = traffic.stop().await;
    report.assert_all_ok();
    assert!(report.total > 100, "{report}");
}
