//! The xDS servers: gRPC services (ADS and per-type, SotW and Delta, Fetch),
//! REST-JSON and CSDS, all driving the machines in `crate::protocol`.
//!
//! Where a `DiscoveryRequest` is handled: `stream.rs` (gRPC streams),
//! `fetch.rs` (unary Fetch and REST-JSON), `csds.rs` (client status).

pub mod age;
mod body;
pub mod codec;
pub mod csds;
pub mod fetch;
pub mod grpc;
pub mod limits;
pub mod rest;
pub mod resume_guard;
pub mod stream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::cache::SnapshotCache;
use crate::events::{NoopObserver, XdsObserver};
use crate::registry::{DEFAULT_GRACE, NodeRegistry};
use crate::security::admission::RejectionLog;
use crate::security::{
    Access, Admission, AdmissionRequest, PeerIdentity, RejectionRecord, TlsReloader,
};
pub use limits::Limits;

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

/// How long [`XdsServer::serve_with_shutdown`] waits for connections to
/// close after shutdown began, by default.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The status every open stream ends with when the server shuts down: Envoy
/// (and gRPC clients) keep their config and retry UNAVAILABLE, reconnecting to
/// whichever replica answers.
pub fn shutting_down() -> tonic::Status {
    tonic::Status::unavailable("the xDS server is shutting down")
}

pub(crate) struct Shared {
    pub cache: SnapshotCache,
    pub registry: NodeRegistry,
    pub grouper: NodeGrouper,
    pub limits: Limits,
    pub observer: Arc<dyn XdsObserver>,
    pub stream_counts: Arc<limits::StreamCounts>,
    /// The one drain signal every long-lived task (streams, fetches, CSDS)
    /// watches; cancelled once, when shutdown begins.
    pub drain: CancellationToken,
    pub shutdown_grace: Duration,
    pub tls: Option<Arc<TlsReloader>>,
    pub admission: Option<Admission>,
    pub rejections: RejectionLog,
    pub resume_guard: Option<resume_guard::ResumeGuardConfig>,
    pub max_connection_age: Option<Duration>,
}

impl Shared {
    /// Stream admission (see [`XdsServerBuilder::admission`]): a refusal is
    /// recorded and becomes `PERMISSION_DENIED` naming identity and group.
    pub(crate) fn admit(
        &self,
        peer: Option<&PeerIdentity>,
        node: &Node,
        group: &str,
    ) -> Result<(), tonic::Status> {
        let Some(admission) = &self.admission else {
            return Ok(());
        };
        let req = AdmissionRequest {
            peer,
            node,
            group,
            access: Access::Config,
        };
        admission(&req).map_err(|rejection| {
            tracing::warn!(node = %node.id, %rejection, "xDS request refused");
            self.rejections.push(node, &rejection);
            self.observer.on_event(&crate::events::XdsEvent::Rejected {
                node: node.id.as_str().into(),
                group: group.into(),
                identity: rejection.identity.clone(),
            });
            tonic::Status::permission_denied(rejection.to_string())
        })
    }

    /// Whether `peer` may read the status of `node` (CSDS); no record.
    pub(crate) fn may_see(&self, peer: Option<&PeerIdentity>, node: &Node, group: &str) -> bool {
        self.admission.as_ref().is_none_or(|a| {
            a(&AdmissionRequest {
                peer,
                node,
                group,
                access: Access::ClientStatus,
            })
            .is_ok()
        })
    }
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
    limits: Limits,
    shutdown_grace: Duration,
    tls: Option<Arc<TlsReloader>>,
    admission: Option<Admission>,
    resume_guard: Option<resume_guard::ResumeGuardConfig>,
    max_connection_age: Option<Duration>,
}

impl XdsServerBuilder {
    /// Close each connection after this age (±10% jitter, see [`age`]) so clients rebalance
    /// over replicas added later; off by default.
    pub fn max_connection_age(mut self, age: Option<Duration>) -> Self {
        self.max_connection_age = age;
        self
    }
    /// Limits on request sizes, names per request, streams and node sizes.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }
    /// Serve TLS (or mTLS, when the files name a client CA) instead of
    /// plaintext; gRPC and REST-JSON alike. The files are re-read when they
    /// change (see [`TlsReloader`]). Use [`TlsReloader::new`] to load them.
    pub fn tls(mut self, tls: Arc<TlsReloader>) -> Self {
        self.tls = Some(tls);
        self
    }
    /// Decides, per stream, fetch and CSDS entry, whether the peer (its
    /// client certificate's identity, `None` without one) may be served a
    /// node's group. Refused streams and fetches get `PERMISSION_DENIED`
    /// before anything is sent; CSDS lists only admitted nodes. Without a
    /// policy, everything is admitted (the loopback default).
    pub fn admission(mut self, admission: Admission) -> Self {
        self.admission = Some(admission);
        self
    }
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
    /// The bound on [`XdsServer::serve_with_shutdown`] after shutdown began:
    /// streams are ended at once, and connections that still have not closed
    /// after this long (a client that stopped reading) are abandoned, so the
    /// future completes even if clients misbehave. Default 5 s.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }
    pub fn build(self) -> XdsServer {
        XdsServer {
            shared: Arc::new(Shared {
                registry: NodeRegistry::new(self.grace, self.observer.clone()),
                cache: self.cache,
                grouper: self.grouper,
                limits: self.limits,
                observer: self.observer.clone(),
                stream_counts: Default::default(),
                drain: CancellationToken::new(),
                shutdown_grace: self.shutdown_grace,
                tls: self.tls,
                admission: self.admission,
                rejections: RejectionLog::default(),
                resume_guard: self.resume_guard,
                max_connection_age: self.max_connection_age,
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
            limits: Limits::default(),
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            tls: None,
            admission: None,
            resume_guard: None,
            max_connection_age: None,
        }
    }

    /// Begins shutdown: every open stream ends with UNAVAILABLE, new streams
    /// and fetches are refused the same way, and a running
    /// [`serve_with_shutdown`](Self::serve_with_shutdown) stops. For servers
    /// embedded in another tonic server via [`routes`](Self::routes).
    /// Irreversible: a shut-down server serves nothing more.
    pub fn shutdown(&self) {
        self.shared.drain.cancel();
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shared.drain.is_cancelled()
    }

    pub fn cache(&self) -> &SnapshotCache {
        &self.shared.cache
    }

    pub fn registry(&self) -> &NodeRegistry {
        &self.shared.registry
    }

    /// The most recent refused requests (bounded) and how many there were since start.
    pub fn rejections(&self) -> (Vec<RejectionRecord>, u64) {
        self.shared.rejections.snapshot()
    }

    /// The TLS configuration of the xDS port, if any.
    pub fn tls(&self) -> Option<&Arc<TlsReloader>> {
        self.shared.tls.as_ref()
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

    /// Serves on `listener` until `shutdown` resolves (or [`shutdown`](Self::shutdown)
    /// is called); then every stream ends with UNAVAILABLE, and the future
    /// completes once connections closed, or after the builder's
    /// `shutdown_grace` at the latest. HTTP/2 windows are sized like Envoy's
    /// so large pushes are not throttled by flow control.
    pub async fn serve_with_shutdown(
        self,
        listener: TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        let drain = self.shared.drain.clone();
        let grace = self.shared.shutdown_grace;
        let max_age = self.shared.max_connection_age;
        let incoming = tokio_stream::StreamExt::map(
            crate::security::tls::incoming(listener, self.shared.tls.clone()),
            move |c| c.map(|c| age::Aged::new(c, max_age)),
        );
        // tonic stops accepting and closes idle connections on the same
        // signal the streams watch.
        let serve = tonic::transport::Server::builder()
            .accept_http1(true)
            .initial_stream_window_size(Some(16 * 1024 * 1024))
            .initial_connection_window_size(Some(64 * 1024 * 1024))
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .add_routes(self.routes())
            .serve_with_incoming_shutdown(incoming, drain.clone().cancelled_owned());
        tokio::pin!(serve);
        tokio::select! {
            r = &mut serve => return r,
            _ = shutdown => drain.cancel(),
            _ = drain.cancelled() => {}
        }
        tracing::info!(?grace, "xDS server shutting down: ending every stream");
        match tokio::time::timeout(grace, serve).await {
            Ok(r) => r,
            Err(_) => {
                // A client that stops reading keeps its connection open
                // forever; its streams are already ended on our side.
                tracing::warn!(
                    ?grace,
                    "connections still open after the shutdown grace; abandoning them"
                );
                Ok(())
            }
        }
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
