//! gRPC service plumbing: one tower service per xDS service name (ADS, CDS,
//! EDS, LDS, RDS, SDS), each routing `Stream*` (SotW), `Delta*` and `Fetch*`
//! methods to the drivers with our own codec.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use tonic::Status;
use tonic::body::Body;
use tonic::server::NamedService;

use super::XdsServer;
use super::body::{RequestStream, ResponseBody};
use super::codec::ChunkedMessage;
use super::stream::Machine;
use crate::events::StreamKind;
use crate::protocol::SotwResponse;
use crate::protocol::delta::DeltaMachine;
use crate::protocol::sotw::SotwMachine;
use crate::resource::ResourceType;

/// A gRPC xDS service: its name and the one type it serves (`None` = ADS).
pub(crate) trait ServiceSpec: Send + Sync + 'static {
    const NAME: &'static str;
    const TYPE: Option<ResourceType>;
}

macro_rules! spec {
    ($name:ident, $svc:literal, $ty:expr) => {
        #[derive(Debug, Clone, Copy)]
        pub(crate) struct $name;
        impl ServiceSpec for $name {
            const NAME: &'static str = $svc;
            const TYPE: Option<ResourceType> = $ty;
        }
    };
}

spec!(
    Ads,
    "envoy.service.discovery.v3.AggregatedDiscoveryService",
    None
);
spec!(
    Cds,
    "envoy.service.cluster.v3.ClusterDiscoveryService",
    Some(ResourceType::Cluster)
);
spec!(
    Eds,
    "envoy.service.endpoint.v3.EndpointDiscoveryService",
    Some(ResourceType::ClusterLoadAssignment)
);
spec!(
    Lds,
    "envoy.service.listener.v3.ListenerDiscoveryService",
    Some(ResourceType::Listener)
);
spec!(
    Rds,
    "envoy.service.route.v3.RouteDiscoveryService",
    Some(ResourceType::RouteConfiguration)
);
spec!(
    Vhds,
    "envoy.service.route.v3.VirtualHostDiscoveryService",
    Some(ResourceType::VirtualHost)
);
spec!(
    Sds,
    "envoy.service.secret.v3.SecretDiscoveryService",
    Some(ResourceType::Secret)
);

/// The answer to one call, from [`XdsService`] or [`Dispatch`].
pub(crate) type CallFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<http::Response<Body>, Infallible>> + Send>,
>;

pub(crate) struct XdsService<S> {
    server: XdsServer,
    _spec: PhantomData<S>,
}

impl<S> Clone for XdsService<S> {
    fn clone(&self) -> Self {
        XdsService {
            server: self.server.clone(),
            _spec: PhantomData,
        }
    }
}

impl<S: ServiceSpec> XdsService<S> {
    pub(crate) fn new(server: XdsServer) -> Self {
        XdsService {
            server,
            _spec: PhantomData,
        }
    }
}

impl<S: ServiceSpec> NamedService for XdsService<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tower_service::Service<http::Request<B>> for XdsService<S>
where
    S: ServiceSpec,
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = CallFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = req
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_string();
        let server = self.server.clone();
        Box::pin(async move {
            let is_ads = S::TYPE.is_none();
            let (sotw, delta) = (server.shared.sotw, server.shared.delta);
            let resp = if (method.starts_with("Stream") || method.starts_with("Fetch")) && !sotw {
                Status::unimplemented(
                    "State-of-the-World xDS is disabled on this server; use Delta",
                )
                .into_http()
            } else if method.starts_with("Delta") && !delta {
                Status::unimplemented(
                    "Delta xDS is disabled on this server; use State-of-the-World",
                )
                .into_http()
            } else if method.starts_with("Stream") {
                streaming(
                    server,
                    SotwMachine::new(S::TYPE),
                    StreamKind::Sotw(S::TYPE),
                    req,
                )
            } else if method.starts_with("Delta") {
                streaming(
                    server,
                    DeltaMachine::new(S::TYPE),
                    StreamKind::Delta(S::TYPE),
                    req,
                )
            } else if method.starts_with("Fetch") && !is_ads {
                unary_fetch(server, S::TYPE.expect("per-type"), req).await
            } else {
                Status::unimplemented(format!("unknown method {method}")).into_http()
            };
            Ok(resp)
        })
    }
}

/// Serves a bidirectional xDS stream: requests decoded by [`RequestStream`],
/// responses written by [`ResponseBody`] around the resources' shared bytes;
/// the body drives the stream (no task of its own).
fn streaming<M, B>(
    server: XdsServer,
    machine: M,
    kind: StreamKind,
    req: http::Request<B>,
) -> http::Response<Body>
where
    M: Machine,
    M::Resp: ChunkedMessage + Unpin,
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    if let Some(enc) = req.headers().get("grpc-encoding")
        && enc.as_bytes() != b"identity"
    {
        return Status::unimplemented(format!("request compression {enc:?} is not supported"))
            .into_http();
    }
    let shared = &server.shared;
    let conn = req
        .extensions()
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|c| Some((c.local_addr, c.remote_addr?)))
        // The xDS server's own listener (plaintext or TLS) says where the
        // connection comes from; the remote address identifies it.
        .or_else(|| {
            let c = req.extensions().get::<crate::security::ConnInfo>()?;
            Some((None, c.remote?))
        });
    let permit = match shared
        .stream_counts
        .open(&shared.limits, &*shared.observer, conn)
    {
        Ok(p) => p,
        Err(status) => return status.into_http(),
    };
    let peer = crate::security::ConnInfo::peer_of(req.extensions());
    let requests =
        RequestStream::<M::Req>::new(req.into_body(), &shared.limits, shared.observer.clone());
    let body = super::stream::body(server, machine, kind, requests, permit, peer);
    let mut resp = http::Response::new(Body::new(body));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    resp
}

/// Serves a unary `Fetch*` call: the request is read with the same limits as
/// a stream's (tonic's decoder would reserve the declared length up front).
async fn unary_fetch<B>(
    server: XdsServer,
    ty: ResourceType,
    req: http::Request<B>,
) -> http::Response<Body>
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    if let Some(enc) = req.headers().get("grpc-encoding")
        && enc.as_bytes() != b"identity"
    {
        return Status::unimplemented(format!("request compression {enc:?} is not supported"))
            .into_http();
    }
    let shared = &server.shared;
    let peer = crate::security::ConnInfo::peer_of(req.extensions());
    let mut requests = RequestStream::<DiscoveryRequest>::new(
        req.into_body(),
        &shared.limits,
        shared.observer.clone(),
    );
    let mut request = match requests.message().await {
        Ok(Some(r)) => r,
        Ok(None) => return Status::invalid_argument("no request message").into_http(),
        Err(status) => return status.into_http(),
    };
    // A gRPC Fetch always answers; "not modified" is a REST notion.
    request.version_info.clear();
    let resp = match super::fetch::fetch_as(&server, ty, &request, peer.as_deref()).await {
        Ok(Some(resp)) => resp,
        Ok(None) => return Status::internal("no response computed").into_http(),
        Err(status) => return status.into_http(),
    };
    let body: ResponseBody<SotwResponse> = ResponseBody::once(Box::new(resp));
    let mut out = http::Response::new(Body::new(body));
    out.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    out
}

/// The xDS port's service: an xDS gRPC call goes straight to its
/// [`XdsService`]; everything else (CSDS, REST, unknown paths) through the
/// router. The router's framework converts every request and response body
/// into its own boxed body and back, two layers each way that a stream's
/// every frame passed through (issue #13, W2).
#[derive(Clone)]
pub(crate) struct Dispatch {
    server: XdsServer,
    routes: tonic::service::Routes,
}

impl Dispatch {
    pub(crate) fn new(server: XdsServer) -> Self {
        let routes = server.routes().prepare();
        Dispatch { server, routes }
    }
}

/// The service a gRPC path names (`/{service}/{method}`).
fn service_of(path: &str) -> Option<&str> {
    let rest = path.strip_prefix('/')?;
    Some(rest.split_once('/')?.0)
}

impl tower_service::Service<http::Request<Body>> for Dispatch {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = CallFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Both the xDS services and tonic's router are always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        fn to<S: ServiceSpec>(server: &XdsServer, req: http::Request<Body>) -> CallFuture {
            XdsService::<S>::new(server.clone()).call(req)
        }
        let call = match service_of(req.uri().path()) {
            Some(Ads::NAME) => to::<Ads>,
            Some(Cds::NAME) => to::<Cds>,
            Some(Eds::NAME) => to::<Eds>,
            Some(Lds::NAME) => to::<Lds>,
            Some(Rds::NAME) => to::<Rds>,
            Some(Vhds::NAME) => to::<Vhds>,
            Some(Sds::NAME) => to::<Sds>,
            _ => return Box::pin(self.routes.call(req)),
        };
        call(&self.server, req)
    }
}

#[cfg(test)]
mod dispatch_tests {
    use super::*;

    #[test]
    fn the_service_is_the_first_path_segment() {
        assert_eq!(
            service_of(
                "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
            ),
            Some(Ads::NAME)
        );
        assert_eq!(service_of("/v3/discovery:clusters"), Some("v3"));
        assert_eq!(service_of("/healthz"), None);
        assert_eq!(service_of("no-slash/x"), None);
        assert_eq!(service_of(""), None);
    }
}
