//! `ballast apply/get/delete/diff` against a real etcd (Debian etcd-server 3.4 through
//! `ballast_testkit::EtcdCluster`): the CLI contract of docs/operations.md.

use std::path::Path;
use std::process::Command;

use ballast_testkit::EtcdCluster;

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn ballast(etcd: &EtcdCluster, args: &[&str]) -> Out {
    let url = etcd.client_url(0);
    let out = Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args(args)
        .args(["--etcd", &url])
        .output()
        .expect("run ballast");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("$ ballast {}\n{stdout}{stderr}", args.join(" "));
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout,
        stderr,
    }
}

/// The `revision N` an apply or get printed.
fn revision(out: &Out) -> i64 {
    let at = out.stdout.rfind("revision ").expect("a revision") + "revision ".len();
    out.stdout[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn gateway() -> String {
    "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: gw\nspec:\n  gatewayClassName: ballast\n  listeners:\n  - name: http\n    port: 18080\n    protocol: HTTP\n".into()
}

fn backend(name: &str, port: u16) -> String {
    format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata:\n  name: {name}\nspec:\n  endpoints:\n  - address: 127.0.0.1\n    port: {port}\n"
    )
}

fn route(name: &str, backend: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: {name}\nspec:\n  parentRefs:\n  - name: gw\n  rules:\n  - matches:\n    - path:\n        type: PathPrefix\n        value: /{name}\n    backendRefs:\n    - group: ballast.dev\n      kind: Backend\n      name: {backend}\n"
    )
}

fn write(dir: &Path, name: &str, docs: &[String]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, docs.join("---\n")).unwrap();
    p.display().to_string()
}

#[tokio::test]
async fn apply_get_diff_delete_round_trip() {
    let etcd = EtcdCluster::start_single().await.unwrap();
    let d = tempfile::tempdir().unwrap();
    let base = write(
        d.path(),
        "base.yaml",
        &[gateway(), backend("b", 9001), route("r", "b")],
    );
    let out = ballast(&etcd, &["apply", "-f", &base]);
    assert_eq!(out.code, 0);
    assert!(out.stdout.contains("applied: 3 written"), "{}", out.stdout);
    let r1 = revision(&out);

    let out = ballast(&etcd, &["get", "backends"]);
    assert_eq!(out.code, 0);
    assert!(out.stdout.contains("default    b"), "{}", out.stdout);
    assert_eq!(revision(&out), r1);
    let out = ballast(&etcd, &["get", "backend", "b", "-o", "yaml"]);
    assert!(out.stdout.contains("port: 9001"), "{}", out.stdout);
    assert_eq!(ballast(&etcd, &["get", "backend", "nope"]).code, 1);

    // Applying the same files again writes nothing; the revision stays.
    let out = ballast(&etcd, &["apply", "-f", &base]);
    assert_eq!(out.code, 0);
    assert!(out.stdout.contains("unchanged: 3"), "{}", out.stdout);
    assert_eq!(revision(&out), r1);

    // diff: the Envoy resources that change, per gateway; exit 1 when there are some.
    let edit = write(
        d.path(),
        "edit.yaml",
        &[backend("b", 9002), backend("c", 9003), route("r2", "c")],
    );
    let out = ballast(&etcd, &["diff", "-f", &edit]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    for line in [
        "gateway default/gw: 2 added, 2 modified, 0 removed",
        "+ CDS default/c",
        "+ EDS default/c",
        "~ EDS default/b",
        "~ RDS ",
    ] {
        assert!(out.stdout.contains(line), "{line:?} in\n{}", out.stdout);
    }
    let out = ballast(&etcd, &["diff", "-f", &base]);
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert!(out.stdout.contains("no Envoy resource changes"));
    // diff wrote nothing.
    assert_eq!(revision(&ballast(&etcd, &["get", "gateways"])), r1);

    let out = ballast(&etcd, &["apply", "-f", &edit]);
    assert_eq!(out.code, 0);
    assert!(
        out.stdout
            .contains("applied: 3 written, 0 deleted, 0 unchanged"),
        "{}",
        out.stdout
    );
    let out = ballast(&etcd, &["get", "routes"]);
    assert!(out.stdout.contains(" r2 "), "{}", out.stdout);

    let out = ballast(&etcd, &["delete", "route", "r2"]);
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert!(out.stdout.contains("- CDS default/c"), "{}", out.stdout);
    assert!(!ballast(&etcd, &["get", "routes"]).stdout.contains(" r2 "));
    assert_eq!(ballast(&etcd, &["delete", "route", "r2"]).code, 1);
}

#[tokio::test]
async fn stale_expect_revision_is_a_conflict_and_writes_nothing() {
    let etcd = EtcdCluster::start_single().await.unwrap();
    let d = tempfile::tempdir().unwrap();
    let base = write(d.path(), "base.yaml", &[gateway(), backend("b", 9001)]);
    let r1 = revision(&ballast(&etcd, &["apply", "-f", &base]));

    // Alice read at r1; Bob changes b meanwhile.
    let bob = write(d.path(), "bob.yaml", &[backend("b", 9002)]);
    let r2 = revision(&ballast(&etcd, &["apply", "-f", &bob]));
    assert!(r2 > r1);

    let alice = write(d.path(), "alice.yaml", &[backend("b", 9003)]);
    let r1s = r1.to_string();
    let out = ballast(&etcd, &["apply", "-f", &alice, "--expect-revision", &r1s]);
    assert_eq!(out.code, 3, "{}", out.stdout);
    assert!(out.stdout.contains("conflict"), "{}", out.stdout);
    let got = ballast(&etcd, &["get", "backend", "b", "-o", "yaml"]);
    assert!(got.stdout.contains("port: 9002"), "Bob's write stays");
    assert_eq!(revision(&got), r2, "nothing written");

    // A deletion after the expected revision is a conflict too (a new object is not the
    // only change that counts).
    let extra = write(d.path(), "extra.yaml", &[backend("x", 9009)]);
    let r3 = revision(&ballast(&etcd, &["apply", "-f", &extra]));
    assert_eq!(ballast(&etcd, &["delete", "backend", "x"]).code, 0);
    let r3s = r3.to_string();
    let out = ballast(&etcd, &["apply", "-f", &alice, "--expect-revision", &r3s]);
    assert_eq!(out.code, 3, "{}", out.stdout);

    // With the current revision it applies.
    let now = revision(&ballast(&etcd, &["get", "backends"])).to_string();
    let out = ballast(&etcd, &["apply", "-f", &alice, "--expect-revision", &now]);
    assert_eq!(out.code, 0, "{}", out.stdout);
}

#[tokio::test]
async fn a_big_removal_needs_force() {
    let etcd = EtcdCluster::start_single().await.unwrap();
    let d = tempfile::tempdir().unwrap();
    let base = write(
        d.path(),
        "base.yaml",
        &[
            gateway(),
            backend("b", 9001),
            route("r1", "b"),
            route("r2", "b"),
            route("r3", "b"),
        ],
    );
    let r1 = revision(&ballast(&etcd, &["apply", "-f", &base]));
    // One route of three: within the share.
    assert_eq!(ballast(&etcd, &["delete", "route", "r3"]).code, 0);
    // The Gateway: everything goes.
    let out = ballast(&etcd, &["delete", "gateway", "gw"]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        out.stdout.contains("refused: gateway default/gw"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("--force"), "{}", out.stdout);
    let out = ballast(&etcd, &["get", "gateways"]);
    assert!(out.stdout.contains(" gw "), "still there:\n{}", out.stdout);
    assert_eq!(
        revision(&out),
        r1 + 1,
        "only the route deletion was written"
    );
    let out = ballast(&etcd, &["delete", "gateway", "gw", "--force"]);
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert!(!ballast(&etcd, &["get", "gateways"]).stdout.contains(" gw "));
}

#[tokio::test]
async fn an_invalid_object_is_refused_with_file_line_col() {
    let etcd = EtcdCluster::start_single().await.unwrap();
    let d = tempfile::tempdir().unwrap();
    let base = write(d.path(), "base.yaml", &[gateway(), backend("b", 9001)]);
    let r1 = revision(&ballast(&etcd, &["apply", "-f", &base]));
    let bad = write(
        d.path(),
        "bad.yaml",
        &[
            backend("c", 9002),
            backend("b", 9003).replace("9003", "nope"),
        ],
    );
    let out = ballast(&etcd, &["apply", "-f", &bad]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    // The second document starts at line 10; its port is on line 17.
    assert!(
        out.stdout.contains(&format!("{bad}:17:")),
        "position in\n{}",
        out.stdout
    );
    assert!(out.stdout.contains("nothing written"));
    // All or nothing: the valid object of the same apply was not written either.
    let out = ballast(&etcd, &["get", "backends"]);
    assert!(!out.stdout.contains(" c "), "{}", out.stdout);
    assert_eq!(revision(&out), r1);
    // diff refuses it the same way.
    assert_eq!(ballast(&etcd, &["diff", "-f", &bad]).code, 2);
}

/// Issue #12: `ballast apply` of 400 objects against etcd's default `--max-txn-ops` (128). It
/// used to fail ("too many operations in txn request"); now it is written in several
/// transactions and stays all or nothing for readers: a replica's etcd source publishes the
/// whole apply as one new config (one generation), never a part of it.
#[tokio::test]
async fn an_apply_over_the_txn_limit_reaches_readers_at_once() {
    use ballast_sources::{EtcdSource, EtcdSourceOptions, Source};
    let etcd = EtcdCluster::start_single().await.unwrap();
    let d = tempfile::tempdir().unwrap();
    let base = write(d.path(), "base.yaml", &[gateway()]);
    assert_eq!(ballast(&etcd, &["apply", "-f", &base]).code, 0);
    let mut rx =
        Box::new(EtcdSource::new(EtcdSourceOptions::new(etcd.client_urls(), "/ballast/")).unwrap())
            .start();
    let t = std::time::Duration::from_secs(60);
    let s = tokio::time::timeout(t, rx.wait_for(|s| s.synced))
        .await
        .unwrap()
        .unwrap()
        .clone();
    let generation = s.generation;

    let mut docs = Vec::new();
    for i in 0..200 {
        docs.push(backend(&format!("b{i}"), 9000 + i as u16));
        docs.push(route(&format!("r{i}"), &format!("b{i}")));
    }
    let big = write(d.path(), "big.yaml", &docs);
    let out = ballast(&etcd, &["apply", "-f", &big]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("applied: 400 written, 0 deleted"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("written in 5 transactions"),
        "{}",
        out.stdout
    );
    let applied = revision(&out);
    let s = tokio::time::timeout(t, rx.wait_for(|s| s.revision == Some(applied)))
        .await
        .unwrap()
        .unwrap()
        .clone();
    assert_eq!(s.config.as_ref().unwrap().len(), 401);
    assert_eq!(
        s.generation,
        generation + 1,
        "the whole apply is one new config"
    );
    assert!(s.held_apply.is_none());

    // Told etcd allows more than it does: etcd's refusal names the flag.
    let docs: Vec<String> = (0..200)
        .map(|i| backend(&format!("b{i}"), 10000 + i as u16))
        .collect();
    let more = write(d.path(), "more.yaml", &docs);
    let out = ballast(&etcd, &["apply", "-f", &more, "--max-txn-ops", "1000"]);
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("too many operations") && out.stderr.contains("--max-txn-ops"),
        "{}",
        out.stderr
    );
    assert_eq!(
        rx.borrow().generation,
        generation + 1,
        "a refused apply changes nothing"
    );
}
