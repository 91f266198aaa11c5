//! `ballast-etcd`: the small etcd v3 client Ballast needs, with no build-time `protoc`.
//!
//! The official `etcd-client` crate generates its code from `.proto` files at build time, which
//! needs `protoc` on every machine that builds Ballast. This crate instead declares the handful
//! of etcd messages it uses with `prost` derives ([`pb`], field numbers from etcd's
//! `rpc.proto`/`kv.proto`) and calls them through `tonic::client::Grpc`.
//!
//! What it offers: a cloneable [`Client`] over several endpoints with failover, consistent
//! paginated listings at one revision ([`Client::list`]), put/delete/[`Txn`] with
//! version/revision compares, [`Watch`] streams that end with a matchable error
//! ([`Error::Compacted`] carries the compact revision), leases with keep-alive, member status
//! (leader id, revision) and compaction.
//!
//! Errors are [`Error`] values callers can match: [`Error::is_unavailable`] for "try again,
//! maybe elsewhere", [`Error::Compacted`] for "relist".
#![forbid(unsafe_code)]

mod client;
pub mod election;
mod error;
mod lease;
pub mod pb;
mod watch;

pub use client::{
    Client, ClientOptions, Compare, CompareOp, KeyRange, Lease, Listing, MemberStatus, Op,
    TlsOptions, Txn, TxnResult, prefix_end,
};
pub use election::{ElectionOptions, Leadership, campaign};
pub use error::Error;
pub use lease::LeaseKeepAlive;
pub use pb::KeyValue;
pub use watch::{EventKind, Watch, WatchBatch, WatchEvent, WatchOptions};
