//! eBPF program of the governor: per-cgroup CPU accounting on `sched_switch`.
//!
//! The kernel already keeps, per task, exactly the figures we want: `se.sum_exec_runtime` (time
//! on a CPU, what `cpu.stat usage_usec` is made of) and `sched_info.run_delay` (time runnable but
//! waiting for a CPU, the second field of `/proc/<pid>/schedstat`). When `sched_switch` fires
//! both are up to date for the task switched out. So on every context switch on a CPU:
//! 1. the task switched out (`prev`, still `current`) is charged the growth of its two totals
//!    since it was switched in on this CPU (remembered in a per-CPU slot), plus one context
//!    switch, under its cgroup v2 id in a per-CPU hash map; the idle task (pid 0) is skipped.
//!    Charges are summed per CPU for the last few cgroups charged there and written to the hash
//!    map when another cgroup needs the room (the update is the costliest step);
//! 2. the task switched in (`next`) is remembered in the slot: its pid and its two totals.
//!
//! No clock is read and no other tracepoint is needed: the run-queue wait that ends with a
//! switch-in is added to `run_delay` by the kernel right after this tracepoint, so it shows up
//! in the difference charged at that task's switch-out. Userspace adds the slice still in flight
//! on each CPU from `/proc/<pid>/schedstat` (a busy job that is never switched out would
//! otherwise look idle).
//!
//! The program exists twice: a BTF tracepoint (`tp_btf`, typed arguments: the fields are plain
//! loads the verifier checks against BTF) and a raw tracepoint (untyped arguments: the fields are
//! read with `bpf_probe_read_kernel`, the current task's cgroup through a helper). The loader
//! attaches the BTF one where the kernel accepts it and the raw one otherwise. Field offsets
//! come from the `CONFIG` global the loader fills in from the kernel's BTF (Rust eBPF code gets
//! no CO-RE relocations).
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

// Built for the host (`cargo build --workspace`, clippy, rust-analyzer) the crate is an empty
// binary: the programs, their panic handler and their license section exist only for BPF, so a
// host build no longer collides with std's `panic_impl`. The daemon embeds the BPF build.
// Its entry points are `pub` for the loader, which finds them by symbol name, not by path.
#[cfg(target_arch = "bpf")]
#[allow(unreachable_pub)]
mod program;

#[cfg(not(target_arch = "bpf"))]
fn main() {}
