//! The xDS servers: gRPC services (ADS and per-type, SotW and Delta, Fetch),
//! REST-JSON and CSDS, all driving the machines in `crate::protocol`.
//!
//! Where a `DiscoveryRequest` is handled: `stream.rs` (gRPC streams),
//! `fetch.rs` (unary Fetch and REST-JSON), `csds.rs` (client status).

mod body;
pub mod codec;
pub mod csds;
pub mod fetch;
pub mod grpc;
pub mod rest;
pub mod resume_guard;
pub mod stream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use tokio::net::TcpListener;

use crate::cache::SnapshotCache;
use crate::events::{NoopObserver, XdsObserver};
use crate::registry::{DEFAULT_GRACE, NodeRegistry};

/// Maps a node to the group whose snapshot it is served; an error closes the
/// stream with that message.
pub type NodeGrouper = Arc<dyn Fn(&Node) -> Result<String, String> + Send + Sync>;

/// Groups nodes by their id (the library default).
pub fn group_by_node_id() -> NodeGrouper {
    Arc::new(|node: &Node| {
        if node.id.is_empty() {
            Err("node.id is empty".to_string())
        } else {
            Ok(node.id.clone())
        }
    })
}

pub(crate) struct Shared {
    pub cache: SnapshotCache,
    pub registry: NodeRegistry,
    pub grouper: NodeGrouper,
    pub resume_guard: Option<resume_guard::ResumeGuardConfig>,
}

/// An xDS management server over a [`SnapshotCache`].
#[derive(Clone)]
pub struct XdsServer {
    pub(crate) shared: Arc<Shared>,
}

pub struct XdsServerBuilder {
    cache: SnapshotCache,
    grouper: NodeGrouper,
    observer: Arc<dyn XdsObserver>,
    grace: Duration,
    resume_guard: Option<resume_guard::ResumeGuardConfig>,
}

impl XdsServerBuilder {
    /// Holds a resuming client's first push when it would remove more than
    /// a share of what the client reports holding (see [`resume_guard`]);
    /// off by default.
    pub fn resume_guard(mut self, cfg: Option<resume_guard::ResumeGuardConfig>) -> Self {
        self.resume_guard = cfg;
        self
    }
    pub fn grouper(mut self, grouper: NodeGrouper) -> Self {
        self.grouper = grouper;
        self
    }
    pub fn observer(mut self, observer: Arc<dyn XdsObserver>) -> Self {
        self.observer = observer;
        self
    }
    /// How long a node's state is kept after its last stream closes.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }
    pub fn build(self) -> XdsServer {
        XdsServer {
            shared: Arc::new(Shared {
                registry: NodeRegistry::new(self.grace, self.observer),
                cache: self.cache,
                grouper: self.grouper,
                resume_guard: self.resume_guard,
            }),
        }
    }
}

impl XdsServer {
    pub fn builder(cache: SnapshotCache) -> XdsServerBuilder {
        XdsServerBuilder {
            cache,
            grouper: group_by_node_id(),
            observer: Arc::new(NoopObserver),
            grace: DEFAULT_GRACE,
            resume_guard: None,
        }
    }

    pub fn cache(&self) -> &SnapshotCache {
        &self.shared.cache
    }

    pub fn registry(&self) -> &NodeRegistry {
        &self.shared.registry
    }

    /// Every gRPC service (ADS, CDS, EDS, LDS, RDS, SDS, CSDS) and the REST-JSON
    /// endpoints, as one router for a tonic server with HTTP/1 enabled.
    pub fn routes(&self) -> tonic::service::Routes {
        use grpc::*;
        let mut routes = tonic::service::Routes::builder();
        routes
            .add_service(XdsService::<Ads>::new(self.clone()))
            .add_service(XdsService::<Cds>::new(self.clone()))
            .add_service(XdsService::<Eds>::new(self.clone()))
            .add_service(XdsService::<Lds>::new(self.clone()))
            .add_service(XdsService::<Rds>::new(self.clone()))
            .add_service(XdsService::<Sds>::new(self.clone()))
            .add_service(csds::csds_service(self.clone()));
        let mut routes = routes.routes();
        rest::add_routes(self, routes.axum_router_mut());
        routes
    }

    /// Serves on `listener` until `shutdown` resolves. HTTP/2 windows are
    /// sized like Envoy's so large pushes are not throttled by flow control.
    pub async fn serve_with_shutdown(
        self,
        listener: TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tonic::transport::Server::builder()
            .accept_http1(true)
            .initial_stream_window_size(Some(16 * 1024 * 1024))
            .initial_connection_window_size(Some(64 * 1024 * 1024))
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .add_routes(self.routes())
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
    }

    /// Binds `addr` and serves forever.
    pub async fn serve(self, addr: SocketAddr) -> anyhow_like::Result<()> {
        let listener = TcpListener::bind(addr).await?;
        self.serve_with_shutdown(listener, std::future::pending())
            .await?;
        Ok(())
    }
}

/// Minimal error plumbing for `serve` without pulling anyhow into the library.
pub mod anyhow_like {
    pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;
}
