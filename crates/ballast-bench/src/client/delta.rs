//! ADS Delta (incremental), as Envoy speaks it: wildcard CDS/LDS (an empty
//! first subscribe list), named EDS/RDS subscriptions changed with
//! subscribe/unsubscribe lists, resources tracked by name and version, every
//! response ACKed (or NACKed) by nonce. A reconnect resumes with
//! `initial_resource_versions`.

use std::collections::BTreeSet;
use std::time::Instant;

use ballast_xds::ResourceType;
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use ballast_xds::envoy_types::pb::google::rpc::Status as RpcStatus;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use super::{
    ClientConfig, DROPPED, GatePermit, Refs, SharedState, TYPES, backoff, clusters_warm, connect,
    decode, dependent, dropped, intern, version_u64, wait_restored,
};

#[derive(Debug, Default)]
struct TypeSt {
    /// Explicit subscriptions (EDS/RDS); CDS/LDS are wildcard.
    names: BTreeSet<String>,
    requested: bool,
}

#[derive(Debug, Default)]
struct DeltaClient {
    types: [TypeSt; 5],
    refs: Refs,
    /// LDS waits for warm clusters on a first start (see `clusters_warm`).
    lds_deferred: bool,
}

fn is_named(ty: ResourceType) -> bool {
    !ty.is_full_state_in_sotw()
}

/// What to send after a response: a subscription change (first) and the ACK/NACK.
struct Replies {
    resubscribe: Option<DeltaDiscoveryRequest>,
    ack: DeltaDiscoveryRequest,
}

impl DeltaClient {
    fn initial_requests(
        &mut self,
        cfg: &ClientConfig,
        state: &SharedState,
    ) -> Vec<DeltaDiscoveryRequest> {
        let st = state.lock();
        let fresh = st.stats.acks[ResourceType::Listener.index()] == 0;
        self.lds_deferred = fresh;
        let mut out = Vec::new();
        for ty in TYPES {
            let t = &mut self.types[ty.index()];
            let deferred = fresh && ty == ResourceType::Listener;
            if deferred || (is_named(ty) && t.names.is_empty()) {
                t.requested = false;
                continue;
            }
            t.requested = true;
            out.push(DeltaDiscoveryRequest {
                type_url: ty.type_url().to_string(),
                resource_names_subscribe: t.names.iter().cloned().collect(),
                initial_resource_versions: st.view[ty.index()]
                    .iter()
                    .map(|(n, v)| (n.to_string(), format!("{v:016x}")))
                    .collect(),
                ..Default::default()
            });
        }
        out[0].node = Some(cfg.node());
        out
    }

    fn apply(
        &mut self,
        cfg: &ClientConfig,
        state: &SharedState,
        resp: &DeltaDiscoveryResponse,
        bytes: usize,
        at: Instant,
    ) -> Result<Replies, String> {
        let ty = ResourceType::from_type_url(&resp.type_url)
            .ok_or_else(|| format!("delta response for unknown type {:?}", resp.type_url))?;
        let mut st = state.lock();
        st.on_response(&cfg.shared, ty, bytes, at);
        let mut decoded = Vec::with_capacity(resp.resources.len());
        let mut nack = None;
        let mut mismatches = 0;
        for r in &resp.resources {
            let Some(any) = &r.resource else {
                nack = Some(format!("{ty} {:?} without a resource body", r.name));
                break;
            };
            match decode(ty, &any.type_url, &any.value) {
                Ok(d) if *d.name != r.name => {
                    nack = Some(format!("resource named {:?} sent as {:?}", d.name, r.name));
                    break;
                }
                Ok(d) => {
                    if let Some(m) = cfg.nack_for(ty, &d.name) {
                        nack = Some(m);
                        break;
                    }
                    let v = version_u64(&r.version);
                    if v != d.version {
                        mismatches += 1;
                    }
                    decoded.push((d, v));
                }
                Err(e) => {
                    nack = Some(e);
                    break;
                }
            }
        }
        st.stats.version_mismatches += mismatches;
        let mut ack = DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            ..Default::default()
        };
        if let Some(message) = nack {
            st.on_nack(&cfg.shared, ty);
            ack.error_detail = Some(RpcStatus {
                code: 3,
                message,
                details: Vec::new(),
            });
            return Ok(Replies {
                resubscribe: None,
                ack,
            });
        }
        let subscribed = &self.types[ty.index()].names;
        let mut upserts = Vec::with_capacity(decoded.len());
        for (d, v) in &decoded {
            if is_named(ty) && !subscribed.contains(&*d.name) {
                continue;
            }
            self.refs.add(ty, d);
            upserts.push((d.name.clone(), *v));
        }
        let removed: Vec<_> = resp
            .removed_resources
            .iter()
            .map(|n| {
                self.refs.remove(ty, n);
                intern(n)
            })
            .collect();
        let mut resubscribe = None;
        if let Some(dep) = dependent(ty) {
            let wanted = self.refs.wanted(dep);
            let t = &mut self.types[dep.index()];
            if wanted != t.names {
                let subscribe: Vec<String> = wanted.difference(&t.names).cloned().collect();
                let unsubscribe: Vec<String> = t.names.difference(&wanted).cloned().collect();
                st.retain_subscribed(dep, &wanted);
                t.names = wanted;
                t.requested = true;
                resubscribe = Some(DeltaDiscoveryRequest {
                    type_url: dep.type_url().to_string(),
                    resource_names_subscribe: subscribe,
                    resource_names_unsubscribe: unsubscribe,
                    ..Default::default()
                });
            }
        }
        st.on_ack(
            &cfg.shared,
            ty,
            &resp.system_version_info,
            false,
            &upserts,
            &removed,
        );
        Ok(Replies { resubscribe, ack })
    }
}

pub(crate) async fn run(cfg: ClientConfig, state: SharedState, mut stop: watch::Receiver<bool>) {
    let mut client = DeltaClient::default();
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

async fn session(
    cfg: &ClientConfig,
    state: &SharedState,
    client: &mut DeltaClient,
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
    let (tx, rx) = mpsc::channel::<DeltaDiscoveryRequest>(16);
    for req in client.initial_requests(cfg, state) {
        tx.send(req).await.map_err(|e| e.to_string())?;
    }
    let mut stream = grpc
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .map_err(|s| format!("Delta ADS: {s}"))?
        .into_inner();
    loop {
        let resp = tokio::select! {
            m = stream.message() => m.map_err(|s| format!("Delta ADS stream: {s}"))?,
            _ = stop.changed() => return Ok(()),
            _ = dropped(&cfg.shared) => return Err(DROPPED.into()),
        };
        let Some(resp) = resp else {
            return Err("Delta ADS stream closed by server".into());
        };
        let at = Instant::now();
        let bytes = prost::Message::encoded_len(&resp);
        let replies = client.apply(cfg, state, &resp, bytes, at)?;
        if let Some(r) = replies.resubscribe {
            tx.send(r).await.map_err(|e| e.to_string())?;
        }
        tx.send(replies.ack).await.map_err(|e| e.to_string())?;
        if client.lds_deferred {
            let eds = &client.types[ResourceType::ClusterLoadAssignment.index()].names;
            if clusters_warm(&state.lock(), eds) {
                client.lds_deferred = false;
                client.types[ResourceType::Listener.index()].requested = true;
                tx.send(DeltaDiscoveryRequest {
                    type_url: ResourceType::Listener.type_url().to_string(),
                    ..Default::default()
                })
                .await
                .map_err(|e| e.to_string())?;
            }
        }
        permit.release_when_loaded(&state.lock());
    }
}
