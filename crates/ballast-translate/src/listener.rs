//! Gateway listeners → Envoy listeners.
//!
//! One Envoy listener per Gateway port (every Gateway address binds it: the first as `address`,
//! the others as `additional_addresses`, so the names do not depend on the addresses). HTTP
//! ports have one filter chain whose HTTP connection manager takes its routes from RDS; HTTPS
//! ports have one filter chain per Gateway listener, selected by SNI, terminating TLS with
//! certificates from SDS, each with its own route configuration. An HTTPS port whose
//! ClientPolicy turns on HTTP/3 also gets a UDP listener on the same port (QUIC, same chains).

use std::collections::BTreeMap;
use std::net::IpAddr;

use ballast_model::set::CertificateRefResolution;
use ballast_model::{
    ConfigSet, Gateway, Listener, ListenerProtocol, ObjectKey, hostname_matches,
};
use ballast_xds::simple::{rds_http_connection_manager, socket_address};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use envoy_types::pb::envoy::config::core::v3::TransportSocket;
use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType as TsConfig;
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfig;
use envoy_types::pb::envoy::config::listener::v3::listener_filter::ConfigType as ListenerFilterConfig;
use envoy_types::pb::envoy::config::listener::v3::{
    AdditionalAddress, Filter, FilterChain, FilterChainMatch, Listener as EnvoyListener,
    ListenerFilter,
};
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::{
    RouteSpecifier, StripPortMode, UpgradeConfig,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, DownstreamTlsContext, SdsSecretConfig,
};
use envoy_types::pb::google::protobuf::BoolValue;
use envoy_types::util::pack_any;

use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::socket_address::Protocol;
use envoy_types::pb::envoy::config::core::v3::{Address, Http3ProtocolOptions};
use envoy_types::pb::envoy::config::listener::v3::{QuicProtocolOptions, UdpListenerConfig};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::CodecType;
use envoy_types::pb::envoy::extensions::transport_sockets::quic::v3::QuicDownstreamTransport;

use crate::policy::ClientSettings;
use crate::{ConfigSources, Options, config_source, names};
use envoy_types::pb::envoy::extensions::filters::listener::proxy_protocol::v3::ProxyProtocol;

/// One filter chain of a port: which Gateway listeners' routes it serves, through which route
/// configuration, and (HTTPS) for which SNI name with which certificates.
pub(crate) struct ChainPlan<'a> {
    pub listeners: Vec<&'a Listener>,
    pub route_config: String,
    /// HTTPS only: the SNI name (`None`: any, including no SNI).
    pub server_name: Option<String>,
    /// HTTPS only: the resolved certificate Secrets.
    pub certificates: Vec<ObjectKey>,
    /// HTTPS only: listeners of other chains of the port whose hostname is more specific than
    /// this chain's wildcard (`a.example.com` under `*.example.com`); their hosts are
    /// misdirected here (421), since a request for them belongs to their own listener.
    pub siblings: Vec<&'a Listener>,
}

pub(crate) struct PortPlan<'a> {
    pub port: u32,
    pub protocol: ListenerProtocol,
    pub chains: Vec<ChainPlan<'a>>,
}

/// The ports of a Gateway and their filter chains. Conflicted listeners and HTTPS listeners
/// without any resolvable certificate are left out (status `Programmed=False`), and so is a
/// port with no chain left.
pub(crate) fn plan<'a>(config: &ConfigSet, gw: &'a Gateway) -> Vec<PortPlan<'a>> {
    let key = gw.key();
    let mut ports: BTreeMap<u32, Vec<&Listener>> = BTreeMap::new();
    // Conflicted listeners are not served; the distinct ones on a port share one protocol.
    // TLS and TCP ports are `crate::l4`'s.
    for l in gw.distinct_listeners().filter(|l| {
        matches!(
            *l.protocol,
            ListenerProtocol::Http | ListenerProtocol::Https
        )
    }) {
        ports.entry(l.port.value).or_default().push(l);
    }
    let mut out = Vec::new();
    for (port, listeners) in ports {
        let protocol = listeners[0].protocol.value;
        let chains = match protocol {
            ListenerProtocol::Http => vec![ChainPlan {
                listeners,
                route_config: names::listener(&key, port),
                server_name: None,
                certificates: Vec::new(),
                siblings: Vec::new(),
            }],
            ListenerProtocol::Tls | ListenerProtocol::Tcp => continue,
            ListenerProtocol::Https => {
                let mut chains: Vec<ChainPlan> = listeners
                    .into_iter()
                    .filter_map(|l| {
                        let certificates: Vec<ObjectKey> = l
                            .tls
                            .iter()
                            .flat_map(|t| &t.certificate_refs)
                            .filter_map(|r| match config.resolve_certificate(gw, r) {
                                CertificateRefResolution::Resolved(s) => Some(s.key()),
                                _ => None,
                            })
                            .collect();
                        (!certificates.is_empty()).then(|| ChainPlan {
                            listeners: vec![l],
                            route_config: names::https_route_config(&key, port, l.hostname()),
                            server_name: l.hostname().map(str::to_owned),
                            certificates,
                            siblings: Vec::new(),
                        })
                    })
                    .collect();
                chains.sort_by(|a, b| a.route_config.cmp(&b.route_config));
                let served: Vec<&Listener> = chains.iter().map(|c| c.listeners[0]).collect();
                for c in &mut chains {
                    if let Some(h) = c.server_name.as_deref() {
                        c.siblings = served
                            .iter()
                            .copied()
                            .filter(|l| {
                                l.hostname()
                                    .is_some_and(|lh| lh != h && hostname_matches(h, lh))
                            })
                            .collect();
                    }
                }
                chains
            }
        };
        if !chains.is_empty() {
            out.push(PortPlan {
                port,
                protocol,
                chains,
            });
        }
    }
    out
}

/// Certificate Secret keys of every listener of `gw` (resolvable or not): the Secrets whose
/// changes can change this Gateway's resources.
pub(crate) fn certificate_refs(gw: &Gateway) -> impl Iterator<Item = ObjectKey> + '_ {
    gw.spec
        .listeners
        .iter()
        .flat_map(|l| l.tls.iter().flat_map(|t| &t.certificate_refs))
        .filter(|r| r.is_secret())
        .map(|r| {
            ObjectKey::new(
                r.namespace.as_deref().unwrap_or(&gw.metadata.namespace),
                r.name.as_str(),
            )
        })
}

fn stat_prefix(gw: &ObjectKey, port: u32, options: &Options) -> String {
    let base = format!("{}_{}_{}", gw.namespace, gw.name, port).replace('.', "_");
    if options.stat_prefix.is_empty() {
        base
    } else {
        format!("{}_{}", options.stat_prefix, base)
    }
}

/// The connection manager of one filter chain (TCP; [`quic_hcm`] derives the HTTP/3 one).
fn http_connection_manager(
    gw: &Gateway,
    stat_prefix: &str,
    route_config: &str,
    client: Option<&ClientSettings<'_>>,
    sources: &ConfigSources,
    rate_limit: &[HttpFilter],
    security: (
        &ConfigSet,
        &[&std::sync::Arc<ballast_model::SecurityPolicy>],
    ),
) -> HttpConnectionManager {
    let mut hcm = rds_http_connection_manager(stat_prefix, route_config);
    // CORS runs before the router; it acts only on routes with a CORS policy.
    hcm.http_filters.insert(0, crate::cors::http_filter());
    // Rate limits before the router: CORS preflights are answered without counting.
    let router = hcm.http_filters.len().saturating_sub(1);
    hcm.http_filters
        .splice(router..router, rate_limit.iter().cloned());
    // Stateful sessions pick the upstream host, so they sit right before the router; inactive
    // except on routes of a rule with sessionPersistence.
    let router = hcm.http_filters.len() - 1;
    hcm.http_filters
        .insert(router, crate::session::http_filter());
    if let Some(RouteSpecifier::Rds(rds)) = &mut hcm.route_specifier {
        rds.config_source = Some(config_source(sources));
    }
    if let Some(c) = client {
        crate::policy::apply_client_hcm(&mut hcm, c);
    }
    // After the client settings: it reads whether they set `use_remote_address`.
    crate::security::apply_hcm(&mut hcm, security.0, security.1);
    hcm.access_log = crate::access_log::access_logs(gw);
    // WebSocket upgrades pass through every HTTP listener (Envoy refuses them otherwise).
    hcm.upgrade_configs = vec![UpgradeConfig {
        upgrade_type: "websocket".into(),
        ..Default::default()
    }];
    // Virtual hosts list bare hostnames; `Host: a.example.com:8443` must still match them.
    hcm.strip_port_mode = Some(StripPortMode::StripAnyHostPort(true));
    // Gateway API path matching assumes normalized paths (`/a/../b` must not dodge `/b` rules).
    hcm.normalize_path = Some(BoolValue { value: true });
    hcm
}

fn hcm_filter(hcm: HttpConnectionManager) -> Filter {
    Filter {
        name: "envoy.filters.network.http_connection_manager".into(),
        config_type: Some(FilterConfig::TypedConfig(pack_any(hcm))),
    }
}

/// The HTTP/3 twin of a chain's connection manager: same routes, filters and settings, with
/// the HTTP/3 codec (HTTP/1 and HTTP/2 options do not apply to QUIC connections).
fn quic_hcm(tcp: &HttpConnectionManager) -> HttpConnectionManager {
    HttpConnectionManager {
        codec_type: CodecType::Http3 as i32,
        http3_protocol_options: Some(Http3ProtocolOptions::default()),
        http_protocol_options: None,
        http2_protocol_options: None,
        ..tcp.clone()
    }
}

fn tls_context(
    certificates: &[ObjectKey],
    client: Option<&ClientSettings<'_>>,
    sources: &ConfigSources,
) -> DownstreamTlsContext {
    let mut ctx = downstream_tls_context(certificates, &["h2", "http/1.1"], sources);
    if let Some(c) = client {
        crate::policy::apply_client_tls(&mut ctx, c);
    }
    ctx
}

/// QUIC with the chain's TLS context (same SDS certificates, versions and client
/// validation), offering ALPN `h3`.
fn quic_transport_socket(mut ctx: DownstreamTlsContext) -> TransportSocket {
    if let Some(c) = ctx.common_tls_context.as_mut() {
        c.alpn_protocols = vec!["h3".to_owned()];
    }
    TransportSocket {
        name: "envoy.transport_sockets.quic".into(),
        config_type: Some(TsConfig::TypedConfig(pack_any(QuicDownstreamTransport {
            downstream_tls_context: Some(ctx),
            ..Default::default()
        }))),
    }
}

fn udp_address(ip: &str, port: u16) -> Address {
    let mut a = socket_address(ip, port);
    if let Some(AddressKind::SocketAddress(sa)) = a.address.as_mut() {
        sa.protocol = Protocol::Udp as i32;
    }
    a
}

/// Downstream TLS with `certificates` (SDS) offering `alpn`.
pub(crate) fn downstream_tls_context(
    certificates: &[ObjectKey],
    alpn: &[&str],
    sources: &ConfigSources,
) -> DownstreamTlsContext {
    DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificate_sds_secret_configs: certificates
                .iter()
                .map(|k| SdsSecretConfig {
                    name: names::secret(k),
                    sds_config: Some(config_source(sources)),
                })
                .collect(),
            alpn_protocols: alpn.iter().map(|a| (*a).to_owned()).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn transport_socket(ctx: DownstreamTlsContext) -> TransportSocket {
    TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(TsConfig::TypedConfig(pack_any(ctx))),
    }
}

pub(crate) fn addresses(gw: &Gateway, options: &Options) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = gw.spec.addresses.iter().map(|a| a.value.value).collect();
    if out.is_empty() {
        out.push(options.default_address);
    }
    // Keep the written order (the first is the listener's main address) but drop repeats.
    let mut seen = Vec::new();
    out.retain(|a| {
        let new = !seen.contains(a);
        seen.push(*a);
        new
    });
    out
}

/// The Envoy listeners of one port: the TCP one, and for an HTTPS port with HTTP/3 on any of
/// its chains ([`ClientSettings::http3_port`]) a UDP (QUIC) one on the same port, named
/// [`names::udp_listener`], whose chains are those with HTTP/3 (same SNI names, certificates
/// and routes).
pub(crate) fn envoy_listeners(
    config: &ConfigSet,
    gw: &Gateway,
    port: &PortPlan<'_>,
    options: &Options,
    security: &[&std::sync::Arc<ballast_model::SecurityPolicy>],
) -> Vec<EnvoyListener> {
    let key = gw.key();
    // A chain's client settings are those of its (first) Gateway listener; HTTP listeners
    // sharing a port share one connection manager, so the first listener's policy applies.
    let client: Vec<Option<ClientSettings<'_>>> = port
        .chains
        .iter()
        .map(|c| ClientSettings::for_listener(config, &key, &c.listeners[0].name))
        .collect();
    let proxy_protocol = client
        .iter()
        .flatten()
        .any(|c| c.policy.spec.enable_proxy_protocol);
    let stat_prefix = stat_prefix(&key, port.port, options);
    let p = u16::try_from(port.port).unwrap_or(0);
    let addrs = addresses(gw, options);
    let https = port.protocol == ListenerProtocol::Https;
    let rate_limit = crate::rate_limit::http_filters(config, gw);
    let hcms: Vec<HttpConnectionManager> = port
        .chains
        .iter()
        .zip(&client)
        .map(|(c, client)| {
            http_connection_manager(
                gw,
                &stat_prefix,
                &c.route_config,
                client.as_ref(),
                &options.config_sources,
                &rate_limit,
                (config, security),
            )
        })
        .collect();
    let chain_name = |c: &ChainPlan<'_>| {
        if https {
            c.server_name.clone().unwrap_or_else(|| "*".into())
        } else {
            String::new()
        }
    };
    let chain_match = |c: &ChainPlan<'_>| {
        c.server_name.as_ref().map(|s| FilterChainMatch {
            server_names: vec![s.clone()],
            ..Default::default()
        })
    };
    let quic_chains: Vec<FilterChain> = port
        .chains
        .iter()
        .zip(&client)
        .zip(&hcms)
        .filter(|((_, client), _)| https && client.as_ref().is_some_and(|c| c.http3_port.is_some()))
        .map(|((c, client), hcm)| FilterChain {
            name: chain_name(c),
            filter_chain_match: chain_match(c),
            // QUIC chains take the connection manager only (no connection_limit filter).
            filters: vec![hcm_filter(quic_hcm(hcm))],
            transport_socket: Some(quic_transport_socket(tls_context(
                &c.certificates,
                client.as_ref(),
                &options.config_sources,
            ))),
            ..Default::default()
        })
        .collect();
    let tcp = EnvoyListener {
        name: names::listener(&key, port.port),
        address: Some(socket_address(&addrs[0].to_string(), p)),
        additional_addresses: addrs[1..]
            .iter()
            .map(|a| AdditionalAddress {
                address: Some(socket_address(&a.to_string(), p)),
                ..Default::default()
            })
            .collect(),
        filter_chains: port
            .chains
            .iter()
            .zip(&client)
            .zip(hcms)
            .map(|((c, client), mut hcm)| FilterChain {
                name: chain_name(c),
                filter_chain_match: chain_match(c),
                filters: client
                    .as_ref()
                    .and_then(|c| crate::policy::connection_limit_filter(c, &stat_prefix))
                    .into_iter()
                    .chain([hcm_filter({
                        if let Some(p) = client.as_ref().and_then(|c| c.http3_port) {
                            crate::policy::add_alt_svc(&mut hcm, p);
                        }
                        hcm
                    })])
                    .collect(),
                transport_socket: https.then(|| {
                    transport_socket(tls_context(
                        &c.certificates,
                        client.as_ref(),
                        &options.config_sources,
                    ))
                }),
                ..Default::default()
            })
            .collect(),
        listener_filters: {
            let mut f = Vec::new();
            // PROXY protocol first: it precedes the TLS ClientHello on the wire.
            if proxy_protocol {
                f.push(ListenerFilter {
                    name: "envoy.filters.listener.proxy_protocol".into(),
                    config_type: Some(ListenerFilterConfig::TypedConfig(pack_any(
                        ProxyProtocol::default(),
                    ))),
                    ..Default::default()
                });
            }
            if https {
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
    };
    if quic_chains.is_empty() {
        return vec![tcp];
    }
    let quic = EnvoyListener {
        name: names::udp_listener(&key, port.port),
        address: Some(udp_address(&addrs[0].to_string(), p)),
        additional_addresses: addrs[1..]
            .iter()
            .map(|a| AdditionalAddress {
                address: Some(udp_address(&a.to_string(), p)),
                ..Default::default()
            })
            .collect(),
        udp_listener_config: Some(UdpListenerConfig {
            quic_options: Some(QuicProtocolOptions::default()),
            ..Default::default()
        }),
        filter_chains: quic_chains,
        ..Default::default()
    };
    vec![tcp, quic]
}
