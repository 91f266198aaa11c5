//! Security with real Envoy (issue 9): the three-command mTLS set-up
//! (`ballast certs init`, `certs issue`, `bootstrap --tls-dir`), SotW and
//! Delta over mTLS with traffic and zero non-2xx, a wrong-gateway
//! certificate refused (visible in /debug/proxies, `ballast status` and a
//! metric), server certificate rotation under traffic; and the start-up
//! refusals and admin token of `ballast serve`.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ballast_testkit::{
    Envoy, EnvoyOptions, TcpProxy, Traffic, TrafficConfig, Upstream, wait_until,
};
use ballast_xds::security::PeerIdentity;
use common::*;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;

fn ballast_ok(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args(args)
        .output()
        .expect("run ballast");
    assert!(
        out.status.success(),
        "ballast {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn two_gateways(
    port_a: u16,
    port_b: u16,
    upstream: SocketAddr,
    extra_host: Option<&str>,
) -> String {
    let gw = |name: &str, port: u16| {
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: {name} }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - {{ name: http, port: {port}, protocol: HTTP }}
"
        )
    };
    let route = |name: &str, gw: &str, host: &str| {
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name} }}
spec:
  parentRefs: [{{ name: {gw} }}]
  hostnames: [{host}]
  rules:
  - backendRefs: [{{ group: ballast.dev, kind: Backend, name: app }}]
"
        )
    };
    let mut s = gw("edge", port_a) + &gw("edge2", port_b);
    s += &route("ra", "edge", "a.example.com");
    s += &route("rb", "edge2", "b.example.com");
    if let Some(h) = extra_host {
        s += &route("ra2", "edge", h);
    }
    s + "---\n" + &backend("app", &[upstream])
}

/// The serial of the certificate the xDS port presents to a new connection,
/// and whether an mTLS client with `client` gets through the handshake.
async fn xds_server_serial(addr: SocketAddr, dir: &Path, gateway: &str) -> anyhow::Result<String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(dir.join("ca.pem"))?)?;
    let cert = CertificateDer::from_pem_file(dir.join(format!("gateway-{gateway}.pem")))?;
    let key = PrivateKeyDer::from_pem_file(dir.join(format!("gateway-{gateway}-key.pem")))?;
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(vec![cert], key)?;
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    let der = &tls.get_ref().1.peer_certificates().unwrap()[0];
    Ok(PeerIdentity::from_der(der)?.serial)
}

fn serial_of(path: &Path) -> String {
    PeerIdentity::from_der(&CertificateDer::from_pem_file(path).unwrap())
        .unwrap()
        .serial
}

/// mTLS end to end: SotW and Delta Envoys each with their gateway's
/// certificate are served and carry traffic with zero non-2xx; an Envoy
/// with edge2's certificate claiming `edge` is refused (PERMISSION_DENIED:
/// never configured, listed as denied, counted); the server certificate is
/// rotated under traffic, Envoy's reconnection (cut by a TCP proxy) gets the
/// new serial and a config change made after it still arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_envoys_sotw_and_delta_rotation_and_wrong_gateway() {
    let up = Upstream::start("app").await.unwrap();
    let certs = tempfile::tempdir().unwrap();
    let dir = certs.path();
    ballast_ok(&["certs", "init", p(dir)]);
    ballast_ok(&["certs", "issue", "--gateway", "edge", p(dir)]);
    ballast_ok(&["certs", "issue", "--gateway", "default/edge2", p(dir)]);

    let (port_a, port_b) = (ballast_testkit::free_port(), ballast_testkit::free_port());
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = cfg_dir.path().join("gw.yaml");
    write_atomic(&cfg, &two_gateways(port_a, port_b, up.addr(), None));
    let ballast = Ballast::start(
        free_addr(),
        free_addr(),
        &[
            "--config",
            p(&cfg),
            "--xds-tls-cert",
            p(&dir.join("server.pem")),
            "--xds-tls-key",
            p(&dir.join("server-key.pem")),
            "--xds-client-ca",
            p(&dir.join("ca.pem")),
        ],
    )
    .unwrap();
    ballast.wait_ready().await.unwrap();
    // Envoy A (SotW) reaches the xDS port through a TCP proxy we can cut.
    let proxy = TcpProxy::start(vec![ballast.xds]).await.unwrap();
    let bootstrap = |gw: &str, xds: SocketAddr, delta: bool| {
        let xds = xds.to_string();
        let mut args = vec![
            "bootstrap",
            "--gateway",
            gw,
            "--xds-addr",
            &xds,
            "--envoy-admin-port",
            "0",
            "--tls-dir",
            p(dir),
        ];
        if delta {
            args.push("--delta");
        }
        ballast_ok(&args)
    };
    let yaml_a = bootstrap("edge", proxy.addr(), false);
    assert!(
        yaml_a.contains("UpstreamTlsContext") && yaml_a.contains("gateway-default-edge.pem"),
        "{yaml_a}"
    );
    let envoy_a = Envoy::start_with(&yaml_a, &EnvoyOptions::default())
        .await
        .unwrap();
    let envoy_b = Envoy::start_with(
        &bootstrap("default/edge2", ballast.xds, true),
        &EnvoyOptions::default(),
    )
    .await
    .unwrap();
    // Edge2's certificate, claiming gateway edge.
    let hostile = bootstrap("default/edge2", ballast.xds, false)
        .replace("cluster: default/edge2", "cluster: default/edge")
        .replace("id: envoy-default-edge2", "id: envoy-impostor");
    assert!(hostile.contains("envoy-impostor"), "{hostile}");
    let envoy_bad = Envoy::start_with(&hostile, &EnvoyOptions::default())
        .await
        .unwrap();

    let (gw_a, gw_b) = (loopback(port_a), loopback(port_b));
    for (gw, host, envoy) in [
        (gw_a, "a.example.com", &envoy_a),
        (gw_b, "b.example.com", &envoy_b),
    ] {
        wait_until(T, POLL, || async {
            matches!(host_status(gw, host).await, Ok(200))
        })
        .await
        .unwrap_or_else(|e| panic!("{host}: {e:#}\n{}", envoy.log_tail(30)));
    }
    // Each Envoy is served its own gateway only (B has no route for a.example.com).
    assert_eq!(host_status(gw_b, "a.example.com").await.unwrap(), 404);

    // The impostor: refused, counted, listed; it never gets a listener.
    wait_until(T, POLL, || async {
        ballast
            .metric("ballast_xds_denied_total")
            .await
            .unwrap_or(0.0)
            >= 1.0
    })
    .await
    .unwrap();
    let (_, proxies) = ballast.get("/debug/proxies").await.unwrap();
    let v: Value = serde_json::from_str(&proxies).unwrap();
    let denied = v["rejected"].as_array().unwrap();
    assert!(
        denied.iter().any(|r| r["node"] == "envoy-impostor"
            && r["message"] == "identity spiffe://ballast.local/ns/default/gw/edge2 may not be served default/edge"),
        "{proxies}"
    );
    assert!(
        !v["proxies"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["node"] == "envoy-impostor"),
        "{proxies}"
    );
    let status = ballast_ok(&["status", "--admin-addr", &ballast.admin.to_string()]);
    assert!(
        status
            .contains("DENIED envoy-impostor: identity spiffe://ballast.local/ns/default/gw/edge2"),
        "{status}"
    );
    let dump = envoy_bad.config_dump(false).await.unwrap().to_string();
    assert!(
        !dump.contains("a.example.com") && !dump.contains(&port_a.to_string()),
        "impostor configured: {dump}"
    );

    // Traffic through both while the server certificate rotates.
    let traffic_a =
        Traffic::start(TrafficConfig::new(gw_a, "a.example.com", "/").keep_alive(false));
    let traffic_b =
        Traffic::start(TrafficConfig::new(gw_b, "b.example.com", "/").keep_alive(false));
    let before = serial_of(&dir.join("server.pem"));
    assert_eq!(
        xds_server_serial(ballast.xds, dir, "default-edge")
            .await
            .unwrap(),
        before
    );
    ballast_ok(&["certs", "server", p(dir)]);
    let after = serial_of(&dir.join("server.pem"));
    assert_ne!(before, after);
    assert_eq!(
        xds_server_serial(ballast.xds, dir, "default-edge")
            .await
            .unwrap(),
        after
    );
    // Envoy A's xDS connection is cut: it reconnects and handshakes with the new certificate.
    let accepted = proxy.connections_accepted();
    assert!(proxy.cut_all() >= 1);
    wait_until(T, POLL, || async {
        proxy.connections_accepted() > accepted
    })
    .await
    .unwrap();
    // A change after the reconnection reaches Envoy A (it is served over the new certificate).
    write_atomic(
        &cfg,
        &two_gateways(port_a, port_b, up.addr(), Some("a2.example.com")),
    );
    wait_until(T, POLL, || async {
        matches!(host_status(gw_a, "a2.example.com").await, Ok(200))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy_a.log_tail(30)));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (ra, rb) = (traffic_a.stop().await, traffic_b.stop().await);
    ra.assert_all_ok();
    rb.assert_all_ok();
    eprintln!("traffic A: {} ok, B: {} ok", ra.ok_2xx, rb.ok_2xx);
    let log = std::fs::read_to_string(&ballast.log).unwrap();
    assert!(
        log.contains("new connections get the new certificate"),
        "rotation logged"
    );
}

fn tls_secret_config(port: u16, key_pem: &str, cert_pem: &str) -> String {
    let indent = |s: &str| s.lines().map(|l| format!("    {l}\n")).collect::<String>();
    format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - name: https
    port: {port}
    protocol: HTTPS
    hostname: a.example.com
    tls: {{ certificateRefs: [{{ kind: Secret, name: a-tls }}] }}
---
apiVersion: v1
kind: Secret
metadata: {{ name: a-tls }}
type: kubernetes.io/tls
stringData:
  tls.crt: |
{}  tls.key: |
{}",
        indent(cert_pem),
        indent(key_pem)
    )
}

fn self_signed() -> (String, String) {
    let c = rcgen::generate_simple_self_signed(vec!["a.example.com".to_string()]).unwrap();
    (c.cert.pem(), c.signing_key.serialize_pem())
}

/// `ballast serve` refuses plaintext xDS off loopback when the config has a
/// TLS secret (and says why), and an admin API off loopback without a token.
#[test]
fn refuses_to_start_insecure_off_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(
        &cfg,
        tls_secret_config(ballast_testkit::free_port(), &key, &cert),
    )
    .unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ballast"))
            .arg("serve")
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&[
        "--config",
        p(&cfg),
        "--xds-addr",
        "0.0.0.0:0",
        "--admin-addr",
        "127.0.0.1:0",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("refusing to serve xDS on 0.0.0.0:0 without mTLS")
            && err.contains("default/a-tls")
            && err.contains("--insecure-plaintext-xds"),
        "{err}"
    );
    let out = run(&["--xds-addr", "127.0.0.1:0", "--admin-addr", "0.0.0.0:0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--admin-token-file"), "{err}");
}

async fn admin_get(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    (text[9..12].parse().unwrap(), text)
}

/// With a token file the admin API answers only `Authorization: Bearer
/// <token>` (but /healthz and /readyz), and no /debug endpoint ever shows a
/// private key, on a config whose gateway has a TLS secret served to an Envoy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_token_and_no_private_keys_in_debug() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed();
    let key_body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
    let port = ballast_testkit::free_port();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(&cfg, tls_secret_config(port, &key, &cert)).unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t0ken-xyz\n").unwrap();
    let ballast = Ballast::start(
        free_addr(),
        free_addr(),
        &["--config", p(&cfg), "--admin-token-file", p(&token)],
    )
    .unwrap();
    ballast.wait_ready().await.unwrap();
    // An Envoy holding the secret, so every debug view has something to show.
    let envoy = Envoy::start(&ballast_testkit::EnvoyConfig::new(
        ballast.xds,
        "envoy-1",
        "default/edge",
        ballast_testkit::AdsMode::Grpc,
    ))
    .await
    .unwrap();
    wait_until(T, POLL, || async {
        envoy
            .config_dump(false)
            .await
            .map(|d| d.to_string().contains("a-tls"))
            .unwrap_or(false)
    })
    .await
    .unwrap();

    for open in ["/healthz", "/readyz"] {
        assert_eq!(admin_get(ballast.admin, open, None).await.0, 200, "{open}");
    }
    let endpoints = [
        "/metrics",
        "/debug/proxies",
        "/debug/config_dump?gateway=default/edge",
        "/debug/sources",
        "/debug/pipeline",
        "/nope",
    ];
    for path in endpoints {
        assert_eq!(admin_get(ballast.admin, path, None).await.0, 401, "{path}");
        assert_eq!(
            admin_get(ballast.admin, path, Some("wrong")).await.0,
            401,
            "{path}"
        );
    }
    for path in &endpoints[..5] {
        let (code, body) = admin_get(ballast.admin, path, Some("t0ken-xyz")).await;
        assert_eq!(code, 200, "{path}: {body}");
        assert!(!body.contains("PRIVATE KEY"), "{path} shows a key: {body}");
        for chunk in key_body.as_bytes().chunks(16) {
            let chunk = std::str::from_utf8(chunk).unwrap();
            assert!(!body.contains(chunk), "{path} shows key bytes {chunk}");
        }
    }
    // The secret is there (redacted), so the check above looked at it.
    let (_, dump) = admin_get(
        ballast.admin,
        "/debug/config_dump?gateway=default/edge",
        Some("t0ken-xyz"),
    )
    .await;
    assert!(
        dump.contains("a-tls") && dump.contains("redacted"),
        "{dump}"
    );
    // `ballast status` with the token.
    let out = ballast_ok(&[
        "status",
        "--admin-addr",
        &ballast.admin.to_string(),
        "--admin-token-file",
        p(&token),
    ]);
    assert!(out.contains("envoy-1"), "{out}");
}
