//! ADS State of the World, as Envoy speaks it: `node` on the first request
//! only; wildcard CDS and LDS; named EDS/RDS subscriptions following what the
//! clusters and listeners reference; ACK (same nonce, the response's version)
//! after decoding, NACK (previous version, `error_detail`) when the predicate
//! rejects a resource. The bookkeeping is shared with REST polling.

use std::collections::BTreeSet;
use std::time::Instant;

use ballast_xds::ResourceType;
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::{
    DiscoveryRequest, DiscoveryResponse,
};
use ballast_xds::envoy_types::pb::google::rpc::Status as RpcStatus;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use super::{
    ClientConfig, DROPPED, GatePermit, Refs, SharedState, backoff, clusters_warm, connect, decode,
    dependent, dropped, wait_restored,
};

#[derive(Debug, Default)]
pub(crate) struct TypeSt {
    /// Subscribed names (EDS/RDS); CDS/LDS are wildcard.
    pub names: BTreeSet<String>,
    pub acked_version: String,
    pub last_nonce: String,
    pub requested: bool,
}

/// What a SotW response did to the client.
pub(crate) struct Applied {
    pub ty: ResourceType,
    /// `Some(message)`: rejected.
    pub nack: Option<String>,
    /// The named type whose subscription changed because of this response.
    pub resubscribe: Option<ResourceType>,
}

/// Per-stream SotW client state that survives reconnects (the view and the
/// subscriptions: a reconnecting Envoy resumes with its versions).
#[derive(Debug, Default)]
pub(crate) struct SotwClient {
    pub types: [TypeSt; 5],
    refs: Refs,
    /// LDS waits for warm clusters on a first start (see `clusters_warm`).
    lds_deferred: bool,
}

fn is_named(ty: ResourceType) -> bool {
    !ty.is_full_state_in_sotw()
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
        let mut st = state.lock();
        st.on_response(&cfg.shared, ty, bytes, at);
        let mut decoded = Vec::with_capacity(resp.resources.len());
        let mut nack = None;
        for any in &resp.resources {
            match decode(ty, &any.type_url, &any.value) {
                Ok(d) => {
                    if let Some(m) = cfg.nack_for(ty, &d.name) {
                        nack = Some(m);
                        break;
                    }
                    decoded.push(d);
                }
                Err(e) => {
                    nack = Some(e);
                    break;
                }
            }
        }
        if nack.is_some() {
            st.on_nack(&cfg.shared, ty);
            return Ok(Applied {
                ty,
                nack,
                resubscribe: None,
            });
        }
        let full = ty.is_full_state_in_sotw();
        if full {
            self.refs.clear(ty);
        }
        let subscribed = &self.types[ty.index()].names;
        let mut upserts = Vec::with_capacity(decoded.len());
        for d in &decoded {
            // Envoy ignores resources it did not ask for on named types.
            if !full && !subscribed.contains(&*d.name) {
                continue;
            }
            self.refs.add(ty, d);
            upserts.push((d.name.clone(), d.version));
        }
        let mut resubscribe = None;
        if let Some(dep) = dependent(ty) {
            let wanted = self.refs.wanted(dep);
            if wanted != self.types[dep.index()].names {
                st.retain_subscribed(dep, &wanted);
                self.types[dep.index()].names = wanted;
                resubscribe = Some(dep);
            }
        }
        self.types[ty.index()].acked_version = resp.version_info.clone();
        st.on_ack(&cfg.shared, ty, &resp.version_info, full, &upserts, &[]);
        Ok(Applied {
            ty,
            nack: None,
            resubscribe,
        })
    }

    /// A request for `ty` carrying the current subscription and versions.
    pub fn request(&self, ty: ResourceType) -> DiscoveryRequest {
        let t = &self.types[ty.index()];
        DiscoveryRequest {
            version_info: t.acked_version.clone(),
            resource_names: if is_named(ty) {
                t.names.iter().cloned().collect()
            } else {
                Vec::new()
            },
            type_url: ty.type_url().to_string(),
            response_nonce: t.last_nonce.clone(),
            ..Default::default()
        }
    }

    /// Requests that open (or resume) a stream; `node` goes on the first only.
    fn initial_requests(
        &mut self,
        cfg: &ClientConfig,
        state: &SharedState,
    ) -> Vec<DiscoveryRequest> {
        let fresh = state.lock().stats.acks[ResourceType::Listener.index()] == 0;
        self.lds_deferred = fresh;
        let mut out = Vec::new();
        for ty in [
            ResourceType::Cluster,
            ResourceType::ClusterLoadAssignment,
            ResourceType::Listener,
            ResourceType::RouteConfiguration,
        ] {
            let t = &mut self.types[ty.index()];
            t.last_nonce.clear();
            let deferred = fresh && ty == ResourceType::Listener;
            if deferred || (is_named(ty) && t.names.is_empty()) {
                t.requested = false;
                continue;
            }
            t.requested = true;
            out.push(self.request(ty));
        }
        out[0].node = Some(cfg.node());
        out
    }
}

pub(crate) async fn run(cfg: ClientConfig, state: SharedState, mut stop: watch::Receiver<bool>) {
    let mut client = SotwClient::default();
    let mut attempt = 0;
    loop {
        let mut permit = GatePermit::acquire(&cfg).await;
        let r = session(&cfg, &state, &mut client, &mut stop, &mut permit).await;
        drop(permit);
        match r {
            Ok(()) => return,
            Err(e) => {
                let restored = wait_restored(&cfg.shared, &e, &mut stop).await;
                {
                    let mut st = state.lock();
                    st.stats.last_error = (!restored).then_some(e);
                    st.stats.reconnects += 1;
                }
                if restored {
                    attempt = 0;
                    if *stop.borrow() {
                        return;
                    }
                    continue;
                }
                attempt += 1;
                tokio::select! {
                    _ = tokio::time::sleep(backoff(attempt)) => {}
                    _ = stop.changed() => return,
                }
            }
        }
        if *stop.borrow() {
            return;
        }
    }
}

/// One stream; `Ok` when stopped, `Err` when it must reconnect.
async fn session(
    cfg: &ClientConfig,
    state: &SharedState,
    client: &mut SotwClient,
    stop: &mut watch::Receiver<bool>,
    permit: &mut GatePermit,
) -> Result<(), String> {
    let channel = connect(cfg.addr).await?;
    state
        .lock()
        .stats
        .connected_at
        .get_or_insert(Instant::now());
    let mut grpc =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(64 << 20);
    let (tx, rx) = mpsc::channel::<DiscoveryRequest>(16);
    for req in client.initial_requests(cfg, state) {
        tx.send(req).await.map_err(|e| e.to_string())?;
    }
    let mut stream = grpc
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .map_err(|s| format!("ADS: {s}"))?
        .into_inner();
    loop {
        let resp = tokio::select! {
            m = stream.message() => m.map_err(|s| format!("ADS stream: {s}"))?,
            _ = stop.changed() => return Ok(()),
            _ = dropped(&cfg.shared) => return Err(DROPPED.into()),
        };
        let Some(resp) = resp else {
            return Err("ADS stream closed by server".into());
        };
        let at = Instant::now();
        let bytes = prost::Message::encoded_len(&resp);
        if std::env::var_os("BALLAST_BENCH_TRACE").is_some() {
            eprintln!(
                "{} sotw recv {} v={} nonce={} resources={}",
                cfg.node_id,
                resp.type_url.rsplit('.').next().unwrap_or(""),
                resp.version_info,
                resp.nonce,
                resp.resources.len()
            );
        }
        let applied = client.apply(cfg, state, &resp, bytes, at)?;
        let ty = applied.ty;
        // Like Envoy: subscriptions that follow from this response go out
        // before its ACK (the dependent type is resumed inside the update).
        if let Some(dep) = applied.resubscribe {
            let t = &mut client.types[dep.index()];
            if t.requested || !t.names.is_empty() {
                t.requested = true;
                tx.send(client.request(dep))
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        client.types[ty.index()].last_nonce = resp.nonce.clone();
        let mut ack = client.request(ty);
        if let Some(message) = applied.nack {
            ack.error_detail = Some(RpcStatus {
                code: 3, // INVALID_ARGUMENT, as Envoy sends
                message,
                details: Vec::new(),
            });
        }
        if std::env::var_os("BALLAST_BENCH_TRACE").is_some() {
            eprintln!(
                "{} sotw send {} v={} nonce={} names={} nack={}",
                cfg.node_id,
                ack.type_url.rsplit('.').next().unwrap_or(""),
                ack.version_info,
                ack.response_nonce,
                ack.resource_names.len(),
                ack.error_detail.is_some()
            );
        }
        tx.send(ack).await.map_err(|e| e.to_string())?;
        if client.lds_deferred {
            let eds = &client.types[ResourceType::ClusterLoadAssignment.index()].names;
            if clusters_warm(&state.lock(), eds) {
                client.lds_deferred = false;
                client.types[ResourceType::Listener.index()].requested = true;
                tx.send(client.request(ResourceType::Listener))
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        permit.release_when_loaded(&state.lock());
    }
}
