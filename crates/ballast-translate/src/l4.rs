//! TLS and TCP Gateway listeners → Envoy listeners with `tcp_proxy` filter chains.
//!
//! - A `TLS` port gets the `tls_inspector` listener filter and one filter chain per attached
//!   TLSRoute and listener, matching the route's effective hostnames as `server_names`. A
//!   connection whose SNI matches no chain matches nothing and Envoy closes it. `Passthrough`
//!   chains forward the encrypted bytes; `Terminate` chains decrypt with the listener's
//!   certificates (SDS) first.
//! - A `TCP` port gets one filter chain proxying every connection.
//!
//! Each chain's `tcp_proxy` sends to the route's resolvable backendRefs (weighted clusters when
//! there are several). Gateway API requires the share of connections of backendRefs that do not
//! resolve to be rejected: that share goes to [`REJECT_CLUSTER`], a static cluster without
//! endpoints, where Envoy closes the connection. A route with no resolvable backend closes all
//! its connections (`direct_response` with no data), and so does a TCP or TLS port with no
//! route attached: the listener stays, so attaching a route later is a filter chain change, not
//! a new socket.
//!
//! Conflicts: a hostname claimed by two TLSRoutes on one port goes to the first route in
//! (listener, route key) order; of several TCPRoutes on one TCP listener the smallest key
//! serves (files have no creation timestamps; the same rule as HTTPRoute precedence).
//!
//! Names: the Envoy listener is `{ns}/{gateway}/{port}` as for HTTP; a chain is
//! `{listener}/{gateway listener}/{route ns}/{route}` (a route attached to two TLS listeners of
//! one port gets two chains, which Envoy needs named apart), or `{listener}/closed`.

use std::collections::{BTreeMap, BTreeSet};

use ballast_model::hostname::ANY_HOST;
use ballast_model::set::{BackendRefResolution, CertificateRefResolution};
use ballast_model::{
    ConfigSet, Gateway, HttpRoute, Listener, ListenerProtocol, ObjectKey, RouteKind,
};
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfig;
use envoy_types::pb::envoy::config::listener::v3::listener_filter::ConfigType as ListenerFilterConfig;
use envoy_types::pb::envoy::config::listener::v3::{
    AdditionalAddress, Filter, FilterChain, FilterChainMatch, Listener as EnvoyListener,
    ListenerFilter,
};
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::direct_response::v3::Config as DirectResponse;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::{
    ClusterSpecifier, WeightedCluster, weighted_cluster::ClusterWeight,
};
use envoy_types::util::pack_any;

use ballast_xds::simple::socket_address;

use crate::policy::ClientSettings;
use crate::{Options, names};
use envoy_types::pb::envoy::extensions::filters::listener::proxy_protocol::v3::ProxyProtocol;

/// One filter chain of an L4 port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct L4Chain {
    pub name: String,
    /// The Gateway listener it serves (whose ClientPolicy applies).
    pub listener: String,
    /// SNI names (TLS); empty: any (TCP, or a TLS route without hostname restriction).
    pub server_names: Vec<String>,
    /// (backend, weight > 0); empty: connections are closed.
    pub backends: Vec<(ObjectKey, u32)>,
    /// Weight of the backendRefs that do not resolve (their connections are closed).
    pub rejected: u32,
    /// `Terminate` chains: the certificate Secrets.
    pub certificates: Vec<ObjectKey>,
}

/// The translation of a Gateway's TLS and TCP ports.
#[derive(Default)]
pub(crate) struct L4Plan {
    pub listeners: Vec<EnvoyListener>,
    /// Backends the chains send to (the Gateway's clusters), each counted once per chain.
    pub used: BTreeMap<ObjectKey, u32>,
    /// Every Backend key any attached L4 route's backendRefs may resolve to (dependencies),
    /// counted once per route.
    pub refs: BTreeMap<ObjectKey, u32>,
    pub secrets: BTreeSet<ObjectKey>,
    /// Whether a chain sends a share of its connections to [`REJECT_CLUSTER`].
    pub rejects: bool,
}

/// The cluster unresolvable backendRefs' share of connections goes to. `:` cannot occur in
/// Kubernetes names, so it never collides with a Backend's `{ns}/{name}`.
pub(crate) const REJECT_CLUSTER: &str = "ballast:unresolved";

/// [`REJECT_CLUSTER`]: static, no endpoints, so Envoy has no host and closes the connection.
pub(crate) fn reject_cluster() -> envoy_types::pb::envoy::config::cluster::v3::Cluster {
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::cluster::v3::cluster::{
        ClusterDiscoveryType, DiscoveryType,
    };
    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    Cluster {
        name: REJECT_CLUSTER.into(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: REJECT_CLUSTER.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The weighted, resolvable backends of an L4 route (every rule's backendRefs as one set), and
/// the total weight of those that do not resolve.
fn route_backends(
    config: &ConfigSet,
    kind: RouteKind,
    r: &HttpRoute,
) -> (Vec<(ObjectKey, u32)>, u32) {
    let mut out: Vec<(ObjectKey, u32)> = Vec::new();
    let mut rejected = 0u32;
    for b in r.spec.rules.iter().flat_map(|rule| &rule.backend_refs) {
        if b.weight.value == 0 {
            continue;
        }
        match config.resolve_backend_of(kind, r, b) {
            BackendRefResolution::Resolved(backend) => {
                match out.iter_mut().find(|(k, _)| *k == backend.key()) {
                    Some((_, w)) => *w = w.saturating_add(b.weight.value),
                    None => out.push((backend.key(), b.weight.value)),
                }
            }
            _ => rejected = rejected.saturating_add(b.weight.value),
        }
    }
    (out, rejected)
}

/// Plans and builds the TLS and TCP listeners of `gw` from [`ballast_model::l4_claims`] (which
/// route serves which SNI names on which listener; shared with status).
pub(crate) fn plan(config: &ConfigSet, gw: &Gateway, options: &Options) -> L4Plan {
    let key = gw.key();
    let mut out = L4Plan::default();
    let mut ports: BTreeMap<u32, Vec<&Listener>> = BTreeMap::new();
    // Conflicted listeners are not served (status `Conflicted=True`): no Envoy listener.
    for l in gw.distinct_listeners() {
        if matches!(*l.protocol, ListenerProtocol::Tls | ListenerProtocol::Tcp) {
            ports.entry(l.port.value).or_default().push(l);
        }
    }
    if ports.is_empty() {
        return out;
    }
    let claims = ballast_model::l4_claims(config, &key);
    // Dependencies: every attached route's candidate Backends, once per route.
    let mut seen_routes: BTreeSet<(RouteKind, ObjectKey)> = BTreeSet::new();
    for c in &claims {
        let r = &c.route;
        if !seen_routes.insert((c.kind, r.key())) {
            continue;
        }
        let keys: BTreeSet<ObjectKey> = r
            .spec
            .rules
            .iter()
            .flat_map(|rule| &rule.backend_refs)
            .flat_map(|b| b.candidate_keys(&r.metadata.namespace))
            .collect();
        for k in keys {
            *out.refs.entry(k).or_default() += 1;
        }
    }

    for (port, listeners) in ports {
        let protocol = *listeners[0].protocol;
        let listener_name = names::listener(&key, port);
        let mut chains: Vec<L4Chain> = Vec::new();
        for l in &listeners {
            // Terminate: the listener's resolvable certificates (claims skip those without).
            let certificates: Vec<ObjectKey> = if l.is_passthrough() {
                Vec::new()
            } else {
                l.tls
                    .iter()
                    .flat_map(|t| &t.certificate_refs)
                    .filter_map(|r| match config.resolve_certificate(gw, r) {
                        CertificateRefResolution::Resolved(s) => Some(s.key()),
                        _ => None,
                    })
                    .collect()
            };
            for c in claims
                .iter()
                .filter(|c| c.port == port && c.listener == *l.name && !c.hostnames.is_empty())
            {
                let (backends, rejected) = route_backends(config, c.kind, &c.route);
                chains.push(L4Chain {
                    name: format!("{listener_name}/{}/{}", l.name.value, c.route.key()),
                    listener: l.name.value.clone(),
                    server_names: if protocol == ListenerProtocol::Tcp
                        || c.hostnames.iter().any(|h| h == ANY_HOST)
                    {
                        Vec::new()
                    } else {
                        c.hostnames.clone()
                    },
                    backends,
                    rejected,
                    certificates: certificates.clone(),
                });
            }
        }
        if chains.is_empty() {
            chains.push(L4Chain {
                name: format!("{listener_name}/closed"),
                listener: listeners[0].name.value.clone(),
                server_names: Vec::new(),
                backends: Vec::new(),
                rejected: 0,
                certificates: Vec::new(),
            });
        }
        for c in &chains {
            for (b, _) in &c.backends {
                *out.used.entry(b.clone()).or_default() += 1;
            }
            out.secrets.extend(c.certificates.iter().cloned());
            out.rejects |= !c.backends.is_empty() && c.rejected > 0;
        }
        out.listeners.push(envoy_listener(
            config,
            gw,
            port,
            protocol == ListenerProtocol::Tls,
            &chains,
            options,
        ));
    }
    out
}

fn stat_prefix(gw: &ObjectKey, port: u32, options: &Options) -> String {
    let base = format!("{}_{}_{}", gw.namespace, gw.name, port).replace('.', "_");
    if options.stat_prefix.is_empty() {
        base
    } else {
        format!("{}_{}", options.stat_prefix, base)
    }
}

fn tcp_proxy_filter(stat_prefix: &str, backends: &[(ObjectKey, u32)], rejected: u32) -> Filter {
    let Some(first) = backends.first() else {
        // No backend: close the connection at once (no bytes).
        return Filter {
            name: "envoy.filters.network.direct_response".into(),
            config_type: Some(FilterConfig::TypedConfig(pack_any(
                DirectResponse::default(),
            ))),
        };
    };
    let cluster = if backends.len() == 1 && rejected == 0 {
        ClusterSpecifier::Cluster(names::cluster(&first.0))
    } else {
        ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: backends
                .iter()
                .map(|(b, w)| (names::cluster(b), *w))
                .chain((rejected > 0).then(|| (REJECT_CLUSTER.to_owned(), rejected)))
                .map(|(name, weight)| ClusterWeight {
                    name,
                    weight,
                    ..Default::default()
                })
                .collect(),
        })
    };
    Filter {
        name: "envoy.filters.network.tcp_proxy".into(),
        config_type: Some(FilterConfig::TypedConfig(pack_any(TcpProxy {
            stat_prefix: stat_prefix.to_owned(),
            cluster_specifier: Some(cluster),
            ..Default::default()
        }))),
    }
}

/// The Envoy listener of one TLS/TCP port. A Gateway listener's ClientPolicy applies as on
/// HTTP listeners where it makes sense for connections: PROXY protocol (before the
/// `tls_inspector`: it precedes the ClientHello), the connection limit, and client certificate
/// validation on `Terminate` chains.
fn envoy_listener(
    config: &ConfigSet,
    gw: &Gateway,
    port: u32,
    tls: bool,
    chains: &[L4Chain],
    options: &Options,
) -> EnvoyListener {
    let key = gw.key();
    let client: Vec<Option<ClientSettings<'_>>> = chains
        .iter()
        .map(|c| ClientSettings::for_listener(config, &key, &c.listener))
        .collect();
    let proxy_protocol = client
        .iter()
        .flatten()
        .any(|c| c.policy.spec.enable_proxy_protocol);
    let p = u16::try_from(port).unwrap_or(0);
    let addrs = crate::listener::addresses(gw, options);
    let stat_prefix = stat_prefix(&key, port, options);
    EnvoyListener {
        name: names::listener(&key, port),
        address: Some(socket_address(&addrs[0].to_string(), p)),
        additional_addresses: addrs[1..]
            .iter()
            .map(|a| AdditionalAddress {
                address: Some(socket_address(&a.to_string(), p)),
                ..Default::default()
            })
            .collect(),
        filter_chains: chains
            .iter()
            .zip(&client)
            .map(|(c, client)| FilterChain {
                name: c.name.clone(),
                filter_chain_match: (!c.server_names.is_empty()).then(|| FilterChainMatch {
                    server_names: c.server_names.clone(),
                    ..Default::default()
                }),
                filters: client
                    .as_ref()
                    .and_then(|cs| crate::policy::connection_limit_filter(cs, &stat_prefix))
                    .into_iter()
                    .chain([tcp_proxy_filter(&stat_prefix, &c.backends, c.rejected)])
                    .collect(),
                transport_socket: (!c.certificates.is_empty()).then(|| {
                    let mut ctx = crate::listener::downstream_tls_context(
                        &c.certificates,
                        &[],
                        &options.config_sources,
                    );
                    if let Some(cs) = client {
                        crate::policy::apply_client_tls(&mut ctx, cs);
                    }
                    crate::listener::transport_socket(ctx)
                }),
                ..Default::default()
            })
            .collect(),
        listener_filters: {
            let mut f = Vec::new();
            if proxy_protocol {
                f.push(ListenerFilter {
                    name: "envoy.filters.listener.proxy_protocol".into(),
                    config_type: Some(ListenerFilterConfig::TypedConfig(pack_any(
                        ProxyProtocol::default(),
                    ))),
                    ..Default::default()
                });
            }
            if tls {
                f.push(ListenerFilter {
                    name: "envoy.filters.listener.tls_inspector".into(),
                    config_type: Some(ListenerFilterConfig::TypedConfig(pack_any(
                        TlsInspector::default(),
                    ))),
                    ..Default::default()
                });
            }
            f
        },
        ..Default::default()
    }
}

#[cfg(test)]
#[path = "l4_tests.rs"]
mod tests;
