//! REST-JSON xDS: `POST /v3/discovery:{clusters,endpoints,listeners,routes,secrets}`
//! with a proto-JSON `DiscoveryRequest`; answers the same as a SotW stream would,
//! or `304 Not Modified` when the client's `version_info` is current.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;

use super::XdsServer;
use crate::json;
use crate::resource::ResourceType;

const ENDPOINTS: [(&str, ResourceType); 5] = [
    ("/v3/discovery:clusters", ResourceType::Cluster),
    (
        "/v3/discovery:endpoints",
        ResourceType::ClusterLoadAssignment,
    ),
    ("/v3/discovery:listeners", ResourceType::Listener),
    ("/v3/discovery:routes", ResourceType::RouteConfiguration),
    ("/v3/discovery:secrets", ResourceType::Secret),
];

pub(crate) fn add_routes(server: &XdsServer, router: &mut axum::Router) {
    let mut r = std::mem::take(router);
    for (path, ty) in ENDPOINTS {
        let sub = axum::Router::new()
            .route(path, post(handle))
            .layer(DefaultBodyLimit::max(
                server.shared.limits.max_rest_body_bytes,
            ))
            .with_state((server.clone(), ty));
        r = r.merge(sub);
    }
    // Without this, tonic's fallback answers any other path with HTTP 200
    // and an empty body, which a REST client takes for success.
    r = r.route("/v3/{endpoint}", post(unknown));
    *router = r;
}

async fn unknown(axum::extract::Path(endpoint): axum::extract::Path<String>) -> Response {
    let known: Vec<&str> = ENDPOINTS.iter().map(|(p, _)| *p).collect();
    error(
        StatusCode::NOT_FOUND,
        format!(
            "no REST-xDS endpoint /v3/{endpoint}; this server answers POST on {}",
            known.join(", ")
        ),
    )
}

/// The HTTP status for a gRPC status, so REST clients can tell their own
/// mistakes (4xx) from a server that is going away (503: retry elsewhere).
fn http_status(code: tonic::Code) -> StatusCode {
    use tonic::Code;
    match code {
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
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
    headers: axum::http::HeaderMap,
    ext: axum::http::Extensions,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            // The body was cut off at the limit: its size is known only when declared.
            let max = server.shared.limits.max_rest_body_bytes;
            let declared = headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse().ok());
            let status = super::limits::exceeded(
                &*server.shared.observer,
                None,
                super::limits::name::REST_BODY_BYTES,
                "the request body size in bytes",
                declared.unwrap_or(max + 1),
                max,
                false,
            );
            return error(StatusCode::PAYLOAD_TOO_LARGE, status.message().to_string());
        }
        Err(e) => return error(e.status(), e.body_text()),
    };
    let peer = crate::security::ConnInfo::peer_of(&ext);
    let req: DiscoveryRequest = match json::message_from_json(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    // An unknown gateway (once ready) is NOT_FOUND → 404 from fetch_over.
    match super::fetch::fetch_over(&server, ty, &req, peer.as_deref(), super::Transport::Rest).await
    {
        Ok(None) => StatusCode::NOT_MODIFIED.into_response(),
        Ok(Some(resp)) => match response_json(&resp) {
            Ok(text) => (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                text,
            )
                .into_response(),
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        },
        Err(status) => error(http_status(status.code()), status.message().to_string()),
    }
}

/// The proto-JSON `DiscoveryResponse` for a REST poll. Each resource's JSON
/// is encoded once per version ([`crate::resource::Resource::any_json`]) and
/// shared by every poller; only the envelope is written per response.
fn response_json(resp: &crate::protocol::SotwResponse) -> Result<String, crate::json::JsonError> {
    let q = |s: &str| serde_json::Value::from(s).to_string();
    let mut out = String::with_capacity(128);
    out.push_str("{\"versionInfo\":");
    out.push_str(&q(&resp.version));
    if !resp.resources.is_empty() {
        out.push_str(",\"resources\":[");
        for (i, r) in resp.resources.values().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&r.any_json()?);
        }
        out.push(']');
    }
    out.push_str(",\"typeUrl\":");
    out.push_str(&q(resp.ty.type_url()));
    out.push_str(",\"nonce\":");
    out.push_str(&q(&resp.nonce));
    out.push_str(",\"controlPlane\":{\"identifier\":");
    out.push_str(&q(super::codec::CONTROL_PLANE_ID));
    out.push_str("}}");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
    use prost::Name;

    use super::*;
    use crate::protocol::SotwResponse;
    use crate::server::codec::WireMessage;

    /// Two pollers of one snapshot get byte-identical bodies from ONE JSON
    /// encoding per resource, and the body is the same proto-JSON the whole
    /// `DiscoveryResponse` converted at once gives (what Envoy parsed before).
    #[test]
    fn two_pollers_share_one_encoding_per_resource() {
        let mut b = crate::Snapshot::builder();
        for name in ["a", "b"] {
            let c = crate::simple::eds_cluster(name, std::time::Duration::from_secs(1));
            b.message(&c).unwrap();
        }
        // Clusters only (no EDS): the envelope is what is tested here.
        let snap = b.build_unchecked().unwrap();
        let resources = snap.resources(ResourceType::Cluster).clone();
        let poll = |nonce: &str| SotwResponse {
            ty: ResourceType::Cluster,
            version: snap.version(ResourceType::Cluster).clone(),
            nonce: nonce.into(),
            resources: resources.clone(),
        };
        let first = response_json(&poll("1")).unwrap();
        let second = response_json(&poll("1")).unwrap();
        assert_eq!(first, second);
        assert_eq!(resources.len(), 2);
        for r in resources.values() {
            assert_eq!(r.json_encodings.load(Ordering::Relaxed), 1, "{}", r.name());
        }
        let resp = poll("1");
        let mut buf = Vec::new();
        resp.encode_raw(&mut buf);
        let whole = json::bytes_to_json(&DiscoveryResponse::full_name(), &buf).unwrap();
        let ours: serde_json::Value = serde_json::from_str(&first).unwrap();
        assert_eq!(ours, whole);
    }

    /// A poller that is current gets 304 with an empty body and nothing is
    /// encoded for it (Envoy's RestApiFetcher keeps its config on 304 and
    /// polls again after its refresh delay).
    #[tokio::test]
    async fn current_poller_gets_304_without_any_encoding() {
        let mut b = crate::Snapshot::builder();
        for name in ["a", "b"] {
            b.message(&crate::simple::eds_cluster(
                name,
                std::time::Duration::from_secs(1),
            ))
            .unwrap();
        }
        let snap = std::sync::Arc::new(b.build_unchecked().unwrap());
        let cache = crate::SnapshotCache::new();
        cache.set_snapshot("g", snap.clone());
        cache.set_ready(true);
        let server = XdsServer::builder(cache)
            .grouper(std::sync::Arc::new(|_: &_| Ok("g".to_string())))
            .build();
        let poll = |version: &str| {
            let body = format!(r#"{{"node":{{"id":"n"}},"versionInfo":"{version}"}}"#);
            handle(
                State((server.clone(), ResourceType::Cluster)),
                axum::http::HeaderMap::new(),
                axum::http::Extensions::new(),
                Ok(Bytes::from(body)),
            )
        };
        let first = poll("").await;
        assert_eq!(first.status(), StatusCode::OK);
        let encodings = || {
            snap.resources(ResourceType::Cluster)
                .values()
                .map(|r| r.json_encodings.load(Ordering::Relaxed))
                .collect::<Vec<_>>()
        };
        assert_eq!(encodings(), [1, 1]);
        let current = snap.version(ResourceType::Cluster).to_string();
        let again = poll(&current).await;
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        let body = axum::body::to_bytes(again.into_body(), 1024).await.unwrap();
        assert!(body.is_empty(), "{body:?}");
        assert_eq!(encodings(), [1, 1], "a 304 encodes nothing");
    }
}
