//! End-to-end tests of the file source against a real filesystem and real notify watches.
//! Every wait is bounded; nothing asserts an upper bound on time.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ballast_model::set::BackendRefResolution;
use ballast_model::{ConfigSet, ObjectKey};
use ballast_sources::{FileSource, FileSourceOptions, Source, SourceState, load_paths};
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(20);

const GATEWAY: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: { name: edge }
spec:
  gatewayClassName: ballast
  listeners:
  - { name: http, port: 10000, protocol: HTTP }
";

fn backend(name: &str, port: u16) -> String {
    format!(
        "apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: {name} }}
spec:
  endpoints: [{{ address: 127.0.0.1, port: {port} }}]
"
    )
}

fn route(name: &str, backend: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name} }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [{name}.example.com]
  rules:
  - backendRefs: [{{ group: ballast.dev, kind: Backend, name: {backend} }}]
"
    )
}

fn write(path: &Path, text: &str) {
    if let Some(p) = path.parent() {
        fs::create_dir_all(p).unwrap();
    }
    fs::write(path, text).unwrap();
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new("default", name)
}

fn port_of(s: &SourceState, name: &str) -> Option<u32> {
    let b = s.config.as_ref()?.backends.get(&key(name))?.clone();
    Some(b.spec.endpoints[0].port.value)
}

fn fast() -> FileSourceOptions {
    FileSourceOptions {
        quiet: Duration::from_millis(50),
        max_delay: Duration::from_millis(500),
        initial_delay: Duration::ZERO,
    }
}

fn start(paths: Vec<PathBuf>, options: FileSourceOptions) -> watch::Receiver<SourceState> {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("ballast_sources=debug")
        .try_init();
    Box::new(FileSource::new(paths, options)).start()
}

/// Waits (bounded) until `pred` holds for the published state and returns that state.
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

fn errors(s: &SourceState) -> Vec<String> {
    s.last_error
        .as_ref()
        .map(|e| e.iter().map(|e| e.to_string()).collect())
        .unwrap_or_default()
}

/// A directory of the three kinds, with files that must be ignored beside them.
fn three_files(root: &Path) {
    write(&root.join("gateway.yaml"), GATEWAY);
    write(&root.join("routes/web.yaml"), &route("web", "web"));
    write(&root.join("backends/web.yml"), &backend("web", 8080));
    write(&root.join("notes.txt"), "not: [yaml");
    write(&root.join(".hidden.yaml"), "not: [yaml");
    write(&root.join("backends/web.yml~"), "not: [yaml");
    write(&root.join("backends/.web.yml.swp"), "not: [yaml");
}

#[tokio::test]
async fn initial_load_of_a_directory_tree() {
    let d = tempfile::tempdir().unwrap();
    three_files(d.path());
    let mut rx = start(vec![d.path().to_path_buf()], fast());
    let s = until(&mut rx, "initial sync", |s| s.synced).await;
    assert_eq!(errors(&s), Vec::<String>::new());
    assert_eq!((s.generation, s.files), (1, 3));
    let c = s.config.unwrap();
    assert_eq!(
        (c.gateways.len(), c.http_routes.len(), c.backends.len()),
        (1, 1, 1)
    );
    assert!(s.last_success.is_some() && s.last_attempt.is_some());
    assert!(s.name.starts_with("file:"));
}

#[tokio::test]
async fn edit_applies() {
    let d = tempfile::tempdir().unwrap();
    three_files(d.path());
    let mut rx = start(vec![d.path().to_path_buf()], fast());
    until(&mut rx, "initial sync", |s| s.synced).await;
    write(&d.path().join("backends/web.yml"), &backend("web", 9090));
    let s = until(&mut rx, "edited port", |s| port_of(s, "web") == Some(9090)).await;
    assert_eq!(s.generation, 2);
}

#[tokio::test]
async fn broken_file_keeps_last_good_and_fix_applies() {
    let d = tempfile::tempdir().unwrap();
    three_files(d.path());
    let mut rx = start(vec![d.path().to_path_buf()], fast());
    let good = until(&mut rx, "initial sync", |s| s.synced).await;

    // A bad port in one file and a syntax error in another, written together: both reported.
    let backend_file = d.path().join("backends/web.yml");
    write(&backend_file, &backend("web", 0));
    let gw_file = d.path().join("gateway.yaml");
    write(&gw_file, "kind: [\n");
    let bad = until(&mut rx, "rejection", |s| s.last_error.is_some()).await;
    let errs = errors(&bad);
    assert!(
        errs.iter().any(|e| e.starts_with(&format!(
            "{}:5:43: Backend default/web: spec.endpoints[0].port:",
            backend_file.display()
        ))),
        "{errs:#?}"
    );
    assert!(
        errs.iter()
            .any(|e| e.starts_with(&format!("{}:", gw_file.display()))),
        "{errs:#?}"
    );
    // Last known good: same config object, same generation, still synced.
    assert_eq!(bad.generation, good.generation);
    assert!(Arc::ptr_eq(
        bad.config.as_ref().unwrap(),
        good.config.as_ref().unwrap()
    ));
    assert!(bad.synced);
    assert_eq!(port_of(&bad, "web"), Some(8080));

    write(&gw_file, GATEWAY);
    write(&backend_file, &backend("web", 8081));
    let fixed = until(&mut rx, "fix", |s| port_of(s, "web") == Some(8081)).await;
    assert!(fixed.last_error.is_none());
    assert_eq!(fixed.generation, good.generation + 1);
}

/// A route and its backend renamed across two files: with only one of them changed the config
/// would be valid but inconsistent (the route's backendRef unresolved, its rule answering 500).
/// Written together, they must be published as one generation; the half state never.
#[tokio::test]
async fn files_changed_together_apply_together() {
    let d = tempfile::tempdir().unwrap();
    let routes = d.path().join("routes.yaml");
    let backends = d.path().join("backends.yaml");
    write(&d.path().join("gateway.yaml"), GATEWAY);
    write(&routes, &route("web", "old"));
    write(&backends, &backend("old", 8080));
    // The two files are written 100 ms apart, as a person or a slow tool would; a quiet period
    // of 1 s keeps them in one burst even on a slow shared machine. Without the debounce
    // (quiet = 0) the first write is reloaded alone and the half state is published as its own
    // generation, which fails this test.
    let options = FileSourceOptions {
        quiet: Duration::from_secs(1),
        max_delay: Duration::from_secs(10),
        initial_delay: Duration::ZERO,
    };
    let mut rx = start(vec![d.path().to_path_buf()], options);
    let before = until(&mut rx, "initial sync", |s| s.synced).await;

    // Record every state published from now on and check each is consistent.
    let mut observer = rx.clone();
    let seen = tokio::spawn(async move {
        let mut out: Vec<(u64, Arc<ConfigSet>)> = Vec::new();
        while observer.changed().await.is_ok() {
            let s = observer.borrow_and_update().clone();
            if out.last().map(|(g, _)| *g) != Some(s.generation) {
                out.push((s.generation, s.config.unwrap()));
            }
        }
        out
    });

    write(&routes, &route("web", "new"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    write(&backends, &backend("new", 8080));
    let after = until(&mut rx, "renamed backend", |s| port_of(s, "new").is_some()).await;
    assert_eq!(
        after.generation,
        before.generation + 1,
        "an intermediate generation was published"
    );
    let set = after.config.unwrap();
    let r = &set.http_routes[&key("web")];
    let backend_ref = &r.spec.rules[0].backend_refs[0];
    assert!(matches!(
        set.resolve_backend(r, backend_ref),
        BackendRefResolution::Resolved(_)
    ));

    drop(rx);
    seen.abort();
    if let Ok(seen) = seen.await {
        for (generation, c) in seen {
            let r = &c.http_routes[&key("web")];
            assert!(
                matches!(
                    c.resolve_backend(r, &r.spec.rules[0].backend_refs[0]),
                    BackendRefResolution::Resolved(_)
                ),
                "generation {generation} is a half state"
            );
        }
    }
}

#[tokio::test]
async fn deleting_a_file_removes_its_objects() {
    let d = tempfile::tempdir().unwrap();
    three_files(d.path());
    write(&d.path().join("backends/api.yaml"), &backend("api", 81));
    let mut rx = start(vec![d.path().to_path_buf()], fast());
    let s = until(&mut rx, "initial sync", |s| s.synced).await;
    assert_eq!((s.files, port_of(&s, "api")), (4, Some(81)));
    fs::remove_file(d.path().join("backends/api.yaml")).unwrap();
    let s = until(&mut rx, "deletion", |s| s.generation == 2).await;
    assert_eq!((s.files, port_of(&s, "api")), (3, None));
    assert_eq!(port_of(&s, "web"), Some(8080));
}

#[tokio::test]
async fn identical_rewrite_publishes_nothing() {
    let d = tempfile::tempdir().unwrap();
    three_files(d.path());
    let mut rx = start(vec![d.path().to_path_buf()], fast());
    let s = until(&mut rx, "initial sync", |s| s.synced).await;
    let attempt = s.last_attempt;
    rx.borrow_and_update();

    write(
        &d.path().join("backends/web.yml"),
        &backend("web", 8080), // same bytes
    );
    // The reload happens (its attempt time is recorded) but wakes no receiver.
    let deadline = Instant::now() + WAIT;
    while rx.borrow().last_attempt == attempt {
        assert!(Instant::now() < deadline, "no reload after the rewrite");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let s = rx.borrow().clone();
    assert_eq!(s.generation, 1);
    assert!(s.last_error.is_none());
    assert!(
        !rx.has_changed().unwrap(),
        "a no-op reload notified receivers"
    );

    // The reload's own reads raise no events that trigger another reload (a feedback loop
    // would reload every `quiet` period forever). Tolerates one straggler event.
    let mut attempts = 0;
    let mut last = rx.borrow().last_attempt;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = rx.borrow().last_attempt;
        if now != last {
            attempts += 1;
            last = now;
        }
    }
    assert!(
        attempts <= 1,
        "{attempts} reloads without any change: a feedback loop"
    );
}

/// Kubernetes mounts a ConfigMap as `name -> ..data/name`, `..data -> ..<timestamp>`, and
/// updates it by writing a new timestamped directory and renaming a new `..data` link over the
/// old one: one atomic swap of every file.
#[cfg(unix)]
#[tokio::test]
async fn configmap_symlink_swap_reloads() {
    use std::os::unix::fs::symlink;
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    let version = |dir: &str, port: u16| {
        write(&root.join(dir).join("gateway.yaml"), GATEWAY);
        write(&root.join(dir).join("backends.yaml"), &backend("web", port));
    };
    version("..2024_01", 8080);
    symlink("..2024_01", root.join("..data")).unwrap();
    for f in ["gateway.yaml", "backends.yaml"] {
        symlink(format!("..data/{f}"), root.join(f)).unwrap();
    }
    let mut rx = start(vec![root.to_path_buf()], fast());
    let s = until(&mut rx, "initial sync", |s| s.synced).await;
    // Hidden `..` directories are not walked: each file is read once, through its link.
    assert_eq!((s.files, port_of(&s, "web")), (2, Some(8080)));

    version("..2024_02", 9090);
    symlink("..2024_02", root.join("..data_tmp")).unwrap();
    fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    fs::remove_dir_all(root.join("..2024_01")).unwrap();
    let s = until(&mut rx, "swap", |s| port_of(s, "web") == Some(9090)).await;
    assert!(s.last_error.is_none(), "{:?}", errors(&s));
    assert_eq!(s.generation, 2);
}

#[tokio::test]
async fn missing_path_is_an_error_until_it_appears() {
    let d = tempfile::tempdir().unwrap();
    let conf = d.path().join("etc/ballast");
    let mut rx = start(vec![conf.clone()], fast());
    let s = until(&mut rx, "missing path error", |s| s.last_error.is_some()).await;
    assert_eq!(
        errors(&s),
        vec![format!("{}:0:0: path does not exist", conf.display())]
    );
    assert!(!s.synced && s.config.is_none() && s.generation == 0);

    three_files(&conf);
    let s = until(&mut rx, "sync after creation", |s| s.synced).await;
    assert_eq!((s.generation, s.files), (1, 3));
    assert!(s.last_error.is_none());
    // And it is watched from now on.
    write(&conf.join("backends/web.yml"), &backend("web", 7070));
    until(&mut rx, "edit", |s| port_of(s, "web") == Some(7070)).await;
}

/// Per-object last known good at a cold start: the never-valid object is not served,
/// everything else is, and the source reports synced with its errors (readiness is not held
/// hostage by one object).
#[tokio::test]
async fn initial_load_with_an_invalid_object_syncs_without_it() {
    let d = tempfile::tempdir().unwrap();
    three_files(d.path());
    write(&d.path().join("backends/web.yml"), &backend("web", 0));
    write(&d.path().join("api.yaml"), &backend("api", 9090));
    let mut rx = start(vec![d.path().to_path_buf()], fast());
    let s = until(&mut rx, "initial sync", |s| s.synced).await;
    assert_eq!(s.generation, 1);
    assert_eq!((port_of(&s, "web"), port_of(&s, "api")), (None, Some(9090)));
    assert_eq!(s.config.as_ref().unwrap().http_routes.len(), 1);
    let errs = errors(&s);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(
        errs[0].contains("web.yml:5:43: Backend default/web:"),
        "{errs:#?}"
    );
    assert_eq!(s.report.rejected.len(), 1);
    assert_eq!(
        s.report.rejected[0].serving, None,
        "never valid, not served"
    );
    assert!(s.last_success.is_none(), "no load without errors yet");
    write(&d.path().join("backends/web.yml"), &backend("web", 8080));
    let s = until(&mut rx, "fix", |s| port_of(s, "web") == Some(8080)).await;
    assert_eq!(s.generation, 2);
    assert!(s.last_error.is_none() && s.report.rejected.is_empty());
}

/// One reload with a bad edit to one object and good edits to others: only the bad one keeps
/// its last good version.
#[tokio::test]
async fn bad_edit_to_one_object_and_good_edits_apply_together() {
    let d = tempfile::tempdir().unwrap();
    three_files(d.path());
    write(&d.path().join("api.yaml"), &backend("api", 9090));
    let mut rx = start(vec![d.path().to_path_buf()], fast());
    until(&mut rx, "initial sync", |s| s.synced).await;
    // Both files in one burst: web goes invalid (unknown field), api moves to 9091.
    write(
        &d.path().join("backends/web.yml"),
        &backend("web", 8081).replace("spec:\n", "spec:\n  typo: 1\n"),
    );
    write(&d.path().join("api.yaml"), &backend("api", 9091));
    let s = until(&mut rx, "api edit", |s| port_of(s, "api") == Some(9091)).await;
    assert_eq!(
        port_of(&s, "web"),
        Some(8080),
        "web keeps its last good version"
    );
    let errs = errors(&s);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(
        errs[0].contains("web.yml:5:3: Backend default/web: spec.typo: unknown field"),
        "{errs:#?}"
    );
    let serving = s.report.rejected[0].serving.as_ref().unwrap();
    assert!(serving.file.ends_with("backends/web.yml"), "{serving}");
    // Deleting the bad object's file removes it (deletion is not invalidity).
    fs::remove_file(d.path().join("backends/web.yml")).unwrap();
    let s = until(&mut rx, "deletion", |s| port_of(s, "web").is_none()).await;
    assert!(s.last_error.is_none());
}

/// Kinds Ballast does not implement are skipped with a warning, never a reason not to sync.
#[tokio::test]
async fn unknown_kinds_are_skipped_and_the_rest_syncs() {
    let d = tempfile::tempdir().unwrap();
    three_files(d.path());
    write(
        &d.path().join("grants.yaml"),
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: g, namespace: apps }\nspec:\n  podSelector: {}\n---\napiVersion: gateway.envoyproxy.io/v1alpha1\nkind: ClientTrafficPolicy\nmetadata: { name: p }\nspec: { targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }] }\n",
    );
    let mut rx = start(vec![d.path().to_path_buf()], fast());
    let s = until(&mut rx, "initial sync", |s| s.synced).await;
    assert!(s.last_error.is_none(), "{:?}", errors(&s));
    assert_eq!(s.config.as_ref().unwrap().len(), 3);
    let kinds: Vec<&str> = s.report.skipped.iter().map(|k| k.kind.as_str()).collect();
    assert_eq!(kinds, ["NetworkPolicy", "ClientTrafficPolicy"]);
}

/// A single file path, saved the way editors do: write a temporary file and rename it over.
#[tokio::test]
async fn single_file_rename_over_save() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("ballast.yaml");
    write(&file, &format!("{GATEWAY}---\n{}", backend("web", 1)));
    write(&d.path().join("other.yaml"), "not: [yaml"); // not configured: ignored
    let mut rx = start(vec![file.clone()], fast());
    let s = until(&mut rx, "initial sync", |s| s.synced).await;
    assert_eq!((s.files, port_of(&s, "web")), (1, Some(1)));
    let tmp = d.path().join(".ballast.yaml.tmp");
    write(&tmp, &format!("{GATEWAY}---\n{}", backend("web", 2)));
    fs::rename(&tmp, &file).unwrap();
    until(&mut rx, "save", |s| port_of(s, "web") == Some(2)).await;
}

#[tokio::test]
async fn initial_delay_holds_the_sync() {
    let d = tempfile::tempdir().unwrap();
    three_files(d.path());
    let delay = Duration::from_millis(400);
    let started = Instant::now();
    let mut rx = start(
        vec![d.path().to_path_buf()],
        FileSourceOptions {
            initial_delay: delay,
            ..fast()
        },
    );
    assert!(!rx.borrow().synced && rx.borrow().config.is_none());
    until(&mut rx, "delayed sync", |s| s.synced).await;
    // A lower bound only: sleeping guarantees at least the delay.
    assert!(started.elapsed() >= delay);
}

#[tokio::test]
async fn dropping_the_receivers_stops_the_source() {
    let d = tempfile::tempdir().unwrap();
    three_files(d.path());
    let mut rx = start(vec![d.path().to_path_buf()], fast());
    until(&mut rx, "initial sync", |s| s.synced).await;
    // Nothing to observe from outside but that it does not hang or panic when files change
    // after the last receiver is gone.
    drop(rx);
    write(&d.path().join("backends/web.yml"), &backend("web", 1));
    tokio::time::sleep(Duration::from_millis(200)).await;
}

#[test]
fn load_paths_reports_every_error_with_positions() {
    let d = tempfile::tempdir().unwrap();
    three_files(d.path());
    let a = d.path().join("backends/web.yml");
    write(&a, &backend("web", 0));
    write(&d.path().join("dup.yaml"), &backend("api", 80));
    write(&d.path().join("dup2.yaml"), &backend("api", 80));
    let errs: Vec<String> = load_paths(&[d.path().to_path_buf(), d.path().join("missing")])
        .unwrap_err()
        .iter()
        .map(|e| e.to_string())
        .collect();
    assert_eq!(errs.len(), 3, "{errs:#?}");
    assert!(
        errs[0].starts_with(&format!("{}:5:43:", a.display())),
        "{errs:#?}"
    );
    assert!(
        errs[1].contains("dup2.yaml:1:1: Backend default/api: duplicate"),
        "{errs:#?}"
    );
    assert!(
        errs[2].ends_with("missing:0:0: path does not exist"),
        "{errs:#?}"
    );
    // The good case.
    write(&a, &backend("web", 80));
    fs::remove_file(d.path().join("dup2.yaml")).unwrap();
    assert_eq!(load_paths(&[d.path().to_path_buf()]).unwrap().len(), 4);
}

/// A config file symlinked from elsewhere: editing the target (outside every watched tree)
/// reloads.
#[cfg(unix)]
#[tokio::test]
async fn edits_of_a_symlink_target_outside_the_tree_reload() {
    let d = tempfile::tempdir().unwrap();
    let conf = d.path().join("conf");
    let elsewhere = d.path().join("elsewhere/backends.yaml");
    write(&conf.join("gateway.yaml"), GATEWAY);
    write(&elsewhere, &backend("web", 1));
    std::os::unix::fs::symlink(&elsewhere, conf.join("backends.yaml")).unwrap();
    let mut rx = start(vec![conf.clone()], fast());
    let s = until(&mut rx, "initial sync", |s| s.synced).await;
    assert_eq!((s.files, port_of(&s, "web")), (2, Some(1)));
    write(&elsewhere, &backend("web", 2));
    until(&mut rx, "target edit", |s| port_of(s, "web") == Some(2)).await;
}

/// The configured directory deleted and created again: the load in between fails (last known
/// good), and the new directory is watched.
#[tokio::test]
async fn directory_deleted_and_recreated() {
    let d = tempfile::tempdir().unwrap();
    let conf = d.path().join("conf");
    three_files(&conf);
    let mut rx = start(vec![conf.clone()], fast());
    until(&mut rx, "initial sync", |s| s.synced).await;
    fs::remove_dir_all(&conf).unwrap();
    let s = until(&mut rx, "missing error", |s| {
        errors(s).iter().any(|e| e.ends_with("path does not exist"))
    })
    .await;
    assert_eq!((s.generation, port_of(&s, "web")), (1, Some(8080)));
    three_files(&conf);
    write(&conf.join("backends/web.yml"), &backend("web", 8081));
    let s = until(&mut rx, "recreated", |s| port_of(s, "web") == Some(8081)).await;
    assert!(s.last_error.is_none());
    write(&conf.join("backends/web.yml"), &backend("web", 8082));
    until(&mut rx, "edit in recreated", |s| {
        port_of(s, "web") == Some(8082)
    })
    .await;
}

/// Writes that never pause for `quiet` still reload, `max_delay` after the burst began.
#[tokio::test]
async fn a_steady_trickle_still_reloads() {
    let d = tempfile::tempdir().unwrap();
    three_files(d.path());
    let options = FileSourceOptions {
        quiet: Duration::from_millis(300),
        max_delay: Duration::from_millis(600),
        initial_delay: Duration::ZERO,
    };
    let mut rx = start(vec![d.path().to_path_buf()], options);
    until(&mut rx, "initial sync", |s| s.synced).await;
    let file = d.path().join("backends/api.yaml");
    let writing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let writer = {
        let writing = writing.clone();
        tokio::spawn(async move {
            // Every 50 ms, well inside the quiet period, for at most 30 s.
            for i in 0..600u16 {
                if !writing.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                write(&file, &backend("api", 1000 + i));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            writing.store(false, std::sync::atomic::Ordering::SeqCst);
        })
    };
    until(&mut rx, "a reload during the trickle", |s| {
        s.generation >= 2
    })
    .await;
    assert!(
        writing.swap(false, std::sync::atomic::Ordering::SeqCst),
        "the reload only came after the writes stopped"
    );
    writer.await.unwrap();
}

/// The changes a reload reads by the watcher's events alone (issue #13, W3), each of the ways
/// files change in a tree: an editor's rename-over save (hidden temporary file), a new
/// subdirectory whose file is written before any watch on it can exist, an edit inside it,
/// a deletion, and a file that is not config. Each must land as a walk would have it.
#[tokio::test]
async fn rename_over_saves_new_subdirectories_and_deletions_in_a_tree() {
    let d = tempfile::tempdir().unwrap();
    let conf = d.path().join("conf");
    three_files(&conf);
    let mut rx = start(vec![conf.clone()], fast());
    until(&mut rx, "initial sync", |s| s.synced).await;

    let tmp = conf.join("backends/.web.yml.tmp");
    write(&tmp, &backend("web", 8081));
    fs::rename(&tmp, conf.join("backends/web.yml")).unwrap();
    until(&mut rx, "rename-over save", |s| {
        port_of(s, "web") == Some(8081)
    })
    .await;

    write(&conf.join("new/deeper/api.yaml"), &backend("api", 1));
    let s = until(&mut rx, "file in a new subdirectory", |s| {
        port_of(s, "api") == Some(1)
    })
    .await;
    assert_eq!(s.files, 4);
    write(&conf.join("new/deeper/api.yaml"), &backend("api", 2));
    until(&mut rx, "edit in the new subdirectory", |s| {
        port_of(s, "api") == Some(2)
    })
    .await;

    write(&conf.join("notes.txt"), "still: [not yaml");
    fs::remove_file(conf.join("routes/web.yaml")).unwrap();
    let s = until(&mut rx, "deletion", |s| {
        s.config
            .as_ref()
            .is_some_and(|c| !c.http_routes.contains_key(&key("web")))
    })
    .await;
    assert_eq!((s.files, errors(&s)), (3, Vec::<String>::new()));
    assert_eq!(s.config.as_deref(), Some(&load_paths(&[conf]).unwrap()));
}

/// Files written at different moments of one debounce period are all read: the paths named
/// by every event of the burst are kept until the reload takes them.
#[tokio::test]
async fn events_during_the_debounce_all_apply() {
    let d = tempfile::tempdir().unwrap();
    three_files(d.path());
    let options = FileSourceOptions {
        quiet: Duration::from_millis(200),
        max_delay: Duration::from_secs(2),
        initial_delay: Duration::ZERO,
    };
    let mut rx = start(vec![d.path().to_path_buf()], options);
    until(&mut rx, "initial sync", |s| s.synced).await;
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        write(
            &d.path().join(format!("backends/{name}.yaml")),
            &backend(name, 1),
        );
        write(
            &d.path().join("backends/web.yml"),
            &backend("web", 9000 + i as u16),
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let s = until(&mut rx, "every file of the burst", |s| {
        ["a", "b", "c"].iter().all(|n| port_of(s, n) == Some(1)) && port_of(s, "web") == Some(9002)
    })
    .await;
    assert_eq!(s.files, 6);
}
