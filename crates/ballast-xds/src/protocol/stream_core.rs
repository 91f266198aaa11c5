//! What the SotW and Delta machines share on one stream: the per-type
//! array, the stream-level state (nonces, snapshot, resume hold,
//! keepalive), the client view the ordering gates read, and the status
//! report. The protocols differ in what a type's state *is* (a SotW type
//! tracks whole maps, a Delta type tracks names), so that stays in each
//! machine behind [`TypeState`]; everything here means the same in both.

use std::ops::{Index, IndexMut};
use std::sync::Arc;

use super::subscription::Subscription;
use super::{ClientViews, Nonces, RequestOutcome, TypeView};
use crate::resource::{Resource, ResourceType, TYPE_COUNT};
use crate::snapshot::{ResourceMap, Snapshot};
use crate::status::{NackInfo, SyncState, TypeStatus};

/// One value per resource type: a fixed array indexed by [`ResourceType`]
/// (no hashing on the hot path), iterated in [`ResourceType::ALL`] order,
/// which is the order types go out in (make before break).
#[derive(Clone, Debug)]
pub(crate) struct PerType<T>([T; TYPE_COUNT]);

impl<T: Default> Default for PerType<T> {
    fn default() -> Self {
        PerType(Default::default())
    }
}

impl<T> Index<ResourceType> for PerType<T> {
    type Output = T;
    fn index(&self, ty: ResourceType) -> &T {
        &self.0[ty.index()]
    }
}

impl<T> IndexMut<ResourceType> for PerType<T> {
    fn index_mut(&mut self, ty: ResourceType) -> &mut T {
        &mut self.0[ty.index()]
    }
}

impl<T> PerType<T> {
    /// Every type with its value, in [`ResourceType::ALL`] order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (ResourceType, &T)> {
        ResourceType::ALL.into_iter().zip(&self.0)
    }
}

impl<T> PerType<Option<T>> {
    /// The types that have a value, with it, in [`ResourceType::ALL`] order.
    pub(crate) fn present(&self) -> impl Iterator<Item = (ResourceType, &T)> {
        self.iter()
            .filter_map(|(ty, v)| v.as_ref().map(|v| (ty, v)))
    }
}

/// Where a type's responses stand on a stream, as status pages and CSDS
/// report it; both protocols keep these with the same meaning.
pub(crate) struct Progress<'a> {
    /// Version of the last response sent (SotW `version_info`, Delta
    /// `system_version_info`).
    pub(crate) sent_version: Option<&'a Arc<str>>,
    pub(crate) last_nonce: Option<&'a Arc<str>>,
    pub(crate) acked_version: Option<&'a Arc<str>>,
    pub(crate) nack: Option<&'a NackInfo>,
    pub(crate) in_flight: bool,
}

impl Progress<'_> {
    /// Where the type stands: a NACK outranks a response in flight, which
    /// outranks never having sent anything.
    fn sync_state(&self) -> SyncState {
        if self.nack.is_some() {
            SyncState::Error
        } else if self.in_flight {
            SyncState::Stale
        } else if self.sent_version.is_none() {
            SyncState::NotSent
        } else {
            SyncState::Synced
        }
    }
}

/// What the shared core reads of one machine's per-type state.
pub(crate) trait TypeState {
    fn sub(&self) -> &Subscription;
    /// What the client holds for sure (the gate for additions reads this).
    fn acked(&self) -> &Arc<ResourceMap>;
    /// Every resource the client holds, may hold, or is being sent: the
    /// removal gate keeps what these reference.
    fn for_each_held(&self, f: &mut dyn FnMut(&Resource));
    fn progress(&self) -> Progress<'_>;
}

/// The stream-level state both machines keep, with the per-type states
/// (`None` until the type's first request).
#[derive(Debug)]
pub(crate) struct StreamCore<T> {
    /// The one type a per-type service serves; `None` for ADS.
    pub(super) only: Option<ResourceType>,
    /// Boxed: a type's state is hundreds of bytes and a stream (an idle
    /// proxy) requests only some types, so the others cost a pointer.
    pub(super) types: PerType<Option<Box<T>>>,
    pub(super) nonces: Nonces,
    /// The snapshot to serve; `None` while the server is not ready for this
    /// stream's group (requests are then held, never answered).
    pub(super) snapshot: Option<Arc<Snapshot>>,
    /// The client reported what it holds on a first request: it resumes
    /// from an earlier stream, and removals wait until the types that may
    /// reference them were requested ([`super::resume_holds_removals`]).
    pub(super) resumed: bool,
    /// The resume hold was lifted (the driver gave up waiting for requests).
    pub(super) resume_released: bool,
    /// A response was sent on this stream (else a keepalive is owed).
    pub(super) answered: bool,
}

impl<T> StreamCore<T> {
    pub(super) fn new(only: Option<ResourceType>) -> Self {
        StreamCore {
            only,
            types: PerType::default(),
            nonces: Nonces::default(),
            snapshot: None,
            resumed: false,
            resume_released: false,
            answered: false,
        }
    }

    /// The type a request is for, or why it is ignored.
    pub(super) fn request_type(&self, type_url: &str) -> Result<ResourceType, RequestOutcome> {
        super::request_type(type_url, self.only)
    }

    /// The client has sent a first request for `ty` on this stream.
    pub(super) fn requested(&self, ty: ResourceType) -> bool {
        self.types[ty].is_some()
    }

    /// Resumed, and still waiting for the client's other first requests.
    pub(super) fn resume_pending(&self) -> bool {
        self.resumed && !self.resume_released && self.only.is_none()
    }

    /// Counts `resp` as the stream's answer (no keepalive owed after it).
    pub(super) fn answered<R>(&mut self, resp: Option<R>) -> Option<R> {
        self.answered |= resp.is_some();
        resp
    }
}

impl<T: TypeState> StreamCore<T> {
    /// Removals of `ty` wait: the stream resumed and a type that may
    /// reference `ty` has not been requested yet.
    pub(super) fn resume_holds_removals(&self, ty: ResourceType) -> bool {
        self.resume_pending() && super::resume_holds_removals(ty, |t| self.requested(t), self)
    }

    /// On ADS, a first request for EDS, RDS or SDS is still to come
    /// ([`super::named_request_expected`]): the keepalive waits for it.
    pub(super) fn named_request_expected(&self) -> bool {
        self.only.is_none()
            && !self.resume_released
            && super::named_request_expected(|t| self.requested(t), self)
    }

    /// Taking `newest` can wait for the client's next request: every type
    /// whose resources differ from the held snapshot's has a response in
    /// flight, so nothing of the change could be sent before that type's
    /// ACK or NACK, and the driver takes the newest snapshot on every
    /// request. A publish then costs such a stream no plan at all (W2: a
    /// fleet with its EDS response in flight is woken by every endpoint
    /// change). Any other difference (an idle or unrequested type, which
    /// may lift a hold on another) means the snapshot is taken now.
    pub(crate) fn newest_can_wait(&self, newest: &Arc<Snapshot>) -> bool {
        let Some(held) = &self.snapshot else {
            return false;
        };
        Arc::ptr_eq(held, newest)
            || ResourceType::ALL.into_iter().all(|ty| {
                Arc::ptr_eq(held.resources(ty), newest.resources(ty))
                    || self.types[ty]
                        .as_ref()
                        .is_some_and(|st| st.progress().in_flight)
            })
    }

    /// Per-type state, for status pages and CSDS.
    pub(super) fn status(&self) -> Vec<TypeStatus> {
        self.types
            .present()
            .map(|(ty, st)| {
                let p = st.progress();
                TypeStatus {
                    ty,
                    wildcard: st.sub().is_wildcard(),
                    subscribed: st.sub().len(),
                    sent_version: p.sent_version.cloned(),
                    sent_nonce: p.last_nonce.cloned(),
                    acked_version: p.acked_version.cloned(),
                    acked: st.acked().clone(),
                    nack: p.nack.cloned(),
                    state: p.sync_state(),
                }
            })
            .collect()
    }
}

impl<T: TypeState> ClientViews for StreamCore<T> {
    fn view(&self, ty: ResourceType) -> TypeView<'_> {
        match &self.types[ty] {
            None => TypeView::NotRequested {
                resume_pending: self.resume_pending(),
            },
            Some(st) => TypeView::Requested {
                sub: st.sub(),
                acked: st.acked(),
            },
        }
    }

    fn for_each_held(&self, f: &mut dyn FnMut(&Resource)) {
        for (_, st) in self.types.present() {
            st.for_each_held(f);
        }
    }

    fn acked_map(&self, ty: ResourceType) -> Option<&Arc<ResourceMap>> {
        self.types[ty].as_ref().map(|st| st.acked())
    }
}

impl RequestOutcome {
    /// The outcome of a NACK recorded as `info`.
    pub(super) fn nacked(ty: ResourceType, info: &NackInfo) -> Self {
        RequestOutcome::Nack {
            ty,
            version: info.version.clone(),
            nonce: info.nonce.clone(),
            message: info.message.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_type_indexes_and_iterates_in_make_before_break_order() {
        let mut p: PerType<Option<usize>> = PerType::default();
        p[ResourceType::Listener] = Some(3);
        p[ResourceType::Secret] = Some(0);
        assert_eq!(p[ResourceType::Listener], Some(3));
        assert_eq!(p[ResourceType::Cluster], None);
        let present: Vec<_> = p.present().map(|(ty, v)| (ty, *v)).collect();
        assert_eq!(
            present,
            vec![(ResourceType::Secret, 0), (ResourceType::Listener, 3)]
        );
        let all: Vec<ResourceType> = p.iter().map(|(ty, _)| ty).collect();
        assert_eq!(all, ResourceType::ALL);
    }

    #[test]
    fn sync_state_ranks_nack_then_in_flight_then_not_sent() {
        let v: Arc<str> = "v1".into();
        let nack = NackInfo {
            version: v.clone(),
            nonce: "1".into(),
            message: "bad".into(),
        };
        let progress = |sent: bool, nacked: bool, in_flight: bool| Progress {
            sent_version: sent.then_some(&v),
            last_nonce: None,
            acked_version: None,
            nack: nacked.then_some(&nack),
            in_flight,
        };
        assert_eq!(progress(true, true, true).sync_state(), SyncState::Error);
        assert_eq!(progress(true, false, true).sync_state(), SyncState::Stale);
        assert_eq!(
            progress(false, false, false).sync_state(),
            SyncState::NotSent
        );
        assert_eq!(progress(true, false, false).sync_state(), SyncState::Synced);
    }
}
