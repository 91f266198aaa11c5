//! The xDS protocol as pure state machines: what to answer, and when, on one
//! stream. No I/O here, so every rule is unit- and property-testable; the
//! async servers in `crate::server` drive these machines.
//!
//! Ordering (invariant 6, docs/architecture.md §5.2) is dependency-driven
//! rather than a fixed script:
//! - a listener or route configuration whose *hard* references (clusters it
//!   routes to) are not yet warm at the client is held at its previous version;
//! - a resource is removed only when nothing the client holds (acked or in
//!   flight) still references it.
//!
//! Together with sending types in SDS→CDS→EDS→LDS→RDS order, this gives
//! make-before-break for additions and break-after-unlink for removals, and it
//! also holds when a NACK leaves the client on older config.
//!
//! Only references delivered on the same stream count (`ads` config sources,
//! see [`crate::resource`]). Every stream sends at least one response once
//! the client's state is known — a no-op when it owes nothing — because Envoy
//! resets its reconnect backoff only when a message arrives ([`sotw`],
//! [`delta`]).

pub(crate) mod delta;
pub(crate) mod delta_request;
mod sorted;
pub(crate) mod sotw;
pub(crate) mod sotw_request;
mod stream_core;
pub(crate) mod subscription;

pub(crate) use sorted::{Seeker, cmp_names, share_if_whole, without_names};
pub(crate) use stream_core::{PerType, Progress, StreamCore, TypeState};

#[cfg(test)]
mod sim;

use std::collections::HashSet;
use std::sync::Arc;

use crate::resource::{Ref, Resource, ResourceType};
use crate::snapshot::{ResourceMap, Snapshot};

/// Outcome of one request, for status and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(not(feature = "unstable-internals"), allow(unreachable_pub))]
pub enum RequestOutcome {
    /// First request for a type on this stream, or a subscription change.
    Subscribed {
        /// The type requested.
        ty: ResourceType,
    },
    /// The client accepted a response.
    Ack {
        /// The type acknowledged.
        ty: ResourceType,
        /// The version the client now holds.
        version: Arc<str>,
        /// The nonce of the response acknowledged.
        nonce: Arc<str>,
    },
    /// The client rejected a response (`error_detail` set); it keeps its previous version.
    Nack {
        /// The type rejected.
        ty: ResourceType,
        /// The version the client rejected.
        version: Arc<str>,
        /// The nonce of the response rejected.
        nonce: Arc<str>,
        /// The client's `error_detail` message.
        message: String,
    },
    /// A request carrying a nonce that is not the latest: ignored (SotW).
    StaleNonce {
        /// The type of the request.
        ty: ResourceType,
        /// The nonce it carried.
        nonce: String,
    },
    /// A type this server does not serve; the request is ignored.
    UnknownType {
        /// The type URL as sent.
        type_url: String,
    },
    /// A per-type service got a request for another type.
    WrongType {
        /// The type URL as sent.
        type_url: String,
    },
}

/// A response computed by a machine, before wire framing.
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "unstable-internals"), allow(unreachable_pub))]
pub struct SotwResponse {
    /// The type of every resource in it.
    pub ty: ResourceType,
    /// `version_info`.
    pub version: Arc<str>,
    /// The response's nonce.
    pub nonce: Arc<str>,
    /// The resources sent (all of the type, or the subscribed ones).
    pub resources: Arc<ResourceMap>,
}

/// A Delta response computed by a machine, before wire framing.
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "unstable-internals"), allow(unreachable_pub))]
pub struct DeltaResponse {
    /// The type of every resource in it.
    pub ty: ResourceType,
    /// `system_version_info` (the snapshot's version of the type).
    pub system_version: Arc<str>,
    /// The response's nonce.
    pub nonce: Arc<str>,
    /// Resources added or changed.
    pub resources: Vec<Arc<Resource>>,
    /// Names the client must drop.
    pub removed: Vec<Arc<str>>,
}

/// What one stream knows of a type at the client.
pub(crate) enum TypeView<'a> {
    /// Never requested on this stream. On a resumed stream the client may
    /// still hold resources of it from an earlier one.
    NotRequested { resume_pending: bool },
    Requested {
        sub: &'a subscription::Subscription,
        acked: &'a ResourceMap,
    },
}

/// What a client holds, per type, as far as one stream knows.
pub(crate) trait ClientViews {
    fn view(&self, ty: ResourceType) -> TypeView<'_>;
    /// `None` when this stream does not deliver `ty`/`name` to the client
    /// (type never requested, or a named subscription that does not cover it).
    fn client_has(&self, ty: ResourceType, name: &str) -> Option<bool> {
        HeldLookup::new(ty, self.view(ty)).client_has(name)
    }
    /// Every resource the client holds or is being sent.
    fn for_each_held(&self, f: &mut dyn FnMut(&Resource));
    /// The map of `ty` the client acknowledged, when the type was requested.
    fn acked_map(&self, ty: ResourceType) -> Option<&Arc<ResourceMap>>;
}

/// [`ClientViews::client_has`] for many names of one type.
pub(crate) struct HeldLookup<'a> {
    ty: ResourceType,
    covers: Option<&'a subscription::Subscription>,
    resume_pending: bool,
    acked: Option<Seeker<'a>>,
}

impl<'a> HeldLookup<'a> {
    pub(crate) fn new(ty: ResourceType, view: TypeView<'a>) -> Self {
        match view {
            TypeView::Requested { sub, acked } => HeldLookup {
                ty,
                covers: Some(sub),
                resume_pending: false,
                acked: Some(Seeker::new(acked)),
            },
            TypeView::NotRequested { resume_pending } => HeldLookup {
                ty,
                covers: None,
                resume_pending,
                acked: None,
            },
        }
    }

    pub(crate) fn client_has(&mut self, name: &str) -> Option<bool> {
        let (Some(sub), Some(acked)) = (self.covers, self.acked.as_mut()) else {
            // A resumed client may hold resources of a type it has not asked
            // for again yet: wait for that request rather than assume it
            // does not take them from us.
            return self.resume_pending.then_some(false);
        };
        if self.ty != ResourceType::ClusterLoadAssignment && !sub.covers(name) {
            return None;
        }
        Some(acked.get(name).is_some())
    }
}

/// May a new version of `res` be sent now? Its hard references (clusters it
/// routes to) must exist at the client, and be warm: an EDS cluster's load
/// assignment must have been delivered too — when it comes on this stream
/// (`eds_config: ads`). A cluster whose endpoints come from elsewhere (an
/// `api_config_source`, `self`, a file) refers to no load assignment
/// ([`crate::resource`]): it is warm as far as this stream can tell.
pub(crate) fn hard_refs_ready(res: &Resource, snap: &Snapshot, views: &impl ClientViews) -> bool {
    if !res.refs().iter().any(|r| r.hard) {
        return true;
    }
    if let Some(ready) = hard_refs_ready_holding_all(res, snap, views) {
        #[cfg(test)]
        assert_eq!(
            ready,
            hard_refs_ready_walk(res, snap, views),
            "{} {}: the shortcut and the walk disagree",
            res.ty(),
            res.name()
        );
        return ready;
    }
    hard_refs_ready_walk(res, snap, views)
}

/// [`hard_refs_ready`] without looking up a single cluster, when the client
/// acknowledged exactly the names of `snap`'s clusters and load assignments
/// (the steady state) and `snap` was checked: every cluster a resource of it
/// routes to is then held, and so are that cluster's endpoints. A route
/// configuration of 10,000 routes no longer costs 10,000 lookups per proxy
/// per edit. Only hard references to other types are looked at. `None` when
/// the client's view is anything else.
fn hard_refs_ready_holding_all(
    res: &Resource,
    snap: &Snapshot,
    views: &impl ClientViews,
) -> Option<bool> {
    // Checked: the references of `snap`'s own resources resolve in it.
    if !snap.is_checked()
        || !snap
            .get(res.ty(), res.name())
            .is_some_and(|r| std::ptr::eq(&**r, res))
    {
        return None;
    }
    for ty in [ResourceType::Cluster, ResourceType::ClusterLoadAssignment] {
        if !snap.same_keys_since(ty, views.acked_map(ty)?) {
            return None;
        }
    }
    Some(
        outside_clusters(res.refs())
            .filter(|r| r.hard)
            .all(|r| views.client_has(r.ty, &r.name) != Some(false)),
    )
}

/// The references of a sorted list (as [`Resource::refs`] gives them: by type
/// first) that are not to clusters: the cluster block is found by two binary
/// searches and skipped, so a route configuration's 10,000 cluster references
/// are not walked per proxy per push (they were 3 % of a W3 SotW edit's CPU).
fn outside_clusters(refs: &[Ref]) -> impl Iterator<Item = &Ref> {
    let start = refs.partition_point(|r| r.ty < ResourceType::Cluster);
    let end = start + refs[start..].partition_point(|r| r.ty == ResourceType::Cluster);
    refs[..start].iter().chain(&refs[end..])
}

/// [`hard_refs_ready`] by looking up every hard reference at the client.
fn hard_refs_ready_walk(res: &Resource, snap: &Snapshot, views: &impl ClientViews) -> bool {
    let hard = res.refs().iter().filter(|r| r.hard);
    let mut clusters = HeldLookup::new(ResourceType::Cluster, views.view(ResourceType::Cluster));
    let mut endpoints = HeldLookup::new(
        ResourceType::ClusterLoadAssignment,
        views.view(ResourceType::ClusterLoadAssignment),
    );
    let mut known = Seeker::new(snap.resources(ResourceType::Cluster));
    for r in hard {
        let has = if r.ty == ResourceType::Cluster {
            clusters.client_has(&r.name)
        } else {
            views.client_has(r.ty, &r.name)
        };
        match has {
            None => continue,
            Some(false) => return false,
            Some(true) => {}
        }
        if r.ty == ResourceType::Cluster
            && let Some(cluster) = known.get(&r.name)
        {
            // A client that takes this cluster from us needs its endpoints
            // before traffic may go there, whether or not it has asked for
            // them yet (Envoy subscribes right after it sees the cluster).
            for soft in cluster.refs() {
                if soft.ty == ResourceType::ClusterLoadAssignment
                    && endpoints.client_has(&soft.name) != Some(true)
                {
                    return false;
                }
            }
        }
    }
    true
}

/// Everything referenced by what the client holds: those may not be removed yet.
pub(crate) fn referenced_by_client(views: &impl ClientViews) -> HashSet<(ResourceType, Arc<str>)> {
    let mut set = HashSet::new();
    views.for_each_held(&mut |res| {
        for r in res.refs() {
            set.insert((r.ty, r.name.clone()));
        }
    });
    set
}

/// Types whose resources may reference a resource of `ty` (and so must be
/// known before one may be removed).
pub(super) fn referrers(ty: ResourceType) -> &'static [ResourceType] {
    use ResourceType::*;
    match ty {
        Cluster => &[Listener, RouteConfiguration, VirtualHost],
        ClusterLoadAssignment => &[Cluster],
        RouteConfiguration => &[Listener],
        Secret => &[Cluster, Listener],
        // A VHDS route configuration names no virtual host: it is the
        // namespace Envoy subscribes to.
        Listener | VirtualHost => &[],
    }
}

/// The names of `ty` that `held` accepts and a referrer started to use between two
/// consecutive snapshots of `snaps` (newest first): a cluster (for EDS), a
/// listener (for RDS) or either (for SDS) that appeared (when `appeared`
/// counts: a SotW client forgets what a dropped referrer used and its version
/// cannot say so), or, for EDS, changed — Envoy rebuilds a changed cluster
/// and waits for its endpoints again, while a route configuration's or
/// secret's subscription is shared across a listener's versions. Sorted.
/// O(1) per pair of snapshots sharing the referrers' map (an endpoint
/// change), else O(changes) from the recorded change sets (or one walk).
pub(crate) fn referred_anew(
    ty: ResourceType,
    held: impl Fn(&str) -> bool,
    snaps: &[&Arc<Snapshot>],
    appeared: bool,
) -> Vec<Arc<str>> {
    let mut out: Vec<Arc<str>> = Vec::new();
    let mut note = |res: &Resource, before: Option<&Arc<Resource>>| {
        let anew = match before {
            None => appeared,
            Some(old) => {
                ty == ResourceType::ClusterLoadAssignment && old.version() != res.version()
            }
        };
        if anew {
            out.extend(
                res.refs()
                    .iter()
                    .filter(|x| x.ty == ty && held(&x.name))
                    .map(|x| x.name.clone()),
            );
        }
    };
    for pair in snaps.windows(2) {
        let (newer, older) = (pair[0], pair[1]);
        for &by in referrers(ty) {
            let (now, before) = (newer.resources(by), older.resources(by));
            if Arc::ptr_eq(now, before) {
                continue;
            }
            // Recorded when `newer` replaced `older` in the cache: O(1).
            match newer.changed_since(by, before) {
                Some(names) => {
                    let (mut n, mut b) = (
                        Seeker::sparse(now, names.len()),
                        Seeker::sparse(before, names.len()),
                    );
                    for name in names.iter() {
                        if let Some(res) = n.get(name) {
                            note(res, b.get(name));
                        }
                    }
                }
                None => {
                    let mut b = Seeker::new(before);
                    for (name, res) in now.iter() {
                        note(res, b.get(name));
                    }
                }
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// On a resumed stream (the client reported versions it holds from an
/// earlier stream), removals of `ty` wait until the stream has seen the first
/// request of every type whose resources the client may hold and which may
/// reference `ty`: until then the removal gate cannot see those references
/// (e.g. the client's routes, if its RDS request comes after CDS). Envoy
/// requests CDS and LDS at once, and RDS as soon as its listeners name route
/// configurations.
pub(crate) fn resume_holds_removals(
    ty: ResourceType,
    requested: impl Fn(ResourceType) -> bool,
    views: &impl ClientViews,
) -> bool {
    referrers(ty).iter().any(|&r| {
        !requested(r)
            && match r {
                ResourceType::RouteConfiguration => {
                    let mut rds = false;
                    views.for_each_held(&mut |res| {
                        rds |= res.ty() == ResourceType::Listener
                            && res
                                .refs()
                                .iter()
                                .any(|x| x.ty == ResourceType::RouteConfiguration);
                    });
                    rds
                }
                // Only an Envoy holding a VHDS route configuration (one with
                // no routes of its own, so no references) asks for virtual
                // hosts; a SotW or REST Envoy never does.
                ResourceType::VirtualHost => {
                    let mut vhds = false;
                    views.for_each_held(&mut |res| {
                        vhds |=
                            res.ty() == ResourceType::RouteConfiguration && res.refs().is_empty();
                    });
                    vhds
                }
                _ => true,
            }
    })
}

/// On ADS, a first request for EDS, RDS or SDS is still to come: what the
/// client holds names resources of a type it has not `requested` on this
/// stream yet (Envoy asks for all of its types at once when it reconnects).
/// A stream's keepalive waits for it, so the no-op can go on that type.
pub(crate) fn named_request_expected(
    requested: impl Fn(ResourceType) -> bool,
    views: &impl ClientViews,
) -> bool {
    let mut expected = false;
    views.for_each_held(&mut |res| {
        expected |= res
            .refs()
            .iter()
            .any(|r| !subscription::empty_first_request_is_wildcard(r.ty) && !requested(r.ty));
    });
    expected
}

/// The resource `ty`/`name` at `version`, from the current snapshot or a
/// recently published one: versions are content hashes, so a match is the
/// exact content the client holds.
pub(crate) fn find_version(
    current: Option<&Arc<Snapshot>>,
    history: &[Arc<Snapshot>],
    ty: ResourceType,
    name: &str,
    version: &str,
) -> Option<Arc<Resource>> {
    current
        .into_iter()
        .chain(history)
        .filter_map(|s| s.get(ty, name))
        .find(|r| r.version() == version)
        .cloned()
}

/// The type a request is for, or why it is ignored (unknown type, or another
/// type than a per-type service serves).
pub(crate) fn request_type(
    type_url: &str,
    only: Option<ResourceType>,
) -> Result<ResourceType, RequestOutcome> {
    let Some(ty) = ResourceType::from_type_url(type_url) else {
        return Err(RequestOutcome::UnknownType {
            type_url: type_url.to_string(),
        });
    };
    if only.is_some_and(|only| only != ty) {
        return Err(RequestOutcome::WrongType {
            type_url: type_url.to_string(),
        });
    }
    Ok(ty)
}

/// Per-stream nonce source: unique on the stream, never reused.
#[derive(Debug, Default)]
pub(crate) struct Nonces(u64);

impl Nonces {
    pub(crate) fn next(&mut self) -> Arc<str> {
        self.0 += 1;
        self.0.to_string().into()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `n` EDS clusters named by `name`, each with one endpoint on port 80 but
    /// the second (on `changed`); reusing and recording changes from `prev`,
    /// as the cache does when it publishes.
    pub(crate) fn eds_snapshot(
        n: usize,
        changed: u16,
        prev: Option<&Arc<Snapshot>>,
        name: impl Fn(usize) -> String,
    ) -> Arc<Snapshot> {
        let mut b = Snapshot::builder();
        if let Some(p) = prev {
            b = b.reuse_from(p.clone());
        }
        for i in 0..n {
            let name = name(i);
            b.message(&crate::simple::eds_cluster(
                &name,
                std::time::Duration::from_secs(1),
            ))
            .unwrap();
            let port = if i == 1 { changed } else { 80 };
            b.message(&crate::simple::load_assignment(
                &name,
                &[("127.0.0.1", port)],
            ))
            .unwrap();
        }
        let s = Arc::new(b.build().unwrap());
        if let Some(p) = prev {
            s.record_changes_from(p);
        }
        s
    }

    /// Two clusters; `timeout_s` is c0001's connect timeout (a CDS change), `port` its endpoint.
    pub(crate) fn cluster_snapshot(
        timeout_s: u64,
        port: u16,
        prev: Option<&Arc<Snapshot>>,
    ) -> Arc<Snapshot> {
        let mut b = Snapshot::builder();
        if let Some(p) = prev {
            b = b.reuse_from(p.clone());
        }
        for (name, t, port) in [("c0000", 1, 80), ("c0001", timeout_s, port)] {
            b.message(&crate::simple::eds_cluster(
                name,
                std::time::Duration::from_secs(t),
            ))
            .unwrap();
            b.message(&crate::simple::load_assignment(
                name,
                &[("127.0.0.1", port)],
            ))
            .unwrap();
        }
        let s = Arc::new(b.build().unwrap());
        if let Some(p) = prev {
            s.record_changes_from(p);
        }
        s
    }

    fn map(names: &std::collections::BTreeSet<String>) -> ResourceMap {
        names
            .iter()
            .map(|n| {
                let r = Resource::new(&crate::simple::load_assignment(n, &[("127.0.0.1", 80)]))
                    .expect("valid");
                (r.name_arc().clone(), r)
            })
            .collect()
    }

    proptest! {
        /// Skipping the cluster block of a sorted reference list leaves
        /// exactly the references that are not to clusters, in order, whatever
        /// types come before and after it (the readiness shortcut relies on it).
        #[test]
        fn outside_clusters_is_the_filter(
            refs in proptest::collection::btree_set(
                (0..ResourceType::ALL.len(), "[a-c]{1,2}", any::<bool>()),
                0..40,
            ),
        ) {
            let refs: Vec<Ref> = refs
                .into_iter()
                .map(|(t, name, hard)| Ref {
                    ty: ResourceType::ALL[t],
                    name: name.into(),
                    hard,
                })
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            let skipped: Vec<&Ref> = outside_clusters(&refs).collect();
            let filtered: Vec<&Ref> =
                refs.iter().filter(|r| r.ty != ResourceType::Cluster).collect();
            prop_assert_eq!(skipped, filtered);
        }

        /// The one-walk lookup answers like the map, for names in any order
        /// (in order they cost one walk; out of order they fall back).
        #[test]
        fn seeker_answers_like_the_map(
            keys in proptest::collection::btree_set("[a-e]{1,3}", 0..80),
            mut asks in proptest::collection::vec("[a-e]{1,3}", 0..30),
            sorted in any::<bool>(),
        ) {
            let m = map(&keys);
            if sorted {
                asks.sort();
            }
            let mut seek = Seeker::new(&m);
            for a in &asks {
                prop_assert_eq!(
                    seek.get_key_value(a).map(|(k, _)| k.clone()),
                    m.get_key_value(a.as_str()).map(|(k, _)| k.clone()),
                    "asking {}", a
                );
            }
        }
    }
}
