//! The file source: config from files and directories, watched and reloaded atomically.
//!
//! Each reload reads the files the watcher's events named since the last one (all of them
//! when events cannot tell, see [`watch`]) and assembles one [`ConfigSet`] over the one served
//! now: every valid change is applied together, while an invalid object keeps its last good
//! version and a file with a YAML syntax error keeps its last good objects (per-object last
//! known good, invariant 8); a path that cannot be walked rejects the reload whole. Events are
//! debounced (see [`FileSourceOptions`]) so that files written together — a route and its
//! backend renamed in two files, a `git checkout`, a ConfigMap update — land in the same reload.

mod walk;
mod watch;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ballast_model::{ConfigError, ConfigErrors, ConfigSet, Object, ObjectId, ObjectRef};
use notify::{Config, PollWatcher, RecommendedWatcher, Watcher};
use tokio::sync::{Notify, watch as tokio_watch};
use tokio::time::{Instant, sleep, sleep_until};

use crate::state::{Source, SourceState};
pub use walk::{FileError, Loaded, is_config_name};
pub use watch::Debouncer;
use watch::{Changes, Watches, is_relevant};

/// How the file source times its reloads.
#[derive(Clone, Debug)]
pub struct FileSourceOptions {
    /// Debounce quiet period: a reload happens once no event has arrived for this long.
    pub quiet: Duration,
    /// A reload happens at most this long after the first event of a burst, even if events keep
    /// coming (a file appended to continuously must not starve the others).
    pub max_delay: Duration,
    /// Test hook: delay before the initial sync completes (to test that nothing is served
    /// before it; invariant 1). The first load happens after it.
    pub initial_delay: Duration,
}

impl Default for FileSourceOptions {
    fn default() -> Self {
        FileSourceOptions {
            quiet: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
            initial_delay: Duration::ZERO,
        }
    }
}

/// Config from files and directories (recursively, `*.yaml`/`*.yml`), watched with notify.
///
/// All paths form one config: one load reads them all, a file reachable through two paths is
/// read once, and an object defined twice is an error. Give every `--config` path to one
/// `FileSource` rather than one source each, so a change spanning paths is still atomic.
#[derive(Clone, Debug)]
pub struct FileSource {
    paths: Vec<PathBuf>,
    options: FileSourceOptions,
    name: String,
    /// Where each served object's last good document is kept across restarts
    /// ([`crate::last_good`]); `None`: not kept.
    last_good: Option<PathBuf>,
}

impl FileSource {
    pub fn new(paths: Vec<PathBuf>, options: FileSourceOptions) -> Self {
        let name = format!(
            "file:{}",
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        FileSource {
            paths,
            options,
            name,
            last_good: None,
        }
    }

    /// Keeps each served object's last good document in `<state_dir>/last-good` and, at start,
    /// serves it for an object (or a file) that no longer parses or validates, as if Ballast
    /// had kept running (invariant 8 across a restart).
    pub fn with_last_good(mut self, state_dir: &std::path::Path) -> Self {
        self.last_good = Some(crate::last_good::dir_in(state_dir));
        self
    }

    /// `file:` and the paths, comma-separated (the name in [`SourceState`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }
}

impl Source for FileSource {
    /// Panics outside a tokio runtime. Watching starts before the first load, so nothing
    /// written after the load can be missed.
    fn start(self: Box<Self>) -> tokio_watch::Receiver<SourceState> {
        let (tx, rx) = tokio_watch::channel(SourceState::new(self.name.clone()));
        tokio::spawn(run(*self, tx));
        rx
    }
}

/// Loads once, synchronously, strictly (for `ballast translate`): the set only if there is no
/// error at all, else every error, sorted by file and position. Same discovery and rules as
/// [`FileSource`]; kinds Ballast does not implement are skipped.
pub fn load_paths(paths: &[PathBuf]) -> Result<ConfigSet, ConfigErrors> {
    let loaded = walk::load(paths)?;
    if loaded.report.errors.is_empty() {
        Ok(loaded.set)
    } else {
        Err(loaded.report.errors.into())
    }
}

/// Loads once as a cold-started [`FileSource`] would (for `ballast validate`): the set that would
/// be served and the report of every error and skipped object. `Err` only when a configured
/// path cannot be walked.
pub fn load_paths_report(paths: &[PathBuf]) -> Result<Loaded, ConfigErrors> {
    Ok(walk::load(paths)?)
}

/// Reads the config files the paths name now (same discovery as [`FileSource`]), as (path for
/// messages, text), for tools that need the text itself (`ballast apply` stores each document).
/// `Err` with every error if a path cannot be walked or a file cannot be read.
pub fn read_config_files(paths: &[PathBuf]) -> Result<Vec<(String, String)>, Vec<ConfigError>> {
    let walk::Discovered {
        files, mut errors, ..
    } = walk::discover(paths);
    let mut out = Vec::with_capacity(files.len());
    for f in &files {
        match walk::read_one(f) {
            Ok(text) => out.push((f.display().to_string(), text)),
            Err(e) => errors.push(e.at(f)),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        errors.sort();
        Err(errors)
    }
}

/// The blocking half of the source: the watches and the parse cache, moved to a blocking
/// thread for each load and back.
struct Worker {
    watches: Watches,
    loader: walk::Loader,
    /// Directories that symlinked files pointed into at the last load (watched too).
    link_dirs: Vec<PathBuf>,
    /// What the watcher saw since the last load (filled by its event handler).
    changes: Arc<std::sync::Mutex<Changes>>,
}

impl Worker {
    /// One load. Take what the watcher saw, watch, then look: anything that changes after
    /// the take raises an event for the next load, anything before it is seen by this one
    /// (read because an event named it, or by the walk). Returns whether every watch is in
    /// place.
    fn load(
        &mut self,
        paths: &[PathBuf],
        prev: Option<&ConfigSet>,
    ) -> (bool, Result<walk::Loaded, Vec<ConfigError>>) {
        let changes = std::mem::replace(
            &mut *self.changes.lock().unwrap_or_else(|e| e.into_inner()),
            Changes::none(),
        );
        let mut complete = self.watches.reconcile(paths, &self.link_dirs);
        if !changes.full
            && let Some(loaded) = self.loader.read_changed(&changes.paths, prev)
        {
            return (complete, Ok(loaded));
        }
        let discovered = walk::discover(paths);
        let links = walk::link_target_dirs(&discovered.maybe_links);
        if links != self.link_dirs {
            complete &= self.watches.reconcile(paths, &links);
            self.link_dirs = links;
        }
        (complete, self.loader.read(discovered, prev))
    }
}

/// How long to wait before retrying watches that could not be set up (e.g. the inotify watch
/// limit); meanwhile changes may go unseen, so this is also a reload.
const WATCH_RETRY: Duration = Duration::from_secs(2);

fn new_watcher(
    wake: Arc<Notify>,
    changes: Arc<std::sync::Mutex<Changes>>,
) -> Box<dyn Watcher + Send> {
    let handler = move |event: notify::Result<notify::Event>| {
        if is_relevant(&event) {
            changes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(&event);
            // A permit, not a queue: a burst of a million events costs nothing but wakeups.
            wake.notify_one();
        }
    };
    match RecommendedWatcher::new(handler.clone(), Config::default()) {
        Ok(w) => Box::new(w),
        Err(e) => {
            tracing::warn!(error = %e, "native file watching unavailable; polling every second");
            match PollWatcher::new(
                handler,
                Config::default().with_poll_interval(Duration::from_secs(1)),
            ) {
                Ok(w) => Box::new(w),
                Err(e) => {
                    // Cannot happen with the poll backend in practice; keep the source alive
                    // (periodic retries still reload) rather than panic the server.
                    tracing::error!(error = %e, "no file watching at all");
                    Box::new(notify::NullWatcher)
                }
            }
        }
    }
}

async fn run(source: FileSource, tx: tokio_watch::Sender<SourceState>) {
    let FileSource {
        paths,
        options,
        name,
        last_good,
    } = source;
    // The last good documents of the previous run: the first load falls back on them.
    let mut restored = Restored::default();
    let mut seed: Option<Arc<ConfigSet>> = None;
    let mut persist: Option<Persist> = None;
    if let Some(dir) = last_good {
        let opened = tokio::task::spawn_blocking(move || crate::last_good::LastGood::open(dir));
        match opened.await {
            Ok((store, found)) => {
                for w in &found.warnings {
                    tracing::warn!(source = %name, "last good state: ignoring an entry: {w}");
                }
                tracing::info!(source = %name, dir = %store.dir().display(), objects = found.set.len(), "last good state: loaded");
                restored = Restored::new(store.dir(), &found.set);
                seed = (!found.set.is_empty()).then(|| Arc::new(found.set));
                let (wake, prx) = tokio_watch::channel(());
                let pending = Arc::new(std::sync::Mutex::new(None));
                tokio::spawn(persist_last_good(name.clone(), store, prx, pending.clone()));
                persist = Some(Persist {
                    wake,
                    pending,
                    sent: None,
                });
            }
            Err(e) => tracing::warn!(source = %name, error = %e, "last good state: cannot be read"),
        }
    }
    let paths: Arc<[PathBuf]> = paths.into();
    let wake = Arc::new(Notify::new());
    let changes = Arc::new(std::sync::Mutex::new(Changes::default()));
    let mut worker = Some(Worker {
        watches: Watches::new(new_watcher(wake.clone(), changes.clone())),
        loader: walk::Loader::default(),
        link_dirs: Vec::new(),
        changes: changes.clone(),
    });
    let mut debounce = Debouncer::new(options.quiet, options.max_delay);
    let mut retry_at: Option<Instant> = None;
    let mut first = true;

    loop {
        // One load: reconcile the watches first (so anything created after this point raises
        // an event), then read everything. Blocking I/O and parsing run off the async threads.
        if !first || options.initial_delay.is_zero() || {
            tokio::select! {
                _ = tx.closed() => return,
                _ = sleep(options.initial_delay) => true,
            }
        } {
            let mut w = worker
                .take()
                .expect("the worker is returned after every load");
            let p = paths.clone();
            // Only this task publishes, so the config read here is still current at publish.
            let prev = tx.borrow().config.clone();
            // Until something is served (a first load may fail: a path missing), the previous
            // run's last good objects stand in for the set served now.
            if prev.is_some() {
                seed = None;
            }
            let seed = seed.clone();
            let joined = tokio::task::spawn_blocking(move || {
                let (complete, result) = w.load(&p, prev.as_deref().or(seed.as_deref()));
                (w, complete, result)
            })
            .await;
            let (w, complete, result) = match joined {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(source = %name, error = %e, "config load task failed");
                    return;
                }
            };
            worker = Some(w);
            retry_at = (!complete).then(|| Instant::now() + WATCH_RETRY);
            let mut touched = None;
            let result = result.map(|mut loaded| {
                restored.annotate(&mut loaded);
                touched = loaded.touched.take();
                loaded
            });
            let base = tx.borrow().config.clone();
            publish(&tx, &name, result, first);
            first = false;
            if let Some(p) = &mut persist {
                let served = tx.borrow().config.clone();
                p.offer(base, served, touched);
            }
        }

        // Wait for the next burst of events to settle (or a retry to fall due).
        loop {
            let deadline = match (debounce.deadline(), retry_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            tokio::select! {
                _ = tx.closed() => {
                    tracing::debug!(source = %name, "no receivers left; stopping");
                    return;
                }
                _ = wake.notified() => debounce.event(Instant::now()),
                _ = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    let now = Instant::now();
                    let due = debounce.take_due(now);
                    if retry_at.is_some_and(|r| r <= now) {
                        // Some watch was missing: changes may have gone unseen.
                        changes.lock().unwrap_or_else(|e| e.into_inner()).walk();
                    }
                    if due || retry_at.is_some_and(|r| r <= now) {
                        break;
                    }
                }
            }
        }
    }
}

fn publish(
    tx: &tokio_watch::Sender<SourceState>,
    name: &str,
    result: Result<walk::Loaded, Vec<ConfigError>>,
    initial: bool,
) {
    let now = SystemTime::now();
    match result {
        Ok(loaded) => {
            let objects = loaded.set.len();
            let files = loaded.files;
            let known = loaded.changes;
            let report = loaded.report;
            log_report(name, &report, &tx.borrow());
            let mut changes = None;
            tx.send_if_modified(|s| {
                let old = s.config.clone();
                let before = s.generation;
                let changed = s.apply_load(loaded.set, files, report, now);
                if s.generation != before {
                    changes = Some(match (&old, &s.config, known) {
                        // Counted by the assembler: a diff of two 100,000-object sets for a
                        // log line cost more than the rest of the load.
                        (Some(_), Some(_), Some(n)) => n,
                        (Some(old), Some(new), None) => old.diff(new).len(),
                        _ => objects,
                    });
                }
                changed
            });
            let state = tx.borrow();
            match changes {
                Some(changes) => tracing::info!(
                    source = %name,
                    generation = state.generation,
                    files,
                    objects,
                    changes,
                    initial,
                    errors = state.report.errors.len(),
                    "config loaded"
                ),
                None => tracing::debug!(source = %name, files, "config reloaded, unchanged"),
            }
        }
        Err(errors) => {
            let text = errors
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n");
            let count = errors.len();
            tx.send_if_modified(|s| s.apply_failure(errors, now));
            let state = tx.borrow();
            tracing::warn!(
                source = %name,
                errors = count,
                kept_generation = state.generation,
                synced = state.synced,
                initial,
                "config rejected, keeping the last good config:\n{text}"
            );
        }
    }
}

/// A served set the last good writer has not synced yet, and the objects that may differ from
/// the set it synced last (`None`: unknown, so it walks them all).
struct PendingSync {
    set: Arc<ConfigSet>,
    changed: Option<std::collections::BTreeSet<ObjectId>>,
}

/// The loader's side of the last good writer: hands it each newly served set with what changed,
/// so that an edit's sync costs O(change) (issue #13, W3).
struct Persist {
    wake: tokio_watch::Sender<()>,
    pending: Arc<std::sync::Mutex<Option<PendingSync>>>,
    /// The set handed over last.
    sent: Option<Arc<ConfigSet>>,
}

impl Persist {
    /// `served` was loaded over `base`, touching `touched` (see `walk::Loaded::touched`).
    fn offer(
        &mut self,
        base: Option<Arc<ConfigSet>>,
        served: Option<Arc<ConfigSet>>,
        touched: Option<Vec<ObjectId>>,
    ) {
        let Some(served) = served else { return };
        if self.sent.as_ref().is_some_and(|s| Arc::ptr_eq(s, &served)) {
            return;
        }
        // The hint is relative to the set handed over last only if the load started from it.
        let follows = matches!((&base, &self.sent), (Some(b), Some(s)) if Arc::ptr_eq(b, s));
        let touched = touched.filter(|_| follows);
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let changed = match pending.take() {
            // Not synced yet: what changed since the set synced last is both loads' changes.
            Some(prev) => prev.changed.zip(touched).map(|(mut a, b)| {
                a.extend(b);
                a
            }),
            None => touched.map(|t| t.into_iter().collect()),
        };
        *pending = Some(PendingSync {
            set: served.clone(),
            changed,
        });
        drop(pending);
        self.sent = Some(served);
        self.wake.send_replace(());
    }
}

/// Writes the served set's last good documents whenever it changes, at most once per
/// [`crate::last_good::MIN_WRITE_INTERVAL`] after a change, off the async threads. Ends with
/// the source.
async fn persist_last_good(
    name: String,
    mut store: crate::last_good::LastGood,
    mut rx: tokio_watch::Receiver<()>,
    pending: Arc<std::sync::Mutex<Option<PendingSync>>>,
) {
    let mut failing = false;
    while rx.changed().await.is_ok() {
        // Wait first: the first sync after a start reads and re-parses every file, and would
        // otherwise run beside the first translation and add its copies to the start's peak
        // memory (issue #13, W4). Edits in the wait are taken together.
        tokio::time::sleep(crate::last_good::MIN_WRITE_INTERVAL).await;
        rx.borrow_and_update();
        let taken = pending.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(PendingSync { set, changed }) = taken else {
            continue;
        };
        let joined = tokio::task::spawn_blocking(move || {
            let synced = store.sync_changed(&set, changed.as_ref());
            (store, synced)
        })
        .await;
        let synced;
        (store, synced) = match joined {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(source = %name, error = %e, "last good state: writer failed");
                return;
            }
        };
        if synced.errors.is_empty() {
            if failing {
                tracing::info!(source = %name, "last good state: written again");
            }
            failing = false;
        } else {
            if !failing {
                tracing::warn!(source = %name, errors = %synced.errors.join("; "), "last good state: cannot write; a restart into an invalid object may not find its last good version");
            }
            failing = true;
        }
        if !synced.uncaptured.is_empty() {
            tracing::debug!(source = %name, objects = synced.uncaptured.len(), "last good state: files changed since the load; capturing on the next change");
        }
        tracing::debug!(source = %name, written = synced.written, removed = synced.removed, journaled = synced.journaled, compacted = synced.compacted, stored = store.len(), "last good state: synced");
    }
}

/// The objects served from the previous run's last good state (not from the files), so their
/// rejections say so, exactly as a live fallback is reported plus "restored from state".
#[derive(Debug, Default)]
struct Restored {
    dir: String,
    objects: std::collections::HashMap<ObjectId, Object>,
}

impl Restored {
    fn new(dir: &std::path::Path, set: &ConfigSet) -> Self {
        Restored {
            dir: dir.display().to_string(),
            objects: set
                .objects()
                .map(|o| {
                    let id = ObjectId {
                        kind: o.kind(),
                        key: o.key(),
                    };
                    (id, o)
                })
                .collect(),
        }
    }

    /// Adds a "restored from state" error to each rejection (and held file) served from the
    /// state, and forgets the restored objects no longer served that way.
    fn annotate(&mut self, loaded: &mut walk::Loaded) {
        if self.objects.is_empty() {
            return;
        }
        let set = &loaded.set;
        let report = &mut loaded.report;
        let served = |id: &ObjectId, o: &Object| {
            set.get(id.kind, &id.key)
                .is_some_and(|s| s == *o && s.source() == o.source())
        };
        let held: std::collections::BTreeSet<Arc<str>> =
            report.held_files.iter().cloned().collect();
        let rejected: std::collections::HashSet<ObjectId> =
            report.rejected.iter().map(|r| r.id.clone()).collect();
        self.objects.retain(|id, o| {
            served(id, o) && (rejected.contains(id) || held.contains(&o.source().file))
        });
        let mut notes = Vec::new();
        for r in &mut report.rejected {
            if let (Some(o), Some(src)) = (self.objects.get(&r.id), &r.serving)
                && o.source() == src
            {
                let note = ConfigError {
                    file: src.file.clone(),
                    pos: src.pos,
                    object: Some(ObjectRef {
                        kind: r.id.kind,
                        namespace: r.id.key.namespace.clone(),
                        name: Some(r.id.key.name.clone()),
                    }),
                    field: None,
                    message: format!(
                        "restored from state: serving its last good version from {} (saved by a previous run)",
                        self.dir
                    ),
                };
                r.errors.push(note.clone());
                notes.push(note);
            }
        }
        for file in &held {
            let n = self
                .objects
                .values()
                .filter(|o| {
                    !rejected.contains(&ObjectId {
                        kind: o.kind(),
                        key: o.key(),
                    }) && o.source().file == *file
                })
                .count();
            if n > 0 {
                notes.push(ConfigError {
                    file: file.clone(),
                    pos: ballast_model::Pos::new(1, 1),
                    object: None,
                    field: None,
                    message: format!(
                        "restored from state: serving the last good version of {n} object{} of this file from {} (saved by a previous run)",
                        if n == 1 { "" } else { "s" },
                        self.dir
                    ),
                });
            }
        }
        if !notes.is_empty() {
            report.errors.extend(notes);
            report.errors.sort();
        }
    }
}

/// Logs a load's errors and skipped objects when they differ from the last load's (a reload
/// of unrelated files must not repeat every warning).
pub(crate) fn log_report(name: &str, report: &ballast_model::LoadReport, current: &SourceState) {
    if report.errors != current.report.errors && !report.errors.is_empty() {
        let text = report
            .errors
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n");
        let kept = report
            .rejected
            .iter()
            .filter(|r| r.serving.is_some())
            .count();
        tracing::warn!(
            source = %name,
            errors = report.errors.len(),
            rejected_objects = report.rejected.len(),
            kept_last_good = kept,
            held_files = report.held_files.len(),
            "config has errors; applying everything else, invalid objects keep their last good version:\n{text}"
        );
    }
    if report.skipped != current.report.skipped && !report.skipped.is_empty() {
        let text = report
            .skipped
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join("\n");
        tracing::warn!(
            source = %name,
            skipped = report.skipped.len(),
            "skipping objects of kinds Ballast does not implement:\n{text}"
        );
    }
}
