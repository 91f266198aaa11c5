//! `ballast-xds`: the Envoy xDS protocol side of Ballast, usable on its own —
//! the management-server library (the role go-control-plane plays for Go).
//!
//! - [`resource`]: one Envoy object, encoded once, content-hash versioned.
//! - [`snapshot`]: a consistent set of resources for one group of proxies.
//! - [`cache`]: the latest snapshot per group, published through `watch`, and readiness.
//! - [`protocol`]: SotW and Delta as pure state machines (ordering, ACK/NACK, wildcard rules).
//! - [`server`]: gRPC (ADS and per-type, SotW/Delta/Fetch), REST-JSON, CSDS.
//! - [`registry`]: connected nodes, per-type sync state, eviction.
//! - [`events`]: observability hooks.
//!
//! Nothing here knows about config kinds.
#![forbid(unsafe_code)]

pub mod cache;
pub mod events;
pub mod json;
pub mod protocol;
pub mod registry;
pub mod resource;
pub mod security;
pub mod server;
pub mod simple;
pub mod snapshot;
pub mod status;
pub mod version;
mod wire;

pub use cache::SnapshotCache;
pub use events::{XdsEvent, XdsObserver};
pub use registry::NodeRegistry;
pub use resource::{Ref, Resource, ResourceType, XdsResource};
pub use server::{NodeGrouper, Transport, TransportGrouper, XdsServer};
pub use snapshot::{Snapshot, SnapshotBuilder, SnapshotError};
pub use status::{SyncState, TypeStatus};

/// Envoy's protobuf types, re-exported so users need not depend on `envoy-types` themselves.
pub use envoy_types;
