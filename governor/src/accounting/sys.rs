//! The raw system calls of CPU accounting (everything else goes through aya or std).
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// One CPU's `CgroupCpuStats` as the kernel copied it out of a per-CPU map (`bytes` holds at
/// least the struct's size: per-CPU values are padded to 8 bytes).
pub(super) fn read_cpu_stats(bytes: &[u8]) -> governor_common::CgroupCpuStats {
    assert!(
        bytes.len() >= size_of::<governor_common::CgroupCpuStats>(),
        "a per-CPU value shorter than CgroupCpuStats"
    );
    // SAFETY: `bytes` holds at least `size_of::<CgroupCpuStats>()` bytes (checked above), and
    // every bit pattern is a valid `CgroupCpuStats` (plain `u64` fields, `Pod`); the read is
    // unaligned, so the buffer's alignment does not matter.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) }
}

/// Whether `path` is on a cgroup v2 filesystem.
pub(super) fn is_cgroup2(path: &Path) -> io::Result<bool> {
    let fs = nix::sys::statfs::statfs(path).map_err(io::Error::from)?;
    Ok(fs.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

/// `BPF_MAP_LOOKUP_BATCH` (kernel 5.6+).
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Reads every entry of a hash map with 8-byte keys in a few `BPF_MAP_LOOKUP_BATCH` calls
/// instead of two syscalls per entry. `value_bytes` is the size of one entry's value as the
/// kernel copies it out (for per-CPU maps: the value rounded up to 8 bytes, times the number of
/// possible CPUs). Returns the keys and their values, back to back.
pub(super) fn lookup_batch_u64_keys(
    map: BorrowedFd<'_>,
    value_bytes: usize,
) -> io::Result<(Vec<u64>, Vec<u8>)> {
    let mut keys_out = Vec::new();
    let mut values_out = Vec::new();
    let mut chunk: usize = 256;
    // The batch token of hash maps is a bucket index (u32).
    let mut token_in: u32 = 0;
    let mut token_out: u32 = 0;
    let mut first = true;
    loop {
        let mut keys = vec![0u64; chunk];
        let mut values = vec![0u8; chunk * value_bytes];
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                (&raw const token_in) as u64
            },
            out_batch: (&raw mut token_out) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: map.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` points at buffers of `count` keys and `count * value_bytes` bytes that
        // live across the call, and at the two tokens; the size passed is that of `attr`.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &raw mut attr,
                std::mem::size_of::<BatchAttr>(),
            )
        };
        let err = (rc < 0).then(io::Error::last_os_error);
        let n = attr.count as usize;
        match err.as_ref().and_then(io::Error::raw_os_error) {
            // A bucket holds more entries than `chunk`: retry it with more room.
            Some(libc::ENOSPC) if n == 0 => {
                chunk *= 2;
                continue;
            }
            None | Some(libc::ENOENT) => {}
            Some(_) => return Err(err.unwrap_or_else(io::Error::last_os_error)),
        }
        keys_out.extend_from_slice(&keys[..n]);
        values_out.extend_from_slice(&values[..n * value_bytes]);
        if err.is_some() {
            // ENOENT: that was the last batch.
            return Ok((keys_out, values_out));
        }
        token_in = token_out;
        first = false;
    }
}

/// `struct file_handle` with room for the 8 bytes of a kernfs handle.
#[repr(C)]
struct FileHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; 8],
}

/// Answers "does the cgroup with this id still exist?" through file handles: a cgroup v2 id is
/// the kernfs node id, which is also the payload of the file handle of its directory
/// (`name_to_handle_at`/`open_by_handle_at`, as systemd and bpftool use it).
pub(super) struct CgroupHandles {
    mount_fd: OwnedFd,
    handle_type: i32,
}

impl CgroupHandles {
    /// Learns the handle format from the root directory of the cgroup v2 mount.
    pub(super) fn open(root: &Path) -> io::Result<CgroupHandles> {
        let c_root = CString::new(root.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
        let mut handle = FileHandle {
            handle_bytes: 8,
            handle_type: 0,
            f_handle: [0; 8],
        };
        let mut mount_id: libc::c_int = 0;
        // SAFETY: `handle` has room for `handle_bytes` bytes after the header; the other
        // pointers are valid for the call.
        let rc = unsafe {
            libc::name_to_handle_at(
                libc::AT_FDCWD,
                c_root.as_ptr(),
                (&raw mut handle).cast(),
                &mut mount_id,
                0,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        if handle.handle_bytes != 8 {
            return Err(io::Error::other(format!(
                "unexpected cgroupfs file handle size {}",
                handle.handle_bytes
            )));
        }
        // SAFETY: plain open(2) of a NUL-terminated path.
        let fd = unsafe {
            libc::open(
                c_root.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(CgroupHandles {
            // SAFETY: `fd` was just opened and is owned by nobody else.
            mount_fd: unsafe { OwnedFd::from_raw_fd(fd) },
            handle_type: handle.handle_type,
        })
    }

    /// `Some(true)` if cgroup `id` exists, `Some(false)` if it is gone, `None` if the kernel
    /// would not say (no permission, handles unsupported).
    pub(super) fn exists(&self, id: u64) -> Option<bool> {
        let mut handle = FileHandle {
            handle_bytes: 8,
            handle_type: self.handle_type,
            f_handle: id.to_ne_bytes(),
        };
        // SAFETY: `handle` is a complete `struct file_handle` of 8 payload bytes.
        let fd = unsafe {
            libc::open_by_handle_at(
                self.mount_fd.as_raw_fd(),
                (&raw mut handle).cast(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd >= 0 {
            // SAFETY: we own the new descriptor; wrapping it closes it.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
            return Some(true);
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::ESTALE | libc::ENOENT) => Some(false),
            _ => None,
        }
    }
}

/// Waits until `fd` is readable, `wake` is readable, or `timeout_ms` passes. Returns whether
/// `wake` fired (the caller's signal to stop).
pub(super) fn wait_readable(fd: BorrowedFd<'_>, wake: BorrowedFd<'_>, timeout_ms: i32) -> bool {
    let mut fds = [
        libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: `fds` is a valid array of two pollfd for the duration of the call.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
    rc > 0 && fds[1].revents != 0
}

/// Makes every CPU this process may run on switch tasks once, by running a short thread pinned
/// to each. The programs learn where a task's slice began only when it is switched in; a task
/// that was already on a CPU when they attached is charged from its first switch in after
/// that. Without this, a thread that spins without sleeping from before the attach (a busy
/// training loop on an idle CPU) would be missing from the figures until the scheduler next
/// preempts it. Returns the number of CPUs switched; CPUs outside the process's affinity mask
/// keep their first slice unknown.
pub(super) fn switch_every_cpu_once() -> io::Result<usize> {
    use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
    use nix::unistd::Pid;
    let allowed = sched_getaffinity(Pid::from_raw(0)).map_err(io::Error::from)?;
    let cpus: Vec<usize> = (0..CpuSet::count())
        .filter(|&cpu| allowed.is_set(cpu).unwrap_or(false))
        .collect();
    let switched = std::thread::scope(|scope| {
        let handles: Vec<_> = cpus
            .iter()
            .map(|&cpu| {
                scope.spawn(move || {
                    let mut one = CpuSet::new();
                    one.set(cpu).ok()?;
                    // Pid 0: this thread. Once it runs there, that CPU has switched.
                    sched_setaffinity(Pid::from_raw(0), &one).ok()?;
                    std::thread::yield_now();
                    Some(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join())
            .filter(|r| matches!(r, Ok(Some(()))))
            .count()
    });
    Ok(switched)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temporary_directory_is_not_cgroup2() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_cgroup2(dir.path()).unwrap());
    }

    #[test]
    fn wait_returns_when_woken() {
        let (r, mut w) = std::io::pipe().unwrap();
        let (idle_r, _idle_w) = std::io::pipe().unwrap();
        use std::io::Write;
        w.write_all(b"x").unwrap();
        let fd: BorrowedFd<'_> = std::os::fd::AsFd::as_fd(&idle_r);
        let wake: BorrowedFd<'_> = std::os::fd::AsFd::as_fd(&r);
        assert!(wait_readable(fd, wake, 5_000));
        // Nothing readable: times out without reporting a wake-up.
        assert!(!wait_readable(fd, fd, 10));
    }

    #[test]
    fn every_allowed_cpu_is_switched_and_the_caller_keeps_its_affinity() {
        use nix::sched::sched_getaffinity;
        use nix::unistd::Pid;
        let before = sched_getaffinity(Pid::from_raw(0)).unwrap();
        let switched = switch_every_cpu_once().unwrap();
        // Not available_parallelism(): that also heeds a cgroup's CPU quota.
        let allowed = (0..nix::sched::CpuSet::count())
            .filter(|&cpu| before.is_set(cpu).unwrap_or(false))
            .count();
        assert_eq!(switched, allowed);
        // The pinning is done by the helper threads only.
        assert_eq!(sched_getaffinity(Pid::from_raw(0)).unwrap(), before);
    }
}
