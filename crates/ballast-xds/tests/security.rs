//! TLS, mTLS and stream admission on the xDS port, seen from hostile clients:
//! every exchange is read as raw HTTP/2 bytes so "no resource, no secret byte"
//! is asserted on the wire, not on a decoded view.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ballast_xds::envoy_types::pb::envoy::config::core::v3::{DataSource, Node, data_source};
use ballast_xds::envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    Secret, TlsCertificate, secret,
};
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DiscoveryRequest,
};
use ballast_xds::envoy_types::pb::envoy::service::status::v3::{
    ClientStatusRequest, ClientStatusResponse,
};
use ballast_xds::security::{
    Access, Admission, AdmissionRequest, PeerIdentity, Rejection, TlsFiles, TlsReloader,
};
use ballast_xds::{ResourceType, Snapshot, SnapshotCache, XdsServer, simple};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use rcgen::{
    BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

const T: Duration = Duration::from_secs(20);

// ---------- a small PKI ----------

struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::default();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    p.distinguished_name
        .push(rcgen::DnType::CommonName, name.to_string());
    let cert = p.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(p, key),
    }
}

/// (cert PEM, key PEM) signed by `ca`.
fn leaf(ca: &Ca, sans: Vec<SanType>, client: bool, expired: bool) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::default();
    p.subject_alt_names = sans;
    p.extended_key_usages = vec![if client {
        ExtendedKeyUsagePurpose::ClientAuth
    } else {
        ExtendedKeyUsagePurpose::ServerAuth
    }];
    if expired {
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2021, 1, 1);
    }
    let cert = p.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn server_leaf(ca: &Ca) -> (String, String) {
    leaf(
        ca,
        vec![SanType::DnsName("localhost".try_into().unwrap())],
        false,
        false,
    )
}

fn client_leaf(ca: &Ca, uri: &str) -> (String, String) {
    leaf(ca, vec![SanType::URI(uri.try_into().unwrap())], true, false)
}

fn serial_of(pem: &str) -> String {
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
    PeerIdentity::from_der(&der).unwrap().serial
}

fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

// ---------- the server under test ----------

const SECRET_A: &str = "PRIVATE-KEY-BYTES-OF-GATEWAY-A";
const SECRET_B: &str = "PRIVATE-KEY-BYTES-OF-GATEWAY-B";

fn secret(name: &str, key: &str) -> Secret {
    let inline = |s: &str| DataSource {
        specifier: Some(data_source::Specifier::InlineString(s.to_string())),
        ..Default::default()
    };
    Secret {
        name: name.to_string(),
        r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: Some(inline("CERT")),
            private_key: Some(inline(key)),
            ..Default::default()
        })),
    }
}

fn snapshot(cluster: &str, secret_name: &str, key: &str) -> Snapshot {
    let mut b = Snapshot::builder();
    b.message(&simple::eds_cluster(cluster, Duration::from_secs(1)))
        .unwrap();
    b.message(&simple::load_assignment(cluster, &[("127.0.0.1", 1)]))
        .unwrap();
    b.message(&secret(secret_name, key)).unwrap();
    b.build().unwrap()
}

/// The test policy: URI SAN `spiffe://t/<group>` is served `<group>`;
/// `spiffe://t/admin` may read every node's status.
fn policy() -> Admission {
    Arc::new(|r: &AdmissionRequest<'_>| {
        let Some(peer) = r.peer else {
            return Err(Rejection::new(None, r.group));
        };
        let own = peer
            .uris
            .iter()
            .any(|u| *u == format!("spiffe://t/{}", r.group));
        let admin =
            r.access == Access::ClientStatus && peer.uris.iter().any(|u| u == "spiffe://t/admin");
        if own || admin {
            Ok(())
        } else {
            Err(Rejection::new(Some(peer), r.group))
        }
    })
}

struct Pki {
    dir: tempfile::TempDir,
    ca: Ca,
    files: TlsFiles,
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca("test CA");
    let (cert, key) = server_leaf(&ca);
    let files = TlsFiles {
        cert: dir.path().join("server.pem"),
        key: dir.path().join("server-key.pem"),
        client_ca: Some(dir.path().join("ca.pem")),
    };
    std::fs::write(&files.cert, cert).unwrap();
    std::fs::write(&files.key, key).unwrap();
    std::fs::write(files.client_ca.as_ref().unwrap(), &ca.pem).unwrap();
    Pki { dir, ca, files }
}

struct Served {
    addr: SocketAddr,
    server: XdsServer,
    cache: SnapshotCache,
    _stop: oneshot::Sender<()>,
}

async fn serve(files: TlsFiles, admission: Option<Admission>) -> Served {
    common::init_tracing();
    let cache = SnapshotCache::new();
    cache.set_snapshot("ns/a", snapshot("cluster-a", "secret-a", SECRET_A));
    cache.set_snapshot("ns/b", snapshot("cluster-b", "secret-b", SECRET_B));
    cache.set_ready(true);
    let mut b = XdsServer::builder(cache.clone())
        .grouper(Arc::new(|n: &Node| Ok(n.cluster.clone())))
        .tls(Arc::new(TlsReloader::new(files).unwrap()));
    if let Some(a) = admission {
        b = b.admission(a);
    }
    let server = b.build();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel();
    let s = server.clone();
    tokio::spawn(async move {
        let _ = s
            .serve_with_shutdown(listener, async {
                let _ = rx.await;
            })
            .await;
    });
    Served {
        addr,
        server,
        cache,
        _stop: tx,
    }
}

// ---------- raw clients ----------

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

/// A TLS connection trusting `ca_pem`, presenting `client` if given.
async fn connect(
    addr: SocketAddr,
    ca_pem: &str,
    client: Option<&(String, String)>,
    alpn: &[u8],
) -> std::io::Result<Tls> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match client {
        Some((cert, key)) => b
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .map(|c| c.unwrap())
                    .collect(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => b.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

fn grpc_frame(msg: &impl Message) -> Bytes {
    let body = msg.encode_to_vec();
    let mut out = vec![0u8];
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out.into()
}

/// What came back on the wire for one call: every DATA byte and the trailers.
#[derive(Debug)]
struct Wire {
    data: Bytes,
    grpc_status: Option<String>,
    grpc_message: String,
}

impl Wire {
    fn contains(&self, needle: &str) -> bool {
        self.data
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
    }
}

async fn h2(tls: Tls) -> anyhow::Result<hyper::client::conn::http2::SendRequest<Full<Bytes>>> {
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

/// One gRPC call with a single request message; the request stream then ends.
async fn call(tls: Tls, path: &str, msg: &impl Message) -> anyhow::Result<Wire> {
    let mut sender = h2(tls).await?;
    let req = http::Request::post(format!("https://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(grpc_frame(msg)))?;
    let resp = tokio::time::timeout(T, sender.send_request(req)).await??;
    let (parts, body) = resp.into_parts();
    let collected = tokio::time::timeout(T, body.collect()).await??;
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let get = |h: &http::HeaderMap, k: &str| h.get(k).map(|v| v.to_str().unwrap_or("").to_string());
    let grpc_status = get(&trailers, "grpc-status").or(get(&parts.headers, "grpc-status"));
    let grpc_message = get(&trailers, "grpc-message")
        .or(get(&parts.headers, "grpc-message"))
        .unwrap_or_default();
    Ok(Wire {
        data: collected.to_bytes(),
        grpc_status,
        grpc_message: percent_decode(&grpc_message),
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 3 <= b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn node(id: &str, group: &str) -> Node {
    Node {
        id: id.into(),
        cluster: group.into(),
        ..Default::default()
    }
}

fn sotw(group: &str, ty: ResourceType, names: &[&str]) -> DiscoveryRequest {
    DiscoveryRequest {
        node: Some(node(&format!("node-{}", group.replace('/', "-")), group)),
        type_url: ty.type_url().into(),
        resource_names: names.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn delta(group: &str, ty: ResourceType, names: &[&str]) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: Some(node(&format!("node-{}", group.replace('/', "-")), group)),
        type_url: ty.type_url().into(),
        resource_names_subscribe: names.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// REST-JSON over HTTP/1.1 on the same TLS port: (status, body).
async fn rest(tls: Tls, path: &str, json: &str) -> anyhow::Result<(u16, String)> {
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    let req = http::Request::post(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(json.to_string())))?;
    let resp = tokio::time::timeout(T, sender.send_request(req)).await??;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

const ADS_SOTW: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const ADS_DELTA: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
const SDS_SOTW: &str = "/envoy.service.secret.v3.SecretDiscoveryService/StreamSecrets";
const SDS_FETCH: &str = "/envoy.service.secret.v3.SecretDiscoveryService/FetchSecrets";
const CSDS_FETCH: &str = "/envoy.service.status.v3.ClientStatusDiscoveryService/FetchClientStatus";

// ---------- tests ----------

/// Gateway A's certificate asking for gateway B (by every door: ADS SotW and
/// Delta, SDS by secret name, gRPC Fetch, REST) gets PERMISSION_DENIED naming
/// the identity and the gateway, and not one byte of B's resources; its own
/// gateway is served (the positive control proving the reads would see them).
#[tokio::test]
async fn wrong_gateway_certificate_gets_permission_denied_and_no_byte() {
    let p = pki();
    let s = serve(p.files.clone(), Some(policy())).await;
    let a = client_leaf(&p.ca, "spiffe://t/ns/a");
    let ca = p.ca.pem.clone();
    let conn = || async { connect(s.addr, &ca, Some(&a), b"h2").await.unwrap() };

    // Own gateway: served, secret bytes on the wire.
    let own = call(
        conn().await,
        SDS_SOTW,
        &sotw("ns/a", ResourceType::Secret, &["secret-a"]),
    )
    .await
    .unwrap();
    assert!(
        own.contains(SECRET_A),
        "control: own secret is served: {own:?}"
    );
    assert_eq!(own.grpc_status.as_deref(), Some("0"), "{own:?}");
    let own = call(
        conn().await,
        ADS_DELTA,
        &delta("ns/a", ResourceType::Secret, &["secret-a"]),
    )
    .await
    .unwrap();
    assert!(own.contains(SECRET_A), "control (delta): {own:?}");

    // Another gateway, every way in.
    let hostile = [
        (
            ADS_SOTW,
            call(
                conn().await,
                ADS_SOTW,
                &sotw("ns/b", ResourceType::Secret, &["secret-b"]),
            )
            .await
            .unwrap(),
        ),
        (
            ADS_SOTW,
            call(
                conn().await,
                ADS_SOTW,
                &sotw("ns/b", ResourceType::Cluster, &[]),
            )
            .await
            .unwrap(),
        ),
        (
            ADS_DELTA,
            call(
                conn().await,
                ADS_DELTA,
                &delta("ns/b", ResourceType::Secret, &["secret-b"]),
            )
            .await
            .unwrap(),
        ),
        (
            SDS_SOTW,
            call(
                conn().await,
                SDS_SOTW,
                &sotw("ns/b", ResourceType::Secret, &["secret-b"]),
            )
            .await
            .unwrap(),
        ),
        (
            SDS_FETCH,
            call(
                conn().await,
                SDS_FETCH,
                &sotw("ns/b", ResourceType::Secret, &["secret-b"]),
            )
            .await
            .unwrap(),
        ),
    ];
    for (path, w) in &hostile {
        assert_eq!(w.grpc_status.as_deref(), Some("7"), "{path}: {w:?}");
        assert!(w.data.is_empty(), "{path}: no DATA byte at all: {w:?}");
        assert!(
            !w.contains(SECRET_B) && !w.contains("secret-b") && !w.contains("cluster-b"),
            "{path}"
        );
        assert_eq!(
            w.grpc_message, "identity spiffe://t/ns/a may not be served ns/b",
            "{path}"
        );
    }

    // REST-JSON: same TLS port, same rule.
    let tls = connect(s.addr, &ca, Some(&a), b"http/1.1").await.unwrap();
    let body = r#"{"node":{"id":"evil","cluster":"ns/b"},"resource_names":["secret-b"]}"#;
    let (status, text) = rest(tls, "/v3/discovery:secrets", body).await.unwrap();
    assert_eq!(status, 403, "{text}");
    assert!(
        text.contains("spiffe://t/ns/a") && text.contains("ns/b"),
        "{text}"
    );
    assert!(
        !text.contains(SECRET_B) && !text.contains("secret-b"),
        "{text}"
    );
    let tls = connect(s.addr, &ca, Some(&a), b"http/1.1").await.unwrap();
    let body = r#"{"node":{"id":"node-ns-a","cluster":"ns/a"},"resource_names":["secret-a"]}"#;
    let (status, text) = rest(tls, "/v3/discovery:secrets", body).await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("secret-a"), "{text}");

    // Recorded for status pages: 6 refusals, the last naming node `evil`.
    let (recent, total) = s.server.rejections();
    assert_eq!(total, 6, "{recent:?}");
    assert_eq!(recent.last().unwrap().node, "evil");
    assert_eq!(recent.last().unwrap().rejection.group, "ns/b");
    drop(s.cache);
}

/// CSDS answers each identity with the nodes it may be served only; an
/// admin identity sees every node.
#[tokio::test]
async fn csds_shows_only_what_the_identity_may_see() {
    let p = pki();
    let s = serve(p.files.clone(), Some(policy())).await;
    let ca = p.ca.pem.clone();
    let a = client_leaf(&p.ca, "spiffe://t/ns/a");
    let b = client_leaf(&p.ca, "spiffe://t/ns/b");
    let admin = client_leaf(&p.ca, "spiffe://t/admin");
    // One node of each gateway becomes known (state is kept after the fetch).
    for (cert, g) in [(&a, "ns/a"), (&b, "ns/b")] {
        let tls = connect(s.addr, &ca, Some(cert), b"h2").await.unwrap();
        let w = call(tls, SDS_FETCH, &sotw(g, ResourceType::Secret, &[]))
            .await
            .unwrap();
        assert_eq!(w.grpc_status.as_deref(), Some("0"), "{w:?}");
    }
    let addr = s.addr;
    let nodes_seen = |cert: (String, String)| {
        let ca = ca.clone();
        async move {
            let tls = connect(addr, &ca, Some(&cert), b"h2").await.unwrap();
            let w = call(tls, CSDS_FETCH, &ClientStatusRequest::default())
                .await
                .unwrap();
            assert_eq!(w.grpc_status.as_deref(), Some("0"), "{w:?}");
            let resp = ClientStatusResponse::decode(&w.data[5..]).unwrap();
            let mut ids: Vec<String> = resp
                .config
                .iter()
                .map(|c| c.node.as_ref().unwrap().id.clone())
                .collect();
            ids.sort();
            (ids, w)
        }
    };
    let (ids, w) = nodes_seen(a.clone()).await;
    assert_eq!(ids, vec!["node-ns-a"]);
    assert!(!w.contains("node-ns-b") && !w.contains("secret-b"), "{w:?}");
    let (ids, _) = nodes_seen(b.clone()).await;
    assert_eq!(ids, vec!["node-ns-b"]);
    let (ids, _) = nodes_seen(admin).await;
    assert_eq!(ids, vec!["node-ns-a", "node-ns-b"]);
}

/// The handshake is refused to a client without a certificate, with an
/// expired one, or with one from another CA; a plaintext client on the TLS
/// port gets nothing. The good certificate works (control).
#[tokio::test]
async fn handshake_refused_without_a_valid_client_certificate() {
    let p = pki();
    let s = serve(p.files.clone(), Some(policy())).await;
    let ca = p.ca.pem.clone();
    let good = client_leaf(&p.ca, "spiffe://t/ns/a");
    let expired = leaf(
        &p.ca,
        vec![SanType::URI("spiffe://t/ns/a".try_into().unwrap())],
        true,
        true,
    );
    let other_ca = ca_other_client();

    let addr = s.addr;
    let attempt = |client: Option<(String, String)>| {
        let ca = ca.clone();
        async move {
            // TLS 1.3 clients finish before the server checks their
            // certificate: the refusal shows on the first exchange.
            let tls = connect(addr, &ca, client.as_ref(), b"h2").await?;
            call(
                tls,
                SDS_FETCH,
                &sotw("ns/a", ResourceType::Secret, &["secret-a"]),
            )
            .await
        }
    };
    let ok = attempt(Some(good)).await.unwrap();
    assert!(ok.contains(SECRET_A), "control: {ok:?}");
    for (what, client) in [
        ("no certificate", None),
        ("expired", Some(expired)),
        ("other CA", Some(other_ca)),
    ] {
        match attempt(client).await {
            Ok(w) => panic!("{what}: got a response: {w:?}"),
            Err(e) => eprintln!("{what}: refused: {e:#}"),
        }
    }
    // Plaintext HTTP/2 on the TLS port.
    let tcp = TcpStream::connect(s.addr).await.unwrap();
    let plain = async {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp)).await?;
        tokio::spawn(conn);
        let req = http::Request::post(format!("http://localhost{SDS_FETCH}"))
            .header("content-type", "application/grpc")
            .body(Full::new(grpc_frame(&sotw(
                "ns/a",
                ResourceType::Secret,
                &[],
            ))))?;
        let r = sender.send_request(req).await?;
        anyhow::Ok(r.into_body().collect().await?.to_bytes())
    };
    let r = tokio::time::timeout(Duration::from_secs(30), plain)
        .await
        .expect("bounded by the handshake timeout");
    assert!(r.is_err(), "plaintext got an answer: {r:?}");
    let (_, _, refused) = s.server.tls().unwrap().counters();
    assert!(refused >= 4, "refused handshakes counted: {refused}");
}

fn ca_other_client() -> (String, String) {
    let other = ca("other CA");
    client_leaf(&other, "spiffe://t/ns/a")
}

/// Rotation: replacing the files changes the certificate new connections
/// see (serial), keeps an open stream serving, and a broken replacement
/// never replaces the last good certificate.
#[tokio::test]
async fn rotation_reaches_new_connections_and_keeps_open_streams() {
    let p = pki();
    let s = serve(p.files.clone(), Some(policy())).await;
    let ca = p.ca.pem.clone();
    let a = client_leaf(&p.ca, "spiffe://t/ns/a");
    let server_serial = |tls: &Tls| {
        let der = &tls.get_ref().1.peer_certificates().unwrap()[0];
        PeerIdentity::from_der(der).unwrap().serial
    };
    let first = std::fs::read_to_string(&p.files.cert).unwrap();
    let tls = connect(s.addr, &ca, Some(&a), b"h2").await.unwrap();
    assert_eq!(server_serial(&tls), serial_of(&first));

    // An open stream: requests through a channel so it stays open.
    let (req_tx, req_rx) = mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(4);
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    req_tx
        .send(Ok(Frame::data(grpc_frame(&sotw(
            "ns/a",
            ResourceType::Cluster,
            &[],
        )))))
        .await
        .unwrap();
    let req = http::Request::post(format!("https://localhost{ADS_SOTW}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(req_rx),
        ))
        .unwrap();
    let mut body = sender.send_request(req).await.unwrap().into_body();
    let mut seen = Vec::new();
    read_until(&mut body, &mut seen, "cluster-a").await;
    // ACK it (SotW sends the next version once the previous one is answered).
    let len = u32::from_be_bytes(seen[1..5].try_into().unwrap()) as usize;
    let first_resp =
        ballast_xds::envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse::decode(
            &seen[5..5 + len],
        )
        .unwrap();
    let mut ack = sotw("ns/a", ResourceType::Cluster, &[]);
    ack.version_info = first_resp.version_info.clone();
    ack.response_nonce = first_resp.nonce.clone();
    req_tx
        .send(Ok(Frame::data(grpc_frame(&ack))))
        .await
        .unwrap();

    // Rotate: a new server certificate from the same CA.
    let (cert2, key2) = server_leaf(&p.ca);
    write_atomic(&p.files.key, &key2);
    write_atomic(&p.files.cert, &cert2);
    let tls2 = connect(s.addr, &ca, Some(&a), b"h2").await.unwrap();
    assert_eq!(server_serial(&tls2), serial_of(&cert2));
    assert_ne!(serial_of(&cert2), serial_of(&first));
    let w = call(
        tls2,
        SDS_FETCH,
        &sotw("ns/a", ResourceType::Secret, &["secret-a"]),
    )
    .await
    .unwrap();
    assert!(
        w.contains(SECRET_A),
        "served over the new certificate: {w:?}"
    );

    // The stream opened before rotation still gets updates.
    s.cache
        .set_snapshot("ns/a", snapshot("cluster-a2", "secret-a", SECRET_A));
    read_until(&mut body, &mut seen, "cluster-a2").await;

    // A broken replacement (key that does not fit) keeps the last good one.
    let (_, key3) = server_leaf(&p.ca);
    write_atomic(&p.files.key, &key3);
    let tls3 = connect(s.addr, &ca, Some(&a), b"h2").await.unwrap();
    assert_eq!(server_serial(&tls3), serial_of(&cert2));
    let (reloads, errors, _) = s.server.tls().unwrap().counters();
    assert_eq!(reloads, 1);
    assert!(errors >= 1);
    write_atomic(&p.files.key, &key2);

    // The client CA is re-read too: after replacing it, a client of the old
    // CA is refused and one of the new CA admitted.
    let new_ca = crate::ca("new CA");
    write_atomic(p.files.client_ca.as_ref().unwrap(), &new_ca.pem);
    let new_client = client_leaf(&new_ca, "spiffe://t/ns/a");
    let addr = s.addr;
    let fetch = |client: (String, String)| {
        let ca = ca.clone();
        async move {
            let tls = connect(addr, &ca, Some(&client), b"h2").await?;
            call(
                tls,
                SDS_FETCH,
                &sotw("ns/a", ResourceType::Secret, &["secret-a"]),
            )
            .await
        }
    };
    assert!(fetch(a.clone()).await.is_err(), "old CA's client refused");
    let w = fetch(new_client).await.unwrap();
    assert!(w.contains(SECRET_A), "new CA's client served: {w:?}");
    drop(req_tx);
    drop(p.dir);
}

async fn read_until(body: &mut hyper::body::Incoming, seen: &mut Vec<u8>, needle: &str) {
    tokio::time::timeout(T, async {
        while !seen.windows(needle.len()).any(|w| w == needle.as_bytes()) {
            let f = body.frame().await.expect("stream open").unwrap();
            if let Ok(d) = f.into_data() {
                seen.extend_from_slice(&d);
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{needle} not received"));
}
