//! The `ballast` binary: CLI, wiring of sources → translate → cache → xDS
//! server, admin HTTP and metrics.
#![forbid(unsafe_code)]

mod admin;
mod authz;
mod bootstrap;
mod catalog;
mod certs;
mod etcdctl;
mod get_cmd;
mod grouping;
mod guard;
mod metrics;
mod serve;
mod state;
mod status_cmd;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(name = "ballast", version, about = "An Envoy xDS control plane")]
struct Cli {
    /// Log line format on stderr: `text` (colours only on a terminal) or
    /// `json` (one object per line, for log pipelines).
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Logs go to stderr; ANSI colours only when stderr is a terminal, so files,
/// journald and log shippers get plain text.
fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,h2=warn,tower=warn,hyper=warn".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    ballast_model::duration::parse_duration(s).map_err(|e| e.to_string())
}

/// A DNS server: `IP`, `IP:PORT` or `[IPv6]:PORT`; port 53 when omitted.
fn dns_server(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    s.parse::<std::net::IpAddr>()
        .map(|ip| SocketAddr::new(ip, 53))
        .map_err(|_| format!("{s:?} is not an IP address or IP:PORT"))
}

fn share(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim_end_matches('%')
        .parse()
        .map_err(|e| format!("{s:?}: {e}"))?;
    let v = if s.ends_with('%') { v / 100.0 } else { v };
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "{s:?} is not a share between 0 and 1 (or 0% and 100%)"
        ))
    }
}

#[derive(Subcommand)]
enum Command {
    /// Serve xDS. With no --config or --etcd, serves the built-in quickstart config.
    Serve {
        /// A YAML file or directory (recursively, *.yaml/*.yml). Repeatable.
        #[arg(long = "config", value_name = "PATH")]
        configs: Vec<PathBuf>,
        /// xDS (gRPC: ADS, per-type, SotW and Delta, CSDS; and REST-JSON) listen address.
        #[arg(long, default_value = "127.0.0.1:18000")]
        xds_addr: SocketAddr,
        /// Admin HTTP listen address (/healthz, /readyz, /metrics, /debug/*).
        #[arg(long, default_value = "127.0.0.1:18001")]
        admin_addr: SocketAddr,
        /// Share of a gateway's listeners, routes or clusters one publish may remove
        /// before the blast-radius guard holds it (e.g. 0.5 or 50%).
        #[arg(long, default_value = "0.5", value_parser = share)]
        guard_max_removal: f64,
        /// How long a held publish waits before it is applied if still wanted.
        #[arg(long, default_value = "10s", value_parser = duration)]
        guard_settle: Duration,
        /// Turn the blast-radius guard off: live holds, the restart baseline
        /// (state file) and the baseline reported by reconnecting proxies.
        #[arg(long)]
        no_guard: bool,
        /// Serve Delta Envoys whole route configurations instead of splitting
        /// them into VHDS virtual hosts (one resource per host, so a route
        /// edit re-sends one virtual host). SotW and REST Envoys always get
        /// whole route configurations.
        #[arg(long)]
        no_vhds: bool,
        /// Where the guard keeps the last published inventory of each gateway
        /// (names only), so a restart into a shrunken source is held too.
        /// Default: $STATE_DIRECTORY, else $XDG_STATE_HOME/ballast, else
        /// ~/.local/state/ballast. One directory per ballast instance.
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// How long a disconnected proxy's state is kept.
        #[arg(long, default_value = "30s", value_parser = duration)]
        node_grace: Duration,
        /// Config changes are applied after this quiet period...
        #[arg(long, default_value = "100ms", value_parser = duration)]
        debounce_quiet: Duration,
        /// ...but no later than this after the first change.
        #[arg(long, default_value = "1s", value_parser = duration)]
        debounce_max: Duration,
        /// Test hook: delay the end of the initial sync.
        #[arg(long, default_value = "0s", value_parser = duration, hide = true)]
        initial_sync_delay: Duration,
        /// Test hook: the port of the built-in quickstart Gateway.
        #[arg(long, default_value = "10000", hide = true)]
        quickstart_port: u16,
        #[command(flatten)]
        limits: serve::LimitArgs,
        /// On SIGTERM/SIGINT: /readyz fails at once, xDS streams end with
        /// UNAVAILABLE (Envoy keeps its config and reconnects), and the process
        /// exits 0 within this, even if clients misbehave.
        #[arg(long, default_value = "5s", value_parser = duration)]
        shutdown_grace: Duration,
        /// Close each xDS connection after this age (±10% jitter), so Envoys spread
        /// over replicas added later. Off by default.
        #[arg(long, value_parser = duration, value_name = "DURATION")]
        max_connection_age: Option<Duration>,
        /// Each xDS stream takes a newly published config at most once per
        /// this many milliseconds; publishes in between go out together in one
        /// push. Bounds per-proxy work under endpoint churn (etcd puts are not
        /// debounced); 0 pushes every publish as soon as the previous one is
        /// acknowledged. 150 ms spends 150 of W2's 200 ms latency budget
        /// (1,000 proxies, 100 endpoint changes/s: p99 ~155 ms at 0.21-0.28
        /// core, against ~103 ms at ~0.30-0.35 core with 100 ms;
        /// docs/benchmarks.md).
        #[arg(long, default_value_t = 150, value_name = "MS")]
        push_interval_ms: u64,
        /// DNS server Envoy asks to resolve Backends with hostname endpoints and
        /// ExternalName Services (IP or IP:PORT, port 53 by default). Repeatable.
        /// Default: the Envoy host's own resolver configuration.
        #[arg(long = "dns-resolver", value_name = "ADDR", value_parser = dns_server)]
        dns_resolvers: Vec<SocketAddr>,
        #[command(flatten)]
        security: Box<serve::security::SecurityFlags>,
        #[command(flatten)]
        etcd: Box<serve::etcd::EtcdArgs>,
    },
    /// Check config: exit 0, or print every error with file:line:col and exit 1.
    Validate {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Print the Envoy resources for a gateway.
    Translate {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// `namespace/name` or `name` (namespace `default`).
        #[arg(long)]
        gateway: String,
        /// As for `serve`: the DNS servers of DNS clusters.
        #[arg(long = "dns-resolver", value_name = "ADDR", value_parser = dns_server)]
        dns_resolvers: Vec<SocketAddr>,
    },
    /// Print an Envoy bootstrap that connects to this server.
    Bootstrap {
        /// The gateway this Envoy serves (`namespace/name` or `name`); becomes node.cluster.
        #[arg(long)]
        gateway: String,
        /// Where `ballast serve` listens for xDS.
        #[arg(long, default_value = "127.0.0.1:18000")]
        xds_addr: SocketAddr,
        /// node.id (default `envoy-<namespace>-<name>`).
        #[arg(long)]
        node_id: Option<String>,
        /// How Envoy fetches config: ADS (SotW or Delta), one gRPC stream per
        /// type (SotW or Delta), or REST-JSON polling.
        #[arg(long, value_enum, default_value_t = bootstrap::Transport::Ads)]
        transport: bootstrap::Transport,
        /// Same as `--transport delta-ads`.
        #[arg(long, conflicts_with = "transport")]
        delta: bool,
        /// Envoy's own admin port on 127.0.0.1 (0: any free port).
        #[arg(long, default_value = "9901")]
        envoy_admin_port: u16,
        /// Connect with mTLS using `ballast certs` files from this directory
        /// (ca.pem and gateway-<ns>-<name>{,-key}.pem).
        #[arg(long, value_name = "DIR")]
        tls_dir: Option<PathBuf>,
    },
    /// Development certificates for mTLS on the xDS port.
    #[command(subcommand)]
    Certs(CertsCommand),
    /// Show objects. Without `--etcd`: Gateway API status (Accepted/ResolvedRefs/Programmed
    /// with reasons) of gateways, routes or backends, from a running server's admin API or
    /// from config PATHS. With `--etcd`: the objects of any kind stored in etcd.
    Get {
        /// gateways, routes or backends (status); with --etcd any kind (gateway, httproute,
        /// backend, secret, ...; plural accepted).
        what: String,
        /// Without --etcd: config files or directories to compute status from, instead of
        /// asking a running server. With --etcd: one `namespace/name` or `name`.
        args: Vec<String>,
        /// Output format: table, yaml (json without --etcd).
        #[arg(short = 'o', long, default_value = "table")]
        output: String,
        /// The admin address of `ballast serve` (status without PATHS).
        #[arg(long, default_value = "127.0.0.1:18001")]
        admin_addr: SocketAddr,
        /// Bearer token for an admin API bound off loopback.
        #[arg(long, value_name = "FILE")]
        admin_token_file: Option<PathBuf>,
        /// etcd endpoint to read objects from (repeatable); see `ballast apply`.
        #[arg(long = "etcd", value_name = "URL")]
        etcd: Vec<String>,
        /// Key prefix of Ballast's objects in etcd.
        #[arg(long, default_value = ballast_sources::etcd_keys::DEFAULT_PREFIX)]
        etcd_prefix: String,
        /// CA bundle for https:// etcd endpoints.
        #[arg(long, value_name = "FILE")]
        etcd_ca: Option<PathBuf>,
        /// Client certificate for etcd (with --etcd-key).
        #[arg(long, value_name = "FILE")]
        etcd_cert: Option<PathBuf>,
        #[arg(long, value_name = "FILE")]
        etcd_key: Option<PathBuf>,
    },
    /// Validate objects from files and write them to etcd in one transaction.
    Apply {
        /// A YAML file or directory (recursively). Repeatable.
        #[arg(short = 'f', long = "filename", value_name = "PATH", required = true)]
        paths: Vec<PathBuf>,
        #[command(flatten)]
        edit: etcdctl::EditArgs,
        #[command(flatten)]
        etcd: etcdctl::EtcdArgs,
    },
    /// Print the Envoy resources an apply would add, modify or remove, per gateway.
    Diff {
        #[arg(short = 'f', long = "filename", value_name = "PATH", required = true)]
        paths: Vec<PathBuf>,
        #[command(flatten)]
        etcd: etcdctl::EtcdArgs,
    },
    /// Delete one object from etcd (checked like apply).
    Delete {
        #[arg(value_parser = etcdctl::parse_kind)]
        kind: ballast_model::Kind,
        /// `namespace/name` or `name` (namespace `default`).
        name: String,
        #[command(flatten)]
        edit: etcdctl::EditArgs,
        #[command(flatten)]
        etcd: etcdctl::EtcdArgs,
    },
    /// Register endpoints of a Backend in the live catalog; heartbeats while running,
    /// deregisters on SIGTERM/SIGINT (killed: expires after the TTL).
    Register {
        #[command(flatten)]
        args: catalog::RegisterArgs,
        #[command(flatten)]
        etcd: etcdctl::EtcdArgs,
    },
    /// Connected proxies and their per-type sync state.
    Status {
        /// The admin address of `ballast serve`.
        #[arg(long, default_value = "127.0.0.1:18001")]
        admin_addr: SocketAddr,
        /// Print the raw JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Bearer token for an admin API bound off loopback.
        #[arg(long, value_name = "FILE")]
        admin_token_file: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum CertsCommand {
    /// Create a development CA and a server certificate for the xDS port in DIR.
    Init {
        dir: PathBuf,
        /// Extra DNS names or IPs for the server certificate (localhost,
        /// 127.0.0.1 and ::1 are always included). Repeatable.
        #[arg(long = "server-name", value_name = "NAME")]
        server_names: Vec<String>,
        #[arg(long, default_value = "365")]
        days: u32,
    },
    /// Issue a client certificate for the Envoys of one gateway (SPIFFE ID
    /// spiffe://<trust-domain>/ns/<ns>/gw/<name>).
    Issue {
        /// `namespace/name` or `name` (namespace `default`).
        #[arg(long)]
        gateway: String,
        dir: PathBuf,
        #[arg(long, default_value = authz::DEFAULT_TRUST_DOMAIN)]
        trust_domain: String,
        /// Another URI SAN instead of the gateway's SPIFFE ID (e.g. an admin
        /// identity listed in --authz-file).
        #[arg(long)]
        identity: Option<String>,
        #[arg(long, default_value = "30")]
        days: u32,
    },
    /// Re-issue the xDS port's server certificate (rotation: `ballast serve`
    /// picks it up for new connections without a restart).
    Server {
        dir: PathBuf,
        #[arg(long = "server-name", value_name = "NAME")]
        server_names: Vec<String>,
        #[arg(long, default_value = "365")]
        days: u32,
    },
}

fn gateway_key(s: &str) -> ballast_model::ObjectKey {
    match s.split_once('/') {
        Some((ns, n)) => ballast_model::ObjectKey::new(ns, n),
        None => ballast_model::ObjectKey::new("default", s),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve {
            configs,
            xds_addr,
            admin_addr,
            guard_max_removal,
            guard_settle,
            no_guard,
            no_vhds,
            state_dir,
            node_grace,
            debounce_quiet,
            debounce_max,
            initial_sync_delay,
            quickstart_port,
            limits,
            shutdown_grace,
            max_connection_age,
            push_interval_ms,
            dns_resolvers,
            security,
            etcd,
        } => {
            let rt = tokio::runtime::Runtime::new()?;
            let served = rt.block_on(serve::serve(serve::ServeOptions {
                configs,
                xds_addr,
                admin_addr,
                guard: guard::GuardConfig {
                    enabled: !no_guard,
                    max_removal: guard_max_removal,
                    settle: guard_settle,
                },
                grace: node_grace,
                debounce_quiet,
                debounce_max,
                initial_sync_delay,
                quickstart_port,
                limits: limits.limits(),
                shutdown_grace,
                max_connection_age,
                push_interval: Duration::from_millis(push_interval_ms),
                dns_resolvers,
                security: *security,
                state_dir: state_dir.unwrap_or_else(state::default_dir),
                etcd: *etcd,
                vhds: !no_vhds,
            }));
            // The grace already bounded the stop: do not wait for blocking
            // tasks (file reads, watchers) on the way out.
            rt.shutdown_background();
            served?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Validate { paths } => match ballast_sources::load_paths_report(&paths) {
            Err(errors) => {
                for e in &errors {
                    println!("{e}");
                }
                println!("{} error(s)", errors.len());
                Ok(ExitCode::from(1))
            }
            // Every error (exit 1 for CI), though `serve` would serve everything else.
            Ok(loaded) if !loaded.report.errors.is_empty() => {
                for e in &loaded.report.errors {
                    println!("{e}");
                }
                for s in &loaded.report.skipped {
                    println!("warning: {s}");
                }
                println!("{} error(s)", loaded.report.errors.len());
                Ok(ExitCode::from(1))
            }
            Ok(loaded) => {
                for s in &loaded.report.skipped {
                    println!("warning: {s}");
                }
                let config = loaded.set;
                let status = ballast_model::status::compute(&config);
                let problems = status.problems();
                for p in &problems {
                    println!("warning: {p}");
                }
                let mut failed = false;
                for key in config.gateways.keys() {
                    if let Err(e) = ballast_translate::translate_gateway(
                        &config,
                        key,
                        &ballast_translate::Options::default(),
                    ) {
                        println!("gateway {key}: {e}");
                        failed = true;
                    }
                }
                println!(
                    "{} gateway(s), {} route(s), {} backend(s), {} secret(s): {}",
                    config.gateways.len(),
                    config.http_routes.len()
                        + config.grpc_routes.len()
                        + config.tls_routes.len()
                        + config.tcp_routes.len(),
                    config.backends.len(),
                    config.secrets.len(),
                    if failed { "translation failed" } else { "ok" }
                );
                Ok(if failed {
                    ExitCode::from(1)
                } else {
                    ExitCode::SUCCESS
                })
            }
        },
        Command::Translate {
            paths,
            gateway,
            dns_resolvers,
        } => {
            let config = match ballast_sources::load_paths(&paths) {
                Ok(c) => c,
                Err(errors) => {
                    for e in &errors {
                        eprintln!("{e}");
                    }
                    return Ok(ExitCode::from(1));
                }
            };
            let key = gateway_key(&gateway);
            if !config.gateways.contains_key(&key) {
                anyhow::bail!("no Gateway {key} in the config");
            }
            let resources = ballast_translate::translate_gateway(
                &config,
                &key,
                &ballast_translate::Options {
                    dns_resolvers,
                    ..Default::default()
                },
            )?;
            print!("{}", resources.to_yaml());
            Ok(ExitCode::SUCCESS)
        }
        Command::Bootstrap {
            gateway,
            xds_addr,
            node_id,
            transport,
            delta,
            envoy_admin_port,
            tls_dir,
        } => {
            let transport = if delta {
                bootstrap::Transport::DeltaAds
            } else {
                transport
            };
            let key = gateway_key(&gateway);
            print!(
                "{}",
                bootstrap::render(&bootstrap::BootstrapOptions {
                    gateway: key.to_string(),
                    node_id,
                    xds_addr,
                    transport,
                    envoy_admin_port,
                    tls_dir,
                })?
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Certs(cmd) => {
            match cmd {
                CertsCommand::Init {
                    dir,
                    server_names,
                    days,
                } => {
                    certs::init(&dir, &server_names, days)?;
                    println!("CA and xDS server certificate written to {}", dir.display());
                }
                CertsCommand::Issue {
                    gateway,
                    dir,
                    trust_domain,
                    identity,
                    days,
                } => {
                    let key = gateway_key(&gateway);
                    let (c, k) = certs::issue(
                        &dir,
                        &key.namespace,
                        &key.name,
                        &trust_domain,
                        identity.as_deref(),
                        days,
                    )?;
                    println!("{}\n{}", c.display(), k.display());
                }
                CertsCommand::Server {
                    dir,
                    server_names,
                    days,
                } => {
                    certs::server(&dir, &server_names, days)?;
                    println!("{}", dir.join(certs::SERVER).display());
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Get {
            what,
            args,
            output,
            admin_addr,
            admin_token_file,
            etcd,
            etcd_prefix,
            etcd_ca,
            etcd_cert,
            etcd_key,
        } if !etcd.is_empty() => {
            let kind = etcdctl::parse_kind(&what).map_err(anyhow::Error::msg)?;
            let output = <etcdctl::Output as clap::ValueEnum>::from_str(&output, true)
                .map_err(|e| anyhow::anyhow!("-o {output}: {e}"))?;
            anyhow::ensure!(args.len() <= 1, "with --etcd, give at most one NAME");
            let _ = (admin_addr, admin_token_file);
            let etcd = etcdctl::EtcdArgs {
                endpoints: etcd,
                etcd_prefix,
                etcd_ca,
                etcd_cert,
                etcd_key,
            };
            etcdctl::get(
                etcd,
                kind,
                args.first().map(|n| etcdctl::parse_name(n)),
                output,
            )
        }
        Command::Get {
            what,
            args,
            output,
            admin_addr,
            admin_token_file,
            ..
        } => {
            let resource = <get_cmd::Resource as clap::ValueEnum>::from_str(&what, true)
                .map_err(|e| anyhow::anyhow!("{what}: {e} (gateways, routes or backends)"))?;
            let output = <get_cmd::Output as clap::ValueEnum>::from_str(&output, true)
                .map_err(|e| anyhow::anyhow!("-o {output}: {e}"))?;
            let paths: Vec<PathBuf> = args.into_iter().map(PathBuf::from).collect();
            let status: serde_json::Value = if paths.is_empty() {
                let token = admin_token_file
                    .map(|f| admin::auth::read_token(&f))
                    .transpose()?;
                let body =
                    status_cmd::admin_get_with(admin_addr, "/debug/sources", token.as_deref())?;
                let v: serde_json::Value = serde_json::from_str(&body)?;
                v["status"].clone()
            } else {
                match ballast_sources::load_paths_report(&paths) {
                    Err(errors) => {
                        for e in &errors {
                            eprintln!("{e}");
                        }
                        anyhow::bail!("{} error(s)", errors.len());
                    }
                    Ok(loaded) => {
                        // Invalid objects are left out, as `serve` would at a cold start.
                        for e in &loaded.report.errors {
                            eprintln!("{e}");
                        }
                        serde_json::to_value(ballast_model::status::compute(&loaded.set))?
                    }
                }
            };
            print!("{}", get_cmd::render(&status, resource, output)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Register { args, etcd } => catalog::register_cmd(etcd, args),
        Command::Apply { paths, edit, etcd } => etcdctl::apply(etcd, edit, paths),
        Command::Diff { paths, etcd } => etcdctl::diff(etcd, paths),
        Command::Delete {
            kind,
            name,
            edit,
            etcd,
        } => etcdctl::delete(etcd, edit, kind, etcdctl::parse_name(&name)),
        Command::Status {
            admin_addr,
            json,
            admin_token_file,
        } => {
            let token = admin_token_file
                .map(|f| admin::auth::read_token(&f))
                .transpose()?;
            let body = status_cmd::admin_get_with(admin_addr, "/debug/proxies", token.as_deref())?;
            if json {
                print!("{body}");
            } else {
                let v: serde_json::Value = serde_json::from_str(&body)?;
                print!("{}", status_cmd::render(&v));
                // The guard's holds (a server without /debug/pipeline: none shown).
                if let Ok(p) =
                    status_cmd::admin_get_with(admin_addr, "/debug/pipeline", token.as_deref())
                    && let Ok(p) = serde_json::from_str::<serde_json::Value>(&p)
                {
                    print!("{}", status_cmd::render_guard(&p));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `serve --push-interval-ms`: 150 ms unless given; 0 turns pacing off.
    #[test]
    fn serve_paces_pushes_at_150ms_by_default() {
        let interval = |args: &[&str]| match Cli::try_parse_from(args).expect("parses").command {
            Command::Serve {
                push_interval_ms, ..
            } => push_interval_ms,
            _ => panic!("not serve"),
        };
        assert_eq!(interval(&["ballast", "serve"]), 150);
        assert_eq!(
            interval(&["ballast", "serve", "--push-interval-ms", "0"]),
            0
        );
        assert!(Cli::try_parse_from(["ballast", "serve", "--push-interval-ms", "-1"]).is_err());
    }

    #[test]
    fn dns_server_takes_ip_or_ip_port() {
        assert_eq!(dns_server("10.0.0.53"), Ok("10.0.0.53:53".parse().unwrap()));
        assert_eq!(
            dns_server("127.0.0.1:5353"),
            Ok("127.0.0.1:5353".parse().unwrap())
        );
        assert_eq!(dns_server("fd00::53"), Ok("[fd00::53]:53".parse().unwrap()));
        assert_eq!(dns_server("[::1]:5353"), Ok("[::1]:5353".parse().unwrap()));
        assert!(
            dns_server("dns.example")
                .unwrap_err()
                .contains("dns.example")
        );
    }
}
