//! The live catalog with real etcd and real Envoy: registrations bound to leases reach Envoy's
//! EDS, leave it when the registrar dies and its TTL runs out (not before), come back on
//! re-registration; health reported over the admin API becomes the EDS health status.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, EtcdCluster, Upstream, http_json};
use common::*;

const API: &str = "default/api";

/// Starts `ballast register` and waits for its "registered" line.
fn registrar(etcd: &EtcdCluster, args: &[&str]) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ballast"))
        .arg("register")
        .args(["--etcd", &etcd.client_url(0)])
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn ballast register");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.starts_with("registered ") => break,
            Some(Ok(_)) => {}
            other => panic!("ballast register ended: {other:?}"),
        }
    }
    std::thread::spawn(move || for _ in lines {});
    child
}

async fn serve_with_catalog(etcd: &EtcdCluster, dir: &std::path::Path) -> Ballast {
    let url = etcd.client_url(0);
    let b = Ballast::start(
        free_addr(),
        free_addr(),
        &["--config", dir.to_str().unwrap(), "--etcd", &url],
    )
    .unwrap();
    b.wait_ready()
        .await
        .unwrap_or_else(|e| panic!("{e}: {}", b.log_tail()));
    b
}

async fn endpoint_count(envoy: &Envoy) -> usize {
    envoy
        .config_summary(true)
        .await
        .unwrap()
        .endpoints
        .get(API)
        .map_or(0, |s| s.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_expire_after_the_ttl_when_the_registrar_dies() {
    let etcd = EtcdCluster::start_single().await.unwrap();
    let up = Upstream::start("static").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gw_port = ballast_testkit::free_port();
    std::fs::write(
        dir.path().join("c.yaml"),
        gateway(gw_port) + &route("api", "api.example.com", "api") + &backend("api", &[up.addr()]),
    )
    .unwrap();
    let ballast = serve_with_catalog(&etcd, dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-catalog",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    envoy
        .wait_until_config(T, true, |s| {
            s.endpoints.get(API).is_some_and(|e| e.len() == 1)
        })
        .await
        .unwrap();

    // 1,000 endpoints from one registrar (one lease), TTL 6 s.
    let args = [
        "--backend",
        "api",
        "--address",
        "127.0.0.2",
        "--port",
        "20000-20999",
        "--ttl",
        "6s",
    ];
    let mut reg = registrar(&etcd, &args);
    envoy
        .wait_until_config(T, true, |s| {
            s.endpoints.get(API).is_some_and(|e| e.len() == 1001)
        })
        .await
        .unwrap();

    // SIGKILL: no deregistration, the endpoints stay until the lease runs out. (How long
    // after the kill depends on when the registrar last refreshed it: a registrar starved
    // on a loaded machine refreshes late, so no later check is tied to the wall clock.)
    reg.kill().unwrap();
    reg.wait().unwrap();
    assert_eq!(
        endpoint_count(&envoy).await,
        1001,
        "present right after the kill"
    );
    // Then the lease expires and they leave EDS; the static endpoint stays.
    let s = envoy
        .wait_until_config(T, true, |s| {
            s.endpoints.get(API).is_some_and(|e| e.len() == 1)
        })
        .await
        .unwrap();
    assert!(s.endpoints[API].contains(&up.addr().to_string()));
    assert!(s.clusters.contains(API), "the cluster itself stays");

    // Re-registration restores them; SIGTERM deregisters at once (lease revoked).
    let reg = registrar(&etcd, &args);
    envoy
        .wait_until_config(T, true, |s| {
            s.endpoints.get(API).is_some_and(|e| e.len() == 1001)
        })
        .await
        .unwrap();
    let mut reg = reg;
    signal(reg.id(), "TERM");
    assert!(
        wait_exit(&mut reg, Duration::from_secs(10)).is_some_and(|s| s.success()),
        "register exits 0 on SIGTERM"
    );
    // Well within the TTL: wait_until_config's bound is larger, but revocation is immediate.
    envoy
        .wait_until_config(T, true, |s| {
            s.endpoints.get(API).is_some_and(|e| e.len() == 1)
        })
        .await
        .unwrap();
}

/// The health status Envoy holds for `addr` in cluster `API`.
async fn health_of(envoy: &Envoy, addr: &str) -> Option<String> {
    let dump = envoy.config_dump(true).await.unwrap();
    for c in dump["configs"].as_array()? {
        for e in c["dynamic_endpoint_configs"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let cfg = &e["endpoint_config"];
            if cfg["cluster_name"] != API {
                continue;
            }
            for loc in cfg["endpoints"].as_array().into_iter().flatten() {
                for lb in loc["lb_endpoints"].as_array().into_iter().flatten() {
                    let sa = &lb["endpoint"]["address"]["socket_address"];
                    if format!("{}:{}", sa["address"].as_str()?, sa["port_value"]) == addr {
                        return Some(lb["health_status"].as_str().unwrap_or("UNKNOWN").to_owned());
                    }
                }
            }
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_registration_heartbeat_health_and_deregistration() {
    let etcd = EtcdCluster::start_single().await.unwrap();
    let up = Upstream::start("static").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gw_port = ballast_testkit::free_port();
    std::fs::write(
        dir.path().join("c.yaml"),
        gateway(gw_port) + &route("api", "api.example.com", "api") + &backend("api", &[up.addr()]),
    )
    .unwrap();
    let ballast = serve_with_catalog(&etcd, dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-catalog-http",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let admin = ballast.admin;
    let (code, body) = http_json(
        admin,
        "PUT",
        "/catalog/v1/register",
        Some(r#"{"backend":"api","address":"127.0.0.3","port":7000,"ttl":"30s","id":"i-1","health":"critical"}"#),
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"lease\""), "{body}");
    let ep = "127.0.0.3:7000";
    ballast_testkit::wait_until(T, POLL, || async {
        health_of(&envoy, ep).await.as_deref() == Some("UNHEALTHY")
    })
    .await
    .unwrap();
    for (h, want) in [("warning", "DEGRADED"), ("passing", "HEALTHY")] {
        let (code, body) = http_json(
            admin,
            "PUT",
            "/catalog/v1/health/default/api/i-1",
            Some(&format!(r#"{{"health":"{h}"}}"#)),
        )
        .await
        .unwrap();
        assert_eq!(code, 204, "{body}");
        ballast_testkit::wait_until(T, POLL, || async {
            // Envoy omits HEALTHY's zero value in the dump? It prints it as an enum name or not at all.
            let got = health_of(&envoy, ep).await;
            got.as_deref() == Some(want) || (want == "HEALTHY" && got.as_deref() == Some("UNKNOWN"))
        })
        .await
        .unwrap();
    }
    let (code, body) = http_json(admin, "PUT", "/catalog/v1/heartbeat/default/api/i-1", None)
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"ttl\""), "{body}");
    // Bad input is refused with a reason; unknown registrations are 404.
    let (code, _) = http_json(
        admin,
        "PUT",
        "/catalog/v1/register",
        Some(r#"{"backend":"api","address":"nope","port":1,"ttl":"10s"}"#),
    )
    .await
    .unwrap();
    assert!((400..500).contains(&code));
    let (code, body) = http_json(
        admin,
        "PUT",
        "/catalog/v1/register",
        Some(r#"{"backend":"api","address":"127.0.0.1","port":1,"ttl":"1s"}"#),
    )
    .await
    .unwrap();
    assert_eq!(code, 400, "{body}");
    let (code, _) = http_json(admin, "PUT", "/catalog/v1/heartbeat/default/api/nope", None)
        .await
        .unwrap();
    assert_eq!(code, 404);

    let (code, _) = http_json(
        admin,
        "DELETE",
        "/catalog/v1/register/default/api/i-1",
        None,
    )
    .await
    .unwrap();
    assert_eq!(code, 204);
    ballast_testkit::wait_until(T, POLL, || async { health_of(&envoy, ep).await.is_none() })
        .await
        .unwrap();
    assert_eq!(endpoint_count(&envoy).await, 1);
}

/// etcd down for longer than the TTL: registered endpoints stay in EDS (never empty by
/// accident); etcd back: the registrar's heartbeats resume and the registrations stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_survive_an_etcd_outage() {
    let mut etcd = EtcdCluster::start_single().await.unwrap();
    let up = Upstream::start("static").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gw_port = ballast_testkit::free_port();
    std::fs::write(
        dir.path().join("c.yaml"),
        gateway(gw_port) + &route("api", "api.example.com", "api") + &backend("api", &[up.addr()]),
    )
    .unwrap();
    let ballast = serve_with_catalog(&etcd, dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-catalog-outage",
        "default/edge",
        AdsMode::DeltaGrpc,
    ))
    .await
    .unwrap();
    let args = [
        "--backend",
        "api",
        "--address",
        "127.0.0.4",
        "--port",
        "30000-30009",
        "--ttl",
        "5s",
    ];
    let mut reg = registrar(&etcd, &args);
    envoy
        .wait_until_config(T, true, |s| {
            s.endpoints.get(API).is_some_and(|e| e.len() == 11)
        })
        .await
        .unwrap();

    // etcd stops for longer than the TTL: nothing changes in Envoy meanwhile.
    etcd.stop(0);
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(endpoint_count(&envoy).await, 11, "kept while etcd is down");
    }
    etcd.restart(0).await.unwrap();
    // Back: the registrar keeps (or re-creates) its registrations; they are still there two
    // TTLs later.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        endpoint_count(&envoy).await,
        11,
        "registrations alive after etcd is back"
    );
    assert!(
        reg.try_wait().unwrap().is_none(),
        "the registrar kept running"
    );
    reg.kill().unwrap();
    reg.wait().unwrap();
    envoy
        .wait_until_config(T, true, |s| {
            s.endpoints.get(API).is_some_and(|e| e.len() == 1)
        })
        .await
        .unwrap();
}
