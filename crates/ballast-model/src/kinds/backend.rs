//! `ballast.dev/v1alpha1` `Backend`: a named upstream with static endpoints (served over EDS).

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
    /// An IP address: EDS hands Envoy addresses, not names to resolve.
    pub address: Spanned<IpAddr>,
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
