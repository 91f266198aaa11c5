//! `ballast-sources`: where config comes from (file directories today; etcd, Kubernetes later).
//!
//! A [`Source`] runs on the tokio runtime and publishes a [`SourceState`] through a
//! `tokio::sync::watch` channel: the last known good [`ConfigSet`](ballast_model::ConfigSet),
//! whether the initial sync has finished, and the errors of the latest attempt. Everything
//! downstream (store, translation, readiness, `/debug/sources`) reads only that state; a source
//! never reaches into its consumers (docs/architecture.md §1).
//!
//! The guarantees every source keeps:
//! - **Last known good** (invariant 8): a load that fails in any way leaves `config` and
//!   `generation` untouched and records every error, with file:line:col, in `last_error`.
//! - **Atomic**: a published config is always the result of one complete load of all inputs,
//!   never a mix of old and new files.
//! - **Ready before serving** (invariant 1): `synced` turns true only with the first good load.
//! - **No churn**: a load that gives the same config as the current one publishes nothing new.
//!
//! Several `--config` paths are best given to *one* [`FileSource`]: it loads them as a single
//! consistent set (one atomic reload across all paths, a file named twice is read once, and a
//! duplicate object is an ordinary config error). [`merge_states`] exists for combining
//! different sources (e.g. files plus, later, etcd) into one set.
#![forbid(unsafe_code)]

pub mod file;
mod state;

pub use file::{FileSource, FileSourceOptions, load_paths};
pub use state::{Source, SourceState, StaticSource, merge_states};
