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
}
