//! A fleet of simulated proxies in one process, and what they share with the
//! harness: the expected config (to count converged clients as they ACK) and
//! the change log (when each change was published, to time convergence).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use ballast_xds::{ResourceType, Snapshot};
use parking_lot::{Mutex, RwLock};
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::JoinHandle;

use crate::client::{self, ClientConfig, ClientState, NackPredicate, Protocol, SharedState};

/// When each change was published: per resource, the versions in publish order.
///
/// Entries are keyed by the content-hash version the bench predicts (the
/// library server), or, with [`ChangeLog::set_by_tag`], by a tag the client
/// reads from the resource itself ([`crate::client::content_tag`]): for a
/// server whose versions the bench cannot predict (the binary fed by etcd),
/// each change writes a tag that is new for its resource, so an ACK still
/// says which changes it contains.
#[derive(Default)]
pub struct ChangeLog {
    tracking: AtomicBool,
    by_tag: AtomicBool,
    /// Per resource: (version or tag, publish time, sequence number of the change).
    #[allow(clippy::type_complexity)]
    pub(crate) log: RwLock<HashMap<(ResourceType, Arc<str>), Vec<(u64, Instant, u32)>>>,
    /// Per change (by sequence number): how many clients ACKed it and the
    /// slowest of them (µs), so "every proxy has it" is timed per change.
    pub(crate) acks: RwLock<Vec<ChangeAcks>>,
}

/// Who has one change, filled in by the clients as they ACK it.
#[derive(Default)]
pub struct ChangeAcks {
    pub clients: AtomicU32,
    pub max_us: AtomicU32,
}

impl ChangeLog {
    pub fn set_tracking(&self, on: bool) {
        self.tracking.store(on, Ordering::Release);
    }
    pub fn is_tracking(&self) -> bool {
        self.tracking.load(Ordering::Acquire)
    }
    /// Entries are content tags, not versions (set before anything is recorded).
    pub fn set_by_tag(&self, on: bool) {
        self.by_tag.store(on, Ordering::Release);
    }
    pub fn is_by_tag(&self) -> bool {
        self.by_tag.load(Ordering::Acquire)
    }
    /// Must be called before the change is published, so a client that
    /// receives it always finds it.
    pub fn record(&self, ty: ResourceType, name: &str, version: &str, t0: Instant) {
        self.record_key(ty, name, client::version_u64(version), t0);
    }
    /// [`Self::record`] with the key itself (a version as `u64`, or a tag).
    pub fn record_key(&self, ty: ResourceType, name: &str, key: u64, t0: Instant) {
        let name = client::intern(name);
        // Lock order log → acks, as the clients take them.
        let mut log = self.log.write();
        let mut acks = self.acks.write();
        let seq = acks.len() as u32;
        acks.push(ChangeAcks::default());
        log.entry((ty, name)).or_default().push((key, t0, seq));
    }
    /// Number of changes recorded.
    pub fn len(&self) -> usize {
        self.acks.read().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Per change in publish order: (clients that ACKed it, the slowest of
    /// them in µs from publish to ACK).
    pub fn per_change(&self) -> Vec<(u32, u32)> {
        self.acks
            .read()
            .iter()
            .map(|a| {
                (
                    a.clients.load(Ordering::Acquire),
                    a.max_us.load(Ordering::Acquire),
                )
            })
            .collect()
    }
}

struct Expected {
    generation: u64,
    snapshot: Option<Arc<Snapshot>>,
    converged: usize,
}

/// State shared by the harness and every client.
pub struct FleetShared {
    pub start: Instant,
    check_on_ack: AtomicBool,
    expected: Mutex<Expected>,
    notify: Notify,
    pub changes: ChangeLog,
    /// Stream epoch: odd while the bench holds every stream dropped (W5).
    pub streams: watch::Sender<u64>,
}

impl Default for FleetShared {
    fn default() -> Self {
        FleetShared {
            start: Instant::now(),
            check_on_ack: AtomicBool::new(true),
            expected: Mutex::new(Expected {
                generation: 0,
                snapshot: None,
                converged: 0,
            }),
            notify: Notify::new(),
            changes: ChangeLog::default(),
            streams: watch::channel(0).0,
        }
    }
}

impl FleetShared {
    /// Whether clients compare their view with the expected config after every
    /// ACK. Cheap for cold starts; under heavy churn the harness turns it off
    /// and checks once at the end instead.
    pub fn set_check_on_ack(&self, on: bool) {
        self.check_on_ack.store(on, Ordering::Release);
    }
    pub(crate) fn check_on_ack(&self) -> bool {
        self.check_on_ack.load(Ordering::Acquire)
    }

    /// Sets the config every client should converge to; returns its generation.
    pub fn set_expected(&self, snapshot: Arc<Snapshot>) -> u64 {
        let mut e = self.expected.lock();
        e.generation += 1;
        e.snapshot = Some(snapshot);
        e.converged = 0;
        e.generation
    }

    pub(crate) fn expected(&self) -> (u64, Option<Arc<Snapshot>>) {
        let e = self.expected.lock();
        (e.generation, e.snapshot.clone())
    }

    pub(crate) fn mark_converged(&self, generation: u64) {
        let mut e = self.expected.lock();
        if e.generation == generation {
            e.converged += 1;
            drop(e);
            self.notify.notify_waiters();
        }
    }

    pub fn converged(&self) -> usize {
        self.expected.lock().converged
    }

    /// Waits until `n` clients matched the current expected config (counted as
    /// they ACK), or `timeout`.
    pub async fn wait_converged(&self, n: usize, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.notify.notified();
            if self.converged() >= n {
                return true;
            }
            // Re-check periodically too: a notification may race the check.
            let tick = tokio::time::sleep(Duration::from_millis(50));
            tokio::select! {
                _ = notified => {}
                _ = tick => {}
                _ = tokio::time::sleep_until(deadline) => return self.converged() >= n,
            }
        }
    }
}

/// How to build a fleet.
#[derive(Clone)]
pub struct FleetConfig {
    pub addr: SocketAddr,
    pub proxies: usize,
    pub protocol: Protocol,
    pub nack: Option<NackPredicate>,
    pub rest_poll: Duration,
    /// At most this many clients connecting and receiving their first config at
    /// once (0: all at once, like a fleet restarting together).
    pub connect_concurrency: usize,
    pub node_prefix: String,
    /// `node.cluster` (Ballast maps it to the gateway).
    pub node_cluster: String,
}

impl FleetConfig {
    pub fn new(addr: SocketAddr, proxies: usize, protocol: Protocol) -> Self {
        FleetConfig {
            addr,
            proxies,
            protocol,
            nack: None,
            rest_poll: Duration::from_millis(1000),
            connect_concurrency: 0,
            node_prefix: "proxy".into(),
            node_cluster: "bench".into(),
        }
    }
}

/// Running clients.
pub struct Fleet {
    pub shared: Arc<FleetShared>,
    pub clients: Vec<SharedState>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

/// What a fleet has not received of the change log.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Undelivered {
    /// Changes that at least one client never ACKed.
    pub lost_changes: usize,
    /// (client, change) pairs not ACKed.
    pub missing_deliveries: usize,
    /// The first few lost changes, described.
    pub examples: Vec<String>,
}

/// Totals over a fleet, for reports.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct FleetTotals {
    pub clients: usize,
    pub responses: u64,
    /// Responses per type (SDS, CDS, EDS, LDS, RDS).
    pub responses_by_type: [u64; crate::client::N_TYPES],
    pub acks: u64,
    pub nacks: u64,
    pub bytes: u64,
    pub reconnects: u64,
    pub version_mismatches: u64,
    pub unmatched_versions: u64,
    /// Clients whose last connection attempt or stream failed.
    pub errors: Vec<String>,
}

impl Fleet {
    pub fn spawn(cfg: &FleetConfig, shared: Arc<FleetShared>) -> Fleet {
        let (stop, stop_rx) = watch::channel(false);
        let gate = (cfg.connect_concurrency > 0)
            .then(|| Arc::new(Semaphore::new(cfg.connect_concurrency)));
        let mut clients = Vec::with_capacity(cfg.proxies);
        let mut tasks = Vec::with_capacity(cfg.proxies);
        for i in 0..cfg.proxies {
            let state: SharedState = Arc::new(Mutex::new(ClientState::default()));
            let ccfg = ClientConfig {
                addr: cfg.addr,
                node_id: format!("{}-{i}", cfg.node_prefix),
                node_cluster: cfg.node_cluster.clone(),
                protocol: cfg.protocol,
                nack: cfg.nack.clone(),
                rest_poll: cfg.rest_poll,
                shared: shared.clone(),
                gate: gate.clone(),
            };
            clients.push(state.clone());
            tasks.push(tokio::spawn(client::run(ccfg, state, stop_rx.clone())));
        }
        Fleet {
            shared,
            clients,
            stop,
            tasks,
        }
    }

    /// Stops every client and waits for them.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }

    /// Clients whose view differs from `expected`, with their first difference.
    pub fn mismatches(&self, expected: &Snapshot) -> Vec<(usize, String)> {
        self.clients
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let c = c.lock();
                c.first_difference(expected).map(|d| {
                    let err = c.stats.last_error.clone().unwrap_or_default();
                    (i, format!("{d} {err}").trim().to_string())
                })
            })
            .collect()
    }

    /// Polls until every client's view equals `expected` or `timeout`;
    /// returns the clients that still differ.
    pub async fn wait_all_match(
        &self,
        expected: &Snapshot,
        timeout: Duration,
    ) -> Vec<(usize, String)> {
        let deadline = Instant::now() + timeout;
        loop {
            let all = self.clients.iter().all(|c| c.lock().matches(expected));
            if all {
                return Vec::new();
            }
            if Instant::now() >= deadline {
                return self.mismatches(expected);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Drops every stream (clients keep their views and wait), or restores them.
    pub fn set_streams_dropped(&self, dropped: bool) {
        self.shared.streams.send_modify(|e| {
            if (*e).is_multiple_of(2) == dropped {
                *e += 1;
            }
        });
    }

    /// Polls every client with `done` until each has returned `Some(instant)`
    /// once (kept from its first observation) or `timeout`; returns the
    /// instants per client (`None`: never). For small fleets and for servers
    /// whose versions the bench cannot predict (the binary, sovereign).
    pub async fn wait_each(
        &self,
        timeout: Duration,
        done: impl Fn(usize, &ClientState) -> Option<Instant>,
    ) -> Vec<Option<Instant>> {
        let deadline = Instant::now() + timeout;
        let mut out = vec![None; self.clients.len()];
        let tick = Duration::from_millis(if self.clients.len() > 200 { 20 } else { 2 });
        loop {
            for (i, c) in self.clients.iter().enumerate() {
                if out[i].is_none() {
                    out[i] = done(i, &c.lock());
                }
            }
            if out.iter().all(Option::is_some) || Instant::now() >= deadline {
                return out;
            }
            tokio::time::sleep(tick).await;
        }
    }

    pub fn totals(&self) -> FleetTotals {
        let mut t = FleetTotals {
            clients: self.clients.len(),
            ..Default::default()
        };
        for c in &self.clients {
            let c = c.lock();
            let s = &c.stats;
            t.responses += s.responses.iter().sum::<u64>();
            for (a, b) in t.responses_by_type.iter_mut().zip(s.responses) {
                *a += b;
            }
            t.acks += s.acks.iter().sum::<u64>();
            t.nacks += s.nacks.iter().sum::<u64>();
            t.bytes += s.bytes.iter().sum::<u64>();
            t.reconnects += s.reconnects;
            t.version_mismatches += s.version_mismatches;
            t.unmatched_versions += s.unmatched_versions;
            if let Some(e) = &s.last_error {
                t.errors.push(e.clone());
            }
        }
        t
    }

    /// Changes of the change log that some client has not ACKed (a later
    /// change of the same resource covers the earlier ones).
    pub fn undelivered(&self) -> Undelivered {
        // Lock order client → log, as a client recording an ACK takes them.
        let clients: Vec<_> = self.clients.iter().map(|c| c.lock()).collect();
        let log = self.shared.changes.log.read();
        let mut u = Undelivered::default();
        for ((ty, name), list) in log.iter() {
            let seen: Vec<usize> = clients.iter().map(|c| c.changes_seen(name)).collect();
            let least = seen.iter().copied().min().unwrap_or(list.len());
            u.lost_changes += list.len().saturating_sub(least);
            u.missing_deliveries += seen
                .iter()
                .map(|s| list.len().saturating_sub(*s))
                .sum::<usize>();
            if least < list.len() && u.examples.len() < 5 {
                let behind = seen.iter().filter(|s| **s < list.len()).count();
                u.examples.push(format!(
                    "{ty} {name}: {behind} clients lack change {} of {} (key {})",
                    least + 1,
                    list.len(),
                    list[least].0
                ));
            }
        }
        u
    }

    /// Polls until every client has ACKed every logged change, or `timeout`.
    pub async fn wait_all_delivered(&self, timeout: Duration) -> Undelivered {
        let deadline = Instant::now() + timeout;
        loop {
            let u = self.undelivered();
            if u.missing_deliveries == 0 || Instant::now() >= deadline {
                return u;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every convergence sample of every client (µs), unsorted.
    pub fn latencies_us(&self) -> Vec<u32> {
        let mut all = Vec::new();
        for c in &self.clients {
            all.extend_from_slice(&c.lock().latencies_us);
        }
        all
    }

    /// Per client that has it, the time from `t0` to the instant `f` reads
    /// (µs, as convergence samples are kept).
    pub fn us_since(&self, t0: Instant, f: impl Fn(&ClientState) -> Option<Instant>) -> Vec<u32> {
        self.per_client(|c| f(c).map(|t| t.saturating_duration_since(t0).as_micros() as u32))
            .into_iter()
            .flatten()
            .collect()
    }

    /// Per-client totals snapshot: (responses, bytes) per client.
    pub fn per_client<T>(&self, f: impl Fn(&ClientState) -> T) -> Vec<T> {
        self.clients.iter().map(|c| f(&c.lock())).collect()
    }
}
