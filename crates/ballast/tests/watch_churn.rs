//! The watch-churn scenario (issue 3): a gateway that routes to every Backend;
//! the set of Backends grows and shrinks while endpoint updates for existing
//! Backends keep arriving (files written, renamed and deleted in the watched
//! directory). Every endpoint change reaches Envoy's EDS, and none is dropped or
//! held back until some unrelated change: after each write (or burst of
//! writes) the test makes no other change and waits, bounded, until Envoy holds
//! exactly the expected endpoint set for every cluster.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, wait_for};
use common::*;

/// A small deterministic PRNG (xorshift), so a failure replays exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The model of what Envoy should hold: Backend id → endpoints.
type Model = BTreeMap<usize, Vec<SocketAddr>>;

struct World {
    dir: tempfile::TempDir,
    model: Model,
    next_port: u16,
    next_id: usize,
}

impl World {
    fn file(&self, id: usize) -> std::path::PathBuf {
        self.dir.path().join(format!("svc{id}.yaml"))
    }

    /// Fresh endpoint addresses (never reused, so every change is visible).
    fn endpoints(&mut self, rng: &mut Rng) -> Vec<SocketAddr> {
        (0..1 + rng.below(3))
            .map(|_| {
                self.next_port += 1;
                loopback(self.next_port)
            })
            .collect()
    }

    /// One file per Backend: the HTTPRoute that sends `s{id}.example.com` to it, and the Backend.
    fn write(&self, id: usize) {
        let text = route(
            &format!("r{id}"),
            &format!("s{id}.example.com"),
            &format!("b{id}"),
        ) + &backend(&format!("b{id}"), &self.model[&id]);
        write_atomic(&self.file(id), &text);
    }

    fn add(&mut self, rng: &mut Rng) -> String {
        let id = self.next_id;
        self.next_id += 1;
        let eps = self.endpoints(rng);
        self.model.insert(id, eps);
        self.write(id);
        format!("add b{id}")
    }

    fn remove(&mut self, rng: &mut Rng) -> String {
        let id = *self.model.keys().nth(rng.below(self.model.len())).unwrap();
        self.model.remove(&id);
        std::fs::remove_file(self.file(id)).unwrap();
        format!("remove b{id}")
    }

    fn change(&mut self, rng: &mut Rng) -> String {
        let id = *self.model.keys().nth(rng.below(self.model.len())).unwrap();
        let eps = self.endpoints(rng);
        self.model.insert(id, eps);
        self.write(id);
        format!("endpoints of b{id}")
    }

    /// A random step; the set never shrinks below 4 Backends, so no single
    /// removal trips the blast-radius guard (max 50 %).
    fn step(&mut self, rng: &mut Rng) -> String {
        match rng.below(10) {
            0..=1 => self.add(rng),
            2..=3 if self.model.len() > 4 => self.remove(rng),
            _ => self.change(rng),
        }
    }

    fn expected(&self) -> BTreeMap<String, BTreeSet<String>> {
        self.model
            .iter()
            .map(|(id, eps)| {
                (
                    format!("default/b{id}"),
                    eps.iter().map(|a| a.to_string()).collect(),
                )
            })
            .collect()
    }
}

async fn converged(envoy: &Envoy, world: &World, what: &str) {
    let want = world.expected();
    let last = std::sync::Mutex::new(BTreeMap::new());
    let r = wait_for(T, POLL, || {
        let (want, last) = (&want, &last);
        async move {
            let got = envoy.config_summary(true).await?;
            *last.lock().unwrap() = got.endpoints.clone();
            let clusters: BTreeSet<&String> = got.clusters.iter().collect();
            if got.endpoints == *want && clusters == want.keys().collect() {
                Ok(())
            } else {
                anyhow::bail!("not yet")
            }
        }
    })
    .await;
    if r.is_err() {
        panic!(
            "after `{what}` Envoy never showed the expected EDS\nwant: {want:#?}\ngot:  {:#?}\nenvoy log:\n{}",
            last.lock().unwrap(),
            envoy.log_tail(30)
        );
    }
}

async fn scenario(mode: AdsMode, seed: u64) {
    let gw_port = ballast_testkit::free_port();
    let mut world = World {
        dir: tempfile::tempdir().unwrap(),
        model: Model::new(),
        // Endpoints are never dialled (no traffic, no health checks): any port will do.
        next_port: 30000,
        next_id: 0,
    };
    let mut rng = Rng(seed);
    std::fs::write(world.dir.path().join("gateway.yaml"), gateway(gw_port)).unwrap();
    for _ in 0..8 {
        world.add(&mut rng);
    }
    let dir: &Path = world.dir.path();
    let ballast = Ballast::start(
        free_addr(),
        free_addr(),
        &["--config", dir.to_str().unwrap()],
    )
    .unwrap();
    ballast.wait_ready().await.unwrap();
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-churn",
        "default/edge",
        mode,
    ))
    .await
    .unwrap();
    converged(&envoy, &world, "start").await;

    let mut adds = 0;
    let mut removes = 0;
    let mut changes = 0;
    for round in 0..60 {
        // Every third round is a burst: several writes in quick succession
        // (within one debounce period), sometimes to the same file twice.
        let writes = if round % 3 == 2 { 2 + rng.below(3) } else { 1 };
        let mut what = Vec::new();
        for _ in 0..writes {
            let w = world.step(&mut rng);
            match w.split(' ').next() {
                Some("add") => adds += 1,
                Some("remove") => removes += 1,
                _ => changes += 1,
            }
            what.push(w);
        }
        converged(&envoy, &world, &what.join(", ")).await;
    }
    assert!(
        adds > 3 && removes > 3 && changes > 10,
        "the sequence exercises growth, shrinkage and endpoint churn: {adds} {removes} {changes}"
    );
    // Nothing was rejected or held along the way.
    assert_eq!(
        ballast.metric("ballast_xds_nacks_total").await.unwrap(),
        0.0
    );
    assert_eq!(
        ballast.metric("ballast_guard_holds_total").await.unwrap(),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_churn_sotw() {
    scenario(AdsMode::Grpc, 0x9e37_79b9_7f4a_7c15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_churn_delta() {
    scenario(AdsMode::DeltaGrpc, 0xd1b5_4a32_d192_ed03).await;
}
