//! Resources: one Envoy object, encoded once, with a content-hash version and
//! the references it makes to other resources.
//!
//! Every stream and snapshot that contains a resource version shares the same
//! `Arc<Resource>`; a push to N proxies copies the encoded bytes N times and
//! never encodes again (invariant 10, docs/architecture.md).

use std::fmt;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
use envoy_types::pb::envoy::config::core::v3::TransportSocket;
use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType as TsConfigType;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfigType;
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::transport_sockets::quic::v3::QuicDownstreamTransport;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::ClusterSpecifier as TcpClusterSpecifier;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, DownstreamTlsContext, Secret, UpstreamTlsContext,
    common_tls_context::ValidationContextType,
};
use envoy_types::pb::google::protobuf::Any;
use prost::{Message, Name};

use crate::version::content_version;

/// The resource types Ballast serves, in make-before-break order (invariant 6):
/// additions go in this order, removals in reverse.
/// Not `#[non_exhaustive]` on purpose: users match on it to pick the Envoy
/// message type, and a new type is a breaking change anyway (a new
/// make-before-break position).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceType {
    /// SDS: `envoy.extensions.transport_sockets.tls.v3.Secret`.
    Secret = 0,
    /// CDS: `envoy.config.cluster.v3.Cluster`.
    Cluster = 1,
    /// EDS: `envoy.config.endpoint.v3.ClusterLoadAssignment`.
    ClusterLoadAssignment = 2,
    /// LDS: `envoy.config.listener.v3.Listener`.
    Listener = 3,
    /// RDS: `envoy.config.route.v3.RouteConfiguration`.
    RouteConfiguration = 4,
    /// VHDS: `envoy.config.route.v3.VirtualHost`, named
    /// `<route configuration>/<host>`. Delta only: Envoy subscribes to the
    /// route configuration's name and takes every virtual host in that
    /// namespace (`vhds.cc`, `use_namespace_matching_`). Last, because Envoy
    /// asks for a route configuration's virtual hosts only once it has the
    /// route configuration.
    VirtualHost = 5,
}

/// How many resource types there are (per-type arrays).
pub(crate) const TYPE_COUNT: usize = ResourceType::ALL.len();

impl ResourceType {
    /// All types in make-before-break (addition) order.
    pub const ALL: [ResourceType; 6] = [
        ResourceType::Secret,
        ResourceType::Cluster,
        ResourceType::ClusterLoadAssignment,
        ResourceType::Listener,
        ResourceType::RouteConfiguration,
        ResourceType::VirtualHost,
    ];

    /// Position in [`ResourceType::ALL`], for per-type arrays.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The `type.googleapis.com/...` URL of the type.
    pub fn type_url(self) -> &'static str {
        match self {
            ResourceType::Secret => {
                "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
            }
            ResourceType::Cluster => "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            ResourceType::ClusterLoadAssignment => {
                "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
            }
            ResourceType::Listener => "type.googleapis.com/envoy.config.listener.v3.Listener",
            ResourceType::RouteConfiguration => {
                "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
            }
            ResourceType::VirtualHost => "type.googleapis.com/envoy.config.route.v3.VirtualHost",
        }
    }

    /// The type with this URL, if served.
    pub fn from_type_url(url: &str) -> Option<ResourceType> {
        ResourceType::ALL.into_iter().find(|t| t.type_url() == url)
    }

    /// Short name used in logs, metrics and status ("CDS", "EDS", ...).
    pub fn short_name(self) -> &'static str {
        match self {
            ResourceType::Secret => "SDS",
            ResourceType::Cluster => "CDS",
            ResourceType::ClusterLoadAssignment => "EDS",
            ResourceType::Listener => "LDS",
            ResourceType::RouteConfiguration => "RDS",
            ResourceType::VirtualHost => "VHDS",
        }
    }

    /// In State-of-the-World, a response for these types carries the full set:
    /// a resource missing from it is removed by the client.
    pub fn is_full_state_in_sotw(self) -> bool {
        matches!(self, ResourceType::Cluster | ResourceType::Listener)
    }

    /// A subscription to name `N` of this type covers every resource named
    /// `N/<anything without '/'>` (VHDS: the virtual hosts of route
    /// configuration `N`), as Envoy's namespace matching does.
    pub fn is_namespaced(self) -> bool {
        matches!(self, ResourceType::VirtualHost)
    }
}

impl fmt::Display for ResourceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}

/// A reference from one resource to another.
#[derive(Clone, Debug, Eq)]
pub struct Ref {
    /// The referenced resource's type.
    pub ty: ResourceType,
    /// The referenced resource's name.
    pub name: Arc<str>,
    /// A hard reference breaks traffic when its target is missing at the client
    /// (a route to an absent cluster answers 503). Soft references only make the
    /// referrer warm until the target arrives (a cluster waiting for its EDS).
    pub hard: bool,
}

// By type, name, hardness (as derived), but equal names shared as one `Arc` compare without
// reading them: a route configuration's 10,000 cluster references, compared with its previous
// version's (which shares the names), cost pointer comparisons.
impl PartialEq for Ref {
    fn eq(&self, other: &Self) -> bool {
        self.ty == other.ty
            && (Arc::ptr_eq(&self.name, &other.name) || self.name == other.name)
            && self.hard == other.hard
    }
}

impl std::hash::Hash for Ref {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.ty.hash(state);
        self.name.hash(state);
        self.hard.hash(state);
    }
}

impl PartialOrd for Ref {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ref {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.ty
            .cmp(&other.ty)
            .then_with(|| {
                if Arc::ptr_eq(&self.name, &other.name) {
                    std::cmp::Ordering::Equal
                } else {
                    self.name.cmp(&other.name)
                }
            })
            .then_with(|| self.hard.cmp(&other.hard))
    }
}

/// A resource's references: its own, or a list shared with other resources (the versions of
/// one route configuration: a route edit rarely changes which clusters it references).
enum Refs {
    Owned(Vec<Ref>),
    Shared(Arc<[Ref]>),
}

impl std::ops::Deref for Refs {
    type Target = [Ref];
    fn deref(&self) -> &[Ref] {
        match self {
            Refs::Owned(v) => v,
            Refs::Shared(s) => s,
        }
    }
}

/// The bytes of a chunked resource: the `Any` header, then the value's chunks, shared with
/// the resource's other versions (an edit replaces the chunks it touched).
struct Chunked {
    /// `parts[0]` is the `Any` header (type URL, value key and length); the rest is the value.
    parts: Vec<Bytes>,
    /// Total length of `parts`.
    len: usize,
    /// `parts` concatenated, made on the first whole read.
    whole: std::sync::OnceLock<Bytes>,
}

/// An encoded Envoy resource with its content-hash version.
pub struct Resource {
    ty: ResourceType,
    name: Arc<str>,
    version: Arc<str>,
    /// The encoded `google.protobuf.Any` (type_url + value): what goes on the wire.
    /// Empty for a chunked resource until someone asks for it whole.
    any: Bytes,
    /// A resource built from chunks ([`Resource::from_encoded_chunks_shared`]): written to
    /// the wire chunk by chunk, made whole only when read whole.
    chunked: Option<Box<Chunked>>,
    /// Byte range of the inner message within `any`.
    value_start: usize,
    refs: Refs,
    /// Proto-JSON of `any` for REST pollers, made on first use and shared by
    /// all of them (invariant 10: encode once per resource version).
    #[cfg(feature = "rest")]
    json: std::sync::OnceLock<Arc<str>>,
    /// How many times `json` was computed (tests prove "once").
    #[cfg(all(test, feature = "rest"))]
    pub(crate) json_encodings: std::sync::atomic::AtomicUsize,
}

impl fmt::Debug for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resource")
            .field("ty", &self.ty)
            .field("name", &self.name)
            .field("version", &self.version)
            .field("bytes", &self.any_len())
            .finish()
    }
}

impl PartialEq for Resource {
    fn eq(&self, other: &Self) -> bool {
        self.ty == other.ty && self.name == other.name && self.version == other.version
    }
}
impl Eq for Resource {}

/// Errors building a resource from bytes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResourceError {
    #[error("unsupported resource type URL {0:?}")]
    /// An `Any` whose type URL is not one of [`ResourceType::ALL`].
    UnknownType(String),
    #[error("cannot decode {ty} resource: {message}")]
    /// Bytes that do not decode as the type (`message` says why).
    Decode {
        /// The type expected.
        ty: ResourceType,
        /// What the decoder said.
        message: String,
    },
    #[error("{ty} resource has an empty name")]
    /// A resource without a name cannot be served.
    EmptyName {
        /// The type of the resource.
        ty: ResourceType,
    },
}

impl Resource {
    /// Builds a resource from a typed Envoy message (encodes it once).
    pub fn new<M: XdsResource>(msg: &M) -> Result<Arc<Resource>, ResourceError> {
        let name = msg.resource_name();
        if name.is_empty() {
            return Err(ResourceError::EmptyName { ty: M::TYPE });
        }
        let value = msg.encode_to_vec();
        // Maps are encoded in HashMap order: hash a canonical form (§3.5).
        let full_name = M::TYPE.type_url().rsplit('/').next().unwrap_or_default();
        let version = crate::version::message_version(full_name, &value);
        Ok(Arc::new(Self::assemble(
            M::TYPE,
            name.into(),
            &value,
            msg.refs(),
            version,
        )))
    }

    /// Builds a resource from the already encoded bytes of an `M` named `name`
    /// whose references are `refs` (e.g. a message assembled from cached encoded
    /// parts). The caller vouches that `value` is `M`'s encoding with that name and
    /// those references; the version is the content hash of exactly `value`
    /// (unlike [`Resource::new`], map entries are not sorted first: to keep
    /// versions deterministic, encode maps with sorted keys or avoid them).
    pub fn from_encoded<M: XdsResource>(
        name: &str,
        value: &[u8],
        refs: Vec<Ref>,
    ) -> Result<Arc<Resource>, ResourceError> {
        if name.is_empty() {
            return Err(ResourceError::EmptyName { ty: M::TYPE });
        }
        let version = content_version(value);
        Ok(Arc::new(Self::assemble(
            M::TYPE,
            name.into(),
            value,
            refs,
            version,
        )))
    }

    /// [`Resource::from_encoded`] of the concatenation of `parts`, written once into the
    /// resource's buffer (a route configuration of 10,000 cached virtual-host encodings is
    /// not first concatenated into a buffer of its own and then copied).
    pub fn from_encoded_parts<'a, M: XdsResource>(
        name: &str,
        parts: impl IntoIterator<Item = &'a [u8]> + Clone,
        refs: Vec<Ref>,
    ) -> Result<Arc<Resource>, ResourceError> {
        if name.is_empty() {
            return Err(ResourceError::EmptyName { ty: M::TYPE });
        }
        let len: usize = parts.clone().into_iter().map(<[u8]>::len).sum();
        let mut buf = Self::any_header(M::TYPE, len);
        let value_start = buf.len();
        for p in parts {
            buf.put_slice(p);
        }
        let version = content_version(&buf[value_start..]);
        Ok(Arc::new(Self::with_any(
            M::TYPE,
            name.into(),
            buf,
            value_start,
            refs,
            version,
        )))
    }

    /// [`Resource::from_encoded_parts`] with references shared with other resources: `refs`
    /// must be sorted and distinct, as [`Resource::refs`] gives them (checked in debug builds).
    /// A route configuration re-assembled after a route edit keeps its 10,000 cluster
    /// references without copying, sorting or dropping them.
    pub fn from_encoded_parts_shared<'a, M: XdsResource>(
        name: &str,
        parts: impl IntoIterator<Item = &'a [u8]> + Clone,
        refs: Arc<[Ref]>,
    ) -> Result<Arc<Resource>, ResourceError> {
        debug_assert!(
            refs.windows(2).all(|w| w[0] < w[1]),
            "shared references are sorted and distinct"
        );
        let mut r = Self::from_encoded_parts::<M>(name, parts, Vec::new())?;
        Arc::get_mut(&mut r).expect("just built").refs = Refs::Shared(refs);
        Ok(r)
    }

    /// A resource whose encoded value is the concatenation of `chunks`, kept as they are: the
    /// wire gets them as a chain (no copy into one buffer), and a resource re-assembled after
    /// an edit shares every chunk the edit did not touch with the previous version. The
    /// version is the content hash of the concatenation, as [`Resource::from_encoded`] gives
    /// it (hashed chunk by chunk, never copied). `refs` as in
    /// [`Resource::from_encoded_parts_shared`]. The caller vouches that the concatenation is
    /// `M`'s encoding with that name and those references; empty chunks are dropped.
    /// Reading the bytes whole ([`Resource::any_bytes`], [`Resource::value_bytes`])
    /// concatenates them once and keeps the result.
    pub fn from_encoded_chunks_shared<M: XdsResource>(
        name: &str,
        chunks: impl IntoIterator<Item = Bytes>,
        refs: Arc<[Ref]>,
    ) -> Result<Arc<Resource>, ResourceError> {
        if name.is_empty() {
            return Err(ResourceError::EmptyName { ty: M::TYPE });
        }
        debug_assert!(
            refs.windows(2).all(|w| w[0] < w[1]),
            "shared references are sorted and distinct"
        );
        let mut parts = vec![Bytes::new()];
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut value_len = 0;
        for c in chunks {
            if c.is_empty() {
                continue;
            }
            value_len += c.len();
            hasher.update(&c);
            parts.push(c);
        }
        // The `Any` header alone (not `any_header`, which makes room for the value).
        let type_url = M::TYPE.type_url();
        let mut header = BytesMut::with_capacity(type_url.len() + 16);
        crate::wire::put_bytes_field(&mut header, 1, type_url.as_bytes());
        crate::wire::put_key(&mut header, 2, crate::wire::WIRE_LEN);
        prost::encoding::encode_varint(value_len as u64, &mut header);
        let value_start = header.len();
        parts[0] = header.freeze();
        // `content_version`'s format, of the same bytes.
        let version = format!("{:016x}", hasher.digest());
        Ok(Arc::new(Resource {
            ty: M::TYPE,
            version: version.into(),
            name: name.into(),
            any: Bytes::new(),
            chunked: Some(Box::new(Chunked {
                len: value_start + value_len,
                parts,
                whole: std::sync::OnceLock::new(),
            })),
            value_start,
            refs: Refs::Shared(refs),
            #[cfg(feature = "rest")]
            json: std::sync::OnceLock::new(),
            #[cfg(all(test, feature = "rest"))]
            json_encodings: Default::default(),
        }))
    }

    /// Builds a resource from an `Any` (type URL + encoded value), decoding it
    /// once to learn its name and references.
    pub fn from_any(any: &Any) -> Result<Arc<Resource>, ResourceError> {
        let ty = ResourceType::from_type_url(&any.type_url)
            .ok_or_else(|| ResourceError::UnknownType(any.type_url.clone()))?;
        fn decode<M: XdsResource + Default>(bytes: &[u8]) -> Result<Arc<Resource>, ResourceError> {
            let msg = M::decode(bytes).map_err(|e| ResourceError::Decode {
                ty: M::TYPE,
                message: e.to_string(),
            })?;
            Resource::new(&msg)
        }
        let _ = ty;
        match ty {
            ResourceType::Secret => decode::<Secret>(&any.value),
            ResourceType::Cluster => decode::<Cluster>(&any.value),
            ResourceType::ClusterLoadAssignment => decode::<ClusterLoadAssignment>(&any.value),
            ResourceType::Listener => decode::<Listener>(&any.value),
            ResourceType::RouteConfiguration => decode::<RouteConfiguration>(&any.value),
            ResourceType::VirtualHost => decode::<VirtualHost>(&any.value),
        }
    }

    fn assemble(
        ty: ResourceType,
        name: Arc<str>,
        value: &[u8],
        refs: Vec<Ref>,
        version: String,
    ) -> Resource {
        let mut buf = Self::any_header(ty, value.len());
        let value_start = buf.len();
        buf.put_slice(value);
        Self::with_any(ty, name, buf, value_start, refs, version)
    }

    /// A buffer with room for an `Any` of `ty` whose value is `len` bytes, holding all of
    /// it but the value.
    fn any_header(ty: ResourceType, len: usize) -> BytesMut {
        let type_url = ty.type_url();
        // Any { type_url = 1; value = 2; }
        let mut buf = BytesMut::with_capacity(type_url.len() + len + 12);
        crate::wire::put_bytes_field(&mut buf, 1, type_url.as_bytes());
        crate::wire::put_key(&mut buf, 2, crate::wire::WIRE_LEN);
        prost::encoding::encode_varint(len as u64, &mut buf);
        buf
    }

    fn with_any(
        ty: ResourceType,
        name: Arc<str>,
        buf: BytesMut,
        value_start: usize,
        mut refs: Vec<Ref>,
        version: String,
    ) -> Resource {
        refs.sort();
        refs.dedup();
        Resource {
            ty,
            version: version.into(),
            name,
            any: buf.freeze(),
            chunked: None,
            value_start,
            refs: Refs::Owned(refs),
            #[cfg(feature = "rest")]
            json: std::sync::OnceLock::new(),
            #[cfg(all(test, feature = "rest"))]
            json_encodings: Default::default(),
        }
    }

    /// The resource's type.
    pub fn ty(&self) -> ResourceType {
        self.ty
    }
    /// The resource's name (unique per type in a snapshot).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The name, shared.
    pub fn name_arc(&self) -> &Arc<str> {
        &self.name
    }
    /// The content hash of the encoded bytes: equal content, equal version.
    pub fn version(&self) -> &str {
        &self.version
    }
    /// The version, shared.
    pub fn version_arc(&self) -> &Arc<str> {
        &self.version
    }
    /// The encoded `google.protobuf.Any`, shared by every response that carries it. A
    /// chunked resource ([`Resource::from_encoded_chunks_shared`]) is concatenated on the
    /// first call (the wire reads [`Resource::any_chunks`] instead).
    pub fn any_bytes(&self) -> &Bytes {
        match &self.chunked {
            None => &self.any,
            Some(c) => c.whole.get_or_init(|| {
                let mut b = BytesMut::with_capacity(c.len);
                for p in &c.parts {
                    b.put_slice(p);
                }
                b.freeze()
            }),
        }
    }
    /// Length of [`Resource::any_bytes`], without making a chunked resource whole.
    pub fn any_len(&self) -> usize {
        match &self.chunked {
            None => self.any.len(),
            Some(c) => c.len,
        }
    }
    /// [`Resource::any_bytes`] as the chunks it is made of (one, unless the resource was
    /// built from chunks): what the wire writes.
    pub fn any_chunks(&self) -> &[Bytes] {
        match &self.chunked {
            None => std::slice::from_ref(&self.any),
            Some(c) => &c.parts,
        }
    }
    /// Whether a chunked resource was concatenated (tests prove the wire never does it).
    #[cfg(test)]
    pub(crate) fn made_whole(&self) -> bool {
        self.chunked
            .as_ref()
            .is_some_and(|c| c.whole.get().is_some())
    }
    /// The value's chunks of a resource built by [`Resource::from_encoded_chunks_shared`]
    /// (`None` for any other): chunks shared by two versions are the same `Bytes` (same
    /// pointer and length), so comparing versions can skip them without reading them.
    pub fn value_chunks(&self) -> Option<&[Bytes]> {
        self.chunked.as_ref().map(|c| &c.parts[1..])
    }
    #[cfg(feature = "rest")]
    /// The proto-JSON of [`Resource::any_bytes`] (`{"@type": ..., ...}`),
    /// computed once per resource and then shared by every REST poller.
    pub fn any_json(&self) -> Result<Arc<str>, crate::json::JsonError> {
        if let Some(j) = self.json.get() {
            return Ok(j.clone());
        }
        let v = crate::json::bytes_to_json(&Any::full_name(), self.any_bytes())?;
        #[cfg(all(test, feature = "rest"))]
        self.json_encodings
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Two racing first pollers: both compute, one value is kept for all.
        Ok(self.json.get_or_init(|| v.to_string().into()).clone())
    }
    /// The encoded inner message.
    pub fn value_bytes(&self) -> Bytes {
        self.any_bytes().slice(self.value_start..)
    }
    /// Every reference this resource makes, sorted.
    pub fn refs(&self) -> &[Ref] {
        &self.refs
    }
    /// Decodes back into an `Any` (for config dumps and REST; not on the hot path).
    pub fn to_any(&self) -> Any {
        Any {
            type_url: self.ty.type_url().to_string(),
            value: self.value_bytes().to_vec(),
        }
    }
}

/// An Envoy message that can be served as an xDS resource.
pub trait XdsResource: Message + Name + Sized {
    /// The resource type this message is served as.
    const TYPE: ResourceType;
    /// The resource's name (e.g. `Cluster::name`).
    fn resource_name(&self) -> &str;
    /// References this resource makes to other resources.
    fn refs(&self) -> Vec<Ref>;
}

fn push_ref(refs: &mut Vec<Ref>, ty: ResourceType, name: &str, hard: bool) {
    if !name.is_empty() {
        refs.push(Ref {
            ty,
            name: name.into(),
            hard,
        });
    }
}

fn common_tls_refs(ctx: Option<&CommonTlsContext>, refs: &mut Vec<Ref>) {
    let Some(ctx) = ctx else { return };
    for sds in &ctx.tls_certificate_sds_secret_configs {
        if sds.sds_config.as_ref().is_some_and(is_ads_config) {
            push_ref(refs, ResourceType::Secret, &sds.name, false);
        }
    }
    match &ctx.validation_context_type {
        Some(ValidationContextType::ValidationContextSdsSecretConfig(sds))
            if sds.sds_config.as_ref().is_some_and(is_ads_config) =>
        {
            push_ref(refs, ResourceType::Secret, &sds.name, false);
        }
        Some(ValidationContextType::CombinedValidationContext(c)) => {
            if let Some(sds) = &c.validation_context_sds_secret_config
                && sds.sds_config.as_ref().is_some_and(is_ads_config)
            {
                push_ref(refs, ResourceType::Secret, &sds.name, false);
            }
        }
        _ => {}
    }
}

/// Only references delivered on the same ADS stream (`ads`, or no source
/// given) are ours to check. Anything else — an `api_config_source` (another
/// gRPC stream, to us or to another server), `self`, a file path — reaches
/// the client by a way this stream cannot see: counting it as "delivered
/// here" would hold every route to such a cluster until endpoints arrive that
/// this stream never sends.
fn is_ads_config(cfg: &envoy_types::pb::envoy::config::core::v3::ConfigSource) -> bool {
    use envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
    matches!(
        cfg.config_source_specifier,
        None | Some(ConfigSourceSpecifier::Ads(_))
    )
}

fn transport_socket_refs(ts: Option<&TransportSocket>, upstream: bool, refs: &mut Vec<Ref>) {
    let Some(TransportSocket {
        config_type: Some(TsConfigType::TypedConfig(any)),
        ..
    }) = ts
    else {
        return;
    };
    if upstream && any.type_url == UpstreamTlsContext::type_url() {
        if let Ok(ctx) = UpstreamTlsContext::decode(any.value.as_slice()) {
            common_tls_refs(ctx.common_tls_context.as_ref(), refs);
        }
    } else if !upstream
        && any.type_url == DownstreamTlsContext::type_url()
        && let Ok(ctx) = DownstreamTlsContext::decode(any.value.as_slice())
    {
        common_tls_refs(ctx.common_tls_context.as_ref(), refs);
    } else if !upstream
        && any.type_url == QuicDownstreamTransport::type_url()
        && let Ok(q) = QuicDownstreamTransport::decode(any.value.as_slice())
    {
        // An HTTP/3 listener's QUIC socket wraps the same TLS context (SDS certificates).
        let ctx = q.downstream_tls_context.as_ref();
        common_tls_refs(ctx.and_then(|c| c.common_tls_context.as_ref()), refs);
    }
}

fn route_config_refs(rc: &RouteConfiguration, refs: &mut Vec<Ref>) {
    for vh in &rc.virtual_hosts {
        virtual_host_refs(vh, refs);
    }
}

fn virtual_host_refs(vh: &VirtualHost, refs: &mut Vec<Ref>) {
    {
        for route in &vh.routes {
            if let Some(Action::Route(action)) = &route.action {
                match &action.cluster_specifier {
                    Some(ClusterSpecifier::Cluster(c)) => {
                        push_ref(refs, ResourceType::Cluster, c, true)
                    }
                    Some(ClusterSpecifier::WeightedClusters(w)) => {
                        for c in &w.clusters {
                            push_ref(refs, ResourceType::Cluster, &c.name, true);
                        }
                    }
                    _ => {}
                }
                for m in &action.request_mirror_policies {
                    push_ref(refs, ResourceType::Cluster, &m.cluster, true);
                }
            }
        }
    }
}

impl XdsResource for Cluster {
    const TYPE: ResourceType = ResourceType::Cluster;
    fn resource_name(&self) -> &str {
        &self.name
    }
    fn refs(&self) -> Vec<Ref> {
        let mut refs = Vec::new();
        let is_eds = matches!(
            self.cluster_discovery_type,
            Some(ClusterDiscoveryType::Type(t)) if t == DiscoveryType::Eds as i32
        );
        if is_eds {
            let eds = self.eds_cluster_config.as_ref();
            let served_here = eds
                .and_then(|e| e.eds_config.as_ref())
                .is_none_or(is_ads_config);
            if served_here {
                let svc = eds.map(|e| e.service_name.as_str()).unwrap_or("");
                let name = if svc.is_empty() { &self.name } else { svc };
                push_ref(&mut refs, ResourceType::ClusterLoadAssignment, name, false);
            }
        }
        transport_socket_refs(self.transport_socket.as_ref(), true, &mut refs);
        for m in &self.transport_socket_matches {
            transport_socket_refs(m.transport_socket.as_ref(), true, &mut refs);
        }
        refs
    }
}

impl XdsResource for ClusterLoadAssignment {
    const TYPE: ResourceType = ResourceType::ClusterLoadAssignment;
    fn resource_name(&self) -> &str {
        &self.cluster_name
    }
    fn refs(&self) -> Vec<Ref> {
        Vec::new()
    }
}

impl XdsResource for Listener {
    const TYPE: ResourceType = ResourceType::Listener;
    fn resource_name(&self) -> &str {
        &self.name
    }
    fn refs(&self) -> Vec<Ref> {
        let mut refs = Vec::new();
        for chain in self
            .filter_chains
            .iter()
            .chain(self.default_filter_chain.iter())
        {
            transport_socket_refs(chain.transport_socket.as_ref(), false, &mut refs);
            for filter in &chain.filters {
                let Some(FilterConfigType::TypedConfig(any)) = &filter.config_type else {
                    continue;
                };
                if any.type_url == HttpConnectionManager::type_url() {
                    hcm_refs(any, &mut refs);
                } else if any.type_url == TcpProxy::type_url() {
                    let Ok(tcp) = TcpProxy::decode(any.value.as_slice()) else {
                        continue;
                    };
                    match &tcp.cluster_specifier {
                        Some(TcpClusterSpecifier::Cluster(c)) => {
                            push_ref(&mut refs, ResourceType::Cluster, c, true)
                        }
                        Some(TcpClusterSpecifier::WeightedClusters(w)) => {
                            for c in &w.clusters {
                                push_ref(&mut refs, ResourceType::Cluster, &c.name, true);
                            }
                        }
                        None => {}
                    }
                }
            }
        }
        // A proxyless gRPC client's listener: an HTTP connection manager with no filter chain.
        if let Some(any) = self
            .api_listener
            .as_ref()
            .and_then(|a| a.api_listener.as_ref())
            && any.type_url == HttpConnectionManager::type_url()
        {
            hcm_refs(any, &mut refs);
        }
        refs
    }
}

/// References of an HTTP connection manager: its RDS route configuration (when
/// served here) or the clusters of its inline route configuration.
fn hcm_refs(any: &Any, refs: &mut Vec<Ref>) {
    let Ok(hcm) = HttpConnectionManager::decode(any.value.as_slice()) else {
        return;
    };
    match &hcm.route_specifier {
        Some(RouteSpecifier::Rds(rds)) => {
            let served_here = rds.config_source.as_ref().is_none_or(is_ads_config);
            if served_here {
                push_ref(
                    refs,
                    ResourceType::RouteConfiguration,
                    &rds.route_config_name,
                    false,
                );
            }
        }
        Some(RouteSpecifier::RouteConfig(rc)) => route_config_refs(rc, refs),
        _ => {}
    }
}

impl XdsResource for RouteConfiguration {
    const TYPE: ResourceType = ResourceType::RouteConfiguration;
    fn resource_name(&self) -> &str {
        &self.name
    }
    fn refs(&self) -> Vec<Ref> {
        let mut refs = Vec::new();
        route_config_refs(self, &mut refs);
        refs
    }
}

/// A VHDS virtual host: named `<route configuration>/<host>` by the server
/// (the message's own `name` is what Envoy's VHDS resource name must be).
impl XdsResource for VirtualHost {
    const TYPE: ResourceType = ResourceType::VirtualHost;
    fn resource_name(&self) -> &str {
        &self.name
    }
    fn refs(&self) -> Vec<Ref> {
        let mut refs = Vec::new();
        virtual_host_refs(self, &mut refs);
        refs
    }
}

impl XdsResource for Secret {
    const TYPE: ResourceType = ResourceType::Secret;
    fn resource_name(&self) -> &str {
        &self.name
    }
    fn refs(&self) -> Vec<Ref> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A resource written from parts is the one made from their concatenation.
    #[test]
    fn parts_equal_the_whole() {
        let rc = RouteConfiguration {
            name: "rc".into(),
            virtual_hosts: vec![VirtualHost {
                name: "a".into(),
                domains: vec!["a.example".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let bytes = rc.encode_to_vec();
        let refs = || {
            vec![Ref {
                ty: ResourceType::Cluster,
                name: "c".into(),
                hard: true,
            }]
        };
        let whole = Resource::from_encoded::<RouteConfiguration>("rc", &bytes, refs()).unwrap();
        for cut in [0, 1, bytes.len() / 2, bytes.len()] {
            let (a, b) = bytes.split_at(cut);
            let parts =
                Resource::from_encoded_parts::<RouteConfiguration>("rc", [a, &[][..], b], refs())
                    .unwrap();
            assert_eq!(parts.any_bytes(), whole.any_bytes());
            assert_eq!(parts.value_bytes(), whole.value_bytes());
            assert_eq!(parts.version(), whole.version());
            assert_eq!(parts.refs(), whole.refs());
        }
        assert!(
            Resource::from_encoded_parts::<RouteConfiguration>("", [&bytes[..]], vec![]).is_err()
        );
    }

    proptest::proptest! {
        /// A resource built from chunks reads as the one built from their concatenation:
        /// same bytes (whole, by length and chunk by chunk), same version, same JSON, and
        /// its chunks are the given `Bytes`, not copies.
        #[test]
        fn chunks_equal_the_whole(
            hosts in proptest::collection::vec(("[a-z]{1,12}", 0usize..3000), 0..12),
            cuts in proptest::collection::vec(proptest::prelude::any::<proptest::sample::Index>(), 0..6),
        ) {
            let rc = RouteConfiguration {
                name: "rc".into(),
                virtual_hosts: hosts
                    .iter()
                    .map(|(h, n)| VirtualHost {
                        name: h.clone(),
                        domains: vec!["d".repeat(*n)],
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            };
            let bytes = Bytes::from(rc.encode_to_vec());
            let mut at: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
            at.push(0);
            at.push(bytes.len());
            at.sort();
            let chunks: Vec<Bytes> = at.windows(2).map(|w| bytes.slice(w[0]..w[1])).collect();
            let refs: Arc<[Ref]> = Arc::new([]);
            let whole = Resource::from_encoded::<RouteConfiguration>("rc", &bytes, vec![]).unwrap();
            let r = Resource::from_encoded_chunks_shared::<RouteConfiguration>("rc", chunks.clone(), refs).unwrap();
            proptest::prop_assert_eq!(r.any_len(), whole.any_bytes().len());
            proptest::prop_assert_eq!(r.any_chunks().concat(), whole.any_bytes().to_vec());
            let kept: Vec<&Bytes> = chunks.iter().filter(|c| !c.is_empty()).collect();
            let value = r.value_chunks().unwrap();
            proptest::prop_assert_eq!(value.len(), kept.len());
            for (a, b) in value.iter().zip(kept) {
                proptest::prop_assert_eq!(a.as_ptr(), b.as_ptr());
            }
            proptest::prop_assert_eq!(r.version(), whole.version());
            proptest::prop_assert_eq!(r.any_bytes(), whole.any_bytes());
            proptest::prop_assert_eq!(r.value_bytes(), whole.value_bytes());
            proptest::prop_assert_eq!(r.to_any(), whole.to_any());
            #[cfg(feature = "rest")]
            proptest::prop_assert_eq!(r.any_json().unwrap(), whole.any_json().unwrap());
            proptest::prop_assert!(whole.value_chunks().is_none());
            proptest::prop_assert_eq!(whole.any_chunks(), std::slice::from_ref(whole.any_bytes()));
        }
    }

    use envoy_types::pb::envoy::config::cluster::v3::cluster::EdsClusterConfig;

    fn eds_cluster(name: &str, service: &str) -> Cluster {
        Cluster {
            name: name.into(),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
            eds_cluster_config: Some(EdsClusterConfig {
                eds_config: None,
                service_name: service.into(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn any_bytes_decode_as_the_message() {
        let c = eds_cluster("a", "");
        let r = Resource::new(&c).unwrap();
        let any = Any::decode(r.any_bytes().clone()).unwrap();
        assert_eq!(any.type_url, ResourceType::Cluster.type_url());
        assert_eq!(Cluster::decode(any.value.as_slice()).unwrap(), c);
        assert_eq!(r.value_bytes().as_ref(), c.encode_to_vec().as_slice());
    }

    #[test]
    fn version_is_content_hash() {
        let a = Resource::new(&eds_cluster("a", "")).unwrap();
        let a2 = Resource::new(&eds_cluster("a", "")).unwrap();
        let b = Resource::new(&eds_cluster("a", "x")).unwrap();
        assert_eq!(a.version(), a2.version());
        assert_ne!(a.version(), b.version());
    }

    #[test]
    fn eds_cluster_refers_softly_to_its_load_assignment() {
        let r = Resource::new(&eds_cluster("a", "")).unwrap();
        assert_eq!(
            r.refs(),
            &[Ref {
                ty: ResourceType::ClusterLoadAssignment,
                name: "a".into(),
                hard: false
            }]
        );
        let r = Resource::new(&eds_cluster("a", "svc")).unwrap();
        assert_eq!(&*r.refs()[0].name, "svc");
    }

    /// Endpoints from another config source (another gRPC stream, `self`, a
    /// file) are not delivered on the ADS stream: no reference to wait on.
    #[test]
    fn eds_from_another_config_source_is_not_referenced() {
        use envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier as S;
        use envoy_types::pb::envoy::config::core::v3::{
            AggregatedConfigSource, ApiConfigSource, ConfigSource, PathConfigSource,
            SelfConfigSource,
        };
        let with = |spec: Option<S>| {
            let mut c = eds_cluster("a", "");
            c.eds_cluster_config.as_mut().unwrap().eds_config = Some(ConfigSource {
                config_source_specifier: spec,
                ..Default::default()
            });
            Resource::new(&c).unwrap().refs().len()
        };
        assert_eq!(with(Some(S::Ads(AggregatedConfigSource {}))), 1);
        assert_eq!(with(None), 1, "no specifier: taken as ADS");
        assert_eq!(
            with(Some(S::ApiConfigSource(ApiConfigSource::default()))),
            0
        );
        assert_eq!(with(Some(S::Self_(SelfConfigSource::default()))), 0);
        let file = PathConfigSource {
            path: "/etc/eds.yaml".into(),
            ..Default::default()
        };
        assert_eq!(with(Some(S::PathConfigSource(file))), 0);
    }

    #[test]
    fn routes_refer_hard_to_clusters() {
        use envoy_types::pb::envoy::config::route::v3::{Route, RouteAction, VirtualHost};
        let rc = RouteConfiguration {
            name: "r".into(),
            virtual_hosts: vec![VirtualHost {
                name: "vh".into(),
                domains: vec!["*".into()],
                routes: vec![Route {
                    action: Some(Action::Route(RouteAction {
                        cluster_specifier: Some(ClusterSpecifier::Cluster("c1".into())),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let r = Resource::new(&rc).unwrap();
        assert_eq!(
            r.refs(),
            &[Ref {
                ty: ResourceType::Cluster,
                name: "c1".into(),
                hard: true
            }]
        );
    }

    #[test]
    fn listeners_refer_to_their_route_configuration() {
        let rds = |l: &Listener| {
            Resource::new(l)
                .unwrap()
                .refs()
                .iter()
                .map(|r| (r.ty, r.name.to_string(), r.hard))
                .collect::<Vec<_>>()
        };
        let want = vec![(ResourceType::RouteConfiguration, "rc".to_string(), false)];
        assert_eq!(
            rds(&crate::simple::http_listener("l", "127.0.0.1", 0, "rc")),
            want
        );
        // A gRPC client's API listener has no filter chain.
        assert_eq!(rds(&crate::simple::api_listener("greeter", "rc")), want);
    }

    /// An HTTP/3 listener's QUIC socket wraps a TLS context: its SDS certificates are
    /// references like a TCP listener's, so they are sent first and not removed under it.
    #[test]
    fn quic_listeners_refer_to_their_sds_certificates() {
        use envoy_types::pb::envoy::config::listener::v3::FilterChain;
        use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::SdsSecretConfig;
        let ctx = DownstreamTlsContext {
            common_tls_context: Some(CommonTlsContext {
                tls_certificate_sds_secret_configs: vec![SdsSecretConfig {
                    name: "ns/cert".into(),
                    sds_config: Some(crate::simple::ads_source()),
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let l = Listener {
            name: "l/udp".into(),
            filter_chains: vec![FilterChain {
                transport_socket: Some(TransportSocket {
                    name: "envoy.transport_sockets.quic".into(),
                    config_type: Some(TsConfigType::TypedConfig(envoy_types::util::pack_any(
                        QuicDownstreamTransport {
                            downstream_tls_context: Some(ctx),
                            ..Default::default()
                        },
                    ))),
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let refs: Vec<(ResourceType, String)> = Resource::new(&l)
            .unwrap()
            .refs()
            .iter()
            .map(|r| (r.ty, r.name.to_string()))
            .collect();
        assert_eq!(refs, [(ResourceType::Secret, "ns/cert".to_string())]);
    }

    #[test]
    fn empty_name_is_refused() {
        assert_eq!(
            Resource::new(&Cluster::default()).unwrap_err(),
            ResourceError::EmptyName {
                ty: ResourceType::Cluster
            }
        );
    }

    #[test]
    fn from_encoded_equals_new() {
        let c = eds_cluster("a", "svc");
        let a = Resource::new(&c).unwrap();
        let mut refs = c.refs();
        refs.reverse();
        let b = Resource::from_encoded::<Cluster>("a", &c.encode_to_vec(), refs).unwrap();
        assert_eq!(*a, *b);
        assert_eq!(a.version(), b.version());
        assert_eq!(a.any_bytes(), b.any_bytes());
        assert_eq!(a.refs(), b.refs());
        assert_eq!(
            Resource::from_encoded::<Cluster>("", &[], Vec::new()).unwrap_err(),
            ResourceError::EmptyName {
                ty: ResourceType::Cluster
            }
        );
    }

    #[test]
    fn from_any_roundtrips() {
        let c = eds_cluster("a", "");
        let r = Resource::from_any(&envoy_types::util::pack_any(c)).unwrap();
        assert_eq!(r.name(), "a");
        assert!(
            Resource::from_any(&Any {
                type_url: "type.googleapis.com/nope".into(),
                value: vec![]
            })
            .is_err()
        );
    }

    /// Versions of resources with map fields (metadata Structs, and maps of
    /// `Any`s packing Structs) do not depend on HashMap order: built with keys
    /// inserted in opposite orders, the encodings differ, the versions do not.
    #[test]
    fn equal_content_with_maps_has_equal_versions() {
        use envoy_types::pb::envoy::config::core::v3::Metadata;
        use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
        let value = |s: &str| Value {
            kind: Some(Kind::StringValue(s.into())),
        };
        let build = |keys: &[String]| {
            let st = Struct {
                fields: keys.iter().map(|k| (k.clone(), value(k))).collect(),
            };
            let mut md = Metadata::default();
            for k in keys {
                md.filter_metadata.insert(k.clone(), st.clone());
                md.typed_filter_metadata.insert(
                    k.clone(),
                    Any {
                        type_url: "type.googleapis.com/google.protobuf.Struct".into(),
                        value: st.encode_to_vec(),
                    },
                );
            }
            Cluster {
                metadata: Some(md),
                ..eds_cluster("c", "c")
            }
        };
        let keys: Vec<String> = (0..32).map(|i| format!("k{i}")).collect();
        let rev: Vec<String> = keys.iter().rev().cloned().collect();
        let (a, b) = (build(&keys), build(&rev));
        assert_ne!(
            a.encode_to_vec(),
            b.encode_to_vec(),
            "HashMap orders differ"
        );
        let (ra, rb) = (Resource::new(&a).unwrap(), Resource::new(&b).unwrap());
        assert_eq!(ra.version(), rb.version());
        // The bytes sent stay prost's own.
        assert_eq!(rb.value_bytes(), b.encode_to_vec());
        let mut c = build(&keys);
        c.metadata.as_mut().unwrap().filter_metadata.remove("k3");
        assert_ne!(Resource::new(&c).unwrap().version(), ra.version());
    }
}
