//! Per-object last known good that survives a restart: the document of every object the file
//! source serves, kept in `<state dir>/last-good/` (one file per object), so that a restart
//! into an object (or a whole file) that no longer parses or validates serves its last good
//! version instead of dropping it (invariant 8; a live Envoy would otherwise lose the route,
//! and the guard holds only mass removals).
//!
//! What is stored is the object's YAML document exactly as it was read and validated, with
//! the file it came from and the number of file lines before it: re-parsing it gives the very
//! same object, position included (so `/debug/sources` points at the same line, and a file
//! that is held whole keeps it). A document is captured by reading the object's file again
//! after the load that served it, and it is stored only if re-parsing it gives exactly the
//! served object: if the file changed in between, nothing wrong is stored (the previous entry
//! stays, and the capture is retried on the next change).
//!
//! Bounded: only objects served now have an entry, and an object no longer served (deleted on
//! purpose, or gone from the files while Ballast was down) loses its entry at the first sync.
//! Each entry is written atomically (temporary file, fsync, rename; the directory is synced
//! once per batch) and only when its object changed. A corrupt entry or one of another format
//! version is a warning and is not used; nothing here ever keeps the server from starting.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use ballast_model::{ConfigSet, Kind, Object, ObjectId, ObjectKey};
use serde::{Deserialize, Serialize};

/// The entry format this build writes and reads.
pub const FORMAT: u64 = 1;
/// The minimum time between two syncs: under churn the entries lag the served set by at most
/// this much, and cost at most one batch of writes a second.
pub const MIN_WRITE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// A batch larger than this is written by several threads, at most [`MAX_WRITE_THREADS`].
const WRITES_PER_THREAD: usize = 64;
const MAX_WRITE_THREADS: usize = 8;
/// The directory inside the state dir.
pub const DIR_NAME: &str = "last-good";

/// One stored object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    format: u64,
    kind: String,
    namespace: String,
    name: String,
    /// The file the document was read from (as the source names it).
    file: String,
    /// File lines before the document, so positions come out as they were.
    line_offset: u32,
    text: String,
}

/// `<state dir>/last-good`.
pub fn dir_in(state_dir: &Path) -> PathBuf {
    state_dir.join(DIR_NAME)
}

/// The entry file of `id`: readable (`HTTPRoute.default.r3`) and unique (a hash of the whole
/// identity, so any name fits a file name).
pub fn entry_name(id: &ObjectId) -> String {
    let readable: String = format!("{}.{}", id.key.namespace, id.key.name)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    let hash = xxhash_rust::xxh3::xxh3_128(
        format!("{}\0{}\0{}", id.kind, id.key.namespace, id.key.name).as_bytes(),
    );
    format!("{}.{readable}.{hash:032x}.json", id.kind)
}

fn id_of(o: &Object) -> ObjectId {
    ObjectId {
        kind: o.kind(),
        key: o.key(),
    }
}

/// The same object read from the same place (objects compare without their source).
fn same(a: &Object, b: &Object) -> bool {
    a == b && a.source() == b.source()
}

/// Parses a document as it stood in its file: exactly one valid object, or why not.
fn parse_entry_text(file: &str, line_offset: u32, text: &str) -> Result<Object, String> {
    let mut parse = ballast_model::parse_document_report(file, line_offset, text);
    let errors = parse.errors();
    if let Some(e) = errors.first() {
        return Err(e.to_string());
    }
    match (parse.objects.pop(), parse.objects.is_empty()) {
        (Some(o), true) => Ok(o),
        (None, _) => Err("no object in the document".into()),
        (Some(_), false) => Err("more than one object in the document".into()),
    }
}

/// The document of `o` among `docs` (its file's documents now, as
/// [`ballast_model::split_yaml_documents`] gives them, in order), if re-parsing it gives `o`.
fn capture(o: &Object, docs: &[(u32, &str)]) -> Option<Entry> {
    let line = o.source().pos.line;
    // The last document starting before the object's first key.
    let i = docs
        .partition_point(|(off, _)| *off < line)
        .checked_sub(1)?;
    let (line_offset, text) = docs[i];
    let parsed = parse_entry_text(&o.source().file, line_offset, text).ok()?;
    same(&parsed, o).then(|| Entry {
        format: FORMAT,
        kind: o.kind().as_str().to_owned(),
        namespace: o.key().namespace,
        name: o.key().name,
        file: o.source().file.to_string(),
        line_offset,
        text: text.to_owned(),
    })
}

/// Reads one entry file: the object, or a message for the warning.
fn read_entry(path: &Path) -> Result<Object, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("reading: {e}"))?;
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("not a valid entry: {e}"))?;
    // The version first: another format may have any shape.
    match value.get("format").and_then(|v| v.as_u64()) {
        Some(FORMAT) => {}
        Some(v) => {
            return Err(format!(
                "format version {v}; this build reads version {FORMAT}"
            ));
        }
        None => return Err("not a valid entry: no numeric \"format\" field".into()),
    }
    let e: Entry = serde_json::from_value(value).map_err(|e| format!("not a valid entry: {e}"))?;
    let o = parse_entry_text(&e.file, e.line_offset, &e.text)
        .map_err(|m| format!("the stored document no longer parses: {m}"))?;
    let kind = Kind::from_kind_str(&e.kind);
    if kind != Some(o.kind()) || o.key() != ObjectKey::new(&e.namespace, &e.name) {
        return Err(format!(
            "the stored document is {} {}, not {} {}/{}",
            o.kind(),
            o.key(),
            e.kind,
            e.namespace,
            e.name
        ));
    }
    Ok(o)
}

/// What [`LastGood::open`] found.
#[derive(Debug, Default)]
pub struct Restored {
    /// Every stored object that reloads: the last good versions to fall back on at start.
    pub set: ConfigSet,
    /// One message per entry that could not be used (corrupt, other version), naming its file.
    pub warnings: Vec<String>,
}

/// What one [`LastGood::sync`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Synced {
    pub written: usize,
    pub removed: usize,
    /// Served objects whose document could not be captured (their file changed since the
    /// load): their previous entry, if any, stays until a later sync captures them.
    pub uncaptured: Vec<ObjectId>,
    /// I/O errors, naming the path.
    pub errors: Vec<String>,
}

/// What one sync must do: objects to capture and write, entries to remove, and (on the first
/// sync only) the unchanged served objects to keep in place of the ones read at open.
#[derive(Debug, Default)]
struct Plan {
    changed: Vec<(ObjectId, Object)>,
    gone: Vec<ObjectId>,
    unchanged: Vec<Object>,
}

/// The stored last good documents of one source, and what they hold (kept in memory as the
/// objects they reload to, which share their `Arc`s with the served set).
#[derive(Debug)]
pub struct LastGood {
    dir: PathBuf,
    stored: BTreeMap<ObjectId, Object>,
    /// Entry files that could not be used: removed at the first sync.
    junk: Vec<PathBuf>,
    /// Until the first sync: `stored` holds the objects read at open, to be replaced by the
    /// served ones.
    adopt: bool,
}

impl LastGood {
    /// Reads every entry in `dir` (missing: none). Never fails: unusable entries are warnings.
    pub fn open(dir: PathBuf) -> (LastGood, Restored) {
        let mut restored = Restored::default();
        let mut stored = BTreeMap::new();
        let mut junk = Vec::new();
        let mut paths: Vec<PathBuf> = match std::fs::read_dir(&dir) {
            Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                restored
                    .warnings
                    .push(format!("{}: cannot list: {e}", dir.display()));
                Vec::new()
            }
        };
        paths.sort();
        for path in paths {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with('.') && name.ends_with(".tmp") {
                // A write cut short by a crash.
                junk.push(path);
                continue;
            }
            if !name.ends_with(".json") {
                continue;
            }
            match read_entry(&path) {
                Ok(o) if entry_name(&id_of(&o)) == name => {
                    stored.insert(id_of(&o), o.clone());
                    restored.set.insert(o);
                }
                Ok(o) => {
                    restored.warnings.push(format!(
                        "{}: holds {} {}, which belongs in {}",
                        path.display(),
                        o.kind(),
                        o.key(),
                        entry_name(&id_of(&o))
                    ));
                    junk.push(path);
                }
                Err(m) => {
                    restored.warnings.push(format!("{}: {m}", path.display()));
                    junk.push(path);
                }
            }
        }
        (
            LastGood {
                dir,
                stored,
                junk,
                adopt: true,
            },
            restored,
        )
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many objects are stored.
    pub fn len(&self) -> usize {
        self.stored.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stored.is_empty()
    }

    /// Makes the stored entries those of `served`: writes each object that changed (reading
    /// its document from its file), removes the entries of objects no longer served.
    pub fn sync(&mut self, served: &ConfigSet) -> Synced {
        let mut out = Synced::default();
        let mut dirty = false;
        // First: an unusable entry may sit where a served object's entry is written now.
        for path in std::mem::take(&mut self.junk) {
            match std::fs::remove_file(&path) {
                Ok(()) => dirty = true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => out.errors.push(format!("removing {}: {e}", path.display())),
            }
        }
        // The objects that changed, then their files, each read and split once.
        let plan = self
            .plan_merged(served)
            .unwrap_or_else(|| self.plan_lookup(served));
        if self.adopt {
            // The served objects' `Arc`s, not a second copy of the whole config.
            for o in plan.unchanged {
                self.stored.insert(id_of(&o), o);
            }
        }
        let changed = plan.changed;
        let texts: BTreeMap<&str, Option<String>> = changed
            .iter()
            .map(|(_, o)| &*o.source().file)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .map(|f| (f, std::fs::read_to_string(f).ok()))
            .collect();
        let docs: BTreeMap<&str, Vec<(u32, &str)>> = texts
            .iter()
            .map(|(f, t)| {
                let docs = t
                    .as_deref()
                    .map(ballast_model::split_yaml_documents)
                    .unwrap_or_default();
                (*f, docs)
            })
            .collect();
        let mut captured = Vec::with_capacity(changed.len());
        for (id, o) in &changed {
            match capture(o, &docs[&*o.source().file]) {
                Some(entry) => captured.push((id, o, entry)),
                None => out.uncaptured.push(id.clone()),
            }
        }
        // Each write waits for its fsync: a large batch (the first sync of a big config) is
        // written by several threads, whose fsyncs the filesystem commits together (5,000
        // entries: 39 s one by one on a loaded test VM).
        let threads = captured
            .len()
            .div_ceil(WRITES_PER_THREAD)
            .clamp(1, MAX_WRITE_THREADS);
        let chunk = captured.len().div_ceil(threads).max(1);
        let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
            let handles: Vec<_> = captured
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(|| {
                        part.iter()
                            .map(|(id, _, entry)| self.write_entry(id, entry))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("a write thread panicked"))
                .collect()
        });
        for ((id, o, _), result) in captured.iter().zip(results) {
            match result {
                Ok(()) => {
                    self.stored.insert((*id).clone(), (*o).clone());
                    out.written += 1;
                    dirty = true;
                }
                Err(e) => out.errors.push(e),
            }
        }
        let gone = plan.gone;
        for id in gone {
            let path = self.dir.join(entry_name(&id));
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    out.removed += 1;
                    dirty = true;
                    self.stored.remove(&id);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    self.stored.remove(&id);
                }
                Err(e) => out.errors.push(format!("removing {}: {e}", path.display())),
            }
        }
        self.adopt = false;
        if dirty {
            // The renames and removals themselves must survive a power loss.
            if let Err(e) = std::fs::File::open(&self.dir).and_then(|d| d.sync_all()) {
                out.errors
                    .push(format!("syncing {}: {e}", self.dir.display()));
            }
        }
        out
    }

    /// What a sync must do, from one ordered walk of `served` beside the stored entries (both
    /// by kind, namespace, name): no allocation for an unchanged object, which is nearly all of
    /// them on a reload. `None` if `served` does not list its objects in that order.
    fn plan_merged(&self, served: &ConfigSet) -> Option<Plan> {
        let mut plan = Plan::default();
        let mut stored = self.stored.iter().peekable();
        let mut last: Option<Object> = None;
        for o in served.objects() {
            let m = o.metadata();
            let here = (o.kind(), m.namespace.as_str(), m.name.as_str());
            if let Some(l) = &last {
                let lm = l.metadata();
                if (l.kind(), lm.namespace.as_str(), lm.name.as_str()) >= here {
                    return None;
                }
            }
            while let Some((id, _)) = stored.next_if(|(id, _)| {
                (id.kind, id.key.namespace.as_str(), id.key.name.as_str()) < here
            }) {
                plan.gone.push(id.clone());
            }
            match stored.next_if(|(id, _)| {
                (id.kind, id.key.namespace.as_str(), id.key.name.as_str()) == here
            }) {
                Some((_, s)) if same(s, &o) => {
                    if self.adopt {
                        plan.unchanged.push(o.clone());
                    }
                }
                _ => plan.changed.push((id_of(&o), o.clone())),
            }
            last = Some(o);
        }
        plan.gone.extend(stored.map(|(id, _)| id.clone()));
        Some(plan)
    }

    /// [`Self::plan_merged`] by a lookup per object: whatever the order.
    fn plan_lookup(&self, served: &ConfigSet) -> Plan {
        let mut plan = Plan::default();
        for o in served.objects() {
            let id = id_of(&o);
            if self.stored.get(&id).is_some_and(|s| same(s, &o)) {
                if self.adopt {
                    plan.unchanged.push(o);
                }
            } else {
                plan.changed.push((id, o));
            }
        }
        plan.gone = self
            .stored
            .keys()
            .filter(|id| served.get(id.kind, &id.key).is_none())
            .cloned()
            .collect();
        plan
    }

    fn write_entry(&self, id: &ObjectId, entry: &Entry) -> Result<(), String> {
        let path = self.dir.join(entry_name(id));
        let tmp = self
            .dir
            .join(format!(".{}.{}.tmp", entry_name(id), std::process::id()));
        let bytes = serde_json::to_vec(entry).expect("serializable");
        let result = (|| {
            std::fs::create_dir_all(&self.dir)?;
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create(true).truncate(true);
            // Documents may hold Secrets: readable by the server's user only.
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            let mut f = opts.open(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result.map_err(|e| format!("writing {}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast_model::parse_file_report;

    fn route(name: &str, host: &str) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: {name} }}\nspec:\n  hostnames: [\"{host}\"]\n  rules:\n  - backendRefs: [{{ name: b, kind: Backend, group: ballast.dev }}]\n"
        )
    }

    fn load(path: &Path) -> ConfigSet {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).unwrap();
        let parse = parse_file_report(&name, &text);
        assert!(parse.errors().is_empty(), "{:?}", parse.errors());
        ConfigSet::from_objects(parse.objects).unwrap()
    }

    fn id(name: &str) -> ObjectId {
        ObjectId {
            kind: Kind::HttpRoute,
            key: ObjectKey::new("default", name),
        }
    }

    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("routes.yaml");
        let state = tmp.path().join("state").join(DIR_NAME);
        (tmp, file, state)
    }

    #[test]
    fn round_trips_exactly_with_positions() {
        let (_t, file, state) = setup();
        std::fs::write(
            &file,
            format!(
                "# leading comment\n{}---\n\n{}",
                route("r1", "a.example"),
                route("r2", "b.example")
            ),
        )
        .unwrap();
        let served = load(&file);
        let (mut lg, restored) = LastGood::open(state.clone());
        assert!(restored.set.is_empty() && restored.warnings.is_empty());
        let s = lg.sync(&served);
        assert_eq!(
            (s.written, s.removed, s.uncaptured.len()),
            (2, 0, 0),
            "{s:?}"
        );
        // Nothing changed: nothing written.
        assert_eq!(lg.sync(&served), Synced::default());
        let (lg2, restored) = LastGood::open(state.clone());
        assert!(restored.warnings.is_empty(), "{:?}", restored.warnings);
        assert_eq!(restored.set, served);
        for (a, b) in restored.set.objects().zip(served.objects()) {
            assert_eq!(a.source(), b.source(), "positions survive");
        }
        assert_eq!(lg2.len(), 2);
        // Readable names, and no temporary file left behind.
        let mut names: Vec<String> = std::fs::read_dir(&state)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names.len(), 2);
        assert!(names[0].starts_with("HTTPRoute.default.r1."), "{names:?}");
    }

    #[test]
    fn a_changed_file_is_never_stored_as_the_served_version() {
        let (_t, file, state) = setup();
        std::fs::write(&file, route("r1", "a.example")).unwrap();
        let v1 = load(&file);
        let (mut lg, _) = LastGood::open(state.clone());
        lg.sync(&v1);
        // Served v2, but by the time of the sync the file already holds v3 (invalid).
        std::fs::write(&file, route("r1", "b.example")).unwrap();
        let v2 = load(&file);
        std::fs::write(&file, route("r1", "b.example").replace("rules", "rulez")).unwrap();
        let s = lg.sync(&v2);
        assert_eq!(s.uncaptured, vec![id("r1")]);
        assert_eq!(s.written, 0);
        // v1 stays stored (never v3), and the next sync tries again.
        assert_eq!(LastGood::open(state.clone()).1.set, v1);
        std::fs::write(&file, route("r1", "b.example")).unwrap();
        assert_eq!(lg.sync(&v2).written, 1);
        assert_eq!(LastGood::open(state).1.set, v2);
    }

    #[test]
    fn objects_no_longer_served_lose_their_entry() {
        let (_t, file, state) = setup();
        std::fs::write(
            &file,
            format!(
                "{}---\n{}",
                route("r1", "a.example"),
                route("r2", "b.example")
            ),
        )
        .unwrap();
        let both = load(&file);
        let (mut lg, _) = LastGood::open(state.clone());
        lg.sync(&both);
        std::fs::write(&file, route("r1", "a.example")).unwrap();
        let one = load(&file);
        let s = lg.sync(&one);
        assert_eq!((s.written, s.removed), (0, 1));
        let restored = LastGood::open(state.clone()).1.set;
        assert_eq!(restored, one);
        assert_eq!(std::fs::read_dir(&state).unwrap().count(), 1);
    }

    #[test]
    fn corrupt_and_other_version_entries_are_warnings_and_removed() {
        let (_t, file, state) = setup();
        std::fs::write(
            &file,
            format!(
                "{}---\n{}",
                route("r1", "a.example"),
                route("r2", "b.example")
            ),
        )
        .unwrap();
        let served = load(&file);
        let (mut lg, _) = LastGood::open(state.clone());
        lg.sync(&served);
        let p1 = state.join(entry_name(&id("r1")));
        let p2 = state.join(entry_name(&id("r2")));
        let cases: [(&Path, String, &str); 5] = [
            (
                &p1,
                "{\"format\": 1, \"kind\": ".into(),
                "not a valid entry",
            ),
            (
                &p1,
                "{\"format\": 2, \"new\": []}".into(),
                "format version 2",
            ),
            (&p1, "[]".into(), "no numeric \"format\""),
            (
                &p1,
                std::fs::read_to_string(&p2).unwrap(),
                "which belongs in",
            ),
            (
                &p1,
                serde_json::to_string(&Entry {
                    format: FORMAT,
                    kind: "HTTPRoute".into(),
                    namespace: "default".into(),
                    name: "r1".into(),
                    file: "x.yaml".into(),
                    line_offset: 0,
                    text: "kind: HTTPRoute\nmetadata: {name: r1}\n".into(),
                })
                .unwrap(),
                "no longer parses",
            ),
        ];
        for (path, text, want) in cases {
            std::fs::write(path, &text).unwrap();
            let (mut lg, restored) = LastGood::open(state.clone());
            assert_eq!(
                restored.warnings.len(),
                1,
                "{text}: {:?}",
                restored.warnings
            );
            assert!(
                restored.warnings[0].contains(want),
                "{:?}",
                restored.warnings
            );
            assert!(restored.warnings[0].contains(".json"), "names the file");
            // The other entry is still usable.
            assert_eq!(restored.set.len(), 1);
            assert!(
                restored
                    .set
                    .http_routes
                    .contains_key(&ObjectKey::new("default", "r2"))
            );
            // The first sync replaces the unusable entry.
            let s = lg.sync(&served);
            assert_eq!(s.written, 1, "{s:?}");
            assert!(LastGood::open(state.clone()).1.warnings.is_empty());
        }
    }

    #[test]
    fn the_ordered_walk_plans_what_the_lookups_plan() {
        let (_t, file, state) = setup();
        let text = |names: &[&str], host: &str| -> String {
            names
                .iter()
                .map(|n| format!("---\n{}", route(n, host)))
                .collect::<String>()
                + "---\napiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: { name: b, namespace: z }\nspec:\n  endpoints: [{ address: 10.0.0.1, port: 80 }]\n"
        };
        std::fs::write(&file, text(&["a", "c", "e", "g"], "x.example")).unwrap();
        let (mut lg, _) = LastGood::open(state);
        let plan_ids = |p: Plan| {
            let mut changed: Vec<ObjectId> = p.changed.into_iter().map(|(id, _)| id).collect();
            changed.sort();
            let mut gone = p.gone;
            gone.sort();
            let mut unchanged: Vec<ObjectId> = p.unchanged.iter().map(id_of).collect();
            unchanged.sort();
            (changed, gone, unchanged)
        };
        for (names, host) in [
            (&["a", "c", "e", "g"][..], "x.example"),
            (&["a", "b", "e", "h"][..], "x.example"),
            (&["0", "a", "e"][..], "y.example"),
            (&[][..], "y.example"),
            (&["z", "c"][..], "y.example"),
        ] {
            std::fs::write(&file, text(names, host)).unwrap();
            let served = load(&file);
            for adopt in [true, false] {
                lg.adopt = adopt;
                let merged = lg.plan_merged(&served).expect("objects() is ordered");
                assert_eq!(
                    plan_ids(merged),
                    plan_ids(lg.plan_lookup(&served)),
                    "{names:?}"
                );
            }
            lg.adopt = false;
            let s = lg.sync(&served);
            assert!(s.errors.is_empty() && s.uncaptured.is_empty(), "{s:?}");
        }
    }

    #[test]
    fn writes_are_atomic_and_leftovers_are_cleaned() {
        let (_t, file, state) = setup();
        std::fs::write(&file, route("r1", "a.example")).unwrap();
        let v1 = load(&file);
        let (mut lg, _) = LastGood::open(state.clone());
        lg.sync(&v1);
        let path = state.join(entry_name(&id("r1")));
        let before = std::fs::read(&path).unwrap();
        // A write that fails midway (its temporary file's name is taken by a directory, as if
        // the disk refused it) leaves the previous entry whole.
        let tmp = state.join(format!(
            ".{}.{}.tmp",
            entry_name(&id("r1")),
            std::process::id()
        ));
        std::fs::create_dir(&tmp).unwrap();
        std::fs::write(&file, route("r1", "b.example")).unwrap();
        let v2 = load(&file);
        let s = lg.sync(&v2);
        assert_eq!(s.errors.len(), 1, "{s:?}");
        assert!(s.errors[0].contains(&path.display().to_string()), "{s:?}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
        std::fs::remove_dir(&tmp).unwrap();
        // A temporary file left by a crash is ignored at open and removed at the first sync.
        std::fs::write(state.join(".x.json.1.tmp"), "partial").unwrap();
        let (mut lg, restored) = LastGood::open(state.clone());
        assert!(restored.warnings.is_empty());
        assert_eq!(restored.set, v1);
        assert_eq!(lg.sync(&v2).written, 1);
        assert_eq!(std::fs::read_dir(&state).unwrap().count(), 1);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "entries may hold Secrets");
        }
    }
}
