//! Every transport Ballast serves gets config real Envoy accepts (issue 15):
//! an Envoy started from `ballast bootstrap --transport T` for each of ADS
//! SotW, ADS Delta, per-type gRPC SotW and Delta, and REST polling. Cold start
//! to 200s; then, under traffic, a route edit, an endpoint move and a cluster
//! removal all reach Envoy with zero non-2xx, and nothing else is removed.
//! Only the ADS bootstraps configure `ads_config`: per-type and REST Envoys
//! fetch EDS/RDS too over their own transport (what Ballast serves them names
//! it). Two Envoys per transport: their resource versions are equal after
//! every change (one snapshot per gateway and transport).

mod common;

use std::path::Path;
use std::process::Command;

use ballast_testkit::{Envoy, Traffic, TrafficConfig, Upstream, wait_until};
use common::*;

/// The bootstrap the CLI prints for `transport` (Envoy admin on any free
/// port), with mTLS to the xDS port when `tls` names a `ballast certs` dir.
fn bootstrap(xds: std::net::SocketAddr, transport: &str, node: &str, tls: Option<&Path>) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ballast"));
    cmd.args([
        "bootstrap",
        "--gateway",
        "default/edge",
        "--transport",
        transport,
    ])
    .args(["--xds-addr", &xds.to_string(), "--envoy-admin-port", "0"])
    .args(["--node-id", node]);
    if let Some(dir) = tls {
        cmd.arg("--tls-dir").arg(dir);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let y = String::from_utf8(out.stdout).unwrap();
    let ads = transport.contains("ads");
    assert_eq!(y.contains("ads_config"), ads, "{transport}: {y}");
    assert_eq!(
        y.contains("UpstreamTlsContext"),
        tls.is_some(),
        "{transport}: {y}"
    );
    y
}

/// `ballast certs` files: the CA, the server's certificate and client
/// certificates for gateways default/edge and default/edge2.
fn certs() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        vec!["certs", "init"],
        vec!["certs", "issue", "--gateway", "default/edge"],
        vec!["certs", "issue", "--gateway", "default/edge2"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ballast"))
            .args(args)
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    dir
}

/// Every dynamic cluster's, listener's and route configuration's version as
/// Envoy reports it (per-type version for SotW/REST, per resource for Delta).
async fn versions(envoy: &Envoy) -> std::collections::BTreeMap<String, String> {
    let dump = envoy.config_dump(false).await.unwrap();
    let mut out = std::collections::BTreeMap::new();
    for c in dump["configs"].as_array().unwrap() {
        let mut add = |kind: &str, list: &serde_json::Value, inner: Option<&str>| {
            for e in list.as_array().into_iter().flatten() {
                let e = inner.map_or(e, |k| &e[k]);
                let v = e["version_info"].as_str().unwrap_or("").to_string();
                let name = ["cluster", "listener", "route_config"]
                    .iter()
                    .find_map(|k| e[*k]["name"].as_str())
                    .unwrap_or("?");
                out.insert(format!("{kind} {name}"), v);
            }
        };
        add("cluster", &c["dynamic_active_clusters"], None);
        add("listener", &c["dynamic_listeners"], Some("active_state"));
        add("route", &c["dynamic_route_configs"], None);
    }
    out
}

/// The two Envoys of one transport converge on identical versions.
async fn same_versions(transport: &str, a: &Envoy, b: &Envoy) {
    let r = wait_until(T, POLL, || async {
        let (va, vb) = (versions(a).await, versions(b).await);
        !va.is_empty() && va == vb
    })
    .await;
    if let Err(e) = r {
        panic!(
            "{transport}: versions differ: {e}\n{:?}\n{:?}",
            versions(a).await,
            versions(b).await
        );
    }
}

/// Routes `a` (hosts in `a_hosts`) → backend `ba`, `b` → `bb`, and, when
/// `with_d`, `d` → `bd`.
fn config(
    port: u16,
    a_hosts: &str,
    ba: &[std::net::SocketAddr],
    bb: &[std::net::SocketAddr],
    with_d: bool,
) -> String {
    let mut s = gateway(port);
    s.push_str(&route("a", a_hosts, "ba"));
    s.push_str(&backend("ba", ba));
    s.push_str(&route("b", "b.example.com", "bb"));
    s.push_str(&backend("bb", bb));
    if with_d {
        s.push_str(&route("d", "d.example.com", "bd"));
        s.push_str(&backend("bd", bb));
    }
    s
}

/// Open xDS streams of `kind` (`ads`, `delta-ads`, `sotw`, `delta`) in ballast's /metrics.
async fn streams(ballast: &Ballast, kind: &str) -> f64 {
    let (_, body) = ballast.get("/metrics").await.unwrap();
    let key = format!("ballast_xds_streams{{kind=\"{kind}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&key)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Proof that Envoy really fetches CDS/LDS over `transport`, not ADS.
async fn check_transport(transport: &str, ballast: &Ballast, envoy: &Envoy) {
    let (kind, min) = match transport {
        "ads" => ("ads", 1.0),
        "delta-ads" => ("delta-ads", 1.0),
        // CDS and LDS streams of their own (EDS/RDS go over ADS).
        "grpc" => ("sotw", 2.0),
        "delta-grpc" => ("delta", 2.0),
        // Polls answered "nothing new": only REST gets HTTP 304.
        "rest" => {
            wait_until(T, POLL, || async {
                stat(envoy, "cluster.ballast_xds.upstream_rq_304").await > 0
            })
            .await
            .expect("REST polls answered 304");
            for kind in ["ads", "delta-ads", "sotw", "delta"] {
                assert_eq!(streams(ballast, kind).await, 0.0, "rest: a {kind} stream");
            }
            return;
        }
        t => panic!("unknown transport {t}"),
    };
    wait_until(T, POLL, || async { streams(ballast, kind).await >= min })
        .await
        .unwrap_or_else(|e| panic!("{transport}: no {min} {kind} streams: {e}"));
    if !transport.contains("ads") {
        // EDS and RDS too: no ADS stream at all.
        for ads in ["ads", "delta-ads"] {
            assert_eq!(streams(ballast, ads).await, 0.0, "{transport}: {ads}");
        }
    }
}

async fn stat(envoy: &Envoy, name: &str) -> u64 {
    envoy.stat(name).await.unwrap().unwrap_or(0)
}

/// The whole scenario for `transport`; with `tls`, `ballast serve` requires
/// client certificates on the xDS port and the Envoys connect over mTLS
/// (`bootstrap --tls-dir`).
async fn scenario(transport: &str, tls: bool) {
    let u0 = Upstream::start("u0").await.unwrap();
    let u1 = Upstream::start("u1").await.unwrap();
    let u2 = Upstream::start("u2").await.unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    let write = |p: &Path, a_hosts: &str, ba: &[_], with_d| {
        write_atomic(p, &config(port, a_hosts, ba, &[u1.addr()], with_d))
    };
    write(&file, "a.example.com", &[u0.addr()], true);
    let (xds, admin) = (free_addr(), free_addr());
    let certs = tls.then(certs);
    let certs = certs.as_ref().map(|c| c.path());
    let mut args = vec!["--config".to_string(), dir.path().display().to_string()];
    if let Some(c) = certs {
        for (flag, file) in [
            ("--xds-tls-cert", "server.pem"),
            ("--xds-tls-key", "server-key.pem"),
            ("--xds-client-ca", "ca.pem"),
        ] {
            args.push(flag.into());
            args.push(c.join(file).display().to_string());
        }
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ballast = Ballast::start(xds, admin, &args).unwrap();
    ballast.wait_ready().await.unwrap();

    // Cold start.
    let envoy = Envoy::start_bootstrap(&bootstrap(
        xds,
        transport,
        &format!("envoy-{transport}"),
        certs,
    ))
    .await
    .unwrap();
    // A second Envoy of the same gateway and transport (its listener shares
    // the port through SO_REUSEPORT).
    let twin = Envoy::start_bootstrap(&bootstrap(
        xds,
        transport,
        &format!("twin-{transport}"),
        certs,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    for host in ["a.example.com", "b.example.com", "d.example.com"] {
        wait_until(T, POLL, || async {
            matches!(host_status(gw, host).await, Ok(200))
        })
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{transport}: {host} never answered 200: {e}\n{}",
                envoy.log_tail(30)
            )
        });
    }
    check_transport(transport, &ballast, &envoy).await;
    if tls {
        // The xDS connection really is TLS (a plaintext one would not have
        // been accepted by the server either).
        for e in [&envoy, &twin] {
            assert!(
                stat(e, "cluster.ballast_xds.ssl.handshake").await > 0,
                "{transport}: no TLS handshake to ballast_xds"
            );
        }
    }
    same_versions(transport, &envoy, &twin).await;
    let removed_before = stat(&envoy, "cluster_manager.cluster_removed").await;
    let traffic = Traffic::start(TrafficConfig::with_requests(
        gw,
        vec![
            ("a.example.com".into(), "/".into()),
            ("b.example.com".into(), "/".into()),
        ],
    ));

    // Route edit: a new hostname on route `a`.
    write(&file, "a.example.com, c.example.com", &[u0.addr()], true);
    wait_until(T, POLL, || async {
        matches!(host_status(gw, "c.example.com").await, Ok(200))
    })
    .await
    .unwrap_or_else(|e| panic!("{transport}: route edit never arrived: {e}"));
    same_versions(transport, &envoy, &twin).await;

    // Endpoint move: `ba` from u0 to u2.
    write(&file, "a.example.com, c.example.com", &[u2.addr()], true);
    wait_until(T, POLL, || async {
        matches!(host_get(gw, "a.example.com").await, Ok((200, ref body)) if body.contains("u2"))
    })
    .await
    .unwrap_or_else(|e| panic!("{transport}: endpoint move never arrived: {e}"));
    same_versions(transport, &envoy, &twin).await;

    // Cluster removal: route `d` and its backend go.
    write(&file, "a.example.com, c.example.com", &[u2.addr()], false);
    wait_until(T, POLL, || async {
        stat(&envoy, "cluster_manager.cluster_removed").await > removed_before
    })
    .await
    .unwrap_or_else(|e| panic!("{transport}: cluster removal never arrived: {e}"));
    wait_until(T, POLL, || async {
        matches!(host_status(gw, "d.example.com").await, Ok(404))
    })
    .await
    .unwrap();

    same_versions(transport, &envoy, &twin).await;
    let report = traffic.stop().await;
    report.assert_all_ok();
    assert!(report.ok_2xx > 0, "{transport}: {report:?}");
    // Exactly the one cluster went; the listener was never removed.
    assert_eq!(
        stat(&envoy, "cluster_manager.cluster_removed").await,
        removed_before + 1,
        "{transport}"
    );
    assert_eq!(
        stat(&envoy, "listener_manager.listener_removed").await,
        0,
        "{transport}"
    );
    assert_eq!(
        stat(&envoy, "cluster_manager.cds.update_rejected").await,
        0,
        "{transport}"
    );
    assert_eq!(
        stat(&envoy, "listener_manager.lds.update_rejected").await,
        0,
        "{transport}"
    );
    for host in ["a.example.com", "b.example.com", "c.example.com"] {
        assert_eq!(
            host_status(gw, host).await.unwrap(),
            200,
            "{transport}: {host}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ads_sotw() {
    scenario("ads", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ads_delta() {
    scenario("delta-ads", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_type_grpc_sotw() {
    scenario("grpc", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_type_grpc_delta() {
    scenario("delta-grpc", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_polling() {
    scenario("rest", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_type_grpc_sotw_mtls() {
    scenario("grpc", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_type_grpc_delta_mtls() {
    scenario("delta-grpc", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_polling_mtls() {
    scenario("rest", true).await;
}

/// Identity is enforced whatever the transport: over per-type gRPC and REST
/// an Envoy presenting edge2's certificate while claiming gateway `edge` is
/// refused (listed in /debug/proxies, counted; REST polls get 403) and never
/// configured, while an Envoy with edge's own certificate on the same server
/// is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_wrong_gateway_refused_over_grpc_and_rest() {
    let u0 = Upstream::start("u0").await.unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    write_atomic(
        &dir.path().join("config.yaml"),
        &config(port, "a.example.com", &[u0.addr()], &[u0.addr()], false),
    );
    let certs = certs();
    let c = certs.path();
    let (xds, admin) = (free_addr(), free_addr());
    let file = |f: &str| c.join(f).display().to_string();
    let ballast = Ballast::start(
        xds,
        admin,
        &[
            "--config",
            dir.path().to_str().unwrap(),
            "--xds-tls-cert",
            &file("server.pem"),
            "--xds-tls-key",
            &file("server-key.pem"),
            "--xds-client-ca",
            &file("ca.pem"),
        ],
    )
    .unwrap();
    ballast.wait_ready().await.unwrap();
    let good = Envoy::start_bootstrap(&bootstrap(xds, "rest", "good", Some(c)))
        .await
        .unwrap();
    let mut impostors = Vec::new();
    for t in ["grpc", "rest"] {
        // edge2's certificate and key, gateway and node still claiming edge.
        let y = bootstrap(xds, t, &format!("impostor-{t}"), Some(c))
            .replace("gateway-default-edge", "gateway-default-edge2");
        assert!(y.contains("gateway-default-edge2-key.pem"), "{y}");
        impostors.push((t, Envoy::start_bootstrap(&y).await.unwrap()));
    }
    let gw = loopback(port);
    wait_until(T, POLL, || async {
        matches!(host_status(gw, "a.example.com").await, Ok(200))
    })
    .await
    .unwrap_or_else(|e| panic!("good Envoy never served: {e}\n{}", good.log_tail(30)));
    wait_until(T, POLL, || async {
        let Ok((_, body)) = ballast.get("/debug/proxies").await else {
            return false;
        };
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let rejected = v["rejected"].as_array().cloned().unwrap_or_default();
        ["impostor-grpc", "impostor-rest"].iter().all(|n| {
            rejected.iter().any(|r| {
                r["node"] == *n
                    && r["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("spiffe://ballast.local/ns/default/gw/edge2"))
            })
        })
    })
    .await
    .unwrap_or_else(|e| panic!("impostors not refused: {e}"));
    assert!(ballast.metric("ballast_xds_denied_total").await.unwrap() >= 2.0);
    let (rest_imp, grpc_imp) = (&impostors[1].1, &impostors[0].1);
    wait_until(T, POLL, || async {
        stat(rest_imp, "cluster.ballast_xds.upstream_rq_403").await > 0
    })
    .await
    .expect("REST impostor's polls answered 403");
    for (t, e) in [("grpc", grpc_imp), ("rest", rest_imp)] {
        assert!(
            stat(e, "cluster.ballast_xds.ssl.handshake").await > 0,
            "{t}: no TLS handshake"
        );
        let dump = e.config_dump(false).await.unwrap().to_string();
        assert!(
            !dump.contains("a.example.com") && !dump.contains(&port.to_string()),
            "{t} impostor configured: {dump}"
        );
    }
    // The refused Envoys never disturbed the good one.
    assert_eq!(host_status(gw, "a.example.com").await.unwrap(), 200);
}
