//! Several sources served as one (e.g. `--config` files plus `--etcd`).
//!
//! The pipeline reads one [`SourceState`]; [`MergedSource`] starts each part and publishes the
//! union of their last good configs whenever one changes. It is synced once every part is
//! (invariant 1: a half-loaded union is never served). An object defined by two parts is a
//! config error naming both places, like a duplicate within one source; the merged config then
//! stays at its last good union (invariant 8). Stale/revision come from the store-backed part.

use std::time::SystemTime;

use ballast_model::LoadReport;
use futures::future::select_all;
use tokio::sync::watch;

use crate::state::{Source, SourceState, merge_states};

/// The union of several sources.
pub struct MergedSource {
    parts: Vec<Box<dyn Source>>,
    name: String,
}

impl MergedSource {
    /// `names` are the parts' names, for the merged name (`a + b`).
    pub fn new(parts: Vec<(String, Box<dyn Source>)>) -> Self {
        let name = parts
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(" + ");
        MergedSource {
            parts: parts.into_iter().map(|(_, p)| p).collect(),
            name,
        }
    }
}

impl Source for MergedSource {
    fn start(self: Box<Self>) -> watch::Receiver<SourceState> {
        let (tx, rx) = watch::channel(SourceState::new(self.name.clone()));
        let parts: Vec<_> = self.parts.into_iter().map(|p| p.start()).collect();
        tokio::spawn(run(parts, tx));
        rx
    }
}

async fn run(mut parts: Vec<watch::Receiver<SourceState>>, tx: watch::Sender<SourceState>) {
    loop {
        let states: Vec<SourceState> = parts
            .iter_mut()
            .map(|p| p.borrow_and_update().clone())
            .collect();
        tx.send_if_modified(|merged| apply(merged, &states, SystemTime::now()));
        let changed = select_all(parts.iter_mut().map(|p| Box::pin(p.changed())));
        tokio::select! {
            _ = tx.closed() => return,
            (r, _, _) = changed => if r.is_err() {
                // A part stopped: nothing will change any more; keep serving what we have.
                tx.closed().await;
                return;
            },
        }
    }
}

/// Folds the parts' states into `merged`; returns whether anything visible changed.
fn apply(merged: &mut SourceState, parts: &[SourceState], now: SystemTime) -> bool {
    let mut changed = false;
    let stale_since = parts.iter().filter_map(|p| p.stale_since).min();
    let revision = parts.iter().filter_map(|p| p.revision).max();
    let store_error = parts.iter().find_map(|p| p.store_error.clone());
    let regressions = parts.iter().map(|p| p.revision_regressions).sum();
    let last_regression = parts
        .iter()
        .filter_map(|p| p.last_regression)
        .max_by_key(|r| r.at);
    if (
        merged.stale_since,
        merged.revision,
        &merged.store_error,
        merged.revision_regressions,
        merged.last_regression,
    ) != (
        stale_since,
        revision,
        &store_error,
        regressions,
        last_regression,
    ) {
        merged.stale_since = stale_since;
        merged.revision = revision;
        merged.store_error = store_error;
        merged.revision_regressions = regressions;
        merged.last_regression = last_regression;
        changed = true;
    }
    let held_apply = parts.iter().find_map(|p| p.held_apply);
    if merged.held_apply != held_apply {
        merged.held_apply = held_apply;
        changed = true;
    }
    if !parts.iter().all(|p| p.synced) {
        // Not ready: show the parts' errors, serve nothing new.
        let errors: Vec<_> = parts
            .iter()
            .filter_map(|p| p.last_error.as_deref())
            .flatten()
            .cloned()
            .collect();
        if !errors.is_empty() {
            changed |= merged.apply_failure(errors, now);
        }
        return changed;
    }
    let files = parts.iter().map(|p| p.files).sum();
    let mut report = LoadReport::default();
    for p in parts {
        report.errors.extend(p.report.errors.iter().cloned());
        report.skipped.extend(p.report.skipped.iter().cloned());
        report.rejected.extend(p.report.rejected.iter().cloned());
        report
            .held_files
            .extend(p.report.held_files.iter().cloned());
    }
    report.errors.sort();
    match merge_states(parts) {
        Ok(Some(set)) => changed |= merged.apply_load(set, files, report, now),
        Ok(None) => {}
        Err(mut errors) => {
            errors.extend(report.errors);
            errors.sort();
            errors.dedup();
            tracing::warn!(source = %merged.name, errors = errors.len(),
                first = %errors[0], "sources define the same object; keeping the last good merged config");
            changed |= merged.apply_failure(errors, now);
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StaticSource;
    use ballast_model::ConfigSet;

    fn backend(file: &str, name: &str) -> ConfigSet {
        ConfigSet::build([(
            file,
            format!(
                "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {{ name: {name} }}\nspec:\n  endpoints: [{{ address: 10.0.0.1, port: 80 }}]\n"
            ),
        )])
        .unwrap()
    }

    #[test]
    fn union_waits_for_every_part_and_keeps_last_good_on_duplicates() {
        let now = SystemTime::now();
        let mut merged = SourceState::new("m");
        let mut a = SourceState::new("a");
        let mut b = SourceState::new("b");
        a.apply_success(backend("a.yaml", "a"), 1, now);
        apply(&mut merged, &[a.clone(), b.clone()], now);
        assert!(!merged.synced && merged.config.is_none());

        b.apply_success(backend("etcd:/b", "b"), 1, now);
        b.revision = Some(7);
        assert!(apply(&mut merged, &[a.clone(), b.clone()], now));
        assert!(merged.synced);
        assert_eq!(
            (
                merged.config.as_ref().unwrap().len(),
                merged.files,
                merged.revision
            ),
            (2, 2, Some(7))
        );
        let generation = merged.generation;

        // b now also defines `a`: an error naming both places; the union stays.
        b.apply_success(backend("etcd:/a", "a"), 1, now);
        assert!(apply(&mut merged, &[a.clone(), b.clone()], now));
        assert_eq!(merged.generation, generation);
        assert_eq!(merged.config.as_ref().unwrap().len(), 2);
        let err = merged.last_error.as_ref().unwrap()[0].to_string();
        assert!(err.contains("duplicate") && err.contains("a.yaml"), "{err}");

        // Stale comes through from the store-backed part, and nothing else changes.
        b.apply_success(backend("etcd:/b", "b"), 1, now);
        b.stale_since = Some(now);
        assert!(apply(&mut merged, &[a, b], now));
        assert_eq!(merged.stale_since, Some(now));
        assert!(merged.last_error.is_none());
    }

    #[tokio::test]
    async fn started_merge_publishes_the_union() {
        let a = StaticSource::new("a", backend("a.yaml", "a"), 1);
        let b = StaticSource::new("b", backend("b.yaml", "b"), 1);
        let m = MergedSource::new(vec![("a".into(), Box::new(a)), ("b".into(), Box::new(b))]);
        let mut rx = Box::new(m).start();
        let s = rx.wait_for(|s| s.synced).await.unwrap().clone();
        assert_eq!(s.name, "a + b");
        assert_eq!(s.config.unwrap().len(), 2);
    }
}
