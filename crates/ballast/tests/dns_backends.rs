//! DNS-named backends with real Envoy and traffic: a Backend whose endpoint is a hostname and
//! an ExternalName Service are DNS clusters Envoy resolves through the resolver `ballast serve
//! --dns-resolver` names (the testkit's DNS server on loopback). A changed answer moves traffic
//! without a single failed request, a name that does not resolve fails only its own route, and
//! health checks of a hostname endpoint send that hostname as Host.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use ballast_testkit::{DnsServer, Envoy, Traffic, TrafficConfig, Upstream, wait_until};
use common::*;

/// Two upstreams on the same port of two loopback IPs (a DNS answer carries no port, so moving
/// a name between them is the only difference).
async fn pair(a: (&str, [u8; 4]), b: (&str, [u8; 4])) -> (Upstream, Upstream) {
    for _ in 0..20 {
        let first = Upstream::start_on(a.0, SocketAddr::from((a.1, 0)))
            .await
            .unwrap();
        let port = first.addr().port();
        if let Ok(second) = Upstream::start_on(b.0, SocketAddr::from((b.1, port))).await {
            return (first, second);
        }
    }
    panic!("no port free on both {:?} and {:?}", a.1, b.1);
}

/// `ballast serve` of `config` resolving names with `dns`, once ready, and Envoy `node` for
/// `default/edge`.
async fn serve_with_resolver(config: &Path, dns: &DnsServer, node: &str) -> (Ballast, Envoy) {
    let resolver = dns.addr().to_string();
    let ballast = Ballast::start(
        free_addr(),
        free_addr(),
        &[
            "--config",
            config.to_str().unwrap(),
            "--dns-resolver",
            &resolver,
        ],
    )
    .unwrap();
    ballast.wait_ready().await.unwrap();
    let envoy = ads_envoy(&ballast, node, "default/edge").await;
    (ballast, envoy)
}

/// A Backend `name` whose one endpoint is the hostname `host` (resolved by DNS) on `port`,
/// with `extra` spec lines.
fn hostname_backend(name: &str, host: &str, port: u16, extra: &str) -> String {
    format!(
        "---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: {name} }}
spec:
  endpoints: [{{ address: {host}, port: {port} }}]
{extra}"
    )
}

fn ip(u: &Upstream) -> IpAddr {
    u.addr().ip()
}

fn config(gw_port: u16, api_port: u16, ext_port: u16, ip_backend: SocketAddr) -> String {
    let routes = [
        (
            "api",
            "api.example.com",
            "group: ballast.dev, kind: Backend, name: api",
        ),
        (
            "ext",
            "ext.example.com",
            &*format!("name: ext, port: {ext_port}"),
        ),
        (
            "missing",
            "missing.example.com",
            "group: ballast.dev, kind: Backend, name: missing",
        ),
        (
            "ip",
            "ip.example.com",
            "group: ballast.dev, kind: Backend, name: ip",
        ),
    ]
    .map(|(name, host, r)| {
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name} }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [{host}]
  rules:
  - backendRefs: [{{ {r} }}]
"
        )
    })
    .concat();
    gateway(gw_port)
        + &routes
        + &format!(
            "---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: api }}
spec:
  connectTimeout: 1s
  endpoints: [{{ address: api.test, port: {api_port} }}]
  dns: {{ refreshRate: 1s, lookupFamily: V4Only }}
---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: missing }}
spec:
  endpoints: [{{ address: missing.test, port: {api_port} }}]
  dns: {{ mode: Logical, refreshRate: 1s }}
---
apiVersion: v1
kind: Service
metadata: {{ name: ext }}
spec:
  type: ExternalName
  externalName: ext.test
  ports: [{{ port: {ext_port} }}]
"
        )
        + &backend("ip", &[ip_backend])
}

/// Waits until the running `traffic` to `host` reaches `moved_to` and no longer `moved_from`;
/// on failure says where requests went (Envoy's cluster and listener counters, a direct probe).
async fn wait_moved(
    moved_from: &Upstream,
    moved_to: &Upstream,
    envoy: &Envoy,
    (gw, host, traffic): (SocketAddr, &str, &Traffic),
) {
    let before = moved_to.hits();
    let reached = wait_until(T, POLL, || async { moved_to.hits() > before + 20 }).await;
    if let Err(e) = reached {
        let stats: Vec<String> = envoy
            .stats()
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, v)| {
                *v > 0
                    && (k.starts_with("cluster.default/")
                        || k.contains("downstream_rq")
                        || k.starts_with("cluster_manager.cds"))
            })
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let direct = host_get(gw, host).await;
        panic!(
            "{host}: traffic never reached the new address: {e}; {before} -> {} hits, old {}\n\
             stats: {stats:#?}\ndirect: {direct:?}\n{}",
            moved_to.hits(),
            moved_from.hits(),
            traffic.report(),
        );
    }
    wait_until(T, POLL, || async {
        let h = moved_from.hits();
        tokio::time::sleep(Duration::from_millis(300)).await;
        moved_from.hits() == h
    })
    .await
    .unwrap_or_else(|e| panic!("{host}: the old address kept getting traffic: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostname_backends_and_external_names_follow_dns() {
    let dns = DnsServer::start(1).await.unwrap();
    let (api_a, api_b) = pair(("api-a", [127, 0, 0, 2]), ("api-b", [127, 0, 0, 3])).await;
    let (ext_a, ext_b) = pair(("ext-a", [127, 0, 0, 4]), ("ext-b", [127, 0, 0, 5])).await;
    let plain = Upstream::start("plain").await.unwrap();
    dns.set("api.test", &[ip(&api_a)]);
    dns.set("ext.test", &[ip(&ext_a)]);

    let gw_port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("all.yaml"),
        config(
            gw_port,
            api_a.addr().port(),
            ext_a.addr().port(),
            plain.addr(),
        ),
    )
    .unwrap();
    let (ballast, envoy) = serve_with_resolver(dir.path(), &dns, "envoy-dns").await;
    let gw = loopback(gw_port);
    for (host, body) in [
        ("api.example.com", "api-a"),
        ("ext.example.com", "ext-a"),
        ("ip.example.com", "plain"),
    ] {
        wait_host_body(gw, host, body)
            .await
            .unwrap_or_else(|e| panic!("{e:#}; {}\n{}", ballast.log_tail(), envoy.log_tail(40)));
    }
    // Envoy resolved the names through our server, and holds DNS clusters (no EDS for them).
    assert!(dns.queries_for("api.test") > 0 && dns.queries_for("ext.test") > 0);
    let dump = envoy.config_dump(true).await.unwrap().to_string();
    assert!(dump.contains("envoy.cluster.dns"), "{dump}");

    // A name that does not resolve: its route alone answers 503.
    assert_eq!(host_status(gw, "missing.example.com").await.unwrap(), 503);
    assert!(dns.queries_for("missing.test") > 0);

    let traffic: Vec<Traffic> = ["api.example.com", "ext.example.com", "ip.example.com"]
        .into_iter()
        .map(|h| {
            Traffic::start(
                TrafficConfig::new(gw, h, "/")
                    .concurrency(2)
                    .pause(Duration::from_millis(5)),
            )
        })
        .collect();
    // Move api.test (refreshRate 1s) and ext.test (TTL 1s): traffic follows, nothing fails.
    dns.set("api.test", &[ip(&api_b)]);
    wait_moved(&api_a, &api_b, &envoy, (gw, "api.example.com", &traffic[0])).await;
    dns.set("ext.test", &[ip(&ext_b)]);
    wait_moved(&ext_a, &ext_b, &envoy, (gw, "ext.example.com", &traffic[1])).await;
    // The unresolvable route still fails alone while the others serve.
    assert_eq!(host_status(gw, "missing.example.com").await.unwrap(), 503);
    let plain_before = plain.hits();
    wait_until(T, POLL, || async { plain.hits() > plain_before + 20 })
        .await
        .unwrap();
    for t in traffic {
        let report = t.stop().await;
        report.assert_all_ok();
        assert!(report.total > 50, "{report:?}");
    }
    // And once the name resolves, that route serves too (a Logical DNS cluster: Envoy accepted
    // it and connects to the first address of the answer).
    dns.set("missing.test", &[ip(&api_b)]);
    wait_host_body(gw, "missing.example.com", "api-b")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_of_hostname_endpoints_send_the_hostname() {
    let dns = DnsServer::start(30).await.unwrap();
    let up = Upstream::start("hc").await.unwrap();
    // A strict server (a Host that is not a valid hostname gets 400, the check fails); the
    // check must name the endpoint's own hostname, as a name-based virtual host expects, not
    // the Backend's name (`hc`) or Envoy's default (the cluster name `default/hc`).
    up.set_strict_host(true);
    dns.set("hc.test", &[ip(&up)]);
    let gw_port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("all.yaml"),
        gateway(gw_port)
            + &route("hc", "hc.example.com", "hc")
            + &hostname_backend(
                "hc",
                "hc.test",
                up.addr().port(),
                "  healthCheck: { path: /healthz, interval: 1s }\n",
            ),
    )
    .unwrap();
    let (_ballast, envoy) = serve_with_resolver(dir.path(), &dns, "envoy-dns-hc").await;
    let healthy = wait_until(T, POLL, || async {
        let Ok(clusters) = envoy.admin_get("/clusters").await else {
            return false;
        };
        up.last_host().is_some()
            && clusters
                .lines()
                .any(|l| l.starts_with("default/hc::") && l.ends_with("health_flags::healthy"))
    })
    .await;
    if let Err(e) = healthy {
        panic!(
            "{e}: host {:?}; {}",
            up.last_host(),
            envoy.admin_get("/clusters").await.unwrap_or_default()
        );
    }
    assert_eq!(up.last_host().as_deref(), Some("hc.test"));
    let gw = loopback(gw_port);
    wait_host_body(gw, "hc.example.com", "hc").await.unwrap();
}

/// Editing a Backend from an IP endpoint to a hostname and back switches its cluster between
/// EDS and DNS (the load assignment disappears and comes back) under traffic: Envoy warms each
/// new cluster before replacing the old one, so no request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_a_backend_between_ip_and_hostname_loses_no_request() {
    let dns = DnsServer::start(1).await.unwrap();
    let a = Upstream::start("a").await.unwrap();
    let b = Upstream::start_on("b", SocketAddr::from(([127, 0, 0, 6], 0)))
        .await
        .unwrap();
    dns.set("sw.test", &[ip(&b)]);
    let gw_port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("all.yaml");
    let by_ip =
        gateway(gw_port) + &route("sw", "sw.example.com", "sw") + &backend("sw", &[a.addr()]);
    let by_name = gateway(gw_port)
        + &route("sw", "sw.example.com", "sw")
        + &hostname_backend("sw", "sw.test", b.addr().port(), "");
    write_atomic(&file, &by_ip);
    let (_ballast, envoy) = serve_with_resolver(dir.path(), &dns, "envoy-dns-switch").await;
    let gw = loopback(gw_port);
    wait_host_body(gw, "sw.example.com", "a").await.unwrap();
    let traffic = Traffic::start(
        TrafficConfig::new(gw, "sw.example.com", "/")
            .concurrency(2)
            .pause(Duration::from_millis(5)),
    );
    for _ in 0..2 {
        write_atomic(&file, &by_name);
        wait_moved(&a, &b, &envoy, (gw, "sw.example.com", &traffic)).await;
        write_atomic(&file, &by_ip);
        wait_moved(&b, &a, &envoy, (gw, "sw.example.com", &traffic)).await;
    }
    let report = traffic.stop().await;
    report.assert_all_ok();
    assert!(report.total > 100, "{report:?}");
    // Envoy holds the DNS cluster again after the last switch.
    write_atomic(&file, &by_name);
    wait_host_body(gw, "sw.example.com", "b").await.unwrap();
    let dump = envoy.config_dump(true).await.unwrap().to_string();
    assert!(dump.contains("envoy.cluster.dns"), "{dump}");
}
