//! `ballast-sources`: where config comes from (file directories today; etcd, Kubernetes later).
#![forbid(unsafe_code)]
