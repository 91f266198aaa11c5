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
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-client-policy",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
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
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-proxy-protocol",
        "default/edge",
        AdsMode::DeltaGrpc,
    ))
    .await
    .unwrap();
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
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-xff",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
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
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-path",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
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
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-connection-limit",
        "default/edge",
        AdsMode::DeltaGrpc,
    ))
    .await
    .unwrap();
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
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-alpn",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
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
