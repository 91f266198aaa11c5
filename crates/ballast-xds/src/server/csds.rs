//! Client Status Discovery Service: what each connected proxy holds, per
//! resource, from the ACK state the streams recorded.

use std::pin::Pin;

use envoy_types::pb::envoy::admin::v3::{ClientResourceStatus, UpdateFailureState};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::status::v3::client_config::GenericXdsConfig;
use envoy_types::pb::envoy::service::status::v3::client_status_discovery_service_server::{
    ClientStatusDiscoveryService, ClientStatusDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::status::v3::{
    ClientConfig, ClientStatusRequest, ClientStatusResponse, ConfigStatus,
};
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::envoy::r#type::matcher::v3::struct_matcher::path_segment::Segment;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    NodeMatcher, StringMatcher, StructMatcher, ValueMatcher, double_matcher, list_matcher,
    value_matcher,
};
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use futures::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::XdsServer;
use crate::registry::NodeStatus;
use crate::status::SyncState;

pub(crate) fn csds_service(server: XdsServer) -> ClientStatusDiscoveryServiceServer<Csds> {
    ClientStatusDiscoveryServiceServer::new(Csds(server))
}

pub(crate) struct Csds(XdsServer);

/// `StringMatcher` as Envoy applies it: `ignore_case` for exact, prefix,
/// suffix and contains; `safe_regex` must match the whole string.
/// `custom` matchers (extensions) are rejected with `at` naming the field.
fn string_matches(m: &StringMatcher, s: &str, at: &str) -> Result<bool, Status> {
    let fold = |p: &str| {
        if m.ignore_case {
            p.to_lowercase()
        } else {
            p.to_string()
        }
    };
    let s_folded = fold(s);
    Ok(match &m.match_pattern {
        Some(MatchPattern::Exact(p)) => s_folded == fold(p),
        Some(MatchPattern::Prefix(p)) => s_folded.starts_with(&fold(p)),
        Some(MatchPattern::Suffix(p)) => s_folded.ends_with(&fold(p)),
        Some(MatchPattern::Contains(p)) => s_folded.contains(&fold(p)),
        Some(MatchPattern::SafeRegex(r)) => {
            let re = regex::Regex::new(&format!("^(?:{})$", r.regex)).map_err(|e| {
                Status::invalid_argument(format!("{at}.safe_regex {:?}: {e}", r.regex))
            })?;
            re.is_match(s)
        }
        Some(MatchPattern::Custom(c)) => {
            return Err(Status::invalid_argument(format!(
                "{at}: custom string matcher {:?} is not supported",
                c.name
            )));
        }
        None => true,
    })
}

/// The value at `path` in `root` (every segment but the last must name a
/// nested struct); `None` if the path does not resolve.
fn lookup<'a>(
    root: Option<&'a Struct>,
    m: &StructMatcher,
    at: &str,
) -> Result<Option<&'a Value>, Status> {
    if m.path.is_empty() {
        return Err(Status::invalid_argument(format!(
            "{at}.path must not be empty"
        )));
    }
    let mut current = root;
    let mut value = None;
    for seg in &m.path {
        let Some(Segment::Key(key)) = &seg.segment else {
            return Err(Status::invalid_argument(format!(
                "{at}.path: a segment without key"
            )));
        };
        let Some(st) = current else { return Ok(None) };
        value = st.fields.get(key);
        current = match value.and_then(|v| v.kind.as_ref()) {
            Some(Kind::StructValue(s)) => Some(s),
            _ => None,
        };
    }
    Ok(value)
}

/// `ValueMatcher` semantics: a missing value matches only `present_match:
/// false`; `list_match` matches a list with any matching element.
fn value_matches(m: &ValueMatcher, v: Option<&Value>, at: &str) -> Result<bool, Status> {
    use value_matcher::MatchPattern as P;
    let kind = v.and_then(|v| v.kind.as_ref());
    Ok(match &m.match_pattern {
        None => {
            return Err(Status::invalid_argument(format!(
                "{at}: empty value matcher"
            )));
        }
        Some(P::NullMatch(_)) => matches!(kind, Some(Kind::NullValue(_))),
        Some(P::DoubleMatch(d)) => match (kind, &d.match_pattern) {
            (Some(Kind::NumberValue(x)), Some(double_matcher::MatchPattern::Exact(e))) => x == e,
            (Some(Kind::NumberValue(x)), Some(double_matcher::MatchPattern::Range(r))) => {
                r.start <= *x && *x < r.end
            }
            _ => false,
        },
        Some(P::StringMatch(sm)) => match kind {
            Some(Kind::StringValue(s)) => string_matches(sm, s, &format!("{at}.string_match"))?,
            _ => false,
        },
        Some(P::BoolMatch(b)) => matches!(kind, Some(Kind::BoolValue(x)) if x == b),
        Some(P::PresentMatch(p)) => kind.is_some() == *p,
        Some(P::ListMatch(l)) => {
            let Some(list_matcher::MatchPattern::OneOf(one)) = &l.match_pattern else {
                return Err(Status::invalid_argument(format!(
                    "{at}.list_match: one_of is required"
                )));
            };
            match kind {
                Some(Kind::ListValue(list)) => {
                    let mut any = false;
                    for item in &list.values {
                        any |= value_matches(one, Some(item), &format!("{at}.list_match.one_of"))?;
                    }
                    any
                }
                _ => false,
            }
        }
        Some(P::OrMatch(or)) => {
            let mut any = false;
            for (i, vm) in or.value_matchers.iter().enumerate() {
                any |= value_matches(vm, v, &format!("{at}.or_match.value_matchers[{i}]"))?;
            }
            any
        }
    })
}

/// A `NodeMatcher` (AND of its node id matcher and every metadata matcher).
pub(crate) fn node_matches(m: &NodeMatcher, node: &Node, at: &str) -> Result<bool, Status> {
    if let Some(sm) = &m.node_id
        && !string_matches(sm, &node.id, &format!("{at}.node_id"))?
    {
        return Ok(false);
    }
    for (i, sm) in m.node_metadatas.iter().enumerate() {
        let at = format!("{at}.node_metadatas[{i}]");
        let Some(vm) = &sm.value else {
            return Err(Status::invalid_argument(format!("{at}.value is required")));
        };
        let v = lookup(node.metadata.as_ref(), sm, &at)?;
        if !value_matches(vm, v, &format!("{at}.value"))? {
            return Ok(false);
        }
    }
    Ok(true)
}

impl Csds {
    /// Answers one request: every connected node that any of
    /// `node_matchers` matches (all nodes when there are none). `req.node`
    /// identifies the requester, as the spec says; it does not filter.
    #[cfg(test)]
    pub(crate) fn status(&self, req: &ClientStatusRequest) -> Result<ClientStatusResponse, Status> {
        self.status_for(req, None)
    }

    /// [`Csds::status`] as seen by `peer`: only nodes the admission policy
    /// lets it see (all of them without a policy).
    pub(crate) fn status_for(
        &self,
        req: &ClientStatusRequest,
        peer: Option<&crate::security::PeerIdentity>,
    ) -> Result<ClientStatusResponse, Status> {
        let mut nodes = self.0.registry().nodes();
        nodes.retain(|n| self.0.shared.may_see(peer, &n.node, &n.group));
        if let Some(requester) = &req.node {
            tracing::debug!(requester = %requester.id, "CSDS request");
        }
        if !req.node_matchers.is_empty() {
            let mut kept = Vec::new();
            for n in nodes {
                let mut any = false;
                for (i, m) in req.node_matchers.iter().enumerate() {
                    // Every matcher is evaluated, so a bad one is reported
                    // whatever the nodes.
                    any |= node_matches(m, &n.node, &format!("node_matchers[{i}]"))?;
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
        let drain = self.0.shared.drain.clone();
        let out = async_stream_lite(move |tx| async move {
            loop {
                let req = tokio::select! {
                    r = requests.message() => r,
                    _ = drain.cancelled() => {
                        let _ = tx.try_send(Err(super::shutting_down()));
                        break;
                    }
                };
                let Ok(Some(req)) = req else { break };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SnapshotCache;
    use crate::events::StreamKind;
    use crate::registry::StreamHandle;
    use envoy_types::pb::envoy::r#type::matcher::v3::struct_matcher::PathSegment;
    use envoy_types::pb::envoy::r#type::matcher::v3::{
        DoubleMatcher, ListMatcher, OrMatcher, RegexMatcher,
    };
    use envoy_types::pb::envoy::r#type::v3::DoubleRange;
    use envoy_types::pb::google::protobuf::ListValue;

    fn val(kind: Kind) -> Value {
        Value { kind: Some(kind) }
    }
    fn string(s: &str) -> Value {
        val(Kind::StringValue(s.into()))
    }
    fn object(fields: &[(&str, Value)]) -> Struct {
        Struct {
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        }
    }

    /// A server with nodes `ids` connected (each with `metadata`).
    fn server(nodes: &[(&str, Option<Struct>)]) -> (Csds, Vec<StreamHandle>) {
        let server = XdsServer::builder(SnapshotCache::new()).build();
        let handles = nodes
            .iter()
            .map(|(id, metadata)| {
                let node = Node {
                    id: id.to_string(),
                    metadata: metadata.clone(),
                    ..Default::default()
                };
                server
                    .registry()
                    .open(node, "g".into(), StreamKind::Sotw(None))
            })
            .collect();
        (Csds(server), handles)
    }

    fn ids(csds: &Csds, req: &ClientStatusRequest) -> Vec<String> {
        csds.status(req)
            .unwrap()
            .config
            .iter()
            .map(|c| c.node.as_ref().unwrap().id.clone())
            .collect()
    }

    fn id_matcher(p: MatchPattern, ignore_case: bool) -> NodeMatcher {
        NodeMatcher {
            node_id: Some(StringMatcher {
                match_pattern: Some(p),
                ignore_case,
            }),
            node_metadatas: vec![],
        }
    }

    fn meta_matcher(path: &[&str], value: value_matcher::MatchPattern) -> StructMatcher {
        StructMatcher {
            path: path
                .iter()
                .map(|k| PathSegment {
                    segment: Some(Segment::Key(k.to_string())),
                })
                .collect(),
            value: Some(ValueMatcher {
                match_pattern: Some(value),
            }),
        }
    }

    fn with_meta(matchers: Vec<StructMatcher>) -> ClientStatusRequest {
        ClientStatusRequest {
            node_matchers: vec![NodeMatcher {
                node_id: None,
                node_metadatas: matchers,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn the_requesting_node_identifies_the_requester_and_filters_nothing() {
        let (csds, _h) = server(&[("a", None), ("b", None)]);
        let req = ClientStatusRequest {
            node: Some(Node {
                id: "csds-client".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(ids(&csds, &req), ["a", "b"]);
    }

    #[test]
    fn node_id_matchers_are_ored() {
        let (csds, _h) = server(&[
            ("a", None),
            ("b", None),
            ("Edge-1", None),
            ("edge-22", None),
            ("edge-x", None),
        ]);
        let req = |ms: Vec<NodeMatcher>| ClientStatusRequest {
            node_matchers: ms,
            ..Default::default()
        };
        assert_eq!(ids(&csds, &req(vec![])).len(), 5);
        let exact_a = id_matcher(MatchPattern::Exact("a".into()), false);
        assert_eq!(ids(&csds, &req(vec![exact_a.clone()])), ["a"]);
        let regex = id_matcher(
            MatchPattern::SafeRegex(RegexMatcher {
                regex: "edge-[0-9]+".into(),
                ..Default::default()
            }),
            false,
        );
        // Full match: "edge-x" does not, and "Edge-1" differs in case.
        assert_eq!(ids(&csds, &req(vec![regex.clone()])), ["edge-22"]);
        assert_eq!(
            ids(&csds, &req(vec![exact_a, regex])),
            ["a", "edge-22"],
            "OR of matchers"
        );
        let prefix = id_matcher(MatchPattern::Prefix("EDGE-".into()), true);
        assert_eq!(
            ids(&csds, &req(vec![prefix])),
            ["Edge-1", "edge-22", "edge-x"]
        );
        let suffix = id_matcher(MatchPattern::Suffix("-x".into()), false);
        assert_eq!(ids(&csds, &req(vec![suffix])), ["edge-x"]);
        let contains = id_matcher(MatchPattern::Contains("dge-2".into()), false);
        assert_eq!(ids(&csds, &req(vec![contains])), ["edge-22"]);
    }

    #[test]
    fn metadata_matchers_follow_the_struct_path_and_are_anded() {
        use value_matcher::MatchPattern as V;
        let meta = object(&[
            (
                "ballast",
                val(Kind::StructValue(object(&[(
                    "gateway",
                    string("default/edge"),
                )]))),
            ),
            ("zone", string("z1")),
            ("weight", val(Kind::NumberValue(3.0))),
            ("canary", val(Kind::BoolValue(true))),
            ("none", val(Kind::NullValue(0))),
            (
                "tags",
                val(Kind::ListValue(ListValue {
                    values: vec![string("x"), string("y")],
                })),
            ),
        ]);
        let (csds, _h) = server(&[("m", Some(meta)), ("plain", None)]);
        let exact = |s: &str| StringMatcher {
            match_pattern: Some(MatchPattern::Exact(s.into())),
            ignore_case: false,
        };
        let one = |m: StructMatcher| ids(&csds, &with_meta(vec![m]));
        let gw = meta_matcher(
            &["ballast", "gateway"],
            V::StringMatch(exact("default/edge")),
        );
        assert_eq!(one(gw.clone()), ["m"]);
        assert!(
            one(meta_matcher(
                &["ballast", "gateway"],
                V::StringMatch(exact("x"))
            ))
            .is_empty()
        );
        // A path through a non-struct value does not resolve.
        assert!(one(meta_matcher(&["zone", "gateway"], V::PresentMatch(true))).is_empty());
        assert_eq!(one(meta_matcher(&["zone"], V::PresentMatch(true))), ["m"]);
        assert_eq!(
            one(meta_matcher(&["missing"], V::PresentMatch(false))),
            ["m", "plain"]
        );
        assert_eq!(one(meta_matcher(&["canary"], V::BoolMatch(true))), ["m"]);
        assert!(one(meta_matcher(&["canary"], V::BoolMatch(false))).is_empty());
        assert_eq!(
            one(meta_matcher(&["none"], V::NullMatch(Default::default()))),
            ["m"]
        );
        let range = |start, end| {
            V::DoubleMatch(DoubleMatcher {
                match_pattern: Some(double_matcher::MatchPattern::Range(DoubleRange {
                    start,
                    end,
                })),
            })
        };
        assert_eq!(one(meta_matcher(&["weight"], range(3.0, 4.0))), ["m"]);
        assert!(
            one(meta_matcher(&["weight"], range(1.0, 3.0))).is_empty(),
            "end is exclusive"
        );
        let list = |s: &str| {
            V::ListMatch(Box::new(ListMatcher {
                match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(ValueMatcher {
                    match_pattern: Some(V::StringMatch(exact(s))),
                }))),
            }))
        };
        assert_eq!(one(meta_matcher(&["tags"], list("y"))), ["m"]);
        assert!(one(meta_matcher(&["tags"], list("z"))).is_empty());
        let or = V::OrMatch(OrMatcher {
            value_matchers: vec![
                ValueMatcher {
                    match_pattern: Some(V::StringMatch(exact("z9"))),
                },
                ValueMatcher {
                    match_pattern: Some(V::StringMatch(exact("z1"))),
                },
            ],
        });
        assert_eq!(one(meta_matcher(&["zone"], or)), ["m"]);
        // AND: every metadata matcher and the node id matcher.
        let zone = meta_matcher(&["zone"], V::StringMatch(exact("z1")));
        let wrong_zone = meta_matcher(&["zone"], V::StringMatch(exact("z2")));
        assert_eq!(
            ids(&csds, &with_meta(vec![gw.clone(), zone.clone()])),
            ["m"]
        );
        assert!(ids(&csds, &with_meta(vec![gw.clone(), wrong_zone])).is_empty());
        let mut both = with_meta(vec![gw, zone]);
        both.node_matchers[0].node_id = Some(exact("other"));
        assert!(ids(&csds, &both).is_empty());
    }

    #[test]
    fn bad_matchers_are_invalid_argument_naming_where() {
        let (csds, _h) = server(&[("a", None)]);
        let bad_regex = ClientStatusRequest {
            node_matchers: vec![
                id_matcher(MatchPattern::Exact("a".into()), false),
                id_matcher(
                    MatchPattern::SafeRegex(RegexMatcher {
                        regex: "(".into(),
                        ..Default::default()
                    }),
                    false,
                ),
            ],
            ..Default::default()
        };
        let err = csds.status(&bad_regex).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(
            err.message()
                .contains("node_matchers[1].node_id.safe_regex"),
            "{}",
            err.message()
        );
        let mut empty_path = with_meta(vec![meta_matcher(
            &[],
            value_matcher::MatchPattern::PresentMatch(true),
        )]);
        let err = csds.status(&empty_path).unwrap_err();
        assert!(
            err.message()
                .contains("node_matchers[0].node_metadatas[0].path"),
            "{}",
            err.message()
        );
        empty_path.node_matchers[0].node_metadatas[0].path = vec![PathSegment {
            segment: Some(Segment::Key("k".into())),
        }];
        empty_path.node_matchers[0].node_metadatas[0].value = None;
        let err = csds.status(&empty_path).unwrap_err();
        assert!(
            err.message().contains("node_metadatas[0].value"),
            "{}",
            err.message()
        );
    }
}
