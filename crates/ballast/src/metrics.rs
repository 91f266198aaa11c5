//! Prometheus metrics: the xDS event stream and the pipeline turned into
//! counters, gauges and histograms, served at `/metrics`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use ballast_xds::{StreamKind, XdsEvent, XdsObserver};
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabel {
    pub r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GatewayLabel {
    pub gateway: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    pub limit: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceKindLabel {
    pub source: String,
    pub kind: String,
}

pub struct Metrics {
    pub registry: Registry,
    pub connected_proxies: Gauge,
    pub streams: Family<KindLabel, Gauge>,
    pub responses: Family<TypeLabel, Counter>,
    pub response_bytes: Family<TypeLabel, Counter>,
    pub acks: Family<TypeLabel, Counter>,
    pub nacks: Family<TypeLabel, Counter>,
    pub oversized: Family<TypeLabel, Counter>,
    pub evictions: Counter,
    /// Requests and streams refused by an xDS server limit, by limit name.
    pub limit_rejections: Family<LimitLabel, Counter>,
    /// Streams and fetches refused by node-identity authorization. No labels:
    /// the gateway name comes from the (possibly hostile) client.
    pub xds_denied: Counter,
    /// Publish of a gateway's snapshot → ACK by a proxy of that gateway.
    pub convergence: Histogram,
    /// Response sent → its ACK.
    pub ack_latency: Histogram,
    pub translate_seconds: Histogram,
    pub publishes: Family<GatewayLabel, Counter>,
    pub guard_holds: Family<GatewayLabel, Counter>,
    pub guard_held: Family<GatewayLabel, Gauge>,
    /// Holds judged against the state file: a gateway's first snapshot after a restart.
    pub guard_restart_holds: Family<GatewayLabel, Counter>,
    /// First pushes to resuming clients held against what they reported holding.
    pub guard_client_holds: Family<GatewayLabel, Counter>,
    pub guard_client_held: Family<GatewayLabel, Gauge>,
    pub source_synced: Family<SourceLabel, Gauge>,
    pub source_errors: Family<SourceLabel, Counter>,
    pub source_generation: Family<SourceLabel, Gauge>,
    /// 1 while a store-backed source (etcd) cannot reach its store (last good config served).
    pub source_stale: Family<SourceLabel, Gauge>,
    /// The store revision a store-backed source's config reflects.
    pub source_revision: Family<SourceLabel, Gauge>,
    /// Times a store-backed source found its store at a lower revision than it had applied
    /// (etcd restored from an older backup); each was relisted by keep-set.
    pub source_revision_regressions: Family<SourceLabel, Counter>,
    /// Objects of kinds Ballast does not implement in a source's latest load.
    pub source_skipped: Family<SourceKindLabel, Gauge>,
    /// Every (source, kind) ever set above, so a kind no longer skipped reads 0.
    skipped_seen: Mutex<std::collections::HashSet<SourceKindLabel>>,
    pub ready: Gauge,
    /// 1 while this replica leads the singleton work (status write-back, `--etcd`).
    pub leader: Gauge,
    /// Times this replica became leader.
    pub leader_terms: Counter,
    /// Status documents this replica wrote to etcd (only ever as leader).
    pub status_writes: Counter,
    /// Last publish instant per gateway, for the convergence histogram.
    published_at: Mutex<HashMap<Arc<str>, Instant>>,
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        let mut registry = Registry::with_prefix("ballast");
        let latency = || Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        let m = Metrics {
            connected_proxies: Gauge::default(),
            streams: Family::default(),
            responses: Family::default(),
            response_bytes: Family::default(),
            acks: Family::default(),
            nacks: Family::default(),
            oversized: Family::default(),
            evictions: Counter::default(),
            limit_rejections: Family::default(),
            xds_denied: Counter::default(),
            convergence: latency(),
            ack_latency: latency(),
            translate_seconds: latency(),
            publishes: Family::default(),
            guard_holds: Family::default(),
            guard_held: Family::default(),
            guard_restart_holds: Family::default(),
            guard_client_holds: Family::default(),
            guard_client_held: Family::default(),
            source_synced: Family::default(),
            source_errors: Family::default(),
            source_generation: Family::default(),
            source_stale: Family::default(),
            source_revision: Family::default(),
            source_revision_regressions: Family::default(),
            source_skipped: Family::default(),
            skipped_seen: Mutex::default(),
            ready: Gauge::default(),
            leader: Gauge::default(),
            leader_terms: Counter::default(),
            status_writes: Counter::default(),
            published_at: Mutex::new(HashMap::new()),
            registry: Registry::default(),
        };
        registry.register(
            "connected_proxies",
            "Proxies with at least one open xDS stream",
            m.connected_proxies.clone(),
        );
        registry.register("xds_streams", "Open xDS streams by kind", m.streams.clone());
        registry.register(
            "xds_responses",
            "xDS responses sent, by type",
            m.responses.clone(),
        );
        registry.register(
            "xds_response_bytes",
            "Bytes of xDS responses sent, by type",
            m.response_bytes.clone(),
        );
        registry.register("xds_acks", "ACKs received, by type", m.acks.clone());
        registry.register("xds_nacks", "NACKs received, by type", m.nacks.clone());
        registry.register(
            "xds_oversized_responses",
            "Responses over 4 MiB, by type",
            m.oversized.clone(),
        );
        registry.register(
            "node_evictions",
            "Node states evicted after the grace period",
            m.evictions.clone(),
        );
        registry.register(
            "xds_limit_rejections",
            "Requests and streams refused by an xDS server limit, by limit",
            m.limit_rejections.clone(),
        );
        registry.register(
            "xds_denied",
            "xDS streams and fetches refused: the client certificate may not be served that gateway",
            m.xds_denied.clone(),
        );
        registry.register(
            "convergence_seconds",
            "Snapshot publish to ACK by a proxy of that gateway",
            m.convergence.clone(),
        );
        registry.register(
            "xds_ack_latency_seconds",
            "Response sent to its ACK",
            m.ack_latency.clone(),
        );
        registry.register(
            "translate_seconds",
            "Time to translate a config change",
            m.translate_seconds.clone(),
        );
        registry.register(
            "snapshot_publishes",
            "Snapshots published, by gateway",
            m.publishes.clone(),
        );
        registry.register(
            "guard_holds",
            "Snapshots held by the blast-radius guard, by gateway",
            m.guard_holds.clone(),
        );
        registry.register(
            "guard_held",
            "1 while a gateway's snapshot is held by the guard",
            m.guard_held.clone(),
        );
        registry.register(
            "guard_restart_holds",
            "Holds of a gateway's first snapshot after a restart, judged against the state file",
            m.guard_restart_holds.clone(),
        );
        registry.register(
            "guard_client_holds",
            "First pushes to reconnecting proxies held: they would remove most of what the proxy reported holding",
            m.guard_client_holds.clone(),
        );
        registry.register(
            "guard_client_held",
            "Proxies whose first push is held now, by gateway",
            m.guard_client_held.clone(),
        );
        registry.register(
            "source_synced",
            "1 once a source finished its initial sync",
            m.source_synced.clone(),
        );
        registry.register(
            "source_errors",
            "Rejected source reloads (config errors)",
            m.source_errors.clone(),
        );
        registry.register(
            "source_generation",
            "Generation of a source's last good config",
            m.source_generation.clone(),
        );
        registry.register(
            "source_stale",
            "1 while a store-backed source (etcd) cannot reach its store; the last good config is still served",
            m.source_stale.clone(),
        );
        registry.register(
            "source_revision",
            "Store revision (etcd) of a source's current config",
            m.source_revision.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica leads the singleton work (status write-back to etcd)",
            m.leader.clone(),
        );
        registry.register(
            "leader_terms",
            "Times this replica became the leader",
            m.leader_terms.clone(),
        );
        registry.register(
            "status_writes",
            "Object status documents this replica wrote to etcd as leader",
            m.status_writes.clone(),
        );
        registry.register(
            "source_revision_regressions",
            "Times a store-backed source (etcd) found its store at a lower revision than it had applied (restored from an older backup); each was relisted and reconciled",
            m.source_revision_regressions.clone(),
        );
        registry.register(
            "source_skipped_objects",
            "Objects of kinds Ballast does not implement, skipped in a source's latest load",
            m.source_skipped.clone(),
        );
        registry.register(
            "ready",
            "1 once every source synced (gateways held by the guard may have no snapshot yet)",
            m.ready.clone(),
        );
        // Counters that may stay at zero for a long time are exported as 0 from
        // the start (an absent series is not "no NACKs" to an alert rule).
        for t in ballast_xds::ResourceType::ALL {
            for f in [
                &m.responses,
                &m.response_bytes,
                &m.acks,
                &m.nacks,
                &m.oversized,
            ] {
                f.get_or_create(&ty(t)).inc_by(0);
            }
        }
        for limit in ballast_xds::limits::name::ALL {
            m.limit_rejections
                .get_or_create(&LimitLabel {
                    limit: limit.to_string(),
                })
                .inc_by(0);
        }
        let mut m = m;
        m.registry = registry;
        Arc::new(m)
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("encode to String");
        out
    }

    pub fn published(&self, gateway: &str) {
        self.published_at
            .lock()
            .insert(gateway.into(), Instant::now());
        self.publishes
            .get_or_create(&GatewayLabel {
                gateway: gateway.to_string(),
            })
            .inc();
    }
}

fn ty(t: ballast_xds::ResourceType) -> TypeLabel {
    TypeLabel {
        r#type: t.short_name().to_string(),
    }
}

fn kind(k: &StreamKind) -> KindLabel {
    KindLabel {
        kind: k.label().to_string(),
    }
}

/// A proxy whose first push the resume guard holds, for status pages.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ClientHold {
    pub gateway: String,
    pub reason: String,
    pub since: std::time::SystemTime,
    /// When the hold ends if the source still says so.
    pub until: std::time::SystemTime,
}

/// Held proxies by node id.
pub type ClientHolds = Arc<Mutex<std::collections::BTreeMap<String, ClientHold>>>;

/// Turns xDS events into metrics; cheap and non-blocking.
pub struct MetricsObserver {
    pub metrics: Arc<Metrics>,
    /// Open streams per node: a node is connected while it has one.
    streams_per_node: Mutex<HashMap<Arc<str>, u32>>,
    pub client_holds: ClientHolds,
}

impl MetricsObserver {
    fn end_client_hold(&self, node: &str) {
        if let Some(h) = self.client_holds.lock().remove(node) {
            self.metrics
                .guard_client_held
                .get_or_create(&GatewayLabel { gateway: h.gateway })
                .dec();
        }
    }
}

impl XdsObserver for MetricsObserver {
    fn on_event(&self, e: &XdsEvent) {
        let m = &self.metrics;
        match e {
            XdsEvent::StreamOpened { kind: k, node, .. } => {
                m.streams.get_or_create(&kind(k)).inc();
                let mut per = self.streams_per_node.lock();
                let n = per.entry(node.clone()).or_default();
                *n += 1;
                if *n == 1 {
                    m.connected_proxies.inc();
                }
            }
            XdsEvent::StreamClosed { kind: k, node } => {
                m.streams.get_or_create(&kind(k)).dec();
                let mut per = self.streams_per_node.lock();
                if let Some(n) = per.get_mut(node) {
                    *n -= 1;
                    if *n == 0 {
                        per.remove(node);
                        m.connected_proxies.dec();
                        drop(per);
                        self.end_client_hold(node);
                    }
                }
            }
            XdsEvent::ResumeHeld {
                node,
                group,
                reason,
                settle_left,
            } => {
                let label = GatewayLabel {
                    gateway: crate::grouping::gateway_part(group).to_string(),
                };
                m.guard_client_holds.get_or_create(&label).inc();
                let now = std::time::SystemTime::now();
                let before = self.client_holds.lock().insert(
                    node.to_string(),
                    ClientHold {
                        gateway: group.to_string(),
                        reason: reason.clone(),
                        since: now,
                        until: now + *settle_left,
                    },
                );
                if before.is_none() {
                    m.guard_client_held.get_or_create(&label).inc();
                }
            }
            XdsEvent::ResumeReleased { node, .. } => self.end_client_hold(node),
            XdsEvent::Request { .. } => {}
            XdsEvent::ResponseSent { ty: t, bytes, .. } => {
                m.responses.get_or_create(&ty(*t)).inc();
                m.response_bytes
                    .get_or_create(&ty(*t))
                    .inc_by(*bytes as u64);
            }
            XdsEvent::Ack {
                ty: t,
                group,
                latency,
                ..
            } => {
                m.acks.get_or_create(&ty(*t)).inc();
                m.ack_latency.observe(latency.as_secs_f64());
                let gateway = crate::grouping::gateway_part(group);
                if let Some(at) = m.published_at.lock().get(gateway).copied() {
                    m.convergence.observe(at.elapsed().as_secs_f64());
                }
            }
            XdsEvent::Nack { ty: t, .. } => {
                m.nacks.get_or_create(&ty(*t)).inc();
            }
            XdsEvent::OversizedResponse { ty: t, .. } => {
                m.oversized.get_or_create(&ty(*t)).inc();
            }
            XdsEvent::Evicted { .. } => {
                m.evictions.inc();
            }
            XdsEvent::LimitExceeded { limit, .. } => {
                m.limit_rejections
                    .get_or_create(&LimitLabel {
                        limit: limit.to_string(),
                    })
                    .inc();
            }
            XdsEvent::Rejected { .. } => {
                m.xds_denied.inc();
            }
            // Events added to the library later are not counted until
            // a metric is defined for them.
            _ => {}
        }
    }
}

impl MetricsObserver {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        MetricsObserver {
            metrics,
            streams_per_node: Mutex::new(HashMap::new()),
            client_holds: Default::default(),
        }
    }
}

impl Metrics {
    /// Sets `ballast_source_skipped_objects` for `source` from its latest load.
    pub fn set_source_skipped(&self, source: &str, skipped: &[ballast_model::Skipped]) {
        let mut counts: std::collections::BTreeMap<&str, i64> = Default::default();
        for s in skipped {
            *counts.entry(s.kind.as_str()).or_default() += 1;
        }
        let mut seen = self.skipped_seen.lock();
        for l in seen.iter().filter(|l| l.source == source) {
            self.source_skipped.get_or_create(l).set(0);
        }
        for (kind, n) in counts {
            let l = SourceKindLabel {
                source: source.to_owned(),
                kind: kind.to_owned(),
            };
            self.source_skipped.get_or_create(&l).set(n);
            seen.insert(l);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_rejections_are_counted_by_limit_name() {
        let m = Metrics::new();
        let text = m.encode();
        assert!(
            text.contains("ballast_xds_limit_rejections_total{limit=\"streams_per_node\"} 0"),
            "{text}"
        );
        let o = MetricsObserver::new(m.clone());
        for _ in 0..2 {
            o.on_event(&XdsEvent::LimitExceeded {
                limit: "streams_per_node",
                node: Some("n".into()),
                value: 3,
                max: 2,
            });
        }
        let text = m.encode();
        assert!(
            text.contains("ballast_xds_limit_rejections_total{limit=\"streams_per_node\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("ballast_xds_limit_rejections_total{limit=\"request_bytes\"} 0"),
            "{text}"
        );
    }
}
