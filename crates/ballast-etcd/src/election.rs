//! Leader election on one key, for work exactly one of several replicas must do.
//!
//! A candidate grants itself a lease and, in one transaction, creates the election key bound
//! to it if the key does not exist (`create_revision == 0`), else reads who holds it. The
//! holder keeps its lease alive every ttl/3; the others watch the key and campaign again when
//! it is deleted (the leader resigned, or died and its lease expired: a SIGKILLed leader is
//! replaced one TTL later). A leader steps down (publishes `leader: false` first) when its lease
//! is gone, when the key is deleted or rebound, and when it could not refresh the lease for
//! 2/3 of the TTL: it can no longer prove it holds it, and etcd may expire it soon.
//!
//! Stepping down is advisory for the work itself: a partitioned leader may still be writing
//! when its lease expires. Writes that must not come from a former leader are fenced with
//! [`Leadership::fence`] (the key's create revision): guard them with
//! `Compare::create_revision(key, Equal, fence)` and they fail once another leader holds it.

use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::{Client, Compare, CompareOp, KeyRange, Op, Txn};
use crate::error::Error;
use crate::pb;
use crate::watch::{EventKind, WatchOptions};

/// What to campaign for, as whom.
#[derive(Clone, Debug)]
pub struct ElectionOptions {
    /// The election key (e.g. `/ballast/_leader/status`).
    pub key: Vec<u8>,
    /// This candidate's name, stored as the key's value while it leads.
    pub identity: String,
    /// Lease TTL: how long a dead leader holds the role (whole seconds, at least 1).
    pub ttl: Duration,
    /// Pause after an error before campaigning again.
    pub retry: Duration,
}

/// This candidate's view of the election.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leadership {
    /// This candidate leads and may do the singleton work.
    pub leader: bool,
    /// Who leads (the key's value), when known.
    pub holder: Option<String>,
    /// While leading: the election key's create revision (a fencing token, see module docs).
    pub fence: i64,
    /// How many times this candidate became leader.
    pub terms: u64,
    /// The latest error talking to etcd (cleared by the next successful campaign).
    pub error: Option<String>,
}

/// Starts campaigning; the task runs until `stop` is cancelled (then resigns: deletes the key
/// by revoking its lease, so another candidate takes over at once) or every receiver is gone.
pub fn campaign(
    client: Client,
    opts: ElectionOptions,
    stop: CancellationToken,
) -> (watch::Receiver<Leadership>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(Leadership::default());
    let task = tokio::spawn(run(client, opts, tx, stop));
    (rx, task)
}

/// Why a term (one lease) ended.
enum End {
    Stop,
    Retry(Error),
}

async fn run(
    client: Client,
    opts: ElectionOptions,
    tx: watch::Sender<Leadership>,
    stop: CancellationToken,
) {
    loop {
        let end = tokio::select! {
            _ = tx.closed() => End::Stop,
            e = one_lease(&client, &opts, &tx, &stop) => e,
        };
        step_down(&tx, &opts, "lease ended");
        match end {
            End::Stop => return,
            End::Retry(e) => {
                tracing::warn!(key = %String::from_utf8_lossy(&opts.key), error = %e,
                    "leader election: etcd error; campaigning again");
                let msg = e.to_string();
                tx.send_if_modified(|l| {
                    let changed = l.error.as_deref() != Some(msg.as_str());
                    l.error = Some(msg.clone());
                    changed
                });
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(opts.retry) => {}
                }
            }
        }
    }
}

/// Publishes `leader: false` (if leading), before anything else happens.
fn step_down(tx: &watch::Sender<Leadership>, opts: &ElectionOptions, why: &str) {
    let mut was = false;
    tx.send_if_modified(|l| {
        was = l.leader;
        if l.leader {
            l.leader = false;
            l.fence = 0;
        }
        was
    });
    if was {
        tracing::warn!(key = %String::from_utf8_lossy(&opts.key), identity = %opts.identity,
            reason = why, "stepped down as leader");
    }
}

/// One lease: campaign, then hold or follow, until the lease is lost, an error, or stop.
async fn one_lease(
    client: &Client,
    opts: &ElectionOptions,
    tx: &watch::Sender<Leadership>,
    stop: &CancellationToken,
) -> End {
    let ttl = opts.ttl.max(Duration::from_secs(1));
    let lease = match client.lease_grant(ttl.as_secs() as i64).await {
        Ok(l) => l,
        Err(e) => return End::Retry(e),
    };
    let mut keep = match client.lease_keep_alive(lease.id).await {
        Ok(k) => k,
        Err(e) => return End::Retry(e),
    };
    let mut last_ok = Instant::now();
    let refresh = ttl / 3;
    let key = opts.key.clone();
    loop {
        // Campaign: create the key bound to our lease unless someone holds it.
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([Op::put_with_lease(
                key.clone(),
                opts.identity.clone(),
                lease.id,
            )])
            .or_else([Op::get(KeyRange::key(key.clone()))]);
        let r = tokio::select! {
            _ = stop.cancelled() => return resign(client, tx, opts, lease.id).await,
            r = client.txn(txn) => r,
        };
        let r = match r {
            Ok(r) => r,
            Err(e) => return End::Retry(e),
        };
        let held = if r.succeeded {
            None
        } else {
            r.responses.into_iter().find_map(|op| match op.response {
                Some(pb::response_op::Response::ResponseRange(rr)) => rr.kvs.into_iter().next(),
                _ => None,
            })
        };
        let (leading, fence, holder) = match &held {
            None if r.succeeded => (true, r.revision, opts.identity.clone()),
            // Deleted between the compare and the read: campaign again.
            None => continue,
            Some(kv) if kv.lease == lease.id => (true, kv.create_revision, opts.identity.clone()),
            Some(kv) => (false, 0, String::from_utf8_lossy(&kv.value).into_owned()),
        };
        let mut became = false;
        tx.send_if_modified(|l| {
            let before = l.clone();
            became = leading && !l.leader;
            l.leader = leading;
            l.fence = fence;
            l.holder = Some(holder.clone());
            l.error = None;
            if became {
                l.terms += 1;
            }
            *l != before
        });
        if became {
            tracing::info!(key = %String::from_utf8_lossy(&key), identity = %opts.identity,
                fence, lease = lease.id, "became leader");
        } else if !leading {
            tracing::debug!(key = %String::from_utf8_lossy(&key), leader = %holder, "following");
        }
        // Hold or follow: watch the key, keep the lease alive.
        let mut w = match client
            .watch(
                KeyRange::key(key.clone()),
                WatchOptions {
                    start_revision: r.revision + 1,
                    prev_kv: false,
                    progress_notify: false,
                },
            )
            .await
        {
            Ok(w) => w,
            Err(e) => return End::Retry(e),
        };
        let mut tick = tokio::time::interval_at(Instant::now() + refresh, refresh);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return resign(client, tx, opts, lease.id).await,
                _ = tick.tick() => {
                    match tokio::time::timeout(refresh, keep.keep_alive()).await {
                        Ok(Ok(_)) => last_ok = Instant::now(),
                        Ok(Err(e @ Error::LeaseNotFound { .. })) => return End::Retry(e),
                        // A dead stream: open another (maybe on another member) next tick.
                        Ok(Err(_)) | Err(_) => {
                            if let Ok(Ok(k)) = tokio::time::timeout(refresh, client.lease_keep_alive(lease.id)).await {
                                keep = k;
                                last_ok = Instant::now();
                            }
                        }
                    }
                    if last_ok.elapsed() >= ttl * 2 / 3 {
                        // Cannot prove the lease is still ours: etcd may expire it any moment.
                        return End::Retry(Error::LeaseNotFound { id: lease.id });
                    }
                }
                ev = w.next() => match ev {
                    Some(Ok(batch)) => {
                        let gone = batch.events.iter().any(|e| {
                            e.kind == EventKind::Delete || (leading && e.kv.lease != lease.id)
                        });
                        if gone {
                            if leading {
                                step_down(tx, opts, "election key deleted or rebound");
                            }
                            break;
                        }
                        if let Some(put) = batch.events.iter().rev().find(|e| e.kind == EventKind::Put) {
                            let who = String::from_utf8_lossy(&put.kv.value).into_owned();
                            tx.send_if_modified(|l| {
                                let changed = l.holder.as_deref() != Some(who.as_str());
                                l.holder = Some(who.clone());
                                changed
                            });
                        }
                    }
                    // The watch ended: campaign again (the transaction re-checks).
                    Some(Err(_)) | None => break,
                },
            }
        }
    }
}

/// Gives the role up at once: stops the work (publishes `leader: false`), then revokes the
/// lease, which deletes the key and wakes the others.
async fn resign(
    client: &Client,
    tx: &watch::Sender<Leadership>,
    opts: &ElectionOptions,
    lease: i64,
) -> End {
    step_down(tx, opts, "stopping");
    let _ = tokio::time::timeout(Duration::from_secs(2), client.lease_revoke(lease)).await;
    End::Stop
}
