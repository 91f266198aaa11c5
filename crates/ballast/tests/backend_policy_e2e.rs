//! BackendPolicy (issue #11) against real Envoy and real traffic: outlier detection ejects a
//! failing endpoint (zero non-2xx afterwards), active health checks take a failing endpoint
//! out, a circuit breaker overflows (counted in Envoy's stats and matched 1:1 by 503s), and
//! consistent hashing on a header keeps each user on one endpoint.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, Traffic, TrafficConfig, Upstream, wait_for};
use common::*;

const HOST: &str = "svc.example.com";

fn policy(body: &str) -> String {
    format!(
        "---
apiVersion: ballast.dev/v1alpha1
kind: BackendPolicy
metadata: {{ name: svc-policy }}
spec:
  targetRefs: [{{ group: ballast.dev, kind: Backend, name: svc }}]
{body}"
    )
}

fn config(port: u16, endpoints: &[SocketAddr], policy_body: Option<&str>) -> String {
    gateway(port)
        + &route("svc", HOST, "svc")
        + &backend("svc", endpoints)
        + &policy_body.map(policy).unwrap_or_default()
}

struct Setup {
    _dir: tempfile::TempDir,
    _ballast: Ballast,
    envoy: Envoy,
    listen: SocketAddr,
    config_file: std::path::PathBuf,
}

async fn start(endpoints: &[SocketAddr], policy_body: Option<&str>) -> Setup {
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let config_file = dir.path().join("config.yaml");
    std::fs::write(&config_file, config(port, endpoints, policy_body)).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-policy",
        "default/edge",
        AdsMode::DeltaGrpc,
    ))
    .await
    .unwrap();
    let listen = loopback(port);
    wait_for(T, POLL, || async {
        match host_status(listen, HOST).await {
            Ok(s) if s != 404 && s != 0 => Ok(()),
            other => anyhow::bail!("not routed yet: {other:?}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
    Setup {
        _dir: dir,
        _ballast: ballast,
        envoy,
        listen,
        config_file,
    }
}

/// Waits until Envoy's stat `name` satisfies `ok`; returns its value.
async fn wait_stat(envoy: &Envoy, name: &str, ok: impl Fn(u64) -> bool) -> u64 {
    wait_for(T, POLL, || async {
        match envoy.stat(name).await? {
            Some(v) if ok(v) => Ok(v),
            other => anyhow::bail!("{name} = {other:?}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"))
}

fn traffic(listen: SocketAddr, n: u64) -> Traffic {
    Traffic::start(
        TrafficConfig::new(listen, HOST, "/")
            .concurrency(4)
            .max_requests(n)
            .max_duration(Duration::from_secs(60)),
    )
}

/// Outlier detection: a backend endpoint answering 503 is ejected after 3 consecutive
/// errors; from then on every request succeeds and none reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outlier_detection_ejects_failing_endpoint() {
    let good = Upstream::start("good").await.unwrap();
    let bad = Upstream::start("bad").await.unwrap();
    bad.set_status(503);
    let s = start(
        &[good.addr(), bad.addr()],
        Some(
            "  healthCheck:
    passive: { consecutive5XxErrors: 3, interval: 1s, baseEjectionTime: 300s, maxEjectionPercent: 50 }
",
        ),
    )
    .await;
    // Drive traffic until Envoy ejects the failing endpoint (bounded by T).
    wait_for(T, POLL, || async {
        let _ = host_status(s.listen, HOST).await;
        match s
            .envoy
            .stat("cluster.default/svc.outlier_detection.ejections_active")
            .await?
        {
            Some(1) => Ok(()),
            v => anyhow::bail!("ejections_active = {v:?}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", s.envoy.log_tail(30)));
    let bad_hits = bad.hits();
    let report = traffic(s.listen, 300).wait().await;
    report.assert_all_ok();
    assert_eq!(report.by_body.get("good"), Some(&300), "{report}");
    assert_eq!(
        bad.hits(),
        bad_hits,
        "no request reached the ejected endpoint"
    );
}

/// Active HTTP health checks on the policy's path take a failing endpoint out before any
/// client request reaches it: zero non-2xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_health_check_removes_failing_endpoint() {
    let good = Upstream::start("good").await.unwrap();
    let bad = Upstream::start("bad").await.unwrap();
    bad.set_status(500);
    let s = start(
        &[good.addr(), bad.addr()],
        Some(
            "  healthCheck:
    active:
      type: HTTP
      interval: 200ms
      unhealthyThreshold: 1
      http: { path: /healthz, hostname: health.internal, expectedStatuses: [200, 204] }
",
        ),
    )
    .await;
    wait_stat(&s.envoy, "cluster.default/svc.membership_healthy", |v| {
        v == 1
    })
    .await;
    assert!(
        s.envoy
            .stat("cluster.default/svc.health_check.failure")
            .await
            .unwrap()
            .unwrap_or(0)
            >= 1
    );
    let report = traffic(s.listen, 200).wait().await;
    report.assert_all_ok();
    assert_eq!(report.by_body.get("good"), Some(&200), "{report}");
}

/// One burst of `n` concurrent requests on fresh connections: (2xx, 503 marked
/// `x-envoy-overloaded`, other).
async fn burst(listen: SocketAddr, n: usize) -> (u64, u64, u64) {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        tasks.spawn(raw_get(listen, &[]));
    }
    let (mut ok, mut overloaded, mut other) = (0, 0, 0);
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            Ok((200, _, _)) => ok += 1,
            Ok((503, head, _)) if head.contains("x-envoy-overloaded: true") => overloaded += 1,
            _ => other += 1,
        }
    }
    (ok, overloaded, other)
}

/// A circuit breaker of one connection, one pending and one active request: a burst of 8
/// slow requests overflows, Envoy counts each overflow, and each one is a 503 the client
/// sees. Without the policy the same burst all succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn circuit_breaker_overflows_and_is_counted() {
    let slow = Upstream::start("slow").await.unwrap();
    let s = start(
        &[slow.addr()],
        Some("  circuitBreaker: { maxConnections: 1, maxPendingRequests: 1, maxParallelRequests: 1 }\n"),
    )
    .await;
    slow.set_delay(Duration::from_millis(400));
    let (ok, overloaded, other) = burst(s.listen, 8).await;
    assert_eq!(other, 0, "only 200s and overflow 503s");
    assert!(
        ok >= 1 && overloaded >= 1,
        "ok={ok} overloaded={overloaded}"
    );
    let pending = s
        .envoy
        .stat("cluster.default/svc.upstream_rq_pending_overflow")
        .await
        .unwrap()
        .unwrap_or(0);
    let active = s
        .envoy
        .stat("cluster.default/svc.upstream_rq_overflow")
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(pending + active, overloaded, "every overflow counted once");

    // Same burst without the policy: no overflow.
    let port = s.listen.port();
    write_atomic(&s.config_file, &config(port, &[slow.addr()], None));
    wait_for(T, POLL, || async {
        let dump = s.envoy.config_dump(false).await?.to_string();
        if dump.contains("circuit_breakers") {
            anyhow::bail!("circuit breaker still configured")
        }
        Ok(())
    })
    .await
    .unwrap();
    let (ok, overloaded, other) = burst(s.listen, 8).await;
    assert_eq!((ok, overloaded, other), (8, 0, 0));
}

/// GET / with extra headers on a fresh connection: (status, response head, body).
async fn raw_get(
    addr: SocketAddr,
    headers: &[(&str, &str)],
) -> anyhow::Result<(u16, String, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    s.write_all(
        format!("GET / HTTP/1.1\r\nHost: {HOST}\r\n{extra}Connection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await??;
    let text = String::from_utf8_lossy(&out).to_string();
    let code = text.get(9..12).unwrap_or("0").parse()?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Ok((code, head.to_ascii_lowercase(), body.to_string()))
}

/// Consistent hashing on `x-user`: every request of a user lands on the same endpoint, and
/// users spread over more than one endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_hash_on_header_is_sticky() {
    let ups = [
        Upstream::start("u0").await.unwrap(),
        Upstream::start("u1").await.unwrap(),
        Upstream::start("u2").await.unwrap(),
    ];
    let addrs: Vec<SocketAddr> = ups.iter().map(|u| u.addr()).collect();
    let s = start(
        &addrs,
        Some("  loadBalancer:\n    type: ConsistentHash\n    consistentHash: { type: Header, header: { name: X-User } }\n"),
    )
    .await;
    // The route must carry the hash policy before we measure (config is eventually applied).
    wait_for(T, POLL, || async {
        let dump = s.envoy.config_dump(false).await?.to_string();
        anyhow::ensure!(dump.contains("x-user"), "hash policy not yet in Envoy");
        Ok(())
    })
    .await
    .unwrap();
    let mut used = std::collections::BTreeSet::new();
    for user in 0..12 {
        let user = format!("user-{user}");
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..6 {
            let (code, _, body) = raw_get(s.listen, &[("x-user", &user)]).await.unwrap();
            assert_eq!(code, 200);
            seen.insert(body);
        }
        assert_eq!(seen.len(), 1, "{user} stuck to one endpoint: {seen:?}");
        used.extend(seen);
    }
    assert!(used.len() >= 2, "users spread over endpoints: {used:?}");
}
