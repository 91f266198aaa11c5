//! Multi-document YAML → validated [`Object`]s, with every error positioned.
//!
//! Each document is parsed on its own so that one broken document does not hide the errors of the
//! others. A document is read twice: first leniently for its header (`apiVersion`, `kind`,
//! `metadata`) to learn its kind and name, then strictly (`deny_unknown_fields`) as that kind.

use std::sync::Arc;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_saphyr::MessageFormatter;

use crate::error::{ConfigError, ObjectRef, sort_errors};
use crate::kinds::secret::SecretDoc;
use crate::kinds::{
    Backend, BackendSpec, DEFAULT_NAMESPACE, Gateway, GatewaySpec, HttpRoute, HttpRouteSpec, Kind,
    Metadata, Object, Source,
};
use crate::spanned::{LineOffsetGuard, Pos, Spanned, pos_from_location};
use crate::validate;

/// Parses one file of multi-document YAML. Empty documents are skipped. Returns every object, or
/// every error found (sorted by position); never panics, whatever the input.
pub fn parse_file(path: &str, text: &str) -> Result<Vec<Object>, Vec<ConfigError>> {
    let file: Arc<str> = Arc::from(path);
    let mut objects = Vec::new();
    let mut errors = Vec::new();
    for doc in split_documents(text) {
        match parse_document(&file, doc) {
            Ok(Some(o)) => objects.push(o),
            Ok(None) => {}
            Err(mut e) => errors.append(&mut e),
        }
    }
    if errors.is_empty() {
        Ok(objects)
    } else {
        sort_errors(&mut errors);
        Err(errors)
    }
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

/// Parses and validates one document; `Ok(None)` for an empty one.
fn parse_document(file: &Arc<str>, doc: DocText<'_>) -> Result<Option<Object>, Vec<ConfigError>> {
    let _offset = LineOffsetGuard::set(doc.line_offset);
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
        Ok(None) => return Ok(None),
        Err(e) => {
            // A type error at the root means the document is not a mapping at all.
            let message = if e.field.is_none() && e.message.starts_with("invalid type") {
                "expected a Kubernetes-style object: a mapping with apiVersion, kind, metadata"
                    .to_owned()
            } else {
                e.message
            };
            return Err(vec![error(e.pos, None, e.field, message)]);
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
    let Some(kind) = Kind::from_kind_str(kind_text) else {
        return Err(vec![error(
            kind_text.pos,
            None,
            Some("kind".into()),
            format!(
                "unknown kind {:?}; supported: Gateway, HTTPRoute ({}), Backend ({}), Secret ({})",
                kind_text.value,
                Kind::Gateway.api_version(),
                Kind::Backend.api_version(),
                Kind::Secret.api_version()
            ),
        )]);
    };
    let meta = header.metadata.as_ref();
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
        Some(v) if v.value != kind.api_version() => {
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

    let source = Source {
        file: file.clone(),
        pos: doc_pos,
    };
    let mut ctx = validate::Ctx::new(file.clone(), object.clone(), doc_pos);
    let strict_error = |e: DeError| {
        vec![error(
            e.pos.or(doc_pos),
            Some(object.clone()),
            e.field,
            e.message,
        )]
    };
    let parsed = match kind {
        Kind::Gateway => {
            let d: Doc<GatewaySpec> = deserialize(doc.text).map_err(strict_error)?;
            let g = Gateway {
                metadata: d.metadata,
                spec: d.spec,
                source,
            };
            validate::gateway(&mut ctx, &g);
            Object::Gateway(Arc::new(g))
        }
        Kind::HttpRoute => {
            let d: Doc<HttpRouteSpec> = deserialize(doc.text).map_err(strict_error)?;
            let mut r = HttpRoute {
                metadata: d.metadata,
                spec: d.spec,
                source,
            };
            apply_route_defaults(&mut r.spec);
            validate::http_route(&mut ctx, &r);
            Object::HttpRoute(Arc::new(r))
        }
        Kind::Backend => {
            let d: Doc<BackendSpec> = deserialize(doc.text).map_err(strict_error)?;
            let b = Backend {
                metadata: d.metadata,
                spec: d.spec,
                source,
            };
            validate::backend(&mut ctx, &b);
            Object::Backend(Arc::new(b))
        }
        Kind::Secret => {
            let d: SecretDoc = deserialize(doc.text).map_err(strict_error)?;
            match validate::secret(&mut ctx, d, source) {
                Some(s) => Object::Secret(Arc::new(s)),
                None => return Err(ctx.into_errors()),
            }
        }
    };
    let errors = ctx.into_errors();
    if errors.is_empty() {
        Ok(Some(parsed))
    } else {
        Err(errors)
    }
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
        });
    }
    for rule in &mut spec.rules {
        if rule.matches.is_empty() {
            rule.matches.push(crate::kinds::HttpRouteMatch::default());
        }
    }
}
