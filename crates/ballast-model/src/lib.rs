//! `ballast-model`: config kinds, YAML parsing with positions, validation.
//! Knows nothing of protobuf or Envoy.
#![forbid(unsafe_code)]
