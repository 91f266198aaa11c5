//! Lease keep-alive: one bidirectional stream per lease; each `keep_alive` sends one refresh and
//! waits for its answer, so the caller's loop (e.g. every ttl/3) decides the pace.

use http::uri::PathAndQuery;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::client::{Client, grpc};
use crate::error::{Error, is_transport};
use crate::pb;

/// An open keep-alive stream for one lease.
pub struct LeaseKeepAlive {
    id: i64,
    endpoint: String,
    requests: mpsc::Sender<pb::LeaseKeepAliveRequest>,
    responses: tonic::Streaming<pb::LeaseKeepAliveResponse>,
    timeout: std::time::Duration,
}

impl std::fmt::Debug for LeaseKeepAlive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseKeepAlive")
            .field("id", &self.id)
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl LeaseKeepAlive {
    pub fn id(&self) -> i64 {
        self.id
    }

    /// Refreshes the lease; returns its new TTL in seconds. [`Error::LeaseNotFound`] when it
    /// already expired (its keys are gone: grant a new one and write them again); an
    /// unavailable error means this stream is dead: open a new one with
    /// [`Client::lease_keep_alive`].
    pub async fn keep_alive(&mut self) -> Result<i64, Error> {
        self.requests
            .send(pb::LeaseKeepAliveRequest { id: self.id })
            .await
            .map_err(|_| Error::Unavailable {
                endpoint: self.endpoint.clone(),
                message: "keep-alive stream closed".into(),
            })?;
        self.answer().await
    }

    /// Waits for the answer to the refresh just sent.
    async fn answer(&mut self) -> Result<i64, Error> {
        let unavailable = |endpoint: &str, message: String| Error::Unavailable {
            endpoint: endpoint.to_string(),
            message,
        };
        let resp = tokio::time::timeout(self.timeout, self.responses.message())
            .await
            .map_err(|_| Error::Timeout {
                endpoint: self.endpoint.clone(),
                after: self.timeout,
            })?
            .map_err(|s| Error::from_status(&s, &self.endpoint))?
            .ok_or_else(|| unavailable(&self.endpoint, "keep-alive stream closed".into()))?;
        if resp.ttl <= 0 {
            return Err(Error::LeaseNotFound { id: self.id });
        }
        Ok(resp.ttl)
    }
}

impl Client {
    /// Opens a keep-alive stream for lease `id` and refreshes it once (so a lease that already
    /// expired is reported here, as [`Error::LeaseNotFound`]).
    pub async fn lease_keep_alive(&self, id: i64) -> Result<LeaseKeepAlive, Error> {
        let n = self.endpoints().len();
        let mut last = None;
        for _ in 0..n {
            let (i, ch) = self.current();
            let endpoint = self.endpoint(i).to_string();
            let (tx, rx) = mpsc::channel(1);
            // etcd sends the response headers with its first answer, so the first refresh must
            // be queued before the call can complete.
            tx.try_send(pb::LeaseKeepAliveRequest { id })
                .expect("fresh channel has room");
            let open = async {
                let mut g = grpc(ch, self.options());
                g.ready()
                    .await
                    .map_err(|e| tonic::Status::from_error(Box::new(e)))?;
                let codec = tonic_prost::ProstCodec::<
                    pb::LeaseKeepAliveRequest,
                    pb::LeaseKeepAliveResponse,
                >::default();
                g.streaming(
                    tonic::Request::new(ReceiverStream::new(rx)),
                    PathAndQuery::from_static("/etcdserverpb.Lease/LeaseKeepAlive"),
                    codec,
                )
                .await
                .map(|r| r.into_inner())
            };
            let timeout = self.options().request_timeout;
            let opened = match tokio::time::timeout(timeout, open).await {
                Err(_) => Err(Error::Timeout {
                    endpoint: endpoint.clone(),
                    after: timeout,
                }),
                Ok(Err(s)) if is_transport(&s) => Err(Error::Unavailable {
                    endpoint: endpoint.clone(),
                    message: s.to_string(),
                }),
                Ok(Err(s)) => Err(Error::from_status(&s, &endpoint)),
                Ok(Ok(responses)) => Ok(responses),
            };
            let result = match opened {
                Ok(responses) => {
                    let mut k = LeaseKeepAlive {
                        id,
                        endpoint,
                        requests: tx,
                        responses,
                        timeout,
                    };
                    k.answer().await.map(|_| k)
                }
                Err(e) => Err(e),
            };
            match result {
                Err(e) if e.is_unavailable() => {
                    self.rotate(i);
                    last = Some(e);
                }
                other => return other,
            }
        }
        Err(last.expect("at least one endpoint"))
    }
}
