//! Config errors: each names the file, line and column, and where known the object and field
//! (invariant 8 in docs/architecture.md: a user must be able to find and fix the problem from
//! the message alone).

use std::fmt;
use std::sync::Arc;

use crate::kinds::Kind;
use crate::spanned::Pos;

/// The object an error belongs to; `name` is `None` when the document has no usable name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    pub kind: Kind,
    pub namespace: String,
    pub name: Option<String>,
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(name) => write!(f, "{} {}/{}", self.kind, self.namespace, name),
            None => write!(f, "{}", self.kind),
        }
    }
}

/// One problem in a config file. Displays as `file:line:col: Kind namespace/name: field: message`
/// (the object and field parts only when known).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, thiserror::Error)]
#[error("{file}:{pos}: {}{}{message}", object_prefix(.object), field_prefix(.field))]
pub struct ConfigError {
    pub file: Arc<str>,
    pub pos: Pos,
    pub object: Option<ObjectRef>,
    /// Field path within the object, e.g. `spec.listeners[1].port`.
    pub field: Option<String>,
    pub message: String,
}

fn object_prefix(object: &Option<ObjectRef>) -> String {
    object
        .as_ref()
        .map(|o| format!("{o}: "))
        .unwrap_or_default()
}

fn field_prefix(field: &Option<String>) -> String {
    match field {
        Some(f) if !f.is_empty() => format!("{f}: "),
        _ => String::new(),
    }
}

impl ConfigError {
    pub fn line(&self) -> u32 {
        self.pos.line
    }

    pub fn column(&self) -> u32 {
        self.pos.column
    }
}

/// Every problem found in a set of config files, sorted by file and
/// position. Displays one error per line; derefs to the list so callers can
/// iterate, count and match individual [`ConfigError`]s.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigErrors(Vec<ConfigError>);

impl ConfigErrors {
    /// The errors as a plain list.
    pub fn into_vec(self) -> Vec<ConfigError> {
        self.0
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl std::ops::Deref for ConfigErrors {
    type Target = Vec<ConfigError>;
    fn deref(&self) -> &Vec<ConfigError> {
        &self.0
    }
}

impl std::ops::DerefMut for ConfigErrors {
    fn deref_mut(&mut self) -> &mut Vec<ConfigError> {
        &mut self.0
    }
}

impl From<Vec<ConfigError>> for ConfigErrors {
    fn from(errors: Vec<ConfigError>) -> Self {
        ConfigErrors(errors)
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(error: ConfigError) -> Self {
        ConfigErrors(vec![error])
    }
}

impl From<ConfigErrors> for Vec<ConfigError> {
    fn from(errors: ConfigErrors) -> Self {
        errors.0
    }
}

impl FromIterator<ConfigError> for ConfigErrors {
    fn from_iter<I: IntoIterator<Item = ConfigError>>(iter: I) -> Self {
        ConfigErrors(iter.into_iter().collect())
    }
}

impl IntoIterator for ConfigErrors {
    type Item = ConfigError;
    type IntoIter = std::vec::IntoIter<ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// Sorts errors by file and position so output is stable whatever order files were read in.
pub(crate) fn sort_errors(errors: &mut Vec<ConfigError>) {
    errors.sort();
    errors.dedup();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_format() {
        let mut e = ConfigError {
            file: "gw.yaml".into(),
            pos: Pos::new(7, 11),
            object: Some(ObjectRef {
                kind: Kind::Gateway,
                namespace: "default".into(),
                name: Some("edge".into()),
            }),
            field: Some("spec.listeners[0].port".into()),
            message: "port 0 is out of range 1..=65535".into(),
        };
        assert_eq!(
            e.to_string(),
            "gw.yaml:7:11: Gateway default/edge: spec.listeners[0].port: port 0 is out of range 1..=65535"
        );
        e.field = None;
        e.object.as_mut().unwrap().name = None;
        assert_eq!(
            e.to_string(),
            "gw.yaml:7:11: Gateway: port 0 is out of range 1..=65535"
        );
        e.object = None;
        assert_eq!(
            e.to_string(),
            "gw.yaml:7:11: port 0 is out of range 1..=65535"
        );
    }

    #[test]
    fn config_errors_display_one_per_line_and_is_an_error() {
        let e = |line| ConfigError {
            file: "gw.yaml".into(),
            pos: Pos::new(line, 1),
            object: None,
            field: None,
            message: "bad".into(),
        };
        let errs: ConfigErrors = vec![e(1), e(3)].into();
        assert_eq!(errs.to_string(), "gw.yaml:1:1: bad\ngw.yaml:3:1: bad");
        let boxed: Box<dyn std::error::Error> = Box::new(errs.clone());
        assert!(boxed.to_string().starts_with("gw.yaml:1:1"));
        assert_eq!(errs.len(), 2);
        assert_eq!((&errs).into_iter().count(), 2);
    }
}
