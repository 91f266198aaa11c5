//! `ballast.dev/v1alpha1` `Backend`: a named upstream with static endpoints (served over EDS),
//! or with DNS-named endpoints (served as a DNS cluster Envoy resolves itself, see [`DnsSettings`]).

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use serde::Deserialize;

use super::{Metadata, Source, object_kind};
use crate::duration::{de_duration, de_opt_duration};
use crate::spanned::{Pos, Spanned};

#[derive(Clone, Debug)]
pub struct Backend {
    pub metadata: Metadata,
    pub spec: BackendSpec,
    pub source: Source,
}
object_kind!(Backend, super::Kind::Backend);

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackendSpec {
    /// May be empty (requests then fail with 503 until endpoints appear).
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
    #[serde(default)]
    pub load_balancer: LoadBalancer,
    /// TCP connect timeout; Envoy's default (5s) when omitted.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub connect_timeout: Option<Spanned<Duration>>,
    #[serde(default)]
    pub health_check: Option<HealthCheck>,
    /// Upstream protocol, as a Kubernetes `appProtocol`: `http` (default, HTTP/1.1),
    /// `kubernetes.io/h2c` / `h2c` / `grpc` (HTTP/2 without TLS), `kubernetes.io/ws` / `ws`
    /// (HTTP/1.1; WebSocket upgrades pass on every listener anyway).
    /// Also accepted as `appProtocol` (Gateway API GEP-1911 spelling).
    #[serde(default, alias = "appProtocol")]
    pub protocol: Option<Spanned<String>>,
    /// How Envoy resolves the endpoints that are hostnames; only used when at least one is.
    #[serde(default)]
    pub dns: Option<DnsSettings>,
}

/// DNS resolution of a Backend whose endpoints include hostnames. Such a Backend is one Envoy
/// DNS cluster with its endpoints inline (not EDS): Envoy resolves the names itself, on its own
/// timer, so a changed DNS answer moves traffic without a config push.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DnsSettings {
    #[serde(default)]
    pub mode: Spanned<DnsMode>,
    /// How often Envoy re-resolves (Envoy's default 5s when omitted).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub refresh_rate: Option<Spanned<Duration>>,
    /// Re-resolve when the answer's TTL expires instead of every `refreshRate`.
    #[serde(default, alias = "respectDnsTtl")]
    pub respect_ttl: bool,
    /// Which address families to ask for (Envoy's `AUTO` when omitted: IPv6, else IPv4).
    #[serde(default)]
    pub lookup_family: Option<LookupFamily>,
}

/// Envoy's two DNS cluster kinds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
pub enum DnsMode {
    /// Every address of every name is an endpoint (Envoy `STRICT_DNS`): load is balanced over
    /// all of them and connections to addresses that leave the answer are closed.
    #[default]
    Strict,
    /// One endpoint, connecting to the first address of the latest answer (Envoy
    /// `LOGICAL_DNS`), for large services behind changing address sets; needs exactly one
    /// endpoint.
    Logical,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
pub enum LookupFamily {
    Auto,
    V4Only,
    V6Only,
    V4Preferred,
    All,
}

/// An endpoint address as written: an IP, or a DNS name Envoy resolves.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EndpointAddress {
    Ip(IpAddr),
    Hostname(String),
}

impl EndpointAddress {
    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            EndpointAddress::Ip(ip) => Some(*ip),
            EndpointAddress::Hostname(_) => None,
        }
    }

    pub fn hostname(&self) -> Option<&str> {
        match self {
            EndpointAddress::Ip(_) => None,
            EndpointAddress::Hostname(h) => Some(h),
        }
    }

    pub fn is_ipv6(&self) -> bool {
        matches!(self, EndpointAddress::Ip(IpAddr::V6(_)))
    }
}

impl From<IpAddr> for EndpointAddress {
    fn from(ip: IpAddr) -> Self {
        EndpointAddress::Ip(ip)
    }
}

impl fmt::Display for EndpointAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndpointAddress::Ip(ip) => ip.fmt(f),
            EndpointAddress::Hostname(h) => f.write_str(h),
        }
    }
}

/// Any string: an IP when it parses as one, else a hostname (checked by validation, so a bad
/// name gets a positioned error like every other semantic mistake).
impl<'de> Deserialize<'de> for EndpointAddress {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(match s.parse::<IpAddr>() {
            Ok(ip) => EndpointAddress::Ip(ip),
            Err(_) => EndpointAddress::Hostname(s),
        })
    }
}

/// The HTTP version Envoy speaks to a Backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum UpstreamProtocol {
    #[default]
    Http1,
    /// HTTP/2 with prior knowledge (h2c), as gRPC needs.
    Http2,
}

/// The `appProtocol` values Ballast understands, and what they select; others are errors on a
/// Backend and ignored (HTTP/1.1) on a Service port, as Kubernetes allows any value there.
pub fn upstream_protocol(app_protocol: &str) -> Option<UpstreamProtocol> {
    match app_protocol {
        "http" | "HTTP" | "kubernetes.io/ws" | "ws" | "kubernetes.io/wss" => {
            Some(UpstreamProtocol::Http1)
        }
        "kubernetes.io/h2c" | "h2c" | "grpc" | "GRPC" | "http2" | "HTTP2" => {
            Some(UpstreamProtocol::Http2)
        }
        _ => None,
    }
}

impl BackendSpec {
    /// Whether any endpoint is a hostname: the Backend is then a DNS cluster, not EDS.
    pub fn is_dns(&self) -> bool {
        self.endpoints
            .iter()
            .any(|e| e.address.hostname().is_some())
    }

    pub fn upstream_protocol(&self) -> UpstreamProtocol {
        self.protocol
            .as_ref()
            .and_then(|p| upstream_protocol(p))
            .unwrap_or_default()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Endpoint {
    /// An IP address, or a DNS name (then the whole Backend is a DNS cluster Envoy resolves;
    /// IP endpoints in it resolve to themselves).
    pub address: Spanned<EndpointAddress>,
    pub port: Spanned<u32>,
    /// Relative load-balancing weight, 1..=1000000 (default 1).
    #[serde(default)]
    pub weight: Option<Spanned<u32>>,
    /// Zone (Envoy locality); endpoints without one share the empty locality.
    #[serde(default)]
    pub zone: Option<String>,
    #[serde(default)]
    pub health: HealthStatus,
}

impl Endpoint {
    pub fn weight(&self) -> u32 {
        self.weight.as_ref().map_or(1, |w| w.value)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
pub enum HealthStatus {
    #[default]
    Healthy,
    Unhealthy,
    /// Finishes existing requests, gets no new ones.
    Draining,
    /// Used only when no healthy endpoint is left (Envoy's DEGRADED; the catalog's `warning`).
    Degraded,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadBalancer {
    #[serde(default)]
    pub policy: LbPolicy,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
pub enum LbPolicy {
    #[default]
    RoundRobin,
    LeastRequest,
    Random,
    RingHash,
    Maglev,
}

/// Active HTTP health checking by Envoy.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HealthCheck {
    /// Request path, e.g. `/healthz`; a 200 answer is healthy.
    pub path: Spanned<String>,
    /// `Host` header of the checks; default the Backend's name (Envoy's own default, the
    /// cluster name `ns/name`, is not a valid Host and strict servers answer it with 400).
    #[serde(default)]
    pub host: Option<Spanned<String>>,
    #[serde(default = "five_seconds", deserialize_with = "de_duration")]
    pub interval: Spanned<Duration>,
    #[serde(default = "one_second", deserialize_with = "de_duration")]
    pub timeout: Spanned<Duration>,
    #[serde(default = "one")]
    pub healthy_threshold: Spanned<u32>,
    #[serde(default = "three")]
    pub unhealthy_threshold: Spanned<u32>,
}

fn five_seconds() -> Spanned<Duration> {
    Spanned::new(Duration::from_secs(5), Pos::UNKNOWN)
}
fn one_second() -> Spanned<Duration> {
    Spanned::new(Duration::from_secs(1), Pos::UNKNOWN)
}
fn one() -> Spanned<u32> {
    Spanned::new(1, Pos::UNKNOWN)
}
fn three() -> Spanned<u32> {
    Spanned::new(3, Pos::UNKNOWN)
}
