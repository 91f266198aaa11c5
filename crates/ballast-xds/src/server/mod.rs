//! The xDS servers: gRPC services (ADS and per-type, SotW and Delta, Fetch),
//! REST-JSON and CSDS, all driving the machines in `crate::protocol`.
//!
//! Where a `DiscoveryRequest` is handled: `stream.rs` (gRPC streams),
//! `fetch.rs` (unary Fetch and REST-JSON), `csds.rs` (client status).

pub(crate) mod age;
mod body;
pub(crate) mod codec;
#[cfg(feature = "csds")]
pub(crate) mod csds;
mod drain;
pub(crate) mod fetch;
pub(crate) mod grpc;
pub mod limits;
#[cfg(feature = "rest")]
pub(crate) mod rest;
pub(crate) mod resume_guard;
pub(crate) mod stream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use tokio::net::TcpListener;

use crate::cache::XdsCache;
use crate::events::{NoopObserver, XdsObserver};
use crate::registry::{DEFAULT_GRACE, NodeRegistry};
#[cfg(feature = "tls")]
use crate::security::TlsReloader;
use crate::security::admission::RejectionLog;
use crate::security::listen::TlsHandle;
use crate::security::{Access, Admission, AdmissionRequest, PeerIdentity, RejectionRecord};
pub(crate) use limits::Limits;

/// Maps a node to the group whose snapshot it is served (go-control-plane's
/// `NodeHash`); an error closes the stream with `INVALID_ARGUMENT` carrying
/// its message.
pub type NodeGrouper = Arc<dyn Fn(&Node) -> Result<String, GroupError> + Send + Sync>;

/// Why a [`NodeGrouper`] could not place a node in a group; its message is
/// what the client sees in the stream's status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct GroupError {
    message: String,
}

impl GroupError {
    /// An error whose message names what is wrong with the node.
    pub fn new(message: impl Into<String>) -> Self {
        GroupError {
            message: message.into(),
        }
    }

    /// The message the client is told.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// The transport a request arrived over. Resources that reference others
/// (a cluster its endpoints, a listener its routes and certificates) must name
/// a config source the Envoy can subscribe to, and that depends on how the
/// Envoy talks to the server; a [`TransportGrouper`] can give each transport
/// its own group (snapshot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// An ADS stream, State of the World.
    Ads,
    /// An ADS stream, Delta.
    DeltaAds,
    /// A per-type SotW stream (`StreamClusters`, ...).
    Grpc,
    /// A per-type Delta stream (`DeltaClusters`, ...).
    DeltaGrpc,
    /// A unary gRPC `Fetch*` call.
    Fetch,
    /// A REST-JSON poll.
    Rest,
}

impl Transport {
    /// The transport of a gRPC stream of `kind` (REST kinds are [`Transport::Rest`]).
    pub fn of_stream(kind: crate::events::StreamKind) -> Self {
        use crate::events::StreamKind;
        match kind {
            StreamKind::Sotw(None) => Transport::Ads,
            StreamKind::Delta(None) => Transport::DeltaAds,
            StreamKind::Sotw(Some(_)) => Transport::Grpc,
            StreamKind::Delta(Some(_)) => Transport::DeltaGrpc,
            StreamKind::Rest(_) => Transport::Rest,
        }
    }
}

/// Maps a node and the transport its request came over to a group; see
/// [`XdsServerBuilder::transport_grouper`].
pub type TransportGrouper =
    Arc<dyn Fn(&Node, Transport) -> Result<String, GroupError> + Send + Sync>;

/// Groups nodes by their id (the library default).
pub fn group_by_node_id() -> NodeGrouper {
    Arc::new(|node: &Node| {
        if node.id.is_empty() {
            Err(GroupError::new("node.id is empty"))
        } else {
            Ok(node.id.clone())
        }
    })
}

/// Why [`XdsServer::serve`] stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The address could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address that was asked for.
        addr: SocketAddr,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC transport failed while serving.
    #[error("serving xDS: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// How long [`XdsServer::serve_with_shutdown`] waits for connections to
/// close after shutdown began, by default.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The status every open stream ends with when the server shuts down: Envoy
/// (and gRPC clients) keep their config and retry UNAVAILABLE, reconnecting to
/// whichever replica answers.
pub(crate) fn shutting_down() -> tonic::Status {
    tonic::Status::unavailable("the xDS server is shutting down")
}

pub(crate) struct Shared {
    pub cache: Arc<dyn XdsCache>,
    pub registry: NodeRegistry,
    pub grouper: TransportGrouper,
    pub limits: Limits,
    pub observer: Arc<dyn XdsObserver>,
    pub stream_counts: Arc<limits::StreamCounts>,
    /// The one drain signal every long-lived task (streams, fetches, CSDS)
    /// watches; cancelled once, when shutdown begins.
    pub drain: drain::Drain,
    pub shutdown_grace: Duration,
    pub tls: Option<TlsHandle>,
    pub admission: Option<Admission>,
    pub rejections: RejectionLog,
    pub resume_guard: Option<resume_guard::ResumeGuardConfig>,
    /// Whether State-of-the-World (streams and unary Fetch) is served.
    pub sotw: bool,
    /// Whether Delta streams are served.
    pub delta: bool,
    pub max_connection_age: Option<Duration>,
    /// See [`XdsServerBuilder::push_interval`]; zero: off.
    pub push_interval: Duration,
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
    #[cfg(feature = "csds")]
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

/// An xDS management server over an [`XdsCache`] (usually a
/// [`SnapshotCache`](crate::SnapshotCache)).
#[derive(Clone)]
pub struct XdsServer {
    pub(crate) shared: Arc<Shared>,
}

/// Configures an [`XdsServer`]; start with [`XdsServer::builder`].
pub struct XdsServerBuilder {
    cache: Arc<dyn XdsCache>,
    grouper: TransportGrouper,
    observer: Arc<dyn XdsObserver>,
    grace: Duration,
    limits: Limits,
    shutdown_grace: Duration,
    tls: Option<TlsHandle>,
    admission: Option<Admission>,
    resume_guard: Option<resume_guard::ResumeGuardConfig>,
    sotw: bool,
    delta: bool,
    max_connection_age: Option<Duration>,
    push_interval: Duration,
}

impl XdsServerBuilder {
    /// Serve State-of-the-World streams and unary Fetch (default `true`).
    /// Off, they are answered `UNIMPLEMENTED` naming the protocol: for a
    /// Delta-only deployment, where a client configured for SotW must fail
    /// loudly rather than be served.
    pub fn sotw(mut self, enabled: bool) -> Self {
        self.sotw = enabled;
        self
    }
    /// Serve Delta (incremental) streams (default `true`); off, they are
    /// answered `UNIMPLEMENTED`.
    pub fn delta(mut self, enabled: bool) -> Self {
        self.delta = enabled;
        self
    }
    /// Close each connection after this age (±10% jitter) so clients rebalance
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
    #[cfg(feature = "tls")]
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
    /// a share of what the client reports holding (see [`ResumeGuardConfig`](crate::ResumeGuardConfig));
    /// off by default.
    pub fn resume_guard(mut self, cfg: Option<resume_guard::ResumeGuardConfig>) -> Self {
        self.resume_guard = cfg;
        self
    }
    /// How nodes map to groups (default: [`group_by_node_id`]), the same whatever
    /// transport they use.
    pub fn grouper(mut self, grouper: NodeGrouper) -> Self {
        self.grouper = Arc::new(move |node: &Node, _| grouper(node));
        self
    }
    /// Groups nodes by node and transport: the group a stream, fetch or poll
    /// is served from is `grouper(node, transport)`, so an application can
    /// publish per-transport snapshots (e.g. `ads: {}` config sources for ADS
    /// Envoys, `api_config_source` for the others).
    pub fn transport_grouper(mut self, grouper: TransportGrouper) -> Self {
        self.grouper = grouper;
        self
    }
    /// Receives every stream event (default: none).
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
    /// Paces publishes per stream: a stream takes a newly published snapshot
    /// at most once per `interval`; publishes in between wait, and the
    /// stream then plans once against the newest (one push for all of them).
    /// Off (zero) by default: every publish is pushed as soon as the client
    /// has acknowledged the previous response.
    ///
    /// The trade-off: a change can wait up to `interval` longer, and in
    /// exchange a fleet under a steady stream of publishes (endpoint churn)
    /// costs the server one wake-up, one plan and one response per stream
    /// per interval instead of per publish (issue #13, W2 in
    /// docs/benchmarks.md). Requests are still answered at once (against the
    /// snapshot the stream last took), and readiness changes are not paced.
    pub fn push_interval(mut self, interval: Duration) -> Self {
        self.push_interval = interval;
        self
    }
    /// The server; serve it with [`XdsServer::serve_with_shutdown`] or mount
    /// [`XdsServer::routes`] in your own tonic server.
    pub fn build(self) -> XdsServer {
        XdsServer {
            shared: Arc::new(Shared {
                registry: NodeRegistry::new(self.grace, self.observer.clone()),
                cache: self.cache,
                grouper: self.grouper,
                limits: self.limits,
                observer: self.observer.clone(),
                stream_counts: Default::default(),
                drain: drain::Drain::new(),
                shutdown_grace: self.shutdown_grace,
                tls: self.tls,
                admission: self.admission,
                rejections: RejectionLog::default(),
                resume_guard: self.resume_guard,
                sotw: self.sotw,
                delta: self.delta,
                max_connection_age: self.max_connection_age,
                push_interval: self.push_interval,
            }),
        }
    }
}

impl XdsServer {
    /// A server over `cache`, with library defaults for everything else.
    /// Takes any [`XdsCache`]: a [`SnapshotCache`](crate::SnapshotCache), or your own.
    pub fn builder(cache: impl XdsCache) -> XdsServerBuilder {
        XdsServerBuilder {
            cache: Arc::new(cache),
            grouper: {
                let by_id = group_by_node_id();
                Arc::new(move |node: &Node, _| by_id(node))
            },
            observer: Arc::new(NoopObserver),
            grace: DEFAULT_GRACE,
            limits: Limits::default(),
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            tls: None,
            admission: None,
            resume_guard: None,
            sotw: true,
            delta: true,
            max_connection_age: None,
            push_interval: Duration::ZERO,
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

    /// Whether [`shutdown`](Self::shutdown) began.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.drain.is_cancelled()
    }

    /// The cache it serves.
    pub fn cache(&self) -> &dyn XdsCache {
        &*self.shared.cache
    }

    /// The nodes it knows and their sync state (go-control-plane's `GetStatusInfo`).
    pub fn registry(&self) -> &NodeRegistry {
        &self.shared.registry
    }

    /// The most recent refused requests (bounded) and how many there were since start.
    pub fn rejections(&self) -> (Vec<RejectionRecord>, u64) {
        self.shared.rejections.snapshot()
    }

    /// The TLS configuration of the xDS port, if any.
    #[cfg(feature = "tls")]
    pub fn tls(&self) -> Option<&Arc<TlsReloader>> {
        self.shared.tls.as_ref()
    }

    /// Every gRPC service (ADS, CDS, EDS, LDS, RDS, VHDS, SDS, CSDS) and the REST-JSON
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
            .add_service(XdsService::<Vhds>::new(self.clone()))
            .add_service(XdsService::<Sds>::new(self.clone()));
        #[cfg(feature = "csds")]
        routes.add_service(csds::csds_service(self.clone()));
        #[allow(unused_mut)]
        let mut routes = routes.routes();
        #[cfg(feature = "rest")]
        rest::add_routes(self, routes.axum_router_mut());
        routes
    }

    /// Serves on `listener` until `shutdown` resolves (or [`shutdown`](Self::shutdown)
    /// is called); then every stream ends with UNAVAILABLE, and the future
    /// completes once connections closed, or after the builder's
    /// `shutdown_grace` at the latest. The server's HTTP/2 windows bound only
    /// what clients send (pushes flow in each client's windows): a stream's
    /// holds one maximal request (`Limits::max_request_bytes`), which caps
    /// what a client can make the server buffer ahead of its decoding.
    pub async fn serve_with_shutdown(
        self,
        listener: TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        let drain = self.shared.drain.clone();
        let grace = self.shared.shutdown_grace;
        let max_age = self.shared.max_connection_age;
        // (HTTP/2 windows are at most 2^31 - 1.)
        let stream_window = self
            .shared
            .limits
            .max_request_bytes
            .clamp(64 * 1024, (1 << 29) - 1) as u32;
        // A connection still open a grace after the drain (a client that
        // stopped reading: its stream's body is no longer polled) is closed.
        let conn_drain = drain.clone();
        let incoming = tokio_stream::StreamExt::map(
            crate::security::listen::incoming(listener, self.shared.tls.as_ref()),
            move |c| c.map(|c| age::Aged::new(c, max_age, Some((conn_drain.clone(), grace)))),
        );
        // tonic stops accepting and closes idle connections on the same
        // signal the streams watch.
        let serve = tonic::transport::Server::builder()
            .accept_http1(true)
            .initial_stream_window_size(Some(stream_window))
            .initial_connection_window_size(Some(stream_window.saturating_mul(4)))
            // No HTTP/2 PING keepalive: hyper's takes a lock and reads the
            // clock on every DATA frame and every wake of a connection (~5 %
            // of the server's CPU at 1,000 churning proxies, W2 in
            // docs/benchmarks.md). Dead peers are found by the kernel
            // instead: TCP keepalive and TCP_USER_TIMEOUT, set at accept
            // (`security::listen`). Envoy's own PINGs are still answered.
            .http2_keepalive_interval(None)
            .serve_with_incoming_shutdown(
                grpc::Dispatch::new(self.clone()),
                incoming,
                drain.clone().cancelled_owned(),
            );
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
                // Connections close themselves a grace after the drain
                // (`age::Aged`); this bounds the wait for them.
                tracing::warn!(
                    ?grace,
                    "connections still open after the shutdown grace; abandoning them"
                );
                Ok(())
            }
        }
    }

    /// Binds `addr` and serves until [`shutdown`](Self::shutdown) is called.
    pub async fn serve(self, addr: SocketAddr) -> Result<(), ServeError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Bind { addr, source })?;
        self.serve_with_shutdown(listener, std::future::pending())
            .await?;
        Ok(())
    }
}
