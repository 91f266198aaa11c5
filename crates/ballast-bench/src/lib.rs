//! `ballast-bench`: a fleet of simulated xDS clients that behave like Envoy
//! (SotW, Delta, REST), a harness running the `ballast-xds` server in-process
//! or as a child process, and the benchmark scenarios of the benchmark issue.
//!
//! - [`client`]: one simulated proxy per protocol, sharing view bookkeeping.
//! - [`fleet`]: many clients, the expected config and the change log.
//! - [`server`]: the server under test and `serve-snapshot`.
//! - [`workload`]: the deterministic config and its changes.
//! - [`scenarios`]: W1, W2, W8 and `--smoke`.
//! - [`measure`], [`report`]: `/proc` numbers, percentiles, JSON and Markdown.
#![forbid(unsafe_code)]

pub mod client;
pub mod fleet;
pub mod measure;
pub mod report;
pub mod scenarios;
pub mod server;
pub mod workload;
