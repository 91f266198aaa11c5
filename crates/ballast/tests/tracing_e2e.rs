//! ClientPolicy `tracing` (issue #11) against real Envoy: `envoy.tracers.opentelemetry` exports
//! OTLP spans to a collector Backend, here the testkit's `OtlpReceiver`, which counts them.
//! One Gateway, two HTTP listeners: the Gateway-wide policy samples 100 % (service
//! `edge-traced`), a listener policy on the other samples 0 % (service `edge-quiet`).

mod common;

use std::net::SocketAddr;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, OtlpReceiver, Upstream, wait_for};
use common::*;

fn config(
    traced: u16,
    quiet: u16,
    app: SocketAddr,
    collector: SocketAddr,
    protocol: &str,
) -> String {
    let backend_protocol = if protocol == "GRPC" {
        "  protocol: grpc\n"
    } else {
        ""
    };
    format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - {{ name: traced, port: {traced}, protocol: HTTP }}
  - {{ name: quiet, port: {quiet}, protocol: HTTP }}
{}{}---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: otel }}
spec:
{backend_protocol}  endpoints: [{{ address: {}, port: {} }}]
---
apiVersion: ballast.dev/v1alpha1
kind: ClientPolicy
metadata: {{ name: all }}
spec:
  targetRefs: [{{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }}]
  tracing:
    backendRef: {{ name: otel }}
    protocol: {protocol}
    samplingRate: 100
    serviceName: edge-traced
---
apiVersion: ballast.dev/v1alpha1
kind: ClientPolicy
metadata: {{ name: quiet }}
spec:
  targetRefs: [{{ group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: quiet }}]
  tracing:
    backendRef: {{ name: otel }}
    protocol: {protocol}
    samplingRate: 0
    serviceName: edge-quiet
",
        route("app", "app.example.com", "app"),
        backend("app", &[app]),
        collector.ip(),
        collector.port(),
    )
}

/// `n` GETs through `port`; panics on any non-2xx (every request must be served).
async fn send(port: u16, n: usize) {
    for i in 0..n {
        let status = host_status(loopback(port), "app.example.com")
            .await
            .unwrap();
        assert_eq!(status, 200, "request {i} through port {port}");
    }
}

async fn spans_follow_the_sampling_rate(protocol: &str, transport: &str) {
    let collector = OtlpReceiver::start().await.unwrap();
    let app = Upstream::start("app").await.unwrap();
    let (traced, quiet) = (ballast_testkit::free_port(), ballast_testkit::free_port());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        config(traced, quiet, app.addr(), collector.addr(), protocol),
    )
    .unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        &format!("envoy-tracing-{}", protocol.to_lowercase()),
        "default/edge",
        AdsMode::DeltaGrpc,
    ))
    .await
    .unwrap();
    // Both listeners serve once the config is in (these probes are traced too, or not).
    let mut sent_traced = 0;
    for port in [traced, quiet] {
        let probes = wait_for(T, POLL, || async {
            match host_status(loopback(port), "app.example.com").await {
                Ok(200) => Ok(()),
                other => anyhow::bail!("port {port}: {other:?}"),
            }
        })
        .await;
        probes.unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
        if port == traced {
            sent_traced += 1;
        }
    }
    // 0 % first, then 100 %: by the time the traced spans are in, quiet ones would be too.
    send(quiet, 20).await;
    send(traced, 20).await;
    sent_traced += 20;
    let wait_spans = |want: usize| {
        let collector = &collector;
        let envoy = &envoy;
        async move {
            wait_for(T, POLL, || async {
                let n = collector.count("edge-traced");
                if n >= want {
                    Ok(n)
                } else {
                    anyhow::bail!("{n} of {want} spans of edge-traced received")
                }
            })
            .await
            .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)))
        }
    };
    wait_spans(sent_traced).await;
    // One more export cycle of the traced listener after the quiet requests.
    let before = collector.count("edge-traced");
    send(traced, 5).await;
    wait_spans(before + 5).await;
    let spans = collector.spans();
    assert_eq!(
        collector.count("edge-quiet"),
        0,
        "0 % sampling exported spans"
    );
    assert!(
        spans
            .iter()
            .all(|s| s.service == "edge-traced" && s.transport == transport),
        "{spans:?}"
    );
    // Envoy's own counters agree: every traced-port request was sampled, no quiet one.
    let sampled = |port: u16| {
        let envoy = &envoy;
        async move {
            envoy
                .stat(&format!("http.default_edge_{port}.tracing.random_sampling"))
                .await
                .unwrap()
                .unwrap_or(0)
        }
    };
    assert_eq!(sampled(quiet).await, 0);
    assert!(sampled(traced).await >= sent_traced as u64 + 5);
}

/// OTLP/HTTP (`POST /v1/traces`, protobuf): 100 % sampling → a span per request with the
/// configured service name; 0 % → none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_http_spans_follow_the_sampling_rate() {
    spans_follow_the_sampling_rate("HTTP", "http").await;
}

/// OTLP/gRPC (`TraceService/Export` over h2c to a `protocol: grpc` Backend): the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_grpc_spans_follow_the_sampling_rate() {
    spans_follow_the_sampling_rate("GRPC", "grpc").await;
}
