//! A seeded fault-schedule soak with real Envoy: the whole failure class at once.
//!
//! Each fault (restart, disconnect, failover, bad input, the guard) has its own end-to-end
//! test; production produces them in random order and combination. This test drives two
//! `ballast serve` replicas (file source, one config directory, each its own state dir)
//! behind a round-robin [`TcpProxy`], and two real Envoys (one SotW ADS, one Delta ADS, each
//! its own Gateway) through it, through a schedule of steps drawn from a seed: SIGKILL or
//! SIGTERM and restart of a replica, every xDS connection cut, a replica taking over alone,
//! bad edits (YAML syntax error, a route naming a missing Backend, an invalid route next to a
//! good edit, a file deleting most routes so the guard holds; a replica restarted into an
//! invalid route or a broken file, which serves their last good versions from its state dir)
//! and good edits (add, remove, move routes; bursts of them).
//!
//! After every step: no non-2xx on the stable hosts (steady traffic through both Envoys), no
//! listener removed and no LDS/CDS update rejected, and once settled each Envoy serves exactly
//! what the test's model says the last *good* config is (200 with the right upstream, 404 for
//! removed hosts, 500 for a route to a missing Backend), with every replica ready.
//!
//! `BALLAST_SOAK_SEED=<n>` replays a schedule (the seed and each step are printed);
//! `BALLAST_SOAK_STEPS=<n>` makes it longer (default 12).

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail, ensure};
use ballast_testkit::{
    AdsMode, Envoy, EnvoyConfig, TcpProxy, Traffic, TrafficConfig, Upstream, wait_for, wait_until,
};
use common::*;

/// Hosts no step ever touches: steady traffic goes to them for the whole run.
const STABLE: usize = 4;
/// Hosts `h{i}` that steps add, remove, move and break.
const POOL: usize = 24;
/// Bounds on how many pool routes exist, so the guard's mass deletion always removes more
/// than half of a gateway's routes and a good edit never does.
const MIN_ROUTES: usize = 10;
const MAX_ROUTES: usize = 22;
const UPSTREAMS: [&str; 3] = ["u0", "u1", "u2"];
const DEFAULT_SEED: u64 = 0x5eed_0001;
const DEFAULT_STEPS: usize = 12;

/// splitmix64: deterministic, no dependency, good enough to pick steps.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

/// What a pool route points at.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Target {
    /// Backend `b{n}` → upstream `u{n}`: 200 with body `u{n}`.
    Up(usize),
    /// A Backend that does not exist: the route stays, every request answers 500.
    Missing,
}

/// The last good config: pool host index → target (absent: 404).
type Model = BTreeMap<usize, Target>;

/// What a step did to the routes file, for the settle check.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Disk {
    /// The file is the model.
    Good,
    /// The file has a YAML syntax error (left by a bad edit): ballast keeps its last good
    /// objects, and a replica restarted now serves them from its state dir (`last-good/`).
    Syntax,
    /// One route in the file is invalid (it keeps its last good version, also in a replica
    /// restarted meanwhile: from its state dir).
    Invalid,
}

#[derive(Clone, Copy, Debug)]
enum Step {
    /// SIGKILL replica k and restart it; with `edit`, a good edit lands while it is down.
    Kill(usize, bool),
    Term(usize),
    CutAll,
    Takeover(usize),
    SyntaxError {
        leave: bool,
    },
    /// A YAML syntax error on disk while replica k restarts: it serves that file's last good
    /// objects from its state dir ("restored from state"), so nothing is removed and its guard
    /// has nothing to hold.
    RestartOnSyntaxError(usize),
    MissingBackend,
    InvalidRouteWithGoodEdit,
    MassDelete,
    GoodEdit,
    Burst(usize),
}

fn pick(rng: &mut Rng) -> Step {
    match rng.below(11) {
        0 => Step::Kill(rng.below(2), rng.coin()),
        1 => Step::Term(rng.below(2)),
        2 => Step::CutAll,
        3 => Step::Takeover(rng.below(2)),
        4 => Step::SyntaxError { leave: rng.coin() },
        5 => Step::MissingBackend,
        6 => Step::InvalidRouteWithGoodEdit,
        7 => Step::MassDelete,
        8 => Step::GoodEdit,
        9 => Step::RestartOnSyntaxError(rng.below(2)),
        _ => Step::Burst(2 + rng.below(4)),
    }
}

fn env_num(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let parsed = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    Some(parsed.unwrap_or_else(|e| panic!("{name}={v}: {e}")))
}

fn two_gateways(ports: [u16; 2]) -> String {
    let gw = |name: &str, port: u16| {
        format!(
            "---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: {name} }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - {{ name: http, port: {port}, protocol: HTTP }}
"
        )
    };
    gw("edge", ports[0]) + &gw("edge2", ports[1])
}

/// An HTTPRoute attached to both gateways.
fn route2(name: &str, host: &str, backend: &str) -> String {
    format!(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name} }}
spec:
  parentRefs: [{{ name: edge }}, {{ name: edge2 }}]
  hostnames: [{host}]
  rules:
  - backendRefs: [{{ group: ballast.dev, kind: Backend, name: {backend} }}]
"
    )
}

fn pool_route(i: usize, t: Target) -> String {
    let backend = match t {
        Target::Up(n) => format!("b{n}"),
        Target::Missing => "missing".to_owned(),
    };
    route2(&format!("r{i}"), &format!("h{i}.example.com"), &backend)
}

fn routes_text(model: &Model) -> String {
    model.iter().map(|(i, t)| pool_route(*i, *t)).collect()
}

/// A good change to `model`: add, remove or move one pool route, within the bounds.
fn good_change(rng: &mut Rng, model: &mut Model) -> String {
    let present: Vec<usize> = model.keys().copied().collect();
    let absent: Vec<usize> = (0..POOL).filter(|i| !model.contains_key(i)).collect();
    loop {
        match rng.below(3) {
            0 if present.len() < MAX_ROUTES => {
                let i = absent[rng.below(absent.len())];
                let n = rng.below(UPSTREAMS.len());
                model.insert(i, Target::Up(n));
                return format!("add h{i} -> u{n}");
            }
            1 if present.len() > MIN_ROUTES => {
                let i = present[rng.below(present.len())];
                model.remove(&i);
                return format!("remove h{i}");
            }
            2 => {
                let i = present[rng.below(present.len())];
                let n = rng.below(UPSTREAMS.len());
                model.insert(i, Target::Up(n));
                return format!("move h{i} -> u{n}");
            }
            _ => {}
        }
    }
}

struct Replica {
    xds: SocketAddr,
    admin: SocketAddr,
    state: tempfile::TempDir,
    proc: Option<Ballast>,
}

struct Soak {
    config: PathBuf,
    routes: PathBuf,
    replicas: Vec<Replica>,
    proxy: TcpProxy,
    envoys: Vec<Envoy>,
    gws: [SocketAddr; 2],
    model: Model,
    disk: Disk,
}

impl Soak {
    fn start_replica(&mut self, k: usize) {
        let r = &self.replicas[k];
        let args = [
            "--config",
            self.config.to_str().unwrap(),
            "--state-dir",
            r.state.path().to_str().unwrap(),
            // Held removals stay held for the whole run: a step resolves its own holds.
            "--guard-settle",
            "1h",
        ];
        let b = Ballast::start(r.xds, r.admin, &args).expect("start ballast");
        self.replicas[k].proc = Some(b);
    }

    fn ballast(&self, k: usize) -> &Ballast {
        self.replicas[k].proc.as_ref().expect("replica running")
    }

    async fn wait_ready(&self, k: usize) {
        self.ballast(k).wait_ready().await.unwrap();
    }

    /// Both Envoys hold an xDS stream through the proxy again.
    async fn wait_reconnected(&self) -> Result<()> {
        wait_until(T, POLL, || async { self.proxy.live() >= self.envoys.len() }).await
    }

    async fn invariants_now(&self, traffic: &[Traffic]) -> Result<()> {
        for (t, gw) in traffic.iter().zip(self.gws) {
            let r = t.report();
            ensure!(r.failures() == 0, "stable hosts via {gw}: {r}");
        }
        for e in &self.envoys {
            for stat in [
                "listener_manager.listener_removed",
                "listener_manager.lds.update_rejected",
                "cluster_manager.cds.update_rejected",
            ] {
                let v = e.stat(stat).await?.unwrap_or(0);
                ensure!(v == 0, "envoy {}: {stat} = {v}", e.admin_addr());
            }
        }
        Ok(())
    }

    /// Once settled, each Envoy serves exactly the model, and every replica is ready.
    async fn settled(&self) -> Result<()> {
        // (gateway, host, wanted): None = 404, Some("") = 500, Some(name) = 200 from `name`.
        let mut wanted: Vec<(SocketAddr, String, Option<&str>)> = vec![];
        for gw in self.gws {
            for s in 0..STABLE {
                let up = UPSTREAMS[s % UPSTREAMS.len()];
                wanted.push((gw, format!("s{s}.example.com"), Some(up)));
            }
            for i in 0..POOL {
                let want = match self.model.get(&i) {
                    None => None,
                    Some(Target::Missing) => Some(""),
                    Some(Target::Up(n)) => Some(UPSTREAMS[*n]),
                };
                wanted.push((gw, format!("h{i}.example.com"), want));
            }
        }
        wait_for(T, POLL, || async {
            // Concurrently: one pass is ~60 requests, slow one by one on a busy machine.
            let got =
                futures::future::join_all(wanted.iter().map(|(gw, host, _)| host_get(*gw, host)))
                    .await;
            for ((gw, host, want), got) in wanted.iter().zip(got) {
                let got = got?;
                let ok = match want {
                    None => got.0 == 404,
                    Some("") => got.0 == 500,
                    Some(up) => got.0 == 200 && got.1 == *up,
                };
                ensure!(
                    ok,
                    "{gw} {host}: want {want:?} (None: 404, \"\": 500), got {got:?}"
                );
            }
            for r in &self.replicas {
                let b = r.proc.as_ref().expect("every replica runs between steps");
                let (code, body) = b.get("/readyz").await?;
                ensure!(code == 200, "replica {}: /readyz {code} {body}", r.admin);
                if self.disk == Disk::Good {
                    // The files are good: no replica still reports an error.
                    let (_, body) = b.get("/debug/sources").await?;
                    let v: serde_json::Value = serde_json::from_str(&body)?;
                    let errors = &v["sources"][0]["errors"];
                    ensure!(
                        errors == &serde_json::json!([]),
                        "replica {}: errors {errors}",
                        r.admin
                    );
                }
            }
            Ok(())
        })
        .await
    }

    /// Every running replica reports an error in the routes file (it read the bad edit).
    async fn wait_error_seen(&self) -> Result<()> {
        for r in &self.replicas {
            let b = r.proc.as_ref().expect("running");
            wait_for(T, POLL, || async {
                let (_, body) = b.get("/debug/sources").await?;
                let v: serde_json::Value = serde_json::from_str(&body)?;
                let errors = v["sources"][0]["errors"].to_string();
                ensure!(errors.contains("routes.yaml:"), "no error yet: {errors}");
                Ok(())
            })
            .await?;
        }
        Ok(())
    }

    /// Every running replica's guard holds (or no longer holds) a publish (the metric is
    /// per gateway: summed, both gateways held read 2).
    async fn wait_guard_held(&self, held: bool) -> Result<()> {
        for r in &self.replicas {
            let b = r.proc.as_ref().expect("running");
            wait_for(T, POLL, || async {
                let v = b.metric("ballast_guard_held").await?;
                ensure!(
                    (v > 0.0) == held,
                    "replica {}: ballast_guard_held {v}",
                    r.admin
                );
                Ok(())
            })
            .await?;
        }
        Ok(())
    }

    /// Replica k's stored last good routes are the model (the state lags a publish by at most
    /// a second): a restart into a broken file then restores exactly the model.
    async fn wait_state_current(&self, k: usize) -> Result<()> {
        let dir = ballast_sources::last_good::dir_in(self.replicas[k].state.path());
        wait_for(T, POLL, || async {
            let mut stored = Model::new();
            // The groups and the journal together; the routes' entries are routes.yaml's.
            for entry in ballast_sources::last_good::stored_documents(&dir) {
                let name = &entry.file;
                let (kind, ns) = (entry.kind.as_str(), entry.namespace.as_str());
                let Some(rest) = entry.name.strip_prefix('r') else {
                    continue;
                };
                if kind != "HTTPRoute" || ns != "default" {
                    continue;
                }
                let i: usize = rest.parse()?;
                let text = entry.text.as_str();
                let t = if text.contains("name: missing }") {
                    Target::Missing
                } else {
                    let n = (0..UPSTREAMS.len())
                        .find(|n| text.contains(&format!("name: b{n} }}")))
                        .ok_or_else(|| anyhow::anyhow!("{name}: r{i}: no backend"))?;
                    Target::Up(n)
                };
                ensure!(stored.insert(i, t).is_none(), "{name}: r{i} stored twice");
            }
            ensure!(
                stored == self.model,
                "replica {k}: stored {stored:?}, model {:?}",
                self.model
            );
            Ok(())
        })
        .await
    }

    fn write_routes(&mut self, text: &str) {
        write_atomic(&self.routes, text);
    }

    fn write_model(&mut self) {
        let text = routes_text(&self.model);
        self.write_routes(&text);
        self.disk = Disk::Good;
    }

    /// SIGTERM replica k, wait for it to exit, start it again.
    async fn terminate_restart(&mut self, k: usize) -> Result<()> {
        self.wait_state_current(k).await?;
        let mut b = self.replicas[k].proc.take().expect("running");
        b.terminate();
        if b.wait_exit(T).is_none() {
            bail!("replica {k} did not exit after SIGTERM:\n{}", b.log_tail());
        }
        drop(b);
        // Envoys on the dead replica reconnect (round-robin may land on it: refused, retried).
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.start_replica(k);
        self.wait_ready(k).await;
        self.wait_reconnected().await
    }

    async fn run(&mut self, rng: &mut Rng, step: Step) -> Result<String> {
        Ok(match step {
            Step::Kill(k, edit) => {
                self.wait_state_current(k).await?;
                let mut b = self.replicas[k].proc.take().expect("running");
                b.kill();
                drop(b);
                let what = if edit {
                    let what = good_change(rng, &mut self.model);
                    self.write_model();
                    format!(", {what} while it is down")
                } else {
                    String::new()
                };
                self.proxy.cut_all();
                self.start_replica(k);
                self.wait_ready(k).await;
                self.wait_reconnected().await?;
                format!("SIGKILL replica {k}, cut streams{what}, restart")
            }
            Step::Term(k) => {
                self.terminate_restart(k).await?;
                format!("SIGTERM + restart replica {k}")
            }
            Step::CutAll => {
                let n = self.proxy.cut_all();
                self.wait_reconnected().await?;
                format!("cut {n} xDS connections")
            }
            Step::Takeover(k) => {
                let all = self.proxy.backends();
                self.proxy.set_backends(vec![self.replicas[k].xds]);
                let n = self.proxy.cut_all();
                self.wait_reconnected().await?;
                // Everything now on replica k: it serves the model alone.
                self.settled().await?;
                self.proxy.set_backends(all);
                format!("replica {k} takes over ({n} streams cut)")
            }
            Step::SyntaxError { leave } => {
                let text = routes_text(&self.model) + "---\nkind: HTTPRoute\n  metadata: [\n";
                self.write_routes(&text);
                self.disk = Disk::Syntax;
                self.wait_error_seen().await?;
                self.settled().await?;
                if !leave {
                    self.write_model();
                }
                format!("YAML syntax error (left on disk: {leave})")
            }
            Step::RestartOnSyntaxError(k) => {
                let text = routes_text(&self.model) + "---\nkind: HTTPRoute\n  metadata: [\n";
                self.write_routes(&text);
                self.disk = Disk::Syntax;
                self.wait_error_seen().await?;
                self.wait_state_current(k).await?;
                let mut b = self.replicas[k].proc.take().expect("running");
                b.kill();
                drop(b);
                // Both Envoys on the restarted replica alone: it must serve the broken file's
                // objects from its state, so there is no removal for the guard to hold.
                let all = self.proxy.backends();
                self.proxy.set_backends(vec![self.replicas[k].xds]);
                self.proxy.cut_all();
                self.start_replica(k);
                self.wait_ready(k).await;
                self.wait_reconnected().await?;
                let b = self.ballast(k);
                let (_, body) = b.get("/debug/sources").await?;
                ensure!(
                    body.contains("routes.yaml:1:1: restored from state"),
                    "restarted replica {k}: {body}"
                );
                self.settled().await?;
                let v = b.metric("ballast_guard_held").await?;
                ensure!(v == 0.0, "restarted replica {k}: ballast_guard_held {v}");
                self.proxy.set_backends(all);
                self.write_model();
                self.wait_guard_held(false).await?;
                format!("YAML syntax error, SIGKILL + restart replica {k} (restored), fix")
            }
            Step::MissingBackend => {
                let present: Vec<usize> = self.model.keys().copied().collect();
                let i = present[rng.below(present.len())];
                self.model.insert(i, Target::Missing);
                self.write_model();
                format!("h{i} -> missing Backend")
            }
            Step::InvalidRouteWithGoodEdit => {
                let present: Vec<usize> = self.model.keys().copied().collect();
                let bad = present[rng.below(present.len())];
                let kept = self.model[&bad];
                let what = loop {
                    let mut m = self.model.clone();
                    let what = good_change(rng, &mut m);
                    if m.get(&bad) == Some(&kept) {
                        self.model = m;
                        break what;
                    }
                };
                // The bad route points elsewhere, with an unknown field: it keeps its old version.
                let mut text = String::new();
                for (i, t) in &self.model {
                    if *i == bad {
                        let r = pool_route(*i, Target::Up((bad + 1) % UPSTREAMS.len()));
                        text.push_str(&r.replace("spec:\n", "spec:\n  bogus: 1\n"));
                    } else {
                        text.push_str(&pool_route(*i, *t));
                    }
                }
                self.write_routes(&text);
                self.disk = Disk::Invalid;
                self.wait_error_seen().await?;
                self.settled().await?;
                // A replica restarted into the invalid route serves its last good version from
                // its state dir: the Envoys it serves keep the route (no rng draw: seeds replay).
                let k = bad % self.replicas.len();
                self.wait_state_current(k).await?;
                let mut b = self.replicas[k].proc.take().expect("running");
                b.kill();
                drop(b);
                // Both Envoys on the restarted replica alone.
                let all = self.proxy.backends();
                self.proxy.set_backends(vec![self.replicas[k].xds]);
                self.proxy.cut_all();
                self.start_replica(k);
                self.wait_ready(k).await;
                self.wait_reconnected().await?;
                let (_, body) = self.ballast(k).get("/debug/sources").await?;
                ensure!(
                    body.contains(&format!("HTTPRoute default/r{bad}: restored from state")),
                    "restarted replica {k}: {body}"
                );
                self.settled().await?;
                self.proxy.set_backends(all);
                self.write_model();
                format!("invalid h{bad} (kept) + {what}, SIGKILL + restart replica {k} (restored)")
            }
            Step::MassDelete => {
                self.write_routes("");
                self.wait_guard_held(true).await?;
                self.settled().await?;
                self.write_model();
                self.wait_guard_held(false).await?;
                "delete every pool route: guard holds; file restored".to_owned()
            }
            Step::GoodEdit => {
                let what = good_change(rng, &mut self.model);
                self.write_model();
                what
            }
            Step::Burst(n) => {
                let mut whats = vec![];
                for _ in 0..n {
                    whats.push(good_change(rng, &mut self.model));
                    self.write_model();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                format!("burst: {}", whats.join(", "))
            }
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_soak() {
    let seed = env_num("BALLAST_SOAK_SEED").unwrap_or(DEFAULT_SEED);
    let steps = env_num("BALLAST_SOAK_STEPS").unwrap_or(DEFAULT_STEPS as u64) as usize;
    eprintln!("fault_soak: BALLAST_SOAK_SEED={seed} BALLAST_SOAK_STEPS={steps}");
    let mut rng = Rng(seed);

    let mut ups = vec![];
    for name in UPSTREAMS {
        ups.push(Upstream::start(name).await.unwrap());
    }
    let ports = [ballast_testkit::free_port(), ballast_testkit::free_port()];
    let dir = tempfile::tempdir().unwrap();
    let mut base = two_gateways(ports);
    for (n, u) in ups.iter().enumerate() {
        base.push_str(&backend(&format!("b{n}"), &[u.addr()]));
    }
    for s in 0..STABLE {
        let b = format!("b{}", s % UPSTREAMS.len());
        base.push_str(&route2(
            &format!("stable{s}"),
            &format!("s{s}.example.com"),
            &b,
        ));
    }
    std::fs::write(dir.path().join("base.yaml"), base).unwrap();
    let mut model = Model::new();
    while model.len() < (MIN_ROUTES + MAX_ROUTES) / 2 {
        model.insert(rng.below(POOL), Target::Up(rng.below(UPSTREAMS.len())));
    }
    let routes = dir.path().join("routes.yaml");
    std::fs::write(&routes, routes_text(&model)).unwrap();

    let replicas: Vec<Replica> = (0..2)
        .map(|_| Replica {
            xds: free_addr(),
            admin: free_addr(),
            state: tempfile::tempdir().unwrap(),
            proc: None,
        })
        .collect();
    let proxy = TcpProxy::start(replicas.iter().map(|r| r.xds).collect())
        .await
        .unwrap();
    let mut soak = Soak {
        config: dir.path().to_path_buf(),
        routes,
        replicas,
        proxy,
        envoys: vec![],
        gws: ports.map(loopback),
        model,
        disk: Disk::Good,
    };
    for k in 0..2 {
        soak.start_replica(k);
    }
    for k in 0..2 {
        soak.wait_ready(k).await;
    }
    for (node, gw, mode) in [
        ("soak-sotw", "default/edge", AdsMode::Grpc),
        ("soak-delta", "default/edge2", AdsMode::DeltaGrpc),
    ] {
        let cfg = EnvoyConfig::new(soak.proxy.addr(), node, gw, mode);
        soak.envoys.push(Envoy::start(&cfg).await.unwrap());
    }
    soak.settled().await.unwrap();

    let stable: Vec<(String, String)> = (0..STABLE)
        .map(|s| (format!("s{s}.example.com"), "/".to_owned()))
        .collect();
    let traffic: Vec<Traffic> = soak
        .gws
        .iter()
        .map(|gw| {
            Traffic::start(
                TrafficConfig::with_requests(*gw, stable.clone())
                    .pause(Duration::from_millis(10))
                    .max_duration(Duration::from_secs(24 * 3600)),
            )
        })
        .collect();

    for n in 0..steps {
        let step = pick(&mut rng);
        let started = std::time::Instant::now();
        let what = soak.run(&mut rng, step).await;
        let what = what.unwrap_or_else(|e| panic!("seed {seed} step {n} {step:?}: {e:#}"));
        let check = async {
            soak.invariants_now(&traffic).await?;
            soak.settled().await?;
            soak.invariants_now(&traffic).await
        };
        check
            .await
            .unwrap_or_else(|e| panic!("seed {seed} step {n} ({what}): {e:#}"));
        // Elapsed is printed to size runs, never asserted.
        eprintln!(
            "fault_soak: step {n}: {what} (settled in {:.1?})",
            started.elapsed()
        );
    }

    let mut total = 0;
    for t in traffic {
        let report = t.stop().await;
        report.assert_all_ok();
        total += report.total;
    }
    assert!(total > 0, "traffic ran");
    eprintln!(
        "fault_soak: seed {seed}: {steps} steps, {total} stable requests, all 2xx; disk {:?}",
        soak.disk
    );
}

#[test]
fn rng_is_deterministic() {
    let (mut a, mut b) = (Rng(7), Rng(7));
    let xs: Vec<u64> = (0..5).map(|_| a.next()).collect();
    let ys: Vec<u64> = (0..5).map(|_| b.next()).collect();
    assert_eq!(xs, ys);
    assert_ne!(xs[0], xs[1]);
}
