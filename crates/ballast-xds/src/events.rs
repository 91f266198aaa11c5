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
    Delta(Option<ResourceType>),
    Rest(ResourceType),
}

impl StreamKind {
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

#[derive(Clone, Debug)]
pub enum XdsEvent {
    StreamOpened {
        node: Arc<str>,
        group: Arc<str>,
        kind: StreamKind,
    },
    StreamClosed {
        node: Arc<str>,
        kind: StreamKind,
    },
    Request {
        node: Arc<str>,
        ty: ResourceType,
    },
    ResponseSent {
        node: Arc<str>,
        /// The group (snapshot) the node is served from.
        group: Arc<str>,
        ty: ResourceType,
        version: Arc<str>,
        resources: usize,
        removed: usize,
        bytes: usize,
    },
    Ack {
        node: Arc<str>,
        /// The group (snapshot) the node is served from.
        group: Arc<str>,
        ty: ResourceType,
        version: Arc<str>,
        /// From sending the response to its acknowledgement.
        latency: Duration,
    },
    Nack {
        node: Arc<str>,
        /// The group (snapshot) the node is served from.
        group: Arc<str>,
        ty: ResourceType,
        version: Arc<str>,
        message: String,
    },
    /// A response larger than gRPC's default 4 MiB limit: many clients reject it.
    OversizedResponse {
        node: Arc<str>,
        ty: ResourceType,
        bytes: usize,
    },
    /// A request or stream was refused by a server limit
    /// ([`crate::server::limits`]); `limit` is its name (e.g. `request_bytes`).
    LimitExceeded {
        limit: &'static str,
        /// The node, when known at the time of the check.
        node: Option<Arc<str>>,
        value: usize,
        max: usize,
    },
    /// A resuming client's first push would remove more than the resume
    /// guard's share of what it reports holding: nothing is delivered to
    /// the stream until the source changes or the settle period passes.
    ResumeHeld {
        node: Arc<str>,
        group: Arc<str>,
        reason: String,
        /// When the hold ends if the source still says so, from now.
        settle_left: Duration,
    },
    /// A held first push was delivered.
    ResumeReleased {
        node: Arc<str>,
        group: Arc<str>,
        why: crate::server::resume_guard::ResumeRelease,
    },
    /// Node state dropped after its last stream closed and the grace period passed.
    Evicted {
        node: Arc<str>,
    },
    /// A stream or fetch refused by the admission policy (wrong identity for the group).
    Rejected {
        node: Arc<str>,
        group: Arc<str>,
        identity: String,
    },
}

/// Receives events synchronously from stream tasks; must be cheap and never block.
pub trait XdsObserver: Send + Sync + 'static {
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
