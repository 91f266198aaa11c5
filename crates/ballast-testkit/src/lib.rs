//! `ballast-testkit`: real parts for end-to-end tests — Envoy processes, upstreams, traffic, flaky links.
//!
//! Ballast's invariants (DESIGN §3) are only believable when a *real* Envoy holds the config and *real* HTTP
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
//! * [`wait_for`] / [`wait_until`] — bounded polling, because tests must never hang.
//!
//! Nothing here asserts wall-clock time (DESIGN §7); timeouts only bound how long a test may hang.
#![forbid(unsafe_code)]

mod config_dump;
mod envoy;
mod http;
mod tcp_proxy;
mod traffic;
mod upstream;
mod wait;

pub use config_dump::ConfigSummary;
pub use envoy::{
    AdsMode, Envoy, EnvoyConfig, EnvoyOptions, envoy_binary, pid_alive, static_http_bootstrap,
    try_envoy_binary, workspace_root,
};
pub use http::http_get;
pub use tcp_proxy::TcpProxy;
pub use traffic::{Traffic, TrafficConfig, TrafficReport};
pub use upstream::Upstream;
pub use wait::{wait_for, wait_until};

/// A free TCP port on 127.0.0.1: binds port 0, reads the port the kernel chose, and releases it.
///
/// Only for things that cannot be told to bind port 0 and report back (e.g. a static Envoy listener).
/// There is an unavoidable race with other processes grabbing the same port; the kernel hands out ephemeral
/// ports in a rotating fashion, which makes an immediate reuse unlikely.
pub fn free_port() -> u16 {
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
}
