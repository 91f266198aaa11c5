//! Access logs with real Envoy: one JSON line per request on stdout by default, or in a file
//! named by the Gateway's `ballast.dev/access-log` annotation; asserted field by field.

mod common;

use std::path::Path;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, Upstream, wait_for, wait_until};
use common::*;

/// The JSON access log lines in `path` whose `path` field is `want_path`.
fn lines_for(path: &Path, want_path: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["path"] == want_path)
        .collect()
}

async fn serve(
    gateway_yaml: String,
    up: &Upstream,
    node: &str,
) -> (Ballast, Envoy, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("all.yaml"),
        gateway_yaml + &route("web", "web.example.com", "web") + &backend("web", &[up.addr()]),
    )
    .unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        node,
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    (ballast, envoy, dir)
}

fn assert_line(v: &serde_json::Value, path: &str, up: &Upstream) {
    assert_eq!(v["method"], "GET", "{v}");
    assert_eq!(v["path"], path, "{v}");
    assert_eq!(v["protocol"], "HTTP/1.1", "{v}");
    assert_eq!(v["authority"], "web.example.com", "{v}");
    assert_eq!(v["status"], 200, "{v}");
    assert_eq!(v["response_flags"], "-", "{v}");
    assert_eq!(v["bytes_sent"], 3, "{v}"); // body "web"
    assert_eq!(v["upstream_host"], up.addr().to_string(), "{v}");
    assert_eq!(v["upstream_cluster"], "default/web", "{v}");
    assert_eq!(v["route"], "default/web/0/0", "{v}");
    assert_eq!(v["gateway"], "default/edge", "{v}");
    assert!(
        v["client"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{v}"
    );
    assert!(v["duration_ms"].is_number(), "{v}");
    assert!(v["start_time"].as_str().unwrap().starts_with("20"), "{v}");
    assert!(!v["request_id"].as_str().unwrap().is_empty(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_access_log_is_a_json_line_on_stdout() {
    let up = Upstream::start("web").await.unwrap();
    let gw_port = ballast_testkit::free_port();
    let (_ballast, envoy, _dir) = serve(gateway(gw_port), &up, "envoy-log-stdout").await;
    let gw = loopback(gw_port);
    wait_until(T, POLL, || async {
        matches!(host_get(gw, "web.example.com").await, Ok((200, _)))
    })
    .await
    .unwrap();
    let stdout = envoy.dir().join("stdout.log");
    let mut s = tokio::net::TcpStream::connect(gw).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(b"GET /logged?x=1 HTTP/1.1\r\nHost: web.example.com\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let line = wait_for(T, POLL, || async {
        lines_for(&stdout, "/logged?x=1")
            .pop()
            .ok_or_else(|| anyhow::anyhow!("no line yet"))
    })
    .await
    .unwrap();
    assert_line(&line, "/logged?x=1", &up);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_annotation_sends_the_log_to_a_file() {
    let up = Upstream::start("web").await.unwrap();
    let gw_port = ballast_testkit::free_port();
    let logs = tempfile::tempdir().unwrap();
    let file = logs.path().join("access.log");
    let gw_yaml = gateway(gw_port).replace(
        "metadata: { name: edge }",
        &format!(
            "metadata: {{ name: edge, annotations: {{ ballast.dev/access-log: \"{}\" }} }}",
            file.display()
        ),
    );
    let (_ballast, envoy, _dir) = serve(gw_yaml, &up, "envoy-log-file").await;
    let gw = loopback(gw_port);
    wait_until(T, POLL, || async {
        matches!(host_get(gw, "web.example.com").await, Ok((200, _)))
    })
    .await
    .unwrap();
    let line = wait_for(T, POLL, || async {
        lines_for(&file, "/")
            .pop()
            .ok_or_else(|| anyhow::anyhow!("no line yet"))
    })
    .await
    .unwrap();
    assert_line(&line, "/", &up);
    // Not on stdout as well.
    assert!(lines_for(&envoy.dir().join("stdout.log"), "/").is_empty());
}
