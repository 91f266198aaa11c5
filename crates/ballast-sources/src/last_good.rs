//! Per-object last known good that survives a restart: the document of every object the file
//! source serves, kept in `<state dir>/last-good/` (one file per source file that has served
//! objects, a "group"), so that a restart into an object (or a whole file) that no longer
//! parses or validates serves its last good version instead of dropping it (invariant 8; a
//! live Envoy would otherwise lose the route, and the guard holds only mass removals).
//!
//! What is stored is the object's YAML document exactly as it was read and validated, with
//! the file it came from and the number of file lines before it: re-parsing it gives the very
//! same object, position included (so `/debug/sources` points at the same line, and a file
//! that is held whole keeps it). A document is captured by reading the object's file again
//! after the load that served it, and it is stored only if re-parsing it gives exactly the
//! served object: if the file changed in between, nothing wrong is stored (the previous entry
//! stays, and the capture is retried on the next change).
//!
//! Why one file per source file and not per object: the first sync of a 20,000-object config
//! wrote 20,000 files (one fsync each, 3.65 s of system CPU); a group per source file is about
//! one write per hundred objects, and an edit rewrites only its own file's group.
//!
//! Why a journal beside the groups: an edit rewrote its file's whole group (about a hundred
//! documents, 70 KB, serialised, written, fsynced, renamed, and read back first), 20 % of an
//! edit's CPU with 10,000 routes (issue #13, W3). A sync of a few changes now appends one frame
//! to `journal` (length, xxh3 checksum, the changed entries and removals as JSON; one write,
//! one fdatasync). At open the journal's frames are replayed over the groups, each object's
//! newest version winning by sequence (groups and frames take theirs from one counter); a
//! frame cut short by a crash, or whose checksum fails, ends the journal (that sync never
//! completed) and the next append overwrites it. The journal is compacted into the groups
//! (every group it touched is rewritten, then an empty journal of the next generation replaces
//! it) when it outgrows max(256 KiB, a quarter of the groups' bytes), at the first sync after a
//! start, and by any sync that writes groups anyway (a large change). A group carries the
//! generation of the journal it includes: a journal of an older generation (its records are
//! all in the groups already, and might undo newer ones) is a warning and is not replayed. A
//! crash mid-compaction leaves the old journal, replayed over old and new groups alike (its
//! records are older than the new groups'). A state dir without a journal (older builds) reads
//! as before.
//!
//! Bounded: only objects served now have an entry, and an object no longer served (deleted on
//! purpose, or gone from the files while Ballast was down) loses its entry at the first sync.
//! A group is rewritten atomically (temporary file, fsync, rename; the directory is synced
//! once per batch) and only when one of its objects changed or went away; it is removed when
//! its file has no served object left. A corrupt group or one of another format version is a
//! warning and is not used; nothing here ever keeps the server from starting.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ballast_model::{ConfigSet, Kind, Object, ObjectId, ObjectKey};
use serde::{Deserialize, Serialize};

/// The group format this build writes and reads (1 was one file per object).
pub const FORMAT: u64 = 2;
/// The minimum time between two syncs: under churn the entries lag the served set by at most
/// this much, and cost at most one batch of writes a second.
pub const MIN_WRITE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// The directory inside the state dir.
pub const DIR_NAME: &str = "last-good";

/// The stored objects of one source file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Group {
    format: u64,
    /// The file the documents were read from (as the source names it).
    file: String,
    /// Increases with every group written by this state dir: when an object moved between
    /// files, the newest group holding it wins at restore.
    sequence: u64,
    /// Seconds since the Unix epoch, for people reading the directory.
    written_at: u64,
    /// The generation of the journal whose records this group includes (0: written before
    /// the journal, or by a build without one): a journal of an older generation is not
    /// replayed over it.
    #[serde(default)]
    journal: u64,
    entries: Vec<Entry>,
}

/// One stored object of a group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    kind: String,
    namespace: String,
    name: String,
    /// File lines before the document, so positions come out as they were.
    line_offset: u32,
    text: String,
}

/// The journal of the last good dir: what changed since its groups were written, one record
/// per sync (not `.json`: never read as a group).
pub const JOURNAL_NAME: &str = "journal";
/// The journal format this build writes and reads.
pub const JOURNAL_FORMAT: u64 = 1;
/// The journal is compacted into the groups when it holds more bytes than this, or than a
/// quarter of the groups' bytes if that is more: compaction rewrites every group the journal
/// touched (O(those groups)), so at most about once per quarter of the groups' size written.
const JOURNAL_MIN_BOUND: u64 = 256 * 1024;
/// A sync that changes more objects than this writes their groups directly (a journal record
/// of a whole config would be written twice).
const JOURNAL_MAX_BATCH: usize = 256;
/// A journal frame: payload length (u32, little endian), xxh3-64 of the payload (u64, little
/// endian), the payload (JSON). A frame cut short or whose checksum fails ends the journal.
const FRAME_HEADER: usize = 12;

/// The first frame of a journal.
#[derive(Debug, Serialize, Deserialize)]
struct JournalHeader {
    journal_format: u64,
    /// Increases at every compaction; the groups written by a compaction carry the generation
    /// of the journal they include (`Group::journal`).
    generation: u64,
}

/// What one sync changed: one frame, so a sync is replayed whole or not at all.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Batch {
    /// From the same counter as the groups' sequences: at restore, the newest of a group and
    /// a batch holding an object wins.
    sequence: u64,
    #[serde(default)]
    puts: Vec<Put>,
    #[serde(default)]
    removes: Vec<Removed>,
}

/// An object stored (added, changed, or moved to `file`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Put {
    file: String,
    entry: Entry,
}

/// An object no longer stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Removed {
    kind: String,
    namespace: String,
    name: String,
}

/// An entry's identity as stored: (kind, namespace, name).
type EntryKey = (String, String, String);

fn key_of_entry(e: &Entry) -> EntryKey {
    (e.kind.clone(), e.namespace.clone(), e.name.clone())
}

fn key_of_id(id: &ObjectId) -> EntryKey {
    (
        id.kind.as_str().to_owned(),
        id.key.namespace.clone(),
        id.key.name.clone(),
    )
}

fn frame(payload: &[u8], out: &mut Vec<u8>) {
    let len = u32::try_from(payload.len()).expect("a journal record under 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// The whole frames at the start of `bytes`, up to the first one cut short or corrupt.
fn frames(bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while rest.len() >= FRAME_HEADER {
        let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        let sum = u64::from_le_bytes(rest[4..FRAME_HEADER].try_into().expect("8 bytes"));
        let Some(payload) = rest[FRAME_HEADER..].get(..len) else {
            break;
        };
        if xxhash_rust::xxh3::xxh3_64(payload) != sum {
            break;
        }
        out.push(payload);
        rest = &rest[FRAME_HEADER + len..];
    }
    out
}

fn header_frame(generation: u64) -> Vec<u8> {
    let header = JournalHeader {
        journal_format: JOURNAL_FORMAT,
        generation,
    };
    let mut out = Vec::new();
    frame(
        &serde_json::to_vec(&header).expect("serializable"),
        &mut out,
    );
    out
}

/// A journal as read.
#[derive(Debug)]
struct JournalRead {
    generation: u64,
    batches: Vec<Batch>,
    /// The bytes of its whole records (header included): appends go there.
    valid_len: u64,
    /// Bytes past the last whole record (a write cut short): ignored.
    torn: bool,
}

/// Reads the journal at `path` (missing: `None`), or a message for the warning.
fn read_journal(path: &Path) -> Result<Option<JournalRead>, String> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("reading: {e}")),
    };
    let mut frames = frames(&bytes).into_iter();
    let first = frames
        .next()
        .ok_or_else(|| "not a valid journal: no whole header".to_owned())?;
    let header: JournalHeader =
        serde_json::from_slice(first).map_err(|e| format!("not a valid journal header: {e}"))?;
    if header.journal_format != JOURNAL_FORMAT {
        return Err(format!(
            "journal format version {}; this build reads version {JOURNAL_FORMAT}",
            header.journal_format
        ));
    }
    let mut valid_len = FRAME_HEADER + first.len();
    let mut batches = Vec::new();
    for payload in frames {
        let Ok(batch) = serde_json::from_slice::<Batch>(payload) else {
            break;
        };
        batches.push(batch);
        valid_len += FRAME_HEADER + payload.len();
    }
    Ok(Some(JournalRead {
        generation: header.generation,
        batches,
        valid_len: valid_len as u64,
        torn: valid_len < bytes.len(),
    }))
}

/// One stored document, as [`stored_documents`] lists them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredDocument {
    /// The source file it was read from.
    pub file: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub text: String,
}

/// What `dir` (a last good dir) stores, groups and journal together, in (kind, namespace,
/// name) order, without parsing the documents (for tests and people: [`LastGood::open`] is
/// what restores).
pub fn stored_documents(dir: &Path) -> Vec<StoredDocument> {
    let mut groups: Vec<Group> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .filter_map(|e| {
            let g = read_group(&e.path()).ok()?;
            (group_name(&g.file) == e.file_name().to_string_lossy()).then_some(g)
        })
        .collect();
    groups.sort_by_key(|g| g.sequence);
    let tag = groups.iter().map(|g| g.journal).max().unwrap_or(0);
    let batches = match read_journal(&dir.join(JOURNAL_NAME)) {
        Ok(Some(j)) if j.generation >= tag => j.batches,
        _ => Vec::new(),
    };
    let mut out: BTreeMap<EntryKey, StoredDocument> = BTreeMap::new();
    let doc = |file: &str, e: Entry| StoredDocument {
        file: file.to_owned(),
        kind: e.kind,
        namespace: e.namespace,
        name: e.name,
        text: e.text,
    };
    for event in merge_events(groups, batches) {
        match event {
            Event::Group(g) => {
                for e in g.entries {
                    out.insert(key_of_entry(&e), doc(&g.file, e));
                }
            }
            Event::Batch(b) => {
                for p in b.puts {
                    out.insert(key_of_entry(&p.entry), doc(&p.file, p.entry));
                }
                for r in b.removes {
                    out.remove(&(r.kind, r.namespace, r.name));
                }
            }
        }
    }
    out.into_values().collect()
}

/// A group or a journal batch, applied in sequence order at restore.
enum Event<G> {
    Group(G),
    Batch(Batch),
}

trait Sequenced {
    fn sequence(&self) -> u64;
}

impl Sequenced for Group {
    fn sequence(&self) -> u64 {
        self.sequence
    }
}

impl<T> Sequenced for (PathBuf, T)
where
    T: Sequenced,
{
    fn sequence(&self) -> u64 {
        self.1.sequence()
    }
}

/// `groups` (in sequence order) and `batches` (in journal order) merged in sequence order, a
/// group before a batch of the same sequence.
fn merge_events<G: Sequenced>(groups: Vec<G>, batches: Vec<Batch>) -> Vec<Event<G>> {
    let mut out = Vec::with_capacity(groups.len() + batches.len());
    let mut batches = batches.into_iter().peekable();
    for g in groups {
        while let Some(b) = batches.next_if(|b| b.sequence < g.sequence()) {
            out.push(Event::Batch(b));
        }
        out.push(Event::Group(g));
    }
    out.extend(batches.map(Event::Batch));
    out
}

/// `<state dir>/last-good`.
pub fn dir_in(state_dir: &Path) -> PathBuf {
    state_dir.join(DIR_NAME)
}

/// The group file of source file `file`: readable (its file name, `routes.yaml.…`) and unique
/// (a hash of the whole path, so any path fits a file name).
pub fn group_name(file: &str) -> String {
    let base = Path::new(file)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let readable: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    let hash = xxhash_rust::xxh3::xxh3_64(file.as_bytes());
    format!("{readable}.{hash:016x}.json")
}

/// A per-object entry of the previous layout (`KIND.ns.name.<32 hex>.json`): never released,
/// so removed without a warning.
fn is_old_layout(name: &str) -> bool {
    name.strip_suffix(".json")
        .and_then(|s| s.rsplit_once('.'))
        .is_some_and(|(_, h)| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
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
    same(&parsed, o).then(|| entry_of(o, line_offset, text.to_owned()))
}

fn entry_of(o: &Object, line_offset: u32, text: String) -> Entry {
    Entry {
        kind: o.kind().as_str().to_owned(),
        namespace: o.key().namespace,
        name: o.key().name,
        line_offset,
        text,
    }
}

/// Captures each of `objs` (all from `file`), reading and splitting the file once.
fn capture_all<'a>(file: &str, objs: impl IntoIterator<Item = &'a Object>) -> Vec<Option<Entry>> {
    let text = std::fs::read_to_string(file).ok();
    let docs = text
        .as_deref()
        .map(ballast_model::split_yaml_documents)
        .unwrap_or_default();
    objs.into_iter().map(|o| capture(o, &docs)).collect()
}

/// Reads one group file, or a message for the warning.
fn read_group(path: &Path) -> Result<Group, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("reading: {e}"))?;
    // The version first: another format may have any shape. Read without building a
    // `serde_json::Value` of the whole group (an edit's sync reads its group back: issue #13).
    let header: Header =
        serde_json::from_slice(&bytes).map_err(|e| format!("not a valid group: {e}"))?;
    match header.format.as_ref().and_then(|v| v.as_u64()) {
        Some(FORMAT) => {}
        Some(v) => {
            return Err(format!(
                "format version {v}; this build reads version {FORMAT}"
            ));
        }
        None => return Err("not a valid group: no numeric \"format\" field".into()),
    }
    serde_json::from_slice(&bytes).map_err(|e| format!("not a valid group: {e}"))
}

/// The one field of a group read before its format is known (the others are skipped).
#[derive(Deserialize)]
struct Header {
    #[serde(default)]
    format: Option<serde_json::Value>,
}

/// The object of one entry of `file`'s group, or a message for the warning.
fn entry_object(file: &str, e: &Entry) -> Result<Object, String> {
    let o = parse_entry_text(file, e.line_offset, &e.text)
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
    /// One message per group or entry that could not be used (corrupt, other version),
    /// naming its file.
    pub warnings: Vec<String>,
}

/// What one [`LastGood::sync`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Synced {
    /// Group files written.
    pub written: usize,
    /// Group files removed (their source file has no served object any more).
    pub removed: usize,
    /// Objects recorded (stored or removed) in the journal instead of their groups.
    pub journaled: usize,
    /// Whether the journal was compacted into the groups (and started again, empty).
    pub compacted: bool,
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
/// objects they reload to, which share their `Arc`s with the served set; the texts stay on
/// disk and are read back only when their group is rewritten).
#[derive(Debug)]
pub struct LastGood {
    dir: PathBuf,
    /// Each object is in the group of its source's file.
    stored: Stored,
    /// Served objects whose entry may differ from the served version after the last sync (not
    /// captured, or their group's write failed): a sync told only what changed looks at them
    /// again, as a full sync would.
    retry: BTreeSet<ObjectId>,
    /// Files that could not be used: removed at the first sync.
    junk: Vec<PathBuf>,
    /// Groups to rewrite at the next sync whatever changed (they hold entries that lost to a
    /// newer group, or unusable ones, or their last write failed).
    dirty: BTreeSet<String>,
    /// The highest group sequence seen or written.
    sequence: u64,
    /// Until the first sync: `stored` holds the objects read at open, to be replaced by the
    /// served ones.
    adopt: bool,
    /// The most captured documents one sync held at once (tests: the first sync holds one
    /// group's, not the whole config's).
    max_held: usize,
    /// Group files read back by syncs (tests: an edit's sync reads none).
    groups_read: usize,
    journal: Journal,
}

/// The journal's state: an edit's sync appends one record (a small write and an fsync)
/// instead of rewriting its file's whole group (issue #13, W3: 14 % of an edit's CPU).
#[derive(Debug)]
struct Journal {
    /// Whether syncs may append to the journal (tests turn it off to look at groups alone).
    enabled: bool,
    generation: u64,
    /// Bytes of the journal's whole records on disk (0: no usable journal: the next append
    /// creates one).
    len: u64,
    /// The file may hold bytes past `len` (a write cut short): cut before the next append.
    tail: bool,
    /// Batches in the journal (0: nothing to compact).
    batches: u64,
    /// Files whose group misses some of the journal's records: rewritten at compaction.
    pending: BTreeSet<String>,
    /// The size of each group file, for the compaction bound.
    group_bytes: HashMap<String, u64>,
    /// [`JOURNAL_MIN_BOUND`] (tests compact sooner).
    min_bound: u64,
}

impl Journal {
    /// Compact when the journal holds more than this.
    fn bound(&self) -> u64 {
        self.min_bound
            .max(self.group_bytes.values().sum::<u64>() / 4)
    }
}

/// The stored objects, and by source file the ids each group holds: rewriting a group needs
/// its members, and finding them by a walk of every stored object made an edit's sync
/// O(config) (issue #13, W3).
#[derive(Debug, Default)]
struct Stored {
    objects: BTreeMap<ObjectId, Object>,
    by_file: HashMap<Arc<str>, BTreeSet<ObjectId>>,
}

impl Stored {
    fn get(&self, id: &ObjectId) -> Option<&Object> {
        self.objects.get(id)
    }

    fn insert(&mut self, id: ObjectId, o: Object) -> Option<Object> {
        let file = o.source().file.clone();
        let old = self.objects.insert(id.clone(), o);
        if let Some(old) = &old {
            self.unlink(&id, &old.source().file);
        }
        self.by_file.entry(file).or_default().insert(id);
        old
    }

    fn remove(&mut self, id: &ObjectId) -> Option<Object> {
        let old = self.objects.remove(id)?;
        self.unlink(id, &old.source().file);
        Some(old)
    }

    fn unlink(&mut self, id: &ObjectId, file: &Arc<str>) {
        if let Some(ids) = self.by_file.get_mut(file) {
            ids.remove(id);
            if ids.is_empty() {
                self.by_file.remove(file);
            }
        }
    }

    /// The ids stored in `file`'s group, in id order.
    fn members(&self, file: &str) -> Vec<ObjectId> {
        self.by_file
            .get(file)
            .map(|ids| ids.iter().cloned().collect())
            .unwrap_or_default()
    }
}

impl LastGood {
    /// Reads every group in `dir` (missing: none). Never fails: unusable groups and entries
    /// are warnings.
    pub fn open(dir: PathBuf) -> (LastGood, Restored) {
        let mut restored = Restored::default();
        let mut stored = Stored::default();
        let mut junk = Vec::new();
        let mut dirty = BTreeSet::new();
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
        let mut groups = Vec::new();
        let mut group_bytes = HashMap::new();
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
            if is_old_layout(name) {
                junk.push(path);
                continue;
            }
            match read_group(&path) {
                Ok(g) if group_name(&g.file) == name => {
                    if let Ok(m) = std::fs::metadata(&path) {
                        group_bytes.insert(g.file.clone(), m.len());
                    }
                    groups.push((path, g))
                }
                Ok(g) => {
                    restored.warnings.push(format!(
                        "{}: holds the objects of {}, which belong in {}",
                        path.display(),
                        g.file,
                        group_name(&g.file)
                    ));
                    junk.push(path);
                }
                Err(m) => {
                    restored.warnings.push(format!("{}: {m}", path.display()));
                    junk.push(path);
                }
            }
        }
        // Oldest first: an object stored in two groups (it moved) is the newer group's.
        groups.sort_by(|a, b| (a.1.sequence, &a.0).cmp(&(b.1.sequence, &b.0)));
        let tag = groups.iter().map(|(_, g)| g.journal).max().unwrap_or(0);
        let mut journal = Journal {
            enabled: true,
            generation: tag,
            len: 0,
            tail: false,
            batches: 0,
            pending: BTreeSet::new(),
            group_bytes,
            min_bound: JOURNAL_MIN_BOUND,
        };
        // The journal's records since the groups were written, if it is of their generation
        // (an older one's records are all in the groups already, and might undo newer ones).
        let journal_path = dir.join(JOURNAL_NAME);
        let mut batches = Vec::new();
        match read_journal(&journal_path) {
            Ok(None) => {}
            Ok(Some(j)) if j.generation >= tag => {
                if j.torn {
                    restored.warnings.push(format!(
                        "{}: ignored a last record cut short (a write interrupted by a crash)",
                        journal_path.display()
                    ));
                }
                journal.generation = j.generation;
                journal.len = j.valid_len;
                journal.tail = j.torn;
                journal.batches = j.batches.len() as u64;
                batches = j.batches;
            }
            Ok(Some(j)) => {
                restored.warnings.push(format!(
                    "{}: of generation {}, older than the groups' ({tag}): not replayed",
                    journal_path.display(),
                    j.generation
                ));
                junk.push(journal_path);
            }
            Err(m) => {
                restored
                    .warnings
                    .push(format!("{}: {m}", journal_path.display()));
                junk.push(journal_path);
            }
        }
        let mut sequence = 0;
        for event in merge_events(groups, batches) {
            let (path, g) = match event {
                Event::Group(pg) => pg,
                Event::Batch(b) => {
                    sequence = sequence.max(b.sequence);
                    for p in &b.puts {
                        journal.pending.insert(p.file.clone());
                        match entry_object(&p.file, &p.entry) {
                            Ok(o) => {
                                if let Some(old) = stored.insert(id_of(&o), o) {
                                    journal.pending.insert(old.source().file.to_string());
                                }
                            }
                            Err(m) => restored.warnings.push(format!(
                                "{}: {} {}/{}: {m}",
                                dir.join(JOURNAL_NAME).display(),
                                p.entry.kind,
                                p.entry.namespace,
                                p.entry.name
                            )),
                        }
                    }
                    for r in &b.removes {
                        let Some(kind) = Kind::from_kind_str(&r.kind) else {
                            continue;
                        };
                        let id = ObjectId {
                            kind,
                            key: ObjectKey::new(&r.namespace, &r.name),
                        };
                        if let Some(old) = stored.remove(&id) {
                            journal.pending.insert(old.source().file.to_string());
                        }
                    }
                    continue;
                }
            };
            sequence = sequence.max(g.sequence);
            for e in &g.entries {
                match entry_object(&g.file, e) {
                    Ok(o) => {
                        if let Some(old) = stored.insert(id_of(&o), o) {
                            dirty.insert(old.source().file.to_string());
                        }
                    }
                    Err(m) => {
                        restored.warnings.push(format!(
                            "{}: {} {}/{}: {m}",
                            path.display(),
                            e.kind,
                            e.namespace,
                            e.name
                        ));
                        dirty.insert(g.file.clone());
                    }
                }
            }
            if g.entries.is_empty() {
                dirty.insert(g.file.clone());
            }
        }
        for o in stored.objects.values() {
            restored.set.insert(o.clone());
        }
        (
            LastGood {
                dir,
                stored,
                retry: BTreeSet::new(),
                junk,
                dirty,
                sequence,
                adopt: true,
                max_held: 0,
                groups_read: 0,
                journal,
            },
            restored,
        )
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many objects are stored.
    pub fn len(&self) -> usize {
        self.stored.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stored.objects.is_empty()
    }

    /// Makes the stored entries those of `served`: rewrites the group of each file whose
    /// objects changed or went away (reading the changed documents from their file, the others
    /// from the previous group), removes the groups of files with no served object left.
    pub fn sync(&mut self, served: &ConfigSet) -> Synced {
        self.sync_changed(served, None)
    }

    /// [`Self::sync`] told which objects may differ from the set of the previous sync:
    /// `changed` must hold every object added, removed, modified or moved (its position) since
    /// (more is fine;
    /// `None`: unknown). Costs O(changed objects and their groups), not O(config): an edit's
    /// sync walked all 20,000 objects of a 10,000-route config (~10 % of its CPU, issue #13).
    /// The first sync always walks every object (it adopts the served ones).
    pub fn sync_changed(
        &mut self,
        served: &ConfigSet,
        changed: Option<&BTreeSet<ObjectId>>,
    ) -> Synced {
        let mut out = Synced::default();
        let mut dir_dirty = false;
        // First: an unusable file may sit where a group is written now.
        for path in std::mem::take(&mut self.junk) {
            match std::fs::remove_file(&path) {
                Ok(()) => dir_dirty = true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => out.errors.push(format!("removing {}: {e}", path.display())),
            }
        }
        let retry = std::mem::take(&mut self.retry);
        let mut plan = match changed {
            Some(ids) if !self.adopt => self.plan_changed(served, ids.iter().chain(&retry)),
            _ => self
                .plan_merged(served)
                .unwrap_or_else(|| self.plan_lookup(served)),
        };
        // A few objects changed, and every group holds what it should but for the journal's
        // records: one record in the journal, not a rewrite of their groups.
        let journal = !self.adopt
            && self.journal.enabled
            && self.dirty.is_empty()
            && plan.changed.len() + plan.gone.len() <= JOURNAL_MAX_BATCH;
        if self.adopt {
            // The served objects' `Arc`s, not a second copy of the whole config.
            for o in std::mem::take(&mut plan.unchanged) {
                self.stored.insert(id_of(&o), o);
            }
        }
        self.adopt = false;
        if journal {
            dir_dirty |= self.sync_journal(plan, &mut out);
            if self.journal.len > self.journal.bound() {
                dir_dirty = self.compact(dir_dirty, &mut out);
            }
            self.sync_dir(dir_dirty, &mut out);
            return out;
        }
        let mut groups = std::mem::take(&mut self.dirty);
        // Every group the journal's records miss is rewritten with them (then the journal
        // starts again, empty).
        groups.extend(self.journal.pending.iter().cloned());
        let texts = self.journal_texts();
        // What to put back if a group cannot be written: (id, previous stored version).
        let mut undo: Vec<(ObjectId, Option<Object>)> = Vec::new();
        for id in plan.gone {
            if let Some(old) = self.stored.remove(&id) {
                groups.insert(old.source().file.to_string());
                undo.push((id, Some(old)));
            }
        }
        // The changed objects by the file their document is read from, each file read and
        // split once.
        let mut by_file: BTreeMap<&str, Vec<&(ObjectId, Object)>> = BTreeMap::new();
        for c in &plan.changed {
            by_file.entry(&c.1.source().file).or_default().push(c);
        }
        // Each group is written as soon as no later file's captures can change its members
        // (the last file holding an object that is, or moves, in or out of it), so that the
        // captured documents are held one group at a time: the first sync after a start
        // captures every object, and holding all their texts until the end was the top of
        // the start's peak memory (issue #13, W4). An object moving in from a file captured
        // later keeps a group waiting until then.
        let mut ready_at: HashMap<String, usize> = HashMap::new();
        for (i, (file, objs)) in by_file.iter().enumerate() {
            // Files in order: a later index replaces an earlier one.
            ready_at.insert((*file).to_owned(), i);
            for (id, _) in objs {
                if let Some(old) = self.stored.get(id) {
                    ready_at.insert(old.source().file.to_string(), i);
                }
            }
        }
        let mut captured: HashMap<ObjectId, Entry> = HashMap::new();
        for (i, (file, objs)) in by_file.iter().enumerate() {
            let entries = capture_all(file, objs.iter().map(|(_, o)| o));
            for ((id, o), entry) in objs.iter().map(|c| (&c.0, &c.1)).zip(entries) {
                match entry {
                    Some(e) => {
                        groups.insert((*file).to_owned());
                        let old = self.stored.insert(id.clone(), o.clone());
                        if let Some(old) = &old {
                            groups.insert(old.source().file.to_string());
                        }
                        undo.push((id.clone(), old));
                        captured.insert(id.clone(), e);
                        self.max_held = self.max_held.max(captured.len());
                    }
                    // Its previous entry (if any) stays, in the group it is in.
                    None => {
                        self.retry.insert(id.clone());
                        out.uncaptured.push(id.clone());
                    }
                }
            }
            let ready: Vec<String> = groups
                .iter()
                .filter(|g| ready_at.get(g.as_str()) == Some(&i))
                .cloned()
                .collect();
            for g in ready {
                groups.remove(&g);
                dir_dirty |= self.write_members(g, &mut captured, &undo, &texts, &mut out);
            }
        }
        // Groups no capture touches (objects gone, or dirty, or missing journal records).
        for g in std::mem::take(&mut groups) {
            dir_dirty |= self.write_members(g, &mut captured, &undo, &texts, &mut out);
        }
        drop(texts);
        dir_dirty = self.finish_compaction(dir_dirty, &mut out);
        self.sync_dir(dir_dirty, &mut out);
        out
    }

    /// Records what `plan` changed in the journal (capturing the changed objects' documents):
    /// one frame, one write and one fsync. Returns whether the directory changed (the journal
    /// was created). If the write fails, what is stored goes back to what it was, and the
    /// objects are looked at again by the next sync.
    fn sync_journal(&mut self, plan: Plan, out: &mut Synced) -> bool {
        let mut undo: Vec<(ObjectId, Option<Object>)> = Vec::new();
        let mut batch = Batch::default();
        let mut touched: Vec<String> = Vec::new();
        for id in plan.gone {
            if let Some(old) = self.stored.remove(&id) {
                touched.push(old.source().file.to_string());
                let (kind, namespace, name) = key_of_id(&id);
                batch.removes.push(Removed {
                    kind,
                    namespace,
                    name,
                });
                undo.push((id, Some(old)));
            }
        }
        let mut by_file: BTreeMap<&str, Vec<&(ObjectId, Object)>> = BTreeMap::new();
        for c in &plan.changed {
            by_file.entry(&c.1.source().file).or_default().push(c);
        }
        for (file, objs) in by_file {
            let entries = capture_all(file, objs.iter().map(|(_, o)| o));
            for ((id, o), entry) in objs.iter().map(|c| (&c.0, &c.1)).zip(entries) {
                let Some(entry) = entry else {
                    // Its previous entry (if any) stays.
                    self.retry.insert(id.clone());
                    out.uncaptured.push(id.clone());
                    continue;
                };
                touched.push(file.to_owned());
                let old = self.stored.insert(id.clone(), o.clone());
                if let Some(old) = &old {
                    touched.push(old.source().file.to_string());
                }
                undo.push((id.clone(), old));
                batch.puts.push(Put {
                    file: file.to_owned(),
                    entry,
                });
            }
        }
        if batch.puts.is_empty() && batch.removes.is_empty() {
            return false;
        }
        batch.sequence = self.sequence + 1;
        match self.append(&batch) {
            Ok(created) => {
                self.sequence = batch.sequence;
                out.journaled += batch.puts.len() + batch.removes.len();
                self.journal.pending.extend(touched);
                created
            }
            Err(e) => {
                out.errors.push(e);
                for (id, old) in undo {
                    self.retry.insert(id.clone());
                    match old {
                        Some(o) => self.stored.insert(id, o),
                        None => self.stored.remove(&id),
                    };
                }
                false
            }
        }
    }

    /// Appends `batch` to the journal (creating it, with its header, if there is none) and
    /// syncs it. Returns whether the journal file was created.
    fn append(&mut self, batch: &Batch) -> Result<bool, String> {
        let create = self.journal.len == 0;
        let mut bytes = if create {
            header_frame(self.journal.generation)
        } else {
            Vec::new()
        };
        frame(
            &serde_json::to_vec(batch).expect("serializable"),
            &mut bytes,
        );
        let path = self.dir.join(JOURNAL_NAME);
        let at = self.journal.len;
        let tail = self.journal.tail;
        let result = (|| {
            use std::io::{Seek, SeekFrom};
            std::fs::create_dir_all(&self.dir)?;
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true);
            if create {
                opts.create(true).truncate(true);
                // Documents may hold Secrets: readable by the server's user only.
                #[cfg(unix)]
                std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            }
            let mut f = opts.open(&path)?;
            if tail && !create {
                // What a write cut short left: a record after it would never be read.
                f.set_len(at)?;
            }
            f.seek(SeekFrom::Start(at))?;
            f.write_all(&bytes)?;
            f.sync_data()
        })();
        match result {
            Ok(()) => {
                self.journal.len = at + bytes.len() as u64;
                self.journal.tail = false;
                self.journal.batches += 1;
                Ok(create)
            }
            Err(e) => {
                // Part of the record may be there: cut at the next append.
                self.journal.tail = true;
                Err(format!("writing {}: {e}", path.display()))
            }
        }
    }

    /// The latest journal record of each object: its sequence, and where and what it stored
    /// (`None`: removed). Read back from the journal file, at compaction only.
    fn journal_texts(&self) -> HashMap<EntryKey, (u64, Option<Put>)> {
        let mut out = HashMap::new();
        if self.journal.batches == 0 {
            return out;
        }
        let Ok(Some(j)) = read_journal(&self.dir.join(JOURNAL_NAME)) else {
            return out;
        };
        if j.generation != self.journal.generation {
            return out;
        }
        // Only the records this store appended (one whose sync failed may be there whole).
        let n = usize::try_from(self.journal.batches).unwrap_or(usize::MAX);
        for b in j.batches.into_iter().take(n) {
            for p in b.puts {
                out.insert(key_of_entry(&p.entry), (b.sequence, Some(p)));
            }
            for r in b.removes {
                out.insert((r.kind, r.namespace, r.name), (b.sequence, None));
            }
        }
        out
    }

    /// Rewrites every group the journal's records miss, then starts the journal again.
    /// Returns whether the directory changed.
    fn compact(&mut self, mut dir_dirty: bool, out: &mut Synced) -> bool {
        let texts = self.journal_texts();
        let mut captured = HashMap::new();
        for file in self.journal.pending.clone() {
            dir_dirty |= self.write_members(file, &mut captured, &[], &texts, out);
        }
        drop(texts);
        self.finish_compaction(dir_dirty, out)
    }

    /// If every group holds the journal's records, starts a journal of the next generation,
    /// empty, in its place. Returns whether the directory changed.
    fn finish_compaction(&mut self, dir_dirty: bool, out: &mut Synced) -> bool {
        if self.journal.batches == 0 || !self.journal.pending.is_empty() {
            return dir_dirty;
        }
        // The groups' renames reach the disk before the journal that no longer holds their
        // records replaces the one that does.
        self.sync_dir(dir_dirty, out);
        let generation = self.journal.generation + 1;
        let bytes = header_frame(generation);
        match self.write_atomic(&self.dir.join(JOURNAL_NAME), &bytes) {
            Ok(()) => {
                self.journal.generation = generation;
                self.journal.len = bytes.len() as u64;
                self.journal.tail = false;
                self.journal.batches = 0;
                out.compacted = true;
                true
            }
            Err(e) => {
                // The old journal stays whole, and is replayed over the groups (its records
                // are older than theirs).
                out.errors.push(e);
                false
            }
        }
    }

    /// Rewrites (or removes, if it has no member left) the group of `file` with the objects
    /// stored for it now: those in `captured` with their new document, the others with their
    /// text from the previous group. Returns whether the directory changed. On failure, what
    /// is stored for the file goes back to what the previous group holds (from `undo`).
    fn write_members(
        &mut self,
        file: String,
        captured: &mut HashMap<ObjectId, Entry>,
        undo: &[(ObjectId, Option<Object>)],
        texts: &HashMap<EntryKey, (u64, Option<Put>)>,
        out: &mut Synced,
    ) -> bool {
        let ids = self.stored.members(&file);
        let path = self.dir.join(group_name(&file));
        let mut entries = Vec::with_capacity(ids.len());
        // The texts of the objects not captured now: from the journal if it has a newer
        // record of them than the previous group, else from the previous group (an object
        // held at its last good version has no document in the file any more).
        let mut previous: Option<(Option<u64>, HashMap<EntryKey, Entry>)> = None;
        let mut missing = Vec::new();
        for id in ids {
            if let Some(e) = captured.remove(&id) {
                entries.push(e);
                continue;
            }
            let prev = previous.get_or_insert_with(|| match self.read_group_counted(&path) {
                Ok(g) => (
                    Some(g.sequence),
                    g.entries
                        .into_iter()
                        .map(|e| (key_of_entry(&e), e))
                        .collect(),
                ),
                Err(_) => (None, HashMap::new()),
            });
            let key = key_of_id(&id);
            let found = match texts
                .get(&key)
                .filter(|(seq, _)| prev.0.is_none_or(|g| *seq > g))
            {
                Some((_, Some(p))) if p.file == file => Some(p.entry.clone()),
                Some(_) => None,
                None => prev.1.remove(&key),
            };
            match found {
                Some(e) => entries.push(e),
                None => missing.push(id),
            }
        }
        drop(previous);
        // Not in the previous group either (it was unusable): from the file, if it still
        // holds the stored version; otherwise the object is captured again when served.
        if !missing.is_empty() {
            let objs: Vec<&Object> = missing.iter().map(|id| &self.stored.objects[id]).collect();
            let got = capture_all(&file, objs);
            for (id, e) in missing.into_iter().zip(got) {
                match e {
                    Some(e) => entries.push(e),
                    None => {
                        self.stored.remove(&id);
                        self.retry.insert(id.clone());
                        if !out.uncaptured.contains(&id) {
                            out.uncaptured.push(id);
                        }
                    }
                }
            }
        }
        let result = if entries.is_empty() {
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    out.removed += 1;
                    Ok(None)
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(format!("removing {}: {e}", path.display())),
            }
        } else {
            self.sequence += 1;
            let group = Group {
                format: FORMAT,
                file: file.clone(),
                sequence: self.sequence,
                written_at: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
                journal: self.journal.generation,
                entries,
            };
            let bytes = serde_json::to_vec(&group).expect("serializable");
            self.write_atomic(&path, &bytes).map(|()| {
                out.written += 1;
                Some(bytes.len() as u64)
            })
        };
        match result {
            Ok(len) => {
                match len {
                    Some(len) => self.journal.group_bytes.insert(file.clone(), len),
                    None => self.journal.group_bytes.remove(&file),
                };
                self.journal.pending.remove(&file);
                true
            }
            Err(e) => {
                out.errors.push(e);
                // The previous group is still whole: what is stored for this file is
                // what it was, and the group is retried at the next sync.
                for (id, old) in undo {
                    let in_group = |o: &Object| *o.source().file == *file;
                    let now_here = self.stored.get(id).is_some_and(in_group);
                    let was_here = old.as_ref().is_some_and(in_group);
                    if now_here || was_here {
                        self.retry.insert(id.clone());
                        match old {
                            Some(o) => self.stored.insert(id.clone(), o.clone()),
                            None => self.stored.remove(id),
                        };
                    }
                }
                self.dirty.insert(file);
                false
            }
        }
    }

    /// The renames and removals themselves must survive a power loss: one directory fsync
    /// per batch.
    fn sync_dir(&self, dirty: bool, out: &mut Synced) {
        if !dirty {
            return;
        }
        if let Err(e) = std::fs::File::open(&self.dir).and_then(|d| d.sync_all()) {
            out.errors
                .push(format!("syncing {}: {e}", self.dir.display()));
        }
    }
    /// What a sync must do, from one ordered walk of `served` beside the stored entries (both
    /// by kind, namespace, name): no allocation for an unchanged object, which is nearly all of
    /// them on a reload. `None` if `served` does not list its objects in that order.
    fn plan_merged(&self, served: &ConfigSet) -> Option<Plan> {
        let mut plan = Plan::default();
        let mut stored = self.stored.objects.iter().peekable();
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

    /// What a sync must do when only `ids` may have changed: a lookup of each in both.
    fn plan_changed<'a>(
        &self,
        served: &ConfigSet,
        ids: impl IntoIterator<Item = &'a ObjectId>,
    ) -> Plan {
        let mut plan = Plan::default();
        let ids: BTreeSet<&ObjectId> = ids.into_iter().collect();
        for id in ids {
            match (served.get(id.kind, &id.key), self.stored.get(id)) {
                (Some(o), Some(s)) if same(s, &o) => {}
                (Some(o), _) => plan.changed.push((id.clone(), o)),
                (None, Some(_)) => plan.gone.push(id.clone()),
                (None, None) => {}
            }
        }
        plan
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
            .objects
            .keys()
            .filter(|id| served.get(id.kind, &id.key).is_none())
            .cloned()
            .collect();
        plan
    }

    /// [`read_group`], counted (tests: an edit's sync reads no group).
    fn read_group_counted(&mut self, path: &Path) -> Result<Group, String> {
        self.groups_read += 1;
        read_group(path)
    }

    /// Replaces `path` with `bytes` atomically (temporary file, fsync, rename).
    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> Result<(), String> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("group");
        let tmp = self.dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let result = (|| {
            std::fs::create_dir_all(&self.dir)?;
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create(true).truncate(true);
            // Documents may hold Secrets: readable by the server's user only.
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            let mut f = opts.open(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
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

    /// A store whose syncs write groups only (the tests of what groups hold).
    fn open_groups(dir: PathBuf) -> (LastGood, Restored) {
        let (mut lg, restored) = LastGood::open(dir);
        lg.journal.enabled = false;
        (lg, restored)
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
            (1, 0, 0),
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
        assert_eq!(names.len(), 1, "one group for the one file");
        assert!(names[0].starts_with("routes.yaml."), "{names:?}");
    }

    #[test]
    fn a_changed_file_is_never_stored_as_the_served_version() {
        let (_t, file, state) = setup();
        std::fs::write(&file, route("r1", "a.example")).unwrap();
        let v1 = load(&file);
        let (mut lg, _) = open_groups(state.clone());
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
        let (mut lg, _) = open_groups(state.clone());
        lg.sync(&both);
        std::fs::write(&file, route("r1", "a.example")).unwrap();
        let one = load(&file);
        let s = lg.sync(&one);
        assert_eq!((s.written, s.removed), (1, 0), "the group is rewritten");
        let restored = LastGood::open(state.clone()).1.set;
        assert_eq!(restored, one);
        assert_eq!(std::fs::read_dir(&state).unwrap().count(), 1);
    }

    /// Loads several files into one set, as the source serves them.
    fn load_all(paths: &[&Path]) -> ConfigSet {
        let mut objects = Vec::new();
        for path in paths {
            let name = path.display().to_string();
            let text = std::fs::read_to_string(path).unwrap();
            let parse = parse_file_report(&name, &text);
            assert!(parse.errors().is_empty(), "{:?}", parse.errors());
            objects.extend(parse.objects);
        }
        ConfigSet::from_objects(objects).unwrap()
    }

    fn group_path(state: &Path, file: &Path) -> PathBuf {
        state.join(group_name(&file.display().to_string()))
    }

    #[test]
    fn corrupt_and_other_version_groups_are_warnings_and_removed() {
        let (t, a, state) = setup();
        let b = t.path().join("other.yaml");
        std::fs::write(&a, route("r1", "a.example")).unwrap();
        std::fs::write(&b, route("r2", "b.example")).unwrap();
        let served = load_all(&[&a, &b]);
        let (mut lg, _) = LastGood::open(state.clone());
        assert_eq!(lg.sync(&served).written, 2);
        let p1 = group_path(&state, &a);
        let p2 = group_path(&state, &b);
        let bad_entry = serde_json::to_string(&Group {
            format: FORMAT,
            file: a.display().to_string(),
            sequence: 1,
            journal: 0,
            written_at: 0,
            entries: vec![Entry {
                kind: "HTTPRoute".into(),
                namespace: "default".into(),
                name: "r1".into(),
                line_offset: 0,
                text: "kind: HTTPRoute\nmetadata: {name: r1}\n".into(),
            }],
        })
        .unwrap();
        let cases: [(&Path, String, &str); 5] = [
            (
                &p1,
                "{\"format\": 2, \"file\": ".into(),
                "not a valid group",
            ),
            (
                &p1,
                "{\"format\": 3, \"new\": []}".into(),
                "format version 3",
            ),
            (&p1, "[]".into(), "no numeric \"format\""),
            (
                &p1,
                std::fs::read_to_string(&p2).unwrap(),
                "which belong in",
            ),
            (&p1, bad_entry, "no longer parses"),
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
            // The other group is still usable.
            assert_eq!(restored.set.len(), 1);
            assert!(
                restored
                    .set
                    .http_routes
                    .contains_key(&ObjectKey::new("default", "r2"))
            );
            // The first sync replaces the unusable group.
            let s = lg.sync(&served);
            assert_eq!(s.written, 1, "{s:?}");
            let (_, again) = LastGood::open(state.clone());
            assert!(again.warnings.is_empty(), "{:?}", again.warnings);
            assert_eq!(again.set, served);
        }
        // A per-object entry of the previous layout: no warning, removed at the first sync.
        let old = state.join(format!("HTTPRoute.default.r1.{:032x}.json", 7));
        std::fs::write(&old, "{\"format\": 1, \"kind\": \"HTTPRoute\"}").unwrap();
        let (mut lg, restored) = LastGood::open(state.clone());
        assert!(restored.warnings.is_empty(), "{:?}", restored.warnings);
        assert_eq!(restored.set, served);
        assert_eq!(lg.sync(&served), Synced::default());
        assert!(!old.exists());
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
        let (mut lg, _) = open_groups(state.clone());
        lg.sync(&v1);
        let path = state.join(group_name(&file.display().to_string()));
        let before = std::fs::read(&path).unwrap();
        // A write that fails midway (its temporary file's name is taken by a directory, as if
        // the disk refused it) leaves the previous entry whole.
        let tmp = state.join(format!(
            ".{}.{}.tmp",
            group_name(&file.display().to_string()),
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
        let (mut lg, restored) = open_groups(state.clone());
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
        // A failed write is retried by the next sync of the same store (what it holds in
        // memory went back to what is on disk).
        let tmp = state.join(format!(
            ".{}.{}.tmp",
            group_name(&file.display().to_string()),
            std::process::id()
        ));
        std::fs::create_dir(&tmp).unwrap();
        std::fs::write(&file, route("r1", "c.example")).unwrap();
        let v3 = load(&file);
        assert_eq!(lg.sync(&v3).errors.len(), 1);
        assert_eq!(LastGood::open(state.clone()).1.set, v2);
        std::fs::remove_dir(&tmp).unwrap();
        assert_eq!(lg.sync(&v3).written, 1);
        assert_eq!(LastGood::open(state).1.set, v3);
    }

    /// The names of the group files, and their bytes.
    fn snapshot(state: &Path) -> BTreeMap<String, Vec<u8>> {
        std::fs::read_dir(state)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().into_string().unwrap(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn one_edit_rewrites_exactly_its_files_group() {
        let (t, _, state) = setup();
        let files: Vec<PathBuf> = (0..3)
            .map(|i| t.path().join(format!("f{i}.yaml")))
            .collect();
        let write = |i: usize, host: &str| {
            std::fs::write(
                &files[i],
                format!(
                    "{}---\n{}",
                    route(&format!("a{i}"), host),
                    route(&format!("b{i}"), "same.example")
                ),
            )
            .unwrap();
        };
        for i in 0..3 {
            write(i, "v1.example");
        }
        let refs: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
        let (mut lg, _) = open_groups(state.clone());
        let s = lg.sync(&load_all(&refs));
        assert_eq!((s.written, s.removed), (3, 0), "{s:?}");
        let before = snapshot(&state);
        write(1, "v2.example");
        let served = load_all(&refs);
        let s = lg.sync(&served);
        assert_eq!((s.written, s.removed), (1, 0), "{s:?}");
        assert!(s.uncaptured.is_empty() && s.errors.is_empty(), "{s:?}");
        let after = snapshot(&state);
        let changed: Vec<&String> = after
            .iter()
            .filter(|(n, b)| before.get(*n) != Some(*b))
            .map(|(n, _)| n)
            .collect();
        assert_eq!(changed, vec![&group_name(&files[1].display().to_string())]);
        assert_eq!(after.len(), 3);
        assert_eq!(LastGood::open(state.clone()).1.set, served);
        // A file whose objects are all gone loses its group.
        std::fs::write(&files[2], "").unwrap();
        let served = load_all(&refs);
        let s = lg.sync(&served);
        assert_eq!((s.written, s.removed), (0, 1), "{s:?}");
        assert_eq!(snapshot(&state).len(), 2);
        assert_eq!(LastGood::open(state).1.set, served);
    }

    #[test]
    fn the_first_sync_holds_one_groups_documents_at_a_time() {
        let (t, _, state) = setup();
        let files: Vec<PathBuf> = (0..3)
            .map(|i| t.path().join(format!("f{i}.yaml")))
            .collect();
        let write = |names: [&[&str]; 3]| {
            for (path, names) in files.iter().zip(names) {
                let docs: Vec<String> = names.iter().map(|n| route(n, "h.example")).collect();
                std::fs::write(path, docs.join("---\n")).unwrap();
            }
        };
        write([&["a", "b", "c"], &["d", "e", "f"], &["g", "h", "i"]]);
        let refs: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
        let served = load_all(&refs);
        let (mut lg, _) = LastGood::open(state.clone());
        let s = lg.sync(&served);
        assert_eq!((s.written, s.uncaptured.len()), (3, 0), "{s:?}");
        // Each group is written before the next file is captured: at most one file's
        // documents are held (holding all nine was the start's peak memory).
        assert_eq!(lg.max_held, 3);
        assert_eq!(LastGood::open(state.clone()).1.set, served);
        // Objects swapped between the first and the last file: the first file's group waits
        // for the last file's captures (it loses `a` there); both come out right.
        write([&["b", "c", "i"], &["d", "e", "f"], &["a", "g", "h"]]);
        let served = load_all(&refs);
        let (mut lg, restored) = LastGood::open(state.clone());
        assert!(restored.warnings.is_empty(), "{:?}", restored.warnings);
        let s = lg.sync(&served);
        assert_eq!((s.written, s.uncaptured.len()), (2, 0), "{s:?}");
        let (_, restored) = LastGood::open(state.clone());
        assert!(restored.warnings.is_empty(), "{:?}", restored.warnings);
        assert_eq!(restored.set, served);
        assert_eq!(
            *restored
                .set
                .get(Kind::HttpRoute, &ObjectKey::new("default", "i"))
                .unwrap()
                .source()
                .file,
            *files[0].display().to_string()
        );
    }

    #[test]
    fn an_object_moved_between_files_restores_once_from_the_newest_group() {
        // The object moves from z.yaml to a.yaml: the newer group sorts first by name.
        let (t, _, state) = setup();
        let (a, z) = (t.path().join("a.yaml"), t.path().join("z.yaml"));
        std::fs::write(&a, route("keep", "keep.example")).unwrap();
        std::fs::write(
            &z,
            format!(
                "{}---\n{}",
                route("mv", "old.example"),
                route("z", "z.example")
            ),
        )
        .unwrap();
        let (mut lg, _) = open_groups(state.clone());
        lg.sync(&load_all(&[&a, &z]));
        let z_group = group_path(&state, &z);
        let stale = std::fs::read(&z_group).unwrap();
        std::fs::write(
            &a,
            format!(
                "{}---\n{}",
                route("keep", "keep.example"),
                route("mv", "new.example")
            ),
        )
        .unwrap();
        std::fs::write(&z, route("z", "z.example")).unwrap();
        let served = load_all(&[&a, &z]);
        let s = lg.sync(&served);
        assert_eq!(s.written, 2, "{s:?}");
        // As if the rewrite of z's group had been lost: both groups hold `mv`.
        std::fs::write(&z_group, &stale).unwrap();
        let (mut lg, restored) = open_groups(state.clone());
        assert!(restored.warnings.is_empty(), "{:?}", restored.warnings);
        assert_eq!(restored.set, served, "the newest group's version, once");
        assert_eq!(restored.set.http_routes.len(), 3);
        let mv = &restored.set.http_routes[&ObjectKey::new("default", "mv")];
        assert_eq!(mv.spec.hostnames[0].value, "new.example");
        assert_eq!(*mv.source.file, *a.display().to_string());
        // The first sync drops the stale copy from z's group.
        let s = lg.sync(&served);
        assert_eq!((s.written, s.removed), (1, 0), "{s:?}");
        assert_ne!(std::fs::read(&z_group).unwrap(), stale);
        assert!(
            !String::from_utf8(std::fs::read(&z_group).unwrap())
                .unwrap()
                .contains("old.example")
        );
        assert_eq!(LastGood::open(state).1.set, served);
    }

    #[test]
    fn a_held_objects_old_text_survives_a_rewrite_of_its_group() {
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
        let v1 = load(&file);
        let (mut lg, _) = open_groups(state.clone());
        lg.sync(&v1);
        // r1 turns invalid (held at its last good version), r2 is edited: the group is
        // rewritten for r2, and r1's document is no longer in the file.
        std::fs::write(
            &file,
            format!(
                "{}---\n{}",
                route("r1", "x.example").replace("rules", "rulez"),
                route("r2", "c.example")
            ),
        )
        .unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        let r2 = parse_file_report(&file.display().to_string(), &text)
            .objects
            .into_iter()
            .find(|o| o.key().name == "r2")
            .unwrap();
        let r1 = v1.objects().find(|o| o.key().name == "r1").unwrap();
        let served = ConfigSet::from_objects(vec![r1, r2]).unwrap();
        let s = lg.sync(&served);
        assert_eq!((s.written, s.uncaptured.len()), (1, 0), "{s:?}");
        let (_, restored) = LastGood::open(state.clone());
        assert!(restored.warnings.is_empty(), "{:?}", restored.warnings);
        assert_eq!(restored.set, served);
        for (a, b) in restored.set.objects().zip(served.objects()) {
            assert_eq!(a.source(), b.source(), "positions survive");
        }
    }

    /// Group files with `written_at` (wall clock) blanked, for comparing two state dirs.
    fn groups_of(state: &Path) -> BTreeMap<String, serde_json::Value> {
        if !state.exists() {
            return BTreeMap::new();
        }
        snapshot(state)
            .into_iter()
            .map(|(name, bytes)| {
                if name == JOURNAL_NAME {
                    return (name, serde_json::Value::from(bytes));
                }
                let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                v["written_at"] = 0.into();
                (name, v)
            })
            .collect()
    }

    /// One step of the model below: per route name (`r0`..`r5`), the file (0..3) holding it and
    /// its host, or absent; and optionally a file rewritten after the load (so its changed
    /// objects cannot be captured by that step's sync).
    type Step = (Vec<Option<(usize, u8)>>, Option<(usize, u8)>);

    fn write_files(files: &[PathBuf], names: &[Option<(usize, u8)>], bump: Option<(usize, u8)>) {
        for (f, path) in files.iter().enumerate() {
            let mut text = String::new();
            for (n, at) in names.iter().enumerate() {
                if let Some((file, host)) = at
                    && *file == f
                {
                    let host = match bump {
                        Some((b, by)) if b == f => host + 10 + by,
                        _ => *host,
                    };
                    if !text.is_empty() {
                        text.push_str("---\n");
                    }
                    text.push_str(&route(&format!("r{n}"), &format!("h{host}.example")));
                }
            }
            std::fs::write(path, text).unwrap();
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// A sync told only the objects that changed (here: the ids of the sets' diff) writes
        /// exactly the groups, entries and outcome of a sync that walks every object — across
        /// moves between files, removals, emptied files and captures that fail and are retried.
        #[test]
        fn a_sync_told_what_changed_equals_a_full_sync(
            steps in proptest::collection::vec(
                (
                    proptest::collection::vec(
                        proptest::option::of((0usize..3, 0u8..3)),
                        6,
                    ),
                    proptest::option::of((0usize..3, 0u8..3)),
                ),
                1..7,
            )
        ) {
            let steps: Vec<Step> = steps;
            let tmp = tempfile::tempdir().unwrap();
            let files: Vec<PathBuf> =
                (0..3).map(|i| tmp.path().join(format!("f{i}.yaml"))).collect();
            let full_dir = tmp.path().join("full").join(DIR_NAME);
            let told_dir = tmp.path().join("told").join(DIR_NAME);
            let (mut full, _) = LastGood::open(full_dir.clone());
            let (mut told, _) = LastGood::open(told_dir.clone());
            let mut prev = ConfigSet::default();
            for (names, bump) in steps {
                write_files(&files, &names, None);
                let refs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
                let served = load_all(&refs);
                if bump.is_some() {
                    write_files(&files, &names, bump);
                }
                // Exactly the objects added, removed, modified or moved (`diff` ignores moves).
                let changed: BTreeSet<ObjectId> = prev
                    .objects()
                    .chain(served.objects())
                    .map(|o| id_of(&o))
                    .filter(|id| {
                        match (prev.get(id.kind, &id.key), served.get(id.kind, &id.key)) {
                            (Some(a), Some(b)) => !same(&a, &b),
                            _ => true,
                        }
                    })
                    .collect();
                let mut a = full.sync(&served);
                let mut b = told.sync_changed(&served, Some(&changed));
                a.uncaptured.sort();
                b.uncaptured.sort();
                proptest::prop_assert_eq!(&a, &b);
                proptest::prop_assert_eq!(full.len(), told.len());
                proptest::prop_assert_eq!(groups_of(&full_dir), groups_of(&told_dir));
                prev = served;
            }
        }
    }

    /// Edits through the journal, then `routes.yaml`'s lines for r1..r3 with these hosts.
    fn three_routes(file: &Path, hosts: [&str; 3]) -> ConfigSet {
        let docs: Vec<String> = (1..=3)
            .map(|i| route(&format!("r{i}"), hosts[i - 1]))
            .collect();
        std::fs::write(file, docs.join("---\n")).unwrap();
        load(file)
    }

    #[test]
    fn an_edit_appends_to_the_journal_and_reads_no_group() {
        let (_t, file, state) = setup();
        let v1 = three_routes(&file, ["a", "b", "c"]);
        let (mut lg, _) = LastGood::open(state.clone());
        assert_eq!(lg.sync(&v1).written, 1);
        let group = std::fs::read(group_path(&state, &file)).unwrap();
        let v2 = three_routes(&file, ["a", "bb", "c"]);
        let s = lg.sync(&v2);
        assert_eq!(
            (s.written, s.journaled, s.compacted),
            (0, 1, false),
            "{s:?}"
        );
        // The group is neither rewritten nor read back: the journal holds the edit.
        assert_eq!(std::fs::read(group_path(&state, &file)).unwrap(), group);
        assert_eq!(lg.groups_read, 0);
        let v3 = three_routes(&file, ["a", "bb", "cc"]);
        assert_eq!(lg.sync(&v3).journaled, 1);
        std::fs::write(&file, route("r1", "a")).unwrap();
        let v4 = load(&file);
        assert_eq!(lg.sync(&v4).journaled, 2, "two removals");
        assert_eq!(lg.groups_read, 0);
        let (mut lg, restored) = LastGood::open(state.clone());
        assert!(restored.warnings.is_empty(), "{:?}", restored.warnings);
        assert_eq!(restored.set, v4);
        for (a, b) in restored.set.objects().zip(v4.objects()) {
            assert_eq!(a.source(), b.source(), "positions survive");
        }
        let docs = stored_documents(&state);
        assert_eq!(docs.len(), 1);
        assert_eq!(
            (docs[0].name.as_str(), docs[0].file.clone()),
            ("r1", file.display().to_string())
        );
        // The first sync after a start compacts: the group holds everything, the journal
        // starts again (next generation, empty).
        let s = lg.sync(&v4);
        assert_eq!((s.written, s.compacted), (1, true), "{s:?}");
        let (lg2, restored) = LastGood::open(state.clone());
        assert_eq!(restored.set, v4);
        assert_eq!((lg2.journal.generation, lg2.journal.batches), (1, 0));
        assert!(lg2.journal.pending.is_empty());
    }

    #[test]
    fn a_torn_last_record_is_ignored_and_cut_by_the_next_append() {
        let (_t, file, state) = setup();
        let v1 = three_routes(&file, ["a", "b", "c"]);
        let (mut lg, _) = LastGood::open(state.clone());
        lg.sync(&v1);
        let v2 = three_routes(&file, ["a", "bb", "c"]);
        lg.sync(&v2);
        let journal = state.join(JOURNAL_NAME);
        let whole = std::fs::read(&journal).unwrap();
        let v3 = three_routes(&file, ["aa", "bb", "c"]);
        assert_eq!(lg.sync(&v3).journaled, 1);
        let full = std::fs::read(&journal).unwrap();
        assert!(full.len() > whole.len() + FRAME_HEADER);
        // Every cut inside the last record (a crash mid-append), and a flipped byte in it,
        // restore the state before it: never a corrupt one.
        let mut flipped = full.clone();
        *flipped.last_mut().unwrap() ^= 1;
        let cuts = (whole.len() + 1..full.len()).map(|n| full[..n].to_vec());
        for bytes in cuts.chain([flipped]) {
            std::fs::write(&journal, &bytes).unwrap();
            let (_, restored) = LastGood::open(state.clone());
            assert_eq!(restored.set, v2, "cut at {}", bytes.len());
            assert_eq!(restored.warnings.len(), 1, "{:?}", restored.warnings);
            assert!(
                restored.warnings[0].contains("cut short"),
                "{:?}",
                restored.warnings
            );
        }
        // The next append goes where the torn record began, and is read.
        std::fs::write(&journal, &full[..full.len() - 3]).unwrap();
        let (mut lg, _) = LastGood::open(state.clone());
        // Past the first sync's compaction, straight to an append after the torn record.
        lg.adopt = false;
        let v4 = three_routes(&file, ["aa", "bb", "cc"]);
        let s = lg.sync(&v4);
        assert_eq!((s.journaled, s.written), (2, 0), "{s:?}");
        let (_, restored) = LastGood::open(state.clone());
        assert!(restored.warnings.is_empty(), "{:?}", restored.warnings);
        assert_eq!(restored.set, v4);
    }

    #[test]
    fn a_journal_older_than_the_groups_is_not_replayed() {
        let (_t, file, state) = setup();
        let v1 = three_routes(&file, ["a", "b", "c"]);
        let (mut lg, _) = LastGood::open(state.clone());
        lg.sync(&v1);
        let v2 = three_routes(&file, ["a", "bb", "c"]);
        lg.sync(&v2);
        let old = std::fs::read(state.join(JOURNAL_NAME)).unwrap();
        // Compaction (the first sync after a start): groups of generation 0, journal 1.
        let (mut lg, _) = LastGood::open(state.clone());
        assert!(lg.sync(&v2).compacted);
        let v3 = three_routes(&file, ["a", "b", "cc"]);
        lg.sync(&v3);
        let (mut lg, _) = LastGood::open(state.clone());
        assert!(lg.sync(&v3).compacted);
        // Groups of generation 1 now. The generation-0 journal back in place (a stale copy)
        // says r2 is "bb": replayed, it would undo the newer "b".
        std::fs::write(state.join(JOURNAL_NAME), &old).unwrap();
        let (mut lg, restored) = LastGood::open(state.clone());
        assert_eq!(restored.set, v3);
        assert_eq!(restored.warnings.len(), 1, "{:?}", restored.warnings);
        assert!(
            restored.warnings[0].contains("older than the groups"),
            "{:?}",
            restored.warnings
        );
        // It is removed at the first sync, and the next edit starts a journal that is read.
        lg.sync(&v3);
        assert!(!state.join(JOURNAL_NAME).exists());
        let v4 = three_routes(&file, ["x", "b", "cc"]);
        assert_eq!(lg.sync(&v4).journaled, 1);
        let (_, restored) = LastGood::open(state.clone());
        assert!(restored.warnings.is_empty(), "{:?}", restored.warnings);
        assert_eq!(restored.set, v4);
    }

    #[test]
    fn the_journal_is_compacted_past_its_bound() {
        let (_t, file, state) = setup();
        let v1 = three_routes(&file, ["a", "b", "c"]);
        let (mut lg, _) = LastGood::open(state.clone());
        lg.journal.min_bound = 2048;
        lg.sync(&v1);
        let mut compactions = 0;
        let mut last = v1;
        for i in 0..20 {
            let host = format!("h{i}");
            last = three_routes(&file, ["a", &host, "c"]);
            let s = lg.sync(&last);
            assert!(s.errors.is_empty(), "{s:?}");
            if s.compacted {
                compactions += 1;
                assert_eq!(s.written, 1, "{s:?}");
                assert_eq!(lg.journal.batches, 0);
                assert!(lg.journal.pending.is_empty());
            } else {
                assert_eq!(s.written, 0, "{s:?}");
            }
            assert!(lg.journal.len <= 2048 + 1024, "{}", lg.journal.len);
            assert_eq!(LastGood::open(state.clone()).1.set, last);
        }
        // ~600 bytes a record: a compaction every few edits, not every edit.
        assert!((2..=10).contains(&compactions), "{compactions}");
        assert_eq!(lg.journal.generation, compactions);
        let (_, restored) = LastGood::open(state.clone());
        assert!(restored.warnings.is_empty(), "{:?}", restored.warnings);
        assert_eq!(restored.set, last);
    }

    #[test]
    fn a_state_dir_without_a_journal_restores_and_is_journaled_from_then_on() {
        let (_t, file, state) = setup();
        let v1 = three_routes(&file, ["a", "b", "c"]);
        let (mut lg, _) = open_groups(state.clone());
        lg.sync(&v1);
        // What the build before the journal wrote: groups without a "journal" field.
        let path = group_path(&state, &file);
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        v.as_object_mut().unwrap().remove("journal");
        std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
        assert!(!state.join(JOURNAL_NAME).exists());
        let (mut lg, restored) = LastGood::open(state.clone());
        assert!(restored.warnings.is_empty(), "{:?}", restored.warnings);
        assert_eq!(restored.set, v1);
        assert_eq!(lg.sync(&v1), Synced::default());
        let v2 = three_routes(&file, ["a", "b", "cc"]);
        assert_eq!(lg.sync(&v2).journaled, 1);
        assert!(state.join(JOURNAL_NAME).exists());
        let (_, restored) = LastGood::open(state.clone());
        assert!(restored.warnings.is_empty(), "{:?}", restored.warnings);
        assert_eq!(restored.set, v2);
    }

    /// What a store holding exactly `served` restores, written from scratch by group writes.
    fn from_scratch(served: &ConfigSet) -> ConfigSet {
        let t = tempfile::tempdir().unwrap();
        let (mut lg, _) = open_groups(t.path().join(DIR_NAME));
        let s = lg.sync(served);
        assert!(s.uncaptured.is_empty() && s.errors.is_empty(), "{s:?}");
        LastGood::open(t.path().join(DIR_NAME)).1.set
    }

    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).into_iter().flatten().flatten() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(40))]
        /// Syncs through the journal (edits, moves between files, removals, emptied files,
        /// compactions, restarts) restore exactly what a from-scratch sync of the last completed
        /// state gives, also after a crash mid-append (the journal cut anywhere in its last
        /// record) and after a crash mid-compaction (the old journal back, beside any mix of
        /// old and new groups).
        #[test]
        fn the_journal_restores_what_a_full_sync_of_the_last_state_gives(
            steps in proptest::collection::vec(
                (
                    proptest::collection::vec(
                        proptest::option::of((0usize..3, 0u8..3)),
                        6,
                    ),
                    proptest::bool::weighted(0.2),
                    proptest::num::u16::ANY,
                ),
                1..10,
            )
        ) {
            let tmp = tempfile::tempdir().unwrap();
            let files: Vec<PathBuf> =
                (0..3).map(|i| tmp.path().join(format!("f{i}.yaml"))).collect();
            let dir = tmp.path().join("state").join(DIR_NAME);
            let crash = tmp.path().join("crash");
            let (mut lg, _) = LastGood::open(dir.clone());
            lg.journal.min_bound = 1500;
            let mut prev = from_scratch(&ConfigSet::default());
            let mut prev_names = vec![None; 6];
            for (names, restart, cut) in steps {
                // A restart serves what was served: its first sync only compacts.
                let names = if restart { prev_names.clone() } else { names };
                prev_names = names.clone();
                write_files(&files, &names, None);
                let refs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
                let served = load_all(&refs);
                let before = snapshot_or_empty(&dir);
                if restart {
                    (lg, _) = LastGood::open(dir.clone());
                    lg.journal.min_bound = 1500;
                }
                let s = lg.sync(&served);
                proptest::prop_assert!(s.errors.is_empty() && s.uncaptured.is_empty(), "{:?}", s);
                let expected = from_scratch(&served);
                proptest::prop_assert_eq!(&LastGood::open(dir.clone()).1.set, &expected);
                let after = snapshot_or_empty(&dir);
                let journal = |m: &BTreeMap<String, Vec<u8>>| m.get(JOURNAL_NAME).cloned().unwrap_or_default();
                let (old_j, new_j) = (journal(&before), journal(&after));
                if !s.compacted && new_j.len() > old_j.len() && new_j.starts_with(&old_j) {
                    // A crash mid-append: the last record cut anywhere.
                    let at = old_j.len() + usize::from(cut) % (new_j.len() - old_j.len());
                    let _ = std::fs::remove_dir_all(&crash);
                    copy_dir(&dir, &crash);
                    if at == 0 {
                        std::fs::remove_file(crash.join(JOURNAL_NAME)).unwrap();
                    } else {
                        std::fs::write(crash.join(JOURNAL_NAME), &new_j[..at]).unwrap();
                    }
                    proptest::prop_assert_eq!(&LastGood::open(crash.clone()).1.set, &prev);
                }
                if s.compacted && restart {
                    // A crash mid-compaction (nothing changed since the last sync: the old
                    // journal holds the whole state with the old groups): the old journal,
                    // and each group old or new.
                    let _ = std::fs::remove_dir_all(&crash);
                    copy_dir(&dir, &crash);
                    for (i, name) in before.keys().chain(after.keys()).enumerate() {
                        if name == JOURNAL_NAME || (usize::from(cut) >> (i % 16)) & 1 == 0 {
                            continue;
                        }
                        match before.get(name) {
                            Some(b) => std::fs::write(crash.join(name), b).unwrap(),
                            None => { let _ = std::fs::remove_file(crash.join(name)); }
                        }
                    }
                    if old_j.is_empty() {
                        let _ = std::fs::remove_file(crash.join(JOURNAL_NAME));
                    } else {
                        std::fs::write(crash.join(JOURNAL_NAME), &old_j).unwrap();
                    }
                    proptest::prop_assert_eq!(&LastGood::open(crash.clone()).1.set, &expected);
                }
                prev = expected;
            }
        }
    }

    fn snapshot_or_empty(dir: &Path) -> BTreeMap<String, Vec<u8>> {
        if dir.exists() {
            snapshot(dir)
        } else {
            BTreeMap::new()
        }
    }
}
