#![doc = include_str!("../README.md")]
//!
//! # Crate layout
//!
//! The public surface is this crate root (plus [`simple`], [`security`],
//! [`limits`] and, with the `rest` feature, `json`):
//!
//! - [`Resource`]: one Envoy object, encoded once, content-hash versioned.
//! - [`Snapshot`]: a consistent set of resources for one group of proxies,
//!   built with [`Snapshot::builder`], which refuses dangling references.
//! - [`SnapshotCache`]: the latest snapshot per group, published through
//!   `tokio::sync::watch`, and the readiness gate; the server runs over any
//!   [`XdsCache`], of which it is one implementation.
//! - [`XdsServer`]: gRPC ADS and per-type services, SotW and Delta, unary
//!   Fetch, REST-JSON and CSDS (the last two behind features), built with
//!   [`XdsServer::builder`].
//! - Node grouping ([`NodeGrouper`], [`group_by_node_id`]), stream events
//!   ([`XdsEvent`], [`XdsObserver`]) and typed errors ([`SnapshotError`],
//!   [`ResourceError`], [`GroupError`], [`ServeError`]).
//!
//! Everything else (the protocol state machines, the wire codec) is private;
//! the `unstable-internals` feature exposes a few of them for benchmarks, with
//! no stability promise. Nothing here knows about Ballast's config kinds.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod cache;
// Only proto-JSON (and the tests) decode descriptors; versions use `map_shapes`.
#[cfg(any(feature = "rest", test))]
mod descriptors;
mod events;
#[cfg(feature = "rest")]
pub mod json;
mod map_shapes;
mod protocol;
mod registry;
mod resource;
pub mod security;
mod server;
pub mod simple;
mod snapshot;
mod status;
mod version;
mod wire;

pub use cache::{DEFAULT_HISTORY, GroupWatch, SnapshotCache, SnapshotCacheBuilder, XdsCache};
pub use events::{BroadcastObserver, NoopObserver, StreamKind, XdsEvent, XdsObserver};
pub use registry::{DEFAULT_GRACE, NodeRegistry, NodeStatus};
pub use resource::{Ref, Resource, ResourceError, ResourceType, XdsResource};
pub use server::limits::{self, Limits};
pub use server::resume_guard::{ResumeGuardConfig, ResumeRelease};
pub use server::{
    DEFAULT_SHUTDOWN_GRACE, GroupError, NodeGrouper, ServeError, Transport, TransportGrouper,
    XdsServer, XdsServerBuilder, group_by_node_id,
};
pub use snapshot::{
    Inconsistency, ResourceMap, Snapshot, SnapshotBuilder, SnapshotChange, SnapshotError,
    TypeResources,
};
pub use status::{NackInfo, SyncState, TypeStatus};
pub use version::content_version;

/// Envoy's protobuf types, re-exported so users need not depend on `envoy-types` themselves.
pub use envoy_types;

/// Internals for the crate's own benchmarks (`benches/`): the protocol state
/// machines and the wire codec. No stability promise: anything here may change
/// in a patch release. Enabled by the `unstable-internals` feature.
#[cfg(feature = "unstable-internals")]
#[doc(hidden)]
pub mod internals {
    pub use crate::protocol::delta::DeltaMachine;
    pub use crate::protocol::sotw::SotwMachine;
    pub use crate::protocol::{DeltaResponse, RequestOutcome, SotwResponse};
    pub use crate::server::codec::WireMessage;
}
