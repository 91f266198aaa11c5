//! A minimal xDS server with a static snapshot — copy this to embed `ballast-xds`.
//!
//! ```sh
//! cargo run -p ballast-xds --example static_server -- 127.0.0.1:18000 127.0.0.1:8080
//! ```
//! Envoy nodes with any id get: listener `http` on 0.0.0.0:10000, routing every
//! host to cluster `web`, whose endpoint is the second argument.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ballast_xds::NodeGrouper;
use ballast_xds::{Snapshot, SnapshotCache, XdsServer, simple};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut args = std::env::args().skip(1);
    let xds: SocketAddr = args.next().unwrap_or("127.0.0.1:18000".into()).parse()?;
    let upstream: SocketAddr = args.next().unwrap_or("127.0.0.1:8080".into()).parse()?;

    // 1. Build a consistent snapshot: build() refuses dangling references.
    let snapshot = Snapshot::builder()
        .with(&simple::eds_cluster("web", Duration::from_secs(1)))?
        .with(&simple::load_assignment(
            "web",
            &[(&upstream.ip().to_string(), upstream.port())],
        ))?
        .with(&simple::http_listener("http", "0.0.0.0", 10000, "http"))?
        .with(&simple::route_config("http", &[("*", &[("web", 1)])]))?
        .build()?;

    // 2. Publish it for a group. Every node is in group "default" here.
    let cache = SnapshotCache::new();
    cache.set_snapshot("default", snapshot);
    // 3. Open the gate: until then requests are held, never answered.
    cache.set_ready(true);

    let grouper: NodeGrouper = Arc::new(|_node| Ok("default".to_string()));
    let server = XdsServer::builder(cache).grouper(grouper).build();
    eprintln!("xDS on {xds} (gRPC ADS/SotW/Delta, REST-JSON, CSDS)");
    server.serve(xds).await?;
    Ok(())
}
