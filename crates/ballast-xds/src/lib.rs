//! `ballast-xds`: the Envoy xDS protocol side of Ballast, usable on its own.
//!
//! Resources are encoded once and shared; snapshots are published per group and
//! streams compute their own diffs. Nothing here knows about config kinds.
#![forbid(unsafe_code)]
