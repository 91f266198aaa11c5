//! `ballast serve`: wires source → pipeline (translate, guard) → cache → xDS
//! server, plus the admin server.

pub mod pipeline;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ballast_sources::{FileSource, FileSourceOptions, Source, StaticSource};
use ballast_xds::{SnapshotCache, XdsServer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::info;

use crate::guard::GuardConfig;
use crate::metrics::{Metrics, MetricsObserver};
use ballast_xds::server::resume_guard::ResumeGuardConfig;
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
    pub configs: Vec<PathBuf>,
    pub xds_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub guard: GuardConfig,
    pub grace: Duration,
    pub debounce_quiet: Duration,
    pub debounce_max: Duration,
    pub initial_sync_delay: Duration,
    pub quickstart_port: u16,
    /// Where the guard keeps the last published inventories (issue 16).
    pub state_dir: PathBuf,
}

pub async fn serve(opts: ServeOptions) -> anyhow::Result<()> {
    // Bound first: the quickstart config routes to the actual admin address.
    let xds_listener = TcpListener::bind(opts.xds_addr)
        .await
        .with_context(|| format!("binding xDS address {}", opts.xds_addr))?;
    let admin_listener = TcpListener::bind(opts.admin_addr)
        .await
        .with_context(|| format!("binding admin address {}", opts.admin_addr))?;
    let source: Box<dyn Source> = if opts.configs.is_empty() {
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
        info!("no --config given: serving the built-in quickstart config");
        Box::new(source)
    } else {
        Box::new(FileSource::new(
            opts.configs.clone(),
            FileSourceOptions {
                quiet: opts.debounce_quiet,
                max_delay: opts.debounce_max,
                initial_delay: opts.initial_sync_delay,
            },
        ))
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
    let server = XdsServer::builder(cache.clone())
        .grouper(Arc::new(crate::grouping::gateway_of))
        .observer(observer)
        .grace(opts.grace)
        .resume_guard(resume_guard)
        .build();

    // Printed for tests and scripts that bind port 0.
    println!("xds listening on {}", xds_listener.local_addr()?);
    println!("admin listening on {}", admin_listener.local_addr()?);

    let source_rx = source.start();
    let loaded = if opts.guard.enabled {
        crate::state::load_or_warn(&opts.state_dir)
    } else {
        crate::state::Loaded::default()
    };
    let (state_tx, state_rx) = watch::channel(Arc::new(crate::state::Inventories::new()));
    let state_task = tokio::spawn(crate::state::writer(opts.state_dir.clone(), state_rx));
    let (status_tx, status_rx) = watch::channel(PipelineStatus {
        guard: GuardInfo {
            enabled: opts.guard.enabled,
            max_removal: opts.guard.max_removal,
            settle_ms: opts.guard.settle.as_millis(),
            state_file: Some(crate::state::path_in(&opts.state_dir)),
            restart_baseline: Vec::new(),
            state_written_at: loaded.written_at,
        },
        ..PipelineStatus::default()
    });
    let pipeline = Pipeline {
        cache: cache.clone(),
        metrics: metrics.clone(),
        guard: opts.guard,
        options: ballast_translate::Options::default(),
        status: status_tx,
        baseline: loaded
            .gateways
            .into_iter()
            .map(|(k, inv)| (crate::gateway_key(&k), inv))
            .collect(),
        state: Some(state_tx),
    };
    let pipeline_task = tokio::spawn(pipeline.run(source_rx.clone()));

    let admin = crate::admin::router(crate::admin::AdminState {
        server: server.clone(),
        status: status_rx,
        source: source_rx,
        metrics,
        client_holds,
    });
    let admin_task = tokio::spawn(async move { axum::serve(admin_listener, admin).await });
    let xds_task = tokio::spawn(server.serve_with_shutdown(xds_listener, shutdown_signal()));

    tokio::select! {
        r = xds_task => { r??; }
        r = admin_task => { r??; anyhow::bail!("admin server stopped"); }
        r = pipeline_task => { r?; anyhow::bail!("pipeline stopped"); }
        r = state_task => { r?; anyhow::bail!("state writer stopped"); }
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = ctrl_c => {},
        _ = term.recv() => {},
    }
    info!("shutting down");
}

#[cfg(test)]
mod tests {
    use super::*;

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
