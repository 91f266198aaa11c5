//! The benchmark configuration: `C` EDS clusters with `M` endpoints each, and one
//! HTTP listener whose route configuration has one virtual host per cluster.
//!
//! It is deterministic: the bench and a child server (`serve-snapshot`) apply
//! the same [`Change`]s to the same [`WorkloadSpec`] and get byte-identical
//! resources, hence the same content-hash versions. That is how the bench knows
//! which version of a resource "contains" a change without asking the server.

use std::sync::Arc;
use std::time::Duration;

use ballast_xds::envoy_types::pb::envoy::config::cluster::v3::Cluster;
use ballast_xds::envoy_types::pb::google::protobuf::Duration as PbDuration;
use ballast_xds::{Resource, ResourceType, Snapshot, SnapshotChange, simple};
use serde::Serialize;

/// Shape of the config every simulated proxy receives.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadSpec {
    pub clusters: usize,
    pub endpoints: usize,
}

/// One source change, as the bench publishes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// The endpoints of cluster `cluster` become the set numbered `counter`
    /// (globally unique, so every change yields a version never seen before).
    Endpoints { cluster: usize, counter: u64 },
    /// Every cluster's connect timeout changes: a full CDS push to every proxy.
    Global { generation: u64 },
}

impl Change {
    /// The line a child server reads on stdin.
    pub fn to_line(self) -> String {
        match self {
            Change::Endpoints { cluster, counter } => format!("ep {cluster} {counter}"),
            Change::Global { generation } => format!("global {generation}"),
        }
    }

    pub fn parse(line: &str) -> Option<Change> {
        let mut it = line.split_whitespace();
        match it.next()? {
            "ep" => Some(Change::Endpoints {
                cluster: it.next()?.parse().ok()?,
                counter: it.next()?.parse().ok()?,
            }),
            "global" => Some(Change::Global {
                generation: it.next()?.parse().ok()?,
            }),
            _ => None,
        }
    }
}

pub const LISTENER: &str = "ingress";
pub const ROUTES: &str = "ingress-routes";

pub fn cluster_name(i: usize) -> String {
    format!("svc-{i:05}")
}

/// The current config, kept as already-encoded resources so a change re-encodes
/// only what it touches (like a real control plane's incremental translation),
/// and the snapshot is patched with what a change touched ([`Snapshot::patched`],
/// O(change)), as Ballast's own pipeline does, rather than rebuilt from all
/// `2·C + 2` resources: the `serve-snapshot` child's CPU is counted as the
/// server's, so an O(config) source side would be billed to the protocol.
pub struct Workload {
    spec: WorkloadSpec,
    clusters: Vec<Arc<Resource>>,
    load_assignments: Vec<Arc<Resource>>,
    listener: Arc<Resource>,
    routes: Arc<Resource>,
    snapshot: Arc<Snapshot>,
}

fn cluster(i: usize, generation: u64) -> Cluster {
    let mut c = simple::eds_cluster(&cluster_name(i), Duration::from_secs(1));
    c.connect_timeout = Some(PbDuration {
        seconds: 1,
        nanos: ((generation % 1000) * 1_000_000) as i32,
    });
    c
}

fn load_assignment(i: usize, counter: u64, endpoints: usize) -> Arc<Resource> {
    let ips: Vec<String> = (0..endpoints)
        .map(|j| {
            if counter == 0 {
                format!("10.{}.{}.{}", (i >> 8) & 255, i & 255, j % 250 + 1)
            } else {
                // Unique per change: 16M changes before a repeat.
                format!(
                    "11.{}.{}.{}",
                    (counter >> 16) & 255,
                    (counter >> 8) & 255,
                    counter & 255
                )
            }
        })
        .collect();
    let eps: Vec<(&str, u16)> = ips
        .iter()
        .enumerate()
        .map(|(j, ip)| (ip.as_str(), 8000 + j as u16))
        .collect();
    Resource::new(&simple::load_assignment(&cluster_name(i), &eps)).expect("valid")
}

impl Workload {
    pub fn new(spec: WorkloadSpec) -> Workload {
        let names: Vec<String> = (0..spec.clusters).map(cluster_name).collect();
        let clusters = (0..spec.clusters)
            .map(|i| Resource::new(&cluster(i, 0)).expect("valid"))
            .collect();
        let load_assignments = (0..spec.clusters)
            .map(|i| load_assignment(i, 0, spec.endpoints))
            .collect();
        let hosts: Vec<(String, [(&str, u32); 1])> = names
            .iter()
            .map(|n| (format!("{n}.example.com"), [(n.as_str(), 1)]))
            .collect();
        let hosts: Vec<(&str, &[(&str, u32)])> =
            hosts.iter().map(|(d, c)| (d.as_str(), &c[..])).collect();
        let routes = Resource::new(&simple::route_config(ROUTES, &hosts)).expect("valid");
        let listener = Resource::new(&simple::http_listener(LISTENER, "0.0.0.0", 10000, ROUTES))
            .expect("valid");
        let mut w = Workload {
            spec,
            clusters,
            load_assignments,
            listener,
            routes,
            snapshot: Arc::new(Snapshot::default()),
        };
        w.rebuild();
        w
    }

    pub fn spec(&self) -> &WorkloadSpec {
        &self.spec
    }

    pub fn snapshot(&self) -> &Arc<Snapshot> {
        &self.snapshot
    }

    /// Applies a change and returns the resources it changed (type, name, version).
    pub fn apply(&mut self, change: Change) -> Vec<(ResourceType, Arc<str>, Arc<str>)> {
        let mut put = Vec::new();
        match change {
            Change::Endpoints { cluster, counter } => {
                let i = cluster % self.spec.clusters.max(1);
                let r = load_assignment(i, counter, self.spec.endpoints);
                self.load_assignments[i] = r.clone();
                put.push(r);
            }
            Change::Global { generation } => {
                for i in 0..self.spec.clusters {
                    let r = Resource::new(&cluster(i, generation)).expect("valid");
                    self.clusters[i] = r.clone();
                    put.push(r);
                }
            }
        }
        let changed = put
            .iter()
            .map(|r| (r.ty(), r.name_arc().clone(), r.version_arc().clone()))
            .collect();
        self.snapshot = Arc::new(
            Snapshot::patched(
                &self.snapshot,
                put.into_iter().map(SnapshotChange::Put),
                true,
            )
            .expect("workload snapshots are consistent"),
        );
        changed
    }

    /// The snapshot built from scratch out of every current resource (what
    /// [`Workload::apply`] kept up to date by patching).
    fn rebuild(&mut self) {
        let mut b = Snapshot::builder();
        for r in self.clusters.iter().chain(&self.load_assignments) {
            b.add(r.clone());
        }
        b.add(self.listener.clone());
        b.add(self.routes.clone());
        self.snapshot = Arc::new(b.build().expect("workload snapshots are consistent"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn changes_are_deterministic_and_new() {
        let spec = WorkloadSpec {
            clusters: 3,
            endpoints: 2,
        };
        let mut a = Workload::new(spec.clone());
        let mut b = Workload::new(spec);
        let before = a
            .snapshot()
            .version(ResourceType::ClusterLoadAssignment)
            .clone();
        let ch = Change::parse(
            &Change::Endpoints {
                cluster: 1,
                counter: 7,
            }
            .to_line(),
        )
        .unwrap();
        let ca = a.apply(ch);
        let cb = b.apply(ch);
        assert_eq!(ca, cb);
        assert_ne!(
            &before,
            a.snapshot().version(ResourceType::ClusterLoadAssignment)
        );
        assert_eq!(a.snapshot().total(), 3 + 3 + 2);
        assert_eq!(
            Change::parse("global 4"),
            Some(Change::Global { generation: 4 })
        );
    }

    /// Every resource of every type, with the per-type versions: what a proxy can
    /// observe of a snapshot.
    /// Per type: its version, and each resource's name, version and bytes.
    type Observable = Vec<(Arc<str>, Vec<(Arc<str>, Arc<str>, bytes::Bytes)>)>;

    fn observable(s: &Snapshot) -> Observable {
        ResourceType::ALL
            .iter()
            .map(|&ty| {
                let rs = s
                    .resources(ty)
                    .values()
                    .map(|r| {
                        (
                            r.name_arc().clone(),
                            r.version_arc().clone(),
                            r.any_bytes().clone(),
                        )
                    })
                    .collect();
                (s.version(ty).clone(), rs)
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The patched snapshot after any sequence of changes is the one built
        /// from scratch out of the same resources (same versions, same bytes), and
        /// each step's `changed_from` names exactly the changed resources.
        #[test]
        fn patched_equals_rebuilt(
            changes in proptest::collection::vec(
                prop_oneof![
                    (0usize..8, 0u64..40).prop_map(|(cluster, counter)| Change::Endpoints { cluster, counter }),
                    (0u64..5).prop_map(|generation| Change::Global { generation }),
                ],
                1..25,
            )
        ) {
            let spec = WorkloadSpec { clusters: 5, endpoints: 3 };
            let mut w = Workload::new(spec.clone());
            for ch in changes {
                let before = w.snapshot().clone();
                let changed = w.apply(ch);
                let patched = w.snapshot().clone();
                for ty in ResourceType::ALL {
                    let mut want: Vec<&str> = changed
                        .iter()
                        .filter(|(t, name, version)| {
                            *t == ty
                                && before.get(ty, name).map(|r| r.version()) != Some(&**version)
                        })
                        .map(|(_, n, _)| &**n)
                        .collect();
                    want.sort_unstable();
                    want.dedup();
                    let mut got: Vec<&str> = patched
                        .changed_from(ty, &before)
                        .expect("a patched snapshot knows its changes")
                        .iter()
                        .map(|n| &**n)
                        .collect();
                    got.sort_unstable();
                    prop_assert_eq!(got, want);
                }
                w.rebuild();
                prop_assert_eq!(observable(&patched), observable(w.snapshot()));
            }
        }
    }
}
