//! gRPC service plumbing: one tower service per xDS service name (ADS, CDS,
//! EDS, LDS, RDS, SDS), each routing `Stream*` (SotW), `Delta*` and `Fetch*`
//! methods to the drivers with our own codec.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use tonic::body::Body;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};

use super::XdsServer;
use super::body::{RequestStream, ResponseBody};
use super::codec::{ChunkedMessage, XdsCodec};
use super::stream::Machine;
use crate::events::StreamKind;
use crate::protocol::SotwResponse;
use crate::protocol::delta::DeltaMachine;
use crate::protocol::sotw::SotwMachine;
use crate::resource::ResourceType;

/// A gRPC xDS service: its name and the one type it serves (`None` = ADS).
pub trait ServiceSpec: Send + Sync + 'static {
    const NAME: &'static str;
    const TYPE: Option<ResourceType>;
}

macro_rules! spec {
    ($name:ident, $svc:literal, $ty:expr) => {
        #[derive(Debug, Clone, Copy)]
        pub struct $name;
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
    Sds,
    "envoy.service.secret.v3.SecretDiscoveryService",
    Some(ResourceType::Secret)
);

pub struct XdsService<S> {
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
    pub fn new(server: XdsServer) -> Self {
        XdsService {
            server,
            _spec: PhantomData,
        }
    }
}

impl<S: ServiceSpec> NamedService for XdsService<S> {
    const NAME: &'static str = S::NAME;
}

/// Max request size we accept (gRPC default is 4 MiB; requests are small).
const MAX_REQUEST: usize = 16 * 1024 * 1024;

impl<S, B> tower_service::Service<http::Request<B>> for XdsService<S>
where
    S: ServiceSpec,
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>,
    >;

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
            let resp = if method.starts_with("Stream") {
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
                let svc = FetchSvc {
                    server,
                    ty: S::TYPE.expect("per-type"),
                };
                Grpc::new(XdsCodec::<SotwResponse, DiscoveryRequest>::default())
                    .max_decoding_message_size(MAX_REQUEST)
                    .unary(svc, req)
                    .await
            } else {
                Status::unimplemented(format!("unknown method {method}")).into_http()
            };
            Ok(resp)
        })
    }
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// Serves a bidirectional xDS stream: requests decoded by [`RequestStream`],
/// responses written by [`ResponseBody`] around the resources' shared bytes.
fn streaming<M, B>(
    server: XdsServer,
    machine: M,
    kind: StreamKind,
    req: http::Request<B>,
) -> http::Response<Body>
where
    M: Machine,
    M::Req: prost::Message + Default,
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
    let peer = crate::security::ConnInfo::peer_of(req.extensions());
    let requests = RequestStream::<M::Req>::new(req.into_body(), MAX_REQUEST);
    let rx = super::stream::spawn(server, machine, kind, requests, peer);
    let mut resp = http::Response::new(Body::new(ResponseBody::new(rx)));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    resp
}

struct FetchSvc {
    server: XdsServer,
    ty: ResourceType,
}

impl UnaryService<DiscoveryRequest> for FetchSvc {
    type Response = SotwResponse;
    type Future = BoxFuture<Result<Response<SotwResponse>, Status>>;

    fn call(&mut self, request: Request<DiscoveryRequest>) -> Self::Future {
        let server = self.server.clone();
        let ty = self.ty;
        Box::pin(async move {
            let peer = crate::security::ConnInfo::peer_of(request.extensions());
            let mut req = request.into_inner();
            // A gRPC Fetch always answers; "not modified" is a REST notion.
            req.version_info.clear();
            match super::fetch::fetch_as(&server, ty, &req, peer.as_deref()).await? {
                Some(resp) => Ok(Response::new(resp)),
                None => Err(Status::internal("no response computed")),
            }
        })
    }
}
