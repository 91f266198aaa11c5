//! External processes under test (the `ballast` binary, sovereign, Envoy):
//! spawning with a free port, CPU-seconds and memory of the whole process tree
//! from `/proc`, a minimal HTTP/1.1 GET for admin endpoints, and waiting for
//! readiness.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::measure::{self, Memory};

/// A loopback port that was free a moment ago.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub fn free_addr() -> Result<SocketAddr> {
    Ok(SocketAddr::from(([127, 0, 0, 1], free_port()?)))
}

/// `GET path` over a fresh connection; returns (status, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        anyhow::Ok(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .context("HTTP GET timed out")??;
    let text = String::from_utf8_lossy(&buf);
    let status: u16 = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    let chunked = text.split("\r\n\r\n").next().is_some_and(|h| {
        h.to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
    });
    Ok((status, if chunked { dechunk(&body) } else { body }))
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    out
}

/// Polls `GET path` until it answers 200 or `timeout`.
pub async fn wait_http_ok(addr: SocketAddr, path: &str, timeout: Duration) -> Result<Duration> {
    let t0 = Instant::now();
    loop {
        if let Ok((200, _)) = http_get(addr, path).await {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > timeout {
            bail!("{addr}{path} not ready after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Like [`wait_http_ok`], but fails as soon as `proc` exits (a server that
/// could not start is not waited for).
pub async fn wait_ready(
    proc: &mut Proc,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<()> {
    let t0 = Instant::now();
    loop {
        if let Ok((200, _)) = http_get(addr, path).await {
            return Ok(());
        }
        proc.check_alive()?;
        if t0.elapsed() > timeout {
            bail!("{addr}{path} not ready after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Every descendant of `pid` (children, grandchildren...) and `pid` itself.
fn tree(pid: u32) -> Vec<u32> {
    let mut parent: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            let ppid = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            parent.push((p, ppid));
        }
    }
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let cur = out[i];
        out.extend(parent.iter().filter(|(_, pp)| *pp == cur).map(|(p, _)| *p));
        i += 1;
    }
    out
}

/// CPU-seconds of a process and all its descendants (a Python server forks workers).
pub fn tree_cpu_seconds(pid: u32) -> f64 {
    tree(pid)
        .into_iter()
        .map(measure::process_cpu_seconds)
        .sum()
}

/// RSS of a process tree, and the sum of each process's peak (an upper bound
/// on the tree's peak; exact for a single process).
pub fn tree_memory(pid: u32) -> Memory {
    tree(pid)
        .into_iter()
        .map(|p| measure::process_memory(&p.to_string()))
        .fold(Memory::default(), |a, m| Memory {
            rss: a.rss + m.rss,
            peak: a.peak + m.peak,
        })
}

/// A child process measured as a tree; killed (with its tree) on drop.
pub struct Proc {
    pub child: Child,
    pub pid: u32,
    pub name: String,
}

impl Proc {
    /// Spawns `cmd` with stdout/stderr to `log` (a file under the run's directory).
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Proc> {
        let out = std::fs::File::create(log)?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .kill_on_drop(true);
        let child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        let pid = child.id().context("child exited")?;
        Ok(Proc {
            child,
            pid,
            name: name.to_string(),
        })
    }

    pub fn cpu_seconds(&self) -> f64 {
        tree_cpu_seconds(self.pid)
    }

    pub fn memory(&self) -> Memory {
        tree_memory(self.pid)
    }

    /// Fails if the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(st) = self.child.try_wait()? {
            bail!("{} exited: {st}", self.name);
        }
        Ok(())
    }

    /// SIGTERM the tree (workers first), then kill what is left.
    pub async fn stop(mut self) {
        let pids = tree(self.pid);
        for p in pids.iter().rev() {
            let _ = std::process::Command::new("kill")
                .arg(p.to_string())
                .status();
        }
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            for p in pids.iter().rev() {
                let _ = std::process::Command::new("kill")
                    .args(["-9", &p.to_string()])
                    .status();
            }
            let _ = self.child.kill().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies() {
        assert_eq!(dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), "abcde");
        assert!(tree(std::process::id()).contains(&std::process::id()));
    }
}
