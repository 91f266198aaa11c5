//! Real etcd processes for tests: one member or an N-member cluster on loopback.
//!
//! Ballast's etcd source is only trustworthy if it is proven against a real etcd that dies, loses
//! its leader, compacts and comes back (issue #12). [`EtcdCluster`] starts `etcd` (Debian
//! `etcd-server` 3.4, found through `$BALLAST_ETCD` or `PATH`) with free loopback ports and its
//! own temp data dirs, and lets a test kill, stop and restart a member by pid, find the leader
//! and compact through etcd's JSON gateway, so the testkit needs no etcd client of its own.
//! Every member is killed on drop. A missing etcd is an error with instructions, never a skip.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

use crate::http::{http_get, http_post_json};
use crate::{free_port, wait_for};

/// Env var naming the etcd binary; `scripts/env.sh` exports it.
const ETCD_ENV: &str = "BALLAST_ETCD";

/// Finds `etcd`: `$BALLAST_ETCD`, else `etcd` on `PATH`, else `/usr/bin/etcd`.
pub fn try_etcd_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(ETCD_ENV).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!(
            "{ETCD_ENV}={} does not exist; run scripts/test (it installs Debian etcd-server)",
            p.display()
        );
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file());
    on_path
        .or_else(|| Some(PathBuf::from("/usr/bin/etcd")).filter(|p| p.is_file()))
        .ok_or_else(|| {
            anyhow!(
                "etcd not found: {ETCD_ENV} is unset and there is no etcd on PATH. Run scripts/test \
                 (it installs Debian etcd-server) or `apt-get install etcd-server`. etcd tests never skip."
            )
        })
}

/// Server TLS for the client port (PEM files): `https://` client URLs, and with
/// `client_cert_auth` etcd's `--client-cert-auth` (clients need a certificate signed by `ca`).
#[derive(Clone, Debug)]
pub struct EtcdTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
    pub client_cert_auth: bool,
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Plain-HTTP `/health` (and `/metrics`), so health checks need no TLS client.
    metrics_port: u16,
    data_dir: PathBuf,
    log_path: PathBuf,
    child: Option<Child>,
}

/// A running etcd cluster (possibly of one). Members are addressed by index `0..len()`.
pub struct EtcdCluster {
    binary: PathBuf,
    members: Vec<Member>,
    initial_cluster: String,
    token: String,
    tls: Option<EtcdTls>,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts a single-member etcd and waits until it is healthy.
    pub async fn start_single() -> Result<EtcdCluster> {
        Self::start(1).await
    }

    /// Starts `n` members on loopback and waits until every one is healthy (the cluster has a
    /// leader). Short heartbeat/election timeouts make leader changes in tests quick.
    pub async fn start(n: usize) -> Result<EtcdCluster> {
        Self::start_with(n, None).await
    }

    /// Starts one member serving clients over TLS (see [`EtcdTls`]); the JSON-gateway helpers
    /// ([`Self::status`], [`Self::leader`], [`Self::compact`]) need plain HTTP and fail here.
    pub async fn start_tls(tls: EtcdTls) -> Result<EtcdCluster> {
        Self::start_with(1, Some(tls)).await
    }

    async fn start_with(n: usize, tls: Option<EtcdTls>) -> Result<EtcdCluster> {
        let binary = try_etcd_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("ballast-etcd-")
            .tempdir()
            .context("create etcd temp dir")?;
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                metrics_port: free_port(),
                data_dir: dir.path().join(format!("m{i}.etcd")),
                log_path: dir.path().join(format!("m{i}.log")),
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!(
            "ballast-test-{}-{}",
            std::process::id(),
            members[0].peer_port
        );
        let mut cluster = EtcdCluster {
            binary,
            members,
            initial_cluster,
            token,
            tls,
            dir,
        };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        for i in 0..n {
            cluster.wait_healthy(i, Duration::from_secs(60)).await?;
        }
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> Result<()> {
        let m = &self.members[i];
        let client = self.client_url(i);
        let metrics = format!("http://127.0.0.1:{}", m.metrics_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let setpriv = Path::new("/usr/bin/setpriv");
        let mut cmd = if setpriv.is_file() {
            // Dies with the thread that started it even if the test process is killed.
            let mut c = Command::new(setpriv);
            c.args(["--pdeathsig", "KILL", "--"]).arg(&self.binary);
            c
        } else {
            Command::new(&self.binary)
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log_path)
            .context("open etcd log")?;
        cmd.args(["--name", &m.name])
            .arg("--data-dir")
            .arg(&m.data_dir)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", "new"])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-level", "warn"])
            .args(["--listen-metrics-urls", &metrics]);
        if let Some(tls) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca);
            if tls.client_cert_auth {
                cmd.arg("--client-cert-auth");
            }
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log));
        let child = cmd
            .spawn()
            .with_context(|| format!("spawn {}", self.binary.display()))?;
        tracing::debug!(pid = child.id(), member = %m.name, %client, "etcd started");
        self.members[i].child = Some(child);
        Ok(())
    }

    /// Number of members (running or not).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// `http://127.0.0.1:<port>` of member `i` (`https://` with TLS).
    pub fn client_url(&self, i: usize) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Every member's client URL, in index order.
    pub fn client_urls(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.client_url(i)).collect()
    }

    pub fn client_addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.members[i].client_port))
    }

    /// The pid of member `i`, if it is running.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(|c| c.id())
    }

    /// Whether member `i`'s process is running.
    pub fn is_running(&self, i: usize) -> bool {
        self.members[i]
            .child
            .as_ref()
            .is_some_and(|c| crate::pid_alive(c.id()))
    }

    /// SIGKILLs member `i` and reaps it (a crash: no graceful leader transfer). Idempotent.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops member `i` gracefully (SIGTERM, then SIGKILL after 10 s) and reaps it.
    pub fn stop(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            for _ in 0..200 {
                if matches!(c.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts a stopped member again on the same ports and data dir, and waits until healthy.
    pub async fn restart(&mut self, i: usize) -> Result<()> {
        if self.members[i].child.is_some() {
            bail!("etcd member {i} is still running");
        }
        self.spawn(i)?;
        self.wait_healthy(i, Duration::from_secs(60)).await
    }

    /// Copies stopped member `i`'s data dir to `<dir>/<name>` (a cold backup, like a disk
    /// snapshot of the host): [`Self::restore_data`] later puts the store back to the revision
    /// it had now.
    pub fn backup_data(&self, i: usize, name: &str) -> Result<PathBuf> {
        if self.members[i].child.is_some() {
            bail!("etcd member {i} must be stopped to back up its data dir");
        }
        let to = self.dir.path().join(name);
        copy_dir(&self.members[i].data_dir, &to)?;
        Ok(to)
    }

    /// Replaces stopped member `i`'s data dir with a copy of `backup` (from
    /// [`Self::backup_data`]): restarted, the member serves the older store, at its lower
    /// revision, on the same endpoint.
    pub fn restore_data(&self, i: usize, backup: &Path) -> Result<()> {
        if self.members[i].child.is_some() {
            bail!("etcd member {i} must be stopped to restore its data dir");
        }
        let data = &self.members[i].data_dir;
        std::fs::remove_dir_all(data).with_context(|| format!("remove {}", data.display()))?;
        copy_dir(backup, data)
    }

    /// Waits until member `i` answers `/health` with `"health":"true"` (it has a leader).
    pub async fn wait_healthy(&self, i: usize, timeout: Duration) -> Result<()> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.members[i].metrics_port));
        let r = wait_for(timeout, Duration::from_millis(50), || async move {
            let (status, body) = http_get(addr, "/health").await?;
            anyhow::ensure!(
                status == 200 && body.contains("\"health\":\"true\""),
                "etcd {addr} /health: {status} {body}"
            );
            Ok(())
        })
        .await;
        if !self.is_running(i) {
            bail!(
                "etcd member {i} exited; log tail:\n{}",
                self.log_tail(i, 30)
            );
        }
        r.map_err(|e| {
            e.context(format!(
                "etcd member {i} log tail:\n{}",
                self.log_tail(i, 30)
            ))
        })
    }

    /// Member `i`'s status through the JSON gateway: `(member_id, leader_id, revision)`.
    pub async fn status(&self, i: usize) -> Result<(u64, u64, i64)> {
        let v = self.post(i, "/v3/maintenance/status", "{}").await?;
        Ok((
            json_u64(&v["header"]["member_id"]),
            json_u64(&v["leader"]),
            json_u64(&v["header"]["revision"]) as i64,
        ))
    }

    /// The index of the current leader, asking the running members; fails if none knows one.
    pub async fn leader(&self) -> Result<usize> {
        let mut ids = Vec::new();
        let mut leader = 0;
        for i in 0..self.len() {
            if !self.is_running(i) {
                ids.push(None);
                continue;
            }
            match self.status(i).await {
                Ok((id, l, _)) => {
                    ids.push(Some(id));
                    if l != 0 {
                        leader = l;
                    }
                }
                Err(_) => ids.push(None),
            }
        }
        ids.iter()
            .position(|id| *id == Some(leader) && leader != 0)
            .ok_or_else(|| anyhow!("no running etcd member is the leader (leader id {leader})"))
    }

    /// The current store revision (asked of member `i`).
    pub async fn revision(&self, i: usize) -> Result<i64> {
        Ok(self.status(i).await?.2)
    }

    /// Compacts history up to `revision` (physical, so it is done when this returns).
    pub async fn compact(&self, i: usize, revision: i64) -> Result<()> {
        self.post(
            i,
            "/v3/kv/compaction",
            &format!("{{\"revision\":\"{revision}\",\"physical\":true}}"),
        )
        .await
        .map(|_| ())
    }

    async fn post(&self, i: usize, path: &str, body: &str) -> Result<Value> {
        let (status, text) = http_post_json(self.client_addr(i), path, body).await?;
        anyhow::ensure!(status == 200, "etcd {path}: {status} {text}");
        serde_json::from_str(&text).with_context(|| format!("etcd {path}: {text}"))
    }

    /// The last `lines` lines of member `i`'s log.
    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.members[i].log_path).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The temp dir holding data dirs and logs (deleted on drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// etcd's JSON gateway writes 64-bit integers as strings.
fn json_u64(v: &Value) -> u64 {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| v.as_u64())
        .unwrap_or(0)
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for i in 0..self.len() {
                eprintln!(
                    "--- etcd member {i} log tail ---\n{}\n--- end ---",
                    self.log_tail(i, 20)
                );
            }
        }
        for i in 0..self.len() {
            self.kill(i);
        }
    }
}

/// Copies the directory tree `from` to `to` (created), keeping file modes.
fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("create {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("read {}", from.display()))? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)
                .with_context(|| format!("copy {}", entry.path().display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn single_member_starts_restarts_and_compacts() {
        let mut etcd = EtcdCluster::start_single().await.unwrap();
        assert_eq!(etcd.leader().await.unwrap(), 0);
        let before = etcd.revision(0).await.unwrap();
        let put = r#"{"key":"L2s=","value":"dg=="}"#; // "/k" = "v", base64
        http_post_json(etcd.client_addr(0), "/v3/kv/put", put)
            .await
            .unwrap();
        let after = etcd.revision(0).await.unwrap();
        assert_eq!(after, before + 1);
        etcd.compact(0, after).await.unwrap();
        let pid = etcd.pid(0).unwrap();
        etcd.stop(0);
        assert!(!crate::pid_alive(pid));
        etcd.restart(0).await.unwrap();
        assert_eq!(etcd.revision(0).await.unwrap(), after, "data dir kept");
    }

    #[tokio::test]
    async fn three_members_elect_a_new_leader_after_a_kill() {
        let mut etcd = EtcdCluster::start(3).await.unwrap();
        let old = etcd.leader().await.unwrap();
        let (old_id, _, _) = etcd.status(old).await.unwrap();
        etcd.kill(old);
        assert!(!etcd.is_running(old));
        let etcd = &etcd;
        let new = wait_for(
            Duration::from_secs(30),
            Duration::from_millis(50),
            || async move { etcd.leader().await },
        )
        .await
        .unwrap();
        assert_ne!(new, old);
        let (_, leader_id, _) = etcd.status(new).await.unwrap();
        assert_ne!(leader_id, old_id);
    }
}
