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
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("served.bin");
    std::fs::write(&out, subset.encode_to_vec()).expect("write served.bin");
}
