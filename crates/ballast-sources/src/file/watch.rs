//! Filesystem watching: which directories to watch for the configured paths (reconciled as a
//! keep-set, invariant 4), which notify events matter, and the debounce that groups a burst of
//! events into one reload.
//!
//! Any relevant event under a watched directory triggers a reload once things are quiet, and
//! a reload that changes nothing publishes nothing. The reload reads only the files the
//! events named ([`Changes`]) when that can be trusted, and walks everything otherwise: on a
//! lost event (queue overflow, a rescan), an event that names no path, a directory or
//! symbolic link that appeared or went, and always in a tree with symbolic links (Kubernetes
//! ConfigMap `..data` swaps retarget files without an event naming them).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{Event, EventKind, RecursiveMode, Watcher};
use tokio::time::Instant;

/// Groups events into bursts: a burst ends after `quiet` without events, or `max_delay` after
/// its first event, whichever comes first (so a steady trickle of writes cannot postpone a
/// reload forever). Pure bookkeeping; the caller owns the clock.
#[derive(Clone, Debug)]
pub struct Debouncer {
    quiet: Duration,
    max_delay: Duration,
    burst: Option<(Instant, Instant)>, // (first, last) event of the current burst
}

impl Debouncer {
    pub fn new(quiet: Duration, max_delay: Duration) -> Self {
        Debouncer {
            quiet,
            max_delay,
            burst: None,
        }
    }

    pub fn event(&mut self, now: Instant) {
        match &mut self.burst {
            Some((_, last)) => *last = now,
            None => self.burst = Some((now, now)),
        }
    }

    /// When the current burst is due, if there is one.
    pub fn deadline(&self) -> Option<Instant> {
        self.burst
            .map(|(first, last)| (last + self.quiet).min(first + self.max_delay))
    }

    /// Ends the burst if it is due at `now`.
    pub fn take_due(&mut self, now: Instant) -> bool {
        if self.deadline().is_some_and(|d| d <= now) {
            self.burst = None;
            true
        } else {
            false
        }
    }

    pub fn pending(&self) -> bool {
        self.burst.is_some()
    }
}

/// What the watcher saw since the last load: the paths relevant events named, or that only a
/// walk of everything can tell what changed.
#[derive(Debug)]
pub struct Changes {
    pub full: bool,
    pub paths: BTreeSet<PathBuf>,
}

/// More paths than this in one burst (a `git checkout`): a walk is as cheap, and the set
/// must not grow without bound.
const MAX_PATHS: usize = 4096;

impl Default for Changes {
    /// Nothing loaded yet: the first load walks.
    fn default() -> Self {
        Changes {
            full: true,
            paths: BTreeSet::new(),
        }
    }
}

impl Changes {
    /// No change seen since a load (what the load takes leaves behind).
    pub fn none() -> Self {
        Changes {
            full: false,
            paths: BTreeSet::new(),
        }
    }

    /// Notes a relevant event ([`is_relevant`]).
    pub fn record(&mut self, event: &notify::Result<Event>) {
        if self.full {
            return;
        }
        let named = match event {
            Ok(e) if !e.need_rescan() && !e.paths.is_empty() => match e.kind {
                EventKind::Any | EventKind::Other => None,
                _ => Some(&e.paths),
            },
            _ => None,
        };
        match named {
            Some(paths) if self.paths.len() + paths.len() <= MAX_PATHS => {
                self.paths.extend(paths.iter().cloned())
            }
            _ => self.walk(),
        }
    }

    /// Only a walk can tell what changed.
    pub fn walk(&mut self) {
        self.full = true;
        self.paths.clear();
    }
}

/// Whether an event can mean config changed. Opening or closing a file for reading is not a
/// change, and must not count: the reload itself opens every file, which would otherwise
/// trigger the next reload, forever.
pub fn is_relevant(event: &notify::Result<Event>) -> bool {
    match event {
        // An error may mean lost events (e.g. queue overflow): reload to be safe.
        Err(_) => true,
        Ok(e) if e.need_rescan() => true,
        Ok(e) => match e.kind {
            EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
            EventKind::Access(_) => false,
            _ => true,
        },
    }
}

/// The directories to watch for `paths` as they are on disk now, plus `link_dirs`.
///
/// - a directory: itself, recursively (and its parent if it is a symlink, to see it retargeted);
/// - a file: its directory, non-recursively, so renames over it and ConfigMap-style `..data`
///   swaps beside it are seen, plus the directory of its symlink target if it is a link;
/// - a missing path: its nearest existing ancestor, non-recursively, so its creation is seen
///   (the watch set is recomputed before every reload, and moves down as the path appears);
/// - `link_dirs`: the directories that files found by the walk link to (a `*.yaml` symlink
///   pointing out of the tree), non-recursively, so edits of the target are seen.
///
/// Paths are canonical, and a directory inside one watched recursively gets no watch of its
/// own: inotify shares one watch per inode, so removing a second watch of the same directory
/// would silently remove the first.
pub fn desired(paths: &[PathBuf], link_dirs: &[PathBuf]) -> BTreeMap<PathBuf, RecursiveMode> {
    let mut out: BTreeMap<PathBuf, RecursiveMode> = BTreeMap::new();
    let mut add = |p: &Path, mode: RecursiveMode| {
        let p = fs::canonicalize(p).unwrap_or_else(|_| absolute(p));
        let e = out.entry(p).or_insert(mode);
        if mode == RecursiveMode::Recursive {
            *e = RecursiveMode::Recursive;
        }
    };
    for p in paths {
        let is_link = fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink());
        match fs::metadata(p) {
            Ok(m) if m.is_dir() => {
                add(p, RecursiveMode::Recursive);
                if is_link && let Some(parent) = parent(p) {
                    add(&parent, RecursiveMode::NonRecursive);
                }
            }
            Ok(_) => {
                if let Some(parent) = parent(p) {
                    add(&parent, RecursiveMode::NonRecursive);
                }
                if is_link
                    && let Ok(target) = fs::canonicalize(p)
                    && let Some(parent) = target.parent()
                {
                    add(parent, RecursiveMode::NonRecursive);
                }
            }
            Err(_) => {
                let mut cur = parent(p);
                while let Some(c) = cur {
                    if fs::metadata(&c).is_ok_and(|m| m.is_dir()) {
                        add(&c, RecursiveMode::NonRecursive);
                        break;
                    }
                    cur = parent(&c);
                }
            }
        }
    }
    for d in link_dirs {
        add(d, RecursiveMode::NonRecursive);
    }
    // A directory inside one watched recursively needs no watch of its own.
    let recursive: Vec<PathBuf> = out
        .iter()
        .filter(|(_, m)| **m == RecursiveMode::Recursive)
        .map(|(p, _)| p.clone())
        .collect();
    out.retain(|p, _| !recursive.iter().any(|r| p != r && p.starts_with(r)));
    out
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The parent directory, treating a bare relative name as living in `.`.
fn parent(p: &Path) -> Option<PathBuf> {
    let p = absolute(p);
    p.parent().map(Path::to_path_buf)
}

/// Identifies a directory on disk, so a watched directory that was deleted and recreated under
/// the same name (the kernel drops the old watch) is noticed and watched again.
#[cfg(unix)]
fn identity(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn identity(p: &Path) -> Option<(u64, u64)> {
    fs::metadata(p).ok().map(|_| (0, 0))
}

/// The watches in place, reconciled against [`desired`] before every load.
pub struct Watches {
    watcher: Box<dyn Watcher + Send>,
    active: BTreeMap<PathBuf, (RecursiveMode, Option<(u64, u64)>)>,
}

impl Watches {
    pub fn new(watcher: Box<dyn Watcher + Send>) -> Self {
        Watches {
            watcher,
            active: BTreeMap::new(),
        }
    }

    /// Brings the watches in line with the paths as they are now. Returns whether every desired
    /// watch is in place (if not, the caller retries later: an event may be missed meanwhile).
    pub fn reconcile(&mut self, paths: &[PathBuf], link_dirs: &[PathBuf]) -> bool {
        let want = desired(paths, link_dirs);
        let stale: Vec<PathBuf> = self
            .active
            .iter()
            .filter(|(p, (mode, id))| want.get(*p) != Some(mode) || identity(p) != *id)
            .map(|(p, _)| p.clone())
            .collect();
        for p in stale {
            self.active.remove(&p);
            // Fails if the kernel already dropped the watch (directory deleted): fine.
            let _ = self.watcher.unwatch(&p);
        }
        let mut complete = true;
        for (p, mode) in want {
            if self.active.contains_key(&p) {
                continue;
            }
            let id = identity(&p);
            match self.watcher.watch(&p, mode) {
                Ok(()) => {
                    tracing::debug!(path = %p.display(), ?mode, "watching");
                    self.active.insert(p, (mode, id));
                }
                Err(e) => {
                    tracing::warn!(path = %p.display(), error = %e, "cannot watch; will retry");
                    complete = false;
                }
            }
        }
        complete
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debounce_quiet_and_max_delay() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut d = Debouncer::new(ms(100), ms(1000));
        assert!(d.deadline().is_none() && !d.take_due(t0));
        d.event(t0);
        assert_eq!(d.deadline(), Some(t0 + ms(100)));
        // Events keep pushing the deadline out by `quiet`...
        for i in 1..=16 {
            d.event(t0 + ms(i * 60));
            assert!(!d.take_due(t0 + ms(i * 60)));
        }
        // ...but never past first + max_delay.
        assert_eq!(d.deadline(), Some(t0 + ms(1000)));
        assert!(d.take_due(t0 + ms(1000)));
        assert!(!d.pending());
        d.event(t0 + ms(2000));
        assert!(!d.take_due(t0 + ms(2099)));
        assert!(d.take_due(t0 + ms(2100)));
    }

    #[test]
    fn reads_are_not_changes() {
        use notify::event::{CreateKind, ModifyKind};
        let ev = |k| Ok(Event::new(k));
        assert!(!is_relevant(&ev(EventKind::Access(AccessKind::Open(
            AccessMode::Any
        )))));
        assert!(!is_relevant(&ev(EventKind::Access(AccessKind::Close(
            AccessMode::Read
        )))));
        assert!(is_relevant(&ev(EventKind::Access(AccessKind::Close(
            AccessMode::Write
        )))));
        assert!(is_relevant(&ev(EventKind::Create(CreateKind::File))));
        assert!(is_relevant(&ev(EventKind::Modify(ModifyKind::Any))));
        assert!(is_relevant(&Err(notify::Error::generic("overflow"))));
    }

    #[test]
    fn changes_name_paths_until_only_a_walk_can_tell() {
        use notify::event::{CreateKind, ModifyKind, RenameMode};
        let ev = |k, paths: &[&str]| {
            let mut e = Event::new(k);
            for p in paths {
                e = e.add_path(PathBuf::from(p));
            }
            Ok(e)
        };
        let mut c = Changes::none();
        c.record(&ev(
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)),
            &["/c/.a.yaml.tmp", "/c/a.yaml"],
        ));
        c.record(&ev(EventKind::Create(CreateKind::File), &["/c/b.yaml"]));
        assert!(!c.full);
        assert_eq!(
            c.paths
                .iter()
                .map(|p| p.to_str().unwrap())
                .collect::<Vec<_>>(),
            ["/c/.a.yaml.tmp", "/c/a.yaml", "/c/b.yaml"]
        );
        for lost in [
            Err(notify::Error::generic("overflow")),
            ev(EventKind::Any, &["/c/a.yaml"]),
            ev(EventKind::Other, &["/c/a.yaml"]),
            ev(EventKind::Create(CreateKind::Any), &[]),
            Ok(Event::new(EventKind::Modify(ModifyKind::Any))
                .add_path("/c/a.yaml".into())
                .set_flag(notify::event::Flag::Rescan)),
        ] {
            let mut c = Changes::none();
            c.record(&ev(EventKind::Create(CreateKind::File), &["/c/b.yaml"]));
            c.record(&lost);
            assert!(c.full && c.paths.is_empty(), "{lost:?}");
            c.record(&ev(EventKind::Create(CreateKind::File), &["/c/d.yaml"]));
            assert!(c.full && c.paths.is_empty());
        }
        let mut c = Changes::none();
        for i in 0..=MAX_PATHS {
            c.record(&ev(
                EventKind::Create(CreateKind::File),
                &[&format!("/c/{i}.yaml")],
            ));
        }
        assert!(c.full && c.paths.is_empty());
        assert!(Changes::default().full);
    }

    #[test]
    fn desired_watches() {
        let d = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(d.path()).unwrap();
        fs::create_dir_all(root.join("conf/sub")).unwrap();
        fs::write(root.join("conf/sub/a.yaml"), "").unwrap();
        fs::write(root.join("single.yaml"), "").unwrap();
        fs::create_dir_all(root.join("elsewhere")).unwrap();
        let got = desired(
            &[
                root.join("conf"),
                root.join("conf/sub/a.yaml"),
                root.join("single.yaml"),
                root.join("missing/deeper/x"),
            ],
            &[root.join("elsewhere"), root.join("conf/sub")],
        );
        let got: Vec<(PathBuf, RecursiveMode)> = got.into_iter().collect();
        assert_eq!(
            got,
            vec![
                // `root` for single.yaml and for the missing path (nearest ancestor).
                (root.clone(), RecursiveMode::NonRecursive),
                // conf/sub is covered by the recursive watch of conf.
                (root.join("conf"), RecursiveMode::Recursive),
                (root.join("elsewhere"), RecursiveMode::NonRecursive),
            ]
        );
    }
}
