//! Errors callers can match on: the cases a control plane reacts to differently (retry on
//! another member, relist after compaction, re-grant a lease) each have their own variant.

use std::time::Duration;

/// An etcd client error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// An endpoint URL that cannot be used (bad syntax, unsupported scheme, https without a CA).
    #[error("invalid etcd endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    /// TLS material that could not be read or used.
    #[error("etcd TLS: {0}")]
    Tls(String),
    /// No member could serve the request: connection refused/reset, or the member has no
    /// leader. Retrying later (or on another member) may succeed.
    #[error("etcd unavailable at {endpoint}: {message}")]
    Unavailable { endpoint: String, message: String },
    /// The request did not complete in time (a hung or partitioned member).
    #[error("etcd request to {endpoint} timed out after {after:?}")]
    Timeout { endpoint: String, after: Duration },
    /// The revision asked for was compacted away. From a watch, `compact_revision` is the
    /// oldest revision still available; from a range it is 0 (etcd does not say). Either way the
    /// caller must relist at the current revision and reconcile.
    #[error("etcd revision compacted (oldest available: {compact_revision})")]
    Compacted { compact_revision: i64 },
    /// The lease does not exist (expired or revoked).
    #[error("etcd lease {id} not found (expired or revoked)")]
    LeaseNotFound { id: i64 },
    /// The server cancelled a watch for another reason than compaction.
    #[error("etcd watch cancelled: {reason}")]
    WatchCanceled { reason: String },
    /// Any other error status from etcd (e.g. permission denied, request too large).
    #[error("etcd error {code:?} at {endpoint}: {message}")]
    Rpc {
        endpoint: String,
        code: tonic::Code,
        message: String,
    },
}

impl Error {
    /// Whether retrying later, possibly on another member, may succeed.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Unavailable { .. } | Error::Timeout { .. })
    }

    /// Maps a gRPC status from `endpoint` to an error, recognising etcd's own messages.
    pub(crate) fn from_status(status: &tonic::Status, endpoint: &str) -> Error {
        let message = status.message().to_string();
        match status.code() {
            tonic::Code::OutOfRange if message.contains("compacted") => Error::Compacted {
                compact_revision: 0,
            },
            tonic::Code::Unavailable => Error::Unavailable {
                endpoint: endpoint.to_string(),
                message,
            },
            // A connection that breaks mid-call surfaces as Unknown/Cancelled with a transport
            // cause; it is as retryable as a refused one.
            _ if is_transport(status) => Error::Unavailable {
                endpoint: endpoint.to_string(),
                message: format!("{message}: {}", source_chain(status)),
            },
            code => Error::Rpc {
                endpoint: endpoint.to_string(),
                code,
                message,
            },
        }
    }
}

/// Whether the status came from the connection rather than from etcd: the request may not have
/// reached any member, so another endpoint is worth trying even for a write.
pub(crate) fn is_transport(status: &tonic::Status) -> bool {
    use std::error::Error as _;
    status.source().is_some()
        || (status.code() == tonic::Code::Unavailable
            && !status.message().starts_with("etcdserver:"))
}

fn source_chain(status: &tonic::Status) -> String {
    use std::error::Error as _;
    let mut out = String::new();
    let mut cur = status.source();
    while let Some(e) = cur {
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&e.to_string());
        cur = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_statuses_map_to_variants() {
        let compacted =
            tonic::Status::out_of_range("etcdserver: mvcc: required revision has been compacted");
        assert!(matches!(
            Error::from_status(&compacted, "e"),
            Error::Compacted {
                compact_revision: 0
            }
        ));
        let no_leader = tonic::Status::unavailable("etcdserver: no leader");
        assert!(Error::from_status(&no_leader, "e").is_unavailable());
        assert!(
            !is_transport(&no_leader),
            "etcd answered: not a transport error"
        );
        assert!(is_transport(&tonic::Status::unavailable(
            "tcp connect error"
        )));
        let denied = tonic::Status::permission_denied("etcdserver: permission denied");
        assert!(matches!(
            Error::from_status(&denied, "e"),
            Error::Rpc {
                code: tonic::Code::PermissionDenied,
                ..
            }
        ));
    }
}
