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
use tokio_stream::wrappers::ReceiverStream;

use super::session::{Ads, AdsClient, Replies};
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
            version_info: self.acked_version[i].clone(),
            resource_names: if is_named(ty) {
                self.subs.names[i].iter().cloned().collect()
            } else {
                Vec::new()
            },
            type_url: ty.type_url().to_string(),
            response_nonce: self.last_nonce[i].clone(),
            ..Default::default()
        }
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
    type Request = DiscoveryRequest;
    type Response = DiscoveryResponse;
    const NAME: &'static str = "ADS";

    async fn open(
        mut grpc: AdsClient,
        requests: ReceiverStream<DiscoveryRequest>,
    ) -> Result<tonic::Streaming<DiscoveryResponse>, tonic::Status> {
        Ok(grpc
            .stream_aggregated_resources(requests)
            .await?
            .into_inner())
    }

    fn subscriptions(&mut self) -> &mut Subscriptions {
        &mut self.subs
    }

    fn initial_requests(
        &mut self,
        cfg: &ClientConfig,
        state: &SharedState,
    ) -> Vec<DiscoveryRequest> {
        for ty in TYPES {
            self.last_nonce[ty.index()].clear();
        }
        let types = self.subs.open(&state.lock());
        let mut out: Vec<_> = types.into_iter().map(|ty| self.request(ty)).collect();
        out[0].node = Some(cfg.node());
        out
    }

    fn respond(
        &mut self,
        cfg: &ClientConfig,
        state: &SharedState,
        resp: &DiscoveryResponse,
        bytes: usize,
        at: Instant,
    ) -> Result<Replies<DiscoveryRequest>, String> {
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
                resubscribe = Some(self.request(dep));
            }
        }
        self.last_nonce[ty.index()] = resp.nonce.clone();
        let mut ack = self.request(ty);
        ack.error_detail = applied.nack.map(nack_status);
        if *TRACE {
            let n = format!(
                "names={} nack={}",
                ack.resource_names.len(),
                ack.error_detail.is_some()
            );
            trace(
                cfg,
                "send",
                &ack.type_url,
                &ack.version_info,
                &ack.response_nonce,
                &n,
            );
        }
        Ok(Replies { resubscribe, ack })
    }

    fn listeners_request(&self) -> DiscoveryRequest {
        self.request(ResourceType::Listener)
    }
}
