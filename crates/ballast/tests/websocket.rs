//! WebSocket upgrades through an Envoy HTTP listener to a real echo upstream (a Backend marked
//! `protocol: kubernetes.io/ws`, as an `appProtocol` would).

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
