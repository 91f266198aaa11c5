//! REST-JSON xDS: `POST /v3/discovery:{clusters,endpoints,listeners,routes,secrets}`
//! with a proto-JSON `DiscoveryRequest`; answers the same as a SotW stream would,
//! or `304 Not Modified` when the client's `version_info` is current.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use prost::Name;

use super::XdsServer;
use super::codec::WireMessage;
use crate::json;
use crate::resource::ResourceType;

pub(crate) fn add_routes(server: &XdsServer, router: &mut axum::Router) {
    let mut r = std::mem::take(router);
    for (path, ty) in [
        ("/v3/discovery:clusters", ResourceType::Cluster),
        (
            "/v3/discovery:endpoints",
            ResourceType::ClusterLoadAssignment,
        ),
        ("/v3/discovery:listeners", ResourceType::Listener),
        ("/v3/discovery:routes", ResourceType::RouteConfiguration),
        ("/v3/discovery:secrets", ResourceType::Secret),
    ] {
        let sub = axum::Router::new()
            .route(path, post(handle))
            .with_state((server.clone(), ty));
        r = r.merge(sub);
    }
    *router = r;
}

fn error(status: StatusCode, message: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({ "error": message }).to_string(),
    )
        .into_response()
}

async fn handle(
    State((server, ty)): State<(XdsServer, ResourceType)>,
    ext: axum::http::Extensions,
    body: Bytes,
) -> Response {
    let peer = crate::security::ConnInfo::peer_of(&ext);
    let req: DiscoveryRequest = match json::message_from_json(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    match super::fetch::fetch_as(&server, ty, &req, peer.as_deref()).await {
        Ok(None) => StatusCode::NOT_MODIFIED.into_response(),
        Ok(Some(resp)) => {
            let mut buf = Vec::with_capacity(resp.encoded_len());
            resp.encode_raw(&mut buf);
            match json::bytes_to_json(&DiscoveryResponse::full_name(), &buf) {
                Ok(v) => (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/json")],
                    v.to_string(),
                )
                    .into_response(),
                Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            }
        }
        Err(status) if status.code() == tonic::Code::PermissionDenied => {
            error(StatusCode::FORBIDDEN, status.message().to_string())
        }
        Err(status) => error(StatusCode::BAD_REQUEST, status.message().to_string()),
    }
}
