//! GRPCRoute end to end (issue #10 §2b): real Envoy, real grpcio upstreams and client (h2c),
//! the cases of the upstream Gateway API conformance suite ported to config files:
//! `GRPCExactMethodMatching`, `GRPCRouteHeaderMatching`, `GRPCRouteListenerHostnameMatching`,
//! request/response header modifiers, weighted backends, and a GRPCRoute sharing a hostname
//! with an HTTPRoute on the same listener. Every call is checked: the backend that answered,
//! or the exact gRPC status when no route matches.
//!
//! Also (issue #10): a GRPCRoute on an HTTPS listener, called by grpcio over TLS (which needs
//! Envoy to select ALPN `h2`), and `RequestMirror` on GRPCRoute rules (the mirror target, a
//! grpcio upstream, receives every call while the client is answered by the primary).

mod common;

use std::net::SocketAddr;

use ballast_testkit::{
    AdsMode, Envoy, EnvoyConfig, GrpcOutcome, GrpcUpstream, Upstream, grpc_calls, grpc_calls_tls,
    wait_for,
};
use common::*;

const SVC: &str = "gateway_api_conformance.echo_basic.grpcecho.GrpcEcho";

fn config(port: u16, v: &[SocketAddr; 3], web: SocketAddr) -> String {
    let gw = format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - {{ name: http, port: {port}, protocol: HTTP }}
  - {{ name: bar, port: {port}, protocol: HTTP, hostname: bar.com }}
  - {{ name: foo-bar, port: {port}, protocol: HTTP, hostname: foo.bar.com }}
  - {{ name: wild, port: {port}, protocol: HTTP, hostname: \"*.bar.com\" }}
"
    );
    let routes = format!(
        "---
# GRPCExactMethodMatching; GRPCRouteNamedRule (its manifest: the same rules, the first named)
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{ name: exact-matching }}
spec:
  parentRefs: [{{ name: edge, sectionName: http }}]
  hostnames: [exact.example.com]
  rules:
  - name: named-rule
    matches: [{{ method: {{ service: {SVC}, method: Echo }} }}]
    backendRefs: [{{ name: v1, port: 8080 }}]
  - matches: [{{ method: {{ service: {SVC}, method: EchoTwo }} }}]
    backendRefs: [{{ name: v2, port: 8080 }}]
---
# GRPCRouteHeaderMatching
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{ name: header-matching }}
spec:
  parentRefs: [{{ name: edge, sectionName: http }}]
  hostnames: [headers.example.com]
  rules:
  - matches: [{{ headers: [{{ name: version, value: one }}] }}]
    backendRefs: [{{ name: v1 }}]
  - matches: [{{ headers: [{{ name: version, value: two }}] }}]
    backendRefs: [{{ name: v2 }}]
  - matches: [{{ headers: [{{ name: version, value: two }}, {{ name: color, value: orange }}] }}]
    backendRefs: [{{ name: v3 }}]
  - matches: [{{ headers: [{{ type: RegularExpression, name: color, value: \"^(blue|green)$\" }}] }}]
    backendRefs: [{{ name: v1 }}]
---
# GRPCRouteListenerHostnameMatching: one route per listener
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{ name: backend-v1 }}
spec:
  parentRefs: [{{ name: edge, sectionName: bar }}]
  rules: [{{ backendRefs: [{{ name: v1 }}] }}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{ name: backend-v2 }}
spec:
  parentRefs: [{{ name: edge, sectionName: foo-bar }}]
  rules: [{{ backendRefs: [{{ name: v2 }}] }}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{ name: backend-v3 }}
spec:
  parentRefs: [{{ name: edge, sectionName: wild }}]
  rules: [{{ backendRefs: [{{ name: v3 }}] }}]
---
# Header modifier filters and weighted backends (weight 0 gets nothing)
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{ name: filters-weights }}
spec:
  parentRefs: [{{ name: edge, sectionName: http }}]
  hostnames: [weights.example.com]
  rules:
  - matches: [{{ method: {{ service: {SVC} }} }}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{{ name: x-set, value: set-by-route }}]
        add: [{{ name: x-added, value: added }}]
        remove: [x-remove]
    - type: ResponseHeaderModifier
      responseHeaderModifier:
        add: [{{ name: x-response, value: from-route }}]
    backendRefs:
    - {{ name: v1, weight: 1 }}
    - {{ name: v2, weight: 1 }}
    - {{ name: v3, weight: 0 }}
---
# A GRPCRoute and an HTTPRoute on one hostname of one listener
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{ name: mixed }}
spec:
  parentRefs: [{{ name: edge, sectionName: http }}]
  hostnames: [mixed.example.com]
  rules:
  - matches: [{{ method: {{ service: {SVC}, method: Echo }} }}]
    backendRefs: [{{ name: v2 }}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: mixed }}
spec:
  parentRefs: [{{ name: edge, sectionName: http }}]
  hostnames: [mixed.example.com]
  rules: [{{ backendRefs: [{{ name: web }}] }}]
"
    );
    gw + &routes
        + &backend("v1", &[v[0]])
        + &backend("v2", &[v[1]])
        + &backend("v3", &[v[2]])
        + &backend("web", &[web])
}

fn method(m: &str) -> String {
    format!("/{SVC}/{m}")
}

/// `n` calls; panics unless every one was answered by `want`.
async fn expect_backend(
    target: SocketAddr,
    authority: &str,
    m: &str,
    md: &[(&str, &str)],
    want: &str,
) -> Vec<GrpcOutcome> {
    let out = grpc_calls(target, authority, &method(m), 5, md)
        .await
        .unwrap();
    assert_eq!(out.len(), 5);
    for o in &out {
        assert_eq!(o.backend(), Some(want), "{authority} {m} {md:?}: {o:?}");
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcroute_conformance_cases_through_envoy() {
    let v1 = GrpcUpstream::start("v1").await.unwrap();
    let v2 = GrpcUpstream::start("v2").await.unwrap();
    let v3 = GrpcUpstream::start("v3").await.unwrap();
    let web = Upstream::start("web").await.unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        config(port, &[v1.addr(), v2.addr(), v3.addr()], web.addr()),
    )
    .unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-grpc",
        "default/edge",
        AdsMode::DeltaGrpc,
    ))
    .await
    .unwrap();
    let target: SocketAddr = ([127, 0, 0, 1], port).into();

    // Bounded wait until Envoy is programmed.
    wait_for(T, POLL, || async {
        let out = grpc_calls(target, "exact.example.com", &method("Echo"), 1, &[]).await?;
        match out.first().and_then(|o| o.backend()) {
            Some("v1") => Ok(()),
            _ => anyhow::bail!("not ready: {out:?}"),
        }
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e:#}\nenvoy log:\n{}\nballast log:\n{}",
            envoy.log_tail(30),
            ballast.log_tail()
        )
    });

    // GRPCExactMethodMatching.
    let out = expect_backend(target, "exact.example.com", "Echo", &[], "v1").await;
    let GrpcOutcome::Ok(reply) = &out[0] else {
        unreachable!()
    };
    assert_eq!(
        reply["reply"]["method"],
        method("Echo"),
        "the path reaches the upstream unchanged"
    );
    expect_backend(target, "exact.example.com", "EchoTwo", &[], "v2").await;
    let out = grpc_calls(target, "exact.example.com", &method("EchoThree"), 3, &[])
        .await
        .unwrap();
    assert!(
        out.iter()
            .all(|o| matches!(o, GrpcOutcome::Err(code, _) if code == "UNIMPLEMENTED")),
        "no route: Envoy's 404 is UNIMPLEMENTED: {out:?}"
    );

    // GRPCRouteHeaderMatching: more header matches win; regex values.
    expect_backend(
        target,
        "headers.example.com",
        "Echo",
        &[("version", "one")],
        "v1",
    )
    .await;
    expect_backend(
        target,
        "headers.example.com",
        "Echo",
        &[("version", "two")],
        "v2",
    )
    .await;
    expect_backend(
        target,
        "headers.example.com",
        "Echo",
        &[("version", "two"), ("color", "orange")],
        "v3",
    )
    .await;
    expect_backend(
        target,
        "headers.example.com",
        "Echo",
        &[("color", "green")],
        "v1",
    )
    .await;
    let out = grpc_calls(
        target,
        "headers.example.com",
        &method("Echo"),
        2,
        &[("color", "red")],
    )
    .await
    .unwrap();
    assert!(
        out.iter()
            .all(|o| matches!(o, GrpcOutcome::Err(code, _) if code == "UNIMPLEMENTED")),
        "{out:?}"
    );

    // GRPCRouteListenerHostnameMatching: the most specific listener's routes answer.
    expect_backend(target, "bar.com", "Echo", &[], "v1").await;
    expect_backend(target, "foo.bar.com", "Echo", &[], "v2").await;
    expect_backend(target, "baz.bar.com", "Echo", &[], "v3").await;
    expect_backend(target, "boo.bar.com", "Echo", &[], "v3").await;
    let out = grpc_calls(target, "multiple.prefixes.bar.com", &method("Echo"), 1, &[])
        .await
        .unwrap();
    assert_eq!(out[0].backend(), Some("v3"), "{out:?}");

    // Filters and weights: every call succeeds, only weighted backends answer, both get some.
    let out = grpc_calls(
        target,
        "weights.example.com",
        &method("Echo"),
        60,
        &[("x-remove", "gone"), ("x-set", "client")],
    )
    .await
    .unwrap();
    let mut counts = std::collections::BTreeMap::new();
    for o in &out {
        let GrpcOutcome::Ok(v) = o else {
            panic!("failed call: {o:?}")
        };
        *counts.entry(o.backend().unwrap().to_owned()).or_insert(0) += 1;
        let md = &v["reply"]["metadata"];
        assert_eq!(md["x-set"], "set-by-route", "{v}");
        assert_eq!(md["x-added"], "added", "{v}");
        assert!(md.get("x-remove").is_none(), "{v}");
        assert_eq!(v["headers"]["x-response"], "from-route", "{v}");
    }
    assert_eq!(out.len(), 60);
    assert!(
        !counts.contains_key("v3"),
        "weight 0 gets no calls: {counts:?}"
    );
    assert!(
        counts.get("v1").copied().unwrap_or(0) > 0 && counts.get("v2").copied().unwrap_or(0) > 0,
        "{counts:?}"
    );

    // GRPCRoute and HTTPRoute on one hostname: the gRPC method goes to the gRPC backend, other
    // requests to the HTTPRoute's HTTP/1.1 backend.
    expect_backend(target, "mixed.example.com", "Echo", &[], "v2").await;
    assert_eq!(
        host_get(target, "mixed.example.com").await.unwrap(),
        (200, "web".to_owned())
    );

    // The gRPC backends are reached over HTTP/2 through their own cluster.
    let summary = envoy.config_summary(false).await.unwrap();
    assert!(summary.clusters.contains("default/v1:h2c"), "{summary:?}");
    assert!(summary.clusters.contains("default/web"), "{summary:?}");
    assert!(!summary.clusters.contains("default/v1"), "{summary:?}");
}

/// The ALPN protocol Envoy selects when a client offers `h2,http/1.1` with SNI `host`.
async fn negotiated_alpn(host: &str, port: u16) -> String {
    let out = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl s_client -connect 127.0.0.1:{port} -servername {host} -alpn h2,http/1.1 \
             </dev/null 2>/dev/null"
        ))
        .output()
        .await
        .expect("run openssl s_client");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("ALPN protocol: "))
        .unwrap_or("none")
        .to_owned()
}

/// A GRPCRoute on an HTTPS listener (rcgen certificate in a Secret): grpcio over TLS, with
/// the certificate checked, reaches the backend of each method; Envoy's listener advertises
/// ALPN `h2,http/1.1` and selects `h2` (grpcio fails the call otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcroute_on_https_listener_over_tls_with_alpn_h2() {
    let v1 = GrpcUpstream::start("v1").await.unwrap();
    let v2 = GrpcUpstream::start("v2").await.unwrap();
    let certs = tempfile::tempdir().unwrap();
    let host = "grpc.example.com";
    let (crt, key) = rcgen_cert(certs.path(), host);
    let ca = certs.path().join(format!("{host}.crt"));
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - name: grpcs
    port: {port}
    protocol: HTTPS
    hostname: {host}
    tls: {{ certificateRefs: [{{ kind: Secret, name: grpc-tls }}] }}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{ name: secure }}
spec:
  parentRefs: [{{ name: edge, sectionName: grpcs }}]
  rules:
  - matches: [{{ method: {{ service: {SVC}, method: Echo }} }}]
    backendRefs: [{{ name: v1 }}]
  - matches: [{{ method: {{ service: {SVC}, method: EchoTwo }} }}]
    backendRefs: [{{ name: v2 }}]
"
    ) + &backend("v1", &[v1.addr()])
        + &backend("v2", &[v2.addr()])
        + &tls_secret("grpc-tls", &crt, &key);
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-grpcs",
        "default/edge",
        AdsMode::DeltaGrpc,
    ))
    .await
    .unwrap();
    let target: SocketAddr = ([127, 0, 0, 1], port).into();

    // Bounded wait until Envoy serves the listener and its certificate.
    wait_for(T, POLL, || async {
        let out = grpc_calls_tls(target, host, &method("Echo"), 1, &[], &ca).await?;
        match out.first().and_then(|o| o.backend()) {
            Some("v1") => Ok(()),
            _ => anyhow::bail!("not ready: {out:?}"),
        }
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e:#}\nenvoy log:\n{}\nballast log:\n{}",
            envoy.log_tail(30),
            ballast.log_tail()
        )
    });

    // Every call over TLS succeeds and reaches its method's backend.
    let mut answered = 0;
    for (m, want) in [("Echo", "v1"), ("EchoTwo", "v2")] {
        let out = grpc_calls_tls(target, host, &method(m), 20, &[], &ca)
            .await
            .unwrap();
        assert_eq!(out.len(), 20);
        for o in &out {
            let GrpcOutcome::Ok(v) = o else {
                panic!("failed call {m}: {o:?}")
            };
            assert_eq!(o.backend(), Some(want), "{m}: {v}");
            assert_eq!(v["reply"]["method"], method(m), "{v}");
            answered += 1;
        }
    }
    assert_eq!(answered, 40, "every call answered OK by its backend");
    // A method no rule matches: Envoy's 404 as gRPC UNIMPLEMENTED, over TLS too.
    let out = grpc_calls_tls(target, host, &method("EchoThree"), 2, &[], &ca)
        .await
        .unwrap();
    assert!(
        out.iter()
            .all(|o| matches!(o, GrpcOutcome::Err(code, _) if code == "UNIMPLEMENTED")),
        "{out:?}"
    );
    // The wrong CA fails the handshake: the listener's own certificate was served.
    let other = tempfile::tempdir().unwrap();
    rcgen_cert(other.path(), host);
    let out = grpc_calls_tls(
        target,
        host,
        &method("Echo"),
        1,
        &[],
        &other.path().join(format!("{host}.crt")),
    )
    .await
    .unwrap();
    assert!(
        matches!(&out[0], GrpcOutcome::Err(code, _) if code == "UNAVAILABLE"),
        "{out:?}"
    );

    // ALPN: Envoy selects h2 for a client offering h2 and HTTP/1.1, and its listener's TLS
    // context advertises both.
    assert_eq!(negotiated_alpn(host, port).await, "h2");
    let dump = serde_json::to_string(&envoy.config_dump(false).await.unwrap()).unwrap();
    assert!(
        dump.contains(r#""alpn_protocols":["h2","http/1.1"]"#),
        "listener TLS context advertises h2,http/1.1"
    );
    let summary = envoy.config_summary(false).await.unwrap();
    assert!(summary.secrets.contains("default/grpc-tls"), "{summary:?}");
    assert!(summary.clusters.contains("default/v1:h2c"), "{summary:?}");
}

/// `RequestMirror` on a GRPCRoute rule: the client is answered by the primary for every call,
/// the mirror target (a grpcio upstream behind an HTTP/1.1 Backend, so it is reached through
/// its `:h2c` copy) receives a copy of each call of the mirrored rule and none of the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcroute_request_mirror_copies_calls_to_the_mirror() {
    let primary = GrpcUpstream::start("primary").await.unwrap();
    let shadow = GrpcUpstream::start("shadow").await.unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let config = gateway(port)
        + &format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{ name: mirrored }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [mirror.example.com]
  rules:
  - matches: [{{ method: {{ service: {SVC}, method: Echo }} }}]
    filters:
    - type: RequestMirror
      requestMirror: {{ backendRef: {{ name: shadow }} }}
    backendRefs: [{{ name: primary }}]
  - matches: [{{ method: {{ service: {SVC}, method: EchoTwo }} }}]
    backendRefs: [{{ name: primary }}]
"
        )
        + &backend("primary", &[primary.addr()])
        + &backend("shadow", &[shadow.addr()]);
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-grpc-mirror",
        "default/edge",
        AdsMode::DeltaGrpc,
    ))
    .await
    .unwrap();
    let target: SocketAddr = ([127, 0, 0, 1], port).into();
    let host = "mirror.example.com";
    // Bounded wait until Envoy is programmed (EchoTwo: not mirrored, the shadow stays clean).
    wait_for(T, POLL, || async {
        let out = grpc_calls(target, host, &method("EchoTwo"), 1, &[]).await?;
        match out.first().and_then(|o| o.backend()) {
            Some("primary") => Ok(()),
            _ => anyhow::bail!("not ready: {out:?}"),
        }
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e:#}\nenvoy log:\n{}\nballast log:\n{}",
            envoy.log_tail(30),
            ballast.log_tail()
        )
    });

    // Not mirrored first, then mirrored: every call is answered OK by the primary.
    let mut non_ok = 0;
    for (m, n) in [("EchoTwo", 10), ("Echo", 30)] {
        let out = grpc_calls(target, host, &method(m), n, &[("x-call", m)])
            .await
            .unwrap();
        assert_eq!(out.len(), n);
        for o in &out {
            match o.backend() {
                Some("primary") => {}
                _ => non_ok += 1,
            }
        }
    }
    assert_eq!(non_ok, 0, "the client is answered by the primary only");

    // Envoy sends a copy of each of the 30 mirrored calls to the mirror cluster. Mirroring
    // is best effort (a copy the shadow cannot take in time is dropped, and the client never
    // notices), so on a loaded machine a few copies may not arrive: wait until Envoy has sent
    // all 30 and the shadow has them, or until the bounded wait ends, then check what came.
    wait_for(T, POLL, || async {
        let sent = envoy
            .stat("cluster.default/shadow_h2c.upstream_rq_total")
            .await?
            .unwrap_or(0);
        if sent >= 30 {
            Ok(())
        } else {
            anyhow::bail!("Envoy sent {sent}/30 mirror copies")
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\nenvoy log:\n{}", envoy.log_tail(30)));
    let _ = wait_for(std::time::Duration::from_secs(20), POLL, || async {
        let n = shadow.received().len();
        if n >= 30 {
            Ok(())
        } else {
            anyhow::bail!("shadow received {n}/30")
        }
    })
    .await;
    let got = shadow.received();
    assert!(
        !got.is_empty() && got.len() <= 30,
        "the shadow gets copies of the mirrored calls and nothing else: {got:?}"
    );
    for c in &got {
        assert_eq!(c["method"], method("Echo"), "{c}");
        assert_eq!(c["metadata"]["x-call"], "Echo", "{c}");
    }
    // The primary got every call once (the ready probes included).
    let primary_got = primary.received();
    let echo = primary_got
        .iter()
        .filter(|c| c["method"] == method("Echo"))
        .count();
    assert_eq!(echo, 30, "{primary_got:?}");

    // The mirror target speaks HTTP/2 through its own copy of the Backend.
    let summary = envoy.config_summary(false).await.unwrap();
    assert!(
        summary.clusters.contains("default/shadow:h2c"),
        "{summary:?}"
    );
    assert!(!summary.clusters.contains("default/shadow"), "{summary:?}");
    // (Envoy writes the `:` of a cluster name as `_` in stat names.)
    let mirrored = envoy
        .stat("cluster.default/shadow_h2c.upstream_rq_total")
        .await
        .unwrap();
    assert_eq!(
        mirrored,
        Some(30),
        "Envoy mirrors each of the 30 calls, no more"
    );
}
