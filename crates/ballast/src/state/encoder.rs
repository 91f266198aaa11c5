//! The state file, kept encoded between writes: a write re-derives only what changed since the
//! last one. Taking a fresh [`Inventory`] of every published snapshot and encoding it whole
//! was a third of the CPU of a route edit at 50,000 routes (decoding every virtual host's
//! route ids, hex-encoding and JSON-escaping 100,000 names), once a second for as long as
//! edits kept coming, and the idle cost between edits.
//!
//! Per gateway, the listener and cluster name lists are re-encoded only when the snapshot's
//! map of that type is another one (unchanged types share the previous map); a route
//! configuration's route ids are re-decoded only for the virtual hosts whose bytes differ
//! from the last encoding (common prefix and suffix, aligned on field boundaries). A write
//! then streams the kept route ids to the file.
//!
//! Memory (W4, issue #13): the book keeps one `(host, route id)` key per route, the host
//! shared by its routes, and only the byte range of each top-level field: a removed virtual
//! host is decoded again from the previous bytes to learn which ids it held. The entries are
//! formatted as they are written, into a buffered writer (no JSON string per route, no whole
//! document in memory).
//!
//! The output is byte for byte [`super::encode_at`] of the records' inventories (proved by
//! `tests::encoder_equals_full_encoding`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::sync::Arc;

use ballast_xds::{Resource, ResourceMap, ResourceType, Snapshot};
use prost::Message;

use super::{GatewayOut, Recorded, Records};
use crate::guard::{
    HostIds, ListenerIds, RouteId, RouteIds, TCP_PROXY, common_prefix, common_suffix, next_field,
};

/// The cached encoding of the state file (see the module docs).
#[derive(Default)]
pub struct Encoder {
    gateways: BTreeMap<String, GatewayBook>,
}

/// One gateway's cached encoding.
#[derive(Default)]
struct GatewayBook {
    listeners: Names,
    clusters: Names,
    /// Route configurations by name.
    rcs: BTreeMap<Arc<str>, RcBook>,
    /// The `tcp_proxy` chains of listeners, by group name (`listener:{name}`), as entries
    /// with an empty route id.
    tcp: BTreeMap<String, Entries>,
    /// The listener map `tcp` was taken from.
    tcp_from: Option<Arc<ResourceMap>>,
}

/// A name list, encoded as a JSON array, and the map it was taken from.
#[derive(Default)]
struct Names {
    from: Option<Arc<ResourceMap>>,
    json: String,
}

impl Names {
    fn update(&mut self, map: &Arc<ResourceMap>) {
        if self.from.as_ref().is_some_and(|m| Arc::ptr_eq(m, map)) {
            return;
        }
        let mut out = Vec::with_capacity(2 + map.len() * 16);
        out.push(b'[');
        for (i, k) in map.keys().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_json_str(&mut out, k).expect("writing to a Vec");
        }
        out.push(b']');
        self.json = String::from_utf8(out).expect("JSON is UTF-8");
        self.from = Some(map.clone());
    }
}

/// Route ids of one group: (virtual host, id) → how many virtual hosts hold it. Counted, so
/// that a host named twice stays a set. The host name is shared by its routes' keys.
type Entries = BTreeMap<(Arc<str>, Box<[u8]>), usize>;

/// A route configuration as last decoded.
struct RcBook {
    resource: Arc<Resource>,
    /// Its top-level fields in byte order. `None`: the bytes do not parse field by field
    /// (decoded whole, see [`RcBook::whole`]).
    fields: Option<Vec<Field>>,
    /// Fields whose virtual host does not decode: then, as for [`Inventory::of`], the whole
    /// configuration counts for nothing.
    ///
    /// [`Inventory::of`]: crate::guard::Inventory::of
    broken: usize,
    entries: Entries,
}

/// A top-level field of a route configuration: its bytes and what it holds.
#[derive(Clone, Copy)]
struct Field {
    start: usize,
    end: usize,
    kind: Kind,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// Anything but a virtual host.
    Other,
    /// A virtual host that decodes: its route ids are in the entries.
    Host,
    /// A virtual host that does not decode.
    Broken,
}

impl RcBook {
    fn new(resource: Arc<Resource>) -> RcBook {
        let mut book = RcBook {
            resource: resource.clone(),
            fields: None,
            broken: 0,
            entries: Entries::new(),
        };
        let bytes = resource.value_bytes();
        let entries = &mut book.entries;
        match parse_fields(&bytes, 0, |_| false, &mut |h| add_host(entries, h)) {
            Some((fields, _)) => {
                book.broken = fields.iter().filter(|f| f.kind == Kind::Broken).count();
                book.fields = Some(fields);
            }
            None => book.whole(&bytes),
        }
        book
    }

    /// Bytes that do not parse field by field: whatever decodes as a whole.
    fn whole(&mut self, bytes: &[u8]) {
        self.fields = None;
        self.broken = 0;
        self.entries.clear();
        match RouteIds::decode(bytes) {
            Ok(rc) => {
                for vh in rc.virtual_hosts {
                    add_host(&mut self.entries, vh);
                }
            }
            Err(_) => self.broken = 1,
        }
    }

    /// Moves to `next`, re-decoding only the fields whose bytes changed.
    fn update(&mut self, next: &Arc<Resource>) {
        if Arc::ptr_eq(&self.resource, next) {
            return;
        }
        let old = self.resource.value_bytes();
        let new = next.value_bytes();
        self.resource = next.clone();
        let Some(mut fields) = self.fields.take() else {
            *self = RcBook::new(next.clone());
            return;
        };
        let prefix = common_prefix(&old, &new);
        let suffix = common_suffix(&old[prefix..], &new[prefix..]);
        // Fields ending within the common prefix are the same in both.
        let first = fields.partition_point(|f| f.end <= prefix);
        let start = fields.get(first).map_or(old.len(), |f| f.start);
        let (old_tail, new_tail) = (old.len() - suffix, new.len() - suffix);
        // Parse `new` from there until a boundary within the common suffix that is a field
        // start of `old` too: from there on both parse the same bytes.
        let resync = |at: usize| {
            at >= new_tail && {
                let o = at - new_tail + old_tail;
                fields[first..]
                    .binary_search_by_key(&o, |f| f.start)
                    .is_ok()
            }
        };
        // Added after the removed ones are gone (a host decoded again gets new keys).
        let mut added = Vec::new();
        let Some((parsed, stop)) = parse_fields(&new, start, resync, &mut |h| added.push(h)) else {
            *self = RcBook::new(next.clone());
            return;
        };
        let o_stop = if stop == new.len() {
            old.len()
        } else {
            stop - new_tail + old_tail
        };
        let last = first + fields[first..].partition_point(|f| f.start < o_stop);
        for f in fields.drain(first..last) {
            match f.kind {
                Kind::Other => {}
                Kind::Broken => self.broken -= 1,
                Kind::Host => {
                    // Decoded when added, from the same bytes.
                    let Some((_, _, Some(payload))) = next_field(&old, f.start) else {
                        unreachable!("a host field parsed before")
                    };
                    let h = HostIds::decode(payload).expect("a host that decoded before");
                    remove_host(&mut self.entries, h);
                }
            }
        }
        self.broken += parsed.iter().filter(|f| f.kind == Kind::Broken).count();
        for h in added {
            add_host(&mut self.entries, h);
        }
        // The fields after the change moved by the difference in length.
        if new.len() != old.len() {
            for f in &mut fields[first..] {
                f.start = f.start + new.len() - old.len();
                f.end = f.end + new.len() - old.len();
            }
        }
        fields.splice(first..first, parsed);
        self.fields = Some(fields);
    }
}

fn add_host(entries: &mut Entries, h: HostIds) {
    let host: Arc<str> = Arc::from(h.name);
    for r in h.routes {
        *entries.entry((host.clone(), route_id(r))).or_insert(0) += 1;
    }
}

fn remove_host(entries: &mut Entries, h: HostIds) {
    let host: Arc<str> = Arc::from(h.name);
    for r in h.routes {
        let key = (host.clone(), route_id(r));
        if let Some(n) = entries.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                entries.remove(&key);
            }
        }
    }
}

/// The top-level fields of `buf` from `at` until `stop(offset)` holds at a field start or the
/// end: the fields and where parsing stopped; each virtual host that decodes goes to
/// `host`. `None` if the bytes are not fields.
fn parse_fields(
    buf: &[u8],
    mut at: usize,
    stop: impl Fn(usize) -> bool,
    host: &mut dyn FnMut(HostIds),
) -> Option<(Vec<Field>, usize)> {
    let mut out = Vec::new();
    while at < buf.len() && !stop(at) {
        let (number, end, payload) = next_field(buf, at)?;
        let kind = if number == 2 {
            match payload.map(HostIds::decode) {
                Some(Ok(h)) => {
                    host(h);
                    Kind::Host
                }
                _ => Kind::Broken,
            }
        } else {
            Kind::Other
        };
        out.push(Field {
            start: at,
            end,
            kind,
        });
        at = end;
    }
    Some((out, at))
}

/// The `tcp_proxy` chains of every listener in `map`, by group name.
fn tcp_entries(map: &ResourceMap) -> BTreeMap<String, Entries> {
    let mut out = BTreeMap::new();
    for (name, res) in map.iter() {
        let Ok(l) = ListenerIds::decode(res.value_bytes()) else {
            continue;
        };
        let group = format!("listener:{name}");
        let entries: &mut Entries = out.entry(group).or_default();
        for chain in l.filter_chains {
            if chain.filters.iter().any(|f| f.name == TCP_PROXY) {
                entries.insert((Arc::from(chain.name), Box::default()), 1);
            }
        }
    }
    out.retain(|_, e| !e.is_empty());
    out
}

impl GatewayBook {
    fn update(&mut self, s: &Snapshot) {
        self.listeners.update(s.resources(ResourceType::Listener));
        self.clusters.update(s.resources(ResourceType::Cluster));
        let listeners = s.resources(ResourceType::Listener);
        if !self
            .tcp_from
            .as_ref()
            .is_some_and(|m| Arc::ptr_eq(m, listeners))
        {
            self.tcp = tcp_entries(listeners);
            self.tcp_from = Some(listeners.clone());
        }
        let rcs = s.resources(ResourceType::RouteConfiguration);
        self.rcs.retain(|name, _| rcs.contains_key(name));
        for (name, res) in rcs.iter() {
            match self.rcs.get_mut(name) {
                Some(b) => b.update(res),
                None => {
                    self.rcs.insert(name.clone(), RcBook::new(res.clone()));
                }
            }
        }
    }

    /// `{"listeners":[..],"clusters":[..],"routes":[..]}` into `out`.
    fn write(&self, out: &mut impl Write) -> io::Result<()> {
        out.write_all(b"{\"listeners\":")?;
        out.write_all(self.listeners.json.as_bytes())?;
        out.write_all(b",\"clusters\":")?;
        out.write_all(self.clusters.json.as_bytes())?;
        out.write_all(b",\"routes\":[")?;
        // Groups in name order (route configurations and `listener:` groups interleave);
        // within a group, entries in (host, id) order — the order of `Inventory::routes`.
        let mut groups: BTreeMap<&str, Vec<&Entries>> = BTreeMap::new();
        for (name, b) in &self.rcs {
            if b.broken == 0 {
                groups.entry(name).or_default().push(&b.entries);
            }
        }
        for (name, e) in &self.tcp {
            groups.entry(name).or_default().push(e);
        }
        let mut first = true;
        for (name, parts) in &groups {
            let mut group = Vec::new();
            write_json_str(&mut group, name)?;
            let mut push = |(host, id): &(Arc<str>, Box<[u8]>)| -> io::Result<()> {
                out.write_all(if first { b"[" } else { b",[" })?;
                first = false;
                out.write_all(&group)?;
                out.write_all(b",")?;
                write_json_str(out, host)?;
                out.write_all(b",\"")?;
                write_hex(out, id)?;
                out.write_all(b"\"]")
            };
            if let [one] = parts.as_slice() {
                one.keys().try_for_each(&mut push)?;
            } else {
                // A route configuration named like a listener group: merge (rare).
                let merged: BTreeSet<&(Arc<str>, Box<[u8]>)> =
                    parts.iter().flat_map(|e| e.keys()).collect();
                merged.into_iter().try_for_each(&mut push)?;
            }
        }
        out.write_all(b"]}")
    }
}

impl Encoder {
    /// The state document for `records`, written at `written_at` (seconds since the epoch).
    pub fn encode(&mut self, records: &Records, written_at: f64) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_to(records, written_at, &mut out)
            .expect("writing to a Vec");
        out
    }

    /// [`Encoder::encode`] into `out`, as it is formatted (give it a buffered writer).
    pub fn encode_to(
        &mut self,
        records: &Records,
        written_at: f64,
        out: &mut impl Write,
    ) -> io::Result<()> {
        self.gateways
            .retain(|name, _| matches!(records.get(name), Some(Recorded::Snapshot(_))));
        write!(out, "{{\"format\":{},\"written_at\":", super::FORMAT)?;
        serde_json::to_writer(&mut *out, &written_at)?;
        out.write_all(b",\"gateways\":{")?;
        for (i, (name, record)) in records.iter().enumerate() {
            if i > 0 {
                out.write_all(b",")?;
            }
            write_json_str(out, name)?;
            out.write_all(b":")?;
            match record {
                Recorded::Snapshot(s) => {
                    let book = self.gateways.entry(name.clone()).or_default();
                    book.update(s);
                    book.write(out)?;
                }
                // A restart baseline not replaced yet: encoded whole (once per gateway and
                // restart).
                Recorded::Inventory(inv) => serde_json::to_writer(&mut *out, &GatewayOut(inv))?,
            }
        }
        out.write_all(b"}}")
    }
}

/// `s` as a JSON string, as `serde_json` writes it.
fn write_json_str(out: &mut impl Write, s: &str) -> io::Result<()> {
    // serde_json escapes only `"`, `\` and control characters below U+0020.
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.write_all(b"\"")?;
        out.write_all(s.as_bytes())?;
        out.write_all(b"\"")
    } else {
        serde_json::to_writer(out, s).map_err(io::Error::from)
    }
}

/// `b` as lowercase hex.
fn write_hex(out: &mut impl Write, b: &[u8]) -> io::Result<()> {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut buf = [0u8; 128];
    for chunk in b.chunks(buf.len() / 2) {
        for (i, x) in chunk.iter().enumerate() {
            buf[2 * i] = DIGITS[usize::from(x >> 4)];
            buf[2 * i + 1] = DIGITS[usize::from(x & 15)];
        }
        out.write_all(&buf[..2 * chunk.len()])?;
    }
    Ok(())
}

/// A named route keeps its identity when its match is edited; unnamed routes are identified
/// by their encoded match (as [`Inventory::of`] does).
///
/// [`Inventory::of`]: crate::guard::Inventory::of
fn route_id(r: RouteId) -> Box<[u8]> {
    if r.name.is_empty() {
        r.r#match.into_boxed_slice()
    } else {
        r.name.into_bytes().into_boxed_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{encode_at, inventories};
    use super::*;
    use crate::guard::Inventory;
    use ballast_xds::envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use ballast_xds::envoy_types::pb::envoy::config::listener::v3::{
        Filter, FilterChain, Listener,
    };
    use ballast_xds::envoy_types::pb::envoy::config::route::v3::RouteConfiguration;

    /// A gateway as the state file sees it.
    #[derive(Clone, Debug, Default)]
    struct Model {
        clusters: BTreeMap<u8, ()>,
        /// Listener → (chain name, whether it is a `tcp_proxy` chain).
        listeners: BTreeMap<u8, Vec<(u8, bool)>>,
        /// Route configuration → its virtual hosts in order: (host name, routes as (name or
        /// none, prefix)). Names may repeat (a set counts them once).
        rcs: BTreeMap<u8, Vec<(u8, Routes)>>,
    }

    /// A virtual host's routes: (name or none, prefix).
    type Routes = Vec<(Option<u8>, u8)>;

    /// xorshift: deterministic, so a failure reproduces.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u8 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n) as u8
        }

        fn routes(&mut self) -> Routes {
            (0..self.below(4))
                .map(|_| ((self.below(2) == 0).then(|| self.below(4)), self.below(6)))
                .collect()
        }
    }

    impl Model {
        fn edit(&mut self, rng: &mut Rng) {
            match rng.below(9) {
                0 => {
                    let c = rng.below(12);
                    if self.clusters.remove(&c).is_none() {
                        self.clusters.insert(c, ());
                    }
                }
                1 => {
                    let chains = (0..rng.below(3))
                        .map(|_| (rng.below(4), rng.below(2) == 0))
                        .collect();
                    self.listeners.insert(rng.below(3), chains);
                }
                2 => {
                    self.listeners.remove(&rng.below(3));
                }
                3..=5 => {
                    // One virtual host edited, added or inserted (the common case).
                    let rc = self.rcs.entry(rng.below(3)).or_default();
                    let host = (rng.below(10), rng.routes());
                    let at = rng.below(rc.len() as u64 + 1) as usize;
                    if at < rc.len() && rng.below(2) == 0 {
                        rc[at] = host;
                    } else {
                        rc.insert(at, host);
                    }
                }
                6 => {
                    if let Some(rc) = self.rcs.get_mut(&rng.below(3))
                        && !rc.is_empty()
                    {
                        let at = rng.below(rc.len() as u64) as usize;
                        rc.remove(at);
                    }
                }
                7 => {
                    if let Some(rc) = self.rcs.get_mut(&rng.below(3)) {
                        rc.reverse();
                    }
                }
                _ => {
                    let rc = rng.below(3);
                    if self.rcs.remove(&rc).is_none() {
                        self.rcs.insert(rc, Vec::new());
                    }
                }
            }
        }

        fn snapshot(&self, prev: Option<&Arc<Snapshot>>) -> Arc<Snapshot> {
            let mut b = Snapshot::builder();
            if let Some(p) = prev {
                b = b.reuse_from(p.clone());
            }
            for c in self.clusters.keys() {
                b.message(&Cluster {
                    name: format!("c{c}"),
                    ..Default::default()
                })
                .unwrap();
            }
            for (l, chains) in &self.listeners {
                b.message(&Listener {
                    name: format!("l{l}"),
                    filter_chains: chains
                        .iter()
                        .map(|(n, tcp)| FilterChain {
                            name: format!("ch{n}"),
                            filters: vec![Filter {
                                name: if *tcp { TCP_PROXY } else { "other" }.into(),
                                ..Default::default()
                            }],
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .unwrap();
            }
            for (rc, hosts) in &self.rcs {
                b.message(&RouteConfiguration {
                    // rc2 is named like listener l0's group: the two merge in the file.
                    name: if *rc == 2 {
                        "listener:l0".into()
                    } else {
                        format!("rc{rc}")
                    },
                    virtual_hosts: hosts
                        .iter()
                        .map(|(h, routes)| crate::guard::test_virtual_host(*h, routes))
                        .collect(),
                    ..Default::default()
                })
                .unwrap();
            }
            Arc::new(b.build_unchecked().unwrap())
        }
    }

    /// The cached encoding equals encoding fresh inventories, byte for byte, over 300 random
    /// sequences of publishes: virtual hosts edited, inserted, removed and reordered, route
    /// configurations, listeners and clusters coming and going, gateways switching between
    /// a snapshot and a restart baseline and disappearing.
    #[test]
    fn encoder_equals_full_encoding() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for case in 0..300 {
            let mut models = [Model::default(), Model::default()];
            let mut last: [Option<Arc<Snapshot>>; 2] = [None, None];
            let mut enc = Encoder::default();
            for step in 0..=rng.below(16) {
                let mut records = Records::new();
                for (g, model) in models.iter_mut().enumerate() {
                    for _ in 0..=rng.below(3) {
                        model.edit(&mut rng);
                    }
                    let name = format!("default/g{g}");
                    match rng.below(8) {
                        0 => {}
                        1 => {
                            let s = model.snapshot(None);
                            records.insert(name, Recorded::Inventory(Arc::new(Inventory::of(&s))));
                        }
                        _ => {
                            let s = model.snapshot(last[g].as_ref());
                            last[g] = Some(s.clone());
                            records.insert(name, Recorded::Snapshot(s));
                        }
                    }
                }
                // Streamed through a small buffer (many partial writes), as to the file.
                let mut got = Vec::new();
                let mut w = std::io::BufWriter::with_capacity(7, &mut got);
                enc.encode_to(&records, 1234.5, &mut w).unwrap();
                drop(w);
                let want = encode_at(&inventories(&records), 1234.5);
                assert_eq!(
                    String::from_utf8(got).unwrap(),
                    String::from_utf8(want).unwrap(),
                    "case {case} step {step}: {models:?}"
                );
            }
        }
    }

    /// A large route configuration with one virtual host edited decodes one host (not all).
    #[test]
    fn an_edit_decodes_only_the_changed_host() {
        let mut model = Model::default();
        model
            .rcs
            .insert(0, (0..200u8).map(|h| (h, vec![(None, h % 6)])).collect());
        let first = model.snapshot(None);
        let rc = |s: &Snapshot| {
            s.resources(ResourceType::RouteConfiguration)
                .get("rc0")
                .unwrap()
                .clone()
        };
        let mut book = RcBook::new(rc(&first));
        // A host decoded again gets new keys (its old ones are removed first); a kept one
        // keeps its host name buffer, moved or not.
        let names = |b: &RcBook| -> BTreeMap<Arc<str>, *const u8> {
            b.entries
                .keys()
                .map(|(h, _)| (h.clone(), h.as_ptr()))
                .collect()
        };
        let before = names(&book);
        assert_eq!(before.len(), 200);
        model.rcs.get_mut(&0).unwrap()[100].1 = vec![(Some(1), 2)];
        let next = model.snapshot(Some(&first));
        book.update(&rc(&next));
        let after = names(&book);
        assert_eq!(after.len(), 200);
        let kept = after
            .iter()
            .filter(|(h, p)| before.get(*h) == Some(p))
            .count();
        assert_eq!(kept, 199, "only the edited host is decoded again");
        assert_eq!(book.entries, RcBook::new(rc(&next)).entries);
    }

    proptest::proptest! {
        /// The streamed JSON strings and hex are `serde_json`'s, for any text (quotes,
        /// backslashes, control characters, non-ASCII) and any bytes.
        #[test]
        fn json_pieces_equal_serde_json(s in ".*", raw in "[\"\\\\\u{0}-\u{1f}a-z\u{7f}\u{e9}\u{2028}]{0,12}", b in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            for s in [&s, &raw] {
                let mut out = Vec::new();
                write_json_str(&mut out, s).unwrap();
                proptest::prop_assert_eq!(String::from_utf8(out).unwrap(), serde_json::to_string(s).unwrap());
            }
            let mut out = Vec::new();
            write_hex(&mut out, &b).unwrap();
            proptest::prop_assert_eq!(String::from_utf8(out).unwrap(), super::super::hex_encode(&b));
        }
    }
}
