//! The guard's state file: the last published inventory of every gateway
//! (names only), so the blast-radius guard's baseline outlives the process
//! (issue 16). A restart into a shrunken source is then judged against what
//! was served before, exactly like a live mass removal.
//!
//! The file is small (names, not resources), versioned (`format`), and
//! written atomically (temporary file, fsync, rename, fsync of the directory):
//! a crash mid-write leaves the previous file. A missing, corrupt or newer
//! file is a warning and the server starts without a baseline.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::guard::Inventory;

mod encoder;
pub use encoder::Encoder;

/// The format this build writes and reads.
pub const FORMAT: u64 = 1;
pub const FILE_NAME: &str = "guard-state.json";

/// The minimum time between two writes: under heavy churn the file lags the
/// latest publish by at most this much, and costs at most one write a second.
pub const MIN_WRITE_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a valid state file: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error("{path} has format version {found}; this build reads version {FORMAT}")]
    Version { path: PathBuf, found: String },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Inventories by gateway (`namespace/name`), as published.
pub type Inventories = BTreeMap<String, Arc<Inventory>>;

/// What the state file records for one gateway: its published snapshot, whose inventory is
/// taken when the file is written (at most once per [`MIN_WRITE_INTERVAL`], off the pipeline,
/// instead of copying every name on every publish), or a restart baseline not replaced yet.
#[derive(Clone, Debug)]
pub enum Recorded {
    Snapshot(Arc<ballast_xds::Snapshot>),
    Inventory(Arc<Inventory>),
}

impl Recorded {
    pub fn inventory(&self) -> Arc<Inventory> {
        match self {
            Recorded::Snapshot(s) => Arc::new(Inventory::of(s)),
            Recorded::Inventory(i) => i.clone(),
        }
    }
}

/// Identity, not content: a new publish is a new record.
impl PartialEq for Recorded {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Recorded::Snapshot(a), Recorded::Snapshot(b)) => Arc::ptr_eq(a, b),
            (Recorded::Inventory(a), Recorded::Inventory(b)) => Arc::ptr_eq(a, b) || a == b,
            _ => false,
        }
    }
}

/// Records by gateway (`namespace/name`), as published.
pub type Records = BTreeMap<String, Recorded>;

/// The inventories of `records`, for the file.
pub fn inventories(records: &Records) -> Inventories {
    records
        .iter()
        .map(|(k, r)| (k.clone(), r.inventory()))
        .collect()
}

#[derive(Serialize, Deserialize)]
struct FileV1 {
    format: u64,
    /// Seconds since the Unix epoch, for operators.
    written_at: f64,
    gateways: BTreeMap<String, GatewayV1>,
}

#[derive(Serialize, Deserialize)]
struct GatewayV1 {
    listeners: Vec<String>,
    clusters: Vec<String>,
    /// (route configuration, virtual host, route id in hex: the route's name
    /// or its encoded match).
    routes: Vec<(String, String, String)>,
}

/// A loaded baseline.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    pub gateways: BTreeMap<String, Inventory>,
    pub written_at: Option<SystemTime>,
}

pub fn path_in(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// Reads the state file in `dir`; `Ok(None)` when there is none.
pub fn load(dir: &Path) -> Result<Option<Loaded>, StateError> {
    let path = path_in(dir);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(StateError::Read { path, source }),
    };
    decode(&text, &path).map(Some)
}

/// Parses a state document read from `path` (a file, or `etcd:<key>`).
pub fn decode(text: &[u8], path: &Path) -> Result<Loaded, StateError> {
    let path = path.to_path_buf();
    let corrupt = |message: String| StateError::Corrupt {
        path: path.clone(),
        message,
    };
    // The version first: a newer format may have any shape.
    let value: serde_json::Value =
        serde_json::from_slice(text).map_err(|e| corrupt(e.to_string()))?;
    match value.get("format") {
        Some(v) if v.as_u64() == Some(FORMAT) => {}
        Some(v) => {
            return Err(StateError::Version {
                path,
                found: v.to_string(),
            });
        }
        None => return Err(corrupt("no \"format\" field".into())),
    }
    let file: FileV1 = serde_json::from_value(value).map_err(|e| corrupt(e.to_string()))?;
    let mut gateways = BTreeMap::new();
    for (name, g) in file.gateways {
        let mut routes = std::collections::BTreeSet::new();
        for (rc, vh, id) in g.routes {
            let id = hex_decode(&id)
                .ok_or_else(|| corrupt(format!("gateway {name}: route id {id:?} is not hex")))?;
            routes.insert((rc, vh, id));
        }
        gateways.insert(
            name,
            Inventory {
                listeners: g.listeners.into_iter().collect(),
                clusters: g.clusters.into_iter().collect(),
                routes,
            },
        );
    }
    Ok(Loaded {
        gateways,
        written_at: (file.written_at.is_finite() && file.written_at >= 0.0)
            .then(|| SystemTime::UNIX_EPOCH + Duration::from_secs_f64(file.written_at)),
    })
}

/// Loads the baseline for the guard: problems are warnings, never fatal.
pub fn load_or_warn(dir: &Path) -> Loaded {
    match load(dir) {
        Ok(Some(l)) => {
            info!(path = %path_in(dir).display(), gateways = l.gateways.len(), "guard: loaded the last published inventories; first snapshots are judged against them");
            l
        }
        Ok(None) => {
            info!(path = %path_in(dir).display(), "guard: no state file; starting without a restart baseline");
            Loaded::default()
        }
        Err(e) => {
            warn!(error = %e, "guard: ignoring the state file; starting without a restart baseline");
            Loaded::default()
        }
    }
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The state document for `gateways` (JSON, `format` first).
pub fn encode(gateways: &Inventories) -> Vec<u8> {
    encode_at(gateways, now_secs())
}

/// [`encode`] with the given `written_at` (seconds since the epoch).
pub fn encode_at(gateways: &Inventories, written_at: f64) -> Vec<u8> {
    serde_json::to_vec(&FileOut {
        format: FORMAT,
        written_at,
        gateways,
    })
    .expect("serializable")
}

/// [`FileV1`] as written: borrowed from the inventories, route ids hex-encoded
/// as they are written, so writing the file copies no name (at W4, issue #13,
/// owned copies of every name and the whole document in memory were 3.3 MB
/// on top of the heap's peak, the first write coming right after the first
/// publish).
#[derive(Serialize)]
struct FileOut<'a> {
    format: u64,
    written_at: f64,
    #[serde(serialize_with = "gateways_out")]
    gateways: &'a Inventories,
}

fn gateways_out<S: serde::Serializer>(g: &&Inventories, s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(g.iter().map(|(name, inv)| (name, GatewayOut(inv))))
}

/// One [`GatewayV1`], borrowed.
struct GatewayOut<'a>(&'a Inventory);

impl Serialize for GatewayOut<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut g = s.serialize_struct("GatewayV1", 3)?;
        g.serialize_field("listeners", &self.0.listeners)?;
        g.serialize_field("clusters", &self.0.clusters)?;
        g.serialize_field("routes", &RoutesOut(&self.0.routes))?;
        g.end()
    }
}

struct RoutesOut<'a>(&'a std::collections::BTreeSet<(String, String, Vec<u8>)>);

impl Serialize for RoutesOut<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|(rc, vh, id)| (rc, vh, Hex(id))))
    }
}

/// Bytes as lowercase hex, written without an intermediate `String`.
struct Hex<'a>(&'a [u8]);

impl std::fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl Serialize for Hex<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Writes `gateways` to the state file in `dir`, atomically.
#[cfg(test)]
pub fn write(dir: &Path, gateways: &Inventories) -> Result<(), StateError> {
    write_with(dir, |f| std::io::Write::write_all(f, &encode(gateways)))
}

/// Writes the state document `write` produces to the state file in `dir`, atomically,
/// through a buffer (the document is never whole in memory).
pub fn write_with(
    dir: &Path,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> Result<(), StateError> {
    let path = path_in(dir);
    let err = |source| StateError::Write {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    let tmp = dir.join(format!(".{FILE_NAME}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = std::io::BufWriter::with_capacity(64 * 1024, std::fs::File::create(&tmp)?);
        write(&mut f)?;
        let f = f.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        // The rename itself must survive a power loss.
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(err)
}

/// Writes the latest inventories whenever they change, at most once per
/// [`MIN_WRITE_INTERVAL`], off the async threads.
pub async fn writer(dir: PathBuf, mut rx: watch::Receiver<Arc<Records>>) {
    let mut failing = false;
    // Moved to the blocking thread for each write and back; lost only if a write panics.
    let mut encoder = Some(Encoder::default());
    while rx.changed().await.is_ok() {
        let latest = rx.borrow_and_update().clone();
        let d = dir.clone();
        let mut enc = encoder.take().unwrap_or_default();
        let done = tokio::task::spawn_blocking(move || {
            let r = write_with(&d, |f| enc.encode_to(&latest, now_secs(), f));
            (enc, r)
        })
        .await
        .map(|(enc, r)| {
            encoder = Some(enc);
            r
        });
        match done {
            Ok(Ok(())) => {
                if failing {
                    info!(path = %path_in(&dir).display(), "guard: state file written again");
                }
                failing = false;
            }
            Ok(Err(e)) => {
                if !failing {
                    warn!(error = %e, "guard: cannot write the state file; a restart will start without a baseline");
                }
                failing = true;
            }
            Err(e) => warn!(error = %e, "guard: state writer task failed"),
        }
        tokio::time::sleep(MIN_WRITE_INTERVAL).await;
    }
}

/// `etcd:<key>`, the name of the state in etcd for messages and status.
pub fn etcd_path(key: &str) -> PathBuf {
    PathBuf::from(format!("etcd:{key}"))
}

/// Loads the baseline from etcd (`--etcd`): like [`load_or_warn`], but the store may be down
/// at start, so it retries until etcd answers (nothing is served before the etcd source has
/// synced anyway, which needs the same store) or `stop` is cancelled.
pub async fn load_etcd(
    client: &ballast_etcd::Client,
    key: &str,
    stop: &tokio_util::sync::CancellationToken,
) -> Loaded {
    let path = etcd_path(key);
    let mut delay = Duration::from_millis(100);
    let mut warned = false;
    loop {
        match client.get(key).await {
            Ok(None) => {
                info!(path = %path.display(), "guard: no state in etcd; starting without a restart baseline");
                return Loaded::default();
            }
            Ok(Some(kv)) => {
                return match decode(&kv.value, &path) {
                    Ok(l) => {
                        info!(path = %path.display(), gateways = l.gateways.len(), "guard: loaded the last published inventories from etcd; first snapshots are judged against them");
                        l
                    }
                    Err(e) => {
                        warn!(error = %e, "guard: ignoring the state in etcd; starting without a restart baseline");
                        Loaded::default()
                    }
                };
            }
            Err(e) => {
                if !warned {
                    warn!(error = %e, path = %path.display(), "guard: cannot read the state from etcd yet; retrying");
                    warned = true;
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return Loaded::default(),
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

/// Writes the latest inventories to etcd whenever they change, at most once per
/// [`MIN_WRITE_INTERVAL`]; a failed write is retried until it succeeds or newer inventories
/// replace it. Replicas sharing the store write the same inventories (same config, same
/// translation), so the one key holds the fleet's baseline.
pub async fn writer_etcd(
    client: ballast_etcd::Client,
    key: String,
    mut rx: watch::Receiver<Arc<Records>>,
) {
    let path = etcd_path(&key);
    let mut failing = false;
    let mut encoder = Some(Encoder::default());
    // The initial value is a placeholder, not a publish: never overwrite the stored baseline
    // with it.
    let mut written: Option<Arc<Records>> = Some(rx.borrow_and_update().clone());
    loop {
        let pending = written.as_ref() != Some(&*rx.borrow());
        if !pending && rx.changed().await.is_err() {
            return;
        }
        let latest = rx.borrow_and_update().clone();
        if written.as_ref() == Some(&latest) {
            continue;
        }
        let bytes = {
            let l = latest.clone();
            let mut enc = encoder.take().unwrap_or_default();
            match tokio::task::spawn_blocking(move || {
                let b = enc.encode(&l, now_secs());
                (enc, b)
            })
            .await
            {
                Ok((enc, b)) => {
                    encoder = Some(enc);
                    b
                }
                // The task panicked: nothing to lose by trying here.
                Err(_) => encode(&inventories(&latest)),
            }
        };
        match client.put(key.as_str(), bytes).await {
            Ok(_) => {
                if failing {
                    info!(path = %path.display(), "guard: state written to etcd again");
                }
                failing = false;
                written = Some(latest);
            }
            Err(e) => {
                if !failing {
                    warn!(error = %e, path = %path.display(), "guard: cannot write the state to etcd; retrying");
                }
                failing = true;
            }
        }
        tokio::time::sleep(MIN_WRITE_INTERVAL).await;
    }
}

/// The default `--state-dir`: systemd's `$STATE_DIRECTORY`, else
/// `$XDG_STATE_HOME/ballast`, else `~/.local/state/ballast`, else `./.ballast-state`.
pub fn default_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("STATE_DIRECTORY").filter(|d| !d.is_empty()) {
        // systemd may list several, separated by ':'.
        let first = d
            .to_string_lossy()
            .split(':')
            .next()
            .unwrap_or("")
            .to_string();
        if !first.is_empty() {
            return PathBuf::from(first);
        }
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("ballast");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(h).join(".local/state/ballast");
    }
    PathBuf::from(".ballast-state")
}

#[cfg(test)]
fn hex_encode(b: &[u8]) -> String {
    Hex(b).to_string()
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inv(n: usize) -> Arc<Inventory> {
        Arc::new(Inventory {
            listeners: ["l0".to_string()].into(),
            clusters: (0..n).map(|i| format!("c{i}")).collect(),
            routes: (0..n)
                .map(|i| ("rc".to_string(), format!("vh{i}"), vec![0, 0xff, i as u8]))
                .collect(),
        })
    }

    fn sample() -> Inventories {
        [
            ("default/edge".to_string(), inv(100)),
            ("a/b".into(), inv(0)),
        ]
        .into()
    }

    /// The document written from borrowed inventories is the one the owned
    /// [`FileV1`] (what `decode` reads) serializes to, byte for byte.
    #[test]
    fn streamed_encoding_equals_the_owned_document() {
        let g = sample();
        // A fixed time: a float read back from JSON need not print the same.
        let written_at = 1_796_133_453.25;
        let streamed = encode_at(&g, written_at);
        let doc: serde_json::Value = serde_json::from_slice(&encode(&g)).unwrap();
        let owned = FileV1 {
            format: FORMAT,
            written_at,
            gateways: g
                .iter()
                .map(|(name, inv)| {
                    let hex = |id: &Vec<u8>| id.iter().map(|b| format!("{b:02x}")).collect();
                    let g = GatewayV1 {
                        listeners: inv.listeners.iter().cloned().collect(),
                        clusters: inv.clusters.iter().cloned().collect(),
                        routes: inv
                            .routes
                            .iter()
                            .map(|(rc, vh, id)| (rc.clone(), vh.clone(), hex(id)))
                            .collect(),
                    };
                    (name.clone(), g)
                })
                .collect(),
        };
        assert_eq!(streamed, serde_json::to_vec(&owned).unwrap());
        let first = &doc["gateways"]["default/edge"]["routes"][0];
        assert_eq!(*first, serde_json::json!(["rc", "vh0", "00ff00"]));
    }

    #[test]
    fn round_trips_and_is_small() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).unwrap().is_none(), "no file yet");
        write(dir.path(), &sample()).unwrap();
        let loaded = load(dir.path()).unwrap().unwrap();
        assert_eq!(loaded.gateways.len(), 2);
        assert_eq!(loaded.gateways["default/edge"], *inv(100));
        assert_eq!(loaded.gateways["a/b"], *inv(0));
        assert!(loaded.written_at.is_some());
        let size = std::fs::metadata(path_in(dir.path())).unwrap().len();
        assert!(size < 10_000, "names only: {size} bytes");
    }

    #[test]
    fn corrupt_files_are_errors_that_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        for text in [
            "",
            "{\"format\": 1, \"gateways\": {",
            "[1, 2]",
            "{\"gateways\": {}}",
            "{\"format\": 1, \"written_at\": 0, \"gateways\": {\"g\": {\"listeners\": 3}}}",
            "{\"format\": 1, \"written_at\": 0, \"gateways\": {\"g\": {\"listeners\": [], \"clusters\": [], \"routes\": [[\"rc\", \"vh\", \"zz\"]]}}}",
        ] {
            std::fs::write(path_in(dir.path()), text).unwrap();
            let e = load(dir.path()).unwrap_err();
            assert!(matches!(e, StateError::Corrupt { .. }), "{text}: {e}");
            assert!(e.to_string().contains(FILE_NAME), "{e}");
            // Never fatal: the server starts without a baseline.
            assert!(load_or_warn(dir.path()).gateways.is_empty());
        }
    }

    #[test]
    fn other_format_versions_are_not_read() {
        let dir = tempfile::tempdir().unwrap();
        for v in ["2", "0", "\"1\""] {
            // A newer version may have any shape: not even parsed.
            std::fs::write(
                path_in(dir.path()),
                format!("{{\"format\": {v}, \"gateways\": [\"new shape\"]}}"),
            )
            .unwrap();
            let e = load(dir.path()).unwrap_err();
            assert!(
                matches!(&e, StateError::Version { found, .. } if found == v),
                "{e}"
            );
            assert!(e.to_string().contains("this build reads version 1"), "{e}");
            assert!(load_or_warn(dir.path()).gateways.is_empty());
        }
    }

    #[test]
    fn writes_are_atomic() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &sample()).unwrap();
        let before = std::fs::read(path_in(dir.path())).unwrap();
        // A write that fails midway (the temporary file's name is taken by a
        // directory, as if the disk refused it) leaves the previous file whole.
        let tmp = dir
            .path()
            .join(format!(".{FILE_NAME}.{}.tmp", std::process::id()));
        std::fs::create_dir(&tmp).unwrap();
        assert!(write(dir.path(), &Inventories::new()).is_err());
        assert_eq!(std::fs::read(path_in(dir.path())).unwrap(), before);
        std::fs::remove_dir(&tmp).unwrap();
        // A successful write replaces it and leaves no temporary file behind.
        write(dir.path(), &Inventories::new()).unwrap();
        assert!(load(dir.path()).unwrap().unwrap().gateways.is_empty());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(FILE_NAME)]);
    }

    #[test]
    fn creates_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a/b");
        write(&nested, &sample()).unwrap();
        assert!(load(&nested).unwrap().is_some());
    }
}
