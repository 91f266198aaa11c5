//! Embeds `ballast-xds` exactly as its README shows — the same snapshot,
//! cache and builder calls — and talks to it as a client of each feature set
//! would. Run once per feature set (scripts/test does):
//!
//! ```text
//! cargo test -p ballast-xds-embed --no-default-features --test readme
//! cargo test -p ballast-xds-embed --no-default-features --features rest --test readme
//! cargo test -p ballast-xds-embed --no-default-features --features csds --test readme
//! cargo test -p ballast-xds-embed --no-default-features --features tls --test readme
//! ```
//!
//! The default build also checks that REST and CSDS are really absent, so a
//! feature leaking into the default set fails here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ballast_xds::envoy_types::pb::envoy::config::cluster::v3::Cluster;
use ballast_xds::envoy_types::pb::envoy::config::core::v3::Node;
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ballast_xds::{ResourceType, Snapshot, SnapshotCache, XdsServer, XdsServerBuilder, simple};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// Bound on every network wait.
const T: Duration = Duration::from_secs(20);

/// The README's snapshot, cache and builder, verbatim (the README's
/// `server.serve(addr)` is replaced by a listener bound to port 0 so tests
/// never race for a port).
fn readme_builder() -> XdsServerBuilder {
    let snapshot = Snapshot::builder()
        .with(&simple::eds_cluster("web", Duration::from_secs(1)))
        .unwrap()
        .with(&simple::load_assignment("web", &[("127.0.0.1", 8080)]))
        .unwrap()
        .with(&simple::http_listener("http", "0.0.0.0", 10000, "http"))
        .unwrap()
        .with(&simple::route_config("http", &[("*", &[("web", 1)])]))
        .unwrap()
        .build()
        .unwrap();
    let cache = SnapshotCache::new();
    cache.set_snapshot("default", snapshot);
    cache.set_ready(true);
    XdsServer::builder(cache).grouper(Arc::new(|_node| Ok("default".to_string())))
}

/// A server on a loopback port; the sender stops it when dropped.
struct Served {
    addr: SocketAddr,
    _stop: oneshot::Sender<()>,
}

async fn serve(server: XdsServer) -> Served {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = server
            .serve_with_shutdown(listener, async {
                let _ = rx.await;
            })
            .await;
    });
    Served { addr, _stop: tx }
}

fn node(id: &str) -> Node {
    Node {
        id: id.to_string(),
        ..Default::default()
    }
}

/// One SotW ADS exchange for clusters on `channel`: the cluster names the
/// first response carries.
async fn ads_clusters(channel: Channel, node_id: &str) -> Vec<String> {
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let req = DiscoveryRequest {
        type_url: ResourceType::Cluster.type_url().into(),
        node: Some(node(node_id)),
        ..Default::default()
    };
    // Keep the request stream open (a pending tail) so the server does not
    // see the client finish before it answers.
    let requests = tokio_stream::StreamExt::chain(
        tokio_stream::iter([req]),
        tokio_stream::pending::<DiscoveryRequest>(),
    );
    let mut stream = tokio::time::timeout(T, client.stream_aggregated_resources(requests))
        .await
        .expect("ADS stream opens within the bound")
        .unwrap()
        .into_inner();
    let resp = tokio::time::timeout(T, stream.message())
        .await
        .expect("a response within the bound")
        .unwrap()
        .expect("a response, not the end of the stream");
    let mut names: Vec<String> = resp
        .resources
        .iter()
        .map(|a| Cluster::decode(a.value.as_slice()).unwrap().name)
        .collect();
    names.sort();
    names
}

async fn plain_channel(addr: SocketAddr) -> Channel {
    tokio::time::timeout(
        T,
        Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect(),
    )
    .await
    .expect("connects within the bound")
    .unwrap()
}

/// A raw HTTP/1.1 POST (what `curl -d` does): (status code, whole response).
async fn post(addr: SocketAddr, path: &str, body: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(T, s.read_to_end(&mut out))
        .await
        .expect("an answer within the bound")
        .unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let code = text.get(9..12).unwrap_or("0").parse().unwrap_or(0);
    (code, text)
}

const REST_CLUSTERS: &str = "/v3/discovery:clusters";
const REST_BODY: &str = r#"{"node":{"id":"rest-node"}}"#;

/// Every feature set: a tonic ADS client fetches the README's snapshot over
/// plaintext gRPC (with `tls`, only when no TLS is configured).
#[tokio::test]
async fn grpc_ads_client_fetches_the_readme_snapshot() {
    let s = serve(readme_builder().build()).await;
    let names = ads_clusters(plain_channel(s.addr).await, "ads-node").await;
    assert_eq!(names, ["web"]);
}

/// Without `rest`, the REST-JSON endpoint is not served: the feature does not
/// leak into the default set.
#[cfg(not(feature = "rest"))]
#[tokio::test]
async fn without_rest_no_rest_json_endpoint() {
    let s = serve(readme_builder().build()).await;
    let (code, text) = post(s.addr, REST_CLUSTERS, REST_BODY).await;
    assert!(
        !text.contains("\"web\""),
        "REST-JSON answered without the rest feature: {code} {text}"
    );
}

/// `rest`: a REST-JSON POST gets the README's cluster, as proto-JSON.
#[cfg(feature = "rest")]
#[tokio::test]
async fn rest_post_gets_the_resources() {
    let s = serve(readme_builder().build()).await;
    let (code, text) = post(s.addr, REST_CLUSTERS, REST_BODY).await;
    assert_eq!(code, 200, "{text}");
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    assert!(
        body.contains("type.googleapis.com/envoy.config.cluster.v3.Cluster"),
        "{body}"
    );
    assert!(body.contains("\"name\":\"web\""), "{body}");
    assert!(body.contains("\"versionInfo\""), "{body}");
}

mod csds_client {
    pub use ballast_xds::envoy_types::pb::envoy::service::status::v3::ClientStatusRequest;
    pub use ballast_xds::envoy_types::pb::envoy::service::status::v3::client_status_discovery_service_client::ClientStatusDiscoveryServiceClient as Client;
}

/// Without `csds`, the CSDS service answers UNIMPLEMENTED.
#[cfg(not(feature = "csds"))]
#[tokio::test]
async fn without_csds_the_service_is_unimplemented() {
    let s = serve(readme_builder().build()).await;
    let mut csds = csds_client::Client::new(plain_channel(s.addr).await);
    let status = tokio::time::timeout(
        T,
        csds.fetch_client_status(csds_client::ClientStatusRequest::default()),
    )
    .await
    .expect("an answer within the bound")
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
}

/// `csds`: after an ADS client fetched its clusters, a CSDS client sees that
/// node and the cluster it was sent.
#[cfg(feature = "csds")]
#[tokio::test]
async fn csds_client_sees_the_node() {
    let s = serve(readme_builder().build()).await;
    let channel = plain_channel(s.addr).await;
    // Keep the ADS stream open while CSDS is asked: hold the client task.
    let ads = tokio::spawn({
        let channel = channel.clone();
        async move {
            let names = ads_clusters(channel, "csds-node").await;
            assert_eq!(names, ["web"]);
            std::future::pending::<()>().await;
        }
    });
    let mut csds = csds_client::Client::new(channel);
    let mut seen = None;
    for _ in 0..200 {
        let resp = tokio::time::timeout(
            T,
            csds.fetch_client_status(csds_client::ClientStatusRequest {
                node: Some(node("csds-node")),
                ..Default::default()
            }),
        )
        .await
        .expect("an answer within the bound")
        .unwrap()
        .into_inner();
        let sent_web = resp.config.iter().any(|c| {
            c.node.as_ref().map(|n| n.id.as_str()) == Some("csds-node")
                && c.generic_xds_configs
                    .iter()
                    .any(|g| g.type_url == ResourceType::Cluster.type_url() && g.name == "web")
        });
        if sent_web {
            seen = Some(resp);
            break;
        }
        assert!(!ads.is_finished(), "the ADS client failed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ads.abort();
    assert!(
        seen.is_some(),
        "CSDS never reported csds-node with cluster web"
    );
}

#[cfg(feature = "tls")]
mod tls {
    use super::*;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use ballast_xds::security::{TlsFiles, TlsReloader};
    use hyper_util::rt::TokioIo;
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
        KeyUsagePurpose, SanType,
    };
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, ServerName};
    use tonic::transport::Endpoint;

    /// (CA PEM, server cert PEM, server key PEM) for `localhost`.
    fn pki() -> (String, String, String) {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::default();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut leaf = CertificateParams::default();
        leaf.subject_alt_names = vec![SanType::DnsName("localhost".try_into().unwrap())];
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        (ca_pem, cert.pem(), key.serialize_pem())
    }

    /// Dials TCP, then TLS (ALPN h2) trusting one CA: the connector tonic
    /// uses for `https` without its own TLS feature.
    #[derive(Clone)]
    struct TlsConnector {
        addr: SocketAddr,
        config: Arc<rustls::ClientConfig>,
    }

    type Io = TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

    impl tower_service::Service<http::Uri> for TlsConnector {
        type Response = Io;
        type Error = std::io::Error;
        type Future = Pin<Box<dyn Future<Output = std::io::Result<Io>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Uri) -> Self::Future {
            let (addr, config) = (self.addr, self.config.clone());
            Box::pin(async move {
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                let tls = tokio_rustls::TlsConnector::from(config)
                    .connect(ServerName::try_from("localhost").unwrap(), tcp)
                    .await?;
                Ok(TokioIo::new(tls))
            })
        }
    }

    fn client_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        Arc::new(config)
    }

    /// `tls`: the README's server with `builder.tls(...)` serves a tonic ADS
    /// client over TLS (rcgen certificates), and refuses plaintext gRPC.
    #[tokio::test]
    async fn ads_client_over_tls_fetches_the_readme_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let (ca_pem, cert, key) = pki();
        let files = TlsFiles {
            cert: dir.path().join("server.pem"),
            key: dir.path().join("server-key.pem"),
            client_ca: None,
        };
        std::fs::write(&files.cert, cert).unwrap();
        std::fs::write(&files.key, key).unwrap();
        let server = readme_builder()
            .tls(Arc::new(TlsReloader::new(files).unwrap()))
            .build();
        let s = serve(server).await;

        let connector = TlsConnector {
            addr: s.addr,
            config: client_config(&ca_pem),
        };
        let channel = tokio::time::timeout(
            T,
            Endpoint::from_static("http://localhost").connect_with_connector(connector),
        )
        .await
        .expect("TLS connects within the bound")
        .unwrap();
        assert_eq!(ads_clusters(channel, "tls-node").await, ["web"]);

        // The same port does not speak plaintext gRPC.
        let plain = tokio::time::timeout(
            T,
            Channel::from_shared(format!("http://{}", s.addr))
                .unwrap()
                .connect(),
        )
        .await
        .expect("bounded");
        if let Ok(channel) = plain {
            let mut client = AggregatedDiscoveryServiceClient::new(channel);
            let req = DiscoveryRequest {
                type_url: ResourceType::Cluster.type_url().into(),
                node: Some(node("plain-node")),
                ..Default::default()
            };
            let r = tokio::time::timeout(
                T,
                client.stream_aggregated_resources(tokio_stream::iter([req])),
            )
            .await
            .expect("bounded");
            assert!(r.is_err(), "plaintext ADS was served on the TLS port");
        }
    }
}
