//! Per-stream, per-type sync state, as shown by status pages, metrics and CSDS.

use std::fmt;
use std::sync::Arc;

use crate::resource::ResourceType;
use crate::snapshot::ResourceMap;

/// A rejected response, recorded with the client's message (invariant 7, docs/architecture.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NackInfo {
    /// The version rejected.
    pub version: Arc<str>,
    /// The nonce of the response rejected.
    pub nonce: Arc<str>,
    /// The client's `error_detail` message.
    pub message: String,
}

/// Where a client stands for one type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SyncState {
    /// The last response was acknowledged.
    Synced,
    /// A response is in flight, not acknowledged yet.
    Stale,
    /// Nothing sent yet (not ready, or nothing subscribed exists).
    NotSent,
    /// The last response was rejected (NACK); the client keeps older config.
    Error,
}

impl SyncState {
    /// The CSDS-style name (`SYNCED`, `STALE`, `NOT_SENT`, `ERROR`).
    pub fn as_str(self) -> &'static str {
        match self {
            SyncState::Synced => "SYNCED",
            SyncState::Stale => "STALE",
            SyncState::NotSent => "NOT_SENT",
            SyncState::Error => "ERROR",
        }
    }
}

impl fmt::Display for SyncState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One type's state on one stream.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct TypeStatus {
    /// The type.
    pub ty: ResourceType,
    /// Whether the client subscribed to every resource of the type.
    pub wildcard: bool,
    /// Explicitly subscribed names (beyond the wildcard).
    pub subscribed: usize,
    /// The version of the last response sent.
    pub sent_version: Option<Arc<str>>,
    /// The nonce of the last response sent.
    pub sent_nonce: Option<Arc<str>>,
    /// The version the client last acknowledged.
    pub acked_version: Option<Arc<str>>,
    /// What the client acknowledged holding (shared with snapshots; cheap).
    pub acked: Arc<ResourceMap>,
    /// The last rejection, while the client still holds older config.
    pub nack: Option<NackInfo>,
    /// Where the client stands.
    pub state: SyncState,
}
