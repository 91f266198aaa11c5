//! Singleton work among replicas (with `--etcd`): one replica, elected through an etcd lease
//! ([`ballast_etcd::election`]), writes the computed object status (the conditions
//! `/debug/sources` shows) back to etcd at `<prefix>_status/objects`, so tools reading the store
//! see it without asking a replica. Every replica computes the same status from the same
//! revision; only the leader writes, each write fenced by the election key's create revision so
//! a replica that lost the role (e.g. partitioned past its lease) cannot overwrite its
//! successor. `/debug/leader` and `ballast_leader` say who leads.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use ballast_etcd::{Client, Compare, CompareOp, ElectionOptions, Leadership, Op, Txn};
use ballast_sources::SourceState;
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// The election key and the status key under `prefix` (bookkeeping: never read as config).
pub fn keys(prefix: &str) -> (String, String) {
    (
        format!("{prefix}_leader/status-writer"),
        format!("{prefix}_status/objects"),
    )
}

/// This replica's name in the election: `--leader-identity`, else host name, pid and admin
/// address (unique per process on a host, readable in `/debug/leader`).
pub fn identity(flag: Option<&str>, admin: std::net::SocketAddr) -> String {
    if let Some(id) = flag {
        return id.to_string();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}/{}@{admin}", std::process::id())
}

/// Starts the election and the status writer; both end with `stop` (the leader resigns).
pub fn start(
    client: Client,
    prefix: &str,
    identity: String,
    ttl: Duration,
    source: watch::Receiver<SourceState>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> LeaderInfo {
    let (election_key, status_key) = keys(prefix);
    let (rx, _task) = ballast_etcd::campaign(
        client.clone(),
        ElectionOptions {
            key: election_key.clone().into_bytes(),
            identity: identity.clone(),
            ttl,
            retry: Duration::from_millis(500),
        },
        stop.clone(),
    );
    tokio::spawn(write_status(
        client,
        election_key.clone(),
        status_key.clone(),
        identity.clone(),
        rx.clone(),
        source,
        metrics,
        stop,
    ));
    LeaderInfo {
        identity,
        election_key,
        status_key,
        leadership: rx,
    }
}

/// What `/debug/leader` shows.
#[derive(Clone)]
pub struct LeaderInfo {
    pub identity: String,
    pub election_key: String,
    pub status_key: String,
    pub leadership: watch::Receiver<Leadership>,
}

pub fn router(info: LeaderInfo) -> Router {
    Router::new()
        .route("/debug/leader", get(debug_leader))
        .with_state(info)
}

async fn debug_leader(State(info): State<LeaderInfo>) -> Response {
    let l = info.leadership.borrow().clone();
    axum::Json(json!({
        "identity": info.identity,
        "leader": l.leader,
        "holder": l.holder,
        "fence": l.fence,
        "terms": l.terms,
        "error": l.error,
        "election_key": info.election_key,
        "status_key": info.status_key,
    }))
    .into_response()
}

/// While leading, writes the status of each new config (and once on becoming leader).
#[allow(clippy::too_many_arguments)]
async fn write_status(
    client: Client,
    election_key: String,
    status_key: String,
    identity: String,
    mut leadership: watch::Receiver<Leadership>,
    mut source: watch::Receiver<SourceState>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    // (fence, generation) last written: a new term or a new config writes again.
    let mut written: Option<(i64, u64)> = None;
    let mut terms_seen = 0;
    loop {
        let l = leadership.borrow_and_update().clone();
        metrics.leader.set(l.leader as i64);
        metrics
            .leader_terms
            .inc_by(l.terms.saturating_sub(terms_seen));
        terms_seen = l.terms;
        let s = source.borrow_and_update().clone();
        let mut retry = false;
        if l.leader
            && let Some(config) = &s.config
            && written != Some((l.fence, s.generation))
        {
            let doc = json!({
                "writer": identity,
                "revision": s.revision,
                "status": ballast_model::status::compute(config),
            });
            let txn = Txn::new()
                .when([Compare::create_revision(
                    election_key.clone(),
                    CompareOp::Equal,
                    l.fence,
                )])
                .and_then([Op::put(status_key.clone(), doc.to_string())]);
            match client.txn(txn).await {
                Ok(r) if r.succeeded => {
                    written = Some((l.fence, s.generation));
                    metrics.status_writes.inc();
                    tracing::debug!(key = %status_key, revision = ?s.revision, "status written");
                }
                // Fenced out: another replica leads now; the election will say so.
                Ok(_) => tracing::warn!(key = %status_key, fence = l.fence,
                    "status not written: no longer the leader"),
                Err(e) => {
                    tracing::warn!(key = %status_key, error = %e, "status not written; retrying");
                    retry = true;
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            r = leadership.changed() => if r.is_err() { return },
            r = source.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(Duration::from_secs(1)), if retry => {}
        }
    }
}
