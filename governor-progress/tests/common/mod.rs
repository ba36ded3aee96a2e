//! Helpers shared by the progress-ingestion integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use governor_progress::Record;

/// The real training logs in `shared/fixtures/logs`, found by walking up from the crate: the
/// lead's checkout (`/work/main/governor`) has it two levels up, a worktree
/// (`/work/wt/<name>/governor`) three. `GOVERNOR_FIXTURES` overrides.
pub(crate) fn fixtures_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("GOVERNOR_FIXTURES") {
        let dir = PathBuf::from(dir);
        assert!(
            dir.join("INDEX.tsv").is_file(),
            "GOVERNOR_FIXTURES={} has no INDEX.tsv",
            dir.display()
        );
        return dir;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    for ancestor in manifest.ancestors() {
        let dir = ancestor.join("shared/fixtures/logs");
        if dir.join("INDEX.tsv").is_file() {
            return dir;
        }
    }
    // A checkout elsewhere (a clean clone under /tmp) still finds the machine's shared copy.
    let shared = PathBuf::from("/work/shared/fixtures/logs");
    if shared.join("INDEX.tsv").is_file() {
        return shared;
    }
    panic!(
        "training-log fixtures not found: no shared/fixtures/logs/INDEX.tsv above {} \
         (expected /work/shared/fixtures/logs; set GOVERNOR_FIXTURES to its path)",
        manifest.display()
    );
}

/// What a record says, comparable across runs (NaN equals NaN; no wall time).
#[derive(Debug, PartialEq, Eq, Clone)]
pub(crate) struct Seen {
    pub index: u64,
    pub epoch: Option<u64>,
    pub step: Option<u64>,
    pub split: &'static str,
    pub metrics: Vec<(String, u64)>,
}

pub(crate) fn seen(records: &[Record]) -> Vec<Seen> {
    records
        .iter()
        .map(|r| Seen {
            index: r.index,
            epoch: r.epoch.map(f64::to_bits),
            step: r.step,
            split: r.split.as_str(),
            metrics: r
                .metrics
                .iter()
                .map(|(k, v)| {
                    (
                        k.to_owned(),
                        if v.is_nan() { u64::MAX } else { v.to_bits() },
                    )
                })
                .collect(),
        })
        .collect()
}
