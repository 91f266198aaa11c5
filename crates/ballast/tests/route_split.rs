//! Route edits that cost kilobytes (issue #13): a Delta ADS Envoy gets its
//! route configuration split into VHDS virtual hosts (one `VirtualHost`
//! resource per host, `<route configuration>/<host>`), so one route edit
//! among 1,000 hosts re-sends one virtual host, not the whole route
//! configuration. A SotW ADS Envoy of the same gateway keeps getting the
//! whole route configuration (VHDS is Delta only). Under traffic to several
//! hosts, one route moves to a new Backend (a cluster neither Envoy had:
//! make-before-break), and both Envoys answer it from the new upstream with
//! zero non-2xx; the bytes each Envoy received from the xDS cluster for the
//! edit (`cluster.xds_cluster.upstream_cx_rx_bytes_total`) are counted.

mod common;

use std::net::SocketAddr;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, Traffic, TrafficConfig, Upstream, wait_until};
use common::*;

const HOSTS: usize = 1_000;
/// The route edited (moved to backend `fresh`).
const EDITED: usize = 7;

/// `HOSTS` routes `r{i}` for `h{i}.example.com` to Backends `b{i}` on `u0`/`u1`;
/// with `moved`, route `r{EDITED}` goes to Backend `fresh` (on `u2`) instead.
fn config(port: u16, ups: &[SocketAddr], fresh: SocketAddr, moved: bool) -> String {
    let mut s = many_routes(port, HOSTS, ups);
    if moved {
        let old = route(
            &format!("r{EDITED}"),
            &format!("h{EDITED}.example.com"),
            &format!("b{EDITED}"),
        );
        let new = route(
            &format!("r{EDITED}"),
            &format!("h{EDITED}.example.com"),
            "fresh",
        );
        assert!(s.contains(&old));
        s = s.replace(&old, &new);
        s.push_str(&backend("fresh", &[fresh]));
    }
    s
}

async fn stat(envoy: &Envoy, name: &str) -> u64 {
    envoy.stat(name).await.unwrap().unwrap_or(0)
}

/// Bytes the Envoy has received from the control plane so far.
async fn xds_rx(envoy: &Envoy) -> u64 {
    stat(envoy, "cluster.xds_cluster.upstream_cx_rx_bytes_total").await
}

/// Waits until the xDS byte count has been still for a while (the edit and
/// the ACKs' answers are done), bounded.
async fn settled_rx(envoy: &Envoy) -> u64 {
    let mut last = xds_rx(envoy).await;
    let mut still = 0;
    for _ in 0..200 {
        tokio::time::sleep(POLL).await;
        let now = xds_rx(envoy).await;
        if now == last {
            still += 1;
            if still >= 20 {
                break;
            }
        } else {
            still = 0;
            last = now;
        }
    }
    last
}

/// The scenario; `vhds` false runs `ballast serve --no-vhds`. Returns the
/// bytes the (Delta, SotW) Envoys received from the xDS cluster for the edit.
async fn scenario(vhds: bool) -> (u64, u64) {
    let u0 = Upstream::start("u0").await.unwrap();
    let u1 = Upstream::start("u1").await.unwrap();
    let u2 = Upstream::start("u2").await.unwrap();
    let ups = [u0.addr(), u1.addr()];
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    write_atomic(&file, &config(port, &ups, u2.addr(), false));
    let mut args = vec!["--config", dir.path().to_str().unwrap()];
    if !vhds {
        args.push("--no-vhds");
    }
    let ballast = Ballast::start(free_addr(), free_addr(), &args).unwrap();
    ballast
        .wait_ready()
        .await
        .unwrap_or_else(|e| panic!("{e}: {}", ballast.log_tail()));

    let delta = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "delta-envoy",
        "default/edge",
        AdsMode::DeltaGrpc,
    ))
    .await
    .unwrap();
    let sotw = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "sotw-envoy",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    let sample = [0, 1, EDITED, 500, HOSTS - 1];
    for i in sample {
        let host = format!("h{i}.example.com");
        let r = wait_until(T, POLL, || async {
            matches!(host_status(gw, &host).await, Ok(200))
        })
        .await;
        if let Err(e) = r {
            let (_, proxies) = ballast.get("/debug/proxies").await.unwrap_or_default();
            panic!(
                "{host} never answered 200: {e}\ndelta envoy:\n{}\nsotw envoy:\n{}\nproxies: {proxies}\n{}",
                delta.log_tail(20),
                sotw.log_tail(20),
                ballast.log_tail()
            )
        }
    }
    // Both Envoys hold every host (the listener port is shared: check each
    // Envoy's own view).
    let rc = format!("default/edge/{port}");
    for (e, name) in [(&delta, "delta"), (&sotw, "sotw")] {
        let r = wait_until(T, POLL, || async {
            e.config_dump(false).await.is_ok_and(|d| {
                d.to_string()
                    .contains(&format!("h{}.example.com", HOSTS - 1))
            })
        })
        .await;
        if let Err(err) = r {
            let dump = e.config_dump(false).await.unwrap();
            let routes: Vec<_> = dump["configs"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|c| c["@type"].as_str().unwrap_or("").contains("Routes"))
                .collect();
            let (_, proxies) = ballast.get("/debug/proxies").await.unwrap_or_default();
            panic!(
                "{name} Envoy lacks hosts: {err}\nroutes: {routes:?}\nproxies: {proxies}\n{}",
                e.log_tail(30)
            );
        }
    }
    // The Delta Envoy's route configuration is the VHDS kind (unless
    // --no-vhds), the SotW one's never: its virtual hosts are named
    // `<route configuration>/<host>`.
    let delta_dump = delta.config_dump(false).await.unwrap().to_string();
    assert_eq!(delta_dump.contains("\"vhds\""), vhds, "delta Envoy");
    assert_eq!(
        delta_dump.contains(&format!("{rc}/h0.example.com")),
        vhds,
        "delta Envoy's virtual host names"
    );
    let sotw_dump = sotw.config_dump(false).await.unwrap().to_string();
    assert!(!sotw_dump.contains("\"vhds\""), "sotw Envoy got vhds");

    let requests: Vec<(String, String)> = sample
        .iter()
        .map(|i| (format!("h{i}.example.com"), "/".to_string()))
        .collect();
    let traffic = Traffic::start(TrafficConfig::with_requests(gw, requests));
    let before = (settled_rx(&delta).await, settled_rx(&sotw).await);

    // The edit: route r7 moves to a Backend (cluster) neither Envoy has.
    write_atomic(&file, &config(port, &ups, u2.addr(), true));
    let edited = format!("h{EDITED}.example.com");
    for (e, name) in [(&delta, "delta"), (&sotw, "sotw")] {
        wait_until(T, POLL, || async {
            e.config_dump(false)
                .await
                .is_ok_and(|d| d.to_string().contains("default/fresh"))
                && stat(e, "cluster_manager.warming_clusters").await == 0
        })
        .await
        .unwrap_or_else(|err| panic!("{name}: the new cluster never arrived: {err}"));
    }
    wait_until(T, POLL, || async {
        matches!(host_get(gw, &edited).await, Ok((200, ref body)) if body.contains("u2"))
    })
    .await
    .unwrap_or_else(|e| panic!("the edit never took effect: {e}"));
    // Each Envoy routes the edited host to the new upstream (its own view:
    // its route to the new cluster).
    for (e, name) in [(&delta, "delta"), (&sotw, "sotw")] {
        wait_until(T, POLL, || async {
            stat(e, "cluster.default/fresh.upstream_rq_completed").await > 0
                || e.config_dump(false).await.is_ok_and(|d| {
                    let s = d.to_string();
                    s.matches("\"cluster\":\"default/fresh\"").count() > 0
                })
        })
        .await
        .unwrap_or_else(|err| panic!("{name}: no route to the new cluster: {err}"));
    }
    let after = (settled_rx(&delta).await, settled_rx(&sotw).await);
    let report = traffic.stop().await;
    report.assert_all_ok();
    assert!(report.ok_2xx > 0, "{report:?}");
    // Others unaffected: still their old upstreams.
    for i in [0usize, 1, 500, HOSTS - 1] {
        let (code, body) = host_get(gw, &format!("h{i}.example.com")).await.unwrap();
        assert_eq!(code, 200);
        let want = if i % 2 == 0 { "u0" } else { "u1" };
        assert!(body.contains(want), "h{i}: {body}");
    }
    for (e, name) in [(&delta, "delta"), (&sotw, "sotw")] {
        assert_eq!(
            stat(e, "cluster_manager.cds.update_rejected").await,
            0,
            "{name}"
        );
        assert_eq!(
            stat(e, "listener_manager.listener_removed").await,
            0,
            "{name}"
        );
    }
    let delta_bytes = after.0 - before.0;
    let sotw_bytes = after.1 - before.1;
    eprintln!(
        "bytes received for one route edit among {HOSTS} hosts (vhds {vhds}): delta {delta_bytes}, sotw {sotw_bytes}"
    );
    // The whole route configuration (~87 bytes per host) for SotW.
    assert!(
        sotw_bytes > 50 * 1024,
        "sotw Envoy received {sotw_bytes} bytes for one edit"
    );
    (delta_bytes, sotw_bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_route_edit_among_1000_hosts_sends_one_virtual_host_over_delta() {
    let (delta, _) = scenario(true).await;
    // One virtual host, one cluster, one load assignment, their framing.
    assert!(
        delta < 8 * 1024,
        "delta Envoy received {delta} bytes for one edit"
    );
}

/// `--no-vhds` (and what Delta Envoys got before VHDS): the whole route
/// configuration again, so the test above fails without the split.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_vhds_a_delta_envoy_gets_the_whole_route_configuration() {
    let (delta, _) = scenario(false).await;
    assert!(
        delta > 50 * 1024,
        "delta Envoy received {delta} bytes for one edit"
    );
}
