//! The programs themselves (compiled only for the BPF target; see the crate doc).

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_smp_processor_id,
        bpf_probe_read_kernel,
    },
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{HashMap, PerCpuArray, PerCpuHashMap},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use aya_log_ebpf::{debug, warn};
use governor_common::{
    CONFIG_TRACK_RUN_QUEUE_WAIT, CgroupCpuStats, MAX_CGROUPS, PENDING_SLOTS, PendingCharge,
    ProgramConfig, ProgramCounters, RunningTask,
};

/// Filled in by the loader (`EbpfLoader::override_global`) before the program is verified.
#[unsafe(no_mangle)]
static CONFIG: ProgramConfig = ProgramConfig::zeroed();

#[map]
static CGROUP_CPU: PerCpuHashMap<u64, CgroupCpuStats> =
    PerCpuHashMap::with_max_entries(MAX_CGROUPS, 0);

#[map]
static RUNNING: PerCpuArray<RunningTask> = PerCpuArray::with_max_entries(1, 0);

#[map]
static CGROUP_PARENT: HashMap<u64, u64> = HashMap::with_max_entries(MAX_CGROUPS, 0);

#[map]
static COUNTERS: PerCpuArray<ProgramCounters> = PerCpuArray::with_max_entries(1, 0);

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

/// How the program reads a field of a kernel object from a pointer it was given.
trait KernelMemory {
    /// Whether reads are plain loads (then cheaper than the helpers that give the same answer
    /// for the current task).
    const PLAIN_LOADS: bool;

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
    const PLAIN_LOADS: bool = false;

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
    const PLAIN_LOADS: bool = true;

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

/// `task->se.sum_exec_runtime` and `task->sched_info.run_delay` (0 when not tracked).
#[inline(always)]
unsafe fn task_totals<M: KernelMemory>(task: *const u8, track_wait: bool) -> Option<(u64, u64)> {
    // SAFETY: as above.
    unsafe {
        let runtime = M::read::<u64>(task, config!(task_sum_exec_runtime))?;
        let delay = if track_wait {
            M::read::<u64>(task, config!(task_run_delay))?
        } else {
            0
        };
        Some((runtime, delay))
    }
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

/// `kn->parent->id`: the id of the parent of the cgroup whose kernfs node is `node` (0 for the
/// root).
#[inline(always)]
unsafe fn parent_cgroup_id<M: KernelMemory>(node: *const u8) -> Option<u64> {
    // SAFETY: `node` is a cgroup's kernfs node; its `parent` field holds the parent's node.
    unsafe {
        let parent: *const u8 = M::read(node, config!(kernfs_node_parent))?;
        if parent.is_null() {
            return Some(0);
        }
        M::read::<u64>(parent, config!(kernfs_node_id))
    }
}

/// The cgroup v2 id of `prev` (the current task), and its kernfs node when it was read on the
/// way: with typed arguments by plain loads (`prev->cgroups->dfl_cgrp->kn->id`), otherwise from
/// `bpf_get_current_cgroup_id` (the same chain, cheaper than probe reads).
#[inline(always)]
fn current_cgroup_id<M: KernelMemory>(prev: *const u8) -> (u64, Option<*const u8>) {
    if M::PLAIN_LOADS
        // SAFETY: `prev` is the tracepoint's `struct task_struct *prev`.
        && let Some(node) = unsafe { task_cgroup_node::<M>(prev) }
        // SAFETY: `node` is the cgroup's kernfs node.
        && let Some(id) = unsafe { M::read::<u64>(node, config!(kernfs_node_id)) }
        && id != 0
    {
        return (id, Some(node));
    }
    // SAFETY: helper without preconditions.
    (unsafe { bpf_get_current_cgroup_id() }, None)
}

/// The id of the parent of `prev`'s cgroup (0 for the root or if unreadable).
#[inline(always)]
fn current_parent_id<M: KernelMemory>(prev: *const u8, node: Option<*const u8>) -> u64 {
    // SAFETY: `prev` is the tracepoint's `struct task_struct *prev`, `node` its cgroup's node.
    let node = node.or_else(|| unsafe { task_cgroup_node::<M>(prev) });
    match node {
        // SAFETY: as above.
        Some(node) => unsafe { parent_cgroup_id::<M>(node) }.unwrap_or(0),
        None => 0,
    }
}

#[inline(always)]
fn counters() -> Option<&'static mut ProgramCounters> {
    // SAFETY: per-CPU slot; the program runs with preemption and interrupts disabled (in the
    // scheduler), so nothing else touches this CPU's slot meanwhile.
    COUNTERS.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// Adds `add` to this CPU's figures of `cgroup_id` in the hash map, creating the entry (and
/// recording the cgroup's parent) on first use.
#[inline(never)]
fn flush<C: EbpfContext>(ctx: &C, cgroup_id: u64, parent_id: u64, add: &CgroupCpuStats) {
    for _attempt in 0..2 {
        if let Some(stats) = CGROUP_CPU.get_ptr_mut(cgroup_id) {
            // SAFETY: per-CPU value of an entry that exists; see `counters`.
            let stats = unsafe { &mut *stats };
            *stats = stats.add(*add);
            return;
        }
        match CGROUP_CPU.insert(cgroup_id, *add, u64::from(BPF_NOEXIST)) {
            Ok(()) => {
                let _ = CGROUP_PARENT.insert(cgroup_id, parent_id, 0);
                return;
            }
            // Another CPU created the entry between the lookup and the insert: add to it.
            Err(-17) => continue, // EEXIST
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

/// Charges `add` to the current task's cgroup: summed in the CPU's pending charges of that
/// cgroup; a cgroup that has none takes a free slot, or the slot of the cgroup charged longest
/// ago (round robin), whose charges are written to the hash map first.
#[inline(always)]
fn charge<C: EbpfContext, M: KernelMemory>(
    ctx: &C,
    slot: &mut RunningTask,
    prev: *const u8,
    add: CgroupCpuStats,
) {
    let (cgroup_id, node) = current_cgroup_id::<M>(prev);
    let mut free = PENDING_SLOTS;
    for i in 0..PENDING_SLOTS {
        let p = &mut slot.pending[i];
        if p.cgroup_id == cgroup_id {
            p.stats = p.stats.add(add);
            return;
        }
        if p.cgroup_id == 0 && free == PENDING_SLOTS {
            free = i;
        }
    }
    let target = if free < PENDING_SLOTS {
        free
    } else {
        let victim = slot.victim as usize & (PENDING_SLOTS - 1);
        slot.victim = slot.victim.wrapping_add(1);
        let evicted = slot.pending[victim];
        flush(ctx, evicted.cgroup_id, evicted.parent_id, &evicted.stats);
        victim
    };
    slot.pending[target & (PENDING_SLOTS - 1)] = PendingCharge {
        cgroup_id,
        parent_id: current_parent_id::<M>(prev, node),
        stats: add,
    };
}

#[inline(always)]
fn on_switch<C: EbpfContext, M: KernelMemory>(ctx: &C, prev: *const u8, next: *const u8) {
    let Some(slot) = RUNNING.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot; see `counters`.
    let slot = unsafe { &mut *slot };
    let track_wait = config!(flags) & CONFIG_TRACK_RUN_QUEUE_WAIT != 0;

    if slot.seen == 0 {
        slot.seen = 1;
        debug!(
            ctx,
            "accounting started on cpu {}",
            // SAFETY: helper without preconditions.
            unsafe { bpf_get_smp_processor_id() }
        );
    }

    let prev_pid = if M::PLAIN_LOADS {
        // SAFETY: `prev` is the tracepoint's `struct task_struct *prev`.
        unsafe { task_pid::<M>(prev) }.unwrap_or(0)
    } else {
        bpf_get_current_pid_tgid() as u32
    };
    if prev_pid != 0 {
        let mut add = CgroupCpuStats {
            on_cpu_ns: 0,
            run_queue_wait_ns: 0,
            context_switches: 1,
        };
        if slot.pid == prev_pid {
            // SAFETY: as above.
            match unsafe { task_totals::<M>(prev, track_wait) } {
                Some((runtime, delay)) => {
                    add.on_cpu_ns = runtime.saturating_sub(slot.start_runtime_ns);
                    add.run_queue_wait_ns = delay.saturating_sub(slot.start_run_delay_ns);
                }
                None => {
                    if let Some(c) = counters() {
                        c.kernel_read_failed += 1;
                    }
                }
            }
        } else if let Some(c) = counters() {
            // The first switch seen on this CPU: prev's slice started before we were attached.
            c.unknown_slice += 1;
        }
        charge::<C, M>(ctx, slot, prev, add);
    }

    // SAFETY: `next` is the tracepoint's `struct task_struct *next`.
    let next_pid = unsafe { task_pid::<M>(next) }.unwrap_or(0);
    let (runtime, delay) = if next_pid != 0 {
        // SAFETY: as above.
        unsafe { task_totals::<M>(next, track_wait) }.unwrap_or((0, 0))
    } else {
        (0, 0)
    };
    slot.start_runtime_ns = runtime;
    slot.start_run_delay_ns = delay;
    slot.pid = next_pid;
}

// sched_switch: TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next, ...)

#[btf_tracepoint(function = "sched_switch")]
pub fn gov_switch_btf(ctx: BtfTracePointContext) -> i32 {
    let prev: *const u8 = ctx.arg(1);
    let next: *const u8 = ctx.arg(2);
    on_switch::<_, BtfLoad>(&ctx, prev, next);
    0
}

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn gov_switch_raw(ctx: RawTracePointContext) -> i32 {
    let prev: *const u8 = ctx.arg(1);
    let next: *const u8 = ctx.arg(2);
    on_switch::<_, ProbeRead>(&ctx, prev, next);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}

/// The program uses GPL-only helpers (`bpf_probe_read_kernel`).
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
