//! Gateway API `BackendTLSPolicy` (`gateway.networking.k8s.io/v1alpha3`, also served as `v1`):
//! TLS from Envoy to the Backends (Services) it targets, verifying the backend's certificate
//! against CA bundles from ConfigMaps (`ca.crt`) or TLS Secrets (`ca.crt`) and `hostname`
//! (SNI, and the SAN to match unless `subjectAltNames` are given).

use serde::Deserialize;

use super::policy::{PolicyTargetRef, TargetKind, validate_target_refs};
use super::{Metadata, Source, object_kind};
use crate::spanned::{Pos, Spanned};
use crate::validate::Ctx;

#[derive(Clone, Debug)]
pub struct BackendTlsPolicy {
    pub metadata: Metadata,
    pub spec: BackendTlsPolicySpec,
    pub source: Source,
}
object_kind!(BackendTlsPolicy, super::Kind::BackendTlsPolicy);

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackendTlsPolicySpec {
    pub target_refs: Vec<PolicyTargetRef>,
    pub validation: BackendTlsValidation,
    /// Implementation-specific options; none are recognised yet.
    #[serde(default)]
    pub options: std::collections::BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackendTlsValidation {
    #[serde(default)]
    pub ca_certificate_refs: Vec<LocalObjectRef>,
    #[serde(default, rename = "wellKnownCACertificates")]
    pub well_known_ca_certificates: Option<Spanned<String>>,
    /// SNI sent to the backend, and the name its certificate must carry.
    pub hostname: Spanned<String>,
    #[serde(default)]
    pub subject_alt_names: Vec<SubjectAltName>,
}

/// A reference to a ConfigMap or Secret in the policy's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LocalObjectRef {
    #[serde(default)]
    pub group: String,
    pub kind: Spanned<String>,
    pub name: Spanned<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubjectAltName {
    #[serde(rename = "type")]
    pub type_: Spanned<SanKind>,
    #[serde(default)]
    pub hostname: Option<Spanned<String>>,
    #[serde(default)]
    pub uri: Option<Spanned<String>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum SanKind {
    Hostname,
    #[serde(rename = "URI")]
    Uri,
}

/// What a BackendTLSPolicy may target.
pub const BACKEND_TLS_POLICY_TARGETS: [TargetKind; 2] = [TargetKind::Backend, TargetKind::Service];

pub(crate) fn validate_backend_tls_policy(ctx: &mut Ctx, p: &BackendTlsPolicy) {
    crate::validate::metadata(ctx, &p.metadata);
    validate_target_refs(ctx, &p.spec.target_refs, &BACKEND_TLS_POLICY_TARGETS);
    let v = &p.spec.validation;
    if let Err(e) = crate::hostname::validate_hostname(&v.hostname) {
        ctx.err(v.hostname.pos, "spec.validation.hostname", e.to_string());
    } else if v.hostname.starts_with("*.") {
        ctx.err(
            v.hostname.pos,
            "spec.validation.hostname",
            "hostname must not be a wildcard",
        );
    }
    if let Some(w) = &v.well_known_ca_certificates {
        ctx.err(
            w.pos,
            "spec.validation.wellKnownCACertificates",
            "wellKnownCACertificates is not supported by Ballast; use caCertificateRefs",
        );
    } else if v.ca_certificate_refs.is_empty() {
        ctx.err(
            Pos::UNKNOWN,
            "spec.validation.caCertificateRefs",
            "caCertificateRefs must name at least one ConfigMap or Secret",
        );
    }
    for (i, r) in v.ca_certificate_refs.iter().enumerate() {
        if !r.group.is_empty() || !matches!(r.kind.as_str(), "ConfigMap" | "Secret") {
            ctx.err(
                r.kind.pos,
                format!("spec.validation.caCertificateRefs[{i}].kind"),
                format!(
                    "unsupported kind {:?} (group {:?}); expected core ConfigMap or Secret",
                    r.kind.value, r.group
                ),
            );
        }
    }
    for (i, s) in v.subject_alt_names.iter().enumerate() {
        let f = format!("spec.validation.subjectAltNames[{i}]");
        let (want, other) = match *s.type_ {
            SanKind::Hostname => (s.hostname.is_some(), s.uri.is_some()),
            SanKind::Uri => (s.uri.is_some(), s.hostname.is_some()),
        };
        if !want || other {
            ctx.err(
                s.type_.pos,
                f,
                "type Hostname needs exactly field hostname, type URI exactly field uri",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ConfigSet;

    fn doc(version: &str, ca_ref: &str, hostname: &str) -> String {
        format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {{ name: api }}\nspec: {{}}\n---\n\
             apiVersion: {version}\nkind: BackendTLSPolicy\nmetadata: {{ name: t }}\nspec:\n  \
             targetRefs: [{{ group: ballast.dev, kind: Backend, name: api }}]\n  validation:\n    \
             caCertificateRefs: [{{ group: \"\", kind: ConfigMap, name: {ca_ref} }}]\n    hostname: {hostname}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {{ name: ca }}\ndata:\n  ca.crt: \"-----BEGIN CERTIFICATE-----\\nMIIB\\n-----END CERTIFICATE-----\\n\"\n"
        )
    }

    #[test]
    fn both_api_versions_resolve_ca_and_report_missing_refs() {
        for v in [
            "gateway.networking.k8s.io/v1alpha3",
            "gateway.networking.k8s.io/v1",
        ] {
            let set = ConfigSet::build([("t.yaml", doc(v, "ca", "api.internal"))]).unwrap();
            let p = set
                .backend_tls_policy_for(&crate::ObjectKey::new("default", "api"))
                .expect("applies");
            assert!(set.backend_tls_ca(p).unwrap().contains("MIIB"));
        }
        let set = ConfigSet::build([(
            "t.yaml",
            doc("gateway.networking.k8s.io/v1", "nope", "api.internal"),
        )])
        .unwrap();
        let problems = crate::status::compute(&set).problems();
        assert!(
            problems.iter().any(|p| p.contains(
                "BackendTLSPolicy default/t: target Backend default/api: ResolvedRefs=False InvalidCACertificateRef: ConfigMap default/nope not found"
            )),
            "{problems:#?}"
        );
        let errs = ConfigSet::build([(
            "t.yaml",
            doc("gateway.networking.k8s.io/v1", "ca", "\"*.internal\""),
        )])
        .unwrap_err();
        assert_eq!(
            errs[0].to_string(),
            "t.yaml:13:15: BackendTLSPolicy default/t: spec.validation.hostname: hostname must not be a wildcard"
        );
    }
}
