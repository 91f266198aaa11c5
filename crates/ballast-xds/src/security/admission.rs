//! Stream admission: a policy hook deciding whether the peer on a connection
//! may be served a group (or see its status over CSDS). Called once per
//! stream, per one-shot fetch, and per node listed in a CSDS answer.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::SystemTime;

use envoy_types::pb::envoy::config::core::v3::Node;
use parking_lot::Mutex;

use super::identity::PeerIdentity;

/// What the peer asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// To be served the group's resources (xDS streams, Fetch, REST).
    Config,
    /// To read another node's status (CSDS).
    ClientStatus,
}

/// One admission question.
#[derive(Debug, Clone, Copy)]
pub struct AdmissionRequest<'a> {
    /// `None` on a plaintext connection or a TLS one without a client certificate.
    pub peer: Option<&'a PeerIdentity>,
    /// The node as it identified itself.
    pub node: &'a Node,
    /// The group the grouper placed it in.
    pub group: &'a str,
    /// What it asks for.
    pub access: Access,
}

/// A refusal: names the identity and the group, and nothing about the group's content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("identity {identity} may not be served {group}{}", reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
pub struct Rejection {
    /// The peer's identity (or `(no client certificate)`).
    pub identity: String,
    /// The group refused.
    pub group: String,
    /// Why, when the policy says.
    pub reason: Option<String>,
}

impl Rejection {
    /// A refusal of `group` to `peer`, without a reason.
    pub fn new(peer: Option<&PeerIdentity>, group: &str) -> Rejection {
        Rejection {
            identity: peer
                .map(|p| p.display_name())
                .unwrap_or_else(|| "(no client certificate)".to_string()),
            group: group.to_string(),
            reason: None,
        }
    }
}

/// The policy: `Ok` admits. Must be cheap (it runs per stream and per CSDS node).
pub type Admission = Arc<dyn Fn(&AdmissionRequest<'_>) -> Result<(), Rejection> + Send + Sync>;

/// A refused stream or fetch, kept for status pages.
#[derive(Debug, Clone)]
pub struct RejectionRecord {
    /// When.
    pub at: SystemTime,
    /// The node's id.
    pub node: String,
    /// What was refused.
    pub rejection: Rejection,
}

/// The most recent refusals (bounded: hostile clients must not grow memory).
#[derive(Default)]
pub(crate) struct RejectionLog {
    recent: Mutex<(VecDeque<RejectionRecord>, u64)>,
}

/// How many refusals [`RejectionLog`] keeps.
pub(crate) const REJECTIONS_KEPT: usize = 64;

impl RejectionLog {
    pub(crate) fn push(&self, node: &Node, rejection: &Rejection) {
        let mut g = self.recent.lock();
        if g.0.len() == REJECTIONS_KEPT {
            g.0.pop_front();
        }
        g.0.push_back(RejectionRecord {
            at: SystemTime::now(),
            node: node.id.chars().take(256).collect(),
            rejection: rejection.clone(),
        });
        g.1 += 1;
    }

    pub(crate) fn snapshot(&self) -> (Vec<RejectionRecord>, u64) {
        let g = self.recent.lock();
        (g.0.iter().cloned().collect(), g.1)
    }
}
