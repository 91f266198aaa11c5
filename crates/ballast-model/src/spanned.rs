//! Source positions attached to parsed values.
//!
//! Validation runs after deserialization, so values that can be wrong in ways serde cannot see
//! (a regex, a port range, a hostname) keep the position of the YAML node they came from.

use std::cell::Cell;
use std::fmt;
use std::ops::Deref;

use serde::{Deserialize, Deserializer, Serialize};

/// A 1-based line and column (in characters) in a config file; `0:0` means "unknown".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Pos {
    pub line: u32,
    pub column: u32,
}

impl Pos {
    pub const UNKNOWN: Pos = Pos { line: 0, column: 0 };

    pub fn new(line: u32, column: u32) -> Self {
        Pos { line, column }
    }

    pub fn is_known(&self) -> bool {
        self.line != 0
    }

    /// `self` if known, else `fallback` (usually the object's document start).
    pub fn or(self, fallback: Pos) -> Pos {
        if self.is_known() { self } else { fallback }
    }
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// A value with the position of the YAML node it was read from.
///
/// Equality (and hashing) ignore the position: moving an object within or between files is not a
/// config change, so callers diffing two `ConfigSet`s must not see one.
#[derive(Clone, Debug, Default)]
pub struct Spanned<T> {
    pub value: T,
    pub pos: Pos,
}

impl<T> Spanned<T> {
    pub fn new(value: T, pos: Pos) -> Self {
        Spanned { value, pos }
    }

    /// A value that did not come from a file (defaults, tests).
    pub fn unpositioned(value: T) -> Self {
        Spanned {
            value,
            pos: Pos::UNKNOWN,
        }
    }
}

impl<T> Deref for Spanned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: PartialEq> PartialEq for Spanned<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl<T: Eq> Eq for Spanned<T> {}

impl<T: std::hash::Hash> std::hash::Hash for Spanned<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.value.hash(state)
    }
}

impl<T: fmt::Display> fmt::Display for Spanned<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
    }
}

impl<T: Serialize> Serialize for Spanned<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}

thread_local! {
    /// Lines preceding the YAML document being deserialized on this thread. Each document of a
    /// file is parsed on its own (so one broken document does not hide errors in the others);
    /// this shifts its positions back to file coordinates without walking the parsed tree.
    static LINE_OFFSET: Cell<u32> = const { Cell::new(0) };
}

/// Sets the line offset for the current thread until dropped (restoring the previous one).
pub(crate) struct LineOffsetGuard {
    previous: u32,
}

impl LineOffsetGuard {
    pub(crate) fn set(offset: u32) -> Self {
        let previous = LINE_OFFSET.with(|c| c.replace(offset));
        LineOffsetGuard { previous }
    }
}

impl Drop for LineOffsetGuard {
    fn drop(&mut self) {
        LINE_OFFSET.with(|c| c.set(self.previous));
    }
}

/// Converts a serde-saphyr location (relative to the current document) to a file position.
pub(crate) fn pos_from_location(loc: &serde_saphyr::Location) -> Pos {
    let line = u32::try_from(loc.line()).unwrap_or(u32::MAX);
    let column = u32::try_from(loc.column()).unwrap_or(u32::MAX);
    if line == 0 {
        return Pos::UNKNOWN;
    }
    let offset = LINE_OFFSET.with(Cell::get);
    Pos::new(line.saturating_add(offset), column)
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Spanned<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = serde_saphyr::Spanned::<T>::deserialize(d)?;
        Ok(Spanned {
            pos: pos_from_location(&s.referenced),
            value: s.value,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Cfg {
        port: Spanned<u32>,
    }

    #[test]
    fn positions_are_shifted_by_the_document_offset() {
        let c: Cfg = serde_saphyr::from_str("\nport: 80\n").unwrap();
        assert_eq!(c.port.pos, Pos::new(2, 7));
        let _g = LineOffsetGuard::set(10);
        let c: Cfg = serde_saphyr::from_str("\nport: 80\n").unwrap();
        assert_eq!(c.port.pos, Pos::new(12, 7));
        assert_eq!(*c.port, 80);
    }

    #[test]
    fn equality_ignores_position() {
        assert_eq!(
            Spanned::new(1, Pos::new(1, 1)),
            Spanned::new(1, Pos::new(9, 9))
        );
        assert_ne!(
            Spanned::new(1, Pos::new(1, 1)),
            Spanned::new(2, Pos::new(1, 1))
        );
    }
}
