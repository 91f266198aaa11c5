//! The resume guard: a client's first push is judged against what the client
//! reports holding, so a server that restarted (or a fresh replica taking over)
//! into a shrunken source does not strip its clients in one push.
//!
//! A server that has just started knows nothing of what its clients hold, yet
//! this is exactly when sources are most likely to be incomplete (a half-synced
//! checkout, an empty mount). Clients do know, and say so when they reconnect:
//! - Delta: `initial_resource_versions` names every resource held, per type;
//! - SotW: EDS, RDS and SDS requests name what the client uses; LDS and CDS
//!   carry only a `version_info`, resolved through the current snapshot and
//!   the group's recent history (versions are content hashes, so a match is
//!   exactly what the client holds; an unknown version is not counted).
//!
//! "Remove" means, per type, a name the client reported that the snapshot to
//! be pushed does not contain. If, for any type, more than `max_removal` of the
//! reported names would go, nothing is delivered to that stream (the client
//! keeps its config, exactly as while the server is not ready) until either the
//! snapshot changes to one that passes (the source came back), or `settle` has
//! passed since the client's first request (the source still says so: it wins).
//!
//! The guard gathers reports for a moment first: Envoy sends the first request
//! of every type it watches at once when a stream opens, so the judgement waits
//! for CDS, EDS, LDS and RDS (ADS), or for at most [`GATHER`].

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use tokio::time::Instant;

use tracing::warn;

use crate::events::{XdsEvent, XdsObserver};
use crate::resource::ResourceType;
use crate::snapshot::Snapshot;

/// How long a resuming stream waits for the first requests of the other types
/// before it judges with what it has.
pub(crate) const GATHER: Duration = Duration::from_secs(1);

/// Configuration of the resume guard ([`crate::server::XdsServerBuilder::resume_guard`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ResumeGuardConfig {
    /// Share (0..=1) of what a client reports holding, per type, that its first
    /// push may remove without being held.
    pub max_removal: f64,
    /// How long after the client's first request a held push is delivered
    /// anyway if the source still says so.
    pub settle: Duration,
}

impl Default for ResumeGuardConfig {
    fn default() -> Self {
        ResumeGuardConfig {
            max_removal: 0.5,
            settle: Duration::from_secs(10),
        }
    }
}

/// What the first request of a type says the client holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reported {
    /// Names of the resources held (Delta; SotW EDS/RDS/SDS).
    Names(BTreeSet<String>),
    /// A type version (SotW LDS/CDS): the names are those of the snapshot
    /// that had this version, when it is known.
    Version(String),
}

/// A request that may report what the client holds from an earlier stream.
pub(crate) trait ReportsHoldings {
    /// The type and what the client says it holds; `None` when it reports
    /// nothing (a client that holds nothing, or an unknown type).
    fn reported(&self) -> Option<(ResourceType, Reported)>;
    /// The type the request is for.
    fn resource_type(&self) -> Option<ResourceType>;
}

impl ReportsHoldings for DiscoveryRequest {
    fn reported(&self) -> Option<(ResourceType, Reported)> {
        let ty = self.resource_type()?;
        // An ACK/NACK (nonce set) reports what this stream sent, not what the
        // client held before.
        if self.version_info.is_empty() || !self.response_nonce.is_empty() {
            return None;
        }
        match ty {
            ResourceType::Listener | ResourceType::Cluster => {
                Some((ty, Reported::Version(self.version_info.clone())))
            }
            _ => {
                let names: BTreeSet<String> = self
                    .resource_names
                    .iter()
                    .filter(|n| n.as_str() != "*")
                    .cloned()
                    .collect();
                (!names.is_empty()).then_some((ty, Reported::Names(names)))
            }
        }
    }
    fn resource_type(&self) -> Option<ResourceType> {
        ResourceType::from_type_url(&self.type_url)
    }
}

impl ReportsHoldings for crate::protocol::sotw_request::SotwRequest {
    fn reported(&self) -> Option<(ResourceType, Reported)> {
        // Only a first request that resumes reports holdings: names are
        // decoded then, never for an ACK.
        if self.req.version_info.is_empty() || !self.req.response_nonce.is_empty() {
            return None;
        }
        self.to_request().reported()
    }
    fn resource_type(&self) -> Option<ResourceType> {
        self.req.resource_type()
    }
}

impl ReportsHoldings for crate::protocol::delta_request::DeltaRequest {
    fn reported(&self) -> Option<(ResourceType, Reported)> {
        let ty = self.resource_type()?;
        if self.versions.is_empty() {
            return None;
        }
        let names = self.versions.iter().map(|(n, _)| n.to_string()).collect();
        Some((ty, Reported::Names(names)))
    }
    fn resource_type(&self) -> Option<ResourceType> {
        self.req.resource_type()
    }
}

impl ReportsHoldings for DeltaDiscoveryRequest {
    fn reported(&self) -> Option<(ResourceType, Reported)> {
        let ty = self.resource_type()?;
        if self.initial_resource_versions.is_empty() {
            return None;
        }
        Some((
            ty,
            Reported::Names(self.initial_resource_versions.keys().cloned().collect()),
        ))
    }
    fn resource_type(&self) -> Option<ResourceType> {
        ResourceType::from_type_url(&self.type_url)
    }
}

/// Why a held first push was released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumeRelease {
    /// The snapshot changed to one that no longer removes too much.
    SourceChanged,
    /// The settle period passed and the source still says so.
    SettleElapsed,
}

/// What the stream should report, from [`ResumeGuard::admit`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum GuardNews {
    Held { reason: String },
    Released(ResumeRelease),
}

#[derive(Debug)]
enum Phase {
    /// No request yet.
    Initial,
    /// The stream resumes: collecting the first request of each type.
    Gathering,
    /// Judged a mass removal.
    Held { judged: Arc<Snapshot> },
    /// Everything passes (nothing reported, judged fine, or released).
    Open,
}

/// One stream's resume guard: a pure state machine, driven by the stream task.
#[derive(Debug)]
pub(crate) struct ResumeGuard {
    cfg: Option<ResumeGuardConfig>,
    /// Types whose first request is expected before judging.
    expected: Vec<ResourceType>,
    seen: [bool; crate::resource::TYPE_COUNT],
    reported: [Option<Reported>; crate::resource::TYPE_COUNT],
    started: Option<Instant>,
    /// Gathering is over (every expected type seen, or [`GATHER`] passed).
    gathered: bool,
    phase: Phase,
}

impl ResumeGuard {
    /// `only`: the type of a per-type stream (`None`: ADS). `cfg` `None`: off.
    pub(crate) fn new(cfg: Option<ResumeGuardConfig>, only: Option<ResourceType>) -> Self {
        let expected = match only {
            Some(ty) => vec![ty],
            None => vec![
                ResourceType::Cluster,
                ResourceType::ClusterLoadAssignment,
                ResourceType::Listener,
                ResourceType::RouteConfiguration,
            ],
        };
        let phase = if cfg.is_some() {
            Phase::Initial
        } else {
            Phase::Open
        };
        ResumeGuard {
            cfg,
            expected,
            seen: [false; crate::resource::TYPE_COUNT],
            reported: Default::default(),
            started: None,
            gathered: false,
            phase,
        }
    }

    /// Notes a request: the first one of each type may report holdings.
    pub(crate) fn observe(&mut self, req: &impl ReportsHoldings, now: Instant) {
        if matches!(self.phase, Phase::Open) {
            return;
        }
        let Some(ty) = req.resource_type() else {
            return;
        };
        if std::mem::replace(&mut self.seen[ty.index()], true) {
            return;
        }
        let reported = req.reported();
        if matches!(self.phase, Phase::Initial) {
            if reported.is_none() {
                // A client that holds nothing from an earlier stream: nothing to protect.
                self.open();
                return;
            }
            self.phase = Phase::Gathering;
            self.started = Some(now);
        }
        if let Some((ty, r)) = reported {
            self.reported[ty.index()] = Some(r);
        }
    }

    /// Nothing more to judge: the reports are dropped (a stream may live for
    /// days; thousands of names per stream must not).
    fn open(&mut self) {
        self.phase = Phase::Open;
        self.reported = Default::default();
    }

    /// When the stream must call [`Self::admit`] again even if nothing else happens.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let started = self.started?;
        match self.phase {
            Phase::Gathering if !self.gathered => Some(started + GATHER),
            Phase::Gathering | Phase::Held { .. } => Some(started + self.cfg.as_ref()?.settle),
            _ => None,
        }
    }

    /// Is the guard holding the stream's pushes right now?
    pub(crate) fn is_holding(&self) -> bool {
        matches!(self.phase, Phase::Gathering | Phase::Held { .. })
    }

    /// The snapshot the stream may deliver now (`None`: deliver nothing yet),
    /// given the group's `current` one and recent `history` (for SotW
    /// versions), and what to report.
    pub(crate) fn admit(
        &mut self,
        current: Option<Arc<Snapshot>>,
        history: impl FnOnce() -> Vec<Arc<Snapshot>>,
        now: Instant,
    ) -> (Option<Arc<Snapshot>>, Option<GuardNews>) {
        let (Some(cfg), Some(started)) = (self.cfg.clone(), self.started) else {
            return match self.phase {
                Phase::Initial => (None, None),
                _ => (current, None),
            };
        };
        let settled = now >= started + cfg.settle;
        match &self.phase {
            Phase::Initial => (None, None),
            Phase::Open => (current, None),
            Phase::Gathering => {
                let all_seen = self.expected.iter().all(|t| self.seen[t.index()]);
                if !all_seen && now < started + GATHER {
                    return (None, None);
                }
                self.gathered = true;
                let Some(snap) = current else {
                    // Nothing to push yet (not ready, or no snapshot for the
                    // group): judge the first one that comes, within the settle period.
                    if settled {
                        self.open();
                    }
                    return (None, None);
                };
                if settled {
                    // The client has waited the settle period already.
                    self.open();
                    return (Some(snap), None);
                }
                match self.judge(&cfg, &snap, history) {
                    None => {
                        self.open();
                        (Some(snap), None)
                    }
                    Some(reason) => {
                        self.phase = Phase::Held { judged: snap };
                        (None, Some(GuardNews::Held { reason }))
                    }
                }
            }
            Phase::Held { judged } => {
                if settled {
                    self.open();
                    return (
                        current,
                        Some(GuardNews::Released(ResumeRelease::SettleElapsed)),
                    );
                }
                let Some(snap) = current else {
                    return (None, None);
                };
                if Arc::ptr_eq(judged, &snap) {
                    return (None, None);
                }
                match self.judge(&cfg, &snap, history) {
                    None => {
                        self.open();
                        (
                            Some(snap),
                            Some(GuardNews::Released(ResumeRelease::SourceChanged)),
                        )
                    }
                    Some(_) => {
                        // Still a mass removal: keep holding, same deadline.
                        self.phase = Phase::Held { judged: snap };
                        (None, None)
                    }
                }
            }
        }
    }

    /// For the stream driver: [`Self::admit`], with its news reported as
    /// events and logs.
    pub(crate) fn filter(
        &mut self,
        current: Option<Arc<Snapshot>>,
        history: impl FnOnce() -> Vec<Arc<Snapshot>>,
        observer: &dyn XdsObserver,
        node: &Arc<str>,
        group: &Arc<str>,
    ) -> Option<Arc<Snapshot>> {
        if !self.is_holding() {
            return current;
        }
        let now = Instant::now();
        let (admitted, news) = self.admit(current, history, now);
        match news {
            None => {}
            Some(GuardNews::Held { reason }) => {
                warn!(%reason, "resume guard: holding the first push");
                observer.on_event(&XdsEvent::ResumeHeld {
                    node: node.clone(),
                    group: group.clone(),
                    reason,
                    settle_left: self
                        .deadline()
                        .map(|d| d.saturating_duration_since(now))
                        .unwrap_or_default(),
                });
            }
            Some(GuardNews::Released(why)) => {
                warn!(?why, "resume guard: first push released");
                observer.on_event(&XdsEvent::ResumeReleased {
                    node: node.clone(),
                    group: group.clone(),
                    why,
                });
            }
        }
        admitted
    }

    /// Resolves at [`Self::deadline`] (never without one): the stream calls
    /// [`Self::filter`] again then.
    pub(crate) async fn wake(&self) {
        match self.deadline() {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    }

    /// The first type whose reported holdings `snap` would cut by more than
    /// the share, described for logs and status.
    fn judge(
        &self,
        cfg: &ResumeGuardConfig,
        snap: &Snapshot,
        history: impl FnOnce() -> Vec<Arc<Snapshot>>,
    ) -> Option<String> {
        let mut history = Some(history);
        let mut past: Vec<Arc<Snapshot>> = Vec::new();
        for ty in ResourceType::ALL {
            let Some(reported) = &self.reported[ty.index()] else {
                continue;
            };
            let next = snap.resources(ty);
            let (removed, total) = match reported {
                Reported::Names(names) => (
                    names
                        .iter()
                        .filter(|n| !next.contains_key(n.as_str()))
                        .count(),
                    names.len(),
                ),
                Reported::Version(v) => {
                    if &**snap.version(ty) == v.as_str() {
                        continue;
                    }
                    if let Some(h) = history.take() {
                        past = h();
                    }
                    let Some(held) = past.iter().find(|s| &**s.version(ty) == v.as_str()) else {
                        // A version this server never published: names unknown.
                        continue;
                    };
                    let held = held.resources(ty);
                    (
                        held.keys().filter(|n| !next.contains_key(&***n)).count(),
                        held.len(),
                    )
                }
            };
            if total > 0 && removed as f64 / total as f64 > cfg.max_removal {
                return Some(format!(
                    "first push would remove {removed} of the {total} {} the client reports holding ({:.0}% > {:.0}%)",
                    ty.short_name(),
                    100.0 * removed as f64 / total as f64,
                    100.0 * cfg.max_removal
                ));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;

    fn snap(clusters: std::ops::Range<usize>) -> Arc<Snapshot> {
        let mut b = Snapshot::builder();
        for i in clusters {
            let name = format!("c{i}");
            b.message(&crate::simple::eds_cluster(&name, Duration::from_secs(1)))
                .unwrap();
            b.message(&crate::simple::load_assignment(&name, &[("127.0.0.1", 80)]))
                .unwrap();
        }
        Arc::new(b.build().unwrap())
    }

    fn delta(ty: ResourceType, held: std::ops::Range<usize>) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: ty.type_url().to_string(),
            initial_resource_versions: held.map(|i| (format!("c{i}"), "v".into())).collect(),
            ..Default::default()
        }
    }

    fn sotw(ty: ResourceType, version: &str, names: &[String]) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: ty.type_url().to_string(),
            version_info: version.into(),
            resource_names: names.to_vec(),
            ..Default::default()
        }
    }

    fn cfg() -> Option<ResumeGuardConfig> {
        Some(ResumeGuardConfig {
            max_removal: 0.5,
            settle: Duration::from_secs(10),
        })
    }

    /// Nothing delivered, nothing to report.
    fn nothing(r: (Option<Arc<Snapshot>>, Option<GuardNews>)) -> bool {
        r.0.is_none() && r.1.is_none()
    }

    fn none() -> Vec<Arc<Snapshot>> {
        Vec::new()
    }

    /// Every expected type seen, on an ADS stream.
    fn resume_delta(g: &mut ResumeGuard, held: std::ops::Range<usize>, now: Instant) {
        g.observe(&delta(ResourceType::Cluster, held.clone()), now);
        g.observe(&delta(ResourceType::ClusterLoadAssignment, held), now);
        g.observe(&delta(ResourceType::Listener, 0..0), now);
        g.observe(&delta(ResourceType::RouteConfiguration, 0..0), now);
    }

    #[test]
    fn holds_a_first_push_that_removes_most_of_what_the_client_holds() {
        let t0 = Instant::now();
        let mut g = ResumeGuard::new(cfg(), None);
        resume_delta(&mut g, 0..100, t0);
        let shrunk = snap(0..20);
        let (admitted, news) = g.admit(Some(shrunk.clone()), none, t0);
        assert!(admitted.is_none());
        let Some(GuardNews::Held { reason }) = news else {
            panic!("{news:?}")
        };
        assert!(reason.contains("remove 80 of the 100 CDS"), "{reason}");
        assert_eq!(g.deadline(), Some(t0 + Duration::from_secs(10)));
        // Same snapshot, before the deadline: still held, no news.
        assert!(nothing(g.admit(
            Some(shrunk.clone()),
            none,
            t0 + Duration::from_secs(9)
        )));
        // After the settle period the source wins.
        let (admitted, news) = g.admit(Some(shrunk.clone()), none, t0 + Duration::from_secs(10));
        assert!(Arc::ptr_eq(&admitted.unwrap(), &shrunk));
        assert_eq!(
            news,
            Some(GuardNews::Released(ResumeRelease::SettleElapsed))
        );
        assert!(!g.is_holding());
        assert!(g.reported.iter().all(Option::is_none), "reports dropped");
    }

    #[test]
    fn releases_early_when_the_source_comes_back() {
        let t0 = Instant::now();
        let mut g = ResumeGuard::new(cfg(), None);
        resume_delta(&mut g, 0..100, t0);
        assert!(g.admit(Some(snap(0..20)), none, t0).0.is_none());
        // Another mass removal: still held.
        assert!(nothing(g.admit(
            Some(snap(0..30)),
            none,
            t0 + Duration::from_secs(1)
        )));
        let full = snap(0..100);
        let (admitted, news) = g.admit(Some(full.clone()), none, t0 + Duration::from_secs(2));
        assert!(Arc::ptr_eq(&admitted.unwrap(), &full));
        assert_eq!(
            news,
            Some(GuardNews::Released(ResumeRelease::SourceChanged))
        );
    }

    #[test]
    fn small_removals_fresh_clients_and_a_disabled_guard_pass() {
        let t0 = Instant::now();
        let mut g = ResumeGuard::new(cfg(), None);
        resume_delta(&mut g, 0..100, t0);
        let s = snap(0..60);
        assert!(g.admit(Some(s), none, t0).0.is_some(), "40% passes");

        // A client that reports nothing is never held, not even briefly.
        let mut g = ResumeGuard::new(cfg(), None);
        g.observe(&delta(ResourceType::Cluster, 0..0), t0);
        assert!(g.admit(Some(snap(0..1)), none, t0).0.is_some());

        let mut g = ResumeGuard::new(None, None);
        resume_delta(&mut g, 0..100, t0);
        assert!(g.admit(Some(snap(0..1)), none, t0).0.is_some());
    }

    #[test]
    fn gathers_the_other_types_before_judging() {
        let t0 = Instant::now();
        let mut g = ResumeGuard::new(cfg(), None);
        // SotW: CDS reports a version this server never published; EDS names
        // the clusters, and arrives later.
        g.observe(&sotw(ResourceType::Cluster, "old", &[]), t0);
        assert!(nothing(g.admit(Some(snap(0..20)), none, t0)));
        assert_eq!(g.deadline(), Some(t0 + GATHER));
        let names: Vec<String> = (0..100).map(|i| format!("c{i}")).collect();
        g.observe(
            &sotw(ResourceType::ClusterLoadAssignment, "old", &names),
            t0,
        );
        // Until the gather deadline (LDS and RDS never came), then judged.
        let at = t0 + GATHER;
        let (admitted, news) = g.admit(Some(snap(0..20)), none, at);
        assert!(admitted.is_none());
        assert!(
            matches!(&news, Some(GuardNews::Held { reason }) if reason.contains("80 of the 100 EDS")),
            "{news:?}"
        );
    }

    #[test]
    fn sotw_versions_resolve_through_history() {
        let t0 = Instant::now();
        let before = snap(0..100);
        let v = before.version(ResourceType::Cluster).to_string();
        let mut g = ResumeGuard::new(cfg(), Some(ResourceType::Cluster));
        g.observe(&sotw(ResourceType::Cluster, &v, &[]), t0);
        let h = before.clone();
        let (admitted, news) = g.admit(Some(snap(0..10)), move || vec![h], t0);
        assert!(admitted.is_none());
        assert!(matches!(news, Some(GuardNews::Held { .. })), "{news:?}");

        // An unknown version is not counted: nothing is held.
        let mut g = ResumeGuard::new(cfg(), Some(ResourceType::Cluster));
        g.observe(&sotw(ResourceType::Cluster, "unknown", &[]), t0);
        assert!(g.admit(Some(snap(0..10)), none, t0).0.is_some());
    }

    #[test]
    fn acks_report_nothing() {
        let mut ack = sotw(ResourceType::ClusterLoadAssignment, "v1", &["a".into()]);
        ack.response_nonce = "1".into();
        assert_eq!(ack.reported(), None);
        let wildcard = sotw(ResourceType::Cluster, "v1", &[]);
        assert_eq!(
            wildcard.reported(),
            Some((ResourceType::Cluster, Reported::Version("v1".into())))
        );
    }

    #[test]
    fn waits_for_a_snapshot_within_the_settle_period_only() {
        let t0 = Instant::now();
        let mut g = ResumeGuard::new(cfg(), None);
        resume_delta(&mut g, 0..100, t0);
        // No snapshot yet (not ready / gateway held elsewhere).
        assert!(nothing(g.admit(None, none, t0)));
        // Waiting for it wakes the stream at the end of the settle period, not before.
        assert_eq!(g.deadline(), Some(t0 + Duration::from_secs(10)));
        // It comes within the settle period: judged.
        assert!(
            g.admit(Some(snap(0..20)), none, t0 + Duration::from_secs(2))
                .0
                .is_none()
        );

        let mut g = ResumeGuard::new(cfg(), None);
        resume_delta(&mut g, 0..100, t0);
        // It comes after the client waited the settle period: delivered.
        let late = t0 + Duration::from_secs(11);
        assert!(nothing(g.admit(None, none, late)));
        assert!(g.admit(Some(snap(0..20)), none, late).0.is_some());
    }
}
