//! One-shot fetches (gRPC `Fetch*` and REST-JSON): the same SotW rules as a
//! stream, answered once. Held until the server is ready; then a group without
//! a snapshot is unknown and answered `NOT_FOUND` (REST 404) after at most
//! [`UNKNOWN_GROUP_WAIT`], instead of holding the client until its own
//! deadline and teaching it nothing.

use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use tonic::Status;

use super::{Transport, XdsServer};
use crate::events::{StreamKind, XdsEvent};
use crate::protocol::SotwResponse;
use crate::protocol::sotw::SotwMachine;
use crate::resource::ResourceType;

/// How long a fetch waits, once the server is ready, for its group's first
/// snapshot before it is answered `NOT_FOUND`. A ready server has published
/// every group its config has, so this only covers a group the application
/// publishes on demand when a node first asks (Ballast: the first Envoy of a
/// gateway on a new transport), which takes one translation.
pub(crate) const UNKNOWN_GROUP_WAIT: Duration = Duration::from_secs(2);

/// Computes the response to a one-shot request on behalf of `peer` (the client
/// certificate's identity), which the server's admission policy must admit for
/// the node's group. `Ok(None)`: the client's `version_info` is already current
/// (REST answers 304 Not Modified).
pub(crate) async fn fetch_as(
    server: &XdsServer,
    ty: ResourceType,
    req: &DiscoveryRequest,
    peer: Option<&crate::security::PeerIdentity>,
) -> Result<Option<SotwResponse>, Status> {
    fetch_over(server, ty, req, peer, Transport::Fetch).await
}

/// [`fetch_as`] for a request that came over `transport` (which the grouper
/// sees).
pub(crate) async fn fetch_over(
    server: &XdsServer,
    ty: ResourceType,
    req: &DiscoveryRequest,
    peer: Option<&crate::security::PeerIdentity>,
    transport: Transport,
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
    let group =
        (shared.grouper)(node, transport).map_err(|e| Status::invalid_argument(e.to_string()))?;
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
            let known = snap_rx.wait_for(|s| s.is_some());
            match tokio::time::timeout(UNKNOWN_GROUP_WAIT, known).await {
                Ok(s) => Ok::<_, Status>(s.map_err(|_| super::shutting_down())?.clone()),
                Err(_) => Err(Status::not_found(format!(
                    "no gateway {group:?} in the config (node {:?}, from node.cluster or metadata ballast.gateway); ask again once it appears",
                    node.id
                ))),
            }
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
