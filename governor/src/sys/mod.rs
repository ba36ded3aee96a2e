//! Raw system interfaces other than cgroupfs (which only [`crate::cgroup`] writes): every
//! `unsafe` libc call of the daemon outside the eBPF loader lives here.

pub mod proc_events;

/// Make this process a child subreaper (PR_SET_CHILD_SUBREAPER): orphans of the jobs it starts
/// are re-parented to it and reaped, so their pids are freed promptly (CRIU restore needs this).
pub fn become_child_subreaper() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
