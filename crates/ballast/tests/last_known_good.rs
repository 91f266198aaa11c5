//! Last known good (invariant 8) and the blast-radius guard (invariant 9), with real
//! Envoy and traffic.

mod common;

use std::time::Duration;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, Traffic, TrafficConfig, Upstream, wait_until};
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_file_changes_nothing_and_fix_applies() {
    let a = Upstream::start("a").await.unwrap();
    let b = Upstream::start("b").await.unwrap();
    let gw_port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("gateway.yaml");
    let web = dir.path().join("web.yaml");
    std::fs::write(
        &main,
        gateway(gw_port) + &route("web", "web.example.com", "web"),
    )
    .unwrap();
    write_atomic(&web, &backend("web", &[a.addr()]));
    let ballast = Ballast::start(
        free_addr(),
        free_addr(),
        &["--config", dir.path().to_str().unwrap()],
    )
    .unwrap();
    ballast.wait_ready().await.unwrap();
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-lkg",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(gw_port);
    wait_until(T, POLL, || async {
        matches!(host_get(gw, "web.example.com").await, Ok((200, _)))
    })
    .await
    .unwrap();
    let traffic = Traffic::start(TrafficConfig::new(gw, "web.example.com", "/").concurrency(2));
    let before = envoy.config_dump(true).await.unwrap();

    // A broken edit: the endpoint moves to b, but line 6 has an invalid duration.
    let broken =
        backend("web", &[b.addr()]).replace("connectTimeout: 1s", "connectTimeout: 1parsec");
    write_atomic(&web, &broken);
    let errors = ballast_testkit::wait_for(T, POLL, || async {
        let (_, body) = ballast.get("/debug/sources").await?;
        let v: serde_json::Value = serde_json::from_str(&body)?;
        let errors = v["sources"][0]["errors"].to_string();
        if errors.contains("web.yaml:") {
            Ok(errors)
        } else {
            anyhow::bail!("no error yet")
        }
    })
    .await
    .unwrap();
    assert!(
        errors.contains("web.yaml:6:"),
        "error names file:line:col: {errors}"
    );
    // `ballast validate` reports the same position.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ballast"))
        .arg("validate")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("web.yaml:6:"), "{text}");
    // Nothing changed in Envoy; traffic still goes to a.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = envoy.config_dump(true).await.unwrap();
    assert_eq!(
        ballast_testkit::ConfigSummary::from_dump(&before).endpoints,
        ballast_testkit::ConfigSummary::from_dump(&after).endpoints
    );
    assert_eq!(
        host_get(gw, "web.example.com").await.unwrap(),
        (200, "a".into())
    );

    // The fix applies.
    write_atomic(&web, &backend("web", &[b.addr()]));
    wait_until(T, POLL, || async {
        matches!(host_get(gw, "web.example.com").await, Ok((200, body)) if body == "b")
    })
    .await
    .unwrap();
    let (_, body) = ballast.get("/debug/sources").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["sources"][0]["errors"], serde_json::json!([]));
    traffic.stop().await.assert_all_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_holds_mass_deletion_then_applies_it() {
    let up = Upstream::start("u").await.unwrap();
    let gw_port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("all.yaml");
    let n = 20;
    std::fs::write(&file, many_routes(gw_port, n, &[up.addr()])).unwrap();
    let ballast = Ballast::start(
        free_addr(),
        free_addr(),
        &[
            "--config",
            dir.path().to_str().unwrap(),
            "--guard-settle",
            "3s",
        ],
    )
    .unwrap();
    ballast.wait_ready().await.unwrap();
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-guard",
        "default/edge",
        AdsMode::DeltaGrpc,
    ))
    .await
    .unwrap();
    let gw = loopback(gw_port);
    wait_until(T, POLL, || async {
        matches!(host_get(gw, "h19.example.com").await, Ok((200, _)))
    })
    .await
    .unwrap();

    // Delete 80% of the routes at once.
    write_atomic(&file, &many_routes(gw_port, n / 5, &[up.addr()]));
    wait_until(T, POLL, || async {
        ballast.metric("ballast_guard_held").await.unwrap_or(0.0) == 1.0
    })
    .await
    .unwrap();
    assert_eq!(
        ballast.metric("ballast_guard_holds_total").await.unwrap(),
        1.0
    );
    let (_, body) = ballast.get("/debug/pipeline").await.unwrap();
    assert!(body.contains("would remove 16 of 20 routes"), "{body}");
    // Held: Envoy still routes the deleted hostnames.
    assert_eq!(host_get(gw, "h19.example.com").await.unwrap().0, 200);
    // After the settle period, still wanted: applied.
    wait_until(T, POLL, || async {
        matches!(host_get(gw, "h19.example.com").await, Ok((404, _)))
    })
    .await
    .unwrap();
    assert_eq!(host_get(gw, "h3.example.com").await.unwrap().0, 200);
    assert_eq!(ballast.metric("ballast_guard_held").await.unwrap(), 0.0);
}
