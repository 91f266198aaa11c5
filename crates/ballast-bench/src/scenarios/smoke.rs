//! `--smoke`: a tiny fleet (5 proxies, 10 clusters, 2 s of churn) over SotW,
//! Delta and REST, checking correctness only — every client converges to the
//! expected config, no NACK, every change reaches every client — never timing.
//! `scripts/test` and `cargo test` run it so the tool keeps working. The CLI's `--smoke` also
//! runs tiny W3, W10 and etcd-churn against the real `ballast` binary (etcd: `$BALLAST_ETCD`).

use std::time::Duration;

use anyhow::{Result, bail};

use super::{FleetParams, churn, cold_start};
use crate::client::Protocol;
use crate::report::Report;
use crate::row;
use crate::server::ServerOptions;
use crate::workload::WorkloadSpec;

#[derive(Clone, Debug)]
pub struct SmokeOptions {
    pub server: ServerOptions,
    pub proxies: usize,
    pub clusters: usize,
    pub endpoints: usize,
    pub churn_rate: f64,
    pub churn_duration: Duration,
    pub protocols: Vec<Protocol>,
    /// Bound on each wait; generous, it is not a timing assertion.
    pub timeout: Duration,
    /// Also run a tiny W3 and W10 against the real `ballast` binary (found
    /// beside this executable or via `$BALLAST_BIN`), working under this directory.
    pub binary_out: Option<std::path::PathBuf>,
}

impl Default for SmokeOptions {
    fn default() -> Self {
        SmokeOptions {
            server: ServerOptions::default(),
            proxies: 5,
            clusters: 10,
            endpoints: 2,
            churn_rate: 20.0,
            churn_duration: Duration::from_secs(2),
            protocols: vec![Protocol::Sotw, Protocol::Delta, Protocol::Rest],
            timeout: Duration::from_secs(30),
            binary_out: None,
        }
    }
}

/// Runs W1 then W2 for each protocol; `Err` lists every failed check.
pub async fn run(opts: &SmokeOptions) -> Result<Report> {
    let spec = WorkloadSpec {
        clusters: opts.clusters,
        endpoints: opts.endpoints,
    };
    let mut report = Report::new(
        "smoke",
        serde_json::json!({
            "proxies": opts.proxies, "clusters": opts.clusters, "endpoints": opts.endpoints,
            "churn_rate": opts.churn_rate, "churn_s": opts.churn_duration.as_secs_f64(),
            "server_mode": opts.server.mode,
        }),
    );
    let mut failures = Vec::new();
    for &protocol in &opts.protocols {
        let params = FleetParams {
            rest_poll_ms: 100,
            ..FleetParams::new(opts.proxies, protocol)
        };
        let mut r = cold_start(&opts.server, &spec, &params, opts.timeout).await?;
        let mut fail = |what: String| failures.push(format!("{protocol}: {what}"));
        let c = &r.cold;
        if c.all_acked_s.is_none() {
            fail(format!(
                "cold start: {}/{} converged: {:?}",
                c.converged, opts.proxies, c.failures
            ));
        }
        if c.totals.nacks > 0 {
            fail(format!("cold start: {} NACKs", c.totals.nacks));
        }
        if c.totals.version_mismatches > 0 {
            fail(format!(
                "cold start: {} Delta versions are not the content hash",
                c.totals.version_mismatches
            ));
        }
        let cold_ok = c.all_acked_s.is_some();
        let cold_responses = c.totals.responses;
        let ch = if cold_ok {
            Some(
                churn(
                    &mut r,
                    opts.churn_rate,
                    opts.churn_duration,
                    opts.timeout,
                    7,
                )
                .await?,
            )
        } else {
            None
        };
        if let Some(ch) = &ch {
            if !ch.settled {
                fail(format!("churn: not converged: {:?}", ch.failures));
            }
            if ch.convergence.count != ch.expected_samples {
                fail(format!(
                    "churn: {} convergence samples, expected {} ({} changes × {} proxies)",
                    ch.convergence.count, ch.expected_samples, ch.changes, opts.proxies
                ));
            }
            if ch.totals.nacks > 0 || ch.totals.unmatched_versions > 0 {
                fail(format!(
                    "churn: {} NACKs, {} versions matching no published change",
                    ch.totals.nacks, ch.totals.unmatched_versions
                ));
            }
            if ch.totals.version_mismatches > 0 {
                fail(format!(
                    "churn: {} Delta versions are not the content hash",
                    ch.totals.version_mismatches
                ));
            }
        }
        // W5 in miniature: drop every stream, change, restore (streams only).
        let storm = if cold_ok && protocol != Protocol::Rest {
            let st = super::reconnect::storm_once(&mut r, 1, opts.timeout).await?;
            if !st.all {
                failures.push(format!(
                    "{protocol}: reconnect storm: {}/{} re-synced",
                    r.shared.converged(),
                    opts.proxies
                ));
            }
            Some(st.all)
        } else {
            None
        };
        report.rows.push(row!(
            "protocol" => protocol.to_string(),
            "cold_converged" => format!("{}/{}", r.cold.converged, opts.proxies),
            "cold_responses" => cold_responses,
            "cold_by_type" => format!("{:?}", r.cold.totals.responses_by_type),
            "changes" => ch.as_ref().map(|c| c.changes),
            "samples" => ch.as_ref().map(|c| c.convergence.count),
            "settled" => ch.as_ref().map(|c| c.settled),
            "nacks" => r.cold.totals.nacks + ch.as_ref().map_or(0, |c| c.totals.nacks),
            "resynced_after_storm" => storm,
        ));
        r.stop().await;
    }
    if let Some(out) = &opts.binary_out {
        binary_checks(out, opts, &mut report, &mut failures).await?;
    }
    if !failures.is_empty() {
        bail!("smoke failed:\n  {}", failures.join("\n  "));
    }
    Ok(report)
}

/// Value of `col` in a report's first row.
fn cell(report: &Report, col: &str) -> serde_json::Value {
    report
        .rows
        .first()
        .and_then(|r| r.iter().find(|(k, _)| k == col))
        .map(|(_, v)| v.clone())
        .unwrap_or(serde_json::Value::Null)
}

/// Tiny W3 (route edits reach every proxy) and W10 (a burst settles on one
/// version everywhere) against the real binary; correctness only.
async fn binary_checks(
    out: &std::path::Path,
    opts: &SmokeOptions,
    report: &mut Report,
    failures: &mut Vec<String>,
) -> Result<()> {
    use super::burst::{self, BurstArgs};
    use super::route_edit::{self, RouteEditArgs};
    let timeout_s = opts.timeout.as_secs();
    let w3 = route_edit::run(
        out,
        &RouteEditArgs {
            proxies: 2,
            routes: 50,
            clusters: 50,
            endpoints: 1,
            edits: 2,
            pause_ms: 50,
            protocols: vec![Protocol::Sotw, Protocol::Delta],
            runs: 1,
            rest_poll_ms: 100,
            timeout_s,
            no_vhds: false,
        },
    )
    .await?;
    for row in &w3.rows {
        let get = |c: &str| row.iter().find(|(k, _)| k == c).map(|(_, v)| v.clone());
        if get("converged_edits") != get("edits") || get("nacks") != Some(0.into()) {
            failures.push(format!("binary W3: {}", w3.markdown()));
        }
    }
    let w10 = burst::run(
        out,
        &BurstArgs {
            proxies: 2,
            clusters: 50,
            endpoints: 1,
            events: 50,
            burst_ms: 200,
            quiet_ms: 1200,
            protocols: vec![Protocol::Sotw],
            runs: 1,
            timeout_s,
        },
    )
    .await?;
    if cell(&w10, "converged_after_burst_ms").is_null() || cell(&w10, "nacks") != 0 {
        failures.push(format!("binary W10: {}", w10.markdown()));
    }
    report.notes.push(format!(
        "binary: W3 {} edits converged on {} protocols, W10 settled {} ms after the burst",
        w3.rows.len() * 2,
        w3.rows.len(),
        cell(&w10, "converged_after_burst_ms")
    ));
    etcd_checks(out, opts, report, failures).await
}

/// Tiny etcd churn (issue #12): `ballast serve --etcd`, 3 proxies per protocol, 20 puts in
/// 1 s; every change must reach every proxy. Needs etcd (`$BALLAST_ETCD`, as the e2e tests).
async fn etcd_checks(
    out: &std::path::Path,
    opts: &SmokeOptions,
    report: &mut Report,
    failures: &mut Vec<String>,
) -> Result<()> {
    use super::etcd_churn::{self, EtcdChurnArgs};
    let args = EtcdChurnArgs {
        proxies: 3,
        backends: 20,
        endpoints: 2,
        rate: 20.0,
        duration_s: 1,
        protocols: vec![Protocol::Sotw, Protocol::Delta],
        runs: 1,
        members: 1,
        timeout_s: opts.timeout.as_secs(),
        seed: 3,
        ballast_args: Vec::new(),
    };
    let mut done = Vec::new();
    for &protocol in &args.protocols {
        let c = etcd_churn::run_once(out, &args, protocol, args.seed).await?;
        for f in etcd_churn::correctness_failures(&c) {
            failures.push(format!("etcd churn {protocol}: {f}"));
        }
        done.push(format!(
            "{protocol} {} changes × {} proxies, {} lost",
            c.changes, args.proxies, c.undelivered.lost_changes
        ));
    }
    report
        .notes
        .push(format!("etcd churn: {}", done.join("; ")));
    Ok(())
}
