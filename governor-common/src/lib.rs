//! Types shared between the eBPF programs (`governor-ebpf`) and the daemon (`governor`).
//!
//! Every type here is `#[repr(C)]`, has no `bool` and no implicit padding, so the kernel and
//! userspace agree on its layout byte for byte. `aya::Pod` is implemented behind the `user` feature.
//!
//! The accounting programs keep three maps and read one global:
//! - [`CGROUP_CPU_MAP`]: per-CPU hash, cgroup v2 id -> [`CgroupCpuStats`];
//! - [`RUNNING_MAP`]: per-CPU array of one [`RunningTask`], the task on that CPU right now (so
//!   userspace can add the slice a still-running task has not been charged for yet);
//! - [`RUNNABLE_SINCE_MAP`]: LRU hash, thread id -> time it became runnable (run-queue wait);
//! - [`CGROUP_PARENT_MAP`]: hash, cgroup id -> parent cgroup id (written with each new entry);
//! - [`COUNTERS_MAP`]: per-CPU array of one [`ProgramCounters`] (things that went wrong);
//! - [`CONFIG_GLOBAL`]: a read-only [`ProgramConfig`] the loader fills in before loading.
#![no_std]

/// Name of the per-CPU hash map cgroup id -> [`CgroupCpuStats`].
pub const CGROUP_CPU_MAP: &str = "CGROUP_CPU";
/// Name of the per-CPU array holding the [`RunningTask`] of each CPU.
pub const RUNNING_MAP: &str = "RUNNING";
/// Name of the LRU hash map thread id -> `bpf_ktime_get_ns` when it became runnable.
pub const RUNNABLE_SINCE_MAP: &str = "RUNNABLE_SINCE";
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
/// Capacity of [`RUNNABLE_SINCE_MAP`]: threads waiting on a run queue at once. It is an LRU map,
/// so a thread that exits while runnable is eventually evicted instead of leaking.
pub const MAX_RUNNABLE_THREADS: u32 = 65_536;

/// Program names (as the kernel shows them; at most 15 bytes). `_btf` programs are BTF
/// tracepoints (`tp_btf`), `_raw` ones raw tracepoints; the loader attaches one family.
pub mod program {
    /// `sched_switch`, BTF tracepoint.
    pub const SWITCH_BTF: &str = "gov_switch_btf";
    /// `sched_switch`, raw tracepoint.
    pub const SWITCH_RAW: &str = "gov_switch_raw";
    /// `sched_wakeup`, BTF tracepoint.
    pub const WAKEUP_BTF: &str = "gov_wakeup_btf";
    /// `sched_wakeup`, raw tracepoint.
    pub const WAKEUP_RAW: &str = "gov_wakeup_raw";
    /// `sched_wakeup_new`, BTF tracepoint.
    pub const WAKEUP_NEW_BTF: &str = "gov_wknew_btf";
    /// `sched_wakeup_new`, raw tracepoint.
    pub const WAKEUP_NEW_RAW: &str = "gov_wknew_raw";
}

/// Per-cgroup CPU accounting kept by the `sched_switch` program, one value per CPU.
///
/// Keyed by the cgroup v2 id (the inode number of the cgroup's directory).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupCpuStats {
    /// Nanoseconds tasks of this cgroup spent on this CPU, charged when they are switched out.
    pub on_cpu_ns: u64,
    /// Nanoseconds tasks of this cgroup were runnable but waiting for this CPU (charged on the
    /// CPU that finally ran them).
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

/// What the program remembers about the task currently running on a CPU (one entry per CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunningTask {
    /// Kernel time (`bpf_ktime_get_ns`, CLOCK_MONOTONIC) when the task was switched in; 0 until
    /// the first `sched_switch` seen on this CPU.
    pub since_ns: u64,
    /// Cgroup v2 id of the task (0 when the CPU is idle or the id could not be read).
    pub cgroup_id: u64,
    /// Thread id of the task (0 when the CPU is idle).
    pub pid: u32,
    /// Explicit padding so the layout has no implicit holes.
    pub _pad: u32,
}

/// Things the programs could not do, counted per CPU (userspace reports them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramCounters {
    /// Charges dropped because [`CGROUP_CPU_MAP`] was full.
    pub stats_map_full: u64,
    /// Reads of kernel memory (the next task's pid or cgroup id) that failed.
    pub kernel_read_failed: u64,
}

/// Configuration the loader writes into the programs' read-only `CONFIG` global.
///
/// The offsets come from the running kernel's BTF (`/sys/kernel/btf/vmlinux`): Rust eBPF code
/// gets no CO-RE relocations, so userspace resolves the few fields the programs follow to find
/// the pid and the cgroup id of the task being switched in:
/// `task->pid` and `task->cgroups->dfl_cgrp->kn->id` (what `bpf_get_current_cgroup_id` reads for
/// the current task), and `kn->parent` for the parent's id. The verifier sees them as constants
/// because the map is frozen.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramConfig {
    /// Byte offset of `pid` in `struct task_struct`.
    pub task_pid: u32,
    /// Byte offset of `cgroups` (`struct css_set *`) in `struct task_struct`.
    pub task_cgroups: u32,
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

/// [`ProgramConfig::flags`]: measure run-queue wait (needs the wakeup programs attached).
pub const CONFIG_TRACK_RUN_QUEUE_WAIT: u32 = 1 << 0;
/// [`ProgramConfig::flags`]: `sched_switch` passes `prev_state` as its 4th argument (5.18+),
/// so a task switched out while still runnable can be told apart from one going to sleep.
pub const CONFIG_SWITCH_HAS_PREV_STATE: u32 = 1 << 1;

impl ProgramConfig {
    /// All-zero configuration (the value compiled into the object; the loader overwrites it).
    pub const fn zeroed() -> ProgramConfig {
        ProgramConfig {
            task_pid: 0,
            task_cgroups: 0,
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
        assert_eq!(size_of::<RunningTask>(), 8 + 8 + 4 + 4);
        assert_eq!(size_of::<ProgramCounters>(), 2 * 8);
        assert_eq!(size_of::<ProgramConfig>(), 7 * 4);
        assert_eq!(align_of::<ProgramConfig>(), 4);
    }

    #[test]
    fn program_names_fit_the_kernel_limit() {
        for name in [
            program::SWITCH_BTF,
            program::SWITCH_RAW,
            program::WAKEUP_BTF,
            program::WAKEUP_RAW,
            program::WAKEUP_NEW_BTF,
            program::WAKEUP_NEW_RAW,
        ] {
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
