//! Active health checks against a strict upstream (400 for an invalid `Host`): the checks send a
//! valid Host, so Envoy marks the endpoint healthy.

mod common;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, Upstream, wait_until};
use common::*;

fn checked_backend(name: &str, up: std::net::SocketAddr, host: Option<&str>) -> String {
    let host = host.map(|h| format!(", host: {h}")).unwrap_or_default();
    backend(name, &[up]).replace(
        "  connectTimeout: 1s\n",
        &format!(
            "  connectTimeout: 1s\n  healthCheck: {{ path: /healthz, interval: 1s, timeout: 1s{host} }}\n"
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_send_a_valid_host() {
    let a = Upstream::start("a").await.unwrap();
    a.set_strict_host(true);
    let b = Upstream::start("b").await.unwrap();
    b.set_strict_host(true);
    let gw_port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("all.yaml"),
        gateway(gw_port)
            + &route("a", "a.example.com", "a")
            + &checked_backend("a", a.addr(), None)
            + &route("b", "b.example.com", "b")
            + &checked_backend("b", b.addr(), Some("health.example.com")),
    )
    .unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-hc",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    // Both endpoints pass their active checks (a 400 would mark them failed_active_hc).
    wait_until(T, POLL, || async {
        let Ok(clusters) = envoy.admin_get("/clusters").await else {
            return false;
        };
        let healthy = |c: &str| {
            clusters.lines().any(|l| {
                l.starts_with(&format!("default/{c}::")) && l.ends_with("health_flags::healthy")
            })
        };
        a.last_host().is_some() && b.last_host().is_some() && healthy("a") && healthy("b")
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}: hosts {:?} {:?}; {}",
            a.last_host(),
            b.last_host(),
            ballast.log_tail()
        )
    });
    let clusters = envoy.admin_get("/clusters").await.unwrap();
    assert!(!clusters.contains("failed_active_hc"), "{clusters}");
    assert_eq!(a.last_host().as_deref(), Some("a"));
    assert_eq!(b.last_host().as_deref(), Some("health.example.com"));
    let gw = loopback(gw_port);
    for (host, body) in [("a.example.com", "a"), ("b.example.com", "b")] {
        wait_until(T, POLL, || async {
            matches!(host_get(gw, host).await, Ok((200, b)) if b == body)
        })
        .await
        .unwrap();
    }
}
