//! `ballast apply`, `get`, `delete` and `diff` against etcd.
pub mod plan;
