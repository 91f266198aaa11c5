//! Issue 8 §4: `ballast serve`'s limit flags reach the xDS server, and a
//! refusal is counted in `ballast_xds_limit_rejections_total{limit}`.

mod common;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn post(addr: std::net::SocketAddr, path: &str, body: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(30), s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    (text[9..12].parse().unwrap(), text)
}

#[tokio::test]
async fn rest_body_limit_flag_is_enforced_and_counted() {
    let ballast = Ballast::start(free_addr(), free_addr(), &["--max-rest-body-bytes=200"]).unwrap();
    ballast.wait_ready().await.unwrap();
    let metric = "ballast_xds_limit_rejections_total";
    assert_eq!(ballast.metric(metric).await.unwrap(), 0.0);
    let small = r#"{"node":{"id":"r","cluster":"default/quickstart"}}"#;
    let (status, text) = post(ballast.xds, "/v3/discovery:clusters", small).await;
    assert_ne!(status, 413, "{text}");
    let big = format!(
        r#"{{"node":{{"id":"r","cluster":"default/quickstart"}},"resourceNames":["{}"]}}"#,
        "x".repeat(300)
    );
    let (status, text) = post(ballast.xds, "/v3/discovery:clusters", &big).await;
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("rest_body_bytes limit of 200"), "{text}");
    let (_, body) = ballast.get("/metrics").await.unwrap();
    assert!(
        body.contains(r#"ballast_xds_limit_rejections_total{limit="rest_body_bytes"} 1"#),
        "{body}"
    );
}
