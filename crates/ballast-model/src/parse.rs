//! Multi-document YAML → validated [`Object`]s, with every error positioned.
//!
//! Each document is parsed on its own so that one broken document does not hide the errors of the
//! others. A document is read twice: first leniently for its header (`apiVersion`, `kind`,
//! `metadata`) to learn its kind and name, then strictly (`deny_unknown_fields`) as that kind.

use std::sync::Arc;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_saphyr::MessageFormatter;

use crate::error::{ConfigError, ConfigErrors, ObjectRef, sort_errors};
use crate::kinds::configmap::ConfigMapDoc;
use crate::kinds::secret::SecretDoc;
use crate::kinds::{
    Backend, BackendPolicy, BackendPolicySpec, BackendSpec, BackendTlsPolicy, BackendTlsPolicySpec,
    ClientPolicy, ClientPolicySpec, DEFAULT_NAMESPACE, EndpointSlice, EndpointSliceSpec, Gateway,
    GatewaySpec, GrpcRoute, GrpcRouteSpec, HttpRoute, HttpRouteSpec, Ignored, Kind, KindMatch,
    Metadata, Namespace, NamespaceSpec, Object, ObjectKey, RateLimitPolicy, RateLimitPolicySpec,
    ReferenceGrant, ReferenceGrantSpec, SecurityPolicy, SecurityPolicySpec, Service, ServiceSpec,
    SliceEndpoint, SlicePort, Source, TcpRoute, TcpRouteSpec, TlsRoute, TlsRouteSpec,
};
use crate::set::{FileParse, ObjectId, Skipped};
use crate::spanned::{LineOffsetGuard, Pos, Spanned, pos_from_location};
use crate::validate;

/// Parses one file of multi-document YAML. Empty documents and kinds Ballast does not implement
/// are skipped. Returns every object, or every error found (sorted by position); never panics,
/// whatever the input. [`parse_file_report`] keeps the good objects of a file with errors.
pub fn parse_file(path: &str, text: &str) -> Result<Vec<Object>, ConfigErrors> {
    let parsed = parse_file_report(path, text);
    let errors = parsed.errors();
    if errors.is_empty() {
        Ok(parsed.objects)
    } else {
        Err(errors.into())
    }
}

/// Parses one file document by document, keeping everything a per-object load needs: the valid
/// objects, the invalid ones by identity (so their last good version can be kept), errors no
/// object can be blamed for (a YAML syntax error, a document without a name), skipped kinds.
pub fn parse_file_report(path: &str, text: &str) -> FileParse {
    parse_document_report(path, 0, text)
}

/// Parses one document of a file, `line_offset` file lines after its start, as
/// [`parse_file_report`] parses it inside the whole file (same positions): for text kept per
/// document, e.g. the last good state, without parsing a padded copy of the file.
pub fn parse_document_report(path: &str, line_offset: u32, text: &str) -> FileParse {
    let file: Arc<str> = Arc::from(path);
    let mut out = FileParse::default();
    for doc in split_documents(text) {
        let doc = DocText {
            line_offset: doc.line_offset.saturating_add(line_offset),
            text: doc.text,
        };
        add_document(&file, doc, &mut out);
    }
    out
}

/// Parses one document into `out`.
fn add_document(file: &Arc<str>, doc: DocText<'_>, out: &mut FileParse) {
    match parse_document(file, doc) {
        Ok(Parsed::Empty) => {}
        Ok(Parsed::Object(o)) => out.objects.push(o),
        Ok(Parsed::Skipped(s)) => out.skipped.push(s),
        Err(mut errors) => {
            sort_errors(&mut errors);
            match blamed_object(&errors) {
                Some(id) => out.invalid.push((id, errors)),
                None => out.file_errors.append(&mut errors),
            }
        }
    }
}

/// Where each document of a file's text went in its [`FileParse`], so that the next parse of
/// the file can take over the outcome of every document whose text and line did not change
/// ([`parse_file_report_reusing`]). 24 bytes per document, against ~1 KB per parsed object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DocIndex {
    docs: Vec<DocSpan>,
}

/// One document: what identifies its text, and where its outcome ends in each list of the
/// file's [`FileParse`] (it starts where the previous document's ends).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct DocSpan {
    line_offset: u32,
    /// xxh3-64 of the document's text.
    hash: u64,
    len: u32,
    /// How many entries of `objects`, `invalid`, `file_errors`, `skipped` it gave.
    counts: [u16; 4],
}

impl DocSpan {
    fn key(&self) -> (u32, u32, u64) {
        (self.line_offset, self.len, self.hash)
    }
}

/// [`parse_file_report`] that parses only the documents that changed since `old` (the file's
/// previous parse and its index): a document with the same text on the same line has the
/// same outcome (parsing depends on nothing else but the path), so it is taken over, and an
/// edit of one route among 100 in a file parses one document (issue #13, W3). Gives exactly
/// [`parse_file_report`]'s result (`tests::reusing_parse_equals_a_fresh_parse`).
pub fn parse_file_report_reusing(
    path: &str,
    text: &str,
    old: Option<(&FileParse, &DocIndex)>,
) -> (FileParse, DocIndex) {
    let file: Arc<str> = Arc::from(path);
    // Old documents by identity → their slices of the old parse.
    let mut reusable = std::collections::HashMap::new();
    if let Some((parse, index)) = old {
        let mut at = [0usize; 4];
        for d in &index.docs {
            let end = [
                at[0] + usize::from(d.counts[0]),
                at[1] + usize::from(d.counts[1]),
                at[2] + usize::from(d.counts[2]),
                at[3] + usize::from(d.counts[3]),
            ];
            if end[0] <= parse.objects.len()
                && end[1] <= parse.invalid.len()
                && end[2] <= parse.file_errors.len()
                && end[3] <= parse.skipped.len()
            {
                reusable.insert(d.key(), (at, end));
            }
            at = end;
        }
    }
    let mut out = FileParse::default();
    let mut index = DocIndex::default();
    let mut unindexable = false;
    for doc in split_documents(text) {
        let before = [
            out.objects.len(),
            out.invalid.len(),
            out.file_errors.len(),
            out.skipped.len(),
        ];
        let key = (
            doc.line_offset,
            u32::try_from(doc.text.len()).unwrap_or(u32::MAX),
            xxhash_rust::xxh3::xxh3_64(doc.text.as_bytes()),
        );
        match old.zip(reusable.get(&key)) {
            Some(((parse, _), (at, end))) => {
                out.objects.extend_from_slice(&parse.objects[at[0]..end[0]]);
                out.invalid.extend_from_slice(&parse.invalid[at[1]..end[1]]);
                out.file_errors
                    .extend_from_slice(&parse.file_errors[at[2]..end[2]]);
                out.skipped.extend_from_slice(&parse.skipped[at[3]..end[3]]);
            }
            None => add_document(&file, doc, &mut out),
        }
        let count = |i: usize, now: usize| u16::try_from(now - before[i]).unwrap_or(u16::MAX);
        let counts = [
            count(0, out.objects.len()),
            count(1, out.invalid.len()),
            count(2, out.file_errors.len()),
            count(3, out.skipped.len()),
        ];
        // A document too large to describe (65,535 objects or errors, 4 GiB) makes the index
        // unusable; an empty index only means nothing is reused next time.
        unindexable |= counts.contains(&u16::MAX) || key.1 == u32::MAX;
        index.docs.push(DocSpan {
            line_offset: key.0,
            hash: key.2,
            len: key.1,
            counts,
        });
    }
    if unindexable {
        index.docs.clear();
    }
    index.docs.shrink_to_fit();
    (out, index)
}

/// The documents of a multi-document YAML text as (lines before it, its text), split exactly as
/// the parser splits them. For tools that store one object per document (`ballast apply` writes
/// each document as one etcd value, comments included).
pub fn split_yaml_documents(text: &str) -> Vec<(u32, &str)> {
    split_documents(text)
        .into_iter()
        .map(|d| (d.line_offset, d.text))
        .collect()
}

/// The object every error of one document names, if they all name the same one.
fn blamed_object(errors: &[ConfigError]) -> Option<ObjectId> {
    let first = errors.first()?.object.as_ref()?;
    let name = first.name.as_ref()?;
    errors
        .iter()
        .all(|e| e.object.as_ref() == Some(first))
        .then(|| ObjectId {
            kind: first.kind,
            key: ObjectKey::new(&first.namespace, name),
        })
}

/// One document's outcome.
enum Parsed {
    Empty,
    Object(Object),
    Skipped(Skipped),
}

/// One YAML document: its text and the number of file lines before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DocText<'a> {
    line_offset: u32,
    text: &'a str,
}

/// Splits at document markers. YAML forbids `---`/`...` at column 0 inside any scalar or
/// collection, so a line-based split finds exactly the parser's document boundaries. Leading
/// comments and directives stay with the document they precede.
fn split_documents(text: &str) -> Vec<DocText<'_>> {
    fn is_marker(line: &str, marker: &str) -> bool {
        line.strip_prefix(marker)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r', '\n']))
    }
    let mut docs = Vec::new();
    let (mut start, mut start_line) = (0usize, 0u32);
    // Whether the current piece has a `---` or content (vs only blanks, comments, directives).
    let mut started = false;
    let mut offset = 0usize;
    let mut line_no = 0u32;
    for line in text.split_inclusive('\n') {
        let line_start = offset;
        offset += line.len();
        if is_marker(line, "---") {
            if started {
                docs.push(DocText {
                    line_offset: start_line,
                    text: &text[start..line_start],
                });
                start = line_start;
                start_line = line_no;
            }
            started = true;
        } else if is_marker(line, "...") {
            docs.push(DocText {
                line_offset: start_line,
                text: &text[start..offset],
            });
            start = offset;
            start_line = line_no + 1;
            started = false;
        } else {
            let t = line.trim_start();
            if !(t.is_empty() || t.starts_with('#') || line.starts_with('%')) {
                started = true;
            }
        }
        line_no = line_no.saturating_add(1);
    }
    if start < text.len() {
        docs.push(DocText {
            line_offset: start_line,
            text: &text[start..],
        });
    }
    docs
}

/// The lenient first read of a document.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Header {
    api_version: Option<Spanned<String>>,
    kind: Option<Spanned<String>>,
    metadata: Option<HeaderMetadata>,
}

#[derive(Deserialize)]
struct HeaderMetadata {
    name: Option<String>,
    namespace: Option<String>,
}

/// The strict read of a Gateway, HTTPRoute or Backend document.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Doc<S> {
    #[allow(dead_code)] // checked from the header
    api_version: String,
    #[allow(dead_code)]
    kind: String,
    metadata: Metadata,
    spec: S,
    /// Written by controllers (`kubectl get -o yaml` exports carry it); Ballast computes its own.
    #[serde(default)]
    #[allow(dead_code)]
    status: Ignored,
}

/// The strict read of an EndpointSlice (its fields are top-level: it has no `spec`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct EndpointSliceDoc {
    #[allow(dead_code)]
    api_version: String,
    #[allow(dead_code)]
    kind: String,
    metadata: Metadata,
    address_type: Spanned<String>,
    #[serde(default)]
    endpoints: Option<Vec<SliceEndpoint>>,
    #[serde(default)]
    ports: Option<Vec<SlicePort>>,
}

fn options() -> serde_saphyr::Options {
    // Snippets are for terminals; our messages carry file:line:col instead.
    serde_saphyr::options! { with_snippet: false }
}

/// A deserialization failure as a message, field path and position.
struct DeError {
    message: String,
    field: Option<String>,
    pos: Pos,
}

fn deserialize<T: DeserializeOwned>(text: &str) -> Result<T, DeError> {
    let mut path = None;
    let result = serde_saphyr::with_deserializer_from_str_with_options(text, options(), |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            path = Some(field_path(e.path()));
            e.into_inner()
        })
    });
    result.map_err(|e| {
        let inner = e.without_snippet();
        DeError {
            message: serde_saphyr::DefaultMessageFormatter
                .format_message(inner)
                .into_owned(),
            field: path.filter(|p| !p.is_empty()),
            pos: inner
                .location()
                .map(|l| pos_from_location(&l))
                .unwrap_or(Pos::UNKNOWN),
        }
    })
}

/// Renders a serde path as `spec.listeners[0].port`. Our `Spanned` wraps only leaf values and
/// every field literally named `value` is a `Spanned`, so a trailing `value` segment is always
/// the wrapper's and is dropped; unknown segments (`?`) carry nothing.
fn field_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let segs: Vec<&Segment> = path
        .iter()
        .filter(|s| !matches!(s, Segment::Unknown))
        .collect();
    let segs = match segs.split_last() {
        Some((Segment::Map { key }, rest)) if key == "value" => rest,
        _ => &segs[..],
    };
    let mut out = String::new();
    for seg in segs {
        match seg {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => {}
        }
    }
    out
}

/// Parses and validates one document.
fn parse_document(file: &Arc<str>, doc: DocText<'_>) -> Result<Parsed, Vec<ConfigError>> {
    let _offset = LineOffsetGuard::set(doc.line_offset);
    if let Some(result) = parse_fast(file, doc) {
        return result.map(|o| o.map_or(Parsed::Empty, Parsed::Object));
    }
    parse_two_pass(file, doc)
}

/// The general path: a lenient header read, then a strict read as the header's kind.
fn parse_two_pass(file: &Arc<str>, doc: DocText<'_>) -> Result<Parsed, Vec<ConfigError>> {
    let first_line = Pos::new(doc.line_offset + 1, 1);
    let error =
        |pos: Pos, object: Option<ObjectRef>, field: Option<String>, message: String| ConfigError {
            file: file.clone(),
            pos: pos.or(first_line),
            object,
            field,
            message,
        };

    let header: Spanned<Header> = match deserialize::<Option<Spanned<Header>>>(doc.text) {
        Ok(Some(h)) => h,
        Ok(None) => return Ok(Parsed::Empty),
        Err(e) => {
            // A type error at the root means the document is not a mapping at all.
            let not_a_mapping = e.field.is_none()
                && (e.message.starts_with("invalid type") || e.message == "expected mapping start");
            let message = if not_a_mapping {
                "expected a Kubernetes-style object: a mapping with apiVersion, kind, metadata"
                    .to_owned()
            } else {
                e.message
            };
            // The header is read as `Spanned<Header>`, whose wrapper adds a leading `value`.
            let field = e.field.map(|f| {
                f.strip_prefix("value")
                    .map(|rest| rest.trim_start_matches('.').to_owned())
                    .unwrap_or(f)
            });
            return Err(vec![error(
                e.pos,
                None,
                field.filter(|f| !f.is_empty()),
                message,
            )]);
        }
    };
    let doc_pos = header.pos.or(first_line);
    let Some(kind_text) = &header.kind else {
        return Err(vec![error(
            doc_pos,
            None,
            None,
            "missing field `kind`".into(),
        )]);
    };
    let meta = header.metadata.as_ref();
    let api_version = header.api_version.as_ref().map(|v| v.value.as_str());
    let kind = match Kind::classify(api_version, kind_text) {
        KindMatch::Known(k) | KindMatch::WrongVersion(k) => k,
        KindMatch::Unknown => {
            return Ok(Parsed::Skipped(Skipped {
                file: file.clone(),
                pos: doc_pos,
                api_version: api_version.unwrap_or_default().to_owned(),
                kind: kind_text.value.clone(),
                namespace: meta
                    .and_then(|m| m.namespace.clone())
                    .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned()),
                name: meta.and_then(|m| m.name.clone()),
            }));
        }
    };
    let object = ObjectRef {
        kind,
        namespace: meta
            .and_then(|m| m.namespace.clone())
            .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned()),
        name: meta.and_then(|m| m.name.clone()),
    };
    match &header.api_version {
        None => {
            return Err(vec![error(
                doc_pos,
                Some(object),
                None,
                "missing field `apiVersion`".into(),
            )]);
        }
        Some(v) if !kind.accepts(&v.value) => {
            return Err(vec![error(
                v.pos,
                Some(object),
                Some("apiVersion".into()),
                format!(
                    "unsupported apiVersion {:?} for {kind}; expected {}",
                    v.value,
                    kind.api_version()
                ),
            )]);
        }
        Some(_) => {}
    }

    let strict_error = |e: DeError| {
        vec![error(
            e.pos.or(doc_pos),
            Some(object.clone()),
            e.field,
            e.message,
        )]
    };
    let typed = match kind {
        Kind::Gateway => deserialize::<Doc<GatewaySpec>>(doc.text)
            .map(|d| Typed::Spec(d.metadata, TypedSpec::Gateway(d.spec))),
        Kind::HttpRoute => deserialize::<Doc<HttpRouteSpec>>(doc.text)
            .map(|d| Typed::Spec(d.metadata, TypedSpec::HttpRoute(d.spec))),
        Kind::Backend => deserialize::<Doc<BackendSpec>>(doc.text)
            .map(|d| Typed::Spec(d.metadata, TypedSpec::Backend(d.spec))),
        Kind::Secret => deserialize::<SecretDoc>(doc.text).map(Typed::Secret),
        Kind::BackendPolicy => deserialize::<Doc<BackendPolicySpec>>(doc.text)
            .map(|d| Typed::Spec(d.metadata, TypedSpec::BackendPolicy(Box::new(d.spec)))),
        Kind::BackendTlsPolicy => deserialize::<Doc<BackendTlsPolicySpec>>(doc.text)
            .map(|d| Typed::Spec(d.metadata, TypedSpec::BackendTlsPolicy(Box::new(d.spec)))),
        Kind::ConfigMap => deserialize::<ConfigMapDoc>(doc.text).map(Typed::ConfigMap),
        Kind::ClientPolicy => deserialize::<Doc<ClientPolicySpec>>(doc.text)
            .map(|d| Typed::Spec(d.metadata, TypedSpec::ClientPolicy(Box::new(d.spec)))),
        Kind::SecurityPolicy => deserialize::<Doc<SecurityPolicySpec>>(doc.text)
            .map(|d| Typed::Spec(d.metadata, TypedSpec::SecurityPolicy(Box::new(d.spec)))),
        Kind::GrpcRoute => deserialize::<Doc<GrpcRouteSpec>>(doc.text)
            .map(|d| Typed::Spec(d.metadata, TypedSpec::GrpcRoute(d.spec))),
        Kind::Service => deserialize::<Doc<ServiceSpec>>(doc.text)
            .map(|d| Typed::Spec(d.metadata, TypedSpec::Service(d.spec))),
        Kind::EndpointSlice => deserialize::<EndpointSliceDoc>(doc.text).map(|d| {
            Typed::EndpointSlice(
                d.metadata,
                EndpointSliceSpec {
                    address_type: d.address_type,
                    endpoints: d.endpoints,
                    ports: d.ports,
                },
            )
        }),
        Kind::ReferenceGrant => deserialize::<Doc<ReferenceGrantSpec>>(doc.text)
            .map(|d| Typed::Spec(d.metadata, TypedSpec::ReferenceGrant(d.spec))),
        Kind::Namespace => deserialize::<NamespaceDoc>(doc.text)
            .map(|d| Typed::Spec(d.metadata, TypedSpec::Namespace(d.spec))),
        Kind::TlsRoute => deserialize::<Doc<TlsRouteSpec>>(doc.text)
            .map(|d| Typed::Spec(d.metadata, TypedSpec::TlsRoute(d.spec))),
        Kind::TcpRoute => deserialize::<Doc<TcpRouteSpec>>(doc.text)
            .map(|d| Typed::Spec(d.metadata, TypedSpec::TcpRoute(d.spec))),
        Kind::RateLimitPolicy => deserialize::<Doc<RateLimitPolicySpec>>(doc.text)
            .map(|d| Typed::Spec(d.metadata, TypedSpec::RateLimitPolicy(Box::new(d.spec)))),
    }
    .map_err(strict_error)?;
    finish(file, object, doc_pos, typed).map(Parsed::Object)
}

/// A document deserialized as its kind, not yet validated.
enum Typed {
    Spec(Metadata, TypedSpec),
    Secret(SecretDoc),
    ConfigMap(ConfigMapDoc),
    EndpointSlice(Metadata, EndpointSliceSpec),
}

enum TypedSpec {
    Gateway(GatewaySpec),
    HttpRoute(HttpRouteSpec),
    Backend(BackendSpec),
    // Boxed: far larger than the other specs.
    BackendPolicy(Box<BackendPolicySpec>),
    BackendTlsPolicy(Box<BackendTlsPolicySpec>),
    ClientPolicy(Box<ClientPolicySpec>),
    SecurityPolicy(Box<SecurityPolicySpec>),
    GrpcRoute(GrpcRouteSpec),
    Service(ServiceSpec),
    ReferenceGrant(ReferenceGrantSpec),
    Namespace(NamespaceSpec),
    TlsRoute(TlsRouteSpec),
    TcpRoute(TcpRouteSpec),
    RateLimitPolicy(Box<RateLimitPolicySpec>),
}

/// A Namespace document: `spec` is optional (and `status` is what `kubectl get -o yaml`
/// prints; accepted and ignored).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NamespaceDoc {
    #[allow(dead_code)]
    api_version: String,
    #[allow(dead_code)]
    kind: String,
    metadata: Metadata,
    #[serde(default)]
    spec: NamespaceSpec,
    #[serde(default)]
    #[allow(dead_code)]
    status: Option<serde::de::IgnoredAny>,
}

/// Applies defaults and validates; the one place both parse paths build objects.
fn finish(
    file: &Arc<str>,
    object: ObjectRef,
    doc_pos: Pos,
    typed: Typed,
) -> Result<Object, Vec<ConfigError>> {
    let source = Source {
        file: file.clone(),
        pos: doc_pos,
    };
    let mut ctx = validate::Ctx::new(file.clone(), object, doc_pos);
    let parsed = match typed {
        Typed::Spec(metadata, TypedSpec::Gateway(spec)) => {
            let g = Gateway::new(metadata, spec, source);
            validate::gateway(&mut ctx, &g);
            Object::Gateway(Arc::new(g))
        }
        Typed::Spec(metadata, TypedSpec::HttpRoute(spec)) => {
            let mut r = HttpRoute {
                metadata,
                spec,
                source,
            };
            apply_route_defaults(&mut r.spec);
            validate::http_route(&mut ctx, &r);
            Object::HttpRoute(Arc::new(r))
        }
        Typed::Spec(metadata, TypedSpec::Backend(spec)) => {
            let mut b = Backend {
                metadata,
                spec,
                source,
            };
            // Kept for the process's life: no spare room (see `shrink_route`).
            b.spec.endpoints.shrink_to_fit();
            validate::backend(&mut ctx, &b);
            Object::Backend(Arc::new(b))
        }
        Typed::Spec(metadata, TypedSpec::BackendPolicy(spec)) => {
            let p = BackendPolicy {
                metadata,
                spec: *spec,
                source,
            };
            crate::kinds::policy::validate_backend_policy(&mut ctx, &p);
            Object::BackendPolicy(Arc::new(p))
        }
        Typed::Spec(metadata, TypedSpec::BackendTlsPolicy(spec)) => {
            let p = BackendTlsPolicy {
                metadata,
                spec: *spec,
                source,
            };
            crate::kinds::backend_tls::validate_backend_tls_policy(&mut ctx, &p);
            Object::BackendTlsPolicy(Arc::new(p))
        }
        Typed::Spec(metadata, TypedSpec::RateLimitPolicy(spec)) => {
            let p = RateLimitPolicy {
                metadata,
                spec: *spec,
                source,
            };
            crate::kinds::rate_limit::validate_rate_limit_policy(&mut ctx, &p);
            Object::RateLimitPolicy(Arc::new(p))
        }
        Typed::Spec(metadata, TypedSpec::ClientPolicy(spec)) => {
            let p = ClientPolicy {
                metadata,
                spec: *spec,
                source,
            };
            crate::kinds::client_policy::validate_client_policy(&mut ctx, &p);
            Object::ClientPolicy(Arc::new(p))
        }
        Typed::Spec(metadata, TypedSpec::SecurityPolicy(spec)) => {
            let p = SecurityPolicy {
                metadata,
                spec: *spec,
                source,
            };
            crate::kinds::security_policy::validate_security_policy(&mut ctx, &p);
            Object::SecurityPolicy(Arc::new(p))
        }
        Typed::ConfigMap(d) => {
            let c = d.into_config_map(source);
            validate::config_map(&mut ctx, &c);
            Object::ConfigMap(Arc::new(c))
        }
        Typed::Spec(metadata, TypedSpec::TlsRoute(spec)) => {
            let r = TlsRoute::new(metadata, spec, source);
            validate::l4_route(&mut ctx, &r.as_http, r.spec.rules.len());
            Object::TlsRoute(Arc::new(r))
        }
        Typed::Spec(metadata, TypedSpec::TcpRoute(spec)) => {
            let r = TcpRoute::new(metadata, spec, source);
            validate::l4_route(&mut ctx, &r.as_http, r.spec.rules.len());
            Object::TcpRoute(Arc::new(r))
        }
        Typed::Spec(metadata, TypedSpec::GrpcRoute(spec)) => {
            let r = GrpcRoute::new(metadata, spec, source);
            validate::grpc_route(&mut ctx, &r);
            Object::GrpcRoute(Arc::new(r))
        }
        Typed::Spec(metadata, TypedSpec::Service(spec)) => {
            let svc = Service {
                metadata,
                spec,
                source,
            };
            validate::service(&mut ctx, &svc);
            Object::Service(Arc::new(svc))
        }
        Typed::EndpointSlice(metadata, spec) => {
            let es = EndpointSlice {
                metadata,
                spec,
                source,
            };
            validate::endpoint_slice(&mut ctx, &es);
            Object::EndpointSlice(Arc::new(es))
        }
        Typed::Spec(metadata, TypedSpec::ReferenceGrant(spec)) => {
            let g = ReferenceGrant {
                metadata,
                spec,
                source,
            };
            validate::reference_grant(&mut ctx, &g);
            Object::ReferenceGrant(Arc::new(g))
        }
        Typed::Spec(metadata, TypedSpec::Namespace(spec)) => {
            let n = Namespace {
                metadata,
                spec,
                source,
            };
            validate::namespace(&mut ctx, &n);
            Object::Namespace(Arc::new(n))
        }
        Typed::Secret(d) => match validate::secret(&mut ctx, d, source) {
            Some(s) => Object::Secret(Arc::new(s)),
            None => return Err(ctx.into_errors()),
        },
    };
    let errors = ctx.into_errors();
    if errors.is_empty() {
        Ok(parsed)
    } else {
        Err(errors)
    }
}

/// The fast path: one strict pass when `apiVersion` and `kind` precede `spec` (as in nearly all
/// manifests), dispatching on `kind` while reading. YAML parsing dominates load time, and this
/// halves it for large configs. Anything unusual (kind after spec, unknown key, Secret, any
/// error) declines, and the two-pass path produces the object or the positioned errors.
struct FastDoc {
    kind: Kind,
    metadata: Metadata,
    spec: TypedSpec,
}

impl<'de> Deserialize<'de> for FastDoc {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = FastDoc;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<FastDoc, A::Error> {
                use serde::de::Error;
                let decline = || A::Error::custom("declined by the fast path");
                let (mut api, mut kind, mut metadata, mut spec) = (None, None, None, None);
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match key.as_ref() {
                        "apiVersion" if api.is_none() => api = Some(map.next_value::<String>()?),
                        "kind" if kind.is_none() => {
                            let k = map.next_value::<String>()?;
                            kind = Some(Kind::from_kind_str(&k).ok_or_else(decline)?);
                        }
                        "metadata" if metadata.is_none() => metadata = Some(map.next_value()?),
                        "spec" if spec.is_none() => {
                            spec = Some(match kind {
                                Some(Kind::Gateway) => TypedSpec::Gateway(map.next_value()?),
                                Some(Kind::HttpRoute) => TypedSpec::HttpRoute(map.next_value()?),
                                Some(Kind::Backend) => TypedSpec::Backend(map.next_value()?),
                                Some(Kind::BackendPolicy) => {
                                    TypedSpec::BackendPolicy(map.next_value()?)
                                }
                                Some(Kind::BackendTlsPolicy) => {
                                    TypedSpec::BackendTlsPolicy(map.next_value()?)
                                }
                                Some(Kind::ClientPolicy) => {
                                    TypedSpec::ClientPolicy(map.next_value()?)
                                }
                                Some(Kind::ReferenceGrant) => {
                                    TypedSpec::ReferenceGrant(map.next_value()?)
                                }
                                _ => return Err(decline()),
                            })
                        }
                        _ => return Err(decline()),
                    }
                }
                match (api, kind, metadata, spec) {
                    (Some(api), Some(kind), Some(metadata), Some(spec)) if kind.accepts(&api) => {
                        Ok(FastDoc {
                            kind,
                            metadata,
                            spec,
                        })
                    }
                    _ => Err(decline()),
                }
            }
        }
        d.deserialize_map(V)
    }
}

/// `Some` when the fast path produced a result (an object, no object for an empty document, or
/// validation errors); `None` to take the two-pass path.
fn parse_fast(
    file: &Arc<str>,
    doc: DocText<'_>,
) -> Option<Result<Option<Object>, Vec<ConfigError>>> {
    let parsed =
        serde_saphyr::from_str_with_options::<Option<Spanned<FastDoc>>>(doc.text, options())
            .ok()?;
    let Some(fast) = parsed else {
        return Some(Ok(None));
    };
    let doc_pos = fast.pos.or(Pos::new(doc.line_offset + 1, 1));
    let FastDoc {
        kind,
        metadata,
        spec,
    } = fast.value;
    let object = ObjectRef {
        kind,
        namespace: metadata.namespace.clone(),
        name: Some(metadata.name.clone()),
    };
    Some(finish(file, object, doc_pos, Typed::Spec(metadata, spec)).map(Some))
}

/// Gateway API defaults that change meaning, made explicit so consumers need not know them:
/// no rules is one rule, and a rule without matches matches `PathPrefix /`.
fn apply_route_defaults(spec: &mut HttpRouteSpec) {
    if spec.rules.is_empty() {
        spec.rules.push(crate::kinds::HttpRouteRule {
            name: None,
            matches: Vec::new(),
            filters: Vec::new(),
            backend_refs: Vec::new(),
            timeouts: None,
            retry: None,
            session_persistence: None,
        });
    }
    for rule in &mut spec.rules {
        if rule.matches.is_empty() {
            rule.matches.push(crate::kinds::HttpRouteMatch::default());
        }
    }
    shrink_route(spec);
}

/// Drops the spare capacity serde leaves in a route's lists. serde-saphyr gives no size hint, so
/// each list grows by doubling from 4: one backendRef or match holds room for four, five rules
/// room for eight. Routes are kept for the process's life, and at 17,000 rules (issue #13, W4)
/// that slack was 20 MB of the heap.
fn shrink_route(spec: &mut HttpRouteSpec) {
    spec.parent_refs.shrink_to_fit();
    spec.hostnames.shrink_to_fit();
    spec.rules.shrink_to_fit();
    for rule in &mut spec.rules {
        rule.matches.shrink_to_fit();
        for m in &mut rule.matches {
            m.headers.shrink_to_fit();
            m.query_params.shrink_to_fit();
        }
        rule.filters.shrink_to_fit();
        rule.backend_refs.shrink_to_fit();
        for b in &mut rule.backend_refs {
            b.filters.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::*;
    use proptest::prelude::*;
    use std::net::IpAddr;
    use std::time::Duration;

    const CANONICAL: &str = include_str!("../testdata/canonical.yaml");

    fn errors(text: &str) -> Vec<String> {
        match parse_file("f.yaml", text) {
            Ok(o) => panic!("expected errors, parsed {} objects", o.len()),
            Err(es) => es.iter().map(ToString::to_string).collect(),
        }
    }

    fn one_error(text: &str) -> String {
        let es = errors(text);
        assert_eq!(es.len(), 1, "{es:#?}");
        es.into_iter().next().unwrap()
    }

    fn objects(text: &str) -> Vec<Object> {
        parse_file("f.yaml", text).unwrap_or_else(|es| {
            panic!(
                "{}",
                es.iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        })
    }

    #[test]
    fn parsed_route_and_backend_lists_have_no_spare_capacity() {
        let objs = objects(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: { name: r }\nspec:\n  parentRefs: [{ name: edge }]\n  hostnames: [a.example.com]\n  rules:\n  - matches: [{ path: { type: PathPrefix, value: /a } }]\n    backendRefs: [{ group: ballast.dev, kind: Backend, name: b }]\n  - backendRefs: [{ group: ballast.dev, kind: Backend, name: b }]\n  - {}\n  - {}\n  - {}\n---\napiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: { name: b }\nspec:\n  endpoints: [{ address: 10.0.0.1, port: 80 }]\n",
        );
        let [Object::HttpRoute(r), Object::Backend(b)] = &objs[..] else {
            panic!("{objs:?}")
        };
        let spec = &r.spec;
        assert_eq!(spec.rules.len(), 5);
        assert_eq!(spec.rules.capacity(), 5);
        assert_eq!(spec.parent_refs.capacity(), 1);
        assert_eq!(spec.hostnames.capacity(), 1);
        for rule in &spec.rules {
            assert_eq!(rule.matches.capacity(), rule.matches.len());
            assert_eq!(rule.backend_refs.capacity(), rule.backend_refs.len());
        }
        assert_eq!(b.spec.endpoints.capacity(), 1);
    }

    /// Rules are the bulk of a large config (17,000 in W4): the rarely set optional blocks are
    /// boxed so a plain rule stays small.
    #[test]
    fn a_route_rule_is_small() {
        let size = std::mem::size_of::<HttpRouteRule>();
        assert!(size <= 128, "HttpRouteRule is {size} bytes");
    }

    #[test]
    fn canonical_example_parses_unchanged() {
        let objs = objects(CANONICAL);
        assert_eq!(objs.len(), 3);
        let Object::Gateway(g) = &objs[0] else {
            panic!()
        };
        assert_eq!(g.key(), ObjectKey::new("default", "edge"));
        assert_eq!(g.source.pos, Pos::new(1, 1));
        assert_eq!(g.spec.gateway_class_name, "ballast");
        assert_eq!(
            *g.spec.addresses[0].value,
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
        let [http, https] = &g.spec.listeners[..] else {
            panic!()
        };
        assert_eq!(
            (http.name.as_str(), *http.port, *http.protocol),
            ("http", 10000, ListenerProtocol::Http)
        );
        assert_eq!(http.hostname(), None);
        assert_eq!(https.hostname(), Some("*.example.com"));
        assert_eq!(*https.protocol, ListenerProtocol::Https);
        let refs = &https.tls.as_ref().unwrap().certificate_refs;
        assert_eq!(
            (refs[0].name.as_str(), refs[0].is_secret()),
            ("example-tls", true)
        );
        assert_eq!(https.allowed_routes.namespaces.from, FromNamespaces::Same);

        let Object::HttpRoute(r) = &objs[1] else {
            panic!()
        };
        assert_eq!(r.key(), ObjectKey::new("default", "web"));
        assert_eq!(r.source.pos, Pos::new(15, 1));
        assert_eq!(r.spec.parent_refs[0].name.as_str(), "edge");
        assert!(r.spec.parent_refs[0].is_gateway());
        assert_eq!(r.spec.hostnames[0].as_str(), "web.example.com");
        let rule = &r.spec.rules[0];
        assert_eq!(rule.matches[0].path.type_, PathMatchType::PathPrefix);
        assert_eq!(rule.matches[0].path.value.as_str(), "/");
        let b = &rule.backend_refs[0];
        assert_eq!(
            (b.name.as_str(), *b.weight, b.is_backend()),
            ("web", 1, true)
        );

        let Object::Backend(be) = &objs[2] else {
            panic!()
        };
        assert_eq!(be.key(), ObjectKey::new("default", "web"));
        assert_eq!(be.spec.endpoints[0].address.to_string(), "127.0.0.1");
        assert_eq!(*be.spec.endpoints[0].port, 8080);
        assert_eq!(be.spec.endpoints[0].weight(), 1);
        assert_eq!(be.spec.endpoints[0].health, HealthStatus::Healthy);
        assert_eq!(be.spec.load_balancer.policy, LbPolicy::RoundRobin);
        assert_eq!(
            be.spec.connect_timeout.as_deref(),
            Some(&Duration::from_secs(1))
        );
    }

    #[test]
    fn every_field_of_every_kind() {
        let text = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: edge
  namespace: infra
  labels: { team: net }
  annotations: { note: hi }
spec:
  gatewayClassName: ballast
  addresses: [{ value: "::1" }]
  listeners:
  - name: https
    port: 443
    protocol: HTTPS
    hostname: "*.example.com"
    tls:
      mode: Terminate
      certificateRefs: [{ group: "", kind: Secret, name: tls, namespace: certs }]
    allowedRoutes: { namespaces: { from: All } }
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: { name: api, namespace: apps }
spec:
  parentRefs:
  - { group: gateway.networking.k8s.io, kind: Gateway, name: edge, namespace: infra, sectionName: https, port: 443 }
  hostnames: [api.example.com]
  rules:
  - name: main
    matches:
    - path: { type: Exact, value: /v1/users }
      headers: [{ name: X-Version, value: "2" }, { type: RegularExpression, name: x-id, value: "[0-9]+" }]
      queryParams: [{ name: debug, value: "true" }]
      method: POST
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{ name: x-env, value: prod }]
        add: [{ name: x-trace, value: "1" }]
        remove: [x-internal]
    - type: ResponseHeaderModifier
      responseHeaderModifier: { remove: [server] }
    - type: URLRewrite
      urlRewrite: { hostname: internal.example.com, path: { type: ReplaceFullPath, replaceFullPath: /users } }
    backendRefs:
    - { group: ballast.dev, kind: Backend, name: api, namespace: apps, port: 8080, weight: 90 }
    - { name: api-canary, weight: 10 }
    timeouts: { request: 10s, backendRequest: 2s }
    retry: { attempts: 3, perTryTimeout: 500ms, retryOn: [5xx, reset] }
  - matches: [{ path: { type: PathPrefix, value: /old } }]
    filters:
    - type: RequestRedirect
      requestRedirect:
        scheme: https
        hostname: new.example.com
        port: 8443
        statusCode: 301
        path: { type: ReplacePrefixMatch, replacePrefixMatch: /new }
---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: { name: api, namespace: apps }
spec:
  endpoints:
  - { address: 10.0.0.1, port: 8080, weight: 3, zone: us-east-1a, health: Draining }
  - { address: "fd00::2", port: 8080 }
  loadBalancer: { policy: Maglev }
  connectTimeout: 250ms
  healthCheck: { path: /healthz, interval: 10s, timeout: 2s, healthyThreshold: 2, unhealthyThreshold: 5 }
"#;
        let objs = objects(text);
        let Object::Gateway(g) = &objs[0] else {
            panic!()
        };
        assert_eq!(g.metadata.namespace, "infra");
        assert_eq!(g.metadata.labels["team"], "net");
        assert_eq!(g.metadata.annotations["note"], "hi");
        assert_eq!(g.spec.addresses[0].type_, AddressType::IPAddress);
        let l = &g.spec.listeners[0];
        assert_eq!(l.allowed_routes.namespaces.from, FromNamespaces::All);
        assert_eq!(
            l.tls.as_ref().unwrap().certificate_refs[0]
                .namespace
                .as_deref(),
            Some("certs")
        );

        let Object::HttpRoute(r) = &objs[1] else {
            panic!()
        };
        let p = &r.spec.parent_refs[0];
        assert_eq!(
            (p.section_name.as_deref(), p.port.as_deref()),
            (Some("https"), Some(&443))
        );
        let rule = &r.spec.rules[0];
        assert_eq!(rule.name.as_ref().map(|n| n.as_str()), Some("main"));
        let m = &rule.matches[0];
        assert_eq!(m.path.type_, PathMatchType::Exact);
        assert_eq!(m.headers[1].type_, StringMatchType::RegularExpression);
        assert_eq!(m.headers[0].value.as_str(), "2");
        assert_eq!(m.query_params[0].value.as_str(), "true");
        assert_eq!(m.method, Some(HttpMethod::Post));
        let Some(FilterAction::RequestHeaderModifier(h)) = rule.filters[0].action() else {
            panic!()
        };
        assert_eq!(
            (
                h.set[0].name.as_str(),
                h.add[0].value.as_str(),
                h.remove[0].as_str()
            ),
            ("x-env", "1", "x-internal")
        );
        let Some(FilterAction::UrlRewrite(u)) = rule.filters[2].action() else {
            panic!()
        };
        assert_eq!(
            u.path.as_ref().unwrap().rewrite(),
            Some(PathRewrite::FullPath("/users"))
        );
        assert_eq!(*rule.backend_refs[1].weight, 10);
        assert_eq!(rule.backend_refs[0].port.as_deref(), Some(&8080));
        let t = rule.timeouts.as_ref().unwrap();
        assert_eq!(
            (t.request.as_deref(), t.backend_request.as_deref()),
            (
                Some(&Duration::from_secs(10)),
                Some(&Duration::from_secs(2))
            )
        );
        let retry = rule.retry.as_ref().unwrap();
        assert_eq!(
            (*retry.attempts, retry.per_try_timeout.as_deref()),
            (3, Some(&Duration::from_millis(500)))
        );
        assert_eq!(retry.retry_on(), vec!["5xx", "reset"]);
        let Some(FilterAction::RequestRedirect(rr)) = r.spec.rules[1].filters[0].action() else {
            panic!()
        };
        assert_eq!(
            (
                rr.scheme.as_deref().map(String::as_str),
                *rr.status_code,
                rr.port.as_deref()
            ),
            (Some("https"), 301, Some(&8443))
        );
        assert_eq!(
            rr.path.as_ref().unwrap().rewrite(),
            Some(PathRewrite::PrefixMatch("/new"))
        );

        let Object::Backend(b) = &objs[2] else {
            panic!()
        };
        let e = &b.spec.endpoints[0];
        assert_eq!(
            (e.weight(), e.zone.as_deref(), e.health),
            (3, Some("us-east-1a"), HealthStatus::Draining)
        );
        assert!(b.spec.endpoints[1].address.is_ipv6());
        assert_eq!(b.spec.load_balancer.policy, LbPolicy::Maglev);
        let hc = b.spec.health_check.as_ref().unwrap();
        assert_eq!(
            (
                hc.path.as_str(),
                *hc.interval,
                *hc.timeout,
                *hc.healthy_threshold,
                *hc.unhealthy_threshold
            ),
            (
                "/healthz",
                Duration::from_secs(10),
                Duration::from_secs(2),
                2,
                5
            )
        );
    }

    #[test]
    fn gateway_api_defaults_are_applied() {
        let objs = objects(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\n\
             spec:\n  rules:\n  - backendRefs: [{name: b}]\n  - matches: [{headers: [{name: x, value: y}]}]\n",
        );
        let Object::HttpRoute(r) = &objs[0] else {
            panic!()
        };
        let m = &r.spec.rules[0].matches;
        assert_eq!(m.len(), 1);
        assert_eq!(
            (m[0].path.type_, m[0].path.value.as_str()),
            (PathMatchType::PathPrefix, "/")
        );
        assert_eq!(*r.spec.rules[0].backend_refs[0].weight, 1);
        let m = &r.spec.rules[1].matches[0];
        assert_eq!(
            (m.path.type_, m.path.value.as_str()),
            (PathMatchType::PathPrefix, "/")
        );
        assert_eq!(m.headers[0].type_, StringMatchType::Exact);

        let objs = objects(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec: {}\n",
        );
        let Object::HttpRoute(r) = &objs[0] else {
            panic!()
        };
        assert_eq!(r.spec.rules.len(), 1);
        assert_eq!(r.spec.rules[0].matches, vec![HttpRouteMatch::default()]);
        assert_eq!(r.spec.rules[0].retry, None);

        let objs = objects(
            "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {name: b}\nspec:\n  healthCheck: {path: /}\n",
        );
        let Object::Backend(b) = &objs[0] else {
            panic!()
        };
        let hc = b.spec.health_check.as_ref().unwrap();
        assert_eq!(
            (
                *hc.interval,
                *hc.timeout,
                *hc.healthy_threshold,
                *hc.unhealthy_threshold
            ),
            (Duration::from_secs(5), Duration::from_secs(1), 1, 3)
        );
        assert_eq!(b.spec.connect_timeout, None);
    }

    /// The single-pass fast path must produce exactly what the two-pass path does (content and
    /// positions), and must actually be taken for ordinary documents.
    #[test]
    fn fast_path_agrees_with_two_pass_path() {
        let file: Arc<str> = Arc::from("f.yaml");
        let docs_md = include_str!("../../../docs/configuration.md");
        let yaml: Vec<&str> = docs_md
            .split("```yaml\n")
            .skip(1)
            .map(|b| b.split("```").next().unwrap())
            .collect();
        let broken_route = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\n\
                            spec:\n  rules: [{matches: [{path: {type: RegularExpression, value: \"(\"}}]}]\n";
        let mut fast_taken = 0;
        for text in yaml.iter().copied().chain([CANONICAL, broken_route]) {
            for doc in split_documents(text) {
                let _g = LineOffsetGuard::set(doc.line_offset);
                let slow = parse_two_pass(&file, doc).map(|p| match p {
                    Parsed::Object(o) => Some(o),
                    _ => None,
                });
                let Some(fast) = parse_fast(&file, doc) else {
                    continue;
                };
                fast_taken += 1;
                assert_eq!(fast, slow, "{}", doc.text);
                if let (Ok(Some(f)), Ok(Some(s))) = (&fast, &slow) {
                    assert_eq!(f.source(), s.source());
                }
            }
        }
        assert!(fast_taken >= 8, "fast path taken only {fast_taken} times");
        // Secrets, kind after spec and unknown keys decline to the two-pass path.
        for text in [
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ntype: kubernetes.io/tls\n",
            "spec: {}\nkind: Backend\napiVersion: ballast.dev/v1alpha1\nmetadata: {name: b}\n",
            "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {name: b}\nspec: {}\nextra: 1\n",
            "apiVersion: ballast.dev/v1\nkind: Backend\nmetadata: {name: b}\nspec: {}\n",
        ] {
            let doc = split_documents(text)[0];
            assert!(parse_fast(&file, doc).is_none(), "{text}");
        }
        assert_eq!(
            objects(
                "spec: {}\nkind: Backend\napiVersion: ballast.dev/v1alpha1\nmetadata: {name: b}\n"
            )
            .len(),
            1
        );
    }

    #[test]
    fn empty_documents_and_markers_are_skipped() {
        assert!(objects("").is_empty());
        assert!(objects("# nothing\n\n").is_empty());
        assert!(objects("---\n---\n...\n").is_empty());
        let text = format!("%YAML 1.2\n---\n# c\n{CANONICAL}\n...\n---\n\n---\n");
        assert_eq!(objects(&text).len(), 3);
    }

    #[test]
    fn documents_parse_alone_as_in_their_file() {
        let text = "# head\napiVersion: v1\nkind: ConfigMap\nmetadata: { name: a }\ndata: { k: v }\n---\n\n\
                    apiVersion: v1\nkind: ConfigMap\nmetadata: { name: b }\ndata: { k: [1 }\n--- \n\
                    apiVersion: v1\nkind: ConfigMap\nmetadata: { name: c }\ndata: { k: w }\n";
        let whole = parse_file_report("f.yaml", text);
        let mut alone = FileParse::default();
        for (offset, doc) in split_yaml_documents(text) {
            let p = parse_document_report("f.yaml", offset, doc);
            alone.objects.extend(p.objects);
            alone.invalid.extend(p.invalid);
            alone.file_errors.extend(p.file_errors);
        }
        assert_eq!(whole.objects.len(), 2);
        assert_eq!(whole, alone);
        for (a, b) in whole.objects.iter().zip(&alone.objects) {
            assert_eq!(a.source(), b.source());
        }
        assert_eq!(
            whole.errors(),
            alone.errors(),
            "errors at the same positions"
        );
    }

    #[test]
    fn split_keeps_line_offsets() {
        let docs = split_documents("# c\na: 1\n---\nb: 2\n--- {c: 3}\n...\n%YAML 1.2\n---\nd: 4");
        let got: Vec<(u32, &str)> = docs.iter().map(|d| (d.line_offset, d.text)).collect();
        assert_eq!(
            got,
            vec![
                (0, "# c\na: 1\n"),
                (2, "---\nb: 2\n"),
                (4, "--- {c: 3}\n...\n"),
                (6, "%YAML 1.2\n---\nd: 4"),
            ]
        );
        // `----` and `---x` are content, not markers.
        assert_eq!(split_documents("a: |\n  ----\n---x: 1\n").len(), 1);
    }

    // ---- error classes: exact file:line:col and message ----

    const GW: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: edge }\nspec:\n  gatewayClassName: ballast\n  listeners:\n";

    #[test]
    fn yaml_syntax_error() {
        assert_eq!(
            one_error("a: [1, 2\n"),
            "f.yaml:1:4: a: unclosed bracket '['"
        );
    }

    #[test]
    fn not_a_mapping() {
        assert_eq!(
            one_error("---\n- a\n"),
            "f.yaml:2:1: expected a Kubernetes-style object: a mapping with apiVersion, kind, metadata"
        );
    }

    #[test]
    fn unknown_kinds_are_skipped_not_errors() {
        let text = "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: x}\n---\n\
            apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
            metadata: {name: g, namespace: apps}\nspec: {podSelector: {}}\n---\n\
            apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: Backend\nmetadata: {name: b}\n\
            spec: {endpoints: [{fqdn: {hostname: x.example.com, port: 80}}]}\n---\n\
            kind: SomethingElse\n---\n{CANONICAL}"
            .replace("{CANONICAL}", CANONICAL);
        let p = parse_file_report("f.yaml", &text);
        assert!(p.errors().is_empty(), "{:?}", p.errors());
        assert_eq!(p.objects.len(), 3);
        let got: Vec<String> = p.skipped.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            got,
            [
                "f.yaml:1:1: skipped ServiceAccount default/x (v1): kind not implemented by Ballast",
                "f.yaml:5:1: skipped NetworkPolicy apps/g (networking.k8s.io/v1): kind not implemented by Ballast",
                "f.yaml:10:1: skipped Backend default/b (gateway.envoyproxy.io/v1alpha1): kind not implemented by Ballast",
                "f.yaml:15:1: skipped SomethingElse (no apiVersion): kind not implemented by Ballast",
            ]
        );
        // The strict entry point agrees: skipped kinds are no errors.
        assert_eq!(parse_file("f.yaml", &text).unwrap().len(), 3);
    }

    #[test]
    fn invalid_objects_are_kept_apart_from_file_errors() {
        let text = format!(
            "{CANONICAL}---\napiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {{name: bad}}\n\
             spec: {{endpoints: [{{address: 10.0.0.1, port: 0}}], extra: 1}}\n---\nkind: Backend\n\
             apiVersion: ballast.dev/v1alpha1\nmetadata: {{namespace: x}}\nspec: {{}}\n"
        );
        let p = parse_file_report("f.yaml", &text);
        assert_eq!(p.objects.len(), 3, "the good documents are kept");
        assert_eq!(p.invalid.len(), 1);
        assert_eq!(
            p.invalid[0].0,
            ObjectId {
                kind: Kind::Backend,
                key: ObjectKey::new("default", "bad")
            }
        );
        assert_eq!(
            p.invalid[0].1[0].to_string(),
            "f.yaml:37:51: Backend default/bad: spec.extra: unknown field `extra`, expected one \
             of endpoints, loadBalancer, connectTimeout, healthCheck, appProtocol, protocol, dns"
        );
        // No name: nothing to blame but the file.
        assert_eq!(p.file_errors.len(), 1, "{:?}", p.file_errors);
        // A YAML syntax error is the file's too.
        let p = parse_file_report("f.yaml", &format!("{CANONICAL}---\nkind: [\n"));
        assert_eq!(
            (p.objects.len(), p.invalid.len(), p.file_errors.len()),
            (3, 0, 1)
        );
    }

    #[test]
    fn wrong_api_version_of_our_kinds() {
        assert_eq!(
            one_error(
                "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: HTTPRoute\nmetadata: {name: r, namespace: n}\nspec: {}\n"
            ),
            "f.yaml:1:13: HTTPRoute n/r: apiVersion: unsupported apiVersion \
             \"gateway.networking.k8s.io/v1beta1\" for HTTPRoute; expected gateway.networking.k8s.io/v1"
        );
        assert_eq!(
            one_error("\n\nkind: Backend\nmetadata: {name: b}\n"),
            "f.yaml:3:1: Backend default/b: missing field `apiVersion`"
        );
        assert_eq!(
            one_error("apiVersion: v1\n"),
            "f.yaml:1:1: missing field `kind`"
        );
    }

    #[test]
    fn unknown_fields_are_rejected() {
        assert_eq!(
            one_error(&format!(
                "{GW}  - {{ name: a, port: 80, protocol: HTTP, hostnme: x }}\n"
            )),
            "f.yaml:7:42: Gateway default/edge: spec.listeners[0].hostnme: unknown field `hostnme`, \
             expected one of name, hostname, port, protocol, tls, allowedRoutes"
        );
        // Server-set metadata (uid, managedFields, ...) and `status` are accepted (kubectl
        // exports); anything else is still an error.
        let e = one_error(
            "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {name: b, colour: x}\nspec: {}\n",
        );
        assert!(
            e.starts_with(
                "f.yaml:3:21: Backend default/b: metadata.colour: unknown field `colour`, expected one of \
                 name, namespace, labels, annotations, uid"
            ),
            "{e}"
        );
        assert!(
            parse_file(
                "f.yaml",
                "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {name: b, uid: x, resourceVersion: '1'}\nspec: {}\nstatus: {x: 1}\n"
            )
            .is_ok()
        );
        assert_eq!(
            one_error(
                "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {name: b}\nspec: {}\nbogus: {}\n"
            ),
            "f.yaml:5:1: Backend default/b: bogus: unknown field `bogus`, expected one of \
             apiVersion, kind, metadata, spec, status"
        );
    }

    #[test]
    fn missing_required_field() {
        assert_eq!(
            one_error(
                "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {namespace: x}\nspec: {}\n"
            ),
            "f.yaml:3:12: Backend: metadata: missing field `name`"
        );
    }

    #[test]
    fn bad_enum_value() {
        assert_eq!(
            one_error(&format!(
                "{GW}  - name: a\n    port: 80\n    protocol: UDP\n"
            )),
            "f.yaml:9:15: Gateway default/edge: spec.listeners[0].protocol: unknown variant `UDP`, \
             expected one of HTTP, HTTPS, TLS, TCP"
        );
    }

    #[test]
    fn bad_duration_is_reported_at_its_value() {
        assert_eq!(
            one_error(
                "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {name: b}\nspec:\n  connectTimeout: 1.5s\n"
            ),
            "f.yaml:5:19: Backend default/b: spec.connectTimeout: invalid duration \"1.5s\": expected \
             up to 4 parts of a number (at most 5 digits) and a unit h, m, s or ms, e.g. \"1s\", \
             \"250ms\", \"1m30s\""
        );
    }

    #[test]
    fn invalid_regex_in_a_later_document_has_file_coordinates() {
        let text = format!(
            "{CANONICAL}---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
             metadata: {{ name: re, namespace: apps }}\nspec:\n  rules:\n  - matches:\n    \
             - path: {{ type: RegularExpression, value: \"/a(b\" }}\n      \
             headers: [{{ type: RegularExpression, name: x, value: \"[z-a]\" }}]\n"
        );
        assert_eq!(
            errors(&text),
            vec![
                "f.yaml:40:47: HTTPRoute apps/re: spec.rules[0].matches[0].path.value: invalid \
                 regular expression \"/a(b\": unclosed group",
                "f.yaml:41:60: HTTPRoute apps/re: spec.rules[0].matches[0].headers[0].value: \
                 invalid regular expression \"[z-a]\": invalid character class range, the start \
                 must be <= the end",
            ]
        );
    }

    #[test]
    fn every_broken_document_is_reported() {
        let text = format!(
            "{GW}  - {{ name: a, port: 0, protocol: HTTP }}\n---\nmetadata: {{}}\n---\n{CANONICAL}"
        );
        assert_eq!(
            errors(&text),
            vec![
                "f.yaml:7:22: Gateway default/edge: spec.listeners[0].port: port 0 is out of range 1..=65535",
                "f.yaml:9:1: missing field `kind`",
            ]
        );
    }

    #[test]
    fn gateway_semantic_errors() {
        let text = format!(
            "{GW}  - {{ name: a, port: 70000, protocol: HTTP }}\n  - {{ name: a, port: 80, protocol: HTTPS, hostname: \"*.Ex.com\" }}\n  \
             - {{ name: Bad_Name, port: 80, protocol: HTTP, tls: {{ certificateRefs: [{{name: s}}] }} }}\n  \
             - {{ name: d, port: 81, protocol: HTTP }}\n  - {{ name: e, port: 81, protocol: HTTP }}\n"
        );
        assert_eq!(
            errors(&text),
            vec![
                "f.yaml:7:22: Gateway default/edge: spec.listeners[0].port: port 70000 is out of range 1..=65535",
                "f.yaml:8:13: Gateway default/edge: spec.listeners[1].name: duplicate listener name \"a\" (also spec.listeners[0])",
                "f.yaml:8:36: Gateway default/edge: spec.listeners[1].tls: an HTTPS listener needs tls.certificateRefs",
                "f.yaml:8:53: Gateway default/edge: spec.listeners[1].hostname: invalid hostname \"*.Ex.com\": expected lowercase DNS labels (a-z, 0-9, '-'), optionally prefixed by \"*.\"",
                "f.yaml:9:13: Gateway default/edge: spec.listeners[2].name: listener name \"Bad_Name\" is not a valid DNS label (lowercase a-z, 0-9, '-', at most 63 characters)",
                "f.yaml:9:43: Gateway default/edge: spec.listeners[2].tls: tls is only allowed on HTTPS and TLS listeners",
            ]
        );
    }

    #[test]
    fn route_semantic_errors() {
        let text = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  \
            parentRefs: [{name: edge, port: 0}]\n  hostnames: [\"*\"]\n  rules:\n  \
            - matches: [{path: {type: Exact, value: a/b}, headers: [{name: X, value: 1}, {name: x, value: 2}], method: GET}]\n    \
            filters:\n    - type: RequestRedirect\n      requestRedirect: {scheme: ftp, statusCode: 200, path: {type: ReplacePrefixMatch, replaceFullPath: /x}}\n    \
            - type: URLRewrite\n      urlRewrite: {hostname: \"*.x.com\"}\n    \
            - type: RequestHeaderModifier\n      requestHeaderModifier: {set: [{name: a, value: \"x\\ny\"}, {name: A, value: z}]}\n    \
            timeouts: {request: 1s, backendRequest: 2s}\n    retry: {attempts: 1, retryOn: []}\n";
        assert_eq!(
            errors(text),
            vec![
                "f.yaml:1:1: HTTPRoute default/r: spec.rules[0].retry.retryOn: retryOn must not be empty (omit it for the default)",
                "f.yaml:5:35: HTTPRoute default/r: spec.parentRefs[0].port: port 0 is out of range 1..=65535",
                "f.yaml:6:15: HTTPRoute default/r: spec.hostnames[0]: invalid hostname \"*\": expected lowercase DNS labels (a-z, 0-9, '-'), optionally prefixed by \"*.\"",
                "f.yaml:8:43: HTTPRoute default/r: spec.rules[0].matches[0].path.value: path \"a/b\" must start with '/'",
                "f.yaml:8:87: HTTPRoute default/r: spec.rules[0].matches[0].headers[1].name: header \"x\" is matched twice",
                "f.yaml:10:13: HTTPRoute default/r: spec.rules[0].filters: RequestRedirect and URLRewrite cannot be used in the same rule",
                "f.yaml:11:33: HTTPRoute default/r: spec.rules[0].filters[0].requestRedirect.scheme: scheme must be http or https, not \"ftp\"",
                "f.yaml:11:50: HTTPRoute default/r: spec.rules[0].filters[0].requestRedirect.statusCode: statusCode must be 301, 302, 303, 307 or 308, not 200",
                "f.yaml:11:68: HTTPRoute default/r: spec.rules[0].filters[0].requestRedirect.path: ReplacePrefixMatch needs every match of the rule to be a PathPrefix match",
                "f.yaml:11:68: HTTPRoute default/r: spec.rules[0].filters[0].requestRedirect.path.replaceFullPath: field replaceFullPath is not allowed with path type ReplacePrefixMatch",
                "f.yaml:11:68: HTTPRoute default/r: spec.rules[0].filters[0].requestRedirect.path.replacePrefixMatch: path type ReplacePrefixMatch needs field replacePrefixMatch",
                "f.yaml:13:30: HTTPRoute default/r: spec.rules[0].filters[1].urlRewrite.hostname: hostname \"*.x.com\" must not be a wildcard here",
                "f.yaml:15:54: HTTPRoute default/r: spec.rules[0].filters[2].requestHeaderModifier.set[0].value: header value must not contain CR, LF or NUL",
                "f.yaml:15:70: HTTPRoute default/r: spec.rules[0].filters[2].requestHeaderModifier.set[1].name: header \"A\" appears twice in set",
                "f.yaml:16:45: HTTPRoute default/r: spec.rules[0].timeouts.backendRequest: backendRequest (2s) must not be longer than request (1s)",
            ]
        );
    }

    #[test]
    fn grpc_route_semantic_errors() {
        let text = "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: g}\nspec:\n  \
            rules:\n  - matches:\n    - method: {service: \"pkg.Echo/x\", method: \"1a\"}\n    - method: {}\n    \
            - method: {type: RegularExpression, method: \"(\"}\n      headers: [{name: a, value: x}, {name: A, value: y}]\n    \
            backendRefs: [{name: b, weight: 2000000}]\n";
        assert_eq!(
            errors(text),
            vec![
                "f.yaml:1:1: GRPCRoute default/g: spec.rules[0].matches[1].method: a method match needs service, method or both",
                "f.yaml:7:25: GRPCRoute default/g: spec.rules[0].matches[0].method.service: invalid gRPC service name \"pkg.Echo/x\": expected dot-separated identifiers (a-z, A-Z, 0-9, '_'), e.g. \"pkg.Echo\"",
                "f.yaml:7:47: GRPCRoute default/g: spec.rules[0].matches[0].method.method: invalid gRPC method name \"1a\": expected an identifier (a-z, A-Z, 0-9, '_'), e.g. \"Echo\"",
                "f.yaml:9:49: GRPCRoute default/g: spec.rules[0].matches[2].method.method: invalid regular expression \"(\": unclosed group",
                "f.yaml:10:45: GRPCRoute default/g: spec.rules[0].matches[2].headers[1].name: header \"A\" is matched twice",
                "f.yaml:11:37: GRPCRoute default/g: spec.rules[0].backendRefs[0].weight: weight 2000000 is out of range 0..=1000000",
            ]
        );
        // Filters GRPCRoute does not share with HTTPRoute are rejected by name.
        let e = one_error(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: g}\nspec:\n  rules: [{filters: [{type: URLRewrite}]}]\n",
        );
        assert!(e.contains("unknown variant `URLRewrite`"), "{e}");
        // ExtensionRef (no extension mechanism in ballast) too, at its position.
        let e = one_error(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: g}\nspec:\n  rules: [{filters: [{type: ExtensionRef, extensionRef: {group: x, kind: y, name: z}}]}]\n",
        );
        assert!(
            e.starts_with("f.yaml:5:") && e.contains("unknown variant `ExtensionRef`"),
            "{e}"
        );
    }

    /// RequestMirror on a GRPCRoute rule is validated like HTTPRoute's, with GRPCRoute field
    /// paths and positions, and carried into the HTTPRoute equivalent.
    #[test]
    fn grpc_route_request_mirror() {
        let head = "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: g}\nspec:\n  rules:\n  - filters:\n";
        let objs = objects(&format!(
            "{head}    - {{type: RequestMirror, requestMirror: {{backendRef: {{name: shadow}}, percent: 25}}}}\n    \
             - {{type: RequestMirror, requestMirror: {{backendRef: {{name: shadow2}}}}}}\n    backendRefs: [{{name: b}}]\n"
        ));
        let Object::GrpcRoute(g) = &objs[0] else {
            panic!()
        };
        let mirrors: Vec<(&str, u32)> = g.as_http.spec.rules[0]
            .filters
            .iter()
            .map(|f| {
                let m = f.request_mirror.as_ref().unwrap();
                (m.backend_ref.name.as_str(), m.millionths())
            })
            .collect();
        assert_eq!(mirrors, vec![("shadow", 250_000), ("shadow2", 1_000_000)]);
        assert_eq!(
            errors(&format!(
                "{head}    - {{type: RequestMirror, requestMirror: {{backendRef: {{name: s}}, percent: 101}}}}\n    \
                 - {{type: RequestMirror}}\n"
            )),
            vec![
                "f.yaml:7:77: GRPCRoute default/g: spec.rules[0].filters[0].requestMirror.percent: percent 101 is out of range 0..=100",
                "f.yaml:8:14: GRPCRoute default/g: spec.rules[0].filters[1].requestMirror: filter type RequestMirror needs field requestMirror",
            ]
        );
    }

    #[test]
    fn grpc_method_matches_become_path_matches() {
        let objs = objects(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: g}\nspec:\n  rules:\n  \
             - matches:\n    - method: {service: pkg.Echo, method: Echo}\n    - method: {service: pkg.Echo}\n    \
             - method: {method: Echo}\n    - method: {type: RegularExpression, service: \"pkg\\\\..*\"}\n    - headers: [{name: v, value: one}]\n",
        );
        let Object::GrpcRoute(g) = &objs[0] else {
            panic!()
        };
        let paths: Vec<(PathMatchType, &str)> = g.as_http.spec.rules[0]
            .matches
            .iter()
            .map(|m| (m.path.type_, m.path.value.as_str()))
            .collect();
        assert_eq!(
            paths,
            vec![
                (PathMatchType::Exact, "/pkg.Echo/Echo"),
                (PathMatchType::PathPrefix, "/pkg.Echo"),
                (PathMatchType::RegularExpression, "/[^/]+/Echo"),
                (PathMatchType::RegularExpression, "/(?:pkg\\..*)/[^/]+"),
                (PathMatchType::PathPrefix, "/"),
            ]
        );
        assert_eq!(g.as_http.key(), g.key());
    }

    #[test]
    fn filter_type_must_match_its_field() {
        let text = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  rules:\n  \
            - filters:\n    - type: ResponseHeaderModifier\n      requestHeaderModifier: {remove: [x]}\n    \
            - type: ResponseHeaderModifier\n      responseHeaderModifier: {remove: [\"a b\"]}\n";
        assert_eq!(
            errors(text),
            vec![
                "f.yaml:7:13: HTTPRoute default/r: spec.rules[0].filters[0].requestHeaderModifier: field requestHeaderModifier is not allowed on a filter of type ResponseHeaderModifier",
                "f.yaml:7:13: HTTPRoute default/r: spec.rules[0].filters[0].responseHeaderModifier: filter type ResponseHeaderModifier needs field responseHeaderModifier",
                "f.yaml:9:13: HTTPRoute default/r: spec.rules[0].filters[1].type: filter ResponseHeaderModifier appears twice in one rule (also spec.rules[0].filters[0])",
                "f.yaml:10:41: HTTPRoute default/r: spec.rules[0].filters[1].responseHeaderModifier.remove[0]: invalid header name \"a b\"",
            ]
        );
    }

    #[test]
    fn backend_ref_filters_parse_and_validate() {
        let head = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  rules:\n  - backendRefs:\n";
        let objs = objects(&format!(
            "{head}    - name: a\n      filters:\n      - {{type: RequestHeaderModifier, requestHeaderModifier: {{set: [{{name: x-a, value: \"1\"}}]}}}}\n      \
             - {{type: ResponseHeaderModifier, responseHeaderModifier: {{remove: [server]}}}}\n      \
             - {{type: RequestRedirect, requestRedirect: {{statusCode: 999}}}}\n    - name: b\n"
        ));
        let Object::HttpRoute(r) = &objs[0] else {
            panic!()
        };
        let refs = &r.spec.rules[0].backend_refs;
        let (req, resp) = refs[0].header_modifiers();
        assert_eq!(req.unwrap().set[0].name.as_str(), "x-a");
        assert_eq!(resp.unwrap().remove[0].as_str(), "server");
        // Unsupported types load (reported in status, not refused) and are not validated.
        assert_eq!(
            refs[0].unsupported_filters().collect::<Vec<_>>(),
            [(2, FilterType::RequestRedirect)]
        );
        assert_eq!(refs[1].header_modifiers(), (None, None));
        // Supported ones are validated like a rule's, at the backendRef's path.
        assert_eq!(
            errors(&format!(
                "{head}    - name: a\n      filters:\n      - {{type: RequestHeaderModifier, requestHeaderModifier: {{remove: [\"a b\"]}}}}\n      \
                 - {{type: RequestHeaderModifier, requestHeaderModifier: {{remove: [x]}}}}\n"
            )),
            vec![
                "f.yaml:9:72: HTTPRoute default/r: spec.rules[0].backendRefs[0].filters[0].requestHeaderModifier.remove[0]: invalid header name \"a b\"",
                "f.yaml:10:16: HTTPRoute default/r: spec.rules[0].backendRefs[0].filters[1].type: filter RequestHeaderModifier appears twice in one rule (also spec.rules[0].backendRefs[0].filters[0])",
            ]
        );
        // A mirror target is a plain object reference: no filters.
        let e = one_error(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  rules:\n  \
             - filters:\n    - type: RequestMirror\n      requestMirror:\n        backendRef: {name: m, filters: [{type: RequestHeaderModifier, requestHeaderModifier: {}}]}\n",
        );
        assert!(
            e.contains("spec.rules[0].filters[0].requestMirror.backendRef.filters: a requestMirror backendRef cannot have filters"),
            "{e}"
        );
    }

    #[test]
    fn cors_filter_parses_with_defaults() {
        let text = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  rules:\n  \
            - filters:\n    - type: CORS\n      cors:\n        allowOrigins: [\"https://app.example\", \"https://*.example.com:8443\"]\n        \
            allowMethods: [GET, PUT]\n        allowHeaders: [x-client]\n        exposeHeaders: [x-trace]\n        \
            allowCredentials: true\n";
        let objs = objects(text);
        let Object::HttpRoute(r) = &objs[0] else {
            panic!("{objs:?}")
        };
        let Some(FilterAction::Cors(c)) = r.spec.rules[0].filters[0].action() else {
            panic!("{:?}", r.spec.rules[0].filters[0])
        };
        assert_eq!(c.allow_origins[1].as_str(), "https://*.example.com:8443");
        assert_eq!(
            c.allow_methods
                .iter()
                .map(|m| m.as_str())
                .collect::<Vec<_>>(),
            ["GET", "PUT"]
        );
        assert_eq!(c.allow_headers[0].as_str(), "x-client");
        assert_eq!(c.expose_headers[0].as_str(), "x-trace");
        assert_eq!(c.allow_credentials, Some(true));
        assert_eq!(c.max_age_seconds(), 5, "Gateway API default");
        // Only allowOrigins: everything else is optional.
        let objs = objects(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  \
             rules: [{filters: [{type: CORS, cors: {allowOrigins: [\"*\"], maxAge: 600}}]}]\n",
        );
        let Object::HttpRoute(r) = &objs[0] else {
            panic!("{objs:?}")
        };
        let Some(FilterAction::Cors(c)) = r.spec.rules[0].filters[0].action() else {
            panic!()
        };
        assert_eq!(c.max_age_seconds(), 600);
    }

    /// Gateway API's CEL rules for sessionPersistence and the names Envoy needs are errors at
    /// the field's position.
    #[test]
    fn session_persistence_errors_name_the_field() {
        let rule = |sp: &str| {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r}}\nspec:\n  rules:\n  - sessionPersistence: {sp}\n"
            )
        };
        let cases = [
            (
                "{ cookieConfig: { lifetimeType: Permanent } }",
                "f.yaml:6:57: HTTPRoute default/r: spec.rules[0].sessionPersistence.absoluteTimeout: absoluteTimeout is required when cookie lifetimeType is Permanent",
            ),
            (
                "{ type: Header, cookie: { name: a } }",
                "f.yaml:6:33: HTTPRoute default/r: spec.rules[0].sessionPersistence.cookie: cookie is only allowed with type: Cookie",
            ),
            (
                "{ header: { name: x } }",
                "f.yaml:6:43: HTTPRoute default/r: spec.rules[0].sessionPersistence.header: header is only allowed with type: Header (the default type is Cookie)",
            ),
            (
                "{ sessionName: \"a b\" }",
                "f.yaml:6:40: HTTPRoute default/r: spec.rules[0].sessionPersistence.sessionName: invalid cookie name \"a b\": 1 to 128 token characters (letters, digits, !#$%&'*+-.^_`|~)",
            ),
            (
                "{ sessionName: a, cookie: { name: b } }",
                "f.yaml:6:59: HTTPRoute default/r: spec.rules[0].sessionPersistence.sessionName: sessionName \"a\" and the cookie name \"b\" disagree; give one",
            ),
            (
                "{ cookie: { path: x } }",
                "f.yaml:6:43: HTTPRoute default/r: spec.rules[0].sessionPersistence.cookie.path: invalid cookie path \"x\": must start with / (at most 1024 characters, no ;)",
            ),
            (
                "{ absoluteTimeout: 0s }",
                "f.yaml:6:44: HTTPRoute default/r: spec.rules[0].sessionPersistence.absoluteTimeout: absoluteTimeout must be greater than 0",
            ),
        ];
        for (sp, want) in cases {
            assert_eq!(one_error(&rule(sp)), want, "{sp}");
        }
        // Both shapes load.
        for ok in [
            "{ sessionName: s, absoluteTimeout: 1h, idleTimeout: 5m, type: Cookie, cookieConfig: { lifetimeType: Permanent } }",
            "{ type: Cookie, cookie: { name: s, path: /app, lifetimeType: Session } }",
            "{ type: Header, header: { name: x-session } }",
            "{ type: Header, sessionName: x-session }",
            "{}",
        ] {
            parse_file("f.yaml", &rule(ok)).unwrap_or_else(|e| panic!("{ok}: {e:?}"));
        }
    }

    #[test]
    fn cors_filter_errors_name_the_field() {
        let text = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  rules:\n  \
            - filters:\n    - type: CORS\n      cors:\n        allowOrigins: [\"*\", \"ftp://a.example\", \"https://a.example/x\", \"http://b:0\"]\n        \
            allowMethods: [get, GET, GET]\n        allowHeaders: [\"a b\", X, x]\n        maxAge: 0\n    \
            - type: CORS\n";
        assert_eq!(
            errors(text),
            vec![
                "f.yaml:9:24: HTTPRoute default/r: spec.rules[0].filters[0].cors.allowOrigins: allowOrigins cannot contain '*' alongside other entries",
                "f.yaml:9:29: HTTPRoute default/r: spec.rules[0].filters[0].cors.allowOrigins[1]: invalid origin \"ftp://a.example\": scheme must be http or https",
                "f.yaml:9:48: HTTPRoute default/r: spec.rules[0].filters[0].cors.allowOrigins[2]: invalid origin \"https://a.example/x\": host must be letters, digits, '-', '.' and '*' wildcards (no path)",
                "f.yaml:9:71: HTTPRoute default/r: spec.rules[0].filters[0].cors.allowOrigins[3]: invalid origin \"http://b:0\": port must be 1..=65535",
                "f.yaml:10:24: HTTPRoute default/r: spec.rules[0].filters[0].cors.allowMethods[0]: invalid method \"get\": expected one of GET, HEAD, POST, PUT, DELETE, CONNECT, OPTIONS, TRACE, PATCH, * (case-sensitive)",
                "f.yaml:10:34: HTTPRoute default/r: spec.rules[0].filters[0].cors.allowMethods[2]: \"GET\" appears twice in allowMethods",
                "f.yaml:11:24: HTTPRoute default/r: spec.rules[0].filters[0].cors.allowHeaders[0]: invalid header name \"a b\"",
                "f.yaml:11:34: HTTPRoute default/r: spec.rules[0].filters[0].cors.allowHeaders[2]: \"x\" appears twice in allowHeaders",
                "f.yaml:12:17: HTTPRoute default/r: spec.rules[0].filters[0].cors.maxAge: maxAge must be between 1 and 2147483647 seconds, not 0",
                "f.yaml:13:13: HTTPRoute default/r: spec.rules[0].filters[1].cors: filter type CORS needs field cors",
                "f.yaml:13:13: HTTPRoute default/r: spec.rules[0].filters[1].type: filter CORS appears twice in one rule (also spec.rules[0].filters[0])",
            ]
        );
        // Unknown fields are still errors with file:line:col.
        let e = one_error(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  \
             rules: [{filters: [{type: CORS, cors: {allowOrigin: [\"*\"]}}]}]\n",
        );
        assert!(e.starts_with("f.yaml:5:"), "{e}");
        assert!(e.contains("allowOrigin"), "{e}");
    }

    #[test]
    fn backend_semantic_errors() {
        let text = "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {name: B}\nspec:\n  endpoints:\n  \
            - {address: 10.0.0.1, port: 80, weight: 0}\n  - {address: 10.0.0.1, port: 80, zone: \"\"}\n  \
            connectTimeout: 0s\n  healthCheck: {path: health, interval: 0s, unhealthyThreshold: 0}\n";
        assert_eq!(
            errors(text),
            vec![
                "f.yaml:1:1: Backend default/B: metadata.name: name \"B\" is not a valid DNS subdomain (lowercase a-z, 0-9, '-', '.', at most 253 characters)",
                "f.yaml:6:43: Backend default/B: spec.endpoints[0].weight: weight 0 is out of range 1..=1000000",
                "f.yaml:7:15: Backend default/B: spec.endpoints[1].address: duplicate endpoint 10.0.0.1:80 (also spec.endpoints[0])",
                "f.yaml:7:15: Backend default/B: spec.endpoints[1].zone: zone must not be empty",
                "f.yaml:8:19: Backend default/B: spec.connectTimeout: connectTimeout must be greater than 0",
                "f.yaml:9:23: Backend default/B: spec.healthCheck.path: path \"health\" must start with '/'",
                "f.yaml:9:41: Backend default/B: spec.healthCheck.interval: interval must be greater than 0",
                "f.yaml:9:65: Backend default/B: spec.healthCheck.unhealthyThreshold: unhealthyThreshold must be at least 1",
            ]
        );
        assert_eq!(
            one_error(
                "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {name: b}\nspec:\n  endpoints: [{address: 10.0.0.300, port: 80}]\n"
            ),
            "f.yaml:5:25: Backend default/b: spec.endpoints[0].address: \"10.0.0.300\" is not a valid IP address"
        );
    }

    #[test]
    fn backend_hostname_endpoints_parse_with_dns_settings() {
        let text = "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {name: api}\nspec:\n  \
            endpoints:\n  - {address: api.example.com, port: 443}\n  - {address: 10.0.0.1, port: 443}\n  \
            dns: {mode: Strict, refreshRate: 2s, respectTtl: true, lookupFamily: V4Preferred}\n";
        let objs = objects(text);
        let Object::Backend(b) = &objs[0] else {
            panic!()
        };
        assert!(b.spec.is_dns());
        assert_eq!(
            b.spec.endpoints[0].address.hostname(),
            Some("api.example.com")
        );
        assert_eq!(
            b.spec.endpoints[1].address.ip(),
            Some("10.0.0.1".parse().unwrap())
        );
        let dns = b.spec.dns.as_ref().unwrap();
        assert_eq!(
            (
                *dns.mode,
                dns.refresh_rate.as_ref().map(|d| d.value),
                dns.respect_ttl,
                dns.lookup_family
            ),
            (
                DnsMode::Strict,
                Some(std::time::Duration::from_secs(2)),
                true,
                Some(LookupFamily::V4Preferred)
            )
        );
        // IP-only Backends stay EDS Backends.
        let ip_only = objects(
            "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {name: b}\nspec:\n  endpoints: [{address: 10.0.0.1, port: 80}]\n",
        );
        let Object::Backend(b) = &ip_only[0] else {
            panic!()
        };
        assert!(!b.spec.is_dns());
    }

    #[test]
    fn backend_hostname_and_dns_errors_are_positioned() {
        let text = "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {name: b}\nspec:\n  endpoints:\n  \
            - {address: Web_Host, port: 80}\n  - {address: \"*.example.com\", port: 80}\n  \
            - {address: a.example.com, port: 80}\n  - {address: a.example.com, port: 80}\n  \
            dns: {mode: Logical, refreshRate: 0s}\n";
        assert_eq!(
            errors(text),
            vec![
                "f.yaml:6:15: Backend default/b: spec.endpoints[0].address: invalid hostname \"Web_Host\": expected lowercase DNS labels (a-z, 0-9, '-'), optionally prefixed by \"*.\"; an endpoint address is an IP address or a DNS name Envoy resolves",
                "f.yaml:7:15: Backend default/b: spec.endpoints[1].address: \"*.example.com\" is a wildcard; an endpoint needs an IP address or a DNS name Envoy can resolve",
                "f.yaml:9:15: Backend default/b: spec.endpoints[3].address: duplicate endpoint a.example.com:80 (also spec.endpoints[2])",
                "f.yaml:10:15: Backend default/b: spec.dns.mode: mode Logical needs exactly one endpoint (Envoy LOGICAL_DNS), found 4; use Strict for several",
                "f.yaml:10:37: Backend default/b: spec.dns.refreshRate: refreshRate must be at least 1ms",
            ]
        );
        // Unknown fields and modes are parse errors with their position.
        let e = one_error(
            "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {name: b}\nspec:\n  endpoints: [{address: a.test, port: 80}]\n  dns: {mode: Lazy}\n",
        );
        assert!(e.starts_with("f.yaml:6:"), "{e}");
        assert!(e.contains("Lazy"), "{e}");
    }

    const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    const KEY: &str = "-----BEGIN EC PRIVATE KEY-----\nMHcC\n-----END EC PRIVATE KEY-----\n";

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }
    use base64::Engine as _;

    #[test]
    fn tls_secret_from_data_and_string_data() {
        let text = format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: tls, namespace: certs}}\ntype: kubernetes.io/tls\n\
             data:\n  tls.crt: {}\n  tls.key: {}\n---\napiVersion: v1\nkind: Secret\nmetadata: {{name: s2}}\n\
             type: kubernetes.io/tls\ndata:\n  tls.key: {}\nstringData:\n  tls.key: |\n    {}\n  tls.crt: |\n    {}\n",
            b64(CERT),
            b64(KEY),
            b64("garbage"),
            KEY.trim_end().replace('\n', "\n    "),
            CERT.trim_end().replace('\n', "\n    "),
        );
        let objs = objects(&text);
        let Object::Secret(s) = &objs[0] else {
            panic!()
        };
        assert_eq!(s.key(), ObjectKey::new("certs", "tls"));
        assert_eq!(
            (s.tls.certificate_chain.as_str(), s.tls.private_key.as_str()),
            (CERT, KEY)
        );
        assert!(
            !format!("{s:?}").contains("MHcC"),
            "Debug must not print the key"
        );
        let Object::Secret(s2) = &objs[1] else {
            panic!()
        };
        assert_eq!(s2.tls.private_key, KEY, "stringData wins over data");
    }

    #[test]
    fn tls_secret_errors() {
        let text = format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: s}}\ntype: Opaque\ndata:\n  tls.crt: \"%%%\"\n  \
             tls.pem: x\nstringData:\n  ca.crt: hello\n---\napiVersion: v1\nkind: Secret\nmetadata: {{name: t}}\n\
             stringData:\n  tls.crt: {:?}\n",
            KEY
        );
        assert_eq!(
            errors(&text),
            vec![
                "f.yaml:1:1: Secret default/s: data: missing tls.key (in data or stringData)",
                "f.yaml:4:7: Secret default/s: type: unsupported Secret type \"Opaque\"; only kubernetes.io/tls is supported",
                "f.yaml:6:12: Secret default/s: data.tls.crt: invalid base64: Invalid symbol 37, offset 0.",
                "f.yaml:7:12: Secret default/s: data.tls.pem: unsupported key \"tls.pem\"; a TLS Secret has tls.crt, tls.key and optionally ca.crt",
                "f.yaml:9:11: Secret default/s: stringData.ca.crt: ca.crt is not PEM (expected \"-----BEGIN ...CERTIFICATE-----\")",
                "f.yaml:11:1: Secret default/t: data: missing tls.key (in data or stringData)",
                "f.yaml:11:1: Secret default/t: type: missing field `type` (must be kubernetes.io/tls)",
                "f.yaml:15:12: Secret default/t: stringData.tls.crt: tls.crt is not PEM (expected \"-----BEGIN ...CERTIFICATE-----\")",
            ]
        );
    }

    #[test]
    fn field_path_drops_only_the_spanned_wrapper() {
        // `port` is Spanned (wrapper dropped); `value` of a path match is a real field.
        assert_eq!(
            one_error(&format!(
                "{GW}  - {{ name: a, port: -1, protocol: HTTP }}\n"
            )),
            "f.yaml:7:22: Gateway default/edge: spec.listeners[0].port: invalid u32"
        );
        assert!(
            one_error("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec:\n  rules: [{matches: [{path: {value: [1]}}]}]\n")
                .starts_with("f.yaml:5:37: HTTPRoute default/r: spec.rules[0].matches[0].path.value: ")
        );
    }

    /// Documents of every outcome for `reusing_parse_equals_a_fresh_parse`; `PORT` varies.
    const REUSE_DOCS: [&str; 7] = [
        "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: { name: a }\nspec:\n  endpoints: [{ address: 10.0.0.1, port: PORT }]\n",
        "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: { name: b }\nspec:\n  endpoints: [{ address: 10.0.0.2, port: PORT }]\n",
        // Invalid (an unknown field), blamed on the object.
        "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: { name: c }\nspec:\n  bogus: PORT\n  endpoints: [{ address: 10.0.0.3, port: 80 }]\n",
        // YAML syntax error: a file error.
        "kind: [PORT\n",
        // A kind Ballast skips.
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: { name: w }\nspec: { size: PORT }\n",
        // Empty.
        "# nothing here PORT\n",
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: { name: r }\nspec:\n  parentRefs: [{ name: edge }]\n  hostnames: [hPORT.example.com]\n  rules:\n  - backendRefs: [{ name: a, port: PORT }]\n",
    ];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Fuzz-style: arbitrary text never panics and errors always carry a position.
        #[test]
        fn never_panics_on_arbitrary_text(text in "\\PC{0,200}") {
            if let Err(es) = parse_file("fuzz.yaml", &text) {
                for e in es {
                    prop_assert!(e.pos.line >= 1);
                }
            }
        }

        /// Arbitrary bytes, as the file source would read them (lossy UTF-8).
        #[test]
        fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_file("fuzz.yaml", &String::from_utf8_lossy(&bytes));
        }

        /// Reusing the unchanged documents of the previous parse gives exactly a fresh parse
        /// (objects with their sources, invalid objects, file errors, skipped kinds, all at
        /// the same positions), over random edits of a file of documents of every outcome:
        /// documents edited, added, removed, swapped, moved by a line, broken and fixed.
        #[test]
        fn reusing_parse_equals_a_fresh_parse(
            steps in proptest::collection::vec(
                proptest::collection::vec((0usize..REUSE_DOCS.len(), 0u8..3, any::<bool>()), 0..8),
                1..6,
            ),
        ) {
            let mut old: Option<(FileParse, DocIndex)> = None;
            for docs in steps {
                let mut text = String::new();
                for (doc, port, blank) in &docs {
                    if *blank {
                        text.push_str("# a comment moves what follows by a line\n");
                    }
                    text.push_str("---\n");
                    text.push_str(&REUSE_DOCS[*doc].replace("PORT", &(80 + u32::from(*port)).to_string()));
                }
                let fresh = parse_file_report("f.yaml", &text);
                let (got, index) = parse_file_report_reusing(
                    "f.yaml",
                    &text,
                    old.as_ref().map(|(p, i)| (p, i)),
                );
                prop_assert_eq!(&got, &fresh);
                let sources = |p: &FileParse| p.objects.iter().map(|o| o.source().clone()).collect::<Vec<_>>();
                prop_assert_eq!(sources(&got), sources(&fresh));
                prop_assert_eq!(got.errors(), fresh.errors());
                // Re-parsing the same text reuses every document's objects.
                let (again, _) = parse_file_report_reusing("f.yaml", &text, Some((&got, &index)));
                prop_assert!(again.objects.iter().zip(&got.objects).all(|(a, b)| a.ptr_eq(b)));
                old = Some((got, index));
            }
        }

        /// YAML-shaped noise: mutations of the canonical example.
        #[test]
        fn never_panics_on_mutated_config(cut in 0usize..CANONICAL.len(), insert in "[-:{}\\[\\],#&*!|>'\" \\n a-z0-9]{0,8}") {
            let mut text = CANONICAL.to_owned();
            let cut = (0..=cut).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
            text.insert_str(cut, &insert);
            if let Err(es) = parse_file("fuzz.yaml", &text) {
                for e in es {
                    prop_assert!(e.pos.line >= 1 && e.pos.line as usize <= text.lines().count() + 1, "{e}");
                }
            }
        }
    }
}
