//! Measures REST-JSON polling at N clusters (default 1,000): resident memory
//! at start, after building the snapshot (the served descriptor pool is
//! decoded for canonical versions), after the first poll (cached JSON; the
//! full pool too if something was not served), and the
//! time of a cold 200 (JSON encoded), a warm 200 (JSON cached) and a 304,
//! each over loopback HTTP/1.1 against a real `XdsServer`.
//!
//! ```sh
//! cargo run --release -p ballast-xds --example rest_poll_cost -- 1000
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use ballast_xds::{Snapshot, SnapshotCache, XdsServer, simple};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VmRSS:")?
                    .trim()
                    .strip_suffix(" kB")?
                    .parse()
                    .ok()
            })
        })
        .unwrap_or(0)
}

async fn post(addr: std::net::SocketAddr, body: &str) -> (u16, usize, Duration) {
    let started = Instant::now();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /v3/discovery:clusters HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&out);
    let code = text.get(9..12).unwrap_or("0").parse().unwrap_or(0);
    (code, out.len(), took)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1000);
    let start = rss_kib();
    let mut b = Snapshot::builder();
    for i in 0..n {
        b.message(&simple::eds_cluster(
            &format!("cluster-{i}"),
            Duration::from_secs(1),
        ))?;
    }
    let snap = b.build_unchecked()?;
    let version = snap.version(ballast_xds::ResourceType::Cluster).to_string();
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", snap);
    cache.set_ready(true);
    let server = XdsServer::builder(cache)
        .grouper(Arc::new(|_: &_| Ok("g".to_string())))
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(server.serve_with_shutdown(listener, std::future::pending::<()>()));
    let before = rss_kib();
    let (c, bytes, cold) = post(addr, r#"{"node":{"id":"n"}}"#).await;
    assert_eq!(c, 200);
    let after = rss_kib();
    let mut warm = Vec::new();
    let mut not_modified = Vec::new();
    for _ in 0..20 {
        let (c, _, t) = post(addr, r#"{"node":{"id":"n"}}"#).await;
        assert_eq!(c, 200);
        warm.push(t);
        let body = format!(r#"{{"node":{{"id":"n"}},"versionInfo":"{version}"}}"#);
        let (c, _, t) = post(addr, &body).await;
        assert_eq!(c, 304);
        not_modified.push(t);
    }
    warm.sort();
    not_modified.sort();
    println!("clusters: {n}");
    println!("response bytes: {bytes}");
    println!("RSS at start: {start} KiB");
    println!(
        "RSS before first poll: {before} KiB, after: {after} KiB (+{} KiB)",
        after.saturating_sub(before)
    );
    println!(
        "cold 200 (JSON encoded): {:.2} ms",
        cold.as_secs_f64() * 1e3
    );
    println!(
        "warm 200 (JSON cached), median of 20: {:.2} ms",
        warm[10].as_secs_f64() * 1e3
    );
    println!(
        "304, median of 20: {:.3} ms",
        not_modified[10].as_secs_f64() * 1e3
    );
    Ok(())
}
