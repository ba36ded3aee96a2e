//! Types shared between the eBPF programs (`governor-ebpf`) and the daemon (`governor`).
//!
//! Every type here is `#[repr(C)]`, has no `bool` and no implicit padding, so the kernel and
//! userspace agree on its layout byte for byte. `aya::Pod` is implemented behind the `user` feature.
//!
//! The accounting program keeps four maps and reads one global:
//! - [`CGROUP_CPU_MAP`]: per-CPU hash, cgroup v2 id -> [`CgroupCpuStats`];
//! - [`RUNNING_MAP`]: per-CPU array of one [`RunningTask`]: the task on that CPU right now (so
//!   userspace can add the slice a still-running task has not been charged for yet) and the
//!   charges summed on that CPU but not yet written to [`CGROUP_CPU_MAP`];
//! - [`CGROUP_PARENT_MAP`]: hash, cgroup id -> parent cgroup id (written with each new entry);
//! - [`COUNTERS_MAP`]: per-CPU array of one [`ProgramCounters`] (things that went wrong);
//! - [`CONFIG_GLOBAL`]: a read-only [`ProgramConfig`] the loader fills in before loading.
#![no_std]

/// Name of the per-CPU hash map cgroup id -> [`CgroupCpuStats`].
pub const CGROUP_CPU_MAP: &str = "CGROUP_CPU";
/// Name of the per-CPU array holding the [`RunningTask`] of each CPU.
pub const RUNNING_MAP: &str = "RUNNING";
/// Name of the hash map cgroup id -> parent cgroup id, written when a cgroup's entry in
/// [`CGROUP_CPU_MAP`] is created: it tells userspace where the CPU of a cgroup that was created
/// and removed between two reads belongs.
pub const CGROUP_PARENT_MAP: &str = "CGROUP_PARENT";
/// Name of the per-CPU array holding the [`ProgramCounters`].
pub const COUNTERS_MAP: &str = "COUNTERS";
/// Name of the [`ProgramConfig`] global (in `.rodata`, frozen after load).
pub const CONFIG_GLOBAL: &str = "CONFIG";

/// Capacity of [`CGROUP_CPU_MAP`]: cgroups that can be accounted at once. Entries of removed
/// cgroups are deleted by userspace, so this bounds live cgroups that ran a task, not history.
pub const MAX_CGROUPS: u32 = 16_384;
/// Program names (as the kernel shows them; at most 15 bytes). The loader attaches one.
pub mod program {
    /// `sched_switch`, BTF tracepoint (`tp_btf`): typed arguments, fields read by plain loads.
    pub const SWITCH_BTF: &str = "gov_switch_btf";
    /// `sched_switch`, raw tracepoint (`raw_tp`): fields read with `bpf_probe_read_kernel`.
    pub const SWITCH_RAW: &str = "gov_switch_raw";
}

/// Per-cgroup CPU accounting kept by the `sched_switch` program, one value per CPU.
///
/// Keyed by the cgroup v2 id (the inode number of the cgroup's directory).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupCpuStats {
    /// Nanoseconds tasks of this cgroup spent on this CPU (`se.sum_exec_runtime` deltas),
    /// charged when they are switched out.
    pub on_cpu_ns: u64,
    /// Nanoseconds tasks of this cgroup were runnable but waiting for a CPU
    /// (`sched_info.run_delay` deltas), charged with the slice that ended the wait.
    pub run_queue_wait_ns: u64,
    /// Number of times a task of this cgroup was switched out on this CPU.
    pub context_switches: u64,
}

impl CgroupCpuStats {
    /// Field-wise sum (wrapping: the counters are cumulative and never wrap in practice).
    pub const fn add(self, other: CgroupCpuStats) -> CgroupCpuStats {
        CgroupCpuStats {
            on_cpu_ns: self.on_cpu_ns.wrapping_add(other.on_cpu_ns),
            run_queue_wait_ns: self.run_queue_wait_ns.wrapping_add(other.run_queue_wait_ns),
            context_switches: self.context_switches.wrapping_add(other.context_switches),
        }
    }
}

/// Charges not yet written to [`CGROUP_CPU_MAP`], for one cgroup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingCharge {
    /// The cgroup (0: slot free).
    pub cgroup_id: u64,
    /// Its parent (recorded in [`CGROUP_PARENT_MAP`] with a new entry).
    pub parent_id: u64,
    /// The charges.
    pub stats: CgroupCpuStats,
}

/// Cgroups whose charges a CPU keeps pending at once (a power of two).
pub const PENDING_SLOTS: usize = 8;

/// What the program keeps per CPU (one entry per CPU):
/// - the task on the CPU and its kernel totals when it was switched in: at switch-out the
///   differences are its slice and the run-queue wait that preceded it; userspace adds the slice
///   still in flight from `/proc/<pid>/schedstat` (and places the task in its cgroup from
///   `/proc/<pid>/cgroup`);
/// - charges not yet added to [`CGROUP_CPU_MAP`], for the last [`PENDING_SLOTS`] cgroups charged
///   on this CPU: a hash map update costs more than the rest of the program, and a CPU mostly
///   switches among a few cgroups (a job's threads, idle, a neighbour). A charge to another cgroup
///   writes one of them (round robin) to the map. Userspace adds the pending charges to the map's
///   figures.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunningTask {
    /// `se.sum_exec_runtime` of the task when it was switched in (ns).
    pub start_runtime_ns: u64,
    /// `sched_info.run_delay` of the task when it was switched in (ns); its wait for this slice
    /// is added by the kernel right after the tracepoint, so it is charged at switch-out.
    pub start_run_delay_ns: u64,
    /// Thread id of the task (0 when the CPU is idle).
    pub pid: u32,
    /// 1 once the program has seen a switch on this CPU.
    pub seen: u32,
    /// Next pending slot to write to the map when all are taken.
    pub victim: u32,
    /// Explicit padding so the layout has no implicit holes.
    pub _pad: u32,
    /// Charges not yet in [`CGROUP_CPU_MAP`].
    pub pending: [PendingCharge; PENDING_SLOTS],
}

/// Things the programs could not do, counted per CPU (userspace reports them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramCounters {
    /// Charges dropped because [`CGROUP_CPU_MAP`] was full.
    pub stats_map_full: u64,
    /// Reads of kernel memory (a task's pid, cgroup id or parent cgroup id) that failed.
    pub kernel_read_failed: u64,
    /// Switches of a task the CPU's slot did not describe (the first one on each CPU, and any
    /// the program missed): that slice was not charged.
    pub unknown_slice: u64,
}

/// Configuration the loader writes into the programs' read-only `CONFIG` global.
///
/// The offsets come from the running kernel's BTF (`/sys/kernel/btf/vmlinux`): Rust eBPF code
/// gets no CO-RE relocations, so userspace resolves the few fields the programs read and hands
/// them over as constants (the verifier sees them as such because the map is frozen):
/// - `task->pid`;
/// - `task->se.sum_exec_runtime` and `task->sched_info.run_delay`: the kernel's own on-CPU and
///   run-queue-wait totals of a task (what `cpu.stat` and `/proc/<pid>/schedstat` are made of),
///   up to date for the task switched out when `sched_switch` fires;
/// - `task->cgroups->dfl_cgrp->kn->id` (what `bpf_get_current_cgroup_id` reads) and
///   `kn->parent` for the parent cgroup's id.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramConfig {
    /// Byte offset of `pid` in `struct task_struct`.
    pub task_pid: u32,
    /// Byte offset of `cgroups` (`struct css_set *`) in `struct task_struct`.
    pub task_cgroups: u32,
    /// Byte offset of `se.sum_exec_runtime` (`u64`, ns) in `struct task_struct`.
    pub task_sum_exec_runtime: u32,
    /// Byte offset of `sched_info.run_delay` (`u64`, ns) in `struct task_struct` (used only with
    /// [`CONFIG_TRACK_RUN_QUEUE_WAIT`]).
    pub task_run_delay: u32,
    /// Byte offset of `dfl_cgrp` (`struct cgroup *`) in `struct css_set`.
    pub css_set_dfl_cgrp: u32,
    /// Byte offset of `kn` (`struct kernfs_node *`) in `struct cgroup`.
    pub cgroup_kn: u32,
    /// Byte offset of `id` (`u64`) in `struct kernfs_node`.
    pub kernfs_node_id: u32,
    /// Byte offset of `parent` (`__parent` since 6.15; `struct kernfs_node *`) in
    /// `struct kernfs_node`.
    pub kernfs_node_parent: u32,
    /// `CONFIG_*` bits below.
    pub flags: u32,
}

/// [`ProgramConfig::flags`]: charge run-queue wait (`sched_info.run_delay`; needs
/// CONFIG_SCHED_INFO, which every distribution kernel has).
pub const CONFIG_TRACK_RUN_QUEUE_WAIT: u32 = 1 << 0;

impl ProgramConfig {
    /// All-zero configuration (the value compiled into the object; the loader overwrites it).
    pub const fn zeroed() -> ProgramConfig {
        ProgramConfig {
            task_pid: 0,
            task_cgroups: 0,
            task_sum_exec_runtime: 0,
            task_run_delay: 0,
            css_set_dfl_cgrp: 0,
            cgroup_kn: 0,
            kernfs_node_id: 0,
            kernfs_node_parent: 0,
            flags: 0,
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: every type is `repr(C)`, consists only of integers and has no implicit padding
    // (checked by the layout test below), so every bit pattern is a valid value.
    unsafe impl aya::Pod for super::CgroupCpuStats {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RunningTask {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PendingCharge {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ProgramCounters {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ProgramConfig {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, size_of};

    #[test]
    fn layouts_have_no_padding() {
        assert_eq!(size_of::<CgroupCpuStats>(), 3 * 8);
        assert_eq!(size_of::<PendingCharge>(), 2 * 8 + 3 * 8);
        assert_eq!(
            size_of::<RunningTask>(),
            2 * 8 + 4 * 4 + PENDING_SLOTS * size_of::<PendingCharge>()
        );
        assert!(PENDING_SLOTS.is_power_of_two());
        assert_eq!(size_of::<ProgramCounters>(), 3 * 8);
        assert_eq!(size_of::<ProgramConfig>(), 9 * 4);
        assert_eq!(align_of::<ProgramConfig>(), 4);
    }

    #[test]
    fn program_names_fit_the_kernel_limit() {
        for name in [program::SWITCH_BTF, program::SWITCH_RAW] {
            assert!(
                name.len() <= 15,
                "{name} is longer than BPF_OBJ_NAME_LEN - 1"
            );
        }
    }

    #[test]
    fn stats_add_is_field_wise() {
        let a = CgroupCpuStats {
            on_cpu_ns: 1,
            run_queue_wait_ns: 2,
            context_switches: 3,
        };
        assert_eq!(
            a.add(a),
            CgroupCpuStats {
                on_cpu_ns: 2,
                run_queue_wait_ns: 4,
                context_switches: 6
            }
        );
    }
}
