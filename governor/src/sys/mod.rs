//! Raw system interfaces other than cgroupfs (which only [`crate::cgroup`] writes): every
//! `unsafe` libc call of the daemon outside the eBPF loader lives here.
#![allow(unsafe_code)]

pub mod durable;
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

/// Put this process's future children in a new PID namespace (`unshare(CLONE_NEWPID)`; needs
/// CAP_SYS_ADMIN): its next child is that namespace's PID 1. Used by `governor supervise` so
/// that CRIU can dump a job's whole tree and restore it with the same PIDs on another node.
pub fn unshare_pid_namespace() -> std::io::Result<()> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWPID)
        .map_err(|e| std::io::Error::from_raw_os_error(e as i32))
}

/// Make this process the leader of a new session and process group (`setsid`): a process tree
/// CRIU dumps must not belong to a session whose leader it does not dump.
pub fn new_session() -> std::io::Result<()> {
    nix::unistd::setsid()
        .map(|_| ())
        .map_err(|e| std::io::Error::from_raw_os_error(e as i32))
}

/// Close every descriptor above stderr this process inherited (`close_range`, Linux 5.9+; else
/// one by one from /proc/self/fd): a job CRIU dumps must hold nothing from outside its tree
/// (a console a daemon was started from makes the dump fail).
pub fn close_inherited_descriptors() {
    // SAFETY: close_range takes plain integers; it only closes descriptors of this process,
    // which at this point (a fresh init, before it starts anything) owns none it still uses.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if rc == 0 {
        return;
    }
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .filter(|fd| *fd > 2)
                .collect()
        })
        .unwrap_or_default();
    for fd in fds {
        // SAFETY: as above; a descriptor already closed (the directory's own) gives EBADF.
        unsafe { libc::close(fd) };
    }
}

/// Reap every child that ends (an init reaps its namespace's orphans) until `pid` does; its
/// status. Retries on EINTR (a forwarded signal).
pub fn reap_until(pid: u32) -> std::io::Result<std::process::ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    let pid = libc::pid_t::try_from(pid).map_err(|_| std::io::Error::other("pid out of range"))?;
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid with a valid pointer to a local int.
        let reaped = unsafe { libc::waitpid(-1, &mut status, 0) };
        if reaped < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if reaped == pid {
            return Ok(std::process::ExitStatus::from_raw(status));
        }
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

/// Registers `fd` with the tokio reactor for readability (a pidfd that becomes readable when its
/// process ends, a netlink socket with messages waiting).
pub fn async_readable(
    fd: std::os::fd::OwnedFd,
) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    // SAFETY: the AsyncFd takes ownership of the OwnedFd, so the descriptor stays open and
    // refers to the same file for the AsyncFd's whole lifetime.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}

/// Makes `command`'s child write `bytes` to each of `files` between fork and exec (joining a
/// cgroup through its already opened `cgroup.procs`: the job never runs a single instruction
/// outside it).
pub fn write_before_exec(
    command: &mut std::process::Command,
    files: Vec<std::os::fd::OwnedFd>,
    bytes: &'static [u8],
) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe
    // calls are allowed: it calls write(2) on descriptors opened before the fork and builds an
    // io::Error from an errno, neither of which allocates or takes a lock.
    unsafe {
        command.pre_exec(move || {
            for fd in &files {
                nix::unistd::write(fd, bytes)
                    .map_err(|e| std::io::Error::from_raw_os_error(e as i32))?;
            }
            Ok(())
        });
    }
}

/// Why a command prepared with [`ask_before_exec`] did not start.
#[derive(Debug, PartialEq, Eq)]
pub enum GateRefusal {
    /// The child could not connect to the socket (the error `spawn` returned says why).
    Connect,
    /// The request could not be sent, or no whole answer came back in time (ditto).
    Exchange,
    /// The answer, which did not start with the expected bytes (up to its end of line).
    Answer(Vec<u8>),
}

/// The parent's end of what the child of [`ask_before_exec`] reports about its request.
#[derive(Debug)]
pub struct ExecGate {
    report: std::os::fd::OwnedFd,
}

impl ExecGate {
    /// After `spawn` failed: why, if the request was the reason (`None`: the command itself
    /// could not start). The child wrote its report before it ended, so it is all there when
    /// `spawn` returns; nothing here waits.
    pub fn refusal(&self) -> Option<GateRefusal> {
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        while let Ok(n) = nix::unistd::read(&self.report, &mut chunk) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&chunk[..n]);
        }
        match got.split_first() {
            Some((b'c', _)) => Some(GateRefusal::Connect),
            Some((b'x', _)) => Some(GateRefusal::Exchange),
            Some((b'a', answer)) => Some(GateRefusal::Answer(answer.to_vec())),
            _ => None,
        }
    }
}

/// Largest answer line read before exec (a control-socket answer to a small request).
const GATE_ANSWER_BYTES: usize = 8192;

/// Make `command`'s child, between fork and exec, connect to the Unix stream socket at
/// `socket`, send `request` (one line), read one answer line, and go on to exec only when the
/// answer starts with `ok`; otherwise the child ends, `spawn` fails and [`ExecGate::refusal`]
/// tells why. The peer sees the child itself as the caller (`SO_PEERCRED`): this is how a
/// user's `governor run-job` has the daemon move the job's own process into its cgroup
/// before it runs (see `governor::daemon::join`). Send and receive each give up after
/// `timeout`.
///
/// Everything the child needs is made here, before the fork: the socket address, the request
/// bytes, the answer buffer and the report pipe. The child only calls `socket`, `setsockopt`,
/// `connect`, `write`, `read` and `close`, which are async-signal-safe, and allocates nothing.
pub fn ask_before_exec(
    command: &mut std::process::Command,
    socket: &std::path::Path,
    request: Vec<u8>,
    ok: &'static [u8],
    timeout: std::time::Duration,
) -> std::io::Result<ExecGate> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    let path = socket.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid (empty) value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if path.is_empty() || path.len() >= addr.sun_path.len() || path.contains(&0) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "the socket path {} cannot be connected to (empty, longer than {} bytes, or with a NUL)",
                socket.display(),
                addr.sun_path.len() - 1
            ),
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(path) {
        *dst = *src as libc::c_char;
    }
    let addr_len = (std::mem::size_of::<libc::sa_family_t>() + path.len() + 1) as libc::socklen_t;
    let tv = libc::timeval {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_usec: libc::suseconds_t::from(timeout.subsec_micros() as i32),
    };
    let (report_read, report_write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
    nix::fcntl::fcntl(
        &report_read,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .map_err(std::io::Error::from)?;
    let mut answer = vec![0u8; GATE_ANSWER_BYTES];
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe
    // calls are allowed: socket, setsockopt, connect, write, read and close on memory prepared
    // before the fork (the address, the request, the answer buffer, the report pipe), and
    // `io::Error`s built from an errno, which do not allocate.
    unsafe {
        command.pre_exec(move || {
            let report = report_write.as_raw_fd();
            let tell = |what: &[u8]| {
                libc::write(report, what.as_ptr().cast(), what.len());
            };
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            if fd < 0 {
                let e = std::io::Error::last_os_error();
                tell(b"c");
                return Err(e);
            }
            for option in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    option,
                    (&raw const tv).cast(),
                    std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                );
            }
            let failed = |stage: &[u8]| {
                let e = std::io::Error::last_os_error();
                libc::close(fd);
                tell(stage);
                Err(e)
            };
            if libc::connect(fd, (&raw const addr).cast(), addr_len) != 0 {
                return failed(b"c");
            }
            let mut sent = 0;
            while sent < request.len() {
                let n = libc::write(fd, request[sent..].as_ptr().cast(), request.len() - sent);
                if n < 0 {
                    if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                        continue;
                    }
                    return failed(b"x");
                }
                sent += n as usize;
            }
            let mut got = 0;
            while got < answer.len() && !answer[..got].contains(&b'\n') {
                let n = libc::read(fd, answer[got..].as_mut_ptr().cast(), answer.len() - got);
                if n < 0 {
                    if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                        continue;
                    }
                    return failed(b"x");
                }
                if n == 0 {
                    break;
                }
                got += n as usize;
            }
            libc::close(fd);
            if answer[..got].starts_with(ok) {
                return Ok(());
            }
            if got == 0 {
                tell(b"x");
                return Err(std::io::Error::from_raw_os_error(libc::ECONNRESET));
            }
            let line = answer[..got]
                .iter()
                .position(|&b| b == b'\n')
                .unwrap_or(got);
            tell(b"a");
            tell(&answer[..line]);
            Err(std::io::Error::from_raw_os_error(libc::EPERM))
        });
    }
    Ok(ExecGate {
        report: report_read,
    })
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

/// The parent of the process `pid` (`/proc/<pid>/stat`, field 4).
pub fn parent_pid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// Give the command's process the default action for `signal` (set between fork and exec),
/// whatever its starter had: a job started from `cmd &` in a script inherits SIGINT ignored,
/// and would then sit out the daemon's graceful stop (SIGINT) until the SIGTERM after the grace.
pub fn default_action_for(command: &mut std::process::Command, signal: nix::sys::signal::Signal) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the hook runs in the forked child before exec and only calls signal(2), which is
    // async-signal-safe, then returns an error built from errno.
    unsafe {
        command.pre_exec(move || {
            if libc::signal(signal as libc::c_int, libc::SIG_DFL) == libc::SIG_ERR {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Make the command's process die (SIGKILL) when the process that starts it does
/// (PR_SET_PDEATHSIG, set between fork and exec): a supervisor killed outright must not leave
/// its job running on, unseen, where only the supervisor's end was noticed.
pub fn kill_when_parent_dies(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: the hook runs in the forked child before exec and only calls prctl, getppid and
    // returns an error, all async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the prctl: then nothing would signal us. (The
            // init of a new PID namespace sees its parent, outside it, as pid 0.)
            let ppid = libc::getppid() as u32;
            if ppid != parent && ppid != 0 {
                return Err(std::io::Error::other(
                    "the supervisor ended before the job started",
                ));
            }
            Ok(())
        });
    }
}

/// The process a supervisor passes its signals on to (0: not started yet).
static FORWARD_TO: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
/// A signal that arrived before the supervised process existed (0: none).
static FORWARD_PENDING: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn forward_signal(signal: libc::c_int) {
    use std::sync::atomic::Ordering;
    let pid = FORWARD_TO.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe; the pid is the supervisor's own unreaped child.
        unsafe { libc::kill(pid, signal) };
    } else {
        FORWARD_PENDING.store(signal, Ordering::SeqCst);
    }
}

/// Catch `signals` in this process and pass them on to the process named by
/// [`forward_signals_to`] (`governor supervise`: a stop sent to the supervisor reaches the job).
/// One that arrives before that process exists is kept and passed on when it does.
pub fn catch_signals_for_forwarding(signals: &[nix::sys::signal::Signal]) -> std::io::Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(forward_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for &signal in signals {
        // SAFETY: the handler only reads and writes atomics and calls kill (async-signal-safe).
        unsafe { sigaction(signal, &action) }.map_err(std::io::Error::from)?;
    }
    Ok(())
}

/// From now on the caught signals go to `pid` (the supervisor's child); one that came earlier
/// is sent now.
pub fn forward_signals_to(pid: u32) {
    use std::sync::atomic::Ordering;
    let Ok(pid) = i32::try_from(pid) else { return };
    FORWARD_TO.store(pid, Ordering::SeqCst);
    let pending = FORWARD_PENDING.swap(0, Ordering::SeqCst);
    if pending > 0 {
        // SAFETY: a signal number we caught, sent to our own child.
        unsafe { libc::kill(pid, pending) };
    }
}

/// End this process the way a child ended by `signal` did, so that whoever waits for it sees
/// the same status: the default action is restored and the signal raised (with core dumps off,
/// the supervisor's own core is of no use). Exits with 128 + signal if the signal does not end
/// it.
pub fn end_like_signal(signal: i32) -> ! {
    use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, signal as set_handler};
    if let Ok(sig) = Signal::try_from(signal) {
        let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0);
        // SAFETY: restoring the default disposition is always sound.
        let _ = unsafe { set_handler(sig, SigHandler::SigDfl) };
        let mut set = SigSet::empty();
        set.add(sig);
        let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&set), None);
        let _ = nix::sys::signal::raise(sig);
    }
    std::process::exit(128 + signal)
}

/// Open `path` read-only (non-blocking, no controlling tty, close-on-exec) with the rights of
/// user `uid`, group `gid` and supplementary `groups` instead of the daemon's: the filesystem
/// uid, gid and groups of the *calling thread* are switched around the `open` and put back
/// before this returns, so every directory searched, every symlink followed and the file itself
/// are checked as that user (changing the fsuid away from 0 also drops the DAC-override
/// capabilities for that thread). Raw system calls on purpose: glibc's `setgroups` (and
/// `setfsuid` on some versions) would apply to every thread of the daemon; the kernel's calls
/// apply to the calling thread alone. Nothing else runs on the thread meanwhile (no `.await`).
///
/// Fails closed: when the switch did not take (the daemon is not root), the file is not opened.
pub fn open_as_user(
    path: &std::path::Path,
    uid: u32,
    gid: u32,
    groups: &[u32],
) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |p: &std::path::Path| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
            .open(p)
    };
    let saved_groups = thread_groups()?;
    let switched = ThreadCredentials::switch(uid, gid, groups, saved_groups)?;
    let result = open(path);
    drop(switched);
    result
}

/// Start `command` with `creds`: its groups, then its gid, then its uid, set in the child after
/// the fork and before the exec (std's `Command::uid` drops every supplementary group; its
/// `groups` is unstable). Fails the spawn if any of the three does not take.
pub fn run_as(command: &mut std::process::Command, creds: &crate::discovery::procfs::Credentials) {
    use std::os::unix::process::CommandExt;
    let groups: Vec<libc::gid_t> = creds.groups.clone();
    let (uid, gid) = (creds.uid, creds.gid);
    // SAFETY: the hook runs in the forked child before exec and makes only raw setgroups,
    // setgid and setuid system calls (async-signal-safe) on memory allocated before the fork.
    unsafe {
        command.pre_exec(move || {
            if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) != 0
                || libc::syscall(libc::SYS_setgid, gid) != 0
                || libc::syscall(libc::SYS_setuid, uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The calling thread's supplementary groups (asked for their number first: this runs on
/// every open of a job's log).
fn thread_groups() -> std::io::Result<Vec<libc::gid_t>> {
    // SAFETY: size 0 asks only for the count; the kernel writes nothing.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getgroups,
            0 as libc::c_int,
            std::ptr::null_mut::<libc::gid_t>(),
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut groups = vec![0 as libc::gid_t; n as usize];
    // SAFETY: the buffer holds `groups.len()` gids; the kernel writes at most that many.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getgroups,
            groups.len() as libc::c_int,
            groups.as_mut_ptr(),
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    groups.truncate(n as usize);
    Ok(groups)
}

fn set_thread_groups(groups: &[libc::gid_t]) -> std::io::Result<()> {
    // SAFETY: a pointer to `groups.len()` gids that outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_setgroups,
            groups.len() as libc::size_t,
            groups.as_ptr(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// setfsuid/setfsgid return the previous value and never fail visibly; passing -1 (an invalid
/// id) changes nothing and returns the current one.
fn set_fsuid(uid: u32) -> u32 {
    // SAFETY: integer argument only.
    unsafe { libc::syscall(libc::SYS_setfsuid, uid as libc::c_long) as u32 }
}

fn set_fsgid(gid: u32) -> u32 {
    // SAFETY: integer argument only.
    unsafe { libc::syscall(libc::SYS_setfsgid, gid as libc::c_long) as u32 }
}

/// The thread's switched filesystem credentials; dropping puts the previous ones back.
struct ThreadCredentials {
    fsuid: u32,
    fsgid: u32,
    groups: Vec<libc::gid_t>,
}

impl ThreadCredentials {
    fn switch(
        uid: u32,
        gid: u32,
        groups: &[u32],
        saved_groups: Vec<libc::gid_t>,
    ) -> std::io::Result<ThreadCredentials> {
        set_thread_groups(groups)?;
        let fsgid = set_fsgid(gid);
        let fsuid = set_fsuid(uid);
        let guard = ThreadCredentials {
            fsuid,
            fsgid,
            groups: saved_groups,
        };
        let (now_uid, now_gid) = (set_fsuid(u32::MAX), set_fsgid(u32::MAX));
        if now_uid != uid || now_gid != gid {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "cannot take the rights of uid {uid} gid {gid} to open a job's file (the daemon is not root?)"
                ),
            ));
        }
        Ok(guard)
    }
}

impl Drop for ThreadCredentials {
    fn drop(&mut self) {
        // Back to root's fsuid first: that restores the capabilities setgroups needs.
        set_fsuid(self.fsuid);
        set_fsgid(self.fsgid);
        let restored = set_thread_groups(&self.groups).is_ok()
            && set_fsuid(u32::MAX) == self.fsuid
            && set_fsgid(u32::MAX) == self.fsgid;
        if !restored {
            // A daemon thread left with a user's rights would act wrongly from then on; no
            // recovery is safe.
            tracing::error!(
                "cannot restore the daemon's own credentials after opening a job's file; aborting"
            );
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's filesystem uid (4th field of `Uid:` in its own status).
    fn thread_fsuid() -> u32 {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        line.split_whitespace().nth(4).unwrap().parse().unwrap()
    }

    #[test]
    fn a_file_is_opened_with_the_users_rights_or_not_at_all() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("private");
        std::fs::write(&private, "secret").unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let before = thread_fsuid();
        if me == 0 {
            // Root reads it as root; as nobody it is refused like for nobody itself.
            assert!(open_as_user(&private, 0, 0, &[]).is_ok());
            let e = open_as_user(&private, 65534, 65534, &[]).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        } else {
            // Not root: no switch is possible, and nothing is opened (fails closed).
            let e = open_as_user(&private, me.wrapping_add(1), 0, &[]).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        }
        assert_eq!(thread_fsuid(), before, "the thread's own rights are back");
    }

    /// A one-connection server at `path` answering `answer`; returns the request line it got
    /// and the pid the kernel named as its caller.
    fn answer_once(
        path: &std::path::Path,
        answer: &'static str,
    ) -> std::thread::JoinHandle<(String, Option<i32>)> {
        use std::io::{BufRead, Write};
        let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let pid = {
                use std::os::fd::AsRawFd;
                let mut cred = libc::ucred {
                    pid: 0,
                    uid: 0,
                    gid: 0,
                };
                let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
                // SAFETY: a valid socket and a ucred-sized buffer with its length.
                let rc = unsafe {
                    libc::getsockopt(
                        stream.as_raw_fd(),
                        libc::SOL_SOCKET,
                        libc::SO_PEERCRED,
                        (&raw mut cred).cast(),
                        &mut len,
                    )
                };
                (rc == 0).then_some(cred.pid)
            };
            let mut line = String::new();
            std::io::BufReader::new(&stream)
                .read_line(&mut line)
                .unwrap();
            (&stream).write_all(answer.as_bytes()).unwrap();
            (line, pid)
        })
    }

    #[test]
    fn a_command_runs_only_after_the_socket_says_yes_and_the_caller_is_its_process() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("s.sock");
        let timeout = std::time::Duration::from_secs(5);
        // Yes: the command runs; the server saw the child (not this process) as its caller.
        let server = answer_once(&socket, "{\"response\":\"ok\",\"message\":\"joined\"}\n");
        let mut cmd = std::process::Command::new("true");
        let _gate = ask_before_exec(
            &mut cmd,
            &socket,
            b"hello\n".to_vec(),
            br#"{"response":"ok""#,
            timeout,
        )
        .unwrap();
        let mut child = cmd.spawn().expect("runs after a yes");
        let (line, caller) = server.join().unwrap();
        assert_eq!(line, "hello\n");
        assert_eq!(
            caller,
            Some(child.id() as i32),
            "the caller is the job's own process"
        );
        assert!(child.wait().unwrap().success());
        std::fs::remove_file(&socket).unwrap();

        // No: the command never runs, and the answer comes back.
        let marker = dir.path().join("ran");
        let server = answer_once(
            &socket,
            "{\"response\":\"error\",\"message\":\"not you\"}\n",
        );
        let mut cmd = std::process::Command::new("touch");
        cmd.arg(&marker);
        let gate = ask_before_exec(
            &mut cmd,
            &socket,
            b"hello\n".to_vec(),
            br#"{"response":"ok""#,
            timeout,
        )
        .unwrap();
        assert!(cmd.spawn().is_err());
        server.join().unwrap();
        assert!(!marker.exists(), "the command ran after a no");
        assert_eq!(
            gate.refusal(),
            Some(GateRefusal::Answer(
                br#"{"response":"error","message":"not you"}"#.to_vec()
            ))
        );

        // Nobody there: a connect failure, told apart from a command that cannot start.
        let mut cmd = std::process::Command::new("touch");
        cmd.arg(&marker);
        let gate = ask_before_exec(
            &mut cmd,
            &dir.path().join("none.sock"),
            b"x\n".to_vec(),
            b"ok",
            timeout,
        )
        .unwrap();
        let e = cmd.spawn().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
        assert_eq!(gate.refusal(), Some(GateRefusal::Connect));
        assert!(!marker.exists());
        // A yes, then a command that cannot start: not the gate's doing.
        std::fs::remove_file(&socket).unwrap();
        let server = answer_once(&socket, "ok\n");
        let mut cmd = std::process::Command::new("/nonexistent/program");
        let gate = ask_before_exec(&mut cmd, &socket, b"x\n".to_vec(), b"ok", timeout).unwrap();
        assert!(cmd.spawn().is_err());
        server.join().unwrap();
        assert_eq!(gate.refusal(), None);
    }

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
