//! `ballast-translate`: pure functions from a `ConfigSet` to Envoy resources per gateway.
#![forbid(unsafe_code)]
