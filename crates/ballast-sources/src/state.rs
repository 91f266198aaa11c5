//! The state a source publishes, the [`Source`] trait, and merging several sources' states.

use std::sync::Arc;
use std::time::SystemTime;

use ballast_model::{ConfigError, ConfigErrors, ConfigSet, LoadReport};
use tokio::sync::watch;

/// The state a source publishes: last known good config and sync status.
///
/// Consumers react to `generation` (a new good config) and to `synced`; the other fields are for
/// humans (`/debug/sources`, logs, metrics). A rejected load changes `last_error` and
/// `last_attempt` but never `config` or `generation`.
#[derive(Clone, Debug)]
pub struct SourceState {
    /// Human-readable identity, e.g. `file:/etc/ballast`.
    pub name: String,
    /// The initial sync finished successfully (stays true afterwards, even if later loads fail:
    /// the last known good config is still there to serve).
    pub synced: bool,
    /// Last known good config; `None` until the first good load.
    pub config: Option<Arc<ConfigSet>>,
    /// Bumps on every new good config (0 means none yet). Unchanged by rejected or no-op loads.
    pub generation: u64,
    /// Errors of the latest attempt, sorted by file and position; `None` if it had none. With
    /// per-object last known good a load can apply *and* have errors (invalid objects kept at
    /// their last good version, see `report`).
    pub last_error: Option<Arc<Vec<ConfigError>>>,
    /// What the latest applied load rejected (per object, with the version still served),
    /// held (files kept whole) and skipped (kinds Ballast does not implement).
    pub report: Arc<LoadReport>,
    pub last_attempt: Option<SystemTime>,
    pub last_success: Option<SystemTime>,
    /// Files (or etcd keys) in the last good config.
    pub files: usize,
    /// For a store-backed source (etcd): the store revision the config reflects.
    pub revision: Option<i64>,
    /// For a store-backed source: since when the store has been unreachable (`None` while
    /// connected). The last good config is still served meanwhile, and a synced source stays
    /// synced (ready).
    pub stale_since: Option<SystemTime>,
    /// Why the store is unreachable (the latest connection error), while stale or before the
    /// first sync.
    pub store_error: Option<String>,
    /// For a store-backed source: how often the store was found at a lower revision than the
    /// one the config reflected (etcd restored from an older backup). Each was relisted and
    /// reconciled by keep-set.
    pub revision_regressions: u64,
    /// The latest such regression.
    pub last_regression: Option<RevisionRegression>,
    /// For etcd: an apply written in several transactions is open (or was abandoned); its
    /// changes are held, the config of before it is served, until it commits.
    pub held_apply: Option<HeldApply>,
}

/// An apply of several transactions, opened at store revision `opened`; `abandoned` once its
/// marker expired without a commit (held until the next apply or delete commits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldApply {
    pub opened: i64,
    pub abandoned: bool,
}

/// The store went back: the config reflected revision `from`, the store is now at `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RevisionRegression {
    pub from: i64,
    pub to: i64,
    pub at: SystemTime,
}

impl SourceState {
    /// The state before anything was loaded.
    pub fn new(name: impl Into<String>) -> Self {
        SourceState {
            name: name.into(),
            synced: false,
            config: None,
            generation: 0,
            last_error: None,
            report: Arc::default(),
            last_attempt: None,
            last_success: None,
            files: 0,
            revision: None,
            stale_since: None,
            store_error: None,
            revision_regressions: 0,
            last_regression: None,
            held_apply: None,
        }
    }

    /// Records a successful load of `set` from `files` files at `now`. Returns whether anything a
    /// consumer acts on changed (a new generation, `synced`, or a cleared error); a load equal to
    /// the current config only refreshes the timestamps, so it wakes no one (no churn).
    ///
    /// "Equal" includes each object's file and position, not just content: a moved object gets
    /// a new generation (with an empty `ConfigSet::diff`) so status messages point at the
    /// right line; an identical rewrite does not.
    pub fn apply_success(&mut self, set: ConfigSet, files: usize, now: SystemTime) -> bool {
        self.apply_load(set, files, LoadReport::default(), now)
    }

    /// Records a load assembled per object ([`ConfigSet::assemble`]): `set` is served (it
    /// already holds the last good version of every invalid object) and the source is synced
    /// even if the report has errors, so one bad object never holds readiness hostage
    /// (invariant 8). `last_success` moves only for a load without errors. Returns whether
    /// anything a consumer or a human acts on changed (same rules as [`Self::apply_success`]).
    pub fn apply_load(
        &mut self,
        set: ConfigSet,
        files: usize,
        report: LoadReport,
        now: SystemTime,
    ) -> bool {
        self.last_attempt = Some(now);
        let mut changed = false;
        if !self.synced {
            self.synced = true;
            changed = true;
        }
        let same = self
            .config
            .as_deref()
            .is_some_and(|current| same_config(current, &set));
        if !same {
            self.config = Some(Arc::new(set));
            self.generation += 1;
            changed = true;
        }
        self.files = files;
        if report.errors.is_empty() {
            self.last_success = Some(now);
            changed |= self.last_error.take().is_some();
        } else if self.last_error.as_deref() != Some(&report.errors) {
            self.last_error = Some(Arc::new(report.errors.clone()));
            changed = true;
        }
        if *self.report != report {
            self.report = Arc::new(report);
            changed = true;
        }
        changed
    }

    /// Records a rejected load: the config stays the last known good. Returns whether anything
    /// visible changed (the errors differ from the previous attempt's).
    pub fn apply_failure(&mut self, errors: Vec<ConfigError>, now: SystemTime) -> bool {
        self.last_attempt = Some(now);
        let changed = self.last_error.as_deref() != Some(&errors);
        if changed {
            // The same errors keep their `Arc`: a consumer counting error reports by identity
            // (the errors metric) counts each new set of errors once.
            self.last_error = Some(Arc::new(errors));
        }
        changed
    }
}

/// Content and positions equal (see [`SourceState::apply_success`]).
fn same_config(a: &ConfigSet, b: &ConfigSet) -> bool {
    a == b
        && a.objects()
            .map(|o| o.source().clone())
            .eq(b.objects().map(|o| o.source().clone()))
}

/// A config source: files, later etcd or Kubernetes.
pub trait Source: Send + 'static {
    /// Starts the source on the current tokio runtime; the state is published through `watch`.
    /// The source stops when every receiver is dropped.
    fn start(self: Box<Self>) -> watch::Receiver<SourceState>;
}

/// A source with a fixed config, synced from the start (the built-in quickstart config, tests).
#[derive(Clone, Debug)]
pub struct StaticSource {
    state: SourceState,
}

impl StaticSource {
    pub fn new(name: impl Into<String>, set: ConfigSet, files: usize) -> Self {
        let mut state = SourceState::new(name);
        state.apply_success(set, files, SystemTime::now());
        StaticSource { state }
    }

    /// Parses `(path for messages, text)` pairs, e.g. config compiled into the binary.
    pub fn from_files<P: AsRef<str>, T: AsRef<str>>(
        name: impl Into<String>,
        files: impl IntoIterator<Item = (P, T)>,
    ) -> Result<Self, Vec<ConfigError>> {
        let files: Vec<(P, T)> = files.into_iter().collect();
        let n = files.len();
        Ok(StaticSource::new(name, ConfigSet::build(files)?, n))
    }
}

impl Source for StaticSource {
    /// Panics outside a tokio runtime, like every source.
    fn start(self: Box<Self>) -> watch::Receiver<SourceState> {
        // The sender lives as long as any receiver: consumers treat a closed channel as the
        // source having stopped, and this one never stops, it just never changes.
        let (tx, rx) = watch::channel(self.state);
        tokio::spawn(async move { tx.closed().await });
        rx
    }
}

/// Merges several sources' last good configs into one set.
///
/// `Ok(None)` while any source has no good config yet (the merged config would be partial, so
/// nothing may be served from it). An object defined by two sources is an error, like a
/// duplicate within one source; the caller keeps its previous merged set then (last known good).
pub fn merge_states<'a>(
    states: impl IntoIterator<Item = &'a SourceState>,
) -> Result<Option<ConfigSet>, Vec<ConfigError>> {
    let mut sets = Vec::new();
    for s in states {
        match &s.config {
            Some(c) => sets.push(c.clone()),
            None => return Ok(None),
        }
    }
    if sets.len() == 1 {
        return Ok(Some((*sets[0]).clone()));
    }
    ConfigSet::from_objects(sets.iter().flat_map(|s| s.objects()))
        .map(Some)
        .map_err(ConfigErrors::into_vec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(file: &str, name: &str, port: u16) -> ConfigSet {
        ConfigSet::build([(
            file,
            format!(
                "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {{ name: {name} }}\nspec:\n  endpoints: [{{ address: 10.0.0.1, port: {port} }}]\n"
            ),
        )])
        .unwrap()
    }

    #[test]
    fn success_failure_and_no_churn() {
        let now = SystemTime::now();
        let mut s = SourceState::new("t");
        assert!(s.apply_success(backend("a.yaml", "a", 80), 1, now));
        assert_eq!((s.synced, s.generation), (true, 1));
        // Same content and positions: nothing to tell anyone.
        assert!(!s.apply_success(backend("a.yaml", "a", 80), 1, now));
        assert_eq!(s.generation, 1);
        // Failure keeps the config; the same failure again is no news.
        let err = ballast_model::parse_file("x.yaml", "apiVersion: v1\n")
            .unwrap_err()
            .into_vec();
        assert!(s.apply_failure(err.clone(), now));
        assert!(!s.apply_failure(err, now));
        assert_eq!(s.generation, 1);
        assert!(s.config.is_some());
        // Same config again clears the error (visible) without a new generation.
        assert!(s.apply_success(backend("a.yaml", "a", 80), 1, now));
        assert_eq!((s.generation, s.last_error.is_none()), (1, true));
        // Moving the object to another file is a new generation (positions changed).
        assert!(s.apply_success(backend("b.yaml", "a", 80), 1, now));
        assert_eq!(s.generation, 2);
        assert!(s.apply_success(backend("b.yaml", "a", 81), 1, now));
        assert_eq!(s.generation, 3);
    }

    #[test]
    fn load_with_errors_syncs_and_reports_once() {
        let now = SystemTime::now();
        let mut s = SourceState::new("t");
        let text = "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: { name: a }\nspec:\n  endpoints: [{ address: 10.0.0.1, port: 0 }]\n";
        let parse = || {
            [(
                Arc::from("a.yaml"),
                ballast_model::parse_file_report("a.yaml", text),
            )]
        };
        let (set, report) = ConfigSet::assemble(None, parse());
        assert!(s.apply_load(set, 1, report.clone(), now));
        assert!(s.synced, "one invalid object does not hold the sync");
        assert_eq!((s.generation, s.last_success), (1, None));
        let first = s.last_error.clone().unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(*s.report, report);
        // The same load again: nothing new, and the errors keep their identity.
        let (set, report) = ConfigSet::assemble(s.config.as_deref(), parse());
        assert!(!s.apply_load(set, 1, report, now));
        assert!(Arc::ptr_eq(&first, s.last_error.as_ref().unwrap()));
        // A clean load clears errors and the report.
        assert!(s.apply_success(backend("a.yaml", "a", 80), 1, now));
        assert!(s.last_error.is_none() && s.report.rejected.is_empty());
        assert_eq!(s.generation, 2);
    }

    #[test]
    fn merge_needs_all_sources_and_rejects_duplicates() {
        let now = SystemTime::now();
        let mut a = SourceState::new("a");
        let mut b = SourceState::new("b");
        a.apply_success(backend("a.yaml", "a", 80), 1, now);
        assert!(merge_states([&a, &b]).unwrap().is_none());
        b.apply_success(backend("b.yaml", "b", 80), 1, now);
        assert_eq!(merge_states([&a, &b]).unwrap().unwrap().len(), 2);
        b.apply_success(backend("b.yaml", "a", 80), 1, now);
        let errs = merge_states([&a, &b]).unwrap_err();
        assert_eq!(
            errs[0].to_string(),
            "b.yaml:1:1: Backend default/a: duplicate: also defined at a.yaml:1:1"
        );
    }

    #[tokio::test]
    async fn static_source_is_synced() {
        let src = StaticSource::from_files("builtin", [("q.yaml", "")]).unwrap();
        let mut rx = Box::new(src).start();
        {
            let s = rx.borrow();
            assert!(s.synced && s.config.is_some() && s.generation == 1);
        }
        // Still open: a consumer waiting for changes waits, it is not told the source stopped.
        let waited = tokio::time::timeout(std::time::Duration::from_millis(50), rx.changed()).await;
        assert!(waited.is_err());
    }
}
