//! Ballast over etcd with real Envoy and real traffic (issue #12): the etcd leader killed
//! during endpoint churn, etcd stopped for 30 s under traffic, compaction while a replica is
//! cut off from etcd, and the guard's baseline kept in etcd across a restart.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use ballast_etcd::{Client, ClientOptions, Error as EtcdError, KeyRange};
use ballast_testkit::{
    AdsMode, Envoy, EnvoyConfig, EtcdCluster, TcpProxy, Traffic, TrafficConfig, Upstream,
    wait_until,
};
use common::*;
use serde_json::Value;

fn key(kind: &str, name: &str) -> String {
    format!("/ballast/{kind}/default/{name}")
}

fn client(urls: &[String]) -> Client {
    Client::new(urls, ClientOptions::default()).unwrap()
}

/// Puts, retrying while the cluster has no leader (a test writer behaves like `ballast apply`
/// would: a failed write is retried, and a put is idempotent). Returns the revision.
async fn put(c: &Client, k: &str, v: &str) -> i64 {
    let mut last = None;
    for _ in 0..300 {
        match c.put(k, v).await {
            Ok(rev) => return rev,
            Err(e) if e.is_unavailable() => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("put {k}: {e}"),
        }
    }
    panic!("put {k}: still failing: {last:?}");
}

/// Gateway `edge` on `port`, route `web.example.com` → Backend `web` at `eps`.
async fn seed(c: &Client, port: u16, eps: &[SocketAddr]) -> i64 {
    put(c, &key("gateways", "edge"), &gateway(port)).await;
    put(
        c,
        &key("httproutes", "web"),
        &route("web", "web.example.com", "web"),
    )
    .await;
    put(c, &key("backends", "web"), &backend("web", eps)).await
}

fn addrs(eps: &[SocketAddr]) -> BTreeSet<String> {
    eps.iter().map(|a| a.to_string()).collect()
}

/// The endpoints Envoy holds for the Backend `web`'s cluster (EDS).
async fn envoy_eds(envoy: &Envoy) -> Option<BTreeSet<String>> {
    let s = envoy.config_summary(true).await.ok()?;
    s.endpoints
        .iter()
        .find(|(c, _)| c.contains("web"))
        .map(|(_, e)| e.clone())
}

async fn wait_eds(envoy: &Envoy, want: &BTreeSet<String>, what: &str) {
    let r = wait_until(T, POLL, || async {
        envoy_eds(envoy).await.as_ref() == Some(want)
    })
    .await;
    if r.is_err() {
        panic!(
            "Envoy never got {what}: want {want:?}, has {:?}",
            envoy_eds(envoy).await
        );
    }
}

async fn sources(b: &Ballast) -> Value {
    let (code, body) = b.get("/debug/sources").await.unwrap();
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["sources"][0].clone()
}

/// Waits until the gateway listener answers 200 for web.example.com (LDS comes after EDS).
async fn wait_serving(port: u16) {
    wait_until(T, POLL, || async {
        matches!(
            host_status(loopback(port), "web.example.com").await,
            Ok(200)
        )
    })
    .await
    .unwrap();
}

fn etcd_args(urls: &[String]) -> Vec<String> {
    urls.iter()
        .flat_map(|u| ["--etcd".to_string(), u.clone()])
        .collect()
}

fn start(xds: SocketAddr, admin: SocketAddr, args: &[String]) -> Ballast {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Ballast::start(xds, admin, &args).unwrap()
}

async fn upstreams(n: usize) -> (Vec<Upstream>, Vec<SocketAddr>) {
    let mut ups = Vec::new();
    for i in 0..n {
        ups.push(Upstream::start(&format!("u{i}")).await.unwrap());
    }
    let addrs = ups.iter().map(|u| u.addr()).collect();
    (ups, addrs)
}

async fn assert_nothing_removed(envoy: &Envoy) {
    for stat in [
        "listener_manager.listener_removed",
        "cluster_manager.cluster_removed",
    ] {
        assert_eq!(envoy.stat(stat).await.unwrap(), Some(0), "{stat}");
    }
}

/// (a) A 3-member cluster; Backend endpoints rewritten 30 times while traffic flows; the
/// leader is SIGKILLed twice during the churn (restarted in between, so quorum holds). Every
/// single change reaches Envoy (each write's endpoint set is observed in Envoy's EDS before the
/// next), the final EDS equals the store, Ballast applied each change exactly once (one
/// generation per write), and no request failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_during_endpoint_churn_loses_nothing() {
    let mut etcd = EtcdCluster::start(3).await.unwrap();
    let urls = etcd.client_urls();
    let c = client(&urls);
    let (_ups, eps) = upstreams(4).await;
    let port = ballast_testkit::free_port();
    seed(&c, port, &eps[..2]).await;
    // The leader's URL first: Ballast's client starts there, so the first kill is guaranteed
    // to take down the member its watch is on (it must fail over and resume).
    let mut ordered = urls.clone();
    ordered.rotate_left(etcd.leader().await.unwrap());
    let (xds, admin) = (free_addr(), free_addr());
    let ballast = start(xds, admin, &etcd_args(&ordered));
    ballast.wait_ready().await.unwrap();
    let envoy = Envoy::start(&EnvoyConfig::new(
        xds,
        "envoy-churn",
        "default/edge",
        AdsMode::DeltaGrpc,
    ))
    .await
    .unwrap();
    wait_eds(&envoy, &addrs(&eps[..2]), "the initial endpoints").await;
    let gen0 = sources(&ballast).await["generation"].as_u64().unwrap();
    wait_serving(port).await;
    let traffic = Traffic::start(TrafficConfig::new(loopback(port), "web.example.com", "/"));
    wait_until(T, POLL, || async { traffic.report().total > 20 })
        .await
        .unwrap();

    const WRITES: usize = 30;
    let mut last_rev = 0;
    let mut first_victim = None;
    for i in 0..WRITES {
        if i == 10 {
            let leader = etcd.leader().await.unwrap();
            etcd.kill(leader);
            first_victim = Some(leader);
        }
        if i == 20 {
            // Quorum is 2 of 3: bring the first victim back, then kill the new leader.
            etcd.restart(first_victim.unwrap()).await.unwrap();
            let leader = etcd.leader().await.unwrap();
            etcd.kill(leader);
        }
        // A rotating, never-empty subset of live upstreams: every request can succeed.
        let n = 1 + i % 3;
        let set: Vec<SocketAddr> = (0..n).map(|j| eps[(i + j) % eps.len()]).collect();
        last_rev = put(&c, &key("backends", "web"), &backend("web", &set)).await;
        wait_eds(&envoy, &addrs(&set), &format!("write {i}")).await;
    }
    let report = traffic.stop().await;
    report.assert_all_ok();
    // The first kill took down the member Ballast's watch was on: it noticed and resumed.
    let log = std::fs::read_to_string(&ballast.log).unwrap();
    assert!(log.contains("etcd unreachable"), "{}", ballast.log_tail());

    // Final Envoy EDS equals the final store; Ballast is at the store's revision.
    let stored = c.get(key("backends", "web")).await.unwrap().unwrap();
    assert_eq!(stored.mod_revision, last_rev);
    let s = sources(&ballast).await;
    // (At or past: the guard's state under <prefix>_state/ may move the store revision.)
    assert!(s["revision"].as_i64() >= Some(last_rev), "{s}");
    assert_eq!(s["stale"], false, "{s}");
    // Each write was one new config; a resumed watch delivered nothing twice and lost nothing.
    // (Consecutive writes always differ: the subset rotates.) The merged catalog source's own
    // reconnects and relists publish no generation of their own (#12).
    assert_eq!(s["generation"].as_u64(), Some(gen0 + WRITES as u64), "{s}");
    assert_nothing_removed(&envoy).await;
}

/// (b) A single etcd stopped for 30 s under traffic: zero non-2xx, Envoy's config unchanged
/// the whole time, Ballast stays ready and reports the source stale; after etcd comes back,
/// a change written then is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_down_for_30s_under_traffic_changes_nothing() {
    let mut etcd = EtcdCluster::start_single().await.unwrap();
    let urls = etcd.client_urls();
    let c = client(&urls);
    let (_ups, eps) = upstreams(2).await;
    let port = ballast_testkit::free_port();
    seed(&c, port, &eps[..1]).await;
    let (xds, admin) = (free_addr(), free_addr());
    let ballast = start(xds, admin, &etcd_args(&urls));
    ballast.wait_ready().await.unwrap();
    let envoy = Envoy::start(&EnvoyConfig::new(
        xds,
        "envoy-outage",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    wait_eds(&envoy, &addrs(&eps[..1]), "the initial endpoints").await;
    // The baseline once Envoy serves (CDS/EDS arrive before LDS/RDS: make before break).
    wait_serving(port).await;
    let before = envoy.config_summary(true).await.unwrap();
    let traffic = Traffic::start(TrafficConfig::new(loopback(port), "web.example.com", "/"));

    etcd.stop(0);
    wait_until(T, POLL, || async {
        ballast.metric("ballast_source_stale").await.unwrap_or(0.0) == 1.0
    })
    .await
    .unwrap();
    let s = sources(&ballast).await;
    assert_eq!(s["stale"], true, "{s}");
    assert!(s["store_error"].is_string(), "{s}");
    // 30 s without etcd, checked every second: still ready, Envoy's config untouched.
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            ballast.get("/readyz").await.unwrap().0,
            200,
            "stays ready while stale"
        );
        assert_eq!(envoy.config_summary(true).await.unwrap(), before);
    }
    etcd.restart(0).await.unwrap();
    let rev = put(&c, &key("backends", "web"), &backend("web", &eps)).await;
    wait_eds(&envoy, &addrs(&eps), "the change written after the outage").await;
    let report = traffic.stop().await;
    report.assert_all_ok();
    assert!(report.total > 100, "{report}");
    let s = sources(&ballast).await;
    assert_eq!(s["stale"].as_bool(), Some(false), "{s}");
    assert!(s["revision"].as_i64() >= Some(rev), "{s}");
    assert_eq!(ballast.metric("ballast_source_stale").await.unwrap(), 0.0);
    assert_nothing_removed(&envoy).await;
}

/// (c) Two replicas; one reaches etcd through a relay that is cut. Meanwhile a route and its
/// backend are deleted, another backend's endpoints change, a new route is added, and the
/// history is compacted past all of it. After the relay is restored the cut-off replica relists
/// (its watch cannot resume) and serves exactly the store: its Envoy matches the other
/// replica's Envoy, the kept route never stopped answering, and no listener or kept cluster
/// was removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_while_disconnected_relists_to_exactly_the_store() {
    let etcd = EtcdCluster::start_single().await.unwrap();
    let urls = etcd.client_urls();
    let c = client(&urls);
    let (_ups, eps) = upstreams(3).await;
    let port_a = ballast_testkit::free_port();
    // Replica A (behind a relay cut later, with an Envoy and traffic) and, later, replica B
    // (connected directly; the reference for "exactly the store") read the same objects.
    put(&c, &key("gateways", "edge"), &gateway(port_a)).await;
    put(
        &c,
        &key("httproutes", "web"),
        &route("web", "web.example.com", "web"),
    )
    .await;
    put(&c, &key("backends", "web"), &backend("web", &eps[..1])).await;
    put(
        &c,
        &key("httproutes", "old"),
        &route("old", "old.example.com", "old"),
    )
    .await;
    put(&c, &key("backends", "old"), &backend("old", &eps[1..2])).await;

    let link = TcpProxy::start(vec![etcd.client_addr(0)]).await.unwrap();
    let (xds_a, admin_a) = (free_addr(), free_addr());
    let a = start(
        xds_a,
        admin_a,
        &etcd_args(&[format!("http://{}", link.addr())]),
    );
    a.wait_ready().await.unwrap();
    let envoy = Envoy::start(&EnvoyConfig::new(
        xds_a,
        "envoy-compact",
        "default/edge",
        AdsMode::DeltaGrpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port_a);
    wait_until(T, POLL, || async {
        matches!(host_status(gw, "old.example.com").await, Ok(200))
            && matches!(host_status(gw, "web.example.com").await, Ok(200))
    })
    .await
    .unwrap();
    let traffic = Traffic::start(TrafficConfig::new(gw, "web.example.com", "/"));

    link.set_backends(Vec::new());
    link.cut_all();
    wait_until(T, POLL, || async { sources(&a).await["stale"] == true })
        .await
        .unwrap();
    let stale_rev = sources(&a).await["revision"].as_i64().unwrap();

    // Meanwhile, in the store:
    c.delete(KeyRange::key(key("httproutes", "old")))
        .await
        .unwrap();
    c.delete(KeyRange::key(key("backends", "old")))
        .await
        .unwrap();
    put(&c, &key("backends", "web"), &backend("web", &eps[..2])).await;
    put(
        &c,
        &key("httproutes", "new"),
        &route("new", "new.example.com", "new"),
    )
    .await;
    let rev = put(&c, &key("backends", "new"), &backend("new", &eps[2..3])).await;
    c.compact(rev, true).await.unwrap();
    // The revision A last saw is gone: a watch from it must fail with ErrCompacted.
    let w = c
        .watch(
            KeyRange::prefix("/ballast/"),
            ballast_etcd::WatchOptions {
                start_revision: stale_rev + 1,
                ..Default::default()
            },
        )
        .await;
    let compacted = match w {
        Err(e) => e,
        Ok(mut w) => {
            use futures::StreamExt;
            tokio::time::timeout(T, w.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap_err()
        }
    };
    assert!(
        matches!(compacted, EtcdError::Compacted { .. }),
        "{compacted}"
    );

    // Replica B, started now, is the reference for "exactly the store".
    let (xds_b, admin_b) = (free_addr(), free_addr());
    let b = start(xds_b, admin_b, &etcd_args(&urls));
    b.wait_ready().await.unwrap();

    link.set_backends(vec![etcd.client_addr(0)]);
    let r = wait_until(T, POLL, || async {
        let s = sources(&a).await;
        // At or past `rev`: replicas write the guard's state under <prefix>_state/, which
        // moves the store revision without touching the config.
        s["revision"].as_i64() >= Some(rev) && s["stale"] == false
    })
    .await;
    if r.is_err() {
        panic!("replica A never caught up to {rev}: {}", sources(&a).await);
    }
    let r = wait_until(T, POLL, || async {
        matches!(host_status(gw, "new.example.com").await, Ok(200))
            && matches!(host_status(gw, "old.example.com").await, Ok(404))
    })
    .await;
    if r.is_err() {
        panic!(
            "new: {:?}, old: {:?}, pipeline: {:?}, envoy: {:#?}",
            host_status(gw, "new.example.com").await,
            host_status(gw, "old.example.com").await,
            a.get("/debug/pipeline").await,
            envoy.config_summary(true).await
        );
    }
    // A serves what B serves (same store, deterministic translation: equal type versions).
    assert_eq!(
        type_versions(&a).await,
        type_versions(&b).await,
        "the reconnected replica serves exactly what a fresh one does"
    );
    wait_eds(
        &envoy,
        &addrs(&eps[..2]),
        "web's endpoints changed while cut off",
    )
    .await;
    let report = traffic.stop().await;
    report.assert_all_ok();
    assert_eq!(
        envoy
            .stat("listener_manager.listener_removed")
            .await
            .unwrap(),
        Some(0)
    );
    // Only the deleted backend's cluster went away.
    assert_eq!(
        envoy.stat("cluster_manager.cluster_removed").await.unwrap(),
        Some(1)
    );
}

/// The guard's restart baseline lives in etcd: a replica started later with an empty
/// `--state-dir` (another host) still holds a publish that would remove 8 of 10 routes the
/// fleet served before; with the etcd key deleted, the same restart is not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_baseline_in_etcd_survives_a_move_to_another_host() {
    let etcd = EtcdCluster::start_single().await.unwrap();
    let urls = etcd.client_urls();
    let c = client(&urls);
    let port = ballast_testkit::free_port();
    let dummy: SocketAddr = "127.0.0.1:9".parse().unwrap();
    put(&c, &key("gateways", "edge"), &gateway(port)).await;
    for i in 0..10 {
        put(
            &c,
            &key("httproutes", &format!("r{i}")),
            &route(
                &format!("r{i}"),
                &format!("h{i}.example.com"),
                &format!("b{i}"),
            ),
        )
        .await;
        put(
            &c,
            &key("backends", &format!("b{i}")),
            &backend(&format!("b{i}"), &[dummy]),
        )
        .await;
    }
    let mut args = etcd_args(&urls);
    args.extend(["--guard-settle".to_string(), "5m".to_string()]);
    let (xds, admin) = (free_addr(), free_addr());
    let mut first = start(xds, admin, &args);
    first.wait_ready().await.unwrap();
    // The baseline reaches etcd (names only; written at most once a second).
    let state_key = "/ballast/_state/guard";
    wait_until(T, POLL, || async {
        c.get(state_key).await.ok().flatten().is_some_and(|kv| {
            let v: Value = serde_json::from_slice(&kv.value).unwrap_or(Value::Null);
            v["gateways"]["default/edge"]["routes"]
                .as_array()
                .map(Vec::len)
                == Some(10)
        })
    })
    .await
    .unwrap();
    first.kill();
    for i in 2..10 {
        c.delete(KeyRange::key(key("httproutes", &format!("r{i}"))))
            .await
            .unwrap();
    }

    // Another host: its own empty --state-dir (the test helper gives each process one).
    let (xds, admin) = (free_addr(), free_addr());
    let second = start(xds, admin, &args);
    second.wait_ready().await.unwrap();
    let (_, body) = second.get("/debug/pipeline").await.unwrap();
    let p: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        p["guard"]["state_file"], "etcd:/ballast/_state/guard",
        "{p}"
    );
    wait_until(T, POLL, || async {
        let (_, body) = second.get("/debug/pipeline").await.unwrap();
        let p: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        p["gateways"]["default/edge"]["held"]["origin"] == "restart"
            && p["gateways"]["default/edge"]["held"]["reason"]
                .as_str()
                .unwrap_or("")
                .contains("would remove 8 of 10 routes")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", second.log_tail()));
    assert_eq!(
        second
            .metric("ballast_guard_restart_holds_total")
            .await
            .unwrap(),
        1.0
    );
    drop(second);

    // Control: without the key there is no baseline, so nothing is held.
    c.delete(KeyRange::key(state_key)).await.unwrap();
    let (xds, admin) = (free_addr(), free_addr());
    let third = start(xds, admin, &args);
    third.wait_ready().await.unwrap();
    let (_, body) = third.get("/debug/pipeline").await.unwrap();
    let p: Value = serde_json::from_str(&body).unwrap();
    assert!(p["gateways"]["default/edge"]["held"].is_null(), "{p}");
    assert_eq!(
        third
            .metric("ballast_guard_restart_holds_total")
            .await
            .unwrap(),
        0.0
    );
}

/// Type versions of gateway `edge`'s snapshot (content hashes: equal means equal content).
async fn type_versions(b: &Ballast) -> Vec<(String, Value)> {
    let (code, body) = b.get("/debug/config_dump?gateway=edge").await.unwrap();
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["config"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(t, c)| (t.clone(), c["version"].clone()))
        .collect()
}

/// `--config` and `--etcd` together: not ready while etcd is down at start (and `/readyz`
/// says why), then serving the union; an object defined in both is an error naming both
/// places while the last good union stays served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_plus_etcd_serve_the_union_and_duplicates_are_errors() {
    let mut etcd = EtcdCluster::start_single().await.unwrap();
    let urls = etcd.client_urls();
    let c = client(&urls);
    let port = ballast_testkit::free_port();
    let dummy: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("gw.yaml"),
        format!(
            "{}{}",
            gateway(port),
            route("web", "web.example.com", "web")
        ),
    )
    .unwrap();
    put(&c, &key("backends", "web"), &backend("web", &[dummy])).await;
    etcd.stop(0);

    let mut args = etcd_args(&urls);
    args.extend(["--config".to_string(), dir.path().display().to_string()]);
    let (xds, admin) = (free_addr(), free_addr());
    let b = start(xds, admin, &args);
    let r = wait_until(T, POLL, || async {
        matches!(b.get("/readyz").await, Ok((503, body)) if body.contains("etcd unavailable"))
    })
    .await;
    if let Err(e) = r {
        panic!("{e}: {:?}", b.get("/readyz").await);
    }

    etcd.restart(0).await.unwrap();
    b.wait_ready().await.unwrap();
    let s = sources(&b).await;
    assert!(s["name"].as_str().unwrap().contains(" + etcd:"), "{s}");
    assert_eq!(s["files"], 2, "one file and one key: {s}");
    let generation = s["generation"].clone();

    // The route also written to etcd: a duplicate of the file's, reported with both places.
    put(
        &c,
        &key("httproutes", "web"),
        &route("web", "web.example.com", "web"),
    )
    .await;
    let r = wait_until(T, POLL, || async {
        sources(&b).await["errors"].as_array().is_some_and(|e| {
            e.iter().any(|e| {
                let e = e.as_str().unwrap_or("");
                e.contains("duplicate")
                    && e.contains("etcd:/ballast/httproutes/default/web")
                    && e.contains("gw.yaml")
            })
        })
    })
    .await;
    if let Err(e) = r {
        panic!("{e}: {}", sources(&b).await);
    }
    let s = sources(&b).await;
    // The last good union stays served: no new generation (the catalog merged in publishes
    // none of its own either, #12), still ready.
    assert_eq!(s["generation"], generation, "last good union kept: {s}");
    assert_eq!(s["synced"], true, "{s}");
    assert_eq!(b.get("/readyz").await.unwrap().0, 200);
}

/// Issue #12: etcd restored from an older backup comes back at a lower revision than the
/// replica applied. The replica notices (log, `ballast_source_revision_regressions_total`,
/// `/debug/sources`), reconciles to the restored store by keep-set, and the blast-radius
/// guard still judges the result: a restore that would remove 8 of 10 routes is held and
/// the served snapshot does not change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_restored_to_a_lower_revision_is_noticed_and_still_guarded() {
    let mut etcd = EtcdCluster::start_single().await.unwrap();
    let urls = etcd.client_urls();
    let c = client(&urls);
    let port = ballast_testkit::free_port();
    let dummy: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let add = |i: usize| {
        let c = c.clone();
        async move {
            put(
                &c,
                &key("backends", &format!("b{i}")),
                &backend(&format!("b{i}"), &[dummy]),
            )
            .await;
            put(
                &c,
                &key("httproutes", &format!("r{i}")),
                &route(
                    &format!("r{i}"),
                    &format!("h{i}.example.com"),
                    &format!("b{i}"),
                ),
            )
            .await
        }
    };
    put(&c, &key("gateways", "edge"), &gateway(port)).await;
    for i in 0..2 {
        add(i).await;
    }
    // A cold backup with 2 routes.
    etcd.stop(0);
    let backup = etcd.backup_data(0, "backup.etcd").unwrap();
    etcd.restart(0).await.unwrap();
    let restored = etcd.revision(0).await.unwrap();

    let mut args = etcd_args(&urls);
    args.extend(["--guard-settle".to_string(), "5m".to_string()]);
    let b = start(free_addr(), free_addr(), &args);
    b.wait_ready().await.unwrap();
    let mut last = 0;
    for i in 2..10 {
        last = add(i).await;
    }
    wait_until(T, POLL, || async {
        sources(&b).await["revision"].as_i64() >= Some(last)
    })
    .await
    .unwrap();
    let served = type_versions(&b).await;

    // The store is restored from the backup on the same endpoint: 2 routes, lower revision.
    etcd.stop(0);
    etcd.restore_data(0, &backup).unwrap();
    etcd.restart(0).await.unwrap();
    assert!(etcd.revision(0).await.unwrap() < last);
    wait_until(T, POLL, || async {
        // (The leader's status write-back and election key add revisions of their own.)
        let s = sources(&b).await;
        s["revision_regressions"] == 1 && s["stale"] == false
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", b.log_tail()));
    let s = sources(&b).await;
    let (from, to) = (
        s["last_regression"]["from"].as_i64().unwrap(),
        s["last_regression"]["to"].as_i64().unwrap(),
    );
    assert!(from >= last && to >= restored && to < last, "{s}");
    assert_eq!(
        b.metric("ballast_source_revision_regressions_total")
            .await
            .unwrap(),
        1.0
    );
    // The guard holds the mass removal; what is served is unchanged.
    wait_until(T, POLL, || async {
        let (_, body) = b.get("/debug/pipeline").await.unwrap();
        let p: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        p["gateways"]["default/edge"]["held"]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("would remove 8 of 10 routes")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", b.log_tail()));
    assert!(b.metric("ballast_guard_holds_total").await.unwrap() >= 1.0);
    assert_eq!(type_versions(&b).await, served, "nothing removed");
    assert!(
        b.log_tail().contains("etcd store revision went back"),
        "{}",
        b.log_tail()
    );
}
