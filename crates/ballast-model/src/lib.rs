//! `ballast-model`: the config kinds of DESIGN §5 (Gateway API `Gateway` and `HTTPRoute`,
//! ballast's `Backend`, TLS `Secret`), multi-document YAML parsing with file:line:col positions,
//! validation, the [`ConfigSet`] of all objects, and Gateway API status.
//!
//! It knows nothing of protobuf or Envoy: translation turns a valid [`ConfigSet`] into Envoy
//! resources elsewhere. Everything here is deterministic (`BTreeMap`s, sorted errors), so the
//! same files give the same set and the same messages on every replica.
//!
//! Invalid input never produces a `ConfigSet` (DESIGN §3.8, last known good): structurally
//! invalid objects are errors; *unresolved references* between valid objects (a route to a
//! missing Backend) load fine and are reported as status, as in Gateway API.
#![forbid(unsafe_code)]

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
pub use error::{ConfigError, ObjectRef};
pub use hostname::{ANY_HOST, effective_hostnames, hostname_matches, intersect, validate_hostname};
pub use kinds::*;
pub use parse::parse_file;
pub use set::ConfigSet;
pub use spanned::{Pos, Spanned};
pub use validate::MAX_WEIGHT;
