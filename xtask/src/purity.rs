//! The pure crates stay pure: their dependency trees hold no async runtime, no system-call
//! binding and no kernel interface. The simulator and the fuzz targets build on them, and a
//! dependency of that kind would let I/O back into code that is meant to take bytes and times
//! from its caller. `cargo xtask test` runs this check before clippy.

use anyhow::{Result, bail};
use governor_testbed::cmd;

/// The crates that do no I/O: node policies, cluster placement, the cluster planner (with the
/// protocol's domain types it builds on, `governor-proto` without its `grpc` feature), log
/// parsing and the progress signal.
pub(crate) const PURE_CRATES: [&str; 4] = [
    "governor-policy",
    "governor-placement",
    "governor-planner",
    "governor-progress",
];

/// Dependencies a pure crate must not have, each with its family (`tokio-util`, `aya-obj`).
pub(crate) const FORBIDDEN: [&str; 5] = ["tokio", "nix", "libc", "inotify", "aya"];

/// The forbidden dependencies in `tree`, the output of `cargo tree -e normal --prefix none`
/// (one `name vX.Y.Z ...` per line), each named once, in order of first appearance.
fn forbidden_dependencies(tree: &str) -> Vec<&str> {
    let mut found: Vec<&str> = Vec::new();
    for name in tree.lines().filter_map(|l| l.split_whitespace().next()) {
        let forbidden = FORBIDDEN.iter().any(|f| {
            name.strip_prefix(f)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
        });
        if forbidden && !found.contains(&name) {
            found.push(name);
        }
    }
    found
}

/// The line that fails the check for `krate` given its dependency tree, or `None` when the
/// tree is clean.
fn verdict(krate: &str, tree: &str) -> Option<String> {
    let found = forbidden_dependencies(tree);
    (!found.is_empty()).then(|| {
        format!(
            "{krate} is a pure crate but depends on {} (see `cargo tree -p {krate} -e normal -i {}`)",
            found.join(", "),
            found[0]
        )
    })
}

/// Fails, one line per crate, when a pure crate's normal dependencies (transitively) include a
/// forbidden one.
pub(crate) fn check() -> Result<()> {
    let mut failures = Vec::new();
    for krate in PURE_CRATES {
        let tree = cmd::output(
            cmd::cargo().args(["tree", "-p", krate, "-e", "normal", "--prefix", "none"]),
        )?;
        match verdict(krate, &tree) {
            Some(line) => failures.push(line),
            None => eprintln!("  {krate}: none of {}", FORBIDDEN.join(", ")),
        }
    }
    if !failures.is_empty() {
        bail!(
            "pure crates with impure dependencies:\n  {}",
            failures.join("\n  ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLEAN: &str = "governor-progress v0.1.0 (/src/governor-progress)
governor-policy v0.1.0 (/src/governor-policy)
serde v1.0.229
serde_derive v1.0.229 (proc-macro)
serde v1.0.229 (*)
";

    #[test]
    fn a_clean_tree_passes() {
        assert_eq!(forbidden_dependencies(CLEAN), Vec::<&str>::new());
        assert_eq!(verdict("governor-progress", CLEAN), None);
    }

    #[test]
    fn forbidden_crates_and_their_families_are_named_once() {
        let tree = "governor-progress v0.1.0 (/src/governor-progress)
tokio v1.48.0
libc v0.2.177
tokio-macros v2.6.0 (proc-macro)
libc v0.2.177 (*)
inotify v0.11.0
inotify-sys v0.1.5
";
        assert_eq!(
            forbidden_dependencies(tree),
            ["tokio", "libc", "tokio-macros", "inotify", "inotify-sys"]
        );
        assert_eq!(
            verdict("governor-progress", tree).unwrap(),
            "governor-progress is a pure crate but depends on tokio, libc, tokio-macros, \
             inotify, inotify-sys (see `cargo tree -p governor-progress -e normal -i tokio`)"
        );
    }

    #[test]
    fn names_that_only_start_alike_are_not_forbidden() {
        let tree = "governor-placement v0.1.0 (/src/governor-placement)
nixpkgs-fmt v1.0.0
libcst v1.0.0
ayatana v0.1.0
aya-obj v0.2.1
nix v0.31.0
";
        assert_eq!(forbidden_dependencies(tree), ["aya-obj", "nix"]);
    }
}
