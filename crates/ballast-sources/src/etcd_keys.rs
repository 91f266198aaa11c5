//! The etcd key layout, shared by the etcd source, `ballast apply/get/delete` and the catalog.
//!
//! Under a prefix (default `/ballast/`):
//! - `<prefix><kind>/<namespace>/<name>`: one config object (YAML or JSON of that one object),
//!   `<kind>` the lowercase plural kind (`gateways`, `httproutes`, `backends`, `secrets`), the
//!   convention of the etcd source's docs;
//! - `<prefix>_catalog/<namespace>/<backend>/<id>`: a live endpoint registration, bound to a lease;
//! - anything else whose first segment starts with `_` is Ballast's own bookkeeping, never config.
//!
//! One place decides the layout so that what `ballast apply` writes is what every replica reads.

use ballast_model::{Kind, ObjectKey};

/// The default `--etcd-prefix`.
pub use crate::etcd::DEFAULT_PREFIX;

/// The key segment of a kind.
pub fn kind_segment(kind: Kind) -> &'static str {
    match kind {
        Kind::Gateway => "gateways",
        Kind::HttpRoute => "httproutes",
        Kind::Backend => "backends",
        Kind::Secret => "secrets",
        Kind::BackendPolicy => "backendpolicies",
        Kind::ConfigMap => "configmaps",
        Kind::BackendTlsPolicy => "backendtlspolicies",
        Kind::ClientPolicy => "clientpolicies",
        Kind::GrpcRoute => "grpcroutes",
        Kind::Service => "services",
        Kind::EndpointSlice => "endpointslices",
        Kind::ReferenceGrant => "referencegrants",
        Kind::Namespace => "namespaces",
        Kind::TlsRoute => "tlsroutes",
        Kind::TcpRoute => "tcproutes",
        Kind::RateLimitPolicy => "ratelimitpolicies",
        Kind::SecurityPolicy => "securitypolicies",
    }
}

/// `<prefix><kind>/`: every object of one kind.
pub fn kind_prefix(prefix: &str, kind: Kind) -> String {
    format!("{prefix}{}/", kind_segment(kind))
}

/// `<prefix><kind>/<namespace>/<name>`.
pub fn object_key(prefix: &str, kind: Kind, key: &ObjectKey) -> String {
    format!(
        "{prefix}{}/{}/{}",
        kind_segment(kind),
        key.namespace,
        key.name
    )
}

/// The kind and object a config key names, or `None` for keys that are not config (bookkeeping
/// under `_`, or not of the layout).
pub fn parse_object_key(prefix: &str, key: &str) -> Option<(Kind, ObjectKey)> {
    let rest = key.strip_prefix(prefix)?;
    let mut parts = rest.splitn(3, '/');
    let (kind, ns, name) = (parts.next()?, parts.next()?, parts.next()?);
    let kind = Kind::ALL.into_iter().find(|k| kind_segment(*k) == kind)?;
    if ns.is_empty() || name.is_empty() || name.contains('/') {
        return None;
    }
    Some((kind, ObjectKey::new(ns, name)))
}

/// Whether a key under `prefix` holds config (not `_catalog/`, `_state/`, ...).
pub fn is_config_key(prefix: &str, key: &str) -> bool {
    key.strip_prefix(prefix)
        .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('_'))
}

/// `<prefix>_catalog/`: every registration.
pub fn catalog_prefix(prefix: &str) -> String {
    format!("{prefix}_catalog/")
}

/// `<prefix>_catalog/<namespace>/<backend>/<id>`.
pub fn registration_key(prefix: &str, backend: &ObjectKey, id: &str) -> String {
    format!(
        "{prefix}_catalog/{}/{}/{id}",
        backend.namespace, backend.name
    )
}

/// The Backend and id a registration key names.
pub fn parse_registration_key(prefix: &str, key: &str) -> Option<(ObjectKey, String)> {
    let rest = key.strip_prefix(&catalog_prefix(prefix))?;
    let mut parts = rest.splitn(3, '/');
    let (ns, name, id) = (parts.next()?, parts.next()?, parts.next()?);
    if ns.is_empty() || name.is_empty() || id.is_empty() {
        return None;
    }
    Some((ObjectKey::new(ns, name), id.to_owned()))
}

/// `<prefix>_meta/config`: touched by every `ballast apply` and `ballast delete`, so that a
/// transaction guarded on it also notices deletions (a range compare sees only live keys).
pub fn config_marker_key(prefix: &str) -> String {
    format!("{prefix}_meta/config")
}

/// `<prefix>_meta/apply`: exists while a `ballast apply` too large for one etcd transaction
/// is being written in several. Readers hold what they see from its creation until the
/// transaction that deletes it and touches [`config_marker_key`] (the commit), so an apply
/// is all-or-nothing for them; deleted alone (the apply died or gave up: its lease expired or
/// was revoked), readers keep holding until the next commit of any apply or delete.
pub fn apply_marker_key(prefix: &str) -> String {
    format!("{prefix}_meta/apply")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        for kind in Kind::ALL {
            let k = ObjectKey::new("ns", "a.b");
            let key = object_key(DEFAULT_PREFIX, kind, &k);
            assert!(key.starts_with(&kind_prefix(DEFAULT_PREFIX, kind)));
            assert!(is_config_key(DEFAULT_PREFIX, &key));
            assert_eq!(parse_object_key(DEFAULT_PREFIX, &key), Some((kind, k)));
        }
        assert_eq!(
            object_key("/p/", Kind::HttpRoute, &ObjectKey::new("default", "r")),
            "/p/httproutes/default/r"
        );
        let b = ObjectKey::new("default", "api");
        let r = registration_key(DEFAULT_PREFIX, &b, "i-1");
        assert_eq!(r, "/ballast/_catalog/default/api/i-1");
        assert!(!is_config_key(DEFAULT_PREFIX, &r));
        assert!(!is_config_key(
            DEFAULT_PREFIX,
            &config_marker_key(DEFAULT_PREFIX)
        ));
        assert_eq!(
            parse_registration_key(DEFAULT_PREFIX, &r),
            Some((b, "i-1".into()))
        );
        assert_eq!(parse_object_key(DEFAULT_PREFIX, "/ballast/pod/a/b"), None);
        assert_eq!(
            parse_object_key(DEFAULT_PREFIX, "/ballast/gateways/a"),
            None
        );
    }
}
