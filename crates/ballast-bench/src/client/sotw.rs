//! ADS State of the World, as Envoy speaks it: `node` on the first request
//! only; wildcard CDS and LDS; named EDS/RDS subscriptions following what the
//! clusters and listeners reference; ACK (same nonce, the response's version)
//! after decoding, NACK (previous version, `error_detail`) when the predicate
//! rejects a resource. The response handling is shared with Delta and REST
//! ([`Subscriptions::apply`]); the stream with Delta (`session`).

use std::sync::LazyLock;
use std::time::Instant;

use ballast_xds::ResourceType;
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::{
    DiscoveryRequest, DiscoveryResponse,
};
use bytes::{Bytes, BytesMut};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

use super::session::{Ads, MAX_RESPONSE, Replies};
use super::{
    ClientConfig, Outcome, SharedState, Subscriptions, TYPES, decode, is_named, nack_status,
};

/// `BALLAST_BENCH_TRACE` set: print every SotW response and reply.
static TRACE: LazyLock<bool> = LazyLock::new(|| std::env::var_os("BALLAST_BENCH_TRACE").is_some());

/// What a SotW response did to the client.
pub(crate) struct Applied {
    pub ty: ResourceType,
    /// `Some(message)`: rejected.
    pub nack: Option<String>,
    /// The named type whose subscription changed because of this response.
    pub resubscribe: Option<ResourceType>,
}

/// SotW client state that survives reconnects (the view's subscriptions and
/// versions: a reconnecting Envoy resumes with them).
#[derive(Debug, Default)]
pub(crate) struct SotwClient {
    pub subs: Subscriptions,
    /// Per type: the version last acknowledged, and the last nonce received.
    acked_version: [String; super::N_TYPES],
    last_nonce: [String; super::N_TYPES],
    /// Per type: the subscribed names as encoded `resource_names` fields, and
    /// the [`Subscriptions::names_gen`] they were encoded at.
    names_wire: [(u64, Bytes); super::N_TYPES],
}

/// A SotW request as sent on the ADS stream: the same bytes prost would
/// write for the [`DiscoveryRequest`] (fields in number order), with the
/// `resource_names` taken from the client's encoded copy. A SotW ACK repeats
/// every subscribed name (1,000 at W2): building and freeing them as
/// `String`s per ACK made the simulated fleet use ~3× the server's CPU, which
/// on a 2-core machine showed up as the server's latency.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct SotwOut {
    /// `version_info` and `node` (fields 1–2); no names.
    head: DiscoveryRequest,
    /// Encoded field 3 (`resource_names`), repeated.
    names: Bytes,
    /// `type_url`, `response_nonce`, `error_detail` (fields 4–6); no names.
    tail: DiscoveryRequest,
}

impl SotwOut {
    fn new(mut req: DiscoveryRequest, names: Bytes) -> SotwOut {
        debug_assert!(req.resource_names.is_empty());
        let tail = DiscoveryRequest {
            type_url: std::mem::take(&mut req.type_url),
            response_nonce: std::mem::take(&mut req.response_nonce),
            error_detail: req.error_detail.take(),
            ..Default::default()
        };
        debug_assert!(req.resource_locators.is_empty());
        SotwOut {
            head: req,
            names,
            tail,
        }
    }

    /// The first request of a stream carries the node.
    pub fn set_node(&mut self, node: ballast_xds::envoy_types::pb::envoy::config::core::v3::Node) {
        self.head.node = Some(node);
    }
}

impl prost::Message for SotwOut {
    fn encode_raw(&self, buf: &mut impl bytes::BufMut) {
        self.head.encode_raw(buf);
        buf.put_slice(&self.names);
        self.tail.encode_raw(buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // Only ever encoded: the server decodes it as a DiscoveryRequest.
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.head.encoded_len() + self.names.len() + self.tail.encoded_len()
    }

    fn clear(&mut self) {
        *self = SotwOut::default();
    }
}

/// `names` encoded as repeated field 3 of a `DiscoveryRequest`.
fn encode_names<'a>(names: impl Iterator<Item = &'a String>) -> Bytes {
    let mut buf = BytesMut::new();
    for n in names {
        prost::encoding::string::encode(3, n, &mut buf);
    }
    buf.freeze()
}

impl SotwClient {
    /// Applies one response: decode, NACK predicate, view update, references.
    pub fn apply(
        &mut self,
        cfg: &ClientConfig,
        state: &SharedState,
        resp: &DiscoveryResponse,
        bytes: usize,
        at: Instant,
    ) -> Result<Applied, String> {
        let ty = ResourceType::from_type_url(&resp.type_url)
            .ok_or_else(|| format!("response for unknown type {:?}", resp.type_url))?;
        let resources = resp.resources.iter().map(|any| {
            decode(ty, &any.type_url, &any.value).map(|d| {
                let v = d.version;
                (d, v)
            })
        });
        let full = ty.is_full_state_in_sotw();
        let outcome = self.subs.apply(
            cfg,
            state,
            ty,
            (bytes, at),
            &resp.version_info,
            full,
            resources,
            &[],
        );
        Ok(match outcome {
            Outcome::Nack(message) => Applied {
                ty,
                nack: Some(message),
                resubscribe: None,
            },
            Outcome::Ack(resubscribed) => {
                self.acked_version[ty.index()] = resp.version_info.clone();
                Applied {
                    ty,
                    nack: None,
                    resubscribe: resubscribed.map(|(dep, _)| dep),
                }
            }
        })
    }

    /// A request for `ty` carrying the current subscription and versions.
    pub fn request(&self, ty: ResourceType) -> DiscoveryRequest {
        let i = ty.index();
        DiscoveryRequest {
            resource_names: if is_named(ty) {
                self.subs.names[i].iter().cloned().collect()
            } else {
                Vec::new()
            },
            ..self.request_without_names(ty)
        }
    }

    fn request_without_names(&self, ty: ResourceType) -> DiscoveryRequest {
        let i = ty.index();
        DiscoveryRequest {
            version_info: self.acked_version[i].clone(),
            type_url: ty.type_url().to_string(),
            response_nonce: self.last_nonce[i].clone(),
            ..Default::default()
        }
    }

    /// [`SotwClient::request`] for the ADS stream, its names encoded once per
    /// subscription change.
    fn wire_request(&mut self, ty: ResourceType) -> SotwOut {
        let i = ty.index();
        let names = if is_named(ty) {
            let gen_now = self.subs.names_gen[i];
            let (gen_then, bytes) = &mut self.names_wire[i];
            if *gen_then != gen_now || (bytes.is_empty() && !self.subs.names[i].is_empty()) {
                *bytes = encode_names(self.subs.names[i].iter());
                *gen_then = gen_now;
            }
            bytes.clone()
        } else {
            Bytes::new()
        };
        SotwOut::new(self.request_without_names(ty), names)
    }
}

fn trace(cfg: &ClientConfig, dir: &str, type_url: &str, version: &str, nonce: &str, rest: &str) {
    eprintln!(
        "{} sotw {dir} {} v={version} nonce={nonce} {rest}",
        cfg.node_id,
        type_url.rsplit('.').next().unwrap_or(""),
    );
}

impl Ads for SotwClient {
    type Request = SotwOut;
    type Response = DiscoveryResponse;
    const NAME: &'static str = "ADS";

    async fn open(
        channel: Channel,
        requests: ReceiverStream<SotwOut>,
    ) -> Result<tonic::Streaming<DiscoveryResponse>, tonic::Status> {
        // The generated client's call, with requests that carry their names
        // pre-encoded (`SotwOut`).
        let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_RESPONSE);
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let codec = tonic_prost::ProstCodec::<SotwOut, DiscoveryResponse>::default();
        let path = PathAndQuery::from_static(
            "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
        );
        Ok(grpc
            .streaming(tonic::Request::new(requests), path, codec)
            .await?
            .into_inner())
    }

    fn subscriptions(&mut self) -> &mut Subscriptions {
        &mut self.subs
    }

    fn initial_requests(&mut self, cfg: &ClientConfig, state: &SharedState) -> Vec<SotwOut> {
        for ty in TYPES {
            self.last_nonce[ty.index()].clear();
        }
        let types = self.subs.open(&state.lock());
        let mut out: Vec<_> = types.into_iter().map(|ty| self.wire_request(ty)).collect();
        out[0].set_node(cfg.node());
        out
    }

    fn respond(
        &mut self,
        cfg: &ClientConfig,
        state: &SharedState,
        resp: &DiscoveryResponse,
        bytes: usize,
        at: Instant,
    ) -> Result<Replies<SotwOut>, String> {
        if *TRACE {
            let n = format!("resources={}", resp.resources.len());
            trace(
                cfg,
                "recv",
                &resp.type_url,
                &resp.version_info,
                &resp.nonce,
                &n,
            );
        }
        let applied = self.apply(cfg, state, resp, bytes, at)?;
        let ty = applied.ty;
        let mut resubscribe = None;
        if let Some(dep) = applied.resubscribe {
            let i = dep.index();
            if self.subs.requested[i] || !self.subs.names[i].is_empty() {
                self.subs.requested[i] = true;
                resubscribe = Some(self.wire_request(dep));
            }
        }
        self.last_nonce[ty.index()] = resp.nonce.clone();
        let mut ack = self.wire_request(ty);
        ack.tail.error_detail = applied.nack.map(nack_status);
        if *TRACE {
            let n = format!(
                "names={} nack={}",
                self.subs.names[ty.index()].len(),
                ack.tail.error_detail.is_some()
            );
            trace(
                cfg,
                "send",
                &ack.tail.type_url,
                &ack.head.version_info,
                &ack.tail.response_nonce,
                &n,
            );
        }
        Ok(Replies { resubscribe, ack })
    }

    fn listeners_request(&self) -> SotwOut {
        // LDS is wildcard: no names.
        SotwOut::new(
            self.request_without_names(ResourceType::Listener),
            Bytes::new(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast_xds::envoy_types::pb::envoy::config::core::v3::Node;
    use ballast_xds::envoy_types::pb::google::rpc::Status as RpcStatus;
    use proptest::prelude::*;
    use prost::Message;

    proptest! {
        /// What goes on the wire is exactly prost's encoding of the request
        /// with its names, whatever the fields hold.
        #[test]
        fn wire_request_is_prosts_encoding(
            names in proptest::collection::btree_set("[a-z0-9/._-]{0,12}", 0..20),
            version in "[0-9a-f]{0,8}",
            nonce in "[0-9]{0,4}",
            node in proptest::option::of("[a-z]{1,6}"),
            error in proptest::option::of("[ -~]{0,20}"),
        ) {
            let full = DiscoveryRequest {
                version_info: version.clone(),
                node: node.clone().map(|id| Node { id, ..Default::default() }),
                resource_names: names.iter().cloned().collect(),
                type_url: ResourceType::ClusterLoadAssignment.type_url().to_string(),
                response_nonce: nonce.clone(),
                error_detail: error.clone().map(|message| RpcStatus { code: 3, message, ..Default::default() }),
                ..Default::default()
            };
            let mut head = full.clone();
            head.resource_names.clear();
            let out = SotwOut::new(head, encode_names(names.iter()));
            let bytes = out.encode_to_vec();
            prop_assert_eq!(bytes.len(), out.encoded_len());
            prop_assert_eq!(&bytes, &full.encode_to_vec());
            prop_assert_eq!(DiscoveryRequest::decode(bytes.as_slice()).unwrap(), full);
        }
    }

    /// The encoded names follow the subscription: a change of names (which
    /// bumps their generation) is on the next request.
    #[test]
    fn wire_names_follow_the_subscription() {
        let eds = ResourceType::ClusterLoadAssignment;
        let mut c = SotwClient::default();
        let decode_names = |out: &SotwOut| {
            DiscoveryRequest::decode(out.encode_to_vec().as_slice())
                .unwrap()
                .resource_names
        };
        assert!(decode_names(&c.wire_request(eds)).is_empty());
        c.subs.names[eds.index()] = ["a".to_string(), "b".to_string()].into();
        c.subs.names_gen[eds.index()] += 1;
        assert_eq!(decode_names(&c.wire_request(eds)), ["a", "b"]);
        c.subs.names[eds.index()] = ["c".to_string()].into();
        c.subs.names_gen[eds.index()] += 1;
        assert_eq!(decode_names(&c.wire_request(eds)), ["c"]);
        assert_eq!(decode_names(&c.wire_request(eds)), ["c"]);
        assert!(decode_names(&c.listeners_request()).is_empty());
    }
}
