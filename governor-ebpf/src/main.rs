//! eBPF programs of the governor: per-cgroup CPU accounting on `sched_switch`.
//!
//! On every context switch on a CPU:
//! 1. the task switched out (`prev`, which is still `current`) is charged the time since it was
//!    switched in, under its cgroup v2 id (`bpf_get_current_cgroup_id`), in a per-CPU hash map;
//!    the idle task (pid 0) is never charged;
//! 2. if `prev` stays runnable (preempted), it joins the run queue: its thread id is stamped with
//!    the time, so the wait until it runs again can be measured;
//! 3. the task switched in (`next`) is remembered in a per-CPU slot with the time, its pid and its
//!    cgroup id, so userspace can add the slice of a task that has been running since (a busy job
//!    that is never switched out would otherwise look idle), and if it was waiting on a run queue
//!    since a wakeup or a preemption, that wait is charged to its cgroup.
//!
//! `sched_wakeup` / `sched_wakeup_new` stamp a task that becomes runnable.
//!
//! Each program exists twice: a BTF tracepoint (`tp_btf`, typed arguments: the fields of `next`
//! are plain loads the verifier checks against BTF) and a raw tracepoint (untyped arguments: the
//! fields are read with `bpf_probe_read_kernel`). The loader attaches the BTF family where the
//! kernel accepts it and the raw family otherwise. Field offsets come from the `CONFIG` global
//! the loader fills in from the kernel's BTF (Rust eBPF code gets no CO-RE relocations).
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel,
    },
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{HashMap, LruHashMap, PerCpuArray, PerCpuHashMap},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use aya_log_ebpf::{debug, warn};
use governor_common::{
    CONFIG_SWITCH_HAS_PREV_STATE, CONFIG_TRACK_RUN_QUEUE_WAIT, CgroupCpuStats, MAX_CGROUPS,
    MAX_RUNNABLE_THREADS, ProgramConfig, ProgramCounters, RunningTask,
};

/// Filled in by the loader (`EbpfLoader::set_global`) before the programs are verified.
#[unsafe(no_mangle)]
static CONFIG: ProgramConfig = ProgramConfig::zeroed();

#[map]
static CGROUP_CPU: PerCpuHashMap<u64, CgroupCpuStats> =
    PerCpuHashMap::with_max_entries(MAX_CGROUPS, 0);

#[map]
static RUNNING: PerCpuArray<RunningTask> = PerCpuArray::with_max_entries(1, 0);

#[map]
static RUNNABLE_SINCE: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_RUNNABLE_THREADS, 0);

#[map]
static CGROUP_PARENT: HashMap<u64, u64> = HashMap::with_max_entries(MAX_CGROUPS, 0);

#[map]
static COUNTERS: PerCpuArray<ProgramCounters> = PerCpuArray::with_max_entries(1, 0);

/// `TASK_RUNNING`: the `prev_state` of a task that stays on the run queue.
const TASK_RUNNING: u64 = 0;

/// Reads a `u32` field of the configuration; a volatile load so that the value the loader wrote
/// is used (the compiler would otherwise fold the zero it was compiled with).
macro_rules! config {
    ($field:ident) => {
        read_config(&raw const CONFIG.$field)
    };
}

#[inline(always)]
fn read_config(field: *const u32) -> u32 {
    // SAFETY: `field` points into the `CONFIG` static.
    unsafe { core::ptr::read_volatile(field) }
}

/// How the programs read a field of a kernel object from a pointer they were given.
trait KernelMemory {
    /// Reads a `T` at `base + offset`; `None` when the read faults.
    ///
    /// # Safety
    /// `base` must be a kernel pointer the program received (it is never dereferenced by Rust
    /// code outside what the verifier checks).
    unsafe fn read<T: Copy>(base: *const u8, offset: u32) -> Option<T>;
}

/// Raw tracepoints: arguments are untyped, reads go through `bpf_probe_read_kernel`.
struct ProbeRead;

impl KernelMemory for ProbeRead {
    #[inline(always)]
    unsafe fn read<T: Copy>(base: *const u8, offset: u32) -> Option<T> {
        // SAFETY: the helper copies with fault handling; the pointer is only an address here.
        unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize).cast::<T>()).ok() }
    }
}

/// BTF tracepoints: arguments are typed kernel pointers and the verifier allows direct loads at
/// offsets that match a field of the type (faults read as zero).
struct BtfLoad;

impl KernelMemory for BtfLoad {
    #[inline(always)]
    unsafe fn read<T: Copy>(base: *const u8, offset: u32) -> Option<T> {
        // SAFETY: the verifier checks this load against the kernel's BTF and turns it into a
        // fault-tolerant load (PROBE_MEM).
        Some(unsafe { core::ptr::read_volatile(base.wrapping_add(offset as usize).cast::<T>()) })
    }
}

/// `task->pid` (the thread id).
#[inline(always)]
unsafe fn task_pid<M: KernelMemory>(task: *const u8) -> Option<u32> {
    // SAFETY: `task` is a `struct task_struct *` from the tracepoint.
    unsafe { M::read::<u32>(task, config!(task_pid)) }
}

/// `task->cgroups->dfl_cgrp->kn`: the kernfs node of the cgroup v2 directory of `task`.
#[inline(always)]
unsafe fn task_cgroup_node<M: KernelMemory>(task: *const u8) -> Option<*const u8> {
    // SAFETY: each pointer is the value of the field the offset names, read from the kernel.
    unsafe {
        let css_set: *const u8 = M::read(task, config!(task_cgroups))?;
        let cgroup: *const u8 = M::read(css_set, config!(css_set_dfl_cgrp))?;
        M::read(cgroup, config!(cgroup_kn))
    }
}

/// `task->cgroups->dfl_cgrp->kn->id`: the cgroup v2 id of `task`.
#[inline(always)]
unsafe fn task_cgroup_id<M: KernelMemory>(task: *const u8) -> Option<u64> {
    // SAFETY: as above.
    unsafe { M::read::<u64>(task_cgroup_node::<M>(task)?, config!(kernfs_node_id)) }
}

/// `kn->parent->id` of the cgroup of `task` (0 for the root).
#[inline(always)]
unsafe fn task_parent_cgroup_id(task: *const u8) -> Option<u64> {
    // SAFETY: as above; `bpf_probe_read_kernel` tolerates any address.
    unsafe {
        let node = task_cgroup_node::<ProbeRead>(task)?;
        let parent: *const u8 = ProbeRead::read(node, config!(kernfs_node_parent))?;
        if parent.is_null() {
            return Some(0);
        }
        ProbeRead::read::<u64>(parent, config!(kernfs_node_id))
    }
}

#[inline(always)]
fn counters() -> Option<&'static mut ProgramCounters> {
    // SAFETY: per-CPU slot; the programs run with preemption (and, in the scheduler, interrupts)
    // disabled, so nothing else touches this CPU's slot meanwhile.
    COUNTERS.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// Adds to the per-CPU stats of `cgroup_id`, the cgroup of `task` (null: the current task),
/// creating the entry on first use; a new entry also records the cgroup's parent.
#[inline(always)]
fn charge<C: EbpfContext>(ctx: &C, task: *const u8, cgroup_id: u64, add: CgroupCpuStats) {
    for _attempt in 0..2 {
        if let Some(stats) = CGROUP_CPU.get_ptr_mut(cgroup_id) {
            // SAFETY: per-CPU value of an entry that exists; see `counters`.
            let stats = unsafe { &mut *stats };
            *stats = stats.add(add);
            return;
        }
        match CGROUP_CPU.insert(cgroup_id, add, u64::from(BPF_NOEXIST)) {
            Ok(()) => {
                record_parent(task, cgroup_id);
                return;
            }
            // Another CPU created the entry between the lookup and the insert: add to it.
            Err(e) if e == -17 => continue, // EEXIST
            Err(_) => {
                if let Some(c) = counters() {
                    if c.stats_map_full == 0 {
                        warn!(
                            ctx,
                            "cgroup stats map full ({} entries): CPU of cgroup {} is not accounted on this CPU",
                            MAX_CGROUPS,
                            cgroup_id
                        );
                    }
                    c.stats_map_full += 1;
                }
                return;
            }
        }
    }
}

/// Cold path (a cgroup's first charge): remember its parent. `task` is the task whose cgroup it
/// is, null for the current task. (A BPF subprogram: its arguments must be plain scalars, every
/// register the caller passes must be initialised.)
#[inline(never)]
fn record_parent(task: *const u8, cgroup_id: u64) {
    let task = if task.is_null() {
        // SAFETY: helper without preconditions.
        (unsafe { bpf_get_current_task() }) as *const u8
    } else {
        task
    };
    // SAFETY: `task` is a task_struct pointer; the reads are fault tolerant.
    match unsafe { task_parent_cgroup_id(task) } {
        Some(parent) => {
            let _ = CGROUP_PARENT.insert(cgroup_id, parent, 0);
        }
        None => {
            if let Some(c) = counters() {
                c.kernel_read_failed += 1;
            }
        }
    }
}

#[inline(always)]
fn on_switch<C: EbpfContext, M: KernelMemory>(
    ctx: &C,
    preempt: bool,
    next: *const u8,
    prev_state: u64,
) {
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(running) = RUNNING.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot; see `counters`.
    let running = unsafe { &mut *running };
    let flags = config!(flags);
    let track_wait = flags & CONFIG_TRACK_RUN_QUEUE_WAIT != 0;

    if running.since_ns == 0 {
        debug!(
            ctx,
            "accounting started on cpu {}",
            // SAFETY: helper without preconditions.
            unsafe { bpf_get_smp_processor_id() }
        );
    }

    let prev_pid = bpf_get_current_pid_tgid() as u32;
    if prev_pid != 0 {
        // Charge `prev` (still `current` in this tracepoint) for its slice. The first switch seen
        // on a CPU has no start time: that partial slice is not charged.
        let on_cpu_ns = if running.since_ns != 0 {
            now.saturating_sub(running.since_ns)
        } else {
            0
        };
        charge(
            ctx,
            core::ptr::null(),
            // SAFETY: helper without preconditions.
            unsafe { bpf_get_current_cgroup_id() },
            CgroupCpuStats {
                on_cpu_ns,
                run_queue_wait_ns: 0,
                context_switches: 1,
            },
        );
        // Preempted (or, where the kernel says, switched out in TASK_RUNNING): it stays on the
        // run queue and starts waiting now.
        let still_runnable =
            preempt || (flags & CONFIG_SWITCH_HAS_PREV_STATE != 0 && prev_state == TASK_RUNNING);
        if track_wait && still_runnable {
            let _ = RUNNABLE_SINCE.insert(prev_pid, now, 0);
        }
    }

    // SAFETY: `next` is the tracepoint's `struct task_struct *next`.
    let next_pid = unsafe { task_pid::<M>(next) };
    let mut next_cgroup = 0;
    match next_pid {
        Some(0) => {}
        Some(pid) => {
            // SAFETY: as above.
            match unsafe { task_cgroup_id::<M>(next) } {
                Some(id) => next_cgroup = id,
                None => {
                    if let Some(c) = counters() {
                        c.kernel_read_failed += 1;
                    }
                }
            }
            if track_wait {
                // SAFETY: value of an LRU entry, copied out at once.
                if let Some(&since) = unsafe { RUNNABLE_SINCE.get(pid) } {
                    let _ = RUNNABLE_SINCE.remove(pid);
                    if next_cgroup != 0 {
                        charge(
                            ctx,
                            next,
                            next_cgroup,
                            CgroupCpuStats {
                                on_cpu_ns: 0,
                                run_queue_wait_ns: now.saturating_sub(since),
                                context_switches: 0,
                            },
                        );
                    }
                }
            }
        }
        None => {
            if let Some(c) = counters() {
                c.kernel_read_failed += 1;
            }
        }
    }
    running.since_ns = now;
    running.cgroup_id = next_cgroup;
    running.pid = next_pid.unwrap_or(0);
}

#[inline(always)]
fn on_wakeup<M: KernelMemory>(task: *const u8) {
    // SAFETY: `task` is the tracepoint's `struct task_struct *p`.
    if let Some(pid) = unsafe { task_pid::<M>(task) }
        && pid != 0
    {
        // SAFETY: helper without preconditions.
        let now = unsafe { bpf_ktime_get_ns() };
        let _ = RUNNABLE_SINCE.insert(pid, now, 0);
    }
}

// sched_switch: TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next,
//                        unsigned int prev_state)   (prev_state since 5.18)

#[btf_tracepoint(function = "sched_switch")]
pub fn gov_switch_btf(ctx: BtfTracePointContext) -> i32 {
    let preempt: u64 = ctx.arg(0);
    let next: *const u8 = ctx.arg(2);
    let prev_state: u64 = if config!(flags) & CONFIG_SWITCH_HAS_PREV_STATE != 0 {
        ctx.arg::<u64>(3) & 0xffff_ffff
    } else {
        0
    };
    on_switch::<_, BtfLoad>(&ctx, preempt & 0xff != 0, next, prev_state);
    0
}

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn gov_switch_raw(ctx: RawTracePointContext) -> i32 {
    let preempt: u64 = ctx.arg(0);
    let next: *const u8 = ctx.arg(2);
    let prev_state: u64 = if config!(flags) & CONFIG_SWITCH_HAS_PREV_STATE != 0 {
        ctx.arg::<u64>(3) & 0xffff_ffff
    } else {
        0
    };
    on_switch::<_, ProbeRead>(&ctx, preempt & 0xff != 0, next, prev_state);
    0
}

// sched_wakeup, sched_wakeup_new: TP_PROTO(struct task_struct *p)

#[btf_tracepoint(function = "sched_wakeup")]
pub fn gov_wakeup_btf(ctx: BtfTracePointContext) -> i32 {
    on_wakeup::<BtfLoad>(ctx.arg(0));
    0
}

#[raw_tracepoint(tracepoint = "sched_wakeup")]
pub fn gov_wakeup_raw(ctx: RawTracePointContext) -> i32 {
    on_wakeup::<ProbeRead>(ctx.arg(0));
    0
}

#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn gov_wknew_btf(ctx: BtfTracePointContext) -> i32 {
    on_wakeup::<BtfLoad>(ctx.arg(0));
    0
}

#[raw_tracepoint(tracepoint = "sched_wakeup_new")]
pub fn gov_wknew_raw(ctx: RawTracePointContext) -> i32 {
    on_wakeup::<ProbeRead>(ctx.arg(0));
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}

/// The programs use GPL-only helpers (`bpf_probe_read_kernel`, `bpf_ktime_get_ns` in tracing).
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
