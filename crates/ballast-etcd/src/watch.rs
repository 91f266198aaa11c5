//! Watches: one bidirectional `Watch` stream per [`Watch`], surfaced as a `Stream` of event
//! batches that ends with an error when the server or the connection ends it.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use http::uri::PathAndQuery;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::client::{Client, KeyRange, grpc};
use crate::error::{Error, is_transport};
use crate::pb;

/// What to watch from where.
#[derive(Clone, Debug)]
pub struct WatchOptions {
    /// First revision to report (0: from now). After a listing at revision `r`, use `r + 1`.
    pub start_revision: i64,
    /// Include each key's previous value in events (needed to know what a delete removed).
    pub prev_kv: bool,
    /// Ask for periodic empty batches carrying the current revision, so an idle watcher still
    /// learns how far the store has moved.
    pub progress_notify: bool,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions {
            start_revision: 0,
            prev_kv: false,
            progress_notify: true,
        }
    }
}

/// Put or delete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// One change of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    pub kind: EventKind,
    /// For a delete: the key, with `mod_revision` the delete's revision and no value.
    pub kv: pb::KeyValue,
    pub prev_kv: Option<pb::KeyValue>,
}

/// The events of one watch response: all changes up to `revision` (one or more whole
/// transactions), or none for a progress notification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchBatch {
    /// The store revision this batch brings the watcher up to.
    pub revision: i64,
    pub events: Vec<WatchEvent>,
}

/// An open watch. Yields `Ok(batch)` until the watch ends, then one `Err` saying why
/// ([`Error::Compacted`] when the start revision is gone, [`Error::Unavailable`] when the
/// member or connection went away, [`Error::WatchCanceled`] otherwise), then `None`.
/// Dropping it cancels the watch.
pub struct Watch {
    // Held so the request half stays open: etcd ends the stream when the client half closes.
    _requests: mpsc::Sender<pb::WatchRequest>,
    responses: tonic::Streaming<pb::WatchResponse>,
    endpoint: String,
    watch_id: i64,
    /// The store revision when etcd created the watch (its first response's header).
    created_revision: i64,
    done: bool,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("endpoint", &self.endpoint)
            .field("watch_id", &self.watch_id)
            .finish()
    }
}

impl Watch {
    /// The member this watch is on.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The member's store revision when it created the watch. Lower than the revision a
    /// watcher already applied means the store went back (restored from an older backup):
    /// etcd accepts a watch from a future revision and would stay silent until the store
    /// passes it, so the watcher must relist instead.
    pub fn created_revision(&self) -> i64 {
        self.created_revision
    }

    /// Turns a response into what the stream yields (`None`: nothing to yield, keep polling).
    fn interpret(&mut self, resp: pb::WatchResponse) -> Option<Result<WatchBatch, Error>> {
        if resp.compact_revision != 0 {
            self.done = true;
            return Some(Err(Error::Compacted {
                compact_revision: resp.compact_revision,
            }));
        }
        if resp.canceled {
            self.done = true;
            let reason = resp.cancel_reason;
            return Some(Err(if reason.contains("no leader") {
                Error::Unavailable {
                    endpoint: self.endpoint.clone(),
                    message: reason,
                }
            } else {
                Error::WatchCanceled { reason }
            }));
        }
        if resp.created && resp.events.is_empty() {
            return None;
        }
        let revision = resp.header.as_ref().map_or(0, |h| h.revision);
        let events = resp
            .events
            .into_iter()
            .map(|e| WatchEvent {
                kind: if e.r#type == pb::EventType::Delete as i32 {
                    EventKind::Delete
                } else {
                    EventKind::Put
                },
                kv: e.kv.unwrap_or_default(),
                prev_kv: e.prev_kv,
            })
            .collect();
        Some(Ok(WatchBatch { revision, events }))
    }
}

impl Stream for Watch {
    type Item = Result<WatchBatch, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut self.responses).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(resp))) => {
                    if let Some(item) = self.interpret(resp) {
                        return Poll::Ready(Some(item));
                    }
                }
                Poll::Ready(Some(Err(status))) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(Error::from_status(&status, &self.endpoint))));
                }
                Poll::Ready(None) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(Error::Unavailable {
                        endpoint: self.endpoint.clone(),
                        message: "watch stream closed".into(),
                    })));
                }
            }
        }
    }
}

impl Client {
    /// Opens a watch on `range` and waits until etcd confirms it (so a returned `Watch` is
    /// live: every change after `opts.start_revision` will be seen). Tries the next endpoint on
    /// connection errors. Watches require a leader (etcd's `hasleader` metadata): a member cut
    /// off from the cluster ends the watch with [`Error::Unavailable`] instead of silently
    /// delivering nothing.
    pub async fn watch(&self, range: KeyRange, opts: WatchOptions) -> Result<Watch, Error> {
        let n = self.endpoints().len();
        let mut last = None;
        for _ in 0..n {
            let (i, ch) = self.current();
            let endpoint = self.endpoint(i).to_string();
            match self.open_watch(ch, &endpoint, &range, &opts).await {
                Ok(w) => return Ok(w),
                Err(e) if e.is_unavailable() => {
                    self.rotate(i);
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("at least one endpoint"))
    }

    async fn open_watch(
        &self,
        ch: tonic::transport::Channel,
        endpoint: &str,
        range: &KeyRange,
        opts: &WatchOptions,
    ) -> Result<Watch, Error> {
        let (key, range_end) = range.to_wire();
        let (tx, rx) = mpsc::channel(4);
        tx.try_send(pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                pb::WatchCreateRequest {
                    key,
                    range_end,
                    start_revision: opts.start_revision,
                    progress_notify: opts.progress_notify,
                    prev_kv: opts.prev_kv,
                },
            )),
        })
        .expect("fresh channel has room");
        let timeout = self.options().request_timeout;
        let status_err = |s: tonic::Status| {
            if is_transport(&s) {
                Error::Unavailable {
                    endpoint: endpoint.to_string(),
                    message: s.to_string(),
                }
            } else {
                Error::from_status(&s, endpoint)
            }
        };
        let open = async {
            let mut g = grpc(ch, self.options());
            g.ready()
                .await
                .map_err(|e| status_err(tonic::Status::from_error(Box::new(e))))?;
            let mut req = tonic::Request::new(ReceiverStream::new(rx));
            req.metadata_mut().insert(
                "hasleader",
                tonic::metadata::MetadataValue::from_static("true"),
            );
            let codec = tonic_prost::ProstCodec::<pb::WatchRequest, pb::WatchResponse>::default();
            let mut responses = g
                .streaming(
                    req,
                    PathAndQuery::from_static("/etcdserverpb.Watch/Watch"),
                    codec,
                )
                .await
                .map_err(status_err)?
                .into_inner();
            // The first response confirms the watch (or says why not).
            let first = responses
                .message()
                .await
                .map_err(status_err)?
                .ok_or_else(|| Error::Unavailable {
                    endpoint: endpoint.to_string(),
                    message: "watch stream closed before it was created".into(),
                })?;
            Ok::<_, Error>((responses, first))
        };
        let (responses, first) =
            tokio::time::timeout(timeout, open)
                .await
                .map_err(|_| Error::Timeout {
                    endpoint: endpoint.to_string(),
                    after: timeout,
                })??;
        let mut w = Watch {
            _requests: tx,
            responses,
            endpoint: endpoint.to_string(),
            watch_id: first.watch_id,
            created_revision: first.header.as_ref().map_or(0, |h| h.revision),
            done: false,
        };
        if let Some(Err(e)) = w.interpret(first) {
            return Err(e);
        }
        Ok(w)
    }
}
