//! RateLimitPolicy (issue #11) against real Envoy: local token buckets per route and per client
//! identity (a header value), with 429 and `x-ratelimit-*` headers; a Gateway-wide bucket; and
//! global limits through a rate-limit gRPC service (the testkit's counting server), including
//! the service being down with `failureModeDeny: false`.
//!
//! Windows are one hour, so no bucket refills during a test: counts are exact and nothing
//! depends on timing.

mod common;

use std::net::SocketAddr;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, Upstream, wait_for};
use common::*;

/// Sends `n` GETs for `host` with `headers`; returns every status and the headers of the last
/// response.
async fn burst(
    addr: SocketAddr,
    host: &str,
    headers: &[&str],
    n: usize,
) -> (Vec<u16>, Vec<(String, String)>) {
    let mut codes = Vec::with_capacity(n);
    let mut last = Vec::new();
    for _ in 0..n {
        let (code, h, _) = host_request(addr, "GET", host, headers).await.unwrap();
        codes.push(code);
        last = h;
    }
    (codes, last)
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

fn non_2xx(codes: &[u16]) -> usize {
    codes.iter().filter(|c| !(200..300).contains(*c)).count()
}

const LIMITED_ROUTE_POLICY: &str = "---
apiVersion: ballast.dev/v1alpha1
kind: RateLimitPolicy
metadata: { name: per-user }
spec:
  targetRefs: [{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: limited }]
  local:
    rules:
    - clientSelectors: [{ headers: [{ name: x-user, type: Distinct }] }]
      limit: { requests: 10, unit: Hour }
";

/// The 11th request of a user within the hour gets 429 with `x-ratelimit-*` headers; another
/// user has a bucket of its own; requests without the header and other routes are not
/// limited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_limit_per_route_and_per_client_header() {
    let up = Upstream::start("app").await.unwrap();
    let port = ballast_testkit::free_port();
    let config = gateway(port)
        + &route("limited", "limited.example.com", "app")
        + &route("free", "free.example.com", "app")
        + &backend("app", &[up.addr()])
        + LIMITED_ROUTE_POLICY;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-rate-limit",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    // Ready: the free route answers (no request to the limited route is spent).
    wait_for(T, POLL, || async {
        match host_status(gw, "free.example.com").await {
            Ok(200) => Ok(()),
            c => anyhow::bail!("free route: {c:?}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
    let dump = envoy.config_dump(false).await.unwrap().to_string();
    assert!(
        dump.contains("envoy.filters.http.local_ratelimit") && dump.contains("default/per-user/0"),
        "the policy reached Envoy"
    );

    let (codes, h) = burst(gw, "limited.example.com", &["x-user: alice"], 10).await;
    assert_eq!(non_2xx(&codes), 0, "alice's first 10: {codes:?}");
    assert_eq!(header(&h, "x-ratelimit-limit"), Some("10"), "{h:?}");
    assert_eq!(header(&h, "x-ratelimit-remaining"), Some("0"), "{h:?}");
    let (codes, h) = burst(gw, "limited.example.com", &["x-user: alice"], 1).await;
    assert_eq!(codes, [429], "alice's 11th");
    assert_eq!(header(&h, "x-ratelimit-limit"), Some("10"), "{h:?}");
    assert_eq!(header(&h, "x-ratelimit-remaining"), Some("0"), "{h:?}");
    assert!(
        header(&h, "x-ratelimit-reset").is_some_and(|v| v.parse::<u64>().is_ok()),
        "{h:?}"
    );

    // Bob has his own bucket.
    let (codes, _) = burst(gw, "limited.example.com", &["x-user: bob"], 10).await;
    assert_eq!(non_2xx(&codes), 0, "bob's first 10: {codes:?}");
    let (codes, _) = burst(gw, "limited.example.com", &["x-user: bob"], 1).await;
    assert_eq!(codes, [429], "bob's 11th");
    // No x-user header: the rule does not count the request.
    let (codes, _) = burst(gw, "limited.example.com", &[], 15).await;
    assert_eq!(non_2xx(&codes), 0, "anonymous: {codes:?}");
    // Another route on the same Gateway is not limited, whoever asks.
    let (codes, h) = burst(gw, "free.example.com", &["x-user: alice"], 25).await;
    assert_eq!(non_2xx(&codes), 0, "free route: {codes:?}");
    assert_eq!(header(&h, "x-ratelimit-limit"), None, "{h:?}");
    // Still limited: alice's bucket does not refill within the hour.
    let (codes, _) = burst(gw, "limited.example.com", &["x-user: alice"], 3).await;
    assert_eq!(codes, [429, 429, 429]);
    let limited = envoy
        .stats()
        .await
        .unwrap()
        .into_iter()
        .filter(|(k, _)| k.ends_with("http_local_rate_limit.rate_limited"))
        .map(|(_, v)| v)
        .sum::<u64>();
    assert_eq!(limited, 5, "Envoy counted every 429");

    // Status says where the policy applies.
    let (_, body) = ballast.get("/debug/sources").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let p = &v["status"]["rateLimitPolicies"][0];
    assert_eq!(p["name"], "per-user", "{v:#}");
    assert_eq!(p["targets"][0]["kind"], "HTTPRoute", "{p:#}");
    assert_eq!(p["targets"][0]["name"], "limited", "{p:#}");
    assert_eq!(p["targets"][0]["conditions"][0]["status"], "True", "{p:#}");

    // A broken edit (requests: 0) is reported by file:line:col and changes nothing in Envoy.
    let file = dir.path().join("config.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let broken = text.replace("requests: 10,", "requests: 0,");
    let line = broken
        .lines()
        .position(|l| l.contains("requests: 0"))
        .unwrap()
        + 1;
    write_atomic(&file, &broken);
    let errors = wait_for(T, POLL, || async {
        let (_, body) = ballast.get("/debug/sources").await?;
        let v: serde_json::Value = serde_json::from_str(&body)?;
        let errors = v["sources"][0]["errors"].to_string();
        anyhow::ensure!(errors.contains("config.yaml:"), "no error yet");
        Ok(errors)
    })
    .await
    .unwrap();
    assert!(
        errors.contains(&format!("config.yaml:{line}:"))
            && errors.contains("spec.local.rules[0].limit.requests: must be at least 1"),
        "{errors}"
    );
    let (codes, _) = burst(gw, "limited.example.com", &["x-user: alice"], 1).await;
    assert_eq!(codes, [429], "the last good policy still limits alice");
    let (codes, h) = burst(gw, "limited.example.com", &["x-user: carol"], 1).await;
    assert_eq!(codes, [200]);
    assert_eq!(header(&h, "x-ratelimit-limit"), Some("10"), "{h:?}");
}

/// A Gateway policy is one bucket for every route of the Gateway without a policy of its own
/// (6 requests spread over two routes exhaust it for both); a route with its own policy is
/// limited by that policy alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_limit_per_gateway_and_route_override() {
    let up = Upstream::start("app").await.unwrap();
    let port = ballast_testkit::free_port();
    let config = gateway(port)
        + &route("a", "a.example.com", "app")
        + &route("b", "b.example.com", "app")
        + &route("c", "c.example.com", "app")
        + &backend("app", &[up.addr()])
        + "---
apiVersion: ballast.dev/v1alpha1
kind: RateLimitPolicy
metadata: { name: edge-wide }
spec:
  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }]
  local:
    rules: [{ limit: { requests: 6, unit: Hour } }]
---
apiVersion: ballast.dev/v1alpha1
kind: RateLimitPolicy
metadata: { name: c-users }
spec:
  targetRefs: [{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: c }]
  local:
    rules:
    - clientSelectors: [{ headers: [{ name: x-user, type: Distinct }] }]
      limit: { requests: 2, unit: Hour }
";
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-rate-limit-gw",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    // Ready through route c without x-user: its own policy never counts that.
    wait_for(T, POLL, || async {
        match host_status(gw, "c.example.com").await {
            Ok(200) => Ok(()),
            c => anyhow::bail!("route c: {c:?}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
    let (a, _) = burst(gw, "a.example.com", &[], 3).await;
    let (b, h) = burst(gw, "b.example.com", &[], 3).await;
    assert_eq!(non_2xx(&a) + non_2xx(&b), 0, "{a:?} {b:?}");
    assert_eq!(header(&h, "x-ratelimit-limit"), Some("6"), "{h:?}");
    let (a, _) = burst(gw, "a.example.com", &[], 1).await;
    let (b, _) = burst(gw, "b.example.com", &[], 1).await;
    assert_eq!((a[0], b[0]), (429, 429), "the Gateway's bucket is shared");
    // Route c: the Gateway's bucket (empty now) does not apply; its own does.
    let (c, _) = burst(gw, "c.example.com", &[], 10).await;
    assert_eq!(non_2xx(&c), 0, "{c:?}");
    let (c, _) = burst(gw, "c.example.com", &["x-user: alice"], 3).await;
    assert_eq!(c, [200, 200, 429]);
}

fn global_policy(failure_mode_deny: bool) -> String {
    format!(
        "---
apiVersion: ballast.dev/v1alpha1
kind: RateLimitPolicy
metadata: {{ name: api-global }}
spec:
  targetRefs: [{{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: api }}]
  global:
    backendRef: {{ name: rls }}
    failureModeDeny: {failure_mode_deny}
    timeout: 2s
    rules:
    - name: per-user
      clientSelectors: [{{ headers: [{{ name: x-user, type: Distinct }}] }}]
"
    )
}

fn grpc_backend(name: &str, addr: SocketAddr) -> String {
    format!(
        "---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: {name} }}
spec:
  protocol: grpc
  connectTimeout: 1s
  endpoints: [{{ address: {}, port: {} }}]
",
        addr.ip(),
        addr.port()
    )
}

/// Sum of Envoy's counters whose names end with `suffix`.
async fn stat_sum(envoy: &Envoy, suffix: &str) -> u64 {
    envoy
        .stats()
        .await
        .unwrap()
        .into_iter()
        .filter(|(k, _)| k.ends_with(suffix))
        .map(|(_, v)| v)
        .sum()
}

/// Global limits: Envoy asks the rate-limit service (the testkit's counting server, N = 5)
/// about each request of the limited route with the rule's descriptor; the first 5 of a user
/// get 200, then 429; another user and another route are unaffected (the other route never
/// calls the service). With the service failing, `failureModeDeny: false` lets requests through
/// (counted by Envoy's `failure_mode_allowed`); switched to `true` by a config edit, they get
/// 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_limit_through_rate_limit_service() {
    const N: usize = 5;
    let rls = ballast_testkit::RateLimitServer::start(N as u32)
        .await
        .unwrap();
    let up = Upstream::start("app").await.unwrap();
    let port = ballast_testkit::free_port();
    let config = |deny: bool| {
        gateway(port)
            + &route("api", "api.example.com", "app")
            + &route("other", "other.example.com", "app")
            + &backend("app", &[up.addr()])
            + &grpc_backend("rls", rls.addr())
            + &global_policy(deny)
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, config(false)).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-global-rate-limit",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    wait_for(T, POLL, || async {
        match host_status(gw, "other.example.com").await {
            Ok(200) => Ok(()),
            c => anyhow::bail!("other route: {c:?}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
    assert_eq!(
        rls.calls(),
        0,
        "routes without a policy never ask the service"
    );

    let (codes, _) = burst(gw, "api.example.com", &["x-user: alice"], N).await;
    assert_eq!(non_2xx(&codes), 0, "alice's first {N}: {codes:?}");
    let (codes, h) = burst(gw, "api.example.com", &["x-user: alice"], 2).await;
    assert_eq!(
        codes,
        [429, 429],
        "alice over the limit; service calls {} counts {:?}",
        rls.calls(),
        rls.counts()
    );
    assert_eq!(header(&h, "x-envoy-ratelimited"), Some("true"), "{h:?}");
    assert_eq!(
        header(&h, "x-ratelimit-limit").map(|v| v.starts_with("5")),
        Some(true),
        "{h:?}"
    );
    let (codes, _) = burst(gw, "api.example.com", &["x-user: bob"], N).await;
    assert_eq!(non_2xx(&codes), 0, "bob's first {N}: {codes:?}");
    let (codes, _) = burst(gw, "other.example.com", &["x-user: alice"], 10).await;
    assert_eq!(non_2xx(&codes), 0, "other route: {codes:?}");
    let counts = rls.counts();
    assert_eq!(
        counts.get("ballast|generic_key=per-user,x-user=alice"),
        Some(&(N as u64 + 2)),
        "{counts:?}"
    );
    assert_eq!(
        counts.get("ballast|generic_key=per-user,x-user=bob"),
        Some(&(N as u64)),
        "{counts:?}"
    );
    assert_eq!(
        rls.calls(),
        2 * N as u64 + 2,
        "one call per limited request"
    );
    assert_eq!(stat_sum(&envoy, "ratelimit.over_limit").await, 2);

    // The service fails: with failureModeDeny false every request passes, even alice's.
    rls.set_failing(true);
    let (codes, _) = burst(gw, "api.example.com", &["x-user: alice"], 4).await;
    assert_eq!(non_2xx(&codes), 0, "service down, fail open: {codes:?}");
    assert_eq!(stat_sum(&envoy, "ratelimit.failure_mode_allowed").await, 4);

    // failureModeDeny true (a config edit): the same requests are refused.
    write_atomic(&file, &config(true));
    wait_for(T, POLL, || async {
        match host_request(gw, "GET", "api.example.com", &["x-user: carol"]).await {
            Ok((500, _, _)) => Ok(()),
            c => anyhow::bail!("fail closed not in effect yet: {:?}", c.map(|c| c.0)),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
    let (codes, _) = burst(gw, "api.example.com", &["x-user: dave"], 3).await;
    assert_eq!(codes, [500, 500, 500]);
    // The service recovers: counting resumes (alice is still over the limit).
    rls.set_failing(false);
    let (codes, _) = burst(gw, "api.example.com", &["x-user: alice"], 1).await;
    assert_eq!(codes, [429]);
    let (codes, _) = burst(gw, "api.example.com", &["x-user: erin"], 1).await;
    assert_eq!(codes, [200]);
}

/// A rate-limit service nobody listens on: `failureModeDeny: false` lets every request through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_limit_with_service_down_fails_open() {
    let up = Upstream::start("app").await.unwrap();
    let port = ballast_testkit::free_port();
    let dead = loopback(ballast_testkit::free_port());
    let config = gateway(port)
        + &route("api", "api.example.com", "app")
        + &backend("app", &[up.addr()])
        + &grpc_backend("rls", dead)
        + &global_policy(false);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-rate-limit-down",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(port);
    wait_for(T, POLL, || async {
        match host_request(gw, "GET", "api.example.com", &["x-user: alice"]).await {
            Ok((200, _, _)) => Ok(()),
            c => anyhow::bail!("api route: {:?}", c.map(|c| c.0)),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
    let dump = envoy.config_dump(false).await.unwrap().to_string();
    assert!(
        dump.contains("envoy.filters.http.ratelimit") && dump.contains("\"default/rls\""),
        "the global filter and its service cluster are in Envoy"
    );
    let (codes, _) = burst(gw, "api.example.com", &["x-user: alice"], 20).await;
    assert_eq!(non_2xx(&codes), 0, "{codes:?}");
    assert!(stat_sum(&envoy, "ratelimit.failure_mode_allowed").await >= 20);
}
