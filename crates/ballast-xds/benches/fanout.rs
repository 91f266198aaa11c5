//! Micro-benchmark: snapshot build, per-stream diff and fan-out, and wire
//! framing, for a 1,000-cluster config (run: `cargo bench -p ballast-xds`).

use std::sync::Arc;
use std::time::Duration;

use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DiscoveryRequest,
};
use ballast_xds::internals::DeltaMachine;
use ballast_xds::internals::SotwMachine;
use ballast_xds::internals::WireMessage;
use ballast_xds::{ResourceType, Snapshot, simple};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};

const CLUSTERS: usize = 1000;

fn snapshot(changed_port: u16) -> Snapshot {
    let mut b = Snapshot::builder();
    let names: Vec<String> = (0..CLUSTERS).map(|i| format!("c{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        b.message(&simple::eds_cluster(n, Duration::from_secs(1)))
            .unwrap();
        let port = if i == 0 { changed_port } else { 8000 };
        let eps: Vec<(&str, u16)> = (0..10).map(|_| ("127.0.0.1", port)).collect();
        b.message(&simple::load_assignment(n, &eps)).unwrap();
    }
    let targets: Vec<(&str, u32)> = names.iter().take(10).map(|n| (n.as_str(), 1)).collect();
    b.message(&simple::http_listener("l", "0.0.0.0", 10000, "r"))
        .unwrap();
    b.message(&simple::route_config("r", &[("*", &targets)]))
        .unwrap();
    b.build().unwrap()
}

fn bench(c: &mut Criterion) {
    c.bench_function("snapshot_build_1000_clusters", |b| b.iter(|| snapshot(1)));

    let s1 = Arc::new(snapshot(1));
    let s2 = Arc::new(snapshot(2));
    let eds_names: Vec<String> = (0..CLUSTERS).map(|i| format!("c{i}")).collect();

    // One endpoint change, pushed to 100 SotW streams: each computes its diff.
    c.bench_function("sotw_fanout_one_eds_change_100_streams", |b| {
        b.iter_batched(
            || {
                (0..100)
                    .map(|_| {
                        let mut m = SotwMachine::new(None);
                        m.set_snapshot(Some(s1.clone()));
                        m.handle_request(&DiscoveryRequest {
                            type_url: ResourceType::ClusterLoadAssignment.type_url().into(),
                            resource_names: eds_names.clone(),
                            ..Default::default()
                        });
                        let r = m.next_response().unwrap();
                        m.handle_request(&DiscoveryRequest {
                            type_url: ResourceType::ClusterLoadAssignment.type_url().into(),
                            resource_names: eds_names.clone(),
                            version_info: r.version.to_string(),
                            response_nonce: r.nonce.to_string(),
                            ..Default::default()
                        });
                        m
                    })
                    .collect::<Vec<_>>()
            },
            |mut ms| {
                for m in &mut ms {
                    m.set_snapshot(Some(s2.clone()));
                    let r = m.next_response().unwrap();
                    let mut buf = Vec::with_capacity(r.encoded_len());
                    r.encode_raw(&mut buf);
                }
            },
            BatchSize::LargeInput,
        )
    });

    c.bench_function("delta_fanout_one_eds_change_100_streams", |b| {
        b.iter_batched(
            || {
                (0..100)
                    .map(|_| {
                        let mut m = DeltaMachine::new(None);
                        m.set_snapshot(Some(s1.clone()));
                        m.handle_request(&DeltaDiscoveryRequest {
                            type_url: ResourceType::ClusterLoadAssignment.type_url().into(),
                            resource_names_subscribe: eds_names.clone(),
                            ..Default::default()
                        });
                        let r = m.next_response().unwrap();
                        m.handle_request(&DeltaDiscoveryRequest {
                            type_url: ResourceType::ClusterLoadAssignment.type_url().into(),
                            response_nonce: r.nonce.to_string(),
                            ..Default::default()
                        });
                        m
                    })
                    .collect::<Vec<_>>()
            },
            |mut ms| {
                for m in &mut ms {
                    m.set_snapshot(Some(s2.clone()));
                    let r = m.next_response().unwrap();
                    assert_eq!(r.resources.len(), 1);
                    let mut buf = Vec::with_capacity(r.encoded_len());
                    r.encode_raw(&mut buf);
                }
            },
            BatchSize::LargeInput,
        )
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
