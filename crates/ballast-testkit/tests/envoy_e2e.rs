//! End-to-end checks of the testkit against a real Envoy 1.40: if these pass, a failing Ballast e2e test is
//! about Ballast, not about the harness.

use std::net::SocketAddr;
use std::time::Duration;

use ballast_testkit::{
    AdsMode, Envoy, EnvoyConfig, TcpProxy, Traffic, TrafficConfig, Upstream, free_port, pid_alive,
    static_http_bootstrap, wait_until,
};

/// Generous bound for anything Envoy does on loopback; only reached when something is broken.
const BOUND: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_envoy_routes_traffic_to_upstream() {
    let upstream = Upstream::start("up-a").await.unwrap();
    // Port 0: Envoy picks, the admin API tells.
    let envoy = Envoy::start_bootstrap(&static_http_bootstrap(0, upstream.addr()))
        .await
        .unwrap();
    envoy.wait_live(BOUND).await.unwrap();
    let listener = envoy.listener_addrs().await.unwrap()["ingress"];
    assert_ne!(listener.port(), 0);
    let report = Traffic::start(
        TrafficConfig::with_requests(
            listener,
            vec![
                ("a.example.com".into(), "/".into()),
                ("b.example.com".into(), "/x?y=1".into()),
            ],
        )
        .concurrency(2)
        .max_requests(200),
    )
    .wait()
    .await;
    report.assert_all_ok();
    assert_eq!(report.total, 200);
    assert_eq!(report.by_body.get("up-a"), Some(&200), "{report}");
    assert_eq!(upstream.hits(), 200);

    let stats = envoy.stats().await.unwrap();
    assert!(
        stats.get("listener_manager.listener_added").copied() >= Some(1),
        "listener_added missing: {} stats",
        stats.len()
    );
    // Admin counters are read live, but the upstream request counter is bumped when Envoy finishes the
    // upstream stream, which may trail the downstream response by a moment.
    envoy
        .wait_until_stats(BOUND, |s| {
            s.get("cluster.upstream.upstream_rq_2xx").copied() == Some(200)
        })
        .await
        .unwrap();
    assert_eq!(
        envoy.stat("http.ingress.downstream_rq_2xx").await.unwrap(),
        Some(200)
    );
    assert_eq!(envoy.stat("no.such.stat").await.unwrap(), None);

    let summary = envoy.config_summary(true).await.unwrap();
    assert!(summary.static_listeners.contains("ingress"), "{summary:?}");
    assert!(summary.static_clusters.contains("upstream"), "{summary:?}");
    assert_eq!(
        summary
            .static_endpoints
            .get("upstream")
            .map(|s| s.iter().cloned().collect::<Vec<_>>()),
        Some(vec![upstream.addr().to_string()]),
        "{summary:?}"
    );
}

#[tokio::test]
async fn drop_and_kill_leave_no_process() {
    let bootstrap = static_http_bootstrap(free_port(), "127.0.0.1:1".parse().unwrap());
    let envoy = Envoy::start_bootstrap(&bootstrap).await.unwrap();
    let pid = envoy.pid();
    assert!(pid_alive(pid));
    drop(envoy);
    assert!(!pid_alive(pid), "Envoy pid {pid} survived drop");

    let mut envoy = Envoy::start_bootstrap(&bootstrap).await.unwrap();
    let pid = envoy.pid();
    assert!(envoy.is_running());
    envoy.kill();
    assert!(!envoy.is_running());
    assert!(!pid_alive(pid), "Envoy pid {pid} survived kill");
    assert!(envoy.server_state().await.is_err(), "admin still answers");
}

#[tokio::test]
async fn bad_bootstrap_fails_with_log() {
    let err = match Envoy::start_bootstrap("static_resources: { clusters: [ { name: 1 } ] }").await
    {
        Ok(_) => panic!("Envoy accepted a bad bootstrap"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("exited during startup"), "{err}");
}

async fn ads_envoy_against_closed_port(mode: AdsMode) {
    let closed: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let cfg = EnvoyConfig::new(closed, "node-1", "default/edge", mode)
        .node_metadata(serde_json::json!({"ballast.gateway": "default/edge"}));
    let envoy = Envoy::start(&cfg).await.unwrap();

    // No control plane: with initial_fetch_timeout 0s Envoy waits for CDS forever, so it is up (admin
    // answers) but never LIVE.
    let state = envoy.server_state().await.unwrap();
    assert!(
        state == "PRE_INITIALIZING" || state == "INITIALIZING",
        "state {state}"
    );
    let summary = envoy.config_summary(false).await.unwrap();
    assert!(
        summary.static_clusters.contains("xds_cluster"),
        "{summary:?}"
    );
    assert!(summary.listeners.is_empty() && summary.clusters.is_empty());

    let dump = envoy.config_dump(false).await.unwrap();
    let bootstrap = &dump["configs"][0]["bootstrap"];
    let expected = match mode {
        AdsMode::Grpc => "GRPC",
        AdsMode::DeltaGrpc => "DELTA_GRPC",
    };
    assert_eq!(
        bootstrap["dynamic_resources"]["ads_config"]["api_type"], expected,
        "{bootstrap:#}"
    );
    assert_eq!(bootstrap["node"]["cluster"], "default/edge");

    // Envoy keeps trying to reach the control plane.
    envoy
        .wait_until_stats(BOUND, |s| {
            s.get("cluster.xds_cluster.upstream_cx_connect_fail")
                .copied()
                >= Some(1)
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn ads_bootstrap_sotw_is_valid() {
    ads_envoy_against_closed_port(AdsMode::Grpc).await;
}

#[tokio::test]
async fn ads_bootstrap_delta_is_valid() {
    ads_envoy_against_closed_port(AdsMode::DeltaGrpc).await;
}

/// Envoy's xDS connection through a [`TcpProxy`] to a "control plane" that accepts and says nothing:
/// cutting the connection makes Envoy reconnect (quickly, thanks to the bootstrap's retry backoff).
#[tokio::test]
async fn cut_xds_connection_makes_envoy_reconnect() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let proxy = TcpProxy::start(vec![silent_addr]).await.unwrap();
    let envoy = Envoy::start(&EnvoyConfig::new(
        proxy.addr(),
        "node-1",
        "edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();

    for round in 1..=3u64 {
        wait_until(BOUND, Duration::from_millis(20), || async {
            proxy.connections_accepted() >= round && proxy.live() >= 1
        })
        .await
        .unwrap_or_else(|e| panic!("round {round}: {e:#}\n{}", envoy.log_tail(30)));
        assert!(proxy.cut_all() >= 1);
    }
    holder.abort();
}
