//! One-shot fetches (gRPC `Fetch*` and REST-JSON): the same SotW rules as a
//! stream, answered once. Held until the server is ready for the node's group.

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use tonic::Status;

use super::XdsServer;
use crate::events::{StreamKind, XdsEvent};
use crate::protocol::SotwResponse;
use crate::protocol::sotw::SotwMachine;
use crate::resource::ResourceType;

/// Computes the response to a one-shot request. `Ok(None)`: the client's
/// `version_info` is already current (REST answers 304 Not Modified).
/// Anonymous: under an admission policy, see [`fetch_as`].
pub async fn fetch(
    server: &XdsServer,
    ty: ResourceType,
    req: &DiscoveryRequest,
) -> Result<Option<SotwResponse>, Status> {
    fetch_as(server, ty, req, None).await
}

/// [`fetch`] on behalf of `peer` (the client certificate's identity), which
/// the server's admission policy must admit for the node's group.
pub async fn fetch_as(
    server: &XdsServer,
    ty: ResourceType,
    req: &DiscoveryRequest,
    peer: Option<&crate::security::PeerIdentity>,
) -> Result<Option<SotwResponse>, Status> {
    if req.type_url != ty.type_url() && !req.type_url.is_empty() {
        return Err(Status::invalid_argument(format!(
            "type_url {:?} does not match this endpoint ({})",
            req.type_url,
            ty.type_url()
        )));
    }
    let node = req
        .node
        .as_ref()
        .ok_or_else(|| Status::invalid_argument("request must carry node"))?;
    let group = (server.shared.grouper)(node).map_err(Status::invalid_argument)?;
    let shared = &server.shared;
    shared.admit(peer, node, &group)?;
    let handle = shared
        .registry
        .open(node.clone(), group.as_str().into(), StreamKind::Rest(ty));
    // Held until ready (DESIGN §3.1); the client's deadline bounds the wait.
    let mut ready = shared.cache.watch_ready();
    ready
        .wait_for(|r| *r)
        .await
        .map_err(|_| Status::unavailable("shutting down"))?;
    let mut snap_rx = shared.cache.watch(&group);
    let snap = snap_rx
        .wait_for(|s| s.is_some())
        .await
        .map_err(|_| Status::unavailable("shutting down"))?
        .clone();
    let mut machine = SotwMachine::new(Some(ty));
    let mut one = req.clone();
    one.type_url = ty.type_url().to_string();
    one.response_nonce.clear();
    machine.handle_request(&one);
    machine.set_snapshot(snap);
    let resp = machine.next_response();
    handle.update(machine.status());
    if let Some(r) = &resp {
        handle.observer().on_event(&XdsEvent::ResponseSent {
            node: handle.node().clone(),
            group: handle.group().clone(),
            ty,
            version: r.version.clone(),
            resources: r.resources.len(),
            removed: 0,
            bytes: super::codec::WireMessage::encoded_len(r),
        });
    }
    Ok(resp)
}
