//! REST-JSON polling, as Envoy does with `api_type: REST`: every
//! `refresh_delay`, one `POST /v3/discovery:<type>` per type with a proto-JSON
//! `DiscoveryRequest` carrying `node`, the names and the version held, over one
//! keep-alive HTTP/1.1 connection. `304 Not Modified` means nothing changed.
//! There is no ACK in REST: a response counts as acknowledged once decoded, and
//! a rejected one simply leaves `version_info` unchanged.

use std::time::Instant;

use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use ballast_xds::{ResourceType, json};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::session::Driver;
use super::sotw::SotwClient;
use super::{ClientConfig, GatePermit, SharedState, TYPES, is_named};

fn path(ty: ResourceType) -> &'static str {
    match ty {
        ResourceType::Cluster => "/v3/discovery:clusters",
        ResourceType::ClusterLoadAssignment => "/v3/discovery:endpoints",
        ResourceType::Listener => "/v3/discovery:listeners",
        ResourceType::RouteConfiguration => "/v3/discovery:routes",
        ResourceType::Secret => "/v3/discovery:secrets",
        // Never requested over REST (VHDS is Delta only).
        ResourceType::VirtualHost => "/v3/discovery:virtualhosts",
    }
}

/// REST polling keeps the SotW client's state (versions and subscriptions);
/// only the transport differs.
#[derive(Debug, Default)]
pub(crate) struct RestClient(SotwClient);

impl Driver for RestClient {
    async fn session(
        &mut self,
        cfg: &ClientConfig,
        state: &SharedState,
        stop: &mut watch::Receiver<bool>,
        permit: &mut GatePermit,
    ) -> Result<(), String> {
        let client = &mut self.0;
        let tcp = TcpStream::connect(cfg.addr)
            .await
            .map_err(|e| format!("connect {}: {e}", cfg.addr))?;
        let _ = tcp.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| format!("HTTP/1 handshake: {e}"))?;
        let conn = tokio::spawn(conn);
        state
            .lock()
            .stats
            .connected_at
            .get_or_insert(Instant::now());
        let host = cfg.addr.to_string();
        let result = async {
            loop {
                for ty in TYPES {
                    if is_named(ty) && client.subs.names[ty.index()].is_empty() {
                        continue;
                    }
                    let mut req = client.request(ty);
                    req.node = Some(cfg.node());
                    req.response_nonce.clear();
                    let body = json::message_to_json(&req)
                        .map_err(|e| e.to_string())?
                        .to_string();
                    let http_req = hyper::Request::post(path(ty))
                        .header(hyper::header::HOST, &host)
                        .header(hyper::header::CONTENT_TYPE, "application/json")
                        .body(Full::new(Bytes::from(body)))
                        .map_err(|e| e.to_string())?;
                    sender.ready().await.map_err(|e| e.to_string())?;
                    let resp = tokio::select! {
                        r = sender.send_request(http_req) => r.map_err(|e| format!("REST {ty}: {e}"))?,
                        _ = stop.changed() => return Ok(()),
                    };
                    let status = resp.status();
                    let body = resp
                        .into_body()
                        .collect()
                        .await
                        .map_err(|e| format!("REST {ty} body: {e}"))?
                        .to_bytes();
                    match status {
                        StatusCode::NOT_MODIFIED => continue,
                        StatusCode::OK => {}
                        other => {
                            return Err(format!(
                                "REST {ty}: HTTP {other}: {}",
                                String::from_utf8_lossy(&body)
                            ));
                        }
                    }
                    let at = Instant::now();
                    let mut dr: DiscoveryResponse =
                        json::message_from_json(&body).map_err(|e| format!("REST {ty}: {e}"))?;
                    // The endpoint names the type (sovereign omits `type_url`).
                    if dr.type_url.is_empty() {
                        dr.type_url = ty.type_url().to_string();
                    }
                    client.apply(cfg, state, &dr, body.len(), at)?;
                }
                permit.release_when_loaded(&state.lock());
                tokio::select! {
                    _ = tokio::time::sleep(cfg.rest_poll) => {}
                    _ = stop.changed() => return Ok(()),
                }
            }
        }
        .await;
        drop(sender);
        conn.abort();
        result
    }
}
