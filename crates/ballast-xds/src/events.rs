//! Observability hooks: every stream reports what happens on it as events,
//! which the embedding application turns into metrics and logs.

use std::sync::Arc;
use std::time::Duration;

use crate::resource::ResourceType;

/// Which protocol variant a stream speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamKind {
    /// State-of-the-World; `None` type = ADS.
    Sotw(Option<ResourceType>),
    /// Incremental (Delta) xDS; `None` type = Delta ADS.
    Delta(Option<ResourceType>),
    /// A REST-JSON poll or unary Fetch of one type.
    Rest(ResourceType),
}

impl StreamKind {
    /// A short, stable label for metrics: `ads`, `delta-ads`, `sotw`, `delta`, `rest`.
    pub fn label(&self) -> &'static str {
        match self {
            StreamKind::Sotw(None) => "ads",
            StreamKind::Delta(None) => "delta-ads",
            StreamKind::Sotw(Some(_)) => "sotw",
            StreamKind::Delta(Some(_)) => "delta",
            StreamKind::Rest(_) => "rest",
        }
    }
}

/// What happened on a stream, reported to the [`XdsObserver`]. New variants
/// may be added in minor releases: match with a `_` arm.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum XdsEvent {
    /// A stream (or fetch) was admitted and placed in a group.
    StreamOpened {
        /// The node's id.
        node: Arc<str>,
        /// The group (snapshot) the node is served from.
        group: Arc<str>,
        /// Which protocol the stream speaks.
        kind: StreamKind,
    },
    /// A stream ended, for whatever reason.
    StreamClosed {
        /// The node's id.
        node: Arc<str>,
        /// Which protocol the stream spoke.
        kind: StreamKind,
    },
    /// A first request for a type, or a subscription change.
    Request {
        /// The node's id.
        node: Arc<str>,
        /// The type requested.
        ty: ResourceType,
    },
    /// A response was written to the stream.
    ResponseSent {
        /// The node's id.
        node: Arc<str>,
        /// The group (snapshot) the node is served from.
        group: Arc<str>,
        /// The type of the response.
        ty: ResourceType,
        /// Its version (`version_info` / `system_version_info`).
        version: Arc<str>,
        /// Resources in it.
        resources: usize,
        /// Names removed by it (Delta).
        removed: usize,
        /// Encoded size.
        bytes: usize,
    },
    /// The client accepted a response.
    Ack {
        /// The node's id.
        node: Arc<str>,
        /// The group (snapshot) the node is served from.
        group: Arc<str>,
        /// The type acknowledged.
        ty: ResourceType,
        /// The version the client now holds.
        version: Arc<str>,
        /// From sending the response to its acknowledgement.
        latency: Duration,
    },
    /// The client rejected a response; that version is never resent.
    Nack {
        /// The node's id.
        node: Arc<str>,
        /// The group (snapshot) the node is served from.
        group: Arc<str>,
        /// The type rejected.
        ty: ResourceType,
        /// The version rejected.
        version: Arc<str>,
        /// The client's `error_detail` message.
        message: String,
    },
    /// A response larger than gRPC's default 4 MiB limit: many clients reject it.
    OversizedResponse {
        /// The node's id.
        node: Arc<str>,
        /// The type of the response.
        ty: ResourceType,
        /// Its encoded size.
        bytes: usize,
    },
    /// A request or stream was refused by a server limit
    /// ([`crate::limits`]); `limit` is its name (e.g. `request_bytes`).
    LimitExceeded {
        /// The limit's name, one of [`crate::limits::name::ALL`].
        limit: &'static str,
        /// The node, when known at the time of the check.
        node: Option<Arc<str>>,
        /// The value that was refused.
        value: usize,
        /// The configured maximum.
        max: usize,
    },
    /// A resuming client's first push would remove more than the resume
    /// guard's share of what it reports holding: nothing is delivered to
    /// the stream until the source changes or the settle period passes.
    ResumeHeld {
        /// The node's id.
        node: Arc<str>,
        /// The group (snapshot) the node is served from.
        group: Arc<str>,
        /// Which type would lose how much.
        reason: String,
        /// When the hold ends if the source still says so, from now.
        settle_left: Duration,
    },
    /// A held first push was delivered.
    ResumeReleased {
        /// The node's id.
        node: Arc<str>,
        /// The group (snapshot) the node is served from.
        group: Arc<str>,
        /// Why the hold ended.
        why: crate::server::resume_guard::ResumeRelease,
    },
    /// Node state dropped after its last stream closed and the grace period passed.
    Evicted {
        /// The node's id.
        node: Arc<str>,
    },
    /// A stream or fetch refused by the admission policy (wrong identity for the group).
    Rejected {
        /// The node's id.
        node: Arc<str>,
        /// The group it asked to be served.
        group: Arc<str>,
        /// The peer's identity as the admission policy saw it.
        identity: String,
    },
}

/// Receives events synchronously from stream tasks; must be cheap and never block.
pub trait XdsObserver: Send + Sync + 'static {
    /// Called once per event, on the stream's task.
    fn on_event(&self, event: &XdsEvent);
}

/// Ignores everything.
#[derive(Debug, Default)]
pub struct NoopObserver;

impl XdsObserver for NoopObserver {
    fn on_event(&self, _: &XdsEvent) {}
}

/// Forwards events to a `tokio::sync::broadcast` channel, for consumers that
/// want a stream. Slow receivers lose events (they see `Lagged`), never block streams.
#[derive(Debug, Clone)]
pub struct BroadcastObserver(pub tokio::sync::broadcast::Sender<XdsEvent>);

impl XdsObserver for BroadcastObserver {
    fn on_event(&self, event: &XdsEvent) {
        let _ = self.0.send(event.clone());
    }
}

impl<F: Fn(&XdsEvent) + Send + Sync + 'static> XdsObserver for F {
    fn on_event(&self, event: &XdsEvent) {
        self(event)
    }
}
