//! One-shot fetches (gRPC `Fetch*` and REST-JSON): the same SotW rules as a
//! stream, answered once. Held until the server is ready for the node's group.

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use tonic::Status;

use super::XdsServer;
use crate::events::{StreamKind, XdsEvent};
use crate::protocol::SotwResponse;
use crate::protocol::sotw::SotwMachine;
use crate::resource::ResourceType;

/// Computes the response to a one-shot request on behalf of `peer` (the client certificate's identity), which
/// the server's admission policy must admit for the node's group.
pub(crate) async fn fetch_as(
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
    let shared = &server.shared;
    super::limits::check_node(&shared.limits, &*shared.observer, node)?;
    let names = req.resource_names.len();
    if names > shared.limits.max_resource_names {
        return Err(super::limits::exceeded(
            &*shared.observer,
            None,
            super::limits::name::RESOURCE_NAMES,
            "the number of resource names in the request",
            names,
            shared.limits.max_resource_names,
            false,
        ));
    }
    let group = (shared.grouper)(node).map_err(|e| Status::invalid_argument(e.to_string()))?;
    shared.admit(peer, node, &group)?;
    // A fetch may wait long (held until ready): it counts as a stream.
    let _permit = shared
        .stream_counts
        .open(&shared.limits, &*shared.observer, None)?;
    let handle = shared
        .registry
        .open(node.clone(), group.as_str().into(), StreamKind::Rest(ty));
    // Held until ready (invariant 1, docs/architecture.md); the client's deadline bounds the wait.
    let mut ready = shared.cache.watch_ready();
    // Frees the group's cache slot when the fetch ends (or is abandoned).
    let mut snap_rx = shared.cache.watch_group(&group);
    // A held fetch ends when the server shuts down (UNAVAILABLE, REST 503).
    let snap = tokio::select! {
        r = async {
            ready.wait_for(|r| *r).await.map_err(|_| super::shutting_down())?;
            Ok::<_, Status>(snap_rx
                .wait_for(|s| s.is_some())
                .await
                .map_err(|_| super::shutting_down())?
                .clone())
        } => r?,
        _ = shared.drain.cancelled() => return Err(super::shutting_down()),
    };
    let mut machine = SotwMachine::for_fetch(ty);
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
