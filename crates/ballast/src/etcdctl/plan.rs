//! The pure half of `ballast apply/delete/diff`: what the store holds, what an edit makes of it,
//! whether the result is valid and within the guard's share, and what changes in Envoy.
//!
//! Nothing here talks to etcd, so every rule is unit-tested without one; `super` does the I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ballast_model::{ConfigError, ConfigSet, Kind, Object, ObjectId, ObjectKey};
use ballast_sources::etcd_keys;
use ballast_translate::{Options, translate_gateway};
use ballast_xds::{ResourceType, Snapshot};

use crate::guard::{Inventory, Removal};

/// One config key as read from the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreEntry {
    pub key: String,
    pub value: String,
    pub mod_revision: i64,
}

/// The store's config as the etcd source builds it on a cold start: every valid object; the
/// errors of invalid ones (named `etcd:<key>`, line:col inside the value, as the source does).
pub fn store_config(entries: &[StoreEntry]) -> (ConfigSet, Vec<ConfigError>) {
    let parses = entries.iter().map(|e| {
        let name = source_name(&e.key);
        let parse = ballast_model::parse_file_report(&name, &e.value);
        (Arc::<str>::from(name), parse)
    });
    let (set, report) = ConfigSet::assemble(None, parses);
    (set, report.errors)
}

/// How the etcd source names a key in messages.
pub fn source_name(key: &str) -> String {
    format!("etcd:{key}")
}

/// One object of the files being applied: its identity and the text of its YAML document
/// (stored as is, comments included).
#[derive(Clone, Debug)]
pub struct Doc {
    pub id: ObjectId,
    pub object: Object,
    pub text: String,
}

/// Files read for `apply`/`diff`: the objects, and the documents skipped (kinds Ballast does not
/// implement), as warnings.
#[derive(Debug, Default)]
pub struct Docs {
    pub docs: Vec<Doc>,
    pub warnings: Vec<String>,
}

/// Reads and validates the files under `paths` exactly as `ballast validate` does: any error (with
/// file:line:col), including an object defined twice, rejects the whole apply.
pub fn read_docs(paths: &[std::path::PathBuf]) -> Result<Docs, Vec<ConfigError>> {
    let files = ballast_sources::read_config_files(paths)?;
    docs_of(files.iter().map(|(p, t)| (p.as_str(), t.as_str())))
}

/// [`read_docs`] over texts already read, as (path for messages, text).
pub fn docs_of<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<Docs, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let mut out = Docs::default();
    for (path, text) in files {
        let parse = ballast_model::parse_file_report(path, text);
        let file_errors = parse.errors();
        if !file_errors.is_empty() {
            errors.extend(file_errors);
            continue;
        }
        out.warnings
            .extend(parse.skipped.iter().map(|s| format!("skipped: {s}")));
        // The file is valid: each document holds at most one object.
        for (_, doc) in ballast_model::split_yaml_documents(text) {
            if let Ok(mut objects) = ballast_model::parse_file(path, doc)
                && let Some(object) = objects.pop()
            {
                out.docs.push(Doc {
                    id: ObjectId {
                        kind: object.kind(),
                        key: object.key(),
                    },
                    object,
                    text: doc.to_owned(),
                });
            }
        }
    }
    // Duplicates across files (or within one) name both places.
    if let Err(e) = ConfigSet::from_objects(parse_all(&out.docs)) {
        errors.extend(e);
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        errors.sort();
        errors.dedup();
        Err(errors)
    }
}

/// The objects of whole files again, with positions in their files (for duplicate messages).
fn parse_all(docs: &[Doc]) -> Vec<Object> {
    docs.iter().map(|d| d.object.clone()).collect()
}

/// What an edit does to the store: the config before and after, and the writes.
#[derive(Debug, Default)]
pub struct Plan {
    pub old: ConfigSet,
    pub new: ConfigSet,
    /// (key, value) to put.
    pub puts: Vec<(String, String)>,
    /// Keys to delete.
    pub deletes: Vec<String>,
    /// Objects applied whose stored value is already the same text.
    pub unchanged: usize,
    /// Errors of invalid objects already in the store (not served; an apply may fix them).
    pub store_errors: Vec<ConfigError>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.puts.is_empty() && self.deletes.is_empty()
    }
}

/// `apply`: every document becomes (or replaces) its object's key.
pub fn plan_apply(prefix: &str, entries: &[StoreEntry], docs: &Docs) -> Plan {
    let (old, store_errors) = store_config(entries);
    let stored: BTreeMap<&str, &str> = entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    let mut plan = Plan {
        new: old.clone(),
        old,
        store_errors,
        ..Plan::default()
    };
    for d in &docs.docs {
        let key = etcd_keys::object_key(prefix, d.id.kind, &d.id.key);
        if stored.get(key.as_str()) == Some(&d.text.as_str()) {
            plan.unchanged += 1;
        } else {
            plan.puts.push((key, d.text.clone()));
        }
        plan.new.insert(d.object.clone());
    }
    plan
}

/// `delete`: `None` if the store has no such key.
pub fn plan_delete(
    prefix: &str,
    entries: &[StoreEntry],
    kind: Kind,
    key: &ObjectKey,
) -> Option<Plan> {
    let k = etcd_keys::object_key(prefix, kind, key);
    if !entries.iter().any(|e| e.key == k) {
        return None;
    }
    let (old, store_errors) = store_config(entries);
    let mut new = old.clone();
    new.remove(kind, key);
    Some(Plan {
        old,
        new,
        deletes: vec![k],
        store_errors,
        ..Plan::default()
    })
}

/// Envoy resources of one gateway: type → name → version.
pub type Versions = BTreeMap<ResourceType, BTreeMap<String, String>>;

/// One gateway before and after an edit.
#[derive(Debug)]
pub struct GatewayChange {
    pub gateway: ObjectKey,
    pub old: Option<Snapshot>,
    pub new: Option<Snapshot>,
}

/// The translation of every gateway in either config; errors for any that fails (a config that
/// `ballast validate` would reject).
pub fn translate_both(plan: &Plan) -> (Vec<GatewayChange>, Vec<String>) {
    let options = Options::default();
    let mut errors = Vec::new();
    let gateways: BTreeSet<&ObjectKey> = plan
        .old
        .gateways
        .keys()
        .chain(plan.new.gateways.keys())
        .collect();
    let mut snap = |config: &ConfigSet, key: &ObjectKey, label: &str| -> Option<Snapshot> {
        if !config.gateways.contains_key(key) {
            return None;
        }
        match translate_gateway(config, key, &options).map(|r| r.snapshot(None)) {
            Ok(Ok(s)) => Some(s),
            Ok(Err(e)) => {
                errors.push(format!("gateway {key} ({label}): {e}"));
                None
            }
            Err(e) => {
                errors.push(format!("gateway {key} ({label}): {e}"));
                None
            }
        }
    };
    let mut out = Vec::new();
    for key in gateways {
        let old = snap(&plan.old, key, "in the store");
        let new = snap(&plan.new, key, "after the change");
        out.push(GatewayChange {
            gateway: key.clone(),
            old,
            new,
        });
    }
    (out, errors)
}

/// The blast-radius check of `ballast serve`'s guard, before writing: each gateway whose
/// listeners, routes or clusters would lose more than `max_removal`, with the reason.
pub fn guard_violations(changes: &[GatewayChange], max_removal: f64) -> Vec<String> {
    let mut out = Vec::new();
    for c in changes {
        let Some(old) = &c.old else { continue };
        let before = Inventory::of(old);
        let after = c.new.as_ref().map(Inventory::of).unwrap_or_default();
        if let Some(reason) = Removal::between(&before, &after).exceeds(max_removal) {
            let what = if c.new.is_none() {
                " (the Gateway is deleted)"
            } else {
                ""
            };
            out.push(format!("gateway {}: {reason}{what}", c.gateway));
        }
    }
    out
}

fn versions(s: Option<&Snapshot>) -> Versions {
    let mut out = Versions::new();
    if let Some(s) = s {
        for ty in ResourceType::ALL {
            let m = s
                .resources(ty)
                .iter()
                .map(|(n, r)| (n.to_string(), r.version().to_owned()))
                .collect::<BTreeMap<_, _>>();
            if !m.is_empty() {
                out.insert(ty, m);
            }
        }
    }
    out
}

/// Envoy-level change of one gateway.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ResourceDiff {
    pub added: Vec<(ResourceType, String)>,
    pub modified: Vec<(ResourceType, String)>,
    pub removed: Vec<(ResourceType, String)>,
}

impl ResourceDiff {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.modified.is_empty() && self.removed.is_empty()
    }
}

/// Per gateway, the resources an edit adds, modifies (new version) or removes: what the replicas
/// would push to that gateway's Envoys.
pub fn resource_diff(changes: &[GatewayChange]) -> Vec<(ObjectKey, ResourceDiff)> {
    let mut out = Vec::new();
    for c in changes {
        let (old, new) = (versions(c.old.as_ref()), versions(c.new.as_ref()));
        let mut d = ResourceDiff::default();
        for ty in ResourceType::ALL {
            let empty = BTreeMap::new();
            let (o, n) = (
                old.get(&ty).unwrap_or(&empty),
                new.get(&ty).unwrap_or(&empty),
            );
            for (name, v) in n {
                match o.get(name) {
                    None => d.added.push((ty, name.clone())),
                    Some(ov) if ov != v => d.modified.push((ty, name.clone())),
                    Some(_) => {}
                }
            }
            for name in o.keys().filter(|k| !n.contains_key(*k)) {
                d.removed.push((ty, name.clone()));
            }
        }
        out.push((c.gateway.clone(), d));
    }
    out
}

/// `ballast diff` output: per gateway with changes, one line per resource (`+` added, `~`
/// modified, `-` removed, with the xDS type), then a summary.
pub fn render_diff(diffs: &[(ObjectKey, ResourceDiff)]) -> String {
    let mut out = String::new();
    let (mut a, mut m, mut r) = (0, 0, 0);
    for (gw, d) in diffs.iter().filter(|(_, d)| !d.is_empty()) {
        out.push_str(&format!(
            "gateway {gw}: {} added, {} modified, {} removed\n",
            d.added.len(),
            d.modified.len(),
            d.removed.len()
        ));
        for (sign, list) in [("+", &d.added), ("~", &d.modified), ("-", &d.removed)] {
            for (ty, name) in list {
                out.push_str(&format!("  {sign} {} {name}\n", ty.short_name()));
            }
        }
        a += d.added.len();
        m += d.modified.len();
        r += d.removed.len();
    }
    if a + m + r == 0 {
        out.push_str("no Envoy resource changes\n");
    } else {
        out.push_str(&format!("total: {a} added, {m} modified, {r} removed\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "/ballast/";

    fn gw(port: u16) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: gw\nspec:\n  gatewayClassName: ballast\n  listeners:\n  - name: http\n    port: {port}\n    protocol: HTTP\n"
        )
    }

    fn backend(name: &str, port: u16) -> String {
        format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata:\n  name: {name}\nspec:\n  endpoints:\n  - address: 127.0.0.1\n    port: {port}\n"
        )
    }

    fn route(name: &str, backend: &str) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: {name}\nspec:\n  parentRefs:\n  - name: gw\n  rules:\n  - matches:\n    - path:\n        type: PathPrefix\n        value: /{name}\n    backendRefs:\n    - group: ballast.dev\n      kind: Backend\n      name: {backend}\n"
        )
    }

    fn store(docs: &[String]) -> Vec<StoreEntry> {
        let d = docs_of(docs.iter().map(|t| ("x.yaml", t.as_str()))).unwrap();
        d.docs
            .iter()
            .map(|d| StoreEntry {
                key: etcd_keys::object_key(P, d.id.kind, &d.id.key),
                value: d.text.clone(),
                mod_revision: 1,
            })
            .collect()
    }

    #[test]
    fn documents_are_split_one_object_each() {
        let text = format!("# a comment\n{}---\n{}", gw(8080), backend("b", 1));
        let d = docs_of([("f.yaml", text.as_str())]).unwrap();
        assert_eq!(d.docs.len(), 2);
        assert!(d.docs[0].text.starts_with("# a comment"));
        assert_eq!(d.docs[1].id.kind, Kind::Backend);
        // Each stored value parses on its own to the same object.
        for doc in &d.docs {
            let o = ballast_model::parse_file("k", &doc.text).unwrap();
            assert_eq!(o.len(), 1);
            assert_eq!(o[0].key(), doc.id.key);
        }
    }

    #[test]
    fn invalid_and_duplicate_objects_are_refused_with_positions() {
        let bad = gw(8080).replace("port: 8080", "port: nope");
        let e = docs_of([("bad.yaml", bad.as_str())]).unwrap_err();
        assert!(e[0].to_string().starts_with("bad.yaml:9:"), "{}", e[0]);
        let b = backend("b", 1);
        let e = docs_of([("a.yaml", b.as_str()), ("c.yaml", b.as_str())]).unwrap_err();
        assert!(e[0].to_string().contains("duplicate"), "{}", e[0]);
    }

    #[test]
    fn apply_of_the_same_text_writes_nothing() {
        let s = store(&[gw(8080), backend("b", 1)]);
        let docs = docs_of([("f.yaml", backend("b", 1).as_str())]).unwrap();
        let plan = plan_apply(P, &s, &docs);
        assert!(plan.is_empty());
        assert_eq!(plan.unchanged, 1);
        let docs = docs_of([("f.yaml", backend("b", 2).as_str())]).unwrap();
        let plan = plan_apply(P, &s, &docs);
        assert_eq!(plan.puts.len(), 1);
        assert_eq!(plan.puts[0].0, "/ballast/backends/default/b");
    }

    #[test]
    fn diff_names_added_modified_removed_per_gateway() {
        let s = store(&[gw(8080), backend("b", 1), route("r", "b")]);
        let text = format!("{}---\n{}", backend("b", 2), backend("c", 3));
        let plan = plan_apply(P, &s, &docs_of([("f.yaml", text.as_str())]).unwrap());
        let (changes, errors) = translate_both(&plan);
        assert!(errors.is_empty(), "{errors:?}");
        let d = resource_diff(&changes);
        assert_eq!(d.len(), 1);
        let (_, d) = &d[0];
        assert!(d.removed.is_empty());
        // The endpoints of b changed; c is not used by any route, so nothing is added.
        assert_eq!(
            d.modified,
            vec![(ResourceType::ClusterLoadAssignment, "default/b".into())]
        );
        let text = render_diff(&resource_diff(&changes));
        assert!(text.contains("~ EDS default/b"), "{text}");

        // Deleting the route removes its cluster and route entries.
        let plan = plan_delete(P, &s, Kind::HttpRoute, &ObjectKey::new("default", "r")).unwrap();
        let (changes, _) = translate_both(&plan);
        let d = &resource_diff(&changes)[0].1;
        assert!(
            d.removed
                .contains(&(ResourceType::Cluster, "default/b".into())),
            "{d:?}"
        );
        assert!(plan_delete(P, &s, Kind::HttpRoute, &ObjectKey::new("default", "x")).is_none());
    }

    #[test]
    fn guard_refuses_large_removals_only() {
        let s = store(&[
            gw(8080),
            backend("b", 1),
            route("r1", "b"),
            route("r2", "b"),
            route("r3", "b"),
        ]);
        let one = plan_delete(P, &s, Kind::HttpRoute, &ObjectKey::new("default", "r1")).unwrap();
        let (c, _) = translate_both(&one);
        assert!(guard_violations(&c, 0.5).is_empty());
        let gw_gone = plan_delete(P, &s, Kind::Gateway, &ObjectKey::new("default", "gw")).unwrap();
        let (c, _) = translate_both(&gw_gone);
        let v = guard_violations(&c, 0.5);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("gateway default/gw"), "{v:?}");
        assert!(guard_violations(&c, 1.0).is_empty());
    }
}
