//! N interchangeable replicas over etcd (issue #12 §4): three `ballast serve --etcd` behind a
//! round-robin TCP proxy, real Envoys under traffic; config edited with `ballast apply`, a
//! replica SIGKILLed and restarted, Envoy's xDS connections cut: zero non-2xx, no listener or
//! cluster removed, and every replica serves identical versions at the same store revision.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use ballast_testkit::{
    AdsMode, Envoy, EnvoyConfig, EtcdCluster, TcpProxy, Traffic, TrafficConfig, Upstream,
    wait_until,
};
use common::*;

fn apply(etcd: &EtcdCluster, dir: &std::path::Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args([
            "apply",
            "-f",
            dir.to_str().unwrap(),
            "--etcd",
            &etcd.client_url(0),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "apply failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn start(xds: SocketAddr, admin: SocketAddr, etcd: &EtcdCluster) -> Ballast {
    Ballast::start(xds, admin, &["--etcd", &etcd.client_url(0)]).unwrap()
}

/// The store revision a replica's config reflects.
async fn revision(b: &Ballast) -> Option<i64> {
    let (_, body) = b.get("/debug/sources").await.ok()?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["sources"][0]["revision"].as_i64()
}

/// Per gateway, per xDS type: the type version a replica serves.
async fn versions(b: &Ballast, gateways: &[&str]) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for gw in gateways {
        let (code, body) = b
            .get(&format!("/debug/config_dump?gateway={gw}"))
            .await
            .ok()?;
        if code != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        for (ty, c) in v["config"].as_object()? {
            out.insert(format!("{gw} {ty}"), c["version"].as_str()?.to_owned());
        }
    }
    Some(out)
}

fn edge(name: &str, port: u16) -> String {
    gateway(port).replace("name: edge", &format!("name: {name}"))
}

fn route_on(parent: &str, name: &str, host: &str, backend: &str) -> String {
    route(name, host, backend).replace("name: edge", &format!("name: {parent}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_fail_over_with_zero_errors_and_equal_versions() {
    let etcd = EtcdCluster::start_single().await.unwrap();
    let a = Upstream::start("a").await.unwrap();
    let b = Upstream::start("b").await.unwrap();
    let (p1, p2) = (ballast_testkit::free_port(), ballast_testkit::free_port());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("base.yaml"),
        edge("edge", p1)
            + "---\n"
            + &edge("edge2", p2)
            + &route_on("edge", "web", "web.example.com", "web")
            + &route_on("edge2", "web2", "web.example.com", "web")
            + &backend("web", &[a.addr()]),
    )
    .unwrap();
    apply(&etcd, dir.path());

    let addrs: Vec<(SocketAddr, SocketAddr)> = (0..3).map(|_| (free_addr(), free_addr())).collect();
    let mut replicas: Vec<Ballast> = addrs.iter().map(|&(x, a)| start(x, a, &etcd)).collect();
    for r in &replicas {
        r.wait_ready().await.unwrap();
    }
    let proxy = TcpProxy::start(addrs.iter().map(|&(x, _)| x).collect())
        .await
        .unwrap();
    let envoys = [
        Envoy::start(&EnvoyConfig::new(
            proxy.addr(),
            "envoy-r1",
            "default/edge",
            AdsMode::Grpc,
        ))
        .await
        .unwrap(),
        Envoy::start(&EnvoyConfig::new(
            proxy.addr(),
            "envoy-r2",
            "default/edge2",
            AdsMode::DeltaGrpc,
        ))
        .await
        .unwrap(),
    ];
    let gws = [loopback(p1), loopback(p2)];
    for gw in gws {
        wait_until(T, POLL, || async {
            matches!(host_get(gw, "web.example.com").await, Ok((200, _)))
        })
        .await
        .unwrap();
    }
    let traffic: Vec<Traffic> = gws
        .iter()
        .map(|&gw| Traffic::start(TrafficConfig::new(gw, "web.example.com", "/").concurrency(2)))
        .collect();

    // 1. An edit through etcd: a second backend and route on both gateways.
    std::fs::write(
        dir.path().join("api.yaml"),
        route_on("edge", "api", "api.example.com", "api")
            + &route_on("edge2", "api2", "api.example.com", "api")
            + &backend("api", &[b.addr()]),
    )
    .unwrap();
    apply(&etcd, dir.path());
    for gw in gws {
        wait_until(T, POLL, || async {
            matches!(host_get(gw, "api.example.com").await, Ok((200, _)))
        })
        .await
        .unwrap();
    }

    // 2. SIGKILL a replica, cut every xDS connection (Envoys land on the others), restart it.
    replicas[0].kill();
    proxy.cut_all();
    tokio::time::sleep(Duration::from_millis(500)).await;
    replicas[0] = start(addrs[0].0, addrs[0].1, &etcd);
    replicas[0].wait_ready().await.unwrap();

    // 3. Another edit while connections keep being cut (round-robin over all three).
    std::fs::write(
        dir.path().join("base.yaml"),
        edge("edge", p1)
            + "---\n"
            + &edge("edge2", p2)
            + &route_on("edge", "web", "web.example.com", "web")
            + &route_on("edge2", "web2", "web.example.com", "web")
            + &backend("web", &[a.addr(), b.addr()]),
    )
    .unwrap();
    apply(&etcd, dir.path());
    for _ in 0..4 {
        proxy.cut_all();
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    // The endpoint change reached both Envoys (b now answers web.example.com too).
    for gw in gws {
        wait_until(T, POLL, || async {
            matches!(host_get(gw, "web.example.com").await, Ok((200, body)) if body.contains('b'))
        })
        .await
        .unwrap();
    }

    // 4. Every replica at the same revision serves identical versions (invariant 5).
    let gateways = ["default/edge", "default/edge2"];
    let (rev, want) = ballast_testkit::wait_for(T, POLL, || async {
        let revs: Vec<Option<i64>> = futures::future::join_all(replicas.iter().map(revision)).await;
        let vs: Vec<Option<BTreeMap<String, String>>> =
            futures::future::join_all(replicas.iter().map(|r| versions(r, &gateways))).await;
        anyhow::ensure!(
            revs.iter().all(|r| r.is_some() && *r == revs[0]),
            "revisions {revs:?}"
        );
        anyhow::ensure!(
            vs.iter().all(|v| v.is_some() && *v == vs[0]),
            "versions differ: {vs:#?}"
        );
        Ok((revs[0].unwrap(), vs[0].clone().unwrap()))
    })
    .await
    .unwrap();
    assert!(rev > 0);
    assert_eq!(want.len(), 12, "6 types (VHDS too) × 2 gateways: {want:?}");

    let mut total = 0;
    for t in traffic {
        let report = t.stop().await;
        report.assert_all_ok();
        total += report.total;
    }
    assert!(total > 100, "{total} requests");
    for envoy in &envoys {
        for stat in [
            "listener_manager.listener_removed",
            "cluster_manager.cluster_removed",
        ] {
            assert_eq!(envoy.stat(stat).await.unwrap(), Some(0), "{stat}");
        }
    }
    assert!(proxy.connections_accepted() >= 6, "the Envoys reconnected");
}

/// Whether `node` has a live stream on replica `b`.
async fn connected_here(b: &Ballast, node: &str) -> bool {
    let Ok((_, body)) = b.get("/debug/proxies").await else {
        return false;
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&body) else {
        return false;
    };
    v["proxies"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|p| p["node"].as_str() == Some(node) && p["connected"].as_bool() == Some(true))
}

/// `--max-connection-age`: after a scale-out (the load balancer now also sends to new replicas),
/// an Envoy connected to the old replica moves on its own, without a single failed request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connection_age_rebalances_after_a_scale_out() {
    let etcd = EtcdCluster::start_single().await.unwrap();
    let a = Upstream::start("a").await.unwrap();
    let p1 = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("base.yaml"),
        edge("edge", p1)
            + &route_on("edge", "web", "web.example.com", "web")
            + &backend("web", &[a.addr()]),
    )
    .unwrap();
    apply(&etcd, dir.path());
    let url = etcd.client_url(0);
    let args = ["--etcd", url.as_str(), "--max-connection-age", "2s"];
    let replicas: Vec<Ballast> = (0..3)
        .map(|_| Ballast::start(free_addr(), free_addr(), &args).unwrap())
        .collect();
    for r in &replicas {
        r.wait_ready().await.unwrap();
    }
    // Only replica 0 behind the balancer at first.
    let proxy = TcpProxy::start(vec![replicas[0].xds]).await.unwrap();
    let envoy = Envoy::start(&EnvoyConfig::new(
        proxy.addr(),
        "envoy-age",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(p1);
    wait_until(T, POLL, || async {
        matches!(host_get(gw, "web.example.com").await, Ok((200, _)))
    })
    .await
    .unwrap();
    let traffic = Traffic::start(TrafficConfig::new(gw, "web.example.com", "/").concurrency(2));
    assert!(connected_here(&replicas[0], "envoy-age").await);

    // Scale-out: the new replicas join the balancer; the Envoy's connection ages out and its
    // reconnect lands on one of them (round-robin).
    proxy.set_backends(replicas.iter().map(|r| r.xds).collect());
    wait_until(T, POLL, || async {
        connected_here(&replicas[1], "envoy-age").await
            || connected_here(&replicas[2], "envoy-age").await
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = traffic.stop().await;
    report.assert_all_ok();
    for stat in [
        "listener_manager.listener_removed",
        "cluster_manager.cluster_removed",
    ] {
        assert_eq!(envoy.stat(stat).await.unwrap(), Some(0), "{stat}");
    }
}
