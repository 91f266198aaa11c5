//! `ballast-testkit`: real parts for tests — Envoy processes, upstreams, traffic, flaky links.
#![forbid(unsafe_code)]
