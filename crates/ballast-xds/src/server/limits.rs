//! Limits on what one client may make the server hold or do (invariant 3, docs/architecture.md):
//! request sizes, names per request, streams, node identity sizes. Each
//! rejection names the limit and the value, and is reported as
//! [`XdsEvent::LimitExceeded`] so it can be counted by limit name.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use parking_lot::Mutex;
use prost::Message;
use tonic::Status;

use crate::events::{XdsEvent, XdsObserver};

/// Server limits; see each field for its default. Configure with
/// [`super::XdsServerBuilder::limits`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Largest gRPC request message (default 4 MiB, gRPC's own default).
    pub max_request_bytes: usize,
    /// Most resource names one request may carry: SotW `resource_names`; Delta
    /// subscribe + unsubscribe + `initial_resource_versions` (default 100,000,
    /// enough for Envoy's EDS with that many clusters).
    pub max_resource_names: usize,
    /// Most concurrent xDS streams on one HTTP/2 connection (default 1,024).
    pub max_streams_per_connection: usize,
    /// Most concurrent xDS streams of one node id (default 1,024).
    pub max_streams_per_node: usize,
    /// Most concurrent xDS streams on the server, unary and REST fetches
    /// in progress included (default 100,000).
    pub max_streams: usize,
    /// Longest `node.id` and `node.cluster`, in bytes (default 1 KiB).
    pub max_node_id_bytes: usize,
    /// Largest encoded `node.metadata`, in bytes (default 64 KiB).
    pub max_node_metadata_bytes: usize,
    /// Largest REST-JSON request body (default 4 MiB; answered 413).
    pub max_rest_body_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_bytes: 4 * 1024 * 1024,
            max_resource_names: 100_000,
            max_streams_per_connection: 1024,
            max_streams_per_node: 1024,
            max_streams: 100_000,
            max_node_id_bytes: 1024,
            max_node_metadata_bytes: 64 * 1024,
            max_rest_body_bytes: 4 * 1024 * 1024,
        }
    }
}

/// The label of each limit, as reported in [`XdsEvent::LimitExceeded`].
pub mod name {
    /// [`Limits::max_request_bytes`](super::Limits::max_request_bytes).
    pub const REQUEST_BYTES: &str = "request_bytes";
    /// [`Limits::max_resource_names`](super::Limits::max_resource_names).
    pub const RESOURCE_NAMES: &str = "resource_names";
    /// [`Limits::max_streams_per_connection`](super::Limits::max_streams_per_connection).
    pub const STREAMS_PER_CONNECTION: &str = "streams_per_connection";
    /// [`Limits::max_streams_per_node`](super::Limits::max_streams_per_node).
    pub const STREAMS_PER_NODE: &str = "streams_per_node";
    /// [`Limits::max_streams`](super::Limits::max_streams).
    pub const STREAMS: &str = "streams";
    /// [`Limits::max_node_id_bytes`](super::Limits::max_node_id_bytes).
    pub const NODE_ID_BYTES: &str = "node_id_bytes";
    /// [`Limits::max_node_metadata_bytes`](super::Limits::max_node_metadata_bytes).
    pub const NODE_METADATA_BYTES: &str = "node_metadata_bytes";
    /// [`Limits::max_rest_body_bytes`](super::Limits::max_rest_body_bytes).
    pub const REST_BODY_BYTES: &str = "rest_body_bytes";
    /// Every limit name.
    pub const ALL: [&str; 8] = [
        REQUEST_BYTES,
        RESOURCE_NAMES,
        STREAMS_PER_CONNECTION,
        STREAMS_PER_NODE,
        STREAMS,
        NODE_ID_BYTES,
        NODE_METADATA_BYTES,
        REST_BODY_BYTES,
    ];
}

/// A limit was exceeded: reports it and gives the status to answer with.
pub(crate) fn exceeded(
    observer: &dyn XdsObserver,
    node: Option<&Arc<str>>,
    limit: &'static str,
    what: &str,
    value: usize,
    max: usize,
    invalid: bool,
) -> Status {
    observer.on_event(&XdsEvent::LimitExceeded {
        limit,
        node: node.cloned(),
        value,
        max,
    });
    let msg = format!("{what} is {value}, over the {limit} limit of {max}");
    tracing::warn!(limit, value, max, node = node.map(|n| &**n), "{msg}");
    if invalid {
        Status::invalid_argument(msg)
    } else {
        Status::resource_exhausted(msg)
    }
}

/// Checks the sizes of a request's node (ids and metadata).
pub(crate) fn check_node(
    limits: &Limits,
    observer: &dyn XdsObserver,
    node: &Node,
) -> Result<(), Status> {
    for (what, v) in [("node.id", &node.id), ("node.cluster", &node.cluster)] {
        if v.len() > limits.max_node_id_bytes {
            return Err(exceeded(
                observer,
                None,
                name::NODE_ID_BYTES,
                &format!("{what} length in bytes"),
                v.len(),
                limits.max_node_id_bytes,
                true,
            ));
        }
    }
    let meta = node.metadata.as_ref().map_or(0, |m| m.encoded_len());
    if meta > limits.max_node_metadata_bytes {
        return Err(exceeded(
            observer,
            None,
            name::NODE_METADATA_BYTES,
            "node.metadata size in bytes",
            meta,
            limits.max_node_metadata_bytes,
            true,
        ));
    }
    Ok(())
}

/// How many resource names a request carries (the work it asks for).
pub(crate) trait NameCount {
    fn name_count(&self) -> usize;
}

impl NameCount for DiscoveryRequest {
    fn name_count(&self) -> usize {
        self.resource_names.len()
    }
}

impl NameCount for crate::protocol::sotw_request::SotwRequest {
    fn name_count(&self) -> usize {
        crate::protocol::sotw_request::SotwRequest::name_count(self)
    }
}

impl NameCount for crate::protocol::delta_request::DeltaRequest {
    fn name_count(&self) -> usize {
        self.req.name_count() + self.subscribe.len() + self.versions.received()
    }
}

impl NameCount for DeltaDiscoveryRequest {
    fn name_count(&self) -> usize {
        self.resource_names_subscribe.len()
            + self.resource_names_unsubscribe.len()
            + self.initial_resource_versions.len()
    }
}

/// Counts open streams, in total, per connection and per node.
#[derive(Default)]
pub(crate) struct StreamCounts {
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    total: usize,
    per_conn: HashMap<(Option<SocketAddr>, SocketAddr), usize>,
    per_node: HashMap<Arc<str>, usize>,
}

/// Identifies the HTTP/2 connection a request came on: its local and remote
/// addresses (when the transport tells them).
pub(crate) type ConnKey = (Option<SocketAddr>, SocketAddr);

/// A stream's place in the counts, returned when it is dropped.
pub(crate) struct Permit {
    counts_of: Arc<StreamCounts>,
    conn: Option<ConnKey>,
    node: Option<Arc<str>>,
}

impl StreamCounts {
    /// Admits a new stream on `conn`, or says which limit it exceeds.
    pub(crate) fn open(
        self: &Arc<Self>,
        limits: &Limits,
        observer: &dyn XdsObserver,
        conn: Option<ConnKey>,
    ) -> Result<Permit, Status> {
        let mut c = self.counts.lock();
        if c.total >= limits.max_streams {
            let total = c.total;
            drop(c);
            return Err(exceeded(
                observer,
                None,
                name::STREAMS,
                "the number of open streams",
                total + 1,
                limits.max_streams,
                false,
            ));
        }
        if let Some(k) = conn {
            let n = c.per_conn.get(&k).copied().unwrap_or(0);
            if n >= limits.max_streams_per_connection {
                drop(c);
                return Err(exceeded(
                    observer,
                    None,
                    name::STREAMS_PER_CONNECTION,
                    "the number of streams on this connection",
                    n + 1,
                    limits.max_streams_per_connection,
                    false,
                ));
            }
            *c.per_conn.entry(k).or_default() += 1;
        }
        c.total += 1;
        Ok(Permit {
            counts_of: self.clone(),
            conn,
            node: None,
        })
    }

    /// Counts the permit's stream against `node`, or says it is one too many.
    pub(crate) fn identify(
        &self,
        permit: &mut Permit,
        limits: &Limits,
        observer: &dyn XdsObserver,
        node: &Arc<str>,
    ) -> Result<(), Status> {
        let mut c = self.counts.lock();
        let n = c.per_node.get(node).copied().unwrap_or(0);
        if n >= limits.max_streams_per_node {
            drop(c);
            return Err(exceeded(
                observer,
                Some(node),
                name::STREAMS_PER_NODE,
                "the number of streams of this node",
                n + 1,
                limits.max_streams_per_node,
                false,
            ));
        }
        *c.per_node.entry(node.clone()).or_default() += 1;
        permit.node = Some(node.clone());
        Ok(())
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut c = self.counts_of.counts.lock();
        c.total -= 1;
        if let Some(k) = self.conn
            && let Some(n) = c.per_conn.get_mut(&k)
        {
            *n -= 1;
            if *n == 0 {
                c.per_conn.remove(&k);
            }
        }
        if let Some(node) = &self.node
            && let Some(n) = c.per_node.get_mut(node)
        {
            *n -= 1;
            if *n == 0 {
                c.per_node.remove(node);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::NoopObserver;
    use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};

    #[test]
    fn permits_count_per_connection_node_and_total_and_return_on_drop() {
        let limits = Limits {
            max_streams: 3,
            max_streams_per_connection: 2,
            max_streams_per_node: 1,
            ..Limits::default()
        };
        let a = Arc::new(StreamCounts::default());
        let conn = Some((None, "127.0.0.1:1".parse().unwrap()));
        let other = Some((None, "127.0.0.1:2".parse().unwrap()));
        let p1 = a.open(&limits, &NoopObserver, conn).unwrap();
        let mut p2 = a.open(&limits, &NoopObserver, conn).unwrap();
        let e = a.open(&limits, &NoopObserver, conn).err().unwrap();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(
            e.message().contains("streams_per_connection limit of 2"),
            "{e}"
        );
        let mut p3 = a.open(&limits, &NoopObserver, other).unwrap();
        let e = a.open(&limits, &NoopObserver, other).err().unwrap();
        assert!(e.message().contains("streams limit of 3"), "{e}");
        let node: Arc<str> = "n".into();
        a.identify(&mut p2, &limits, &NoopObserver, &node).unwrap();
        let e = a
            .identify(&mut p3, &limits, &NoopObserver, &node)
            .err()
            .unwrap();
        assert!(e.message().contains("streams_per_node limit of 1"), "{e}");
        drop(p2);
        a.identify(&mut p3, &limits, &NoopObserver, &node).unwrap();
        drop((p1, p3));
        let c = a.counts.lock();
        assert_eq!(c.total, 0);
        assert!(c.per_conn.is_empty() && c.per_node.is_empty());
    }

    #[test]
    fn node_sizes_are_checked() {
        let limits = Limits {
            max_node_id_bytes: 4,
            max_node_metadata_bytes: 10,
            ..Limits::default()
        };
        let ok = Node {
            id: "abcd".into(),
            cluster: "c".into(),
            ..Default::default()
        };
        check_node(&limits, &NoopObserver, &ok).unwrap();
        let long = Node {
            cluster: "abcde".into(),
            ..ok.clone()
        };
        let e = check_node(&limits, &NoopObserver, &long).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("node.cluster"), "{e}");
        let meta = Node {
            metadata: Some(Struct {
                fields: [(
                    "k".to_string(),
                    Value {
                        kind: Some(Kind::StringValue("0123456789".into())),
                    },
                )]
                .into(),
            }),
            ..ok
        };
        let e = check_node(&limits, &NoopObserver, &meta).unwrap_err();
        assert!(
            e.message().contains("node_metadata_bytes limit of 10"),
            "{e}"
        );
    }
}
