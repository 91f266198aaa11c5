//! The config kinds (docs/configuration.md). Field names follow Gateway API / Kubernetes
//! (camelCase) because they are the interface: the same manifests must load in Kubernetes.
//!
//! The structs are what the YAML deserializes into (with `deny_unknown_fields`), after
//! [`crate::parse`] has filled in Gateway API defaults and [`crate::validate`] has checked them.
//! A value of these types inside a [`crate::ConfigSet`] is therefore valid.

pub mod access_log;
pub mod backend;
pub mod backend_tls;
pub mod client_policy;
pub mod configmap;
pub mod gateway;
pub mod grpcroute;
pub mod l4route;
pub mod namespace;
pub mod policy;
pub mod rate_limit;
pub mod reference_grant;
pub mod route;
pub mod secret;
pub mod security_policy;
pub mod service;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use access_log::*;
pub use backend::*;
pub use backend_tls::*;
pub use client_policy::*;
pub use configmap::*;
pub use gateway::*;
pub use grpcroute::*;
pub use l4route::*;
pub use namespace::*;
pub use policy::*;
pub use rate_limit::*;
pub use reference_grant::*;
pub use route::*;
pub use secret::*;
pub use security_policy::*;
pub use service::*;

use crate::spanned::Pos;

/// API group of Gateway and HTTPRoute.
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";
/// API group of ballast's own kinds (Backend).
pub const BALLAST_GROUP: &str = "ballast.dev";
/// Namespace of objects whose metadata names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The supported kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Kind {
    Gateway,
    #[serde(rename = "HTTPRoute")]
    HttpRoute,
    Backend,
    Secret,
    BackendPolicy,
    ConfigMap,
    #[serde(rename = "BackendTLSPolicy")]
    BackendTlsPolicy,
    ClientPolicy,
    #[serde(rename = "GRPCRoute")]
    GrpcRoute,
    Service,
    EndpointSlice,
    ReferenceGrant,
    Namespace,
    #[serde(rename = "TLSRoute")]
    TlsRoute,
    #[serde(rename = "TCPRoute")]
    TcpRoute,
    RateLimitPolicy,
    SecurityPolicy,
}

impl Kind {
    pub const ALL: [Kind; 17] = [
        Kind::Gateway,
        Kind::HttpRoute,
        Kind::Backend,
        Kind::Secret,
        Kind::BackendPolicy,
        Kind::ConfigMap,
        Kind::BackendTlsPolicy,
        Kind::ClientPolicy,
        Kind::GrpcRoute,
        Kind::Service,
        Kind::EndpointSlice,
        Kind::ReferenceGrant,
        Kind::Namespace,
        Kind::TlsRoute,
        Kind::TcpRoute,
        Kind::RateLimitPolicy,
        Kind::SecurityPolicy,
    ];

    /// The `kind:` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Gateway => "Gateway",
            Kind::HttpRoute => "HTTPRoute",
            Kind::Backend => "Backend",
            Kind::Secret => "Secret",
            Kind::BackendPolicy => "BackendPolicy",
            Kind::ConfigMap => "ConfigMap",
            Kind::BackendTlsPolicy => "BackendTLSPolicy",
            Kind::ClientPolicy => "ClientPolicy",
            Kind::GrpcRoute => "GRPCRoute",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::ReferenceGrant => "ReferenceGrant",
            Kind::Namespace => "Namespace",
            Kind::TlsRoute => "TLSRoute",
            Kind::TcpRoute => "TCPRoute",
            Kind::RateLimitPolicy => "RateLimitPolicy",
            Kind::SecurityPolicy => "SecurityPolicy",
        }
    }

    /// The only `apiVersion:` accepted for this kind.
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::Gateway | Kind::HttpRoute | Kind::GrpcRoute => "gateway.networking.k8s.io/v1",
            Kind::Backend
            | Kind::BackendPolicy
            | Kind::ClientPolicy
            | Kind::RateLimitPolicy
            | Kind::SecurityPolicy => "ballast.dev/v1alpha1",
            Kind::Secret | Kind::ConfigMap | Kind::Service | Kind::Namespace => "v1",
            Kind::BackendTlsPolicy => "gateway.networking.k8s.io/v1alpha3",
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            Kind::ReferenceGrant => "gateway.networking.k8s.io/v1beta1",
            Kind::TlsRoute | Kind::TcpRoute => "gateway.networking.k8s.io/v1alpha2",
        }
    }

    /// Whether `api_version` is served for this kind: [`Self::api_version`], plus `v1` for
    /// BackendTLSPolicy (same schema, promoted in Gateway API 1.4) and ReferenceGrant (the
    /// version newer Gateway API releases serve it as), and `v1alpha3`/`v1` for TLSRoute (the
    /// experimental channel's newer version and its promotion to the standard channel, same
    /// fields).
    pub fn accepts(self, api_version: &str) -> bool {
        api_version == self.api_version()
            || (matches!(
                self,
                Kind::BackendTlsPolicy | Kind::ReferenceGrant | Kind::TlsRoute
            ) && api_version == "gateway.networking.k8s.io/v1")
            || (self == Kind::TlsRoute && api_version == "gateway.networking.k8s.io/v1alpha3")
    }

    pub fn from_kind_str(kind: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == kind)
    }

    /// What Ballast makes of a document's `apiVersion` and `kind`. This (with [`Kind::ALL`]
    /// and [`Kind::api_version`]) is the one place that decides which kinds are implemented:
    /// everything else is skipped with a warning, so real manifests (ReferenceGrant, policy
    /// kinds of other projects) load (invariant 8).
    pub fn classify(api_version: Option<&str>, kind: &str) -> KindMatch {
        let Some(k) = Kind::from_kind_str(kind) else {
            return KindMatch::Unknown;
        };
        let group = |v: &str| v.rsplit_once('/').map_or("", |(g, _)| g).to_owned();
        match api_version {
            Some(v) if k.accepts(v) => KindMatch::Known(k),
            // Our group (or none given): meant for us, with a version we do not serve.
            None => KindMatch::WrongVersion(k),
            Some(v) if group(v) == group(k.api_version()) => KindMatch::WrongVersion(k),
            // Same kind name in another group (e.g. Envoy Gateway's `Backend`): not ours.
            Some(_) => KindMatch::Unknown,
        }
    }
}

/// The result of [`Kind::classify`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KindMatch {
    Known(Kind),
    /// One of our kinds with an apiVersion Ballast does not serve: an error.
    WrongVersion(Kind),
    /// A kind Ballast does not implement: skipped with a warning.
    Unknown,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An object's identity within its kind.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Kubernetes object metadata (the subset a config file may carry).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Metadata {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Set by the API server; accepted (and ignored) so `kubectl get -o yaml` exports load.
    #[serde(default)]
    pub uid: Ignored,
    #[serde(default)]
    pub resource_version: Ignored,
    #[serde(default)]
    pub generation: Ignored,
    #[serde(default)]
    pub creation_timestamp: Ignored,
    #[serde(default)]
    pub deletion_timestamp: Ignored,
    #[serde(default)]
    pub deletion_grace_period_seconds: Ignored,
    #[serde(default)]
    pub managed_fields: Ignored,
    #[serde(default)]
    pub owner_references: Ignored,
    #[serde(default)]
    pub finalizers: Ignored,
    #[serde(default)]
    pub generate_name: Ignored,
    #[serde(default)]
    pub self_link: Ignored,
}

fn default_namespace() -> String {
    DEFAULT_NAMESPACE.to_owned()
}

impl Metadata {
    pub fn key(&self) -> ObjectKey {
        ObjectKey::new(&self.namespace, &self.name)
    }
}

/// Where an object was read from: the file and the position of its document's first key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Source {
    pub file: Arc<str>,
    pub pos: Pos,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.pos)
    }
}

/// Implements the per-kind boilerplate: equality without the source (moving an object is not a
/// change) and the accessors `Object` dispatches to.
macro_rules! object_kind {
    ($ty:ident, $kind:expr) => {
        impl PartialEq for $ty {
            fn eq(&self, other: &Self) -> bool {
                self.metadata == other.metadata && self.spec == other.spec
            }
        }
        impl Eq for $ty {}
        impl $ty {
            pub const KIND: crate::kinds::Kind = $kind;
            pub fn key(&self) -> crate::kinds::ObjectKey {
                self.metadata.key()
            }
        }
    };
}
pub(crate) use object_kind;

/// One parsed, validated config object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Object {
    Gateway(Arc<Gateway>),
    HttpRoute(Arc<HttpRoute>),
    Backend(Arc<Backend>),
    Secret(Arc<Secret>),
    BackendPolicy(Arc<BackendPolicy>),
    ConfigMap(Arc<ConfigMap>),
    BackendTlsPolicy(Arc<BackendTlsPolicy>),
    ClientPolicy(Arc<ClientPolicy>),
    GrpcRoute(Arc<GrpcRoute>),
    Service(Arc<Service>),
    EndpointSlice(Arc<EndpointSlice>),
    ReferenceGrant(Arc<ReferenceGrant>),
    Namespace(Arc<Namespace>),
    TlsRoute(Arc<TlsRoute>),
    TcpRoute(Arc<TcpRoute>),
    RateLimitPolicy(Arc<RateLimitPolicy>),
    SecurityPolicy(Arc<SecurityPolicy>),
}

impl Object {
    pub fn kind(&self) -> Kind {
        match self {
            Object::Gateway(_) => Kind::Gateway,
            Object::HttpRoute(_) => Kind::HttpRoute,
            Object::Backend(_) => Kind::Backend,
            Object::Secret(_) => Kind::Secret,
            Object::BackendPolicy(_) => Kind::BackendPolicy,
            Object::ConfigMap(_) => Kind::ConfigMap,
            Object::BackendTlsPolicy(_) => Kind::BackendTlsPolicy,
            Object::ClientPolicy(_) => Kind::ClientPolicy,
            Object::GrpcRoute(_) => Kind::GrpcRoute,
            Object::Service(_) => Kind::Service,
            Object::EndpointSlice(_) => Kind::EndpointSlice,
            Object::ReferenceGrant(_) => Kind::ReferenceGrant,
            Object::Namespace(_) => Kind::Namespace,
            Object::TlsRoute(_) => Kind::TlsRoute,
            Object::TcpRoute(_) => Kind::TcpRoute,
            Object::RateLimitPolicy(_) => Kind::RateLimitPolicy,
            Object::SecurityPolicy(_) => Kind::SecurityPolicy,
        }
    }

    pub fn metadata(&self) -> &Metadata {
        match self {
            Object::Gateway(o) => &o.metadata,
            Object::HttpRoute(o) => &o.metadata,
            Object::Backend(o) => &o.metadata,
            Object::Secret(o) => &o.metadata,
            Object::BackendPolicy(o) => &o.metadata,
            Object::ConfigMap(o) => &o.metadata,
            Object::BackendTlsPolicy(o) => &o.metadata,
            Object::ClientPolicy(o) => &o.metadata,
            Object::GrpcRoute(o) => &o.metadata,
            Object::Service(o) => &o.metadata,
            Object::EndpointSlice(o) => &o.metadata,
            Object::ReferenceGrant(o) => &o.metadata,
            Object::Namespace(o) => &o.metadata,
            Object::TlsRoute(o) => &o.metadata,
            Object::TcpRoute(o) => &o.metadata,
            Object::RateLimitPolicy(o) => &o.metadata,
            Object::SecurityPolicy(o) => &o.metadata,
        }
    }

    pub fn key(&self) -> ObjectKey {
        self.metadata().key()
    }

    pub fn source(&self) -> &Source {
        match self {
            Object::Gateway(o) => &o.source,
            Object::HttpRoute(o) => &o.source,
            Object::Backend(o) => &o.source,
            Object::Secret(o) => &o.source,
            Object::BackendPolicy(o) => &o.source,
            Object::ConfigMap(o) => &o.source,
            Object::BackendTlsPolicy(o) => &o.source,
            Object::ClientPolicy(o) => &o.source,
            Object::GrpcRoute(o) => &o.source,
            Object::Service(o) => &o.source,
            Object::EndpointSlice(o) => &o.source,
            Object::ReferenceGrant(o) => &o.source,
            Object::Namespace(o) => &o.source,
            Object::TlsRoute(o) => &o.source,
            Object::TcpRoute(o) => &o.source,
            Object::RateLimitPolicy(o) => &o.source,
            Object::SecurityPolicy(o) => &o.source,
        }
    }

    /// Whether both are the same allocation (so equal, sources included) — without reading
    /// either: comparing a file's cached parse with itself touches no object memory.
    pub fn ptr_eq(&self, other: &Object) -> bool {
        fn at<T>(a: &Arc<T>) -> *const () {
            Arc::as_ptr(a).cast()
        }
        let p = |o: &Object| match o {
            Object::Gateway(a) => at(a),
            Object::HttpRoute(a) => at(a),
            Object::Backend(a) => at(a),
            Object::Secret(a) => at(a),
            Object::BackendPolicy(a) => at(a),
            Object::ConfigMap(a) => at(a),
            Object::BackendTlsPolicy(a) => at(a),
            Object::ClientPolicy(a) => at(a),
            Object::GrpcRoute(a) => at(a),
            Object::Service(a) => at(a),
            Object::EndpointSlice(a) => at(a),
            Object::ReferenceGrant(a) => at(a),
            Object::Namespace(a) => at(a),
            Object::TlsRoute(a) => at(a),
            Object::TcpRoute(a) => at(a),
            Object::RateLimitPolicy(a) => at(a),
            Object::SecurityPolicy(a) => at(a),
        };
        self.kind() == other.kind() && p(self) == p(other)
    }
}
