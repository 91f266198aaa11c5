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
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = ads_envoy(&ballast, "envoy-lkg", "default/edge").await;
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
    wait_host_body(gw, "web.example.com", "b").await.unwrap();
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

/// Per-object last known good (invariant 8) with real Envoy: in one reload a bad edit to one
/// route and a good edit to another. The good edit reaches Envoy; the bad route keeps serving
/// its old version; /debug/sources names the error by file:line:col; no request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_edit_to_one_route_keeps_it_and_a_good_edit_applies() {
    let a = Upstream::start("a").await.unwrap();
    let b = Upstream::start("b").await.unwrap();
    let gw_port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("all.yaml");
    let n = 50;
    let extra = backend("bb", &[b.addr()]);
    let v1 = many_routes(gw_port, n, &[a.addr()]) + &extra;
    write_atomic(&file, &v1);
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-lkg-object",
        "default/edge",
        AdsMode::DeltaGrpc,
    ))
    .await
    .unwrap();
    let gw = loopback(gw_port);
    let last = format!("h{}.example.com", n - 1);
    wait_until(T, POLL, || async {
        matches!(host_get(gw, &last).await, Ok((200, _)))
    })
    .await
    .unwrap();
    let hosts: Vec<(String, String)> = (0..n)
        .map(|i| (format!("h{i}.example.com"), "/".to_owned()))
        .collect();
    let traffic = Traffic::start(TrafficConfig::with_requests(gw, hosts));
    let before = dump_virtual_hosts(&envoy.config_dump(false).await.unwrap());
    assert_eq!(before.len(), n);

    // One atomic write: r0 moves to bb but with an unknown field (invalid), r1 moves to bb
    // (valid).
    let r0_old = route("r0", "h0.example.com", "b0");
    let r1_old = route("r1", "h1.example.com", "b1");
    assert!(v1.contains(&r0_old) && v1.contains(&r1_old));
    let r0_bad = route("r0", "h0.example.com", "bb").replace("spec:\n", "spec:\n  bogus: 1\n");
    let v2 = v1
        .replace(&r0_old, &r0_bad)
        .replace(&r1_old, &route("r1", "h1.example.com", "bb"));
    write_atomic(&file, &v2);
    wait_host_body(gw, "h1.example.com", "b").await.unwrap();
    // The bad route keeps its last good version (to a), and in Envoy only h1 changed.
    assert_eq!(
        host_get(gw, "h0.example.com").await.unwrap(),
        (200, "a".into())
    );
    let after = dump_virtual_hosts(&envoy.config_dump(false).await.unwrap());
    let changed: Vec<&String> = before
        .keys()
        .filter(|h| before.get(*h) != after.get(*h))
        .collect();
    assert_eq!(changed, ["h1.example.com"]);
    assert_eq!(after.len(), n);
    let (_, body) = ballast.get("/debug/sources").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let src = &v["sources"][0];
    let bogus_line = v2.lines().position(|l| l == "  bogus: 1").unwrap() + 1;
    let expected = format!(
        "{}:{bogus_line}:3: HTTPRoute default/r0: spec.bogus: unknown field `bogus`",
        file.display()
    );
    let errors = src["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{src:#}");
    assert!(
        errors[0].as_str().unwrap().starts_with(&expected),
        "{expected} in {src:#}"
    );
    assert_eq!(src["rejected"][0]["name"], "r0", "{src:#}");
    assert!(
        src["rejected"][0]["serving"]
            .as_str()
            .is_some_and(|s| s.starts_with(&file.display().to_string())),
        "{src:#}"
    );
    assert_eq!(src["synced"], true);
    assert_eq!(ballast.get("/readyz").await.unwrap().0, 200);
    assert!(ballast.metric("ballast_source_errors_total").await.unwrap() >= 1.0);
    // `ballast validate` still fails (CI) and names the same place.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ballast"))
        .arg("validate")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&expected),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Let traffic run over every host for a while after the change: none fails.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let report = traffic.stop().await;
    report.assert_all_ok();

    // Fixing r0 applies it.
    write_atomic(&file, &v2.replace("  bogus: 1\n", ""));
    wait_host_body(gw, "h0.example.com", "b").await.unwrap();
}

/// A directory as real Kubernetes users have it (a NetworkPolicy, another project's policy
/// kind) plus one never-valid object starts ready and serves everything else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unimplemented_kinds_and_a_never_valid_object_start_ready() {
    let a = Upstream::start("a").await.unwrap();
    let gw_port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("all.yaml"),
        many_routes(gw_port, 3, &[a.addr()]),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("grants.yaml"),
        "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: allow-routes, namespace: backends }
spec:
  podSelector: {}
---
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: BackendTrafficPolicy
metadata: { name: retries }
spec:
  targetRefs: [{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: r0 }]
  retry: { numRetries: 3 }
",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("broken.yaml"),
        backend("broken", &[a.addr()]).replace("connectTimeout: 1s", "connectTimeout: soon"),
    )
    .unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-lkg-kinds",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(gw_port);
    for i in 0..3 {
        let host = format!("h{i}.example.com");
        wait_until(T, POLL, || async {
            matches!(host_get(gw, &host).await, Ok((200, body)) if body == "a")
        })
        .await
        .unwrap();
    }
    let (_, body) = ballast.get("/debug/sources").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let src = &v["sources"][0];
    let skipped: Vec<&str> = src["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        skipped,
        ["NetworkPolicy", "BackendTrafficPolicy"],
        "{src:#}"
    );
    assert_eq!(src["rejected"][0]["name"], "broken", "{src:#}");
    assert_eq!(src["rejected"][0]["serving"], serde_json::Value::Null);
    assert!(
        src["errors"][0]
            .as_str()
            .unwrap()
            .contains("broken.yaml:6:19: Backend default/broken: spec.connectTimeout:"),
        "{src:#}"
    );
    assert_eq!(
        ballast
            .metric("ballast_source_skipped_objects")
            .await
            .unwrap(),
        2.0
    );
    // Deleting the grants file: the gauge follows.
    std::fs::remove_file(dir.path().join("grants.yaml")).unwrap();
    wait_until(T, POLL, || async {
        ballast
            .metric("ballast_source_skipped_objects")
            .await
            .unwrap_or(-1.0)
            == 0.0
    })
    .await
    .unwrap();
}
