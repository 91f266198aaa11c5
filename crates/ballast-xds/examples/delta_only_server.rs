//! A Delta-only xDS server: Delta ADS (and per-type Delta) is served, while
//! State-of-the-World streams and Fetch are refused with `UNIMPLEMENTED`, so
//! an Envoy bootstrapped for SotW fails loudly instead of being served.
//!
//! ```sh
//! cargo run -p ballast-xds --example delta_only_server -- 127.0.0.1:18000 127.0.0.1:8080
//! ```
//! Bootstrap Envoy with `api_type: DELTA_GRPC` for `ads_config`. Every node gets
//! cluster `web` (endpoint: the second argument), listener `http` on
//! 0.0.0.0:10000 and its route configuration.

use std::net::SocketAddr;
use std::time::Duration;

use ballast_xds::{Snapshot, SnapshotCache, XdsServer, simple};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut args = std::env::args().skip(1);
    let xds: SocketAddr = args.next().unwrap_or("127.0.0.1:18000".into()).parse()?;
    let upstream: SocketAddr = args.next().unwrap_or("127.0.0.1:8080".into()).parse()?;

    let snapshot = Snapshot::builder()
        .with(&simple::eds_cluster("web", Duration::from_secs(1)))?
        .with(&simple::load_assignment(
            "web",
            &[(&upstream.ip().to_string(), upstream.port())],
        ))?
        .with(&simple::http_listener("http", "0.0.0.0", 10000, "http"))?
        .with(&simple::route_config("http", &[("*", &[("web", 1)])]))?
        .build()?;

    let cache = SnapshotCache::new();
    cache.set_snapshot("default", snapshot);
    cache.set_ready(true);

    let server = XdsServer::builder(cache)
        .grouper(std::sync::Arc::new(|_node| Ok("default".to_string())))
        .sotw(false)
        .build();
    eprintln!("Delta xDS on {xds}");
    server.serve(xds).await?;
    Ok(())
}
