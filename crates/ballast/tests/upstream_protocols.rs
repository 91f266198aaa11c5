//! Upstream protocols through real Envoy: WebSocket upgrades to a real echo upstream (a Backend marked
//! `protocol: kubernetes.io/ws`, as an `appProtocol` would), and HTTP/2 to an h2c-only upstream.

mod common;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, WsEcho, wait_for, ws_echo_roundtrip};
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_echo_through_envoy() {
    let ws = WsEcho::start().await.unwrap();
    let gw_port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("all.yaml"),
        gateway(gw_port)
            + &route("chat", "chat.example.com", "chat")
            + &backend("chat", &[ws.addr()]).replace(
                "  connectTimeout: 1s\n",
                "  connectTimeout: 1s\n  protocol: kubernetes.io/ws\n",
            ),
    )
    .unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-ws",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(gw_port);
    let echoed = wait_for(T, POLL, || {
        ws_echo_roundtrip(gw, "chat.example.com", "/socket", "hello over envoy")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", ballast.log_tail()));
    assert_eq!(echoed, "hello over envoy");
    // Many upgrades in a row all succeed (no flakiness from the upgrade path).
    for i in 0..20 {
        let msg = format!("message {i}");
        assert_eq!(
            ws_echo_roundtrip(gw, "chat.example.com", "/socket", &msg)
                .await
                .unwrap(),
            msg
        );
    }
}

/// `protocol: kubernetes.io/h2c` makes Envoy speak HTTP/2 to an upstream that speaks nothing
/// else (as gRPC servers do); the same upstream as a plain Backend fails (HTTP/1.1 refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_protocol_reaches_an_http2_only_upstream() {
    let up = ballast_testkit::Upstream::start_h2c("h2").await.unwrap();
    let gw_port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("all.yaml"),
        gateway(gw_port)
            + &route("h2", "h2.example.com", "h2")
            + &backend("h2", &[up.addr()]).replace(
                "  connectTimeout: 1s\n",
                "  connectTimeout: 1s\n  protocol: kubernetes.io/h2c\n",
            )
            + &route("h1", "h1.example.com", "h1")
            + &backend("h1", &[up.addr()]),
    )
    .unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-h2c",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(gw_port);
    ballast_testkit::wait_until(T, POLL, || async {
        matches!(host_get(gw, "h2.example.com").await, Ok((200, b)) if b == "h2")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", ballast.log_tail()));
    let (status, _) = host_get(gw, "h1.example.com").await.unwrap();
    assert!(
        status >= 500,
        "HTTP/1.1 to an h2c-only upstream must fail, got {status}"
    );
}
