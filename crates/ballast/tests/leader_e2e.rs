//! Singleton work behind an etcd leader election (issue #12 §5): three `ballast serve --etcd`
//! replicas on one real etcd. Exactly one leads and writes the object status back to etcd;
//! the others never write. SIGKILL the leader: after its lease TTL another replica takes the
//! role and writes the status of the next config.

mod common;

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use ballast_etcd::{Client, ClientOptions};
use ballast_testkit::{EtcdCluster, wait_for};
use common::*;

const STATUS_KEY: &str = "/ballast/_status/objects";

/// `/debug/leader` of a replica: (leads, holder).
async fn leadership(b: &Ballast) -> Result<(bool, Option<String>)> {
    let (code, body) = b.get("/debug/leader").await?;
    ensure!(code == 200, "/debug/leader: {code} {body}");
    let v: serde_json::Value = serde_json::from_str(&body)?;
    Ok((
        v["leader"].as_bool().context("leader")?,
        v["holder"].as_str().map(str::to_owned),
    ))
}

/// Waits until exactly one of the live replicas leads and every one names it; its index.
async fn one_leader(replicas: &[Option<Ballast>]) -> usize {
    wait_for(T, POLL, || async {
        let mut leaders = Vec::new();
        let mut holders = Vec::new();
        for (i, b) in replicas.iter().enumerate() {
            let Some(b) = b else { continue };
            let (leads, holder) = leadership(b).await?;
            if leads {
                leaders.push(i);
            }
            holders.push(holder);
        }
        ensure!(leaders.len() == 1, "leaders: {leaders:?}");
        let name = format!("r{}", leaders[0]);
        ensure!(
            holders.iter().all(|h| h.as_deref() == Some(name.as_str())),
            "holders: {holders:?}"
        );
        Ok(leaders[0])
    })
    .await
    .unwrap()
}

/// The status document in etcd: (writer, revision) once it reflects `revision`.
async fn status_at(c: &Client, revision: i64) -> (String, serde_json::Value) {
    wait_for(T, POLL, || async {
        let kv = c.get(STATUS_KEY).await?.context("no status key yet")?;
        let v: serde_json::Value = serde_json::from_slice(&kv.value)?;
        ensure!(
            v["revision"].as_i64() == Some(revision),
            "status at {:?}, want {revision}",
            v["revision"]
        );
        Ok((v["writer"].as_str().unwrap_or_default().to_owned(), v))
    })
    .await
    .unwrap()
}

async fn writes(b: &Ballast) -> f64 {
    b.metric("ballast_status_writes_total").await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_replica_writes_status_and_the_role_moves_when_it_is_killed() {
    let etcd = EtcdCluster::start_single().await.unwrap();
    let c = Client::new(&etcd.client_urls(), ClientOptions::default()).unwrap();
    let (up, up2) = (
        loopback(ballast_testkit::free_port()),
        loopback(ballast_testkit::free_port()),
    );
    c.put("/ballast/gateways/default/edge", gateway(10080))
        .await
        .unwrap();
    c.put("/ballast/backends/default/web", backend("web", &[up]))
        .await
        .unwrap();
    let url = etcd.client_url(0);
    let mut replicas: Vec<Option<Ballast>> = (0..3)
        .map(|i| {
            let id = format!("r{i}");
            Some(
                Ballast::start(
                    free_addr(),
                    free_addr(),
                    &[
                        "--etcd",
                        &url,
                        "--leader-ttl",
                        "2s",
                        "--leader-identity",
                        &id,
                    ],
                )
                .unwrap(),
            )
        })
        .collect();
    for b in replicas.iter().flatten() {
        b.wait_ready().await.unwrap();
    }

    let first = one_leader(&replicas).await;
    let rev = c
        .put(
            "/ballast/httproutes/default/web",
            route("web", "web.example.com", "web"),
        )
        .await
        .unwrap();
    let (writer, doc) = status_at(&c, rev).await;
    assert_eq!(writer, format!("r{first}"));
    // The written status is the conditions /debug/sources shows: the route is accepted.
    let text = doc["status"].to_string();
    assert!(text.contains("Accepted"), "{text}");
    for (i, b) in replicas.iter().enumerate() {
        let b = b.as_ref().unwrap();
        let n = writes(b).await;
        if i == first {
            assert!(n >= 1.0, "the leader wrote");
        } else {
            assert_eq!(n, 0.0, "r{i} is not the leader and never writes");
        }
        let leads = b.metric("ballast_leader").await.unwrap();
        assert_eq!(leads, (i == first) as u8 as f64, "ballast_leader of r{i}");
    }
    assert_eq!(one_leader(&replicas).await, first, "still the same leader");

    // The leader dies without resigning: its lease expires after the TTL (2 s) and another
    // replica takes over.
    replicas[first].as_mut().unwrap().kill();
    replicas[first] = None;
    let second = one_leader(&replicas).await;
    assert_ne!(second, first);
    let rev = c
        .put("/ballast/backends/default/web", backend("web", &[up, up2]))
        .await
        .unwrap();
    let (writer, _) = status_at(&c, rev).await;
    assert_eq!(writer, format!("r{second}"));
    for (i, b) in replicas.iter().enumerate() {
        let Some(b) = b else { continue };
        let n = writes(b).await;
        if i == second {
            assert!(n >= 1.0, "the new leader wrote");
            assert_eq!(b.metric("ballast_leader_terms_total").await.unwrap(), 1.0);
        } else {
            assert_eq!(n, 0.0, "r{i} never led and never wrote");
        }
    }

    // A graceful stop resigns at once (no TTL wait): the last replica leads.
    let last = (0..3).find(|i| *i != first && *i != second).unwrap();
    let b = replicas[second].as_mut().unwrap();
    b.terminate();
    assert!(b.wait_exit(Duration::from_secs(30)).is_some());
    replicas[second] = None;
    assert_eq!(one_leader(&replicas).await, last);
}
