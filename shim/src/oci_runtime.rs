//! An external OCI runtime (runc, crun, runsc, youki), driven through the command line they share
//! with runc: `create`, `start`, `kill`, `delete` and `exec --process` on the pod's bundles. The
//! shim stays the subreaper, log writer and exit recorder: once the runtime's own process exits,
//! the container's init and each exec'd process are the shim's to reap.
//!
//! Calls are synchronous, as libcontainer's are: the shim's loop does not run (and so does not
//! reap) while one is in flight, so the runtime's exit status is never taken by the reaper.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crishim_proto::shim::OciRuntimeSpec;
use crishim_sys::shown::shown;

/// A call may run hooks and mount a root filesystem; past this it is stuck, and is killed.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How much of the runtime's log is read to explain a failure.
const MAX_LOG_READ: u64 = 64 * 1024;

pub struct OciRuntime {
    spec: OciRuntimeSpec,
    /// The runtime's `--log`, one call at a time: read back when a call fails.
    log: PathBuf,
}

/// The standard streams of the runtime's process, which `create` and `exec` pass on to the
/// container's process. `None` leaves the shim's own.
#[derive(Default)]
pub struct CallIo {
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
}

impl CallIo {
    /// No stdio at all: for the calls that start nothing.
    fn null() -> [Stdio; 3] {
        [Stdio::null(), Stdio::null(), Stdio::null()]
    }

    fn into_stdio(self) -> [Stdio; 3] {
        let pick = |fd: Option<OwnedFd>| fd.map_or_else(Stdio::inherit, Stdio::from);
        [pick(self.stdin), pick(self.stdout), pick(self.stderr)]
    }
}

/// A unix socket address the runtime can reach, for a socket bound in `dir` (whose own path may
/// be longer than an address can be): through the shim's descriptor of `dir`, kept open by the
/// caller while the runtime runs.
pub fn console_address(dir_fd: &OwnedFd, name: &str) -> PathBuf {
    PathBuf::from(format!(
        "/proc/{}/fd/{}/{name}",
        std::process::id(),
        dir_fd.as_raw_fd()
    ))
}

impl OciRuntime {
    /// The runtime for the pod whose shim state lives in `dir`; its state root is made root's
    /// alone.
    pub fn new(spec: OciRuntimeSpec, dir: &Path) -> Result<Self, String> {
        crishim_sys::hostfs::create_private_dir(&spec.root)
            .map_err(|e| format!("creating {}: {e}", spec.root.display()))?;
        Ok(OciRuntime {
            spec,
            log: dir.join("oci-runtime.log"),
        })
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.spec.binary);
        c.arg("--root")
            .arg(&self.spec.root)
            .arg("--log")
            .arg(&self.log)
            .arg("--log-format")
            .arg("json");
        if self.spec.systemd_cgroup {
            c.arg("--systemd-cgroup");
        }
        c
    }

    /// Run one call to its end (or kill it at [`CALL_TIMEOUT`]); a failure carries the
    /// runtime's own last error message.
    fn run(&self, mut cmd: Command, stdio: [Stdio; 3], what: &str) -> Result<(), String> {
        // Emptied per call (0600: it may quote the container's environment).
        let _ = crishim_sys::hostfs::write_private(&self.log, b"");
        let [stdin, stdout, stderr] = stdio;
        cmd.stdin(stdin).stdout(stdout).stderr(stderr);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("{what}: running {}: {e}", self.spec.binary.display()))?;
        // Our copies of the container's stdio close here, so its readers see EOF when it exits.
        drop(cmd);
        let deadline = Instant::now() + CALL_TIMEOUT;
        let mut pause = Duration::from_micros(500);
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "{what}: {} did not finish within {}s and was killed",
                        self.spec.binary.display(),
                        CALL_TIMEOUT.as_secs()
                    ));
                }
                Err(e) => return Err(format!("{what}: waiting for the runtime: {e}")),
            }
        };
        if status.success() {
            return Ok(());
        }
        Err(format!("{what}: {}", self.last_error(&status.to_string())))
    }

    /// The last error the runtime logged (runc's JSON log lines: `{"level":"error","msg":...}`),
    /// cut for showing; `fallback` when it logged none.
    fn last_error(&self, fallback: &str) -> String {
        use std::io::{Read, Seek, SeekFrom};
        let mut tail = Vec::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = f.seek(SeekFrom::Start(len.saturating_sub(MAX_LOG_READ)));
            let _ = f.take(MAX_LOG_READ).read_to_end(&mut tail);
        }
        let text = String::from_utf8_lossy(&tail);
        let message = text
            .lines()
            .rev()
            .find_map(|line| {
                let v: serde_json::Value = serde_json::from_str(line).ok()?;
                let level = v.get("level")?.as_str()?;
                matches!(level, "error" | "fatal")
                    .then(|| v.get("msg")?.as_str().map(str::to_owned))?
            })
            .or_else(|| text.lines().last().map(str::to_owned))
            .unwrap_or_else(|| fallback.to_owned());
        shown(&message).into_owned()
    }

    /// `create`: the container's init is left waiting to be started; returns its pid.
    pub fn create(
        &self,
        id: &str,
        bundle: &Path,
        console_socket: Option<&Path>,
        io: CallIo,
    ) -> Result<i32, String> {
        let mut cmd = self.command();
        cmd.arg("create").arg("--bundle").arg(bundle);
        self.run_for_pid(
            cmd,
            &bundle.join("init.pid"),
            console_socket,
            id,
            io,
            "create",
        )
    }

    /// A call that starts a process (`create`, `exec`): `cmd` gets `--pid-file`, for a pty
    /// `--console-socket`, then the id; returns the pid the runtime wrote, whose file goes
    /// afterwards (the runtime writes it 0644, and it has served).
    fn run_for_pid(
        &self,
        mut cmd: Command,
        pid_file: &Path,
        console_socket: Option<&Path>,
        id: &str,
        io: CallIo,
        what: &str,
    ) -> Result<i32, String> {
        let _ = std::fs::remove_file(pid_file);
        cmd.arg("--pid-file").arg(pid_file);
        if let Some(socket) = console_socket {
            cmd.arg("--console-socket").arg(socket);
        }
        cmd.arg(id);
        let pid = self
            .run(cmd, io.into_stdio(), what)
            .and_then(|()| read_pid(pid_file));
        let _ = std::fs::remove_file(pid_file);
        pid
    }

    pub fn start(&self, id: &str) -> Result<(), String> {
        let mut cmd = self.command();
        cmd.arg("start").arg(id);
        self.run(cmd, CallIo::null(), "start")
    }

    pub fn kill(&self, id: &str, signal: i32, all: bool) -> Result<(), String> {
        let mut cmd = self.command();
        cmd.arg("kill");
        if all {
            cmd.arg("--all");
        }
        cmd.arg(id).arg(signal.to_string());
        self.run(cmd, CallIo::null(), "kill")
    }

    /// `delete --force`: kills what is left, removes the runtime's state and the cgroup.
    pub fn delete(&self, id: &str) -> Result<(), String> {
        let mut cmd = self.command();
        cmd.arg("delete").arg("--force").arg(id);
        self.run(cmd, CallIo::null(), "delete")
    }

    /// `exec --detach --process`: returns the new process's pid, which the shim then reaps.
    pub fn exec(
        &self,
        id: &str,
        process: &Path,
        console_socket: Option<&Path>,
        io: CallIo,
    ) -> Result<i32, String> {
        let mut cmd = self.command();
        cmd.arg("exec")
            .arg("--detach")
            .arg("--process")
            .arg(process);
        let pid_file = process.with_extension("pid");
        self.run_for_pid(cmd, &pid_file, console_socket, id, io, "exec")
    }

    /// Whether the runtime still knows the container (`state` succeeds).
    pub fn knows(&self, id: &str) -> bool {
        let mut cmd = self.command();
        cmd.arg("state").arg(id);
        self.run(cmd, CallIo::null(), "state").is_ok()
    }
}

/// A pid file the runtime wrote: a positive decimal, nothing else.
fn read_pid(path: &Path) -> Result<i32, String> {
    let raw = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    std::str::from_utf8(&raw)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|pid| *pid > 0)
        .ok_or_else(|| format!("{} holds no pid", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime(dir: &Path, script: &str) -> OciRuntime {
        let bin = dir.join("fake-runtime");
        std::fs::write(&bin, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        OciRuntime::new(
            OciRuntimeSpec {
                binary: bin,
                root: dir.join("root"),
                systemd_cgroup: false,
            },
            dir,
        )
        .unwrap()
    }

    // A stand-in for the runtime binary: these tests are about how its replies are read, which a
    // real runc cannot be made to produce on demand (the integration tests drive the real one).
    #[test]
    fn a_failure_carries_the_runtimes_last_logged_error() {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime(
            dir.path(),
            r#"log="$4"
echo '{"level":"warning","msg":"early"}' >> "$log"
echo '{"level":"error","msg":"exec: \"nope\": executable file not found in $PATH"}' >> "$log"
echo '{"level":"info","msg":"after"}' >> "$log"
exit 1"#,
        );
        let e = rt.start("c1").unwrap_err();
        assert_eq!(
            e,
            "start: exec: \"nope\": executable file not found in $PATH"
        );
    }

    #[test]
    fn a_huge_log_line_is_cut_and_a_silent_failure_names_the_exit() {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime(
            dir.path(),
            r#"head -c 1000000 /dev/zero | tr '\0' x >> "$4"; exit 3"#,
        );
        let e = rt.kill("c1", 9, true).unwrap_err();
        assert!(e.len() < 400, "{} bytes", e.len());
        let rt = runtime(dir.path(), "exit 3");
        let e = rt.delete("c1").unwrap_err();
        assert!(e.contains("exit status: 3"), "{e}");
    }

    #[test]
    fn create_reads_the_pid_file_and_refuses_a_bad_one() {
        let dir = tempfile::tempdir().unwrap();
        // Arguments: --root R --log L --log-format json create --bundle B --pid-file P ID
        let rt = runtime(dir.path(), r#"echo 4242 > "${11}""#);
        let pid = rt
            .create("c1", dir.path(), None, CallIo::default())
            .unwrap();
        assert_eq!(pid, 4242);
        let rt = runtime(dir.path(), r#"echo -- -1 > "${11}""#);
        let e = rt
            .create("c1", dir.path(), None, CallIo::default())
            .unwrap_err();
        assert!(e.contains("holds no pid"), "{e}");
    }

    #[test]
    fn the_state_root_is_roots_alone() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime(dir.path(), "exit 0");
        let mode = std::fs::metadata(&rt.spec.root)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
