//! Waiting for a plugin by pidfd: its exit status is read without reaping it (`WNOWAIT`), and
//! the zombie is reaped a moment later.
//!
//! Why not reap at once: reaping a process drops its `/proc/<pid>` dentries, and the kernel's
//! walk over them (`shrink_dcache_parent`) loops for as long as an exiting thread of that
//! process still holds some on a list of its own. A Go plugin's last threads tell the parent
//! that the process is gone before they have finished with theirs, and a thread preempted
//! there on a busy node kept the reaping daemon thread spinning in the kernel for 2 to 19 ms
//! (the bridge plugin, which opens `/proc/<pid>/task/<tid>/ns/net`): 1.5 % of the node's CPU
//! in a 110-pod burst. Reaped [`REAP_DELAY`] later, those threads are long done.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// How long an exited plugin stays a zombie before it is reaped.
pub const REAP_DELAY: Duration = Duration::from_millis(50);

/// A pidfd of a child process.
pub struct PidFd(AsyncFd<OwnedFd>);

impl PidFd {
    /// `pidfd_open(2)` (Linux 5.3; waiting on it needs 5.4). `pid` must be an unreaped child.
    pub fn open(pid: u32) -> io::Result<PidFd> {
        // SAFETY: a plain system call with integer arguments.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this descriptor, and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // SAFETY: the AsyncFd owns `fd`, which stays open and the same until it is dropped.
        Ok(PidFd(unsafe {
            AsyncFd::register_with_interest(fd, Interest::READABLE)
        }?))
    }

    /// Waits for the process to exit; returns its status and leaves it unreaped.
    pub async fn exited(&self) -> io::Result<ExitStatus> {
        loop {
            let mut ready = self.0.readable().await?;
            if let Some(status) = self.peek()? {
                return Ok(status);
            }
            ready.clear_ready();
        }
    }

    /// `waitid(P_PIDFD, …, WEXITED | WNOHANG | WNOWAIT)`: `None` while the process runs.
    fn peek(&self) -> io::Result<Option<ExitStatus>> {
        // SAFETY: siginfo_t is plain data; waitid fills it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let fd = self.0.get_ref().as_raw_fd() as libc::id_t;
        // SAFETY: waitid on our own pidfd, into a siginfo_t we own.
        let r = unsafe {
            libc::waitid(
                libc::P_PIDFD,
                fd,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: waitid succeeded; si_pid is 0 when no child has changed state.
        if unsafe { info.si_pid() } == 0 {
            return Ok(None);
        }
        // SAFETY: as above, a CLD_* report.
        let status = unsafe { info.si_status() };
        Ok(Some(ExitStatus::from_raw(match info.si_code {
            libc::CLD_EXITED => (status & 0xff) << 8,
            libc::CLD_DUMPED => status | 0x80,
            _ => status,
        })))
    }
}

/// A pidfd of any process, child or not, through which its `/proc/<pid>` files are read
/// without trusting that the pid still names it: each open or read is followed by
/// `pidfd_send_signal(pidfd, 0)`, and only when that succeeds (the process, zombie or not, still
/// holds its pid, so the pid named no other process in between) is the result kept.
///
/// The pidfd names whatever process held the pid at [`ProcessFd::open`]; the caller proves that
/// it is the one it means (the pod's infra process: its network namespace is the pinned one).
pub struct ProcessFd {
    pid: i32,
    fd: OwnedFd,
}

impl ProcessFd {
    /// `pidfd_open(2)`: `ESRCH` when no process has `pid`.
    pub fn open(pid: i32) -> io::Result<ProcessFd> {
        if pid <= 0 {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        // SAFETY: a plain system call with integer arguments.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this descriptor, and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(ProcessFd { pid, fd })
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether the process still holds its pid (running, or a zombie not yet reaped).
    pub fn holds_pid(&self) -> bool {
        // SAFETY: signal 0 to our own pidfd, no siginfo.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.fd.as_raw_fd(),
                0,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        r == 0
    }

    /// `Ok(value)` if the process still holds its pid; `ESRCH` otherwise.
    fn verified<T>(&self, value: T) -> io::Result<T> {
        if self.holds_pid() {
            Ok(value)
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("process {} has exited", self.pid),
            ))
        }
    }

    /// Open `/proc/<pid>/<rel>` (e.g. `ns/net`): the file of this very process.
    pub fn open_proc(&self, rel: &str) -> io::Result<std::fs::File> {
        let f = std::fs::File::open(format!("/proc/{}/{rel}", self.pid))?;
        self.verified(f)
    }

    /// Read `/proc/<pid>/<rel>` (e.g. `net/dev`): the file of this very process.
    pub fn read_proc(&self, rel: &str) -> io::Result<String> {
        let text = std::fs::read_to_string(format!("/proc/{}/{rel}", self.pid))?;
        self.verified(text)
    }
}

/// Reaps `child` (through tokio, which then forgets it) [`REAP_DELAY`] from now, in a task of
/// its own. A daemon that stops first leaves the zombie to the process that reaps it next.
pub fn reap_later(mut child: tokio::process::Child) {
    tokio::spawn(async move {
        tokio::time::sleep(REAP_DELAY).await;
        if let Err(e) = child.wait().await {
            tracing::debug!(error = %e, "reaping a CNI plugin");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(pid: u32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(") ")?.1.chars().next()
    }

    #[tokio::test]
    async fn the_status_is_read_without_reaping_and_the_zombie_is_reaped_later() {
        let child = tokio::process::Command::new("sh")
            .args(["-c", "sleep 0.05; exit 3"])
            .spawn()
            .unwrap();
        let pid = child.id().unwrap();
        let fd = PidFd::open(pid).unwrap();
        let status = fd.exited().await.unwrap();
        assert_eq!(status.code(), Some(3));
        assert_eq!(
            state(pid),
            Some('Z'),
            "exited() must leave the child unreaped"
        );
        // Reading the status again gives the same answer: nothing was consumed.
        assert_eq!(fd.exited().await.unwrap().code(), Some(3));
        reap_later(child);
        tokio::time::sleep(REAP_DELAY / 2).await;
        assert_eq!(state(pid), Some('Z'), "reaped before REAP_DELAY");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while state(pid).is_some() {
            assert!(std::time::Instant::now() < deadline, "never reaped");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[test]
    fn a_process_fd_reads_its_own_process_and_refuses_once_the_pid_is_free() {
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let p = ProcessFd::open(pid).unwrap();
        assert!(p.holds_pid());
        let ns = p.open_proc("ns/net").unwrap();
        let own = std::fs::metadata("/proc/self/ns/net").unwrap();
        use std::os::unix::fs::MetadataExt as _;
        assert_eq!(ns.metadata().unwrap().ino(), own.ino());
        assert!(p.read_proc("stat").unwrap().starts_with(&format!("{pid} ")));
        // Killed but not reaped: the pid is still its own.
        child.kill().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while state(pid as u32) != Some('Z') {
            assert!(std::time::Instant::now() < deadline, "never a zombie");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(p.holds_pid(), "a zombie still holds its pid");
        // Reaped: the pid may name anyone now, and nothing is read through it any more, even
        // where /proc/<pid> opens (another process took the pid: here our own pid stands in).
        child.wait().unwrap();
        assert!(!p.holds_pid());
        let e = p.open_proc("ns/net").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        let reused = ProcessFd {
            pid: std::process::id() as i32,
            fd: p.fd.try_clone().unwrap(),
        };
        assert!(std::path::Path::new(&format!("/proc/{}/ns/net", reused.pid)).exists());
        let e = reused.open_proc("ns/net").unwrap_err();
        assert!(e.to_string().contains("has exited"), "{e}");
        assert!(reused.read_proc("stat").is_err());
        assert_eq!(
            ProcessFd::open(0).err().and_then(|e| e.raw_os_error()),
            Some(libc::ESRCH)
        );
    }

    #[tokio::test]
    async fn a_signal_is_reported_as_the_signal() {
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        let fd = PidFd::open(child.id()).unwrap();
        child.kill().unwrap();
        let status = fd.exited().await.unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    }
}
