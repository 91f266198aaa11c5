//! Per-object last known good across a restart of the file source (invariant 8): objects that
//! turned invalid (or whose file no longer parses) while the previous run served them are
//! served from the state dir at the next start, reported as "restored from state"; objects
//! deleted on purpose, even while nothing ran, are not brought back.
//! Every wait is bounded; nothing asserts an upper bound on time.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ballast_model::ObjectKey;
use ballast_sources::{FileSource, FileSourceOptions, Source, SourceState};
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(20);

fn route(name: &str, host: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name} }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [{host}]
  rules:
  - backendRefs: [{{ group: ballast.dev, kind: Backend, name: web }}]
"
    )
}

const BACKEND: &str = "apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: { name: web }
spec:
  endpoints: [{ address: 127.0.0.1, port: 8080 }]
";

fn write(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
}

fn start(paths: Vec<PathBuf>, state: &Path) -> watch::Receiver<SourceState> {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("ballast_sources=debug")
        .try_init();
    let options = FileSourceOptions {
        quiet: Duration::from_millis(50),
        max_delay: Duration::from_millis(500),
        initial_delay: Duration::ZERO,
    };
    Box::new(FileSource::new(paths, options).with_last_good(state)).start()
}

async fn until(
    rx: &mut watch::Receiver<SourceState>,
    what: &str,
    pred: impl FnMut(&SourceState) -> bool,
) -> SourceState {
    let got = match tokio::time::timeout(WAIT, rx.wait_for(pred)).await {
        Ok(Ok(s)) => Some(s.clone()),
        Ok(Err(_)) => panic!("source stopped while waiting for {what}"),
        Err(_) => None,
    };
    got.unwrap_or_else(|| panic!("timed out waiting for {what}; state: {:#?}", *rx.borrow()))
}

fn host(s: &SourceState, name: &str) -> Option<String> {
    let r = s
        .config
        .as_ref()?
        .http_routes
        .get(&ObjectKey::new("default", name))?
        .clone();
    Some(r.spec.hostnames[0].value.clone())
}

fn errors(s: &SourceState) -> Vec<String> {
    s.last_error
        .as_ref()
        .map(|e| e.iter().map(|e| e.to_string()).collect())
        .unwrap_or_default()
}

/// The stored objects: (group file name, kind/namespace/name, text) of every entry the state
/// dir holds, its groups and its journal together.
fn stored_entries(state: &Path) -> Vec<(String, String, String)> {
    let dir = ballast_sources::last_good::dir_in(state);
    ballast_sources::last_good::stored_documents(&dir)
        .into_iter()
        .map(|d| {
            (
                ballast_sources::last_good::group_name(&d.file),
                format!("{}/{}/{}", d.kind, d.namespace, d.name),
                d.text,
            )
        })
        .collect()
}

/// Waits (bounded) until the state dir holds exactly `n` entries in `groups` groups (one per
/// source file with served objects).
async fn entries(state: &Path, n: usize, groups: usize) {
    let count = || {
        let stored = stored_entries(state);
        let files: std::collections::BTreeSet<&String> = stored.iter().map(|e| &e.0).collect();
        (stored.len(), files.len())
    };
    for _ in 0..400 {
        if count() == (n, groups) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the state dir holds (entries, groups) {:?}, not {:?}",
        count(),
        (n, groups)
    );
}

/// Waits (bounded) until the entry of `id` (`kind/namespace/name`) contains `text`.
async fn stored(state: &Path, id: &str, text: &str) {
    let found = || {
        stored_entries(state)
            .into_iter()
            .find(|(_, i, _)| i == id)
            .map(|(_, _, t)| t)
    };
    for _ in 0..400 {
        if found().is_some_and(|t| t.contains(text)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "no entry {id} with {text:?} in {}",
        ballast_sources::last_good::dir_in(state).display()
    );
}

#[tokio::test]
async fn invalid_objects_and_broken_files_survive_a_restart_deleted_ones_do_not() {
    let d = tempfile::tempdir().unwrap();
    let (cfg, state) = (d.path().join("cfg"), d.path().join("state"));
    fs::create_dir_all(&cfg).unwrap();
    write(&cfg.join("backend.yaml"), BACKEND);
    for i in 1..=6 {
        write(
            &cfg.join(format!("r{i}.yaml")),
            &route(&format!("r{i}"), &format!("r{i}.example.com")),
        );
    }
    write(
        &cfg.join("multi.yaml"),
        &format!(
            "{}---\n{}",
            route("m1", "m1.example.com"),
            route("m2", "m2.example.com")
        ),
    );
    let mut rx = start(vec![cfg.clone()], &state);
    let s = until(&mut rx, "initial sync", |s| s.synced).await;
    assert!(errors(&s).is_empty(), "{:?}", errors(&s));
    // 1 Backend + 6 + 2 routes, from 8 files.
    entries(&state, 9, 8).await;

    // r3 gets an invalid field, r5's file a YAML syntax error: both keep serving.
    write(
        &cfg.join("r3.yaml"),
        &route("r3", "r3-new.example.com").replace("rules:", "typo: 1\n  rules:"),
    );
    write(&cfg.join("r5.yaml"), "kind: [HTTPRoute\n");
    let s = until(&mut rx, "both errors", |s| errors(s).len() == 2).await;
    assert_eq!(host(&s, "r3").as_deref(), Some("r3.example.com"));
    assert_eq!(host(&s, "r5").as_deref(), Some("r5.example.com"));
    // Nothing served changed: the stored entries are still those of the good versions.
    drop(rx);

    // While down: r6 is deleted, m2 taken out of its file, and an entry is corrupted.
    fs::remove_file(cfg.join("r6.yaml")).unwrap();
    write(&cfg.join("multi.yaml"), &route("m1", "m1.example.com"));
    let junk = ballast_sources::last_good::dir_in(&state).join("HTTPRoute.x.json");
    write(&junk, "{\"format\": 1, \"kind\"");

    let mut rx = start(vec![cfg.clone()], &state);
    let s = until(&mut rx, "sync after the restart", |s| s.synced).await;
    assert_eq!(
        host(&s, "r3").as_deref(),
        Some("r3.example.com"),
        "restored"
    );
    assert_eq!(
        host(&s, "r5").as_deref(),
        Some("r5.example.com"),
        "restored"
    );
    for gone in ["r6", "m2"] {
        assert_eq!(host(&s, gone), None, "{gone} was deleted: not resurrected");
    }
    for kept in ["r1", "r2", "r4", "m1"] {
        assert!(host(&s, kept).is_some(), "{kept}");
    }
    // Reported as a live fallback is, plus "restored from state".
    let errs = errors(&s);
    assert_eq!(errs.len(), 4, "{errs:#?}");
    assert!(
        errs.iter()
            .any(|e| e.contains("r3.yaml:7:3: HTTPRoute default/r3: spec.typo: unknown field")),
        "{errs:#?}"
    );
    assert!(
        errs.iter()
            .any(|e| e.contains("r3.yaml:1:1: HTTPRoute default/r3: restored from state")),
        "{errs:#?}"
    );
    assert!(errs.iter().any(|e| e.contains("r5.yaml:1:1: restored from state: serving the last good version of 1 object of this file")), "{errs:#?}");
    let r3 = s
        .report
        .rejected
        .iter()
        .find(|r| r.id.key.name == "r3")
        .unwrap();
    assert!(r3.serving.as_ref().unwrap().file.ends_with("r3.yaml"));
    assert!(
        r3.errors
            .iter()
            .any(|e| e.message.starts_with("restored from state"))
    );
    assert_eq!(s.report.held_files.len(), 1);
    // The deleted objects' entries and the corrupt one are gone from the state.
    entries(&state, 7, 7).await;
    assert!(!junk.exists());

    // Fixing r3 applies the new version; r5 is still restored.
    write(&cfg.join("r3.yaml"), &route("r3", "r3-fixed.example.com"));
    let s = until(&mut rx, "r3 fixed", |s| {
        host(s, "r3").as_deref() == Some("r3-fixed.example.com")
    })
    .await;
    let errs = errors(&s);
    assert_eq!(errs.len(), 2, "{errs:#?}");
    assert!(errs.iter().all(|e| e.contains("r5.yaml")), "{errs:#?}");
    // Fixing r5 clears everything.
    write(&cfg.join("r5.yaml"), &route("r5", "r5.example.com"));
    let s = until(&mut rx, "r5 fixed", |s| s.last_error.is_none()).await;
    assert_eq!(host(&s, "r5").as_deref(), Some("r5.example.com"));
    drop(rx);

    // The fixed r3 is stored (within a second): breaking it while down restores the fixed
    // version.
    stored(&state, "HTTPRoute/default/r3", "r3-fixed.example.com").await;
    write(&cfg.join("r3.yaml"), "apiVersion: [\n");
    let mut rx = start(vec![cfg.clone()], &state);
    let s = until(&mut rx, "third sync", |s| s.synced).await;
    assert_eq!(host(&s, "r3").as_deref(), Some("r3-fixed.example.com"));
}

#[tokio::test]
async fn without_state_the_invalid_object_is_not_served() {
    // The control: the same restart without the state dir drops the object.
    let d = tempfile::tempdir().unwrap();
    let (cfg, state) = (d.path().join("cfg"), d.path().join("state"));
    fs::create_dir_all(&cfg).unwrap();
    write(&cfg.join("backend.yaml"), BACKEND);
    write(&cfg.join("r1.yaml"), &route("r1", "r1.example.com"));
    let mut rx = start(vec![cfg.clone()], &state);
    until(&mut rx, "sync", |s| s.synced).await;
    entries(&state, 2, 2).await;
    drop(rx);
    write(&cfg.join("r1.yaml"), "kind: [HTTPRoute\n");
    fs::remove_dir_all(&state).unwrap();
    let mut rx = start(vec![cfg.clone()], &state);
    let s = until(&mut rx, "sync", |s| s.synced).await;
    assert_eq!(host(&s, "r1"), None);
    assert!(errors(&s).iter().all(|e| !e.contains("restored")));
}

#[tokio::test]
async fn a_first_load_that_fails_whole_keeps_the_state_for_the_next() {
    // The restart finds a configured path missing (the load is rejected whole, nothing is
    // served); once it appears, the broken object is still restored.
    let d = tempfile::tempdir().unwrap();
    let (cfg, state) = (d.path().join("cfg"), d.path().join("state"));
    let extra = d.path().join("extra.yaml");
    fs::create_dir_all(&cfg).unwrap();
    write(&cfg.join("backend.yaml"), BACKEND);
    write(&cfg.join("r1.yaml"), &route("r1", "r1.example.com"));
    write(&extra, &route("x", "x.example.com"));
    let paths = vec![cfg.clone(), extra.clone()];
    let mut rx = start(paths.clone(), &state);
    until(&mut rx, "sync", |s| s.synced).await;
    entries(&state, 3, 3).await;
    drop(rx);
    write(&cfg.join("r1.yaml"), "kind: [HTTPRoute\n");
    fs::remove_file(&extra).unwrap();
    let mut rx = start(paths, &state);
    let s = until(&mut rx, "the missing path reported", |s| {
        errors(s).iter().any(|e| e.contains("extra.yaml"))
    })
    .await;
    assert!(!s.synced && s.config.is_none());
    write(&extra, &route("x", "x.example.com"));
    let s = until(&mut rx, "sync", |s| s.synced).await;
    assert_eq!(
        host(&s, "r1").as_deref(),
        Some("r1.example.com"),
        "restored"
    );
    assert_eq!(host(&s, "x").as_deref(), Some("x.example.com"));
}
