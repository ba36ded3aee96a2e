//! eBPF programs of the governor: per-cgroup CPU accounting on `sched_switch`.
//! (Filled in by the eBPF accounting work; this stub keeps the workspace layout complete.)
#![no_std]
#![no_main]

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}
