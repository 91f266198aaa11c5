//! Drives one gRPC stream: reads requests, feeds the protocol machine, sends
//! what it says, and follows the group's snapshot and the readiness gate.
//!
//! Backpressure is the HTTP/2 stream's alone: the response channel holds one
//! message, so a slow client slows only its own task; publishing never waits.

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::Node;
use tokio::sync::mpsc;
use tonic::Status;
use tracing::{Instrument, debug, info_span, warn};

use super::body::RequestStream;
use super::codec::WireMessage;
use super::resume_guard::{ReportsHoldings, ResumeGuard};
use super::{Shared, XdsServer};
use crate::events::{StreamKind, XdsEvent};
use crate::protocol::delta::DeltaMachine;
use crate::protocol::delta_request::DeltaRequest;
use crate::protocol::sotw::SotwMachine;
use crate::protocol::sotw_request::SotwRequest;
use crate::protocol::{DeltaResponse, PerType, RequestOutcome, SotwResponse};
use crate::resource::ResourceType;
use crate::snapshot::Snapshot;
use crate::status::TypeStatus;

/// How long a resumed stream holds removals waiting for the first request of
/// each type that may reference them (Envoy sends them at once; this only
/// bounds the wait for clients that never do).
pub(crate) const RESUME_HOLD: std::time::Duration = std::time::Duration::from_secs(10);

/// gRPC's default maximum message size; larger responses are reported.
pub(crate) const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// What the driver needs from a protocol machine.
pub(crate) trait Machine: Send + 'static {
    type Req: super::body::WireRequest + ReportsHoldings + Send + 'static;
    type Resp: WireMessage + Send + 'static;
    fn handle(&mut self, req: &Self::Req, history: &[Arc<Snapshot>]) -> RequestOutcome;
    /// The request reports what the client holds from an earlier stream:
    /// it is handled with the group's recent snapshots.
    fn resumes(req: &Self::Req) -> bool;
    fn release_resume_hold(&mut self);
    fn set_snapshot(&mut self, snap: Option<Arc<Snapshot>>);
    fn next(&mut self) -> Option<Self::Resp>;
    fn status(&self) -> Vec<TypeStatus>;
    fn node(req: &Self::Req) -> Option<&Node>;
    fn describe(resp: &Self::Resp) -> Sent;
}

/// What a response carries, for logs, events and ACK latency.
pub(crate) struct Sent {
    pub ty: ResourceType,
    /// `version_info` (SotW) or `system_version_info` (Delta).
    pub version: Arc<str>,
    pub nonce: Arc<str>,
    pub resources: usize,
    /// Names removed (Delta; always 0 in SotW).
    pub removed: usize,
}

impl Machine for SotwMachine {
    type Req = SotwRequest;
    type Resp = SotwResponse;
    fn handle(&mut self, req: &SotwRequest, history: &[Arc<Snapshot>]) -> RequestOutcome {
        self.handle_wire_request(req, history)
    }
    fn resumes(req: &SotwRequest) -> bool {
        SotwMachine::resumes(&req.req)
    }
    fn release_resume_hold(&mut self) {
        SotwMachine::release_resume_hold(self)
    }
    fn set_snapshot(&mut self, snap: Option<Arc<Snapshot>>) {
        SotwMachine::set_snapshot(self, snap)
    }
    fn next(&mut self) -> Option<SotwResponse> {
        self.next_response()
    }
    fn status(&self) -> Vec<TypeStatus> {
        SotwMachine::status(self)
    }
    fn node(req: &SotwRequest) -> Option<&Node> {
        req.req.node.as_ref()
    }
    fn describe(r: &SotwResponse) -> Sent {
        Sent {
            ty: r.ty,
            version: r.version.clone(),
            nonce: r.nonce.clone(),
            resources: r.resources.len(),
            removed: 0,
        }
    }
}

impl Machine for DeltaMachine {
    type Req = DeltaRequest;
    type Resp = DeltaResponse;
    fn handle(&mut self, req: &DeltaRequest, history: &[Arc<Snapshot>]) -> RequestOutcome {
        self.handle_wire_request(req, history)
    }
    fn resumes(req: &DeltaRequest) -> bool {
        !req.versions.is_empty()
    }
    fn release_resume_hold(&mut self) {
        DeltaMachine::release_resume_hold(self)
    }
    fn set_snapshot(&mut self, snap: Option<Arc<Snapshot>>) {
        DeltaMachine::set_snapshot(self, snap)
    }
    fn next(&mut self) -> Option<DeltaResponse> {
        self.next_response()
    }
    fn status(&self) -> Vec<TypeStatus> {
        DeltaMachine::status(self)
    }
    fn node(req: &DeltaRequest) -> Option<&Node> {
        req.req.node.as_ref()
    }
    fn describe(r: &DeltaResponse) -> Sent {
        Sent {
            ty: r.ty,
            version: r.system_version.clone(),
            nonce: r.nonce.clone(),
            resources: r.resources.len(),
            removed: r.removed.len(),
        }
    }
}

pub(crate) type RespTx<R> = mpsc::Sender<Result<R, Status>>;

/// Spawns the task serving one stream and returns the receiving end of its responses.
pub(crate) fn spawn<M: Machine>(
    server: XdsServer,
    machine: M,
    kind: StreamKind,
    requests: RequestStream<M::Req>,
    permit: super::limits::Permit,
    peer: Option<Arc<crate::security::PeerIdentity>>,
) -> mpsc::Receiver<Result<M::Resp, Status>> {
    let (tx, rx) = mpsc::channel(1);
    let span = info_span!(
        "xds_stream",
        kind = kind.label(),
        node = tracing::field::Empty
    );
    tokio::spawn(
        async move {
            let shared = &server.shared;
            if let Err(status) = run(shared, machine, kind, requests, permit, &tx, peer).await {
                // A client that stopped reading must not keep a draining
                // server's task alive: the status waits at most the grace.
                let bound = if shared.drain.is_cancelled() {
                    shared.shutdown_grace
                } else {
                    std::time::Duration::MAX
                };
                let _ = tokio::time::timeout(bound, tx.send(Err(status))).await;
            }
        }
        .instrument(span),
    );
    rx
}

async fn run<M: Machine>(
    shared: &Shared,
    machine: M,
    kind: StreamKind,
    mut requests: RequestStream<M::Req>,
    mut permit: super::limits::Permit,
    tx: &RespTx<M::Resp>,
    peer: Option<Arc<crate::security::PeerIdentity>>,
) -> Result<(), Status> {
    let drain = &shared.drain;
    // The first request names the node; nothing is sent before we know it.
    let first = tokio::select! {
        msg = requests.message() => msg?,
        _ = drain.cancelled() => return Err(super::shutting_down()),
    };
    let Some(first) = first else {
        return Ok(());
    };
    let node = M::node(&first)
        .cloned()
        .ok_or_else(|| Status::invalid_argument("the first request on a stream must carry node"))?;
    if node.id.is_empty() {
        return Err(Status::invalid_argument("node.id is empty"));
    }
    super::limits::check_node(&shared.limits, &*shared.observer, &node)?;
    let id: Arc<str> = node.id.as_str().into();
    shared
        .stream_counts
        .identify(&mut permit, &shared.limits, &*shared.observer, &id)?;
    requests.set_node(id);
    let group = (shared.grouper)(&node, super::Transport::of_stream(kind))
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    shared.admit(peer.as_deref(), &node, &group)?;
    tracing::Span::current().record("node", node.id.as_str());
    let handle = shared.registry.open(node, group.as_str().into(), kind);
    let node_id = handle.node().clone();
    let observer = handle.observer().clone();
    let mut ready_rx = shared.cache.watch_ready();
    // Frees the group's cache slot when the stream ends, if then unused.
    let mut snap_rx = shared.cache.watch_group(&group);
    let mut sent_at: PerType<Option<(Arc<str>, Instant)>> = PerType::default();

    // Status pages and CSDS read the machine when asked (the lock is never
    // held across an await or while taking the registry's).
    let machine = Arc::new(parking_lot::Mutex::new(machine));
    {
        let m = machine.clone();
        handle.set_status_source(Arc::new(move || m.lock().status()));
    }

    let only = match kind {
        StreamKind::Sotw(t) | StreamKind::Delta(t) => t,
        StreamKind::Rest(t) => Some(t),
    };
    let mut guard = ResumeGuard::new(shared.resume_guard.clone(), only);
    let mut pending = Some(first);
    let resume_deadline = tokio::time::Instant::now() + RESUME_HOLD;
    let mut resume_released = false;
    loop {
        if let Some(req) = pending.take() {
            // Only a request reporting what the client holds looks at the
            // group's history (a copy of at most a few `Arc`s).
            let history = if M::resumes(&req) {
                shared.cache.history(&group)
            } else {
                Vec::new()
            };
            guard.observe(&req, tokio::time::Instant::now());
            let outcome = machine.lock().handle(&req, &history);
            record(&*observer, &node_id, handle.group(), &outcome, &mut sent_at);
        }
        let current = if *ready_rx.borrow_and_update() {
            snap_rx.borrow_and_update().clone()
        } else {
            None
        };
        let current = guard.filter(
            current,
            || shared.cache.history(&group),
            &*observer,
            &node_id,
            handle.group(),
        );
        machine.lock().set_snapshot(current);
        loop {
            let next = machine.lock().next();
            let Some(resp) = next else { break };
            let Sent {
                ty,
                version,
                nonce,
                resources,
                removed,
            } = M::describe(&resp);
            let bytes = resp.encoded_len();
            if bytes > MAX_RESPONSE_BYTES {
                warn!(%ty, bytes, "response exceeds 4 MiB; clients with default limits reject it");
                observer.on_event(&XdsEvent::OversizedResponse {
                    node: node_id.clone(),
                    ty,
                    bytes,
                });
            }
            debug!(%ty, %version, %nonce, resources, removed, bytes, "send");
            sent_at[ty] = Some((nonce, Instant::now()));
            tokio::select! {
                r = tx.send(Ok(resp)) => if r.is_err() {
                    return Ok(()); // client went away
                },
                _ = drain.cancelled() => return Err(super::shutting_down()),
            }
            observer.on_event(&XdsEvent::ResponseSent {
                node: node_id.clone(),
                group: handle.group().clone(),
                ty,
                version,
                resources,
                removed,
                bytes,
            });
        }
        tokio::select! {
            msg = requests.message() => match msg {
                Ok(Some(req)) => pending = Some(req),
                Ok(None) => return Ok(()),
                Err(status) => {
                    debug!(%status, "stream ended");
                    return Err(status); // e.g. a limit: the client learns which
                }
            },
            // Shutdown ends the stream with a status Envoy retries (it
            // keeps its config and reconnects to another replica).
            _ = drain.cancelled() => return Err(super::shutting_down()),
            r = ready_rx.changed() => { if r.is_err() { return Ok(()); } }
            r = snap_rx.changed() => { if r.is_err() { return Ok(()); } }
            _ = guard.wake() => {}
            _ = tokio::time::sleep_until(resume_deadline), if !resume_released => {
                resume_released = true;
                machine.lock().release_resume_hold();
            }
        }
    }
}

fn record(
    observer: &dyn crate::events::XdsObserver,
    node: &Arc<str>,
    group: &Arc<str>,
    outcome: &RequestOutcome,
    sent_at: &mut PerType<Option<(Arc<str>, Instant)>>,
) {
    match outcome {
        RequestOutcome::Subscribed { ty } => observer.on_event(&XdsEvent::Request {
            node: node.clone(),
            ty: *ty,
        }),
        RequestOutcome::Ack { ty, version, nonce } => {
            let latency = match &sent_at[*ty] {
                Some((n, at)) if n == nonce => at.elapsed(),
                _ => Default::default(),
            };
            observer.on_event(&XdsEvent::Ack {
                node: node.clone(),
                group: group.clone(),
                ty: *ty,
                version: version.clone(),
                latency,
            });
        }
        RequestOutcome::Nack {
            ty,
            version,
            message,
            ..
        } => {
            warn!(%ty, %version, %message, "NACK");
            observer.on_event(&XdsEvent::Nack {
                node: node.clone(),
                group: group.clone(),
                ty: *ty,
                version: version.clone(),
                message: message.clone(),
            });
        }
        RequestOutcome::StaleNonce { ty, nonce } => debug!(%ty, %nonce, "stale nonce ignored"),
        RequestOutcome::UnknownType { type_url } => {
            debug!(%type_url, "request for a type this server does not serve")
        }
        RequestOutcome::WrongType { type_url } => {
            warn!(%type_url, "request for another type on a per-type stream ignored")
        }
    }
}
