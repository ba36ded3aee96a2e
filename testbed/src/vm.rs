//! The VM test bed: boots the Debian kernel under virtme-ng (TCG: KVM does not work on these
//! machines) with the host's filesystem shared read-only and one run directory shared read-write.
//!
//! virtme-ng neither prints the guest's output nor returns the guest's exit status without a
//! terminal, so every guest script writes its log and its exit status into the run directory; the
//! host follows the log while the guest runs and reads the status when it powers off.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};

use crate::cmd::{self, bed_dir};
use crate::setup::Bed;

/// The guest's view: how to boot it.
pub struct GuestSpec<'a> {
    pub name: String,
    pub cpus: u32,
    pub memory: &'a str,
    /// Extra QEMU options (network devices for the multi-node bed).
    pub qemu_opts: Option<String>,
    /// The shell script to run (a file in the run directory).
    pub script: PathBuf,
}

/// A fresh run directory `target/bed/runs/<tag>-<time>`, shared read-write with the guests.
pub fn new_run_dir(tag: &str) -> Result<PathBuf> {
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let dir =
        bed_dir()
            .join("runs")
            .join(format!("{tag}-{}-{}", stamp.as_secs(), std::process::id()));
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// Start one guest in the background; its console goes to `<run>/<name>.console`.
pub fn spawn_guest(bed: &Bed, run_dir: &Path, spec: &GuestSpec<'_>) -> Result<Child> {
    use std::os::unix::process::CommandExt;
    let console = fs::File::create(run_dir.join(format!("{}.console", spec.name)))?;
    let mut c = Command::new(&bed.vng);
    c.args(["--disable-kvm", "--force-9p", "--verbose"])
        .args([
            "--cpus",
            &spec.cpus.to_string(),
            "--memory",
            spec.memory,
            "--name",
            &spec.name,
        ])
        .arg("--busybox")
        .arg(&bed.busybox)
        .arg(format!("--rwdir={}", run_dir.display()));
    if let Some(q) = &spec.qemu_opts {
        c.arg(format!("--qemu-opts={q}"));
    }
    c.arg("--run")
        .arg(&bed.vmlinuz)
        .arg("--exec")
        .arg(format!("/bin/sh {}", spec.script.display()));
    // vng runs depmod and friends from PATH; the project's venv comes first.
    let path = format!(
        "{}:{}",
        bed.vng.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    c.env("PATH", path)
        .current_dir(run_dir)
        .stdin(Stdio::null())
        .stdout(console.try_clone()?)
        .stderr(console)
        .process_group(0);
    c.spawn()
        .with_context(|| format!("cannot start {}", cmd::describe(&c)))
}

/// Kill a guest and everything vng started (its process group).
fn kill_guest(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .status();
    let _ = child.kill();
    let _ = child.wait();
}

/// Follows a growing log file and prints what is appended, with an optional prefix per line.
pub struct LogFollower {
    path: PathBuf,
    prefix: String,
    offset: u64,
    partial: String,
}

impl LogFollower {
    /// Follows `path` from its start; `prefix` goes before every line printed.
    pub fn new(path: PathBuf, prefix: &str) -> Self {
        LogFollower {
            path,
            prefix: prefix.to_owned(),
            offset: 0,
            partial: String::new(),
        }
    }

    fn pump(&mut self, flush: bool) {
        let Ok(mut f) = fs::File::open(&self.path) else {
            return;
        };
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut buf = Vec::new();
        if f.read_to_end(&mut buf).is_ok() {
            self.offset += buf.len() as u64;
            self.partial.push_str(&String::from_utf8_lossy(&buf));
        }
        let mut out = std::io::stdout().lock();
        while let Some(nl) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=nl).collect();
            let _ = write!(out, "{}{}", self.prefix, line);
        }
        if flush && !self.partial.is_empty() {
            let _ = writeln!(out, "{}{}", self.prefix, std::mem::take(&mut self.partial));
        }
        let _ = out.flush();
    }
}

/// Wait for guests while printing their logs; kill them all after `timeout`.
pub fn wait_guests(
    children: &mut [Child],
    followers: &mut [LogFollower],
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        for f in followers.iter_mut() {
            f.pump(false);
        }
        let mut running = 0;
        for c in children.iter_mut() {
            if c.try_wait()?.is_none() {
                running += 1;
            }
        }
        if running == 0 {
            break;
        }
        if Instant::now() > deadline {
            for c in children.iter_mut() {
                kill_guest(c);
            }
            for f in followers.iter_mut() {
                f.pump(true);
            }
            bail!(
                "the guest(s) did not finish within {} minutes and were killed",
                timeout.as_secs() / 60
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    for f in followers.iter_mut() {
        f.pump(true);
    }
    Ok(())
}

/// Read a guest's exit status file; a missing file means the guest died before finishing.
pub fn guest_rc(run_dir: &Path, name: &str) -> Result<i32> {
    let path = run_dir.join(format!("{name}.rc"));
    let text = fs::read_to_string(&path).with_context(|| {
        format!("guest `{name}` powered off without writing {} (it crashed or was killed); its console is in {}", path.display(), run_dir.join(format!("{name}.console")).display())
    })?;
    text.trim()
        .parse()
        .with_context(|| format!("bad exit status {text:?} in {}", path.display()))
}

/// Shell prologue every guest script starts with: log to the run directory, load modules on
/// demand, delegate the controllers the tests need.
pub fn guest_prologue(bed: &Bed, run_dir: &Path, name: &str) -> String {
    format!(
        r#"#!/bin/sh
set -u
RUN={run}
NAME={name}
exec >"$RUN/$NAME.log" 2>&1
trap 'echo 125 > "$RUN/$NAME.rc"' EXIT
cd /tmp
echo "== guest $NAME: kernel $(uname -r), $(nproc) cpu(s), $(awk '/MemTotal/{{print $2/1024 " MiB"}}' /proc/meminfo), booted in $(cut -d' ' -f1 /proc/uptime) s"
echo {modprobe} > /proc/sys/kernel/modprobe
if ! echo "+cpu +memory +pids" > /sys/fs/cgroup/cgroup.subtree_control; then
  echo "== cannot delegate +cpu +memory +pids at /sys/fs/cgroup"; exit 1
fi
echo "== cgroup v2 at /sys/fs/cgroup, delegated: $(cat /sys/fs/cgroup/cgroup.subtree_control)"
export GOVERNOR_IN_VM=1 RUST_BACKTRACE=1
"#,
        run = run_dir.display(),
        modprobe = bed.modprobe.display(),
    )
}

/// Write the epilogue that records the status; `trap` covers early exits.
pub fn guest_epilogue() -> &'static str {
    "trap - EXIT\necho \"$rc\" > \"$RUN/$NAME.rc\"\necho \"== guest $NAME done: rc=$rc after $(cut -d' ' -f1 /proc/uptime) s\"\n"
}

/// Wait for one guest while printing its log live.
pub fn wait_with_log(child: &mut Child, log: &Path, timeout: Duration) -> Result<()> {
    let mut follower = [LogFollower::new(log.to_owned(), "")];
    wait_guests(std::slice::from_mut(child), &mut follower, timeout)
}

/// Run one shell command in a fresh guest and return its stdout (used by `setup` to check boot).
pub(crate) fn run_guest_command(bed: &Bed, tag: &str, command: &str) -> Result<String> {
    run_guest_command_for(bed, tag, command, Duration::from_secs(300))
}

/// Run one shell command in a fresh guest (1 GiB) and return its stdout, within `timeout`.
pub fn run_guest_command_for(
    bed: &Bed,
    tag: &str,
    command: &str,
    timeout: Duration,
) -> Result<String> {
    run_guest_command_with(bed, tag, command, timeout, "1G")
}

/// [`run_guest_command_for`] in a guest of `memory` (QEMU's syntax: "3G").
pub fn run_guest_command_with(
    bed: &Bed,
    tag: &str,
    command: &str,
    timeout: Duration,
    memory: &str,
) -> Result<String> {
    let run_dir = new_run_dir(tag)?;
    let name = "guest";
    let script = run_dir.join("guest.sh");
    fs::write(
        &script,
        format!(
            "{}{command} > \"$RUN/out\"\nrc=$?\n{}",
            guest_prologue(bed, &run_dir, name),
            guest_epilogue()
        ),
    )?;
    let mut child = spawn_guest(
        bed,
        &run_dir,
        &GuestSpec {
            name: name.into(),
            cpus: 2,
            memory,
            qemu_opts: None,
            script,
        },
    )?;
    wait_guests(std::slice::from_mut(&mut child), &mut [], timeout)?;
    let rc = guest_rc(&run_dir, name)?;
    if rc != 0 {
        let log = fs::read_to_string(run_dir.join("guest.log")).unwrap_or_default();
        bail!("`{command}` failed in the guest (rc={rc}):\n{log}");
    }
    Ok(fs::read_to_string(run_dir.join("out"))?)
}
