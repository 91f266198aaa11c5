//! `ballast-testkit`: real parts for end-to-end tests — Envoy processes, upstreams, traffic, flaky links.
//!
//! Ballast's invariants (docs/architecture.md §4) only count when a *real* Envoy holds the config and *real* HTTP
//! traffic flows through it while the control plane misbehaves. This crate starts those parts on loopback,
//! each bounded in time and cleaned up on drop, so a test reads like the scenario it proves:
//!
//! * [`Envoy`] — a real Envoy 1.40 process (static bootstrap or a generated ADS bootstrap), with admin
//!   helpers for `/stats`, `/config_dump` and server state, killed by pid on drop.
//! * [`Upstream`] — an HTTP/1.1 server answering `200` with its own name, so traffic reports show where
//!   requests went.
//! * [`Traffic`] — concurrent keep-alive client loops counting every status, body and connection error.
//! * [`TcpProxy`] — a round-robin TCP relay whose connections can be cut at will, to break Envoy's xDS
//!   stream or fail it over between control-plane replicas.
//! * [`DnsServer`] — a loopback UDP DNS server answering A/AAAA from a map the test edits, to point
//!   Envoy's DNS clusters at (hostname Backends, ExternalName Services).
//! * [`ExtAuthzServer`] — a gRPC `envoy.service.auth.v3.Authorization` service (allow on `x-allow: yes`),
//!   for ext_authz tests; also a [`RateLimitServer`] and an [`OtlpReceiver`].
//! * [`EtcdCluster`] — real etcd (one member or a cluster) to kill, restart and compact.
//! * [`wait_for`] / [`wait_until`] — bounded polling, because tests must never hang.
//!
//! Nothing here asserts wall-clock time (docs/architecture.md §7); timeouts only bound how long a
//! test may hang.
//!
//! Envoy is found through `$BALLAST_ENVOY` or the project venv that `scripts/test` creates; when it is
//! missing, starting one fails with instructions — end-to-end tests never skip. `$BALLAST_ENVOY_LOG_LEVEL`
//! (default `warning`) raises Envoy's log level; a test that panics prints each Envoy's log tail.
//!
//! A typical scenario (a control plane on `xds`, serving gateway `default/edge` on port `listener_port`):
//!
//! ```no_run
//! # async fn scenario(xds: std::net::SocketAddr, listener_port: u16) -> anyhow::Result<()> {
//! use std::time::Duration;
//! use ballast_testkit::*;
//!
//! let web = Upstream::start("web").await?;
//! // ... publish config routing web.example.com to `web.addr()` on the control plane ...
//! let link = TcpProxy::start(vec![xds]).await?;
//! let envoy = Envoy::start(&EnvoyConfig::new(link.addr(), "envoy-1", "default/edge", AdsMode::DeltaGrpc)).await?;
//! envoy.wait_live(Duration::from_secs(30)).await?;
//!
//! let traffic = Traffic::start(TrafficConfig::new(
//!     ([127, 0, 0, 1], listener_port).into(), "web.example.com", "/")); // bounded: 120 s at most
//! for _ in 0..5 {
//!     link.cut_all(); // break the xDS stream while requests flow
//!     wait_until(Duration::from_secs(30), Duration::from_millis(20), || async { link.live() > 0 }).await?;
//! }
//! traffic.stop().await.assert_all_ok();
//! assert_eq!(envoy.stat("listener_manager.listener_removed").await?, Some(0));
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod config_dump;
mod dns;
mod envoy;
mod etcd;
mod ext_authz_service;
mod grpc;
mod http;
mod jwt;
mod l4;
mod otlp;
mod rate_limit_service;
mod tcp_proxy;
mod traffic;
mod upstream;
mod wait;
mod websocket;

pub use config_dump::ConfigSummary;
pub use dns::DnsServer;
pub use envoy::{
    AdsMode, Envoy, EnvoyConfig, EnvoyOptions, envoy_binary, pid_alive, static_http_bootstrap,
    try_envoy_binary, workspace_root,
};
pub use etcd::{EtcdCluster, EtcdTls, try_etcd_binary};
pub use ext_authz_service::{EXT_AUTHZ_ALLOW_HEADER, EXT_AUTHZ_USER_HEADER, ExtAuthzServer};
pub use grpc::{GrpcOutcome, GrpcUpstream, grpc_calls, grpc_calls_tls, python};
pub use http::{http_get, http_json, http_post_json};
pub use jwt::{JwtSigner, unix_now};
pub use l4::{EchoConn, EchoServer, tcp_hello, tcp_hello_with, tls_hello};
pub use otlp::{OTLP_GRPC_EXPORT, OtlpReceiver, ReceivedSpan};
pub use rate_limit_service::RateLimitServer;
pub use tcp_proxy::TcpProxy;
pub use traffic::{Traffic, TrafficConfig, TrafficReport};
pub use upstream::Upstream;
pub use wait::{wait_for, wait_until};
pub use websocket::{WsEcho, ws_echo_roundtrip};

/// The ports `free_port` hands out: below Linux's default ephemeral range (32768–60999), so no
/// outgoing connection's local port can take one before its listener binds it.
const PORTS: std::ops::Range<u32> = 20_000..32_000;

/// A free TCP port on 127.0.0.1, for things that cannot be told to bind port 0 and report back
/// (e.g. a static Envoy listener).
///
/// Never the same port twice in one process, and never an ephemeral one: Envoy listens with
/// `SO_REUSEPORT`, so a port that two listeners (two tests' Envoys) both bind is not an error but
/// silently splits connections between them, and a connection that lands on an Envoy being shut
/// down is reset. Each process starts at an offset from its pid, so parallel test binaries rarely
/// meet; a port that is taken (bind fails) is skipped. Falls back to the kernel's choice if the
/// whole range is taken.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let span = PORTS.end - PORTS.start;
    let offset = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        if n >= span {
            break;
        }
        let port = (PORTS.start + (offset + n) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0 to find a free port");
    listener
        .local_addr()
        .expect("local_addr of a bound listener")
        .port()
}

#[cfg(test)]
mod tests {
    #[test]
    fn free_port_is_nonzero_and_bindable() {
        let p = super::free_port();
        assert_ne!(p, 0);
        std::net::TcpListener::bind(("127.0.0.1", p)).expect("the port is free again");
    }

    /// Parallel tests must never be handed the same port (their Envoys would share it through
    /// SO_REUSEPORT), nor an ephemeral one an outgoing connection may hold.
    #[test]
    fn free_ports_are_distinct_and_not_ephemeral() {
        let ports: Vec<u16> = (0..2000).map(|_| super::free_port()).collect();
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "a port was handed out twice");
        assert!(ports.iter().all(|p| super::PORTS.contains(&u32::from(*p))));
    }
}
