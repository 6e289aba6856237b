//! Replays every committed fuzz corpus through its target on the stable toolchain: each input
//! that a fuzzer once found interesting, or that crashed a decoder before it was fixed, must pass.

use std::collections::BTreeSet;
use std::fs;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use kvmesh_fuzz_targets::{TARGETS, fuzz_dir};

fn names_in(dir: &Path, suffix: &str) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(suffix).map(str::to_owned)
        })
        .collect()
}

#[test]
fn every_target_has_a_fuzz_target_file_and_a_corpus() {
    let table: BTreeSet<String> = TARGETS.iter().map(|t| t.name.to_owned()).collect();
    assert_eq!(table.len(), TARGETS.len(), "duplicate target names");
    assert_eq!(names_in(&fuzz_dir().join("fuzz_targets"), ".rs"), table);
    assert_eq!(names_in(&fuzz_dir().join("corpus"), ""), table);
    let manifest = fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
    for name in &table {
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "fuzz/Cargo.toml has no [[bin]] {name}"
        );
    }
}

#[test]
fn every_corpus_input_passes_its_target() {
    let mut failures = Vec::new();
    for target in TARGETS {
        let dir = fuzz_dir().join("corpus").join(target.name);
        let mut inputs: Vec<_> = fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.unwrap().path())
            .collect();
        inputs.sort();
        assert!(
            inputs.len() >= 3,
            "{}: corpus has {} inputs",
            target.name,
            inputs.len()
        );
        for path in inputs {
            let input = fs::read(&path).unwrap();
            if catch_unwind(AssertUnwindSafe(|| (target.run)(&input))).is_err() {
                failures.push(path.display().to_string());
            }
        }
    }
    assert!(failures.is_empty(), "inputs that panicked: {failures:#?}");
}
