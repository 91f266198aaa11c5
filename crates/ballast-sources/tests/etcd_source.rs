//! The etcd source against a real etcd: consistent initial sync, per-object last known good,
//! atomic transactions, stale-not-empty while etcd is down, and relist after compaction.

use std::time::Duration;

use ballast_etcd::{Client, ClientOptions, KeyRange, Op, Txn};
use ballast_sources::{EtcdSource, EtcdSourceOptions, Source, SourceState};
use ballast_testkit::{EtcdCluster, TcpProxy};
use tokio::sync::watch;

const T: Duration = Duration::from_secs(30);

fn backend(name: &str, port: u16) -> String {
    format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {{ name: {name} }}\nspec:\n  endpoints: [{{ address: 10.0.0.1, port: {port} }}]\n"
    )
}

fn options(urls: Vec<String>) -> EtcdSourceOptions {
    let mut o = EtcdSourceOptions::new(urls, "/ballast/");
    o.client = ClientOptions {
        request_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_millis(500),
        ..ClientOptions::default()
    };
    o
}

/// Backend name → port of every Backend served.
fn backends(s: &SourceState) -> Vec<(String, u16)> {
    let Some(c) = &s.config else {
        return Vec::new();
    };
    c.backends
        .values()
        .map(|b| {
            (
                b.metadata.name.clone(),
                b.spec.endpoints[0].port.value as u16,
            )
        })
        .collect()
}

async fn wait(
    rx: &mut watch::Receiver<SourceState>,
    what: &str,
    f: impl FnMut(&SourceState) -> bool,
) -> SourceState {
    let r = tokio::time::timeout(T, rx.wait_for(f))
        .await
        .map(|r| r.map(|s| s.clone()));
    match r {
        Ok(Ok(s)) => s,
        _ => panic!(
            "source never reached: {what}; last state: {:?}",
            rx.borrow()
        ),
    }
}

fn pairs(v: &[(&str, u16)]) -> Vec<(String, u16)> {
    v.iter().map(|(n, p)| (n.to_string(), *p)).collect()
}

#[tokio::test]
async fn syncs_at_one_revision_then_applies_changes_per_object() {
    let etcd = EtcdCluster::start_single().await.unwrap();
    let c = Client::new(&etcd.client_urls(), ClientOptions::default()).unwrap();
    c.put("/ballast/backends/default/a", backend("a", 80))
        .await
        .unwrap();
    c.put("/ballast/backends/default/b", backend("b", 80))
        .await
        .unwrap();
    // Bookkeeping and keys outside the prefix are not config.
    c.put("/ballast/_state/guard", "not yaml: [").await.unwrap();
    let rev = c.put("/elsewhere/x", backend("x", 80)).await.unwrap();

    let mut rx = Box::new(EtcdSource::new(options(etcd.client_urls())).unwrap()).start();
    let s = wait(&mut rx, "synced", |s| s.synced).await;
    assert_eq!(backends(&s), pairs(&[("a", 80), ("b", 80)]));
    assert_eq!(s.revision, Some(rev));
    assert!(s.stale_since.is_none() && s.last_error.is_none());

    // An invalid value keeps its object's last good version and names the key and position;
    // a valid change in the same store applies.
    c.put("/ballast/backends/default/a", backend("a", 0))
        .await
        .unwrap();
    let rev = c
        .put("/ballast/backends/default/b", backend("b", 81))
        .await
        .unwrap();
    let s = wait(&mut rx, "b changed", |s| s.revision == Some(rev)).await;
    assert_eq!(backends(&s), pairs(&[("a", 80), ("b", 81)]));
    let err = s
        .last_error
        .as_ref()
        .expect("the invalid value is reported")[0]
        .to_string();
    assert!(
        err.starts_with("etcd:/ballast/backends/default/a:5:"),
        "{err}"
    );

    // JSON values, deletes, and a transaction of several objects applied in one generation.
    let json = r#"{"apiVersion":"ballast.dev/v1alpha1","kind":"Backend","metadata":{"name":"c"},"spec":{"endpoints":[{"address":"10.0.0.2","port":90}]}}"#;
    let before = rx.borrow().generation;
    let t = c
        .txn(Txn::new().and_then([
            Op::put("/ballast/backends/default/a", backend("a", 82)),
            Op::put("/ballast/backends/default/c", json),
            Op::delete(KeyRange::key("/ballast/backends/default/b")),
        ]))
        .await
        .unwrap();
    let s = wait(&mut rx, "txn applied", |s| s.revision == Some(t.revision)).await;
    assert_eq!(backends(&s), pairs(&[("a", 82), ("c", 90)]));
    assert_eq!(s.generation, before + 1, "one transaction, one new config");
    assert!(s.last_error.is_none());

    // Bookkeeping writes (status write-back, guard state) move the revision only.
    let config = s.config.clone().unwrap();
    let rev = c.put("/ballast/_status/objects", "{}").await.unwrap();
    let s = wait(&mut rx, "bookkeeping write", |s| s.revision == Some(rev)).await;
    assert_eq!(s.generation, before + 1);
    assert!(
        std::sync::Arc::ptr_eq(s.config.as_ref().unwrap(), &config),
        "the same config"
    );
}

#[tokio::test]
async fn not_ready_until_etcd_answers_and_stale_not_empty_while_it_is_down() {
    let mut etcd = EtcdCluster::start_single().await.unwrap();
    let c = Client::new(&etcd.client_urls(), ClientOptions::default()).unwrap();
    c.put("/ballast/a", backend("a", 80)).await.unwrap();
    etcd.stop(0);

    // Down at start: not synced, and says why.
    let mut rx = Box::new(EtcdSource::new(options(etcd.client_urls())).unwrap()).start();
    let s = wait(&mut rx, "store error", |s| s.store_error.is_some()).await;
    assert!(!s.synced && s.config.is_none());

    etcd.restart(0).await.unwrap();
    let s = wait(&mut rx, "synced", |s| s.synced).await;
    assert_eq!(backends(&s), pairs(&[("a", 80)]));
    assert!(s.stale_since.is_none());
    let generation = s.generation;

    // Down after sync: stale, same config, still synced.
    etcd.stop(0);
    let s = wait(&mut rx, "stale", |s| s.stale_since.is_some()).await;
    assert!(s.synced);
    assert_eq!(
        (backends(&s), s.generation),
        (pairs(&[("a", 80)]), generation)
    );

    // Back: the watch resumes from the last revision and a change applies.
    etcd.restart(0).await.unwrap();
    let rev = c.put("/ballast/a", backend("a", 81)).await.unwrap();
    let s = wait(&mut rx, "recovered", |s| s.revision == Some(rev)).await;
    assert!(s.stale_since.is_none() && s.store_error.is_none());
    assert_eq!(backends(&s), pairs(&[("a", 81)]));
}

#[tokio::test]
async fn relists_by_keep_set_after_compaction_while_disconnected() {
    let etcd = EtcdCluster::start_single().await.unwrap();
    let c = Client::new(&etcd.client_urls(), ClientOptions::default()).unwrap();
    for (n, p) in [("a", 80), ("b", 80), ("c", 80)] {
        c.put(format!("/ballast/{n}"), backend(n, p)).await.unwrap();
    }
    // The source reaches etcd only through a relay the test can cut.
    let link = TcpProxy::start(vec![etcd.client_addr(0)]).await.unwrap();
    let mut rx =
        Box::new(EtcdSource::new(options(vec![format!("http://{}", link.addr())])).unwrap())
            .start();
    wait(&mut rx, "synced", |s| s.synced).await;

    link.set_backends(Vec::new());
    link.cut_all();
    wait(&mut rx, "stale", |s| s.stale_since.is_some()).await;

    // Meanwhile: a delete, a change, an addition, and history compacted past all of it.
    c.delete(KeyRange::key("/ballast/b")).await.unwrap();
    c.put("/ballast/c", backend("c", 81)).await.unwrap();
    let rev = c.put("/ballast/d", backend("d", 80)).await.unwrap();
    c.compact(rev, true).await.unwrap();
    assert_eq!(
        backends(&rx.borrow()),
        pairs(&[("a", 80), ("b", 80), ("c", 80)]),
        "stale: unchanged"
    );

    link.set_backends(vec![etcd.client_addr(0)]);
    let s = wait(&mut rx, "relisted", |s| {
        s.revision == Some(rev) && s.stale_since.is_none()
    })
    .await;
    // Exactly the store: b gone, c changed, d added, a kept.
    assert_eq!(backends(&s), pairs(&[("a", 80), ("c", 81), ("d", 80)]));
}

/// Issue #12: etcd restored from an older backup comes back at a lower revision. Watching from
/// the last applied revision + 1 would be silent until the store passes it again (every write
/// up to there missed, and the served config no longer what the store holds). The source must
/// notice, say so, and reconcile to what the store holds by keep-set, then follow new writes.
#[tokio::test]
async fn a_store_restored_to_a_lower_revision_is_relisted_and_followed() {
    let mut etcd = EtcdCluster::start_single().await.unwrap();
    let c = Client::new(&etcd.client_urls(), ClientOptions::default()).unwrap();
    for n in ["a", "b", "c"] {
        c.put(format!("/ballast/{n}"), backend(n, 80))
            .await
            .unwrap();
    }
    let mut rx = Box::new(EtcdSource::new(options(etcd.client_urls())).unwrap()).start();
    wait(&mut rx, "synced", |s| s.synced).await;

    // A cold backup of the store as it is now.
    etcd.stop(0);
    let backup = etcd.backup_data(0, "backup.etcd").unwrap();
    etcd.restart(0).await.unwrap();
    let restored_rev = etcd.revision(0).await.unwrap();

    // Later writes: a delete, a change, an addition.
    c.delete(KeyRange::key("/ballast/b")).await.unwrap();
    c.put("/ballast/c", backend("c", 81)).await.unwrap();
    let high = c.put("/ballast/d", backend("d", 80)).await.unwrap();
    let s = wait(&mut rx, "later writes", |s| s.revision == Some(high)).await;
    assert_eq!(backends(&s), pairs(&[("a", 80), ("c", 81), ("d", 80)]));
    assert_eq!(s.revision_regressions, 0);

    // The store is restored from the backup, on the same endpoint.
    etcd.stop(0);
    etcd.restore_data(0, &backup).unwrap();
    etcd.restart(0).await.unwrap();
    assert_eq!(etcd.revision(0).await.unwrap(), restored_rev);
    assert!(restored_rev < high);
    let s = wait(&mut rx, "regression noticed and relisted", |s| {
        s.revision == Some(restored_rev) && s.stale_since.is_none()
    })
    .await;
    assert_eq!(s.revision_regressions, 1);
    let r = s.last_regression.expect("recorded");
    assert_eq!((r.from, r.to), (high, restored_rev));
    // Exactly the restored store: b back, c at its old value, d gone, a kept.
    assert_eq!(backends(&s), pairs(&[("a", 80), ("b", 80), ("c", 80)]));

    // New writes below the old revision are followed (the watch starts from the store's).
    let next = c.put("/ballast/e", backend("e", 80)).await.unwrap();
    assert!(
        next <= high,
        "{next} is a revision the old watch would have skipped"
    );
    let s = wait(&mut rx, "write after the restore", |s| {
        s.revision == Some(next)
    })
    .await;
    assert_eq!(
        backends(&s),
        pairs(&[("a", 80), ("b", 80), ("c", 80), ("e", 80)])
    );
    assert_eq!(s.revision_regressions, 1, "counted once");
}

/// Issue #12: an apply larger than etcd's `--max-txn-ops` is written in several transactions,
/// opened by creating `_meta/apply` and committed by deleting it while touching
/// `_meta/config`. Readers must serve none of it until the commit, then all of it at once; a
/// source that starts while the apply is open syncs to the store as it was before it.
#[tokio::test]
async fn an_apply_of_several_transactions_is_published_only_on_its_commit() {
    let etcd = EtcdCluster::start_single().await.unwrap();
    let c = Client::new(&etcd.client_urls(), ClientOptions::default()).unwrap();
    c.put("/ballast/backends/default/a", backend("a", 80))
        .await
        .unwrap();
    let mut rx = Box::new(EtcdSource::new(options(etcd.client_urls())).unwrap()).start();
    let s = wait(&mut rx, "synced", |s| s.synced).await;
    let generation = s.generation;

    // Open, then two parts (a change and an addition), as `ballast apply` writes them.
    let lease = c.lease_grant(60).await.unwrap();
    let opened = c
        .txn(Txn::new().and_then([
            Op::put_with_lease("/ballast/_meta/apply", "{}", lease.id),
            Op::put("/ballast/_meta/config", ""),
            Op::put("/ballast/backends/default/a", backend("a", 81)),
        ]))
        .await
        .unwrap()
        .revision;
    let s = wait(&mut rx, "held", |s| s.held_apply.is_some()).await;
    assert_eq!(s.held_apply.unwrap().opened, opened);
    c.put("/ballast/backends/default/b", backend("b", 80))
        .await
        .unwrap();
    // A second source starting now syncs to the store before the apply, and holds too.
    let mut late = Box::new(EtcdSource::new(options(etcd.client_urls())).unwrap()).start();
    let l = wait(&mut late, "late synced", |s| {
        s.synced && s.held_apply.is_some()
    })
    .await;
    assert_eq!(backends(&l), pairs(&[("a", 80)]));
    assert_eq!(l.revision, Some(opened - 1));
    assert_eq!(
        (backends(&rx.borrow()), rx.borrow().generation),
        (pairs(&[("a", 80)]), generation),
        "nothing of the open apply is served"
    );

    // The commit publishes it all, in one new config, on both.
    let commit = c
        .txn(Txn::new().and_then([
            Op::delete(KeyRange::key("/ballast/_meta/apply")),
            Op::put("/ballast/_meta/config", ""),
        ]))
        .await
        .unwrap()
        .revision;
    for rx in [&mut rx, &mut late] {
        let s = wait(rx, "committed", |s| s.revision == Some(commit)).await;
        assert_eq!(backends(&s), pairs(&[("a", 81), ("b", 80)]));
        assert!(s.held_apply.is_none());
    }
    assert_eq!(rx.borrow().generation, generation + 1, "one new config");

    // An apply that dies: its marker goes with its lease, the written part stays held until
    // the next apply commits.
    let lease = c.lease_grant(60).await.unwrap();
    c.txn(Txn::new().and_then([
        Op::put_with_lease("/ballast/_meta/apply", "{}", lease.id),
        Op::put("/ballast/_meta/config", ""),
        Op::put("/ballast/backends/default/c", backend("c", 80)),
    ]))
    .await
    .unwrap();
    c.lease_revoke(lease.id).await.unwrap();
    let s = wait(&mut rx, "abandoned", |s| {
        s.held_apply.is_some_and(|h| h.abandoned)
    })
    .await;
    assert_eq!(backends(&s), pairs(&[("a", 81), ("b", 80)]));
    let next = c
        .txn(Txn::new().and_then([
            Op::put("/ballast/backends/default/d", backend("d", 80)),
            Op::put("/ballast/_meta/config", ""),
        ]))
        .await
        .unwrap()
        .revision;
    let s = wait(&mut rx, "next commit", |s| s.revision == Some(next)).await;
    assert!(s.held_apply.is_none());
    assert_eq!(
        backends(&s),
        pairs(&[("a", 81), ("b", 80), ("c", 80), ("d", 80)])
    );
}

/// A source holding an open apply loses etcd; meanwhile the apply commits and history is
/// compacted, so the source must relist. The listing shows the commit (the config marker moved
/// after the apply opened): the hold ends and the whole apply is published.
#[tokio::test]
async fn a_relist_after_the_held_apply_committed_publishes_it() {
    let etcd = EtcdCluster::start_single().await.unwrap();
    let c = Client::new(&etcd.client_urls(), ClientOptions::default()).unwrap();
    c.put("/ballast/a", backend("a", 80)).await.unwrap();
    let link = TcpProxy::start(vec![etcd.client_addr(0)]).await.unwrap();
    let mut rx =
        Box::new(EtcdSource::new(options(vec![format!("http://{}", link.addr())])).unwrap())
            .start();
    wait(&mut rx, "synced", |s| s.synced).await;
    let lease = c.lease_grant(60).await.unwrap();
    c.txn(Txn::new().and_then([
        Op::put_with_lease("/ballast/_meta/apply", "{}", lease.id),
        Op::put("/ballast/_meta/config", ""),
        Op::put("/ballast/a", backend("a", 81)),
    ]))
    .await
    .unwrap();
    wait(&mut rx, "held", |s| s.held_apply.is_some()).await;

    link.set_backends(Vec::new());
    link.cut_all();
    wait(&mut rx, "stale", |s| s.stale_since.is_some()).await;
    c.put("/ballast/b", backend("b", 80)).await.unwrap();
    let rev = c
        .txn(Txn::new().and_then([
            Op::delete(KeyRange::key("/ballast/_meta/apply")),
            Op::put("/ballast/_meta/config", ""),
        ]))
        .await
        .unwrap()
        .revision;
    c.compact(rev, true).await.unwrap();
    assert_eq!(backends(&rx.borrow()), pairs(&[("a", 80)]));

    link.set_backends(vec![etcd.client_addr(0)]);
    let s = wait(&mut rx, "relisted, hold released", |s| {
        s.revision == Some(rev) && s.held_apply.is_none() && s.stale_since.is_none()
    })
    .await;
    assert_eq!(backends(&s), pairs(&[("a", 81), ("b", 80)]));
}
