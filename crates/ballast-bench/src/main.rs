//! `ballast-bench`: fleet benchmarks for Ballast's xDS server.
//!
//! ```sh
//! ballast-bench --smoke                         # correctness check, seconds
//! ballast-bench cold-start --proxies 1000       # W1
//! ballast-bench churn --rate 100 --duration-s 60  # W2 (SotW and Delta)
//! ballast-bench route-edit                     # W3 (real `ballast` binary)
//! ballast-bench large-cold                     # W4 (real `ballast` binary)
//! ballast-bench reconnect --proxies 2000       # W5
//! ballast-bench global-push                    # W6
//! ballast-bench delta-vs-sotw                  # W7
//! ballast-bench idle-memory --proxies 1000,5000,10000  # W8
//! ballast-bench burst                          # W10 (real `ballast` binary)
//! ballast-bench rest-poll                    # REST 200/304 server time (issue 15)
//! ballast-bench compare-sovereign              # side by side with sovereign (REST)
//! ballast-bench envoy-lane                     # real Envoys
//! ballast-bench etcd-churn                     # W2 through etcd: 1,000 proxies, 100 puts/s
//! ballast-bench scaling                       # scaling curves + SVG plots
//! ```
//!
//! See `docs/benchmarks.md`.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Result, bail};
use ballast_bench::report::Report;
use ballast_bench::scenarios::{
    self, burst::BurstArgs, churn::ChurnArgs, cold_start::ColdStartArgs,
    compare_sovereign::CompareSovereignArgs, delta_vs_sotw::DeltaVsSotwArgs,
    envoy_lane::EnvoyLaneArgs, etcd_churn::EtcdChurnArgs, etcd_lane::EtcdLaneArgs,
    global_push::GlobalPushArgs, idle_memory::IdleMemoryArgs, large_cold::LargeColdArgs,
    reconnect::ReconnectArgs, rest_poll::RestPollArgs, route_edit::RouteEditArgs,
    scaling::ScalingArgs,
};
use ballast_bench::server::{ServerMode, ServerOptions, serve_snapshot};
use ballast_bench::workload::WorkloadSpec;
use clap::{Parser, Subcommand};

/// The same allocator as the `ballast` binary, so the `serve-snapshot` server's CPU and memory
/// are the ones it would have.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser, Debug)]
#[command(
    name = "ballast-bench",
    about = "Fleet benchmarks for the Ballast xDS server"
)]
struct Cli {
    /// Tiny correctness run (W1 + W2 + W5 over SotW, Delta, REST; W3 + W10 + etcd churn
    /// against the `ballast` binary, etcd from $BALLAST_ETCD); exits non-zero on failure.
    #[arg(long)]
    smoke: bool,
    /// Where the server under test runs. Report numbers from `child`.
    #[arg(long, value_enum, global = true, default_value_t = ServerMode::Child)]
    server: ServerMode,
    /// Worker threads of the server runtime.
    #[arg(long, global = true, default_value_t = 2)]
    server_threads: usize,
    /// Worker threads of the client fleet runtime (default: all cores).
    #[arg(long, global = true)]
    client_threads: Option<usize>,
    /// Publish pacing of the library server under test
    /// (`XdsServerBuilder::push_interval`, ms; 0: off, the default).
    #[arg(long, global = true, default_value_t = 0)]
    push_interval_ms: u64,
    /// Directory for the JSON results.
    #[arg(long, global = true, default_value = "bench-results")]
    out: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// W1: N proxies connect at once; time until all ACKed the full config.
    ColdStart(ColdStartArgs),
    /// W2: endpoint churn; convergence per proxy from publish to ACK.
    Churn(ChurnArgs),
    /// W3: one route edit among 10k routes, real `ballast` binary, 10 gateway proxies.
    RouteEdit(RouteEditArgs),
    /// W4: cold start of the `ballast` binary with 3,400 vhosts × 5 routes, 4 proxies.
    LargeCold(LargeColdArgs),
    /// W5: drop and restore N streams; time until all re-synced.
    Reconnect(ReconnectArgs),
    /// W6: global full push (~84 KB CDS) to N proxies, 20 repetitions.
    GlobalPush(GlobalPushArgs),
    /// W7: Delta vs SotW bytes and CPU on W2 and W3.
    DeltaVsSotw(DeltaVsSotwArgs),
    /// W8: server memory per idle proxy at several fleet sizes.
    IdleMemory(IdleMemoryArgs),
    /// W10: 1,000 config events in 1 s against the `ballast` binary.
    Burst(BurstArgs),
    /// REST-JSON 200 and 304 latency and server CPU per poll (issue 15).
    RestPoll(RestPollArgs),
    /// Ballast vs sovereign over REST polling (ratios).
    CompareSovereign(CompareSovereignArgs),
    /// Real Envoys: config change → every Envoy reports the new CDS version.
    EnvoyLane(EnvoyLaneArgs),
    /// etcd write → every real Envoy has the new CDS version; churn through etcd.
    EtcdLane(EtcdLaneArgs),
    /// W2 through etcd: endpoint puts → every simulated proxy ACKed, `ballast serve --etcd`.
    EtcdChurn(EtcdChurnArgs),
    /// Memory per proxy and convergence vs fleet size, with SVG plots.
    Scaling(ScalingArgs),
    /// Internal: the server alone, driven over stdin (used by `--server child`).
    ServeSnapshot {
        #[arg(long, default_value_t = 1000)]
        clusters: usize,
        #[arg(long, default_value_t = 10)]
        endpoints: usize,
        #[arg(long, default_value_t = 2)]
        threads: usize,
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        #[arg(long, default_value_t = 0)]
        push_interval_ms: u64,
    },
}

fn runtime(threads: Option<usize>) -> Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(t) = threads {
        b.worker_threads(t.max(1));
    }
    Ok(b.enable_all().build()?)
}

fn emit(report: &Report, out: &std::path::Path) -> Result<()> {
    let path = report.write_json(out)?;
    println!("{}", report.markdown());
    eprintln!("results: {}", path.display());
    Ok(())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if let Some(Command::ServeSnapshot {
        clusters,
        endpoints,
        threads,
        listen,
        push_interval_ms,
    }) = cli.command
    {
        let spec = WorkloadSpec {
            clusters,
            endpoints,
        };
        return runtime(Some(threads))?.block_on(serve_snapshot(
            spec,
            listen,
            std::time::Duration::from_millis(push_interval_ms),
        ));
    }
    let server = ServerOptions {
        mode: cli.server,
        threads: cli.server_threads,
        exe: None,
        push_interval: std::time::Duration::from_millis(cli.push_interval_ms),
    };
    let rt = runtime(cli.client_threads)?;
    rt.block_on(async {
        if cli.smoke {
            let opts = scenarios::smoke::SmokeOptions {
                server,
                binary_out: Some(cli.out.clone()),
                ..Default::default()
            };
            let report = scenarios::smoke::run(&opts).await?;
            println!("{}", report.markdown());
            eprintln!("smoke: ok");
            return Ok(());
        }
        let report = match &cli.command {
            Some(Command::ColdStart(a)) => scenarios::cold_start::run(&server, a).await?,
            Some(Command::Churn(a)) => scenarios::churn::run(&server, a).await?,
            Some(Command::IdleMemory(a)) => scenarios::idle_memory::run(&server, a).await?,
            Some(Command::RouteEdit(a)) => scenarios::route_edit::run(&cli.out, a).await?,
            Some(Command::LargeCold(a)) => scenarios::large_cold::run(&cli.out, a).await?,
            Some(Command::Reconnect(a)) => scenarios::reconnect::run(&server, a).await?,
            Some(Command::GlobalPush(a)) => scenarios::global_push::run(&server, a).await?,
            Some(Command::DeltaVsSotw(a)) => {
                scenarios::delta_vs_sotw::run(&server, &cli.out, a).await?
            }
            Some(Command::RestPoll(a)) => scenarios::rest_poll::run(&server, a).await?,
            Some(Command::Burst(a)) => scenarios::burst::run(&cli.out, a).await?,
            Some(Command::CompareSovereign(a)) => {
                scenarios::compare_sovereign::run(&cli.out, a).await?
            }
            Some(Command::EnvoyLane(a)) => scenarios::envoy_lane::run(&cli.out, a).await?,
            Some(Command::EtcdLane(a)) => scenarios::etcd_lane::run(&cli.out, a).await?,
            Some(Command::EtcdChurn(a)) => scenarios::etcd_churn::run(&cli.out, a).await?,
            Some(Command::Scaling(a)) => scenarios::scaling::run(&server, a).await?,
            Some(Command::ServeSnapshot { .. }) => unreachable!("handled above"),
            None => {
                bail!("give a scenario or --smoke; see --help")
            }
        };
        emit(&report, &cli.out)
    })
}
