//! The state file, kept encoded between writes: a write re-derives only what changed since the
//! last one. Taking a fresh [`Inventory`] of every published snapshot and encoding it whole
//! was a third of the CPU of a route edit at 50,000 routes (decoding every virtual host's
//! route ids, hex-encoding and JSON-escaping 100,000 names), once a second for as long as
//! edits kept coming, and the idle cost between edits.
//!
//! Per gateway, the listener and cluster name lists are re-encoded only when the snapshot's
//! map of that type is another one (unchanged types share the previous map); a route
//! configuration's route ids are re-decoded only for the virtual hosts whose bytes differ
//! from the last encoding (common prefix and suffix, aligned on field boundaries), and each
//! id keeps its encoded JSON entry. A write then concatenates the cached pieces.
//!
//! The output is byte for byte [`super::encode_at`] of the records' inventories (proved by
//! `tests::encoder_equals_full_encoding`).

use std::collections::BTreeMap;
use std::sync::Arc;

use ballast_xds::{Resource, ResourceMap, ResourceType, Snapshot};
use prost::Message;

use super::{Recorded, Records, hex_encode};
use crate::guard::{
    HostIds, Inventory, ListenerIds, RouteId, RouteIds, TCP_PROXY, common_prefix, common_suffix,
    next_field,
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
    /// The `tcp_proxy` chains of listeners, by group name (`listener:{name}`).
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
        self.json = json_array(map.keys().map(|k| json_str(k)));
        self.from = Some(map.clone());
    }
}

/// Route ids of one group: (virtual host, id) → (how many virtual hosts hold it, its JSON
/// entry `["group","host","hex id"]`). Counted, so that a host named twice stays a set.
type Entries = BTreeMap<(String, Vec<u8>), (usize, String)>;

/// A route configuration as last decoded.
struct RcBook {
    resource: Arc<Resource>,
    /// Its top-level fields in byte order, with the route ids of each virtual host.
    /// `None`: the bytes do not parse field by field (decoded whole, see [`RcBook::whole`]).
    fields: Option<Vec<Field>>,
    /// Fields whose virtual host does not decode: then, as for [`Inventory::of`], the whole
    /// configuration counts for nothing.
    broken: usize,
    entries: Entries,
}

struct Field {
    start: usize,
    end: usize,
    /// `None` for anything but a virtual host that decodes.
    host: Option<HostIds>,
    broken: bool,
}

impl RcBook {
    fn new(name: &str, resource: Arc<Resource>) -> RcBook {
        let mut book = RcBook {
            resource: resource.clone(),
            fields: Some(Vec::new()),
            broken: 0,
            entries: Entries::new(),
        };
        let bytes = resource.value_bytes();
        match parse_fields(&bytes, 0, |_| false) {
            Some((fields, _)) => {
                for f in &fields {
                    book.add(name, f);
                }
                book.fields = Some(fields);
            }
            None => book.whole(name, &bytes),
        }
        book
    }

    /// Bytes that do not parse field by field: whatever decodes as a whole.
    fn whole(&mut self, name: &str, bytes: &[u8]) {
        self.fields = None;
        self.broken = 0;
        self.entries.clear();
        match RouteIds::decode(bytes) {
            Ok(rc) => {
                for vh in rc.virtual_hosts {
                    self.add_host(name, &vh);
                }
            }
            Err(_) => self.broken = 1,
        }
    }

    fn add(&mut self, name: &str, f: &Field) {
        if f.broken {
            self.broken += 1;
        }
        if let Some(h) = &f.host {
            self.add_host(name, h);
        }
    }

    fn add_host(&mut self, name: &str, h: &HostIds) {
        for r in &h.routes {
            let id = route_id(r);
            let e = self
                .entries
                .entry((h.name.clone(), id))
                .or_insert_with_key(|(host, id)| {
                    (
                        0,
                        format!(
                            "[{},{},{}]",
                            json_str(name),
                            json_str(host),
                            json_str(&hex_encode(id))
                        ),
                    )
                });
            e.0 += 1;
        }
    }

    fn remove(&mut self, f: &Field) {
        if f.broken {
            self.broken -= 1;
        }
        let Some(h) = &f.host else { return };
        for r in &h.routes {
            let key = (h.name.clone(), route_id(r));
            if let Some(e) = self.entries.get_mut(&key) {
                e.0 -= 1;
                if e.0 == 0 {
                    self.entries.remove(&key);
                }
            }
        }
    }

    /// Moves to `next`, re-decoding only the fields whose bytes changed.
    fn update(&mut self, name: &str, next: &Arc<Resource>) {
        if Arc::ptr_eq(&self.resource, next) {
            return;
        }
        let old = self.resource.value_bytes();
        let new = next.value_bytes();
        self.resource = next.clone();
        let Some(mut fields) = self.fields.take() else {
            *self = RcBook::new(name, next.clone());
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
        let Some((mut parsed, stop)) = parse_fields(&new, start, resync) else {
            *self = RcBook::new(name, next.clone());
            return;
        };
        let o_stop = if stop == new.len() {
            old.len()
        } else {
            stop - new_tail + old_tail
        };
        let last = first + fields[first..].partition_point(|f| f.start < o_stop);
        let removed: Vec<Field> = fields.drain(first..last).collect();
        for f in &removed {
            self.remove(f);
        }
        for f in &parsed {
            self.add(name, f);
        }
        // The fields after the change moved by the difference in length.
        if new.len() != old.len() {
            for f in &mut fields[first..] {
                f.start = f.start + new.len() - old.len();
                f.end = f.end + new.len() - old.len();
            }
        }
        fields.splice(first..first, parsed.drain(..));
        self.fields = Some(fields);
    }
}

/// The top-level fields of `buf` from `at` until `stop(offset)` holds at a field start or the
/// end: the fields and where parsing stopped. `None` if the bytes are not fields.
fn parse_fields(
    buf: &[u8],
    mut at: usize,
    stop: impl Fn(usize) -> bool,
) -> Option<(Vec<Field>, usize)> {
    let mut out = Vec::new();
    while at < buf.len() && !stop(at) {
        let (number, end, payload) = next_field(buf, at)?;
        let (host, broken) = if number == 2 {
            match payload.map(HostIds::decode) {
                Some(Ok(h)) => (Some(h), false),
                _ => (None, true),
            }
        } else {
            (None, false)
        };
        out.push(Field {
            start: at,
            end,
            host,
            broken,
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
        let entries: &mut Entries = out.entry(group.clone()).or_default();
        for chain in l.filter_chains {
            if chain.filters.iter().any(|f| f.name == TCP_PROXY) {
                let json = format!("[{},{},\"\"]", json_str(&group), json_str(&chain.name));
                entries.insert((chain.name, Vec::new()), (1, json));
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
                Some(b) => b.update(name, res),
                None => {
                    self.rcs
                        .insert(name.clone(), RcBook::new(name, res.clone()));
                }
            }
        }
    }

    /// `{"listeners":[..],"clusters":[..],"routes":[..]}` into `out`.
    fn write(&self, out: &mut String) {
        out.push_str("{\"listeners\":");
        out.push_str(&self.listeners.json);
        out.push_str(",\"clusters\":");
        out.push_str(&self.clusters.json);
        out.push_str(",\"routes\":[");
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
        let mut push = |json: &str| {
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str(json);
        };
        for parts in groups.values() {
            if let [one] = parts.as_slice() {
                for (_, (_, json)) in one.iter() {
                    push(json);
                }
            } else {
                // A route configuration named like a listener group: merge (rare).
                let merged: BTreeMap<&(String, Vec<u8>), &str> = parts
                    .iter()
                    .flat_map(|e| e.iter().map(|(k, (_, j))| (k, j.as_str())))
                    .collect();
                for json in merged.values() {
                    push(json);
                }
            }
        }
        out.push_str("]}");
    }
}

impl Encoder {
    /// The state document for `records`, written at `written_at` (seconds since the epoch).
    pub fn encode(&mut self, records: &Records, written_at: f64) -> Vec<u8> {
        self.gateways
            .retain(|name, _| matches!(records.get(name), Some(Recorded::Snapshot(_))));
        let mut out = String::new();
        out.push_str("{\"format\":");
        out.push_str(&super::FORMAT.to_string());
        out.push_str(",\"written_at\":");
        out.push_str(&serde_json::to_string(&written_at).expect("a number"));
        out.push_str(",\"gateways\":{");
        for (i, (name, record)) in records.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&json_str(name));
            out.push(':');
            match record {
                Recorded::Snapshot(s) => {
                    let book = self.gateways.entry(name.clone()).or_default();
                    book.update(s);
                    book.write(&mut out);
                }
                Recorded::Inventory(inv) => write_inventory(inv, &mut out),
            }
        }
        out.push_str("}}");
        out.into_bytes()
    }
}

/// A restart baseline not replaced yet: encoded whole (once per gateway and restart).
fn write_inventory(inv: &Inventory, out: &mut String) {
    out.push_str(&serde_json::to_string(&super::GatewayV1::of(inv)).expect("serializable"));
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).expect("a string")
}

fn json_array(items: impl Iterator<Item = String>) -> String {
    let mut out = String::from("[");
    for (i, s) in items.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&s);
    }
    out.push(']');
    out
}

/// A named route keeps its identity when its match is edited; unnamed routes are identified
/// by their encoded match (as [`Inventory::of`] does).
fn route_id(r: &RouteId) -> Vec<u8> {
    if r.name.is_empty() {
        r.r#match.clone()
    } else {
        r.name.clone().into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{encode_at, inventories};
    use super::*;
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
                let got = enc.encode(&records, 1234.5);
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
        let mut book = RcBook::new("rc0", rc(&first));
        // A host decoded again has a new name buffer; a kept one keeps it (moved or not).
        let names = |b: &RcBook| -> Vec<*const u8> {
            let fields = b.fields.as_ref().unwrap();
            fields
                .iter()
                .filter_map(|f| f.host.as_ref().map(|h| h.name.as_ptr()))
                .collect()
        };
        let before = names(&book);
        assert_eq!(before.len(), 200);
        model.rcs.get_mut(&0).unwrap()[100].1 = vec![(Some(1), 2)];
        let next = model.snapshot(Some(&first));
        book.update("rc0", &rc(&next));
        let after = names(&book);
        assert_eq!(after.len(), 200);
        let kept = after.iter().zip(&before).filter(|(a, b)| a == b).count();
        assert_eq!(kept, 199, "only the edited host is decoded again");
        assert_eq!(book.entries, RcBook::new("rc0", rc(&next)).entries);
    }
}
