//! ADS Delta (incremental), as Envoy speaks it: wildcard CDS/LDS (an empty
//! first subscribe list), named EDS/RDS subscriptions changed with
//! subscribe/unsubscribe lists, resources tracked by name and version, every
//! response ACKed (or NACKed) by nonce. A reconnect resumes with
//! `initial_resource_versions`. The response handling is shared with SotW
//! ([`Subscriptions::apply`]), and so is the stream (`session`).

use std::time::Instant;

use ballast_xds::ResourceType;
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::session::{Ads, AdsClient, MAX_RESPONSE, Replies};
use super::{ClientConfig, Outcome, SharedState, Subscriptions, decode, nack_status, version_u64};

/// Delta client state that survives reconnects (the subscriptions; the
/// versions held are the view itself).
#[derive(Debug, Default)]
pub(crate) struct DeltaClient {
    subs: Subscriptions,
}

impl Ads for DeltaClient {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;
    const NAME: &'static str = "Delta ADS";

    async fn open(
        channel: Channel,
        requests: ReceiverStream<DeltaDiscoveryRequest>,
    ) -> Result<tonic::Streaming<DeltaDiscoveryResponse>, tonic::Status> {
        let mut grpc = AdsClient::new(channel).max_decoding_message_size(MAX_RESPONSE);
        Ok(grpc
            .delta_aggregated_resources(requests)
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
    ) -> Vec<DeltaDiscoveryRequest> {
        let st = state.lock();
        let types = self.subs.open(&st);
        let mut out: Vec<_> = types
            .into_iter()
            .map(|ty| DeltaDiscoveryRequest {
                type_url: ty.type_url().to_string(),
                resource_names_subscribe: self.subs.names[ty.index()].iter().cloned().collect(),
                initial_resource_versions: st.view[ty.index()]
                    .iter()
                    .map(|(n, v)| (n.to_string(), format!("{v:016x}")))
                    .collect(),
                ..Default::default()
            })
            .collect();
        out[0].node = Some(cfg.node());
        out
    }

    fn respond(
        &mut self,
        cfg: &ClientConfig,
        state: &SharedState,
        resp: &DeltaDiscoveryResponse,
        bytes: usize,
        at: Instant,
    ) -> Result<Replies<DeltaDiscoveryRequest>, String> {
        let ty = ResourceType::from_type_url(&resp.type_url)
            .ok_or_else(|| format!("delta response for unknown type {:?}", resp.type_url))?;
        let resources = resp.resources.iter().map(|r| {
            let any = r
                .resource
                .as_ref()
                .ok_or_else(|| format!("{ty} {:?} without a resource body", r.name))?;
            let d = decode(ty, &any.type_url, &any.value)?;
            if *d.name != r.name {
                return Err(format!("resource named {:?} sent as {:?}", d.name, r.name));
            }
            // The version the server gives it; counted when not the content hash.
            Ok((d, version_u64(&r.version)))
        });
        let outcome = self.subs.apply(
            cfg,
            state,
            ty,
            (bytes, at),
            &resp.system_version_info,
            false,
            resources,
            &resp.removed_resources,
        );
        let mut ack = DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            ..Default::default()
        };
        let resubscribe = match outcome {
            Outcome::Nack(message) => {
                ack.error_detail = Some(nack_status(message));
                None
            }
            Outcome::Ack(resubscribed) => resubscribed.map(|(dep, previous)| {
                self.subs.requested[dep.index()] = true;
                let names = &self.subs.names[dep.index()];
                DeltaDiscoveryRequest {
                    type_url: dep.type_url().to_string(),
                    resource_names_subscribe: names.difference(&previous).cloned().collect(),
                    resource_names_unsubscribe: previous.difference(names).cloned().collect(),
                    ..Default::default()
                }
            }),
        };
        Ok(Replies { resubscribe, ack })
    }

    fn listeners_request(&self) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: ResourceType::Listener.type_url().to_string(),
            ..Default::default()
        }
    }
}
