//! Finding and reading config files: the configured paths, directories walked recursively for
//! `*.yaml`/`*.yml`, in a deterministic order.
//!
//! Every problem becomes a [`ConfigError`] naming the path. A missing path or an unlistable
//! directory rejects the whole load (last known good); an unreadable file keeps its last good
//! objects, like a file with a YAML syntax error (per-object last known good, invariant 8), so
//! neither silently drops that file's objects from the config.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use std::sync::Arc;

use ballast_model::{
    Assembler, ConfigError, ConfigSet, DocIndex, FileParse, LoadReport, ObjectId, Pos,
    parse_file_report_reusing,
};

/// A file-level problem (the YAML inside is the model's business).
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("path does not exist")]
    Missing,
    #[error("cannot read: {0}")]
    Unreadable(io::Error),
    #[error("cannot list directory: {0}")]
    UnreadableDir(io::Error),
    #[error("symbolic link points to a missing file")]
    BrokenSymlink,
    #[error("file vanished while the config was being read")]
    Vanished,
    #[error("file changed while it was being read; it will be read again")]
    ChangedWhileReading,
    #[error("not valid UTF-8")]
    NotUtf8,
    #[error("directory symlink loop (already visited {0})")]
    SymlinkLoop(String),
    #[error("not a regular file or directory")]
    NotAFile,
}

impl FileError {
    pub(crate) fn at(self, path: &Path) -> ConfigError {
        ConfigError {
            file: path.display().to_string().into(),
            // No line/column for a whole-file problem; the model's convention for "unknown".
            pos: Pos::UNKNOWN,
            object: None,
            field: None,
            message: self.to_string(),
        }
    }
}

/// Whether a directory entry is a config file candidate. Hidden names are skipped (dotfiles,
/// editor swap and lock files like `.a.yaml.swp` and `.#a.yaml`, and Kubernetes ConfigMap
/// internals `..data`/`..2024_...`, whose files are reached through the visible symlinks), as
/// are backups ending in `~`; only `.yaml`/`.yml` count.
pub fn is_config_name(name: &str) -> bool {
    if name.starts_with('.') || name.ends_with('~') {
        return false;
    }
    let lower = name.to_ascii_lowercase();
    lower.ends_with(".yaml") || lower.ends_with(".yml")
}

/// Directories are entered only if not hidden (`.git`, ConfigMap `..2024_...` directories).
fn is_walkable_dir_name(name: &str) -> bool {
    !name.starts_with('.')
}

/// The files the configured paths name now, in order: paths in the order given, each directory
/// sorted by name (byte order) and walked depth-first. A file reached twice (a directory and a
/// file in it both configured, or two symlinks to one file) is read once, under the first name.
#[derive(Debug, Default)]
pub struct Discovered {
    pub files: Vec<PathBuf>,
    pub errors: Vec<ConfigError>,
    /// Those of `files` that may be symbolic links (the rest are known not to be): what
    /// [`link_target_dirs`] needs to look at.
    pub maybe_links: Vec<PathBuf>,
    /// The canonical path of each of `files` (same order).
    pub canonical: Vec<PathBuf>,
    /// Every directory walked, as (canonical path, path as walked), first walk first.
    pub dirs: Vec<(PathBuf, PathBuf)>,
    /// The canonical paths of the files given as paths (not found by a walk).
    pub given: Vec<PathBuf>,
    /// Some configured path, directory or file met is (or may be) a symbolic link: events
    /// cannot tell what changed (a ConfigMap `..data` swap retargets files without an event
    /// naming them), so every load must walk.
    pub links: bool,
}

pub fn discover(paths: &[PathBuf]) -> Discovered {
    let mut out = Discovered::default();
    let mut seen = BTreeSet::new();
    for p in paths {
        if fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink()) {
            out.links = true;
        }
        match fs::metadata(p) {
            Ok(m) if m.is_dir() => {
                let mut stack = Vec::new();
                walk_dir(p, &mut stack, &mut seen, &mut out);
            }
            Ok(m) if m.is_file() => {
                let canonical = fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
                out.given.push(canonical.clone());
                add_file(p, canonical, true, &mut seen, &mut out);
            }
            Ok(_) => out.errors.push(FileError::NotAFile.at(p)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let err = if fs::symlink_metadata(p).is_ok() {
                    FileError::BrokenSymlink
                } else {
                    FileError::Missing
                };
                out.errors.push(err.at(p));
            }
            Err(e) => out.errors.push(FileError::Unreadable(e).at(p)),
        }
    }
    out
}

fn add_file(
    p: &Path,
    canonical: PathBuf,
    maybe_link: bool,
    seen: &mut BTreeSet<PathBuf>,
    out: &mut Discovered,
) {
    if seen.insert(canonical.clone()) {
        out.files.push(p.to_path_buf());
        out.canonical.push(canonical);
        if maybe_link {
            out.maybe_links.push(p.to_path_buf());
        }
    }
}

/// `stack` holds the canonical paths of the directories being walked, to stop symlink loops.
fn walk_dir(
    dir: &Path,
    stack: &mut Vec<PathBuf>,
    seen: &mut BTreeSet<PathBuf>,
    out: &mut Discovered,
) {
    let canonical = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    if stack.contains(&canonical) {
        out.errors
            .push(FileError::SymlinkLoop(canonical.display().to_string()).at(dir));
        return;
    }
    let entries = match fs::read_dir(dir) {
        Ok(rd) => rd.collect::<Result<Vec<_>, _>>(),
        Err(e) => Err(e),
    };
    let mut entries = match entries {
        Ok(e) => e,
        // A directory deleted between listing its parent and here: the deletion's event will
        // trigger another load, so this one is rejected rather than silently partial.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            out.errors.push(FileError::Vanished.at(dir));
            return;
        }
        Err(e) => {
            out.errors.push(FileError::UnreadableDir(e).at(dir));
            return;
        }
    };
    entries.sort_by_key(|e| e.file_name());
    out.dirs.push((canonical.clone(), dir.to_path_buf()));
    stack.push(canonical.clone());
    for entry in entries {
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue; // Not UTF-8: cannot end in .yaml as far as we are concerned.
        };
        let path = entry.path();
        // The listing's own type needs no system call; only symlinks (and types the
        // filesystem does not report) are resolved, with `fs::metadata`, which follows them:
        // a link to a file is that file, a link to a directory is walked (with loop
        // protection). A walk per reload of 1,000 files cost two system calls and a
        // `realpath` per file (4.5 % of a W3 route edit at 10,000 routes).
        let listed = entry
            .file_type()
            .ok()
            .filter(|t| !t.is_symlink() && (t.is_dir() || t.is_file()));
        let resolved = match listed {
            Some(t) => Ok((t.is_dir(), t.is_file(), false)),
            None => fs::metadata(&path).map(|m| (m.is_dir(), m.is_file(), true)),
        };
        match resolved {
            Ok((true, _, maybe_link)) => {
                if is_walkable_dir_name(name) {
                    out.links |= maybe_link;
                    walk_dir(&path, stack, seen, out);
                }
            }
            Ok((_, true, maybe_link)) => {
                if is_config_name(name) {
                    // Not a link itself: its canonical path is its canonical directory's
                    // plus its name.
                    out.links |= maybe_link;
                    let canonical = if maybe_link {
                        fs::canonicalize(&path).unwrap_or_else(|_| path.clone())
                    } else {
                        canonical.join(name)
                    };
                    add_file(&path, canonical, maybe_link, seen, out);
                }
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if is_config_name(name) {
                    // The entry was listed, so it is either a dangling symlink or it was just
                    // deleted; both make this load inconsistent.
                    let err = if fs::symlink_metadata(&path).is_ok() {
                        FileError::BrokenSymlink
                    } else {
                        FileError::Vanished
                    };
                    out.errors.push(err.at(&path));
                }
            }
            Err(e) => {
                if is_config_name(name) {
                    out.errors.push(FileError::Unreadable(e).at(&path));
                }
            }
        }
    }
    stack.pop();
}

/// What identifies a file's content cheaply: if this is the same before and after reading, the
/// read was not torn by a concurrent write.
fn stamp(p: &Path) -> io::Result<(u64, Option<SystemTime>)> {
    let m = fs::metadata(p)?;
    Ok((m.len(), m.modified().ok()))
}

pub(crate) fn read_one(p: &Path) -> Result<String, FileError> {
    let not_found = |e: io::Error| {
        if e.kind() == io::ErrorKind::NotFound {
            FileError::Vanished
        } else {
            FileError::Unreadable(e)
        }
    };
    let before = stamp(p).map_err(not_found)?;
    let bytes = fs::read(p).map_err(not_found)?;
    let after = stamp(p).map_err(not_found)?;
    if before != after {
        return Err(FileError::ChangedWhileReading);
    }
    String::from_utf8(bytes).map_err(|_| FileError::NotUtf8)
}

/// The directories that symlinked files among `files` point into (to be watched too: a change
/// of the link's target does not touch the directory the link is in).
pub fn link_target_dirs(files: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs = BTreeSet::new();
    for f in files {
        if fs::symlink_metadata(f).is_ok_and(|m| m.file_type().is_symlink())
            && let Ok(target) = fs::canonicalize(f)
            && let Some(parent) = target.parent()
        {
            dirs.insert(parent.to_path_buf());
        }
    }
    dirs.into_iter().collect()
}

/// A load: the set to serve, how many files it came from, and what was rejected or skipped.
#[derive(Debug)]
pub struct Loaded {
    pub set: ConfigSet,
    pub files: usize,
    pub report: LoadReport,
    /// Objects added, removed or modified relative to the set the load was assembled over
    /// (`prev.diff(&set).len()`), when known without comparing the sets.
    pub changes: Option<usize>,
    /// Every object that may differ from that set ([`Assembler::touched`]); `None`: unknown.
    pub touched: Option<Vec<ObjectId>>,
}

/// Discovers and reads every file and builds one set, as at a cold start: invalid objects are
/// left out and reported. `Err` (every error, sorted) only when a configured path cannot be
/// walked, because then the set might silently miss whole directories.
pub fn load(paths: &[PathBuf]) -> Result<Loaded, Vec<ConfigError>> {
    Loader::default().read(discover(paths), None)
}

/// Reads config files, remembering each file's parse from the previous load.
///
/// Every load looks at every file, but a file whose stamp (size, inode, mtime, ctime) is
/// unchanged since a read that could tell is not read again, and one that is read is parsed
/// again only if its text's digest changed: editing one route among thousands costs one file's
/// read and parse — of only the documents whose text or line changed
/// ([`parse_file_report_reusing`]) — and the unchanged objects keep their `Arc`s, so
/// `ConfigSet::diff` downstream sees them as pointer-equal. The result is the same as parsing
/// every text afresh.
///
/// The set is assembled incrementally too ([`Assembler`]): only the objects of files whose
/// parse changed are judged again, over the set served now.
#[derive(Debug, Default)]
pub struct Loader {
    /// Display path → what was read of the file last time.
    cache: HashMap<String, Cached>,
    assembler: Assembler,
    /// The files and directories of the last load, when a watcher's paths can tell what
    /// changed since ([`Loader::read_changed`]).
    tree: Option<Tree>,
}

/// The files and directories a load found, to turn the paths a watcher names into the files
/// to read again. Only kept when the walk met no symbolic link and no error.
#[derive(Debug, Default)]
struct Tree {
    /// Canonical path → path as discovered (the file's name in messages), of every file.
    files: HashMap<PathBuf, PathBuf>,
    /// Canonical path → path as first walked, of every directory walked.
    dirs: HashMap<PathBuf, PathBuf>,
    /// Canonical paths of the files given as paths.
    given: BTreeSet<PathBuf>,
}

/// What a changed path means for the config: a file to read (again), or one that is gone.
#[derive(Debug, PartialEq, Eq)]
enum Touch {
    /// (canonical path, path as discovered)
    Read(PathBuf, PathBuf),
    Gone(PathBuf, PathBuf),
}

impl Tree {
    fn of(d: &Discovered) -> Option<Tree> {
        if !d.errors.is_empty() || d.links {
            return None;
        }
        Some(Tree {
            files: d
                .canonical
                .iter()
                .cloned()
                .zip(d.files.iter().cloned())
                .collect(),
            // The first walk of a directory names its files (as `discover` dedupes).
            dirs: d.dirs.iter().rev().cloned().collect(),
            given: d.given.iter().cloned().collect(),
        })
    }

    /// The files to read again or forget for `paths` (canonical, as the watcher names them),
    /// or `None` when only a walk can tell: a walked directory itself changed, a directory or
    /// symbolic link appeared where a file or nothing was, a file given as a path went (an
    /// error only a walk reports), or a path cannot be inspected. Hidden names and other
    /// files that are not config (an editor's `.a.yaml.tmp` renamed over `a.yaml`, its swap
    /// files) are nothing: hidden directories are never walked and, with no symbolic link in
    /// the tree, nothing reaches into them.
    fn scope(&self, paths: &BTreeSet<PathBuf>) -> Option<Vec<Touch>> {
        let mut out = Vec::new();
        for p in paths {
            if self.dirs.contains_key(p) {
                return None;
            }
            let meta = fs::symlink_metadata(p);
            let in_walked = p.parent().and_then(|d| self.dirs.get(d));
            if let Some(display) = self.files.get(p) {
                match meta {
                    Ok(m) if m.file_type().is_file() => {
                        out.push(Touch::Read(p.clone(), display.clone()))
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound && !self.given.contains(p) => {
                        out.push(Touch::Gone(p.clone(), display.clone()))
                    }
                    _ => return None,
                }
                continue;
            }
            // Not in a walked directory: beside a file given as a path, which alone counts.
            let Some(dir) = in_walked else { continue };
            let name = p.file_name()?;
            if name.to_str().is_some_and(|n| n.starts_with('.')) {
                continue;
            }
            match meta {
                Ok(m) if m.file_type().is_file() => {
                    if name.to_str().is_some_and(is_config_name) {
                        out.push(Touch::Read(p.clone(), dir.join(name)));
                    }
                }
                // Neither a file nor a directory of the config: nothing to undo.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                _ => return None,
            }
        }
        Some(out)
    }
}

/// One file as read last time.
#[derive(Debug)]
struct Cached {
    /// Length and hash of the text, to tell an edit from a rewrite of the same bytes.
    digest: TextDigest,
    parse: FileParse,
    /// Where each document's outcome is in `parse`: an edit re-parses only the documents
    /// that changed.
    docs: DocIndex,
    /// The file's stamp when read, if it can be trusted to tell a later change (see
    /// [`FileStamp::settled`]): then an unchanged stamp means unchanged text, and the file
    /// is not read again (a reload among 200 files read and compared 4.7 MB).
    stamp: Option<FileStamp>,
}

/// What changes whenever a file's content does: size, inode, modification and status-change
/// times (`ctime` moves on every write and cannot be set by tools that restore `mtime`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    ino: u64,
    dev: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// Timestamps may be as coarse as this (FAT: 2 s): a file modified within it before being
/// read could be modified again without its stamp changing.
const STAMP_GRANULARITY: std::time::Duration = std::time::Duration::from_secs(2);

impl FileStamp {
    #[cfg(unix)]
    fn of(m: &fs::Metadata) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        Some(FileStamp {
            len: m.len(),
            ino: m.ino(),
            dev: m.dev(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }

    #[cfg(not(unix))]
    fn of(_: &fs::Metadata) -> Option<FileStamp> {
        None
    }

    /// The stamp of a file read at `read_at`, if its last change was long enough before
    /// that for any later change to show (git's "racily clean" rule).
    fn settled(m: &fs::Metadata, read_at: SystemTime) -> Option<FileStamp> {
        let changed = m.modified().ok()?;
        let stamp = FileStamp::of(m)?;
        let ctime = SystemTime::UNIX_EPOCH.checked_add(std::time::Duration::new(
            u64::try_from(stamp.ctime.0).ok()?,
            u32::try_from(stamp.ctime.1).ok()?,
        ))?;
        let latest = changed.max(ctime);
        (latest + STAMP_GRANULARITY < read_at).then_some(stamp)
    }
}

/// What a file's text is compared by between loads: its length and 128-bit xxh3. Keeping the
/// texts themselves cost as much memory as the config's size (3.4 MB for W4, issue #13) for
/// nothing but this comparison; an accidental 128-bit collision is not a practical concern,
/// and whoever can write config files can change the config anyway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TextDigest {
    len: usize,
    hash: u128,
}

impl TextDigest {
    fn of(text: &str) -> Self {
        TextDigest {
            len: text.len(),
            hash: xxhash_rust::xxh3::xxh3_128(text.as_bytes()),
        }
    }
}

impl Loader {
    /// Reads the discovered files and assembles one set over `prev`, the set served now
    /// ([`ConfigSet::assemble`]: invalid objects keep their version in `prev`). `Err` with every
    /// error when discovery failed (see [`load`]).
    pub fn read(
        &mut self,
        discovered: Discovered,
        prev: Option<&ConfigSet>,
    ) -> Result<Loaded, Vec<ConfigError>> {
        self.tree = Tree::of(&discovered);
        let Discovered { files, errors, .. } = discovered;
        let mut parses = Vec::with_capacity(files.len());
        let mut cache = HashMap::with_capacity(files.len());
        for f in &files {
            let name = f.display().to_string();
            let old = self.cache.remove(&name);
            // Unchanged since a read that can tell: no need to read it again.
            if let Some(c) = old.as_ref().filter(|c| {
                c.stamp.is_some()
                    && fs::metadata(f)
                        .ok()
                        .and_then(|m| FileStamp::of(&m))
                        .is_some_and(|s| Some(s) == c.stamp)
            }) {
                parses.push((Arc::<str>::from(name.as_str()), c.parse.clone()));
                cache.insert(name, old.expect("filtered above"));
                continue;
            }
            let (parse, cached) = read_file(f, &name, old);
            if let Some(c) = cached {
                cache.insert(name.clone(), c);
            }
            parses.push((Arc::<str>::from(name), parse));
        }
        // Only files seen in this load are remembered: the cache never outgrows the config.
        self.cache = cache;
        let (set, report) = self.assembler.assemble(prev, parses);
        if errors.is_empty() {
            Ok(Loaded {
                set,
                files: files.len(),
                report,
                changes: self.assembler.changes(),
                touched: self.assembler.touched().map(|ids| ids.cloned().collect()),
            })
        } else {
            // This set is not served: the next load starts from the one that is.
            self.assembler = Assembler::default();
            Err(sorted(errors.into_iter().chain(report.errors).collect()))
        }
    }

    /// Reads only what `paths` — every path a watcher named since the last load, canonical —
    /// may have changed, and assembles over `prev` from those files and the parses of the
    /// others: equal to [`Loader::read`] of a fresh discovery when the watcher saw every
    /// change (a route edit among 10,000 routes in 100 files stat-ed and handed over all
    /// 100 files' objects on every event). `None` when it cannot tell (see `Tree::scope`;
    /// no load yet, a walk that met an error or a symbolic link): then [`Loader::read`].
    pub fn read_changed(
        &mut self,
        paths: &BTreeSet<PathBuf>,
        prev: Option<&ConfigSet>,
    ) -> Option<Loaded> {
        let touches = self.tree.as_ref()?.scope(paths)?;
        let tree = self.tree.as_mut().expect("checked above");
        let mut changed = Vec::with_capacity(touches.len());
        for t in touches {
            match t {
                Touch::Read(canonical, display) => {
                    let name = display.display().to_string();
                    let old = self.cache.remove(&name);
                    let (parse, cached) = read_file(&display, &name, old);
                    if let Some(c) = cached {
                        self.cache.insert(name.clone(), c);
                    }
                    tree.files.insert(canonical, display);
                    changed.push((Arc::<str>::from(name), Some(parse)));
                }
                Touch::Gone(canonical, display) => {
                    let name = display.display().to_string();
                    self.cache.remove(&name);
                    tree.files.remove(&canonical);
                    changed.push((Arc::<str>::from(name), None));
                }
            }
        }
        let (set, report) = self.assembler.assemble_changed(prev, changed);
        Some(Loaded {
            set,
            files: tree.files.len(),
            report,
            changes: self.assembler.changes(),
            touched: self.assembler.touched().map(|ids| ids.cloned().collect()),
        })
    }
}

/// Reads `f` (named `name`) and parses what changed since `old`, its previous read: the
/// parse, and what to remember of the file (`None`: it could not be read).
fn read_file(f: &Path, name: &str, old: Option<Cached>) -> (FileParse, Option<Cached>) {
    // The stamp from before the read: a change after it shows as another stamp.
    let read_at = SystemTime::now();
    let before = fs::metadata(f).ok();
    match read_one(f) {
        Ok(text) => {
            let digest = TextDigest::of(&text);
            let (parse, docs) = match old {
                Some(c) if c.digest == digest => (c.parse, c.docs),
                old => parse_file_report_reusing(
                    name,
                    &text,
                    old.as_ref().map(|c| (&c.parse, &c.docs)),
                ),
            };
            let stamp = before.and_then(|m| FileStamp::settled(&m, read_at));
            let cached = Cached {
                digest,
                parse: parse.clone(),
                docs,
                stamp,
            };
            (parse, Some(cached))
        }
        Err(e) => (FileParse::unreadable(e.at(f)), None),
    }
}

fn sorted(mut errors: Vec<ConfigError>) -> Vec<ConfigError> {
    errors.sort();
    errors.dedup();
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_names() {
        for ok in ["a.yaml", "a.yml", "A.YAML", "x.y.yaml"] {
            assert!(is_config_name(ok), "{ok}");
        }
        for no in [
            ".a.yaml",
            ".a.yaml.swp",
            "a.yaml~",
            ".#a.yaml",
            "a.yaml.swp",
            "a.json",
            "..data",
            "a.yaml.bak",
        ] {
            assert!(!is_config_name(no), "{no}");
        }
    }

    #[test]
    fn walk_is_sorted_recursive_and_skips_hidden() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        for f in [
            "b.yaml",
            "a.yml",
            "sub/c.yaml",
            "sub/deeper/d.yaml",
            ".hidden/e.yaml",
            "notes.txt",
            "a.yaml~",
            ".a.yaml.swp",
        ] {
            let p = root.join(f);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, "").unwrap();
        }
        let got = discover(&[root.to_path_buf()]);
        assert!(got.errors.is_empty(), "{:?}", got.errors);
        let rel: Vec<String> = got
            .files
            .iter()
            .map(|f| f.strip_prefix(root).unwrap().display().to_string())
            .collect();
        assert_eq!(rel, ["a.yml", "b.yaml", "sub/c.yaml", "sub/deeper/d.yaml"]);
        // A file given twice (directly and through its directory) is read once.
        let again = discover(&[root.join("b.yaml"), root.to_path_buf()]);
        assert_eq!(again.files.len(), 4);
        assert_eq!(again.files[0], root.join("b.yaml"));
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_followed_loops_and_dangling_reported() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        fs::create_dir(root.join("real")).unwrap();
        fs::write(root.join("real/a.yaml"), "").unwrap();
        std::os::unix::fs::symlink("real/a.yaml", root.join("link.yaml")).unwrap();
        std::os::unix::fs::symlink(root, root.join("real/loop")).unwrap();
        let got = discover(&[root.to_path_buf()]);
        // link.yaml and real/a.yaml are one file: read once, under the first name in order.
        assert_eq!(got.files, vec![root.join("link.yaml")]);
        assert_eq!(got.errors.len(), 1);
        assert!(
            got.errors[0].message.contains("symlink loop"),
            "{:?}",
            got.errors
        );

        fs::remove_file(root.join("real/loop")).unwrap();
        std::os::unix::fs::symlink("nowhere.yaml", root.join("dangling.yaml")).unwrap();
        let got = discover(&[root.to_path_buf()]);
        assert_eq!(
            got.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            vec![format!(
                "{}:0:0: symbolic link points to a missing file",
                root.join("dangling.yaml").display()
            )]
        );
    }

    /// Files whose canonical path comes from the listing are deduplicated exactly as with
    /// `fs::canonicalize`: a directory given twice, through a symlinked directory and by a
    /// symlinked file, yields each file once, under its first name; every symlinked file
    /// is among `maybe_links`.
    #[cfg(unix)]
    #[test]
    fn listing_types_dedupe_like_canonical_paths() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        fs::create_dir_all(root.join("real/sub")).unwrap();
        fs::write(root.join("real/a.yaml"), "").unwrap();
        fs::write(root.join("real/sub/b.yaml"), "").unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("alias")).unwrap();
        std::os::unix::fs::symlink("real/sub/b.yaml", root.join("z.yaml")).unwrap();
        let got = discover(&[
            root.join("alias"),
            root.to_path_buf(),
            root.join("real/sub/b.yaml"),
        ]);
        assert!(got.errors.is_empty(), "{:?}", got.errors);
        assert_eq!(
            got.files,
            vec![root.join("alias/a.yaml"), root.join("alias/sub/b.yaml")]
        );
        let mut canonical: Vec<PathBuf> = got
            .files
            .iter()
            .map(|f| fs::canonicalize(f).unwrap())
            .collect();
        canonical.dedup();
        assert_eq!(canonical.len(), got.files.len());
        let links = discover(&[root.to_path_buf()]);
        assert_eq!(
            links.files,
            vec![root.join("alias/a.yaml"), root.join("alias/sub/b.yaml"),]
        );
        let only_link = discover(&[root.join("z.yaml"), root.join("real")]);
        assert_eq!(
            only_link.files,
            vec![root.join("z.yaml"), root.join("real/a.yaml")]
        );
        assert_eq!(only_link.maybe_links, vec![root.join("z.yaml")]);
        assert_eq!(
            link_target_dirs(&only_link.maybe_links),
            vec![fs::canonicalize(root.join("real/sub")).unwrap()]
        );
    }

    #[test]
    fn missing_path_is_an_error_with_its_name() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("nope");
        let errs = load(std::slice::from_ref(&p)).unwrap_err();
        assert_eq!(
            errs[0].to_string(),
            format!("{}:0:0: path does not exist", p.display())
        );
    }

    fn backend(name: &str, port: u16) -> String {
        format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {{ name: {name} }}\nspec:\n  endpoints: [{{ address: 10.0.0.1, port: {port} }}]\n"
        )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 32, ..Default::default() })]

        /// Over any sequence of edits (files written, changed, broken, deleted), a loader that
        /// remembers earlier parses gives exactly what a fresh loader gives over the same
        /// previous set: same set, same positions, same report.
        #[test]
        fn cached_loads_equal_fresh_loads(
            // Each step: for files f0..f3, None = absent, Some((name, port)); port 0 is invalid,
            // name 9 a YAML syntax error.
            steps in proptest::collection::vec(
                proptest::collection::vec(proptest::option::of((0u8..5, 0u16..3)), 4),
                1..6,
            ),
        ) {
            let d = tempfile::tempdir().unwrap();
            let paths = vec![d.path().to_path_buf()];
            let mut loader = Loader::default();
            let mut prev: Option<ConfigSet> = None;
            for step in steps {
                for (i, file) in step.iter().enumerate() {
                    let p = d.path().join(format!("f{i}.yaml"));
                    match file {
                        Some((4, _)) => fs::write(&p, "kind: [\n").unwrap(),
                        Some((n, port)) => fs::write(&p, backend(&format!("b{n}"), *port)).unwrap(),
                        None => { let _ = fs::remove_file(&p); }
                    }
                }
                let cached = loader.read(discover(&paths), prev.as_ref()).unwrap();
                let fresh = Loader::default().read(discover(&paths), prev.as_ref()).unwrap();
                proptest::prop_assert_eq!(&cached.set, &fresh.set);
                proptest::prop_assert_eq!(cached.files, fresh.files);
                proptest::prop_assert_eq!(&cached.report, &fresh.report);
                let sa: Vec<_> = cached.set.objects().map(|o| o.source().clone()).collect();
                let sb: Vec<_> = fresh.set.objects().map(|o| o.source().clone()).collect();
                proptest::prop_assert_eq!(sa, sb);
                prev = Some(cached.set);
            }
        }

        /// Over any sequence of changes in a tree (files written in place or by rename-over,
        /// deleted; a subdirectory created, filled and removed; hidden and non-config files
        /// written), a loader told only the paths the changes named gives exactly what a
        /// loader that walks and reads everything gives over the same previous set, whether
        /// it reads just those paths or finds it must walk.
        #[test]
        fn loads_of_named_paths_equal_walks(
            // Per step, ops: (what, file 0..3, in sub?, backend name 0..5 (4: broken), port).
            steps in proptest::collection::vec(
                proptest::collection::vec((0u8..6, 0u8..4, proptest::bool::ANY, 0u8..5, 0u16..3), 1..5),
                1..6,
            ),
        ) {
            let d = tempfile::tempdir().unwrap();
            let root = fs::canonicalize(d.path()).unwrap();
            let sub = root.join("sub");
            let paths = vec![root.clone()];
            let mut loader = Loader::default();
            let mut prev: Option<ConfigSet> = None;
            for (n, step) in steps.iter().enumerate() {
                let mut named = BTreeSet::new();
                for &(what, f, in_sub, name, port) in step {
                    let dir = if in_sub { &sub } else { &root };
                    let p = dir.join(format!("f{f}.yaml"));
                    let text = if name == 4 { "kind: [\n".to_owned() } else { backend(&format!("b{name}"), port) };
                    if what <= 1 && in_sub && !sub.exists() {
                        fs::create_dir(&sub).unwrap();
                        named.insert(sub.clone());
                    }
                    match what {
                        0 => fs::write(&p, text).unwrap(),
                        1 => {
                            let tmp = dir.join(format!(".f{f}.yaml.tmp"));
                            fs::write(&tmp, text).unwrap();
                            fs::rename(&tmp, &p).unwrap();
                            named.insert(tmp);
                        }
                        2 => { let _ = fs::remove_file(&p); }
                        3 => {
                            if sub.exists() {
                                for e in fs::read_dir(&sub).unwrap() {
                                    named.insert(e.unwrap().path());
                                }
                                fs::remove_dir_all(&sub).unwrap();
                            }
                            named.insert(sub.clone());
                            continue;
                        }
                        4 => {
                            let q = dir.join(format!("notes{f}.txt"));
                            if dir.exists() { fs::write(&q, "x").unwrap(); }
                            named.insert(q);
                            continue;
                        }
                        _ => {
                            let q = dir.join(format!(".f{f}.yaml.swp"));
                            if dir.exists() { fs::write(&q, "x").unwrap(); }
                            named.insert(q);
                            continue;
                        }
                    }
                    named.insert(p);
                }
                let got = match loader.read_changed(&named, prev.as_ref()).filter(|_| n > 0) {
                    Some(l) => l,
                    None => loader.read(discover(&paths), prev.as_ref()).unwrap(),
                };
                let walked = Loader::default().read(discover(&paths), prev.as_ref()).unwrap();
                proptest::prop_assert_eq!(&got.set, &walked.set);
                proptest::prop_assert_eq!(got.files, walked.files);
                proptest::prop_assert_eq!(&got.report, &walked.report);
                let sa: Vec<_> = got.set.objects().map(|o| o.source().clone()).collect();
                let sb: Vec<_> = walked.set.objects().map(|o| o.source().clone()).collect();
                proptest::prop_assert_eq!(sa, sb);
                prev = Some(got.set);
            }
        }
    }

    /// Reads the tree in `d` from scratch, then returns the loader and the set it served.
    fn loaded(paths: &[PathBuf]) -> (Loader, ConfigSet) {
        let mut loader = Loader::default();
        let set = loader.read(discover(paths), None).unwrap().set;
        (loader, set)
    }

    fn names(paths: &[&Path]) -> BTreeSet<PathBuf> {
        paths.iter().map(|p| p.to_path_buf()).collect()
    }

    fn port(set: &ConfigSet, name: &str) -> Option<u32> {
        set.backends
            .get(&ballast_model::ObjectKey::new("default", name))
            .map(|b| *b.spec.endpoints[0].port)
    }

    /// A load told which paths changed reads those files only: a file changed on disk
    /// without an event naming it is not looked at (not even stat-ed) until one does.
    #[test]
    fn named_paths_are_all_that_is_read() {
        let d = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(d.path()).unwrap();
        let (a, b) = (root.join("a.yaml"), root.join("b.yaml"));
        fs::write(&a, backend("a", 1)).unwrap();
        fs::write(&b, backend("b", 1)).unwrap();
        let (mut loader, first) = loaded(std::slice::from_ref(&root));
        fs::write(&a, backend("a", 2)).unwrap();
        fs::write(&b, backend("b", 2)).unwrap();
        let second = loader.read_changed(&names(&[&a]), Some(&first)).unwrap();
        assert_eq!(
            (port(&second.set, "a"), port(&second.set, "b")),
            (Some(2), Some(1))
        );
        assert_eq!((second.files, second.changes), (2, Some(1)));
        let third = loader
            .read_changed(&names(&[&b]), Some(&second.set))
            .unwrap();
        assert_eq!(
            (port(&third.set, "a"), port(&third.set, "b")),
            (Some(2), Some(2))
        );
        // Nothing named: nothing read, nothing changed.
        let fourth = loader
            .read_changed(&BTreeSet::new(), Some(&third.set))
            .unwrap();
        assert_eq!((fourth.set, fourth.changes), (third.set, Some(0)));
    }

    /// An editor's save by rename (a hidden temporary file renamed over the file) reads the
    /// file; the temporary file is nothing. A deleted file's objects go; a new file in a
    /// walked directory is read; files that are not config are nothing.
    #[test]
    fn rename_over_saves_deletions_and_new_files_are_read_alone() {
        let d = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(d.path()).unwrap();
        let (a, b, c) = (
            root.join("a.yaml"),
            root.join("b.yaml"),
            root.join("c.yaml"),
        );
        fs::write(&a, backend("a", 1)).unwrap();
        fs::write(&b, backend("b", 1)).unwrap();
        let (mut loader, first) = loaded(std::slice::from_ref(&root));
        let tmp = root.join(".a.yaml.tmp");
        fs::write(&tmp, backend("a", 2)).unwrap();
        fs::rename(&tmp, &a).unwrap();
        let saved = loader
            .read_changed(&names(&[&tmp, &a]), Some(&first))
            .unwrap();
        assert_eq!(port(&saved.set, "a"), Some(2));
        fs::remove_file(&b).unwrap();
        fs::write(&c, backend("c", 1)).unwrap();
        let notes = root.join("notes.txt");
        fs::write(&notes, "not config").unwrap();
        let moved = loader
            .read_changed(&names(&[&b, &c, &notes]), Some(&saved.set))
            .unwrap();
        assert_eq!(
            (port(&moved.set, "b"), port(&moved.set, "c"), moved.files),
            (None, Some(1), 2)
        );
        let walked = Loader::default()
            .read(discover(&[root]), Some(&saved.set))
            .unwrap();
        assert_eq!(moved.set, walked.set);
        assert_eq!(moved.report, walked.report);
    }

    /// What only a walk can tell: a new subdirectory (its files may predate its watch), a
    /// directory renamed or removed, a file replaced by a directory, a file given as a path
    /// deleted (an error), and anything in a tree with symbolic links (a ConfigMap's
    /// `..data` swap retargets every file with no event naming them).
    #[cfg(unix)]
    #[test]
    fn directories_links_and_given_files_need_a_walk() {
        let d = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(d.path()).unwrap();
        let a = root.join("a.yaml");
        fs::write(&a, backend("a", 1)).unwrap();
        fs::create_dir(root.join("old")).unwrap();
        fs::write(root.join("old/o.yaml"), backend("o", 1)).unwrap();
        let (mut loader, set) = loaded(std::slice::from_ref(&root));
        fs::create_dir(root.join("sub")).unwrap();
        fs::write(root.join("sub/c.yaml"), backend("c", 1)).unwrap();
        let new_dir = names(&[&root.join("sub"), &root.join("sub/c.yaml")]);
        assert!(loader.read_changed(&new_dir, Some(&set)).is_none());
        // After the walk the subdirectory is known: a file added to it is read alone.
        let walked = loader
            .read(discover(std::slice::from_ref(&root)), Some(&set))
            .unwrap();
        assert_eq!(port(&walked.set, "c"), Some(1));
        fs::write(root.join("sub/e.yaml"), backend("e", 1)).unwrap();
        let more = names(&[&root.join("sub/e.yaml")]);
        let set = loader.read_changed(&more, Some(&walked.set)).unwrap().set;
        assert_eq!(port(&set, "e"), Some(1));
        fs::rename(root.join("old"), root.join("new")).unwrap();
        let renamed = names(&[&root.join("old"), &root.join("new")]);
        assert!(loader.read_changed(&renamed, Some(&set)).is_none());
        fs::rename(root.join("new"), root.join("old")).unwrap();
        fs::remove_file(&a).unwrap();
        fs::create_dir(&a).unwrap();
        assert!(loader.read_changed(&names(&[&a]), Some(&set)).is_none());

        // A file given as a path (also inside a directory given): an edit is read alone,
        // its deletion is an error only a walk reports.
        let o = root.join("old/o.yaml");
        for given in [vec![o.clone()], vec![o.clone(), root.join("old")]] {
            fs::write(&o, backend("o", 1)).unwrap();
            let (mut loader, set) = loaded(&given);
            fs::write(&o, backend("o", 2)).unwrap();
            let edited = loader.read_changed(&names(&[&o]), Some(&set)).unwrap();
            assert_eq!(port(&edited.set, "o"), Some(2));
            fs::remove_file(&o).unwrap();
            assert!(
                loader
                    .read_changed(&names(&[&o]), Some(&edited.set))
                    .is_none()
            );
        }

        // ConfigMap layout: a.yaml -> ..data/a.yaml, ..data -> ..v1.
        let cm = root.join("cm");
        fs::create_dir_all(cm.join("..v1")).unwrap();
        fs::write(cm.join("..v1/a.yaml"), backend("m", 1)).unwrap();
        std::os::unix::fs::symlink("..v1", cm.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/a.yaml", cm.join("a.yaml")).unwrap();
        let (mut loader, set) = loaded(std::slice::from_ref(&cm));
        assert_eq!(port(&set, "m"), Some(1));
        fs::create_dir(cm.join("..v2")).unwrap();
        fs::write(cm.join("..v2/a.yaml"), backend("m", 2)).unwrap();
        std::os::unix::fs::symlink("..v2", cm.join("..data_tmp")).unwrap();
        fs::rename(cm.join("..data_tmp"), cm.join("..data")).unwrap();
        let swap = names(&[&cm.join("..data_tmp"), &cm.join("..data"), &cm.join("..v2")]);
        assert!(loader.read_changed(&swap, Some(&set)).is_none());
        let swapped = loader
            .read(discover(std::slice::from_ref(&cm)), Some(&set))
            .unwrap();
        assert_eq!(port(&swapped.set, "m"), Some(2));
        assert!(
            loader
                .read_changed(&BTreeSet::new(), Some(&swapped.set))
                .is_none()
        );
    }

    #[test]
    fn unchanged_files_keep_their_objects() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("a.yaml"), backend("a", 1)).unwrap();
        fs::write(d.path().join("b.yaml"), backend("b", 1)).unwrap();
        let paths = vec![d.path().to_path_buf()];
        let mut loader = Loader::default();
        let first = loader.read(discover(&paths), None).unwrap().set;
        fs::write(d.path().join("b.yaml"), backend("b", 2)).unwrap();
        let second = loader.read(discover(&paths), Some(&first)).unwrap().set;
        let k = |n: &str| ballast_model::ObjectKey::new("default", n);
        assert!(std::sync::Arc::ptr_eq(
            &first.backends[&k("a")],
            &second.backends[&k("a")]
        ));
        assert_ne!(first.backends[&k("b")], second.backends[&k("b")]);
    }

    /// A file last changed well before it was read is not read again while its stamp is
    /// unchanged; rewriting it (same length, in place) changes the stamp, and the new text is
    /// read.
    #[test]
    fn settled_files_are_read_again_only_when_their_stamp_changes() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a.yaml");
        fs::write(&a, backend("a", 1)).unwrap();
        fs::write(d.path().join("b.yaml"), backend("b", 1)).unwrap();
        let paths = vec![d.path().to_path_buf()];
        let mut loader = Loader::default();
        let first = loader.read(discover(&paths), None).unwrap().set;
        assert!(
            loader.cache.values().all(|c| c.stamp.is_none()),
            "just written: not trusted yet"
        );
        std::thread::sleep(STAMP_GRANULARITY + std::time::Duration::from_millis(100));
        let second = loader.read(discover(&paths), Some(&first)).unwrap().set;
        assert_eq!(second, first);
        assert!(loader.cache.values().all(|c| c.stamp.is_some()), "settled");
        fs::write(&a, backend("a", 2)).unwrap();
        let third = loader.read(discover(&paths), Some(&second)).unwrap().set;
        let k = |n: &str| ballast_model::ObjectKey::new("default", n);
        assert_eq!(*third.backends[&k("a")].spec.endpoints[0].port, 2);
        assert!(std::sync::Arc::ptr_eq(
            &second.backends[&k("b")],
            &third.backends[&k("b")]
        ));
        assert!(loader.cache[&a.display().to_string()].stamp.is_none());
    }

    /// The file source's view of per-object last known good: an unreadable file (here: not
    /// UTF-8) keeps its last good objects; other files' changes apply.
    #[test]
    fn unreadable_file_keeps_its_last_good_objects() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("a.yaml"), backend("a", 1)).unwrap();
        fs::write(d.path().join("b.yaml"), backend("b", 1)).unwrap();
        let paths = vec![d.path().to_path_buf()];
        let mut loader = Loader::default();
        let first = loader.read(discover(&paths), None).unwrap();
        fs::write(d.path().join("a.yaml"), b"\xff\xfe").unwrap();
        fs::write(d.path().join("b.yaml"), backend("b", 2)).unwrap();
        let second = loader.read(discover(&paths), Some(&first.set)).unwrap();
        let k = |n: &str| ballast_model::ObjectKey::new("default", n);
        assert_eq!(second.set.backends[&k("a")], first.set.backends[&k("a")]);
        assert_eq!(*second.set.backends[&k("b")].spec.endpoints[0].port, 2);
        assert_eq!(second.report.errors.len(), 1);
        assert!(
            second.report.errors[0]
                .to_string()
                .ends_with("a.yaml:0:0: not valid UTF-8"),
            "{:?}",
            second.report.errors
        );
        // A cold start without a previous set cannot keep anything of it.
        assert_eq!(load(&paths).unwrap().set.len(), 1);
    }
}
