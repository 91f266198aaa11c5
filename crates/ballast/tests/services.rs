//! Kubernetes `Service` + `EndpointSlice` backends (a `kubectl get -o yaml` export) with real
//! Envoy and traffic: bare backendRefs mean Services, endpoints follow the slices, readiness
//! drives EDS health, and no request fails while endpoints change.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, Traffic, TrafficConfig, Upstream, wait_until};
use common::*;

/// A Service as `kubectl get svc -o yaml` prints it (server-set noise included).
fn service(name: &str) -> String {
    format!(
        "---
apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: default
  uid: 5b3c0c4e-1111-2222-3333-444455556666
  resourceVersion: \"4242\"
  creationTimestamp: \"2026-11-02T10:11:12Z\"
  managedFields:
  - {{ manager: kubectl, operation: Update, apiVersion: v1 }}
spec:
  clusterIP: 10.96.14.7
  clusterIPs: [10.96.14.7]
  ipFamilies: [IPv4]
  ipFamilyPolicy: SingleStack
  ports:
  - {{ name: http, port: 80, protocol: TCP, targetPort: http }}
  selector: {{ app: {name} }}
  sessionAffinity: None
  type: ClusterIP
status:
  loadBalancer: {{}}
"
    )
}

/// One EndpointSlice of `service` with one endpoint (`ready` condition as given).
fn slice(service: &str, name: &str, addr: SocketAddr, ready: bool, zone: &str) -> String {
    format!(
        "---
addressType: IPv4
apiVersion: discovery.k8s.io/v1
endpoints:
- addresses: [\"{ip}\"]
  conditions: {{ ready: {ready}, serving: {ready}, terminating: false }}
  nodeName: node-1
  targetRef: {{ kind: Pod, name: {name}-pod, namespace: default }}
  zone: {zone}
kind: EndpointSlice
metadata:
  name: {name}
  namespace: default
  generateName: {service}-
  labels:
    kubernetes.io/service-name: {service}
    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
  ownerReferences:
  - {{ apiVersion: v1, kind: Service, name: {service}, uid: x, controller: true }}
ports:
- {{ name: http, port: {port}, protocol: TCP }}
",
        ip = addr.ip(),
        port = addr.port()
    )
}

fn service_route(port: u16) -> String {
    gateway(port)
        + "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: { name: web }
spec:
  parentRefs: [{ name: edge }]
  hostnames: [web.example.com]
  rules:
  - backendRefs: [{ name: web, port: 80 }]
"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_endpoint_slices_serve_and_follow_readiness() {
    let a = Upstream::start("a").await.unwrap();
    let b = Upstream::start("b").await.unwrap();
    let gw_port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gateway.yaml"), service_route(gw_port)).unwrap();
    std::fs::write(dir.path().join("svc.yaml"), service("web")).unwrap();
    let slices = dir.path().join("slices.yaml");
    write_atomic(&slices, &slice("web", "web-a", a.addr(), true, "z1"));
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-svc",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(gw_port);
    wait_until(T, POLL, || async {
        matches!(host_get(gw, "web.example.com").await, Ok((200, body)) if body == "a")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", ballast.log_tail()));
    // The Service port is one EDS cluster named after it.
    let dump = envoy.config_dump(true).await.unwrap().to_string();
    assert!(dump.contains("default/web:80"), "{dump}");
    let traffic = Traffic::start(
        TrafficConfig::new(gw, "web.example.com", "/")
            .concurrency(2)
            .pause(Duration::from_millis(5)),
    );

    // A second slice (a new pod on another port): both serve.
    write_atomic(
        &slices,
        &(slice("web", "web-a", a.addr(), true, "z1")
            + &slice("web", "web-b", b.addr(), true, "z2")),
    );
    wait_until(T, POLL, || async { b.hits() > 10 })
        .await
        .unwrap();
    // Pod a stops being ready: it gets no more requests, and nothing fails.
    write_atomic(
        &slices,
        &(slice("web", "web-a", a.addr(), false, "z1")
            + &slice("web", "web-b", b.addr(), true, "z2")),
    );
    let hits_a = || a.hits();
    wait_until(T, POLL, || async {
        let before = hits_a();
        tokio::time::sleep(Duration::from_millis(300)).await;
        hits_a() == before
    })
    .await
    .unwrap();
    let b_before = b.hits();
    wait_until(T, POLL, || async { b.hits() > b_before + 20 })
        .await
        .unwrap();
    let report = traffic.stop().await;
    report.assert_all_ok();
    assert!(report.total > 50, "{report:?}");

    // `ballast validate` accepts the export with no warning (the bare ref means the Service).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ballast"))
        .arg("validate")
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(!text.contains("warning"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shorthand_backend_ref_still_serves_and_validate_says_how_to_fix() {
    let a = Upstream::start("a").await.unwrap();
    let gw_port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    // The pre-Service shorthand: a bare ref naming a Ballast Backend.
    std::fs::write(
        dir.path().join("all.yaml"),
        gateway(gw_port)
            + &route("web", "web.example.com", "web")
                .replace("group: ballast.dev, kind: Backend, ", "")
            + &backend("web", &[a.addr()]),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ballast"))
        .arg("validate")
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("all.yaml:")
            && text.contains("rules[0].backendRefs[0]")
            && text.contains("Add `group: ballast.dev` and `kind: Backend`"),
        "{text}"
    );
    let ballast = Ballast::serve_ready(dir.path()).await;
    let _envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-short",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let gw = loopback(gw_port);
    wait_until(T, POLL, || async {
        matches!(host_get(gw, "web.example.com").await, Ok((200, body)) if body == "a")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", ballast.log_tail()));
}
