//! The client against a real etcd (Debian etcd-server 3.4 via `ballast_testkit::EtcdCluster`).

use std::time::Duration;

use ballast_etcd::{
    Client, ClientOptions, Compare, CompareOp, Error, EventKind, KeyRange, Op, Txn, WatchOptions,
};
use ballast_testkit::{EtcdCluster, free_port};
use futures::StreamExt;

const T: Duration = Duration::from_secs(20);

fn client(urls: &[String]) -> Client {
    Client::new(urls, ClientOptions::default()).unwrap()
}

#[tokio::test]
async fn kv_txn_and_paged_consistent_list() {
    let etcd = EtcdCluster::start_single().await.unwrap();
    let c = client(&etcd.client_urls());
    for i in 0..5 {
        c.put(format!("/p/k{i}"), format!("v{i}")).await.unwrap();
    }
    c.put("/q", "outside").await.unwrap();
    let kv = c.get("/p/k3").await.unwrap().unwrap();
    assert_eq!(kv.value, b"v3");
    assert!(c.get("/p/none").await.unwrap().is_none());

    // Paged listing (2 per page) gives all five, pinned to the first page's revision.
    let listing = c.list(&KeyRange::prefix("/p/"), 0, 2).await.unwrap();
    let keys: Vec<_> = listing
        .kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect();
    assert_eq!(keys, ["/p/k0", "/p/k1", "/p/k2", "/p/k3", "/p/k4"]);
    let at = listing.revision;
    c.put("/p/k5", "later").await.unwrap();
    c.delete(KeyRange::key("/p/k0")).await.unwrap();
    let old = c.list(&KeyRange::prefix("/p/"), at, 2).await.unwrap();
    assert_eq!(old, listing, "listing at a fixed revision is repeatable");

    // Create-if-absent: the second attempt fails the compare and runs the failure branch.
    let create = || {
        Txn::new()
            .when([Compare::create_revision("/lock", CompareOp::Equal, 0)])
            .and_then([Op::put("/lock", "a")])
            .or_else([Op::get(KeyRange::key("/lock"))])
    };
    let first = c.txn(create()).await.unwrap();
    assert!(first.succeeded);
    let second = c.txn(create()).await.unwrap();
    assert!(!second.succeeded);
    assert_eq!(second.responses.len(), 1);
    // Optimistic concurrency on mod_revision and version.
    let lock = c.get("/lock").await.unwrap().unwrap();
    let cas = |rev| {
        Txn::new()
            .when([
                Compare::mod_revision("/lock", CompareOp::Equal, rev),
                Compare::version("/lock", CompareOp::Equal, 1),
            ])
            .and_then([Op::put("/lock", "b")])
    };
    assert!(!c.txn(cas(lock.mod_revision - 1)).await.unwrap().succeeded);
    assert!(c.txn(cas(lock.mod_revision)).await.unwrap().succeeded);
    assert_eq!(c.get("/lock").await.unwrap().unwrap().value, b"b");

    let (_, deleted) = c.delete(KeyRange::prefix("/p/")).await.unwrap();
    assert_eq!(deleted, 5);
    assert_eq!(c.get("/q").await.unwrap().unwrap().value, b"outside");

    let st = c.status().await.unwrap();
    assert_ne!(st.leader, 0);
    assert_eq!(st.leader, st.member_id, "single member leads itself");
}

#[tokio::test]
async fn watch_from_listing_sees_every_change_and_reports_compaction() {
    let etcd = EtcdCluster::start_single().await.unwrap();
    let c = client(&etcd.client_urls());
    c.put("/w/a", "1").await.unwrap();
    let listing = c.list(&KeyRange::prefix("/w/"), 0, 0).await.unwrap();
    // Written after the listing but before the watch exists: must still be seen.
    c.put("/w/b", "2").await.unwrap();
    let mut w = c
        .watch(
            KeyRange::prefix("/w/"),
            WatchOptions {
                start_revision: listing.revision + 1,
                prev_kv: true,
                progress_notify: false,
            },
        )
        .await
        .unwrap();
    c.delete(KeyRange::key("/w/a")).await.unwrap();
    c.put("/other", "x").await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let batch = tokio::time::timeout(T, w.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        for e in batch.events {
            seen.push((
                e.kind,
                String::from_utf8_lossy(&e.kv.key).into_owned(),
                e.prev_kv.map(|p| p.value),
            ));
        }
    }
    assert_eq!(
        seen,
        [
            (EventKind::Put, "/w/b".to_string(), None),
            (EventKind::Delete, "/w/a".to_string(), Some(b"1".to_vec())),
        ]
    );

    // Compact past the listing: a watch from there, and a list at it, say Compacted.
    let now = c.put("/w/c", "3").await.unwrap();
    c.compact(now, true).await.unwrap();
    let err = match c
        .watch(
            KeyRange::prefix("/w/"),
            WatchOptions {
                start_revision: listing.revision + 1,
                ..Default::default()
            },
        )
        .await
    {
        Err(e) => e,
        Ok(mut w) => tokio::time::timeout(T, w.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap_err(),
    };
    assert!(
        matches!(err, Error::Compacted { compact_revision } if compact_revision == now),
        "{err}"
    );
    let err = c
        .list(&KeyRange::prefix("/w/"), listing.revision, 0)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Compacted { .. }), "{err}");
}

#[tokio::test]
async fn lease_keep_alive_and_revoke() {
    let etcd = EtcdCluster::start_single().await.unwrap();
    let c = client(&etcd.client_urls());
    let lease = c.lease_grant(30).await.unwrap();
    assert_eq!(lease.ttl, 30);
    c.put_with_lease("/reg/x", "addr", lease.id).await.unwrap();
    let mut ka = c.lease_keep_alive(lease.id).await.unwrap();
    assert_eq!(ka.keep_alive().await.unwrap(), 30);
    assert_eq!(c.get("/reg/x").await.unwrap().unwrap().lease, lease.id);
    c.lease_revoke(lease.id).await.unwrap();
    assert!(
        c.get("/reg/x").await.unwrap().is_none(),
        "revoking deletes the lease's keys"
    );
    let err = ka.keep_alive().await.unwrap_err();
    assert!(matches!(err, Error::LeaseNotFound { .. }), "{err}");
    let err = c.lease_keep_alive(lease.id).await.unwrap_err();
    assert!(matches!(err, Error::LeaseNotFound { .. }), "{err}");
}

#[tokio::test]
async fn fails_over_from_a_dead_endpoint_and_a_killed_member() {
    let mut etcd = EtcdCluster::start(3).await.unwrap();
    // First endpoint refuses connections: calls move on to the live ones.
    let mut urls = vec![format!("http://127.0.0.1:{}", free_port())];
    urls.extend(etcd.client_urls());
    let c = client(&urls);
    c.put("/f/1", "a").await.unwrap();
    assert_eq!(c.get("/f/1").await.unwrap().unwrap().value, b"a");

    // Kill the member the client now talks to (and the watch is on): the watch ends with a
    // retryable error, and the next calls go to a surviving member.
    let st = c.status().await.unwrap();
    let on = etcd
        .client_urls()
        .iter()
        .position(|u| *u == st.endpoint)
        .unwrap();
    let mut w = c
        .watch(KeyRange::prefix("/f/"), WatchOptions::default())
        .await
        .unwrap();
    assert_eq!(w.endpoint(), st.endpoint);
    etcd.kill(on);
    let err = tokio::time::timeout(T, w.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    // Reads retry across members; a write may see "leader changed" while the cluster elects,
    // which callers retry.
    let mut wrote = false;
    for _ in 0..100 {
        match c.put("/f/2", "b").await {
            Ok(_) => {
                wrote = true;
                break;
            }
            Err(e) if e.is_unavailable() => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(wrote);
    assert_eq!(c.get("/f/2").await.unwrap().unwrap().value, b"b");
    let mut w = c
        .watch(KeyRange::prefix("/f/"), WatchOptions::default())
        .await
        .unwrap();
    assert_ne!(w.endpoint(), st.endpoint);
    c.put("/f/3", "c").await.unwrap();
    let batch = tokio::time::timeout(T, w.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(batch.events[0].kv.key, b"/f/3");
}

/// `https://` with a CA and a client certificate (etcd `--client-cert-auth`): the client
/// connects with rustls; without the client certificate etcd refuses it.
#[tokio::test]
async fn tls_with_client_certificate() {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::default();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let ca_pem = ca_cert.pem();
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).unwrap();
    let leaf = |sans: Vec<SanType>| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.subject_alt_names = sans;
        let cert = params.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf(vec![SanType::IpAddress([127, 0, 0, 1].into())]);
    let (client_cert, client_key) = leaf(vec![SanType::DnsName("ballast".try_into().unwrap())]);
    for (n, text) in [
        ("ca.pem", &ca_pem),
        ("server.pem", &server_cert),
        ("server.key", &server_key),
        ("client.pem", &client_cert),
        ("client.key", &client_key),
    ] {
        std::fs::write(p(n), text).unwrap();
    }
    let etcd = EtcdCluster::start_tls(ballast_testkit::EtcdTls {
        cert: p("server.pem"),
        key: p("server.key"),
        ca: p("ca.pem"),
        client_cert_auth: true,
    })
    .await
    .unwrap();
    let urls = etcd.client_urls();
    assert!(urls[0].starts_with("https://"));

    let tls = ballast_etcd::TlsOptions::from_files(
        &p("ca.pem"),
        Some(&p("client.pem")),
        Some(&p("client.key")),
    )
    .unwrap();
    let opts = ClientOptions {
        tls: Some(tls),
        ..ClientOptions::default()
    };
    let c = Client::new(&urls, opts.clone()).unwrap();
    c.put("/tls", "ok").await.unwrap();
    assert_eq!(c.get("/tls").await.unwrap().unwrap().value, b"ok");

    // Same CA, no client certificate: refused.
    let anon = ClientOptions {
        tls: Some(ballast_etcd::TlsOptions::from_files(&p("ca.pem"), None, None).unwrap()),
        request_timeout: Duration::from_secs(3),
        ..ClientOptions::default()
    };
    let c = Client::new(&urls, anon).unwrap();
    assert!(c.get("/tls").await.is_err());
}

/// Leader election: one of two candidates leads; when its lease is lost (revoked here, as
/// when etcd expired it while the leader was cut off) it steps down and the other takes over
/// with a new fencing token; a write fenced with the old token then fails.
#[tokio::test]
async fn election_moves_when_the_leader_loses_its_lease() {
    use ballast_etcd::{ElectionOptions, Leadership, campaign};
    use tokio_util::sync::CancellationToken;
    let etcd = EtcdCluster::start_single().await.unwrap();
    let c = client(&etcd.client_urls());
    let key = "/e/leader";
    let stop = CancellationToken::new();
    let start = |id: &str| {
        campaign(
            client(&etcd.client_urls()),
            ElectionOptions {
                key: key.into(),
                identity: id.into(),
                ttl: Duration::from_secs(3),
                retry: Duration::from_millis(100),
            },
            stop.clone(),
        )
        .0
    };
    let mut a = start("a");
    tokio::time::timeout(T, a.wait_for(|l| l.leader))
        .await
        .unwrap()
        .unwrap();
    let mut b = start("b");
    let seen: Leadership = tokio::time::timeout(T, b.wait_for(|l| l.holder.is_some()))
        .await
        .unwrap()
        .unwrap()
        .clone();
    assert!(!seen.leader);
    assert_eq!(seen.holder.as_deref(), Some("a"));
    let old_fence = a.borrow().fence;
    let kv = c.get(key).await.unwrap().unwrap();
    assert_eq!(
        (kv.value.as_slice(), kv.create_revision),
        (&b"a"[..], old_fence)
    );

    // a's lease is gone: a steps down, b leads.
    c.lease_revoke(kv.lease).await.unwrap();
    tokio::time::timeout(T, b.wait_for(|l| l.leader))
        .await
        .unwrap()
        .unwrap();
    tokio::time::timeout(
        T,
        a.wait_for(|l| !l.leader && l.holder.as_deref() == Some("b")),
    )
    .await
    .unwrap()
    .unwrap();
    let new_fence = b.borrow().fence;
    assert!(new_fence > old_fence);
    assert_eq!(b.borrow().terms, 1);
    // A write fenced with a's token fails; with b's it applies.
    let fenced = |fence: i64| {
        Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, fence)])
            .and_then([Op::put("/e/work", "x")])
    };
    assert!(!c.txn(fenced(old_fence)).await.unwrap().succeeded);
    assert!(c.txn(fenced(new_fence)).await.unwrap().succeeded);

    // Stopping resigns: the key is deleted at once.
    stop.cancel();
    tokio::time::timeout(T, b.wait_for(|l| !l.leader))
        .await
        .unwrap()
        .unwrap();
    let gone = wait_gone(&c, key).await;
    assert!(gone, "the leader resigned: key deleted");
}

async fn wait_gone(c: &Client, key: &str) -> bool {
    for _ in 0..100 {
        if c.get(key).await.unwrap().is_none() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}
