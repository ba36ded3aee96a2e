//! The test bed both chores binaries stand on: `cargo xtask` (set-up, tests, VM tests, fuzzing,
//! the demo) and `goveval` (the evaluation: `governor-eval`).
//!
//! - [`cmd`]: running commands with their command line echoed, the project's paths (workspace
//!   root, target directory), the `cargo` and nightly commands the chores run, project-local
//!   Python environments;
//! - [`setup`]: `cargo xtask setup`, installing what the project needs (eBPF tools, Debian
//!   packages, virtme-ng, the VM kernel), idempotently; the benchmarks run it first too;
//! - [`vm`]: booting a virtme-ng guest with a script and following its log.
//!
//! Why a crate of its own: the evaluation left xtask for `governor-eval` (issue 31), but it needs
//! these helpers, and xtask needs the evaluation (the demo runs the real-job benchmark's jobs,
//! and `cargo xtask bench-*` forwards to it). A library target of xtask that `governor-eval`
//! depended on would make a cycle between the two packages, which cargo refuses; so the
//! helpers both use live here, below both:
//!
//! ```text
//! xtask ──> governor-eval ──> governor-testbed
//!   └───────────────────────────────^
//! ```
#![forbid(unsafe_code)]

pub mod cmd;
pub mod setup;
pub mod vm;
