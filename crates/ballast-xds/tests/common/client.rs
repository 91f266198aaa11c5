//! An in-process xDS test client over real gRPC: sends exactly the requests a
//! test scripts, and receives responses with a bounded wait.

use std::time::Duration;

use ballast_xds::ResourceType;
use ballast_xds::envoy_types::pb::envoy::config::core::v3::Node;
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use ballast_xds::envoy_types::pb::google::rpc::Status as RpcStatus;
use tokio::sync::mpsc;
use tonic::Streaming;
use tonic::transport::Channel;

pub const RECV: Duration = Duration::from_secs(10);
/// How long "nothing arrives" is observed for. Absence cannot be proven
/// faster; this bounds the test, it does not measure speed.
pub const QUIET: Duration = Duration::from_millis(400);

pub fn node(id: &str) -> Node {
    Node {
        id: id.to_string(),
        cluster: "test".into(),
        ..Default::default()
    }
}

pub async fn channel(addr: std::net::SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

pub struct Sotw {
    tx: mpsc::Sender<DiscoveryRequest>,
    rx: Streaming<DiscoveryResponse>,
    node: Option<Node>,
}

impl Sotw {
    pub async fn connect(addr: std::net::SocketAddr, node_id: &str) -> Sotw {
        // Accepts responses beyond gRPC's default 4 MiB, to observe them.
        let mut client = AggregatedDiscoveryServiceClient::new(channel(addr).await)
            .max_decoding_message_size(64 * 1024 * 1024);
        let (tx, rx) = mpsc::channel(16);
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        let resp = client.stream_aggregated_resources(stream);
        Sotw {
            tx,
            rx: PendingStream::resolve(resp).await,
            node: Some(node(node_id)),
        }
    }

    /// Sends a request; the node goes on the first one only (like Envoy).
    pub async fn request(&mut self, ty: ResourceType, names: &[&str], version: &str, nonce: &str) {
        self.send(DiscoveryRequest {
            type_url: ty.type_url().into(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            version_info: version.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        })
        .await
    }

    pub async fn send(&mut self, mut req: DiscoveryRequest) {
        if let Some(n) = self.node.take() {
            req.node = Some(n);
        }
        self.tx.send(req).await.unwrap();
    }

    /// Requests `names` of `ty` afresh (no version, no nonce), receives the answer and ACKs it:
    /// a client settling one type before a test's step.
    pub async fn synced(&mut self, ty: ResourceType, names: &[&str]) -> DiscoveryResponse {
        self.request(ty, names, "", "").await;
        let resp = self.recv().await;
        self.ack(&resp, names).await;
        resp
    }

    pub async fn ack(&mut self, resp: &DiscoveryResponse, names: &[&str]) {
        let ty = ResourceType::from_type_url(&resp.type_url).unwrap();
        self.request(ty, names, &resp.version_info, &resp.nonce)
            .await
    }

    pub async fn nack(&mut self, resp: &DiscoveryResponse, names: &[&str], prev_version: &str) {
        self.send(DiscoveryRequest {
            type_url: resp.type_url.clone(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            version_info: prev_version.into(),
            response_nonce: resp.nonce.clone(),
            error_detail: Some(RpcStatus {
                code: 3,
                message: "rejected by test".into(),
                details: vec![],
            }),
            ..Default::default()
        })
        .await
    }

    pub async fn recv(&mut self) -> DiscoveryResponse {
        tokio::time::timeout(RECV, self.rx.message())
            .await
            .expect("a response within the bound")
            .expect("stream ok")
            .expect("stream open")
    }

    /// The next response, if one arrives within [`QUIET`].
    pub async fn recv_if_any(&mut self) -> Option<DiscoveryResponse> {
        tokio::time::timeout(QUIET, self.rx.message())
            .await
            .ok()
            .map(|r| r.expect("stream ok").expect("stream open"))
    }

    /// Asserts nothing arrives during [`QUIET`].
    pub async fn expect_quiet(&mut self) {
        if let Ok(r) = tokio::time::timeout(QUIET, self.rx.message()).await {
            panic!(
                "expected no response, got {:?}",
                r.map(|m| m.map(|m| (m.type_url, m.version_info, m.resources.len())))
            );
        }
    }
}

pub struct Delta {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    rx: Streaming<DeltaDiscoveryResponse>,
    node: Option<Node>,
}

impl Delta {
    pub async fn connect(addr: std::net::SocketAddr, node_id: &str) -> Delta {
        let mut client = AggregatedDiscoveryServiceClient::new(channel(addr).await);
        let (tx, rx) = mpsc::channel(16);
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        let resp = client.delta_aggregated_resources(stream);
        Delta {
            tx,
            rx: PendingStream::resolve(resp).await,
            node: Some(node(node_id)),
        }
    }

    pub async fn send(&mut self, mut req: DeltaDiscoveryRequest) {
        if let Some(n) = self.node.take() {
            req.node = Some(n);
        }
        self.tx.send(req).await.unwrap();
    }

    pub async fn subscribe(&mut self, ty: ResourceType, sub: &[&str], unsub: &[&str]) {
        self.send(DeltaDiscoveryRequest {
            type_url: ty.type_url().into(),
            resource_names_subscribe: sub.iter().map(|s| s.to_string()).collect(),
            resource_names_unsubscribe: unsub.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
        .await
    }

    /// Subscribes to `sub` of `ty`, receives the answer and ACKs it: a client settling one type
    /// before a test's step.
    pub async fn subscribed(&mut self, ty: ResourceType, sub: &[&str]) -> DeltaDiscoveryResponse {
        self.subscribe(ty, sub, &[]).await;
        let resp = self.recv().await;
        self.ack(&resp).await;
        resp
    }

    pub async fn ack(&mut self, resp: &DeltaDiscoveryResponse) {
        self.send(DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            ..Default::default()
        })
        .await
    }

    pub async fn nack(&mut self, resp: &DeltaDiscoveryResponse) {
        self.send(DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            error_detail: Some(RpcStatus {
                code: 3,
                message: "rejected by test".into(),
                details: vec![],
            }),
            ..Default::default()
        })
        .await
    }

    pub async fn recv(&mut self) -> DeltaDiscoveryResponse {
        tokio::time::timeout(RECV, self.rx.message())
            .await
            .expect("a response within the bound")
            .expect("stream ok")
            .expect("stream open")
    }

    pub async fn expect_quiet(&mut self) {
        if let Ok(r) = tokio::time::timeout(QUIET, self.rx.message()).await {
            panic!(
                "expected no response, got {:?}",
                r.map(|m| m.map(|m| (m.type_url, m.resources.len(), m.removed_resources)))
            );
        }
    }
}

/// Resolves the response-stream future in the background: tonic yields it only
/// once the server sends headers, which ours does when the stream is accepted.
struct PendingStream;

impl PendingStream {
    async fn resolve<T, F>(fut: F) -> Streaming<T>
    where
        F: std::future::Future<Output = Result<tonic::Response<Streaming<T>>, tonic::Status>>,
    {
        tokio::time::timeout(RECV, fut)
            .await
            .expect("stream accepted")
            .expect("stream ok")
            .into_inner()
    }
}
