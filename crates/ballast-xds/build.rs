//! Builds the compact ("served") descriptor set: only the files that the
//! message types in `descriptors/served-types.txt` need, out of the full
//! Envoy API set. Decoding the full set costs ~35 MiB of resident memory;
//! every resource needs a descriptor (canonical versions) and REST needs
//! proto-JSON, so the common path uses this subset and the full set is only
//! decoded when a lookup misses (see `src/descriptors.rs`).

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use prost::Message;
use prost_types::{DescriptorProto, FileDescriptorSet};

const FULL: &str = "descriptors/envoy-types-0.7.7.bin";
const ROOTS: &str = "descriptors/served-types.txt";

fn messages(prefix: &str, list: &[DescriptorProto], out: &mut Vec<String>) {
    for m in list {
        let name = format!("{prefix}.{}", m.name());
        messages(&name, &m.nested_type, out);
        out.push(name);
    }
}

fn main() {
    println!("cargo::rerun-if-changed={FULL}");
    println!("cargo::rerun-if-changed={ROOTS}");
    let full = std::fs::read(FULL).expect("read the bundled descriptor set");
    let set = FileDescriptorSet::decode(full.as_slice()).expect("valid descriptor set");
    let by_file: HashMap<&str, usize> = set
        .file
        .iter()
        .enumerate()
        .map(|(i, f)| (f.name(), i))
        .collect();
    let mut defined_in: HashMap<String, usize> = HashMap::new();
    for (i, f) in set.file.iter().enumerate() {
        let mut names = Vec::new();
        messages(f.package(), &f.message_type, &mut names);
        for n in names {
            defined_in.insert(n, i);
        }
    }
    let roots = std::fs::read_to_string(ROOTS).expect("read served-types.txt");
    let mut keep = BTreeSet::new();
    let mut todo = Vec::new();
    for line in roots.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some(&i) = defined_in.get(line) else {
            panic!("{ROOTS}: {line} is not a message in {FULL}");
        };
        todo.push(i);
    }
    while let Some(i) = todo.pop() {
        if !keep.insert(i) {
            continue;
        }
        for dep in &set.file[i].dependency {
            let &d = by_file
                .get(dep.as_str())
                .unwrap_or_else(|| panic!("{FULL}: missing import {dep}"));
            todo.push(d);
        }
    }
    // Keep the original (dependency-first) order so the pool decodes in one pass.
    let subset = FileDescriptorSet {
        file: set
            .file
            .iter()
            .enumerate()
            .filter(|(i, _)| keep.contains(i))
            .map(|(_, f)| f.clone())
            .collect(),
    };
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    std::fs::write(out_dir.join("served.bin"), subset.encode_to_vec()).expect("write served.bin");
    std::fs::write(out_dir.join("map_shapes.rs"), map_shapes(&set)).expect("write map_shapes.rs");
}

/// One message field that can hold a map: its number, the index of its
/// message type among the emitted shapes, and whether it is a map itself.
type ShapeField = (u32, usize, bool);

/// Messages by full name: whether each is a map entry, and its message
/// fields (number, type's full name, repeated).
type Messages = std::collections::BTreeMap<String, (bool, Vec<(u32, String, bool)>)>;

/// Rust source of the tables `src/map_shapes.rs` walks for canonical versions:
/// every message (of the whole set, so any packed `Any` is covered) that can
/// hold a `map` field, directly or through message fields or `Any`, with just
/// those fields. Everything else is hashed as it is, so nothing more is needed
/// and no descriptor pool has to be decoded to version a resource.
fn map_shapes(set: &FileDescriptorSet) -> String {
    use prost_types::field_descriptor_proto::{Label, Type};
    const ANY: &str = "google.protobuf.Any";
    // Full name (no leading dot) -> (is map entry, message fields: number, type, repeated).
    let mut msgs = Messages::default();
    fn collect(prefix: &str, list: &[DescriptorProto], out: &mut Messages) {
        for m in list {
            let name = format!("{prefix}.{}", m.name());
            let entry = m.options.as_ref().is_some_and(|o| o.map_entry());
            let fields = m
                .field
                .iter()
                .filter(|f| matches!(f.r#type(), Type::Message | Type::Group))
                .map(|f| {
                    let ty = f.type_name().trim_start_matches('.').to_string();
                    (f.number() as u32, ty, f.label() == Label::Repeated)
                })
                .collect();
            out.insert(name.clone(), (entry, fields));
            collect(&name, &m.nested_type, out);
        }
    }
    for f in &set.file {
        collect(f.package(), &f.message_type, &mut msgs);
    }
    let is_map = |ty: &str, repeated: bool| repeated && msgs.get(ty).is_some_and(|m| m.0);
    // Fixpoint: which messages can hold a map (Any: whatever it packs may).
    let mut reach: BTreeSet<&str> = BTreeSet::from([ANY]);
    loop {
        let before = reach.len();
        for (name, (_, fields)) in &msgs {
            if fields
                .iter()
                .any(|(_, ty, rep)| is_map(ty, *rep) || reach.contains(ty.as_str()))
            {
                reach.insert(name.as_str());
            }
        }
        if reach.len() == before {
            break;
        }
    }
    let index: HashMap<&str, usize> = reach.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let mut src = String::from("// Generated by build.rs (map_shapes): do not edit.\n");
    src += &format!("pub(crate) const ANY: u16 = {};\n", index[ANY]);
    src += "pub(crate) static NAMES: &[&str] = &[\n";
    for n in &reach {
        src += &format!("    {n:?},\n");
    }
    src += "];\npub(crate) static FIELDS: &[&[(u32, u16, bool)]] = &[\n";
    for n in &reach {
        let mut fields: Vec<ShapeField> = msgs
            .get(*n)
            .map(|(_, f)| f.as_slice())
            .unwrap_or_default()
            .iter()
            .filter_map(|(num, ty, rep)| {
                let map = is_map(ty, *rep);
                let &i = index.get(ty.as_str())?;
                Some((*num, i, map))
            })
            .collect();
        // A map whose entry holds no map still has its order to sort.
        for (num, ty, rep) in msgs.get(*n).map(|m| m.1.as_slice()).unwrap_or_default() {
            if is_map(ty, *rep) && !index.contains_key(ty.as_str()) {
                fields.push((*num, usize::MAX, true));
            }
        }
        fields.sort_unstable();
        src += "    &[";
        for (num, i, map) in fields {
            let i = if i == usize::MAX {
                "NONE".to_string()
            } else {
                i.to_string()
            };
            src += &format!("({num}, {i}, {map}), ");
        }
        src += "],\n";
    }
    src += "];\n";
    src
}
