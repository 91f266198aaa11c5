//! The server under test: `ballast-xds`'s `XdsServer` over a `SnapshotCache`
//! serving the bench [`Workload`], either in this process (on its own runtime,
//! so its CPU is measurable apart from the clients') or as a child process
//! (`ballast-bench serve-snapshot`), so CPU and memory are the server's alone.
//! Reported numbers should come from the child mode.
//!
//! The child is driven over stdin, one [`Change`] per line; it answers `ok` on
//! stdout once the change is published.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use ballast_xds::NodeGrouper;
use ballast_xds::{SnapshotCache, XdsServer};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::{mpsc, oneshot};

use crate::measure::{self, Memory};
use crate::workload::{Change, Workload, WorkloadSpec};

/// Every simulated proxy is in this group.
pub const GROUP: &str = "bench";

/// Thread-name prefix of the in-process server runtime.
const THREAD_PREFIX: &str = "xds-srv";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ServerMode {
    /// Same process, own runtime: CPU per thread, RSS includes the clients.
    InProcess,
    /// `ballast-bench serve-snapshot` child: CPU and RSS are the server's alone.
    Child,
}

/// How to start the server.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub mode: ServerMode,
    /// Worker threads of the server runtime.
    pub threads: usize,
    /// The `ballast-bench` binary for child mode (default: this executable).
    pub exe: Option<PathBuf>,
    /// `XdsServerBuilder::push_interval` (zero: off, the library default).
    pub push_interval: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            mode: ServerMode::InProcess,
            threads: 2,
            exe: None,
            push_interval: Duration::ZERO,
        }
    }
}

enum Kind {
    InProcess {
        cache: SnapshotCache,
        runtime: Option<tokio::runtime::Runtime>,
        shutdown: Option<oneshot::Sender<()>>,
    },
    Child {
        child: Child,
        pid: u32,
        stdin: ChildStdin,
        oks: mpsc::UnboundedReceiver<()>,
        pending: usize,
    },
}

/// A running server.
pub struct BenchServer {
    pub addr: SocketAddr,
    kind: Kind,
}

fn grouper() -> NodeGrouper {
    Arc::new(|_| Ok(GROUP.to_string()))
}

impl BenchServer {
    /// Starts a server already holding `workload`'s snapshot, ready to answer.
    pub async fn start(opts: &ServerOptions, workload: &Workload) -> Result<BenchServer> {
        match opts.mode {
            ServerMode::InProcess => Self::start_in_process(opts, workload),
            ServerMode::Child => Self::start_child(opts, workload.spec()).await,
        }
    }

    fn start_in_process(opts: &ServerOptions, workload: &Workload) -> Result<BenchServer> {
        let cache = SnapshotCache::new();
        cache.set_snapshot(GROUP, workload.snapshot().clone());
        cache.set_ready(true);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(opts.threads.max(1))
            .thread_name(THREAD_PREFIX)
            .enable_all()
            .build()?;
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let (tx, rx) = oneshot::channel::<()>();
        let server = XdsServer::builder(cache.clone())
            .grouper(grouper())
            .push_interval(opts.push_interval)
            .build();
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
            let _ = server
                .serve_with_shutdown(listener, async {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(BenchServer {
            addr,
            kind: Kind::InProcess {
                cache,
                runtime: Some(runtime),
                shutdown: Some(tx),
            },
        })
    }

    async fn start_child(opts: &ServerOptions, spec: &WorkloadSpec) -> Result<BenchServer> {
        let exe = match &opts.exe {
            Some(p) => p.clone(),
            None => std::env::current_exe()?,
        };
        let mut child = tokio::process::Command::new(&exe)
            .arg("serve-snapshot")
            .args(["--clusters", &spec.clusters.to_string()])
            .args(["--endpoints", &spec.endpoints.to_string()])
            .args(["--threads", &opts.threads.to_string()])
            .args(["--listen", "127.0.0.1:0"])
            .args([
                "--push-interval-ms",
                &opts.push_interval.as_millis().to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} serve-snapshot", exe.display()))?;
        let pid = child.id().ok_or_else(|| anyhow!("child exited"))?;
        let stdin = child.stdin.take().expect("piped");
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let first = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
            .await
            .context("serve-snapshot did not start in 120 s")??
            .ok_or_else(|| anyhow!("serve-snapshot exited before listening"))?;
        let addr: SocketAddr = first
            .strip_prefix("listening ")
            .ok_or_else(|| anyhow!("unexpected serve-snapshot output {first:?}"))?
            .parse()?;
        let (tx, oks) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.starts_with("ok") && tx.send(()).is_err() {
                    break;
                }
            }
        });
        Ok(BenchServer {
            addr,
            kind: Kind::Child {
                child,
                pid,
                stdin,
                oks,
                pending: 0,
            },
        })
    }

    /// Publishes `change`, which the bench has already applied to `workload`.
    /// Returns once the in-process cache holds it, or once the child was told.
    pub async fn publish(&mut self, change: Change, workload: &Workload) -> Result<()> {
        match &mut self.kind {
            Kind::InProcess { cache, .. } => {
                cache.set_snapshot(GROUP, workload.snapshot().clone());
            }
            Kind::Child {
                stdin,
                pending,
                oks,
                ..
            } => {
                while oks.try_recv().is_ok() {
                    *pending = pending.saturating_sub(1);
                }
                let mut line = change.to_line();
                line.push('\n');
                stdin.write_all(line.as_bytes()).await?;
                stdin.flush().await?;
                *pending += 1;
            }
        }
        Ok(())
    }

    /// Waits until every published change is in the server's cache.
    pub async fn flush(&mut self) -> Result<()> {
        if let Kind::Child { oks, pending, .. } = &mut self.kind {
            while *pending > 0 {
                match tokio::time::timeout(Duration::from_secs(30), oks.recv()).await {
                    Ok(Some(())) => *pending -= 1,
                    _ => bail!("serve-snapshot stopped answering"),
                }
            }
        }
        Ok(())
    }

    /// CPU-seconds the server has used so far.
    pub fn cpu_seconds(&self) -> f64 {
        match &self.kind {
            Kind::InProcess { .. } => measure::threads_cpu_seconds(THREAD_PREFIX),
            Kind::Child { pid, .. } => measure::process_cpu_seconds(*pid),
        }
    }

    /// Server memory (in-process: the whole bench process, clients included).
    pub fn memory(&self) -> Memory {
        match &self.kind {
            Kind::InProcess { .. } => measure::process_memory("self"),
            Kind::Child { pid, .. } => measure::process_memory(&pid.to_string()),
        }
    }

    pub fn mode(&self) -> ServerMode {
        match self.kind {
            Kind::InProcess { .. } => ServerMode::InProcess,
            Kind::Child { .. } => ServerMode::Child,
        }
    }

    pub async fn stop(mut self) {
        match &mut self.kind {
            Kind::InProcess {
                runtime, shutdown, ..
            } => {
                if let Some(tx) = shutdown.take() {
                    let _ = tx.send(());
                }
                if let Some(rt) = runtime.take() {
                    rt.shutdown_background();
                }
            }
            Kind::Child { child, stdin, .. } => {
                let _ = stdin.write_all(b"quit\n").await;
                let _ = stdin.flush().await;
                if tokio::time::timeout(Duration::from_secs(5), child.wait())
                    .await
                    .is_err()
                {
                    let _ = child.kill().await;
                }
            }
        }
    }
}

impl Drop for BenchServer {
    fn drop(&mut self) {
        // A runtime may not be dropped inside async code: shut it down in the background.
        if let Kind::InProcess { runtime, .. } = &mut self.kind
            && let Some(rt) = runtime.take()
        {
            rt.shutdown_background();
        }
    }
}

/// `ballast-bench serve-snapshot`: the server alone, serving the workload and
/// applying changes read from stdin (`ep <cluster> <counter>`, `global <gen>`,
/// `quit`). Prints `listening <addr>` when ready and `ok` after each change.
pub async fn serve_snapshot(
    spec: WorkloadSpec,
    listen: SocketAddr,
    push_interval: Duration,
) -> Result<()> {
    use std::io::Write;
    let mut workload = Workload::new(spec);
    let cache = SnapshotCache::new();
    cache.set_snapshot(GROUP, workload.snapshot().clone());
    cache.set_ready(true);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let server = XdsServer::builder(cache.clone())
        .grouper(grouper())
        .push_interval(push_interval)
        .build();
    let (tx, rx) = oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve_with_shutdown(listener, async {
        let _ = rx.await;
    }));
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening {addr}")?;
        out.flush()?;
    }
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        let line = line.trim();
        if line == "quit" {
            break;
        }
        let Some(change) = Change::parse(line) else {
            eprintln!("serve-snapshot: unknown command {line:?}");
            continue;
        };
        workload.apply(change);
        cache.set_snapshot(GROUP, workload.snapshot().clone());
        let mut out = std::io::stdout().lock();
        writeln!(out, "ok")?;
        out.flush()?;
    }
    let _ = tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(2), serving).await;
    Ok(())
}
