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

/// A pidfd for `pid` (`pidfd_open`, Linux 5.3+): it refers to that very process even after its
/// pid is reused, and becomes readable when the process ends, whoever its parent is.
pub fn pidfd_open(pid: u32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let pid = libc::pid_t::try_from(pid).map_err(|_| std::io::Error::other("pid out of range"))?;
    // SAFETY: pidfd_open takes a pid and flags; it returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just returned, owned by no one else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Sends `signal` to the process of a pidfd (`pidfd_send_signal`): never to a process that
/// reused its pid.
pub fn pidfd_send_signal(
    pidfd: std::os::fd::BorrowedFd<'_>,
    signal: nix::sys::signal::Signal,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor, a signal number, no siginfo, no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal as libc::c_int,
            std::ptr::null::<libc::siginfo_t>(),
            0 as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// When the process `pid` started, in clock ticks after boot (`/proc/<pid>/stat`, field 22).
/// With the pid it names one process for good: a reused pid has a later start.
pub fn process_start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces or ')'.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_start_is_read_and_stays_the_same() {
        let me = std::process::id();
        let start = process_start_ticks(me).expect("own start time");
        assert_eq!(process_start_ticks(me), Some(start));
        assert_eq!(process_start_ticks(u32::MAX), None);
    }

    /// Whether `fd` is readable within `timeout_ms`.
    fn readable(fd: std::os::fd::BorrowedFd<'_>, timeout_ms: i32) -> bool {
        use std::os::fd::AsRawFd;
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, timeout_ms) == 1 }
    }

    #[test]
    fn a_pidfd_signals_its_process_and_becomes_readable_when_it_ends() {
        use std::os::fd::AsFd;
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pidfd = pidfd_open(child.id()).expect("pidfd_open");
        assert!(!readable(pidfd.as_fd(), 0), "running");
        pidfd_send_signal(pidfd.as_fd(), nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGTERM)
        );
        assert!(readable(pidfd.as_fd(), 1000), "ended");
    }
}
