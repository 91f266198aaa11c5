//! An xDS server fed from a file that it watches: each line of the file is
//! `cluster-name ip:port` (one endpoint; repeat the name for more). Every
//! cluster gets an EDS cluster and its endpoints; listener `http` on
//! 0.0.0.0:10000 routes every host to the first cluster. When the file
//! changes, a new snapshot is published; a file that does not parse, or
//! whose snapshot is inconsistent, is reported and the last good snapshot
//! stays served.
//!
//! ```sh
//! echo "web 127.0.0.1:8080" > /tmp/clusters.txt
//! cargo run -p ballast-xds --example file_watching_server -- 127.0.0.1:18000 /tmp/clusters.txt
//! ```
//! The file is polled (every 200 ms, by content) to stay free of platform
//! watch APIs; a real deployment would use `notify`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ballast_xds::{Snapshot, SnapshotCache, XdsServer, simple};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Parses the file into a snapshot; errors name the line.
fn snapshot_of(path: &str, text: &str) -> Result<Snapshot, BoxError> {
    let mut clusters: BTreeMap<&str, Vec<(String, u16)>> = BTreeMap::new();
    let mut first = None;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, addr) = line
            .split_once(char::is_whitespace)
            .ok_or_else(|| format!("{path}:{}: expected `cluster ip:port`", i + 1))?;
        let addr: SocketAddr = addr
            .trim()
            .parse()
            .map_err(|e| format!("{path}:{}: {e}", i + 1))?;
        first.get_or_insert(name);
        clusters
            .entry(name)
            .or_default()
            .push((addr.ip().to_string(), addr.port()));
    }
    let first = first.ok_or_else(|| format!("{path}: no cluster"))?;
    let mut b = Snapshot::builder();
    for (name, endpoints) in &clusters {
        let eps: Vec<(&str, u16)> = endpoints.iter().map(|(h, p)| (h.as_str(), *p)).collect();
        b.message(&simple::eds_cluster(name, Duration::from_secs(1)))?;
        b.message(&simple::load_assignment(name, &eps))?;
    }
    b.message(&simple::http_listener("http", "0.0.0.0", 10000, "http"))?;
    b.message(&simple::route_config("http", &[("*", &[(first, 1)])]))?;
    Ok(b.build()?)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let xds: SocketAddr = args.next().unwrap_or("127.0.0.1:18000".into()).parse()?;
    let file = PathBuf::from(args.next().ok_or("usage: file_watching_server ADDR FILE")?);
    let path = file.display().to_string();

    let cache = SnapshotCache::new();
    let publisher = cache.clone();
    tokio::spawn(async move {
        let mut last: Option<String> = None;
        loop {
            match tokio::fs::read_to_string(&file).await {
                Ok(text) if last.as_deref() != Some(text.as_str()) => {
                    match snapshot_of(&path, &text) {
                        Ok(snap) => {
                            publisher.set_snapshot("default", snap);
                            // Ready once the first good config is published.
                            publisher.set_ready(true);
                            eprintln!("published {path}");
                        }
                        Err(e) => eprintln!("{e}; keeping the last good config"),
                    }
                    last = Some(text);
                }
                Ok(_) => {}
                Err(e) => eprintln!("{path}: {e}; keeping the last good config"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });

    let server = XdsServer::builder(cache)
        .grouper(Arc::new(|_node| Ok("default".to_string())))
        .build();
    eprintln!("xDS on {xds}");
    server.serve(xds).await?;
    Ok(())
}
