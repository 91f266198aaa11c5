//! `ballast-bench`: a fleet of simulated xDS clients that behave like Envoy
//! (SotW, Delta, REST), a harness running the `ballast-xds` server in-process
//! or as a child process, and the benchmark scenarios of the benchmark issue.
//!
//! - [`client`]: one simulated proxy per protocol, sharing view bookkeeping.
//! - [`fleet`]: many clients, the expected config and the change log.
//! - [`server`]: the server under test and `serve-snapshot`.
//! - [`workload`]: the deterministic config and its changes.
//! - [`scenarios`]: W1–W8, W10, `compare-sovereign`, `envoy-lane`, `scaling` and `--smoke`.
//! - [`external`], [`gwconfig`], [`sovereign`], [`proc`]: the real `ballast`
//!   binary and sovereign as servers under test.
//! - [`svg`]: line plots for the scaling curves.
//! - [`measure`], [`report`]: `/proc` numbers, percentiles, JSON and Markdown.
#![forbid(unsafe_code)]

pub mod client;
pub mod external;
pub mod fleet;
pub mod gwconfig;
pub mod measure;
pub mod proc;
pub mod report;
pub mod scenarios;
pub mod server;
pub mod sovereign;
pub mod svg;
pub mod workload;
