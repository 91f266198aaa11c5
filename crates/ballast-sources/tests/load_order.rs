//! Property: what a load gives does not depend on the order paths are given in or the order the
//! filesystem lists them — only on the files.

use std::fs;
use std::path::PathBuf;

use ballast_sources::load_paths;
use proptest::prelude::*;

fn backend(name: &str, port: u16) -> String {
    format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {{ name: {name} }}\nspec:\n  endpoints: [{{ address: 10.0.0.1, port: {port} }}]\n"
    )
}

/// The set with every object's source, or the error messages.
fn outcome(r: Result<ballast_model::ConfigSet, ballast_model::ConfigErrors>) -> String {
    match r {
        Ok(set) => set
            .objects()
            .map(|o| format!("{:?} {}", o, o.source()))
            .collect::<Vec<_>>()
            .join("\n"),
        Err(errs) => errs
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn load_is_independent_of_path_order(
        // Up to 5 files in up to 2 subdirectories, each with up to 3 backends named b0..b5
        // (so duplicates, and thus errors, happen too).
        files in proptest::collection::vec(
            (0u8..3, proptest::collection::vec((0u8..6, 1u16..3), 0..3)),
            1..6,
        ),
        seed in any::<u64>(),
    ) {
        let d = tempfile::tempdir().unwrap();
        let mut paths: Vec<PathBuf> = Vec::new();
        for (i, (sub, objs)) in files.iter().enumerate() {
            let dir = match sub { 0 => d.path().to_path_buf(), s => d.path().join(format!("s{s}")) };
            fs::create_dir_all(&dir).unwrap();
            let text = objs
                .iter()
                .map(|(n, port)| backend(&format!("b{n}"), *port))
                .collect::<Vec<_>>()
                .join("---\n");
            let p = dir.join(format!("f{i}.yaml"));
            fs::write(&p, text).unwrap();
            paths.push(p);
        }
        let mut shuffled = paths.clone();
        let mut s = seed;
        for i in (1..shuffled.len()).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            shuffled.swap(i, (s >> 33) as usize % (i + 1));
        }
        let whole_dir = outcome(load_paths(&[d.path().to_path_buf()]));
        prop_assert_eq!(&outcome(load_paths(&paths)), &whole_dir);
        prop_assert_eq!(&outcome(load_paths(&shuffled)), &whole_dir);
        // Naming files twice (directly and through their directory) changes nothing either.
        let mut both = shuffled.clone();
        both.push(d.path().to_path_buf());
        prop_assert_eq!(&outcome(load_paths(&both)), &whole_dir);
    }
}
