//! HTTPS (issue 3): two hostnames with different certificates on one HTTPS
//! port. Each hostname's TLS handshake presents its own certificate (SNI →
//! filter chain → SDS secret) and the request reaches its own upstream.
//! Certificates are self-signed, generated with the `openssl` CLI; requests are
//! made with `curl --resolve ... --cacert ...`, so a wrong certificate fails
//! verification.
//!
//! Misdirected requests (issue 10): with SNI `alpha` and `Host: beta` (or any host that is not
//! the SNI listener's), Envoy answers 421 instead of serving or 404ing; certificates for that
//! test come from rcgen.

mod common;

use std::path::Path;
use std::process::Command;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, Upstream, wait_for};
use common::*;

/// A self-signed certificate for `host` (CN and subjectAltName); returns (cert PEM, key PEM).
fn self_signed(dir: &Path, host: &str) -> (String, String) {
    let crt = dir.join(format!("{host}.crt"));
    let key = dir.join(format!("{host}.key"));
    let out = Command::new("openssl")
        .args(["req", "-x509", "-nodes", "-days", "2"])
        .args(["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"])
        .args(["-subj", &format!("/CN={host}")])
        .args(["-addext", &format!("subjectAltName=DNS:{host}")])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        std::fs::read_to_string(&crt).unwrap(),
        std::fs::read_to_string(&key).unwrap(),
    )
}

fn indent(pem: &str) -> String {
    pem.lines().map(|l| format!("    {l}\n")).collect()
}

fn secret(name: &str, crt: &str, key: &str) -> String {
    format!(
        "---
apiVersion: v1
kind: Secret
metadata: {{ name: {name} }}
type: kubernetes.io/tls
stringData:
  tls.crt: |
{}  tls.key: |
{}",
        indent(crt),
        indent(key)
    )
}

fn https_gateway(port: u16) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - name: alpha
    port: {port}
    protocol: HTTPS
    hostname: alpha.example.com
    tls: {{ certificateRefs: [{{ kind: Secret, name: alpha-tls }}] }}
  - name: beta
    port: {port}
    protocol: HTTPS
    hostname: beta.example.com
    tls: {{ certificateRefs: [{{ kind: Secret, name: beta-tls }}] }}
"
    )
}

struct CurlResult {
    /// HTTP status (0 when the request failed).
    code: u16,
    body: String,
    /// curl's verbose output (handshake, certificate details).
    verbose: String,
}

async fn curl(host: &str, port: u16, cacert: &Path) -> CurlResult {
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "-v", "--max-time", "10"])
        .args(["--resolve", &format!("{host}:{port}:127.0.0.1")])
        .arg("--cacert")
        .arg(cacert)
        .args(["-w", "\n%{http_code}"])
        .arg(format!("https://{host}:{port}/"))
        .output()
        .await
        .expect("run curl");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = stdout.rsplit_once('\n').unwrap_or(("", "0"));
    CurlResult {
        code: code.trim().parse().unwrap_or(0),
        body: body.to_string(),
        verbose: String::from_utf8_lossy(&out.stderr).to_string(),
    }
}

/// The subject CN of the certificate the server presents for SNI `host`.
async fn served_cn(host: &str, port: u16) -> String {
    let out = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl s_client -connect 127.0.0.1:{port} -servername {host} </dev/null 2>/dev/null \
             | openssl x509 -noout -subject"
        ))
        .output()
        .await
        .expect("run openssl s_client");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

async fn scenario(mode: AdsMode) {
    let alpha = Upstream::start("alpha").await.unwrap();
    let beta = Upstream::start("beta").await.unwrap();
    let certs = tempfile::tempdir().unwrap();
    let (alpha_crt, alpha_key) = self_signed(certs.path(), "alpha.example.com");
    let (beta_crt, beta_key) = self_signed(certs.path(), "beta.example.com");

    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let config = https_gateway(port)
        + &route("alpha", "alpha.example.com", "alpha")
        + &route("beta", "beta.example.com", "beta")
        + &backend("alpha", &[alpha.addr()])
        + &backend("beta", &[beta.addr()])
        + &secret("alpha-tls", &alpha_crt, &alpha_key)
        + &secret("beta-tls", &beta_crt, &beta_key);
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-https",
        "default/edge",
        mode,
    ))
    .await
    .unwrap();

    for (host, name, other) in [
        ("alpha.example.com", "alpha", "beta.example.com"),
        ("beta.example.com", "beta", "alpha.example.com"),
    ] {
        let cacert = certs.path().join(format!("{host}.crt"));
        // Bounded wait until Envoy is programmed and the request succeeds.
        let r = wait_for(T, POLL, || async {
            let r = curl(host, port, &cacert).await;
            if r.code == 200 {
                Ok(r)
            } else {
                anyhow::bail!("{host}: status {}; {}", r.code, r.verbose)
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\nenvoy log:\n{}", envoy.log_tail(30)));
        assert_eq!(r.body, name, "{host} reaches its own upstream");
        // curl verified the chain against this host's own (self-signed) cert, so
        // it was the one served; the verbose output names it too.
        assert!(
            r.verbose.contains(&format!("CN={host}")),
            "curl saw the certificate of {host}: {}",
            r.verbose
        );
        assert!(!r.verbose.contains(&format!("CN={other}")), "{}", r.verbose);
        let subject = served_cn(host, port).await;
        assert!(
            subject.contains(&format!("CN = {host}")) || subject.contains(&format!("CN={host}")),
            "SNI {host} gets its own certificate: {subject:?}"
        );
        // The other hostname's CA does not verify this hostname: the certificates differ.
        let wrong = certs.path().join(format!("{other}.crt"));
        let r = curl(host, port, &wrong).await;
        assert_eq!(r.code, 0, "verification with the other CA must fail");
    }
    let summary = envoy.config_summary(false).await.unwrap();
    assert!(summary.secrets.contains("default/alpha-tls"), "{summary:?}");
    assert!(summary.secrets.contains("default/beta-tls"), "{summary:?}");
    assert_eq!(
        summary.listeners.iter().cloned().collect::<Vec<_>>(),
        vec![format!("default/edge/{port}")],
        "one listener (port) for both hostnames"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hostnames_two_certificates_sotw() {
    scenario(AdsMode::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hostnames_two_certificates_delta() {
    scenario(AdsMode::DeltaGrpc).await;
}

/// A self-signed certificate for `host` made with rcgen (CN and subjectAltName); writes the
/// certificate to `dir/{host}.crt` for curl and returns (cert PEM, key PEM).
fn rcgen_self_signed(dir: &Path, host: &str) -> (String, String) {
    let mut params = rcgen::CertificateParams::new(vec![host.to_string()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, host);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    std::fs::write(dir.join(format!("{host}.crt")), cert.pem()).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// Status of `GET https://{sni}:{port}/` (SNI and certificate check for `sni`) sent with
/// `Host: {host}`, over HTTP/2 when `h2` (`:authority` then carries `host`) or HTTP/1.1.
async fn status_with_host(sni: &str, host: &str, port: u16, cacert: &Path, h2: bool) -> u16 {
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "--max-time", "10"])
        .arg(if h2 { "--http2" } else { "--http1.1" })
        .args(["--resolve", &format!("{sni}:{port}:127.0.0.1")])
        .arg("--cacert")
        .arg(cacert)
        .args(["-H", &format!("Host: {host}")])
        .args(["-w", "%{http_code}"])
        .arg(format!("https://{sni}:{port}/"))
        .output()
        .await
        .expect("run curl");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_of_one_listener_with_host_of_another_gets_421() {
    let alpha = Upstream::start("alpha").await.unwrap();
    let beta = Upstream::start("beta").await.unwrap();
    let wild = Upstream::start("wild").await.unwrap();
    let certs = tempfile::tempdir().unwrap();
    let (alpha_crt, alpha_key) = rcgen_self_signed(certs.path(), "alpha.example.com");
    let (beta_crt, beta_key) = rcgen_self_signed(certs.path(), "beta.example.com");
    let (wild_crt, wild_key) = rcgen_self_signed(certs.path(), "*.example.com");
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    // A third listener, `*.example.com`, less specific than alpha and beta on the same port.
    let config = https_gateway(port)
        + &format!(
            "  - name: wild\n    port: {port}\n    protocol: HTTPS\n    hostname: \"*.example.com\"\n    \
             tls: {{ certificateRefs: [{{ kind: Secret, name: wild-tls }}] }}\n"
        )
        + &route("alpha", "alpha.example.com", "alpha")
        + &route("beta", "beta.example.com", "beta")
        + &route("wild", "y.example.com", "wild")
        + &backend("alpha", &[alpha.addr()])
        + &backend("beta", &[beta.addr()])
        + &backend("wild", &[wild.addr()])
        + &secret("alpha-tls", &alpha_crt, &alpha_key)
        + &secret("beta-tls", &beta_crt, &beta_key)
        + &secret("wild-tls", &wild_crt, &wild_key);
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-421",
        "default/edge",
        AdsMode::DeltaGrpc,
    ))
    .await
    .unwrap();
    let alpha_ca = certs.path().join("alpha.example.com.crt");
    let beta_ca = certs.path().join("beta.example.com.crt");
    let wild_ca = certs.path().join("*.example.com.crt");
    // Bounded wait until the three filter chains serve their own host.
    wait_for(T, POLL, || async {
        for (sni, ca) in [
            ("alpha.example.com", &alpha_ca),
            ("beta.example.com", &beta_ca),
            ("y.example.com", &wild_ca),
        ] {
            let code = status_with_host(sni, sni, port, ca, true).await;
            if code != 200 {
                anyhow::bail!("{sni}: status {code}");
            }
        }
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\nenvoy log:\n{}", envoy.log_tail(30)));

    let mut non_2xx = 0;
    let mut misdirected = 0;
    for h2 in [true, false] {
        for _ in 0..5 {
            for (sni, ca, other) in [
                ("alpha.example.com", &alpha_ca, "beta.example.com"),
                ("beta.example.com", &beta_ca, "alpha.example.com"),
            ] {
                // Own host (also with a port, as HTTP/1.1 clients send it): served.
                for host in [sni.to_string(), format!("{sni}:{port}")] {
                    let code = status_with_host(sni, &host, port, ca, h2).await;
                    if !(200..300).contains(&code) {
                        non_2xx += 1;
                    }
                }
                // Another listener's host, or a host no listener has: misdirected.
                for host in [other, "unknown.example.org"] {
                    let code = status_with_host(sni, host, port, ca, h2).await;
                    assert_eq!(code, 421, "SNI {sni}, Host {host}, h2={h2}");
                    misdirected += 1;
                }
            }
        }
    }
    // The wildcard chain: its own hosts are served (or 404 without a route), a host with a
    // more specific listener of its own (alpha) is misdirected.
    for h2 in [true, false] {
        for _ in 0..5 {
            let sni = "y.example.com";
            if !(200..300).contains(&status_with_host(sni, sni, port, &wild_ca, h2).await) {
                non_2xx += 1;
            }
            let code = status_with_host(sni, "z.example.com", port, &wild_ca, h2).await;
            assert_eq!(
                code, 404,
                "SNI {sni}, Host z.example.com (no route), h2={h2}"
            );
            let code = status_with_host(sni, "alpha.example.com", port, &wild_ca, h2).await;
            assert_eq!(code, 421, "SNI {sni}, Host alpha.example.com, h2={h2}");
            misdirected += 1;
            let code = status_with_host("alpha.example.com", sni, port, &alpha_ca, h2).await;
            assert_eq!(code, 421, "SNI alpha.example.com, Host {sni}, h2={h2}");
            misdirected += 1;
        }
    }
    assert_eq!(
        non_2xx, 0,
        "requests for the SNI's own host must all succeed"
    );
    assert_eq!(misdirected, 60);
}
