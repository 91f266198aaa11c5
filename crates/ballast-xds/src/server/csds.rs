//! Client Status Discovery Service: what each connected proxy holds, per
//! resource, from the ACK state the streams recorded.

use std::pin::Pin;

use envoy_types::pb::envoy::admin::v3::{ClientResourceStatus, UpdateFailureState};
use envoy_types::pb::envoy::service::status::v3::client_config::GenericXdsConfig;
use envoy_types::pb::envoy::service::status::v3::client_status_discovery_service_server::{
    ClientStatusDiscoveryService, ClientStatusDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::status::v3::{
    ClientConfig, ClientStatusRequest, ClientStatusResponse, ConfigStatus,
};
use envoy_types::pb::envoy::r#type::matcher::v3::StringMatcher;
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use futures::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::XdsServer;
use crate::registry::NodeStatus;
use crate::status::SyncState;

pub(crate) fn csds_service(server: XdsServer) -> ClientStatusDiscoveryServiceServer<Csds> {
    ClientStatusDiscoveryServiceServer::new(Csds(server))
}

pub struct Csds(XdsServer);

fn string_matches(m: &StringMatcher, s: &str) -> Result<bool, Status> {
    let (s, fold) = if m.ignore_case {
        (s.to_lowercase(), true)
    } else {
        (s.to_string(), false)
    };
    let norm = |p: &str| {
        if fold {
            p.to_lowercase()
        } else {
            p.to_string()
        }
    };
    Ok(match &m.match_pattern {
        Some(MatchPattern::Exact(p)) => s == norm(p),
        Some(MatchPattern::Prefix(p)) => s.starts_with(&norm(p)),
        Some(MatchPattern::Suffix(p)) => s.ends_with(&norm(p)),
        Some(MatchPattern::Contains(p)) => s.contains(&norm(p)),
        Some(_) => {
            return Err(Status::invalid_argument(
                "only exact/prefix/suffix/contains node id matchers are supported",
            ));
        }
        None => true,
    })
}

impl Csds {
    /// Answers one request: every node matched, per resource.
    pub fn status(&self, req: &ClientStatusRequest) -> Result<ClientStatusResponse, Status> {
        self.status_for(req, None)
    }

    /// [`Csds::status`] as seen by `peer`: only nodes the admission policy
    /// lets it see (all of them without a policy).
    pub fn status_for(
        &self,
        req: &ClientStatusRequest,
        peer: Option<&crate::security::PeerIdentity>,
    ) -> Result<ClientStatusResponse, Status> {
        let mut nodes = self.0.registry().nodes();
        nodes.retain(|n| self.0.shared.may_see(peer, &n.node, &n.group));
        if let Some(node) = &req.node {
            nodes.retain(|n| *n.id == node.id);
        }
        if !req.node_matchers.is_empty() {
            let mut kept = Vec::new();
            for n in nodes {
                let mut any = false;
                for m in &req.node_matchers {
                    let id_ok = match &m.node_id {
                        Some(sm) => string_matches(sm, &n.id)?,
                        None => true,
                    };
                    if id_ok {
                        any = true;
                    }
                }
                if any {
                    kept.push(n);
                }
            }
            nodes = kept;
        }
        let config = nodes
            .iter()
            .map(|n| self.client_config(n, req.exclude_resource_contents))
            .collect();
        Ok(ClientStatusResponse { config })
    }

    fn client_config(&self, n: &NodeStatus, exclude_contents: bool) -> ClientConfig {
        let snapshot = self.0.cache().snapshot(&n.group);
        let mut configs = Vec::new();
        for t in &n.types {
            let current = snapshot.as_ref().map(|s| s.resources(t.ty).clone());
            for (name, res) in t.acked.iter() {
                let in_snapshot = current.as_ref().and_then(|c| c.get(name));
                let up_to_date = in_snapshot.is_some_and(|s| s.version() == res.version());
                let (config_status, client_status, error_state) = match (&t.nack, up_to_date) {
                    (_, true) => (ConfigStatus::Synced, ClientResourceStatus::Acked, None),
                    (Some(nack), false) => (
                        ConfigStatus::Error,
                        ClientResourceStatus::Nacked,
                        Some(UpdateFailureState {
                            details: nack.message.clone(),
                            version_info: nack.version.to_string(),
                            ..Default::default()
                        }),
                    ),
                    (None, false) => (ConfigStatus::Stale, ClientResourceStatus::Acked, None),
                };
                configs.push(GenericXdsConfig {
                    type_url: t.ty.type_url().to_string(),
                    name: name.to_string(),
                    version_info: res.version().to_string(),
                    xds_config: (!exclude_contents).then(|| res.to_any()),
                    config_status: config_status as i32,
                    client_status: client_status as i32,
                    error_state,
                    ..Default::default()
                });
            }
            // Resources the client should have but does not hold yet.
            if let Some(current) = &current
                && t.wildcard
            {
                for (name, res) in current.iter() {
                    if !t.acked.contains_key(name) {
                        let status = match t.state {
                            SyncState::Error => ConfigStatus::Error,
                            SyncState::Stale => ConfigStatus::Stale,
                            _ => ConfigStatus::NotSent,
                        };
                        configs.push(GenericXdsConfig {
                            type_url: t.ty.type_url().to_string(),
                            name: name.to_string(),
                            version_info: res.version().to_string(),
                            config_status: status as i32,
                            client_status: ClientResourceStatus::Requested as i32,
                            error_state: t.nack.as_ref().map(|nack| UpdateFailureState {
                                details: nack.message.clone(),
                                version_info: nack.version.to_string(),
                                ..Default::default()
                            }),
                            ..Default::default()
                        });
                    }
                }
            }
        }
        ClientConfig {
            node: Some((*n.node).clone()),
            generic_xds_configs: configs,
            ..Default::default()
        }
    }
}

type CsdsStream = Pin<Box<dyn Stream<Item = Result<ClientStatusResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ClientStatusDiscoveryService for Csds {
    type StreamClientStatusStream = CsdsStream;

    async fn stream_client_status(
        &self,
        request: Request<Streaming<ClientStatusRequest>>,
    ) -> Result<Response<CsdsStream>, Status> {
        let peer = crate::security::ConnInfo::peer_of(request.extensions());
        let mut requests = request.into_inner();
        let me = Csds(self.0.clone());
        let out = async_stream_lite(move |tx| async move {
            while let Ok(Some(req)) = requests.message().await {
                if tx.send(me.status_for(&req, peer.as_deref())).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(out))
    }

    async fn fetch_client_status(
        &self,
        request: Request<ClientStatusRequest>,
    ) -> Result<Response<ClientStatusResponse>, Status> {
        let peer = crate::security::ConnInfo::peer_of(request.extensions());
        self.status_for(request.get_ref(), peer.as_deref())
            .map(Response::new)
    }
}

/// A stream fed by a spawned task through a small channel.
fn async_stream_lite<F, Fut>(f: F) -> CsdsStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<ClientStatusResponse, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(f(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}
