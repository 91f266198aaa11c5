//! `ballast-translate`: pure, deterministic functions from a [`ConfigSet`] to the Envoy resources
//! of each Gateway, plus an incremental [`Translator`] that re-encodes only what a config change
//! touches.
//!
//! # Naming scheme of the Envoy resources
//!
//! Names are built from object keys so they are stable across restarts and replicas
//! (invariant 5, docs/architecture.md) and readable in Envoy's admin output:
//!
//! | resource | name |
//! |---|---|
//! | `Listener` | `{ns}/{gateway}/{port}`: one per Gateway port; extra Gateway `addresses` become `additional_addresses` of the same listener; `{ns}/{gateway}/{port}/udp` for the QUIC (HTTP/3) listener of an HTTPS port whose ClientPolicy sets `http3` |
//! | `RouteConfiguration` (HTTP port) | `{ns}/{gateway}/{port}`: all HTTP Gateway listeners sharing the port share it, one virtual host per hostname |
//! | `RouteConfiguration` (HTTPS port) | `{ns}/{gateway}/{port}/{hostname}` (`*` for a listener without hostname): one per SNI filter chain, so a hostname's routes are only reachable through the chain (certificate) of its own Gateway listener |
//! | `VirtualHost` | the hostname it serves (`*` for all hosts); domains are bare hostnames and the HCM strips any port from `Host` |
//! | `Route` | `{ns}/{route}/{rule}/{match}` (indices; a named rule's name replaces its index, and its routes get the stat prefix `{ns}/{route}/{name}`; `{route}` is `grpc:{name}` for a GRPCRoute); the share of a rule sent to unresolvable backends is an extra route named `.../unresolved` |
//! | `Cluster`, `ClusterLoadAssignment` | `{ns}/{backend}`; `{ns}/{backend}:h2c` for the HTTP/2 copy a GRPCRoute uses ([`grpc`]); a Backend with hostname endpoints is a DNS cluster with its endpoints inline and has no `ClusterLoadAssignment` |
//! | `Secret` | `{ns}/{secret}` |
//!
//! # Translation choices (Gateway API mapping)
//! - Match precedence within a virtual host: `Exact` path, then `RegularExpression` (longer
//!   first), then `PathPrefix` (longer first), then a method match, more header matches, more
//!   query matches; ties are broken by route namespace/name, rule index, match index (files have
//!   no creation timestamps, so the "oldest route" rule becomes "smallest key"). Putting regexes
//!   before prefixes keeps the default `PathPrefix /` catch-all from shadowing them.
//! - `PathPrefix` is segment-aware (`path_separated_prefix`; a trailing `/` is ignored).
//! - A rule whose resolvable backendRefs carry no weight answers 500 (`direct_response`). When
//!   only part of a rule's weight is unresolvable, an extra route with the same match and a
//!   `runtime_fraction` equal to the unresolvable share answers 500 first; the rest falls through
//!   to `weighted_clusters` of the resolvable ones, so the split is exactly Gateway API's.
//! - `RingHash`/`Maglev` Backends get a source-IP `hash_policy` on the routes that use them
//!   (Envoy would otherwise hash a random value, i.e. no affinity).
//! - `timeouts.request` → route `timeout`; `timeouts.backendRequest` (or the ballast `retry`
//!   extension's `perTryTimeout`) → `retry_policy.per_try_timeout` (with `num_retries: 0` when no
//!   retries are configured, so it bounds the single try).
//! - HTTP Gateway listeners sharing a port: each hostname's virtual host only holds routes of
//!   the most specific Gateway listener matching it, and a hostname listener gets an (empty, 404)
//!   virtual host so its requests never fall through to a less specific listener's routes.
//! - An HTTPS Gateway listener none of whose certificateRefs resolve is not served (status
//!   `Programmed=False`), so no filter chain is generated for it.
//! - Conflicted Gateway listeners (HTTP and HTTPS on one port; same port, protocol and hostname)
//!   are not served at all; the distinct listeners of the Gateway are.
//! - `sessionPersistence` → a per-route `StatefulSessionPerRoute` (cookie or header session
//!   state) for the stateful session filter every connection manager carries (inactive).
#![forbid(unsafe_code)]

mod access_log;
mod cluster;
mod cors;
mod gateway;
pub mod grpc;
pub mod index;
mod l4;
mod listener;
mod otel;
mod policy;
mod rate_limit;
mod resources;
mod route;
mod secret;
mod security;
mod session;
mod source;
mod translator;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use ballast_model::ObjectKey;

pub use index::{DependencyIndex, Deps, Orphans};
pub use resources::GatewayResources;
pub use source::{ConfigSources, DEFAULT_XDS_CLUSTER, XdsTransport, config_source};
pub use translator::{
    ResourcePatch, ResourcesVersion, TranslateOutput, TranslateStats, Translator,
};

pub use ballast_model::ConfigSet;
pub use ballast_xds::{Resource, Snapshot, SnapshotError};

/// Translation settings that are not part of the config files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Where listeners bind when a Gateway has no `addresses`.
    pub default_address: IpAddr,
    /// Prepended (with `_`) to every HTTP connection manager `stat_prefix`
    /// (`{ns}_{gateway}_{port}`); empty for none.
    pub stat_prefix: String,
    /// How EDS/RDS/SDS references are fetched (see [`source`]): by default
    /// `ads: {}`.
    pub config_sources: ConfigSources,
    /// The DNS servers Envoy asks to resolve hostname Backends (c-ares `resolvers`); empty for
    /// the Envoy host's own (`/etc/resolv.conf`).
    pub dns_resolvers: Vec<SocketAddr>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            default_address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            stat_prefix: String::new(),
            config_sources: ConfigSources::default(),
            dns_resolvers: Vec::new(),
        }
    }
}

/// Why a gateway could not be translated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TranslateError {
    #[error("Gateway {0} not found")]
    GatewayNotFound(ObjectKey),
}

/// Translates one Gateway from scratch (no caches): pure and deterministic, the reference the
/// incremental [`Translator`] is tested against.
pub fn translate_gateway(
    config: &ConfigSet,
    gateway: &ObjectKey,
    options: &Options,
) -> Result<GatewayResources, TranslateError> {
    let mut caches = gateway::Caches::new(options);
    let mut stats = TranslateStats::default();
    let config = &grpc::translation_view(&Arc::new(config.clone()));
    let out = gateway::build_gateway(config, gateway, options, &mut caches, None, &mut stats)
        .map(|b| Arc::unwrap_or_clone(b.state.resources))
        .ok_or_else(|| TranslateError::GatewayNotFound(gateway.clone()));
    // Every translation in this crate's tests (unit and property) proves its
    // typed_config types print with the served descriptor pool alone.
    #[cfg(test)]
    if let Ok(res) = &out {
        tests::assert_served_json(res);
    }
    out
}

/// Resource names (see the crate docs for the scheme).
pub mod names {
    use ballast_model::ObjectKey;

    /// Cluster and ClusterLoadAssignment name of a Backend.
    pub fn cluster(backend: &ObjectKey) -> String {
        format!("{}/{}", backend.namespace, backend.name)
    }

    /// SDS Secret name of a TLS Secret.
    pub fn secret(secret: &ObjectKey) -> String {
        format!("{}/{}", secret.namespace, secret.name)
    }

    /// Listener name of a Gateway port (also the route configuration name of an HTTP port).
    pub fn listener(gateway: &ObjectKey, port: u32) -> String {
        format!("{}/{}/{}", gateway.namespace, gateway.name, port)
    }

    /// The UDP (QUIC, HTTP/3) listener of an HTTPS Gateway port.
    pub fn udp_listener(gateway: &ObjectKey, port: u32) -> String {
        format!("{}/{}/{}/udp", gateway.namespace, gateway.name, port)
    }

    /// Route configuration of one HTTPS filter chain (`hostname` `None` → `*`).
    pub fn https_route_config(gateway: &ObjectKey, port: u32, hostname: Option<&str>) -> String {
        format!(
            "{}/{}/{}/{}",
            gateway.namespace,
            gateway.name,
            port,
            hostname.unwrap_or("*")
        )
    }
}

/// Protobuf duration of a std duration.
pub(crate) fn pb_duration(d: std::time::Duration) -> envoy_types::pb::google::protobuf::Duration {
    envoy_types::pb::google::protobuf::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// Encodes a message into a resource. Names are built from non-empty object keys, so encoding
/// cannot fail.
pub(crate) fn encode<M: ballast_xds::XdsResource>(msg: &M) -> std::sync::Arc<Resource> {
    Resource::new(msg).expect("translated resources always have a non-empty name")
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
