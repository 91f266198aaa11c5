//! `ballast-model`: the config kinds of docs/configuration.md (Gateway API `Gateway` and
//! `HTTPRoute`, ballast's `Backend`, TLS `Secret`), multi-document YAML parsing with
//! file:line:col positions, validation, the [`ConfigSet`] of all objects, and Gateway API status.
//!
//! It knows nothing of protobuf or Envoy: translation turns a valid [`ConfigSet`] into Envoy
//! resources elsewhere. Everything here is deterministic (`BTreeMap`s, sorted errors), so the
//! same files give the same set and the same messages on every replica.
//!
//! Invalid input never enters a `ConfigSet` (last known good, per object, invariant 8 in
//! docs/architecture.md): an invalid object is an error and [`ConfigSet::assemble`] keeps its
//! previous version; kinds Ballast does not implement are skipped with a warning; *unresolved
//! references* between valid objects (a route to a missing Backend) load fine and are reported
//! as status, as in Gateway API.
#![forbid(unsafe_code)]

pub mod attach;
pub mod duration;
pub mod error;
pub mod hostname;
pub mod kinds;
pub mod parse;
pub mod set;
pub mod spanned;
pub mod status;
mod validate;

pub use duration::{DurationError, format_duration, parse_duration};
pub use error::{ConfigError, ConfigErrors, ObjectRef};
pub use hostname::{ANY_HOST, effective_hostnames, hostname_matches, intersect, validate_hostname};
pub use kinds::*;
pub use parse::{
    DocIndex, parse_document_report, parse_file, parse_file_report, parse_file_report_reusing,
    split_yaml_documents,
};
pub use set::{
    Assembler, ConfigSet, FileParse, LoadReport, ObjectId, ObjectMap, Rejected, Skipped,
};
pub use spanned::{Pos, Spanned};
pub use validate::MAX_WEIGHT;

#[cfg(test)]
mod docs_tests {
    use super::*;

    const DOCS: &str = include_str!("../../../docs/configuration.md");

    fn yaml_blocks() -> Vec<(usize, &'static str)> {
        let mut out = Vec::new();
        let mut rest = DOCS;
        while let Some(start) = rest.find("```yaml\n") {
            let body = &rest[start + 8..];
            let end = body.find("```").expect("unterminated yaml block");
            let line = DOCS.len() - rest.len() + start;
            out.push((DOCS[..line].lines().count() + 2, &body[..end]));
            rest = &body[end..];
        }
        out
    }

    /// Every example in docs/configuration.md is valid, and together they form a valid set.
    #[test]
    fn documentation_examples_parse() {
        let blocks = yaml_blocks();
        assert!(blocks.len() >= 7, "found {} examples", blocks.len());
        let files: Vec<(String, &str)> = blocks
            .iter()
            .map(|(line, text)| (format!("configuration.md@{line}"), *text))
            .collect();
        for (name, text) in &files {
            if let Err(es) = parse_file(name, text) {
                panic!(
                    "{}",
                    es.iter()
                        .map(|e| e.to_string())
                        .collect::<Vec<_>>()
                        .join("\n")
                );
            }
        }
        let set = ConfigSet::build(files).expect("examples conflict");
        assert_eq!(
            (
                set.gateways.len(),
                set.http_routes.len(),
                set.backends.len(),
                set.secrets.len(),
                set.services.len(),
                set.endpoint_slices.len(),
                set.reference_grants.len(),
                set.namespaces.len(),
                set.tls_routes.len(),
                set.tcp_routes.len()
            ),
            (4, 6, 2, 2, 2, 1, 1, 1, 1, 1)
        );
        // No example uses the deprecated backendRef shorthand.
        let status = crate::status::compute(&set);
        let refs: Vec<String> = status
            .problems()
            .into_iter()
            .filter(|p| p.contains("without group/kind"))
            .collect();
        assert!(refs.is_empty(), "{refs:#?}");
    }
}

#[cfg(test)]
mod policy_docs_tests {
    use super::*;

    const DOCS: &str = include_str!("../../../docs/policies.md");

    /// Every example in docs/policies.md is valid, and together they form a valid set.
    #[test]
    fn policy_examples_parse() {
        let mut files = Vec::new();
        let mut rest = DOCS;
        while let Some(start) = rest.find("```yaml\n") {
            let body = &rest[start + 8..];
            let end = body.find("```").expect("unterminated yaml block");
            files.push((format!("policies.md#{}", files.len()), &body[..end]));
            rest = &body[end..];
        }
        assert!(files.len() >= 4, "found {} examples", files.len());
        for (name, text) in &files {
            if let Err(es) = parse_file(name, text) {
                panic!(
                    "{}",
                    es.iter()
                        .map(|e| e.to_string())
                        .collect::<Vec<_>>()
                        .join("\n")
                );
            }
        }
        let set = ConfigSet::build(files).expect("examples conflict");
        assert_eq!(
            (
                set.backend_policies.len(),
                set.backend_tls_policies.len(),
                set.client_policies.len(),
                set.config_maps.len(),
                set.security_policies.len()
            ),
            (5, 1, 3, 2, 5)
        );
        // The SecurityPolicy examples resolve their local JWKS (the Backends are elsewhere).
        for p in set.security_policies.values() {
            for pr in p.spec.jwt.iter().flat_map(|j| &j.providers) {
                if pr.local_jwks.is_some() {
                    set.security_jwks(p, pr).unwrap();
                }
            }
        }
    }
}
