//! Process events from the kernel's netlink process connector (`CONFIG_PROC_EVENTS`).
//!
//! Discovery learns of every `exec` and process exit as it happens, so a new training job is
//! noticed within milliseconds and a finished one as soon as its last process exits, without
//! walking `/proc` in a loop. Needs CAP_NET_ADMIN (the daemon runs as root). When the socket's
//! buffer overflows (an exec storm), the kernel drops events and reports ENOBUFS: that is surfaced
//! as [`ProcEvent::Overflow`] so the caller resynchronises with one full scan.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use tokio::io::unix::AsyncFd;

/// A process event relevant to discovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcEvent {
    /// `pid` (a process, i.e. thread-group leader) called execve.
    Exec { pid: u32 },
    /// The process `pid` exited (its last thread).
    Exit { pid: u32 },
    /// Events were lost; rescan to catch up.
    Overflow,
}

const NETLINK_CONNECTOR: libc::c_int = 11;
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_EXEC: u32 = 0x0000_0002;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;
const NLMSG_HDRLEN: usize = 16;
const CN_MSG_LEN: usize = 20;
const NLMSG_DONE: u16 = 3;
/// Offset of `event_data` inside `struct proc_event` (what, cpu, u64 timestamp).
const EVENT_DATA_OFFSET: usize = 16;

/// A subscription to process events.
pub struct ProcEvents {
    fd: AsyncFd<OwnedFd>,
    buf: Vec<u8>,
}

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

impl ProcEvents {
    /// Open the connector socket and ask the kernel to multicast process events to it.
    /// Must be called inside a tokio runtime.
    pub fn subscribe() -> io::Result<ProcEvents> {
        // SAFETY: plain socket(2) call; the returned descriptor is owned below.
        let raw = cvt(unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                NETLINK_CONNECTOR,
            )
        })?;
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        // A larger receive buffer makes overflow under exec storms rarer.
        let rcvbuf: libc::c_int = 4 << 20;
        // SAFETY: the option value points to a live c_int of the size passed.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&rcvbuf as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            );
        }

        // SAFETY: sockaddr_nl is plain data; all-zero is a valid value that we then fill in.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = CN_IDX_PROC;
        // SAFETY: addr is a valid sockaddr_nl and its exact size is passed.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        })?;

        let msg = subscribe_message();
        // SAFETY: the buffer is valid for its length; the socket is bound.
        let sent = unsafe { libc::send(fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = super::async_readable(fd)?;
        Ok(ProcEvents {
            fd,
            buf: vec![0u8; 64 * 1024],
        })
    }

    /// Wait for the next datagrams and append the events they carry to `out` (at least one
    /// datagram is read; every datagram already queued is drained).
    pub async fn next_events(&mut self, out: &mut Vec<ProcEvent>) -> io::Result<()> {
        loop {
            let mut guard = self.fd.readable().await?;
            let mut got_any = false;
            loop {
                let fd = guard.get_inner().as_raw_fd();
                // SAFETY: the buffer is valid for writes of its length.
                let n = unsafe { libc::recv(fd, self.buf.as_mut_ptr().cast(), self.buf.len(), 0) };
                if n < 0 {
                    let err = io::Error::last_os_error();
                    match err.raw_os_error() {
                        Some(libc::EAGAIN) => {
                            guard.clear_ready();
                            break;
                        }
                        Some(libc::ENOBUFS) => {
                            out.push(ProcEvent::Overflow);
                            got_any = true;
                            continue;
                        }
                        Some(libc::EINTR) => continue,
                        _ => return Err(err),
                    }
                }
                parse_datagram(&self.buf[..n as usize], out);
                got_any = true;
            }
            if got_any {
                return Ok(());
            }
        }
    }
}

/// nlmsghdr + cn_msg + PROC_CN_MCAST_LISTEN.
fn subscribe_message() -> Vec<u8> {
    let total = NLMSG_HDRLEN + CN_MSG_LEN + 4;
    let mut m = Vec::with_capacity(total);
    m.extend_from_slice(&(total as u32).to_ne_bytes()); // nlmsg_len
    m.extend_from_slice(&NLMSG_DONE.to_ne_bytes()); // nlmsg_type
    m.extend_from_slice(&0u16.to_ne_bytes()); // nlmsg_flags
    m.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_seq
    m.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid
    m.extend_from_slice(&CN_IDX_PROC.to_ne_bytes()); // cn_msg.id.idx
    m.extend_from_slice(&CN_VAL_PROC.to_ne_bytes()); // cn_msg.id.val
    m.extend_from_slice(&0u32.to_ne_bytes()); // seq
    m.extend_from_slice(&0u32.to_ne_bytes()); // ack
    m.extend_from_slice(&4u16.to_ne_bytes()); // len
    m.extend_from_slice(&0u16.to_ne_bytes()); // flags
    m.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
    m
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

/// Parse every netlink message in a datagram; malformed input yields no events, never a panic.
pub fn parse_datagram(mut data: &[u8], out: &mut Vec<ProcEvent>) {
    while data.len() >= NLMSG_HDRLEN {
        let Some(len) = u32_at(data, 0).map(|l| l as usize) else {
            return;
        };
        if len < NLMSG_HDRLEN || len > data.len() {
            return;
        }
        let msg = &data[NLMSG_HDRLEN..len];
        let idx = u32_at(msg, 0);
        let ev = CN_MSG_LEN;
        if idx == Some(CN_IDX_PROC)
            && let Some(what) = u32_at(msg, ev)
        {
            let d = ev + EVENT_DATA_OFFSET;
            match what {
                PROC_EVENT_EXEC => {
                    if let (Some(pid), Some(tgid)) = (u32_at(msg, d), u32_at(msg, d + 4))
                        && pid == tgid
                    {
                        out.push(ProcEvent::Exec { pid: tgid });
                    }
                }
                PROC_EVENT_EXIT => {
                    // Exit is reported per thread; the process is gone when its leader exits.
                    if let (Some(pid), Some(tgid)) = (u32_at(msg, d), u32_at(msg, d + 4))
                        && pid == tgid
                    {
                        out.push(ProcEvent::Exit { pid: tgid });
                    }
                }
                _ => {}
            }
        }
        // Messages are 4-byte aligned (NLMSG_ALIGN).
        let advance = (len + 3) & !3;
        if advance >= data.len() {
            return;
        }
        data = &data[advance..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(what: u32, pid: u32, tgid: u32) -> Vec<u8> {
        let mut payload = Vec::new();
        payload.extend_from_slice(&what.to_ne_bytes());
        payload.extend_from_slice(&0u32.to_ne_bytes()); // cpu
        payload.extend_from_slice(&0u64.to_ne_bytes()); // timestamp
        payload.extend_from_slice(&pid.to_ne_bytes());
        payload.extend_from_slice(&tgid.to_ne_bytes());
        payload.extend_from_slice(&[0u8; 16]);
        let mut cn = Vec::new();
        cn.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
        cn.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
        cn.extend_from_slice(&[0u8; 8]);
        cn.extend_from_slice(&(payload.len() as u16).to_ne_bytes());
        cn.extend_from_slice(&0u16.to_ne_bytes());
        cn.extend_from_slice(&payload);
        let mut m = Vec::new();
        m.extend_from_slice(&((NLMSG_HDRLEN + cn.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&[0u8; 12]);
        m.extend_from_slice(&cn);
        while m.len() % 4 != 0 {
            m.push(0);
        }
        m
    }

    #[test]
    fn parses_exec_and_exit_of_processes_not_threads() {
        let mut d = event(PROC_EVENT_EXEC, 42, 42);
        d.extend(event(PROC_EVENT_EXIT, 43, 42)); // a thread of 42 exits
        d.extend(event(PROC_EVENT_EXIT, 42, 42));
        d.extend(event(1, 50, 50)); // fork: ignored
        let mut out = Vec::new();
        parse_datagram(&d, &mut out);
        assert_eq!(
            out,
            vec![ProcEvent::Exec { pid: 42 }, ProcEvent::Exit { pid: 42 }]
        );
    }

    #[test]
    fn malformed_datagrams_never_panic() {
        let mut out = Vec::new();
        for len in 0..80 {
            let d = event(PROC_EVENT_EXEC, 1, 1);
            parse_datagram(&d[..len.min(d.len())], &mut out);
        }
        let mut bad = event(PROC_EVENT_EXEC, 1, 1);
        bad[0..4].copy_from_slice(&9999u32.to_ne_bytes());
        parse_datagram(&bad, &mut out);
        bad[0..4].copy_from_slice(&3u32.to_ne_bytes());
        parse_datagram(&bad, &mut out);
        assert!(out.iter().all(|e| *e == ProcEvent::Exec { pid: 1 }));
    }

    #[test]
    fn subscribe_message_layout() {
        let m = subscribe_message();
        assert_eq!(m.len(), 40);
        assert_eq!(u32_at(&m, 0), Some(40));
        assert_eq!(u32_at(&m, 36), Some(PROC_CN_MCAST_LISTEN));
    }

    /// Real kernel: the exec and the exit of a child we start arrive as events.
    #[tokio::test]
    #[ignore = "root-host: subscribes to the kernel's process connector (CAP_NET_ADMIN); `cargo xtask test` runs it where it can"]
    async fn root_host_proc_connector_reports_exec_and_exit_of_a_child() {
        let mut events = ProcEvents::subscribe().expect(
            "cannot subscribe to the netlink process connector: needs root (CAP_NET_ADMIN) and CONFIG_PROC_EVENTS",
        );
        let child = std::process::Command::new("/bin/sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let pid = child.id();
        let (mut saw_exec, mut saw_exit) = (false, false);
        let mut child = Some(child);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while !(saw_exec && saw_exit) {
            let mut out = Vec::new();
            tokio::time::timeout_at(deadline, events.next_events(&mut out))
                .await
                .expect("no exec/exit event for the child within 10 s")
                .unwrap();
            saw_exec |= out.contains(&ProcEvent::Exec { pid });
            saw_exit |= out.contains(&ProcEvent::Exit { pid });
            if saw_exec && let Some(mut c) = child.take() {
                c.wait().unwrap();
            }
        }
    }
}
