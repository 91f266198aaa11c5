//! Issue 2 — another real xDS client: Python `grpcio` resolving `xds:///greeter`
//! through our server (proxyless gRPC: LDS API listener → RDS → CDS → EDS).
//!
//! gRPC's xDS client speaks State-of-the-World ADS only (no Delta), so this
//! runs once. The Python side is `tests/support/grpc_xds.py`, run with the
//! project venv's interpreter (`$BALLAST_PYTHON`, else `<workspace>/.venv`,
//! where `scripts/test` installs `grpcio`); a missing interpreter or grpcio
//! fails the test with instructions, never skips it.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use ballast_xds::envoy_types::pb::envoy::config::core::v3::Locality;
use ballast_xds::envoy_types::pb::google::protobuf::UInt32Value;
use ballast_xds::{ResourceType, Snapshot, SnapshotCache, SyncState, simple};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const T: Duration = Duration::from_secs(60);
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/grpc_xds.py");
const NODE: &str = "python-grpc-client";

fn python() -> PathBuf {
    let p = std::env::var_os("BALLAST_PYTHON")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| ballast_testkit::workspace_root().join(".venv/bin/python"));
    assert!(
        p.is_file(),
        "Python not found at {}: run scripts/test (it creates the project venv with grpcio) \
         or set BALLAST_PYTHON",
        p.display()
    );
    p
}

/// A Python gRPC server answering `NAME: <message>`; killed on drop.
struct PyServer {
    port: u16,
    _child: Child,
}

async fn py_server(name: &str) -> PyServer {
    let mut child = Command::new(python())
        .arg(SCRIPT)
        .args(["server", name])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the Python gRPC server");
    let stdout = child.stdout.take().unwrap();
    let line = tokio::time::timeout(T, BufReader::new(stdout).lines().next_line())
        .await
        .expect("the Python server prints its port")
        .unwrap()
        .expect("a port line (is grpcio installed? run scripts/test)");
    PyServer {
        port: line.trim().parse().expect("a port number"),
        _child: child,
    }
}

/// Calls `target` from a fresh Python process; returns the reply or what went wrong.
/// `wait` bounds how long the client waits for its channel to become ready.
async fn py_call(
    xds: std::net::SocketAddr,
    target: &str,
    message: &str,
    wait: Duration,
) -> Result<String, String> {
    let bootstrap = serde_json::json!({
        "xds_servers": [{
            "server_uri": xds.to_string(),
            "channel_creds": [{ "type": "insecure" }],
            "server_features": ["xds_v3"],
        }],
        "node": { "id": NODE, "cluster": "g" },
    });
    let out = Command::new(python())
        .arg(SCRIPT)
        .args(["client", target, message, &wait.as_secs_f64().to_string()])
        .env("GRPC_XDS_BOOTSTRAP_CONFIG", bootstrap.to_string())
        .env_remove("GRPC_XDS_BOOTSTRAP")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(T, out)
        .await
        .map_err(|_| "the Python client did not finish".to_string())?
        .map_err(|e| format!("run the Python client: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "client failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// What a proxyless gRPC client needs for `xds:///greeter`: an API listener
/// named like the target, its route configuration, an EDS cluster and its
/// endpoints (gRPC insists on a locality, and ignores unweighted ones).
fn greeter_snapshot(port: u16) -> Snapshot {
    let mut endpoints = simple::load_assignment("greeter-cluster", &[("127.0.0.1", port)]);
    endpoints.endpoints[0].locality = Some(Locality {
        region: "local".into(),
        ..Default::default()
    });
    endpoints.endpoints[0].load_balancing_weight = Some(UInt32Value { value: 1 });
    let mut b = Snapshot::builder();
    b.message(&simple::api_listener("greeter", "greeter-routes"))
        .unwrap();
    b.message(&simple::route_config(
        "greeter-routes",
        &[("*", &[("greeter-cluster", 1)])],
    ))
    .unwrap();
    b.message(&simple::eds_cluster(
        "greeter-cluster",
        Duration::from_secs(1),
    ))
    .unwrap();
    b.message(&endpoints).unwrap();
    b.build()
        .expect("consistent: the API listener references its routes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpc_resolves_xds_target_through_our_server() {
    let one = py_server("one").await;
    let two = py_server("two").await;
    let cache = SnapshotCache::new();
    cache.set_snapshot("g", greeter_snapshot(one.port));
    cache.set_ready(true);
    let server = common::start(cache.clone(), Duration::from_secs(30)).await;

    let reply = py_call(server.addr, "xds:///greeter", "hello", T / 2).await;
    assert_eq!(reply.as_deref(), Ok("one: hello"), "{reply:?}");
    // The client resolved through us: all four types requested and ACKed.
    let node = server
        .server
        .registry()
        .node(NODE)
        .expect("the gRPC client connected");
    let states: Vec<(ResourceType, SyncState)> =
        node.types.iter().map(|t| (t.ty, t.state)).collect();
    assert_eq!(
        states,
        vec![
            (ResourceType::Cluster, SyncState::Synced),
            (ResourceType::ClusterLoadAssignment, SyncState::Synced),
            (ResourceType::Listener, SyncState::Synced),
            (ResourceType::RouteConfiguration, SyncState::Synced),
        ]
    );

    // Move the endpoints: the next resolution lands on the other server.
    cache.set_snapshot("g", greeter_snapshot(two.port));
    let reply = py_call(server.addr, "xds:///greeter", "again", T / 2).await;
    assert_eq!(reply.as_deref(), Ok("two: again"), "{reply:?}");

    // An unknown target fails (no listener `nobody`), rather than resolving to something else.
    let reply = py_call(server.addr, "xds:///nobody", "x", Duration::from_secs(3)).await;
    let err = reply.expect_err("xds:///nobody must not resolve");
    assert!(
        err.contains("DEADLINE_EXCEEDED") || err.contains("UNAVAILABLE"),
        "{err}"
    );
    server.stop().await;
}
