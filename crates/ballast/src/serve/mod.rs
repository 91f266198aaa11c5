//! `ballast serve`: wires source → pipeline (translate, guard) → cache → xDS
//! server, plus the admin server.

pub mod etcd;
pub mod leader;
pub mod pipeline;
pub mod security;

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ballast_sources::{FileSource, FileSourceOptions, MergedSource, Source, StaticSource};
use ballast_xds::{SnapshotCache, XdsServer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::guard::GuardConfig;
use crate::metrics::{Metrics, MetricsObserver};
use ballast_xds::ResumeGuardConfig;
use pipeline::{GuardInfo, Pipeline, PipelineStatus};

pub const QUICKSTART: &str = include_str!("../quickstart.yaml");

/// The quickstart config for this server: its Backend is this server's own
/// admin address (so `curl <gateway>/healthz` works whatever `--admin-addr`
/// is), and its Gateway listens on `listen_port` (default 10000).
pub fn quickstart(admin_addr: SocketAddr, listen_port: u16) -> String {
    let ip = if admin_addr.ip().is_unspecified() {
        std::net::IpAddr::from([127, 0, 0, 1])
    } else {
        admin_addr.ip()
    };
    let ip = match ip {
        std::net::IpAddr::V6(v6) => format!("\"{v6}\""),
        v4 => v4.to_string(),
    };
    QUICKSTART
        .replace(
            "{ address: 127.0.0.1, port: 18001 }",
            &format!("{{ address: {ip}, port: {} }}", admin_addr.port()),
        )
        .replace(
            "{ name: http, port: 10000, protocol: HTTP }",
            &format!("{{ name: http, port: {listen_port}, protocol: HTTP }}"),
        )
}

pub struct ServeOptions {
    /// Split route configurations into VHDS virtual hosts for Delta Envoys.
    pub vhds: bool,
    pub configs: Vec<PathBuf>,
    pub xds_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub guard: GuardConfig,
    pub grace: Duration,
    pub debounce_quiet: Duration,
    pub debounce_max: Duration,
    pub initial_sync_delay: Duration,
    pub quickstart_port: u16,
    pub limits: ballast_xds::Limits,
    /// Bound on a graceful stop: streams end at once, the process exits
    /// within this even if clients misbehave.
    pub shutdown_grace: Duration,
    /// Close xDS connections after this age (jittered), for rebalancing.
    pub max_connection_age: Option<Duration>,
    /// `--push-interval-ms`: `XdsServerBuilder::push_interval`.
    pub push_interval: Duration,
    /// The DNS servers of DNS clusters (`--dns-resolver`).
    pub dns_resolvers: Vec<SocketAddr>,
    pub security: security::SecurityFlags,
    /// Where the guard keeps the last published inventories (issue 16).
    pub state_dir: PathBuf,
    /// The etcd source; with it, the guard's state lives in etcd, not `state_dir`.
    pub etcd: etcd::EtcdArgs,
}

/// `ballast serve` flags for the xDS server's limits (docs/operations.md, "Limits").
#[derive(clap::Args, Debug, Clone)]
pub struct LimitArgs {
    /// Largest gRPC request message (bytes, or with KiB/MiB/GiB).
    #[arg(long, default_value = "4MiB", value_parser = size)]
    pub max_request_bytes: usize,
    /// Most resource names in one request (SotW names; Delta subscribe +
    /// unsubscribe + initial versions).
    #[arg(long, default_value_t = ballast_xds::Limits::default().max_resource_names, value_parser = count)]
    pub max_resource_names: usize,
    /// Most concurrent xDS streams on one connection.
    #[arg(long, default_value_t = ballast_xds::Limits::default().max_streams_per_connection, value_parser = count)]
    pub max_streams_per_connection: usize,
    /// Most concurrent xDS streams of one node id.
    #[arg(long, default_value_t = ballast_xds::Limits::default().max_streams_per_node, value_parser = count)]
    pub max_streams_per_node: usize,
    /// Most concurrent xDS streams in total.
    #[arg(long, default_value_t = ballast_xds::Limits::default().max_streams, value_parser = count)]
    pub max_streams: usize,
    /// Longest node.id and node.cluster.
    #[arg(long, default_value = "1KiB", value_parser = size)]
    pub max_node_id_bytes: usize,
    /// Largest encoded node.metadata.
    #[arg(long, default_value = "64KiB", value_parser = size)]
    pub max_node_metadata_bytes: usize,
    /// Largest REST-JSON request body (413 beyond).
    #[arg(long, default_value = "4MiB", value_parser = size)]
    pub max_rest_body_bytes: usize,
}

impl LimitArgs {
    pub fn limits(&self) -> ballast_xds::Limits {
        {
            let mut l = ballast_xds::Limits::default();
            l.max_request_bytes = self.max_request_bytes;
            l.max_resource_names = self.max_resource_names;
            l.max_streams_per_connection = self.max_streams_per_connection;
            l.max_streams_per_node = self.max_streams_per_node;
            l.max_streams = self.max_streams;
            l.max_node_id_bytes = self.max_node_id_bytes;
            l.max_node_metadata_bytes = self.max_node_metadata_bytes;
            l.max_rest_body_bytes = self.max_rest_body_bytes;
            l
        }
    }
}

/// A positive count.
fn count(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{s:?}: {e}")),
    }
}

/// A positive size in bytes: `4194304`, `4MiB`, `64KiB`, `1GiB`.
fn size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mul) = [("GiB", 1usize << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]
        .into_iter()
        .find_map(|(suf, m)| t.strip_suffix(suf).map(|n| (n.trim(), m)))
        .unwrap_or((t, 1));
    let n: usize = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (bytes, or a number with KiB, MiB or GiB)"))?;
    match n.checked_mul(mul) {
        Some(0) => Err("must be at least 1 byte".into()),
        Some(v) if v <= u32::MAX as usize => Ok(v),
        _ => Err(format!("{s:?} is too large (at most 4GiB - 1)")),
    }
}

pub async fn serve(opts: ServeOptions) -> anyhow::Result<()> {
    let sec = security::prepare(
        &opts.security,
        opts.xds_addr,
        opts.admin_addr,
        &opts.configs,
    )?;
    // Bound first: the quickstart config routes to the actual admin address.
    let xds_listener = TcpListener::bind(opts.xds_addr)
        .await
        .with_context(|| format!("binding xDS address {}", opts.xds_addr))?;
    let admin_listener = TcpListener::bind(opts.admin_addr)
        .await
        .with_context(|| format!("binding admin address {}", opts.admin_addr))?;
    if opts.etcd.enabled()
        && !opts.xds_addr.ip().is_loopback()
        && opts.security.xds_client_ca.is_none()
        && !opts.security.insecure_plaintext_xds
    {
        anyhow::bail!(
            "refusing to serve xDS on {} without mTLS with --etcd: objects in etcd may hold TLS secrets at any time, \
             and any client that reaches this address could ask for their private keys over SDS. \
             Pass --xds-tls-cert/--xds-tls-key/--xds-client-ca, bind --xds-addr to loopback, or accept the risk \
             with --insecure-plaintext-xds",
            opts.xds_addr
        );
    }
    let etcd_source = opts
        .etcd
        .enabled()
        .then(|| opts.etcd.source())
        .transpose()?;
    let etcd_state = etcd_source.as_ref().map(|s| etcd::EtcdState {
        client: s.client().clone(),
        key: opts.etcd.guard_state_key(),
    });
    let file_source = (!opts.configs.is_empty()).then(|| {
        FileSource::new(
            opts.configs.clone(),
            FileSourceOptions {
                quiet: opts.debounce_quiet,
                max_delay: opts.debounce_max,
                initial_delay: opts.initial_sync_delay,
            },
        )
        // Last known good, not the guard: kept with or without --no-guard.
        .with_last_good(&opts.state_dir)
    });
    let source: Box<dyn Source> = match (file_source, etcd_source) {
        (Some(f), None) => Box::new(f),
        (None, Some(e)) => Box::new(e),
        (Some(f), Some(e)) => Box::new(MergedSource::new(vec![
            (f.name().to_string(), Box::new(f)),
            (e.name().to_string(), Box::new(e)),
        ])),
        (None, None) => {
            let text = quickstart(admin_listener.local_addr()?, opts.quickstart_port);
            let source = StaticSource::from_files(
                "builtin:quickstart",
                [("builtin:quickstart.yaml", text.as_str())],
            )
            .map_err(|errs| {
                anyhow::anyhow!(
                    "built-in quickstart config is invalid: {}",
                    errs.iter()
                        .map(|e| e.to_string())
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            })?;
            info!("no --config or --etcd given: serving the built-in quickstart config");
            Box::new(source)
        }
    };

    let metrics = Metrics::new();
    let cache = SnapshotCache::new();
    let observer = Arc::new(MetricsObserver::new(metrics.clone()));
    let client_holds = observer.client_holds.clone();
    // A reconnecting proxy's report of what it holds is a baseline too: it
    // protects it even without a state file (a fresh replica taking over).
    let resume_guard = opts.guard.enabled.then_some(ResumeGuardConfig {
        max_removal: opts.guard.max_removal,
        settle: opts.guard.settle,
    });
    // Transports (other than ADS) Envoys have asked over: the pipeline
    // translates a gateway once per transport in use (crate::grouping).
    let (demand_tx, demand) = tokio::sync::watch::channel(std::collections::BTreeSet::new());
    let vhds = opts.vhds;
    let grouper: ballast_xds::TransportGrouper = Arc::new(move |node, transport| {
        let gateway = crate::grouping::gateway_of(node)?;
        let mut t = crate::grouping::config_transport(transport);
        if !vhds && t == ballast_translate::XdsTransport::DeltaAds {
            // Without VHDS, Delta ADS Envoys get what SotW ADS ones get.
            t = ballast_translate::XdsTransport::Ads;
        }
        if t != ballast_translate::XdsTransport::Ads {
            demand_tx.send_if_modified(|d| d.insert(t));
        }
        Ok(crate::grouping::group_name(&gateway, t))
    });
    let mut builder = XdsServer::builder(cache.clone())
        .transport_grouper(grouper)
        .observer(observer)
        .grace(opts.grace)
        .limits(opts.limits)
        .shutdown_grace(opts.shutdown_grace)
        .max_connection_age(opts.max_connection_age)
        .push_interval(opts.push_interval)
        .resume_guard(resume_guard);
    if let Some(tls) = sec.tls {
        builder = builder.tls(tls);
    }
    if let Some(admission) = sec.admission {
        builder = builder.admission(admission);
    }
    let server = builder.build();

    // Registered before anything is announced, so a SIGTERM right after
    // start-up is a graceful stop too (not the default: die at once).
    let mut signals = StopSignals::new()?;
    // Printed for tests and scripts that bind port 0.
    println!("xds listening on {}", xds_listener.local_addr()?);
    println!("admin listening on {}", admin_listener.local_addr()?);

    let source_rx = source.start();
    // The live catalog (with --etcd): registered endpoints merged into their Backends.
    let catalog = etcd_state
        .as_ref()
        .map(|e| crate::catalog::Catalog::new(e.client.clone(), opts.etcd.etcd_prefix.clone()));
    let source_rx = match &catalog {
        None => source_rx,
        Some(c) => ballast_sources::catalog::overlay(
            source_rx,
            ballast_sources::catalog::CatalogSource::new(
                c.client().clone(),
                &opts.etcd.etcd_prefix,
            )
            .start(),
        ),
    };
    // One drain signal for the whole process: SIGTERM/SIGINT cancel it;
    // /readyz and the xDS server (every stream) watch it.
    let stop = CancellationToken::new();
    let loaded = if !opts.guard.enabled || etcd_state.is_some() {
        // From etcd: loaded in the pipeline task (the store may not answer yet).
        crate::state::Loaded::default()
    } else {
        crate::state::load_or_warn(&opts.state_dir)
    };
    let (state_tx, state_rx) = watch::channel(Arc::new(crate::state::Records::new()));
    let mut state_task = match &etcd_state {
        Some(e) => tokio::spawn(crate::state::writer_etcd(
            e.client.clone(),
            e.key.clone(),
            state_rx,
        )),
        None => tokio::spawn(crate::state::writer(opts.state_dir.clone(), state_rx)),
    };
    let (status_tx, status_rx) = watch::channel(PipelineStatus {
        guard: GuardInfo {
            enabled: opts.guard.enabled,
            max_removal: opts.guard.max_removal,
            settle_ms: opts.guard.settle.as_millis(),
            state_file: Some(match &etcd_state {
                Some(e) => crate::state::etcd_path(&e.key),
                None => crate::state::path_in(&opts.state_dir),
            }),
            restart_baseline: Vec::new(),
            state_written_at: loaded.written_at,
        },
        ..PipelineStatus::default()
    });
    // Singleton work (status write-back) behind an etcd leader election.
    let leader = match &etcd_state {
        Some(e) => Some(leader::start(
            e.client.clone(),
            &opts.etcd.etcd_prefix,
            leader::identity(
                opts.etcd.leader_identity.as_deref(),
                admin_listener.local_addr()?,
            ),
            opts.etcd.leader_ttl,
            source_rx.clone(),
            metrics.clone(),
            stop.clone(),
        )),
        None => None,
    };
    let guard_from_etcd = etcd_state.filter(|_| opts.guard.enabled);
    let mut pipeline = Pipeline {
        cache: cache.clone(),
        metrics: metrics.clone(),
        guard: opts.guard,
        options: ballast_translate::Options {
            dns_resolvers: opts.dns_resolvers.clone(),
            config_sources: ballast_translate::ConfigSources {
                vhds: opts.vhds,
                ..Default::default()
            },
            ..Default::default()
        },
        status: status_tx,
        baseline: baseline_of(loaded),
        state: Some(state_tx),
        demand,
    };
    let mut pipeline_task = tokio::spawn({
        let (source_rx, stop) = (source_rx.clone(), stop.clone());
        async move {
            if let Some(e) = guard_from_etcd {
                let loaded = crate::state::load_etcd(&e.client, &e.key, &stop).await;
                let written_at = loaded.written_at;
                pipeline.baseline = baseline_of(loaded);
                pipeline
                    .status
                    .send_modify(|s| s.guard.state_written_at = written_at);
            }
            pipeline.run(source_rx).await
        }
    });

    // A second signal cuts the drain short.
    let stop_now = CancellationToken::new();
    tokio::spawn({
        let (stop, stop_now) = (stop.clone(), stop_now.clone());
        async move {
            signals.recv().await;
            stop.cancel();
            signals.recv().await;
            stop_now.cancel();
        }
    });
    // The admin server outlives the xDS drain, so probes see 503 meanwhile.
    let admin_stop = CancellationToken::new();
    let mut admin = crate::admin::router(crate::admin::AdminState {
        server: server.clone(),
        status: status_rx,
        source: source_rx,
        metrics,
        stopping: stop.clone(),
        client_holds,
    });
    if let Some(c) = catalog {
        admin = admin.merge(crate::catalog::router(c));
    }
    if let Some(l) = leader {
        admin = admin.merge(leader::router(l));
    }
    if let Some(token) = sec.admin_token {
        admin = crate::admin::auth::require_token(admin, token);
    }
    let mut admin_task = tokio::spawn(
        axum::serve(admin_listener, admin)
            .with_graceful_shutdown(admin_stop.clone().cancelled_owned())
            .into_future(),
    );
    let mut xds_task = tokio::spawn(
        server
            .clone()
            .serve_with_shutdown(xds_listener, stop.clone().cancelled_owned()),
    );

    // Biased: once stopping, the xDS server ending is expected, not an error.
    tokio::select! {
        biased;
        _ = stop.cancelled() => {}
        r = &mut xds_task => { r??; anyhow::bail!("xDS server stopped"); }
        r = &mut admin_task => { r??; anyhow::bail!("admin server stopped"); }
        r = &mut pipeline_task => { r?; anyhow::bail!("pipeline stopped"); }
        r = &mut state_task => { r?; anyhow::bail!("state writer stopped"); }
    }
    let deadline = tokio::time::Instant::now() + opts.shutdown_grace;
    info!(grace = ?opts.shutdown_grace, "shutting down: /readyz answers 503, xDS streams end with UNAVAILABLE");
    pipeline_task.abort();
    // The library bounds its own drain by the same grace; a second signal
    // cuts it short.
    tokio::select! {
        r = tokio::time::timeout_at(deadline, &mut xds_task) => match r {
            Ok(Ok(Err(e))) => warn!(error = %e, "xDS server ended with an error while stopping"),
            Ok(Err(e)) => warn!(error = %e, "xDS server task failed while stopping"),
            Ok(Ok(Ok(()))) => {}
            Err(_) => warn!("xDS server did not stop within the grace"),
        },
        _ = stop_now.cancelled() => warn!("second signal: stopping now"),
    }
    // The pipeline's end closes the state channel: the writer saves the
    // last published inventories and ends (bounded by the same grace).
    let _ = tokio::time::timeout_at(deadline, &mut state_task).await;
    admin_stop.cancel();
    let _ = tokio::time::timeout_at(deadline, &mut admin_task).await;
    info!("stopped");
    Ok(())
}

/// The guard's restart baseline, keyed by gateway.
fn baseline_of(
    loaded: crate::state::Loaded,
) -> std::collections::BTreeMap<ballast_model::ObjectKey, crate::guard::Inventory> {
    loaded
        .gateways
        .into_iter()
        .map(|(k, inv)| (crate::gateway_key(&k), inv))
        .collect()
}

/// SIGTERM (orchestrators) and SIGINT (Ctrl-C).
struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn new() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(StopSignals {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {},
            _ = self.int.recv() => {},
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        limits: LimitArgs,
    }

    #[test]
    fn limit_flags_default_to_the_library_limits_and_parse_sizes() {
        use clap::Parser;
        let d = Cli::try_parse_from(["x"]).unwrap().limits.limits();
        assert_eq!(d, ballast_xds::Limits::default());
        let c = Cli::try_parse_from([
            "x",
            "--max-request-bytes=64KiB",
            "--max-resource-names=7",
            "--max-streams-per-connection=2",
            "--max-streams-per-node=3",
            "--max-streams=9",
            "--max-node-id-bytes=100",
            "--max-node-metadata-bytes=1MiB",
            "--max-rest-body-bytes=512",
        ])
        .unwrap()
        .limits
        .limits();
        assert_eq!(c, {
            let mut l = ballast_xds::Limits::default();
            l.max_request_bytes = 65536;
            l.max_resource_names = 7;
            l.max_streams_per_connection = 2;
            l.max_streams_per_node = 3;
            l.max_streams = 9;
            l.max_node_id_bytes = 100;
            l.max_node_metadata_bytes = 1 << 20;
            l.max_rest_body_bytes = 512;
            l
        });
        for bad in [
            "--max-streams=0",
            "--max-request-bytes=4TiB",
            "--max-request-bytes=5GiB",
        ] {
            assert!(Cli::try_parse_from(["x", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn quickstart_follows_the_admin_address() {
        let default = quickstart("127.0.0.1:18001".parse().unwrap(), 10000);
        assert_eq!(default, QUICKSTART);
        let moved = quickstart("0.0.0.0:19001".parse().unwrap(), 10080);
        assert!(
            moved.contains("{ address: 127.0.0.1, port: 19001 }"),
            "{moved}"
        );
        assert!(
            moved.contains("{ name: http, port: 10080, protocol: HTTP }"),
            "{moved}"
        );
        let v6 = quickstart("[::1]:19001".parse().unwrap(), 10000);
        assert!(v6.contains(r#"{ address: "::1", port: 19001 }"#), "{v6}");
        for text in [moved, v6] {
            StaticSource::from_files("t", [("q.yaml", text.as_str())]).expect("valid config");
        }
    }
}
