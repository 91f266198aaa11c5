//! `ballast apply`, `get`, `delete` and `diff` against etcd (the store `ballast serve --etcd`
//! replicas read).
//!
//! An edit is checked before anything is written, with the same rules as `ballast validate`
//! (every error with file:line:col) and the same blast-radius share as the serving guard, on the
//! whole config it would produce (the store's objects plus the edit). It is then written in one
//! etcd transaction, guarded so that it applies only if no config key changed since the revision
//! the check read (or `--expect-revision`): two people editing at once cannot overwrite each
//! other's change unseen, and the check is never about a config other than the one written.

pub mod plan;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use ballast_etcd::{Client, ClientOptions, Compare, CompareOp, KeyRange, Op, Txn};
use ballast_model::{Kind, ObjectKey};
use ballast_sources::etcd_keys;

use plan::StoreEntry;

/// Exit status of an edit refused because the store changed after the revision it was based on.
pub const EXIT_CONFLICT: u8 = 3;

/// How to reach etcd (shared by every etcd subcommand).
#[derive(clap::Args, Clone, Debug)]
pub struct EtcdArgs {
    /// etcd endpoint (`http://host:port`, or `https://` with --etcd-ca). Repeatable: the client
    /// fails over between members.
    #[arg(long = "etcd", value_name = "URL", required = true)]
    pub endpoints: Vec<String>,
    /// Key prefix of Ballast's objects in etcd.
    #[arg(long, default_value = etcd_keys::DEFAULT_PREFIX)]
    pub etcd_prefix: String,
    /// CA bundle for https:// endpoints.
    #[arg(long, value_name = "FILE")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate for etcd (with --etcd-key).
    #[arg(long, value_name = "FILE")]
    pub etcd_cert: Option<PathBuf>,
    #[arg(long, value_name = "FILE")]
    pub etcd_key: Option<PathBuf>,
}

impl EtcdArgs {
    pub fn client(&self) -> anyhow::Result<Client> {
        let mut opts = ClientOptions::default();
        if let Some(ca) = &self.etcd_ca {
            opts.tls = Some(ballast_etcd::TlsOptions::from_files(
                ca,
                self.etcd_cert.as_deref(),
                self.etcd_key.as_deref(),
            )?);
        }
        Ok(Client::new(&self.endpoints, opts)?)
    }
}

/// The guard flags of an edit.
#[derive(clap::Args, Clone, Debug)]
pub struct EditArgs {
    /// Write even if the change removes more than the guard's share of a gateway's listeners,
    /// routes or clusters (or deletes a Gateway).
    #[arg(long)]
    pub force: bool,
    /// Apply only if no config object changed after this store revision (as printed by
    /// `ballast get`); default: the revision this command read.
    #[arg(long, value_name = "N")]
    pub expect_revision: Option<i64>,
    /// The share checked before writing; use the replicas' `--guard-max-removal`.
    #[arg(long, default_value = "0.5", value_parser = crate::share)]
    pub guard_max_removal: f64,
    /// etcd's --max-txn-ops (operations per transaction). A larger change is written in
    /// several transactions that replicas apply all at once, on the last one's commit. At
    /// least 16: etcd counts the guard's compares (one per kind, and two markers) too.
    #[arg(long, default_value = "128", value_parser = clap::value_parser!(u32).range(16..))]
    pub max_txn_ops: u32,
}

/// `get` output formats.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Output {
    Table,
    Yaml,
}

/// A kind as typed on the command line: `gateway`, `gateways`, `HTTPRoute`, `routes`, ...
pub fn parse_kind(s: &str) -> Result<Kind, String> {
    let l = s.to_ascii_lowercase();
    let l = l.strip_suffix('s').unwrap_or(&l);
    match l {
        "gateway" | "gw" => Ok(Kind::Gateway),
        "httproute" | "route" => Ok(Kind::HttpRoute),
        "backend" => Ok(Kind::Backend),
        "secret" => Ok(Kind::Secret),
        other => Kind::ALL
            .into_iter()
            .find(|k| {
                let seg = ballast_sources::etcd_keys::kind_segment(*k);
                k.as_str().eq_ignore_ascii_case(other) || seg == s.to_ascii_lowercase()
            })
            .ok_or_else(|| {
                format!("unknown kind {s:?} (gateway, httproute, backend, secret, service, ...)")
            }),
    }
}

/// `namespace/name` or `name` (namespace `default`).
pub fn parse_name(s: &str) -> ObjectKey {
    crate::gateway_key(s)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Every config key under the prefix at one revision (all kinds pinned to the revision of the
/// first listing), and that revision.
pub async fn read_store(client: &Client, prefix: &str) -> anyhow::Result<(i64, Vec<StoreEntry>)> {
    let mut revision = 0;
    let mut out = Vec::new();
    for kind in Kind::ALL {
        let range = KeyRange::prefix(etcd_keys::kind_prefix(prefix, kind));
        let listing = client.list(&range, revision, 500).await.with_context(|| {
            format!("reading {} from etcd", etcd_keys::kind_prefix(prefix, kind))
        })?;
        revision = listing.revision;
        out.extend(listing.kvs.into_iter().map(|kv| StoreEntry {
            key: String::from_utf8_lossy(&kv.key).into_owned(),
            value: String::from_utf8_lossy(&kv.value).into_owned(),
            mod_revision: kv.mod_revision,
        }));
    }
    Ok((revision, out))
}

/// The transaction guard: no config key (of any kind) was created or modified after `base`, and
/// no `ballast apply/delete` ran after it (the marker key also catches deletions).
fn unchanged_since(prefix: &str, base: i64) -> Vec<Compare> {
    let mut out: Vec<Compare> = Kind::ALL
        .into_iter()
        .map(|k| {
            let p = etcd_keys::kind_prefix(prefix, k);
            let mut c = Compare::mod_revision(p.clone(), CompareOp::Less, base + 1);
            c.0.range_end = ballast_etcd::prefix_end(p.as_bytes());
            c
        })
        .collect();
    out.push(Compare::mod_revision(
        etcd_keys::config_marker_key(prefix),
        CompareOp::Less,
        base + 1,
    ));
    // And no apply of several transactions is open.
    out.push(Compare::version(
        etcd_keys::apply_marker_key(prefix),
        CompareOp::Equal,
        0,
    ));
    out
}

/// Checks and writes a plan; prints what happened. Shared by `apply` and `delete`.
async fn commit(
    client: &Client,
    etcd: &EtcdArgs,
    edit: &EditArgs,
    revision: i64,
    plan: plan::Plan,
) -> anyhow::Result<ExitCode> {
    for e in &plan.store_errors {
        println!("warning: invalid object in the store (not served): {e}");
    }
    let (changes, errors) = plan::translate_both(&plan);
    if !errors.is_empty() {
        for e in &errors {
            println!("{e}");
        }
        println!("{} error(s); nothing written", errors.len());
        return Ok(ExitCode::from(1));
    }
    for p in ballast_model::status::compute(&plan.new).problems() {
        println!("warning: {p}");
    }
    let violations = plan::guard_violations(&changes, edit.guard_max_removal);
    if !violations.is_empty() && !edit.force {
        for v in &violations {
            println!("refused: {v}");
        }
        println!(
            "nothing written: the change removes more than {:.0}% of a gateway's resources; run again with --force if that is intended",
            100.0 * edit.guard_max_removal
        );
        return Ok(ExitCode::from(1));
    }
    print!("{}", plan::render_diff(&plan::resource_diff(&changes)));
    if plan.is_empty() {
        println!(
            "unchanged: {} object(s) already as given; revision {revision}",
            plan.unchanged
        );
        return Ok(ExitCode::SUCCESS);
    }
    let base = edit.expect_revision.unwrap_or(revision);
    let prefix = &etcd.etcd_prefix;
    let mut ops: Vec<Op> = plan
        .puts
        .iter()
        .map(|(k, v)| Op::put(k.as_bytes(), v.as_bytes()))
        .collect();
    ops.extend(
        plan.deletes
            .iter()
            .map(|k| Op::delete(KeyRange::key(k.as_bytes()))),
    );
    let max = edit.max_txn_ops as usize;
    let result = if ops.len() < max {
        ops.push(Op::put(etcd_keys::config_marker_key(prefix), Vec::new()));
        let txn = Txn::new().when(unchanged_since(prefix, base)).and_then(ops);
        Some(client.txn(txn).await.map_err(too_many)?)
    } else {
        commit_in_parts(client, prefix, base, ops, max).await?
    };
    let Some(result) = result else {
        return Ok(ExitCode::from(1));
    };
    if !result.succeeded {
        println!(
            "conflict: config in etcd changed after revision {base}; nothing written. Read it again (ballast get, ballast diff) and retry"
        );
        return Ok(ExitCode::from(EXIT_CONFLICT));
    }
    println!(
        "applied: {} written, {} deleted, {} unchanged; revision {}",
        plan.puts.len(),
        plan.deletes.len(),
        plan.unchanged,
        result.revision
    );
    Ok(ExitCode::SUCCESS)
}

/// A write error, with the limit named when etcd refused the transaction's size.
fn too_many(e: ballast_etcd::Error) -> anyhow::Error {
    let hint = if e.to_string().contains("too many operations") {
        " (etcd's --max-txn-ops bounds the operations of one transaction: pass the same value to \
         `ballast apply --max-txn-ops`)"
    } else {
        ""
    };
    anyhow::anyhow!("writing to etcd: {e}{hint}")
}

/// Writes `ops` (more than one transaction may hold) all or nothing for readers: the first
/// transaction (guarded like a single one) opens the apply by creating the apply marker, bound
/// to a lease; the middle ones write parts while the marker is still this apply's; the last
/// deletes it and touches the config marker, which is the commit replicas wait for
/// (`ballast_sources::etcd` module docs). `None` when it gave up midway (said why): the
/// marker is revoked and replicas keep serving the config of before until the next apply.
async fn commit_in_parts(
    client: &Client,
    prefix: &str,
    base: i64,
    ops: Vec<Op>,
    max: usize,
) -> anyhow::Result<Option<ballast_etcd::TxnResult>> {
    let marker = etcd_keys::apply_marker_key(prefix);
    let config = etcd_keys::config_marker_key(prefix);
    // If this process dies, the marker goes with the lease and replicas stop waiting for a
    // commit (they hold until the next apply commits).
    let lease = client
        .lease_grant(60)
        .await
        .context("granting the apply's lease")?;
    let mut keep = client.lease_keep_alive(lease.id).await?;
    let mut rest = ops.into_iter();
    let first: Vec<Op> = rest.by_ref().take(max - 2).collect();
    let parts: Vec<Vec<Op>> = {
        let rest: Vec<Op> = rest.collect();
        rest.chunks(max).map(|c| c.to_vec()).collect()
    };
    let total = parts.len() + 2;
    let doc = serde_json::json!({
        "pid": std::process::id(),
        "base": base,
        "transactions": total,
    })
    .to_string();
    let mut open = vec![
        Op::put_with_lease(marker.clone(), doc, lease.id),
        Op::put(config.clone(), Vec::new()),
    ];
    open.extend(first);
    let r = client
        .txn(
            Txn::new()
                .when(unchanged_since(prefix, base))
                .and_then(open),
        )
        .await
        .map_err(too_many)?;
    if !r.succeeded {
        let _ = client.lease_revoke(lease.id).await;
        return Ok(Some(r));
    }
    let opened = r.revision;
    let ours = || Compare::create_revision(marker.clone(), CompareOp::Equal, opened);
    let give_up = |done: usize, why: String| async move {
        let _ = client.lease_revoke(lease.id).await;
        println!(
            "aborted after {done} of {total} transactions: {why}. Replicas keep serving the config of \
             before this apply (the written part is held) until the next apply or delete commits; run it again"
        );
        Ok(None)
    };
    for (i, part) in parts.into_iter().enumerate() {
        if keep.keep_alive().await.is_err() {
            return give_up(i + 1, "the apply's lease was lost".into()).await;
        }
        match client.txn(Txn::new().when([ours()]).and_then(part)).await {
            Ok(r) if r.succeeded => {}
            Ok(_) => return give_up(i + 1, "the apply marker was removed".into()).await,
            Err(e) => return give_up(i + 1, too_many(e).to_string()).await,
        }
    }
    let commit = Txn::new().when([ours()]).and_then([
        Op::delete(KeyRange::key(marker.clone())),
        Op::put(config, Vec::new()),
    ]);
    match client.txn(commit).await {
        Ok(r) if r.succeeded => {
            println!(
                "(written in {total} transactions of at most {max} operations, committed at once)"
            );
            Ok(Some(r))
        }
        Ok(_) => give_up(total - 1, "the apply marker was removed".into()).await,
        Err(e) => give_up(total - 1, too_many(e).to_string()).await,
    }
}

fn print_config_errors(errors: &[ballast_model::ConfigError]) {
    for e in errors {
        println!("{e}");
    }
    println!("{} error(s); nothing written", errors.len());
}

/// `ballast apply -f PATH...`.
pub fn apply(etcd: EtcdArgs, edit: EditArgs, paths: Vec<PathBuf>) -> anyhow::Result<ExitCode> {
    let docs = match plan::read_docs(&paths) {
        Ok(d) => d,
        Err(errors) => {
            print_config_errors(&errors);
            return Ok(ExitCode::from(1));
        }
    };
    for w in &docs.warnings {
        println!("warning: {w}");
    }
    runtime()?.block_on(async {
        let client = etcd.client()?;
        let (revision, entries) = read_store(&client, &etcd.etcd_prefix).await?;
        let plan = plan::plan_apply(&etcd.etcd_prefix, &entries, &docs);
        commit(&client, &etcd, &edit, revision, plan).await
    })
}

/// `ballast delete KIND NAME`.
pub fn delete(
    etcd: EtcdArgs,
    edit: EditArgs,
    kind: Kind,
    name: ObjectKey,
) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let client = etcd.client()?;
        let (revision, entries) = read_store(&client, &etcd.etcd_prefix).await?;
        match plan::plan_delete(&etcd.etcd_prefix, &entries, kind, &name) {
            None => {
                println!("no {kind} {name} in etcd (revision {revision})");
                Ok(ExitCode::from(1))
            }
            Some(plan) => commit(&client, &etcd, &edit, revision, plan).await,
        }
    })
}

/// `ballast diff -f PATH...`: exit 0 if nothing would change in Envoy, 1 if something would, 2
/// on errors (as `diff` and `kubectl diff`).
pub fn diff(etcd: EtcdArgs, paths: Vec<PathBuf>) -> anyhow::Result<ExitCode> {
    let docs = match plan::read_docs(&paths) {
        Ok(d) => d,
        Err(errors) => {
            for e in &errors {
                println!("{e}");
            }
            println!("{} error(s)", errors.len());
            return Ok(ExitCode::from(2));
        }
    };
    runtime()?.block_on(async {
        let client = etcd.client()?;
        let (revision, entries) = read_store(&client, &etcd.etcd_prefix).await?;
        let plan = plan::plan_apply(&etcd.etcd_prefix, &entries, &docs);
        let (changes, errors) = plan::translate_both(&plan);
        for e in &errors {
            println!("{e}");
        }
        let diffs = plan::resource_diff(&changes);
        print!("{}", plan::render_diff(&diffs));
        println!("against revision {revision}");
        Ok(if !errors.is_empty() {
            ExitCode::from(2)
        } else if diffs.iter().all(|(_, d)| d.is_empty()) {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    })
}

/// `ballast get KIND [NAME]`.
pub fn get(
    etcd: EtcdArgs,
    kind: Kind,
    name: Option<ObjectKey>,
    output: Output,
) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let client = etcd.client()?;
        let (revision, entries) = read_store(&client, &etcd.etcd_prefix).await?;
        let (_, errors) = plan::store_config(&entries);
        let wanted: Vec<&StoreEntry> = entries
            .iter()
            .filter(
                |e| match etcd_keys::parse_object_key(&etcd.etcd_prefix, &e.key) {
                    Some((k, key)) => k == kind && name.as_ref().is_none_or(|n| *n == key),
                    None => false,
                },
            )
            .collect();
        if let Some(n) = &name
            && wanted.is_empty()
        {
            println!("no {kind} {n} in etcd (revision {revision})");
            return Ok(ExitCode::from(1));
        }
        match output {
            Output::Yaml => {
                println!("# revision {revision}");
                for e in wanted {
                    let text = e.value.trim_start_matches("---\n");
                    print!("---\n{text}");
                    if !text.ends_with('\n') {
                        println!();
                    }
                }
            }
            Output::Table => {
                let mut rows = vec![[
                    "NAMESPACE".to_string(),
                    "NAME".into(),
                    "MOD_REVISION".into(),
                    "VALID".into(),
                ]];
                for e in wanted {
                    let (_, key) = etcd_keys::parse_object_key(&etcd.etcd_prefix, &e.key)
                        .expect("filtered above");
                    let name = plan::source_name(&e.key);
                    let error = errors.iter().find(|x| *x.file == *name);
                    rows.push([
                        key.namespace,
                        key.name,
                        e.mod_revision.to_string(),
                        error.map_or("yes".into(), |x| format!("no: {x}")),
                    ]);
                }
                let widths: Vec<usize> = (0..3)
                    .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
                    .collect();
                for r in &rows {
                    println!(
                        "{:w0$}  {:w1$}  {:w2$}  {}",
                        r[0],
                        r[1],
                        r[2],
                        r[3],
                        w0 = widths[0],
                        w1 = widths[1],
                        w2 = widths[2]
                    );
                }
                println!("revision {revision}");
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_as_typed() {
        for (s, k) in [
            ("gateways", Kind::Gateway),
            ("HTTPRoute", Kind::HttpRoute),
            ("routes", Kind::HttpRoute),
            ("backend", Kind::Backend),
            ("Secrets", Kind::Secret),
        ] {
            assert_eq!(parse_kind(s), Ok(k), "{s}");
        }
        assert!(parse_kind("pods").is_err());
    }
}
