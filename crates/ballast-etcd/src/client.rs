//! The client: endpoints with failover, and the unary KV / lease / maintenance calls.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::uri::PathAndQuery;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::error::{Error, is_transport};
use crate::pb;

/// TLS material for `https://` endpoints (PEM). etcd's client certificate auth is optional.
#[derive(Clone, Debug, Default)]
pub struct TlsOptions {
    /// CA bundle that signed the etcd server certificates.
    pub ca_pem: Vec<u8>,
    /// Client certificate chain and key, when etcd runs with `--client-cert-auth`.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Server name to verify instead of the endpoint's host.
    pub domain: Option<String>,
}

impl TlsOptions {
    /// Reads a CA file and an optional client certificate/key pair; errors name the file.
    pub fn from_files(
        ca: &Path,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<TlsOptions, Error> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|e| Error::Tls(format!("reading {}: {e}", p.display())))
        };
        let identity = match (cert, key) {
            (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
            (None, None) => None,
            _ => {
                return Err(Error::Tls(
                    "a client certificate needs both a cert and a key file".into(),
                ));
            }
        };
        Ok(TlsOptions {
            ca_pem: read(ca)?,
            identity,
            domain: None,
        })
    }
}

/// Timeouts and transport settings.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Bound on each unary call and on opening a watch/keep-alive stream; a member that does not
    /// answer in time is treated as unavailable and the next endpoint is tried.
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    /// HTTP/2 pings on idle connections, so a watch on a member that vanished without closing
    /// the TCP connection (partition, blackhole) fails instead of waiting forever. etcd's default
    /// `--grpc-keepalive-min-time` is 5 s; pinging more often gets the connection closed.
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// Largest response accepted (a range of many big objects; etcd's own limit is on requests).
    pub max_response_bytes: usize,
    pub tls: Option<TlsOptions>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(5),
            max_response_bytes: 256 << 20,
            tls: None,
        }
    }
}

/// An etcd v3 client over one or more members of a cluster. Cheap to clone (shared
/// connections).
///
/// Calls go to one member at a time; on a connection error (or, for reads, a member that has
/// no leader or does not answer in time) the client moves to the next endpoint and, for reads
/// and for writes that provably never reached a member, retries there, so one dead member
/// costs at most one connect timeout per call.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Vec<String>,
    channels: Vec<Channel>,
    current: AtomicUsize,
    opts: ClientOptions,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("endpoints", &self.inner.endpoints)
            .finish()
    }
}

/// A key range: one key, or every key starting with a prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyRange {
    Key(Vec<u8>),
    Prefix(Vec<u8>),
}

impl KeyRange {
    pub fn key(k: impl Into<Vec<u8>>) -> Self {
        KeyRange::Key(k.into())
    }

    pub fn prefix(p: impl Into<Vec<u8>>) -> Self {
        KeyRange::Prefix(p.into())
    }

    /// `(key, range_end)` as etcd wants them.
    pub(crate) fn to_wire(&self) -> (Vec<u8>, Vec<u8>) {
        match self {
            KeyRange::Key(k) => (k.clone(), Vec::new()),
            KeyRange::Prefix(p) => (p.clone(), prefix_end(p)),
        }
    }
}

/// The smallest key greater than every key starting with `prefix` (etcd's `GetPrefixRangeEnd`);
/// `[0]` (all keys) for an empty or all-0xff prefix.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A consistent listing: every key of a range at one revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    /// The store revision the listing reflects; watch from `revision + 1` to miss nothing.
    pub revision: i64,
    pub kvs: Vec<pb::KeyValue>,
}

/// What `status` reports about the member that answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberStatus {
    pub endpoint: String,
    pub member_id: u64,
    /// The member id of the leader (0: no leader).
    pub leader: u64,
    pub revision: i64,
    pub raft_term: u64,
    pub version: String,
    pub errors: Vec<String>,
}

/// Comparison in a transaction guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    Equal,
    NotEqual,
    Greater,
    Less,
}

impl CompareOp {
    fn wire(self) -> i32 {
        (match self {
            CompareOp::Equal => pb::CompareResult::Equal,
            CompareOp::NotEqual => pb::CompareResult::NotEqual,
            CompareOp::Greater => pb::CompareResult::Greater,
            CompareOp::Less => pb::CompareResult::Less,
        }) as i32
    }
}

/// A transaction guard on one key. `version(key, Equal, 0)` / `create_revision(key, Equal, 0)`
/// mean "key does not exist"; `mod_revision(key, Equal, r)` is optimistic concurrency.
#[derive(Clone, Debug, PartialEq)]
pub struct Compare(pub pb::Compare);

impl Compare {
    fn new(
        key: Vec<u8>,
        op: CompareOp,
        target: pb::CompareTarget,
        v: pb::compare::TargetUnion,
    ) -> Self {
        Compare(pb::Compare {
            result: op.wire(),
            target: target as i32,
            key,
            target_union: Some(v),
            range_end: Vec::new(),
        })
    }

    pub fn version(key: impl Into<Vec<u8>>, op: CompareOp, version: i64) -> Self {
        Self::new(
            key.into(),
            op,
            pb::CompareTarget::Version,
            pb::compare::TargetUnion::Version(version),
        )
    }

    pub fn create_revision(key: impl Into<Vec<u8>>, op: CompareOp, rev: i64) -> Self {
        Self::new(
            key.into(),
            op,
            pb::CompareTarget::Create,
            pb::compare::TargetUnion::CreateRevision(rev),
        )
    }

    pub fn mod_revision(key: impl Into<Vec<u8>>, op: CompareOp, rev: i64) -> Self {
        Self::new(
            key.into(),
            op,
            pb::CompareTarget::Mod,
            pb::compare::TargetUnion::ModRevision(rev),
        )
    }

    pub fn value(key: impl Into<Vec<u8>>, op: CompareOp, value: impl Into<Vec<u8>>) -> Self {
        Self::new(
            key.into(),
            op,
            pb::CompareTarget::Value,
            pb::compare::TargetUnion::Value(value.into()),
        )
    }
}

/// An operation inside a transaction.
#[derive(Clone, Debug, PartialEq)]
pub struct Op(pub pb::RequestOp);

impl Op {
    fn req(r: pb::request_op::Request) -> Self {
        Op(pb::RequestOp { request: Some(r) })
    }

    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        Self::put_with_lease(key, value, 0)
    }

    pub fn put_with_lease(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: i64) -> Self {
        Self::req(pb::request_op::Request::RequestPut(pb::PutRequest {
            key: key.into(),
            value: value.into(),
            lease,
            prev_kv: false,
        }))
    }

    pub fn delete(range: KeyRange) -> Self {
        let (key, range_end) = range.to_wire();
        Self::req(pb::request_op::Request::RequestDeleteRange(
            pb::DeleteRangeRequest {
                key,
                range_end,
                prev_kv: false,
            },
        ))
    }

    pub fn get(range: KeyRange) -> Self {
        let (key, range_end) = range.to_wire();
        Self::req(pb::request_op::Request::RequestRange(pb::RangeRequest {
            key,
            range_end,
            ..Default::default()
        }))
    }
}

/// A transaction: if every compare holds, run `success`, else `failure`, atomically.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Txn {
    pub compares: Vec<Compare>,
    pub success: Vec<Op>,
    pub failure: Vec<Op>,
}

impl Txn {
    pub fn new() -> Self {
        Txn::default()
    }

    pub fn when(mut self, c: impl IntoIterator<Item = Compare>) -> Self {
        self.compares.extend(c);
        self
    }

    pub fn and_then(mut self, ops: impl IntoIterator<Item = Op>) -> Self {
        self.success.extend(ops);
        self
    }

    pub fn or_else(mut self, ops: impl IntoIterator<Item = Op>) -> Self {
        self.failure.extend(ops);
        self
    }
}

/// The outcome of a transaction.
#[derive(Clone, Debug, PartialEq)]
pub struct TxnResult {
    /// Whether the compares held (the success branch ran).
    pub succeeded: bool,
    /// The store revision after the transaction.
    pub revision: i64,
    /// One response per op of the branch that ran.
    pub responses: Vec<pb::ResponseOp>,
}

/// A granted lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub id: i64,
    /// Seconds, as granted by the server.
    pub ttl: i64,
}

/// How a failed call may be retried on another endpoint.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Reads: any unavailability or timeout.
    Idempotent,
    /// Writes: only when the request provably never reached a member (connection error).
    TransportOnly,
}

pub(crate) enum CallError {
    Timeout,
    Status(tonic::Status),
}

impl Client {
    /// A client for `endpoints` (`http://host:port`, `https://host:port` with `opts.tls`, or a
    /// bare `host:port` meaning http). Connects lazily: no I/O happens here, so a control plane
    /// can start while etcd is down and sync when it comes up. Needs a tokio runtime.
    pub fn new(endpoints: &[impl AsRef<str>], opts: ClientOptions) -> Result<Client, Error> {
        if endpoints.is_empty() {
            return Err(Error::InvalidEndpoint {
                endpoint: String::new(),
                reason: "no endpoints given".into(),
            });
        }
        let mut names = Vec::new();
        let mut channels = Vec::new();
        for e in endpoints {
            let raw = e.as_ref().trim();
            let url = if raw.contains("://") {
                raw.to_string()
            } else {
                format!("http://{raw}")
            };
            let invalid = |reason: String| Error::InvalidEndpoint {
                endpoint: raw.to_string(),
                reason,
            };
            let mut ep = Endpoint::from_shared(url.clone())
                .map_err(|e| invalid(e.to_string()))?
                .connect_timeout(opts.connect_timeout)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(opts.keepalive_interval)
                .keep_alive_timeout(opts.keepalive_timeout)
                .keep_alive_while_idle(true);
            if url.starts_with("https://") {
                let Some(tls) = &opts.tls else {
                    return Err(invalid("https needs a CA (--etcd-ca)".into()));
                };
                let mut cfg =
                    ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
                if let Some((cert, key)) = &tls.identity {
                    cfg = cfg.identity(Identity::from_pem(cert, key));
                }
                if let Some(d) = &tls.domain {
                    cfg = cfg.domain_name(d.clone());
                }
                ep = ep.tls_config(cfg).map_err(|e| Error::Tls(e.to_string()))?;
            } else if !url.starts_with("http://") {
                return Err(invalid("scheme must be http or https".into()));
            }
            names.push(url);
            channels.push(ep.connect_lazy());
        }
        Ok(Client {
            inner: Arc::new(Inner {
                endpoints: names,
                channels,
                current: AtomicUsize::new(0),
                opts,
            }),
        })
    }

    pub fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    pub fn options(&self) -> &ClientOptions {
        &self.inner.opts
    }

    /// The endpoint calls currently go to, and its channel.
    pub(crate) fn current(&self) -> (usize, Channel) {
        let i = self.inner.current.load(Ordering::Relaxed) % self.inner.channels.len();
        (i, self.inner.channels[i].clone())
    }

    pub(crate) fn endpoint(&self, i: usize) -> &str {
        &self.inner.endpoints[i]
    }

    /// Moves to the endpoint after `from` (unless another call already moved on).
    pub(crate) fn rotate(&self, from: usize) {
        let n = self.inner.channels.len();
        let _ = self.inner.current.compare_exchange(
            from,
            (from + 1) % n,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// One unary call with failover (see [`Client`]).
    pub(crate) async fn call<Req, Resp>(
        &self,
        path: &'static str,
        req: Req,
        retry: Retry,
    ) -> Result<Resp, Error>
    where
        Req: prost::Message + Clone + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let n = self.inner.channels.len();
        let mut last = None;
        for _ in 0..n {
            let (i, ch) = self.current();
            let endpoint = self.endpoint(i).to_string();
            match unary::<Req, Resp>(ch, path, req.clone(), &self.inner.opts).await {
                Ok(resp) => return Ok(resp),
                Err(CallError::Timeout) => {
                    self.rotate(i);
                    let err = Error::Timeout {
                        endpoint,
                        after: self.inner.opts.request_timeout,
                    };
                    if retry == Retry::Idempotent {
                        last = Some(err);
                        continue;
                    }
                    return Err(err);
                }
                Err(CallError::Status(s)) => {
                    let err = Error::from_status(&s, &endpoint);
                    if is_transport(&s) || err.is_unavailable() {
                        self.rotate(i);
                        if is_transport(&s) || retry == Retry::Idempotent {
                            tracing::debug!(%endpoint, error = %err, "etcd call failed, trying next endpoint");
                            last = Some(err);
                            continue;
                        }
                    }
                    return Err(err);
                }
            }
        }
        Err(last.expect("at least one endpoint"))
    }

    /// One key, or `None`.
    pub async fn get(&self, key: impl Into<Vec<u8>>) -> Result<Option<pb::KeyValue>, Error> {
        let resp = self
            .range(pb::RangeRequest {
                key: key.into(),
                ..Default::default()
            })
            .await?;
        Ok(resp.kvs.into_iter().next())
    }

    /// A raw (linearizable unless `serializable`) range request.
    pub async fn range(&self, req: pb::RangeRequest) -> Result<pb::RangeResponse, Error> {
        self.call("/etcdserverpb.KV/Range", req, Retry::Idempotent)
            .await
    }

    /// Every key in `range` at one revision (`revision` 0 = the current one), fetched in pages
    /// of `page` keys all pinned to the revision of the first page, so the listing is
    /// consistent however large. A compacted `revision` gives [`Error::Compacted`].
    pub async fn list(&self, range: &KeyRange, revision: i64, page: i64) -> Result<Listing, Error> {
        let (mut key, range_end) = range.to_wire();
        let mut rev = revision;
        let mut kvs = Vec::new();
        loop {
            let resp = self
                .range(pb::RangeRequest {
                    key: key.clone(),
                    range_end: range_end.clone(),
                    limit: page.max(0),
                    revision: rev,
                    ..Default::default()
                })
                .await?;
            if rev == 0 {
                rev = resp.header.as_ref().map_or(0, |h| h.revision);
            }
            let more = resp.more;
            kvs.extend(resp.kvs);
            if !more || range_end.is_empty() {
                return Ok(Listing { revision: rev, kvs });
            }
            // Next page: the key right after the last one.
            key = kvs.last().map(|kv| kv.key.clone()).unwrap_or_default();
            key.push(0);
        }
    }

    /// Sets a key; returns the new store revision.
    pub async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<i64, Error> {
        self.put_with_lease(key, value, 0).await
    }

    /// Sets a key attached to a lease (deleted when the lease expires).
    pub async fn put_with_lease(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        lease: i64,
    ) -> Result<i64, Error> {
        let resp: pb::PutResponse = self
            .call(
                "/etcdserverpb.KV/Put",
                pb::PutRequest {
                    key: key.into(),
                    value: value.into(),
                    lease,
                    prev_kv: false,
                },
                Retry::TransportOnly,
            )
            .await?;
        Ok(revision_of(&resp.header))
    }

    /// Deletes a key or a prefix; returns `(revision, keys deleted)`.
    pub async fn delete(&self, range: KeyRange) -> Result<(i64, i64), Error> {
        let (key, range_end) = range.to_wire();
        let resp: pb::DeleteRangeResponse = self
            .call(
                "/etcdserverpb.KV/DeleteRange",
                pb::DeleteRangeRequest {
                    key,
                    range_end,
                    prev_kv: false,
                },
                Retry::TransportOnly,
            )
            .await?;
        Ok((revision_of(&resp.header), resp.deleted))
    }

    /// Runs a transaction.
    pub async fn txn(&self, txn: Txn) -> Result<TxnResult, Error> {
        let resp: pb::TxnResponse = self
            .call(
                "/etcdserverpb.KV/Txn",
                pb::TxnRequest {
                    compare: txn.compares.into_iter().map(|c| c.0).collect(),
                    success: txn.success.into_iter().map(|o| o.0).collect(),
                    failure: txn.failure.into_iter().map(|o| o.0).collect(),
                },
                Retry::TransportOnly,
            )
            .await?;
        Ok(TxnResult {
            succeeded: resp.succeeded,
            revision: revision_of(&resp.header),
            responses: resp.responses,
        })
    }

    /// Compacts the history up to `revision` (watches and reads below it fail with
    /// [`Error::Compacted`]). `physical` waits until the space is reclaimed.
    pub async fn compact(&self, revision: i64, physical: bool) -> Result<i64, Error> {
        let resp: pb::CompactionResponse = self
            .call(
                "/etcdserverpb.KV/Compact",
                pb::CompactionRequest { revision, physical },
                Retry::TransportOnly,
            )
            .await?;
        Ok(revision_of(&resp.header))
    }

    /// Grants a lease of `ttl` seconds.
    pub async fn lease_grant(&self, ttl: i64) -> Result<Lease, Error> {
        let resp: pb::LeaseGrantResponse = self
            .call(
                "/etcdserverpb.Lease/LeaseGrant",
                pb::LeaseGrantRequest { ttl, id: 0 },
                Retry::TransportOnly,
            )
            .await?;
        if !resp.error.is_empty() {
            return Err(Error::Rpc {
                endpoint: self.endpoint(self.current().0).to_string(),
                code: tonic::Code::Unknown,
                message: resp.error,
            });
        }
        Ok(Lease {
            id: resp.id,
            ttl: resp.ttl,
        })
    }

    /// Revokes a lease, deleting every key attached to it.
    pub async fn lease_revoke(&self, id: i64) -> Result<(), Error> {
        let r: Result<pb::LeaseRevokeResponse, _> = self
            .call(
                "/etcdserverpb.Lease/LeaseRevoke",
                pb::LeaseRevokeRequest { id },
                Retry::Idempotent,
            )
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(Error::Rpc {
                code: tonic::Code::NotFound,
                ..
            }) => Err(Error::LeaseNotFound { id }),
            Err(e) => Err(e),
        }
    }

    /// Status of the member calls currently go to.
    pub async fn status(&self) -> Result<MemberStatus, Error> {
        let (i, _) = self.current();
        let resp: pb::StatusResponse = self
            .call(
                "/etcdserverpb.Maintenance/Status",
                pb::StatusRequest {},
                Retry::Idempotent,
            )
            .await?;
        let header = resp.header.unwrap_or_default();
        Ok(MemberStatus {
            endpoint: self.endpoint(i).to_string(),
            member_id: header.member_id,
            leader: resp.leader,
            revision: header.revision,
            raft_term: resp.raft_term,
            version: resp.version,
            errors: resp.errors,
        })
    }
}

pub(crate) fn revision_of(h: &Option<pb::ResponseHeader>) -> i64 {
    h.as_ref().map_or(0, |h| h.revision)
}

/// A gRPC client on `ch` with our limits.
pub(crate) fn grpc(ch: Channel, opts: &ClientOptions) -> tonic::client::Grpc<Channel> {
    tonic::client::Grpc::new(ch).max_decoding_message_size(opts.max_response_bytes)
}

async fn unary<Req, Resp>(
    ch: Channel,
    path: &'static str,
    req: Req,
    opts: &ClientOptions,
) -> Result<Resp, CallError>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let fut = async move {
        let mut g = grpc(ch, opts);
        g.ready()
            .await
            .map_err(|e| tonic::Status::from_error(Box::new(e)))?;
        let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
        g.unary(
            tonic::Request::new(req),
            PathAndQuery::from_static(path),
            codec,
        )
        .await
        .map(|r| r.into_inner())
    };
    match tokio::time::timeout(opts.request_timeout, fut).await {
        Ok(r) => r.map_err(CallError::Status),
        Err(_) => Err(CallError::Timeout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_matches_etcd() {
        assert_eq!(prefix_end(b"/ballast/"), b"/ballast0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }

    #[tokio::test]
    async fn endpoints_are_validated_without_io() {
        let opts = ClientOptions::default();
        assert!(Client::new(&["127.0.0.1:2379", "http://127.0.0.1:2380"], opts.clone()).is_ok());
        let e = Client::new(&["https://127.0.0.1:2379"], opts.clone()).unwrap_err();
        assert!(e.to_string().contains("needs a CA"), "{e}");
        let e = Client::new(&["ftp://x:1"], opts.clone()).unwrap_err();
        assert!(matches!(e, Error::InvalidEndpoint { .. }), "{e}");
        assert!(Client::new(&[] as &[&str], opts).is_err());
    }
}
