//! Runs each program in `examples/` as a user would (`cargo run --example`)
//! and checks it serves what its doc comment says, over real gRPC. The
//! binaries are built by `cargo test` (all targets) or
//! `cargo build -p ballast-xds --examples`.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ballast_xds::ResourceType;
use ballast_xds::envoy_types::pb::envoy::config::cluster::v3::Cluster;
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use prost::Message;

use common::client::{Delta, Sotw};

/// An example process, killed (by pid) when dropped.
struct Example(Child);

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn example_binary(name: &str) -> PathBuf {
    // target/debug/deps/examples-<hash> → target/debug/examples/<name>
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p ballast-xds --examples` first",
        bin.display()
    );
    bin
}

/// Starts `name` with `args` and waits (bounded) until `addr` accepts.
async fn start(name: &str, args: &[&str], addr: SocketAddr) -> Example {
    let child = Command::new(example_binary(name))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let ex = Example(child);
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return ex;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("example {name} did not listen on {addr}");
}

fn addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], ballast_testkit::free_port()))
}

fn sotw_clusters(resp: &DiscoveryResponse) -> Vec<String> {
    let mut v: Vec<String> = resp
        .resources
        .iter()
        .map(|a| Cluster::decode(a.value.as_slice()).unwrap().name)
        .collect();
    v.sort();
    v
}

fn delta_names(resp: &DeltaDiscoveryResponse) -> Vec<String> {
    let mut v: Vec<String> = resp.resources.iter().map(|r| r.name.clone()).collect();
    v.sort();
    v
}

#[tokio::test]
async fn static_server_serves_its_snapshot() {
    let xds = addr();
    let _ex = start("static_server", &[&xds.to_string(), "127.0.0.1:8080"], xds).await;
    let mut c = Sotw::connect(xds, "any-node").await;
    c.request(ResourceType::Cluster, &[], "", "").await;
    assert_eq!(sotw_clusters(&c.recv().await), ["web"]);
}

#[tokio::test]
async fn delta_only_server_serves_delta_and_refuses_sotw() {
    let xds = addr();
    let _ex = start(
        "delta_only_server",
        &[&xds.to_string(), "127.0.0.1:8080"],
        xds,
    )
    .await;
    let mut d = Delta::connect(xds, "any-node").await;
    d.subscribe(ResourceType::Cluster, &["*"], &[]).await;
    assert_eq!(delta_names(&d.recv().await), ["web"]);

    // SotW is refused with UNIMPLEMENTED naming the protocol.
    let mut client = AggregatedDiscoveryServiceClient::new(common::client::channel(xds).await);
    let req = DiscoveryRequest {
        type_url: ResourceType::Cluster.type_url().into(),
        node: Some(common::client::node("n")),
        ..Default::default()
    };
    let status = match client
        .stream_aggregated_resources(tokio_stream::iter([req]))
        .await
    {
        Err(s) => s,
        Ok(resp) => resp.into_inner().message().await.unwrap_err(),
    };
    assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
    assert!(
        status.message().contains("State-of-the-World"),
        "{status:?}"
    );
}

#[tokio::test]
async fn file_watching_server_follows_the_file_and_keeps_the_last_good_config() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("clusters.txt");
    std::fs::write(&file, "web 127.0.0.1:8080\n").unwrap();
    let xds = addr();
    let _ex = start(
        "file_watching_server",
        &[&xds.to_string(), file.to_str().unwrap()],
        xds,
    )
    .await;
    let mut c = Sotw::connect(xds, "any-node").await;
    c.request(ResourceType::Cluster, &[], "", "").await;
    let first = c.recv().await;
    assert_eq!(sotw_clusters(&first), ["web"]);
    c.ack(&first, &[]).await;

    // A bad file is reported and changes nothing.
    std::fs::write(&file, "web not-an-address\n").unwrap();
    c.expect_quiet().await;

    // A good edit is published.
    std::fs::write(&file, "web 127.0.0.1:8080\napi 127.0.0.1:8081\n").unwrap();
    let second = c.recv().await;
    assert_eq!(sotw_clusters(&second), ["api", "web"]);
}
