//! Types shared between the eBPF programs (`governor-ebpf`) and the daemon (`governor`).
//!
//! Every type here is `#[repr(C)]`, has no `bool` and no implicit padding, so the kernel and
//! userspace agree on its layout byte for byte. `aya::Pod` is implemented behind the `user` feature.
#![no_std]

/// Per-cgroup CPU accounting kept by the `sched_switch` program, one value per CPU.
///
/// Keyed by the cgroup v2 id (the inode number of the cgroup's directory).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupCpuStats {
    /// Nanoseconds tasks of this cgroup spent on this CPU, charged when they are switched out.
    pub on_cpu_ns: u64,
    /// Nanoseconds tasks of this cgroup were runnable but waiting for this CPU.
    pub run_queue_wait_ns: u64,
    /// Number of times a task of this cgroup was switched out on this CPU.
    pub context_switches: u64,
}

/// What the program remembers about the task currently running on a CPU (one entry per CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunningTask {
    /// Kernel time (`bpf_ktime_get_ns`) when the task was switched in.
    pub since_ns: u64,
    /// Cgroup id of the task.
    pub cgroup_id: u64,
    /// Thread id of the task (0 when the CPU is idle).
    pub pid: u32,
    /// Explicit padding so the layout has no implicit holes.
    pub _pad: u32,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: both types are `repr(C)`, consist only of integers and have no implicit padding, so
    // every bit pattern is a valid value.
    unsafe impl aya::Pod for super::CgroupCpuStats {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RunningTask {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_padding() {
        assert_eq!(size_of::<CgroupCpuStats>(), 3 * 8);
        assert_eq!(size_of::<RunningTask>(), 8 + 8 + 4 + 4);
    }
}
