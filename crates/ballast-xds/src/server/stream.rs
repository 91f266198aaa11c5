//! Drives one gRPC stream: reads requests, feeds the protocol machine, sends
//! what it says, and follows the group's snapshot and the readiness gate.
//!
//! Backpressure is the HTTP/2 stream's alone: the stream's future runs in
//! its response body, which the transport polls only when the stream has
//! send capacity, so a slow client slows only its own stream; publishing
//! never waits.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::Node;
use tokio::sync::watch;
use tokio::time::Sleep;
use tonic::Status;
use tracing::{Instrument, debug, info_span, warn};

use super::body::{Outbox, RequestStream, ResponseBody};
use super::codec::ChunkedMessage;
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
    /// Taking `newest` can wait for the next request (only types with a
    /// response in flight changed).
    fn newest_can_wait(&self, newest: &Arc<Snapshot>) -> bool;
    fn next(&mut self) -> Option<Self::Resp>;
    fn status(&self) -> Vec<TypeStatus>;
    /// Moves the node out of a request (the first of a stream): the machine
    /// never reads it, and a real Envoy's node (its extensions) is hundreds
    /// of strings to clone per stream.
    fn take_node(req: &mut Self::Req) -> Option<Node>;
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
    fn newest_can_wait(&self, newest: &Arc<Snapshot>) -> bool {
        SotwMachine::newest_can_wait(self, newest)
    }
    fn next(&mut self) -> Option<SotwResponse> {
        self.next_response()
    }
    fn status(&self) -> Vec<TypeStatus> {
        SotwMachine::status(self)
    }
    fn take_node(req: &mut SotwRequest) -> Option<Node> {
        req.req.node.take()
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
    fn newest_can_wait(&self, newest: &Arc<Snapshot>) -> bool {
        DeltaMachine::newest_can_wait(self, newest)
    }
    fn next(&mut self) -> Option<DeltaResponse> {
        self.next_response()
    }
    fn status(&self) -> Vec<TypeStatus> {
        DeltaMachine::status(self)
    }
    fn take_node(req: &mut DeltaRequest) -> Option<Node> {
        req.req.node.take()
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

/// The response body serving one stream: it drives the stream's future
/// (see [`ResponseBody`]), so a stream is one task, the transport's.
pub(crate) fn body<M: Machine>(
    server: XdsServer,
    machine: M,
    kind: StreamKind,
    requests: RequestStream<M::Req>,
    permit: super::limits::Permit,
    peer: Option<Arc<crate::security::PeerIdentity>>,
) -> ResponseBody<M::Resp>
where
    M::Resp: ChunkedMessage,
{
    let outbox = Outbox::new();
    let stream = task(
        server,
        machine,
        kind,
        requests,
        permit,
        peer,
        outbox.share(),
    );
    ResponseBody::new(Box::pin(stream), outbox)
}

/// The future serving one stream. It is alive for as long as the stream
/// (an idle proxy keeps it forever), so its size is memory per proxy.
fn task<M: Machine>(
    server: XdsServer,
    machine: M,
    kind: StreamKind,
    requests: RequestStream<M::Req>,
    permit: super::limits::Permit,
    peer: Option<Arc<crate::security::PeerIdentity>>,
    outbox: Outbox<M::Resp>,
) -> impl std::future::Future<Output = Result<(), Status>> + Send + 'static {
    let span = info_span!(
        "xds_stream",
        kind = kind.label(),
        node = tracing::field::Empty
    );
    // On the heap, not in the future: the machine is large (a state per
    // type) and an `async fn` argument would be held twice.
    let machine = Arc::new(parking_lot::Mutex::new(machine));
    // A client that stopped reading leaves its body unpolled: on drain, its
    // connection is closed after the grace (`age::Aged`), which drops the
    // body and this future with it.
    async move {
        run(
            &server.shared,
            machine,
            kind,
            requests,
            permit,
            &outbox,
            peer,
        )
        .await
    }
    .instrument(span)
}

async fn run<M: Machine>(
    shared: &Shared,
    machine: Arc<parking_lot::Mutex<M>>,
    kind: StreamKind,
    mut requests: RequestStream<M::Req>,
    mut permit: super::limits::Permit,
    outbox: &Outbox<M::Resp>,
    peer: Option<Arc<crate::security::PeerIdentity>>,
) -> Result<(), Status> {
    // The drain signal is one token for every stream: its future is made
    // and registered once per stream, not per wake (each registration and
    // removal locks the token's waiter list, shared by the whole fleet).
    let mut drained = std::pin::pin!(shared.drain.cancelled());
    // The first request names the node; nothing is sent before we know it.
    // Requests are boxed: a decoded request is hundreds of bytes, and a
    // local held across an await is part of the task's future.
    let first = tokio::select! {
        msg = requests.message() => msg?.map(Box::new),
        _ = drained.as_mut() => return Err(super::shutting_down()),
    };
    let Some(mut first) = first else {
        return Ok(());
    };
    let node = M::take_node(&mut first)
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
    let ready_rx = shared.cache.watch_ready();
    // Readiness rarely changes: one long-lived wait on a second receiver,
    // re-armed only when it fires. The value is read then, not on every
    // pass: a read locks the watch, one lock shared by the whole fleet.
    let mut ready = *ready_rx.borrow();
    let mut ready_changed = std::pin::pin!(ready_change(ready_rx));
    // Frees the group's cache slot when the stream ends, if then unused.
    let mut snap_rx = shared.cache.watch_group(&group);
    let mut sent_at: PerType<Option<(Arc<str>, Instant)>> = PerType::default();

    // Status pages and CSDS read the machine when asked (the lock is never
    // held across an await or while taking the registry's).
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
    // Timers are armed once and reset, not made and dropped on every wake
    // (a registration in the timer wheel each). The resume hold's goes away
    // once released, so idle streams keep no timer for it.
    let mut resume_hold: Option<Pin<Box<Sleep>>> = Some(Box::pin(tokio::time::sleep(RESUME_HOLD)));
    // Publish pacing (`XdsServerBuilder::push_interval`): the snapshot last
    // taken from the group, and when the stream may take a newer one.
    let pace = shared.push_interval;
    let mut taken: Option<Arc<Snapshot>> = None;
    let mut next_take: Option<tokio::time::Instant> = None;
    // Fires at `next_take`; made at the first paced take.
    let mut pace_timer: Option<Pin<Box<Sleep>>> = None;
    let mut serving = false;
    // A publish that changed only types with a response in flight: the
    // stream takes it with the client's next request instead (nothing of
    // it could be sent before), so it plans nothing now.
    let mut deferred = false;
    loop {
        // Drain is the last branch of the biased wait below (polling it
        // locks the fleet-wide token's waiter list); this atomic check on
        // every pass means a client that always has a request ready still
        // sees its stream end at once when the server drains.
        if shared.drain.is_cancelled() {
            return Err(super::shutting_down());
        }
        let now = tokio::time::Instant::now();
        if let Some(req) = pending.take() {
            // Only a request reporting what the client holds looks at the
            // group's history (a copy of at most a few `Arc`s).
            let history = if M::resumes(&req) {
                shared.cache.history(&group)
            } else {
                Vec::new()
            };
            guard.observe(&*req, now);
            let outcome = machine.lock().handle(&req, &history);
            record(&*observer, &node_id, handle.group(), &outcome, &mut sent_at);
        }
        if !std::mem::take(&mut deferred) && !paced(ready, serving, &guard, next_take, now) {
            let current = if ready {
                snap_rx.borrow_and_update().clone()
            } else {
                None
            };
            if !pace.is_zero()
                && let Some(c) = &current
                && !taken.as_ref().is_some_and(|t| Arc::ptr_eq(t, c))
            {
                let at = now + pace;
                next_take = Some(at);
                match &mut pace_timer {
                    Some(t) => t.as_mut().reset(at),
                    None => pace_timer = Some(Box::pin(tokio::time::sleep_until(at))),
                }
            }
            taken = current.clone();
            let current = guard.filter(
                current,
                || shared.cache.history(&group),
                &*observer,
                &node_id,
                handle.group(),
            );
            serving = current.is_some();
            machine.lock().set_snapshot(current);
        }
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
            // Taken by the body when the transport has room for it; a
            // client that went away drops the body and this future.
            outbox.put(Box::new(resp)).await;
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
        // While paced, publishes do not wake the stream: it takes the
        // newest snapshot once the interval is over.
        let waiting = paced(ready, serving, &guard, next_take, now);
        // Biased, in the order of how often each fires (a request, the
        // pace timer or a publish): the common wakes find their branch
        // after one or two polls, and the rarely-firing waits are not polled
        // behind them. Drain is last here; the check at the top of the loop
        // catches it on the passes where another branch won.
        tokio::select! {
            biased;
            msg = requests.message() => match msg {
                Ok(Some(req)) => pending = Some(Box::new(req)),
                Ok(None) => return Ok(()),
                Err(status) => {
                    debug!(%status, "stream ended");
                    return Err(status); // e.g. a limit: the client learns which
                }
            },
            _ = sleep_on(&mut pace_timer), if waiting => {}
            r = snap_rx.changed(), if !waiting => {
                if r.is_err() { return Ok(()); }
                deferred = can_defer(ready, serving, &guard, &mut snap_rx, &machine);
            }
            r = ready_changed.as_mut() => match r {
                Some(rx) => {
                    ready = *rx.borrow();
                    ready_changed.set(ready_change(rx));
                }
                None => return Ok(()),
            },
            _ = guard.wake() => {}
            _ = sleep_on(&mut resume_hold), if resume_hold.is_some() => {
                resume_hold = None;
                machine.lock().release_resume_hold();
            }
            // Shutdown ends the stream with a status Envoy retries (it
            // keeps its config and reconnects to another replica).
            _ = drained.as_mut() => return Err(super::shutting_down()),
        }
    }
}

/// Whether the stream keeps the snapshot it has for now (publish pacing):
/// only while it serves one, the group is ready, no resume guard is holding
/// its first push, and the interval since it took that snapshot is not over.
fn paced(
    ready: bool,
    serving: bool,
    guard: &ResumeGuard,
    next_take: Option<tokio::time::Instant>,
    now: tokio::time::Instant,
) -> bool {
    ready && serving && !guard.is_holding() && next_take.is_some_and(|t| now < t)
}

/// Whether the publish just seen can wait for the client's next request
/// (see [`Machine::newest_can_wait`]): only for a stream serving the ready
/// group with no resume guard holding. Marks the publish seen either way;
/// the next request (or publish) takes the newest snapshot.
fn can_defer<M: Machine>(
    ready: bool,
    serving: bool,
    guard: &ResumeGuard,
    snap_rx: &mut tokio::sync::watch::Receiver<Option<Arc<Snapshot>>>,
    machine: &parking_lot::Mutex<M>,
) -> bool {
    if !ready || !serving || guard.is_holding() {
        return false;
    }
    let newest = snap_rx.borrow_and_update().clone();
    newest.is_some_and(|n| machine.lock().newest_can_wait(&n))
}

/// Waits for an armed timer (forever if there is none). The timer stays
/// registered when this future is dropped.
async fn sleep_on(timer: &mut Option<Pin<Box<Sleep>>>) {
    match timer {
        Some(t) => t.as_mut().await,
        None => std::future::pending().await,
    }
}

/// The next readiness change, with the receiver to wait for the one after
/// (`None`: the cache is gone).
async fn ready_change(mut rx: watch::Receiver<bool>) -> Option<watch::Receiver<bool>> {
    rx.changed().await.ok().map(|()| rx)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SnapshotCache;
    use crate::server::limits::Limits;
    use http_body::Frame;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    struct Silent;
    impl http_body::Body for Silent {
        type Data = bytes::Bytes;
        type Error = Status;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<bytes::Bytes>, Status>>> {
            Poll::Pending
        }
    }

    /// Bytes of the future serving one stream of machine `M`.
    fn task_size<M: Machine>(machine: M, kind: StreamKind) -> usize {
        let server = XdsServer::builder(SnapshotCache::new()).build();
        let shared = &server.shared;
        let observer = shared.observer.clone();
        let requests = RequestStream::<M::Req>::new(Silent, &Limits::default(), observer);
        let permit = shared
            .stream_counts
            .open(&shared.limits, &*shared.observer, None)
            .expect("permit");
        let fut = task(
            server.clone(),
            machine,
            kind,
            requests,
            permit,
            None,
            Outbox::new(),
        );
        std::mem::size_of_val(&fut)
    }

    /// Every idle proxy keeps its stream's task: a few KiB here is a large
    /// part of the memory per proxy (W8, docs/benchmarks.md). The machine
    /// and the decoded requests live on the heap, not in the future.
    #[test]
    fn a_stream_task_is_small() {
        let sizes = [
            (
                "SotW",
                task_size(SotwMachine::new(None), StreamKind::Sotw(None)),
            ),
            (
                "Delta",
                task_size(DeltaMachine::new(None), StreamKind::Delta(None)),
            ),
        ];
        for (_, size) in sizes {
            assert!(size <= 3 * 1024, "stream task sizes (bytes): {sizes:?}");
        }
    }

    /// A machine keeps only the types its client requested: an idle ADS
    /// proxy uses four of the six, and a type's state is hundreds of bytes.
    #[test]
    fn a_machine_without_types_is_small() {
        let sizes = [
            ("SotW", std::mem::size_of::<SotwMachine>()),
            ("Delta", std::mem::size_of::<DeltaMachine>()),
        ];
        for (_, size) in sizes {
            assert!(size <= 256, "machine sizes (bytes): {sizes:?}");
        }
    }

    /// A stream is its response body (no task, no channel of its own): the
    /// body holds the boxed future, the one-message outbox and the message
    /// being written, a few words each.
    #[test]
    fn a_response_body_is_small() {
        let sizes = [
            ("SotW", std::mem::size_of::<ResponseBody<SotwResponse>>()),
            ("Delta", std::mem::size_of::<ResponseBody<DeltaResponse>>()),
        ];
        for (_, size) in sizes {
            assert!(size <= 256, "response body sizes (bytes): {sizes:?}");
        }
    }
}
