//! Upstream TLS (issue #11) against real Envoy: `BackendTLSPolicy` with a CA bundle from a
//! ConfigMap and a hostname (SNI + SAN check), and a client certificate from a BackendPolicy for
//! mutual TLS. Upstreams are rustls servers with rcgen-signed certificates: a backend signed by
//! the trusted CA answers 200; one signed by another CA, or with another name, is refused; an
//! mTLS backend answers only when Envoy presents the client certificate.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, wait_for};
use common::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use rustls::RootCertStore;
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

/// A TLS HTTP/1.1 server answering 200 with its name; records the SNI of each handshake.
struct TlsUpstream {
    addr: SocketAddr,
    sni: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn tls_upstream(
    name: &'static str,
    cert: &(String, String),
    client_ca: Option<&str>,
) -> TlsUpstream {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = vec![CertificateDer::from_pem_slice(cert.0.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(cert.1.as_bytes()).unwrap();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        Some(pem) => {
            let mut roots = RootCertStore::empty();
            roots
                .add(CertificateDer::from_pem_slice(pem.as_bytes()).unwrap())
                .unwrap();
            builder.with_client_cert_verifier(
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .unwrap(),
            )
        }
        None => builder.with_no_client_auth(),
    };
    let config = Arc::new(builder.with_single_cert(chain, key).unwrap());
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sni = Arc::new(Mutex::new(Vec::new()));
    let seen = sni.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                if let Some(s) = tls.get_ref().1.server_name() {
                    seen.lock().unwrap().push(s.to_owned());
                }
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                loop {
                    // One request per connection (we answer `Connection: close`).
                    match tls.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{name}",
                    name.len()
                );
                let _ = tls.write_all(resp.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    TlsUpstream { addr, sni, task }
}

fn indent(pem: &str) -> String {
    pem.lines().map(|l| format!("    {l}\n")).collect()
}

fn tls_policy(name: &str, backend: &str) -> String {
    format!(
        "---
apiVersion: gateway.networking.k8s.io/v1alpha3
kind: BackendTLSPolicy
metadata: {{ name: {name} }}
spec:
  targetRefs: [{{ group: ballast.dev, kind: Backend, name: {backend} }}]
  validation:
    caCertificateRefs: [{{ group: \"\", kind: ConfigMap, name: backend-ca }}]
    hostname: api.internal
"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_tls_trusts_only_its_ca_and_presents_client_certificate() {
    let trusted_ca = ca("trusted CA");
    let other_ca = ca("other CA");
    let client_ca = ca("client CA");
    let trusted = tls_upstream("trusted", &leaf(&trusted_ca, "api.internal"), None).await;
    let untrusted = tls_upstream("untrusted", &leaf(&other_ca, "api.internal"), None).await;
    let wrong_name = tls_upstream("wrong-name", &leaf(&trusted_ca, "other.internal"), None).await;
    let mtls = tls_upstream(
        "mtls",
        &leaf(&trusted_ca, "api.internal"),
        Some(&client_ca.pem),
    )
    .await;
    let (client_crt, client_key) = leaf(&client_ca, "envoy.client");

    let port = ballast_testkit::free_port();
    let mut config = gateway(port);
    let cases = [
        ("trusted", trusted.addr),
        ("untrusted", untrusted.addr),
        ("wrong-name", wrong_name.addr),
        ("mtls", mtls.addr),
        ("mtls-nocert", mtls.addr),
    ];
    for (name, addr) in cases {
        config += &route(name, &format!("{name}.example.com"), name);
        config += &backend(name, &[addr]);
        config += &tls_policy(&format!("{name}-tls"), name);
    }
    config += &format!(
        "---
apiVersion: v1
kind: ConfigMap
metadata: {{ name: backend-ca }}
data:
  ca.crt: |
{}---
apiVersion: v1
kind: Secret
metadata: {{ name: envoy-client }}
type: kubernetes.io/tls
stringData:
  tls.crt: |
{}  tls.key: |
{}---
apiVersion: ballast.dev/v1alpha1
kind: BackendPolicy
metadata: {{ name: mtls-client }}
spec:
  targetRefs: [{{ group: ballast.dev, kind: Backend, name: mtls }}]
  tls: {{ clientCertificateRef: {{ name: envoy-client }} }}
",
        indent(&trusted_ca.pem),
        indent(&client_crt),
        indent(&client_key)
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-backend-tls",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let listen = loopback(port);

    // Trusted CA + right name: 200 over TLS, with SNI api.internal.
    let (code, body) = wait_for(T, POLL, || async {
        match host_get(listen, "trusted.example.com").await {
            Ok((200, b)) => Ok((200, b)),
            other => anyhow::bail!("trusted: {other:?}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
    assert_eq!((code, body.as_str()), (200, "trusted"));
    assert!(
        trusted
            .sni
            .lock()
            .unwrap()
            .iter()
            .all(|s| s == "api.internal"),
        "{:?}",
        trusted.sni
    );
    // Client certificate presented: the mTLS backend answers.
    let (code, body) = wait_for(T, POLL, || async {
        match host_get(listen, "mtls.example.com").await {
            Ok((200, b)) => Ok((200, b)),
            other => anyhow::bail!("mtls: {other:?}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
    assert_eq!((code, body.as_str()), (200, "mtls"));

    // Another CA, another name, or no client certificate: refused (503), never plaintext.
    for host in [
        "untrusted.example.com",
        "wrong-name.example.com",
        "mtls-nocert.example.com",
    ] {
        for _ in 0..3 {
            let (code, body) = host_get(listen, host).await.unwrap();
            assert_eq!(code, 503, "{host}: {body}");
        }
    }
    assert!(
        untrusted.sni.lock().unwrap().is_empty(),
        "no handshake completed"
    );
    assert!(
        wrong_name.sni.lock().unwrap().is_empty(),
        "no handshake completed"
    );
    let fails = envoy
        .stat("cluster.default/untrusted.ssl.fail_verify_error")
        .await
        .unwrap()
        .unwrap_or(0);
    assert!(fails >= 1, "Envoy counted the verification failure");
    let san_fails = envoy
        .stat("cluster.default/wrong-name.ssl.fail_verify_san")
        .await
        .unwrap()
        .unwrap_or(0);
    assert!(san_fails >= 1, "Envoy counted the SAN mismatch");
}
