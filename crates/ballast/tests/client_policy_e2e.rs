//! ClientPolicy (issue #11) against real Envoy: frontend mTLS on an HTTPS listener (client
//! certificates verified against a CA from a ConfigMap; a client without one, or with one from
//! another CA, fails the handshake), TLS 1.3 as minimum version, and the certificate details
//! forwarding and client IP settings reaching Envoy's config. Certificates are rcgen-made;
//! the client is curl.

mod common;

use std::path::Path;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, Upstream, wait_for};
use common::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};

struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// A leaf certificate for `san` signed by `ca`: (cert PEM, key PEM).
fn leaf(ca: &Ca, san: &str) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.subject_alt_names = vec![SanType::DnsName(san.try_into().unwrap())];
    params.distinguished_name.push(DnType::CommonName, san);
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// `config` written to a fresh directory, a Ballast serving it (ready), and a real Envoy of
/// Gateway `default/edge` on that Ballast; the directory lives as long as the returned guard.
async fn serve_with_envoy(
    config: &str,
    node: &str,
    ads: AdsMode,
) -> (tempfile::TempDir, Ballast, Envoy) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(ballast.xds, node, "default/edge", ads))
        .await
        .unwrap();
    (dir, ballast, envoy)
}

fn indent(pem: &str) -> String {
    pem.lines().map(|l| format!("    {l}\n")).collect()
}

/// curl over TLS to `secure.example.com` with an optional client certificate; the HTTP status
/// (0 when the TLS handshake or connection failed).
async fn curl(port: u16, dir: &Path, client: Option<&str>, extra: &[&str]) -> u16 {
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args([
        "-sS",
        "-o",
        "/dev/null",
        "--max-time",
        "10",
        "-w",
        "%{http_code}",
    ])
    .args(["--resolve", &format!("secure.example.com:{port}:127.0.0.1")])
    .arg("--cacert")
    .arg(dir.join("server-ca.pem"))
    .args(extra);
    if let Some(c) = client {
        cmd.arg("--cert")
            .arg(dir.join(format!("{c}.crt")))
            .arg("--key")
            .arg(dir.join(format!("{c}.key")));
    }
    let out = cmd
        .arg(format!("https://secure.example.com:{port}/"))
        .output()
        .await
        .expect("run curl");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frontend_mtls_requires_a_client_certificate_from_the_ca() {
    let server_ca = ca("server CA");
    let client_ca = ca("client CA");
    let rogue_ca = ca("rogue CA");
    let (srv_crt, srv_key) = leaf(&server_ca, "secure.example.com");
    let certs = tempfile::tempdir().unwrap();
    std::fs::write(certs.path().join("server-ca.pem"), &server_ca.pem).unwrap();
    for (name, ca) in [("client", &client_ca), ("rogue", &rogue_ca)] {
        let (c, k) = leaf(ca, "client.example.com");
        std::fs::write(certs.path().join(format!("{name}.crt")), c).unwrap();
        std::fs::write(certs.path().join(format!("{name}.key")), k).unwrap();
    }
    let up = Upstream::start("app").await.unwrap();
    let port = ballast_testkit::free_port();
    let config = format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - name: secure
    port: {port}
    protocol: HTTPS
    hostname: secure.example.com
    tls: {{ certificateRefs: [{{ name: secure-tls }}] }}
---
apiVersion: v1
kind: Secret
metadata: {{ name: secure-tls }}
type: kubernetes.io/tls
stringData:
  tls.crt: |
{}  tls.key: |
{}---
apiVersion: v1
kind: ConfigMap
metadata: {{ name: client-ca }}
data:
  ca.crt: |
{}---
apiVersion: ballast.dev/v1alpha1
kind: ClientPolicy
metadata: {{ name: secure-clients }}
spec:
  targetRefs: [{{ group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: secure }}]
  clientIPDetection: {{ xForwardedFor: {{ numTrustedHops: 1 }} }}
  timeout: {{ requestTimeout: 10s, idleTimeout: 60s }}
  maxRequestHeadersKb: 32
  tls:
    minVersion: \"1.3\"
    clientValidation:
      caCertificateRefs: [{{ kind: ConfigMap, name: client-ca }}]
      forwardClientCertificate: true
",
        indent(&srv_crt),
        indent(&srv_key),
        indent(&client_ca.pem)
    ) + &route("app", "secure.example.com", "app")
        + &backend("app", &[up.addr()]);
    let (_dir, _ballast, envoy) =
        serve_with_envoy(&config, "envoy-client-policy", AdsMode::Grpc).await;
    let p = certs.path();
    wait_for(T, POLL, || async {
        match curl(port, p, Some("client"), &[]).await {
            200 => Ok(()),
            c => anyhow::bail!("client with certificate: {c}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
    assert_eq!(
        curl(port, p, None, &[]).await,
        0,
        "no client certificate: handshake fails"
    );
    assert_eq!(
        curl(port, p, Some("rogue"), &[]).await,
        0,
        "certificate from another CA: fails"
    );
    assert_eq!(
        curl(port, p, Some("client"), &["--tls-max", "1.2"]).await,
        0,
        "TLS 1.2 is below the policy's minimum"
    );
    assert_eq!(curl(port, p, Some("client"), &[]).await, 200);
    let dump = envoy.config_dump(false).await.unwrap().to_string();
    for needle in [
        "\"forward_client_cert_details\":\"SANITIZE_SET\"",
        "\"xff_num_trusted_hops\":1",
        "\"max_request_headers_kb\":32",
        "\"require_client_certificate\":true",
    ] {
        assert!(dump.contains(needle), "{needle} in Envoy's config");
    }
}

/// Raw request bytes to `addr`: the response's status (0 when the connection closed without
/// an HTTP response).
async fn raw_status(addr: std::net::SocketAddr, bytes: &[u8]) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return 0;
    };
    if s.write_all(bytes).await.is_err() {
        return 0;
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out)
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// `enableProxyProtocol`: a connection starting with a PROXY v1 header is served; one without
/// is closed, because Envoy then expects the header first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_protocol_listener_requires_the_header() {
    let up = Upstream::start("app").await.unwrap();
    let port = ballast_testkit::free_port();
    let config = gateway(port)
        + &route("app", "app.example.com", "app")
        + &backend("app", &[up.addr()])
        + "---
apiVersion: ballast.dev/v1alpha1
kind: ClientPolicy
metadata: { name: behind-lb }
spec:
  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }]
  enableProxyProtocol: true
";
    let (_dir, _ballast, envoy) =
        serve_with_envoy(&config, "envoy-proxy-protocol", AdsMode::DeltaGrpc).await;
    let addr = loopback(port);
    let request = "GET / HTTP/1.1\r\nHost: app.example.com\r\nConnection: close\r\n\r\n";
    let with_header = format!("PROXY TCP4 203.0.113.7 127.0.0.1 40000 {port}\r\n{request}");
    wait_for(T, POLL, || async {
        match raw_status(addr, with_header.as_bytes()).await {
            200 => Ok(()),
            c => anyhow::bail!("with PROXY header: {c}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
    assert_eq!(
        raw_status(addr, request.as_bytes()).await,
        0,
        "without the PROXY header the connection is refused"
    );
    assert_eq!(raw_status(addr, with_header.as_bytes()).await, 200);
}

/// `clientIPDetection.xForwardedFor.numTrustedHops: 1`: Envoy trusts one proxy in front of it,
/// so the client address is the second-rightmost X-Forwarded-For entry (sent to the backend
/// as `x-envoy-external-address`), not the spoofable leftmost one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_hops_pick_the_client_address() {
    let up = Upstream::start("app").await.unwrap();
    let port = ballast_testkit::free_port();
    let config = gateway(port)
        + &route("app", "app.example.com", "app")
        + &backend("app", &[up.addr()])
        + "---
apiVersion: ballast.dev/v1alpha1
kind: ClientPolicy
metadata: { name: one-lb }
spec:
  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: http }]
  clientIPDetection: { xForwardedFor: { numTrustedHops: 1 } }
";
    let (_dir, _ballast, envoy) = serve_with_envoy(&config, "envoy-xff", AdsMode::Grpc).await;
    let request = "GET / HTTP/1.1\r\nHost: app.example.com\r\nX-Forwarded-For: 198.51.100.9, 203.0.113.5\r\nConnection: close\r\n\r\n";
    wait_for(T, POLL, || async {
        match raw_status(loopback(port), request.as_bytes()).await {
            200 if up.last_header("x-envoy-external-address").is_some() => Ok(()),
            c => anyhow::bail!("status {c}, headers not yet from the policy"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
    assert_eq!(
        up.last_header("x-envoy-external-address").as_deref(),
        Some("203.0.113.5")
    );
    // Envoy appends the peer it saw; the client's entries are passed on unchanged.
    let xff = up.last_header("x-forwarded-for").unwrap_or_default();
    assert!(xff.starts_with("198.51.100.9, 203.0.113.5,"), "{xff}");
}

/// A Gateway with three HTTP listeners (`merge`, `keep`, `plain`) and one route for prefix
/// `/a/b` to `backend` on all of them.
fn three_listeners(ports: [u16; 3], backend_name: &str) -> String {
    let [m, k, p] = ports;
    format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - {{ name: merge, port: {m}, protocol: HTTP }}
  - {{ name: keep, port: {k}, protocol: HTTP }}
  - {{ name: plain, port: {p}, protocol: HTTP }}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: ab }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [app.example.com]
  rules:
  - matches: [{{ path: {{ type: PathPrefix, value: /a/b }} }}]
    backendRefs: [{{ group: ballast.dev, kind: Backend, name: {backend_name} }}]
"
    )
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: app.example.com\r\nConnection: close\r\n\r\n")
}

/// `path`: with merging on (`path: {}` defaults), `/a//b` reaches the `/a/b` rule and `%2F`
/// gets 400 under `RejectRequest` without reaching the backend; with `disableMergeSlashes`
/// `/a//b` matches nothing (404) and `UnescapeAndForward` routes `/a%2Fb` as `/a/b`; a
/// listener without the policy keeps Envoy's defaults (404 for both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_options_merge_slashes_and_handle_escaped_slashes() {
    let up = Upstream::start("app").await.unwrap();
    let ports = [
        ballast_testkit::free_port(),
        ballast_testkit::free_port(),
        ballast_testkit::free_port(),
    ];
    let config = three_listeners(ports, "app")
        + &backend("app", &[up.addr()])
        + "---
apiVersion: ballast.dev/v1alpha1
kind: ClientPolicy
metadata: { name: merge }
spec:
  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: merge }]
  path: { escapedSlashesAction: RejectRequest }
---
apiVersion: ballast.dev/v1alpha1
kind: ClientPolicy
metadata: { name: keep }
spec:
  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: keep }]
  path: { disableMergeSlashes: true, escapedSlashesAction: UnescapeAndForward }
";
    let (_dir, _ballast, envoy) = serve_with_envoy(&config, "envoy-path", AdsMode::Grpc).await;
    let [merge, keep, plain] = ports.map(loopback);
    wait_for(T, POLL, || async {
        for a in [merge, keep, plain] {
            match raw_status(a, get("/a/b").as_bytes()).await {
                200 => {}
                c => anyhow::bail!("{a}: /a/b gave {c}"),
            }
        }
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
    let hits = up.hits();
    assert_eq!(raw_status(merge, get("/a//b").as_bytes()).await, 200);
    assert_eq!(raw_status(merge, get("/a%2Fb").as_bytes()).await, 400);
    assert_eq!(raw_status(merge, get("/a%2fb").as_bytes()).await, 400);
    assert_eq!(
        up.hits(),
        hits + 1,
        "rejected requests never reach the backend"
    );
    assert_eq!(raw_status(keep, get("/a//b").as_bytes()).await, 404);
    assert_eq!(raw_status(keep, get("/a%2Fb").as_bytes()).await, 200);
    assert_eq!(raw_status(plain, get("/a//b").as_bytes()).await, 404);
    assert_eq!(raw_status(plain, get("/a%2Fb").as_bytes()).await, 404);
    assert_eq!(up.hits(), hits + 2);
}

/// Sends one keep-alive request on a fresh connection and returns the connection with the
/// response's status (0: closed without an HTTP response).
async fn held(addr: std::net::SocketAddr) -> (Option<tokio::net::TcpStream>, u16) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return (None, 0);
    };
    let req = "GET / HTTP/1.1\r\nHost: app.example.com\r\n\r\n";
    if s.write_all(req.as_bytes()).await.is_err() {
        return (None, 0);
    }
    let mut buf = vec![0u8; 4096];
    let n = match tokio::time::timeout(std::time::Duration::from_secs(10), s.read(&mut buf)).await {
        Ok(Ok(n)) => n,
        _ => 0,
    };
    let status = String::from_utf8_lossy(&buf[..n])
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (Some(s), status)
}

/// `connection.connectionLimit.value: 2`: while two client connections are open a third is
/// closed without a response (and counted in `limited_connections`); once one of the two
/// closes, a new connection is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limit_closes_connections_over_the_limit() {
    let up = Upstream::start("app").await.unwrap();
    let port = ballast_testkit::free_port();
    let config = gateway(port)
        + &route("app", "app.example.com", "app")
        + &backend("app", &[up.addr()])
        + "---
apiVersion: ballast.dev/v1alpha1
kind: ClientPolicy
metadata: { name: limited }
spec:
  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }]
  connection: { connectionLimit: { value: 2 } }
";
    let (_dir, _ballast, envoy) =
        serve_with_envoy(&config, "envoy-connection-limit", AdsMode::DeltaGrpc).await;
    let addr = loopback(port);
    // Hold two connections, each proven open by a 200 on it (retried while config arrives
    // and while earlier probe connections are still being counted down).
    let stat = format!("connection_limit.default_edge_{port}.limited_connections");
    let mut open = Vec::new();
    while open.len() < 2 {
        let n = open.len();
        let s = wait_for(T, POLL, || async {
            match held(addr).await {
                (Some(s), 200) => Ok(s),
                (_, c) => anyhow::bail!("held connection {n}: {c}"),
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
        open.push(s);
    }
    let limited_before = envoy.stat(&stat).await.unwrap().unwrap_or(0);
    // The third concurrent connection is closed without an answer, every time.
    for _ in 0..3 {
        let (_, status) = held(addr).await;
        assert_eq!(status, 0, "connection over the limit is served");
    }
    let limited = envoy.stat(&stat).await.unwrap().unwrap_or(0);
    assert_eq!(limited, limited_before + 3, "three connections limited");
    // Closing one frees a slot.
    drop(open.pop());
    wait_for(T, POLL, || async {
        match held(addr).await {
            (Some(_), 200) => Ok(()),
            (_, c) => anyhow::bail!("after closing one: {c}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
}

/// curl `--http2` over TLS to `secure.example.com`: (status, negotiated HTTP version).
async fn curl_version(port: u16, dir: &Path) -> (u16, String) {
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--http2", "-o", "/dev/null", "--max-time", "10"])
        .args(["-w", "%{http_code} %{http_version}"])
        .args(["--resolve", &format!("secure.example.com:{port}:127.0.0.1")])
        .arg("--cacert")
        .arg(dir.join("server-ca.pem"))
        .arg(format!("https://secure.example.com:{port}/"))
        .output()
        .await
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut parts = text.split_whitespace();
    let code = parts.next().and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, parts.next().unwrap_or_default().to_owned())
}

/// `tls.alpnProtocols: [http/1.1]` turns HTTP/2 off on one HTTPS listener (curl `--http2`
/// gets HTTP/1.1) while a listener with `http2` settings negotiates h2, and its
/// `maxConcurrentStreams` and window sizes reach Envoy's connection manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alpn_turns_http2_off_and_http2_settings_reach_envoy() {
    let server_ca = ca("server CA");
    let (srv_crt, srv_key) = leaf(&server_ca, "secure.example.com");
    let certs = tempfile::tempdir().unwrap();
    std::fs::write(certs.path().join("server-ca.pem"), &server_ca.pem).unwrap();
    let up = Upstream::start("app").await.unwrap();
    let (h2_port, h1_port) = (ballast_testkit::free_port(), ballast_testkit::free_port());
    let config = format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - {{ name: h2, port: {h2_port}, protocol: HTTPS, hostname: secure.example.com, tls: {{ certificateRefs: [{{ name: secure-tls }}] }} }}
  - {{ name: h1, port: {h1_port}, protocol: HTTPS, hostname: secure.example.com, tls: {{ certificateRefs: [{{ name: secure-tls }}] }} }}
---
apiVersion: v1
kind: Secret
metadata: {{ name: secure-tls }}
type: kubernetes.io/tls
stringData:
  tls.crt: |
{}  tls.key: |
{}---
apiVersion: ballast.dev/v1alpha1
kind: ClientPolicy
metadata: {{ name: h2-tuned }}
spec:
  targetRefs: [{{ group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: h2 }}]
  http2: {{ maxConcurrentStreams: 5, initialStreamWindowSize: 128Ki, initialConnectionWindowSize: 1Mi }}
---
apiVersion: ballast.dev/v1alpha1
kind: ClientPolicy
metadata: {{ name: h1-only }}
spec:
  targetRefs: [{{ group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: h1 }}]
  tls: {{ alpnProtocols: [http/1.1] }}
",
        indent(&srv_crt),
        indent(&srv_key),
    ) + &route("app", "secure.example.com", "app")
        + &backend("app", &[up.addr()]);
    let (_dir, _ballast, envoy) = serve_with_envoy(&config, "envoy-alpn", AdsMode::Grpc).await;
    let p = certs.path();
    wait_for(T, POLL, || async {
        for port in [h2_port, h1_port] {
            match curl_version(port, p).await {
                (200, _) => {}
                (c, _) => anyhow::bail!("port {port}: {c}"),
            }
        }
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
    assert_eq!(curl_version(h2_port, p).await, (200, "2".to_owned()));
    assert_eq!(curl_version(h1_port, p).await, (200, "1.1".to_owned()));
    let dump = envoy.config_dump(false).await.unwrap().to_string();
    for needle in [
        "\"max_concurrent_streams\":5",
        "\"initial_stream_window_size\":131072",
        "\"initial_connection_window_size\":1048576",
    ] {
        assert!(dump.contains(needle), "{needle} in Envoy's config");
    }
}

/// curl over TLS (HTTP/1.1) to `secure.example.com`: (status, the `alt-svc` header if any).
async fn curl_alt_svc(port: u16, dir: &Path) -> (u16, Option<String>) {
    let out = tokio::process::Command::new("curl")
        .args([
            "-sS",
            "--http1.1",
            "-o",
            "/dev/null",
            "-D",
            "-",
            "--max-time",
            "10",
        ])
        .args(["--resolve", &format!("secure.example.com:{port}:127.0.0.1")])
        .arg("--cacert")
        .arg(dir.join("server-ca.pem"))
        .arg(format!("https://secure.example.com:{port}/"))
        .output()
        .await
        .expect("run curl");
    let head = String::from_utf8_lossy(&out.stdout).into_owned();
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let alt_svc = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("alt-svc")
            .then(|| v.trim().to_owned())
    });
    (status, alt_svc)
}

/// A second Envoy as a real HTTP/3 client: its plain HTTP listener (port 0) forwards every
/// request over QUIC (HTTP/3 only, no fallback) to `gateway`, trusting `ca_pem` for SNI
/// `secure.example.com`.
fn http3_client_bootstrap(gateway: std::net::SocketAddr, ca_pem: &str) -> String {
    let addr = |ip: String, port: u16| serde_json::json!({ "socket_address": { "address": ip, "port_value": port } });
    let v = serde_json::json!({
        "node": { "id": "h3-client", "cluster": "h3-client" },
        "admin": { "address": addr("127.0.0.1".into(), 0) },
        "static_resources": {
            "listeners": [{
                "name": "ingress",
                "address": addr("127.0.0.1".into(), 0),
                "filter_chains": [{ "filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "client",
                        "route_config": { "virtual_hosts": [{
                            "name": "all", "domains": ["*"],
                            "routes": [{ "match": { "prefix": "/" }, "route": { "cluster": "gateway_h3" } }],
                        }] },
                        "http_filters": [{
                            "name": "envoy.filters.http.router",
                            "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" },
                        }],
                    },
                }] }],
            }],
            "clusters": [{
                "name": "gateway_h3",
                "type": "STATIC",
                "connect_timeout": "5s",
                "load_assignment": {
                    "cluster_name": "gateway_h3",
                    "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": addr(gateway.ip().to_string(), gateway.port()) } }] }],
                },
                "typed_extension_protocol_options": {
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": { "http3_protocol_options": {} },
                    },
                },
                "transport_socket": {
                    "name": "envoy.transport_sockets.quic",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.quic.v3.QuicUpstreamTransport",
                        "upstream_tls_context": {
                            "sni": "secure.example.com",
                            "common_tls_context": { "validation_context": {
                                "trusted_ca": { "inline_string": ca_pem },
                                "match_typed_subject_alt_names": [{ "san_type": "DNS", "matcher": { "exact": "secure.example.com" } }],
                            } },
                        },
                    },
                },
            }],
        },
    });
    serde_json::to_string_pretty(&v).unwrap()
}

/// ClientPolicy `http3: {}` on an HTTPS listener: Envoy serves HTTP/3 on the same port over
/// UDP and TCP responses advertise it. The HTTP/3 client is a second Envoy speaking only
/// HTTP/3 upstream: N requests through it are N 200s that the gateway Envoy counts as HTTP/3.
/// A policy asking for HTTP/3 on a plain-HTTP listener is `Accepted=False Invalid`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http3_is_served_over_quic_and_advertised_over_tcp() {
    const N: u64 = 25;
    let server_ca = ca("server CA");
    let (srv_crt, srv_key) = leaf(&server_ca, "secure.example.com");
    let certs = tempfile::tempdir().unwrap();
    std::fs::write(certs.path().join("server-ca.pem"), &server_ca.pem).unwrap();
    let up = Upstream::start("app").await.unwrap();
    let port = ballast_testkit::free_port();
    let plain = ballast_testkit::free_port();
    let config = format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - name: secure
    port: {port}
    protocol: HTTPS
    hostname: secure.example.com
    tls: {{ certificateRefs: [{{ name: secure-tls }}] }}
  - {{ name: plain, port: {plain}, protocol: HTTP }}
---
apiVersion: v1
kind: Secret
metadata: {{ name: secure-tls }}
type: kubernetes.io/tls
stringData:
  tls.crt: |
{}  tls.key: |
{}---
apiVersion: ballast.dev/v1alpha1
kind: ClientPolicy
metadata: {{ name: h3 }}
spec:
  targetRefs: [{{ group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: secure }}]
  http3: {{}}
---
apiVersion: ballast.dev/v1alpha1
kind: ClientPolicy
metadata: {{ name: h3-plain }}
spec:
  targetRefs: [{{ group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: plain }}]
  http3: {{}}
",
        indent(&srv_crt),
        indent(&srv_key),
    ) + &route("app", "secure.example.com", "app")
        + &backend("app", &[up.addr()]);
    let (_dir, ballast, envoy) = serve_with_envoy(&config, "envoy-http3", AdsMode::Grpc).await;
    let p = certs.path();
    let (status, alt_svc) = wait_for(T, POLL, || async {
        match curl_alt_svc(port, p).await {
            (200, a) => Ok((200, a)),
            (c, _) => anyhow::bail!("HTTPS over TCP: {c}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
    assert_eq!(status, 200);
    assert_eq!(
        alt_svc.as_deref(),
        Some(format!("h3=\":{port}\"; ma=86400").as_str()),
        "TCP responses advertise HTTP/3 on the same port"
    );
    let listeners = envoy.listener_addrs().await.unwrap();
    assert!(
        listeners.contains_key(&format!("default/edge/{port}/udp")),
        "{listeners:?}"
    );

    let client = Envoy::start_bootstrap(&http3_client_bootstrap(loopback(port), &server_ca.pem))
        .await
        .unwrap();
    let client_addr = wait_for(T, POLL, || async {
        client
            .listener_addrs()
            .await?
            .get("ingress")
            .copied()
            .ok_or_else(|| anyhow::anyhow!("client listener not up"))
    })
    .await
    .unwrap();
    wait_for(T, POLL, || async {
        match host_status(client_addr, "secure.example.com").await? {
            200 => Ok(()),
            c => anyhow::bail!("over HTTP/3: {c}"),
        }
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e:#}\nclient:\n{}\ngateway:\n{}",
            client.log_tail(30),
            envoy.log_tail(30)
        )
    });
    let prefix = format!("http.default_edge_{port}");
    let h3_requests = || async {
        envoy
            .stat(&format!("{prefix}.downstream_rq_http3_total"))
            .await
            .unwrap()
            .unwrap_or(0)
    };
    let before = h3_requests().await;
    let mut statuses = Vec::new();
    for _ in 0..N {
        statuses.push(
            host_status(client_addr, "secure.example.com")
                .await
                .unwrap(),
        );
    }
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    // Stats are flushed to the admin endpoint as they happen; poll briefly for the last ones.
    let counted = wait_for(T, POLL, || async {
        let n = h3_requests().await - before;
        if n >= N {
            Ok(n)
        } else {
            anyhow::bail!("{n} of {N} counted as HTTP/3")
        }
    })
    .await
    .unwrap();
    assert_eq!(counted, N, "every request reached the gateway over HTTP/3");
    assert!(
        envoy
            .stat(&format!("{prefix}.downstream_cx_http3_total"))
            .await
            .unwrap()
            .is_some_and(|n| n >= 1)
    );
    // The client Envoy spoke HTTP/3 upstream, and only that.
    assert_eq!(
        client
            .stat("cluster.gateway_h3.upstream_cx_http3_total")
            .await
            .unwrap()
            .map(|n| n >= 1),
        Some(true)
    );

    // HTTP/3 on the plain listener is refused in status, and nothing listens on its UDP port.
    let (code, sources) = ballast.get("/debug/sources").await.unwrap();
    assert_eq!(code, 200);
    assert!(
        sources.contains("Invalid")
            && sources.contains("needs an HTTPS listener; listener \\\"plain\\\" is HTTP"),
        "{sources}"
    );
    assert!(!listeners.contains_key(&format!("default/edge/{plain}/udp")));
}

/// ClientPolicy `http1.http10`: an HTTP/1.0 request without `Host` is answered 200 on a
/// listener with `useDefaultHost` (the listener's hostname routes it), 400 with `http10`
/// but no default host, and 426 (Upgrade Required) without the policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http10_requests_get_the_default_host() {
    let up = Upstream::start("app").await.unwrap();
    let raw = RawBackend::start().await;
    let ports = [
        ballast_testkit::free_port(),
        ballast_testkit::free_port(),
        ballast_testkit::free_port(),
    ];
    let config = format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - {{ name: default-host, port: {}, protocol: HTTP, hostname: app.example.com }}
  - {{ name: http10, port: {}, protocol: HTTP, hostname: app.example.com }}
  - {{ name: none, port: {}, protocol: HTTP, hostname: app.example.com }}
---
apiVersion: ballast.dev/v1alpha1
kind: ClientPolicy
metadata: {{ name: default-host }}
spec:
  targetRefs: [{{ group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: default-host }}]
  http1: {{ enableTrailers: true, preserveHeaderCase: true, http10: {{ useDefaultHost: true }} }}
---
apiVersion: ballast.dev/v1alpha1
kind: ClientPolicy
metadata: {{ name: http10 }}
spec:
  targetRefs: [{{ group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: http10 }}]
  http1: {{ http10: {{}} }}
",
        ports[0], ports[1], ports[2]
    ) + &route("app", "app.example.com", "app")
        + &backend("app", &[up.addr()])
        + "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: { name: case }
spec:
  parentRefs: [{ name: edge }]
  hostnames: [app.example.com]
  rules:
  - matches: [{ path: { type: PathPrefix, value: /case } }]
    backendRefs: [{ group: ballast.dev, kind: Backend, name: raw }]
"
        + &backend("raw", &[raw.addr]);
    let (_dir, _ballast, envoy) =
        serve_with_envoy(&config, "envoy-http10", AdsMode::DeltaGrpc).await;
    let http10 = b"GET / HTTP/1.0\r\n\r\n";
    let http11 = b"GET / HTTP/1.1\r\nHost: app.example.com\r\nConnection: close\r\n\r\n";
    for p in ports {
        wait_for(T, POLL, || async {
            match raw_status(loopback(p), http11).await {
                200 => Ok(()),
                c => anyhow::bail!("HTTP/1.1 on {p}: {c}"),
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
    }
    let before = up.hits();
    let mut got = Vec::new();
    for p in ports {
        got.push(raw_status(loopback(p), http10).await);
    }
    assert_eq!(
        got,
        [200, 400, 426],
        "HTTP/1.0 without Host: default host, accepted without one, not accepted"
    );
    assert_eq!(up.hits(), before + 1, "only the 200 reached the backend");
    // preserveHeaderCase: the backend gets the header name as the client wrote it.
    let mixed = b"GET /case HTTP/1.1\r\nHost: app.example.com\r\nX-MiXeD-Case: 1\r\nConnection: close\r\n\r\n";
    assert_eq!(raw_status(loopback(ports[0]), mixed).await, 200);
    let seen = raw.last();
    assert!(seen.contains("\r\nX-MiXeD-Case: 1\r\n"), "{seen}");
    assert_eq!(raw_status(loopback(ports[2]), mixed).await, 200);
    let seen = raw.last();
    assert!(
        seen.contains("\r\nx-mixed-case: 1\r\n"),
        "without the policy: {seen}"
    );
}

/// A backend that records each request head as received on the wire (header name case
/// included, which HTTP libraries normalise away) and answers 200.
struct RawBackend {
    addr: std::net::SocketAddr,
    heads: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RawBackend {
    async fn start() -> RawBackend {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let h = heads.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let h = h.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    // One request per connection: read the head, answer, close.
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 65536 {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    h.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&buf).into_owned());
                    let _ = s
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                });
            }
        });
        RawBackend { addr, heads, task }
    }

    fn last(&self) -> String {
        self.heads
            .lock()
            .unwrap()
            .last()
            .cloned()
            .unwrap_or_default()
    }
}

impl Drop for RawBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}
