//! `ballast-sources`: where config comes from (file directories and etcd; Kubernetes later).
//!
//! A [`Source`] runs on the tokio runtime and publishes a [`SourceState`] through a
//! `tokio::sync::watch` channel: the last known good [`ConfigSet`](ballast_model::ConfigSet),
//! whether the initial sync has finished, and the errors of the latest attempt. Everything
//! downstream (store, translation, readiness, `/debug/sources`) reads only that state; a source
//! never reaches into its consumers (docs/architecture.md §1).
//!
//! The guarantees every source keeps:
//! - **Last known good, per object** (invariant 8): an invalid object keeps its last good
//!   version (a never-valid one is not served), a file with a YAML syntax error keeps its last
//!   good objects, and every other change of the same load applies; every error, with
//!   file:line:col, is in `last_error` and per object in `report`. Kinds Ballast does not
//!   implement are skipped (`report.skipped`). A load that cannot see all its inputs (a
//!   configured path missing) leaves `config` and `generation` untouched.
//! - **Atomic**: a published config is always the result of one complete load of all inputs,
//!   never a mix of old and new files.
//! - **Ready before serving** (invariant 1): `synced` turns true with the first load that saw
//!   all its inputs, whatever errors individual objects have.
//! - **No churn**: a load that gives the same config as the current one publishes nothing new.
//!
//! Several `--config` paths are best given to *one* [`FileSource`]: it loads them as a single
//! consistent set (one atomic reload across all paths, a file named twice is read once, and a
//! duplicate object is an ordinary config error). [`MergedSource`] (built on [`merge_states`])
//! combines different sources (files plus etcd) into one.
#![forbid(unsafe_code)]

pub mod catalog;
pub mod etcd;
pub mod etcd_keys;
pub mod file;
pub mod last_good;
mod merge;
mod state;

pub use etcd::{EtcdSource, EtcdSourceOptions};
pub use file::{
    FileSource, FileSourceOptions, Loaded, load_paths, load_paths_report, read_config_files,
};
pub use merge::MergedSource;
pub use state::{HeldApply, RevisionRegression, Source, SourceState, StaticSource, merge_states};
